/* config_impl.h - what config.c shares with the files that parse a family's
 * own keys (config_llama4.c, config_qwen3next.c, config_deepseek.c) and
 * quantization_config (config_quant.c). */
#pragma once

#include <jansson.h>

#include "runtime/model/config.h"

/* quantization_config of root (absent or null: nothing) into c's
 * weights_fp8, experts_mxfp4, q4_method and q4_zero_plus_one; c->family is
 * set.  Messages start with what. */
MOE_MUST_USE enum moe_status moe_config_parse_quantization(struct moe_config *c, json_t *root, const char *what);

/* config.c's typed field access: absent or null -> def (get_int: an error
 * when required); a wrong type or a value outside [lo, hi] -> an error
 * naming the key. */
MOE_MUST_USE enum moe_status moe_config_get_int(json_t *root, const char *what, const char *key, long long lo,
                                                long long hi, int def, bool required, int *out);
MOE_MUST_USE enum moe_status moe_config_get_num(json_t *root, const char *what, const char *key, double def,
                                                double *out);
MOE_MUST_USE enum moe_status moe_config_get_bool(json_t *root, const char *what, const char *key, bool def,
                                                 bool *out);
/* YaRN's mscale(scale, mscale): 0.1 mscale ln(scale) + 1, 1 for scale <= 1. */
double moe_config_yarn_mscale(double scale, double mscale);

/* DeepSeek's multi-head latent attention (config_deepseek.c), c->family,
 * architecture, RoPE set: the LoRA ranks, the head widths, n_kv_heads 1
 * and the score scale.  moe_config_parse_dsa, after it: DeepSeek sparse
 * attention's indexer (DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM). */
MOE_MUST_USE enum moe_status moe_config_parse_mla(struct moe_config *c, json_t *root, const char *what);
MOE_MUST_USE enum moe_status moe_config_parse_dsa(struct moe_config *c, json_t *root, const char *what);

/* Llama-4's keys (config_llama4.c), c->family, n_layers, head_dim set:
 * the experts, the shared expert and the dense width, the routing, the
 * layers without RoPE, chunked attention, the q/k L2 norm and the
 * attention temperature.  moe_config_llama4_layers: which layers are MoE
 * (moe_layers, else every interleave_moe_layer_step-th). */
MOE_MUST_USE enum moe_status moe_config_parse_llama4(struct moe_config *c, json_t *root, const char *what);
MOE_MUST_USE enum moe_status moe_config_llama4_layers(struct moe_config *c, json_t *root, const char *what);
/* Llama4ForConditionalGeneration's root: its text_config read as a
 * Llama4ForCausalLM's (moe_config_parse), tensor_prefix "language_model.". */
MOE_MUST_USE enum moe_status moe_config_parse_llama4_text(struct moe_config *c, json_t *root, const char *what);

/* Qwen3-Next's keys (config_qwen3next.c), c->family, n_layers, head_dim
 * set: the Gated DeltaNet geometry (linear_*), layer_types (else every
 * full_attention_interval-th layer full attention), the gated attention
 * output and the zero-centred norms. */
MOE_MUST_USE enum moe_status moe_config_parse_linear(struct moe_config *c, json_t *root, const char *what);
/* A multimodal root's text_config (owner names the root's architecture
 * in messages), copied, with architectures [arch]: *out owned by the
 * caller. */
MOE_MUST_USE enum moe_status moe_config_text_copy(json_t *root, const char *what, const char *owner, const char *arch,
                                                  json_t **out);
/* Qwen3_5MoeForConditionalGeneration's root: its text_config read as a
 * Qwen3_5MoeForCausalLM's, tensors model.language_model.* read as model.*
 * (the vision tower, model.visual.*, is not read). */
MOE_MUST_USE enum moe_status moe_config_parse_qwen3_5_text(struct moe_config *c, json_t *root, const char *what);
