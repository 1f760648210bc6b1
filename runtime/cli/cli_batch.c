/* cli_batch.c - `moerun batch MODEL requests.jsonl -o out.jsonl`: offline
 * throughput mode.  Every line is one request with the fields of the OpenAI
 * completions API ("prompt"), or of the chat completions API ("messages",
 * rendered with the model's chat template; a reasoning model's thinking
 * split into reasoning_content as `moerun serve` does); all are served
 * together with continuous batching.
 *
 * A malformed line never stops the run: its output line carries an error
 * object naming the line and the problem.  Results are written in input
 * order as soon as every earlier line is done, so an interrupted run keeps
 * what it finished. */
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/chat/chat.h"
#include "runtime/core/clock.h"
#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/cli/stats_cli.h"
#include "runtime/core/strbuf.h"
#include "runtime/chat/reasoning.h"
#include "runtime/text/textgen.h"

struct batch_opts {
    struct moe_cli_engine eng;
    struct moe_cli_stats st;
    const char *out_path;
};

static const struct moe_cli_opt rows[] = {
    {.name = "output", .letter = 'o', .arg = "FILE", .kind = MOE_CLI_STRING, .at = MOE_CLI_AT_CMD,
     MOE_CLI_FIELD(struct batch_opts, out_path),
     .help = "results, one JSON line per request, in input order"},
};

static const char *const shared[] = {"@model", "@engine", "@spec", "@offload", "@stats", NULL};

static const struct moe_cli_command batch_cmd = {
    .name = "batch",
    .usage = "usage: moerun batch MODEL_DIR requests.jsonl -o out.jsonl [options]\n\n"
             "One request per line: {\"prompt\": \"text\" | [ids], \"max_tokens\": 16,\n"
             "\"temperature\": 1, \"top_p\": 1, \"top_k\": 0, \"min_p\": 0, \"stop\": \"..\" | [..],\n"
             "\"seed\": 0, \"frequency_penalty\": 0, \"presence_penalty\": 0,\n"
             "\"repetition_penalty\": 1, \"logprobs\": 0, \"logit_bias\": {\"id\": bias},\n"
             "\"ignore_eos\": false, \"custom_id\": ..}, or \"messages\": [..] in place of \"prompt\"\n"
             "(chat: the model's chat template, optional \"chat_template_kwargs\"; max_tokens\n"
             "defaults to what the context leaves; reasoning_content as in moerun serve)\n"
             "Defaults are the OpenAI API's.  A progress line goes to stderr.\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
    .shared = shared,
    .footer = "The default KV budget here is 0.25 of available memory, at most 4GiB.\n",
    .engine_at = offsetof(struct batch_opts, eng),
    .stats_at = offsetof(struct batch_opts, st),
};

struct item {
    int line;                 /* 1-based line of the input file */
    int index;                /* 0-based position among the requests */
    json_t *req;              /* parsed line, or NULL */
    char *error;              /* why the line was refused, or NULL */
    struct moe_request *r;
    struct moe_textgen tg;
    bool text, tg_on;
    bool chat;                /* a "messages" line: a chat.completion result */
    struct moe_reasoning rs;  /* chat: thinking apart from the answer (fmt NONE: all answer) */
    char *out;                /* generated text (chat: the answer) so far */
    size_t n_out, cap_out;
    char *reason;             /* chat: the reasoning so far */
    size_t n_reason, cap_reason;
    json_t *custom_id;
};

struct batch {
    struct moe_engine e;
    struct moe_tokenizer tok;
    bool have_tok, have_chat;
    struct moe_chat_template tmpl;
    json_t *special;                   /* the template's special-token variables */
    enum moe_reasoning_format rfmt;    /* read from the template */
    struct item *items;
    int n_items, next_write, done;
    FILE *out;
    enum moe_status err;
};

static char *fmt_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *fmt_error(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return strdup(buf);
}

/* Text of a line: the answer into out, a chat's thinking into reason. */
static void keep_text(struct item *it, const char *t, bool last)
{
    const char *reason = "", *answer = t;
    if (it->rs.fmt != MOE_REASONING_NONE &&
        (last ? moe_reasoning_finish(&it->rs, &reason, &answer) : moe_reasoning_push(&it->rs, t, &reason, &answer)) !=
            MOE_OK)
        return;
    (void)moe_buf_append(&it->reason, &it->n_reason, &it->cap_reason, reason, strlen(reason));
    (void)moe_buf_append(&it->out, &it->n_out, &it->cap_out, answer, strlen(answer));
}

