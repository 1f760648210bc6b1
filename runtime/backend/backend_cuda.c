/* backend_cuda.c - the CUDA backend: device memory, one stream, cuBLAS for
 * the dense projections and the grouped expert GEMMs, and the kernels of
 * runtime/cuda/ops_cuda.cu, attention/attention_cuda.cu,
 * attention/attention_prefill_cuda.cu, router/router_cuda.cu and
 * experts/experts_cuda.cu.  The design is described in docs/cuda.md.
 *
 * Everything runs in order on one non-blocking stream.  The host waits for
 * the device only in to_host and sync, in expert_load, and once per MoE
 * layer on the grouped (prefill) expert path, which needs the per-expert
 * row counts to size the cuBLAS grouped GEMM.  Decode-sized steps take the
 * small expert path and never wait inside the step (to_host_async, which
 * forward.c uses for statistics, does not wait).
 *
 * Memory: weights are uploaded once by prepare_model (see backend_cuda_impl.h);
 * activations are allocated by moe_forward_init through alloc; the
 * backend's own workspaces (half-precision GEMM inputs, attention split
 * partials, CUB sort space, grouped GEMM pointer arrays, expert load
 * counters) by reserve.  No op allocates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/synth.h"

#include "runtime/backend/backend_cuda_impl.h"

/* ---- memory ---- */

static enum moe_status cuda_alloc(struct moe_backend *be, size_t bytes, void **out)
{
    struct cuda_ctx *c = ctx_of(be);
    *out = NULL;
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *out = NULL;
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        return moe_fail(MOE_ERR_NOMEM, "cuda backend: cannot allocate %zu bytes (%s; %zu free)",
                        bytes, cudaGetErrorString(e), fr);
    }
    MOE_CUDA_TRY(cudaMemsetAsync(*out, 0, bytes ? bytes : 1, c->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    return MOE_OK;
}

static void cuda_dealloc(struct moe_backend *be, void *p)
{
    if (!p) return;
    /* recorded steps hold buffer addresses: freeing any buffer (a workspace
     * or cache going away, never inside a step) retires them all */
    moe_cuda_graphs_drop(&ctx_of(be)->graphs);
    cudaFree(p);
}

static enum moe_status cuda_to_device(struct moe_backend *be, void *dst, const void *src,
                                      size_t bytes)
{
    /* From pageable memory the call returns once src has been staged, so
     * the caller may reuse src at once. */
    if (bytes) MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx_of(be)->stream));
    return MOE_OK;
}

static enum moe_status cuda_to_host(struct moe_backend *be, void *dst, const void *src,
                                    size_t bytes)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!bytes) return MOE_OK;
    MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    return MOE_OK;
}

/* Host buffers for to_host_async: pinned, so the copy is a true async
 * DMA and a capturable graph node (pageable memory would break capture). */
static enum moe_status cuda_host_alloc(struct moe_backend *be, size_t bytes, void **out)
{
    *out = NULL;
    cudaError_t e = cudaMallocHost(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *out = NULL;
        cudaGetLastError();
        return moe_fail(MOE_ERR_NOMEM, "cuda backend: cannot allocate %zu bytes of pinned host "
                        "memory (%s)", bytes, cudaGetErrorString(e));
    }
    memset(*out, 0, bytes ? bytes : 1);
    return MOE_OK;
}

static void cuda_host_free(struct moe_backend *be, void *p)
{
    if (!p) return;
    /* recorded steps may copy into it (see cuda_dealloc) */
    moe_cuda_graphs_drop(&ctx_of(be)->graphs);
    cudaFreeHost(p);
}

static enum moe_status cuda_to_host_async(struct moe_backend *be, void *dst, const void *src,
                                          size_t bytes)
{
    if (bytes) MOE_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx_of(be)->stream));
    return MOE_OK;
}

static enum moe_status cuda_sync(struct moe_backend *be)
{
    MOE_CUDA_TRY(cudaStreamSynchronize(ctx_of(be)->stream));
    return MOE_OK;
}
/* ---- reserve: the backend's own workspaces ---- */

static void free_workspaces(struct cuda_ctx *c)
{
    moe_cuda_graphs_drop(&c->graphs); /* recorded steps use these buffers */
    struct cuda_work *w = &c->work;
    cudaFree(w->xh);
    cudaFree(w->att_ws);
    cudaFree(w->sort_temp);
    cudaFree(w->sort_vals);
    cudaFree(w->sort_keys);
    cudaFree(w->d_load);
    cudaFreeHost(w->h_load);
    cudaFree(w->wide_dense);
    memset(w, 0, sizeof *w);
    moe_cuda_experts_free(&c->experts);
}

static int imax(int a, int b) { return a > b ? a : b; }

/* The widest input MLA rounds to half in xh (runtime/engine/forward_mla.c):
 * q_b_proj's (Rq), o_proj's (Hq x v), and per row of head_matmul Hq x nope
 * (W_uk) and Hq x Rc (W_uv); 0 without MLA, -1 past INT_MAX. */
