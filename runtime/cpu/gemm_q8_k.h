/* gemm_q8_k.h - the input rows of the K-quant kernels (gemm_q4_k.c): each
 * block of 256 values quantized to int8 with one scale, as llama.cpp's
 * Q8_K does, so that a weight block's whole sum is one exact integer and
 * its scales are applied in integers.
 *
 * A row of nb blocks is one stream: per block 288 bytes, the 16 int16 sums
 * of its codes 16 at a time (sums of 16 int8 codes: |s| <= 2032), then its
 * 256 codes; after the nb blocks, the nb scales dy as floats.  A block's
 * codes are round(x / dy) (nearest, ties to even), dy = max |x| / 127, so
 * |x - q dy| <= dy / 2; a block of zeros has dy 0 and codes 0, as has
 * one whose max |x| is below 127 FLT_MIN (about 1.5e-36: 127 / max |x|
 * could overflow) codes 0; a NaN or an
 * infinity in a block makes its dy NaN and its codes and sums 0, so every
 * product with that row is NaN. */
#ifndef MOERUN_CPU_GEMM_Q8_K_H
#define MOERUN_CPU_GEMM_Q8_K_H

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    MOE_Q8_K_BLOCK = 256, /* values per input block */
    MOE_Q8_K_BYTES = 288, /* stream bytes per block: 16 int16 sums, 256 codes */
};

/* The bytes of a row's stream of nb blocks, rounded up to 64 (nb < 2^24:
 * no overflow). */
static inline size_t moe_q8_k_row_bytes(int nb)
{
    return ((size_t)nb * (MOE_Q8_K_BYTES + sizeof(float)) + 63) / 64 * 64;
}

/* Input row x (nb blocks of 256) into its stream o (32-byte aligned). */
static inline __attribute__((target("avx2,fma,f16c"))) void moe_quantize_x_q8_k(char *o, const float *x, int nb)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    /* packs work within 128-bit halves: this puts the 4-byte groups back
     * in element order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    float *dy = (float *)(o + (size_t)nb * MOE_Q8_K_BYTES);
    for (int k = 0; k < nb; k++) {
        const float *xb = x + (size_t)k * MOE_Q8_K_BLOCK;
        char *blk = o + (size_t)k * MOE_Q8_K_BYTES;
        __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int i = 0; i < 32; i++) {
            const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + 8 * i), absmask);
            m = _mm256_max_ps(m, a);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ)); /* NaN or inf */
        }
        if (!_mm256_testz_ps(bad, bad)) {
            dy[k] = NAN;
            memset(blk, 0, MOE_Q8_K_BYTES);
            continue;
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        dy[k] = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(amax >= 127.0f * FLT_MIN ? 127.0f / amax : 0.0f);
        int16_t *sums = (int16_t *)blk;
        for (int g = 0; g < 8; g++) {
            __m256i i4[4];
            for (int j = 0; j < 4; j++) i4[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * g + 8 * j), id));
            const __m256i p = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(i4[0], i4[1]), _mm256_packs_epi32(i4[2], i4[3])), order);
            _mm256_store_si256((__m256i *)(blk + 32 + 32 * g), p);
            /* lane sums of 4 codes, then of 16 in lane 0 of each half */
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
            s = _mm256_hadd_epi32(s, s);
            s = _mm256_hadd_epi32(s, s);
            sums[2 * g] = (int16_t)_mm256_cvtsi256_si32(s);
            sums[2 * g + 1] = (int16_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(s, 1));
        }
    }
}

#endif
