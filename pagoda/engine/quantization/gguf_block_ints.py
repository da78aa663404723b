"""The integers and scales of GGUF blocks that the engine keeps as the file stores them and
whose values are an integer times one factor per 32 (plus a min for Q5_K): IQ4_XS, Q5_K and
Q3_K (whose two scales per 32 fold into its values, below).
Read by `dequantize` and by widening to grouped int8 (exact) where our CPU kernel does not run
(pagoda/engine/quantization/tensors.py); pagoda/kernels/cpu/iq4_xs_blocks.h, q5_k_blocks.h and q3_k_blocks.h
describe the same blocks for the kernel. The products are gguf's, in its order: d times the sub-block scale,
then times the value, so the values are gguf-py's to the bit (tested)."""

from __future__ import annotations

import torch

SUPER_BLOCK = 256
SUB_BLOCKS = 8  # blocks of 32 per super-block
# IQ4_XS's (and IQ4_NL's) 16 non-linear levels: the format's definition.
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _super_blocks(blocks: torch.Tensor, size: int) -> torch.Tensor:
    return blocks.view(blocks.shape[0], -1, size)


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 field at byte `at` of each super-block, float32 [n, supers, 1]."""
    return b[..., at:at + 2].contiguous().view(torch.float16).float()


def iq4_xs_ints(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """IQ4_XS rows (136 bytes per 256 values) -> (q int8 [n, k], scales float32 [n, k / 32]):
    w = scales * q, where q is a level and scale d * (ls - 32)."""
    b = _super_blocks(blocks, 136)
    j = torch.arange(SUB_BLOCKS, device=blocks.device)
    high_bits = b[..., 2:4].contiguous().view(torch.int16).int() & 0xFFFF
    low = (b[..., 4 + j // 2].int() >> (4 * (j % 2))) & 15
    ls = low | (((high_bits >> (2 * j)) & 3) << 4)
    qs = b[..., 8:].reshape(*b.shape[:2], SUB_BLOCKS, 16).long()
    levels = torch.tensor(IQ4_LEVELS, dtype=torch.int8, device=blocks.device)
    q = levels[torch.cat([qs & 15, qs >> 4], dim=-1)]
    scales = _f16(b, 0) * (ls - 32).float()
    return q.reshape(blocks.shape[0], -1), scales.reshape(blocks.shape[0], -1)


def q5_k_ints(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q5_K rows (176 bytes per 256 values) -> (q int8 0..31 [n, k], scales, mins float32
    [n, k / 32]): w = scales * q + mins, scale d * sc and min -(dmin * m)."""
    b = _super_blocks(blocks, 176)
    s = b[..., 4:16].int()
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], dim=-1)
    m = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], dim=-1)
    qs = b[..., 48:].reshape(*b.shape[:2], 4, 1, 32).int()
    low = (qs >> torch.tensor([0, 4], device=blocks.device).view(2, 1)) & 15
    bits = torch.arange(SUB_BLOCKS, device=blocks.device).view(SUB_BLOCKS, 1)
    high = (b[..., 16:48].int().unsqueeze(2) >> bits) & 1
    q = low.reshape(*b.shape[:2], SUB_BLOCKS, 32) | (high << 4)
    n = blocks.shape[0]
    scales = (_f16(b, 0) * sc.float()).reshape(n, -1)
    mins = (-(_f16(b, 2) * m.float())).reshape(n, -1)
    return q.to(torch.int8).reshape(n, -1), scales, mins


