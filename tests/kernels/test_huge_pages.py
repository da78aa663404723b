from pathlib import Path

import pytest

from kernels.cpu.huge_pages import HUGE_PAGE, huge_page_buffer

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _smaps_field(address: int, field: str) -> int:
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


def test_huge_page_buffer_starts_at_a_huge_page_and_keeps_its_bytes():
    size = 2 * HUGE_PAGE + 12345
    buffer = huge_page_buffer(size)
    assert buffer.numel() == size and buffer.is_contiguous()
    assert buffer.data_ptr() % HUGE_PAGE == 0
    buffer.copy_(buffer.new_ones(size).cumsum(0) % 251)
    view = buffer[-7:]
    del buffer
    assert view.tolist() == [(size - 6 + i) % 251 for i in range(7)]


def test_a_buffer_under_one_huge_page_is_a_plain_tensor():
    buffer = huge_page_buffer(HUGE_PAGE - 1)
    buffer.fill_(3)
    assert buffer.numel() == HUGE_PAGE - 1 and int(buffer.sum()) == 3 * (HUGE_PAGE - 1)


@pytest.mark.skipif(not THP_ENABLED.exists() or "[never]" in THP_ENABLED.read_text(),
                    reason="no transparent huge pages on this system")
def test_whole_huge_pages_are_eligible_for_huge_pages_and_the_partial_last_one_is_not():
    buffer = huge_page_buffer(2 * HUGE_PAGE + 4096)
    buffer.fill_(1)
    assert _smaps_field(buffer.data_ptr(), "THPeligible") == 1
    if "[madvise]" in THP_ENABLED.read_text():  # "always" gives every page huge ones anyway
        assert _smaps_field(buffer.data_ptr() + 2 * HUGE_PAGE, "THPeligible") == 0
