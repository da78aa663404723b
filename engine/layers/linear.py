"""Linear layers and embeddings whose weights are stored and multiplied by a quantization method.

The model calls `layer(x)` and never branches on formats: the method, chosen once from the
weight's layout, the device and the kernel backend, owns how the weight is kept and applied
(vLLM's `LinearMethod` seam).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.quantization.tensors import (
    Int4Weight,
    Int8Weight,
    Weight,
    dequantize_rows,
    split_int8_into_int4,
)
from kernels.ops import KernelOps


class LinearMethod(Protocol):
    """Creates a layer's weights in the form its kernel wants and applies them."""

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...


@dataclass(slots=True)
class Linear:
    method: LinearMethod
    bias: torch.Tensor | None
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(x, self.bias)


@dataclass(slots=True)
class Embedding:
    """A token table; a quantized one dequantizes only the rows a step gathers."""

    weight: Weight
    dtype: torch.dtype

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.weight, token_ids, self.dtype)


def make_linear(weight: Weight, bias: torch.Tensor | None, device: torch.device,
                dtype: torch.dtype, ops: KernelOps) -> Linear:
    if bias is not None:
        bias = bias.to(device=device, dtype=dtype)
    return Linear(_method_for(weight, device, dtype, ops), bias, weight.shape[0])


def make_embedding(weight: Weight, device: torch.device, dtype: torch.dtype) -> Embedding:
    return Embedding(to_device(weight, device, dtype), dtype)


def _method_for(weight: Weight, device: torch.device, dtype: torch.dtype,
                ops: KernelOps) -> LinearMethod:
    # Imported here: each format's file imports this module's types.
    from engine.quantization import cpu_int4, cpu_int8, kernel_methods, split_int8, unquantized

    if isinstance(weight, torch.Tensor):
        return unquantized.UnquantizedMethod(weight.to(device=device, dtype=dtype))
    on_cpu_torch = device.type == "cpu" and ops.name == "torch"
    if isinstance(weight, Int4Weight):
        if on_cpu_torch:
            return cpu_int4.CpuInt4Method(weight)
        return kernel_methods.KernelInt4Method(to_device(weight, device, dtype), ops)
    if isinstance(weight, Int8Weight) and weight.group_size is not None:
        inner = _method_for(split_int8_into_int4(weight), device, dtype, ops)
        return split_int8.SplitInt8Method(inner, weight.shape[0])
    if isinstance(weight, Int8Weight):
        if on_cpu_torch:
            return cpu_int8.CpuInt8Method(weight)
        return kernel_methods.KernelInt8Method(to_device(weight, device, dtype), ops)
    raise TypeError(f"no linear method for weights of type {type(weight).__name__}")


def to_device(weight: Weight, device: torch.device, dtype: torch.dtype) -> Weight:
    """Float tables move at the compute dtype; quantized ones keep their integers, with scales
    at the compute dtype on a GPU (fp16/bf16 there) and float32 on a CPU."""
    if isinstance(weight, torch.Tensor):
        return weight.to(device=device, dtype=dtype)
    scale_dtype = torch.float32 if device.type == "cpu" else dtype
    if isinstance(weight, Int8Weight):
        return Int8Weight(weight.q.to(device), weight.scales.to(device, scale_dtype),
                          weight.group_size)
    return Int4Weight(weight.packed.to(device), weight.scales.to(device, scale_dtype),
                      weight.mins.to(device, scale_dtype), weight.group_size)
