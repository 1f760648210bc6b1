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

/* The end of a block for one input row and weight row: acc plus (the
 * block's 8 integer lanes s less 32 times the 16 scales sc against the
 * input block's 16 sums at xb) times d dy, dy at *dy.  gemm_q6_k.c's
 * numerics; both Q6_K kernels end every block here, so their float steps
 * are one piece of code. */
AVX2 INLINE __m256 q6k_block_end(__m256 acc, __m256i s, __m128 d, __m256i sc, const char *xb, const float *dy)
{
    const __m256i o = _mm256_madd_epi16(sc, _mm256_load_si256((const __m256i *)xb));
    const __m256i t = _mm256_sub_epi32(s, _mm256_slli_epi32(o, 5));
    const __m128 dd = _mm_mul_ss(d, _mm_load_ss(dy));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_broadcastss_ps(dd), acc);
}
