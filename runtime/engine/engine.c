/* engine.c - continuous batching (see engine.h): requests and their
 * queues, admission, preemption, the step, sampling and the verification
 * of drafts.  What drafts a step carries is engine_spec.c's. */
#include "runtime/engine/engine.h"
#include "runtime/core/clock.h"
#include "runtime/engine/engine_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "router/stats.h"
#include "runtime/engine/spec_draft.h"

const char *moe_finish_name(enum moe_finish f)
{
    switch (f) {
    case MOE_FINISH_STOP: return "stop";
    case MOE_FINISH_LENGTH: return "length";
    case MOE_FINISH_ABORT: return "abort";
    default: return "none";
    }
}

/* --- queues: doubly linked through the requests --- */

static void unlink_req(struct moe_request **head, struct moe_request **tail, struct moe_request *r)
{
    if (r->prev) r->prev->next = r->next;
    else *head = r->next;
    if (r->next) r->next->prev = r->prev;
    else *tail = r->prev;
    r->prev = r->next = NULL;
}

static void push_back(struct moe_request **head, struct moe_request **tail, struct moe_request *r)
{
    r->prev = *tail;
    r->next = NULL;
    if (*tail) (*tail)->next = r;
    else *head = r;
    *tail = r;
}

static void push_front(struct moe_request **head, struct moe_request **tail, struct moe_request *r)
{
    r->next = *head;
    r->prev = NULL;
    if (*head) (*head)->prev = r;
    else *tail = r;
    *head = r;
}

