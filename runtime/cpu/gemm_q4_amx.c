/* gemm_q4_amx.c - the AMX kernel sets' matrix product over four-bit
 * weights (Q4_1, Q4_G32, Q4_G128, Q4_K: runtime/core/tensor.h; a Q4_K
 * group of 32 is a group with its block's d_j and m_j): tile products on
 * AMX-INT8 from AMX_ROWS (8) input rows on, an AVX512-VNNI instance of the
 * same expression for fewer (decode), built as gemm_q8_amx.c.
 *
 * Inputs: the four-bit kernels' streams (moe_q4_quantize_input: per
 * group the blocks' int8 codes and scales dx, and S, the sum over the
 * group's blocks in order of dx times the block's code sum).
 *
 * Numerics (these sets' own; gemm_q4.c splits each run over 8 lanes):
 * output n of row t is acc = 0, then for each group in order, for each run
 * k of 32 codes q (0..15) against input block k: acc = fma(float(P_k),
 * dx_k * d, acc), P_k the run's 32 products q * qx summed exactly; then
 * the group's offset acc = fma(S, m, acc); then + bias.  So an output is
 * the quantized input row times the exactly dequantized weights q d + m
 * (gemm_q4.c says why the offset takes S), to fp32 rounding, and a row
 * gives the same bits alone or in any batch.
 *
 * Tiles: a tile of 16 weight rows is unpacked per run to 32 codes in
 * element order (byte j holds element j low, j + 16 high) and rearranged
 * into B's layout (gemm_amx_int8.h), the groups' d and m beside (16 each,
 * 0 past the slice), once per pass of input rows; the input streams are A
 * in place (stride: the stream's length).  Fewer rows: 16 weight rows two
 * to a register, codes unpacked by a shift and a mask, vpdpbusd (codes
 * unsigned, inputs signed: no offset), three folds, d and m gathered. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_amx_int8.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/core/status.h"

enum {
    RUN = 32,              /* codes per run (16 bytes) and per input block */
    CHUNK_BYTES = 1 << 20, /* input streams of one pass */
    RV = 4,                /* input rows of a VNNI tile */
    AMX_ROWS = 8,          /* from this many input rows the tiles (below, the unpacking costs more than they save) */
};

/* A weight format's shape: runs per group, head bytes, group bytes. */
struct q4f {
    int nr, hb;
    size_t gb;
};

static struct q4f q4f_of(enum moe_dtype dt)
{
    const int nr = moe_q4_head_runs(dt), hb = dt == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD;
    return (struct q4f){nr, hb, (size_t)hb + 16 * (size_t)nr}; /* hb, gb: not Q4_K's */
}

/* Q4_K: a block's heads of 16 rows: d and dmin widened, and the three
 * words of 6-bit scales and minimums (MOE_DTYPE_Q4_K), one lane a row. */
struct kheads {
    __m512 d, dmin;
    __m512i a, b, c;
};

/* The heads of the blocks at blk of 16 rows (offsets vo from blk). */
AMXI INLINE void k_block16(const char *blk, __m512i vo, struct kheads *k)
{
    const __m512i h = _mm512_i32gather_epi32(vo, blk, 1);
    k->a = _mm512_i32gather_epi32(vo, blk + 4, 1);
    k->b = _mm512_i32gather_epi32(vo, blk + 8, 1);
    k->c = _mm512_i32gather_epi32(vo, blk + 12, 1);
    k->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    k->dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
}

/* Group j's d_j = d * sc_j and m_j = -(dmin * mn_j) of the 16 rows: the
 * values moe_q4_k_heads gives (exact products, the sign flipped). */
AMXI INLINE void k_group16(const struct kheads *k, int j, __m512 *d, __m512 *m)
{
    const __m512i lo6 = _mm512_set1_epi32(63), lo4 = _mm512_set1_epi32(15), hi2 = _mm512_set1_epi32(0x30);
    __m512i sc, mn;
    if (j < 4) {
        const __m128i s = _mm_cvtsi32_si128(8 * j);
        sc = _mm512_and_si512(_mm512_srl_epi32(k->a, s), lo6);
        mn = _mm512_and_si512(_mm512_srl_epi32(k->b, s), lo6);
    } else {
        const __m128i s = _mm_cvtsi32_si128(8 * (j - 4)), s2 = _mm_cvtsi32_si128(8 * (j - 4) + 2),
                      s4 = _mm_cvtsi32_si128(8 * (j - 4) + 4);
        sc = _mm512_or_si512(_mm512_and_si512(_mm512_srl_epi32(k->c, s), lo4),
                             _mm512_and_si512(_mm512_srl_epi32(k->a, s2), hi2));
        mn = _mm512_or_si512(_mm512_and_si512(_mm512_srl_epi32(k->c, s4), lo4),
                             _mm512_and_si512(_mm512_srl_epi32(k->b, s2), hi2));
    }
    *d = _mm512_mul_ps(k->d, _mm512_cvtepi32_ps(sc));
    *m = _mm512_xor_ps(_mm512_mul_ps(k->dmin, _mm512_cvtepi32_ps(mn)), _mm512_set1_ps(-0.0f));
}

