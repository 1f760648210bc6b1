/* plan_quant.c - what `moerun plan --quantize` predicts: each part's bytes
 * at the formats the CPU backend's prepare_model makes
 * (runtime/backend/backend_cpu_pack.c). */
#include "runtime/cli/plan_quant.h"

bool moe_plan_q4_k_rows(int64_t a, int64_t b) { return moe_q4_quant_expert_dtype(a, b) == MOE_DTYPE_Q4_K; }

/* Bytes of `params` weights at q's base format (q4, q4_k_m, q5_k, q5_k_m):
 * where the rows are multiples of 256 (k) Q4_K, 144 bytes per 256, or
 * Q5_K, 176; else Q4_1, 20 per 32. */
static int64_t base_bytes(enum moe_weight_quant q, bool k, int64_t params)
{
    return !k ? params * 5 / 8 : moe_quant_q5(q) ? params * 11 / 16 : params * 9 / 16;
}

/* Bytes of `params` weights at dtype `to` (Q6_K or Q8_0) less at q's base
 * format (k: base_bytes's). */
static int64_t k_m_more(enum moe_weight_quant q, enum moe_dtype to, bool k, int64_t params)
{
    return (to == MOE_DTYPE_Q6_K ? params * 105 / 128 : params * 9 / 8) - base_bytes(q, k, params);
}

/* q4_k_m's and q5_k_m's matrices beyond their base (moe_quant_q4_k_m_dtype):
 * attention K and V of the layers with plain attention, the down
 * projections of every layer; k and as_stored: quant_sizes's, by part. */
static void k_m_sizes(enum moe_weight_quant q, const struct moe_config *cfg, const bool *k, const bool *as_stored,
                      struct moe_model_sizes *z)
{
    const int L = cfg->n_layers, E = cfg->n_experts;
    const int64_t D = cfg->d_model, kv = (int64_t)cfg->n_kv_heads * cfg->head_dim * D;
    int n_v = 0, i_v = 0;
    for (int l = 0; l < L; l++) n_v += !cfg->layer_linear[l] && cfg->kv_lora_rank == 0;
    for (int l = 0; l < L; l++) {
        if (!cfg->layer_linear[l] && cfg->kv_lora_rank == 0 && !as_stored[1]) {
            const enum moe_dtype v = moe_quant_q4_k_m_dtype(MOE_Q4KM_V, i_v, n_v, E, D),
                                 kk = moe_quant_q4_k_m_dtype(MOE_Q4KM_K, i_v, n_v, E, D);
            if (v != MOE_DTYPE_N) z->bytes_attn += k_m_more(q, v, k[1], kv);
            if (kk != MOE_DTYPE_N) z->bytes_attn += k_m_more(q, kk, k[1], kv);
            i_v++;
        }
        const int widths[] = {cfg->d_ff, cfg->d_expert, cfg->d_shared};
        int64_t *parts[] = {&z->bytes_dense_ffn, &z->bytes_experts, &z->bytes_shared};
        for (int i = cfg->layer_moe[l] ? 1 : 0; i < (cfg->layer_moe[l] ? 3 : 1); i++) {
            const enum moe_dtype to = moe_quant_q4_k_m_dtype(MOE_Q4KM_DOWN, l, L, E, widths[i]);
            if (widths[i] > 0 && to != MOE_DTYPE_N && !as_stored[2 + i])
                *parts[i] += k_m_more(q, to, k[2 + i], D * widths[i] * (i == 1 ? E : 1));
        }
    }
}

void moe_plan_quant_sizes(const struct moe_config *cfg, enum moe_weight_quant q, struct moe_model_sizes *z)
{
    struct moe_config plain = *cfg;
    plain.weights_fp8 = plain.experts_mxfp4 = false;
    plain.q4_method = MOE_Q4_NONE;
    struct moe_model_sizes p;
    moe_config_sizes(&plain, 1, &p); /* parameters per part */
    int64_t *parts[] = {&z->bytes_lm_head, &z->bytes_attn, &z->bytes_dense_ffn, &z->bytes_experts, &z->bytes_shared};
    const int64_t params[] = {cfg->tie_embeddings ? p.bytes_embed : p.bytes_lm_head, p.bytes_attn,
                              p.bytes_dense_ffn, p.bytes_experts, p.bytes_shared};
    const bool st = cfg->weights_fp8 || cfg->q4_method != MOE_Q4_NONE;
    const bool as_stored[] = {false, st, st, st || cfg->experts_mxfp4, st};
    /* Q8_0: 36 bytes per 32 weights; the base formats: base_bytes (the LM head at Q8_0) */
    const int64_t D = cfg->d_model;
    const bool k[] = {false, moe_plan_q4_k_rows(D, (int64_t)cfg->n_heads * cfg->head_dim), moe_plan_q4_k_rows(D, cfg->d_ff),
                      moe_plan_q4_k_rows(D, cfg->d_expert), moe_plan_q4_k_rows(D, cfg->d_shared)};
    const bool q4 = q == MOE_QUANT_Q4 || q == MOE_QUANT_Q4_K_M || moe_quant_q5(q);
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (!as_stored[i])
            *parts[i] = q4 && i > 0 ? base_bytes(q, k[i], params[i]) : params[i] * 9 / 8;
    if (moe_quant_k_m(q)) {
        if (!as_stored[0] && moe_quant_q4_k_m_dtype(MOE_Q4KM_LM_HEAD, 0, 1, cfg->n_experts, D) == MOE_DTYPE_Q6_K)
            z->bytes_lm_head = params[0] * 105 / 128;
        k_m_sizes(q, cfg, k, as_stored, z);
    }
    z->bytes_total = z->bytes_embed + z->bytes_lm_head + z->bytes_attn + z->bytes_dense_ffn + z->bytes_experts +
                     z->bytes_shared + z->bytes_router + z->bytes_norm;
}
