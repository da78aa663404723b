"""Finding models on the Hugging Face Hub: search, a repository's files and parameter count,
which of them make a model folder the engine loads.

A model or file the engine does not run is listed too, with the reason in words
(`HubModel.unsupported`, `HubFile.unreadable`, `HubRepo.unsupported`): a user who searches
"gemma" or "qwen3-30b-a3b" sees what exists and why it does not run, rather than nothing.

Everything goes through huggingface_hub's own client. Nothing is contacted at import: the endpoint
(HF_ENDPOINT) and offline mode (HF_HUB_OFFLINE) are read when a function is called, so a setting
changed after start-up (or by a test) is honoured. Before a call the endpoint's host is probed
with one TCP connection: huggingface_hub retries an unreachable host for about 20 s, the probe
says so in a few. Downloads are in pagoda/engine/hub/download.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2
from gguf import GGMLQuantizationType
from huggingface_hub import HfApi, ModelInfo, constants, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from pagoda.engine.errors import HubAccessError, HubNotFoundError, HubUnreachableError
from pagoda.engine.loading.model_check import READABLE_GGUF_TYPES
from pagoda.engine.loading.model_files import quantization_of
from pagoda.engine.models.registry import (
    NOT_YET,
    supported_gguf_architectures,
    supported_model_types,
    why_not_supported,
)

# What the engine loads, from the family registry (which imports no torch).
ENGINE_MODEL_TYPES = supported_model_types()
GGUF_ARCHITECTURES = supported_gguf_architectures()
# The model types a repository's tags may name: those the engine runs and those it names a
# reason for.
_KNOWN_MODEL_TYPES = ENGINE_MODEL_TYPES | NOT_YET.keys()
# A K-quant mix ("Q4_K_M": mostly Q4_K) by its main tensor type.
_K_QUANT_MIX = re.compile(r"^(Q\d_K)_(?:S|M|L|XL)$")
# The usual balance of size and quality for a chat model; without it, the smallest 4-bit file.
PREFERRED_QUANTIZATION = "Q4_K_M"
_SPLIT_PART = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
_SEARCH_FIELDS = ["downloads", "likes", "gated", "tags", "gguf"]
# A model folder as pagoda.engine.loading.loader reads it: config.json, the weights (with their shard index),
# and the tokenizer files transformers' AutoTokenizer reads (one of _TOKENIZERS is required).
_CONFIG = "config.json"
_SHARD_INDEX = "model.safetensors.index.json"
_SAFETENSORS_SHARD = re.compile(r"-\d{5}-of-\d{5}\.safetensors$")
_TOKENIZERS = frozenset({"tokenizer.json", "tokenizer.model", "vocab.json"})
_TOKENIZER_EXTRAS = frozenset({"tokenizer_config.json", "special_tokens_map.json",
                               "added_tokens.json", "merges.txt", "chat_template.jinja",
                               "chat_template.json", "generation_config.json"})
# Mistral's repositories also hold its own format's copy of the weights: never both.
_OTHER_FORMATS = re.compile(r"^consolidated\b", re.IGNORECASE)
_PROBE_TIMEOUT_S = 3.0
# config.json is a few KB; a larger one (the listing's size, or the bytes that come) is not read.
MAX_CONFIG_BYTES = 1 << 20
_CONFIG_TIMEOUT_S = 10.0
# A host that answered is not probed again for this long: one listing makes several calls.
_REACHABLE_FOR_S = 60.0
_reached_at: dict[tuple[str, int], float] = {}


@dataclass(slots=True)
class HubModel:
    """One search result."""

    repo_id: str
    downloads: int
    likes: int
    has_gguf: bool
    has_safetensors: bool
    gated: bool
    architecture: str | None  # the GGUF files' architecture, else the model_type tag
    unsupported: str | None = None  # why the engine does not run it; None when it does


@dataclass(slots=True)
class HubFile:
    """One file of a repository. sha256 is the Hub's LFS checksum (None for small files kept in
    git itself, which are checked by their git blob id instead)."""

    filename: str
    size: int
    sha256: str | None
    blob_id: str | None
    quantization: str | None

    @property
    def is_gguf(self) -> bool:
        return self.filename.lower().endswith(".gguf")

    @property
    def unreadable(self) -> str | None:
        """Why the engine cannot read this GGUF file's tensors, by the type its name states
        ("TQ2_0"); None when it can, or when the name does not say."""
        kind = main_tensor_type(self.quantization)
        if not self.is_gguf or kind is None or kind in READABLE_GGUF_TYPES:
            return None
        return f"{kind} tensors: a type Pagoda cannot read yet"

    @property
    def is_split_part(self) -> bool:
        """One part of a GGUF file split in several (-00001-of-00003): the engine loads whole
        files only."""
        return bool(_SPLIT_PART.search(self.filename))


@dataclass(slots=True)
class HubRepo:
    """A repository at one commit. num_parameters: the Hub's count (read from its GGUF or
    safetensors headers), None when it reports none; weights_dtype: the safetensors dtype most
    parameters have ("BF16"); model_type: config.json's, when the Hub reports it."""

    repo_id: str
    commit: str
    files: list[HubFile]
    num_parameters: int | None = None
    weights_dtype: str | None = None
    model_type: str | None = None
    architecture: str | None = None  # the GGUF files' general.architecture, when reported

    @property
    def unsupported(self) -> str | None:
        """Why the engine runs no model of this repository, from its GGUF architecture or its
        config's model_type; None when it runs them (or the Hub does not say)."""
        if self.architecture is not None:  # GGUF files: their architecture decides, not the tag
            runs = self.architecture in GGUF_ARCHITECTURES
            return None if runs else why_not_supported(self.architecture)
        if self.model_type is not None and self.model_type not in ENGINE_MODEL_TYPES:
            return why_not_supported(self.model_type)
        return None

    @property
    def folder_files(self) -> list[HubFile]:
        """The files of a model folder the engine loads; empty when the repository is not one."""
        if self.model_type not in ENGINE_MODEL_TYPES | {None}:
            return []
        return folder_files(self.files)


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def hub_api(token: str | None = None) -> HfApi:
    """A client for the endpoint configured now; token None means huggingface_hub's own
    (HF_TOKEN, or a saved `hf auth login`). Raises HubUnreachableError within a few seconds
    when the endpoint cannot be reached."""
    _refuse_when_offline()
    _check_reachable()
    return HfApi(endpoint=hub_endpoint(), token=token)


