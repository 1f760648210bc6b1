/* gemm_q8_k_rows.h - the driver of the kernels over input rows in blocks
 * of 256 (gemm_q8_k.h: gemm_q4_k.c, gemm_q6_k.c and their AVX-512 twins
 * gemm_q4_k_avx512.c, gemm_q6_k_avx512.c), written once for all four:
 * which tile takes which input and weight rows, and the entry point that
 * quantizes up to TBQ input rows at a time into the calling thread's
 * buffer (moe_gemm_thread_buffer), once for all its weight rows.
 *
 * The includer defines AVX2, INLINE, TBQ, its tile(R, C, y, ldy, x, xs,
 * r0, nb, w, wld, b, n, pf) (R <= 4 input rows from r0 against C <= 2
 * weight rows, or KQ_C1 for one input row, the first pass over them
 * prefetching when pf), and
 * KQ_DTYPE (the weights' dtype) and KQ_ENTRY (the entry point's name),
 * and may define KQ_C1 (the weight rows of a one-row tile, default 2),
 * KQ_ARRANGE(row, nb) (run on each quantized row before the tiles read
 * it: a reordering of its codes that its tiles expect) and KQ_PANEL(y,
 * ldy, x, ldx, T, w, wld, nb, n0, n1, b) (which takes a call of PANEL_MIN
 * or more input rows instead of the tiles: gemm_k_panel.h), then
 * includes this file once. */

#ifndef KQ_C1
#define KQ_C1 2
#endif

/* R rows (1..3) against weight rows [n0, n1), C at a time then one by one;
 * w points at row n0. */
AVX2 INLINE void row_tiles(const int R, const int C, float *y, size_t ldy, const char *x, size_t xs, int nb,
                           const char *w, size_t wld, int n0, int n1, const struct moe_tensor *b)
{
    int n = n0;
    for (; n + C <= n1; n += C) tile(R, C, y + n, ldy, x, xs, 0, nb, w + (size_t)(n - n0) * wld, wld, b, n, true);
    for (; n < n1; n++) tile(R, 1, y + n, ldy, x, xs, 0, nb, w + (size_t)(n - n0) * wld, wld, b, n, true);
}

/* tn (1..TBQ) quantized rows against weight rows [n0, n1). */
AVX2 static void rows_tn(float *y, size_t ldy, const char *x, size_t xs, int tn, int nb, const char *w, size_t wld,
                         int n0, int n1, const struct moe_tensor *b)
{
    enum { C4 = 2 }; /* weight rows of a 4-input tile */
    switch (tn) {
    case 1: row_tiles(1, KQ_C1, y, ldy, x, xs, nb, w, wld, n0, n1, b); return;
    case 2: row_tiles(2, 2, y, ldy, x, xs, nb, w, wld, n0, n1, b); return;
    case 3: row_tiles(3, 2, y, ldy, x, xs, nb, w, wld, n0, n1, b); return;
    default: break;
    }
    /* each group of C4 weight rows (in L1) against every 4-row tile, then
     * the last 1-3 rows one at a time */
    const int t4 = tn & ~3;
    for (int n = n0; n < n1; n += C4) {
        const bool full = n + C4 <= n1;
        const char *wn = w + (size_t)(n - n0) * wld;
        for (int t = 0; t < tn; t += t < t4 ? 4 : 1) {
            float *yt = y + (size_t)t * ldy + n;
            if (t < t4 && full) tile(4, C4, yt, ldy, x, xs, t, nb, wn, wld, b, n, t == 0);
            else if (t < t4) tile(4, 1, yt, ldy, x, xs, t, nb, wn, wld, b, n, t == 0);
            else if (full) tile(1, C4, yt, ldy, x, xs, t, nb, wn, wld, b, n, t == 0);
            else tile(1, 1, yt, ldy, x, xs, t, nb, wn, wld, b, n, t == 0);
        }
    }
}

AVX2 void KQ_ENTRY(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w, int Din, int n0, int n1,
                   const struct moe_tensor *b)
{
    MOE_ASSERT(Din > 0 && Din % MOE_Q8_K_BLOCK == 0);
    const int nb = Din / MOE_Q8_K_BLOCK;
    const size_t wld = moe_dtype_row_bytes(KQ_DTYPE, (size_t)Din);
    const int rows = T < TBQ ? T : TBQ;
    const size_t xs = moe_q8_k_row_bytes(nb);
    size_t bytes;
    const bool sized = moe_mul_size((size_t)rows, xs, &bytes);
    MOE_ASSERT(sized && "gemm_fast: the quantized input rows' size overflows");
    char *buf = (char *)moe_gemm_thread_buffer(bytes / sizeof(float));
    MOE_ASSERT(buf && "gemm_fast: out of memory for the quantized input rows");
    const char *wr = (const char *)w + (size_t)n0 * wld;
#ifdef KQ_PANEL
    if (T >= PANEL_MIN) {
        KQ_PANEL(y, ldy, x, ldx, T, wr, wld, nb, n0, n1, b);
        return;
    }
#endif
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TBQ) {
        const int tn = T - t0 < TBQ ? T - t0 : TBQ;
        for (int t = 0; t < tn; t++) {
            moe_quantize_x_q8_k(buf + (size_t)t * xs, x + (size_t)(t0 + t) * ldx, nb);
#ifdef KQ_ARRANGE
            KQ_ARRANGE(buf + (size_t)t * xs, nb);
#endif
        }
        rows_tn(y + (size_t)t0 * ldy, ldy, buf, xs, tn, nb, wr, wld, n0, n1, b);
    }
}
