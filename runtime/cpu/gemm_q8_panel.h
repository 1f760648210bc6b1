/* gemm_q8_panel.h - the prefill panels of the Q8_0 product at AVX-512 VNNI
 * width (gemm_q8_vnni.c), as gemm_k_panel.h's are for the K-quants: a call
 * of Q8P_MIN or more input rows takes them instead of the tiles.
 *
 * A band of Q8P_W weight rows is copied once per call (codes as they are,
 * each block's scale dw and its correction -128 times the sum of its
 * codes beside), the input rows' codes (+ 128, unsigned) are laid out 16
 * rows to a 64-byte line, 4 consecutive codes of each row, and one
 * vpdpbusd takes those against 4 codes of a weight row broadcast from
 * memory: 64 products an instruction.  A block's 8 lines give each of the
 * 16 rows its block's exact integer sum S, then acc = fma(float(S), dw x
 * dx, acc): gemm_q8.c's numerics, each lane an output.
 *
 * The includer defines VNNI and INLINE and includes gemm_fast_impl.h and
 * simd_avx2.h first. */
#pragma once

enum {
    /* input rows from which a call takes the panels: the tiles faster at
     * 10, level at 12, the panels 1.1-1.4x at 16 (bench_gemm_q6_k, Zen 5) */
    Q8P_MIN = 14,
    Q8P_W = 8,              /* weight rows of a band */
    Q8P_BYTES = 1 << 19,    /* the interleaved input rows of a chunk, at most */
};

/* One block of 32 of 16 input rows: codes 4g..4g+3 (+ 128) of each row in
 * line g, the rows' scales dx. */
struct q8p_in {
    uint8_t u[8][64];
    float dx[16];
};

/* Input rows x (tn of them, 1..16 G) into G groups of nb slabs at in,
 * rows past tn zero; q and d hold one row's codes and scales. */
VNNI static void q8p_inputs(struct q8p_in *in, int8_t *q, float *d, const float *x, size_t ldx, int tn, int nb)
{
    const int G = (tn + 15) / 16;
    if (tn % 16) /* rows past tn: codes 128 (zero + 128), scale 0 */
        for (int k = 0; k < nb; k++) {
            struct q8p_in *s = in + (size_t)(G - 1) * nb + k;
            memset(s->u, 0x80, sizeof s->u);
            memset(s->dx, 0, sizeof s->dx);
        }
    for (int r = 0; r < tn; r++) {
        moe_quantize_x_q8(q, d, x + (size_t)r * ldx, nb);
        struct q8p_in *s = in + (size_t)(r / 16) * nb;
        const int i = r % 16;
        for (int k = 0; k < nb; k++, s++) {
            for (int g = 0; g < 8; g++) {
                uint32_t c;
                memcpy(&c, q + 32 * (size_t)k + 4 * g, 4);
                c ^= 0x80808080u;
                memcpy(&s->u[g][4 * i], &c, 4);
            }
            s->dx[i] = d[k];
        }
    }
}

/* A band's weight rows [n, n + wn) (w at row n, stride wld): row t's
 * codes of block k at wq[t * wqs + 32 k], its scale and correction at
 * dw[k * Q8P_W + t], cr[...]; rows past wn zero. */
VNNI static void q8p_weights(int8_t *wq, size_t wqs, float *dw, int32_t *cr, const char *w, size_t wld, int wn, int nb)
{
    const __m256i ones = _mm256_set1_epi8(1);
    for (int t = 0; t < Q8P_W; t++)
        for (int k = 0; k < nb; k++) {
            int8_t *q = wq + (size_t)t * wqs + (size_t)k * MOE_Q8_0_BLOCK;
            const size_t i = (size_t)k * Q8P_W + (size_t)t;
            if (t >= wn) {
                memset(q, 0, MOE_Q8_0_BLOCK);
                dw[i] = 0.0f;
                cr[i] = 0;
                continue;
            }
            const char *blk = w + (size_t)t * wld + (size_t)k * MOE_Q8_0_BYTES;
            const __m256i c = _mm256_loadu_si256((const __m256i *)(blk + 4));
            _mm256_storeu_si256((__m256i *)q, c);
            memcpy(&dw[i], blk, 4);
            /* the sum of the codes: vpmaddubsw by ones (unsigned ones
             * times signed codes), then pairs and lanes */
            const __m256i s16 = _mm256_maddubs_epi16(ones, c);
            __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
            cr[i] = -128 * _mm_cvtsi128_si32(h);
        }
}

