/* q6_k_avx2.c - q6k_block (q6_k_fit.h) in AVX2 with 8 sub-blocks of a
 * block in the 8 lanes: each half of the block (sub-blocks 8h .. 8h + 7)
 * is transposed to 16 rows of 8 (value i of sub-block j in lane j of row
 * i) and every step of q6k_fit_sub, q6k_block's choice of the int8 scales
 * and the nearest codes runs for the 8 sub-blocks at once.
 *
 * Each lane does the scalar code's operations in its order, so the bytes
 * are q6k_block's, bit for bit (tests/test_quant_q6_k_fit.c): the 4
 * partial sums of a sub-block (value i in partial i % 4) are 4 vectors,
 * combined as (p0 + p2) + (p1 + p3); the fp64 comparison of fits runs in
 * two __m256d of 4 sub-blocks each; the scalar code's branches are lane
 * masks; the block's d (the largest scale of the 16, rounded to f16) is
 * found between the halves in scalar code.  No fused multiply-add:
 * products and sums are rounded on their own, as the scalar code's are.
 * A change to q6_k_fit.h must be made here too. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "runtime/core/lanes_avx2.h"
#include "runtime/core/q6_k_fit.h"
#include "runtime/core/q6_k_impl.h"

/* q6k_round and q6k_clamp in lanes (maxps, then minps: a NaN becomes -32) */
AVX2 static inline __m256 round8(__m256 v)
{
    const __m256 m = _mm256_set1_ps(12582912.0f);
    return _mm256_sub_ps(_mm256_add_ps(v, m), m);
}
AVX2 static inline __m256 clamp8(__m256 v)
{
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-32.0f)), _mm256_set1_ps(31.0f));
}

/* The lane masks of the 8 bits of b (lane j set when bit j is), as floats
 * and as the two halves' doubles. */
AVX2 static inline __m256 mask8(int b)
{
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(b), bits), bits));
}
AVX2 static inline __m256d mask4d(int b)
{
    const __m256i bits = _mm256_setr_epi64x(1, 2, 4, 8);
    return _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x(b), bits), bits));
}

/* q6k_sums_c for the 8 sub-blocks of xt at inverse scales is */
AVX2 static inline void sums8(const __m256 *xt, __m256 is, __m256 *sxq, __m256 *sqq)
{
    __m256 p[4], r[4];
    for (int k = 0; k < 4; k++) p[k] = r[k] = _mm256_setzero_ps();
    for (int i = 0; i < Q6K_SUB; i++) {
        const __m256 q = clamp8(round8(_mm256_mul_ps(xt[i], is)));
        p[i % 4] = _mm256_add_ps(p[i % 4], _mm256_mul_ps(xt[i], q));
        r[i % 4] = _mm256_add_ps(r[i % 4], _mm256_mul_ps(q, q));
    }
    *sxq = _mm256_add_ps(_mm256_add_ps(p[0], p[2]), _mm256_add_ps(p[1], p[3]));
    *sqq = _mm256_add_ps(_mm256_add_ps(r[0], r[2]), _mm256_add_ps(r[1], r[3]));
}

/* q6k_error_c for the 8 sub-blocks of xt at scales S */
AVX2 static inline __m256 error8(const __m256 *xt, __m256 S)
{
    const __m256 is = _mm256_div_ps(_mm256_set1_ps(1.0f), S);
    __m256 e[4];
    for (int k = 0; k < 4; k++) e[k] = _mm256_setzero_ps();
    for (int i = 0; i < Q6K_SUB; i++) {
        const __m256 r = _mm256_sub_ps(xt[i], _mm256_mul_ps(S, clamp8(round8(_mm256_mul_ps(xt[i], is)))));
        e[i % 4] = _mm256_add_ps(e[i % 4], _mm256_mul_ps(r, r));
    }
    return _mm256_add_ps(_mm256_add_ps(e[0], e[2]), _mm256_add_ps(e[1], e[3]));
}