enum moe_status moe_engine_init(struct moe_engine *e, const struct moe_model *m,
                                struct moe_backend *be, const struct moe_engine_opts *o)
{
    memset(e, 0, sizeof *e);
    if (o->max_batch_tokens <= 0 || o->max_seqs <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "engine: max batch tokens and sequences must be positive");
    e->m = m;
    e->o = *o;
    MOE_TRY(moe_engine_spec_resolve(&e->o.spec));
    if (moe_config_linear_layers(&m->cfg) > 0 && e->o.spec.kind != MOE_SPEC_NONE)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: speculative decoding with linear-attention layers is not "
                        "supported yet (a rejected draft would need the recurrent state rewound)",
                        m->cfg.architecture);
    if (e->o.spec.kind == MOE_SPEC_DRAFT && e->o.spec.draft && moe_config_linear_layers(&e->o.spec.draft->cfg) > 0)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: a draft model with linear-attention layers is not supported "
                        "yet (its recurrent state cannot be rewound)", e->o.spec.draft->cfg.architecture);
    e->clock = moe_seconds;
    e->next_id = 1;
    /* a verification chunk has a logits row per token: at most every row
     * of a step, and K + 1 per sequence */
    int max_logits = o->max_seqs;
    if (e->o.spec.kind != MOE_SPEC_NONE) {
        int64_t all = (int64_t)o->max_seqs * (e->o.spec.tokens + 1);
        max_logits = (int)(all < o->max_batch_tokens ? all : o->max_batch_tokens);
        if (max_logits < o->max_seqs) max_logits = o->max_seqs;
    }
    struct moe_runner_opts ro = {
        .max_tokens = o->max_batch_tokens, .max_seqs = o->max_seqs, .max_logits = max_logits,
        .block_size = o->block_size, .n_blocks = o->n_blocks, .kv_dtype = o->kv_dtype,
        .kv_dtype_set = true, .prefix_cache = o->prefix_cache && moe_config_linear_layers(&m->cfg) == 0,
        .hidden = e->o.spec.kind == MOE_SPEC_MTP, .ep = o->ep};
    enum moe_status s;
    if (e->o.spec.kind == MOE_SPEC_DRAFT) {
        /* the draft's pool: as many tokens as the target's unless told */
        struct moe_spec_draft_opts dop = {
            .max_tokens = o->max_batch_tokens, .max_seqs = o->max_seqs,
            .block_size = o->block_size, .kv_dtype = o->kv_dtype,
            .n_blocks = e->o.spec.draft_blocks > 0 ? e->o.spec.draft_blocks : o->n_blocks,
            .sample = e->o.spec.sample_drafts, .grammar = o->grammar_vocab};
        struct moe_backend *dbe = e->o.spec.draft_be ? e->o.spec.draft_be : be;
        if ((s = moe_spec_draft_init(&e->draft, e->o.spec.draft, dbe, m->cfg.vocab, &dop)) != MOE_OK)
            goto fail;
    }
    if ((s = moe_runner_init(&e->r, m, be, &ro)) != MOE_OK) goto fail;
    if (e->o.spec.kind == MOE_SPEC_MTP) {
        struct moe_spec_mtp_opts mop = {
            .max_tokens = o->max_batch_tokens, .max_seqs = o->max_seqs,
            .block_size = o->block_size, .kv_dtype = o->kv_dtype,
            .n_blocks = e->o.spec.draft_blocks > 0 ? e->o.spec.draft_blocks : o->n_blocks,
            .hid = e->r.fw.hid, .zero_row = o->max_batch_tokens};
        if ((s = moe_spec_mtp_init(&e->mtp, e->o.spec.draft, be, &mop)) != MOE_OK) goto fail;
    }
    if ((s = moe_sampler_scratch_init(&e->scratch, m->cfg.vocab)) != MOE_OK) goto fail;
    e->chunks = calloc((size_t)o->max_seqs, sizeof *e->chunks);
    e->sched = calloc((size_t)o->max_seqs, sizeof *e->sched);
    e->drafted = calloc((size_t)o->max_seqs, sizeof *e->drafted);
    e->q_slot = malloc((size_t)o->max_seqs * sizeof *e->q_slot);
    if (e->o.spec.kind == MOE_SPEC_DRAFT && e->o.spec.sample_drafts) {
        size_t n;
        if (!moe_mul_size((size_t)MOE_SPEC_SAMPLED_SEQS * (size_t)e->o.spec.tokens,
                          (size_t)m->cfg.vocab, &n) || !moe_mul_size(n, sizeof(float), &n) ||
            !(e->spec_q = malloc(n))) {
            s = moe_fail(MOE_ERR_NOMEM, "engine: the distributions of sampled drafts");
            goto fail;
        }
    }
    if (o->grammar_vocab && o->grammar_vocab->V != m->cfg.vocab) {
        s = moe_fail(MOE_ERR_INVALID_ARG, "engine: the grammar vocabulary has %d tokens, the model %d",
                     o->grammar_vocab->V, m->cfg.vocab);
        goto fail;
    }
    if (o->grammar_vocab && e->o.spec.kind != MOE_SPEC_NONE &&
        !(e->gdraft = calloc((size_t)o->max_seqs, sizeof *e->gdraft))) {
        s = moe_fail(MOE_ERR_NOMEM, "engine: grammar states of drafts");
        goto fail;
    }
    e->gmask = malloc(((size_t)m->cfg.vocab + 31) / 32 * sizeof *e->gmask);
    e->logits = malloc((size_t)max_logits * (size_t)m->cfg.vocab * sizeof(float));
    e->ids = malloc((size_t)max_logits * sizeof *e->ids);
    if (!e->chunks || !e->sched || !e->drafted || !e->q_slot || !e->logits || !e->ids || !e->gmask) {
        s = moe_fail(MOE_ERR_NOMEM, "engine: step buffers");
        goto fail;
    }
    return MOE_OK;
fail:
    e->o.spec.draft_release = NULL; /* the caller keeps the draft */
    moe_engine_free(e);
    return s;
}

static void free_request(struct moe_engine *e, struct moe_request *r)
{
    moe_seq_free(&e->r, &r->seq);
    moe_spec_draft_seq_free(&e->draft, &r->draft_seq);
    moe_spec_mtp_seq_free(&e->mtp, &r->mtp_seq);
    free(r->tokens);
    free(r->samples);
    free(r->t_token);
    if (r->gstate) moe_grammar_state_free(r->gstate);
    free(r->gstate);
    free(r);
}

void moe_engine_free(struct moe_engine *e)
{
    struct moe_request *r, *n;
    for (r = e->run_head; r; r = n) {
        n = r->next;
        free_request(e, r);
    }
    for (r = e->wait_head; r; r = n) {
        n = r->next;
        free_request(e, r);
    }
    moe_runner_free(&e->r);
    moe_spec_draft_free(&e->draft);
    moe_spec_mtp_free(&e->mtp);
    if (e->o.spec.draft_release) e->o.spec.draft_release(e->o.spec.draft_ctx);
    moe_sampler_scratch_free(&e->scratch);
    free(e->chunks);
    free(e->sched);
    free(e->drafted);
    free(e->q_slot);
    free(e->spec_q);
    free(e->logits);
    free(e->ids);
    free(e->gmask);
    if (e->gdraft)
        for (int i = 0; i < e->o.max_seqs; i++) moe_grammar_state_free(&e->gdraft[i]);
    free(e->gdraft);
    memset(e, 0, sizeof *e);
}

