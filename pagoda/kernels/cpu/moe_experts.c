/*
 * A mixture-of-experts layer's routed experts for one step, in one call: every active expert's
 * GGUF blocks read in place (a view of the file's memory map, or any caller's rows), once for
 * all the step's rows routed to it.
 *
 *   for each expert e and each row r routed to it (slot s of r's top k):
 *     h = act(x[r] @ gate_e.T (+ b), x[r] @ up_e.T (+ b))       gate and up in one pass
 *     out[r] += weight[r, s] * (h @ down_e.T (+ b))
 *
 * act is SiLU (silu(g) * u) or gpt-oss's clamped SwiGLU: g = min(g, limit), u in
 * [-limit, limit], (u + 1) * g * sigmoid(alpha g) (7 and 1.702 in gpt-oss), biases added
 * before.
 *
 * Activations are quantized to int8 once a row: per block of 32 for the types of 32 values
 * (Q4_0, Q8_0, MXFP4: blocks_of_32.h), per 256 for the K-quants and IQ4_XS (Q4_K, Q5_K, Q6_K,
 * IQ4_XS, Q3_K: one scale a super-block, llama.cpp's Q8_K), as block_quant.h quantizes them;
 * so are the intermediate rows h, by the down projection's type.
 *
 * Products. Each block of 32 weights is unpacked to int8 (signed, or 0..15 / 0..31 for Q4_K
 * and Q5_K, Q6_K's q + 32 0..63 and MXFP4's level + 12 0..24, their offsets taken off in int32
 * by the activations' exact sums of q), multiplied with maddubs (|w| and x with w's sign where
 * w is signed; pairs up to 2 x 128 x 127, inside int16) and madd by the block's integer scale
 * per half (K-quants) or by ones, so every lane is an exact int32. A K-quant's 8 blocks add up
 * in int32 (Q6_K's at most 32.8 M a lane, less up to 16.6 M of its offset: past 2^24 only for
 * extreme blocks, where the one conversion rounds alike in both bodies) before one conversion
 * and one multiply-add by d s_x; a block of 32 takes its own d s_x, block g into accumulator
 * g % CHAINS (Q4_0, Q8_0); MXFP4's 8 blocks' exact sums go into one vector, one a lane,
 * converted together (mxfp4_dot_row_avx2). Q4_K's and Q5_K's mins add - dmin m_j times block
 * j's activation sum.
 * The scalar fallback computes the same lanes and adds them in the same order: the same bits.
 *
 * Threads (OpenMP, torch's team) take work items from one counter, in order: gate and up over
 * (active expert, tile of intermediate rows), then down over (active expert, tile of output
 * rows). The thread that finishes an expert's last gate and up item quantizes its
 * intermediate rows (its down items wait for that), and the thread that finishes the last
 * down item of a row's last expert adds the row's experts' outputs, in ascending expert id:
 * no barrier between the stages (x is quantized before the team starts). A row's output
 * thus never depends on which other rows share the step, or on the thread count.
 *
 * Plain C with a C ABI; built with -fopenmp but linked without libgomp (pagoda/kernels/cpu/native.py).
 */

#include <immintrin.h>
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "block_quant.h"
#include "blocks_of_32.h"
#include "half_float.h"
#include "iq4_xs_blocks.h"
#include "moe_layer.h"
#include "q3_k_blocks.h"
#include "q4_k_blocks.h"
#include "q5_k_blocks.h"
#include "q6_k_blocks.h"

/* Values and bytes a block; super: a super-block of 8 blocks of 32 (activations per 256);
 * mins: Q4_K's and Q5_K's - dmin m per block. */
static const struct { int values, bytes, super, mins; } TYPES[MOE_TYPES] = {
    [MOE_Q4_0] = {32, Q4_0_BYTES, 0, 0},     [MOE_Q8_0] = {32, Q8_0_BYTES, 0, 0},
    [MOE_MXFP4] = {32, MXFP4_BYTES, 0, 0},   [MOE_Q4_K] = {256, Q4K_BYTES, 1, 1},
    [MOE_Q5_K] = {256, Q5K_BYTES, 1, 1},     [MOE_Q6_K] = {256, Q6K_BYTES, 1, 0},
    [MOE_IQ4_XS] = {256, IQ4XS_BYTES, 1, 0}, [MOE_Q3_K] = {256, Q3K_BYTES, 1, 0},
};

#define SUB_BLOCKS 8
#define LANES 8
/* Activation rows that share one pass over a weight row. */
#define XROWS 4
/* Weight rows a work item takes, of gate and up (128 rows at 2880 inputs: 196 KB of MXFP4
 * each) and of down (256 rows at 2880: 392 KB; at Qwen3-30B-A3B's 768 Q4_K inputs 110 KB):
 * long streams for the prefetchers, and few items, since taking one is an atomic add both
 * cores contend for and finishing one another; an item's rows (gpt-oss's gate and up 392 KB)
 * still fit a core's L2 (1 MB) for the passes of a step's further activation rows. 32 and 64
 * rows (gpt-oss-20b's one-row step: 540 items) took 1.25-1.3x as long at two threads (Zen 5;
 * one thread alike); 16 rows had made ~1,400 items of one row's step on Zen 3. */
#ifndef GATE_UP_ROWS
#define GATE_UP_ROWS 128
#endif
#ifndef DOWN_ROWS
#define DOWN_ROWS 256
#endif
/* moe_linear's rows a dot call. */
#define UNIT_ROWS 16
/* ints apart, so two threads' counters never share a cache line */
#define PAD 16
/* pauses a thread waits for an expert's rows before it yields its core */
#define SPINS 1000
/* A type of blocks of 32 adds block g into accumulator g % CHAINS, the two added at the row's
 * end: one chain waited on each multiply-add (4 cycles a 17-byte MXFP4 block). */
#define CHAINS 2
/* How far ahead of its reads a row's stream asks for memory: the hardware's prefetchers alone
 * left one core's stream at ~12 GB/s of the ~14 it reached with 1536 bytes (Zen 3); Zen 5's
 * core reads ~28 GB/s of MXFP4 with 4608 or more, 25 with 1536 (~1.5 us of memory ahead). */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 4608
#endif

/* MXFP4's levels plus 12: 0..24, unsigned bytes for maddubs (mxfp4_dot_row_avx2). */
static const int8_t mxfp4_offset_levels[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                               12, 11, 10, 9, 8, 6, 4, 0};

/* Where value e of block g sits in MXFP4's activation rows: in each whole group of 8 blocks,
 * pair j (0..3) is 64 bytes, block j's values 0..15, block j + 4's 0..15, block j's 16..31,
 * block j + 4's 16..31, so that one vector's halves hold two blocks (mxfp4_group_avx2); the
 * blocks past the last whole group stay in order. */
static size_t mxfp4_value_at(int k, int g, int e)
{
    if (g >= k / 256 * 8)
        return (size_t)g * 32 + e;
    return (size_t)(g / 8) * 256 + 64 * (g % 4) + 32 * (e / 16) + 16 * (g % 8 / 4) + e % 16;
}

/* Quantized activation rows, up to XROWS, each with its block scales and sums. */
struct xrows {
    int n;
    const int8_t *q[XROWS];
    const float *scale[XROWS];
    const float *sum[XROWS];
    const int32_t *offset[XROWS]; /* MXFP4's: 12 times each block's sum of q, exact */
    const int16_t *half[XROWS]; /* each 16 values' sum of q (rows per 256) */
};

/* nrows weight rows of a type (row_bytes apart) against x's rows: out[r * XROWS + i]. One
 * call a work item's rows, not a row: a call costs more than a row's work at one token. */
