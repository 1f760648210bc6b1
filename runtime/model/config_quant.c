/* config_quant.c - config.json's quantization_config (see config_impl.h):
 * fp8 blocks, gpt-oss's mxfp4 experts, and the four-bit gptq, awq and
 * compressed-tensors schemes; every field that would change the math and
 * is not read is refused by name. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "runtime/model/config_impl.h"

/* A string field of quantization_config q that must be absent or one of
 * the allowed values (compared ignoring case, as transformers lowercases
 * activation_scheme). */
static enum moe_status quant_string(json_t *q, const char *what, const char *key, const char *allowed,
                                    const char *why)
{
    json_t *v = json_object_get(q, key);
    if (!v || json_is_null(v)) return MOE_OK;
    const char *str = json_string_value(v);
    if (!str) return moe_fail(MOE_ERR_FORMAT, "%s.%s must be a string", what, key);
    for (const char *a = allowed; *a; a += strlen(a) + 1)
        if (!strcasecmp(str, a)) return MOE_OK;
    return moe_fail(MOE_ERR_UNSUPPORTED, "%s.%s '%s' is not supported (%s)", what, key, str, why);
}

/* fp8 (transformers' FineGrainedFP8Config): weight_block_size [128, 128]
 * (its default when absent; null, per-tensor scales, and other sizes are
 * refused), dynamic activation scaling, E4M3 weights, fp8 experts, float
 * scales (ue8m0 ones too while stored as F32 or BF16: powers of two read
 * as values), no FP8 embeddings.  Which weights are quantized is read from
 * each tensor's dtype (runtime/model/model_fp8.c), so modules_to_not_convert /
 * ignored_layers are not needed. */
static enum moe_status parse_fp8(struct moe_config *c, json_t *q, const char *what, const char *qw)
{
    json_t *bs = json_object_get(q, "weight_block_size");
    if (bs) {
        json_t *b0 = json_array_get(bs, 0), *b1 = json_array_get(bs, 1);
        if (json_is_null(bs))
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s: quantization_config.weight_block_size null "
                            "(per-tensor FP8 scales) is not supported (supported: [128, 128])", what);
        if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(b0) || !json_is_integer(b1))
            return moe_fail(MOE_ERR_FORMAT, "%s: quantization_config.weight_block_size must be two "
                            "integers", what);
        if (json_integer_value(b0) != MOE_FP8_BLOCK || json_integer_value(b1) != MOE_FP8_BLOCK)
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s: quantization_config.weight_block_size [%lld, %lld] is "
                            "not supported (supported: [128, 128])", what, (long long)json_integer_value(b0),
                            (long long)json_integer_value(b1));
    }
    MOE_TRY(quant_string(q, qw, "activation_scheme", "dynamic\0", "supported: dynamic; static "
                         "activation scales are not read"));
    MOE_TRY(quant_string(q, qw, "fmt", "e4m3\0", "supported: e4m3"));
    MOE_TRY(quant_string(q, qw, "expert_dtype", "fp8\0", "supported: fp8"));
    MOE_TRY(quant_string(q, qw, "scale_fmt", "float\0ue8m0\0", "supported: float, ue8m0"));
    json_t *conv = json_object_get(q, "modules_to_convert");
    if (json_array_size(conv) > 0)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: quantization_config.modules_to_convert (FP8 embeddings) is "
                        "not supported", what);
    if (c->family == MOE_FAMILY_GPT_OSS)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: quantization_config.quant_method 'fp8' is not supported "
                        "for gpt-oss (its experts: mxfp4 or float)", what);
    c->weights_fp8 = true;
    return MOE_OK;
}

/* An integer field of quantization_config q that must be absent (then
 * def) or one of the allowed values; the message names the field. */
