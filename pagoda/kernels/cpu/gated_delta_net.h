/*
 * A Gated DeltaNet layer's decode rows between its two linears (pagoda/engine/layers/
 * gated_delta_net.py): from in_proj's output [q k v | z | b | a] to what out_proj reads. For each
 * row, in the eager layer's order: the short causal conv over q, k, v with the row's carried
 * window (causal_conv.h), SiLU, q and k l2-normed per head (q also scaled by k_dim^-1/2), beta = sigmoid(b) and
 * g = -exp(A_log) softplus(a + dt_bias), the delta rule on the row's state (delta_rule.h), then
 * each value head's output RMS-normed, times the norm's weight and SiLU(z).
 *
 * decode_ops.c runs it both for the eager layer (pg_gated_delta_decode) and inside the one-call
 * decode step, so the two agree bit for bit. Only the delta rule is worth a parallel region (a
 * row's state at Qwen3.5's widths is 2 MB); the rest is a few thousand flops a row.
 */
#ifndef PAGODA_GATED_DELTA_NET_H
#define PAGODA_GATED_DELTA_NET_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "causal_conv.h"
#include "delta_rule.h"
#include "vector_math.h"

/* Inside the square root of q's and k's l2 norm, as the reference's (FLA's) l2norm has it. */
#define DELTA_NET_L2_EPS 1e-6f
/* The widest value head the delta rule's scratch (on the stack) takes. */
#define DELTA_NET_MAX_V_DIM 1024

struct pg_delta_net {
    const float *conv_weight;          /* [channels, kernel] */
    const float *decay_rate, *dt_bias; /* [v_heads]: exp(A_log), and a's bias */
    const float *norm;                 /* [v_dim], shared by the value heads */
    float *conv_states;                /* [num_slots, channels, kernel - 1] */
    float *delta_states;               /* [num_slots, v_heads, k_dim, v_dim] */
    int64_t num_slots;
    int k_heads, v_heads, k_dim, v_dim, kernel;
    int tiled; /* value head h reads key head h % k_heads (else h / (v_heads / k_heads)) */
    float eps;
};

static inline int delta_net_channels(const struct pg_delta_net *n)
{
    return 2 * n->k_heads * n->k_dim + n->v_heads * n->v_dim;
}

/* in_proj's output width: the conv's channels, z, b and a. */
static inline int delta_net_in_width(const struct pg_delta_net *n)
{
    return delta_net_channels(n) + n->v_heads * n->v_dim + 2 * n->v_heads;
}

/* Scratch floats per row: the convolved channels, then g and beta. */
static inline size_t delta_net_scratch_floats(const struct pg_delta_net *n)
{
    return (size_t)delta_net_channels(n) + 2 * (size_t)n->v_heads;
}

static int delta_net_fits(const struct pg_delta_net *n)
{
    return n->k_heads > 0 && n->v_heads % n->k_heads == 0 && n->k_dim > 0 && n->v_dim > 0
        && n->v_dim <= DELTA_NET_MAX_V_DIM && n->kernel >= 1;
}

/* Each of `heads` heads of x [heads, dim] times 1/sqrt(sum x^2 + eps), then times scale. */
static void l2_norm_heads(float *x, int heads, int dim, float scale)
{
    for (int h = 0; h < heads; h++) {
        float *head = x + (size_t)h * dim, ss = 0.0f;
        for (int i = 0; i < dim; i++)
            ss += head[i] * head[i];
        float r = 1.0f / sqrtf(ss + DELTA_NET_L2_EPS);
        for (int i = 0; i < dim; i++)
            head[i] = head[i] * r * scale;
    }
}

/* beta = sigmoid(b), g = -decay_rate softplus(a + dt_bias), per value head. */
static void gates_row(const struct pg_delta_net *n, const float *b, const float *a, float *g,
                      float *beta)
{
    for (int h = 0; h < n->v_heads; h++) {
        beta[h] = 1.0f / (1.0f + expf(-b[h]));
        float x = a[h] + n->dt_bias[h];
        g[h] = -n->decay_rate[h] * softplus(x);
    }
}

/* Each value head of out [v_heads, v_dim] RMS-normed, times the norm's weight, times SiLU(z). */
static void gated_norm_row(const struct pg_delta_net *n, const float *z, float *out, int avx2)
{
    int d = n->v_dim;
    for (int h = 0; h < n->v_heads; h++) {
        float *head = out + (size_t)h * d, ss = 0.0f;
        for (int i = 0; i < d; i++)
            ss += head[i] * head[i];
        float r = 1.0f / sqrtf(ss / (float)d + n->eps);
        for (int i = 0; i < d; i++)
            head[i] = n->norm[i] * (head[i] * r);
    }
    mul_silu(z, out, n->v_heads * d, avx2);
}