typedef void (*dot_fn)(int type, const uint8_t *rows, size_t row_bytes, int nrows, int k,
                       const struct xrows *x, float *out);

static size_t row_bytes(int type, int k) { return (size_t)(k / TYPES[type].values) * TYPES[type].bytes; }

/* The order BQ_HSUM256 adds a vector's 8 lanes in. */
static float sum_lanes(const float a[LANES])
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* ---- scalar: the vector bodies' lanes, one at a time --------------------------------------- */

/* Block g of a row (MXFP4's: mxfp4_row_scalar): its 32 integers, the integer scales of its
 * halves (values 0..15, 16..31) and d (the super-block's, or the block's own). */
static void block_scalar(int type, const uint8_t *row, int g, int8_t q[32], int sc[2], float *d)
{
    const uint8_t *at = row + (size_t)(g / (TYPES[type].values / 32)) * TYPES[type].bytes;
    int j = g % SUB_BLOCKS;
    sc[0] = sc[1] = 1;
    switch (type) {
    case MOE_Q4_0:
        nibble_block_scalar(at + 2, NULL, q);
        *d = f16_at(at);
        return;
    case MOE_Q8_0:
        memcpy(q, at + 2, 32);
        *d = f16_at(at);
        return;
    case MOE_Q4_K:
        q4k_block_scalar(at, j, q);
        sc[0] = sc[1] = q5k_scale(at, j, 0);
        *d = f16_at(at);
        return;
    case MOE_Q5_K:
        q5k_block_scalar(at, j, q);
        sc[0] = sc[1] = q5k_scale(at, j, 0);
        *d = q5k_d(at);
        return;
    case MOE_Q6_K:
        q6k_block_scalar(at, g, q);
        sc[0] = q6k_scales(at, g)[0];
        sc[1] = q6k_scales(at, g)[1];
        *d = q6k_d(at);
        return;
    case MOE_IQ4_XS:
        iq4xs_block_scalar(at, j, q);
        sc[0] = sc[1] = iq4xs_scale(at, j);
        *d = iq4xs_d(at);
        return;
    default:
        q3k_block_scalar(at, j, q);
        sc[0] = q3k_scale(at, 2 * j);
        sc[1] = q3k_scale(at, 2 * j + 1);
        *d = q3k_d(at);
    }
}

/* Lane t of a block's product: values 4t..4t+3 times their half's scale. */
static int32_t lane_scalar(const int8_t *q, const int sc[2], const int8_t *x, int t)
{
    int32_t s = 0;
    for (int e = 4 * t; e < 4 * t + 4; e++)
        s += (int32_t)q[e] * x[e];
    return s * sc[t / 4];
}

/* Q4_K's and Q5_K's min of block j: - dmin m_j (exact in fp32). */
static float neg_min(const uint8_t *super, int j) { return -(f16_at(super + 2) * (float)q5k_scale(super, j, 1)); }

/* MXFP4, as mxfp4_dot_row_avx2: lane b of 8 adds blocks b, b + 8, ...: each block's exact
 * integer sum times d s_x. */
static void mxfp4_row_scalar(const uint8_t *row, int k, const struct xrows *x, float *out)
{
    for (int i = 0; i < x->n; i++) {
        float acc[LANES] = {0};
        for (int g = 0; g < k / 32; g++) {
            const uint8_t *block = row + (size_t)g * MXFP4_BYTES;
            int8_t q[32];
            nibble_block_scalar(block + 1, mxfp4_levels, q);
            int32_t sum = 0;
            for (int e = 0; e < 32; e++)
                sum += (int32_t)q[e] * x->q[i][mxfp4_value_at(k, g, e)];
            acc[g % LANES] = fmaf((float)sum, mxfp4_scale(block) * x->scale[i][g], acc[g % LANES]);
        }
        out[i] = sum_lanes(acc);
    }
}

static void row_dot_scalar(int type, const uint8_t *row, int k, const struct xrows *x, float *out)
{
    if (type == MOE_MXFP4) {
        mxfp4_row_scalar(row, k, x, out);
        return;
    }
    int groups = k / 32;
    for (int i = 0; i < x->n; i++) {
        float acc[CHAINS][LANES] = {{0}};
        int32_t isum[LANES] = {0};
        for (int g = 0; g < groups; g++) {
            int8_t q[32];
            int sc[2];
            float d;
            block_scalar(type, row, g, q, sc, &d);
            for (int e = 0; type == MOE_Q6_K && e < 32; e++)
                q[e] += 32; /* as the vector body: 0..63, the 32 off at the end */
            for (int t = 0; t < LANES; t++)
                isum[t] += lane_scalar(q, sc, x->q[i] + (size_t)g * 32, t);
            if (TYPES[type].super && g % SUB_BLOCKS != SUB_BLOCKS - 1)
                continue; /* a super-block's 8 blocks add up in int32 first */
            if (type == MOE_Q6_K) { /* lane t: block t's halves' 32 scale sum q */
                const uint8_t *super = row + (size_t)(g / SUB_BLOCKS) * Q6K_BYTES;
                const int16_t *half = x->half[i] + (size_t)(g / SUB_BLOCKS) * 16;
                for (int t = 0; t < LANES; t++)
                    isum[t] -= 32 * (q6k_scales(super, t)[0] * half[2 * t]
                                     + q6k_scales(super, t)[1] * half[2 * t + 1]);
            }
            float s = d * x->scale[i][g], *a = acc[TYPES[type].super ? 0 : g % CHAINS];
            for (int t = 0; t < LANES; t++) {
                a[t] = fmaf((float)isum[t], s, a[t]);
                isum[t] = 0;
            }
            if (TYPES[type].mins) {
                const uint8_t *super = row + (size_t)(g / SUB_BLOCKS) * TYPES[type].bytes;
                int first = g - (SUB_BLOCKS - 1);
                for (int t = 0; t < LANES; t++)
                    a[t] = fmaf(neg_min(super, t), x->sum[i][first + t], a[t]);
            }
        }
        for (int t = 0; t < LANES; t++) /* chain 1 is all zero for a K-quant */
            acc[0][t] += acc[1][t];
        out[i] = sum_lanes(acc[0]);
    }
}

static void dot_scalar(int type, const uint8_t *rows, size_t row_bytes, int nrows, int k,
                       const struct xrows *x, float *out)
{
    for (int r = 0; r < nrows; r++)
        row_dot_scalar(type, rows + r * row_bytes, k, x, out + r * XROWS);
}

/* ---- AVX2 ----------------------------------------------------------------------------------- */

#define AVX2 "avx2,fma,f16c"

/* What a K-quant super-block's blocks share, unpacked once, so that each block picks its
 * scales with one byte shuffle (scale_of_avx2): Q4_K's and Q5_K's eight scales as bytes 0-7
 * of each 128-bit half, their mins as int32 and d, dmin as floats; IQ4_XS's eight scales as
 * int16 lanes 0-7 of each half; Q6_K's sixteen int8 scales widened to int16, 0-7 in both
 * halves of scale16 and 8-15 in both halves of high16. */
struct super_scales {
    __m256i scale16, high16, mins;
    __m128 d;
    __m256i qh; /* Q5_K's fifth bits, one load for its 8 blocks */
};

/* Eight int32 scales as int16 lanes 0-7 of each 128-bit half, for scale16_of_avx2. */
__attribute__((target(AVX2), always_inline))
static inline __m256i scales16_avx2(__m256i scales32)
{
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(scales32, scales32), 0x88);
}

/* Block j's scale per int16 lane of maddubs' output (lanes 0-7 values 0..15, 8-15 values
 * 16..31) from super_scales_avx2's: one byte shuffle (one cycle), where a 32-bit lane
 * permute costs three. A control byte with its top bit set makes a zero byte. */