def _check_reachable() -> None:
    """Probe the endpoint's host (or the proxy the client goes through) with one TCP connection,
    unless it answered in the last minute."""
    address = _probe_address(hub_endpoint())
    if time.monotonic() - _reached_at.get(address, -math.inf) < _REACHABLE_FOR_S:
        return
    if not _connects(*address, timeout=_PROBE_TIMEOUT_S):
        raise HubUnreachableError(_unreachable_message())
    _reached_at[address] = time.monotonic()


def _probe_address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host = parts.hostname or ""
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def _connects(host: str, port: int, timeout: float) -> bool:
    """On a thread of its own, so that a name lookup that hangs (no DNS server answering) is
    bounded by the timeout too."""
    answered = threading.Event()
    connected = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                connected.append(True)
        except OSError:
            pass
        finally:
            answered.set()

    threading.Thread(target=attempt, name="pagoda-hub-probe", daemon=True).start()
    return answered.wait(timeout) and bool(connected)


def _unreachable_message() -> str:
    return (f"Cannot reach the Hugging Face Hub ({hub_endpoint()}): check the network "
            "connection and try again.")


def search_models(query: str, limit: int = 20, token: str | None = None) -> list[HubModel]:
    """Repositories whose names match query with GGUF files or safetensors: those the engine
    runs first (a GGUF repository whose architecture the Hub does not report among them, unless
    a tag names a model type it does not run), then
    the others with the reason they do not run, each most downloaded first. It makes network
    calls: call it off the UI thread."""
    api = hub_api(token)
    with hub_errors(query, token=token):
        found = {m.id: _hub_model(m)
                 for kind in ("gguf", "safetensors")
                 for m in api.list_models(search=query, filter=kind, sort="downloads",
                                          limit=limit, expand=_SEARCH_FIELDS)}
    return sorted(found.values(),
                  key=lambda m: (m.unsupported is not None, -m.downloads))[:limit]


