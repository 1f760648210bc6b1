/* router_cuda.h - launchers of the router kernels (router/router_cuda.cu):
 * the CUDA twins of router.h.  Included only by CUDA code and the CUDA
 * backend; conventions in runtime/cuda/cuda_util.h. */
#pragma once

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "router/router.h"
#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif
