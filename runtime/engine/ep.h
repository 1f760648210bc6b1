/* ep.h - expert parallelism across processes (runtime/comm/comm.h).
 *
 * Every rank holds the attention and dense weights whole (attention
 * replicated) and, in each MoE layer, the experts of its slots there
 * (struct moe_ep_layer): contiguous placement (E / size each, expert e on
 * rank floor(e * size / E)) unless a placement says otherwise per layer,
 * with replicas of hot experts on several ranks (the rows routed to a
 * replicated expert are split between its slots, ep_place.c).  Rank 0 owns the scheduler, the
 * tokenizer and all output; the other ranks follow: each runner rank 0 opens
 * is announced to them (HELLO: the runner's limits and an opaque blob saying
 * how to open the same model and backend, the CLI's), and each of its steps
 * is broadcast (STEP: rows, positions, contexts and the blocks in use), so
 * every rank runs the same forward pass on the same batch in lockstep and
 * keeps the same KV cache.  In a MoE layer each rank computes the rows
 * routed to its slots (the routing is replicated, so every rank knows every
 * rank's rows), the ranks all-gather those rows, and each combines them in
 * the fixed k order: logits are bit-identical to one process's (the CPU
 * backends compute a row the same whatever rows it is grouped with).
 *
 * The LM head is split by vocabulary rows (moe_model_vocab_split): each
 * rank computes its rows' logits and rank 0 gathers them (forward_ep.c).
 * A follower's failure to open the model or
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

/* One MoE layer's slots: the experts each rank computes there.  Rank r's
 * slots are [bounds[r], bounds[r+1]) (at least one each), experts
 * ascending within a rank; expert e has n_rep[e] >= 1 slots, on distinct
 * ranks: rep[rep0[e] .. rep0[e] + n_rep[e]), ranks ascending. */
struct moe_ep_layer {
    int n_slots;                /* 0: a dense layer */
    int32_t *expert;            /* (n_slots) */
    int32_t *bounds;            /* (size + 1) */
    int32_t *rep0, *n_rep;      /* (E) */
    int32_t *rep;               /* (n_slots) */
};

/* Where the collectives of a backend whose memory is not the host's run
 * (moe_ep.coll): its own transport (the CUDA backend's NCCL) when every
 * rank opens it, else staged through host memory and MPI (AUTO); its own
 * or fail (DEVICE); always staged (HOST). */
enum moe_ep_coll { MOE_EP_COLL_AUTO, MOE_EP_COLL_DEVICE, MOE_EP_COLL_HOST };

struct moe_ep {
    struct moe_comm *comm;      /* borrowed */
    enum moe_ep_coll coll;      /* the same on every rank */
    int coll_state;             /* 1: the backend's transport carries the expert rows and sums,
                                   -1: staged, 0: not decided yet (forward_ep.c) */
    int rank, size;
    int32_t *bounds;            /* (size + 1) contiguous bounds, once placed; NULL before */
    int n_layers, n_experts;    /* of the placed model */
    struct moe_ep_layer *layers; /* (n_layers), once placed */
    int max_slots;              /* the most slots of a layer */
    const char *placement;      /* "contiguous", or what placed the experts (a file's "source") */
    char *placement_text;       /* the placement JSON given to moe_ep_place (owned), or NULL */
    int32_t *counts, *displs;   /* (size) a layer's rows per rank, scratch */
    uint64_t *rows_rank;        /* (size) expert rows each rank computed, as rank 0 counts them */
    int64_t *open_kib;          /* (size) each rank's peak resident memory (KiB) when the latest
                                   runner opened (weights loaded and prepared, cache allocated) */
    int next_runner;            /* rank 0: the next runner's id */
    const void *hello;          /* rank 0: what a follower needs to open the same model (borrowed) */
    size_t hello_bytes;
    void *msg;                  /* message buffer (header + payload) */
    size_t msg_cap;
    struct moe_ep_counters n;
    /* Tensor parallelism (moe_ep_set_tp): groups of tp consecutive ranks
     * split each attention layer's heads, dense FFNs and shared experts
     * (moe_model_tp_split) and add their parts (tp.c) */
    int tp, tp_rank;            /* 1, 0: none */
    int groups;                 /* expert shards: 0 for size (every rank its own experts; the
                                   default) or size / tp (each group's experts on all of its tp
                                   ranks, as replicas whose rows those ranks split) */
    struct moe_comm *tp_comm;   /* this rank's group (owned), or NULL */
    float *tp_buf;              /* scratch of the group's parts */
    size_t tp_cap;              /* floats */
    double tp_s;                /* seconds in the group's collectives */
    uint64_t tp_bytes;          /* bytes this rank received through them */
    /* Data-parallel attention (moe_ep_set_dp): each sequence's attention
     * (and its K/V) on one rank, the batch's rows all-gathered after each
     * attention block (forward_dp.c) */
    bool dp;
    bool dp_local;              /* the rows stay on their ranks through the layers, the experts'
                                   pairs travel all-to-all (a backend in host memory; default) */
    bool dp_record;             /* this step records routing (statistics or a trace on rank 0):
                                   every rank gathers it (sent with the step) */
    double dp_s;                /* seconds in those all-gathers */
    uint64_t dp_bytes;          /* bytes this rank received through them */
    uint64_t dp_rows;           /* attention rows this rank computed */
    uint64_t dp_rows_all;       /* attention rows of all ranks */
};

