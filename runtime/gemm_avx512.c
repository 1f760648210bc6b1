/* gemm_avx512.c - AVX-512 kernels of the fast matrix product: the same
 * tiling as gemm_avx2.c (read that first) with 16 lanes and 32 registers,
 * so the batch tile is 4 input rows x 6 weight rows (24 accumulators), and
 * rows of a decode step take 8 (one or two rows) or 6 weight rows at a time.
 * bf16 weights take the even/odd order of gemm_eo.h (16 lanes, 64-byte
 * blocks; decode tiles of 16, 8 or 6 weight rows). */
#include <immintrin.h>
#include <stdbool.h>

#include "runtime/gemm.h"
#include "runtime/gemm_fast_impl.h"
#include "runtime/status.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum { TB = 64 };  /* input rows per cache block */
enum { PF = 512 }; /* bytes ahead to prefetch weight rows in decode tiles */

AVX512 INLINE __m512 load_w16(const char *row, const enum moe_dtype dt, int k)
{
    if (dt == MOE_DTYPE_F32) return _mm512_loadu_ps((const float *)row + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k));
    if (dt == MOE_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

INLINE float load_w1(const char *row, const enum moe_dtype dt, int k)
{
    if (dt == MOE_DTYPE_F32) return ((const float *)row)[k];
    uint16_t h = ((const uint16_t *)row)[k];
    return dt == MOE_DTYPE_BF16 ? moe_bf16_to_f32(h) : moe_f16_to_f32(h);
}

/* Fixed order: 256-bit halves added, then as gemm_avx2.c. */
AVX512 INLINE float hsum16(__m512 v)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[r*ldy + c] = x_r . w_c (+ bias) for r < R, c < C; w_c = w + c*wld. */
AVX512 INLINE void tile(const int R, const int C, const enum moe_dtype dt, float *y, size_t ldy,
                      const float *x, size_t ldx, const char *w, size_t wld, int Din,
                      const struct moe_tensor *b, int n)
{
    __m512 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= Din; k += 16) {
        __m512 wv[8];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            /* decode streams weights once from memory: keep loads in flight */
            if (R < 4)
                _mm_prefetch(w + (size_t)c * wld + (size_t)k * (dt == MOE_DTYPE_F32 ? 4 : 2) + PF,
                             _MM_HINT_T0);
            wv[c] = load_w16(w + (size_t)c * wld, dt, k);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float *xr = x + (size_t)r * ldx + k;
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(xr), wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = hsum16(acc[r][c]);
            const char *wc = w + (size_t)c * wld;
            for (int kk = k; kk < Din; kk++) s += x[(size_t)r * ldx + kk] * load_w1(wc, dt, kk);
            y[(size_t)r * ldy + c] = s + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
        }
}

