/* experts.h - the grouped expert FFN of a MoE layer and the weighted combine.
 *
 * Given the dispatch plan, the T*K routed rows are gathered in expert order
 * so each expert's rows are contiguous; every expert then runs
 * down(SwiGLU(gate(x), up(x))) over its rows as one small GEMM per projection
 * (grouped GEMM); the results are combined back in token order,
 * out[t] = sum_{k=0..K-1} w[t,k] * y[t,k], in that fixed order.  Mirrors the
 * MixtralExperts / Qwen3MoeExperts modules of transformers. */
#pragma once

#include "runtime/backend.h"
#include "runtime/gemm_fast.h"

#ifdef __cplusplus
extern "C" {
#endif

/* silu(x) * u, elementwise into g. */
void moe_experts_swiglu_cpu(float *g, const float *u, size_t n);
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

#ifdef __cplusplus
}
#endif
