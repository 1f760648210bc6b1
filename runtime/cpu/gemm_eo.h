/* gemm_eo.h - the bf16 matrix product in the even/odd order, written once
 * for both kernel sets: gemm_avx2.c and gemm_avx512.c each define the
 * macros below for their vector width and include this file (after
 * gemm_nat.h, the f32 and f16 kernels).
 *
 * A block of EO_BLK = 2 * V_W bf16 weights (32 bytes for AVX2, a 64-byte
 * line for AVX-512), read as V_W 32-bit lanes, holds the even weights in
 * the low halves and the odd ones in the high halves: one shift gives V_W
 * fp32 evens and one mask the odds (two cheap operations per block instead
 * of two widening loads and two shifts).  The input rows are deinterleaved
 * to match (per block: V_W even, V_W odd) into a per-thread buffer.
 * Fewer instructions per byte let the core keep more lines in flight, which
 * is what a decode step (every weight read once from DRAM) is limited by.
 * Every path (decode tiles, batch tiles, widened rows) accumulates lane j of
 * block b as even element EO_BLK*b + 2j then odd element EO_BLK*b + 2j + 1,
 * so a row gives the same bits alone or in any batch.
 *
 * The includer defines the lane vocabulary of gemm_nat.h (V_ATTR, V_F,
 * V_I, V_W, V_REGS, V_ZERO, ... V_HSUM; include gemm_nat.h first: it also
 * gives load_w1 and TB) and for this file: EO_FN(name) (a unique name, so
 * the two widths' non-inlined functions are told apart in a profile),
 * EO_MAXC (widest tile), EO_C1..EO_C3 (weight rows per tile for 1-3 input
 * rows), EO_C4 (for 4 input rows), EO_PF (prefetch distance in bytes) and
 * EO_DEINTERLEAVE(dst, src) (one block of inputs to V_W even, V_W odd). */
#define EO_BLK (2 * V_W)

/* bf16 tile in the even/odd order: y[r*ldy + c] = x_r . w_c (+ bias).  xs
 * holds the R input rows deinterleaved (row stride ldx); w is raw bf16
 * (wide false, row stride wld bytes) or bf16 widened by widen_rows_eo (wide
 * true, fp32 in the same deinterleaved order). */
V_ATTR INLINE void EO_FN(tile_eo)(const int R, const int C, const bool wide, float *y, size_t ldy,
                           const float *xs, size_t ldx, const char *w, size_t wld, int Din,
                           const struct moe_tensor *b, int n)
{
    V_F acc[4][EO_MAXC];
    const V_I odd = V_SET1I((int)0xffff0000);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) acc[r][c] = V_ZERO();
    /* Small tiles take a block in one pass (each weight line loaded once,
     * both halves used at once); a 4-row tile would need too many registers
     * for that and takes the even halves, then the odd ones.  Either way
     * each accumulator sees even then odd: the same order. */
    const bool one_pass = R * C + 2 * R + 4 <= V_REGS;
    const size_t step = wide ? 4 * EO_BLK : 2 * EO_BLK; /* bytes of a weight row per block */
    const char *wk = w;
    const int k32 = Din / EO_BLK * EO_BLK;
    for (int k = 0; k < k32; k += EO_BLK, wk += step) {
        if (one_pass) {
            V_F xe[4], xo[4];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                xe[r] = V_LOADU(xs + (size_t)r * ldx + k);
                xo[r] = V_LOADU(xs + (size_t)r * ldx + k + V_W);
            }
            const char *p = wk;
#pragma GCC unroll 16
            for (int c = 0; c < C; c++, p += wld) {
                V_F lo, hi;
                if (wide) {
                    lo = V_LOADU((const float *)p);
                    hi = V_LOADU((const float *)p + V_W);
                } else {
                    _mm_prefetch(p + EO_PF, _MM_HINT_T0);
                    /* two loads of the line (the second hits L1), each
                     * folded into its operation: holding the line in a
                     * register makes GCC spill */
                    const char *q = p;
                    __asm__("" : "+r"(q));
                    lo = V_CASTPS(V_SLLI(V_LOADI(p), 16));
                    hi = V_CASTPS(V_AND(V_LOADI(q), odd));
                }
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    acc[r][c] = V_FMA(xe[r], lo, acc[r][c]);
                    acc[r][c] = V_FMA(xo[r], hi, acc[r][c]);
                }
            }
            continue;
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            V_F xv[4];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) xv[r] = V_LOADU(xs + (size_t)r * ldx + k + V_W * h);
            const char *p = wk;
            /* hide that the second pass reads the lines of the first: holding
             * them in registers between the passes would spill */
            __asm__ volatile("" : "+r"(p));
#pragma GCC unroll 16
            for (int c = 0; c < C; c++, p += wld) {
                V_F wv;
                if (wide) {
                    wv = V_LOADU((const float *)p + V_W * h);
                } else {
                    if (h == 0) _mm_prefetch(p + EO_PF, _MM_HINT_T0);
                    const V_I v = V_LOADI(p);
                    wv = V_CASTPS(h ? V_AND(v, odd) : V_SLLI(v, 16));
                }
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) acc[r][c] = V_FMA(xv[r], wv, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = V_HSUM(acc[r][c]);
            const char *wc = w + (size_t)c * wld;
            for (int kk = k32; kk < Din; kk++)
                s += xs[(size_t)r * ldx + kk] *
                     (wide ? ((const float *)wc)[kk] : load_w1(wc, MOE_DTYPE_BF16, kk));
            y[(size_t)r * ldy + c] = s + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
        }
}

