/* gemm_q4_k_panel.h - the prefill panels of the Q4_K and Q5_K products at
 * AVX-512 VNNI width (gemm_q4_k_avx512.c, gemm_q5_k_avx512.c), one body
 * for both: a call of PANEL_MIN or more input rows takes them instead of
 * the tiles (gemm_q4_k_tile_avx512.h).
 *
 * The tiles unpack each block's codes once for every 4 input rows and end
 * every block of every (input row, weight row) pair with horizontal sums.
 * Here the weights are unpacked once per call for all its input rows, PW
 * weight rows at a time (a band): one byte a code, natural order, each
 * block's scales and minimums widened.  The input rows' codes are laid out
 * 16 rows to a 64-byte line, 4 consecutive codes of each row, so that one
 * vpdpbusd takes 4 codes of a weight row (broadcast) against the same 4
 * codes of 16 input rows: 64 products an instruction, nothing unpacked or
 * shuffled in the inner loop; a group of 32's scale is one vpmulld and
 * the minimums' sums one vpdpwssd for two groups.  The integers are the
 * tiles' (exact, in any order) and each lane's float steps are
 * q4k_block_end's (gemm_q4_k.h), so every output has the tiles' bits.
 *
 * The includer defines AVX512 and INLINE and includes gemm_q4_k.h,
 * gemm_q8_k.h and gemm_fast_impl.h first. */
#pragma once

enum {
    PANEL_MIN = 16,        /* input rows from which a call takes the panels */
    PW = 8,                /* weight rows of a band */
    PANEL_BYTES = 1 << 19, /* the interleaved input rows of a chunk, at most */
};

/* One block of 16 input rows (a slab): codes 4g..4g+3 of each row in line
 * g, the sums of groups 2p and 2p + 1 of each row in bs[p] (one int16
 * pair a row), the rows' scales dy. */
struct kp_in {
    int8_t q[64][64];
    int16_t bs[4][16][2];
    float dy[16];
};

/* A weight row's block, widened: the 8 scales, the 8 minimums as int16
 * pairs (mn_2p low, mn_2p+1 high), d and dmin. */
struct kp_w {
    int32_t sc[8];
    int32_t mn[4];
    float d, dmin;
};

/* The sums of groups 2p, 2p+1 of the Q8_K stream block at blk (its four
 * sums of 16 from 4p), as an int16 pair. */
INLINE void kp_pair_sums(int16_t o[2], const char *blk, int p)
{
    int16_t s[4];
    memcpy(s, blk + 8 * p, sizeof s);
    o[0] = (int16_t)(s[0] + s[1]);
    o[1] = (int16_t)(s[2] + s[3]);
}

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
            for (int p = 0; p < 4; p++) kp_pair_sums(s->bs[p][i], blk, p);
            s->dy[i] = dy[k];
        }
    }
}

/* Weight rows [n, n + wn) (wn <= PW; w at row n, stride wld) unpacked:
 * row t's codes of block k at wq[t * wqs + 256 k], its block's scales at
 * wm[k * PW + t]; rows past wn zero. */
AVX512 static void kp_weights(uint8_t *wq, size_t wqs, struct kp_w *wm, const bool five, const char *w, size_t wld,
                              int wn, int nb)
{
    const size_t bb = five ? MOE_Q5_K_BYTES : MOE_Q4_K_BYTES;
    for (int t = 0; t < PW; t++)
        for (int k = 0; k < nb; k++) {
            uint8_t *q = wq + (size_t)t * wqs + (size_t)k * MOE_Q8_K_BLOCK;
            struct kp_w *m = wm + (size_t)k * PW + t;
            if (t >= wn) {
                memset(q, 0, MOE_Q8_K_BLOCK);
                memset(m, 0, sizeof *m);
                continue;
            }
            const char *blk = w + (size_t)t * wld + (size_t)k * bb;
            const __m256i h = five ? _mm256_loadu_si256((const __m256i *)(blk + MOE_Q5_K_QH)) : _mm256_setzero_si256();
            for (int i = 0; i < 4; i++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (five ? MOE_Q5_K_QS : 16) + 32 * i));
                __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(15)),
                        hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15));
                if (five) { /* group j's fifth bit, bit j of qh, to bit 4 */
                    const __m256i one = _mm256_set1_epi8(1);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                                                 _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * i)), one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                                                 _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * i + 1)), one), 4));
                }
                _mm256_storeu_si256((__m256i *)(q + 64 * i), lo);
                _mm256_storeu_si256((__m256i *)(q + 64 * i + 32), hi);
            }
            uint16_t dh[2];
            memcpy(dh, blk, 4);
            uint64_t sc, mn;
            moe_q4_k_scales((const unsigned char *)blk + 4, &sc, &mn);
            for (int j = 0; j < 8; j++) m->sc[j] = (int32_t)(sc >> (8 * j) & 0xff);
            for (int p = 0; p < 4; p++)
                m->mn[p] = (int32_t)((mn >> (16 * p) & 0xff) | (mn >> (16 * p + 8) & 0xff) << 16);
            m->d = moe_f16_to_f32(dh[0]);
            m->dmin = moe_f16_to_f32(dh[1]);
        }
}

