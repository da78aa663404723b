/*
 * The small per-layer operators of a decode step, on fp32 activations: RMSNorm (alone and after
 * the residual add), rotate-half RoPE, SiLU(gate) * up and GELU(gate) * up, the KV-cache write
 * by slot, and decode attention read straight from the paged cache through each sequence's
 * block table.
 *
 * Why C: at one token per step each of these is a few hundred to a few thousand flops, and the
 * torch path spends 20-90 us per call in dispatch, temporaries and thread wake-ups (an
 * F.rms_norm of one 576-wide row took ~70 us here). Only attention is ever worth a parallel
 * region, and only once its keys are many: the caller passes the thread count.
 *
 * Plain C with a C ABI, no torch or Python headers, built by pagoda/kernels/cpu/native.py with -fopenmp
 * but linked without libgomp (so the GOMP_* symbols bind to torch's runtime). Every entry point
 * has an AVX2+FMA body for rows whose width is a multiple of 8 and a scalar one for the rest
 * or for CPUs without AVX2; attention also an AVX-512 one (head_dim a multiple of 16); pg_set_isa
 * forces one (tests).
 *
 * KV cache layout: [num_blocks, block_size, kv_heads, head_dim] in fp32, bf16 or fp16 (the
 * dtype code below). Keys and values of a narrow cache are widened block by block into an
 * L1-sized scratch, never gathered whole; the AVX-512 bodies widen them in registers instead,
 * so a bf16 or fp16 cache is read at half fp32's bytes (attention over 32 streams' contexts is
 * bound by reading the cache). Writes round to nearest even, as torch's .to() does.
 */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half_float.h"
#include "vector_math.h"
#include "gated_delta_net.h"
#include "mamba2.h"
#include "short_conv.h"

enum { PG_F32 = 0, PG_BF16 = 1, PG_F16 = 2 };
/* AVX512: attention's scores and value sums in 512-bit registers where head_dim is a multiple
 * of 16 (the other operators keep their AVX2 bodies); its sums are ordered differently from
 * the AVX2 body's, so the two agree to rounding, not bit for bit. */
enum { PG_ISA_SCALAR = 0, PG_ISA_AVX2 = 1, PG_ISA_AVX512 = 2, PG_ISA_BEST = -1 };
/* Keys widened (or scored) at a time: a block of up to this many rows stays in L1. */
#define KEY_CHUNK 32
#define MAX_GROUP 32
#define MAX_HEAD_DIM 256
/* Key splits per (sequence, kv head) when threads share one sequence's keys (flash-decoding). */
#define MAX_SPLITS 16
#define MIN_SPLIT_KEYS 256

static int forced_isa = PG_ISA_BEST;

static int cpu_has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
        && __builtin_cpu_supports("f16c");
}

static int cpu_has_avx512(void)
{
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f");
}

int pg_isa_supported(int isa)
{
    return isa == PG_ISA_SCALAR || (isa == PG_ISA_AVX2 && cpu_has_avx2())
        || (isa == PG_ISA_AVX512 && cpu_has_avx512());
}

int pg_set_isa(int isa)
{
    if (isa != PG_ISA_BEST && !pg_isa_supported(isa))
        return 1;
    forced_isa = isa;
    return 0;
}

static int use_avx2(int width)
{
    static int has = -1;
    if (has < 0)
        has = cpu_has_avx2();
    if (width % 8)
        return 0;
    return forced_isa == PG_ISA_BEST ? has : forced_isa >= PG_ISA_AVX2;
}

static int use_avx512(int width)
{
    static int has = -1;
    if (has < 0)
        has = cpu_has_avx512();
    if (width % 16)
        return 0;
    return forced_isa == PG_ISA_BEST ? has : forced_isa == PG_ISA_AVX512;
}

static size_t dtype_bytes(int dtype) { return dtype == PG_F32 ? 4 : 2; }

static void widen_row(const void *src, int dtype, int n, float *dst)
{
    if (dtype == PG_BF16)
        for (int i = 0; i < n; i++)
            dst[i] = bf16_to_f32(((const uint16_t *)src)[i]);
    else if (dtype == PG_F16)
        for (int i = 0; i < n; i++)
            dst[i] = f16_to_f32(((const uint16_t *)src)[i]);
    else
        memcpy(dst, src, (size_t)n * 4);
}

static void narrow_row(const float *src, int dtype, int n, void *dst)
{
    if (dtype == PG_BF16)
        for (int i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = f32_to_bf16(src[i]);
    else if (dtype == PG_F16)
        for (int i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = f32_to_f16(src[i]);
    else
        memcpy(dst, src, (size_t)n * 4);
}

/* ---- AVX2 helpers ---- */

__attribute__((target("avx2,fma,f16c"))) static void widen_row_avx2(const void *src, int dtype,
                                                                    int n, float *dst)
{
    const uint16_t *h = src;
    for (int i = 0; i < n; i += 8) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(h + i));
        __m256 f = dtype == PG_F16
            ? _mm256_cvtph_ps(raw)
            : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
        _mm256_storeu_ps(dst + i, f);
    }
}

/* ---- RMSNorm ---- */

static void rms_row_scalar(const float *x, const float *w, int d, float eps, float *out)
{
    float ss = 0.0f;
    for (int i = 0; i < d; i++)
        ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = 0; i < d; i++)
        out[i] = x[i] * r * w[i];
}

__attribute__((target("avx2,fma"))) static void rms_row_avx2(const float *x, const float *w,
                                                             int d, float eps, float *out)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= d; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    for (; i < d; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(v, v, a0);
    }
    __m256 r = _mm256_set1_ps(1.0f / sqrtf(hsum8(_mm256_add_ps(a0, a1)) / (float)d + eps));
    for (i = 0; i < d; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), r),
                                                _mm256_loadu_ps(w + i)));
}

static void rms_row(const float *x, const float *w, int d, float eps, float *out)
{
    if (use_avx2(d))
        rms_row_avx2(x, w, d, eps, out);
    else
        rms_row_scalar(x, w, d, eps, out);
}

/* out [n, d] contiguous = rmsnorm(x) * w, x rows x_stride floats apart. */
int pg_rms_norm(const float *x, long x_stride, const float *w, int n, int d, float eps, float *out)
{
    if (n < 0 || d <= 0)
        return 1;
    for (int t = 0; t < n; t++)
        rms_row(x + (size_t)t * x_stride, w, d, eps, out + (size_t)t * d);
    return 0;
}

/* x [n, d] contiguous += residual (rows r_stride apart), then out = rmsnorm(x) * w. */
int pg_add_rms_norm(float *x, const float *residual, long r_stride, const float *w, int n, int d,
                    float eps, float *out)
{
    if (n < 0 || d <= 0)
        return 1;
    for (int t = 0; t < n; t++) {
        float *row = x + (size_t)t * d;
        const float *res = residual + (size_t)t * r_stride;
        for (int i = 0; i < d; i++)
            row[i] += res[i];
        rms_row(row, w, d, eps, out + (size_t)t * d);
    }
    return 0;
}

/* ---- rotate-half RoPE ---- */

/*
 * The first rd dims of each head: out = x * cos + rotate_half(x) * sin_signed over them. x rows
 * x_stride floats apart, heads x_head floats apart; out rows out_stride apart, heads out_head
 * apart; cos and sin_signed [n, rd]. One body for pg_rotary and the layer stack's partial
 * rotary, so both round alike.
 */
__attribute__((noinline)) static void rotate_heads(const float *x, long x_stride, int x_head,
                                                   int n, int heads, int rd, const float *cos,
                                                   const float *sin_signed, float *out,
                                                   long out_stride, int out_head)
{
    int half = rd / 2;
    for (int t = 0; t < n; t++) {
        const float *c = cos + (size_t)t * rd, *s = sin_signed + (size_t)t * rd;
        for (int h = 0; h < heads; h++) {
            const float *xr = x + (size_t)t * x_stride + (size_t)h * x_head;
            float *o = out + (size_t)t * out_stride + (size_t)h * out_head;
            for (int i = 0; i < half; i++) {
                o[i] = xr[i] * c[i] + xr[i + half] * s[i];
                o[i + half] = xr[i + half] * c[i + half] + xr[i] * s[i + half];
            }
        }
    }
}

/*
 * out[t, h, i] = x[t, h, i] * cos[t, i] + x[t, h, (i + half) % hd] * sin_signed[t, i], which is
 * x * cos + rotate_half(x) * sin. x rows (tokens) x_stride floats apart, heads hd apart; cos and
 * sin_signed [n, hd]; out [n, heads, hd] contiguous.
 */
int pg_rotary(const float *x, long x_stride, int n, int heads, int hd, const float *cos,
              const float *sin_signed, float *out)
{
    if (n < 0 || heads <= 0 || hd <= 0 || hd % 2)
        return 1;
    rotate_heads(x, x_stride, hd, n, heads, hd, cos, sin_signed, out, (long)heads * hd, hd);
    return 0;
}

/* ---- SiLU(gate) * up, and GELU(gate) * up below ---- */

__attribute__((target("avx2,fma"))) static void silu_mul_avx2(const float *g, const float *u,
                                                              int m, float *o)
{
    __m256 one = _mm256_set1_ps(1.0f);
    for (int i = 0; i < m; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
}

/* o = x * sigmoid(g) = x * 1 / (1 + e^-g). */
__attribute__((target("avx2,fma"))) static void sigmoid_mul_avx2(const float *x, const float *g,
                                                                 int d, float *o)
{
    __m256 one = _mm256_set1_ps(1.0f);
    for (int i = 0; i < d; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g + i)));
        __m256 sigmoid = _mm256_div_ps(one, _mm256_add_ps(one, e));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sigmoid));
    }
}

