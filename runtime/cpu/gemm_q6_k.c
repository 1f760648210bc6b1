/* gemm_q6_k.c - the fast matrix product over Q6_K weights
 * (MOE_DTYPE_Q6_K, runtime/core/tensor.h), AVX2 instructions for every
 * kernel set (AVX-512 and AMX processors run them too), built as the
 * four-bit kernels are (gemm_q4.c): each input row is quantized to int8
 * blocks of 32 of its own, and each run of 32 weights against an input
 * block is an exact integer sum.
 *
 * A run of 32 weights (elements 32r .. 32r+31 of a block, r = 4h + j: half
 * h, quarter j) against one input block takes: its codes in element order
 * as unsigned bytes 0..63, from the 32 ql bytes at 64h + 32 (j & 1) (the
 * low nibbles for j < 2, else the high ones) and the 2 bits j of the 32
 * qh bytes at 128 + 32h, shifted to bits 4-5 (an AND, a shift, an OR);
 * vpmaddubsw of the codes with the input's int8 codes (pairs summed to
 * int16: at most 2 x 63 x 127, no saturation), minus the same of 32 with
 * the input's codes (the -32 of each code; the difference is the exact
 * pair sum of (q - 32) x, at most 2 x 32 x 127 in magnitude), vpmaddwd with
 * the run's two int16 sub-block scales (lanes 0-3 of the result hold
 * sub-block 2r's 16 elements, lanes 4-7 sub-block 2r+1's; each lane at
 * most 4 x 32 x 127 x 128 < 2^24, so exact as fp32), convert, and an FMA
 * by d x dx.  The 32 x codes part is the input's alone: it is made once
 * per input block when the row is quantized and stored beside its codes.
 * The scales reach their lanes by one byte shuffle of the block's 16
 * scale bytes and a sign extension, per run and weight row.
 *
 * Input rows: per block of 32, int8 codes qx and a scale dx as
 * moe_quantize_x_q8 makes them (simd_avx2.h: |x - qx dx| <= dx / 2; a NaN
 * or an infinity makes dx NaN, so every output of that row is NaN).  A
 * row's stream: per block 64 bytes (its 32 codes, then the 16 int16 pair
 * sums of 32 x codes), then the row's dx, one float a block.
 *
 * Numerics: output n of row t accumulates in lane l, over blocks in order
 * and their 8 runs in order: acc = fma(float(isum_rl), d x dx_r, acc),
 * isum_rl the exact integer sum of sc (q - 32) qx over the 4 elements of
 * lane l; then the fixed horizontal sum moe_hsum8, then the bias.  So an
 * output is the product of the quantized input row with the weights d sc
 * (q - 32), to fp32 rounding: its difference from the reference (fp32
 * inputs, the weights dequantized) is sum w_k (x_k - qx_k dx_k), at most
 * sum |w_k| dx_k / 2, plus fp32 rounding.  Every tile computes that same
 * expression, so a row gives the same bits alone or in any batch, under
 * every kernel set.  The rows of up to TBQ inputs are quantized into the
 * calling thread's buffer (moe_gemm_thread_buffer) on each call, once for
 * all its weight rows. */
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
    RUN = 32,   /* elements per run (and per input block) */
    XB = 64,    /* stream bytes per input block: 32 codes, 16 int16 */
    TBQ = 64,   /* input rows quantized at a time */
    MAXC = 8,   /* widest tile: weight rows for one input row */
    QH = 128,   /* block offsets: qh, the scales, d */
    SC = 192,
    DH = 208,
};

/* Input row x (nb blocks of 32) into its stream o (above). */
AVX2 static void quantize_input(char *o, const float *x, int nb)
{
    float *dx = (float *)(o + (size_t)nb * XB);
    for (int k = 0; k < nb; k++) {
        char *blk = o + (size_t)k * XB;
        moe_quantize_x_q8((int8_t *)blk, dx + k, x + (size_t)k * RUN, 1);
        const __m256i c = _mm256_load_si256((const __m256i *)blk);
        _mm256_store_si256((__m256i *)(blk + 32), _mm256_maddubs_epi16(_mm256_set1_epi8(32), c));
    }
}

