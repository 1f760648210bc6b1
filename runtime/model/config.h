/* config.h - the model description, parsed from a Hugging Face config.json.
 *
 * One struct describes every supported family; family-specific behaviour is
 * carried by explicit fields (qk_norm, shared expert, renormalisation) so the
 * forward pass never switches on the family name.  Shape letters (see
 * docs/ARCHITECTURE.md): L layers, D hidden, V vocabulary, Hq/Hkv heads,
 * Dh head dim, E experts, K experts per token, F expert FFN width. */
#pragma once

#include <jansson.h>
#include <stdbool.h>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_family {
    MOE_FAMILY_MIXTRAL,
    MOE_FAMILY_QWEN2_MOE,
    MOE_FAMILY_QWEN3_MOE,
    MOE_FAMILY_OLMOE,
    MOE_FAMILY_LLAMA,
    MOE_FAMILY_QWEN2,
    MOE_FAMILY_QWEN3,
    MOE_FAMILY_GLM4_MOE,
    MOE_FAMILY_GRANITE_MOE,        /* GraniteMoeForCausalLM, GraniteMoeSharedForCausalLM */
    MOE_FAMILY_GRANITE,            /* GraniteForCausalLM (dense) */
    MOE_FAMILY_GPT_OSS,            /* GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b) */
    MOE_FAMILY_DEEPSEEK_V2,        /* DeepseekV2ForCausalLM (DeepSeek-V2, V2-Lite, V2.5) */
    MOE_FAMILY_DEEPSEEK_V3,        /* DeepseekV3ForCausalLM (DeepSeek-V3, R1, Kimi-K2, Moonlight) */
    MOE_FAMILY_MINIMAX_M2,         /* MiniMaxM2ForCausalLM (MiniMax-M2) */
    MOE_FAMILY_LLAMA4,             /* Llama4ForCausalLM (the text model of Llama-4 Scout, Maverick) */
    MOE_FAMILY_QWEN3_NEXT,         /* Qwen3NextForCausalLM (Qwen3-Next-80B-A3B): linear attention */
    MOE_FAMILY_QWEN3_5_MOE,        /* Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration (text):
                                      Qwen3.5-MoE, linear attention */
};

enum moe_qk_norm {
    MOE_QK_NORM_NONE,
    MOE_QK_NORM_HEAD, /* RMSNorm over each head's Dh values (Qwen3) */
    MOE_QK_NORM_FULL, /* RMSNorm over the whole Hq*Dh / Hkv*Dh projection (OLMoE) */
};

enum moe_rope_type { MOE_ROPE_DEFAULT, MOE_ROPE_LINEAR, MOE_ROPE_LLAMA3, MOE_ROPE_YARN };

#define MOE_MAX_LAYERS 1024
#define MOE_MAX_EXPERT_GROUPS 64 /* n_group */

/* Four-bit checkpoint formats (quantization_config.quant_method). */
enum moe_q4_method { MOE_Q4_NONE, MOE_Q4_GPTQ, MOE_Q4_AWQ, MOE_Q4_CT };

