"""Decode-only steps of a decoder model through one C call for the whole layer stack.

At one token per step the eager forward spends ~4 ms of a ~19 ms step (135M, this 2-core
machine) in the Python between its C kernels: ~10 calls per layer, 30 layers. Where every
linear of the model runs one of our C kernels at the step's size and the C decode ops are loaded,
`pg_decode_layers` (pagoda/kernels/cpu/decode_ops.c) runs the same operators in the same order, so the
hidden states are the eager path's bit for bit. Its layers may differ as the families' do: a
window per layer, several rotary tables or none (NoPE), partial rotary, per-head q/k norms,
sandwich norms, SiLU or GeGLU, attention sinks, and sparse MLPs (mixtures of experts) beside
dense ones: the router dotted in C (the eager CPU path calls the same C router), the routed
experts through moe_experts.c's own entry point, a gated shared expert; and the hybrid
families' layers: Qwen3.5's and Qwen3-Next's Gated DeltaNets (gated_delta_net.h, the function
the eager layer calls for a step of decodes, each row's states at its slot advanced in place)
and gated attention, LFM2's short convolutions (short_conv.h, likewise) and Granite 4's Mamba-2
layers (mamba2.h, likewise). Anything else (prefill, bf16 activations, a linear on PyTorch's
kernel or a GEMM, experts moe_experts does not serve, a quantized router, a layer the call does
not run: `not_covered`) stays eager.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import torch

from pagoda.engine.layers.gated_delta_net import GatedDeltaNet
from pagoda.engine.layers.mamba2 import Mamba2Mixer
from pagoda.engine.layers.mlp import GatedMLP
from pagoda.engine.layers.moe import SparseMoE, float_weight
from pagoda.engine.layers.short_conv import ShortConv
from pagoda.kernels.attention_metadata import AttentionMetadata, DecodeGroup
from pagoda.kernels.cpu.decode_layers import (
    GELU_TANH,
    NO_ROPE,
    SILU,
    DecodeLayers,
    DeltaNetArgs,
    GroupArgs,
    LayerArgs,
    LinearArgs,
    Mamba2Args,
    MoeArgs,
    RopeArgs,
    ShortConvArgs,
    StepArgs,
    delta_net_args,
    mamba2_args,
    short_conv_args,
)
from pagoda.kernels.cpu.decode_ops import CACHE_DTYPES, SCORINGS, as_int64, attention_threads

if TYPE_CHECKING:
    from pagoda.engine.layers.attention import Attention, StepRotary
    from pagoda.engine.layers.linear import Linear
    from pagoda.engine.layers.recurrent_mixer import RecurrentMixer
    from pagoda.engine.layers.rotary import RotaryTables
    from pagoda.engine.models.architecture import DecoderArchitecture, ModelShape
    from pagoda.kernels.kernel_ops import KernelOps
    from pagoda.kernels.recurrent_metadata import RecurrentMetadata

logger = logging.getLogger(__name__)
# Decode batches of up to this many rows run in one call (where every linear has a C kernel at
# their size); larger ones, which only a server with a raised max_num_seqs makes, stay eager.
# Up to 8 rows until 2026-12-02: running 9-32 rows in one call too took 32 streams of the
# default model from a median 409 to 434 tok/s (one process, alternating rounds).
MAX_ROWS = 256
_ACTIVATIONS = {"silu": SILU, "gelu_tanh": GELU_TANH}


class DecodedLayer(Protocol):
    """What the call reads of a layer: decoder.DecoderLayer's, named here since the decoder
    imports this module (its type would make a circle)."""

    @property
    def input_norm(self) -> torch.Tensor: ...
    @property
    def attention(self) -> Attention | None: ...
    @property
    def mixer(self) -> RecurrentMixer | None: ...
    @property
    def mlp_norm(self) -> torch.Tensor: ...
    @property
    def mlp(self) -> GatedMLP | SparseMoE: ...
    @property
    def attention_out_norm(self) -> torch.Tensor | None: ...
    @property
    def mlp_out_norm(self) -> torch.Tensor | None: ...
    @property
    def qkv_proj(self) -> Linear: ...
    @property
    def o_proj(self) -> Linear: ...


class RecurrentStep(Protocol):
    """What the call reads of a step's recurrent inputs: decoder.RecurrentStep's, named here
    as the layer's."""

    @property
    def meta(self) -> RecurrentMetadata: ...
    @property
    def states(self) -> list[tuple[torch.Tensor, ...] | None]: ...


