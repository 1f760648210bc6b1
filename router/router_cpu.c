/* router_cpu.c - CPU reference of routing and dispatch (see router.h). */
#include "router/router.h"
#include "runtime/core/par.h"
#include "runtime/core/status.h"
#include "runtime/model/config.h"

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

/* Inserts (x, e) into the descending list (v, id) of n <= cap entries. */
static inline void insert_ranked(float *v, int32_t *id, int *n, int cap, float x, int e)
{
    if (*n == cap && !ranks_before(x, e, v[cap - 1], id[cap - 1])) return;
    int i = *n < cap ? (*n)++ : cap - 1;
    while (i > 0 && ranks_before(x, e, v[i - 1], id[i - 1])) {
        v[i] = v[i - 1];
        id[i] = id[i - 1];
        i--;
    }
    v[i] = x;
    id[i] = e;
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Expert e's choice score: its logit (softmax routers: softmax is monotone,
 * so logits rank as probabilities do; Llama-4's sigmoid router, by_logit,
 * which takes the top-K logits), or sigmoid + choice bias. */
static inline float choice_score(const struct moe_route *r, const float *x, int e)
{
    return r->sigmoid && !r->by_logit ? sigmoidf(x[e]) + (r->bias ? r->bias[e] : 0.0f) : x[e];
}

/* ok[g]: group g is eligible.  All when n_group is 1; else the topk_group
 * groups ranked by the sum of their best choice scores, the two best for
 * the sigmoid router (GLM-4.5, DeepSeek-V3), the best one for softmax
 * (DeepSeek-V2's group_limited_greedy). */
static void eligible_groups(bool *ok, const struct moe_route *r, const float *x)
{
    const int G = r->n_group, per = r->E / G, top = r->sigmoid ? 2 : 1;
    for (int g = 0; g < G; g++) ok[g] = G == 1;
    if (G == 1) return;
    float gv[MOE_MAX_EXPERT_GROUPS], best[2] = {0.0f, 0.0f};
    int32_t gi[MOE_MAX_EXPERT_GROUPS], bi[2] = {0, 0};
    int ng = 0;
    for (int g = 0; g < G; g++) {
        int n = 0;
        for (int e = g * per; e < (g + 1) * per; e++) insert_ranked(best, bi, &n, top, choice_score(r, x, e), e);
        insert_ranked(gv, gi, &ng, r->topk_group, top == 2 ? best[0] + best[1] : best[0], g);
    }
    for (int i = 0; i < ng; i++) ok[gi[i]] = true;
}

void moe_router_topk_cpu(int32_t *ids, float *w, const float *logits, int T, int E, int K,
                         bool renorm)
{
    const struct moe_route r = {E, K, renorm, false, NULL, 1, 1, 1.0f, false};
    moe_router_topk_softmax_cpu(ids, w, logits, T, &r);
}

static void topk_softmax_row(int32_t *ids, float *w, const float *logits, int t, const struct moe_route *r)
{
    const int E = r->E, K = r->K, per = E / r->n_group;
    const float *x = logits + (size_t)t * E;
    int32_t *id = ids + (size_t)t * K;
    float *wt = w + (size_t)t * K;
    /* softmax (max-subtracted, fp32) */
    float mx = -INFINITY;
    for (int e = 0; e < E; e++)
        if (x[e] > mx) mx = x[e];
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += expf(x[e] - mx);
    bool ok[MOE_MAX_EXPERT_GROUPS];
    eligible_groups(ok, r, x);
    /* top-K by insertion into a sorted list of K (K is small).  Ranking
     * uses the logits: softmax is monotone, and logits stay ordered where
     * probabilities would round to equal values or become NaN (+inf). */
    int n = 0;
    for (int e = 0; e < E; e++)
        if (ok[e / per]) insert_ranked(wt, id, &n, K, x[e], e);
    for (int k = 0; k < K; k++) wt[k] = expf(wt[k] - mx) / sum;
    if (r->renorm) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += wt[k];
        for (int k = 0; k < K; k++) wt[k] /= s;
    }
    if (r->scale != 1.0f && r->scale != 0.0f)
        for (int k = 0; k < K; k++) wt[k] *= r->scale;
}

void moe_router_topk_softmax_cpu(int32_t *ids, float *w, const float *logits, int T,
                                 const struct moe_route *r)
{
    const int E = r->E, G = r->n_group;
    MOE_ASSERT(G >= 1 && G <= MOE_MAX_EXPERT_GROUPS && E % G == 0 && r->topk_group <= G);
    if (!moe_par_worth((size_t)T, 64)) {
        for (int t = 0; t < T; t++) topk_softmax_row(ids, w, logits, t, r);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) topk_softmax_row(ids, w, logits, t, r);
}

static void topk_sigmoid_row(int32_t *ids, float *w, const float *logits, int t, const struct moe_route *r)
{
    const int E = r->E, K = r->K, per = E / r->n_group;
    const float *x = logits + (size_t)t * E;
    int32_t *id = ids + (size_t)t * K;
    float *wt = w + (size_t)t * K;
    bool ok[MOE_MAX_EXPERT_GROUPS];
    eligible_groups(ok, r, x);
    int n = 0;
    for (int e = 0; e < E; e++)
        if (ok[e / per]) insert_ranked(wt, id, &n, K, choice_score(r, x, e), e);
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += wt[k] = sigmoidf(x[id[k]]);
    for (int k = 0; k < K; k++) /* in transformers' order: w / (sum + 1e-20) * scale */
        wt[k] = (r->renorm ? wt[k] / (sum + 1e-20f) : wt[k]) * r->scale;
}

void moe_router_topk_sigmoid_cpu(int32_t *ids, float *w, const float *logits, int T,
                                 const struct moe_route *r)
{
    const int E = r->E, G = r->n_group;
    MOE_ASSERT(G >= 1 && G <= MOE_MAX_EXPERT_GROUPS && E % G == 0 && r->topk_group <= G);
    if (!moe_par_worth((size_t)T, 64)) {
        for (int t = 0; t < T; t++) topk_sigmoid_row(ids, w, logits, t, r);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) topk_sigmoid_row(ids, w, logits, t, r);
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
