"""What an MCP server writes on stderr, kept for Settings → Tools and for error messages.

A stdio server's stderr is the write end of a pipe; a daemon thread reads the other end (a
blocking read, the same on every platform) into a ring of the last lines, so a chatty server can
neither block on a full pipe nor fill memory, and no event loop waits on it.
"""

from __future__ import annotations

import codecs
import collections
import os
import threading
from typing import TextIO

MAX_LOG_LINES = 2000
MAX_LOG_CHARS = 256 * 1024
MAX_LINE_CHARS = 4096
_READ_CHUNK = 64 * 1024
OURS = "[pagoda] "  # how Pagoda's own lines begin
STARTING = OURS + "starting"


class LogRing:
    """The last lines of a server's log, bounded in lines and characters; thread-safe."""

    def __init__(self, max_lines: int = MAX_LOG_LINES, max_chars: int = MAX_LOG_CHARS) -> None:
        self._max_lines = max_lines
        self._max_chars = max_chars
        self._lines: collections.deque[str] = collections.deque()
        self._chars = 0
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        """Add text as it arrives: lines end at "\\n"; an unfinished one waits for the rest."""
        with self._lock:
            pieces = (self._partial + text).split("\n")
            self._partial = pieces.pop()
            if len(self._partial) > MAX_LINE_CHARS:
                pieces.append(self._partial)
                self._partial = ""
            for line in pieces:
                self._append(line.rstrip("\r"))

    def note(self, line: str) -> None:
        """A line of Pagoda's own ("[pagoda] starting ..."), after any unfinished line."""
        with self._lock:
            if self._partial:
                self._append(self._partial)
                self._partial = ""
            self._append(line)

    def text(self) -> str:
        """The kept lines, oldest first, and any unfinished last line."""
        with self._lock:
            return "\n".join([*self._lines, self._partial] if self._partial else self._lines)

    def last_line(self) -> str:
        """The latest non-blank line the server wrote since Pagoda last started it, "" when
        none."""
        with self._lock:
            for line in reversed([*self._lines, self._partial]):
                if line.startswith(STARTING):
                    break
                if line.strip() and not line.startswith(OURS):
                    return line.strip()
            return ""

    def _append(self, line: str) -> None:
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + " …"
        self._lines.append(line)
        self._chars += len(line)
        while len(self._lines) > self._max_lines or self._chars > self._max_chars:
            self._chars -= len(self._lines.popleft())


class StderrPipe:
    """A pipe to give a server process as its stderr (`writer`), copied into `ring` by a daemon
    thread until every copy of the write end is closed. Close `writer` once the process has
    started (it keeps its own copy), or at once if it failed to start."""

    def __init__(self, ring: LogRing, name: str) -> None:
        read_fd, write_fd = os.pipe()
        self.writer: TextIO = os.fdopen(write_fd, "w")
        self._ring = ring
        self._thread = threading.Thread(target=self._copy, args=(read_fd,),
                                        name=f"pagoda-mcp-stderr-{name}", daemon=True)
        self._thread.start()

    def close_writer(self) -> None:
        self.writer.close()

    def join(self, timeout_s: float) -> None:
        """Wait until the server's side of the pipe is closed and everything is copied."""
        self._thread.join(timeout_s)

    def _copy(self, read_fd: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while chunk := os.read(read_fd, _READ_CHUNK):
                self._ring.write(decoder.decode(chunk))
            self._ring.write(decoder.decode(b"", final=True))
        finally:
            os.close(read_fd)
