/* backend_cpu.c - the CPU backends: host memory, OpenMP threads, each op a
 * call into its module's *_cpu function (the reference, "cpu-ref") or, for
 * the heavy ops, its *_fast twin ("cpu": matmul, experts and attention with
 * AVX2/AVX-512 kernels, chosen at init by what the processor supports, plus
 * the optional matmul_multi; the reference table where it supports neither).
 * The two tables differ only in those entries.  Scratch for weight-row conversion, attention and DeltaNet
 * accumulators and the expert list is sized in prepare_model, so no op
 * allocates; the OpenMP team is created once and reused by every op.
 *
 * With the AVX2 or AVX-512 kernels, prepare_model also repacks (backend_cpu_pack.c) the model's bf16
 * matrices (every weight that goes through matmul or the expert phase) into
 * 16-output panels (MOE_DTYPE_BF16_PANEL, runtime/cpu/gemm_fast.h) in one
 * arena per model that the backend owns, rewrites the model's views to
 * point there, and drops the process's pages of each source matrix (from a
 * file mapping, or the set's own in-memory synthetic tensors), so the
 * process holds about one copy of the weights.  The matrices repacked are
 * the 2-D bf16 ones with an even inner size: attention, dense and shared
 * FFN, routers, LM head, every expert's gate/up/down.  After it the model
 * serves only this backend (any other refuses it at prepare_model).
 * moe_backend_opts.cpu_panels false keeps the natural layout and the model
 * untouched; moe_backend_opts.quant Q8_0 quantizes instead (see
 * enum moe_weight_quant). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "experts/experts.h"
#include "router/router.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/backend_cpu_impl.h"
#include "runtime/backend/backend_impl.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/core/argmax.h"

/* The backend's context.  Scratch is sized for c->threads, and OpenMP's
 * thread count is a per-thread setting, so every op pins it for the calling
 * thread (a server's engine thread is not the one that created the
 * backend). */
static struct cpu_ctx *ctx_of(struct moe_backend *be)
{
    struct cpu_ctx *c = be->ctx;
    if (c && omp_get_max_threads() != c->threads) omp_set_num_threads(c->threads);
    return c;
}

static enum moe_status cpu_alloc(struct moe_backend *be, size_t bytes, void **out)
{
    *out = calloc(1, bytes ? bytes : 1);
    if (!*out) return moe_fail(MOE_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
    return MOE_OK;
}

static void cpu_dealloc(struct moe_backend *be, void *p) { free(p); }

static enum moe_status cpu_copy(struct moe_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes) memmove(dst, src, bytes);
    return MOE_OK;
}

static enum moe_status cpu_sync(struct moe_backend *be) { return MOE_OK; }

static enum moe_status cpu_prepare_model(struct moe_backend *be, struct moe_model *m)
{
    struct cpu_ctx *c = ctx_of(be);
    const struct moe_config *cfg = &m->cfg;
    if (m->weights_deferred)
        return moe_fail(MOE_ERR_INVALID_ARG, "cpu backend: the model's synthetic weights were "
                        "deferred to a device backend");
    MOE_TRY(moe_cpu_pack_model(c, be, m));
    size_t need = (size_t)cfg->d_model;
    size_t dims[] = {(size_t)cfg->n_heads * cfg->head_dim, (size_t)cfg->d_ff,
                     (size_t)cfg->d_expert, (size_t)cfg->d_shared, (size_t)cfg->kv_lora_rank,
                     (size_t)cfg->q_lora_rank, (size_t)cfg->n_heads * cfg->v_head_dim,
                     moe_attention_scratch_floats(cfg->n_heads, cfg->n_kv_heads, cfg->head_dim),
                     m->mtp_eh_proj.data ? 2 * (size_t)cfg->d_model : 0,
                     moe_config_linear_layers(cfg) > 0 ? moe_attention_delta_scratch(cfg->lin_k_dim, cfg->lin_v_dim)
                                                       : 0};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] > need) need = dims[i];
    size_t att = moe_attention_fast_scratch(cfg->n_heads / cfg->n_kv_heads, cfg->head_dim);
    if (att > need) need = att;
    if (cfg->n_experts > c->n_active_cap) {
        int32_t *a = realloc(c->active, (size_t)cfg->n_experts * sizeof(int32_t));
        if (!a) return moe_fail(MOE_ERR_NOMEM, "cpu backend: expert list");
        c->active = a;
        c->n_active_cap = cfg->n_experts;
    }
    if (need <= c->scratch_per_thread) return MOE_OK;
    size_t total;
    if (!moe_mul_size(need, (size_t)c->threads, &total) || !moe_mul_size(total, sizeof(float), &total))
        return moe_fail(MOE_ERR_NOMEM, "cpu backend: scratch size overflows");
    float *s = realloc(c->scratch, total);
    if (!s) return moe_fail(MOE_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes of scratch", total);
    c->scratch = s;
    c->scratch_per_thread = need;
    return MOE_OK;
}