/* 32 codes of a run (16 bytes at p) in element order. */
AMXI INLINE __m256i unpack_run(const char *p)
{
    const __m128i c = _mm_loadu_si128((const __m128i *)p), low = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(c, 4), low), _mm_and_si128(c, low));
}

/* The d and m of group at `at` of 16 rows (row offsets vo from w, rows
 * past the slice repeating its last). */
AMXI INLINE void heads16(const enum moe_dtype dt, const char *w, size_t at, __m512i vo, __m512 *d, __m512 *m)
{
    if (dt == MOE_DTYPE_Q4_1) {
        const __m512i h = _mm512_i32gather_epi32(vo, w + at, 1);
        *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
        *m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
    } else {
        *d = _mm512_i32gather_ps(vo, w + at, 1);
        *m = _mm512_i32gather_ps(vo, w + at + 4, 1);
    }
}

/* Offsets of 16 rows from the first (stride wld), rows from m on
 * repeating row m - 1. */
AMXI INLINE __m512i row_offsets(size_t wld, int m)
{
    _Alignas(64) int32_t off[16];
    for (int i = 0; i < 16; i++) off[i] = (int32_t)((size_t)(i < m ? i : m - 1) * wld);
    return _mm512_load_si512((const void *)off);
}

/* Weight rows w (m of them, stride wld, ng groups) as B tiles at bp (one
 * per run) and each group's d then m at sc (16 each, 0 past m). */
AMXI static void pack_weights(enum moe_dtype dt, char *bp, float *sc, const char *w, size_t wld, int m, int ng)
{
    const struct q4f f = q4f_of(dt);
    const __m512i vo = row_offsets(wld, m);
    const __mmask16 in = (__mmask16)((1u << m) - 1);
    /* Q4_K: block by block, the block's 8 groups unrolled (constant shifts
     * and lanes) */
    for (int b = 0; dt == MOE_DTYPE_Q4_K && b < ng / 8; b++) {
        const size_t bo = (size_t)b * MOE_Q4_K_BYTES;
        struct kheads kh;
        k_block16(w + bo, vo, &kh);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int g = 8 * b + j;
            const size_t qo = bo + 16 + 32 * (size_t)(j >> 1);
            __m512i z[8];
            for (int i = 0; i < 8; i++) {
                const __m256i lo = i < m ? _mm256_loadu_si256((const __m256i *)(w + (size_t)i * wld + qo))
                                         : _mm256_setzero_si256();
                const __m256i hi = i + 8 < m ? _mm256_loadu_si256((const __m256i *)(w + (size_t)(i + 8) * wld + qo))
                                             : _mm256_setzero_si256();
                const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                z[i] = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(15));
            }
            moe_amx_b_tile(bp + (size_t)g * BT, z);
            __m512 d, mv;
            k_group16(&kh, j, &d, &mv);
            _mm512_store_ps(sc + (size_t)g * 32, _mm512_maskz_mov_ps(in, d));
            _mm512_store_ps(sc + (size_t)g * 32 + 16, _mm512_maskz_mov_ps(in, mv));
        }
    }
    for (int g = 0; dt != MOE_DTYPE_Q4_K && g < ng; g++) {
        for (int k = 0; k < f.nr; k++) {
            __m512i z[8];
            for (int j = 0; j < 8; j++) {
                const size_t at = (size_t)g * f.gb + (size_t)f.hb + 16 * (size_t)k;
                const __m256i a = j < m ? unpack_run(w + (size_t)j * wld + at) : _mm256_setzero_si256();
                const __m256i c = j + 8 < m ? unpack_run(w + (size_t)(j + 8) * wld + at) : _mm256_setzero_si256();
                z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1);
            }
            moe_amx_b_tile(bp + ((size_t)g * f.nr + (size_t)k) * BT, z);
        }
        __m512 d, mv;
        heads16(dt, w, (size_t)g * f.gb, vo, &d, &mv);
        _mm512_store_ps(sc + (size_t)g * 32, _mm512_maskz_mov_ps(in, d));
        _mm512_store_ps(sc + (size_t)g * 32 + 16, _mm512_maskz_mov_ps(in, mv));
    }
}

