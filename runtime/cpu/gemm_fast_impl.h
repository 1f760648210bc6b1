/* gemm_fast_impl.h - kernel entry points of each instruction set, private to
 * the fast ops (runtime/cpu/gemm_fast.c chooses among them). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xmmintrin.h>

#include "runtime/core/tensor.h"
#include "runtime/cpu/gemm_fast.h"

void moe_gemm_rows_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                        enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b);
void moe_gemm_rows_avx512(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                          enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b);
/* All T rows against outputs [n0, n1) of Q8_0 weights, the inputs
 * quantized to Q8_0 too: with AVX2 (gemm_q8.c), and with AVX512-VNNI for
 * the AVX-512 kernel set where the processor has it (gemm_q8_vnni.c; the
 * same bits). */
void moe_gemm_rows_q8_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                           int Din, int n0, int n1, const struct moe_tensor *b);
void moe_gemm_rows_q8_vnni(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                           int Din, int n0, int n1, const struct moe_tensor *b);
/* The same for the AMX kernel sets where the processor has AMX-INT8
 * (gemm_q8_amx.c; other bits: each block's sum whole). */
void moe_gemm_rows_q8_amx(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                          int Din, int n0, int n1, const struct moe_tensor *b);
/* All T rows against outputs [n0, n1) of four-bit weights wt (Q4_1,
 * Q4_G32, Q4_G128; Din a multiple of the block), the inputs quantized to
 * int8 blocks as for Q8_0 (gemm_q4.c): with AVX2, and with AVX512-VNNI
 * for the AVX-512 kernel set where the processor has it (the same bits). */
void moe_gemm_rows_q4_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                           enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b);
void moe_gemm_rows_q4_vnni(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                           enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b);
/* The same for the AMX kernel sets where the processor has AMX-INT8
 * (gemm_q4_amx.c; other bits: each run's sum whole). */
void moe_gemm_rows_q4_amx(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                          enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b);
/* All T rows against outputs [n0, n1) of Q4_K weights (Din a multiple of
 * 256), the inputs quantized to int8 blocks of 256 (gemm_q4_k.c): AVX2,
 * for the AVX2 set and for the AVX-512 set without AVX512-VNNI. */
void moe_gemm_rows_q4_k_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w, int Din,
                             int n0, int n1, const struct moe_tensor *b);
/* The same with AVX-512 and AVX512-VNNI instructions for the AVX-512 set
 * where the processor has VNNI (gemm_q4_k_avx512.c; the same bits). */
void moe_gemm_rows_q4_k_avx512(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w, int Din,
                               int n0, int n1, const struct moe_tensor *b);
/* All T rows against outputs [n0, n1) of Q5_K weights (Din a multiple of
 * 256), the inputs quantized to int8 blocks of 256 (gemm_q5_k.c): AVX2,
 * for the AVX2 set (and the others without VNNI); with AVX-512 and
 * AVX512-VNNI instructions for the others where the processor has VNNI
 * (gemm_q5_k_avx512.c; the same bits). */
void moe_gemm_rows_q5_k_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w, int Din,
                             int n0, int n1, const struct moe_tensor *b);
void moe_gemm_rows_q5_k_avx512(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w, int Din,
                               int n0, int n1, const struct moe_tensor *b);
/* All T rows against outputs [n0, n1) of Q6_K weights (Din a multiple of
 * 256), the inputs quantized to int8 blocks of 256 (gemm_q6_k.c): AVX2,
 * for the AVX2 set (and the others without VNNI); with AVX-512 and AVX512-VNNI instructions for the
 * others where the processor has VNNI (gemm_q6_k_avx512.c; the same bits). */
void moe_gemm_rows_q6_k_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w, int Din,
                             int n0, int n1, const struct moe_tensor *b);
void moe_gemm_rows_q6_k_avx512(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w, int Din,
                               int n0, int n1, const struct moe_tensor *b);
/* The four-bit kernels' input row: x (ng groups of nr blocks of 32) as one
 * stream at o of ng parts of 32 + 32 nr bytes: a head of 8 floats (0, S,
 * dx_0 .. dx_{nr-1}, 0 ...), S the sum over the group's blocks in order of
 * dx times the block's code sum (one rounding a step), then the nr blocks'
 * int8 codes (moe_quantize_x_q8); o 32-byte aligned (gemm_q4.c). */
void moe_q4_quantize_input(char *o, const float *x, int ng, int nr);
/* All T rows against outputs [n0, n1) of bf16 weights in panels
 * (MOE_DTYPE_BF16_PANEL; gemm_panel.c). */
void moe_gemm_rows_panel_avx512(float *y, size_t ldy, const float *x, size_t ldx, int T,
                                const void *w, int K, int n0, int n1, const struct moe_tensor *b);
