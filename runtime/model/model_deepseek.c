/* model_deepseek.c - DeepSeek-V2/V3 multi-head latent attention weights.
 *
 *   self_attn.q_proj (H*(nope+rope), D), or q_a_proj (Rq, D),
 *     q_a_layernorm (Rq) and q_b_proj (H*(nope+rope), Rq)
 *   self_attn.kv_a_proj_with_mqa (Rc + rope, D), kv_a_layernorm (Rc)
 *   self_attn.kv_b_proj (H*(nope+v), Rc): per head, nope key rows then v
 *     value rows
 *   self_attn.o_proj (D, H*v)
 * The query's and the key's rope values may be stored in interleaved pairs
 * (2i, 2i+1) (rope_interleave; always in V2); the forward pass reads them in
 * the rotate-half order through index tables (runtime/engine/forward_mla.c), so the
 * projections are bound in place (fp8 checkpoints: packed, model_fp8.c).
 * kv_b_proj is split at load into the two per-head matrices the absorbed
 * form needs, in memory the model owns: w_uk (H, Rc, nope), each head's key
 * rows transposed, and w_uv (H, v, Rc), in its dtype (fp8: F32, the exact
 * dequantized values).
 *
 * DeepSeek sparse attention's indexer (config.h) on each layer that runs one
 * (GLM-MoE-DSA's shared layers have none):
 *   self_attn.indexer.wq_b (Hi*Di, Rq), wk (Di, D), weights_proj (Hi, D),
 *     k_norm.weight, k_norm.bias (Di)
 * GLM-MoE-DSA's indexer rotates interleaved pairs: wq_b's rows of each head,
 * wk's rows and k_norm's values are reordered at load, over the first rope
 * values, to the rotate-half order (pair i to i and rope/2 + i; LayerNorm
 * commutes with the permutation), in memory the model owns. */
#include <string.h>

#include "runtime/model/model_impl.h"

#define NAMEF(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

static enum moe_status split_kv_b(struct moe_model *m, const struct moe_tensor *kvb,
                                  struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    const int64_t H = c->n_heads, Rc = c->kv_lora_rank, nope = c->qk_nope_dim, V = c->v_head_dim;
    const size_t es = moe_dtype_size(kvb->dtype);
    char *uk, *uv;
    MOE_TRY(moe_model_own(m, (size_t)(H * Rc * nope) * es, (void **)&uk));
    MOE_TRY(moe_model_own(m, (size_t)(H * V * Rc) * es, (void **)&uv));
    for (int64_t h = 0; h < H; h++) {
        const char *keys = (const char *)kvb->data + (size_t)(h * (nope + V) * Rc) * es;
        for (int64_t i = 0; i < nope; i++) /* key row i of head h -> column i of w_uk[h] */
            for (int64_t r = 0; r < Rc; r++)
                memcpy(uk + (size_t)((h * Rc + r) * nope + i) * es, keys + (size_t)(i * Rc + r) * es, es);
        memcpy(uv + (size_t)(h * V * Rc) * es, keys + (size_t)(nope * Rc) * es, (size_t)(V * Rc) * es);
    }
    w->w_uk = (struct moe_tensor){.dtype = kvb->dtype, .ndim = 3, .shape = {H, Rc, nope}, .data = uk,
                                  .device = -1};
    w->w_uv = (struct moe_tensor){.dtype = kvb->dtype, .ndim = 3, .shape = {H, V, Rc}, .data = uv,
                                  .device = -1};
    return MOE_OK;
}

/* t's rows (H heads of Di rows, each row `cols` values; a vector: one
 * value a row) copied into owned memory with each head's first R rows
 * reordered: row 2i to i, row 2i + 1 to R/2 + i.  The rows as bound are read
 * no more: freed when the model owns them (converted at load), else their
 * mapped pages dropped. */
static enum moe_status halves(struct moe_model *m, struct moe_tensor *t, int64_t H, int64_t Di, int64_t R,
                              const char *name)
{
    const size_t row = moe_dtype_row_bytes(t->dtype, (size_t)(t->ndim == 2 ? t->shape[1] : 1));
    if (t->cols || row == 0)
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: %s cannot be reordered in dtype %s (the indexer's "
                        "interleaved rotation)", name, moe_dtype_name(t->dtype));
    char *dst;
    const size_t bytes = row * (size_t)(H * Di);
    MOE_TRY(moe_model_own(m, bytes, (void **)&dst));
    const char *src = t->data;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < Di; i++) {
            const int64_t to = i >= R ? i : i % 2 ? R / 2 + i / 2 : i / 2;
            memcpy(dst + (size_t)(h * Di + to) * row, src + (size_t)(h * Di + i) * row, row);
        }
    t->data = dst;
    for (size_t i = 0; i < m->n_owned; i++)
        if (m->owned[i] == src) {
            moe_model_disown(m, (void *)src);
            return MOE_OK;
        }
    moe_safetensors_release(&m->st, src, bytes, true);
    return MOE_OK;
}

/* The indexer of layer l (config.h): its projections as stored (reordered
 * when the rotation interleaves), its LayerNorm widened to F32 */
