/* model_impl.h - what model.c shares with the family binders beside it
 * (model_gptoss.c). */
#pragma once

#include "runtime/model.h"

#define MOE_NAME_MAX 256

/* Binds `name` to *out, checking a float dtype (F32, F16, BF16) and the
 * shape (ndim dims of d0, d1, d2).  An absent optional tensor leaves *out
 * zeroed. */
MOE_MUST_USE enum moe_status moe_model_bind_tensor(const struct moe_model *m, struct moe_tensor *out,
                                                    bool required, const char *name, int ndim,
                                                    int64_t d0, int64_t d1, int64_t d2);
/* bytes of zeroed memory the model owns (freed by moe_model_free). */
MOE_MUST_USE enum moe_status moe_model_own(struct moe_model *m, size_t bytes, void **out);
/* Rewrites float view t to an F32 copy the model owns. */
MOE_MUST_USE enum moe_status moe_model_widen_f32(struct moe_model *m, struct moe_tensor *t);

/* gpt-oss (model_gptoss.c): layer l's attention sinks, and its MoE block
 * (router with bias, experts with biases in either checkpoint layout). */
MOE_MUST_USE enum moe_status moe_model_bind_gpt_oss_sinks(struct moe_model *m, int l,
                                                           struct moe_layer_weights *w);
MOE_MUST_USE enum moe_status moe_model_bind_gpt_oss_moe(struct moe_model *m, int l,
                                                         struct moe_layer_weights *w);

/* MLA (model_deepseek.c): layer l's attention weights (model.h). */
MOE_MUST_USE enum moe_status moe_model_bind_mla(struct moe_model *m, int l, struct moe_layer_weights *w);