static enum moe_status cpu_embed(struct moe_backend *be, float *x, const int32_t *tokens, int T,
                                 const struct moe_tensor *emb, int64_t first)
{
    const int64_t R = emb->shape[0], D = emb->shape[1];
    const size_t row = moe_dtype_row_bytes(emb->dtype, (size_t)D);
    for (int t = 0; t < T; t++) {
        const int64_t r = (int64_t)tokens[t] - first;
        if (r < 0 || r >= R)
            memset(x + (size_t)t * D, 0, (size_t)D * sizeof *x);
        else
            moe_convert_row_f32(x + (size_t)t * D, (const char *)emb->data + (size_t)r * row, emb->dtype, (size_t)D);
    }
    return MOE_OK;
}

static enum moe_status cpu_rmsnorm(struct moe_backend *be, float *y, const float *x,
                                   const struct moe_tensor *w, int rows, int dim, float eps)
{
    moe_attention_rmsnorm_cpu(y, x, w, rows, dim, eps);
    return MOE_OK;
}

static enum moe_status cpu_matmul(struct moe_backend *be, float *y, const float *x,
                                  const struct moe_tensor *w, const struct moe_tensor *b, int T)
{
    struct cpu_ctx *c = ctx_of(be);
    const int N = (int)w->shape[0], Din = (int)w->shape[1];
    MOE_ASSERT((size_t)Din <= c->scratch_per_thread);
    moe_gemm_cpu(y, N, x, Din, w->data, w->dtype, N, Din, T, b, c->scratch);
    return MOE_OK;
}

static enum moe_status fast_matmul(struct moe_backend *be, float *y, const float *x,
                                   const struct moe_tensor *w, const struct moe_tensor *b, int T)
{
    const int N = (int)w->shape[0], Din = (int)w->shape[1];
    moe_gemm_fast(ctx_of(be)->isa, y, N, x, Din, w->data, w->dtype, N, Din, T, b);
    return MOE_OK;
}

static enum moe_status fast_matmul_multi(struct moe_backend *be, int n, float *const *y,
                                         const float *x, const struct moe_tensor *const *w,
                                         const struct moe_tensor *const *b, int T)
{
    const void *wd[4];
    enum moe_dtype wt[4];
    int N[4];
    const int Din = (int)w[0]->shape[1];
    MOE_ASSERT(n >= 1 && n <= 4);
    for (int i = 0; i < n; i++) {
        MOE_ASSERT(w[i]->shape[1] == Din);
        wd[i] = w[i]->data;
        wt[i] = w[i]->dtype;
        N[i] = (int)w[i]->shape[0];
    }
    moe_gemm_fast_multi(ctx_of(be)->isa, n, y, x, Din, wd, wt, N, T, b);
    return MOE_OK;
}

static enum moe_status cpu_head_matmul(struct moe_backend *be, float *y, int ldy, const float *x,
                                       int ldx, const struct moe_tensor *w, int T)
{
    struct cpu_ctx *c = ctx_of(be);
    const int H = (int)w->shape[0], N = (int)w->shape[1], K = (int)w->shape[2];
    const size_t mat = (size_t)N * moe_dtype_row_bytes(w->dtype, (size_t)K);
    MOE_ASSERT((size_t)K <= c->scratch_per_thread);
    for (int h = 0; h < H; h++)
        moe_gemm_cpu(y + (size_t)h * ldy, H * ldy, x + (size_t)h * ldx, H * ldx,
                     (const char *)w->data + h * mat, w->dtype, N, K, T, NULL, c->scratch);
    return MOE_OK;
}

