/* model.c - binds checkpoint tensors to the model description, per family.
 *
 * Names follow the Hugging Face checkpoints: `model.embed_tokens.weight`,
 * `model.layers.{l}.self_attn.q_proj.weight`, ... .  MoE blocks live under
 * `mlp.` (Qwen2-MoE, Qwen3-MoE, OLMoE, and Mixtral in transformers 5) or
 * `block_sparse_moe.` (Mixtral checkpoints written before transformers 5,
 * with experts named w1 = gate, w3 = up, w2 = down).  Every tensor's dtype
 * and shape are checked against the configuration; a mismatch names the
 * tensor, the expected shape and the shape found. */
#include "runtime/model/model.h"
#include "runtime/model/model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN MOE_NAME_MAX

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "(");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
}

static bool is_float_weight(enum moe_dtype t)
{
    return t == MOE_DTYPE_F32 || t == MOE_DTYPE_F16 || t == MOE_DTYPE_BF16;
}

/* Binds `name` to *out, checking dtype and shape (ndim dims given). An absent
 * optional tensor leaves *out zeroed.  F8_E4M3 is accepted for a Linear
 * weight of an fp8 checkpoint only: packed (or, to_f32, dequantized) into
 * memory m owns (runtime/model/model_fp8.c), of a stack only the matrices
 * keep names (NULL: all). */
static enum moe_status bind_any(struct moe_model *m, struct moe_tensor *out, bool required, bool linear,
                                bool to_f32, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2,
                                const uint8_t *keep)
{
    memset(out, 0, sizeof *out);
    const struct moe_st_tensor *t = moe_safetensors_find(&m->st, name);
    const size_t len = strlen(name);
    if (!t && linear && m->cfg.q4_method != MOE_Q4_NONE) { /* PREFIX.weight stored in four bits */
        char prefix[NAME_MAX_LEN];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(len > 7 && !strcmp(name + len - 7, ".weight") ? len - 7 : len),
                 name);
        if (moe_model_q4_present(m, prefix))
            return moe_model_q4_bind(m, prefix, ndim, ndim == 3 ? d1 : d0, ndim == 3 ? d2 : d1, to_f32, out);
    }
    if (!t) {
        if (required) return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' is missing", name);
        return MOE_OK;
    }
    int64_t want[3] = {d0, d1, d2};
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char a[96], b[96];
        shape_str(a, sizeof a, ndim, want);
        shape_str(b, sizeof b, t->ndim, t->shape);
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' has shape %s, expected %s", name,
                        b, a);
    }
    if (t->dtype == MOE_DTYPE_F8E4M3) {
        if (!m->cfg.weights_fp8)
            return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: tensor '%s' is F8_E4M3 but config.json has no "
                            "quantization_config with quant_method fp8", name);
        if (!linear)
            return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: tensor '%s' is F8_E4M3; only Linear weights "
                            "(attention, FFN and expert projections) may be FP8, not routers, norms or "
                            "embeddings", name);
        return moe_model_fp8_bind(m, t, name, to_f32, keep, out);
    }
    if (!is_float_weight(t->dtype))
        return moe_fail(MOE_ERR_UNSUPPORTED,
                        "checkpoint: tensor '%s' has dtype %s (supported: F32, F16, BF16%s)", name,
                        moe_dtype_name(t->dtype), linear && m->cfg.weights_fp8 ? ", F8_E4M3" : "");
    out->dtype = t->dtype;
    out->ndim = ndim;
    for (int i = 0; i < ndim; i++) out->shape[i] = want[i];
    out->data = (void *)t->data;
    out->device = -1;
    return MOE_OK;
}

/* A weight that is not a Linear one (norms, embeddings, routers, biases). */
static enum moe_status bind(struct moe_model *m, struct moe_tensor *out, bool required, const char *name,
                            int ndim, int64_t d0, int64_t d1, int64_t d2)
{
    return bind_any(m, out, required, false, false, name, ndim, d0, d1, d2, NULL);
}

/* A Linear weight: F8_E4M3 ones packed to FP8_B128. */
static enum moe_status bind_linear(struct moe_model *m, struct moe_tensor *out, bool required,
                                   const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2)
{
    return bind_any(m, out, required, true, false, name, ndim, d0, d1, d2, NULL);
}

enum moe_status moe_model_bind_tensor(struct moe_model *m, struct moe_tensor *out,
                                      bool required, const char *name, int ndim, int64_t d0,
                                      int64_t d1, int64_t d2)
{
    return bind(m, out, required, name, ndim, d0, d1, d2);
}

enum moe_status moe_model_bind_linear(struct moe_model *m, struct moe_tensor *out, bool required, bool to_f32,
                                      const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2)
{
    return bind_any(m, out, required, true, to_f32, name, ndim, d0, d1, d2, NULL);
}

enum moe_status moe_model_own(struct moe_model *m, size_t bytes, void **out)
{
    void **list = realloc(m->owned, (m->n_owned + 1) * sizeof *list);
    if (!list) return moe_fail(MOE_ERR_NOMEM, "model: converted weights table");
    m->owned = list;
    *out = calloc(1, bytes ? bytes : 1);
    if (!*out) return moe_fail(MOE_ERR_NOMEM, "model: %zu bytes for converted weights", bytes);
    m->owned[m->n_owned++] = *out;
    return MOE_OK;
}

