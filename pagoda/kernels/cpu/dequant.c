/*
 * int4 weights in the engine's canonical layout (Int4Weight: uint8 [n, k / 2], element 2j in
 * the low nibble of byte j and 2j + 1 in the high one; a scale and a min per group of g
 * inputs, fp32 or fp16) widened to fp32 or bf16 rows:  w[n, k] = q * scale + min.
 *
 * Why: a prefill chunk of hundreds of rows is faster as one fp32 GEMM than through a
 * weight-only int4 kernel, but only if widening the layer costs little next to the GEMM.
 * torch's composition of the same math (unpack, stack, addcmul, copy) runs at ~17 ns per
 * weight here; this runs at memory speed. Plain C, C ABI; rows are split across torch's
 * OpenMP team (pagoda/kernels/cpu/native.py binds the library to torch's runtime).
 */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "half_float.h"
#include "q4_records.h"
#include "iq4_xs_blocks.h"
#include "q3_k_blocks.h"
#include "q5_k_blocks.h"
#include "q6_k_blocks.h"

enum { DQ_FP32 = 0, DQ_BF16 = 1 };

static int has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
        && __builtin_cpu_supports("f16c");
}

/* What int4's 512-bit paths use: 16 fp32 per register and the BF16 extension's conversion of
 * two of them to 32 bf16 in one instruction. */
static int has_avx512(void)
{
    __builtin_cpu_init();
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

/* Fewer weights than this widen on the calling thread: a decode step's embedding rows and the
 * vocabulary's 32 candidates for exact logits (pagoda/engine/layers/lm_head.py), which take tens of
 * microseconds, less than a team's start and join around them. */
#define PARALLEL_FROM_WEIGHTS (1L << 17)

static int team_for(int threads, int n, int k)
{
    return threads > 1 && (long)n * k >= PARALLEL_FROM_WEIGHTS ? threads : 1;
}

static float param(const void *values, int is_half, size_t i)
{
    return is_half ? f16_to_f32(((const uint16_t *)values)[i]) : ((const float *)values)[i];
}

static void store1(float w, int out_dtype, void *out, size_t at)
{
    if (out_dtype == DQ_FP32)
        ((float *)out)[at] = w;
    else
        ((uint16_t *)out)[at] = f32_to_bf16(w);
}

/* The arguments every entry point shares: an output dtype it writes, and an instruction set
 * it has (isa -1 the best, 0 scalar, 1 AVX2, 2 AVX-512 with BF16), up to the entry point's
 * own best, max_isa. */
static int target_ok(int out_dtype, int isa, int max_isa)
{
    return (out_dtype == DQ_FP32 || out_dtype == DQ_BF16) && isa >= -1 && isa <= max_isa
        && (isa != 1 || has_avx2()) && (isa != 2 || has_avx512());
}

static void row_scalar(const uint8_t *packed, const void *scales, const void *mins, int halves,
                       size_t row, int k, int group, int out_dtype, void *out)
{
    int groups = k / group;
    for (int e = 0; e < k; e++) {
        uint8_t byte = packed[row * (size_t)(k / 2) + e / 2];
        int q = (e % 2) ? byte >> 4 : byte & 15;
        size_t g = row * (size_t)groups + e / group;
        /* One rounding, as the vector path (and torch's addcmul) fuses the multiply-add. */
        float w = fmaf((float)q, param(scales, halves & 1, g), param(mins, halves & 2, g));
        store1(w, out_dtype, out, row * (size_t)k + e);
    }
}

__attribute__((target("avx2,fma,f16c")))
static void store8(__m256 w, int out_dtype, void *out, size_t at)
{
    if (out_dtype == DQ_FP32) {
        _mm256_storeu_ps((float *)out + at, w);
        return;
    }
    /* bf16, nearest even: add 0x7fff + the lowest kept bit, keep the high half. */
    __m256i bits = _mm256_castps_si256(w);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(w, w, _CMP_UNORD_Q));
    rounded = _mm256_blendv_epi8(rounded, _mm256_or_si256(bits, _mm256_set1_epi32(0x400000)),
                                 nan);
    __m256i high = _mm256_srli_epi32(rounded, 16);
    __m128i packed16 = _mm_packus_epi32(_mm256_castsi256_si128(high),
                                        _mm256_extracti128_si256(high, 1));
    _mm_storeu_si128((__m128i *)((uint16_t *)out + at), packed16);
}

