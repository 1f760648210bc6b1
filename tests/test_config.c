/* test_config.c - config.json parsing: families, defaults, and refusals
 * that name the field and value. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attention/attention.h"
#include "runtime/model/config.h"

static enum moe_status parse(const char *text, struct moe_config *c)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    cr_assert(j, "test JSON: %s", e.text);
    enum moe_status s = moe_config_parse(c, j, "config.json");
    json_decref(j);
    return s;
}

#define BASE "\"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"vocab_size\": 100, "

Test(config, qwen2_moe_layers_and_shared_expert)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"Qwen2MoeForCausalLM\"], " BASE
                       "\"num_experts\": 8, \"num_experts_per_tok\": 2, "
                       "\"moe_intermediate_size\": 32, \"intermediate_size\": 96, "
                       "\"shared_expert_intermediate_size\": 48, \"decoder_sparse_step\": 2, "
                       "\"mlp_only_layers\": [3]}", &c), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(c.family, MOE_FAMILY_QWEN2_MOE);
    cr_assert(c.qkv_bias && !c.o_bias);
    cr_assert_eq(c.d_shared, 48);
    cr_assert(c.shared_gate);
    /* (l+1) % 2 == 0 -> layers 1 and 3, minus mlp_only layer 3 */
    cr_assert(!c.layer_moe[0] && c.layer_moe[1] && !c.layer_moe[2] && !c.layer_moe[3]);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_float_eq(c.rms_eps, 1e-6f, 1e-12f);
}

Test(config, qwen3_moe_reads_num_local_experts_and_rope_parameters)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE
                       "\"num_local_experts\": 16, \"num_experts_per_tok\": 4, "
                       "\"moe_intermediate_size\": 32, \"norm_topk_prob\": true, \"head_dim\": 8, "
                       "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e6}}", &c),
                 MOE_OK, "%s", moe_last_error());
    cr_assert_eq(c.n_experts, 16);
    cr_assert_eq(c.top_k, 4);
    cr_assert(c.norm_topk);
    cr_assert_eq(c.qk_norm, MOE_QK_NORM_HEAD);
    cr_assert_float_eq(c.rope_theta, 1e6f, 1.0f);
    cr_assert_eq(c.head_dim, 8);
}

Test(config, legacy_rope_scaling_llama3)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                       "\"intermediate_size\": 96, \"rope_theta\": 500000.0, \"rope_scaling\": "
                       "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                       "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}", &c),
                 MOE_OK, "%s", moe_last_error());
    cr_assert_eq(c.rope_type, MOE_ROPE_LLAMA3);
    cr_assert_eq(c.rope_original_max_pos, 8192);
    cr_assert_float_eq(c.rope_theta, 500000.0f, 1.0f);
}

Test(config, unknown_architecture_is_named)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"GPT2LMHeadModel\"], " BASE "\"x\": 1}", &c),
                 MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "'GPT2LMHeadModel'"), "%s", moe_last_error());
}

Test(config, unsupported_rope_type_is_named)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE
                       "\"intermediate_size\": 96, \"rope_scaling\": {\"type\": \"dynamic\", "
                       "\"factor\": 4.0}}", &c), MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "'dynamic'"), "%s", moe_last_error());
}

Test(config, wrong_types_and_ranges_are_errors)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"MixtralForCausalLM\"], \"num_hidden_layers\": 2, "
                       "\"hidden_size\": \"64\"}", &c), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "hidden_size"), "%s", moe_last_error());
    cr_assert_eq(parse("{\"architectures\": [\"MixtralForCausalLM\"], " BASE
                       "\"intermediate_size\": 32, \"num_local_experts\": 4, "
                       "\"num_experts_per_tok\": 5}", &c), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "num_experts_per_tok"), "%s", moe_last_error());
    cr_assert_eq(parse("{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 64, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 3, "
                       "\"num_key_value_heads\": 2, \"vocab_size\": 10, \"intermediate_size\": 8}", &c),
                 MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "multiple"), "%s", moe_last_error());
    cr_assert_eq(parse("[1, 2]", &c), MOE_ERR_FORMAT);
    cr_assert_eq(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                       "\"intermediate_size\": 96, \"hidden_act\": \"gelu\"}", &c),
                 MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "gelu"), "%s", moe_last_error());
}

Test(config, qwen2_sliding_window_layers)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE
                       "\"intermediate_size\": 96, \"use_sliding_window\": true, "
                       "\"sliding_window\": 32, \"max_window_layers\": 2}", &c), MOE_OK, "%s",
                 moe_last_error());
    cr_assert_eq(c.sliding_window, 32);
    cr_assert(!c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[2] && c.layer_sliding[3]);
    cr_assert_eq(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE
                       "\"intermediate_size\": 96, \"use_sliding_window\": false, "
                       "\"sliding_window\": 32}", &c), MOE_OK);
    cr_assert(!c.layer_sliding[3]);
}

