/* model_impl.h - what model.c shares with the family binders beside it
 * (model_gptoss.c, model_deepseek.c) and the fp8 weights (model_fp8.c). */
#pragma once

#include "runtime/model/model.h"

#define MOE_NAME_MAX 256

/* Binds `name` to *out, checking a float dtype (F32, F16, BF16) and the
 * shape (ndim dims of d0, d1, d2).  An absent optional tensor leaves *out
 * zeroed. */
MOE_MUST_USE enum moe_status moe_model_bind_tensor(struct moe_model *m, struct moe_tensor *out,
                                                    bool required, const char *name, int ndim,
                                                    int64_t d0, int64_t d1, int64_t d2);
/* As moe_model_bind_tensor, for a Linear weight (attention and MLA
 * projections, dense FFN, shared and routed experts; ndim 2 or 3): one
 * stored as F8_E4M3 in a quantization_config fp8 checkpoint is packed with
 * its scales into MOE_DTYPE_FP8_B128 rows the model owns, or, with to_f32
 * (a weight the loader rewrites: MLA's kv_b_proj), dequantized to F32.
 * moe_model_bind_tensor refuses F8_E4M3. */
MOE_MUST_USE enum moe_status moe_model_bind_linear(struct moe_model *m, struct moe_tensor *out, bool required,
                                                    bool to_f32, const char *name, int ndim, int64_t d0,
                                                    int64_t d1, int64_t d2);
/* The FP8 path of moe_model_bind_linear (model_fp8.c): t (F8_E4M3, of the
 * checked shape) and its `weight_scale_inv` into *out; of a stack (3-D),
 * the matrices b with keep[b] 0 are neither read nor written (their
 * memory, zeros, never touched: another rank's experts), keep NULL: all. */
MOE_MUST_USE enum moe_status moe_model_fp8_bind(struct moe_model *m, const struct moe_st_tensor *t,
                                                 const char *name, bool to_f32, const uint8_t *keep,
                                                 struct moe_tensor *out);
/* Four-bit weights (model_q4.c): whether the checkpoint stores the Linear
 * weight PREFIX.weight in its four-bit form (m->cfg.q4_method), and that
 * weight, of shape (N, K), packed into *out as Q4_G32 / Q4_G128 (or, with
 * to_f32, dequantized to F32). */
bool moe_model_q4_present(const struct moe_model *m, const char *prefix);
MOE_MUST_USE enum moe_status moe_model_q4_bind(struct moe_model *m, const char *prefix, int ndim, int64_t N,
                                                int64_t K, bool to_f32, struct moe_tensor *out);
/* Layer l's weights (named model.layers.l.*) into *w: attention, then the
 * MoE block or the dense FFN. */
MOE_MUST_USE enum moe_status moe_model_bind_layer(struct moe_model *m, int l, bool moe,
                                                   struct moe_layer_weights *w);
/* bytes of zeroed memory the model owns (freed by moe_model_free). */
MOE_MUST_USE enum moe_status moe_model_own(struct moe_model *m, size_t bytes, void **out);
/* Frees p (from moe_model_own) at once: memory only the loading needed. */
void moe_model_disown(struct moe_model *m, void *p);
/* Rewrites float view t to an F32 copy the model owns. */
MOE_MUST_USE enum moe_status moe_model_widen_f32(struct moe_model *m, struct moe_tensor *t);

/* gpt-oss (model_gptoss.c): layer l's attention sinks, and its MoE block
 * (router with bias, experts with biases in either checkpoint layout). */
MOE_MUST_USE enum moe_status moe_model_bind_gpt_oss_sinks(struct moe_model *m, int l,
                                                           struct moe_layer_weights *w);
MOE_MUST_USE enum moe_status moe_model_bind_gpt_oss_moe(struct moe_model *m, int l,
                                                         struct moe_layer_weights *w);

/* Experts of layer l as transformers keeps gpt-oss's and Llama-4's:
 * gate_up_proj (E, D, 2F), gate and up outputs interleaved (output 2f is
 * gate f, 2f + 1 up f: gpt-oss) or not (gate f, then up f at F + f:
 * Llama-4), and down_proj (E, F, D); the experts m holds transposed at
 * load into memory the model owns, the others left NULL. */
MOE_MUST_USE enum moe_status moe_model_bind_experts_transposed(struct moe_model *m, int l, const char *gu_name,
                                                               const char *dn_name, bool interleaved,
                                                               struct moe_expert_weights *x);

/* Llama-4 (model_llama4.c): layer l's MoE block (feed_forward.router, the
 * experts as transformers keeps them, feed_forward.shared_expert); the
 * rows of q_proj and k_proj (and their biases) reordered from interleaved
 * rope pairs to halves (rope_interleave) on the RoPE layers; the ones
 * its q/k L2 norm multiplies by (moe_model.qk_ones). */
MOE_MUST_USE enum moe_status moe_model_bind_llama4_moe(struct moe_model *m, int l, struct moe_layer_weights *w);
MOE_MUST_USE enum moe_status moe_model_llama4_rope_rows(struct moe_model *m, int l, struct moe_layer_weights *w);
MOE_MUST_USE enum moe_status moe_model_llama4_ones(struct moe_model *m);

/* MLA (model_deepseek.c): layer l's attention weights (model.h). */
MOE_MUST_USE enum moe_status moe_model_bind_mla(struct moe_model *m, int l, struct moe_layer_weights *w);

/* Qwen3-Next (model_qwen3next.c): layer l's linear_attn.* weights (model.h;
 * the convolution, A_log and dt_bias widened to F32), and every RMSNorm
 * weight w but the Gated DeltaNet's rewritten as 1 + w in F32
 * (cfg.norm_plus_one). */
MOE_MUST_USE enum moe_status moe_model_bind_linear_attn(struct moe_model *m, int l, struct moe_layer_weights *w);
MOE_MUST_USE enum moe_status moe_model_norms_plus_one(struct moe_model *m);
