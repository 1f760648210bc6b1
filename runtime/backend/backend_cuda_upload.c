/* backend_cuda_upload.c - the CUDA backend's prepare_model: every weight
 * uploaded once in its stored dtype (or generated on the device for a
 * deferred synthetic model; FP8 weights other than experts widened to
 * bf16), experts stacked per layer into (E, 2F, D) and (E, D, F) buffers
 * (MXFP4 and FP8 ones as planes, runtime/core/tensor.h), and the model's views
 * rewritten to device pointers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend_cuda_impl.h"
#include "runtime/model/synth.h"

/* ---- prepare_model: weights to the device ---- */

static enum moe_status dev_buffer(struct moe_backend *be, size_t bytes, void **out)
{
    return moe_cuda_mem_buffer(&ctx_of(be)->mem, bytes, out);
}

/* Index of the checkpoint tensor whose data is p (deferred synthetic
 * models: the generator key is the tensor's index), or -1. */
static int tensor_index(const struct moe_model *m, const void *p)
{
    for (size_t i = 0; i < m->st.n_tensors; i++)
        if (m->st.tensors[i].data == p) return (int)i;
    return -1;
}

/* Fills a device buffer of n elements with the values [off, off + n) of
 * the deferred tensor whose placeholder is ph. */
static enum moe_status synth_view_at(struct moe_backend *be, const struct moe_model *m, void *d, const void *ph,
                                     enum moe_dtype dt, size_t off, size_t n)
{
    int i = tensor_index(m, ph);
    if (i < 0) return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: deferred weight not in the set");
    bool ones = *(const unsigned char *)ph != 0;
    return moe_ops_synth_fill_at_cuda(ctx_of(be)->stream, d, dt, off, n, moe_synth_key(m->synth_seed, i),
                                      ones ? -1.0f : m->synth_std);
}

/* Fills a device buffer of n elements from the deferred placeholder ph. */
static enum moe_status synth_view(struct moe_backend *be, const struct moe_model *m, void *d,
                                  const void *ph, enum moe_dtype dt, size_t n)
{
    return synth_view_at(be, m, d, ph, dt, 0, n);
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
    enum moe_status s = MOE_OK;
    cudaError_t ce = cudaMemcpyAsync(stage, t->data, src, cudaMemcpyHostToDevice, c->stream);
    if (ce == cudaSuccess) s = moe_ops_fp8_to_bf16_cuda(c->stream, *out, stage, src / MOE_FP8_BYTES);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(c->stream);
    cudaFree(stage);
    if (s == MOE_OK && ce != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "cuda upload: %s", cudaGetErrorString(ce));
    c->weights.widened_fp8 = true;
    return s;
}

/* An FP8_B128 or four-bit matrix (N, K) as planes (runtime/core/tensor.h),
 * which cuda_matmul reads in place. */
static enum moe_status upload_planes_view(struct moe_backend *be, struct moe_tensor *t, size_t *bytes,
                                          void **out)
{
    const size_t K = (size_t)t->shape[t->ndim - 1], N = (size_t)moe_tensor_numel(t) / K;
    const size_t vb = moe_planes_values_bytes(t->dtype, N, K);
    *bytes = vb + moe_planes_scales_bytes(t->dtype, N, K);
    unsigned char *h = malloc(*bytes);
    if (!h) return moe_fail(MOE_ERR_NOMEM, "cuda upload: %zu bytes of staging", *bytes);
    moe_planes_from_rows(t->dtype, t->data, N, K, h, h + vb);
    enum moe_status s = dev_buffer(be, *bytes, out);
    if (s == MOE_OK) {
        const cudaError_t ce = cudaMemcpy(*out, h, *bytes, cudaMemcpyHostToDevice);
        if (ce != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "cuda upload: %s", cudaGetErrorString(ce));
    }
    free(h);
    struct cuda_ctx *c = ctx_of(be);
    if (moe_dtype_is_q4(t->dtype)) c->weights.q4_dense = true;
    else c->weights.fp8_dense = true;
    if (N * K > c->weights.planes_dense_max) c->weights.planes_dense_max = N * K;
    return s;
}

/* Quantization q on this backend: the dtype a matrix of dtype dt with rows of
 * K values (an expert: F x D, F 0 for other matrices) becomes (lm_head:
 * the LM head), MOE_DTYPE_N when it stays as stored.  The CPU backend's
 * rule (backend_cpu_pack.c): float weights whose rows are whole blocks of
 * 32; q8_0 makes Q8_0, q4 makes moe_q4_quant_dtype's (Q4_K or Q4_1), but
 * the LM head Q8_0; q4_k_m makes q4's but km where km is not MOE_DTYPE_N
 * (moe_quant_q4_k_m_tensor's or moe_quant_q4_k_m_dtype's answer for the
 * matrix). */
static enum moe_dtype quant_target(enum moe_weight_quant q, enum moe_dtype dt, int64_t K, int64_t F,
                                   bool lm_head, enum moe_dtype km)
{
    if (q == MOE_QUANT_NONE || K <= 0 || K % MOE_Q8_0_BLOCK || F % MOE_Q8_0_BLOCK ||
        (dt != MOE_DTYPE_F32 && dt != MOE_DTYPE_F16 && dt != MOE_DTYPE_BF16))
        return MOE_DTYPE_N;
    if (q == MOE_QUANT_Q4_K_M && km != MOE_DTYPE_N) return km;
    if (q == MOE_QUANT_Q8_0 || lm_head) return MOE_DTYPE_Q8_0;
    return F ? moe_q4_quant_expert_dtype(K, F) : moe_q4_quant_dtype(K);
}

/* The q4_k_m dtype of matrix t of layer l of m (moe_quant_q4_k_m_tensor)
 * under quantization q, else MOE_DTYPE_N. */
static enum moe_dtype km_target(enum moe_weight_quant q, const struct moe_model *m, int l, const struct moe_tensor *t)
{
    return q == MOE_QUANT_Q4_K_M ? moe_quant_q4_k_m_tensor(m, l, t) : MOE_DTYPE_N;
}