/* A band against 16 input rows (group in, nb slabs): y[r * ldy + t] for r
 * < rows, t < wn (+ bias n + t). */
VNNI static void q8p_band(float *y, size_t ldy, int rows, const struct q8p_in *in, int nb, const int8_t *wq,
                          size_t wqs, const float *dw, const int32_t *cr, int wn, const struct moe_tensor *b, int n)
{
    __m512 acc[Q8P_W];
#pragma GCC unroll 8
    for (int t = 0; t < Q8P_W; t++) acc[t] = _mm512_setzero_ps();
    for (int k = 0; k < nb; k++) {
        const struct q8p_in *s = in + k;
        const int8_t *q = wq + (size_t)k * MOE_Q8_0_BLOCK;
        __m512i a[Q8P_W];
#pragma GCC unroll 8
        for (int t = 0; t < Q8P_W; t++) a[t] = _mm512_set1_epi32(cr[(size_t)k * Q8P_W + t]);
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m512i cx = _mm512_load_si512(s->u[g]);
#pragma GCC unroll 8
            for (int t = 0; t < Q8P_W; t++) {
                int32_t c4;
                memcpy(&c4, q + (size_t)t * wqs + 4 * g, 4);
                a[t] = _mm512_dpbusd_epi32(a[t], cx, _mm512_set1_epi32(c4));
            }
        }
        const __m512 dx = _mm512_load_ps(s->dx);
#pragma GCC unroll 8
        for (int t = 0; t < Q8P_W; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[t]), _mm512_mul_ps(_mm512_set1_ps(dw[(size_t)k * Q8P_W + t]), dx),
                                     acc[t]);
    }
    moe_panel_out(y, ldy, rows, acc, wn, b, n);
}

/* y[t * ldy + n] for t < T, n0 <= n < n1 (+ bias): x (T rows, stride ldx)
 * against Q8_0 weight rows w (row n0 at w, stride wld) of nb blocks, in
 * chunks of up to Q8P_BYTES of interleaved input rows. */
VNNI static void q8p_rows(float *y, size_t ldy, const float *x, size_t ldx, int T, const char *w, size_t wld, int nb,
                          int n0, int n1, const struct moe_tensor *b)
{
    const size_t slab = (size_t)nb * sizeof(struct q8p_in), wqs = (size_t)nb * MOE_Q8_0_BLOCK;
    const int G = moe_panel_groups(T, slab, Q8P_BYTES);
    const size_t meta = ((size_t)nb * Q8P_W * 8 + 63) / 64 * 64, row = ((size_t)nb * (MOE_Q8_0_BLOCK + 4) + 63) / 64 * 64;
    size_t bytes = 0;
    const bool sized = moe_mul_size((size_t)G, slab, &bytes) && moe_add_size(bytes, Q8P_W * wqs, &bytes) &&
                       moe_add_size(bytes, meta, &bytes) && moe_add_size(bytes, row, &bytes);
    MOE_ASSERT(sized && "gemm_fast: the panels' buffer size overflows");
    char *buf = (char *)moe_gemm_thread_buffer(bytes / sizeof(float) + 1);
    MOE_ASSERT(buf && "gemm_fast: out of memory for the panels");
    struct q8p_in *in = (struct q8p_in *)buf;
    int8_t *wq = (int8_t *)(buf + (size_t)G * slab);
    float *dw = (float *)((char *)wq + Q8P_W * wqs);
    int32_t *cr = (int32_t *)(dw + (size_t)nb * Q8P_W);
    int8_t *q = (int8_t *)((char *)dw + meta);
    float *d = (float *)(q + (size_t)nb * MOE_Q8_0_BLOCK);
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += 16 * G) {
        const int tn = T - t0 < 16 * G ? T - t0 : 16 * G;
        q8p_inputs(in, q, d, x + (size_t)t0 * ldx, ldx, tn, nb);
        for (int n = n0; n < n1; n += Q8P_W) {
            const int wn = n1 - n < Q8P_W ? n1 - n : Q8P_W;
            q8p_weights(wq, wqs, dw, cr, w + (size_t)(n - n0) * wld, wld, wn, nb);
            moe_panel_prefetch(w, wld, n0, n + Q8P_W, n1, Q8P_W);
            for (int g = 0; g * 16 < tn; g++)
                q8p_band(y + (size_t)(t0 + 16 * g) * ldy + n, ldy, tn - 16 * g < 16 ? tn - 16 * g : 16,
                         in + (size_t)g * nb, nb, wq, wqs, dw, cr, wn, b, n);
        }
    }
}