/* Block b's products c into acc[t] for the R input rows (streams at xs,
 * stride rs); after a group's last run, its offset. */
AMXI INLINE void scale_block(__m512 *acc, const int32_t *c, const char *xs, size_t rs, int R, int b, int nr,
                             size_t xg, const float *sc)
{
    const int g = b / nr, k = b % nr;
    const __m512 d = _mm512_load_ps(sc + (size_t)g * 32);
    const char *h = xs + (size_t)g * xg;
    for (int t = 0; t < R; t++)
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c + 16 * t))),
                                 _mm512_mul_ps(_mm512_set1_ps(((const float *)(h + (size_t)t * rs))[2 + k]), d), acc[t]);
    if (k == nr - 1) {
        const __m512 m = _mm512_load_ps(sc + (size_t)g * 32 + 16);
        for (int t = 0; t < R; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(((const float *)(h + (size_t)t * rs))[1]), m, acc[t]);
    }
}

/* R (1..16) input streams at xs (stride rs; 16 readable) against one
 * packed weight tile of m rows: y[t*ldy + i] for t < R, i < m. */
AMXI INLINE void tile_rows(const int R, float *y, size_t ldy, const char *xs, size_t rs, int ng, int nr,
                           const char *bp, const float *sc, int m, __m512 bias)
{
    __m512 acc[16];
    for (int t = 0; t < R; t++) acc[t] = _mm512_setzero_ps();
    _Alignas(64) int32_t c[2][256];
    const size_t xg = 32 + 32 * (size_t)nr;
    const int nb = ng * nr;
#define A_OF(b) (xs + (size_t)((b) / nr) * xg + 32 + 32 * (size_t)((b) % nr))
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        moe_amx_dot2(c[0], c[1], A_OF(b), A_OF(b + 1), rs, bp + (size_t)b * BT, bp + (size_t)(b + 1) * BT);
        scale_block(acc, c[0], xs, rs, R, b, nr, xg, sc);
        scale_block(acc, c[1], xs, rs, R, b + 1, nr, xg, sc);
    }
    if (b < nb) {
        moe_amx_dot1(c[0], A_OF(b), rs, bp + (size_t)b * BT);
        scale_block(acc, c[0], xs, rs, R, b, nr, xg, sc);
    }
#undef A_OF
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    for (int t = 0; t < R; t++) _mm512_mask_storeu_ps(y + (size_t)t * ldy, mask, _mm512_add_ps(acc[t], bias));
}

/* R (1..RV) input streams at xs (stride rs) against the m (1..16) weight
 * rows at w: y[t*ldy + 0 .. m). */
AMXI INLINE void rows_tile(const enum moe_dtype dt, const int R, float *y, size_t ldy, const char *xs, size_t rs,
                           int ng, const char *w, size_t wld, int m, __m512 bias, bool pf)
{
    const struct q4f f = q4f_of(dt);
    const size_t xg = 32 + 32 * (size_t)f.nr;
    const char *r[16];
    for (int i = 0; i < 16; i++) r[i] = w + (size_t)(i < m ? i : m - 1) * wld;
    const __m512i vo = row_offsets(wld, m);
    const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4), low = _mm512_set1_epi8(15);
    __m512 acc[RV];
    for (int t = 0; t < R; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        const size_t at = (size_t)g * f.gb;
        __m512 d, mv;
        heads16(dt, w, at, vo, &d, &mv);
        for (int k = 0; k < f.nr; k++) {
            const size_t rk = at + (size_t)f.hb + 16 * (size_t)k;
            __m512i wq[8];
            for (int p = 0; p < 8; p++) {
                if (pf && k == 0) {
                    _mm_prefetch(r[2 * p] + 16 * wld + at, _MM_HINT_T1);
                    _mm_prefetch(r[2 * p + 1] + 16 * wld + at, _MM_HINT_T1);
                }
                const __m256i c0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(r[2 * p] + rk)));
                const __m256i c1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(r[2 * p + 1] + rk)));
                wq[p] = _mm512_and_si512(
                    _mm512_srlv_epi64(_mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1), shift), low);
            }
            for (int t = 0; t < R; t++) {
                const char *xh = xs + (size_t)t * rs + (size_t)g * xg;
                const __m512i x = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(xh + 32 + 32 * k)));
                __m512i v[8];
                for (int p = 0; p < 8; p++) v[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[p], x);
                const __m512i s = moe_amx_fold(moe_amx_fold(moe_amx_fold(v[0], v[1]), moe_amx_fold(v[2], v[3])),
                                               moe_amx_fold(moe_amx_fold(v[4], v[5]), moe_amx_fold(v[6], v[7])));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(((const float *)xh)[2 + k]), d),
                                         acc[t]);
            }
        }
        for (int t = 0; t < R; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(((const float *)(xs + (size_t)t * rs + (size_t)g * xg))[1]), mv,
                                     acc[t]);
    }
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    for (int t = 0; t < R; t++) _mm512_mask_storeu_ps(y + (size_t)t * ldy, mask, _mm512_add_ps(acc[t], bias));
}

