"""The one dispatch point for kernels: Triton on CUDA, the torch reference elsewhere (with our C
decode-step ops swapped in on CPU where their library loads: pagoda/kernels/cpu/decode_ops.py).

The backend is resolved once, when a model is built (`select_ops`), into a `KernelOps` of plain
functions: a call through it costs one attribute lookup, as a module function would.
Force a backend with `select_ops(device, "torch" | "triton")`, `EngineConfig.kernel_backend`, or
the PAGODA_KERNEL_BACKEND environment variable (e.g. Triton on CPU tensors under
TRITON_INTERPRET=1 for tests, or the torch path on CUDA for parity).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from collections.abc import Callable

import torch

from pagoda.kernels.kernel_ops import TORCH_OPS, KernelOps

BACKEND_ENV = "PAGODA_KERNEL_BACKEND"
BACKENDS = ("auto", "torch", "triton")


def resolve_backend(device: torch.device, backend: str | None = None) -> str:
    """"torch" or "triton": the argument, else PAGODA_KERNEL_BACKEND, else by device."""
    choice = backend or os.environ.get(BACKEND_ENV) or "auto"
    if choice not in BACKENDS:
        raise ValueError(f"kernel backend {choice!r} is unknown; choose one of {BACKENDS}")
    if choice == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return choice


def select_ops(device: torch.device, backend: str | None = None,
               load_native: Callable[[str], ctypes.CDLL | None] | None = None) -> KernelOps:
    """load_native(name) gives a C library of pagoda/kernels/cpu or None (the engine passes
    pagoda.engine.quantization.native_kernels.load_native); asked only for the torch path on CPU."""
    if resolve_backend(device, backend) == "triton":
        return triton_ops()
    if device.type == "cpu" and load_native is not None:
        return with_recurrent_steps(_cpu_ops(load_native), load_native)
    return TORCH_OPS


def _cpu_ops(load_native: Callable[[str], ctypes.CDLL | None]) -> KernelOps:
    from pagoda.kernels.cpu import decode_ops

    lib = load_native(decode_ops.NAME)
    return TORCH_OPS if lib is None else decode_ops.decode_kernel_ops(lib)


def with_recurrent_steps(ops: KernelOps,
                         load_native: Callable[[str], ctypes.CDLL | None]) -> KernelOps:
    """ops with the recurrent layers' state updates in C where their library loads; float32
    states only (the torch versions take the rest, per call)."""
    from pagoda.kernels.cpu import recurrent_steps as native_steps

    lib = load_native(native_steps.NAME)
    if lib is None:
        return ops
    steps = native_steps.RecurrentSteps(lib)
    return dataclasses.replace(ops, gdn_step=steps.gdn_step_or_torch,
                               mamba2_step=steps.mamba2_step_or_torch)


def triton_ops() -> KernelOps:
    """The Triton kernels, imported only now: the engine runs without triton installed."""
    try:
        from pagoda.kernels import triton_attention, triton_layers, triton_quant, triton_recurrent
    except ImportError as exc:
        raise ImportError(f"the Triton kernel backend needs triton ({exc}); install it with "
                          "`pip install triton`, or choose kernel_backend='torch'") from exc
    return KernelOps(
        name="triton",
        rms_norm=triton_layers.rms_norm,
        add_rms_norm=triton_layers.add_rms_norm,
        rotary_embedding=triton_layers.rotary_embedding,
        silu_and_mul=triton_layers.silu_and_mul,
        gelu_tanh_and_mul=triton_layers.gelu_tanh_and_mul,
        write_kv_cache=triton_layers.write_kv_cache,
        paged_attention=triton_attention.paged_attention,
        int4_linear=triton_quant.int4_linear,
        int8_linear=triton_quant.int8_linear,
        gdn_step=triton_recurrent.gdn_step,
        mamba2_step=triton_recurrent.mamba2_step,
    )