__attribute__((target(AVX2), always_inline))
static inline __m256i scale_of_avx2(int type, const struct super_scales *s, int j)
{
    switch (type) {
    case MOE_Q4_K:
    case MOE_Q5_K: /* byte j, zero-extended */
        return _mm256_shuffle_epi8(s->scale16, _mm256_set1_epi16((short)(0xff00 + j)));
    case MOE_Q6_K: { /* int16 scales 2j (low half) and 2j + 1 (high half) */
        int lo = 2 * (2 * j % 8), hi = lo + 2;
        return _mm256_shuffle_epi8(j < 4 ? s->scale16 : s->high16,
                                   _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                                                    lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                                                    hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                                                    hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1));
    }
    default: /* IQ4_XS: int16 lane j */
        return _mm256_shuffle_epi8(s->scale16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
    }
}

__attribute__((target(AVX2), always_inline))
static inline struct super_scales super_scales_avx2(int type, const uint8_t *super)
{
    struct super_scales s = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                             _mm256_setzero_si256(), _mm_setzero_ps(), _mm256_setzero_si256()};
    if (type == MOE_Q4_K || type == MOE_Q5_K) {
        __m128i head = _mm_loadu_si128((const __m128i *)super);
        __m128i bytes = q5k_scale_bytes_avx2(head);
        s.scale16 = _mm256_broadcastsi128_si256(bytes);
        s.mins = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
        s.d = _mm_cvtph_ps(head);
        if (type == MOE_Q5_K)
            s.qh = _mm256_loadu_si256((const __m256i *)(super + Q5K_QH_AT));
    } else if (type == MOE_IQ4_XS) {
        s.scale16 = scales16_avx2(iq4xs_scales_avx2(super));
    } else if (type == MOE_Q6_K) {
        __m256i wide = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(super + Q6K_SCALES_AT)));
        s.scale16 = _mm256_permute4x64_epi64(wide, 0x44);
        s.high16 = _mm256_permute4x64_epi64(wide, 0xee);
    }
    return s;
}

/* A K-quant block j of a super-block: its values and its scale (scale_of_avx2's). */
__attribute__((target(AVX2), always_inline))
static inline __m256i super_block_avx2(int type, const uint8_t *super, const struct super_scales *s,
                                       int j, __m256i *scale)
{
    switch (type) {
    case MOE_Q4_K:
        *scale = scale_of_avx2(type, s, j);
        return q4k_block_avx2(super, j);
    case MOE_Q5_K: /* Q4_K's nibbles at Q5_K's place, and the fifth bit */
        *scale = scale_of_avx2(type, s, j);
        return _mm256_or_si256(q4k_block_avx2(super + (Q5K_QS_AT - Q4K_QS_AT), j),
                               q5k_fifth_bits(s->qh, j, _mm256_set1_epi8(16)));
    case MOE_Q6_K:
        *scale = scale_of_avx2(type, s, j);
        return q6k_block_avx2(super, j);
    case MOE_IQ4_XS:
        *scale = scale_of_avx2(type, s, j);
        return iq4xs_block_avx2(super, j);
    default:
        *scale = _mm256_setr_m128i(_mm_set1_epi16((int16_t)q3k_scale(super, 2 * j)),
                                   _mm_set1_epi16((int16_t)q3k_scale(super, 2 * j + 1)));
        return q3k_block_avx2(super, j);
    }
}

__attribute__((target(AVX2), always_inline))
static inline float super_d_avx2(int type, const uint8_t *super)
{
    switch (type) {
    case MOE_Q6_K:
        return q6k_d_f16c(super);
    case MOE_Q3_K:
        return q3k_d_f16c(super);
    default: /* IQ4_XS: d first (Q4_K's and Q5_K's are in super_scales) */
        return f16_at_f16c(super);
    }
}


/* One weight row of a K-quant TYPE against N activation rows (constants: the accumulators
 * stay in registers). */
__attribute__((target(AVX2), always_inline))
static inline void super_dot_avx2(const int type, const uint8_t *row, int k, const struct xrows *x,
                                  float *out, const int n)
{
    /* Q6_K's values unsigned, 0..63 (the 32 off at the super-block's end) */
    const int is_signed = type != MOE_Q4_K && type != MOE_Q5_K && type != MOE_Q6_K;
    __m256 acc[XROWS];
    for (int i = 0; i < n; i++)
        acc[i] = _mm256_setzero_ps();
    for (int s = 0; s < k / 256; s++) {
        const uint8_t *super = row + (size_t)s * TYPES[type].bytes;
        for (int at = 0; at < TYPES[type].bytes; at += 64)
            _mm_prefetch((const char *)super + PREFETCH_BYTES + at, _MM_HINT_T0);
        __m256i isum[XROWS];
        for (int i = 0; i < n; i++)
            isum[i] = _mm256_setzero_si256();
        struct super_scales scales = super_scales_avx2(type, super);
        for (int j = 0; j < SUB_BLOCKS; j++) {
            __m256i scale, w = super_block_avx2(type, super, &scales, j, &scale);
            if (type == MOE_Q6_K)
                w = _mm256_add_epi8(w, _mm256_set1_epi8(32));
            __m256i u = is_signed ? _mm256_sign_epi8(w, w) : w;
            for (int i = 0; i < n; i++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q[i] + (size_t)s * 256 + 32 * j));
                if (is_signed)
                    xv = _mm256_sign_epi8(xv, w);
                isum[i] = _mm256_add_epi32(isum[i],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), scale));
            }
        }
        if (type == MOE_Q6_K) { /* lane j: less 32 (scale_h sum_h q) of halves h = 2j, 2j + 1 */
            __m256i scale16 = _mm256_permute2x128_si256(scales.scale16, scales.high16, 0x30);
            for (int i = 0; i < n; i++) {
                __m256i half = _mm256_loadu_si256((const __m256i *)(x->half[i] + (size_t)s * 16));
                isum[i] = _mm256_sub_epi32(
                    isum[i], _mm256_slli_epi32(_mm256_madd_epi16(scale16, half), 5));
            }
        }
        float d = TYPES[type].mins ? _mm_cvtss_f32(scales.d) : super_d_avx2(type, super);
        for (int i = 0; i < n; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]),
                                     _mm256_set1_ps(d * x->scale[i][s * SUB_BLOCKS]), acc[i]);
        if (TYPES[type].mins) { /* lanes j: - dmin m_j, as neg_min */
            __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(scales.mins),
                                        _mm256_set1_ps(-_mm_cvtss_f32(_mm_movehdup_ps(scales.d))));
            for (int i = 0; i < n; i++)
                acc[i] = _mm256_fmadd_ps(mins, _mm256_loadu_ps(x->sum[i] + s * SUB_BLOCKS), acc[i]);
        }
    }
    for (int i = 0; i < n; i++)
        BQ_HSUM256(acc[i], out[i]);
}

__attribute__((target(AVX2), always_inline))
static inline __m256i block32_avx2(int type, const uint8_t *block, float *d)
{
    switch (type) {
    case MOE_Q4_0:
        *d = f16_at_f16c(block);
        return q4_0_block_avx2(block);
    default:
        *d = f16_at_f16c(block);
        return _mm256_loadu_si256((const __m256i *)(block + 2));
    }
}

/* Block g's product with N activation rows into accumulator `chain` (g % CHAINS, a constant
 * where the caller unrolls: an accumulator indexed at run time lives in memory), d s_x given
 * per row. */
