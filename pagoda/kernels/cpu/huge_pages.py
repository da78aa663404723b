"""Buffers for weights that a decode step streams from memory, in transparent huge pages.

A one-row step reads each repacked weight once, from DRAM. In 4 KB pages that is a TLB miss and
a page walk every 4 KB, and the hardware prefetchers stop at each page's end; in 2 MB pages
neither. On a 2-core Zen 3 whose kernel gives huge pages only where asked (THP "madvise"), the
Qwen3-30B-A3B attention linears' Q4_K records streamed 2-13% faster from huge pages
(docs/KERNELS.md, "Records in huge pages").

The buffer is an anonymous mapping asked for huge pages before anything touches it (a page
already faulted in stays 4 KB), from its first 2 MB boundary on and only over whole 2 MB pages:
its last partial one stays in 4 KB pages, so no buffer holds more memory than its size rounds
up to. Where the system has no huge pages the advice does nothing, or fails and is dropped.
"""

from __future__ import annotations

import ctypes
import math
import mmap

import torch

HUGE_PAGE = 2 << 20


def huge_page_buffer(size: int) -> torch.Tensor:
    """size bytes (uint8, uninitialised), their whole 2 MB pages in huge pages where the system
    gives them; a plain tensor below one huge page."""
    if size < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(size, dtype=torch.uint8)
    # Private: a shared anonymous mapping is shmem, which the THP "madvise" mode leaves alone.
    region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(region)) % HUGE_PAGE
    try:
        region.madvise(mmap.MADV_HUGEPAGE, start, size // HUGE_PAGE * HUGE_PAGE)
    except OSError:
        pass  # no transparent huge pages in this kernel: 4 KB pages, as torch.empty's
    # The tensor holds the mapping: it is unmapped when the last view of it goes.
    return torch.frombuffer(region, dtype=torch.uint8, count=size, offset=start)


def huge_page_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous tensor of `shape`, its bytes a huge_page_buffer's: for a
    weight a decode step streams, made where it is first written so that it is the only copy."""
    count = math.prod(shape)
    size = count * torch.empty((), dtype=dtype).element_size()
    return huge_page_buffer(size).view(dtype).view(shape)
