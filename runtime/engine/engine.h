/* engine.h - the serving engine: requests, continuous batching with chunked
 * prefill, KV block admission, preemption by recomputation, prefix reuse.
 *
 * Each step (moe_engine_step) schedules, oldest request first, one decode
 * token for every running request that has caught up and a prefill chunk
 * for every one that has not, then admits waiting requests (by priority,
 * aged, then arrival: moe_request_params) into what is left of the token
 * budget (max_batch_tokens).  A request's tokens are its
 * prompt followed by what it has generated; it samples a token whenever a
 * step brings its cache up to the last of them.
 *
 * Memory: a request is admitted only when blocks for its next chunk are
 * available.  When a running request cannot get its next block, the most
 * recently arrived running request is preempted: its blocks are returned,
 * it goes back to the front of the waiting queue and is recomputed later
 * (prompt and generated tokens; sampling continues from its own generator,
 * so its output is exactly what it would have been).  A request that could
 * not fit even alone is refused at submission.
 *
 * Full blocks are registered in the prefix cache as they fill; a new (or
 * recomputed) request reuses the longest chain of cached blocks matching its
 * tokens, always leaving at least one token to compute (the logits of the
 * last token are needed).
 *
 * Speculative decoding (opts.spec): a caught-up greedy request's decode
 * token is followed by up to K tokens a proposer drafts, computed as one
 * chunk with logits for every row.  Drafted tokens are kept while each
 * equals the target's token of the row before it, then the target's own
 * token follows; the K/V of rejected tokens is rolled back (the block
 * table truncated) and never reaches the prefix cache.  The output is the
 * target's, token for token (docs/engine.md, "Speculative decoding").
 *
 * Not thread-safe: one thread drives the engine (the server hands requests
 * to that thread). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine/runner.h"
#include "runtime/grammar/grammar.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/spec_draft.h"
#include "runtime/engine/spec_mtp.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_req_state { MOE_REQ_WAITING, MOE_REQ_RUNNING, MOE_REQ_FINISHED };
enum moe_finish { MOE_FINISH_NONE, MOE_FINISH_STOP, MOE_FINISH_LENGTH, MOE_FINISH_ABORT };

const char *moe_finish_name(enum moe_finish f); /* "stop", "length", "abort" */

#define MOE_MAX_STOP_IDS 16
#define MOE_MAX_GRAMMAR_TRIGGERS 4

enum { MOE_PRIORITY_MIN = -1000000, MOE_PRIORITY_MAX = 1000000 };

struct moe_request_params {
    struct moe_sampling sampling;
    int max_tokens;                       /* >= 1 */
    int32_t stop_ids[MOE_MAX_STOP_IDS];   /* e.g. EOS ids: finish with "stop" */
    int n_stop_ids;
    bool no_spec;                         /* never speculate ("speculative": false) */
    /* Admission order: the waiting request of the lowest priority minus
     * (seconds waited / the engine's priority_aging) comes first, ties by
     * arrival (vLLM's convention: lower is sooner; all 0 is FIFO).  So a
     * request waits for later ones of better priority only until it has
     * aged past them: at most (its priority - theirs) x priority_aging
     * seconds beyond plain FIFO. */
    int priority;                         /* MOE_PRIORITY_MIN..MOE_PRIORITY_MAX */
    /* Optional (borrowed, shared read-only, must outlive the request): the
     * output is a sentence of this grammar.  Each sampled token is drawn
     * from the tokens whose bytes can continue it (a logits mask before
     * the sampler, so greedy requests sample on the host); stop ids only
     * where the grammar accepts; the request finishes with "stop" when the
     * grammar accepts and nothing can follow.  With speculation each
     * verification row is masked by the state after the drafts kept before
     * it (engine.c, verify).  Needs the engine's grammar_vocab. */
    const struct moe_grammar *grammar;
    /* With a grammar, n_grammar_triggers > 0 makes it lazy (tool calls
     * with strict schemas): the output is free until one of these tokens
     * is emitted, then a sentence of the grammar from its start; where
     * the grammar accepts, any token may follow (one that does not
     * continue it, such as the special token closing a call, ends the
     * block), and where nothing can follow the block ends; the output is
     * then free until the next trigger.  Drafts of such requests are not
     * checked against the grammar (verification is). */
    int32_t grammar_triggers[MOE_MAX_GRAMMAR_TRIGGERS];
    int n_grammar_triggers;
};

/* Proposers of speculative decoding. */
enum moe_spec_kind {
    MOE_SPEC_NONE,   /* plain decoding */
    MOE_SPEC_NGRAM,  /* prompt lookup (spec_ngram.h) */
    MOE_SPEC_DRAFT,  /* a smaller model of the same vocabulary (spec_draft.h) */
    MOE_SPEC_MTP,    /* the checkpoint's multi-token-prediction module (spec_mtp.h) */
};

