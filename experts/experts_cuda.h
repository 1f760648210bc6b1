/* experts_cuda.h - launchers of the expert kernels (experts/experts*_cuda.cu): the
 * CUDA twins of experts.h.  Included only by CUDA code and the CUDA
 * backend; conventions in runtime/cuda/cuda_util.h. */
#pragma once

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "experts/experts.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- experts/experts_cuda.cu ---- */
enum moe_status moe_experts_swiglu_cuda(cudaStream_t st, float *g, const float *u, size_t n);
/* Decode path: no host synchronisation.  h (T*K, F) fp32 scratch, ye (T*K, D)
 * fp32 scratch, xg (T*K, D) and hp (T*K, F) fp32 scratch for act-order
 * experts (ex->cols, on the device: expert e's input column order at
 * cols[2e] = cols[0] + e*D, its down matrix's at cols[2e + 1] = cols[1] +
 * e*F; NULL otherwise), active (E + 1) int32 scratch (the experts with rows);
 * gu (Ew, 2F, D) stacked in dt, dn (Ew, D, F) in ddt (--quantize q4_k_m
 * may keep the down projections in another dtype; a dtype kept as planes:
 * each stack as planes, runtime/core/tensor.h); expert e's weights are at place
 * wmap[e] of the stacks (device (E); wmap NULL: e, Ew = E), and an expert
 * with wmap[e] < 0 is skipped (its rows of h and ye are left as they are);
 * ex's biases (by e) and activation (model.h; ex may be NULL: none). */
enum moe_status moe_experts_ffn_small_cuda(cudaStream_t st, float *h, float *ye, float *xg, float *hp, const float *x,
                                           const struct moe_dispatch *plan, int32_t *active,
                                           const int32_t *wmap, int Ew, const void *gu,
                                           const void *dn, const struct moe_expert_weights *ex,
                                           enum moe_dtype dt, enum moe_dtype ddt, int T, int K, int D, int F,
                                           int E);
/* Grouped path pieces: xe (T*K, D) in dt (F16/BF16) = x rows in perm order
 * (cols (E, D): act-order experts' input column orders, each row's
 * expert's; NULL none); h (n, F) = act(gu[:, :F] (+ b_gate), gu[:, F:] (+
 * b_up)) in dt from gu (n, 2F) in dt, the biases of each row's expert
 * (offsets (E+1): the plan's), in its down matrix's column order for
 * act-order experts (ex->cols). */
enum moe_status moe_experts_gather_half_cuda(cudaStream_t st, void *xe, const float *x,
                                             const int32_t *perm, int n, int K, int D,
                                             enum moe_dtype dt, const int32_t *cols,
                                             const int32_t *offsets, int E);
enum moe_status moe_experts_swiglu_half_cuda(cudaStream_t st, void *h, const void *gu, int n,
                                             int F, enum moe_dtype dt, const int32_t *offsets,
                                             int E, const struct moe_expert_weights *ex);
/* dst (rows, K) bf16 = the planes src (rows of K values in dt: MXFP4,
 * FP8_B128 or Q8_0) widened, rows the stack of E experts' matrices; the
 * experts whose counts[e] is 0 are skipped (counts NULL: none). */
enum moe_status moe_experts_widen_cuda(cudaStream_t st, void *dst, const void *src,
                                       enum moe_dtype dt, size_t rows, size_t K, int E,
                                       const int32_t *counts);
/* dst (rows, K) bf16 = rows of planes whose values are at `values` and
 * scales at `scales` (a slice of a matrix's rows) widened. */
enum moe_status moe_planes_widen_cuda(cudaStream_t st, void *dst, const void *values, const void *scales,
                                      enum moe_dtype dt, size_t rows, size_t K);
/* Tensor-core grouped GEMMs driven from the device (experts/experts_mma_cuda.cu).
 * tiles: the step's tile list, moe_expert_mma_tile_ints(n, E) int32s, made
 * by moe_experts_mma_tiles_cuda from the plan's counts and offsets: each
 * expert e with rows and wmap[e] >= 0 (wmap NULL: place e) cut into tiles
 * of MOE_EXPERT_MMA_BM rows.  Rows are in expert order; each tile
 * multiplies by the matrix of its place in a stack of Ew; at BF16 or F16,
 * the weights in at or (at BF16) MXFP4 / FP8_B128 planes; rows of experts
 * without a tile are left as they are.  fp32 sums.
 * moe_experts_mma_gate_up_cuda: row r of the step is x row perm[r] / K,
 * read from x (T, D) fp32 (16-byte aligned) through the plan's perm and
 * rounded to at as the grouped path's gather rounds it (no gathered copy);
 * h (n, F) in at = moe_experts_act(gate + b_gate, up + b_up) of its
 * products with the gate+up stack gu ((2F, D) a place, gate rows first):
 * the SwiGLU fused, with ex's biases (by expert) and activation (ex NULL:
 * none).
 * moe_experts_mma_down_cuda: ye (n, D) in at = h (n, F) in at times the
 * (D, F) matrices of dn.  D and F multiples of 8 (of the block for
 * planes), the output width (F, D) even. */
#define MOE_EXPERT_MMA_BM 64
static inline size_t moe_expert_mma_tile_ints(int n, int E)
{
    if (n < 0 || E <= 0) return 0;
    const size_t tiles = (size_t)n / MOE_EXPERT_MMA_BM + (size_t)(n < E ? n : E) + 1;
    return 1 + 4 * tiles;
}
enum moe_status moe_experts_mma_tiles_cuda(cudaStream_t st, int32_t *tiles,
                                           const struct moe_dispatch *plan, const int32_t *wmap,
                                           int n, int E);
enum moe_status moe_experts_mma_gate_up_cuda(cudaStream_t st, void *h, const float *x, const int32_t *perm,
                                             int K, enum moe_dtype at, const void *gu, enum moe_dtype wt,
                                             int Ew, int F, int D, const int32_t *tiles, int n, int E,
                                             const struct moe_expert_weights *ex);
enum moe_status moe_experts_mma_down_cuda(cudaStream_t st, void *ye, const void *h, enum moe_dtype at,
                                          const void *dn, enum moe_dtype wt, int Ew, int D, int F,
                                          const int32_t *tiles, int n, int E);
/* dst (n, D) fp32: the rows of src (n rows of D in dt: F32, F16 or BF16,
 * in expert order, offsets (E + 1) the experts' first rows) whose expert
 * map places (map[e] >= 0), exactly, b_down (E, D) of the row's expert
 * added when not NULL; the other rows of dst untouched. */
enum moe_status moe_experts_take_rows_cuda(cudaStream_t st, float *dst, const void *src, enum moe_dtype dt,
                                           const int32_t *map, const int32_t *offsets, int E, int n, int D,
                                           const float *b_down);
/* out (T, D) = sum_k w[t,k] * (ye[pos[t*K+k]] (+ b_down of its expert)) in
 * k order; ye in ydt (F32, F16 or BF16); b_down (E, D) or NULL. */
enum moe_status moe_experts_combine_cuda(cudaStream_t st, float *out, const void *ye,
                                         enum moe_dtype ydt, const float *w, const int32_t *pos,
                                         int T, int K, int D, const int32_t *offsets, int E,
                                         const float *b_down);

#ifdef __cplusplus
}
#endif
