/* backend_cuda_offload.c - expert offload: with moe_backend.gpu_experts = C
 * below a layer's E experts, prepare_model keeps the layer's experts in
 * pinned host memory (in the device layout) and gives it C device slots.
 * Each step of the layer copies the routing counts to the host, and the
 * experts it routes to that are not in a slot are copied in (PCIe, host to
 * device) before they run; experts/expert_cache.h decides which slot each
 * takes (LRU).  A step that needs more than C experts runs in rounds of at
 * most C.  Every step synchronises with the host, so step graphs are off
 * while a layer is offloaded.  See docs/cuda.md, "Expert offload". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend_cuda_impl.h"

struct offload_layer *moe_cuda_offloaded(struct cuda_ctx *c, const struct moe_expert_weights *ex)
{
    for (int i = 0; i < c->n_off; i++)
        if (c->off[i].ex == ex) return &c->off[i];
    return NULL;
}

/* Releases a layer's host memory (its device slots are the context's). */
static void layer_free(struct offload_layer *ol)
{
    cudaFreeHost(ol->host_gu);
    cudaFreeHost(ol->host_dn);
    free(ol->h_map);
    free(ol->order);
    free(ol->slot);
    free(ol->loaded);
    moe_expert_cache_free(&ol->cache);
    memset(ol, 0, sizeof *ol);
}

void moe_cuda_offload_forget(struct cuda_ctx *c, const struct moe_expert_weights *ex)
{
    struct offload_layer *ol = moe_cuda_offloaded(c, ex);
    if (ol) {
        layer_free(ol);
        *ol = c->off[--c->n_off];
    }
}

void moe_cuda_offload_free(struct cuda_ctx *c)
{
    for (int i = 0; i < c->n_off; i++) layer_free(&c->off[i]);
    free(c->off);
    c->off = NULL;
    c->n_off = c->cap_off = 0;
}

/* A device buffer the context frees at destroy. */
static enum moe_status owned_buffer(struct cuda_ctx *c, size_t bytes, void **out)
{
    MOE_CUDA_TRY(cudaMalloc(out, bytes ? bytes : 1));
    enum moe_status s = moe_cuda_keep_owned(c, *out);
    if (s != MOE_OK) {
        cudaFree(*out);
        *out = NULL;
    }
    return s;
}

static enum moe_status load_expert(struct cuda_ctx *c, const struct offload_layer *ol, int e, int s);

/* Bytes of n experts' shares a and b, or 0 on overflow. */
static size_t shares(size_t n, size_t a, size_t b)
{
    size_t r;
    return a + b >= a && moe_mul_size(n, a + b, &r) ? r : 0;
}

enum moe_status moe_cuda_offload_layer(struct cuda_ctx *c, struct moe_expert_weights *ex, int C, bool lfu,
                                       const double *warm, int E, const void *gu, const void *dn,
                                       size_t ge, size_t gs, size_t de, size_t ds)
{
    const size_t hg = shares((size_t)E, ge, gs), hd = shares((size_t)E, de, ds);
    if (C < 1 || C >= E || !hg || !hd)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda offload: %d slots for %d experts", C, E);
    if (c->n_off == c->cap_off) {
        int n = c->cap_off ? 2 * c->cap_off : 16;
        struct offload_layer *p = realloc(c->off, (size_t)n * sizeof *p);
        if (!p) return moe_fail(MOE_ERR_NOMEM, "cuda offload: layer table");
        c->off = p;
        c->cap_off = n;
    }
    struct offload_layer *ol = &c->off[c->n_off];
    memset(ol, 0, sizeof *ol);
    ol->ex = ex;
    ol->ge = ge, ol->gs = gs, ol->de = de, ol->ds = ds;
    enum moe_status s = moe_expert_cache_init(&ol->cache, E, C, lfu);
    if (s != MOE_OK) return s;
    c->n_off++; /* from here moe_cuda_offload_free releases what the layer holds */
    ol->h_map = malloc((size_t)E * sizeof *ol->h_map);
    ol->order = malloc((size_t)E * sizeof *ol->order);
    ol->slot = malloc((size_t)E * sizeof *ol->slot);
    ol->loaded = malloc((size_t)E * sizeof *ol->loaded);
    if (!ol->h_map || !ol->order || !ol->slot || !ol->loaded)
        return moe_fail(MOE_ERR_NOMEM, "cuda offload: %d experts", E);
    cudaError_t ce = cudaMallocHost(&ol->host_gu, hg);
    if (ce == cudaSuccess) ce = cudaMallocHost(&ol->host_dn, hd);
    if (ce != cudaSuccess)
        return moe_fail(MOE_ERR_NOMEM, "cuda offload: %.2f GiB of pinned host memory for a layer's "
                        "experts: %s", (hg + hd) / 1073741824.0, cudaGetErrorString(ce));
    /* the stacks were filled on the legacy stream and on c->stream */
    MOE_CUDA_TRY(cudaDeviceSynchronize());
    MOE_CUDA_TRY(cudaMemcpy(ol->host_gu, gu, hg, cudaMemcpyDeviceToHost));
    MOE_CUDA_TRY(cudaMemcpy(ol->host_dn, dn, hd, cudaMemcpyDeviceToHost));
    MOE_TRY(owned_buffer(c, shares((size_t)C, ge, gs), &ol->gu));
    MOE_TRY(owned_buffer(c, shares((size_t)C, de, ds), &ol->dn));
    MOE_TRY(owned_buffer(c, (size_t)E * sizeof(int32_t), (void **)&ol->d_map));
    /* the table points at the slots; only this file reads them */
    for (int e = 0; e < E; e++) {
        ex->gate[e] = ex->up[e] = ol->gu;
        ex->down[e] = ol->dn;
    }
    c->part_bytes[P_EXPERTS] += shares((size_t)C, ge, gs) + shares((size_t)C, de, ds);
    c->host_expert_bytes += hg + hd;
    if (warm) { /* the most loaded experts copied in now, not counted as step traffic */
        const uint64_t before = c->off_bytes;
        const int n = moe_expert_cache_warm(&ol->cache, warm);
        for (int i = 0; i < n; i++) MOE_TRY(load_expert(c, ol, ol->cache.owner[i], i));
        c->off_bytes = before;
    }
    return MOE_OK;
}

