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
 * Repacked layout: rows in tiles of TILE_ROWS, and per (tile, block of 32) one record of
 * TILE_ROWS x 16 bytes of nibbles (byte j holds element j low, element j + 16 high, so one
 * mask and one shift give the 32 weights in order) followed by TILE_ROWS scales and TILE_ROWS
 * mins, fp32 (96-byte records) or, "compact", fp16 (80 bytes). Compact is for weights whose
 * scales and mins fp16 holds exactly (GGUF's Q4_0 and Q4_1 store them so; Q4_K's products of
 * two scales need more bits): a one-row step reads the weights once, so 17% fewer bytes is
 * ~17% less time where memory bounds it, and the products are the same arithmetic. The format
 * is an argument of every call that reads a repacked weight, not stored in it. A tile's
 * records are contiguous, so a tile streams from memory once and every activation row is
 * served from L1. Rows past N are zero (scale 0, min 0).
 */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "block_quant.h"
#include "half_float.h"

#define BLOCK 32
#define TILE_ROWS 4
#define NIBBLE_BYTES (BLOCK / 2)
#define RECORD_NIBBLES (TILE_ROWS * NIBBLE_BYTES)
/* Activation rows that share one pass over a tile's weights: their accumulators stay in
 * the 16 ymm registers AVX2 has. */
#define ROW_CHUNK 2

enum { Q4_ISA_SCALAR = 0, Q4_ISA_AVX2 = 1, Q4_ISA_AVX512_VNNI = 2 };

static int tiles_of(int n) { return (n + TILE_ROWS - 1) / TILE_ROWS; }

int q4_isa_supported(int isa) { return bq_cpu_has(isa); }

int q4_best_isa(void) { return bq_best_isa(); }

/* ---- records ------------------------------------------------------------------------- */

/* compact: fp16 scales and mins, else fp32. */
static size_t record_bytes(int compact)
{
    return RECORD_NIBBLES + 2 * TILE_ROWS * (compact ? sizeof(uint16_t) : sizeof(float));
}

static int format_ok(int compact) { return compact == 0 || compact == 1; }

/* A record's scale i (0 .. TILE_ROWS - 1) or min (TILE_ROWS + r). */
static inline float record_param(const uint8_t *rec, int compact, int i)
{
    const uint8_t *params = rec + RECORD_NIBBLES;
    if (compact) {
        uint16_t h;
        memcpy(&h, params + i * sizeof(h), sizeof(h));
        return f16_to_f32(h);
    }
    float f;
    memcpy(&f, params + i * sizeof(f), sizeof(f));
    return f;
}

/* The record's scales (read in place from fp32 records, widened by F16C into buf from compact
 * ones), its mins as a vector into *mins. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline const float *record_params_vec(const uint8_t *rec, int compact,
                                             float buf[TILE_ROWS], __m128 *mins)
{
    const uint8_t *params = rec + RECORD_NIBBLES;
    if (!compact) {
        *mins = _mm_loadu_ps((const float *)params + TILE_ROWS);
        return (const float *)params;
    }
    _mm_storeu_ps(buf, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)params)));
    *mins = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(params + 2 * TILE_ROWS)));
    return buf;
}

/* ---- repack --------------------------------------------------------------------------- */

size_t q4_repacked_bytes(int compact, int n, int k)
{
    return (size_t)tiles_of(n) * (size_t)(k / BLOCK) * record_bytes(compact);
}

static uint8_t canonical_nibble(const uint8_t *row, int e)
{
    uint8_t byte = row[e / 2];
    return (e % 2) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
}

/* packed: uint8 [n, k / 2], element 2j in the low nibble of byte j, 2j + 1 in the high one;
 * scales, mins: [n, k / 32], fp16 if compact (copied as they are into compact records), else
 * fp32. out: q4_repacked_bytes(compact, n, k) bytes. */
