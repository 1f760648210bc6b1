/* gemm_panel.c - the AVX-512 product over bf16 weights in 16-output k-pair
 * panels (MOE_DTYPE_BF16_PANEL, runtime/core/tensor.h), and the packing into
 * that layout.
 *
 * Layout: panel p holds outputs 16p .. 16p+15; for each k-pair i one
 * 64-byte line of 16 32-bit lanes, lane j = w[16p+j][2i] (low half) |
 * w[16p+j][2i+1] (high half).  One shift left by 16 gives the 16 fp32
 * weights at k = 2i, one mask of the high halves those at 2i+1.
 *
 * Kernels: a tile is P panels x R input rows, P*R zmm accumulators, lane j
 * of accumulator (p, r) holding output (r, 16p+j).  Each k step broadcasts
 * x[r][k] and issues one FMA per accumulator, so there is no horizontal
 * sum, and the FMA units see P*R independent chains:
 *   - decode tiles (T <= 3 rows): 8 panels x 1 row or 4 panels x 2-3 rows,
 *     bf16 converted in the loop, prefetch PF_DECODE bytes ahead on each
 *     panel (the weights stream from memory once);
 *   - variant a (T < B_MIN_ROWS): 2 panels x up to 12 rows, bf16
 *     converted in the loop;
 *   - variant b (blocks of B_MIN_ROWS rows or more): the tile's 4 panels
 *     are widened to fp32 once per block of up to ROW_BLOCK rows (into the
 *     thread's buffer, moe_gemm_thread_buffer, k-blocked by K_BLOCK so it
 *     stays within 1 MiB), then 4 panels x 6 rows of pure broadcast-FMA;
 *     between k blocks the partial sums go through y (stored and reloaded
 *     as fp32: exact).
 * Order: every output is one FMA chain over k = 0, 1, ..., K-1 starting
 * from zero, then + bias, whatever the tile, the variant, the row block,
 * the k block or the slice of outputs: a row gives the same bits alone or
 * in any batch.  Lanes of a panel outside the requested output range are
 * computed but never stored (masked stores), so a slice may start or end
 * anywhere; at panel boundaries nothing is computed twice. */
#include <immintrin.h>
#include <omp.h>
#include <stdbool.h>

#include "runtime/cpu/gemm_fast.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/core/status.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum {
    PF_DECODE = 512,   /* prefetch distance of the decode tiles, bytes per panel stream */
    A_ROWS = 12,       /* widest row tile of variant a */
    B_PANELS = 4,      /* variant b: 4 panels x 6 rows */
    B_ROWS = 6,
    B_MIN_ROWS = 48,   /* row blocks of at least this many rows take variant b */
    ROW_BLOCK = 512,   /* rows per block of variant b (weights widened once per block) */
    K_BLOCK = 4096,    /* k range widened at once: B_PANELS * 16 * K_BLOCK floats = 1 MiB */
};

#include "runtime/cpu/gemm_panel_avx512.h"

/* Stores the P x R accumulators of panels q .. q+P-1 into y (row 0, column
 * 0 of the product), adding the bias when `last`. */
AVX512 INLINE void store_tile(const int P, const int R, __m512 acc[][A_ROWS], float *y, size_t ldy,
                              int q, int n0, int n1, bool last, const struct moe_tensor *b)
{
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) {
        const __mmask16 m = lane_mask(q + p, n0, n1);
        const __m512 bv = last && b ? bias16(b, q + p, m) : _mm512_setzero_ps();
#pragma GCC unroll 12
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + (size_t)r * ldy + 16 * (size_t)(q + p), m,
                                  last && b ? _mm512_add_ps(acc[p][r], bv) : acc[p][r]);
    }
}

/* Decode tiles and variant a: P panels from w (panel q; pst bytes between
 * panels) x R rows of x, bf16 widened in the loop; pf: prefetch distance
 * (0: none). */
AVX512 INLINE void tile_a(const int P, const int R, const int pf, const char *w, size_t pst,
                          const float *x, size_t ldx, int KP, float *y, size_t ldy, int q, int n0,
                          int n1, const struct moe_tensor *b)
{
    __m512 acc[8][A_ROWS];
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000);
#pragma GCC unroll 8
    for (int p = 0; p < P; p++)
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) acc[p][r] = _mm512_setzero_ps();
    for (int i = 0; i < KP; i++) {
        __m512 we[8], wo[8];
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            const char *l = w + p * pst + (size_t)i * 64;
            if (pf) _mm_prefetch(l + pf, _MM_HINT_T0);
            const __m512i v = _mm512_load_si512(l);
            we[p] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            wo[p] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)r * ldx + 2 * i]);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) acc[p][r] = _mm512_fmadd_ps(we[p], xb, acc[p][r]);
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)r * ldx + 2 * i + 1]);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) acc[p][r] = _mm512_fmadd_ps(wo[p], xb, acc[p][r]);
        }
    }
    store_tile(P, R, acc, y, ldy, q, n0, n1, true, b);
}

