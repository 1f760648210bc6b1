/* attention_cuda.h - launchers of the attention kernels (attention/attention*_cuda.cu):
 * the CUDA twins of attention.h.  Included only by CUDA code and the CUDA
 * backend; conventions in runtime/cuda/cuda_util.h. */
#pragma once

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attention/attention.h"
#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* ---- attention/linear_attn_cuda.cu ---- */
/* moe_attention_delta_cpu's twin: db is the device batch (state_slot,
 * seq_start, positions on the device); p's weights device memory.  A
 * convolution wider than 8, Dk above 128 or Dv above 1024 are refused. */
enum moe_status moe_attention_delta_cuda(cudaStream_t st, float *out, float *qkv, const float *b, const float *a,
                                         struct moe_kvcache *kv, const struct moe_batch *db,
                                         const struct moe_delta_params *p);

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

#ifdef __cplusplus
}
#endif