/* Notes a matrix made in four or six bits at upload (for the load summary). */
static void note_k_made(struct cuda_weights *w, enum moe_dtype qt)
{
    if (qt == MOE_DTYPE_Q4_K) w->q4_k_made = true;
    else if (qt == MOE_DTYPE_Q6_K) w->q6_k_made = true;
    else if (qt == MOE_DTYPE_Q4_1) w->q4_1_made = true;
}

/* n values of dt in the device buffer stage quantized to qt (Q8_0, Q4_1,
 * Q4_K or Q6_K) planes at dst (moe_ops_quantize_*_cuda), waited for; what
 * names the matrix in the error when a value is not finite. */
static enum moe_status quant_from_stage(struct moe_backend *be, enum moe_dtype qt, void *dst, const void *stage,
                                        enum moe_dtype dt, size_t n, const char *what)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!c->weights.q8_bad) MOE_TRY(dev_buffer(be, sizeof(int), (void **)&c->weights.q8_bad));
    int bad = 0;
    MOE_CUDA_TRY(cudaMemsetAsync(c->weights.q8_bad, 0, sizeof(int), c->stream));
    if (qt == MOE_DTYPE_Q4_1) MOE_TRY(moe_ops_quantize_q4_1_cuda(c->stream, dst, stage, dt, n, c->weights.q8_bad));
    else if (qt == MOE_DTYPE_Q4_K || qt == MOE_DTYPE_Q6_K)
        MOE_TRY(moe_ops_quantize_k_cuda(c->stream, qt, dst, stage, dt, n, c->weights.q8_bad));
    else MOE_TRY(moe_ops_quantize_q8_0_cuda(c->stream, dst, stage, dt, n, c->weights.q8_bad));
    MOE_CUDA_TRY(cudaMemcpyAsync(&bad, c->weights.q8_bad, sizeof(int), cudaMemcpyDeviceToHost, c->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    if (bad)
        return moe_fail(MOE_ERR_FORMAT, "--quantize %s: %s holds a value that is not finite (or one "
                        "whose block scale is past f16's range)", moe_cuda_quant_name(be->quant), what);
    return MOE_OK;
}

/* A float matrix t (n values, rows of K) quantized to qt planes on the
 * device: its rows copied (a deferred synthetic model: made) into a
 * staging buffer, quantized into *out (*bytes). */
static enum moe_status upload_quant_view(struct moe_backend *be, const struct moe_model *m, const struct moe_tensor *t,
                                         enum moe_dtype qt, size_t n, int layer, size_t *bytes, void **out)
{
    struct cuda_ctx *c = ctx_of(be);
    const size_t K = (size_t)t->shape[t->ndim - 1], N = n / K;
    *bytes = moe_planes_values_bytes(qt, N, K) + moe_planes_scales_bytes(qt, N, K);
    MOE_TRY(dev_buffer(be, *bytes, out));
    void *stage;
    MOE_CUDA_TRY(cudaMalloc(&stage, n * moe_dtype_size(t->dtype)));
    enum moe_status s = MOE_OK;
    if (m->weights_deferred) {
        s = synth_view(be, m, stage, t->data, t->dtype, n);
    } else {
        const cudaError_t ce = cudaMemcpy(stage, t->data, n * moe_dtype_size(t->dtype), cudaMemcpyHostToDevice);
        if (ce != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "cuda upload: %s", cudaGetErrorString(ce));
    }
    char what[96];
    if (layer < 0) snprintf(what, sizeof what, "the LM head");
    else snprintf(what, sizeof what, "a (%zu, %zu) weight of layer %d", N, K, layer);
    if (s == MOE_OK) s = quant_from_stage(be, qt, *out, stage, t->dtype, n, what);
    cudaFree(stage);
    if (qt != MOE_DTYPE_Q8_0) c->weights.q4_dense = true;
    else c->weights.q8_dense = true;
    note_k_made(&c->weights, qt);
    if (N * K > c->weights.planes_dense_max) c->weights.planes_dense_max = N * K;
    return s;
}

/* Rewrites view t to a device copy of its data (shared with an earlier view
 * of the same host data and form, e.g. tied embeddings): in its dtype, an
 * FP8 one widened to bf16, or kept as planes when `planes` (a matmul
 * weight), a float one then quantized under --quantize (quant_target;
 * layer: for messages, -1 the LM head). */
static enum moe_status upload_as(struct moe_backend *be, const struct moe_model *m, struct moe_tensor *t,
                                 enum part part, bool planes, int layer)
{
    struct cuda_ctx *c = ctx_of(be);
    if (!t->data || t->device >= 0) return MOE_OK;
    const enum moe_dtype qt = planes && t->ndim == 2 ? quant_target(be->quant, t->dtype, t->shape[1], 0, layer < 0,
                                                                    km_target(be->quant, m, layer, t))
                                                     : MOE_DTYPE_N;
    const bool quant = qt != MOE_DTYPE_N;
    for (size_t i = 0; i < c->mem.n_up; i++)
        if (c->mem.up[i].host == t->data && c->mem.up[i].quantized == quant && (!quant || c->mem.up[i].dtype == qt)) {
            t->data = c->mem.up[i].dev;
            t->device = c->device;
            t->dtype = c->mem.up[i].dtype;
            if (t->cols) t->cols = c->mem.up[i].cols;
            return MOE_OK;
        }
    int64_t n = moe_tensor_numel(t);
    if (n < 0 || t->ndim < 1 || (n > 0 && t->shape[t->ndim - 1] <= 0))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: bad tensor shape");
    const bool fp8 = t->dtype == MOE_DTYPE_FP8_B128;
    if (moe_dtype_is_q4(t->dtype) && !(planes && t->ndim == 2))
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda upload: a four-bit weight of layer %d outside the "
                        "projections (%d dims) has no CUDA kernels", layer, t->ndim);
    size_t bytes = (size_t)n * (fp8 ? 2 : moe_dtype_size(t->dtype));
    void *d;
    if (quant) {
        MOE_TRY(upload_quant_view(be, m, t, qt, (size_t)n, layer, &bytes, &d));
        t->dtype = qt;
    } else if ((fp8 || moe_dtype_is_q4(t->dtype)) && planes && t->ndim == 2) {
        MOE_TRY(upload_planes_view(be, t, &bytes, &d));
    } else if (fp8) {
        MOE_TRY(upload_fp8_view(be, t, (size_t)n, &d));
        t->dtype = MOE_DTYPE_BF16;
    } else {
        MOE_TRY(dev_buffer(be, bytes, &d));
        if (m->weights_deferred) MOE_TRY(synth_view(be, m, d, t->data, t->dtype, (size_t)n));
        else MOE_CUDA_TRY(cudaMemcpy(d, t->data, bytes, cudaMemcpyHostToDevice));
    }
    if (c->mem.n_up == c->mem.cap_up) {
        size_t m = c->mem.cap_up ? 2 * c->mem.cap_up : 256;
        struct upload *u = realloc(c->mem.up, m * sizeof *u);
        if (!u) return moe_fail(MOE_ERR_NOMEM, "cuda backend: upload table");
        c->mem.up = u;
        c->mem.cap_up = m;
    }
    if (t->cols) { /* act-order: the column order the forward gathers by, on the device */
        int32_t *dc;
        MOE_TRY(dev_buffer(be, (size_t)t->shape[t->ndim - 1] * sizeof(int32_t), (void **)&dc));
        MOE_CUDA_TRY(cudaMemcpy(dc, t->cols, (size_t)t->shape[t->ndim - 1] * sizeof(int32_t), cudaMemcpyHostToDevice));
        t->cols = dc;
    }
    c->mem.up[c->mem.n_up++] = (struct upload){t->data, d, t->dtype, t->cols, quant};
    c->mem.part_bytes[part] += bytes;
    t->data = d;
    t->device = c->device;
    return MOE_OK;
}

