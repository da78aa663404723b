"""Quantized weights in the engine's own layouts, independent of device and kernel.

Loaders produce these (from GGUF blocks, or by quantizing float weights on load); a linear
method turns one into whatever its kernel wants (`pagoda.engine.quantization.methods`).

- `Int4Weight`: 4-bit values in groups along the input dimension, one scale and one min per
  group: w[n, k] = q[n, k] * scales[n, k // g] + mins[n, k // g], q in 0..15. GGUF's Q4_0, Q4_1
  and Q4_K all map onto it exactly with g = 32.
- `Int8Weight`: 8-bit values with one scale per output channel, w[n, k] = q[n, k] * scales[n],
  or per group of inputs, w[n, k] = q[n, k] * scales[n, k // g] (GGUF's Q8_0 exactly, g = 32),
  optionally with a min per group too: + mins[n, k // g].
- `BlockWeight`: GGUF rows as the file stores them, read in place by our CPU kernel (`cpu_q8`):
  `Q6KWeight` (six-bit values with an int8 scale per 16 and an fp16 scale per 256; 0.82 bytes a
  weight, where int8 in groups of 32 costs 1.125), `IQ4XSWeight` (4.25 bits), `Q5KWeight`
  (5.5 bits) and `Q3KWeight` (3.44 bits). Paths that cannot read them widen them to grouped
  int8 (`widen_blocks`: exactly for IQ4_XS, Q5_K and Q3_K, Q6_K's finer steps requantized).
- `GGUFRows`: a mixture-of-experts file's expert rows, any block type the expert kernel reads
  (Q4_K, Q4_0, Q8_0, MXFP4 and the BlockWeight types), a view of the file's memory map
  (pagoda/engine/quantization/expert_weights.py); paths other than that kernel take `decoded()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from pagoda.engine.quantization.gguf_block_ints import (
    iq4_xs_ints,
    mxfp4_ints,
    q3_k_ints,
    q4_0_ints,
    q4_k_ints,
    q5_k_ints,
    q8_0_ints,
)
from pagoda.kernels.cpu.huge_pages import huge_page_empty

INT4_GROUP_SIZE = 32
INT8_GROUP_SIZE = 32


@dataclass(slots=True)
class Int4Weight:
    """packed: uint8 [N, K // 2], element k = 2j in the low nibble of byte j, k = 2j + 1 in the
    high nibble. scales, mins: float32 [N, K // group_size], or float16 where that holds every
    value exactly (`with_compact_scales`); read them with .float()."""

    packed: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor
    group_size: int = INT4_GROUP_SIZE

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 2

    @property
    def nbytes(self) -> int:
        return _nbytes(self.packed, self.scales, self.mins)


@dataclass(slots=True)
class Int8Weight:
    """q: int8 [N, K]; scales: float32 [N], or [N, K // group_size] when group_size is set;
    mins: None (symmetric), or float32 [N, K // group_size]."""

    q: torch.Tensor
    scales: torch.Tensor
    group_size: int | None = None
    mins: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1]

    @property
    def nbytes(self) -> int:
        return _nbytes(self.q, self.scales, *([] if self.mins is None else [self.mins]))


Q6_K_SUPER_BLOCK = 256
Q6_K_BLOCK_BYTES = 210


@dataclass(slots=True)
class BlockWeight:
    """blocks: uint8 [N, K // 256 * BLOCK_BYTES], each 256 inputs of a row one super-block of
    the GGUF type TYPE_NAME (a subclass per type). Rows are whole blocks, so selecting rows is
    exact."""

    blocks: torch.Tensor
    TYPE_NAME: ClassVar[str]
    BLOCK_BYTES: ClassVar[int]

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape[0], self.blocks.shape[1] // self.BLOCK_BYTES * Q6_K_SUPER_BLOCK

    @property
    def nbytes(self) -> int:
        return _nbytes(self.blocks)


@dataclass(slots=True)
class Q6KWeight(BlockWeight):
    """ql [128] (low 4 bits), qh [64] (high 2 bits), int8 scales [16], fp16 d;
    w = d * sc[e // 16] * (q[e] - 32)."""

    TYPE_NAME: ClassVar[str] = "Q6_K"
    BLOCK_BYTES: ClassVar[int] = Q6_K_BLOCK_BYTES


@dataclass(slots=True)
class IQ4XSWeight(BlockWeight):
    """fp16 d, six-bit scales per 32, nibbles indexing 16 levels; w = d * (ls - 32) * level
    (pagoda/engine/quantization/gguf_block_ints.py)."""

    TYPE_NAME: ClassVar[str] = "IQ4_XS"
    BLOCK_BYTES: ClassVar[int] = 136


@dataclass(slots=True)
class Q5KWeight(BlockWeight):
    """fp16 d and dmin, six-bit scales and mins per 32, five-bit values;
    w = d * sc * q - dmin * m (pagoda/engine/quantization/gguf_block_ints.py)."""

    TYPE_NAME: ClassVar[str] = "Q5_K"
    BLOCK_BYTES: ClassVar[int] = 176


@dataclass(slots=True)
class Q3KWeight(BlockWeight):
    """third bits, 2-bit values, six-bit scales per 16, fp16 d; w = d * (sc - 32) * v, v in
    -4..3 (pagoda/engine/quantization/gguf_block_ints.py)."""

    TYPE_NAME: ClassVar[str] = "Q3_K"
    BLOCK_BYTES: ClassVar[int] = 110


# GGUF block types by name: (values a block, bytes a block).
GGUF_BLOCKS = {"Q4_0": (32, 18), "Q8_0": (32, 34), "MXFP4": (32, 17), "Q4_K": (256, 144),
               "Q5_K": (256, 176), "Q6_K": (256, 210), "IQ4_XS": (256, 136), "Q3_K": (256, 110)}
_BLOCK_WEIGHT_TYPES = {kind.TYPE_NAME: kind for kind in (Q6KWeight, IQ4XSWeight, Q5KWeight,
                                                            Q3KWeight)}


@dataclass(slots=True, frozen=True)
class GGUFRows:
    """A matrix's rows as a GGUF file stores them, blocks of `type_name` (a key of
    GGUF_BLOCKS), uint8 [N, K / values a block * bytes a block]: a mixture-of-experts layer's
    expert, read in place by pagoda/kernels/cpu/moe_experts.c. Every other path takes `decoded()`."""

    blocks: torch.Tensor
    type_name: str

    @property
    def shape(self) -> tuple[int, int]:
        values, size = GGUF_BLOCKS[self.type_name]
        return self.blocks.shape[0], self.blocks.shape[1] // size * values

    @property
    def nbytes(self) -> int:
        return _nbytes(self.blocks)

    def decoded(self) -> Int4Weight | Int8Weight | BlockWeight:
        """The same values in the engine's usual layout: the BlockWeight types as they are (a
        view, read in place by q8_gemv), Q4_K and Q4_0 as Int4Weight, Q8_0 and MXFP4 as grouped
        int8; each exactly (a copy for those four)."""
        kind = _BLOCK_WEIGHT_TYPES.get(self.type_name)
        if kind is not None:
            return kind(self.blocks)
        if self.type_name == "Q4_K":
            q, scales, mins = q4_k_ints(self.blocks)
            return Int4Weight(pack_int4(q), scales, mins)
        if self.type_name == "Q4_0":
            q, d = q4_0_ints(self.blocks)
            return Int4Weight(pack_int4(q), d, -8 * d)
        ints = q8_0_ints if self.type_name == "Q8_0" else mxfp4_ints
        return Int8Weight(*ints(self.blocks), INT8_GROUP_SIZE)


Weight = torch.Tensor | Int4Weight | Int8Weight | BlockWeight | GGUFRows
# One tensor's rows at an index: (tensor, 1-D int64 index) -> tensor.
TakeRows = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def weight_shape(weight: Weight) -> tuple[int, ...]:
    return tuple(weight.shape)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 values 0..15 [N, K] -> the packed [N, K // 2] layout."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The packed [N, K // 2] layout -> uint8 values 0..15 [N, K]."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).view(packed.shape[0], -1)


def with_compact_scales(weight: Int4Weight) -> Int4Weight:
    """The same weight with its scales and mins in float16 where that loses nothing: GGUF's
    Q4_0 and Q4_1 store them as fp16, so their float32 copies are twice what they hold."""
    scales, mins = _exact_half(weight.scales), _exact_half(weight.mins)
    return Int4Weight(weight.packed, scales, mins, weight.group_size)


@dataclass(slots=True, frozen=True)
class KQuantScales:
    """An Int4Weight's scales and mins as GGUF's Q4_K holds them: per super-block of 256 inputs
    an fp16 d and dmin [N, K // 256], per group of 32 a six-bit sc and m (uint8 [N, K // 32]):
    scale = d * sc and min = -(dmin * m), exact in float32."""

    d: torch.Tensor
    dmin: torch.Tensor
    sc: torch.Tensor
    m: torch.Tensor


K_QUANT_SUPER_BLOCK = 256


def k_quant_scales(weight: Int4Weight) -> KQuantScales | None:
    """The weight's scales and mins factored back into Q4_K's parts where that is exact, else
    None. llama.cpp's Q4_K quantizer maps each super-block's largest sub-scale (and largest
    sub-min) to 63 and stores d = that / 63 in fp16, so d is found as max / 63; every value is
    then checked to be exactly d times an integer 0..63 (a file quantized another way, or a
    weight quantized on load, is refused here and keeps its fp32 scales)."""
    n, k = weight.shape
    if weight.group_size != INT4_GROUP_SIZE or k % K_QUANT_SUPER_BLOCK:
        return None
    blocks = K_QUANT_SUPER_BLOCK // INT4_GROUP_SIZE
    d, sc = _six_bit_factors(weight.scales.float().reshape(n, -1, blocks))
    dmin, m = _six_bit_factors(-weight.mins.float().reshape(n, -1, blocks))
    if d is None or dmin is None:
        return None
    return KQuantScales(d, dmin, sc, m)


def _six_bit_factors(values: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """values [N, S, 8] = f * q, f fp16 per [N, S] (the row's largest / 63), q uint8 0..63:
    (f [N, S], q [N, S * 8]) where that holds exactly, else (None, None)."""
    f = (values.amax(-1, keepdim=True) / 63).half()
    wide = f.float()
    q = torch.round(values / torch.where(wide == 0, torch.ones_like(wide), wide))
    if not (torch.isfinite(wide).all() and torch.equal(wide * q, values)
            and q.min() >= 0 and q.max() <= 63):
        return None, None
    return f.squeeze(-1), q.to(torch.uint8).reshape(values.shape[0], -1)


def _exact_half(values: torch.Tensor) -> torch.Tensor:
    half = values.half()
    return half if torch.equal(half.float(), values.float()) else values


def dequantize(weight: Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if isinstance(weight, GGUFRows):
        weight = weight.decoded()
    if isinstance(weight, torch.Tensor):
        return weight.to(dtype)
    if isinstance(weight, Int8Weight):
        return _dequantize_int8(weight).to(dtype)
    if isinstance(weight, Q6KWeight):
        return _dequantize_q6_k(weight).to(dtype)
    if isinstance(weight, BlockWeight):
        return _dequantize_int8(widen_blocks(weight)).to(dtype)
    n, k = weight.shape
    groups = k // weight.group_size
    q = unpack_int4(weight.packed).view(n, groups, weight.group_size).float()
    w = torch.addcmul(weight.mins.float().unsqueeze(-1), q, weight.scales.float().unsqueeze(-1))
    return w.view(n, k).to(dtype)


def dequantize_rows(weight: Weight, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Only the gathered rows, dequantized: an embedding lookup on a quantized table."""
    if isinstance(weight, torch.Tensor):
        return torch.nn.functional.embedding(rows, weight).to(dtype)
    return dequantize(select_rows(weight, rows.reshape(-1)), dtype).view(*rows.shape, -1)


def _index_select(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return t.index_select(0, index)


def select_rows(weight: Weight, index: torch.Tensor, take: TakeRows = _index_select) -> Weight:
    """The output channels (rows) at index, in that order; exact for every layout. take picks
    one tensor's rows (the C kernel's copy on the calling thread, where it builds)."""
    if isinstance(weight, torch.Tensor):
        return take(weight, index)
    if isinstance(weight, BlockWeight):
        return type(weight)(take(weight.blocks, index))
    if isinstance(weight, GGUFRows):
        return GGUFRows(take(weight.blocks, index), weight.type_name)
    if isinstance(weight, Int8Weight):
        mins = None if weight.mins is None else take(weight.mins, index)
        return Int8Weight(take(weight.q, index), take(weight.scales, index), weight.group_size,
                          mins)
    return Int4Weight(take(weight.packed, index), take(weight.scales, index),
                      take(weight.mins, index), weight.group_size)


def _dequantize_q6_k(weight: Q6KWeight) -> torch.Tensor:
    """float32, the order of gguf's reference: (d * sc) * (q - 32)."""
    n, k = weight.shape
    b = weight.blocks.view(n, k // Q6_K_SUPER_BLOCK, Q6_K_BLOCK_BYTES)
    ql, qh = b[..., :128].view(n, -1, 2, 64).int(), b[..., 128:192].view(n, -1, 2, 32).int()
    shifts = torch.arange(4, device=b.device)
    low = (ql.unsqueeze(3) >> (4 * shifts[:2]).view(2, 1)) & 15  # [n, s, half, 2, 64]
    high = (qh.unsqueeze(3) >> (2 * shifts).view(4, 1)) & 3  # [n, s, half, 4, 32]
    q = (low.reshape(n, -1, 2, 4, 32) | (high << 4)) - 32
    sc = b[..., 192:208].contiguous().view(torch.int8).float()
    d = b[..., 208:210].contiguous().view(torch.float16).float()
    scale = (d * sc).view(n, -1, 16, 1)
    return (scale * q.float().view(n, -1, 16, 16)).view(n, k)


def widen_blocks(weight: BlockWeight) -> Int8Weight:
    """Grouped int8 (groups of 32) for the paths that cannot read GGUF blocks: IQ4_XS, Q5_K and
    Q3_K exactly (an integer times one factor a group, and Q5_K's min); Q6_K requantized
    (symmetric), whose steps are finer than its own, so the values barely move."""
    if isinstance(weight, IQ4XSWeight):
        return Int8Weight(*iq4_xs_ints(weight.blocks), INT8_GROUP_SIZE)
    if isinstance(weight, Q5KWeight):
        q, scales, mins = q5_k_ints(weight.blocks)
        return Int8Weight(q, scales, INT8_GROUP_SIZE, mins)
    if isinstance(weight, Q3KWeight):
        return Int8Weight(*q3_k_ints(weight.blocks), INT8_GROUP_SIZE)
    return quantize_int8(dequantize(weight), INT8_GROUP_SIZE)


def quantize_int8(w: torch.Tensor, group_size: int | None = None,
                  asymmetric: bool = False) -> Int8Weight:
    """Symmetric: scale = max |w| / 127 over each row, or over each group of a row.
    Asymmetric (groups only): 256 levels from each group's min to its max, which halves the
    step of a group whose values sit off zero."""
    n, k = w.shape
    if group_size is not None and k % group_size:
        raise ValueError(f"int8 groups of {group_size} need the input dimension ({k}) to be a "
                         "multiple of it")
    if asymmetric and group_size is None:
        raise ValueError("asymmetric int8 needs groups")
    groups = w.float().view(n, -1, group_size or k)
    if asymmetric:
        lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
        scales = ((hi - lo) / 255).clamp_min(1e-12)
        mins = lo + 128 * scales  # q = level - 128, so that q fits int8
        q = torch.round((groups - lo.unsqueeze(-1)) / scales.unsqueeze(-1)).clamp_(0, 255) - 128
        return Int8Weight(q.to(torch.int8).view(n, k), scales, group_size, mins)
    scales = groups.abs().amax(dim=-1).clamp_min(1e-12) / 127
    q = torch.round(groups / scales.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(q.view(n, k), scales if group_size else scales.view(n), group_size)


def split_int8_into_int4(weight: Int8Weight) -> Int4Weight:
    """Grouped int8 as two int4 halves stacked along the output dimension, [high; low], whose
    products add up to the int8 one: q + 128 = 16 h + l, so w = (16 s h - 120 s + m) + (s l - 8 s),
    m being the min (0 when symmetric).
    Each half is centred on zero, so adding their (bf16-rounded) outputs cancels little.
    Int4 kernels then compute grouped int8 exactly, reading the same bytes as int8 would."""
    assert weight.group_size is not None, "a per-channel int8 weight has no groups to split"
    shifted = weight.q.to(torch.int16) + 128
    high, low = (shifted >> 4).to(torch.uint8), (shifted & 15).to(torch.uint8)
    scales = weight.scales.float()
    offset = -120 * scales if weight.mins is None else weight.mins.float() - 120 * scales
    return Int4Weight(torch.cat([pack_int4(high), pack_int4(low)]),
                      torch.cat([16 * scales, scales]),
                      torch.cat([offset, -8 * scales]), weight.group_size)


def _dequantize_int8(weight: Int8Weight) -> torch.Tensor:
    n, k = weight.shape
    q = weight.q.float().view(n, -1, weight.group_size or k)
    scales = weight.scales.float().view(n, -1, 1)
    if weight.mins is None:
        return (q * scales).view(n, k)
    return torch.addcmul(weight.mins.float().view(n, -1, 1), q, scales).view(n, k)


def quantize_int4(w: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> Int4Weight:
    """Asymmetric min/max per group of group_size inputs (Q4_1's scheme)."""
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"int4 needs the input dimension ({k}) to be a multiple of {group_size}")
    groups = w.float().view(n, k // group_size, group_size)
    lo = groups.amin(dim=-1)
    hi = groups.amax(dim=-1)
    scales = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((groups - lo.unsqueeze(-1)) / scales.unsqueeze(-1)).clamp_(0, 15)
    return Int4Weight(pack_int4(q.view(n, k).to(torch.uint8)), scales, lo, group_size)


def concat(weights: list[Weight]) -> Weight:
    """Weights that share an input, stacked along the output dimension (fused QKV, gate/up).

    Parts of different layouts (a Q4_K_M file keeps some v projections in Q6_K) are brought to
    the one that keeps them all: GGUF blocks beside others (or another block type) are widened
    to grouped int8 first; float stays float when every part is float; int4 and grouped
    int8 parts of one group size become grouped int8 with mins, exactly (`_as_grouped_int8`);
    anything else is requantized to per-channel int8.
    """
    weights = [w.decoded() if isinstance(w, GGUFRows) else w for w in weights]
    kinds = {type(w) for w in weights}
    if len(kinds) == 1 and issubclass(*kinds, BlockWeight):
        return type(weights[0])(torch.cat([w.blocks for w in weights]))
    weights = [widen_blocks(w) if isinstance(w, BlockWeight) else w for w in weights]
    kinds = {type(w) for w in weights}
    if kinds == {torch.Tensor} or all(isinstance(w, torch.Tensor) for w in weights):
        return torch.cat(weights)
    if kinds == {Int8Weight} and len({(w.group_size, w.mins is None) for w in weights}) == 1:
        mins = None if weights[0].mins is None else torch.cat([w.mins for w in weights])
        return Int8Weight(_stacked_values([w.q for w in weights]),
                          torch.cat([w.scales for w in weights]), weights[0].group_size, mins)
    if kinds == {Int4Weight} and len({w.group_size for w in weights}) == 1:
        return Int4Weight(torch.cat([w.packed for w in weights]),
                          torch.cat([w.scales for w in weights]),
                          torch.cat([w.mins for w in weights]), weights[0].group_size)
    if _all_grouped(weights):
        parts = [_as_grouped_int8(w) for w in weights]
        return Int8Weight(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]),
                          weights[0].group_size, torch.cat([p.mins for p in parts]))
    return quantize_int8(torch.cat([dequantize(w) for w in weights]))


def _stacked_values(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(parts), in huge pages on the CPU (pagoda/kernels/cpu/huge_pages.py): a one-row step
    streams a fused projection's values from memory."""
    if parts[0].device.type != "cpu":
        return torch.cat(parts)
    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    return torch.cat(parts, out=huge_page_empty(shape, parts[0].dtype))


def _all_grouped(weights: list[Weight]) -> bool:
    grouped = all(isinstance(w, Int4Weight) or (isinstance(w, Int8Weight) and w.group_size)
                  for w in weights)
    return grouped and len({w.group_size for w in weights}) == 1


def _as_grouped_int8(weight: Int4Weight | Int8Weight) -> Int8Weight:
    """The same values as grouped int8 with mins, bit for bit: int4's q (0..15) fits int8 as
    it is, with its scales and mins; a symmetric int8 weight gets zero mins."""
    if isinstance(weight, Int4Weight):
        q = unpack_int4(weight.packed).to(torch.int8)
        return Int8Weight(q, weight.scales.float(), weight.group_size, weight.mins.float())
    scales = weight.scales.float()
    mins = torch.zeros_like(scales) if weight.mins is None else weight.mins.float()
    return Int8Weight(weight.q, scales, weight.group_size, mins)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
