/* act_fast.c - the expert activation (experts/experts.h, moe_experts_act)
 * over a row on 8 lanes, for the fast expert phase: silu(g) * u, or
 * gpt-oss's clamped g' sigmoid(alpha g') (u' + 1).
 *
 * e = e^a, a = -g (or -alpha g'), by moe_exp8 (simd_avx2.h: within 2 ulps
 * of expf, for a <= 88), and past a = 87 as e^(a/2) squared (within 5
 * ulps, infinite where expf's is), then the reference's IEEE quotient and
 * product.  Every element takes the same
 * vector path (the tail by masks), so its value depends on its own g and
 * u alone, and the AVX2 and AVX-512 sets give the same bits. */
#include <immintrin.h>

#include "runtime/cpu/gemm_fast.h"
#include "runtime/cpu/simd_avx2.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* e^a for any a: moe_exp8 up to 87, e^(a/2) squared past it (computed
 * only when a lane is past it). */
static inline __attribute__((always_inline)) AVX2 __m256 exp_any(__m256 a)
{
    const __m256 e = moe_exp8(a), big = _mm256_cmp_ps(a, _mm256_set1_ps(87.0f), _CMP_GT_OQ);
    if (_mm256_testz_ps(big, big)) return e;
    const __m256 h = moe_exp8(_mm256_mul_ps(a, _mm256_set1_ps(0.5f)));
    return _mm256_blendv_ps(e, _mm256_mul_ps(h, h), big);
}

AVX2 void moe_act_row_avx2(float *g, const float *u, int n, float alpha, float limit)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int i = 0; i < n; i += 8) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), lane);
        __m256 gv = _mm256_maskload_ps(g + i, m), uv = _mm256_maskload_ps(u + i, m), y;
        if (limit > 0) {
            /* min/max return their second operand where one is NaN: a NaN g or u stays NaN */
            const __m256 L = _mm256_set1_ps(limit);
            gv = _mm256_min_ps(L, gv);
            uv = _mm256_max_ps(_mm256_set1_ps(-limit), _mm256_min_ps(L, uv));
            const __m256 a = _mm256_mul_ps(_mm256_set1_ps(-alpha), gv);
            y = _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, exp_any(a))), _mm256_add_ps(uv, one));
        } else {
            const __m256 a = _mm256_sub_ps(_mm256_setzero_ps(), gv);
            y = _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, exp_any(a))), uv);
        }
        _mm256_maskstore_ps(g + i, m, y);
    }
}
