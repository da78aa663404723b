"""What a chat's folder holds, looked at without reading a file: the files whose name says
Pagoda reads them, each with its path in the folder, modification time and size, within bounds.
Blocking (a walk of the folder's tree, stat calls only): run it off the event loop."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pagoda.app.components.documents import named_readable

MAX_FILES = 2_000  # indexed of one folder; past this the folder is a disk, not a topic
MAX_DEPTH = 12  # folders inside folders, below the chat's folder
# Entries looked at in one walk: bounds the time a walk of a huge tree of other files takes.
MAX_ENTRIES = 100_000


class FolderError(Exception):
    """A folder a chat cannot answer from: not there, not a folder, or not open to Pagoda."""


@dataclass(frozen=True, slots=True)
class FileStat:
    """A file of the folder as it is now: its path inside the folder ("/" between parts), its
    modification time (ns) and size (bytes). Either changes when the file does."""

    source_path: str
    mtime_ns: int
    size: int


@dataclass(frozen=True, slots=True)
class FolderScan:
    """The files found, in a stable order (names sorted, folder by folder), and what the
    bounds left out: `more_files` (files past MAX_FILES, or entries past MAX_ENTRIES),
    `too_deep` (folders below MAX_DEPTH), `unopened` (folders that could not be listed) and
    `misnamed` (files to read and folders whose name is not UTF-8 text, as shown to a user)."""

    files: tuple[FileStat, ...]
    more_files: bool = False
    too_deep: int = 0
    unopened: int = 0
    misnamed: tuple[str, ...] = ()


def scan_folder(root: Path) -> FolderScan:
    """The files of `root` Pagoda reads, hidden files and folders (a name starting with ".")
    left out; a link is followed only to a file inside the folder. Raises FolderError when
    `root` is not a folder that can be listed."""
    if not root.is_dir():
        raise FolderError(f"{root} is not a folder (any more): it was moved, renamed or "
                          "deleted, or its drive is not connected")
    walk = _Walk(root.resolve())
    try:
        walk.folder(walk.root, "", 0)
    except OSError as error:
        raise FolderError(f"{root} cannot be opened: {error.strerror or error}") from None
    return FolderScan(tuple(walk.files), walk.more_files, walk.too_deep, walk.unopened,
                      tuple(walk.misnamed))


@dataclass(slots=True)
class _Walk:
    root: Path
    files: list[FileStat] = field(default_factory=list)
    more_files: bool = False
    too_deep: int = 0
    unopened: int = 0
    misnamed: list[str] = field(default_factory=list)
    entries: int = 0

    def folder(self, path: Path, prefix: str, depth: int) -> None:
        with os.scandir(path) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
        for entry in entries:
            self.entries += 1
            if self.more_files or self.entries > MAX_ENTRIES:
                self.more_files = True
                return
            if not entry.name.startswith("."):
                self._entry(entry, f"{prefix}{entry.name}", depth)

    def _entry(self, entry: os.DirEntry, relative: str, depth: int) -> None:
        try:
            if not is_utf8_name(entry.name):
                self._misnamed(entry, relative)
            elif entry.is_symlink():
                self._link(entry, relative)
            elif entry.is_dir(follow_symlinks=False):
                self._subfolder(Path(entry.path), relative, depth + 1)
            elif entry.is_file(follow_symlinks=False) and named_readable(entry.name):
                self._add(relative, entry.stat(follow_symlinks=False))
        except (OSError, RuntimeError):
            pass  # gone since the listing, or a link in a loop: not a file to read

    def _misnamed(self, entry: os.DirEntry, relative: str) -> None:
        """A name the store cannot keep (a file from an old system, in Latin-1, say): left
        out, and named, where it is a folder or a file Pagoda would read."""
        if entry.is_dir(follow_symlinks=False) or named_readable(entry.name):
            self.misnamed.append(os.fsencode(relative).decode("utf-8", "backslashreplace"))

    def _subfolder(self, path: Path, relative: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.too_deep += 1
            return
        try:
            self.folder(path, f"{relative}/", depth)
        except OSError:
            self.unopened += 1

    def _link(self, entry: os.DirEntry, relative: str) -> None:
        """Never to a folder (what it holds inside this one is found where it is; outside,
        it is not this folder's), nor to a file outside the folder."""
        target = Path(entry.path).resolve()
        if target.is_file() and target.is_relative_to(self.root) and named_readable(entry.name):
            self._add(relative, target.stat())

    def _add(self, relative: str, stat: os.stat_result) -> None:
        if len(self.files) >= MAX_FILES:
            self.more_files = True
            return
        self.files.append(FileStat(relative, stat.st_mtime_ns, stat.st_size))


def is_utf8_name(name: str) -> bool:
    """Whether `name` was UTF-8 on disk: bytes that are not come back as lone surrogates."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
