"""The Hugging Face Hub as the model library asks it: a search, a repository's files and whether
each fits this machine, a download.

Each function runs on one of the library's worker threads: the engine's Hub client imports
huggingface_hub (not light), there, under ENGINE_IMPORT_LOCK the first time. What goes wrong
comes back as the sentence the window shows, not raised: a search or a download that fails is an
answer, not an error of the window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from threading import Event
from typing import TYPE_CHECKING

from pagoda.app.backends.services.engine_import import ENGINE_IMPORT_LOCK

if TYPE_CHECKING:
    from pagoda.engine.hub.download import DownloadProgress
    from pagoda.engine.hub.fit import MemoryFit
    from pagoda.engine.hub.search import HubFile, HubModel, HubRepo


@dataclass(frozen=True, slots=True)
class FileFits:
    """A repository's GGUF files (split parts left out), the recommended one first, each with
    its fit; `folder` is the fit of its safetensors model folder, None when it has none the
    engine loads; `folder_files`: the files of its model folder, whether or not the engine runs
    its model type (empty when it has none)."""

    files: list[tuple[HubFile, MemoryFit]]
    recommended: HubFile | None
    folder: MemoryFit | None
    folder_files: list[HubFile]


def search(query: str, token: str | None) -> list[HubModel] | str:
    hub, _ = _hub()
    from pagoda.engine.errors import PagodaError

    try:
        return hub.search_models(query, token=token)
    except PagodaError as error:
        return _sentence(error)


def repository(repo_id: str, token: str | None) -> HubRepo | str:
    hub, _ = _hub()
    from pagoda.engine.errors import HubAccessError, PagodaError

    try:
        return hub.repo_info(repo_id, token=token)
    except HubAccessError:
        return _gated(hub, repo_id, token)
    except PagodaError as error:
        return _sentence(error)


def file_fits(repo: HubRepo, quantization: str = "auto", token: str | None = None) -> FileFits:
    """Whether each file (and the folder) fits this machine's memory under the engine's
    `quantization` setting, with the KV cache the engine's defaults would allocate for the
    model: sized from the repository's config.json where it has one (a sliding-window layer
    holds its window only), else the cap; a mixture of experts' active parameters from it
    too."""
    with ENGINE_IMPORT_LOCK:
        from pagoda.engine.config import EngineConfig
        from pagoda.engine.errors import PagodaError
        from pagoda.engine.hub.fit import experts_of, file_fit, folder_fit, kv_cache_bytes
        from pagoda.engine.hub.search import folder_files, recommended_file, repo_config

    config_json = None
    if repo.unsupported is None:  # nothing of a family the engine does not run is fetched
        try:
            config_json = repo_config(repo, token)
        except PagodaError:  # the listing came, its config did not: the fit counts the cap
            pass
    kv_bytes = kv_cache_bytes(config_json, EngineConfig())
    settings = {"quantization": quantization, "experts": experts_of(config_json)}
    recommended = recommended_file(repo.files)
    ggufs = sorted((f for f in repo.files if f.is_gguf and not f.is_split_part),
                   key=lambda f: (f is not recommended, f.filename))
    files = [(f, file_fit(repo, f, kv_bytes, **settings)) for f in ggufs]
    return FileFits(files, recommended, folder_fit(repo, kv_bytes, **settings),
                    folder_files(repo.files))


def download(repo_id: str, filename: str | None, dest_dir: Path | None,
             on_progress: Callable[[DownloadProgress], None] | None, token: str | None,
             cancel: Event) -> Path | tuple[bool, str]:
    """One file (filename None: the repository's safetensors model folder) into dest_dir; its
    path, or (cancelled, the sentence saying why not)."""
    hub, hub_download = _hub()
    from pagoda.engine.errors import DownloadCancelledError, HubAccessError, PagodaError

    try:
        if filename is None:
            return hub_download.download_model_folder(repo_id, dest_dir, on_progress=on_progress,
                                                      token=token, cancel=cancel)
        return hub_download.download_model_file(repo_id, filename, dest_dir,
                                                on_progress=on_progress, token=token,
                                                cancel=cancel)
    except DownloadCancelledError as error:
        return True, _sentence(error)
    except HubAccessError:
        return False, _gated(hub, repo_id, token)
    except PagodaError as error:
        return False, _sentence(error)


def _hub():
    with ENGINE_IMPORT_LOCK:
        from pagoda.engine.hub import download, search
    return search, download


def _gated(hub, repo_id: str, token: str | None) -> str:
    """A gated repository, in the window's words: where to accept its terms, and the token."""
    terms = f"{repo_id} is gated: accept its terms at {hub.hub_endpoint()}/{repo_id}"
    if token is None:
        return f"{terms}, then save a Hugging Face token of that account below."
    return f"{terms} with the saved token's account, or save a token of an account that has " \
           "accepted them."


def _sentence(error: Exception) -> str:
    text = str(error)
    return text[:1].upper() + text[1:]