def _hub_model(info: ModelInfo) -> HubModel:
    tags = set(info.tags or ())
    gguf_architecture = _gguf_architecture(info)
    model_type = min(ENGINE_MODEL_TYPES & tags, default=None) or min(
        _KNOWN_MODEL_TYPES & tags, default=None)
    if gguf_architecture is not None:
        runs, architecture = gguf_architecture in GGUF_ARCHITECTURES, gguf_architecture
    elif "gguf" in tags:  # the Hub did not read the files' header: they may well run
        # A tag may name a GGUF architecture the engine runs ("gemma3": its GGUF files hold the
        # text model, where a "gemma3" folder is the vision-language one).
        runs = model_type in ENGINE_MODEL_TYPES | GGUF_ARCHITECTURES | {None}
        architecture = model_type
    else:
        runs, architecture = model_type in ENGINE_MODEL_TYPES, model_type
    return HubModel(repo_id=info.id, downloads=info.downloads or 0, likes=info.likes or 0,
                    has_gguf="gguf" in tags, has_safetensors="safetensors" in tags,
                    gated=bool(info.gated), architecture=architecture,
                    unsupported=None if runs else why_not_supported(architecture))


def _gguf_architecture(info: ModelInfo) -> str | None:
    return (info.gguf or {}).get("architecture")


def repo_info(repo_id: str, revision: str | None = None, token: str | None = None) -> HubRepo:
    """A repository's files with sizes and checksums, and its parameter count: one request."""
    api = hub_api(token)
    with hub_errors(repo_id, token=token):
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    files = [HubFile(filename=s.rfilename, size=s.size or 0,
                     sha256=s.lfs.sha256 if s.lfs else None, blob_id=s.blob_id,
                     quantization=quantization_of(s.rfilename))
             for s in info.siblings or ()]
    by_dtype = info.safetensors.parameters if info.safetensors else {}
    return HubRepo(repo_id=repo_id, commit=info.sha, files=files,
                   num_parameters=_num_parameters(info),
                   weights_dtype=max(by_dtype, key=by_dtype.get) if by_dtype else None,
                   model_type=(info.config or {}).get("model_type"),
                   architecture=_gguf_architecture(info))


def repo_config(repo: HubRepo, token: str | None = None) -> dict | None:
    """The config.json at the top of repo, at its commit, as parsed JSON: the model's shape for
    the fit's KV cache, one small request. None when the repository has none, or one larger
    than MAX_CONFIG_BYTES or that is not a JSON object."""
    listed = next((f for f in repo.files if f.filename == _CONFIG), None)
    if listed is None or listed.size > MAX_CONFIG_BYTES:
        return None
    _refuse_when_offline()
    _check_reachable()
    url = hf_hub_url(repo.repo_id, _CONFIG, revision=repo.commit, endpoint=hub_endpoint())
    body = bytearray()
    with hub_errors(repo.repo_id, _CONFIG, token), get_session().stream(
            "GET", url, headers=build_hf_headers(token=token), follow_redirects=True,
            timeout=_CONFIG_TIMEOUT_S) as response:
        hf_raise_for_status(response)
        for piece in response.iter_bytes():
            body += piece
            if len(body) > MAX_CONFIG_BYTES:
                return None
    try:
        config = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None


def _num_parameters(info: ModelInfo) -> int | None:
    total = (info.gguf or {}).get("total") or (info.safetensors.total if info.safetensors else 0)
    return int(total) if total else None


