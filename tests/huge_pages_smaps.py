"""Where this process's memory lies in transparent huge pages: /proc/self/smaps, read for tests
of buffers asked for them (pagoda/kernels/cpu/huge_pages.py and the weights the loader puts there)."""

from pathlib import Path

import pytest

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")

needs_huge_pages = pytest.mark.skipif(
    not THP_ENABLED.exists() or "[never]" in THP_ENABLED.read_text(),
    reason="no transparent huge pages on this system")


def smaps_field(address: int, field: str) -> int:
    """`field` of the mapping of /proc/self/smaps that holds address."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            low, high = (int(part, 16) for part in head[0].split("-"))
            inside = low <= address < high
        elif inside and head[0] == field + ":":
            return int(head[1])
    raise AssertionError(f"no mapping holds {address:#x}")