/* rows_tile's Q4_K instance: block by block, its 16 rows' heads from 4
 * gathers, the block's 8 groups unrolled (constant shifts and lanes); the
 * same expression (a group's run, then its offset, groups in order). */
AMXI INLINE void rows_tile_k(const int R, float *y, size_t ldy, const char *xs, size_t rs, int ng, const char *w,
                             size_t wld, int m, __m512 bias, bool pf)
{
    const char *r[16];
    for (int i = 0; i < 16; i++) r[i] = w + (size_t)(i < m ? i : m - 1) * wld;
    const __m512i vo = row_offsets(wld, m), low = _mm512_set1_epi8(15);
    __m512 acc[RV];
    for (int t = 0; t < R; t++) acc[t] = _mm512_setzero_ps();
    for (int k = 0; k < ng / 8; k++) {
        const size_t bo = (size_t)k * MOE_Q4_K_BYTES;
        if (pf) /* the next 16 rows' block: 144 bytes, 3 lines */
            for (int i = 0; i < 16; i++)
                for (int l = 0; l < 3; l++) _mm_prefetch(r[i] + 16 * wld + bo + 64 * l, _MM_HINT_T1);
        struct kheads kh;
        k_block16(w + bo, vo, &kh);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512 d, mv;
            k_group16(&kh, j, &d, &mv);
            const size_t qo = bo + 16 + 32 * (size_t)(j >> 1);
            __m512i wq[8];
            for (int p = 0; p < 8; p++) {
                const __m512i v = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(r[2 * p] + qo))),
                    _mm256_loadu_si256((const __m256i *)(r[2 * p + 1] + qo)), 1);
                wq[p] = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, low);
            }
            for (int t = 0; t < R; t++) {
                const char *xh = xs + (size_t)t * rs + (size_t)(8 * k + j) * 64;
                const __m512i x = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(xh + 32)));
                __m512i v[8];
                for (int p = 0; p < 8; p++) v[p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[p], x);
                const __m512i s = moe_amx_fold(moe_amx_fold(moe_amx_fold(v[0], v[1]), moe_amx_fold(v[2], v[3])),
                                               moe_amx_fold(moe_amx_fold(v[4], v[5]), moe_amx_fold(v[6], v[7])));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(((const float *)xh)[2]), d),
                                         acc[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(((const float *)xh)[1]), mv, acc[t]);
            }
        }
    }
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    for (int t = 0; t < R; t++) _mm512_mask_storeu_ps(y + (size_t)t * ldy, mask, _mm512_add_ps(acc[t], bias));
}

AMXI static void few_rows(enum moe_dtype dt, float *y, size_t ldy, const char *xs, size_t rs, int T, int ng,
                          const char *w, size_t wld, int n0, int n1, const struct moe_tensor *b)
{
    for (int n = n0; n < n1; n += 16) {
        const int m = n1 - n < 16 ? n1 - n : 16;
        const __m512 bias = moe_amx_bias16(b, n, m);
        for (int t = 0; t < T; t += RV) {
            float *yt = y + (size_t)t * ldy + n;
            const char *xt = xs + (size_t)t * rs, *wn = w + (size_t)n * wld;
            const bool pf = m == 16 && t == 0;
            if (dt == MOE_DTYPE_Q4_K) {
                switch (T - t < RV ? T - t : RV) {
                case 1: rows_tile_k(1, yt, ldy, xt, rs, ng, wn, wld, m, bias, pf); break;
                case 2: rows_tile_k(2, yt, ldy, xt, rs, ng, wn, wld, m, bias, pf); break;
                case 3: rows_tile_k(3, yt, ldy, xt, rs, ng, wn, wld, m, bias, pf); break;
                default: rows_tile_k(4, yt, ldy, xt, rs, ng, wn, wld, m, bias, pf); break;
                }
                continue;
            }
            switch (T - t < RV ? T - t : RV) {
            case 1: rows_tile(dt, 1, yt, ldy, xt, rs, ng, wn, wld, m, bias, pf); break;
            case 2: rows_tile(dt, 2, yt, ldy, xt, rs, ng, wn, wld, m, bias, pf); break;
            case 3: rows_tile(dt, 3, yt, ldy, xt, rs, ng, wn, wld, m, bias, pf); break;
            default: rows_tile(dt, 4, yt, ldy, xt, rs, ng, wn, wld, m, bias, pf); break;
            }
        }
    }
}

