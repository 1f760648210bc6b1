/* gemm_q4_panel.h - the prefill panels of the four-bit products (Q4_1,
 * Q4_G32, Q4_G128) at AVX-512 VNNI width (gemm_q4.c), as gemm_q8_panel.h's
 * are for Q8_0: a call of Q4P_MIN or more input rows takes them instead of
 * the tiles.
 *
 * A band of Q4P_W weight rows is unpacked once per call (a byte a code in
 * element order, each group's d and m beside), the input rows' codes laid
 * out 16 rows to a 64-byte line (4 consecutive codes of each row), and
 * one vpdpbusd takes those against 4 codes of a weight row (broadcast):
 * a run's 8 lines give its exact integer sum P for each of the 16 rows,
 * then acc = fma(float(P), d dx, acc); after a group's runs acc = fma(S,
 * m, acc): the tiles' expression (gemm_q4.c), each lane an output.
 *
 * The includer defines Q4_ATTR, INLINE, RUN and struct xq and declares
 * moe_q4_quantize_input first. */
#pragma once

enum {
    Q4P_MIN = 14,        /* input rows from which a call takes the panels */
    Q4P_W = 8,           /* weight rows of a band */
    Q4P_BYTES = 1 << 19, /* the interleaved input rows of a chunk, at most */
};

/* One run (32 codes) of 16 input rows: codes 4l..4l+3 of each row in line
 * l, the rows' scales dx. */
struct q4p_in {
    int8_t q[8][64];
    float dx[16];
};

/* Input rows x (tn of them, 1..16 G) into G groups: group i's runs at
 * in[i * nrun ...], its groups' offset sums S at s[(i * ng + g) * 16 ...];
 * rows past tn zero; tmp holds one row's stream (struct xq). */
Q4_ATTR static void q4p_inputs(struct q4p_in *in, float *s, char *tmp, const float *x, size_t ldx, int tn, int ng,
                               int nr)
{
    const int G = (tn + 15) / 16, nrun = ng * nr;
    const size_t XG = 32 + 32 * (size_t)nr;
    if (tn % 16) {
        memset(in + (size_t)(G - 1) * nrun, 0, (size_t)nrun * sizeof *in);
        memset(s + (size_t)(G - 1) * ng * 16, 0, (size_t)ng * 16 * sizeof *s);
    }
    for (int r = 0; r < tn; r++) {
        moe_q4_quantize_input(tmp, x + (size_t)r * ldx, ng, nr);
        const int i = r % 16;
        struct q4p_in *p = in + (size_t)(r / 16) * nrun;
        float *sg = s + (size_t)(r / 16) * ng * 16;
        for (int g = 0; g < ng; g++) {
            const char *xg = tmp + (size_t)g * XG;
            sg[(size_t)g * 16 + i] = ((const float *)xg)[1];
            for (int k = 0; k < nr; k++, p++) {
                for (int l = 0; l < 8; l++) memcpy(&p->q[l][4 * i], xg + 32 + 32 * k + 4 * l, 4);
                p->dx[i] = ((const float *)xg)[2 + k];
            }
        }
    }
}

/* Weight rows [n, n + wn) (w at row n, stride wld) of dtype dt unpacked:
 * row t's codes at wq[t * wqs ...], group g's d and m at dm[2 (g Q4P_W +
 * t) ...]; rows past wn zero. */
Q4_ATTR static void q4p_weights(uint8_t *wq, size_t wqs, float *dm, const enum moe_dtype dt, const char *w,
                                size_t wld, int wn, int ng)
{
    const int NR = dt == MOE_DTYPE_Q4_G128 ? 4 : 1, HB = dt == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD;
    const size_t GB = (size_t)HB + 16 * (size_t)NR;
    for (int t = 0; t < Q4P_W; t++)
        for (int g = 0; g < ng; g++) {
            uint8_t *q = wq + (size_t)t * wqs + (size_t)g * NR * RUN;
            float *h = dm + 2 * ((size_t)g * Q4P_W + (size_t)t);
            if (t >= wn) {
                memset(q, 0, (size_t)NR * RUN);
                h[0] = h[1] = 0.0f;
                continue;
            }
            const char *grp = w + (size_t)t * wld + (size_t)g * GB;
            group_head_avx2(grp, dt, &h[0], &h[1]);
            for (int k = 0; k < NR; k++)
                _mm256_storeu_si256((__m256i *)(q + RUN * k), run_codes_avx2(grp + HB + 16 * k));
        }
}

/* A band against 16 input rows (runs in, offset sums s): y[r * ldy + t]
 * for r < rows, t < wn (+ bias n + t). */