class DecodedModel(Protocol):
    """What the call reads of the model: decoder.DecoderForCausalLM's, named here as the
    layer's."""

    @property
    def arch(self) -> DecoderArchitecture: ...
    @property
    def shape(self) -> ModelShape: ...
    @property
    def ops(self) -> KernelOps: ...
    @property
    def norm(self) -> torch.Tensor: ...
    @property
    def layers(self) -> Sequence[DecodedLayer]: ...
    @property
    def rotary(self) -> Mapping[str, RotaryTables]: ...
    @property
    def scale(self) -> float: ...
    @property
    def residual_scale(self) -> float | None: ...


def not_covered(arch: DecoderArchitecture) -> str | None:
    """What of this architecture's layers the one-call step does not run (the load log says
    it), or None where it runs them all."""
    if arch.attention_softcap is not None:
        return "attention logit softcapping"
    if (arch.names.q_norm is None) != (arch.names.k_norm is None):
        return "a query norm without a key norm, or the reverse"
    if arch.activation not in _ACTIVATIONS:
        return f"the activation {arch.activation!r}"
    gemma4 = [what for what, present in (
        ("layers of their own head size or KV heads", bool(arch.shape.layer_heads)),
        ("values taken from the keys' projection",
         any(getattr(kind, "values_from_keys", False) for kind in arch.layers)),
        ("value norms", arch.value_norm),
        ("layer output scalars", arch.names.layer_scalar is not None),
        ("per-layer embeddings", bool(arch.per_layer_input)),
        ("layers reading another layer's KV cache", bool(arch.shape.layer_kv_from))) if present]
    return ", ".join(gemma4) or None


@dataclass(slots=True)
class _Plan:
    """What steps of one row count reuse: the layer arguments, pointing into the buffers."""

    step: StepArgs
    layers: ctypes.Array
    ropes: ctypes.Array
    out: torch.Tensor
    tables: tuple[int, ...]  # where the KV caches and the recurrent states it points into are
    moes: list[MoeArgs]  # what the sparse layers' arguments point to
    nets: list[_RecurrentArgs]  # what the recurrent layers' arguments point to


_RecurrentArgs = DeltaNetArgs | ShortConvArgs | Mamba2Args


