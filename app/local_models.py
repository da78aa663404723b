"""The models on this computer, without a window: what the models folder holds (GGUF files,
safetensors model folders, and what unfinished downloads left there), when each model was last
loaded, and deleting one. It tells a `LocalModelsView` what changed; the "On this computer"
panel (`widgets/local_models_panel.py`) is one such view, the window's model picker another.

The folder is read on the library's own thread: a stat per file is cheap, but a folder on a slow
or network drive is not, and the GUI thread never waits on a disk. The same thread writes the
last-used file and deletes, so they never race a scan. Nothing here contacts the Hub: it all
works offline.

When each model was last loaded is kept in the models folder itself (LAST_USED_FILE, keyed by
the path inside the folder), so it follows the folder wherever the user moves it; the file is
replaced atomically, so a crash leaves the old one or the new one, never half of one.
"""

from __future__ import annotations

import asyncio
import glob
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app.model_library import format_size
from app.tasks import TaskSet
from engine.model_files import default_models_dir, model_name, quantization_of

logger = logging.getLogger(__name__)

GGUF, SAFETENSORS, PARTIAL = "GGUF", "safetensors", "partial download"
LAST_USED_FILE = ".pagoda-last-used.json"
RECENT_IN_PICKER = 8  # the picker offers this many local models, the most recently used first
PARTIAL_SUFFIX = ".incomplete"
_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


@dataclass(slots=True, frozen=True)
class LocalModel:
    """One entry of the models folder: a model that loads (format GGUF or SAFETENSORS), or what
    an unfinished download left (format PARTIAL), listed only so that it can be deleted.
    last_used: seconds since the epoch, None if never loaded from this folder."""

    name: str
    path: Path
    format: str
    quantization: str
    size: int
    last_used: float | None = None
    modified: float = 0.0

    @property
    def is_partial(self) -> bool:
        return self.format == PARTIAL


@dataclass(slots=True, frozen=True)
class LocalListing:
    """The models folder as last read: models by last use (the never used by name), then the
    partial downloads. exists is False for a folder not made yet (nothing downloaded)."""

    folder: Path
    entries: tuple[LocalModel, ...] = ()
    exists: bool = False

    @property
    def models(self) -> list[LocalModel]:
        return [e for e in self.entries if not e.is_partial]

    @property
    def partials(self) -> list[LocalModel]:
        return [e for e in self.entries if e.is_partial]

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def recent(self, limit: int = RECENT_IN_PICKER) -> list[LocalModel]:
        """The models used most recently, then the newest never used; at most limit."""
        ordered = sorted(self.models, key=lambda m: (m.last_used or 0.0, m.modified),
                         reverse=True)
        return ordered[:limit]


class LocalModelsView(Protocol):
    """What the library tells whoever shows it. Every method is called on the event loop."""

    def show_listing(self, listing: LocalListing) -> None: ...
    def show_status(self, text: str, error: bool = False) -> None: ...


