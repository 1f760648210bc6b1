/* gemm_q6_k_avx512.c - the product over Q6_K weights for the AVX-512,
 * avx512-bf16 and AMX kernel sets: gemm_q6_k.c's expression (read its numerics there) at
 * twice the width, so the same bits.
 *
 * gemm_q6_k.c takes a run of 32 codes (elements 32r .. 32r+31 of a block)
 * against the input a ymm at a time.  Here two runs, 4h + 2p and
 * 4h + 2p + 1, are one zmm: their ql bytes are the half's 64 ql bytes
 * (low nibbles for p = 0, high for p = 1), their qh bits the half's 32 qh
 * bytes in both halves of the zmm shifted by each run's amount (vpsllvw /
 * vpsrlvw), and their input codes the 64 consecutive codes of the stream.
 * One vpmaddubsw and one vpdpwssd (AVX512-VNNI: the vpmaddwd by both
 * runs' sub-block scales and the add in one) serve the two runs of an
 * input row: lanes 0-7 of the block's integer sum gather the even runs',
 * lanes 8-15 the odd runs'.  At the block's end the halves are added
 * (integers, exact), so each of the 8 lanes holds what gemm_q6_k.c's lane
 * holds, and the float steps are the same.  Where the processor lacks
 * AVX512-VNNI the AVX2 kernel runs instead (the same bits). */
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

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* The int16 scales of runs 4h + 2p (low half) and 4h + 2p + 1 (high half)
 * from half h's 8 scales repeated in every 128-bit lane (hs): in each
 * half, sub-block 2r in lanes 0-7 and 2r + 1 in lanes 8-15 (gemm_q6_k.c's
 * run_scales). */
AVX512 INLINE __m512i pair_scales(__m512i hs, const int p)
{
    const char a = (char)(8 * p), b = (char)(8 * p + 1), c = (char)(8 * p + 2), d = (char)(8 * p + 3);
    const char e = (char)(8 * p + 4), f = (char)(8 * p + 5), g = (char)(8 * p + 6), h = (char)(8 * p + 7);
    return _mm512_shuffle_epi8(hs, _mm512_set_epi8(h, g, h, g, h, g, h, g, h, g, h, g, h, g, h, g,
                                                   f, e, f, e, f, e, f, e, f, e, f, e, f, e, f, e,
                                                   d, c, d, c, d, c, d, c, d, c, d, c, d, c, d, c,
                                                   b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a));
}

/* A one-row (decode) tile takes 4 weight rows where gemm_q6_k.c's takes 2:
 * more streams in flight, 4-11% faster decode at OLMoE-1B-7B's widths
 * here (8: no better). */
enum { WC = 4 };

#include "runtime/cpu/gemm_k_panel.h"

/* As gemm_q6_k.c's tile (its arguments and registers), two runs a step. */
AVX512 INLINE void tile(const int R, const int C, float *y, size_t ldy, const char *x, size_t xs, int r0, int nb,
                        const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    __m128 acc1 = _mm_setzero_ps(); /* R = 1: the C rows' sums in lanes */
    __m256 accv = _mm256_setzero_ps(); /* R > 1: output (r, c) in lane r C + c */
    const char *xr = x + (size_t)r0 * xs;
    const float *dyr = (const float *)(xr + (size_t)nb * MOE_Q8_K_BYTES);
    const size_t tb = (size_t)C * wld, pfd = (PF + tb - 1) / tb * tb;
    /* qh's bits 2j, 2j+1 to bits 4-5 for run j: j = 0, 1 (p 0) by 4 and 2
     * left, j = 2, 3 (p 1) by 0 and 2 right */
    const __m512i left = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i right = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    for (int k = 0; k < nb; k++) {
        const size_t bo = (size_t)k * MOE_Q6_K_BYTES, xo = (size_t)k * MOE_Q8_K_BYTES;
        __m512i sum[MAXR][WC];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            if (pf)
                for (int l = 0; l < 4; l++) _mm_prefetch(w + (size_t)c * wld + bo + 64 * l + pfd, _MM_HINT_T0);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) sum[r][c] = _mm512_setzero_si512();
        }
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; hf++) {
            __m512i hs[WC], l[WC], qh[WC];
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const char *blk = w + (size_t)c * wld + bo;
                const __m128i s8 = _mm_loadl_epi64((const __m128i *)(blk + SC + 8 * hf));
                hs[c] = _mm512_broadcast_i32x4(_mm_cvtepi8_epi16(s8));
                l[c] = _mm512_loadu_si512(blk + 64 * hf);
                qh[c] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + QH + 32 * hf)));
            }
#pragma GCC unroll 2
            for (int p = 0; p < 2; p++) {
                const size_t qo = xo + 32 + 32 * (size_t)(4 * hf + 2 * p);
#pragma GCC unroll 4
                for (int c = 0; c < C; c++) {
                    const __m512i lo = _mm512_and_si512(p ? _mm512_srli_epi16(l[c], 4) : l[c], _mm512_set1_epi8(15));
                    const __m512i hb = p ? _mm512_srlv_epi16(qh[c], right) : _mm512_sllv_epi16(qh[c], left);
                    const __m512i wq = _mm512_or_si512(lo, _mm512_and_si512(hb, _mm512_set1_epi8(0x30)));
                    const __m512i sv = pair_scales(hs[c], p);
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++) {
                        const __m512i xq = _mm512_loadu_si512(xr + (size_t)r * xs + qo);
                        sum[r][c] = _mm512_dpwssd_epi32(sum[r][c], _mm512_maddubs_epi16(wq, xq), sv);
                    }
                }
            }
        }
        /* output (r, c)'s integer lanes: s8[r C + c] */
        __m256i s8[8];
#pragma GCC unroll 8
        for (int o = 0; o < 8; o++) s8[o] = o < R * C ? _mm256_add_epi32(_mm512_castsi512_si256(sum[o / C][o % C]), _mm512_extracti64x4_epi64(sum[o / C][o % C], 1)) : _mm256_setzero_si256();
        if (R == 1) acc1 = q6k_block_end_row(acc1, s8, C, w, wld, bo, xr + xo, dyr[k]);
        else accv = q6k_block_end(accv, s8, R, C, w, wld, bo, xr, xs, xo, dyr, k);
    }
    moe_tile_out(y, ldy, R, C, acc1, accv, b, n);
}

#undef AVX2
#define AVX2 AVX512 /* the driver's functions take this file's instructions */
#define KQ_C1 WC
#define KQ_DTYPE MOE_DTYPE_Q6_K
#define KQ_PANEL(...) kp_rows(KP_Q6_K, __VA_ARGS__)
#define KQ_ENTRY moe_gemm_rows_q6_k_avx512
#include "runtime/cpu/gemm_q8_k_rows.h"
