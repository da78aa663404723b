/*
 * AVX2 helpers the decode ops share with the recurrent layers' decode steps (gated_delta_net.h,
 * mamba2.h): one body each, so whichever file calls them rounds alike. pagoda/kernels/cpu/native.py keys a
 * build on these headers too.
 */
#ifndef PAGODA_VECTOR_MATH_H
#define PAGODA_VECTOR_MATH_H

#include <immintrin.h>
#include <math.h>

__attribute__((target("avx2,fma"), always_inline)) static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x to ~2 ulp over fp32's range (Cephes' polynomial on x - n ln2, n = round(x / ln2)). */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.37f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* SiLU in place, and x *= SiLU(z): the AVX2 bodies where avx2 and n is a multiple of 8. */
__attribute__((target("avx2,fma"))) static void silu_avx2(float *x, int n)
{
    __m256 one = _mm256_set1_ps(1.0f);
    for (int i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_storeu_ps(x + i, _mm256_div_ps(v, _mm256_add_ps(one, e)));
    }
}

/* x *= SiLU(z), elementwise. */
__attribute__((target("avx2,fma"))) static void mul_silu_avx2(const float *z, float *x, int n)
{
    __m256 one = _mm256_set1_ps(1.0f);
    for (int i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(z + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
        __m256 silu = _mm256_div_ps(v, _mm256_add_ps(one, e));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), silu));
    }
}

static void silu_in_place(float *x, int n, int avx2)
{
    if (avx2 && n % 8 == 0) {
        silu_avx2(x, n);
        return;
    }
    for (int i = 0; i < n; i++)
        x[i] = x[i] / (1.0f + expf(-x[i]));
}

static void mul_silu(const float *z, float *x, int n, int avx2)
{
    if (avx2 && n % 8 == 0) {
        mul_silu_avx2(z, x, n);
        return;
    }
    for (int i = 0; i < n; i++)
        x[i] = x[i] * (z[i] / (1.0f + expf(-z[i])));
}

/* log(1 + e^x), x itself above 20 as torch's softplus. */
static inline float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

#endif