/* Variant b: P panels widened to fp32 in wb (k-major: wb[(k*P + p)*16 + j],
 * kn values of k from x's column 0) x R rows.  first: the accumulators
 * start at zero, else from y (the partial sums of the earlier k blocks);
 * last: the bias is added. */
AVX512 INLINE void tile_b(const int P, const int R, const float *wb, int kn, const float *x,
                          size_t ldx, float *y, size_t ldy, int q, int n0, int n1, bool first,
                          bool last, const struct moe_tensor *b)
{
    __m512 acc[B_PANELS][A_ROWS];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) {
        const __mmask16 m = lane_mask(q + p, n0, n1);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            acc[p][r] = first ? _mm512_setzero_ps()
                              : _mm512_maskz_loadu_ps(m, y + (size_t)r * ldy + 16 * (size_t)(q + p));
    }
    for (int k = 0; k < kn; k++) {
        __m512 wv[B_PANELS];
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) wv[p] = _mm512_load_ps(wb + ((size_t)k * P + p) * 16);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)r * ldx + k]);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) acc[p][r] = _mm512_fmadd_ps(wv[p], xb, acc[p][r]);
        }
    }
    store_tile(P, R, acc, y, ldy, q, n0, n1, last, b);
}

/* k-pairs [i0, i1) of P panels (from w, pst bytes apart) to fp32 in wb,
 * k-major as tile_b reads them. */
AVX512 static void widen_panels(float *wb, const char *w, size_t pst, int P, int i0, int i1)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000);
    for (int i = i0; i < i1; i++)
        for (int p = 0; p < P; p++) {
            const __m512i v = _mm512_load_si512(w + p * pst + (size_t)i * 64);
            float *d = wb + ((size_t)(2 * (i - i0)) * P + p) * 16;
            _mm512_store_ps(d, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
            _mm512_store_ps(d + 16 * P, _mm512_castsi512_ps(_mm512_and_si512(v, hi)));
        }
}

/* The tiles instantiated for each (P, R) a caller can ask for: switches
 * whose cases call a tile with literal P and R, so each compiles to its own
 * loop with its accumulators in registers.  TILE_A(v, P, R, pf) is the case
 * v of such a switch. */
#define TILE_A(v, Pc, Rc, pf) \
    case v: tile_a(Pc, Rc, pf, w, pst, x, ldx, KP, y, ldy, q, n0, n1, b); break

/* Decode: P <= 8 panels x 1 row, or P <= 4 panels x 2 or 3 rows. */
AVX512 static void decode_tile(int P, int R, const char *w, size_t pst, const float *x, size_t ldx,
                               int KP, float *y, size_t ldy, int q, int n0, int n1,
                               const struct moe_tensor *b)
{
    if (R == 1) {
        switch (P) {
            TILE_A(1, 1, 1, PF_DECODE); TILE_A(2, 2, 1, PF_DECODE);
            TILE_A(3, 3, 1, PF_DECODE); TILE_A(4, 4, 1, PF_DECODE);
            TILE_A(5, 5, 1, PF_DECODE); TILE_A(6, 6, 1, PF_DECODE);
            TILE_A(7, 7, 1, PF_DECODE); TILE_A(8, 8, 1, PF_DECODE);
        }
    } else if (R == 2) {
        switch (P) {
            TILE_A(1, 1, 2, PF_DECODE); TILE_A(2, 2, 2, PF_DECODE);
            TILE_A(3, 3, 2, PF_DECODE); TILE_A(4, 4, 2, PF_DECODE);
        }
    } else {
        switch (P) {
            TILE_A(1, 1, 3, PF_DECODE); TILE_A(2, 2, 3, PF_DECODE);
            TILE_A(3, 3, 3, PF_DECODE); TILE_A(4, 4, 3, PF_DECODE);
        }
    }
}

/* Variant a: P <= 2 panels x R <= 12 rows. */
AVX512 static void a_tile(int P, int R, const char *w, size_t pst, const float *x, size_t ldx,
                          int KP, float *y, size_t ldy, int q, int n0, int n1,
                          const struct moe_tensor *b)
{
    if (P == 2) {
        switch (R) {
            TILE_A(1, 2, 1, 0); TILE_A(2, 2, 2, 0); TILE_A(3, 2, 3, 0); TILE_A(4, 2, 4, 0);
            TILE_A(5, 2, 5, 0); TILE_A(6, 2, 6, 0); TILE_A(7, 2, 7, 0); TILE_A(8, 2, 8, 0);
            TILE_A(9, 2, 9, 0); TILE_A(10, 2, 10, 0); TILE_A(11, 2, 11, 0); TILE_A(12, 2, 12, 0);
        }
    } else {
        switch (R) {
            TILE_A(1, 1, 1, 0); TILE_A(2, 1, 2, 0); TILE_A(3, 1, 3, 0); TILE_A(4, 1, 4, 0);
            TILE_A(5, 1, 5, 0); TILE_A(6, 1, 6, 0); TILE_A(7, 1, 7, 0); TILE_A(8, 1, 8, 0);
            TILE_A(9, 1, 9, 0); TILE_A(10, 1, 10, 0); TILE_A(11, 1, 11, 0); TILE_A(12, 1, 12, 0);
        }
    }
}
#undef TILE_A