int q4_repack(const uint8_t *packed, const void *scales, const void *mins, int compact, int n,
              int k, uint8_t *out)
{
    if (n <= 0 || k <= 0 || k % BLOCK || !format_ok(compact))
        return -1;
    int groups = k / BLOCK;
    size_t rec_bytes = record_bytes(compact), param = compact ? sizeof(uint16_t) : sizeof(float);
    memset(out, 0, q4_repacked_bytes(compact, n, k));
    for (int row = 0; row < n; row++) {
        int tile = row / TILE_ROWS, r = row % TILE_ROWS;
        const uint8_t *src = packed + (size_t)row * (k / 2);
        for (int g = 0; g < groups; g++) {
            uint8_t *rec = out + ((size_t)tile * groups + g) * rec_bytes;
            uint8_t *nib = rec + r * NIBBLE_BYTES;
            for (int j = 0; j < NIBBLE_BYTES; j++) {
                uint8_t lo = canonical_nibble(src, g * BLOCK + j);
                uint8_t hi = canonical_nibble(src, g * BLOCK + j + NIBBLE_BYTES);
                nib[j] = (uint8_t)(lo | (hi << 4));
            }
            size_t at = ((size_t)row * groups + g) * param;
            memcpy(rec + RECORD_NIBBLES + r * param, (const uint8_t *)scales + at, param);
            memcpy(rec + RECORD_NIBBLES + (TILE_ROWS + r) * param, (const uint8_t *)mins + at,
                   param);
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

static void tile_scalar(const uint8_t *tile, int compact, int groups,
                        const struct activations *x, int row0,
                        int n, float *y)
{
    int k = groups * BLOCK;
    for (int i = 0; i < x->m; i++) {
        float acc[TILE_ROWS] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *rec = tile + (size_t)g * record_bytes(compact);
            const int8_t *xq = x->q + (size_t)i * k + g * BLOCK;
            float sx = x->scale[(size_t)i * groups + g], sumx = x->sum[(size_t)i * groups + g];
            for (int r = 0; r < TILE_ROWS; r++) {
                const uint8_t *nib = rec + r * NIBBLE_BYTES;
                int32_t dot = 0;
                for (int j = 0; j < NIBBLE_BYTES; j++)
                    dot += (nib[j] & 15) * xq[j] + (nib[j] >> 4) * xq[j + NIBBLE_BYTES];
                float sw = record_param(rec, compact, r);
                acc[r] += (float)dot * (sw * sx) + record_param(rec, compact, TILE_ROWS + r) * sumx;
            }
        }
        for (int r = 0; r < TILE_ROWS && row0 + r < n; r++)
            y[(size_t)i * n + row0 + r] = acc[r];
    }
}

/* ---- the product: AVX2 and AVX-512 VNNI --------------------------------------------------
 * One body, two dot products (block_quant.h's bq_dot8_*): 2 x 15 x 127 cannot saturate
 * maddubs' s16 pairs. */

/* Every activation row against one tile, ROW_CHUNK at a time, records in format COMPACT. */
#define ALL_ROWS(NAME, COMPACT)                                                             \
    do {                                                                                    \
        int i_ = 0;                                                                         \
        for (; i_ + ROW_CHUNK <= x->m; i_ += ROW_CHUNK)                                     \
            NAME(tile, COMPACT, groups, x, i_, ROW_CHUNK, row0, n, y);                      \
        if (i_ < x->m)                                                                      \
            NAME(tile, COMPACT, groups, x, i_, 1, row0, n, y);                              \
    } while (0)

/* rows: 1..ROW_CHUNK activation rows starting at i0, all against one tile. */
#define DEFINE_TILE_CHUNK(NAME, TARGET, DOT)                                                \
    __attribute__((target(TARGET), always_inline))                                          \
    static inline void NAME(const uint8_t *tile, int compact, int groups,                   \
                            const struct activations *x, int i0, int rows, int row0, int n, \
                            float *y)                                                       \
    {                                                                                       \
        size_t rec_bytes = record_bytes(compact);                                           \
        const __m128i low = _mm_set1_epi8(15);                                              \
        __m256 acc[ROW_CHUNK][TILE_ROWS];                                                   \
        __m128 acc_min[ROW_CHUNK];                                                          \
        for (int i = 0; i < ROW_CHUNK; i++) {                                               \
            acc_min[i] = _mm_setzero_ps();                                                  \
            for (int r = 0; r < TILE_ROWS; r++)                                             \
                acc[i][r] = _mm256_setzero_ps();                                            \
        }                                                                                   \
        for (int g = 0; g < groups; g++) {                                                  \
            const uint8_t *rec = tile + (size_t)g * rec_bytes;                              \
            float sw_buf[TILE_ROWS];                                                        \
            __m128 mw;                                                                      \
            const float *sw = record_params_vec(rec, compact, sw_buf, &mw);                 \
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
                BQ_HSUM256(acc[i][r], s);                                                      \
                y[(size_t)(i0 + i) * n + row0 + r] = s + mins[r];                           \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    __attribute__((target(TARGET)))                                                         \
    static void NAME##_all_rows(const uint8_t *tile, int compact, int groups,               \
                                const struct activations *x, int row0, int n, float *y)     \
    {                                                                                       \
        /* Constant row counts and formats let the compiler keep every accumulator in a    \
         * register and build one loop per format. */                                      \
        if (compact)                                                                        \
            ALL_ROWS(NAME, 1);                                                              \
        else                                                                                \
            ALL_ROWS(NAME, 0);                                                              \
    }

DEFINE_TILE_CHUNK(tile_avx2, "avx2,fma,f16c", bq_dot8_avx2)
DEFINE_TILE_CHUNK(tile_vnni, "avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c", bq_dot8_vnni)

static void gemm_tiles(int isa, const uint8_t *w, int compact, int n, int groups,
                       const struct activations *x, float *y, int tile_begin, int tile_end)
{
    for (int t = tile_begin; t < tile_end; t++) {
        const uint8_t *tile = w + (size_t)t * groups * record_bytes(compact);
        int row0 = t * TILE_ROWS;
        if (isa == Q4_ISA_AVX512_VNNI)
            tile_vnni_all_rows(tile, compact, groups, x, row0, n, y);
        else if (isa == Q4_ISA_AVX2)
            tile_avx2_all_rows(tile, compact, groups, x, row0, n, y);
        else
            tile_scalar(tile, compact, groups, x, row0, n, y);
    }
}

/* w: q4_repack's output for [n, k] in format compact (as repacked); xq, xscale, xsum:
 * q4_quantize_rows' output for [m, k];
 * y: fp32 [m, n]. n_threads > 1 splits the tiles over an OpenMP team (the process's runtime). */
int q4_gemm(int isa, const uint8_t *w, int compact, int n, int k, const int8_t *xq,
            const float *xscale, const float *xsum, int m, float *y, int n_threads)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || !format_ok(compact) || n <= 0 || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    struct activations x = {xq, xscale, xsum, m};
    int groups = k / BLOCK, tiles = tiles_of(n);
    if (n_threads <= 1) {
        gemm_tiles(isa, w, compact, n, groups, &x, y, 0, tiles);
        return 0;
    }
#pragma omp parallel num_threads(n_threads)
    {
        int begin, end;
        if (bq_team_share(tiles, &begin, &end))
            gemm_tiles(isa, w, compact, n, groups, &x, y, begin, end);
    }
    return 0;
}

size_t q4_workspace_bytes(int m, int k)
{
    return (size_t)m * k + 2 * (size_t)m * (k / BLOCK) * sizeof(float);
}

/* Quantize x and multiply: work is q4_workspace_bytes(m, k) bytes, 4-byte aligned. */
int q4_linear(int isa, const uint8_t *w, int compact, int n, int k, const float *x,
              int m, float *y, void *work, int n_threads)
{
    int8_t *xq = (int8_t *)work;
    float *xscale = (float *)(xq + (size_t)m * k);
    float *xsum = xscale + (size_t)m * (k / BLOCK);
    int rc = q4_quantize_rows(isa, x, m, k, xq, xscale, xsum);
    return rc ? rc : q4_gemm(isa, w, compact, n, k, xq, xscale, xsum, m, y, n_threads);
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
int q4_linear_split(int isa, const uint8_t *w, int compact, int n, int k, const float *x,
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
    int rc = q4_gemm(isa, w, compact, n, k, xq, xscale, xsum, 2 * m, parts, n_threads);
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

static void tile16_scalar(const uint8_t *tile, int compact, int groups,
                        const struct activations16 *x,
                          int row0, int n, float *y)
{
    int k = groups * BLOCK;
    for (int i = 0; i < x->m; i++) {
        float acc[TILE_ROWS] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *rec = tile + (size_t)g * record_bytes(compact);
            const int16_t *xq = x->q + (size_t)i * k + g * BLOCK;
            float sx = x->scale[(size_t)i * groups + g], sumx = x->sum[(size_t)i * groups + g];
            for (int r = 0; r < TILE_ROWS; r++) {
                const uint8_t *nib = rec + r * NIBBLE_BYTES;
                int32_t dot = 0;
                for (int j = 0; j < NIBBLE_BYTES; j++)
                    dot += (nib[j] & 15) * xq[j] + (nib[j] >> 4) * xq[j + NIBBLE_BYTES];
                float sw = record_param(rec, compact, r);
                acc[r] += (float)dot * (sw * sx) + record_param(rec, compact, TILE_ROWS + r) * sumx;
            }
        }
        for (int r = 0; r < TILE_ROWS && row0 + r < n; r++)
            y[(size_t)i * n + row0 + r] = acc[r];
    }
}

#define DEFINE_TILE16_CHUNK(NAME, TARGET, DOT)                                              \
    __attribute__((target(TARGET), always_inline))                                          \
    static inline void NAME(const uint8_t *tile, int compact, int groups,                   \
                            const struct activations16 *x, int i0, int rows, int row0, int n, \
                            float *y)                                                       \
    {                                                                                       \
        size_t rec_bytes = record_bytes(compact);                                           \
        const __m128i low = _mm_set1_epi8(15);                                              \
        __m256 acc[ROW_CHUNK][TILE_ROWS];                                                   \
        __m128 acc_min[ROW_CHUNK];                                                          \
        for (int i = 0; i < ROW_CHUNK; i++) {                                               \
            acc_min[i] = _mm_setzero_ps();                                                  \
            for (int r = 0; r < TILE_ROWS; r++)                                             \
                acc[i][r] = _mm256_setzero_ps();                                            \
        }                                                                                   \
        for (int g = 0; g < groups; g++) {                                                  \
            const uint8_t *rec = tile + (size_t)g * rec_bytes;                              \
            float sw_buf[TILE_ROWS];                                                        \
            __m128 mw;                                                                      \
            const float *sw = record_params_vec(rec, compact, sw_buf, &mw);                 \
            __m256i xlo[ROW_CHUNK], xhi[ROW_CHUNK];                                         \
            float sx[ROW_CHUNK];                                                            \
            for (int i = 0; i < rows; i++) {                                                \
                size_t b = (size_t)(i0 + i) * groups + g;                                   \
                xlo[i] = _mm256_loadu_si256((const __m256i *)(x->q + b * BLOCK));           \
                xhi[i] = _mm256_loadu_si256((const __m256i *)(x->q + b * BLOCK + 16));      \
                sx[i] = x->scale[b];                                                        \
                acc_min[i] = _mm_fmadd_ps(mw, _mm_set1_ps(x->sum[b]), acc_min[i]);          \
            }                                                                               \
            for (int r = 0; r < TILE_ROWS; r++) {                                           \
                __m128i raw = _mm_loadu_si128((const __m128i *)(rec + r * NIBBLE_BYTES));   \
                __m256i wlo = _mm256_cvtepu8_epi16(_mm_and_si128(raw, low));                \
                __m256i whi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), low)); \
                for (int i = 0; i < rows; i++) {                                            \
                    __m256 p = _mm256_cvtepi32_ps(DOT(wlo, whi, xlo[i], xhi[i]));           \
                    acc[i][r] = _mm256_fmadd_ps(p, _mm256_set1_ps(sw[r] * sx[i]), acc[i][r]);\
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        for (int i = 0; i < rows; i++) {                                                    \
            float mins[TILE_ROWS];                                                          \
            _mm_storeu_ps(mins, acc_min[i]);                                                \
            for (int r = 0; r < TILE_ROWS && row0 + r < n; r++) {                           \
                float s;                                                                    \
                BQ_HSUM256(acc[i][r], s);                                                      \
                y[(size_t)(i0 + i) * n + row0 + r] = s + mins[r];                           \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    __attribute__((target(TARGET)))                                                         \
    static void NAME##_all_rows(const uint8_t *tile, int compact, int groups,               \
                                const struct activations16 *x, int row0, int n, float *y)   \
    {                                                                                       \
        if (compact)                                                                        \
            ALL_ROWS(NAME, 1);                                                              \
        else                                                                                \
            ALL_ROWS(NAME, 0);                                                              \
    }

DEFINE_TILE16_CHUNK(tile16_avx2, "avx2,fma,f16c", bq_dot16_avx2)
DEFINE_TILE16_CHUNK(tile16_vnni, "avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c", bq_dot16_vnni)

static void gemm16_tiles(int isa, const uint8_t *w, int compact, int n, int groups,
                         const struct activations16 *x, float *y, int tile_begin, int tile_end)
{
    for (int t = tile_begin; t < tile_end; t++) {
        const uint8_t *tile = w + (size_t)t * groups * record_bytes(compact);
        int row0 = t * TILE_ROWS;
        if (isa == Q4_ISA_AVX512_VNNI)
            tile16_vnni_all_rows(tile, compact, groups, x, row0, n, y);
        else if (isa == Q4_ISA_AVX2)
            tile16_avx2_all_rows(tile, compact, groups, x, row0, n, y);
        else
            tile16_scalar(tile, compact, groups, x, row0, n, y);
    }
}

/* As q4_gemm, with q4_quantize_rows16's output for [m, k]. */
int q4_gemm16(int isa, const uint8_t *w, int compact, int n, int k, const int16_t *xq,
              const float *xscale, const float *xsum, int m, float *y, int n_threads)
{
    isa = bq_resolve_isa(isa);
    if (isa < 0 || !format_ok(compact) || n <= 0 || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    struct activations16 x = {xq, xscale, xsum, m};
    int groups = k / BLOCK, tiles = tiles_of(n);
    if (n_threads <= 1) {
        gemm16_tiles(isa, w, compact, n, groups, &x, y, 0, tiles);
        return 0;
    }
#pragma omp parallel num_threads(n_threads)
    {
        int begin, end;
        if (bq_team_share(tiles, &begin, &end))
            gemm16_tiles(isa, w, compact, n, groups, &x, y, begin, end);
    }
    return 0;
}

size_t q4_workspace16_bytes(int m, int k)
{
    return (size_t)m * k * sizeof(int16_t) + 2 * (size_t)m * (k / BLOCK) * sizeof(float);
}

/* Quantize x to int16 and multiply: work is q4_workspace16_bytes(m, k) bytes, 4-byte aligned. */
int q4_linear16(int isa, const uint8_t *w, int compact, int n, int k, const float *x,
                int m, float *y, void *work, int n_threads)
{
    int16_t *xq = (int16_t *)work;
    float *xscale = (float *)(xq + (size_t)m * k);
    float *xsum = xscale + (size_t)m * (k / BLOCK);
    int rc = q4_quantize_rows16(isa, x, m, k, xq, xscale, xsum);
    return rc ? rc : q4_gemm16(isa, w, compact, n, k, xq, xscale, xsum, m, y, n_threads);
}
