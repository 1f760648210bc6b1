/* gemm_fast.h - the fast CPU kernels beside the reference (runtime/cpu/gemm.h).
 *
 * Same contract as moe_gemm_cpu: y (T, N) = x (T, Din) . W^T (+ b), W (N, Din)
 * row-major in F32, F16, BF16, Q8_0, MXFP4, FP8_B128, Q4_1, Q4_G32,
 * Q4_G128, Q4_K, Q5_K or Q6_K read in place.  The
 * fast kernels convert weights to fp32 in registers (bf16: u16 -> u32
 * shifted left by 16; f16: F16C; MXFP4: a nibble through a table, times
 * the block's scale; FP8_B128: an E4M3 byte made an f16 by a shift and a
 * mask, F16C, times the block's scale) and never into memory, and compute
 * a register-blocked tile of up to 4 input rows x several weight rows (up
 * to 16 when there is one input row, as in decode), so one pass over a
 * weight row serves every input row of the tile.
 *
 * Numerics: each output is an 8-lane (AVX2) or 16-lane (AVX-512) FMA
 * accumulation over k in order, a fixed horizontal sum, then the Din tail
 * in order, then the bias; over bf16 weights each block of 2W inputs (W
 * lanes) is taken as its W even then its W odd elements (gemm_eo.h
 * explains why).  The sum order differs from the reference (within
 * fp32 tolerance of it) but is the same for every output whatever the tile,
 * the batch composition or the thread count: rows stay independent and
 * results are bit-identical across batchings, as with the reference.
 *
 * Panels: bf16 weights repacked by moe_gemm_pack_panels into 16-output
 * k-pair panels (MOE_DTYPE_BF16_PANEL, runtime/core/tensor.h) take kernels that
 * broadcast inputs over a tile of panels (gemm_panel.c for AVX-512,
 * gemm_panel_avx2.c for AVX2, giving the same bits):
 * each output is one FMA chain in k order in its own vector lane, no
 * horizontal sum, so these too give a row the same bits alone or in any
 * batch (though not the bits of the natural-layout kernels).  The fast
 * backend packs a model's bf16 matrices at prepare_model
 * (runtime/backend/backend_cpu_pack.c); every entry below takes them as wt.
 *
 * Q8_0: the inputs are quantized to Q8_0 blocks too, as llama.cpp's CPU
 * backend does, and each block of 32 products is an exact integer sum
 * (gemm_q8.c, one kernel set for both, giving the same bits).  This is
 * the one place the fast kernels round more than fp32 does: each input by
 * up to 1/254 of its block's largest magnitude, about what the weights'
 * own quantization moves them (docs/quality.md has the effect on a
 * trained model's outputs).  A row still gives the same bits alone or
 * in any batch.
 *
 * Four-bit weights (Q4_1, Q4_G32, Q4_G128, Q4_K): the inputs are quantized the
 * same way and each run of 32 codes against an input block is an exact
 * integer sum, the group's offset times the sum of the quantized inputs
 * added per group (gemm_q4.c; the AVX-512 set takes AVX512-VNNI's
 * vpdpbusd where the processor has it, the same integer sums, so the same
 * bits): an output is the quantized input row times the exactly
 * dequantized weights, to fp32 rounding.  Same bits alone or in any batch.
 *
 * Q6_K: the inputs quantized the same way, each run of 32 six-bit codes
 * against an input block an exact integer sum scaled by its two int8
 * sub-block scales (gemm_q6_k.c with AVX2, gemm_q6_k_avx512.c for the
 * wider sets, two runs a zmm: the same integer lane sums, so the same bits
 * everywhere; the same alone or in any batch).  Q4_K likewise
 * (gemm_q4_k.c, gemm_q4_k_avx512.c), and Q5_K, Q4_K's route with each
 * group's fifth bits joined to its nibbles (gemm_q5_k.c,
 * gemm_q5_k_avx512.c).
 *
 * AMX (the `amx` sets): products over bf16 panels run on the tile units
 * (gemm_amx.c), each input row split once per call into bf16 parts: two
 * (`amx`: within 2^-16 of each input), three (`amx-exact`: the input
 * exactly) or one (`amx-bf16`: the input rounded to bf16, within 2^-8), a
 * tile product per part and k step, accumulated in fp32; a row's bits the
 * same alone or in any batch (but not the AVX-512 panel kernels' bits).
 * Q8_0 and four-bit weights, where the processor has AMX-INT8, run on the
 * int8 tiles (gemm_q8_amx.c, gemm_q4_amx.c; fewer than 9 (Q8_0) or 8 input rows on
 * AVX512-VNNI): inputs quantized as above, each block's (run's) 32
 * products one exact integer sum, scaled and added block by block, a
 * four-bit group's offset after its runs (the AVX-512 set's 8 lane sums
 * are not kept: other bits than AVX2/AVX-512, the same alone or in any
 * batch).
 * Detection asks Linux for the tile state (arch_prctl ARCH_REQ_XCOMP_PERM)
 * once; refused, the processor counts as AVX-512 (or AVX512-BF16).  Every
 * other format runs the AVX-512 set's kernels.
 *
 * AVX512-BF16 (the `avx512-bf16` set): products over bf16 panels by
 * vdpbf16ps (gemm_panel_dp.c), each input row rounded to bf16 once per
 * call (the split above, one part: within 2^-8), one vdpbf16ps chain
 * over the k-pairs per output; the same alone or in any batch (not the
 * FMA kernels' bits, nor the tiles').  Every other format runs the
 * AVX-512 set's kernels.
 *
 * Kernels are compiled with __attribute__((target(...))) and chosen at run
 * time by what the processor supports, so the build stays portable; where
 * no kernel set runs, the backend uses the reference. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_cpu_isa {
    MOE_CPU_ISA_REF,     /* no fast kernels: plain C reference */
    MOE_CPU_ISA_AVX2,    /* AVX2 + FMA + F16C */
    MOE_CPU_ISA_AVX512,  /* AVX-512 F/BW/VL + the above */
    MOE_CPU_ISA_AVX512_BF16, /* the same, bf16 products by AVX512-BF16's vdpbf16ps, inputs
                              * rounded to bf16 (for processors without AMX tiles) */
    MOE_CPU_ISA_AMX,     /* AMX-TILE/BF16 + AVX512-BF16 + the above, the tiles permitted:
                          * inputs of bf16 products in two bf16 parts (16 bits) */
    MOE_CPU_ISA_AMX_EXACT, /* the same, inputs in three parts (exact) */
    MOE_CPU_ISA_AMX_BF16,  /* the same, inputs rounded to bf16 */
};

