/* experts_cuda.cuh - what the expert kernels of experts_cuda.cu (decode
 * kernels, grouped-path activation) and experts_mma_cuda.cu (tensor-core
 * GEMMs) share: gpt-oss's expert biases and activation parameters, read
 * once from the model's expert table on the host and passed to the
 * kernels by value.  Included only by those two .cu files. */
#pragma once

#include <stddef.h>

#include "experts/experts.h"

/* gpt-oss's expert biases (F32, device; NULL elsewhere) and activation
 * (moe_experts_act). */
struct expert_extra {
    const float *b_gate, *b_up, *b_down; /* (E, F), (E, F), (E, D) */
    float alpha, limit;
};

/* ex's biases and activation; ex NULL: none (plain SwiGLU). */
static inline struct expert_extra extra_of(const struct moe_expert_weights *ex)
{
    struct expert_extra xb = {NULL, NULL, NULL, 0.0f, 0.0f};
    if (!ex) return xb;
    xb.b_gate = (const float *)ex->b_gate.data;
    xb.b_up = (const float *)ex->b_up.data;
    xb.b_down = (const float *)ex->b_down.data;
    xb.alpha = ex->alpha;
    xb.limit = ex->limit;
    return xb;
}