@dataclass(slots=True, frozen=True)
class _Widths:
    """The step's widest mixer input (q/k/v and gate, or in_proj's output), widest input of o
    (or out_proj), and the most scratch floats a recurrent layer takes per row."""

    qkv: int
    mixed: int
    recurrent: int


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

    def __init__(self, model: DecodedModel, lib: DecodeLayers) -> None:
        self._model = model
        self._lib = lib
        self._plans: dict[int, _Plan | None] = {}
        self._buffers: _Buffers | None = None
        # The step's group sets, one per window the layers attend, and its rotary tables, in
        # the order the layers' indices into them count.
        self._windows = sorted({layer.attention.window for layer in model.layers
                                if layer.attention is not None})
        self._rope_keys = list(model.rotary)
        self._recurrent = model.arch.has_recurrent_layers

    @classmethod
    def build(cls, model: DecodedModel) -> NativeDecode | None:
        lib = model.ops.decode_layers
        if (not isinstance(lib, DecodeLayers) or model.norm.dtype != torch.float32
                or not_covered(model.arch) is not None):
            return None
        sparse = next((why for layer in model.layers if (why := _sparse_not_covered(layer))),
                      None)
        if sparse is not None:
            logger.info("%s: decode steps run layer by layer (the one-call C decode step does "
                        "not run %s)", model.arch.family, sparse)
            return None
        return cls(model, lib)

    def forward_layers(self, hidden: torch.Tensor, rotary: StepRotary, meta: AttentionMetadata,
                       kv_caches: list[tuple[torch.Tensor, torch.Tensor] | None],
                       recurrent: RecurrentStep | None = None) -> torch.Tensor | None:
        """recurrent: the step's state slots and each layer's states, where the model has
        recurrent layers."""
        m = hidden.shape[0]
        if (not isinstance(meta, AttentionMetadata) or meta.prefills or not meta.decode_groups
                or m > MAX_ROWS or meta.num_decode_tokens != m or hidden.dtype != torch.float32):
            return None
        state_slots = self._state_slots(m, recurrent)
        if state_slots is False:
            return None
        plan = self._plan(m, kv_caches, None if recurrent is None else recurrent.states)
        if plan is None:
            return None
        block_size = next(kv for kv in kv_caches if kv is not None)[0].shape[1]
        metas = [meta.for_window(window) for window in self._windows]
        group_sets = [m.decode_groups for m in metas]
        kept: list[torch.Tensor] = []  # what the call reads, alive until it returns
        group_args = _group_args(group_sets, self._model.shape.num_heads, block_size, kept)
        # Each window's slots: its layers' KV cache group (pagoda.engine.core.kv_cache_manager).
        slots = [m.slot_mapping for m in metas]
        if group_args is None or any(t.dtype is not torch.int64 or not t.is_contiguous()
                                     for t in slots):
            return None
        slot_ptrs = (ctypes.c_void_p * len(slots))(*(t.data_ptr() for t in slots))
        for args, key in zip(plan.ropes, self._rope_keys):
            cos, sin = (t.contiguous() for t in rotary[key])
            if cos.numel() != m * self._model.rotary[key].rotary_dim or sin.shape != cos.shape:
                return None
            args.cos, args.sin_signed = cos.data_ptr(), sin.data_ptr()
            kept += (cos, sin)
        hidden = hidden.contiguous()
        step = plan.step
        step.groups, step.num_groups = group_args, len(group_sets[0])
        step.num_group_sets = len(group_sets)
        step.hidden_in, step.slots = hidden.data_ptr(), ctypes.addressof(slot_ptrs)
        step.state_slots = state_slots
        step.linear_threads = torch.get_num_threads()
        self._lib.run(step)
        return plan.out

    def _state_slots(self, m: int,
                     recurrent: RecurrentStep | None) -> int | None | Literal[False]:
        """The address of the step's m state slots (None: the model has no recurrent layers),
        or False where the step's recurrent inputs are not m decodes the call can read."""
        if not self._recurrent:
            return None
        if recurrent is None:
            return False
        rows = recurrent.meta
        slots = rows.decode_slots
        if (rows.prefills or rows.num_decodes != m or slots.dtype is not torch.int64
                or not slots.is_contiguous() or slots.shape != (m,)):
            return False
        return slots.data_ptr()

    def _plan(self, m: int, kv_caches: list[tuple[torch.Tensor, torch.Tensor] | None],
              states: list[tuple[torch.Tensor, ...] | None] | None) -> _Plan | None:
        plan = self._plans.get(m, False)
        if plan is False or (plan is not None and plan.tables != _tables(kv_caches, states)):
            plan = self._plans[m] = self._make_plan(m, kv_caches, states)
        return plan

    def _make_plan(self, m: int, kv_caches: list[tuple[torch.Tensor, torch.Tensor] | None],
                   states: list[tuple[torch.Tensor, ...] | None] | None = None,
                   ) -> _Plan | None:
        s = self._model.shape
        caches = [kv for kv in kv_caches if kv is not None]
        if not caches:
            return None
        k_cache = caches[0][0]
        # Blocks per layer may differ: a windowed layer's pool is its KV cache group's.
        shape = (k_cache.shape[1], s.num_kv_heads, s.head_dim)
        if any(k.dtype is not k_cache.dtype or k.dtype not in CACHE_DTYPES or v.dtype is not k.dtype
               or tuple(k.shape[1:]) != shape or v.shape != k.shape or not k.is_contiguous()
               or not v.is_contiguous() for k, v in caches):
            return None
        if any(t.cos.dtype != torch.float32 for t in self._model.rotary.values()):
            return None
        layers = (LayerArgs * s.num_layers)()
        moes: list[MoeArgs] = []
        nets: list[_RecurrentArgs] = []
        work = 0
        for i, (args, layer, kv) in enumerate(zip(layers, self._model.layers, kv_caches,
                                                  strict=True)):
            linears = self._mixer_linears(layer, args, None if states is None else states[i],
                                          nets)
            if linears is None:
                return None
            mlp = _dense_part(layer)
            if mlp is not None:
                linears += [(mlp.gate_up_proj, args.gate_up), (mlp.down_proj, args.down)]
            for linear, field in linears:
                need = _fill_linear(linear, m, field)
                if need is None:
                    return None
                work = max(work, need)
            if isinstance(layer.mlp, SparseMoE):
                need = _fill_moe(layer.mlp, m, s.hidden_size, args, moes)
                if need is None:
                    return None
                work = max(work, need)
            if not self._fill_layer(layer, args):
                return None
            if kv is not None:
                k, v = kv
                args.k_cache, args.v_cache, args.num_blocks = (k.data_ptr(), v.data_ptr(),
                                                               k.shape[0])
        intermediate = max(args.down.k for args in layers)
        top_k = max((moe.top_k for moe in moes), default=0)
        if not _shapes_agree(layers, s):
            return None
        widths = _Widths(qkv=max(args.qkv.n for args in layers),
                         mixed=max(args.o.k for args in layers),
                         recurrent=max((_recurrent_floats(net) for net in nets), default=0))
        buffers = self._reserve(m, work, intermediate, top_k, widths)
        out = buffers.out[:m]
        ropes = (RopeArgs * max(len(self._rope_keys), 1))()
        step = StepArgs(
            layers=layers, ropes=ropes, out=out.data_ptr(), scratch=buffers.scratch.data_ptr(),
            linear_work=buffers.work_ptr, num_layers=s.num_layers,
            num_ropes=len(self._rope_keys), m=m, hidden=s.hidden_size, heads=s.num_heads,
            kv_heads=s.num_kv_heads, head_dim=s.head_dim, intermediate=intermediate,
            top_k=top_k, qkv_width=widths.qkv, mixed_width=widths.mixed,
            recurrent_floats=widths.recurrent, cache_dtype=CACHE_DTYPES[k_cache.dtype],
            block_size=shape[0], eps=s.rms_norm_eps, scale=self._model.scale,
            residual_scale=1.0 if self._model.residual_scale is None
            else self._model.residual_scale)
        return _Plan(step, layers, ropes, out, _tables(kv_caches, states), moes, nets)

    @staticmethod
    def _mixer_linears(layer: DecodedLayer, args: LayerArgs,
                       states: tuple[torch.Tensor, ...] | None,
                       nets: list[_RecurrentArgs],
                       ) -> list[tuple[Linear, LinearArgs]] | None:
        """The layer's mixer's two linears and the fields they fill: q/k/v (and gate) and o, or
        a recurrent mixer's in_proj and out_proj, its arguments (on its states) into args and
        nets; None where the call does not run the mixer."""
        mixer = layer.mixer
        if mixer is None:
            return [(layer.qkv_proj, args.qkv), (layer.o_proj, args.o)]
        if states is None:
            return None
        net = _recurrent_args(mixer, states)
        if net is None:
            return None
        nets.append(net)
        field = {ShortConvArgs: "short_conv", DeltaNetArgs: "delta_net", Mamba2Args: "mamba2"}
        setattr(args, field[type(net)], ctypes.pointer(net))
        return [(mixer.in_proj, args.qkv), (mixer.out_proj, args.o)]

    def _fill_layer(self, layer: DecodedLayer, args: LayerArgs) -> bool:
        """The layer's norms, and its attention's window, rotary table and gate, and its
        activation into args; False where the call cannot run it as the eager path does."""
        s = self._model.shape
        norms = {"input_norm": (layer.input_norm, s.hidden_size),
                 "post_norm": (layer.mlp_norm, s.hidden_size),
                 "attention_out_norm": (layer.attention_out_norm, s.hidden_size),
                 "mlp_out_norm": (layer.mlp_out_norm, s.hidden_size)}
        if layer.attention is not None:
            norms |= {"q_norm": (layer.attention.q_norm, s.head_dim),
                      "k_norm": (layer.attention.k_norm, s.head_dim)}
        for name, (norm, width) in norms.items():
            if norm is not None and (norm.dtype != torch.float32 or not norm.is_contiguous()
                                     or norm.shape != (width,)):
                return False
            setattr(args, name, None if norm is None else norm.data_ptr())
        if layer.attention is not None and not self._fill_attention(layer.attention, args):
            return False
        mlp = _dense_part(layer)
        activation = SILU if mlp is None else _ACTIVATIONS.get(mlp.activation)
        if activation is None:
            return False
        args.activation = activation
        return True

    def _fill_attention(self, attention: Attention, args: LayerArgs) -> bool:
        """The attention's sinks, window, rotary table and output gate into args."""
        s = self._model.shape
        if (attention.q_norm is None) != (attention.k_norm is None):
            return False
        sinks = attention.sinks
        if sinks is not None and (sinks.dtype != torch.float32 or not sinks.is_contiguous()
                                  or sinks.shape != (s.num_heads,)):
            return False
        args.sinks = None if sinks is None else sinks.data_ptr()
        args.window, args.group_set = attention.window, self._windows.index(attention.window)
        if attention.rope is None:
            args.rope, args.rotary_dim = NO_ROPE, 0
        else:
            args.rope = self._rope_keys.index(attention.rope)
            args.rotary_dim = self._model.rotary[attention.rope].rotary_dim
        args.output_gate = attention.output_gate
        return True

    def _reserve(self, m: int, work: int, intermediate: int, top_k: int,
                 widths: _Widths) -> _Buffers:
        """Buffers for a step of m rows whose linears and experts need `work` bytes; growing
        them drops the plans made so far, which point into the old ones."""
        s = self._model.shape
        floats = self._lib.scratch_floats(m, s.hidden_size, s.num_heads, s.num_kv_heads,
                                          s.head_dim, intermediate, top_k, widths.qkv,
                                          widths.mixed, widths.recurrent)
        old = self._buffers
        if (old is not None and old.rows >= m and old.work_bytes >= work
                and old.scratch.numel() >= floats):
            return old
        rows, work = max(m, old.rows if old else 0), max(work, old.work_bytes if old else 0)
        floats = max(floats, old.scratch.numel() if old else 0)
        self._plans.clear()
        self._buffers = None  # freed before the larger ones are made
        self._buffers = _Buffers(rows, work, torch.empty(floats),
                                 torch.empty(work + 64, dtype=torch.uint8),
                                 torch.empty(rows, s.hidden_size))
        return self._buffers


