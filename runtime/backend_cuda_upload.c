/* backend_cuda_upload.c - the CUDA backend's prepare_model: every weight
 * uploaded once in its stored dtype (or generated on the device for a
 * deferred synthetic model; MXFP4 and FP8 weights widened to bf16), experts
 * stacked per layer into (E, 2F, D) and (E, D, F) buffers, and the model's
 * views rewritten to device pointers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend_cuda_impl.h"
#include "runtime/synth.h"

/* ---- prepare_model: weights to the device ---- */

static enum moe_status dev_buffer(struct moe_backend *be, size_t bytes, void **out)
{
    struct cuda_ctx *c = ctx_of(be);
    MOE_CUDA_TRY(cudaMalloc(out, bytes ? bytes : 1));
    enum moe_status s = moe_cuda_keep_owned(c, *out);
    if (s != MOE_OK) {
        cudaFree(*out);
        *out = NULL;
    }
    return s;
}

/* Rewrites view t to a device copy of its data (shared with an earlier view
 * of the same host data, e.g. tied embeddings). */
/* Index of the checkpoint tensor whose data is p (deferred synthetic
 * models: the generator key is the tensor's index), or -1. */
static int tensor_index(const struct moe_model *m, const void *p)
{
    for (size_t i = 0; i < m->st.n_tensors; i++)
        if (m->st.tensors[i].data == p) return (int)i;
    return -1;
}

/* Fills a device buffer of n elements from the deferred placeholder ph. */
static enum moe_status synth_view(struct moe_backend *be, const struct moe_model *m, void *d,
                                  const void *ph, enum moe_dtype dt, size_t n)
{
    int i = tensor_index(m, ph);
    if (i < 0) return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: deferred weight not in the set");
    bool ones = *(const unsigned char *)ph != 0;
    return moe_ops_synth_fill_cuda(ctx_of(be)->stream, d, dt, n, moe_synth_key(m->synth_seed, i),
                                   ones ? -1.0f : m->synth_std);
}

/* dst (bf16 on the device) = the src_bytes of host rows src in dt (MXFP4
 * or FP8_B128) widened, through stage (device memory of src_bytes or more):
 * a copy then a kernel on the backend's stream (runtime/ops_cuda.cu). */
static enum moe_status widen_rows(struct moe_backend *be, void *dst, const void *src, size_t src_bytes,
                                  enum moe_dtype dt, void *stage)
{
    struct cuda_ctx *c = ctx_of(be);
    MOE_CUDA_TRY(cudaMemcpyAsync(stage, src, src_bytes, cudaMemcpyHostToDevice, c->stream));
    if (dt == MOE_DTYPE_MXFP4) return moe_ops_mxfp4_to_bf16_cuda(c->stream, dst, stage, src_bytes / MOE_MXFP4_BYTES);
    MOE_ASSERT(dt == MOE_DTYPE_FP8_B128);
    return moe_ops_fp8_to_bf16_cuda(c->stream, dst, stage, src_bytes / MOE_FP8_BYTES);
}

/* An FP8_B128 view (an fp8 checkpoint's attention, dense or shared FFN
 * weight) widened to a bf16 device copy: the fp32 value of each weight,
 * rounded once. */
static enum moe_status upload_fp8_view(struct moe_backend *be, struct moe_tensor *t, size_t n, void **out)
{
    struct cuda_ctx *c = ctx_of(be);
    const size_t K = (size_t)t->shape[t->ndim - 1], src = n / K * moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, K);
    void *stage;
    MOE_TRY(dev_buffer(be, n * 2, out));
    MOE_CUDA_TRY(cudaMalloc(&stage, src));
    enum moe_status s = widen_rows(be, *out, t->data, src, MOE_DTYPE_FP8_B128, stage);
    const cudaError_t ce = cudaStreamSynchronize(c->stream);
    cudaFree(stage);
    if (s == MOE_OK && ce != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "cuda upload: %s", cudaGetErrorString(ce));
    c->widened_fp8 = true;
    return s;
}