static long long mla_din(const struct moe_config *cfg)
{
    if (cfg->kv_lora_rank <= 0) return 0;
    const long long H = imax(cfg->n_heads, 1);
    long long d = cfg->q_lora_rank;
    const long long w[3] = {H * cfg->v_head_dim, H * cfg->qk_nope_dim, H * cfg->kv_lora_rank};
    for (int i = 0; i < 3; i++) d = w[i] > d ? w[i] : d;
    return d > INT32_MAX ? -1 : d;
}

/* Floats of the attention split workspace for cfg's heads: the per-row
 * kernel's (ATT_SPLIT_ROWS rows x Hq x ATT_MAX_SPLITS partials of Dh + 2
 * floats), or the MLA kernel's (attention/attention_mla_cuda.cu). */
static size_t attention_ws_floats(const struct moe_config *cfg)
{
    const int Hq = imax(cfg->n_heads, 1), Dh = imax(cfg->head_dim, 1);
    if (cfg->kv_lora_rank > 0) return moe_attention_mla_split_floats(Dh);
    return moe_attention_split_floats(ATT_SPLIT_ROWS, Hq, Dh, ATT_MAX_SPLITS);
}

/* What reserve sizes for steps of max_rows rows of a model configured as
 * cfg: the limits of struct cuda_work, and the bytes MXFP4 / FP8 / Q8_0
 * experts widen into (wide) and planes projections (dense). */
struct work_need {
    int rows, din, K, E, L;
    size_t att_floats, wide, dense;
    size_t mixed; /* floats of cuda_experts.mixed_rows (a per-expert plan) */
};

static enum moe_status work_need(const struct cuda_ctx *c, enum moe_weight_quant quant, bool plan,
                                 const struct moe_config *cfg, int max_rows, struct work_need *n)
{
    const int Q = cfg->n_heads * cfg->head_dim;
    const int dmax = imax(imax(cfg->d_model, Q), imax(cfg->d_ff, cfg->d_shared));
    const long long mla = mla_din(cfg);
    if (mla < 0) return moe_fail(MOE_ERR_INVALID_ARG, "cuda reserve: MLA inputs past %d values", INT32_MAX);
    *n = (struct work_need){.rows = max_rows, .din = imax(dmax, (int)mla), .K = imax(cfg->top_k, 1),
                            .E = imax(cfg->n_experts, 1), .L = imax(moe_config_moe_layers(cfg), 1),
                            .att_floats = attention_ws_floats(cfg)};
    /* MXFP4 / FP8 / Q8_0 / four-bit experts: the grouped path widens a
     * layer's to bf16 (those prepare_model kept as planes; before any, as
     * cfg says), or an offloaded layer's device slots; the tensor-core
     * kernels read them in place, four-bit ones excepted */
    const bool q8 = quant != MOE_QUANT_NONE;
    const bool q4 = c->mem.n_up ? c->weights.q4_experts
                                : cfg->q4_method != MOE_Q4_NONE || quant == MOE_QUANT_Q4 || quant == MOE_QUANT_Q4_K_M || plan;
    const bool planes = q4 || (!c->experts.mma && (c->mem.n_up ? c->weights.mxfp4_experts || c->weights.fp8_experts ||
                                                                     c->weights.q8_experts
                                                               : cfg->experts_mxfp4 || cfg->weights_fp8 || q8));
    const int C = c->off.opts.gpu_experts;
    const int Ew = C > 0 && C < cfg->n_experts ? C : cfg->n_experts;
    n->wide = planes ? moe_cuda_widened_layer_bytes(Ew, cfg->d_model, cfg->d_expert) : 0;
    if (planes && cfg->n_experts > 0 && !n->wide)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda reserve: %d experts of %d x %d overflow", cfg->n_experts,
                        cfg->d_model, cfg->d_expert);
    /* FP8, Q8_0 or four-bit projections kept as planes: widened for steps
     * of many rows, at most WIDE_DENSE_MAX values at a time (before
     * prepare_model: as cfg says, bounded by the widest input squared) */
    size_t dense = c->mem.n_up ? c->weights.planes_dense_max
                   : cfg->weights_fp8 || q8 || q4 ? (size_t)dmax * dmax : 0;
    if (dense > WIDE_DENSE_MAX) dense = WIDE_DENSE_MAX;
    if (!moe_mul_size(dense, 2, &n->dense)) return moe_fail(MOE_ERR_INVALID_ARG, "cuda reserve: FP8 matrix size");
    if (plan && cfg->n_experts > 0 &&
        (!moe_mul_size((size_t)max_rows * (size_t)n->K, (size_t)cfg->d_model, &n->mixed) ||
         n->mixed > SIZE_MAX / sizeof(float)))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda reserve: %d rows of %d experts' outputs overflow", max_rows,
                        n->K);
    return MOE_OK;
}

/* Frees the workspaces and allocates them for n (grown to at least what
 * they were). */
