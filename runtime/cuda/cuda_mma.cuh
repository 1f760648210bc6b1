/* cuda_mma.cuh - the tensor-core instructions the CUDA kernels use, as
 * device functions: mma.sync m16n8k16 with fp32 accumulators for bf16 and
 * f16 operands (mma_half<HT>::mma), the pair packing of its A operand
 * (mma_half<HT>::pack) and ldmatrix .x2 .trans.  Included only by .cu files
 * (attention/attention_mma_cuda.cu, experts/experts_mma_cuda.cu).
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
 * floating point type"; g = lane >> 2, t = lane & 3; a 32-bit register
 * holds two values, the lower-numbered in its low half):
 *   A (16 x 16, row):  a[0] row g, cols 2t, 2t+1;  a[1] row g+8, same cols;
 *                      a[2] row g, cols 2t+8, 2t+9; a[3] row g+8, same cols
 *   B (16 x 8, col):   b0 k 2t, 2t+1 of col g;  b1 k 2t+8, 2t+9 of col g
 *   C, D (16 x 8):     d[0], d[1] row g, cols 2t, 2t+1; d[2], d[3] row g+8
 * The instructions themselves are runtime/cuda/cuda_mma_ptx.cuh. */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "runtime/cuda/cuda_mma_ptx.cuh"

template <class HT> struct mma_half;
template <> struct mma_half<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &h, 4);
        return u;
    }
    static __device__ __forceinline__ void mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        ptx_mma_m16n8k16_f32_bf16(d, a, b0, b1);
    }
};
template <> struct mma_half<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        const __half2 h = __floats2half2_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &h, 4);
        return u;
    }
    static __device__ __forceinline__ void mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        ptx_mma_m16n8k16_f32_f16(d, a, b0, b1);
    }
};

/* Two 8x8 b16 matrices transposed from shared memory: lanes 0-7 name the
 * rows of the first, 8-15 those of the second. */
static __device__ __forceinline__ void ldmatrix_x2_trans(uint32_t *r, const void *row)
{
    ptx_ldmatrix_x2_trans(r, row);
}