class LocalModels:
    """The models folder (default: default_models_dir()) and what it holds. loaded_model says
    which model is running now (a path, or None), downloading the folders downloads are
    writing into now; delete refuses both."""

    def __init__(self, folder: Path | None = None,
                 loaded_model: Callable[[], str | None] = lambda: None,
                 clock: Callable[[], float] = time.time,
                 downloading: Callable[[], list[Path]] = list) -> None:
        self.folder = folder or default_models_dir()
        self.listing = LocalListing(self.folder)
        self._loaded_model = loaded_model
        self._downloading = downloading
        self._clock = clock
        self._views: list[LocalModelsView] = []
        self._executor = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix="pagoda-local-models")
        self._tasks = TaskSet(self._failed)
        self._closed = False

    def attach(self, view: LocalModelsView) -> None:
        self._views.append(view)
        view.show_listing(self.listing)

    def detach(self, view: LocalModelsView) -> None:
        if view in self._views:
            self._views.remove(view)

    def set_folder(self, folder: Path) -> asyncio.Task:
        """List another folder; the listing of the old one is dropped."""
        self.folder = folder
        self.listing = LocalListing(folder)
        self._tell("show_listing", self.listing)
        return self.refresh()

    def refresh(self) -> asyncio.Task:
        return self._tasks.spawn(self._scan())

    def recent(self, limit: int = RECENT_IN_PICKER) -> list[Path]:
        return [m.path for m in self.listing.recent(limit)]

    def record_use(self, path: str | None) -> asyncio.Task | None:
        """Note that the model at path was loaded now; a model outside the folder is not noted.
        The note is queued on the thread at once, so closing right after still writes it."""
        if path is None or self._closed or not Path(path).is_relative_to(self.folder):
            return None
        noted = asyncio.get_running_loop().run_in_executor(
            self._executor, _note_use, self.folder, Path(path), self._clock())
        return self._tasks.spawn(self._scan_after(noted))

    def delete(self, entry: LocalModel) -> asyncio.Task:
        """Removes the model's file (with its partial downloads) or folder; refuses the running
        model. The task's result is the bytes freed; what happened is told as a status."""
        return self._tasks.spawn(self._delete(entry))

    async def wait_idle(self) -> None:
        await self._tasks.wait_idle()

    def close(self) -> None:
        """Work asked for from now on is dropped; what is queued (a last-used note, a delete
        the user confirmed) still runs."""
        self._closed = True
        self._views.clear()
        self._executor.shutdown(wait=False)

    # -- on the event loop ---------------------------------------------------------------------

    async def _scan(self) -> None:
        folder = self.folder
        listing = await self._on_thread(scan_models_folder, folder)
        if folder == self.folder:  # else the folder changed while it was read
            self.listing = listing
            self._tell("show_listing", listing)

    async def _scan_after(self, work: asyncio.Future) -> None:
        await work
        await self._scan()

    async def _delete(self, entry: LocalModel) -> int:
        outcome = await self._on_thread(_delete_entry, entry, self.folder, self._loaded_model(),
                                        self._downloading())
        await self._scan()  # a delete that failed half way removed some files
        if isinstance(outcome, str):
            self._tell("show_status", outcome, True)
            return 0
        self._tell("show_status", f"Deleted {entry.name}: {format_size(outcome)} freed.")
        return outcome

    async def _on_thread(self, work: Callable, *args):
        if self._closed:
            raise asyncio.CancelledError
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)

    def _tell(self, method: str, *args) -> None:
        for view in list(self._views):
            getattr(view, method)(*args)

    def _failed(self, error: BaseException) -> None:
        logger.error("the local model library failed", exc_info=error)
        self._tell("show_status", f"Something went wrong: {error}", True)


