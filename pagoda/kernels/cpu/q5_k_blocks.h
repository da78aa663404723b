/*
 * GGUF's Q5_K blocks, read in place by q8_gemv.c (pagoda/kernels/cpu/native.py keys its build on
 * this header too).
 *
 * A row is k / 256 super-blocks of 176 bytes:
 *
 *   d, dmin    fp16, the super-block's scales
 *   scales     [12] eight six-bit scales sc and eight six-bit mins m (Q4_K's packing)
 *   qh         [32] the values' fifth bits: sub-block j's in bit j
 *   qs         [128] their low 4 bits: sub-blocks 2i and 2i + 1 in the low and high nibbles
 *              of qs[32 i ..][32]
 *
 *   w[e] = d * sc[e / 32] * q[e] - dmin * m[e / 32],  q in 0..31
 *
 * 5.5 bits a weight, exactly as the file holds it (the loader used to widen it to int8 with a
 * min per 32: 1.25 bytes). A sub-block is an integer block (0..31) with an integer scale
 * (sc q <= 1953 fits int16) and a min, which the kernel adds as a term of its own.
 */
#ifndef PAGODA_Q5_K_BLOCKS_H
#define PAGODA_Q5_K_BLOCKS_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "half_float.h"

#define Q5K_SUPER 256
#define Q5K_BYTES 176
#define Q5K_SCALES_AT 4
#define Q5K_QH_AT 16
#define Q5K_QS_AT 48

static inline size_t q5k_row_bytes(int k) { return (size_t)(k / Q5K_SUPER) * Q5K_BYTES; }

static inline float q5k_d(const uint8_t *super) { return f16_at(super); }
static inline float q5k_dmin(const uint8_t *super) { return f16_at(super + 2); }

__attribute__((target("f16c"), always_inline))
static inline float q5k_d_f16c(const uint8_t *super) { return f16_at_f16c(super); }

__attribute__((target("f16c"), always_inline))
static inline float q5k_dmin_f16c(const uint8_t *super) { return f16_at_f16c(super + 2); }

/* Sub-block j's six-bit scale (mins = 0) or min (mins = 1), Q4_K's packing: j < 4 in the low
 * six bits of byte j (mins: j + 4); j >= 4 a nibble of byte j + 4 and the top two bits of
 * byte j - 4 (mins: of byte j). */
static inline int q5k_scale(const uint8_t *super, int j, int mins)
{
    const uint8_t *s = super + Q5K_SCALES_AT;
    if (j < 4)
        return s[j + 4 * mins] & 63;
    int low = mins ? s[j + 4] >> 4 : s[j + 4] & 15;
    return low | ((s[j - 4 + 4 * mins] >> 6) << 4);
}

/* Sub-block j's 32 values, q in 0..31. */
static inline void q5k_block_scalar(const uint8_t *super, int j, int8_t out[32])
{
    const uint8_t *qs = super + Q5K_QS_AT + 32 * (j / 2), *qh = super + Q5K_QH_AT;
    for (int e = 0; e < 32; e++)
        out[e] = (int8_t)(((qs[e] >> (4 * (j % 2))) & 15) | (((qh[e] >> j) & 1) << 4));
}

/* The same from two 32-byte loads: the nibble, and the bit by a compare. */
__attribute__((target("avx2"), always_inline))
static inline __m256i q5k_block_avx2(const uint8_t *super, int j)
{
    __m256i qs = _mm256_loadu_si256((const __m256i *)(super + Q5K_QS_AT + 32 * (j / 2)));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(super + Q5K_QH_AT));
    __m256i bit = _mm256_set1_epi8((char)(1 << j));
    __m256i low = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(qs, 4) : qs, _mm256_set1_epi8(15));
    __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                                    _mm256_set1_epi8(16));
    return _mm256_or_si256(low, high);
}

/* Lanes j: Q5_K sub-block j's scale (*scales) and min (*mins) (q5k_scale's, 8 at once). */
__attribute__((target("avx2"), always_inline))
static inline void q5k_scales_avx2(const uint8_t *super, __m256i *scales, __m256i *mins)
{
    uint32_t u[3];
    memcpy(u, super + Q5K_SCALES_AT, sizeof(u));
    uint32_t sc_lo = u[0] & 0x3f3f3f3f, m_lo = u[1] & 0x3f3f3f3f;
    uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | ((u[0] >> 6) & 0x03030303) << 4;
    uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 6) & 0x03030303) << 4;
    *scales = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)sc_lo, (int)sc_hi, 0, 0));
    *mins = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)m_lo, (int)m_hi, 0, 0));
}

/* Bytes 0-7: sub-blocks 0-7's scales, bytes 8-15 their mins (q5k_scale's), from the
 * super-block's first 16 bytes (d, dmin and the 12 packed bytes) in one register: two byte
 * shuffles gather each value's low bits (the high-nibble mins shifted down) and its top two
 * bits. No general registers on the way (q5k_scales_avx2's scalar unpacking and widening
 * left moe_experts' one-row Q4_K dot ~20% slower). */
__attribute__((target("avx2"), always_inline))
static inline __m128i q5k_scale_bytes_avx2(__m128i head)
{
    /* b = the packed bytes (head's bytes 4-15): sc 0-3 = b0-3, m 0-3 = b4-7; sc 4-7 =
     * b8-11 low nibbles with b0-3's top bits, m 4-7 = b8-11 high nibbles with b4-7's */
    __m128i low = _mm_shuffle_epi8(head, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15,
                                                       8, 9, 10, 11, 12, 13, 14, 15));
    __m128i top = _mm_shuffle_epi8(head, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7,
                                                       -1, -1, -1, -1, 8, 9, 10, 11));
    low = _mm_blend_epi32(low, _mm_srli_epi16(low, 4), 8); /* the mins' nibbles */
    low = _mm_and_si128(low, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15,
                                           63, 63, 63, 63, 15, 15, 15, 15));
    return _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(top, 2), _mm_set1_epi8(0x30)));
}

/* Block j's fifth bits (bit j of each qh byte) moved to bit 4: a 16-bit shift moves both
 * bytes of a lane alike, and the mask keeps each byte's own. */
__attribute__((target("avx2"), always_inline))
static inline __m256i q5k_fifth_bits(__m256i qh, int j, __m256i sixteen)
{
    __m256i moved = j <= 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
    return _mm256_and_si256(moved, sixteen);
}

#endif
