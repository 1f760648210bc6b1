/* model_llama4.c - Llama-4's text weights (Llama4ForCausalLM, transformers 5).
 *
 *   self_attn.{q,k,v,o}_proj (+ .bias with attention_bias): as Llama's,
 *     but each head's rope values in interleaved pairs (2i, 2i+1)
 *     (transformers rotates them as complex numbers): q_proj's and
 *     k_proj's rows are reordered at load, per head, to the rotate-half
 *     order the forward pass uses (pair i's values to rows i and Dh/2 + i),
 *     in memory the model owns; the layers without RoPE keep theirs
 *   feed_forward.{gate,up,down}_proj              dense layers (width
 *                                                  intermediate_size_mlp)
 *   feed_forward.router.weight (E, D)
 *   feed_forward.experts.gate_up_proj (E, D, 2F)  gate outputs, then up
 *   feed_forward.experts.down_proj (E, F, D)      both transposed at load
 *   feed_forward.shared_expert.{gate,up,down}_proj */
#include <string.h>

#include "runtime/model/model_impl.h"

#define NAMEF(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

enum moe_status moe_model_bind_llama4_moe(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    const int64_t D = c->d_model, E = c->n_experts, S = c->d_shared;
    char n[MOE_NAME_MAX], d[MOE_NAME_MAX];
    NAMEF(n, "model.layers.%d.feed_forward.router.weight", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->router, true, n, 2, E, D, 0));
    NAMEF(n, "model.layers.%d.feed_forward.experts.gate_up_proj", l);
    NAMEF(d, "model.layers.%d.feed_forward.experts.down_proj", l);
    MOE_TRY(moe_model_bind_experts_transposed(m, l, n, d, false, &w->experts));
    NAMEF(n, "model.layers.%d.feed_forward.shared_expert.gate_proj.weight", l);
    MOE_TRY(moe_model_bind_linear(m, &w->sh_gate, true, false, n, 2, S, D, 0));
    NAMEF(n, "model.layers.%d.feed_forward.shared_expert.up_proj.weight", l);
    MOE_TRY(moe_model_bind_linear(m, &w->sh_up, true, false, n, 2, S, D, 0));
    NAMEF(n, "model.layers.%d.feed_forward.shared_expert.down_proj.weight", l);
    return moe_model_bind_linear(m, &w->sh_down, true, false, n, 2, D, S, 0);
}

/* t's rows (H heads of Dh rows, each row `cols` values; a bias: one value)
 * copied into owned memory with each head's rows reordered: row 2i to i,
 * row 2i + 1 to Dh/2 + i. */
static enum moe_status halves(struct moe_model *m, struct moe_tensor *t, int H, int Dh)
{
    if (!t->data) return MOE_OK;
    const size_t row = moe_dtype_row_bytes(t->dtype, (size_t)(t->ndim == 2 ? t->shape[1] : 1));
    size_t bytes;
    if (!moe_mul_size(row, (size_t)H * (size_t)Dh, &bytes))
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: attention rows of %zu bytes overflow", row);
    char *dst;
    MOE_TRY(moe_model_own(m, bytes, (void **)&dst));
    const char *src = t->data;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < Dh; i++) {
            const int to = i % 2 ? Dh / 2 + i / 2 : i / 2;
            memcpy(dst + ((size_t)h * Dh + (size_t)to) * row, src + ((size_t)h * Dh + (size_t)i) * row, row);
        }
    t->data = dst;
    return MOE_OK;
}

enum moe_status moe_model_llama4_rope_rows(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    if (c->layer_nope[l] || m->weights_deferred) return MOE_OK; /* random values need no order */
    if (w->wq.cols || w->wk.cols || w->wq.dtype != w->wk.dtype || moe_dtype_row_bytes(w->wq.dtype, 2) == 0)
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: layer %d's q_proj / k_proj cannot be reordered in "
                        "dtype %s", l, moe_dtype_name(w->wq.dtype));
    MOE_TRY(halves(m, &w->wq, c->n_heads, c->head_dim));
    MOE_TRY(halves(m, &w->wk, c->n_kv_heads, c->head_dim));
    MOE_TRY(halves(m, &w->bq, c->n_heads, c->head_dim));
    return halves(m, &w->bk, c->n_kv_heads, c->head_dim);
}

enum moe_status moe_model_llama4_ones(struct moe_model *m)
{
    const int Dh = m->cfg.head_dim;
    float *one;
    MOE_TRY(moe_model_own(m, (size_t)Dh * sizeof(float), (void **)&one));
    for (int i = 0; i < Dh; i++) one[i] = 1.0f;
    m->qk_ones = (struct moe_tensor){.dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {Dh}, .data = one, .device = -1};
    return MOE_OK;
}
