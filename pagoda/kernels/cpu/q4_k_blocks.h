/*
 * GGUF's Q4_K blocks, read in place by moe_experts.c (pagoda/kernels/cpu/native.py keys its build on
 * this header too).
 *
 * A row is k / 256 super-blocks of 144 bytes:
 *
 *   d, dmin    fp16, the super-block's scales
 *   scales     [12] eight six-bit scales sc and eight six-bit mins m (q5_k_blocks.h's packing,
 *              at the same offset, so q5k_scale reads them)
 *   qs         [128] sub-blocks 2i and 2i + 1 in the low and high nibbles of qs[32 i ..][32]
 *
 *   w[e] = d * sc[e / 32] * q[e] - dmin * m[e / 32],  q in 0..15
 *
 * 4.5 bits a weight: Q5_K without its fifth bits.
 */
#ifndef PAGODA_Q4_K_BLOCKS_H
#define PAGODA_Q4_K_BLOCKS_H

#include <immintrin.h>
#include <stdint.h>

#include "q5_k_blocks.h"

#define Q4K_BYTES 144
#define Q4K_QS_AT 16

/* Sub-block j's 32 values, q in 0..15. */
static inline void q4k_block_scalar(const uint8_t *super, int j, int8_t out[32])
{
    const uint8_t *qs = super + Q4K_QS_AT + 32 * (j / 2);
    for (int e = 0; e < 32; e++)
        out[e] = (int8_t)((qs[e] >> (4 * (j % 2))) & 15);
}

/* The same from one 32-byte load (sub-blocks 2i and 2i + 1 share it). */
__attribute__((target("avx2"), always_inline))
static inline __m256i q4k_block_avx2(const uint8_t *super, int j)
{
    __m256i qs = _mm256_loadu_si256((const __m256i *)(super + Q4K_QS_AT + 32 * (j / 2)));
    return _mm256_and_si256(j % 2 ? _mm256_srli_epi16(qs, 4) : qs, _mm256_set1_epi8(15));
}

#endif
