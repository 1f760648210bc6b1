/* router_cuda.cu - CUDA twins of router/router_cpu.c: the fused
 * softmax + top-K + renormalisation kernel and the dispatch plan.
 *
 * Routing: one warp per token.  Softmax statistics (max, sum of exp) by warp
 * reductions; top-K by K rounds of a warp-wide arg-best over the experts not
 * yet chosen, ranking the logits with the CPU's comparator (larger first,
 * ties to the lower index, NaN below every number and among themselves by
 * index), so ids equal the CPU's for equal logits.  The K weights are
 * exp(x - max) / sum, the sum taken in the CPU's order (one lane adds the
 * terms the warp computed), renormalised by their sum taken in k order: the
 * weights differ from the CPU's by expf's rounding only.  Both routers may limit the choice to the best groups of
 * experts (eligible_groups: DeepSeek-V2's group_limited_greedy for the
 * softmax router; GLM-4.5 / DeepSeek-V3 for the sigmoid router, which has
 * its own kernel of the same shape).
 *
 * Dispatch: a stable CUB radix sort of the T*K expert ids with the pair ids
 * t*K+k as values gives perm (stable, so pairs of one expert stay in t*K+k
 * order, as on the CPU); offsets[e] is the lower bound of e in the sorted
 * keys (a binary search per expert: no atomics), counts their differences,
 * pos the inverse permutation.  The same kernel adds counts into the
 * layer's uint64 load counters.  Nothing here synchronises with the host. */
#include <cub/device/device_radix_sort.cuh>
#include <math.h>

#include "router/router.h"
#include "router/router_cuda.h"
#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_util.h"

#define ROUTE_WARPS 4
#define MAX_E_PER_LANE 32 /* E <= 1024 */

__device__ __forceinline__ bool ranks_before(float a, int ia, float b, int ib)
{
    bool an = isnan(a), bn = isnan(b);
    if (an || bn) return an == bn ? ia < ib : bn;
    return a > b || (a == b && ia < ib);
}

/* The warp's arg-best of (v, i) over its lanes, by ranks_before; i < 0 is
 * empty.  Every lane returns the winner. */
__device__ __forceinline__ void warp_best(float *v, int *i)
{
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (oi >= 0 && (*i < 0 || ranks_before(ov, oi, *v, *i))) {
            *v = ov;
            *i = oi;
        }
    }
}

/* Expert e's choice score, as router_cpu.c's: the logit for the softmax
 * router (softmax is monotone, and logits stay ordered where probabilities
 * would round to equal), sigmoid + choice bias for the sigmoid router. */
__device__ __forceinline__ float choice_score(const float *x, const float *bias, bool sigmoid, int e)
{
    return sigmoid ? 1.0f / (1.0f + expf(-x[e])) + (bias ? bias[e] : 0.0f) : x[e];
}

/* The eligible groups of one token as a mask (bit g: group g), every lane
 * returning the same: all when G is 1; else router_cpu.c's eligible_groups,
 * the topk_group groups of E/G experts ranked (ranks_before over (score,
 * group)) by their best choice score (softmax: DeepSeek-V2's
 * group_limited_greedy) or their two best summed (sigmoid: GLM-4.5,
 * DeepSeek-V3).  Lane j scores groups j and j + 32 (G <= 64), then
 * topk_group rounds of warp_best pick the groups. */
__device__ unsigned long long eligible_groups(const float *x, const float *bias, bool sigmoid,
                                              int E, int G, int topk_group, int lane)
{
    if (G == 1) return 1ull;
    const int per = E / G;
    float gs[2];
    for (int j = 0; j < 2; j++) {
        const int g = lane + 32 * j;
        float b0 = 0.0f, b1 = 0.0f;
        int i0 = -1, i1 = -1;
        for (int e = g * per; g < G && e < (g + 1) * per; e++) {
            float c = choice_score(x, bias, sigmoid, e);
            if (i0 < 0 || ranks_before(c, e, b0, i0)) {
                b1 = b0, i1 = i0;
                b0 = c, i0 = e;
            } else if (i1 < 0 || ranks_before(c, e, b1, i1)) {
                b1 = c, i1 = e;
            }
        }
        gs[j] = sigmoid ? b0 + b1 : b0;
    }
    unsigned long long ok = 0;
    unsigned taken = 0; /* bit j: group lane + 32*j chosen */
    for (int r = 0; r < topk_group; r++) {
        float bv = 0.0f;
        int bi = -1;
        for (int j = 0; j < 2; j++) {
            const int g = lane + 32 * j;
            if (g < G && !(taken & (1u << j)) && (bi < 0 || ranks_before(gs[j], g, bv, bi))) {
                bv = gs[j];
                bi = g;
            }
        }
        warp_best(&bv, &bi);
        if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (bi >= 0) ok |= 1ull << bi;
    }
    return ok;
}

