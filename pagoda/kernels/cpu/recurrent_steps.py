"""pagoda/kernels/cpu/recurrent_steps.c through ctypes: the recurrent layers' one-token state
updates fused, with pagoda/kernels/recurrent_steps.py's signatures (its torch versions are the
reference). Only float32 contiguous tensors go to C; the caller keeps the torch path otherwise."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from pagoda.kernels import recurrent_steps as torch_steps
from pagoda.kernels.cpu import native

NAME = "recurrent_steps"


class RecurrentSteps:
    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self._gdn = lib.gdn_step
        self._gdn.argtypes = [ptr, i64, ptr, i64, ptr, ptr, i64, i64, ptr, i64, i64, ptr, ptr,
                              ctypes.c_int, ptr]
        self._gdn.restype = ctypes.c_int
        self._mamba2 = lib.mamba2_step
        self._mamba2.argtypes = [ptr, i64, ptr, i64, ptr, i64, i64, ptr, ptr, ptr, ptr, i64, i64,
                                 ptr, ptr]
        self._mamba2.restype = ctypes.c_int

    @classmethod
    def load(cls, build_dir: Path | None, compiler: str | None = None) -> RecurrentSteps:
        """Raises native.NativeBuildError where the library can be neither found nor built."""
        return cls(native.load(NAME, build_dir, compiler))

    def gdn_step_or_torch(self, state: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """gdn_step in C on a float32 state table, in torch on any other (float64 in tests)."""
        if state.dtype != torch.float32 or not state.is_contiguous():
            return torch_steps.gdn_step(state, *args, **kwargs)
        return self.gdn_step(state, *args, **kwargs)

    def mamba2_step_or_torch(self, state: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if state.dtype != torch.float32 or not state.is_contiguous():
            return torch_steps.mamba2_step(state, *args, **kwargs)
        return self.mamba2_step(state, *args, **kwargs)

    def gdn_step(self, state: torch.Tensor, slots: torch.Tensor, q: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 tiled: bool = False) -> torch.Tensor:
        _check_state(state, slots)
        q, k, v, g, beta = _float32(q, k, v, g, beta)
        batch, k_heads, k_dim = k.shape
        v_heads, v_dim = v.shape[1:]
        if state.shape[1:] != (v_heads, k_dim, v_dim) or q.shape != k.shape:
            raise ValueError(f"state {tuple(state.shape)} does not fit q {tuple(q.shape)}, "
                             f"k {tuple(k.shape)} and v {tuple(v.shape)}")
        out = torch.empty(batch, v_heads, v_dim)
        status = self._gdn(state.data_ptr(), state.shape[0], slots.data_ptr(), batch,
                           q.data_ptr(), k.data_ptr(), k_heads, k_dim, v.data_ptr(), v_heads,
                           v_dim, g.data_ptr(), beta.data_ptr(), int(tiled), out.data_ptr())
        _check_status(status, state, slots)
        return out

    def mamba2_step(self, state: torch.Tensor, slots: torch.Tensor, x: torch.Tensor,
                    dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                    d: torch.Tensor | None) -> torch.Tensor:
        _check_state(state, slots)
        x, dt, a, b, c = _float32(x, dt, a, b, c)
        d = None if d is None else _float32(d)[0]
        batch, heads, head_dim = x.shape
        groups, state_size = b.shape[1:]
        if state.shape[1:] != (heads, head_dim, state_size) or c.shape != b.shape:
            raise ValueError(f"state {tuple(state.shape)} does not fit x {tuple(x.shape)}, "
                             f"b {tuple(b.shape)} and c {tuple(c.shape)}")
        out = torch.empty(batch, heads, head_dim)
        status = self._mamba2(state.data_ptr(), state.shape[0], slots.data_ptr(), batch,
                              x.data_ptr(), heads, head_dim, dt.data_ptr(), a.data_ptr(),
                              b.data_ptr(), c.data_ptr(), groups, state_size,
                              None if d is None else d.data_ptr(), out.data_ptr())
        _check_status(status, state, slots)
        return out


def _check_state(state: torch.Tensor, slots: torch.Tensor) -> None:
    if state.dtype != torch.float32 or not state.is_contiguous() or state.dim() != 4:
        raise ValueError("the state table must be float32 [num_slots, heads, rows, cols], "
                         "contiguous")
    if slots.dtype != torch.int64 or not slots.is_contiguous():
        raise ValueError("slots must be contiguous int64")


def _float32(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(torch.float32).contiguous() for t in tensors]


def _check_status(status: int, state: torch.Tensor, slots: torch.Tensor) -> None:
    if status != 0:
        raise ValueError(f"a slot of {slots.tolist()} is outside the {state.shape[0]} state slots, "
                         "or the heads do not divide into groups")
