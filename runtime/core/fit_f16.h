/* fit_f16.h - f16 rounding and widening that the block quantizers shared
 * by the CPU and the CUDA backend (q4_k_fit.h, q6_k_fit.h) call on either
 * side: round to nearest even, the same bits from the host's
 * moe_f32_to_f16 and the device's __float2half_rn. */
#pragma once

#include <stdint.h>

#include "runtime/core/tensor.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define MOE_FIT_FN static inline __host__ __device__
#else
#define MOE_FIT_FN static inline
#endif

MOE_FIT_FN uint16_t moe_fit_f16(float f)
{
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(f));
#else
    return moe_f32_to_f16(f);
#endif
}
MOE_FIT_FN float moe_fit_f32(uint16_t h)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return moe_f16_to_f32(h);
#endif
}