/* Copies expert e's weights from host memory into slot s (stream order). */
static enum moe_status load_expert(struct cuda_ctx *c, const struct offload_layer *ol, int e, int s)
{
    const int E = ol->cache.E, C = ol->cache.C;
    const char *hg = ol->host_gu, *hd = ol->host_dn;
    char *g = ol->gu, *d = ol->dn;
    MOE_CUDA_TRY(cudaMemcpyAsync(g + s * ol->ge, hg + e * ol->ge, ol->ge, cudaMemcpyHostToDevice, c->stream));
    MOE_CUDA_TRY(cudaMemcpyAsync(d + s * ol->de, hd + e * ol->de, ol->de, cudaMemcpyHostToDevice, c->stream));
    if (ol->gs) /* planes: the scales follow all the experts' values */
        MOE_CUDA_TRY(cudaMemcpyAsync(g + C * ol->ge + s * ol->gs, hg + E * ol->ge + e * ol->gs, ol->gs,
                                     cudaMemcpyHostToDevice, c->stream));
    if (ol->ds)
        MOE_CUDA_TRY(cudaMemcpyAsync(d + C * ol->de + s * ol->ds, hd + E * ol->de + e * ol->ds, ol->ds,
                                     cudaMemcpyHostToDevice, c->stream));
    c->off_bytes += ol->ge + ol->gs + ol->de + ol->ds;
    return MOE_OK;
}

/* Checks a step's counts: none negative, n in all. */
static enum moe_status check_counts(const int32_t *counts, int E, int n)
{
    int sum = 0;
    for (int e = 0; e < E; e++) {
        if (counts[e] < 0 || counts[e] > n - sum)
            return moe_fail(MOE_ERR_DEVICE, "cuda experts: expert %d has %d rows (of %d)", e, counts[e], n);
        sum += counts[e];
    }
    if (sum != n) return moe_fail(MOE_ERR_DEVICE, "cuda experts: counts sum to %d, not %d", sum, n);
    return MOE_OK;
}

/* The three ways through a step's experts (see moe_cuda_experts). */
enum expert_path { PATH_KERNELS, PATH_CUBLAS, PATH_MMA };

/* One round over the experts ol->h_map places: the device-driven kernels,
 * the tensor-core kernels, or cuBLAS's grouped GEMMs (planes widened
 * first). */
