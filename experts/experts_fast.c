/* experts_fast.c - the fast grouped expert FFN (see experts.h for what it
 * computes; the reference is experts_cpu.c).
 *
 * One parallel region per layer's expert phase, in four work-shared loops:
 *   1. gather the T*K routed rows in expert order;
 *   2. gate and up: work items are (active expert, slice of F); an item
 *      runs the register-blocked kernel over all of its expert's rows for
 *      the gate rows and then the up rows of its slice (the input rows are
 *      still in cache for the second), then SwiGLU on the slice;
 *   3. down: items (active expert, slice of D) over the SwiGLU rows;
 *   4. combine in token order, k = 0..K-1: the reference's own loop
 *      (moe_experts_combine_cpu), work-shared.
 * Slices are sized so there are at least 16 items per thread even when only
 * K experts are active (decode), so every core streams weights; each item
 * reads its weight slice once for all the expert's rows.  The sum order of
 * every output is the fast kernel's, independent of the slicing, so results
 * do not depend on the thread count or on other rows of the batch. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "experts/experts.h"
#include "runtime/gemm_fast.h"

/* Slices of n outputs so that items * slices >= want, each a multiple of
 * 16 outputs (at least 16). */
static int slice_size(int n, int items, int want)
{
    int slices = (want + items - 1) / items;
    int size = (n + slices - 1) / slices;
    size = (size + 15) / 16 * 16;
    return size < 16 ? 16 : size;
}

void moe_experts_ffn_fast(enum moe_cpu_isa isa, float *out, const float *x,
                          const struct moe_dispatch *plan, const float *w,
                          const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                          int T, int K, int D, int F, int E, int32_t *active)
{
    const int n = T * K;
    int na = 0;
    for (int e = 0; e < E; e++)
        if (plan->counts[e] > 0) active[na++] = e;
    const int want = 16 * omp_get_max_threads();
    const int fs = slice_size(F, na, want), ds = slice_size(D, na, want);
    const int nf = (F + fs - 1) / fs, nd = (D + ds - 1) / ds;
    const enum moe_dtype dt = ex->dtype;

#pragma omp parallel if ((size_t)n * D * F > 32768)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++)
            memcpy(ws->xe + (size_t)r * D, x + (size_t)(plan->perm[r] / K) * D,
                   (size_t)D * sizeof(float));

#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < na * nf; i++) {
            const int e = active[i / nf], r0 = plan->offsets[e], c = plan->counts[e];
            const int f0 = (i % nf) * fs, f1 = f0 + fs < F ? f0 + fs : F;
            const float *xe = ws->xe + (size_t)r0 * D;
            float *g = ws->g + (size_t)r0 * F, *u = ws->u + (size_t)r0 * F;
            struct moe_tensor vg, vu;
            moe_gemm_fast_rows(isa, g, (size_t)F, xe, (size_t)D, c, ex->gate[e], dt, D, f0, f1,
                               moe_experts_bias_row(&ex->b_gate, e, &vg));
            moe_gemm_fast_rows(isa, u, (size_t)F, xe, (size_t)D, c, ex->up[e], dt, D, f0, f1,
                               moe_experts_bias_row(&ex->b_up, e, &vu));
            for (int r = 0; r < c; r++) {
                float *gr = g + (size_t)r * F;
                const float *ur = u + (size_t)r * F;
                for (int f = f0; f < f1; f++) gr[f] = moe_experts_act(gr[f], ur[f], ex->alpha, ex->limit);
            }
        }

#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < na * nd; i++) {
            const int e = active[i / nd], r0 = plan->offsets[e], c = plan->counts[e];
            const int d0 = (i % nd) * ds, d1 = d0 + ds < D ? d0 + ds : D;
            struct moe_tensor vd;
            moe_gemm_fast_rows(isa, ws->ye + (size_t)r0 * D, (size_t)D, ws->g + (size_t)r0 * F,
                               (size_t)F, c, ex->down[e], dt, F, d0, d1,
                               moe_experts_bias_row(&ex->b_down, e, &vd));
        }

        moe_experts_combine_cpu(out, ws->ye, w, plan->pos, T, K, D);
    }
}
