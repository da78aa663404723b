/*
 * Grouped int8 weights read in place (q8_gemv's operand: q int8 [n, k], scales and optional
 * mins [n, k / 32] in fp16 or fp32) times int8-quantized activation rows on Intel's AMX tiles
 * (TDPBSSD), for steps of many rows: q8_gemv's int8 pass, which the vocabulary projection
 * takes (its top logits are recomputed exactly afterwards, pagoda/engine/layers/lm_head.py).
 *
 *   y[m, n] = sum_g  s_w[n, g] * s_x[m, g] * sum_j q_w[n, g, j] * q_x[m, g, j]
 *                  + min_w[n, g] * sum_x[m, g]
 *
 * with q8_gemv's own quantization of x (block_quant.h: s_x = max|x| / 127 per block of 32,
 * sum_x = s_x * sum q_x). A block's integer products are exact in int32 on the tiles, as in
 * q8_gemv; only the fp32 sums over blocks run in another order, so the result is q8_gemv's to
 * fp32 rounding, not to the bit.
 *
 * Tiles: A = 16 weight rows of one block, loaded straight from the weight (32 bytes a row,
 * the row stride k: nothing is widened or copied but a last panel of fewer than 16 rows);
 * B = 16 activation rows of the block in 4-byte groups (transposed once per call); C = [weight
 * rows x activation rows] int32, stored per block and scaled into fp32 registers.
 * Q6_K blocks and fp16-or-fp32 flags other than q8_gemv's are refused (-1): the caller keeps
 * q8_gemv. Built and bound to torch's OpenMP runtime as q8_gemv is (pagoda/kernels/cpu/native.py).
 */

#include <immintrin.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "block_quant.h"

#define BLOCK BQ_BLOCK
#define TILE_ROWS AMX_ROWS
/* A block of 16 activation rows in 4-byte groups: 8 tile rows of 64 bytes. */
#define B_TILE_BYTES (BLOCK / 4 * 64)
/* Activation row tiles whose sums a panel keeps at once (64 rows). */
#define GROUP_TILES 4
#define ISA_AMX 3
/* q8_gemv's `halves` bits. */
#define SCALES_HALF 1
#define MINS_HALF 2
#define Q6_K 4

/* Tiles: C0, C1 the products of even and odd blocks, A0, A1 their weights, B0, B1 their
 * activations. Numbers, not an enum: the intrinsics paste them into the instructions' text. */
#define C0 0
#define C1 1
#define A0 2
#define A1 3
#define B0 4
#define B1 5

struct weight {
    const int8_t *q;
    const void *scales, *mins;
    int halves, n, k, groups;
};

/* The activations as the tiles read them, per (block, row tile): B tiles, and 16 lanes of
 * s_x and of sum_x (zero past m). */
struct activations {
    const uint8_t *tiles;
    const float *scale, *sum;
    int m, row_tiles;
};

int q8a_available(void) { return amx_permitted(); }

static size_t quantized_bytes(int m, int k)
{
    return (size_t)m * k + 2 * (size_t)m * (k / BLOCK) * sizeof(float);
}

size_t q8a_workspace_bytes(int m, int k)
{
    size_t units = (size_t)amx_row_tiles(m) * (k / BLOCK);
    return quantized_bytes(m, k) + units * (B_TILE_BYTES + 2 * TILE_ROWS * sizeof(float));
}

/* C: 16 x 16 int32; A: 16 rows x 32 int8; B: 8 rows x 16 groups of 4 int8. */
static const uint8_t tile_rows[8] = {16, 16, 16, 16, 8, 8, 0, 0};
static const uint16_t tile_colsb[8] = {64, 64, 32, 32, 64, 64, 0, 0};

/* Row `row`'s `groups` scales (or mins) as fp32 at out; zeros past the weight's rows. */
__attribute__((target(AMX_TARGET)))
static void param_row(const void *params, int half, int row, int rows, int groups, float *out)
{
    if (row >= rows) {
        memset(out, 0, (size_t)groups * sizeof(float));
        return;
    }
    if (!half) {
        memcpy(out, (const float *)params + (size_t)row * groups, (size_t)groups * sizeof(float));
        return;
    }
    const uint16_t *p = (const uint16_t *)params + (size_t)row * groups;
    for (int j = 0; j < groups; j += 16) {
        __mmask16 lanes = (__mmask16)(groups - j >= 16 ? 0xFFFF : (1u << (groups - j)) - 1);
        _mm512_mask_storeu_ps(out + j, lanes, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, p + j)));
    }
}

