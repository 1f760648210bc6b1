/* gemm_avx512.c - AVX-512 kernels of the fast matrix product: the same
 * tiling as gemm_avx2.c (read that first) with 16 lanes and 32 registers,
 * so the batch tile is 4 input rows x 6 weight rows (24 accumulators), and
 * rows of a decode step take 8 (one or two rows) or 6 weight rows at a time.
 * Kept parallel to gemm_avx2.c, except for bf16 weights, which take the
 * even/odd order below.
 *
 * bf16 (the usual checkpoint dtype): a 64-byte line holds 32 weights; as
 * 32-bit lanes, the low halves are the even weights and the high halves
 * the odd ones, so one shift and one mask give both as fp32 (two cheap
 * operations per line instead of two widening loads and two shifts).  The
 * input rows are deinterleaved to match (per 32 inputs: 16 even, 16 odd)
 * into a per-thread buffer.  Fewer instructions per line let the core keep
 * more lines in flight, which is what a decode step (reading every weight
 * once from DRAM) is limited by.  Every path over bf16 weights (the decode
 * tiles, the prefill tiles, the widened rows) accumulates lane j of block b
 * as even element 32b+2j then odd element 32b+2j+1, so a row gives the same
 * bits alone or in any batch. */
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "runtime/gemm.h"
#include "runtime/gemm_fast_impl.h"
#include "runtime/status.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum { TB = 64 };  /* input rows per cache block */
enum { PF = 512 }; /* bytes ahead to prefetch weight rows in decode tiles */
enum { PF_EO = 256 }; /* the same for the bf16 decode tiles (one per line) */

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

/* bf16 tile in the even/odd order: y[r*ldy + c] = x_r . w_c (+ bias).  xs
 * holds the R input rows deinterleaved (row stride ldx); w is raw bf16
 * (wide false, row stride wld bytes) or bf16 widened by widen_rows_eo (wide
 * true, fp32 in the same deinterleaved order). */
AVX512 INLINE void tile_eo(const int R, const int C, const bool wide, float *y, size_t ldy,
                           const float *xs, size_t ldx, const char *w, size_t wld, int Din,
                           const struct moe_tensor *b, int n)
{
    __m512 acc[4][16];
    const __m512i odd = _mm512_set1_epi32((int)0xffff0000);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    /* Small tiles take a block in one pass (each weight line loaded once,
     * both halves used at once); a 4-row tile would need too many registers
     * for that and takes the even halves, then the odd ones.  Either way
     * each accumulator sees even then odd: the same order. */
    const bool one_pass = R * C + 2 * R + 4 <= 32;
    const size_t step = wide ? 128 : 64; /* bytes of one weight row per block */
    const char *wk = w;
    const int k32 = Din & ~31;
    for (int k = 0; k < k32; k += 32, wk += step) {
        if (one_pass) {
            __m512 xe[4], xo[4];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                xe[r] = _mm512_loadu_ps(xs + (size_t)r * ldx + k);
                xo[r] = _mm512_loadu_ps(xs + (size_t)r * ldx + k + 16);
            }
            const char *p = wk;
#pragma GCC unroll 16
            for (int c = 0; c < C; c++, p += wld) {
                __m512 lo, hi;
                if (wide) {
                    lo = _mm512_loadu_ps((const float *)p);
                    hi = _mm512_loadu_ps((const float *)p + 16);
                } else {
                    _mm_prefetch(p + PF_EO, _MM_HINT_T0);
                    /* two loads of the line (the second hits L1), each
                     * folded into its operation: holding the line in a
                     * register makes GCC spill */
                    const char *q = p;
                    __asm__("" : "+r"(q));
                    lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16));
                    hi = _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(q), odd));
                }
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    acc[r][c] = _mm512_fmadd_ps(xe[r], lo, acc[r][c]);
                    acc[r][c] = _mm512_fmadd_ps(xo[r], hi, acc[r][c]);
                }
            }
            continue;
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512 xv[4];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) xv[r] = _mm512_loadu_ps(xs + (size_t)r * ldx + k + 16 * h);
            const char *p = wk;
            /* hide that the second pass reads the lines of the first: holding
             * them in registers between the passes would spill */
            __asm__ volatile("" : "+r"(p));