/* The softmax router (router.h, moe_router_topk_softmax_cpu), one warp per
 * token: softmax statistics over all E, the eligible groups (G > 1:
 * DeepSeek-V2's group_limited_greedy), K rounds of warp_best over the
 * eligible logits not taken, weights exp(x - max) / sum, renormalised in k
 * order when asked, times scale unless it is 0 or 1 (as the CPU). */
static __global__ void topk_kernel(int32_t *ids, float *w, const float *logits, int T, int E,
                                   int K, int G, int topk_group, bool renorm, float scale)
{
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (t >= T) return; /* whole warps exit together: t is uniform per warp */
    __shared__ float s_exp[ROUTE_WARPS][32 * MAX_E_PER_LANE];
    const float *x = logits + (size_t)t * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, x[e]); /* fmaxf ignores NaN, as `>` does */
    mx = moe_warp_max(mx);
    /* the sum of exp in the CPU's order (e = 0, 1, ...): the terms in
     * parallel, the E additions by one lane, so the weights differ from the
     * CPU's by expf's rounding only */
    float *ex = s_exp[threadIdx.x >> 5];
    for (int e = lane; e < E; e += 32) ex[e] = expf(x[e] - mx);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
        for (int e = 0; e < E; e++) sum += ex[e];
    sum = __shfl_sync(0xffffffffu, sum, 0);
    const unsigned long long ok = eligible_groups(x, NULL, false, E, G, topk_group, lane);
    const int per = E / G;
    uint32_t taken = 0; /* bit i: expert lane + 32*i chosen */
    for (int k = 0; k < K; k++) {
        float bv = 0.0f;
        int bi = -1;
        for (int i = 0, e = lane; e < E; i++, e += 32) {
            if ((taken & (1u << i)) || !((ok >> (e / per)) & 1ull)) continue;
            if (bi < 0 || ranks_before(x[e], e, bv, bi)) {
                bv = x[e];
                bi = e;
            }
        }
        warp_best(&bv, &bi);
        /* every lane now holds the same winner; K <= the eligible experts
         * (checked by the launcher), so bi >= 0 */
        if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            ids[(size_t)t * K + k] = bi < 0 ? 0 : bi;
            w[(size_t)t * K + k] = expf(bv - mx) / sum;
        }
    }
    if (lane == 0) {
        float *wt = w + (size_t)t * K;
        if (renorm) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s += wt[k];
            for (int k = 0; k < K; k++) wt[k] /= s;
        }
        if (scale != 1.0f && scale != 0.0f)
            for (int k = 0; k < K; k++) wt[k] *= scale;
    }
}

/* The groups of r: G in [1, 64] dividing E <= 1024, topk_group in [1, G],
 * K experts among the eligible ones. */
static enum moe_status check_route(const struct moe_route *r, const char *what)
{
    const int E = r->E, K = r->K, G = r->n_group;
    if (E <= 0 || E > 32 * MAX_E_PER_LANE || G < 1 || G > 64 || E % G || r->topk_group < 1 ||
        r->topk_group > G || K <= 0 || K > r->topk_group * (E / G))
        return moe_fail(MOE_ERR_UNSUPPORTED, "CUDA %s router: top-%d of %d experts in %d groups, "
                        "%d eligible (E <= %d, groups <= 64)", what, K, E, G, r->topk_group,
                        32 * MAX_E_PER_LANE);
    return MOE_OK;
}

extern "C" enum moe_status moe_router_topk_softmax_cuda(cudaStream_t st, int32_t *ids, float *w,
                                                        const float *logits, int T,
                                                        const struct moe_route *r)
{
    if (T <= 0) return MOE_OK;
    MOE_TRY(check_route(r, "softmax"));
    unsigned blocks = (unsigned)((T + ROUTE_WARPS - 1) / ROUTE_WARPS);
    topk_kernel<<<blocks, ROUTE_WARPS * 32, 0, st>>>(ids, w, logits, T, r->E, r->K, r->n_group,
                                                   r->topk_group, r->renorm, r->scale);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* The sigmoid router (router.h, moe_router_topk_sigmoid_cpu), one warp per
 * token: the eligible groups by their two best choice scores, then K
 * rounds of warp_best over the eligible experts not taken, as topk_kernel
 * does.  Choice scores are recomputed from the logits (in L1) rather than
 * held. */
static __global__ void topk_sigmoid_kernel(int32_t *ids, float *w, const float *logits,
                                           const float *bias, int T, int E, int K, int G,
                                           int topk_group, bool renorm, float scale)
{
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (t >= T) return; /* t is uniform per warp */
    const float *x = logits + (size_t)t * E;
    const int per = E / G;
    const unsigned long long ok = eligible_groups(x, bias, true, E, G, topk_group, lane);
    uint32_t taken = 0; /* bit i: expert lane + 32*i chosen */
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
        float bv = 0.0f;
        int bi = -1;
        for (int i = 0, e = lane; e < E; i++, e += 32) {
            if ((taken & (1u << i)) || !((ok >> (e / per)) & 1ull)) continue;
            float c = choice_score(x, bias, true, e);
            if (bi < 0 || ranks_before(c, e, bv, bi)) {
                bv = c;
                bi = e;
            }
        }
        warp_best(&bv, &bi);
        if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            const float s = bi < 0 ? 0.0f : 1.0f / (1.0f + expf(-x[bi]));
            ids[(size_t)t * K + k] = bi < 0 ? 0 : bi;
            w[(size_t)t * K + k] = s;
            sum += s;
        }
    }
    if (lane == 0)
        for (int k = 0; k < K; k++) {
            float *wk = &w[(size_t)t * K + k];
            *wk = (renorm ? *wk / (sum + 1e-20f) : *wk) * scale;
        }
}

