/* cuda_mma_ptx.cuh - the three tensor-core PTX instructions the CUDA
 * kernels issue, each as one device function around its inline asm
 * (used only by runtime/cuda/cuda_mma.cuh, which documents the fragment
 * layouts):
 *   ptx_mma_m16n8k16_f32_bf16 / _f16  mma.sync.aligned.m16n8k16.row.col
 *                                      with fp32 accumulators, d += a b
 *   ptx_ldmatrix_x2_trans              ldmatrix.sync.aligned.m8n8.x2.trans
 *                                      .shared.b16
 * A host build that cannot run PTX provides a header of this name ahead
 * of this one on its include path. */
#pragma once

#include <stdint.h>

static __device__ __forceinline__ void ptx_mma_m16n8k16_f32_bf16(float *d, const uint32_t *a, uint32_t b0,
                                                                 uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void ptx_mma_m16n8k16_f32_f16(float *d, const uint32_t *a, uint32_t b0,
                                                                uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void ptx_ldmatrix_x2_trans(uint32_t *r, const void *row)
{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}
