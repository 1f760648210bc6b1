/* gemm_panel_avx2.c - the AVX2 (+FMA) product over bf16 weights in 16-output
 * k-pair panels (MOE_DTYPE_BF16_PANEL, runtime/core/tensor.h), the twin of the
 * AVX-512 kernels in gemm_panel.c with the same bits.
 *
 * A 64-byte panel line (16 lanes of (k, k+1) bf16 pairs) is read as two
 * ymm of 8 lanes (outputs 16p .. 16p+7 and 16p+8 .. 16p+15); one shift left
 * by 16 gives the fp32 weights at k, one mask of the high halves those at
 * k+1, exactly as with one zmm.  Every output is then one FMA chain over
 * k = 0, 1, ..., K-1 starting from zero, then + bias, in its own lane, as in
 * gemm_panel.c: the arithmetic of each output is the same scalar sequence
 * whatever the vector width, so these kernels give the bits of the AVX-512
 * ones (tests/test_fast_ops.c compares them).
 *
 * Tiles (16 ymm registers; accumulators 2 per panel per row):
 *   - decode (T <= 3 rows): 4 panels x 1 row (8 accumulators), 2 panels x
 *     2 rows (8) or 2 panels x 3 rows (12), bf16 converted in the loop,
 *     prefetch PF_DECODE bytes ahead on each panel;
 *   - variant a (T < B_MIN_ROWS), one call for all the rows and 2 panels:
 *     below WIDE_MIN_ROWS rows, the decode loop at 2 panels x up to 3 rows
 *     (rows in even groups) over k blocks of MID_KP k-pairs, every group
 *     over a block before the next, the partial sums through y (exact), the
 *     first group prefetching the next block: the weights come from memory
 *     once and stream while the other groups compute (re-reading whole
 *     panels per group left memory idle meanwhile);
 *     from WIDE_MIN_ROWS rows, 1 panel x up to 4 rows (8), both halves
 *     of each line converted first (4 registers), then 2 broadcasts and 4
 *     FMAs per row (converting once per line, not per half as the decode
 *     tiles do, saves work across many rows);
 *   - variant b (blocks of B_MIN_ROWS rows or more): the tile's panel is
 *     widened to fp32 once per block of up to ROW_BLOCK rows (into the
 *     thread's buffer, k-blocked by K_BLOCK), then 1 panel x 6 rows of pure
 *     broadcast-FMA (12 accumulators); between k blocks the partial sums go
 *     through y (exact).
 * Lanes outside the requested outputs [n0, n1) are computed but never
 * stored (_mm256_maskstore_ps), so a slice may start or end anywhere. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm_fast.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/core/status.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum {
    PF_DECODE = 512,  /* prefetch distance of the decode tiles, bytes per panel stream */
    MAX_P = 4,        /* widest panel count of any tile */
    MAX_R = 6,        /* most rows of any tile */
    A_ROWS = 47,      /* variant a: all the rows of the call at once */
    WIDE_MIN_ROWS = 12, /* variant a from this many rows: 1 panel x up to 4 rows */
    WIDE_ROWS = 4,
    MID_ROWS = 3,     /* variant a: rows per tile (2 panels x 3 rows) */
    MID_KP = 128,     /* variant a: k-pairs per k block (2 panels: 16 KiB) */
    PF_MID = MID_KP * 64, /* variant a: the lead tile prefetches the next k block */
    B_ROWS = 6,       /* variant b: 1 panel x 6 rows */
    B_MIN_ROWS = 48,  /* row blocks of at least this many rows take variant b (as gemm_panel.c) */
    ROW_BLOCK = 512,  /* rows per block of variant b */
    K_BLOCK = 4096,   /* k range widened at once: 16 * K_BLOCK floats = 256 KiB */
};

/* All-ones in the lanes of half h (outputs 16q + 8h .. +7) of panel q whose
 * outputs fall in [n0, n1). */
AVX2 INLINE __m256i lane_mask(int q, int h, int n0, int n1)
{
    const __m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                         _mm256_set1_epi32(16 * q + 8 * h));
    const __m256i ge = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(n0 - 1));
    const __m256i lt = _mm256_cmpgt_epi32(_mm256_set1_epi32(n1), idx);
    return _mm256_and_si256(ge, lt);
}

