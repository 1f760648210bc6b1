/* forward_mla.c - DeepSeek's multi-head latent attention in its absorbed
 * form (the forward pass's attention block for models with kv_lora_rank > 0;
 * the configuration: runtime/model/config.h, the weights: runtime/model/model_deepseek.c).
 *
 * transformers expands the cached latent c (Rc) of every key into per-head
 * keys [W_uk[h] c, k_rope] and values W_uv[h] c.  Since
 *   q[h] . [W_uk[h] c, k_rope] = [W_uk[h]^T q_nope[h], q_rope[h]] . [c, k_rope]
 * the query is absorbed instead, and every head attends over the same rows
 * [k_rope, c] (rope + Rc values), once per token and layer in the cache,
 * read as both key and value; the value part of head h's output, a mix of
 * latents, becomes W_uv[h] o[h].  So the attention op runs as multi-query
 * attention with Hkv = 1 and Dh = rope + Rc:
 *
 *   q  = W_q xn  or  W_qb rmsnorm(W_qa xn)       (T, H, nope + rope)
 *   kv = W_kva xn                                (T, Rc + rope)
 *   k row    = [rope(k_rope), rmsnorm(c)]        (T, rope + Rc)  -> cache
 *   q' row h = [rope(q_rope[h]), W_uk[h]^T q_nope[h]]            (T, H, rope + Rc)
 *   o'[h]    = attention(q'[h], rows)            (T, H, rope + Rc)
 *   o[h]     = W_uv[h] o'[h][rope:]              (T, H, v)
 *   out      = W_o o
 *
 * Rope values stored in interleaved pairs (rope_interleave) are read in the
 * rotate-half order through the index tables q_rope and k_rope, the same
 * permutation for query and key, so every score is transformers'.
 *
 * DeepSeek sparse attention (dsa_topk > 0): a layer's indexer chooses each
 * row's keys (a->keys) before it attends; a GLM-MoE-DSA "shared" layer
 * (layer_dsa_shared) runs none and attends to the keys in a->keys, those
 * the last full layer before it chose for the same rows in this step (the
 * layers run in order, and layer 0 is full). */
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/forward.h"

#define WALLOC(ptr, n, type) MOE_FORWARD_ALLOC(be, ptr, n, type)

/* The rope columns of a block of R values starting at `first`, in
 * rotate-half order: evens then odds when interleaved. */
static void rope_columns(int32_t *idx, int first, int R, bool interleave)
{
    for (int j = 0; j < R; j++)
        idx[j] = first + (interleave ? (j < R / 2 ? 2 * j : 2 * (j - R / 2) + 1) : j);
}

enum moe_status moe_forward_mla_init(struct moe_forward *fw)
{
    struct moe_backend *be = fw->be;
    const struct moe_config *c = &fw->m->cfg;
    struct moe_forward_mla *a = &fw->mla;
    if (c->kv_lora_rank <= 0) return MOE_OK;
    if (!be->ops->head_matmul || !be->ops->gather_cols)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: multi-head latent attention (%s) is not "
                        "supported yet; use a CPU backend", be->ops->name, c->architecture);
    const size_t T = (size_t)fw->lim.max_tokens, H = (size_t)c->n_heads, R = (size_t)c->rope_dim;
    WALLOC(a->qa, T * (size_t)(c->q_lora_rank > 0 ? c->q_lora_rank : 1), float);
    WALLOC(a->qr, T * H * ((size_t)c->qk_nope_dim + R), float);
    WALLOC(a->kva, T * ((size_t)c->kv_lora_rank + R), float);
    WALLOC(a->c, T * (size_t)c->kv_lora_rank, float);
    WALLOC(a->o, T * H * (size_t)c->v_head_dim, float);
    WALLOC(a->q_rope, R, int32_t);
    WALLOC(a->k_rope, R, int32_t);
    if (c->dsa_topk > 0) {
        if (!be->ops->dsa_select)
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: DeepSeek sparse attention (%s's indexer) is not "
                            "supported yet; use a CPU backend", be->ops->name, c->architecture);
        WALLOC(a->iq, T * (size_t)c->dsa_heads * c->dsa_dim, float);
        WALLOC(a->ik, T * (size_t)c->dsa_dim, float);
        WALLOC(a->iw, T * (size_t)c->dsa_heads, float);
        WALLOC(a->keys, T * (size_t)c->dsa_topk, int32_t);
    }
    int32_t *idx = malloc(2 * R * sizeof *idx);
    if (!idx) return moe_fail(MOE_ERR_NOMEM, "forward: rope columns");
    rope_columns(idx, c->qk_nope_dim, (int)R, c->rope_interleave);
    rope_columns(idx + R, c->kv_lora_rank, (int)R, c->rope_interleave);
    enum moe_status s = be->ops->to_device(be, a->q_rope, idx, R * sizeof *idx);
    if (s == MOE_OK) s = be->ops->to_device(be, a->k_rope, idx + R, R * sizeof *idx);
    free(idx);
    return s;
}