/* The best kernel set this processor runs (a backend may be told to use a
 * narrower one: moe_backend_opts.cpu_isa_max), MOE_CPU_ISA_AMX where the
 * tiles run, else MOE_CPU_ISA_AVX512_BF16 where AVX512-BF16 does.  Asks
 * Linux for the tile state the first time. */
enum moe_cpu_isa moe_cpu_isa_detect(void);
/* The cap backends get unless told otherwise: AVX-512.  The AMX sets
 * speed up prefill 1.5-2.3x end to end but batch-1 decode runs up to 11%
 * slower where the weights fit the L3 (two bf16 parts per input: twice the
 * FMAs; level where they stream from memory), and a row's bits must not depend on
 * its batch, so one set serves both: AMX is asked for
 * (moe_backend_opts.cpu_isa_max, MOERUN_CPU_ISA=amx). */
#define MOE_CPU_ISA_DEFAULT_CAP MOE_CPU_ISA_AVX512
/* The set a backend capped at cap runs here: the narrower of the two; on
 * an AMX processor, the AMX variant cap names (AMX_EXACT, AMX_BF16); on
 * one without AMX, `amx-bf16` runs as `avx512-bf16` (the same rounding of
 * the inputs) where AVX512-BF16 is there, and the other AMX variants,
 * whose inputs keep more bits than vdpbf16ps would, as `avx512`. */
enum moe_cpu_isa moe_cpu_isa_choose(enum moe_cpu_isa cap);
const char *moe_cpu_isa_name(enum moe_cpu_isa isa);
/* Whether the AMX sets run Q8_0 and four-bit products on the int8 tiles
 * here (AMX-INT8 and AVX512-VNNI beside AMX-BF16, the tiles permitted). */
bool moe_cpu_amx_int8(void);

