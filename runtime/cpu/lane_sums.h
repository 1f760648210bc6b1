/* lane_sums.h - what the int8-route tiles and panels end with: the lane
 * sums that add many outputs' 8 integer lanes each into one lane of one
 * register, exact (int32 adds), so one conversion and one FMA serve a
 * tile's outputs (gemm_q8.c, gemm_q8_vnni.c, the K-quants' gemm_q4_k.h
 * and gemm_q6_k.h); a tile's and a panel's stores of their outputs. */
#pragma once

#include <immintrin.h>
#include <stddef.h>

#include "runtime/core/tensor.h"

/* The 8 int32 lanes of v[i] added, lane i of the result. */
static inline __attribute__((always_inline, target("avx2"))) __m256i moe_sum8x8(const __m256i v[8])
{
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20), _mm256_permute2x128_si256(a, c, 0x31));
}

#define MOE_LANE_SUMS_512 __attribute__((always_inline, target("avx2,avx512f,avx512bw,avx512vl")))

/* The 4 int32 lanes of each 128-bit lane of v[0..3] added: lane j of each
 * 128-bit lane of the result v[j]'s. */
static inline MOE_LANE_SUMS_512 __m512i moe_sum4x4_512(const __m512i v[4])
{
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

/* Each 256-bit half's 8 int32 lanes of s[i] added (i < n, n 4 or 8;
 * output 2i the lower half, 2i + 1 the upper), output j in lane j of the
 * result (lanes 2n.. zero). */
static inline MOE_LANE_SUMS_512 __m512i moe_sum_halves(const __m512i *s, const int n)
{
    /* per 128-bit lane L: [s0_L, s1_L, s2_L, s3_L], then a half's two
     * lanes added: [out 0 2 4 6 | . | out 1 3 5 7 | .] */
    __m512i u = moe_sum4x4_512(s);
    u = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
    __m512i v = _mm512_setzero_si512();
    if (n > 4) {
        v = moe_sum4x4_512(s + 4);
        v = _mm512_add_epi32(v, _mm512_shuffle_i32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
    }
    const __m512i z = _mm512_shuffle_i32x4(u, v, _MM_SHUFFLE(2, 0, 2, 0)); /* 0246 1357 8ace 9bdf */
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15), z);
}

/* A tile's outputs y[r ldy + c] (r < R, c < C; R C <= 8) from lane r C +
 * c of its sums (acc1 when R = 1, else accv), plus bias n + c. */
static inline __attribute__((always_inline, target("avx2"))) void moe_tile_out(float *y, size_t ldy, const int R,
                                                                              const int C, __m128 acc1, __m256 accv,
                                                                              const struct moe_tensor *b, int n)
{
    float o[8];
    if (R == 1) _mm_storeu_ps(o, acc1);
    else _mm256_storeu_ps(o, accv);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)r * ldy + c] = o[r * C + c] + (b ? moe_tensor_get_f32(b, n + c) : 0.0f);
}

/* A panel's outputs y[r ldy + t] (r < rows, t < wn) from lane r of acc[t]
 * (8 weight rows against 16 input rows: gemm_k_panel.h, gemm_q8_panel.h),
 * plus bias n + t. */
static inline MOE_LANE_SUMS_512 void moe_panel_out(float *y, size_t ldy, int rows, const __m512 acc[8], int wn,
                                                   const struct moe_tensor *b, int n)
{
    float o[8][16] __attribute__((aligned(64)));
    for (int t = 0; t < 8; t++) _mm512_store_ps(o[t], acc[t]);
    for (int t = 0; t < wn; t++) {
        const float bias = b ? moe_tensor_get_f32(b, n + t) : 0.0f;
        for (int r = 0; r < rows; r++) y[(size_t)r * ldy + t] = o[t][r] + bias;
    }
}