/* Bias of outputs 16q + 8h .. +7 as fp32 (lanes outside m zero). */
AVX2 INLINE __m256 bias8(const struct moe_tensor *b, int q, int h, __m256i m)
{
    const size_t o = 16 * (size_t)q + 8 * (size_t)h;
    if (b->dtype == MOE_DTYPE_F32) return _mm256_maskload_ps((const float *)b->data + o, m);
    MOE_ASSERT((b->dtype == MOE_DTYPE_BF16 || b->dtype == MOE_DTYPE_F16) &&
               "gemm_panel_avx2: bias must be F32, F16 or BF16");
    int32_t ms[8];
    uint16_t hv[8];
    _mm256_storeu_si256((__m256i *)ms, m);
    const uint16_t *s = (const uint16_t *)b->data + o;
    for (int j = 0; j < 8; j++) hv[j] = ms[j] ? s[j] : 0;
    const __m128i v = _mm_loadu_si128((const __m128i *)hv);
    if (b->dtype == MOE_DTYPE_F16) return _mm256_cvtph_ps(v);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

/* Stores the accumulators of panels q .. q+P-1 (acc[p][h][r]) x R rows into
 * y, adding the bias when `last`. */
AVX2 INLINE void store_tile(const int P, const int R, __m256 acc[][2][MAX_R], float *y, size_t ldy,
                            int q, int n0, int n1, bool last, const struct moe_tensor *b)
{
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i m = lane_mask(q + p, h, n0, n1);
            if (_mm256_testz_si256(m, m)) continue;
            const __m256 bv = last && b ? bias8(b, q + p, h, m) : _mm256_setzero_ps();
#pragma GCC unroll 6
            for (int r = 0; r < R; r++)
                _mm256_maskstore_ps(y + (size_t)r * ldy + 16 * (size_t)(q + p) + 8 * h, m,
                                    last && b ? _mm256_add_ps(acc[p][h][r], bv) : acc[p][h][r]);
        }
}

/* Decode tiles: P panels from w (panel q; pst bytes between
 * panels) x R rows of x, bf16 widened in the loop; pf: prefetch distance
 * (0: none). */
AVX2 INLINE void tile_a(const int P, const int R, const int pf, const char *w, size_t pst,
                        const float *x, size_t ldx, int KP, float *y, size_t ldy, int q, int n0,
                        int n1, bool first, bool last, const struct moe_tensor *b)
{
    __m256 acc[MAX_P][2][MAX_R];
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000);
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i m = first ? _mm256_setzero_si256() : lane_mask(q + p, h, n0, n1);
#pragma GCC unroll 6
            for (int r = 0; r < R; r++)
                acc[p][h][r] =
                    first ? _mm256_setzero_ps()
                          : _mm256_maskload_ps(y + (size_t)r * ldy + 16 * (size_t)(q + p) + 8 * h, m);
        }
    for (int i = 0; i < KP; i++) {
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const char *l = w + p * pst + (size_t)i * 64;
            if (pf) _mm_prefetch(l + pf, _MM_HINT_T0);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_load_si256((const __m256i *)(l + 32 * h));
                const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) {
                    const float *xr = x + (size_t)r * ldx + 2 * i;
                    acc[p][h][r] = _mm256_fmadd_ps(we, _mm256_broadcast_ss(xr), acc[p][h][r]);
                    acc[p][h][r] = _mm256_fmadd_ps(wo, _mm256_broadcast_ss(xr + 1), acc[p][h][r]);
                }
            }
        }
    }
    store_tile(P, R, acc, y, ldy, q, n0, n1, last, b);
}

/* Variant a, 12 rows or more: one panel x R <= 4 rows, both halves widened first at each k-pair
 * (4 registers), then per row two broadcasts and 4 FMAs. */