static enum moe_status alloc_work(struct cuda_ctx *c, struct work_need n)
{
    struct cuda_work *w = &c->work;
    n.rows = imax(n.rows, w->max_rows);
    n.din = imax(n.din, w->max_din);
    n.K = imax(n.K, w->max_k);
    n.E = imax(n.E, w->max_e);
    n.L = imax(n.L, w->moe_layers);
    if (c->experts.wide_bytes > n.wide) n.wide = c->experts.wide_bytes;
    if (w->wide_dense_bytes > n.dense) n.dense = w->wide_dense_bytes;
    if (c->experts.mixed_rows_floats > n.mixed) n.mixed = c->experts.mixed_rows_floats;
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    free_workspaces(c);
    size_t xh = (size_t)n.rows * n.din * 2, att, load = (size_t)n.L * n.E * sizeof(uint64_t);
    if (!moe_mul_size(n.att_floats, sizeof(float), &att))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda reserve: attention workspace size overflows");
    const size_t pairs = (size_t)n.rows * n.K;
    if (pairs > INT32_MAX) return moe_fail(MOE_ERR_INVALID_ARG, "cuda reserve: %zu routed rows", pairs);
    MOE_TRY(moe_router_dispatch_temp_bytes((int)pairs, n.E, &w->sort_bytes));
    MOE_CUDA_TRY(cudaMalloc(&w->xh, xh ? xh : 1));
    MOE_CUDA_TRY(cudaMalloc((void **)&w->att_ws, att));
    MOE_CUDA_TRY(cudaMalloc(&w->sort_temp, w->sort_bytes ? w->sort_bytes : 1));
    MOE_CUDA_TRY(cudaMalloc((void **)&w->sort_vals, pairs * sizeof(int32_t)));
    MOE_CUDA_TRY(cudaMalloc((void **)&w->sort_keys, pairs * sizeof(int32_t)));
    MOE_CUDA_TRY(cudaMalloc((void **)&w->d_load, load));
    MOE_CUDA_TRY(cudaMemsetAsync(w->d_load, 0, load, c->stream));
    MOE_CUDA_TRY(cudaMallocHost((void **)&w->h_load, load));
    if (n.dense) MOE_CUDA_TRY(cudaMalloc(&w->wide_dense, n.dense));
    w->wide_dense_bytes = n.dense;
    MOE_TRY(moe_cuda_experts_reserve(c, n.E, n.L, (int)pairs, n.wide, n.mixed));
    w->att_ws_floats = n.att_floats;
    w->max_rows = n.rows;
    w->max_din = n.din;
    w->max_k = n.K;
    w->max_e = n.E;
    w->moe_layers = n.L;
    return MOE_OK;
}

static enum moe_status cuda_reserve(struct moe_backend *be, const struct moe_config *cfg, int max_rows)
{
    struct cuda_ctx *c = ctx_of(be);
    const struct cuda_work *w = &c->work;
    struct work_need n = {0};
    MOE_TRY(work_need(c, be->quant, be->expert_quant != NULL, cfg, max_rows, &n));
    if (n.rows > w->max_rows || n.din > w->max_din || n.K > w->max_k || n.E > w->max_e || n.L > w->moe_layers ||
        n.att_floats > w->att_ws_floats || n.wide > c->experts.wide_bytes || n.dense > w->wide_dense_bytes ||
        n.mixed > c->experts.mixed_rows_floats)
        MOE_TRY(alloc_work(c, n));
    return moe_cuda_offload_reserve(c, w->max_rows * w->max_k);
}

/* ---- ops ---- */

static enum moe_status cuda_embed(struct moe_backend *be, float *x, const int32_t *tokens, int T,
                                  const struct moe_tensor *emb, int64_t first)
{
    ctx_of(be)->work.dispatch_ordinal = 0; /* a step starts here */
    return moe_ops_embed_cuda(ctx_of(be)->stream, x, tokens, T, emb->data, emb->dtype, first,
                              emb->shape[0], (int)emb->shape[1]);
}

static enum moe_status cuda_rmsnorm(struct moe_backend *be, float *y, const float *x,
                                    const struct moe_tensor *w, int rows, int dim, float eps)
{
    return moe_attention_rmsnorm_cuda(ctx_of(be)->stream, y, x, w->data, w->dtype, rows, dim, eps);
}


/* y (T, N) = x (T, Din) . W^T (+ b).
 *
 * Steps of at most SMALL_EXPERT_ROWS rows (decode, speculative
 * verification) take moe_ops_matmul_rows_cuda for every weight type: fp32
 * activations, each weight row read once per 8 input rows, and a row's
 * result independent of the other rows of the step (docs/cuda.md, "Rows of
 * one step").  MOERUN_CUDA_SMALL_MATMUL=cublas sends F32/BF16/F16 weights to
 * cuBLAS there too, for comparison.
 *
 * Larger steps: cuBLAS, column-major: the row-major y is the column-major
 * (N, T) product W^T(as stored, (Din, N) col-major)^T times x ((Din, T)
 * col-major).  cuBLAS needs A and B of one type, so for bf16/f16 weights the
 * fp32 activations are rounded to the weight's type by a pre-pass (one
 * extra read+write of T*Din activations, tiny next to the weights), and the
 * GEMM accumulates in fp32 and writes fp32.  Rounding the activations to
 * bf16 costs ~2^-9 relative per input, which the parity tolerances for bf16
 * models (1e-2) cover; fp32 weights use a pure fp32 GEMM (no TF32), so fp32
 * models stay at fp32 accuracy. */
