/*
 * One token of the short causal depthwise convolution the recurrent layers run before their
 * state update (pagoda/engine/layers/causal_conv.py's step): Gated DeltaNet's (gated_delta_net.h)
 * and LFM2's (short_conv.h), one body so they round alike. pagoda/kernels/cpu/native.py keys a
 * build on these headers too.
 */
#ifndef PAGODA_CAUSAL_CONV_H
#define PAGODA_CAUSAL_CONV_H

#include <stddef.h>

/* One row's channels x through the taps weight [channels, kernel] after its window state
 * [channels, kernel - 1] (oldest first), which then takes x in: y = the taps' sum, no bias. */
static void causal_conv_row(const float *weight, int channels, int kernel, const float *x,
                            float *state, float *y)
{
    int w = kernel - 1;
    for (int c = 0; c < channels; c++) {
        float *window = state + (size_t)c * w;
        const float *taps = weight + (size_t)c * kernel;
        float acc = 0.0f;
        for (int j = 0; j < w; j++)
            acc += window[j] * taps[j];
        y[c] = acc + x[c] * taps[w];
        for (int j = 0; j + 1 < w; j++)
            window[j] = window[j + 1];
        if (w > 0)
            window[w - 1] = x[c];
    }
}

#endif