/* q6k_fit_sub for the 8 sub-blocks of xt */
AVX2 static __m256 fit8(const __m256 *xt)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v = _mm256_setzero_ps();
    for (int i = 0; i < Q6K_SUB; i++)
        v = _mm256_blendv_ps(v, xt[i], _mm256_cmp_ps(_mm256_and_ps(xt[i], absm), _mm256_and_ps(v, absm), _CMP_GT_OQ));
    const __m256 zero = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ);
    d8 best_num = {{_mm256_set1_pd(-1.0), _mm256_set1_pd(-1.0)}}, best_den = {{_mm256_set1_pd(1.0), _mm256_set1_pd(1.0)}};
    __m256 best = _mm256_div_ps(v, _mm256_set1_ps(-32.0f));
    for (int g = 0; g <= Q6K_GRIDS; g++) {
        const __m256 is = g < Q6K_GRIDS ? _mm256_div_ps(_mm256_set1_ps(-(Q6K_GRID0 + Q6K_GRID_STEP * (float)g)), v)
                                        : _mm256_div_ps(_mm256_set1_ps(1.0f), best);
        __m256 sxq, sqq;
        sums8(xt, is, &sxq, &sqq);
        const int valid = _mm256_movemask_ps(_mm256_cmp_ps(sqq, _mm256_setzero_ps(), _CMP_GT_OQ));
        const d8 sx = d8_widen(sxq), sq = d8_widen(sqq);
        d8 num;
        int better = 0;
        for (int h = 0; h < 2; h++) {
            num.h[h] = _mm256_mul_pd(sx.h[h], sx.h[h]);
            const __m256d gt = _mm256_cmp_pd(_mm256_mul_pd(num.h[h], best_den.h[h]),
                                             _mm256_mul_pd(best_num.h[h], sq.h[h]), _CMP_GT_OQ);
            better |= _mm256_movemask_pd(gt) << (4 * h);
        }
        const int take = valid & better;
        if (!take) continue;
        for (int h = 0; h < 2; h++) {
            const __m256d m = mask4d(take >> (4 * h));
            best_num.h[h] = _mm256_blendv_pd(best_num.h[h], num.h[h], m);
            best_den.h[h] = _mm256_blendv_pd(best_den.h[h], sq.h[h], m);
        }
        best = _mm256_blendv_ps(best, _mm256_div_ps(sxq, sqq), mask8(take));
    }
    return _mm256_andnot_ps(zero, best);
}

/* q6k_block's choice of the 8 sub-blocks' int8 scales at the block's d
 * from their fits s: into sc, and their scales d * sc (0 where none) as
 * the result. */
AVX2 static __m256 choose8(const __m256 *xt, __m256 s, float d, int8_t *sc)
{
    const __m256 dv = _mm256_set1_ps(d);
    const __m256 active = d != 0.0f ? _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_NEQ_OQ) : _mm256_setzero_ps();
    const __m256 r =
        round8(_mm256_max_ps(_mm256_set1_ps(-128.0f), _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_div_ps(s, dv))));
    __m256 best_e = _mm256_set1_ps(INFINITY), c_best = _mm256_setzero_ps(), S = _mm256_setzero_ps();
    for (int o = -1; o <= 1; o++) {
        const __m256 c = _mm256_add_ps(r, _mm256_set1_ps((float)o));
        __m256 ok = _mm256_and_ps(active, _mm256_cmp_ps(c, _mm256_set1_ps(-128.0f), _CMP_GE_OQ));
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(c, _mm256_set1_ps(127.0f), _CMP_LE_OQ));
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(c, _mm256_setzero_ps(), _CMP_NEQ_OQ));
        if (_mm256_testz_ps(ok, ok)) continue;
        const __m256 Sc = _mm256_mul_ps(dv, c);
        const __m256 e = error8(xt, Sc);
        const __m256 take = _mm256_and_ps(ok, _mm256_cmp_ps(e, best_e, _CMP_LT_OQ));
        best_e = _mm256_blendv_ps(best_e, e, take);
        c_best = _mm256_blendv_ps(c_best, c, take);
        S = _mm256_blendv_ps(S, Sc, take);
    }
    int32_t ci[8];
    _mm256_storeu_si256((__m256i *)ci, _mm256_cvttps_epi32(c_best));
    for (int j = 0; j < 8; j++) sc[j] = (int8_t)ci[j];
    return S;
}