AMXI static void rows_dt(const enum moe_dtype dt, float *y, size_t ldy, const float *x, size_t ldx, int T,
                         const char *w, int Din, int n0, int n1, const struct moe_tensor *b)
{
    const struct q4f f = q4f_of(dt);
    const int ng = Din / RUN / f.nr;
    const size_t wld = moe_dtype_row_bytes(dt, (size_t)Din), rs = (size_t)Din + 32 * (size_t)ng;
    MOE_ASSERT(wld * 16 < (size_t)INT32_MAX);
    if (T < AMX_ROWS) {
        char *xs = (char *)moe_gemm_thread_buffer((size_t)T * rs / sizeof(float));
        MOE_ASSERT(xs && "gemm_fast: out of memory for the quantized input rows");
        for (int t = 0; t < T; t++) moe_q4_quantize_input(xs + (size_t)t * rs, x + (size_t)t * ldx, ng, f.nr);
        few_rows(dt, y, ldy, xs, rs, T, ng, w, wld, n0, n1, b);
        return;
    }
    int chunk = (int)(CHUNK_BYTES / rs) / 16 * 16;
    if (chunk < 16) chunk = 16;
    const int rows = T < chunk ? (T + 15) / 16 * 16 : chunk;
    /* the pass's streams (rows x rs), then one packed weight tile (a B
     * tile per run, 32 floats of d and m per group) */
    const size_t nb = (size_t)ng * f.nr;
    char *xs = (char *)moe_gemm_thread_buffer(((size_t)rows * rs + nb * BT + (size_t)ng * 128) / sizeof(float));
    MOE_ASSERT(xs && "gemm_fast: out of memory for the quantized input rows");
    char *bp = xs + (size_t)rows * rs;
    float *sc = (float *)(bp + nb * BT);
    moe_amx_int8_configure();
    for (int t0 = 0; t0 < T; t0 += chunk) {
        const int tn = T - t0 < chunk ? T - t0 : chunk, tp = (tn + 15) / 16 * 16;
        for (int t = 0; t < tn; t++) moe_q4_quantize_input(xs + (size_t)t * rs, x + (size_t)(t0 + t) * ldx, ng, f.nr);
        memset(xs + (size_t)tn * rs, 0, (size_t)(tp - tn) * rs);
        for (int n = n0; n < n1; n += 16) {
            const int m = n1 - n < 16 ? n1 - n : 16;
            pack_weights(dt, bp, sc, w + (size_t)n * wld, wld, m, ng);
            const __m512 bias = moe_amx_bias16(b, n, m);
            for (int g = 0; g < tn; g += 16) {
                float *yg = y + (size_t)(t0 + g) * ldy + n;
                const char *xg = xs + (size_t)g * rs;
                if (tn - g >= 16)
                    tile_rows(16, yg, ldy, xg, rs, ng, f.nr, bp, sc, m, bias);
                else
                    tile_rows(tn - g, yg, ldy, xg, rs, ng, f.nr, bp, sc, m, bias);
            }
        }
    }
    _tile_release();
}

AMXI void moe_gemm_rows_q4_amx(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                               enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(moe_dtype_is_q4(wt) && Din % moe_q4_group(wt) == 0 && n0 < n1);
    if (b && !b->data) b = NULL;
    switch (wt) {
    case MOE_DTYPE_Q4_1: rows_dt(MOE_DTYPE_Q4_1, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_Q4_G32: rows_dt(MOE_DTYPE_Q4_G32, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_Q4_K: rows_dt(MOE_DTYPE_Q4_K, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    default: rows_dt(MOE_DTYPE_Q4_G128, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    }
}
