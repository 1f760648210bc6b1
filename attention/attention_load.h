/* attention_load.h - a K or V row's values as the fast attention's
 * kernels widen them (attention_avx2.c, attention_avx512.c): 8 at a time
 * in registers, and one at a time for the tails, each the reference's
 * value exactly (attention_avx2.c says how). */
#pragma once

#include <immintrin.h>

#include "attention/attention.h"
#include "runtime/cpu/simd_avx2.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* 8 values of a row of dtype dt from element i; s256: 2^8 times the row's
 * scale (fp8 only). */
AVX2 INLINE __m256 att_load8(const void *row, const enum moe_dtype dt, int i, __m256 s256)
{
    if (dt == MOE_DTYPE_F32) return _mm256_loadu_ps((const float *)row + i);
    if (dt == MOE_DTYPE_F8E4M3) {
        const __m128i b = _mm_loadl_epi64((const __m128i *)((const uint8_t *)row + i));
        return _mm256_mul_ps(_mm256_cvtph_ps(moe_e4m3x8_half(b, 1)), s256);
    }
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (dt == MOE_DTYPE_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* Value i of a row (the tails); s: the row's scale (fp8 only). */
INLINE float att_load1(const void *row, const enum moe_dtype dt, int i, float s)
{
    if (dt == MOE_DTYPE_F32) return ((const float *)row)[i];
    if (dt == MOE_DTYPE_F8E4M3) return moe_fp8_e4m3_to_f32(((const uint8_t *)row)[i]) * s;
    if (dt == MOE_DTYPE_BF16) return moe_bf16_to_f32(((const uint16_t *)row)[i]);
    return moe_f16_to_f32(((const uint16_t *)row)[i]);
}


/* One instance per dtype, so the loaders' branches fold away. */
#define KV_DTYPE_SWITCH(dt, CALL)                                                                            \
    switch (dt) {                                                                                            \
    case MOE_DTYPE_F32: CALL(MOE_DTYPE_F32); break;                                                          \
    case MOE_DTYPE_F16: CALL(MOE_DTYPE_F16); break;                                                          \
    case MOE_DTYPE_BF16: CALL(MOE_DTYPE_BF16); break;                                                        \
    case MOE_DTYPE_F8E4M3: CALL(MOE_DTYPE_F8E4M3); break;                                                    \
    default: MOE_ASSERT(!"attention_fast: the KV cache must be F32, F16, BF16 or F8E4M3");               \
    }
