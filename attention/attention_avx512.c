/* attention_avx512.c - the fast paged attention's scores and value sums
 * (attention_fast.c) on 512-bit registers, for the AVX-512 kernel sets:
 * the AVX2 kernels' arithmetic (attention_avx2.c), lane for lane, with
 * half the instructions, so both give the same bits.
 *
 * A score's two 8-lane FMA chains (values i..i+7 and i+8..i+15 of each
 * block of 16) are the two halves of one 16-lane chain; the odd block of 8
 * goes into the first half's chain as before, then moe_hsum8 of the halves'
 * sum, the Dh % 8 tail and the softmax scale as in the AVX2 kernel; four
 * keys at a time, else two, else one (a block of heads then keeps up to
 * 4 nh chains in flight, the query's values loaded once for all; four
 * rather than two, bench-olmoe one thread: prefill 2048 1.07-1.09x,
 * decode at 2048 cached tokens 1.02-1.04x;
 * results/2026-12-07-decode-attention-prefetch.md).  An accumulator's lanes are 16
 * values of d at a time (two blocks of 16 in flight), each acc * corr then
 * one FMA per key in key order; a last block of 8 and the tail as in the
 * AVX2 kernel.  Values are widened 16 at a time to the same values
 * (attention_load.h).  bench-olmoe Q8_0 prefill 4096: the two keys and
 * two blocks 1.03-1.08x (results/2026-12-05-prefill-attention-blocks.md). */
#include <immintrin.h>
#include <math.h>

#include "attention/attention.h"
#include "attention/attention_fast_impl.h"
#include "attention/attention_load.h"
#include "runtime/core/status.h"

#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))

/* 16 values of a row of dtype dt from element i; s256: 2^8 times the
 * row's scale (fp8 only). */
AVX512 INLINE __m512 load16(const void *row, const enum moe_dtype dt, int i, __m512 s256)
{
    if (dt == MOE_DTYPE_F32) return _mm512_loadu_ps((const float *)row + i);
    if (dt == MOE_DTYPE_F8E4M3) {
        const uint8_t *b = (const uint8_t *)row + i;
        const __m256i h = _mm256_set_m128i(moe_e4m3x8_half(_mm_loadl_epi64((const __m128i *)(b + 8)), 1),
                                           moe_e4m3x8_half(_mm_loadl_epi64((const __m128i *)b), 1));
        return _mm512_mul_ps(_mm512_cvtph_ps(h), s256);
    }
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (dt == MOE_DTYPE_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* sc[h * ldsc + j] = (q_h . k_j) * scale for the nh heads q_h = q + h * Dh
 * and the nk (1, 2 or 4) keys k_j = k[j] (scales ks[j], fp8 only): nh * nk
 * chains, each the one a head and key have alone, the query's values
 * loaded once for all its keys. */
AVX512 INLINE void dot_heads(float *sc, int ldsc, const float *q, const int nh, const int nk, int Dh,
                             const enum moe_dtype dt, const void *const *k, const float *ks, float scale)
{
    __m512 s512[4], z[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < nk; j++) s512[j] = _mm512_set1_ps(256.0f * ks[j]);
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int j = 0; j < nk; j++) z[h][j] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= Dh; i += 16) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int j = 0; j < nk; j++) kv[j] = load16(k[j], dt, i, s512[j]);
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) {
            const __m512 qh = _mm512_loadu_ps(q + (size_t)h * Dh + i);
#pragma GCC unroll 4
            for (int j = 0; j < nk; j++) z[h][j] = _mm512_fmadd_ps(qh, kv[j], z[h][j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nk; j++) {
        int d0 = i;
        __m256 s0[4], s1[4];
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) {
            s0[h] = _mm512_castps512_ps256(z[h][j]);
            s1[h] = _mm512_extractf32x8_ps(z[h][j], 1);
        }
        if (d0 + 8 <= Dh) {
            const __m256 k0 = att_load8(k[j], dt, d0, _mm512_castps512_ps256(s512[j]));
#pragma GCC unroll 4
            for (int h = 0; h < nh; h++)
                s0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)h * Dh + d0), k0, s0[h]);
            d0 += 8;
        }
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) {
            float s = moe_hsum8(_mm256_add_ps(s0[h], s1[h]));
            for (int d = d0; d < Dh; d++) s += q[(size_t)h * Dh + d] * att_load1(k[j], dt, d, ks[j]);
            sc[(size_t)h * ldsc + j] = s * scale;
        }
    }
}