def format_last_used(when: float | None, now: float) -> str:
    """"never", "just now", "5 min ago", "3 h ago", "yesterday", "12 days ago", "2025-03-01"."""
    if when is None:
        return "never"
    seconds = max(0.0, now - when)
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    days = int(seconds // 86400)
    if days == 1:
        return "yesterday"
    if days < 60:
        return f"{days} days ago"
    return time.strftime("%Y-%m-%d", time.localtime(when))


# -- on the library's thread ---------------------------------------------------------------------

def scan_models_folder(folder: Path) -> LocalListing:
    """GGUF files anywhere in folder, each folder holding a config.json and safetensors files
    as one model, and what unfinished downloads left (`*.incomplete`, a model folder still
    without its config.json or with files still coming) as partial entries."""
    if not folder.is_dir():
        return LocalListing(folder)
    last_used = read_last_used(folder)
    entries: list[LocalModel] = []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        if here != folder and _is_model_folder(here, files):
            dirs.clear()
            entries.append(_folder_entry(here, folder, last_used))
            continue
        dirs.sort()
        for name in sorted(files):
            if name.lower().endswith(".gguf"):
                entries.append(_gguf_entry(here / name, folder, last_used))
            elif name.endswith(PARTIAL_SUFFIX):
                entries.append(_partial_file_entry(here / name))
    entries.sort(key=_listing_order)
    return LocalListing(folder, tuple(entries), exists=True)


def read_last_used(folder: Path) -> dict[str, float]:
    """{path inside the folder: when it was last loaded}; an unreadable file counts as empty."""
    try:
        data = json.loads((folder / LAST_USED_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        logger.warning("ignoring %s: %s", folder / LAST_USED_FILE, error)
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items()
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def write_last_used(folder: Path, last_used: dict[str, float]) -> None:
    """Written whole to a temporary file, flushed to disk, then renamed over the old one."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=LAST_USED_FILE, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(last_used, file, indent=1, sort_keys=True)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, folder / LAST_USED_FILE)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _note_use(folder: Path, path: Path, when: float) -> None:
    key = _key(folder, path)
    if key is None:
        return
    last_used = read_last_used(folder)
    last_used[key] = when
    try:
        write_last_used(folder, last_used)
    except OSError as error:  # a read-only folder still lists its models
        logger.warning("could not note when %s was used: %s", path, error)


def _forget_use(folder: Path, path: Path) -> None:
    key = _key(folder, path)
    last_used = read_last_used(folder)
    if key in last_used:
        del last_used[key]
        try:
            write_last_used(folder, last_used)
        except OSError as error:
            logger.warning("could not update %s: %s", folder / LAST_USED_FILE, error)


def _delete_entry(entry: LocalModel, folder: Path, running: str | None,
                  downloading: list[Path]) -> int | str:
    """The bytes freed, or why the entry was not deleted, in a sentence."""
    if running is not None and Path(running).resolve() == entry.path.resolve():
        return (f"{entry.name} is the model running now: load another model first, then "
                "delete this one.")
    path = entry.path.resolve()
    if any(path == d.resolve() or d.resolve() in path.parents for d in downloading):
        return (f"{entry.name} is being downloaded now: cancel its download first, then "
                "delete it.")
    freed = 0
    try:
        if entry.path.is_dir():
            size = _tree_size(entry.path)
            shutil.rmtree(entry.path)
            freed += size
        else:
            for path in _file_and_partials(entry):
                size = path.stat().st_size
                path.unlink()
                freed += size
    except FileNotFoundError:
        pass  # gone already (deleted by hand): nothing left to free
    except PermissionError:
        return (f"Could not delete {entry.path}: permission denied. Check who owns the "
                "folder, or delete it in your file manager.")
    except OSError as error:
        return f"Could not delete {entry.path}: {error.strerror or error}."
    _forget_use(folder, entry.path)
    _remove_empty_parents(entry.path.parent, folder)
    return freed


def _file_and_partials(entry: LocalModel) -> list[Path]:
    if entry.is_partial:
        return [entry.path]
    pattern = f"{glob.escape(entry.path.name)}.*{PARTIAL_SUFFIX}"
    return [entry.path, *sorted(entry.path.parent.glob(pattern))]


def _remove_empty_parents(folder: Path, top: Path) -> None:
    """The OWNER/REPO folders a download made, once nothing is left in them."""
    while folder != top and top in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _is_model_folder(folder: Path, files: list[str]) -> bool:
    """A safetensors model, complete or still coming; a folder of GGUF files is not one."""
    if folder.name.endswith(PARTIAL_SUFFIX):
        return True
    if any(name.endswith(".safetensors") or (".safetensors." in name
                                              and name.endswith(PARTIAL_SUFFIX))
           for name in files):
        return True
    return "config.json" in files and not any(name.lower().endswith(".gguf") for name in files)


def _folder_entry(folder: Path, top: Path, last_used: dict[str, float]) -> LocalModel:
    size, complete = 0, not folder.name.endswith(PARTIAL_SUFFIX)
    has_weights = False
    for path in folder.rglob("*"):
        if path.is_file():
            size += path.stat().st_size
            complete = complete and not path.name.endswith(PARTIAL_SUFFIX)
            has_weights = has_weights or path.name.endswith(".safetensors")
    config = folder / "config.json"
    modified = folder.stat().st_mtime
    if not (complete and has_weights and config.is_file()):
        return LocalModel(folder.name.removesuffix(PARTIAL_SUFFIX), folder, PARTIAL, "", size,
                          modified=modified)
    return LocalModel(model_name(folder), folder, SAFETENSORS, _folder_quantization(config),
                      size, last_used.get(_key(top, folder) or ""), modified)


def _folder_quantization(config: Path) -> str:
    """The weights' own quantization method, else their dtype (BF16...), else "safetensors"."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return SAFETENSORS
    if not isinstance(data, dict):
        return SAFETENSORS
    method = data.get("quantization_config", {})
    if isinstance(method, dict) and isinstance(method.get("quant_method"), str):
        return method["quant_method"].upper()
    dtype = data.get("torch_dtype") or data.get("dtype")
    return _DTYPES.get(dtype, SAFETENSORS) if isinstance(dtype, str) else SAFETENSORS


def _gguf_entry(path: Path, top: Path, last_used: dict[str, float]) -> LocalModel:
    stat = path.stat()
    return LocalModel(model_name(path), path, GGUF, quantization_of(path.name) or "?",
                      stat.st_size, last_used.get(_key(top, path) or ""), stat.st_mtime)


def _partial_file_entry(path: Path) -> LocalModel:
    """"Model-Q4_K_M.gguf.1a2b3c4d5e6f.incomplete" is named as the file it will become."""
    target = path.name.removesuffix(PARTIAL_SUFFIX)
    head, _, _checksum = target.rpartition(".")
    if "." in head:
        target = head
    stat = path.stat()
    return LocalModel(target, path, PARTIAL, quantization_of(target) or "", stat.st_size,
                      modified=stat.st_mtime)


def _tree_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _key(folder: Path, path: Path) -> str | None:
    """path inside folder, as the last-used file names it; None for a path outside."""
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except (OSError, ValueError):
        return None


def _listing_order(entry: LocalModel) -> tuple:
    return (entry.is_partial, -(entry.last_used or 0.0), entry.name.lower(), str(entry.path))