void moe_model_disown(struct moe_model *m, void *p)
{
    for (size_t i = 0; i < m->n_owned; i++)
        if (m->owned[i] == p) {
            free(p);
            m->owned[i] = m->owned[--m->n_owned];
            return;
        }
    MOE_ASSERT(!"moe_model_disown: memory the model does not own");
}

enum moe_status moe_model_widen_f32(struct moe_model *m, struct moe_tensor *t)
{
    const int64_t n = moe_tensor_numel(t);
    size_t bytes;
    if (n < 0 || !moe_mul_size((size_t)n, sizeof(float), &bytes))
        return moe_fail(MOE_ERR_FORMAT, "model: tensor of %lld elements", (long long)n);
    if (m->weights_deferred) { /* the device backend makes it, as F32 */
        t->dtype = MOE_DTYPE_F32;
        return MOE_OK;
    }
    void *p;
    MOE_TRY(moe_model_own(m, bytes, &p));
    moe_convert_row_f32(p, t->data, t->dtype, (size_t)n);
    t->data = p;
    t->dtype = MOE_DTYPE_F32;
    return MOE_OK;
}

#define NAMEF(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

static enum moe_status bind_attention(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    if (c->kv_lora_rank > 0) return moe_model_bind_mla(m, l, w);
    char n[NAME_MAX_LEN];
    int64_t D = c->d_model, Q = (int64_t)c->n_heads * c->head_dim,
            KV = (int64_t)c->n_kv_heads * c->head_dim;
    NAMEF(n, "model.layers.%d.input_layernorm.weight", l);
    MOE_TRY(bind(m, &w->attn_norm, true, n, 1, D, 0, 0));
    NAMEF(n, "model.layers.%d.post_attention_layernorm.weight", l);
    MOE_TRY(bind(m, &w->ffn_norm, true, n, 1, D, 0, 0));
    if (c->layer_linear[l]) return moe_model_bind_linear_attn(m, l, w);
    NAMEF(n, "model.layers.%d.self_attn.q_proj.weight", l);
    MOE_TRY(bind_linear(m, &w->wq, true, n, 2, c->attn_out_gate ? 2 * Q : Q, D, 0));
    NAMEF(n, "model.layers.%d.self_attn.k_proj.weight", l);
    MOE_TRY(bind_linear(m, &w->wk, true, n, 2, KV, D, 0));
    NAMEF(n, "model.layers.%d.self_attn.v_proj.weight", l);
    MOE_TRY(bind_linear(m, &w->wv, true, n, 2, KV, D, 0));
    NAMEF(n, "model.layers.%d.self_attn.o_proj.weight", l);
    MOE_TRY(bind_linear(m, &w->wo, true, n, 2, D, Q, 0));
    if (c->qkv_bias) {
        NAMEF(n, "model.layers.%d.self_attn.q_proj.bias", l);
        MOE_TRY(bind(m, &w->bq, true, n, 1, Q, 0, 0));
        NAMEF(n, "model.layers.%d.self_attn.k_proj.bias", l);
        MOE_TRY(bind(m, &w->bk, true, n, 1, KV, 0, 0));
        NAMEF(n, "model.layers.%d.self_attn.v_proj.bias", l);
        MOE_TRY(bind(m, &w->bv, true, n, 1, KV, 0, 0));
    }
    if (c->o_bias) {
        NAMEF(n, "model.layers.%d.self_attn.o_proj.bias", l);
        MOE_TRY(bind(m, &w->bo, true, n, 1, D, 0, 0));
    }
    if (c->qk_norm != MOE_QK_NORM_NONE) {
        bool full = c->qk_norm == MOE_QK_NORM_FULL;
        NAMEF(n, "model.layers.%d.self_attn.q_norm.weight", l);
        MOE_TRY(bind(m, &w->q_norm, true, n, 1, full ? Q : c->head_dim, 0, 0));
        NAMEF(n, "model.layers.%d.self_attn.k_norm.weight", l);
        MOE_TRY(bind(m, &w->k_norm, true, n, 1, full ? KV : c->head_dim, 0, 0));
    }
    if (c->attn_sinks) MOE_TRY(moe_model_bind_gpt_oss_sinks(m, l, w));
    if (c->family == MOE_FAMILY_LLAMA4) MOE_TRY(moe_model_llama4_rope_rows(m, l, w));
    return MOE_OK;
}

static enum moe_status bind_dense_ffn(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    char n[NAME_MAX_LEN];
    int64_t D = c->d_model, F = c->d_ff;
    const char *blk = c->family == MOE_FAMILY_LLAMA4 ? "feed_forward" : "mlp";
    NAMEF(n, "model.layers.%d.%s.gate_proj.weight", l, blk);
    MOE_TRY(bind_linear(m, &w->w_gate, true, n, 2, F, D, 0));
    NAMEF(n, "model.layers.%d.%s.up_proj.weight", l, blk);
    MOE_TRY(bind_linear(m, &w->w_up, true, n, 2, F, D, 0));
    NAMEF(n, "model.layers.%d.%s.down_proj.weight", l, blk);
    MOE_TRY(bind_linear(m, &w->w_down, true, n, 2, D, F, 0));
    if (c->mlp_bias) {
        NAMEF(n, "model.layers.%d.mlp.gate_proj.bias", l);
        MOE_TRY(bind(m, &w->b_gate, true, n, 1, F, 0, 0));
        NAMEF(n, "model.layers.%d.mlp.up_proj.bias", l);
        MOE_TRY(bind(m, &w->b_up, true, n, 1, F, 0, 0));
        NAMEF(n, "model.layers.%d.mlp.down_proj.bias", l);
        MOE_TRY(bind(m, &w->b_down, true, n, 1, D, 0, 0));
    }
    return MOE_OK;
}

