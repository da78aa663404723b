"""GGUF block types the engine has no kernel for, decoded on every block at once.

Q2_K, Q3_K, Q5_0/1/K, IQ4_NL, IQ4_XS, MXFP4, IQ1_S/M and IQ2/IQ3 blocks are decoded here and,
under "auto", widened to int8 in groups of 32 (`widen_to_int8`). Most of them are small
integers times one factor per 32 values (`GroupedInts`), which int8 holds exactly; the others
(Q2_K, IQ2_XS, IQ2_S, IQ1_M: two factors, or a min, per 32 values) are requantized, whose 127
levels a group are finer than any of their own steps. gguf-py's `gguf.quants.dequantize` is
the reference the tests hold the float values to, bit for bit (this is as fast as it, or up to
4x faster on the IQ types).

Every decoder takes a tensor's blocks [n, bytes a block] and gives [n, values a block] (or
their GroupedInts), doing each product in float32 in the order ggml does (d times a sub-block
scale, then times the value), so the results are ggml's to the bit. The IQ types' codebooks
(the values a grid index stands for) are data: they are read from the installed gguf-py, once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QType

from pagoda.engine.quantization.tensors import INT8_GROUP_SIZE, Int8Weight, quantize_int8

logger = logging.getLogger(__name__)

# Values decoded at once while widening: bounds the temporary arrays of one tensor (a float32
# copy of a slice is 64 MB).
_WIDEN_SLICE_VALUES = 1 << 24
_F32 = np.float32
_GROUP = INT8_GROUP_SIZE
QK_K = 256  # values in a K-quant or IQ super-block


@dataclass(slots=True)
class GroupedInts:
    """Values as q * scale (+ min), one scale (and min) per 32 consecutive values."""

    q: np.ndarray  # int8 [n, 32 g]
    scales: np.ndarray  # float32 [n, g]
    mins: np.ndarray | None = None  # float32 [n, g]

    def values(self) -> np.ndarray:
        values = _per_sub_block(self.scales, self.q.astype(_F32))
        if self.mins is None:
            return values
        return values + np.repeat(self.mins, _GROUP, axis=1)


def dequantize_rows(data: np.ndarray, kind: QType) -> np.ndarray:
    """A tensor's raw data (rows of whole blocks, as GGUFReader gives them) -> float32 values,
    [rows, values a row] (a 1-D tensor: [values])."""
    raw = np.asarray(data)
    blocks = _blocks(raw, kind)
    if kind in _GROUPED:
        values = _GROUPED[kind](blocks).values()
    else:
        values = _DECODERS[kind](blocks)
    return values.reshape(-1) if raw.ndim == 1 else values.reshape(raw.shape[0], -1)


def _blocks(raw: np.ndarray, kind: QType) -> np.ndarray:
    _, type_size = gguf.GGML_QUANT_SIZES[kind]
    return raw.reshape(-1, type_size)


def widen_to_int8(data: np.ndarray, kind: QType) -> Int8Weight:
    """A matrix's raw rows -> Int8Weight in groups of 32: exactly where the type has GroupedInts,
    else requantized. A slice of rows at a time, so that a large table's decoding never needs
    more than a slice's worth of temporary arrays."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    rows_per_slice = max(1, _WIDEN_SLICE_VALUES // (data.shape[1] // type_size * block_size))
    parts = [_widened_slice(data[start:start + rows_per_slice], kind)
             for start in range(0, data.shape[0], rows_per_slice)]
    if len(parts) == 1:
        return parts[0]
    mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts])
    return Int8Weight(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]),
                      _GROUP, mins)


def _widened_slice(data: np.ndarray, kind: QType) -> Int8Weight:
    if kind not in _EXACT_INT8:
        return quantize_int8(torch.from_numpy(dequantize_rows(data, kind)), _GROUP)
    rows = data.shape[0]
    grouped = _EXACT_INT8[kind](_blocks(np.asarray(data), kind))
    mins = None if grouped.mins is None else torch.from_numpy(grouped.mins.reshape(rows, -1))
    return Int8Weight(torch.from_numpy(grouped.q.reshape(rows, -1)),
                      torch.from_numpy(grouped.scales.reshape(rows, -1)), _GROUP, mins)


