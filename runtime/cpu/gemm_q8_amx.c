/* gemm_q8_amx.c - the AMX kernel sets' matrix product over Q8_0 weights:
 * tile products on AMX-INT8 (TDPBSSD) from AMX_ROWS input rows on, and an
 * AVX512-VNNI instance of the same expression for fewer (decode).
 *
 * Inputs: each row quantized per block of 32 as for the other Q8_0
 * kernels (moe_quantize_x_q8, simd_avx2.h: codes in [-127, 127], a block
 * holding a NaN or an infinity gets a NaN scale).
 *
 * Numerics (every kernel set's: gemm_q8.c, gemm_q8_vnni.c and its panels
 * compute the same): output n of row t is acc = 0, then for
 * each block k in order acc = fma(float(S), dx * dw, acc), S the block's
 * 32 products summed exactly in int32 (TDPBSSD with the block alone in
 * its k, or vpdpbusd and an integer reduction), dx * dw one fp32 rounding;
 * then + bias.  Every path computes that, so a row gives the same bits
 * alone or in any batch and slice.
 *
 * Tiles (AMX_ROWS rows or more): the weights are B.  A tile of 16 weight rows
 * is rearranged per block into B's layout (8 lines of 64 bytes: line q
 * holds bytes 4q..4q+3 of each row's block; rows past the slice zero) with
 * its scales beside, once per pass of input rows; the input rows are A in
 * place (16 rows x the block's 32 codes, the last group padded with zero
 * rows).  Each block is one TDPBSSD into a zeroed accumulator, stored,
 * converted and scaled into 16 fp32 registers (one per input row, a lane
 * per weight row), two blocks in flight.  Input rows pass in groups that
 * stay in L2 (CHUNK_BYTES) across the weight tiles.
 *
 * Fewer rows (up to RV at a time): 16 weight rows (8 for one or two input
 * rows) two to a 512-bit register (row 2p in the lower half, 2p + 1
 * in the upper) against each input row's block broadcast:
 * vpdpbusd of the weights offset to unsigned (w xor 0x80 = w + 128) by the
 * signed codes, pairwise folds to one lane per row, less 128 times
 * the block's code sum: the same exact S.  The scales are gathered (read
 * one by one for 8 rows).
 * Measured (bench/gemm_q8.c, one thread): up to 8 rows these (8 input
 * rows a pass) beat the tiles and equal or beat the AVX-512 set's VNNI
 * kernel (1.08-1.11x at 8 rows); from 9 rows the tiles (1.4x at 16, 3.3x
 * at 512). */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_amx_int8.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

enum {
    QB = MOE_Q8_0_BLOCK,     /* values per block */
    QBYTES = MOE_Q8_0_BYTES, /* f32 scale + 32 codes */
    CHUNK_BYTES = 1 << 20,   /* quantized input rows of one pass */
    RV = 8,                  /* input rows of a VNNI tile */
    AMX_ROWS = 9,            /* from this many input rows the tiles */
};

/* Weight rows w (m of them, stride wld) rearranged into B tiles, one per
 * block, at bp, and their scales at sc (16 per block, 0 past m). */
AMXI static void pack_weights(char *bp, float *sc, const char *w, size_t wld, int m, int nb)
{
    for (int k = 0; k < nb; k++) {
        /* z[j]: row j's 8 words in the lower half, row j + 8's in the upper */
        __m512i z[8];
        for (int j = 0; j < 8; j++) {
            const __m256i a = j < m ? _mm256_loadu_si256((const __m256i *)(w + (size_t)j * wld + (size_t)k * QBYTES + 4))
                                    : _mm256_setzero_si256();
            const __m256i c = j + 8 < m
                                  ? _mm256_loadu_si256((const __m256i *)(w + (size_t)(j + 8) * wld + (size_t)k * QBYTES + 4))
                                  : _mm256_setzero_si256();
            z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1);
        }
        moe_amx_b_tile(bp + (size_t)k * BT, z);
        for (int i = 0; i < 16; i++) {
            float s = 0.0f;
            if (i < m) memcpy(&s, w + (size_t)i * wld + (size_t)k * QBYTES, 4);
            sc[(size_t)k * 16 + i] = s;
        }
    }
}