/* A band's PW weight rows against 16 input rows (group in, nb slabs):
 * y[r * ldy + t] for r < rows, t < wn (+ bias n + t). */
AVX512 static void kp_band(float *y, size_t ldy, int rows, const struct kp_in *in, int nb, const uint8_t *wq,
                           size_t wqs, const struct kp_w *wm, int wn, const struct moe_tensor *b, int n)
{
    __m512 acc[PW];
    for (int t = 0; t < PW; t++) acc[t] = _mm512_setzero_ps();
    for (int k = 0; k < nb; k++) {
        const struct kp_in *s = in + k;
        const struct kp_w *m = wm + (size_t)k * PW;
        const uint8_t *q = wq + (size_t)k * MOE_Q8_K_BLOCK;
        __m512i s1[PW], a[PW];
        for (int t = 0; t < PW; t++) s1[t] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            for (int t = 0; t < PW; t++) a[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) {
                const __m512i cx = _mm512_load_si512(s->q[8 * j + u]);
#pragma GCC unroll 8
                for (int t = 0; t < PW; t++) {
                    int32_t c4;
                    memcpy(&c4, q + (size_t)t * wqs + 32 * j + 4 * u, 4);
                    a[t] = _mm512_dpbusd_epi32(a[t], _mm512_set1_epi32(c4), cx);
                }
            }
            for (int t = 0; t < PW; t++) s1[t] = _mm512_add_epi32(s1[t], _mm512_mullo_epi32(a[t], _mm512_set1_epi32(m[t].sc[j])));
        }
        for (int t = 0; t < PW; t++) a[t] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            const __m512i bs = _mm512_load_si512(s->bs[p]);
            for (int t = 0; t < PW; t++) a[t] = _mm512_dpwssd_epi32(a[t], _mm512_set1_epi32(m[t].mn[p]), bs);
        }
        const __m512 dy = _mm512_load_ps(s->dy);
        for (int t = 0; t < PW; t++) {
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[t]), _mm512_mul_ps(_mm512_set1_ps(m[t].d), dy), acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(a[t]), _mm512_mul_ps(_mm512_set1_ps(m[t].dmin), dy), acc[t]);
        }
    }
    float o[PW][16] __attribute__((aligned(64)));
    for (int t = 0; t < PW; t++) _mm512_store_ps(o[t], acc[t]);
    for (int t = 0; t < wn; t++) {
        const float bias = b ? moe_tensor_get_f32(b, n + t) : 0.0f;
        for (int r = 0; r < rows; r++) y[(size_t)r * ldy + t] = o[t][r] + bias;
    }
}

/* y[t * ldy + n] for t < T, n0 <= n < n1 (+ bias), the inputs x (T rows,
 * stride ldx) against Q4_K or Q5_K weight rows w (row n0 at w, stride wld)
 * of nb blocks, in chunks of up to PANEL_BYTES of interleaved input rows;
 * the calling thread's buffer holds a chunk, one unpacked band and one
 * row's Q8_K stream. */
AVX512 static void kp_rows(const bool five, float *y, size_t ldy, const float *x, size_t ldx, int T, const char *w,
                           size_t wld, int nb, int n0, int n1, const struct moe_tensor *b)
{
    const size_t slab = (size_t)nb * sizeof(struct kp_in), wqs = (size_t)nb * MOE_Q8_K_BLOCK;
    int G = (int)(PANEL_BYTES / slab);
    G = G < 1 ? 1 : G > 16 ? 16 : G;
    if (G > (T + 15) / 16) G = (T + 15) / 16;
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
            kp_weights(wq, wqs, wm, five, w + (size_t)(n - n0) * wld, wld, wn, nb);
            for (int g = 0; g * 16 < tn; g++)
                kp_band(y + (size_t)(t0 + 16 * g) * ldy + n, ldy, tn - 16 * g < 16 ? tn - 16 * g : 16,
                        in + (size_t)g * nb, nb, wq, wqs, wm, wn, b, n);
        }
    }
}
