/* gemm_q6_k.h - what the kernels over Q6_K weights (gemm_q6_k.c with
 * AVX2, gemm_q6_k_avx512.c with AVX-512) share: the block's offsets and
 * the tiles' bounds. */
#pragma once

#include <immintrin.h>

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

/* The end of a block for one input row and weight row: the block's exact
 * integer (the 8 lanes of s added, less 32 times the 16 scales sc against
 * the input block's 16 sums at xb) rounded once to fp32, times d dy (one
 * fp32 product), added: acc = fma(that, d dy, acc); dy at *dy.
 * gemm_q6_k.c's numerics: every Q6_K tile ends its blocks here, and the
 * AVX-512 set's panels (gemm_k_panel.h) take the same steps 16 input rows
 * at a time. */
AVX2 INLINE float q6k_block_end(float acc, __m256i s, __m128 d, __m256i sc, const char *xb, const float *dy)
{
    const __m256i o = _mm256_madd_epi16(sc, _mm256_load_si256((const __m256i *)xb));
    const __m256i t = _mm256_sub_epi32(s, _mm256_slli_epi32(o, 5));
    __m128i v = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4e));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1));
    const __m128 dd = _mm_mul_ss(d, _mm_load_ss(dy));
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_cvtepi32_ps(v), dd, _mm_set_ss(acc)));
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
    const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)dh)), _mm_set1_ps(dy));
    return _mm_fmadd_ps(_mm_cvtepi32_ps(v), dd, acc);
}