def log_widened_types(kinds: Iterable[QType]) -> None:
    """Once per type a file holds: which of its types run widened, not at their own width."""
    for kind in sorted(set(kinds) & DECODED_TYPES):
        logger.info("%s: no native kernel yet, widened to int8 at load", kind.name)


# Fields of a block


def fp16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 at byte offset of every block, as float32 (blocks [..., bytes] -> [...])."""
    raw = np.ascontiguousarray(blocks[..., offset:offset + 2])
    return raw.view(np.float16)[..., 0].astype(_F32)


def _words(blocks: np.ndarray, start: int, stop: int, dtype: type) -> np.ndarray:
    """Bytes start:stop of every block as little-endian integers of dtype."""
    return np.ascontiguousarray(blocks[:, start:stop]).view(np.dtype(dtype).newbyteorder("<"))


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[..., m] bytes -> [..., 2m] values: the low nibbles, then the high ones."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _crumbs(packed: np.ndarray) -> np.ndarray:
    """K-quants' 2-bit values: each 32 bytes hold 128, bits 0-1 of every byte first, then 2-3,
    4-5, 6-7. [n, 32 m] -> [n, 128 m]."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    n = packed.shape[0]
    return ((packed.reshape(n, -1, 1, 32) >> shifts) & 3).reshape(n, -1)


def _bit_planes(packed: np.ndarray) -> np.ndarray:
    """[n, 32] bytes -> [n, 256] bits: value 32 i + b is bit i of byte b."""
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    return ((packed[:, None, :] >> shifts) & 1).reshape(packed.shape[0], -1)


def _bits(packed: np.ndarray) -> np.ndarray:
    """[..., m] bytes -> [..., 8 m] bits: value 8 b + i is bit i of byte b."""
    shifts = np.arange(8, dtype=np.uint8)
    return ((packed[..., None] >> shifts) & 1).reshape(*packed.shape[:-1], -1)


def _signs(bits: np.ndarray) -> np.ndarray:
    """Sign bits -> +1 (bit clear) or -1 (bit set), int8."""
    return 1 - 2 * bits.astype(np.int8)


def k_quant_scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins, as float32.

    Bytes 0-3 hold scales 0-3 and bytes 4-7 mins 0-3 in their low 6 bits; scales and mins 4-7
    keep their low 4 bits in bytes 8-11 (scale low nibble, min high nibble) and their top 2 bits
    in the top bits of bytes 0-3 and 4-7.
    """
    low_scales, low_mins, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales_hi = (rest & 0x0F) | ((low_scales >> 6) << 4)
    mins_hi = (rest >> 4) | ((low_mins >> 6) << 4)
    scales = np.concatenate([low_scales & 0x3F, scales_hi], axis=-1)
    mins = np.concatenate([low_mins & 0x3F, mins_hi], axis=-1)
    return scales.astype(_F32), mins.astype(_F32)


def _per_sub_block(factors: np.ndarray, values: np.ndarray) -> np.ndarray:
    """factors [n, s] times values [n, s * k] (each factor over k values) -> [n, s * k]."""
    n, s = factors.shape
    return (factors[..., None] * values.reshape(n, s, -1)).reshape(n, -1)


def _nibble_scales(packed: np.ndarray) -> np.ndarray:
    """Bytes of two 4-bit scales each, the low nibble first -> float32 [n, 2 m]."""
    return (packed[..., None] >> np.array([0, 4], dtype=np.uint8) & 0x0F).reshape(
        packed.shape[0], -1).astype(_F32)


# The codebooks


@functools.cache
def _grid(kind: QType) -> np.ndarray:
    """An IQ type's grid as int8 [entries, values an entry] (its values are small integers)."""
    quant = getattr(gguf.quants, kind.name)
    quant.init_grid()
    grid = quant.grid.reshape(quant.grid_shape)
    assert np.array_equal(grid, np.round(grid)) and np.abs(grid).max() <= 127, kind
    return grid.astype(np.int8)


