/* gemm_amx.c - products over bf16 weights in panels (MOE_DTYPE_BF16_PANEL)
 * on the AMX tile units (AMX-BF16).  The input split they read
 * (moe_gemm_split_rows) is in gemm_panel_dp.c, beside the other kernels
 * that read it.
 *
 * A panel (runtime/cpu/gemm_panel.c) is already AMX's B layout: each k-pair
 * is one 64-byte line of 16 outputs, so 16 consecutive k-pairs of a panel
 * are one B tile (16 rows of 64 bytes, stride 64), read in place.
 *
 * Inputs: TDPBF16PS multiplies bf16 by bf16, so each fp32 input row is
 * split once per product into bf16 rows ("parts", by the kernel set):
 * hi = bf16(x), then mid = bf16(x - hi), then lo = x - hi - mid (each
 * rounded to nearest even; the residues are exact in fp32).  One part
 * (amx-bf16) is x rounded to bf16, within 2^-8 |x| (llama.cpp's and a bf16
 * model's numerics); two (amx) are within 2^-16 |x|; three (amx-exact) sum
 * to x exactly (lo has at most 8 significant bits left).
 * Each k step of 32 takes one tile product per part, in that order.  A
 * bf16 product is exact in fp32 and the tile unit accumulates in fp32 (its
 * own rounding, not FMA's: against the exact sum, amx-exact's outputs are
 * closer than the FMA kernels').  Exceptions: residues below bf16's
 * smallest normal (|x| below about 2^-110) are flushed, an infinite input
 * keeps zero residues, and an input past bf16's largest finite value
 * (3.39e38) becomes infinite.  Rows are padded to a multiple of 32 k with
 * zeros.
 *
 * Order: output (r, n) is C = 0, then for each k step s = 0, 1, ...:
 * C += part(r, s) . B(s) for each part in order, then + bias.  A tile row
 * is computed from its own input row alone, and the sequence is the same
 * for both tile shapes below and for the one-row FMAs (which compute the
 * tile unit's own sum: below), so a row gives the same bits alone or in
 * any batch, in any slice of the outputs.  (They are not the bits of the
 * AVX-512 or AVX2 panel kernels.)
 *
 * One row: AVX-512 FMAs, 8, 6 or 4 panels (1, 2, 3 parts).  Up to 16
 * rows, one row tile: tmm0-2 accumulate 3 panels, tmm3-5
 * hold the parts, tmm6-7 weights (prefetched ahead), k in one pass (the
 * weights stream once); more rows, two row tiles: tmm0-3 accumulate 2 rows
 * x 2 panels, tmm4-5 the two row tiles' parts one after the other, tmm6-7
 * weights.  Panels in blocks of 8 to 16, up to 1 MiB of weights where K
 * allows more than 8 (their weights stay in L2 across the row blocks).
 * The first 32 rows take k in one pass over each pair of panels, the
 * weights prefetched ahead: they read the weights from memory, and two
 * sequential streams let the hardware prefetchers run ahead (blocks of k
 * would leave each panel's stream every 4 KB).  The rows after them take
 * k in blocks of 4 steps over weights now in L2 (the inputs of a block
 * stay in L1 across the panels; partial sums spill as fp32 between
 * blocks, exactly).  The
 * tile configuration is loaded at the start of each call (and again for a
 * last block of fewer rows) and released at its end, so no tile state
 * outlives a call. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime/cpu/gemm_fast.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/core/status.h"

#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum {
    KT = 32, /* k per tile step */
    PF = 2,  /* the first 32 rows: prefetch the weights this many steps ahead */
    KB = 4,  /* rows 33 on: k steps per block (the block's inputs stay in L1) */
    NB_BYTES = 1 << 20, /* more than 16 rows: a block's panels, 8 to 16, at most this many bytes of weights
                         * where that is more than 8 (they stay in L2 across the row blocks) */
    ARCH_REQ_XCOMP_PERM = 0x1023,
    XFEATURE_XTILEDATA = 18,
};