static enum moe_status upload_view(struct moe_backend *be, const struct moe_model *m,
                                   struct moe_tensor *t, enum part part)
{
    return upload_as(be, m, t, part, false, -1);
}

/* A weight only cuda_matmul reads (of layer, -1 the LM head): FP8 and
 * four-bit ones kept as planes, float ones quantized under --quantize. */
static enum moe_status upload_matmul_view(struct moe_backend *be, const struct moe_model *m,
                                          struct moe_tensor *t, enum part part, int layer)
{
    return upload_as(be, m, t, part, true, layer);
}

/* MXFP4 experts (gpt-oss) or FP8_B128 ones (fp8 checkpoints) as planes
 * (runtime/core/tensor.h), read in place by the expert kernels: each matrix's
 * rows split on the host into its values and scales, copied to their
 * places in the gate+up stack (2F*E rows of D) and the down stack (D*E
 * rows of F), the scales of a stack after all its values. */
static enum moe_status planes_experts(struct moe_backend *be, const struct moe_expert_weights *x, int E, int D,
                                      int F, void *gu, void *dn)
{
    const enum moe_dtype dt = x->dtype;
    const size_t FD = (size_t)F * D;
    const size_t vb = moe_planes_values_bytes(dt, (size_t)F, (size_t)D);
    const size_t sb = moe_planes_scales_bytes(dt, (size_t)F, (size_t)D); /* per matrix (D, F alike) */
    unsigned char *hv = malloc(vb + sb);
    if (!hv) return moe_fail(MOE_ERR_NOMEM, "cuda upload: %zu bytes of expert staging", vb + sb);
    char *gus = (char *)gu + moe_planes_values_bytes(dt, 2 * (size_t)F * E, (size_t)D);
    char *dns = (char *)dn + moe_planes_values_bytes(dt, (size_t)D * E, (size_t)F);
    enum moe_status s = MOE_OK;
    for (int e = 0; e < E && s == MOE_OK; e++) {
        const void *src[3] = {x->gate[e], x->up[e], x->down[e]};
        /* matrix index within its stack: gate 2e, up 2e + 1, down e */
        const size_t at[3] = {2 * (size_t)e, 2 * (size_t)e + 1, (size_t)e};
        for (int i = 0; i < 3 && s == MOE_OK; i++) {
            const size_t rows = i < 2 ? (size_t)F : (size_t)D, K = FD / rows;
            moe_planes_from_rows(dt, src[i], rows, K, hv, hv + vb);
            char *v = (char *)(i < 2 ? gu : dn) + at[i] * vb, *sc = (i < 2 ? gus : dns) + at[i] * sb;
            cudaError_t ce = cudaMemcpy(v, hv, vb, cudaMemcpyHostToDevice);
            if (ce == cudaSuccess) ce = cudaMemcpy(sc, hv + vb, sb, cudaMemcpyHostToDevice);
            if (ce != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "cuda upload: %s", cudaGetErrorString(ce));
        }
    }
    free(hv);
    return s;
}

static enum moe_status stack_experts(struct moe_backend *be, const struct moe_model *m,
                                     const struct moe_expert_weights *x, int E, int D, int F, int l, void *gu,
                                     void *dn, size_t gu_bytes, size_t dn_bytes, size_t mat);

/* A layer's float experts quantized to qt (Q8_0, Q4_1 or Q4_K) stacks
 * (--quantize): stacked as stored into staging buffers, each stack then
 * quantized as one (2FE, D) or (DE, F) matrix, which is the planes layout
 * of the stacks (matrix i's values at i * values(F, D), the scales after
 * all of them), the down stack to qd (q4_k_m's may differ); the table's
 * dtype becomes qt, and its down_dtypes (E, host memory the backend owns)
 * qd where that differs. */