static enum moe_status fast_head_matmul(struct moe_backend *be, float *y, int ldy, const float *x,
                                        int ldx, const struct moe_tensor *w, int T)
{
    const int H = (int)w->shape[0], N = (int)w->shape[1], K = (int)w->shape[2];
    const size_t mat = (size_t)N * moe_dtype_row_bytes(w->dtype, (size_t)K);
    for (int h = 0; h < H; h++)
        moe_gemm_fast(ctx_of(be)->isa, y + (size_t)h * ldy, H * ldy, x + (size_t)h * ldx, H * ldx,
                      (const char *)w->data + h * mat, w->dtype, N, K, T, NULL);
    return MOE_OK;
}

static enum moe_status cpu_gather_cols(struct moe_backend *be, float *dst, int ld_dst, const float *src,
                                       int ld_src, int rows, const int32_t *idx, int n)
{
    for (int r = 0; r < rows; r++) {
        float *d = dst + (size_t)r * ld_dst;
        const float *s = src + (size_t)r * ld_src;
        if (!idx) memcpy(d, s, (size_t)n * sizeof(float));
        else
            for (int j = 0; j < n; j++) d[j] = s[idx[j]];
    }
    return MOE_OK;
}

static enum moe_status cpu_add(struct moe_backend *be, float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += x[i];
    return MOE_OK;
}

static enum moe_status cpu_scale(struct moe_backend *be, float *x, size_t n, float s)
{
    for (size_t i = 0; i < n; i++) x[i] *= s;
    return MOE_OK;
}

static enum moe_status cpu_clamp(struct moe_backend *be, float *x, size_t n, float limit)
{
    for (size_t i = 0; i < n; i++) x[i] = x[i] < -limit ? -limit : (x[i] > limit ? limit : x[i]);
    return MOE_OK;
}

static enum moe_status cpu_swiglu(struct moe_backend *be, float *g, const float *u, size_t n)
{
    moe_experts_swiglu_cpu(g, u, n);
    return MOE_OK;
}

static enum moe_status cpu_rope(struct moe_backend *be, float *x, const int32_t *pos, int T, int H,
                                int Dh, int rot, const float *inv_freq)
{
    moe_attention_rope_cpu(x, pos, T, H, Dh, rot, inv_freq);
    return MOE_OK;
}

static enum moe_status cpu_kv_store(struct moe_backend *be, struct moe_kvcache *kv, int layer,
                                    const float *k, const float *v, const int32_t *slots, int T)
{
    moe_attention_kv_store_cpu(kv, layer, k, v, slots, T);
    return MOE_OK;
}

static enum moe_status cpu_attention(struct moe_backend *be, float *out, const float *q,
                                     const struct moe_kvcache *kv, const struct moe_batch *b,
                                     const struct moe_attn_params *p)
{
    moe_attention_paged_cpu(out, q, kv, b, p, ctx_of(be)->scratch);
    return MOE_OK;
}

static enum moe_status fast_attention(struct moe_backend *be, float *out, const float *q,
                                      const struct moe_kvcache *kv, const struct moe_batch *b,
                                      const struct moe_attn_params *p)
{
    struct cpu_ctx *c = ctx_of(be);
    if (p->keys) moe_attention_paged_cpu(out, q, kv, b, p, c->scratch); /* a selection: the reference's loop */
    else moe_attention_paged_fast(c->isa, out, q, kv, b, p, c->scratch, c->scratch_per_thread);
    return MOE_OK;
}

static enum moe_status cpu_delta_net(struct moe_backend *be, float *out, float *qkv, const float *b,
                                     const float *a, struct moe_kvcache *kv, const struct moe_batch *bt,
                                     const struct moe_delta_params *p)
{
    struct cpu_ctx *c = ctx_of(be);
    return moe_attention_delta_cpu(out, qkv, b, a, kv, bt, p, c->scratch, c->scratch_per_thread);
}

