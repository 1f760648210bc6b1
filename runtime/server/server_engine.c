/* server_engine.c - the engine thread of `moerun serve` (see server.h).
 *
 * Each loop: take the queued jobs and submit one engine request per choice
 * (seeds seed, seed+1, ...); cancel the requests of abandoned jobs (their
 * KV blocks go back at once); run one engine step; count expert load for
 * the requests that asked; finish the jobs whose choices are all done.  It
 * sleeps on the queue's condition variable when there is nothing to do.
 *
 * Text: each choice has its own textgen (streaming detokenizer + stop
 * strings) on the engine thread's tokenizer; a stop string stops the engine
 * request at once.  Response bytes (SSE events, or the final JSON body) are
 * formatted here and appended to the job's buffer under job->mu. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "runtime/server/server.h"
#include "runtime/core/clock.h"
#include "runtime/core/strbuf.h"

const double srv_hist_le[SRV_HIST_N] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25,  0.5,    1,     2.5,  5,     10,  30};

static void hist_add(struct srv_hist *h, double x)
{
    int i = 0;
    while (i < SRV_HIST_N && x > srv_hist_le[i]) i++;
    h->b[i]++;
    h->sum += x;
    h->n++;
}

void srv_count_status(struct srv *s, int status)
{
    if (status < 100 || status > 599) status = 500;
    pthread_mutex_lock(&s->m_mu);
    s->met.by_status[status]++;
    pthread_mutex_unlock(&s->m_mu);
}

void srv_job_unref(struct srv_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    for (int i = 0; i < SRV_MAX_N; i++) {
        struct srv_choice *c = &j->ch[i];
        moe_textgen_free(&c->tg);
        moe_reasoning_free(&c->rs);
        moe_tool_calls_free(&c->tc);
        free(c->text);
        free(c->reason);
        free(c->load);
        json_decref(c->lp);
    }
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    json_decref(j->tool_defs);
    moe_grammar_free(j->grammar);
    if (j->prompt != j->prompts[0]) free(j->prompt);
    for (int p = 0; p < SRV_MAX_N; p++) free(j->prompts[p]); /* also one a bad request left half read */
    free(j->reject_msg);
    free(j->out);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    atomic_fetch_sub(&j->s->jobs_live, 1);
    free(j);
}

int srv_enqueue(struct srv *s, struct srv_job *j)
{
    pthread_mutex_lock(&s->q_mu);
    const int status = s->stopping || s->draining ? 503
                     : s->q_len + atomic_load(&s->eng_waiting) < s->o.max_queue ? 0 : 429;
    if (status == 0) {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        j->next = NULL;
        if (s->q_tail) s->q_tail->next = j;
        else s->q_head = j;
        s->q_tail = j;
        s->q_len++;
        pthread_cond_signal(&s->q_cv);
    }
    pthread_mutex_unlock(&s->q_mu);
    return status;
}

/* --- response bytes (caller holds nothing; takes job->mu) --- */

static void emit(struct srv_job *j, const char *data, size_t n, bool done)
{
    pthread_mutex_lock(&j->mu);
    if (j->n_out + n + 1 > j->cap_out) {
        size_t cap = j->cap_out ? j->cap_out : 1024;
        while (cap < j->n_out + n + 1) cap *= 2;
        char *p = realloc(j->out, cap);
        if (p) {
            j->out = p;
            j->cap_out = cap;
        } else {
            n = 0; /* out of memory: the response ends here */
            done = true;
        }
    }
    if (n) memcpy(j->out + j->n_out, data, n);
    j->n_out += n;
    if (done) j->done = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* Sends "data: <json>\n\n" (steals obj). */
static void emit_event(struct srv_job *j, json_t *obj)
{
    char *t = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!t) return;
    size_t n = strlen(t);
    char *ev = malloc(n + 9);
    if (ev) {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, t, n);
        memcpy(ev + 6 + n, "\n\n", 3);
        emit(j, ev, n + 8, false);
    }
    free(ev);
    free(t);
}

