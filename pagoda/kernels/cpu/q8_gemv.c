/*
 * Grouped int8 weights (GGUF's Q8_0, and the formats the loader widens to int8: Q5_0, Q5_1,
 * Q5_K) times activations quantized per block of 32, read in place:
 *
 *   y[m, n] = sum_g  s_w[n, g] * s_x[m, g] * sum_j q_w[n, g, j] * q_x[m, g, j]
 *                  + min_w[n, g] * sum_x[m, g]
 *
 * The weight is the engine's own Int8Weight: q int8 [n, k] row-major, scales [n, k / 32] in
 * fp16 or fp32, mins the same or none. Nothing is repacked or copied, so a vocabulary table
 * that the embedding lookup already holds is multiplied from the same bytes (1.06 bytes a
 * weight for Q8_0, where the same weight split into two int4 halves reads 1.5).
 *
 * Or GGUF's Q6_K blocks as the file stores them (pagoda/kernels/cpu/q6_k_blocks.h, 0.82 bytes a
 * weight): each block of 32 is unpacked to q - 32 in -32..31 and its products are scaled by
 * its two sub-block scales while still integers (below), then by d * s_x as above. Q3_K
 * (pagoda/kernels/cpu/q3_k_blocks.h, 0.43 bytes a weight) alike; IQ4_XS (iq4_xs_blocks.h, 0.53) and
 * Q5_K (q5_k_blocks.h, 0.69) with one integer scale per block of 32; Q5_K's mins are a term of
 * their own.
 *
 * Two activation widths, as in q4_gemv.c: int8 (q_x -127..127; the vocabulary projection,
 * whose top logits are recomputed exactly afterwards) and int16 (q_x -32767..32767, ~16 bits;
 * layers). AVX2's int8 product is maddubs, which takes one operand unsigned: |w| times x with
 * w's sign applied, whose pairs (2 x 128 x 127) cannot saturate int16. The int16 product is
 * madd on the weights sign-extended to 16 bits.
 *
 * Every instruction set gives the same bits: each block's integer products are summed into 8
 * int32 lanes (exact), each lane is scaled into its own fp32 accumulator with a fused
 * multiply-add, the 8 accumulators are added in one fixed order, and the mins' term is added
 * last; the scalar fallback computes the same lanes. An int16 lane is at most
 * 4 x 128 x 32767 < 2^24, so it converts to fp32 exactly. A Q6_K lane (at most
 * 4 x 32 x 128 x 32767 < 2^31) is rounded to fp32 by the same conversion on every path.
 *
 * Plain C with a C ABI; built with -fopenmp but linked without libgomp (pagoda/kernels/cpu/native.py),
 * so its parallel regions run on torch's OpenMP team.
 */

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_quant.h"
#include "half_float.h"
#include "iq4_xs_blocks.h"
#include "q3_k_blocks.h"
#include "q5_k_blocks.h"
#include "q6_k_blocks.h"

#define BLOCK BQ_BLOCK
/* Output rows that share one pass over the activation blocks. */
#define TILE_ROWS 4
/* Activation rows that share one pass over a tile's weights: their accumulators stay in the
 * 16 ymm registers AVX2 has. */
#define ROW_CHUNK 2
/* The super-block passes' (SUPER_SCALED_TYPES): their accumulators take a register a row only
 * once per super-block, so more activation rows share each unpacking of the weights. */
#define SUPER_ROW_CHUNK 4
#define LANES 8

/* bits of the `halves` argument: which of scales and mins are fp16 (else fp32); or Q6_K,
 * IQ4_XS, Q5_K, Q3_K: q is GGUF blocks of that type, which hold their own scales (scales and
 * mins NULL) */
#define SCALES_HALF 1
#define MINS_HALF 2
#define Q6_K 4
#define IQ4_XS 8
#define Q5_K 16
#define Q3_K 32
/* The types whose super-block is 8 blocks of 32 integers with an integer scale for each half
 * of a block, walked a super-block at a time (Q6_K's layout is walked by half super-blocks). */
#define SUB_BLOCK_TYPES (IQ4_XS | Q5_K | Q3_K)
#define SUB_BLOCKS 8
/* The types whose int8 activations q8_linear quantizes a super-block (256 values) to a scale,
 * as llama.cpp's Q8_K: a block's integer scale then applies in int16 and a super-block's 8
 * products add up in int32 before one float multiply (SUPER_PASS8). */
#define SUPER_SCALED_TYPES (IQ4_XS | Q5_K | Q6_K)

struct weight {
    const int8_t *q;
    const void *scales;
    const void *mins; /* NULL: symmetric */
    int halves;
    int n, k, groups;
    int vector; /* the call's instruction set has AVX2 (for min_term) */
};

struct activations {
    const void *q; /* int8 or int16 [m, k] */
    const float *scale;
    const float *sum;
    int m;
    int super; /* int8, one scale per 256 values (bq_quantize_rows_super8) */
    const uint8_t *biased; /* q + 128 as unsigned bytes, for q6k_biased_pass; or NULL */
};

int q8_isa_supported(int isa) { return bq_cpu_has(isa); }

int q8_best_isa(void) { return bq_best_isa(); }

static const uint8_t *q6k_row(const struct weight *w, size_t row)
{
    return (const uint8_t *)w->q + row * q6k_row_bytes(w->k);
}

static float param(const void *p, size_t i, int half)
{
    return half ? f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* The order BQ_HSUM256 adds a vector's 8 lanes in. */
static float sum_lanes(const float a[LANES])
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* sum_g min_w[row, g] * sum_x[i, g], in 8 lanes (lane t takes groups g = t mod 8, in order) added
 * as sum_lanes does: AVX2 computes the same lanes 8 groups an instruction. */
static float min_term_scalar(const struct weight *w, const struct activations *x, int row, int i)
{
    float lanes[LANES] = {0};
    for (int g = 0; g < w->groups; g++)
        lanes[g % LANES] = fmaf(param(w->mins, (size_t)row * w->groups + g, w->halves & MINS_HALF),
                                x->sum[(size_t)i * w->groups + g], lanes[g % LANES]);
    return sum_lanes(lanes);
}

__attribute__((target("avx2,fma,f16c")))
static float min_term_avx2(const struct weight *w, const struct activations *x, int row, int i)
{
    const float *sums = x->sum + (size_t)i * w->groups;
    size_t at = (size_t)row * w->groups;
    __m256 acc = _mm256_setzero_ps();
    int g = 0;
    for (; g + LANES <= w->groups; g += LANES) {
        __m256 mins = (w->halves & MINS_HALF)
            ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w->mins + at + g)))
            : _mm256_loadu_ps((const float *)w->mins + at + g);
        acc = _mm256_fmadd_ps(mins, _mm256_loadu_ps(sums + g), acc);
    }
    float lanes[LANES];
    _mm256_storeu_ps(lanes, acc);
    for (; g < w->groups; g++)
        lanes[g % LANES] = fmaf(param(w->mins, at + g, w->halves & MINS_HALF), sums[g],
                                lanes[g % LANES]);
    return sum_lanes(lanes);
}

static float q5k_min_term(const struct weight *w, const struct activations *x, int row, int i);

static float min_term(const struct weight *w, const struct activations *x, int row, int i)
{
    if (w->halves & Q5_K)
        return q5k_min_term(w, x, row, i);
    if (w->mins == NULL)
        return 0.0f;
    return w->vector ? min_term_avx2(w, x, row, i) : min_term_scalar(w, x, row, i);
}

/* ---- scalar: the vector bodies' lanes, one at a time --------------------------------------- */

/* Lane t of a block's int8 product: elements 4t..4t+3 (maddubs then madd, or dpbusd). */
static int32_t lane8(const int8_t *w, const int8_t *x, int t)
{
    int32_t s = 0;
    for (int j = 4 * t; j < 4 * t + 4; j++)
        s += (int32_t)w[j] * x[j];
    return s;
}

/* Lane t of a block's int16 product: elements 2t, 2t + 1 of each half of the block. */
static int32_t lane16(const int8_t *w, const int16_t *x, int t)
{
    int32_t s = 0;
    for (int j = 2 * t; j < 2 * t + 2; j++)
        s += (int32_t)w[j] * x[j] + (int32_t)w[j + 16] * x[j + 16];
    return s;
}

/* Q6_K: a block's integer products scaled by its two sub-block scales (sc[0] for values 0..15,
 * sc[1] for 16..31) while still integers. int16: lane t = the int16 lane of the weights times
 * their scale (|q sc| <= 32 x 128 fits int16); int8: the int8 lane times its half's scale. */
static int32_t q6k_lane16(const int8_t *q, const int8_t *sc, const int16_t *x, int t)
{
    int32_t s = 0;
    for (int j = 2 * t; j < 2 * t + 2; j++)
        s += (int32_t)(int16_t)(q[j] * sc[0]) * x[j]
             + (int32_t)(int16_t)(q[j + 16] * sc[1]) * x[j + 16];
    return s;
}

static int32_t q6k_lane8(const int8_t *q, const int8_t *sc, const int8_t *x, int t)
{
    return lane8(q, x, t) * sc[t / 4];
}

static void row_q6k_scalar(int wide, const struct weight *w, const struct activations *x,
                           int row, float *y)
{
    const uint8_t *base = q6k_row(w, (size_t)row);
    for (int i = 0; i < x->m; i++) {
        float acc[LANES] = {0};
        for (int g = 0; g < w->groups; g++) {
            const uint8_t *super = q6k_super(base, g);
            int8_t q[BLOCK];
            q6k_block_scalar(super, g, q);
            const int8_t *sc = q6k_scales(super, g);
            size_t b = (size_t)i * w->groups + g;
            float s = q6k_d(super) * x->scale[b];
            for (int t = 0; t < LANES; t++) {
                int32_t lane = wide ? q6k_lane16(q, sc, (const int16_t *)x->q + b * BLOCK, t)
                                    : q6k_lane8(q, sc, (const int8_t *)x->q + b * BLOCK, t);
                acc[t] = fmaf((float)lane, s, acc[t]);
            }
        }
        y[(size_t)i * w->n + row] = sum_lanes(acc);
    }
}

/* ---- IQ4_XS, Q5_K, Q3_K: per block of 32, integers and an integer scale per half ------------ */

static size_t sub_block_row_bytes(const struct weight *w)
{
    if (w->halves & IQ4_XS)
        return iq4xs_row_bytes(w->k);
    return (w->halves & Q5_K) ? q5k_row_bytes(w->k) : q3k_row_bytes(w->k);
}

static const uint8_t *sub_block_row(const struct weight *w, size_t row)
{
    return (const uint8_t *)w->q + row * sub_block_row_bytes(w);
}

/* A super-block's block j: its values, the scales of its halves (values 0..15, 16..31), d. */
static void sub_block_scalar(const struct weight *w, const uint8_t *super, int j, int8_t q[32],
                             int sc[2], float *d)
{
    if (w->halves & IQ4_XS) {
        iq4xs_block_scalar(super, j, q);
        sc[0] = sc[1] = iq4xs_scale(super, j);
        *d = iq4xs_d(super);
    } else if (w->halves & Q5_K) {
        q5k_block_scalar(super, j, q);
        sc[0] = sc[1] = q5k_scale(super, j, 0);
        *d = q5k_d(super);
    } else {
        q3k_block_scalar(super, j, q);
        sc[0] = q3k_scale(super, 2 * j);
        sc[1] = q3k_scale(super, 2 * j + 1);
        *d = q3k_d(super);
    }
}

static void row_sub_block_scalar(int wide, const struct weight *w, const struct activations *x,
                                 int row, float *y)
{
    const uint8_t *base = sub_block_row(w, (size_t)row);
    size_t super_bytes = sub_block_row_bytes(w) / (size_t)(w->groups / SUB_BLOCKS);
    for (int i = 0; i < x->m; i++) {
        float acc[LANES] = {0};
        for (int g = 0; g < w->groups; g++) {
            int8_t q[BLOCK];
            int sc[2];
            float d;
            sub_block_scalar(w, base + (size_t)(g / SUB_BLOCKS) * super_bytes, g % SUB_BLOCKS, q,
                             sc, &d);
            size_t b = (size_t)i * w->groups + g;
            const void *xb = wide ? (const void *)((const int16_t *)x->q + b * BLOCK)
                                  : (const void *)((const int8_t *)x->q + b * BLOCK);
            /* Q3_K: its halves' scales on the integers, as Q6_K's; one scale a block: on
             * the float (d sc is exact), so the lanes are the int8 weights' own. */
            int halves_scaled = (w->halves & Q3_K) != 0;
            float s = halves_scaled ? d * x->scale[b] : (d * (float)sc[0]) * x->scale[b];
            int8_t sc8[2] = {(int8_t)sc[0], (int8_t)sc[1]};
            for (int t = 0; t < LANES; t++) {
                int32_t lane = halves_scaled
                    ? (wide ? q6k_lane16(q, sc8, xb, t) : q6k_lane8(q, sc8, xb, t))
                    : (wide ? lane16(q, xb, t) : lane8(q, xb, t));
                acc[t] = fmaf((float)lane, s, acc[t]);
            }
        }
        y[(size_t)i * w->n + row] = sum_lanes(acc) + min_term(w, x, row, i);
    }
}

/* Q5_K's mins: - sum_j dmin m_j sum_x[j], lane t taking each super-block's block t (the 8
 * lanes of min_term's other layouts, as every super-block has 8 blocks). dmin times a six-bit
 * m is exact in fp32, so the vector body's product gives the same bits. */
static float q5k_min_term_scalar(const struct weight *w, const struct activations *x, int row,
                                 int i)
{
    const uint8_t *base = sub_block_row(w, (size_t)row);
    const float *sums = x->sum + (size_t)i * w->groups;
    float lanes[LANES] = {0};
    for (int s = 0; s < w->groups / SUB_BLOCKS; s++) {
        const uint8_t *super = base + (size_t)s * Q5K_BYTES;
        float dmin = q5k_dmin(super);
        for (int j = 0; j < SUB_BLOCKS; j++)
            lanes[j] = fmaf(-(dmin * (float)q5k_scale(super, j, 1)), sums[s * SUB_BLOCKS + j],
                            lanes[j]);
    }
    return sum_lanes(lanes);
}

__attribute__((target("avx2,fma,f16c")))
static float q5k_min_term_avx2(const struct weight *w, const struct activations *x, int row,
                               int i)
{
    const uint8_t *base = sub_block_row(w, (size_t)row);
    const float *sums = x->sum + (size_t)i * w->groups;
    __m256 acc = _mm256_setzero_ps();
    for (int s = 0; s < w->groups / SUB_BLOCKS; s++) {
        const uint8_t *super = base + (size_t)s * Q5K_BYTES;
        int32_t m[SUB_BLOCKS];
        for (int j = 0; j < SUB_BLOCKS; j++)
            m[j] = q5k_scale(super, j, 1);
        __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)m)),
                                    _mm256_set1_ps(-q5k_dmin_f16c(super)));
        acc = _mm256_fmadd_ps(mins, _mm256_loadu_ps(sums + s * SUB_BLOCKS), acc);
    }
    float lanes[LANES];
    _mm256_storeu_ps(lanes, acc);
    return sum_lanes(lanes);
}

static float q5k_min_term(const struct weight *w, const struct activations *x, int row, int i)
{
    return w->vector ? q5k_min_term_avx2(w, x, row, i) : q5k_min_term_scalar(w, x, row, i);
}

static void row_scalar(int wide, const struct weight *w, const struct activations *x, int row,
                       float *y)
{
    if (w->halves & Q6_K) {
        row_q6k_scalar(wide, w, x, row, y);
        return;
    }
    if (w->halves & SUB_BLOCK_TYPES) {
        row_sub_block_scalar(wide, w, x, row, y);
        return;
    }
    int k = w->k, groups = w->groups;
    for (int i = 0; i < x->m; i++) {
        float acc[LANES] = {0};
        for (int g = 0; g < groups; g++) {
            const int8_t *wq = w->q + (size_t)row * k + g * BLOCK;
            size_t b = (size_t)i * groups + g;
            float s = param(w->scales, (size_t)row * groups + g, w->halves & SCALES_HALF)
                      * x->scale[b];
            for (int t = 0; t < LANES; t++) {
                int32_t lane = wide ? lane16(wq, (const int16_t *)x->q + b * BLOCK, t)
                                    : lane8(wq, (const int8_t *)x->q + b * BLOCK, t);
                acc[t] = fmaf((float)lane, s, acc[t]);
            }
        }
        y[(size_t)i * w->n + row] = sum_lanes(acc) + min_term(w, x, row, i);
    }
}

/* ---- AVX2 and AVX-512 VNNI ----------------------------------------------------------------- */

__attribute__((target("avx2,fma,f16c"), always_inline))
static inline float scale_at(const struct weight *w, size_t i)
{
    if (w->halves & SCALES_HALF)
        return _cvtsh_ss(((const uint16_t *)w->scales)[i]);
    return ((const float *)w->scales)[i];
}

/* A pass's accumulators: activation rows x weight rows. */
#define ZERO_ACCUMULATORS_OF(acc, chunk)                                                    \
    __m256 acc[chunk][TILE_ROWS];                                                           \
    for (int i_ = 0; i_ < (chunk); i_++)                                                    \
        for (int r_ = 0; r_ < TILE_ROWS; r_++)                                              \
            acc[i_][r_] = _mm256_setzero_ps()
#define ZERO_ACCUMULATORS(acc) ZERO_ACCUMULATORS_OF(acc, ROW_CHUNK)

/* The accumulators of `rows` weight rows x `irows` activation rows, summed into y. */
#define STORE_ACCUMULATORS(acc, rows, irows)                                                \
    for (int i = 0; i < (irows); i++)                                                      \
        for (int r = 0; r < (rows); r++) {                                                 \
            float s_;                                                                      \
            BQ_HSUM256(acc[i][r], s_);                                                     \
            y[(size_t)(i0 + i) * w->n + row0 + r] = s_ + min_term(w, x, row0 + r, i0 + i);  \
        }

/* A tile's rows are adjacent in memory: while its group g is read, the next tile's g-th
 * share of bytes is fetched, so the rows stream as one sequence (a prefetch never faults). */
#define PREFETCH_NEXT_TILE(row0, g)                                                         \
    do {                                                                                    \
        const char *next_ = (const char *)(w->q + (size_t)((row0) + TILE_ROWS) * w->k)      \
                            + (size_t)(g) * TILE_ROWS * BLOCK;                              \
        _mm_prefetch(next_, _MM_HINT_T0);                                                   \
        _mm_prefetch(next_ + 64, _MM_HINT_T0);                                              \
    } while (0)

/* The fp32 products s_w[row, g] s_x[i, g] of SCALE_RUN groups from g0, for the tile's rows
 * and the pass's activation rows: the weight scales converted 8 at a time and multiplied by the
 * activations' in one instruction, where a block took a scalar conversion, a scalar multiply
 * and a broadcast; a block then reads its product with one broadcast load. The same products
 * (a group past the last run forms its own as before), so the same bits. */
#define SCALE_RUN 8
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void scale_products(const struct weight *w, const struct activations *x, int row0,
                                  int rows, int i0, int irows, int g0,
                                  float out[ROW_CHUNK][TILE_ROWS][SCALE_RUN])
{
    for (int r = 0; r < rows; r++) {
        size_t at = (size_t)(row0 + r) * w->groups + g0;
        __m256 sw = (w->halves & SCALES_HALF)
            ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w->scales + at)))
            : _mm256_loadu_ps((const float *)w->scales + at);
        for (int i = 0; i < irows; i++)
            _mm256_storeu_ps(out[i][r], _mm256_mul_ps(
                sw, _mm256_loadu_ps(x->scale + (size_t)(i0 + i) * w->groups + g0)));
    }
}

/* A pass's groups: runs of SCALE_RUN with their scale products (BODY(g, product of activation
 * row i and tile row r)), then the last groups one at a time. The run stays a loop: unrolled,
 * it was no faster from the caches and 4-8% slower from memory on one core (perhaps as each of
 * its 32 loads of weights then walked its own stream, 256 bytes a step). */
#define GROUPS_WITH_SCALES(BODY)                                                            \
    int g_ = 0;                                                                             \
    for (; g_ + SCALE_RUN <= w->groups; g_ += SCALE_RUN) {                                  \
        float s_[ROW_CHUNK][TILE_ROWS][SCALE_RUN];                                          \
        scale_products(w, x, row0, rows, i0, irows, g_, s_);                                \
        _Pragma("GCC unroll 1")                                                             \
        for (int j_ = 0; j_ < SCALE_RUN; j_++)                                              \
            BODY(g_ + j_, _mm256_broadcast_ss(&s_[i][r][j_]));                              \
    }                                                                                       \
    for (; g_ < w->groups; g_++)                                                            \
        BODY(g_, _mm256_set1_ps(scale_at(w, (size_t)(row0 + r) * w->groups + g_)           \
                                * x->scale[(size_t)(i0 + i) * w->groups + g_]))

/* A group g of DEFINE_PASS8: activation blocks loaded once for the tile's rows. */
#define PASS8_GROUP(DOT, g, PRODUCT)                                                        \
    do {                                                                                    \
        __m256i xv[ROW_CHUNK];                                                              \
        for (int i = 0; i < irows; i++)                                                     \
            xv[i] = _mm256_loadu_si256(                                                     \
                (const __m256i *)(xq + ((size_t)(i0 + i) * w->groups + (g)) * BLOCK));      \
        PREFETCH_NEXT_TILE(row0, g);                                                        \
        for (int r = 0; r < rows; r++) {                                                    \
            __m256i wv = _mm256_loadu_si256(                                                \
                (const __m256i *)(w->q + (size_t)(row0 + r) * w->k + (g) * BLOCK));         \
            __m256i abs_w = _mm256_sign_epi8(wv, wv);                                       \
            for (int i = 0; i < irows; i++) {                                               \
                __m256 p = _mm256_cvtepi32_ps(DOT(abs_w, _mm256_sign_epi8(xv[i], wv)));     \
                acc[i][r] = _mm256_fmadd_ps(p, PRODUCT, acc[i][r]);                         \
            }                                                                               \
        }                                                                                   \
    } while (0)

/* rows (1 or TILE_ROWS) weight rows from row0 against irows (1..ROW_CHUNK) activation rows
 * from i0; called with constant counts, so every accumulator stays in a register. */
#define DEFINE_PASS8(NAME, TARGET, DOT)                                                     \
    __attribute__((target(TARGET), always_inline))                                          \
    static inline void NAME(const struct weight *w, const struct activations *x, int row0,  \
                            int rows, int i0, int irows, float *y)                          \
    {                                                                                       \
        const int8_t *xq = (const int8_t *)x->q;                                            \
        ZERO_ACCUMULATORS(acc);                                                             \
        GROUPS_WITH_SCALES(PASS8_##DOT);                                                    \
        STORE_ACCUMULATORS(acc, rows, irows)                                                \
    }
#define PASS8_bq_dot8_avx2(g, PRODUCT) PASS8_GROUP(bq_dot8_avx2, g, PRODUCT)
#define PASS8_bq_dot8_vnni(g, PRODUCT) PASS8_GROUP(bq_dot8_vnni, g, PRODUCT)

/* A group g of DEFINE_PASS16. */
#define PASS16_GROUP(DOT, g, PRODUCT)                                                       \
    do {                                                                                    \
        __m256i xlo[ROW_CHUNK], xhi[ROW_CHUNK];                                             \
        for (int i = 0; i < irows; i++) {                                                   \
            const int16_t *xb = xq + ((size_t)(i0 + i) * w->groups + (g)) * BLOCK;          \
            xlo[i] = _mm256_loadu_si256((const __m256i *)xb);                               \
            xhi[i] = _mm256_loadu_si256((const __m256i *)(xb + 16));                        \
        }                                                                                   \
        PREFETCH_NEXT_TILE(row0, g);                                                        \
        for (int r = 0; r < rows; r++) {                                                    \
            const int8_t *wq = w->q + (size_t)(row0 + r) * w->k + (g) * BLOCK;              \
            __m256i wlo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wq));       \
            __m256i whi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wq + 16))); \
            for (int i = 0; i < irows; i++) {                                               \
                __m256 p = _mm256_cvtepi32_ps(DOT(wlo, whi, xlo[i], xhi[i]));               \
                acc[i][r] = _mm256_fmadd_ps(p, PRODUCT, acc[i][r]);                         \
            }                                                                               \
        }                                                                                   \
    } while (0)

#define DEFINE_PASS16(NAME, TARGET, DOT)                                                    \
    __attribute__((target(TARGET), always_inline))                                          \
    static inline void NAME(const struct weight *w, const struct activations *x, int row0,  \
                            int rows, int i0, int irows, float *y)                          \
    {                                                                                       \
        const int16_t *xq = (const int16_t *)x->q;                                          \
        ZERO_ACCUMULATORS(acc);                                                             \
        GROUPS_WITH_SCALES(PASS16_##DOT);                                                   \
        STORE_ACCUMULATORS(acc, rows, irows)                                                \
    }
#define PASS16_bq_dot16_avx2(g, PRODUCT) PASS16_GROUP(bq_dot16_avx2, g, PRODUCT)
#define PASS16_bq_dot16_vnni(g, PRODUCT) PASS16_GROUP(bq_dot16_vnni, g, PRODUCT)

/* Q6_K passes walk half super-blocks (four blocks of 32, unpacked from three loads per row).
 * While one is read, the next tile's matching share of bytes (4 rows x 105) is fetched, so
 * the tiles stream as one sequence, as PREFETCH_NEXT_TILE does for int8 rows. */
#define Q6K_HALF_BYTES (Q6K_BYTES / 2)
#define Q6K_PREFETCH_NEXT_TILE(tile, row_bytes, at)                                         \
    do {                                                                                    \
        const char *next_ = (const char *)(tile) + TILE_ROWS * (row_bytes)                  \
                            + TILE_ROWS * (at);                                             \
        for (int c_ = 0; c_ < TILE_ROWS * Q6K_HALF_BYTES; c_ += 64)                         \
            _mm_prefetch(next_ + c_, _MM_HINT_T0);                                          \
    } while (0)

/* Where half super-block g0 / 4 (blocks g0 .. g0 + 3) starts in a row, and which half (*h) it
 * is; the next tile's matching share is prefetched. */
static inline size_t q6k_half_at(const uint8_t *tile, size_t row_bytes, int g0, int *h)
{
    size_t at = (size_t)(g0 / Q6K_BLOCKS) * Q6K_BYTES;
    *h = (g0 % Q6K_BLOCKS) / 4;
    Q6K_PREFETCH_NEXT_TILE(tile, row_bytes, at + (size_t)*h * Q6K_HALF_BYTES);
    return at;
}

/* Walks a tile's Q6_K blocks: per half super-block g0 (blocks g0 .. g0 + 3) and tile row r,
 * the row's four blocks, then per block g: its 32 values qv, the scales of its halves sc_lo
 * and sc_hi (values 0..15 and 16..31), and d; the body runs per block. */
#define Q6K_WALK(...)                                                                       \
    size_t row_bytes = q6k_row_bytes(w->k);                                                 \
    const uint8_t *tile = (const uint8_t *)w->q + (size_t)row0 * row_bytes;                 \
    for (int g0 = 0; g0 < w->groups; g0 += 4) {                                             \
        int h;                                                                              \
        size_t at = q6k_half_at(tile, row_bytes, g0, &h);                                   \
        for (int r = 0; r < rows; r++) {                                                    \
            const uint8_t *super = tile + (size_t)r * row_bytes + at;                       \
            const int8_t *sc = (const int8_t *)(super + Q6K_SCALES_AT) + 8 * h;             \
            float d = q6k_d_f16c(super);                                                    \
            __m256i q[4];                                                                   \
            q6k_half_avx2(super, h, q);                                                     \
            for (int j = 0; j < 4; j++) {                                                   \
                __m256i qv = q[j];                                                          \
                int sc_lo = sc[2 * j], sc_hi = sc[2 * j + 1];                               \
                size_t g = (size_t)g0 + j;                                                  \
                __VA_ARGS__                                                                 \
            }                                                                               \
        }                                                                                   \
    }

/* Opens the loop over a tile's super-blocks s (at: where s starts in a row), fetching the next
 * tile's matching share of bytes while this one is read, as for Q6_K. */
#define SUPER_BLOCKS_OF_TILE(FMT, FMT_BYTES)                                                \
    size_t row_bytes = FMT##_row_bytes(w->k);                                               \
    const uint8_t *tile = (const uint8_t *)w->q + (size_t)row0 * row_bytes;                 \
    for (int s = 0; s < w->groups / SUB_BLOCKS; s++) {                                      \
        size_t at = (size_t)s * (FMT_BYTES);                                                \
        const char *next_ = (const char *)tile + TILE_ROWS * (row_bytes + at);              \
        for (int c_ = 0; c_ < TILE_ROWS * (FMT_BYTES); c_ += 64)                            \
            _mm_prefetch(next_ + c_, _MM_HINT_T0);

/* The same for Q3_K (FMT: its header's prefix): per super-block s and tile row r, its d, then
 * per block its values (FMT's AVX2 unpacking) and its halves' integer scales (SCALE_LO,
 * SCALE_HI). While one super-block is read, the next tile's matching share is fetched, as for
 * Q6_K. */
#define SUB_BLOCKS_OF(FMT, FMT_BYTES, SCALE_LO, SCALE_HI, ...)                              \
    SUPER_BLOCKS_OF_TILE(FMT, FMT_BYTES)                                                    \
        for (int r = 0; r < rows; r++) {                                                    \
            const uint8_t *super = tile + (size_t)r * row_bytes + at;                       \
            float d = FMT##_d_f16c(super);                                                  \
            for (int j = 0; j < SUB_BLOCKS; j++) {                                          \
                __m256i qv = FMT##_block_avx2(super, j);                                    \
                int sc_lo = SCALE_LO(super, j), sc_hi = SCALE_HI(super, j);                 \
                size_t g = (size_t)s * SUB_BLOCKS + j;                                      \
                __VA_ARGS__                                                                 \
            }                                                                               \
        }                                                                                   \
    }
#define Q5K_SCALE(super, j) q5k_scale(super, j, 0)
#define Q3K_SCALE_LO(super, j) q3k_scale(super, 2 * (j))
#define Q3K_SCALE_HI(super, j) q3k_scale(super, 2 * (j) + 1)
#define Q3K_WALK(...) SUB_BLOCKS_OF(q3k, Q3K_BYTES, Q3K_SCALE_LO, Q3K_SCALE_HI, __VA_ARGS__)

/* As DEFINE_PASS8 for GGUF blocks (WALK: Q6K_WALK, Q3K_WALK): the lanes
 * times their half's integer scale as int32. */
#define DEFINE_BLOCKS_PASS8(NAME, TARGET, DOT, WALK)                                        \
    __attribute__((target(TARGET), always_inline))                                          \
    static inline void NAME(const struct weight *w, const struct activations *x, int row0,  \
                            int rows, int i0, int irows, float *y)                          \
    {                                                                                       \
        const int8_t *xq = (const int8_t *)x->q;                                            \
        ZERO_ACCUMULATORS(acc);                                                             \
        WALK(                                                                               \
            __m256i abs_w = _mm256_sign_epi8(qv, qv);                                       \
            __m256i scv = _mm256_setr_m128i(_mm_set1_epi32(sc_lo), _mm_set1_epi32(sc_hi));  \
            for (int i = 0; i < irows; i++) {                                               \
                size_t b = (size_t)(i0 + i) * w->groups + g;                                \
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK));         \
                __m256i dot = DOT(abs_w, _mm256_sign_epi8(xv, qv));                         \
                __m256 p = _mm256_cvtepi32_ps(_mm256_mullo_epi32(dot, scv));                \
                acc[i][r] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * x->scale[b]), acc[i][r]); \
            })                                                                              \
        STORE_ACCUMULATORS(acc, rows, irows)                                                \
    }

/* As DEFINE_PASS16 for GGUF blocks: the weights times their half's integer scale in int16
 * first (|q sc| <= 32 x 128). */
#define DEFINE_BLOCKS_PASS16(NAME, TARGET, DOT, WALK)                                       \
    __attribute__((target(TARGET), always_inline))                                          \
    static inline void NAME(const struct weight *w, const struct activations *x, int row0,  \
                            int rows, int i0, int irows, float *y)                          \
    {                                                                                       \
        const int16_t *xq = (const int16_t *)x->q;                                          \
        ZERO_ACCUMULATORS(acc);                                                             \
        WALK(                                                                               \
            __m256i wlo = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(qv)), \
                                             _mm256_set1_epi16((int16_t)sc_lo));            \
            __m256i whi = _mm256_mullo_epi16(                                               \
                _mm256_cvtepi8_epi16(_mm256_extracti128_si256(qv, 1)),                      \
                _mm256_set1_epi16((int16_t)sc_hi));                                         \
            for (int i = 0; i < irows; i++) {                                               \
                size_t b = (size_t)(i0 + i) * w->groups + g;                                \
                __m256i xlo = _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK));        \
                __m256i xhi = _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK + 16));   \
                __m256 p = _mm256_cvtepi32_ps(DOT(wlo, whi, xlo, xhi));                     \
                acc[i][r] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * x->scale[b]), acc[i][r]); \
            })                                                                              \
        STORE_ACCUMULATORS(acc, rows, irows)                                                \
    }

/* IQ4_XS and Q5_K: one scale a block, so it goes on the float scale (d sc is exact in fp32)
 * and a block's lanes are the int8 weights' own: no integer multiply. As the int8 weights'
 * passes, a block's activations are loaded once for the tile's rows; per super-block each
 * row's d is converted once. FMT: the header's prefix. */
#define SCALED_BLOCKS(FMT, FMT_BYTES, SCALE, LOAD_X, ...)                                   \
    SUPER_BLOCKS_OF_TILE(FMT, FMT_BYTES)                                                    \
        const uint8_t *super[TILE_ROWS];                                                    \
        float d[TILE_ROWS];                                                                 \
        for (int r = 0; r < rows; r++) {                                                    \
            super[r] = tile + (size_t)r * row_bytes + at;                                   \
            d[r] = FMT##_d_f16c(super[r]);                                                  \
        }                                                                                   \
        for (int j = 0; j < SUB_BLOCKS; j++) {                                              \
            size_t g = (size_t)s * SUB_BLOCKS + j;                                          \
            LOAD_X                                                                          \
            for (int r = 0; r < rows; r++) {                                                \
                __m256i qv = FMT##_block_avx2(super[r], j);                                 \
                float sw = d[r] * (float)SCALE(super[r], j);                                \
                __VA_ARGS__                                                                 \
            }                                                                               \
        }                                                                                   \
    }

#define DEFINE_SCALED_PASS8(NAME, TARGET, DOT, FMT, FMT_BYTES, SCALE)                       \
    __attribute__((target(TARGET), always_inline))                                          \
    static inline void NAME(const struct weight *w, const struct activations *x, int row0,  \
                            int rows, int i0, int irows, float *y)                          \
    {                                                                                       \
        const int8_t *xq = (const int8_t *)x->q;                                            \
        ZERO_ACCUMULATORS(acc);                                                             \
        __m256i xv[ROW_CHUNK];                                                              \
        float sx[ROW_CHUNK];                                                                \
        SCALED_BLOCKS(FMT, FMT_BYTES, SCALE,                                                \
            for (int i = 0; i < irows; i++) {                                               \
                size_t b = (size_t)(i0 + i) * w->groups + g;                                \
                xv[i] = _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK));              \
                sx[i] = x->scale[b];                                                        \
            },                                                                              \
            __m256i abs_w = _mm256_sign_epi8(qv, qv);                                       \
            for (int i = 0; i < irows; i++) {                                               \
                __m256 p = _mm256_cvtepi32_ps(DOT(abs_w, _mm256_sign_epi8(xv[i], qv)));     \
                acc[i][r] = _mm256_fmadd_ps(p, _mm256_set1_ps(sw * sx[i]), acc[i][r]);      \
            })                                                                              \
        STORE_ACCUMULATORS(acc, rows, irows)                                                \
    }

#define DEFINE_SCALED_PASS16(NAME, TARGET, DOT, FMT, FMT_BYTES, SCALE)                      \
    __attribute__((target(TARGET), always_inline))                                          \
    static inline void NAME(const struct weight *w, const struct activations *x, int row0,  \
                            int rows, int i0, int irows, float *y)                          \
    {                                                                                       \
        const int16_t *xq = (const int16_t *)x->q;                                          \
        ZERO_ACCUMULATORS(acc);                                                             \
        __m256i xlo[ROW_CHUNK], xhi[ROW_CHUNK];                                             \
        float sx[ROW_CHUNK];                                                                \
        SCALED_BLOCKS(FMT, FMT_BYTES, SCALE,                                                \
            for (int i = 0; i < irows; i++) {                                               \
                size_t b = (size_t)(i0 + i) * w->groups + g;                                \
                xlo[i] = _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK));             \
                xhi[i] = _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK + 16));        \
                sx[i] = x->scale[b];                                                        \
            },                                                                              \
            __m256i wlo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qv));                 \
            __m256i whi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(qv, 1));            \
            for (int i = 0; i < irows; i++) {                                               \
                __m256 p = _mm256_cvtepi32_ps(DOT(wlo, whi, xlo[i], xhi[i]));               \
                acc[i][r] = _mm256_fmadd_ps(p, _mm256_set1_ps(sw * sx[i]), acc[i][r]);      \
            })                                                                              \
        STORE_ACCUMULATORS(acc, rows, irows)                                                \
    }

/* IQ4_XS and Q5_K against int8 activations with a scale per super-block (x->super): per
 * super-block and row, each block's maddubs pairs times the block's integer scale (madd;
 * |pair| <= 2 x 127 x 127, |sc| <= 63) add up in int32 over the 8 blocks, then one conversion
 * and one multiply by d s_x. The scales of a super-block are unpacked at once, each lane of
 * `scale32` a block's scale twice in int16 (what madd multiplies by), and a block's is
 * broadcast from it by one permute. Plain AVX2, also where VNNI runs (its dpbusd sums in
 * fours, past where the scale could apply in int16). */

/* The accumulators of `rows` weight rows x `irows` activation rows into y, as is (the
 * passes below fold Q5_K's mins in themselves). */
#define STORE_SUMS(acc, rows, irows)                                                        \
    for (int i = 0; i < (irows); i++)                                                      \
        for (int r = 0; r < (rows); r++) {                                                 \
            float s_;                                                                      \
            BQ_HSUM256(acc[i][r], s_);                                                     \
            y[(size_t)(i0 + i) * w->n + row0 + r] = s_;                                    \
        }

/* Blocks 2p and 2p + 1 of activation row b0 (its super-block's first block) as IQ4_XS pairs
 * them: values 0..15 of each (*lo), then 16..31 of each (*hi). */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void iq4xs_pair_x(const int8_t *xq, size_t b0, int p, __m256i *lo, __m256i *hi)
{
    __m256i a = _mm256_loadu_si256((const __m256i *)(xq + (b0 + 2 * p) * BLOCK));
    __m256i b = _mm256_loadu_si256((const __m256i *)(xq + (b0 + 2 * p + 1) * BLOCK));
    *lo = _mm256_permute2x128_si256(a, b, 0x20);
    *hi = _mm256_permute2x128_si256(a, b, 0x31);
}

/* A super-block's two blocks 2p, 2p + 1 at once: the 32 bytes of their values hold 0..15 of
 * each in the low nibbles and 16..31 in the high ones. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void iq4xs_super8_pass(const struct weight *w, const struct activations *x,
                                     int row0, int rows, int i0, int irows, float *y)
{
    const int8_t *xq = (const int8_t *)x->q;
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)iq4xs_levels));
    const __m256i nibble = _mm256_set1_epi8(15);
    ZERO_ACCUMULATORS_OF(acc, SUPER_ROW_CHUNK);
    SUPER_BLOCKS_OF_TILE(iq4xs, IQ4XS_BYTES)
        size_t b0[SUPER_ROW_CHUNK];
        __m256i xlo[SUPER_ROW_CHUNK][SUB_BLOCKS / 2], xhi[SUPER_ROW_CHUNK][SUB_BLOCKS / 2];
        for (int i = 0; i < irows; i++) {
            b0[i] = (size_t)(i0 + i) * w->groups + (size_t)s * SUB_BLOCKS;
            for (int p = 0; p < SUB_BLOCKS / 2; p++)
                iq4xs_pair_x(xq, b0[i], p, &xlo[i][p], &xhi[i][p]);
        }
        for (int r = 0; r < rows; r++) {
            const uint8_t *super = tile + (size_t)r * row_bytes + at;
            __m256i scale32 = bq_twice16(iq4xs_scales_avx2(super));
            __m256i isum[SUPER_ROW_CHUNK];
            for (int i = 0; i < irows; i++)
                isum[i] = _mm256_setzero_si256();
            for (int p = 0; p < SUB_BLOCKS / 2; p++) {
                __m256i qs = _mm256_loadu_si256(
                    (const __m256i *)(super + IQ4XS_QS_AT + 32 * p));
                __m256i wlo = _mm256_shuffle_epi8(table, _mm256_and_si256(qs, nibble));
                __m256i whi = _mm256_shuffle_epi8(
                    table, _mm256_and_si256(_mm256_srli_epi16(qs, 4), nibble));
                __m256i sc = _mm256_permutevar8x32_epi32(
                    scale32, _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1,
                                               2 * p + 1, 2 * p + 1));
                __m256i alo = _mm256_sign_epi8(wlo, wlo), ahi = _mm256_sign_epi8(whi, whi);
                /* Each half's pairs reach 2 x 127 x 127: they take the scale apart, in
                 * int32 (their sum would leave int16). */
                for (int i = 0; i < irows; i++) {
                    __m256i lo = _mm256_maddubs_epi16(alo, _mm256_sign_epi8(xlo[i][p], wlo));
                    __m256i hi = _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(xhi[i][p], whi));
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_add_epi32(_mm256_madd_epi16(lo, sc),
                                                                         _mm256_madd_epi16(hi, sc)));
                }
            }
            float d = iq4xs_d_f16c(super);
            for (int i = 0; i < irows; i++)
                acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]),
                                            _mm256_set1_ps(d * x->scale[b0[i]]), acc[i][r]);
        }
    }
    STORE_SUMS(acc, rows, irows)
}

/* Q5_K's values are 0..31, so maddubs takes them as they are (no sign moves); blocks 2p and
 * 2p + 1 share the bytes of their low four bits. Its mins go in here too: - dmin m_j times the
 * block's activation sum, 8 blocks a multiply-add. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void q5k_super8_pass(const struct weight *w, const struct activations *x,
                                   int row0, int rows, int i0, int irows, float *y)
{
    const int8_t *xq = (const int8_t *)x->q;
    const __m256i nibble = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    ZERO_ACCUMULATORS_OF(acc, SUPER_ROW_CHUNK);
    SUPER_BLOCKS_OF_TILE(q5k, Q5K_BYTES)
        size_t b0[SUPER_ROW_CHUNK];
        for (int i = 0; i < irows; i++)
            b0[i] = (size_t)(i0 + i) * w->groups + (size_t)s * SUB_BLOCKS;
        for (int r = 0; r < rows; r++) {
            const uint8_t *super = tile + (size_t)r * row_bytes + at;
            __m256i scales, mins;
            q5k_scales_avx2(super, &scales, &mins);
            __m256i scale32 = bq_twice16(scales);
            __m256i qh = _mm256_loadu_si256((const __m256i *)(super + Q5K_QH_AT));
            __m256i isum[SUPER_ROW_CHUNK];
            for (int i = 0; i < irows; i++)
                isum[i] = _mm256_setzero_si256();
            for (int p = 0; p < SUB_BLOCKS / 2; p++) {
                __m256i qs = _mm256_loadu_si256((const __m256i *)(super + Q5K_QS_AT + 32 * p));
                __m256i w0 = _mm256_or_si256(_mm256_and_si256(qs, nibble),
                                             q5k_fifth_bits(qh, 2 * p, sixteen));
                __m256i w1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), nibble),
                                             q5k_fifth_bits(qh, 2 * p + 1, sixteen));
                __m256i sc0 = _mm256_permutevar8x32_epi32(scale32, _mm256_set1_epi32(2 * p));
                __m256i sc1 = _mm256_permutevar8x32_epi32(scale32, _mm256_set1_epi32(2 * p + 1));
                for (int i = 0; i < irows; i++) {
                    const int8_t *xb = xq + (b0[i] + 2 * p) * BLOCK;
                    __m256i x0 = _mm256_loadu_si256((const __m256i *)xb);
                    __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb + BLOCK));
                    isum[i] = _mm256_add_epi32(
                        isum[i],
                        _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w0, x0), sc0),
                                         _mm256_madd_epi16(_mm256_maddubs_epi16(w1, x1), sc1)));
                }
            }
            float d = q5k_d_f16c(super);
            __m256 neg_mins = _mm256_mul_ps(_mm256_cvtepi32_ps(mins),
                                            _mm256_set1_ps(-q5k_dmin_f16c(super)));
            for (int i = 0; i < irows; i++) {
                acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]),
                                            _mm256_set1_ps(d * x->scale[b0[i]]), acc[i][r]);
                acc[i][r] = _mm256_fmadd_ps(neg_mins, _mm256_loadu_ps(x->sum + b0[i]),
                                            acc[i][r]);
            }
        }
    }
    STORE_SUMS(acc, rows, irows)
}

/* A Q6_K super-block's 8 blocks of 32 values as stored, q + 32 (0..63). */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void q6k_unsigned_blocks(const uint8_t *super, __m256i u[SUB_BLOCKS])
{
    const __m256i low = _mm256_set1_epi8(15), high = _mm256_set1_epi8(3 << 4);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = super + 64 * h;
        __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(super + Q6K_QH_AT + 32 * h));
        __m256i lo[4] = {l0, l1, _mm256_srli_epi16(l0, 4), _mm256_srli_epi16(l1, 4)};
        __m256i hi[4] = {_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 2), qh,
                         _mm256_srli_epi16(qh, 2)};
        for (int jj = 0; jj < 4; jj++)
            u[4 * h + jj] = _mm256_or_si256(_mm256_and_si256(lo[jj], low),
                                            _mm256_and_si256(hi[jj], high));
    }
}

/* Q6_K's values as 0..63 (q + 32), so maddubs takes them as they are; the 32 x_j it adds too
 * many per pair are taken back in int16 (maddubs of 32 and x, per activation row and
 * super-block, shared by a tile's rows) before each half's scale (one per 16 values) applies.
 * |pair| <= 2 x 63 x 127 + 2 x 32 x 127, times |sc| <= 128, in int32. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void q6k_super8_pass(const struct weight *w, const struct activations *x,
                                   int row0, int rows, int i0, int irows, float *y)
{
    const int8_t *xq = (const int8_t *)x->q;
    const __m256i thirty_two = _mm256_set1_epi8(32);
    ZERO_ACCUMULATORS_OF(acc, SUPER_ROW_CHUNK);
    SUPER_BLOCKS_OF_TILE(q6k, Q6K_BYTES)
        size_t b0[SUPER_ROW_CHUNK];
        __m256i xs[SUPER_ROW_CHUNK][SUB_BLOCKS], extra[SUPER_ROW_CHUNK][SUB_BLOCKS];
        for (int i = 0; i < irows; i++) {
            b0[i] = (size_t)(i0 + i) * w->groups + (size_t)s * SUB_BLOCKS;
            for (int j = 0; j < SUB_BLOCKS; j++) {
                xs[i][j] = _mm256_loadu_si256((const __m256i *)(xq + (b0[i] + j) * BLOCK));
                extra[i][j] = _mm256_maddubs_epi16(thirty_two, xs[i][j]);
            }
        }
        for (int r = 0; r < rows; r++) {
            const uint8_t *super = tile + (size_t)r * row_bytes + at;
            __m128i scales = _mm_loadu_si128((const __m128i *)(super + Q6K_SCALES_AT));
            __m256i isum[SUPER_ROW_CHUNK];
            for (int i = 0; i < irows; i++)
                isum[i] = _mm256_setzero_si256();
            __m256i u[SUB_BLOCKS];
            q6k_unsigned_blocks(super, u);
#pragma GCC unroll 8
            for (int j = 0; j < SUB_BLOCKS; j++) {
                /* [sc 2j x 8 | sc 2j + 1 x 8] in int16: the halves' scales. */
                __m128i pick = _mm_setr_epi8(2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j,
                                             2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                             2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1);
                __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick));
                for (int i = 0; i < irows; i++) {
                    __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(u[j], xs[i][j]),
                                                     extra[i][j]);
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(pairs, sc));
                }
            }
            float d = q6k_d_f16c(super);
            for (int i = 0; i < irows; i++)
                acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]),
                                            _mm256_set1_ps(d * x->scale[b0[i]]), acc[i][r]);
        }
    }
    STORE_SUMS(acc, rows, irows)
}

/* Q6_K against several activation rows: the activations made unsigned (x + 128, 1..255, by
 * flipping their sign bits) go first into maddubs and the weights as they are (q, -32..31)
 * second, so a pair is (x0 + 128) q0 + (x1 + 128) q1, at most 2 x 255 x 32 in magnitude. What
 * the 128 adds is 128 x each half's scale times the sum of the weights, the same for every
 * activation row: it is summed once per tile row and super-block (maddubs of ones and q, madd
 * by the scales) and taken back from each row's int32 sums before their conversion. The sums
 * are therefore q6k_super8_pass's integers exactly (|lane| <= 8 x 2 x 2 x 255 x 32 x 128 <
 * 2^31 before the correction), and so are the outputs' bits; a block's work per activation
 * row is one maddubs, one madd and one add (q6k_super8_pass: two maddubs, a subtract, a madd
 * and an add), and a tile row's unpacking serves Q6K_ROW_CHUNK rows. */
#define Q6K_ROW_CHUNK 8

/* A Q6_K super-block's 16 scales as madd's multipliers: block j's in scale[j], its first half's
 * scale in the low four int32 lanes and its second half's in the high four, each twice as int16. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void q6k_block_scales(const uint8_t *super, __m256i scale[SUB_BLOCKS])
{
    __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(super + Q6K_SCALES_AT)));
    /* int32 lanes: {s0..s3, s8..s11} and {s4..s7, s12..s15}, each int16 twice */
    __m256i first = _mm256_unpacklo_epi16(s16, s16), second = _mm256_unpackhi_epi16(s16, s16);
    for (int j = 0; j < SUB_BLOCKS; j++) {
        int at = 4 * (j / 4) + 2 * (j % 2);
        __m256i pick = _mm256_setr_epi32(at, at, at, at, at + 1, at + 1, at + 1, at + 1);
        scale[j] = _mm256_permutevar8x32_epi32((j / 2) % 2 ? second : first, pick);
    }
}

__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void q6k_biased_pass(const struct weight *w, const struct activations *x,
                                   int row0, int rows, int i0, int irows, float *y)
{
    const uint8_t *xu0 = x->biased;
    const __m256i ones = _mm256_set1_epi8(1), thirty_two = _mm256_set1_epi8(32);
    ZERO_ACCUMULATORS_OF(acc, Q6K_ROW_CHUNK);
    SUPER_BLOCKS_OF_TILE(q6k, Q6K_BYTES)
        size_t b0[Q6K_ROW_CHUNK];
        for (int i = 0; i < irows; i++)
            b0[i] = (size_t)(i0 + i) * w->groups + (size_t)s * SUB_BLOCKS;
        for (int r = 0; r < rows; r++) {
            const uint8_t *super = tile + (size_t)r * row_bytes + at;
            __m256i q[SUB_BLOCKS], scale[SUB_BLOCKS];
            q6k_unsigned_blocks(super, q);
            for (int j = 0; j < SUB_BLOCKS; j++)
                q[j] = _mm256_sub_epi8(q[j], thirty_two);
            q6k_block_scales(super, scale);
            __m256i isum[Q6K_ROW_CHUNK], bias = _mm256_setzero_si256();
            for (int j = 0; j < SUB_BLOCKS; j++)
                bias = _mm256_add_epi32(
                    bias, _mm256_madd_epi16(_mm256_maddubs_epi16(ones, q[j]), scale[j]));
            bias = _mm256_slli_epi32(bias, 7);
            for (int i = 0; i < irows; i++)
                isum[i] = _mm256_sub_epi32(_mm256_setzero_si256(), bias);
            /* One block at a time, the rows' sums in registers. */
#pragma GCC unroll 1
            for (int j = 0; j < SUB_BLOCKS; j++) {
                __m256i qj = q[j], sj = scale[j];
                for (int i = 0; i < irows; i++) {
                    __m256i xu = _mm256_loadu_si256((const __m256i *)(xu0 + (b0[i] + j) * BLOCK));
                    isum[i] = _mm256_add_epi32(
                        isum[i], _mm256_madd_epi16(_mm256_maddubs_epi16(xu, qj), sj));
                }
            }
            __m256 d = _mm256_set1_ps(q6k_d_f16c(super));
            for (int i = 0; i < irows; i++)
                acc[i][r] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(isum[i]),
                    _mm256_mul_ps(d, _mm256_broadcast_ss(x->scale + b0[i])), acc[i][r]);
        }
    }
    STORE_SUMS(acc, rows, irows)
}

/* The accumulators of the 512-bit passes: activation rows x pairs of weight rows; and them
 * summed into y with the mins' term. */
#define STORE_PAIR_ACCUMULATORS(acc)                                                        \
    for (int i = 0; i < irows; i++)                                                         \
        for (int r = 0; r < TILE_ROWS; r++)                                                 \
            y[(size_t)(i0 + i) * w->n + row0 + r] =                                         \
                bq_hsum_half(acc[i][r / 2], r % 2) + min_term(w, x, row0 + r, i0 + i)
#define ZERO_PAIR_ACCUMULATORS(acc)                                                         \
    __m512 acc[ROW_CHUNK][TILE_ROWS / 2];                                                   \
    for (int i_ = 0; i_ < ROW_CHUNK; i_++)                                                  \
        for (int p_ = 0; p_ < TILE_ROWS / 2; p_++)                                          \
            acc[i_][p_] = _mm512_setzero_ps()

/* AVX-512 VNNI, int16 activations: two weight rows a 512-bit register (block_quant.h), each
 * row's 32 weights of a block sign-extended once for every activation row; the same lanes as
 * DEFINE_PASS16's, so the same bits. Full tiles only (rows == TILE_ROWS). */
__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline void pass16_zmm(const struct weight *w, const struct activations *x, int row0,
                              int rows, int i0, int irows, float *y)
{
    (void)rows;
    const int16_t *xq = (const int16_t *)x->q;
    ZERO_PAIR_ACCUMULATORS(acc);
    for (int g = 0; g < w->groups; g++) {
        __m512i xlo[ROW_CHUNK], xhi[ROW_CHUNK];
        float sx[ROW_CHUNK];
        for (int i = 0; i < irows; i++) {
            size_t b = (size_t)(i0 + i) * w->groups + g;
            xlo[i] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + b * BLOCK)));
            xhi[i] = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK + 16)));
            sx[i] = x->scale[b];
        }
        PREFETCH_NEXT_TILE(row0, g);
        for (int p = 0; p < TILE_ROWS / 2; p++) {
            size_t row = (size_t)(row0 + 2 * p);
            const int8_t *a = w->q + row * w->k + g * BLOCK, *b = a + w->k;
            __m256i lo = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                _mm_loadu_si128((const __m128i *)b), 1);
            __m256i hi = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + 16))),
                _mm_loadu_si128((const __m128i *)(b + 16)), 1);
            __m512i wlo = _mm512_cvtepi8_epi16(lo), whi = _mm512_cvtepi8_epi16(hi);
            __m512 sw = bq_pair(scale_at(w, row * w->groups + g),
                                scale_at(w, (row + 1) * w->groups + g));
            for (int i = 0; i < irows; i++) {
                __m512i dot = _mm512_dpwssd_epi32(_mm512_madd_epi16(wlo, xlo[i]), whi, xhi[i]);
                acc[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                            _mm512_mul_ps(sw, _mm512_set1_ps(sx[i])), acc[i][p]);
            }
        }
    }
    STORE_PAIR_ACCUMULATORS(acc);
}

/* AVX-512 VNNI, int8 activations: two weight rows a 512-bit register, as pass16_zmm. x takes
 * w's sign (AVX-512 has no sign_epi8) where pass8 takes it with sign_epi8: each lane sums the
 * same four products as pass8's 256-bit lanes, so the same bits. Full tiles only. */
__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline void pass8_zmm(const struct weight *w, const struct activations *x, int row0,
                             int rows, int i0, int irows, float *y)
{
    (void)rows;
    const int8_t *xq = (const int8_t *)x->q;
    ZERO_PAIR_ACCUMULATORS(acc);
    for (int g = 0; g < w->groups; g++) {
        __m512i xv[ROW_CHUNK];
        float sx[ROW_CHUNK];
        for (int i = 0; i < irows; i++) {
            size_t b = (size_t)(i0 + i) * w->groups + g;
            xv[i] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + b * BLOCK)));
            sx[i] = x->scale[b];
        }
        PREFETCH_NEXT_TILE(row0, g);
        for (int p = 0; p < TILE_ROWS / 2; p++) {
            size_t row = (size_t)(row0 + 2 * p);
            const int8_t *a = w->q + row * w->k + g * BLOCK;
            __m512i wv = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                _mm256_loadu_si256((const __m256i *)(a + w->k)), 1);
            __m512i abs_w = _mm512_abs_epi8(wv);
            __mmask64 negative = _mm512_movepi8_mask(wv);
            __m512 sw = bq_pair(scale_at(w, row * w->groups + g),
                                scale_at(w, (row + 1) * w->groups + g));
            for (int i = 0; i < irows; i++) {
                __m512i xs = _mm512_mask_sub_epi8(xv[i], negative, _mm512_setzero_si512(), xv[i]);
                __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), abs_w, xs);
                acc[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                            _mm512_mul_ps(sw, _mm512_set1_ps(sx[i])), acc[i][p]);
            }
        }
    }
    STORE_PAIR_ACCUMULATORS(acc);
}

/* AVX-512 VNNI Q6_K passes: two weight rows a 512-bit register, as pass16_zmm; the same lanes
 * as the 256-bit Q6_K passes, so the same bits. Full tiles only. Per pair of rows a = 2p and
 * b = 2p + 1 and half super-block: their blocks unpacked side by side, d as a pair. */
/* The pairs' accumulators summed into y. */
#define Q6K_STORE_PAIRS(acc)                                                                \
    for (int i = 0; i < irows; i++)                                                         \
        for (int r = 0; r < TILE_ROWS; r++)                                                 \
            y[(size_t)(i0 + i) * w->n + row0 + r] = bq_hsum_half(acc[i][r / 2], r % 2)

/* Per pair of rows and half super-block, the scales of its eight sub-blocks per row become
 * 16-bit words [a0..a7 b0..b7] once; block j's two multipliers (a's scale in the low 16 words,
 * b's in the high ones) are then one word permute each, where building them from bytes per
 * block took eight instructions of the ~27 a block's pair costs (this pass is bound by them,
 * not by memory: its time barely changed with the weights in L3). */
__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline __m512i q6k_pair_scales16(const uint8_t *a, const uint8_t *b, int h)
{
    __m128i bytes = _mm_unpacklo_epi64(
        _mm_loadl_epi64((const __m128i *)(a + Q6K_SCALES_AT + 8 * h)),
        _mm_loadl_epi64((const __m128i *)(b + Q6K_SCALES_AT + 8 * h)));
    return _mm512_castsi256_si512(_mm256_cvtepi8_epi16(bytes));
}

__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline void q6k_pass16_zmm(const struct weight *w, const struct activations *x, int row0,
                                  int rows, int i0, int irows, float *y)
{
    (void)rows;
    const int16_t *xq = (const int16_t *)x->q;
    /* Word index of block j's first (second) sub-block scale: a's for 16 words, b's (8 on). */
    __m512i first[4], second[4];
    for (int j = 0; j < 4; j++) {
        __m512i lo = _mm512_set1_epi16((short)(2 * j)), hi = _mm512_set1_epi16((short)(8 + 2 * j));
        first[j] = _mm512_mask_blend_epi16(0xFFFF0000u, lo, hi);
        second[j] = _mm512_add_epi16(first[j], _mm512_set1_epi16(1));
    }
    ZERO_PAIR_ACCUMULATORS(acc);
    size_t row_bytes = q6k_row_bytes(w->k);
    const uint8_t *tile = (const uint8_t *)w->q + (size_t)row0 * row_bytes;
    for (int g0 = 0; g0 < w->groups; g0 += 4) {
        int h;
        size_t at = q6k_half_at(tile, row_bytes, g0, &h);
        for (int p = 0; p < TILE_ROWS / 2; p++) {
            const uint8_t *a = tile + (size_t)(2 * p) * row_bytes + at, *b = a + row_bytes;
            __m512 d = bq_pair(q6k_d_f16c(a), q6k_d_f16c(b));
            __m512i q[4];
            q6k_half_pair_zmm(a, b, h, q);
            __m512i scales = q6k_pair_scales16(a, b, h);
            for (int j = 0; j < 4; j++) {
                __m256i ya = _mm512_castsi512_si256(q[j]), yb = _mm512_extracti64x4_epi64(q[j], 1);
                __m512i wlo = _mm512_mullo_epi16(
                    _mm512_cvtepi8_epi16(_mm256_permute2x128_si256(ya, yb, 0x20)),
                    _mm512_permutexvar_epi16(first[j], scales));
                __m512i whi = _mm512_mullo_epi16(
                    _mm512_cvtepi8_epi16(_mm256_permute2x128_si256(ya, yb, 0x31)),
                    _mm512_permutexvar_epi16(second[j], scales));
                for (int i = 0; i < irows; i++) {
                    size_t blk = (size_t)(i0 + i) * w->groups + g0 + j;
                    __m512i xlo = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(xq + blk * BLOCK)));
                    __m512i xhi = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(xq + blk * BLOCK + 16)));
                    __m512i dot = _mm512_dpwssd_epi32(_mm512_madd_epi16(wlo, xlo), whi, xhi);
                    acc[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                                _mm512_mul_ps(d, _mm512_set1_ps(x->scale[blk])),
                                                acc[i][p]);
                }
            }
        }
    }
    Q6K_STORE_PAIRS(acc);
}

/* Int8 activations: q unsigned (0..63, not q - 32) is dpbusd's unsigned operand as it is, so
 * a lane's q.x less 32 times its four x (once per activation block and half super-block,
 * shared by the tile's rows: the dot's starting value) is w.x without taking w's sign into
 * x per row; the same integer, so the same bits. Sub-block scales as int32 lanes
 * [a0 x4, a1 x4, b0 x4, b1 x4] are one permute of the half's eight a and eight b scales. This
 * pass bounds a 1B model's Q6_K vocabulary by instructions as much as by memory. */
__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline void q6k_pass8_zmm(const struct weight *w, const struct activations *x, int row0,
                                 int rows, int i0, int irows, float *y)
{
    (void)rows;
    const int8_t *xq = (const int8_t *)x->q;
    const __m512i thirty_two = _mm512_set1_epi8(32);
    __m512i pick[4];
    for (int j = 0; j < 4; j++) {
        int a0 = 2 * j, a1 = a0 + 1, b0 = 8 + a0, b1 = b0 + 1;
        pick[j] = _mm512_setr_epi32(a0, a0, a0, a0, a1, a1, a1, a1, b0, b0, b0, b0, b1, b1, b1, b1);
    }
    ZERO_PAIR_ACCUMULATORS(acc);
    size_t row_bytes = q6k_row_bytes(w->k);
    const uint8_t *tile = (const uint8_t *)w->q + (size_t)row0 * row_bytes;
    for (int g0 = 0; g0 < w->groups; g0 += 4) {
        int h;
        size_t at = q6k_half_at(tile, row_bytes, g0, &h);
        __m512i xv[ROW_CHUNK][4], start[ROW_CHUNK][4];
        for (int i = 0; i < irows; i++)
            for (int j = 0; j < 4; j++) {
                size_t blk = (size_t)(i0 + i) * w->groups + g0 + j;
                xv[i][j] = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256((const __m256i *)(xq + blk * BLOCK)));
                start[i][j] = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), thirty_two, xv[i][j]));
            }
        for (int p = 0; p < TILE_ROWS / 2; p++) {
            const uint8_t *a = tile + (size_t)(2 * p) * row_bytes + at, *b = a + row_bytes;
            __m512 d = bq_pair(q6k_d_f16c(a), q6k_d_f16c(b));
            __m512i q[4];
            q6k_half_pair_zmm_q(a, b, h, 1, q);
            __m512i scales = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(
                _mm_loadl_epi64((const __m128i *)(a + Q6K_SCALES_AT + 8 * h)),
                _mm_loadl_epi64((const __m128i *)(b + Q6K_SCALES_AT + 8 * h))));
            for (int j = 0; j < 4; j++) {
                __m512i scv = _mm512_permutexvar_epi32(pick[j], scales);
                for (int i = 0; i < irows; i++) {
                    size_t blk = (size_t)(i0 + i) * w->groups + g0 + j;
                    __m512i dot = _mm512_dpbusd_epi32(start[i][j], q[j], xv[i][j]);
                    acc[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(dot, scv)),
                                                _mm512_mul_ps(d, _mm512_set1_ps(x->scale[blk])),
                                                acc[i][p]);
                }
            }
        }
    }
    Q6K_STORE_PAIRS(acc);
}

/* Weight rows [row0, row0 + rows) (rows: 1 or TILE_ROWS) against every activation row. */
#define RUN_ROWS(PASS, row0, rows)                                                          \
    do {                                                                                    \
        int i_ = 0;                                                                         \
        for (; i_ + ROW_CHUNK <= x->m; i_ += ROW_CHUNK)                                     \
            PASS(w, x, row0, rows, i_, ROW_CHUNK, y);                                       \
        if (i_ < x->m)                                                                      \
            PASS(w, x, row0, rows, i_, 1, y);                                               \
    } while (0)

/* One tile of up to TILE_ROWS weight rows through PASS; a partial one (the last) a row at a
 * time through ROW_PASS. */
#define DEFINE_TILE2(NAME, TARGET, PASS, ROW_PASS)                                          \
    __attribute__((target(TARGET)))                                                         \
    static void NAME(const struct weight *w, const struct activations *x, int row0,         \
                     float *y)                                                              \
    {                                                                                       \
        if (w->n - row0 >= TILE_ROWS) {                                                     \
            RUN_ROWS(PASS, row0, TILE_ROWS);                                                \
            return;                                                                         \
        }                                                                                   \
        for (int r = row0; r < w->n; r++)                                                   \
            RUN_ROWS(ROW_PASS, r, 1);                                                       \
    }
#define DEFINE_TILE(NAME, TARGET, PASS) DEFINE_TILE2(NAME, TARGET, PASS, PASS)

#define AVX2 "avx2,fma,f16c"
#define VNNI "avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c"

