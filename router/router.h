/* router.h - MoE routing: router probabilities, top-K choice and the
 * dispatch plan that groups (token, slot) pairs by expert.
 *
 * Policies (pinned for every backend in runtime/backend/backend.h): softmax in fp32;
 * top-K by descending router logit (the order of the probabilities, kept
 * where they would round to equal or NaN) with ties to the lower index; NaN ranks
 * below every number, so expert ids stay in [0, E) whatever the scores;
 * optional renormalisation of the K weights to sum to 1 (Mixtral always,
 * Qwen-MoE / OLMoE when norm_topk_prob).  Mirrors MixtralTopKRouter /
 * Qwen3MoeTopKRouter in transformers. */
#pragma once

#include <stdbool.h>
#include <stdint.h>


#ifdef __cplusplus
extern "C" {
#endif

/* How router logits become K experts and their weights. */
struct moe_route {
    int E, K;
    bool renorm;         /* the K weights divided by their sum */
    bool sigmoid;        /* scores sigmoid(logits), else softmax over E */
    const float *bias;   /* (E) backend memory, added to the scores for the choice only; or NULL */
    int n_group, topk_group; /* choose among the topk_group groups of E/n_group experts
                                whose two best biased scores sum highest (sigmoid) or whose
                                best expert ranks highest (softmax); 1, 1 = all */
    float scale;         /* weights times it (routed_scaling_factor) */
    bool by_logit;       /* sigmoid: chosen by the logits themselves, no bias (Llama-4) */
};

/* The dispatch plan of one MoE layer (backend memory). */
struct moe_dispatch {
    int32_t *counts;   /* (E) pairs routed to each expert */
    int32_t *offsets;  /* (E+1) exclusive prefix sum of counts */
    int32_t *perm;     /* (T*K) pair ids t*K+k sorted by expert */
    int32_t *pos;      /* (T*K) inverse: row of pair t*K+k in perm order */
    /* Expert parallelism (set by the forward pass, not by dispatch): the
     * experts [lo, hi) this process holds.  With hi > 0 the experts op fills
     * only their rows of the expert outputs (offsets[lo] .. offsets[hi]) and
     * does not combine: the caller gathers the other ranks' rows, then
     * combines (moe_experts_combine_cpu).  hi 0: every expert, combined.
     * experts: the layer's distinct experts when its slots hold replicas
     * (more slots than experts), so that a backend picks the path one
     * process would for the step (0: as many as slots). */
    int lo, hi;
    int experts;
};

/* ids (T, K), w (T, K) from logits (T, E). */
void moe_router_topk_cpu(int32_t *ids, float *w, const float *logits, int T, int E, int K,
                         bool renorm);
/* The softmax router in general (r->sigmoid false): as above, and with
 * groups (DeepSeek-V2's group_limited_greedy) only the experts of the
 * topk_group groups whose best expert ranks highest are eligible; weights
 * times r->scale (routed_scaling_factor) at the end.
 * moe_router_topk_cpu is this with no groups and scale 1. */
void moe_router_topk_softmax_cpu(int32_t *ids, float *w, const float *logits, int T,
                                 const struct moe_route *r);
/* The sigmoid router of GLM-4.5 / DeepSeek-V3 (Glm4MoeTopkRouter in
 * transformers), r->sigmoid set: scores s = sigmoid(logits) in fp32;
 * choice scores c = s + bias; with groups, only the topk_group groups whose
 * two best c sum highest are eligible; top-K by c (ties to the lower index,
 * NaN last, as above); weights s of the chosen, divided by their sum
 * (+1e-20) when renorm, times r->scale.  ids come in descending c. */
void moe_router_topk_sigmoid_cpu(int32_t *ids, float *w, const float *logits, int T,
                                 const struct moe_route *r);
/* Counting sort of the T*K pairs by expert: counts (E), offsets (E+1),
 * perm (T*K) stable, pos (T*K) its inverse. */
void moe_router_dispatch_cpu(struct moe_dispatch *plan, const int32_t *ids, int T, int K, int E);

#ifdef __cplusplus
}
#endif