static json_t *token_text(struct srv *s, int32_t id)
{
    char *t = NULL;
    if (!s->have_tok || moe_tokenizer_decode(&s->tok_eng, &id, 1, false, &t) != MOE_OK) {
        char b[32];
        snprintf(b, sizeof b, "<%d>", id);
        return json_string(b);
    }
    json_t *x = json_stringn_nocheck(t, strlen(t));
    free(t);
    return x;
}

/* The UTF-8 bytes of a token's text (chat logprobs' "bytes"). */
static json_t *utf8_bytes(json_t *text)
{
    json_t *a = json_array();
    const unsigned char *p = (const unsigned char *)json_string_value(text);
    for (size_t i = 0; a && p && i < json_string_length(text); i++) json_array_append_new(a, json_integer(p[i]));
    return a;
}

/* The logprobs of one sampled token of choice c, in the request's flavour.
 * Completions entries carry the token's offset in the choice's text
 * (characters, as OpenAI's text_offset counts them). */
static json_t *logprob_entry(struct srv *s, struct srv_choice *c, const struct moe_sample *sm)
{
    const struct srv_job *j = c->job;
    if (j->chat) {
        json_t *top = json_array();
        for (int k = 0; k < sm->n_top && k < j->logprobs; k++) {
            json_t *t = token_text(s, sm->top_ids[k]);
            json_array_append_new(top, json_pack("{s:O, s:f, s:o}", "token", t, "logprob",
                                                 (double)sm->top_logprobs[k], "bytes", utf8_bytes(t)));
            json_decref(t);
        }
        json_t *t = token_text(s, sm->token);
        json_t *e = json_pack("{s:O, s:f, s:o, s:o}", "token", t, "logprob", (double)sm->logprob, "bytes",
                              utf8_bytes(t), "top_logprobs", top);
        json_decref(t);
        return e;
    }
    json_t *top = json_object();
    for (int k = 0; k < sm->n_top; k++) {
        json_t *t = token_text(s, sm->top_ids[k]);
        json_object_set_new(top, json_string_value(t), json_real(sm->top_logprobs[k]));
        json_decref(t);
    }
    json_t *t = token_text(s, sm->token);
    json_t *e = json_pack("{s:O, s:f, s:o, s:I}", "token", t, "logprob", (double)sm->logprob, "top", top,
                          "offset", (json_int_t)c->text_offset);
    const char *p = json_string_value(t);
    for (size_t i = 0; p && i < json_string_length(t); i++) c->text_offset += ((unsigned char)p[i] & 0xC0) != 0x80;
    json_decref(t);
    return e;
}

/* Completions logprobs {tokens, token_logprobs, top_logprobs, text_offset} from entries. */
static json_t *completion_logprobs(json_t *entries)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array(), *e;
    size_t i;
    json_array_foreach(entries, i, e) {
        json_array_append(tokens, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append(tops, json_object_get(e, "top"));
        json_array_append(offs, json_object_get(e, "offset"));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

static bool wants_logprobs(const struct srv_job *j)
{
    return j->chat ? j->chat_logprobs : j->logprobs >= 0;
}

static json_t *chunk_base(struct srv *s, struct srv_job *j)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", j->id, "object",
                     j->chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)j->created, "model", s->model_name);
}

/* OpenAI's tool_calls entries for calls [from, to) of choice c (streamed
 * deltas carry their index). */
static json_t *tool_calls_json(struct srv_choice *c, int from, int to, bool delta)
{
    json_t *a = json_array();
    for (int k = from; k < to; k++) {
        char seed[80], id[96];
        snprintf(seed, sizeof seed, "%s_%d_%d", c->job->id, c->index, k);
        moe_tool_calls_id(&c->tc, k, seed, id, sizeof id);
        json_t *o = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name",
                              c->tc.calls[k].name, "arguments", c->tc.calls[k].arguments);
        if (o && delta) json_object_set_new(o, "index", json_integer(k));
        json_array_append_new(a, o);
    }
    return a;
}