int moe_engine_blocks_for(const struct moe_engine *e, int tokens)
{
    return (tokens + e->o.block_size - 1) / e->o.block_size;
}

enum moe_status moe_engine_submit(struct moe_engine *e, const int32_t *prompt, int n_prompt,
                                  const struct moe_request_params *p, void *user,
                                  struct moe_request **out)
{
    const struct moe_config *c = &e->m->cfg;
    *out = NULL;
    if (n_prompt <= 0) return moe_fail(MOE_ERR_INVALID_ARG, "request: the prompt is empty");
    if (p->max_tokens <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "request: max_tokens %d must be at least 1", p->max_tokens);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab)
            return moe_fail(MOE_ERR_INVALID_ARG,
                            "request: prompt token %d at position %d is outside the vocabulary of %d",
                            prompt[i], i, c->vocab);
    if ((int64_t)n_prompt + p->max_tokens > c->max_pos)
        return moe_fail(MOE_ERR_INVALID_ARG,
                        "request: %d prompt tokens + max_tokens %d = %lld exceeds the model's "
                        "context of %d", n_prompt, p->max_tokens,
                        (long long)n_prompt + p->max_tokens, c->max_pos);
    /* the last sampled token is never written to the cache */
    int need = moe_engine_blocks_for(e, n_prompt + p->max_tokens - 1);
    if (need > e->r.kv.part_blocks) /* data-parallel attention: one rank's part */
        return moe_fail(MOE_ERR_INVALID_ARG,
                        "request: %d prompt + %d new tokens need %d KV blocks of %d tokens, but the "
                        "cache holds only %d blocks%s; raise --kv-budget or lower max_tokens",
                        n_prompt, p->max_tokens, need, e->o.block_size, e->r.kv.part_blocks,
                        e->r.kv.parts > 1 ? " on each rank" : "");
    if (p->n_stop_ids < 0 || p->n_stop_ids > MOE_MAX_STOP_IDS)
        return moe_fail(MOE_ERR_INVALID_ARG, "request: %d stop ids (at most %d)", p->n_stop_ids,
                        MOE_MAX_STOP_IDS);
    MOE_TRY(moe_sampling_validate(&p->sampling));
    for (int i = 0; i < p->sampling.n_bias; i++)
        if (p->sampling.bias_ids[i] >= e->r.m->cfg.vocab)
            return moe_fail(MOE_ERR_INVALID_ARG, "logit_bias: token id %d is outside the vocabulary of %d",
                            p->sampling.bias_ids[i], e->r.m->cfg.vocab);
    if (p->priority < MOE_PRIORITY_MIN || p->priority > MOE_PRIORITY_MAX)
        return moe_fail(MOE_ERR_INVALID_ARG, "request: priority %d is outside [%d, %d]", p->priority,
                        MOE_PRIORITY_MIN, MOE_PRIORITY_MAX);
    if (p->grammar && !e->o.grammar_vocab)
        return moe_fail(MOE_ERR_INVALID_ARG, "request: a grammar needs the vocabulary's token bytes, "
                        "which this engine was not given");
    if (p->n_grammar_triggers < 0 || p->n_grammar_triggers > MOE_MAX_GRAMMAR_TRIGGERS ||
        (p->n_grammar_triggers > 0 && !p->grammar))
        return moe_fail(MOE_ERR_INVALID_ARG, "request: %d grammar triggers (at most %d, and only with a grammar)",
                        p->n_grammar_triggers, MOE_MAX_GRAMMAR_TRIGGERS);
    for (int i = 0; i < p->n_grammar_triggers; i++)
        if (p->grammar_triggers[i] < 0 || p->grammar_triggers[i] >= e->r.m->cfg.vocab)
            return moe_fail(MOE_ERR_INVALID_ARG, "request: grammar trigger %d is outside the vocabulary of %d",
                            p->grammar_triggers[i], e->r.m->cfg.vocab);
    struct moe_request *r = calloc(1, sizeof *r);
    if (!r) return moe_fail(MOE_ERR_NOMEM, "request");
    if (p->grammar) {
        enum moe_status gs = MOE_ERR_NOMEM;
        if (!(r->gstate = calloc(1, sizeof *r->gstate)) ||
            (gs = moe_grammar_state_init(r->gstate, p->grammar)) != MOE_OK) {
            if (gs == MOE_ERR_NOMEM) moe_fail(MOE_ERR_NOMEM, "request: its grammar state");
            free_request(e, r);
            return gs;
        }
        r->gactive = p->n_grammar_triggers == 0;
    }
    r->cap = n_prompt + p->max_tokens;
    r->tokens = malloc((size_t)r->cap * sizeof *r->tokens);
    r->samples = malloc((size_t)p->max_tokens * sizeof *r->samples);
    r->t_token = malloc((size_t)p->max_tokens * sizeof *r->t_token);
    if (!r->tokens || !r->samples || !r->t_token) {
        int cap = r->cap;
        free_request(e, r);
        return moe_fail(MOE_ERR_NOMEM, "request of %d tokens", cap);
    }
    memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_prompt = r->n_tokens = n_prompt;
    r->params = *p;
    r->id = e->next_id++;
    r->user = user;
    r->state = MOE_REQ_WAITING;
    r->t_arrival = e->clock();
    moe_rng_seed(&r->rng, p->sampling.seed);
    moe_rng_seed(&r->draft_rng, p->sampling.seed ^ 0x5851f42d4c957f2dull);
    push_back(&e->wait_head, &e->wait_tail, r);
    e->n_waiting++;
    e->n.prompt_tokens += (uint64_t)n_prompt;
    *out = r;
    return MOE_OK;
}

