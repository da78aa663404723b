"""Linear layers and embeddings whose weights are stored and multiplied by a quantization method.

The model calls `layer(x)` and never branches on formats: the method, chosen once from the
weight's layout, the device and the kernel backend, owns how the weight is kept and applied
(vLLM's `LinearMethod` seam).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field, replace
from itertools import groupby

import torch

from pagoda.engine.quantization import (
    cpu_int4,
    cpu_int8,
    cpu_q8,
    kernel_methods,
    split_int8,
    unquantized,
)
from pagoda.engine.quantization.base import LinearMethod
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.cpu_q4 import Q4Context
from pagoda.engine.quantization.cpu_q8 import Q8Context
from pagoda.engine.quantization.dequantize_workspace import DequantWorkspace
from pagoda.engine.quantization.tensors import (
    BlockWeight,
    GGUFRows,
    Int4Weight,
    Int8Weight,
    Weight,
    concat,
    dequantize_rows,
    split_int8_into_int4,
    widen_blocks,
)
from pagoda.kernels.kernel_ops import KernelOps

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Linear:
    method: LinearMethod
    bias: torch.Tensor | None
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(x, self.bias)


@dataclass(slots=True)
class Embedding:
    """A token table; a quantized one dequantizes only the rows a step gathers (with our C
    kernel where `widen` has it)."""

    weight: Weight
    dtype: torch.dtype
    widen: DequantWorkspace | None = None

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.widen is not None:
            return self.widen.gather(self.weight, token_ids, self.dtype)
        return dequantize_rows(self.weight, token_ids, self.dtype)


@dataclass(slots=True, frozen=True)
class Placement:
    """Where layers are built and with what: the device, the compute dtype, the kernels, and on
    a CPU the int4 path policy measured at load (`pagoda.engine.quantization.cpu_paths`) with our
    q4_gemv kernel where it loaded (`pagoda.engine.quantization.cpu_q4`; None: PyTorch's only), and
    our q8_gemv (`pagoda.engine.quantization.cpu_q8`) where it loaded: for a grouped int8 vocabulary
    and Q6_K weights always, for grouped int8 layers where the calibration chose it
    (q8_layers)."""

    device: torch.device
    dtype: torch.dtype
    ops: KernelOps
    cpu_int4_policy: CpuPathPolicy = field(default_factory=CpuPathPolicy)
    q4: Q4Context | None = None
    q8: Q8Context | None = None
    q8_layers: bool = False
    # GGUF blocks read in place: int4's policy with the step size from which they widen for a
    # GEMM timed on their own kernel (None: int4's policy as it is).
    cpu_blocks_policy: CpuPathPolicy | None = None

    @property
    def uses_cpu_kernels(self) -> bool:
        """PyTorch's own CPU kernels (the torch backend on a CPU), not the dispatch point's."""
        return self.device.type == "cpu" and self.ops.name == "torch"


def make_linear(weight: Weight, bias: torch.Tensor | None, placement: Placement,
                precise_int8: bool = True) -> Linear:
    """precise_int8: grouped int8 weights get 16-bit activations too (`split_activations`),
    and q4_gemv int16 activations for int4 and int8 alike; the vocabulary projection, whose top
    logits are recomputed exactly, does without (and gets a new output every call: its
    logits leave the model, where a layer's output is consumed before its next call)."""
    if bias is not None:
        bias = bias.to(device=placement.device, dtype=placement.dtype)
    return Linear(_method_for(weight, placement, precise_int8), bias, weight.shape[0])


def make_fused_linear(parts: list[Weight], bias: torch.Tensor | None,
                      placement: Placement) -> Linear:
    """Projections that share an input (q, k, v; gate, up) as one linear: one weight where
    their layouts stack (`concat`); where the CPU kernels read Q6_K and it sits beside another
    layout, each run of one layout through its own method, outputs side by side (`stacked`)."""
    from pagoda.engine.quantization.stacked import StackedMethod

    block_types = [type(w) if isinstance(w, BlockWeight) else None for w in parts]
    if not _runs_blocks(placement) or len(set(block_types)) == 1:
        return make_linear(concat(parts) if len(parts) > 1 else parts[0], bias, placement)
    runs = [[w for w, _ in run] for _, run in groupby(zip(parts, block_types),
                                                      key=lambda p: p[1])]
    methods = [_method_for(concat(run) if len(run) > 1 else run[0], placement, True)
               for run in runs]
    if bias is not None:
        bias = bias.to(device=placement.device, dtype=placement.dtype)
    return Linear(StackedMethod(methods), bias, sum(w.shape[0] for w in parts))


def make_embedding(weight: Weight, placement: Placement) -> Embedding:
    quantized_on_cpu = not isinstance(weight, torch.Tensor) and placement.device.type == "cpu"
    widen = DequantWorkspace.for_this_machine() if quantized_on_cpu else None
    return Embedding(to_device(weight, placement.device, placement.dtype), placement.dtype, widen)


def _method_for(weight: Weight, placement: Placement, precise_int8: bool,
                split_activations: bool = False) -> LinearMethod:
    device, dtype, ops = placement.device, placement.dtype, placement.ops
    if isinstance(weight, GGUFRows):  # an expert's rows in place: as linear, its usual layout
        weight = weight.decoded()
    if isinstance(weight, BlockWeight):
        if _runs_blocks(placement):
            # Read in place at the file's own width (Q6_K 0.82 bytes a weight, Q5_K 0.69,
            # IQ4_XS 0.53): less than any other path reads.
            policy = placement.cpu_blocks_policy or placement.cpu_int4_policy
            return cpu_q8.CpuQ8Method(weight, policy, placement.q8, precise_int8,
                                      reuse_output=precise_int8)
        _log_widened(weight.TYPE_NAME)
        weight = widen_blocks(weight)
    if isinstance(weight, torch.Tensor):
        return unquantized.UnquantizedMethod(weight.to(device=device, dtype=dtype))
    if isinstance(weight, Int4Weight):
        if placement.uses_cpu_kernels:
            return cpu_int4.CpuInt4Method(weight, placement.cpu_int4_policy, split_activations,
                                          placement.q4, precise_int8, reuse_output=precise_int8)
        return kernel_methods.KernelInt4Method(to_device(weight, device, dtype), ops)
    if isinstance(weight, Int8Weight) and weight.group_size is not None:
        if placement.uses_cpu_kernels and _runs_q8(placement, precise_int8):
            # Read in place: a tied vocabulary's weight is the embedding table's own tensors.
            return cpu_q8.CpuQ8Method(weight, placement.cpu_int4_policy, placement.q8,
                                      precise_int8, reuse_output=precise_int8)
        # int8 is chosen for precision: its activations get 16 bits as well.
        halves = split_int8_into_int4(weight)
        if placement.uses_cpu_kernels:
            # The halves never dequantize (the int8 weight does), and their output never
            # leaves the method (the halves are added into a new tensor).
            policy = replace(placement.cpu_int4_policy, dequantize_from_rows=None)
            kernel = cpu_int4.CpuInt4Method(halves, policy, precise_int8, placement.q4,
                                            precise_int8, reuse_output=True)
            return split_int8.CpuSplitInt8Method(kernel, weight, placement.cpu_int4_policy)
        inner = _method_for(halves, placement, precise_int8, split_activations=precise_int8)
        return split_int8.SplitInt8Method(inner, weight.shape[0])
    if isinstance(weight, Int8Weight):
        if placement.uses_cpu_kernels:
            return cpu_int8.CpuInt8Method(weight)
        return kernel_methods.KernelInt8Method(to_device(weight, device, dtype), ops)
    raise TypeError(f"no linear method for weights of type {type(weight).__name__}")


@functools.cache
def _log_widened(type_name: str) -> None:
    logger.info("%s: our CPU kernel does not run here, widened to int8", type_name)


def _runs_blocks(placement: Placement) -> bool:
    return placement.uses_cpu_kernels and placement.q8 is not None


def _runs_q8(placement: Placement, precise_int8: bool) -> bool:
    """The vocabulary (int8 activations) whenever q8_gemv loaded; layers where it was chosen."""
    return placement.q8 is not None and (placement.q8_layers or not precise_int8)


def to_device(weight: Weight, device: torch.device, dtype: torch.dtype) -> Weight:
    """Float tables move at the compute dtype; quantized ones keep their integers, with scales
    at the compute dtype on a GPU (fp16/bf16 there) and float32 on a CPU."""
    if isinstance(weight, torch.Tensor):
        return weight.to(device=device, dtype=dtype)
    if isinstance(weight, GGUFRows):
        weight = weight.decoded()
    scale_dtype = torch.float32 if device.type == "cpu" else dtype
    if isinstance(weight, BlockWeight):
        if device.type == "cpu":
            return weight
        weight = widen_blocks(weight)  # the GPU kernels read grouped int8
    if isinstance(weight, Int8Weight):
        mins = None if weight.mins is None else weight.mins.to(device, scale_dtype)
        return Int8Weight(weight.q.to(device), weight.scales.to(device, scale_dtype),
                          weight.group_size, mins)
    return Int4Weight(weight.packed.to(device), weight.scales.to(device, scale_dtype),
                      weight.mins.to(device, scale_dtype), weight.group_size)
