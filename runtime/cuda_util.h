/* cuda_util.h - error checking and the launcher interface of the CUDA
 * backend.  Included only by *_cuda.cu files and runtime/backend_cuda.c
 * (the only places allowed to see CUDA headers).
 *
 * Every CUDA runtime and cuBLAS call goes through MOE_CUDA_TRY /
 * MOE_CUBLAS_TRY, which return MOE_ERR_DEVICE with the call's text and the
 * error string; every kernel launch is followed by MOE_CUDA_LAUNCHED(), which
 * checks cudaGetLastError.  Launchers are `extern "C"`, take a stream and
 * device pointers, and return enum moe_status.  Kernels check their bounds;
 * launchers check shapes that would make a kernel read out of range. */
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "runtime/backend.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

const char *moe_cublas_status_str(cublasStatus_t s);

/* The file name without its directories, for messages. */
static inline const char *moe_src_name(const char *path)
{
    const char *s = path;
    for (const char *p = path; *p; p++)
        if (*p == '/') s = p + 1;
    return s;
}

#define MOE_CUDA_TRY(call)                                                                   \
    do {                                                                                     \
        cudaError_t moe_e_ = (call);                                                         \
        if (moe_e_ != cudaSuccess)                                                           \
            return moe_fail(MOE_ERR_DEVICE, "%s:%d: %s: %s", moe_src_name(__FILE__), __LINE__, #call,      \
                            cudaGetErrorString(moe_e_));                                     \
    } while (0)

#define MOE_CUBLAS_TRY(call)                                                                 \
    do {                                                                                     \
        cublasStatus_t moe_b_ = (call);                                                      \
        if (moe_b_ != CUBLAS_STATUS_SUCCESS)                                                 \
            return moe_fail(MOE_ERR_DEVICE, "%s:%d: %s: %s", moe_src_name(__FILE__), __LINE__, #call,      \
                            moe_cublas_status_str(moe_b_));                                  \
    } while (0)

/* After every <<<>>> launch. */
#define MOE_CUDA_LAUNCHED() MOE_CUDA_TRY(cudaGetLastError())

/* Grid size for n items in blocks of b, capped so 1-D grids stay legal
 * (kernels use grid-stride loops). */
static inline unsigned moe_cuda_blocks(size_t n, unsigned b)
{
    size_t g = (n + b - 1) / b;
    if (g == 0) g = 1;
    return g > 65535u * 16u ? 65535u * 16u : (unsigned)g;
}

/* ---- runtime/ops_cuda.cu: elementwise and data movement ---- */
enum moe_status moe_ops_embed_cuda(cudaStream_t st, float *x, const int32_t *tokens, int T,
                                   const void *emb, enum moe_dtype dt, int64_t V, int D);
enum moe_status moe_ops_add_cuda(cudaStream_t st, float *y, const float *x, size_t n);
enum moe_status moe_ops_scale_cuda(cudaStream_t st, float *x, size_t n, float s);
enum moe_status moe_ops_clamp_cuda(cudaStream_t st, float *x, size_t n, float limit);
enum moe_status moe_ops_sigmoid_scale_cuda(cudaStream_t st, float *y, const float *g, int T, int D);
enum moe_status moe_ops_gather_rows_cuda(cudaStream_t st, float *dst, const float *src,
                                         const int32_t *rows, int n, int D);
/* dst[r*ld_dst + j] = src[r*ld_src + (idx ? idx[j] : j)], r < rows, j < n
 * (the backend's gather_cols; idx device memory or NULL). */
enum moe_status moe_ops_gather_cols_cuda(cudaStream_t st, float *dst, int ld_dst, const float *src,
                                         int ld_src, int rows, const int32_t *idx, int n);
/* y (T, N) += b (N) broadcast over rows; b in dtype dt. */
enum moe_status moe_ops_bias_cuda(cudaStream_t st, float *y, const void *b, enum moe_dtype dt,
                                  int T, int N);
/* dst = src converted to dt (F16 or BF16), n elements, round to nearest even. */
enum moe_status moe_ops_to_half_cuda(cudaStream_t st, void *dst, const float *src,
                                     enum moe_dtype dt, size_t n);
/* dst (rows, n) packed in dt (F16 or BF16) = the first n values of each
 * row of src (rows, stride ld), round to nearest even. */
enum moe_status moe_ops_to_half_rows_cuda(cudaStream_t st, void *dst, const float *src, int ld,
                                          enum moe_dtype dt, size_t rows, int n);
/* The synth.c generator on the device: n values of dt, uniform with
 * standard deviation std keyed by key, or ones when std < 0. */
enum moe_status moe_ops_synth_fill_cuda(cudaStream_t st, void *dst, enum moe_dtype dt, size_t n,
                                        uint64_t key, float std);