/* Returns r's blocks and forgets what it had computed. */
static void drop_cache(struct moe_engine *e, struct moe_request *r)
{
    moe_seq_reset(&e->r, &r->seq);
    moe_spec_draft_reset(&e->draft, &r->draft_seq);
    moe_spec_mtp_reset(&e->mtp, &r->mtp_seq);
    r->mtp_drafts = 0;
    r->n_computed = 0;
    r->n_cached_blocks = 0;
}

static void finish(struct moe_engine *e, struct moe_request *r, enum moe_finish why)
{
    if (r->state == MOE_REQ_RUNNING) {
        unlink_req(&e->run_head, &e->run_tail, r);
        e->n_running--;
    } else if (r->state == MOE_REQ_WAITING) {
        unlink_req(&e->wait_head, &e->wait_tail, r);
        e->n_waiting--;
    }
    drop_cache(e, r);
    r->state = MOE_REQ_FINISHED;
    r->finish = why;
    r->t_finish = e->clock();
    if (why == MOE_FINISH_ABORT) e->n.requests_aborted++;
    else e->n.requests_finished++;
}

void moe_engine_cancel(struct moe_engine *e, struct moe_request *r)
{
    if (r->state == MOE_REQ_FINISHED) return;
    finish(e, r, MOE_FINISH_ABORT);
    if (e->on_token) e->on_token(r->user, r, -1, true);
}

void moe_engine_stop(struct moe_engine *e, struct moe_request *r)
{
    if (r->state != MOE_REQ_FINISHED) finish(e, r, MOE_FINISH_STOP);
}

void moe_engine_release(struct moe_engine *e, struct moe_request *r)
{
    if (!r) return;
    if (r->state != MOE_REQ_FINISHED) finish(e, r, MOE_FINISH_ABORT);
    free_request(e, r);
}

bool moe_engine_idle(const struct moe_engine *e) { return !e->run_head && !e->wait_head; }

static void preempt(struct moe_engine *e, struct moe_request *r)
{
    unlink_req(&e->run_head, &e->run_tail, r);
    e->n_running--;
    drop_cache(e, r);
    r->state = MOE_REQ_WAITING;
    r->n_preempted++;
    push_front(&e->wait_head, &e->wait_tail, r);
    e->n_waiting++;
    e->n.preemptions++;
}

/* Shares the longest chain of cached blocks that matches r's tokens,
 * leaving at least one token to compute. */
static enum moe_status match_prefix(struct moe_engine *e, struct moe_request *r)
{
    const int B = e->o.block_size;
    if (!e->o.prefix_cache) return MOE_OK;
    int32_t parent = -1;
    for (int i = 0; (i + 1) * B <= r->n_tokens - 1; i++) {
        int32_t b = moe_kvcache_lookup(&e->r.kv, parent, r->tokens + (size_t)i * B);
        if (b < 0) break;
        enum moe_status s = moe_seq_push_block(&e->r, &r->seq, b);
        if (s != MOE_OK) {
            moe_kvcache_release_block(&e->r.kv, b);
            return s;
        }
        parent = b;
    }
    r->n_computed = r->seq.n_blocks * B;
    r->seq.len = r->n_computed;
    r->n_cached_blocks = r->seq.n_blocks;
    r->n_prefix_hit += r->n_computed;
    e->n.prefix_hit_tokens += (uint64_t)r->n_computed;
    return MOE_OK;
}

