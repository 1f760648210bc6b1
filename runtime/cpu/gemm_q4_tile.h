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
 * tiles at least PF_WIDE bytes ahead; Q4_PANEL(dt, y, ldy, x, ldx, T,
 * w, wld, ng, nr, n0, n1, b), which takes a call of Q4P_MIN or more input
 * rows instead of the tiles (gemm_q4_panel.h); and Q4_WIDE512 (AVX-512
 * instances), with which tiles of 2-4 input rows take 512-bit registers
 * (tile512). */

/* The head of the group at g: its scale d and offset m (Q4_1: f16 pair
 * widened by F16C, exact; else two floats). */
Q4_ATTR INLINE void Q4_FN(group_head)(const char *g, const enum moe_dtype dt, float *d, float *m)
{
    if (dt == MOE_DTYPE_Q4_1) {
        int32_t v;
        memcpy(&v, g, 4);
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(v));
        *d = _mm_cvtss_f32(dm);
        *m = _mm_cvtss_f32(_mm_movehdup_ps(dm));
    } else {
        memcpy(d, g, 4);
        memcpy(m, g + 4, 4);
    }
}

/* The 32 codes of the run at qs as unsigned bytes in element order: the 16
 * bytes in both halves, the upper half shifted right by 4, masked. */
Q4_ATTR INLINE __m256i Q4_FN(run_codes)(const char *qs)
{
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

/* The tile's lane vectors (lane o = r C + c, below) of its input rows'
 * group heads (0, S, dx_0 .. dx_3, 0, 0) at byte g of their streams: *S
 * lane o row o / C's S, dx[k] its dx_k (k < NR), moved, not computed;
 * false where (R, C) is not one of the shapes done here. */
Q4_ATTR INLINE bool Q4_FN(input_heads)(const struct xq *x, int r0, size_t g, const int R, const int C, const int NR,
                                       __m256 *S, __m256 dx[4])
{
    const float *h = (const float *)(x->p + (size_t)r0 * x->rs + g);
    if (R == 1) {
        *S = _mm256_broadcast_ss(h + 1);
        for (int k = 0; k < NR; k++) dx[k] = _mm256_broadcast_ss(h + 2 + k);
        return true;
    }
    const size_t rs = x->rs / sizeof(float);
    if (R == 2 && C == 4) { /* lanes 0-3 row 0, 4-7 row 1 */
        const __m256 h0 = _mm256_load_ps(h), h1 = _mm256_load_ps(h + rs);
        const __m256 lo = _mm256_permute2f128_ps(h0, h1, 0x20), hi = _mm256_permute2f128_ps(h0, h1, 0x31);
        *S = _mm256_permute_ps(lo, 0x55);
        dx[0] = _mm256_permute_ps(lo, 0xaa);
        if (NR == 4) {
            dx[1] = _mm256_permute_ps(lo, 0xff);
            dx[2] = _mm256_permute_ps(hi, 0x00);
            dx[3] = _mm256_permute_ps(hi, 0x55);
        }
        return true;
    }
    if ((R == 3 || R == 4) && C == 2) { /* lanes 2r, 2r + 1 row r (R 3: lanes 6, 7 unused) */
        const __m256 h0 = _mm256_load_ps(h), h1 = _mm256_load_ps(h + rs), h2 = _mm256_load_ps(h + 2 * rs);
        const __m256 h3 = R == 4 ? _mm256_load_ps(h + 3 * rs) : h0;
        const __m256 a = _mm256_permute2f128_ps(h0, h2, 0x20), b = _mm256_permute2f128_ps(h1, h3, 0x20);
        *S = _mm256_shuffle_ps(a, b, 0x55);
        dx[0] = _mm256_shuffle_ps(a, b, 0xaa);
        if (NR == 4) {
            const __m256 a2 = _mm256_permute2f128_ps(h0, h2, 0x31), b2 = _mm256_permute2f128_ps(h1, h3, 0x31);
            dx[1] = _mm256_shuffle_ps(a, b, 0xff);
            dx[2] = _mm256_shuffle_ps(a2, b2, 0x00);
            dx[3] = _mm256_shuffle_ps(a2, b2, 0x55);
        }
        return true;
    }
    return false;
}

/* Two weight rows' group heads (at a and b) as (d_a, m_a, d_b, m_b):
 * Q4_1's f16 pairs widened by F16C (exact), else the floats. */
Q4_ATTR INLINE __m128 Q4_FN(head_pair)(const enum moe_dtype dt, const char *a, const char *b)
{
    if (dt == MOE_DTYPE_Q4_1) {
        int32_t u, v;
        memcpy(&u, a, 4);
        memcpy(&v, b, 4);
        return _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128(u), _mm_cvtsi32_si128(v)));
    }
    return _mm_loadh_pi(_mm_castpd_ps(_mm_load_sd((const double *)a)), (const __m64 *)b);
}