static enum moe_status fast_delta_net(struct moe_backend *be, float *out, float *qkv, const float *b,
                                      const float *a, struct moe_kvcache *kv, const struct moe_batch *bt,
                                      const struct moe_delta_params *p)
{
    struct cpu_ctx *c = ctx_of(be);
    return moe_attention_delta_fast(c->isa, out, qkv, b, a, kv, bt, p, c->scratch, c->scratch_per_thread);
}

static enum moe_status cpu_dsa_select(struct moe_backend *be, int32_t *keys, int topk, const float *q, float *k,
                                      const float *w, const struct moe_tensor *norm_w,
                                      const struct moe_tensor *norm_b, const float *inv_freq, int rot,
                                      struct moe_kvcache *kv, int layer, const struct moe_batch *b, int Hi, int Di)
{
    (void)be;
    moe_attention_dsa_select_cpu(keys, topk, q, k, w, norm_w->data, norm_b->data, inv_freq, rot, kv, layer, b, Hi,
                                 Di);
    return MOE_OK;
}

static enum moe_status cpu_route(struct moe_backend *be, int32_t *ids, float *w,
                                 const float *logits, int T, const struct moe_route *r)
{
    if (r->sigmoid) moe_router_topk_sigmoid_cpu(ids, w, logits, T, r);
    else moe_router_topk_softmax_cpu(ids, w, logits, T, r);
    return MOE_OK;
}

static enum moe_status cpu_dispatch(struct moe_backend *be, struct moe_dispatch *plan,
                                    const int32_t *ids, int T, int K, int E)
{
    moe_router_dispatch_cpu(plan, ids, T, K, E);
    return MOE_OK;
}

static enum moe_status cpu_experts(struct moe_backend *be, float *out, const float *x,
                                   const struct moe_dispatch *plan, const float *w,
                                   const struct moe_expert_weights *ex,
                                   const struct moe_expert_ws *ws, int T, int K, int D, int F,
                                   int E)
{
    moe_experts_ffn_cpu(out, x, plan, w, ex, ws, T, K, D, F, E, ctx_of(be)->scratch);
    return MOE_OK;
}

static enum moe_status fast_experts(struct moe_backend *be, float *out, const float *x,
                                    const struct moe_dispatch *plan, const float *w,
                                    const struct moe_expert_weights *ex,
                                    const struct moe_expert_ws *ws, int T, int K, int D, int F,
                                    int E)
{
    struct cpu_ctx *c = ctx_of(be);
    MOE_ASSERT((plan->hi > 0 ? plan->hi - plan->lo : E) <= c->n_active_cap); /* a rank's slots: distinct experts */
    moe_experts_ffn_fast(c->isa, out, x, plan, w, ex, ws, T, K, D, F, E, c->active);
    return MOE_OK;
}

static enum moe_status cpu_combine(struct moe_backend *be, float *out, const struct moe_expert_ws *ws,
                                   const struct moe_dispatch *plan, const float *w, int T, int K, int D)
{
#pragma omp parallel if ((size_t)T * D > 65536)
    moe_experts_combine_cpu(out, ws->ye, w, plan->pos, T, K, D);
    return MOE_OK;
}

static enum moe_status cpu_sigmoid_scale(struct moe_backend *be, float *y, const float *g, int T,
                                         int D)
{
    for (int t = 0; t < T; t++) {
        float s = 1.0f / (1.0f + expf(-g[t]));
        for (int d = 0; d < D; d++) y[(size_t)t * D + d] *= s;
    }
    return MOE_OK;
}

static enum moe_status cpu_scale_rows(struct moe_backend *be, float *y, const float *x, const float *s, int T,
                                      int D)
{
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) y[(size_t)t * D + d] = x[(size_t)t * D + d] * s[t];
    return MOE_OK;
}

static enum moe_status cpu_gather_rows(struct moe_backend *be, float *dst, const float *src,
                                       const int32_t *rows, int n, int D)
{
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * D, src + (size_t)rows[i] * D, (size_t)D * sizeof(float));
    return MOE_OK;
}