__attribute__((target(AVX2), always_inline))
static inline void block32_step_avx2(__m256i w, const struct xrows *x, int g, int chain,
                                     const __m256 *ds, __m256 (*acc)[CHAINS], const int n)
{
    __m256i u = _mm256_sign_epi8(w, w);
    for (int i = 0; i < n; i++) {
        __m256i xv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x->q[i] + 32 * g)), w);
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), _mm256_set1_epi16(1));
        acc[i][chain] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), ds[i], acc[i][chain]);
    }
}

/* The same for a type of blocks of 32 (one float scale each): Q4_0, Q8_0. */
__attribute__((target(AVX2), always_inline))
static inline void block32_dot_avx2(const int type, const uint8_t *row, int k,
                                    const struct xrows *x, float *out, const int n)
{
    const int bytes = TYPES[type].bytes;
    __m256 acc[XROWS][CHAINS], ds[XROWS];
    for (int i = 0; i < n; i++)
        for (int c = 0; c < CHAINS; c++)
            acc[i][c] = _mm256_setzero_ps();
    int g = 0;
    for (; g + 8 <= k / 32; g += 8) {
#pragma GCC unroll 8
        for (int b = 0; b < 8; b++) { /* (g + b) % CHAINS = b % CHAINS, g a multiple of 8 */
            const uint8_t *block = row + (size_t)(g + b) * bytes;
            _mm_prefetch((const char *)block + PREFETCH_BYTES, _MM_HINT_T0);
            float d;
            __m256i w = block32_avx2(type, block, &d);
            for (int i = 0; i < n; i++)
                ds[i] = _mm256_set1_ps(d * x->scale[i][g + b]);
            block32_step_avx2(w, x, g + b, b % CHAINS, ds, acc, n);
        }
    }
    for (; g < k / 32; g++) {
        float d;
        const uint8_t *block = row + (size_t)g * bytes;
        __m256i w = block32_avx2(type, block, &d);
        for (int i = 0; i < n; i++)
            ds[i] = _mm256_set1_ps(d * x->scale[i][g]);
        block32_step_avx2(w, x, g, g % CHAINS, ds, acc, n);
    }
    for (int i = 0; i < n; i++)
        BQ_HSUM256(_mm256_add_ps(acc[i][0], acc[i][1]), out[i]);
}

/* MXFP4 rows, 8 blocks (136 bytes) a step. Each block's levels are looked up plus 12
 * (0..24, unsigned), so maddubs takes them as they are (no sign tricks), and each block's
 * exact integer product comes out less 12 times its activations' sum of q, which is added
 * back in int32. Then one conversion and one multiply-add by d_b s_x,b for the 8 blocks, where
 * each block took its own (hot, one core, 2880 x 2880: 9.3 -> 12.6 GB/s). */
__attribute__((target(AVX2), always_inline))
static inline __m256i mxfp4_offset_block_avx2(__m256i table, const uint8_t *block)
{
    return _mm256_shuffle_epi8(table, nibbles_avx2(block + 1));
}

/* The scales 2^(e - 128) of `here` (<= 8) blocks from `blocks`, as mxfp4_scale, one a lane
 * (past `here`: 2^-126, e = 2). The exponent bytes are put together in a general register,
 * which the vector work leaves idle, then a shift makes a normal float's bits; SUBNORMAL also
 * gives e < 2 its subnormal (a shift and a blend, which made the whole dot ~15% slower, as did
 * a branch on the bytes: mxfp4_dot_row_avx2 takes this path only for a row that needs it).
 * low: the lanes' least e so far. */
__attribute__((target(AVX2), always_inline))
static inline __m256 mxfp4_scales_avx2(const uint8_t *blocks, const int here,
                                       const int subnormal, __m256i *low)
{
    uint64_t bytes = 0;
    for (int b = 0; b < 8; b++)
        bytes |= (uint64_t)(b < here ? blocks[b * MXFP4_BYTES] : 2) << (8 * b);
    __m256i e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bytes));
    __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    *low = _mm256_min_epu32(*low, e);
    if (!subnormal)
        return _mm256_castsi256_ps(normal);
    __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny,
                                                  _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

/* acc += (sums - 12 sum q) d s_x for blocks g .. g + here - 1, one a lane (0 past `here`,
 * whose scales and sums are not read: an activation row's last blocks end its buffer). */
__attribute__((target(AVX2), always_inline))
static inline __m256 mxfp4_accumulate_avx2(__m256i sums, __m256 d, const struct xrows *x,
                                           int i, int g, const int here, __m256 acc)
{
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(here),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i offset = here == 8 ? _mm256_loadu_si256((const __m256i *)(x->offset[i] + g))
                               : _mm256_maskload_epi32(x->offset[i] + g, mask);
    __m256 xs = here == 8 ? _mm256_loadu_ps(x->scale[i] + g)
                          : _mm256_maskload_ps(x->scale[i] + g, mask);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sums, offset)),
                           _mm256_mul_ps(d, xs), acc);
}

/* acc + u8 . s8 in int32 lanes, 4 byte products each, s8 the 32 bytes at `s8`: AVX512-VNNI's
 * dpbusd at 256 bits, as an instruction written out, so that one body serves AVX2 and VNNI (GCC
 * will not inline the intrinsic into a function built for AVX2); run only where
 * bq_cpu_has(BQ_ISA_AVX512_VNNI). s8 stays a memory operand: in a register, the extra pressure
 * put the row's accumulator on the stack. */
__attribute__((target(AVX2), always_inline))
static inline __m256i dpbusd_vnni(__m256i acc, __m256i u8, const int8_t *s8)
{
    __asm__("%{evex%} vpdpbusd %2, %1, %0"
            : "+v"(acc)
            : "v"(u8), "m"(*(const __m256i_u *)s8));
    return acc;
}

/* A whole group of 8 blocks against N activation rows paired as mxfp4_value_at lays them out.
 * Pair j's vectors hold block j in their low half and block j + 4 in their high half, the
 * values 0..15 in one and 16..31 in the other: one add sums their maddubs outputs in int16
 * (at most 4 x 24 x 127 a lane), one madd by ones makes int32, and a transpose of the four
 * pairs' partial sums (unpacks and adds) leaves block b's sum in lane b. Two hadds a pair of
 * blocks before (~3 uops each here) made the same sums; this takes 0.8x their time hot. VNNI:
 * two dpbusd a pair in place of the maddubs, add and madd. */
__attribute__((target(AVX2), always_inline))
static inline void mxfp4_group_avx2(const uint8_t *group, __m256i table, const struct xrows *x,
                                    int g, const int subnormal, __m256 *acc, __m256i *low,
                                    const int n, const int vnni)
{
    for (int at = 0; at < 8 * MXFP4_BYTES; at += 64)
        _mm_prefetch((const char *)group + PREFETCH_BYTES + at, _MM_HINT_T0);
    const __m256i fifteen = _mm256_set1_epi8(15);
    __m256i low_values[4], high_values[4];
    for (int j = 0; j < 4; j++) {
        __m256i codes = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(group + j * MXFP4_BYTES + 1))),
            _mm_loadu_si128((const __m128i *)(group + (j + 4) * MXFP4_BYTES + 1)), 1);
        low_values[j] = _mm256_shuffle_epi8(table, _mm256_and_si256(codes, fifteen));
        high_values[j] = _mm256_shuffle_epi8(
            table, _mm256_and_si256(_mm256_srli_epi16(codes, 4), fifteen));
    }
    __m256 d = mxfp4_scales_avx2(group, 8, subnormal, low);
    for (int i = 0; i < n; i++) {
        const int8_t *xq = x->q[i] + (size_t)g * 32;
        __m256i p[4]; /* lanes 0-3: block j's four partial sums, 4-7: block j + 4's */
        for (int j = 0; j < 4; j++) {
            const int8_t *lo = xq + 64 * j, *hi = lo + 32;
            if (vnni)
                p[j] = dpbusd_vnni(dpbusd_vnni(_mm256_setzero_si256(), low_values[j], lo),
                                   high_values[j], hi);
            else
                p[j] = _mm256_madd_epi16(
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(low_values[j],
                                             _mm256_loadu_si256((const __m256i *)lo)),
                        _mm256_maddubs_epi16(high_values[j],
                                             _mm256_loadu_si256((const __m256i *)hi))),
                    _mm256_set1_epi16(1));
        }
        __m256i p01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]),
                                       _mm256_unpackhi_epi32(p[0], p[1]));
        __m256i p23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]),
                                       _mm256_unpackhi_epi32(p[2], p[3]));
        __m256i sums = _mm256_add_epi32(_mm256_unpacklo_epi64(p01, p23),
                                        _mm256_unpackhi_epi64(p01, p23));
        acc[i] = mxfp4_accumulate_avx2(sums, d, x, i, g, 8, acc[i]);
    }
}