/* GLM-4.5 as its hub config.json writes it (transformers 4 spelling). */
Test(config, glm4_moe_router_groups_and_partial_rope)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"Glm4MoeForCausalLM\"], " BASE "\"head_dim\": 32, "
                       "\"intermediate_size\": 96, \"moe_intermediate_size\": 24, "
                       "\"n_routed_experts\": 16, \"num_experts_per_tok\": 4, \"n_shared_experts\": 2, "
                       "\"first_k_dense_replace\": 2, \"n_group\": 4, \"topk_group\": 2, "
                       "\"routed_scaling_factor\": 2.5, \"attention_bias\": true, "
                       "\"use_qk_norm\": true, \"partial_rotary_factor\": 0.5, "
                       "\"rope_theta\": 1000000, \"num_nextn_predict_layers\": 1}", &c),
                 MOE_OK, "%s", moe_last_error());
    cr_assert_eq(c.family, MOE_FAMILY_GLM4_MOE);
    cr_assert(c.router_sigmoid && c.router_bias && c.norm_topk);
    cr_assert_eq(c.n_group, 4);
    cr_assert_eq(c.topk_group, 2);
    cr_assert_float_eq(c.routed_scale, 2.5f, 0);
    cr_assert_eq(c.d_shared, 48, "n_shared_experts x moe_intermediate_size");
    cr_assert(!c.shared_gate);
    cr_assert(!c.layer_moe[0] && !c.layer_moe[1] && c.layer_moe[2] && c.layer_moe[3]);
    cr_assert(c.qkv_bias && !c.o_bias);
    cr_assert_eq(c.qk_norm, MOE_QK_NORM_HEAD);
    cr_assert_eq(c.rope_dim, 16);
    cr_assert_float_eq(c.rms_eps, 1e-5f, 1e-12f);
    /* defaults: half-rotary, one group, no scaling; other families rotate all */
    cr_assert_eq(parse("{\"architectures\": [\"Glm4MoeForCausalLM\"], " BASE
                       "\"moe_intermediate_size\": 24, \"n_routed_experts\": 8, \"intermediate_size\": 8, "
                       "\"num_experts_per_tok\": 2}", &c), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(c.rope_dim, 8);
    cr_assert_eq(c.n_group, 1);
    cr_assert_float_eq(c.routed_scale, 1.0f, 0);
    cr_assert_eq(c.qk_norm, MOE_QK_NORM_NONE);
    cr_assert_eq(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE
                       "\"num_experts\": 8, \"moe_intermediate_size\": 16}", &c), MOE_OK);
    cr_assert_eq(c.rope_dim, 16);
    cr_assert(!c.router_sigmoid && c.n_group == 1 && c.routed_scale == 1.0f);
}

Test(config, glm4_moe_impossible_groups_are_errors)
{
    struct moe_config c;
#define GLM "{\"architectures\": [\"Glm4MoeForCausalLM\"], " BASE "\"moe_intermediate_size\": 8, " \
            "\"intermediate_size\": 8, "
    cr_assert_eq(parse(GLM "\"n_routed_experts\": 10, \"n_group\": 4}", &c), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "do not split into n_group = 4"), "%s", moe_last_error());
    cr_assert_eq(parse(GLM "\"n_routed_experts\": 16, \"n_group\": 4, \"topk_group\": 5}", &c),
                 MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "topk_group"), "%s", moe_last_error());
    cr_assert_eq(parse(GLM "\"n_routed_experts\": 16, \"n_group\": 4, \"topk_group\": 1, "
                       "\"num_experts_per_tok\": 5}", &c), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "exceeds the 4 experts of topk_group = 1"), "%s", moe_last_error());
    cr_assert_eq(parse(GLM "\"n_routed_experts\": 16, \"rope_parameters\": {\"rope_theta\": 10000, "
                       "\"partial_rotary_factor\": 0.1}}", &c), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "partial_rotary_factor"), "%s", moe_last_error());
    cr_assert_eq(parse(GLM "\"n_routed_experts\": 16, \"routed_scaling_factor\": 0}", &c), MOE_ERR_FORMAT);
#undef GLM
}

Test(config, granite_multipliers_and_their_refusal_elsewhere)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"GraniteMoeSharedForCausalLM\"], " BASE
                       "\"intermediate_size\": 32, \"num_local_experts\": 8, \"num_experts_per_tok\": 2, "
                       "\"shared_intermediate_size\": 48, \"embedding_multiplier\": 12, "
                       "\"residual_multiplier\": 0.22, \"attention_multiplier\": 0.0078125, "
                       "\"logits_scaling\": 8}", &c), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(c.family, MOE_FAMILY_GRANITE_MOE);
    cr_assert_eq(c.d_expert, 32);
    cr_assert_eq(c.d_shared, 48);
    cr_assert(!c.shared_gate && c.norm_topk);
    cr_assert_float_eq(c.embed_scale, 12.0f, 0);
    cr_assert_float_eq(c.residual_scale, 0.22f, 0);
    cr_assert_float_eq(c.attn_scale, 0.0078125f, 0);
    cr_assert_float_eq(c.logit_scale, 0.125f, 0);
    /* Granite's attention_multiplier defaults to 1 (not 1/sqrt(Dh)) */
    cr_assert_eq(parse("{\"architectures\": [\"GraniteForCausalLM\"], " BASE "\"intermediate_size\": 32}", &c),
                 MOE_OK, "%s", moe_last_error());
    cr_assert_float_eq(c.attn_scale, 1.0f, 0);
    cr_assert_eq(c.n_experts, 0);
    /* elsewhere: the math they change is refused by name */
    cr_assert_eq(parse("{\"architectures\": [\"LlamaForCausalLM\"], " BASE "\"intermediate_size\": 32, "
                       "\"logits_scaling\": 8}", &c), MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "logits_scaling is only supported for Granite"), "%s", moe_last_error());
    cr_assert_eq(parse("{\"architectures\": [\"GraniteForCausalLM\"], " BASE "\"intermediate_size\": 32, "
                       "\"residual_multiplier\": -1}", &c), MOE_ERR_FORMAT);
}