/* dst (n_blocks * 128 bf16 values) = FP8_B128 blocks src (n_blocks of
 * MOE_FP8_BYTES: runtime/tensor.h): each value the fp32 product of its
 * E4M3 byte and its block's scale (the CPU's weight), rounded to bf16 (as
 * transformers' dequantization to a bf16 model). */
enum moe_status moe_ops_fp8_to_bf16_cuda(cudaStream_t st, void *dst, const void *src, size_t n_blocks);
/* n values of dt (F32, F16 or BF16; n a multiple of 32) at src quantized
 * to Q8_0 planes at dst (runtime/tensor.h: n int8 codes, then n/32 f32
 * scales), bit for bit as moe_quantize_row_q8_0 and moe_planes_from_rows
 * make them; a value that is not finite, or a scale past f16, sets the
 * device int *bad (its block unwritten). */
enum moe_status moe_ops_quantize_q8_0_cuda(cudaStream_t st, void *dst, const void *src, enum moe_dtype dt,
                                           size_t n, int *bad);
/* y (T, N) = x (T, Din) . W^T (+ b (N) in bdt, or NULL) with W (N, Din) as
 * MXFP4, FP8_B128 or Q8_0 planes (runtime/tensor.h) at w, read in place: for
 * steps of few rows (each weight row is read once per 8 input rows). */
enum moe_status moe_ops_matmul_planes_cuda(cudaStream_t st, float *y, const float *x, const void *w,
                                           enum moe_dtype dt, int N, int Din, int T, const void *b,
                                           enum moe_dtype bdt);
/* ids (rows) = argmax of each row of x (rows, n): ties to the lower index,
 * NaN never wins (moe_argmax). */
enum moe_status moe_ops_argmax_cuda(cudaStream_t st, int32_t *ids, const float *x, int rows, int n);

/* ---- attention/attention_cuda.cu ---- */
enum moe_status moe_attention_rmsnorm_cuda(cudaStream_t st, float *y, const float *x,
                                           const void *w, enum moe_dtype wdt, int rows, int dim,
                                           float eps);
enum moe_status moe_attention_rope_cuda(cudaStream_t st, float *x, const int32_t *pos, int T,
                                        int H, int Dh, int rot, const float *inv_freq);
enum moe_status moe_attention_kv_store_cuda(cudaStream_t st, struct moe_kvcache *kv, int layer,
                                            const float *k, const float *v, const int32_t *slots,
                                            int T);
/* Floats of split workspace needed for rows*Hq heads with up to max_splits
 * splits each. */
size_t moe_attention_split_floats(int rows, int Hq, int Dh, int max_splits);
/* ws: split workspace of ws_rows rows (0: no split). */
enum moe_status moe_attention_paged_cuda(cudaStream_t st, float *out, const float *q,
                                         const struct moe_kvcache *kv, const struct moe_batch *db,
                                         const struct moe_attn_params *p, float *ws, int ws_rows,
                                         int max_splits);

/* out (T, Hq*Dh) = the merge, in split order, of the n_splits partials
 * (acc (Dh), max, sum) of each (row, head) in ws (T, Hq, n_splits, Dh + 2),
 * head h's sink folded in (sinks (Hq) or NULL).  Partials with sum 0 are
 * empty. */
enum moe_status moe_attention_split_reduce_cuda(cudaStream_t st, float *out, const float *ws,
                                                const float *sinks, int T, int Hq, int Dh,
                                                int n_splits);

/* ---- attention/attention_mla_cuda.cu ---- */
/* Raises the MLA attention kernels' dynamic shared memory limits (149 KiB
 * at Dh = 576); once per device, at backend init.  Returns the largest head
 * dim the device allows (576 on sm_80 and sm_90; 0: none). */
int moe_attention_mla_setup_cuda(void);
/* Floats of split workspace the MLA kernel can use to full effect at head
 * dim Dh (what reserve allocates for an MLA model: 37.9 MB at 576). */
size_t moe_attention_mla_split_floats(int Dh);
/* The attention of moe_attention_paged_cuda over a cache whose V is its K
 * (kv->v == kv->k: MLA's one row per token), Dh <= max_dh (from setup),
 * any group size.  ws: split workspace of ws_floats floats for
 * decode-sized steps (NULL: no key splits, as for prefill-sized steps). */
enum moe_status moe_attention_mla_cuda(cudaStream_t st, float *out, const float *q,
                                       const struct moe_kvcache *kv, const struct moe_batch *db,
                                       const struct moe_attn_params *p, int max_dh, float *ws,
                                       size_t ws_floats, int max_splits);

/* ---- attention/attention_prefill_cuda.cu ---- */
/* Raises the tiled prefill kernels' dynamic shared memory limit (up to
 * ~101 KiB at Dh = 256); once per device, at backend init. */