/* The first expert of layer l that m holds. */
static int first_held(const struct moe_model *m, int l)
{
    int e = 0;
    while (e < m->cfg.n_experts - 1 && !moe_model_holds(m, l, e)) e++;
    return e;
}

/* Sets expert e's three pointers (layer l), requiring one dtype per layer. */
static enum moe_status set_expert(const struct moe_model *m, int l, struct moe_expert_weights *x, int e,
                                  const struct moe_tensor *g, const void *gate, const void *up, const void *down,
                                  const char *what)
{
    if (e == first_held(m, l)) x->dtype = g->dtype;
    if (g->dtype != x->dtype)
        return moe_fail(MOE_ERR_UNSUPPORTED,
                        "checkpoint: %s has dtype %s but the layer's first expert has %s", what,
                        moe_dtype_name(g->dtype), moe_dtype_name(x->dtype));
    x->gate[e] = gate;
    x->up[e] = up;
    x->down[e] = down;
    return MOE_OK;
}

/* Expert e's column orders (act-order four-bit weights) into x->cols
 * (allocated at the first permuted expert); its gate and up matrices must
 * share one (they read the same rows).  name: the down matrix's. */
static enum moe_status expert_cols(struct moe_expert_weights *x, int E, int e, const struct moe_tensor *g,
                                   const struct moe_tensor *u, const struct moe_tensor *d, const char *name)
{
    if (!g->cols && !u->cols && !d->cols) return MOE_OK;
    const int64_t D = g->shape[1];
    if (!g->cols != !u->cols || (g->cols && memcmp(g->cols, u->cols, (size_t)D * sizeof(int32_t))))
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: expert %d of '%s': its gate and up matrices order "
                        "their act-order columns differently (one order is supported)", e, name);
    if (!x->cols && !(x->cols = calloc(2 * (size_t)E, sizeof *x->cols)))
        return moe_fail(MOE_ERR_NOMEM, "expert column orders");
    x->cols[2 * e] = g->cols;
    x->cols[2 * e + 1] = d->cols;
    return MOE_OK;
}

/* Experts stacked as gu_name (E, 2F, D), gate rows first, and dn_name
 * (E, D, F) into x's table (allocated here). */
static enum moe_status bind_stacked_experts(struct moe_model *m, int l, const char *gu_name,
                                            const char *dn_name, struct moe_expert_weights *x)
{
    const struct moe_config *c = &m->cfg;
    const int64_t D = c->d_model, F = c->d_expert, E = c->n_experts;
    x->gate = calloc((size_t)E, sizeof *x->gate);
    x->up = calloc((size_t)E, sizeof *x->up);
    x->down = calloc((size_t)E, sizeof *x->down);
    if (!x->gate || !x->up || !x->down) return moe_fail(MOE_ERR_NOMEM, "expert table");
    /* a stack rewritten at load (FP8) is rewritten for the experts m holds */
    uint8_t *keep = malloc((size_t)E);
    if (!keep) return moe_fail(MOE_ERR_NOMEM, "expert table");
    for (int64_t e = 0; e < E; e++) keep[e] = (uint8_t)moe_model_holds(m, l, (int)e);
    struct moe_tensor gu, dn;
    enum moe_status s = bind_any(m, &gu, true, true, false, gu_name, 3, E, 2 * F, D, keep);
    if (s == MOE_OK) s = bind_any(m, &dn, true, true, false, dn_name, 3, E, D, F, keep);
    free(keep);
    MOE_TRY(s);
    if (dn.dtype != gu.dtype)
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: %s and %s differ in dtype", dn_name, gu_name);
    const size_t gate = (size_t)F * moe_dtype_row_bytes(gu.dtype, (size_t)D),
                 down = (size_t)D * moe_dtype_row_bytes(dn.dtype, (size_t)F);
    for (int64_t e = 0; e < E; e++) {
        if (!moe_model_holds(m, l, (int)e)) continue;
        const char *g = (const char *)gu.data + (size_t)e * 2 * gate;
        MOE_TRY(set_expert(m, l, x, (int)e, &gu, g, g + gate, (const char *)dn.data + (size_t)e * down, dn_name));
    }
    return MOE_OK;
}

