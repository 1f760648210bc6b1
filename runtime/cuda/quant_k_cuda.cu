/* quant_k_cuda.cu - the K-quants of --quantize on the CUDA backend, for
 * matrices whose rows are multiples of 256: Q4_K (q4, q4_k_m) and Q6_K
 * (q4_k_m) planes (runtime/core/tensor.h) made on the device by the CPU's
 * own fit of a block (runtime/core/q4_k_fit.h, runtime/core/q6_k_fit.h),
 * so the bytes are those the CPU backend makes.  This file is compiled
 * with --fmad=false (CMakeLists.txt): the fits' products and sums must
 * each round on their own, as on the CPU, or the chosen codes and scales
 * could differ.  One thread per block of 256 values, its values and codes
 * in local memory; each thread writes its block's code bytes and its head
 * (Q4_K: the 128 bytes of nibbles in runs of 32, byte i of a run holding
 * element i low, i + 16 high, and the 16-byte head; Q6_K: the 192 bytes
 * of moe_q6_k_plane_codes and the 18-byte tail). */
#include <cuda_fp16.h>

#include "runtime/core/q4_k_fit.h"
#include "runtime/core/q6_k_fit.h"
#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_util.h"

/* One block of 256 values x into its code bytes c and head h (false: d
 * past f16's range). */
template <enum moe_dtype DT> static __device__ bool k_block(const float *x, uint8_t *c, uint8_t *h)
{
    uint8_t q[256];
    if (DT == MOE_DTYPE_Q6_K) {
        uint16_t dh;
        if (!q6k_block(x, (int8_t *)h, &dh, q)) return false;
        memcpy(h + Q6K_NSUB, &dh, 2);
        moe_q6_k_plane_codes(q, c);
        return true;
    }
    if (!q4k_block(x, h, q)) return false;
    for (int r = 0; r < MOE_Q4_K_BLOCK / 32; r++)
        for (int i = 0; i < 16; i++) c[16 * r + i] = (uint8_t)(q[32 * r + i] | q[32 * r + i + 16] << 4);
    return true;
}

template <enum moe_dtype DT>
static __global__ void quantize_k_kernel(uint8_t *codes, uint8_t *heads, const void *src, enum moe_dtype dt,
                                         size_t n_blocks, int *bad)
{
    /* bytes a block: of codes, of head */
    constexpr size_t cb = DT == MOE_DTYPE_Q6_K ? 192 : 128, hb = DT == MOE_DTYPE_Q6_K ? MOE_Q6_K_TAIL : Q4K_HEAD;
    for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < n_blocks;
         b += (size_t)gridDim.x * blockDim.x) {
        float x[256];
        bool finite = true;
        for (int i = 0; i < 256; i++) {
            x[i] = moe_ld(src, dt, b * 256 + i);
            finite = finite && isfinite(x[i]);
        }
        if (!finite || !k_block<DT>(x, codes + b * cb, heads + b * hb)) *bad = 1;
    }
}

extern "C" enum moe_status moe_ops_quantize_k_cuda(cudaStream_t st, enum moe_dtype to, void *dst, const void *src,
                                                   enum moe_dtype dt, size_t n, int *bad)
{
    if (n % 256 || (to != MOE_DTYPE_Q4_K && to != MOE_DTYPE_Q6_K) ||
        (dt != MOE_DTYPE_F32 && dt != MOE_DTYPE_F16 && dt != MOE_DTYPE_BF16))
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA quantize: %zu %s values to %s", n, moe_dtype_name(dt),
                        moe_dtype_name(to));
    if (n == 0) return MOE_OK;
    const size_t nb = n / 256;
    uint8_t *h = (uint8_t *)dst + moe_planes_values_bytes(to, 1, n);
    if (to == MOE_DTYPE_Q6_K)
        quantize_k_kernel<MOE_DTYPE_Q6_K><<<moe_cuda_blocks(nb, 128), 128, 0, st>>>((uint8_t *)dst, h, src, dt, nb, bad);
    else
        quantize_k_kernel<MOE_DTYPE_Q4_K><<<moe_cuda_blocks(nb, 128), 128, 0, st>>>((uint8_t *)dst, h, src, dt, nb, bad);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
