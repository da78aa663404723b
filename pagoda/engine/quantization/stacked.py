"""Projections that share an input but not a layout, each multiplied by its own method, their
outputs side by side: one linear to the model.

A Q4_K_M file keeps some layers' v projection in Q6_K beside q and k in Q4_K. Fused into one
weight they would need one layout for all three: grouped int8 with mins, 1.25 bytes a weight
where Q4_K records take 0.58 and Q6_K 0.82, and a kernel computing mins besides. Kept apart,
q and k run q4_gemv and v q8_gemv's Q6_K pass; the decode step's C layer stack runs them as one
linear of parts (`pagoda.kernels.cpu.decode_layers.parts_linear`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from pagoda.kernels.cpu.decode_layers import CLinear, parts_linear


class PartKernel(Protocol):
    def c_linear(self, rows: int) -> CLinear: ...
    def workspace_bytes(self, m: int) -> int: ...


class PartMethod(Protocol):
    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...
    def c_kernel(self, rows: int) -> PartKernel | None: ...


class StackedKernel:
    """The parts' C kernels at one step size as one (`c_linear`); holds the array its CLinear
    points to."""

    __slots__ = ("_array", "_kernels", "_linear", "_rows")

    def __init__(self, kernels: list[PartKernel], rows: int) -> None:
        self._kernels = kernels
        self._rows = rows
        self._linear, self._array = parts_linear([k.c_linear(rows) for k in kernels])

    def c_linear(self, rows: int) -> CLinear:
        if rows != self._rows:
            raise ValueError(f"parts built for {self._rows}-row steps asked for {rows} rows")
        return self._linear

    def workspace_bytes(self, m: int) -> int:
        return max(k.workspace_bytes(m) for k in self._kernels)


class StackedMethod:
    __slots__ = ("_c_kernels", "methods")

    def __init__(self, methods: list[PartMethod]) -> None:
        self.methods = methods
        self._c_kernels: dict[int, StackedKernel | None] = {}

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = torch.cat([m.apply(x, None) for m in self.methods], dim=-1)
        return y if bias is None else y.add_(bias)

    def c_kernel(self, rows: int) -> StackedKernel | None:
        """The parts' kernels as one where every part runs a C kernel at this step size (kept:
        the decode step's arguments point into it)."""
        if rows not in self._c_kernels:
            kernels = [getattr(m, "c_kernel", lambda _: None)(rows) for m in self.methods]
            self._c_kernels[rows] = None if None in kernels else StackedKernel(kernels, rows)
        return self._c_kernels[rows]