/* One row, groups of a multiple of 32: 16 bytes -> 32 weights in order per step. */
__attribute__((target("avx2,fma,f16c")))
static void row_avx2(const uint8_t *packed, const void *scales, const void *mins, int halves,
                     size_t row, int k, int group, int out_dtype, void *out)
{
    const uint8_t *src = packed + row * (size_t)(k / 2);
    int groups = k / group;
    const __m128i low_mask = _mm_set1_epi8(15);
    for (int g = 0; g < groups; g++) {
        size_t gi = row * (size_t)groups + g;
        __m256 scale = _mm256_set1_ps(param(scales, halves & 1, gi));
        __m256 min = _mm256_set1_ps(param(mins, halves & 2, gi));
        for (int e = g * group; e < (g + 1) * group; e += 32) {
            __m128i bytes = _mm_loadu_si128((const __m128i *)(src + e / 2));
            __m128i lo = _mm_and_si128(bytes, low_mask);
            __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_mask);
            /* Elements in order: byte j gives 2j (low) then 2j + 1 (high). */
            __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
            __m128i parts[4] = {first, _mm_srli_si128(first, 8), second,
                                _mm_srli_si128(second, 8)};
            for (int p = 0; p < 4; p++) {
                __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
                store8(_mm256_fmadd_ps(q, scale, min), out_dtype, out,
                       row * (size_t)k + e + 8 * p);
            }
        }
    }
}

/* 32 weights (lo: the first 16 as bytes, hi: the next 16) times one scale plus one min, stored
 * as fp32 or as bf16 (round to nearest even, as torch's; the BF16 conversion reads an fp32
 * denormal as zero where torch keeps it. No GGUF int4 weight is one: with fp16 scales and mins
 * (Q4_0, Q4_1, Q4_K) a weight is 0 or at least 2^-24 in size. With fp32 ones only a group
 * whose weights are all below 2^-126 in size could give one, and its bf16 would be a denormal
 * against our zero.) */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c"), always_inline))
static inline void store32_avx512(__m128i lo, __m128i hi, float scale, float min,
                                  int out_dtype, void *out, size_t at)
{
    __m512 s = _mm512_set1_ps(scale), m = _mm512_set1_ps(min);
    __m512 first = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), s, m);
    __m512 second = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), s, m);
    if (out_dtype == DQ_FP32) {
        _mm512_storeu_ps((float *)out + at, first);
        _mm512_storeu_ps((float *)out + at + 16, second);
        return;
    }
    __m512bh both = _mm512_cvtne2ps_pbh(second, first);
    _mm512_storeu_si512((void *)((uint16_t *)out + at), (__m512i)both);
}

/* param() with F16C's conversion of an fp16 value (exact, as f16_to_f32), a few cycles where
 * the portable one takes tens: per 32 weights it was most of a row's time. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline float param_f16c(const void *values, int is_half, size_t i)
{
    return is_half ? _cvtsh_ss(((const uint16_t *)values)[i]) : ((const float *)values)[i];
}

/* One row with 512-bit registers, groups of a multiple of 32: 32 weights a step, each step
 * reading its group's scale and min. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
static void row_avx512(const uint8_t *packed, const void *scales, const void *mins, int halves,
                       size_t row, int k, int group, int out_dtype, void *out)
{
    const uint8_t *src = packed + row * (size_t)(k / 2);
    size_t first_group = row * (size_t)(k / group);
    for (int e = 0; e < k; e += 32) {
        __m128i bytes = _mm_loadu_si128((const __m128i *)(src + e / 2));
        __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(15));
        __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15));
        size_t gi = first_group + (size_t)(e / group);
        /* Byte j holds element 2j low and 2j + 1 high: interleaved, they are in order. */
        store32_avx512(_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi),
                       param_f16c(scales, halves & 1, gi), param_f16c(mins, halves & 2, gi),
                       out_dtype, out, row * (size_t)k + e);
    }
}

/* halves: bit 0 set if scales are fp16, bit 1 if mins are (else fp32). out: fp32 or bf16
 * [n, k], contiguous. isa: -1 the best this CPU has, 0 scalar, 1 AVX2, 2 AVX-512 with BF16
 * (refused where the CPU lacks it). Returns 0, or -1 for arguments it refuses. */