AVX2 INLINE void tile_va(const int R, const char *w, const float *x, size_t ldx, int KP, float *y,
                        size_t ldy, int q, int n0, int n1, const struct moe_tensor *b)
{
    __m256 acc[1][2][MAX_R];
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) acc[0][0][r] = acc[0][1][r] = _mm256_setzero_ps();
    for (int i = 0; i < KP; i++) {
        const __m256i v0 = _mm256_load_si256((const __m256i *)(w + (size_t)i * 64));
        const __m256i v1 = _mm256_load_si256((const __m256i *)(w + (size_t)i * 64 + 32));
        const __m256 we0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
        const __m256 wo0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hi));
        const __m256 we1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
        const __m256 wo1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hi));
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 xe = _mm256_broadcast_ss(x + (size_t)r * ldx + 2 * i);
            acc[0][0][r] = _mm256_fmadd_ps(we0, xe, acc[0][0][r]);
            acc[0][1][r] = _mm256_fmadd_ps(we1, xe, acc[0][1][r]);
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 xo = _mm256_broadcast_ss(x + (size_t)r * ldx + 2 * i + 1);
            acc[0][0][r] = _mm256_fmadd_ps(wo0, xo, acc[0][0][r]);
            acc[0][1][r] = _mm256_fmadd_ps(wo1, xo, acc[0][1][r]);
        }
    }
    store_tile(1, R, acc, y, ldy, q, n0, n1, true, b);
}

/* Variant b: one panel widened to fp32 in wb (wb[k*16 + j], kn values of k
 * from x's column 0) x R rows.  first: the accumulators start at zero, else
 * from y (the partial sums of the earlier k blocks); last: + bias. */
AVX2 INLINE void tile_b(const int R, const float *wb, int kn, const float *x, size_t ldx, float *y,
                        size_t ldy, int q, int n0, int n1, bool first, bool last,
                        const struct moe_tensor *b)
{
    __m256 acc[1][2][MAX_R];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i m = lane_mask(q, h, n0, n1);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            acc[0][h][r] = first ? _mm256_setzero_ps()
                                 : _mm256_maskload_ps(y + (size_t)r * ldy + 16 * (size_t)q + 8 * h, m);
    }
    for (int k = 0; k < kn; k++) {
        const __m256 w0 = _mm256_load_ps(wb + (size_t)k * 16);
        const __m256 w1 = _mm256_load_ps(wb + (size_t)k * 16 + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 xb = _mm256_broadcast_ss(x + (size_t)r * ldx + k);
            acc[0][0][r] = _mm256_fmadd_ps(w0, xb, acc[0][0][r]);
            acc[0][1][r] = _mm256_fmadd_ps(w1, xb, acc[0][1][r]);
        }
    }
    store_tile(1, R, acc, y, ldy, q, n0, n1, last, b);
}

/* k-pairs [i0, i1) of the panel at w to fp32 in wb, as tile_b reads them. */
AVX2 static void widen_panel1(float *wb, const char *w, int i0, int i1)
{
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000);
    for (int i = i0; i < i1; i++) {
        float *d = wb + (size_t)(2 * (i - i0)) * 16;
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_load_si256((const __m256i *)(w + (size_t)i * 64 + 32 * h));
            _mm256_store_ps(d + 8 * h, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
            _mm256_store_ps(d + 16 + 8 * h, _mm256_castsi256_ps(_mm256_and_si256(v, hi)));
        }
    }
}

#define TILE_A(v, Pc, Rc, pf) \
    case v: tile_a(Pc, Rc, pf, w, pst, x, ldx, KP, y, ldy, q, n0, n1, first, last, b); break

/* Decode: P <= 4 panels x 1 row, or P <= 2 panels x 2 or 3 rows. */
AVX2 static void decode_tile(int P, int R, const char *w, size_t pst, const float *x, size_t ldx,
                             int KP, float *y, size_t ldy, int q, int n0, int n1,
                             const struct moe_tensor *b)
{
    const bool first = true, last = true;
    if (R == 1) {
        switch (P) {
            TILE_A(1, 1, 1, PF_DECODE); TILE_A(2, 2, 1, PF_DECODE);
            TILE_A(3, 3, 1, PF_DECODE); TILE_A(4, 4, 1, PF_DECODE);
        }
    } else if (R == 2) {
        switch (P) { TILE_A(1, 1, 2, PF_DECODE); TILE_A(2, 2, 2, PF_DECODE); }
    } else {
        switch (P) { TILE_A(1, 1, 3, PF_DECODE); TILE_A(2, 2, 3, PF_DECODE); }
    }
}

/* Variant a's tile: P <= 2 panels x R <= 3 rows over the k-pairs of one
 * k block, the partial sums through y; lead: the block's first row group,
 * which prefetches the next block. */
