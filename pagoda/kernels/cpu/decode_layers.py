"""A decode step's whole layer stack in one C call (`pg_decode_layers` in decode_ops.c).

The structures mirror the C ones field for field. The caller (pagoda/engine/models/native_decode.py)
fills the per-layer ones once per step size and only the per-step fields each step, so a step
costs one ctypes call where the eager path makes ~10 per layer.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

_ptr, _i32, _f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


Q4_KIND, Q8_KIND, PARTS_KIND = 0, 1, 2


@dataclass(slots=True, frozen=True)
class CLinear:
    """A linear's C kernel as pg_decode_layers calls it: q4_gemv's q4_linear16 / q4_linear
    (kind Q4_KIND: weight = the repacked records, format = their record format, as
    pagoda/kernels/cpu/q4_records.h defines it) or q8_gemv's (Q8_KIND: weight, scales, mins = the int8
    weight's tensors, format = its fp16-scales flag, or Q6_K blocks), or parts of those
    (PARTS_KIND, `parts_linear`).
    Addresses stay valid while the kernel that made this lives."""

    kind: int
    fn: int
    weight: int
    n: int
    k: int
    format: int = 0
    scales: int | None = None
    mins: int | None = None


class LinearArgs(ctypes.Structure):
    _fields_ = [("fn", _ptr), ("weight", _ptr), ("scales", _ptr), ("mins", _ptr),
                ("bias", _ptr), ("kind", _i32), ("format", _i32), ("n", _i32), ("k", _i32)]

    def set(self, linear: CLinear, bias: int | None) -> None:
        self.fn, self.weight, self.scales, self.mins = (linear.fn, linear.weight, linear.scales,
                                                        linear.mins)
        self.bias, self.kind, self.format = bias, linear.kind, linear.format
        self.n, self.k = linear.n, linear.k


def parts_linear(parts: list[CLinear]) -> tuple[CLinear, ctypes.Array]:
    """Linears of one input whose outputs side by side make one, as one CLinear (PARTS_KIND:
    weight = an array of the parts' arguments, format = their count), and that array, which
    must live as long as the CLinear is used."""
    array = (LinearArgs * len(parts))()
    for args, part in zip(array, parts, strict=True):
        args.set(part, None)
    linear = CLinear(PARTS_KIND, 0, ctypes.addressof(array), sum(p.n for p in parts), parts[0].k,
                     len(parts))
    return linear, array


SILU, GELU_TANH = 0, 1  # LayerArgs.activation
NO_ROPE = -1  # LayerArgs.rope of a layer that rotates nothing (NoPE)


class MoeArgs(ctypes.Structure):
    """A sparse MLP: the router (fp32 [num_experts, hidden] and bias [num_experts] or None;
    scoring SCORINGS' code), the routed experts (experts_fn: moe_experts.c's moe_forward,
    experts: its struct moe_layer, pagoda.kernels.cpu.moe_experts.CExperts), and whether the layer's
    gate_up and down are a shared expert (`shared`), gated by sigmoid(x . shared_gate) where
    that ([hidden] fp32) is not None."""

    _fields_ = [("router", _ptr), ("router_bias", _ptr), ("shared_gate", _ptr),
                ("experts_fn", _ptr), ("experts", _ptr), ("num_experts", _i32),
                ("top_k", _i32), ("scoring", _i32), ("renormalize", _i32),
                ("softmax_after_top_k", _i32), ("shared", _i32)]


class DeltaNetArgs(ctypes.Structure):
    """A Gated DeltaNet layer's decode rows (gated_delta_net.h's struct pg_delta_net): its conv
    weight [channels, kernel], exp(A_log) and dt_bias [v_heads], its norm's weight [v_dim], all
    fp32, and its state tables [num_slots, channels, kernel - 1] and [num_slots, v_heads,
    k_dim, v_dim]."""

    _fields_ = [("conv_weight", _ptr), ("decay_rate", _ptr), ("dt_bias", _ptr), ("norm", _ptr),
                ("conv_states", _ptr), ("delta_states", _ptr), ("num_slots", ctypes.c_int64),
                ("k_heads", _i32), ("v_heads", _i32), ("k_dim", _i32), ("v_dim", _i32),
                ("kernel", _i32), ("tiled", _i32), ("eps", _f32)]

    def scratch_floats(self) -> int:
        """A row's scratch: the convolved channels, then g and beta."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim + 2 * self.v_heads

    @property
    def in_width(self) -> int:
        """in_proj's output: the conv's channels, z, b and a."""
        return 2 * self.k_heads * self.k_dim + 2 * self.v_heads * self.v_dim + 2 * self.v_heads

    @property
    def value_width(self) -> int:
        return self.v_heads * self.v_dim


