"""The CPU a bench ran on, for the heading of its table (figures compare only within one run)."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """/proc/cpuinfo's model name, else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