/* YaRN frequencies and attention factor against transformers 5.24's
 * _compute_yarn_parameters (every 4th or 8th frequency): gpt-oss's own
 * defaults (truncate false), Qwen3 at factor 4 (truncate true, attention
 * factor from factor), DeepSeek-V2's mscale = mscale_all_dim (factor 1). */
static void check_yarn(const char *json, double want_af, int step, const double *want, int n)
{
    struct moe_config c;
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(c.rope_type, MOE_ROPE_YARN);
    cr_assert_float_eq(c.rope_attn_factor, want_af, 1e-6);
    float inv[64];
    cr_assert_leq(c.rope_dim / 2, 64);
    moe_attention_rope_freqs(inv, &c);
    for (int i = 0; i < n; i++)
        cr_assert_float_eq(inv[i * step], want[i], want[i] * 2e-6, "frequency %d: %g, want %g",
                           i * step, inv[i * step], want[i]);
}

Test(config, yarn_matches_transformers)
{
    static const double gpt_oss[8] = {1.0, 0.22541800141334534, 0.05081327259540558,
                                      0.006794959306716919, 0.0004564839182421565,
                                      1.818833698052913e-05, 4.099978468730114e-06,
                                      9.242089618055616e-07};
    check_yarn("{\"architectures\": [\"GptOssForCausalLM\"], \"hidden_size\": 2880, "
               "\"num_hidden_layers\": 2, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, "
               "\"vocab_size\": 100, \"max_position_embeddings\": 131072}",
               1.3465735902799727, 4, gpt_oss, 8);
    static const double qwen3[8] = {1.0, 0.17782793939113617, 0.03162277862429619,
                                    0.005375321488827467, 0.0006029411451891065,
                                    4.4456985051510856e-05, 7.905693564680405e-06,
                                    1.405853367941745e-06};
    check_yarn("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE "\"head_dim\": 128, "
               "\"intermediate_size\": 96, \"max_position_embeddings\": 131072, "
               "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1000000.0, "
               "\"factor\": 4.0, \"original_max_position_embeddings\": 32768}}",
               1.138629436111989, 8, qwen3, 8);
    static const double mscale[8] = {1.0, 0.3162277638912201, 0.10000000149011612,
                                     0.026879360899329185, 0.005500000435858965,
                                     0.0007905694073997438, 2.499999936844688e-05,
                                     7.905694474175107e-06};
    check_yarn("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE "\"head_dim\": 64, "
               "\"intermediate_size\": 96, \"max_position_embeddings\": 163840, "
               "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40.0, \"beta_fast\": 32, "
               "\"beta_slow\": 1, \"mscale\": 0.707, \"mscale_all_dim\": 0.707, "
               "\"original_max_position_embeddings\": 4096}, \"rope_theta\": 10000.0}",
               1.0, 4, mscale, 8);
}

Test(config, yarn_needs_its_original_context)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE
                       "\"intermediate_size\": 96, \"rope_parameters\": {\"rope_type\": \"yarn\", "
                       "\"factor\": 4.0}}", &c), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "original_max_position_embeddings"), "%s", moe_last_error());
    cr_assert_eq(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE
                       "\"intermediate_size\": 96, \"rope_parameters\": {\"rope_type\": \"yarn\", "
                       "\"factor\": -4.0, \"original_max_position_embeddings\": 64}}", &c),
                 MOE_ERR_FORMAT);
}

/* GptOssConfig's defaults for what a config.json leaves out. */
Test(config, gpt_oss_defaults)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"GptOssForCausalLM\"], \"hidden_size\": 2880, "
                       "\"num_hidden_layers\": 4, \"num_attention_heads\": 64, "
                       "\"num_key_value_heads\": 8, \"vocab_size\": 201088}", &c), MOE_OK, "%s",
                 moe_last_error());
    cr_assert_eq(c.family, MOE_FAMILY_GPT_OSS);
    cr_assert_eq(c.head_dim, 64);
    cr_assert_eq(c.n_experts, 128);
    cr_assert_eq(c.top_k, 4);
    cr_assert_eq(c.d_expert, 2880);
    cr_assert(c.qkv_bias && c.o_bias && c.attn_sinks && c.router_logit_bias && c.expert_bias);
    cr_assert(c.norm_topk && !c.router_sigmoid);
    cr_assert_float_eq(c.swiglu_alpha, 1.702f, 1e-6);
    cr_assert_float_eq(c.swiglu_limit, 7.0f, 1e-6);
    cr_assert_eq(c.sliding_window, 128);
    cr_assert(c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[2] && !c.layer_sliding[3]);
    cr_assert_float_eq(c.rope_theta, 150000.0f, 1e-3);
    cr_assert_eq(c.rope_original_max_pos, 4096);
    cr_assert_float_eq(c.rope_factor, 32.0f, 1e-6);
    cr_assert(!c.rope_truncate);
    cr_assert_float_eq(c.rms_eps, 1e-5f, 1e-12f);
}