static enum moe_status cuda_matmul(struct moe_backend *be, float *y, const float *x,
                                   const struct moe_tensor *w, const struct moe_tensor *b, int T)
{
    struct cuda_ctx *c = ctx_of(be);
    const int N = (int)w->shape[0], Din = (int)w->shape[1];
    const float one = 1.0f, zero = 0.0f;
    if (T <= 0) return MOE_OK;
    const bool plain = w->dtype == MOE_DTYPE_F32 || w->dtype == MOE_DTYPE_BF16 || w->dtype == MOE_DTYPE_F16;
    if (T <= SMALL_EXPERT_ROWS && (moe_dtype_planes(w->dtype) || (plain && !c->small_cublas)))
        return moe_ops_matmul_rows_cuda(c->stream, y, x, w->data, w->dtype, N, Din, T,
                                        b && b->data ? b->data : NULL, b ? b->dtype : MOE_DTYPE_F32);
    if (w->dtype == MOE_DTYPE_F32) {
        MOE_CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, Din, &one, w->data,
                                    CUDA_R_32F, Din, x, CUDA_R_32F, Din, &zero, y, CUDA_R_32F, N,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else if (w->dtype == MOE_DTYPE_BF16 || w->dtype == MOE_DTYPE_F16) {
        if (T > c->work.max_rows || Din > c->work.max_din)
            return moe_fail(MOE_ERR_INVALID_ARG,
                            "cuda matmul: %d x %d input exceeds the reserved %d x %d", T, Din,
                            c->work.max_rows, c->work.max_din);
        MOE_TRY(moe_ops_to_half_cuda(c->stream, c->work.xh, x, w->dtype, (size_t)T * Din));
        cudaDataType_t ty = cuda_type(w->dtype);
        MOE_CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, Din, &one, w->data, ty,
                                    Din, c->work.xh, ty, Din, &zero, y, CUDA_R_32F, N,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else if (moe_dtype_planes(w->dtype)) {
        /* many rows: widened to bf16 for the step's GEMMs, as many rows of
         * W at a time as the reserved buffer holds (outputs n0.. of y) */
        const int at = (int)(c->work.wide_dense_bytes / ((size_t)Din * 2) < (size_t)N
                                 ? c->work.wide_dense_bytes / ((size_t)Din * 2) : (size_t)N);
        if (at < 1 || T > c->work.max_rows || Din > c->work.max_din)
            return moe_fail(MOE_ERR_INVALID_ARG, "cuda matmul: %s matrix %d x %d, %d rows: past the reserved "
                            "%zu bytes or %d x %d", moe_dtype_name(w->dtype), N, Din, T, c->work.wide_dense_bytes,
                            c->work.max_rows, c->work.max_din);
        MOE_TRY(moe_ops_to_half_cuda(c->stream, c->work.xh, x, MOE_DTYPE_BF16, (size_t)T * Din));
        const char *scales = (const char *)w->data + moe_planes_values_bytes(w->dtype, (size_t)N, (size_t)Din);
        for (int n0 = 0; n0 < N; n0 += at) {
            const int nc = N - n0 < at ? N - n0 : at;
            MOE_TRY(moe_planes_widen_cuda(c->stream, c->work.wide_dense,
                                          (const char *)w->data + moe_planes_values_bytes(w->dtype, (size_t)n0, (size_t)Din),
                                          scales + moe_planes_scales_bytes(w->dtype, (size_t)n0, (size_t)Din), w->dtype,
                                          (size_t)nc, (size_t)Din));
            MOE_CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, nc, T, Din, &one, c->work.wide_dense,
                                        CUDA_R_16BF, Din, c->work.xh, CUDA_R_16BF, Din, &zero, y + n0, CUDA_R_32F, N,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
    } else {
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda matmul: weight dtype %s",
                        moe_dtype_name(w->dtype));
    }
    if (b && b->data) MOE_TRY(moe_ops_bias_cuda(c->stream, y, b->data, b->dtype, T, N));
    return MOE_OK;
}

static enum moe_status cuda_add(struct moe_backend *be, float *y, const float *x, size_t n)
{
    return moe_ops_add_cuda(ctx_of(be)->stream, y, x, n);
}

static enum moe_status cuda_scale(struct moe_backend *be, float *x, size_t n, float s)
{
    return moe_ops_scale_cuda(ctx_of(be)->stream, x, n, s);
}

static enum moe_status cuda_clamp(struct moe_backend *be, float *x, size_t n, float limit)
{
    return moe_ops_clamp_cuda(ctx_of(be)->stream, x, n, limit);
}

static enum moe_status cuda_swiglu(struct moe_backend *be, float *g, const float *u, size_t n)
{
    return moe_experts_swiglu_cuda(ctx_of(be)->stream, g, u, n);
}

static enum moe_status cuda_rope(struct moe_backend *be, float *x, const int32_t *pos, int T,
                                 int H, int Dh, int rot, const float *inv_freq)
{
    return moe_attention_rope_cuda(ctx_of(be)->stream, x, pos, T, H, Dh, rot, inv_freq);
}

static enum moe_status cuda_kv_store(struct moe_backend *be, struct moe_kvcache *kv, int layer,
                                     const float *k, const float *v, const int32_t *slots, int T)
{
    return moe_attention_kv_store_cuda(ctx_of(be)->stream, kv, layer, k, v, slots, T);
}

static enum moe_status cuda_delta_net(struct moe_backend *be, float *out, float *qkv, const float *b,
                                      const float *a, struct moe_kvcache *kv, const struct moe_batch *bt,
                                      const struct moe_delta_params *p)
{
    return moe_attention_delta_cuda(ctx_of(be)->stream, out, qkv, b, a, kv, bt, p);
}

static enum moe_status cuda_attention(struct moe_backend *be, float *out, const float *q,
                                      const struct moe_kvcache *kv, const struct moe_batch *b,
                                      const struct moe_attn_params *p)
{
    struct cuda_ctx *c = ctx_of(be);
    if (kv->v == kv->k) { /* MLA: one row per token read as K and V, every step size */
        struct moe_attn_params pp = *p;
        if (c->graphs.capturing) pp.max_ctx = 0; /* a recorded launch must not depend on lengths */
        const bool split = b->n_tokens <= ATT_SPLIT_ROWS && c->work.att_ws;
        return moe_attention_mla_cuda(c->stream, out, q, kv, b, &pp, c->mla_max_dh,
                                      split ? c->work.att_ws : NULL, split ? c->work.att_ws_floats : 0,
                                      ATT_MAX_SPLITS);
    }
    /* the split space was sized for the reserved model's heads */
    int ws_rows = c->work.att_ws && moe_attention_split_floats(ATT_SPLIT_ROWS, p->n_heads, p->head_dim,
                                                          ATT_MAX_SPLITS) <= c->work.att_ws_floats
                      ? ATT_SPLIT_ROWS : 0;
    /* prefill-sized steps: the tiled kernel shares each K/V tile among 32
     * query rows (unless MOERUN_CUDA_PREFILL_ATTN=rows asked for the per-row
     * kernel, for comparison) */
    if (b->n_tokens > ATT_SPLIT_ROWS && !c->prefill_rows) {
        if (c->prefill_mma && moe_attention_mma_supported(kv, p))
            return moe_attention_prefill_mma_cuda(c->stream, out, q, kv, b, p);
        return moe_attention_prefill_cuda(c->stream, out, q, kv, b, p);
    }
    struct moe_attn_params pp = *p;
    if (c->graphs.capturing) pp.max_ctx = 0; /* a recorded launch must not depend on lengths */
    return moe_attention_paged_cuda(c->stream, out, q, kv, b, &pp, c->work.att_ws, ws_rows,
                                    ATT_MAX_SPLITS);
}

static enum moe_status cuda_route(struct moe_backend *be, int32_t *ids, float *w,
                                  const float *logits, int T, const struct moe_route *r)
{
    /* groups (DeepSeek-V2's group_limited_greedy, the sigmoid routers') and
     * routed_scaling_factor inside the kernels */
    if (r->sigmoid) return moe_router_topk_sigmoid_cuda(ctx_of(be)->stream, ids, w, logits, T, r);
    return moe_router_topk_softmax_cuda(ctx_of(be)->stream, ids, w, logits, T, r);
}

static enum moe_status cuda_dispatch(struct moe_backend *be, struct moe_dispatch *plan,
                                     const int32_t *ids, int T, int K, int E)
{
    struct cuda_ctx *c = ctx_of(be);
    if ((size_t)T * K > (size_t)c->work.max_rows * c->work.max_k || E > c->work.max_e)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda dispatch: %d x %d pairs over %d experts exceed "
                        "the reserved %d x %d over %d", T, K, E, c->work.max_rows, c->work.max_k, c->work.max_e);
    uint64_t *load = NULL;
    if (c->work.d_load && c->work.dispatch_ordinal < c->work.moe_layers)
        load = c->work.d_load + (size_t)c->work.dispatch_ordinal * c->work.max_e;
    c->work.dispatch_ordinal++;
    /* sort_bytes was asked for max_rows * max_k pairs over max_e at reserve */
    return moe_router_dispatch_cuda(c->stream, plan, ids, T, K, E, c->work.sort_temp, c->work.sort_bytes,
                                    c->work.max_rows * c->work.max_k, c->work.max_e, c->work.sort_vals, c->work.sort_keys,
                                    load);
}

static enum moe_status cuda_sigmoid_scale(struct moe_backend *be, float *y, const float *g, int T,
                                          int D)
{
    return moe_ops_sigmoid_scale_cuda(ctx_of(be)->stream, y, g, T, D);
}

static enum moe_status cuda_gather_rows(struct moe_backend *be, float *dst, const float *src,
                                        const int32_t *rows, int n, int D)
{
    return moe_ops_gather_rows_cuda(ctx_of(be)->stream, dst, src, rows, n, D);
}

/* MLA's column gathers (runtime/engine/forward_mla.c). */
static enum moe_status cuda_gather_cols(struct moe_backend *be, float *dst, int ld_dst,
                                        const float *src, int ld_src, int rows, const int32_t *idx,
                                        int n)
{
    return moe_ops_gather_cols_cuda(ctx_of(be)->stream, dst, ld_dst, src, ld_src, rows, idx, n);
}

/* MLA's per-head products (backend.h): for each head h < H, the row-major
 * (T, N) block of y at y + h*ldy (rows H*ldy apart) = the (T, K) block of x
 * at x + h*ldx (rows H*ldx apart) times W[h]^T, W (H, N, K).  Steps of at
 * most SMALL_EXPERT_ROWS rows: the row kernel over every head
 * (moe_ops_head_matmul_rows_cuda; fp32 activations, a row independent of
 * the others).  Larger: one cublasGemmStridedBatchedEx over the heads; per head, in cuBLAS's
 * column-major terms, C (N x T, ldc H*ldy) = op_T(W[h] stored as K x N,
 * lda K) . B (K x T, ldb H*ldx), heads N*K, ldx and ldy apart.  Precision
 * as cuda_matmul: fp32 weights take a pure fp32 GEMM (no TF32); for half
 * weights the (T*H, K) inputs are rounded to the weight type and packed
 * into xh first (ldb H*K, heads K apart); fp32 accumulation and output. */
static enum moe_status cuda_head_matmul(struct moe_backend *be, float *y, int ldy, const float *x,
                                        int ldx, const struct moe_tensor *w, int T)
{
    struct cuda_ctx *c = ctx_of(be);
    if (w->ndim != 3 || w->shape[0] <= 0 || w->shape[1] <= 0 || w->shape[2] <= 0 ||
        w->shape[0] > INT32_MAX || w->shape[1] > INT32_MAX || w->shape[2] > INT32_MAX)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda head_matmul: weight of %d dims is not (H, N, K)",
                        w->ndim);
    const int H = (int)w->shape[0], N = (int)w->shape[1], K = (int)w->shape[2];
    if (T <= 0) return MOE_OK;
    const long long ldb = (long long)H * ldx, ldc = (long long)H * ldy, ldh = (long long)H * K;
    if (ldy < N || ldx < K || ldb > INT32_MAX || ldc > INT32_MAX || ldh > INT32_MAX)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda head_matmul: %d heads of (%d, %d) with row "
                        "strides %d and %d", H, N, K, ldy, ldx);
    /* steps of few rows: the row kernel, a row independent of the others */
    if (T <= SMALL_EXPERT_ROWS && !c->small_cublas &&
        (w->dtype == MOE_DTYPE_F32 || w->dtype == MOE_DTYPE_BF16 || w->dtype == MOE_DTYPE_F16))
        return moe_ops_head_matmul_rows_cuda(c->stream, y, ldy, x, ldx, w->data, w->dtype, H, N, K, T);
    const float one = 1.0f, zero = 0.0f;
    const long long stride_w = (long long)N * K;
    if (w->dtype == MOE_DTYPE_F32) {
        MOE_CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one,
                                                  w->data, CUDA_R_32F, K, stride_w, x, CUDA_R_32F,
                                                  (int)ldb, ldx, &zero, y, CUDA_R_32F, (int)ldc,
                                                  ldy, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return MOE_OK;
    }
    if (w->dtype != MOE_DTYPE_BF16 && w->dtype != MOE_DTYPE_F16)
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda head_matmul: weight dtype %s",
                        moe_dtype_name(w->dtype));
    /* (T*H, K) half inputs: T*H*K <= max_rows*max_din when T <= max_rows
     * (reserve counts H*nope and H*Rc in max_din for MLA models) */
    if (!c->work.xh || T > c->work.max_rows || (size_t)T * (size_t)ldh > (size_t)c->work.max_rows * c->work.max_din)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda head_matmul: %d x %d x %d inputs exceed the "
                        "reserved %d x %d", T, H, K, c->work.max_rows, c->work.max_din);
    MOE_TRY(moe_ops_to_half_rows_cuda(c->stream, c->work.xh, x, ldx, w->dtype, (size_t)T * H, K));
    const cudaDataType_t ty = cuda_type(w->dtype);
    MOE_CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one,
                                              w->data, ty, K, stride_w, c->work.xh, ty, (int)ldh, K,
                                              &zero, y, CUDA_R_32F, (int)ldc, ldy, H,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return MOE_OK;
}

