/* experts_cpu.c - CPU reference of the grouped expert FFN (see experts.h). */
#include "experts/experts.h"

#include <math.h>
#include <string.h>

#include "runtime/core/par.h"
#include "runtime/cpu/gemm.h"

void moe_experts_swiglu_cpu(float *g, const float *u, size_t n)
{
    if (!moe_par_worth(n, 65536)) {
        for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void moe_experts_ffn_cpu(float *out, const float *x, const struct moe_dispatch *plan,
                         const float *w, const struct moe_expert_weights *ex,
                         const struct moe_expert_ws *ws, int T, int K, int D, int F, int E,
                         float *scratch)
{
    const int e0 = plan->hi > 0 ? plan->lo : 0, e1 = plan->hi > 0 ? plan->hi : E;
    /* gather the rows of experts e0..e1 in expert order */
    for (int r = plan->offsets[e0]; r < plan->offsets[e1]; r++)
        memcpy(ws->xe + (size_t)r * D, x + (size_t)(plan->perm[r] / K) * D, (size_t)D * sizeof(float));
    /* one GEMM per projection per expert over its contiguous rows */
    for (int e = e0; e < e1; e++) {
        const int r0 = plan->offsets[e], c = plan->counts[e];
        if (c == 0) continue;
        float *g = ws->g + (size_t)r0 * F, *u = ws->u + (size_t)r0 * F;
        const enum moe_dtype dt = moe_expert_dtype(ex, e);
        const int32_t *cin = ex->cols ? ex->cols[2 * e] : NULL, *cdown = ex->cols ? ex->cols[2 * e + 1] : NULL;
        struct moe_tensor vg, vu, vd;
        if (cin) moe_experts_permute_rows(ws->xe + (size_t)r0 * D, c, D, cin, scratch);
        moe_gemm_cpu(g, F, ws->xe + (size_t)r0 * D, D, ex->gate[e], dt, F, D, c,
                     moe_experts_bias_row(&ex->b_gate, e, &vg), scratch);
        moe_gemm_cpu(u, F, ws->xe + (size_t)r0 * D, D, ex->up[e], dt, F, D, c,
                     moe_experts_bias_row(&ex->b_up, e, &vu), scratch);
        for (size_t i = 0; i < (size_t)c * F; i++) g[i] = moe_experts_act(g[i], u[i], ex->alpha, ex->limit);
        if (cdown) moe_experts_permute_rows(g, c, F, cdown, scratch);
        moe_gemm_cpu(ws->ye + (size_t)r0 * D, D, g, F, ex->down[e], moe_expert_down_dtype(ex, e), D, F, c,
                     moe_experts_bias_row(&ex->b_down, e, &vd), scratch);
    }
    if (plan->hi > 0) return; /* expert parallelism: the caller combines */
    /* weighted combine in token order, k = 0..K-1 */
#pragma omp parallel if ((size_t)T * D > 65536)
    moe_experts_combine_cpu(out, ws->ye, w, plan->pos, T, K, D);
}

void moe_experts_combine_cpu(float *out, const float *ye, const float *w, const int32_t *pos,
                             int T, int K, int D)
{
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int k = 0; k < K; k++) {
            const float wk = w[(size_t)t * K + k];
            const float *y = ye + (size_t)pos[t * K + k] * D;
            for (int d = 0; d < D; d++) o[d] += wk * y[d];
        }
    }
}
