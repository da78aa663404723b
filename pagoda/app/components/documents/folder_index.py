"""A chat's folders, without a window: each folder's files indexed in the store in the
background and kept up to date. A look at a folder (folder_scan: names, times and sizes, no
reading) is compared with what the store keeps; files new or changed are read one by one on
the documents' reading thread and stored, files gone are dropped. A file that cannot be read is
reported with why, and read again only once it changes.

The folders are looked at when the chat opens, before each question, and every RESCAN_S while
the chat is open; closing the chat, or removing a folder, cancels its work. No Qt."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from pagoda.app.components.documents import (
    DocumentError,
    DocumentReader,
    DocumentTooLargeError,
    ReadingCancelled,
    chunk_document,
    read_document,
    reading_thread,
)
from pagoda.app.components.documents.chat_documents import attachment_of
from pagoda.app.components.documents.document import MAX_FILE_BYTES
from pagoda.app.components.documents.folder_scan import (
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_FILES,
    FileStat,
    FolderError,
    FolderScan,
    is_utf8_name,
    scan_folder,
)
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.tasks import TaskSet
from pagoda.app.components.shared.view_models import FolderView
from pagoda.app.store import Folder, FolderFile, NewAttachment, StoreError

logger = logging.getLogger(__name__)

RESCAN_S = 30.0
# A question waits for the files found changed just before it to be read, where they are this
# few (an edited note); more (a folder's first indexing) and it answers from what is indexed.
QUESTION_WAITS_FOR = 20
MISNAMED_SHOWN = 5  # of the names a folder's note lists that cannot be read as text

_looker: ThreadPoolExecutor | None = None


class ChatFolders:
    """`views` (one FolderView a folder, in the order added); `on_changed(views)` fires when
    one changes, `on_settled()` when a folder's reading ends, `on_error(exc)` on a failure
    that is not a file's."""

    def __init__(self, conversation_id: int, db: AsyncStore, read: DocumentReader = read_document,
                 rescan_s: float = RESCAN_S) -> None:
        self.conversation_id = conversation_id
        self.db = db
        self._read = read
        self._rescan_s = rescan_s
        self._folders: dict[int, FolderIndex] = {}
        self._tasks = TaskSet(lambda exc: self.on_error(exc))
        self._ticker: asyncio.Task | None = None
        self.closed = False
        self.on_changed: Callable[[list[FolderView]], None] = lambda _views: None
        self.on_settled: Callable[[], None] = lambda: None
        self.on_error: Callable[[BaseException], None] = lambda _exc: None

    @property
    def views(self) -> list[FolderView]:
        return [index.view for index in self._folders.values()]

    async def open(self) -> None:
        """The chat's folders as stored, shown at once, then looked at in the background."""
        for folder in await self.db.folders(self.conversation_id):
            self._keep(folder)
        self._changed()
        for index in self._folders.values():
            self._tasks.spawn(index.rescan())
        self._tick_while_open()

    async def add(self, path: str | Path) -> None:
        """Answer from the folder at `path` too; raises FolderError or StoreError, in words,
        for one that is not a folder, is there already, or is one too many."""
        folder = await self.db.add_folder(self.conversation_id, str(folder_path(path)))
        if self.closed:
            return
        index = self._keep(folder)
        self._changed()
        self._tasks.spawn(index.rescan())
        self._tick_while_open()

    async def remove(self, folder_id: int) -> None:
        """The folder leaves the chat: its reading is stopped, its index deleted."""
        index = self._folders.pop(folder_id, None)
        if index is None:
            return
        await index.stop()
        self._changed()
        await self.db.remove_folder(folder_id)

    async def rescan(self) -> None:
        """Look at every folder again (the reading of what changed goes on in the background)."""
        await asyncio.gather(*(index.rescan() for index in list(self._folders.values())))

    async def before_question(self) -> list[str]:
        """Look at the folders again and wait for the files found new or changed to be read,
        where they are few; the names of the folders still being indexed after that."""
        await self.rescan()
        busy = []
        for index in list(self._folders.values()):
            if index.left_to_read <= QUESTION_WAITS_FOR:
                await index.settled()
            if index.left_to_read:
                busy.append(index.view.name)
        return busy

    async def settled(self) -> None:
        """Wait until every look and reading under way has ended."""
        await self._tasks.wait_idle()

    async def documents(self) -> list[FolderFile]:
        """What is indexed of the chat's folders, for retrieval."""
        if not self._folders:
            return []
        return await self.db.chat_folder_files(self.conversation_id)

    def close(self) -> None:
        """Stop every folder's work (the chat is closing)."""
        self.closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        for index in self._folders.values():
            index.cancel()

    def _keep(self, folder: Folder) -> FolderIndex:
        index = FolderIndex(folder, self.db, self._read, self._tasks.spawn)
        index.on_changed, index.on_settled = self._changed, self._settled
        self._folders[folder.id] = index
        return index

    def _tick_while_open(self) -> None:
        if self._ticker is None and self._folders and not self.closed:
            self._ticker = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        while not self.closed:
            await asyncio.sleep(self._rescan_s)
            try:
                await self.rescan()
            except Exception as exc:  # shown, and the next look tries again
                logger.error("looking at chat %s's folders: %s", self.conversation_id, exc,
                             exc_info=exc)
                self.on_error(exc)

    def _changed(self) -> None:
        if not self.closed:
            self.on_changed(self.views)

    def _settled(self) -> None:
        if not self.closed:
            self.on_settled()