static enum moe_status quant_experts(struct moe_backend *be, const struct moe_model *m, struct moe_expert_weights *x,
                                     enum moe_dtype qt, enum moe_dtype qd, int E, int D, int F, int l, void *gu,
                                     void *dn, int moe_layer)
{
    enum moe_dtype *dd = NULL;
    if (qd != qt) {
        enum moe_status ks = MOE_OK;
        if (!(dd = malloc((size_t)E * sizeof *dd)) || (ks = moe_cuda_mem_keep_host(&ctx_of(be)->mem, dd)) != MOE_OK) {
            free(dd);
            return ks != MOE_OK ? ks : moe_fail(MOE_ERR_NOMEM, "cuda upload: a table of %d experts", E);
        }
        for (int e = 0; e < E; e++) dd[e] = qd;
    }
    /* n: values of the down stack; mat: bytes of one matrix as stored; gb:
     * of the gate+up stack */
    size_t n, mat, gb;
    if (!moe_mul_size((size_t)F * D, (size_t)E, &n) || !moe_mul_size((size_t)F * D, moe_dtype_size(x->dtype), &mat) ||
        !moe_mul_size(mat, 2 * (size_t)E, &gb))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: %d experts of %d x %d overflow", E, D, F);
    void *sg, *sd;
    MOE_CUDA_TRY(cudaMalloc(&sg, gb));
    cudaError_t ce = cudaMalloc(&sd, gb / 2);
    if (ce != cudaSuccess) {
        cudaFree(sg);
        return moe_fail(MOE_ERR_DEVICE, "cuda upload: a layer's experts: %s", cudaGetErrorString(ce));
    }
    enum moe_status s = stack_experts(be, m, x, E, D, F, l, sg, sd, gb, gb / 2, mat);
    char what[96];
    snprintf(what, sizeof what, "an expert of MoE layer %d", moe_layer);
    if (s == MOE_OK) s = quant_from_stage(be, qt, gu, sg, x->dtype, 2 * n, what);
    if (s == MOE_OK) s = quant_from_stage(be, qd, dn, sd, x->dtype, n, what);
    cudaFree(sg);
    cudaFree(sd);
    if (s == MOE_OK) {
        x->dtype = qt;
        x->down_dtypes = dd;
        struct cuda_weights *w = &ctx_of(be)->weights;
        if (qt != MOE_DTYPE_Q8_0) w->q4_experts = true;
        else w->q8_experts = true;
        note_k_made(w, qt);
        note_k_made(w, qd);
    }
    return s;
}

/* Act-order experts: their column orders (the table x->cols: expert e's
 * input order at 2e, its down matrix's at 2e + 1, NULL in order) as one
 * device buffer, inputs (E, D) then down (E, F), the table pointed into it
 * (the layout moe_experts_ffn_small_cuda reads). */
static enum moe_status upload_expert_cols(struct moe_backend *be, struct moe_expert_weights *x, int E, int D, int F)
{
    size_t n;
    if (!moe_mul_size((size_t)E, (size_t)D + (size_t)F, &n) || n > SIZE_MAX / sizeof(int32_t))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: column orders of %d experts overflow", E);
    int32_t *h = malloc(n * sizeof *h), *d;
    if (!h) return moe_fail(MOE_ERR_NOMEM, "cuda upload: %zu column indices", n);
    for (int e = 0; e < E; e++)
        for (int i = 0; i < 2; i++) {
            const int W = i ? F : D;
            int32_t *o = h + (i ? (size_t)E * D + (size_t)e * F : (size_t)e * D);
            const int32_t *src = x->cols[2 * e + i];
            for (int j = 0; j < W; j++) o[j] = src ? src[j] : j;
        }
    enum moe_status s = dev_buffer(be, n * sizeof *h, (void **)&d);
    if (s == MOE_OK) {
        const cudaError_t ce = cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice);
        if (ce != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "cuda upload: %s", cudaGetErrorString(ce));
    }
    free(h);
    if (s != MOE_OK) return s;
    for (int e = 0; e < E; e++) {
        x->cols[2 * e] = d + (size_t)e * D;
        x->cols[2 * e + 1] = d + (size_t)E * D + (size_t)e * F;
    }
    return MOE_OK;
}

/* One expert matrix's bytes in dt on the device (planes: its values)
 * into *mat and its scales (0 for plain rows) into *sb; false when dt's
 * blocks do not fit D and F. */
static bool expert_sizes(enum moe_dtype dt, int D, int F, size_t *mat, size_t *sb)
{
    *mat = (size_t)F * D * moe_dtype_size(dt);
    *sb = 0;
    if (!moe_dtype_planes(dt)) return true;
    if (D % moe_dtype_block(dt) || F % moe_dtype_block(dt)) return false;
    *mat = moe_planes_values_bytes(dt, (size_t)F, (size_t)D);
    *sb = moe_planes_scales_bytes(dt, (size_t)F, (size_t)D);
    return true;
}

/* Stacks the experts of model layer l into (E, 2F, D) gate+up and (E, D,
 * F) down device buffers, quantized as q, and points the expert table into
 * them (offloaded: see backend_cuda_offload.c); act-order experts' column
 * orders follow. */
