/*
 * A mixture-of-experts layer's routed experts for a step of many rows (a prefill chunk):
 * moe_experts.c's work, shaped for an expert with tens of rows routed to it.
 *
 * moe_experts.c unpacks each block of 32 weights for every XROWS activation rows, so at ~60
 * rows an expert it unpacks each weight ~15 times, and multiplies signed weights by sign
 * tricks. Here each work item unpacks a tile of TILE_ROWS weight rows of one expert once, into
 * the thread's scratch (an L2-sized stretch), as unsigned bytes (the signed types' values
 * plus an offset), with their scales widened, and then multiplies it with all the expert's rows
 * of the step, XGROUP at a time. The experts' blocks stay read where the file's memory map
 * holds them; nothing is copied beyond the tile.
 *
 * Products (AVX2; integer lanes exact):
 *   K-quants (Q4_K, Q5_K, unsigned 0..15 / 0..31; Q6_K as 0..63 = value + 32; activations
 *   one scale per 256, as block_quant.h's bq_quantize_rows_super8): per block, maddubs(w, x)
 *   then madd by the block's integer scale (Q6_K's: each half's); a super-block's 8 blocks add
 *   up in int32, Q6_K's less 32 sum_h scale_h (sum of q_x over half h) (one madd of its 16
 *   scales by the activations' 16 half sums), then one conversion and fmadd by d s_x, and
 *   - dmin m_j times block j's activation sum (Q4_K, Q5_K).
 *   Blocks of 32 (Q4_0 as 0..15 = value + 8, MXFP4 as 0..24 = level + 12; activations one
 *   scale per 32): per block, maddubs then madd by ones; 8 blocks' lanes summed into one
 *   vector of 8 block sums (hadd), converted, times s_x, less offset * the block's activation
 *   sum (s_x * sum q: w + o against q is w q + o sum q), times each block's d, added.
 * Neither depends on which other rows share the step, nor on the thread count (a row's output
 * is its own products, added in the order of its top-k slots): a row's result is the same
 * in any batch. It is not moe_forward's (another rounding of the same products).
 *
 * The routing comes sorted (moe_tiles.py): order lists the step's (row, slot) pairs as
 * row * top_k + slot, grouped by expert, expert e's at order[begin[e] .. begin[e + 1]).
 *
 * Plain C with a C ABI, AVX2 + FMA + F16C only (the caller keeps moe_forward where this CPU
 * lacks them); OpenMP on torch's team (pagoda/kernels/cpu/native.py).
 */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "block_quant.h"
#include "blocks_of_32.h"
#include "half_float.h"
#include "moe_layer.h"
#include "q4_k_blocks.h"
#include "q5_k_blocks.h"
#include "q6_k_blocks.h"

/* Weight rows a tile holds: gate's and up's 16 are ~105 KB unpacked at 2880 MXFP4 inputs. */
#define TILE_ROWS 16
/* Activation rows one pass over a weight row takes (their accumulators in registers). */
#define XGROUP 4
#define SUPER 256
#define BLOCK 32
#define AVX2 "avx2,fma,f16c"

static int is_super(int type) { return type == MOE_Q4_K || type == MOE_Q5_K || type == MOE_Q6_K; }

static int block_bytes(int type)
{
    switch (type) {
    case MOE_Q4_0: return Q4_0_BYTES;
    case MOE_MXFP4: return MXFP4_BYTES;
    case MOE_Q4_K: return Q4K_BYTES;
    case MOE_Q5_K: return Q5K_BYTES;
    default: return Q6K_BYTES;
    }
}

static int type_read(int type, int k)
{
    int ok = type == MOE_Q4_0 || type == MOE_MXFP4 || is_super(type);
    return ok && k > 0 && k % (is_super(type) ? SUPER : BLOCK) == 0;
}

/* ---- a tile: weight rows unpacked --------------------------------------------------------
 * One row of k values: q, k unsigned bytes; then for a K-quant each block's scale (twice in
 * an int32, as madd multiplies int16 pairs), the super-blocks' d and each block's - dmin m_j; for blocks of 32
 * each block's d (padded with zeros to whole eights). */
