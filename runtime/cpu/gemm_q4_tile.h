/* gemm_q4_tile.h - the tiles of the four-bit kernels (gemm_q4.c explains
 * them), written once for the two instances gemm_q4.c includes this file
 * for: AVX2, and AVX2 with AVX512-VNNI's vpdpbusd on 256-bit vectors for
 * the AVX-512 kernel set.  vpdpbusd adds the four products of unsigned
 * and signed bytes of each 32-bit lane exactly, the same integer as
 * vpmaddubsw then vpmaddwd by ones (whose int16 pair sums never saturate
 * here), so both instances give the same bits.
 *
 * The includer defines INLINE, RUN, TBQ, MAXC, struct xq and
 * moe_q4_quantize_input, and: Q4_ATTR (the target attribute), Q4_FN(name) (the
 * instance's name for each function here), Q4_DOT(w, x) (the 8 int32 lane
 * sums of the products of unsigned bytes w and signed bytes x), Q4_ENTRY
 * (the name of the instance's entry point, which this file defines);
 * optionally Q4_TILE_WIDE(dt, C, y, x, w, wld, b, n, pfd) and PF_WIDE, a
 * tile of one input row and 8 weight rows giving the tile's bits, which
 * then takes the full tiles of a single input row, prefetching whole
 * tiles at least PF_WIDE bytes ahead. */

/* The head of the group at g as the vector h = (d, m, 0, ...) and the
 * scale d broadcast.  Q4_1: one 4-byte load widened by F16C (exact). */
Q4_ATTR INLINE void Q4_FN(group_head)(const char *g, const enum moe_dtype dt, __m256 *h, __m256 *d)
{
    if (dt == MOE_DTYPE_Q4_1) {
        int32_t v;
        memcpy(&v, g, 4);
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(v));
        *h = _mm256_zextps128_ps256(dm);
        *d = _mm256_broadcastss_ps(dm);
    } else {
        *h = _mm256_zextps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)g)));
        *d = _mm256_broadcast_ss((const float *)g);
    }
}

/* The 32 codes of the run at qs as unsigned bytes in element order: the 16
 * bytes in both halves, the upper half shifted right by 4, masked. */
Q4_ATTR INLINE __m256i Q4_FN(run_codes)(const char *qs)
{
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

/* acc + the integer dot of weight codes wq (scale wd broadcast) with run k
 * of an input row's group xg, times wd x dx_k: one run's term. */
Q4_ATTR INLINE __m256 Q4_FN(run_fma)(__m256 acc, __m256i wq, __m256 wd, const char *xg, int k)
{
    const __m256i xq = _mm256_load_si256((const __m256i *)(xg + 32 + 32 * k));
    const __m256i p = Q4_DOT(wq, xq);
    const __m256 dx = _mm256_broadcast_ss((const float *)xg + 2 + k);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(wd, dx), acc);
}

/* acc + the weights' head h = (d, m, 0, ...) times the input group's head
 * (0, S, dx_0, ...): m S in lane 1, 0 elsewhere (d is finite; a NaN dx
 * makes NaN, as the row's other terms do), the group's offset term. */
Q4_ATTR INLINE __m256 Q4_FN(head_fma)(__m256 acc, __m256 h, const char *xg)
{
    return _mm256_fmadd_ps(_mm256_load_ps((const float *)xg), h, acc);
}

/* y[r*ldy + c] = input row r0 + r . weight row c (+ bias n + c) for r < R,
 * c < C; w the first weight row (stride wld); pf: the first pass over these
 * weight rows, which prefetches the next tile's (C rows on, as gemm_q8.c
 * does).  Per group, each weight row's head is read once and each of its runs
 * unpacked once for the R input rows, so the live registers are the R*C
 * sums, one row's d, m and codes, and constants. */
