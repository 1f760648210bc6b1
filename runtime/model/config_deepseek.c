/* config_deepseek.c - DeepseekV2Config's, DeepseekV3Config's,
 * DeepseekV32Config's and GlmMoeDsaConfig's attention keys (transformers
 * 5.24): multi-head latent attention and DeepSeek sparse attention's
 * indexer.
 *
 *   kv_lora_rank 512, q_lora_rank 1536 (GLM-MoE-DSA 2048; null: q_proj),
 *     qk_nope_head_dim 128 (192), qk_rope_head_dim 64, v_head_dim 128 (256)
 *   index_topk 2048, index_n_heads 64 (32), index_head_dim 128
 *   GLM-MoE-DSA: indexer_types, else index_topk_pattern, else
 *     index_topk_freq and index_skip_topk_offset
 *
 * The routing and the dense layers of these families stay in config.c. */
#include "runtime/model/config_impl.h"

#include <math.h>
#include <string.h>

/* DeepSeek's multi-head latent attention (config.h).  transformers' score
 * scale is 1/sqrt(qk_nope + qk_rope) times yarn's mscale(factor,
 * mscale_all_dim) squared.  GlmMoeDsaConfig's defaults are GLM-5's. */
enum moe_status moe_config_parse_mla(struct moe_config *c, json_t *root, const char *what)
{
    const int BIG = 1 << 20;
    const bool glm = !strcmp(c->architecture, "GlmMoeDsaForCausalLM");
    int rope;
    MOE_TRY(moe_config_get_int(root, what, "kv_lora_rank", 1, BIG, 512, false, &c->kv_lora_rank));
    /* absent: the config classes' 1536 (GLM-MoE-DSA: 2048); null (DeepSeek-V2-Lite): q_proj, no LoRA */
    json_t *qlr = json_object_get(root, "q_lora_rank");
    c->q_lora_rank = 0;
    if (!qlr || !json_is_null(qlr))
        MOE_TRY(moe_config_get_int(root, what, "q_lora_rank", 0, BIG, glm ? 2048 : 1536, false, &c->q_lora_rank));
    MOE_TRY(moe_config_get_int(root, what, "qk_nope_head_dim", 1, BIG, glm ? 192 : 128, false, &c->qk_nope_dim));
    MOE_TRY(moe_config_get_int(root, what, "qk_rope_head_dim", 2, BIG, 64, false, &rope));
    MOE_TRY(moe_config_get_int(root, what, "v_head_dim", 1, BIG, glm ? 256 : 128, false, &c->v_head_dim));
    MOE_TRY(moe_config_get_bool(root, what, "rope_interleave", true, &c->rope_interleave));
    /* always, as complex pairs (V2); GLM-MoE-DSA's attention always interleaves (no such field) */
    if (c->family == MOE_FAMILY_DEEPSEEK_V2 || glm) c->rope_interleave = true;
    if (rope % 2)
        return moe_fail(MOE_ERR_FORMAT, "%s: qk_rope_head_dim = %d must be even", what, rope);
    c->rope_dim = rope;
    c->head_dim = rope + c->kv_lora_rank;
    c->n_kv_heads = 1;
    double scale = 1.0 / sqrt((double)(c->qk_nope_dim + rope));
    if (c->rope_type != MOE_ROPE_DEFAULT && c->rope_mscale_all_dim != 0) {
        const double m = moe_config_yarn_mscale(c->rope_factor, c->rope_mscale_all_dim);
        scale *= m * m;
    }
    c->attn_scale = (float)scale;
    return MOE_OK;
}

/* GLM-MoE-DSA's per-layer indexer modes (config.h, layer_dsa_shared), as
 * GlmMoeDsaConfig derives them: indexer_types (a list of "full" /
 * "shared"); else index_topk_pattern (a string of F / S, or such a list);
 * else layer l is full when max(l - index_skip_topk_offset + 1, 0) is a
 * multiple of index_topk_freq (defaults 2 and 1: every layer full).  Entries
 * past the last layer are not read (as transformers). */
