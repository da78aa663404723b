"""A file's expert weights mapped into the process before their first step, in the background.

The experts stay in the file's memory map (a 30B-A3B's are most of its 18 GB), so each page a
step first reads costs a page fault (~3 µs here; fault-around maps 16 pages a time): ~17,000
of them in the first 128 tokens of a 4-layer Qwen3-30B-A3B shape, ~0.4 ms a token, and twelve
times as many at 48 layers, where the pages also come from disk. llama.cpp maps its whole file
populated (MAP_POPULATE) before it answers; we load at once and let a thread ask the kernel to
map the experts' pages (`MADV_POPULATE_READ`, Linux 5.14+), reading from disk whatever the page
cache lacks, while the first request may already run.

Only where the experts fit in the memory available: a file larger than memory would have the
populating evict the pages it just read. Elsewhere (another OS, an older kernel) nothing is
done and the first steps fault the pages in, as before.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from collections.abc import Sequence

import numpy as np

from pagoda.engine.loading.system_memory import available_memory

logger = logging.getLogger(__name__)

MADV_POPULATE_READ = 22  # linux/mman.h
# One call a piece: a 48-layer file's populating stops soon after its process exits.
_PIECE = 64 << 20
_PAGE = 4096


def populate(arrays: Sequence[np.ndarray]) -> bool:
    """Maps each array's pages (views of a file's memory map) into this process now; False
    where the kernel refuses (no MADV_POPULATE_READ), True when every page is mapped."""
    madvise = _madvise()
    if madvise is None:
        return False
    for array in arrays:
        start = array.ctypes.data // _PAGE * _PAGE
        end = array.ctypes.data + array.nbytes
        for at in range(start, end, _PIECE):
            if madvise(ctypes.c_void_p(at), ctypes.c_size_t(min(_PIECE, end - at)),
                       MADV_POPULATE_READ):
                logger.debug("MADV_POPULATE_READ refused (errno %d)", ctypes.get_errno())
                return False
    return True


def populate_in_background(arrays: Sequence[np.ndarray]) -> threading.Thread | None:
    """populate(arrays) on a daemon thread (the call releases the GIL), where their bytes fit
    in the memory available; the thread, or None where nothing is populated."""
    size = sum(a.nbytes for a in arrays)
    available = available_memory()
    if not arrays or _madvise() is None or available is None or size > available:
        return None
    thread = threading.Thread(target=populate, args=(list(arrays),), daemon=True,
                              name="populate-experts")
    thread.start()
    return thread


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn
