/*
 * int4 weights (groups of 32, a scale and a min per group) times int8-quantized activations.
 *
 *   y[m, n] = sum_g  s_w[n, g] * s_x[m, g] * sum_j q_w[n, g, j] * q_x[m, g, j]
 *                  + min_w[n, g] * sum_x[m, g]
 *
 * q_w is 0..15, q_x is -127..127 with s_x = max|x| / 127 per block of 32, and sum_x is the
 * sum of the block's rounded x, s_x * sum_j q_x: so y is exactly the dequantized weights times
 * the rounded x. With the exact sum of x instead, the rounding error reaches y through q_w * s_w,
 * whose mean (about -min_w) is large, not through the zero-mean weights: measured 2.5x the
 * error on activations with a few large channels (docs/KERNELS.md). The integer dot
 * products are what make this fast: 32 products per AVX2 instruction pair instead of
 * dequantizing every weight to float.
 *
 * Plain C with a C ABI, no torch or Python headers. Built with -fopenmp but linked without
 * libgomp, so the GOMP_* symbols bind to whichever OpenMP runtime the process already has
 * (torch's): a second runtime would bring a second thread team to fight torch's on few cores.
 *
 * Repacked layout (pagoda/kernels/cpu/q4_records.h): rows in tiles of 4, per (tile, block of 32) one
 * record of nibbles and the rows' scales and mins, fp32, fp16 ("compact", where fp16 holds them
 * exactly: Q4_0, Q4_1) or Q4_K's own integer sub-block scales with fp16 d and dmin per
 * super-block. A one-row step reads the weights once, so fewer bytes a weight is less time
 * where memory bounds it; every format gives the same products. The format is an argument of
 * every call that reads a repacked weight, not stored in it.
 */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_quant.h"
#include "half_float.h"
#include "q4_records.h"

#define BLOCK Q4R_BLOCK
#define TILE_ROWS Q4R_TILE
#define NIBBLE_BYTES Q4R_NIBBLE_BYTES
/* Activation rows that share one pass over a tile's weights: their accumulators stay in
 * the 16 ymm registers AVX2 has. */
#define ROW_CHUNK 2
/* The int16 pass's (at most 4: the rest go in a two and a one): its accumulators take more
 * than the registers, but a weight block is widened to 16 bits once for all four rows, which
 * saves more than their loads and stores cost (docs/KERNELS.md). */
#define ROW_CHUNK16 4

enum { Q4_ISA_SCALAR = 0, Q4_ISA_AVX2 = 1, Q4_ISA_AVX512_VNNI = 2 };

static int tiles_of(int n) { return (n + TILE_ROWS - 1) / TILE_ROWS; }

int q4_isa_supported(int isa) { return bq_cpu_has(isa); }

int q4_best_isa(void) { return bq_best_isa(); }

/* ---- repack --------------------------------------------------------------------------- */

/* 0 where fmt does not fit k. */
size_t q4_repacked_bytes(int fmt, int n, int k)
{
    if (n <= 0 || k <= 0 || k % BLOCK || !q4r_format_ok(fmt, k))
        return 0;
    return (size_t)tiles_of(n) * q4r_tile_bytes(fmt, k / BLOCK);
}

static uint8_t canonical_nibble(const uint8_t *row, int e)
{
    uint8_t byte = row[e / 2];
    return (e % 2) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
}

/* Row `row`'s block g of the canonical packed [n, k / 2] into its place in the layout at out;
 * returns the block's record. */
static uint8_t *put_nibbles(uint8_t *out, int fmt, const uint8_t *packed, int row, int k, int g)
{
    int groups = k / BLOCK, r = row % TILE_ROWS;
    uint8_t *tile = out + (size_t)(row / TILE_ROWS) * q4r_tile_bytes(fmt, groups);
    uint8_t *rec = (uint8_t *)q4r_record(tile, fmt, g), *nib = rec + r * NIBBLE_BYTES;
    const uint8_t *src = packed + (size_t)row * (k / 2);
    for (int j = 0; j < NIBBLE_BYTES; j++) {
        uint8_t lo = canonical_nibble(src, g * BLOCK + j);
        uint8_t hi = canonical_nibble(src, g * BLOCK + j + NIBBLE_BYTES);
        nib[j] = (uint8_t)(lo | (hi << 4));
    }
    return rec;
}

/* packed: uint8 [n, k / 2], element 2j in the low nibble of byte j, 2j + 1 in the high one;
 * scales, mins: [n, k / 32], fp16 for Q4R_FP16 (copied as they are), fp32 for Q4R_FP32.
 * out: q4_repacked_bytes(fmt, n, k) bytes. */
int q4_repack(const uint8_t *packed, const void *scales, const void *mins, int fmt, int n,
              int k, uint8_t *out)
{
    if (!q4_repacked_bytes(fmt, n, k) || fmt == Q4R_KQ)
        return -1;
    int groups = k / BLOCK;
    size_t param = fmt == Q4R_FP16 ? sizeof(uint16_t) : sizeof(float);
    memset(out, 0, q4_repacked_bytes(fmt, n, k));
    for (int row = 0; row < n; row++) {
        int r = row % TILE_ROWS;
        for (int g = 0; g < groups; g++) {
            uint8_t *rec = put_nibbles(out, fmt, packed, row, k, g);
            size_t at = ((size_t)row * groups + g) * param;
            memcpy(rec + Q4R_NIBBLES + r * param, (const uint8_t *)scales + at, param);
            memcpy(rec + Q4R_NIBBLES + (TILE_ROWS + r) * param, (const uint8_t *)mins + at,
                   param);
        }
    }
    return 0;
}

/* Q4R_KQ records from GGUF Q4_K's parts: packed as q4_repack's; d, dmin: fp16 [n, k / 256]
 * (per super-block); sc, m: uint8 [n, k / 32], the six-bit sub-block scales and mins, so that
 * scale = d * sc and min = -(dmin * m). out: q4_repacked_bytes(Q4R_KQ, n, k) bytes. */
int q4_repack_kq(const uint8_t *packed, const uint16_t *d, const uint16_t *dmin,
                 const uint8_t *sc, const uint8_t *m, int n, int k, uint8_t *out)
{
    if (!q4_repacked_bytes(Q4R_KQ, n, k))
        return -1;
    int groups = k / BLOCK, supers = groups / Q4R_KQ_BLOCKS;
    memset(out, 0, q4_repacked_bytes(Q4R_KQ, n, k));
    for (int row = 0; row < n; row++) {
        int r = row % TILE_ROWS;
        uint8_t *tile = out + (size_t)(row / TILE_ROWS) * q4r_tile_bytes(Q4R_KQ, groups);
        for (int s = 0; s < supers; s++) {
            uint8_t *head = tile + (size_t)s * Q4R_KQ_SUPER;
            memcpy(head + r * sizeof(uint16_t), d + (size_t)row * supers + s, sizeof(uint16_t));
            memcpy(head + (TILE_ROWS + r) * sizeof(uint16_t), dmin + (size_t)row * supers + s,
                   sizeof(uint16_t));
        }
        for (int g = 0; g < groups; g++) {
            uint8_t *rec = put_nibbles(out, Q4R_KQ, packed, row, k, g);
            rec[Q4R_NIBBLES + r] = sc[(size_t)row * groups + g];
            rec[Q4R_NIBBLES + TILE_ROWS + r] = m[(size_t)row * groups + g];
        }
    }
    return 0;
}

