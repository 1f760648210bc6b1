/* attention_avx2.c - the inner loops of the fast paged attention
 * (attention_fast.c) with AVX2 + FMA + F16C: the scores of a tile of keys
 * for a group's query heads, and the tile's values into those heads'
 * accumulators.  K and V rows are read at the cache's own width (f32, f16,
 * bf16, or fp8 bytes plus a row scale, kvcache.h) and widened 8 values at a
 * time in registers, never into a buffer: an fp8 key costs its Dh + 4
 * bytes of K and of V and nothing else.
 *
 * Values: each value is the reference's (attention_cpu.c) exactly: f16 by
 * F16C, bf16 by a 16-bit shift, fp8 as the f16 of e4m3 / 2^8
 * (moe_e4m3x8_half, NaN bytes kept NaN) widened by F16C and multiplied by
 * 2^8 s, the row's scale times 2^8.  That product is e4m3 * s rounded once,
 * as the reference's: e4m3 / 2^8 is exact, and 2^8 s is exact because
 * s = amax / 448 <= FLT_MAX / 448 < 2^120 (a power-of-two multiple of a
 * finite s that cannot overflow).  So a cache of any dtype gives, bit for
 * bit, the output of an f32 cache holding its values (tests/test_kv_fp8.c).
 * The multiply per value is kept rather than folding s into the score and
 * into the softmax weight: folding would save one of the ~8 instructions
 * per 8 values and lose that equality.
 *
 * Sums: a score is, per head, two 8-lane FMA chains over blocks of 16
 * values (the odd block of 8 into the first), moe_hsum8 of their sum, the
 * Dh % 8 tail in order, then times the softmax scale; an accumulator lane
 * is acc * corr, then one FMA per key of the tile in key order.  Heads are
 * taken in register blocks of 4, 2 or 1, each key row widened once per
 * block; the block changes no head's arithmetic, so every output has one
 * fixed order whatever G, the tile or the batch. */
#include <immintrin.h>
#include <math.h>

#include "attention/attention.h"
#include "attention/attention_fast_impl.h"
#include "attention/attention_load.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"


/* sc[h * ldsc] = (q_h . k) * scale for the nh heads q_h = q + h * Dh
 * (one key, nk 1: attention_heads.h; scale ks[0], fp8 only). */
AVX2 INLINE void dot_heads(float *sc, int ldsc, const float *q, const int nh, const int nk, int Dh,
                           const enum moe_dtype dt, const void *const *kr, const float *ksr, float scale)
{
    const void *k = kr[0];
    const float ks = ksr[0];
    (void)nk;
    const __m256 s256 = _mm256_set1_ps(256.0f * ks);
    __m256 s0[4], s1[4];
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++) s0[h] = s1[h] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= Dh; i += 16) {
        const __m256 k0 = att_load8(k, dt, i, s256), k1 = att_load8(k, dt, i + 8, s256);
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) {
            s0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)h * Dh + i), k0, s0[h]);
            s1[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)h * Dh + i + 8), k1, s1[h]);
        }
    }
    if (i + 8 <= Dh) {
        const __m256 k0 = att_load8(k, dt, i, s256);
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) s0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)h * Dh + i), k0, s0[h]);
        i += 8;
    }
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++) {
        float s = moe_hsum8(_mm256_add_ps(s0[h], s1[h]));
        for (int d = i; d < Dh; d++) s += q[(size_t)h * Dh + d] * att_load1(k, dt, d, ks);
        sc[(size_t)h * ldsc] = s * scale;
    }
}

/* acc_h (Dh) = acc_h * corr[h] + sum over the tile's keys, in order, of
 * p[h * ldp + jj] * v_jj, for the nh heads acc_h = acc + h * Dh; s256[jj]:
 * 2^8 times v_jj's scale (fp8 only). */
AVX2 INLINE void acc_heads(float *acc, const int nh, int Dh, const float *corr, const float *p, int ldp,
                           const enum moe_dtype dt, const void *const *vrow, const float *vs,
                           const float *s256, int nj)
{
    int d = 0;
    for (; d + 8 <= Dh; d += 8) {
        __m256 a[4];
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) a[h] = _mm256_mul_ps(_mm256_loadu_ps(acc + (size_t)h * Dh + d), _mm256_set1_ps(corr[h]));
        for (int jj = 0; jj < nj; jj++) {
            const __m256 v = att_load8(vrow[jj], dt, d, _mm256_broadcast_ss(s256 + jj));
#pragma GCC unroll 4
            for (int h = 0; h < nh; h++) a[h] = _mm256_fmadd_ps(_mm256_set1_ps(p[(size_t)h * ldp + jj]), v, a[h]);
        }
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) _mm256_storeu_ps(acc + (size_t)h * Dh + d, a[h]);
    }
    for (; d < Dh; d++)
        for (int h = 0; h < nh; h++) {
            float a = acc[(size_t)h * Dh + d] * corr[h];
            for (int jj = 0; jj < nj; jj++) a = fmaf(p[(size_t)h * ldp + jj], att_load1(vrow[jj], dt, d, vs[jj]), a);
            acc[(size_t)h * Dh + d] = a;
        }
}

#define ATT_FN AVX2
#define ATT_NAME(f) f##_avx2
#include "attention/attention_heads.h"

AVX2 void moe_attention_softmax_avx2(float *sc, int ldsc, int gn, int nj, float *m, float *l, float *corr)
{
    MOE_ASSERT(nj >= 1 && nj <= MOE_ATT_TILE && MOE_ATT_TILE == 16);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 in0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nj), lane));
    const __m256 in1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nj - 8), lane));
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int g = 0; g < gn; g++) {
        float *sg = sc + (size_t)g * ldsc;
        const __m256 s0 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(sg), in0);
        const __m256 s1 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(sg + 8), in1);
        /* max(s, mx) keeps mx where s is NaN, as the reference's s > mx ? s : mx */
        __m256 mx = _mm256_max_ps(s1, _mm256_max_ps(s0, _mm256_set1_ps(m[g])));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float mn = _mm_cvtss_f32(h);
        const __m256 vmn = _mm256_set1_ps(mn);
        const __m256 p0 = moe_exp8(_mm256_sub_ps(s0, vmn)), p1 = moe_exp8(_mm256_sub_ps(s1, vmn));
        _mm256_storeu_ps(sg, p0);
        _mm256_storeu_ps(sg + 8, p1);
        corr[g] = expf(m[g] - mn);
        l[g] = l[g] * corr[g] + moe_hsum8(_mm256_add_ps(p0, p1));
        m[g] = mn;
    }
}

/* moe_exp8 over n values (for the tests). */
AVX2 void moe_attention_exp_avx2(float *dst, const float *x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, moe_exp8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) {
        float t[8] = {x[i]};
        _mm256_storeu_ps(t, moe_exp8(_mm256_loadu_ps(t)));
        dst[i] = t[0];
    }
}

/* The same widening as att_load8's, into memory (for the tests). */
AVX2 void moe_kv_fp8_row_fast(float *dst, const uint8_t *q, float s, int n)
{
    const __m256 s256 = _mm256_set1_ps(256.0f * s);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, att_load8(q, MOE_DTYPE_F8E4M3, i, s256));
    for (; i < n; i++) dst[i] = att_load1(q, MOE_DTYPE_F8E4M3, i, s);
}