struct tile_row_layout {
    size_t scale, halves, d, mins, stride;
};

static struct tile_row_layout row_layout(int type, int k)
{
    struct tile_row_layout l;
    int blocks = k / BLOCK;
    if (is_super(type)) {
        l.scale = (size_t)k;
        l.halves = l.scale + align64((size_t)blocks * (type == MOE_Q6_K ? 32 : 4));
        l.d = l.halves + (type == MOE_Q6_K ? (size_t)(k / SUPER) * 32 : 0);
        l.mins = l.d + align64((size_t)(k / SUPER) * sizeof(float));
        l.stride = align64(l.mins + (size_t)blocks * sizeof(float));
    } else {
        l.scale = l.halves = l.mins = 0;
        l.d = (size_t)k;
        l.stride = align64(l.d + (size_t)((blocks + 7) / 8 * 8) * sizeof(float));
    }
    return l;
}

__attribute__((target(AVX2)))
static void unpack_super_row(int type, const uint8_t *row, int k, uint8_t *t,
                             const struct tile_row_layout *l)
{
    float *d = (float *)(t + l->d), *mins = (float *)(t + l->mins);
    for (int s = 0; s < k / SUPER; s++) {
        const uint8_t *super = row + (size_t)s * block_bytes(type);
        __m256i scales, m;
        q5k_scales_avx2(super, &scales, &m);
        __m256i twice = bq_twice16(scales);
        __m256i qh = type == MOE_Q5_K ? _mm256_loadu_si256((const __m256i *)(super + Q5K_QH_AT))
                                       : _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i v = type == MOE_Q4_K
                ? q4k_block_avx2(super, j)
                : _mm256_or_si256(q4k_block_avx2(super + (Q5K_QS_AT - Q4K_QS_AT), j),
                                  q5k_fifth_bits(qh, j, _mm256_set1_epi8(16)));
            _mm256_storeu_si256((__m256i *)(t + (size_t)s * SUPER + 32 * j), v);
            memcpy(t + l->scale + ((size_t)s * 8 + j) * 4, (const int32_t *)&twice + j, 4);
        }
        d[s] = f16_at_f16c(super);
        _mm256_storeu_ps(mins + s * 8, _mm256_mul_ps(_mm256_cvtepi32_ps(m),
                                                     _mm256_set1_ps(-f16_at_f16c(super + 2))));
    }
}

/* Q6_K as stored, q = value + 32 (0..63); each block's scale vector (its halves' int8 scales,
 * eight int16 lanes each, as madd meets maddubs' lanes) and each super-block's sixteen scales
 * as int16 (the offset's correction: 32 sum_h scale_h sum of q_x over half h). */