static enum moe_status bind_indexer(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    const int64_t D = c->d_model, Hi = c->dsa_heads, Di = c->dsa_dim;
    char n[MOE_NAME_MAX];
    NAMEF(n, "model.layers.%d.self_attn.indexer.wq_b.weight", l);
    MOE_TRY(moe_model_bind_linear(m, &w->ix_wq, true, false, n, 2, Hi * Di, c->q_lora_rank, 0));
    NAMEF(n, "model.layers.%d.self_attn.indexer.wk.weight", l);
    MOE_TRY(moe_model_bind_linear(m, &w->ix_wk, true, false, n, 2, Di, D, 0));
    NAMEF(n, "model.layers.%d.self_attn.indexer.weights_proj.weight", l);
    MOE_TRY(moe_model_bind_linear(m, &w->ix_wproj, true, false, n, 2, Hi, D, 0));
    NAMEF(n, "model.layers.%d.self_attn.indexer.k_norm.weight", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->ix_norm_w, true, n, 1, Di, 0, 0));
    if (w->ix_norm_w.dtype != MOE_DTYPE_F32) MOE_TRY(moe_model_widen_f32(m, &w->ix_norm_w));
    NAMEF(n, "model.layers.%d.self_attn.indexer.k_norm.bias", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->ix_norm_b, true, n, 1, Di, 0, 0));
    if (w->ix_norm_b.dtype != MOE_DTYPE_F32) MOE_TRY(moe_model_widen_f32(m, &w->ix_norm_b));
    if (!c->dsa_rope_interleave || m->weights_deferred) return MOE_OK; /* random values need no order */
    const int64_t R = c->rope_dim;
    NAMEF(n, "model.layers.%d.self_attn.indexer", l);
    MOE_TRY(halves(m, &w->ix_wq, Hi, Di, R, n));
    MOE_TRY(halves(m, &w->ix_wk, 1, Di, R, n));
    MOE_TRY(halves(m, &w->ix_norm_w, 1, Di, R, n));
    return halves(m, &w->ix_norm_b, 1, Di, R, n);
}

enum moe_status moe_model_bind_mla(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    const int64_t D = c->d_model, H = c->n_heads, Rc = c->kv_lora_rank, Rq = c->q_lora_rank,
                  R = c->rope_dim, QK = c->qk_nope_dim + c->rope_dim, V = c->v_head_dim;
    char n[MOE_NAME_MAX];
    NAMEF(n, "model.layers.%d.input_layernorm.weight", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->attn_norm, true, n, 1, D, 0, 0));
    NAMEF(n, "model.layers.%d.post_attention_layernorm.weight", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->ffn_norm, true, n, 1, D, 0, 0));
    if (Rq > 0) {
        NAMEF(n, "model.layers.%d.self_attn.q_a_proj.weight", l);
        MOE_TRY(moe_model_bind_linear(m, &w->wq_a, true, false, n, 2, Rq, D, 0));
        NAMEF(n, "model.layers.%d.self_attn.q_a_layernorm.weight", l);
        MOE_TRY(moe_model_bind_tensor(m, &w->q_a_norm, true, n, 1, Rq, 0, 0));
        NAMEF(n, "model.layers.%d.self_attn.q_b_proj.weight", l);
        MOE_TRY(moe_model_bind_linear(m, &w->wq, true, false, n, 2, H * QK, Rq, 0));
    } else {
        NAMEF(n, "model.layers.%d.self_attn.q_proj.weight", l);
        MOE_TRY(moe_model_bind_linear(m, &w->wq, true, false, n, 2, H * QK, D, 0));
    }
    NAMEF(n, "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l);
    MOE_TRY(moe_model_bind_linear(m, &w->wkv_a, true, false, n, 2, Rc + R, D, 0));
    NAMEF(n, "model.layers.%d.self_attn.kv_a_layernorm.weight", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->kv_a_norm, true, n, 1, Rc, 0, 0));
    NAMEF(n, "model.layers.%d.self_attn.o_proj.weight", l);
    MOE_TRY(moe_model_bind_linear(m, &w->wo, true, false, n, 2, D, H * V, 0));
    /* a layer past the L (a multi-token-prediction module) has its own indexer */
    if (c->dsa_topk > 0 && (l >= c->n_layers || !c->layer_dsa_shared[l])) MOE_TRY(bind_indexer(m, l, w));
    struct moe_tensor kvb;
    NAMEF(n, "model.layers.%d.self_attn.kv_b_proj.weight", l);
    const struct moe_st_tensor *src = moe_safetensors_find(&m->st, n);
    /* FP8: dequantized to F32 (an exact copy, split below, then freed) */
    MOE_TRY(moe_model_bind_linear(m, &kvb, true, true, n, 2, H * (c->qk_nope_dim + V), Rc, 0));
    MOE_TRY(split_kv_b(m, &kvb, w));
    if (src->dtype == MOE_DTYPE_F8E4M3)
        moe_model_disown(m, kvb.data);
    else
        moe_safetensors_release(&m->st, kvb.data,
                                (size_t)(H * (c->qk_nope_dim + V) * Rc) * moe_dtype_size(kvb.dtype), true);
    return MOE_OK;
}