static enum moe_status bind_experts(struct moe_model *m, int l, const char *blk,
                                    struct moe_expert_weights *x)
{
    const struct moe_config *c = &m->cfg;
    char n[NAME_MAX_LEN];
    int64_t D = c->d_model, F = c->d_expert, E = c->n_experts;
    /* Stacked (transformers 5): gate_up_proj (E, 2F, D) with gate rows first. */
    NAMEF(n, "model.layers.%d.%s.experts.gate_up_proj", l, blk);
    if (moe_safetensors_find(&m->st, n)) {
        char dn[NAME_MAX_LEN];
        NAMEF(dn, "model.layers.%d.%s.experts.down_proj", l, blk);
        return bind_stacked_experts(m, l, n, dn, x);
    }
    /* One tensor per expert. */
    x->gate = calloc((size_t)E, sizeof *x->gate);
    x->up = calloc((size_t)E, sizeof *x->up);
    x->down = calloc((size_t)E, sizeof *x->down);
    if (!x->gate || !x->up || !x->down) return moe_fail(MOE_ERR_NOMEM, "expert table");
    bool mixtral_names = !strcmp(blk, "block_sparse_moe");
    for (int64_t e = 0; e < E; e++) {
        if (!moe_model_holds(m, l, (int)e)) continue;
        struct moe_tensor g, u, d;
        const char *gn = mixtral_names ? "w1" : "gate_proj", *un = mixtral_names ? "w3" : "up_proj",
                   *dn = mixtral_names ? "w2" : "down_proj";
        NAMEF(n, "model.layers.%d.%s.experts.%lld.%s.weight", l, blk, (long long)e, gn);
        MOE_TRY(bind_linear(m, &g, true, n, 2, F, D, 0));
        NAMEF(n, "model.layers.%d.%s.experts.%lld.%s.weight", l, blk, (long long)e, un);
        MOE_TRY(bind_linear(m, &u, true, n, 2, F, D, 0));
        if (u.dtype != g.dtype)
            return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: %s differs in dtype from its gate", n);
        NAMEF(n, "model.layers.%d.%s.experts.%lld.%s.weight", l, blk, (long long)e, dn);
        MOE_TRY(bind_linear(m, &d, true, n, 2, D, F, 0));
        if (d.dtype != g.dtype)
            return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: %s differs in dtype from its gate", n);
        MOE_TRY(set_expert(m, l, x, (int)e, &g, g.data, u.data, d.data, n));
        MOE_TRY(expert_cols(x, (int)E, (int)e, &g, &u, &d, n));
    }
    return MOE_OK;
}

/* Granite MoE: router block_sparse_moe.router.layer (E, D), experts fused
 * as input_linear (E, 2F, D) (gate rows first) and output_linear (E, D, F),
 * a shared MLP fused the same way: shared_mlp.input_linear (2S, D),
 * output_linear (D, S). */
static enum moe_status bind_granite_moe(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    char n[NAME_MAX_LEN], d[NAME_MAX_LEN];
    const int64_t D = c->d_model, E = c->n_experts, S = c->d_shared;
    NAMEF(n, "model.layers.%d.block_sparse_moe.router.layer.weight", l);
    MOE_TRY(bind(m, &w->router, true, n, 2, E, D, 0));
    NAMEF(n, "model.layers.%d.block_sparse_moe.input_linear.weight", l);
    NAMEF(d, "model.layers.%d.block_sparse_moe.output_linear.weight", l);
    MOE_TRY(bind_stacked_experts(m, l, n, d, &w->experts));
    if (S == 0) return MOE_OK;
    struct moe_tensor gu;
    NAMEF(n, "model.layers.%d.shared_mlp.input_linear.weight", l);
    MOE_TRY(bind_linear(m, &gu, true, n, 2, 2 * S, D, 0));
    w->sh_gate = w->sh_up = gu;
    w->sh_gate.shape[0] = w->sh_up.shape[0] = S;
    w->sh_up.data = (char *)gu.data + (size_t)S * moe_dtype_row_bytes(gu.dtype, (size_t)D);
    NAMEF(n, "model.layers.%d.shared_mlp.output_linear.weight", l);
    return bind_linear(m, &w->sh_down, true, n, 2, D, S, 0);
}

static enum moe_status bind_moe(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    char n[NAME_MAX_LEN];
    int64_t D = c->d_model, E = c->n_experts;
    if (c->family == MOE_FAMILY_GRANITE_MOE) return bind_granite_moe(m, l, w);
    if (c->family == MOE_FAMILY_GPT_OSS) return moe_model_bind_gpt_oss_moe(m, l, w);
    if (c->family == MOE_FAMILY_LLAMA4) return moe_model_bind_llama4_moe(m, l, w);
    const char *blk = "mlp";
    const bool minimax = c->family == MOE_FAMILY_MINIMAX_M2;
    if (c->family == MOE_FAMILY_MIXTRAL || minimax) { /* as released: w1, w3, w2 per expert */
        NAMEF(n, "model.layers.%d.block_sparse_moe.gate.weight", l);
        if (moe_safetensors_find(&m->st, n)) blk = "block_sparse_moe";
    }
    NAMEF(n, "model.layers.%d.%s.gate.weight", l, blk);
    MOE_TRY(bind(m, &w->router, true, n, 2, E, D, 0));
    if (minimax) { /* a buffer of the MoE block, added in fp32 to the fp32 sigmoids: widened */
        NAMEF(n, "model.layers.%d.%s.e_score_correction_bias", l, blk);
        MOE_TRY(bind(m, &w->router_bias, true, n, 1, E, 0, 0));
        if (w->router_bias.dtype != MOE_DTYPE_F32) MOE_TRY(moe_model_widen_f32(m, &w->router_bias));
    } else if (c->router_bias) { /* kept in fp32 by transformers (_keep_in_fp32_modules_strict) */
        NAMEF(n, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        MOE_TRY(bind(m, &w->router_bias, true, n, 1, E, 0, 0));
        if (w->router_bias.dtype != MOE_DTYPE_F32)
            return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: %s is %s; the router bias must be F32", n,
                            moe_dtype_name(w->router_bias.dtype));
    }
    MOE_TRY(bind_experts(m, l, blk, &w->experts));
    if (c->d_shared > 0) {
        int64_t S = c->d_shared;
        /* Qwen2-MoE: mlp.shared_expert; GLM-4.5 / DeepSeek: mlp.shared_experts */
        const bool qwen = c->family == MOE_FAMILY_QWEN2_MOE || c->family == MOE_FAMILY_QWEN3_NEXT ||
                          c->family == MOE_FAMILY_QWEN3_5_MOE;
        const char *sh = qwen ? "shared_expert" : "shared_experts";
        NAMEF(n, "model.layers.%d.mlp.%s.gate_proj.weight", l, sh);
        MOE_TRY(bind_linear(m, &w->sh_gate, true, n, 2, S, D, 0));
        NAMEF(n, "model.layers.%d.mlp.%s.up_proj.weight", l, sh);
        MOE_TRY(bind_linear(m, &w->sh_up, true, n, 2, S, D, 0));
        NAMEF(n, "model.layers.%d.mlp.%s.down_proj.weight", l, sh);
        MOE_TRY(bind_linear(m, &w->sh_down, true, n, 2, D, S, 0));
        if (c->shared_gate) {
            NAMEF(n, "model.layers.%d.mlp.shared_expert_gate.weight", l);
            MOE_TRY(bind(m, &w->sh_router, true, n, 2, 1, D, 0));
        }
    }
    return MOE_OK;
}