/* ---- activations ---------------------------------------------------------------------- */

/* x: fp32 [m, k] -> xq int8 [m, k], xscale and xsum (s_x * sum q_x) fp32 [m, k / 32]. */
int q4_quantize_rows(int isa, const float *x, int m, int k, int8_t *xq, float *xscale,
                     float *xsum)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    bq_quantize_rows(isa, 0, x, m, k, xq, xscale, xsum);
    return 0;
}

/* ---- the product: scalar ---------------------------------------------------------------- */

struct activations {
    const int8_t *q;
    const float *scale;
    const float *sum;
    int m;
};

static void tile_scalar(const uint8_t *tile, int fmt, int groups,
                        const struct activations *x, int row0,
                        int n, float *y)
{
    int k = groups * BLOCK;
    for (int i = 0; i < x->m; i++) {
        float acc[TILE_ROWS] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *rec = q4r_record(tile, fmt, g);
            const int8_t *xq = x->q + (size_t)i * k + g * BLOCK;
            float sx = x->scale[(size_t)i * groups + g], sumx = x->sum[(size_t)i * groups + g];
            for (int r = 0; r < TILE_ROWS; r++) {
                const uint8_t *nib = rec + r * NIBBLE_BYTES;
                int32_t dot = 0;
                for (int j = 0; j < NIBBLE_BYTES; j++)
                    dot += (nib[j] & 15) * xq[j] + (nib[j] >> 4) * xq[j + NIBBLE_BYTES];
                float sw = q4r_param(tile, fmt, g, r);
                acc[r] += (float)dot * (sw * sx) + q4r_param(tile, fmt, g, TILE_ROWS + r) * sumx;
            }
        }
        for (int r = 0; r < TILE_ROWS && row0 + r < n; r++)
            y[(size_t)i * n + row0 + r] = acc[r];
    }
}

/* ---- the product: AVX2 and AVX-512 VNNI --------------------------------------------------
 * One body, two dot products (block_quant.h's bq_dot8_*): 2 x 15 x 127 cannot saturate
 * maddubs' s16 pairs. */

/* Every activation row against one tile, ROW_CHUNK at a time, records in format FMT. */
#define ALL_ROWS(NAME, FMT)                                                                 \
    do {                                                                                    \
        int i_ = 0;                                                                         \
        for (; i_ + ROW_CHUNK <= x->m; i_ += ROW_CHUNK)                                     \
            NAME(tile, FMT, groups, x, i_, ROW_CHUNK, row0, n, y);                          \
        if (i_ < x->m)                                                                      \
            NAME(tile, FMT, groups, x, i_, 1, row0, n, y);                                  \
    } while (0)

/* rows: 1..ROW_CHUNK activation rows starting at i0, all against one tile. */
#define DEFINE_TILE_CHUNK(NAME, TARGET, DOT)                                                \
    __attribute__((target(TARGET), always_inline))                                          \
    static inline void NAME(const uint8_t *tile, int fmt, int groups,                       \
                            const struct activations *x, int i0, int rows, int row0, int n, \
                            float *y)                                                       \
    {                                                                                       \
        const __m128i low = _mm_set1_epi8(15);                                              \
        __m256 acc[ROW_CHUNK][TILE_ROWS];                                                   \
        __m128 acc_min[ROW_CHUNK];                                                          \
        for (int i = 0; i < ROW_CHUNK; i++) {                                               \
            acc_min[i] = _mm_setzero_ps();                                                  \
            for (int r = 0; r < TILE_ROWS; r++)                                             \
                acc[i][r] = _mm256_setzero_ps();                                            \
        }                                                                                   \
        for (int g = 0; g < groups; g++) {                                                  \
            float sw_buf[TILE_ROWS];                                                        \
            const float *sw;                                                                \
            __m128 mw;                                                                      \
            const uint8_t *rec = q4r_params_vec(tile, fmt, g, sw_buf, &sw, &mw);            \
            __m256i xv[ROW_CHUNK];                                                          \
            float sx[ROW_CHUNK];                                                            \
            for (int i = 0; i < rows; i++) {                                                \
                size_t b = (size_t)(i0 + i) * groups + g;                                   \
                xv[i] = _mm256_loadu_si256((const __m256i *)(x->q + b * BLOCK));            \
                sx[i] = x->scale[b];                                                        \
                acc_min[i] = _mm_fmadd_ps(mw, _mm_set1_ps(x->sum[b]), acc_min[i]);          \
            }                                                                               \
            for (int r = 0; r < TILE_ROWS; r++) {                                           \
                __m128i raw = _mm_loadu_si128((const __m128i *)(rec + r * NIBBLE_BYTES));   \
                __m128i lo = _mm_and_si128(raw, low);                                       \
                __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);                    \
                __m256i w = _mm256_set_m128i(hi, lo);                                       \
                for (int i = 0; i < rows; i++) {                                            \
                    __m256 p = _mm256_cvtepi32_ps(DOT(w, xv[i]));                           \
                    acc[i][r] = _mm256_fmadd_ps(p, _mm256_set1_ps(sw[r] * sx[i]), acc[i][r]);\
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        for (int i = 0; i < rows; i++) {                                                    \
            float mins[TILE_ROWS];                                                          \
            _mm_storeu_ps(mins, acc_min[i]);                                                \
            for (int r = 0; r < TILE_ROWS && row0 + r < n; r++) {                           \
                float s;                                                                    \
                BQ_HSUM256(acc[i][r], s);                                                   \
                y[(size_t)(i0 + i) * n + row0 + r] = s + mins[r];                           \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    __attribute__((target(TARGET)))                                                         \
    static void NAME##_all_rows(const uint8_t *tile, int fmt, int groups,                   \
                                const struct activations *x, int row0, int n, float *y)     \
    {                                                                                       \
        /* Constant row counts and formats let the compiler keep every accumulator in a     \
         * register and build one loop per format. */                                       \
        if (fmt == Q4R_FP16)                                                                \
            ALL_ROWS(NAME, Q4R_FP16);                                                       \
        else if (fmt == Q4R_KQ)                                                             \
            ALL_ROWS(NAME, Q4R_KQ);                                                         \
        else                                                                                \
            ALL_ROWS(NAME, Q4R_FP32);                                                       \
    }

DEFINE_TILE_CHUNK(tile_avx2, "avx2,fma,f16c", bq_dot8_avx2)
DEFINE_TILE_CHUNK(tile_vnni, "avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c", bq_dot8_vnni)

static void gemm_tiles(int isa, const uint8_t *w, int fmt, int n, int groups,
                       const struct activations *x, float *y, int tile_begin, int tile_end)
{
    for (int t = tile_begin; t < tile_end; t++) {
        const uint8_t *tile = w + (size_t)t * q4r_tile_bytes(fmt, groups);
        int row0 = t * TILE_ROWS;
        if (isa == Q4_ISA_AVX512_VNNI)
            tile_vnni_all_rows(tile, fmt, groups, x, row0, n, y);
        else if (isa == Q4_ISA_AVX2)
            tile_avx2_all_rows(tile, fmt, groups, x, row0, n, y);
        else
            tile_scalar(tile, fmt, groups, x, row0, n, y);
    }
}

/* w: q4_repack's output for [n, k] in format fmt (as repacked); xq, xscale, xsum:
 * q4_quantize_rows' output for [m, k];
 * y: fp32 [m, n]. n_threads > 1 splits the tiles over an OpenMP team (the process's runtime). */
int q4_gemm(int isa, const uint8_t *w, int fmt, int n, int k, const int8_t *xq,
            const float *xscale, const float *xsum, int m, float *y, int n_threads)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || !q4r_format_ok(fmt, k) || n <= 0 || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    struct activations x = {xq, xscale, xsum, m};
    int groups = k / BLOCK, tiles = tiles_of(n);
    if (n_threads <= 1) {
        gemm_tiles(isa, w, fmt, n, groups, &x, y, 0, tiles);
        return 0;
    }
    BQ_TEAM_SPLIT(tiles, gemm_tiles(isa, w, fmt, n, groups, &x, y, begin, end));
    return 0;
}

size_t q4_workspace_bytes(int m, int k)
{
    return (size_t)m * k + 2 * (size_t)m * (k / BLOCK) * sizeof(float);
}

/* Quantize x and multiply: work is q4_workspace_bytes(m, k) bytes, 4-byte aligned. */
int q4_linear(int isa, const uint8_t *w, int fmt, int n, int k, const float *x,
              int m, float *y, void *work, int n_threads)
{
    int8_t *xq = (int8_t *)work;
    float *xscale = (float *)(xq + (size_t)m * k);
    float *xsum = xscale + (size_t)m * (k / BLOCK);
    int rc = q4_quantize_rows(isa, x, m, k, xq, xscale, xsum);
    return rc ? rc : q4_gemm(isa, w, fmt, n, k, xq, xscale, xsum, m, y, n_threads);
}

/* ---- split activations: x = high + low, each int8 per block ------------------------------
 * One int8 pass loses ~2 points of top-1 agreement on a small model (docs/KERNELS.md): the
 * rounding of x is ~1/254 of each block's largest value. Here the rounding residual
 * r = x - s_x * q_x is quantized again per block, and the product is W (high) + W (low): x
 * carries ~14 bits. Row i's high and low parts are rows 2i and 2i + 1 of one 2m-row operand, so
 * the tile pass that serves ROW_CHUNK (2) rows unpacks each weight block once for both. */

size_t q4_split_workspace_bytes(int m, int n, int k)
{
    return q4_workspace_bytes(2 * m, k) + 2 * (size_t)m * n * sizeof(float)
           + (size_t)k * sizeof(float);
}

static void quantize_block(int isa, const float *v, int8_t *q, float *scale, float *sum)
{
    if (isa == Q4_ISA_SCALAR)
        bq_quantize8_scalar(v, q, scale, sum);
    else
        bq_quantize8_avx2(v, q, scale, sum);
}

/* x fp32 [m, k] -> rows 2i (high) and 2i + 1 (low) of xq int8 [2m, k], xscale, xsum. */
static void quantize_rows_split(int isa, const float *x, int m, int k, int8_t *xq, float *xscale,
                                float *xsum, float *residual)
{
    int groups = k / BLOCK;
    for (int i = 0; i < m; i++) {
        const float *row = x + (size_t)i * k;
        size_t high = (size_t)(2 * i) * groups, low = high + groups;
        for (int g = 0; g < groups; g++) {
            int8_t *q = xq + (high + g) * BLOCK;
            quantize_block(isa, row + g * BLOCK, q, xscale + high + g, xsum + high + g);
            float d = xscale[high + g];
            for (int j = 0; j < BLOCK; j++)
                residual[g * BLOCK + j] = row[g * BLOCK + j] - d * (float)q[j];
        }
        for (int g = 0; g < groups; g++)
            quantize_block(isa, residual + g * BLOCK, xq + (low + g) * BLOCK, xscale + low + g,
                           xsum + low + g);
    }
}

/* y = x @ W.T with x split into high and low int8 parts; x fp32 [m, k] contiguous, y [m, n];
 * work is q4_split_workspace_bytes(m, n, k) bytes, 4-byte aligned. */
int q4_linear_split(int isa, const uint8_t *w, int fmt, int n, int k, const float *x,
                    int m, float *y, void *work, int n_threads)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || n <= 0 || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    int8_t *xq = (int8_t *)work;
    float *xscale = (float *)(xq + (size_t)2 * m * k);
    float *xsum = xscale + (size_t)2 * m * (k / BLOCK);
    float *parts = xsum + (size_t)2 * m * (k / BLOCK);
    float *residual = parts + (size_t)2 * m * n;
    quantize_rows_split(isa, x, m, k, xq, xscale, xsum, residual);
    int rc = q4_gemm(isa, w, fmt, n, k, xq, xscale, xsum, 2 * m, parts, n_threads);
    if (rc)
        return rc;
    for (int i = 0; i < m; i++) {
        const float *high = parts + (size_t)(2 * i) * n, *low = high + n;
        for (int c = 0; c < n; c++)
            y[(size_t)i * n + c] = high[c] + low[c];
    }
    return 0;
}

/* ---- int16 activations: x quantized per block to -32767..32767 -------------------------
 * The split pass above carries ~14 bits of x at twice the dot products of one int8 pass. Here
 * x carries ~16 bits at one pass's count: the weights are widened to 16 bits once per tile
 * row (shared by every activation row), and madd_epi16 multiplies 16 pairs and sums them in
 * pairs, as maddubs + madd do for 32 int8 ones. 2 x 15 x 32767 per pair and 32 x 15 x 32767
 * per block fit int32. */

/* x: fp32 [m, k] -> xq int16 [m, k], xscale and xsum (s_x * sum q_x) fp32 [m, k / 32]. */
int q4_quantize_rows16(int isa, const float *x, int m, int k, int16_t *xq, float *xscale,
                       float *xsum)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    bq_quantize_rows(isa, 1, x, m, k, xq, xscale, xsum);
    return 0;
}

struct activations16 {
    const int16_t *q;
    const float *scale;
    const float *sum;
    int m;
};

/* One order of float operations for every body below but AVX-512's, so the scalar one gives
 * the AVX2 one's bits and a row's result is the same whatever the rows beside it: per tile row
 * and block, the block's dot is an exact int32 (32 x 15 x 32767 < 2^24, so its conversion is
 * exact too), added as acc = fma(dot, s_w * s_x, acc), and the mins apart as
 * mins = fma(min_w, sum_x, mins); y = acc + mins. One conversion and one fma per block and
 * row where the products are, instead of one per eight products. */
static void tile16_scalar(const uint8_t *tile, int fmt, int groups,
                          const struct activations16 *x, int row0, int n, float *y)
{
    int k = groups * BLOCK;
    for (int i = 0; i < x->m; i++) {
        float acc[TILE_ROWS] = {0}, mins[TILE_ROWS] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *rec = q4r_record(tile, fmt, g);
            const int16_t *xq = x->q + (size_t)i * k + g * BLOCK;
            float sx = x->scale[(size_t)i * groups + g], sumx = x->sum[(size_t)i * groups + g];
            for (int r = 0; r < TILE_ROWS; r++) {
                const uint8_t *nib = rec + r * NIBBLE_BYTES;
                int32_t dot = 0;
                for (int j = 0; j < NIBBLE_BYTES; j++)
                    dot += (nib[j] & 15) * xq[j] + (nib[j] >> 4) * xq[j + NIBBLE_BYTES];
                acc[r] = fmaf((float)dot, q4r_param(tile, fmt, g, r) * sx, acc[r]);
                mins[r] = fmaf(q4r_param(tile, fmt, g, TILE_ROWS + r), sumx, mins[r]);
            }
        }
        for (int r = 0; r < TILE_ROWS && row0 + r < n; r++)
            y[(size_t)i * n + row0 + r] = acc[r] + mins[r];
    }
}

/* AVX2: two tile rows of a block in one 256-bit register, one 128-bit lane each, widened to
 * 16 bits by shifts and masks of its words as the AVX-512 body's four lanes are (activations
 * laid out to match, expand16_avx2): four madds per pair of tile rows, whose lanes two hadds
 * sum to the four rows' exact block dots, in the order [r0, r2, r1, r3] (DOT_LANES). */
#define DOT_LANES _MM_SHUFFLE(3, 1, 2, 0)

/* Tile rows r, r + 1 of a block's nibbles (at rec + r * 16) as four registers of words. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void widen_pair_avx2(const uint8_t *nib, __m256i w[4])
{
    const __m256i nibble = _mm256_set1_epi16(15);
    __m256i raw = _mm256_loadu_si256((const __m256i *)nib);
    w[0] = _mm256_and_si256(raw, nibble);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(raw, 8), nibble);
    w[2] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
    w[3] = _mm256_srli_epi16(raw, 12);
}

/* A pair of tile rows (widen_pair_avx2) times a block's activations as expand16_avx2 lays
 * them out: per lane, four int32 sums of its row's products. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline __m256i dot_pair_avx2(const __m256i w[4], const int16_t *xb)
{
#define XB(j) _mm256_loadu_si256((const __m256i *)(xb + 16 * (j)))
    __m256i d01 = _mm256_add_epi32(_mm256_madd_epi16(w[0], XB(0)), _mm256_madd_epi16(w[1], XB(1)));
    __m256i d23 = _mm256_add_epi32(_mm256_madd_epi16(w[2], XB(2)), _mm256_madd_epi16(w[3], XB(3)));
    return _mm256_add_epi32(d01, d23);
#undef XB
}

/* A block's 32 int16 activations as the AVX2 body multiplies them: the words' order
 * (permute16_blocks') in four groups of eight, each group twice, once for each 128-bit lane
 * (so a madd reads it from memory, with no register to broadcast it into). 64 words a block. */
__attribute__((target("avx2,fma,f16c")))
static void expand16_avx2(const int16_t *xq, int16_t *out, size_t blocks)
{
    /* In each 128-bit lane: its even words, then its odd ones. */
    const __m256i evens_odds = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11,
                                                14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7,
                                                10, 11, 14, 15);
    for (size_t b = 0; b < blocks; b++)
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(xq + b * BLOCK + 16 * h));
            v = _mm256_shuffle_epi8(v, evens_odds);
            int16_t *o = out + b * 2 * BLOCK + 32 * h;
            /* quadwords 0, 2: the 16 values' evens; 1, 3: their odds */
            _mm256_storeu_si256((__m256i *)o, _mm256_permute4x64_epi64(v, 0x88));
            _mm256_storeu_si256((__m256i *)(o + 16), _mm256_permute4x64_epi64(v, 0xdd));
        }
}

/* A Q4R_KQ super-block's head: its rows' d in DOT_LANES, and their -dmin. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void kq_head_avx2(const uint8_t *head, __m128 *d_lanes, __m128 *neg_dmin)
{
    __m128 d = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)head));
    __m128 dmin = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(head + Q4R_KQ_HEAD / 2)));
    *d_lanes = _mm_permute_ps(d, DOT_LANES);
    *neg_dmin = _mm_xor_ps(dmin, _mm_set1_ps(-0.0f));
}

/* A Q4R_KQ record's scales d * sc in DOT_LANES and mins -(dmin * m), as q4r_param's. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void kq_params_avx2(const uint8_t *params, __m128 d_lanes, __m128 neg_dmin,
                                  __m128 *sw_lanes, __m128 *mw)
{
    /* Byte r zero-extended into lane r, in DOT_LANES order for sc. */
    const __m128i sc_order = _mm_setr_epi8(0, -1, -1, -1, 2, -1, -1, -1, 1, -1, -1, -1, 3, -1,
                                           -1, -1);
    int32_t sc, m;
    memcpy(&sc, params, sizeof(sc));
    memcpy(&m, params + TILE_ROWS, sizeof(m));
    __m128i sc_lanes = _mm_shuffle_epi8(_mm_cvtsi32_si128(sc), sc_order);
    *sw_lanes = _mm_mul_ps(d_lanes, _mm_cvtepi32_ps(sc_lanes));
    *mw = _mm_mul_ps(neg_dmin, _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(m))));
}

/* Block records' scales in DOT_LANES and mins: fp32 or fp16 ones as they are, Q4R_KQ ones
 * rebuilt from the super-block's head (kq_head_avx2 read once per 8 blocks). */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void record_params_avx2(const uint8_t *rec, int fmt, __m128 d_lanes,
                                      __m128 neg_dmin, __m128 *sw_lanes, __m128 *mw)
{
    const uint8_t *params = rec + Q4R_NIBBLES;
    if (fmt == Q4R_KQ) {
        kq_params_avx2(params, d_lanes, neg_dmin, sw_lanes, mw);
        return;
    }
    __m128 sw;
    if (fmt == Q4R_FP16) {
        sw = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)params));
        *mw = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(params + 2 * TILE_ROWS)));
    } else {
        sw = _mm_loadu_ps((const float *)params);
        *mw = _mm_loadu_ps((const float *)params + TILE_ROWS);
    }
    *sw_lanes = _mm_permute_ps(sw, DOT_LANES);
}

/* How far ahead of the record it reads each int16 body asks for the weights: the hardware
 * prefetcher alone left one core's stream ~13% slower (3 KB measured best of 1.5, 3 and 6 KB
 * on the Zen 3), and on the Zen 5 the AVX-512 bodies' 2-thread streams 12-14% slower at k =
 * 4,096 and 28% at 12,288 (an MLP's down projection). Past the last tile it asks for bytes it
 * never reads: harmless. */
#define PREFETCH_AHEAD 3072

/* rows: 1..ROW_CHUNK16 activation rows starting at i0, all against one tile, whose records
 * run in super-blocks of `per` (Q4R_KQ: 8 after their head; else one run of all). Each pair
 * of tile rows is widened once for all the activation rows. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void tile16_avx2(const uint8_t *tile, int fmt, int groups,
                               const struct activations16 *x, int i0, int rows, int row0, int n,
                               float *y)
{
    const int per = fmt == Q4R_KQ ? Q4R_KQ_BLOCKS : groups;
    const size_t stride = q4r_record_bytes(fmt);
    /* DOT_LANES twice, for the pair's first row in dwords 0-1, 4-5 and its second in 2-3, 6-7 */
    const __m256i pair_lanes = _mm256_setr_epi32(0, 1, 0, 1, 2, 3, 2, 3);
    /* Rows in pairs i, i + 1: acc[i / 2] as the third hadd leaves them, [i: r0, r2; i + 1: r0,
     * r2 | i: r1, r3; i + 1: r1, r3]; an odd last row: acc[rows / 2]'s low half in DOT_LANES. */
    const int pairs = rows / 2;
    __m256 acc[(ROW_CHUNK16 + 1) / 2];
    __m128 acc_min[ROW_CHUNK16];
    for (int i = 0; i < rows; i++) {
        acc[i / 2] = _mm256_setzero_ps();
        acc_min[i] = _mm_setzero_ps();
    }
    const uint8_t *rec = tile;
    for (int g0 = 0; g0 < groups; g0 += per) {
        __m128 d_lanes = _mm_setzero_ps(), neg_dmin = _mm_setzero_ps();
        if (fmt == Q4R_KQ) {
            kq_head_avx2(rec, &d_lanes, &neg_dmin);
            rec += Q4R_KQ_HEAD;
        }
        for (int g = g0; g < g0 + per; g++, rec += stride) {
            _mm_prefetch((const char *)rec + PREFETCH_AHEAD, _MM_HINT_T0);
            __m128 sw_lanes, mw;
            record_params_avx2(rec, fmt, d_lanes, neg_dmin, &sw_lanes, &mw);
            __m256i w[4], low_pair[ROW_CHUNK16];
            widen_pair_avx2(rec, w);
            for (int i = 0; i < rows; i++)
                low_pair[i] = dot_pair_avx2(w, x->q + ((size_t)(i0 + i) * groups + g) * 2 * BLOCK);
            widen_pair_avx2(rec + 2 * NIBBLE_BYTES, w);
            __m256i h[ROW_CHUNK16];
            for (int i = 0; i < rows; i++) {
                size_t b = (size_t)(i0 + i) * groups + g;
                h[i] = _mm256_hadd_epi32(low_pair[i], dot_pair_avx2(w, x->q + b * 2 * BLOCK));
                acc_min[i] = _mm_fmadd_ps(mw, _mm_broadcast_ss(x->sum + b), acc_min[i]);
            }
            if (rows % 2) {
                size_t b = (size_t)(i0 + rows - 1) * groups + g;
                __m128i dot = _mm_hadd_epi32(_mm256_castsi256_si128(h[rows - 1]),
                                             _mm256_extracti128_si256(h[rows - 1], 1));
                __m128 scale = _mm_mul_ps(sw_lanes, _mm_broadcast_ss(x->scale + b));
                __m128 sum = _mm_fmadd_ps(_mm_cvtepi32_ps(dot), scale,
                                          _mm256_castps256_ps128(acc[pairs]));
                acc[pairs] = _mm256_castps128_ps256(sum);
            }
            if (!pairs)
                continue;
            /* Each lane's arithmetic is the one row's, so a pair gives each row its bits. */
            __m256 sw_pairs = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(sw_lanes),
                                                       pair_lanes);
            for (int i = 0; i < 2 * pairs; i += 2) {
                size_t b = (size_t)(i0 + i) * groups + g;
                __m128 sx = _mm_movelh_ps(_mm_broadcast_ss(x->scale + b),
                                          _mm_broadcast_ss(x->scale + b + groups));
                __m256 scale = _mm256_mul_ps(sw_pairs, _mm256_set_m128(sx, sx));
                __m256i dots = _mm256_hadd_epi32(h[i], h[i + 1]);
                acc[i / 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), scale, acc[i / 2]);
            }
        }
    }
    for (int i = 0; i < rows; i++) {
        __m128 sums;
        if (i == 2 * pairs) {
            sums = _mm_permute_ps(_mm256_castps256_ps128(acc[pairs]), DOT_LANES);
        } else {
            __m128 lo = _mm256_castps256_ps128(acc[i / 2]);
            __m128 hi = _mm256_extractf128_ps(acc[i / 2], 1);
            sums = i % 2 ? _mm_unpackhi_ps(lo, hi) : _mm_unpacklo_ps(lo, hi);
        }
        float out[TILE_ROWS];
        _mm_storeu_ps(out, _mm_add_ps(sums, acc_min[i]));
        for (int r = 0; r < TILE_ROWS && row0 + r < n; r++)
            y[(size_t)(i0 + i) * n + row0 + r] = out[r];
    }
}

/* Every activation row against one tile, ROW_CHUNK16 at a time, then the rest: three at
 * once, or two, then one. */
#define ALL_ROWS16(NAME, FMT)                                                               \
    do {                                                                                    \
        int i_ = 0;                                                                         \
        for (; i_ + ROW_CHUNK16 <= x->m; i_ += ROW_CHUNK16)                                 \
            NAME(tile, FMT, groups, x, i_, ROW_CHUNK16, row0, n, y);                        \
        if (x->m - i_ == 3) {                                                               \
            NAME(tile, FMT, groups, x, i_, 3, row0, n, y);                                  \
            i_ += 3;                                                                        \
        }                                                                                   \
        if (x->m - i_ >= 2) {                                                               \
            NAME(tile, FMT, groups, x, i_, 2, row0, n, y);                                  \
            i_ += 2;                                                                        \
        }                                                                                   \
        if (i_ < x->m)                                                                      \
            NAME(tile, FMT, groups, x, i_, 1, row0, n, y);                                  \
    } while (0)