void moe_forward_mla_free(struct moe_forward *fw)
{
    struct moe_forward_mla *a = &fw->mla;
    void *bufs[] = {a->qa, a->qr, a->kva, a->c, a->o, a->q_rope, a->k_rope, a->iq, a->ik, a->iw, a->keys};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) fw->be->ops->dealloc(fw->be, bufs[i]);
    memset(a, 0, sizeof *a);
}

/* The attention block from the normed input fw->xn to fw->out (before the
 * residual add); p carries the layer, scale and window (Hq, 1, rope + Rc). */
enum moe_status moe_forward_mla_attention(struct moe_forward *fw, struct moe_kvcache *kv,
                                          const struct moe_batch *db, int l,
                                          const struct moe_attn_params *p)
{
    struct moe_backend *be = fw->be;
    const struct moe_backend_ops *op = be->ops;
    const struct moe_config *c = &fw->m->cfg;
    const struct moe_layer_weights *w = &fw->m->layers[l];
    const struct moe_forward_mla *a = &fw->mla;
    const int T = db->n_tokens, H = c->n_heads, R = c->rope_dim, Rc = c->kv_lora_rank,
              QK = c->qk_nope_dim + R, Dh = c->head_dim; /* R + Rc */
    if (c->q_lora_rank > 0) {
        MOE_TRY(moe_forward_linear(fw, a->qa, fw->xn, &w->wq_a, NULL, T));
        MOE_TRY(op->rmsnorm(be, a->qa, a->qa, &w->q_a_norm, T, c->q_lora_rank, c->rms_eps));
        MOE_TRY(moe_forward_linear(fw, a->qr, a->qa, &w->wq, NULL, T));
    } else {
        MOE_TRY(moe_forward_linear(fw, a->qr, fw->xn, &w->wq, NULL, T));
    }
    /* the cache row [rope(k_rope), rmsnorm(c)] in fw->k */
    MOE_TRY(moe_forward_linear(fw, a->kva, fw->xn, &w->wkv_a, NULL, T));
    MOE_TRY(op->gather_cols(be, fw->k, Dh, a->kva, Rc + R, T, a->k_rope, R));
    MOE_TRY(op->gather_cols(be, a->c, Rc, a->kva, Rc + R, T, NULL, Rc));
    MOE_TRY(op->rmsnorm(be, a->c, a->c, &w->kv_a_norm, T, Rc, c->rms_eps));
    MOE_TRY(op->gather_cols(be, fw->k + R, Dh, a->c, Rc, T, NULL, Rc));
    MOE_TRY(op->rope(be, fw->k, db->positions, T, 1, Dh, R, fw->inv_freq));
    MOE_TRY(op->kv_store(be, kv, p->layer, fw->k, fw->k, db->slot, T)); /* one row: written once */
    /* the absorbed query [rope(q_rope), W_uk^T q_nope] per head in fw->q */
    MOE_TRY(op->gather_cols(be, fw->q, Dh, a->qr, QK, T * H, a->q_rope, R));
    MOE_TRY(op->head_matmul(be, fw->q + R, Dh, a->qr, QK, &w->w_uk, T));
    MOE_TRY(op->rope(be, fw->q, db->positions, T, H, Dh, R, fw->inv_freq));
    if (c->dsa_topk > 0) {
        if (!c->layer_dsa_shared[l]) { /* the indexer chooses each row's keys */
            const int Hi = c->dsa_heads, Di = c->dsa_dim;
            MOE_TRY(moe_forward_linear(fw, a->iq, a->qa, &w->ix_wq, NULL, T));
            MOE_TRY(op->rope(be, a->iq, db->positions, T, Hi, Di, R, fw->inv_freq));
            MOE_TRY(moe_forward_linear(fw, a->ik, fw->xn, &w->ix_wk, NULL, T));
            MOE_TRY(moe_forward_linear(fw, a->iw, fw->xn, &w->ix_wproj, NULL, T));
            MOE_TRY(op->dsa_select(be, a->keys, c->dsa_topk, a->iq, a->ik, a->iw, &w->ix_norm_w, &w->ix_norm_b,
                                   fw->inv_freq, R, kv, moe_config_dsa_layer(c, l), db, Hi, Di));
        }
        struct moe_attn_params ps = *p;
        ps.keys = a->keys;
        ps.n_keys = c->dsa_topk;
        MOE_TRY(op->attention(be, fw->att, fw->q, kv, db, &ps));
    } else {
        MOE_TRY(op->attention(be, fw->att, fw->q, kv, db, p));
    }
    MOE_TRY(op->head_matmul(be, a->o, c->v_head_dim, fw->att + R, Dh, &w->w_uv, T));
    return moe_forward_linear(fw, fw->out, a->o, &w->wo, NULL, T);
}