def q3_k_ints(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q3_K rows (110 bytes per 256 values) -> (q int8 [n, k], scales float32 [n, k / 32]):
    w = d (sc - 32) v with v in -4..3 and one scale per 16, held as q = -(sc - 32) v
    (-128..124 fits int8) times -d per group of 32; products of small integers and d, so
    exact, and equal to gguf's (d (sc - 32)) v."""
    b = _super_blocks(blocks, 110)
    n, supers = b.shape[:2]
    s = b[..., 96:108].int()
    i = torch.arange(16, device=blocks.device)
    low = torch.where(i < 8, s[..., i % 8] & 15, s[..., i % 8] >> 4)
    sc = (low | (((s[..., 8 + i % 4] >> (2 * (i // 4))) & 3) << 4)) - 32  # [n, supers, 16]
    j = torch.arange(SUB_BLOCKS, device=blocks.device).view(SUB_BLOCKS, 1)
    qs = b[..., 32:96].reshape(n, supers, 2, 1, 32).int()
    low_bits = (qs >> (2 * j[:4])) & 3  # [n, supers, 2, 4, 32]
    high = (b[..., :32].int().unsqueeze(2) >> j) & 1  # [n, supers, 8, 32]
    v = low_bits.reshape(n, supers, SUB_BLOCKS, 32) - 4 * (1 - high)
    q = -(v.view(n, supers, 16, 16) * sc.unsqueeze(-1))
    scales = (-_f16(b, 108)).expand(n, supers, SUB_BLOCKS)
    return q.to(torch.int8).reshape(n, -1), scales.reshape(n, -1).contiguous()


# The types of expert weights read in place (`GGUFRows`), as the engine's own layouts where our
# expert kernel does not run: Q4_K and Q4_0 as int4 with a scale and a min per 32, Q8_0 and
# MXFP4 as grouped int8, each exactly.

def _nibble_values(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16 c] bytes whose low nibbles hold values 0..15 of a block of 32 and high nibbles
    16..31 (Q4_0's and MXFP4's layout; Q4_K's per 64) -> uint8 values [..., 32 c]."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def q4_k_ints(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K rows (144 bytes per 256 values) -> (q uint8 0..15 [n, k], scales, mins float32
    [n, k / 32]): w = scales * q + mins, scale d * sc and min -(dmin * m) (Q5_K's scale
    packing, without its fifth bits)."""
    b = _super_blocks(blocks, 144)
    n = blocks.shape[0]
    s = b[..., 4:16].int()
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], dim=-1)
    m = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], dim=-1)
    q = _nibble_values(b[..., 16:].reshape(n, b.shape[1], 4, 32))
    scales = (_f16(b, 0) * sc.float()).reshape(n, -1)
    mins = (-(_f16(b, 2) * m.float())).reshape(n, -1)
    return q.reshape(n, -1), scales, mins


def q4_0_ints(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_0 rows (18 bytes per 32 values) -> (q uint8 0..15 [n, k], d float32 [n, k / 32]):
    w = d * (q - 8)."""
    b = _super_blocks(blocks, 18)
    return _nibble_values(b[..., 2:]).reshape(b.shape[0], -1), _f16(b, 0).reshape(b.shape[0], -1)


def q8_0_ints(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 rows (34 bytes per 32 values) -> (q int8 [n, k], d float32 [n, k / 32])."""
    b = _super_blocks(blocks, 34)
    q = b[..., 2:].contiguous().view(torch.int8)
    return q.reshape(b.shape[0], -1), _f16(b, 0).reshape(b.shape[0], -1)


# MXFP4's e2m1 codes as their values doubled (its e8m0 scale is then halved): the format's
# definition, -12..12, integers.
MXFP4_LEVELS = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def mxfp4_ints(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 rows (17 bytes per 32 values: an e8m0 exponent e, 16 bytes of e2m1 codes) ->
    (q int8 [n, k], scales float32 [n, k / 32]): w = 2^(e - 128) * level (levels doubled),
    exact in float32 for every e (2^-128 and 2^-127 are subnormal)."""
    b = _super_blocks(blocks, 17)
    levels = torch.tensor(MXFP4_LEVELS, dtype=torch.int8, device=blocks.device)
    q = levels[_nibble_values(b[..., 1:]).long()]
    e = b[..., 0].int()
    # The float32 bits of 2^(e - 128): exponent field e - 1, or below it a subnormal's bit.
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return q.reshape(b.shape[0], -1), bits.view(torch.float32)