/* Row tile rt, block g: its B tile (tile row r holds group r of every row's block) and lanes. */
__attribute__((target(AMX_TARGET)))
static void prepare_unit(const int8_t *xq, const float *xscale, const float *xsum, int m, int k,
                         int rt, int g, uint8_t *tile, float *scale, float *sum)
{
    __m512i rows[TILE_ROWS];
    int groups = k / BLOCK;
    for (int i = 0; i < TILE_ROWS; i++) {
        int row = rt * TILE_ROWS + i;
        if (row >= m) {
            rows[i] = _mm512_setzero_si512();
            scale[i] = sum[i] = 0.0f;
            continue;
        }
        const int8_t *p = xq + (size_t)row * k + (size_t)g * BLOCK;
        rows[i] = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
        scale[i] = xscale[(size_t)row * groups + g];
        sum[i] = xsum[(size_t)row * groups + g];
    }
    amx_transpose16(rows);
    for (int r = 0; r < BLOCK / 4; r++)
        _mm512_storeu_si512(tile + r * 64, rows[r]);
}

/* Block b's products of row tile rt into CTILE, stored at cbuf. */
#define TILE_BLOCK(CTILE, ATILE, BTILE, b, cbuf)                                               \
    do {                                                                                    \
        size_t unit_ = (size_t)(b) * x->row_tiles + rt;                                     \
        _tile_loadd(ATILE, a + (size_t)(b) * BLOCK, a_stride);                              \
        _tile_loadd(BTILE, x->tiles + unit_ * B_TILE_BYTES, 64);                            \
        _tile_zero(CTILE);                                                                  \
        _tile_dpbssd(CTILE, ATILE, BTILE);                                                  \
        _tile_stored(CTILE, cbuf, 64);                                                      \
    } while (0)

/* Every block of the panel (weight rows a, a_stride bytes apart) into row tile rt's sums,
 * scaled by the panel's scales and mins ([16 rows][groups], mins NULL: none). */
__attribute__((target(AMX_TARGET)))
static void panel_into(const int8_t *a, long a_stride, int groups, const float *scales,
                       const float *mins, const struct activations *x, int rt, float *out)
{
    int32_t c[2][TILE_ROWS * TILE_ROWS] __attribute__((aligned(64)));
    __m512 acc[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++)
        acc[r] = _mm512_setzero_ps();
    __asm__ volatile("" ::: "memory"); /* the tiles' loads name no memory inputs */
    TILE_BLOCK(C0, A0, B0, 0, c[0]);
    for (int b = 0; b < groups; b++) {
        if (b + 1 < groups) {
            if (b & 1)
                TILE_BLOCK(C0, A0, B0, b + 1, c[0]);
            else
                TILE_BLOCK(C1, A1, B1, b + 1, c[1]);
        }
        size_t unit = (size_t)b * x->row_tiles + rt;
        __m512 sx = _mm512_loadu_ps(x->scale + unit * TILE_ROWS);
        const int32_t *products = c[b & 1];
        for (int r = 0; r < TILE_ROWS; r++) {
            __m512 p = _mm512_cvtepi32_ps(_mm512_load_si512(products + r * TILE_ROWS));
            p = _mm512_mul_ps(p, _mm512_set1_ps(scales[r * groups + b]));
            acc[r] = _mm512_fmadd_ps(p, sx, acc[r]);
        }
        if (mins) {
            __m512 sums = _mm512_loadu_ps(x->sum + unit * TILE_ROWS);
            for (int r = 0; r < TILE_ROWS; r++)
                acc[r] = _mm512_fmadd_ps(sums, _mm512_set1_ps(mins[r * groups + b]), acc[r]);
        }
    }
    for (int r = 0; r < TILE_ROWS; r++)
        _mm512_store_ps(out + r * TILE_ROWS, acc[r]);
}