static enum moe_status upload_view(struct moe_backend *be, const struct moe_model *m,
                                   struct moe_tensor *t, enum part part)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!t->data || t->device >= 0) return MOE_OK;
    for (size_t i = 0; i < c->n_up; i++)
        if (c->up[i].host == t->data) {
            t->data = c->up[i].dev;
            t->device = c->device;
            if (t->dtype == MOE_DTYPE_FP8_B128) t->dtype = MOE_DTYPE_BF16; /* widened */
            return MOE_OK;
        }
    int64_t n = moe_tensor_numel(t);
    if (n < 0) return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: bad tensor shape");
    const bool fp8 = t->dtype == MOE_DTYPE_FP8_B128;
    size_t bytes = (size_t)n * (fp8 ? 2 : moe_dtype_size(t->dtype));
    void *d;
    if (fp8) {
        MOE_TRY(upload_fp8_view(be, t, (size_t)n, &d));
        t->dtype = MOE_DTYPE_BF16;
    } else {
        MOE_TRY(dev_buffer(be, bytes, &d));
        if (m->weights_deferred) MOE_TRY(synth_view(be, m, d, t->data, t->dtype, (size_t)n));
        else MOE_CUDA_TRY(cudaMemcpy(d, t->data, bytes, cudaMemcpyHostToDevice));
    }
    if (c->n_up == c->cap_up) {
        size_t m = c->cap_up ? 2 * c->cap_up : 256;
        struct upload *u = realloc(c->up, m * sizeof *u);
        if (!u) return moe_fail(MOE_ERR_NOMEM, "cuda backend: upload table");
        c->up = u;
        c->cap_up = m;
    }
    c->up[c->n_up++] = (struct upload){t->data, d};
    c->part_bytes[part] += bytes;
    t->data = d;
    t->device = c->device;
    return MOE_OK;
}

/* MXFP4 experts (gpt-oss) or FP8_B128 ones (fp8 checkpoints) widened to
 * bf16 on the device: each matrix's rows copied to a staging buffer,
 * widened into the stacked (E, 2F, D) and (E, D, F) buffers (MXFP4
 * exactly; FP8 rounded once to bf16: runtime/cuda_util.h).  3.8x the bytes
 * of the 4.25-bit MXFP4 weights, 1.9x those of FP8, for want of such
 * kernels on the GPU yet. */
static enum moe_status widen_experts(struct moe_backend *be, struct moe_expert_weights *x, int E, int D, int F,
                                     void *gu, void *dn)
{
    struct cuda_ctx *c = ctx_of(be);
    const size_t rg = moe_dtype_row_bytes(x->dtype, (size_t)D), rd = moe_dtype_row_bytes(x->dtype, (size_t)F);
    const size_t big = (size_t)F * rg > (size_t)D * rd ? (size_t)F * rg : (size_t)D * rd;
    void *stage;
    MOE_CUDA_TRY(cudaMalloc(&stage, big));
    enum moe_status s = MOE_OK;
    const size_t mat = (size_t)F * D * 2; /* bf16 bytes of one matrix */
    for (int e = 0; e < E && s == MOE_OK; e++) {
        const void *src[3] = {x->gate[e], x->up[e], x->down[e]};
        char *dst[3] = {(char *)gu + 2 * mat * e, (char *)gu + 2 * mat * e + mat, (char *)dn + mat * e};
        const size_t bytes[3] = {(size_t)F * rg, (size_t)F * rg, (size_t)D * rd};
        for (int i = 0; i < 3 && s == MOE_OK; i++) s = widen_rows(be, dst[i], src[i], bytes[i], x->dtype, stage);
    }
    cudaError_t ce = cudaStreamSynchronize(c->stream);
    cudaFree(stage);
    if (s == MOE_OK && ce != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "cuda upload: %s", cudaGetErrorString(ce));
    return s;
}

/* Stacks a layer's experts into (E, 2F, D) gate+up and (E, D, F) down device
 * buffers and points the expert table into them. */