Test(config, unknown_quantization_is_refused)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"GptOssForCausalLM\"], " BASE
                       "\"quantization_config\": {\"quant_method\": \"mxfp4\"}}", &c), MOE_OK, "%s",
                 moe_last_error());
    cr_assert(c.experts_mxfp4 && !c.weights_fp8);
    cr_assert_eq(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE
                       "\"moe_intermediate_size\": 32, \"quantization_config\": "
                       "{\"quant_method\": \"mxfp4\"}}", &c), MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "'mxfp4'"), "%s", moe_last_error());
    cr_assert_eq(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE
                       "\"moe_intermediate_size\": 32, \"quantization_config\": "
                       "{\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true}}", &c),
                 MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "'bitsandbytes'"), "%s", moe_last_error());
    cr_assert_eq(parse("{\"architectures\": [\"GptOssForCausalLM\"], " BASE
                       "\"quantization_config\": [1]}", &c), MOE_ERR_FORMAT);
}

/* Four-bit checkpoints: the quantization_config of GPTQ (GPTQModel's
 * keys), AWQ (AutoAWQ's) and compressed-tensors (llm-compressor's W4A16)
 * as released; every variant the loader cannot read is refused by the
 * field and value. */
Test(config, four_bit_checkpoints_are_read)
{
    struct moe_config c;
    const char *qwen = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE
                       "\"moe_intermediate_size\": 32, \"quantization_config\": ";
    char buf[2048];
    const char *ct_w4 = "{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
                        "\"quantization_status\": \"compressed\", \"ignore\": [\"lm_head\"], "
                        "\"kv_cache_scheme\": null, \"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], "
                        "\"format\": \"pack-quantized\", \"input_activations\": null, \"output_activations\": null, "
                        "\"weights\": {\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, "
                        "\"strategy\": \"group\", \"group_size\": 128, \"dynamic\": false, \"actorder\": null}}}}";
    const struct { const char *q; enum moe_q4_method m; bool plus_one; } good[] = {
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"desc_act\": false, \"sym\": true, "
         "\"checkpoint_format\": \"gptq\"}", MOE_Q4_GPTQ, true},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": -1, \"desc_act\": true, \"sym\": false, "
         "\"checkpoint_format\": \"gptq_v2\"}", MOE_Q4_GPTQ, false},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 32}", MOE_Q4_GPTQ, true},
        {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": true, "
         "\"version\": \"gemm\", \"modules_to_not_convert\": [\"gate\"]}", MOE_Q4_AWQ, false},
        {"{\"quant_method\": \"awq\", \"w_bit\": 4, \"q_group_size\": 64, \"zero_point\": true, "
         "\"version\": \"GEMM\"}", MOE_Q4_AWQ, false},
        {ct_w4, MOE_Q4_CT, false},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        snprintf(buf, sizeof buf, "%s%s}", qwen, good[i].q);
        cr_assert_eq(parse(buf, &c), MOE_OK, "%s: %s", good[i].q, moe_last_error());
        cr_expect(c.q4_method == good[i].m && c.q4_zero_plus_one == good[i].plus_one && !c.weights_fp8, "%s",
                  good[i].q);
    }
    const struct { const char *q, *needle; enum moe_status s; } bad[] = {
        {"{\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": 128}", "quantization_config.bits 8",
         MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"gptq\", \"bits\": 3, \"group_size\": 128}", "bits 3", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"gptq\", \"group_size\": 128}", "quantization_config.bits is missing",
         MOE_ERR_FORMAT},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 48}", "group_size 48", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": \"128\"}", "group_size must be an integer",
         MOE_ERR_FORMAT},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": \"marlin\"}",
         "checkpoint_format 'marlin'", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"gemv\"}",
         "version 'gemv'", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": false}",
         "zero_point false", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"config_groups\": {}}",
         "format 'float-quantized'", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\"}",
         "config_groups must be a non-empty object", MOE_ERR_FORMAT},
        {"{\"quant_method\": \"compressed-tensors\", \"quantization_status\": \"frozen\", \"config_groups\": "
         "{\"g\": {}}}", "quantization_status 'frozen'", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\": {\"weights\": "
         "{\"num_bits\": 8, \"type\": \"int\", \"strategy\": \"channel\"}}}}",
         "quantization_config.config_groups.group_0.weights.num_bits 8", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\": {\"weights\": "
         "{\"num_bits\": 4, \"type\": \"float\", \"strategy\": \"group\", \"group_size\": 16}}}}",
         "type 'float'", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\": {\"weights\": "
         "{\"num_bits\": 4, \"type\": \"int\", \"strategy\": \"tensor\"}}}}", "strategy 'tensor'",
         MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\": {\"weights\": "
         "{\"num_bits\": 4, \"type\": \"int\", \"strategy\": \"channel\"}, \"input_activations\": "
         "{\"num_bits\": 8}}}}", "group_0.input_activations is not supported", MOE_ERR_UNSUPPORTED},
        {"{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\": {\"weights\": "
         "{\"num_bits\": 4, \"type\": \"int\", \"strategy\": \"group\", \"group_size\": 128, "
         "\"dynamic\": true}}}}", "dynamic must be false", MOE_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(buf, sizeof buf, "%s%s}", qwen, bad[i].q);
        cr_expect_eq(parse(buf, &c), bad[i].s, "%s: %s", bad[i].q, moe_last_error());
        cr_expect(strstr(moe_last_error(), bad[i].needle), "%s: %s", bad[i].q, moe_last_error());
    }
}

