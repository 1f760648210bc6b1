/* q4_k.c - the Q4_K format's heads and quantizer (MOE_DTYPE_Q4_K,
 * tensor.h): the fit of each block is q4_k_fit.h's, shared with the CUDA
 * backend; here its lanes in SSE2 where the compiler has it, and where the
 * processor has AVX2, q4_k_avx2.c's block quantizer (the same bytes).
 *
 * Measured (docs/quality.md): relative RMS error 0.0543 on uniform random
 * weights (Q4_1's min/max 0.0607; llama.cpp's Q4_K 0.0546 on such
 * weights), 0.0704 on Gaussian ones (Q4_1 0.0782); about 5 ns a weight on
 * one core of the development machine with AVX2, 19 with SSE2 lanes
 * (docs/results/2026-12-06-q4-k-quantizer.md).  Wider searches (13 or 21
 * grids) gained under 0.4% of error for 1.3-1.7x the time. */
#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <string.h>

#include "runtime/core/q4_k_impl.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

#if defined(__SSE2__)
/* q4k_lanes_c (q4_k_fit.h) in two SSE2 registers of 4 lanes: each lane's
 * operations and their order are the same, so the same bits. */
static inline void lanes_sse2(int mode, const float *x, float s, float a, float lo, float is, float e[8],
                              float e2[8], float e3[8], uint8_t *q);
#define Q4K_LANES lanes_sse2
#endif
#include "runtime/core/q4_k_fit.h"

#if defined(__SSE2__)
static inline void lanes_sse2(int mode, const float *x, float s, float a, float lo, float is, float e[8],
                              float e2[8], float e3[8], uint8_t *q)
{
    for (int h = 0; h < 2; h++) {
        __m128 acc = _mm_setzero_ps(), acc2 = _mm_setzero_ps(), acc3 = _mm_setzero_ps();
        for (int i = 4 * h; i < Q4K_G; i += 8) {
            const __m128 xv = _mm_loadu_ps(x + i);
            __m128 v = mode == Q4K_CODES ? _mm_mul_ps(_mm_add_ps(xv, _mm_set1_ps(a)), _mm_set1_ps(is))
                                     : _mm_mul_ps(_mm_sub_ps(xv, _mm_set1_ps(lo)), _mm_set1_ps(is));
            v = _mm_min_ps(_mm_max_ps(v, _mm_setzero_ps()), _mm_set1_ps(15.0f));
            const __m128i ci = _mm_cvttps_epi32(_mm_add_ps(v, _mm_set1_ps(0.5f)));
            const __m128 c = _mm_cvtepi32_ps(ci);
            if (mode == Q4K_CODES) {
                const __m128 r = _mm_sub_ps(xv, _mm_sub_ps(_mm_mul_ps(c, _mm_set1_ps(s)), _mm_set1_ps(a)));
                acc = _mm_add_ps(acc, _mm_mul_ps(r, r));
                if (q) {
                    int32_t cs[4];
                    _mm_storeu_si128((__m128i *)cs, ci);
                    for (int k = 0; k < 4; k++) q[i + k] = (uint8_t)cs[k];
                }
            } else {
                acc = _mm_add_ps(acc, c);
                acc2 = _mm_add_ps(acc2, _mm_mul_ps(c, c));
                acc3 = _mm_add_ps(acc3, _mm_mul_ps(c, xv));
            }
        }
        _mm_storeu_ps(e + 4 * h, acc);
        if (mode == Q4K_LINE) {
            _mm_storeu_ps(e2 + 4 * h, acc2);
            _mm_storeu_ps(e3 + 4 * h, acc3);
        }
    }
}
#endif

void moe_q4_k_heads(const void *blk, float d[8], float m[8])
{
    const unsigned char *b = blk;
    uint16_t h[2];
    memcpy(h, b, 4);
    const float D = moe_f16_to_f32(h[0]), M = moe_f16_to_f32(h[1]);
    uint64_t sc, mn;
    moe_q4_k_scales(b + 4, &sc, &mn);
    for (int j = 0; j < Q4K_NG; j++) {
        d[j] = D * (float)((sc >> (8 * j)) & 63u);
        m[j] = -(M * (float)((mn >> (8 * j)) & 63u));
    }
}

bool moe_q4_k_block_portable(const float *x, unsigned char head[Q4K_HEAD], uint8_t q[MOE_Q4_K_BLOCK])
{
    return q4k_block(x, head, q);
}

bool moe_q4_k_has_avx2(void)
{
    return __builtin_cpu_supports("avx2"); /* the features are read before main */
}

bool moe_q4_k_quantize_row_with(moe_q4_k_block_fn block, void *dst, const float *src, size_t n)
{
    unsigned char *b = dst;
    MOE_ASSERT(n % MOE_Q4_K_BLOCK == 0);
    if (moe_k_quant_row_bad(src, n)) return false;
    for (size_t o = 0; o < n; o += MOE_Q4_K_BLOCK, b += MOE_Q4_K_BYTES) {
        uint8_t q[MOE_Q4_K_BLOCK];
        if (!block(src + o, b, q)) return false;
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 32; k++)
                b[Q4K_HEAD + 32 * c + k] = (unsigned char)(q[64 * c + k] | q[64 * c + 32 + k] << 4);
    }
    return true;
}

bool moe_quantize_row_q4_k(void *dst, const float *src, size_t n)
{
    return moe_q4_k_quantize_row_with(moe_q4_k_has_avx2() ? moe_q4_k_block_avx2 : moe_q4_k_block_portable, dst,
                                      src, n);
}
