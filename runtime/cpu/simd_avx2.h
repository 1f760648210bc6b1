/* simd_avx2.h - small AVX2 pieces shared by the fast GEMM (gemm_avx2.c,
 * gemm_q8.c, gemm_q4.c), the fast attention's kernels
 * (attention/attention_avx2.c) and the expert activation (act_fast.c).  Include
 * only from files whose functions are compiled for AVX2 + FMA + F16C
 * (each function here carries that target itself). */
#pragma once

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runtime/cpu/gemm_fast_impl.h"

/* Fixed order: (lo + hi) halves, then pairs, then the last two. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) float moe_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for x <= 88 (Cephes' expf on 8 lanes): n = round(x log2 e), r = x -
 * n ln 2 in two parts, a degree-5 polynomial on r, times 2^n by the
 * exponent's bits; within 2 ulps of expf.  Lanes under -87.33 (below
 * FLT_MIN, -inf included) give 0, NaN lanes NaN. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) __m256 moe_exp8(__m256 x)
{
    const __m256 xc = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-88.0f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3365478515625f), _CMP_LT_OQ), y);
}

/* The 8 E4M3 bytes in the low half of b as the f16s of their values / 2^8
 * (gemm_fast_impl.h, MOE_FP8_F16_MASK), ready for F16C.  nan: the NaN
 * bytes (0x7F, 0xFF) too, as f16 NaNs: the trick alone reads them as
 * +-480 (exponent 1111, mantissa 111: bits 7-13 all set), and adding 2^7
 * carries into bit 14 exactly for those, which then sets the f16
 * exponent's top bit (0x7F80: a NaN); every other byte leaves bit 14 clear. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) __m128i moe_e4m3x8_half(__m128i b, int nan)
{
    const __m128i t = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16(MOE_FP8_F16_MASK));
    if (!nan) return t;
    return _mm_or_si128(t, _mm_and_si128(_mm_add_epi16(t, _mm_set1_epi16(0x80)), _mm_set1_epi16(0x4000)));
}

/* The input row x (nb blocks of 32) as int8 codes q (nb * 32) and scales d
 * (nb), for the kernels over Q8_0 and four-bit weights: per block amax =
 * max |x|, d = amax / 127, q = x * (127 / amax) rounded to nearest even
 * (all zero when amax is below 127 FLT_MIN, about 1.5e-36, where 127 /
 * amax could overflow), so q is in [-127, 127] and |x - q d|
 * <= d / 2 (plus an ulp); a block holding a NaN or an infinity gets d =
 * NaN and zero codes. */
static inline __attribute__((target("avx2,fma,f16c"))) void moe_quantize_x_q8(int8_t *q, float *d, const float *x,
                                                                               int nb)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    /* packs work within 128-bit halves: this puts the 4-byte groups back
     * in element order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < nb; b++) {
        const float *xb = x + (size_t)b * 32;
        __m256 v[4], m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            const __m256 a = _mm256_and_ps(v[i], absmask);
            m = _mm256_max_ps(m, a);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ)); /* NaN or inf */
        }
        int8_t *qb = q + (size_t)b * 32;
        if (!_mm256_testz_ps(bad, bad)) {
            d[b] = NAN;
            memset(qb, 0, 32);
            continue;
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        d[b] = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(amax >= 127.0f * FLT_MIN ? 127.0f / amax : 0.0f);
        __m256i i[4];
        for (int j = 0; j < 4; j++) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256((__m256i *)qb, _mm256_permutevar8x32_epi32(p, order));
    }
}