enum moe_status moe_attention_prefill_setup_cuda(void);
/* The same attention as moe_attention_paged_cuda, by the tiled causal
 * prefill kernel (blocks of 32 (token, head) rows of one sequence sharing
 * K/V tiles); for steps of many rows.  No workspace. */
enum moe_status moe_attention_prefill_cuda(cudaStream_t st, float *out, const float *q,
                                           const struct moe_kvcache *kv,
                                           const struct moe_batch *db,
                                           const struct moe_attn_params *p);

/* ---- attention/attention_mma_cuda.cu ---- */
/* Whether the tensor-core prefill kernel takes this cache and layer: bf16
 * or f16 cache, head dim 64 or 128. */
bool moe_attention_mma_supported(const struct moe_kvcache *kv, const struct moe_attn_params *p);
/* The same attention as moe_attention_prefill_cuda, on tensor cores
 * (mma.sync, sm_80+): Q and P rounded to the cache's type, fp32 sums. */
enum moe_status moe_attention_prefill_mma_cuda(cudaStream_t st, float *out, const float *q,
                                               const struct moe_kvcache *kv, const struct moe_batch *db,
                                               const struct moe_attn_params *p);

/* ---- router/router_cuda.cu ---- */
/* The softmax router with r's groups (DeepSeek-V2's group_limited_greedy),
 * renormalisation and scale (router.h). */
enum moe_status moe_router_topk_softmax_cuda(cudaStream_t st, int32_t *ids, float *w,
                                             const float *logits, int T, const struct moe_route *r);
enum moe_status moe_router_topk_sigmoid_cuda(cudaStream_t st, int32_t *ids, float *w,
                                             const float *logits, int T, const struct moe_route *r);
/* CUB temp bytes for dispatching up to n pairs over E experts: asked once,
 * when the space is reserved. */
enum moe_status moe_router_dispatch_temp_bytes(int n, int E, size_t *bytes);
/* temp: temp_bytes of sort space sized by moe_router_dispatch_temp_bytes
 * for temp_pairs pairs over temp_e experts (a larger T*K or E fails);
 * vals_in, keys_out: (T*K) int32 scratch each; load (E) uint64 counters to
 * accumulate into (may be NULL).  Graph-capturable: no host queries. */
enum moe_status moe_router_dispatch_cuda(cudaStream_t st, struct moe_dispatch *plan,
                                         const int32_t *ids, int T, int K, int E, void *temp,
                                         size_t temp_bytes, int temp_pairs, int temp_e,
                                         int32_t *vals_in, int32_t *keys_out, uint64_t *load);

/* ---- experts/experts_cuda.cu ---- */
enum moe_status moe_experts_swiglu_cuda(cudaStream_t st, float *g, const float *u, size_t n);
/* Decode path: no host synchronisation.  h (T*K, F) fp32 scratch, ye (T*K, D)
 * fp32 scratch, active (E + 1) int32 scratch (the experts with rows);
 * gu (Ew, 2F, D), dn (Ew, D, F) stacked in dt (MXFP4 and FP8_B128: each
 * stack as planes, runtime/tensor.h); expert e's weights are at place
 * wmap[e] of the stacks (device (E); wmap NULL: e, Ew = E), and an expert
 * with wmap[e] < 0 is skipped (its rows of h and ye are left as they are);
 * ex's biases (by e) and activation (model.h; ex may be NULL: none). */
enum moe_status moe_experts_ffn_small_cuda(cudaStream_t st, float *h, float *ye, const float *x,
                                           const struct moe_dispatch *plan, int32_t *active,
                                           const int32_t *wmap, int Ew, const void *gu,
                                           const void *dn, const struct moe_expert_weights *ex,
                                           enum moe_dtype dt, int T, int K, int D, int F, int E);
/* Grouped path pieces: xe (T*K, D) in dt (F16/BF16) = x rows in perm order;
 * h (n, F) = act(gu[:, :F] (+ b_gate), gu[:, F:] (+ b_up)) in dt from gu
 * (n, 2F) in dt, the biases of each row's expert (offsets (E+1): the plan's). */
enum moe_status moe_experts_gather_half_cuda(cudaStream_t st, void *xe, const float *x,
                                             const int32_t *perm, int n, int K, int D,
                                             enum moe_dtype dt);
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
/* out (T, D) = sum_k w[t,k] * (ye[pos[t*K+k]] (+ b_down of its expert)) in
 * k order; ye in ydt (F32, F16 or BF16); b_down (E, D) or NULL. */
enum moe_status moe_experts_combine_cuda(cudaStream_t st, float *out, const void *ye,
                                         enum moe_dtype ydt, const float *w, const int32_t *pos,
                                         int T, int K, int D, const int32_t *offsets, int E,
                                         const float *b_down);

#ifdef __cplusplus
}
#endif
