/* spec_draft.c - the draft-model proposer (see spec_draft.h). */
#include "runtime/engine/spec_draft.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum moe_status moe_spec_draft_init(struct moe_spec_draft *d, const struct moe_model *draft,
                                    struct moe_backend *be, int vocab,
                                    const struct moe_spec_draft_opts *o)
{
    memset(d, 0, sizeof *d);
    if (!draft) return moe_fail(MOE_ERR_INVALID_ARG, "speculation: a draft proposer without a draft model");
    if (draft->cfg.vocab != vocab)
        return moe_fail(MOE_ERR_INVALID_ARG, "draft model: a vocabulary of %d tokens, the target's "
                        "has %d", draft->cfg.vocab, vocab);
    if (o->max_seqs <= 0 || o->max_tokens <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "draft model: rows and sequences per step must be positive");
    d->vocab = vocab;
    struct moe_runner_opts ro = {
        .max_tokens = o->max_tokens, .max_seqs = o->max_seqs, .max_logits = o->max_seqs,
        .block_size = o->block_size, .n_blocks = o->n_blocks, .kv_dtype = o->kv_dtype,
        .kv_dtype_set = true, .prefix_cache = false};
    enum moe_status s = moe_runner_init(&d->r, draft, be, &ro);
    if (s != MOE_OK) goto fail;
    const size_t S = (size_t)o->max_seqs;
    d->jobs = calloc(S, sizeof *d->jobs);
    d->chunks = calloc(S, sizeof *d->chunks);
    d->job_of = calloc(S, sizeof *d->job_of);
    d->ids = calloc(S, sizeof *d->ids);
    if (!d->jobs || !d->chunks || !d->job_of || !d->ids) {
        s = moe_fail(MOE_ERR_NOMEM, "draft model: step buffers");
        goto fail;
    }
    if (o->sample || o->grammar) {
        size_t n;
        if (!moe_mul_size(S, (size_t)vocab, &n) || !moe_mul_size(n, sizeof(float), &n)) {
            s = moe_fail(MOE_ERR_NOMEM, "draft model: %d sequences x %d logits", o->max_seqs, vocab);
            goto fail;
        }
        d->logits = malloc(n);
        d->probs = malloc((size_t)vocab * sizeof *d->probs);
        if (!d->logits || !d->probs) {
            s = moe_fail(MOE_ERR_NOMEM, "draft model: logits of %d sequences", o->max_seqs);
            goto fail;
        }
        if ((s = moe_sampler_scratch_init(&d->sc, vocab)) != MOE_OK) goto fail;
    }
    if (o->grammar) {
        d->gv = o->grammar;
        if (!(d->gmask = malloc(((size_t)vocab + 31) / 32 * sizeof *d->gmask))) {
            s = moe_fail(MOE_ERR_NOMEM, "draft model: a grammar mask");
            goto fail;
        }
    }
    return MOE_OK;
fail:
    moe_spec_draft_free(d);
    return s;
}

void moe_spec_draft_free(struct moe_spec_draft *d)
{
    moe_runner_free(&d->r);
    free(d->jobs);
    free(d->chunks);
    free(d->job_of);
    free(d->ids);
    free(d->logits);
    free(d->probs);
    free(d->gmask);
    moe_sampler_scratch_free(&d->sc);
    memset(d, 0, sizeof *d);
}

static int blocks_for(const struct moe_spec_draft *d, int tokens)
{
    return (tokens + d->r.o.block_size - 1) / d->r.o.block_size;
}

/* The backend's argmax, kept inside the vocabulary whatever it returned. */
static int32_t draft_token(const struct moe_spec_draft *d, int32_t id)
{
    return id >= 0 && id < d->vocab ? id : 0;
}

/* Sets the logits of the tokens jb's grammar does not allow next to
 * -inf; the first allowed token with the largest logit, or -1 when none
 * is allowed (or the grammar's limits were hit). */
static int32_t grammar_mask(struct moe_spec_draft *d, struct moe_spec_draft_job *jb, float *logits)
{
    if (moe_grammar_mask(jb->gstate, d->gv, d->gmask) != MOE_OK) return -1;
    int32_t best = -1;
    for (int t = 0; t < d->vocab; t++) {
        if (!(d->gmask[t >> 5] >> (t & 31) & 1)) logits[t] = -INFINITY;
        else if (best < 0 || logits[t] > logits[best]) best = t;
    }
    return best;
}

/* Guess i of job jb from its chunk's logits row: drawn from the draft's
 * distribution (written to the job's q row i), or the argmax (the
 * backend's, or of the masked row for a grammar job); -1: the grammar
 * allows nothing. */
static int32_t guess(struct moe_spec_draft *d, struct moe_spec_draft_job *jb, int i, int c)
{
    const int V = d->vocab;
    float *logits = d->logits ? d->logits + (size_t)c * V : NULL;
    int32_t best = -1;
    if (jb->gstate && (best = grammar_mask(d, jb, logits)) < 0) return -1;
    if (!jb->sampling) return jb->gstate ? best : draft_token(d, d->ids[c]);
    moe_sampler_probs(jb->sampling, logits, V, jb->tokens, jb->n_prompt,
                      jb->n_tokens + i, &d->sc, d->probs);
    double u = moe_rng_uniform(jb->rng), acc = 0;
    int32_t x = jb->gstate ? best : draft_token(d, d->ids[c]);
    float *q = jb->q + (size_t)i * V;
    bool drawn = false;
    for (int v = 0; v < V; v++) {
        q[v] = (float)d->probs[v];
        if (drawn || d->probs[v] <= 0) continue;
        x = v; /* the last token with mass, should rounding leave u above the sum */
        acc += d->probs[v];
        drawn = u < acc;
    }
    return x;
}

/* Records guess i of jb (t < 0: none); a grammar job's state advances by
 * it, and its drafting ends where the grammar allows nothing more. */
static void take_guess(struct moe_spec_draft *d, struct moe_spec_draft_job *jb, int i, int32_t t)
{
    if (t < 0) {
        jb->k = i;
        return;
    }
    jb->out[i] = t;
    if (!jb->gstate) return;
    bool ok = false;
    if (moe_grammar_state_advance_token(jb->gstate, d->gv, t, &ok) != MOE_OK || !ok)
        jb->k = i; /* the mask allowed it: only a limit of the grammar state */
    else if (moe_grammar_state_accepting(jb->gstate) && !moe_grammar_state_can_continue(jb->gstate))
        jb->k = i + 1;
}

/* True when a job of chunks[0..nc) needs its logits row (sampled or
 * grammar guesses). */
static bool any_sampled(const struct moe_spec_draft *d, int nc)
{
    for (int c = 0; c < nc; c++)
        if (d->jobs[d->job_of[c]].sampling || d->jobs[d->job_of[c]].gstate) return true;
    return false;
}

/* Fits each job's k to the draft model's context and to the free draft
 * blocks, in job order: a job needs its tokens and its first k - 1
 * guesses in the cache.  A job that cannot fit even its tokens gets k = 0.
 * Its cache first loses anything past its last token but one (the last
 * token's row gives draft token 1, so at least one is computed). */
static void fit_jobs(struct moe_spec_draft *d, int n)
{
    int avail = moe_kvcache_available(&d->r.kv);
    const int ctx = d->r.m->cfg.max_pos;
    for (int j = 0; j < n; j++) {
        struct moe_spec_draft_job *jb = &d->jobs[j];
        MOE_ASSERT(jb->n_tokens >= 1);
        if (jb->seq->len > jb->n_tokens - 1) moe_seq_truncate(&d->r, jb->seq, jb->n_tokens - 1);
        if (jb->k > ctx - jb->n_tokens + 1) jb->k = ctx - jb->n_tokens + 1;
        int need = 0;
        while (jb->k > 0 &&
               (need = blocks_for(d, jb->n_tokens + jb->k - 1) - jb->seq->n_blocks) > avail)
            jb->k--;
        if (jb->k <= 0) {
            jb->k = 0;
            continue;
        }
        avail -= need;
    }
}

enum moe_status moe_spec_draft_propose(struct moe_spec_draft *d, int n)
{
    MOE_ASSERT(n >= 0 && n <= d->r.o.max_seqs);
    fit_jobs(d, n);
    /* catch-up: each job's uncomputed tokens, chunked to the step's rows;
     * the chunk that completes a job gives its first guess */
    for (;;) {
        int nc = 0, budget = d->r.o.max_tokens;
        for (int j = 0; j < n && budget > 0; j++) {
            struct moe_spec_draft_job *jb = &d->jobs[j];
            int left = jb->n_tokens - jb->seq->len;
            if (jb->k == 0 || left <= 0) continue;
            int c = left < budget ? left : budget;
            d->chunks[nc] = (struct moe_chunk){jb->seq, jb->tokens + jb->seq->len, c, false, false, 0};
            d->job_of[nc++] = j;
            budget -= c;
        }
        if (nc == 0) break;
        MOE_TRY(moe_runner_step(&d->r, d->chunks, nc, any_sampled(d, nc) ? d->logits : NULL, d->ids,
                                NULL, NULL));
        for (int c = 0; c < nc; c++) {
            struct moe_spec_draft_job *jb = &d->jobs[d->job_of[c]];
            if (jb->seq->len == jb->n_tokens) take_guess(d, jb, 0, guess(d, jb, 0, c));
        }
    }
    /* then one row per sequence and step, feeding the guess before */
    for (int i = 1;; i++) {
        int nc = 0;
        for (int j = 0; j < n; j++) {
            struct moe_spec_draft_job *jb = &d->jobs[j];
            if (jb->k <= i) continue;
            d->chunks[nc] = (struct moe_chunk){jb->seq, &jb->out[i - 1], 1, false, true, 0};
            d->job_of[nc++] = j;
        }
        if (nc == 0) break;
        MOE_TRY(moe_runner_step(&d->r, d->chunks, nc, any_sampled(d, nc) ? d->logits : NULL, d->ids,
                                NULL, NULL));
        for (int c = 0; c < nc; c++) {
            struct moe_spec_draft_job *jb = &d->jobs[d->job_of[c]];
            take_guess(d, jb, i, guess(d, jb, i, c));
        }
    }
    return MOE_OK;
}

void moe_spec_draft_rollback(struct moe_spec_draft *d, struct moe_seq *s, int n_valid)
{
    if (n_valid < 0) n_valid = 0;
    if (s->len > n_valid) moe_seq_truncate(&d->r, s, n_valid);
}

void moe_spec_draft_reset(struct moe_spec_draft *d, struct moe_seq *s)
{
    if (d->r.kv.blocks) moe_seq_reset(&d->r, s);
}

void moe_spec_draft_seq_free(struct moe_spec_draft *d, struct moe_seq *s)
{
    moe_seq_free(&d->r, s);
}
