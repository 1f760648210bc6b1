/* gemm_k_panel.h - the prefill panels of the Q4_K, Q5_K and Q6_K products
 * at AVX-512 VNNI width (gemm_q4_k_avx512.c, gemm_q5_k_avx512.c,
 * gemm_q6_k_avx512.c), one body for the three: a call of PANEL_MIN or
 * more input rows takes them instead of the tiles.
 *
 * The tiles unpack each block's codes once for every 4 input rows and end
 * every block of every (input row, weight row) pair with horizontal sums.
 * Here the weights are unpacked once per call for all its input rows, PW
 * weight rows at a time (a band): one byte a code (0..15, 0..31 or 0..63),
 * natural order, each block's scales widened.  The input rows' codes are
 * laid out 16 rows to a 64-byte line, 4 consecutive codes of each row, so
 * that one vpdpbusd takes 4 codes of a weight row (broadcast) against the
 * same 4 codes of 16 input rows: 64 products an instruction, nothing
 * unpacked or shuffled in the inner loop; a sub-block's scale is one
 * vpmulld, and the term of the input's code sums (Q4_K's and Q5_K's
 * minimums, Q6_K's offset of 32) one vpdpwssd for two sums of 16.  The
 * integers are the tiles' (exact, in any order) and each lane's float
 * steps are the tiles' block end (gemm_q4_k.h's q4k_block_end,
 * gemm_q6_k.h's q6k_block_end), so every output has the tiles' bits.
 *
 * The includer defines AVX512 and INLINE and includes gemm_q8_k.h and
 * gemm_fast_impl.h first. */
#pragma once

enum {
    /* input rows from which a call takes the panels: at 8 the tiles are
     * level (Q4_K, Q5_K) or faster (Q6_K), at 12 the panels 1.0-1.6x
     * (bench_gemm_q6_k at 8, 12 and 16 rows, Zen 5) */
    PANEL_MIN = 10,
    PW = 8,                /* weight rows of a band */
    PANEL_BYTES = 1 << 19, /* the interleaved input rows of a chunk, at most */
};

enum kp_format { KP_Q4_K, KP_Q5_K, KP_Q6_K };

/* One block of 16 input rows (a slab): codes 4g..4g+3 of each row in line
 * g, each row's code sums of 16 (the Q8_K stream's) 2p and 2p + 1 in
 * bs[p] (an int16 pair a row), the rows' scales dy. */
struct kp_in {
    int8_t q[64][64];
    int16_t bs[8][16][2];
    float dy[16];
};

/* A weight row's block, widened: the sub-blocks' scales (8 of 32 or 16
 * of 16), the int16 pairs that multiply the input's sums of 16 2p and 2p +
 * 1 (Q4_K, Q5_K: group p's minimum twice; Q6_K: the scales of sub-blocks
 * 2p and 2p + 1), d and dmin. */
struct kp_w {
    int32_t sc[16];
    int32_t mp[8];
    float d, dmin; /* adjacent: stored as a pair */
};

/* Input rows x (tn of them, 1..16 * G) into G groups of nb slabs at in
 * (group g's slab k at in[g * nb + k]), rows past tn zero; tmp holds one
 * row's Q8_K stream (gemm_q8_k.h). */
AVX512 static void kp_inputs(struct kp_in *in, char *tmp, const float *x, size_t ldx, int tn, int nb)
{
    const int G = (tn + 15) / 16;
    if (tn % 16) memset(in + (size_t)(G - 1) * nb, 0, (size_t)nb * sizeof *in);
    for (int r = 0; r < tn; r++) {
        moe_quantize_x_q8_k(tmp, x + (size_t)r * ldx, nb);
        const float *dy = (const float *)(tmp + (size_t)nb * MOE_Q8_K_BYTES);
        struct kp_in *s = in + (size_t)(r / 16) * nb;
        const int i = r % 16;
        for (int k = 0; k < nb; k++, s++) {
            const char *blk = tmp + (size_t)k * MOE_Q8_K_BYTES;
            for (int g = 0; g < 64; g++) memcpy(&s->q[g][4 * i], blk + 32 + 4 * g, 4);
            for (int p = 0; p < 8; p++) memcpy(s->bs[p][i], blk + 4 * p, 4);
            s->dy[i] = dy[k];
        }
    }
}

