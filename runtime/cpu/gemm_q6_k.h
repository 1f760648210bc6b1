/* gemm_q6_k.h - what the kernels over Q6_K weights (gemm_q6_k.c with
 * AVX2, gemm_q6_k_avx512.c with AVX-512) share: the block's offsets and
 * the tiles' bounds. */
#pragma once

#include <immintrin.h>

#include "runtime/cpu/lane_sums.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum {
    TBQ = 64,   /* input rows quantized at a time */
    MAXC = 2,   /* widest tile: weight rows */
    MAXR = 4,   /* tallest tile: input rows */
    QH = 128,   /* block offsets: qh, the scales, d */
    SC = 192,
    DH = 208,
    PF = 4096,  /* the first pass prefetches whole tiles at least this far on (gemm_q4_k.c) */
};

/* The end of a block (gemm_q6_k.c's numerics; every Q6_K tile ends its
 * blocks here or in q6k_block_end_row, and the AVX-512 set's panels,
 * gemm_k_panel.h, take the same steps 16 input rows at a time) for R
 * input rows and C weight rows at once (R C <= 8), lane r C + c of acc
 * output (r, c)'s: the block's exact integer (the 8 lanes of s[r C + c]
 * added, less 32 times weight row c's 16 scales against input row r's 16
 * sums) rounded once to fp32, acc = fma(that, d dy, acc), d dy one fp32
 * product.  Weight row c's block at w + c wld + bo; input row r's at xr +
 * r xs + xo, its scale dy at dyr[r xs / 4 + k]; s zero past R C. */
AVX2 INLINE __m256 q6k_block_end(__m256 acc, const __m256i s[8], const int R, const int C, const char *w, size_t wld,
                                 size_t bo, const char *xr, size_t xs, size_t xo, const float *dyr, int k)
{
    __m256i t[8], sc[4];
    uint16_t dh[8] = {0};
    float dy[4] = {0};
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        const char *blk = w + (size_t)c * wld + bo;
        sc[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + SC)));
        memcpy(&dh[c], blk + DH, 2);
    }
#pragma GCC unroll 8
    for (int o = R * C; o < 8; o++) t[o] = s[o];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m256i xsum = _mm256_load_si256((const __m256i *)(xr + (size_t)r * xs + xo));
        dy[r] = dyr[(size_t)r * xs / sizeof(float) + (size_t)k];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            t[r * C + c] = _mm256_sub_epi32(s[r * C + c], _mm256_slli_epi32(_mm256_madd_epi16(sc[c], xsum), 5));
    }
#define L(o) ((o) < R * C ? (o) % C : 0)
#define Y(o) ((o) < R * C ? (o) / C : 0)
    const __m256i id = _mm256_setr_epi32(L(0), L(1), L(2), L(3), L(4), L(5), L(6), L(7));
    const __m256i iy = _mm256_setr_epi32(Y(0), Y(1), Y(2), Y(3), Y(4), Y(5), Y(6), Y(7));
#undef L
#undef Y
    /* from registers (inserts), not a load of the just stored lanes */
    const __m256 d = _mm256_cvtph_ps(_mm_setr_epi16((short)dh[0], (short)dh[1], (short)dh[2], (short)dh[3], (short)dh[4],
                                                    (short)dh[5], (short)dh[6], (short)dh[7]));
    const __m256 dd = _mm256_mul_ps(_mm256_permutevar8x32_ps(d, id),
                                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_setr_ps(dy[0], dy[1], dy[2], dy[3])), iy));
    __m256i T8;
    if (R * C <= 4) { /* 4 outputs or fewer: half the tree */
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(t[0], t[1]), _mm256_hadd_epi32(t[2], t[3]));
        T8 = _mm256_zextsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    } else {
        T8 = moe_sum8x8(t);
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(T8), dd, acc);
}

/* q6k_block_end for one input row and C (<= 4) weight rows at once, lane
 * c of acc weight row c's (the same steps lane by lane): s[c] row c's
 * integer lanes (zero past C), its block at w + c wld + bo. */
AVX2 INLINE __m128 q6k_block_end_row(__m128 acc, const __m256i s[4], const int C, const char *w, size_t wld,
                                     size_t bo, const char *xb, float dy)
{
    const __m256i xsum = _mm256_load_si256((const __m256i *)xb);
    __m256i t[4];
    uint16_t dh[4] = {0};
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        t[c] = s[c];
        if (c >= C) continue;
        const char *blk = w + (size_t)c * wld + bo;
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + SC)));
        t[c] = _mm256_sub_epi32(s[c], _mm256_slli_epi32(_mm256_madd_epi16(sc, xsum), 5));
        memcpy(&dh[c], blk + DH, 2);
    }
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(t[0], t[1]), _mm256_hadd_epi32(t[2], t[3]));
    const __m128i v = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_setr_epi16((short)dh[0], (short)dh[1], (short)dh[2], (short)dh[3], 0, 0, 0, 0)),
                                 _mm_set1_ps(dy));
    return _mm_fmadd_ps(_mm_cvtepi32_ps(v), dd, acc);
}
