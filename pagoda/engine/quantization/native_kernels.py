"""Where the engine builds our C kernels (pagoda/kernels/cpu/native.py), and what happens without them.

Built into the cache folder, so a machine compiles each kernel once. A machine without a
compiler, or without the instruction sets, keeps torch's own kernels: the engine says so once
in its log, with the reason, and runs on.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from pagoda.engine.folders import cache_dir
from pagoda.kernels.cpu import native

logger = logging.getLogger(__name__)

# Set to 0 to keep torch's kernels everywhere (for comparison, or to rule ours out).
NATIVE_KERNELS_ENV_VAR = "PAGODA_NATIVE_KERNELS"

_unavailable: dict[str, str] = {}


class AmxKernel(Protocol):
    def available(self) -> bool: ...


AmxT = TypeVar("AmxT", bound=AmxKernel)


def kernel_build_dir() -> Path:
    return cache_dir() / "kernels"


def native_kernels_enabled() -> bool:
    value = os.environ.get(NATIVE_KERNELS_ENV_VAR, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{NATIVE_KERNELS_ENV_VAR}={value!r}: set it to 1 (use Pagoda's C "
                         "kernels where they build) or 0 (torch's kernels only)")
    return value == "1"


def kernel_report() -> dict[str, str]:
    """Each of our C kernels and where it comes from here: "prebuilt" (shipped), "built" (in
    the cache folder), or why it is unavailable. Builds what is missing, as the engine would."""
    report = {}
    for name in native.kernel_names():
        shipped = native.prebuilt_path(name).exists()
        if load_native(name) is None:
            report[name] = _unavailable.get(name, "switched off by PAGODA_NATIVE_KERNELS=0")
        else:
            report[name] = "prebuilt" if shipped else "built"
    return report


def load_native(name: str) -> ctypes.CDLL | None:
    """pagoda/kernels/cpu/<name>.c loaded, or None (logged once per kernel) where it cannot be."""
    if not native_kernels_enabled():
        return None
    if name in _unavailable:
        return None
    try:
        return native.load(name, kernel_build_dir())
    except native.NativeBuildError as exc:
        _unavailable[name] = str(exc)
        logger.warning("CPU kernel %s unavailable, torch's kernels run instead: %s", name, exc)
        return None


def load_amx_kernel(name: str, wrap: Callable[[ctypes.CDLL], AmxT]) -> AmxT | None:
    """pagoda/kernels/cpu/<name>.c (an AMX kernel) wrapped, where it loads and this CPU and its OS let
    the process use AMX tiles; else None, logged."""
    lib = load_native(name)
    if lib is None:
        return None
    kernel = wrap(lib)
    if not kernel.available():
        logger.info("CPU kernel %s not used: this CPU has no AMX (tiles, BF16, INT8), or its OS "
                    "does not let this process use the tiles", name)
        return None
    return kernel