/* Elements from which act(gate) * up splits its rows over the OpenMP team (a prefill chunk's; a
 * decode step's few rows stay on one thread, where waking a second costs more than it saves). */
#define GATED_PARALLEL_FROM (1 << 16)

static void silu_mul_scalar(const float *g, const float *u, int m, float *o)
{
    for (int i = 0; i < m; i++)
        o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* act(gate) * up of one row's m gates and m ups into o: an activation's AVX2 or scalar body. */
typedef void (*gated_row_fn)(const float *g, const float *u, int m, float *o);

/* x [n, 2m] rows x_stride apart (gate first, then up) -> out [n, m] contiguous. */
static int gated_rows(const float *x, long x_stride, int n, int m, float *out, gated_row_fn avx2,
                      gated_row_fn scalar)
{
    if (n < 0 || m <= 0)
        return 1;
#pragma omp parallel for schedule(static) if ((long)n * m >= GATED_PARALLEL_FROM)
    for (int t = 0; t < n; t++) {
        const float *g = x + (size_t)t * x_stride;
        (use_avx2(m) ? avx2 : scalar)(g, g + m, m, out + (size_t)t * m);
    }
    return 0;
}

int pg_silu_and_mul(const float *x, long x_stride, int n, int m, float *out)
{
    return gated_rows(x, x_stride, n, m, out, silu_mul_avx2, silu_mul_scalar);
}

/* ---- GELU(gate, tanh approximation) * up: Gemma's GeGLU ---- */

/* 0.5 x (1 + tanh(u)) is x sigmoid(2u) = x / (1 + e^-2u), u = sqrt(2 / pi) (x + 0.044715 x^3):
 * SiLU's shape, so it takes exp8 and its error (a few ulp; torch's tanh is Sleef's, not ours:
 * the two agree to rounding, and the eager CPU path calls this one too, so eager and the layer
 * stack agree bit for bit). */
#define GELU_BETA 0.7978845608028654f
#define GELU_KAPPA 0.044715f

__attribute__((target("avx2,fma"))) static void gelu_tanh_mul_avx2(const float *g, const float *u,
                                                                   int m, float *o)
{
    __m256 one = _mm256_set1_ps(1.0f), minus_two_beta = _mm256_set1_ps(-2.0f * GELU_BETA);
    __m256 kappa = _mm256_set1_ps(GELU_KAPPA);
    for (int i = 0; i < m; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(kappa, x), _mm256_mul_ps(x, x), x);
        __m256 e = exp8(_mm256_mul_ps(minus_two_beta, inner));
        __m256 gelu = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(u + i)));
    }
}

static void gelu_tanh_mul_scalar(const float *g, const float *u, int m, float *o)
{
    for (int i = 0; i < m; i++) {
        float x = g[i], inner = x + GELU_KAPPA * x * x * x;
        o[i] = x / (1.0f + expf(-2.0f * GELU_BETA * inner)) * u[i];
    }
}

int pg_gelu_tanh_and_mul(const float *x, long x_stride, int n, int m, float *out)
{
    return gated_rows(x, x_stride, n, m, out, gelu_tanh_mul_avx2, gelu_tanh_mul_scalar);
}

/* ---- The k largest of each row (a step's logits) ---- */

/* Rows from which the rows split over the OpenMP team (a decode batch's; one row alone stays). */
#define TOP_K_PARALLEL_FROM 2
#define TOP_K_MAX 256
/* Replacements of the kept k a row may take, times k, before the call gives the row up (returns
 * TOP_K_GAVE_UP for the caller to sort instead): a row of logits makes ~k ln(n / k) of them
 * (~240 of 32 in 49152), one in ascending order makes n, each costing a scan of the k. */
#define TOP_K_BUDGET 64
#define TOP_K_GAVE_UP 2

/* a ranks below b: NaN ranks above every number, as in torch.topk. */
static inline int ranks_below(float a, float b)
{
    return !isnan(a) && (isnan(b) || a < b);
}

struct top_k_row {
    float vals[TOP_K_MAX];
    int64_t *idx;
    int k, low;       /* the kept lowest, which a candidate must rank above */
    long budget;      /* replacements left */
};

/* Of equal lowest values the latest in the row goes first, so ties at the k-th place keep the
 * first ones. */
static void find_lowest(struct top_k_row *t)
{
    int low = 0;
    for (int i = 1; i < t->k; i++)
        if (ranks_below(t->vals[i], t->vals[low])
            || (t->vals[i] == t->vals[low] && t->idx[i] > t->idx[low]))
            low = i;
    t->low = low;
}

static inline void offer(struct top_k_row *t, float v, int64_t i)
{
    if (!ranks_below(t->vals[t->low], v))
        return;
    t->vals[t->low] = v;
    t->idx[t->low] = i;
    t->budget--;
    find_lowest(t);
}

/* Elements [from, n) offered 8 at a time: one compare per 8 against the kept lowest (not
 * less-or-equal, so NaN passes), the few that pass one by one. Returns where it stopped. */
__attribute__((target("avx2,fma")))
static int top_k_avx2(const float *x, int from, int n, struct top_k_row *t)
{
    int i = from;
    __m256 bar = _mm256_set1_ps(t->vals[t->low]);
    for (; i + 8 <= n && t->budget > 0; i += 8) {
        int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), bar, _CMP_NLE_UQ));
        if (!hits)
            continue;
        for (; hits; hits &= hits - 1)
            offer(t, x[i + __builtin_ctz(hits)], i + __builtin_ctz(hits));
        bar = _mm256_set1_ps(t->vals[t->low]);
    }
    return i;
}

/* 0, or TOP_K_GAVE_UP where the row spent its budget. */
static int top_k_row(const float *x, int n, int k, int64_t *out)
{
    struct top_k_row t = {.idx = out, .k = k, .budget = (long)TOP_K_BUDGET * k};
    for (int i = 0; i < k; i++) {
        t.vals[i] = x[i];
        out[i] = i;
    }
    find_lowest(&t);
    int i = use_avx2(8) ? top_k_avx2(x, k, n, &t) : k;
    for (; i < n && t.budget > 0; i++)
        offer(&t, x[i], i);
    return i < n ? TOP_K_GAVE_UP : 0;
}

/* x [rows, n] rows x_stride floats apart -> out [rows, k] int64: each row's indices of its k
 * largest values (NaN largest), in no particular order; among equal values at the k-th place,
 * the first ones. k at most TOP_K_MAX and n. Returns 0, 1 for arguments it refuses, or
 * TOP_K_GAVE_UP where some row was too far from a row of logits (see TOP_K_BUDGET). */
int pg_top_k(const float *x, long x_stride, int rows, int n, int k, int64_t *out)
{
    if (rows < 0 || k <= 0 || k > n || k > TOP_K_MAX)
        return 1;
    int gave_up = 0;
#pragma omp parallel for schedule(static) if (rows >= TOP_K_PARALLEL_FROM) \
    reduction(| : gave_up)
    for (int r = 0; r < rows; r++)
        gave_up |= top_k_row(x + (size_t)r * x_stride, n, k, out + (size_t)r * k);
    return gave_up ? TOP_K_GAVE_UP : 0;
}

static int64_t argmax_scalar(const float *x, int n)
{
    int64_t best = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i]))
            return i;
        if (x[i] > x[best])
            best = i;
    }
    return best;
}

/* The first index of x's largest value, or of its first NaN where it has one (torch's argmax:
 * NaN counts as the largest). Two passes: the largest value (NaN seen on the way), then where
 * it first is; a row of logits (192 KB at 49,152) is in L2 for the second. */
__attribute__((target("avx2,fma")))
static int64_t argmax_avx2(const float *x, int n)
{
    __m256 top = _mm256_set1_ps(-INFINITY);
    int i = 0, nan = 0;
    for (; i + 8 <= n && !nan; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        top = _mm256_max_ps(top, v);
    }
    float best = -INFINITY, lanes[8];
    _mm256_storeu_ps(lanes, top);
    for (int j = 0; j < 8; j++)
        best = lanes[j] > best ? lanes[j] : best;
    for (int j = i; j < n && !nan; j++)
        nan = isnan(x[j]);
    if (nan)
        return argmax_scalar(x, n); /* it stops at the first NaN */
    for (int j = i; j < n; j++)
        best = x[j] > best ? x[j] : best;
    __m256 want = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= n; i += 8) {
        int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), want, _CMP_EQ_OQ));
        if (hits)
            return i + __builtin_ctz(hits);
    }
    for (; i < n; i++)
        if (x[i] == best)
            return i;
    return 0; /* every value -inf: the first */
}

/* Rows from which argmax splits them over the team: one row takes ~5 us here. */
#define ARGMAX_PARALLEL_FROM 16

/* x [rows, n], rows x_stride floats apart -> out [rows] int64: each row's argmax as torch
 * gives it (the first of equal largest values; the first NaN where there is one). */
int pg_argmax(const float *x, long x_stride, int rows, int n, int64_t *out)
{
    if (rows < 0 || n <= 0)
        return 1;
    int vector = use_avx2(8);
#pragma omp parallel for schedule(static) if (rows >= ARGMAX_PARALLEL_FROM)
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * x_stride;
        out[r] = vector ? argmax_avx2(row, n) : argmax_scalar(row, n);
    }
    return 0;
}

/* ---- A mixture-of-experts layer's router and its shared expert's gate ---- */

/* Both are fp32 dot products of the layer's input whose rounding decides which experts a token
 * gets: the eager CPU path (pagoda/engine/layers/moe.py) and the layer stack call these same functions,
 * so the two route every row alike, ties included. */
enum { PG_SCORE_SOFTMAX = 0, PG_SCORE_SIGMOID = 1 };
/* moe_gguf.py's MAX_EXPERTS: a row's logits live on the stack. */
#define PG_MAX_EXPERTS 1024