static void add_chunk(struct moe_engine *e, int *nc, struct moe_request *r, int n)
{
    bool decode = n == 1 && r->n_computed == r->n_tokens - 1 && r->n_tokens > r->n_prompt;
    e->chunks[*nc] = (struct moe_chunk){&r->seq, r->tokens + r->n_computed, n, false, decode, r->id};
    e->sched[(*nc)++] = r;
}

/* Registers the blocks r has completely computed in the prefix cache. */
static void cache_full_blocks(struct moe_engine *e, struct moe_request *r)
{
    const int B = e->o.block_size;
    while ((r->n_cached_blocks + 1) * B <= r->n_computed) {
        int k = r->n_cached_blocks++;
        moe_kvcache_cache_block(&e->r.kv, r->seq.blocks[k], k ? r->seq.blocks[k - 1] : -1,
                                r->tokens + (size_t)k * B);
    }
}

static bool is_stop(const struct moe_request *r, int32_t t)
{
    for (int i = 0; i < r->params.n_stop_ids; i++)
        if (r->params.stop_ids[i] == t) return true;
    return false;
}

/* Whether r's next token is drawn on the host (not the backend's argmax). */
static bool host_sample(const struct moe_request *r)
{
    return r->gstate || !moe_sampling_is_argmax(&r->params.sampling);
}

/* Whether r's grammar masks its next token: not lazy, or inside a block
 * that is not complete yet (where a lazy grammar accepts, any token may
 * follow: one that does not continue it ends the block). */
static bool grammar_masks(const struct moe_request *r)
{
    return r->gstate && r->gactive &&
           (r->params.n_grammar_triggers == 0 || !moe_grammar_state_accepting(r->gstate));
}

/* Sets the logits of the tokens r's grammar does not allow next to -inf;
 * its stop ids stay only where the grammar accepts.  False when nothing
 * is allowed (or the grammar's limits were hit): the request cannot go on. */
static bool grammar_mask(struct moe_engine *e, struct moe_request *r, float *logits)
{
    const int V = e->m->cfg.vocab;
    if (moe_grammar_mask(r->gstate, e->o.grammar_vocab, e->gmask) != MOE_OK) return false;
    e->n.grammar_masks++;
    float keep[MOE_MAX_STOP_IDS];
    bool accepting = moe_grammar_state_accepting(r->gstate);
    for (int i = 0; i < r->params.n_stop_ids; i++) keep[i] = logits[r->params.stop_ids[i]];
    int allowed = 0;
    for (int t = 0; t < V; t++) {
        if (e->gmask[t >> 5] >> (t & 31) & 1) allowed++;
        else logits[t] = -INFINITY;
    }
    if (accepting)
        for (int i = 0; i < r->params.n_stop_ids; i++) {
            logits[r->params.stop_ids[i]] = keep[i];
            allowed++;
        }
    return allowed > 0;
}

/* Samples r's next token from logits row `row` of the step: the backend's
 * argmax for plain greedy requests, the sampler on the host otherwise. */
static void emit(struct moe_engine *e, struct moe_request *r);

static void sample(struct moe_engine *e, struct moe_request *r, int row)
{
    const int V = e->m->cfg.vocab;
    struct moe_sample *s = &r->samples[r->n_tokens - r->n_prompt];
    if (!host_sample(r)) {
        memset(s, 0, sizeof *s);
        s->token = e->ids[row];
        s->logprob = NAN; /* not asked for, not computed */
    } else {
        float *logits = e->logits + (size_t)row * V;
        if (grammar_masks(r) && !grammar_mask(e, r, logits)) {
            finish(e, r, MOE_FINISH_ABORT);
            if (e->on_token) e->on_token(r->user, r, -1, true);
            return;
        }
        moe_sampler_sample(&r->params.sampling, &r->rng, logits, V, r->tokens, r->n_prompt,
                           r->n_tokens, &e->scratch, s);
    }
    emit(e, r);
}

static bool is_trigger(const struct moe_request *r, int32_t t)
{
    for (int i = 0; i < r->params.n_grammar_triggers; i++)
        if (r->params.grammar_triggers[i] == t) return true;
    return false;
}

