/* q4_k_avx2.c - q4k_block (q4_k_fit.h) in AVX2 with the 8 groups of a block
 * in the 8 lanes: the block is transposed to 32 rows of 8 (value i of
 * group j in lane j of row i) and every step of q4k_fit_group and
 * q4k_block runs for the 8 groups at once.
 *
 * Each lane does the scalar code's operations in its order, so the bytes
 * are q4k_block's, bit for bit (tests/test_quant_q4_k.c): q4k_lanes_c's
 * partial k of a group is one vector (rows k, k + 8, k + 16, k + 24 added
 * to 0 in turn), the 8 partials are combined in q4k_sum8's tree, the fp64
 * sums and closed forms run in two __m256d of 4 groups each, and the
 * scalar code's branches are lane masks.  Two steps differ where the
 * result cannot: a grid's sums of c and c^2 (integers) are summed in
 * int32, and a code's value is truncated in fp32 rather than through
 * int32.  No fused multiply-add: products and sums are rounded on their
 * own, as the scalar code's are.  A change to q4_k_fit.h must be made here
 * too. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "runtime/core/q4_k_fit.h"
#include "runtime/core/q4_k_impl.h"
#include "runtime/core/lanes_avx2.h"

/* q4k_lanes_c's Q4K_CODES partial k for the 8 groups: the sum over rows
 * k, k + 8, k + 16, k + 24 of (x - (c s - a))^2, c the rounding half up
 * of (x + a) is clamped to [0, 15]; the codes into ct when not NULL. */
AVX2 static inline __m256 codes_partial(const __m256 *xt, int k, __m256 s, __m256 a, __m256 is, __m256i *ct)
{
    __m256 acc = _mm256_setzero_ps();
    for (int i = k; i < Q4K_G; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_add_ps(xt[i], a), is);
        v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(15.0f));
        /* (float)(int)(v + 0.5f), v + 0.5f in [0.5, 15.5] */
        const __m256 c =
            _mm256_round_ps(_mm256_add_ps(v, _mm256_set1_ps(0.5f)), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 r = _mm256_sub_ps(xt[i], _mm256_sub_ps(_mm256_mul_ps(c, s), a));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(r, r));
        if (ct) ct[i] = _mm256_cvttps_epi32(c);
    }
    return acc;
}

/* 1 / s where s > 0, else 0 (q4k_group_error's is). */
AVX2 static inline __m256 inverse(__m256 s)
{
    const __m256 pos = _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ);
    return _mm256_and_ps(pos, _mm256_div_ps(_mm256_set1_ps(1.0f), s));
}

/* q4k_group_error for the 8 groups at (s, a): the partials combined as
 * q4k_sum8 does, ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)). */
AVX2 static inline __m256 codes_error(const __m256 *xt, __m256 s, __m256 a, __m256i *ct)
{
    const __m256 is = inverse(s);
    const __m256 p04 = _mm256_add_ps(codes_partial(xt, 0, s, a, is, ct), codes_partial(xt, 4, s, a, is, ct));
    const __m256 p26 = _mm256_add_ps(codes_partial(xt, 2, s, a, is, ct), codes_partial(xt, 6, s, a, is, ct));
    const __m256 even = _mm256_add_ps(p04, p26);
    const __m256 p15 = _mm256_add_ps(codes_partial(xt, 1, s, a, is, ct), codes_partial(xt, 5, s, a, is, ct));
    const __m256 p37 = _mm256_add_ps(codes_partial(xt, 3, s, a, is, ct), codes_partial(xt, 7, s, a, is, ct));
    return _mm256_add_ps(even, _mm256_add_ps(p15, p37));
}

/* The sums of c, c^2 and c x of a grid (q4k_lanes_c's Q4K_LINE).  Those of
 * c and c^2 are integers below 2^24, which fp32 sums exactly in any order:
 * they are summed in int32, where they do not compete with the fp32 work. */
typedef struct {
    __m256i q, qq;
    __m256 qx;
} line_sums;

AVX2 static inline line_sums line_add(line_sums a, line_sums b)
{
    return (line_sums){_mm256_add_epi32(a.q, b.q), _mm256_add_epi32(a.qq, b.qq), _mm256_add_ps(a.qx, b.qx)};
}