/* Blocks b and b + 1's products with one activation row (0 past `here`): int32 lanes 0-1 of
 * each 128-bit half block b's, 2-3 block b + 1's. */
__attribute__((target(AVX2), always_inline))
static inline __m256i mxfp4_pair_avx2(const __m256i *w, const int8_t *xq, int b, const int here)
{
    __m256i p[2];
    for (int c = 0; c < 2; c++)
        p[c] = b + c < here
                 ? _mm256_maddubs_epi16(w[b + c],
                                        _mm256_loadu_si256((const __m256i *)(xq + 32 * (b + c))))
                 : _mm256_setzero_si256();
    return _mm256_madd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_set1_epi16(1));
}

/* A row's last blocks g .. g + here - 1 (here < 8, a constant), in order in the activation
 * rows: each block unpacked alone, two blocks' maddubs outputs added by one hadd in int16,
 * two more hadds and a lane swap leave the blocks' sums one a lane. */
__attribute__((target(AVX2), always_inline))
static inline void mxfp4_tail_avx2(const uint8_t *tail, __m256i table, const struct xrows *x,
                                   int g, const int here, const int subnormal, __m256 *acc,
                                   __m256i *low, const int n)
{
    __m256i w[8];
    for (int b = 0; b < here; b++)
        w[b] = mxfp4_offset_block_avx2(table, tail + b * MXFP4_BYTES);
    __m256 d = mxfp4_scales_avx2(tail, here, subnormal, low);
    for (int i = 0; i < n; i++) {
        const int8_t *xq = x->q[i] + (size_t)g * 32;
        __m256i lo = _mm256_hadd_epi32(mxfp4_pair_avx2(w, xq, 0, here),
                                       mxfp4_pair_avx2(w, xq, 2, here));
        __m256i hi = _mm256_hadd_epi32(mxfp4_pair_avx2(w, xq, 4, here),
                                       mxfp4_pair_avx2(w, xq, 6, here));
        __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                                        _mm256_permute2x128_si256(lo, hi, 0x31));
        acc[i] = mxfp4_accumulate_avx2(sums, d, x, i, g, here, acc[i]);
    }
}

/* A row's blocks, 8 at a time; 0 where a scale is subnormal and SUBNORMAL is not set. */
__attribute__((target(AVX2), always_inline))
static inline int mxfp4_row_pass_avx2(const uint8_t *row, int k, const struct xrows *x,
                                      const int subnormal, __m256 *acc, const int n,
                                      const int vnni)
{
    __m256i table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mxfp4_offset_levels));
    __m256i low = _mm256_set1_epi32(255);
    for (int i = 0; i < n; i++)
        acc[i] = _mm256_setzero_ps();
    int blocks = k / 32, g = 0;
    for (; g + 8 <= blocks; g += 8)
        mxfp4_group_avx2(row + (size_t)g * MXFP4_BYTES, table, x, g, subnormal, acc, &low, n,
                         vnni);
    const uint8_t *tail = row + (size_t)g * MXFP4_BYTES;
    switch (blocks - g) { /* the last blocks, their count a constant */
#define MXFP4_TAIL(H)                                                                       \
    case H:                                                                                 \
        mxfp4_tail_avx2(tail, table, x, g, H, subnormal, acc, &low, n);                     \
        break;
        MXFP4_TAIL(1) MXFP4_TAIL(2) MXFP4_TAIL(3) MXFP4_TAIL(4)
        MXFP4_TAIL(5) MXFP4_TAIL(6) MXFP4_TAIL(7)
#undef MXFP4_TAIL
    default:
        break;
    }
    return subnormal || _mm256_testz_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(2), low),
                                           _mm256_set1_epi32(-1));
}

__attribute__((target(AVX2), always_inline))
static inline void mxfp4_dot_row(const uint8_t *row, int k, const struct xrows *x, float *out,
                                 const int n, const int vnni)
{
    __m256 acc[XROWS];
    if (!mxfp4_row_pass_avx2(row, k, x, 0, acc, n, vnni))
        mxfp4_row_pass_avx2(row, k, x, 1, acc, n, vnni);
    for (int i = 0; i < n; i++)
        BQ_HSUM256(acc[i], out[i]);
}

__attribute__((target(AVX2), always_inline))
static inline void mxfp4_dot_row_avx2(const int type, const uint8_t *row, int k,
                                      const struct xrows *x, float *out, const int n)
{
    (void)type;
    mxfp4_dot_row(row, k, x, out, n, 0);
}

__attribute__((target(AVX2), always_inline))
static inline void mxfp4_dot_row_vnni(const int type, const uint8_t *row, int k,
                                      const struct xrows *x, float *out, const int n)
{
    (void)type;
    mxfp4_dot_row(row, k, x, out, n, 1);
}

/* A type's AVX2 dot (dot_fn), its activation row count made a constant. */
#define DOT_ROWS(BODY, TYPE, N)                                                             \
    for (int r = 0; r < nrows; r++)                                                         \
        BODY(TYPE, rows + r * row_bytes, k, x, out + r * XROWS, N)
#define DEFINE_DOT(NAME, BODY, TYPE)                                                        \
    __attribute__((target(AVX2)))                                                           \
    static void NAME(int type, const uint8_t *rows, size_t row_bytes, int nrows, int k,     \
                     const struct xrows *x, float *out)                                     \
    {                                                                                       \
        (void)type;                                                                         \
        switch (x->n) {                                                                     \
        case 1: DOT_ROWS(BODY, TYPE, 1); break;                                             \
        case 2: DOT_ROWS(BODY, TYPE, 2); break;                                             \
        case 3: DOT_ROWS(BODY, TYPE, 3); break;                                             \
        default: DOT_ROWS(BODY, TYPE, 4); break;                                            \
        }                                                                                   \
    }
DEFINE_DOT(q4_0_dot_avx2, block32_dot_avx2, MOE_Q4_0)
DEFINE_DOT(q8_0_dot_avx2, block32_dot_avx2, MOE_Q8_0)
DEFINE_DOT(mxfp4_dot_avx2, mxfp4_dot_row_avx2, MOE_MXFP4)
DEFINE_DOT(mxfp4_dot_vnni, mxfp4_dot_row_vnni, MOE_MXFP4)
DEFINE_DOT(q4_k_dot_avx2, super_dot_avx2, MOE_Q4_K)
DEFINE_DOT(q5_k_dot_avx2, super_dot_avx2, MOE_Q5_K)
DEFINE_DOT(q6_k_dot_avx2, super_dot_avx2, MOE_Q6_K)
DEFINE_DOT(iq4_xs_dot_avx2, super_dot_avx2, MOE_IQ4_XS)
DEFINE_DOT(q3_k_dot_avx2, super_dot_avx2, MOE_Q3_K)

