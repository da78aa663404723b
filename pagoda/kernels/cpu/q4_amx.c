/*
 * int4 weights in q4_gemv's repacked records (pagoda/kernels/cpu/q4_records.h) times fp32 activation
 * rows on Intel's AMX tiles (TDPBF16PS), for steps of many rows: a batch of decode streams, a
 * prefill chunk.
 *
 *   y[m, n] = sum_g  s_w[n, g] * sum_j q_w[n, g, j] * x'[m, g, j]  +  min_w[n, g] * sum_j x'[m, g, j]
 *
 * x' = hi + lo with hi = bf16(x) and lo = bf16(x - hi), both rounded to nearest even: ~16 bits
 * of each activation (q4_gemv's int16 pass keeps ~16 bits of a block's largest), and q_w
 * (0..15) is exact in bf16, so the block's products are exact and only their fp32 sums round.
 * The scales stay out of the tiles: a block's integer-valued weights times hi and lo accumulate
 * in one fp32 tile, which is then scaled by the block's s_w and added with its min term in
 * AVX-512 registers. So y is the dequantized weights times x' to fp32 rounding, as near the
 * exact product as q4_gemv's int16 pass.
 *
 * The tiles hold the product transposed: A is 16 weight rows of a block (32 bf16 a row, the
 * nibbles widened in place), B 16 activation rows of the block as bf16 pairs (row r holds pair
 * r of each activation row: transposed once per call, shared by every panel of weight rows), C
 * [16 weight rows x 16 activation rows] fp32. A thread widens a panel of 16 weight rows for up
 * to CHUNK_BLOCKS blocks into its own buffer and runs every activation row tile on it.
 *
 * AMX needs the kernel's permission for each process (amx_tiles.h), which q4a_available asks
 * for; a CPU or kernel without it gets 0 and the caller keeps q4_gemv.
 * Built and bound to torch's OpenMP runtime as q4_gemv is (pagoda/kernels/cpu/native.py).
 */

#include <immintrin.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "amx_tiles.h"
#include "block_quant.h"
#include "q4_records.h"

#define BLOCK Q4R_BLOCK
#define TILE_ROWS AMX_ROWS
#define PANEL_TILES (TILE_ROWS / Q4R_TILE)
#define TILE_BYTES AMX_TILE_BYTES
/* Blocks of a panel widened at once (16 KB of bf16), and activation row tiles whose sums a
 * panel keeps at once (64 rows): more rows take the panel's weights again. */
#define CHUNK_BLOCKS 16
#define GROUP_TILES 4
#define ISA_AMX 3

/* Tiles: C0, C1 the products of even and odd blocks (so one block's sums are read while the
 * next one's are made), A0, A1 their weights, H0, H1 and L0, L1 the activations' hi and lo.
 * Numbers, not an enum: the intrinsics paste them into the instructions' text. */
#define C0 0
#define C1 1
#define A0 2
#define A1 3
#define H0 4
#define H1 5
#define L0 6
#define L1 7

/* 1 where this CPU has AMX and the kernel lets this process use its tiles. */
int q4a_available(void) { return amx_permitted(); }

/* The activations' hi and lo tiles and their blocks' sums, for [m, k]. */
size_t q4a_workspace_bytes(int m, int k)
{
    size_t units = (size_t)amx_row_tiles(m) * (k / BLOCK);
    return units * (2 * TILE_BYTES + TILE_ROWS * sizeof(float));
}

/* Every tile 16 rows of 64 bytes. */
static const uint8_t tile_rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
static const uint16_t tile_colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};