/* The tile's lane vectors of its C (2, 4 or 8) weight rows' scales d
 * (*dv) and offsets m (*mv) of the group at byte g: lane o weight row
 * o % C's; false for other C. */
Q4_ATTR INLINE bool Q4_FN(weight_heads)(const enum moe_dtype dt, const char *w, size_t wld, size_t g, const int C,
                                        __m256 *dv, __m256 *mv)
{
    if (C != 2 && C != 4 && C != 8) return false;
    __m128 d[2], m[2];
    for (int i = 0; i < (C == 8 ? 2 : 1); i++) {
        const char *r = w + (size_t)(4 * i) * wld + g;
        const __m128 lo = Q4_FN(head_pair)(dt, r, r + wld);
        const __m128 hi = C >= 4 ? Q4_FN(head_pair)(dt, r + 2 * wld, r + 3 * wld) : lo;
        d[i] = _mm_shuffle_ps(lo, hi, 0x88); /* C 2: (x0 x1 x0 x1) */
        m[i] = _mm_shuffle_ps(lo, hi, 0xdd);
    }
    if (C < 8) d[1] = d[0], m[1] = m[0];
    *dv = _mm256_set_m128(d[1], d[0]);
    *mv = _mm256_set_m128(m[1], m[0]);
    return true;
}

#ifdef Q4_WIDE512
/* The tile below for R x C = 2 x 4, 3 x 2 or 4 x 2 in 512-bit registers: an
 * output pair (2i, 2i + 1), one input row against two weight rows, in
 * the halves of one register (weight rows c, c + 1 unpacked side by
 * side, the input's run broadcast to both), one vpdpbusd a pair; the
 * pairs' lanes added by moe_sum_halves.  The same exact integer a run
 * and output, so the tile's bits. */
