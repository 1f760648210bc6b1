/* config_qwen3next.c - Qwen3NextConfig's and Qwen3_5MoeTextConfig's keys
 * (transformers 5.24) for their hybrid layers:
 *
 *   linear_conv_kernel_dim 4, linear_key_head_dim 128,
 *     linear_value_head_dim 128, linear_num_key_heads 16,
 *     linear_num_value_heads 32
 *   layer_types (linear_attention, full_attention), else layer l is full
 *     attention when (l + 1) % full_attention_interval == 0 (default 4)
 *
 * Every attention layer's output is gated (q_proj gives queries and gates)
 * and every RMSNorm but the Gated DeltaNet's own multiplies by 1 + weight. */
#include "runtime/model/config_impl.h"

#include <stdio.h>
#include <string.h>

enum moe_status moe_config_parse_linear(struct moe_config *c, json_t *root, const char *what)
{
    const int BIG = 1 << 16;
    MOE_TRY(moe_config_get_int(root, what, "linear_conv_kernel_dim", 1, 64, 4, false, &c->lin_conv));
    MOE_TRY(moe_config_get_int(root, what, "linear_key_head_dim", 1, 1024, 128, false, &c->lin_k_dim));
    MOE_TRY(moe_config_get_int(root, what, "linear_value_head_dim", 1, 1024, 128, false, &c->lin_v_dim));
    MOE_TRY(moe_config_get_int(root, what, "linear_num_key_heads", 1, BIG, 16, false, &c->lin_k_heads));
    MOE_TRY(moe_config_get_int(root, what, "linear_num_value_heads", 1, BIG, 32, false, &c->lin_v_heads));
    if (c->lin_v_heads % c->lin_k_heads)
        return moe_fail(MOE_ERR_FORMAT, "%s: linear_num_value_heads = %d is not a multiple of "
                        "linear_num_key_heads = %d", what, c->lin_v_heads, c->lin_k_heads);
    json_t *types = json_object_get(root, "layer_types");
    int interval;
    MOE_TRY(moe_config_get_int(root, what, "full_attention_interval", 1, MOE_MAX_LAYERS, 4, false, &interval));
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || (int)json_array_size(types) != c->n_layers)
            return moe_fail(MOE_ERR_FORMAT, "%s: layer_types must be a list of %d entries", what, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const char *t = json_string_value(json_array_get(types, (size_t)l));
            if (!t) return moe_fail(MOE_ERR_FORMAT, "%s: layer_types[%d] is not a string", what, l);
            if (strcmp(t, "linear_attention") && strcmp(t, "full_attention"))
                return moe_fail(MOE_ERR_UNSUPPORTED, "%s: layer_types[%d] = '%s' is not supported "
                                "(linear_attention, full_attention)", what, l, t);
            c->layer_linear[l] = !strcmp(t, "linear_attention");
        }
    } else {
        for (int l = 0; l < c->n_layers; l++) c->layer_linear[l] = (l + 1) % interval != 0;
    }
    c->attn_out_gate = true;
    c->norm_plus_one = true;
    return MOE_OK;
}

enum moe_status moe_config_parse_qwen3_5_text(struct moe_config *c, json_t *root, const char *what)
{
    json_t *t;
    MOE_TRY(moe_config_text_copy(root, what, "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM", &t));
    /* Qwen3_5MoeConfig decides the tying at the root (default false),
     * whatever text_config says; its quantization_config is the model's */
    json_t *tie = json_object_get(root, "tie_word_embeddings"), *q = json_object_get(root, "quantization_config");
    if (json_object_set_new(t, "tie_word_embeddings", tie && !json_is_null(tie) ? json_incref(tie) : json_false()) ||
        (q && !json_object_get(t, "quantization_config") && json_object_set(t, "quantization_config", q))) {
        json_decref(t);
        return moe_fail(MOE_ERR_NOMEM, "%s: text_config", what);
    }
    enum moe_status s = moe_config_parse(c, t, what);
    json_decref(t);
    if (s != MOE_OK) return s;
    snprintf(c->architecture, sizeof c->architecture, "Qwen3_5MoeForConditionalGeneration");
    snprintf(c->tensor_prefix, sizeof c->tensor_prefix, "model.language_model.");
    snprintf(c->tensor_prefix_to, sizeof c->tensor_prefix_to, "model.");
    return MOE_OK;
}