AVX2 static void mid_tile(int P, int R, bool lead, const char *w, size_t pst, const float *x,
                          size_t ldx, int KP, float *y, size_t ldy, int q, int n0, int n1,
                          bool first, bool last, const struct moe_tensor *b)
{
    switch ((P - 1) * 6 + (R - 1) * 2 + lead) {
        TILE_A(0, 1, 1, 0); TILE_A(1, 1, 1, PF_MID);
        TILE_A(2, 1, 2, 0); TILE_A(3, 1, 2, PF_MID);
        TILE_A(4, 1, 3, 0); TILE_A(5, 1, 3, PF_MID);
        TILE_A(6, 2, 1, 0); TILE_A(7, 2, 1, PF_MID);
        TILE_A(8, 2, 2, 0); TILE_A(9, 2, 2, PF_MID);
        TILE_A(10, 2, 3, 0); TILE_A(11, 2, 3, PF_MID);
    }
}
/* Variant a: 1 panel x R <= 4 rows. */
AVX2 static void a_tile1(int R, const char *w, const float *x, size_t ldx, int KP,
                         float *y, size_t ldy, int q, int n0, int n1, const struct moe_tensor *b)
{
    switch (R) {
    case 1: tile_va(1, w, x, ldx, KP, y, ldy, q, n0, n1, b); break;
    case 2: tile_va(2, w, x, ldx, KP, y, ldy, q, n0, n1, b); break;
    case 3: tile_va(3, w, x, ldx, KP, y, ldy, q, n0, n1, b); break;
    case 4: tile_va(4, w, x, ldx, KP, y, ldy, q, n0, n1, b); break;
    }
}
#undef TILE_A

#define TILE_B(v) case v: tile_b(v, wb, kn, x, ldx, y, ldy, q, n0, n1, first, last, b); break

AVX2 static void b_tile1(int R, const float *wb, int kn, const float *x, size_t ldx, float *y,
                         size_t ldy, int q, int n0, int n1, bool first, bool last,
                         const struct moe_tensor *b)
{
    switch (R) { TILE_B(1); TILE_B(2); TILE_B(3); TILE_B(4); TILE_B(5); TILE_B(6); }
}
#undef TILE_B

/* The driver's tile entries: variants a and b here take one panel. */
AVX2 INLINE void a_tile(int P, int R, const char *w, size_t pst, const float *x, size_t ldx,
                        int KP, float *y, size_t ldy, int q, int n0, int n1,
                        const struct moe_tensor *b)
{
    if (R >= WIDE_MIN_ROWS) {
        const int ng = (R + WIDE_ROWS - 1) / WIDE_ROWS;
        for (int p = 0; p < P; p++)
            for (int g = 0; g < ng; g++) {
                const int r0 = R * g / ng, r1 = R * (g + 1) / ng;
                a_tile1(r1 - r0, w + p * pst, x + (size_t)r0 * ldx, ldx, KP,
                        y + (size_t)r0 * ldy, ldy, q + p, n0, n1, b);
            }
        return;
    }
    const int ng = (R + MID_ROWS - 1) / MID_ROWS;
    for (int i0 = 0; i0 < KP; i0 += MID_KP) {
        const int kn = KP - i0 < MID_KP ? KP - i0 : MID_KP;
        const bool first = i0 == 0, last = i0 + kn == KP;
        for (int g = 0; g < ng; g++) {
            const int r0 = R * g / ng, r1 = R * (g + 1) / ng;
            mid_tile(P, r1 - r0, g == 0, w + (size_t)i0 * 64, pst,
                     x + (size_t)r0 * ldx + 2 * (size_t)i0, ldx, kn, y + (size_t)r0 * ldy, ldy, q,
                     n0, n1, first, last, b);
        }
    }
}

AVX2 INLINE void widen_panels(float *wb, const char *w, size_t pst, int P, int i0, int i1)
{
    (void)pst, (void)P;
    widen_panel1(wb, w, i0, i1);
}

AVX2 INLINE void b_tile(int P, int R, const float *wb, int kn, const float *x, size_t ldx,
                        float *y, size_t ldy, int q, int n0, int n1, bool first, bool last,
                        const struct moe_tensor *b)
{
    (void)P;
    b_tile1(R, wb, kn, x, ldx, y, ldy, q, n0, n1, first, last, b);
}

#define PD_ATTR AVX2
#define PD_FN moe_gemm_rows_panel_avx2
#define PD_DECODE_P1 4
#define PD_DECODE_P3 2
#define PD_A_PANELS 2
#define PD_B_PANELS 1
#include "runtime/cpu/gemm_panel_drive.h"