/* bf16 lanes 0-15 (upper = 0) or 16-31 (upper = 1) of v as fp32. */
__attribute__((target(AMX_TARGET), always_inline))
static inline __m512 bf16_half(__m512i v, int upper)
{
    __m256i half = upper ? _mm512_extracti64x4_epi64(v, 1) : _mm512_castsi512_si256(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* Activation rows row0 .. row0 + 15 (zero past m), block g: their hi and lo tiles (pair r of
 * every row in tile row r) and the block's sums of hi + lo. */
__attribute__((target(AMX_TARGET)))
static void prepare_activations(const float *x, int m, int k, int row0, int g, uint8_t *hi_tile,
                                uint8_t *lo_tile, float *sums)
{
    __m512i hi[TILE_ROWS], lo[TILE_ROWS];
    for (int i = 0; i < TILE_ROWS; i++) {
        int row = row0 + i;
        if (row >= m) {
            hi[i] = lo[i] = _mm512_setzero_si512();
            sums[i] = 0.0f;
            continue;
        }
        const float *p = x + (size_t)row * k + (size_t)g * BLOCK;
        __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
        __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        __m512 ha = bf16_half(h, 0), hb = bf16_half(h, 1);
        __m512i l = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
        __m512 total = _mm512_add_ps(_mm512_add_ps(ha, bf16_half(l, 0)),
                                     _mm512_add_ps(hb, bf16_half(l, 1)));
        sums[i] = _mm512_reduce_add_ps(total);
        hi[i] = h;
        lo[i] = l;
    }
    amx_transpose16(hi);
    amx_transpose16(lo);
    for (int r = 0; r < TILE_ROWS; r++) {
        _mm512_storeu_si512(hi_tile + r * 64, hi[r]);
        _mm512_storeu_si512(lo_tile + r * 64, lo[r]);
    }
}

struct activations {
    const uint8_t *hi, *lo; /* [block][row tile] tiles */
    const float *sums;      /* [block][row tile][16] */
    int m, tiles;           /* rows, row tiles */
};

/* One panel's chunk of blocks widened: A tiles (16 rows x 32 bf16, a row's weights in order),
 * and per block the 16 rows' scales and mins. */
struct chunk {
    uint8_t a[CHUNK_BLOCKS][TILE_BYTES] __attribute__((aligned(64)));
    float scale[CHUNK_BLOCKS][TILE_ROWS] __attribute__((aligned(64)));
    float min[CHUNK_BLOCKS][TILE_ROWS] __attribute__((aligned(64)));
};

/* Record rec's 4 rows of nibbles as 4 rows of 32 bf16 at out (64 bytes apart). */
__attribute__((target(AMX_TARGET), always_inline))
static inline void widen_record(const uint8_t *rec, uint8_t *out)
{
    /* bf16 of 0..15 in word lanes 0..15: the lookup vpermw makes of each nibble. */
    const __m512i table = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100,
        0x40E0, 0x40C0, 0x40A0, 0x4080, 0x4040, 0x4000, 0x3F80, 0x0000);
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512i raw = _mm512_loadu_si512(rec);
    __m512i low = _mm512_and_si512(raw, mask);
    __m512i high = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
    /* Words of rows 0-1 (a row's 16 in each 256-bit half) and rows 2-3. */
    __m512i low01 = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(low)), table);
    __m512i low23 = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(low, 1)), table);
    __m512i high01 = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(high)), table);
    __m512i high23 = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(high, 1)), table);
    _mm512_store_si512(out, _mm512_shuffle_i64x2(low01, high01, 0x44));
    _mm512_store_si512(out + 64, _mm512_shuffle_i64x2(low01, high01, 0xEE));
    _mm512_store_si512(out + 128, _mm512_shuffle_i64x2(low23, high23, 0x44));
    _mm512_store_si512(out + 192, _mm512_shuffle_i64x2(low23, high23, 0xEE));
}

/* Blocks g0 .. g0 + count - 1 of the panel starting at tile t0 (tiles past `tiles` are zero). */
__attribute__((target(AMX_TARGET)))
static void widen_chunk(const uint8_t *w, int fmt, int groups, int tiles, int t0, int g0,
                        int count, struct chunk *out)
{
    size_t tile_bytes = q4r_tile_bytes(fmt, groups);
    for (int t = 0; t < PANEL_TILES; t++) {
        int row = t * Q4R_TILE;
        if (t0 + t >= tiles) {
            for (int b = 0; b < count; b++) {
                memset(out->a[b] + row * 64, 0, Q4R_TILE * 64);
                memset(&out->scale[b][row], 0, Q4R_TILE * sizeof(float));
                memset(&out->min[b][row], 0, Q4R_TILE * sizeof(float));
            }
            continue;
        }
        const uint8_t *tile = w + (size_t)(t0 + t) * tile_bytes;
        for (int b = 0; b < count; b++) {
            float buf[Q4R_TILE];
            const float *scales;
            __m128 mins;
            const uint8_t *rec = q4r_params_vec(tile, fmt, g0 + b, buf, &scales, &mins);
            widen_record(rec, out->a[b] + row * 64);
            _mm_store_ps(&out->scale[b][row], _mm_loadu_ps(scales));
            _mm_store_ps(&out->min[b][row], mins);
        }
    }
}

/* Block b's products of row tile rt into tile CTILE, stored at cbuf. */
#define TILE_BLOCK(CTILE, ATILE, HTILE, LTILE, b, cbuf)                                       \
    do {                                                                                    \
        size_t unit_ = (size_t)(g0 + (b)) * x->tiles + rt;                                  \
        _tile_loadd(ATILE, ch->a[b], 64);                                                   \
        _tile_loadd(HTILE, x->hi + unit_ * TILE_BYTES, 64);                                 \
        _tile_loadd(LTILE, x->lo + unit_ * TILE_BYTES, 64);                                 \
        _tile_zero(CTILE);                                                                  \
        _tile_dpbf16ps(CTILE, ATILE, HTILE);                                                \
        _tile_dpbf16ps(CTILE, ATILE, LTILE);                                                \
        _tile_stored(CTILE, cbuf, 64);                                                      \
    } while (0)

/* One chunk of blocks into row tile rt's sums (weight rows x activation rows): each block's
 * products scaled by its scales, plus its mins times the activations' sums. A block's tiles
 * are started before the previous block's products are scaled, so the two overlap. */