__attribute__((target("avx2,fma"))) static float dot_avx2(const float *x, const float *w, int d)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= d; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(w + i + 8), a1);
    }
    for (; i < d; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
    return hsum8(_mm256_add_ps(a0, a1));
}

static float dot(const float *x, const float *w, int d)
{
    if (use_avx2(d))
        return dot_avx2(x, w, d);
    float sum = 0.0f;
    for (int i = 0; i < d; i++)
        sum += x[i] * w[i];
    return sum;
}

/* The indices of v's k largest values (n at most PG_MAX_EXPERTS), largest first; of equal
 * values the first (an expert's index decides a tie, whichever path runs the layer). */
static void top_k_ids(const float *v, int n, int k, int64_t *ids)
{
    char taken[PG_MAX_EXPERTS] = {0};
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (!taken[e] && (best < 0 || v[e] > v[best] || (isnan(v[e]) && !isnan(v[best]))))
                best = e;
        taken[best] = 1;
        ids[j] = best;
    }
}

/* v[0..n) = softmax(v): minus the largest, e^, divided by their sum in order. */
static void softmax_in_place(float *v, int n)
{
    float top = v[0], sum = 0.0f;
    for (int i = 1; i < n; i++)
        top = v[i] > top ? v[i] : top;
    for (int i = 0; i < n; i++) {
        v[i] = expf(v[i] - top);
        sum += v[i];
    }
    for (int i = 0; i < n; i++)
        v[i] /= sum;
}

/* Rows routed a chunk at a time: their logits [ROUTE_ROWS, num_experts] stay on the caller's
 * stack (64 KB at 1,024 experts), and each router row, read once from memory for the chunk,
 * is dotted with all of its rows from L1. */
#define ROUTE_ROWS 16
/* Router weights (experts x hidden) from which a chunk's logits are split over the team: a
 * Qwen3-30B-A3B layer's 128 x 2048 (1 MB, ~65 us on one thread here) takes both threads;
 * gpt-oss's 32 x 2880 stays on one. */
#define ROUTE_PARALLEL_FROM (1L << 18)

/* logits[t][e] = x_t . router[e] (+ bias[e]) for the chunk's rows: the experts split over
 * the team, each dot the same whichever thread computes it. */
static void route_logits(const float *x, long x_stride, int rows, int hidden,
                         const float *router, const float *bias, int num_experts, float *logits,
                         int threads)
{
    int team = (long)num_experts * hidden >= ROUTE_PARALLEL_FROM && threads > 1 ? threads : 1;
#pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
    for (int e = 0; e < num_experts; e++) {
        const float *w = router + (size_t)e * hidden;
        for (int t = 0; t < rows; t++) {
            float v = dot(x + (size_t)t * x_stride, w, hidden);
            if (bias)
                v += bias[e];
            logits[(size_t)t * num_experts + e] = v;
        }
    }
}

/* One row's ids and weights from its logits v (overwritten): see pg_route. */
static void route_row(float *v, int num_experts, int top_k, int scoring, int renormalize,
                      int softmax_after_top_k, int64_t *id, float *w)
{
    if (!softmax_after_top_k && scoring == PG_SCORE_SOFTMAX)
        softmax_in_place(v, num_experts);
    else if (!softmax_after_top_k)
        for (int e = 0; e < num_experts; e++)
            v[e] = 1.0f / (1.0f + expf(-v[e]));
    top_k_ids(v, num_experts, top_k, id);
    for (int j = 0; j < top_k; j++)
        w[j] = v[id[j]];
    if (softmax_after_top_k) {
        softmax_in_place(w, top_k);
    } else if (renormalize) {
        float sum = 0.0f;
        for (int j = 0; j < top_k; j++)
            sum += w[j];
        for (int j = 0; j < top_k; j++)
            w[j] /= sum;
    }
}

/*
 * Each row of x [m, hidden] (rows x_stride floats apart) routed among num_experts: logits
 * x . router[e] (+ bias[e]); then either (softmax_after_top_k, gpt-oss) the top_k largest logits
 * softmaxed among themselves, or the softmax or sigmoid (scoring) of every logit, its top_k
 * largest kept, renormalised to sum to 1 where asked. ids int64 and weights fp32 [m, top_k],
 * each row's experts best first. A large router's dots run on `threads` (the same bits on any
 * count: each logit is one thread's dot).
 */
int pg_route(const float *x, long x_stride, int m, int hidden, const float *router,
             const float *bias, int num_experts, int top_k, int scoring, int renormalize,
             int softmax_after_top_k, int64_t *ids, float *weights, int threads)
{
    if (m < 0 || hidden <= 0 || num_experts <= 0 || num_experts > PG_MAX_EXPERTS || top_k <= 0
        || top_k > num_experts || scoring < PG_SCORE_SOFTMAX || scoring > PG_SCORE_SIGMOID)
        return 1;
    float logits[ROUTE_ROWS * PG_MAX_EXPERTS];
    for (int t0 = 0; t0 < m; t0 += ROUTE_ROWS) {
        int rows = m - t0 < ROUTE_ROWS ? m - t0 : ROUTE_ROWS;
        route_logits(x + (size_t)t0 * x_stride, x_stride, rows, hidden, router, bias,
                     num_experts, logits, threads);
        for (int t = 0; t < rows; t++)
            route_row(logits + (size_t)t * num_experts, num_experts, top_k, scoring, renormalize,
                      softmax_after_top_k, ids + (size_t)(t0 + t) * top_k,
                      weights + (size_t)(t0 + t) * top_k);
    }
    return 0;
}

/* out [m, hidden] = routed + shared * sigmoid(x . gate), row by row: a shared expert's output
 * (Qwen2-MoE's) behind its gate, added to the routed experts'. x rows x_stride floats apart;
 * routed, shared and out contiguous (out may be either of them). */
int pg_add_sigmoid_gated(const float *routed, const float *shared, const float *x, long x_stride,
                         const float *gate, int m, int hidden, float *out)
{
    if (m < 0 || hidden <= 0)
        return 1;
    for (int t = 0; t < m; t++) {
        float g = 1.0f / (1.0f + expf(-dot(x + (size_t)t * x_stride, gate, hidden)));
        size_t at = (size_t)t * hidden;
        for (int j = 0; j < hidden; j++)
            out[at + j] = routed[at + j] + shared[at + j] * g;
    }
    return 0;
}

/* ---- Gated attention's output gate, and the Gated DeltaNet layer's decode rows ---- */

/* out [n, d] = x * sigmoid(gate), x rows x_stride and gate rows gate_stride floats apart (out
 * contiguous; it may be x where x is): Qwen3-Next's and Qwen3.5's attention output gated per
 * channel. The eager layer and the one-call step both call it, so they round alike. */
int pg_sigmoid_mul(const float *x, long x_stride, const float *gate, long gate_stride, int n,
                   int d, float *out)
{
    if (n < 0 || d <= 0)
        return 1;
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * x_stride, *g = gate + (size_t)t * gate_stride;
        float *o = out + (size_t)t * d;
        if (use_avx2(d))
            sigmoid_mul_avx2(xr, g, d, o);
        else
            for (int i = 0; i < d; i++)
                o[i] = xr[i] * (1.0f / (1.0f + expf(-g[i])));
    }
    return 0;
}

/* gated_delta_net.h's decode rows for the eager layer (pagoda/kernels/cpu/decode_ops.py). */
int pg_gated_delta_decode(const struct pg_delta_net *net, const float *proj, long proj_stride,
                          int m, const int64_t *slots, float *scratch, float *out, int threads)
{
    return delta_net_decode(net, proj, proj_stride, m, slots, scratch, out, threads,
                            use_avx2(8));
}

long pg_gated_delta_scratch_floats(const struct pg_delta_net *net, int m)
{
    return (long)((size_t)m * delta_net_scratch_floats(net));
}

/* mamba2.h's decode rows for the eager layer (pagoda/kernels/cpu/decode_ops.py). */
int pg_mamba2_decode(const struct pg_mamba2 *net, const float *proj, long proj_stride, int m,
                     const int64_t *slots, float *scratch, float *out, int threads)
{
    return mamba2_decode(net, proj, proj_stride, m, slots, scratch, out, threads, use_avx2(8));
}

long pg_mamba2_scratch_floats(const struct pg_mamba2 *net, int m)
{
    return (long)((size_t)m * mamba2_scratch_floats(net));
}

/* short_conv.h's decode rows for the eager layer; scratch: m * channels floats. */
int pg_short_conv_decode(const struct pg_short_conv *conv, const float *proj, long proj_stride,
                         int m, const int64_t *slots, float *scratch, float *out)
{
    return short_conv_decode(conv, proj, proj_stride, m, slots, scratch, out);
}

/* ---- KV-cache write ---- */

/*
 * Token t's keys and values ([kv_heads, hd], heads hd apart, tokens k_stride / v_stride floats
 * apart) go to cache slot slots[t] (block * block_size + offset); a negative slot is padding and
 * writes nothing. The cache rows are kv_heads * hd wide.
 */
int pg_write_kv(const float *k, long k_stride, const float *v, long v_stride, int n, int kv_heads,
                int hd, void *k_cache, void *v_cache, int dtype, long num_slots,
                const int64_t *slots)
{
    if (n < 0 || kv_heads <= 0 || hd <= 0 || dtype < PG_F32 || dtype > PG_F16)
        return 1;
    size_t row = (size_t)kv_heads * hd, bytes = dtype_bytes(dtype);
    for (int t = 0; t < n; t++) {
        if (slots[t] < 0)
            continue;
        if (slots[t] >= num_slots)
            return 2;
        char *kd = (char *)k_cache + (size_t)slots[t] * row * bytes;
        char *vd = (char *)v_cache + (size_t)slots[t] * row * bytes;
        narrow_row(k + (size_t)t * k_stride, dtype, (int)row, kd);
        narrow_row(v + (size_t)t * v_stride, dtype, (int)row, vd);
    }
    return 0;
}

/* ---- paged decode attention ---- */

struct attn_args {
    const float *q;
    long q_stride;
    int heads, kv_heads, hd, dtype, block_size, max_blocks, window;
    const char *k_cache, *v_cache;
    const int64_t *block_tables, *context_lens;
    float scale;
    const float *sinks; /* [heads] logits in the softmax's denominator (gpt-oss), or NULL */
    float *out;
};

/* Row `first` of block `blk`, this kv head's columns, in the cache's dtype; rows are
 * kv_heads * hd elements apart. */
static const char *block_row(const struct attn_args *a, const char *cache, int64_t blk, int kvh,
                             int first)
{
    size_t row = (size_t)a->kv_heads * a->hd;
    return cache + (((size_t)blk * a->block_size + first) * row + (size_t)kvh * a->hd)
                       * dtype_bytes(a->dtype);
}

/* Keys [first, last) of block `blk` as fp32 rows kv_heads * hd apart: straight from an fp32
 * cache, else widened into scratch (this kv head's columns only). Returns the row stride. */
static const float *block_rows(const struct attn_args *a, const char *cache, int64_t blk, int kvh,
                               int first, int last, float *scratch, int avx2, long *stride)
{
    size_t row = (size_t)a->kv_heads * a->hd, bytes = dtype_bytes(a->dtype);
    const char *base = cache + ((size_t)blk * a->block_size * row + (size_t)kvh * a->hd) * bytes;
    if (a->dtype == PG_F32) {
        *stride = (long)row;
        return (const float *)base + (size_t)first * row;
    }
    for (int j = first; j < last; j++) {
        const char *src = base + (size_t)j * row * bytes;
        float *dst = scratch + (size_t)(j - first) * a->hd;
        if (avx2)
            widen_row_avx2(src, a->dtype, a->hd, dst);
        else
            widen_row(src, a->dtype, a->hd, dst);
    }
    *stride = a->hd;
    return scratch;
}

struct softmax_state {
    float m[MAX_GROUP], l[MAX_GROUP];
};

/* Four keys at a time: four independent FMA chains per head instead of one. */
__attribute__((target("avx2,fma"))) static void scores_avx2(const float *q, int group, int hd,
                                                            const float *k, long ks, int len,
                                                            float scale, float *s)
{
    int j = 0;
    for (; j + 4 <= len; j += 4) {
        const float *k0 = k + (size_t)j * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;
        for (int g = 0; g < group; g++) {
            const float *qr = q + (size_t)g * hd;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < hd; i += 8) {
                __m256 qv = _mm256_loadu_ps(qr + i);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
            }
            float *sg = s + g * KEY_CHUNK + j;
            sg[0] = hsum8(a0) * scale;
            sg[1] = hsum8(a1) * scale;
            sg[2] = hsum8(a2) * scale;
            sg[3] = hsum8(a3) * scale;
        }
    }
    for (; j < len; j++) {
        const float *kr = k + (size_t)j * ks;
        for (int g = 0; g < group; g++) {
            const float *qr = q + (size_t)g * hd;
            __m256 a0 = _mm256_setzero_ps();
            for (int i = 0; i < hd; i += 8)
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + i), _mm256_loadu_ps(kr + i), a0);
            s[g * KEY_CHUNK + j] = hsum8(a0) * scale;
        }
    }
}

#define ZMM "avx512f,avx2,fma"

/* The two 8-lane halves of a 16-lane vector added (AVX-512F alone: no extractf32x8). */
__attribute__((target(ZMM), always_inline)) static inline __m256 fold16(__m512 a)
{
    __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return _mm256_add_ps(_mm512_castps512_ps256(a), high);
}

/* Four 16-lane sums as one 4-lane vector: each folded to 8 lanes, then added in pairs. */
__attribute__((target(ZMM), always_inline)) static inline __m128 hsum4x16(__m512 a0, __m512 a1,
                                                                         __m512 a2, __m512 a3)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(fold16(a0), fold16(a1)),
                              _mm256_hadd_ps(fold16(a2), fold16(a3)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* 16 cache elements from element i of a row, as fp32: bf16 and fp16 widened in the register
 * (exactly, as widen_row does), so a narrow cache is read at its own width. */
__attribute__((target(ZMM), always_inline)) static inline __m512 load16(const void *row, int i,
                                                                       int dtype)
{
    if (dtype == PG_F32)
        return _mm512_loadu_ps((const float *)row + i);
    __m256i raw = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (dtype == PG_F16)
        return _mm512_cvtph_ps(raw);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

/* Query heads of a group taken together, up to this many: each piece of a key or value is
 * loaded (and widened, for a narrow cache) once for all of them, not once per head. */
#define HEADS_TOGETHER 4

/* Heads [g0, g0 + G) against keys j .. j + 3 (rows `step` bytes apart from k0): per head
 * the same four accumulators and the same order as one head alone, so the same bits. */
__attribute__((target(ZMM), always_inline)) static inline void
scores_heads_x4(const float *q, int g0, int G, int hd, const char *k0, size_t step, __m128 sv,
                float *s, int j, int dtype)
{
    const char *k1 = k0 + step, *k2 = k1 + step, *k3 = k2 + step;
    __m512 a[HEADS_TOGETHER][4];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < 4; c++)
            a[g][c] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i += 16) {
        __m512 kv0 = load16(k0, i, dtype), kv1 = load16(k1, i, dtype);
        __m512 kv2 = load16(k2, i, dtype), kv3 = load16(k3, i, dtype);
        for (int g = 0; g < G; g++) {
            __m512 qv = _mm512_loadu_ps(q + (size_t)(g0 + g) * hd + i);
            a[g][0] = _mm512_fmadd_ps(qv, kv0, a[g][0]);
            a[g][1] = _mm512_fmadd_ps(qv, kv1, a[g][1]);
            a[g][2] = _mm512_fmadd_ps(qv, kv2, a[g][2]);
            a[g][3] = _mm512_fmadd_ps(qv, kv3, a[g][3]);
        }
    }
    for (int g = 0; g < G; g++)
        _mm_storeu_ps(s + (g0 + g) * KEY_CHUNK + j,
                      _mm_mul_ps(hsum4x16(a[g][0], a[g][1], a[g][2], a[g][3]), sv));
}

/* Calls BODY(G) for each run of up to HEADS_TOGETHER heads of a group, G a constant. */
#define FOR_HEAD_RUNS(group, g0, BODY)                                                      \
    for (int g0 = 0; g0 < (group); g0 += HEADS_TOGETHER) {                                  \
        int left_ = (group) - g0;                                                           \
        if (left_ >= 4) {                                                                   \
            BODY(4);                                                                        \
        } else if (left_ == 3) {                                                            \
            BODY(3);                                                                        \
        } else if (left_ == 2) {                                                            \
            BODY(2);                                                                        \
        } else {                                                                            \
            BODY(1);                                                                        \
        }                                                                                   \
    }

/* As scores_avx2, 16 columns an instruction and four keys' sums reduced together, the keys
 * read in place: rows ks elements apart from k, in the cache's dtype. */
__attribute__((target(ZMM), always_inline)) static inline void
scores_avx512_body(const float *q, int group, int hd, const char *k, long ks, int len,
                   float scale, float *s, int dtype)
{
    size_t step = (size_t)ks * dtype_bytes(dtype);
    int j = 0;
    __m128 sv = _mm_set1_ps(scale);
    for (; j + 4 <= len; j += 4) {
        const char *k0 = k + j * step;
#define SCORES(G) scores_heads_x4(q, g0, G, hd, k0, step, sv, s, j, dtype)
        FOR_HEAD_RUNS(group, g0, SCORES)
#undef SCORES
    }
    for (; j < len; j++) {
        const char *kr = k + j * step;
        for (int g = 0; g < group; g++) {
            const float *qr = q + (size_t)g * hd;
            __m512 a0 = _mm512_setzero_ps();
            for (int i = 0; i < hd; i += 16)
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qr + i), load16(kr, i, dtype), a0);
            s[g * KEY_CHUNK + j] = _mm512_reduce_add_ps(a0) * scale;
        }
    }
}

/* acc[g][i .. i + 63] += sum_j p[g][j] * v[j][i .. i + 63] for heads [g0, g0 + G): the values'
 * four pieces loaded once a key for all G heads; per head the same order as alone. */
