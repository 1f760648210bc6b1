/* gemm_q4_k.c - the fast matrix product over Q4_K weights (ggml's block:
 * f16 d and dmin, 6-bit scales sc_j and minimums mn_j of 8 groups of 32,
 * 128 bytes of codes; runtime/core/tensor.h), AVX2 instructions for the
 * AVX2 kernel set (the AVX-512 set takes gemm_q4_k_avx512.c, the same
 * expression at twice the width, the same bits; the AMX sets, where the
 * processor has AMX-INT8, take gemm_q4_amx.c, bits of their own).
 *
 * Inputs: each row quantized to int8 blocks of 256 with one scale dy
 * (gemm_q8_k.h), so a weight block's whole dot is one exact integer: a
 * weight w = d sc_j q - dmin mn_j (q the 4-bit code) against an input
 * qx dy sums over the block to
 *   d dy (sum_j sc_j sum_{k in j} q_k qx_k) - dmin dy (sum_j mn_j s_j),
 * s_j the sum of group j's input codes (the stream's two sums of 16).  A
 * group of 32 weights against the input takes: half of a 32-byte load of
 * codes (byte i holds element i of group 2t low, of group 2t + 1 high), an
 * AND (and a shift), vpmaddubsw against the input's codes (unsigned codes
 * times int8, pairs summed to int16: at most 2 x 15 x 127, no
 * saturation), vpmaddwd by sc_j as int16 (one byte shuffle of the block's
 * 16 scale bytes) and an integer add: no conversion, no float operation.
 * The floats come once per block: the integer lanes converted and one FMA
 * by d dy, the minimums' lanes (vpmaddwd of mn_j, each twice, with the
 * 16 sums) and one FMA by -dmin dy.  The group's d_j = d sc_j and m_j are
 * never formed: the integers carry them exactly.
 *
 * Numerics: output n of row t accumulates 8 lanes over blocks in order:
 * acc = fma(float(S_l), d x dy, acc), then acc = fma(-float(M_l), dmin x
 * dy, acc), with S_l the exact sum over the block's 8 groups of sc_j
 * times the products of the 4 codes of lane l (elements 4l..4l+3 of each
 * group: at most 8 x 4 x 15 x 127 x 63 < 2^22, exact as float), M_l =
 * mn_l s_l (s_l the two sums of 16 of group l added), d x dy and dmin x dy each one fp32 product; then the fixed
 * horizontal sum moe_hsum8, then the bias.  So an output is the quantized
 * input row times the exactly dequantized weights, to fp32 rounding: its
 * difference from the reference (fp32 inputs) is sum w_k (x_k - qx_k
 * dy_k), at most sum |w_k| dy_k / 2, dy_k its block's (a block of 256 has
 * a larger dy than one of 32: the price of one float per block; llama.cpp
 * pays the same).  Every tile computes that expression, so a row gives
 * the same bits alone or in any batch, under both kernel sets (AVX2 here,
 * AVX-512 in gemm_q4_k_avx512.c). */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/gemm_q4_k.h"
#include "runtime/cpu/gemm_q8_k.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"


/* y[r*ldy + c] = input row r0 + r . weight row c (+ bias n + c) for r < R,
 * c < C: x the quantized rows (stride xs bytes, nb blocks each), w the
 * first weight row (stride wld); pf: the first pass over these weight
 * rows, which prefetches whole tiles at least PF bytes on.  Per block, each
 * weight row's scales are made once and each 32 bytes of codes unpacked
 * once for the R input rows, so the live registers are the R*C float
 * sums, the R*C integer sums of the block, the C rows' scales, one load
 * of codes and constants. */
AVX2 INLINE void tile(const int R, const int C, float *y, size_t ldy, const char *x, size_t xs, int r0, int nb,
                      const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    __m256 acc[MAXR][MAXC];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const char *xr = x + (size_t)r0 * xs;
    const float *dyr = (const float *)(xr + (size_t)nb * MOE_Q8_K_BYTES);
    const size_t tb = (size_t)C * wld, pfd = (PF + tb - 1) / tb * tb;
    for (int k = 0; k < nb; k++) {
        const size_t bo = (size_t)k * MOE_Q4_K_BYTES, xo = (size_t)k * MOE_Q8_K_BYTES;
        __m256i sc[MAXC], sum[MAXR][MAXC];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const char *blk = w + (size_t)c * wld + bo;
            if (pf)
                for (int l = 0; l < 3; l++) _mm_prefetch(blk + 64 * l + pfd, _MM_HINT_T0);
            sc[c] = block_scales(blk);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) sum[r][c] = _mm256_setzero_si256();
        }
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(w + (size_t)c * wld + bo + 16 + 32 * t));
                const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(15));
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15));
                const __m256i sl = group_scale(sc[c], 2 * t), sh = group_scale(sc[c], 2 * t + 1);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const char *xq = xr + (size_t)r * xs + xo + 32 + 64 * t;
                    const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_load_si256((const __m256i *)xq));
                    const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_load_si256((const __m256i *)(xq + 32)));
                    sum[r][c] = _mm256_add_epi32(sum[r][c],
                                                 _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh)));
                }
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const char *blk = w + (size_t)c * wld + bo;
            int32_t h;
            memcpy(&h, blk, 4);
            const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(h)); /* d, dmin */
            const __m256i mn = block_mins(sc[c]);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const char *xb = xr + (size_t)r * xs + xo;
                acc[r][c] = q4k_block_end(acc[r][c], sum[r][c], dm, mn, xb, dyr[(size_t)r * xs / sizeof(float) + k]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            y[(size_t)r * ldy + c] = moe_hsum8(acc[r][c]) + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
}

#define KQ_DTYPE MOE_DTYPE_Q4_K
#define KQ_ENTRY moe_gemm_rows_q4_k_avx2
#include "runtime/cpu/gemm_q8_k_rows.h"