static enum moe_status upload_experts(struct moe_backend *be, const struct moe_model *m,
                                      struct moe_expert_weights *x, int E, int D, int F)
{
    struct cuda_ctx *c = ctx_of(be);
    /* MXFP4 and FP8 experts are widened to bf16 (widen_experts) */
    const bool widen = x->dtype == MOE_DTYPE_MXFP4 || x->dtype == MOE_DTYPE_FP8_B128;
    const size_t es = widen ? 2 : moe_dtype_size(x->dtype), mat = (size_t)F * D * es;
    void *gu, *dn;
    MOE_TRY(dev_buffer(be, 2 * mat * (size_t)E, &gu));
    MOE_TRY(dev_buffer(be, mat * (size_t)E, &dn));
    /* one copy when the checkpoint is already stacked, else per matrix */
    bool stacked = !widen;
    for (int e = 0; e < E && stacked; e++)
        stacked = (const char *)x->gate[e] == (const char *)x->gate[0] + 2 * mat * e &&
                  (const char *)x->up[e] == (const char *)x->gate[e] + mat &&
                  (const char *)x->down[e] == (const char *)x->down[0] + mat * e;
    if (widen) {
        MOE_TRY(widen_experts(be, x, E, D, F, gu, dn));
        if (x->dtype == MOE_DTYPE_MXFP4) c->widened_mxfp4 = true;
        else c->widened_fp8 = true;
        x->dtype = MOE_DTYPE_BF16;
    } else if (m->weights_deferred) {
        /* synth.c makes gate_up_proj (E, 2F, D) and down_proj (E, D, F)
         * tensors: the device layout, value for value */
        if (!stacked) return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: deferred experts not stacked");
        MOE_TRY(synth_view(be, m, gu, x->gate[0], x->dtype, 2 * (size_t)F * D * E));
        MOE_TRY(synth_view(be, m, dn, x->down[0], x->dtype, (size_t)F * D * E));
    } else if (stacked) {
        MOE_CUDA_TRY(cudaMemcpy(gu, x->gate[0], 2 * mat * E, cudaMemcpyHostToDevice));
        MOE_CUDA_TRY(cudaMemcpy(dn, x->down[0], mat * E, cudaMemcpyHostToDevice));
    } else {
        for (int e = 0; e < E; e++) {
            MOE_CUDA_TRY(cudaMemcpy((char *)gu + 2 * mat * e, x->gate[e], mat, cudaMemcpyHostToDevice));
            MOE_CUDA_TRY(cudaMemcpy((char *)gu + 2 * mat * e + mat, x->up[e], mat, cudaMemcpyHostToDevice));
            MOE_CUDA_TRY(cudaMemcpy((char *)dn + mat * e, x->down[e], mat, cudaMemcpyHostToDevice));
        }
    }
    for (int e = 0; e < E; e++) {
        x->gate[e] = (const char *)gu + 2 * mat * e;
        x->up[e] = (const char *)gu + 2 * mat * e + mat;
        x->down[e] = (const char *)dn + mat * e;
    }
    c->part_bytes[P_EXPERTS] += 3 * mat * (size_t)E;
    return MOE_OK;
}

/* Whether a weight of m other than the experts is MXFP4 (no loader makes
 * one; experts are widened to bf16 at upload). */
static bool has_mxfp4(const struct moe_model *m)
{
    if (m->lm_head.dtype == MOE_DTYPE_MXFP4 || m->embed.dtype == MOE_DTYPE_MXFP4) return true;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct moe_layer_weights *w = &m->layers[l];
        const struct moe_tensor *ts[] = {&w->wq,     &w->wk,    &w->wv,      &w->wo,
                                         &w->w_gate, &w->w_up,  &w->w_down,  &w->router,
                                         &w->sh_gate, &w->sh_up, &w->sh_down, &w->sh_router};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
            if (ts[i]->dtype == MOE_DTYPE_MXFP4) return true;
    }
    return false;
}