__attribute__((target(AVX2)))
static void unpack_q6_k_row(const uint8_t *row, int k, uint8_t *t, const struct tile_row_layout *l)
{
    float *d = (float *)(t + l->d), *mins = (float *)(t + l->mins);
    for (int s = 0; s < k / SUPER; s++) {
        const uint8_t *super = row + (size_t)s * Q6K_BYTES;
        const int8_t *sc = (const int8_t *)(super + Q6K_SCALES_AT);
        for (int j = 0; j < 8; j++) {
            __m256i v = _mm256_add_epi8(q6k_block_avx2(super, j), _mm256_set1_epi8(32));
            _mm256_storeu_si256((__m256i *)(t + (size_t)s * SUPER + 32 * j), v);
            _mm256_storeu_si256((__m256i *)(t + l->scale + ((size_t)s * 8 + j) * 32),
                                _mm256_setr_m128i(_mm_set1_epi16(sc[2 * j]),
                                                  _mm_set1_epi16(sc[2 * j + 1])));
        }
        _mm256_storeu_si256((__m256i *)(t + l->halves + (size_t)s * 32),
                            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
        d[s] = q6k_d_f16c(super);
        _mm256_storeu_ps(mins + s * 8, _mm256_setzero_ps());
    }
}

/* MXFP4's levels plus 12: 0..24. */
static const int8_t mxfp4_levels_up[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                           12, 11, 10, 9, 8, 6, 4, 0};

__attribute__((target(AVX2)))
static void unpack_block32_row(int type, const uint8_t *row, int k, uint8_t *t,
                               const struct tile_row_layout *l)
{
    float *d = (float *)(t + l->d);
    int blocks = k / BLOCK;
    __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mxfp4_levels_up));
    for (int g = 0; g < blocks; g++) {
        const uint8_t *block = row + (size_t)g * block_bytes(type);
        __m256i v;
        if (type == MOE_Q4_0) {
            v = nibbles_avx2(block + 2);
            d[g] = f16_at_f16c(block);
        } else {
            v = _mm256_shuffle_epi8(table, nibbles_avx2(block + 1));
            d[g] = mxfp4_scale(block);
        }
        _mm256_storeu_si256((__m256i *)(t + (size_t)g * BLOCK), v);
    }
    for (int g = blocks; g % 8; g++)
        d[g] = 0.0f;
}

static void unpack_rows(int type, const uint8_t *rows, int n, int k, uint8_t *tile,
                        const struct tile_row_layout *l)
{
    size_t bytes = (size_t)(k / (is_super(type) ? SUPER : BLOCK)) * block_bytes(type);
    for (int r = 0; r < n; r++) {
        if (type == MOE_Q6_K)
            unpack_q6_k_row(rows + r * bytes, k, tile + r * l->stride, l);
        else if (is_super(type))
            unpack_super_row(type, rows + r * bytes, k, tile + r * l->stride, l);
        else
            unpack_block32_row(type, rows + r * bytes, k, tile + r * l->stride, l);
    }
}

/* ---- products: one tile row against up to XGROUP activation rows --------------------------- */

/* Quantized activation rows: values, block scales, block sums (s_x sum q). */
struct xgroup {
    int n;
    const int8_t *q[XGROUP];
    const float *scale[XGROUP];
    const float *sum[XGROUP];
    const int16_t *half[XGROUP]; /* sums of q over each 16 values (K-quant activations) */
};

__attribute__((target(AVX2), always_inline))
static inline void super_dot(const uint8_t *t, const struct tile_row_layout *l, int k,
                             const struct xgroup *x, float *out, const int n, const int q6)
{
    const float *d = (const float *)(t + l->d), *mins = (const float *)(t + l->mins);
    __m256 acc[XGROUP];
    for (int i = 0; i < n; i++)
        acc[i] = _mm256_setzero_ps();
    for (int s = 0; s < k / SUPER; s++) {
        __m256i isum[XGROUP];
        for (int i = 0; i < n; i++)
            isum[i] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {
            size_t at = (size_t)s * SUPER + 32 * j;
            __m256i w = _mm256_loadu_si256((const __m256i *)(t + at));
            __m256i sc;
            if (q6) {
                sc = _mm256_loadu_si256((const __m256i *)(t + l->scale + ((size_t)s * 8 + j) * 32));
            } else {
                int32_t scale2;
                memcpy(&scale2, t + l->scale + ((size_t)s * 8 + j) * 4, 4);
                sc = _mm256_set1_epi32(scale2);
            }
            for (int i = 0; i < n; i++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q[i] + at));
                isum[i] = _mm256_add_epi32(isum[i],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), sc));
            }
        }
        if (q6) { /* less 32 sum_h scale_h sum q_x over h */
            __m256i scales = _mm256_loadu_si256((const __m256i *)(t + l->halves + (size_t)s * 32));
            for (int i = 0; i < n; i++) {
                __m256i halves = _mm256_loadu_si256((const __m256i *)(x->half[i] + s * 16));
                isum[i] = _mm256_sub_epi32(isum[i],
                                           _mm256_slli_epi32(_mm256_madd_epi16(scales, halves), 5));
            }
        }
        __m256 m = _mm256_loadu_ps(mins + s * 8);
        for (int i = 0; i < n; i++) {
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]),
                                     _mm256_set1_ps(d[s] * x->scale[i][s * 8]), acc[i]);
            acc[i] = _mm256_fmadd_ps(m, _mm256_loadu_ps(x->sum[i] + s * 8), acc[i]);
        }
    }
    for (int i = 0; i < n; i++)
        BQ_HSUM256(acc[i], out[i]);
}