/* One streamed piece of choice c: text (may be ""), logprobs entry (stolen,
 * may be NULL), finish reason or NULL. */
static void stream_piece(struct srv *s, struct srv_choice *c, const char *text, const char *reason,
                         json_t *lp, const char *finish)
{
    struct srv_job *j = c->job;
    json_t *ch = json_pack("{s:i}", "index", c->index);
    if (j->chat) {
        json_t *delta = json_object();
        if (!c->role_sent) json_object_set_new(delta, "role", json_string("assistant"));
        c->role_sent = true;
        if (*reason) json_object_set_new(delta, "reasoning_content", json_string(reason));
        const bool calls = c->tc_on && c->calls_sent < c->tc.n_calls;
        if (*text || (!finish && !*reason && !calls)) json_object_set_new(delta, "content", json_string(text));
        if (calls) { /* each call whole, once complete */
            json_object_set_new(delta, "tool_calls", tool_calls_json(c, c->calls_sent, c->tc.n_calls, true));
            c->calls_sent = c->tc.n_calls;
        }
        json_object_set_new(ch, "delta", delta);
        json_object_set_new(ch, "logprobs", lp ? json_pack("{s:[o]}", "content", lp) : json_null());
    } else {
        json_object_set_new(ch, "text", json_string(text));
        if (lp) {
            json_t *a = json_pack("[o]", lp);
            json_object_set_new(ch, "logprobs", completion_logprobs(a));
            json_decref(a);
        } else {
            json_object_set_new(ch, "logprobs", json_null());
        }
    }
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *ev = chunk_base(s, j);
    json_object_set_new(ev, "choices", json_pack("[o]", ch));
    emit_event(j, ev);
}

static void append_to(char **buf, size_t *len, size_t *cap, const char *t)
{
    (void)moe_buf_append(buf, len, cap, t, strlen(t)); /* out of memory: the text ends there */
}

static void choice_done(struct srv *s, struct srv_choice *c, enum moe_finish why)
{
    if (c->r) c->n_cached = c->r->n_prefix_hit;
    c->done = true;
    c->finish = why;
    c->job->n_done++;
    pthread_mutex_lock(&s->m_mu);
    if (why == MOE_FINISH_ABORT) s->met.aborted++;
    else s->met.finished++;
    pthread_mutex_unlock(&s->m_mu);
}

/* A choice's text after the detokenizer: t (this token's), plus what
 * textgen held back when flush; through the reasoning split and the tool
 * call parser when the choice has them, each flushed at the last token.
 * *reason and *answer are new strings (NULL: empty; free()). */
static void split_text(struct srv_choice *c, const char *t, bool flush, bool last, char **reason, char **answer)
{
    char *det = NULL, *ans = NULL;
    size_t n_det = 0, cap_det = 0, n_r = 0, cap_r = 0, n_a = 0, cap_a = 0, n_o = 0, cap_o = 0;
    const char *p, *q;
    append_to(&det, &n_det, &cap_det, t);
    if (flush && moe_textgen_finish(&c->tg, &p) == MOE_OK) append_to(&det, &n_det, &cap_det, p);
    *reason = *answer = NULL;
    if (c->rs_on) {
        if (moe_reasoning_push(&c->rs, det ? det : "", &p, &q) == MOE_OK) {
            append_to(reason, &n_r, &cap_r, p);
            append_to(&ans, &n_a, &cap_a, q);
        }
        if (last && moe_reasoning_finish(&c->rs, &p, &q) == MOE_OK) {
            append_to(reason, &n_r, &cap_r, p);
            append_to(&ans, &n_a, &cap_a, q);
        }
        free(det);
    } else {
        ans = det;
    }
    if (!c->tc_on) {
        *answer = ans;
        return;
    }
    if (moe_tool_calls_push(&c->tc, ans ? ans : "", &p) == MOE_OK) append_to(answer, &n_o, &cap_o, p);
    if (last && moe_tool_calls_finish(&c->tc, &p) == MOE_OK) append_to(answer, &n_o, &cap_o, p);
    free(ans);
}