/* q4k_lanes_c's Q4K_LINE partial k: c the rounding half up of (x - lo) is
 * clamped to [0, 15]. */
AVX2 static inline line_sums line_partial(const __m256 *xt, int k, __m256 lo, __m256 is)
{
    line_sums acc = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_ps()};
    for (int i = k; i < Q4K_G; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(xt[i], lo), is);
        v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(15.0f));
        const __m256i ci = _mm256_cvttps_epi32(_mm256_add_ps(v, _mm256_set1_ps(0.5f)));
        acc.q = _mm256_add_epi32(acc.q, ci);
        acc.qq = _mm256_add_epi32(acc.qq, _mm256_mullo_epi16(ci, ci)); /* ci in 0..15: the low halves */
        acc.qx = _mm256_add_ps(acc.qx, _mm256_mul_ps(_mm256_cvtepi32_ps(ci), xt[i]));
    }
    return acc;
}

/* The line sums of the grid lo + k / is for the 8 groups, in q4k_sum8's
 * tree. */
AVX2 static inline line_sums line_grid(const __m256 *xt, __m256 lo, __m256 is)
{
    const line_sums p04 = line_add(line_partial(xt, 0, lo, is), line_partial(xt, 4, lo, is));
    const line_sums p26 = line_add(line_partial(xt, 2, lo, is), line_partial(xt, 6, lo, is));
    const line_sums even = line_add(p04, p26);
    const line_sums p15 = line_add(line_partial(xt, 1, lo, is), line_partial(xt, 5, lo, is));
    const line_sums p37 = line_add(line_partial(xt, 3, lo, is), line_partial(xt, 7, lo, is));
    return line_add(even, line_add(p15, p37));
}

/* The best line so far of 8 groups: its error and (s, -b) in fp64. */
typedef struct {
    d8 e, s, a;
} fit_state;

/* One candidate grid's least-squares line (q4k_fit_group's loop body) for
 * the 4 groups of half h, kept where it is better. */
AVX2 static inline void fit_candidate(fit_state *st, int h, const d8 *sx, const d8 *sxx, const d8 *q,
                                      const d8 *qq, const d8 *qx, const d8 *s_ls)
{
    const __m256d zero = _mm256_setzero_pd(), g = _mm256_set1_pd((double)Q4K_G), two = _mm256_set1_pd(2.0);
    const __m256d sq = q->h[h], sqq = qq->h[h], sqx = qx->h[h], x1 = sx->h[h];
    const __m256d det = _mm256_sub_pd(_mm256_mul_pd(g, sqq), _mm256_mul_pd(sq, sq));
    __m256d s = _mm256_div_pd(_mm256_sub_pd(_mm256_mul_pd(g, sqx), _mm256_mul_pd(sq, x1)), det);
    __m256d b = _mm256_div_pd(_mm256_sub_pd(x1, _mm256_mul_pd(s, sq)), g);
    const __m256d pos = _mm256_cmp_pd(b, zero, _CMP_GT_OQ); /* the offset must be at most 0 */
    b = _mm256_andnot_pd(pos, b);
    s = _mm256_blendv_pd(s, s_ls->h[h], pos);
    const __m256d two_s = _mm256_mul_pd(two, s);
    __m256d e = _mm256_sub_pd(sxx->h[h], _mm256_mul_pd(two_s, sqx));
    e = _mm256_sub_pd(e, _mm256_mul_pd(_mm256_mul_pd(two, b), x1));
    e = _mm256_add_pd(e, _mm256_mul_pd(_mm256_mul_pd(s, s), sqq));
    e = _mm256_add_pd(e, _mm256_mul_pd(_mm256_mul_pd(two_s, b), sq));
    e = _mm256_add_pd(e, _mm256_mul_pd(_mm256_mul_pd(g, b), b));
    const __m256d take = _mm256_and_pd(
        _mm256_and_pd(_mm256_cmp_pd(det, zero, _CMP_GT_OQ), _mm256_cmp_pd(s, zero, _CMP_GT_OQ)),
        _mm256_cmp_pd(e, st->e.h[h], _CMP_LT_OQ));
    st->e.h[h] = _mm256_blendv_pd(st->e.h[h], e, take);
    st->s.h[h] = _mm256_blendv_pd(st->s.h[h], s, take);
    st->a.h[h] = _mm256_blendv_pd(st->a.h[h], _mm256_xor_pd(b, _mm256_set1_pd(-0.0)), take);
}

