/*
 * GGUF's block types of 32 values with one scale, read in place by moe_experts.c
 * (pagoda/kernels/cpu/native.py keys its build on this header too):
 *
 *   Q4_0   18 bytes: fp16 d, 16 bytes of nibbles (values 0..15 low, 16..31 high);
 *          w = d * (q - 8)
 *   Q8_0   34 bytes: fp16 d, 32 int8 q; w = d * q
 *   MXFP4  17 bytes: an e8m0 exponent e, 16 bytes of e2m1 codes (Q4_0's order);
 *          w = 2^(e - 127) * e2m1(code) = 2^(e - 128) * level, the levels e2m1's values
 *          doubled (integers -12..12, so a block is int8 values and one float scale)
 *
 * Q4_0 and MXFP4 are 4.5 and 4.25 bits a weight, Q8_0 8.5.
 */
#ifndef PAGODA_BLOCKS_OF_32_H
#define PAGODA_BLOCKS_OF_32_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "half_float.h"

#define Q4_0_BYTES 18
#define Q8_0_BYTES 34
#define MXFP4_BYTES 17

/* MXFP4's 16 levels (gguf-py's `MXFP4.kvalues`; the tests hold our values to its). */
static const int8_t mxfp4_levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128), exactly: its float bits, a subnormal for e < 2 (ggml's e8m0 "half"). */
static inline float mxfp4_scale(const uint8_t *block)
{
    uint32_t e = block[0], bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* A block's 32 values from its 16 bytes of nibbles, each looked up in levels (NULL: the
 * nibble less 8, Q4_0's). */
static inline void nibble_block_scalar(const uint8_t *qs, const int8_t *levels, int8_t out[32])
{
    for (int e = 0; e < 16; e++) {
        int lo = qs[e] & 15, hi = qs[e] >> 4;
        out[e] = (int8_t)(levels ? levels[lo] : lo - 8);
        out[e + 16] = (int8_t)(levels ? levels[hi] : hi - 8);
    }
}

/* The same from one 16-byte load: the nibbles split into the two 128-bit lanes (the load in
 * both, the upper one's words shifted by 4: three instructions where splitting took five). */
__attribute__((target("avx2"), always_inline))
static inline __m256i nibbles_avx2(const uint8_t *qs)
{
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)),
                            _mm256_set1_epi8(15));
}

__attribute__((target("avx2"), always_inline))
static inline __m256i q4_0_block_avx2(const uint8_t *block)
{
    return _mm256_sub_epi8(nibbles_avx2(block + 2), _mm256_set1_epi8(8));
}

__attribute__((target("avx2"), always_inline))
static inline __m256i mxfp4_block_avx2(const uint8_t *block)
{
    __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mxfp4_levels));
    return _mm256_shuffle_epi8(table, nibbles_avx2(block + 1));
}

#endif
