/* model_qwen3next.c - Qwen3-Next's and Qwen3.5-MoE's weights: the Gated
 * DeltaNet of their linear-attention layers (linear_attn.*) and their
 * zero-centred RMSNorms.
 *
 *   Qwen3-Next: in_proj_qkvz (2 Hk Dk + 2 Hv Dv, D), in_proj_ba (2 Hv, D):
 *     grouped by q/k head as transformers' fix_query_key_value_ordering
 *     reads them (the forward pass gathers the columns of their products)
 *   Qwen3.5-MoE: in_proj_qkv (C, D), in_proj_z (Hv Dv, D), in_proj_b and
 *     in_proj_a (Hv, D)
 *   conv1d.weight (C, 1, conv), A_log (Hv), dt_bias (Hv): widened to F32
 *   norm.weight (Dv), out_proj (D, Hv Dv) */
#include "runtime/model/model_impl.h"

#include <stdio.h>

#define NAMEF(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

static enum moe_status widen(struct moe_model *m, struct moe_tensor *t)
{
    return t->dtype == MOE_DTYPE_F32 ? MOE_OK : moe_model_widen_f32(m, t);
}

enum moe_status moe_model_bind_linear_attn(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    char n[MOE_NAME_MAX];
    const int64_t D = c->d_model, Hv = c->lin_v_heads, Kd = (int64_t)c->lin_k_heads * c->lin_k_dim,
                  Vd = Hv * c->lin_v_dim, C = 2 * Kd + Vd;
    if (c->family == MOE_FAMILY_QWEN3_5_MOE) {
        NAMEF(n, "model.layers.%d.linear_attn.in_proj_qkv.weight", l);
        MOE_TRY(moe_model_bind_linear(m, &w->lin_qkv, true, false, n, 2, C, D, 0));
        NAMEF(n, "model.layers.%d.linear_attn.in_proj_z.weight", l);
        MOE_TRY(moe_model_bind_linear(m, &w->lin_z, true, false, n, 2, Vd, D, 0));
        NAMEF(n, "model.layers.%d.linear_attn.in_proj_b.weight", l);
        MOE_TRY(moe_model_bind_tensor(m, &w->lin_b, true, n, 2, Hv, D, 0));
        NAMEF(n, "model.layers.%d.linear_attn.in_proj_a.weight", l);
        MOE_TRY(moe_model_bind_tensor(m, &w->lin_a, true, n, 2, Hv, D, 0));
    } else {
        NAMEF(n, "model.layers.%d.linear_attn.in_proj_qkvz.weight", l);
        MOE_TRY(moe_model_bind_linear(m, &w->lin_in, true, false, n, 2, 2 * Kd + 2 * Vd, D, 0));
        NAMEF(n, "model.layers.%d.linear_attn.in_proj_ba.weight", l);
        MOE_TRY(moe_model_bind_tensor(m, &w->lin_ba, true, n, 2, 2 * Hv, D, 0));
    }
    NAMEF(n, "model.layers.%d.linear_attn.out_proj.weight", l);
    MOE_TRY(moe_model_bind_linear(m, &w->lin_out, true, false, n, 2, D, Vd, 0));
    NAMEF(n, "model.layers.%d.linear_attn.conv1d.weight", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->lin_conv, true, n, 3, C, 1, c->lin_conv));
    MOE_TRY(widen(m, &w->lin_conv));
    w->lin_conv.ndim = 2;
    w->lin_conv.shape[1] = c->lin_conv;
    w->lin_conv.shape[2] = 0;
    NAMEF(n, "model.layers.%d.linear_attn.A_log", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->lin_a_log, true, n, 1, Hv, 0, 0));
    MOE_TRY(widen(m, &w->lin_a_log));
    NAMEF(n, "model.layers.%d.linear_attn.dt_bias", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->lin_dt_bias, true, n, 1, Hv, 0, 0));
    MOE_TRY(widen(m, &w->lin_dt_bias));
    NAMEF(n, "model.layers.%d.linear_attn.norm.weight", l);
    return moe_model_bind_tensor(m, &w->lin_norm, true, n, 1, c->lin_v_dim, 0, 0);
}

/* t = 1 + t, in an F32 copy the model owns (transformers: 1.0 + weight.float()) */
static enum moe_status plus_one(struct moe_model *m, struct moe_tensor *t)
{
    if (!t->data) return MOE_OK;
    const void *src = t->data;
    MOE_TRY(moe_model_widen_f32(m, t));
    MOE_ASSERT(t->data != src);
    float *x = t->data;
    for (int64_t i = 0; i < moe_tensor_numel(t); i++) x[i] += 1.0f;
    return MOE_OK;
}

enum moe_status moe_model_norms_plus_one(struct moe_model *m)
{
    MOE_TRY(plus_one(m, &m->final_norm));
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct moe_layer_weights *w = &m->layers[l];
        MOE_TRY(plus_one(m, &w->attn_norm));
        MOE_TRY(plus_one(m, &w->ffn_norm));
        MOE_TRY(plus_one(m, &w->q_norm));
        MOE_TRY(plus_one(m, &w->k_norm));
    }
    return MOE_OK;
}
