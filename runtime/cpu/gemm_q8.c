/* gemm_q8.c - the fast matrix product over Q8_0 weights, for both kernel
 * sets (AVX2 instructions, which AVX-512 processors run too; where they
 * have AVX512-VNNI the AVX-512 set takes gemm_q8_vnni.c instead, which
 * computes the expression below with vpdpbusd on 512-bit registers, the
 * same bits): each input row is quantized to Q8_0 blocks of its own, as
 * llama.cpp's CPU backend does, and each block of 32 products is an exact
 * integer sum.
 *
 * Why: widening the int8 weights to fp32 costs 4 instructions per 8
 * weights (extend, convert, scale, FMA), which leaves Q8_0 decode compute
 * bound although it reads about half the bytes of bf16.  Here a block of 32 weights against one
 * input row takes 3: vpsignb (the input signed by the weight), vpmaddubsw
 * (|w| times that, pairs summed to int16: at most 2 x 128 x 127, no
 * saturation), vpmaddwd by ones (lane j: elements 4j..4j+3 as int32); a
 * tile's 8 outputs' lanes are then added in one tree (moe_sum8x8, lane_sums.h), converted,
 * and take one FMA by the products of their blocks' scales.
 *
 * Input rows: per block of 32, amax = max |x|, scale d = amax / 127 and
 * codes q = x * (127 / amax) rounded to nearest even (all zero when amax
 * is below 127 FLT_MIN, about 1.5e-36, where 127 / amax could overflow),
 * so q is in [-127, 127] and |x - q d| <= d / 2 (plus an ulp).
 * A block holding a NaN or an infinity gets d = NaN, so every output of
 * that row is NaN, as it is in the float product and the forward pass
 * reports it (moe_quantize_x_q8, simd_avx2.h, shared with the four-bit
 * kernels of gemm_q4.c).  The rows of up to TBQ inputs are quantized into the calling
 * thread's buffer (moe_gemm_thread_buffer) on each call, once for all the
 * weight rows of the call.
 *
 * Numerics: output n of row t accumulates over blocks k in order acc =
 * fma(float(S_k), dx_k x dw_k, acc), S_k the block's 32 products summed
 * exactly (at most 32 x 127 x 128 < 2^24: exact as float), dx_k x dw_k
 * one fp32 product; then the bias (the AMX kernel's expression too,
 * gemm_q8_amx.c).  The integer sums are exact, so the only differences from
 * the reference (which multiplies the dequantized weights with the fp32
 * inputs) are the input rounding, at most d_x / 2 per element (relative
 * error of an output about 1e-3, that of the weights' own quantization),
 * and fp32 rounding.  Every tile computes that same expression, so a row
 * gives the same bits alone or in any batch, and both kernel sets the same
 * bits (gemm_q8_vnni.c's included). */
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
    QB = MOE_Q8_0_BLOCK,  /* values per block */
    QBYTES = MOE_Q8_0_BYTES, /* f32 scale + 32 codes */
    TBQ = 64,             /* input rows quantized at a time */
    MAXC = 8,             /* widest tile: weight rows for one input row */
};

/* y[r*ldy + c] = input row r . weight row c (+ bias n + c) for r < R,
 * c < C (R C <= 8): q, d the quantized input rows (row strides Din and
 * nb), w the first weight row (stride wld); pf: the first pass over these
 * weight rows, which prefetches the next tile's.  Per block, output (r, c)
 * in lane r C + c: each pair's 8 integer lanes (vpsignb, vpmaddubsw,
 * vpmaddwd by ones), the tile's outputs' lanes added into one register
 * (moe_sum8x8, lane_sums.h), converted, and one FMA by dw_c dx_r for all of them. */