/* q6k_nearest_c for the 8 sub-blocks of xt at scales S: the codes of
 * sub-block j into q + 16 j. */
AVX2 static void nearest8(const __m256 *xt, __m256 S, uint8_t *q)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_cmp_ps(S, _mm256_setzero_ps(), _CMP_EQ_OQ);
    int32_t ci[Q6K_SUB][8];
    for (int i = 0; i < Q6K_SUB; i++) {
        const __m256 x = xt[i];
        const __m256 k = clamp8(round8(_mm256_div_ps(x, S)));
        const __m256 km = _mm256_sub_ps(k, one), kp = _mm256_add_ps(k, one);
        const __m256 e0 = _mm256_and_ps(_mm256_sub_ps(x, _mm256_mul_ps(S, k)), absm);
        const __m256 em = _mm256_blendv_ps(inf, _mm256_and_ps(_mm256_sub_ps(x, _mm256_mul_ps(S, km)), absm),
                                           _mm256_cmp_ps(km, _mm256_set1_ps(-32.0f), _CMP_GE_OQ));
        const __m256 ep = _mm256_blendv_ps(inf, _mm256_and_ps(_mm256_sub_ps(x, _mm256_mul_ps(S, kp)), absm),
                                           _mm256_cmp_ps(kp, _mm256_set1_ps(31.0f), _CMP_LE_OQ));
        const __m256 lm = _mm256_cmp_ps(em, e0, _CMP_LT_OQ);
        __m256 c = _mm256_blendv_ps(k, km, lm);
        const __m256 ec = _mm256_blendv_ps(e0, em, lm);
        c = _mm256_blendv_ps(c, kp, _mm256_cmp_ps(ep, ec, _CMP_LT_OQ));
        c = _mm256_blendv_ps(c, _mm256_setzero_ps(), zero); /* every code 32 where S is 0 */
        _mm256_storeu_si256((__m256i *)ci[i], _mm256_add_epi32(_mm256_cvttps_epi32(c), _mm256_set1_epi32(32)));
    }
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < Q6K_SUB; i++) q[Q6K_SUB * j + i] = (uint8_t)ci[i][j];
}

/* Half h of the block x transposed into xt (16 rows of 8). */
AVX2 static void transpose_half(const float *x, int h, __m256 xt[Q6K_SUB])
{
    for (int i0 = 0; i0 < Q6K_SUB; i0 += 8) {
        for (int j = 0; j < 8; j++) xt[i0 + j] = _mm256_loadu_ps(x + Q6K_SUB * (8 * h + j) + i0);
        transpose8(xt + i0);
    }
}

AVX2 bool moe_q6_k_block_avx2(const float *x, int8_t sc[Q6K_NSUB], uint16_t *dh, uint8_t q[MOE_Q6_K_BLOCK])
{
    __m256 xt[2][Q6K_SUB];
    float s[Q6K_NSUB], smax = 0.0f;
    for (int h = 0; h < 2; h++) {
        transpose_half(x, h, xt[h]);
        _mm256_storeu_ps(s + 8 * h, fit8(xt[h]));
    }
    for (int j = 0; j < Q6K_NSUB; j++) smax = fabsf(s[j]) > fabsf(smax) ? s[j] : smax;
    *dh = moe_fit_f16(smax / -128.0f);
    if ((*dh & 0x7c00u) == 0x7c00u) return false; /* past f16's range */
    const float d = moe_fit_f32(*dh);
    for (int h = 0; h < 2; h++) {
        const __m256 S = choose8(xt[h], _mm256_loadu_ps(s + 8 * h), d, sc + 8 * h);
        nearest8(xt[h], S, q + Q6K_SUB * 8 * h);
    }
    return true;
}
