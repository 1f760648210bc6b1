/* gemm_q4.c - the fast matrix product over four-bit weights (Q4_1, Q4_G32,
 * Q4_G128: runtime/core/tensor.h), for both kernel sets (AVX2
 * instructions, which AVX-512 processors run too), built as gemm_q8.c is:
 * each input row is quantized to int8 blocks of 32 of its own, and each
 * block's dot with the weight codes is an exact integer sum.
 *
 * Why: widening four-bit codes to fp32 (extend, convert, scale and
 * offset, FMA) leaves the product compute bound at well under the memory
 * bandwidth it could use.  Here a run of 32 weights against one input row
 * takes a 16-byte broadcast load, a shift of its upper half by 4 and an
 * AND (the 32 unsigned codes in element order: byte j holds element j low
 * and j + 16 high), vpmaddubsw (codes unsigned times the input's int8
 * codes, pairs summed to int16: at most 2 x 15 x 127, no saturation),
 * vpmaddwd by ones (lane j: elements 4j..4j+3 as int32), convert, the
 * product of the two scales and an FMA; the offset costs one FMA per
 * group.  A group's head is read once per weight row and group (Q4_1: one
 * 4-byte load widened by F16C gives d and m; Q4_G128: once per 4 runs).
 *
 * Input rows: per block of 32, int8 codes qx and a scale dx as gemm_q8.c
 * makes them (moe_quantize_x_q8, simd_avx2.h: |x - qx dx| <= dx / 2; a
 * NaN or an infinity makes dx NaN), and per weight group S, the sum over
 * its blocks in order of dx x (the block's integer code sum), one rounding
 * a step.  The offset term of a group is m S, m times the sum of the
 * quantized inputs, not of the fp32 inputs: an output is then the product
 * of the quantized input row with the exactly dequantized weights w = q d
 * + m, and its error from the reference (fp32 inputs) is the sum of w_k
 * (x_k - qx_k dx_k), at most sum |w_k| dx_k / 2.  With the exact fp32 sum
 * of x instead the error would be the sum of (q_k d)(x_k - qx_k dx_k): no
 * offset in it, but q d = w - m runs from 0 to max - min rather than
 * from min to max, so for weights centred on zero (m near -2 sigma for
 * Gaussian ones) its spread is about sqrt(5) times larger.  Both cost the
 * same (made once per input row and call).  Each row's codes, dx and S
 * are laid out group by group in one stream (struct xq), so a tile of 4
 * input rows addresses 4 streams.
 *
 * Numerics: output n of row t accumulates in lane j, over groups in
 * order, each run k of the group: acc = fma(float(isum_kj), d x dx_k,
 * acc), then the group's offset: acc = fma((0, S, dx_0, ...)_j, (d, m, 0,
 * ...)_j, acc) (m S in lane 1, exact zeros elsewhere: d is finite); then
 * the fixed horizontal sum moe_hsum8, then the bias.  The integer sums are
 * exact, so the only differences from the reference are the input
 * rounding above and fp32 rounding.  Every tile computes that same
 * expression, so a row gives the same bits alone or in any batch, and
 * both kernel sets the same bits.  The rows of up to TBQ inputs are
 * quantized into the calling thread's buffer (moe_gemm_thread_buffer) on
 * each call, once for all its weight rows. */
#include <immintrin.h>
#include <math.h>
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

/* The quantized input rows of a call, one stream per row (stride rs
 * bytes): per weight group of NR runs, 32 bytes of head (0, S, dx_0 ..
 * dx_{NR-1}, 0, ...) as floats, then the NR blocks' 32 codes each. */
struct xq {
    const char *p;
    size_t rs;
};

/* The head of the group at g as the vector h = (d, m, 0, ...) and the
 * scale d broadcast.  Q4_1: one 4-byte load widened by F16C (exact). */
AVX2 INLINE void group_head(const char *g, const enum moe_dtype dt, __m256 *h, __m256 *d)
{
    if (dt == MOE_DTYPE_Q4_1) {
        int32_t v;
        memcpy(&v, g, 4);
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(v));
        *h = _mm256_zextps128_ps256(dm);
        *d = _mm256_broadcastss_ps(dm);
    } else {
        *h = _mm256_zextps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)g)));
        *d = _mm256_broadcast_ss((const float *)g);
    }
}

/* The 32 codes of the run at qs as unsigned bytes in element order: the 16
 * bytes in both halves, the upper half shifted right by 4, masked. */
AVX2 INLINE __m256i run_codes(const char *qs)
{
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

/* acc + the integer dot of weight codes wq (scale wd broadcast) with run k
 * of an input row's group xg, times wd x dx_k: one run's term. */
AVX2 INLINE __m256 run_fma(__m256 acc, __m256i wq, __m256 wd, const char *xg, int k)
{
    const __m256i xq = _mm256_load_si256((const __m256i *)(xg + 32 + 32 * k));
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), _mm256_set1_epi16(1));
    const __m256 dx = _mm256_broadcast_ss((const float *)xg + 2 + k);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(wd, dx), acc);
}

/* acc + the weights' head h = (d, m, 0, ...) times the input group's head
 * (0, S, dx_0, ...): m S in lane 1, 0 elsewhere (d is finite; a NaN dx
 * makes NaN, as the row's other terms do), the group's offset term. */
AVX2 INLINE __m256 head_fma(__m256 acc, __m256 h, const char *xg)
{
    return _mm256_fmadd_ps(_mm256_load_ps((const float *)xg), h, acc);
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
    const size_t XG = 32 + 32 * (size_t)NR; /* input bytes per group */
    const int ng = (int)(x->rs / XG);
    __m256 acc[4][MAXC];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    /* one prefetch per weight row and group of at most 64 bytes: every
     * cache line of the next tile's rows gets one (Q4_1: every third
     * group of 20 bytes, Q4_G32 every second of 24, Q4_G128 two a group
     * of 72) */
    const int pf_every = dt == MOE_DTYPE_Q4_1 ? 3 : dt == MOE_DTYPE_Q4_G32 ? 2 : 1;
    for (int g = 0, pg = 0; g < ng; g++, pg = pg + 1 == pf_every ? 0 : pg + 1) {
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const char *grp = w + (size_t)c * wld + (size_t)g * GB;
            __m256 h, wd;
            group_head(grp, dt, &h, &wd);
#pragma GCC unroll 4
            for (int k = 0; k < NR; k++) {
                if (pf && pg == 0 && (k == 0 || k == NR - 1))
                    _mm_prefetch(grp + (k ? GB - 1 : 0) + (size_t)C * wld, _MM_HINT_T1);
                const __m256i wq = run_codes(grp + HB + 16 * k);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++)
                    acc[r][c] = run_fma(acc[r][c], wq, wd, x->p + (size_t)(r0 + r) * x->rs + (size_t)g * XG, k);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = head_fma(acc[r][c], h, x->p + (size_t)(r0 + r) * x->rs + (size_t)g * XG);
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

/* Input row x (ng groups of nr blocks) into its stream o (struct xq): each
 * block quantized by moe_quantize_x_q8, and S the sum over the group's
 * blocks in order of dx x (the block's code sum), each step one rounding. */
AVX2 static void quantize_input(char *o, const float *x, int ng, int nr)
{
    for (int g = 0; g < ng; g++, o += 32 + 32 * nr) {
        float *h = (float *)o, S = 0.0f;
        _mm256_store_ps(h, _mm256_setzero_ps());
        for (int k = 0; k < nr; k++) {
            int8_t *q = (int8_t *)o + 32 + 32 * k;
            moe_quantize_x_q8(q, h + 2 + k, x + (size_t)(g * nr + k) * RUN, 1);
            const __m256i c = _mm256_load_si256((const __m256i *)q);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), c), _mm256_set1_epi16(1));
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
            S = fmaf(h[2 + k], (float)_mm_cvtsi128_si32(t), S);
        }
        h[1] = S;
    }
}

AVX2 void moe_gemm_rows_q4_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *wv,
                                enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(moe_dtype_is_q4(wt) && Din % moe_q4_group(wt) == 0);
    const int nr = moe_q4_group(wt) / RUN, ng = Din / RUN / nr;
    const size_t wld = moe_dtype_row_bytes(wt, (size_t)Din);
    const int rows = T < TBQ ? T : TBQ;
    /* a row's stream: per group 32 + 32 nr bytes, Din + 32 ng in all
     * (Din <= INT32_MAX: no overflow); 64-byte aligned */
    const size_t rs = (size_t)Din + 32 * (size_t)ng;
    char *buf = (char *)moe_gemm_thread_buffer((size_t)rows * rs / sizeof(float));
    MOE_ASSERT(buf && "gemm_fast: out of memory for the quantized input rows");
    const struct xq xr = {.p = buf, .rs = rs};
    const char *w = (const char *)wv + (size_t)n0 * wld;
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TBQ) {
        const int tn = T - t0 < TBQ ? T - t0 : TBQ;
        for (int t = 0; t < tn; t++) quantize_input(buf + (size_t)t * rs, x + (size_t)(t0 + t) * ldx, ng, nr);
        float *yb = y + (size_t)t0 * ldy;
        switch (wt) {
        case MOE_DTYPE_Q4_1: rows_dt(MOE_DTYPE_Q4_1, yb, ldy, &xr, tn, w, wld, n0, n1, b); break;
        case MOE_DTYPE_Q4_G32: rows_dt(MOE_DTYPE_Q4_G32, yb, ldy, &xr, tn, w, wld, n0, n1, b); break;
        default: rows_dt(MOE_DTYPE_Q4_G128, yb, ldy, &xr, tn, w, wld, n0, n1, b); break;
        }
    }
}