/* Advances r's grammar by token t; true when the grammar is complete
 * (accepting, and nothing can follow) and not lazy.  A lazy grammar's
 * block ends there, or where it accepts and t does not continue it, and
 * starts again, from the grammar's start, after a trigger. */
static bool grammar_advance(struct moe_engine *e, struct moe_request *r, int32_t t, bool *dead)
{
    const struct moe_grammar_vocab *gv = e->o.grammar_vocab;
    const bool lazy = r->params.n_grammar_triggers > 0;
    bool ok = false;
    *dead = false;
    if (r->gactive && !is_stop(r, t)) {
        const bool accepting = moe_grammar_state_accepting(r->gstate);
        if (moe_grammar_state_advance_token(r->gstate, gv, t, &ok) != MOE_OK) {
            *dead = true; /* a limit of the grammar state */
            return false;
        }
        if (!ok && !(lazy && accepting)) {
            *dead = true; /* the mask allowed only tokens that advance: a broken contract */
            return false;
        }
        if (!ok) r->gactive = false; /* t follows a complete block */
        else if (moe_grammar_state_accepting(r->gstate) && !moe_grammar_state_can_continue(r->gstate)) {
            if (!lazy) return true;
            r->gactive = false;
        }
        if (r->gactive) return false;
    }
    if (!r->gactive && is_trigger(r, t)) { /* a block starts: the grammar from its start */
        moe_grammar_state_free(r->gstate);
        if (moe_grammar_state_init(r->gstate, r->params.grammar) != MOE_OK) {
            *dead = true;
            return false;
        }
        r->gactive = true;
    }
    return false;
}

/* Emits the token of r's next sample (filled in): its time, stop ids,
 * max_tokens and the callback. */
static void emit(struct moe_engine *e, struct moe_request *r)
{
    int g = r->n_tokens - r->n_prompt;
    const struct moe_sample *s = &r->samples[g];
    double now = e->clock();
    if (g == 0) r->t_first = now;
    r->t_token[g] = now;
    r->tokens[r->n_tokens++] = s->token;
    e->n.generated_tokens++;
    enum moe_finish why = MOE_FINISH_NONE;
    bool dead = false;
    if (r->gstate && grammar_advance(e, r, s->token, &dead)) why = MOE_FINISH_STOP;
    if (dead) why = MOE_FINISH_ABORT;
    else if ((r->stop_token = is_stop(r, s->token))) why = MOE_FINISH_STOP;
    else if (why == MOE_FINISH_NONE && r->n_tokens - r->n_prompt >= r->params.max_tokens)
        why = MOE_FINISH_LENGTH;
    if (why != MOE_FINISH_NONE) finish(e, r, why);
    if (e->on_token) e->on_token(r->user, r, s->token, why != MOE_FINISH_NONE);
}

/* Checks the d tokens drafted after r's last token against the target's
 * tokens of rows row .. row + d of the step: each drafted token is kept
 * while it equals the target's token of the row before it, then the
 * target's own token is emitted.  Each emitted token goes through sample()
 * (timing, samples, stop ids, max_tokens, callback) exactly as one decode
 * step's would.  Then the cache is rolled back to the verified tokens.
 *
 * A sampled request's token of a row is drawn by the sampler with its own
 * generator, as a decode step would draw it.  The proposers draft a token
 * for sure (q one-hot), and for such a q keeping the draft x when the draw
 * equals it is Leviathan et al.'s modified rejection sampling: x is kept
 * with probability p(x) = min(1, p(x)/q(x)), and a draw that differs is
 * distributed as norm(max(0, p - q)), p without x.  The generator is used
 * once per emitted token, as without speculation, so a seeded request's
 * output is the same token for token.
 *
 * A request with a grammar: each row's logits are masked with the grammar
 * state after the tokens emitted before it, which are the drafts kept so
 * far (emit advances the state), so a draft the grammar does not allow is
 * rejected like any other draft the target would not choose; the
 * distribution of the emitted tokens is the masked target's (rejection
 * sampling needs nothing of q beyond its having drawn the draft). */