static void on_token(void *user, struct moe_request *r, int32_t token, bool finished)
{
    struct item *it = user;
    if (token < 0 || !it->tg_on) return;
    const char *t = "";
    /* a chat's end-of-sequence token is not part of its message */
    const bool eos = it->chat && finished && r->stop_token;
    if (!eos && moe_textgen_push(&it->tg, token, &t) != MOE_OK) return;
    keep_text(it, t, false);
    if (finished && moe_textgen_finish(&it->tg, &t) == MOE_OK) {
        keep_text(it, t, false);
        keep_text(it, "", true);
    }
}

/* A "messages" line rendered by the chat template into ids (new memory);
 * NULL and *err on failure. */
static int32_t *chat_prompt(struct batch *b, struct item *it, json_t *req, size_t *n_ids, char **err)
{
    json_t *msgs = json_object_get(req, "messages"), *kw = json_object_get(req, "chat_template_kwargs");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        *err = fmt_error("field 'messages' must be a non-empty array of messages");
        return NULL;
    }
    if (!b->have_chat) {
        *err = fmt_error("'messages' needs the model's tokenizer and chat template");
        return NULL;
    }
    if (kw && !json_is_null(kw) && !json_is_object(kw)) {
        *err = fmt_error("field 'chat_template_kwargs' must be an object");
        return NULL;
    }
    json_t *extra = b->special ? json_deep_copy(b->special) : json_object();
    if (extra && json_is_object(kw)) json_object_update(extra, kw);
    char *text = NULL;
    int32_t *ids = NULL;
    if (moe_chat_template_render(&b->tmpl, msgs, true, extra, &text) != MOE_OK ||
        moe_tokenizer_encode(&b->tok, text, strlen(text), false, &ids, n_ids, NULL) != MOE_OK) {
        *err = fmt_error("messages: %s", moe_last_error());
        free(ids);
        ids = NULL;
    } else {
        it->chat = true;
        moe_reasoning_init(&it->rs, b->rfmt, moe_reasoning_prompt_opens_think(text));
    }
    json_decref(extra);
    free(text);
    return ids;
}

/* --- request parsing --- */


static int num_field(json_t *req, const char *key, double lo, double hi, double *v, char **err)
{
    json_t *x = json_object_get(req, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_number(x)) {
        *err = fmt_error("field '%s' must be a number", key);
        return -1;
    }
    double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) {
        *err = fmt_error("field '%s' = %g is outside [%g, %g]", key, d, lo, hi);
        return -1;
    }
    *v = d;
    return 1;
}

/* The prompt of a line as ids (new memory): its "messages" rendered, its
 * text encoded or its ids checked; a chat line's max_tokens is what the
 * context leaves.  NULL and *err on a bad line. */
static int32_t *line_prompt(struct batch *b, struct item *it, json_t *req, size_t *n_ids, int *max_tokens,
                            char **err)
{
    int32_t *ids = NULL;
    json_t *p = json_object_get(req, "prompt");
    if (json_object_get(req, "messages") && p) {
        *err = fmt_error("a line has 'prompt' or 'messages', not both");
        goto fail;
    }
    if (json_object_get(req, "messages")) {
        if (!(ids = chat_prompt(b, it, req, n_ids, err))) return NULL;
        it->text = true;
        /* max_tokens: what the context leaves, as a chat completion */
        *max_tokens = b->e.m->cfg.max_pos - (int)*n_ids;
        if (*max_tokens < 1) {
            *err = fmt_error("the messages take %zu tokens: no room in the model's context of %d", *n_ids,
                            b->e.m->cfg.max_pos);
            goto fail;
        }
    } else if (json_is_string(p)) {
        if (!b->have_tok) {
            *err = fmt_error("a text prompt needs the model's tokenizer, which did not load");
            goto fail;
        }
        bool bad = false;
        if (moe_tokenizer_encode(&b->tok, json_string_value(p), json_string_length(p), true, &ids,
                                 n_ids, &bad) != MOE_OK) {
            *err = fmt_error("prompt: %s", moe_last_error());
            goto fail;
        }
        it->text = true;
    } else if (json_is_array(p)) {
        *n_ids = json_array_size(p);
        ids = malloc((*n_ids ? *n_ids : 1) * sizeof *ids);
        size_t i;
        json_t *v;
        json_array_foreach(p, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
                *err = fmt_error("prompt[%zu] is not a token id", i);
                goto fail;
            }
            ids[i] = (int32_t)json_integer_value(v);
        }
        it->text = b->have_tok;
    } else {
        *err = fmt_error("field 'prompt' must be a string or an array of token ids (or give 'messages')");
        goto fail;
    }
    return ids;
