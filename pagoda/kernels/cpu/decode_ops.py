"""pagoda/kernels/cpu/decode_ops.c through ctypes: the per-layer ops of a CPU step as a `KernelOps`.

Each call here runs ~10 times per layer, so the wrappers do the least Python they can: the C
functions' argument types are declared once, shapes and strides are read straight off the
tensors, and only fp32 activations with unit inner strides go to C. Anything else (other
dtypes, odd strides, prefill attention) runs torch_ref's function unchanged: the fallback is per
call, so one `KernelOps` serves every step.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from pagoda.kernels import torch_ref
from pagoda.kernels.attention_metadata import AttentionMetadata, DecodeGroup
from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.decode_layers import (
    DecodeLayers,
    delta_net_args,
    mamba2_args,
    short_conv_args,
)
from pagoda.kernels.kernel_ops import TORCH_OPS, KernelOps

NAME = "decode_ops"
SCALAR, AVX2, AVX512, BEST_ISA = 0, 1, 2, -1
_F32 = torch.float32
# The cache dtypes the C code reads and writes, by its codes.
CACHE_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# Below this many (query head x key) pairs in a step's layer, attention stays on the calling
# thread: waking the pool costs more than the work (measured in docs/KERNELS.md). The step's
# decode groups (pagoda/engine/worker/model_runner.py) are counted together: 32 sequences of 100-400 tokens
# come as four groups of a few rows each, none of them this wide alone, and attended on one
# thread each they kept the second core idle for ~13% of a 32-stream run. The linears around
# it keep the pool awake (its threads spin between them), so waking costs little: on the Zen 4
# (2026-12-03) two threads paid from ~1,000 pairs (the 1B shape, 32 heads at 32 keys, 21.5 ->
# 17.4 µs a call; the 135M's 9 heads lost at 64 keys and won at 128).
PARALLEL_MIN_SCORES = 1024
# The most indices pg_top_k keeps per row (decode_ops.c's TOP_K_MAX); more go to torch. It
# returns _TOP_K_GAVE_UP where a row needed too many replacements of its kept k (TOP_K_BUDGET).
TOP_K_MAX = 256
_TOP_K_GAVE_UP = 2
# pg_route's scorings, and the most experts it routes among (decode_ops.c's PG_MAX_EXPERTS).
SCORINGS = {"softmax": 0, "sigmoid": 1}
MAX_EXPERTS = 1024
# The widest head decode attention reads in C (decode_ops.c's MAX_HEAD_DIM: its key and value
# chunks live on the stack); wider ones (Gemma 4's global layers, 512) attend through torch_ref.
MAX_HEAD_DIM = 256

_ptr, _i32, _i64, _f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
_SIGNATURES = {
    "pg_isa_supported": [_i32],
    "pg_set_isa": [_i32],
    "pg_rms_norm": [_ptr, _i64, _ptr, _i32, _i32, _f32, _ptr],
    "pg_add_rms_norm": [_ptr, _ptr, _i64, _ptr, _i32, _i32, _f32, _ptr],
    "pg_rotary": [_ptr, _i64, _i32, _i32, _i32, _ptr, _ptr, _ptr],
    "pg_silu_and_mul": [_ptr, _i64, _i32, _i32, _ptr],
    "pg_gelu_tanh_and_mul": [_ptr, _i64, _i32, _i32, _ptr],
    "pg_top_k": [_ptr, _i64, _i32, _i32, _i32, _ptr],
    "pg_argmax": [_ptr, _i64, _i32, _i32, _ptr],
    "pg_route": [_ptr, _i64, _i32, _i32, _ptr, _ptr, _i32, _i32, _i32, _i32, _i32, _ptr, _ptr,
                 _i32],
    "pg_add_sigmoid_gated": [_ptr, _ptr, _ptr, _i64, _ptr, _i32, _i32, _ptr],
    "pg_sigmoid_mul": [_ptr, _i64, _ptr, _i64, _i32, _i32, _ptr],
    "pg_gated_delta_decode": [_ptr, _ptr, _i64, _i32, _ptr, _ptr, _ptr, _i32],
    "pg_short_conv_decode": [_ptr, _ptr, _i64, _i32, _ptr, _ptr, _ptr],
    "pg_mamba2_decode": [_ptr, _ptr, _i64, _i32, _ptr, _ptr, _ptr, _i32],
    "pg_write_kv": [_ptr, _i64, _ptr, _i64, _i32, _i32, _i32, _ptr, _ptr, _i32, _i64, _ptr],
    "pg_decode_attention": [_ptr, _i64, _i32, _i32, _i32, _i32, _ptr, _ptr, _i32, _i32, _i32,
                            _ptr, _i32, _ptr, _i32, _f32, _ptr, _ptr, _i32],
}


class DecodeOps:
    """The loaded library with tensor-level calls that match torch_ref's contracts."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self._lib = lib
        self._rms, self._add_rms = lib.pg_rms_norm, lib.pg_add_rms_norm
        self._rotary, self._silu = lib.pg_rotary, lib.pg_silu_and_mul
        self._gelu_tanh = lib.pg_gelu_tanh_and_mul
        self._top_k, self._argmax = lib.pg_top_k, lib.pg_argmax
        self._route, self._add_gated = lib.pg_route, lib.pg_add_sigmoid_gated
        self._write, self._attend = lib.pg_write_kv, lib.pg_decode_attention
        self._sigmoid_mul, self._delta_decode = lib.pg_sigmoid_mul, lib.pg_gated_delta_decode
        self._short_conv, self._mamba2 = lib.pg_short_conv_decode, lib.pg_mamba2_decode
        self._mamba2_scratch = lib.pg_mamba2_scratch_floats
        self._mamba2_scratch.argtypes, self._mamba2_scratch.restype = [_ptr, _i32], _i64
        self._delta_scratch = lib.pg_gated_delta_scratch_floats
        self._delta_scratch.argtypes, self._delta_scratch.restype = [_ptr, _i32], _i64

    @classmethod
    def load(cls, build_dir: Path | None, compiler: str | None = None) -> DecodeOps:
        """Raises native.NativeBuildError where the library can be neither found nor built."""
        return cls(native.load(NAME, build_dir, compiler))

    def isa_supported(self, isa: int) -> bool:
        return bool(self._lib.pg_isa_supported(isa))

    def set_isa(self, isa: int) -> None:
        """Force the scalar (0), AVX2 (1) or AVX-512 (2, attention's; AVX2 elsewhere) bodies, or
        the best this CPU has (-1): for tests."""
        if self._lib.pg_set_isa(isa):
            raise ValueError(f"instruction set {isa} is not one this CPU runs")

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if (x.dtype != _F32 or weight.dtype != _F32 or x.dim() != 2 or x.stride(1) != 1
                or weight.shape != x.shape[1:]):
            return torch_ref.rms_norm(x, weight, eps)
        n, d = x.shape
        out = torch.empty(n, d)
        _check(self._rms(x.data_ptr(), x.stride(0), weight.data_ptr(), n, d, eps,
                         out.data_ptr()), "pg_rms_norm")
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """x += residual in place (x is the new residual), then the norm of it."""
        if (x.dtype != _F32 or residual.dtype != _F32 or weight.dtype != _F32 or x.dim() != 2
                or not x.is_contiguous() or residual.shape != x.shape
                or residual.stride(1) != 1 or weight.shape != x.shape[1:]):
            return torch_ref.add_rms_norm(x, residual, weight, eps)
        n, d = x.shape
        out = torch.empty(n, d)
        _check(self._add_rms(x.data_ptr(), residual.data_ptr(), residual.stride(0),
                             weight.data_ptr(), n, d, eps, out.data_ptr()), "pg_add_rms_norm")
        return out, x

    def rotary_embedding(self, x: torch.Tensor, cos: torch.Tensor,
                         sin_signed: torch.Tensor) -> torch.Tensor:
        if (x.dtype != _F32 or cos.dtype != _F32 or sin_signed.dtype != _F32 or x.dim() != 3
                or x.stride(2) != 1 or x.stride(1) != x.shape[2]
                or not cos.is_contiguous() or not sin_signed.is_contiguous()
                or cos.numel() != x.shape[0] * x.shape[2] or sin_signed.shape != cos.shape):
            return torch_ref.rotary_embedding(x, cos, sin_signed)
        n, heads, hd = x.shape
        out = torch.empty(n, heads, hd)
        _check(self._rotary(x.data_ptr(), x.stride(0), n, heads, hd, cos.data_ptr(),
                            sin_signed.data_ptr(), out.data_ptr()), "pg_rotary")
        return out

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return self._gated(x, self._silu, "pg_silu_and_mul", torch_ref.silu_and_mul)

    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """torch_ref.gelu_tanh_and_mul to a few ulp (its tanh is Sleef's, ours from exp): the
        eager CPU path calls this one so that it and the C layer stack agree bit for bit."""
        return self._gated(x, self._gelu_tanh, "pg_gelu_tanh_and_mul", torch_ref.gelu_tanh_and_mul)

    @staticmethod
    def _gated(x: torch.Tensor, fn: Callable[..., int], name: str,
               fallback: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """act(gate) * up of x [n, 2m] (gate first) by the C function fn, else by fallback."""
        if x.dtype != _F32 or x.dim() != 2 or x.stride(1) != 1 or x.shape[1] % 2:
            return fallback(x)
        n, m = x.shape[0], x.shape[1] // 2
        out = torch.empty(n, m)
        _check(fn(x.data_ptr(), x.stride(0), n, m, out.data_ptr()), name)
        return out

    def top_k_indices(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """torch_ref.top_k_indices' set of indices per row, in no particular order: one pass
        over a row, most of it one compare per 8 values (a 49152-wide vocabulary's 32 largest
        on a 2-core Xeon: 25 µs for one row where torch's topk took 100, 0.47 ms for 32 rows
        against 1.28)."""
        if x.dtype != _F32 or x.dim() != 2 or x.stride(1) != 1 or not 0 < k <= min(x.shape[1],
                                                                                   TOP_K_MAX):
            return torch_ref.top_k_indices(x, k)
        out = torch.empty(x.shape[0], k, dtype=torch.int64)
        rc = self._top_k(x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], k, out.data_ptr())
        if rc == _TOP_K_GAVE_UP:  # a row far from logits (say, ascending): torch sorts it
            return torch_ref.top_k_indices(x, k)
        _check(rc, "pg_top_k")
        return out

    def row_argmax(self, x: torch.Tensor) -> torch.Tensor:
        """torch_ref.row_argmax's indices, one pass of compares and a second to find where
        the largest first is, on the calling thread (torch's `max` woke the team for a
        49152-wide row and took ~110 µs of a decode step; this ~10)."""
        if x.dtype != _F32 or x.dim() != 2 or x.stride(1) != 1 or x.shape[1] == 0:
            return torch_ref.row_argmax(x)
        out = torch.empty(x.shape[0], dtype=torch.int64)
        _check(self._argmax(x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr()),
               "pg_argmax")
        return out

    def route(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              top_k: int, scoring: str, renormalize: bool, softmax_after_top_k: bool,
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """torch_ref.route's contract to rounding, its logits dotted in C: the one-call decode
        step routes with the same function, so the eager path and it pick the same experts,
        ties included (the lower index first)."""
        experts = weight.shape[0]
        if (x.dtype != _F32 or x.dim() != 2 or x.stride(1) != 1 or scoring not in SCORINGS
                or not _fp32_matrix(weight, experts, x.shape[1]) or experts > MAX_EXPERTS
                or (bias is not None and not _fp32_vector(bias, experts))
                or not 0 < top_k <= experts):
            return torch_ref.route(x, weight, bias, top_k, scoring, renormalize,
                                   softmax_after_top_k)
        m = x.shape[0]
        ids = torch.empty(m, top_k, dtype=torch.int64)
        weights = torch.empty(m, top_k)
        _check(self._route(x.data_ptr(), x.stride(0), m, x.shape[1], weight.data_ptr(),
                           None if bias is None else bias.data_ptr(), experts, top_k,
                           SCORINGS[scoring], renormalize, softmax_after_top_k, ids.data_ptr(),
                           weights.data_ptr(), torch.get_num_threads()), "pg_route")
        return weights, ids

    def add_sigmoid_gated(self, routed: torch.Tensor, shared: torch.Tensor, x: torch.Tensor,
                          gate: torch.Tensor) -> torch.Tensor:
        """torch_ref.add_sigmoid_gated's, the gate's logit dotted in C (as the one-call step
        does)."""
        if (x.dtype != _F32 or x.dim() != 2 or x.stride(1) != 1
                or not _fp32_matrix(gate, 1, x.shape[1])
                or any(t.dtype != _F32 or t.shape != x.shape or not t.is_contiguous()
                       for t in (routed, shared))):
            return torch_ref.add_sigmoid_gated(routed, shared, x, gate)
        out = torch.empty_like(routed)
        _check(self._add_gated(routed.data_ptr(), shared.data_ptr(), x.data_ptr(), x.stride(0),
                           gate.data_ptr(), x.shape[0], x.shape[1], out.data_ptr()),
               "pg_add_sigmoid_gated")
        return out

    def sigmoid_mul(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """torch_ref.sigmoid_mul's, in C: the one-call decode step gates a gated attention's
        output with the same function, so the two agree bit for bit."""
        if (x.dtype != _F32 or gate.dtype != _F32 or x.dim() != 2 or gate.shape != x.shape
                or x.stride(1) != 1 or gate.stride(1) != 1):
            return torch_ref.sigmoid_mul(x, gate)
        n, d = x.shape
        out = torch.empty(n, d)
        _check(self._sigmoid_mul(x.data_ptr(), x.stride(0), gate.data_ptr(), gate.stride(0), n,
                                 d, out.data_ptr()), "pg_sigmoid_mul")
        return out

    def gated_delta_decode(self, proj: torch.Tensor, slots: torch.Tensor,
                           states: tuple[torch.Tensor, torch.Tensor], conv_weight: torch.Tensor,
                           decay_rate: torch.Tensor, dt_bias: torch.Tensor, norm: torch.Tensor,
                           heads: tuple[int, int, int, int], tiled: bool,
                           eps: float) -> torch.Tensor | None:
        """A Gated DeltaNet's decode rows from in_proj's output proj [d, width] to what its
        out_proj reads [d, v_heads * v_dim] (decode_ops.c's pg_gated_delta_decode), each row's
        states (conv window, delta rule) at its slot advanced in place; None where a tensor is
        not one the C code reads (the layer runs its torch path)."""
        args = delta_net_args(conv_weight, decay_rate, dt_bias, norm, *states, heads, tiled, eps)
        if args is None or not _decode_rows(proj, slots, args.in_width):
            return None
        m = proj.shape[0]
        scratch = torch.empty(self._delta_scratch(ctypes.byref(args), m))
        out = torch.empty(m, args.value_width)
        _check(self._delta_decode(ctypes.byref(args), proj.data_ptr(), proj.stride(0), m,
                                  slots.data_ptr(), scratch.data_ptr(), out.data_ptr(),
                                  torch.get_num_threads()), "pg_gated_delta_decode")
        return out

    def mamba2_decode(self, proj: torch.Tensor, slots: torch.Tensor,
                      states: tuple[torch.Tensor, torch.Tensor], conv_weight: torch.Tensor,
                      conv_bias: torch.Tensor | None, a: torch.Tensor, d: torch.Tensor | None,
                      dt_bias: torch.Tensor, norm: torch.Tensor,
                      shape: tuple[int, int, int, int, int],
                      dt_limits: tuple[float, float], eps: float) -> torch.Tensor | None:
        """A Mamba-2's decode rows from in_proj's output proj [d, width] to what its out_proj
        reads [d, heads * head_dim] (decode_ops.c's pg_mamba2_decode), each row's states at its
        slot advanced in place; shape = (heads, head_dim, state_size, groups, norm_groups).
        None where a tensor is not one the C code reads (the layer runs its torch path)."""
        args = mamba2_args(conv_weight, conv_bias, a, d, dt_bias, norm, states, shape,
                           dt_limits, eps)
        if args is None or not _decode_rows(proj, slots, args.in_width):
            return None
        m = proj.shape[0]
        scratch = torch.empty(self._mamba2_scratch(ctypes.byref(args), m))
        out = torch.empty(m, args.inner)
        _check(self._mamba2(ctypes.byref(args), proj.data_ptr(), proj.stride(0), m,
                            slots.data_ptr(), scratch.data_ptr(), out.data_ptr(),
                            torch.get_num_threads()), "pg_mamba2_decode")
        return out

    def short_conv_decode(self, proj: torch.Tensor, slots: torch.Tensor, states: torch.Tensor,
                          weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """LFM2's short convolution's decode rows from in_proj's output proj [d, 3 x channels]
        to what its out_proj reads [d, channels] (decode_ops.c's pg_short_conv_decode), each
        row's window at its slot advanced in place; None where a tensor is not one the C code
        reads (the layer runs its torch path)."""
        args = short_conv_args(weight, bias, states)
        if args is None or not _decode_rows(proj, slots, 3 * args.channels):
            return None
        m = proj.shape[0]
        scratch, out = torch.empty(m, args.channels), torch.empty(m, args.channels)
        _check(self._short_conv(ctypes.byref(args), proj.data_ptr(), proj.stride(0), m,
                                slots.data_ptr(), scratch.data_ptr(), out.data_ptr()),
               "pg_short_conv_decode")
        return out

    def write_kv_cache(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if not self._writes(k, v, k_cache, v_cache, slot_mapping):
            torch_ref.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)
            return
        self._write_checked(k, v, k_cache, v_cache, slot_mapping)

    def _write_checked(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        n, kv_heads, hd = k.shape
        _check(self._write(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), n, kv_heads, hd,
                           k_cache.data_ptr(), v_cache.data_ptr(), CACHE_DTYPES[k_cache.dtype],
                           k_cache.shape[0] * k_cache.shape[1], slot_mapping.data_ptr()),
               "pg_write_kv")

    def paged_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                        scale: float, softcap: float | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
        """torch_ref.paged_attention's contract: decodes attend in C over the cache in place
        (with their sinks where given), prefill segments through torch_ref; softcapped scores
        all through torch_ref (the C kernel has no cap)."""
        if softcap is not None:
            return torch_ref.paged_attention(q, k, v, k_cache, v_cache, meta, scale, softcap,
                                             sinks)
        if (q.dtype is not _F32 or q.stride()[1:] != (q.shape[2], 1) or q.shape[2] > MAX_HEAD_DIM
                or (sinks is not None and not _fp32_vector(sinks, q.shape[1]))
                or not self._writes(k, v, k_cache, v_cache, meta.slot_mapping)):
            return torch_ref.paged_attention(q, k, v, k_cache, v_cache, meta, scale, sinks=sinks)
        self._write_checked(k, v, k_cache, v_cache, meta.slot_mapping)
        num_tokens, heads, hd = q.shape
        out = torch.empty(num_tokens, heads * hd)
        threads = attention_threads(heads, k_cache.shape[1], meta.decode_groups)
        sinks_ptr = None if sinks is None else sinks.data_ptr()
        for group in meta.decode_groups:
            self._decode(q, k_cache, v_cache, group, meta.sliding_window, scale, sinks_ptr, out,
                         threads)
        for seg in meta.prefills:
            out[seg.start:seg.end] = torch_ref.prefill_attention(q, k, v, k_cache, v_cache, seg,
                                                                 scale, sinks=sinks)
        return out

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                group: DecodeGroup, window: int, scale: float, sinks: int | None,
                out: torch.Tensor, threads: int) -> None:
        _, heads, hd = q.shape
        num_blocks, block_size, kv_heads, _ = k_cache.shape
        tables, lens = as_int64(group.block_tables), as_int64(group.context_lens)
        n, max_blocks = tables.shape
        if n != group.end - group.start or group.end > q.shape[0] or lens.shape != (n,):
            raise ValueError(f"decode group [{group.start}, {group.end}) does not match its "
                             f"block tables {tuple(tables.shape)}, context lengths "
                             f"{tuple(lens.shape)} or the step's {q.shape[0]} queries")
        _check(self._attend(q.data_ptr() + group.start * q.stride(0) * 4, q.stride(0), n, heads,
                            kv_heads, hd, k_cache.data_ptr(), v_cache.data_ptr(),
                            CACHE_DTYPES[k_cache.dtype], num_blocks, block_size, tables.data_ptr(),
                            max_blocks, lens.data_ptr(), window, scale, sinks,
                            out.data_ptr() + group.start * heads * hd * 4, threads),
               "pg_decode_attention")

    @staticmethod
    def _writes(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                slot_mapping: torch.Tensor) -> bool:
        """Whether the C write (and the C attention) take these tensors."""
        shape = k.shape
        rows = (shape[2], 1)  # heads hd apart, unit inner stride
        return (k.dtype is _F32 and v.dtype is _F32 and k_cache.dtype in CACHE_DTYPES
                and v_cache.dtype is k_cache.dtype and v.shape == shape
                and k_cache.shape[2:] == shape[1:] and v_cache.shape == k_cache.shape
                and k.stride()[1:] == rows and v.stride()[1:] == rows
                and k_cache.is_contiguous() and v_cache.is_contiguous()
                and slot_mapping.dtype is torch.int64 and slot_mapping.is_contiguous()
                and slot_mapping.shape == shape[:1])


def attention_threads(heads: int, block_size: int, groups: Sequence[DecodeGroup]) -> int:
    """Threads for a step's decode attention: its query heads times the keys of all its decode
    groups (each group's rows x its widest context) is the work that decides whether waking
    the pool pays; each group then runs on them."""
    keys = sum((g.end - g.start) * g.block_tables.shape[-1] for g in groups) * block_size
    return torch.get_num_threads() if heads * keys >= PARALLEL_MIN_SCORES else 1


def _decode_rows(proj: torch.Tensor, slots: torch.Tensor, width: int) -> bool:
    """A recurrent layer's decode rows as its C row reads them: in_proj's output fp32 [d, width]
    with unit column stride, and one int64 slot per row, contiguous."""
    return (proj.dtype == _F32 and proj.dim() == 2 and proj.stride(1) == 1
            and proj.shape[1] == width and slots.dtype == torch.int64
            and slots.is_contiguous() and slots.shape == proj.shape[:1])


def _fp32_vector(t: torch.Tensor, length: int) -> bool:
    return t.dtype is _F32 and t.shape == (length,) and t.is_contiguous()


def _fp32_matrix(t: torch.Tensor, rows: int, cols: int) -> bool:
    return t.dtype is _F32 and t.shape == (rows, cols) and t.is_contiguous()


def as_int64(t: torch.Tensor) -> torch.Tensor:
    """t as contiguous int64, without a copy where it is one already."""
    return t if t.dtype == torch.int64 and t.is_contiguous() else t.long().contiguous()


def _check(rc: int, name: str) -> None:
    if rc:
        raise ValueError(f"{name} refused its arguments (code {rc}): shapes, dtypes or a slot "
                         "or context length outside the cache")


def decode_kernel_ops(lib: ctypes.CDLL) -> KernelOps:
    """TORCH_OPS with the decode-step ops run by the library. `name` stays "torch": the model
    runner builds the same metadata and the linears take the same CPU paths."""
    ops = DecodeOps(lib)
    return dataclasses.replace(
        TORCH_OPS,
        rms_norm=ops.rms_norm,
        add_rms_norm=ops.add_rms_norm,
        rotary_embedding=ops.rotary_embedding,
        silu_and_mul=ops.silu_and_mul,
        gelu_tanh_and_mul=ops.gelu_tanh_and_mul,
        top_k_indices=ops.top_k_indices,
        row_argmax=ops.row_argmax,
        route=ops.route,
        add_sigmoid_gated=ops.add_sigmoid_gated,
        sigmoid_mul=ops.sigmoid_mul,
        gated_delta_decode=ops.gated_delta_decode,
        short_conv_decode=ops.short_conv_decode,
        mamba2_decode=ops.mamba2_decode,
        write_kv_cache=ops.write_kv_cache,
        paged_attention=ops.paged_attention,
        decode_layers=DecodeLayers(lib),
    )