Q4_ATTR static void q4p_band(float *y, size_t ldy, int rows, const struct q4p_in *in, const float *s, int ng, int nr,
                             const uint8_t *wq, size_t wqs, const float *dm, int wn, const struct moe_tensor *b, int n)
{
    __m512 acc[Q4P_W];
#pragma GCC unroll 8
    for (int t = 0; t < Q4P_W; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        const float *h = dm + 2 * (size_t)g * Q4P_W;
        for (int k = 0; k < nr; k++) {
            const struct q4p_in *p = in + (size_t)g * nr + k;
            const uint8_t *q = wq + ((size_t)g * nr + k) * RUN;
            __m512i a[Q4P_W];
#pragma GCC unroll 8
            for (int t = 0; t < Q4P_W; t++) a[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++) {
                const __m512i cx = _mm512_load_si512(p->q[l]);
#pragma GCC unroll 8
                for (int t = 0; t < Q4P_W; t++) {
                    int32_t c4;
                    memcpy(&c4, q + (size_t)t * wqs + 4 * l, 4);
                    a[t] = _mm512_dpbusd_epi32(a[t], _mm512_set1_epi32(c4), cx);
                }
            }
            const __m512 dx = _mm512_load_ps(p->dx);
#pragma GCC unroll 8
            for (int t = 0; t < Q4P_W; t++)
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[t]), _mm512_mul_ps(dx, _mm512_set1_ps(h[2 * t])), acc[t]);
        }
        const __m512 sv = _mm512_load_ps(s + (size_t)g * 16);
#pragma GCC unroll 8
        for (int t = 0; t < Q4P_W; t++) acc[t] = _mm512_fmadd_ps(sv, _mm512_set1_ps(h[2 * t + 1]), acc[t]);
    }
    moe_panel_out(y, ldy, rows, acc, wn, b, n);
}

/* y[t * ldy + n] for t < T, n0 <= n < n1 (+ bias): x (T rows, stride ldx)
 * against four-bit weight rows w of dtype dt (row n0 at w, stride wld) of
 * ng groups of nr runs, in chunks of up to Q4P_BYTES of interleaved input
 * rows. */
Q4_ATTR static void q4p_rows(const enum moe_dtype dt, float *y, size_t ldy, const float *x, size_t ldx, int T,
                             const char *w, size_t wld, int ng, int nr, int n0, int n1, const struct moe_tensor *b)
{
    const size_t nrun = (size_t)ng * nr, slab = nrun * sizeof(struct q4p_in) + (size_t)ng * 16 * sizeof(float);
    const size_t wqs = nrun * RUN, rs = nrun * RUN + 32 * (size_t)ng;
    const int G = moe_panel_groups(T, slab, Q4P_BYTES);
    const size_t dmb = ((size_t)ng * Q4P_W * 2 * sizeof(float) + 63) / 64 * 64;
    size_t bytes = 0;
    const bool sized = moe_mul_size((size_t)G, slab, &bytes) && moe_add_size(bytes, Q4P_W * wqs, &bytes) &&
                       moe_add_size(bytes, dmb, &bytes) && moe_add_size(bytes, rs, &bytes);
    MOE_ASSERT(sized && "gemm_fast: the panels' buffer size overflows");
    char *buf = (char *)moe_gemm_thread_buffer(bytes / sizeof(float) + 1);
    MOE_ASSERT(buf && "gemm_fast: out of memory for the panels");
    struct q4p_in *in = (struct q4p_in *)buf;
    float *s = (float *)(in + (size_t)G * nrun);
    uint8_t *wq = (uint8_t *)(s + (size_t)G * ng * 16);
    float *dm = (float *)(wq + Q4P_W * wqs);
    char *tmp = (char *)dm + dmb;
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += 16 * G) {
        const int tn = T - t0 < 16 * G ? T - t0 : 16 * G;
        q4p_inputs(in, s, tmp, x + (size_t)t0 * ldx, ldx, tn, ng, nr);
        for (int n = n0; n < n1; n += Q4P_W) {
            const int wn = n1 - n < Q4P_W ? n1 - n : Q4P_W;
            q4p_weights(wq, wqs, dm, dt, w + (size_t)(n - n0) * wld, wld, wn, ng);
            moe_panel_prefetch(w, wld, n0, n + Q4P_W, n1, Q4P_W);
            for (int g = 0; g * 16 < tn; g++)
                q4p_band(y + (size_t)(t0 + 16 * g) * ldy + n, ldy, tn - 16 * g < 16 ? tn - 16 * g : 16,
                         in + (size_t)g * nrun, s + (size_t)g * ng * 16, ng, nr, wq, wqs, dm, wn, b, n);
        }
    }
}