static void on_token(void *user, struct moe_request *r, int32_t token, bool finished)
{
    struct srv_choice *c = user;
    struct srv_job *j = c->job;
    struct srv *s = j->s;
    if (c->done) return;
    if (token < 0) {
        choice_done(s, c, MOE_FINISH_ABORT);
        return;
    }
    int g = c->n_gen++;
    pthread_mutex_lock(&s->m_mu);
    if (g == 0) hist_add(&s->met.ttft, r->t_token[0] - j->t_recv);
    else hist_add(&s->met.itl, r->t_token[g] - r->t_token[g - 1]);
    pthread_mutex_unlock(&s->m_mu);
    const char *t = "";
    /* an end-of-sequence or stop token ends the text without being part of
     * it (the detokenizer drops special ones anyway, except for harmony) */
    const bool eos = finished && r->stop_token;
    if (c->tg_on && !eos && moe_textgen_push(&c->tg, token, &t) != MOE_OK) t = "";
    bool stopped = c->tg_on && c->tg.stopped;
    if (stopped && !finished) moe_engine_stop(&s->e, r);
    enum moe_finish why = stopped ? MOE_FINISH_STOP : finished ? r->finish : MOE_FINISH_NONE;
    /* the text's reasoning and answer apart, tool calls out of the answer */
    char *reason = NULL, *answer = NULL;
    split_text(c, t, why != MOE_FINISH_NONE && c->tg_on && !stopped, why != MOE_FINISH_NONE, &reason, &answer);
    t = answer ? answer : "";
    const bool why_calls = why == MOE_FINISH_STOP && c->tc_on && c->tc.n_calls > 0; /* "tool_calls" */
    json_t *lp = wants_logprobs(j) ? logprob_entry(s, c, &r->samples[g]) : NULL;
    if (j->stream) {
        const bool calls = c->tc_on && c->calls_sent < c->tc.n_calls;
        if (*t || (reason && *reason) || lp || calls) stream_piece(s, c, t, reason ? reason : "", lp, NULL);
        if (why != MOE_FINISH_NONE)
            stream_piece(s, c, "", "", NULL, why_calls ? "tool_calls" : moe_finish_name(why));
    } else {
        append_to(&c->text, &c->n_text, &c->cap_text, t);
        append_to(&c->reason, &c->n_reason, &c->cap_reason, reason ? reason : "");
        if (lp) {
            if (!c->lp) c->lp = json_array();
            json_array_append_new(c->lp, lp);
        }
    }
    free(reason);
    free(answer);
    if (why != MOE_FINISH_NONE) choice_done(s, c, why);
}

/* usage {prompt_tokens, completion_tokens, total_tokens,
 * prompt_tokens_details {cached_tokens}[, expert_load]}: a prompt's cached
 * tokens are the fewest the prefix cache gave any of its choices (the
 * others may have reused the first's blocks), at most its length. */
static json_t *usage_json(struct srv *s, struct srv_job *j)
{
    int gen = 0, cached = 0;
    for (int i = 0; i < j->n; i++) gen += j->ch[i].n_gen;
    for (int p = 0; p < j->n_prompts; p++) {
        int least = j->prompt_len[p];
        for (int i = p * j->n_per; i < (p + 1) * j->n_per && i < j->n; i++)
            if (j->ch[i].n_cached < least) least = j->ch[i].n_cached;
        cached += least;
    }
    json_t *u = json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", j->prompt_tokens, "completion_tokens", gen,
                          "total_tokens", j->prompt_tokens + gen, "prompt_tokens_details", "cached_tokens", cached);
    if (j->expert_load) {
        json_t *layers = json_array(), *counts = json_array();
        for (int l = 0; l < s->Lm; l++) {
            json_array_append_new(layers, json_integer(s->moe_layer[l]));
            json_t *row = json_array();
            for (int e = 0; e < s->E; e++) {
                int64_t sum = 0;
                for (int i = 0; i < j->n; i++)
                    if (j->ch[i].load) sum += j->ch[i].load[(size_t)l * s->E + e];
                json_array_append_new(row, json_integer(sum));
            }
            json_array_append_new(counts, row);
        }
        json_object_set_new(u, "expert_load", json_pack("{s:i, s:i, s:o, s:o}", "experts", s->E,
                                                        "top_k", s->K, "layers", layers, "tokens",
                                                        counts));
    }
    return u;
}