/* Every activation row against one tile, for a tile chunk NAME of int16 activations. */
#define DEFINE_ALL_ROWS16(NAME, TARGET)                                                     \
    __attribute__((target(TARGET)))                                                         \
    static void NAME##_all_rows(const uint8_t *tile, int fmt, int groups,                   \
                                const struct activations16 *x, int row0, int n, float *y)   \
    {                                                                                       \
        if (fmt == Q4R_FP16)                                                                \
            ALL_ROWS16(NAME, Q4R_FP16);                                                     \
        else if (fmt == Q4R_KQ)                                                             \
            ALL_ROWS16(NAME, Q4R_KQ);                                                       \
        else                                                                                \
            ALL_ROWS16(NAME, Q4R_FP32);                                                     \
    }

DEFINE_ALL_ROWS16(tile16_avx2, "avx2,fma,f16c")

/* AVX-512 VNNI: the four tile rows of a block in one 512-bit register, one 128-bit lane each.
 * Shifts and masks of its 16-bit words give four registers of 16-bit weights (lane r: eight
 * of row r's elements), multiplied by the matching eight activations broadcast to every lane
 * (permuted once per call into the words' order, permute16_blocks): one madd and three dpwssd
 * leave each lane eight products, so a block costs one conversion, one scale and one add per
 * activation row for 128 products (the 256-bit body pays them per 32). No byte unpacks: Zen 4
 * runs one 512-bit shuffle a cycle, and without them a 1B model's Q4_K layers took 5% less
 * time there. The integer dots are exact; their fp32 sum runs in another order than the AVX2
 * body's, so the two agree to fp32 rounding, not to the bit. */
#define ZMM_ROW_CHUNK 8

__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline __m512i dot16_lanes(__m512i w0, __m512i w1, __m512i w2, __m512i w3,
                                  const int16_t *xb)
{
#define XB(j) _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb + 8 * (j))))
    __m512i d = _mm512_madd_epi16(w0, XB(0));
    d = _mm512_dpwssd_epi32(d, w1, XB(1));
    d = _mm512_dpwssd_epi32(d, w2, XB(2));
    return _mm512_dpwssd_epi32(d, w3, XB(3));
#undef XB
}

__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline void tile16_vnni(const uint8_t *tile, int fmt, int groups,
                               const struct activations16 *x, int i0, int rows, int row0,
                               int n, float *y)
{
    const __m512i nibble = _mm512_set1_epi16(15);
    /* Lane r * 4 + j takes tile row r's scale. */
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc[ZMM_ROW_CHUNK];
    __m128 acc_min[ZMM_ROW_CHUNK];
    for (int i = 0; i < rows; i++) {
        acc[i] = _mm512_setzero_ps();
        acc_min[i] = _mm_setzero_ps();
    }
    for (int g = 0; g < groups; g++) {
        float sw_buf[TILE_ROWS];
        const float *sw;
        __m128 mw;
        const uint8_t *rec = q4r_params_vec(tile, fmt, g, sw_buf, &sw, &mw);
        _mm_prefetch((const char *)rec + PREFETCH_AHEAD, _MM_HINT_T0);
        __m512 scale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(sw)));
        __m512i raw = _mm512_loadu_si512((const void *)rec);
        /* 16-bit word i of a lane: bytes 2i and 2i + 1, so elements 2i, 16 + 2i, 2i + 1 and
         * 17 + 2i in its four nibbles, taken by shifts and masks (no byte shuffles: Zen 4
         * runs one 512-bit shuffle a cycle); the activations come in that order
         * (permute16_blocks). */
        __m512i w0 = _mm512_and_si512(raw, nibble);
        __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 8), nibble);
        __m512i w2 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
        __m512i w3 = _mm512_srli_epi16(raw, 12);
        for (int i = 0; i < rows; i++) {
            size_t b = (size_t)(i0 + i) * groups + g;
            __m512i dot = dot16_lanes(w0, w1, w2, w3, x->q + b * BLOCK);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                     _mm512_mul_ps(scale, _mm512_set1_ps(x->scale[b])), acc[i]);
            acc_min[i] = _mm_fmadd_ps(mw, _mm_set1_ps(x->sum[b]), acc_min[i]);
        }
    }
    for (int i = 0; i < rows; i++) {
        float lanes[16], mins[TILE_ROWS];
        _mm512_storeu_ps(lanes, acc[i]);
        _mm_storeu_ps(mins, acc_min[i]);
        for (int r = 0; r < TILE_ROWS && row0 + r < n; r++) {
            const float *l = lanes + 4 * r;
            y[(size_t)(i0 + i) * n + row0 + r] = ((l[0] + l[1]) + (l[2] + l[3])) + mins[r];
        }
    }
}

/* Every activation row against one tile: chunks of ZMM_ROW_CHUNK, then at most one of four,
 * one of two and one row (constant row counts keep the accumulators in registers). */
#define ZMM_ROWS(FMT)                                                                       \
    do {                                                                                    \
        int i_ = 0;                                                                         \
        for (; i_ + ZMM_ROW_CHUNK <= x->m; i_ += ZMM_ROW_CHUNK)                             \
            tile16_vnni(tile, FMT, groups, x, i_, ZMM_ROW_CHUNK, row0, n, y);               \
        if (x->m - i_ >= 4) {                                                               \
            tile16_vnni(tile, FMT, groups, x, i_, 4, row0, n, y);                           \
            i_ += 4;                                                                        \
        }                                                                                   \
        if (x->m - i_ >= 2) {                                                               \
            tile16_vnni(tile, FMT, groups, x, i_, 2, row0, n, y);                           \
            i_ += 2;                                                                        \
        }                                                                                   \
        if (i_ < x->m)                                                                      \
            tile16_vnni(tile, FMT, groups, x, i_, 1, row0, n, y);                           \
    } while (0)

__attribute__((target(BQ_ZMM_TARGET)))
static void tile16_vnni_all_rows(const uint8_t *tile, int fmt, int groups,
                                 const struct activations16 *x, int row0, int n, float *y)
{
    if (fmt == Q4R_FP16)
        ZMM_ROWS(Q4R_FP16);
    else if (fmt == Q4R_KQ)
        ZMM_ROWS(Q4R_KQ);
    else
        ZMM_ROWS(Q4R_FP32);
}

/* A block's 32 activations in the order the AVX-512 body's words hold their weights: the
 * even then odd ones of the first 16, the even then odd ones of the last 16. */
static void permute16_blocks(int16_t *xq, size_t blocks)
{
    for (size_t b = 0; b < blocks; b++) {
        int16_t *q = xq + b * BLOCK, natural[BLOCK];
        memcpy(natural, q, sizeof(natural));
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 8; i++) {
                q[16 * h + i] = natural[16 * h + 2 * i];
                q[16 * h + 8 + i] = natural[16 * h + 2 * i + 1];
            }
    }
}