static enum moe_status upload_experts(struct moe_backend *be, const struct moe_model *m,
                                      struct moe_expert_weights *x, int E, int D, int F, int l, int moe_layer,
                                      enum moe_weight_quant q)
{
    struct cuda_ctx *c = ctx_of(be);
    /* MXFP4, FP8 and four-bit experts stay as they are, in planes; float
     * ones become Q8_0, Q4_1 or Q4_K planes under --quantize (Q4_K when D
     * and F are multiples of 256: one dtype an expert), their down
     * matrices under q4_k_m Q6_K or Q8_0 in some layers */
    const enum moe_dtype qt = quant_target(q, x->dtype, D, F, false, MOE_DTYPE_N);
    const enum moe_dtype km = moe_quant_q4_k_m_dtype(MOE_Q4KM_DOWN, l, m->cfg.n_layers, m->cfg.n_experts, F);
    const enum moe_dtype qd = quant_target(q, x->dtype, D, F, false, km);
    const bool quant = qt != MOE_DTYPE_N;
    const enum moe_dtype dt = quant ? qt : x->dtype, ddt = quant ? qd : x->dtype;
    /* mat, mat_d: one matrix's bytes (planes: its values), sb, sb_d: its scales */
    size_t mat, sb, mat_d, sb_d, gu_bytes, dn_bytes;
    if (!expert_sizes(dt, D, F, &mat, &sb) || !expert_sizes(ddt, D, F, &mat_d, &sb_d))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: %s experts of %d x %d", moe_dtype_name(dt), D, F);
    if (!moe_mul_size(2 * (mat + sb), (size_t)E, &gu_bytes) || !moe_mul_size(mat_d + sb_d, (size_t)E, &dn_bytes))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: %d experts of %d x %d overflow", E, D, F);
    /* offload (moe_offload_opts.gpu_experts below E): the stacks are built here, then
     * moved to host memory */
    const struct moe_offload_opts *oo = &c->off.opts;
    const bool off = oo->gpu_experts > 0 && oo->gpu_experts < E;
    void *gu, *dn;
    if (off && x->cols && oo->cpu_rows > 0)
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: --gpu-experts-cpu-rows with act-order four-bit "
                        "experts (MoE layer %d) is not supported: the CPU side reads the experts' columns in "
                        "stored order", moe_layer);
    if (off && ddt != dt) /* the offload keeps one dtype a layer */
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: --gpu-experts with --quantize q4_k_m's %s down "
                        "projections beside %s gate and up (MoE layer %d) is not supported; use q4",
                        moe_dtype_name(ddt), moe_dtype_name(dt), moe_layer);
    if (off) {
        MOE_CUDA_TRY(cudaMalloc(&gu, gu_bytes));
        cudaError_t ce = cudaMalloc(&dn, dn_bytes);
        if (ce != cudaSuccess) {
            cudaFree(gu);
            return moe_fail(MOE_ERR_DEVICE, "cuda upload: a layer's experts: %s", cudaGetErrorString(ce));
        }
        enum moe_status s = quant ? quant_experts(be, m, x, qt, qd, E, D, F, l, gu, dn, moe_layer)
                               : stack_experts(be, m, x, E, D, F, l, gu, dn, gu_bytes, dn_bytes, mat);
        const double *warm = oo->warm ? oo->warm + (size_t)moe_layer * E : NULL;
        if (s == MOE_OK)
            s = moe_cuda_offload_layer(c, x, oo->gpu_experts, oo->lfu, warm, E, D, F, gu, dn, 2 * mat,
                                       2 * sb, mat, sb);
        cudaFree(gu);
        cudaFree(dn);
        /* act order: every expert's column orders resident (the kernels
         * index them by expert, not by slot) */
        return s == MOE_OK && x->cols ? upload_expert_cols(be, x, E, D, F) : s;
    }
    MOE_TRY(dev_buffer(be, gu_bytes, &gu));
    MOE_TRY(dev_buffer(be, dn_bytes, &dn));
    if (quant) MOE_TRY(quant_experts(be, m, x, qt, qd, E, D, F, l, gu, dn, moe_layer));
    else MOE_TRY(stack_experts(be, m, x, E, D, F, l, gu, dn, gu_bytes, dn_bytes, mat));
    for (int e = 0; e < E; e++) {
        x->gate[e] = (const char *)gu + 2 * mat * e;
        x->up[e] = (const char *)gu + 2 * mat * e + mat;
        x->down[e] = (const char *)dn + mat_d * e;
    }
    c->mem.part_bytes[P_EXPERTS] += gu_bytes + dn_bytes;
    return x->cols ? upload_expert_cols(be, x, E, D, F) : MOE_OK;
}

/* The experts e of x with pick[e] == want (E of them in all) stacked in
 * expert order as upload_experts does, quantized as q; their table
 * entries pointed into the stacks, the others' left as they were; *dt:
 * the stack's dtype, *n: its experts (0: nothing uploaded). */
static enum moe_status upload_expert_set(struct moe_backend *be, const struct moe_model *m,
                                         struct moe_expert_weights *x, const uint8_t *pick, uint8_t want, int E,
                                         int D, int F, int l, int moe_layer, enum moe_weight_quant q, int *n,
                                         enum moe_dtype *dt)
{
    *n = 0;
    *dt = x->dtype;
    for (int e = 0; e < E; e++) *n += pick[e] == want;
    if (*n == 0) return MOE_OK;
    const void **t = malloc(3 * (size_t)*n * sizeof *t);
    if (!t) return moe_fail(MOE_ERR_NOMEM, "cuda upload: a table of %d experts", *n);
    struct moe_expert_weights h = *x;
    h.gate = t, h.up = t + *n, h.down = t + 2 * (size_t)*n;
    for (int e = 0, i = 0; e < E; e++)
        if (pick[e] == want) h.gate[i] = x->gate[e], h.up[i] = x->up[e], h.down[i++] = x->down[e];
    enum moe_status s = upload_experts(be, m, &h, *n, D, F, l, moe_layer, q);
    if (s == MOE_OK && h.down_dtypes) /* the slot views and a plan's stacks carry one dtype a stack */
        s = moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: expert parallelism with --quantize q4_k_m's %s down "
                     "projections beside %s gate and up (MoE layer %d) is not supported; use q4",
                     moe_dtype_name(h.down_dtypes[0]), moe_dtype_name(h.dtype), moe_layer);
    if (s == MOE_OK) {
        *dt = h.dtype;
        for (int e = 0, i = 0; e < E; e++)
            if (pick[e] == want) x->gate[e] = h.gate[i], x->up[e] = h.up[i], x->down[e] = h.down[i++];
    }
    free(t);
    return s;
}

/* A layer's experts under a per-expert plan (be->expert_quant, model
 * layer l): one stack per quantization the plan gives its experts
 * (stored, q8_0, q4), each in expert order, and a struct cuda_mixed in
 * x->backend_layer saying which expert is where; x->dtypes its table of
 * each expert's dtype.  A layer whose experts all take one quantization is
 * stacked as without a plan.  Under expert parallelism (m->ep_held) the
 * experts this rank holds only. */
