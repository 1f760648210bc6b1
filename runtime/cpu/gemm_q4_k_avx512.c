/* gemm_q4_k_avx512.c - the product over Q4_K weights for the AVX-512 and
 * avx512-bf16 kernel sets (where the processor has AVX512-VNNI; else
 * gemm_q4_k.c runs): gemm_q4_k.c's expression (read its numerics there) at twice
 * the width, so the same bits.
 *
 * gemm_q4_k.c takes a 32-byte load of codes as two groups, 2t (low
 * nibbles) and 2t + 1 (high), each against its 32 input codes in a ymm.
 * Here a 64-byte load (half a block's codes) is four groups: its low
 * nibbles are groups 4p and 4p + 2 in one zmm, its high nibbles groups
 * 4p + 1 and 4p + 3 in another, each against the input's codes of the
 * same two groups (the input row's 32-byte chunks are arranged once per
 * call to lie in that order, gemm_q4_k.h's q4k_arrange), so one vpmaddubsw and one
 * vpdpwssd (AVX512-VNNI: the vpmaddwd by the two groups' scales and the
 * add in one, the same integers) serve two groups of an input row.  Lanes 0-7 of the block's integer sum gather the first group
 * of each pair, lanes 8-15 the second; at the block's end the two halves
 * are added: integer sums, exact, so each of the 8 lanes holds exactly
 * the integer gemm_q4_k.c's lane holds, and from there the float steps
 * are the same instructions in the same order.  Decode rows take the same
 * tiles (the weights stream from memory either way); prefill's tiles do
 * twice the work an instruction. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/gemm_q4_k.h"
#include "runtime/cpu/gemm_q8_k.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* A one-row (decode) tile takes 4 weight rows where gemm_q4_k.c's takes 2:
 * more streams in flight, 4-11% faster decode at OLMoE-1B-7B's widths
 * here (8: no better). */
enum { WC = 4 };

/* As gemm_q4_k.c's tile (its arguments and registers), four groups a step
 * (two zmm of codes from one 64-byte load). */
AVX512 INLINE void tile(const int R, const int C, float *y, size_t ldy, const char *x, size_t xs, int r0, int nb,
                        const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    __m256 acc[MAXR][WC];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const char *xr = x + (size_t)r0 * xs;
    const float *dyr = (const float *)(xr + (size_t)nb * MOE_Q8_K_BYTES);
    const size_t tb = (size_t)C * wld, pfd = (PF + tb - 1) / tb * tb;
    for (int k = 0; k < nb; k++) {
        const size_t bo = (size_t)k * MOE_Q4_K_BYTES, xo = (size_t)k * MOE_Q8_K_BYTES;
        __m256i sc[WC];
        __m512i scz[WC], sum[MAXR][WC];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const char *blk = w + (size_t)c * wld + bo;
            if (pf)
                for (int l = 0; l < 3; l++) _mm_prefetch(blk + 64 * l + pfd, _MM_HINT_T0);
            sc[c] = block_scales(blk);
            scz[c] = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc[c]));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) sum[r][c] = _mm512_setzero_si512();
        }
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
            /* the scales of groups 4p, 4p+2 (low nibbles) and 4p+1, 4p+3
             * (high), each in 16 int16 */
            const short g0 = (short)(0x8000 | 4 * p), g1 = (short)(g0 + 1), g2 = (short)(g0 + 2), g3 = (short)(g0 + 3);
            const __m512i pl = _mm512_inserti64x4(_mm512_set1_epi16(g0), _mm256_set1_epi16(g2), 1);
            const __m512i ph = _mm512_inserti64x4(_mm512_set1_epi16(g1), _mm256_set1_epi16(g3), 1);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m512i v = _mm512_loadu_si512(w + (size_t)c * wld + bo + 16 + 64 * p);
                const __m512i lo = _mm512_and_si512(v, _mm512_set1_epi8(15));
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15));
                const __m512i sl = _mm512_shuffle_epi8(scz[c], pl), sh = _mm512_shuffle_epi8(scz[c], ph);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const char *xq = xr + (size_t)r * xs + xo + 32 + 128 * p;
                    /* vpdpwssd: the vpmaddwd by the scales and the add in one */
                    sum[r][c] = _mm512_dpwssd_epi32(sum[r][c], _mm512_maddubs_epi16(lo, _mm512_loadu_si512(xq)), sl);
                    sum[r][c] = _mm512_dpwssd_epi32(sum[r][c], _mm512_maddubs_epi16(hi, _mm512_loadu_si512(xq + 64)), sh);
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
                const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(sum[r][c]),
                                                    _mm512_extracti64x4_epi64(sum[r][c], 1));
                acc[r][c] = q4k_block_end(acc[r][c], s8, dm, mn, xb, dyr[(size_t)r * xs / sizeof(float) + k]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            y[(size_t)r * ldy + c] = moe_hsum8(acc[r][c]) + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
}

#undef AVX2
#define AVX2 AVX512 /* the driver's functions take this file's instructions */
#define KQ_C1 WC
#define KQ_ARRANGE q4k_arrange
#define KQ_DTYPE MOE_DTYPE_Q4_K
#define KQ_ENTRY moe_gemm_rows_q4_k_avx512
#include "runtime/cpu/gemm_q8_k_rows.h"