/* AVX2 bodies also where VNNI runs (a K-quant's scale applies to maddubs' int16 pairs, past
 * which dpbusd sums), but for MXFP4's whole groups of blocks. */
static dot_fn pick_dot(int isa, int type)
{
    static const dot_fn avx2[MOE_TYPES] = {
        [MOE_Q4_0] = q4_0_dot_avx2, [MOE_Q8_0] = q8_0_dot_avx2, [MOE_MXFP4] = mxfp4_dot_avx2,
        [MOE_Q4_K] = q4_k_dot_avx2, [MOE_Q5_K] = q5_k_dot_avx2, [MOE_Q6_K] = q6_k_dot_avx2,
        [MOE_IQ4_XS] = iq4_xs_dot_avx2, [MOE_Q3_K] = q3_k_dot_avx2,
    };
    if (isa >= BQ_ISA_AVX512_VNNI && type == MOE_MXFP4)
        return mxfp4_dot_vnni;
    return isa >= BQ_ISA_AVX2 ? avx2[type] : dot_scalar;
}

/* ---- the layer ------------------------------------------------------------------------------ */

/* Quantized rows: values int8 [rows, k], block scales and sums [rows, k / 32]. */
struct qrows {
    int8_t *q;
    float *scale, *sum;
    int32_t *offset; /* [rows, k / 32]: 12 times each block's sum of q (NULL: not kept) */
    int16_t *half; /* [rows, k / 16]: each 16 values' sum of q, rows per 256 (NULL: not kept) */
    int k;
};

/* The step's routing: expert e's (row, slot) pairs, as row * top_k + slot, are
 * pair[begin[e] .. begin[e + 1]), by row; active lists the experts with any, ascending; fill
 * is the sort's scratch. */
struct routing {
    int *begin, *active, *fill, *pair, *place; /* place: pair's inverse */
    int n_active;
};

static size_t qrows_bytes(int rows, int k)
{
    /* q; scale, sum and offset per 32 values; half per 16 (as many bytes) */
    return align64((size_t)rows * k) + 4 * align64((size_t)rows * (k / 32) * sizeof(float));
}

size_t moe_workspace_bytes(const struct moe_layer *layer, int m)
{
    size_t pairs = (size_t)m * layer->top_k;
    return qrows_bytes(m, layer->hidden) + qrows_bytes((int)pairs, layer->inter)
         + align64(pairs * (size_t)layer->inter * sizeof(float))
         + align64(pairs * (size_t)layer->hidden * sizeof(float))
         + align64((size_t)(3 * layer->num_experts + 1 + 2 * pairs) * sizeof(int))
         + align64((size_t)(3 * layer->num_experts + m + 1) * PAD * sizeof(int));
}

static char *take(char **at, size_t bytes)
{
    char *p = *at;
    *at += align64(bytes);
    return p;
}

static struct qrows take_qrows(char **at, int rows, int k)
{
    struct qrows r;
    r.q = (int8_t *)take(at, (size_t)rows * k);
    r.scale = (float *)take(at, (size_t)rows * (k / 32) * sizeof(float));
    r.sum = (float *)take(at, (size_t)rows * (k / 32) * sizeof(float));
    r.offset = (int32_t *)take(at, (size_t)rows * (k / 32) * sizeof(int32_t));
    r.half = (int16_t *)take(at, (size_t)rows * (k / 16) * sizeof(int16_t));
    r.k = k;
    return r;
}

/* The sums of q of a row's whole eights of blocks of 32 (their count of blocks). */
__attribute__((target(AVX2)))
static int block_sums_avx2(const int8_t *q, int blocks, int32_t *out)
{
    int g = 0;
    for (; g + 8 <= blocks; g += 8) {
        __m256i s[8];
        for (int b = 0; b < 8; b++) /* lanes: 4 sums of 8 values each */
            s[b] = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_set1_epi8(1),
                                     _mm256_loadu_si256((const __m256i *)(q + 32 * (g + b)))),
                _mm256_set1_epi16(1));
        __m256i lo = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]),
                                       _mm256_hadd_epi32(s[2], s[3]));
        __m256i hi = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]),
                                       _mm256_hadd_epi32(s[6], s[7]));
        _mm256_storeu_si256((__m256i *)(out + g),
                            _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                                             _mm256_permute2x128_si256(lo, hi, 0x31)));
    }
    return g;
}

/* Each block of 32's sum of q: exact, the same bits whichever body. */
static void block_sums(int isa, const int8_t *q, int blocks, int32_t *out)
{
    for (int g = isa >= BQ_ISA_AVX2 ? block_sums_avx2(q, blocks, out) : 0; g < blocks; g++) {
        int32_t sum = 0;
        for (int e = 0; e < 32; e++)
            sum += q[32 * g + e];
        out[g] = sum;
    }
}

/* Whether a type's body reads its activations' exact sums of q: MXFP4 each block's (offset),
 * Q6_K each 16 values' (half). */
static int reads_sums(int type) { return type == MOE_MXFP4 || type == MOE_Q6_K; }

/* MXFP4's activation row q (k values, each block's sum of q taken) laid out as
 * mxfp4_value_at says. */
static void mxfp4_pair_values(int8_t *q, int k)
{
    for (int at = 0; at + 256 <= k; at += 256) {
        int8_t group[256];
        memcpy(group, q + at, sizeof(group));
        for (int g = at / 32; g < at / 32 + 8; g++)
            for (int e = 0; e < 32; e += 16)
                memcpy(q + mxfp4_value_at(k, g, e), group + 32 * (g % 8) + e, 16);
    }
}

/* Row `row` of r: v quantized per 32 values, or per 256 (super); with `sums`, 12 times each
 * block's sum of q (MXFP4's offset), or each 16 values' sum (super); `paired`: MXFP4's layout
 * (mxfp4_value_at). */
static void quantize_row(int isa, int super, int sums, int paired, const float *v, int k,
                         const struct qrows *r, int row)
{
    size_t b = (size_t)row * (k / 32);
    int8_t *q = r->q + (size_t)row * k;
    if (super) {
        bq_quantize_rows_super8(isa, v, 1, k, q, r->scale + b, r->sum + b);
        for (int h = 0; sums && r->half && h < k / 16; h++) { /* |sum| <= 16 x 127 */
            int sum = 0;
            for (int e = 0; e < 16; e++)
                sum += q[16 * h + e];
            r->half[(size_t)row * (k / 16) + h] = (int16_t)sum;
        }
        return;
    }
    bq_quantize_rows(isa, 0, v, 1, k, q, r->scale + b, r->sum + b);
    if (sums && r->offset) { /* MXFP4's levels are read plus 12 */
        int32_t *offset = r->offset + b;
        block_sums(isa, q, k / 32, offset);
        for (int g = 0; g < k / 32; g++)
            offset[g] *= 12;
    }
    if (paired)
        mxfp4_pair_values(q, k);
}

/* Counting sort of the (row, slot) pairs by expert; -1 for an id out of range. */
static int route(const struct moe_layer *layer, const int64_t *ids, int m, struct routing *r)
{
    int e_count = layer->num_experts, pairs = m * layer->top_k;
    memset(r->begin, 0, (size_t)(e_count + 1) * sizeof(int));
    for (int p = 0; p < pairs; p++) {
        if (ids[p] < 0 || ids[p] >= e_count)
            return -1;
        r->begin[ids[p] + 1]++;
    }
    r->n_active = 0;
    for (int e = 0; e < e_count; e++) {
        if (r->begin[e + 1])
            r->active[r->n_active++] = e;
        r->begin[e + 1] += r->begin[e];
    }
    memcpy(r->fill, r->begin, (size_t)e_count * sizeof(int));
    for (int p = 0; p < pairs; p++) {
        r->place[p] = r->fill[ids[p]]++;
        r->pair[r->place[p]] = p;
    }
    return 0;
}

