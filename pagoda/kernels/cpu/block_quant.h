/*
 * What the integer-dot-product kernels (q4_gemv.c, q8_gemv.c) share: which
 * instruction sets this CPU has, activations quantized per block of 32 to int8 or int16
 * (s_x = max|x| / 127 or / 32767, rounded to nearest even, and the block's sum of the rounded
 * x, s_x * sum q_x, for weights with mins), a horizontal sum, and the OpenMP row split.
 *
 * The AVX2 quantizers divide by s_x (not multiply by 1/s_x) so that they round exactly as the
 * scalar ones do: a kernel's scalar fallback and its vector body see the same integers.
 */
#ifndef PAGODA_BLOCK_QUANT_H
#define PAGODA_BLOCK_QUANT_H

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define BQ_BLOCK 32
#define BQ_SUPER 256
#define BQ_I8_MAX 127.0f
#define BQ_I16_MAX 32767.0f

enum { BQ_ISA_SCALAR = 0, BQ_ISA_AVX2 = 1, BQ_ISA_AVX512_VNNI = 2 };

static inline int bq_cpu_has(int isa)
{
    __builtin_cpu_init();
    switch (isa) {
    case BQ_ISA_SCALAR:
        return 1;
    /* F16C too: q4_gemv's compact records hold fp16 scales (every AVX2 CPU has it). */
    case BQ_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
            && __builtin_cpu_supports("f16c");
    case BQ_ISA_AVX512_VNNI:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
            && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni")
            && __builtin_cpu_supports("f16c");
    default:
        return 0;
    }
}

static inline int bq_best_isa(void)
{
    if (bq_cpu_has(BQ_ISA_AVX512_VNNI))
        return BQ_ISA_AVX512_VNNI;
    return bq_cpu_has(BQ_ISA_AVX2) ? BQ_ISA_AVX2 : BQ_ISA_SCALAR;
}

/* isa < 0 means the best this CPU has; an isa it lacks is refused (-1), never emulated. */
static inline int bq_resolve_isa(int isa)
{
    if (isa < 0)
        return bq_best_isa();
    return bq_cpu_has(isa) ? isa : -1;
}

/* ---- scalar ------------------------------------------------------------------------------ */

static inline float bq_amax_scalar(const float *v, int n)
{
    float amax = 0.0f;
    for (int j = 0; j < n; j++)
        amax = fmaxf(amax, fabsf(v[j]));
    return amax;
}

static inline float bq_block_scale(const float *v, float levels)
{
    return bq_amax_scalar(v, BQ_BLOCK) / levels;
}

/* A block of 32 values rounded to int8 by the scale d (0: all zeros) given. */
static inline void bq_quantize8_by_scalar(const float *v, float d, int8_t *q, float *scale,
                                          float *sum)
{
    int32_t qsum = 0;
    for (int j = 0; j < BQ_BLOCK; j++) {
        q[j] = d == 0.0f ? 0 : (int8_t)nearbyintf(v[j] / d);
        qsum += q[j];
    }
    *scale = d;
    *sum = d * (float)qsum;
}

static inline void bq_quantize8_scalar(const float *v, int8_t *q, float *scale, float *sum)
{
    bq_quantize8_by_scalar(v, bq_block_scale(v, BQ_I8_MAX), q, scale, sum);
}

static inline void bq_quantize16_scalar(const float *v, int16_t *q, float *scale, float *sum)
{
    float d = bq_block_scale(v, BQ_I16_MAX);
    int32_t qsum = 0;
    for (int j = 0; j < BQ_BLOCK; j++) {
        q[j] = d == 0.0f ? 0 : (int16_t)nearbyintf(v[j] / d);
        qsum += q[j];
    }
    *scale = d;
    *sum = d * (float)qsum;
}

/* ---- AVX2 -------------------------------------------------------------------------------- */

#define BQ_HSUM256(v, out)                                                                 \
    do {                                                                                   \
        __m128 h_ = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));     \
        h_ = _mm_add_ps(h_, _mm_movehl_ps(h_, h_));                                        \
        h_ = _mm_add_ss(h_, _mm_movehdup_ps(h_));                                          \
        (out) = _mm_cvtss_f32(h_);                                                         \
    } while (0)

/* The largest |v| of n values (n a multiple of 8). */
__attribute__((target("avx2,fma"), always_inline))
static inline float bq_amax_avx2(const float *v, int n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8)
        a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    __m128 a4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    a4 = _mm_max_ps(a4, _mm_movehl_ps(a4, a4));
    a4 = _mm_max_ss(a4, _mm_movehdup_ps(a4));
    return _mm_cvtss_f32(a4);
}

/* 32 values divided by d (non-zero) and rounded to the nearest integer, even on ties, in four
 * vectors of 8. */