static enum moe_status upload_mixed_experts(struct moe_backend *be, const struct moe_model *m, int l,
                                            struct moe_expert_weights *x, int E, int D, int F, int moe_layer)
{
    struct cuda_ctx *c = ctx_of(be);
    uint8_t *pick = malloc((size_t)E);
    if (!pick) return moe_fail(MOE_ERR_NOMEM, "cuda upload: a plan of %d experts", E);
    int used[3] = {0}, one = 0;
    enum { NOT_HELD = 255 };
    for (int e = 0; e < E; e++) {
        pick[e] = moe_model_holds(m, l, e) ? (uint8_t)moe_backend_expert_quant(be, l, e) : NOT_HELD;
        if (pick[e] != NOT_HELD) used[one = pick[e]] = 1;
    }
    enum moe_status s = MOE_OK;
    if (used[0] + used[1] + used[2] <= 1) { /* one format */
        if (!m->ep_held) s = upload_experts(be, m, x, E, D, F, l, moe_layer, (enum moe_weight_quant)one);
        else {
            int n;
            enum moe_dtype dt;
            s = upload_expert_set(be, m, x, pick, (uint8_t)one, E, D, F, l, moe_layer, (enum moe_weight_quant)one,
                                  &n, &dt);
            if (s == MOE_OK) x->dtype = dt;
        }
        free(pick);
        return s;
    }
    const char *no = m->weights_deferred ? "--synthetic weights (generated on the device whole)"
                     : x->cols ? "act-order four-bit experts"
                     : c->off.opts.gpu_experts > 0 ? "--gpu-experts" : NULL;
    if (no) {
        free(pick);
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: --expert-dtype-plan with %s is not supported", no);
    }
    struct cuda_mixed *mx = calloc(1, sizeof *mx + (size_t)E * sizeof(enum moe_dtype));
    if (!mx || (s = moe_cuda_mem_keep_host(&c->mem, mx)) != MOE_OK) {
        free(mx);
        free(pick);
        return s != MOE_OK ? s : moe_fail(MOE_ERR_NOMEM, "cuda upload: a mixed layer");
    }
    for (int q = 0; q < 3 && s == MOE_OK; q++) {
        if (!used[q]) continue;
        struct cuda_mixed_set *st = &mx->set[mx->n];
        s = upload_expert_set(be, m, x, pick, (uint8_t)q, E, D, F, l, moe_layer, (enum moe_weight_quant)q, &st->C,
                              &st->dtype);
        if (s != MOE_OK) break;
        st->h_map = malloc((size_t)E * sizeof(int32_t));
        if (!st->h_map || (s = moe_cuda_mem_keep_host(&c->mem, st->h_map)) != MOE_OK) {
            free(st->h_map);
            st->h_map = NULL;
            if (s == MOE_OK) s = moe_fail(MOE_ERR_NOMEM, "cuda upload: an expert map");
            break;
        }
        for (int e = 0, i = 0; e < E; e++) {
            st->h_map[e] = pick[e] == q ? i++ : -1;
            if (pick[e] == q || (pick[e] == NOT_HELD && !mx->n)) mx->dtypes[e] = st->dtype; /* not held: a stand-in */
            if (pick[e] == q && st->h_map[e] == 0) st->gu = x->gate[e], st->dn = x->down[e];
        }
        s = dev_buffer(be, (size_t)E * sizeof(int32_t), (void **)&st->d_map);
        if (s == MOE_OK)
            s = cudaMemcpy(st->d_map, st->h_map, (size_t)E * sizeof(int32_t), cudaMemcpyHostToDevice) == cudaSuccess
                    ? MOE_OK : moe_fail(MOE_ERR_DEVICE, "cuda upload: an expert map");
        mx->n++;
    }
    free(pick);
    if (s != MOE_OK) return s;
    x->dtype = mx->set[0].dtype;
    x->dtypes = mx->dtypes;
    x->backend_layer = mx;
    c->mixed_layers++;
    return MOE_OK;
}

/* A layer's experts: all of them, or under expert parallelism (m->ep_held)
 * those this rank holds, stacked in expert order (the order of its slots,
 * runtime/engine/ep.h), the others' table entries left NULL. */
static enum moe_status upload_held_experts(struct moe_backend *be, const struct moe_model *m, int l,
                                           struct moe_expert_weights *x, int E, int D, int F, int moe_layer)
{
    if (be->expert_quant) return upload_mixed_experts(be, m, l, x, E, D, F, moe_layer);
    if (!m->ep_held) return upload_experts(be, m, x, E, D, F, l, moe_layer, be->quant);
    const char *no = ctx_of(be)->off.opts.gpu_experts > 0 ? "--gpu-experts" : NULL;
    if (no)
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: expert parallelism with %s is not supported", no);
    uint8_t *held = malloc((size_t)E);
    if (!held) return moe_fail(MOE_ERR_NOMEM, "cuda upload: %d experts", E);
    for (int e = 0; e < E; e++) held[e] = moe_model_holds(m, l, e) != 0;
    int n;
    enum moe_dtype dt;
    enum moe_status s = upload_expert_set(be, m, x, held, 1, E, D, F, l, moe_layer, be->quant, &n, &dt);
    if (s == MOE_OK) x->dtype = dt;
    free(held);
    /* act-order: every expert's orders (in order for those not held),
     * which the forward lays out by slot (runtime/engine/forward_ep.c) */
    return s == MOE_OK && x->cols ? upload_expert_cols(be, x, E, D, F) : s;
}

/* The deferred values of x's E experts (of model layer l: all of its
 * experts, or under expert parallelism those of this rank's slots) into
 * the device stacks gu and dn (each matrix mat bytes): each expert's part
 * of synth.c's stacks gate_up_proj (E, 2F, D) and down_proj (E, D, F), or
 * of MXFP4 planes' codes (values of dtype vt: the codes' bytes as bf16),
 * found by its place in the layer's table (whose pointers are the
 * placeholders' plus the expert's offset in the stack); one fill per run
 * of consecutive experts. */
static enum moe_status synth_experts(struct moe_backend *be, const struct moe_model *m,
                                     const struct moe_expert_weights *x, int E, int l, void *gu, void *dn, size_t mat,
                                     enum moe_dtype vt)
{
    const struct moe_expert_weights *all = &m->layers[l].experts;
    const int En = m->cfg.n_experts;
    const size_t n = mat / moe_dtype_size(vt); /* values of a matrix */
    for (int i = 0; i < E;) {
        int e = 0;
        while (e < En && (!x->gate[i] || all->gate[e] != x->gate[i])) e++;
        if (e == En) return moe_fail(MOE_ERR_INVALID_ARG, "cuda upload: a deferred expert not in layer %d", l);
        int r = 1; /* the run: experts e .. e + r - 1 at i .. i + r - 1 */
        while (i + r < E && e + r < En && x->gate[i + r] && all->gate[e + r] == x->gate[i + r]) r++;
        MOE_TRY(synth_view_at(be, m, (char *)gu + 2 * mat * i, (const char *)all->gate[e] - 2 * mat * e, vt,
                              2 * n * e, 2 * n * r));
        MOE_TRY(synth_view_at(be, m, (char *)dn + mat * i, (const char *)all->down[e] - mat * e, vt, n * e, n * r));
        i += r;
    }
    return MOE_OK;
}