/* ---- Q4_K records on AVX-512: integer sums over a super-block ---------------------------
 * Q4_K's weights are d * sc * q - dmin * m with six-bit sc and m per block of 32 and fp16 d and
 * dmin per super-block of 256. With the activations quantized to int16 per super-block (one
 * s_x for 256 values, as llama.cpp's Q8_K does with int8), a super-block's products are
 * integers until its end: each block's dot (as tile16_vnni's lanes) times its sc, and each
 * block's sum of q_x times its m, summed in int32 over the 8 blocks, then one conversion and
 * one scale (d * s_x, dmin * s_x) per super-block instead of per block. Per block of a tile
 * that leaves the weight unpacking, four dot products, one multiply and one add per activation
 * row. The sums cannot overflow: 8 blocks x 63 x 8 products x 15 x 32767 < 2^31 a lane, and
 * 8 x 63 x 32 x 32767 for the mins. */
#define KQ_ROW_CHUNK 4

struct activations16_kq {
    const int16_t *q;    /* [m, k], each block in permute16_blocks' order */
    const float *scale;  /* [m, k / 256]: s_x per super-block */
    const int32_t *qsum; /* [m, k / 32]: each block's sum of q_x */
    int m;
};

/* x fp32 [m, k] (k a multiple of 256) -> xq int16 [m, k], s_x = max|x| / 32767 per
 * super-block of 256, and each block's sum of q_x; rounded as bq_quantize16_avx2 rounds. */
__attribute__((target("avx2,fma")))
static void quantize_rows16_kq(const float *x, int m, int k, int16_t *xq, float *xscale,
                               int32_t *xqsum)
{
    const int super = Q4R_KQ_BLOCKS * BLOCK;
    size_t supers = (size_t)m * (k / super);
    for (size_t s = 0; s < supers; s++) {
        const float *v = x + s * super;
        float d = bq_amax_avx2(v, super) / BQ_I16_MAX;
        xscale[s] = d;
        for (int g = 0; g < Q4R_KQ_BLOCKS; g++) {
            size_t b = s * Q4R_KQ_BLOCKS + g;
            if (d == 0.0f) {
                memset(xq + b * BLOCK, 0, BLOCK * sizeof(int16_t));
                xqsum[b] = 0;
                continue;
            }
            __m256i q[4];
            bq_round_by_avx2(v + g * BLOCK, d, q);
            bq_store16_avx2(xq + b * BLOCK, q);
            xqsum[b] = bq_sum_rounded_avx2(q);
        }
    }
}

__attribute__((target(BQ_ZMM_TARGET), always_inline))
static inline void tile16_kq_vnni(const uint8_t *tile, int groups,
                                  const struct activations16_kq *x, int i0, int rows, int row0,
                                  int n, float *y)
{
    const __m512i nibble = _mm512_set1_epi16(15);
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    /* From a dword in every lane, byte r zero-extended into 128-bit lane r's four dwords:
     * their control bytes are r, 0xff, 0xff, 0xff (a set top bit picks zero). */
    const __m512i pick = _mm512_set_epi32(
        -253, -253, -253, -253, -254, -254, -254, -254, -255, -255, -255, -255,
        -256, -256, -256, -256);
    int supers = groups / Q4R_KQ_BLOCKS;
    __m512 acc[KQ_ROW_CHUNK];
    __m128 acc_min[KQ_ROW_CHUNK];
    for (int i = 0; i < rows; i++) {
        acc[i] = _mm512_setzero_ps();
        acc_min[i] = _mm_setzero_ps();
    }
    for (int s = 0; s < supers; s++) {
        const uint8_t *head = tile + (size_t)s * Q4R_KQ_SUPER;
        __m512i dots[KQ_ROW_CHUNK];
        __m128i mins[KQ_ROW_CHUNK];
        for (int i = 0; i < rows; i++) {
            dots[i] = _mm512_setzero_si512();
            mins[i] = _mm_setzero_si128();
        }
        for (int g = 0; g < Q4R_KQ_BLOCKS; g++) {
            const uint8_t *rec = head + Q4R_KQ_HEAD + g * Q4R_KQ_RECORD;
            _mm_prefetch((const char *)rec + PREFETCH_AHEAD, _MM_HINT_T0);
            __m512i raw = _mm512_loadu_si512((const void *)rec);
            __m512i w0 = _mm512_and_si512(raw, nibble);
            __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 8), nibble);
            __m512i w2 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
            __m512i w3 = _mm512_srli_epi16(raw, 12);
            int32_t sc4, m4;
            memcpy(&sc4, rec + Q4R_NIBBLES, sizeof(sc4));
            memcpy(&m4, rec + Q4R_NIBBLES + TILE_ROWS, sizeof(m4));
            __m512i sc = _mm512_shuffle_epi8(_mm512_set1_epi32(sc4), pick);
            __m128i m = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(m4));
            for (int i = 0; i < rows; i++) {
                size_t b = (size_t)(i0 + i) * groups + s * Q4R_KQ_BLOCKS + g;
                __m512i dot = dot16_lanes(w0, w1, w2, w3, x->q + b * BLOCK);
                dots[i] = _mm512_add_epi32(dots[i], _mm512_mullo_epi32(dot, sc));
                mins[i] = _mm_add_epi32(mins[i], _mm_mullo_epi32(m, _mm_set1_epi32(x->qsum[b])));
            }
        }
        __m128 d = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)head));
        __m128 dmin = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(head + Q4R_KQ_HEAD / 2)));
        __m512 d_lanes = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d));
        for (int i = 0; i < rows; i++) {
            float sx = x->scale[(size_t)(i0 + i) * supers + s];
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[i]),
                                     _mm512_mul_ps(d_lanes, _mm512_set1_ps(sx)), acc[i]);
            acc_min[i] = _mm_fmadd_ps(_mm_cvtepi32_ps(mins[i]), _mm_mul_ps(dmin, _mm_set1_ps(sx)),
                                      acc_min[i]);
        }
    }
    for (int i = 0; i < rows; i++) {
        float lanes[16], dmins[TILE_ROWS];
        _mm512_storeu_ps(lanes, acc[i]);
        _mm_storeu_ps(dmins, acc_min[i]);
        for (int r = 0; r < TILE_ROWS && row0 + r < n; r++) {
            const float *l = lanes + 4 * r;
            y[(size_t)(i0 + i) * n + row0 + r] = ((l[0] + l[1]) + (l[2] + l[3])) - dmins[r];
        }
    }
}

/* Every activation row against one tile: chunks of KQ_ROW_CHUNK, then one of two and one row. */
__attribute__((target(BQ_ZMM_TARGET)))
static void tile16_kq_vnni_all_rows(const uint8_t *tile, int groups,
                                    const struct activations16_kq *x, int row0, int n, float *y)
{
    int i = 0;
    for (; i + KQ_ROW_CHUNK <= x->m; i += KQ_ROW_CHUNK)
        tile16_kq_vnni(tile, groups, x, i, KQ_ROW_CHUNK, row0, n, y);
    if (x->m - i >= 2) {
        tile16_kq_vnni(tile, groups, x, i, 2, row0, n, y);
        i += 2;
    }
    if (i < x->m)
        tile16_kq_vnni(tile, groups, x, i, 1, row0, n, y);
}