__attribute__((target(ZMM), always_inline)) static inline void
accumulate_heads_x64(const float *p, int g0, int G, int hd, const char *v, size_t step, int len,
                     float *acc, int i, int dtype)
{
    __m512 a[HEADS_TOGETHER][4];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < 4; c++)
            a[g][c] = _mm512_loadu_ps(acc + (size_t)(g0 + g) * hd + i + 16 * c);
    for (int j = 0; j < len; j++) {
        const char *vr = v + j * step;
        __m512 v0 = load16(vr, i, dtype), v1 = load16(vr, i + 16, dtype);
        __m512 v2 = load16(vr, i + 32, dtype), v3 = load16(vr, i + 48, dtype);
        for (int g = 0; g < G; g++) {
            __m512 pj = _mm512_set1_ps(p[(g0 + g) * KEY_CHUNK + j]);
            a[g][0] = _mm512_fmadd_ps(pj, v0, a[g][0]);
            a[g][1] = _mm512_fmadd_ps(pj, v1, a[g][1]);
            a[g][2] = _mm512_fmadd_ps(pj, v2, a[g][2]);
            a[g][3] = _mm512_fmadd_ps(pj, v3, a[g][3]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int c = 0; c < 4; c++)
            _mm512_storeu_ps(acc + (size_t)(g0 + g) * hd + i + 16 * c, a[g][c]);
}

/* As accumulate_avx2, the values read in place as the keys are: 64 columns in 4 registers
 * per head while the keys stream past, then 16 at a time. */
__attribute__((target(ZMM), always_inline)) static inline void
accumulate_avx512_body(const float *p, int group, int hd, const char *v, long vs, int len,
                       float *acc, int dtype)
{
    size_t step = (size_t)vs * dtype_bytes(dtype);
    int i = 0;
    for (; i + 64 <= hd; i += 64) {
#define ACCUMULATE(G) accumulate_heads_x64(p, g0, G, hd, v, step, len, acc, i, dtype)
        FOR_HEAD_RUNS(group, g0, ACCUMULATE)
#undef ACCUMULATE
    }
    for (int g = 0; g < group; g++) {
        float *ag = acc + (size_t)g * hd;
        const float *pg = p + g * KEY_CHUNK;
        for (int c = i; c < hd; c += 16) {
            __m512 a = _mm512_loadu_ps(ag + c);
            for (int j = 0; j < len; j++)
                a = _mm512_fmadd_ps(_mm512_set1_ps(pg[j]), load16(v + j * step, c, dtype), a);
            _mm512_storeu_ps(ag + c, a);
        }
    }
}

/* The bodies above, specialised per cache dtype. */
__attribute__((target(ZMM))) static void scores_avx512(const float *q, int group, int hd,
                                                       const char *k, long ks, int len,
                                                       float scale, float *s, int dtype)
{
    if (dtype == PG_F32)
        scores_avx512_body(q, group, hd, k, ks, len, scale, s, PG_F32);
    else if (dtype == PG_BF16)
        scores_avx512_body(q, group, hd, k, ks, len, scale, s, PG_BF16);
    else
        scores_avx512_body(q, group, hd, k, ks, len, scale, s, PG_F16);
}

__attribute__((target(ZMM))) static void accumulate_avx512(const float *p, int group, int hd,
                                                           const char *v, long vs, int len,
                                                           float *acc, int dtype)
{
    if (dtype == PG_F32)
        accumulate_avx512_body(p, group, hd, v, vs, len, acc, PG_F32);
    else if (dtype == PG_BF16)
        accumulate_avx512_body(p, group, hd, v, vs, len, acc, PG_BF16);
    else
        accumulate_avx512_body(p, group, hd, v, vs, len, acc, PG_F16);
}

static void scores_scalar(const float *q, int group, int hd, const float *k, long ks, int len,
                          float scale, float *s)
{
    for (int j = 0; j < len; j++)
        for (int g = 0; g < group; g++) {
            float dot = 0.0f;
            for (int i = 0; i < hd; i++)
                dot += q[(size_t)g * hd + i] * k[(size_t)j * ks + i];
            s[g * KEY_CHUNK + j] = dot * scale;
        }
}

__attribute__((target("avx2,fma"))) static void exp_shifted_avx2(float *s, int len, float m)
{
    int j = 0;
    __m256 mv = _mm256_set1_ps(m);
    for (; j + 8 <= len; j += 8)
        _mm256_storeu_ps(s + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv)));
    for (; j < len; j++)
        s[j] = expf(s[j] - m);
}

/* Online softmax over one chunk of scores s[g][0..len): rescales acc and l, leaves p in s. */
static void softmax_chunk(struct softmax_state *st, float *s, int group, int len, float *acc,
                          int hd, int avx2)
{
    for (int g = 0; g < group; g++) {
        float *sg = s + g * KEY_CHUNK, m = st->m[g];
        for (int j = 0; j < len; j++)
            m = sg[j] > m ? sg[j] : m;
        float correction = expf(st->m[g] - m), l = 0.0f;
        if (avx2)
            exp_shifted_avx2(sg, len, m);
        else
            for (int j = 0; j < len; j++)
                sg[j] = expf(sg[j] - m);
        for (int j = 0; j < len; j++)
            l += sg[j];
        st->l[g] = st->l[g] * correction + l;
        st->m[g] = m;
        if (correction != 1.0f)
            for (int i = 0; i < hd; i++)
                acc[(size_t)g * hd + i] *= correction;
    }
}

/* acc[g] += sum_j p[g][j] * v[j]: 64 columns (8 registers, 8 independent FMA chains) at a
 * time while the keys stream past, then the remaining columns 8 at a time. */
__attribute__((target("avx2,fma"))) static void accumulate_avx2(const float *p, int group, int hd,
                                                                const float *v, long vs, int len,
                                                                float *acc)
{
    for (int g = 0; g < group; g++) {
        float *ag = acc + (size_t)g * hd;
        const float *pg = p + g * KEY_CHUNK;
        int i = 0;
        for (; i + 64 <= hd; i += 64) {
            __m256 a[8];
            for (int r = 0; r < 8; r++)
                a[r] = _mm256_loadu_ps(ag + i + 8 * r);
            for (int j = 0; j < len; j++) {
                __m256 pj = _mm256_set1_ps(pg[j]);
                const float *vr = v + (size_t)j * vs + i;
                for (int r = 0; r < 8; r++)
                    a[r] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8 * r), a[r]);
            }
            for (int r = 0; r < 8; r++)
                _mm256_storeu_ps(ag + i + 8 * r, a[r]);
        }
        for (; i < hd; i += 8) {
            __m256 a = _mm256_loadu_ps(ag + i);
            for (int j = 0; j < len; j++)
                a = _mm256_fmadd_ps(_mm256_set1_ps(pg[j]), _mm256_loadu_ps(v + (size_t)j * vs + i), a);
            _mm256_storeu_ps(ag + i, a);
        }
    }
}

static void accumulate_scalar(const float *p, int group, int hd, const float *v, long vs, int len,
                              float *acc)
{
    for (int g = 0; g < group; g++)
        for (int j = 0; j < len; j++)
            for (int i = 0; i < hd; i++)
                acc[(size_t)g * hd + i] += p[g * KEY_CHUNK + j] * v[(size_t)j * vs + i];
}

/* The keys one sequence attends: [first, ctx). */
static void key_range(const struct attn_args *a, int seq, int64_t *first, int64_t *ctx)
{
    *ctx = a->context_lens[seq];
    *first = a->window > 0 && *ctx > a->window ? *ctx - a->window : 0;
}

/*
 * One sequence's query heads that share kv head kvh, over keys [from, to): the unnormalised
 * output acc [group, hd], and per head the running max m and sum l of the softmax.
 */
/* Keys [off, off + len) of block blk into the running softmax and acc: read in place by the
 * AVX-512 bodies, through fp32 rows (widened into kbuf and vbuf from a narrow cache) by the
 * others. */
static void attend_chunk(const struct attn_args *a, const float *q, int kvh, int64_t blk, int off,
                         int len, struct softmax_state *st, float *s, float *acc, float *kbuf,
                         float *vbuf)
{
    int group = a->heads / a->kv_heads, hd = a->hd, avx2 = use_avx2(hd);
    if (use_avx512(hd)) {
        long row = (long)a->kv_heads * hd;
        scores_avx512(q, group, hd, block_row(a, a->k_cache, blk, kvh, off), row, len, a->scale,
                      s, a->dtype);
        softmax_chunk(st, s, group, len, acc, hd, avx2);
        accumulate_avx512(s, group, hd, block_row(a, a->v_cache, blk, kvh, off), row, len, acc,
                          a->dtype);
        return;
    }
    long ks, vs;
    const float *k = block_rows(a, a->k_cache, blk, kvh, off, off + len, kbuf, avx2, &ks);
    const float *v = block_rows(a, a->v_cache, blk, kvh, off, off + len, vbuf, avx2, &vs);
    if (avx2)
        scores_avx2(q, group, hd, k, ks, len, a->scale, s);
    else
        scores_scalar(q, group, hd, k, ks, len, a->scale, s);
    softmax_chunk(st, s, group, len, acc, hd, avx2);
    if (avx2)
        accumulate_avx2(s, group, hd, v, vs, len, acc);
    else
        accumulate_scalar(s, group, hd, v, vs, len, acc);
}

static void attend_range(const struct attn_args *a, int seq, int kvh, int64_t from, int64_t to,
                         float *acc, float *m_out, float *l_out)
{
    int group = a->heads / a->kv_heads, hd = a->hd;
    const float *q = a->q + (size_t)seq * a->q_stride + (size_t)kvh * group * hd;
    const int64_t *table = a->block_tables + (size_t)seq * a->max_blocks;
    float s[MAX_GROUP * KEY_CHUNK];
    float kbuf[KEY_CHUNK * MAX_HEAD_DIM], vbuf[KEY_CHUNK * MAX_HEAD_DIM];
    struct softmax_state st;
    for (int g = 0; g < group; g++) {
        st.m[g] = -INFINITY;
        st.l[g] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * group * hd);
    for (int64_t pos = from; pos < to;) {
        int off = (int)(pos % a->block_size);
        int len = a->block_size - off;
        if (len > KEY_CHUNK)
            len = KEY_CHUNK;
        if (pos + len > to)
            len = (int)(to - pos);
        attend_chunk(a, q, kvh, table[pos / a->block_size], off, len, &st, s, acc, kbuf, vbuf);
        pos += len;
    }
    memcpy(m_out, st.m, sizeof(float) * group);
    memcpy(l_out, st.l, sizeof(float) * group);
}

