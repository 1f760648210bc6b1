/* stats.h - expert load statistics and routing traces.
 *
 * A recorder (struct moe_stats) is filled by the forward pass: one call to
 * moe_stats_step_begin per step, then one call to moe_stats_record_layer per
 * MoE layer with that layer's routing (host memory).  It keeps, over a window
 * of steps that starts at init or at the last reset:
 *
 *   per MoE layer x expert   (token, slot) pairs routed, prefill and decode
 *                            apart; sum of routing weights; tokens whose
 *                            top-1 (first, highest) choice it was
 *   per MoE layer            mean router entropy over tokens (softmax over all
 *                            E logits, in nats); co-activation counts of the
 *                            expert pairs chosen for the same token
 *   per step                 tokens per expert for every MoE layer, in a ring
 *                            of the last `ring_steps` steps
 *   on request               the routing trace: for every token and MoE layer
 *                            the K expert ids and weights, with the token's
 *                            step, request id, position and phase
 *   speculative decoding     per MoE layer x expert, the pairs of verification
 *                            rows (a decode followed by drafted tokens; also
 *                            counted in decode) and of those the engine then
 *                            rejected (moe_stats_spec_rejected), so a study
 *                            takes all computed rows or the accepted only;
 *                            distinct experts a verification chunk of n rows
 *                            touches per layer
 *
 * Invariants: per layer, sum over experts of prefill + decode = (tokens in
 * the window) * K, less the pairs counted in `rejected` (an id outside
 * [0, E), which the routers never produce).  No input - NaN weights or
 * logits, all-equal logits, garbage ids - indexes outside the arrays: ids are
 * checked before use, non-finite weights are not summed (counted in
 * `bad_weights`), tokens without a finite entropy are left out of it.
 *
 * Memory is allocated by moe_stats_init; recording allocates nothing except
 * when a trace grows (amortised doubling, bounded by trace_max_tokens; a
 * trace that cannot grow stops and says `truncated`).  Not thread-safe: one
 * recorder belongs to one forward pass.  On a device backend the caller
 * copies ids/weights/logits to the host first (the CUDA counters that stay on
 * the device are a later issue); the forward pass records a decode-sized
 * step's layers after the step (see moe_forward_run).  A step whose forward
 * pass fails midway keeps what it recorded before the failure (for a
 * decode-sized step: nothing).  Export lives in stats_export.c (JSON, CSV,
 * Prometheus text) and trace.c (.npy); docs/stats-format.md is the schema. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "runtime/core/batch.h"
#include "runtime/model/config.h"
#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_STATS_FORMAT "moerun-expert-stats"
#define MOE_STATS_VERSION 1
#define MOE_TRACE_FORMAT "moerun-routing-trace"
#define MOE_TRACE_VERSION 1
#define MOE_STATS_SPEC_ROWS 17 /* verification chunks of up to K + 1 rows */

struct moe_stats_opts {
    int ring_steps;            /* per-step ring capacity; 0 = 64 */
    int64_t step_from;         /* record only steps from..to-1 (step numbers count */
    int64_t step_to;           /* every step since init); step_to 0 = no end */
    bool trace;                /* keep the routing trace */
    int64_t trace_max_tokens;  /* 0 = no limit */
};

/* Routing trace, token-major; Lm = MoE layers. */
struct moe_stats_trace {
    int64_t n, cap;            /* tokens recorded, tokens allocated */
    int32_t *ids;              /* (cap, Lm, K) */
    float *w;                  /* (cap, Lm, K) */
    int64_t *meta;             /* (cap, 4): step, request id, position, decode (0/1) */
    bool truncated;            /* stopped at trace_max_tokens or out of memory */
};