/* Opens the layout over c's ranks (c NULL: one process); experts are
 * placed by moe_ep_place. */
void moe_ep_init(struct moe_ep *ep, struct moe_comm *c);
/* Tensor parallelism over groups of tp consecutive ranks with experts in
 * `shards` shards (0: one per rank; else the size or size / tp), checked
 * against the world; every rank calls it, before moe_ep_place.  The
 * groups' communicators open at the first step.  tp 1: only the check. */
MOE_MUST_USE enum moe_status moe_ep_set_tp(struct moe_ep *ep, int shards, int tp);
/* Data-parallel attention: each sequence's attention layers run on one
 * rank (rank 0's runner gives each new sequence the rank whose sequences
 * hold the fewest KV blocks, a prefix-cache hit the rank that holds the
 * hit), which alone writes its K/V; the rows are all-gathered after each
 * attention block, so every rank runs the FFNs on every row as before.
 * Refused with tensor parallelism.  Every rank calls it alike. */
MOE_MUST_USE enum moe_status moe_ep_set_dp(struct moe_ep *ep, bool on);
/* Places the experts of the MoE layers of a model of n_layers layers
 * (is_moe[l]) and n_experts experts per layer.  placement (JSON text,
 * docs/parallel.md, or NULL): each layer it names as it says, the others
 * contiguous (refused unless n_experts divides over the shards: with
 * shards of several ranks (moe_ep_set_tp) every rank of a shard holds its
 * experts).  Every
 * rank must be given the same.  Again with the same arguments: no-op. */
MOE_MUST_USE enum moe_status moe_ep_place(struct moe_ep *ep, int n_layers, const bool *is_moe, int n_experts,
                                          const char *placement);
/* Whether this rank holds expert e of layer l (placed). */
bool moe_ep_holds(const struct moe_ep *ep, int l, int e);
/* (n_layers x n_experts) 1 where this rank holds the expert (malloc'd). */
MOE_MUST_USE enum moe_status moe_ep_held(const struct moe_ep *ep, uint8_t **held);
/* The slot of each routed pair of layer l: ids (T, K) of experts -> slots
 * (T, K).  A pair of a replicated expert e in row t goes to replica
 * (pos[t] + e) mod R (ranks ascending): a deterministic turn-taking over
 * the rows of a prefill and the steps of a decode. */
void moe_ep_slot_ids(const struct moe_ep *ep, int l, const int32_t *ids, int T, int K, const int32_t *pos,
                     int32_t *slots);
/* Writes a placement over `size` ranks for n_layers layers (layer[j] the
 * model index, load (n_layers, E) each layer's routed pairs) with R extra
 * slots per layer (replicas of the hottest experts, EPLB's greedy: the
 * expert with the most load per replica gets the next one; slots then
 * packed onto the ranks longest-first, each rank ceil((E + R) / size) at
 * most).  *text: JSON (malloc'd); *ratio: the mean over layers of the
 * busiest rank's load over the mean that the placement predicts. */
MOE_MUST_USE enum moe_status moe_ep_placement_write(int size, int n_layers, const int32_t *layer, int E,
                                                    const double *load, int R, const char *source, char **text,
                                                    double *ratio);
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
