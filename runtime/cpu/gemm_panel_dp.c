/* gemm_panel_dp.c - products over bf16 weights in panels
 * (MOE_DTYPE_BF16_PANEL) with AVX512-BF16's vdpbf16ps: the `avx512-bf16`
 * kernel set, for processors that have AVX512-BF16 but no AMX tiles (AMD
 * Zen 4 and 5, or an Intel processor where Linux refuses the tile state).
 *
 * A panel (runtime/cpu/gemm_panel.c) holds, for each k-pair, one 64-byte
 * line of 16 32-bit lanes, lane j = the pair (w[j][2i], w[j][2i+1]): the
 * layout vdpbf16ps reads, so the weights are used in place, never
 * widened.  The inputs are rounded to bf16 once per product
 * (moe_gemm_split_rows, one part, as for `amx-bf16`: within 2^-8 of each
 * input, llama.cpp's and a bf16 model's numerics), and each pair
 * (x[2i], x[2i+1]) is broadcast to the 16 lanes.  One vdpbf16ps is 32
 * multiply-adds where an FMA over widened weights is 16, at about the same
 * rate, which is the point of this set (docs/cpu.md has the figures).
 *
 * Order: output (r, n) is C = 0, then for each k-pair i = 0, 1, ...:
 * C = vdpbf16ps(C, pair i of the panel, pair i of row r) (the processor's
 * own sum of the two bf16 products into C: two products exact in fp32
 * added to C with round to nearest even, denormal inputs and results
 * flushed to zero), then + bias.  Every tile below computes that chain in
 * its own vector lane, partial sums between k blocks stored and reloaded
 * as fp32 (exact), so a row gives the same bits alone or in any batch, in
 * any slice of the outputs.  They are not the bits of the FMA kernels or
 * of the AMX tiles.
 *
 * Tiles: P panels x R rows, P*R zmm accumulators, per k-pair P weight
 * lines and R broadcasts.  Decode (T <= 3): 8 panels x 1 row or 4 x 2-3,
 * k in one pass, prefetching PF_DECODE bytes ahead on each panel (the
 * weights stream from memory once).  More rows: 4 panels x up to 6 rows,
 * k in blocks of KB pairs (a tile's weights for a block stay in L1 across
 * the block's row tiles), rows in blocks of ROW_BLOCK (their inputs for a
 * k block stay in L2 across the panels). */
#include <immintrin.h>
#include <stdbool.h>

#include "runtime/cpu/gemm_fast.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/core/status.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum {
    PF_DECODE = 512, /* prefetch distance of the decode tiles, bytes per panel stream */
    TP = 4,          /* panels of a tile past decode */
    TR = 6,          /* rows of a tile past decode */
    KB = 128,        /* k-pairs a block: 4 panels' weights of a block are 32 KiB */
    ROW_BLOCK = 256, /* rows a block: their inputs for a k block are 128 KiB */
};

#include "runtime/cpu/gemm_panel_avx512.h"

/* ---- the inputs split into bf16 parts (read by these kernels and by the
 * AMX tiles, gemm_amx.c) ---- */

int moe_amx_parts(enum moe_cpu_isa isa)
{
    return isa == MOE_CPU_ISA_AMX_EXACT ? 3 : isa == MOE_CPU_ISA_AMX_BF16 || isa == MOE_CPU_ISA_AVX512_BF16 ? 1 : 2;
}

/* A row per part of K rounded up to 32, and one cache line more, so that
 * the 16 rows of an input tile never share a cache set (a row stride that
 * is a multiple of 4 KiB would put all 16 in one). */
size_t moe_gemm_split_ld(enum moe_cpu_isa isa, int K)
{
    return (size_t)moe_amx_parts(isa) * (((size_t)K + 31) / 32 * 32) + 32;
}

/* bf16 (round to nearest even) of v, and that value back in fp32. */
AVX512 INLINE __m256bh to_bf16(__m512 v, __m512 *back)
{
    const __m256bh h = _mm512_cvtneps_pbh(v);
    *back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
    return h;
}

