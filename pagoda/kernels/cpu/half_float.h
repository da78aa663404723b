/*
 * Scalar conversions between fp32 and the two 16-bit floats the engine stores (bf16, fp16),
 * rounding to nearest even as torch's conversions do. Shared by the kernels in pagoda/kernels/cpu/
 * (pagoda/kernels/cpu/native.py keys a build on these headers too).
 */
#ifndef PAGODA_HALF_FLOAT_H
#define PAGODA_HALF_FLOAT_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    } else {
        float f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* An fp16 stored at p (any alignment: a field of a GGUF block), as fp32. */
static inline float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return f16_to_f32(h);
}

/* The same by F16C's conversion, for vector paths: an fp16 subnormal takes f16_to_f32's slow
 * branch. */
__attribute__((target("f16c"), always_inline))
static inline float f16_at_f16c(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return _cvtsh_ss(h);
}

static inline uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    float a = fabsf(f);
    if (a != a)
        return sign | 0x7e00;
    if (a >= 65520.0f)
        return sign | 0x7c00;
    if (a < 6.103515625e-05f) /* subnormal: a multiple of 2^-24, rounded by the FPU (even) */
        return sign | (uint16_t)nearbyintf(a * 16777216.0f);
    memcpy(&u, &a, 4);
    u += 0xfffu + ((u >> 13) & 1u);
    return sign | (uint16_t)(((u >> 23) - 112) << 10 | ((u >> 13) & 0x3ff));
}

#endif
