/* gemm_q4_k.h - a Q4_K block's scales as the integer kernels over Q4_K
 * weights use them (gemm_q4_k.c with AVX2, gemm_q4_k_avx512.c with
 * AVX-512), and over Q5_K weights, whose blocks open with the same 16
 * bytes and lay their nibbles out alike (gemm_q5_k.c, gemm_q5_k_avx512.c):
 * AVX2 instructions, inlined into any of them. */
#pragma once

#include <immintrin.h>
#include <stddef.h>

#include "runtime/cpu/gemm_q8_k.h"
#include "runtime/cpu/lane_sums.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum {
    TBQ = 64, /* input rows quantized at a time */
    MAXC = 2, /* widest tile: weight rows */
    MAXR = 4, /* tallest tile: input rows */
    /* how far ahead the first pass prefetches, at least, in whole tiles:
     * 4 KiB rather than the next tile made one thread at T = 1 3 to 10%
     * faster on rows of 512 and 1024 (a tile of 2 such rows is read in
     * well under the memory's latency), the same on rows of 2048 */
    PF = 4096,
};

/* The 6-bit scales sc_0..7 (bytes 0-7) and minimums mn_0..7 (bytes 8-15)
 * of the Q4_K block at blk, by two byte shuffles of its 16-byte head
 * (bytes 4-15: the low 6 bits of scale bytes 0-3 and 4-7, the nibbles of
 * scale bytes 8-11 under the top 2 bits of bytes 0-3 or 4-7), in both
 * halves of the result. */
AVX2 INLINE __m256i block_scales(const char *blk)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)blk);
    const __m128i low = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i hi = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m128i lm = _mm_and_si128(low, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i l4 = _mm_and_si128(_mm_srli_epi16(low, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i s = _mm_or_si128(_mm_or_si128(lm, l4), _mm_and_si128(_mm_srli_epi16(hi, 2), _mm_set1_epi8(0x30)));
    return _mm256_broadcastsi128_si256(s);
}

/* The input's codes in the order one 64-byte load of Q4_K (or Q5_K)
 * nibbles gives its groups, for the AVX-512 kernels: a load of half a
 * block's nibbles (bytes 64p .. 64p+63) is groups 4p, 4p+2 (low nibbles)
 * and 4p+1, 4p+3 (high nibbles), so each block's 32-byte chunks of input
 * codes go from group order 0..7 to 0, 2, 1, 3, 4, 6, 5, 7 (the sums of
 * 16 stay in group order). */
AVX2 INLINE void q4k_arrange(char *row, int nb)
{
    for (int k = 0; k < nb; k++)
        for (int c = 1; c < 8; c += 4) {
            __m256i *a = (__m256i *)(row + (size_t)k * MOE_Q8_K_BYTES + 32 + 32 * c);
            const __m256i t = _mm256_load_si256(a);
            _mm256_store_si256(a, _mm256_load_si256(a + 1));
            _mm256_store_si256(a + 1, t);
        }
}

/* sc_j as 16 int16 from a block's scales (block_scales) */
AVX2 INLINE __m256i group_scale(__m256i s, const int j)
{
    return _mm256_shuffle_epi8(s, _mm256_set1_epi16((short)(0x8000 | j)));
}

/* mn_0, mn_0, mn_1, mn_1, ... mn_7 as 16 int16: one per sum of 16 */
AVX2 INLINE __m256i block_mins(__m256i s)
{
    const char z = -128;
    return _mm256_shuffle_epi8(s, _mm256_setr_epi8(8, z, 8, z, 9, z, 9, z, 10, z, 10, z, 11, z, 11, z, 12, z, 12, z,
                                                   13, z, 13, z, 14, z, 14, z, 15, z, 15, z));
}

/* The 4 lanes' sums of four vectors of 8 int32: lane c holds v[c]'s. */
AVX2 INLINE __m128i q4k_sum4(const __m256i v[4])
{
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* The end of a block (gemm_q4_k.c's numerics; every Q4_K and Q5_K tile
 * ends its blocks here or in q4k_block_end_row, and the panels,
 * gemm_k_panel.h, take the same steps 16 input rows at a time) for R
 * input rows and C weight rows at once (R C <= 8), lane r C + c of acc
 * output (r, c)'s: its block's two exact integers, S (the 8 lanes of s[r C
 * + c] added) and M (weight row c's minimums against input row r's 16
 * sums, added), then acc = fma(-M, dmin dy, fma(S, d dy, acc)), d dy and
 * dmin dy each one fp32 product.  sc[c]: weight row c's scales
 * (block_scales), its block at w + c wld + bo; input row r's block at xr
 * + r xs + xo, its scale dy at dyr[r xs / 4 + k]; s zero past R C. */
AVX2 INLINE __m256 q4k_block_end(__m256 acc, const __m256i s[8], const __m256i *sc, const int R, const int C,
                                 const char *w, size_t wld, size_t bo, const char *xr, size_t xs, size_t xo,
                                 const float *dyr, int k)
{
    __m256i m[8];
    int32_t dh[4] = {0};
    float dy[4] = {0};
#pragma GCC unroll 8
    for (int o = R * C; o < 8; o++) m[o] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) memcpy(&dh[c], w + (size_t)c * wld + bo, 4);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m256i xsum = _mm256_load_si256((const __m256i *)(xr + (size_t)r * xs + xo));
        dy[r] = dyr[(size_t)r * xs / sizeof(float) + (size_t)k];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) m[r * C + c] = _mm256_madd_epi16(block_mins(sc[c]), xsum);
    }
#define L(o) ((o) < R * C ? (o) % C : 0)
#define Y(o) ((o) < R * C ? (o) / C : 0)
    const __m256i id = _mm256_setr_epi32(2 * L(0), 2 * L(1), 2 * L(2), 2 * L(3), 2 * L(4), 2 * L(5), 2 * L(6), 2 * L(7));
    const __m256i iy = _mm256_setr_epi32(Y(0), Y(1), Y(2), Y(3), Y(4), Y(5), Y(6), Y(7));
#undef L
#undef Y
    /* from registers (inserts), not a load of the just stored lanes, which
     * would wait for store forwarding */
    const __m256 f = _mm256_cvtph_ps(_mm_setr_epi32(dh[0], dh[1], dh[2], dh[3])); /* d0 dmin0 d1 dmin1 ... */
    const __m256 yv = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_setr_ps(dy[0], dy[1], dy[2], dy[3])), iy);
    const __m256 dd = _mm256_mul_ps(_mm256_permutevar8x32_ps(f, id), yv);
    const __m256 dm = _mm256_mul_ps(_mm256_permutevar8x32_ps(f, _mm256_add_epi32(id, _mm256_set1_epi32(1))), yv);
    /* 4 outputs or fewer: half the tree (q4k_sum4) */
    const __m256i S = R * C <= 4 ? _mm256_zextsi128_si256(q4k_sum4(s)) : moe_sum8x8(s);
    const __m256i M = R * C <= 4 ? _mm256_zextsi128_si256(q4k_sum4(m)) : moe_sum8x8(m);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), dd, acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), dm, acc);
}