@functools.cache
def _sign_patterns() -> np.ndarray:
    """IQ2/IQ3's 7-bit sign indices -> 8 signs, int8 [128, 8]: the eighth sign is the one that
    makes the count of minus signs even."""
    index = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(index[:, None], axis=-1).sum(axis=-1) & 1
    return _signs(_bits((index | (parity << 7).astype(np.uint8))[:, None]))


@functools.cache
def _levels(kind: QType) -> np.ndarray:
    """IQ4_NL's (and IQ4_XS's) 16 non-linear levels, or MXFP4's (e2m1 values, doubled), int8."""
    return np.array(getattr(gguf.quants, kind.name).kvalues, dtype=np.int8)


def _grid_values(kind: QType, index: np.ndarray) -> np.ndarray:
    """Grid entries [n, e] -> their values [n, e * width], int8."""
    return _grid(kind)[index].reshape(index.shape[0], -1)


def _signed_by_pattern(values: np.ndarray, patterns: np.ndarray) -> np.ndarray:
    """values [n, 8 p] times the signs of 7-bit patterns [n, p]."""
    return values * _sign_patterns()[patterns].reshape(values.shape)


# Types held exactly as GroupedInts


def _q5_high_bits(blocks: np.ndarray, offset: int) -> np.ndarray:
    """Q5_0/Q5_1's 32 fifth bits (a little-endian uint32 at offset), bit j for value j."""
    return _bits(np.ascontiguousarray(blocks[:, offset:offset + 4]))


def _q5_0(blocks: np.ndarray) -> GroupedInts:
    """22 bytes: d, 4 of fifth bits, 16 of nibbles; values 0..31 less 16."""
    q = (_nibbles(blocks[:, 6:]) | (_q5_high_bits(blocks, 2) << 4)).astype(np.int8) - 16
    return GroupedInts(q, fp16_field(blocks, 0)[:, None])


def _q5_1(blocks: np.ndarray) -> GroupedInts:
    """24 bytes: d, min, 4 of fifth bits, 16 of nibbles."""
    q = (_nibbles(blocks[:, 8:]) | (_q5_high_bits(blocks, 4) << 4)).astype(np.int8)
    return GroupedInts(q, fp16_field(blocks, 0)[:, None], fp16_field(blocks, 2)[:, None])


def _q5_k(blocks: np.ndarray) -> GroupedInts:
    """176 bytes: d, dmin, Q4_K's 12 bytes of scales and mins, 32 of fifth bits, 128 of
    nibbles (each 32 bytes two sub-blocks of 32, low nibbles first)."""
    n = blocks.shape[0]
    d, dmin = fp16_field(blocks, 0)[:, None], fp16_field(blocks, 2)[:, None]
    scales, mins = k_quant_scales_and_mins(blocks[:, 4:16])
    low = _nibbles(blocks[:, 48:].reshape(n, 4, 32)).reshape(n, -1)
    q = (low | (_bit_planes(blocks[:, 16:48]) << 4)).astype(np.int8)
    return GroupedInts(q, d * scales, -(dmin * mins))


def _iq4_nl(blocks: np.ndarray) -> GroupedInts:
    """18 bytes: d and 16 bytes of indices into 16 levels."""
    return GroupedInts(_levels(QType.IQ4_NL)[_nibbles(blocks[:, 2:])],
                       fp16_field(blocks, 0)[:, None])


