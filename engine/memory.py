"""Give memory that was freed back to the operating system.

glibc keeps freed blocks below its (growing) mmap threshold in its heaps, and tensors of a few
MB are: after a model is built layer by layer, about 0.5 GB of a 7B model's load-time buffers
stayed resident until trimmed. Elsewhere (macOS, Windows, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


def release_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