/* acc[t] += float(c row t) * (dx[t] * sc16) for the R input rows of a block. */
AMXI INLINE void scale_block(__m512 *acc, const int32_t *c, const float *dx, size_t ldd, int R, const float *sc)
{
    const __m512 s = _mm512_load_ps(sc);
    for (int t = 0; t < R; t++)
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c + 16 * t))),
                                 _mm512_mul_ps(_mm512_set1_ps(dx[(size_t)t * ldd]), s), acc[t]);
}

/* R (1..16) input rows (codes xq, stride ldq; scales dx, stride nb; 16
 * rows readable) against one packed weight tile of m rows: y[t*ldy + i]
 * for t < R, i < m. */
AMXI INLINE void tile_rows(const int R, float *y, size_t ldy, const int8_t *xq, size_t ldq, const float *dx, int nb,
                           const char *bp, const float *sc, int m, __m512 bias)
{
    __m512 acc[16];
    for (int t = 0; t < R; t++) acc[t] = _mm512_setzero_ps();
    _Alignas(64) int32_t c[2][256];
    int k = 0;
    for (; k + 2 <= nb; k += 2) {
        moe_amx_dot2(c[0], c[1], xq + (size_t)k * QB, xq + (size_t)(k + 1) * QB, ldq, bp + (size_t)k * BT,
                     bp + (size_t)(k + 1) * BT);
        scale_block(acc, c[0], dx + k, (size_t)nb, R, sc + (size_t)k * 16);
        scale_block(acc, c[1], dx + k + 1, (size_t)nb, R, sc + (size_t)(k + 1) * 16);
    }
    if (k < nb) {
        moe_amx_dot1(c[0], xq + (size_t)k * QB, ldq, bp + (size_t)k * BT);
        scale_block(acc, c[0], dx + k, (size_t)nb, R, sc + (size_t)k * 16);
    }
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    for (int t = 0; t < R; t++) _mm512_mask_storeu_ps(y + (size_t)t * ldy, mask, _mm512_add_ps(acc[t], bias));
}

/* R (1..RV) input rows (codes xq, scales dx, 128 x code sums cs; row
 * strides Din, nb, nb) against the m (1..H) weight rows at w (H: 8 or
 * 16 of them a tile): y[r*ldy + 0 .. m).  full (m == H): the rows'
 * addresses from w and the stride; otherwise rows past m repeat the last.
 * pf: prefetch the next H rows' blocks.  Each output's block sums are
 * exact int32 whatever H, so H does not change a bit. */
AMXI INLINE void rows_tile(const int R, const int H, const bool full, float *y, size_t ldy, const int8_t *xq,
                           const float *dx, const int32_t *cs, int nb, const char *w, size_t wld, int m,
                           __m512 bias, bool pf)
{
    const char *r[16];
    _Alignas(64) int32_t off[16];
    for (int i = 0; i < 16; i++) {
        const int j = i < m ? i : m - 1;
        r[i] = w + (size_t)j * wld;
        off[i] = (int32_t)((size_t)j * wld);
    }
#define ROW(i) (full ? w + (size_t)(i) * wld : r[i])
    const size_t Din = (size_t)nb * QB;
    const __m512i vo = _mm512_load_si512((const void *)off);
    const __m512i m128 = _mm512_set1_epi8((char)0x80);
    const __mmask16 hm = (__mmask16)(H == 16 ? 0xffff : 0xff);
    __m512 acc[RV];
    for (int t = 0; t < R; t++) acc[t] = _mm512_setzero_ps();
    for (int k = 0; k < nb; k++) {
        const size_t at = (size_t)k * QBYTES;
        __m512i wq[8];
        if (pf)
#pragma GCC unroll 16
            for (int i = 0; i < H; i++) _mm_prefetch(ROW(i) + (size_t)H * wld + at, _MM_HINT_T1);
#pragma GCC unroll 8
        for (int p = 0; p < H / 2; p++)
            wq[p] = _mm512_xor_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ROW(2 * p) + at + 4))),
                                   _mm256_loadu_si256((const __m256i *)(ROW(2 * p + 1) + at + 4)), 1),
                m128);