struct moe_stats {
    struct moe_stats_opts o;
    int L, Lm, E, K;           /* layers, MoE layers, experts, top-k */
    int32_t *layers;           /* (Lm) model layer index of each MoE layer */
    int32_t *slot;             /* (L) MoE ordinal of each layer, -1 for dense */
    /* window */
    int64_t step;              /* steps seen since init (next step's number) */
    int64_t first_step, last_step; /* first/last step recorded in the window, -1: none */
    int64_t steps;             /* steps recorded in the window */
    double t_start, t_end;     /* unix seconds: window start (init/reset), last step */
    int64_t resets;
    int64_t tokens_prefill, tokens_decode; /* rows recorded (once per step) */
    /* counters, (Lm, E) unless noted */
    int64_t *prefill, *decode; /* pairs routed */
    double *wsum;              /* sum of routing weights */
    int64_t *top1;             /* tokens whose first choice the expert was */
    double *ent_sum;           /* (Lm) sum over tokens of router entropy, nats */
    int64_t *ent_n;            /* (Lm) tokens in ent_sum */
    int64_t *coact;            /* (Lm, E, E) pair (i < j) at [i*E + j] */
    int64_t *rejected;         /* (Lm) pairs with an id outside [0, E) */
    int64_t *bad_weights;      /* (Lm) pairs with a non-finite weight */
    /* ring of per-step counts */
    int ring_cap, ring_n, ring_head; /* capacity, valid entries, next write */
    int64_t *ring_step;        /* (cap) step number */
    int32_t *ring_tokens;      /* (cap) rows of the step */
    int32_t *ring_decode;      /* (cap) decode rows of the step */
    int32_t *ring_counts;      /* (cap, Lm, E) pairs per expert */
    int64_t ring_dropped;      /* steps overwritten */
    /* speculative decoding */
    int64_t *verify;           /* (Lm, E) pairs of verification rows */
    int64_t *spec_rejected;    /* (Lm, E) of those, pairs of rows of rejected drafts */
    int64_t tokens_verify, tokens_spec_rejected;
    int64_t spec_chunks[MOE_STATS_SPEC_ROWS + 1];   /* [n]: verification chunks of n rows */
    int64_t spec_distinct[MOE_STATS_SPEC_ROWS + 1]; /* [n]: distinct experts they touched,
                                                       summed over chunks and MoE layers */
    struct moe_stats_trace tr;
    double busy_s;             /* time spent in step_begin + record_layer (self-timed) */
    /* the step being recorded */
    bool active;               /* inside the step range */
    int cur_T, cur_ring;
    int64_t cur_tok0;          /* first trace row of the step, -1: not traced */
    const uint8_t *cur_decode; /* (T) 1 for decode rows; borrowed for the step */
    uint8_t *row_decode;       /* (row_cap) */
    int row_cap;
    int32_t *row_vrow;         /* (row_cap) a row's index among the step's verification
                                  rows, -1 for others */
    int32_t *vchunk;           /* (row_cap, 2) first row and rows of each verification chunk */
    int cur_nv, cur_nvchunks;  /* the step's verification rows and chunks */
    int32_t *vids;             /* (vcap, Lm, K) their expert ids, kept for
                                  moe_stats_spec_rejected */
    int vcap;
    uint8_t *seen;             /* (E) scratch: experts a chunk touched */
};

/* Allocates a recorder for cfg's MoE layers. */
MOE_MUST_USE enum moe_status moe_stats_init(struct moe_stats *st, const struct moe_config *cfg,
                                             const struct moe_stats_opts *o);
/* Safe on a zeroed struct and twice. */
void moe_stats_free(struct moe_stats *st);
/* Starts a new window: zeroes every counter, the ring and the trace; step
 * numbering continues. */
void moe_stats_reset(struct moe_stats *st);
/* Called once per forward step with the host batch (borrowed for the step).
 * Uses b->decode and b->request_ids when present. */
MOE_MUST_USE enum moe_status moe_stats_step_begin(struct moe_stats *st, const struct moe_batch *b);
/* Records model layer `layer`'s routing of the step's T rows: ids (T, K),
 * w (T, K), logits (T, E) or NULL (then no entropy).  Host memory. */
void moe_stats_record_layer(struct moe_stats *st, int layer, int T, const int32_t *ids,
                            const float *w, const float *logits);

/* Rows first .. first + n - 1 of the last step recorded were verification
 * rows of drafts the engine rejected (their K/V discarded, their tokens not
 * emitted): their pairs go to spec_rejected, and in the trace their phase
 * becomes 2.  Rows that were not verification rows are ignored.  Call after
 * the step, before the next moe_stats_step_begin. */