bool moe_amx_permit(void)
{
    /* Linux keeps the tile data state off until a process asks for it */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

struct tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* One row tile (rows1 0): tmm0-5 rows0 rows; two: tmm0, tmm1, tmm4 rows0,
 * tmm2, tmm3, tmm5 rows1; weights tmm6-7 16 k-pairs. */
AMX static void configure(struct tilecfg *cur, int rows0, int rows1)
{
    struct tilecfg c = {.palette = 1};
    for (int t = 0; t < 8; t++) c.colsb[t] = 64;
    for (int t = 0; t < 6; t++) c.rows[t] = (uint8_t)rows0;
    if (rows1 > 0) c.rows[2] = c.rows[3] = c.rows[5] = (uint8_t)rows1;
    c.rows[6] = c.rows[7] = 16;
    if (memcmp(&c, cur, sizeof c) == 0) return;
    *cur = c;
    _tile_loadconfig(cur);
}

#define AVX512 AMX
#include "runtime/cpu/gemm_panel_avx512.h"

/* Rows [0, R) of an accumulator stored in c (16 x 16 fp32) into y at
 * panel q's outputs within [n0, n1), + bias. */
AMX static void put(const float *c, int R, float *y, size_t ldy, int q, int n0, int n1,
                    const struct moe_tensor *b)
{
    const __mmask16 m = lane_mask(q, n0, n1);
    if (!m) return;
    const __m512 bv = b ? bias16(b, q, m) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        const __m512 v = _mm512_load_ps(c + 16 * r);
        _mm512_mask_storeu_ps(y + (size_t)r * ldy + 16 * (size_t)q, m, b ? _mm512_add_ps(v, bv) : v);
    }
}

/* The B tile of k step s of panel q: in place, or for a last step of
 * fewer than 16 k-pairs, copied with zeros after it into tail (the
 * inputs' padding is zero, but the bytes after a panel may be anything). */
INLINE const char *btile(const char *w, size_t pst, int q, int s, int full, int tail_pairs, char *tail)
{
    const char *p = w + (size_t)q * pst + (size_t)s * 16 * 64;
    if (s < full) return p;
    memcpy(tail, p, (size_t)tail_pairs * 64);
    memset(tail + (size_t)tail_pairs * 64, 0, (size_t)(16 - tail_pairs) * 64);
    return tail;
}

/* The 16 lines of the B tile PF steps after step s of panel q, into the
 * cache (when there is one: decode streams its weights from memory once). */
INLINE void prefetch_b(const char *w, size_t pst, int q, int s, int steps)
{
    if (s + PF >= steps) return;
    const char *p = w + (size_t)q * pst + (size_t)(s + PF) * 16 * 64;
    for (int i = 0; i < 16; i++) _mm_prefetch(p + 64 * i, _MM_HINT_T0);
}

/* ---- one row: the tiles' sums with FMAs ----
 * What TDPBF16PS computes, measured on the processor (and pinned by
 * tests/test_fast_ops.c, amx_one_row_is_the_tiles_bits): for each output,
 * E = the products at the even k of the step summed in k order and O =
 * those at the odd k likewise, each from zero in fp32 rounding to nearest
 * even, then C = C + (E + O); denormal inputs and results are flushed to
 * zero.  (Not the pseudo-code's one chain of FMAs, nor the exact sum
 * rounded once.)  With MXCSR's DAZ and FTZ set, FMAs over a panel line's
 * even and odd weights (a shift and a mask, as gemm_eo.h widens them) give
 * those bits.  A lone row (decode) takes them: there a tile product
 * streams its weights 7-15% slower than the FMA kernels (a tile load
 * costs as much as a 16-row product); from two rows on the tiles are as
 * fast or faster.  A last step of fewer than 16 k-pairs adds the tiles'
 * zero products as one +0 (a flushed -0 sum becomes +0). */
enum {
    FMA_PF = 512,       /* prefetch distance, bytes per panel stream */
    FMA_ACC = 24,       /* registers the sums E and O may take (of 32) */
    CSR_FLUSH = 0x8040, /* MXCSR's FTZ (bit 15) and DAZ (bit 6) */
};

/* Panels q .. q+P-1 (w: panel q's first line, pst bytes between panels)
 * x the one row of xs (its parts kp apart), all KP k-pairs, + bias.  A
 * line is loaded and widened once for every part. */
