"""One process per database: an OS lock on a file beside it (`chats.db.lock`), held for as long
as a store is open.

The OS drops the lock when its process ends, however it ends (kill -9 included), so a crash never
leaves a stale lock behind. The file itself stays: deleting it on release would let a third
process lock a new file while a second still waits on the old one.
"""

import os
import sys
from pathlib import Path

from ..errors import DatabaseInUseError

LOCK_SUFFIX = ".lock"
PID_BYTES = 32  # a process id in decimal, with room to spare; nothing longer is read
_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)

if sys.platform == "win32":
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def lock_path_of(database: Path) -> Path:
    """Beside the real file: a symbolic link to a database, or a path through a linked folder,
    shares the lock of the file it leads to."""
    real = Path(os.path.realpath(database))  # unlike Path.resolve, never raises on a loop
    return real.with_name(real.name + LOCK_SUFFIX)


class DatabaseLock:
    """The exclusive lock on one database, from `acquire` until `release` or the process's end."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, database: Path) -> "DatabaseLock":
        """Take the lock or raise `DatabaseInUseError` at once (never waits). Other OS errors
        (a lock file that is a symlink, a file system without locks) are raised as they are."""
        path = lock_path_of(database)
        fd = os.open(path, _FLAGS, 0o600)
        try:
            if not _try_lock(fd):
                raise DatabaseInUseError(database, holder_pid(path))
            _write_pid(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Idempotent: a store closed twice releases once."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            _unlock(fd)
        finally:
            os.close(fd)


def holder_pid(path: Path) -> int | None:
    """The process id the holder wrote, if it can be read (Windows keeps the locked byte
    unreadable; a holder that has only just locked has written nothing yet)."""
    try:
        with path.open("rb") as file:
            return int(file.read(PID_BYTES).strip() or b"-")
    except (OSError, ValueError):
        return None


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid()}\n".encode())
