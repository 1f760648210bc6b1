/* engine_spec.c - speculative decoding in the engine (engine.h,
 * docs/engine.md "Speculative decoding"): the options resolved at init,
 * and in each step the drafts of every scheduled decode, from the n-gram
 * proposer, a draft model or the multi-token-prediction module, within
 * the step's token budget and the free blocks.  Verifying the drafts is
 * engine.c's (verify), with the rest of sampling. */
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_impl.h"

#include <math.h>

#include "runtime/engine/spec_draft.h"
#include "runtime/engine/spec_ngram.h"

/* Fills the defaults of the speculation settings and checks them. */
enum moe_status moe_engine_spec_resolve(struct moe_spec_opts *p)
{
    if (p->kind == MOE_SPEC_NONE) return MOE_OK;
    if (p->kind == MOE_SPEC_MTP) {
        if (!p->draft || !p->draft->mtp_eh_proj.data)
            return moe_fail(MOE_ERR_INVALID_ARG, "engine: --spec mtp needs the checkpoint's "
                            "multi-token-prediction module (moe_model_mtp_view)");
        if (p->sample_drafts)
            return moe_fail(MOE_ERR_INVALID_ARG, "engine: sampled drafts need a draft model; the "
                            "multi-token-prediction module drafts its argmax");
        if (p->draft_be)
            return moe_fail(MOE_ERR_INVALID_ARG, "engine: the multi-token-prediction module runs on "
                            "the target's backend (it reads the target's hidden states in place)");
    }
    if (p->kind != MOE_SPEC_NGRAM && p->kind != MOE_SPEC_DRAFT && p->kind != MOE_SPEC_MTP)
        return moe_fail(MOE_ERR_INVALID_ARG, "engine: unknown speculation proposer %d", (int)p->kind);
    if (p->tokens == 0) p->tokens = 4;
    if (p->ngram_max == 0) p->ngram_max = 3;
    if (p->ngram_min == 0) p->ngram_min = 1;
    if (p->tokens < 1 || p->tokens > MOE_SPEC_MAX_TOKENS)
        return moe_fail(MOE_ERR_INVALID_ARG, "engine: %d speculative tokens (1 to %d)", p->tokens,
                        MOE_SPEC_MAX_TOKENS);
    if (p->ngram_min < 1 || p->ngram_max < p->ngram_min)
        return moe_fail(MOE_ERR_INVALID_ARG, "engine: n-gram sizes %d..%d (need 1 <= min <= max)",
                        p->ngram_min, p->ngram_max);
    if (p->max_batch < 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "engine: speculation max batch %d is negative",
                        p->max_batch);
    return MOE_OK;
}

/* Adaptive K: the longest draft whose last token still has a fair chance,
 * a^K >= 1/4 for the request's recent acceptance rate a (a moving average
 * over its verifications, starting at 0.5), within 1..K_max.  At a = 0.5
 * that is 2, at 0.8 it is 6, at 0.9 it is 13. */
static int spec_k(const struct moe_request *r, int k_max)
{
    double a = r->n_spec_steps ? r->spec_accept : 0.5;
    int k = a <= 0.0 ? 1 : a >= 1.0 ? k_max : (int)floor(log(0.25) / log(a));
    return k < 1 ? 1 : k > k_max ? k_max : k;
}

/* The draft proposer: chunk c's request will verify up to k drafted
 * tokens.  Its blocks for them are taken now (so the next request's room
 * is right) and given back in propose_drafts for what is not drafted. */
static enum moe_status queue_draft(struct moe_engine *e, int c, int k)
{
    struct moe_request *r = e->sched[c];
    MOE_TRY(moe_runner_reserve(&e->r, &r->seq, r->n_tokens + k));
    e->drafted[c] = -k; /* asked; propose_drafts sets what was drafted */
    return MOE_OK;
}

