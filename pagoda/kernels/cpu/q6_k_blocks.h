/*
 * GGUF's Q6_K blocks, read in place: by q8_gemv.c's products and dequant.c's widening
 * (pagoda/kernels/cpu/native.py keys their builds on this header too).
 *
 * A row is k / 256 super-blocks of 210 bytes:
 *
 *   ql[128]   the low 4 bits of the 256 six-bit values
 *   qh[64]    their high 2 bits
 *   sc[16]    int8, one scale per sub-block of 16 values
 *   d         fp16, the super-block's scale
 *
 *   w[e] = d * sc[e / 16] * (q[e] - 32),  q[e] in 0..63
 *
 * Each half of 128 values (h = 0, 1) holds four blocks of 32: block j (0..3) takes the low
 * nibbles (j = 0, 1) or high nibbles (j = 2, 3) of ql[64h + 32 (j % 2) ..][32] and bits
 * 2j, 2j + 1 of qh[32h ..][32]. So one block of 32 is one 32-byte load of each, a shift and a
 * mask: the layout is llama.cpp's, made for 256-bit registers. 0.82 bytes a weight, where
 * widening to int8 with a scale per 32 costs 1.125.
 */
#ifndef PAGODA_Q6_K_BLOCKS_H
#define PAGODA_Q6_K_BLOCKS_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "half_float.h"

#define Q6K_SUPER 256
#define Q6K_BYTES 210
#define Q6K_BLOCKS (Q6K_SUPER / 32) /* blocks of 32 per super-block */
#define Q6K_QH_AT 128
#define Q6K_SCALES_AT 192
#define Q6K_D_AT 208

static inline size_t q6k_row_bytes(int k) { return (size_t)(k / Q6K_SUPER) * Q6K_BYTES; }

/* The super-block that holds block g (of 32) of a row. */
static inline const uint8_t *q6k_super(const uint8_t *row, int g)
{
    return row + (size_t)(g / Q6K_BLOCKS) * Q6K_BYTES;
}

static inline float q6k_d(const uint8_t *super)
{
    uint16_t h;
    memcpy(&h, super + Q6K_D_AT, sizeof(h));
    return f16_to_f32(h);
}

/* The same by F16C's conversion, for the vector paths: an fp16 subnormal (d below 6.1e-5, as
 * small weights' blocks have) takes f16_to_f32's slow branch. */
__attribute__((target("f16c"), always_inline))
static inline float q6k_d_f16c(const uint8_t *super)
{
    uint16_t h;
    memcpy(&h, super + Q6K_D_AT, sizeof(h));
    return _cvtsh_ss(h);
}

/* Block g's two sub-block scales: sc[0] for its values 0..15, sc[1] for 16..31. */
static inline const int8_t *q6k_scales(const uint8_t *super, int g)
{
    return (const int8_t *)(super + Q6K_SCALES_AT) + 2 * (g % Q6K_BLOCKS);
}

/* Block g's 32 values, q - 32 (-32..31). */
static inline void q6k_block_scalar(const uint8_t *super, int g, int8_t out[32])
{
    int j = g % Q6K_BLOCKS, h = j / 4, part = j % 4;
    const uint8_t *ql = super + 64 * h + 32 * (part % 2), *qh = super + Q6K_QH_AT + 32 * h;
    int ls = 4 * (part / 2), hs = 2 * part;
    for (int e = 0; e < 32; e++)
        out[e] = (int8_t)((((ql[e] >> ls) & 15) | (((qh[e] >> hs) & 3) << 4)) - 32);
}

/* Half h's four blocks of 32 (values 128h .. 128h + 127), q - 32 each: three loads for 128
 * values. 16-bit shifts move a neighbour byte's bits into each byte; the masks drop them. */
__attribute__((target("avx2"), always_inline))
static inline void q6k_half_avx2(const uint8_t *super, int h, __m256i out[4])
{
    const uint8_t *ql = super + 64 * h;
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(super + Q6K_QH_AT + 32 * h));
    __m256i low = _mm256_set1_epi8(15), high = _mm256_set1_epi8(3 << 4);
    __m256i off = _mm256_set1_epi8(32);
    __m256i lo[4] = {l0, l1, _mm256_srli_epi16(l0, 4), _mm256_srli_epi16(l1, 4)};
    __m256i hi[4] = {_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 2), qh,
                     _mm256_srli_epi16(qh, 2)};
    for (int j = 0; j < 4; j++)
        out[j] = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(lo[j], low),
                                                 _mm256_and_si256(hi[j], high)), off);
}

/* Block j (of 8) alone, q - 32: one 32-byte load of each of ql and qh, as q6k_half_avx2 reads
 * them for four. */
__attribute__((target("avx2"), always_inline))
static inline __m256i q6k_block_avx2(const uint8_t *super, int j)
{
    int h = j / 4, part = j % 4;
    __m256i ql = _mm256_loadu_si256((const __m256i *)(super + 64 * h + 32 * (part % 2)));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(super + Q6K_QH_AT + 32 * h));
    __m256i lo = _mm256_and_si256(part / 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(15));
    /* bits 2 part, 2 part + 1 of each qh byte to bits 4, 5 */
    __m256i hi = part == 0 ? _mm256_slli_epi16(qh, 4) : part == 1 ? _mm256_slli_epi16(qh, 2)
               : part == 2 ? qh : _mm256_srli_epi16(qh, 2);
    hi = _mm256_and_si256(hi, _mm256_set1_epi8(3 << 4));
    return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
}

/* The same for two rows' super-blocks at once: row a's blocks in bytes 0-31 of each out[j],
 * row b's in bytes 32-63; q itself (0..63) if `unsigned_q`, else q - 32. */
__attribute__((target("avx512f,avx512bw,avx2"), always_inline))
static inline void q6k_half_pair_zmm_q(const uint8_t *a, const uint8_t *b, int h, int unsigned_q,
                                       __m512i out[4])
{
#define Q6K_PAIR_LOAD(at)                                                                   \
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + (at)))), \
                       _mm256_loadu_si256((const __m256i *)(b + (at))), 1)
    __m512i l0 = Q6K_PAIR_LOAD(64 * h), l1 = Q6K_PAIR_LOAD(64 * h + 32);
    __m512i qh = Q6K_PAIR_LOAD(Q6K_QH_AT + 32 * h);
#undef Q6K_PAIR_LOAD
    __m512i low = _mm512_set1_epi8(15), high = _mm512_set1_epi8(3 << 4);
    __m512i off = _mm512_set1_epi8(32);
    __m512i lo[4] = {l0, l1, _mm512_srli_epi16(l0, 4), _mm512_srli_epi16(l1, 4)};
    __m512i hi[4] = {_mm512_slli_epi16(qh, 4), _mm512_slli_epi16(qh, 2), qh,
                     _mm512_srli_epi16(qh, 2)};
    for (int j = 0; j < 4; j++) {
        out[j] = _mm512_or_si512(_mm512_and_si512(lo[j], low), _mm512_and_si512(hi[j], high));
        if (!unsigned_q)
            out[j] = _mm512_sub_epi8(out[j], off);
    }
}

__attribute__((target("avx512f,avx512bw,avx2"), always_inline))
static inline void q6k_half_pair_zmm(const uint8_t *a, const uint8_t *b, int h, __m512i out[4])
{
    q6k_half_pair_zmm_q(a, b, h, 0, out);
}

#endif
