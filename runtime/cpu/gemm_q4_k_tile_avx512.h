/* gemm_q4_k_tile_avx512.h - the AVX-512 VNNI tile of the Q4_K and Q5_K
 * products (gemm_q4_k_avx512.c, gemm_q5_k_avx512.c), one body for both, as
 * gemm_q4_k_tile.h is for the AVX2 ones.  Included once by each of the two
 * files, which define AVX512, WC and call tile_k with five a constant. */
#pragma once

/* The fifth bits (0x10 or 0 a byte) of groups 4p + a (lower half) and 4p
 * + a + 2 (upper half), a = 0 or 1, from the block's qh bytes in both
 * halves of h. */
AVX512 INLINE __m512i fifth_bits(__m512i h, const int p, const int a)
{
    const int j0 = 4 * p + a, j1 = j0 + 2; /* the two halves' groups */
    const __m512i n = _mm512_inserti64x4(_mm512_set1_epi16((short)(p ? j0 - 4 : 4 - j0)),
                                         _mm256_set1_epi16((short)(p ? j1 - 4 : 4 - j1)), 1);
    const __m512i s = p ? _mm512_srlv_epi16(h, n) : _mm512_sllv_epi16(h, n);
    return _mm512_and_si512(s, _mm512_set1_epi8(0x10));
}

/* As gemm_q4_k_tile.h's tile_k (its arguments and registers), four groups
 * a step (two zmm of codes from one 64-byte load of nibbles). */
AVX512 INLINE void tile_k(const bool five, const int R, const int C, float *y, size_t ldy, const char *x, size_t xs,
                          int r0, int nb, const char *w, size_t wld, const struct moe_tensor *b, int n, bool pf)
{
    __m128 acc1 = _mm_setzero_ps(); /* R = 1: the C rows' sums in lanes */
    __m256 accv = _mm256_setzero_ps(); /* R > 1: output (r, c) in lane r C + c */
    const char *xr = x + (size_t)r0 * xs;
    const float *dyr = (const float *)(xr + (size_t)nb * MOE_Q8_K_BYTES);
    const size_t tb = (size_t)C * wld, pfd = (PF + tb - 1) / tb * tb;
    for (int k = 0; k < nb; k++) {
        const size_t bo = (size_t)k * (five ? MOE_Q5_K_BYTES : MOE_Q4_K_BYTES), xo = (size_t)k * MOE_Q8_K_BYTES;
        __m256i sc[WC];
        __m512i scz[WC], qh[WC], sum[MAXR][WC];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const char *blk = w + (size_t)c * wld + bo;
            if (pf)
                for (int l = 0; l < 3; l++) _mm_prefetch(blk + 64 * l + pfd, _MM_HINT_T0);
            sc[c] = block_scales(blk);
            scz[c] = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc[c]));
            if (five) qh[c] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + MOE_Q5_K_QH)));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) sum[r][c] = _mm512_setzero_si512();
        }
#pragma GCC unroll 2
        for (int p = 0; p < 2; p++) {
            /* the scales of groups 4p, 4p+2 (low nibbles) and 4p+1, 4p+3
             * (high), each in 16 int16 */
            const short g0 = (short)(0x8000 | 4 * p), g1 = (short)(g0 + 1), g2 = (short)(g0 + 2), g3 = (short)(g0 + 3);
            const __m512i pl = _mm512_inserti64x4(_mm512_set1_epi16(g0), _mm256_set1_epi16(g2), 1);
            const __m512i ph = _mm512_inserti64x4(_mm512_set1_epi16(g1), _mm256_set1_epi16(g3), 1);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m512i v = _mm512_loadu_si512(w + (size_t)c * wld + bo + (five ? MOE_Q5_K_QS : 16) + 64 * p);
                __m512i lo = _mm512_and_si512(v, _mm512_set1_epi8(15)),
                        hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15));
                if (five) {
                    lo = _mm512_or_si512(lo, fifth_bits(qh[c], p, 0));
                    hi = _mm512_or_si512(hi, fifth_bits(qh[c], p, 1));
                }
                const __m512i sl = _mm512_shuffle_epi8(scz[c], pl), sh = _mm512_shuffle_epi8(scz[c], ph);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const char *xq = xr + (size_t)r * xs + xo + 32 + 128 * p;
                    /* vpdpwssd: the vpmaddwd by the scales and the add in one */
                    sum[r][c] = _mm512_dpwssd_epi32(sum[r][c], _mm512_maddubs_epi16(lo, _mm512_loadu_si512(xq)), sl);
                    sum[r][c] = _mm512_dpwssd_epi32(sum[r][c], _mm512_maddubs_epi16(hi, _mm512_loadu_si512(xq + 64)), sh);
                }
            }
        }
        /* output (r, c)'s integer lanes: s8[r C + c] */
        __m256i s8[8];
#pragma GCC unroll 8
        for (int o = 0; o < 8; o++) s8[o] = o < R * C ? _mm256_add_epi32(_mm512_castsi512_si256(sum[o / C][o % C]), _mm512_extracti64x4_epi64(sum[o / C][o % C], 1)) : _mm256_setzero_si256();
        if (R == 1) acc1 = q4k_block_end_row(acc1, s8, sc, C, w, wld, bo, xr + xo, dyr[k]);
        else accv = q4k_block_end(accv, s8, sc, R, C, w, wld, bo, xr, xs, xo, dyr, k);
    }
    moe_tile_out(y, ldy, R, C, acc1, accv, b, n);
}