/* Block blk's 256 codes to q (element order) and its scales to m. */
AVX512 INLINE void kp_block(uint8_t *q, struct kp_w *m, const enum kp_format f, const char *blk)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    uint16_t dh[2];
    if (f == KP_Q6_K) {
        /* ggml's block_q6_K: ql at 0, qh at 128, 16 int8 scales at 192,
         * f16 d at 208 (gemm_q6_k.h's QH, SC, DH).  Run 4h + j: the low (j
         * < 2) or high nibbles of the 32 ql bytes at 64h + 32 (j & 1),
         * bits 2j, 2j + 1 of the 32 qh bytes at 128 + 32h to bits 4-5 */
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            for (int j = 0; j < 4; j++) {
                const __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (j & 1)));
                const __m256i lo = _mm256_and_si256(j < 2 ? l : _mm256_srli_epi16(l, 4), m4);
                const __m256i hb = j < 2 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - 2 * j))
                                         : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j - 4));
                _mm256_storeu_si256((__m256i *)(q + 32 * (4 * h + j)),
                                    _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30))));
            }
        }
        /* the 16 int8 scales widened: to int32 each, and to int16 (the
         * pairs sc_2p, sc_2p+1 in order) */
        const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
        _mm256_storeu_si256((__m256i *)m->sc, _mm256_cvtepi8_epi32(sc));
        _mm256_storeu_si256((__m256i *)(m->sc + 8), _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)));
        _mm256_storeu_si256((__m256i *)m->mp, _mm256_cvtepi8_epi16(sc));
        memcpy(dh, blk + 208, 2);
        dh[1] = 0;
    } else {
        /* 32 bytes of nibbles: group 2i low, 2i + 1 high; Q5_K's fifth bit
         * of group j bit j of its 32 qh bytes, to bit 4 */
        const bool five = f == KP_Q5_K;
        const __m256i h = five ? _mm256_loadu_si256((const __m256i *)(blk + MOE_Q5_K_QH)) : _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (five ? MOE_Q5_K_QS : 16) + 32 * i));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (five) {
                const __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                                             _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * i)), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                                             _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * i + 1)), one), 4));
            }
            _mm256_storeu_si256((__m256i *)(q + 64 * i), lo);
            _mm256_storeu_si256((__m256i *)(q + 64 * i + 32), hi);
        }
        uint64_t sc, mn;
        moe_q4_k_scales((const unsigned char *)blk + 4, &sc, &mn);
        const __m256i mw = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn));
        _mm256_storeu_si256((__m256i *)m->sc, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
        _mm256_storeu_si256((__m256i *)(m->sc + 8), _mm256_setzero_si256());
        _mm256_storeu_si256((__m256i *)m->mp, _mm256_or_si256(mw, _mm256_slli_epi32(mw, 16)));
        memcpy(dh, blk, 4);
    }
    int32_t h;
    memcpy(&h, dh, 4);
    _mm_storel_pi((__m64 *)&m->d, _mm_cvtph_ps(_mm_cvtsi32_si128(h))); /* d, dmin */
}

/* Weight rows [n, n + wn) (wn <= PW; w at row n, stride wld) unpacked:
 * row t's codes of block k at wq[t * wqs + 256 k], its block's scales at
 * wm[k * PW + t]; rows past wn zero. */
AVX512 static void kp_weights(uint8_t *wq, size_t wqs, struct kp_w *wm, const enum kp_format f, const char *w,
                              size_t wld, int wn, int nb)
{
    const size_t bb = f == KP_Q6_K ? MOE_Q6_K_BYTES : f == KP_Q5_K ? MOE_Q5_K_BYTES : MOE_Q4_K_BYTES;
    for (int t = 0; t < PW; t++)
        for (int k = 0; k < nb; k++) {
            uint8_t *q = wq + (size_t)t * wqs + (size_t)k * MOE_Q8_K_BLOCK;
            struct kp_w *m = wm + (size_t)k * PW + t;
            if (t < wn) {
                kp_block(q, m, f, w + (size_t)t * wld + (size_t)k * bb);
            } else {
                memset(q, 0, MOE_Q8_K_BLOCK);
                memset(m, 0, sizeof *m);
            }
        }
}

/* A band's PW weight rows against 16 input rows (group in, nb slabs):
 * y[r * ldy + t] for r < rows, t < wn (+ bias n + t).  Per block, S the
 * scaled sum of the sub-blocks' products and O the pairs against the
 * input's sums; Q4_K, Q5_K: acc = fma(-O, dmin dy, fma(S, d dy, acc));
 * Q6_K: acc = fma(S - 32 O, d dy, acc). */