/* R <= 3 rows against weight rows [n0, n1); w points at row n0. */
AVX512 INLINE void few_rows(const enum moe_dtype dt, float *y, size_t ldy, const float *x,
                            size_t ldx, int R, const char *w, size_t wld, int Din, int n0, int n1,
                          const struct moe_tensor *b)
{
    int n = n0;
    switch (R) {
    case 1:
        for (; n + 8 <= n1; n += 8)
            tile(1, 8, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++) tile(1, 1, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    case 2:
        for (; n + 8 <= n1; n += 8)
            tile(2, 8, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++) tile(2, 1, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    default:
        for (; n + 6 <= n1; n += 6)
            tile(3, 6, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++) tile(3, 1, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    }
}

/* C weight rows of dtype dt to fp32 (exact), for reuse across a row block. */
AVX512 INLINE void widen_rows(float *dst, const enum moe_dtype dt, const char *w, size_t wld,
                            int C, int Din)
{
    for (int c = 0; c < C; c++) {
        const char *src = w + (size_t)c * wld;
        float *d = dst + (size_t)c * Din;
        int k = 0;
        for (; k + 16 <= Din; k += 16) _mm512_storeu_ps(d + k, load_w16(src, dt, k));
        for (; k < Din; k++) d[k] = load_w1(src, dt, k);
    }
}

#define EO_ATTR AVX512
#define EO_FN(name) name##_512
#define EO_V __m512
#define EO_VI __m512i
#define EO_W 16
#define EO_REGS 32
#define EO_MAXC 16
#define EO_C1 16
#define EO_C2 8
#define EO_C3 6
#define EO_C4 6
#define EO_PF 256
#define EO_ZERO _mm512_setzero_ps
#define EO_SET1I _mm512_set1_epi32
#define EO_LOADU _mm512_loadu_ps
#define EO_LOADI _mm512_loadu_si512
#define EO_STOREU _mm512_storeu_ps
#define EO_CASTPS _mm512_castsi512_ps
#define EO_SLLI _mm512_slli_epi32
#define EO_AND _mm512_and_si512
#define EO_FMA _mm512_fmadd_ps
#define EO_HSUM hsum16
#define EO_DEINTERLEAVE(d, s) deinterleave32(d, s)

/* 32 inputs to 16 even then 16 odd. */
AVX512 INLINE void deinterleave32(float *d, const float *s)
{
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const __m512 a = _mm512_loadu_ps(s), c = _mm512_loadu_ps(s + 16);
    _mm512_storeu_ps(d, _mm512_permutex2var_ps(a, ev, c));
    _mm512_storeu_ps(d + 16, _mm512_permutex2var_ps(a, od, c));
}

#include "runtime/gemm_eo.h"

/* All T rows against weight rows [n0, n1).  Blocks of TB rows; in a block
 * of at least 8 rows the weights of each tile column group are widened to
 * fp32 once (into a stack buffer of WBUF floats) rather than once per tile. */
AVX512 INLINE void rows_dt(const enum moe_dtype dt, float *y, size_t ldy, const float *x,
                         size_t ldx, int T, const void *wv, int Din, int n0, int n1,
                         const struct moe_tensor *b)
{
    enum { C = 6, WBUF = 6 * 4096 };
    const char *w = wv;
    const size_t wld = (size_t)Din * (dt == MOE_DTYPE_F32 ? 4 : 2), fld = (size_t)Din * 4;
    float wbuf[WBUF];
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TB) {
        const int tn = T - t0 < TB ? T - t0 : TB;
        float *yb = y + (size_t)t0 * ldy;
        const float *xb = x + (size_t)t0 * ldx;
        if (tn < 4) {
            few_rows(dt, yb, ldy, xb, ldx, tn, w + n0 * wld, wld, Din, n0, n1, b);
            continue;
        }
        const int t4 = tn & ~3, rem = tn - t4;
        const bool widen = dt != MOE_DTYPE_F32 && tn >= 8 && (size_t)C * Din <= WBUF;
        int n = n0;
        for (; n + C <= n1; n += C) {
            const char *wn = w + n * wld;
            if (widen) {
                widen_rows(wbuf, dt, wn, wld, C, Din);
                const char *wf = (const char *)wbuf;
                for (int t = 0; t < t4; t += 4)
                    tile(4, C, MOE_DTYPE_F32, yb + t * ldy + n, ldy, xb + t * ldx, ldx, wf, fld,
                         Din, b, n);
                if (rem)
                    few_rows(MOE_DTYPE_F32, yb + t4 * ldy, ldy, xb + t4 * ldx, ldx, rem, wf, fld,
                             Din, n, n + C, b);
            } else {
                for (int t = 0; t < t4; t += 4)
                    tile(4, C, dt, yb + t * ldy + n, ldy, xb + t * ldx, ldx, wn, wld, Din, b, n);
                if (rem)
                    few_rows(dt, yb + t4 * ldy, ldy, xb + t4 * ldx, ldx, rem, wn, wld, Din, n,
                             n + C, b);
            }
        }
        for (; n < n1; n++) {
            const char *wn = w + n * wld;
            for (int t = 0; t < t4; t += 4)
                tile(4, 1, dt, yb + t * ldy + n, ldy, xb + t * ldx, ldx, wn, wld, Din, b, n);
            if (rem)
                few_rows(dt, yb + t4 * ldy, ldy, xb + t4 * ldx, ldx, rem, wn, wld, Din, n, n + 1, b);
        }
    }
}

AVX512 void moe_gemm_rows_avx512(float *y, size_t ldy, const float *x, size_t ldx, int T,
                               const void *w, enum moe_dtype wt, int Din, int n0, int n1,
                             const struct moe_tensor *b)
{
    switch (wt) {
    case MOE_DTYPE_F32: rows_dt(MOE_DTYPE_F32, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_BF16: rows_bf16_512(y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_F16: rows_dt(MOE_DTYPE_F16, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    default: MOE_ASSERT(!"gemm_fast: weights must be F32, F16 or BF16");
    }
}

