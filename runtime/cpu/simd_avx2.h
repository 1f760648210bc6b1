/* simd_avx2.h - small AVX2 pieces shared by the fast GEMM (gemm_avx2.c)
 * and the fast attention's kernels (attention/attention_avx2.c).  Include
 * only from files whose functions are compiled for AVX2 + FMA + F16C
 * (each function here carries that target itself). */
#pragma once

#include <immintrin.h>

#include "runtime/cpu/gemm_fast_impl.h"

/* Fixed order: (lo + hi) halves, then pairs, then the last two. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) float moe_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 8 E4M3 bytes in the low half of b as the f16s of their values / 2^8
 * (gemm_fast_impl.h, MOE_FP8_F16_MASK), ready for F16C.  nan: the NaN
 * bytes (0x7F, 0xFF) too, as f16 NaNs: the trick alone reads them as
 * +-480 (exponent 1111, mantissa 111: bits 7-13 all set), and adding 2^7
 * carries into bit 14 exactly for those, which then sets the f16
 * exponent's top bit (0x7F80: a NaN); every other byte leaves bit 14 clear. */
static inline __attribute__((always_inline, target("avx2,fma,f16c"))) __m128i moe_e4m3x8_half(__m128i b, int nan)
{
    const __m128i t = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16(MOE_FP8_F16_MASK));
    if (!nan) return t;
    return _mm_or_si128(t, _mm_and_si128(_mm_add_epi16(t, _mm_set1_epi16(0x80)), _mm_set1_epi16(0x4000)));
}