fail:
    free(ids);
    return NULL;
}

/* The sampling fields of a line, checked, into rp; false and *err on a bad value. */
static bool line_sampling(struct batch *b, const struct item *it, json_t *req, struct moe_request_params *rp,
                          char **err)
{
    double v;
    int k;
    if ((k = num_field(req, "max_tokens", 1, 1 << 24, &v, err)) < 0) return false;
    if (k) rp->max_tokens = (int)v;
    if ((k = num_field(req, "temperature", 0, 2, &v, err)) < 0) return false;
    if (k) rp->sampling.temperature = (float)v;
    if ((k = num_field(req, "top_p", 1e-9, 1, &v, err)) < 0) return false;
    if (k) rp->sampling.top_p = (float)v;
    if ((k = num_field(req, "top_k", -1, 1 << 24, &v, err)) < 0) return false;
    if (k) rp->sampling.top_k = v < 0 ? 0 : (int)v;
    if ((k = num_field(req, "min_p", 0, 1, &v, err)) < 0) return false;
    if (k) rp->sampling.min_p = (float)v;
    if ((k = num_field(req, "frequency_penalty", -2, 2, &v, err)) < 0) return false;
    if (k) rp->sampling.frequency_penalty = (float)v;
    if ((k = num_field(req, "presence_penalty", -2, 2, &v, err)) < 0) return false;
    if (k) rp->sampling.presence_penalty = (float)v;
    if ((k = num_field(req, "repetition_penalty", 1e-6, 100, &v, err)) < 0) return false;
    if (k) rp->sampling.repetition_penalty = (float)v;
    if ((k = num_field(req, "logprobs", 0, MOE_MAX_LOGPROBS, &v, err)) < 0) return false;
    if (k) rp->sampling.n_logprobs = (int)v;
    if ((k = num_field(req, "seed", 0, 9007199254740992.0, &v, err)) < 0) return false;
    rp->sampling.seed = k ? (uint64_t)v : (uint64_t)it->line * 0x9e3779b97f4a7c15ull;
    if ((k = num_field(req, "n", 1, 1, &v, err)) < 0) return false;
    if (moe_sampling_logit_bias_from_json(json_object_get(req, "logit_bias"), b->e.r.m->cfg.vocab, &rp->sampling) != MOE_OK) {
        *err = fmt_error("%s", moe_last_error());
        return false;
    }
    return true;
}

/* Builds the engine request of one line; on a bad line sets it->error. */
static void submit_line(struct batch *b, struct item *it, const struct moe_cli_engine *eo)
{
    json_t *req = it->req;
    char *err = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const char *stops[MOE_MAX_STOP_STRINGS];
    int n_stops = 0;
    struct moe_request_params rp = {.max_tokens = 16};
    moe_sampling_defaults(&rp.sampling);
    rp.sampling.temperature = 1.0f; /* the OpenAI API's default */
    if (!json_is_object(req)) {
        err = fmt_error("the line is not a JSON object");
        goto out;
    }
    it->custom_id = json_incref(json_object_get(req, "custom_id"));
    if (!(ids = line_prompt(b, it, req, &n_ids, &rp.max_tokens, &err)) || !line_sampling(b, it, req, &rp, &err))
        goto out;
    json_t *stop = json_object_get(req, "stop");
    if (json_is_string(stop)) {
        stops[n_stops++] = json_string_value(stop);
    } else if (json_is_array(stop)) {
        size_t i;
        json_t *s;
        json_array_foreach(stop, i, s) {
            if (!json_is_string(s) || n_stops == MOE_MAX_STOP_STRINGS) {
                err = fmt_error("field 'stop' must be a string or at most %d strings", MOE_MAX_STOP_STRINGS);
                goto out;
            }
            stops[n_stops++] = json_string_value(s);
        }
    } else if (stop && !json_is_null(stop)) {
        err = fmt_error("field 'stop' must be a string or an array of strings");
        goto out;
    }
    if (n_stops && !it->text) {
        err = fmt_error("stop strings need the model's tokenizer");
        goto out;
    }
    if (!json_is_true(json_object_get(req, "ignore_eos"))) {
        if (b->have_tok)
            for (size_t i = 0; i < b->tok.n_eos && rp.n_stop_ids < MOE_MAX_STOP_IDS; i++)
                rp.stop_ids[rp.n_stop_ids++] = b->tok.eos_ids[i];
        else if (b->e.m->cfg.eos_id >= 0)
            rp.stop_ids[rp.n_stop_ids++] = b->e.m->cfg.eos_id;
    }
    if (it->text) { /* harmony's markers are special tokens: kept for its parser */
        const bool skip = !(it->chat && b->rfmt == MOE_REASONING_HARMONY);
        if (moe_textgen_init(&it->tg, &b->tok, stops, n_stops, skip) != MOE_OK) {
            err = fmt_error("%s", moe_last_error());
            goto out;
        }
        it->tg_on = true;
    }
    if (moe_engine_submit(&b->e, ids, (int)n_ids, &rp, it, &it->r) != MOE_OK)
        err = fmt_error("%s", moe_last_error());
    (void)eo;
out:
    free(ids);
    if (err) {
        it->error = err;
        b->done++;
    }
}