Q4_ATTR INLINE void Q4_FN(tile512)(const enum moe_dtype dt, const int R, const int C, float *y, size_t ldy,
                                   const struct xq *x, int r0, const char *w, size_t wld, const struct moe_tensor *b,
                                   int n, bool pf)
{
    const int NR = dt == MOE_DTYPE_Q4_G128 ? 4 : 1, HB = dt == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD, CP = C / 2;
    const size_t GB = (size_t)HB + 16 * (size_t)NR, XG = 32 + 32 * (size_t)NR;
    const int ng = (int)(x->rs / XG);
    const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4), low = _mm512_set1_epi8(15);
    const int pf_every = dt == MOE_DTYPE_Q4_1 ? 3 : dt == MOE_DTYPE_Q4_G32 ? 2 : 1;
    __m256 acc = _mm256_setzero_ps();
    for (int g = 0, pg = 0; g < ng; g++, pg = pg + 1 == pf_every ? 0 : pg + 1) {
        __m256 Sv, dxv[4], dv, mv;
        Q4_FN(input_heads)(x, r0, (size_t)g * XG, R, C, NR, &Sv, dxv);
        const bool heads = Q4_FN(weight_heads)(dt, w, wld, (size_t)g * GB, C, &dv, &mv);
        MOE_ASSERT(heads); /* C is 2 or 4 here */
#pragma GCC unroll 4
        for (int k = 0; k < NR; k++) {
            __m512i wq[2], p[4];
#pragma GCC unroll 2
            for (int c = 0; c < CP; c++) {
                const char *g0 = w + (size_t)(2 * c) * wld + (size_t)g * GB, *g1 = g0 + wld;
                if (pf && pg == 0 && (k == 0 || k == NR - 1)) {
                    _mm_prefetch(g0 + (k ? GB - 1 : 0) + (size_t)C * wld, _MM_HINT_T1);
                    _mm_prefetch(g1 + (k ? GB - 1 : 0) + (size_t)C * wld, _MM_HINT_T1);
                }
                const __m256i c0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(g0 + HB + 16 * k)));
                const __m256i c1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(g1 + HB + 16 * k)));
                wq[c] = _mm512_and_si512(
                    _mm512_srlv_epi64(_mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1), shift), low);
            }
            p[3] = _mm512_setzero_si512(); /* R 3: no fourth pair */
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512i xq = _mm512_broadcast_i64x4(
                    _mm256_load_si256((const __m256i *)(x->p + (size_t)(r0 + r) * x->rs + (size_t)g * XG + 32 + 32 * k)));
#pragma GCC unroll 2
                for (int c = 0; c < CP; c++) p[r * CP + c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[c], xq);
            }
            const __m256i s = _mm512_castsi512_si256(moe_sum_halves(p, 4));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dxv[k], dv), acc);
        }
        acc = _mm256_fmadd_ps(Sv, mv, acc);
    }
    moe_tile_out(y, ldy, R, C, _mm_setzero_ps(), acc, b, n);
}
#endif

/* y[r*ldy + c] = input row r0 + r . weight row c (+ bias n + c) for r < R,
 * c < C (R C <= 8); w the first weight row (stride wld); pf: the first
 * pass over these weight rows, which prefetches the next tile's (C rows
 * on, as gemm_q8.c does).  Output (r, c) in lane r C + c: per run, each
 * weight row's codes unpacked once for the R input rows, the pairs' 8
 * integer lanes (Q4_DOT) added into one register (moe_sum8x8), converted
 * and one FMA by d_c dx_r; per group one FMA by m_c S_r. */