/* delta_rule_head compiled twice: for AVX2 and FMA (~2x the x86-64-v2 build's speed on a 128 x
 * 128 head, whose state a decode step walks twice), and as the file's default. */
typedef void (*delta_head_fn)(float *s, const float *q, const float *k, const float *v,
                              int64_t k_dim, int64_t v_dim, float decay, float beta, float *delta,
                              float *out);

__attribute__((target("avx2,fma"))) static void delta_head_avx2(
    float *s, const float *q, const float *k, const float *v, int64_t k_dim, int64_t v_dim,
    float decay, float beta, float *delta, float *out)
{
    delta_rule_head(s, q, k, v, k_dim, v_dim, decay, beta, delta, out);
}

static void delta_head_default(float *s, const float *q, const float *k, const float *v,
                               int64_t k_dim, int64_t v_dim, float decay, float beta,
                               float *delta, float *out)
{
    delta_rule_head(s, q, k, v, k_dim, v_dim, decay, beta, delta, out);
}

/* The delta rule for every (row, value head) pair, split over `threads`: each pair's state is
 * its own, so the bits do not depend on the count. */
static void delta_rule_rows(const struct pg_delta_net *n, const float *conv, const float *gates,
                            int m, const int64_t *slots, float *out, int threads, int avx2)
{
    delta_head_fn head_fn = avx2 ? delta_head_avx2 : delta_head_default;
    int64_t pairs = (int64_t)m * n->v_heads, group = n->v_heads / n->k_heads;
    size_t channels = delta_net_channels(n), key_width = (size_t)n->k_heads * n->k_dim;
    size_t state_floats = (size_t)n->k_dim * n->v_dim;
#pragma omp parallel for schedule(static) num_threads(threads) if (pairs > 1 && threads > 1)
    for (int64_t pair = 0; pair < pairs; pair++) {
        int64_t t = pair / n->v_heads, h = pair % n->v_heads;
        int64_t kh = n->tiled ? h % n->k_heads : h / group;
        const float *row = conv + (size_t)t * channels;
        const float *q = row + kh * n->k_dim, *k = row + key_width + kh * n->k_dim;
        const float *v = row + 2 * key_width + h * n->v_dim;
        const float *g = gates + (size_t)t * 2 * n->v_heads, *beta = g + n->v_heads;
        float *s = n->delta_states + ((size_t)slots[t] * n->v_heads + h) * state_floats;
        float delta[DELTA_NET_MAX_V_DIM];
        head_fn(s, q, k, v, n->k_dim, n->v_dim, expf(g[h]), beta[h], delta,
                out + (size_t)t * n->v_heads * n->v_dim + h * n->v_dim);
    }
}

/*
 * m decode rows: proj [m, delta_net_in_width] rows proj_stride floats apart -> out [m, v_heads *
 * v_dim] contiguous, each row's conv window and delta state (its slot of the tables) advanced
 * in place. scratch: m * delta_net_scratch_floats floats. Returns 0, or 1 where the shapes do
 * not fit or a slot is outside the tables (nothing is written then).
 */
static int delta_net_decode(const struct pg_delta_net *n, const float *proj, long proj_stride,
                            int m, const int64_t *slots, float *scratch, float *out, int threads,
                            int avx2)
{
    if (m < 0 || !delta_net_fits(n) || proj_stride < delta_net_in_width(n))
        return 1;
    for (int t = 0; t < m; t++)
        if (slots[t] < 0 || slots[t] >= n->num_slots)
            return 1;
    int channels = delta_net_channels(n), value_width = n->v_heads * n->v_dim;
    int key_width = n->k_heads * n->k_dim, w = n->kernel - 1;
    float *conv = scratch, *gates = scratch + (size_t)m * channels;
    float q_scale = (float)(1.0 / sqrt((double)n->k_dim)); /* k_dim ** -0.5, as the layer's */
    for (int t = 0; t < m; t++) {
        const float *x = proj + (size_t)t * proj_stride;
        float *y = conv + (size_t)t * channels, *g = gates + (size_t)t * 2 * n->v_heads;
        causal_conv_row(n->conv_weight, channels, n->kernel, x,
                        n->conv_states + (size_t)slots[t] * channels * w, y);
        silu_in_place(y, channels, avx2);
        l2_norm_heads(y, n->k_heads, n->k_dim, q_scale);
        l2_norm_heads(y + key_width, n->k_heads, n->k_dim, 1.0f);
        const float *b = x + channels + value_width;
        gates_row(n, b, b + n->v_heads, g, g + n->v_heads);
    }
    delta_rule_rows(n, conv, gates, m, slots, out, threads, avx2);
    for (int t = 0; t < m; t++)
        gated_norm_row(n, proj + (size_t)t * proj_stride + channels,
                       out + (size_t)t * value_width, avx2);
    return 0;
}

#endif