AVX512 static void kp_band(const enum kp_format f, float *y, size_t ldy, int rows, const struct kp_in *in, int nb,
                           const uint8_t *wq, size_t wqs, const struct kp_w *wm, int wn, const struct moe_tensor *b,
                           int n)
{
    const int NS = f == KP_Q6_K ? 16 : 8, SL = 64 / NS; /* sub-blocks, their lines of 4 codes */
    __m512 acc[PW];
#pragma GCC unroll 8
    for (int t = 0; t < PW; t++) acc[t] = _mm512_setzero_ps();
    for (int k = 0; k < nb; k++) {
        const struct kp_in *s = in + k;
        const struct kp_w *m = wm + (size_t)k * PW;
        const uint8_t *q = wq + (size_t)k * MOE_Q8_K_BLOCK;
        __m512i s1[PW], a[PW];
#pragma GCC unroll 8
        for (int t = 0; t < PW; t++) s1[t] = _mm512_setzero_si512();
        for (int j = 0; j < NS; j++) {
#pragma GCC unroll 8
            for (int t = 0; t < PW; t++) a[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int u = 0; u < SL; u++) {
                const __m512i cx = _mm512_load_si512(s->q[SL * j + u]);
#pragma GCC unroll 8
                for (int t = 0; t < PW; t++) {
                    int32_t c4;
                    memcpy(&c4, q + (size_t)t * wqs + 4 * (SL * j + u), 4);
                    a[t] = _mm512_dpbusd_epi32(a[t], _mm512_set1_epi32(c4), cx);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < PW; t++) s1[t] = _mm512_add_epi32(s1[t], _mm512_mullo_epi32(a[t], _mm512_set1_epi32(m[t].sc[j])));
        }
#pragma GCC unroll 8
        for (int t = 0; t < PW; t++) a[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) {
            const __m512i bs = _mm512_load_si512(s->bs[p]);
#pragma GCC unroll 8
            for (int t = 0; t < PW; t++) a[t] = _mm512_dpwssd_epi32(a[t], _mm512_set1_epi32(m[t].mp[p]), bs);
        }
        const __m512 dy = _mm512_load_ps(s->dy);
#pragma GCC unroll 8
        for (int t = 0; t < PW; t++) {
            const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(m[t].d), dy);
            if (f == KP_Q6_K) {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s1[t], _mm512_slli_epi32(a[t], 5))), dd,
                                         acc[t]);
            } else {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[t]), dd, acc[t]);
                acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(a[t]), _mm512_mul_ps(_mm512_set1_ps(m[t].dmin), dy), acc[t]);
            }
        }
    }
    moe_panel_out(y, ldy, rows, acc, wn, b, n);
}

/* y[t * ldy + n] for t < T, n0 <= n < n1 (+ bias), the inputs x (T rows,
 * stride ldx) against weight rows w of format f (row n0 at w, stride wld)
 * of nb blocks, in chunks of up to PANEL_BYTES of interleaved input rows;
 * the calling thread's buffer holds a chunk, one unpacked band and one
 * row's Q8_K stream. */
AVX512 static void kp_rows(const enum kp_format f, float *y, size_t ldy, const float *x, size_t ldx, int T,
                           const char *w, size_t wld, int nb, int n0, int n1, const struct moe_tensor *b)
{
    const size_t slab = (size_t)nb * sizeof(struct kp_in), wqs = (size_t)nb * MOE_Q8_K_BLOCK;
    const int G = moe_panel_groups(T, slab, PANEL_BYTES);
    const size_t xs = moe_q8_k_row_bytes(nb), wmb = ((size_t)nb * PW * sizeof(struct kp_w) + 63) / 64 * 64;
    size_t bytes = 0;
    const bool sized = moe_mul_size((size_t)G, slab, &bytes) && moe_add_size(bytes, xs, &bytes) &&
                       moe_add_size(bytes, PW * wqs, &bytes) && moe_add_size(bytes, wmb, &bytes);
    MOE_ASSERT(sized && "gemm_fast: the panels' buffer size overflows");
    char *buf = (char *)moe_gemm_thread_buffer(bytes / sizeof(float) + 1);
    MOE_ASSERT(buf && "gemm_fast: out of memory for the panels");
    struct kp_in *in = (struct kp_in *)buf;
    uint8_t *wq = (uint8_t *)(buf + (size_t)G * slab);
    struct kp_w *wm = (struct kp_w *)((char *)wq + PW * wqs);
    char *tmp = (char *)wm + wmb;
    if (b && !b->data) b = NULL;
    for (int t0 = 0; t0 < T; t0 += 16 * G) {
        const int tn = T - t0 < 16 * G ? T - t0 : 16 * G;
        kp_inputs(in, tmp, x + (size_t)t0 * ldx, ldx, tn, nb);
        for (int n = n0; n < n1; n += PW) {
            const int wn = n1 - n < PW ? n1 - n : PW;
            kp_weights(wq, wqs, wm, f, w + (size_t)(n - n0) * wld, wld, wn, nb);
            moe_panel_prefetch(w, wld, n0, n + PW, n1, PW);
            for (int g = 0; g * 16 < tn; g++)
                kp_band(f, y + (size_t)(t0 + 16 * g) * ldy + n, ldy, tn - 16 * g < 16 ? tn - 16 * g : 16,
                        in + (size_t)g * nb, nb, wq, wqs, wm, wn, b, n);
        }
    }
}