/* Eight int32 vectors' lane sums, vector b's in lane b. */
__attribute__((target(AVX2), always_inline))
static inline __m256i lane_sums8(const __m256i p[8])
{
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

/* Blocks [g, g + count) of a tile row against one activation row: the sum of
 * d_b (s_x (w + o) . q - o s_x sum q) over them, in 8 lanes. */
__attribute__((target(AVX2), always_inline))
static inline __m256 block32_group(const uint8_t *t, const float *d, const int8_t *xq,
                                   const float *xs, const float *xsum, __m256 off, int g,
                                   const int count)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p[8];
    for (int b = 0; b < 8; b++) {
        if (b >= count) {
            p[b] = _mm256_setzero_si256();
            continue;
        }
        size_t at = (size_t)(g + b) * BLOCK;
        __m256i w = _mm256_loadu_si256((const __m256i *)(t + at));
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + at));
        p[b] = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
    }
    __m256 scale, sum;
    if (count == 8) {
        scale = _mm256_loadu_ps(xs + g);
        sum = _mm256_loadu_ps(xsum + g);
    } else {
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        scale = _mm256_maskload_ps(xs + g, mask);
        sum = _mm256_maskload_ps(xsum + g, mask);
    }
    __m256 v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(lane_sums8(p)), scale, _mm256_mul_ps(off, sum));
    return _mm256_mul_ps(_mm256_loadu_ps(d + g), v); /* d: zeros past the row */
}

__attribute__((target(AVX2), always_inline))
static inline void block32_dot(const uint8_t *t, const struct tile_row_layout *l, int k,
                               float offset, const struct xgroup *x, float *out, const int n)
{
    const float *d = (const float *)(t + l->d);
    const __m256 off = _mm256_set1_ps(offset);
    int blocks = k / BLOCK, whole = blocks / 8 * 8;
    for (int i = 0; i < n; i++) { /* a row at a time: one accumulator, no chain through memory */
        __m256 acc = _mm256_setzero_ps();
        for (int g = 0; g < whole; g += 8)
            acc = _mm256_add_ps(acc, block32_group(t, d, x->q[i], x->scale[i], x->sum[i], off,
                                                   g, 8));
        if (whole < blocks)
            acc = _mm256_add_ps(acc, block32_group(t, d, x->q[i], x->scale[i], x->sum[i], off,
                                                   whole, blocks - whole));
        BQ_HSUM256(acc, out[i]);
    }
}

/* out[r * XGROUP + i]: tile rows [0, n_rows) against x's rows. */
__attribute__((target(AVX2)))
static void tile_dot(int type, const uint8_t *tile, const struct tile_row_layout *l, int n_rows,
                     int k, const struct xgroup *x, float *out)
{
    float offset = type == MOE_Q4_0 ? 8.0f : 12.0f;
    for (int r = 0; r < n_rows; r++) {
        const uint8_t *t = tile + r * l->stride;
        float *o = out + r * XGROUP;
        if (is_super(type)) {
            int q6 = type == MOE_Q6_K;
            switch (x->n + 4 * q6) {
            case 1: super_dot(t, l, k, x, o, 1, 0); break;
            case 2: super_dot(t, l, k, x, o, 2, 0); break;
            case 3: super_dot(t, l, k, x, o, 3, 0); break;
            case 4: super_dot(t, l, k, x, o, 4, 0); break;
            case 5: super_dot(t, l, k, x, o, 1, 1); break;
            case 6: super_dot(t, l, k, x, o, 2, 1); break;
            case 7: super_dot(t, l, k, x, o, 3, 1); break;
            default: super_dot(t, l, k, x, o, 4, 1); break;
            }
        } else {
            switch (x->n) {
            case 1: block32_dot(t, l, k, offset, x, o, 1); break;
            case 2: block32_dot(t, l, k, offset, x, o, 2); break;
            case 3: block32_dot(t, l, k, offset, x, o, 3); break;
            default: block32_dot(t, l, k, offset, x, o, 4); break;
            }
        }
    }
}

