"""This process's resident set: what LM Studio and `top` show as its memory.

Without torch, so the window can show it before the engine is imported."""

from __future__ import annotations

from pathlib import Path

_STATUS = Path("/proc/self/status")


def resident_bytes() -> int | None:
    """Bytes of RAM this process holds now, or None where neither /proc nor psutil can tell."""
    try:
        for line in _STATUS.read_text(encoding="ascii").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)
