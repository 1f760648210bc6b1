/* expert_cache.h - which of a layer's experts hold one of its C device
 * slots: the policy of the CUDA backend's expert offload (--gpu-experts C,
 * the other experts streamed from host memory) and of the `moerun stats
 * --cache C` what-if, which replays a routing trace through the same code.
 *
 * Work comes in steps (one forward step of one layer) and, within a step,
 * rounds: the experts a round uses must all be resident at once, so a step
 * that needs more than C experts runs in several rounds.  A miss evicts,
 * among the slots the current round does not use, first the experts the
 * step has not used, then any; LRU takes the least recently used of them,
 * LFU the least used overall (ties to LRU).  Pure host code, no allocation
 * after init. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_expert_cache {
    int E, C;
    bool lfu;
    int32_t *slot;         /* (E) slot of each expert, -1 when not resident */
    int32_t *owner;        /* (C) expert in each slot, -1 when free */
    int64_t *last, *freq;  /* (E) clock of the last use, uses so far */
    int64_t *step_of;      /* (E) step of the last use, -1: never */
    int64_t *round_of;     /* (E) round of the last use, -1: never */
    int64_t clock, step, round;
    int round_uses;         /* experts moe_expert_cache_fill put in the current round */
    int64_t accesses, hits; /* uses (once per expert per step) and those already resident */
};

/* C slots for E experts (1 <= C <= E), starting empty. */
MOE_MUST_USE enum moe_status moe_expert_cache_init(struct moe_expert_cache *c, int E, int C, bool lfu);
/* Warm start, before the first step: load (E) holds each expert's routed
 * count in earlier statistics (moerun's --stats-out); the C experts with
 * the highest counts above 0 (ties to the lower id) take slots 0, 1, ...
 * in that order, and under LFU the counts become the experts' use counts,
 * so what was hot stays.  Returns the number of slots filled. */
int moe_expert_cache_warm(struct moe_expert_cache *c, const double *load);
void moe_expert_cache_free(struct moe_expert_cache *c);
/* A new step (and its first round). */
void moe_expert_cache_step(struct moe_expert_cache *c);
/* A new round of the current step. */
void moe_expert_cache_round(struct moe_expert_cache *c);
/* Expert e (0 <= e < E) is used by the current round: its slot.  *loaded is
 * set when it was not resident (its weights must be copied into the slot),
 * *evicted to the expert that left the slot (-1: none).  Returns -1 when
 * every slot holds an expert of the current round (start another). */
int moe_expert_cache_use(struct moe_expert_cache *c, int e, bool *loaded, int *evicted);

/* A step as the CUDA backend runs it, written once for it and the what-if:
 * moe_expert_cache_order starts the step and puts in order the experts with
 * counts[e] > 0, those resident first, each group by id (so a round never
 * evicts an expert a later round of the step would find resident); returns
 * their number.  moe_expert_cache_fill then takes the next experts of the
 * order into one round (a new round unless it is the step's first): their
 * slots in slot[i] and whether each must be copied in in loaded[i], for
 * the experts order[*next - n .. *next); returns n (at least 1 while
 * experts remain). */
int moe_expert_cache_order(struct moe_expert_cache *c, const int32_t *counts, int32_t *order);
/* The experts a step computes on the CPU instead of copying them in
 * (--gpu-experts-cpu-rows R): those with 1 to R rows that are not
 * resident, by id into list; rest (E) gets counts less theirs, for
 * moe_expert_cache_order.  Returns their number (0 when R <= 0). */
int moe_expert_cache_split(const struct moe_expert_cache *c, const int32_t *counts, int R, int32_t *rest,
                           int32_t *list);
int moe_expert_cache_fill(struct moe_expert_cache *c, const int32_t *order, int m, int *next,
                          int32_t *slot, bool *loaded);

#ifdef __cplusplus
}
#endif