static void verify(struct moe_engine *e, struct moe_request *r, int row, int d, int batch_row,
                   const float *q)
{
    const int n_before = r->n_tokens, V = e->m->cfg.vocab;
    int accepted = 0;
    bool rejected = false;
    for (int i = 0; i <= d; i++) {
        /* sample() overwrites the drafted token with the emitted one */
        int32_t drafted = i < d ? r->tokens[r->n_tokens] : -1;
        bool kept;
        if (q && i < d) { /* a draft drawn from q: rejection sampling */
            float *logits = e->logits + (size_t)(row + i) * V;
            if (grammar_masks(r) && !grammar_mask(e, r, logits)) {
                finish(e, r, MOE_FINISH_ABORT);
                if (e->on_token) e->on_token(r->user, r, -1, true);
                break;
            }
            kept = moe_sampler_accept(&r->params.sampling, &r->rng, logits, V,
                                      r->tokens, r->n_prompt, r->n_tokens, &e->scratch,
                                      q + (size_t)i * V, drafted,
                                      &r->samples[r->n_tokens - r->n_prompt]);
            emit(e, r);
        } else {
            sample(e, r, row + i);
            kept = i < d && r->tokens[r->n_tokens - 1] == drafted;
        }
        if (kept) {
            accepted++;
            e->n.spec_accepted_at[i]++;
        }
        rejected = i < d && !kept;
        if (!kept || r->state != MOE_REQ_RUNNING) break;
    }
    r->n_drafted += d;
    r->n_accepted += accepted;
    /* the per-token acceptance this verification shows (accepted drafts
     * over accepted plus the one rejected, if any: a run stops at its
     * first rejection) into the request's moving average, weight 1/4 */
    if (accepted + rejected > 0) {
        double rate = (double)accepted / (accepted + rejected);
        r->spec_accept = r->n_spec_steps++ ? 0.75 * r->spec_accept + 0.25 * rate : rate;
    }
    e->n.spec_drafts++;
    e->n.spec_draft_tokens += (uint64_t)d;
    e->n.spec_accepted += (uint64_t)accepted;
    /* the e tokens emitted are what decoding alone would have computed as
     * rows 0 .. e - 1 (the last token, then all but the last emitted); the
     * rows after them computed drafts that were rejected (or came after a
     * stop) */
    int emitted = r->n_tokens - n_before;
    if (e->r.fw.stats && emitted <= d)
        moe_stats_spec_rejected(e->r.fw.stats, batch_row + emitted, d + 1 - emitted);
    if (r->state != MOE_REQ_RUNNING) return; /* finished: its cache is gone */
    /* the cache holds every token but the last emitted one; the K/V of
     * rejected drafts goes, and only verified blocks reach the prefix cache */
    r->n_computed = r->n_tokens - 1;
    moe_seq_truncate(&e->r, &r->seq, r->n_computed);
    moe_spec_draft_rollback(&e->draft, &r->draft_seq, r->n_computed);
    cache_full_blocks(e, r);
}

/* The newest running request whose blocks are in part p of the pool. */
static struct moe_request *newest_in_part(struct moe_engine *e, int p)
{
    struct moe_request *v = e->run_tail;
    while (v && moe_runner_seq_part(&e->r, &v->seq) != p) v = v->prev;
    return v;
}

/* Running requests, oldest first: a decode token or the next prefill
 * chunk each, preempting the newest when blocks run short (of those in
 * the same part of a divided pool: data-parallel attention). */
static enum moe_status schedule_running(struct moe_engine *e, int *nc, int *budget, bool *preempted)
{
    struct moe_kvcache *kv = &e->r.kv;
    struct moe_request *r = e->run_head;
    while (r && *budget > 0 && *nc < e->o.max_seqs) {
        int n = r->n_tokens - r->n_computed;
        if (n > *budget) n = *budget;
        bool self_preempted = false;
        const int part = moe_runner_seq_part(&e->r, &r->seq);
        while (moe_engine_blocks_for(e, r->n_computed + n) - r->seq.n_blocks > moe_kvcache_available_in(kv, part)) {
            struct moe_request *victim = newest_in_part(e, part);
            preempt(e, victim);
            *preempted = true;
            if (victim == r) {
                self_preempted = true;
                break;
            }
        }
        if (self_preempted) break;
        MOE_TRY(moe_runner_reserve(&e->r, &r->seq, r->n_computed + n));
        add_chunk(e, nc, r, n);
        *budget -= n;
        r = r->next;
    }
    return MOE_OK;
}

/* The waiting request to admit next (engine.h, moe_request_params'
 * priority): the least priority less its waiting time in levels, then
 * the earliest arrival, then the lowest id. */