/* q4k_fit_group for the 8 groups of xt: each one's (s, a) in its lane. */
AVX2 static void fit_groups(const __m256 *xt, __m256 *s_out, __m256 *a_out)
{
    __m256 lo = xt[0], hi = xt[0];
    d8 sx = {{_mm256_setzero_pd(), _mm256_setzero_pd()}}, sxx = sx;
    for (int i = 0; i < Q4K_G; i++) {
        lo = _mm256_min_ps(xt[i], lo);
        hi = _mm256_max_ps(xt[i], hi);
        const d8 xd = d8_widen(xt[i]);
        for (int h = 0; h < 2; h++) {
            sx.h[h] = _mm256_add_pd(sx.h[h], xd.h[h]);
            sxx.h[h] = _mm256_add_pd(sxx.h[h], _mm256_mul_pd(xd.h[h], xd.h[h]));
        }
    }
    lo = _mm256_min_ps(_mm256_setzero_ps(), lo); /* lo > 0 ? 0 : lo */
    const __m256 flat = _mm256_cmp_ps(hi, lo, _CMP_NGT_UQ), neg_lo = _mm256_xor_ps(lo, _mm256_set1_ps(-0.0f));
    const __m256 range = _mm256_sub_ps(hi, lo), bs = _mm256_div_ps(range, _mm256_set1_ps(15.0f));
    fit_state st = {d8_widen(codes_error(xt, bs, neg_lo, NULL)), d8_widen(bs), d8_widen(neg_lo)};
    for (int i = -Q4K_CAND; i <= Q4K_CAND; i++) {
        const __m256 is = _mm256_div_ps(_mm256_set1_ps(15.0f + Q4K_CAND_STEP * (float)i), range);
        const line_sums ls = line_grid(xt, lo, is);
        const __m256 sq = _mm256_cvtepi32_ps(ls.q), sqq = _mm256_cvtepi32_ps(ls.qq);
        const d8 q = d8_widen(sq), qq = d8_widen(sqq), qx = d8_widen(ls.qx);
        const d8 s_ls = d8_widen(_mm256_div_ps(ls.qx, sqq)); /* sqx / sqq in fp32, as the scalar code */
        for (int h = 0; h < 2; h++) fit_candidate(&st, h, &sx, &sxx, &q, &qq, &qx, &s_ls);
    }
    /* all equal, at most 0: s = 0, a = -lo */
    *s_out = _mm256_andnot_ps(flat, d8_narrow(st.s));
    *a_out = _mm256_blendv_ps(d8_narrow(st.a), neg_lo, flat);
}

/* q4k_six_bits of each lane of v. */
AVX2 static inline __m256i six_bits(__m256 v, float unit)
{
    if (!(unit > 0.0f)) return _mm256_setzero_si256();
    const __m256 r = _mm256_div_ps(v, _mm256_set1_ps(unit));
    __m256i c = _mm256_cvttps_epi32(_mm256_add_ps(r, _mm256_set1_ps(0.5f)));
    c = _mm256_blendv_epi8(c, _mm256_set1_epi32(63),
                           _mm256_castps_si256(_mm256_cmp_ps(r, _mm256_set1_ps(63.0f), _CMP_GE_OQ)));
    return _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(r, _mm256_setzero_ps(), _CMP_LE_OQ)), c);
}

/* Lanes where i is outside 0..63. */
AVX2 static inline __m256i off_six_bits(__m256i i)
{
    return _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), i), _mm256_cmpgt_epi32(i, _mm256_set1_epi32(63)));
}