/* Fills the device stacks gu (gu_bytes) and dn (dn_bytes) with the E
 * experts of x, of model layer l (each matrix mat bytes, planes: its
 * values). */
static enum moe_status stack_experts(struct moe_backend *be, const struct moe_model *m,
                                     const struct moe_expert_weights *x, int E, int D, int F, int l, void *gu,
                                     void *dn, size_t gu_bytes, size_t dn_bytes, size_t mat)
{
    struct cuda_ctx *c = ctx_of(be);
    const bool planes = moe_dtype_planes(x->dtype);
    /* one copy when the checkpoint is already stacked, else per matrix */
    bool stacked = !planes;
    for (int e = 0; e < E && stacked; e++)
        stacked = (const char *)x->gate[e] == (const char *)x->gate[0] + 2 * mat * e &&
                  (const char *)x->up[e] == (const char *)x->gate[e] + mat &&
                  (const char *)x->down[e] == (const char *)x->down[0] + mat * e;
    if (planes && m->weights_deferred) {
        /* random codes from the blocks' keys, every scale the synthetic one */
        if (x->dtype != MOE_DTYPE_MXFP4)
            return moe_fail(MOE_ERR_UNSUPPORTED, "cuda upload: deferred %s experts", moe_dtype_name(x->dtype));
        const size_t gv = 2 * mat * (size_t)E, dv = mat * (size_t)E;
        MOE_TRY(synth_experts(be, m, x, E, l, gu, dn, mat, MOE_DTYPE_BF16));
        const int sc = moe_synth_mxfp4_scale(m->synth_std);
        MOE_CUDA_TRY(cudaMemsetAsync((char *)gu + gv, sc, gu_bytes - gv, c->stream));
        MOE_CUDA_TRY(cudaMemsetAsync((char *)dn + dv, sc, dn_bytes - dv, c->stream));
        c->weights.mxfp4_experts = true;
    } else if (planes) {
        MOE_TRY(planes_experts(be, x, E, D, F, gu, dn));
        if (x->dtype == MOE_DTYPE_MXFP4) c->weights.mxfp4_experts = true;
        else if (moe_dtype_is_q4(x->dtype)) c->weights.q4_experts = true;
        else c->weights.fp8_experts = true;
    } else if (m->weights_deferred) {
        /* synth.c makes gate_up_proj (E, 2F, D) and down_proj (E, D, F)
         * tensors: the device layout, value for value */
        MOE_TRY(synth_experts(be, m, x, E, l, gu, dn, mat, x->dtype));
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
    return MOE_OK;
}

/* Whether a weight of m other than the experts has dtype t (no loader
 * makes MXFP4 outside experts, which are kept as planes). */
static bool has_dtype(const struct moe_model *m, bool (*is)(enum moe_dtype))
{
    if (is(m->lm_head.dtype) || is(m->embed.dtype) || is(m->mtp_eh_proj.dtype)) return true;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct moe_layer_weights *w = &m->layers[l];
        const struct moe_tensor *ts[] = {&w->wq,      &w->wk,     &w->wv,      &w->wo,    &w->wq_a,
                                         &w->wkv_a,   &w->w_gate, &w->w_up,    &w->w_down, &w->router,
                                         &w->sh_gate, &w->sh_up,  &w->sh_down, &w->sh_router,
                                         &w->lin_in,  &w->lin_qkv, &w->lin_z,  &w->lin_out};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
            if (is(ts[i]->dtype)) return true;
    }
    return false;
}
static bool is_mxfp4(enum moe_dtype t) { return t == MOE_DTYPE_MXFP4; }

/* The first Llama-4 feature of cfg that no CUDA kernel computes (the
 * config.json key), or NULL. */
static const char *llama4_feature(const struct moe_config *cfg)
{
    if (cfg->router_scales_input) return "the router scaling each expert's input (Llama-4's routing)";
    if (cfg->attn_chunk > 0) return "attention_chunk_size";
    if (cfg->qk_l2_norm) return "use_qk_norm (an L2 norm)";
    if (cfg->attn_temp_floor > 0) return "attn_temperature_tuning";
    for (int l = 0; l < cfg->n_layers; l++)
        if (cfg->layer_nope[l]) return "no_rope_layers";
    return NULL;
}

