/*
 * A Mamba-2 layer's decode rows between its two linears (pagoda/engine/layers/mamba2.py, Granite
 * 4's "mamba" layers): from in_proj's output [z | x B C | dt] to what out_proj reads. For each
 * row, in the eager layer's order: the short causal conv over x, B and C with the row's carried
 * window (causal_conv.h), its bias, SiLU; dt = softplus(dt + dt_bias) within the layer's limits;
 * the selective state update per head (selective_state.h, with the D skip); then y * SiLU(z)
 * RMS-normed per group of the heads' outputs, times the norm's weight.
 *
 * decode_ops.c runs it both for the eager layer (pg_mamba2_decode) and inside the one-call decode
 * step, so the two agree bit for bit. pagoda/kernels/cpu/native.py keys a build on these headers.
 */
#ifndef PAGODA_MAMBA2_H
#define PAGODA_MAMBA2_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "causal_conv.h"
#include "selective_state.h"
#include "vector_math.h"

struct pg_mamba2 {
    const float *conv_weight, *conv_bias; /* [channels, kernel], [channels] or NULL */
    const float *a, *d, *dt_bias;         /* [heads]: -exp(A_log), the skip D, dt's bias */
    const float *norm;                    /* [heads * head_dim] */
    float *conv_states;                   /* [num_slots, channels, kernel - 1] */
    float *ssm_states;                    /* [num_slots, heads, head_dim, state_size] */
    int64_t num_slots;
    int heads, head_dim, state_size, groups, norm_groups, kernel;
    int dt_limited; /* dt clamped to [dt_min, dt_max] */
    float dt_min, dt_max, eps;
};

static inline int mamba2_inner(const struct pg_mamba2 *n) { return n->heads * n->head_dim; }

static inline int mamba2_channels(const struct pg_mamba2 *n)
{
    return mamba2_inner(n) + 2 * n->groups * n->state_size;
}

/* in_proj's output width: z, the conv's channels, dt. */
static inline int mamba2_in_width(const struct pg_mamba2 *n)
{
    return mamba2_inner(n) + mamba2_channels(n) + n->heads;
}

/* Scratch floats per row: the convolved channels, then dt. */
static inline size_t mamba2_scratch_floats(const struct pg_mamba2 *n)
{
    return (size_t)mamba2_channels(n) + n->heads;
}

static int mamba2_fits(const struct pg_mamba2 *n)
{
    return n->heads > 0 && n->head_dim > 0 && n->state_size > 0 && n->groups > 0
        && n->heads % n->groups == 0 && n->norm_groups > 0
        && mamba2_inner(n) % n->norm_groups == 0 && n->kernel >= 1;
}

/* selective_state_head compiled for AVX2 and FMA, and as the file's default (as
 * gated_delta_net.h's delta rule). */
typedef void (*selective_head_fn)(float *s, const float *x, const float *b, const float *c,
                                  int64_t head_dim, int64_t state_size, float step, float decay,
                                  float skip, float *out);

__attribute__((target("avx2,fma"))) static void selective_head_avx2(
    float *s, const float *x, const float *b, const float *c, int64_t head_dim,
    int64_t state_size, float step, float decay, float skip, float *out)
{
    selective_state_head(s, x, b, c, head_dim, state_size, step, decay, skip, out);
}

static void selective_head_default(float *s, const float *x, const float *b, const float *c,
                                   int64_t head_dim, int64_t state_size, float step,
                                   float decay, float skip, float *out)
{
    selective_state_head(s, x, b, c, head_dim, state_size, step, decay, skip, out);
}

/* The state update for every (row, head) pair, split over `threads`: each pair's state is its
 * own, so the bits do not depend on the count. */
static void selective_rows(const struct pg_mamba2 *n, const float *conv, int m,
                           const int64_t *slots, float *out, int threads, int avx2)
{
    selective_head_fn head_fn = avx2 ? selective_head_avx2 : selective_head_default;
    int64_t pairs = (int64_t)m * n->heads, per_group = n->heads / n->groups;
    size_t channels = mamba2_channels(n), inner = mamba2_inner(n);
    size_t state_floats = (size_t)n->head_dim * n->state_size;
#pragma omp parallel for schedule(static) num_threads(threads) if (pairs > 1 && threads > 1)
    for (int64_t pair = 0; pair < pairs; pair++) {
        int64_t t = pair / n->heads, h = pair % n->heads, g = h / per_group;
        const float *row = conv + (size_t)t * (channels + n->heads);
        const float *b = row + inner + g * n->state_size;
        const float *c = row + inner + (size_t)n->groups * n->state_size + g * n->state_size;
        float step = row[channels + h];
        float *s = n->ssm_states + ((size_t)slots[t] * n->heads + h) * state_floats;
        head_fn(s, row + h * n->head_dim, b, c, n->head_dim, n->state_size, step,
                expf(step * n->a[h]), n->d ? n->d[h] : 0.0f,
                out + (size_t)t * inner + h * n->head_dim);
    }
}

/* y *= SiLU(z), then each of norm_groups groups RMS-normed, times the norm's weight. */
static void mamba2_gated_norm_row(const struct pg_mamba2 *n, const float *z, float *y, int avx2)
{
    int inner = mamba2_inner(n), width = inner / n->norm_groups;
    mul_silu(z, y, inner, avx2);
    for (int g = 0; g < n->norm_groups; g++) {
        float *group = y + (size_t)g * width, ss = 0.0f;
        for (int i = 0; i < width; i++)
            ss += group[i] * group[i];
        float r = 1.0f / sqrtf(ss / (float)width + n->eps);
        for (int i = 0; i < width; i++)
            group[i] = n->norm[g * width + i] * (group[i] * r);
    }
}

/*
 * m decode rows: proj [m, mamba2_in_width] rows proj_stride floats apart -> out [m, heads *
 * head_dim] contiguous, each row's conv window and SSM state (its slot of the tables) advanced
 * in place. scratch: m * mamba2_scratch_floats floats. Returns 0, or 1 where the shapes do not
 * fit or a slot is outside the tables (nothing is written then).
 */
static int mamba2_decode(const struct pg_mamba2 *n, const float *proj, long proj_stride, int m,
                         const int64_t *slots, float *scratch, float *out, int threads, int avx2)
{
    if (m < 0 || !mamba2_fits(n) || proj_stride < mamba2_in_width(n))
        return 1;
    for (int t = 0; t < m; t++)
        if (slots[t] < 0 || slots[t] >= n->num_slots)
            return 1;
    int inner = mamba2_inner(n), channels = mamba2_channels(n), w = n->kernel - 1;
    for (int t = 0; t < m; t++) {
        const float *xbc = proj + (size_t)t * proj_stride + inner, *dt = xbc + channels;
        float *y = scratch + (size_t)t * (channels + n->heads), *step = y + channels;
        causal_conv_row(n->conv_weight, channels, n->kernel, xbc,
                        n->conv_states + (size_t)slots[t] * channels * w, y);
        for (int c = 0; n->conv_bias && c < channels; c++)
            y[c] = y[c] + n->conv_bias[c];
        silu_in_place(y, channels, avx2);
        for (int h = 0; h < n->heads; h++) {
            step[h] = softplus(dt[h] + n->dt_bias[h]);
            if (n->dt_limited)
                step[h] = fminf(fmaxf(step[h], n->dt_min), n->dt_max);
        }
    }
    selective_rows(n, scratch, m, slots, out, threads, avx2);
    for (int t = 0; t < m; t++)
        mamba2_gated_norm_row(n, proj + (size_t)t * proj_stride, out + (size_t)t * inner, avx2);
    return 0;
}

#endif