class FolderIndex:
    """One folder of a chat, kept indexed; `view` says where it stands, `on_changed()` fires
    when it changes and `on_settled()` when a reading ends. `spawn` runs its reading."""

    def __init__(self, folder: Folder, db: AsyncStore, read: DocumentReader,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task]) -> None:
        self.folder = folder
        self.db = db
        self._read = read
        self._spawn = spawn
        self.on_changed: Callable[[], None] = lambda: None
        self.on_settled: Callable[[], None] = lambda: None
        self.view = FolderView(folder.id, Path(folder.path).name or folder.path, folder.path)
        self._indexed: set[str] = set()  # the files the store keeps, by path in the folder
        self._queue: dict[str, FileStat] = {}  # to read, in the order found
        self._failed: dict[str, tuple[FileStat, str]] = {}  # as it was when it failed, and why
        self._reading: FileStat | None = None
        self._done = 0  # read since the reading began
        self._reader: asyncio.Task | None = None
        self._looking = asyncio.Lock()
        self._stopped = False

    @property
    def left_to_read(self) -> int:
        return len(self._queue) + (self._reading is not None)

    async def rescan(self) -> None:
        """Look at the folder, drop the files gone, queue those new or changed for reading."""
        async with self._looking:
            if self._stopped:
                return
            try:
                scan = await asyncio.get_running_loop().run_in_executor(
                    _looking_thread(), scan_folder, Path(self.folder.path))
                stored = {f.source_path: f for f in await self.db.folder_files(self.folder.id)}
                await self._compare(scan, stored)
            except FolderError as exc:
                self._show(state="failed", error=str(exc))
            except StoreError:
                self._stopped = True  # removed from its chat meanwhile

    async def settled(self) -> None:
        while self._reader is not None and not self._reader.done():
            await asyncio.wait({self._reader})

    async def stop(self) -> None:
        """No more looking or reading; returns once the reading has let go."""
        self.cancel()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    def cancel(self) -> None:
        self._stopped = True
        if self._reader is not None:
            self._reader.cancel()

    # -- comparing a look with the store ---------------------------------------------------------

    async def _compare(self, scan: FolderScan, stored: dict[str, FolderFile]) -> None:
        found = {stat.source_path for stat in scan.files}
        busy = self._reading.source_path if self._reading is not None else None
        for gone in sorted(set(stored) - found - {busy}):
            await self.db.drop_folder_file(self.folder.id, gone)
        self._indexed = set(stored) & found
        self._failed = {path: failure for path, failure in self._failed.items() if path in found}
        self._queue = {stat.source_path: stat for stat in scan.files
                       if self._needs_reading(stat, stored.get(stat.source_path))}
        self._show(files=len(scan.files), notes=_notes(scan), error="")
        if self._queue and not self._stopped and (self._reader is None or self._reader.done()):
            self._reader = self._spawn(self._read_queue())

    def _needs_reading(self, stat: FileStat, kept: FolderFile | None) -> bool:
        if kept is not None and (kept.mtime_ns, kept.size) == (stat.mtime_ns, stat.size):
            return False
        failed = self._failed.get(stat.source_path)
        return stat != self._reading and (failed is None or failed[0] != stat)

    # -- reading ---------------------------------------------------------------------------------

    async def _read_queue(self) -> None:
        self._done = 0
        try:
            while self._queue and not self._stopped:
                path = next(iter(self._queue))
                self._reading = self._queue.pop(path)
                self._show()
                await self._read_one(self._reading)
                self._reading = None
                self._done += 1
        except StoreError:
            self._stopped = True  # removed from its chat meanwhile
        finally:
            self._reading = None
            self._show()
            self.on_settled()

    async def _read_one(self, stat: FileStat) -> None:
        try:
            document = await self._document(stat)
        except DocumentError as exc:
            await self._failed_to_read(stat, str(exc))
            return
        except OSError as exc:
            await self._failed_to_read(stat, f"{stat.source_path} could not be opened: "
                                             f"{exc.strerror or exc}")
            return
        except ReadingCancelled:
            return
        self._failed.pop(stat.source_path, None)
        await self.db.put_folder_file(self.folder.id, stat.source_path, stat.mtime_ns,
                                      stat.size, document)
        self._indexed.add(stat.source_path)

    async def _document(self, stat: FileStat) -> NewAttachment:
        if stat.size > MAX_FILE_BYTES:
            raise DocumentTooLargeError(stat.source_path, f"{stat.size / 2**20:,.0f} MiB",
                                        f"{MAX_FILE_BYTES // 2**20} MiB")
        path = Path(self.folder.path, *stat.source_path.split("/"))
        return await asyncio.get_running_loop().run_in_executor(
            reading_thread(), self._read_and_cut, path, stat.source_path)

    def _read_and_cut(self, path: Path, source_path: str) -> NewAttachment:
        """On the reading thread; the reading is stopped (its process killed) within moments
        of the folder's work being cancelled, so a file that takes long holds nobody."""
        document = self._read(path, stopped=self._is_stopped)
        return replace(attachment_of(document, chunk_document(document)), name=source_path)

    def _is_stopped(self) -> bool:
        return self._stopped

    async def _failed_to_read(self, stat: FileStat, why: str) -> None:
        """Reported, and the version kept from before (if any) dropped: it is no longer the
        file's text."""
        self._failed[stat.source_path] = (stat, why)
        if stat.source_path in self._indexed:
            await self.db.drop_folder_file(self.folder.id, stat.source_path)
            self._indexed.discard(stat.source_path)

    # -- what the chip shows ---------------------------------------------------------------------

    def _show(self, **changes) -> None:
        if self._stopped:
            return
        left = self.left_to_read
        state = changes.pop("state", "indexing" if left else "ready")
        failed = tuple(sorted((path, why) for path, (_stat, why) in self._failed.items()))
        self.view = replace(self.view, state=state, indexed=len(self._indexed),
                            done=self._done if left else 0, to_read=self._done + left if left
                            else 0, failed=failed, **changes)
        self.on_changed()