__attribute__((target(AMX_TARGET)))
static void chunk_into(const struct chunk *ch, const struct activations *x, int g0, int count,
                       int rt, float *sums_io, int first)
{
    float c[2][TILE_ROWS * TILE_ROWS] __attribute__((aligned(64)));
    __m512 acc[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++)
        acc[r] = first ? _mm512_setzero_ps() : _mm512_load_ps(sums_io + r * TILE_ROWS);
    /* The chunk's weights and the activations were written by plain stores, which the tile
     * loads' asm does not name as inputs. */
    __asm__ volatile("" ::: "memory");
    TILE_BLOCK(C0, A0, H0, L0, 0, c[0]);
    for (int b = 0; b < count; b++) {
        if (b + 1 < count) {
            if (b & 1)
                TILE_BLOCK(C0, A0, H0, L0, b + 1, c[0]);
            else
                TILE_BLOCK(C1, A1, H1, L1, b + 1, c[1]);
        }
        const float *products = c[b & 1];
        __m512 sums = _mm512_loadu_ps(x->sums + ((size_t)(g0 + b) * x->tiles + rt) * TILE_ROWS);
        for (int r = 0; r < TILE_ROWS; r++) {
            acc[r] = _mm512_fmadd_ps(_mm512_load_ps(products + r * TILE_ROWS),
                                     _mm512_set1_ps(ch->scale[b][r]), acc[r]);
            acc[r] = _mm512_fmadd_ps(sums, _mm512_set1_ps(ch->min[b][r]), acc[r]);
        }
    }
    for (int r = 0; r < TILE_ROWS; r++)
        _mm512_store_ps(sums_io + r * TILE_ROWS, acc[r]);
}

/* Panels [begin, end) of 16 weight rows: every activation row of them. */
__attribute__((target(AMX_TARGET)))
static void panels(const uint8_t *w, int fmt, int n, int groups, const struct activations *x,
                   float *y, int begin, int end)
{
    struct chunk ch;
    float sums[GROUP_TILES][TILE_ROWS * TILE_ROWS] __attribute__((aligned(64)));
    int tiles = (n + Q4R_TILE - 1) / Q4R_TILE;
    struct amx_tile_config saved;
    amx_enter(&saved, tile_rows, tile_colsb);
    for (int p = begin; p < end; p++) {
        for (int rt0 = 0; rt0 < x->tiles; rt0 += GROUP_TILES) {
            int group = x->tiles - rt0 < GROUP_TILES ? x->tiles - rt0 : GROUP_TILES;
            for (int g0 = 0; g0 < groups; g0 += CHUNK_BLOCKS) {
                int count = groups - g0 < CHUNK_BLOCKS ? groups - g0 : CHUNK_BLOCKS;
                widen_chunk(w, fmt, groups, tiles, p * PANEL_TILES, g0, count, &ch);
                for (int i = 0; i < group; i++)
                    chunk_into(&ch, x, g0, count, rt0 + i, sums[i], g0 == 0);
            }
            for (int i = 0; i < group; i++)
                amx_store_transposed(sums[i], (rt0 + i) * TILE_ROWS, x->m, n, p * TILE_ROWS, y);
        }
    }
    amx_leave(&saved);
}

static void prepare_all(const float *x, int m, int k, struct activations *a, uint8_t *hi,
                        uint8_t *lo, float *sums, int unit)
{
    int g = unit / a->tiles, rt = unit % a->tiles;
    prepare_activations(x, m, k, rt * TILE_ROWS, g, hi + (size_t)unit * TILE_BYTES,
                        lo + (size_t)unit * TILE_BYTES, sums + (size_t)unit * TILE_ROWS);
}

/* y = x @ W.T for x fp32 [m, k]; work is q4a_workspace_bytes(m, k) bytes. isa: -1 or 3 (AMX);
 * -1 is returned where the CPU or its kernel refuses AMX, or the arguments do not fit. */
int q4a_linear(int isa, const uint8_t *w, int fmt, int n, int k, const float *x, int m,
               float *y, void *work, int n_threads)
{
    if ((isa >= 0 && isa != ISA_AMX) || !q4a_available() || !q4r_format_ok(fmt, k) || n <= 0
        || m <= 0 || k <= 0 || k % BLOCK)
        return -1;
    int groups = k / BLOCK;
    struct activations a;
    a.m = m;
    a.tiles = amx_row_tiles(m);
    size_t units = (size_t)a.tiles * groups;
    uint8_t *hi = (uint8_t *)work, *lo = hi + units * TILE_BYTES;
    float *sums = (float *)(lo + units * TILE_BYTES);
    a.hi = hi;
    a.lo = lo;
    a.sums = sums;
    int panel_count = (n + TILE_ROWS - 1) / TILE_ROWS;
    if (n_threads <= 1) {
        for (size_t u = 0; u < units; u++)
            prepare_all(x, m, k, &a, hi, lo, sums, (int)u);
        panels(w, fmt, n, groups, &a, y, 0, panel_count);
        return 0;
    }
    _Pragma("omp parallel for num_threads(n_threads)")
    for (int u = 0; u < (int)units; u++)
        prepare_all(x, m, k, &a, hi, lo, sums, u);
    BQ_TEAM_SPLIT(panel_count, panels(w, fmt, n, groups, &a, y, begin, end));
    return 0;
}