#define TILE_B(v, Pc, Rc) \
    case v: tile_b(Pc, Rc, wb, kn, x, ldx, y, ldy, q, n0, n1, first, last, b); break

/* Variant b: P <= 4 panels x R <= 6 rows. */
AVX512 static void b_tile(int P, int R, const float *wb, int kn, const float *x, size_t ldx,
                          float *y, size_t ldy, int q, int n0, int n1, bool first, bool last,
                          const struct moe_tensor *b)
{
    switch (P * 8 + R) {
        TILE_B(1 * 8 + 1, 1, 1); TILE_B(1 * 8 + 2, 1, 2); TILE_B(1 * 8 + 3, 1, 3);
        TILE_B(1 * 8 + 4, 1, 4); TILE_B(1 * 8 + 5, 1, 5); TILE_B(1 * 8 + 6, 1, 6);
        TILE_B(2 * 8 + 1, 2, 1); TILE_B(2 * 8 + 2, 2, 2); TILE_B(2 * 8 + 3, 2, 3);
        TILE_B(2 * 8 + 4, 2, 4); TILE_B(2 * 8 + 5, 2, 5); TILE_B(2 * 8 + 6, 2, 6);
        TILE_B(3 * 8 + 1, 3, 1); TILE_B(3 * 8 + 2, 3, 2); TILE_B(3 * 8 + 3, 3, 3);
        TILE_B(3 * 8 + 4, 3, 4); TILE_B(3 * 8 + 5, 3, 5); TILE_B(3 * 8 + 6, 3, 6);
        TILE_B(4 * 8 + 1, 4, 1); TILE_B(4 * 8 + 2, 4, 2); TILE_B(4 * 8 + 3, 4, 3);
        TILE_B(4 * 8 + 4, 4, 4); TILE_B(4 * 8 + 5, 4, 5); TILE_B(4 * 8 + 6, 4, 6);
    }
}
#undef TILE_B

int moe_gemm_panel_slice_unit(int T)
{
    return 16 * (T == 1 ? 8 : T <= 3 ? 4 : T < B_MIN_ROWS ? 2 : B_PANELS);
}

#define PD_ATTR AVX512
#define PD_FN moe_gemm_rows_panel_avx512
#define PD_DECODE_P1 8
#define PD_DECODE_P3 4
#define PD_A_PANELS 2
#define PD_B_PANELS B_PANELS
#include "runtime/cpu/gemm_panel_drive.h"

/* ---- packing ---- */

bool moe_gemm_panel_bytes(int64_t N, int64_t K, size_t *out)
{
    if (N <= 0 || K <= 0 || K % 2 != 0 || N > INT32_MAX || K > INT32_MAX) return false;
    const size_t panels = (size_t)(N + 15) / 16;
    return moe_mul_size(panels, (size_t)K * 32, out);
}

/* 16 x 16 transpose of 32-bit lanes: r[i] lane j becomes r[j] lane i. */
AVX512 INLINE void transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0xdd);
        t[8 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
        r[4 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0x88);
        r[12 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0xdd);
    }
}

/* k-pairs [0, i1) of a full panel (16 source rows of KP 32-bit pairs from
 * s) by 16 x 16 transposes, with non-temporal stores (the packed model is
 * larger than the caches; it is read from memory later). */
AVX512 static void pack_panel_avx512(uint32_t *d, const uint16_t *s, int K, int i1)
{
    for (int i = 0; i < i1; i += 16) {
        __m512i r[16];
        for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_si512(s + (size_t)j * K + 2 * i);
        transpose16(r);
        for (int j = 0; j < 16; j++) _mm512_stream_si512((__m512i *)(d + (size_t)(i + j) * 16), r[j]);
    }
    _mm_sfence();
}

void moe_gemm_pack_panels(void *dst, const void *w, int N, int K)
{
    MOE_ASSERT(N > 0 && K > 0 && K % 2 == 0 && (uintptr_t)dst % 64 == 0);
    const int KP = K / 2, np = (N + 15) / 16;
    const bool vec = __builtin_cpu_supports("avx512f");
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)N * K >= (1u << 20))
    for (int p = 0; p < np; p++) {
        uint32_t *d = (uint32_t *)dst + (size_t)p * KP * 16;
        const uint16_t *s = (const uint16_t *)w + (size_t)p * 16 * K;
        int i = 0;
        if (vec && 16 * p + 16 <= N) {
            i = KP / 16 * 16;
            pack_panel_avx512(d, s, K, i);
        }
        for (; i < KP; i++)
            for (int j = 0; j < 16; j++) {
                uint32_t v = 0;
                if (16 * p + j < N)
                    v = (uint32_t)s[(size_t)j * K + 2 * i] | (uint32_t)s[(size_t)j * K + 2 * i + 1] << 16;
                d[(size_t)i * 16 + j] = v;
            }
    }
}