#define MOE_SPEC_MAX_TOKENS 16 /* K at most */
#define MOE_SPEC_SAMPLED_SEQS 8 /* requests a step whose drafts are sampled (sample_drafts) */

struct moe_spec_opts {
    enum moe_spec_kind kind;
    int tokens;      /* K: tokens drafted per step, 1..MOE_SPEC_MAX_TOKENS; 0: 4 */
    int ngram_max;   /* N: the longest n-gram looked up; 0: 3 */
    int ngram_min;   /* the shortest, 1..N; 0: 1 */
    int max_batch;   /* speculate only in steps that start with at most this
                        many running requests; 0: no limit */
    bool adaptive;   /* each sequence's K follows its recent acceptance, at most tokens */
    /* MOE_SPEC_DRAFT: the draft model (borrowed; its vocabulary is the
     * target's, which the caller checked), the backend that runs it (NULL:
     * the target's) and its KV pool in blocks of block_size (0: as many
     * tokens as the target's pool).  MOE_SPEC_MTP: the module
     * (moe_model_mtp_view of the target), run on the target's backend
     * (draft_be NULL), and its pool the same way. */
    const struct moe_model *draft;
    struct moe_backend *draft_be;
    int draft_blocks;
    /* MOE_SPEC_DRAFT: the draft draws a sampled request's drafts from its
     * own distribution q (for up to MOE_SPEC_SAMPLED_SEQS requests a step;
     * others get its argmax), which the target accepts by rejection
     * sampling (moe_sampler_accept): more drafts accepted, the target's
     * distribution kept, but a seeded request's tokens are no longer those
     * it gets without speculation */
    bool sample_drafts;
    /* Optional: moe_engine_free calls draft_release(draft_ctx) after its
     * draft runner is gone, so whoever loaded the draft may hand it over
     * (the CLI does); taken over only when moe_engine_init succeeds. */
    void (*draft_release)(void *ctx);
    void *draft_ctx;
};

struct moe_request {
    int64_t id;
    enum moe_req_state state;
    enum moe_finish finish;
    bool stop_token;        /* it finished on one of its stop ids (which is no part of its text) */
    int32_t *tokens;        /* (cap) prompt then generated, owned */
    int n_prompt, n_tokens, cap;
    int n_computed;         /* tokens whose K/V are in the cache */
    int n_cached_blocks;    /* leading blocks registered in the prefix cache */
    struct moe_seq seq;
    struct moe_seq draft_seq; /* MOE_SPEC_DRAFT: its cache in the draft's pool; len:
                                 its tokens the draft has computed (spec_draft.h) */
    struct moe_seq mtp_seq;   /* MOE_SPEC_MTP: its cache in the module's pool (spec_mtp.h) */
    int mtp_drafts;           /* MOE_SPEC_MTP: tokens proposed after its tokens ... */
    int mtp_at;               /* ... when it had this many tokens */
    struct moe_rng draft_rng; /* sample_drafts: draws its drafts (seeded from its seed) */
    struct moe_request_params params;
    struct moe_grammar_state *gstate; /* params.grammar: where its output is, owned */
    bool gactive;                  /* the grammar constrains the next token (not lazy, or triggered) */
    struct moe_rng rng;
    struct moe_sample *samples;    /* (max_tokens) per generated token, owned */
    /* timing (seconds, engine clock) */
    double t_arrival, t_first, t_finish;
    double *t_token;        /* (max_tokens) time each generated token was sampled */
    /* accounting */
    int n_prefix_hit;       /* prompt tokens taken from the prefix cache */
    int n_prefilled;        /* tokens computed as prefill (including recomputation) */
    int n_preempted;
    int n_drafted;          /* tokens drafted for it (speculative decoding) */
    int n_accepted;         /* of those, tokens the target confirmed and emitted */
    int n_spec_steps;       /* its verifications */
    double spec_accept;     /* moving average of their acceptance rates (adaptive K) */
    void *user;
    struct moe_request *prev, *next; /* queue links */
};

struct moe_engine_opts {
    int max_batch_tokens;   /* tokens per step (prefill chunks + decodes) */
    int max_seqs;           /* sequences per step */
    int block_size;         /* B */
    int n_blocks;           /* KV pool size (see moe_kvcache_blocks_for_budget) */
    enum moe_dtype kv_dtype;
    bool prefix_cache;
    double priority_aging;      /* seconds of waiting worth one priority level; 0: 10 */
    struct moe_spec_opts spec;  /* zero: no speculation */
    /* Borrowed, optional: the byte strings of the model's vocabulary
     * (V = the model's vocabulary), for requests with a grammar. */
    const struct moe_grammar_vocab *grammar_vocab;
    /* Borrowed, optional: expert parallelism (ep.h); the model holds rank
     * 0's experts and the other ranks follow the engine's steps. */
    struct moe_ep *ep;
};