enum moe_status moe_model_bind(struct moe_model *m)
{
    const struct moe_config *c = &m->cfg;
    int64_t V = c->vocab, D = c->d_model;
    /* gpt-oss binds deferred only with MXFP4 experts (model_gptoss.c) */
    if (((c->family == MOE_FAMILY_GPT_OSS && !c->experts_mxfp4) || c->family == MOE_FAMILY_LLAMA4 ||
         c->kv_lora_rank > 0 || c->weights_fp8 || c->norm_plus_one) &&
        m->weights_deferred)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: weights made on the device are not supported "
                        "(some are rewritten on the host at load); use host synthetic weights",
                        c->architecture);
    MOE_TRY(bind(m, &m->embed, true, "model.embed_tokens.weight", 2, V, D, 0));
    MOE_TRY(bind(m, &m->final_norm, true, "model.norm.weight", 1, D, 0, 0));
    MOE_TRY(bind(m, &m->lm_head, !c->tie_embeddings, "lm_head.weight", 2, V, D, 0));
    if (!m->lm_head.data) m->lm_head = m->embed;
    if (c->qk_l2_norm) MOE_TRY(moe_model_llama4_ones(m));
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return moe_fail(MOE_ERR_NOMEM, "layer table");
    for (int l = 0; l < c->n_layers; l++) MOE_TRY(moe_model_bind_layer(m, l, c->layer_moe[l], &m->layers[l]));
    if (c->norm_plus_one) MOE_TRY(moe_model_norms_plus_one(m));
    moe_model_drop_experts(m);
    return MOE_OK;
}

enum moe_status moe_model_set_held(struct moe_model *m, const uint8_t *held)
{
    const size_t n = (size_t)m->cfg.n_layers * (size_t)(m->cfg.n_experts > 0 ? m->cfg.n_experts : 1);
    free(m->ep_held);
    if (!(m->ep_held = malloc(n))) return moe_fail(MOE_ERR_NOMEM, "the held experts");
    memcpy(m->ep_held, held, n);
    return MOE_OK;
}

void moe_model_drop_experts(struct moe_model *m)
{
    if (!m->ep_held || !m->layers) return;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct moe_expert_weights *x = &m->layers[l].experts;
        if (!x->gate) continue;
        for (int e = 0; e < m->cfg.n_experts; e++)
            if (!moe_model_holds(m, l, e)) x->gate[e] = x->up[e] = x->down[e] = NULL;
    }
}

enum moe_status moe_model_bind_layer(struct moe_model *m, int l, bool moe, struct moe_layer_weights *w)
{
    MOE_TRY(bind_attention(m, l, w));
    return moe ? bind_moe(m, l, w) : bind_dense_ffn(m, l, w);
}

enum moe_status moe_model_load(struct moe_model *m, const char *dir)
{
    return moe_model_load_part(m, dir, NULL);
}

enum moe_status moe_model_load_part(struct moe_model *m, const char *dir, const uint8_t *held)
{
    memset(m, 0, sizeof *m);
    char path[4096];
    enum moe_status s;
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return moe_fail(MOE_ERR_INVALID_ARG, "model path is too long");
    m->dir = strdup(dir);
    if (!m->dir) return moe_fail(MOE_ERR_NOMEM, "model path");
    if ((s = moe_config_load(&m->cfg, path)) != MOE_OK) goto fail;
    if (held && (s = moe_model_set_held(m, held)) != MOE_OK) goto fail;
    if ((s = moe_safetensors_open_dir(&m->st, dir)) != MOE_OK) goto fail;
    if (m->cfg.tensor_prefix[0] && (s = moe_safetensors_strip_prefix(&m->st, m->cfg.tensor_prefix, m->cfg.tensor_prefix_to)) != MOE_OK)
        goto fail;
    if ((s = moe_model_bind(m)) != MOE_OK) {
        moe_error_prefix("%s: ", dir);
        goto fail;
    }
    return MOE_OK;
fail:
    moe_model_free(m);
    return s;
}

void moe_model_free(struct moe_model *m)
{
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            free(m->layers[l].experts.gate);
            free(m->layers[l].experts.up);
            free(m->layers[l].experts.down);
            free(m->layers[l].experts.cols);
        }
    }
    free(m->layers);
    free(m->ep_held);
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->dir);
    moe_safetensors_close(&m->st);
    memset(m, 0, sizeof *m);
}

