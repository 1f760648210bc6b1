/* gemm_nat.h - the f32 and f16 matrix product in the natural order, written
 * once for both kernel sets: gemm_avx2.c and gemm_avx512.c each define the
 * lane vocabulary and the tile widths below for their vector width and
 * include this file, then gemm_eo.h (the bf16 kernels, which use the same
 * vocabulary and this file's load_w1 and TB).
 *
 * A tile is R input rows x C weight rows; every k step of V_W loads C
 * weight vectors (converted to fp32 in registers: V_LOAD_W) and R input
 * vectors and issues R*C FMAs into R*C accumulators.  R = 4 for batches,
 * with NAT_C4 weight rows (the accumulators and weights fill the vector
 * registers, inputs are memory operands); R <= 3 rows (decode) take wider
 * tiles (NAT_C1..NAT_C3) so enough independent FMA chains stay in flight to
 * stream weights at memory speed, each weight row prefetched into L2 one
 * tile ahead (the same element of the row C rows on, which the next tile
 * reads).  Input rows are walked in blocks of TB so a block stays in L2
 * while the weight rows of the thread's range pass over it.
 *
 * Order: lane j of every accumulator sums elements V_W*s + j over the
 * steps s in order, then a fixed horizontal sum (V_HSUM), the Din tail in
 * order, the bias.  Every path (decode tiles, batch tiles, widened rows)
 * keeps it, so a row gives the same bits alone or in any batch.
 *
 * The includer defines INLINE and the lane vocabulary, shared with
 * gemm_eo.h: V_ATTR (target attribute), V_F / V_I (float / integer
 * vector), V_W (lanes), V_REGS (vector registers), V_ZERO, V_SET1I,
 * V_LOADU, V_LOADI, V_STOREU, V_CASTPS, V_SLLI, V_AND, V_FMA (the
 * intrinsics of that width), V_HSUM (horizontal sum in a fixed order),
 * V_LOAD_W(row, dt, k) (V_W weights of dtype dt from element k, as fp32);
 * and for this file: NAT_MAXC (widest tile), NAT_C1..NAT_C3 (weight rows
 * per tile for 1-3 input rows), NAT_C4 (for 4 input rows).
 *
 * It provides load_w1, TB and rows_dt (all T rows against f32, f16,
 * MXFP4 or FP8_B128 weight rows [n0, n1), inlined into the includer's
 * entry point; Q8_0 has kernels of its own, gemm_q8.c).  MXFP4 and
 * FP8_B128 rows are whole blocks (Din a multiple of 32 or 128, so no tail)
 * and V_LOAD_W gives the reference's dequantized values exactly (MXFP4:
 * twice the E2M1 value, an integer, times half the scale; FP8_B128: the
 * E4M3 value / 2^8 as an f16, times 2^8 times the scale), so the order and
 * the batch-independence above hold for them too. */

enum { TB = 64 }; /* input rows per cache block */

/* Weight k of a row of dtype dt, as fp32 (the tails past the last vector;
 * never reached over MXFP4 or FP8_B128, whose rows are whole blocks of 32
 * or 128). */
INLINE float load_w1(const char *row, const enum moe_dtype dt, int k)
{
    if (dt == MOE_DTYPE_F32) return ((const float *)row)[k];
    if (dt == MOE_DTYPE_MXFP4) return moe_mxfp4_get(row, (size_t)k);
    if (dt == MOE_DTYPE_FP8_B128) return moe_fp8_get(row, (size_t)k);
    uint16_t h = ((const uint16_t *)row)[k];
    return dt == MOE_DTYPE_BF16 ? moe_bf16_to_f32(h) : moe_f16_to_f32(h);
}