static enum moe_status cuda_synth_fill(struct moe_backend *be, void *dst, enum moe_dtype dt,
                                       size_t n, uint64_t key, float std)
{
    return moe_ops_synth_fill_cuda(ctx_of(be)->stream, dst, dt, n, key, std);
}

static enum moe_status cuda_argmax(struct moe_backend *be, int32_t *ids, const float *x, int rows,
                                   int n)
{
    return moe_ops_argmax_cuda(ctx_of(be)->stream, ids, x, rows, n);
}

static enum moe_status cuda_expert_load(struct moe_backend *be, uint64_t *out, int n_moe_layers,
                                        int E)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!c->work.d_load || n_moe_layers > c->work.moe_layers || E != c->work.max_e)
        return moe_fail(MOE_ERR_INVALID_ARG, "expert_load: %d x %d counters asked, %d x %d kept",
                        n_moe_layers, E, c->work.moe_layers, c->work.max_e);
    const size_t bytes = (size_t)n_moe_layers * E * sizeof(uint64_t);
    MOE_CUDA_TRY(cudaMemcpyAsync(c->work.h_load, c->work.d_load, bytes, cudaMemcpyDeviceToHost, c->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    memcpy(out, c->work.h_load, bytes);
    return MOE_OK;
}

/* ---- experts: resident, or offloaded (the layer's handle says which) ---- */

static enum moe_status cuda_experts(struct moe_backend *be, float *out, const float *x,
                                    const struct moe_dispatch *plan, const float *w,
                                    const struct moe_expert_weights *ex, const struct moe_expert_ws *ws, int T,
                                    int K, int D, int F, int E)
{
    struct cuda_ctx *c = ctx_of(be);
    if (plan->hi > 0) return moe_cuda_experts_ep(c, x, plan, ex, ws, T, K, D, F, E);
    if (ex->dtypes && ex->backend_layer) /* a per-expert plan's layer (offload refuses plans) */
        return moe_cuda_experts_mixed(c, ex->backend_layer, out, x, plan, w, ex, ws, T, K, D, F, E);
    if (ex->backend_layer)
        return moe_cuda_offload_experts(c, ex->backend_layer, out, x, plan, w, ex, ws, T, K, D, F, E);
    return moe_cuda_experts_resident(c, out, x, plan, w, ex, ws, T, K, D, F, E);
}

/* After an expert-parallel experts call and the gathering: every slot's
 * rows in fp32 (moe_cuda_experts_ep), combined in k order. */
static enum moe_status cuda_combine(struct moe_backend *be, float *out, const struct moe_expert_ws *ws,
                                    const struct moe_dispatch *plan, const float *w, int T, int K, int D)
{
    return moe_experts_combine_cuda(ctx_of(be)->stream, out, ws->ye, MOE_DTYPE_F32, w, plan->pos, T, K, D,
                                    plan->offsets, 0, NULL);
}

/* ---- step graphs ---- */

static enum moe_status cuda_graph_begin(struct moe_backend *be, const void *key, int rows,
                                        int n_logits, bool *replay)
{
    struct cuda_ctx *c = ctx_of(be);
    /* only steps without host synchronisation can be recorded: the grouped
     * expert path (more rows) and offloaded experts wait for the counts */
    if (rows > SMALL_EXPERT_ROWS || c->off.n) {
        *replay = false;
        c->graphs.replaying = 0;
        return MOE_OK;
    }
    return moe_cuda_graphs_begin(&c->graphs, c->stream, key, rows, n_logits, replay);
}

static enum moe_status cuda_graph_end(struct moe_backend *be, bool ok)
{
    struct cuda_ctx *c = ctx_of(be);
    return moe_cuda_graphs_end(&c->graphs, c->stream, ok);
}

static void cuda_destroy(struct moe_backend *be)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (int g = 0; g < MOE_COLL_GROUPS; g++) moe_cuda_coll_close(be, g);
    free_workspaces(c);
    moe_cuda_offload_free(&c->off);
    moe_cuda_mem_free(&c->mem);
    moe_cuda_graphs_drop(&c->graphs);
    if (c->blas) cublasDestroy(c->blas);
    moe_cuda_graphs_free(&c->graphs); /* its workspace after the handle that used it */
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
    be->ctx = NULL;
}