/* acc_h (Dh) = acc_h * corr[h] + sum over the tile's keys, in order, of
 * p[h * ldp + jj] * v_jj, for the nh heads acc_h = acc + h * Dh; s256[jj]:
 * 2^8 times v_jj's scale (fp8 only). */
AVX512 INLINE void acc_heads(float *acc, const int nh, int Dh, const float *corr, const float *p, int ldp,
                             const enum moe_dtype dt, const void *const *vrow, const float *vs, const float *s256,
                             int nj)
{
    int d = 0;
    for (; d + 32 <= Dh; d += 32) { /* two blocks of 16 values: 2 nh chains */
        __m512 a[4][2];
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 2
            for (int b = 0; b < 2; b++)
                a[h][b] = _mm512_mul_ps(_mm512_loadu_ps(acc + (size_t)h * Dh + d + 16 * b), _mm512_set1_ps(corr[h]));
        for (int jj = 0; jj < nj; jj++) {
            const __m512 s = _mm512_set1_ps(s256[jj]);
            const __m512 v0 = load16(vrow[jj], dt, d, s), v1 = load16(vrow[jj], dt, d + 16, s);
#pragma GCC unroll 4
            for (int h = 0; h < nh; h++) {
                const __m512 ph = _mm512_set1_ps(p[(size_t)h * ldp + jj]);
                a[h][0] = _mm512_fmadd_ps(ph, v0, a[h][0]);
                a[h][1] = _mm512_fmadd_ps(ph, v1, a[h][1]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 2
            for (int b = 0; b < 2; b++) _mm512_storeu_ps(acc + (size_t)h * Dh + d + 16 * b, a[h][b]);
    }
    for (; d + 16 <= Dh; d += 16) {
        __m512 a[4];
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++)
            a[h] = _mm512_mul_ps(_mm512_loadu_ps(acc + (size_t)h * Dh + d), _mm512_set1_ps(corr[h]));
        for (int jj = 0; jj < nj; jj++) {
            const __m512 v = load16(vrow[jj], dt, d, _mm512_set1_ps(s256[jj]));
#pragma GCC unroll 4
            for (int h = 0; h < nh; h++) a[h] = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)h * ldp + jj]), v, a[h]);
        }
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) _mm512_storeu_ps(acc + (size_t)h * Dh + d, a[h]);
    }
    if (d + 8 <= Dh) {
        __m256 a[4];
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++)
            a[h] = _mm256_mul_ps(_mm256_loadu_ps(acc + (size_t)h * Dh + d), _mm256_set1_ps(corr[h]));
        for (int jj = 0; jj < nj; jj++) {
            const __m256 v = att_load8(vrow[jj], dt, d, _mm256_broadcast_ss(s256 + jj));
#pragma GCC unroll 4
            for (int h = 0; h < nh; h++) a[h] = _mm256_fmadd_ps(_mm256_set1_ps(p[(size_t)h * ldp + jj]), v, a[h]);
        }
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) _mm256_storeu_ps(acc + (size_t)h * Dh + d, a[h]);
        d += 8;
    }
    for (; d < Dh; d++)
        for (int h = 0; h < nh; h++) {
            float a = acc[(size_t)h * Dh + d] * corr[h];
            for (int jj = 0; jj < nj; jj++) a = fmaf(p[(size_t)h * ldp + jj], att_load1(vrow[jj], dt, d, vs[jj]), a);
            acc[(size_t)h * Dh + d] = a;
        }
}

#define ATT_FN AVX512
#define ATT_KEYS 4
#define ATT_NAME(f) f##_avx512
#include "attention/attention_heads.h"
