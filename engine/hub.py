"""Finding models on the Hugging Face Hub: search, a repository's files, where downloads go.

Everything goes through huggingface_hub's own client. Nothing is contacted at import: the endpoint
(HF_ENDPOINT) and offline mode (HF_HUB_OFFLINE) are read when a function is called, so a setting
changed after start-up (or by a test) is honoured. Downloads are in engine/hub_download.py.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx2
from huggingface_hub import HfApi, ModelInfo, constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from engine.errors import HubAccessError, HubNotFoundError, HubUnreachableError
from engine.model_files import quantization_of

# What the engine loads: engine.loader's model types and engine.gguf_loader's architectures,
# repeated so that this module imports no torch (a test keeps the lists equal).
ENGINE_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
GGUF_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})
# The usual balance of size and quality for a chat model; without it, the smallest 4-bit file.
PREFERRED_QUANTIZATION = "Q4_K_M"
_SPLIT_PART = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
_SEARCH_FIELDS = ["downloads", "likes", "gated", "tags", "gguf"]


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


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def hub_api(token: str | None = None) -> HfApi:
    """A client for the endpoint configured now; token None means huggingface_hub's own
    (HF_TOKEN, or a saved `hf auth login`)."""
    _refuse_when_offline()
    return HfApi(endpoint=hub_endpoint(), token=token)


def search_models(query: str, limit: int = 20, token: str | None = None) -> list[HubModel]:
    """Repositories whose names match query and whose GGUF files or safetensors the engine
    runs, most downloaded first (a GGUF repository whose architecture the Hub does not report
    is kept). With no network huggingface_hub retries a search for about 20 s before
    HubUnreachableError: call it off the UI thread."""
    api = hub_api(token)
    with hub_errors(query, token=token):
        gguf = [m for m in api.list_models(search=query, filter="gguf", sort="downloads",
                                           limit=limit, expand=_SEARCH_FIELDS)
                if _gguf_architecture(m) in GGUF_ARCHITECTURES | {None}]
        safetensors = [m for m in api.list_models(search=query, filter="safetensors",
                                                  sort="downloads", limit=limit,
                                                  expand=_SEARCH_FIELDS)
                       if ENGINE_MODEL_TYPES & set(m.tags or ())]
    found = {m.id: _hub_model(m) for m in [*gguf, *safetensors]}
    return sorted(found.values(), key=lambda m: m.downloads, reverse=True)[:limit]


def _hub_model(info: ModelInfo) -> HubModel:
    tags = set(info.tags or ())
    model_types = sorted(ENGINE_MODEL_TYPES & tags)
    return HubModel(repo_id=info.id, downloads=info.downloads or 0, likes=info.likes or 0,
                    has_gguf="gguf" in tags, has_safetensors="safetensors" in tags,
                    gated=bool(info.gated),
                    architecture=_gguf_architecture(info) or next(iter(model_types), None))


def _gguf_architecture(info: ModelInfo) -> str | None:
    return (info.gguf or {}).get("architecture")


def list_model_files(repo_id: str, revision: str | None = None,
                     token: str | None = None) -> list[HubFile]:
    return repo_files(repo_id, revision, token)[1]


def repo_files(repo_id: str, revision: str | None = None,
               token: str | None = None) -> tuple[str, list[HubFile]]:
    """The commit a revision names now, and its files with sizes and checksums."""
    api = hub_api(token)
    with hub_errors(repo_id, token=token):
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    files = [HubFile(filename=s.rfilename, size=s.size or 0,
                     sha256=s.lfs.sha256 if s.lfs else None, blob_id=s.blob_id,
                     quantization=quantization_of(s.rfilename))
             for s in info.siblings or ()]
    return info.sha, files


def recommended_file(files: list[HubFile]) -> HubFile | None:
    """Which GGUF file to fetch when the user names none: Q4_K_M, else the smallest 4-bit file,
    else the only GGUF file there is. Split files (-00001-of-00003) are never chosen: one part
    alone does not load. None when the choice is the user's."""
    ggufs = [f for f in files if f.is_gguf and not _SPLIT_PART.search(f.filename)]
    preferred = [f for f in ggufs if f.quantization == PREFERRED_QUANTIZATION]
    four_bit = [f for f in ggufs if (f.quantization or "").lstrip("I").startswith("Q4")]
    for choice in (preferred, four_bit, ggufs if len(ggufs) == 1 else []):
        if choice:
            return min(choice, key=lambda f: f.size)
    return None


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
        raise HubUnreachableError(
            f"Cannot reach the Hugging Face Hub ({hub_endpoint()}): check the network "
            "connection and try again.") from exc
    except HfHubHTTPError as exc:
        raise HubUnreachableError(f"the Hugging Face Hub refused the request for {where}: "
                                  f"{exc}") from exc


def _refuse_when_offline() -> None:
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"} \
            or constants.is_offline_mode():
        raise HubUnreachableError("Offline mode is on (HF_HUB_OFFLINE): Pagoda does not contact "
                                  "the Hugging Face Hub. Unset it to search or download models.")