/* Panels [begin, end) of 16 weight rows: every activation row of them. */
__attribute__((target(AMX_TARGET)))
static void panels(const struct weight *w, const struct activations *x, float *y, int begin,
                   int end, float *params, int8_t *tail)
{
    float sums[GROUP_TILES][TILE_ROWS * TILE_ROWS] __attribute__((aligned(64)));
    float *scales = params, *mins = w->mins ? params + (size_t)w->groups * TILE_ROWS : NULL;
    struct amx_tile_config saved;
    amx_enter(&saved, tile_rows, tile_colsb);
    for (int p = begin; p < end; p++) {
        int n0 = p * TILE_ROWS, count = w->n - n0 < TILE_ROWS ? w->n - n0 : TILE_ROWS;
        const int8_t *a = w->q + (size_t)n0 * w->k;
        if (count < TILE_ROWS) { /* the tile reads 16 rows: the missing ones as zeros */
            memset(tail, 0, (size_t)TILE_ROWS * w->k);
            memcpy(tail, a, (size_t)count * w->k);
            a = tail;
        }
        for (int r = 0; r < TILE_ROWS; r++) {
            float *at = scales + (size_t)r * w->groups;
            param_row(w->scales, w->halves & SCALES_HALF, n0 + r, w->n, w->groups, at);
            if (mins)
                param_row(w->mins, w->halves & MINS_HALF, n0 + r, w->n, w->groups,
                          mins + (size_t)r * w->groups);
        }
        for (int rt0 = 0; rt0 < x->row_tiles; rt0 += GROUP_TILES) {
            int group = x->row_tiles - rt0 < GROUP_TILES ? x->row_tiles - rt0 : GROUP_TILES;
            for (int i = 0; i < group; i++)
                panel_into(a, w->k, w->groups, scales, mins, x, rt0 + i, sums[i]);
            for (int i = 0; i < group; i++)
                amx_store_transposed(sums[i], (rt0 + i) * TILE_ROWS, x->m, w->n, n0, y);
        }
    }
    amx_leave(&saved);
}

/* Panels [begin, end) with their own buffers: the panel's scales and mins, and a last panel
 * padded to 16 rows. */
static int panels_buffered(const struct weight *w, const struct activations *x, float *y,
                           int begin, int end)
{
    size_t params = 2 * (size_t)w->groups * TILE_ROWS * sizeof(float);
    size_t tail = end * TILE_ROWS > w->n ? (size_t)TILE_ROWS * w->k : 0;
    uint8_t *buffer = malloc(params + tail + 64);
    if (!buffer)
        return -2;
    float *aligned = (float *)(((uintptr_t)buffer + 63) & ~(uintptr_t)63);
    panels(w, x, y, begin, end, aligned, (int8_t *)((uint8_t *)aligned + params));
    free(buffer);
    return 0;
}

/* y = x @ W.T, x fp32 [m, k] quantized to int8 per block inside (q8_gemv's int8 pass); work is
 * q8a_workspace_bytes(m, k) bytes, 4-byte aligned. isa: -1 or 3 (AMX). -1 where the CPU or its
 * kernel refuses AMX, the weight is Q6_K blocks, or the arguments do not fit. */
int q8a_linear(int isa, const int8_t *q, const void *scales, const void *mins, int halves,
               int n, int k, const float *x, int m, float *y, void *work, int n_threads)
{
    if ((isa >= 0 && isa != ISA_AMX) || !amx_permitted() || (halves & ~(SCALES_HALF | MINS_HALF))
        || !scales || n <= 0 || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    int groups = k / BLOCK;
    int8_t *xq = (int8_t *)work;
    float *xscale = (float *)(xq + (size_t)m * k), *xsum = xscale + (size_t)m * groups;
    bq_quantize_rows(BQ_ISA_AVX2, 0, x, m, k, xq, xscale, xsum);
    struct activations a = {0};
    a.m = m;
    a.row_tiles = amx_row_tiles(m);
    size_t units = (size_t)a.row_tiles * groups;
    uint8_t *tiles = (uint8_t *)work + quantized_bytes(m, k);
    float *lanes = (float *)(tiles + units * B_TILE_BYTES);
    a.tiles = tiles;
    a.scale = lanes;
    a.sum = lanes + units * TILE_ROWS;
    for (size_t u = 0; u < units; u++) {
        int g = (int)(u / a.row_tiles), rt = (int)(u % a.row_tiles);
        prepare_unit(xq, xscale, xsum, m, k, rt, g, tiles + u * B_TILE_BYTES,
                     lanes + u * TILE_ROWS, lanes + (units + u) * TILE_ROWS);
    }
    struct weight w = {q, scales, mins, halves, n, k, groups};
    int panel_count = (n + TILE_ROWS - 1) / TILE_ROWS;
    if (n_threads <= 1)
        return panels_buffered(&w, &a, y, 0, panel_count);
    int failed = 0;
    BQ_TEAM_SPLIT(panel_count, if (panels_buffered(&w, &a, y, begin, end)) failed = 1);
    return failed ? -2 : 0;
}
