/* gemm_q8_vnni.c - the AVX-512 kernel set's matrix product over Q8_0
 * weights on processors with AVX512-VNNI (gemm_fast.c checks): the same
 * outputs, bit for bit, as gemm_q8.c's AVX2 kernel, whose header states
 * the numerics, with vpdpbusd on 512-bit registers.
 *
 * The integer sums: vpdpbusd multiplies unsigned bytes by signed ones, so
 * the input's codes q (in [-127, 127]) are stored as u = q + 128 (q xor
 * 0x80, in [1, 255]) and each weight block's lane j starts from -128 times
 * the sum of its weights 4j..4j+3 (one vpdpbusd by 0x80 bytes and a
 * negation, once per weight block for all the input rows of a tile):
 * then lane j ends at the sum over its 4 elements of q w, exact in int32,
 * the integer vpsignb + vpmaddubsw + vpmaddwd give (whose int16 pair sums
 * never saturate).
 *
 * The layout: a 512-bit register holds two weight rows, row c in the
 * lower half and row c + 1 in the upper, against one input row's block
 * broadcast to both halves; each half's 8 lanes are the AVX2 kernel's
 * lanes of its output.  Per block, a tile's (up to 16) outputs' lanes are
 * added into one register (moe_sum_halves: an unpack tree, exact), converted, and
 * take one FMA by the products of their blocks' scales: the AVX2 kernel's
 * expression, the same bits.  Tiles: one input row (decode) against 8
 * weight rows; up to 4 input rows against 4 weight rows, the weight
 * rows' codes and corrections made once per block for the tile's rows; a
 * last odd weight row takes both halves of a register (the upper
 * discarded).  From Q8P_MIN input rows the panels take the call
 * (gemm_q8_panel.h: the input rows 16 to a register, the same
 * expression).  Every tile computes the same expression, so a row gives
 * the same bits alone or in any batch. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/lane_sums.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#define INLINE static inline __attribute__((always_inline))

enum {
    QB = MOE_Q8_0_BLOCK,     /* values per block */
    QBYTES = MOE_Q8_0_BYTES, /* f32 scale + 32 codes */
    TBQ = 64,                /* input rows quantized at a time */
    RMAX = 4,                /* input rows of a prefill tile (R P <= 8) */
    PMAX = 4,                /* pairs of weight rows of a decode tile */
};

#include "runtime/cpu/gemm_q8_panel.h"

/* y[r*ldy + c] = input row r . weight row c (+ bias n + c) for r < R and
 * c < 2P, R P <= 8 (c < 1 when single: the pair is row 0 twice, the upper
 * half dropped): u, d the input rows' codes + 128 and scales (row strides
 * Din and nb), w the first weight row (stride wld); pf: the first pass
 * over these weight rows, which prefetches the next tile's (2P rows on, as
 * gemm_q8.c does).  Per block, output (r, c) in lane 2P r + c: each
 * pair's integer lanes by one vpdpbusd, the tile's outputs' lanes added
 * into one register (moe_sum_halves, lane_sums.h), converted, and one FMA by dw_c dx_r for all
 * of them. */
VNNI INLINE void tile(const int R, const int P, const bool single, float *y, size_t ldy, const uint8_t *u,
                      const float *d, int Din, const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    const int nb = Din / QB, O = 2 * P * R; /* outputs, lanes */
    const size_t next = single ? wld : (size_t)(2 * P) * wld;
    const __m512i m128 = _mm512_set1_epi8((char)0x80);
    /* lane o = 2P r + c takes weight row c's scale and input row r's */
    int iw[16] = {0}, ix[16] = {0};
    for (int o = 0; o < O; o++) iw[o] = o % (2 * P), ix[o] = o / (2 * P);
    const __m512i vw = _mm512_loadu_si512(iw), vx = _mm512_loadu_si512(ix);
    __m512 acc = _mm512_setzero_ps();
    for (int k = 0; k < nb; k++) {
        __m512i s[8];
        float dw[8] = {0}, dx[8] = {0};
#pragma GCC unroll 8
        for (int i = R * P; i < 8; i++) s[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const char *b0 = w + (size_t)(2 * p) * wld + (size_t)k * QBYTES, *b1 = single ? b0 : b0 + wld;
            if (pf) {
                _mm_prefetch(b0 + next, _MM_HINT_T1);
                if (!single) _mm_prefetch(b1 + next, _MM_HINT_T1);
            }
            const __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 4))),
                                                  _mm256_loadu_si256((const __m256i *)(b1 + 4)), 1);
            const __m512i nc = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), m128, wq));
            float s0, s1;
            memcpy(&s0, b0, 4);
            memcpy(&s1, b1, 4);
            dw[2 * p] = s0, dw[2 * p + 1] = s1;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m512i x =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(u + (size_t)r * Din + (size_t)k * QB)));
                s[r * P + p] = _mm512_dpbusd_epi32(nc, x, wq);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) dx[r] = d[(size_t)r * nb + k];
        const __m512 w8 = _mm512_castps256_ps512(_mm256_setr_ps(dw[0], dw[1], dw[2], dw[3], dw[4], dw[5], dw[6], dw[7]));
        const __m512 x8 = _mm512_castps256_ps512(_mm256_setr_ps(dx[0], dx[1], dx[2], dx[3], dx[4], dx[5], dx[6], dx[7]));
        const __m512 sc = _mm512_mul_ps(_mm512_permutexvar_ps(vx, x8), _mm512_permutexvar_ps(vw, w8));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(moe_sum_halves(s, R * P > 4 ? 8 : 4)), sc, acc);
    }
    float o[16];
    _mm512_storeu_ps(o, acc);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < (single ? 1 : 2 * P); c++)
            y[(size_t)r * ldy + c] = o[2 * P * r + c] + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
}