AVX2 INLINE void tile(const int R, const int C, float *y, size_t ldy, const int8_t *q, const float *d,
                      int Din, const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    const int nb = Din / QB;
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < nb; k++) {
        __m256i v[8];
        float dw[8], dx[8];
#pragma GCC unroll 8
        for (int i = R * C; i < 8; i++) v[i] = _mm256_setzero_si256(), dw[i] = dx[i] = 0.0f;
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const char *blk = w + (size_t)c * wld + (size_t)k * QBYTES;
            /* weights stream once from memory: the same block of the next
             * tile's row (C rows on), so a tile starts with its rows in L2
             * rather than waiting on memory, as it would with a fixed
             * distance into each row or with no prefetch on 4-row tiles */
            if (pf) _mm_prefetch(blk + (size_t)C * wld, _MM_HINT_T1);
            const __m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 4)), wa = _mm256_sign_epi8(wq, wq);
            float s;
            memcpy(&s, blk, 4);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(q + (size_t)r * Din + (size_t)k * QB));
                v[r * C + c] = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(x, wq)), _mm256_set1_epi16(1));
                dw[r * C + c] = s;
                dx[r * C + c] = d[(size_t)r * nb + k];
            }
        }
        const __m256 sc = _mm256_mul_ps(_mm256_setr_ps(dx[0], dx[1], dx[2], dx[3], dx[4], dx[5], dx[6], dx[7]),
                                        _mm256_setr_ps(dw[0], dw[1], dw[2], dw[3], dw[4], dw[5], dw[6], dw[7]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(moe_sum8x8(v)), sc, acc);
    }
    float o[8];
    _mm256_storeu_ps(o, acc);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)r * ldy + c] = o[r * C + c] + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
}

/* R rows (1..3) against weight rows [n0, n1), C at a time then one by one;
 * w points at row n0. */
AVX2 INLINE void row_tiles(const int R, const int C, float *y, size_t ldy, const int8_t *q, const float *d,
                           int Din, const char *w, size_t wld, int n0, int n1, const struct moe_tensor *b)
{
    int n = n0;
    for (; n + C <= n1; n += C)
        tile(R, C, y + n, ldy, q, d, Din, w + (size_t)(n - n0) * wld, wld, b, n, true);
    for (; n < n1; n++) tile(R, 1, y + n, ldy, q, d, Din, w + (size_t)(n - n0) * wld, wld, b, n, true);
}

AVX2 void moe_gemm_rows_q8_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *wv,
                                int Din, int n0, int n1, const struct moe_tensor *b)
{
    enum { C4 = 2 }; /* weight rows of a 4-input tile: 8 outputs */
    MOE_ASSERT(Din % QB == 0);
    const int nb = Din / QB;
    const size_t wld = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)Din);
    const int rows = T < TBQ ? T : TBQ;
    /* codes first (32-byte multiples per row), then the scales */
    float *buf = moe_gemm_thread_buffer((size_t)rows * (size_t)(Din / 4 + nb));
    MOE_ASSERT(buf && "gemm_fast: out of memory for the quantized input rows");
    int8_t *q = (int8_t *)buf;
    float *d = buf + (size_t)rows * Din / 4;
    const char *w = (const char *)wv + (size_t)n0 * wld;
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TBQ) {
        const int tn = T - t0 < TBQ ? T - t0 : TBQ;
        for (int t = 0; t < tn; t++)
            moe_quantize_x_q8(q + (size_t)t * Din, d + (size_t)t * nb, x + (size_t)(t0 + t) * ldx, nb);
        float *yb = y + (size_t)t0 * ldy;
        switch (tn) {
        case 1: row_tiles(1, 8, yb, ldy, q, d, Din, w, wld, n0, n1, b); continue;
        case 2: row_tiles(2, 4, yb, ldy, q, d, Din, w, wld, n0, n1, b); continue;
        case 3: row_tiles(3, 2, yb, ldy, q, d, Din, w, wld, n0, n1, b); continue;
        default: break;
        }
        /* each group of C4 weight rows (in L1) against every 4-row tile,
         * then the last 1-3 rows one at a time */
        const int t4 = tn & ~3;
        for (int n = n0; n < n1; n += C4) {
            const bool full = n + C4 <= n1;
            const char *wn = w + (size_t)(n - n0) * wld;
            for (int t = 0; t < tn; t += t < t4 ? 4 : 1) {
                float *yt = yb + (size_t)t * ldy + n;
                const int8_t *qt = q + (size_t)t * Din;
                const float *dt = d + (size_t)t * nb;
                if (t < t4 && full)
                    tile(4, C4, yt, ldy, qt, dt, Din, wn, wld, b, n, t == 0);
                else if (t < t4)
                    tile(4, 1, yt, ldy, qt, dt, Din, wn, wld, b, n, t == 0);
                else if (full)
                    tile(1, C4, yt, ldy, qt, dt, Din, wn, wld, b, n, t == 0);
                else
                    tile(1, 1, yt, ldy, qt, dt, Din, wn, wld, b, n, t == 0);
            }
        }
    }
}