def _tables(kv_caches: list[tuple[torch.Tensor, torch.Tensor] | None],
            states: list[tuple[torch.Tensor, ...] | None] | None) -> tuple[int, ...]:
    """Where the KV caches and recurrent states are: a plan points into them."""
    return tuple(t.data_ptr() for pair in [*kv_caches, *(states or ())] if pair is not None
                 for t in pair)


def _recurrent_args(mixer: RecurrentMixer, states: tuple[torch.Tensor, ...],
                    ) -> _RecurrentArgs | None:
    """The C arguments of a recurrent mixer on its states, or None where the call does not run
    it (a mixer of another kind, tensors not fp32 contiguous)."""
    if isinstance(mixer, ShortConv):
        return short_conv_args(mixer.weight, mixer.bias, *states)
    if isinstance(mixer, GatedDeltaNet):
        s = mixer.shape
        return delta_net_args(mixer.conv_weight, mixer.decay_rate, mixer.dt_bias,
                              mixer.norm_weight, *states,
                              (s.num_k_heads, s.num_v_heads, s.k_dim, s.v_dim), s.tiled,
                              mixer.eps)
    if isinstance(mixer, Mamba2Mixer):
        c, ssm = mixer.config, mixer.ssm
        return mamba2_args(mixer.conv_weight, mixer.conv_bias, ssm.A, ssm.D, ssm.dt_bias,
                           mixer.norm_weight, states,
                           (c.num_heads, c.head_dim, c.state_size, c.n_groups,
                            c.norm_groups or c.n_groups), (ssm.dt_min, ssm.dt_max), c.eps)
    return None


