/* stats_analyze.h - `moerun stats`: reading exported statistics and routing
 * traces back, per-layer balance tables, comparisons, plots (terminal and
 * SVG) and what-ifs replayed from a trace (expert parallelism, expert
 * caching, fewer active experts).
 *
 * Files: stats_data.c (loading), stats_analyze.c (tables, compare),
 * stats_plot.c (Unicode and SVG), stats_whatif.c (EP, cache, top-k),
 * cli_stats.c (the command).  Definitions of every number printed are in
 * docs/stats-format.md. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One input: a statistics JSON, or a routing trace (its PREFIX.trace.json or
 * the bare PREFIX), from which the same counters are aggregated. */
struct moe_sdata {
    char *path;          /* owned */
    bool from_trace;
    int Lm, E, K;
    int32_t *layers;     /* (Lm) model layer indices */
    double *load;        /* (Lm, E) token-slot pairs routed */
    double *top1;        /* (Lm, E) tokens whose first choice it was */
    double *coact;       /* (Lm, E, E) pairs i < j at [i*E + j] */
    double *ent_norm;    /* (Lm) mean router entropy / log E, NaN when unknown */
    int64_t tokens;      /* tokens (rows) covered */
    /* speculative decoding: pairs and rows of rejected drafts' verification
     * rows (in load and tokens; zero in files without speculation) */
    double *rejected;    /* (Lm, E) */
    int64_t tokens_rejected;
    int64_t steps;
    int d_model, d_expert, weight_bytes; /* 0 when unknown */
    int64_t expert_bytes;  /* one expert as stored; 0 when unknown (older files) */
    /* the trace itself (NULL for a statistics JSON) */
    int64_t N;           /* tokens in the trace */
    int32_t *ids;        /* (N, Lm, K) */
    float *w;            /* (N, Lm, K) */
    int64_t *meta;       /* (N, 4): step, request, position, decode */
};

/* Largest co-activation table (Lm x E x E doubles, 1 GiB) a file may
 * declare; real models are far below (256 experts x 64 layers is 4M). */
#define MOE_SDATA_MAX_COACT (1ull << 27)

/* Loads a statistics JSON or a trace.  Every declared count (layers,
 * experts, top-k, array lengths, .npy shapes) is checked against the file's
 * contents and the limits above before anything is allocated from it. */
MOE_MUST_USE enum moe_status moe_sdata_load(struct moe_sdata *d, const char *path);
/* Leaves out the rows of drafts speculative decoding rejected, so the load
 * is what decoding without speculation routes (docs/stats-format.md): a
 * statistics JSON's load and tokens less its tokens_spec_rejected (its
 * top-1 and co-activation counts stay those of every computed row); a
 * trace loses its rows of phase 2 and is counted again.  Returns the rows
 * left out. */
int64_t moe_sdata_accepted_only(struct moe_sdata *d);
void moe_sdata_free(struct moe_sdata *d);

/* --- tables (stats_analyze.c) --- */

/* Least-squares slope s of log(share) = c - s log(rank + 1) over the experts
 * with a non-zero share, ranks by descending share: the Zipf exponent that
 * best describes the counts.  NaN with fewer than two non-zero experts. */
double moe_sdata_zipf_fit(const double *counts, int E);
/* Per-layer table: balance, hottest/coldest, dead experts, top pairs. */
void moe_sdata_print_tables(FILE *f, const struct moe_sdata *d, int top_pairs);
/* How B differs from A, layer by layer (layers matched by index). */
void moe_sdata_print_compare(FILE *f, const struct moe_sdata *a, const struct moe_sdata *b);

/* --- plots (stats_plot.c) --- */

/* Layer x expert heatmap of load (Unicode blocks) and per-layer max/mean
 * bars; `width` columns at most for the heatmap. */
void moe_sdata_print_heatmap(FILE *f, const struct moe_sdata *d, int width);
MOE_MUST_USE enum moe_status moe_sdata_write_svg(const struct moe_sdata *d, const char *path);

/* --- what-ifs (stats_whatif.c) --- */

/* Contiguous placement: expert e on device floor(e * N / E). */
void moe_ep_contiguous(int E, int N, int32_t *place);
/* A placement of E experts on N devices, at most ceil(E/N) per device, that
 * minimises the largest device load sum(load[e] on d).  Exact (branch and
 * bound) for E <= 16, else longest-first greedy improved by swaps; never
 * worse than contiguous. */
void moe_ep_balanced(const double *load, int E, int N, int32_t *place);
/* max over devices of the summed load. */
double moe_ep_max_load(const double *load, int E, int N, const int32_t *place);

struct moe_ep_opts {
    int devices;         /* N */
    int replicas;        /* R hottest experts per layer copied to every device */
    int act_bytes;       /* bytes per activation element sent (default 2) */
    int d_model;         /* override of the trace's D, 0 = the trace's */
};
MOE_MUST_USE enum moe_status moe_whatif_ep(FILE *f, const struct moe_sdata *d,
                                            const struct moe_ep_opts *o);
/* Expert cache of C experts per layer (LRU and LFU; with warm, statistics
 * of as many MoE layers and experts, also both started from its load;
 * cpu_rows > 0: misses of at most that many rows a step computed on the
 * CPU, as --gpu-experts-cpu-rows does). */
MOE_MUST_USE enum moe_status moe_whatif_cache(FILE *f, const struct moe_sdata *d, int C,
                                               int64_t expert_bytes, const struct moe_sdata *warm,
                                               int cpu_rows);
/* Routing weight kept with k active experts (and every k' <= K). */
MOE_MUST_USE enum moe_status moe_whatif_topk(FILE *f, const struct moe_sdata *d, int k);

/* Result of one cache policy, for the tests. */
struct moe_cache_result {
    int64_t accesses, hits; /* uses on the device, and those found there */
    int64_t cpu_uses, cpu_rows; /* uses computed on the CPU (cpu_rows > 0), their rows */
};
/* Simulates one layer's cache: steps in trace order, each step's experts
 * in the backend's order; lfu false = LRU.  Capacity C >= 1.  warm (E) or
 * NULL: the layer's load in earlier statistics (moe_expert_cache_warm). */
void moe_cache_simulate(const struct moe_sdata *d, int layer_slot, int C, bool lfu, const double *warm,
                        int cpu_rows, struct moe_cache_result *r);

#ifdef __cplusplus
}
#endif