/* One call to the draft proposer for every queued chunk; each becomes its
 * last token followed by the tokens drafted, and returns the budget and
 * the blocks of the tokens not drafted. */
static enum moe_status propose_drafts(struct moe_engine *e, int nc, int *budget)
{
    struct moe_spec_draft *d = &e->draft;
    const size_t q_stride = (size_t)e->o.spec.tokens * (size_t)e->m->cfg.vocab;
    int n = 0, slots = 0;
    for (int c = 0; c < nc; c++) {
        if (e->drafted[c] >= 0) continue;
        struct moe_request *r = e->sched[c];
        struct moe_spec_draft_job *jb = &d->jobs[n++];
        *jb = (struct moe_spec_draft_job){.seq = &r->draft_seq, .tokens = r->tokens,
                                          .n_tokens = r->n_tokens, .k = -e->drafted[c],
                                          .out = r->tokens + r->n_tokens};
        if (r->gstate && r->params.n_grammar_triggers == 0) { /* drafts follow its grammar, from a copy of its state */
            MOE_TRY(moe_grammar_state_copy(&e->gdraft[n - 1], r->gstate));
            jb->gstate = &e->gdraft[n - 1];
        }
        /* sampled drafts for the first sampled requests, while q has room */
        if (e->spec_q && !moe_sampling_is_greedy(&r->params.sampling) && slots < MOE_SPEC_SAMPLED_SEQS) {
            e->q_slot[c] = slots;
            jb->sampling = &r->params.sampling;
            jb->rng = &r->draft_rng;
            jb->n_prompt = r->n_prompt;
            jb->q = e->spec_q + (size_t)slots++ * q_stride;
        }
    }
    if (n == 0) return MOE_OK;
    MOE_TRY(moe_spec_draft_propose(d, n));
    for (int c = 0, j = 0; j < n; c++) {
        if (e->drafted[c] >= 0) continue;
        struct moe_request *r = e->sched[c];
        int asked = -e->drafted[c], got = d->jobs[j++].k;
        *budget += asked - got;
        while (r->seq.n_blocks > moe_engine_blocks_for(e, r->n_tokens + got))
            moe_kvcache_release_block(&e->r.kv, r->seq.blocks[--r->seq.n_blocks]);
        e->drafted[c] = got;
        if (got == 0) continue;
        e->chunks[c].n = 1 + got;
        e->chunks[c].all_logits = true;
    }
    return MOE_OK;
}

/* How many of the d tokens drafted for r (at toks) its grammar allows in
 * a row from where its output is: drafts past the first it does not allow
 * would only be rejected. */
static int grammar_viable(struct moe_engine *e, const struct moe_request *r, const int32_t *toks, int d)
{
    const struct moe_grammar_vocab *gv = e->o.grammar_vocab;
    struct moe_grammar_state *st = &e->gdraft[0];
    if (moe_grammar_state_copy_uncached(st, r->gstate) != MOE_OK) return 0; /* advanced only */
    for (int i = 0; i < d; i++) {
        bool ok = false;
        if (moe_grammar_state_advance_token(st, gv, toks[i], &ok) != MOE_OK || !ok) return i;
    }
    return d;
}

/* Speculation: each scheduled decode of a request gets the tokens
 * its proposer drafts, at most K, the tokens it may still emit less one,
 * what is left of the budget, and what free blocks hold (no preemption).
 * The drafts are written after its tokens (its buffer holds prompt +
 * max_tokens), so the chunk is its last token followed by them. */