static enum moe_status quant_int(json_t *q, const char *what, const char *key, int def, const int *allowed,
                                 int n_allowed, const char *why)
{
    json_t *v = json_object_get(q, key);
    if (!v || json_is_null(v)) {
        if (def >= 0) return MOE_OK;
        return moe_fail(MOE_ERR_FORMAT, "%s.%s is missing", what, key);
    }
    if (!json_is_integer(v)) return moe_fail(MOE_ERR_FORMAT, "%s.%s must be an integer", what, key);
    for (int i = 0; i < n_allowed; i++)
        if (json_integer_value(v) == allowed[i]) return MOE_OK;
    return moe_fail(MOE_ERR_UNSUPPORTED, "%s.%s %lld is not supported (%s)", what, key,
                    (long long)json_integer_value(v), why);
}

/* A group size (group_size): -1 (one group a row) or a positive multiple
 * of 32; the tensors' shapes are checked against it at load. */
static enum moe_status quant_group(json_t *q, const char *what, const char *key)
{
    json_t *v = json_object_get(q, key);
    if (!json_is_integer(v)) return moe_fail(MOE_ERR_FORMAT, "%s.%s must be an integer", what, key);
    const json_int_t g = json_integer_value(v);
    if (g != -1 && (g <= 0 || g % 32 || g > (1 << 24)))
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s.%s %lld is not supported (supported: -1 and positive "
                        "multiples of 32)", what, key, (long long)g);
    return MOE_OK;
}

/* gptq (GPTQModel / AutoGPTQ / optimum): 4 bits, group_size -1 or a
 * multiple of 32, sym either way (the zero points are read), desc_act
 * either way (a g_idx that reorders columns is refused per tensor, at
 * load), checkpoint_format gptq (qzeros hold z - 1) or gptq_v2. */
static enum moe_status parse_gptq(struct moe_config *c, json_t *q, const char *what)
{
    static const int four[] = {4};
    MOE_TRY(quant_int(q, what, "bits", -1, four, 1, "supported: 4"));
    MOE_TRY(quant_group(q, what, "group_size"));
    const char *fmt_key = json_object_get(q, "checkpoint_format") ? "checkpoint_format" : "format";
    MOE_TRY(quant_string(q, what, fmt_key, "gptq\0gptq_v2\0", "supported: gptq, gptq_v2"));
    const char *fmt = json_string_value(json_object_get(q, fmt_key));
    MOE_TRY(quant_string(q, what, "quant_type", "gptq\0", "supported: gptq"));
    c->q4_method = MOE_Q4_GPTQ;
    c->q4_zero_plus_one = !fmt || !strcasecmp(fmt, "gptq");
    return MOE_OK;
}

/* awq (AutoAWQ): 4 bits (bits or w_bit), version gemm (its interleaved
 * nibble order), zero points present. */
static enum moe_status parse_awq(struct moe_config *c, json_t *q, const char *what)
{
    static const int four[] = {4};
    const char *bits = json_object_get(q, "bits") ? "bits" : "w_bit";
    MOE_TRY(quant_int(q, what, bits, -1, four, 1, "supported: 4"));
    MOE_TRY(quant_group(q, what, json_object_get(q, "group_size") ? "group_size" : "q_group_size"));
    MOE_TRY(quant_string(q, what, "version", "gemm\0", "supported: gemm"));
    json_t *zp = json_object_get(q, "zero_point");
    if (zp && !json_is_true(zp))
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s.zero_point false is not supported (supported: true)", what);
    c->q4_method = MOE_Q4_AWQ;
    return MOE_OK;
}

/* compressed-tensors (llm-compressor): format pack-quantized, every
 * config group int4 weights only (strategy group or channel, symmetric
 * either way, static), no activation or KV cache quantization, status
 * compressed.  Which modules are quantized (targets, ignore) is read from
 * the tensors themselves (runtime/model/model_q4.c). */