/* Writes the end of a job's response and marks it done. */
static void job_complete(struct srv *s, struct srv_job *j)
{
    if (j->stream) {
        if (j->include_usage) {
            json_t *ev = chunk_base(s, j);
            json_object_set_new(ev, "choices", json_array());
            json_object_set_new(ev, "usage", usage_json(s, j));
            emit_event(j, ev);
        }
        emit(j, "data: [DONE]\n\n", 14, true);
        return;
    }
    json_t *choices = json_array();
    for (int i = 0; i < j->n; i++) {
        struct srv_choice *c = &j->ch[i];
        const char *fin = moe_finish_name(c->finish);
        json_t *lp = c->lp ? c->lp : json_array();
        json_t *o;
        if (j->chat) {
            o = json_pack("{s:i, s:{s:s, s:s}, s:o, s:s}", "index", i, "message", "role", "assistant",
                          "content", c->text ? c->text : "", "logprobs",
                          wants_logprobs(j) ? json_pack("{s:O}", "content", lp) : json_null(),
                          "finish_reason", fin);
            json_t *msg = json_object_get(o, "message");
            if (o && c->rs_on) /* vLLM's field; null when the model did not reason */
                json_object_set_new(msg, "reasoning_content", c->n_reason ? json_string(c->reason) : json_null());
            if (o && c->tc_on && c->tc.n_calls > 0) {
                json_object_set_new(msg, "tool_calls", tool_calls_json(c, 0, c->tc.n_calls, false));
                if (!c->n_text) json_object_set_new(msg, "content", json_null());
                if (c->finish == MOE_FINISH_STOP) json_object_set_new(o, "finish_reason", json_string("tool_calls"));
            }
        } else
        {
            o = json_pack("{s:i, s:s, s:o, s:s}", "index", i, "text", c->text ? c->text : "",
                          "logprobs", wants_logprobs(j) ? completion_logprobs(lp) : json_null(),
                          "finish_reason", fin);
        }
        if (!c->lp) json_decref(lp);
        json_array_append_new(choices, o);
    }
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", j->id, "object",
                             j->chat ? "chat.completion" : "text_completion", "created",
                             (json_int_t)j->created, "model", s->model_name, "choices", choices,
                             "usage", usage_json(s, j));
    char *t = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    emit(j, t ? t : "", t ? strlen(t) : 0, true);
    free(t);
}

static void reject(struct srv_job *j, int status, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    j->phase = SRV_REJECTED;
    j->reject_status = status;
    j->reject_msg = strdup(msg);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    srv_job_unref(j);
}

