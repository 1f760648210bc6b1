/* ep.h - expert parallelism across processes (runtime/comm/comm.h).
 *
 * Every rank holds the attention and dense weights whole (attention
 * replicated) and the experts [bounds[r], bounds[r+1]) of every MoE layer
 * (contiguous placement: E / size each).  Rank 0 owns the scheduler, the
 * tokenizer and all output; the other ranks follow: each runner rank 0 opens
 * is announced to them (HELLO: the runner's limits and an opaque blob saying
 * how to open the same model and backend, the CLI's), and each of its steps
 * is broadcast (STEP: rows, positions, contexts and the blocks in use), so
 * every rank runs the same forward pass on the same batch in lockstep and
 * keeps the same KV cache.  In a MoE layer each rank computes the rows
 * routed to its experts (the routing is replicated, so every rank knows every
 * rank's rows), the ranks all-gather those rows, and each combines them in
 * the fixed k order: logits are bit-identical to one process's.
 *
 * Followers compute no logits.  A follower's failure to open the model or
 * the runner is reported back to rank 0 (every rank's status is gathered
 * after a HELLO), which fails the runner's init with the rank and message. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm.h"
#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_model;
struct moe_backend;

/* Step figures of one rank since the layout opened. */
struct moe_ep_counters {
    uint64_t steps;       /* steps run */
    uint64_t rows_own;    /* expert rows this rank computed */
    uint64_t rows_all;    /* expert rows of all ranks (routed pairs) */
    uint64_t rows_max;    /* sum over (step, layer) of the busiest rank's rows */
    /* imbalance as `moerun stats --ep` predicts it: per (step, layer) the
     * busiest rank's rows over the mean (rows / size), summed over cells */
    double ratio_sum;
    uint64_t cells;
    double gather_s;      /* seconds in the expert-row all-gathers */
    uint64_t gather_bytes;/* bytes this rank received through them */
    double step_s;        /* seconds in whole forward steps */
};

struct moe_ep {
    struct moe_comm *comm;      /* borrowed */
    int rank, size;
    int32_t *bounds;            /* (size + 1), once placed; NULL before */
    int32_t *counts, *displs;   /* (size) a layer's rows per rank, scratch */
    uint64_t *rows_rank;        /* (size) expert rows each rank computed, as rank 0 counts them */
    int next_runner;            /* rank 0: the next runner's id */
    const void *hello;          /* rank 0: what a follower needs to open the same model (borrowed) */
    size_t hello_bytes;
    void *msg;                  /* message buffer (header + payload) */
    size_t msg_cap;
    struct moe_ep_counters n;
};

/* Opens the layout over c's ranks (c NULL: one process); experts are
 * placed by moe_ep_place. */
void moe_ep_init(struct moe_ep *ep, struct moe_comm *c);
/* Places n_experts experts per layer: contiguous, n_experts / size each
 * (refused unless it divides evenly).  Again with the same count: no-op. */
MOE_MUST_USE enum moe_status moe_ep_place(struct moe_ep *ep, int n_experts);
void moe_ep_free(struct moe_ep *ep);
/* Whether ep spans more than one process. */
static inline bool moe_ep_on(const struct moe_ep *ep) { return ep && ep->size > 1; }

/* Rank 0: tells the followers to stop (their moe_ep_follow returns). */
MOE_MUST_USE enum moe_status moe_ep_stop(struct moe_ep *ep);

/* A follower's hooks: open (once, at the first HELLO) the model and backend
 * the blob describes, placing the experts (moe_ep_place) and holding this
 * rank's; close them at the end. */
struct moe_ep_follower {
    enum moe_status (*open)(void *ctx, const void *blob, size_t bytes, const struct moe_model **m,
                            struct moe_backend **be);
    void (*close)(void *ctx);
    void *ctx;
};
/* A follower rank's life: runs rank 0's runners and steps until it stops.
 * A message that is not well formed ends it with an error. */
MOE_MUST_USE enum moe_status moe_ep_follow(struct moe_ep *ep, const struct moe_ep_follower *f);

#ifdef __cplusplus
}
#endif