def _recurrent_floats(net: _RecurrentArgs) -> int:
    """The scratch a recurrent layer takes per row: a short convolution's B * x, or the Gated
    DeltaNet's or Mamba-2's."""
    return net.channels if isinstance(net, ShortConvArgs) else net.scratch_floats()


def _dense_part(layer: DecodedLayer) -> GatedMLP | None:
    """The gated MLP the call runs through the layer's gate_up and down: a dense layer's, or a
    sparse one's shared expert (None: it has none)."""
    return layer.mlp.shared if isinstance(layer.mlp, SparseMoE) else layer.mlp


def _sparse_not_covered(layer: DecodedLayer) -> str | None:
    """What of this layer's sparse MLP the one-call step does not run, or None."""
    moe = layer.mlp
    if not isinstance(moe, SparseMoE):
        return None
    if getattr(moe.experts, "c_experts", None) is None:
        return "experts that moe_experts does not read (a folder's float experts, other types)"
    if float_weight(moe.router.gate) is None:
        return "a quantized router"
    if moe.shared_gate is not None and (float_weight(moe.shared_gate) is None
                                        or moe.shared_gate.bias is not None):
        return "a quantized or biased shared expert gate"
    return None


def _fill_moe(moe: SparseMoE, m: int, hidden: int, args: LayerArgs,
              kept: list[MoeArgs]) -> int | None:
    """The sparse MLP's arguments at m rows into args (kept alive in kept); the experts'
    workspace bytes, or None where the call cannot run it as the eager path does."""
    router = moe.router
    weight, bias = float_weight(router.gate), router.gate.bias
    experts = moe.experts.c_experts(m, router.top_k)
    num_experts = weight.shape[0]
    if (experts is None or weight.dtype != torch.float32 or weight.shape != (num_experts, hidden)
            or not weight.is_contiguous() or router.scoring not in SCORINGS
            or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()
                                      or bias.shape != (num_experts,)))):
        return None
    gate = None if moe.shared_gate is None else float_weight(moe.shared_gate)
    if gate is not None and (gate.dtype != torch.float32 or gate.shape != (1, hidden)
                             or not gate.is_contiguous()):
        return None
    args_moe = MoeArgs(
        router=weight.data_ptr(), router_bias=None if bias is None else bias.data_ptr(),
        shared_gate=None if gate is None else gate.data_ptr(), experts_fn=experts.fn,
        experts=experts.layer, num_experts=num_experts, top_k=router.top_k,
        scoring=SCORINGS[router.scoring], renormalize=router.renormalize,
        softmax_after_top_k=router.softmax_after_top_k, shared=moe.shared is not None)
    kept.append(args_moe)
    args.moe = ctypes.pointer(args_moe)
    return experts.workspace_bytes