__attribute__((target("avx2,fma"), always_inline))
static inline void bq_round_by_avx2(const float *v, float d, __m256i out[4])
{
    const __m256 dv = _mm256_set1_ps(d);
    const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (int i = 0; i < 4; i++)
        out[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(v + 8 * i), dv),
                                                    mode));
}

/* The block's 32 values rounded to integers (in four vectors of 8) and its scale; 0 where the
 * block is all zeros (then nothing is rounded). */
__attribute__((target("avx2,fma"), always_inline))
static inline float bq_round_block_avx2(const float *v, float levels, __m256i out[4])
{
    float d = bq_amax_avx2(v, BQ_BLOCK) / levels;
    if (d != 0.0f)
        bq_round_by_avx2(v, d, out);
    return d;
}

/* Four vectors of 8 int32 (each within int16) stored as 32 int16 in order. */
__attribute__((target("avx2,fma"), always_inline))
static inline void bq_store16_avx2(int16_t *q, const __m256i i[4])
{
    /* packs interleaves 128-bit lanes; a 64-bit permute puts the 16 values back in order. */
    _mm256_storeu_si256((__m256i *)q, _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xD8));
    _mm256_storeu_si256((__m256i *)(q + 16),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), 0xD8));
}

__attribute__((target("avx2,fma"), always_inline))
static inline int32_t bq_sum_rounded_avx2(const __m256i i[4])
{
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s4);
}

/* A block of 32 values rounded to int8 by the scale d (0: all zeros) given. */
__attribute__((target("avx2,fma")))
static inline void bq_quantize8_by_avx2(const float *v, float d, int8_t *q, float *scale,
                                        float *sum)
{
    *scale = d;
    if (d == 0.0f) {
        memset(q, 0, BQ_BLOCK);
        *sum = 0.0f;
        return;
    }
    __m256i i[4];
    bq_round_by_avx2(v, d, i);
    /* The packs interleave 128-bit lanes; one permute puts the 32 bytes back in order. */
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, b);
    *sum = d * (float)bq_sum_rounded_avx2(i);
}

__attribute__((target("avx2,fma")))
static inline void bq_quantize8_avx2(const float *v, int8_t *q, float *scale, float *sum)
{
    bq_quantize8_by_avx2(v, bq_amax_avx2(v, BQ_BLOCK) / BQ_I8_MAX, q, scale, sum);
}

__attribute__((target("avx2,fma")))
static inline void bq_quantize16_avx2(const float *v, int16_t *q, float *scale, float *sum)
{
    __m256i i[4];
    float d = bq_round_block_avx2(v, BQ_I16_MAX, i);
    *scale = d;
    if (d == 0.0f) {
        memset(q, 0, BQ_BLOCK * sizeof(int16_t));
        *sum = 0.0f;
        return;
    }
    bq_store16_avx2(q, i);
    *sum = d * (float)bq_sum_rounded_avx2(i);
}

/* x fp32 [m, k] -> xq [m, k] (int8 or int16 by `wide`), xscale and xsum fp32 [m, k / 32]. */
static inline void bq_quantize_rows(int isa, int wide, const float *x, int m, int k, void *xq,
                                    float *xscale, float *xsum)
{
    size_t blocks = (size_t)m * (k / BQ_BLOCK);
    for (size_t b = 0; b < blocks; b++) {
        const float *v = x + b * BQ_BLOCK;
        if (wide) {
            int16_t *q = (int16_t *)xq + b * BQ_BLOCK;
            if (isa == BQ_ISA_SCALAR)
                bq_quantize16_scalar(v, q, xscale + b, xsum + b);
            else
                bq_quantize16_avx2(v, q, xscale + b, xsum + b);
        } else {
            int8_t *q = (int8_t *)xq + b * BQ_BLOCK;
            if (isa == BQ_ISA_SCALAR)
                bq_quantize8_scalar(v, q, xscale + b, xsum + b);
            else
                bq_quantize8_avx2(v, q, xscale + b, xsum + b);
        }
    }
}

__attribute__((target("avx2,fma")))
static inline float bq_amax_super_avx2(const float *v) { return bq_amax_avx2(v, BQ_SUPER); }

/* As bq_quantize_rows to int8 (k a multiple of 256), each 256 values of a row (a GGUF
 * super-block's width) by one scale, s_x = max|x| / 127 over them, as llama.cpp's Q8_K
 * activations are: every block of the 8 still gets its own scale and sum entries (equal
 * scales), so a kernel reading blocks reads them as it reads per-block ones. */
static inline void bq_quantize_rows_super8(int isa, const float *x, int m, int k, int8_t *xq,
                                           float *xscale, float *xsum)
{
    size_t supers = (size_t)m * (k / BQ_SUPER);
    for (size_t s = 0; s < supers; s++) {
        const float *v = x + s * BQ_SUPER;
        float d = (isa == BQ_ISA_SCALAR ? bq_amax_scalar(v, BQ_SUPER)
                                        : bq_amax_super_avx2(v)) / BQ_I8_MAX;
        for (int j = 0; j < BQ_SUPER / BQ_BLOCK; j++) {
            size_t b = s * (BQ_SUPER / BQ_BLOCK) + j;
            if (isa == BQ_ISA_SCALAR)
                bq_quantize8_by_scalar(v + j * BQ_BLOCK, d, xq + b * BQ_BLOCK, xscale + b,
                                       xsum + b);
            else
                bq_quantize8_by_avx2(v + j * BQ_BLOCK, d, xq + b * BQ_BLOCK, xscale + b,
                                     xsum + b);
        }
    }
}