/* Byte offset of element k in a row of dtype dt (for prefetching). */
INLINE size_t w_offset(const enum moe_dtype dt, int k)
{
    if (dt == MOE_DTYPE_MXFP4)
        return (size_t)(k / MOE_MXFP4_BLOCK) * MOE_MXFP4_BYTES + 1 + k % 16;
    if (dt == MOE_DTYPE_FP8_B128)
        return (size_t)(k / MOE_FP8_BLOCK) * MOE_FP8_BYTES + 4 + k % MOE_FP8_BLOCK;
    return (size_t)k * (dt == MOE_DTYPE_F32 ? 4 : 2);
}

/* y[r*ldy + c] = x_r . w_c (+ bias) for r < R, c < C; w_c = w + c*wld. */
V_ATTR INLINE void tile(const int R, const int C, const enum moe_dtype dt, float *y, size_t ldy,
                        const float *x, size_t ldx, const char *w, size_t wld, int Din,
                        const struct moe_tensor *b, int n)
{
    V_F acc[4][NAT_MAXC];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = V_ZERO();
    int k = 0;
    for (; k + V_W <= Din; k += V_W) {
        V_F wv[NAT_MAXC];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            /* decode streams weights once from memory: keep loads in
             * flight a tile ahead, so a tile does not start by waiting on
             * memory */
            if (R < 4)
                _mm_prefetch(w + (size_t)c * wld + w_offset(dt, k) + (size_t)C * wld, _MM_HINT_T1);
            wv[c] = V_LOAD_W(w + (size_t)c * wld, dt, k);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float *xr = x + (size_t)r * ldx + k;
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) acc[r][c] = V_FMA(V_LOADU(xr), wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = V_HSUM(acc[r][c]);
            const char *wc = w + (size_t)c * wld;
            for (int kk = k; kk < Din; kk++) s += x[(size_t)r * ldx + kk] * load_w1(wc, dt, kk);
            y[(size_t)r * ldy + c] = s + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
        }
}

/* R <= 3 rows against weight rows [n0, n1); w points at row n0. */
V_ATTR INLINE void few_rows(const enum moe_dtype dt, float *y, size_t ldy, const float *x,
                            size_t ldx, int R, const char *w, size_t wld, int Din, int n0, int n1,
                            const struct moe_tensor *b)
{
    int n = n0;
    switch (R) {
    case 1:
        for (; n + NAT_C1 <= n1; n += NAT_C1)
            tile(1, NAT_C1, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++) tile(1, 1, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    case 2:
        for (; n + NAT_C2 <= n1; n += NAT_C2)
            tile(2, NAT_C2, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++) tile(2, 1, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    default:
        for (; n + NAT_C3 <= n1; n += NAT_C3)
            tile(3, NAT_C3, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        for (; n < n1; n++) tile(3, 1, dt, y + n, ldy, x, ldx, w + (n - n0) * wld, wld, Din, b, n);
        break;
    }
}

/* C weight rows of dtype dt to fp32 (exact), for reuse across a row block. */
V_ATTR INLINE void widen_rows(float *dst, const enum moe_dtype dt, const char *w, size_t wld,
                              int C, int Din)
{
    for (int c = 0; c < C; c++) {
        const char *src = w + (size_t)c * wld;
        float *d = dst + (size_t)c * Din;
        int k = 0;
        for (; k + V_W <= Din; k += V_W) V_STOREU(d + k, V_LOAD_W(src, dt, k));
        for (; k < Din; k++) d[k] = load_w1(src, dt, k);
    }
}

/* All T rows against weight rows [n0, n1).  Blocks of TB rows; in a block
 * of at least 8 rows the weights of each tile column group are widened to
 * fp32 once (into a stack buffer of WBUF floats) rather than once per tile. */
V_ATTR INLINE void rows_dt(const enum moe_dtype dt, float *y, size_t ldy, const float *x,
                           size_t ldx, int T, const void *wv, int Din, int n0, int n1,
                           const struct moe_tensor *b)
{
    enum { C = NAT_C4, WBUF = NAT_C4 * 4096 };
    const char *w = wv;
    const size_t wld = moe_dtype_row_bytes(dt, (size_t)Din), fld = (size_t)Din * 4;
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