/* Output rows of (seq, kvh) from `parts` partial results over consecutive key ranges. */
static void merge_parts(const struct attn_args *a, int seq, int kvh, int parts, const float *acc,
                        const float *m, const float *l)
{
    int group = a->heads / a->kv_heads, hd = a->hd;
    float *o = a->out + (size_t)seq * a->heads * hd + (size_t)kvh * group * hd;
    for (int g = 0; g < group; g++) {
        float most = -INFINITY, total = 0.0f;
        for (int p = 0; p < parts; p++)
            most = m[p * group + g] > most ? m[p * group + g] : most;
        /* A sink is one more part: a single score that weighs no value. */
        float sink = a->sinks ? a->sinks[kvh * group + g] : -INFINITY;
        most = sink > most ? sink : most;
        if (a->sinks)
            total += expf(sink - most);
        float w[MAX_SPLITS];
        for (int p = 0; p < parts; p++) {
            w[p] = l[p * group + g] > 0.0f ? expf(m[p * group + g] - most) : 0.0f;
            total += w[p] * l[p * group + g];
        }
        /* No key at all (an empty context) gives zeros, as SDPA does for a fully masked row. */
        float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (int i = 0; i < hd; i++) {
            float sum = 0.0f;
            for (int p = 0; p < parts; p++)
                sum += w[p] * acc[((size_t)p * group + g) * hd + i];
            o[(size_t)g * hd + i] = sum * inv;
        }
    }
}

/* Work item `it` of n * kv_heads * splits: split `sp` of (seq, kvh)'s keys, its partial results
 * kept at slot it of the scratch arrays. */
static void attend_split(const struct attn_args *a, int it, int splits, float *acc, float *m,
                         float *l)
{
    int group = a->heads / a->kv_heads, sp = it % splits, pair = it / splits;
    int seq = pair / a->kv_heads, kvh = pair % a->kv_heads;
    int64_t first, ctx;
    key_range(a, seq, &first, &ctx);
    int64_t per = (ctx - first + splits - 1) / splits;
    int64_t from = first + sp * per, to = from + per < ctx ? from + per : ctx;
    if (from > to)
        from = to;
    attend_range(a, seq, kvh, from, to, acc + (size_t)it * group * a->hd,
                 m + (size_t)it * group, l + (size_t)it * group);
}

/* Splits per (sequence, kv head): none where there are as many pairs as threads, so a
 * sequence's output has the same bits whatever the thread count and whatever its batch (a
 * split sums its keys in another order); else enough items for every thread twice, each
 * >= MIN_SPLIT_KEYS (one kv head, or more threads than a sequence has kv heads). */
static int choose_splits(int pairs, int threads, int64_t longest)
{
    if (threads <= 1 || pairs >= threads)
        return 1;
    int wanted = (2 * threads + pairs - 1) / pairs;
    int64_t by_length = (longest + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS;
    if (wanted > by_length)
        wanted = (int)by_length;
    if (wanted > MAX_SPLITS)
        wanted = MAX_SPLITS;
    return wanted < 1 ? 1 : wanted;
}

/*
 * n decode queries (one token each; q rows q_stride floats apart, heads hd apart) attend to
 * their sequence's keys 0..context_lens[i]-1 (the last window of them when window > 0) read
 * through block_tables [n, max_blocks] from the caches. out [n, heads * hd] contiguous.
 * Query head h reads kv head h / (heads / kv_heads). sinks: NULL, or [heads] logits each
 * head's softmax adds to its denominator (attention sinks). Work items (sequence, kv head,
 * split of its keys) run on up to `threads` threads: 1 keeps the calling thread alone (and one
 * split).
 */
int pg_decode_attention(const float *q, long q_stride, int n, int heads, int kv_heads, int hd,
                        const void *k_cache, const void *v_cache, int dtype, int num_blocks,
                        int block_size, const int64_t *block_tables, int max_blocks,
                        const int64_t *context_lens, int window, float scale,
                        const float *sinks, float *out, int threads)
{
    if (n < 0 || kv_heads <= 0 || heads % kv_heads || heads / kv_heads > MAX_GROUP || hd <= 0
        || hd > MAX_HEAD_DIM || block_size <= 0 || dtype < PG_F32 || dtype > PG_F16)
        return 1;
    for (int i = 0; i < n; i++) {
        if (context_lens[i] < 0 || context_lens[i] > (int64_t)max_blocks * block_size)
            return 2;
        int64_t used = (context_lens[i] + block_size - 1) / block_size;
        for (int64_t b = 0; b < used; b++)
            if (block_tables[(size_t)i * max_blocks + b] < 0
                || block_tables[(size_t)i * max_blocks + b] >= num_blocks)
                return 3;
    }
    struct attn_args a = {q, q_stride, heads, kv_heads, hd, dtype, block_size, max_blocks, window,
                          k_cache, v_cache, block_tables, context_lens, scale, sinks, out};
    int group = heads / kv_heads, pairs = n * kv_heads;
    int64_t longest = 0;
    for (int i = 0; i < n; i++)
        longest = context_lens[i] > longest ? context_lens[i] : longest;
    int splits = choose_splits(pairs, threads, longest), items = pairs * splits;
    float *acc = malloc(sizeof(float) * (size_t)items * group * (hd + 2));
    if (!acc)
        return 4;
    float *m = acc + (size_t)items * group * hd, *l = m + (size_t)items * group;
    if (threads > items)
        threads = items;
    if (threads <= 1) {
        for (int it = 0; it < items; it++)
            attend_split(&a, it, splits, acc, m, l);
    } else {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int it = 0; it < items; it++)
            attend_split(&a, it, splits, acc, m, l);
    }
    for (int pair = 0; pair < pairs; pair++) {
        size_t at = (size_t)pair * splits;
        merge_parts(&a, pair / kv_heads, pair % kv_heads, splits, acc + at * group * hd,
                    m + at * group, l + at * group);
    }
    free(acc);
    return 0;
}

/* ---- a decode step's whole layer stack in one call ----------------------------------------
 *
 * The layer of pagoda/engine/models/decoder.py (`DecoderForCausalLM.hidden_states`, attention as
 * pagoda/engine/layers/attention.py runs it) for a step whose every row is a decode, with the same
 * operators above in the same order, so its result is the eager path's bit for bit; the
 * linears are the caller's C kernels, reached through function pointers (q4_gemv's
 * q4_linear16 has this signature). What it saves is the Python between the operators: ~10
 * calls per layer at ~10-20 us each against ~300 us of arithmetic per layer at 135M.
 */

/* The linears' kernels, by kind: q4_gemv's q4_linear16 / q4_linear (a repacked weight and its
 * record format) and q8_gemv's q8_linear16 / q8_linear (an int8 weight, its scales, mins and
 * scale format; or Q6_K blocks, format Q6_K, no scales); or parts (weight: an array of
 * `format` linears of these kinds, whose outputs side by side are this one's: a fused QKV whose
 * v projection a Q4_K_M file keeps in Q6_K). */
enum { PG_LINEAR_Q4 = 0, PG_LINEAR_Q8 = 1, PG_LINEAR_PARTS = 2 };
typedef int (*pg_q4_fn)(int isa, const void *w, int compact, int n, int k, const float *x, int m,
                        float *y, void *work, int threads);
typedef int (*pg_q8_fn)(int isa, const void *q, const void *scales, const void *mins, int halves,
                        int n, int k, const float *x, int m, float *y, void *work, int threads);

struct pg_linear {
    const void *fn;
    const void *weight, *scales, *mins; /* q4: the repacked weight only */
    const float *bias;                  /* [n] or NULL */
    int kind, format, n, k;             /* format: q4's record format, q8's halves */
};

enum { PG_SILU = 0, PG_GELU_TANH = 1 };

/* A sparse MLP (pagoda/engine/layers/moe.py's SparseMoE): the router (pg_route's arguments), the routed
 * experts through moe_experts.c's moe_forward (its struct moe_layer, built by
 * pagoda/kernels/cpu/moe_experts.py; its workspace is the step's linear_work, which the caller sized for
 * it), and, where `shared`, a shared expert in the layer's gate_up and down (SiLU), its output
 * times sigmoid(x . shared_gate) where that is not NULL. */
typedef int (*pg_experts_fn)(int isa, const void *layer, const float *x, int m,
                             const int64_t *ids, const float *weights, float *out, void *work,
                             int threads);

struct pg_moe {
    const float *router, *router_bias; /* [num_experts, hidden], [num_experts] or NULL */
    const float *shared_gate;          /* [hidden] or NULL */
    const void *experts_fn, *experts;
    int num_experts, top_k, scoring, renormalize, softmax_after_top_k, shared;
};

/* What sets one layer apart (pagoda/engine/models/architecture.py's AttentionKind and LayerNames):
 * its window (0: every key) and the step's group set made for it, its rotary table (an index
 * into the step's, rotating the first rotary_dim dims of each head; -1: NoPE), per-head q and k
 * norms before RoPE (Qwen3, Gemma 3), norms of the attention's and the MLP's outputs before
 * their residual adds (Gemma's "sandwich"), and the MLP's activation. Absent norms are NULL.
 * output_gate: qkv also gives a gate per query channel after q, k and v, and the attention's
 * output times sigmoid(gate) goes to o (Qwen3-Next, Qwen3.5). A recurrent layer, a Gated
 * DeltaNet (delta_net not NULL), LFM2's short convolution (short_conv not NULL) or a Mamba-2
 * (mamba2 not NULL), mixes in its place: qkv is its in_proj, o its out_proj, and the
 * attention's fields go unread. */