#pragma GCC unroll 16
            for (int c = 0; c < C; c++, p += wld) {
                __m512 wv;
                if (wide) {
                    wv = _mm512_loadu_ps((const float *)p + 16 * h);
                } else {
                    if (h == 0) _mm_prefetch(p + PF_EO, _MM_HINT_T0);
                    const __m512i v = _mm512_loadu_si512(p);
                    wv = _mm512_castsi512_ps(h ? _mm512_and_si512(v, odd) : _mm512_slli_epi32(v, 16));
                }
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = hsum16(acc[r][c]);
            const char *wc = w + (size_t)c * wld;
            for (int kk = k32; kk < Din; kk++)
                s += xs[(size_t)r * ldx + kk] *
                     (wide ? ((const float *)wc)[kk] : load_w1(wc, MOE_DTYPE_BF16, kk));
            y[(size_t)r * ldy + c] = s + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
        }
}

/* R <= 3 deinterleaved rows against bf16 weight rows [n0, n1) (see few_rows). */
AVX512 INLINE void few_rows_eo(const bool wide, float *y, size_t ldy, const float *xs, size_t ldx,
                               int R, const char *w, size_t wld, int Din, int n0, int n1,
                               const struct moe_tensor *b)
{
    int n = n0;
    switch (R) {
    case 1:
        for (; n + 16 <= n1; n += 16)
            tile_eo(1, 16, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++)
            tile_eo(1, 1, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    case 2:
        for (; n + 8 <= n1; n += 8)
            tile_eo(2, 8, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++)
            tile_eo(2, 1, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    default:
        for (; n + 6 <= n1; n += 6)
            tile_eo(3, 6, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++)
            tile_eo(3, 1, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    }
}

/* C bf16 weight rows to fp32 in the even/odd order (tails in place). */
AVX512 INLINE void widen_rows_eo(float *dst, const char *w, size_t wld, int C, int Din)
{
    const __m512i odd = _mm512_set1_epi32((int)0xffff0000);
    const int k32 = Din & ~31;
    for (int c = 0; c < C; c++) {
        const char *src = w + (size_t)c * wld;
        float *d = dst + (size_t)c * Din;
        for (int k = 0; k < k32; k += 32) {
            const __m512i v = _mm512_loadu_si512(src + (size_t)k * 2);
            _mm512_storeu_ps(d + k, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
            _mm512_storeu_ps(d + k + 16, _mm512_castsi512_ps(_mm512_and_si512(v, odd)));
        }
        for (int k = k32; k < Din; k++) d[k] = load_w1(src, MOE_DTYPE_BF16, k);
    }
}

/* Each thread's buffer for deinterleaved input rows: grown when a call
 * needs more, freed by the key's destructor when the thread exits (engine
 * threads and their OpenMP teams come and go in a server). */
struct xs_buf {
    float *p;
    size_t cap; /* floats */
};
static pthread_key_t xs_key;
static pthread_once_t xs_once = PTHREAD_ONCE_INIT;
static bool xs_key_ok;

static void xs_free(void *v)
{
    struct xs_buf *b = v;
    free(b->p);
    free(b);
}

static void xs_key_init(void) { xs_key_ok = pthread_key_create(&xs_key, xs_free) == 0; }

/* This thread's buffer of at least n floats; NULL when out of memory. */
static float *xs_get(size_t n)
{
    pthread_once(&xs_once, xs_key_init);
    if (!xs_key_ok) return NULL;
    struct xs_buf *b = pthread_getspecific(xs_key);
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return NULL;
        if (pthread_setspecific(xs_key, b)) {
            free(b);
            return NULL;
        }
    }
    if (n > b->cap) {
        free(b->p);
        b->cap = (n + 1023) / 1024 * 1024;
        b->p = aligned_alloc(64, b->cap * sizeof(float));
        if (!b->p) b->cap = 0;
    }
    return b->p;
}

/* T input rows deinterleaved per 32 (16 even, 16 odd; the tail in place)
 * into this thread's buffer, row stride Din; NULL when out of memory. */
AVX512 static const float *deinterleave_rows(const float *x, size_t ldx, int T, int Din)
{
    float *buf = xs_get((size_t)T * (size_t)Din);
    if (!buf) return NULL;
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const int k32 = Din & ~31;
    for (int t = 0; t < T; t++) {
        const float *src = x + (size_t)t * ldx;
        float *d = buf + (size_t)t * Din;
        for (int k = 0; k < k32; k += 32) {
            const __m512 a = _mm512_loadu_ps(src + k), c = _mm512_loadu_ps(src + k + 16);
            _mm512_storeu_ps(d + k, _mm512_permutex2var_ps(a, ev, c));
            _mm512_storeu_ps(d + k + 16, _mm512_permutex2var_ps(a, od, c));
        }
        for (int k = k32; k < Din; k++) d[k] = src[k];
    }
    return buf;
}

/* All T rows against bf16 weight rows [n0, n1): rows_dt's blocking in the
 * even/odd order. */
AVX512 static void rows_bf16(float *y, size_t ldy, const float *x, size_t ldx, int T,
                             const void *wv, int Din, int n0, int n1, const struct moe_tensor *b)
{
    enum { C = 6, WBUF = 6 * 4096 };
    const char *w = wv;
    const size_t wld = (size_t)Din * 2, fld = (size_t)Din * 4;
    float wbuf[WBUF];
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TB) {
        const int tn = T - t0 < TB ? T - t0 : TB;
        float *yb = y + (size_t)t0 * ldy;
        const float *xs = deinterleave_rows(x + (size_t)t0 * ldx, ldx, tn, Din);
        MOE_ASSERT(xs && "gemm_fast: out of memory for the input rows");
        const size_t lds = (size_t)Din;
        if (tn < 4) {
            few_rows_eo(false, yb, ldy, xs, lds, tn, w + n0 * wld, wld, Din, n0, n1, b);
            continue;
        }
        const int t4 = tn & ~3, rem = tn - t4;
        const bool widen = tn >= 16 && (size_t)C * Din <= WBUF; /* below, memory bound */
        int n = n0;
        for (; n + C <= n1; n += C) {
            const char *wn = w + n * wld, *wt = wn;
            size_t ld = wld;
            if (widen) {
                widen_rows_eo(wbuf, wn, wld, C, Din);
                wt = (const char *)wbuf;
                ld = fld;
            }
            /* widen is a literal in each call, so each tile compiles to its own loop */
            for (int t = 0; t < t4; t += 4)
                if (widen)
                    tile_eo(4, C, true, yb + t * ldy + n, ldy, xs + t * lds, lds, wt, ld, Din, b, n);
                else
                    tile_eo(4, C, false, yb + t * ldy + n, ldy, xs + t * lds, lds, wt, ld, Din, b, n);
            if (rem && widen)
                few_rows_eo(true, yb + t4 * ldy, ldy, xs + t4 * lds, lds, rem, wt, ld, Din, n,
                            n + C, b);
            else if (rem)
                few_rows_eo(false, yb + t4 * ldy, ldy, xs + t4 * lds, lds, rem, wt, ld, Din, n,
                            n + C, b);
        }
        for (; n < n1; n++) {
            const char *wn = w + n * wld;
            for (int t = 0; t < t4; t += 4)
                tile_eo(4, 1, false, yb + t * ldy + n, ldy, xs + t * lds, lds, wn, wld, Din, b, n);
            if (rem)
                few_rows_eo(false, yb + t4 * ldy, ldy, xs + t4 * lds, lds, rem, wn, wld, Din, n,
                            n + 1, b);
        }
    }
}

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
    case MOE_DTYPE_BF16: rows_bf16(y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_F16: rows_dt(MOE_DTYPE_F16, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    default: MOE_ASSERT(!"gemm_fast: weights must be F32, F16 or BF16");
    }
}