Q4_ATTR INLINE void Q4_FN(tile)(const enum moe_dtype dt, const int R, const int C, float *y, size_t ldy,
                                const struct xq *x, int r0, const char *w, size_t wld, const struct moe_tensor *b,
                                int n, bool pf)
{
#ifdef Q4_WIDE512
    if ((R == 2 && C == 4) || ((R == 3 || R == 4) && C == 2)) {
        Q4_FN(tile512)(dt, R, C, y, ldy, x, r0, w, wld, b, n, pf);
        return;
    }
#endif
    const int NR = dt == MOE_DTYPE_Q4_G128 ? 4 : 1, HB = dt == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD, O = R * C;
    const size_t GB = (size_t)HB + 16 * (size_t)NR;
    const size_t XG = 32 + 32 * (size_t)NR; /* input bytes per group */
    const int ng = (int)(x->rs / XG);
    __m256 acc = _mm256_setzero_ps();
    /* one prefetch per weight row and group of at most 64 bytes: every
     * cache line of the next tile's rows gets one (Q4_1: every third
     * group of 20 bytes, Q4_G32 every second of 24, Q4_G128 two a group
     * of 72) */
    const int pf_every = dt == MOE_DTYPE_Q4_1 ? 3 : dt == MOE_DTYPE_Q4_G32 ? 2 : 1;
    /* lane o = r C + c: input row r = o / C, weight row c = o % C */
#define RL(o) ((o) < O ? (o) / C : 0)
#define CL(o) ((o) < O ? (o) % C : 0)
    const __m256i ir = _mm256_setr_epi32(RL(0), RL(1), RL(2), RL(3), RL(4), RL(5), RL(6), RL(7));
    const __m256i ic = _mm256_setr_epi32(CL(0), CL(1), CL(2), CL(3), CL(4), CL(5), CL(6), CL(7));
#undef RL
#undef CL
    for (int g = 0, pg = 0; g < ng; g++, pg = pg + 1 == pf_every ? 0 : pg + 1) {
        /* the input rows' S and dx_k, the weight rows' d and m, each in
         * the lanes of its outputs */
        __m256 Sv, dxv[4], dv, mv;
        if (!Q4_FN(input_heads)(x, r0, (size_t)g * XG, R, C, NR, &Sv, dxv)) {
            /* hv[j] lane r: row r's value j, then spread by ir */
            __m256 hv[6];
            float h[4][8] = {{0}};
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                _mm256_storeu_ps(h[r], _mm256_load_ps((const float *)(x->p + (size_t)(r0 + r) * x->rs + (size_t)g * XG)));
#pragma GCC unroll 6
            for (int j = 1; j < 2 + NR; j++) hv[j] = _mm256_setr_ps(h[0][j], h[1][j], h[2][j], h[3][j], 0, 0, 0, 0);
            Sv = _mm256_permutevar8x32_ps(hv[1], ir);
#pragma GCC unroll 4
            for (int k = 0; k < NR; k++) dxv[k] = _mm256_permutevar8x32_ps(hv[2 + k], ir);
        }
        if (!Q4_FN(weight_heads)(dt, w, wld, (size_t)g * GB, C, &dv, &mv)) {
            float dc[8] = {0}, mc[8] = {0};
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) Q4_FN(group_head)(w + (size_t)c * wld + (size_t)g * GB, dt, &dc[c], &mc[c]);
            dv = _mm256_permutevar8x32_ps(_mm256_setr_ps(dc[0], dc[1], dc[2], dc[3], dc[4], dc[5], dc[6], dc[7]), ic);
            mv = _mm256_permutevar8x32_ps(_mm256_setr_ps(mc[0], mc[1], mc[2], mc[3], mc[4], mc[5], mc[6], mc[7]), ic);
        }
#pragma GCC unroll 4
        for (int k = 0; k < NR; k++) {
            __m256i v[8];
#pragma GCC unroll 8
            for (int i = O; i < 8; i++) v[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const char *grp = w + (size_t)c * wld + (size_t)g * GB;
                if (pf && pg == 0 && (k == 0 || k == NR - 1))
                    _mm_prefetch(grp + (k ? GB - 1 : 0) + (size_t)C * wld, _MM_HINT_T1);
                const __m256i wq = Q4_FN(run_codes)(grp + HB + 16 * k);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const char *xg = x->p + (size_t)(r0 + r) * x->rs + (size_t)g * XG;
                    v[r * C + c] = Q4_DOT(wq, _mm256_load_si256((const __m256i *)(xg + 32 + 32 * k)));
                }
            }
            const __m256 sc = _mm256_mul_ps(dxv[k], dv);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(moe_sum8x8(v)), sc, acc);
        }
        acc = _mm256_fmadd_ps(Sv, mv, acc);
    }
    float o[8];
    _mm256_storeu_ps(o, acc);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)r * ldy + c] = o[r * C + c] + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
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
    enum { C4 = 2 }; /* weight rows of a 4-input tile: 8 outputs */
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
    case 3: Q4_FN(row_tiles)(dt, 3, 2, y, ldy, x, w, wld, n0, n1, b); return;
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
#ifdef Q4_PANEL
    if (T >= Q4P_MIN) {
        Q4_PANEL(wt, y, ldy, x, ldx, T, w, wld, ng, nr, n0, n1, b);
        return;
    }
#endif
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