/* The activation rows of places [from, min(end, from + XROWS)) of a routing list (their
 * count): by pair, x's rows (pair / top_k) for gate and up; with pair NULL, the rows at those
 * places (the intermediate rows, for down). */
static int gather(const struct qrows *r, const int *pair, int from, int end, int top_k,
                  struct xrows *x)
{
    x->n = min_int(end - from, XROWS);
    for (int i = 0; i < x->n; i++) {
        size_t row = pair ? (size_t)(pair[from + i] / top_k) : (size_t)(from + i);
        x->q[i] = r->q + row * r->k;
        x->scale[i] = r->scale + row * (r->k / 32);
        x->sum[i] = r->sum + row * (r->k / 32);
        x->offset[i] = r->offset + row * (r->k / 32);
        x->half[i] = r->half + row * (r->k / 16);
    }
    return x->n;
}

/* Intermediate rows [row0, row0 + GATE_UP_ROWS) of expert e for all its pairs: gate and up read
 * together, the activation applied, into h (by the pair's place in the routing). */
static void gate_up_unit(const struct moe_layer *layer, dot_fn gate_dot, dot_fn up_dot,
                         const struct qrows *xq, const struct routing *r, int e, int row0,
                         float *h)
{
    int k = layer->hidden, end = min_int(row0 + GATE_UP_ROWS, layer->inter);
    size_t gate_bytes = row_bytes(layer->gate_type, k), up_bytes = row_bytes(layer->up_type, k);
    const float *gb = layer->gate_bias ? layer->gate_bias[e] : NULL;
    const float *ub = layer->up_bias ? layer->up_bias[e] : NULL;
    for (int from = r->begin[e]; from < r->begin[e + 1]; from += XROWS) {
        struct xrows x;
        int n = gather(xq, r->pair, from, r->begin[e + 1], layer->top_k, &x);
        float g[GATE_UP_ROWS * XROWS], u[GATE_UP_ROWS * XROWS];
        gate_dot(layer->gate_type, layer->gate[e] + row0 * gate_bytes, gate_bytes, end - row0, k,
                 &x, g);
        up_dot(layer->up_type, layer->up[e] + row0 * up_bytes, up_bytes, end - row0, k, &x, u);
        for (int row = row0; row < end; row++) {
            const float *gr = g + (row - row0) * XROWS, *ur = u + (row - row0) * XROWS;
            for (int i = 0; i < n; i++)
                h[(size_t)(from + i) * layer->inter + row] =
                    moe_activate(layer, gb ? gr[i] + gb[row] : gr[i], ub ? ur[i] + ub[row] : ur[i]);
        }
    }
}

/* Output rows [row0, row0 + DOWN_ROWS) of expert e for all its pairs (its bias added), into
 * y (by the pair's place in the routing): one expert's rows a work item, so each item streams
 * one stretch of memory (tiles over all active experts at once read as many stretches, which
 * at eight rows, ~30 experts, defeated the prefetchers: 1.7x slower). */
static void down_unit(const struct moe_layer *layer, dot_fn dot, const struct qrows *hq,
                      const struct routing *r, int e, int row0, float *y)
{
    int k = layer->inter, end = min_int(row0 + DOWN_ROWS, layer->hidden);
    size_t bytes = row_bytes(layer->down_type, k);
    const float *bias = layer->down_bias ? layer->down_bias[e] : NULL;
    for (int from = r->begin[e]; from < r->begin[e + 1]; from += XROWS) {
        struct xrows x;
        int n = gather(hq, NULL, from, r->begin[e + 1], layer->top_k, &x);
        float ys[DOWN_ROWS * XROWS];
        dot(layer->down_type, layer->down[e] + row0 * bytes, bytes, end - row0, k, &x, ys);
        for (int row = row0; row < end; row++)
            for (int i = 0; i < n; i++) {
                float v = ys[(row - row0) * XROWS + i];
                y[(size_t)(from + i) * layer->hidden + row] = bias ? v + bias[row] : v;
            }
    }
}

/* Row i's output: its pairs' down rows times their router weights, added in ascending expert
 * id (ties by slot), so the sum never depends on the rest of the step. */
static void combine_row(const struct moe_layer *layer, const int64_t *ids, const float *weights,
                        const struct routing *r, const float *y, int i, float *out)
{
    int k = layer->top_k, order[k];
    for (int s = 0; s < k; s++) { /* insertion sort of the row's slots by expert */
        int t = s;
        for (; t > 0 && ids[(size_t)i * k + order[t - 1]] > ids[(size_t)i * k + s]; t--)
            order[t] = order[t - 1];
        order[t] = s;
    }
    float *o = out + (size_t)i * layer->hidden;
    memset(o, 0, (size_t)layer->hidden * sizeof(float));
    for (int s = 0; s < k; s++) {
        int p = i * k + order[s];
        const float *yp = y + (size_t)r->place[p] * layer->hidden;
        for (int c = 0; c < layer->hidden; c++)
            o[c] += weights[p] * yp[c];
    }
}

static int valid_type(int type, int k) { return type >= 0 && type < MOE_TYPES && k % TYPES[type].values == 0; }

static int valid_layer(const struct moe_layer *l)
{
    return l->hidden > 0 && l->inter > 0 && l->num_experts > 0 && l->top_k > 0
        && l->top_k <= l->num_experts && valid_type(l->gate_type, l->hidden)
        && valid_type(l->up_type, l->hidden) && valid_type(l->down_type, l->inter)
        /* gate and up read one quantization of x, laid out alike */
        && TYPES[l->gate_type].super == TYPES[l->up_type].super
        && (l->gate_type == MOE_MXFP4) == (l->up_type == MOE_MXFP4)
        && (l->activation == MOE_SILU || l->activation == MOE_SWIGLU_OAI)
        && l->gate && l->up && l->down;
}

/* What the team counts down instead of waiting at barriers (each of which waits for the
 * slowest thread, and on a busy machine for one descheduled): the next work item; per expert,
 * its gate and up items not yet done (the thread that finishes the last quantizes the
 * expert's intermediate rows and sets ready), and its down items not yet done (the thread
 * that finishes the last counts the expert off its rows); per row, its experts not yet done
 * (the thread that finishes the last adds the row up). All PAD ints apart. */
struct countdown {
    int *next, *gate_up_left, *ready, *down_left, *row_left;
};

static struct countdown take_countdown(char **at, const struct moe_layer *layer, int m,
                                       int tiles_in, int tiles_out)
{
    int e_count = layer->num_experts;
    int *c = (int *)take(at, (size_t)(3 * e_count + m + 1) * PAD * sizeof(int));
    struct countdown d = {c, c + PAD, c + (1 + e_count) * PAD, c + (1 + 2 * e_count) * PAD,
                          c + (1 + 3 * e_count) * PAD};
    *d.next = 0;
    for (int e = 0; e < e_count; e++) {
        d.gate_up_left[e * PAD] = tiles_in;
        d.ready[e * PAD] = 0;
        d.down_left[e * PAD] = tiles_out;
    }
    for (int i = 0; i < m; i++)
        d.row_left[i * PAD] = layer->top_k;
    return d;
}

static int count_down(int *counter) { return __atomic_sub_fetch(counter, 1, __ATOMIC_ACQ_REL) == 0; }

/* The step's work for a team: every active expert's gate and up items, then every down
 * item, taken in that order from one counter (so a down item waits only on gate and up items
 * that running threads hold); an expert's intermediate rows are quantized, and a row added
 * up, by whichever thread finishes their inputs. */