/* (d x dy for 4 rows | dmin x dy for them) from their blocks' first 4
 * bytes dh (f16 d, dmin). */
AVX2 INLINE __m256 q4k_dd4(const int32_t dh[4], float dy)
{
    const __m256 f = _mm256_cvtph_ps(_mm_setr_epi32(dh[0], dh[1], dh[2], dh[3])); /* d0 dmin0 d1 dmin1 ... */
    return _mm256_mul_ps(_mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)), _mm256_set1_ps(dy));
}

/* q4k_block_end for one input row and C (<= 4) weight rows at once, lane
 * c of acc weight row c's (the same steps lane by lane): s[c] row c's
 * integer lanes (zero past C), sc[c] its scales (block_scales), its block
 * at w + c wld + bo. */
AVX2 INLINE __m128 q4k_block_end_row(__m128 acc, const __m256i s[4], const __m256i *sc, const int C, const char *w,
                                     size_t wld, size_t bo, const char *xb, float dy)
{
    const __m256i xsum = _mm256_load_si256((const __m256i *)xb);
    __m256i m[4];
    int32_t dh[4] = {0};
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        m[c] = c < C ? _mm256_madd_epi16(block_mins(sc[c]), xsum) : _mm256_setzero_si256();
        if (c < C) memcpy(&dh[c], w + (size_t)c * wld + bo, 4);
    }
    const __m256 dd = q4k_dd4(dh, dy);
    acc = _mm_fmadd_ps(_mm_cvtepi32_ps(q4k_sum4(s)), _mm256_castps256_ps128(dd), acc);
    return _mm_fnmadd_ps(_mm_cvtepi32_ps(q4k_sum4(m)), _mm256_extractf128_ps(dd, 1), acc);
}