def folder_files(files: list[HubFile]) -> list[HubFile]:
    """The files a model folder the engine loads needs: config.json, the safetensors weights
    (the shards and their index, else model.safetensors), the tokenizer files. Only the top
    level counts (the loader reads no subfolder); *.bin, *.pt, ONNX and consolidated.* are left
    out. Empty when config.json, the weights or a tokenizer is missing. config.json comes
    last: a folder without it is not a model yet, so it is written once the rest is there."""
    top = {f.filename: f for f in files if "/" not in f.filename}
    safetensors = [f for name, f in top.items()
                   if name.endswith(".safetensors") and not _OTHER_FORMATS.match(name)]
    shards = [f for f in safetensors if _SAFETENSORS_SHARD.search(f.filename)] or safetensors
    if _SHARD_INDEX in top and shards:
        weights = [*shards, top[_SHARD_INDEX]]
    else:
        weights = [top["model.safetensors"]] if "model.safetensors" in top else safetensors
    if _CONFIG not in top or not weights or not _TOKENIZERS & top.keys():
        return []
    tokenizer = [f for name, f in top.items() if name in _TOKENIZERS | _TOKENIZER_EXTRAS]
    return sorted([*weights, *tokenizer], key=lambda f: f.filename) + [top[_CONFIG]]


def recommended_file(files: list[HubFile]) -> HubFile | None:
    """Which GGUF file to fetch when the user names none: Q4_K_M, else the smallest 4-bit file,
    else the only GGUF file there is. Split files (-00001-of-00003) are never chosen: one part
    alone does not load; nor a file whose tensor type the engine cannot read. None when the choice is the user's."""
    ggufs = [f for f in files if f.is_gguf and not f.is_split_part and f.unreadable is None]
    preferred = [f for f in ggufs if f.quantization == PREFERRED_QUANTIZATION]
    four_bit = [f for f in ggufs if (f.quantization or "").lstrip("I").startswith("Q4")]
    for choice in (preferred, four_bit, ggufs if len(ggufs) == 1 else []):
        if choice:
            return min(choice, key=lambda f: f.size)
    return None


def main_tensor_type(file_quantization: str | None) -> str | None:
    """The GGUF tensor type a file's quantization is made of mostly ("Q4_K_M" -> "Q4_K",
    "IQ4_XS", "BF16"); None when it is not a type GGUF knows."""
    label = _K_QUANT_MIX.sub(r"\1", (file_quantization or "").upper())
    return label if label in GGMLQuantizationType.__members__ else None


@contextlib.contextmanager
def hub_errors(subject: str, filename: str | None = None,
               token: str | None = None) -> Iterator[None]:
    """huggingface_hub's and the network's errors as ours, with a sentence a user can act on."""
    where = f"{filename} in {subject}" if filename else subject
    try:
        yield
    except GatedRepoError as exc:
        fix = ("your token has no access to it" if token else
               "pass a token with access (--token or HF_TOKEN)")
        raise HubAccessError(f"{subject} is gated: accept its terms at "
                             f"{hub_endpoint()}/{subject}, then {fix}.") from exc
    except RepositoryNotFoundError as exc:
        raise HubNotFoundError(f"there is no model repository {subject} on the Hugging Face Hub "
                               "(or it is private: pass a token with --token or HF_TOKEN).") from exc
    except RevisionNotFoundError as exc:
        raise HubNotFoundError(f"{subject} has no such revision.") from exc
    except RemoteEntryNotFoundError as exc:
        raise HubNotFoundError(f"there is no file {where}.") from exc
    except (OfflineModeIsEnabled, httpx2.TransportError) as exc:
        raise HubUnreachableError(_unreachable_message()) from exc
    except HfHubHTTPError as exc:
        raise HubUnreachableError(f"the Hugging Face Hub refused the request for {where}: "
                                  f"{exc}") from exc


def _refuse_when_offline() -> None:
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"} \
            or constants.is_offline_mode():
        raise HubUnreachableError("Offline mode is on (HF_HUB_OFFLINE): Pagoda does not contact "
                                  "the Hugging Face Hub. Unset it to search or download models.")
