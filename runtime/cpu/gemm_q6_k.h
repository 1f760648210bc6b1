/* gemm_q6_k.h - what the kernels over Q6_K weights (gemm_q6_k.c with
 * AVX2, gemm_q6_k_avx512.c with AVX-512) share: the block's offsets and
 * the tiles' bounds. */
#pragma once

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