void moe_stats_spec_rejected(struct moe_stats *st, int first, int n);

/* Balance of one layer's load (any non-negative counts over E experts). */
struct moe_load_summary {
    double total, mean, max, min;
    double max_mean;           /* max / mean, 0 when total is 0 */
    double cv;                 /* std / mean (population std) */
    double entropy_norm;       /* entropy of the load shares / log E; 1 = uniform */
    int hottest, coldest;      /* lowest index on ties */
    int dead;                  /* experts with zero load */
};
void moe_stats_summarize(const double *load, int E, struct moe_load_summary *out);

/* --- export (stats_export.c) --- */

/* Description of the run, written into the JSON as "model" and "config". */
struct moe_stats_meta {
    const char *model;         /* model folder or synthetic config path */
    const char *architecture;
    const char *command;       /* run, bench, ... */
    const char *backend;
    int threads;
    const char *dtype;         /* weight dtype for synthetic models, or NULL */
    const char *router_skew;   /* synthetic skew spec, or NULL */
    const char *trace_prefix;  /* where the trace went, or NULL */
    int d_model, d_expert, weight_bytes; /* for the what-if byte counts; weight_bytes 0 for
                                            block formats (MXFP4, FP8, Q8_0) */
    int64_t expert_bytes;      /* one expert's three matrices as stored (0: unknown) */
    /* Expert parallelism (runtime/engine/ep.h), ep_ranks < 2: none.
     * ep_bounds (ep_ranks + 1): rank r held experts [bounds[r], bounds[r+1]);
     * ep_rows (ep_ranks): routed rows each rank computed, since the layout
     * opened; imbalance and gather seconds as ep.h counts them. */
    int ep_ranks;
    int ep_tp;                 /* tensor-parallel group size (0 or 1: none) */
    const char *ep_placement;  /* "contiguous" (ep_bounds hold), "shards" (--tp with --ep), or "file" */
    const int32_t *ep_bounds;
    const uint64_t *ep_rows;
    uint64_t ep_steps;
    double ep_imbalance, ep_gather_s;
};
/* New reference: the whole recorder as the documented JSON object. */
json_t *moe_stats_to_json(const struct moe_stats *st, const struct moe_stats_meta *meta);
MOE_MUST_USE enum moe_status moe_stats_write_json(const struct moe_stats *st,
                                                   const struct moe_stats_meta *meta,
                                                   const char *path);
/* One row per (MoE layer, expert), header first. */
MOE_MUST_USE enum moe_status moe_stats_write_csv(const struct moe_stats *st, const char *path);
/* Prometheus text exposition format (version 0.0.4) of the counters and the
 * per-layer balance gauges. */
MOE_MUST_USE enum moe_status moe_stats_prometheus(const struct moe_stats *st, FILE *f);
/* The same into a new NUL-terminated string (free() it). */
MOE_MUST_USE enum moe_status moe_stats_prometheus_string(const struct moe_stats *st, char **out);

/* --- traces (trace.c) --- */

/* Writes PREFIX.ids.npy (int16 when E <= 32767, else int32) (N, Lm, K),
 * PREFIX.weights.npy float32 (N, Lm, K), PREFIX.tokens.npy int64 (N, 4) and
 * PREFIX.trace.json (what the arrays are, E, K, the layer indices). */
MOE_MUST_USE enum moe_status moe_stats_write_trace(const struct moe_stats *st,
                                                    const struct moe_stats_meta *meta,
                                                    const char *prefix);

/* A .npy array: little-endian, C order. */
struct moe_npy {
    char descr[8];             /* "<i2", "<i4", "<i8", "<f4", "<f8", "|u1" */
    int ndim;
    int64_t shape[8];
    size_t elem;               /* bytes per element */
    size_t n;                  /* elements */
    void *data;                /* owned */
};
MOE_MUST_USE enum moe_status moe_npy_write(const char *path, const char *descr, int ndim,
                                            const int64_t *shape, const void *data);
/* Reads a version 1.0/2.0 .npy file of one of the descr above. */
MOE_MUST_USE enum moe_status moe_npy_read(const char *path, struct moe_npy *out);
void moe_npy_free(struct moe_npy *a);

#ifdef __cplusplus
}
#endif
