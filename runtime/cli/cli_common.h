/* cli_common.h - pieces shared by the commands: opening a model (a folder
 * or --synthetic CONFIG.json), parsing id lists and sizes, human units. */
#pragma once

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/model/model.h"

struct moe_cli_model_opts {
    const char *path;       /* model folder, or NULL */
    const char *synthetic;  /* config.json for in-memory random weights, or NULL */
    const char *dtype;      /* synthetic weight dtype: f32, f16, bf16 */
    uint64_t seed;
    const char *router_skew; /* synthetic router skew spec (runtime/model/synth_skew.h), or NULL */
    bool device_weights;    /* synthetic weights made by the backend (moe_model_synthetic_deferred) */
    long top_k;             /* --moe-top-k: experts per token instead of the config's; 0 = as configured */
    const char *draft;      /* --draft: the draft model's folder (cli_draft.h), or NULL */
    long ep;                /* --ep: ranks the experts spread over; 0 = the launch's world size */
    long tp;                /* --tp: ranks each attention layer's heads split over; 0 = 1 */
    bool dp_attention;      /* --dp-attention: each sequence's attention on one rank */
    const char *ep_placement; /* --ep-placement: a placement file (docs/parallel.md), or NULL */
    const char *ep_placement_text; /* a follower: rank 0's placement (JSON), or NULL */
};

/* Opens the model the options name; prints nothing.  With --draft, the
 * draft's tokenizer is first checked against the model's (cli_draft.h),
 * before any weights are read. */
MOE_MUST_USE enum moe_status moe_cli_open_model(struct moe_model *m,
                                                 const struct moe_cli_model_opts *o);
/* "f32"/"f16"/"bf16" (any case) -> dtype. */
bool moe_cli_parse_dtype(const char *s, enum moe_dtype *out);
/* A --kv-dtype: what moe_cli_parse_dtype takes, or "fp8" (also "f8",
 * "fp8_e4m3", "e4m3"): MOE_DTYPE_F8E4M3, the per-row scaled fp8 cache of
 * kvcache.h. */
bool moe_cli_parse_kv_dtype(const char *s, enum moe_dtype *out);
#define MOE_CLI_KV_DTYPES "f32, f16, bf16 or fp8" /* for messages */
/* Comma-separated non-negative ids; *ids is malloc'd. */
MOE_MUST_USE enum moe_status moe_cli_parse_ids(const char *s, int32_t **ids, int *n);
/* A decimal integer in [lo, hi], whole string. */
bool moe_cli_parse_int(const char *s, long lo, long hi, long *out);
/* 1536 -> "1.50 KiB" */
const char *moe_cli_bytes(char *buf, size_t n, double bytes);
/* A line to f: prefix, then m's weight bytes by storage format (as
 * loaded, or as a backend prepared them), largest first, with shares. */
void moe_cli_print_formats(FILE *f, const char *prefix, const struct moe_model *m);
/* 1234567 -> "1.23M" */
const char *moe_cli_count(char *buf, size_t n, double x);
/* getopt_long for command cmd; an unknown option, a missing value or a value
 * given to an option that takes none is reported in one line that ends
 * with "see 'moerun CMD --help'", and '?' returned. */
int moe_cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts,
                   const char *cmd);
/* 0 when path can be written (created or appended to; a file made only to
 * find out is removed again), else 1 with "moerun CMD: OPT PATH cannot be
 * written: why".  Called before any model is loaded. */
int moe_cli_check_writable(const char *cmd, const char *opt, const char *path);
/* Prints "moerun CMD: message" to stderr and returns 1. */
int moe_cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads all of f (byte for byte); new memory, NUL-terminated, its length in
 * *len; NULL on a read error or no memory. */
char *moe_cli_read_all(FILE *f, size_t *len);
/* This machine's copy bandwidth in bytes/s (read + written, as STREAM's
 * Copy): a 256 MiB memcpy split over the OpenMP threads, best of 5 after a
 * warm-up; 0 when the buffers cannot be had. */
double moe_cli_copy_bandwidth(void);
/* Bytes per second one pass of reads over 256 MiB reaches with the OpenMP
 * team (best of 5): the ceiling of a decode step, which only reads. */
double moe_cli_read_bandwidth(void);

/* --- the engine options shared by the commands that run it (their rows:
 * cli_opts.c) --- */

#include "runtime/engine/engine.h"

struct moe_cli_engine {
    struct moe_cli_model_opts model;
    const char *backend;
    long threads;
    const char *kv_budget;    /* NULL: the command's default */
    long kv_block;
    const char *kv_dtype;
    long max_batch_tokens, max_seqs;
    double priority_aging;    /* --priority-aging, seconds (0: the engine's 10) */
    bool no_prefix_cache;
    const char *quantize;     /* --quantize: "q8_0", "q4", "none" or NULL */
    const char *expert_plan;  /* --expert-dtype-plan FILE, or NULL */
    double hot_share;         /* --hot-share (default MOE_CLI_HOT_SHARE) */
    long gpu_experts;         /* --gpu-experts: 0 = all resident */
    const char *gpu_experts_policy, *gpu_experts_warm; /* NULL: LRU, no warm start */
    long gpu_experts_cpu_rows; /* --gpu-experts-cpu-rows: 0 = every miss copied in */
    /* speculative decoding: --spec (kind, ngram_max), --spec-tokens,
     * --spec-max-batch, --spec-adaptive; moe_cli_engine_start hands it to
     * the engine as it is */
    struct moe_spec_opts spec;
    double comm_timeout;      /* --comm-timeout, seconds (default MOE_CLI_COMM_TIMEOUT) */
    const char *collectives;  /* --collectives: "auto", "nccl", "mpi", or NULL (auto) */
    /* not an option: the command's vocabulary for grammar requests, or NULL */
    const struct moe_grammar_vocab *grammar_vocab;
};