/* The codes ct (row i, lane j) into q in element order (q[32 j + i]). */
AVX2 static void store_codes(__m256i ct[Q4K_G], uint8_t q[MOE_Q4_K_BLOCK])
{
    for (int i0 = 0; i0 < Q4K_G; i0 += 8) {
        __m256 r[8];
        for (int k = 0; k < 8; k++) r[k] = _mm256_castsi256_ps(ct[i0 + k]);
        transpose8(r);
        for (int j = 0; j < Q4K_NG; j++) {
            __m256i b = _mm256_packus_epi32(_mm256_castps_si256(r[j]), _mm256_castps_si256(r[j]));
            b = _mm256_packus_epi16(b, b); /* codes i0..i0 + 3 in bytes 0..3, i0 + 4..i0 + 7 in 16..19 */
            const uint32_t w[2] = {(uint32_t)_mm256_extract_epi32(b, 0), (uint32_t)_mm256_extract_epi32(b, 4)};
            memcpy(q + Q4K_G * j + i0, w, 8);
        }
    }
}

AVX2 bool moe_q4_k_block_avx2(const float *x, unsigned char head[Q4K_HEAD], uint8_t q[MOE_Q4_K_BLOCK])
{
    __m256 xt[Q4K_G];
    for (int i0 = 0; i0 < Q4K_G; i0 += 8) {
        for (int j = 0; j < Q4K_NG; j++) xt[i0 + j] = _mm256_loadu_ps(x + Q4K_G * j + i0);
        transpose8(xt + i0);
    }
    __m256 sv, av;
    fit_groups(xt, &sv, &av);
    float s[Q4K_NG], a[Q4K_NG], smax = 0.0f, amax = 0.0f;
    _mm256_storeu_ps(s, sv);
    _mm256_storeu_ps(a, av);
    for (int j = 0; j < Q4K_NG; j++) {
        smax = s[j] > smax ? s[j] : smax;
        amax = a[j] > amax ? a[j] : amax;
    }
    const uint16_t h[2] = {moe_fit_f16(smax / 63.0f), moe_fit_f16(amax / 63.0f)};
    if ((h[0] & 0x7c00u) == 0x7c00u || (h[1] & 0x7c00u) == 0x7c00u) return false;
    const float D = moe_fit_f32(h[0]), M = moe_fit_f32(h[1]);
    /* the neighbouring pairs, ds outer and da inner: the first least error wins */
    const __m256i s0 = six_bits(sv, D), a0 = six_bits(av, M);
    __m256 best = _mm256_set1_ps(INFINITY);
    __m256i sc = _mm256_setzero_si256(), mn = _mm256_setzero_si256();
    for (int ds = -1; ds <= 1; ds++)
        for (int da = -1; da <= 1; da++) {
            const __m256i si = _mm256_add_epi32(s0, _mm256_set1_epi32(ds));
            const __m256i ai = _mm256_add_epi32(a0, _mm256_set1_epi32(da));
            const __m256 e = codes_error(xt, _mm256_mul_ps(_mm256_set1_ps(D), _mm256_cvtepi32_ps(si)),
                                         _mm256_mul_ps(_mm256_set1_ps(M), _mm256_cvtepi32_ps(ai)), NULL);
            const __m256i take = _mm256_andnot_si256(_mm256_or_si256(off_six_bits(si), off_six_bits(ai)),
                                                     _mm256_castps_si256(_mm256_cmp_ps(e, best, _CMP_LT_OQ)));
            best = _mm256_blendv_ps(best, e, _mm256_castsi256_ps(take));
            sc = _mm256_blendv_epi8(sc, si, take);
            mn = _mm256_blendv_epi8(mn, ai, take);
        }
    __m256i ct[Q4K_G];
    codes_error(xt, _mm256_mul_ps(_mm256_set1_ps(D), _mm256_cvtepi32_ps(sc)),
                _mm256_mul_ps(_mm256_set1_ps(M), _mm256_cvtepi32_ps(mn)), ct);
    store_codes(ct, q);
    int32_t sci[Q4K_NG], mni[Q4K_NG];
    _mm256_storeu_si256((__m256i *)sci, sc);
    _mm256_storeu_si256((__m256i *)mni, mn);
    memcpy(head, h, 4);
    for (int j = 0; j < 4; j++) {
        head[4 + j] = (unsigned char)(sci[j] | (sci[j + 4] >> 4) << 6);
        head[8 + j] = (unsigned char)(mni[j] | (mni[j + 4] >> 4) << 6);
        head[12 + j] = (unsigned char)((sci[j + 4] & 15) | (mni[j + 4] & 15) << 4);
    }
    return true;
}