/* fp8 as DeepSeek-V3 and Qwen3-FP8 release it, and transformers'
 * defaults; what would change the math is refused by name. */
Test(config, fp8_block_128_is_read)
{
    struct moe_config c;
    const char *qwen = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE
                       "\"moe_intermediate_size\": 32, \"quantization_config\": ";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s{\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", "
             "\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}}", qwen);
    cr_assert_eq(parse(buf, &c), MOE_OK, "%s", moe_last_error());
    cr_assert(c.weights_fp8 && !c.experts_mxfp4);
    /* absent keys: transformers' defaults; DeepSeek-V3.1's ue8m0 scales */
    snprintf(buf, sizeof buf, "%s{\"quant_method\": \"fp8\", \"scale_fmt\": \"ue8m0\", "
             "\"activation_scheme\": \"DYNAMIC\", \"modules_to_not_convert\": [\"lm_head\"]}}", qwen);
    cr_assert_eq(parse(buf, &c), MOE_OK, "%s", moe_last_error());
    cr_assert(c.weights_fp8);
    const struct { const char *q, *needle; enum moe_status s; } bad[] = {
        {"\"weight_block_size\": [128, 64]", "[128, 64]", MOE_ERR_UNSUPPORTED},
        {"\"weight_block_size\": [1, 32]", "[1, 32]", MOE_ERR_UNSUPPORTED},
        {"\"weight_block_size\": null", "per-tensor", MOE_ERR_UNSUPPORTED},
        {"\"weight_block_size\": [128]", "two integers", MOE_ERR_FORMAT},
        {"\"activation_scheme\": \"static\"", "'static'", MOE_ERR_UNSUPPORTED},
        {"\"fmt\": \"e5m2\"", "fmt 'e5m2'", MOE_ERR_UNSUPPORTED},
        {"\"expert_dtype\": \"fp4\"", "expert_dtype 'fp4'", MOE_ERR_UNSUPPORTED},
        {"\"scale_fmt\": \"e4m3\"", "scale_fmt 'e4m3'", MOE_ERR_UNSUPPORTED},
        {"\"fmt\": 3", "fmt must be a string", MOE_ERR_FORMAT},
        {"\"modules_to_convert\": [\"embed_tokens\"]", "FP8 embeddings", MOE_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(buf, sizeof buf, "%s{\"quant_method\": \"fp8\", %s}}", qwen, bad[i].q);
        cr_expect_eq(parse(buf, &c), bad[i].s, "%s: %s", bad[i].q, moe_last_error());
        cr_expect(strstr(moe_last_error(), bad[i].needle), "%s: %s", bad[i].q, moe_last_error());
    }
    cr_assert_eq(parse("{\"architectures\": [\"GptOssForCausalLM\"], " BASE
                       "\"quantization_config\": {\"quant_method\": \"fp8\"}}", &c), MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "gpt-oss"), "%s", moe_last_error());
}

/* DeepSeek-V3's released config.json (without its fp8 quantization_config):
 * MLA shapes, the sigmoid router, the score scale with yarn's mscale. */
Test(config, deepseek_v3_mla_and_router)
{
    struct moe_config c;
    cr_assert_eq(moe_config_load(&c, MOERUN_SOURCE_DIR "/configs/deepseek-v3.json"), MOE_OK, "%s",
                 moe_last_error());
    cr_assert_eq(c.family, MOE_FAMILY_DEEPSEEK_V3);
    cr_assert_eq(c.kv_lora_rank, 512);
    cr_assert_eq(c.q_lora_rank, 1536);
    cr_assert_eq(c.qk_nope_dim, 128);
    cr_assert_eq(c.v_head_dim, 128);
    cr_assert_eq(c.rope_dim, 64);
    cr_assert_eq(c.head_dim, 576);
    cr_assert_eq(c.n_kv_heads, 1);
    cr_assert(c.rope_interleave);
    cr_assert(c.router_sigmoid && c.router_bias && c.norm_topk);
    cr_assert_eq(c.n_group, 8);
    cr_assert_eq(c.topk_group, 4);
    cr_assert_float_eq(c.routed_scale, 2.5f, 1e-6);
    cr_assert_eq(c.d_shared, 2048);
    cr_assert(!c.layer_moe[2] && c.layer_moe[3]);
    /* 1/sqrt(192) * (0.1 ln 40 + 1)^2 */
    const double m = 0.1 * log(40.0) + 1.0;
    cr_assert_float_eq(c.attn_scale, m * m / sqrt(192.0), 1e-6);
    cr_assert_float_eq(c.rope_attn_factor, 1.0f, 1e-6);
    /* KV per token: 61 layers x 576 values, one row for K and V */
    cr_assert_eq(moe_config_kv_bytes_per_token(&c, MOE_DTYPE_BF16), (size_t)61 * 576 * 2);
}

