/* gemm_q6_k.c - the fast matrix product over Q6_K weights
 * (MOE_DTYPE_Q6_K, runtime/core/tensor.h), AVX2 instructions for the
 * AVX2 kernel set (the others take gemm_q6_k_avx512.c: the same
 * expression at twice the width, the same bits), built as the Q4_K
 * kernel is (gemm_q4_k.c): each input row is quantized to int8 blocks of
 * 256 with one scale dy (gemm_q8_k.h), so a weight block's whole dot is
 * one exact integer.  A weight w = d sc_s (q - 32) (q the 6-bit code,
 * sc_s the int8 scale of its sub-block of 16) against an input qx dy sums
 * over the block to d dy (sum_s sc_s sum_{k in s} q_k qx_k - 32 sum_s
 * sc_s t_s), t_s the sum of sub-block s's input codes (the stream's sums
 * of 16).
 *
 * A run of 32 weights (elements 32r .. 32r+31 of a block, r = 4h + j: half
 * h, quarter j) against the input takes: its codes in element order as
 * unsigned bytes 0..63, from the 32 ql bytes at 64h + 32 (j & 1) (the
 * low nibbles for j < 2, else the high ones) and the 2 bits j of the 32
 * qh bytes at 128 + 32h, shifted to bits 4-5 (an AND, a shift, an OR);
 * vpmaddubsw with the input's int8 codes (pairs summed to int16: at most
 * 2 x 63 x 127, no saturation), vpmaddwd with the run's two int16
 * sub-block scales (lanes 0-3 of the result hold sub-block 2r's 16
 * elements, lanes 4-7 sub-block 2r+1's; one byte shuffle of the
 * half-block's widened scales) and an integer add.  Once per block: the
 * scales against the 16 input sums (vpmaddwd), times 32 (a shift),
 * subtracted, converted, and one FMA by d x dy.
 *
 * Numerics: output n of row t accumulates over blocks in order acc =
 * fma(float(S - 32 O), d x dy, acc), S the block's exact sum of sc q qx
 * over its 256 elements (at most 256 x 63 x 127 x 128 < 2^28 in
 * magnitude), O = sum_s sc_s t_s (at most 16 x 128 x 2032), S - 32 O
 * exact in int32 and rounded once to fp32 (it may pass 2^24), d x dy one
 * fp32 product; then the bias.  So an output is the
 * product of the quantized input row with the weights d sc (q - 32), to
 * fp32 rounding: its difference from the reference (fp32 inputs, the
 * weights dequantized) is sum w_k (x_k - qx_k dy_k), at most sum |w_k|
 * dy_k / 2, plus fp32 rounding.  Every tile computes that same
 * expression, and so do the AVX-512 set's prefill panels (gemm_k_panel.h),
 * so a row gives the same bits alone or in any batch, under
 * every kernel set.  The rows of up to TBQ inputs are quantized into the
 * calling thread's buffer (moe_gemm_thread_buffer) on each call, once for
 * all its weight rows. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/lane_sums.h"
#include "runtime/cpu/gemm_q6_k.h"
#include "runtime/cpu/gemm_q8_k.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"


/* The 32 codes (0..63, element order) of run 4h + j of a block: l its
 * half's 32 ql bytes at 64h + 32 (j & 1), h its half's 32 qh bytes (each
 * loaded once per half and weight row for the 4 runs). */
AVX2 INLINE __m256i run_codes_of(const __m256i l, const __m256i h, const int j)
{
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

/* y[r*ldy + c] = input row r0 + r . weight row c (+ bias n + c) for r < R,
 * c < C: x the quantized rows (stride xs bytes, nb blocks of 256 each), w
 * the first weight row (stride wld); pf: the first pass over these weight
 * rows, which prefetches whole tiles at least PF bytes on.  Per run, each
 * weight row's codes and scales are made once for the R input rows, so
 * the live registers are the R*C float sums, the R*C integer sums of the
 * block, one row's codes and scales, and constants. */
AVX2 INLINE void tile(const int R, const int C, float *y, size_t ldy, const char *x, size_t xs, int r0, int nb,
                      const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    __m128 acc1 = _mm_setzero_ps(); /* R = 1: the C rows' sums in lanes */
    __m256 accv = _mm256_setzero_ps(); /* R > 1: output (r, c) in lane r C + c */
    const char *xr = x + (size_t)r0 * xs;
    const float *dyr = (const float *)(xr + (size_t)nb * MOE_Q8_K_BYTES);
    const size_t tb = (size_t)C * wld, pfd = (PF + tb - 1) / tb * tb;
    for (int k = 0; k < nb; k++) {
        const size_t bo = (size_t)k * MOE_Q6_K_BYTES, xo = (size_t)k * MOE_Q8_K_BYTES;
        __m256i sum[MAXR][MAXC];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            if (pf)
                for (int l = 0; l < 4; l++) _mm_prefetch(w + (size_t)c * wld + bo + 64 * l + pfd, _MM_HINT_T0);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) sum[r][c] = _mm256_setzero_si256();
        }
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; hf++) {
            __m256i hs[MAXC], l0[MAXC], l1[MAXC], qh[MAXC];
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const char *blk = w + (size_t)c * wld + bo;
                hs[c] = half_scales(blk + SC, hf);
                l0[c] = _mm256_loadu_si256((const __m256i *)(blk + 64 * hf));
                l1[c] = _mm256_loadu_si256((const __m256i *)(blk + 64 * hf + 32));
                qh[c] = _mm256_loadu_si256((const __m256i *)(blk + QH + 32 * hf));
            }
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const size_t qo = xo + 32 + 32 * (size_t)(4 * hf + j);
#pragma GCC unroll 4
                for (int c = 0; c < C; c++) {
                    const __m256i wq = run_codes_of(j & 1 ? l1[c] : l0[c], qh[c], j);
                    const __m256i sv = run_scales(hs[c], j);
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++) {
                        const __m256i xq = _mm256_load_si256((const __m256i *)(xr + (size_t)r * xs + qo));
                        sum[r][c] = _mm256_add_epi32(sum[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), sv));
                    }
                }
            }
        }
        /* output (r, c)'s integer lanes: s8[r C + c] */
        __m256i s8[8];
#pragma GCC unroll 8
        for (int o = 0; o < 8; o++) s8[o] = o < R * C ? sum[o / C][o % C] : _mm256_setzero_si256();
        if (R == 1) acc1 = q6k_block_end_row(acc1, s8, C, w, wld, bo, xr + xo, dyr[k]);
        else accv = q6k_block_end(accv, s8, R, C, w, wld, bo, xr, xs, xo, dyr, k);
    }
    moe_tile_out(y, ldy, R, C, acc1, accv, b, n);
}

#define KQ_DTYPE MOE_DTYPE_Q6_K
#define KQ_ENTRY moe_gemm_rows_q6_k_avx2
#include "runtime/cpu/gemm_q8_k_rows.h"
