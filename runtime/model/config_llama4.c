/* config_llama4.c - Llama4TextConfig's keys (transformers 5.24), for
 * Llama4ForCausalLM: the text model of Llama-4 Scout and Maverick, alone
 * or as Llama4ForConditionalGeneration's text_config.
 *
 *   num_local_experts 16, num_experts_per_tok 1, intermediate_size 8192
 *     (each expert's and the shared expert's width), intermediate_size_mlp
 *     16384 (the dense layers'), moe_layers, else every
 *     interleave_moe_layer_step-th layer (default 1: all)
 *   no_rope_layers (1: RoPE, 0: none), else every no_rope_layer_interval-th
 *     layer (default 4) without RoPE
 *   attention_chunk_size 8192 (null: none), layer_types (chunked_attention,
 *     full_attention), else the RoPE layers chunked
 *   use_qk_norm true, attn_temperature_tuning true, floor_scale 8192,
 *     attn_scale 0.1
 * The router (Llama4Router, Llama4TextMoe) takes the top-K logits and
 * multiplies each chosen expert's input by sigmoid(logit); moerun does it
 * for top-1, what every released Llama-4 uses, and refuses more. */
#include "runtime/model/config_impl.h"

#include <stdio.h>
#include <string.h>

/* An array of n_layers integers or strings at key, or absent / null /
 * (no_rope_layers) empty: *out NULL. */
static enum moe_status layer_list(json_t *root, const char *what, const char *key, int n_layers,
                                  bool empty_is_absent, json_t **out)
{
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v) || (empty_is_absent && json_is_array(v) && json_array_size(v) == 0)) return MOE_OK;
    if (!json_is_array(v)) return moe_fail(MOE_ERR_FORMAT, "%s: '%s' must be a list", what, key);
    if ((int)json_array_size(v) != n_layers)
        return moe_fail(MOE_ERR_FORMAT, "%s: %s has %zu entries for %d layers", what, key, json_array_size(v),
                        n_layers);
    *out = v;
    return MOE_OK;
}

static enum moe_status parse_attention(struct moe_config *c, json_t *root, const char *what)
{
    const int L = c->n_layers;
    json_t *nope, *types;
    int interval;
    MOE_TRY(moe_config_get_int(root, what, "no_rope_layer_interval", 1, 1 << 20, 4, false, &interval));
    MOE_TRY(layer_list(root, what, "no_rope_layers", L, true, &nope));
    for (int l = 0; l < L; l++) {
        json_t *x = nope ? json_array_get(nope, (size_t)l) : NULL;
        if (nope && (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1))
            return moe_fail(MOE_ERR_FORMAT, "%s: no_rope_layers[%d] must be 0 or 1", what, l);
        c->layer_nope[l] = nope ? json_integer_value(x) == 0 : (l + 1) % interval == 0;
    }
    json_t *chunk = json_object_get(root, "attention_chunk_size");
    c->attn_chunk = 0;
    if (!chunk || !json_is_null(chunk))
        MOE_TRY(moe_config_get_int(root, what, "attention_chunk_size", 1, INT32_MAX, 8192, false, &c->attn_chunk));
    MOE_TRY(layer_list(root, what, "layer_types", L, false, &types));
    for (int l = 0; l < L; l++) {
        const char *t = types ? json_string_value(json_array_get(types, (size_t)l)) : NULL;
        if (types && !t) return moe_fail(MOE_ERR_FORMAT, "%s: layer_types[%d] is not a string", what, l);
        if (t && strcmp(t, "chunked_attention") && strcmp(t, "full_attention"))
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s: layer_types[%d] = '%s' is not supported (chunked_attention, "
                            "full_attention)", what, l, t);
        c->layer_chunked[l] = t ? !strcmp(t, "chunked_attention") : !c->layer_nope[l] && c->attn_chunk > 0;
        if (c->layer_chunked[l] && c->attn_chunk == 0)
            return moe_fail(MOE_ERR_FORMAT, "%s: layer_types[%d] is chunked_attention but attention_chunk_size "
                            "is null", what, l);
    }
    bool tuning;
    double scale;
    MOE_TRY(moe_config_get_bool(root, what, "use_qk_norm", true, &c->qk_l2_norm));
    MOE_TRY(moe_config_get_bool(root, what, "attn_temperature_tuning", true, &tuning));
    MOE_TRY(moe_config_get_int(root, what, "floor_scale", 1, INT32_MAX, 8192, false, &c->attn_temp_floor));
    MOE_TRY(moe_config_get_num(root, what, "attn_scale", 0.1, &scale));
    c->attn_temp_scale = (float)scale;
    if (!tuning) c->attn_temp_floor = 0;
    /* transformers' Llama-4 RoPE: complex pairs over the whole head */
    c->rope_interleave = true;
    c->rope_dim = c->head_dim;
    return MOE_OK;
}

