/*
 * What moe_experts.c and moe_tiles.c share: one mixture-of-experts layer's experts as
 * pagoda/kernels/cpu/moe_experts.py's ctypes struct fills them, its type and activation codes (the
 * Python side's TYPE_CODES and ACTIVATIONS), and the activation.
 */
#ifndef PAGODA_MOE_LAYER_H
#define PAGODA_MOE_LAYER_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* The weight types, by the code the Python side passes. */
enum { MOE_Q4_0, MOE_Q8_0, MOE_MXFP4, MOE_Q4_K, MOE_Q5_K, MOE_Q6_K, MOE_IQ4_XS, MOE_Q3_K,
       MOE_TYPES };
enum { MOE_SILU = 0, MOE_SWIGLU_OAI = 1 };

/* One layer's experts (pagoda/kernels/cpu/moe_experts.py fills it once). Pointer arrays have
 * num_experts entries: each expert's rows of blocks ([inter, .] for gate and up, [hidden, .]
 * for down) and its bias (NULL arrays: none). */
struct moe_layer {
    int hidden, inter, num_experts, top_k;
    int gate_type, up_type, down_type;
    int activation;
    float limit, alpha; /* MOE_SWIGLU_OAI's */
    const uint8_t *const *gate;
    const uint8_t *const *up;
    const uint8_t *const *down;
    const float *const *gate_bias;
    const float *const *up_bias;
    const float *const *down_bias;
};

/* act(g, u), biases added before: SiLU (silu(g) * u) or gpt-oss's clamped SwiGLU (g at most
 * limit, u in [-limit, limit], (u + 1) * g * sigmoid(alpha g)). */
static inline float moe_activate(const struct moe_layer *layer, float g, float u)
{
    if (layer->activation == MOE_SILU)
        return g / (1.0f + expf(-g)) * u;
    g = fminf(g, layer->limit);
    u = fminf(fmaxf(u, -layer->limit), layer->limit);
    return (u + 1.0f) * (g / (1.0f + expf(-layer->alpha * g)));
}

static inline size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static inline int min_int(int a, int b) { return a < b ? a : b; }

#endif