int dq_int4(const uint8_t *packed, const void *scales, const void *mins, int halves,
            int n, int k, int group, int out_dtype, void *out, int isa, int threads)
{
    if (n <= 0 || k <= 0 || k % 2 || group <= 0 || k % group || !target_ok(out_dtype, isa, 2))
        return -1;
    int vector = isa != 0 && has_avx2() && group % 32 == 0;
    int wide = vector && (isa == 2 || (isa == -1 && has_avx512()));
#pragma omp parallel for num_threads(team_for(threads, n, k)) schedule(static) \
    if (team_for(threads, n, k) > 1)
    for (int row = 0; row < n; row++) {
        if (wide)
            row_avx512(packed, scales, mins, halves, (size_t)row, k, group, out_dtype, out);
        else if (vector)
            row_avx2(packed, scales, mins, halves, (size_t)row, k, group, out_dtype,
                     out);
        else
            row_scalar(packed, scales, mins, halves, (size_t)row, k, group, out_dtype,
                       out);
    }
    return 0;
}

int dq_has_vector_path(void) { return has_avx2(); }

int dq_has_avx512_path(void) { return has_avx512(); }

/* ---- grouped int8 (Int8Weight with group_size: GGUF's Q8_0, "int8" on load) ------------ */

static void row_int8_scalar(const int8_t *q, const float *scales, const float *mins,
                            size_t row, int k, int group, int out_dtype, void *out)
{
    int groups = k / group;
    for (int e = 0; e < k; e++) {
        size_t g = row * (size_t)groups + e / group, at = row * (size_t)k + e;
        float v = (float)q[at];
        /* torch's q * scale without a min, addcmul (one rounding) with one. */
        float w = mins ? fmaf(v, scales[g], mins[g]) : v * scales[g];
        store1(w, out_dtype, out, at);
    }
}

__attribute__((target("avx2,fma,f16c")))
static void row_int8_avx2(const int8_t *q, const float *scales, const float *mins,
                          size_t row, int k, int group, int out_dtype, void *out)
{
    int groups = k / group;
    for (int g = 0; g < groups; g++) {
        size_t gi = row * (size_t)groups + g;
        __m256 scale = _mm256_set1_ps(scales[gi]);
        __m256 min = _mm256_set1_ps(mins ? mins[gi] : 0.0f);
        for (int e = g * group; e < (g + 1) * group; e += 8) {
            size_t at = row * (size_t)k + e;
            __m128i bytes = _mm_loadl_epi64((const __m128i *)(q + at));
            __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
            __m256 w = mins ? _mm256_fmadd_ps(v, scale, min) : _mm256_mul_ps(v, scale);
            store8(w, out_dtype, out, at);
        }
    }
}

/* q int8 [n, k]; scales fp32 [n, k / group]; mins fp32 [n, k / group] or NULL. */
int dq_int8(const int8_t *q, const float *scales, const float *mins, int n, int k, int group,
            int out_dtype, void *out, int isa, int threads)
{
    if (n <= 0 || k <= 0 || group <= 0 || k % group || !target_ok(out_dtype, isa, 1))
        return -1;
    int vector = isa != 0 && has_avx2() && group % 8 == 0;
#pragma omp parallel for num_threads(team_for(threads, n, k)) schedule(static) \
    if (team_for(threads, n, k) > 1)
    for (int row = 0; row < n; row++) {
        if (vector)
            row_int8_avx2(q, scales, mins, (size_t)row, k, group, out_dtype, out);
        else
            row_int8_scalar(q, scales, mins, (size_t)row, k, group, out_dtype, out);
    }
    return 0;
}

/* ---- int4 in q4_gemv's repacked layout (pagoda/kernels/cpu/q4_records.h) -----------------------
 * Widening from it lets a layer that runs q4_gemv keep no second copy for the steps that run
 * a GEMM. */

static const uint8_t *rp_tile(const uint8_t *data, int fmt, size_t row, int groups)
{
    return data + (row / Q4R_TILE) * q4r_tile_bytes(fmt, groups);
}

static void rp_row_scalar(const uint8_t *data, int fmt, size_t row, int k, int out_dtype,
                          void *out)
{
    int groups = k / 32, r = (int)(row % Q4R_TILE);
    const uint8_t *tile = rp_tile(data, fmt, row, groups);
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = q4r_record(tile, fmt, g);
        float scale = q4r_param(tile, fmt, g, r), min = q4r_param(tile, fmt, g, Q4R_TILE + r);
        for (int e = 0; e < 32; e++) {
            uint8_t byte = rec[r * 16 + e % 16];
            int q = e < 16 ? byte & 15 : byte >> 4;
            float w = fmaf((float)q, scale, min);
            size_t at = row * (size_t)k + (size_t)g * 32 + e;
            store1(w, out_dtype, out, at);
        }
    }
}