#undef ROW
        __m512 wd;
        if (H == 8 && full) {
#define SC(i) (*(const float *)(w + (size_t)(i) * wld + at))
            wd = _mm512_zextps256_ps512(_mm256_setr_ps(SC(0), SC(1), SC(2), SC(3), SC(4), SC(5), SC(6), SC(7)));
#undef SC
        } else
            wd = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), hm, vo, w + at, 1);
        for (int t = 0; t < R; t++) {
            const __m512i x =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + (size_t)t * Din + (size_t)k * QB)));
            __m512i v[8];
#pragma GCC unroll 8
            for (int p = 0; p < H / 2; p++) v[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[p], x);
            __m512i f;
            if (H == 16)
                f = moe_amx_fold(moe_amx_fold(moe_amx_fold(v[0], v[1]), moe_amx_fold(v[2], v[3])),
                                 moe_amx_fold(moe_amx_fold(v[4], v[5]), moe_amx_fold(v[6], v[7])));
            else { /* rows 0..7 in lanes 0..7 (8..15 repeat them) */
                f = moe_amx_fold(moe_amx_fold(v[0], v[1]), moe_amx_fold(v[2], v[3]));
                f = moe_amx_fold(f, f);
            }
            const __m512i s = _mm512_sub_epi32(f, _mm512_set1_epi32(cs[(size_t)t * nb + k]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(dx[(size_t)t * nb + k]), wd),
                                     acc[t]);
        }
    }
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    for (int t = 0; t < R; t++) _mm512_mask_storeu_ps(y + (size_t)t * ldy, mask, _mm512_add_ps(acc[t], bias));
}

/* Up to RV input rows at a time on AVX512-VNNI (fewer than AMX_ROWS). */
AMXI static void few_rows(float *y, size_t ldy, const float *x, size_t ldx, int T, const char *w, size_t wld, int Din,
                          int n0, int n1, const struct moe_tensor *b)
{
    const int nb = Din / QB;
    float *buf = moe_gemm_thread_buffer((size_t)T * ((size_t)Din / 4 + 2 * (size_t)nb));
    MOE_ASSERT(buf && "gemm_fast: out of memory for the quantized input rows");
    int8_t *xq = (int8_t *)buf;
    float *dx = buf + (size_t)T * Din / 4;
    int32_t *cs = (int32_t *)(dx + (size_t)T * nb);
    for (int t = 0; t < T; t++) {
        moe_quantize_x_q8(xq + (size_t)t * Din, dx + (size_t)t * nb, x + (size_t)t * ldx, nb);
        for (int k = 0; k < nb; k++) {
            int32_t s = 0;
            for (int i = 0; i < QB; i++) s += xq[(size_t)t * Din + (size_t)k * QB + (size_t)i];
            cs[(size_t)t * nb + k] = 128 * s;
        }
    }
    /* one or two rows (decode, offloaded experts): 8 weight rows a tile,
     * whose 8 streams and scales read as scalars cost less than 16 and a
     * gather with two threads reading; more rows: 16 */
    const int hv = T <= 2 ? 8 : 16;
    for (int n = n0; n < n1; n += hv) {
        const int m = n1 - n < hv ? n1 - n : hv;
        const __m512 bias = moe_amx_bias16(b, n, m);
        for (int t = 0; t < T; t += RV) {
            float *yt = y + (size_t)t * ldy + n;
            const int8_t *xt = xq + (size_t)t * Din;
            const float *dt = dx + (size_t)t * nb;
            const int32_t *ct = cs + (size_t)t * nb;
            const char *wn = w + (size_t)n * wld;
            const bool pf = m == hv && t == 0;
#define TILE(R)                                                                                               \
    (hv == 8 ? (m == 8 ? rows_tile(R, 8, true, yt, ldy, xt, dt, ct, nb, wn, wld, 8, bias, pf)                  \
                       : rows_tile(R, 8, false, yt, ldy, xt, dt, ct, nb, wn, wld, m, bias, pf))                \
             : (m == 16 ? rows_tile(R, 16, true, yt, ldy, xt, dt, ct, nb, wn, wld, 16, bias, pf)               \
                        : rows_tile(R, 16, false, yt, ldy, xt, dt, ct, nb, wn, wld, m, bias, pf)))
            switch (T - t < RV ? T - t : RV) {
            case 1: TILE(1); break;
            case 2: TILE(2); break;
            case 3: TILE(3); break;
            case 4: TILE(4); break;
            case 5: TILE(5); break;
            case 6: TILE(6); break;
            case 7: TILE(7); break;
            default: TILE(8); break;
            }
#undef TILE
        }
    }
}