enum moe_status moe_engine_add_drafts(struct moe_engine *e, int nc, int *budget)
{
    const struct moe_spec_opts *sp = &e->o.spec;
    if (sp->kind == MOE_SPEC_NONE || (sp->max_batch > 0 && e->n_running > sp->max_batch))
        return MOE_OK;
    for (int c = 0; c < nc && *budget > 0; c++) {
        struct moe_request *r = e->sched[c];
        struct moe_chunk *ch = &e->chunks[c];
        if (!ch->decode || r->params.no_spec) continue;
        int k = sp->adaptive ? spec_k(r, sp->tokens) : sp->tokens, left = r->params.max_tokens - (r->n_tokens - r->n_prompt) - 1;
        int room = (r->seq.n_blocks + moe_kvcache_available_in(&e->r.kv, moe_runner_seq_part(&e->r, &r->seq))) *
                       e->o.block_size -
                   r->n_tokens;
        if (k > left) k = left;
        if (k > *budget) k = *budget;
        if (k > room) k = room;
        if (k <= 0) continue;
        if (sp->kind == MOE_SPEC_DRAFT) {
            MOE_TRY(queue_draft(e, c, k));
            *budget -= k;
            continue;
        }
        int d;
        if (sp->kind == MOE_SPEC_MTP) /* proposed after the step before (moe_engine_mtp_after_step) */
            d = r->mtp_at != r->n_tokens ? 0 : r->mtp_drafts < k ? r->mtp_drafts : k;
        else
            d = moe_spec_ngram_propose(r->tokens, r->n_tokens, sp->ngram_min, sp->ngram_max, k,
                                       r->tokens + r->n_tokens);
        if (d > 0 && r->gstate && r->params.n_grammar_triggers == 0)
            d = grammar_viable(e, r, r->tokens + r->n_tokens, d);
        if (d == 0) continue;
        MOE_TRY(moe_runner_reserve(&e->r, &r->seq, r->n_tokens + d));
        ch->n = 1 + d;
        ch->all_logits = true;
        e->drafted[c] = d;
        *budget -= d;
    }
    if (sp->kind == MOE_SPEC_DRAFT) MOE_TRY(propose_drafts(e, nc, budget));
    return MOE_OK;
}

/* MOE_SPEC_MTP, after a step: the module computes the positions each
 * request's chunk has just verified (reading the target's hidden states
 * of the step's rows) and proposes the next step's drafts for requests
 * that decode next, as moe_engine_add_drafts would ask (spec_mtp.h). */
enum moe_status moe_engine_mtp_after_step(struct moe_engine *e, int nc)
{
    const struct moe_spec_opts *sp = &e->o.spec;
    const bool spec_next = !(sp->max_batch > 0 && e->n_running > sp->max_batch);
    int n = 0;
    for (int c = 0, batch_row = 0; c < nc; c++) {
        struct moe_request *r = e->sched[c];
        const struct moe_chunk *ch = &e->chunks[c];
        int first_row = batch_row;
        batch_row += ch->n;
        r->mtp_drafts = 0;
        if (r->state != MOE_REQ_RUNNING || r->params.no_spec) continue;
        int k = 0;
        if (spec_next && r->n_computed == r->n_tokens - 1 && r->n_tokens > r->n_prompt) {
            int left = r->params.max_tokens - (r->n_tokens - r->n_prompt) - 1;
            k = sp->adaptive ? spec_k(r, sp->tokens) : sp->tokens;
            if (k > left) k = left;
        }
        e->mtp.jobs[n++] = (struct moe_spec_mtp_job){
            .seq = &r->mtp_seq, .tokens = r->tokens, .n_tokens = r->n_tokens,
            .n_computed = r->n_computed, .step_first = (int)(ch->tokens - r->tokens),
            .step_row = first_row, .k = k > 0 ? k : 0, .out = r->tokens + r->n_tokens};
    }
    if (n == 0) return MOE_OK;
    MOE_TRY(moe_spec_mtp_run(&e->mtp, n));
    for (int c = 0, j = 0; c < nc && j < n; c++) {
        struct moe_request *r = e->sched[c];
        if (e->mtp.jobs[j].seq != &r->mtp_seq) continue;
        r->mtp_drafts = e->mtp.jobs[j++].k;
        r->mtp_at = r->n_tokens;
    }
    return MOE_OK;
}