/* --- output --- */

static json_t *result_json(struct batch *b, struct item *it)
{
    if (it->error)
        return json_pack("{s:i, s:o?, s:{s:s, s:s}}", "index", it->index, "custom_id",
                         json_incref(it->custom_id), "error", "message", it->error, "type",
                         "invalid_request_error");
    struct moe_request *r = it->r;
    int n;
    const int32_t *ids = moe_request_output(r, &n);
    json_t *tok = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(tok, json_integer(ids[i]));
    json_t *choice = json_pack("{s:i, s:O, s:s}", "index", 0, "token_ids", tok, "finish_reason",
                               moe_finish_name(r->finish));
    json_decref(tok);
    if (it->chat) {
        json_t *msg = json_pack("{s:s, s:s}", "role", "assistant", "content", it->out ? it->out : "");
        if (it->rs.fmt != MOE_REASONING_NONE)
            json_object_set_new(msg, "reasoning_content", it->n_reason ? json_string(it->reason) : json_null());
        json_object_set_new(choice, "message", msg);
    } else if (it->text) {
        json_object_set_new(choice, "text", json_string(it->out ? it->out : ""));
    }
    if (r->params.sampling.n_logprobs > 0) {
        json_t *lp = json_array();
        for (int i = 0; i < n; i++) {
            const struct moe_sample *s = &r->samples[i];
            json_t *top = json_array();
            for (int k = 0; k < s->n_top; k++)
                json_array_append_new(top, json_pack("{s:i, s:f}", "id", s->top_ids[k], "logprob",
                                                     (double)s->top_logprobs[k]));
            json_array_append_new(lp, json_pack("{s:i, s:f, s:o}", "id", s->token, "logprob",
                                                (double)s->logprob, "top", top));
        }
        json_object_set_new(choice, "logprobs", lp);
    }
    double ttft = r->t_first > 0 ? r->t_first - r->t_arrival : 0;
    return json_pack("{s:i, s:o?, s:s, s:[o], s:{s:i, s:i, s:i}, s:{s:f, s:f, s:i, s:i}}",
                     "index", it->index, "custom_id", json_incref(it->custom_id), "object",
                     it->chat ? "chat.completion" : "text_completion", "choices", choice, "usage", "prompt_tokens", r->n_prompt,
                     "completion_tokens", n, "total_tokens", r->n_prompt + n, "metrics", "ttft_s",
                     ttft, "latency_s", r->t_finish - r->t_arrival, "preemptions", r->n_preempted,
                     "prefix_hit_tokens", r->n_prefix_hit);
}

static void write_ready(struct batch *b)
{
    while (b->next_write < b->n_items) {
        struct item *it = &b->items[b->next_write];
        if (!it->error && (!it->r || it->r->state != MOE_REQ_FINISHED)) break;
        json_t *j = result_json(b, it);
        if (j) {
            char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
            if (s) fprintf(b->out, "%s\n", s);
            free(s);
            json_decref(j);
        }
        if (it->r) moe_engine_release(&b->e, it->r);
        it->r = NULL;
        moe_textgen_free(&it->tg);
        moe_reasoning_free(&it->rs);
        it->tg_on = false;
        b->next_write++;
    }
    fflush(b->out);
}