struct pg_layer {
    const float *input_norm, *post_norm;
    const float *q_norm, *k_norm;                     /* [head_dim] */
    const float *attention_out_norm, *mlp_out_norm;   /* [hidden] */
    struct pg_linear qkv, o, gate_up, down;           /* a sparse layer's gate_up and down: its
                                                         shared expert's, where moe->shared */
    void *k_cache, *v_cache;
    const float *sinks;                               /* [heads] (gpt-oss) or NULL */
    const struct pg_moe *moe;                         /* NULL: a dense MLP */
    const struct pg_delta_net *delta_net;             /* NULL: not a Gated DeltaNet */
    const struct pg_short_conv *short_conv;           /* NULL: not a short convolution */
    const struct pg_mamba2 *mamba2;                   /* NULL: not a Mamba-2 */
    int window, group_set, rope, rotary_dim, activation, output_gate;
    int num_blocks; /* of its caches: a KV cache group's pool (windowed layers keep their own) */
};

/* A rotary table's cos and signed sin at the step's positions: [m, its rotary_dim]. */
struct pg_rope {
    const float *cos, *sin_signed;
};

/* Decode rows [start, start + n) of the step, attended with these block tables. A step has one
 * set of num_groups groups per window its layers have, set after set (each window's metadata
 * lists the same rows; their block tables may differ). */
struct pg_group {
    const int64_t *block_tables, *context_lens;
    int start, n, max_blocks, threads;
};

struct pg_step {
    const struct pg_layer *layers;
    const struct pg_group *groups; /* num_group_sets x num_groups */
    const struct pg_rope *ropes;   /* num_ropes */
    const float *hidden_in;  /* [m, hidden]: the step's embeddings */
    const int64_t *const *slots; /* per group set: [m] cache slots in its layers' pool */
    const int64_t *state_slots;  /* [m] each row's slot of the recurrent layers' states */
    float *out;              /* [m, hidden]: the last layer's hidden + residual */
    float *scratch;          /* pg_decode_scratch_floats(...) floats */
    void *linear_work;       /* the largest workspace the linears ask for */
    int num_layers, num_groups, num_group_sets, num_ropes, m, hidden, heads, kv_heads, head_dim;
    int intermediate; /* the widest MLP's: a dense layer's or a shared expert's */
    int top_k;        /* the most experts a sparse layer routes a row to (0: none is sparse) */
    int qkv_width;    /* the widest first linear of a mixer: q, k, v (and a gate), or in_proj */
    int mixed_width;  /* the widest input of o (or out_proj) */
    int recurrent_floats; /* a row's scratch in the recurrent layers (0: none has any) */
    int cache_dtype, block_size, linear_threads;
    float eps, scale;
    float residual_scale; /* each mixer's and MLP's output times this (Granite's; 1: none) */
};

/* Floats before the sparse layers' routing in the scratch, rounded up to whole int64s:
 * residual, hidden and x, the mixer's first linear's output (qkv_width), the rotated q and k,
 * the mixer's output (mixed_width), gate_up and act, and the recurrent layers' own. */
static size_t dense_scratch_floats(int m, int hidden, int heads, int kv_heads, int head_dim,
                                   int intermediate, int qkv_width, int mixed_width,
                                   int recurrent_floats)
{
    size_t qk = (size_t)(heads + kv_heads) * head_dim;
    size_t floats = (size_t)m * (3 * (size_t)hidden + (size_t)qkv_width + qk
                                 + (size_t)mixed_width + 3 * (size_t)intermediate
                                 + (size_t)recurrent_floats);
    return (floats + 1) & ~(size_t)1;
}

/* Beside those, a sparse layer's routed experts' output [m, hidden], each row's expert ids
 * (int64) and weights [m, top_k]. */
long pg_decode_scratch_floats(int m, int hidden, int heads, int kv_heads, int head_dim,
                              int intermediate, int top_k, int qkv_width, int mixed_width,
                              int recurrent_floats)
{
    size_t dense = dense_scratch_floats(m, hidden, heads, kv_heads, head_dim, intermediate,
                                        qkv_width, mixed_width, recurrent_floats);
    return (long)(dense + (top_k ? (size_t)m * (hidden + 3 * (size_t)top_k) : 0));
}

static int run_kernel(const struct pg_step *s, const struct pg_linear *l, const float *x, float *y)
{
    if (l->kind == PG_LINEAR_Q4)
        return ((pg_q4_fn)l->fn)(-1, l->weight, l->format, l->n, l->k, x, s->m, y,
                                 s->linear_work, s->linear_threads);
    if (l->kind == PG_LINEAR_Q8)
        return ((pg_q8_fn)l->fn)(-1, l->weight, l->scales, l->mins, l->format, l->n, l->k, x,
                                 s->m, y, s->linear_work, s->linear_threads);
    return 1;
}

/* Parts side by side: one row's outputs are contiguous, so each part writes its own columns in
 * place; more rows go through a buffer, a part at a time. */
static int run_parts(const struct pg_step *s, const struct pg_linear *l, const float *x, float *y)
{
    const struct pg_linear *parts = (const struct pg_linear *)l->weight;
    float *buffer = NULL;
    if (s->m > 1 && !(buffer = malloc(sizeof(float) * (size_t)s->m * l->n)))
        return 1;
    int rc = 0, at = 0;
    for (int p = 0; p < l->format && !rc; at += parts[p].n, p++) {
        if (parts[p].kind == PG_LINEAR_PARTS || parts[p].k != l->k || at + parts[p].n > l->n) {
            rc = 1;
            break;
        }
        rc = run_kernel(s, &parts[p], x, buffer ? buffer : y + at);
        for (int t = 0; buffer && !rc && t < s->m; t++)
            memcpy(y + (size_t)t * l->n + at, buffer + (size_t)t * parts[p].n,
                   sizeof(float) * parts[p].n);
    }
    free(buffer);
    return rc || at != l->n;
}

static int run_linear(const struct pg_step *s, const struct pg_linear *l, const float *x, float *y)
{
    int rc = l->kind == PG_LINEAR_PARTS ? run_parts(s, l, x, y) : run_kernel(s, l, x, y);
    if (rc)
        return 10;
    if (l->bias)
        for (int t = 0; t < s->m; t++)
            for (int j = 0; j < l->n; j++)
                y[(size_t)t * l->n + j] += l->bias[j];
    return 0;
}

/* The per-head norms of q and k (in place in qkv), then the layer's RoPE over the first
 * rotary_dim dims of each head (the rest copied as they are), or none: q and k into qk. */
static int queries_and_keys(const struct pg_step *s, const struct pg_layer *layer, float *qkv,
                            float *qk)
{
    int hd = s->head_dim, heads = s->heads + s->kv_heads, rd = layer->rotary_dim;
    long qkv_stride = layer->qkv.n, qk_stride = (long)heads * hd;
    for (int t = 0; t < s->m; t++)
        for (int h = 0; h < heads; h++) {
            const float *w = h < s->heads ? layer->q_norm : layer->k_norm;
            float *row = qkv + t * qkv_stride + (long)h * hd;
            if (w)
                rms_row(row, w, hd, s->eps, row);
        }
    if (layer->rope < 0) {
        for (int t = 0; t < s->m; t++)
            memcpy(qk + t * qk_stride, qkv + t * qkv_stride, sizeof(float) * qk_stride);
        return 0;
    }
    if (layer->rope >= s->num_ropes || rd <= 0 || rd > hd || rd % 2)
        return 1;
    const struct pg_rope *rope = &s->ropes[layer->rope];
    rotate_heads(qkv, qkv_stride, hd, s->m, heads, rd, rope->cos, rope->sin_signed, qk, qk_stride,
                 hd);
    for (int t = 0; rd < hd && t < s->m; t++)
        for (int h = 0; h < heads; h++)
            memcpy(qk + t * qk_stride + (long)h * hd + rd, qkv + t * qkv_stride + (long)h * hd + rd,
                   sizeof(float) * (hd - rd));
    return 0;
}

/* x (normed) -> o_proj of the attention (its output gated where the layer has a gate), into
 * y. qkv's rows are q, k, v and the gate, layer->qkv.n floats apart. */
static int attention_block(const struct pg_step *s, const struct pg_layer *layer, const float *x,
                           float *qkv, float *qk, float *attn, float *y)
{
    int hd = s->head_dim, q_width = s->heads * hd, kv_width = s->kv_heads * hd;
    long qkv_stride = layer->qkv.n, qk_stride = q_width + (long)kv_width;
    long gate_at = q_width + 2L * kv_width;
    if (layer->group_set < 0 || layer->group_set >= s->num_group_sets
        || qkv_stride != gate_at + (layer->output_gate ? q_width : 0)
        || qkv_stride > s->qkv_width || q_width > s->mixed_width)
        return 1;
    const struct pg_group *groups = s->groups + (size_t)layer->group_set * s->num_groups;
    int rc = run_linear(s, &layer->qkv, x, qkv);
    if (!rc)
        rc = queries_and_keys(s, layer, qkv, qk);
    if (!rc)
        rc = pg_write_kv(qk + q_width, qk_stride, qkv + q_width + kv_width, qkv_stride, s->m,
                         s->kv_heads, hd, layer->k_cache, layer->v_cache, s->cache_dtype,
                         (long)layer->num_blocks * s->block_size, s->slots[layer->group_set]);
    for (int g = 0; g < s->num_groups && !rc; g++) {
        const struct pg_group *grp = &groups[g];
        rc = pg_decode_attention(qk + (size_t)grp->start * qk_stride, qk_stride, grp->n, s->heads,
                                 s->kv_heads, hd, layer->k_cache, layer->v_cache, s->cache_dtype,
                                 layer->num_blocks, s->block_size, grp->block_tables, grp->max_blocks,
                                 grp->context_lens, layer->window, s->scale, layer->sinks,
                                 attn + (size_t)grp->start * q_width, grp->threads);
    }
    if (!rc && layer->output_gate)
        rc = pg_sigmoid_mul(attn, q_width, qkv + gate_at, qkv_stride, s->m, q_width, attn);
    return rc ? rc : run_linear(s, &layer->o, attn, y);
}

