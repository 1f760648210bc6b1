/* q6_k.c - the Q6_K format's quantizer (MOE_DTYPE_Q6_K, tensor.h): the
 * fit of each block is q6_k_fit.h's, shared with the CUDA backend; here
 * its sub-block sums in SSE2 registers where the compiler has them (the
 * same operations in the same order as the header's plain C, so the bytes
 * do not depend on which), the packing of the rows, and the choice of the
 * AVX2 block quantizer (q6_k_avx2.c, the same bytes) where the processor
 * has AVX2. */
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <math.h>
#include <string.h>

#include "runtime/core/q4_k_impl.h"
#include "runtime/core/q6_k_impl.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

#if defined(__SSE2__)
static inline void sums_sse2(const float *x, float is, float *sxq, float *sqq);
static inline float error_sse2(const float *x, float S);
static inline void nearest_sse2(const float *x, float S, uint8_t *q);
#define Q6K_SUMS sums_sse2
#define Q6K_ERROR error_sse2
#define Q6K_NEAREST nearest_sse2
#endif
#include "runtime/core/q6_k_fit.h"

#if defined(__SSE2__)
static inline __m128 round_near4(__m128 v)
{
    const __m128 m = _mm_set1_ps(12582912.0f);
    return _mm_sub_ps(_mm_add_ps(v, m), m);
}
static inline __m128 clamp_code4(__m128 v)
{
    return _mm_min_ps(_mm_max_ps(v, _mm_set1_ps(-32.0f)), _mm_set1_ps(31.0f));
}
static inline float sum4(__m128 v)
{
    float l[4];
    _mm_storeu_ps(l, v);
    return (l[0] + l[2]) + (l[1] + l[3]);
}

/* q6k_sums_c in 4 lanes */
static inline void sums_sse2(const float *x, float is, float *sxq, float *sqq)
{
    __m128 p = _mm_setzero_ps(), r = _mm_setzero_ps();
    for (int i = 0; i < Q6K_SUB; i += 4) {
        const __m128 xv = _mm_loadu_ps(x + i), q = clamp_code4(round_near4(_mm_mul_ps(xv, _mm_set1_ps(is))));
        p = _mm_add_ps(p, _mm_mul_ps(xv, q));
        r = _mm_add_ps(r, _mm_mul_ps(q, q));
    }
    *sxq = sum4(p);
    *sqq = sum4(r);
}

/* q6k_error_c in 4 lanes */
static inline float error_sse2(const float *x, float S)
{
    const float is = 1.0f / S;
    __m128 e = _mm_setzero_ps();
    for (int i = 0; i < Q6K_SUB; i += 4) {
        const __m128 xv = _mm_loadu_ps(x + i), q = clamp_code4(round_near4(_mm_mul_ps(xv, _mm_set1_ps(is))));
        const __m128 r = _mm_sub_ps(xv, _mm_mul_ps(_mm_set1_ps(S), q));
        e = _mm_add_ps(e, _mm_mul_ps(r, r));
    }
    return sum4(e);
}

/* q6k_nearest_c, 4 values at a time */
static inline void nearest_sse2(const float *x, float S, uint8_t *q)
{
    if (S == 0.0f) {
        memset(q, 32, Q6K_SUB);
        return;
    }
    for (int i = 0; i < Q6K_SUB; i += 4) {
        const __m128 xv = _mm_loadu_ps(x + i), sv = _mm_set1_ps(S), one = _mm_set1_ps(1.0f);
        const __m128 absm = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff)), inf = _mm_set1_ps(INFINITY);
        const __m128 k = clamp_code4(round_near4(_mm_div_ps(xv, sv)));
        const __m128 km = _mm_sub_ps(k, one), kp = _mm_add_ps(k, one);
        const __m128 e0 = _mm_and_ps(_mm_sub_ps(xv, _mm_mul_ps(sv, k)), absm);
        const __m128 vm = _mm_cmpge_ps(km, _mm_set1_ps(-32.0f)), vp = _mm_cmple_ps(kp, _mm_set1_ps(31.0f));
        const __m128 em = _mm_or_ps(_mm_and_ps(vm, _mm_and_ps(_mm_sub_ps(xv, _mm_mul_ps(sv, km)), absm)),
                                    _mm_andnot_ps(vm, inf));
        const __m128 ep = _mm_or_ps(_mm_and_ps(vp, _mm_and_ps(_mm_sub_ps(xv, _mm_mul_ps(sv, kp)), absm)),
                                    _mm_andnot_ps(vp, inf));
        const __m128 lm = _mm_cmplt_ps(em, e0);
        __m128 c = _mm_or_ps(_mm_and_ps(lm, km), _mm_andnot_ps(lm, k));
        const __m128 ec = _mm_or_ps(_mm_and_ps(lm, em), _mm_andnot_ps(lm, e0));
        const __m128 lp = _mm_cmplt_ps(ep, ec);
        c = _mm_or_ps(_mm_and_ps(lp, kp), _mm_andnot_ps(lp, c));
        int32_t ci[4];
        _mm_storeu_si128((__m128i *)ci, _mm_cvttps_epi32(c));
        for (int l = 0; l < 4; l++) q[i + l] = (uint8_t)(ci[l] + 32);
    }
}
#endif

bool moe_q6_k_block_portable(const float *x, int8_t sc[16], uint16_t *dh, uint8_t q[256])
{
    return q6k_block(x, sc, dh, q);
}

bool moe_q6_k_quantize_row_with(moe_q6_k_block_fn block, void *dst, const float *src, size_t n)
{
    unsigned char *b = dst;
    MOE_ASSERT(n % MOE_Q6_K_BLOCK == 0);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(src[i])) return false;
    for (size_t o = 0; o < n; o += MOE_Q6_K_BLOCK, b += MOE_Q6_K_BYTES) {
        int8_t sc[Q6K_NSUB];
        uint16_t dh;
        uint8_t q[MOE_Q6_K_BLOCK];
        if (!block(src + o, sc, &dh, q)) return false;
        moe_q6_k_pack_codes(b, q);
        memcpy(b + 192, sc, Q6K_NSUB); /* the last MOE_Q6_K_TAIL bytes */
        memcpy(b + 208, &dh, 2);
    }
    return true;
}

bool moe_quantize_row_q6_k(void *dst, const float *src, size_t n)
{
    return moe_q6_k_quantize_row_with(moe_q4_k_has_avx2() ? moe_q6_k_block_avx2 : moe_q6_k_block_portable, dst,
                                      src, n);
}
