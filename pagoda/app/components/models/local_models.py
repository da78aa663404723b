"""The models on this computer, without a window: what the models folder holds (GGUF files,
safetensors model folders, and what unfinished downloads left there), when each model was last
loaded, and deleting one. It tells a `LocalModelsView` what changed; the "On this computer"
panel (`qt/models/local_models_panel.py`) is one such view, the window's model picker another.

The folder is read on the library's own thread: a stat per file is cheap, but a folder on a slow
or network drive is not, and the GUI thread never waits on a disk. The same thread writes the
last-used file and deletes, so they never race a scan. Nothing here contacts the Hub: it all
works offline.

When each model was last loaded is kept in the models folder itself (LAST_USED_FILE, keyed by
the path inside the folder), so it follows the folder wherever the user moves it; the file is
replaced atomically, so a crash leaves the old one or the new one, never half of one.

Given them, the listing also holds the bundled model (BUNDLED: never deleted) and the models
opened from files outside the folder (OUTSIDE, remembered in the app's config folder by
`OpenedModels`): Pagoda never deletes those from the disk, it only forgets them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import glob
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pagoda.app.backends.services.model_files import (
    default_models_dir,
    is_mmproj_file,
    model_name,
    quantization_of,
)
from pagoda.app.components.models.model_library import format_size
from pagoda.app.components.models.opened_models import OpenedModels
from pagoda.app.components.shared.tasks import TaskSet
from pagoda.app.components.shared.times_file import read_times, write_times

logger = logging.getLogger(__name__)

GGUF, SAFETENSORS, PARTIAL = "GGUF", "safetensors", "partial download"
LAST_USED_FILE = ".pagoda-last-used.json"
RECENT_IN_PICKER = 8  # the picker offers this many local models, the most recently used first
PARTIAL_SUFFIX = ".incomplete"
_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
# Where an entry is: in the models folder, the model bundled with Pagoda, or a file (or folder)
# opened from elsewhere.
IN_FOLDER, BUNDLED, OUTSIDE = "models folder", "bundled", "outside"


@dataclass(slots=True, frozen=True)
class LocalModel:
    """One entry of the models folder: a model that loads (format GGUF or SAFETENSORS), or what
    an unfinished download left (format PARTIAL), listed only so that it can be deleted.
    last_used: seconds since the epoch, None if never loaded from this folder. kind: IN_FOLDER,
    BUNDLED or OUTSIDE; only what is in the folder is ever deleted."""

    name: str
    path: Path
    format: str
    quantization: str
    size: int
    last_used: float | None = None
    modified: float = 0.0
    kind: str = IN_FOLDER

    @property
    def is_partial(self) -> bool:
        return self.format == PARTIAL

    @property
    def can_delete(self) -> bool:
        return self.kind == IN_FOLDER

    @property
    def can_forget(self) -> bool:
        return self.kind == OUTSIDE


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
    def folder_models(self) -> list[LocalModel]:
        return [e for e in self.models if e.kind == IN_FOLDER]

    @property
    def total_bytes(self) -> int:
        """What the models folder holds."""
        return sum(e.size for e in self.entries if e.kind == IN_FOLDER)

    def recent(self, limit: int = RECENT_IN_PICKER) -> list[LocalModel]:
        """The models used most recently, then the newest never used; at most limit. Not the
        bundled one, which the picker always offers."""
        ordered = sorted((m for m in self.models if m.kind != BUNDLED),
                         key=lambda m: (m.last_used or 0.0, m.modified), reverse=True)
        return ordered[:limit]


class LocalModelsView(Protocol):
    """What the library tells whoever shows it. Every method is called on the event loop."""

    def show_listing(self, listing: LocalListing) -> None: ...
    def show_status(self, text: str, error: bool = False) -> None: ...


class LocalModels:
    """The models folder (default: default_models_dir()) and what it holds. loaded_model says
    which model is running now (a path, or None), downloading the folders downloads are
    writing into now; delete refuses both. bundled: the bundled model's file (None when it is
    missing), opened: the models opened from elsewhere; both are listed too when given."""

    def __init__(self, folder: Path | None = None,
                 loaded_model: Callable[[], str | None] = lambda: None,
                 clock: Callable[[], float] = time.time,
                 downloading: Callable[[], list[Path]] = list,
                 bundled: Callable[[], Path | None] = lambda: None,
                 opened: OpenedModels | None = None) -> None:
        self.folder = folder or default_models_dir()
        self.listing = LocalListing(self.folder)
        self._loaded_model = loaded_model
        self._downloading = downloading
        self._bundled = bundled
        self._opened = opened
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
        """Note that the model at path (None: the bundled one) was loaded now: in the folder's
        last-used file, else (given `opened`) among the models opened from elsewhere. The note
        is queued on the thread at once, so closing right after still writes it."""
        if self._closed:
            return None
        if path is not None and Path(path).is_relative_to(self.folder):
            note = functools.partial(_note_use, self.folder, Path(path), self._clock())
        elif self._opened is not None:
            note = functools.partial(self._note_opened, path, self._clock())
        else:
            return None
        noted = asyncio.get_running_loop().run_in_executor(self._executor, note)
        return self._tasks.spawn(self._scan_after(noted))

    def forget(self, entry: LocalModel) -> asyncio.Task:
        """Drops a model opened from elsewhere from the listing and the picker; its file stays
        where it is."""
        return self._tasks.spawn(self._forget(entry))

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
        listing = await self._on_thread(self._read, folder)
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

    async def _forget(self, entry: LocalModel) -> None:
        if not entry.can_forget or self._opened is None:
            self._tell("show_status", f"{entry.name} was not opened from a file: there is "
                                      "nothing to forget.", True)
            return
        try:
            await self._on_thread(self._opened.forget, entry.path)
        except OSError as error:
            self._tell("show_status", f"Could not forget {entry.name}: "
                                      f"{error.strerror or error} ({self._opened.file}).", True)
            return
        await self._scan()
        self._tell("show_status", f"Forgot {entry.name}; the file stays where it is "
                                  f"({entry.path}).")

    # -- on the library's thread ---------------------------------------------------------------

    def _read(self, folder: Path) -> LocalListing:
        listing = scan_models_folder(folder)
        bundled = self._bundled()
        opened = {} if self._opened is None else self._opened.read()
        outside = _outside_entries(opened, folder, bundled)
        if bundled is not None and bundled.is_file():
            used = opened.get(bundled.absolute())
            outside.append(dataclasses.replace(_gguf_entry(bundled, used), kind=BUNDLED))
        if not outside:
            return listing
        entries = sorted([*listing.entries, *outside], key=_listing_order)
        return LocalListing(folder, tuple(entries), listing.exists)

    def _note_opened(self, path: str | None, when: float) -> None:
        model = Path(path) if path is not None else self._bundled()
        if model is not None:
            self._opened.note(model, when)

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
            entries.append(_folder_entry(here, last_used.get(_key(folder, here) or "")))
            continue
        dirs.sort()
        for name in sorted(files):
            if name.lower().endswith(".gguf") and not is_mmproj_file(name):
                entries.append(_gguf_entry(here / name,
                                           last_used.get(_key(folder, here / name) or "")))
            elif name.endswith(PARTIAL_SUFFIX):
                entries.append(_partial_file_entry(here / name))
    entries.sort(key=_listing_order)
    return LocalListing(folder, tuple(entries), exists=True)


def read_last_used(folder: Path) -> dict[str, float]:
    """{path inside the folder: when it was last loaded}; an unreadable file counts as empty."""
    return read_times(folder / LAST_USED_FILE)


def write_last_used(folder: Path, last_used: dict[str, float]) -> None:
    write_times(folder / LAST_USED_FILE, last_used)


def _outside_entries(opened: dict[Path, float], folder: Path,
                     bundled: Path | None) -> list[LocalModel]:
    """The remembered models that still exist and are neither in the folder (listed from it)
    nor the bundled one (listed as such)."""
    entries = []
    skip = {bundled.resolve()} if bundled is not None else set()
    for path, used in opened.items():
        real = path.resolve()
        if real in skip or real.is_relative_to(folder.resolve()):
            continue
        try:
            entry = _outside_entry(path, used)
        except OSError:  # removed (or a drive unplugged) while it was read
            continue
        if entry is not None:
            entries.append(entry)
    return entries


def _outside_entry(path: Path, used: float) -> LocalModel | None:
    if path.is_file() and path.name.lower().endswith(".gguf"):
        return dataclasses.replace(_gguf_entry(path, used), kind=OUTSIDE)
    if path.is_dir() and (path / "config.json").is_file():
        entry = _folder_entry(path, used)
        return None if entry.is_partial else dataclasses.replace(entry, kind=OUTSIDE)
    return None


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
    if not entry.can_delete or not entry.path.resolve().is_relative_to(folder.resolve()):
        return (f"{entry.path} is not in the models folder: Pagoda deletes only what it "
                "downloaded there. Forget it instead, or delete it in your file manager.")
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


def _folder_entry(folder: Path, last_used: float | None) -> LocalModel:
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
                      size, last_used, modified)


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


def _gguf_entry(path: Path, last_used: float | None) -> LocalModel:
    stat = path.stat()
    return LocalModel(model_name(path), path, GGUF, quantization_of(path.name) or "?",
                      stat.st_size, last_used, stat.st_mtime)


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


def size_on_disk(path: Path) -> int:
    """A model's size as the models table gives it: a file's, or all of a folder's files."""
    return _tree_size(path) if path.is_dir() else path.stat().st_size


def _key(folder: Path, path: Path) -> str | None:
    """path inside folder, as the last-used file names it; None for a path outside."""
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except (OSError, ValueError):
        return None


def _listing_order(entry: LocalModel) -> tuple:
    return (entry.is_partial, -(entry.last_used or 0.0), entry.name.lower(), str(entry.path))