Q4_ATTR INLINE void Q4_FN(tile)(const enum moe_dtype dt, const int R, const int C, float *y, size_t ldy,
                                const struct xq *x, int r0, const char *w, size_t wld, const struct moe_tensor *b,
                                int n, bool pf)
{
    const int NR = dt == MOE_DTYPE_Q4_G128 ? 4 : 1, HB = dt == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD;
    const size_t GB = (size_t)HB + 16 * (size_t)NR;
    const size_t XG = 32 + 32 * (size_t)NR; /* input bytes per group */
    const int ng = (int)(x->rs / XG);
    __m256 acc[4][MAXC];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    /* one prefetch per weight row and group of at most 64 bytes: every
     * cache line of the next tile's rows gets one (Q4_1: every third
     * group of 20 bytes, Q4_G32 every second of 24, Q4_G128 two a group
     * of 72) */
    const int pf_every = dt == MOE_DTYPE_Q4_1 ? 3 : dt == MOE_DTYPE_Q4_G32 ? 2 : 1;
    for (int g = 0, pg = 0; g < ng; g++, pg = pg + 1 == pf_every ? 0 : pg + 1) {
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const char *grp = w + (size_t)c * wld + (size_t)g * GB;
            __m256 h, wd;
            Q4_FN(group_head)(grp, dt, &h, &wd);
#pragma GCC unroll 4
            for (int k = 0; k < NR; k++) {
                if (pf && pg == 0 && (k == 0 || k == NR - 1))
                    _mm_prefetch(grp + (k ? GB - 1 : 0) + (size_t)C * wld, _MM_HINT_T1);
                const __m256i wq = Q4_FN(run_codes)(grp + HB + 16 * k);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++)
                    acc[r][c] =
                        Q4_FN(run_fma)(acc[r][c], wq, wd, x->p + (size_t)(r0 + r) * x->rs + (size_t)g * XG, k);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = Q4_FN(head_fma)(acc[r][c], h, x->p + (size_t)(r0 + r) * x->rs + (size_t)g * XG);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            y[(size_t)r * ldy + c] = moe_hsum8(acc[r][c]) + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
}

/* R rows (1..3) against weight rows [n0, n1), C at a time then one by one;
 * w points at row n0. */
Q4_ATTR INLINE void Q4_FN(row_tiles)(const enum moe_dtype dt, const int R, const int C, float *y, size_t ldy,
                                     const struct xq *x, const char *w, size_t wld, int n0, int n1,
                                     const struct moe_tensor *b)
{
    int n = n0;
    for (; n + C <= n1; n += C)
        Q4_FN(tile)(dt, R, C, y + n, ldy, x, 0, w + (size_t)(n - n0) * wld, wld, b, n, true);
    for (; n < n1; n++) Q4_FN(tile)(dt, R, 1, y + n, ldy, x, 0, w + (size_t)(n - n0) * wld, wld, b, n, true);
}

/* tn (1..TBQ) quantized rows against weight rows [n0, n1) of dtype dt. */
Q4_ATTR INLINE void Q4_FN(rows_dt)(const enum moe_dtype dt, float *y, size_t ldy, const struct xq *x, int tn,
                                   const char *w, size_t wld, int n0, int n1, const struct moe_tensor *b)
{
    enum { C4 = 2 }; /* weight rows of a 4-input tile: 8 accumulators */
    switch (tn) {
#ifdef Q4_TILE_WIDE
    case 1: {
        int n = n0;
        /* prefetch whole tiles at least PF_WIDE bytes ahead */
        const size_t tb = 8 * wld, pfd = (PF_WIDE + tb - 1) / tb * tb;
        for (; n + 8 <= n1; n += 8) Q4_TILE_WIDE(dt, 8, y + n, x, w + (size_t)(n - n0) * wld, wld, b, n, pfd);
        for (; n < n1; n++)
            Q4_FN(tile)(dt, 1, 1, y + n, ldy, x, 0, w + (size_t)(n - n0) * wld, wld, b, n, true);
        return;
    }
#else
    case 1: Q4_FN(row_tiles)(dt, 1, 8, y, ldy, x, w, wld, n0, n1, b); return;
#endif
    case 2: Q4_FN(row_tiles)(dt, 2, 4, y, ldy, x, w, wld, n0, n1, b); return;
    case 3: Q4_FN(row_tiles)(dt, 3, 3, y, ldy, x, w, wld, n0, n1, b); return;
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
            if (t < t4 && full)
                Q4_FN(tile)(dt, 4, C4, yt, ldy, x, t, wn, wld, b, n, t == 0);
            else if (t < t4)
                Q4_FN(tile)(dt, 4, 1, yt, ldy, x, t, wn, wld, b, n, t == 0);
            else if (full)
                Q4_FN(tile)(dt, 1, C4, yt, ldy, x, t, wn, wld, b, n, t == 0);
            else
                Q4_FN(tile)(dt, 1, 1, yt, ldy, x, t, wn, wld, b, n, t == 0);
        }
    }
}

Q4_ATTR void Q4_ENTRY(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *wv, enum moe_dtype wt,
                      int Din, int n0, int n1, const struct moe_tensor *b)
{
    MOE_ASSERT(moe_dtype_is_q4(wt) && wt != MOE_DTYPE_Q4_K && Din % moe_q4_group(wt) == 0);
    const int nr = moe_q4_head_runs(wt), ng = Din / RUN / nr;
    const size_t wld = moe_dtype_row_bytes(wt, (size_t)Din);
    const int rows = T < TBQ ? T : TBQ;
    /* a row's stream: per group 32 + 32 nr bytes, Din + 32 ng in all
     * (Din <= INT32_MAX: no overflow); 64-byte aligned */
    const size_t rs = (size_t)Din + 32 * (size_t)ng;
    char *buf = (char *)moe_gemm_thread_buffer((size_t)rows * rs / sizeof(float));
    MOE_ASSERT(buf && "gemm_fast: out of memory for the quantized input rows");
    const struct xq xr = {.p = buf, .rs = rs};
    const char *w = (const char *)wv + (size_t)n0 * wld;
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += TBQ) {
        const int tn = T - t0 < TBQ ? T - t0 : TBQ;
        for (int t = 0; t < tn; t++) moe_q4_quantize_input(buf + (size_t)t * rs, x + (size_t)(t0 + t) * ldx, ng, nr);
        float *yb = y + (size_t)t0 * ldy;
        switch (wt) {
        case MOE_DTYPE_Q4_1: Q4_FN(rows_dt)(MOE_DTYPE_Q4_1, yb, ldy, &xr, tn, w, wld, n0, n1, b); break;
        case MOE_DTYPE_Q4_G32: Q4_FN(rows_dt)(MOE_DTYPE_Q4_G32, yb, ldy, &xr, tn, w, wld, n0, n1, b); break;
        default: Q4_FN(rows_dt)(MOE_DTYPE_Q4_G128, yb, ldy, &xr, tn, w, wld, n0, n1, b); break;
        }
    }
}