class ShortConvArgs(ctypes.Structure):
    """LFM2's short convolution's decode rows (short_conv.h's struct pg_short_conv): its taps
    [channels, kernel] and bias [channels] (None: none), fp32, and its state table
    [num_slots, channels, kernel - 1]."""

    _fields_ = [("weight", _ptr), ("bias", _ptr), ("states", _ptr),
                ("num_slots", ctypes.c_int64), ("channels", _i32), ("kernel", _i32)]


class Mamba2Args(ctypes.Structure):
    """A Mamba-2 layer's decode rows (mamba2.h's struct pg_mamba2): its conv taps [channels,
    kernel] and bias (None: none), A = -exp(A_log), D (None: none) and dt_bias [heads], its
    norm's weight [heads * head_dim], all fp32; its state tables [num_slots, channels,
    kernel - 1] and [num_slots, heads, head_dim, state_size]; dt clamped to [dt_min, dt_max]
    where dt_limited."""

    _fields_ = [("conv_weight", _ptr), ("conv_bias", _ptr), ("a", _ptr), ("d", _ptr),
                ("dt_bias", _ptr), ("norm", _ptr), ("conv_states", _ptr), ("ssm_states", _ptr),
                ("num_slots", ctypes.c_int64), ("heads", _i32), ("head_dim", _i32),
                ("state_size", _i32), ("groups", _i32), ("norm_groups", _i32), ("kernel", _i32),
                ("dt_limited", _i32), ("dt_min", _f32), ("dt_max", _f32), ("eps", _f32)]

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def channels(self) -> int:
        return self.inner + 2 * self.groups * self.state_size

    @property
    def in_width(self) -> int:
        """in_proj's output: z, the conv's channels, dt."""
        return self.inner + self.channels + self.heads

    def scratch_floats(self) -> int:
        """A row's scratch: the convolved channels, then dt."""
        return self.channels + self.heads


def mamba2_args(conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, a: torch.Tensor,
                d: torch.Tensor | None, dt_bias: torch.Tensor, norm: torch.Tensor,
                states: tuple[torch.Tensor, torch.Tensor], shape: tuple[int, int, int, int, int],
                dt_limits: tuple[float, float], eps: float) -> Mamba2Args | None:
    """A Mamba-2's arguments, shape = (heads, head_dim, state_size, groups, norm_groups); None
    where a tensor is not the fp32 contiguous shape the C code reads (the layer's torch path
    runs)."""
    conv_states, ssm_states = states
    h, head_dim, state_size, groups, norm_groups = shape
    inner = h * head_dim
    channels, kernel = inner + 2 * groups * state_size, conv_weight.shape[-1]
    num_slots = conv_states.shape[0]
    shapes = [(conv_weight, (channels, kernel)), (a, (h,)), (dt_bias, (h,)), (norm, (inner,)),
              (conv_states, (num_slots, channels, kernel - 1)),
              (ssm_states, (num_slots, h, head_dim, state_size))]
    shapes += [] if conv_bias is None else [(conv_bias, (channels,))]
    shapes += [] if d is None else [(d, (h,))]
    if any(t.dtype != torch.float32 or not t.is_contiguous() or tuple(t.shape) != want
           for t, want in shapes):
        return None
    low, high = dt_limits
    limited = low > 0.0 or high < float("inf")
    return Mamba2Args(
        conv_weight.data_ptr(), None if conv_bias is None else conv_bias.data_ptr(),
        a.data_ptr(), None if d is None else d.data_ptr(), dt_bias.data_ptr(), norm.data_ptr(),
        conv_states.data_ptr(), ssm_states.data_ptr(), num_slots, h, head_dim, state_size,
        groups, norm_groups, kernel, int(limited),
        low, high if limited else 0.0, eps)