def _group_args(group_sets: list[list[DecodeGroup]], heads: int, block_size: int,
                kept: list[torch.Tensor]) -> ctypes.Array | None:
    """Each window's decode groups, set after set (the tensors they point to added to kept),
    or None where the sets do not list the same rows or a group's tables and lengths
    disagree."""
    spans = [(g.start, g.end) for g in group_sets[0]]
    args = (GroupArgs * (len(group_sets) * len(spans)))()
    at = 0
    for groups in group_sets:
        if [(g.start, g.end) for g in groups] != spans:
            return None
        threads = attention_threads(heads, block_size, groups)
        for g in groups:
            tables, lens = as_int64(g.block_tables), as_int64(g.context_lens)
            kept += (tables, lens)
            n, width = tables.shape
            if n != g.end - g.start or lens.shape != (n,):
                return None
            group = args[at]
            group.block_tables, group.context_lens = tables.data_ptr(), lens.data_ptr()
            group.start, group.n, group.max_blocks, group.threads = g.start, n, width, threads
            at += 1
    return args


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


def _shapes_agree(layers: ctypes.Array, s: ModelShape) -> bool:
    """Every layer's q/k/v (and gate) and o of the model's heads, or its Gated DeltaNet's
    in_proj and out_proj of its widths; its gated MLP (a dense one or a shared expert) of some
    width of its own, or (a sparse layer without a shared expert) none."""
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim

    def mixer_agrees(a: LayerArgs) -> bool:
        if a.delta_net:
            net = a.delta_net.contents
            linears = ((net.in_width, s.hidden_size), (s.hidden_size, net.value_width))
        elif a.short_conv:
            channels = a.short_conv.contents.channels
            linears = ((3 * channels, s.hidden_size), (s.hidden_size, channels))
        elif a.mamba2:
            mamba = a.mamba2.contents
            linears = ((mamba.in_width, s.hidden_size), (s.hidden_size, mamba.inner))
        else:
            linears = ((q + 2 * kv + (q if a.output_gate else 0), s.hidden_size),
                       (s.hidden_size, q))
        return ((a.qkv.n, a.qkv.k), (a.o.n, a.o.k)) == linears

    def mlp_agrees(a: LayerArgs) -> bool:
        width = a.down.k
        if not width:
            return bool(a.moe) and not a.moe.contents.shared and a.gate_up.n == 0
        return (a.gate_up.n, a.gate_up.k, a.down.n) == (2 * width, s.hidden_size, s.hidden_size)

    return all(mixer_agrees(a) and mlp_agrees(a) for a in layers)