/* Submits every choice of a queued job; on failure nothing stays queued. */
static void accept_job(struct srv *s, struct srv_job *j)
{
    for (int i = 0; i < j->n; i++) {
        struct srv_choice *c = &j->ch[i];
        struct moe_request_params rp = j->rp;
        rp.sampling.seed += (uint64_t)i;
        enum moe_status st = MOE_OK;
        c->rs_on = j->chat && s->have_tok && s->reasoning != MOE_REASONING_NONE;
        if (c->rs_on) moe_reasoning_init(&c->rs, s->reasoning, j->think_open);
        c->tc_on = j->chat && j->tools && s->have_tok;
        if (c->tc_on) {
            moe_tool_calls_init(&c->tc, s->tool_fmt);
            c->tc.tools = j->tool_defs;
            if (j->tool_forced) moe_tool_calls_force(&c->tc, j->tool_forced_name);
        }
        if (c->tc_on && c->rs_on && s->reasoning == MOE_REASONING_HARMONY && s->tool_fmt == MOE_TOOLS_HARMONY)
            c->rs.calls = &c->tc; /* harmony calls come from its message headers */
        if (s->have_tok) { /* harmony's markers are special tokens: keep them for the parser */
            const bool skip = !(c->rs_on && s->reasoning == MOE_REASONING_HARMONY);
            st = moe_textgen_init(&c->tg, &s->tok_eng, (const char *const *)j->stops, j->n_stops, skip);
            c->tg_on = st == MOE_OK;
            /* and a tool format's markers, special in some tokenizers */
            if (c->tg_on && skip && c->tc_on) moe_detok_keep(&c->tg.dt, moe_tool_calls_markers(s->tool_fmt));
        }
        if (st == MOE_OK && j->expert_load && s->Lm > 0 &&
            !(c->load = calloc((size_t)s->Lm * s->E, sizeof *c->load)))
            st = moe_fail(MOE_ERR_NOMEM, "expert load counters");
        const int p = i / j->n_per; /* several prompts: choices p*n_per .. p*n_per + n_per - 1 */
        if (st == MOE_OK)
            st = moe_engine_submit(&s->e, j->prompts[p], j->prompt_len[p], &rp, c, &c->r);
        if (st != MOE_OK) {
            for (int k = 0; k <= i; k++) {
                moe_engine_release(&s->e, j->ch[k].r);
                j->ch[k].r = NULL;
            }
            reject(j, st == MOE_ERR_NOMEM ? 500 : 400, moe_last_error());
            return;
        }
    }
    pthread_mutex_lock(&j->mu);
    j->phase = SRV_ACCEPTED;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    j->next = s->active;
    s->active = j;
}

/* Adds the last step's routing to the choices that count expert load.
 * Positions already counted (recomputation after preemption) are skipped. */
static void count_routes(struct srv *s)
{
    struct moe_engine *e = &s->e;
    int T = 0;
    for (int c = 0; c < e->n_sched; c++) T += e->chunks[c].n;
    int row = 0;
    for (int c = 0; c < e->n_sched; c++) {
        struct moe_request *r = e->sched[c];
        struct srv_choice *ch = r->user;
        int n = e->chunks[c].n, pos0 = (int)(e->chunks[c].tokens - r->tokens);
        if (ch && ch->load)
            for (int i = 0; i < n; i++) {
                if (pos0 + i < ch->counted) continue;
                for (int l = 0; l < s->Lm; l++) {
                    const int32_t *ids = s->trace.ids + ((size_t)s->moe_layer[l] * T + row + i) * s->K;
                    for (int k = 0; k < s->K; k++)
                        if (ids[k] >= 0 && ids[k] < s->E) ch->load[(size_t)l * s->E + ids[k]]++;
                }
            }
        if (ch && pos0 + n > ch->counted) ch->counted = pos0 + n;
        row += n;
    }
}

static bool job_abandoned(struct srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    bool a = j->abandoned;
    pthread_mutex_unlock(&j->mu);
    return a;
}

/* Finishes or cancels the active jobs that are done or abandoned. */
static void sweep(struct srv *s, bool abort_all)
{
    struct srv_job **pp = &s->active;
    while (*pp) {
        struct srv_job *j = *pp;
        bool gone = abort_all || job_abandoned(j);
        if (gone)
            for (int i = 0; i < j->n; i++)
                if (j->ch[i].r) moe_engine_cancel(&s->e, j->ch[i].r);
        if (!gone && j->n_done < j->n) {
            pp = &j->next;
            continue;
        }
        for (int i = 0; i < j->n; i++) {
            moe_engine_release(&s->e, j->ch[i].r);
            j->ch[i].r = NULL;
        }
        if (!gone) job_complete(s, j);
        else emit(j, "", 0, true);
        *pp = j->next;
        srv_job_unref(j);
    }
}