/* The 32 codes (0..63, element order) of run 4h + j of a block whose
 * half h has its ql bytes at ql and qh bytes at qh. */
AVX2 INLINE __m256i run_codes(const char *ql, const char *qh, const int j)
{
    const __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * (j & 1)));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    const __m256i lo = _mm256_and_si256(j < 2 ? l : _mm256_srli_epi16(l, 4), _mm256_set1_epi8(15));
    const __m256i hb = j == 0 ? _mm256_slli_epi16(h, 4) : j == 1 ? _mm256_slli_epi16(h, 2)
                     : j == 2 ? h : _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
}

/* The int16 scales of half h of the block whose 16 scale bytes are at
 * sc: sub-blocks 8h .. 8h+7 in lanes 0-7 and again in lanes 8-15. */
AVX2 INLINE __m256i half_scales(const char *sc, const int h)
{
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
    return _mm256_permute2x128_si256(s, s, h ? 0x11 : 0x00);
}

/* The int16 scales of run 4h + j from its half's (half_scales): sub-block
 * 8h + 2j in lanes 0-7, 8h + 2j + 1 in lanes 8-15. */
AVX2 INLINE __m256i run_scales(__m256i hs, const int j)
{
    const char a = (char)(4 * j), b = (char)(4 * j + 1), c = (char)(4 * j + 2), d = (char)(4 * j + 3);
    return _mm256_shuffle_epi8(hs, _mm256_setr_epi8(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b,
                                                    c, d, c, d, c, d, c, d, c, d, c, d, c, d, c, d));
}

/* acc + (the run's codes wq against input block xb, scales sv) x wdx: one
 * run's term. */
AVX2 INLINE __m256 run_fma(__m256 acc, __m256i wq, __m256i sv, const char *xb, __m256 wdx)
{
    const __m256i xq = _mm256_load_si256((const __m256i *)xb);
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(wq, xq), _mm256_load_si256((const __m256i *)(xb + 32)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, sv)), wdx, acc);
}

/* y[r*ldy + c] = input row r0 + r . weight row c (+ bias n + c) for r < R,
 * c < C: x the quantized rows (stride xs bytes, nb blocks each), w the
 * first weight row (stride wld); pf: the first pass over these weight
 * rows, which prefetches the next tile's (C rows on).  Per run, each
 * weight row's codes and scales are made once for the R input rows, so
 * the live registers are the R*C sums, one row's codes and scales, and
 * constants. */
AVX2 INLINE void tile(const int R, const int C, float *y, size_t ldy, const char *x, size_t xs, int r0, int nb,
                      const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    __m256 acc[4][MAXC];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const char *xr = x + (size_t)r0 * xs;
    const float *dxr = (const float *)(xr + (size_t)nb * XB);
    for (int k = 0; k < nb / 8; k++) {
        const size_t bo = (size_t)k * MOE_Q6_K_BYTES;
        /* d x dx of each weight row, input row and run of the block */
        _Alignas(32) float wdx[4][MAXC][8];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const char *blk = w + (size_t)c * wld + bo;
            if (pf)
                for (int l = 0; l < 4; l++) _mm_prefetch(blk + 64 * l + (size_t)C * wld, _MM_HINT_T1);
            uint16_t h;
            memcpy(&h, blk + DH, 2);
            const __m256 d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                _mm256_store_ps(wdx[r][c], _mm256_mul_ps(d, _mm256_loadu_ps(dxr + (size_t)r * xs / 4 + 8 * k)));
        }
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; hf++) {
            __m256i hs[MAXC];
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) hs[c] = half_scales(w + (size_t)c * wld + bo + SC, hf);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const size_t xo = (size_t)(8 * k + 4 * hf + j) * XB;
#pragma GCC unroll 8
                for (int c = 0; c < C; c++) {
                    const char *blk = w + (size_t)c * wld + bo;
                    const __m256i wq = run_codes(blk + 64 * hf, blk + QH + 32 * hf, j);
                    const __m256i sv = run_scales(hs[c], j);
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++)
                        acc[r][c] = run_fma(acc[r][c], wq, sv, xr + (size_t)r * xs + xo,
                                            _mm256_broadcast_ss(&wdx[r][c][4 * hf + j]));
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            y[(size_t)r * ldy + c] = moe_hsum8(acc[r][c]) + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
}

/* R rows (1..3) against weight rows [n0, n1), C at a time then one by one;
 * w points at row n0. */
AVX2 INLINE void row_tiles(const int R, const int C, float *y, size_t ldy, const char *x, size_t xs, int nb,
                           const char *w, size_t wld, int n0, int n1, const struct moe_tensor *b)
{
    int n = n0;
    for (; n + C <= n1; n += C) tile(R, C, y + n, ldy, x, xs, 0, nb, w + (size_t)(n - n0) * wld, wld, b, n, true);
    for (; n < n1; n++) tile(R, 1, y + n, ldy, x, xs, 0, nb, w + (size_t)(n - n0) * wld, wld, b, n, true);
}

/* tn (1..TBQ) quantized rows against weight rows [n0, n1). */
AVX2 static void rows_tn(float *y, size_t ldy, const char *x, size_t xs, int tn, int nb, const char *w, size_t wld,
                         int n0, int n1, const struct moe_tensor *b)
{
    enum { C4 = 2 }; /* weight rows of a 4-input tile: 8 accumulators */
    switch (tn) {
    case 1: row_tiles(1, 4, y, ldy, x, xs, nb, w, wld, n0, n1, b); return;
    case 2: row_tiles(2, 4, y, ldy, x, xs, nb, w, wld, n0, n1, b); return;
    case 3: row_tiles(3, 3, y, ldy, x, xs, nb, w, wld, n0, n1, b); return;
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
            if (t < t4 && full) tile(4, C4, yt, ldy, x, xs, t, nb, wn, wld, b, n, t == 0);
            else if (t < t4) tile(4, 1, yt, ldy, x, xs, t, nb, wn, wld, b, n, t == 0);
            else if (full) tile(1, C4, yt, ldy, x, xs, t, nb, wn, wld, b, n, t == 0);
            else tile(1, 1, yt, ldy, x, xs, t, nb, wn, wld, b, n, t == 0);
        }
    }
}

AVX2 void moe_gemm_rows_q6_k_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w, int Din,
                                  int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(Din > 0 && Din % MOE_Q6_K_BLOCK == 0);
    const int nb = Din / RUN;
    const size_t wld = moe_dtype_row_bytes(MOE_DTYPE_Q6_K, (size_t)Din);
    const int rows = T < TBQ ? T : TBQ;
    /* a row's stream: 64 bytes and a float per block, 68 nb in all (nb <
     * 2^26: no overflow), rounded up to 64 bytes */
    const size_t xs = ((size_t)nb * (XB + 4) + 63) / 64 * 64;
    size_t bytes;
    const bool sized = moe_mul_size((size_t)rows, xs, &bytes);
    MOE_ASSERT(sized && "gemm_fast: the quantized input rows' size overflows");
    char *buf = (char *)moe_gemm_thread_buffer(bytes / sizeof(float));
    MOE_ASSERT(buf && "gemm_fast: out of memory for the quantized input rows");
    const char *wr = (const char *)w + (size_t)n0 * wld;
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TBQ) {
        const int tn = T - t0 < TBQ ? T - t0 : TBQ;
        for (int t = 0; t < tn; t++) quantize_input(buf + (size_t)t * xs, x + (size_t)(t0 + t) * ldx, nb);
        rows_tn(y + (size_t)t0 * ldy, ldy, buf, xs, tn, nb, wr, wld, n0, n1, b);
    }
}
