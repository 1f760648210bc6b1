/* config.c - config.json -> struct moe_config.
 *
 * Mirrors the transformers configuration classes of each family, including
 * their defaults for absent keys (transformers 5 values).  Both the
 * transformers 5 spelling of RoPE settings ("rope_parameters") and the older
 * one ("rope_theta" + "rope_scaling") are read.  Anything that would change
 * the math and that we do not implement is refused by name.  Some
 * families' own keys are read in config_<family>.c (config_impl.h); what a
 * parsed config implies (layer counts, bytes per token) in config_sizes.c. */
#include "runtime/model/config.h"
#include "runtime/model/config_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Per family: what it always has, and the defaults of the keys a config may
 * leave out, as transformers 5.24's config classes set them
 * (tests/reference/make_config_defaults.py records what transformers makes
 * of each absent key; tests/test_config_defaults.c compares). */
static const struct {
    const char *arch;
    enum moe_family family;
    float eps;            /* rms_norm_eps default */
    int head_dim;         /* head_dim default (0: hidden / heads) */
    bool qkv_bias_always; /* Qwen2 families: q/k/v biases regardless of config */
    enum moe_qk_norm qk_norm;
    bool moe;
    int max_pos;          /* max_position_embeddings default */
    int top_k;            /* num_experts_per_tok default (0: none, required) */
    double theta;         /* rope_theta default */
    bool window_switch;   /* use_sliding_window exists, default false (else a sliding_window
                             alone turns the window on) */
    int window;           /* sliding_window default when on */
    int kv_heads;         /* num_key_value_heads default (0: num_attention_heads) */
    int ffn, moe_ffn;     /* intermediate_size and moe_intermediate_size defaults */
} families[] = {
    {"MixtralForCausalLM", MOE_FAMILY_MIXTRAL, 1e-5f, 0, false, MOE_QK_NORM_NONE, true, 131072, 2, 1e6, false, 0, 8, 14336, 0},
    {"Qwen2MoeForCausalLM", MOE_FAMILY_QWEN2_MOE, 1e-6f, 0, true, MOE_QK_NORM_NONE, true, 32768, 4, 1e4, true, 4096, 16, 5632, 1408},
    {"Qwen3MoeForCausalLM", MOE_FAMILY_QWEN3_MOE, 1e-6f, 0, false, MOE_QK_NORM_HEAD, true, 32768, 8, 1e4, true, 4096, 4, 6144, 768},
    {"OlmoeForCausalLM", MOE_FAMILY_OLMOE, 1e-5f, 0, false, MOE_QK_NORM_FULL, true, 4096, 8, 1e4, false, 0, 0, 2048, 0},
    {"LlamaForCausalLM", MOE_FAMILY_LLAMA, 1e-6f, 0, false, MOE_QK_NORM_NONE, false, 2048, 0, 1e4, false, 0, 0, 11008, 0},
    {"Qwen2ForCausalLM", MOE_FAMILY_QWEN2, 1e-6f, 0, true, MOE_QK_NORM_NONE, false, 32768, 0, 1e4, true, 4096, 32, 22016, 0},
    {"Qwen3ForCausalLM", MOE_FAMILY_QWEN3, 1e-6f, 128, false, MOE_QK_NORM_HEAD, false, 32768, 0, 1e4, true, 4096, 32, 22016, 0},
    {"Glm4MoeForCausalLM", MOE_FAMILY_GLM4_MOE, 1e-5f, 0, false, MOE_QK_NORM_NONE, true, 131072, 8, 1e4, false, 0, 8, 10944, 1408},
    {"GraniteMoeForCausalLM", MOE_FAMILY_GRANITE_MOE, 1e-6f, 0, false, MOE_QK_NORM_NONE, true, 2048, 2, 1e4, false, 0, 0, 11008, 0},
    {"GraniteMoeSharedForCausalLM", MOE_FAMILY_GRANITE_MOE, 1e-6f, 0, false, MOE_QK_NORM_NONE, true, 2048, 2, 1e4, false, 0, 0, 11008, 0},
    {"GraniteForCausalLM", MOE_FAMILY_GRANITE, 1e-6f, 0, false, MOE_QK_NORM_NONE, false, 2048, 0, 1e4, false, 0, 0, 11008, 0},
    {"GptOssForCausalLM", MOE_FAMILY_GPT_OSS, 1e-5f, 64, false, MOE_QK_NORM_NONE, true, 131072, 4, 150000, false, 128, 8, 2880, 0},
    {"DeepseekV2ForCausalLM", MOE_FAMILY_DEEPSEEK_V2, 1e-6f, 0, false, MOE_QK_NORM_NONE, true, 2048, 0, 1e4, false, 0, 0, 11008, 1407},
    {"DeepseekV3ForCausalLM", MOE_FAMILY_DEEPSEEK_V3, 1e-6f, 0, false, MOE_QK_NORM_NONE, true, 4096, 8, 1e4, false, 0, 0, 18432, 2048},
    {"DeepseekV32ForCausalLM", MOE_FAMILY_DEEPSEEK_V3, 1e-6f, 0, false, MOE_QK_NORM_NONE, true, 163840, 8, 1e4, false, 0, 0, 18432, 2048},
    {"GlmMoeDsaForCausalLM", MOE_FAMILY_DEEPSEEK_V3, 1e-5f, 0, false, MOE_QK_NORM_NONE, true, 202752, 8, 1e4, false, 0, 0, 12288, 2048},
    {"Llama4ForCausalLM", MOE_FAMILY_LLAMA4, 1e-5f, 128, false, MOE_QK_NORM_NONE, true, 131072, 1, 5e5, false, 0, 8, 8192, 0},
    {"MiniMaxM2ForCausalLM", MOE_FAMILY_MINIMAX_M2, 1e-6f, 128, false, MOE_QK_NORM_FULL, true, 196608, 8, 5e6, false, 0, 8, 1536, 0},
    {"Qwen3_5MoeForCausalLM", MOE_FAMILY_QWEN3_5_MOE, 1e-6f, 256, false, MOE_QK_NORM_HEAD, true, 32768, 8, 1e4, true, 0, 2, 0, 512},
    {"Qwen3NextForCausalLM", MOE_FAMILY_QWEN3_NEXT, 1e-6f, 256, false, MOE_QK_NORM_HEAD, true, 32768, 10, 1e4, true, 0, 2, 5632, 512},
};