static void gemm16_kq_tiles(const uint8_t *w, int n, int groups,
                            const struct activations16_kq *x, float *y, int tile_begin,
                            int tile_end)
{
    for (int t = tile_begin; t < tile_end; t++)
        tile16_kq_vnni_all_rows(w + (size_t)t * q4r_tile_bytes(Q4R_KQ, groups), groups, x,
                                t * TILE_ROWS, n, y);
}

/* q4_linear16 of Q4_K records on AVX-512: x quantized per super-block, integer sums. */
static void linear16_kq(const uint8_t *w, int n, int k, const float *x, int m, float *y,
                        void *work, int n_threads)
{
    int16_t *xq = (int16_t *)work;
    float *xscale = (float *)(xq + (size_t)m * k);
    int32_t *xqsum = (int32_t *)(xscale + (size_t)m * (k / (Q4R_KQ_BLOCKS * BLOCK)));
    quantize_rows16_kq(x, m, k, xq, xscale, xqsum);
    permute16_blocks(xq, (size_t)m * (k / BLOCK));
    struct activations16_kq xa = {xq, xscale, xqsum, m};
    int groups = k / BLOCK, tiles = tiles_of(n);
    if (n_threads <= 1) {
        gemm16_kq_tiles(w, n, groups, &xa, y, 0, tiles);
        return;
    }
    BQ_TEAM_SPLIT(tiles, gemm16_kq_tiles(w, n, groups, &xa, y, begin, end));
}

static void gemm16_tiles(int isa, const uint8_t *w, int fmt, int n, int groups,
                         const struct activations16 *x, float *y, int tile_begin, int tile_end)
{
    for (int t = tile_begin; t < tile_end; t++) {
        const uint8_t *tile = w + (size_t)t * q4r_tile_bytes(fmt, groups);
        int row0 = t * TILE_ROWS;
        if (isa == Q4_ISA_AVX512_VNNI)
            tile16_vnni_all_rows(tile, fmt, groups, x, row0, n, y);
        else if (isa == Q4_ISA_AVX2)
            tile16_avx2_all_rows(tile, fmt, groups, x, row0, n, y);
        else
            tile16_scalar(tile, fmt, groups, x, row0, n, y);
    }
}

/* q4_gemm16 on activations as the ISA's body reads them (AVX2: expand16_avx2; AVX-512:
 * permute16_blocks; scalar: as they are). */
static int gemm16(int isa, const uint8_t *w, int fmt, int n, int k, const int16_t *xq,
                  const float *xscale, const float *xsum, int m, float *y, int n_threads)
{
    struct activations16 x = {xq, xscale, xsum, m};
    int groups = k / BLOCK, tiles = tiles_of(n);
    if (n_threads <= 1) {
        gemm16_tiles(isa, w, fmt, n, groups, &x, y, 0, tiles);
        return 0;
    }
    BQ_TEAM_SPLIT(tiles, gemm16_tiles(isa, w, fmt, n, groups, &x, y, begin, end));
    return 0;
}

/* xq, xscale and xsum: xq in AVX2's expanded layout (expand16_avx2) twice the words. */
size_t q4_workspace16_bytes(int m, int k)
{
    return 2 * (size_t)m * k * sizeof(int16_t) + 2 * (size_t)m * (k / BLOCK) * sizeof(float);
}

/* x fp32 [m, k] quantized as q4_quantize_rows16 does, each block expanded (expand16_avx2)
 * into xq as it is made: 2 m k words, no copy in the natural order. */
__attribute__((target("avx2,fma,f16c")))
static void quantize_expanded16(const float *x, size_t blocks, int16_t *xq, float *xscale,
                                float *xsum)
{
    for (size_t b = 0; b < blocks; b++) {
        int16_t natural[BLOCK];
        bq_quantize_rows(Q4_ISA_AVX2, 1, x + b * BLOCK, 1, BLOCK, natural, xscale + b,
                         xsum + b);
        expand16_avx2(natural, xq + b * 2 * BLOCK, 1);
    }
}

/* Quantize x to int16 and multiply: work is q4_workspace16_bytes(m, k) bytes, 4-byte aligned. */
int q4_linear16(int isa, const uint8_t *w, int fmt, int n, int k, const float *x,
                int m, float *y, void *work, int n_threads)
{
    int16_t *xq = (int16_t *)work;
    float *xscale = (float *)(xq + (size_t)m * k);
    float *xsum = xscale + (size_t)m * (k / BLOCK);
    isa = bq_resolve_isa(isa);
    if (isa < 0 || !q4r_format_ok(fmt, k) || n <= 0 || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    if (isa == Q4_ISA_AVX512_VNNI && fmt == Q4R_KQ) {
        linear16_kq(w, n, k, x, m, y, work, n_threads);
        return 0;
    }
    if (isa == Q4_ISA_AVX2) {
        size_t blocks = (size_t)m * (k / BLOCK);
        float *scale = (float *)(xq + 2 * (size_t)m * k), *sum = scale + blocks;
        quantize_expanded16(x, blocks, xq, scale, sum);
        return gemm16(isa, w, fmt, n, k, xq, scale, sum, m, y, n_threads);
    }
    bq_quantize_rows(isa, 1, x, m, k, xq, xscale, xsum);
    if (isa == Q4_ISA_AVX512_VNNI)
        permute16_blocks(xq, (size_t)m * (k / BLOCK));
    return gemm16(isa, w, fmt, n, k, xq, xscale, xsum, m, y, n_threads);
}

/* As q4_gemm, with q4_quantize_rows16's output for [m, k]. */
int q4_gemm16(int isa, const uint8_t *w, int fmt, int n, int k, const int16_t *xq,
              const float *xscale, const float *xsum, int m, float *y, int n_threads)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || !q4r_format_ok(fmt, k) || n <= 0 || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    if (isa == Q4_ISA_SCALAR)
        return gemm16(isa, w, fmt, n, k, xq, xscale, xsum, m, y, n_threads);
    size_t blocks = (size_t)m * (k / BLOCK), words = isa == Q4_ISA_AVX2 ? 2 * BLOCK : BLOCK;
    int16_t *ordered = malloc(sizeof(int16_t) * blocks * words);
    if (!ordered)
        return -2;
    if (isa == Q4_ISA_AVX2) {
        expand16_avx2(xq, ordered, blocks);
    } else {
        memcpy(ordered, xq, sizeof(int16_t) * blocks * words);
        permute16_blocks(ordered, blocks);
    }
    int rc = gemm16(isa, w, fmt, n, k, ordered, xscale, xsum, m, y, n_threads);
    free(ordered);
    return rc;
}