__attribute__((target("avx2,fma,f16c")))
static void rp_row_avx2(const uint8_t *data, int fmt, size_t row, int k, int out_dtype,
                        void *out)
{
    int groups = k / 32, r = (int)(row % Q4R_TILE);
    const uint8_t *tile = rp_tile(data, fmt, row, groups);
    const __m128i low_mask = _mm_set1_epi8(15);
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = q4r_record(tile, fmt, g);
        __m256 scale = _mm256_set1_ps(q4r_param(tile, fmt, g, r));
        __m256 min = _mm256_set1_ps(q4r_param(tile, fmt, g, Q4R_TILE + r));
        __m128i bytes = _mm_loadu_si128((const __m128i *)(rec + r * 16));
        __m128i lo = _mm_and_si128(bytes, low_mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_mask);
        __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int p = 0; p < 4; p++) {
            __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
            store8(_mm256_fmadd_ps(q, scale, min), out_dtype, out,
                   row * (size_t)k + (size_t)g * 32 + 8 * p);
        }
    }
}

/* One tile's rows (those below n) with 512-bit registers, a record's scales and mins read
 * once for its four rows: about a fifth of the instructions of rp_row_avx2, which read them
 * one row at a time in scalar code. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
static void rp_tile_avx512(const uint8_t *data, int fmt, size_t t, int n, int k, int out_dtype,
                           void *out)
{
    int groups = k / 32, rows = n - (int)(t * Q4R_TILE);
    rows = rows < Q4R_TILE ? rows : Q4R_TILE;
    const uint8_t *tile = rp_tile(data, fmt, t * Q4R_TILE, groups);
    const __m128i low_mask = _mm_set1_epi8(15);
    for (int g = 0; g < groups; g++) {
        float buf[Q4R_TILE], mins[Q4R_TILE];
        const float *scales;
        __m128 min_vec;
        const uint8_t *rec = q4r_params_vec(tile, fmt, g, buf, &scales, &min_vec);
        _mm_storeu_ps(mins, min_vec);
        for (int r = 0; r < rows; r++) {
            __m128i bytes = _mm_loadu_si128((const __m128i *)(rec + r * Q4R_NIBBLE_BYTES));
            __m128i lo = _mm_and_si128(bytes, low_mask);
            __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_mask);
            size_t at = (t * Q4R_TILE + (size_t)r) * (size_t)k + (size_t)g * 32;
            store32_avx512(lo, hi, scales[r], mins[r], out_dtype, out, at);
        }
    }
}

/* data: q4_repacked_bytes(fmt, n, k) bytes from q4_repack or q4_repack_kq, fmt its record
 * format (q4_records.h); out: fp32 or bf16 [n, k]. */
int dq_q4_repacked(const uint8_t *data, int fmt, int n, int k, int out_dtype, void *out,
                   int isa, int threads)
{
    if (n <= 0 || k <= 0 || k % 32 || !q4r_format_ok(fmt, k) || !target_ok(out_dtype, isa, 2))
        return -1;
    if (isa == 2 || (isa == -1 && has_avx512())) {
        int tiles = (n + Q4R_TILE - 1) / Q4R_TILE;
#pragma omp parallel for num_threads(team_for(threads, n, k)) schedule(static) \
    if (team_for(threads, n, k) > 1)
        for (int t = 0; t < tiles; t++)
            rp_tile_avx512(data, fmt, (size_t)t, n, k, out_dtype, out);
        return 0;
    }
    int vector = isa != 0 && has_avx2();
#pragma omp parallel for num_threads(team_for(threads, n, k)) schedule(static) \
    if (team_for(threads, n, k) > 1)
    for (int row = 0; row < n; row++) {
        if (vector)
            rp_row_avx2(data, fmt, (size_t)row, k, out_dtype, out);
        else
            rp_row_scalar(data, fmt, (size_t)row, k, out_dtype, out);
    }
    return 0;
}

/* ---- GGUF Q6_K blocks (pagoda/kernels/cpu/q6_k_blocks.h), read in place ------------------------
 * w = (d * sc) * (q - 32) in fp32, the order of gguf's reference dequantization. */