/* The table's row of family f (GraniteMoe's two rows agree). */
static int family_row(enum moe_family f)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i].family == f) return (int)i;
    MOE_ASSERT(!"family in the table");
    return 0;
}

const char *moe_family_name(enum moe_family f)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i].family == f) return families[i].arch;
    return "?";
}

/* --- typed field access: absent -> default; wrong type -> error --- */

static enum moe_status get_int(json_t *root, const char *what, const char *key, long long lo,
                               long long hi, int def, bool required, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return moe_fail(MOE_ERR_FORMAT, "%s: missing required field '%s'", what, key);
        *out = def;
        return MOE_OK;
    }
    if (!json_is_integer(v))
        return moe_fail(MOE_ERR_FORMAT, "%s: field '%s' must be an integer", what, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return moe_fail(MOE_ERR_FORMAT, "%s: field '%s' = %lld is out of range [%lld, %lld]", what,
                        key, (long long)x, lo, hi);
    *out = (int)x;
    return MOE_OK;
}

static enum moe_status get_num(json_t *root, const char *what, const char *key, double def,
                               double *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MOE_OK;
    }
    if (!json_is_number(v))
        return moe_fail(MOE_ERR_FORMAT, "%s: field '%s' must be a number", what, key);
    *out = json_number_value(v);
    if (!isfinite(*out))
        return moe_fail(MOE_ERR_FORMAT, "%s: field '%s' is not finite", what, key);
    return MOE_OK;
}

static enum moe_status get_bool(json_t *root, const char *what, const char *key, bool def,
                                bool *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MOE_OK;
    }
    if (!json_is_boolean(v))
        return moe_fail(MOE_ERR_FORMAT, "%s: field '%s' must be true or false", what, key);
    *out = json_is_true(v);
    return MOE_OK;
}

/* eos_token_id may be an int or a list (the first is kept here; the
 * tokenizer/generation config carries the full list). */
static enum moe_status get_token_id(json_t *root, const char *what, const char *key, int *out)
{
    json_t *v = json_object_get(root, key);
    *out = -1;
    if (v && json_is_array(v)) v = json_array_get(v, 0);
    if (!v || json_is_null(v)) return MOE_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return moe_fail(MOE_ERR_FORMAT, "%s: field '%s' must be a token id", what, key);
    *out = (int)json_integer_value(v);
    return MOE_OK;
}

/* YaRN as transformers' _compute_yarn_parameters reads it: factor (absent:
 * max_position_embeddings / original_max_position_embeddings, DeepSeek-V3's
 * convention), beta_fast 32, beta_slow 1, truncate true, and an attention
 * factor given or made from factor, mscale and mscale_all_dim. */
