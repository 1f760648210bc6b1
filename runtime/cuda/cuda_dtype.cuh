/* cuda_dtype.cuh - element loads and stores by runtime dtype, shared by the
 * kernels.  Weights and KV entries are F32, F16 or BF16, or (the fp8 KV
 * cache, kvcache.h) E4M3 bytes loaded as their values, which the attention
 * kernels multiply by the row's scale; kernels compute in fp32.  Narrowing
 * rounds to nearest even (as moe_convert_from_f32 does); E4M3 rows are
 * written by the K/V store's own kernel (attention_cuda.cu). */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "runtime/core/tensor.h"

/* Element i of p (dtype dt) as fp32. */
__device__ __forceinline__ float moe_ld(const void *p, enum moe_dtype dt, size_t i)
{
    if (dt == MOE_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == MOE_DTYPE_F16) return __half2float(((const __half *)p)[i]);
    if (dt == MOE_DTYPE_F8E4M3) return moe_fp8_e4m3_to_f32(((const uint8_t *)p)[i]); /* unscaled */
    return ((const float *)p)[i];
}

__device__ __forceinline__ void moe_st(void *p, enum moe_dtype dt, size_t i, float v)
{
    if (dt == MOE_DTYPE_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == MOE_DTYPE_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
}

__device__ __forceinline__ float moe_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float moe_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
