/*
 * LFM2's gated short convolution's decode rows between its two linears (pagoda/engine/layers/
 * short_conv.py): in_proj's output [B | C | x] -> C * (conv(B * x) + bias), each row's window
 * (its slot of the state table) advanced in place. decode_ops.c runs it both for the eager
 * layer (pg_short_conv_decode) and inside the one-call decode step, so the two agree bit for
 * bit. pagoda/kernels/cpu/native.py keys a build on these headers too.
 */
#ifndef PAGODA_SHORT_CONV_H
#define PAGODA_SHORT_CONV_H

#include <stddef.h>
#include <stdint.h>

#include "causal_conv.h"

struct pg_short_conv {
    const float *weight; /* [channels, kernel] */
    const float *bias;   /* [channels] or NULL */
    float *states;       /* [num_slots, channels, kernel - 1] */
    int64_t num_slots;
    int channels, kernel;
};

/* m decode rows: proj [m, 3 * channels] rows proj_stride floats apart -> out [m, channels]
 * contiguous; scratch: m * channels floats (B * x). Returns 0, or 1 where the shapes do not
 * fit or a slot is outside the table (nothing is written then). */
static int short_conv_decode(const struct pg_short_conv *n, const float *proj, long proj_stride,
                             int m, const int64_t *slots, float *scratch, float *out)
{
    int ch = n->channels, w = n->kernel - 1;
    if (m < 0 || ch <= 0 || n->kernel < 1 || proj_stride < 3L * ch)
        return 1;
    for (int t = 0; t < m; t++)
        if (slots[t] < 0 || slots[t] >= n->num_slots)
            return 1;
    for (int t = 0; t < m; t++) {
        const float *b = proj + (size_t)t * proj_stride, *c = b + ch, *x = c + ch;
        float *bx = scratch + (size_t)t * ch, *y = out + (size_t)t * ch;
        for (int i = 0; i < ch; i++)
            bx[i] = b[i] * x[i];
        causal_conv_row(n->weight, ch, n->kernel, bx, n->states + (size_t)slots[t] * ch * w, y);
        for (int i = 0; n->bias && i < ch; i++)
            y[i] = y[i] + n->bias[i];
        for (int i = 0; i < ch; i++)
            y[i] = c[i] * y[i];
    }
    return 0;
}

#endif