/* One input row against weight rows [n0, n1) (w at row n0): 8 at a time,
 * then a pair, then a single row. */
VNNI INLINE void row_one(float *y, const uint8_t *u, const float *d, int Din, const char *w, size_t wld, int n0,
                         int n1, const struct moe_tensor *b)
{
    int n = n0;
    for (; n + 2 * PMAX <= n1; n += 2 * PMAX)
        tile(1, PMAX, false, y + n, 0, u, d, Din, w + (size_t)(n - n0) * wld, wld, b, n, true);
    for (; n + 2 <= n1; n += 2) tile(1, 1, false, y + n, 0, u, d, Din, w + (size_t)(n - n0) * wld, wld, b, n, true);
    if (n < n1) tile(1, 1, true, y + n, 0, u, d, Din, w + (size_t)(n - n0) * wld, wld, b, n, true);
}

/* R (1..RMAX) input rows against the 4 weight rows at w (first: the first
 * pass over them). */
VNNI static void rows_x4(int R, float *y, size_t ldy, const uint8_t *u, const float *d, int Din, const char *w,
                         size_t wld, const struct moe_tensor *b, int n, bool first)
{
    switch (R) {
    case 1: tile(1, 2, false, y, ldy, u, d, Din, w, wld, b, n, first); break;
    case 2: tile(2, 2, false, y, ldy, u, d, Din, w, wld, b, n, first); break;
    case 3: tile(3, 2, false, y, ldy, u, d, Din, w, wld, b, n, first); break;
    default: tile(4, 2, false, y, ldy, u, d, Din, w, wld, b, n, first); break;
    }
}

VNNI void moe_gemm_rows_q8_vnni(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *wv, int Din,
                                int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(Din % QB == 0);
    const int nb = Din / QB;
    const size_t wld = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)Din);
    if (T >= Q8P_MIN) {
        q8p_rows(y, ldy, x, ldx, T, (const char *)wv + (size_t)n0 * wld, wld, nb, n0, n1, b);
        return;
    }
    const int rows = T < TBQ ? T : TBQ;
    /* codes first (32-byte multiples per row), then the scales */
    float *buf = moe_gemm_thread_buffer((size_t)rows * (size_t)(Din / 4 + nb));
    MOE_ASSERT(buf && "gemm_fast: out of memory for the quantized input rows");
    uint8_t *u = (uint8_t *)buf;
    float *d = buf + (size_t)rows * Din / 4;
    const char *w = (const char *)wv + (size_t)n0 * wld;
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TBQ) {
        const int tn = T - t0 < TBQ ? T - t0 : TBQ;
        for (int t = 0; t < tn; t++) {
            uint8_t *ut = u + (size_t)t * Din;
            moe_quantize_x_q8((int8_t *)ut, d + (size_t)t * nb, x + (size_t)(t0 + t) * ldx, nb);
            for (int k = 0; k < Din; k += QB) {
                __m256i *p = (__m256i *)(ut + k);
                _mm256_storeu_si256(p, _mm256_xor_si256(_mm256_loadu_si256(p), _mm256_set1_epi8((char)0x80)));
            }
        }
        float *yb = y + (size_t)t0 * ldy;
        if (tn == 1) {
            row_one(yb, u, d, Din, w, wld, n0, n1, b);
            continue;
        }
        /* each group of 4 weight rows (in L1) against every tile of up to
         * RMAX input rows; the last 1-3 weight rows one input row at a
         * time */
        int n = n0;
        for (; n + 4 <= n1; n += 4)
            for (int t = 0; t < tn; t += RMAX)
                rows_x4(tn - t < RMAX ? tn - t : RMAX, yb + (size_t)t * ldy + n, ldy, u + (size_t)t * Din,
                        d + (size_t)t * nb, Din, w + (size_t)(n - n0) * wld, wld, b, n, t == 0);
        if (n < n1)
            for (int t = 0; t < tn; t++)
                row_one(yb + (size_t)t * ldy, u + (size_t)t * Din, d + (size_t)t * nb, Din,
                        w + (size_t)(n - n0) * wld, wld, n, n1, b);
    }
}