AMX INLINE void fma_tile(const int P, const int parts, const char *w, size_t pst, const uint16_t *xs, size_t kp,
                         int KP, float *y, int q, int n0, int n1, const struct moe_tensor *b)
{
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | CSR_FLUSH);
    const __m512i odd = _mm512_set1_epi32((int)0xffff0000u);
    __m512 c[8];
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) c[p] = _mm512_setzero_ps();
    for (int i0 = 0; i0 < KP; i0 += KT / 2) {
        const int i1 = KP - i0 < KT / 2 ? KP : i0 + KT / 2;
        __m512 e[FMA_ACC / 2], o[FMA_ACC / 2]; /* [part][p] */
#pragma GCC unroll 12
        for (int a = 0; a < P * parts; a++) e[a] = o[a] = _mm512_setzero_ps();
        for (int i = i0; i < i1; i++) {
            __m512 xe[3], xo[3];
#pragma GCC unroll 3
            for (int j = 0; j < parts; j++) {
                uint32_t pair;
                memcpy(&pair, xs + (size_t)j * kp + 2 * (size_t)i, 4);
                const __m512i xv = _mm512_set1_epi32((int)pair);
                xe[j] = _mm512_castsi512_ps(_mm512_slli_epi32(xv, 16));
                xo[j] = _mm512_castsi512_ps(_mm512_and_si512(xv, odd));
            }
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) {
                const char *l = w + (size_t)p * pst + (size_t)i * 64;
                _mm_prefetch(l + FMA_PF, _MM_HINT_T0);
                const __m512i v = _mm512_load_si512(l);
                const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, odd));
#pragma GCC unroll 3
                for (int j = 0; j < parts; j++) {
                    e[j * P + p] = _mm512_fmadd_ps(we, xe[j], e[j * P + p]);
                    o[j * P + p] = _mm512_fmadd_ps(wo, xo[j], o[j * P + p]);
                }
            }
        }
        const bool padded = i1 - i0 < KT / 2;
#pragma GCC unroll 3
        for (int j = 0; j < parts; j++)
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) {
                __m512 ev = e[j * P + p], ov = o[j * P + p];
                if (padded) {
                    ev = _mm512_add_ps(ev, _mm512_setzero_ps());
                    ov = _mm512_add_ps(ov, _mm512_setzero_ps());
                }
                c[p] = _mm512_add_ps(c[p], _mm512_add_ps(ev, ov));
            }
    }
    _mm_setcsr(csr);
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) {
        const __mmask16 m = lane_mask(q + p, n0, n1);
        _mm512_mask_storeu_ps(y + 16 * (size_t)(q + p), m, b ? _mm512_add_ps(c[p], bias16(b, q + p, m)) : c[p]);
    }
}

/* Panels a one-row tile takes for this many parts (its sums within
 * FMA_ACC registers): 8, 6 or 4. */
static int fma_panels(int parts) { return FMA_ACC / (2 * parts) > 8 ? 8 : FMA_ACC / (2 * parts); }

#define FMA_TILE(Pc, Nc) \
    case (Nc) * 16 + (Pc): fma_tile(Pc, Nc, w, pst, xs, kp, KP, y, q, n0, n1, b); break

/* P <= fma_panels(parts) panels x the one row. */
AMX static void fma_row(int P, int parts, const char *w, size_t pst, const uint16_t *xs, size_t kp, int KP, float *y,
                        int q, int n0, int n1, const struct moe_tensor *b)
{
    switch (parts * 16 + P) {
        FMA_TILE(1, 1); FMA_TILE(2, 1); FMA_TILE(3, 1); FMA_TILE(4, 1);
        FMA_TILE(5, 1); FMA_TILE(6, 1); FMA_TILE(7, 1); FMA_TILE(8, 1);
        FMA_TILE(1, 2); FMA_TILE(2, 2); FMA_TILE(3, 2); FMA_TILE(4, 2); FMA_TILE(5, 2); FMA_TILE(6, 2);
        FMA_TILE(1, 3); FMA_TILE(2, 3); FMA_TILE(3, 3); FMA_TILE(4, 3);
    default: MOE_ASSERT(!"gemm amx: no such one-row tile");
    }
}
#undef FMA_TILE