enum moe_status moe_config_parse_llama4(struct moe_config *c, json_t *root, const char *what)
{
    const int BIG = 1 << 24;
    if (c->weights_fp8 || c->q4_method != MOE_Q4_NONE || c->experts_mxfp4)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: quantization_config is not supported for Llama-4 (its q_proj "
                        "and k_proj rows are reordered at load)", what);
    MOE_TRY(moe_config_get_int(root, what, "num_local_experts", 1, 1 << 16, 16, false, &c->n_experts));
    MOE_TRY(moe_config_get_int(root, what, "intermediate_size", 1, BIG, 8192, false, &c->d_expert));
    MOE_TRY(moe_config_get_int(root, what, "intermediate_size_mlp", 1, BIG, 16384, false, &c->d_ff));
    c->d_shared = c->d_expert; /* feed_forward.shared_expert, no gate */
    c->router_sigmoid = c->router_scales_input = true;
    c->norm_topk = false;
    int k;
    MOE_TRY(moe_config_get_int(root, what, "num_experts_per_tok", 1, c->n_experts, 1, false, &k));
    if (k != 1)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: num_experts_per_tok = %d: Llama-4's routing (the router score "
                        "scales each chosen expert's input) is supported for 1 expert per token only", what, k);
    return parse_attention(c, root, what);
}

enum moe_status moe_config_llama4_layers(struct moe_config *c, json_t *root, const char *what)
{
    json_t *list;
    int step;
    MOE_TRY(moe_config_get_int(root, what, "interleave_moe_layer_step", 1, 1 << 20, 1, false, &step));
    for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = (l + 1) % step == 0;
    list = json_object_get(root, "moe_layers");
    if (!list || json_is_null(list)) return MOE_OK;
    if (!json_is_array(list)) return moe_fail(MOE_ERR_FORMAT, "%s: 'moe_layers' must be a list", what);
    for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = false;
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->n_layers)
            return moe_fail(MOE_ERR_FORMAT, "%s: moe_layers[%zu] is not a layer index below %d", what, i,
                            c->n_layers);
        c->layer_moe[json_integer_value(v)] = true;
    }
    return MOE_OK;
}

enum moe_status moe_config_text_copy(json_t *root, const char *what, const char *owner, const char *arch,
                                     json_t **out)
{
    json_t *text = json_object_get(root, "text_config");
    *out = NULL;
    if (!json_is_object(text))
        return moe_fail(MOE_ERR_FORMAT, "%s: %s without a 'text_config' object", what, owner);
    json_t *t = json_copy(text);
    if (!t || json_object_set_new(t, "architectures", json_pack("[s]", arch))) { /* the list is released either way */
        json_decref(t);
        return moe_fail(MOE_ERR_NOMEM, "%s: text_config", what);
    }
    *out = t;
    return MOE_OK;
}

/* Llama4ForConditionalGeneration: its text model, text_config read as a
 * Llama4ForCausalLM's config; its tensors are named `language_model.*`
 * (tensor_prefix); the vision tower is not read. */
enum moe_status moe_config_parse_llama4_text(struct moe_config *c, json_t *root, const char *what)
{
    json_t *q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q))
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: quantization_config is not supported for Llama-4", what);
    json_t *t;
    MOE_TRY(moe_config_text_copy(root, what, "Llama4ForConditionalGeneration", "Llama4ForCausalLM", &t));
    enum moe_status s = moe_config_parse(c, t, what);
    json_decref(t);
    if (s != MOE_OK) return s;
    snprintf(c->architecture, sizeof c->architecture, "Llama4ForConditionalGeneration");
    snprintf(c->tensor_prefix, sizeof c->tensor_prefix, "language_model.");
    return MOE_OK;
}