Test(config, deepseek_refusals_are_named)
{
    struct moe_config c;
    const char *v2 = "{\"architectures\": [\"DeepseekV2ForCausalLM\"], " BASE
                     "\"moe_intermediate_size\": 32, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, ";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s\"topk_method\": \"random\"}", v2);
    cr_assert_eq(parse(buf, &c), MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "'random'"), "%s", moe_last_error());
    snprintf(buf, sizeof buf, "%s\"attention_bias\": true}", v2);
    cr_assert_eq(parse(buf, &c), MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "attention_bias"), "%s", moe_last_error());
    snprintf(buf, sizeof buf, "%s\"moe_layer_freq\": 2}", v2);
    cr_assert_eq(parse(buf, &c), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "moe_layer_freq"), "%s", moe_last_error());
    snprintf(buf, sizeof buf, "%s\"qk_rope_head_dim\": 7}", v2);
    cr_assert_eq(parse(buf, &c), MOE_ERR_FORMAT);
    snprintf(buf, sizeof buf, "%s\"topk_method\": \"group_limited_greedy\"}", v2);
    cr_assert_eq(parse(buf, &c), MOE_ERR_FORMAT, "group_limited_greedy needs n_group");
    snprintf(buf, sizeof buf, "%s\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}}", v2);
    cr_assert_eq(parse(buf, &c), MOE_ERR_UNSUPPORTED);
}

/* Llama-4: what moerun does not compute is refused naming the key; the
 * multimodal checkpoint's text model is read from text_config. */
Test(config, llama4_refusals_and_text_config)
{
    struct moe_config c;
    cr_assert_eq(parse("{\"architectures\": [\"Llama4ForCausalLM\"], \"hidden_size\": 64, \"vocab_size\": 256, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                       "\"num_experts_per_tok\": 2}", &c),
                 MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "num_experts_per_tok = 2"), "%s", moe_last_error());
    cr_assert_eq(parse("{\"architectures\": [\"Llama4ForCausalLM\"], \"hidden_size\": 64, \"vocab_size\": 256, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                       "\"layer_types\": [\"full_attention\", \"sliding_attention\"]}", &c),
                 MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "layer_types[1] = 'sliding_attention'"), "%s", moe_last_error());
    cr_assert_eq(parse("{\"architectures\": [\"Llama4ForConditionalGeneration\"]}", &c), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "'text_config'"), "%s", moe_last_error());
    cr_assert_eq(parse("{\"architectures\": [\"Llama4ForConditionalGeneration\"], \"text_config\": {"
                       "\"hidden_size\": 64, \"vocab_size\": 256, \"num_hidden_layers\": 8, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
                       "\"interleave_moe_layer_step\": 2}}", &c),
                 MOE_OK, "%s", moe_last_error());
    cr_assert_str_eq(c.architecture, "Llama4ForConditionalGeneration");
    cr_assert_str_eq(c.tensor_prefix, "language_model.");
    cr_assert_eq(c.family, MOE_FAMILY_LLAMA4);
    /* Llama4TextConfig's defaults: every 4th layer without RoPE, the others
     * chunked by 8192; every 2nd layer MoE here, the dense ones 16384 wide */
    for (int l = 0; l < 8; l++) {
        cr_expect_eq(c.layer_nope[l], l % 4 == 3, "layer %d", l);
        cr_expect_eq(c.layer_chunked[l], l % 4 != 3, "layer %d", l);
        cr_expect_eq(c.layer_moe[l], l % 2 == 1, "layer %d", l);
    }
    cr_expect_eq(c.attn_chunk, 8192);
    cr_expect_eq(c.d_ff, 16384);
    cr_expect_eq(c.d_expert, 8192);
    cr_expect_eq(c.d_shared, 8192);
    cr_expect(c.qk_l2_norm && c.router_scales_input && c.attn_temp_floor == 8192);
}

/* Qwen3_5MoeForConditionalGeneration: the text model from text_config,
 * its tensors under model.language_model.; the tying is the root's
 * (Qwen3_5MoeConfig's, default false), whatever text_config says. */
Test(config, qwen3_5_moe_text_config_and_its_tying)
{
    struct moe_config c;
    const char *text = "\"text_config\": {\"hidden_size\": 64, \"vocab_size\": 256, \"num_hidden_layers\": 4, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
                       "\"num_experts\": 8, \"tie_word_embeddings\": %s}";
    char tc[512], json[1024];
    snprintf(tc, sizeof tc, text, "false");
    snprintf(json, sizeof json, "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], "
             "\"tie_word_embeddings\": true, %s}", tc);
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    cr_assert_str_eq(c.architecture, "Qwen3_5MoeForConditionalGeneration");
    cr_assert_str_eq(c.tensor_prefix, "model.language_model.");
    cr_assert_str_eq(c.tensor_prefix_to, "model.");
    cr_assert_eq(c.family, MOE_FAMILY_QWEN3_5_MOE);
    cr_expect(c.tie_embeddings, "the root's true");
    /* Qwen3_5MoeTextConfig's defaults: every 4th layer full attention, a
     * quarter of each head rotated, top-8, always renormalised */
    for (int l = 0; l < 4; l++) cr_expect_eq(c.layer_linear[l], l != 3, "layer %d", l);
    cr_expect_eq(c.rope_dim, 4);
    cr_expect_eq(c.top_k, 8);
    cr_expect(c.norm_topk && c.attn_out_gate && c.norm_plus_one && c.shared_gate);
    snprintf(tc, sizeof tc, text, "true");
    snprintf(json, sizeof json, "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], %s}", tc);
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    cr_expect(!c.tie_embeddings, "the root's default false");
}

/* DeepSeek-V3.2: V3's keys plus the indexer's (index_topk 2048,
 * index_n_heads 64, index_head_dim 128 when absent); its indexer reads the
 * q LoRA, so a config without one is refused, naming it. */
Test(config, deepseek_v32_indexer)
{
    struct moe_config c;
    const char *base = "{\"architectures\": [\"DeepseekV32ForCausalLM\"], \"hidden_size\": 64, "
                       "\"vocab_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                       "\"n_routed_experts\": 16, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, "
                       "\"qk_rope_head_dim\": 8, \"v_head_dim\": 12, \"q_lora_rank\": %s}";
    char json[1024];
    snprintf(json, sizeof json, base, "24");
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    cr_expect_eq(c.family, MOE_FAMILY_DEEPSEEK_V3);
    cr_expect_eq(c.dsa_topk, 2048);
    cr_expect_eq(c.dsa_heads, 64);
    cr_expect_eq(c.dsa_dim, 128);
    cr_expect_eq(c.max_pos, 163840, "DeepseekV32Config's default");
    /* the indexer's keys: 128 F32 per layer and token beside the latent row */
    cr_expect_eq(moe_config_dsa_bytes_per_token(&c), (size_t)2 * 128 * 4);
    cr_expect_eq(moe_config_kv_bytes_per_token(&c, MOE_DTYPE_BF16), (size_t)2 * (8 + 32) * 2 + 2 * 128 * 4);
    cr_expect(!c.layer_moe[0] && !c.layer_moe[1], "first_k_dense_replace 3 by default");
    snprintf(json, sizeof json, base, "24, \"mlp_layer_types\": [\"dense\", \"sparse\"]");
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    cr_expect(!c.layer_moe[0] && c.layer_moe[1], "mlp_layer_types decides");
    snprintf(json, sizeof json, base, "null");
    cr_assert_eq(parse(json, &c), MOE_ERR_FORMAT);
    cr_expect(strstr(moe_last_error(), "q_lora_rank is null"), "%s", moe_last_error());
}

/* GLM-MoE-DSA (GLM-5): DeepSeek-V3.2's sparse attention with GLM-5's
 * defaults (GlmMoeDsaConfig: index_n_heads 32, q_lora_rank 2048,
 * qk_nope_head_dim 192, v_head_dim 256, one expert group, rms_norm_eps
 * 1e-5, context 202752), the indexer rotating interleaved pairs, and each
 * layer's indexer "full" or "shared" as GlmMoeDsaConfig derives it:
 * indexer_types, else index_topk_pattern (a string of F / S or a list),
 * else layer l is full when max(l - index_skip_topk_offset + 1, 0) is a
 * multiple of index_topk_freq (defaults 2 and 1: all full).  A shared
 * layer keeps no indexer keys; a shared layer 0 is refused, naming the
 * field. */