/* Whether panel q's sums go straight into y: the slice [n0, n1) takes all
 * 16 of its outputs and there is no bias to add. */
static inline bool direct(const struct moe_tensor *b, int q, int n0, int n1)
{
    return !b && 16 * q >= n0 && 16 * q + 16 <= n1;
}

/* Accumulator tile t starts at zero (first k block) or from the partial
 * sums spilled at spill + at; ends spilled there, or in out (16 x 16) to
 * be put (the last k block; a single block never spills). */
#define C_IN(t, at) do { if (first) _tile_zero(t); else _tile_loadd(t, spill + (at), 64); } while (0)
#define C_OUT(t, at, out) do { if (last) _tile_stored(t, out, 64); else _tile_stored(t, spill + (at), 64); } while (0)
/* The same where the last block's sums of panel q may go straight into
 * rows yr of y (`direct`); else
 * into out, for put. */
#define C_OUT_Y(t, at, out, q, yr) \
    do { \
        if (last && direct(b, q, n0, n1)) _tile_stored(t, (yr) + 16 * (size_t)(q), (long)(ldy * sizeof(float))); \
        else C_OUT(t, at, out); \
    } while (0)
#define PUT(cc, R, yr, q) do { if (!direct(b, q, n0, n1)) put(cc, R, yr, ldy, q, n0, n1, b); } while (0)

