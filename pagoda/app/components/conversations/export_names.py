"""The file name an export suggests: the chat's title made safe for a file name, and the day,
e.g. "pagoda-trip-to-kyoto-2026-12-01.md". No Qt."""

from __future__ import annotations

import re
from datetime import date

MAX_TITLE_CHARS = 60  # of the title in the name; the dialog shows the rest of the path too
EXPORT_FORMATS = {"Markdown (*.md)": "md", "JSON (*.json)": "json"}
# Characters no file system takes (Windows' set is the widest), and whitespace.
_UNSAFE = re.compile(r'[\s<>:"/\\|?*\x00-\x1f]+')


def export_file_name(title: str | None, day: date, suffix: str = "md") -> str:
    """`pagoda-<title>-<day>.<suffix>`, or `pagoda-chat-<day>.<suffix>` for an untitled chat."""
    slug = _UNSAFE.sub("-", (title or "").strip().lower())[:MAX_TITLE_CHARS].strip("-.")
    return f"pagoda-{slug or 'chat'}-{day.isoformat()}.{suffix}"


def with_suffix(name: str, suffix: str) -> str:
    """The name with its export suffix swapped (the user picked the other format)."""
    stem = name.rsplit(".", 1)[0] if name.endswith(tuple(f".{s}" for s in
                                                          EXPORT_FORMATS.values())) else name
    return f"{stem}.{suffix}"
