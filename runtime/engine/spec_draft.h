/* spec_draft.h - the draft-model proposer of speculative decoding: a
 * smaller model of the target's vocabulary guesses each sequence's next
 * tokens by its own greedy decoding.
 *
 * The proposer owns a runner over the draft model (its own KV pool, the
 * target's block size and KV dtype) and the engine gives each request a
 * draft sequence in that pool (struct moe_request.draft_seq), whose len is
 * how many of the request's tokens the draft has computed.  One propose
 * call serves every speculating request of an engine step, batched:
 *   1. catch-up: the tokens the draft has not computed yet (the prompt the
 *      first time, then the one or two tokens accepted since the last
 *      proposal), in chunks of at most the runner's rows per draft step;
 *      the last row's argmax is draft token 1;
 *   2. k - 1 steps of one row per sequence, each feeding the token drafted
 *      before.
 * The draft's argmax is the backend's (ties to the lower id, NaN never
 * wins), and every proposed token is in [0, V): NaN logits from the draft
 * may waste a step, never change the target's output.  The distribution q
 * of a drafted token is one-hot, or, for a job that asks (a sampled
 * request, opts.sample), the draft's own distribution, drawn from.
 *
 * Invariant: a draft sequence holds K/V only for tokens of its request
 * that the target verified, or for the draft's own guesses until the
 * engine calls moe_spec_draft_rollback after verification, which keeps
 * the first min(len, n_valid) tokens.  The draft pool never preempts:
 * a job whose tokens do not fit in the free draft blocks is proposed fewer
 * tokens, or none this step.
 *
 * Where it comes from: Leviathan et al. 2023 and Chen et al. 2023 (the
 * draft/target scheme); vLLM's draft-model worker keeps the draft's own KV
 * cache and rolls it back to the accepted tokens in the same way. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine/runner.h"
#include "runtime/grammar/grammar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One sequence to draft for. */
struct moe_spec_draft_job {
    struct moe_seq *seq;       /* the request's draft sequence (borrowed) */
    const int32_t *tokens;     /* (n_tokens) the request's tokens, prompt then generated */
    int n_tokens;
    int k;                     /* in: tokens wanted (>= 1); out: tokens proposed (0..k) */
    int32_t *out;              /* (k) drafted tokens, written here; must follow tokens
                                  (out == tokens + n_tokens: the penalties' history) */
    /* Sampled drafts (opts.sample; NULL sampling: the draft's argmax, q
     * one-hot): each token is drawn with rng from the draft's distribution
     * under the request's sampling settings (moe_sampler_probs, history
     * the tokens and the guesses before it, n_prompt of them the prompt),
     * and that distribution is written to q (k, V). */
    const struct moe_sampling *sampling;
    struct moe_rng *rng;
    int n_prompt;
    float *q;
    /* A request with a grammar (opts.grammar): a copy of its grammar state,
     * advanced here by each guess; each guess is taken from the draft's
     * logits masked by it (argmax or drawn, q then the masked
     * distribution), and drafting stops early where nothing is allowed or
     * the grammar is complete.  NULL: no grammar. */
    struct moe_grammar_state *gstate;
};

struct moe_spec_draft {
    struct moe_runner r;       /* the draft model's runner and KV pool */
    int vocab;                 /* V, the target's and the draft's */
    struct moe_spec_draft_job *jobs; /* (max_seqs) the engine fills these for propose */
    struct moe_chunk *chunks;  /* (max_seqs) one draft step's chunks */
    int *job_of;               /* (max_seqs) the job of each chunk */
    int32_t *ids;              /* (max_seqs) argmax of each chunk's last row */
    float *logits;             /* (max_seqs, V) each chunk's last row, for sampled or grammar drafts */
    double *probs;             /* (V) */
    struct moe_sampler_scratch sc;
    const struct moe_grammar_vocab *gv; /* opts.grammar, borrowed */
    uint32_t *gmask;           /* (ceil(V/32)) a grammar job's allowed tokens */
};

struct moe_spec_draft_opts {
    int max_tokens;            /* rows per draft step (a catch-up chunk at most) */
    int max_seqs;              /* jobs per propose call */
    int block_size;            /* the target's B */
    int n_blocks;              /* the draft pool's blocks */
    enum moe_dtype kv_dtype;   /* the target's KV dtype */
    bool sample;               /* jobs may ask for sampled drafts */
    const struct moe_grammar_vocab *grammar; /* jobs may have grammars (their token bytes), or NULL */
};

/* Prepares the draft model on be (borrowed; may be the target's backend)
 * and builds its runner.  Refuses a draft whose vocabulary is not vocab,
 * with both numbers. */
MOE_MUST_USE enum moe_status moe_spec_draft_init(struct moe_spec_draft *d,
                                                  const struct moe_model *draft,
                                                  struct moe_backend *be, int vocab,
                                                  const struct moe_spec_draft_opts *o);
/* Safe on a zeroed struct and twice. */
void moe_spec_draft_free(struct moe_spec_draft *d);
/* Proposes for jobs d->jobs[0..n) (n <= max_seqs, each job's n_tokens >=
 * 1, distinct sequences): each job's k becomes the number of tokens
 * written to its out, k as asked unless the draft pool or the draft
 * model's context is short (then fewer, possibly 0).  A sequence's cache
 * ends holding its tokens and the first k - 1 drafted ones.  Fails only on
 * a backend error (no sequence then holds more than before). */
MOE_MUST_USE enum moe_status moe_spec_draft_propose(struct moe_spec_draft *d, int n);
/* After verification: s keeps the K/V of at most its first n_valid tokens
 * (those of the request that the target confirmed), so it never holds a
 * rejected guess. */
void moe_spec_draft_rollback(struct moe_spec_draft *d, struct moe_seq *s, int n_valid);
/* Gives s's blocks back to the draft pool (preemption, finish, cancel). */
void moe_spec_draft_reset(struct moe_spec_draft *d, struct moe_seq *s);
/* Frees s's block table too (the request goes away).  Both are safe with a
 * zeroed d and a zeroed s. */
void moe_spec_draft_seq_free(struct moe_spec_draft *d, struct moe_seq *s);

#ifdef __cplusplus
}
#endif
