/*
 * GGUF's Q3_K blocks, read in place by q8_gemv.c (pagoda/kernels/cpu/native.py keys its build on
 * this header too).
 *
 * A row is k / 256 super-blocks of 110 bytes:
 *
 *   hmask      [32] the values' third bits: block j's (of 32) in bit j
 *   qs         [64] their low 2 bits: block j's in bits 2 (j % 4) of qs[32 (j / 4) ..][32]
 *   scales     [12] sixteen six-bit scales, one per 16 values: the low 4 bits of scale i in
 *              byte i (i < 8) or the high nibble of byte i - 8, the high 2 bits in bits
 *              2 (i / 4) of byte 8 + i % 4
 *   d          fp16, the super-block's scale
 *
 *   w[e] = d * (sc[e / 16] - 32) * q[e],  q = low bits - (third bit ? 0 : 4), in -4..3
 *
 * 3.44 bits a weight. A block of 32 is 32 int8 values with two integer scales (-32..31), one
 * per half, as Q6_K's.
 */
#ifndef PAGODA_Q3_K_BLOCKS_H
#define PAGODA_Q3_K_BLOCKS_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "half_float.h"

#define Q3K_SUPER 256
#define Q3K_BYTES 110
#define Q3K_QS_AT 32
#define Q3K_SCALES_AT 96
#define Q3K_D_AT 108

static inline size_t q3k_row_bytes(int k) { return (size_t)(k / Q3K_SUPER) * Q3K_BYTES; }

static inline float q3k_d(const uint8_t *super) { return f16_at(super + Q3K_D_AT); }

__attribute__((target("f16c"), always_inline))
static inline float q3k_d_f16c(const uint8_t *super) { return f16_at_f16c(super + Q3K_D_AT); }

/* Scale i (of 16, one per 16 values), sc - 32 in -32..31. */
static inline int q3k_scale(const uint8_t *super, int i)
{
    const uint8_t *s = super + Q3K_SCALES_AT;
    int low = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
    int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (low | (high << 4)) - 32;
}

/* Block j's 32 values, -4..3. */
static inline void q3k_block_scalar(const uint8_t *super, int j, int8_t out[32])
{
    const uint8_t *qs = super + Q3K_QS_AT + 32 * (j / 4), *hmask = super;
    for (int e = 0; e < 32; e++)
        out[e] = (int8_t)(((qs[e] >> (2 * (j % 4))) & 3) - ((hmask[e] >> j) & 1 ? 0 : 4));
}

/* The same from two 32-byte loads: the low bits, minus 4 where the third bit is clear. */
__attribute__((target("avx2"), always_inline))
static inline __m256i q3k_block_avx2(const uint8_t *super, int j)
{
    __m256i qs = _mm256_loadu_si256((const __m256i *)(super + Q3K_QS_AT + 32 * (j / 4)));
    __m256i hmask = _mm256_loadu_si256((const __m256i *)super);
    __m256i bit = _mm256_set1_epi8((char)(1 << j));
    __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * (j % 4)), _mm256_set1_epi8(3));
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit);
    return _mm256_sub_epi8(low, _mm256_andnot_si256(set, _mm256_set1_epi8(4)));
}

#endif
