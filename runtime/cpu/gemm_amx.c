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
 * for both tile shapes below, so a row gives the same bits alone or in any
 * batch, in any slice of the outputs.  (They are not the bits of the
 * AVX-512 or AVX2 panel kernels.)
 *
 * Tiles: up to 16 rows, one row tile: tmm0-2 accumulate 3 panels, tmm3-5
 * hold the parts, tmm6-7 weights (prefetched ahead), k in one pass (the
 * weights stream once); more rows, two row tiles: tmm0-3 accumulate 2 rows
 * x 2 panels, tmm4-5 the two row tiles' parts one after the other, tmm6-7
 * weights.  Panels in blocks of 8 (their weights stay in L2 across the row
 * blocks), k in blocks of 4 steps (the inputs of a block stay in L1 across
 * the panels; partial sums spill as fp32 between blocks, exactly).  The
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
    PF = 2,  /* up to 16 rows: prefetch the weights this many steps ahead */
    KB = 4,  /* more than 16 rows: k steps per block (the block's inputs stay in L1) */
    NB = 8,  /* more than 16 rows: panels per block (their weights stay in L2) */
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

/* Accumulator tile t starts at zero (first k block) or from the partial
 * sums spilled at spill + at; ends spilled there, or in out (16 x 16) to
 * be put (the last k block; a single block never spills). */
#define C_IN(t, at) do { if (first) _tile_zero(t); else _tile_loadd(t, spill + (at), 64); } while (0)
#define C_OUT(t, at, out) do { if (last) _tile_stored(t, out, 64); else _tile_stored(t, spill + (at), 64); } while (0)

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
    /* partial sums between k blocks: two row tiles per panel of a block */
    float *spill = steps > KB ? moe_gemm_thread_buffer((size_t)NB * 512) : NULL;
    MOE_ASSERT((steps <= KB || spill) && "gemm amx: out of memory for the partial sums");
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
        /* up to 16 rows the inputs are small: the weights stream through
         * each panel group once, k in one block */
        const int kb = rows1 == 0 ? steps : KB;
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
                    C_OUT(0, sp, c[0]);
                    if (P > 1) C_OUT(1, sp + 512, c[1]);
                    if (P > 2) C_OUT(2, sp + 1024, c[2]);
                    if (last)
                        for (int p = 0; p < P; p++) put(c[p], rows0, y0, ldy, q + p, n0, n1, b);
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
                C_OUT(0, sp, c[0]);
                C_OUT(2, sp + 256, c[2]);
                if (P > 1) {
                    C_OUT(1, sp + 512, c[1]);
                    C_OUT(3, sp + 768, c[3]);
                }
                if (!last) continue;
                put(c[0], rows0, y0, ldy, q, n0, n1, b);
                put(c[2], rows1, y1, ldy, q, n0, n1, b);
                if (P > 1) {
                    put(c[1], rows0, y0, ldy, q + 1, n0, n1, b);
                    put(c[3], rows1, y1, ldy, q + 1, n0, n1, b);
                }
            }
        }
    }
    }
    _tile_release();
}