def _iq4_xs(blocks: np.ndarray) -> GroupedInts:
    """136 bytes: d, a uint16 of 2 high scale bits per sub-block of 32, 4 bytes of 4 low scale
    bits, then IQ4_NL's nibbles, 16 bytes per sub-block."""
    n = blocks.shape[0]
    high = (_words(blocks, 2, 4, np.uint16) >> (2 * np.arange(8, dtype=np.uint16))) & 3
    low = _nibbles(blocks[:, 4:8, None]).reshape(n, 8)
    scales = ((low | (high.astype(np.uint8) << 4)).astype(np.int8) - 32).astype(_F32)
    q = _levels(QType.IQ4_NL)[_nibbles(blocks[:, 8:].reshape(n, 8, 16))].reshape(n, -1)
    return GroupedInts(q, fp16_field(blocks, 0)[:, None] * scales)


def _mxfp4(blocks: np.ndarray) -> GroupedInts:
    """17 bytes: an e8m0 exponent e (the scale is 2^(e - 128), as the levels are doubled) and
    16 bytes of 4-bit e2m1 codes."""
    scale = np.ldexp(_F32(1), blocks[:, :1].astype(np.int32) - 128).astype(_F32)
    return GroupedInts(_levels(QType.MXFP4)[_nibbles(blocks[:, 1:])], scale)


