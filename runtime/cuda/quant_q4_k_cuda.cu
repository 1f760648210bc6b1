/* quant_q4_k_cuda.cu - --quantize q4 on the CUDA backend for matrices
 * whose rows are multiples of 256: Q4_K planes (runtime/core/tensor.h)
 * made on the device by the CPU's own fit of a block (runtime/core/q4_k_fit.h),
 * so the bytes are those the CPU backend makes.  This file is compiled
 * with --fmad=false (CMakeLists.txt): the fit's products and sums must
 * each round on their own, as on the CPU, or the chosen codes and scales
 * could differ.  One thread per block of 256 values, its values and codes
 * in local memory; each thread writes its block's 128 code bytes (runs of
 * 32: byte i of a run holds element i low, i + 16 high) and its 16-byte
 * head. */
#include <cuda_fp16.h>

#include "runtime/core/q4_k_fit.h"
#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_util.h"

static __global__ void quantize_q4_k_kernel(uint8_t *codes, uint8_t *heads, const void *src, enum moe_dtype dt,
                                            size_t n_blocks, int *bad)
{
    for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < n_blocks;
         b += (size_t)gridDim.x * blockDim.x) {
        float x[MOE_Q4_K_BLOCK];
        uint8_t q[MOE_Q4_K_BLOCK];
        unsigned char head[Q4K_HEAD];
        bool finite = true;
        for (int i = 0; i < MOE_Q4_K_BLOCK; i++) {
            x[i] = moe_ld(src, dt, b * MOE_Q4_K_BLOCK + i);
            finite = finite && isfinite(x[i]);
        }
        if (!finite || !q4k_block(x, head, q)) {
            *bad = 1;
            continue;
        }
        uint8_t *c = codes + b * (MOE_Q4_K_BLOCK / 2);
        for (int r = 0; r < MOE_Q4_K_BLOCK / 32; r++)
            for (int i = 0; i < 16; i++) c[16 * r + i] = (uint8_t)(q[32 * r + i] | q[32 * r + i + 16] << 4);
        memcpy(heads + b * Q4K_HEAD, head, Q4K_HEAD);
    }
}

extern "C" enum moe_status moe_ops_quantize_q4_k_cuda(cudaStream_t st, void *dst, const void *src,
                                                      enum moe_dtype dt, size_t n, int *bad)
{
    if (n % MOE_Q4_K_BLOCK || (dt != MOE_DTYPE_F32 && dt != MOE_DTYPE_F16 && dt != MOE_DTYPE_BF16))
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA quantize: %zu %s values to Q4_K", n, moe_dtype_name(dt));
    if (n == 0) return MOE_OK;
    const size_t nb = n / MOE_Q4_K_BLOCK;
    quantize_q4_k_kernel<<<moe_cuda_blocks(nb, 128), 128, 0, st>>>((uint8_t *)dst, (uint8_t *)dst + n / 2, src, dt,
                                                                   nb, bad);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
