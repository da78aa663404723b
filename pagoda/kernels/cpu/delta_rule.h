/*
 * Gated DeltaNet's one-token update of one (sequence, value head) pair's state: one body for the
 * standalone step (recurrent_steps.c's gdn_step) and the layer's decode step (gated_delta_net.h),
 * each compiled for its own file's instruction set. pagoda/kernels/cpu/native.py keys a build on
 * these headers too.
 */
#ifndef PAGODA_DELTA_RULE_H
#define PAGODA_DELTA_RULE_H

#include <stdint.h>

/* s [k_dim, v_dim] in place; q, k [k_dim] (q l2-normed and scaled, k l2-normed); v, delta (its
 * scratch) and out [v_dim]; decay = exp(g).
 *   S *= decay; delta = beta * (v - S^T k); S += k delta^T; out = S^T q                   */
static inline void delta_rule_head(float *restrict s, const float *restrict q,
                                   const float *restrict k, const float *restrict v,
                                   int64_t k_dim, int64_t v_dim, float decay, float beta,
                                   float *restrict delta, float *restrict out)
{
    for (int64_t j = 0; j < v_dim; j++)
        delta[j] = 0.0f;
    for (int64_t i = 0; i < k_dim; i++) { /* decay, and S^T k into delta */
        float *restrict row = s + i * v_dim;
        const float ki = k[i];
        for (int64_t j = 0; j < v_dim; j++) {
            row[j] *= decay;
            delta[j] += row[j] * ki;
        }
    }
    for (int64_t j = 0; j < v_dim; j++) {
        delta[j] = beta * (v[j] - delta[j]);
        out[j] = 0.0f;
    }
    for (int64_t i = 0; i < k_dim; i++) { /* the rank-one update, and S^T q */
        float *restrict row = s + i * v_dim;
        const float ki = k[i], qi = q[i];
        for (int64_t j = 0; j < v_dim; j++) {
            row[j] += ki * delta[j];
            out[j] += row[j] * qi;
        }
    }
}

#endif