/* R <= 3 deinterleaved rows against bf16 weight rows [n0, n1) (see few_rows). */
V_ATTR INLINE void EO_FN(few_rows_eo)(const bool wide, float *y, size_t ldy, const float *xs, size_t ldx,
                               int R, const char *w, size_t wld, int Din, int n0, int n1,
                               const struct moe_tensor *b)
{
    int n = n0;
    switch (R) {
    case 1:
        for (; n + EO_C1 <= n1; n += EO_C1)
            EO_FN(tile_eo)(1, EO_C1, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++)
            EO_FN(tile_eo)(1, 1, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    case 2:
        for (; n + EO_C2 <= n1; n += EO_C2)
            EO_FN(tile_eo)(2, EO_C2, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++)
            EO_FN(tile_eo)(2, 1, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    default:
        for (; n + EO_C3 <= n1; n += EO_C3)
            EO_FN(tile_eo)(3, EO_C3, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++)
            EO_FN(tile_eo)(3, 1, wide, y + n, ldy, xs, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    }
}

/* C bf16 weight rows to fp32 in the even/odd order (tails in place). */
V_ATTR INLINE void EO_FN(widen_rows_eo)(float *dst, const char *w, size_t wld, int C, int Din)
{
    const V_I odd = V_SET1I((int)0xffff0000);
    const int k32 = Din / EO_BLK * EO_BLK;
    for (int c = 0; c < C; c++) {
        const char *src = w + (size_t)c * wld;
        float *d = dst + (size_t)c * Din;
        for (int k = 0; k < k32; k += EO_BLK) {
            const V_I v = V_LOADI(src + (size_t)k * 2);
            V_STOREU(d + k, V_CASTPS(V_SLLI(v, 16)));
            V_STOREU(d + k + V_W, V_CASTPS(V_AND(v, odd)));
        }
        for (int k = k32; k < Din; k++) d[k] = load_w1(src, MOE_DTYPE_BF16, k);
    }
}

/* T input rows deinterleaved per block (V_W even, V_W odd; the tail in
 * place)
 * into this thread's buffer, row stride Din; NULL when out of memory. */
V_ATTR static const float *EO_FN(deinterleave_rows)(const float *x, size_t ldx, int T, int Din)
{
    float *buf = moe_gemm_thread_buffer((size_t)T * (size_t)Din);
    if (!buf) return NULL;
    const int k32 = Din / EO_BLK * EO_BLK;
    for (int t = 0; t < T; t++) {
        const float *src = x + (size_t)t * ldx;
        float *d = buf + (size_t)t * Din;
        for (int k = 0; k < k32; k += EO_BLK) EO_DEINTERLEAVE(d + k, src + k);
        for (int k = k32; k < Din; k++) d[k] = src[k];
    }
    return buf;
}

/* All T rows against bf16 weight rows [n0, n1): rows_dt's blocking in the
 * even/odd order. */
V_ATTR static void EO_FN(rows_bf16)(float *y, size_t ldy, const float *x, size_t ldx, int T,
                             const void *wv, int Din, int n0, int n1, const struct moe_tensor *b)
{
    enum { C = EO_C4, WBUF = 6 * 4096 };
    const char *w = wv;
    const size_t wld = (size_t)Din * 2, fld = (size_t)Din * 4;
    float wbuf[WBUF];
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TB) {
        const int tn = T - t0 < TB ? T - t0 : TB;
        float *yb = y + (size_t)t0 * ldy;
        const float *xs = EO_FN(deinterleave_rows)(x + (size_t)t0 * ldx, ldx, tn, Din);
        MOE_ASSERT(xs && "gemm_fast: out of memory for the input rows");
        const size_t lds = (size_t)Din;
        if (tn < 4) {
            EO_FN(few_rows_eo)(false, yb, ldy, xs, lds, tn, w + n0 * wld, wld, Din, n0, n1, b);
            continue;
        }
        const int t4 = tn & ~3, rem = tn - t4;
        const bool widen = tn >= 16 && (size_t)C * Din <= WBUF; /* below, memory bound */
        int n = n0;
        for (; n + C <= n1; n += C) {
            const char *wn = w + n * wld, *wt = wn;
            size_t ld = wld;
            if (widen) {
                EO_FN(widen_rows_eo)(wbuf, wn, wld, C, Din);
                wt = (const char *)wbuf;
                ld = fld;
            }
            /* widen is a literal in each call, so each tile compiles to its own loop */
            for (int t = 0; t < t4; t += 4)
                if (widen)
                    EO_FN(tile_eo)(4, C, true, yb + t * ldy + n, ldy, xs + t * lds, lds, wt, ld, Din, b, n);
                else
                    EO_FN(tile_eo)(4, C, false, yb + t * ldy + n, ldy, xs + t * lds, lds, wt, ld, Din, b, n);
            if (rem && widen)
                EO_FN(few_rows_eo)(true, yb + t4 * ldy, ldy, xs + t4 * lds, lds, rem, wt, ld, Din, n,
                            n + C, b);
            else if (rem)
                EO_FN(few_rows_eo)(false, yb + t4 * ldy, ldy, xs + t4 * lds, lds, rem, wt, ld, Din, n,
                            n + C, b);
        }
        for (; n < n1; n++) {
            const char *wn = w + n * wld;
            for (int t = 0; t < t4; t += 4)
                EO_FN(tile_eo)(4, 1, false, yb + t * ldy + n, ldy, xs + t * lds, lds, wn, wld, Din, b, n);
            if (rem)
                EO_FN(few_rows_eo)(false, yb + t4 * ldy, ldy, xs + t4 * lds, lds, rem, wn, wld, Din, n,
                            n + 1, b);
        }
    }
}

