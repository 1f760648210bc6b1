/* The tensor-core instructions of attention/attention_mma_cuda.cu, emulated
 * as warp collectives: each lane leaves its fragment registers in the
 * warp's slots, a barrier, each lane computes its own outputs from all 32
 * lanes' registers, a barrier (the slots are free again).
 *
 * The layouts are taken from NVIDIA's PTX ISA, not from the kernel, so that
 * running the kernel here checks its fragment bookkeeping independently:
 *
 * "Matrix Fragments for mma.m16n8k16 with floating point type" (section
 * 9.7.14.5.8 of the PTX ISA 8.x/9.0), .f16/.bf16 multiplicands, .f32
 * accumulators; groupID g = %laneid >> 2, threadID_in_group t = %laneid % 4;
 * each .f16x2 register holds two elements, the lower-numbered one in the
 * low 16 bits:
 *   A (16 x 16, .row), a0..a7 in four registers:
 *       row = g for a_i with i in {0, 1, 4, 5}, g + 8 otherwise
 *       col = 2t + (i & 1) for i < 4, 2t + (i & 1) + 8 for i >= 4
 *   B (16 x 8, .col), b0..b3 in two registers:
 *       row = 2t + (i & 1) for i < 2, 2t + (i & 1) + 8 for i >= 2
 *       col = g
 *   C, D (16 x 8, .f32), c0..c3:
 *       row = g for i < 2, g + 8 otherwise;  col = 2t + (i & 1)
 *
 * "Warp-level matrix load instruction: ldmatrix" (9.7.14.5.15), .m8n8 .b16:
 * for .x2, threads 0-7 hold the addresses of the eight rows of the first
 * matrix and threads 8-15 those of the second (threads 16-31 are not
 * read); each row is 16 contiguous bytes, 16-byte aligned.  Register j of
 * every thread receives a fragment of matrix j: row %laneid >> 2, columns
 * 2 (%laneid % 4) and + 1 (the first in the low half), four threads per
 * row.  .trans loads the matrix in column-major format: the addresses name
 * its columns, so element (r, c) is element r of the row whose address
 * thread 8j + c gave.
 *
 * Products are exact in fp32 (bf16 x bf16 and f16 x f16 fit the 24-bit
 * significand); the sum over k is fp32 in k order, then C is added: the
 * hardware's order of summation is not specified, so agreement with a
 * device is to fp32 rounding, not bit for bit. */
#pragma once
#include <cstdio>
#include <cstdlib>
#include "runtime/core/tensor.h"

static inline void emu_need_full_warp(const char *what)
{
    if (blockDim.x - (threadIdx.x & ~31u) < 32) {
        fprintf(stderr, "emu: %s in a warp of fewer than 32 threads\n", what);
        abort();
    }
}

static inline float emu_half_of(uint32_t r, int hi, bool bf16)
{
    const uint16_t u = (uint16_t)(hi ? r >> 16 : r);
    return bf16 ? moe_bf16_to_f32(u) : moe_f16_to_f32(u);
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
 * {d0..d3}, {a0..a3}, {b0, b1}, {d0..d3}: D = A B + C with C = D in. */
static inline void emu_mma_m16n8k16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1, bool bf16)
{
    emu_need_full_warp("mma.sync");
    emu_warp &w = *emu_ctx->warps[threadIdx.x >> 5];
    const unsigned lane = threadIdx.x & 31;
    uint32_t *mine = w.frag[lane];
    for (int r = 0; r < 4; r++) mine[r] = a[r];
    mine[4] = b0;
    mine[5] = b1;
    w.bar.arrive_and_wait();
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < 32; l++) {
        const unsigned g = l >> 2, t = l & 3;
        const uint32_t *f = w.frag[l];
        for (int i = 0; i < 8; i++) {
            const unsigned row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            const unsigned col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = emu_half_of(f[i >> 1], i & 1, bf16);
        }
        for (int i = 0; i < 4; i++) {
            const unsigned row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
            B[row][g] = emu_half_of(f[4 + (i >> 1)], i & 1, bf16);
        }
    }
    w.bar.arrive_and_wait();
    const unsigned g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const unsigned row = i < 2 ? g : g + 8, col = 2 * t + (i & 1);
        float s = 0.0f;
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        d[i] += s; /* C and D share the layout: c_i is this lane's d[i] */
    }
}
static inline void emu_mma_m16n8k16_f32_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    emu_mma_m16n8k16(d, a, b0, b1, true);
}
static inline void emu_mma_m16n8k16_f32_f16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    emu_mma_m16n8k16(d, a, b0, b1, false);
}

/* ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {r0, r1}, [row] */
static inline void emu_ldmatrix_x2_trans(uint32_t *r, const void *row)
{
    emu_need_full_warp("ldmatrix");
    emu_warp &w = *emu_ctx->warps[threadIdx.x >> 5];
    const unsigned lane = threadIdx.x & 31;
    w.rows[lane] = row;
    w.bar.arrive_and_wait();
    for (unsigned l = 0; l < 16; l++)
        if ((uintptr_t)w.rows[l] & 15) {
            fprintf(stderr, "emu: ldmatrix: lane %u's row address %p is not 16-byte aligned\n", l, w.rows[l]);
            abort();
        }
    const unsigned rr = lane >> 2, c0 = 2 * (lane & 3);
    for (int j = 0; j < 2; j++) {
        uint32_t v = 0;
        for (int i = 0; i < 2; i++) { /* element (rr, c0 + i): element rr of row c0 + i */
            const uint16_t *src = (const uint16_t *)w.rows[8 * j + c0 + i];
            v |= (uint32_t)src[rr] << (16 * i);
        }
        r[j] = v;
    }
    w.bar.arrive_and_wait();
}