enum moe_status moe_cuda_prepare_model(struct moe_backend *be, struct moe_model *m)
{
    struct cuda_ctx *c = ctx_of(be);
    const struct moe_config *cfg = &m->cfg;
    const char *l4 = llama4_feature(cfg);
    if (l4)
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: %s (%s) has no CUDA kernels yet; use --backend cpu",
                        l4, cfg->architecture);
    if (m->embed.device >= 0) return MOE_OK; /* already on the device */
    if (moe_quant_q5(be->quant))
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: --quantize %s makes ggml's Q5_K, which the CUDA "
                        "backend does not read; use --quantize q4_k_m or q8_0, or --backend cpu",
                        be->quant == MOE_QUANT_Q5_K ? "q5_k" : "q5_k_m");
    if (be->quant == MOE_QUANT_Q4_K_M && be->expert_quant)
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: --expert-dtype-plan with --quantize q4_k_m is not "
                        "supported (a plan's stacks carry one dtype each); use q4");
    if (has_dtype(m, is_mxfp4))
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda backend: MXFP4 weights other than experts are not "
                        "supported");
    MOE_TRY(moe_backend_check_expert_plan(be, m));
    for (int l = 0; l < cfg->n_layers; l++)
        if (m->layers[l].wq.dtype == MOE_DTYPE_Q8_0 || m->layers[l].wq.dtype == MOE_DTYPE_BF16_PANEL ||
            (m->layers[l].experts.gate && (m->layers[l].experts.dtype == MOE_DTYPE_Q8_0 || m->layers[l].experts.dtypes ||
                                           m->layers[l].experts.down_dtypes ||
                                           m->layers[l].experts.dtype == MOE_DTYPE_BF16_PANEL)))
            return moe_fail(MOE_ERR_INVALID_ARG, "cuda backend: the model's weights were repacked or "
                            "quantized for a CPU backend; load it again for this one");
    /* --gpu-experts-warm: statistics of this model's MoE layers and experts */
    const struct moe_offload_opts *oo = &c->off.opts;
    const bool offload = oo->gpu_experts > 0 && oo->gpu_experts < cfg->n_experts;
    const int n_moe = moe_config_moe_layers(cfg);
    if (offload && oo->warm && (oo->warm_layers != n_moe || oo->warm_e != cfg->n_experts))
        return moe_fail(MOE_ERR_INVALID_ARG, "--gpu-experts-warm: statistics of %d MoE layers x %d experts, "
                        "the model has %d x %d", oo->warm_layers, oo->warm_e, n_moe,
                        cfg->n_experts);
    int moe_layer = 0;
    /* deduplicate within this model only: a later model's host data may
     * reuse an earlier one's (freed) addresses */
    c->mem.n_up = 0;
    c->weights.widened_fp8 = c->weights.mxfp4_experts = c->weights.fp8_experts = c->weights.fp8_dense = c->weights.q8_experts = c->weights.q8_dense = false;
    c->weights.q4_experts = c->weights.q4_dense = c->weights.q4_1_made = c->weights.q4_k_made = false;
    c->weights.q6_k_made = false;
    c->weights.planes_dense_max = 0;
    c->mixed_layers = 0;
    memset(c->mem.part_bytes, 0, sizeof c->mem.part_bytes);
    MOE_TRY(upload_view(be, m, &m->embed, P_EMBED));
    /* the LM head: quantized under --quantize q8_0 (tied: a copy of its
     * own, the embedding stays as stored) */
    const bool q8_head = m->lm_head.ndim == 2 &&
                         quant_target(be->quant, m->lm_head.dtype, m->lm_head.shape[1], 0, true,
                                      km_target(be->quant, m, -1, &m->lm_head)) != MOE_DTYPE_N;
    MOE_TRY(upload_matmul_view(be, m, &m->lm_head, cfg->tie_embeddings && !q8_head ? P_EMBED : P_HEAD, -1));
    MOE_TRY(upload_view(be, m, &m->final_norm, P_NORM));
    /* a multi-token-prediction module's input (absent elsewhere) */
    MOE_TRY(upload_matmul_view(be, m, &m->mtp_eh_proj, P_ATTN, 0));
    MOE_TRY(upload_view(be, m, &m->mtp_enorm, P_NORM));
    MOE_TRY(upload_view(be, m, &m->mtp_hnorm, P_NORM));
    for (int l = 0; l < cfg->n_layers; l++) {
        struct moe_layer_weights *w = &m->layers[l];
        /* the weights only matmul reads (FP8 ones kept as planes), then the
         * rest; MLA's (absent elsewhere) among both */
        struct moe_tensor *mm[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->wq_a, &w->wkv_a, &w->w_gate,
                                   &w->w_up, &w->w_down, &w->sh_gate, &w->sh_up, &w->sh_down,
                                   &w->lin_in, &w->lin_ba, &w->lin_qkv, &w->lin_z, &w->lin_b, &w->lin_a,
                                   &w->lin_out};
        const enum part mp[] = {P_ATTN, P_ATTN, P_ATTN, P_ATTN, P_ATTN, P_ATTN, P_DENSE, P_DENSE,
                                P_DENSE, P_SHARED, P_SHARED, P_SHARED, P_ATTN, P_ATTN, P_ATTN, P_ATTN,
                                P_ATTN, P_ATTN, P_ATTN};
        for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) MOE_TRY(upload_matmul_view(be, m, mm[i], mp[i], l));
        struct moe_tensor *attn[] = {&w->bq, &w->bk, &w->bv, &w->bo, &w->q_norm, &w->k_norm,
                                     &w->q_a_norm, &w->kv_a_norm, &w->w_uk, &w->w_uv, &w->lin_conv,
                                     &w->lin_a_log, &w->lin_dt_bias, &w->lin_norm};
        for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) MOE_TRY(upload_view(be, m, attn[i], P_ATTN));
        MOE_TRY(upload_view(be, m, &w->attn_norm, P_NORM));
        MOE_TRY(upload_view(be, m, &w->ffn_norm, P_NORM));
        struct moe_tensor *dense[] = {&w->b_gate, &w->b_up, &w->b_down};
        for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) MOE_TRY(upload_view(be, m, dense[i], P_DENSE));
        MOE_TRY(upload_view(be, m, &w->router, P_ROUTER));
        MOE_TRY(upload_view(be, m, &w->router_bias, P_ROUTER));
        MOE_TRY(upload_view(be, m, &w->router_b, P_ROUTER));
        MOE_TRY(upload_view(be, m, &w->sinks, P_ATTN));
        struct moe_tensor *eb[] = {&w->experts.b_gate, &w->experts.b_up, &w->experts.b_down};
        for (size_t i = 0; i < sizeof eb / sizeof eb[0]; i++) MOE_TRY(upload_view(be, m, eb[i], P_EXPERTS));
        MOE_TRY(upload_view(be, m, &w->sh_router, P_SHARED));
        if (cfg->layer_moe[l] && cfg->n_experts > 0)
            MOE_TRY(upload_held_experts(be, m, l, &w->experts, cfg->n_experts, cfg->d_model, cfg->d_expert,
                                        moe_layer++));
    }
    /* the plain cudaMemcpy calls above ran on the legacy stream, which the
     * backend's non-blocking stream does not wait for */
    MOE_CUDA_TRY(cudaDeviceSynchronize());
    return moe_cuda_report_load(c, be, cfg);
}