def short_conv_args(weight: torch.Tensor, bias: torch.Tensor | None,
                    states: torch.Tensor) -> ShortConvArgs | None:
    """A short convolution's arguments; None where a tensor is not the fp32 contiguous shape
    the C code reads (the layer's torch path runs)."""
    channels, kernel = weight.shape
    shapes = [(weight, (channels, kernel)), (states, (states.shape[0], channels, kernel - 1))]
    shapes += [] if bias is None else [(bias, (channels,))]
    if any(t.dtype != torch.float32 or not t.is_contiguous() or tuple(t.shape) != shape
           for t, shape in shapes):
        return None
    return ShortConvArgs(weight.data_ptr(), None if bias is None else bias.data_ptr(),
                         states.data_ptr(), states.shape[0], channels, kernel)


def delta_net_args(conv_weight: torch.Tensor, decay_rate: torch.Tensor, dt_bias: torch.Tensor,
                   norm: torch.Tensor, conv_states: torch.Tensor, delta_states: torch.Tensor,
                   heads: tuple[int, int, int, int], tiled: bool,
                   eps: float) -> DeltaNetArgs | None:
    """A Gated DeltaNet's arguments, heads = (k_heads, v_heads, k_dim, v_dim); None where a
    tensor is not the fp32 contiguous shape the C code reads (the layer's torch path runs)."""
    k_heads, v_heads, k_dim, v_dim = heads
    channels, kernel = 2 * k_heads * k_dim + v_heads * v_dim, conv_weight.shape[-1]
    num_slots = conv_states.shape[0]
    shapes = ((conv_weight, (channels, kernel)), (decay_rate, (v_heads,)), (dt_bias, (v_heads,)),
              (norm, (v_dim,)), (conv_states, (num_slots, channels, kernel - 1)),
              (delta_states, (num_slots, v_heads, k_dim, v_dim)))
    if any(t.dtype != torch.float32 or not t.is_contiguous() or tuple(t.shape) != shape
           for t, shape in shapes):
        return None
    return DeltaNetArgs(
        conv_weight.data_ptr(), decay_rate.data_ptr(), dt_bias.data_ptr(), norm.data_ptr(),
        conv_states.data_ptr(), delta_states.data_ptr(), num_slots, k_heads, v_heads, k_dim,
        v_dim, kernel, int(tiled), eps)


class LayerArgs(ctypes.Structure):
    """One layer: its norms (q_norm, k_norm, attention_out_norm and mlp_out_norm None where it
    has none), linears and caches, its attention sinks (None: none); its sparse MLP (moe; None:
    a dense one); the window it attends (0: every key), the step's group set made for that
    window, its rotary table (an index into StepArgs.ropes, or NO_ROPE) rotating the first
    rotary_dim dims of each head, its MLP's activation, and whether qkv also gives the
    attention output's gate (output_gate). A recurrent layer (a Gated DeltaNet: delta_net not
    None; LFM2's short convolution: short_conv; a Mamba-2: mamba2) has its in_proj in qkv and
    its out_proj in o, and no attention fields."""

    _fields_ = [("input_norm", _ptr), ("post_norm", _ptr), ("q_norm", _ptr), ("k_norm", _ptr),
                ("attention_out_norm", _ptr), ("mlp_out_norm", _ptr), ("qkv", LinearArgs),
                ("o", LinearArgs), ("gate_up", LinearArgs), ("down", LinearArgs),
                ("k_cache", _ptr), ("v_cache", _ptr), ("sinks", _ptr),
                ("moe", ctypes.POINTER(MoeArgs)), ("delta_net", ctypes.POINTER(DeltaNetArgs)),
                ("short_conv", ctypes.POINTER(ShortConvArgs)),
                ("mamba2", ctypes.POINTER(Mamba2Args)), ("window", _i32), ("group_set", _i32),
                ("rope", _i32), ("rotary_dim", _i32), ("activation", _i32),
                ("output_gate", _i32), ("num_blocks", _i32)]


