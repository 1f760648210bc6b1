/* gemm_avx2.c - AVX2/FMA/F16C kernels of the fast matrix product (see
 * gemm_fast.h for the contract and the numeric policy).
 *
 * A tile is R input rows x C weight rows; every k step of 8 loads C weight
 * vectors (converted to fp32 in registers) and R input vectors and issues
 * R*C FMAs into R*C accumulators.  R = 4, C = 3 for batches (12
 * accumulators + 3 weights in the 16 ymm registers, inputs as memory
 * operands); R <= 3 rows take C = 8 or 4 so a decode step still keeps
 * enough independent FMA chains in flight to stream weights at memory
 * speed, with software prefetch PF bytes ahead on each weight row.  Input rows are walked in blocks of 64 so a block stays in L2 while
 * the weight rows of the thread's range pass over it.  bf16 weights take
 * the even/odd order of gemm_eo.h (8 lanes, 32-byte blocks). */
#include <immintrin.h>
#include <stdbool.h>

#include "runtime/gemm.h"
#include "runtime/gemm_fast_impl.h"
#include "runtime/status.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum { TB = 64 };  /* input rows per cache block */
enum { PF = 512 }; /* bytes ahead to prefetch weight rows in decode tiles */

AVX2 INLINE __m256 load_w8(const char *row, const enum moe_dtype dt, int k)
{
    if (dt == MOE_DTYPE_F32) return _mm256_loadu_ps((const float *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    if (dt == MOE_DTYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

INLINE float load_w1(const char *row, const enum moe_dtype dt, int k)
{
    if (dt == MOE_DTYPE_F32) return ((const float *)row)[k];
    uint16_t h = ((const uint16_t *)row)[k];
    return dt == MOE_DTYPE_BF16 ? moe_bf16_to_f32(h) : moe_f16_to_f32(h);
}

/* Fixed order: (lo + hi) halves, then pairs, then the last two. */
AVX2 INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[r*ldy + c] = x_r . w_c (+ bias) for r < R, c < C; w_c = w + c*wld. */
AVX2 INLINE void tile(const int R, const int C, const enum moe_dtype dt, float *y, size_t ldy,
                      const float *x, size_t ldx, const char *w, size_t wld, int Din,
                      const struct moe_tensor *b, int n)
{
    __m256 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= Din; k += 8) {
        __m256 wv[8];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            /* decode streams weights once from memory: keep loads in flight */
            if (R < 4)
                _mm_prefetch(w + (size_t)c * wld + (size_t)k * (dt == MOE_DTYPE_F32 ? 4 : 2) + PF,
                             _MM_HINT_T0);
            wv[c] = load_w8(w + (size_t)c * wld, dt, k);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float *xr = x + (size_t)r * ldx + k;
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr), wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = hsum8(acc[r][c]);
            const char *wc = w + (size_t)c * wld;
            for (int kk = k; kk < Din; kk++) s += x[(size_t)r * ldx + kk] * load_w1(wc, dt, kk);
            y[(size_t)r * ldy + c] = s + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
        }
}

/* R <= 3 rows against weight rows [n0, n1); w points at row n0. */
AVX2 INLINE void few_rows(const enum moe_dtype dt, float *y, size_t ldy, const float *x,
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
        for (; n + 4 <= n1; n += 4)
            tile(2, 4, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++) tile(2, 1, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    default:
        for (; n + 4 <= n1; n += 4)
            tile(3, 4, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++) tile(3, 1, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    }
}

/* C weight rows of dtype dt to fp32 (exact), for reuse across a row block. */
AVX2 INLINE void widen_rows(float *dst, const enum moe_dtype dt, const char *w, size_t wld,
                            int C, int Din)
{
    for (int c = 0; c < C; c++) {
        const char *src = w + (size_t)c * wld;
        float *d = dst + (size_t)c * Din;
        int k = 0;
        for (; k + 8 <= Din; k += 8) _mm256_storeu_ps(d + k, load_w8(src, dt, k));
        for (; k < Din; k++) d[k] = load_w1(src, dt, k);
    }
}

#define EO_ATTR AVX2
#define EO_FN(name) name##_256
#define EO_V __m256
#define EO_VI __m256i
#define EO_W 8
#define EO_REGS 16
#define EO_MAXC 8
#define EO_C1 8
#define EO_C2 4
#define EO_C3 2
#define EO_C4 3
#define EO_PF 512
#define EO_ZERO _mm256_setzero_ps
#define EO_SET1I _mm256_set1_epi32
#define EO_LOADU _mm256_loadu_ps
#define EO_LOADI(p) _mm256_loadu_si256((const __m256i *)(p))
#define EO_STOREU _mm256_storeu_ps
#define EO_CASTPS _mm256_castsi256_ps
#define EO_SLLI _mm256_slli_epi32
#define EO_AND _mm256_and_si256
#define EO_FMA _mm256_fmadd_ps
#define EO_HSUM hsum8
#define EO_DEINTERLEAVE(d, s) deinterleave16(d, s)

/* 16 inputs to 8 even then 8 odd. */
AVX2 INLINE void deinterleave16(float *d, const float *s)
{
    const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(s), idx);     /* e0..e3 o0..o3 */
    const __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(s + 8), idx); /* e4..e7 o4..o7 */
    _mm256_storeu_ps(d, _mm256_permute2f128_ps(a, b, 0x20));
    _mm256_storeu_ps(d + 8, _mm256_permute2f128_ps(a, b, 0x31));
}

#include "runtime/gemm_eo.h"

/* All T rows against weight rows [n0, n1).  Blocks of TB rows; in a block
 * of at least 8 rows the weights of each tile column group are widened to
 * fp32 once (into a stack buffer of WBUF floats) rather than once per tile. */
AVX2 INLINE void rows_dt(const enum moe_dtype dt, float *y, size_t ldy, const float *x,
                         size_t ldx, int T, const void *wv, int Din, int n0, int n1,
                         const struct moe_tensor *b)
{
    enum { C = 3, WBUF = 3 * 4096 };
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

AVX2 void moe_gemm_rows_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T,
                             const void *w, enum moe_dtype wt, int Din, int n0, int n1,
                             const struct moe_tensor *b)
{
    switch (wt) {
    case MOE_DTYPE_F32: rows_dt(MOE_DTYPE_F32, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_BF16: rows_bf16_256(y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_F16: rows_dt(MOE_DTYPE_F16, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    default: MOE_ASSERT(!"gemm_fast: weights must be F32, F16 or BF16");
    }
}

/* Four independent XOR chains over 32-byte loads: never compute bound. */
AVX2 uint64_t moe_read_sweep_avx2(const void *p, size_t n)
{
    const char *c = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(c + i)));
        a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(c + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(c + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(c + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    uint64_t r = (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 1) ^
                 (uint64_t)_mm256_extract_epi64(a0, 2) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
    for (; i < n; i++) r ^= (uint64_t)(unsigned char)c[i] << (i % 8 * 8);
    return r;
}

AVX2 float moe_dot_avx2(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

AVX2 void moe_scale_axpy_avx2(float *y, float s, float a, const float *x, int n)
{
    const __m256 vs = _mm256_set1_ps(s), va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i),
                                                _mm256_mul_ps(vs, _mm256_loadu_ps(y + i))));
    for (; i < n; i++) y[i] = y[i] * s + a * x[i];
}