enum moe_status moe_model_set_top_k(struct moe_model *m, int k)
{
    const struct moe_config *c = &m->cfg;
    if (c->n_experts == 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "top-k %d: %s is a dense model (no experts to route to)",
                        k, c->architecture);
    if (k < 1 || k > c->n_experts)
        return moe_fail(MOE_ERR_INVALID_ARG, "top-k %d: the model has %d experts per MoE layer "
                        "(use 1..%d)", k, c->n_experts, c->n_experts);
    const int eligible = c->topk_group * (c->n_experts / c->n_group);
    if (k > eligible)
        return moe_fail(MOE_ERR_INVALID_ARG, "top-k %d: the router chooses among the %d experts of "
                        "its %d best groups (use 1..%d)", k, eligible, c->topk_group, eligible);
    m->cfg.top_k = k;
    return MOE_OK;
}

/* Bytes of a view as stored (rows of its last dimension: block formats). */
static int64_t tbytes(const struct moe_tensor *t)
{
    if (!t->data || t->ndim < 1) return 0;
    const int64_t n = moe_tensor_numel(t), last = t->shape[t->ndim - 1];
    if (n <= 0 || last <= 0) return 0;
    return n / last * (int64_t)moe_dtype_row_bytes(t->dtype, (size_t)last);
}

/* tbytes(t), also added to by[t's dtype] when by is given. */
static int64_t tb(int64_t *by, const struct moe_tensor *t)
{
    const int64_t b = tbytes(t);
    if (by && b) by[t->dtype] += b;
    return b;
}

/* Parameters in a tensor of k elements named name (len chars) of a
 * four-bit checkpoint: eight per word of `qweight` / `weight_packed`, none
 * in scales, zero points, g_idx and shapes. */
static int64_t q4_params(const char *name, size_t len, int64_t k)
{
    static const char *packed[] = {".qweight", ".weight_packed"};
    static const char *none[] = {".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_zero_point",
                                 ".weight_shape", ".weight_g_idx"};
    for (size_t i = 0; i < sizeof packed / sizeof *packed; i++)
        if (len > strlen(packed[i]) && !strcmp(name + len - strlen(packed[i]), packed[i])) return 8 * k;
    for (size_t i = 0; i < sizeof none / sizeof *none; i++)
        if (len > strlen(none[i]) && !strcmp(name + len - strlen(none[i]), none[i])) return 0;
    return k;
}

/* Bytes of the stored tensors, by part into z, and, with by (indexed by
 * dtype), by dtype too. */
static void stored_bytes(const struct moe_model *m, struct moe_model_sizes *z, int64_t *by)
{
    const struct moe_config *c = &m->cfg;
    memset(z, 0, sizeof *z);
    const int64_t D = c->d_model, F = c->d_expert, E = c->n_experts;
    z->bytes_embed = tb(by, &m->embed);
    /* a tied head counts once, unless a backend made it a copy of its own (quantized) */
    z->bytes_lm_head = c->tie_embeddings && moe_model_head_tied(m) ? 0 : tb(by, &m->lm_head);
    z->bytes_norm = tb(by, &m->final_norm);
    for (int l = 0; l < c->n_layers; l++) {
        const struct moe_layer_weights *w = &m->layers[l];
        const struct moe_tensor *attn[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->bq, &w->bk,
                                           &w->bv, &w->bo, &w->q_norm, &w->k_norm, &w->sinks,
                                           &w->wq_a, &w->q_a_norm, &w->wkv_a, &w->kv_a_norm,
                                           &w->w_uk, &w->w_uv, &w->lin_in, &w->lin_ba, &w->lin_qkv,
                                           &w->lin_z, &w->lin_b, &w->lin_a, &w->lin_conv,
                                           &w->ix_wq, &w->ix_wk, &w->ix_norm_w, &w->ix_norm_b, &w->ix_wproj,
                                           &w->lin_a_log, &w->lin_dt_bias, &w->lin_norm, &w->lin_out};
        for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) z->bytes_attn += tb(by, attn[i]);
        z->bytes_norm += tb(by, &w->attn_norm) + tb(by, &w->ffn_norm);
        if (c->layer_moe[l]) {
            for (int e = 0; e < E; e++) {
                const enum moe_dtype et = moe_expert_dtype(&w->experts, e),
                                     dt = moe_expert_down_dtype(&w->experts, e);
                const int64_t gb = 2 * F * (int64_t)moe_dtype_row_bytes(et, (size_t)D),
                              db = D * (int64_t)moe_dtype_row_bytes(dt, (size_t)F);
                z->bytes_experts += gb + db;
                if (by) by[et] += gb, by[dt] += db;
            }
            z->bytes_experts += tb(by, &w->experts.b_gate) + tb(by, &w->experts.b_up) +
                               tb(by, &w->experts.b_down);
            z->bytes_router += tb(by, &w->router) + tb(by, &w->router_bias) + tb(by, &w->router_b);
            z->bytes_shared += tb(by, &w->sh_gate) + tb(by, &w->sh_up) + tb(by, &w->sh_down) +
                               tb(by, &w->sh_router);
        } else {
            z->bytes_dense_ffn += tb(by, &w->w_gate) + tb(by, &w->w_up) + tb(by, &w->w_down) +
                                  tb(by, &w->b_gate) + tb(by, &w->b_up) + tb(by, &w->b_down);
        }
    }
    z->bytes_total = z->bytes_embed + z->bytes_lm_head + z->bytes_norm + z->bytes_attn +
                     z->bytes_dense_ffn + z->bytes_experts + z->bytes_router + z->bytes_shared;
}

