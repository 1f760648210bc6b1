/* sampler.h - turning a logits row into the next token.
 *
 * Order, as in Hugging Face's logits processors and vLLM: logit bias
 * (OpenAI's logit_bias, added to the raw logits), repetition
 * penalty (prompt and generated tokens; positive logits divided, negative
 * multiplied), frequency and presence penalties (OpenAI: generated tokens,
 * logit -= frequency * count + presence * [count > 0]), then temperature,
 * top-k, top-p (smallest set whose probability reaches p, ties kept in
 * index order), min-p (drop tokens below min_p x the top probability), and
 * a draw from the renormalised rest with the request's own generator.
 * Temperature 0 is greedy (ties to the lower id).  Log-probabilities are of
 * the penalised distribution at temperature 1 (what the model says), for
 * the chosen token and the n most likely. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_MAX_LOGPROBS 20
#define MOE_MAX_LOGIT_BIAS 300 /* as the OpenAI API allows */

struct moe_sampling {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off */
    float frequency_penalty;  /* 0: off */
    float presence_penalty;   /* 0: off */
    uint64_t seed;
    int n_logprobs;           /* 0..MOE_MAX_LOGPROBS */
    bool logprob;             /* the chosen token's log-probability is wanted */
    int n_bias;               /* logit_bias entries: bias[i] added to token bias_ids[i]'s logit */
    int32_t bias_ids[MOE_MAX_LOGIT_BIAS];
    float bias[MOE_MAX_LOGIT_BIAS]; /* each in [-100, 100] */
};

struct moe_rng {
    uint64_t s[4];            /* xoshiro256** state */
};

struct moe_sample {
    int32_t token;
    float logprob;                           /* of token */
    int n_top;
    int32_t top_ids[MOE_MAX_LOGPROBS];
    float top_logprobs[MOE_MAX_LOGPROBS];
};

/* Greedy, no penalties, no logprobs. */
void moe_sampling_defaults(struct moe_sampling *p);
/* True when the token is the argmax of the raw logits: greedy (temperature 0
 * or top_k 1), no logit bias, no penalties, no log-probabilities.  Such a request can take
 * its token from the backend's argmax, with no logits row on the host. */
bool moe_sampling_is_argmax(const struct moe_sampling *p);
/* OpenAI's logit_bias ({"token id": bias in [-100, 100]}, up to 300; null:
 * none) into sp; the message names no part of the request. */
MOE_MUST_USE enum moe_status moe_sampling_logit_bias_from_json(json_t *lb, int vocab, struct moe_sampling *sp);
/* True when the token is a function of the logits alone: temperature 0 or
 * top_k 1 (penalties, bias and log-probabilities allowed), so no draw from
 * the generator.  Speculative decoding verifies such requests by matching. */
bool moe_sampling_is_greedy(const struct moe_sampling *p);
/* Checks ranges; the message names the field and the value. */
MOE_MUST_USE enum moe_status moe_sampling_validate(const struct moe_sampling *p);
void moe_rng_seed(struct moe_rng *r, uint64_t seed);
/* Uniform in [0, 1). */
double moe_rng_uniform(struct moe_rng *r);

/* Scratch for V-token sampling: (V) floats and (V) ints, allocated by the
 * caller once. */
struct moe_sampler_scratch {
    float *p;
    int32_t *idx;
    int V;
};
MOE_MUST_USE enum moe_status moe_sampler_scratch_init(struct moe_sampler_scratch *s, int V);
void moe_sampler_scratch_free(struct moe_sampler_scratch *s);

/* Samples from logits (V), which it modifies (penalties).  history is the
 * prompt followed by the generated tokens; n_prompt of them are prompt.
 * out->logprob is computed always (it is cheap beside the logits row);
 * callers that took the token from moe_sampling_is_argmax's shortcut have
 * none and set it to NaN. */
void moe_sampler_sample(const struct moe_sampling *p, struct moe_rng *rng, float *logits, int V,
                        const int32_t *history, int n_prompt, int n_history,
                        struct moe_sampler_scratch *scratch, struct moe_sample *out);

/* The distribution moe_sampler_sample draws from, into probs (V): zero
 * outside the set top-k, top-p and min-p keep, one-hot at the argmax for
 * a greedy request.  Modifies logits as moe_sampler_sample does.  The
 * reference of the tests that check sampling's distribution (speculative
 * verification among them). */
void moe_sampler_probs(const struct moe_sampling *p, float *logits, int V, const int32_t *history,
                       int n_prompt, int n_history, struct moe_sampler_scratch *scratch,
                       double *probs);

/* Speculative verification of a token x drafted from the distribution q
 * (V; a draft model's, moe_sampler_probs of its logits): the modified
 * rejection sampling of Leviathan et al. (2023).  With p the distribution
 * moe_sampler_sample would draw from these logits, x is accepted with
 * probability min(1, p(x) / q(x)); otherwise a token is drawn from
 * norm(max(0, p - q)).  Either way out->token is distributed as p.  out's
 * log-probabilities are moe_sampler_sample's.  Returns whether x was
 * accepted.  Two draws from rng at most.  Modifies logits. */
bool moe_sampler_accept(const struct moe_sampling *p, struct moe_rng *rng, float *logits, int V,
                        const int32_t *history, int n_prompt, int n_history,
                        struct moe_sampler_scratch *scratch, const float *q, int32_t x,
                        struct moe_sample *out);

#ifdef __cplusplus
}
#endif