/* ---- dot products ------------------------------------------------------------------------- */

/* 32 u8 x s8 products summed in fours into 8 int32 lanes: AVX2's maddubs (pairs summed in s16,
 * which the callers' ranges cannot saturate) then madd against ones, or VNNI's dpbusd doing
 * both at once. */
__attribute__((target("avx2,fma"), always_inline))
static inline __m256i bq_dot8_avx2(__m256i u8, __m256i s8)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1));
}

__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma"), always_inline))
static inline __m256i bq_dot8_vnni(__m256i u8, __m256i s8)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u8, s8);
}

/* 32 s16 x s16 products (as two halves of 16) summed in fours into 8 int32 lanes. */
__attribute__((target("avx2,fma"), always_inline))
static inline __m256i bq_dot16_avx2(__m256i w_lo, __m256i w_hi, __m256i x_lo, __m256i x_hi)
{
    return _mm256_add_epi32(_mm256_madd_epi16(w_lo, x_lo), _mm256_madd_epi16(w_hi, x_hi));
}

__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma"), always_inline))
static inline __m256i bq_dot16_vnni(__m256i w_lo, __m256i w_hi, __m256i x_lo, __m256i x_hi)
{
    return _mm256_dpwssd_epi32(_mm256_madd_epi16(w_lo, x_lo), w_hi, x_hi);
}

/* Each int32 lane's low int16 copied to its high one. */
__attribute__((target("avx2,fma"), always_inline))
static inline __m256i bq_twice16(__m256i v)
{
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)),
                           _mm256_slli_epi32(v, 16));
}

/* ---- 512 bits: two weight rows a register (AVX-512 VNNI) ---------------------------------
 * Lanes 0-7 of a 512-bit register hold one row's 8 sums exactly as a 256-bit body's lanes do,
 * lanes 8-15 the next row's; each half is summed as BQ_HSUM256 sums a 256-bit register, so a
 * 512-bit body gives the 256-bit body's bits. */
#define BQ_ZMM_TARGET "avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c"

__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline float bq_hsum_half(__m512 v, int upper)
{
    __m256 h = upper ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))
                     : _mm512_castps512_ps256(v);
    float s;
    BQ_HSUM256(h, s);
    return s;
}

/* a in lanes 0-7, b in lanes 8-15. */
__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline __m512 bq_pair(float a, float b)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(a))),
        _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}

/* ---- threads ----------------------------------------------------------------------------- */

/* How many contiguous chunks a team of `team` threads splits `units` into: one a thread for
 * small counts, else chunks of BQ_CHUNK_UNITS taken as threads come free, so a thread that
 * streams its memory faster, or whose core is not interrupted, takes more (on a 2-core VM the
 * second thread of a 1B decode waited 28% of its time at equal shares). A chunk is still
 * contiguous, so each thread streams its own rows. */
#define BQ_CHUNK_UNITS 32
#define BQ_CHUNKS_A_THREAD 8

static inline int bq_team_chunks(int units, int team)
{
    if (units < BQ_CHUNK_UNITS * BQ_CHUNKS_A_THREAD * team)
        return team;
    return (units + BQ_CHUNK_UNITS - 1) / BQ_CHUNK_UNITS;
}

/* Chunk c of `chunks` equal ones over [0, units): [*begin, *end), empty past the end. */
static inline int bq_chunk_bounds(int c, int chunks, int units, int *begin, int *end)
{
    int per = (units + chunks - 1) / chunks;
    *begin = c * per < units ? c * per : units;
    *end = *begin + per < units ? *begin + per : units;
    return *begin < *end;
}

/* CALL (which reads `begin` and `end`) over every chunk of [0, units) on the OpenMP team of
 * `n_threads` (a variable of that name in the caller), chunks handed out as threads ask. Which
 * thread computes a chunk never changes its bits. */
#define BQ_TEAM_SPLIT(units, CALL)                                                          \
    do {                                                                                    \
        int chunks_ = bq_team_chunks((units), n_threads);                                   \
        _Pragma("omp parallel for num_threads(n_threads) schedule(dynamic, 1)")             \
        for (int c_ = 0; c_ < chunks_; c_++) {                                              \
            int begin, end;                                                                 \
            if (bq_chunk_bounds(c_, chunks_, (units), &begin, &end))                        \
                CALL;                                                                       \
        }                                                                                   \
    } while (0)

#endif
