/* gemm_q4.c - the fast matrix product over four-bit weights (Q4_1, Q4_G32,
 * Q4_G128: runtime/core/tensor.h; Q4_K has its own, gemm_q4_k.c, and
 * under the AMX sets gemm_q4_amx.c), for both kernel sets, built as
 * gemm_q8.c is: each input row is quantized to int8 blocks of 32 of its
 * own, and each block's dot with the weight codes is an exact integer
 * sum.  The tiles (gemm_q4_tile.h) are compiled twice: with AVX2
 * instructions, and, for the AVX-512 set on processors that have
 * AVX512-VNNI, with vpdpbusd in place of vpmaddubsw + vpmaddwd (the same
 * integer sums), where tiles of 2-4 input rows take 512-bit registers
 * (tile512, two outputs a register), one input row (decode) takes
 * tile_wide_vnni below, and 14 or more rows the panels
 * (gemm_q4_panel.h).
 *
 * Why: widening four-bit codes to fp32 (extend, convert, scale and
 * offset, FMA) leaves the product compute bound at well under the memory
 * bandwidth it could use.  Here a run of 32 weights against one input row
 * takes a 16-byte broadcast load, a shift of its upper half by 4 and an
 * AND (the 32 unsigned codes in element order: byte j holds element j low
 * and j + 16 high), vpmaddubsw (codes unsigned times the input's int8
 * codes, pairs summed to int16: at most 2 x 15 x 127, no saturation),
 * vpmaddwd by ones (lane j: elements 4j..4j+3 as int32; or vpdpbusd);
 * a tile adds its outputs' lanes into one register (lane_sums.h), then
 * one conversion and FMA serve up to 8 outputs; the offset costs one FMA
 * per group.  A group's head is read once per weight row and group (Q4_1:
 * one 4-byte load widened by F16C gives d and m; Q4_G128: once per 4
 * runs).
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
 * Numerics: output n of row t accumulates over groups in order, each run
 * k of the group: P the run's 32 products summed exactly, acc =
 * fma(float(P), dx_k x d, acc); then the group's offset acc = fma(S, m,
 * acc); then the bias: the AMX kernel's expression (gemm_q4_amx.c), which
 * every tile, tile_wide_vnni and the panels compute, so a row gives the
 * same bits alone or in any batch, under every kernel set
 * (tests/test_quant_q4.c pins each format's outputs to it).  The integer
 * sums are exact, so the only differences from the reference are the
 * input rounding above and fp32 rounding.  The rows of up to TBQ inputs are
 * quantized into the calling thread's buffer (moe_gemm_thread_buffer) on
 * each call, once for all its weight rows. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/lane_sums.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum {
    RUN = 32,  /* elements per run of 16 code bytes (and per input block) */
    TBQ = 64,  /* input rows quantized at a time */
    MAXC = 8,  /* widest tile: weight rows for one input row */
    /* how far ahead tile_wide_vnni prefetches, in bytes (whole tiles):
     * a tile of 8 rows is only 2.5 KiB at Din 512 (Q4_1), read in about
     * the memory's latency at 20 GB/s; 8 or 16 KiB ahead made one thread
     * 15 to 40% faster at T = 1 (docs/results/2026-12-02-q4-decode.md) */
    PF_WIDE = 8192,
};

/* The quantized input rows of a call, one stream per row (stride rs
 * bytes): per weight group of NR runs, 32 bytes of head (0, S, dx_0 ..
 * dx_{NR-1}, 0, ...) as floats, then the NR blocks' 32 codes each. */
struct xq {
    const char *p;
    size_t rs;
};

/* Input row x (ng groups of nr blocks) into its stream o (struct xq): each
 * block quantized by moe_quantize_x_q8, and S the sum over the group's
 * blocks in order of dx x (the block's code sum), each step one rounding
 * (gemm_fast_impl.h: the AMX sets' kernels read the same streams). */
AVX2 void moe_q4_quantize_input(char *o, const float *x, int ng, int nr)
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