static void progress(struct batch *b, double t0, double *shown, bool last)
{
    double now = moe_seconds();
    bool tty = isatty(2);
    if (!last && now - *shown < (tty ? 0.25 : 5.0)) return;
    *shown = now;
    const struct moe_kvcache *kv = &b->e.r.kv;
    int used = kv->n_blocks - moe_kvcache_available(kv);
    double el = now - t0;
    fprintf(stderr, "%s[batch] %d/%d requests  %.1f tokens/s  KV %d/%d blocks (%.0f%%)  %.1f s%s",
            tty ? "\r" : "", b->done, b->n_items,
            el > 0 ? (double)b->e.n.generated_tokens / el : 0.0, used, kv->n_blocks,
            100.0 * used / kv->n_blocks, el, tty && !last ? "" : "\n");
}

/* Every line of in_path as an item: a line that is not JSON is an error
 * record, not a stop. */
static int batch_read(struct batch *b, const char *in_path)
{
    FILE *in = fopen(in_path, "r");
    if (!in) return moe_cli_error("batch", "cannot open %s", in_path);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int cap = 0, lineno = 0, rc = 0;
    while (!rc && (len = getline(&line, &lcap, in)) >= 0) {
        bool blank = true;
        for (ssize_t i = 0; i < len; i++)
            if (line[i] != ' ' && line[i] != '\t' && line[i] != '\n' && line[i] != '\r') blank = false;
        lineno++;
        if (blank) continue;
        if (b->n_items == cap) {
            cap = cap ? cap * 2 : 64;
            struct item *ni = realloc(b->items, (size_t)cap * sizeof *ni);
            if (!ni) {
                rc = moe_cli_error("batch", "out of memory reading %s", in_path);
                break;
            }
            b->items = ni;
        }
        struct item *it = &b->items[b->n_items++];
        memset(it, 0, sizeof *it);
        it->line = lineno;
        it->index = b->n_items - 1;
        json_error_t jerr;
        it->req = json_loadb(line, (size_t)len, JSON_REJECT_DUPLICATES, &jerr);
        if (!it->req) it->error = fmt_error("line %d: invalid JSON at column %d: %s", lineno, jerr.column, jerr.text);
    }
    free(line);
    fclose(in);
    if (!rc && b->n_items == 0) rc = moe_cli_error("batch", "%s holds no request", in_path);
    return rc;
}

/* The model, its tokenizer and chat template (chat lines need them,
 * completions lines do not), the engine and the output file. */
static int batch_load(struct batch_opts *o, struct batch *b, struct moe_model *m, struct moe_backend *be,
                      struct moe_cli_stats *so)
{
    if (moe_cli_open_model(m, &o->eng.model) != MOE_OK) return moe_cli_error("batch", "%s", moe_last_error());
    if (o->eng.model.path) b->have_tok = moe_tokenizer_load(&b->tok, o->eng.model.path) == MOE_OK;
    if (b->have_tok) {
        b->have_chat = moe_chat_template_load(&b->tmpl, o->eng.model.path, b->tok.chat_template) == MOE_OK;
        b->special = moe_chat_special_tokens(&b->tok);
        b->rfmt = b->have_chat ? moe_reasoning_detect(b->tmpl.source) : MOE_REASONING_NONE;
    }
    if (!o->eng.kv_budget) o->eng.kv_budget = "0.25";
    size_t budget;
    if (moe_cli_parse_budget(o->eng.kv_budget, &budget) == MOE_OK && budget > ((size_t)4 << 30) &&
        !strchr(o->eng.kv_budget, 'i') && !strchr(o->eng.kv_budget, 'B'))
        o->eng.kv_budget = "4GiB";
    if (moe_cli_backend_start(be, &o->eng) != MOE_OK || moe_cli_engine_start(&o->eng, m, be, 0, &b->e) != MOE_OK)
        return moe_cli_error("batch", "%s", moe_last_error());
    b->e.on_token = on_token;
    if (moe_cli_stats_start(so, m, "batch")) return 1;
    b->e.r.fw.stats = moe_cli_stats_recorder(so);
    if (!(b->out = fopen(o->out_path, "w"))) return moe_cli_error("batch", "cannot write %s", o->out_path);
    return 0;
}

/* What the run did: the summary line on stderr. */
struct batch_result {
    int requests, refused;
    double seconds;
    struct moe_engine_counters n;
};

