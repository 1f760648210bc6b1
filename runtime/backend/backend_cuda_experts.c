/* backend_cuda_experts.c - the CUDA backend's experts op for resident
 * layers and the expert kernels' state (struct cuda_experts): the stacked
 * layout check, the choice between the device-driven kernels (decode-sized
 * steps, experts/experts_cuda.cu) and the cuBLAS grouped GEMMs (prefill),
 * MXFP4 / FP8 / Q8_0 experts widened to bf16 for the latter, or (opt-in,
 * MOERUN_CUDA_EXPERTS=mma) the tensor-core kernels of
 * experts/experts_mma_cuda.cu for both.  Offloaded layers
 * (backend_cuda_offload.c) run their rounds through the same kernels.
 * Calls backend_cuda_mem.c only.  See docs/cuda.md. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/backend/backend_cuda_impl.h"

size_t moe_cuda_widened_layer_bytes(int E, int D, int F)
{
    size_t n;
    if (E <= 0 || D <= 0 || F <= 0 || !moe_mul_size(3 * (size_t)E, (size_t)D, &n) ||
        !moe_mul_size(n, 2 * (size_t)F, &n))
        return 0;
    return n;
}

void moe_cuda_experts_free(struct cuda_experts *x)
{
    cudaFree(x->d_ptrs);
    cudaFree(x->active);
    cudaFree(x->mma_tiles);
    cudaFree(x->wide);
    cudaFreeHost(x->h_counts);
    cudaFreeHost(x->h_ptrs);
    cudaFree(x->ep_d_map);
    free(x->ep_h_map);
    free(x->ep_maps);
    x->ep_d_map = x->ep_h_map = NULL;
    x->ep_maps = NULL;
    x->ep_cap = x->ep_n = 0;
    cudaFree(x->mixed_rows);
    x->mixed_rows = NULL;
    x->mixed_rows_floats = 0;
    free(x->g_m); /* one block with the other parameter arrays */
    x->d_ptrs = x->h_ptrs = NULL;
    x->active = x->mma_tiles = x->h_counts = NULL;
    x->wide = NULL;
    x->wide_bytes = x->mma_tile_ints = 0;
    x->g_m = x->g_n = x->g_k = x->g_lda = x->g_ldb = x->g_ldc = x->g_size = NULL;
    x->g_alpha = x->g_beta = NULL;
    x->g_ta = x->g_tb = NULL;
}

enum moe_status moe_cuda_experts_reserve(struct cuda_ctx *c, int E, int L, int n, size_t wide, size_t mixed)
{
    struct cuda_experts *x = &c->experts;
    moe_cuda_experts_free(x);
    MOE_CUDA_TRY(cudaMalloc((void **)&x->d_ptrs, 6 * (size_t)E * sizeof(void *)));
    MOE_CUDA_TRY(cudaMalloc((void **)&x->active, ((size_t)E + 1) * sizeof(int32_t)));
    x->mma_tile_ints = moe_expert_mma_tile_ints(n, E);
    MOE_CUDA_TRY(cudaMalloc((void **)&x->mma_tiles, x->mma_tile_ints * sizeof(int32_t)));
    if (wide) MOE_CUDA_TRY(cudaMalloc(&x->wide, wide));
    x->wide_bytes = wide;
    if (mixed) MOE_CUDA_TRY(cudaMalloc((void **)&x->mixed_rows, mixed * sizeof(float)));
    x->mixed_rows_floats = mixed;
    MOE_CUDA_TRY(cudaMallocHost((void **)&x->h_counts, (size_t)E * sizeof(int32_t)));
    MOE_CUDA_TRY(cudaMallocHost((void **)&x->h_ptrs, 6 * (size_t)E * sizeof(void *)));
    /* the slot maps of each MoE layer (a layer more: one whose step comes
     * before the reserve counted it evicts the others) */
    size_t map_ints;
    x->ep_cap = (L > 0 ? L : 0) + 1;
    if (!moe_mul_size(3 * (size_t)x->ep_cap, (size_t)E, &map_ints) || map_ints > SIZE_MAX / sizeof(int32_t))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda reserve: slot maps of %d layers of %d experts", L, E);
    MOE_CUDA_TRY(cudaMalloc((void **)&x->ep_d_map, map_ints * sizeof(int32_t)));
    if (!(x->ep_h_map = malloc(map_ints * sizeof(int32_t))) ||
        !(x->ep_maps = calloc((size_t)x->ep_cap, sizeof *x->ep_maps)))
        return moe_fail(MOE_ERR_NOMEM, "cuda reserve: expert-parallel slot maps");
    /* one host block for the grouped GEMM parameter arrays */
    const size_t per = 7 * sizeof(int) + 2 * sizeof(float) + 2 * sizeof(cublasOperation_t);
    char *blk = malloc(per * (size_t)E);
    if (!blk) return moe_fail(MOE_ERR_NOMEM, "cuda reserve: grouped GEMM arrays");
    x->g_m = (int *)blk;
    x->g_n = x->g_m + E;
    x->g_k = x->g_n + E;
    x->g_lda = x->g_k + E;
    x->g_ldb = x->g_lda + E;
    x->g_ldc = x->g_ldb + E;
    x->g_size = x->g_ldc + E;
    x->g_alpha = (float *)(x->g_size + E);
    x->g_beta = x->g_alpha + E;
    x->g_ta = (cublasOperation_t *)(x->g_beta + E);
    x->g_tb = x->g_ta + E;
    return MOE_OK;
}

