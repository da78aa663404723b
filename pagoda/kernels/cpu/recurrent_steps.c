/* The one-token state updates of the recurrent layers, fused: Gated DeltaNet's delta rule and
 * Mamba-2's selective state update. A decode step of a hybrid model reads and writes every
 * sequence's state once per layer (Qwen3.5-9B's widths: 2 MB a Gated DeltaNet layer); torch's
 * elementwise ops walk it six to eight times, these twice (the second walk from cache).
 *
 * Every state is float32, in a table of slots [num_slots, heads, rows, cols]; `slots` picks each
 * batch row's. The work is split over (batch row, head) pairs, each pair's state its own.
 * Returns 0, or -1 where a slot is outside the table (nothing is written then).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "delta_rule.h"
#include "selective_state.h"

static int slots_in_range(const int64_t *slots, int64_t batch, int64_t num_slots) {
    for (int64_t b = 0; b < batch; b++)
        if (slots[b] < 0 || slots[b] >= num_slots) return 0;
    return 1;
}

/* Gated DeltaNet, one token for each of `batch` sequences.
 * state [num_slots, v_heads, k_dim, v_dim]; q, k [batch, k_heads, k_dim] (q already l2-normed
 * and scaled, k l2-normed); v [batch, v_heads, v_dim]; g (log decay) and beta [batch, v_heads];
 * out [batch, v_heads, v_dim]. Value head h reads key head h / (v_heads / k_heads), as
 * transformers orders the heads, or h % k_heads where `tiled` (llama.cpp's converter writes
 * Qwen3-Next's and Qwen3.5's value heads so, tiled over the key heads).
 * The update itself is delta_rule.h's.                                                   */
int gdn_step(float *state, int64_t num_slots, const int64_t *slots, int64_t batch,
             const float *q, const float *k, int64_t k_heads, int64_t k_dim,
             const float *v, int64_t v_heads, int64_t v_dim,
             const float *g, const float *beta, int tiled, float *out) {
    if (!slots_in_range(slots, batch, num_slots) || k_heads <= 0 || v_heads % k_heads) return -1;
    const int64_t group = v_heads / k_heads, pairs = batch * v_heads;
    #pragma omp parallel for schedule(static) if (pairs > 1)
    for (int64_t pair = 0; pair < pairs; pair++) {
        const int64_t b = pair / v_heads, h = pair % v_heads;
        float *restrict s = state + (slots[b] * v_heads + h) * k_dim * v_dim;
        const int64_t kh_index = tiled ? h % k_heads : h / group;
        const float *restrict qh = q + (b * k_heads + kh_index) * k_dim;
        const float *restrict kh = k + (b * k_heads + kh_index) * k_dim;
        const float *restrict vh = v + (b * v_heads + h) * v_dim;
        float *restrict o = out + (b * v_heads + h) * v_dim;
        float delta[v_dim];
        delta_rule_head(s, qh, kh, vh, k_dim, v_dim, expf(g[b * v_heads + h]),
                        beta[b * v_heads + h], delta, o);
    }
    return 0;
}

/* Mamba-2, one token for each of `batch` sequences.
 * state [num_slots, heads, head_dim, state_size]; x [batch, heads, head_dim]; dt [batch, heads]
 * (after its bias, softplus and limits); a [heads] (negative: -exp(A_log)); bm, cm [batch,
 * groups, state_size] (head h reads group h / (heads / groups)); d [heads] or NULL;
 * out [batch, heads, head_dim].
 * The update itself is selective_state.h's.                                          */
int mamba2_step(float *state, int64_t num_slots, const int64_t *slots, int64_t batch,
                const float *x, int64_t heads, int64_t head_dim, const float *dt,
                const float *a, const float *bm, const float *cm, int64_t groups,
                int64_t state_size, const float *d, float *out) {
    if (!slots_in_range(slots, batch, num_slots) || groups <= 0 || heads % groups) return -1;
    const int64_t per_group = heads / groups, pairs = batch * heads;
    #pragma omp parallel for schedule(static) if (pairs > 1)
    for (int64_t pair = 0; pair < pairs; pair++) {
        const int64_t b = pair / heads, h = pair % heads;
        float *restrict s = state + (slots[b] * heads + h) * head_dim * state_size;
        const float *restrict xh = x + (b * heads + h) * head_dim;
        const float *restrict bh = bm + (b * groups + h / per_group) * state_size;
        const float *restrict ch = cm + (b * groups + h / per_group) * state_size;
        float *restrict o = out + (b * heads + h) * head_dim;
        const float step = dt[b * heads + h];
        selective_state_head(s, xh, bh, ch, head_dim, state_size, step, expf(step * a[h]),
                             d ? d[h] : 0.0f, o);
    }
    return 0;
}
