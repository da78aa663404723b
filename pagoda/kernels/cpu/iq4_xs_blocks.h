/*
 * GGUF's IQ4_XS blocks, read in place by q8_gemv.c (pagoda/kernels/cpu/native.py keys its build on
 * this header too).
 *
 * A row is k / 256 super-blocks of 136 bytes:
 *
 *   d          fp16, the super-block's scale
 *   scales_h   uint16, the high 2 bits of each sub-block's six-bit scale (bits 2j, 2j + 1)
 *   scales_l   [4] the low 4 bits (sub-block j: byte j / 2, nibble j % 2)
 *   qs         [128] 16 bytes per sub-block of 32: values 0..15 in the low nibbles, 16..31 in
 *              the high ones, each an index into a 16-entry non-linear table
 *
 *   w[e] = d * (ls[e / 32] - 32) * table[q[e]]
 *
 * 4.25 bits a weight. The table's values (-127..113) are int8, and ls - 32 (-32..31) times one
 * fits int16 (|.| <= 4064), so a sub-block is an integer block with one integer scale, as the
 * int8 weights' passes take them.
 */
#ifndef PAGODA_IQ4_XS_BLOCKS_H
#define PAGODA_IQ4_XS_BLOCKS_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "half_float.h"

#define IQ4XS_SUPER 256
#define IQ4XS_BYTES 136
#define IQ4XS_QS_AT 8

/* The format's 16 levels (gguf-py's `IQ4_NL.kvalues`; the tests hold our values to its). */
static const int8_t iq4xs_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

static inline size_t iq4xs_row_bytes(int k) { return (size_t)(k / IQ4XS_SUPER) * IQ4XS_BYTES; }

static inline float iq4xs_d(const uint8_t *super) { return f16_at(super); }

__attribute__((target("f16c"), always_inline))
static inline float iq4xs_d_f16c(const uint8_t *super) { return f16_at_f16c(super); }

/* Sub-block j's integer scale, ls - 32 in -32..31. */
static inline int iq4xs_scale(const uint8_t *super, int j)
{
    uint16_t scales_h;
    memcpy(&scales_h, super + 2, sizeof(scales_h));
    int low = (super[4 + j / 2] >> (4 * (j % 2))) & 15;
    return (low | (((scales_h >> (2 * j)) & 3) << 4)) - 32;
}

/* Sub-block j's 32 values, table[q]. */
static inline void iq4xs_block_scalar(const uint8_t *super, int j, int8_t out[32])
{
    const uint8_t *qs = super + IQ4XS_QS_AT + 16 * j;
    for (int e = 0; e < 16; e++) {
        out[e] = iq4xs_levels[qs[e] & 15];
        out[e + 16] = iq4xs_levels[qs[e] >> 4];
    }
}

/* The same, values 0..15 in the low 128 bits: one 16-byte load, the nibbles split, and one
 * byte shuffle looks up the table. */
__attribute__((target("avx2"), always_inline))
static inline __m256i iq4xs_block_avx2(const uint8_t *super, int j)
{
    __m128i qs = _mm_loadu_si128((const __m128i *)(super + IQ4XS_QS_AT + 16 * j));
    __m128i low = _mm_set1_epi8(15);
    __m256i idx = _mm256_setr_m128i(_mm_and_si128(qs, low),
                                    _mm_and_si128(_mm_srli_epi16(qs, 4), low));
    __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4xs_levels));
    return _mm256_shuffle_epi8(table, idx);
}

/* Lane j: IQ4_XS sub-block j's scale, ls - 32 (iq4xs_scale's, 8 at once). */
__attribute__((target("avx2"), always_inline))
static inline __m256i iq4xs_scales_avx2(const uint8_t *super)
{
    uint16_t high;
    uint32_t low;
    memcpy(&high, super + 2, sizeof(high));
    memcpy(&low, super + 4, sizeof(low));
    __m256i lo = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32((int)low), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
        _mm256_set1_epi32(15));
    __m256i hi = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(high), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        _mm256_set1_epi32(3));
    return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
}

#endif