/* y[t*ldy + n] for t in [0, T), n in [n0, n1), computed by the calling
 * thread alone (for use inside a parallel region).  b may be NULL/absent.
 * isa must not be MOE_CPU_ISA_REF; over MOE_DTYPE_BF16_PANEL weights both
 * kernel sets give the same bits, and slices that start and end on multiples of 16
 * (panel boundaries, or n1 = N) share no work. */
void moe_gemm_fast_rows(enum moe_cpu_isa isa, float *y, size_t ldy, const float *x, size_t ldx,
                        int T, const void *w, enum moe_dtype wt, int Din, int n0, int n1,
                        const struct moe_tensor *b);

/* Inputs split once for many slice products (an AMX set over bf16
 * panels; moe_gemm_split_wanted says when): row r of x as P bf16 part
 * rows at xs + r*lds + j*kp (P = moe_amx_parts(isa), kp = K rounded up to
 * 32, the padding zero), lds = moe_gemm_split_ld(isa, K) = P kp + 32.
 * moe_gemm_split_rows writes rows [r0, r1) (an AMX set only);
 * moe_gemm_split_buffer is the calling thread's space for `rows` such rows
 * (kept until the thread exits, one use at a time; NULL when out of memory
 * or the size overflows).  moe_gemm_fast_rows_split is moe_gemm_fast_rows
 * reading the split rows where they are wanted (xs NULL: split there, for
 * that call). */
bool moe_gemm_split_wanted(enum moe_cpu_isa isa, enum moe_dtype wt);
int moe_amx_parts(enum moe_cpu_isa isa);
size_t moe_gemm_split_ld(enum moe_cpu_isa isa, int K);
uint16_t *moe_gemm_split_buffer(enum moe_cpu_isa isa, size_t rows, int K);
void moe_gemm_split_rows(enum moe_cpu_isa isa, uint16_t *xs, size_t lds, const float *x, size_t ldx, int r0,
                         int r1, int K);
/* g[i] = the expert activation of g[i] and u[i] (moe_experts_act in
 * experts/experts.h) for i < n, on 8 lanes (act_fast.c; AVX2 + FMA): e^x
 * within 2 ulps of expf, the rest the reference's IEEE operations. */
void moe_act_row_avx2(float *g, const float *u, int n, float alpha, float limit);
void moe_gemm_fast_rows_split(enum moe_cpu_isa isa, float *y, size_t ldy, const float *x, size_t ldx,
                              const uint16_t *xs, size_t lds, int T, const void *w, enum moe_dtype wt,
                              int Din, int n0, int n1, const struct moe_tensor *b);

/* The whole product, output rows split over the OpenMP team (serial when
 * small).  No scratch, no allocation. */
void moe_gemm_fast(enum moe_cpu_isa isa, float *y, int ldy, const float *x, int ldx,
                   const void *w, enum moe_dtype wt, int N, int Din, int T,
                   const struct moe_tensor *b);

/* n <= 4 products of one input x (T, Din) in one parallel region:
 * y[i] (T, N[i]) [row stride N[i]] = x . W_i^T (+ b[i]); b may be NULL. */
void moe_gemm_fast_multi(enum moe_cpu_isa isa, int n, float *const *y, const float *x, int Din,
                         const void *const *w, const enum moe_dtype *wt, const int *N, int T,
                         const struct moe_tensor *const *b);

/* Bytes of an (N, K) matrix in panels (N rounded up to a multiple of 16,
 * 32*K bytes per panel); false when K is odd, a size is not positive or
 * larger than INT32_MAX, or the product overflows. */
bool moe_gemm_panel_bytes(int64_t N, int64_t K, size_t *out);
/* dst (moe_gemm_panel_bytes(N, K) bytes, 64-byte aligned; new contents) =
 * the bf16 matrix w (N, K) row-major, K even, in panels, the rows past N
 * zero.  Runs over the OpenMP team for large matrices; AVX-512 transposes
 * where the processor has them, else scalar (same bytes). */
void moe_gemm_pack_panels(void *dst, const void *w, int N, int K);

/* Reads the n bytes at p once (a pure read stream, for measuring memory
 * bandwidth); returns a value depending on every byte so the reads stay. */
uint64_t moe_read_sweep(const void *p, size_t n);

#ifdef __cplusplus
}
#endif