DEFINE_PASS8(pass8_avx2, AVX2, bq_dot8_avx2)
DEFINE_PASS8(pass8_vnni, VNNI, bq_dot8_vnni)
DEFINE_PASS16(pass16_avx2, AVX2, bq_dot16_avx2)
DEFINE_PASS16(pass16_vnni, VNNI, bq_dot16_vnni)
DEFINE_TILE(tile8_avx2, AVX2, pass8_avx2)
DEFINE_TILE2(tile8_vnni, VNNI, pass8_zmm, pass8_vnni)
DEFINE_TILE(tile16_avx2, AVX2, pass16_avx2)
DEFINE_TILE2(tile16_vnni, VNNI, pass16_zmm, pass16_vnni)
DEFINE_BLOCKS_PASS8(q6k_pass8_avx2, AVX2, bq_dot8_avx2, Q6K_WALK)
DEFINE_BLOCKS_PASS8(q6k_pass8_vnni, VNNI, bq_dot8_vnni, Q6K_WALK)
DEFINE_BLOCKS_PASS16(q6k_pass16_avx2, AVX2, bq_dot16_avx2, Q6K_WALK)
DEFINE_BLOCKS_PASS16(q6k_pass16_vnni, VNNI, bq_dot16_vnni, Q6K_WALK)
DEFINE_TILE(q6k_tile8_avx2, AVX2, q6k_pass8_avx2)
DEFINE_TILE2(q6k_tile8_vnni, VNNI, q6k_pass8_zmm, q6k_pass8_vnni)
DEFINE_TILE(q6k_tile16_avx2, AVX2, q6k_pass16_avx2)
DEFINE_TILE2(q6k_tile16_vnni, VNNI, q6k_pass16_zmm, q6k_pass16_vnni)
/* The passes' tiles, 256-bit on every instruction set. */
#define DEFINE_TILES(FMT)                                                                   \
    DEFINE_TILE(FMT##_tile8_avx2, AVX2, FMT##_pass8_avx2)                                   \
    DEFINE_TILE(FMT##_tile8_vnni, VNNI, FMT##_pass8_vnni)                                   \
    DEFINE_TILE(FMT##_tile16_avx2, AVX2, FMT##_pass16_avx2)                                 \
    DEFINE_TILE(FMT##_tile16_vnni, VNNI, FMT##_pass16_vnni)
/* IQ4_XS's and Q5_K's passes (one scale a block). */
#define DEFINE_SCALED_TILES(FMT, FMT_BYTES, SCALE)                                          \
    DEFINE_SCALED_PASS8(FMT##_pass8_avx2, AVX2, bq_dot8_avx2, FMT, FMT_BYTES, SCALE)        \
    DEFINE_SCALED_PASS8(FMT##_pass8_vnni, VNNI, bq_dot8_vnni, FMT, FMT_BYTES, SCALE)        \
    DEFINE_SCALED_PASS16(FMT##_pass16_avx2, AVX2, bq_dot16_avx2, FMT, FMT_BYTES, SCALE)     \
    DEFINE_SCALED_PASS16(FMT##_pass16_vnni, VNNI, bq_dot16_vnni, FMT, FMT_BYTES, SCALE)     \
    DEFINE_TILES(FMT)
DEFINE_SCALED_TILES(iq4xs, IQ4XS_BYTES, iq4xs_scale)
DEFINE_SCALED_TILES(q5k, Q5K_BYTES, Q5K_SCALE)
/* As DEFINE_TILE for the super-block passes: SUPER_ROW_CHUNK activation rows a pass, then
 * two, then one. */
#define RUN_SUPER_ROWS(PASS, row0, rows)                                                    \
    do {                                                                                    \
        int i_ = 0;                                                                         \
        for (; i_ + SUPER_ROW_CHUNK <= x->m; i_ += SUPER_ROW_CHUNK)                         \
            PASS(w, x, row0, rows, i_, SUPER_ROW_CHUNK, y);                                 \
        if (i_ + 2 <= x->m) {                                                               \
            PASS(w, x, row0, rows, i_, 2, y);                                               \
            i_ += 2;                                                                        \
        }                                                                                   \
        if (i_ < x->m)                                                                      \
            PASS(w, x, row0, rows, i_, 1, y);                                               \
    } while (0)
#define DEFINE_SUPER_TILE(NAME, PASS)                                                       \
    __attribute__((target(AVX2)))                                                           \
    static void NAME(const struct weight *w, const struct activations *x, int row0,         \
                     float *y)                                                              \
    {                                                                                       \
        if (w->n - row0 >= TILE_ROWS) {                                                     \
            RUN_SUPER_ROWS(PASS, row0, TILE_ROWS);                                          \
            return;                                                                         \
        }                                                                                   \
        for (int r = row0; r < w->n; r++)                                                   \
            RUN_SUPER_ROWS(PASS, r, 1);                                                     \
    }
DEFINE_SUPER_TILE(iq4xs_tile8s_avx2, iq4xs_super8_pass)
DEFINE_SUPER_TILE(q5k_tile8s_avx2, q5k_super8_pass)
/* Q6_K: Q6K_ROW_CHUNK activation rows a pass (q6k_biased_pass), then four at a time, then the
 * last one to three in one pass (each pass unpacks the tile's weights again: three rows cost
 * little more than two); a single row through q6k_super8_pass. The passes give the same bits. */
#define RUN_Q6K_ROWS(row0, rows)                                                            \
    do {                                                                                    \
        int i_ = 0;                                                                         \
        for (; x->biased && i_ + Q6K_ROW_CHUNK <= x->m; i_ += Q6K_ROW_CHUNK)                \
            q6k_biased_pass(w, x, row0, rows, i_, Q6K_ROW_CHUNK, y);                        \
        for (; x->m - i_ >= SUPER_ROW_CHUNK; i_ += SUPER_ROW_CHUNK)                         \
            q6k_super8_pass(w, x, row0, rows, i_, SUPER_ROW_CHUNK, y);                      \
        if (x->m - i_ == 3)                                                                 \
            q6k_super8_pass(w, x, row0, rows, i_, 3, y);                                    \
        else if (x->m - i_ == 2)                                                            \
            q6k_super8_pass(w, x, row0, rows, i_, 2, y);                                    \
        else if (x->m - i_ == 1)                                                            \
            q6k_super8_pass(w, x, row0, rows, i_, 1, y);                                    \
    } while (0)
__attribute__((target(AVX2)))
static void q6k_tile8s_avx2(const struct weight *w, const struct activations *x, int row0,
                            float *y)
{
    if (w->n - row0 >= TILE_ROWS) {
        RUN_Q6K_ROWS(row0, TILE_ROWS);
        return;
    }
    for (int r = row0; r < w->n; r++)
        RUN_Q6K_ROWS(r, 1);
}
/* Q3_K's (two scales a block, as Q6_K's). */
DEFINE_BLOCKS_PASS8(q3k_pass8_avx2, AVX2, bq_dot8_avx2, Q3K_WALK)
DEFINE_BLOCKS_PASS8(q3k_pass8_vnni, VNNI, bq_dot8_vnni, Q3K_WALK)
DEFINE_BLOCKS_PASS16(q3k_pass16_avx2, AVX2, bq_dot16_avx2, Q3K_WALK)
DEFINE_BLOCKS_PASS16(q3k_pass16_vnni, VNNI, bq_dot16_vnni, Q3K_WALK)
DEFINE_TILES(q3k)

typedef void (*tile_fn)(const struct weight *, const struct activations *, int, float *);

/* The weight formats' rows of vector_tile's table. */
static int format_index(int halves)
{
    return (halves & Q6_K) ? 1 : (halves & IQ4_XS) ? 2 : (halves & Q5_K) ? 3
         : (halves & Q3_K) ? 4 : 0;
}

/* The vector tile for an instruction set, activation width and weight format; NULL: scalar. */
static tile_fn vector_tile(int isa, int wide, int format)
{
    static const tile_fn tiles[2][2][5] = {
        /* AVX2: {int8, int16} x {int8 weights, Q6_K, IQ4_XS, Q5_K, Q3_K} */
        {{tile8_avx2, q6k_tile8_avx2, iq4xs_tile8_avx2, q5k_tile8_avx2, q3k_tile8_avx2},
         {tile16_avx2, q6k_tile16_avx2, iq4xs_tile16_avx2, q5k_tile16_avx2, q3k_tile16_avx2}},
        {{tile8_vnni, q6k_tile8_vnni, iq4xs_tile8_vnni, q5k_tile8_vnni, q3k_tile8_vnni},
         {tile16_vnni, q6k_tile16_vnni, iq4xs_tile16_vnni, q5k_tile16_vnni, q3k_tile16_vnni}},
    };
    if (isa == BQ_ISA_AVX512_VNNI)
        return tiles[1][wide][format];
    if (isa == BQ_ISA_AVX2)
        return tiles[0][wide][format];
    return NULL;
}

/* The tile for activations with a scale per super-block (x->super): NULL where none is
 * faster than the per-block passes, which read the repeated scales as they read any. */
static tile_fn super_tile(int isa, int halves)
{
    if (isa < BQ_ISA_AVX2)
        return NULL;
    return (halves & IQ4_XS) ? iq4xs_tile8s_avx2 : (halves & Q5_K) ? q5k_tile8s_avx2
         : (halves & Q6_K) ? q6k_tile8s_avx2 : NULL;
}

static void gemm_tiles(int isa, int wide, const struct weight *w, const struct activations *x,
                       float *y, int tile_begin, int tile_end)
{
    tile_fn tile = x->super ? super_tile(isa, w->halves) : NULL;
    if (tile == NULL)
        tile = vector_tile(isa, wide, format_index(w->halves));
    for (int t = tile_begin; t < tile_end; t++) {
        int row0 = t * TILE_ROWS;
        if (tile)
            tile(w, x, row0, y);
        else
            for (int r = row0; r < row0 + TILE_ROWS && r < w->n; r++)
                row_scalar(wide, w, x, r, y);
    }
}

/* ---- entry points -------------------------------------------------------------------------- */

static int valid(int isa, int n, int k, int m)
{
    return isa >= 0 && n > 0 && m > 0 && k > 0 && k % BLOCK == 0;
}

/* GGUF blocks carry their scales: none are passed, and a row is whole super-blocks. */
static int valid_weight(int halves, const void *scales, const void *mins, int k)
{
    if (halves & (Q6_K | SUB_BLOCK_TYPES))
        return (halves == Q6_K || halves == IQ4_XS || halves == Q5_K || halves == Q3_K) && !scales
               && !mins
               && k % Q6K_SUPER == 0;
    return halves >= 0 && halves <= (SCALES_HALF | MINS_HALF) && scales;
}

/* int8 values as unsigned bytes q + 128 (n a multiple of 32). */
__attribute__((target("avx2")))
static void flip_sign_bits(const void *xq, size_t n, uint8_t *out)
{
    const __m256i sign_bit = _mm256_set1_epi8((char)0x80);
    for (size_t i = 0; i < n; i += BLOCK)
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)((const uint8_t *)xq + i)),
                                             sign_bit));
}

/* The product of quantized activations (xq int8 or int16 by `wide`) and the weight. */
static int gemm(int isa, int wide, const int8_t *q, const void *scales, const void *mins,
                int halves, int n, int k, const void *xq, const float *xscale, const float *xsum,
                int m, float *y, int n_threads, int super)
{
    isa = bq_resolve_isa(isa);
    if (!valid(isa, n, k, m) || !valid_weight(halves, scales, mins, k) || (super && wide))
        return -1;
    struct weight w = {q, scales, mins, halves, n, k, k / BLOCK, isa >= BQ_ISA_AVX2};
    struct activations x = {xq, xscale, xsum, m, super, NULL};
    /* Q6_K's pass of several rows reads the activations made unsigned; where they cannot be
     * allocated, every row takes the one-row pass (the same bits). */
    uint8_t *biased = NULL;
    if (super && halves == Q6_K && isa >= BQ_ISA_AVX2 && m >= Q6K_ROW_CHUNK) {
        biased = malloc((size_t)m * k);
        if (biased)
            flip_sign_bits(xq, (size_t)m * k, biased);
        x.biased = biased;
    }
    int tiles = (n + TILE_ROWS - 1) / TILE_ROWS;
    if (n_threads <= 1)
        gemm_tiles(isa, wide, &w, &x, y, 0, tiles);
    else
        BQ_TEAM_SPLIT(tiles, gemm_tiles(isa, wide, &w, &x, y, begin, end));
    free(biased);
    return 0;
}

static int quantize(int isa, int wide, const float *x, int m, int k, void *xq, float *xscale,
                    float *xsum, int super)
{
    isa = bq_resolve_isa(isa);
    if (!valid(isa, 1, k, m) || (super && (wide || k % BQ_SUPER)))
        return -1;
    if (super)
        bq_quantize_rows_super8(isa, x, m, k, xq, xscale, xsum);
    else
        bq_quantize_rows(isa, wide, x, m, k, xq, xscale, xsum);
    return 0;
}

/* x fp32 [m, k] -> xq int8 [m, k], xscale and xsum (s_x * sum q_x) fp32 [m, k / 32]. */
int q8_quantize_rows(int isa, const float *x, int m, int k, int8_t *xq, float *xscale,
                     float *xsum)
{
    return quantize(isa, 0, x, m, k, xq, xscale, xsum, 0);
}

/* As q8_quantize_rows, one scale per 256 values (k a multiple of 256) repeated in each of
 * their blocks' entries, as q8_linear quantizes for SUPER_SCALED_TYPES. */
int q8_quantize_rows_super(int isa, const float *x, int m, int k, int8_t *xq, float *xscale,
                           float *xsum)
{
    return quantize(isa, 0, x, m, k, xq, xscale, xsum, 1);
}

/* As q8_quantize_rows, to int16 (s_x = max|x| / 32767). */
int q8_quantize_rows16(int isa, const float *x, int m, int k, int16_t *xq, float *xscale,
                       float *xsum)
{
    return quantize(isa, 1, x, m, k, xq, xscale, xsum, 0);
}

/* q int8 [n, k]; scales, mins [n, k / 32] (fp16 where `halves` says, mins NULL: none);
 * xq, xscale, xsum: q8_quantize_rows' output for [m, k]; y fp32 [m, n]. n_threads > 1 splits
 * the rows in contiguous ranges over an OpenMP team (the process's runtime). */
int q8_gemm(int isa, const int8_t *q, const void *scales, const void *mins, int halves, int n,
            int k, const int8_t *xq, const float *xscale, const float *xsum, int m, float *y,
            int n_threads)
{
    return gemm(isa, 0, q, scales, mins, halves, n, k, xq, xscale, xsum, m, y, n_threads, 0);
}

/* As q8_gemm, with q8_quantize_rows_super's output. */
int q8_gemm_super(int isa, const int8_t *q, const void *scales, const void *mins, int halves,
                  int n, int k, const int8_t *xq, const float *xscale, const float *xsum, int m,
                  float *y, int n_threads)
{
    return gemm(isa, 0, q, scales, mins, halves, n, k, xq, xscale, xsum, m, y, n_threads, 1);
}

/* As q8_gemm, with q8_quantize_rows16's output. */
int q8_gemm16(int isa, const int8_t *q, const void *scales, const void *mins, int halves, int n,
              int k, const int16_t *xq, const float *xscale, const float *xsum, int m, float *y,
              int n_threads)
{
    return gemm(isa, 1, q, scales, mins, halves, n, k, xq, xscale, xsum, m, y, n_threads, 0);
}

size_t q8_workspace_bytes(int m, int k)
{
    return (size_t)m * k + 2 * (size_t)m * (k / BLOCK) * sizeof(float);
}

size_t q8_workspace16_bytes(int m, int k)
{
    return (size_t)m * k * sizeof(int16_t) + 2 * (size_t)m * (k / BLOCK) * sizeof(float);
}

/* The activations' layout in a workspace: the quantized values, then scales, then sums. */
static int linear(int isa, int wide, const int8_t *q, const void *scales, const void *mins,
                  int halves, int n, int k, const float *x, int m, float *y, void *work,
                  int n_threads)
{
    size_t values = (size_t)m * k * (wide ? sizeof(int16_t) : 1);
    float *xscale = (float *)((char *)work + values);
    float *xsum = xscale + (size_t)m * (k / BLOCK);
    int super = !wide && (halves & SUPER_SCALED_TYPES);
    int rc = quantize(isa, wide, x, m, k, work, xscale, xsum, super);
    return rc ? rc
              : gemm(isa, wide, q, scales, mins, halves, n, k, work, xscale, xsum, m, y,
                     n_threads, super);
}

/* y = x @ W.T with x (fp32 [m, k], contiguous) quantized to int8 per block inside; work is
 * q8_workspace_bytes(m, k) bytes, 4-byte aligned. */
int q8_linear(int isa, const int8_t *q, const void *scales, const void *mins, int halves, int n,
              int k, const float *x, int m, float *y, void *work, int n_threads)
{
    return linear(isa, 0, q, scales, mins, halves, n, k, x, m, y, work, n_threads);
}

/* As q8_linear with int16 activations; work is q8_workspace16_bytes(m, k) bytes. */
int q8_linear16(int isa, const int8_t *q, const void *scales, const void *mins, int halves,
                int n, int k, const float *x, int m, float *y, void *work, int n_threads)
{
    return linear(isa, 1, q, scales, mins, halves, n, k, x, m, y, work, n_threads);
}