static enum moe_status cpu_argmax(struct moe_backend *be, int32_t *ids, const float *x, int rows,
                                  int n)
{
    (void)be;
    for (int r = 0; r < rows; r++) ids[r] = moe_argmax(x + (size_t)r * n, n);
    return MOE_OK;
}

static void cpu_destroy(struct moe_backend *be)
{
    struct cpu_ctx *c = ctx_of(be);
    if (c) {
        free(c->scratch);
        free(c->active);
        for (int i = 0; i < c->n_arenas; i++) free(c->arenas[i].p);
        free(c->arenas);
    }
    free(c);
    be->ctx = NULL;
}

/* The entries both tables share: everything but the name and the heavy
 * ops (matmul, attention, experts, the optional matmul_multi). */
#define CPU_SHARED_OPS                   \
    .host_memory = true,                 \
    .destroy = cpu_destroy,              \
    .alloc = cpu_alloc,                  \
    .dealloc = cpu_dealloc,              \
    .to_device = cpu_copy,               \
    .to_host = cpu_copy,                 \
    .prepare_model = cpu_prepare_model,  \
    .sync = cpu_sync,                    \
    .embed = cpu_embed,                  \
    .rmsnorm = cpu_rmsnorm,              \
    .add = cpu_add,                      \
    .scale = cpu_scale,                  \
    .clamp = cpu_clamp,                  \
    .swiglu = cpu_swiglu,                \
    .rope = cpu_rope,                    \
    .kv_store = cpu_kv_store,            \
    .dsa_select = cpu_dsa_select,        \
    .route = cpu_route,                  \
    .dispatch = cpu_dispatch,            \
    .combine = cpu_combine,              \
    .sigmoid_scale = cpu_sigmoid_scale,  \
    .scale_rows = cpu_scale_rows,        \
    .gather_rows = cpu_gather_rows,      \
    .gather_cols = cpu_gather_cols,      \
    .argmax = cpu_argmax,                \
    .host_alloc = cpu_alloc,             \
    .host_free = cpu_dealloc,            \
    .to_host_async = cpu_copy

static const struct moe_backend_ops cpu_ops = {
    .name = "cpu-ref",
    CPU_SHARED_OPS,
    .matmul = cpu_matmul,
    .head_matmul = cpu_head_matmul,
    .attention = cpu_attention,
    .delta_net = cpu_delta_net,
    .experts = cpu_experts,
};

/* The reference table with the heavy ops replaced by their fast twins:
 * the selection table of the fast path. */
static const struct moe_backend_ops cpu_fast_ops = {
    .name = "cpu",
    CPU_SHARED_OPS,
    .matmul = fast_matmul,
    .matmul_multi = fast_matmul_multi,
    .head_matmul = fast_head_matmul,
    .attention = fast_attention,
    .delta_net = fast_delta_net,
    .experts = fast_experts,
};

static enum moe_status cpu_init(struct moe_backend *be, int n_threads, enum moe_cpu_isa isa,
                                bool panels)
{
    memset(be, 0, sizeof *be);
    struct cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return moe_fail(MOE_ERR_NOMEM, "cpu backend");
    if (n_threads > 0) omp_set_num_threads(n_threads);
    c->threads = omp_get_max_threads();
    c->isa = isa;
    c->panels = isa >= MOE_CPU_ISA_AVX2 && panels;
    be->ops = isa == MOE_CPU_ISA_REF ? &cpu_ops : &cpu_fast_ops;
    be->ctx = c;
    be->n_threads = c->threads;
    return MOE_OK;
}

enum moe_status moe_backend_cpu_open(struct moe_backend *be, bool fast, const struct moe_backend_opts *o)
{
    enum moe_cpu_isa isa = MOE_CPU_ISA_REF;
    if (fast) isa = moe_cpu_isa_choose(o->cpu_isa_max);
    return cpu_init(be, o->n_threads, isa, o->cpu_panels);
}

int moe_backend_cpu_isa(const struct moe_backend *be)
{
    return be->ops == &cpu_fast_ops ? ((const struct cpu_ctx *)be->ctx)->isa : MOE_CPU_ISA_REF;
}
