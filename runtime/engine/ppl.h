/* ppl.h - perplexity of a model over a text, and its divergence from an
 * earlier run (`moerun ppl`): what a memory-vs-compute knob (KV dtype, top-k,
 * weight dtype, backend) costs in model quality.
 *
 * The evaluation rule, which tests/reference/make_ppl_fixtures.py follows
 * with transformers:
 *  - windows: the tokenizer's prefix (its special tokens before a text, e.g.
 *    BOS; may be empty), then the next ctx - n_prefix body tokens; windows do
 *    not overlap and the last one may be shorter;
 *  - in a window of n tokens, logits row j (predicting token j + 1) is scored
 *    for score_from <= j <= n - 2 (llama.cpp's perplexity scores the second
 *    half of each window, score_from = ctx / 2, so every scored token has at
 *    least that much context);
 *  - per scored row, in double precision from the fp32 logits:
 *    NLL = -log_softmax(row)[target] and the argmax (ties to the lower id);
 *    against a base run: KL(base || this) = sum_v p_base(v) (log p_base(v) -
 *    log p_this(v)), whether the two argmaxes agree, and p_this(target) -
 *    p_base(target).
 * A base run is stored as log-probabilities in f16 (N, V), renormalised
 * after reading so the base is a distribution again, plus each token's NLL
 * and argmax as computed in that run. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine/runner.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_ppl_plan {
    int32_t *tokens;       /* every window back to back, owned */
    int64_t *win_start;    /* (n_windows + 1) offset of each window in tokens */
    int64_t *scored_start; /* (n_windows + 1) index of each window's first scored token */
    int n_windows;
    int ctx, score_from;
    int64_t n_scored;
};

struct moe_tokenizer;

/* The special tokens tok's post-processor puts before a text (e.g. BOS;
 * none for many tokenizers): *prefix new memory (free()), *n its length. */
MOE_MUST_USE enum moe_status moe_ppl_text_prefix(struct moe_tokenizer *tok, int32_t **prefix, int *n);

/* Cuts body into windows (see the rule above); max_windows 0 = all.
 * Errors: ctx < n_prefix + 2, score_from outside [0, ctx - 2], a text too
 * short to score one token. */
MOE_MUST_USE enum moe_status moe_ppl_plan_init(struct moe_ppl_plan *p, const int32_t *prefix,
                                                int n_prefix, const int32_t *body, int64_t n_body,
                                                int ctx, int score_from, int max_windows);
void moe_ppl_plan_free(struct moe_ppl_plan *p);

/* Runner options for evaluating p: as many windows per step as max_tokens
 * rows and max_seqs sequences allow (at least one; a window longer than
 * max_tokens goes through in pieces), logits for every row of a step, and a
 * KV pool of exactly those windows. */
void moe_ppl_runner_opts(const struct moe_ppl_plan *p, int max_tokens, int max_seqs, int block_size,
                         enum moe_dtype kv_dtype, struct moe_runner_opts *o);

/* A base run, host, borrowed: its log-probabilities in f16 for the KL, and
 * its exact NLL and argmax per token (so a knob that changes nothing reads
 * as no change, whatever the f16 rounding does to near-ties). */
struct moe_ppl_base {
    const uint16_t *logprobs; /* (n, V) f16 bits */
    const float *nll;         /* (n) */
    const int32_t *argmax;    /* (n) */
    int64_t n;
    int vocab;
};

/* Per scored token, (n_scored) arrays, owned.  The base_* arrays exist only
 * for a run against a base. */
struct moe_ppl_result {
    int64_t n;
    int32_t *target, *argmax;
    double *nll;
    double *kl, *base_nll, *dp; /* dp: p_this(target) - p_base(target) */
    uint8_t *same_top1;         /* argmax equals the base's */
};

/* Evaluates p on r (made with moe_ppl_runner_opts or larger).  base may be
 * NULL; save, when not NULL, receives this run's log-probabilities as f16
 * bits (n_scored, V) host.  progress (may be NULL) is called after each step
 * with the windows finished so far.  Errors: non-finite logits (naming the
 * window and row), a base of another shape, a failing step. */
MOE_MUST_USE enum moe_status moe_ppl_run(struct moe_runner *r, const struct moe_ppl_plan *p,
                                          const struct moe_ppl_base *base, uint16_t *save,
                                          struct moe_ppl_result *res,
                                          void (*progress)(void *arg, int done, int total),
                                          void *arg);
void moe_ppl_result_free(struct moe_ppl_result *res);

struct moe_ppl_summary {
    int64_t n;
    double mean_nll, se_nll;  /* nats; standard error of the mean */
    double ppl, se_ppl;       /* exp(mean_nll); ppl * se_nll */
    double top1;              /* fraction of rows whose argmax is the target */
    bool has_base;
    double base_mean_nll, base_ppl;
    double mean_dnll, se_dnll; /* mean(nll - base_nll) = ln(PPL / PPL_base) */
    double mean_kl, se_kl, kl_median, kl_p90, kl_p99, kl_max;
    double same_top1, se_same_top1; /* fraction, and its binomial standard error */
    double rms_dp;                  /* root mean square of dp */
};

/* Aggregates a result.  Errors: no memory (the KL quantiles sort a copy). */
MOE_MUST_USE enum moe_status moe_ppl_summarize(const struct moe_ppl_result *res,
                                                struct moe_ppl_summary *s);

#ifdef __cplusplus
}
#endif