def _scale_and_signs(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ2_XXS's and IQ3_XXS's uint32 per 32 values: four 7-bit sign patterns, then a 4-bit
    scale in the top bits -> (scale as float32 [n, w], patterns [n, 4 w])."""
    shifts = np.array([0, 7, 14, 21], dtype=np.uint32)
    patterns = ((words[..., None] >> shifts) & 0x7F).reshape(words.shape[0], -1)
    return (words >> 28).astype(_F32), patterns


def _half_step_scales(d: np.ndarray, scales: np.ndarray, unit: float) -> np.ndarray:
    """IQ2/IQ3_XXS sub-block factors: d (scale + 1/2) unit, in ggml's order."""
    return d * (_F32(0.5) + scales) * _F32(unit)


def _iq2_xxs(blocks: np.ndarray) -> GroupedInts:
    """66 bytes: d, then per 32 values 4 grid indices (bytes) and a uint32 of signs and scale."""
    n = blocks.shape[0]
    index = blocks[:, 2:].reshape(n, 8, 8)[..., :4].reshape(n, 32)
    scales, patterns = _scale_and_signs(_words(blocks, 2, 66, np.uint32).reshape(n, 8, 2)[..., 1])
    q = _signed_by_pattern(_grid_values(QType.IQ2_XXS, index), patterns)
    return GroupedInts(q, _half_step_scales(fp16_field(blocks, 0)[:, None], scales, 0.25))


def _iq3_xxs(blocks: np.ndarray) -> GroupedInts:
    """98 bytes: d, 64 grid indices (4 values each), 8 uint32 of signs and scale per 32."""
    scales, patterns = _scale_and_signs(_words(blocks, 66, 98, np.uint32))
    q = _signed_by_pattern(_grid_values(QType.IQ3_XXS, blocks[:, 2:66]), patterns)
    return GroupedInts(q, _half_step_scales(fp16_field(blocks, 0)[:, None], scales, 0.5))


def _iq3_s(blocks: np.ndarray) -> GroupedInts:
    """110 bytes: d, 64 bytes of grid indices' low 8 bits, 8 of their ninth bits, 32 of sign
    bits, 4 of 4-bit scales s, one per 32 values, each standing for d (2 s + 1)."""
    index = blocks[:, 2:66].astype(np.uint16) | (_bits(blocks[:, 66:74]).astype(np.uint16) << 8)
    q = _grid_values(QType.IQ3_S, index) * _signs(_bits(blocks[:, 74:106]))
    odd = (2 * _nibble_scales(blocks[:, 106:110]).astype(np.uint8) + 1).astype(_F32)
    return GroupedInts(q, fp16_field(blocks, 0)[:, None] * odd)


# IQ1: grid entries of 8 values in {-1, 0, 1}, shifted by 1/8 up or down: in eighths, odd
# integers from -9 to 9.


def _iq1_eighths(index: np.ndarray, shift_down: np.ndarray) -> np.ndarray:
    """Grid entries [n, e] and their shift bits [n, e] -> 8 (value + or - 1/8), int8 [n, 8 e]."""
    shift = _signs(shift_down)[..., None]
    return (8 * _grid(QType.IQ1_S)[index] + shift).reshape(index.shape[0], -1)


def _iq1_s(blocks: np.ndarray) -> GroupedInts:
    """50 bytes: d, 32 bytes of grid indices' low 8 bits, 8 uint16 per 32 values: four 3-bit
    index tops, a 3-bit scale s (d (2 s + 1)), and the shift's direction in the top bit."""
    n = blocks.shape[0]
    words = _words(blocks, 34, 50, np.uint16)
    tops = (words[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7
    index = blocks[:, 2:34].astype(np.uint16) | (tops.reshape(n, 32) << 8)
    q = _iq1_eighths(index, np.repeat(words >> 15, 4, axis=1))
    odd = (2 * ((words >> 12) & 7) + 1).astype(_F32)
    return GroupedInts(q, fp16_field(blocks, 0)[:, None] * odd * _F32(0.125))


# Types with two factors, or a min, per 32 values: float (Q3_K also as GroupedInts, whose
# values are the same but zeros may take the other sign)


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    """84 bytes: 16 bytes of 4-bit scale and min per 16 values, 64 of 2-bit values, d, dmin."""
    d, dmin = fp16_field(blocks, 80)[:, None], fp16_field(blocks, 82)[:, None]
    scales = blocks[:, :16]
    q = _crumbs(blocks[:, 16:80]).astype(_F32)
    return (_per_sub_block(d * (scales & 0x0F).astype(_F32), q)
            - np.repeat(dmin * (scales >> 4).astype(_F32), 16, axis=1))


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    """110 bytes: 32 of high bits, 64 of 2-bit values, 12 of 6-bit scales, d; one scale per 16
    values."""
    d = fp16_field(blocks, 108)[:, None]
    return _per_sub_block(d * _q3_k_scales(blocks).astype(_F32), _q3_k_values(blocks).astype(_F32))


def _q3_k_ints(blocks: np.ndarray) -> GroupedInts:
    """Q3_K's values are d times a scale (-32..31) times a value (-4..3): all of a block's one
    factor d times integers from -124 to 128, which int8 holds with the signs turned (-d)."""
    n = blocks.shape[0]
    products = _q3_k_scales(blocks).astype(np.int16)[..., None] * _q3_k_values(blocks).reshape(
        n, 16, 16)
    minus_d = np.repeat(-fp16_field(blocks, 108)[:, None], QK_K // _GROUP, axis=1)
    return GroupedInts((-products).astype(np.int8).reshape(n, -1), minus_d)


def _q3_k_values(blocks: np.ndarray) -> np.ndarray:
    """The 2-bit values less 4 where their high bit is clear: int8 -4..3 [n, 256]."""
    return _crumbs(blocks[:, 32:96]).astype(np.int8) - 4 * (1 - _bit_planes(blocks[:, :32])).astype(
        np.int8)


def _q3_k_scales(blocks: np.ndarray) -> np.ndarray:
    """Bytes 96-107 -> 16 six-bit scales less 32, int8: scale j's low 4 bits are nibble j // 8
    of byte j % 8, its top 2 bits the bits 2 (j // 4) of byte 8 + j % 4."""
    packed = blocks[:, 96:108]
    n = packed.shape[0]
    low = (packed[:, None, :8] >> np.array([0, 4], dtype=np.uint8)[:, None]).reshape(n, 16) & 0x0F
    high = (packed[:, None, 8:] >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]).reshape(n, 16)
    return (low | ((high & 3) << 4)).astype(np.int8) - 32


def _iq2_xs(blocks: np.ndarray) -> np.ndarray:
    """74 bytes: d, 32 uint16 (a 9-bit grid index under a 7-bit sign pattern), 8 bytes of 4-bit
    scales, one per 16 values."""
    words = _words(blocks, 2, 66, np.uint16)
    values = _signed_by_pattern(_grid_values(QType.IQ2_XS, words & 0x1FF), words >> 9)
    scales = _nibble_scales(blocks[:, 66:74])
    return _per_sub_block(_half_step_scales(fp16_field(blocks, 0)[:, None], scales, 0.25),
                          values.astype(_F32))


def _iq2_s(blocks: np.ndarray) -> np.ndarray:
    """82 bytes: d, 32 bytes of grid indices' low 8 bits, 32 of sign bits (one per value), 8 of
    the indices' top 2 bits, 8 of 4-bit scales, one per 16 values."""
    n = blocks.shape[0]
    top = (blocks[:, 66:74, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3
    index = blocks[:, 2:34].astype(np.uint16) | (top.reshape(n, 32).astype(np.uint16) << 8)
    values = _grid_values(QType.IQ2_S, index) * _signs(_bits(blocks[:, 34:66]))
    scales = _nibble_scales(blocks[:, 74:82])
    return _per_sub_block(_half_step_scales(fp16_field(blocks, 0)[:, None], scales, 0.25),
                          values.astype(_F32))


def _iq1_m(blocks: np.ndarray) -> np.ndarray:
    """56 bytes: 32 bytes of grid indices' low 8 bits, 16 bytes of a nibble per entry (3-bit
    index top, shift direction), 4 uint16 of 3-bit scales s (d (2 s + 1)), one per 16 values,
    whose top nibbles together are the fp16 d."""
    n = blocks.shape[0]
    words = _words(blocks, 48, 56, np.uint16)
    nibbles = _nibbles(blocks[:, 32:48, None]).reshape(n, 32)
    index = blocks[:, :32].astype(np.uint16) | ((nibbles & 7).astype(np.uint16) << 8)
    values = _iq1_eighths(index, nibbles >> 3).astype(_F32) * _F32(0.125)
    scales = (words[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7
    odd = (2 * scales.reshape(n, 16) + 1).astype(_F32)
    return _per_sub_block(_iq1_m_d(words)[:, None] * odd, values)


def _iq1_m_d(words: np.ndarray) -> np.ndarray:
    """The fp16 d spread over the top nibbles of 4 uint16, the first the lowest, as float32."""
    nibbles = (words >> 12).astype(np.uint16) << (4 * np.arange(4, dtype=np.uint16))
    bits = np.bitwise_or.reduce(nibbles, axis=-1).astype(np.uint16)
    return bits.view(np.float16).astype(_F32)


_GROUPED: dict[QType, Callable[[np.ndarray], GroupedInts]] = {
    QType.Q5_0: _q5_0, QType.Q5_1: _q5_1, QType.Q5_K: _q5_k, QType.IQ4_NL: _iq4_nl,
    QType.IQ4_XS: _iq4_xs, QType.MXFP4: _mxfp4, QType.IQ2_XXS: _iq2_xxs,
    QType.IQ3_XXS: _iq3_xxs, QType.IQ3_S: _iq3_s, QType.IQ1_S: _iq1_s,
}
_DECODERS: dict[QType, Callable[[np.ndarray], np.ndarray]] = {
    QType.Q2_K: _q2_k, QType.Q3_K: _q3_k, QType.IQ2_XS: _iq2_xs, QType.IQ2_S: _iq2_s,
    QType.IQ1_M: _iq1_m,
}
_EXACT_INT8 = {**_GROUPED, QType.Q3_K: _q3_k_ints}
# The types decoded here: the loader widens them (layouts.GGUF_WIDENED_TYPES names them), those
# of EXACT_TYPES without changing a value.
EXACT_TYPES = frozenset(_EXACT_INT8)
DECODED_TYPES = EXACT_TYPES | frozenset(_DECODERS)