static void q6k_row_scalar(const uint8_t *blocks, size_t row, int k, int out_dtype, void *out)
{
    const uint8_t *base = blocks + row * q6k_row_bytes(k);
    for (int g = 0; g < k / 32; g++) {
        const uint8_t *super = q6k_super(base, g);
        const int8_t *sc = q6k_scales(super, g);
        float d = q6k_d(super);
        int8_t q[32];
        q6k_block_scalar(super, g, q);
        for (int e = 0; e < 32; e++)
            store1(d * (float)sc[e / 16] * (float)q[e], out_dtype, out,
                   row * (size_t)k + (size_t)g * 32 + e);
    }
}

__attribute__((target("avx2,fma,f16c")))
static void q6k_row_avx2(const uint8_t *blocks, size_t row, int k, int out_dtype, void *out)
{
    const uint8_t *base = blocks + row * q6k_row_bytes(k);
    for (int g0 = 0; g0 < k / 32; g0 += 4) {
        const uint8_t *super = q6k_super(base, g0);
        float d = q6k_d_f16c(super);
        __m256i q[4];
        q6k_half_avx2(super, (g0 % Q6K_BLOCKS) / 4, q);
        for (int j = 0; j < 4; j++) {
            const int8_t *sc = q6k_scales(super, g0 + j);
            __m128i halves[2] = {_mm256_castsi256_si128(q[j]), _mm256_extracti128_si256(q[j], 1)};
            for (int p = 0; p < 4; p++) {
                __m128i eight = p % 2 ? _mm_srli_si128(halves[p / 2], 8) : halves[p / 2];
                __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
                __m256 s = _mm256_set1_ps(d * (float)sc[p / 2]);
                store8(_mm256_mul_ps(s, v), out_dtype, out,
                       row * (size_t)k + (size_t)(g0 + j) * 32 + 8 * p);
            }
        }
    }
}

/* blocks: n rows of k / 256 Q6_K super-blocks; out: fp32 or bf16 [n, k]. */
int dq_q6_k(const uint8_t *blocks, int n, int k, int out_dtype, void *out, int isa, int threads)
{
    if (n <= 0 || k <= 0 || k % Q6K_SUPER || !target_ok(out_dtype, isa, 1))
        return -1;
    int vector = isa != 0 && has_avx2();
#pragma omp parallel for num_threads(team_for(threads, n, k)) schedule(static) \
    if (team_for(threads, n, k) > 1)
    for (int row = 0; row < n; row++) {
        if (vector)
            q6k_row_avx2(blocks, (size_t)row, k, out_dtype, out);
        else
            q6k_row_scalar(blocks, (size_t)row, k, out_dtype, out);
    }
    return 0;
}

/* ---- GGUF IQ4_XS, Q5_K and Q3_K blocks (their headers), read in place ----------------------
 * Sub-blocks of 32 values with integer scales: w = (d * sc) * q - dmin * m in fp32 (Q5_K's
 * min; the others have none), the order of gguf's reference dequantization. Q3_K has a scale
 * per 16 values, the others one per 32. */

enum { SB_IQ4_XS = 0, SB_Q5_K = 1, SB_Q3_K = 2 };

static size_t sb_row_bytes(int fmt, int k)
{
    return fmt == SB_IQ4_XS ? iq4xs_row_bytes(k) : fmt == SB_Q5_K ? q5k_row_bytes(k)
                                                                  : q3k_row_bytes(k);
}

/* Sub-block j's float scale of each half (values 0..15, 16..31) and the min subtracted. */
static void sb_params(int fmt, const uint8_t *super, int j, float scale[2], float *min)
{
    *min = 0.0f;
    if (fmt == SB_IQ4_XS) {
        scale[0] = scale[1] = iq4xs_d(super) * (float)iq4xs_scale(super, j);
    } else if (fmt == SB_Q5_K) {
        scale[0] = scale[1] = q5k_d(super) * (float)q5k_scale(super, j, 0);
        *min = q5k_dmin(super) * (float)q5k_scale(super, j, 1);
    } else {
        float d = q3k_d(super);
        scale[0] = d * (float)q3k_scale(super, 2 * j);
        scale[1] = d * (float)q3k_scale(super, 2 * j + 1);
    }
}