AMXI void moe_gemm_rows_q8_amx(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *wv, int Din,
                               int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(Din % QB == 0 && n0 < n1);
    const int nb = Din / QB;
    const size_t wld = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)Din);
    MOE_ASSERT(wld * 16 < (size_t)INT32_MAX);
    const char *w = wv;
    if (b && !b->data) b = NULL;
    if (T < AMX_ROWS) {
        few_rows(y, ldy, x, ldx, T, w, wld, Din, n0, n1, b);
        return;
    }
    /* input rows per pass: a multiple of 16 whose codes and scales fit
     * CHUNK_BYTES (16 at least) */
    const size_t rowb = (size_t)Din + 4 * (size_t)nb;
    int chunk = (int)(CHUNK_BYTES / rowb) / 16 * 16;
    if (chunk < 16) chunk = 16;
    const int rows = T < chunk ? (T + 15) / 16 * 16 : chunk;
    /* the pass's codes (rows x Din), scales (rows x nb), then one packed
     * weight tile (nb B tiles and 16 scales each) */
    float *buf = moe_gemm_thread_buffer(((size_t)rows * rowb + (size_t)nb * (BT + 64)) / 4);
    MOE_ASSERT(buf && "gemm_fast: out of memory for the quantized input rows");
    int8_t *xq = (int8_t *)buf;
    float *dx = (float *)(xq + (size_t)rows * Din);
    char *bp = (char *)(dx + (size_t)rows * nb);
    float *sc = (float *)(bp + (size_t)nb * BT);
    moe_amx_int8_configure();
    for (int t0 = 0; t0 < T; t0 += chunk) {
        const int tn = T - t0 < chunk ? T - t0 : chunk, tp = (tn + 15) / 16 * 16;
        for (int t = 0; t < tn; t++) moe_quantize_x_q8(xq + (size_t)t * Din, dx + (size_t)t * nb, x + (size_t)(t0 + t) * ldx, nb);
        memset(xq + (size_t)tn * Din, 0, (size_t)(tp - tn) * Din);
        memset(dx + (size_t)tn * nb, 0, (size_t)(tp - tn) * nb * sizeof(float));
        for (int n = n0; n < n1; n += 16) {
            const int m = n1 - n < 16 ? n1 - n : 16;
            pack_weights(bp, sc, w + (size_t)n * wld, wld, m, nb);
            const __m512 bias = moe_amx_bias16(b, n, m);
            for (int g = 0; g < tn; g += 16) {
                float *yg = y + (size_t)(t0 + g) * ldy + n;
                const int8_t *xg = xq + (size_t)g * Din;
                const float *dg = dx + (size_t)g * nb;
                if (tn - g >= 16)
                    tile_rows(16, yg, ldy, xg, (size_t)Din, dg, nb, bp, sc, m, bias);
                else
                    tile_rows(tn - g, yg, ldy, xg, (size_t)Din, dg, nb, bp, sc, m, bias);
            }
        }
    }
    _tile_release();
}
