/* q5_k_avx2.c - q5k_block (q5_k_fit.h) with a group's 8 lanes (value i in
 * lane i % 8) in one AVX2 register: q5k_error_c and q5k_line_c written
 * with the same operations in the same order (no fused multiply-add: each
 * product and sum rounded on its own), the 8 partial sums then added in
 * q5k_sum8's tree, so the bytes are q5k_block's, bit for bit
 * (tests/test_quant_q5_k.c).  The rest of the fit is the header's plain
 * C.  A change to q5_k_fit.h's lanes must be made here too. */
#include <immintrin.h>
#include <string.h>

#include "runtime/core/lanes_avx2.h"
#include "runtime/core/q5_k_impl.h"

AVX2 static float error_avx2(const float *x, float s, float a, uint8_t *q);
AVX2 static void line_avx2(const float *x, float lo, float is, float *sq, float *sqq, float *sqx);
#define Q5K_ERROR error_avx2
#define Q5K_LINE line_avx2
#include "runtime/core/q5_k_fit.h"

/* code(v) of 8 lanes: clamped to [0, 31] (a NaN to 0, as the scalar
 * code's comparisons), then truncated after adding 0.5 */
AVX2 static inline __m256i codes8(__m256 v)
{
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(Q5K_TOP));
    return _mm256_cvttps_epi32(_mm256_add_ps(v, _mm256_set1_ps(0.5f)));
}

/* q5k_error_c in one register */
AVX2 static float error_avx2(const float *x, float s, float a, uint8_t *q)
{
    const __m256 is = _mm256_set1_ps(s > 0.0f ? 1.0f / s : 0.0f), sv = _mm256_set1_ps(s), av = _mm256_set1_ps(a);
    __m256 e = _mm256_setzero_ps();
    for (int i = 0; i < Q5K_G; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        const __m256i ci = codes8(_mm256_mul_ps(_mm256_add_ps(xv, av), is));
        const __m256 r = _mm256_sub_ps(xv, _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ci), sv), av));
        e = _mm256_add_ps(e, _mm256_mul_ps(r, r));
        if (q) {
            int32_t c[8];
            _mm256_storeu_si256((__m256i *)c, ci);
            for (int k = 0; k < 8; k++) q[i + k] = (uint8_t)c[k];
        }
    }
    float p[8];
    _mm256_storeu_ps(p, e);
    return q5k_sum8(p);
}

/* q5k_line_c in three registers */
AVX2 static void line_avx2(const float *x, float lo, float is, float *sq, float *sqq, float *sqx)
{
    const __m256 lv = _mm256_set1_ps(lo), iv = _mm256_set1_ps(is);
    __m256 p = _mm256_setzero_ps(), pp = _mm256_setzero_ps(), px = _mm256_setzero_ps();
    for (int i = 0; i < Q5K_G; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        const __m256 c = _mm256_cvtepi32_ps(codes8(_mm256_mul_ps(_mm256_sub_ps(xv, lv), iv)));
        p = _mm256_add_ps(p, c);
        pp = _mm256_add_ps(pp, _mm256_mul_ps(c, c));
        px = _mm256_add_ps(px, _mm256_mul_ps(c, xv));
    }
    float a[8], b[8], c[8];
    _mm256_storeu_ps(a, p), _mm256_storeu_ps(b, pp), _mm256_storeu_ps(c, px);
    *sq = q5k_sum8(a), *sqq = q5k_sum8(b), *sqx = q5k_sum8(c);
}

bool moe_q5_k_block_avx2(const float *x, unsigned char head[16], uint8_t q[256]) { return q5k_block(x, head, q); }
