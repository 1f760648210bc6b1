/* gemm_q4_k_tile.h - the AVX2 tile of the Q4_K and Q5_K products
 * (gemm_q4_k.c, gemm_q5_k.c: their numerics there), one body for both:
 * Q5_K's blocks carry 32 bytes of fifth bits after Q4_K's head, joined to
 * the nibbles once per 32 bytes of codes.  Included once by each of the
 * two files, which call tile_k with five a constant. */
#pragma once

/* Group j's fifth bits of the block's 32 qh bytes h, on bit 4 of each
 * byte (0x10 or 0). */
AVX2 INLINE __m256i fifth_bits(__m256i h, const int j)
{
    const __m256i s = j < 4 ? _mm256_slli_epi16(h, 4 - j) : j == 4 ? h : _mm256_srli_epi16(h, j - 4);
    return _mm256_and_si256(s, _mm256_set1_epi8(0x10));
}

/* y[r*ldy + c] = input row r0 + r . weight row c (+ bias n + c) for r < R,
 * c < C, over Q4_K (five false) or Q5_K blocks: x the quantized rows
 * (stride xs bytes, nb blocks each), w the first weight row (stride wld);
 * pf: the first pass over these weight rows, which prefetches whole tiles
 * at least PF bytes on.  Per block, each weight row's scales (and fifth
 * bits) are made once and each 32 bytes of codes unpacked once for the R
 * input rows, so the live registers are the R*C float sums, the R*C
 * integer sums of the block, the C rows' scales, one load of codes and
 * constants. */
AVX2 INLINE void tile_k(const bool five, const int R, const int C, float *y, size_t ldy, const char *x, size_t xs,
                        int r0, int nb, const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    __m128 acc1 = _mm_setzero_ps(); /* R = 1: the C rows' sums in lanes */
    __m256 accv = _mm256_setzero_ps(); /* R > 1: output (r, c) in lane r C + c */
    const char *xr = x + (size_t)r0 * xs;
    const float *dyr = (const float *)(xr + (size_t)nb * MOE_Q8_K_BYTES);
    const size_t tb = (size_t)C * wld, pfd = (PF + tb - 1) / tb * tb;
    for (int k = 0; k < nb; k++) {
        const size_t bo = (size_t)k * (five ? MOE_Q5_K_BYTES : MOE_Q4_K_BYTES), xo = (size_t)k * MOE_Q8_K_BYTES;
        __m256i sc[MAXC], qh[MAXC], sum[MAXR][MAXC];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const char *blk = w + (size_t)c * wld + bo;
            if (pf)
                for (int l = 0; l < 3; l++) _mm_prefetch(blk + 64 * l + pfd, _MM_HINT_T0);
            sc[c] = block_scales(blk);
            if (five) qh[c] = _mm256_loadu_si256((const __m256i *)(blk + MOE_Q5_K_QH));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) sum[r][c] = _mm256_setzero_si256();
        }
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const char *qs = w + (size_t)c * wld + bo + (five ? MOE_Q5_K_QS : 16);
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * t));
                __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(15)),
                        hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15));
                if (five) {
                    lo = _mm256_or_si256(lo, fifth_bits(qh[c], 2 * t));
                    hi = _mm256_or_si256(hi, fifth_bits(qh[c], 2 * t + 1));
                }
                const __m256i sl = group_scale(sc[c], 2 * t), sh = group_scale(sc[c], 2 * t + 1);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const char *xq = xr + (size_t)r * xs + xo + 32 + 64 * t;
                    const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_load_si256((const __m256i *)xq));
                    const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_load_si256((const __m256i *)(xq + 32)));
                    sum[r][c] = _mm256_add_epi32(sum[r][c],
                                                 _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh)));
                }
            }
        }
        /* output (r, c)'s integer lanes: s8[r C + c] */
        __m256i s8[8];
#pragma GCC unroll 8
        for (int o = 0; o < 8; o++) s8[o] = o < R * C ? sum[o / C][o % C] : _mm256_setzero_si256();
        if (R == 1) acc1 = q4k_block_end_row(acc1, s8, sc, C, w, wld, bo, xr + xo, dyr[k]);
        else accv = q4k_block_end(accv, s8, sc, R, C, w, wld, bo, xr, xs, xo, dyr, k);
    }
    moe_tile_out(y, ldy, R, C, acc1, accv, b, n);
}