/* ---- the layer ----------------------------------------------------------------------------- */

struct qrows {
    int8_t *q;
    float *scale, *sum;
    int16_t *half; /* [rows, k / 16] */
    int k;
};

/* Quantized rows as carved from the workspace: the values, then the block scales, then the
 * block sums, each 64-byte aligned. */
static size_t qrows_part(int rows, int k, int part)
{
    return align64(part ? (size_t)rows * (k / BLOCK) * sizeof(float) : (size_t)rows * k);
}

/* Values, scales, sums, half sums (as many bytes as the scales). */
static size_t qrows_bytes(int rows, int k) { return qrows_part(rows, k, 0) + 3 * qrows_part(rows, k, 1); }

static struct qrows carve_qrows(char **at, int rows, int k)
{
    size_t values = qrows_part(rows, k, 0), blocks = qrows_part(rows, k, 1);
    struct qrows r = {(int8_t *)*at, (float *)(*at + values), (float *)(*at + values + blocks),
                      (int16_t *)(*at + values + 2 * blocks), k};
    *at += qrows_bytes(rows, k);
    return r;
}

static void quantize_row(int type, const float *v, const struct qrows *r, int row)
{
    size_t b = (size_t)row * (r->k / BLOCK);
    int8_t *q = r->q + (size_t)row * r->k;
    if (is_super(type)) {
        bq_quantize_rows_super8(BQ_ISA_AVX2, v, 1, r->k, q, r->scale + b, r->sum + b);
        int16_t *half = r->half + (size_t)row * (r->k / 16);
        for (int h = 0; h < r->k / 16; h++) {
            int sum = 0;
            for (int e = 0; e < 16; e++)
                sum += q[16 * h + e];
            half[h] = (int16_t)sum;
        }
    } else
        bq_quantize_rows(BQ_ISA_AVX2, 0, v, 1, r->k, q, r->scale + b, r->sum + b);
}

static size_t tile_bytes(const struct moe_layer *layer)
{
    size_t gate = row_layout(layer->gate_type, layer->hidden).stride;
    size_t up = row_layout(layer->up_type, layer->hidden).stride;
    size_t down = row_layout(layer->down_type, layer->inter).stride;
    size_t gate_up = gate + up;
    return TILE_ROWS * (gate_up > down ? gate_up : down);
}

int moe_tiles_supported(const struct moe_layer *l)
{
    return bq_cpu_has(BQ_ISA_AVX2) && l->hidden > 0 && l->inter > 0 && l->num_experts > 0
        && l->top_k > 0 && l->top_k <= l->num_experts
        && type_read(l->gate_type, l->hidden) && type_read(l->up_type, l->hidden)
        && type_read(l->down_type, l->inter) && is_super(l->gate_type) == is_super(l->up_type)
        && (l->activation == MOE_SILU || l->activation == MOE_SWIGLU_OAI)
        && l->gate && l->up && l->down;
}

size_t moe_tiles_workspace_bytes(const struct moe_layer *layer, int m, int n_threads)
{
    size_t pairs = (size_t)m * layer->top_k;
    size_t widest = (size_t)(layer->inter > layer->hidden ? layer->inter : layer->hidden);
    return qrows_bytes(m, layer->hidden) + qrows_bytes((int)pairs, layer->inter)
         + align64(pairs * widest * sizeof(float)) + align64(pairs * sizeof(int))
         + (size_t)(n_threads > 0 ? n_threads : 1) * align64(tile_bytes(layer));
}

