/*
 * Mamba-2's one-token update of one (sequence, head) pair's state: one body for the standalone
 * step (recurrent_steps.c's mamba2_step) and the layer's decode step (mamba2.h), each compiled
 * for its own file's instruction set. pagoda/kernels/cpu/native.py keys a build on these headers
 * too.
 */
#ifndef PAGODA_SELECTIVE_STATE_H
#define PAGODA_SELECTIVE_STATE_H

#include <math.h>
#include <stdint.h>

/* Partial sums per row of the state: one running sum would keep the loop from vectorizing. */
#define SELECTIVE_LANES 8

/* s [head_dim, state_size] in place; x and out [head_dim]; b, c [state_size] (the head's
 * group's); step: dt after its bias, softplus and limits; decay = exp(step a); skip: D or 0.
 *   S = S decay + step x B^T; out = S C + skip x                                          */
static inline void selective_state_head(float *restrict s, const float *restrict x,
                                        const float *restrict b, const float *restrict c,
                                        int64_t head_dim, int64_t state_size, float step,
                                        float decay, float skip, float *restrict out)
{
    for (int64_t p = 0; p < head_dim; p++) {
        float *restrict row = s + p * state_size;
        const float input = step * x[p];
        float part[SELECTIVE_LANES] = {0};
        int64_t n = 0;
        for (; n + SELECTIVE_LANES <= state_size; n += SELECTIVE_LANES)
            for (int l = 0; l < SELECTIVE_LANES; l++) {
                row[n + l] = row[n + l] * decay + input * b[n + l];
                part[l] += row[n + l] * c[n + l];
            }
        float acc = 0.0f;
        for (; n < state_size; n++) {
            row[n] = row[n] * decay + input * b[n];
            acc += row[n] * c[n];
        }
        for (int l = 0; l < SELECTIVE_LANES; l++)
            acc += part[l];
        out[p] = acc + skip * x[p];
    }
}

#endif