/* --hot-share's default: the experts taking 80% of a layer's routed pairs
 * keep their precision. */
#define MOE_CLI_HOT_SHARE 0.8
/* --expert-dtype-plan FILE (cli_expert_plan.c): statistics or a trace
 * (the experts taking share hot_share of each layer's routed pairs keep
 * the stored precision, or q8_0 when quant is q8_0 or q4; the others
 * take q4), or an explicit map {"expert_dtypes": {"LAYER": {"EXPERT":
 * "q4" | "q8_0" | "stored"}}}, into o's expert_quant (*buf, new: the
 * caller frees it after moe_backend_init). */
MOE_MUST_USE enum moe_status moe_cli_expert_plan(struct moe_backend_opts *o, const char *file, double hot_share,
                                                 enum moe_weight_quant quant, uint8_t **buf);

/* --spec-max-batch's default: speculate only while at most this many
 * requests run (the measurement: docs/cli.md, "Speculative decoding"). */
#define MOE_CLI_SPEC_MAX_BATCH 1
/* --comm-timeout's default, seconds. */
#define MOE_CLI_COMM_TIMEOUT 30.0
/* "none", "ngram" or "ngram:N" (N the longest n-gram, 1..MOE_CLI_SPEC_NGRAM_MAX)
 * into o's kind and ngram_max; false, o untouched, for anything else. */
#define MOE_CLI_SPEC_NGRAM_MAX 64
bool moe_cli_parse_spec(const char *s, struct moe_spec_opts *o);
/* The speculation figures of an engine's counters, for a summary: "mean
 * accepted length 2.31 (1234 drafts, 4936 drafted tokens, acceptance
 * 46.8%)"; false (buf empty) when nothing was drafted. */
bool moe_cli_spec_summary(const struct moe_engine_counters *n, char *buf, size_t len);

/* --gpu-experts, --gpu-experts-policy, --gpu-experts-warm and
 * --gpu-experts-cpu-rows into o->offload (before the backend's init): the
 * policy parsed, the statistics file loaded into *warm (new; the caller
 * frees it once the backend is initialised; NULL without the option), the
 * slots and rows set.  Errors name the option and the file. */
MOE_MUST_USE enum moe_status moe_cli_offload_opts(struct moe_backend_opts *o, long gpu_experts,
                                                  const char *policy, const char *warm, long cpu_rows,
                                                  double **warm_counts);

void moe_cli_engine_defaults(struct moe_cli_engine *o);
/* Checks what can be checked before anything is loaded: --kv-dtype,
 * --kv-budget, --quantize, --backend's name, and the model's config.json
 * (or --synthetic's); 0, or 1 with the one-line error printed. */
int moe_cli_check_engine(const struct moe_cli_engine *o, const char *cmd);
/* Parses "8GiB", "512MiB", "1.5G", "123456" (bytes) or "0.25" (fraction of
 * available memory). */
MOE_MUST_USE enum moe_status moe_cli_parse_budget(const char *s, size_t *bytes);
/* Builds the engine for a loaded model: the KV pool comes from --kv-budget,
 * or, without it, holds default_tokens tokens. */
MOE_MUST_USE enum moe_status moe_cli_engine_start(const struct moe_cli_engine *o,
                                                   const struct moe_model *m,
                                                   struct moe_backend *be, long default_tokens,
                                                   struct moe_engine *e);
/* "q8_0", "q4" (any case) or "none" -> the quantization; false otherwise. */
bool moe_cli_parse_quant(const char *s, enum moe_weight_quant *out);
/* The --quantize name of q ("none", "q8_0", "q4"). */
const char *moe_cli_quant_name(enum moe_weight_quant q);
/* The backend options of --threads and of the environment, in the one place
 * the program reads them: MOERUN_CPU_ISA=ref|avx2|avx512|amx|amx-exact|amx-bf16 (the widest CPU
 * kernel set), MOERUN_CPU_PANELS=0|1, MOERUN_CUDA_GRAPHS=0|1,
 * MOERUN_CUDA_STRICT=0|1, MOERUN_CUDA_PREFILL_ATTN=tiled|rows|mma,
 * MOERUN_CUDA_EXPERTS=cublas|mma (docs/cli.md).  A value that is none of
 * these keeps the default with a one-line notice. */
void moe_cli_backend_opts(struct moe_backend_opts *o, long threads);
/* After o->quant is set: --quantize q8_0 or q4 on a processor whose AMX
 * sets run those products on the int8 tiles takes the AMX set, unless
 * MOERUN_CPU_ISA says which (prefill 1.5-2.6x; decode the same for q4,
 * 0-5% slower for q8_0 at full widths: docs/cli.md). */
void moe_cli_isa_for_quant(struct moe_backend_opts *o);
/* moe_backend_init for the options' --backend and --threads, with their
 * --quantize and expert offload. */
MOE_MUST_USE enum moe_status moe_cli_backend_start(struct moe_backend *be,
                                                    const struct moe_cli_engine *o);
/* Overlays on s the sampling values MODEL/generation_config.json sets
 * (temperature, top_p, top_k, min_p, repetition_penalty), as vLLM's
 * server does, ignoring do_sample; fields it does not set are untouched.
 * Returns how many it set. */
int moe_cli_generation_overlay(const char *model_dir, struct moe_sampling *s);
/* Sampling defaults from MODEL/generation_config.json (do_sample,
 * temperature, top_p, top_k, min_p, repetition_penalty); greedy otherwise. */
void moe_cli_generation_defaults(const char *model_dir, struct moe_sampling *s);