struct moe_engine_counters {
    uint64_t steps, preemptions, requests_finished, requests_aborted;
    uint64_t prompt_tokens, generated_tokens, prefill_tokens, prefix_hit_tokens;
    /* speculative decoding, as vLLM counts it: verification chunks with at
     * least one drafted token, tokens drafted, drafted tokens the target
     * confirmed and emitted, and per draft position i how often the token
     * there was (mean accepted length = spec_accepted / spec_drafts) */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted;
    uint64_t spec_accepted_at[MOE_SPEC_MAX_TOKENS];
    uint64_t grammar_masks;       /* token masks applied (grammar requests' samples) */
};

struct moe_engine;
/* Called for each sampled token (finished set on the last one), and once
 * with token -1 when a request is cancelled before finishing. */
typedef void (*moe_token_fn)(void *user, struct moe_request *r, int32_t token, bool finished);

struct moe_engine {
    const struct moe_model *m;
    struct moe_runner r;
    struct moe_spec_draft draft;  /* MOE_SPEC_DRAFT's proposer, else zero */
    struct moe_spec_mtp mtp;      /* MOE_SPEC_MTP's proposer, else zero */
    float *spec_q;                /* sample_drafts: (MOE_SPEC_SAMPLED_SEQS, K, V) drafts' q */
    int *q_slot;                  /* (max_seqs) each chunk's q slot, -1: one-hot drafts */
    struct moe_engine_opts o;
    struct moe_request *run_head, *run_tail;   /* running, oldest first */
    struct moe_request *wait_head, *wait_tail; /* waiting, by arrival (preempted at the front);
                                                  admitted by priority (moe_request_params) */
    int n_running, n_waiting;
    int64_t next_id;
    struct moe_chunk *chunks;     /* (max_seqs) */
    struct moe_request **sched;   /* (max_seqs) request of each chunk */
    int *drafted;                 /* (max_seqs) drafted tokens at the end of each chunk */
    float *logits;                /* (r.o.max_logits, V), filled when a request needs them */
    int32_t *ids;                 /* (r.o.max_logits) argmax of each logits row, from the backend */
    struct moe_sampler_scratch scratch;
    uint32_t *gmask;              /* (ceil(V/32)) a grammar request's allowed tokens */
    struct moe_grammar_state *gdraft; /* (max_seqs) with speculation and a grammar vocabulary:
                                         copies of grammar states that drafts advance */
    struct moe_engine_counters n;
    moe_token_fn on_token;
    double (*clock)(void);        /* seconds; monotonic by default */
    /* Optional routing record of each step (borrowed, NULL = none; ids sized
     * (L, max_batch_tokens, K)).  After a step, chunks[0..n_sched) and
     * sched[0..n_sched) say which rows belonged to which request, in row
     * order: the server's per-request expert load reads them. */
    struct moe_route_trace *trace;
    int n_sched;
};

MOE_MUST_USE enum moe_status moe_engine_init(struct moe_engine *e, const struct moe_model *m,
                                              struct moe_backend *be,
                                              const struct moe_engine_opts *o);
void moe_engine_free(struct moe_engine *e);
/* Queues a request (prompt copied).  Refused, with a message giving the
 * numbers, when the prompt is empty, an id is outside the vocabulary, prompt
 * + max_tokens exceeds the model's context, or it would not fit in the KV
 * pool even alone.  *out stays owned by the engine until moe_engine_release. */
MOE_MUST_USE enum moe_status moe_engine_submit(struct moe_engine *e, const int32_t *prompt,
                                                int n_prompt,
                                                const struct moe_request_params *params,
                                                void *user, struct moe_request **out);
/* Aborts a waiting or running request at once; its blocks are freed. */
void moe_engine_cancel(struct moe_engine *e, struct moe_request *r);
/* Finishes a running or waiting request with reason "stop" (a stop string
 * seen by the caller); its blocks are freed.  No callback. */
void moe_engine_stop(struct moe_engine *e, struct moe_request *r);
/* Frees a finished request. */
void moe_engine_release(struct moe_engine *e, struct moe_request *r);
/* One scheduling step; *n_scheduled receives the rows computed (0 when idle). */
MOE_MUST_USE enum moe_status moe_engine_step(struct moe_engine *e, int *n_scheduled);
bool moe_engine_idle(const struct moe_engine *e);
/* Generated tokens of r. */
static inline const int32_t *moe_request_output(const struct moe_request *r, int *n)
{
    *n = r->n_tokens - r->n_prompt;
    return r->tokens + r->n_prompt;
}

#ifdef __cplusplus
}
#endif