/* One cublasGemmGroupedBatchedEx over g groups with the parameter arrays
 * in c->g_* and the A, B, C pointer arrays at d, d + E, d + 2E (device;
 * h: the same on the host).  A cuBLAS that refuses the call (not
 * supported, invalid value) gives MOE_ERR_UNSUPPORTED, so the caller can
 * fall back to the other path.  MOERUN_CUDA_GROUPED=loop: a cublasGemmEx
 * per group instead, from h (d is not filled then). */
static enum moe_status grouped_gemm(struct cuda_ctx *c, void **d, void **h, cudaDataType_t ty, int E, int g)
{
    const struct cuda_experts *x = &c->experts;
    if (x->gemm_loop) {
        for (int i = 0; i < g; i++)
            MOE_CUBLAS_TRY(cublasGemmEx(c->blas, x->g_ta[i], x->g_tb[i], x->g_m[i], x->g_n[i], x->g_k[i],
                                        &x->g_alpha[i], h[i], ty, x->g_lda[i], h[E + i], ty, x->g_ldb[i],
                                        &x->g_beta[i], h[2 * E + i], ty, x->g_ldc[i], CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
        return MOE_OK;
    }
    cublasStatus_t b = cublasGemmGroupedBatchedEx(
        c->blas, c->experts.g_ta, c->experts.g_tb, c->experts.g_m, c->experts.g_n, c->experts.g_k, c->experts.g_alpha, (const void *const *)d, ty,
        c->experts.g_lda, (const void *const *)(d + E), ty, c->experts.g_ldb, c->experts.g_beta, d + 2 * E, ty, c->experts.g_ldc,
        g, c->experts.g_size, CUBLAS_COMPUTE_32F);
    if (b == CUBLAS_STATUS_NOT_SUPPORTED || (b == CUBLAS_STATUS_INVALID_VALUE && !c->strict))
        return moe_fail(MOE_ERR_UNSUPPORTED, "cublasGemmGroupedBatchedEx: %s",
                        moe_cublas_status_str(b));
    if (b != CUBLAS_STATUS_SUCCESS)
        return moe_fail(MOE_ERR_DEVICE, "cublasGemmGroupedBatchedEx: %s", moe_cublas_status_str(b));
    return MOE_OK;
}

enum moe_status moe_cuda_grouped_gemms(struct cuda_ctx *c, const int32_t *place, const void *gu,
                                       const void *dn, enum moe_dtype dt,
                                       const struct moe_dispatch *plan,
                                       const struct moe_expert_weights *ex,
                                       const struct moe_expert_ws *ws, int n, int D, int F, int E)
{
    const size_t es = moe_dtype_size(dt);
    /* the fp32 workspaces hold the half buffers: xe (n, D), gate_up (n, 2F)
     * in g (n*F floats = n*2F halves), h (n, F) in u, ye (n, D) in ye */
    void *xe = ws->xe, *gub = ws->g, *h = ws->u, *ye = ws->ye;
    void **A1 = c->experts.h_ptrs, **B1 = A1 + E, **C1 = B1 + E, **A2 = C1 + E, **B2 = A2 + E, **C2 = B2 + E;
    int g = 0, r0 = 0;
    for (int e = 0; e < E; e++) {
        const int cnt = c->experts.h_counts[e];
        if (cnt < 0 || r0 + cnt > n)
            return moe_fail(MOE_ERR_DEVICE, "cuda experts: expert %d has %d rows (of %d)", e, cnt, n);
        const int at = place ? place[e] : e;
        if (cnt > 0 && at >= 0) {
            A1[g] = (char *)gu + (size_t)at * 2 * F * D * es;
            B1[g] = (char *)xe + (size_t)r0 * D * es;
            C1[g] = (char *)gub + (size_t)r0 * 2 * F * es;
            A2[g] = (char *)dn + (size_t)at * D * F * es;
            B2[g] = (char *)h + (size_t)r0 * F * es;
            C2[g] = (char *)ye + (size_t)r0 * D * es;
            c->experts.g_n[g] = cnt;
            g++;
        }
        r0 += cnt;
    }
    if (r0 != n) return moe_fail(MOE_ERR_DEVICE, "cuda experts: counts sum to %d, not %d", r0, n);
    /* the grouped call reads the pointer arrays on the device, each
     * projection's A, B, C adjacent; the loop (gemm_loop) reads the host's */
    void **d1 = c->experts.d_ptrs, **d2 = c->experts.d_ptrs + 3 * (size_t)E;
    if (!c->experts.gemm_loop) {
        const size_t bytes = (size_t)g * sizeof(void *);
        MOE_CUDA_TRY(cudaMemcpyAsync(d1, A1, bytes, cudaMemcpyHostToDevice, c->stream));
        MOE_CUDA_TRY(cudaMemcpyAsync(d1 + E, B1, bytes, cudaMemcpyHostToDevice, c->stream));
        MOE_CUDA_TRY(cudaMemcpyAsync(d1 + 2 * E, C1, bytes, cudaMemcpyHostToDevice, c->stream));
        MOE_CUDA_TRY(cudaMemcpyAsync(d2, A2, bytes, cudaMemcpyHostToDevice, c->stream));
        MOE_CUDA_TRY(cudaMemcpyAsync(d2 + E, B2, bytes, cudaMemcpyHostToDevice, c->stream));
        MOE_CUDA_TRY(cudaMemcpyAsync(d2 + 2 * E, C2, bytes, cudaMemcpyHostToDevice, c->stream));
    }
    const cudaDataType_t ty = cuda_type(dt);
    for (int i = 0; i < g; i++) {
        c->experts.g_ta[i] = CUBLAS_OP_T;
        c->experts.g_tb[i] = CUBLAS_OP_N;
        c->experts.g_m[i] = 2 * F;
        c->experts.g_k[i] = D;
        c->experts.g_lda[i] = D;
        c->experts.g_ldb[i] = D;
        c->experts.g_ldc[i] = 2 * F;
        c->experts.g_size[i] = 1;
        c->experts.g_alpha[i] = 1.0f;
        c->experts.g_beta[i] = 0.0f;
    }
    if (g > 0)
        MOE_TRY(grouped_gemm(c, d1, A1, ty, E, g));
    MOE_TRY(moe_experts_swiglu_half_cuda(c->stream, h, gub, n, F, dt, plan->offsets, E, ex));
    for (int i = 0; i < g; i++) {
        c->experts.g_m[i] = D;
        c->experts.g_k[i] = F;
        c->experts.g_lda[i] = F;
        c->experts.g_ldb[i] = F;
        c->experts.g_ldc[i] = D;
    }
    if (g > 0)
        MOE_TRY(grouped_gemm(c, d2, A2, ty, E, g));
    return MOE_OK;
}

/* The grouped (prefill) expert path: gather in half precision, one grouped
 * GEMM per projection over the experts that have rows. */
static enum moe_status experts_grouped(struct cuda_ctx *c, float *out, const float *x,
                                       const struct moe_dispatch *plan, const float *w,
                                       const void *gu, const void *dn,
                                       const struct moe_expert_weights *ex, enum moe_dtype dt,
                                       const struct moe_expert_ws *ws, int T, int K, int D, int F,
                                       int E)
{
    const int n = T * K;
    MOE_TRY(moe_experts_gather_half_cuda(c->stream, ws->xe, x, plan->perm, n, K, D, dt, ex->cols ? ex->cols[0] : NULL,
                                         plan->offsets, E));
    MOE_CUDA_TRY(cudaMemcpyAsync(c->experts.h_counts, plan->counts, (size_t)E * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, c->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    MOE_TRY(moe_cuda_grouped_gemms(c, NULL, gu, dn, dt, plan, ex, ws, n, D, F, E));
    return moe_experts_combine_cuda(c->stream, out, ws->ye, dt, w, plan->pos, T, K, D, plan->offsets, E,
                                    ex->b_down.data);
}

/* Bytes of one expert matrix of F x D in dt on the device (planes: the
 * value plane's share; the scales follow all E experts' values). */
static size_t expert_mat_bytes(enum moe_dtype dt, int F, int D)
{
    if (moe_dtype_planes(dt))
        return moe_planes_values_bytes(dt, (size_t)F, (size_t)D);
    return (size_t)F * D * moe_dtype_size(dt);
}

/* Experts in planes on the grouped path: the layer's experts with rows
 * widened to bf16 in c->wide (planes: runtime/core/tensor.h), the GEMMs then
 * as for bf16 weights. */
static enum moe_status experts_widened(struct cuda_ctx *c, float *out, const float *x,
                                       const struct moe_dispatch *plan, const float *w,
                                       const struct moe_expert_weights *ex,
                                       const struct moe_expert_ws *ws, int T, int K, int D, int F,
                                       int E)
{
    char *wgu = c->experts.wide, *wdn = wgu + 2 * (size_t)F * D * 2 * E;
    MOE_TRY(moe_experts_widen_cuda(c->stream, wgu, ex->gate[0], ex->dtype, 2 * (size_t)F * E,
                                   (size_t)D, E, plan->counts));
    MOE_TRY(moe_experts_widen_cuda(c->stream, wdn, ex->down[0], moe_expert_down_dtype(ex, 0), (size_t)D * E,
                                   (size_t)F, E, plan->counts));
    return experts_grouped(c, out, x, plan, w, wgu, wdn, ex, MOE_DTYPE_BF16, ws, T, K, D, F, E);
}

/* MOERUN_CUDA_EXPERTS=mma: the tensor-core kernels take the steps past
 * the decode kernels' (T > 32) and those of 4 rows an expert on average
 * or more, where the decode kernels read each weight once per tile of 4
 * or 8 rows (thresholds not yet measured on a device). */
bool moe_cuda_experts_mma(const struct cuda_ctx *c, enum moe_dtype dt, int T, int K, int D, int F, int E)
{
    /* the tensor-core kernels have no four-bit or Q6_K path */
    const bool typed = dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16 ||
                       (moe_dtype_planes(dt) && !moe_dtype_is_q4(dt) && dt != MOE_DTYPE_Q6_K);
    return c->experts.mma && c->experts.mma_tiles && typed && D % 8 == 0 && F % 8 == 0 && T > 1 &&
           (T > SMALL_EXPERT_ROWS || (int64_t)T * K >= 4 * (int64_t)E);
}

enum moe_status moe_cuda_mma_gemms(struct cuda_ctx *c, const int32_t *wmap, const void *gu,
                                   const void *dn, int Ew, const float *x, const struct moe_dispatch *plan,
                                   const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                                   int T, int K, int D, int F, int E)
{
    const enum moe_dtype at = ex->dtype == MOE_DTYPE_F16 ? MOE_DTYPE_F16 : MOE_DTYPE_BF16;
    const int n = T * K;
    if (moe_expert_down_dtype(ex, 0) != ex->dtype) /* moe_cuda_experts_mma: q4_k_m's are four-bit */
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda experts: the tensor-core kernels with %s down projections "
                        "beside %s gate and up", moe_dtype_name(moe_expert_down_dtype(ex, 0)),
                        moe_dtype_name(ex->dtype));
    if (moe_expert_mma_tile_ints(n, E) > c->experts.mma_tile_ints)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: %d rows over %d experts, tiles reserved "
                        "for fewer", n, E);
    /* the fp32 workspaces hold the half buffers, as on the grouped path:
     * u (n, F) the activations (gate and up never stored), ye (n, D) */
    MOE_TRY(moe_experts_mma_tiles_cuda(c->stream, c->experts.mma_tiles, plan, wmap, n, E));
    c->experts.mma_calls++;
    MOE_TRY(moe_experts_mma_gate_up_cuda(c->stream, ws->u, x, plan->perm, K, at, gu, ex->dtype, Ew, F, D,
                                         c->experts.mma_tiles, n, E, ex));
    return moe_experts_mma_down_cuda(c->stream, ws->ye, ws->u, at, dn, ex->dtype, Ew, D, F, c->experts.mma_tiles, n,
                                     E);
}

bool moe_cuda_experts_grouped(const struct cuda_ctx *c, enum moe_dtype dt, int T, int K, int D, int F,
                              int E, int Ew)
{
    const bool half = dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16;
    /* planes: widening a layer costs about what reading its experts 4-5
     * times does, so the device-driven kernels keep them up to 8 rows an
     * expert on average (not yet measured on a device) */
    const bool planes = moe_dtype_planes(dt) && c->experts.wide &&
                        moe_cuda_widened_layer_bytes(Ew, D, F) <= c->experts.wide_bytes &&
                        (int64_t)T * K > 8 * (int64_t)E;
    return (half || planes) && T > SMALL_EXPERT_ROWS && E <= c->work.max_e && !c->experts.no_grouped;
}

/* The grouped path could not run: say so once, use the other path. */
void moe_cuda_no_grouped(struct cuda_ctx *c)
{
    fprintf(stderr, "moerun: cuda: grouped expert GEMM unavailable (%s); using the "
            "device-driven expert kernels for every step\n", moe_last_error());
    c->experts.no_grouped = true;
}

enum expert_path moe_cuda_expert_path(const struct cuda_ctx *c, enum moe_dtype dt, int T, int K, int D, int F,
                                      int E, int C)
{
    return moe_cuda_experts_mma(c, dt, T, K, D, F, E)          ? PATH_MMA
           : moe_cuda_experts_grouped(c, dt, T, K, D, F, E, C) ? PATH_CUBLAS
                                                                : PATH_KERNELS;
}

enum moe_status moe_cuda_run_stack(struct cuda_ctx *c, enum expert_path path, const void *gu, const void *dn, int C,
                                   const int32_t *h_map, const int32_t *d_map, const float *x,
                                   const struct moe_dispatch *plan, const struct moe_expert_weights *ex,
                                   const struct moe_expert_ws *ws, int T, int K, int D, int F, int E,
                                   enum moe_dtype *ydt)
{
    const enum moe_dtype dt = ex->dtype, ddt = moe_expert_down_dtype(ex, 0);
    *ydt = path == PATH_KERNELS ? MOE_DTYPE_F32 : dt == MOE_DTYPE_F16 ? MOE_DTYPE_F16 : MOE_DTYPE_BF16;
    if (path == PATH_MMA) return moe_cuda_mma_gemms(c, d_map, gu, dn, C, x, plan, ex, ws, T, K, D, F, E);
    if (path == PATH_KERNELS)
        return moe_experts_ffn_small_cuda(c->stream, ws->g, ws->ye, ws->xe, ws->u, x, plan, c->experts.active, d_map,
                                          C, gu, dn, ex, dt, ddt, T, K, D, F, E);
    if (!moe_dtype_planes(dt)) return moe_cuda_grouped_gemms(c, h_map, gu, dn, dt, plan, ex, ws, T * K, D, F, E);
    /* the C experts widened to bf16, at their places */
    char *wgu = c->experts.wide, *wdn = wgu + 2 * (size_t)F * D * 2 * C;
    MOE_TRY(moe_experts_widen_cuda(c->stream, wgu, gu, dt, 2 * (size_t)F * C, (size_t)D, C, NULL));
    MOE_TRY(moe_experts_widen_cuda(c->stream, wdn, dn, ddt, (size_t)D * C, (size_t)F, C, NULL));
    return moe_cuda_grouped_gemms(c, h_map, wgu, wdn, MOE_DTYPE_BF16, plan, ex, ws, T * K, D, F, E);
}

/* The step's routed rows gathered in half precision into ws->xe (the
 * cuBLAS path's input), and its counts read back to the host. */
static enum moe_status gather_and_count(struct cuda_ctx *c, const float *x, const struct moe_dispatch *plan,
                                        const struct moe_expert_ws *ws, enum moe_dtype half,
                                        const int32_t *cols, int n, int K, int D, int E)
{
    MOE_TRY(moe_experts_gather_half_cuda(c->stream, ws->xe, x, plan->perm, n, K, D, half, cols,
                                         cols ? plan->offsets : NULL, E));
    MOE_CUDA_TRY(cudaMemcpyAsync(c->experts.h_counts, plan->counts, (size_t)E * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, c->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    return MOE_OK;
}

enum moe_status moe_cuda_experts_resident(struct cuda_ctx *c, float *out, const float *x,
                                          const struct moe_dispatch *plan, const float *w,
                                          const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                                          int T, int K, int D, int F, int E)
{
    const enum moe_dtype ddt = moe_expert_down_dtype(ex, 0);
    const size_t mat = expert_mat_bytes(ex->dtype, F, D), mat_d = expert_mat_bytes(ddt, F, D);
    const char *gu = ex->gate[0], *dn = ex->down[0];
    for (int e = 0; e < E; e++)
        if ((const char *)ex->gate[e] != gu + 2 * mat * e ||
            (const char *)ex->up[e] != gu + 2 * mat * e + mat ||
            (const char *)ex->down[e] != dn + mat_d * e || moe_expert_down_dtype(ex, e) != ddt ||
            (ex->cols && (ex->cols[2 * e] != ex->cols[0] + (size_t)e * D ||
                          ex->cols[2 * e + 1] != ex->cols[1] + (size_t)e * F)))
            return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: expert %d is not in the stacked "
                            "device layout (see backend_cuda_impl.h)", e);
    if (T <= 0) return MOE_OK;
    if (moe_cuda_experts_mma(c, ex->dtype, T, K, D, F, E)) {
        const enum moe_dtype at = ex->dtype == MOE_DTYPE_F16 ? MOE_DTYPE_F16 : MOE_DTYPE_BF16;
        MOE_TRY(moe_cuda_mma_gemms(c, NULL, gu, dn, E, x, plan, ex, ws, T, K, D, F, E));
        return moe_experts_combine_cuda(c->stream, out, ws->ye, at, w, plan->pos, T, K, D, plan->offsets,
                                        E, ex->b_down.data);
    }
    if (moe_cuda_experts_grouped(c, ex->dtype, T, K, D, F, E, E)) {
        enum moe_status s = moe_dtype_planes(ex->dtype) ? experts_widened(c, out, x, plan, w, ex, ws, T, K, D, F, E)
                                   : experts_grouped(c, out, x, plan, w, gu, dn, ex, ex->dtype, ws,
                                                     T, K, D, F, E);
        if (s != MOE_ERR_UNSUPPORTED) return s;
        moe_cuda_no_grouped(c);
    }
    if (E > c->work.max_e)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: %d experts, %d reserved", E, c->work.max_e);
    MOE_TRY(moe_experts_ffn_small_cuda(c->stream, ws->g, ws->ye, ws->xe, ws->u, x, plan, c->experts.active, NULL, E,
                                       gu, dn, ex, ex->dtype, ddt, T, K, D, F, E));
    return moe_experts_combine_cuda(c->stream, out, ws->ye, MOE_DTYPE_F32, w, plan->pos, T, K, D,
                                    plan->offsets, E, NULL);
}

/* One stack of a per-expert plan's layer (struct cuda_mixed_set) over
 * the pairs its maps place, on its path, through a view of the table
 * with the stack's dtype (biases as the table has them); first, for
 * cuBLAS, the routed rows gathered in the half type its GEMMs take, unless
 * ws->xe holds them in that type already (*gathered). */
static enum moe_status run_mixed_stack(struct cuda_ctx *c, const struct cuda_mixed_set *st, enum expert_path path,
                                       const int32_t *h_map, const int32_t *d_map, const float *x,
                                       const struct moe_dispatch *plan, const struct moe_expert_weights *ex,
                                       const struct moe_expert_ws *ws, int T, int K, int D, int F, int E,
                                       enum moe_dtype *gathered, enum moe_dtype *ydt)
{
    struct moe_expert_weights v = *ex;
    v.dtype = st->dtype;
    v.dtypes = NULL;
    v.backend_layer = NULL;
    const enum moe_dtype half = st->dtype == MOE_DTYPE_F16 ? MOE_DTYPE_F16 : MOE_DTYPE_BF16;
    if (path == PATH_CUBLAS && half != *gathered) {
        MOE_TRY(gather_and_count(c, x, plan, ws, half, NULL, T * K, K, D, E));
        *gathered = half;
    }
    return moe_cuda_run_stack(c, path, st->gu, st->dn, st->C, h_map, d_map, x, plan, &v, ws, T, K, D, F, E, ydt);
}

/* The slot maps of a MoE layer under expert parallelism, keyed by key
 * (the layer's stack, or its per-expert plan) and its slots [lo, hi) of
 * E: filled by fill (n maps of E and the slots held in each) at the
 * layer's first step, copied to the device once and kept, so that a step
 * copies none; *maps the entry, whose host maps are at x->ep_h_map +
 * entry * 3E, device maps at x->ep_d_map + the same.  A table full of
 * other layers (more than the reserve counted) gives up its oldest entry
 * once the stream's work is done. */
static enum moe_status ep_layer_maps(struct cuda_ctx *c, const void *key, int lo, int hi, int E, int n,
                                     enum moe_status (*fill)(int32_t *map, int *held, const void *arg),
                                     const void *arg, int *maps)
{
    struct cuda_experts *x = &c->experts;
    int i = 0;
    while (i < x->ep_n && x->ep_maps[i].key != key) i++;
    if (i < x->ep_n && x->ep_maps[i].lo == lo && x->ep_maps[i].hi == hi && x->ep_maps[i].E == E) {
        *maps = i;
        return MOE_OK;
    }
    if (E > c->work.max_e || x->ep_cap <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: slot maps of %d slots (%d reserved)", E, c->work.max_e);
    if (i == x->ep_n && x->ep_n < x->ep_cap) x->ep_n++;
    else { /* an entry the queued steps may read: theirs done first */
        if (i == x->ep_n) i = 0;
        MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    }
    struct cuda_ep_maps *mp = &x->ep_maps[i];
    *mp = (struct cuda_ep_maps){.key = NULL, .lo = lo, .hi = hi, .E = E};
    const size_t at = (size_t)i * 3 * (size_t)c->work.max_e;
    int32_t *h = x->ep_h_map + at;
    for (int j = 0; j < n * E; j++) h[j] = -1;
    MOE_TRY(fill(h, mp->held, arg));
    MOE_CUDA_TRY(cudaMemcpy(x->ep_d_map + at, h, (size_t)n * E * sizeof(int32_t), cudaMemcpyHostToDevice));
    mp->key = key;
    *maps = i;
    return MOE_OK;
}

/* Expert parallelism over a layer a per-expert plan split (struct
 * cuda_mixed, the slot view's backend_layer): each of this rank's slots
 * [lo, hi) is found in its format's stack by its pointer, and each stack
 * runs over its slots as moe_cuda_experts_ep runs the one stack (its own
 * map of the slots); every slot's rows end in ws->ye in fp32, through
 * c->experts.mixed_rows when a stack's path leaves half rows (with the
 * down bias then, as there). */
/* What fills a per-expert plan's slot maps (mixed_maps). */
struct mixed_slots {
    const struct cuda_mixed *mx;
    const struct moe_expert_weights *ex;
    int lo, hi, E, D, F;
};

/* map (mx->n, E): each slot's place in the stack holding it (found by
 * its pointer), held[i] the slots in stack i. */
static enum moe_status mixed_maps(int32_t *map, int *held, const void *arg)
{
    const struct mixed_slots *a = arg;
    const struct cuda_mixed *mx = a->mx;
    for (int s = a->lo; s < a->hi; s++) {
        int i = 0;
        for (; i < mx->n; i++) {
            const struct cuda_mixed_set *st = &mx->set[i];
            const uintptr_t g = (uintptr_t)a->ex->gate[s], g0 = (uintptr_t)st->gu,
                            step = 2 * expert_mat_bytes(st->dtype, a->F, a->D);
            if (g >= g0 && g < g0 + step * (size_t)st->C && (g - g0) % step == 0) {
                map[i * a->E + s] = (int32_t)((g - g0) / step);
                held[i]++;
                break;
            }
        }
        if (i == mx->n) return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: slot %d is in no stack of its layer", s);
    }
    return MOE_OK;
}

static enum moe_status experts_ep_mixed(struct cuda_ctx *c, const struct cuda_mixed *mx, const float *x,
                                        const struct moe_dispatch *plan, const struct moe_expert_weights *ex,
                                        const struct moe_expert_ws *ws, int T, int K, int D, int F, int E)
{
    const int lo = plan->lo, hi = plan->hi, n = T * K;
    const struct mixed_slots arg = {mx, ex, lo, hi, E, D, F};
    int at;
    MOE_TRY(ep_layer_maps(c, mx, lo, hi, E, mx->n, mixed_maps, &arg, &at));
    const size_t off = (size_t)at * 3 * (size_t)c->work.max_e;
    const int32_t *map = c->experts.ep_h_map + off, *held = c->experts.ep_maps[at].held;
    const int Ep = plan->experts > 0 && plan->experts < E ? plan->experts : E;
    enum expert_path path[3];
    bool kernels_only = true;
    for (int i = 0; i < mx->n; i++) {
        path[i] = moe_cuda_expert_path(c, mx->set[i].dtype, T, K, D, F, Ep, mx->set[i].C);
        kernels_only = kernels_only && (path[i] == PATH_KERNELS || !held[i]);
    }
    if (!kernels_only && (size_t)n * D > c->experts.mixed_rows_floats)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: %d rows of %d for a per-expert plan, %zu values "
                        "reserved", n, D, c->experts.mixed_rows_floats);
    if (T <= 0) return MOE_OK;
    enum moe_dtype gathered = MOE_DTYPE_N;
    for (int i = 0; i < mx->n; i++) {
        if (!held[i]) continue;
        enum moe_dtype ydt;
        const int32_t *dm = c->experts.ep_d_map + off + (size_t)i * E;
        enum moe_status s = run_mixed_stack(c, &mx->set[i], path[i], map + (size_t)i * E, dm, x, plan, ex, ws, T, K,
                                            D, F, E, &gathered, &ydt);
        if (s == MOE_ERR_UNSUPPORTED && path[i] == PATH_CUBLAS) { /* as moe_cuda_experts_ep */
            moe_cuda_no_grouped(c);
            return experts_ep_mixed(c, mx, x, plan, ex, ws, T, K, D, F, E);
        }
        MOE_TRY(s);
        if (!kernels_only)
            MOE_TRY(moe_experts_take_rows_cuda(c->stream, c->experts.mixed_rows, ws->ye, ydt, dm, plan->offsets, E, n,
                                               D, ydt == MOE_DTYPE_F32 ? NULL : ex->b_down.data));
    }
    if (!kernels_only)
        MOE_CUDA_TRY(cudaMemcpyAsync(ws->ye, c->experts.mixed_rows, (size_t)n * D * sizeof(float),
                                     cudaMemcpyDeviceToDevice, c->stream));
    return MOE_OK;
}

/* map (E): slot s of this rank's [lo, hi) at s - lo of its one stack. */
static enum moe_status stack_maps(int32_t *map, int *held, const void *arg)
{
    const int *lohi = arg;
    for (int s = lohi[0]; s < lohi[1]; s++) map[s] = s - lohi[0];
    held[0] = lohi[1] - lohi[0];
    return MOE_OK;
}

/* Expert parallelism: the three paths as an offloaded layer's rounds take
 * them (backend_cuda_offload.c), over one round whose map places this
 * rank's slots; half results (cuBLAS, tensor cores) widened to fp32 in
 * place through xe, so that every rank sends fp32 rows whichever path it
 * took. */
enum moe_status moe_cuda_experts_ep(struct cuda_ctx *c, const float *x, const struct moe_dispatch *plan,
                                    const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                                    int T, int K, int D, int F, int E)
{
    const int lo = plan->lo, hi = plan->hi, C = hi - lo, n = T * K;
    if (lo < 0 || hi > E || C <= 0 || E > c->work.max_e)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: slots %d..%d of %d (%d reserved)", lo, hi, E,
                        c->work.max_e);
    if (ex->dtypes && ex->backend_layer) return experts_ep_mixed(c, ex->backend_layer, x, plan, ex, ws, T, K, D, F, E);
    if (ex->dtypes)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: a precision per expert without its layer's stacks");
    const size_t mat = expert_mat_bytes(ex->dtype, F, D), mat_d = expert_mat_bytes(moe_expert_down_dtype(ex, lo), F, D);
    const char *gu = ex->gate[lo], *dn = ex->down[lo];
    for (int s = lo; s < hi; s++)
        if (!gu || (const char *)ex->gate[s] != gu + 2 * mat * (size_t)(s - lo) ||
            (const char *)ex->up[s] != gu + 2 * mat * (size_t)(s - lo) + mat ||
            (const char *)ex->down[s] != dn + mat_d * (size_t)(s - lo) ||
            moe_expert_down_dtype(ex, s) != moe_expert_down_dtype(ex, lo))
            return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: slot %d is not in this rank's stacked device "
                            "layout", s);
    /* act-order: every slot's orders, by slot, read by the gathers and
     * kernels over all rows (forward_ep.c's slot view) */
    for (int s = 0; ex->cols && s < E; s++)
        if (!ex->cols[0] || ex->cols[2 * s] != ex->cols[0] + (size_t)s * D ||
            ex->cols[2 * s + 1] != ex->cols[1] + (size_t)s * F)
            return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: slot %d's column orders are not laid out by slot", s);
    if (T <= 0) return MOE_OK;
    const int lohi[2] = {lo, hi};
    int at;
    MOE_TRY(ep_layer_maps(c, gu, lo, hi, E, 1, stack_maps, lohi, &at));
    const size_t off = (size_t)at * 3 * (size_t)c->work.max_e;
    const int32_t *map = c->experts.ep_h_map + off, *d_map = c->experts.ep_d_map + off;
    /* the path one process takes (rows per expert, not per slot) */
    const int Ep = plan->experts > 0 && plan->experts < E ? plan->experts : E;
    const enum expert_path path = moe_cuda_expert_path(c, ex->dtype, T, K, D, F, Ep, C);
    if (path == PATH_CUBLAS)
        MOE_TRY(gather_and_count(c, x, plan, ws, ex->dtype == MOE_DTYPE_F16 ? MOE_DTYPE_F16 : MOE_DTYPE_BF16,
                                 ex->cols ? ex->cols[0] : NULL, n, K, D, E));
    enum moe_dtype ydt;
    enum moe_status s = moe_cuda_run_stack(c, path, gu, dn, C, map, d_map, x, plan, ex, ws, T, K, D, F, E, &ydt);
    if (s == MOE_ERR_UNSUPPORTED && path == PATH_CUBLAS) { /* cuBLAS refused: this step and the later ones on the kernels */
        moe_cuda_no_grouped(c);
        return moe_cuda_experts_ep(c, x, plan, ex, ws, T, K, D, F, E);
    }
    MOE_TRY(s);
    if (ydt == MOE_DTYPE_F32) return MOE_OK; /* the kernels add the down bias themselves */
    /* this rank's half rows to fp32 with the down bias (which the
     * single-process paths leave to the combine); the others' rows are
     * overwritten by the gather */
    MOE_TRY(moe_experts_take_rows_cuda(c->stream, ws->xe, ws->ye, ydt, d_map, plan->offsets, E, n, D,
                                       ex->b_down.data));
    MOE_CUDA_TRY(cudaMemcpyAsync(ws->ye, ws->xe, (size_t)n * D * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    return MOE_OK;
}

enum moe_status moe_cuda_experts_mixed(struct cuda_ctx *c, const struct cuda_mixed *mx, float *out,
                                       const float *x, const struct moe_dispatch *plan, const float *w,
                                       const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                                       int T, int K, int D, int F, int E)
{
    if (E > c->work.max_e)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: %d experts, %d reserved", E, c->work.max_e);
    if (T <= 0) return MOE_OK;
    const int n = T * K;
    /* each stack's path, as a whole layer of its format would take it;
     * the kernels' fp32 rows need no gathering when every stack takes them */
    enum expert_path path[3];
    bool kernels_only = true;
    for (int i = 0; i < mx->n; i++) {
        path[i] = moe_cuda_expert_path(c, mx->set[i].dtype, T, K, D, F, E, mx->set[i].C);
        kernels_only = kernels_only && path[i] == PATH_KERNELS;
    }
    if (!kernels_only && (size_t)n * D > c->experts.mixed_rows_floats)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: %d rows of %d for a per-expert plan, %zu values "
                        "reserved", n, D, c->experts.mixed_rows_floats);
    /* the rows gathered for cuBLAS, in the half type of its stack's GEMMs
     * (f16 stored experts: f16; widened planes: bf16); the other paths
     * leave xe be (no act order under a plan) */
    enum moe_dtype gathered = MOE_DTYPE_N;
    for (int i = 0; i < mx->n; i++) {
        const struct cuda_mixed_set *st = &mx->set[i];
        enum moe_dtype ydt;
        enum moe_status s = run_mixed_stack(c, st, path[i], st->h_map, st->d_map, x, plan, ex, ws, T, K, D, F, E,
                                            &gathered, &ydt);
        if (s == MOE_ERR_UNSUPPORTED && path[i] == PATH_CUBLAS) { /* as moe_cuda_experts_ep */
            moe_cuda_no_grouped(c);
            return moe_cuda_experts_mixed(c, mx, out, x, plan, w, ex, ws, T, K, D, F, E);
        }
        MOE_TRY(s);
        if (!kernels_only)
            MOE_TRY(moe_experts_take_rows_cuda(c->stream, c->experts.mixed_rows, ws->ye, ydt, st->d_map,
                                               plan->offsets, E, n, D,
                                               ydt == MOE_DTYPE_F32 ? NULL : ex->b_down.data));
    }
    return moe_experts_combine_cuda(c->stream, out, kernels_only ? ws->ye : c->experts.mixed_rows, MOE_DTYPE_F32,
                                    w, plan->pos, T, K, D, plan->offsets, E, NULL);
}