/* the AVX2 instance: every processor the fast kernels run on */
#define Q4_ATTR AVX2
#define Q4_FN(name) name##_avx2
#define Q4_DOT(w, x) _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
#define Q4_ENTRY moe_gemm_rows_q4_avx2
#include "runtime/cpu/gemm_q4_tile.h"
#undef Q4_ATTR
#undef Q4_FN
#undef Q4_DOT
#undef Q4_ENTRY

/* the AVX-512 set's instance where the processor has AVX512-VNNI
 * (gemm_fast.c checks); one input row (decode) takes tile_wide below */
#define Q4_ATTR __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))

/* One input row against C (2, 4 or 8) weight rows, two to a 512-bit
 * register (row c in the lower half, c + 1 in the upper) against the
 * input's run broadcast to both halves: one vpdpbusd serves two weight
 * rows, and the run's 8 outputs' lanes are added into one register
 * (moe_sum_halves), converted and take one FMA by d_c dx; per group one
 * FMA by m_c S: the tile's expression (gemm_q4_tile.h), the same bits.
 * Arguments as the tile's with R = 1, r0 = 0, but pfd: prefetch the rows
 * pfd bytes on (a whole number of tiles; 0: none). */
Q4_ATTR INLINE void tile_wide_vnni(const enum moe_dtype dt, const int C, float *y, const struct xq *x,
                                   const char *w, size_t wld, const struct moe_tensor *b, int n, size_t pfd)
{
    const int NR = dt == MOE_DTYPE_Q4_G128 ? 4 : 1, HB = dt == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD;
    const bool pf = pfd > 0;
    const size_t GB = (size_t)HB + 16 * (size_t)NR;
    const size_t XG = 32 + 32 * (size_t)NR;
    const int ng = (int)(x->rs / XG);
    const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4), low = _mm512_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    const int pf_every = dt == MOE_DTYPE_Q4_1 ? 3 : dt == MOE_DTYPE_Q4_G32 ? 2 : 1;
    for (int g = 0, pg = 0; g < ng; g++, pg = pg + 1 == pf_every ? 0 : pg + 1) {
        const char *xg = x->p + (size_t)g * XG;
        __m256 dv, mv;
        const bool heads = weight_heads_avx2(dt, w, wld, (size_t)g * GB, C, &dv, &mv);
        MOE_ASSERT(heads); /* C is 2, 4 or 8 */
#pragma GCC unroll 4
        for (int k = 0; k < NR; k++) {
            __m512i p[4];
            const __m512i xq = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(xg + 32 + 32 * k)));
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                p[c] = _mm512_setzero_si512();
                if (2 * c >= C) continue;
                const char *g0 = w + (size_t)(2 * c) * wld + (size_t)g * GB, *g1 = g0 + wld;
                if (pf && pg == 0 && (k == 0 || k == NR - 1)) {
                    _mm_prefetch(g0 + (k ? GB - 1 : 0) + pfd, _MM_HINT_T1);
                    _mm_prefetch(g1 + (k ? GB - 1 : 0) + pfd, _MM_HINT_T1);
                }
                const __m256i c0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(g0 + HB + 16 * k)));
                const __m256i c1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(g1 + HB + 16 * k)));
                const __m512i wq = _mm512_and_si512(
                    _mm512_srlv_epi64(_mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1), shift), low);
                p[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xq);
            }
            const __m256i s = _mm512_castsi512_si256(moe_sum_halves(p, 4));
            const __m256 sc = _mm256_mul_ps(_mm256_set1_ps(((const float *)xg)[2 + k]), dv);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(((const float *)xg)[1]), mv, acc);
    }
    float o[8];
    _mm256_storeu_ps(o, acc);
    for (int c = 0; c < C; c++) y[c] = o[c] + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
}
#include "runtime/cpu/gemm_q4_panel.h"
#define Q4_WIDE512
#define Q4_TILE_WIDE tile_wide_vnni
#define Q4_PANEL q4p_rows
#define Q4_FN(name) name##_vnni
#define Q4_DOT(w, x) _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
#define Q4_ENTRY moe_gemm_rows_q4_vnni
#include "runtime/cpu/gemm_q4_tile.h"