/* The routing, and where each pair's rows sit. */
struct routing {
    const int *order, *begin, *place;
    int top_k;
};

/* Activation rows of the places [from, min(end, from + XGROUP)): x's rows of those pairs
 * (by_pair) or the rows at those places. */
static void gather(const struct qrows *r, const struct routing *rt, int by_pair, int from,
                   int end, struct xgroup *x)
{
    x->n = min_int(end - from, XGROUP);
    for (int i = 0; i < x->n; i++) {
        size_t row = by_pair ? (size_t)(rt->order[from + i] / rt->top_k) : (size_t)(from + i);
        x->q[i] = r->q + row * r->k;
        x->scale[i] = r->scale + row * (r->k / BLOCK);
        x->sum[i] = r->sum + row * (r->k / BLOCK);
        x->half[i] = r->half + row * (r->k / 16);
    }
}

/* Intermediate rows [row0, row0 + TILE_ROWS) of expert e for all its pairs into h (by
 * place). */
static void gate_up_tile(const struct moe_layer *layer, const struct qrows *xq,
                         const struct routing *rt, int e, int row0, uint8_t *tile, float *h)
{
    int k = layer->hidden, n_rows = min_int(TILE_ROWS, layer->inter - row0);
    struct tile_row_layout gl = row_layout(layer->gate_type, k);
    struct tile_row_layout ul = row_layout(layer->up_type, k);
    uint8_t *gate_tile = tile, *up_tile = tile + TILE_ROWS * gl.stride;
    size_t gate_bytes = (size_t)(k / (is_super(layer->gate_type) ? SUPER : BLOCK))
                      * block_bytes(layer->gate_type);
    size_t up_bytes = (size_t)(k / (is_super(layer->up_type) ? SUPER : BLOCK))
                    * block_bytes(layer->up_type);
    unpack_rows(layer->gate_type, layer->gate[e] + row0 * gate_bytes, n_rows, k, gate_tile, &gl);
    unpack_rows(layer->up_type, layer->up[e] + row0 * up_bytes, n_rows, k, up_tile, &ul);
    const float *gb = layer->gate_bias ? layer->gate_bias[e] : NULL;
    const float *ub = layer->up_bias ? layer->up_bias[e] : NULL;
    for (int from = rt->begin[e]; from < rt->begin[e + 1]; from += XGROUP) {
        struct xgroup x;
        gather(xq, rt, 1, from, rt->begin[e + 1], &x);
        float g[TILE_ROWS * XGROUP], u[TILE_ROWS * XGROUP];
        tile_dot(layer->gate_type, gate_tile, &gl, n_rows, k, &x, g);
        tile_dot(layer->up_type, up_tile, &ul, n_rows, k, &x, u);
        for (int r = 0; r < n_rows; r++)
            for (int i = 0; i < x.n; i++) {
                int row = row0 + r;
                float gv = g[r * XGROUP + i], uv = u[r * XGROUP + i];
                h[(size_t)(from + i) * layer->inter + row] =
                    moe_activate(layer, gb ? gv + gb[row] : gv, ub ? uv + ub[row] : uv);
            }
    }
}

/* Output rows [row0, row0 + TILE_ROWS) of expert e for all its pairs into y (by place). */
static void down_tile(const struct moe_layer *layer, const struct qrows *hq,
                      const struct routing *rt, int e, int row0, uint8_t *tile, float *y)
{
    int k = layer->inter, n_rows = min_int(TILE_ROWS, layer->hidden - row0);
    struct tile_row_layout l = row_layout(layer->down_type, k);
    size_t bytes = (size_t)(k / (is_super(layer->down_type) ? SUPER : BLOCK))
                 * block_bytes(layer->down_type);
    unpack_rows(layer->down_type, layer->down[e] + row0 * bytes, n_rows, k, tile, &l);
    const float *bias = layer->down_bias ? layer->down_bias[e] : NULL;
    for (int from = rt->begin[e]; from < rt->begin[e + 1]; from += XGROUP) {
        struct xgroup x;
        gather(hq, rt, 0, from, rt->begin[e + 1], &x);
        float ys[TILE_ROWS * XGROUP];
        tile_dot(layer->down_type, tile, &l, n_rows, k, &x, ys);
        for (int r = 0; r < n_rows; r++)
            for (int i = 0; i < x.n; i++) {
                float v = ys[r * XGROUP + i];
                y[(size_t)(from + i) * layer->hidden + row0 + r] = bias ? v + bias[row0 + r] : v;
            }
    }
}