struct moe_config {
    enum moe_family family;
    char architecture[64];
    char tensor_prefix[32]; /* replaced by tensor_prefix_to in the checkpoint's tensor names at load:
                               "language_model." for Llama4ForConditionalGeneration's text model,
                               "model.language_model." for Qwen3_5MoeForConditionalGeneration's;
                               else empty */
    char tensor_prefix_to[16]; /* "" (Llama-4), "model." (Qwen3.5-MoE) */
    int n_layers;      /* L */
    int n_mtp_layers;  /* num_nextn_predict_layers: multi-token-prediction layers
                          the checkpoint declares after the L (not run) */
    int d_model;       /* D */
    int vocab;         /* V */
    int n_heads;       /* Hq */
    int n_kv_heads;    /* Hkv */
    int head_dim;      /* Dh */
    int max_pos;       /* max_position_embeddings */
    float rms_eps;
    bool tie_embeddings;
    bool qkv_bias;     /* q/k/v projections have biases */
    bool o_bias;       /* output projection has a bias */
    bool mlp_bias;     /* dense FFN projections have biases (Llama mlp_bias) */
    enum moe_qk_norm qk_norm;
    float clip_qkv;    /* 0: none; else q,k,v clamped to [-clip, clip] (OLMoE) */
    int sliding_window; /* window W for layers with layer_sliding[l]: a query at
                           position p sees keys p-W+1..p (HF's convention) */
    bool layer_sliding[MOE_MAX_LAYERS];
    bool attn_sinks;   /* gpt-oss: a learned logit per query head (self_attn.sinks) joins each
                          softmax's denominator (attention.h) */
    /* Multi-head latent attention (DeepSeek-V2/V3), when kv_lora_rank > 0.
     * Keys and values of every head come from one latent per token, so the
     * cache holds one row per token: the rotated key part (rope_dim values),
     * then the normalised latent (kv_lora_rank), read as both K and V;
     * n_kv_heads is 1 and head_dim is rope_dim + kv_lora_rank, the width of
     * that row and of each absorbed query head (runtime/engine/forward_mla.c). */
    int kv_lora_rank;
    int q_lora_rank;   /* 0: q_proj; else q_a_proj, q_a_layernorm, q_b_proj */
    int qk_nope_dim;   /* per head: key/query values without position */
    int v_head_dim;    /* per head: value width */
    bool rope_interleave; /* rotated values stored in pairs (2i, 2i+1): rows reordered at load */
    /* DeepSeek sparse attention (DeepseekV32ForCausalLM,
     * GlmMoeDsaForCausalLM; dsa_topk 0 elsewhere): each layer's lightning
     * indexer scores every past key of a query, sum over its dsa_heads
     * heads h of w_h relu(q_h . k) / sqrt(dsa_dim), with q_h from the q LoRA
     * (self_attn.indexer.wq_b), k one LayerNorm-ed key per token (wk,
     * k_norm; cached beside the latent rows), both rotated over their first
     * rope_dim values in halves (DeepSeek-V3.2) or in interleaved pairs
     * (dsa_rope_interleave, GLM-MoE-DSA: wq_b's and wk's rows and k_norm's
     * values reordered at load to the halves order, the same permutation
     * for query and key, so every score is transformers'), w = weights_proj
     * x / sqrt(dsa_heads); the query attends only to its dsa_topk best keys
     * (all of them while it has no more).  GLM-MoE-DSA's "shared" layers
     * (layer_dsa_shared, from indexer_types) have no indexer and keep no
     * indexer keys: they attend to the keys the last full layer before
     * them chose for the same row (layer 0 is always full). */
    int dsa_topk, dsa_heads, dsa_dim;
    bool dsa_rope_interleave;
    bool layer_dsa_shared[MOE_MAX_LAYERS];

    /* RoPE */
    enum moe_rope_type rope_type;
    float rope_theta;
    int rope_dim;                  /* each head's first rope_dim values are rotated, the rest
                                      pass (partial_rotary_factor); even, <= Dh */
    float rope_factor;             /* linear, llama3, yarn */
    float rope_low_freq_factor;    /* llama3 */
    float rope_high_freq_factor;   /* llama3 */
    int rope_original_max_pos;     /* llama3, yarn */
    float rope_mscale_all_dim;     /* yarn: mscale_all_dim, 0 if absent (MLA's score scale) */
    float rope_beta_fast, rope_beta_slow; /* yarn: the ramp between extrapolated and
                                             interpolated frequencies */
    bool rope_truncate;            /* yarn: the ramp's ends rounded to whole dimensions */
    float rope_attn_factor;        /* yarn: cos and sin times it (transformers'
                                      attention_scaling), so every score times its square;
                                      1 otherwise (0 also means none) */