double moe_config_yarn_mscale(double scale, double mscale)
{
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static enum moe_status parse_yarn(struct moe_config *c, json_t *params, const char *what)
{
    int orig;
    double factor = 0, af = 0, ms = 0, ms_all = 0, fast = 0, slow = 0;
    MOE_TRY(get_int(params, what, "original_max_position_embeddings", 1, INT32_MAX, 0, true, &orig));
    MOE_TRY(get_num(params, what, "factor", (double)c->max_pos / orig, &factor));
    MOE_TRY(get_num(params, what, "attention_factor", 0.0, &af));
    MOE_TRY(get_num(params, what, "mscale", 0.0, &ms));
    MOE_TRY(get_num(params, what, "mscale_all_dim", 0.0, &ms_all));
    MOE_TRY(get_num(params, what, "beta_fast", 32.0, &fast));
    MOE_TRY(get_num(params, what, "beta_slow", 1.0, &slow));
    MOE_TRY(get_bool(params, what, "truncate", true, &c->rope_truncate));
    if (!(factor > 0) || !(fast > 0) || !(slow > 0) || af < 0)
        return moe_fail(MOE_ERR_FORMAT, "%s: yarn rope needs factor, beta_fast and beta_slow > 0 "
                        "and attention_factor >= 0 (got %g, %g, %g, %g)", what, factor, fast, slow, af);
    if (json_object_get(params, "attention_factor") && af == 0)
        return moe_fail(MOE_ERR_FORMAT, "%s: yarn attention_factor must be > 0", what);
    if (af == 0) af = ms != 0 && ms_all != 0 ? moe_config_yarn_mscale(factor, ms) / moe_config_yarn_mscale(factor, ms_all)
                                             : moe_config_yarn_mscale(factor, 1.0);
    c->rope_type = MOE_ROPE_YARN;
    c->rope_factor = (float)factor;
    c->rope_original_max_pos = orig;
    c->rope_beta_fast = (float)fast;
    c->rope_beta_slow = (float)slow;
    c->rope_attn_factor = (float)af;
    c->rope_mscale_all_dim = (float)ms_all;
    return MOE_OK;
}

static enum moe_status parse_rope(struct moe_config *c, json_t *root, const char *what)
{
    /* transformers 5: rope_parameters {rope_type, rope_theta, ...};
     * earlier: rope_theta at the top and rope_scaling {type|rope_type, ...}. */
    json_t *rp = json_object_get(root, "rope_parameters");
    json_t *scaling = json_object_get(root, "rope_scaling");
    if (rp && !json_is_null(rp) && !json_is_object(rp))
        return moe_fail(MOE_ERR_FORMAT, "%s: 'rope_parameters' must be an object", what);
    if (scaling && !json_is_null(scaling) && !json_is_object(scaling))
        return moe_fail(MOE_ERR_FORMAT, "%s: 'rope_scaling' must be an object or null", what);
    json_t *params = (rp && json_is_object(rp)) ? rp : (json_is_object(scaling) ? scaling : NULL);
    double theta = 0;
    MOE_TRY(get_num(root, what, "rope_theta", families[family_row(c->family)].theta, &theta));
    if (rp && json_is_object(rp)) MOE_TRY(get_num(rp, what, "rope_theta", theta, &theta));
    if (!(theta > 1.0)) return moe_fail(MOE_ERR_FORMAT, "%s: rope_theta = %g must be > 1", what, theta);
    c->rope_theta = (float)theta;
    c->rope_type = MOE_ROPE_DEFAULT;
    c->rope_factor = 1.0f;
    c->rope_attn_factor = 1.0f;
    if (!params && c->family == MOE_FAMILY_GPT_OSS) { /* GptOssConfig's default: YaRN, factor 32 over 4096 */
        c->rope_type = MOE_ROPE_YARN;
        c->rope_factor = 32.0f;
        c->rope_beta_fast = 32.0f;
        c->rope_beta_slow = 1.0f;
        c->rope_original_max_pos = 4096;
        c->rope_attn_factor = (float)(0.1 * log(32.0) + 1.0);
        return MOE_OK;
    }
    if (!params) return MOE_OK;

    json_t *t = json_object_get(params, "rope_type");
    if (!t) t = json_object_get(params, "type");
    const char *type = "default";
    if (t) {
        if (!json_is_string(t)) return moe_fail(MOE_ERR_FORMAT, "%s: rope type must be a string", what);
        type = json_string_value(t);
    }
    double factor = 0, lo = 0, hi = 0;
    int orig;
    if (!strcmp(type, "default")) return MOE_OK;
    if (!strcmp(type, "linear")) {
        MOE_TRY(get_num(params, what, "factor", 1.0, &factor));
        if (!(factor > 0)) return moe_fail(MOE_ERR_FORMAT, "%s: rope factor %g must be > 0", what, factor);
        c->rope_type = MOE_ROPE_LINEAR;
        c->rope_factor = (float)factor;
        return MOE_OK;
    }
    if (!strcmp(type, "llama3")) {
        MOE_TRY(get_num(params, what, "factor", 8.0, &factor));
        MOE_TRY(get_num(params, what, "low_freq_factor", 1.0, &lo));
        MOE_TRY(get_num(params, what, "high_freq_factor", 4.0, &hi));
        MOE_TRY(get_int(params, what, "original_max_position_embeddings", 1, INT32_MAX,
                        c->max_pos, false, &orig));
        if (!(factor > 0) || !(lo > 0) || !(hi >= lo)) /* equal (Llama-4 Scout): no smoothed band */
            return moe_fail(MOE_ERR_FORMAT,
                            "%s: llama3 rope needs factor > 0 and high_freq_factor >= "
                            "low_freq_factor > 0 (got %g, %g, %g)", what, factor, hi, lo);
        c->rope_type = MOE_ROPE_LLAMA3;
        c->rope_factor = (float)factor;
        c->rope_low_freq_factor = (float)lo;
        c->rope_high_freq_factor = (float)hi;
        c->rope_original_max_pos = orig;
        return MOE_OK;
    }
    if (!strcmp(type, "yarn")) return parse_yarn(c, params, what);
    return moe_fail(MOE_ERR_UNSUPPORTED,
                    "%s: rope type '%s' is not supported (supported: default, linear, llama3, yarn)",
                    what, type);
}

/* Granite's embedding_multiplier, residual_multiplier, attention_multiplier
 * and logits_scaling (refused elsewhere: they change the math). */
static enum moe_status parse_multipliers(struct moe_config *c, json_t *root, const char *what)
{
    const bool granite = c->family == MOE_FAMILY_GRANITE_MOE || c->family == MOE_FAMILY_GRANITE;
    static const char *keys[] = {"embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                 "logits_scaling"};
    double v[4];
    for (int i = 0; i < 4; i++) {
        MOE_TRY(get_num(root, what, keys[i], 1.0, &v[i]));
        if (!(v[i] > 0))
            return moe_fail(MOE_ERR_FORMAT, "%s: %s = %g must be > 0", what, keys[i], v[i]);
        if (!granite && v[i] != 1.0 && json_object_get(root, keys[i]))
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s: %s is only supported for Granite", what, keys[i]);
    }
    c->embed_scale = (float)v[0];
    c->residual_scale = (float)v[1];
    if (granite) c->attn_scale = (float)v[2]; /* Granite's default is 1, not 1/sqrt(Dh); MLA set its own */
    c->logit_scale = (float)(1.0 / v[3]);
    return MOE_OK;
}

static enum moe_status parse_layers(struct moe_config *c, json_t *root, const char *what,
                                    bool moe)
{
    for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = moe;
    if (!moe) return MOE_OK;
    if (c->family == MOE_FAMILY_LLAMA4) return moe_config_llama4_layers(c, root, what);
    if (c->family == MOE_FAMILY_GLM4_MOE || c->family == MOE_FAMILY_DEEPSEEK_V2 ||
        c->family == MOE_FAMILY_DEEPSEEK_V3) {
        int k;
        MOE_TRY(get_int(root, what, "first_k_dense_replace", 0, c->n_layers,
                        c->family == MOE_FAMILY_DEEPSEEK_V2 ? 0 : c->family == MOE_FAMILY_DEEPSEEK_V3 ? 3 : 1,
                        false, &k));
        int freq;
        MOE_TRY(get_int(root, what, "moe_layer_freq", 1, 1, 1, false, &freq)); /* others: refused */
        for (int l = 0; l < k; l++) c->layer_moe[l] = false;
    }
    if (c->family == MOE_FAMILY_QWEN2_MOE || c->family == MOE_FAMILY_QWEN3_MOE ||
        c->family == MOE_FAMILY_QWEN3_NEXT) {
        int step;
        MOE_TRY(get_int(root, what, "decoder_sparse_step", 1, 1 << 20, 1, false, &step));
        json_t *only = json_object_get(root, "mlp_only_layers");
        if (only && !json_is_null(only) && !json_is_array(only))
            return moe_fail(MOE_ERR_FORMAT, "%s: 'mlp_only_layers' must be a list", what);
        for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = (l + 1) % step == 0;
        size_t i;
        json_t *v;
        json_array_foreach(only, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= c->n_layers)
                return moe_fail(MOE_ERR_FORMAT,
                                "%s: mlp_only_layers[%zu] is not a layer index below %d", what, i,
                                c->n_layers);
            c->layer_moe[json_integer_value(v)] = false;
        }
    }
    return MOE_OK;
}

/* Which layers attend through a sliding window, as each family's
 * transformers code decides: layer_types when the config gives them (and
 * the window is on); else gpt-oss alternates; Qwen2-MoE slides the
 * even-numbered layers below max_window_layers, Qwen2 and Qwen3 those at
 * or above it; the others every layer.  Qwen's configs turn the window on
 * with use_sliding_window (default false), the others by a sliding_window. */
static enum moe_status parse_sliding(struct moe_config *c, json_t *root, const char *what)
{
    const int fr = family_row(c->family);
    int window = 0;
    bool use = !families[fr].window_switch;
    if (families[fr].window_switch) MOE_TRY(get_bool(root, what, "use_sliding_window", false, &use));
    MOE_TRY(get_int(root, what, "sliding_window", 0, INT32_MAX, families[fr].window, false, &window));
    json_t *types = json_object_get(root, "layer_types");
    for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = false;
    if (!use || window == 0) return MOE_OK;
    if (types && json_is_array(types)) {
        if ((int)json_array_size(types) != c->n_layers)
            return moe_fail(MOE_ERR_FORMAT, "%s: layer_types has %zu entries for %d layers", what,
                            json_array_size(types), c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const char *s = json_string_value(json_array_get(types, l));
            if (!s) return moe_fail(MOE_ERR_FORMAT, "%s: layer_types[%d] is not a string", what, l);
            if (!strcmp(s, "sliding_attention")) c->layer_sliding[l] = true;
            else if (strcmp(s, "full_attention"))
                return moe_fail(MOE_ERR_UNSUPPORTED, "%s: layer_types[%d] = '%s' is not supported",
                                what, l, s);
        }
    } else if (c->family == MOE_FAMILY_GPT_OSS) { /* GptOssConfig: sliding, full, sliding, ... */
        for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = l % 2 == 0;
    } else if (c->family == MOE_FAMILY_QWEN2 || c->family == MOE_FAMILY_QWEN2_MOE ||
               c->family == MOE_FAMILY_QWEN3) {
        int max_window_layers;
        MOE_TRY(get_int(root, what, "max_window_layers", 0, INT32_MAX, 28, false, &max_window_layers));
        for (int l = 0; l < c->n_layers; l++)
            c->layer_sliding[l] = c->family == MOE_FAMILY_QWEN2_MOE ? l % 2 == 0 && l < max_window_layers
                                                                   : l >= max_window_layers;
    } else {
        for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = true;
    }
    c->sliding_window = window;
    return MOE_OK;
}

enum moe_status moe_config_parse(struct moe_config *c, json_t *root, const char *what)
{
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) return moe_fail(MOE_ERR_FORMAT, "%s: not a JSON object", what);
    json_t *archs = json_object_get(root, "architectures");
    const char *arch = json_string_value(json_array_get(archs, 0));
    if (!arch) return moe_fail(MOE_ERR_FORMAT, "%s: missing 'architectures' (a list of one name)", what);
    if (!strcmp(arch, "Llama4ForConditionalGeneration")) return moe_config_parse_llama4_text(c, root, what);
    if (!strcmp(arch, "Qwen3_5MoeForConditionalGeneration")) return moe_config_parse_qwen3_5_text(c, root, what);
    int fi = -1;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(arch, families[i].arch)) fi = (int)i;
    if (fi < 0)
        return moe_fail(MOE_ERR_UNSUPPORTED,
                        "%s: architecture '%s' is not supported (supported: MixtralForCausalLM, "
                        "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, "
                        "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Glm4MoeForCausalLM, "
                        "GraniteMoeForCausalLM, GraniteMoeSharedForCausalLM, GraniteForCausalLM, "
                        "GptOssForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
                        "MiniMaxM2ForCausalLM, Llama4ForCausalLM, Llama4ForConditionalGeneration (text), "
                        "Qwen3NextForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration (text), "
                        "DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM)",
                        what, arch);
    c->family = families[fi].family;
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);

    const int BIG = 1 << 24;
    MOE_TRY(get_int(root, what, "num_hidden_layers", 1, MOE_MAX_LAYERS, 0, true, &c->n_layers));
    MOE_TRY(get_int(root, what, "num_nextn_predict_layers", 0, MOE_MAX_LAYERS, 0, false, &c->n_mtp_layers));
    MOE_TRY(get_int(root, what, "hidden_size", 1, BIG, 0, true, &c->d_model));
    MOE_TRY(get_int(root, what, "vocab_size", 1, 1 << 28, 0, true, &c->vocab));
    MOE_TRY(get_int(root, what, "num_attention_heads", 1, 1 << 16, 0, true, &c->n_heads));
    const int kv_default = families[fi].kv_heads ? families[fi].kv_heads : c->n_heads;
    MOE_TRY(get_int(root, what, "num_key_value_heads", 1, 1 << 16, kv_default, false, &c->n_kv_heads));
    int hd_def = families[fi].head_dim ? families[fi].head_dim : c->d_model / c->n_heads;
    MOE_TRY(get_int(root, what, "head_dim", 1, 1 << 16, hd_def, false, &c->head_dim));
    MOE_TRY(get_int(root, what, "max_position_embeddings", 1, INT32_MAX, families[fi].max_pos, false, &c->max_pos));
    if (c->n_heads % c->n_kv_heads)
        return moe_fail(MOE_ERR_FORMAT,
                        "%s: num_attention_heads = %d is not a multiple of num_key_value_heads = %d",
                        what, c->n_heads, c->n_kv_heads);
    double eps = 0;
    MOE_TRY(get_num(root, what, "rms_norm_eps", families[fi].eps, &eps));
    if (!(eps > 0)) return moe_fail(MOE_ERR_FORMAT, "%s: rms_norm_eps = %g must be > 0", what, eps);
    c->rms_eps = (float)eps;
    MOE_TRY(get_bool(root, what, "tie_word_embeddings", false, &c->tie_embeddings));

    bool attn_bias = false;
    MOE_TRY(get_bool(root, what, "attention_bias", c->family == MOE_FAMILY_GPT_OSS, &attn_bias));
    c->qkv_bias = families[fi].qkv_bias_always || attn_bias;
    c->o_bias = !families[fi].qkv_bias_always && attn_bias;
    if (c->family == MOE_FAMILY_MIXTRAL) c->qkv_bias = c->o_bias = false;
    if (c->family == MOE_FAMILY_GLM4_MOE) c->o_bias = false; /* attention_bias: q, k, v only */
    if ((c->family == MOE_FAMILY_DEEPSEEK_V2 || c->family == MOE_FAMILY_DEEPSEEK_V3) && attn_bias)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: attention_bias = true is not supported with "
                        "multi-head latent attention", what);
    MOE_TRY(get_bool(root, what, "mlp_bias", false, &c->mlp_bias));
    if (c->mlp_bias && c->family != MOE_FAMILY_LLAMA)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: mlp_bias = true is only supported for Llama", what);
    c->qk_norm = families[fi].qk_norm;
    if (c->family == MOE_FAMILY_GLM4_MOE) {
        bool qk;
        MOE_TRY(get_bool(root, what, "use_qk_norm", false, &qk));
        if (qk) c->qk_norm = MOE_QK_NORM_HEAD;
    }
    double clip;
    MOE_TRY(get_num(root, what, "clip_qkv", 0.0, &clip));
    if (clip < 0) return moe_fail(MOE_ERR_FORMAT, "%s: clip_qkv = %g must be positive", what, clip);
    if (clip > 0 && c->family != MOE_FAMILY_OLMOE)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: clip_qkv is only supported for OLMoE", what);
    c->clip_qkv = (float)clip;

    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (only silu)",
                        what, json_is_string(act) ? json_string_value(act) : "(not a string)");
    MOE_TRY(parse_rope(c, root, what));
    /* partial_rotary_factor: at the top (older files) or in rope_parameters
     * (transformers 5); GLM-4.5 defaults to 0.5, MiniMax-M2 to rotary_dim /
     * head_dim.  transformers rotates
     * int(head_dim * factor) values of each head. */
    double prf = c->family == MOE_FAMILY_GLM4_MOE ? 0.5 : c->family == MOE_FAMILY_QWEN3_NEXT || c->family == MOE_FAMILY_QWEN3_5_MOE ? 0.25 : 1.0;
    if (c->family == MOE_FAMILY_MINIMAX_M2) { /* MiniMaxM2Config: rotary_dim / head_dim */
        int rotary_dim;
        MOE_TRY(get_int(root, what, "rotary_dim", 1, 1 << 16, c->head_dim, false, &rotary_dim));
        prf = (double)rotary_dim / c->head_dim;
    }
    MOE_TRY(get_num(root, what, "partial_rotary_factor", prf, &prf));
    json_t *rp = json_object_get(root, "rope_parameters");
    if (json_is_object(rp)) MOE_TRY(get_num(rp, what, "partial_rotary_factor", prf, &prf));
    if (!(prf > 0 && prf <= 1))
        return moe_fail(MOE_ERR_FORMAT, "%s: partial_rotary_factor = %g must be in (0, 1]", what, prf);
    c->rope_dim = (int)(c->head_dim * prf);
    if (c->rope_dim < 2 || c->rope_dim % 2)
        return moe_fail(MOE_ERR_FORMAT, "%s: RoPE over %d of head_dim %d values (partial_rotary_factor "
                        "%g): it must be even and at least 2", what, c->rope_dim, c->head_dim, prf);
    if (c->family == MOE_FAMILY_DEEPSEEK_V2 || c->family == MOE_FAMILY_DEEPSEEK_V3)
        MOE_TRY(moe_config_parse_mla(c, root, what));
    if (c->rope_attn_factor != 1.0f && c->rope_dim != c->head_dim)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: yarn's attention factor (%g) on part of each head "
                        "is not supported", what, c->rope_attn_factor);
    MOE_TRY(parse_sliding(c, root, what));
    MOE_TRY(moe_config_parse_quantization(c, root, what));

    bool moe = families[fi].moe;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0f;
    MOE_TRY(parse_multipliers(c, root, what));
    switch (c->family) {
    case MOE_FAMILY_MIXTRAL:
        MOE_TRY(get_int(root, what, "num_local_experts", 1, 1 << 16, 8, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "intermediate_size", 1, BIG, families[fi].ffn, false, &c->d_expert));
        c->norm_topk = true;
        break;
    case MOE_FAMILY_OLMOE:
        MOE_TRY(get_int(root, what, "num_experts", 1, 1 << 16, 64, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "intermediate_size", 1, BIG, families[fi].ffn, false, &c->d_expert));
        MOE_TRY(get_bool(root, what, "norm_topk_prob", false, &c->norm_topk));
        break;
    case MOE_FAMILY_QWEN2_MOE:
    case MOE_FAMILY_QWEN3_MOE:
        /* transformers 5 writes num_local_experts for Qwen3-MoE, earlier
         * versions num_experts */
        MOE_TRY(get_int(root, what, "num_local_experts", 1, 1 << 16, 60, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "num_experts", 1, 1 << 16, c->n_experts, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "moe_intermediate_size", 1, BIG, families[fi].moe_ffn, false, &c->d_expert));
        MOE_TRY(get_int(root, what, "intermediate_size", 0, BIG, families[fi].ffn, false, &c->d_ff));
        MOE_TRY(get_bool(root, what, "norm_topk_prob", false, &c->norm_topk));
        if (c->family == MOE_FAMILY_QWEN2_MOE) {
            MOE_TRY(get_int(root, what, "shared_expert_intermediate_size", 0, BIG, 5632, false,
                            &c->d_shared)); /* Qwen2MoeConfig's default */
            c->shared_gate = c->d_shared > 0;
        }
        break;
    case MOE_FAMILY_GRANITE_MOE:
        /* the router takes the softmax of the top-K logits: the softmax over
         * all E renormalised over the K */
        MOE_TRY(get_int(root, what, "num_local_experts", 1, 1 << 16, 8, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "intermediate_size", 1, BIG, families[fi].ffn, false, &c->d_expert));
        MOE_TRY(get_int(root, what, "shared_intermediate_size", 0, BIG, 0, false, &c->d_shared));
        c->norm_topk = true;
        break;
    case MOE_FAMILY_GLM4_MOE: {
        int n_shared;
        double scale;
        MOE_TRY(get_int(root, what, "n_routed_experts", 1, 1 << 16, 128, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "moe_intermediate_size", 1, BIG, families[fi].moe_ffn, false, &c->d_expert));
        MOE_TRY(get_int(root, what, "intermediate_size", 0, BIG, families[fi].ffn, false, &c->d_ff));
        MOE_TRY(get_int(root, what, "n_shared_experts", 0, 1 << 10, 1, false, &n_shared));
        c->d_shared = n_shared * c->d_expert; /* one MLP of n_shared experts' width, no gate */
        MOE_TRY(get_bool(root, what, "norm_topk_prob", true, &c->norm_topk));
        MOE_TRY(get_num(root, what, "routed_scaling_factor", 1.0, &scale));
        if (!(scale > 0))
            return moe_fail(MOE_ERR_FORMAT, "%s: routed_scaling_factor = %g must be > 0", what, scale);
        c->routed_scale = (float)scale;
        MOE_TRY(get_int(root, what, "n_group", 1, MOE_MAX_EXPERT_GROUPS, 1, false, &c->n_group));
        MOE_TRY(get_int(root, what, "topk_group", 1, c->n_group, 1, false, &c->topk_group));
        if (c->n_experts % c->n_group || c->n_experts / c->n_group < 2)
            return moe_fail(MOE_ERR_FORMAT, "%s: %d experts do not split into n_group = %d groups of "
                            "at least 2", what, c->n_experts, c->n_group);
        c->router_sigmoid = c->router_bias = true;
        break;
    }
    case MOE_FAMILY_DEEPSEEK_V2:
    case MOE_FAMILY_DEEPSEEK_V3: {
        const bool v3 = c->family == MOE_FAMILY_DEEPSEEK_V3, glm = !strcmp(arch, "GlmMoeDsaForCausalLM");
        int n_shared;
        double scale;
        MOE_TRY(get_int(root, what, "n_routed_experts", 1, 1 << 16, v3 ? 256 : 64, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "moe_intermediate_size", 1, BIG, families[fi].moe_ffn, false, &c->d_expert));
        MOE_TRY(get_int(root, what, "intermediate_size", 0, BIG, families[fi].ffn, false, &c->d_ff));
        MOE_TRY(get_int(root, what, "n_shared_experts", 0, 1 << 10, v3 ? 1 : 2, false, &n_shared));
        c->d_shared = n_shared * c->d_expert; /* one MLP of n_shared experts' width, no gate */
        MOE_TRY(get_num(root, what, "routed_scaling_factor", v3 ? 2.5 : 1.0, &scale));
        if (!(scale > 0))
            return moe_fail(MOE_ERR_FORMAT, "%s: routed_scaling_factor = %g must be > 0", what, scale);
        c->routed_scale = (float)scale;
        const char *method = json_string_value(json_object_get(root, "topk_method"));
        if (v3) { /* noaux_tc: the sigmoid router of GLM-4.5 */
            const char *fn = json_string_value(json_object_get(root, "scoring_func"));
            if ((method && strcmp(method, "noaux_tc")) || (fn && strcmp(fn, "sigmoid")))
                return moe_fail(MOE_ERR_UNSUPPORTED, "%s: DeepSeek-V3 routing '%s' / '%s' is not "
                                "supported (noaux_tc, sigmoid)", what, method ? method : "-",
                                fn ? fn : "-");
            MOE_TRY(get_bool(root, what, "norm_topk_prob", true, &c->norm_topk));
            MOE_TRY(get_int(root, what, "n_group", 1, MOE_MAX_EXPERT_GROUPS, glm ? 1 : 8, false, &c->n_group));
            MOE_TRY(get_int(root, what, "topk_group", 1, c->n_group, glm ? 1 : 4 < c->n_group ? 4 : c->n_group,
                            false, &c->topk_group));
            c->router_sigmoid = c->router_bias = true;
        } else if (!method || !strcmp(method, "greedy")) {
            c->norm_topk = false; /* transformers' DeepseekV2TopkRouter never renormalises */
        } else if (!strcmp(method, "group_limited_greedy")) {
            MOE_TRY(get_int(root, what, "n_group", 1, MOE_MAX_EXPERT_GROUPS, 1, true, &c->n_group));
            MOE_TRY(get_int(root, what, "topk_group", 1, c->n_group, 1, true, &c->topk_group));
        } else {
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s: topk_method '%s' is not supported (greedy, "
                            "group_limited_greedy)", what, method);
        }
        if (c->n_experts % c->n_group || c->n_experts / c->n_group < 2)
            return moe_fail(MOE_ERR_FORMAT, "%s: %d experts do not split into n_group = %d groups of "
                            "at least 2", what, c->n_experts, c->n_group);
        if (!strcmp(arch, "DeepseekV32ForCausalLM") || glm) MOE_TRY(moe_config_parse_dsa(c, root, what));
        break;
    }
    case MOE_FAMILY_LLAMA4:
        MOE_TRY(moe_config_parse_llama4(c, root, what));
        break;
    case MOE_FAMILY_QWEN3_5_MOE: /* every layer MoE, the K chosen always renormalised */
        MOE_TRY(get_int(root, what, "num_experts", 1, 1 << 16, 256, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "moe_intermediate_size", 1, BIG, families[fi].moe_ffn, false, &c->d_expert));
        MOE_TRY(get_int(root, what, "shared_expert_intermediate_size", 0, BIG, 512, false, &c->d_shared));
        c->norm_topk = true;
        c->shared_gate = c->d_shared > 0;
        MOE_TRY(moe_config_parse_linear(c, root, what));
        break;
    case MOE_FAMILY_QWEN3_NEXT:
        MOE_TRY(get_int(root, what, "num_experts", 1, 1 << 16, 512, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "moe_intermediate_size", 1, BIG, families[fi].moe_ffn, false, &c->d_expert));
        MOE_TRY(get_int(root, what, "intermediate_size", 0, BIG, families[fi].ffn, false, &c->d_ff));
        MOE_TRY(get_int(root, what, "shared_expert_intermediate_size", 0, BIG, 512, false, &c->d_shared));
        MOE_TRY(get_bool(root, what, "norm_topk_prob", true, &c->norm_topk));
        c->shared_gate = c->d_shared > 0;
        MOE_TRY(moe_config_parse_linear(c, root, what));
        break;
    case MOE_FAMILY_MINIMAX_M2:
        /* GLM-4.5's sigmoid router without groups or scaling: the choice
         * by sigmoid + e_score_correction_bias, the K unbiased sigmoids
         * always renormalised */
        MOE_TRY(get_int(root, what, "num_local_experts", 1, 1 << 16, 256, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "num_experts", 1, 1 << 16, c->n_experts, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "intermediate_size", 1, BIG, families[fi].ffn, false, &c->d_expert));
        c->norm_topk = c->router_sigmoid = c->router_bias = true;
        break;
    case MOE_FAMILY_GPT_OSS: {
        /* router: a Linear with a bias, softmax over the top-K logits (=
         * softmax, top-K, renormalised); experts with biases and the clamped
         * SwiGLU (config.h) */
        double alpha, limit;
        MOE_TRY(get_int(root, what, "num_local_experts", 1, 1 << 16, 128, false, &c->n_experts));
        MOE_TRY(get_int(root, what, "intermediate_size", 1, BIG, families[fi].ffn, false, &c->d_expert));
        MOE_TRY(get_num(root, what, "swiglu_alpha", 1.702, &alpha));
        MOE_TRY(get_num(root, what, "swiglu_limit", 7.0, &limit));
        if (!(alpha > 0) || !(limit > 0))
            return moe_fail(MOE_ERR_FORMAT, "%s: swiglu_alpha = %g and swiglu_limit = %g must be > 0",
                            what, alpha, limit);
        c->swiglu_alpha = (float)alpha;
        c->swiglu_limit = (float)limit;
        c->norm_topk = c->router_logit_bias = c->expert_bias = c->attn_sinks = true;
        break;
    }
    default:
        MOE_TRY(get_int(root, what, "intermediate_size", 1, BIG, families[fi].ffn, false, &c->d_ff));
        break;
    }
    if (moe) {
        MOE_TRY(get_int(root, what, "num_experts_per_tok", 1, c->n_experts, families[fi].top_k,
                        families[fi].top_k == 0, &c->top_k));
        if (c->top_k > c->topk_group * (c->n_experts / c->n_group))
            return moe_fail(MOE_ERR_FORMAT, "%s: num_experts_per_tok = %d exceeds the %d experts of "
                            "topk_group = %d groups", what, c->top_k,
                            c->topk_group * (c->n_experts / c->n_group), c->topk_group);
    }
    MOE_TRY(parse_layers(c, root, what, moe));
    json_t *mlt = json_object_get(root, "mlp_layer_types"); /* DeepseekV32Config: it decides when given */
    if (c->dsa_topk > 0 && mlt && !json_is_null(mlt)) {
        if (!json_is_array(mlt) || (int)json_array_size(mlt) != c->n_layers)
            return moe_fail(MOE_ERR_FORMAT, "%s: mlp_layer_types must be a list of %d entries", what, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const char *t = json_string_value(json_array_get(mlt, (size_t)l));
            if (!t || (strcmp(t, "dense") && strcmp(t, "sparse")))
                return moe_fail(MOE_ERR_FORMAT, "%s: mlp_layer_types[%d] must be \"dense\" or \"sparse\"", what, l);
            c->layer_moe[l] = !strcmp(t, "sparse");
        }
    }
    for (int l = 0; l < c->n_layers; l++)
        if (!c->layer_moe[l] && c->d_ff <= 0)
            return moe_fail(MOE_ERR_FORMAT, "%s: layer %d is dense but intermediate_size is not set",
                            what, l);
    double std;
    MOE_TRY(get_num(root, what, "initializer_range", 0.02, &std));
    if (!(std > 0)) return moe_fail(MOE_ERR_FORMAT, "%s: initializer_range = %g must be > 0", what, std);
    c->init_std = (float)std;
    MOE_TRY(get_token_id(root, what, "bos_token_id", &c->bos_id));
    MOE_TRY(get_token_id(root, what, "eos_token_id", &c->eos_id));
    return MOE_OK;
}

enum moe_status moe_config_load(struct moe_config *cfg, const char *path)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && jerr.line < 0) return moe_fail(MOE_ERR_IO, "%s: %s", path, jerr.text);
    if (!root)
        return moe_fail(MOE_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", path,
                        jerr.line, jerr.column, jerr.text);
    enum moe_status s = moe_config_parse(cfg, root, path);
    json_decref(root);
    return s;
}

enum moe_status moe_config_get_int(json_t *root, const char *what, const char *key, long long lo, long long hi,
                                   int def, bool required, int *out)
{
    return get_int(root, what, key, lo, hi, def, required, out);
}

enum moe_status moe_config_get_num(json_t *root, const char *what, const char *key, double def, double *out)
{
    return get_num(root, what, key, def, out);
}

enum moe_status moe_config_get_bool(json_t *root, const char *what, const char *key, bool def, bool *out)
{
    return get_bool(root, what, key, def, out);
}
