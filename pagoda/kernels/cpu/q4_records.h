/*
 * q4_gemv's repacked int4 layout: written by q4_gemv.c's q4_repack and q4_repack_kq, read by
 * its products and by dequant.c's widening (pagoda/kernels/cpu/native.py keys their builds on this
 * header too).
 *
 * Rows in tiles of Q4R_TILE; per (tile, block of 32) one record: Q4R_TILE x 16 bytes of
 * nibbles (byte j holds element j low and element j + 16 high, so one mask and one shift give
 * the 32 weights in order), then the tile rows' scales and mins in one of three formats:
 *
 *   Q4R_FP32  4 fp32 scales, 4 fp32 mins: 96-byte records, 0.75 bytes a weight.
 *   Q4R_FP16  4 fp16 scales, 4 fp16 mins: 80 bytes, 0.625 a weight, for weights whose scales
 *             and mins fp16 holds exactly (GGUF's Q4_0 and Q4_1 store them so).
 *   Q4R_KQ    GGUF Q4_K's own: 4 six-bit sub-block scales sc and 4 six-bit sub-block mins m as
 *             bytes (72-byte records), and per (tile, super-block of 8 blocks) a 16-byte head
 *             of the 4 rows' fp16 d and 4 fp16 dmin before its 8 records: 592 bytes per 1,024
 *             weights, 0.578 a weight (the file's own is 0.5625). scale = d * sc and
 *             min = -(dmin * m) are rebuilt in fp32, where 11 x 6 bits are exact: the same
 *             bits as Q4R_FP32 records of the same weight.
 *
 * The format is not stored in the bytes: every call that reads them takes it. A tile's
 * records are contiguous, so a tile streams from memory once. Rows past N are zero.
 */
#ifndef PAGODA_Q4_RECORDS_H
#define PAGODA_Q4_RECORDS_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "half_float.h"

#define Q4R_TILE 4
#define Q4R_BLOCK 32
#define Q4R_NIBBLE_BYTES (Q4R_BLOCK / 2)
#define Q4R_NIBBLES (Q4R_TILE * Q4R_NIBBLE_BYTES)
/* Q4R_KQ: blocks per super-block, the head before them, and one super-block's bytes. */
#define Q4R_KQ_BLOCKS 8
#define Q4R_KQ_HEAD (2 * Q4R_TILE * (int)sizeof(uint16_t))
#define Q4R_KQ_RECORD (Q4R_NIBBLES + 2 * Q4R_TILE)
#define Q4R_KQ_SUPER (Q4R_KQ_HEAD + Q4R_KQ_BLOCKS * Q4R_KQ_RECORD)

enum { Q4R_FP32 = 0, Q4R_FP16 = 1, Q4R_KQ = 2 };

/* Whether fmt is a format, and k (a multiple of 32) fits it: Q4R_KQ needs whole super-blocks. */
static inline int q4r_format_ok(int fmt, int k)
{
    return fmt == Q4R_FP32 || fmt == Q4R_FP16 || (fmt == Q4R_KQ && k % (Q4R_KQ_BLOCKS * 32) == 0);
}

static inline size_t q4r_record_bytes(int fmt)
{
    if (fmt == Q4R_KQ)
        return Q4R_KQ_RECORD;
    return Q4R_NIBBLES + 2 * Q4R_TILE * (fmt == Q4R_FP16 ? sizeof(uint16_t) : sizeof(float));
}

/* One tile's bytes: its `groups` records (and, in Q4R_KQ, its super-blocks' heads). */
static inline size_t q4r_tile_bytes(int fmt, int groups)
{
    if (fmt == Q4R_KQ)
        return (size_t)(groups / Q4R_KQ_BLOCKS) * Q4R_KQ_SUPER;
    return (size_t)groups * q4r_record_bytes(fmt);
}

/* Block g's record in a tile. */
static inline const uint8_t *q4r_record(const uint8_t *tile, int fmt, int g)
{
    if (fmt == Q4R_KQ)
        return tile + (size_t)(g / Q4R_KQ_BLOCKS) * Q4R_KQ_SUPER + Q4R_KQ_HEAD
               + (size_t)(g % Q4R_KQ_BLOCKS) * Q4R_KQ_RECORD;
    return tile + (size_t)g * q4r_record_bytes(fmt);
}

static inline float q4r_f16_at(const uint8_t *p, int i)
{
    uint16_t h;
    memcpy(&h, p + i * sizeof(h), sizeof(h));
    return f16_to_f32(h);
}

/* Block g's scale of tile row i (0 .. Q4R_TILE - 1), or its min (Q4R_TILE + r). */
static inline float q4r_param(const uint8_t *tile, int fmt, int g, int i)
{
    const uint8_t *params = q4r_record(tile, fmt, g) + Q4R_NIBBLES;
    if (fmt == Q4R_FP16)
        return q4r_f16_at(params, i);
    if (fmt == Q4R_KQ) {
        const uint8_t *head = tile + (size_t)(g / Q4R_KQ_BLOCKS) * Q4R_KQ_SUPER;
        float scaled = q4r_f16_at(head, i) * (float)params[i];
        return i < Q4R_TILE ? scaled : -scaled;
    }
    float f;
    memcpy(&f, params + i * sizeof(f), sizeof(f));
    return f;
}

/* Block g's record; its scales (read in place from fp32 records, else rebuilt into buf) into
 * *scales, its mins as a vector into *mins. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline const uint8_t *q4r_params_vec(const uint8_t *tile, int fmt, int g,
                                            float buf[Q4R_TILE], const float **scales,
                                            __m128 *mins)
{
    const uint8_t *rec = q4r_record(tile, fmt, g), *params = rec + Q4R_NIBBLES;
    if (fmt == Q4R_FP32) {
        *mins = _mm_loadu_ps((const float *)params + Q4R_TILE);
        *scales = (const float *)params;
        return rec;
    }
    if (fmt == Q4R_FP16) {
        _mm_storeu_ps(buf, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)params)));
        *mins = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(params + 2 * Q4R_TILE)));
        *scales = buf;
        return rec;
    }
    const uint8_t *head = tile + (size_t)(g / Q4R_KQ_BLOCKS) * Q4R_KQ_SUPER;
    int32_t sc, m;
    memcpy(&sc, params, sizeof(sc));
    memcpy(&m, params + Q4R_TILE, sizeof(m));
    __m128 d = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)head));
    __m128 dmin = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(head + Q4R_KQ_HEAD / 2)));
    __m128 scf = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(sc)));
    __m128 mf = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(m)));
    _mm_storeu_ps(buf, _mm_mul_ps(d, scf));
    *mins = _mm_xor_ps(_mm_mul_ps(dmin, mf), _mm_set1_ps(-0.0f));
    *scales = buf;
    return rec;
}

#endif
