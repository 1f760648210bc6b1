/* gemm_q4.c - the fast matrix product over four-bit weights (Q4_1, Q4_G32,
 * Q4_G128: runtime/core/tensor.h), for both kernel sets (AVX2
 * instructions, which AVX-512 processors run too), built as gemm_q8.c is:
 * each input row is quantized to int8 blocks of 32 of its own, and each
 * block's dot with the weight codes is an exact integer sum.
 *
 * Why: widening four-bit codes to fp32 costs more instructions per weight
 * than the bytes save in memory traffic; here a run of 32 weights against
 * one input row takes about ten: a 16-byte broadcast, a shift of its upper
 * half by 4 and an AND (the 32 unsigned codes in element order: Q4_1's
 * byte j holds element j low and j + 16 high), vpmaddubsw (codes unsigned
 * times the input's int8 codes, pairs summed to int16: at most 2 x 15 x
 * 127, no saturation), vpmaddwd by ones (lane j: elements 4j..4j+3 as
 * int32), convert, the product of the two scales, an FMA, and an FMA for
 * the offset.  The weights' scale and offset are read once per group
 * (Q4_1: one 4-byte load widened by F16C gives both; Q4_G128: once per 4
 * runs).
 *
 * Input rows: per block of 32, int8 codes qx and a scale dx as gemm_q8.c
 * makes them (moe_quantize_x_q8, simd_avx2.h: |x - qx dx| <= dx / 2; a
 * NaN or an infinity makes dx NaN), and per lane j the sum of the block's
 * codes over elements 4j..4j+3 times dx (exact integer sum, one rounding),
 * s_j.  The offset term of a weight group is m x (the sum of the quantized
 * inputs), not m x (the sum of the fp32 inputs): an output is then the
 * product of the quantized input row with the exactly dequantized weights
 * w = q d + m, and its error from the reference (fp32 inputs) is the sum
 * of w_k (x_k - qx_k dx_k), at most sum |w_k| dx_k / 2.  With the exact
 * fp32 sum of x instead the error would be the sum of (q_k d)(x_k - qx_k
 * dx_k): no offset in it, but q d = w - m runs from 0 to max - min rather
 * than from min to max, so for weights centred on zero (m near -max) it
 * is about twice as large.  Both cost the same (the sums are made once
 * per input row per call).
 *
 * Numerics: output n of row t accumulates, over runs k (32 elements) in
 * order, in lane j: acc = fma(float(isum_kj), d_k x dx_k, acc), then acc =
 * fma(s_kj, m_k, acc); then the fixed horizontal sum moe_hsum8, then the
 * bias.  The integer sums are exact, so the only differences from the
 * reference are the input rounding above and fp32 rounding.  Every tile
 * computes that same expression, so a row gives the same bits alone or in
 * any batch, and both kernel sets the same bits.  The rows of up to TBQ
 * inputs are quantized into the calling thread's buffer
 * (moe_gemm_thread_buffer) on each call, once for all its weight rows. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum {
    RUN = 32,  /* elements per run of 16 code bytes (and per input block) */
    TBQ = 64,  /* input rows quantized at a time */
    MAXC = 8,  /* widest tile: weight rows for one input row */
};

/* The quantized input rows of a call: codes (row stride Din), scales dx
 * (row stride nb) and the lane sums s (8 per block, row stride 8 nb). */
struct xq {
    const int8_t *q;
    const float *d, *s;
    int Din, nb;
};

/* The scale and offset of the group at g, broadcast. */
AVX2 INLINE void group_head(const char *g, const enum moe_dtype dt, __m256 *d, __m256 *m)
{
    if (dt == MOE_DTYPE_Q4_1) {
        int32_t h;
        memcpy(&h, g, 4);
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(h)); /* d, m, 0, 0: exact */
        *d = _mm256_broadcastss_ps(dm);
        *m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    } else {
        *d = _mm256_broadcast_ss((const float *)g);
        *m = _mm256_broadcast_ss((const float *)g + 1);
    }
}

/* The 32 codes of the run at qs as unsigned bytes in element order: the 16
 * bytes in both halves, the upper half shifted right by 4, masked. */
AVX2 INLINE __m256i run_codes(const char *qs)
{
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

/* acc + run k of weight codes wq (scale wd, offset wm broadcast) against
 * input row r's block k: one run's two terms. */
AVX2 INLINE __m256 run_fma(__m256 acc, __m256i wq, __m256 wd, __m256 wm, const struct xq *x, int r, int k)
{
    const __m256i xq = _mm256_loadu_si256((const __m256i *)(x->q + (size_t)r * x->Din + (size_t)k * RUN));
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), _mm256_set1_epi16(1));
    const __m256 dx = _mm256_broadcast_ss(x->d + (size_t)r * x->nb + k);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(wd, dx), acc);
    return _mm256_fmadd_ps(_mm256_loadu_ps(x->s + ((size_t)r * x->nb + k) * 8), wm, acc);
}

/* y[r*ldy + c] = input row r0 + r . weight row c (+ bias n + c) for r < R,
 * c < C; w the first weight row (stride wld); pf: the first pass over these
 * weight rows, which prefetches the next tile's (C rows on, as gemm_q8.c
 * does).  Per group, each weight row's head is read once and each of its
 * runs unpacked once for the R input rows, so the live registers are the
 * R*C sums, one row's d, m and codes, and constants. */