static struct moe_request *next_waiting(const struct moe_engine *e, double now)
{
    const double aging = e->o.priority_aging > 0 ? e->o.priority_aging : 10.0;
    struct moe_request *best = NULL;
    double best_key = 0;
    for (struct moe_request *r = e->wait_head; r; r = r->next) {
        const double key = r->params.priority - (now - r->t_arrival) / aging;
        if (!best || key < best_key ||
            (key == best_key && (r->t_arrival < best->t_arrival ||
                                 (r->t_arrival == best->t_arrival && r->id < best->id)))) {
            best = r;
            best_key = key;
        }
    }
    return best;
}

/* Waiting requests, in admission order, into what is left of the budget
 * and the free blocks; the first that does not fit stops admission (none
 * passes it). */
static enum moe_status admit_waiting(struct moe_engine *e, int *nc, int *budget)
{
    struct moe_kvcache *kv = &e->r.kv;
    const double now = e->clock();
    while (e->wait_head && *budget > 0 && *nc < e->o.max_seqs) {
        struct moe_request *r = next_waiting(e, now);
        if (r->seq.n_blocks == 0) MOE_TRY(match_prefix(e, r));
        int n = r->n_tokens - r->n_computed;
        if (n > *budget) n = *budget;
        /* shrink the chunk to the blocks that are free (in the part it takes them from) */
        const int part = moe_runner_seq_part(&e->r, &r->seq);
        int fit = (r->seq.n_blocks + moe_kvcache_available_in(kv, part)) * e->o.block_size - r->n_computed;
        if (n > fit) n = fit;
        if (n <= 0) {
            drop_cache(e, r); /* give back prefix hits; they stay cached */
            break;
        }
        MOE_TRY(moe_runner_reserve(&e->r, &r->seq, r->n_computed + n));
        unlink_req(&e->wait_head, &e->wait_tail, r);
        e->n_waiting--;
        push_back(&e->run_head, &e->run_tail, r);
        e->n_running++;
        r->state = MOE_REQ_RUNNING;
        add_chunk(e, nc, r, n);
        *budget -= n;
    }
    return MOE_OK;
}

enum moe_status moe_engine_step(struct moe_engine *e, int *n_scheduled)
{
    int budget = e->o.max_batch_tokens, nc = 0, rows = 0;
    bool preempted = false;
    *n_scheduled = 0;
    e->n_sched = 0;
    memset(e->drafted, 0, (size_t)e->o.max_seqs * sizeof *e->drafted);
    for (int c = 0; c < e->o.max_seqs; c++) e->q_slot[c] = -1;
    MOE_TRY(schedule_running(e, &nc, &budget, &preempted));
    MOE_TRY(moe_engine_add_drafts(e, nc, &budget));
    /* not in a step that had to preempt: memory is short, and the victim
     * would only thrash */
    if (!preempted) MOE_TRY(admit_waiting(e, &nc, &budget));
    if (nc == 0) return MOE_OK;
    /* logits rows cross to the host only when a request that samples now
     * needs more than the argmax */
    bool host_logits = false;
    for (int c = 0; c < nc; c++) {
        struct moe_request *r = e->sched[c];
        if (r->n_computed + e->chunks[c].n >= r->n_tokens && host_sample(r))
            host_logits = true;
    }
    MOE_TRY(moe_runner_step(&e->r, e->chunks, nc, host_logits ? e->logits : NULL, e->ids, &rows,
                            e->trace));
    e->n.steps++;
    e->n_sched = nc;
    for (int c = 0, row = 0, batch_row = 0; c < nc; c++) {
        struct moe_request *r = e->sched[c];
        const struct moe_chunk *ch = &e->chunks[c];
        int n = ch->n, first = row, first_batch_row = batch_row;
        row += ch->all_logits ? n : 1;
        batch_row += n;
        *n_scheduled += n;
        if (r->state != MOE_REQ_RUNNING) continue; /* ended by a callback this step */
        if (!ch->decode) {
            r->n_prefilled += n;
            e->n.prefill_tokens += (uint64_t)n;
        }
        r->n_computed += n;
        if (e->drafted[c] > 0) {
            const float *q = e->q_slot[c] >= 0 ? e->spec_q + (size_t)e->q_slot[c] * e->o.spec.tokens *
                                                             (size_t)e->m->cfg.vocab
                                                : NULL;
            verify(e, r, first, e->drafted[c], first_batch_row, q);
            continue;
        }
        cache_full_blocks(e, r);
        if (r->n_computed == r->n_tokens) sample(e, r, first);
    }
    if (e->o.spec.kind == MOE_SPEC_MTP) MOE_TRY(moe_engine_mtp_after_step(e, nc));
    return MOE_OK;
}