class RopeArgs(ctypes.Structure):
    """A rotary table's cos and signed sin at the step's positions, [m, its rotary_dim]."""

    _fields_ = [("cos", _ptr), ("sin_signed", _ptr)]


class GroupArgs(ctypes.Structure):
    """Decode rows [start, start + n): block tables [n, max_blocks] and context lengths [n],
    both int64, attended on `threads` threads. A step has one set of them per window its
    layers attend, set after set, each listing the same rows."""

    _fields_ = [("block_tables", _ptr), ("context_lens", _ptr), ("start", _i32), ("n", _i32),
                ("max_blocks", _i32), ("threads", _i32)]


class StepArgs(ctypes.Structure):
    """state_slots: [m] int64, each row's slot of the recurrent layers' states (None where the
    model has none); qkv_width: the widest first linear of a layer's mixer (q, k, v and a gate,
    or a Gated DeltaNet's in_proj); mixed_width: the widest input of o (or out_proj);
    recurrent_floats: the most scratch a recurrent layer takes per row; residual_scale: what
    each mixer's and MLP's output is multiplied by (Granite's residual multiplier; 1: none)."""

    _fields_ = [("layers", ctypes.POINTER(LayerArgs)), ("groups", ctypes.POINTER(GroupArgs)),
                ("ropes", ctypes.POINTER(RopeArgs)), ("hidden_in", _ptr), ("slots", _ptr),
                ("state_slots", _ptr), ("out", _ptr), ("scratch", _ptr), ("linear_work", _ptr),
                ("num_layers", _i32), ("num_groups", _i32), ("num_group_sets", _i32),
                ("num_ropes", _i32), ("m", _i32), ("hidden", _i32), ("heads", _i32),
                ("kv_heads", _i32), ("head_dim", _i32), ("intermediate", _i32),
                ("top_k", _i32), ("qkv_width", _i32), ("mixed_width", _i32),
                ("recurrent_floats", _i32), ("cache_dtype", _i32), ("block_size", _i32),
                ("linear_threads", _i32), ("eps", _f32), ("scale", _f32),
                ("residual_scale", _f32)]


class DecodeLayers:
    """The library's entry points for whole-stack decode steps."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._run = lib.pg_decode_layers
        self._run.argtypes, self._run.restype = [ctypes.POINTER(StepArgs)], _i32
        self._scratch = lib.pg_decode_scratch_floats
        self._scratch.argtypes = [_i32] * 10
        self._scratch.restype = ctypes.c_long

    def scratch_floats(self, m: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                       intermediate: int, top_k: int, qkv_width: int, mixed_width: int,
                       recurrent_floats: int) -> int:
        """intermediate: the widest MLP's (a dense layer's or a shared expert's); top_k: the
        most experts a sparse layer routes a row to (0: no layer is sparse); the rest as
        StepArgs has them."""
        return self._scratch(m, hidden, heads, kv_heads, head_dim, intermediate, top_k,
                             qkv_width, mixed_width, recurrent_floats)

    def run(self, step: StepArgs) -> None:
        rc = self._run(ctypes.byref(step))
        if rc:
            raise ValueError(f"pg_decode_layers refused its step (code {rc}): rows, groups or "
                             "a slot or context length outside the cache, or a linear failed")