Test(config, glm_moe_dsa_indexer_types)
{
    struct moe_config c;
    const char *base = "{\"architectures\": [\"GlmMoeDsaForCausalLM\"], \"hidden_size\": 64, "
                       "\"vocab_size\": 256, \"num_hidden_layers\": 8, \"num_attention_heads\": 4, "
                       "\"n_routed_experts\": 16, \"kv_lora_rank\": 32, \"qk_rope_head_dim\": 8%s}";
    char json[1024];
    snprintf(json, sizeof json, base, "");
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    cr_expect_eq(c.family, MOE_FAMILY_DEEPSEEK_V3);
    cr_expect_eq(c.dsa_topk, 2048);
    cr_expect_eq(c.dsa_heads, 32, "GlmMoeDsaConfig's index_n_heads");
    cr_expect_eq(c.dsa_dim, 128);
    cr_expect(c.dsa_rope_interleave && c.rope_interleave);
    cr_expect_eq(c.q_lora_rank, 2048);
    cr_expect_eq(c.qk_nope_dim, 192);
    cr_expect_eq(c.v_head_dim, 256);
    cr_expect_eq(c.n_group, 1);
    cr_expect_eq(c.topk_group, 1);
    cr_expect_eq(c.max_pos, 202752);
    cr_expect_float_eq(c.rms_eps, 1e-5f, 1e-12);
    cr_expect_eq(moe_config_dsa_layers(&c), 8, "index_topk_freq 1: every layer full");
    cr_expect_eq(moe_config_dsa_bytes_per_token(&c), (size_t)8 * 128 * 4);
    /* freq 3, offset 2 (transformers: full, full, shared, shared, full, shared, shared, full) */
    const bool want_freq[8] = {false, false, true, true, false, true, true, false};
    snprintf(json, sizeof json, base, ", \"index_topk_freq\": 3");
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    for (int l = 0; l < 8; l++) cr_expect_eq(c.layer_dsa_shared[l], want_freq[l], "layer %d", l);
    cr_expect_eq(moe_config_dsa_layers(&c), 4);
    cr_expect_eq(moe_config_dsa_layer(&c, 4), 2, "layers 0 and 1 before it run an indexer");
    cr_expect_eq(moe_config_dsa_layer(&c, 7), 3);
    /* only the 4 full layers' keys: 4 x 128 F32 per token beside 8 latent rows of 8 + 32 bf16 */
    cr_expect_eq(moe_config_dsa_bytes_per_token(&c), (size_t)4 * 128 * 4);
    cr_expect_eq(moe_config_kv_bytes_per_token(&c, MOE_DTYPE_BF16), (size_t)8 * (8 + 32) * 2 + 4 * 128 * 4);
    /* freq 2, offset 3 (transformers: full, full, full, shared, full, shared, full, shared) */
    const bool want_off[8] = {false, false, false, true, false, true, false, true};
    snprintf(json, sizeof json, base, ", \"index_topk_freq\": 2, \"index_skip_topk_offset\": 3");
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    for (int l = 0; l < 8; l++) cr_expect_eq(c.layer_dsa_shared[l], want_off[l], "layer %d", l);
    /* the pattern (string or list) over the schedule; indexer_types over both */
    const bool want_pat[8] = {false, true, false, true, true, false, false, true};
    snprintf(json, sizeof json, base, ", \"index_topk_freq\": 3, \"index_topk_pattern\": \"FSFSSFFS\"");
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    for (int l = 0; l < 8; l++) cr_expect_eq(c.layer_dsa_shared[l], want_pat[l], "layer %d", l);
    cr_expect_eq(moe_config_dsa_layers(&c), 4);
    snprintf(json, sizeof json, base, ", \"index_topk_pattern\": [\"full\", \"shared\", \"full\", \"shared\", "
             "\"shared\", \"full\", \"full\", \"shared\"]");
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    for (int l = 0; l < 8; l++) cr_expect_eq(c.layer_dsa_shared[l], want_pat[l], "layer %d", l);
    snprintf(json, sizeof json, base, ", \"index_topk_pattern\": \"FSSSSSSS\", \"indexer_types\": [\"full\", "
             "\"shared\", \"full\", \"shared\", \"shared\", \"full\", \"full\", \"shared\"]");
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    for (int l = 0; l < 8; l++) cr_expect_eq(c.layer_dsa_shared[l], want_pat[l], "layer %d", l);
    /* refused, naming the field: a shared first layer, a bad entry, too few entries */
    const struct { const char *keys, *msg; } bad[] = {
        {", \"index_topk_freq\": 2, \"index_skip_topk_offset\": 0", "layer 0 is \"shared\" (index_topk_freq"},
        {", \"indexer_types\": [\"shared\", \"full\", \"full\", \"full\", \"full\", \"full\", \"full\", "
         "\"full\"]", "layer 0 is \"shared\" (indexer_types)"},
        {", \"index_topk_pattern\": \"SFFFFFFF\"", "(index_topk_pattern)"},
        {", \"index_topk_pattern\": \"FSFX FFF\"", "index_topk_pattern[3] = 'X'"},
        {", \"indexer_types\": [\"full\", \"dense\"]", "indexer_types must be a list of at least 8"},
        {", \"index_topk_pattern\": \"FSF\"", "fewer than the 8 layers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(json, sizeof json, base, bad[i].keys);
        cr_assert_eq(parse(json, &c), MOE_ERR_FORMAT, "%s", bad[i].keys);
        cr_expect(strstr(moe_last_error(), bad[i].msg), "%s: %s", bad[i].keys, moe_last_error());
    }
    /* DeepSeek-V3.2 reads none of these: every layer full */
    snprintf(json, sizeof json, "{\"architectures\": [\"DeepseekV32ForCausalLM\"], \"hidden_size\": 64, "
             "\"vocab_size\": 256, \"num_hidden_layers\": 8, \"num_attention_heads\": 4, \"n_routed_experts\": 16, "
             "\"kv_lora_rank\": 32, \"qk_rope_head_dim\": 8, \"index_topk_pattern\": \"FSFSFSFS\"}");
    cr_assert_eq(parse(json, &c), MOE_OK, "%s", moe_last_error());
    cr_expect_eq(moe_config_dsa_layers(&c), 8);
    cr_expect(!c.dsa_rope_interleave);
}