static void sb_values_scalar(int fmt, const uint8_t *super, int j, int8_t q[32])
{
    if (fmt == SB_IQ4_XS)
        iq4xs_block_scalar(super, j, q);
    else if (fmt == SB_Q5_K)
        q5k_block_scalar(super, j, q);
    else
        q3k_block_scalar(super, j, q);
}

/* No fused multiply-add: the product is rounded before the min is taken, as gguf's is. */
__attribute__((optimize("fp-contract=off")))
static void sb_row_scalar(int fmt, const uint8_t *blocks, size_t row, int k, int out_dtype,
                          void *out)
{
    const uint8_t *base = blocks + row * sb_row_bytes(fmt, k);
    size_t super_bytes = sb_row_bytes(fmt, 256);
    for (int g = 0; g < k / 32; g++) {
        const uint8_t *super = base + (size_t)(g / 8) * super_bytes;
        float scale[2], min;
        int8_t q[32];
        sb_params(fmt, super, g % 8, scale, &min);
        sb_values_scalar(fmt, super, g % 8, q);
        for (int e = 0; e < 32; e++) {
            float w = scale[e / 16] * (float)q[e];
            store1(w - min, out_dtype, out, row * (size_t)k + (size_t)g * 32 + e);
        }
    }
}

__attribute__((target("avx2,fma,f16c"), optimize("fp-contract=off")))
static void sb_row_avx2(int fmt, const uint8_t *blocks, size_t row, int k, int out_dtype,
                        void *out)
{
    const uint8_t *base = blocks + row * sb_row_bytes(fmt, k);
    size_t super_bytes = sb_row_bytes(fmt, 256);
    for (int g = 0; g < k / 32; g++) {
        const uint8_t *super = base + (size_t)(g / 8) * super_bytes;
        int j = g % 8;
        float scale[2], min;
        sb_params(fmt, super, j, scale, &min);
        __m256i q = fmt == SB_IQ4_XS ? iq4xs_block_avx2(super, j)
                  : fmt == SB_Q5_K   ? q5k_block_avx2(super, j)
                                     : q3k_block_avx2(super, j);
        __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
        __m256 m = _mm256_set1_ps(min);
        for (int p = 0; p < 4; p++) {
            __m128i eight = p % 2 ? _mm_srli_si128(halves[p / 2], 8) : halves[p / 2];
            __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
            __m256 w = _mm256_mul_ps(_mm256_set1_ps(scale[p / 2]), v);
            store8(_mm256_sub_ps(w, m), out_dtype, out, row * (size_t)k + (size_t)g * 32 + 8 * p);
        }
    }
}

/* blocks: n rows of k / 256 super-blocks of format fmt (SB_*); out: fp32 or bf16 [n, k]. */
int dq_sub_blocks(const uint8_t *blocks, int fmt, int n, int k, int out_dtype, void *out,
                  int isa, int threads)
{
    if (fmt < SB_IQ4_XS || fmt > SB_Q3_K || n <= 0 || k <= 0 || k % 256
        || !target_ok(out_dtype, isa, 1))
        return -1;
    int vector = isa != 0 && has_avx2();
#pragma omp parallel for num_threads(team_for(threads, n, k)) schedule(static) \
    if (team_for(threads, n, k) > 1)
    for (int row = 0; row < n; row++) {
        if (vector)
            sb_row_avx2(fmt, blocks, (size_t)row, k, out_dtype, out);
        else
            sb_row_scalar(fmt, blocks, (size_t)row, k, out_dtype, out);
    }
    return 0;
}

/* ---- rows picked by index, on the calling thread ------------------------------------------
 * A decode step's embedding rows and the vocabulary's 32 candidates for exact logits take a few
 * kilobytes from each of a weight's tensors; torch's index_select splits even that over its
 * team, whose start and join cost more than the copy. */

/* dst [count, row_bytes] = src's rows at index (each in [0, n_rows)); -1 for an index outside,
 * before anything is copied. */
int dq_take_rows(const uint8_t *src, long row_bytes, long n_rows, const int64_t *index, int count,
                 uint8_t *dst)
{
    if (row_bytes <= 0 || n_rows < 0 || count < 0)
        return -1;
    for (int i = 0; i < count; i++)
        if (index[i] < 0 || index[i] >= n_rows)
            return -1;
    for (int i = 0; i < count; i++)
        memcpy(dst + (size_t)i * row_bytes, src + (size_t)index[i] * row_bytes, (size_t)row_bytes);
    return 0;
}