static enum moe_status run_round(struct cuda_ctx *c, struct offload_layer *ol, enum expert_path path,
                                 const float *x, const struct moe_dispatch *plan,
                                 const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                                 int T, int K, int D, int F, int E)
{
    const int C = ol->cache.C;
    if (path != PATH_CUBLAS) {
        MOE_CUDA_TRY(cudaMemcpyAsync(ol->d_map, ol->h_map, (size_t)E * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, c->stream));
        if (path == PATH_MMA)
            return moe_cuda_mma_gemms(c, ol->d_map, ol->gu, ol->dn, C, x, plan, ex, ws, T, K, D, F, E);
        return moe_experts_ffn_small_cuda(c->stream, ws->g, ws->ye, x, plan, c->active, ol->d_map, C,
                                          ol->gu, ol->dn, ex, ex->dtype, T, K, D, F, E);
    }
    if (ex->dtype == MOE_DTYPE_BF16 || ex->dtype == MOE_DTYPE_F16)
        return moe_cuda_grouped_gemms(c, ol->h_map, ol->gu, ol->dn, ex->dtype, plan, ex, ws, T * K, D,
                                      F, E);
    /* MXFP4 / FP8 planes: the C slots widened to bf16, at their slots */
    char *wgu = c->wide, *wdn = wgu + 2 * (size_t)F * D * 2 * C;
    MOE_TRY(moe_experts_widen_cuda(c->stream, wgu, ol->gu, ex->dtype, 2 * (size_t)F * C, (size_t)D, C,
                                   NULL));
    MOE_TRY(moe_experts_widen_cuda(c->stream, wdn, ol->dn, ex->dtype, (size_t)D * C, (size_t)F, C, NULL));
    return moe_cuda_grouped_gemms(c, ol->h_map, wgu, wdn, MOE_DTYPE_BF16, plan, ex, ws, T * K, D, F, E);
}

enum moe_status moe_cuda_experts_offload(struct cuda_ctx *c, struct offload_layer *ol, float *out,
                                         const float *x, const struct moe_dispatch *plan, const float *w,
                                         const struct moe_expert_weights *ex,
                                         const struct moe_expert_ws *ws, int T, int K, int D, int F,
                                         int E)
{
    if (E != ol->cache.E || E > c->max_e)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: %d experts (layer of %d, %d reserved)", E,
                        ol->cache.E, c->max_e);
    if (T <= 0) return MOE_OK;
    const int n = T * K, C = ol->cache.C;
    const enum expert_path path = moe_cuda_experts_mma(c, ex->dtype, T, K, D, F, E) ? PATH_MMA
                                  : moe_cuda_experts_grouped(c, ex->dtype, T, K, D, F, E, C) ? PATH_CUBLAS
                                                                                           : PATH_KERNELS;
    const bool grouped = path != PATH_KERNELS; /* half activations */
    const enum moe_dtype ydt = grouped ? (ex->dtype == MOE_DTYPE_F16 ? MOE_DTYPE_F16 : MOE_DTYPE_BF16)
                                       : MOE_DTYPE_F32;
    if (path == PATH_CUBLAS) /* the tensor-core kernels read x through perm */
        MOE_TRY(moe_experts_gather_half_cuda(c->stream, ws->xe, x, plan->perm, n, K, D, ydt));
    MOE_CUDA_TRY(cudaMemcpyAsync(c->h_counts, plan->counts, (size_t)E * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, c->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    MOE_TRY(check_counts(c->h_counts, E, n));
    const int m = moe_expert_cache_order(&ol->cache, c->h_counts, ol->order);
    ol->steps++;
    ol->grouped_steps += grouped;
    for (int next = 0, round = 0; next < m; round++) {
        /* the last round's host arrays may still be in flight */
        if (round) MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
        const int k = moe_expert_cache_fill(&ol->cache, ol->order, m, &next, ol->slot, ol->loaded);
        if (k == 0) return moe_fail(MOE_ERR_DEVICE, "cuda offload: no slot for expert %d", ol->order[next]);
        ol->rounds++;
        for (int e = 0; e < E; e++) ol->h_map[e] = -1;
        for (int i = 0; i < k; i++) {
            const int e = ol->order[next - k + i];
            if (ol->loaded[i]) MOE_TRY(load_expert(c, ol, e, ol->slot[i]));
            ol->h_map[e] = ol->slot[i];
        }
        enum moe_status s = run_round(c, ol, path, x, plan, ex, ws, T, K, D, F, E);
        if (s == MOE_ERR_UNSUPPORTED && path == PATH_CUBLAS) {
            /* cuBLAS refused the grouped GEMM: the step again, and the
             * later ones, on the device-driven kernels (this step's uses
             * are counted twice) */
            moe_cuda_no_grouped(c);
            return moe_cuda_experts_offload(c, ol, out, x, plan, w, ex, ws, T, K, D, F, E);
        }
        MOE_TRY(s);
    }
    return moe_experts_combine_cuda(c->stream, out, ws->ye, ydt, w, plan->pos, T, K, D, plan->offsets, E,
                                    grouped ? ex->b_down.data : NULL);
}