    /* FFN.  A layer is either dense (width d_ff) or MoE (E experts of width
     * d_expert, plus an optional shared expert of width d_shared). */
    int d_ff;          /* dense FFN width (0 if the model has no dense layer) */
    int n_experts;     /* E; 0 for a dense model */
    int top_k;         /* K */
    int d_expert;      /* F */
    int d_shared;      /* shared expert width; 0 = none */
    bool shared_gate;  /* shared expert output scaled by sigmoid(x . w) (Qwen2-MoE) */
    bool norm_topk;    /* renormalise the K chosen probabilities to sum to 1 */
    bool router_logit_bias; /* gpt-oss: the router is a Linear with a bias (mlp.router.bias) */
    bool expert_bias;  /* gpt-oss: gate, up and down projections of experts have biases */
    /* Expert activation.  0, 0: silu(g) * u.  gpt-oss (swiglu_alpha, swiglu_limit):
     * g = min(g, limit), u = clamp(u, -limit, limit), g * sigmoid(alpha * g) * (u + 1). */
    float swiglu_alpha, swiglu_limit;
    bool experts_mxfp4; /* quantization_config mxfp4: expert matrices stored as MXFP4
                           (runtime/core/tensor.h), the rest as the checkpoint's float dtype */
    bool weights_fp8;   /* quantization_config fp8, blocks [128, 128]: Linear weights may be
                           stored as F8_E4M3 with a `weight_scale_inv` (runtime/model/model_fp8.c),
                           bound as MOE_DTYPE_FP8_B128 */
    enum moe_q4_method q4_method; /* quantization_config gptq, awq or compressed-tensors
                           pack-quantized: Linear weights may be four-bit
                           (runtime/model/model_q4.c), bound as Q4_G32 / Q4_G128 */
    bool q4_zero_plus_one; /* gptq, checkpoint_format gptq (v1): qzeros hold z - 1 */
    /* Router scoring (router/router.h): softmax over E, or (GLM-4.5,
     * DeepSeek-V3) sigmoid per expert, chosen by sigmoid + a per-expert
     * bias among the topk_group best of n_group expert groups, weighted by
     * the unbiased sigmoid, times routed_scale. */
    /* Softmax routers may be group-limited too (DeepSeek-V2's
     * group_limited_greedy: groups scored by their best expert), and scaled. */
    bool router_sigmoid;
    bool router_bias;  /* e_score_correction_bias (E) per MoE layer */
    int n_group, topk_group; /* 1, 1: no groups */
    float routed_scale; /* routed_scaling_factor; 1 */
    bool layer_moe[MOE_MAX_LAYERS]; /* per layer: MoE (true) or dense FFN */

    /* Llama-4 (none elsewhere).  Layers without RoPE (no_rope_layers[l]
     * = 0); chunked attention: a query at position p sees the keys from
     * p - p % attn_chunk to p; the RoPE layers' q and k divided by their
     * RMS over each head (use_qk_norm: an RMSNorm without a weight); on
     * the layers without RoPE, queries at position p scaled by
     * log1p(floor((p + 1) / attn_temp_floor)) * attn_temp_scale + 1
     * (attn_temperature_tuning; attn_temp_floor 0: none).  The rope
     * values of each head are stored in interleaved pairs (rope_interleave):
     * q_proj's and k_proj's rows are reordered at load. */
    bool layer_nope[MOE_MAX_LAYERS];
    bool layer_chunked[MOE_MAX_LAYERS];
    int attn_chunk;
    bool qk_l2_norm;
    int attn_temp_floor;
    float attn_temp_scale;
    /* Llama-4's router: the top-K by the router logits; the chosen
     * expert's input is x * sigmoid(logit) and its output is not weighted
     * (top-1 only: moe_config_parse refuses more). */
    bool router_scales_input;

    /* Hybrid linear attention (Qwen3-Next; none elsewhere).  Layers with
     * layer_linear[l] run a Gated DeltaNet instead of attention: a
     * projection to q, k (lin_k_heads heads of lin_k_dim) and v
     * (lin_v_heads of lin_v_dim), a causal depthwise convolution of width
     * lin_conv over them and SiLU, then per value head the delta rule over
     * a recurrent state of lin_k_dim x lin_v_dim values, decayed per token
     * (attention/attention.h, moe_delta_params); each value head reads the
     * q/k head h / (lin_v_heads / lin_k_heads).  Its output is RMS-normed
     * per head, times silu(z) of a fourth projection, and projected back.
     * Such layers keep no K/V: the cache holds the attention layers only
     * (moe_config_kv_layer) and a state slot per sequence
     * (moe_config_state_bytes). */
    bool layer_linear[MOE_MAX_LAYERS];
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, lin_conv;
    /* The attention layers' q_proj gives each head's queries and then a
     * gate of Dh values; the attention output times sigmoid(gate) before
     * o_proj (Qwen3-Next). */
    bool attn_out_gate;
    /* RMSNorm weights stored as w - 1: transformers multiplies by 1 + w
     * (Qwen3-Next's zero-centred norms); bound as 1 + w in F32. */
    bool norm_plus_one;

