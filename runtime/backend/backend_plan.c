/* backend_plan.c - per-expert precision plans (moe_backend.expert_quant,
 * --expert-dtype-plan) as every backend's prepare_model reads them.  Calls
 * no other file of the room. */
#include "runtime/backend/backend.h"
#include "runtime/model/model.h"

enum moe_dtype moe_quant_q4_k_m_dtype(enum moe_q4_k_m_part part, int l, int n, int n_experts, int64_t K)
{
    const bool more = l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
    enum moe_dtype dt = MOE_DTYPE_N;
    if (part == MOE_Q4KM_LM_HEAD || (more && (part == MOE_Q4KM_DOWN || part == MOE_Q4KM_V)))
        dt = MOE_DTYPE_Q6_K;
    if (n_experts == 8 && (part == MOE_Q4KM_V || part == MOE_Q4KM_K)) dt = MOE_DTYPE_Q8_0;
    return dt == MOE_DTYPE_Q6_K && K % MOE_Q6_K_BLOCK ? MOE_DTYPE_Q8_0 : dt;
}

enum moe_dtype moe_quant_q4_k_m_tensor(const struct moe_model *m, int l, const struct moe_tensor *t)
{
    const struct moe_config *c = &m->cfg;
    if (t->ndim != 2) return MOE_DTYPE_N;
    if (t == &m->lm_head) return moe_quant_q4_k_m_dtype(MOE_Q4KM_LM_HEAD, 0, 1, c->n_experts, t->shape[1]);
    if (l < 0 || l >= c->n_layers) return MOE_DTYPE_N;
    const struct moe_layer_weights *w = &m->layers[l];
    if (t == &w->w_down || t == &w->sh_down)
        return moe_quant_q4_k_m_dtype(MOE_Q4KM_DOWN, l, c->n_layers, c->n_experts, t->shape[1]);
    if (t != &w->wv && t != &w->wk) return MOE_DTYPE_N;
    int n_v = 0, i_v = 0; /* attention's V and K: counted over the layers with V */
    for (int i = 0; i < c->n_layers; i++) {
        i_v += i < l && m->layers[i].wv.data != NULL;
        n_v += m->layers[i].wv.data != NULL;
    }
    return moe_quant_q4_k_m_dtype(t == &w->wv ? MOE_Q4KM_V : MOE_Q4KM_K, i_v, n_v, c->n_experts, t->shape[1]);
}

enum moe_weight_quant moe_backend_expert_quant(const struct moe_backend *be, int l, int e)
{
    const uint8_t p = be->expert_quant && l >= 0 && e >= 0 && l < be->expert_quant_layers && e < be->expert_quant_e
                          ? be->expert_quant[(size_t)l * be->expert_quant_e + e]
                          : MOE_EXPERT_QUANT_DEFAULT;
    return p == MOE_EXPERT_QUANT_DEFAULT ? be->quant : (enum moe_weight_quant)p;
}

enum moe_status moe_backend_check_expert_plan(const struct moe_backend *be, const struct moe_model *m)
{
    const struct moe_config *cfg = &m->cfg;
    if (be->expert_quant && moe_quant_q5(be->quant))
        return moe_fail(MOE_ERR_UNSUPPORTED, "per-expert precision plan: not with --quantize q5_k or q5_k_m "
                        "(a plan names q8_0, q4 or stored; use --quantize q4 or q8_0)");
    for (int l = 0; l < be->expert_quant_layers && be->expert_quant; l++)
        for (int e = 0; e < be->expert_quant_e; e++) {
            const uint8_t q = be->expert_quant[(size_t)l * be->expert_quant_e + e];
            if (q == MOE_EXPERT_QUANT_DEFAULT) continue;
            if (q != MOE_QUANT_NONE && q != MOE_QUANT_Q8_0 && q != MOE_QUANT_Q4)
                return moe_fail(MOE_ERR_INVALID_ARG, "per-expert precision plan: expert %d of layer %d has the "
                                "unknown format %u", e, l, q);
            if (l >= cfg->n_layers || e >= cfg->n_experts)
                return moe_fail(MOE_ERR_INVALID_ARG, "per-expert precision plan: expert %d of layer %d does not "
                                "exist (the model has %d layers of %d experts)", e, l, cfg->n_layers,
                                cfg->n_experts);
            if (!cfg->layer_moe[l] || !m->layers[l].experts.gate)
                return moe_fail(MOE_ERR_INVALID_ARG, "per-expert precision plan: layer %d has no experts (a "
                                "dense layer)", l);
        }
    return MOE_OK;
}
