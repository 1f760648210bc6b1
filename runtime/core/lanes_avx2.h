/* lanes_avx2.h - helpers of the block quantizers that run a block's groups
 * in the 8 lanes of AVX2 registers (q4_k_avx2.c, q6_k_avx2.c): 8 doubles
 * as two registers, and the 8 x 8 transpose that puts value i of group j
 * in lane j of row i. */
#pragma once

#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))

/* 8 doubles: lanes 0..3 in [0], 4..7 in [1]. */
typedef struct {
    __m256d h[2];
} d8;

AVX2 static inline d8 d8_widen(__m256 v)
{
    return (d8){{_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))}};
}

AVX2 static inline __m256 d8_narrow(d8 d)
{
    return _mm256_set_m128(_mm256_cvtpd_ps(d.h[1]), _mm256_cvtpd_ps(d.h[0]));
}

/* Rows r[0..7] (lane j of r[i] = element (i, j)) transposed in place. */
AVX2 static inline void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
        u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xee);
        u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
        u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xee);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
        r[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
    }
}