extern "C" enum moe_status moe_router_topk_sigmoid_cuda(cudaStream_t st, int32_t *ids, float *w,
                                                        const float *logits, int T,
                                                        const struct moe_route *r)
{
    if (T <= 0) return MOE_OK;
    MOE_TRY(check_route(r, "sigmoid"));
    unsigned blocks = (unsigned)((T + ROUTE_WARPS - 1) / ROUTE_WARPS);
    topk_sigmoid_kernel<<<blocks, ROUTE_WARPS * 32, 0, st>>>(ids, w, logits, r->bias, T, r->E, r->K,
                                                           r->n_group, r->topk_group, r->renorm,
                                                           r->scale);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static int key_bits(int E)
{
    int b = 1;
    while ((1 << b) < E) b++;
    return b;
}

extern "C" enum moe_status moe_router_dispatch_temp_bytes(int n, int E, size_t *bytes)
{
    *bytes = 0;
    MOE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, *bytes, (const int32_t *)nullptr,
                                                 (int32_t *)nullptr, (const int32_t *)nullptr,
                                                 (int32_t *)nullptr, n, 0, key_bits(E)));
    return MOE_OK;
}

static __global__ void iota_kernel(int32_t *v, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = i;
}

/* First index of sorted keys (n) that is >= e. */
__device__ __forceinline__ int lower_bound(const int32_t *keys, int n, int e)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (keys[mid] < e) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static __global__ void offsets_kernel(int32_t *counts, int32_t *offsets, uint64_t *load,
                                      const int32_t *keys, int n, int E)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e > E) return;
    const int a = lower_bound(keys, n, e);
    offsets[e] = a;
    if (e == E) return;
    const int c = lower_bound(keys, n, e + 1) - a;
    counts[e] = c;
    if (load) load[e] += (uint64_t)c;
}

static __global__ void inverse_kernel(int32_t *pos, const int32_t *perm, int n)
{
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < n; r += gridDim.x * blockDim.x) {
        const int p = perm[r];
        if (p >= 0 && p < n) pos[p] = r;
    }
}

extern "C" enum moe_status moe_router_dispatch_cuda(cudaStream_t st, struct moe_dispatch *plan,
                                                    const int32_t *ids, int T, int K, int E,
                                                    void *temp, size_t temp_bytes, int temp_pairs,
                                                    int temp_e, int32_t *vals_in,
                                                    int32_t *keys_out, uint64_t *load)
{
    if (E <= 0) return moe_fail(MOE_ERR_INVALID_ARG, "dispatch over %d experts", E);
    /* CUB's space grows with the item count and the key bits, so space
     * sized for temp_pairs over temp_e covers every smaller call; no size
     * query per call (and CUB's onesweep path does not check the size) */
    if (T < 0 || K < 0 || (long long)T * K > temp_pairs || E > temp_e)
        return moe_fail(MOE_ERR_INVALID_ARG,
                        "dispatch: %d x %d pairs over %d experts; the sort space (%zu bytes) "
                        "was sized for %d pairs over %d", T, K, E, temp_bytes, temp_pairs,
                        temp_e);
    const int n = T * K;
    if (n > 0) {
        iota_kernel<<<moe_cuda_blocks((size_t)n, 256), 256, 0, st>>>(vals_in, n);
        MOE_CUDA_LAUNCHED();
        MOE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, keys_out, vals_in,
                                                     plan->perm, n, 0, key_bits(E), st));
    }
    offsets_kernel<<<(unsigned)((E + 1 + 255) / 256), 256, 0, st>>>(plan->counts, plan->offsets,
                                                                   load, keys_out, n, E);
    MOE_CUDA_LAUNCHED();
    if (n > 0) {
        inverse_kernel<<<moe_cuda_blocks((size_t)n, 256), 256, 0, st>>>(plan->pos, plan->perm, n);
        MOE_CUDA_LAUNCHED();
    }
    return MOE_OK;
}
