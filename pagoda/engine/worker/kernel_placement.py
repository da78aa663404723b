"""Which kernels a model's layers run here, chosen before any layer is built: the dispatch
point's backend and, on a CPU with PyTorch's kernels, which of our C kernels (q4_gemv, q8_gemv
and their AMX calls) run each step size, timed on the model's own first layer, so that layers
keep only the layouts their steps read (`pagoda.engine.quantization.cpu_paths`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import replace

import torch

from pagoda.engine.config import EngineConfig
from pagoda.engine.layers.linear import Placement, make_linear
from pagoda.engine.quantization import cpu_paths
from pagoda.engine.quantization.cpu_int4 import CpuInt4Method
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.cpu_q4 import Q4Context, Q4Kernel, load_q4_context
from pagoda.engine.quantization.cpu_q8 import CpuQ8Method, Q8Context, Q8Kernel, load_q8_context
from pagoda.engine.quantization.dequantize_workspace import DequantWorkspace
from pagoda.engine.quantization.native_kernels import load_native
from pagoda.engine.quantization.tensors import (
    BlockWeight,
    Int4Weight,
    Int8Weight,
    Weight,
    split_int8_into_int4,
    widen_blocks,
)
from pagoda.kernels.ops import select_ops

logger = logging.getLogger(__name__)

# Rows of the vocabulary's table its int8 pass is timed on at load (q8_gemv against q8_amx):
# a few ms a call, where the whole table's would be ~50 ms at 64 rows.
_VOCABULARY_PROBE_ROWS = 4096


def place_kernels(config: EngineConfig, weights: Mapping[str, Weight]) -> Placement:
    """Where and with what the model's layers are built, for `config`'s device and dtype."""
    backend = None if config.kernel_backend == "auto" else config.kernel_backend
    device = torch.device(config.device)
    placement = Placement(device, config.dtype, select_ops(device, backend, load_native))
    if not placement.uses_cpu_kernels:
        return placement
    return with_cpu_paths(placement, weights, config.max_num_batched_tokens)


def with_cpu_paths(placement: Placement, weights: Mapping[str, Weight],
                   max_rows: int) -> Placement:
    """The placement with its int4 path policy (`cpu_paths`) and, where the policy runs it at
    all, our q4_gemv kernel; then, where q8_gemv loads, whether the vocabulary's int8 pass
    calls AMX, whether grouped int8 layers run q8_gemv, and when GGUF blocks widen for a GEMM.
    Our kernels take fp32 activations only, the compute dtype on a CPU."""
    fp32 = placement.dtype == torch.float32
    q4 = load_q4_context() if fp32 else None
    policy = int4_policy(weights, q4, max_rows)
    placement = replace(placement, cpu_int4_policy=policy,
                        q4=q4 if policy.native_below_rows else None)
    q8 = load_q8_context() if fp32 else None
    if q8 is None:
        return placement
    policy.int8_pass_amx_from_rows = vocabulary_amx_from_rows(weights, q8, max_rows)
    return replace(placement, q8=q8,
                   q8_layers=int8_layers_run_q8(weights, placement, q8, max_rows),
                   cpu_blocks_policy=blocks_policy(weights, policy, q8, max_rows))


def int4_policy(weights: Mapping[str, Weight], q4: Q4Context | None,
                max_rows: int) -> CpuPathPolicy:
    """Which int4 kernel runs each step size, and from how many rows a step dequantizes int4
    layers (and grouped int8 ones, which run on the int4 kernels) and runs one GEMM. The probe
    is the first layer's largest matrix: the vocabulary's is larger, but no step runs it on
    many rows."""
    # The first layer only: weights may be decoded lazily, layer by layer.
    layers = _first_layer(weights)
    int4 = [w for w in layers if isinstance(w, Int4Weight)]
    if not int4:
        # Grouped int8 or GGUF blocks only: their exact int8, as int4 halves, stands in.
        int4 = [split_int8_into_int4(widen_blocks(w) if isinstance(w, BlockWeight) else w)
                for w in layers if isinstance(w, BlockWeight) or _is_grouped_int8(w)][:1]
    if not int4:
        return CpuPathPolicy()
    probe = _largest(int4)
    keeps_source = CpuPathPolicy(dequantize_from_rows=1,
                                 workspace=DequantWorkspace.for_this_machine())
    # Its own scratch: the probe's 256-row calls would leave the model's one that large.
    native = None if q4 is None else Q4Kernel(probe, q4.with_own_scratch(), precise=True,
                                              reuse_output=True)
    return cpu_paths.calibrate(CpuInt4Method(probe, keeps_source), max_rows, native)


def vocabulary_amx_from_rows(weights: Mapping[str, Weight], q8: Q8Context,
                             max_rows: int) -> int:
    """From how many rows the vocabulary's int8 pass runs q8_amx (sys.maxsize: never), timed
    against q8_gemv on its first rows (the time per row does not depend on which)."""
    vocab = weights.get("lm_head.weight", weights.get("model.embed_tokens.weight"))
    if (q8.amx is None or not isinstance(vocab, Int8Weight) or vocab.group_size is None
            or vocab.q.dim() != 2):
        return sys.maxsize
    rows = min(_VOCABULARY_PROBE_ROWS, vocab.shape[0])
    probe = Int8Weight(vocab.q[:rows], vocab.scales[:rows], vocab.group_size,
                       None if vocab.mins is None else vocab.mins[:rows])
    kernel = Q8Kernel(probe, q8.with_own_scratch(), precise=False, reuse_output=False)
    from_rows, why = cpu_paths.choose_amx_rows(kernel, probe.shape[1], _step_sizes(max_rows))
    logger.info("CPU vocabulary projection's int8 pass: %s", why)
    return from_rows


def int8_layers_run_q8(weights: Mapping[str, Weight], placement: Placement, q8: Q8Context,
                       max_rows: int) -> bool:
    """Whether grouped int8 layers run q8_gemv rather than int4 halves: timed on the first
    layer's largest grouped int8 matrix at the step sizes that run a kernel."""
    int8 = [w for w in _first_layer(weights) if _is_grouped_int8(w)]
    if not int8:
        return False
    probe = _largest(int8)
    policy = placement.cpu_int4_policy
    below = policy.dequantize_from_rows or sys.maxsize
    rows = [m for m in _step_sizes(max_rows) if m < below] or [1]
    # Their own scratch, as the int4 probe's: the model's stays decode-sized.
    q4 = None if placement.q4 is None else placement.q4.with_own_scratch()
    halves = make_linear(probe, None, replace(placement, q4=q4, q8=None)).method
    native = CpuQ8Method(probe, policy, q8.with_own_scratch(), precise=True, reuse_output=True)
    return cpu_paths.choose_int8_kernel(halves, native, probe.shape[1], rows)[0]


def blocks_policy(weights: Mapping[str, Weight], policy: CpuPathPolicy, q8: Q8Context,
                  max_rows: int) -> CpuPathPolicy | None:
    """int4's policy with the step size from which GGUF blocks read in place dequantize for a
    GEMM instead, timed on the first layer's largest block matrix (None: no blocks in it)."""
    blocks = [w for w in _first_layer(weights) if isinstance(w, BlockWeight)]
    if not blocks:
        return None
    probe = _largest(blocks)
    method = CpuQ8Method(probe, policy, q8.with_own_scratch(), precise=True, reuse_output=True)
    threshold = cpu_paths.choose_blocks_gemm_rows(method, probe.shape[1], _step_sizes(max_rows),
                                                  policy.gemm_dtype)[0]
    return replace(policy, dequantize_from_rows=threshold)


def _first_layer(weights: Mapping[str, Weight]) -> list[Weight]:
    return [weights[name] for name in weights if name.startswith("model.layers.0.")]


def _largest(weights: list[Weight]) -> Weight:
    return max(weights, key=lambda w: w.shape[0] * w.shape[1])


def _is_grouped_int8(weight: Weight) -> bool:
    return isinstance(weight, Int8Weight) and weight.group_size is not None


def _step_sizes(max_rows: int) -> list[int]:
    """The calibration's step sizes that a step of at most max_rows tokens can have."""
    return [m for m in cpu_paths.CALIBRATION_ROWS if m <= max_rows]