/* Row i's output: its slots' down rows times their router weights, in slot order. */
static void combine_row(const struct moe_layer *layer, const float *weights,
                        const struct routing *rt, const float *y, int i, float *out)
{
    float *o = out + (size_t)i * layer->hidden;
    memset(o, 0, (size_t)layer->hidden * sizeof(float));
    for (int s = 0; s < layer->top_k; s++) {
        int p = i * layer->top_k + s;
        const float *yp = y + (size_t)rt->place[p] * layer->hidden;
        for (int c = 0; c < layer->hidden; c++)
            o[c] += weights[p] * yp[c];
    }
}

/* out [m, hidden] = the layer's routed experts for x [m, hidden] (fp32), weights [m, top_k]
 * (fp32) and the routing (order, begin: module comment; active: the n_active experts with
 * pairs). work: moe_tiles_workspace_bytes(layer, m, n_threads), 64-byte aligned. Returns 0, or
 * -1 for a layer it does not read (moe_tiles_supported) or unaligned work. */
int moe_tiles_forward(const struct moe_layer *layer, const float *x, int m, const int *order,
                      const int *begin, const int *active, int n_active, const float *weights,
                      float *out, void *work, int n_threads)
{
    if (m <= 0 || !moe_tiles_supported(layer) || ((uintptr_t)work & 63))
        return -1;
    n_threads = n_threads > 0 ? n_threads : 1;
    int pairs = m * layer->top_k;
    char *at = work;
    struct qrows xq = carve_qrows(&at, m, layer->hidden);
    struct qrows hq = carve_qrows(&at, pairs, layer->inter);
    int widest = layer->inter > layer->hidden ? layer->inter : layer->hidden;
    float *h = (float *)at, *y = h; /* the intermediate rows, then the pairs' down rows */
    int *place = (int *)(at + align64((size_t)pairs * widest * sizeof(float)));
    uint8_t *tiles = (uint8_t *)place + align64((size_t)pairs * sizeof(int));
    size_t tile_stride = align64(tile_bytes(layer));
    for (int p = 0; p < pairs; p++)
        place[order[p]] = p;
    struct routing rt = {order, begin, place, layer->top_k};
    int tiles_in = (layer->inter + TILE_ROWS - 1) / TILE_ROWS;
    int tiles_out = (layer->hidden + TILE_ROWS - 1) / TILE_ROWS;
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
    {
        uint8_t *tile = tiles + (size_t)omp_get_thread_num() * tile_stride;
#pragma omp for schedule(static)
        for (int i = 0; i < m; i++)
            quantize_row(layer->gate_type, x + (size_t)i * layer->hidden, &xq, i);
#pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < n_active * tiles_in; u++)
            gate_up_tile(layer, &xq, &rt, active[u / tiles_in], (u % tiles_in) * TILE_ROWS,
                         tile, h);
#pragma omp for schedule(static)
        for (int p = 0; p < pairs; p++)
            quantize_row(layer->down_type, h + (size_t)p * layer->inter, &hq, p);
#pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < n_active * tiles_out; u++)
            down_tile(layer, &hq, &rt, active[u / tiles_out], (u % tiles_out) * TILE_ROWS,
                      tile, y);
#pragma omp for schedule(static)
        for (int i = 0; i < m; i++)
            combine_row(layer, weights, &rt, y, i, out);
    }
    return 0;
}
