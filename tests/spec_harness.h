/* spec_harness.h - what the speculative-decoding suites with a second
 * model (test_spec_draft.c: a draft model; test_spec_mtp.c: the
 * checkpoint's multi-token-prediction module) share: jobs of random
 * prompts and mixed sampling settings, serving them through an engine,
 * and the check that speculation changed no output. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine/engine.h"

#define SPEC_MAXJ 12
#define SPEC_MAXP 64
#define SPEC_MAXO 40

struct spec_job {
    int32_t prompt[SPEC_MAXP];
    int n, arrive;
    struct moe_request_params p;
};

struct spec_result {
    int32_t out[SPEC_MAXO];
    struct moe_sample s[SPEC_MAXO];
    int n, drafted, accepted;
    enum moe_finish finish;
};

struct spec_totals {
    uint64_t drafted, accepted, preemptions, prefix_hits;
};

/* Random prompts; parameters cycle: plain greedy (the backend's argmax),
 * sampled at temperature 0.8 (seeded: the same draws with speculation;
 * every other one opts out with no_spec), greedy with log-probabilities
 * (the host sampler), greedy with a repetition penalty (the target's
 * token may differ from the proposer's argmax). */
void spec_make_jobs(struct spec_job *jobs, int nj, int vocab, uint64_t seed);
/* Engine options: 8 sequences, blocks of 4 tokens, f32 KV. */
struct moe_engine_opts spec_opts(int n_blocks, int batch_tokens, bool prefix);
/* Serves the jobs (job i submitted at step jobs[i].arrive) with options o
 * on target m and backend be; fills res and checks that every block of
 * every pool is free after. */
struct moe_engine_counters spec_serve(struct moe_backend *be, const struct moe_model *m,
                                      const struct spec_job *jobs, int nj,
                                      const struct moe_engine_opts *o, struct spec_result *res);
/* The same tokens, finish reasons and log-probabilities (bit for bit). */
void spec_expect_same(const struct spec_result *a, const struct spec_result *b, int nj, const char *what);
/* tu_engine_churn's request maker over the first seven jobs of ctx (a
 * struct spec_job array), max_tokens 1..24. */
void spec_churn_request(void *ctx, uint64_t *seed, const int32_t **prompt, int *n,
                        struct moe_request_params *p);
/* tu_engine_churn's check of a finished or cancelled request: it holds no
 * block of the target's pool or its proposer's. */
void spec_pools_returned(void *ctx, struct moe_request *r);
/* Serves the jobs without speculation, then with sp for K = 1, 2, 4, 8:
 * the same outputs each time, something drafted, no_spec requests never
 * speculated.  With all_accepted, every token drafted for a greedy
 * request without penalties must be accepted. */
struct spec_totals spec_matches_plain(struct moe_backend *be, const struct moe_model *m,
                                      const struct spec_job *jobs, int nj, struct moe_engine_opts o,
                                      const struct moe_spec_opts *sp, bool all_accepted,
                                      const char *what);