/* x (normed) -> out_proj of the Gated DeltaNet, into y: in_proj into proj, the decode rows
 * into mixed (gated_delta_net.h), each row's states at its state slot. */
static int delta_net_block(const struct pg_step *s, const struct pg_layer *layer, const float *x,
                           float *proj, float *recurrent, float *mixed, float *y)
{
    const struct pg_delta_net *net = layer->delta_net;
    int in_width = delta_net_in_width(net), value_width = net->v_heads * net->v_dim;
    if (!s->state_slots || layer->qkv.n != in_width || in_width > s->qkv_width
        || value_width > s->mixed_width || layer->o.k != value_width
        || delta_net_scratch_floats(net) > (size_t)s->recurrent_floats)
        return 1;
    int rc = run_linear(s, &layer->qkv, x, proj);
    if (!rc)
        rc = delta_net_decode(net, proj, in_width, s->m, s->state_slots, recurrent, mixed,
                              s->linear_threads, use_avx2(8));
    return rc ? rc : run_linear(s, &layer->o, mixed, y);
}

/* The gated MLP of x (normed) into y, with the activation between its two linears. */
static int mlp_block(const struct pg_step *s, const struct pg_layer *layer, const float *x,
                     float *gate_up, float *act, float *y)
{
    int width = layer->down.k;
    if (width > s->intermediate || layer->gate_up.n != 2 * width)
        return 1;
    int rc = run_linear(s, &layer->gate_up, x, gate_up);
    if (!rc && layer->activation == PG_SILU)
        rc = pg_silu_and_mul(gate_up, 2L * width, s->m, width, act);
    else if (!rc && layer->activation == PG_GELU_TANH)
        rc = pg_gelu_tanh_and_mul(gate_up, 2L * width, s->m, width, act);
    else if (!rc)
        rc = 1;
    return rc ? rc : run_linear(s, &layer->down, act, y);
}

/* A sparse MLP of x (normed) into y, as SparseMoE runs it: route, the routed experts' sum, then
 * the shared expert's output (gated) added to it. ids and weights: [m, top_k]; routed:
 * [m, hidden]. */
static int sparse_block(const struct pg_step *s, const struct pg_layer *layer, const float *x,
                        float *gate_up, float *act, int64_t *ids, float *weights, float *routed,
                        float *y)
{
    const struct pg_moe *moe = layer->moe;
    if (moe->top_k > s->top_k)
        return 1;
    int rc = pg_route(x, s->hidden, s->m, s->hidden, moe->router, moe->router_bias,
                      moe->num_experts, moe->top_k, moe->scoring, moe->renormalize,
                      moe->softmax_after_top_k, ids, weights, s->linear_threads);
    float *experts_out = moe->shared ? routed : y;
    if (!rc && ((pg_experts_fn)moe->experts_fn)(-1, moe->experts, x, s->m, ids, weights,
                                                experts_out, s->linear_work, s->linear_threads))
        rc = 11;
    if (rc || !moe->shared)
        return rc;
    rc = mlp_block(s, layer, x, gate_up, act, y);
    if (!rc && moe->shared_gate)
        return pg_add_sigmoid_gated(routed, y, x, s->hidden, moe->shared_gate, s->m, s->hidden, y);
    for (size_t j = 0; !rc && j < (size_t)s->m * s->hidden; j++)
        y[j] = routed[j] + y[j];
    return rc;
}

/* x (normed) -> out_proj of LFM2's short convolution, into y: in_proj into proj, the decode
 * rows into mixed (short_conv.h), each row's window at its state slot. */
static int short_conv_block(const struct pg_step *s, const struct pg_layer *layer,
                            const float *x, float *proj, float *recurrent, float *mixed, float *y)
{
    const struct pg_short_conv *conv = layer->short_conv;
    int ch = conv->channels;
    if (!s->state_slots || layer->qkv.n != 3 * ch || 3 * ch > s->qkv_width
        || ch > s->mixed_width || layer->o.k != ch || ch > s->recurrent_floats)
        return 1;
    int rc = run_linear(s, &layer->qkv, x, proj);
    if (!rc)
        rc = short_conv_decode(conv, proj, 3L * ch, s->m, s->state_slots, recurrent, mixed);
    return rc ? rc : run_linear(s, &layer->o, mixed, y);
}

/* x (normed) -> out_proj of the Mamba-2, into y: in_proj into proj, the decode rows into
 * mixed (mamba2.h), each row's states at its state slot. */
static int mamba2_block(const struct pg_step *s, const struct pg_layer *layer, const float *x,
                        float *proj, float *recurrent, float *mixed, float *y)
{
    const struct pg_mamba2 *net = layer->mamba2;
    int in_width = mamba2_in_width(net), inner = mamba2_inner(net);
    if (!s->state_slots || layer->qkv.n != in_width || in_width > s->qkv_width
        || inner > s->mixed_width || layer->o.k != inner
        || mamba2_scratch_floats(net) > (size_t)s->recurrent_floats)
        return 1;
    int rc = run_linear(s, &layer->qkv, x, proj);
    if (!rc)
        rc = mamba2_decode(net, proj, in_width, s->m, s->state_slots, recurrent, mixed,
                           s->linear_threads, use_avx2(8));
    return rc ? rc : run_linear(s, &layer->o, mixed, y);
}

/* A mixer's or MLP's output [m, hidden] times the model's residual scale, as the eager forward
 * multiplies it (1: nothing to do). */
static void scale_residual(const struct pg_step *s, float *y)
{
    if (s->residual_scale == 1.0f)
        return;
    for (size_t j = 0; j < (size_t)s->m * s->hidden; j++)
        y[j] = y[j] * s->residual_scale;
}

/* Whether every group set lists the step's m rows in order, each group at least one. */
static int groups_cover_rows(const struct pg_step *s)
{
    for (int set = 0; set < s->num_group_sets; set++) {
        const struct pg_group *groups = s->groups + (size_t)set * s->num_groups;
        int covered = 0;
        for (int g = 0; g < s->num_groups; g++) {
            if (groups[g].start != covered || groups[g].n <= 0)
                return 0;
            covered += groups[g].n;
        }
        if (covered != s->m)
            return 0;
    }
    return 1;
}

int pg_decode_layers(const struct pg_step *s)
{
    if (s->m <= 0 || s->num_layers <= 0 || s->num_groups <= 0 || s->num_group_sets <= 0
        || s->hidden <= 0 || !groups_cover_rows(s))
        return 1;
    size_t h = (size_t)s->m * s->hidden;
    int hd = s->head_dim;
    float *residual = s->scratch, *hidden = residual + h, *x = hidden + h;
    float *qkv = x + h, *qk = qkv + (size_t)s->m * s->qkv_width;
    float *attn = qk + (size_t)s->m * (s->heads + s->kv_heads) * hd;
    float *gate_up = attn + (size_t)s->m * s->mixed_width;
    float *act = gate_up + (size_t)s->m * 2 * s->intermediate;
    float *recurrent = act + (size_t)s->m * s->intermediate;
    int64_t *ids = (int64_t *)(s->scratch + dense_scratch_floats(
        s->m, s->hidden, s->heads, s->kv_heads, hd, s->intermediate, s->qkv_width,
        s->mixed_width, s->recurrent_floats));
    float *weights = (float *)(ids + (size_t)s->m * s->top_k);
    float *routed = weights + (size_t)s->m * s->top_k;
    memcpy(residual, s->hidden_in, h * sizeof(float));
    int rc = pg_rms_norm(residual, s->hidden, s->layers[0].input_norm, s->m, s->hidden, s->eps, x);
    for (int i = 0; i < s->num_layers && !rc; i++) {
        const struct pg_layer *layer = &s->layers[i];
        float *swap;
        if (i > 0) {
            /* hidden += residual is the new residual, as add_rms_norm does in place. */
            rc = pg_add_rms_norm(hidden, residual, s->hidden, layer->input_norm, s->m, s->hidden,
                                 s->eps, x);
            swap = residual, residual = hidden, hidden = swap;
        }
        if (!rc && layer->delta_net)
            rc = delta_net_block(s, layer, x, qkv, recurrent, attn, hidden);
        else if (!rc && layer->short_conv)
            rc = short_conv_block(s, layer, x, qkv, recurrent, attn, hidden);
        else if (!rc && layer->mamba2)
            rc = mamba2_block(s, layer, x, qkv, recurrent, attn, hidden);
        else if (!rc)
            rc = attention_block(s, layer, x, qkv, qk, attn, hidden);
        if (!rc)
            scale_residual(s, hidden);
        if (!rc && layer->attention_out_norm)
            rc = pg_rms_norm(hidden, s->hidden, layer->attention_out_norm, s->m, s->hidden,
                             s->eps, hidden);
        if (!rc) {
            rc = pg_add_rms_norm(hidden, residual, s->hidden, layer->post_norm, s->m, s->hidden,
                                 s->eps, x);
            swap = residual, residual = hidden, hidden = swap;
        }
        if (!rc && layer->moe)
            rc = sparse_block(s, layer, x, gate_up, act, ids, weights, routed, hidden);
        else if (!rc)
            rc = mlp_block(s, layer, x, gate_up, act, hidden);
        if (!rc)
            scale_residual(s, hidden);
        if (!rc && layer->mlp_out_norm)
            rc = pg_rms_norm(hidden, s->hidden, layer->mlp_out_norm, s->m, s->hidden, s->eps,
                             hidden);
    }
    for (size_t j = 0; j < h && !rc; j++)
        s->out[j] = hidden[j] + residual[j];
    return rc;
}
