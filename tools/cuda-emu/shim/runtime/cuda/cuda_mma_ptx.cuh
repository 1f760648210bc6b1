/* The emulator's runtime/cuda/cuda_mma_ptx.cuh: found ahead of the
 * product's (shim/ comes first on the include path, build.sh), it gives
 * the same three device functions, each a warp collective written from
 * the PTX ISA (emu_mma.h) instead of inline asm. */
#pragma once

#include <stdint.h>

static inline void ptx_mma_m16n8k16_f32_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    emu_mma_m16n8k16_f32_bf16(d, a, b0, b1);
}

static inline void ptx_mma_m16n8k16_f32_f16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    emu_mma_m16n8k16_f32_f16(d, a, b0, b1);
}

static inline void ptx_ldmatrix_x2_trans(uint32_t *r, const void *row) { emu_ldmatrix_x2_trans(r, row); }