static enum moe_status parse_compressed(struct moe_config *c, json_t *q, const char *what)
{
    MOE_TRY(quant_string(q, what, "format", "pack-quantized\0", "supported: pack-quantized (int4 weights)"));
    MOE_TRY(quant_string(q, what, "quantization_status", "compressed\0", "supported: compressed"));
    if (json_object_get(q, "kv_cache_scheme") && !json_is_null(json_object_get(q, "kv_cache_scheme")))
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s.kv_cache_scheme is not supported", what);
    json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) == 0)
        return moe_fail(MOE_ERR_FORMAT, "%s.config_groups must be a non-empty object", what);
    const char *name;
    json_t *g;
    json_object_foreach(groups, name, g) {
        char w[640];
        snprintf(w, sizeof w, "%s.config_groups.%.200s", what, name);
        MOE_TRY(quant_string(g, w, "format", "pack-quantized\0", "supported: pack-quantized"));
        static const char *nulls[] = {"input_activations", "output_activations"};
        for (int i = 0; i < 2; i++)
            if (json_object_get(g, nulls[i]) && !json_is_null(json_object_get(g, nulls[i])))
                return moe_fail(MOE_ERR_UNSUPPORTED, "%s.%s is not supported (weight-only schemes are)", w,
                                nulls[i]);
        json_t *wt = json_object_get(g, "weights");
        if (!json_is_object(wt)) return moe_fail(MOE_ERR_FORMAT, "%s.weights must be an object", w);
        strncat(w, ".weights", sizeof w - strlen(w) - 1);
        static const int four[] = {4};
        MOE_TRY(quant_int(wt, w, "num_bits", -1, four, 1, "supported: 4"));
        MOE_TRY(quant_string(wt, w, "type", "int\0", "supported: int"));
        MOE_TRY(quant_string(wt, w, "strategy", "group\0channel\0", "supported: group, channel"));
        const char *strategy = json_string_value(json_object_get(wt, "strategy"));
        if (strategy && !strcasecmp(strategy, "group")) MOE_TRY(quant_group(wt, w, "group_size"));
        json_t *dyn = json_object_get(wt, "dynamic");
        if (dyn && !json_is_false(dyn))
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s.dynamic must be false (static weight scales)", w);
    }
    c->q4_method = MOE_Q4_CT;
    return MOE_OK;
}

/* quantization_config: gpt-oss's MXFP4 experts, the fp8 [128, 128]
 * checkpoints (DeepSeek-V3, Qwen3-FP8) and four-bit GPTQ, AWQ and
 * compressed-tensors checkpoints (read as stored, see runtime/core/tensor.h)
 * are the schemes supported; any other would be read as if its tensors
 * were plain weights, so it is refused by name. */
enum moe_status moe_config_parse_quantization(struct moe_config *c, json_t *root, const char *what)
{
    json_t *q = json_object_get(root, "quantization_config");
    if (!q || json_is_null(q)) return MOE_OK;
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    if (!json_is_object(q) || !method)
        return moe_fail(MOE_ERR_FORMAT, "%s: quantization_config must be an object with a "
                        "quant_method", what);
    char qw[256]; /* messages name fields as WHAT: quantization_config.KEY */
    snprintf(qw, sizeof qw, "%s: quantization_config", what);
    if (!strcmp(method, "fp8")) return parse_fp8(c, q, what, qw);
    if (!strcmp(method, "gptq")) return parse_gptq(c, q, qw);
    if (!strcmp(method, "awq")) return parse_awq(c, q, qw);
    if (!strcmp(method, "compressed-tensors")) return parse_compressed(c, q, qw);
    if (strcmp(method, "mxfp4") || c->family != MOE_FAMILY_GPT_OSS)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: quantization_config.quant_method '%s' is not "
                        "supported (supported: mxfp4 experts of gpt-oss, fp8 with [128, 128] blocks, "
                        "gptq, awq, compressed-tensors)", what, method);
    c->experts_mxfp4 = true;
    return MOE_OK;
}