/* Ends a job cut at the drain timeout.  A stream gets a last chunk with
 * finish_reason "abort" for each unfinished choice, its usage chunk when
 * asked, an error event and [DONE]; a non-streaming request is answered 503
 * with the error object. */
static void job_cut(struct srv *s, struct srv_job *j)
{
    char *err = srv_error_json(503, NULL, "the server shut down before the request finished "
                               "(--drain-timeout %d s)", s->o.drain_timeout_s);
    if (j->stream) {
        for (int i = 0; i < j->n; i++)
            if (!j->ch[i].done) stream_piece(s, &j->ch[i], "", "", NULL, moe_finish_name(MOE_FINISH_ABORT));
        if (j->include_usage) {
            json_t *ev = chunk_base(s, j);
            json_object_set_new(ev, "choices", json_array());
            json_object_set_new(ev, "usage", usage_json(s, j));
            emit_event(j, ev);
        }
        if (err) {
            emit(j, "data: ", 6, false);
            emit(j, err, strlen(err), false);
            emit(j, "\n\n", 2, false);
        }
        emit(j, "data: [DONE]\n\n", 14, true);
    } else {
        pthread_mutex_lock(&j->mu);
        j->status = 503;
        pthread_mutex_unlock(&j->mu);
        emit(j, err ? err : "", err ? strlen(err) : 0, true);
    }
    free(err);
}

/* The drain timeout is over: every active job ends now (those whose
 * choices are all done complete as usual). */
static void cut_all(struct srv *s)
{
    while (s->active) {
        struct srv_job *j = s->active;
        const bool finished = j->n_done == j->n;
        if (finished) job_complete(s, j);
        else if (!job_abandoned(j)) job_cut(s, j);
        else emit(j, "", 0, true);
        for (int i = 0; i < j->n; i++) {
            if (j->ch[i].r) moe_engine_cancel(&s->e, j->ch[i].r);
            moe_engine_release(&s->e, j->ch[i].r);
            j->ch[i].r = NULL;
        }
        s->active = j->next;
        srv_job_unref(j);
    }
}

static void snapshot(struct srv *s)
{
    const struct moe_kvcache *kv = &s->e.r.kv;
    struct moe_offload_stats off;
    moe_cuda_offload_stats(&s->be, &off);
    pthread_mutex_lock(&s->m_mu);
    s->met.offload = off;
    s->met.prompt_tokens = s->e.n.prompt_tokens;
    s->met.generated_tokens = s->e.n.generated_tokens;
    s->met.preemptions = s->e.n.preemptions;
    s->met.running = s->e.n_running;
    s->met.kv_total = kv->n_blocks;
    const struct moe_ep *ep = s->e.r.fw.ep;
    if (moe_ep_on(ep) && ep->rows_rank) {
        s->met.ep_ranks = ep->size;
        s->met.ep = ep->n;
        s->met.tp = ep->tp;
        s->met.tp_s = ep->tp_s;
        s->met.tp_bytes = ep->tp_bytes;
        for (int r = 0; r < ep->size && r < SRV_EP_RANKS; r++) s->met.ep_rows[r] = ep->rows_rank[r];
    }
    s->met.kv_free = kv->n_free;
    s->met.kv_cached = kv->n_evictable;
    s->met.kv_used = kv->n_blocks - kv->n_free - kv->n_evictable;
    s->met.spec_k = s->e.o.spec.kind != MOE_SPEC_NONE ? s->e.o.spec.tokens : 0;
    s->met.spec_drafts = s->e.n.spec_drafts;
    s->met.spec_draft_tokens = s->e.n.spec_draft_tokens;
    s->met.spec_accepted = s->e.n.spec_accepted;
    memcpy(s->met.spec_accepted_at, s->e.n.spec_accepted_at, sizeof s->met.spec_accepted_at);
    pthread_mutex_unlock(&s->m_mu);
    atomic_store(&s->eng_waiting, s->e.n_waiting);
}