static enum moe_status parse_indexer_types(struct moe_config *c, json_t *root, const char *what)
{
    const char *field = "indexer_types";
    json_t *t = json_object_get(root, field);
    if (t && !json_is_null(t) && !json_is_array(t))
        return moe_fail(MOE_ERR_FORMAT, "%s: indexer_types must be a list of \"full\" / \"shared\"", what);
    if (!t || json_is_null(t)) t = json_object_get(root, field = "index_topk_pattern");
    if (json_is_string(t)) {
        const char *p = json_string_value(t);
        if ((int)strlen(p) < c->n_layers)
            return moe_fail(MOE_ERR_FORMAT, "%s: index_topk_pattern '%s' has fewer than the %d layers", what, p,
                            c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            if (p[l] != 'F' && p[l] != 'S')
                return moe_fail(MOE_ERR_FORMAT, "%s: index_topk_pattern[%d] = '%c' is not F (full) or S (shared)",
                                what, l, p[l]);
            c->layer_dsa_shared[l] = p[l] == 'S';
        }
    } else if (t && !json_is_null(t)) {
        if (!json_is_array(t) || (int)json_array_size(t) < c->n_layers)
            return moe_fail(MOE_ERR_FORMAT, "%s: %s must be a list of at least %d \"full\" / \"shared\"", what,
                            field, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const char *v = json_string_value(json_array_get(t, (size_t)l));
            if (!v || (strcmp(v, "full") && strcmp(v, "shared")))
                return moe_fail(MOE_ERR_FORMAT, "%s: %s[%d] must be \"full\" or \"shared\"", what, field, l);
            c->layer_dsa_shared[l] = !strcmp(v, "shared");
        }
    } else {
        int freq, offset;
        field = "index_topk_freq / index_skip_topk_offset";
        MOE_TRY(moe_config_get_int(root, what, "index_topk_freq", -(1 << 20), 1 << 20, 1, false, &freq));
        MOE_TRY(moe_config_get_int(root, what, "index_skip_topk_offset", -(1 << 20), 1 << 20, 2, false, &offset));
        if (freq < 1) freq = 1;
        for (int l = 0; l < c->n_layers; l++) {
            const int n = l - offset + 1;
            c->layer_dsa_shared[l] = (n > 0 ? n : 0) % freq != 0;
        }
    }
    if (c->layer_dsa_shared[0])
        return moe_fail(MOE_ERR_FORMAT, "%s: layer 0 is \"shared\" (%s), but no full layer before it chose keys "
                        "to share", what, field);
    return MOE_OK;
}

/* DeepSeek sparse attention's indexer (config.h): index_topk 2048,
 * index_n_heads 64 (GLM-MoE-DSA: 32, its rotation interleaved, its layers
 * full or shared), index_head_dim 128, over the q LoRA. */
enum moe_status moe_config_parse_dsa(struct moe_config *c, json_t *root, const char *what)
{
    const bool glm = !strcmp(c->architecture, "GlmMoeDsaForCausalLM");
    MOE_TRY(moe_config_get_int(root, what, "index_topk", 1, 16384, 2048, false, &c->dsa_topk)); /* a row's best on its stack */
    MOE_TRY(moe_config_get_int(root, what, "index_n_heads", 1, 1 << 12, glm ? 32 : 64, false, &c->dsa_heads));
    MOE_TRY(moe_config_get_int(root, what, "index_head_dim", 1, 1 << 12, 128, false, &c->dsa_dim));
    if (c->q_lora_rank <= 0)
        return moe_fail(MOE_ERR_FORMAT, "%s: DeepSeek sparse attention's indexer reads the q LoRA, and "
                        "q_lora_rank is null", what);
    if (c->dsa_dim < c->rope_dim)
        return moe_fail(MOE_ERR_FORMAT, "%s: index_head_dim = %d is below qk_rope_head_dim = %d", what,
                        c->dsa_dim, c->rope_dim);
    if (c->rope_attn_factor != 1.0f)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: yarn's attention factor %g with DeepSeek sparse attention "
                        "(the indexer's rotated values would be scaled) is not supported", what,
                        c->rope_attn_factor);
    c->dsa_rope_interleave = glm;
    return glm ? parse_indexer_types(c, root, what) : MOE_OK;
}
