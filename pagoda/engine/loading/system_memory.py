"""How much memory this machine has and can give now: what the fit check, the KV cache's
sizing and the experts' population ask before they allocate or map.

A leaf module (it imports nothing of the engine), so the loader's low modules can ask too.
"""

from __future__ import annotations

from pathlib import Path


def available_memory() -> int | None:
    """Bytes the system can give without swapping: psutil's figure, else /proc/meminfo's."""
    try:
        import psutil
    except ImportError:
        return _meminfo_field("MemAvailable")
    return int(psutil.virtual_memory().available)


def total_memory() -> int | None:
    """The machine's RAM: psutil's figure, else /proc/meminfo's MemTotal."""
    try:
        import psutil
    except ImportError:
        return _meminfo_field("MemTotal")
    return int(psutil.virtual_memory().total)


def _meminfo_field(name: str, meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        lines = meminfo.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key == name:
            return int(value.split()[0]) * 1024  # reported in kB
    return None
