/* gemm_q5_k.c - the fast matrix product over Q5_K weights (MOE_DTYPE_Q5_K,
 * runtime/core/tensor.h: Q4_K's head and nibbles, and 32 bytes qh whose
 * bit j of byte l is the fifth bit of element 32j + l), AVX2 instructions
 * for the AVX2 kernel set (the AVX-512 sets, where the processor has
 * AVX512-VNNI, take gemm_q5_k_avx512.c: the same expression at twice the
 * width, the same bits), built as the Q4_K kernel is (gemm_q4_k.c: read
 * its numerics there).
 *
 * Inputs: each row quantized to int8 blocks of 256 with one scale dy
 * (gemm_q8_k.h).  A weight w = d sc_j q - dmin mn_j (q the 5-bit code)
 * against an input qx dy sums over the block to
 *   d dy (sum_j sc_j sum_{k in j} q_k qx_k) - dmin dy (sum_j mn_j s_j),
 * Q4_K's expression with codes to 31.  A group of 32 weights takes half
 * of a 32-byte load of nibbles (byte i: element i of group 2t low, of
 * group 2t + 1 high), an AND (and a shift), and its fifth bits: the
 * block's 32 qh bytes (loaded once per block and weight row) shifted in
 * 16-bit lanes so that bit j of each byte lands on bit 4 (no other byte's
 * bit can land there for shifts of at most 4), an AND and an OR; then
 * vpmaddubsw against the input's codes (at most 2 x 31 x 127, no
 * saturation), vpmaddwd by sc_j and an integer add.  Once per block the
 * float steps of gemm_q4_k.h's q4k_block_end.
 *
 * Numerics: Q4_K's (gemm_q4_k.c), the lanes' integer sums S_l now at most
 * 8 x 4 x 31 x 127 x 63 < 2^23, exact as float: an output is the
 * quantized input row times the exactly dequantized weights, to fp32
 * rounding, within sum |w| dy / 2 of the reference; every tile computes
 * that expression, so a row gives the same bits alone or in any batch,
 * under every kernel set. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/gemm_q4_k.h"
#include "runtime/cpu/gemm_q8_k.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

/* Group j's fifth bits of the block's 32 qh bytes h, on bit 4 of each
 * byte (0x10 or 0). */
AVX2 INLINE __m256i fifth_bits(__m256i h, const int j)
{
    const __m256i s = j < 4 ? _mm256_slli_epi16(h, 4 - j) : j == 4 ? h : _mm256_srli_epi16(h, j - 4);
    return _mm256_and_si256(s, _mm256_set1_epi8(0x10));
}

/* y[r*ldy + c] = input row r0 + r . weight row c (+ bias n + c) for r < R,
 * c < C: as gemm_q4_k.c's tile (its arguments and registers), each 32
 * bytes of nibbles joined to their fifth bits once for the R input rows. */
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
        const size_t bo = (size_t)k * MOE_Q5_K_BYTES, xo = (size_t)k * MOE_Q8_K_BYTES;
        __m256i sc[MAXC], qh[MAXC], sum[MAXR][MAXC];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const char *blk = w + (size_t)c * wld + bo;
            if (pf)
                for (int l = 0; l < 3; l++) _mm_prefetch(blk + 64 * l + pfd, _MM_HINT_T0);
            sc[c] = block_scales(blk);
            qh[c] = _mm256_loadu_si256((const __m256i *)(blk + MOE_Q5_K_QH));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) sum[r][c] = _mm256_setzero_si256();
        }
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const char *qs = w + (size_t)c * wld + bo + MOE_Q5_K_QS;
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * t));
                const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(15)), fifth_bits(qh[c], 2 * t));
                const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)),
                                                   fifth_bits(qh[c], 2 * t + 1));
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

#define KQ_DTYPE MOE_DTYPE_Q5_K
#define KQ_ENTRY moe_gemm_rows_q5_k_avx2
#include "runtime/cpu/gemm_q8_k_rows.h"
