"""Reading a file the user picked as text, never more than a bound: what an import reads."""

from __future__ import annotations

from pathlib import Path


class FileTooLargeError(ValueError):
    """The file holds more than the bound; nothing past it was read."""


def read_utf8(path: Path, limit: int) -> str:
    """The file's UTF-8 text (a byte-order mark is allowed), read in one go of at most `limit`
    bytes. Raises OSError (cannot be read), FileTooLargeError, UnicodeDecodeError: each
    caller says them in its own words."""
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(f"{path} is larger than {limit} bytes")
    return data.decode("utf-8-sig")
