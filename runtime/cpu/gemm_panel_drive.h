/* gemm_panel_drive.h - the row/panel driver of the panel GEMM kernels,
 * written once for runtime/cpu/gemm_panel.c (AVX-512) and
 * runtime/cpu/gemm_panel_avx2.c (AVX2), which include it after their tiles.
 *
 * The includer defines:
 *   PD_ATTR        the target attribute of its kernels;
 *   PD_FN          the name of the driver (moe_gemm_rows_panel_<isa>);
 *   PD_DECODE_P1   panels per decode tile at 1 row, PD_DECODE_P3 at 2-3 rows;
 *   PD_A_PANELS    panels per variant-a tile, PD_B_PANELS per variant-b tile;
 * the constants A_ROWS, B_ROWS, B_MIN_ROWS, ROW_BLOCK, K_BLOCK; and the
 * tiles, each over P panels starting at panel q (outputs outside [n0, n1)
 * never stored):
 *   decode_tile(P, R, w, pst, x, ldx, KP, y, ldy, q, n0, n1, b)
 *   a_tile(P, R, w, pst, x, ldx, KP, y, ldy, q, n0, n1, b)
 *   widen_panels(wb, w, pst, P, i0, i1)            k-pairs [i0, i1) to fp32
 *   b_tile(P, R, wb, kn, x, ldx, y, ldy, q, n0, n1, first, last, b)
 *
 * Which tile a row lands in never changes its bits: every tile sums each
 * output in k order in its own lane (see gemm_panel.c). */

/* Rows [0, tn) in nt tiles as even as can be: tile t covers rows
 * [row_split(tn, nt, t), row_split(tn, nt, t + 1)). */
static int row_split(int tn, int nt, int t) { return (int)((long)tn * t / nt); }

PD_ATTR void PD_FN(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *wv, int K,
                   int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(K % 2 == 0 && n0 >= 0 && n0 < n1);
    if (b && !b->data) b = NULL;
    const char *w = wv;
    const int KP = K / 2, q0 = n0 / 16, q1 = (n1 + 15) / 16;
    const size_t pst = (size_t)K * 32; /* bytes per panel */
    if (T <= 3) {
        const int pmax = T == 1 ? PD_DECODE_P1 : PD_DECODE_P3;
        for (int q = q0; q < q1; q += pmax) {
            const int P = q1 - q < pmax ? q1 - q : pmax;
            decode_tile(P, T, w + q * pst, pst, x, ldx, KP, y, ldy, q, n0, n1, b);
        }
        return;
    }
    for (int t0 = 0; t0 < T; t0 += ROW_BLOCK) {
        const int tn = T - t0 < ROW_BLOCK ? T - t0 : ROW_BLOCK;
        const float *xb = x + (size_t)t0 * ldx;
        float *yb = y + (size_t)t0 * ldy;
        if (tn < B_MIN_ROWS) {
            const int nt = (tn + A_ROWS - 1) / A_ROWS;
            for (int q = q0; q < q1; q += PD_A_PANELS) {
                const int P = q1 - q < PD_A_PANELS ? q1 - q : PD_A_PANELS;
                for (int t = 0; t < nt; t++) {
                    const int r0 = row_split(tn, nt, t), r1 = row_split(tn, nt, t + 1);
                    a_tile(P, r1 - r0, w + q * pst, pst, xb + (size_t)r0 * ldx, ldx, KP,
                           yb + (size_t)r0 * ldy, ldy, q, n0, n1, b);
                }
            }
            continue;
        }
        const int nt = (tn + B_ROWS - 1) / B_ROWS;
        const int kb = K < K_BLOCK ? K : K_BLOCK; /* even */
        float *wb = moe_gemm_thread_buffer((size_t)PD_B_PANELS * 16 * (size_t)kb);
        MOE_ASSERT(wb && "gemm panels: out of memory for the widened panels");
        for (int q = q0; q < q1; q += PD_B_PANELS) {
            const int P = q1 - q < PD_B_PANELS ? q1 - q : PD_B_PANELS;
            for (int k0 = 0; k0 < K; k0 += kb) {
                const int kn = K - k0 < kb ? K - k0 : kb;
                const bool first = k0 == 0, last = k0 + kn == K;
                widen_panels(wb, w + q * pst, pst, P, k0 / 2, (k0 + kn) / 2);
                for (int t = 0; t < nt; t++) {
                    const int r0 = row_split(tn, nt, t), r1 = row_split(tn, nt, t + 1);
                    b_tile(P, r1 - r0, wb, kn, xb + (size_t)r0 * ldx + k0, ldx,
                           yb + (size_t)r0 * ldy, ldy, q, n0, n1, first, last, b);
                }
            }
        }
    }
}