void moe_model_bytes_by_dtype(const struct moe_model *m, int64_t *by)
{
    struct moe_model_sizes z;
    memset(by, 0, MOE_DTYPE_N * sizeof *by);
    stored_bytes(m, &z, by);
}

void moe_model_sizes(const struct moe_model *m, struct moe_model_sizes *z)
{
    const struct moe_config *c = &m->cfg;
    const int64_t D = c->d_model, F = c->d_expert, K = c->top_k, E = c->n_experts;
    stored_bytes(m, z, NULL);
    int64_t expert_params = 0, expert_active = 0, other = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layer_moe[l]) continue;
        const int64_t bias = m->layers[l].experts.b_gate.data ? 2 * F + D : 0; /* gpt-oss */
        expert_params += E * (3 * F * D + bias);
        expert_active += K * (3 * F * D + bias);
    }
    /* Parameters: count elements of every checkpoint tensor (MXFP4: two
     * per byte of `_blocks`, none in `_scales`; fp8: none in
     * `_scale_inv`). */
    int64_t n = 0;
    for (size_t i = 0; i < m->st.n_tensors; i++) {
        const struct moe_st_tensor *t = &m->st.tensors[i];
        int64_t k = 1;
        for (int d = 0; d < t->ndim; d++) k *= t->shape[d];
        const size_t len = strlen(t->name);
        if (t->dtype == MOE_DTYPE_U8 && len > 7 && !strcmp(t->name + len - 7, "_blocks")) k *= 2;
        if (t->dtype == MOE_DTYPE_U8 && len > 7 && !strcmp(t->name + len - 7, "_scales")) k = 0;
        if (len > 10 && !strcmp(t->name + len - 10, "_scale_inv")) k = 0; /* fp8 block scales */
        if (c->q4_method != MOE_Q4_NONE) k = q4_params(t->name, len, k);
        n += k;
    }
    other = n - expert_params;
    z->params_total = n;
    /* Active per token, by the usual convention: everything but the experts
     * a token does not choose (embeddings included). */
    z->params_active = other + expert_active;
}

/* A part of the model in moe_config_sizes: its parameters, and those of
 * them stored otherwise than at the checkpoint's element size (FP8 or
 * MXFP4 matrices, F32 tensors) with their bytes. */
struct part {
    int64_t params, other_params, other_bytes;
};

static void add_params(struct part *p, int64_t n) { p->params += n; }

/* An (N, K) weight stored as dt (not the element size). */
static void add_stored(struct part *p, int64_t N, int64_t K, enum moe_dtype dt)
{
    p->params += N * K;
    p->other_params += N * K;
    p->other_bytes += N * (int64_t)moe_dtype_row_bytes(dt, (size_t)K);
}

/* An (N, K) Linear weight: FP8_B128 in an fp8 checkpoint, Q4_G128 (or
 * Q4_G32 when K is not a multiple of 128) in a four-bit one, else at es. */
static void add_linear(struct part *p, const struct moe_config *c, int64_t N, int64_t K)
{
    if (c->weights_fp8) add_stored(p, N, K, MOE_DTYPE_FP8_B128);
    else if (c->q4_method != MOE_Q4_NONE) add_stored(p, N, K, K % 128 ? MOE_DTYPE_Q4_G32 : MOE_DTYPE_Q4_G128);
    else add_params(p, N * K);
}

static int64_t part_bytes(const struct part *p, int64_t es)
{
    return (p->params - p->other_params) * es + p->other_bytes;
}

int64_t moe_model_expert_bytes(const struct moe_model *m, int *weight_bytes)
{
    const struct moe_config *c = &m->cfg;
    *weight_bytes = 0;
    for (int l = 0; l < c->n_layers && m->layers; l++) {
        const struct moe_expert_weights *x = &m->layers[l].experts;
        if (!c->layer_moe[l] || !x->gate) continue;
        if (!x->dtypes && !x->down_dtypes && (x->dtype == MOE_DTYPE_F32 || x->dtype == MOE_DTYPE_F16 || x->dtype == MOE_DTYPE_BF16 ||
                           x->dtype == MOE_DTYPE_BF16_PANEL)) /* panels: bf16 repacked */
            *weight_bytes = (int)moe_dtype_size(x->dtype);
        /* a mixed layer (per-expert plan): the mean over its experts */
        int64_t sum = 0;
        const int n = x->dtypes || x->down_dtypes ? c->n_experts : 1;
        for (int e = 0; e < n; e++) {
            const enum moe_dtype dt = moe_expert_dtype(x, e), ddt = moe_expert_down_dtype(x, e);
            sum += 2 * (int64_t)c->d_expert * (int64_t)moe_dtype_row_bytes(dt, (size_t)c->d_model) +
                   (int64_t)c->d_model * (int64_t)moe_dtype_row_bytes(ddt, (size_t)c->d_expert);
        }
        return sum / n;
    }
    return 0;
}