static void print_result(const struct batch_result *r)
{
    const double el = r->seconds;
    fprintf(stderr,
            "[batch] %d requests (%d refused) in %.2f s: %llu prompt tokens (%llu from the prefix "
            "cache), %llu generated, %.1f generated tokens/s, %.2f requests/s, %llu preemptions\n",
            r->requests, r->refused, el, (unsigned long long)r->n.prompt_tokens,
            (unsigned long long)r->n.prefix_hit_tokens, (unsigned long long)r->n.generated_tokens,
            el > 0 ? (double)r->n.generated_tokens / el : 0.0, el > 0 ? r->requests / el : 0.0,
            (unsigned long long)r->n.preemptions);
    char spec[256];
    if (moe_cli_spec_summary(&r->n, spec, sizeof spec)) fprintf(stderr, "[batch] speculation: %s\n", spec);
}

/* Submits every line and steps the engine until all are written. */
static int batch_run(struct batch *b, const struct moe_cli_engine *eo, struct batch_result *r)
{
    double t0 = moe_seconds(), shown = 0;
    for (int i = 0; i < b->n_items; i++) {
        struct item *it = &b->items[i];
        if (it->error) {
            b->done++;
            continue;
        }
        submit_line(b, it, eo);
        if (it->error) {
            char *e2 = fmt_error("line %d: %s", it->line, it->error);
            free(it->error);
            it->error = e2;
        }
    }
    write_ready(b);
    int rows;
    while (!moe_engine_idle(&b->e)) {
        uint64_t before = b->e.n.requests_finished;
        if (moe_engine_step(&b->e, &rows) != MOE_OK) return moe_cli_error("batch", "%s", moe_last_error());
        /* stop strings finish requests from the text side */
        for (int i = b->next_write; i < b->n_items; i++) {
            struct item *it = &b->items[i];
            if (it->r && it->tg_on && it->tg.stopped && it->r->state != MOE_REQ_FINISHED)
                moe_engine_stop(&b->e, it->r);
        }
        b->done += (int)(b->e.n.requests_finished - before);
        write_ready(b);
        progress(b, t0, &shown, false);
    }
    b->done = b->n_items;
    write_ready(b);
    progress(b, t0, &shown, true);
    *r = (struct batch_result){.requests = b->n_items, .seconds = moe_seconds() - t0, .n = b->e.n};
    for (int i = 0; i < b->n_items; i++) r->refused += b->items[i].error != NULL;
    return 0;
}

static void batch_free(struct batch *b)
{
    for (int i = 0; i < b->n_items; i++) {
        struct item *it = &b->items[i];
        json_decref(it->req);
        json_decref(it->custom_id);
        free(it->error);
        free(it->out);
        free(it->reason);
        moe_textgen_free(&it->tg);
        moe_reasoning_free(&it->rs);
    }
    free(b->items);
    if (b->out) fclose(b->out);
    moe_engine_free(&b->e);
    moe_tokenizer_free(&b->tok);
    moe_chat_template_free(&b->tmpl);
    json_decref(b->special);
}

int moe_cli_batch(int argc, char **argv)
{
    struct batch_opts o = {0};
    moe_cli_engine_defaults(&o.eng);
    struct moe_cli_args a;
    int rc = moe_cli_parse(&batch_cmd, argc, argv, &o, &a);
    if (rc >= 0) return rc;
    const char *in_path = NULL;
    int k = 0;
    if (!o.eng.model.synthetic && k < a.n_pos) o.eng.model.path = a.pos[k++];
    if (k < a.n_pos) in_path = a.pos[k++];
    if (k < a.n_pos) return moe_cli_error("batch", "unexpected argument '%s'", a.pos[k]);
    if (!in_path || !o.out_path) {
        moe_cli_help(&batch_cmd, stderr);
        return 2;
    }
    if (moe_cli_stats_check(&o.st, "batch") || moe_cli_check_writable("batch", "-o", o.out_path)) return 1;
    struct moe_model m = {0};
    struct moe_backend be = {0};
    struct batch b = {0};
    struct batch_result r = {0};
    rc = batch_read(&b, in_path);
    if (!rc) rc = batch_load(&o, &b, &m, &be, &o.st);
    if (!rc) rc = batch_run(&b, &o.eng, &r);
    if (!rc) {
        print_result(&r);
        rc = moe_cli_stats_finish(&o.st, &m, &o.eng.model, &be, "batch");
    }
    moe_cli_stats_free(&o.st);
    batch_free(&b);
    moe_backend_free(&be);
    moe_model_free(&m);
    return rc;
}