    /* Granite's multipliers (1 elsewhere; 0 also means none, so a zeroed
     * config built by hand needs no setting) */
    float embed_scale;    /* embedding_multiplier: the embedded rows times it */
    float residual_scale; /* residual_multiplier: each block's output times it */
    float attn_scale;     /* attention_multiplier: the score scale; 0 = 1/sqrt(Dh) */
    float logit_scale;    /* 1 / logits_scaling: the logits times it */

    int bos_id, eos_id; /* -1 if absent */
    float init_std;     /* initializer_range: std of synthetic weights */
};

/* Parses config.json at path.  Unknown architectures and unsupported options
 * fail with MOE_ERR_UNSUPPORTED naming the field and value. */
MOE_MUST_USE enum moe_status moe_config_load(struct moe_config *cfg, const char *path);
/* Parses an already-loaded JSON object; `what` names it in messages. */
MOE_MUST_USE enum moe_status moe_config_parse(struct moe_config *cfg, json_t *root,
                                               const char *what);
const char *moe_family_name(enum moe_family f);
/* Number of MoE layers. */
int moe_config_moe_layers(const struct moe_config *cfg);
/* Bytes of the indexer keys per token (DeepSeek sparse attention: F32
 * rows of dsa_dim per layer with an indexer), 0 without; included in
 * moe_config_kv_bytes_per_token. */
size_t moe_config_dsa_bytes_per_token(const struct moe_config *cfg);
/* Layers that run their own indexer (DeepSeek sparse attention; not
 * layer_dsa_shared), 0 without; and the indexer-key layer of model layer
 * l among them (the full layers before it). */
int moe_config_dsa_layers(const struct moe_config *cfg);
int moe_config_dsa_layer(const struct moe_config *cfg, int l);
/* Layers with K/V in the cache (those not layer_linear) and the cache
 * layer of model layer l (the attention layers before it; l itself in a
 * model without linear layers). */
int moe_config_kv_layers(const struct moe_config *cfg);
int moe_config_kv_layer(const struct moe_config *cfg, int l);
/* Linear-attention layers, and the state index of layer l among them. */
int moe_config_linear_layers(const struct moe_config *cfg);
int moe_config_linear_layer(const struct moe_config *cfg, int l);
/* Channels of a linear layer's convolution: q, k and v (2 Hk Dk + Hv Dv). */
int moe_config_conv_dim(const struct moe_config *cfg);
/* F32 values of one linear layer's state per sequence: the convolution's
 * last lin_conv - 1 inputs of each channel, then the (Hv, Dk, Dv)
 * recurrent state; and bytes of a sequence's state over every linear
 * layer (0 for a model without; SIZE_MAX on overflow). */
size_t moe_config_state_floats(const struct moe_config *cfg);
size_t moe_config_state_bytes(const struct moe_config *cfg);
/* Bytes of one cached K or V row of head_dim values in a KV cache of
 * kv_dtype: head_dim elements (F32, F16, BF16), or head_dim E4M3 bytes and
 * the row's f32 scale (F8E4M3, kvcache.h).  SIZE_MAX on overflow or for a
 * dtype no cache holds. */
size_t moe_config_kv_row_bytes(int head_dim, enum moe_dtype kv_dtype);
/* KV cache bytes per token in a cache of kv_dtype (K and V rows of every
 * layer and KV head; MLA: the one latent row).  SIZE_MAX on overflow. */
size_t moe_config_kv_bytes_per_token(const struct moe_config *cfg, enum moe_dtype kv_dtype);

#ifdef __cplusplus
}
#endif