AMX void moe_gemm_rows_panel_amx(enum moe_cpu_isa isa, float *y, size_t ldy, const uint16_t *xs, size_t lds,
                                 int T, const void *wv, int K, int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(K % 2 == 0 && n0 >= 0 && n0 < n1 && lds == moe_gemm_split_ld(isa, K));
    const int parts = moe_amx_parts(isa);
    if (b && !b->data) b = NULL;
    const char *w = wv;
    const size_t pst = (size_t)K * 32, kp = (lds - 32) / (size_t)parts, lda = lds * sizeof(uint16_t);
    const int q0 = n0 / 16, q1 = (n1 + 15) / 16, full = K / KT, steps = (int)(kp / KT);
    const int tail_pairs = (K % KT) / 2;
    if (T == 1) {
        const int pmax = fma_panels(parts);
        for (int q = q0; q < q1; q += pmax)
            fma_row(q1 - q < pmax ? q1 - q : pmax, parts, w + (size_t)q * pst, pst, xs, kp, K / 2, y, q, n0, n1, b);
        return;
    }
    /* partial sums between k blocks (rows 33 on): two row tiles per panel of a block */
    const size_t nbw = NB_BYTES / pst;
    const int NB = nbw < 8 ? 8 : nbw > 16 ? 16 : (int)nbw;
    const bool spills = T > 32 && steps > KB;
    float *spill = spills ? moe_gemm_thread_buffer((size_t)NB * 512) : NULL;
    MOE_ASSERT((!spills || spill) && "gemm amx: out of memory for the partial sums");
    _Alignas(64) float c[4][256];
    _Alignas(64) char tail[2][1024];
    struct tilecfg cur = {0};
    for (int qb = q0; qb < q1; qb += NB) {
    const int qe = qb + NB < q1 ? qb + NB : q1;
    for (int t0 = 0; t0 < T; t0 += 32) {
        const int left = T - t0, rows0 = left < 16 ? left : 16, rows1 = left <= 16 ? 0 : left < 32 ? left - 16 : 16;
        configure(&cur, rows0, rows1);
        const uint16_t *a0 = xs + (size_t)t0 * lds, *a1 = a0 + 16 * lds;
        float *y0 = y + (size_t)t0 * ldy, *y1 = y0 + 16 * ldy;
        /* up to 16 rows, and the first 32 rows of more, read the weights
         * from memory: each panel's stream in one pass of k */
        const int kb = rows1 == 0 || t0 == 0 ? steps : KB;
        for (int s0 = 0; s0 < steps; s0 += kb) {
            const int s1 = s0 + kb < steps ? s0 + kb : steps;
            const bool first = s0 == 0, last = s1 == steps;
            if (rows1 == 0) {
                for (int q = qb; q < qe; q += 3) {
                    const int P = qe - q < 3 ? qe - q : 3;
                    const size_t sp = (size_t)(q - qb) * 512;
                    C_IN(0, sp);
                    if (P > 1) C_IN(1, sp + 512);
                    if (P > 2) C_IN(2, sp + 1024);
                    for (int s = s0; s < s1; s++) {
                        const uint16_t *a = a0 + (size_t)s * KT;
                        _tile_loadd(3, a, lda);
                        if (parts > 1) _tile_loadd(4, a + kp, lda);
                        if (parts > 2) _tile_loadd(5, a + 2 * kp, lda);
                        prefetch_b(w, pst, q, s, full);
                        _tile_loadd(6, btile(w, pst, q, s, full, tail_pairs, tail[0]), 64);
                        _tile_dpbf16ps(0, 3, 6);
                        if (parts > 1) _tile_dpbf16ps(0, 4, 6);
                        if (parts > 2) _tile_dpbf16ps(0, 5, 6);
                        if (P > 1) {
                            prefetch_b(w, pst, q + 1, s, full);
                            _tile_loadd(7, btile(w, pst, q + 1, s, full, tail_pairs, tail[1]), 64);
                            _tile_dpbf16ps(1, 3, 7);
                            if (parts > 1) _tile_dpbf16ps(1, 4, 7);
                            if (parts > 2) _tile_dpbf16ps(1, 5, 7);
                        }
                        if (P > 2) {
                            prefetch_b(w, pst, q + 2, s, full);
                            _tile_loadd(6, btile(w, pst, q + 2, s, full, tail_pairs, tail[0]), 64);
                            _tile_dpbf16ps(2, 3, 6);
                            if (parts > 1) _tile_dpbf16ps(2, 4, 6);
                            if (parts > 2) _tile_dpbf16ps(2, 5, 6);
                        }
                    }
                    C_OUT_Y(0, sp, c[0], q, y0);
                    if (P > 1) C_OUT_Y(1, sp + 512, c[1], q + 1, y0);
                    if (P > 2) C_OUT_Y(2, sp + 1024, c[2], q + 2, y0);
                    if (last)
                        for (int p = 0; p < P; p++) PUT(c[p], rows0, y0, q + p);
                }
                continue;
            }
            for (int q = qb; q < qe; q += 2) {
                const int P = qe - q < 2 ? qe - q : 2;
                const size_t sp = (size_t)(q - qb) * 512;
                C_IN(0, sp);
                C_IN(2, sp + 256);
                if (P > 1) {
                    C_IN(1, sp + 512);
                    C_IN(3, sp + 768);
                }
                for (int s = s0; s < s1; s++) {
                    if (t0 == 0) {
                        prefetch_b(w, pst, q, s, full);
                        if (P > 1) prefetch_b(w, pst, q + 1, s, full);
                    }
                    _tile_loadd(6, btile(w, pst, q, s, full, tail_pairs, tail[0]), 64);
                    if (P > 1) _tile_loadd(7, btile(w, pst, q + 1, s, full, tail_pairs, tail[1]), 64);
                    for (int part = 0; part < parts; part++) {
                        const size_t at = (size_t)part * kp + (size_t)s * KT;
                        _tile_loadd(4, a0 + at, lda);
                        _tile_loadd(5, a1 + at, lda);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(2, 5, 6);
                        if (P > 1) {
                            _tile_dpbf16ps(1, 4, 7);
                            _tile_dpbf16ps(3, 5, 7);
                        }
                    }
                }
                C_OUT_Y(0, sp, c[0], q, y0);
                C_OUT_Y(2, sp + 256, c[2], q, y1);
                if (P > 1) {
                    C_OUT_Y(1, sp + 512, c[1], q + 1, y0);
                    C_OUT_Y(3, sp + 768, c[3], q + 1, y1);
                }
                if (!last) continue;
                PUT(c[0], rows0, y0, q);
                PUT(c[2], rows1, y1, q);
                if (P > 1) {
                    PUT(c[1], rows0, y0, q + 1);
                    PUT(c[3], rows1, y1, q + 1);
                }
            }
        }
    }
    }
    _tile_release();
}