static const struct moe_backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .dealloc = cuda_dealloc,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .prepare_model = moe_cuda_prepare_model,
    .sync = cuda_sync,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .matmul = cuda_matmul,
    .add = cuda_add,
    .scale = cuda_scale,
    .clamp = cuda_clamp,
    .swiglu = cuda_swiglu,
    .rope = cuda_rope,
    .kv_store = cuda_kv_store,
    .delta_net = cuda_delta_net,
    .attention = cuda_attention,
    .route = cuda_route,
    .dispatch = cuda_dispatch,
    .experts = cuda_experts,
    .sigmoid_scale = cuda_sigmoid_scale,
    .gather_rows = cuda_gather_rows,
    .gather_cols = cuda_gather_cols,
    .head_matmul = cuda_head_matmul,
    .reserve = cuda_reserve,
    .synth_fill = cuda_synth_fill,
    .argmax = cuda_argmax,
    .expert_load = cuda_expert_load,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .to_host_async = cuda_to_host_async,
    .combine = cuda_combine,
    .coll_id = moe_cuda_coll_id,
    .coll_open = moe_cuda_coll_open,
    .coll_close = moe_cuda_coll_close,
    .coll_sum = moe_cuda_coll_sum,
    .coll_share = moe_cuda_coll_share,
    .coll_gather = moe_cuda_coll_gather,
};

