/* experts.h - the grouped expert FFN of a MoE layer and the weighted combine.
 *
 * Given the dispatch plan, the T*K routed rows are gathered in expert order
 * so each expert's rows are contiguous; every expert then runs
 * down(SwiGLU(gate(x), up(x))) over its rows as one small GEMM per projection
 * (grouped GEMM); the results are combined back in token order,
 * out[t] = sum_{k=0..K-1} w[t,k] * y[t,k], in that fixed order.  Mirrors the
 * MixtralExperts / Qwen3MoeExperts modules of transformers. */
#pragma once

#include <math.h>

#include "router/router.h"
#include "runtime/model/model.h"
#include "runtime/cpu/gemm_fast.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scratch for the expert FFN of one layer (backend memory), sized for
 * T*K rows. */
struct moe_expert_ws {
    float *xe;         /* (T*K, D) gathered inputs in expert order */
    float *g, *u;      /* (T*K, F) gate and up projections, then g = SwiGLU */
    float *ye;         /* (T*K, D) expert outputs in expert order */
};

/* silu(x) * u, elementwise into g. */
void moe_experts_swiglu_cpu(float *g, const float *u, size_t n);
/* The expert activation of one gate value g and up value u: silu(g) * u,
 * or with limit > 0 gpt-oss's clamped form (runtime/model/config.h):
 * g' = min(g, limit), u' = clamp(u, -limit, limit),
 * g' * sigmoid(alpha * g') * (u' + 1).  A NaN stays NaN (as torch.clamp). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline float moe_experts_act(float g, float u, float alpha, float limit)
{
    if (limit > 0) {
        g = g > limit ? limit : g;
        u = u > limit ? limit : u < -limit ? -limit : u;
        return g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
    }
    return g / (1.0f + expf(-g)) * u;
}
/* Expert e's row of a stacked (E, N) bias b: a view, or NULL when b is
 * absent (in *view). */
static inline const struct moe_tensor *moe_experts_bias_row(const struct moe_tensor *b, int e,
                                                            struct moe_tensor *view)
{
    if (!b->data) return NULL;
    *view = (struct moe_tensor){.dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {b->shape[1]},
                                .data = (float *)b->data + (size_t)e * (size_t)b->shape[1],
                                .device = b->device, .cols = NULL};
    return view;
}
/* Row r < rows of x (n wide) reordered in place to x[r][cols[j]] at j
 * (act-order four-bit experts: moe_expert_weights.cols), tmp n floats. */
static inline void moe_experts_permute_rows(float *x, int rows, int n, const int32_t *cols, float *tmp)
{
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * n;
        memcpy(tmp, row, (size_t)n * sizeof(float));
        for (int j = 0; j < n; j++) row[j] = tmp[cols[j]];
    }
}
/* out (T, D); scratch as for moe_gemm_cpu with Din = max(D, F). */
void moe_experts_ffn_cpu(float *out, const float *x, const struct moe_dispatch *plan,
                         const float *w, const struct moe_expert_weights *ex,
                         const struct moe_expert_ws *ws, int T, int K, int D, int F, int E,
                         float *scratch);
/* The weighted combine in token order: out[t] (T, D) = sum over k = 0..K-1,
 * in that order, of w[t*K + k] * ye[pos[t*K + k]], ye (T*K, D) in expert
 * order.  Work-shared (an orphaned `omp for`, so both FFNs use it): inside
 * a parallel region the team splits the tokens, outside one the calling
 * thread does them all; the result is the same. */
void moe_experts_combine_cpu(float *out, const float *ye, const float *w, const int32_t *pos,
                             int T, int K, int D);
/* The fast twin (experts_fast.c): same result within fp32 tolerance, one
 * parallel region, weights converted in registers.  active: (E) ints of
 * scratch.  isa must not be MOE_CPU_ISA_REF. */
void moe_experts_ffn_fast(enum moe_cpu_isa isa, float *out, const float *x,
                          const struct moe_dispatch *plan, const float *w,
                          const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                          int T, int K, int D, int F, int E, int32_t *active);

/* A layer's E experts as the CUDA backend stacks them, in host memory (an
 * offloaded layer's pinned copy, runtime/backend/backend_cuda_offload.c): gate+up
 * (E, 2F, D), each expert's F gate rows then its F up rows, and down
 * (E, D, F); F32, F16 or BF16 rows, or MXFP4 / FP8_B128 planes
 * (runtime/core/tensor.h): the values of every matrix (gate 0, up 0, gate 1,
 * ...; down 0, 1, ...), then their scales in the same order. */
struct moe_expert_stacks {
    enum moe_dtype dtype;
    const void *gu, *dn;
    int E, D, F;
    struct moe_tensor b_gate, b_up, b_down; /* host (E, F), (E, F), (E, D); data NULL: absent */
    float alpha, limit;                  /* the activation's (moe_experts_act) */
};
/* Bytes of scratch moe_experts_ffn_stacks_cpu needs for up to `rows` rows
 * on `threads` threads; 0 on overflow or a bad shape. */
size_t moe_experts_stacks_scratch_bytes(const struct moe_expert_stacks *st, int rows, int threads);
/* The FFN of the n experts list[0..n) of st on the CPU over their rows xe
 * (rows, D), counts[list[0]] rows of list[0] first, then those of list[1],
 * ...: y (rows, D) = down(act(gate x (+ b_gate), up x (+ b_up)))
 * (+ b_down when down_bias), row for row.  The fast kernels' products (isa
 * not REF; planes joined into rows 16 at a time) or the reference's; at
 * most `threads` OpenMP threads, scratch of moe_experts_stacks_scratch_bytes. */
void moe_experts_ffn_stacks_cpu(enum moe_cpu_isa isa, float *y, const float *xe, const int32_t *counts,
                                const int32_t *list, int n, const struct moe_expert_stacks *st, bool down_bias,
                                int threads, void *scratch);

#ifdef __cplusplus
}
#endif