AVX2 INLINE void tile(const enum moe_dtype dt, const int R, const int C, float *y, size_t ldy, const struct xq *x,
                      int r0, const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    const int NR = dt == MOE_DTYPE_Q4_G128 ? 4 : 1, HB = dt == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD;
    const size_t GB = (size_t)HB + 16 * (size_t)NR;
    const int ng = x->Din / (RUN * NR);
    __m256 acc[4][MAXC];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const char *grp = w + (size_t)c * wld + (size_t)g * GB;
            __m256 wd, wm;
            group_head(grp, dt, &wd, &wm);
#pragma GCC unroll 4
            for (int k = 0; k < NR; k++) {
                if (pf) _mm_prefetch(grp + HB + 16 * k + (size_t)C * wld, _MM_HINT_T1);
                const __m256i wq = run_codes(grp + HB + 16 * k);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) acc[r][c] = run_fma(acc[r][c], wq, wd, wm, x, r0 + r, g * NR + k);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            y[(size_t)r * ldy + c] = moe_hsum8(acc[r][c]) + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
}

/* R rows (1..3) against weight rows [n0, n1), C at a time then one by one;
 * w points at row n0. */
AVX2 INLINE void row_tiles(const enum moe_dtype dt, const int R, const int C, float *y, size_t ldy,
                           const struct xq *x, const char *w, size_t wld, int n0, int n1,
                           const struct moe_tensor *b)
{
    int n = n0;
    for (; n + C <= n1; n += C) tile(dt, R, C, y + n, ldy, x, 0, w + (size_t)(n - n0) * wld, wld, b, n, true);
    for (; n < n1; n++) tile(dt, R, 1, y + n, ldy, x, 0, w + (size_t)(n - n0) * wld, wld, b, n, true);
}

/* tn (1..TBQ) quantized rows against weight rows [n0, n1) of dtype dt. */
AVX2 INLINE void rows_dt(const enum moe_dtype dt, float *y, size_t ldy, const struct xq *x, int tn, const char *w,
                         size_t wld, int n0, int n1, const struct moe_tensor *b)
{
    enum { C4 = 2 }; /* weight rows of a 4-input tile: 8 accumulators */
    switch (tn) {
    case 1: row_tiles(dt, 1, 8, y, ldy, x, w, wld, n0, n1, b); return;
    case 2: row_tiles(dt, 2, 4, y, ldy, x, w, wld, n0, n1, b); return;
    case 3: row_tiles(dt, 3, 3, y, ldy, x, w, wld, n0, n1, b); return;
    default: break;
    }
    /* each group of C4 weight rows (in L1) against every 4-row tile, then
     * the last 1-3 rows one at a time */
    const int t4 = tn & ~3;
    for (int n = n0; n < n1; n += C4) {
        const bool full = n + C4 <= n1;
        const char *wn = w + (size_t)(n - n0) * wld;
        for (int t = 0; t < tn; t += t < t4 ? 4 : 1) {
            float *yt = y + (size_t)t * ldy + n;
            if (t < t4 && full)
                tile(dt, 4, C4, yt, ldy, x, t, wn, wld, b, n, t == 0);
            else if (t < t4)
                tile(dt, 4, 1, yt, ldy, x, t, wn, wld, b, n, t == 0);
            else if (full)
                tile(dt, 1, C4, yt, ldy, x, t, wn, wld, b, n, t == 0);
            else
                tile(dt, 1, 1, yt, ldy, x, t, wn, wld, b, n, t == 0);
        }
    }
}

/* Input row x (nb blocks) quantized: codes q, scales d, lane sums s. */
AVX2 static void quantize_input(int8_t *q, float *d, float *s, const float *x, int nb)
{
    moe_quantize_x_q8(q, d, x, nb);
    for (int k = 0; k < nb; k++) {
        const __m256i c = _mm256_loadu_si256((const __m256i *)(q + (size_t)k * RUN));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), c), _mm256_set1_epi16(1));
        _mm256_storeu_ps(s + (size_t)k * 8, _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d[k])));
    }
}

AVX2 void moe_gemm_rows_q4_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *wv,
                                enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(moe_dtype_is_q4(wt) && Din % moe_q4_group(wt) == 0);
    const int nb = Din / RUN;
    const size_t wld = moe_dtype_row_bytes(wt, (size_t)Din);
    const int rows = T < TBQ ? T : TBQ;
    /* codes first (32-byte multiples per row), then the lane sums, then
     * the scales (Din / 4 + 8 nb + nb floats a row: Din <= INT32_MAX keeps
     * it in size_t) */
    float *buf = moe_gemm_thread_buffer((size_t)rows * ((size_t)Din / 4 + 9 * (size_t)nb));
    MOE_ASSERT(buf && "gemm_fast: out of memory for the quantized input rows");
    int8_t *q = (int8_t *)buf;
    float *s = buf + (size_t)rows * Din / 4, *d = s + (size_t)rows * 8 * nb;
    const struct xq xr = {.q = q, .d = d, .s = s, .Din = Din, .nb = nb};
    const char *w = (const char *)wv + (size_t)n0 * wld;
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TBQ) {
        const int tn = T - t0 < TBQ ? T - t0 : TBQ;
        for (int t = 0; t < tn; t++)
            quantize_input(q + (size_t)t * Din, d + (size_t)t * nb, s + (size_t)t * 8 * nb,
                           x + (size_t)(t0 + t) * ldx, nb);
        float *yb = y + (size_t)t0 * ldy;
        switch (wt) {
        case MOE_DTYPE_Q4_1: rows_dt(MOE_DTYPE_Q4_1, yb, ldy, &xr, tn, w, wld, n0, n1, b); break;
        case MOE_DTYPE_Q4_G32: rows_dt(MOE_DTYPE_Q4_G32, yb, ldy, &xr, tn, w, wld, n0, n1, b); break;
        default: rows_dt(MOE_DTYPE_Q4_G128, yb, ldy, &xr, tn, w, wld, n0, n1, b); break;
        }
    }
}