struct step {
    const struct moe_layer *layer;
    int isa, m, tiles_in, tiles_out;
    dot_fn gate_dot, up_dot, down_dot;
    const struct qrows *xq, *hq;
    const struct routing *r;
    const int64_t *ids;
    const float *weights;
    float *h, *y, *out;
    struct countdown c;
};

static void run_gate_up(const struct step *t, int u)
{
    const struct moe_layer *layer = t->layer;
    const struct routing *r = t->r;
    int e = r->active[u / t->tiles_in];
    gate_up_unit(layer, t->gate_dot, t->up_dot, t->xq, r, e, (u % t->tiles_in) * GATE_UP_ROWS,
                 t->h);
    if (!count_down(&t->c.gate_up_left[e * PAD]))
        return;
    for (int p = r->begin[e]; p < r->begin[e + 1]; p++)
        quantize_row(t->isa, TYPES[layer->down_type].super, reads_sums(layer->down_type),
                     layer->down_type == MOE_MXFP4,
                     t->h + (size_t)p * layer->inter, layer->inter, t->hq, p);
    __atomic_store_n(&t->c.ready[e * PAD], 1, __ATOMIC_RELEASE);
}

/* Until an expert's intermediate rows are quantized: a thread that holds its last gate/up
 * item is running it, or descheduled, so after a short spin (~20 us) this one gives its core
 * away (as libgomp's barriers sleep): spinning on, it kept the core from that very thread and
 * a busy machine's calls took a time slice each (~20 ms). */
static void wait_ready(const int *ready)
{
    for (int spin = 0; !__atomic_load_n(ready, __ATOMIC_ACQUIRE); spin++) {
        if (spin < SPINS)
            _mm_pause();
        else
            sched_yield();
    }
}

static void run_down(const struct step *t, int u)
{
    const struct routing *r = t->r;
    int e = r->active[u / t->tiles_out];
    wait_ready(&t->c.ready[e * PAD]);
    down_unit(t->layer, t->down_dot, t->hq, r, e, (u % t->tiles_out) * DOWN_ROWS, t->y);
    if (!count_down(&t->c.down_left[e * PAD]))
        return;
    for (int p = r->begin[e]; p < r->begin[e + 1]; p++) {
        int i = r->pair[p] / t->layer->top_k;
        if (count_down(&t->c.row_left[i * PAD]))
            combine_row(t->layer, t->ids, t->weights, r, t->y, i, t->out);
    }
}

static void run_step(const struct step *t)
{
    int gate_up_units = t->r->n_active * t->tiles_in;
    int units = gate_up_units + t->r->n_active * t->tiles_out;
    for (int u; (u = __atomic_fetch_add(t->c.next, 1, __ATOMIC_RELAXED)) < units;) {
        if (u < gate_up_units)
            run_gate_up(t, u);
        else
            run_down(t, u - gate_up_units);
    }
}

/* out [m, hidden] = the layer's routed experts for x [m, hidden] (fp32, contiguous), ids and
 * weights [m, top_k] (int64, fp32). work: moe_workspace_bytes(layer, m), 64-byte aligned.
 * Returns 0, or -1 for arguments it refuses (an instruction set this CPU lacks, a width that
 * is not whole blocks, an expert id out of range). */
int moe_forward(int isa, const struct moe_layer *layer, const float *x, int m,
                const int64_t *ids, const float *weights, float *out, void *work, int n_threads)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || m <= 0 || !valid_layer(layer) || ((uintptr_t)work & 63))
        return -1;
    int pairs = m * layer->top_k;
    char *at = work;
    struct qrows xq = take_qrows(&at, m, layer->hidden);
    struct qrows hq = take_qrows(&at, pairs, layer->inter);
    /* the intermediate rows and the pairs' down rows, each by the pair's place */
    float *h = (float *)take(&at, (size_t)pairs * layer->inter * sizeof(float));
    float *y = (float *)take(&at, (size_t)pairs * layer->hidden * sizeof(float));
    struct routing r;
    r.begin = (int *)take(&at, (size_t)(3 * layer->num_experts + 1 + 2 * pairs) * sizeof(int));
    r.active = r.begin + layer->num_experts + 1;
    r.fill = r.active + layer->num_experts;
    r.pair = r.fill + layer->num_experts;
    r.place = r.pair + pairs;
    if (route(layer, ids, m, &r))
        return -1;
    struct step t = {layer, isa, m, (layer->inter + GATE_UP_ROWS - 1) / GATE_UP_ROWS,
                     (layer->hidden + DOWN_ROWS - 1) / DOWN_ROWS, pick_dot(isa, layer->gate_type),
                     pick_dot(isa, layer->up_type), pick_dot(isa, layer->down_type), &xq, &hq,
                     &r, ids, weights, h, y, out, {0}};
    t.c = take_countdown(&at, layer, m, t.tiles_in, t.tiles_out);
    /* x before the team starts, for ~1 us a row */
    for (int i = 0; i < m; i++)
        quantize_row(isa, TYPES[layer->gate_type].super,
                     reads_sums(layer->gate_type) || reads_sums(layer->up_type),
                     layer->gate_type == MOE_MXFP4,
                     x + (size_t)i * layer->hidden, layer->hidden, &xq, i);
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
    run_step(&t);
    return 0;
}

/* One projection alone, as moe_forward runs each: y [m, n] = x [m, k] (fp32, quantized inside
 * as moe_forward quantizes rows for this type) times rows [n, .] of blocks of `type`; work is
 * moe_linear_workspace_bytes(m, k), 64-byte aligned. One thread. For the tests and benches. */
size_t moe_linear_workspace_bytes(int m, int k) { return qrows_bytes(m, k); }

int moe_linear(int isa, int type, const uint8_t *rows, int n, int k, const float *x, int m,
               float *y, void *work)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || n <= 0 || m <= 0 || !valid_type(type, k) || ((uintptr_t)work & 63))
        return -1;
    char *at = work;
    struct qrows xq = take_qrows(&at, m, k);
    for (int i = 0; i < m; i++)
        quantize_row(isa, TYPES[type].super, reads_sums(type), type == MOE_MXFP4,
                     x + (size_t)i * k, k, &xq, i);
    dot_fn dot = pick_dot(isa, type);
    size_t bytes = row_bytes(type, k);
    for (int from = 0; from < m; from += XROWS) {
        struct xrows xr;
        gather(&xq, NULL, from, m, 1, &xr);
        for (int row0 = 0; row0 < n; row0 += UNIT_ROWS) {
            float out[UNIT_ROWS * XROWS];
            int rows_here = min_int(UNIT_ROWS, n - row0);
            dot(type, rows + row0 * bytes, bytes, rows_here, k, &xr, out);
            for (int r = 0; r < rows_here; r++)
                for (int i = 0; i < xr.n; i++)
                    y[(size_t)(from + i) * n + row0 + r] = out[r * XROWS + i];
        }
    }
    return 0;
}

/* x [m, k] quantized as moe_linear quantizes it for `type`: xq int8 [m, k], scales and sums
 * [m, k / 32]. */
int moe_quantize_rows(int isa, int type, const float *x, int m, int k, int8_t *xq, float *scale,
                      float *sum)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || m <= 0 || !valid_type(type, k))
        return -1;
    struct qrows r = {xq, scale, sum, NULL, NULL, k};
    for (int i = 0; i < m; i++)
        quantize_row(isa, TYPES[type].super, 0, 0, x + (size_t)i * k, k, &r, i);
    return 0;
}

int moe_best_isa(void) { return bq_best_isa(); }

int moe_isa_supported(int isa) { return bq_cpu_has(isa); }