enum moe_status moe_cuda_prepare_model(struct moe_backend *be, struct moe_model *m)
{
    struct cuda_ctx *c = ctx_of(be);
    const struct moe_config *cfg = &m->cfg;
    if (m->embed.device >= 0) return MOE_OK; /* already on the device */
    if (be->quant != MOE_QUANT_NONE)
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: quantized weights (--quantize) run on the "
                        "CPU backends only so far");
    if (has_mxfp4(m))
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: MXFP4 weights other than experts are not "
                        "supported");
    for (int l = 0; l < cfg->n_layers; l++)
        if (m->layers[l].wq.dtype == MOE_DTYPE_Q8_0 || m->layers[l].wq.dtype == MOE_DTYPE_BF16_PANEL ||
            (m->layers[l].experts.gate && (m->layers[l].experts.dtype == MOE_DTYPE_Q8_0 ||
                                           m->layers[l].experts.dtype == MOE_DTYPE_BF16_PANEL)))
            return moe_fail(MOE_ERR_INVALID_ARG, "cuda backend: the model's weights were repacked or "
                            "quantized for a CPU backend; load it again for this one");
    /* deduplicate within this model only: a later model's host data may
     * reuse an earlier one's (freed) addresses */
    c->n_up = 0;
    c->widened_mxfp4 = c->widened_fp8 = false;
    memset(c->part_bytes, 0, sizeof c->part_bytes);
    MOE_TRY(upload_view(be, m, &m->embed, P_EMBED));
    MOE_TRY(upload_view(be, m, &m->lm_head, cfg->tie_embeddings ? P_EMBED : P_HEAD));
    MOE_TRY(upload_view(be, m, &m->final_norm, P_NORM));
    for (int l = 0; l < cfg->n_layers; l++) {
        struct moe_layer_weights *w = &m->layers[l];
        struct moe_tensor *attn[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->bq,
                                     &w->bk, &w->bv, &w->bo, &w->q_norm, &w->k_norm,
                                     /* MLA (absent elsewhere) */
                                     &w->wq_a, &w->q_a_norm, &w->wkv_a, &w->kv_a_norm,
                                     &w->w_uk, &w->w_uv};
        for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) MOE_TRY(upload_view(be, m, attn[i], P_ATTN));
        MOE_TRY(upload_view(be, m, &w->attn_norm, P_NORM));
        MOE_TRY(upload_view(be, m, &w->ffn_norm, P_NORM));
        struct moe_tensor *dense[] = {&w->w_gate, &w->w_up, &w->w_down,
                                      &w->b_gate, &w->b_up, &w->b_down};
        for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) MOE_TRY(upload_view(be, m, dense[i], P_DENSE));
        MOE_TRY(upload_view(be, m, &w->router, P_ROUTER));
        MOE_TRY(upload_view(be, m, &w->router_bias, P_ROUTER));
        MOE_TRY(upload_view(be, m, &w->router_b, P_ROUTER));
        MOE_TRY(upload_view(be, m, &w->sinks, P_ATTN));
        struct moe_tensor *eb[] = {&w->experts.b_gate, &w->experts.b_up, &w->experts.b_down};
        for (size_t i = 0; i < sizeof eb / sizeof eb[0]; i++) MOE_TRY(upload_view(be, m, eb[i], P_EXPERTS));
        struct moe_tensor *sh[] = {&w->sh_gate, &w->sh_up, &w->sh_down, &w->sh_router};
        for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) MOE_TRY(upload_view(be, m, sh[i], P_SHARED));
        if (cfg->layer_moe[l] && cfg->n_experts > 0)
            MOE_TRY(upload_experts(be, m, &w->experts, cfg->n_experts, cfg->d_model, cfg->d_expert));
    }
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    size_t fr = 0, tot = 0, all = 0;
    MOE_CUDA_TRY(cudaMemGetInfo(&fr, &tot));
    char line[512];
    int off = 0;
    for (int p = 0; p < P_COUNT; p++) {
        all += c->part_bytes[p];
        if (c->part_bytes[p] && off < (int)sizeof line)
            off += snprintf(line + off, sizeof line - (size_t)off, " %s %.2f", moe_cuda_part_names[p],
                            c->part_bytes[p] / 1073741824.0);
    }
    fprintf(stderr, "moerun: cuda: weights resident %.2f GiB (%s ) free %.2f of %.2f GiB\n",
            all / 1073741824.0, line, fr / 1073741824.0, tot / 1073741824.0);
    if (c->widened_mxfp4)
        fprintf(stderr, "moerun: cuda: MXFP4 experts widened to bf16 at upload (no MXFP4 kernels on "
                "the GPU yet: 3.8x their bytes)\n");
    if (c->widened_fp8)
        fprintf(stderr, "moerun: cuda: FP8 weights widened to bf16 at upload (each rounded once; no FP8 "
                "kernels on the GPU yet: 1.9x their bytes)\n");
    return MOE_OK;
}