void moe_config_sizes(const struct moe_config *c, size_t es, struct moe_model_sizes *z)
{
    memset(z, 0, sizeof *z);
    const int64_t D = c->d_model, V = c->vocab, Q = (int64_t)c->n_heads * c->head_dim,
                  KV = (int64_t)c->n_kv_heads * c->head_dim, E = c->n_experts, F = c->d_expert,
                  K = c->top_k, S = c->d_shared, Fd = c->d_ff;
    struct part embed = {V * D, 0, 0}, head = {c->tie_embeddings ? 0 : V * D, 0, 0}, norm = {D, 0, 0},
                attn = {0}, experts = {0}, shared = {0}, router = {0}, dense = {0};
    int64_t active_experts = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->kv_lora_rank > 0) { /* MLA: q (LoRA or not), kv_a, its norm, kv_b, o */
            const int64_t H = c->n_heads, Rc = c->kv_lora_rank, Rq = c->q_lora_rank,
                          QK = c->qk_nope_dim + c->rope_dim, Vh = c->v_head_dim;
            if (Rq > 0) {
                add_linear(&attn, c, Rq, D);
                add_params(&attn, Rq);
                add_linear(&attn, c, H * QK, Rq);
            } else {
                add_linear(&attn, c, H * QK, D);
            }
            add_linear(&attn, c, Rc + c->rope_dim, D);
            add_params(&attn, Rc);
            /* kv_b_proj, split per head at load: F32 when dequantized from FP8 */
            if (c->weights_fp8) add_stored(&attn, H * (c->qk_nope_dim + Vh), Rc, MOE_DTYPE_F32);
            else add_params(&attn, H * (c->qk_nope_dim + Vh) * Rc);
            add_linear(&attn, c, D, H * Vh);
            if (c->dsa_topk > 0 && !c->layer_dsa_shared[l]) { /* the indexer: wq_b, wk, weights_proj, its LayerNorm */
                add_linear(&attn, c, (int64_t)c->dsa_heads * c->dsa_dim, Rq);
                add_linear(&attn, c, c->dsa_dim, D);
                add_linear(&attn, c, c->dsa_heads, D);
                add_params(&attn, 2 * (int64_t)c->dsa_dim);
            }
        } else if (c->layer_linear[l]) { /* in_proj_qkvz, in_proj_ba, out_proj, conv, A_log, dt_bias, norm */
            const int64_t Kd = (int64_t)c->lin_k_heads * c->lin_k_dim, Vd = (int64_t)c->lin_v_heads * c->lin_v_dim,
                          Hv = c->lin_v_heads;
            add_linear(&attn, c, 2 * Kd + 2 * Vd, D);
            add_params(&attn, 2 * Hv * D);
            add_linear(&attn, c, D, Vd);
            add_params(&attn, (2 * Kd + Vd) * c->lin_conv + 2 * Hv + c->lin_v_dim);
        } else {
            add_linear(&attn, c, c->attn_out_gate ? 2 * Q : Q, D);
            add_linear(&attn, c, KV, D);
            add_linear(&attn, c, KV, D);
            add_linear(&attn, c, D, Q);
        }
        if (c->qkv_bias && !c->layer_linear[l]) add_params(&attn, Q + 2 * KV);
        if (c->o_bias && !c->layer_linear[l]) add_params(&attn, D);
        if (c->qk_norm == MOE_QK_NORM_HEAD && !c->layer_linear[l]) add_params(&attn, 2 * c->head_dim);
        if (c->qk_norm == MOE_QK_NORM_FULL) add_params(&attn, Q + KV);
        if (c->attn_sinks) add_params(&attn, c->n_heads);
        add_params(&norm, 2 * D);
        if (c->layer_moe[l]) {
            for (int64_t e = 0; e < E; e++) {
                if (c->experts_mxfp4) {
                    add_stored(&experts, 2 * F, D, MOE_DTYPE_MXFP4);
                    add_stored(&experts, D, F, MOE_DTYPE_MXFP4);
                } else {
                    add_linear(&experts, c, 2 * F, D);
                    add_linear(&experts, c, D, F);
                }
            }
            if (c->expert_bias) add_params(&experts, E * (2 * F + D)); /* biases stay at es */
            active_experts += 3 * K * F * D + (c->expert_bias ? K * (2 * F + D) : 0);
            add_params(&router, E * D + (c->router_logit_bias ? E : 0));
            if (c->router_bias) add_stored(&router, 1, E, MOE_DTYPE_F32); /* F32 in every checkpoint */
            if (S) {
                add_linear(&shared, c, 2 * S, D);
                add_linear(&shared, c, D, S);
                if (c->shared_gate) add_params(&shared, D);
            }
        } else {
            add_linear(&dense, c, 2 * Fd, D);
            add_linear(&dense, c, D, Fd);
            if (c->mlp_bias) add_params(&dense, 2 * Fd + D);
        }
    }
    const int64_t e = (int64_t)es;
    z->bytes_embed = part_bytes(&embed, e);
    z->bytes_lm_head = part_bytes(&head, e);
    z->bytes_norm = part_bytes(&norm, e);
    z->bytes_attn = part_bytes(&attn, e);
    z->bytes_experts = part_bytes(&experts, e);
    z->bytes_shared = part_bytes(&shared, e);
    z->bytes_router = part_bytes(&router, e);
    z->bytes_dense_ffn = part_bytes(&dense, e);
    z->params_total = embed.params + head.params + norm.params + attn.params + experts.params + shared.params +
                      router.params + dense.params;
    z->params_active = z->params_total - experts.params + active_experts;
    z->bytes_total = z->bytes_embed + z->bytes_lm_head + z->bytes_norm + z->bytes_attn +
                     z->bytes_experts + z->bytes_shared + z->bytes_router + z->bytes_dense_ffn;
}