def _looking_thread() -> ThreadPoolExecutor:
    """One worker looks at every chat's folders (stat calls), apart from the reading thread so
    a question's look never waits behind a long PDF."""
    global _looker
    if _looker is None:
        _looker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-folders")
    return _looker


def folder_path(path: str | Path) -> Path:
    """`path` as a folder a chat can answer from (absolute, links resolved); FolderError when
    it is not a folder."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_dir():
        raise FolderError(f"{path} is not a folder: choose a folder to answer from")
    if not is_utf8_name(str(resolved)):
        shown = os.fsencode(resolved).decode("utf-8", "backslashreplace")
        raise FolderError(f"{shown} cannot be kept: its path is not UTF-8 text. Rename the "
                          "folder, then add it again")
    return resolved


def _notes(scan: FolderScan) -> tuple[str, ...]:
    """What the bounds left out of the folder, in words."""
    notes = []
    if scan.more_files:
        notes.append(f"Only the first {len(scan.files):,} files are indexed: the folder holds "
                     f"more than Pagoda looks through ({MAX_FILES:,} files, {MAX_ENTRIES:,} "
                     "entries). Add a folder inside it for the rest.")
    if scan.too_deep:
        notes.append(f"{scan.too_deep:,} folders more than {MAX_DEPTH} levels down are left out.")
    if scan.unopened:
        notes.append(f"{scan.unopened:,} folders could not be opened.")
    if scan.misnamed:
        shown = ", ".join(scan.misnamed[:MISNAMED_SHOWN])
        more = (f" and {len(scan.misnamed) - MISNAMED_SHOWN:,} more"
                if len(scan.misnamed) > MISNAMED_SHOWN else "")
        notes.append(f"Left out, as their names are not UTF-8 text: {shown}{more}. Rename them "
                     "to have them read.")
    return tuple(notes)
