"""Process memory: zeros that cost nothing until written, and giving memory that was freed back
to the operating system (what is resident now: pagoda/engine/worker/process_memory.py, without torch).

glibc keeps freed blocks below its (growing) mmap threshold in its heaps, and tensors of a few
MB are: after a model is built layer by layer, about 0.5 GB of a 7B model's load-time buffers
stayed resident until trimmed. Elsewhere (macOS, Windows, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
import sys

import torch


def zeroed_host_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros over an anonymous memory map: the OS hands out zeroed pages as they
    are first written, where torch.zeros writes, and so makes resident, every byte at once. A KV
    pool sized for long contexts then costs only what its sequences have used."""
    nbytes = math.prod(shape) * dtype.itemsize
    # frombuffer keeps the mapping alive as long as the tensor (and its views) live.
    raw = torch.frombuffer(mmap.mmap(-1, max(nbytes, 1)), dtype=torch.uint8, count=nbytes)
    return raw.view(dtype).view(shape)


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