AVX512 void moe_gemm_split_rows(enum moe_cpu_isa isa, uint16_t *xs, size_t lds, const float *x, size_t ldx,
                                int r0, int r1, int K)
{
    const int parts = moe_amx_parts(isa);
    const size_t kp = (lds - 32) / (size_t)parts;
    const __m512 inf = _mm512_set1_ps(__builtin_inff());
    for (int r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * ldx;
        uint16_t *h = xs + (size_t)r * lds;
        for (size_t k = 0; k < kp; k += 16) {
            const int left = K - (int)k;
            const __mmask16 in = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
            __m512 v = _mm512_maskz_loadu_ps(in, xr + k), back;
            __m256bh part = to_bf16(v, &back);
            _mm256_storeu_si256((__m256i *)(h + k), (__m256i)part);
            /* the residues are 0 where hi is infinite (not inf - inf) */
            const __mmask16 fin = _mm512_cmp_ps_mask(_mm512_abs_ps(back), inf, _CMP_NEQ_UQ);
            for (int j = 1; j < parts; j++) {
                v = _mm512_maskz_sub_ps(fin, v, back);
                part = to_bf16(v, &back);
                _mm256_storeu_si256((__m256i *)(h + (size_t)j * kp + k), (__m256i)part);
            }
        }
    }
}

/* ---- the products ---- */

/* Rows r of the P x R tile of panels q .. q+P-1 (w: panel q's first line,
 * pst bytes between panels) over k-pairs [i0, i1) of the inputs xp (pair
 * i of row r at xp[r * ldp + i]).  first: the sums start at zero, else
 * from y (the earlier k blocks'); last: the bias is added.  pf: prefetch
 * distance (0: none). */
AVX512 INLINE void tile(const int P, const int R, const int pf, const char *w, size_t pst, const uint32_t *xp,
                        size_t ldp, int i0, int i1, float *y, size_t ldy, int q, int n0, int n1, bool first,
                        bool last, const struct moe_tensor *b)
{
    __m512 acc[8][TR];
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) {
        const __mmask16 m = lane_mask(q + p, n0, n1);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            acc[p][r] = first ? _mm512_setzero_ps()
                              : _mm512_maskz_loadu_ps(m, y + (size_t)r * ldy + 16 * (size_t)(q + p));
    }
    for (int i = i0; i < i1; i++) {
        __m512bh wv[8];
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            const char *l = w + p * pst + (size_t)i * 64;
            if (pf) _mm_prefetch(l + pf, _MM_HINT_T0);
            wv[p] = (__m512bh)_mm512_load_si512(l);
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xp[(size_t)r * ldp + i]);
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) acc[p][r] = _mm512_dpbf16_ps(acc[p][r], wv[p], xb);
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) {
        const __mmask16 m = lane_mask(q + p, n0, n1);
        const __m512 bv = last && b ? bias16(b, q + p, m) : _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(y + (size_t)r * ldy + 16 * (size_t)(q + p), m,
                                  last && b ? _mm512_add_ps(acc[p][r], bv) : acc[p][r]);
    }
}

/* Each tile shape a caller can ask for compiled on its own (literal P
 * and R, the accumulators in registers). */
#define TILE(v, Pc, Rc, pf) \
    case v: tile(Pc, Rc, pf, w, pst, xp, ldp, i0, i1, y, ldy, q, n0, n1, first, last, b); break

/* Decode: P <= 8 panels x 1 row, or P <= 4 panels x 2 or 3 rows. */
AVX512 static void decode_tile(int P, int R, const char *w, size_t pst, const uint32_t *xp, size_t ldp, int i0,
                               int i1, float *y, size_t ldy, int q, int n0, int n1, const struct moe_tensor *b)
{
    const bool first = true, last = true;
    switch (R * 8 + P) {
        TILE(8 + 1, 1, 1, PF_DECODE); TILE(8 + 2, 2, 1, PF_DECODE); TILE(8 + 3, 3, 1, PF_DECODE);
        TILE(8 + 4, 4, 1, PF_DECODE); TILE(8 + 5, 5, 1, PF_DECODE); TILE(8 + 6, 6, 1, PF_DECODE);
        TILE(8 + 7, 7, 1, PF_DECODE); TILE(8 + 8, 8, 1, PF_DECODE);
        TILE(16 + 1, 1, 2, PF_DECODE); TILE(16 + 2, 2, 2, PF_DECODE);
        TILE(16 + 3, 3, 2, PF_DECODE); TILE(16 + 4, 4, 2, PF_DECODE);
        TILE(24 + 1, 1, 3, PF_DECODE); TILE(24 + 2, 2, 3, PF_DECODE);
        TILE(24 + 3, 3, 3, PF_DECODE); TILE(24 + 4, 4, 3, PF_DECODE);
    default: MOE_ASSERT(!"gemm avx512-bf16: no such decode tile");
    }
}

