/* router_cpu.c - CPU reference of routing and dispatch (see router.h). */
#include "router/router.h"

#include <math.h>
#include <string.h>

/* True if (a, ia) ranks before (b, ib): larger first, ties to the lower
 * index, NaN last. */
static inline bool ranks_before(float a, int ia, float b, int ib)
{
    bool an = isnan(a), bn = isnan(b);
    if (an || bn) return an == bn ? ia < ib : bn;
    return a > b || (a == b && ia < ib);
}

void moe_router_topk_cpu(int32_t *ids, float *w, const float *logits, int T, int E, int K,
                         bool renorm)
{
#pragma omp parallel for schedule(static) if (T > 64)
    for (int t = 0; t < T; t++) {
        const float *x = logits + (size_t)t * E;
        int32_t *id = ids + (size_t)t * K;
        float *wt = w + (size_t)t * K;
        /* softmax (max-subtracted, fp32) */
        float mx = -INFINITY;
        for (int e = 0; e < E; e++)
            if (x[e] > mx) mx = x[e];
        float sum = 0.0f;
        for (int e = 0; e < E; e++) sum += expf(x[e] - mx);
        /* top-K by insertion into a sorted list of K (K is small).  Ranking
         * uses the logits: softmax is monotone, and logits stay ordered where
         * probabilities would round to equal values or become NaN (+inf). */
        int n = 0;
        for (int e = 0; e < E; e++) {
            float xe = x[e];
            if (n == K && !ranks_before(xe, e, wt[K - 1], id[K - 1])) continue;
            int i = n < K ? n++ : K - 1;
            while (i > 0 && ranks_before(xe, e, wt[i - 1], id[i - 1])) {
                wt[i] = wt[i - 1];
                id[i] = id[i - 1];
                i--;
            }
            wt[i] = xe;
            id[i] = e;
        }
        for (int k = 0; k < K; k++) wt[k] = expf(wt[k] - mx) / sum;
        if (renorm) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s += wt[k];
            for (int k = 0; k < K; k++) wt[k] /= s;
        }
    }
}

void moe_router_dispatch_cpu(struct moe_dispatch *plan, const int32_t *ids, int T, int K, int E)
{
    const int n = T * K;
    memset(plan->counts, 0, (size_t)E * sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        MOE_ASSERT(ids[i] >= 0 && ids[i] < E);
        plan->counts[ids[i]]++;
    }
    /* offsets[e] serves as expert e's fill cursor, then is shifted back:
     * after the fill, offsets[e] holds the end of expert e = start of e+1. */
    int32_t acc = 0;
    for (int e = 0; e < E; e++) {
        plan->offsets[e] = acc;
        acc += plan->counts[e];
    }
    for (int i = 0; i < n; i++) {
        int r = plan->offsets[ids[i]]++;
        plan->perm[r] = i;
        plan->pos[i] = r;
    }
    for (int e = E; e > 0; e--) plan->offsets[e] = plan->offsets[e - 1];
    plan->offsets[0] = 0;
}