static enum moe_status cuda_init(struct moe_backend *be, struct cuda_ctx *c,
                                 const struct moe_backend_opts *o)
{
    int device = o->device, count = 0;
    if (o->local_rank > 0) { /* several ranks on a machine: one device each, round robin */
        MOE_CUDA_TRY(cudaGetDeviceCount(&count));
        if (count > 0) device = (int)(((int64_t)device + o->local_rank) % count);
    }
    c->device = device;
    c->cpu_isa = moe_cpu_isa_choose(o->cpu_isa_max);
    MOE_CUDA_TRY(cudaSetDevice(device));
    MOE_CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    MOE_CUBLAS_TRY(cublasCreate(&c->blas));
    MOE_CUBLAS_TRY(cublasSetStream(c->blas, c->stream));
    /* plain fp32 GEMMs for fp32 weights: no TF32 */
    MOE_CUBLAS_TRY(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    MOE_TRY(moe_cuda_graphs_init(&c->graphs, c->blas, o->cuda_graphs));
    c->strict = o->cuda_strict;
    c->prefill_rows = o->prefill_attn == MOE_PREFILL_ATTN_ROWS;
    c->prefill_mma = o->prefill_attn == MOE_PREFILL_ATTN_MMA;
    c->small_cublas = o->cuda_small_cublas;
    c->experts.gemm_loop = o->cuda_expert_gemm_loop;
    c->experts.mma = o->expert_kernels == MOE_EXPERT_KERNELS_MMA;
    c->off.opts = o->offload;
    c->off.opts.warm = NULL; /* a copy of its own, below */
    if (o->offload.warm) {
        size_t n;
        double *warm;
        if (o->offload.warm_layers < 0 || o->offload.warm_e < 0 ||
            !moe_mul_size((size_t)o->offload.warm_layers, (size_t)o->offload.warm_e, &n) ||
            !moe_mul_size(n, sizeof(double), &n) || !(warm = malloc(n ? n : 1)))
            return moe_fail(MOE_ERR_NOMEM, "cuda backend: warm start of %d x %d experts",
                            o->offload.warm_layers, o->offload.warm_e);
        memcpy(warm, o->offload.warm, n);
        c->off.opts.warm = warm;
    }
    /* MLA attention: the largest head dim this device's shared memory allows */
    c->mla_max_dh = moe_attention_mla_setup_cuda();
    if (!c->prefill_rows && moe_attention_prefill_setup_cuda() != MOE_OK) {
        fprintf(stderr, "moerun: tiled prefill attention unavailable (%s): per-row kernel\n",
                moe_last_error());
        cudaGetLastError();
        c->prefill_rows = true;
    }
    return MOE_OK;
}

int64_t moe_cuda_graph_replays(const struct moe_backend *be)
{
    return be->ops && !strcmp(be->ops->name, "cuda") ? ((const struct cuda_ctx *)be->ctx)->graphs.replays : 0;
}

int64_t moe_cuda_mma_expert_calls(const struct moe_backend *be)
{
    return be->ops && !strcmp(be->ops->name, "cuda") ? ((const struct cuda_ctx *)be->ctx)->experts.mma_calls : 0;
}

void moe_cuda_offload_stats(const struct moe_backend *be, struct moe_offload_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!be->ops || strcmp(be->ops->name, "cuda")) return;
    const struct cuda_ctx *c = be->ctx;
    st->layers = c->off.n;
    st->bytes_in = c->off.bytes_in;
    st->host_bytes = c->off.host_bytes;
    for (int i = 0; i < c->off.n; i++) {
        st->accesses += c->off.layers[i]->cache.accesses;
        st->hits += c->off.layers[i]->cache.hits;
        st->steps += c->off.layers[i]->steps;
        st->rounds += c->off.layers[i]->rounds;
        st->grouped_steps += c->off.layers[i]->grouped_steps;
        st->cpu_uses += c->off.layers[i]->cpu_uses;
        st->cpu_rows += c->off.layers[i]->cpu_rows;
    }
}

enum moe_status moe_backend_cuda_open(struct moe_backend *be, const struct moe_backend_opts *o)
{
    memset(be, 0, sizeof *be);
    struct cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return moe_fail(MOE_ERR_NOMEM, "cuda backend");
    be->ops = &cuda_ops;
    be->ctx = c;
    be->n_threads = 1;
    enum moe_status s = cuda_init(be, c, o);
    if (s != MOE_OK) {
        cuda_destroy(be);
        memset(be, 0, sizeof *be);
    }
    return s;
}