/* The same with AVX2 + FMA, same bits (gemm_panel_avx2.c). */
void moe_gemm_rows_panel_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T,
                              const void *w, int K, int n0, int n1, const struct moe_tensor *b);
/* The same on the AMX tiles over inputs split by moe_gemm_split_rows
 * (gemm_amx.c; other bits). */
void moe_gemm_rows_panel_amx(enum moe_cpu_isa isa, float *y, size_t ldy, const uint16_t *xs, size_t lds,
                             int T, const void *w, int K, int n0, int n1, const struct moe_tensor *b);
/* The same with AVX512-BF16's vdpbf16ps over inputs split into one bf16
 * part (the avx512-bf16 set; gemm_panel_dp.c; other bits). */
void moe_gemm_rows_panel_dp(float *y, size_t ldy, const uint16_t *xs, size_t lds, int T, const void *w, int K,
                            int n0, int n1, const struct moe_tensor *b);
/* Asks Linux to let this process use the AMX tile data state. */
bool moe_amx_permit(void);
/* Outputs of the widest AVX-512 panel tile for T input rows (a multiple of
 * the AVX2 one): slices of panel products are multiples of it. */
int moe_gemm_panel_slice_unit(int T);
/* The calling thread's buffer of at least n floats, 64-byte aligned (input
 * rows for the even/odd kernels, gemm_eo.h, or widened weight panels,
 * gemm_panel.c; one call's use at a time), kept until the thread exits;
 * NULL when out of memory. */
float *moe_gemm_thread_buffer(size_t n);

/* The groups of 16 input rows a chunk of a panel product holds
 * (gemm_k_panel.h, gemm_q8_panel.h): as many slabs of slab bytes as fit
 * budget, 1 to 16, no more than T rows need. */
static inline int moe_panel_groups(int T, size_t slab, size_t budget)
{
    int G = (int)(budget / slab);
    G = G < 1 ? 1 : G > 16 ? 16 : G;
    return G > (T + 15) / 16 ? (T + 15) / 16 : G;
}

/* A panel product's next band, weight rows [n, n + band) of the slice's
 * [n, n1) (row n0 at w, stride wld), prefetched into L2 while the current
 * band's products run: the bands' reads would wait for memory. */
static inline void moe_panel_prefetch(const char *w, size_t wld, int n0, int n, int n1, int band)
{
    if (n >= n1) return;
    const char *nx = w + (size_t)(n - n0) * wld;
    const size_t bytes = (size_t)(n1 - n < band ? n1 - n : band) * wld;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(nx + o, _MM_HINT_T1);
}
uint64_t moe_read_sweep_avx2(const void *p, size_t n);

/* Half of each E8M0 scale, 2^(s-128), as fp32 bits (s = 0 and 1 the
 * subnormals 2^-128 and 2^-127; 255, NaN, never reaches a kernel): the MXFP4
 * kernels widen a block's nibbles to twice their E2M1 values and multiply
 * by this, broadcast straight from memory as Q8_0's f32 scale is. */
#define MOE_E8M0_HALF(s) ((s) == 255 ? 0x7fc00000u : (s) >= 2 ? (uint32_t)((s) - 1) << 23 : 0x00200000u << ((s) & 1))
#define MOE_E8M0_HALF4(s) MOE_E8M0_HALF(s), MOE_E8M0_HALF(s + 1), MOE_E8M0_HALF(s + 2), MOE_E8M0_HALF(s + 3)
#define MOE_E8M0_HALF16(s) MOE_E8M0_HALF4(s), MOE_E8M0_HALF4(s + 4), MOE_E8M0_HALF4(s + 8), MOE_E8M0_HALF4(s + 12)
#define MOE_E8M0_HALF64(s) MOE_E8M0_HALF16(s), MOE_E8M0_HALF16(s + 16), MOE_E8M0_HALF16(s + 32), MOE_E8M0_HALF16(s + 48)
static const uint32_t moe_e8m0_half_bits[256] = {MOE_E8M0_HALF64(0), MOE_E8M0_HALF64(64), MOE_E8M0_HALF64(128),
                                                 MOE_E8M0_HALF64(192)};

/* E4M3 to f16, exactly, for F16C to widen: the byte sign-extended to 16
 * bits and shifted left by 7 puts the sign in bit 15, the exponent in bits
 * 10-13 and the mantissa in bits 7-9; clearing bit 14 (a copy of the sign)
 * leaves the f16 whose value is the E4M3 value / 2^8, normal or subnormal
 * alike (f16's exponent bias is 15, E4M3's 7; a subnormal E4M3 m * 2^-9 is
 * the f16 subnormal m * 2^-17).  The kernels multiply by 2^8 (exact: the
 * E4M3 value, at most 448) then by the block's scale: one rounding of the
 * exact product, the reference's.  (Folding 2^8 into the scale instead
 * would save a multiply but overflow past |scale| 2^120.) */
#define MOE_FP8_F16_MASK ((short)0xbf80)
