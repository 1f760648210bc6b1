/* model_mtp.c - a checkpoint's multi-token-prediction module as a model of
 * one layer (see moe_model_mtp_view in model.h).
 *
 * DeepSeek-V3 (num_nextn_predict_layers) and GLM-4.5 ship module i as
 * layer L + i of the checkpoint: a decoder layer like the others plus
 *   embed_tokens (V, D)   a copy of the model's embedding
 *   enorm, hnorm (D)      RMSNorm of the token's embedding and of the hidden state
 *   eh_proj (D, 2D)       the row's input from [enorm(e); hnorm(h)]
 *   shared_head.norm (D), shared_head.head (V, D)
 * (DeepSeek-V3 technical report, section 2.2; the tensor names as the
 * released checkpoints and vLLM's deepseek_mtp.py read them). */
#include <stdlib.h>
#include <string.h>

#include "runtime/model/model_impl.h"

#define NAMEF(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

static enum moe_status bind_module(struct moe_model *src, int l, struct moe_model *out)
{
    const struct moe_config *c = &src->cfg;
    const int64_t D = c->d_model, V = c->vocab;
    char n[MOE_NAME_MAX];
    NAMEF(n, "model.layers.%d.eh_proj.weight", l);
    if (!moe_safetensors_find(&src->st, n))
        return moe_fail(MOE_ERR_FORMAT, "%s is not in the checkpoint: its multi-token-prediction "
                        "weights were left out", n);
    MOE_TRY(moe_model_bind_linear(src, &out->mtp_eh_proj, true, false, n, 2, D, 2 * D, 0));
    NAMEF(n, "model.layers.%d.enorm.weight", l);
    MOE_TRY(moe_model_bind_tensor(src, &out->mtp_enorm, true, n, 1, D, 0, 0));
    NAMEF(n, "model.layers.%d.hnorm.weight", l);
    MOE_TRY(moe_model_bind_tensor(src, &out->mtp_hnorm, true, n, 1, D, 0, 0));
    NAMEF(n, "model.layers.%d.shared_head.norm.weight", l);
    MOE_TRY(moe_model_bind_tensor(src, &out->final_norm, true, n, 1, D, 0, 0));
    NAMEF(n, "model.layers.%d.shared_head.head.weight", l);
    MOE_TRY(moe_model_bind_tensor(src, &out->lm_head, false, n, 2, V, D, 0));
    if (!out->lm_head.data) out->lm_head = moe_model_whole_vocab(src, &src->lm_head);
    NAMEF(n, "model.layers.%d.embed_tokens.weight", l);
    MOE_TRY(moe_model_bind_tensor(src, &out->embed, false, n, 2, V, D, 0));
    if (!out->embed.data) out->embed = moe_model_whole_vocab(src, &src->embed);
    return moe_model_bind_layer(src, l, out->cfg.layer_moe[0], &out->layers[0]);
}

enum moe_status moe_model_mtp_view(const struct moe_model *m, int i, struct moe_model *out)
{
    memset(out, 0, sizeof *out);
    const struct moe_config *c = &m->cfg;
    if (c->n_mtp_layers <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "the model declares no multi-token-prediction layers "
                        "(num_nextn_predict_layers)");
    if (i < 0 || i >= c->n_mtp_layers)
        return moe_fail(MOE_ERR_INVALID_ARG, "multi-token-prediction layer %d of %d", i, c->n_mtp_layers);
    if (m->weights_deferred || !m->st.n_tensors)
        return moe_fail(MOE_ERR_INVALID_ARG, "multi-token-prediction layers need a checkpoint's weights");
    /* all of its heads under tensor parallelism: the module runs whole */
    struct moe_config whole;
    moe_model_whole_config(m, &whole);
    out->cfg = whole;
    out->cfg.n_layers = 1;
    out->cfg.n_mtp_layers = 0;
    out->cfg.layer_moe[0] = c->n_experts > 0;
    out->cfg.layer_sliding[0] = false;
    out->layers = calloc(1, sizeof *out->layers);
    if (!out->layers) return moe_fail(MOE_ERR_NOMEM, "multi-token-prediction layer");
    /* the binders read m's files and record what they convert in the
     * model they are given: a copy of m whose list of owned memory is
     * out's */
    struct moe_model src = *m;
    src.owned = NULL;
    src.n_owned = 0;
    src.ep_held = NULL; /* the module runs in one process with all its experts (moe_model_mtp_view) */
    src.cfg = whole; /* the binders take the file's shapes from it */
    src.tp = src.tp_rank = 0;
    enum moe_status s = bind_module(&src, c->n_layers + i, out);
    out->owned = src.owned;
    out->n_owned = src.n_owned;
    if (s != MOE_OK) moe_model_free(out);
    return s;
}
