"""Decode-only steps of a Llama model through one C call for the whole layer stack.

At one token per step the eager forward spends ~4 ms of a ~19 ms step (135M, this 2-core
machine) in the Python between its C kernels: ~10 calls per layer, 30 layers. Where every
linear of the model runs one of our C kernels at the step's size and the C decode ops are loaded,
`pg_decode_layers` (kernels/cpu/decode_ops.c) runs the same operators in the same order, so the
hidden states are the eager path's bit for bit; anything else (prefill, bf16 activations, a
linear on PyTorch's kernel or a GEMM, a layer unlike Llama's: `DecoderArchitecture.is_plain_llama`)
stays eager.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels.attention_metadata import AttentionMetadata
from kernels.cpu.decode_layers import DecodeLayers, GroupArgs, LayerArgs, LinearArgs, StepArgs
from kernels.cpu.decode_ops import CACHE_DTYPES, as_int64, attention_threads

if TYPE_CHECKING:
    from engine.layers.linear import Linear
    from engine.models.architecture import ModelShape
    from engine.models.decoder import DecoderForCausalLM

# Decode batches of up to this many rows run in one call (where every linear has a C kernel at
# their size); larger ones, which only a server with a raised max_num_seqs makes, stay eager.
# Up to 8 rows until 2026-12-02: running 9-32 rows in one call too took 32 streams of the
# default model from a median 409 to 434 tok/s (one process, alternating rounds).
MAX_ROWS = 256


@dataclass(slots=True)
class _Plan:
    """What steps of one row count reuse: the layer arguments, pointing into the buffers."""

    step: StepArgs
    layers: ctypes.Array
    out: torch.Tensor
    cache_ptr: int


@dataclass(slots=True)
class _Buffers:
    """The scratch, the linears' workspace and the output that every plan shares, sized for
    the largest step planned: one step runs at a time, and its output is read before the
    next."""

    rows: int
    work_bytes: int
    scratch: torch.Tensor
    linear_work: torch.Tensor
    out: torch.Tensor

    @property
    def work_ptr(self) -> int:
        return self.linear_work.data_ptr() + (-self.linear_work.data_ptr() % 64)


class NativeDecode:
    """`forward_layers` gives the last layer's hidden + residual, or None to run eager."""

    def __init__(self, model: DecoderForCausalLM, lib: DecodeLayers) -> None:
        self._model = model
        self._lib = lib
        self._plans: dict[int, _Plan | None] = {}
        self._buffers: _Buffers | None = None

    @classmethod
    def build(cls, model: DecoderForCausalLM) -> NativeDecode | None:
        lib = model.ops.decode_layers
        if not isinstance(lib, DecodeLayers) or model.norm.dtype != torch.float32:
            return None
        return cls(model, lib)

    def forward_layers(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       meta: AttentionMetadata,
                       kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
        m = hidden.shape[0]
        if (not isinstance(meta, AttentionMetadata) or meta.prefills or not meta.decode_groups
                or m > MAX_ROWS or meta.num_decode_tokens != m or hidden.dtype != torch.float32):
            return None
        plan = self._plan(m, kv_caches)
        if plan is None:
            return None
        groups = [(as_int64(g.block_tables), as_int64(g.context_lens), g)
                  for g in meta.decode_groups]
        group_args = (GroupArgs * len(groups))()
        threads = attention_threads(self._model.shape.num_heads, kv_caches[0][0].shape[1],
                                    meta.decode_groups)
        for args, (tables, lens, g) in zip(group_args, groups, strict=True):
            n, width = tables.shape
            if n != g.end - g.start or lens.shape != (n,):
                return None
            args.block_tables, args.context_lens = tables.data_ptr(), lens.data_ptr()
            args.start, args.n, args.max_blocks = g.start, n, width
            args.threads = threads
        slots = meta.slot_mapping
        if slots.dtype is not torch.int64 or not slots.is_contiguous():
            return None
        hidden, cos, sin = hidden.contiguous(), cos.contiguous(), sin.contiguous()
        step = plan.step
        step.groups, step.num_groups = group_args, len(groups)
        step.hidden_in, step.cos, step.sin_signed = hidden.data_ptr(), cos.data_ptr(), sin.data_ptr()
        step.slots, step.window = slots.data_ptr(), meta.sliding_window
        step.linear_threads = torch.get_num_threads()
        self._lib.run(step)
        return plan.out

    def _plan(self, m: int, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> _Plan | None:
        cache_ptr = kv_caches[0][0].data_ptr()
        plan = self._plans.get(m, False)
        if plan is False or (plan is not None and plan.cache_ptr != cache_ptr):
            plan = self._plans[m] = self._make_plan(m, kv_caches)
        return plan

    def _make_plan(self, m: int, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                   ) -> _Plan | None:
        s = self._model.shape
        k_cache = kv_caches[0][0]
        shape = (k_cache.shape[0], k_cache.shape[1], s.num_kv_heads, s.head_dim)
        if any(k.dtype not in CACHE_DTYPES or v.dtype is not k.dtype or tuple(k.shape) != shape
               or v.shape != k.shape or not k.is_contiguous() or not v.is_contiguous()
               for k, v in kv_caches):
            return None
        norms = [t for layer in self._model.layers
                 for t in (layer.input_norm, layer.mlp_norm)]
        if any(t.dtype != torch.float32 or not t.is_contiguous() for t in norms):
            return None
        layers = (LayerArgs * s.num_layers)()
        work = 0
        for args, layer, (k, v) in zip(layers, self._model.layers, kv_caches, strict=True):
            linears = (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
            fields = (args.qkv, args.o, args.gate_up, args.down)
            for linear, field in zip(linears, fields, strict=True):
                need = _fill_linear(linear, m, field)
                if need is None:
                    return None
                work = max(work, need)
            args.input_norm = layer.input_norm.data_ptr()
            args.post_norm = layer.mlp_norm.data_ptr()
            args.k_cache, args.v_cache = k.data_ptr(), v.data_ptr()
        intermediate = layers[0].down.k
        if not _shapes_agree(layers, s, intermediate):
            return None
        buffers = self._reserve(m, work, intermediate)
        out = buffers.out[:m]
        step = StepArgs(
            layers=layers, out=out.data_ptr(), scratch=buffers.scratch.data_ptr(),
            linear_work=buffers.work_ptr, num_layers=s.num_layers, m=m, hidden=s.hidden_size,
            heads=s.num_heads, kv_heads=s.num_kv_heads, head_dim=s.head_dim,
            intermediate=intermediate, cache_dtype=CACHE_DTYPES[k_cache.dtype],
            num_blocks=shape[0], block_size=shape[1], eps=s.rms_norm_eps, scale=self._model.scale)
        return _Plan(step, layers, out, k_cache.data_ptr())

    def _reserve(self, m: int, work: int, intermediate: int) -> _Buffers:
        """Buffers for a step of m rows whose linears need `work` bytes; growing them drops
        the plans made so far, which point into the old ones."""
        old = self._buffers
        if old is not None and old.rows >= m and old.work_bytes >= work:
            return old
        rows, work = max(m, old.rows if old else 0), max(work, old.work_bytes if old else 0)
        s = self._model.shape
        self._plans.clear()
        self._buffers = None  # freed before the larger ones are made
        self._buffers = _Buffers(
            rows, work,
            torch.empty(self._lib.scratch_floats(rows, s.hidden_size, s.num_heads,
                                                 s.num_kv_heads, s.head_dim, intermediate)),
            torch.empty(work + 64, dtype=torch.uint8), torch.empty(rows, s.hidden_size))
        return self._buffers


def _fill_linear(linear: Linear, m: int, args: LinearArgs) -> int | None:
    """The linear's C kernel at m rows into args; its workspace bytes, or None if it has none."""
    c_kernel = getattr(linear.method, "c_kernel", None)
    kernel = c_kernel(m) if c_kernel is not None else None
    if kernel is None:
        return None
    bias = linear.bias
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        return None
    args.set(kernel.c_linear(m), None if bias is None else bias.data_ptr())
    return kernel.workspace_bytes(m)


def _shapes_agree(layers: ctypes.Array, s: ModelShape, intermediate: int) -> bool:
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    expected = ((q + 2 * kv, s.hidden_size), (s.hidden_size, q), (2 * intermediate, s.hidden_size),
                (s.hidden_size, intermediate))
    return all(((a.qkv.n, a.qkv.k), (a.o.n, a.o.k), (a.gate_up.n, a.gate_up.k),
                (a.down.n, a.down.k)) == expected for a in layers)