/* Past decode: P <= 4 panels x R <= 6 rows. */
AVX512 static void block_tile(int P, int R, const char *w, size_t pst, const uint32_t *xp, size_t ldp, int i0,
                              int i1, float *y, size_t ldy, int q, int n0, int n1, bool first, bool last,
                              const struct moe_tensor *b)
{
    switch (P * 8 + R) {
        TILE(8 + 1, 1, 1, 0); TILE(8 + 2, 1, 2, 0); TILE(8 + 3, 1, 3, 0);
        TILE(8 + 4, 1, 4, 0); TILE(8 + 5, 1, 5, 0); TILE(8 + 6, 1, 6, 0);
        TILE(16 + 1, 2, 1, 0); TILE(16 + 2, 2, 2, 0); TILE(16 + 3, 2, 3, 0);
        TILE(16 + 4, 2, 4, 0); TILE(16 + 5, 2, 5, 0); TILE(16 + 6, 2, 6, 0);
        TILE(24 + 1, 3, 1, 0); TILE(24 + 2, 3, 2, 0); TILE(24 + 3, 3, 3, 0);
        TILE(24 + 4, 3, 4, 0); TILE(24 + 5, 3, 5, 0); TILE(24 + 6, 3, 6, 0);
        TILE(32 + 1, 4, 1, 0); TILE(32 + 2, 4, 2, 0); TILE(32 + 3, 4, 3, 0);
        TILE(32 + 4, 4, 4, 0); TILE(32 + 5, 4, 5, 0); TILE(32 + 6, 4, 6, 0);
    default: MOE_ASSERT(!"gemm avx512-bf16: no such tile");
    }
}
#undef TILE

/* Rows [0, tn) in nt tiles as even as can be. */
static int row_split(int tn, int nt, int t) { return (int)((long)tn * t / nt); }

AVX512 void moe_gemm_rows_panel_dp(float *y, size_t ldy, const uint16_t *xs, size_t lds, int T, const void *wv,
                                   int K, int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(K % 2 == 0 && n0 >= 0 && n0 < n1 && lds == moe_gemm_split_ld(MOE_CPU_ISA_AVX512_BF16, K));
    if (b && !b->data) b = NULL;
    const char *w = wv;
    const uint32_t *xp = (const uint32_t *)xs; /* lds is even: pairs stay aligned */
    const size_t pst = (size_t)K * 32, ldp = lds / 2;
    const int KP = K / 2, q0 = n0 / 16, q1 = (n1 + 15) / 16;
    if (T <= 3) {
        const int pmax = T == 1 ? 8 : 4;
        for (int q = q0; q < q1; q += pmax) {
            const int P = q1 - q < pmax ? q1 - q : pmax;
            decode_tile(P, T, w + q * pst, pst, xp, ldp, 0, KP, y, ldy, q, n0, n1, b);
        }
        return;
    }
    for (int t0 = 0; t0 < T; t0 += ROW_BLOCK) {
        const int tn = T - t0 < ROW_BLOCK ? T - t0 : ROW_BLOCK, nt = (tn + TR - 1) / TR;
        for (int q = q0; q < q1; q += TP) {
            const int P = q1 - q < TP ? q1 - q : TP;
            for (int i0 = 0; i0 < KP; i0 += KB) {
                const int i1 = KP - i0 < KB ? KP : i0 + KB;
                for (int t = 0; t < nt; t++) {
                    const int r0 = t0 + row_split(tn, nt, t), r1 = t0 + row_split(tn, nt, t + 1);
                    block_tile(P, r1 - r0, w + q * pst, pst, xp + (size_t)r0 * ldp, ldp, i0, i1,
                               y + (size_t)r0 * ldy, ldy, q, n0, n1, i0 == 0, i1 == KP, b);
                }
            }
        }
    }
}