static bool any_expert_load(const struct srv *s)
{
    for (const struct srv_job *j = s->active; j; j = j->next)
        if (j->expert_load) return true;
    return false;
}

static void *engine_main(void *arg)
{
    struct srv *s = arg;
    pthread_setname_np(pthread_self(), "moerun-engine"); /* ps -L, top -H, gdb, /proc/PID/task */
#ifdef _OPENMP
    /* OpenMP's thread count is per thread: the backend sized its per-thread
     * scratch for the count set in the thread that created it */
    if (s->be.n_threads > 0) omp_set_num_threads(s->be.n_threads);
#endif
    for (;;) {
        pthread_mutex_lock(&s->q_mu);
        while (!s->stopping && !s->q_head && moe_engine_idle(&s->e) && !s->active)
            pthread_cond_wait(&s->q_cv, &s->q_mu);
        struct srv_job *q = s->q_head;
        s->q_head = s->q_tail = NULL;
        /* the taken jobs still count as waiting until they are in the engine */
        atomic_store(&s->eng_waiting, s->e.n_waiting + s->q_len);
        s->q_len = 0;
        bool stopping = s->stopping, cut = s->cut;
        pthread_mutex_unlock(&s->q_mu);
        while (q) {
            struct srv_job *next = q->next;
            if (stopping || cut) reject(q, 503, "the server is shutting down");
            else accept_job(s, q);
            q = next;
        }
        atomic_store(&s->eng_waiting, s->e.n_waiting);
        if (cut) cut_all(s);
        if (stopping) {
            sweep(s, true);
            snapshot(s);
            break;
        }
        sweep(s, false);
        if (!moe_engine_idle(&s->e)) {
            int rows;
            pthread_mutex_lock(&s->stats_mu);
            s->e.trace = any_expert_load(s) ? &s->trace : NULL;
            enum moe_status st = moe_engine_step(&s->e, &rows);
            if (st == MOE_OK && s->e.trace) count_routes(s);
            pthread_mutex_unlock(&s->stats_mu);
            if (st != MOE_OK) {
                fprintf(stderr, "moerun serve: engine step failed: %s; aborting the running "
                        "requests\n", moe_last_error());
                sweep(s, true);
            }
        }
        sweep(s, false);
        snapshot(s);
    }
    return NULL;
}

enum moe_status srv_engine_start(struct srv *s)
{
    s->e.on_token = on_token;
    const struct moe_config *c = &s->m.cfg;
    s->E = c->n_experts;
    s->K = c->top_k;
    s->Lm = 0;
    for (int l = 0; l < c->n_layers && s->E > 0; l++)
        if (c->layer_moe[l] && s->Lm < 256) s->moe_layer[s->Lm++] = l;
    if (s->Lm > 0) {
        s->trace.ids = malloc((size_t)c->n_layers * (size_t)s->e.o.max_batch_tokens * (size_t)s->K *
                              sizeof(int32_t));
        if (!s->trace.ids) return moe_fail(MOE_ERR_NOMEM, "serve: routing trace buffer");
    }
    snapshot(s);
    if (pthread_create(&s->engine_thread, NULL, engine_main, s))
        return moe_fail(MOE_ERR_NOMEM, "serve: cannot start the engine thread");
    s->engine_started = true;
    return MOE_OK;
}

void srv_drain_begin(struct srv *s)
{
    pthread_mutex_lock(&s->q_mu);
    s->draining = true;
    pthread_mutex_unlock(&s->q_mu);
}

void srv_drain_cut(struct srv *s)
{
    pthread_mutex_lock(&s->q_mu);
    s->cut = true;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

void srv_engine_stop(struct srv *s)
{
    pthread_mutex_lock(&s->q_mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    if (s->engine_started) pthread_join(s->engine_thread, NULL);
    s->engine_started = false;
    free(s->trace.ids);
    s->trace.ids = NULL;
}
