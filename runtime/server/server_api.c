/* server_api.c - POST /v1/completions and /v1/chat/completions: the request
 * JSON to a job, validated completely before anything is queued, so every
 * refusal gets its status code and an OpenAI error object, and a queued job
 * can only fail for lack of memory or at shutdown.
 *
 * Fields follow the OpenAI API, with vLLM's extensions (top_k, min_p,
 * repetition_penalty, ignore_eos) and moerun's own: "return_expert_load":
 * true or "moerun": {"expert_load": true} adds usage.expert_load.  Unknown
 * fields are ignored, as OpenAI's server does; fields moerun cannot honour
 * (echo, best_of > n) are refused, never
 * silently dropped.  Error messages never quote the
 * request body. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/grammar/json_schema.h"
#include "runtime/core/clock.h"
#include "runtime/server/server.h"

char *srv_error_json(int status, const char *param, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *type = "invalid_request_error", *code = NULL;
    switch (status) {
    case 401: type = "authentication_error"; code = "invalid_api_key"; break;
    case 404: type = "not_found_error"; break;
    case 413: code = "request_too_large"; break;
    case 429: type = "rate_limit_error"; code = "queue_full"; break;
    case 503: type = "service_unavailable"; break;
    default:
        if (status >= 500) type = "server_error";
    }
    json_t *j = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", msg, "type", type,
                          "param", param, "code", code);
    char *out = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return out;
}

/* --- field readers: 1 present, 0 absent or null, -1 bad (err set) --- */

struct verr {
    int status;
    char *body;
};

static int bad(struct verr *v, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(struct verr *v, const char *param, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!v->body) {
        v->status = 400;
        v->body = srv_error_json(400, param, "%s", msg);
    }
    return -1;
}

static int get_num(json_t *req, const char *key, double lo, double hi, double *out, struct verr *v)
{
    json_t *x = json_object_get(req, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_number(x)) return bad(v, key, "'%s' must be a number", key);
    double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) return bad(v, key, "'%s' = %g is outside [%g, %g]", key, d, lo, hi);
    *out = d;
    return 1;
}

static int get_int(json_t *req, const char *key, long long lo, long long hi, long long *out,
                   struct verr *v)
{
    json_t *x = json_object_get(req, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_integer(x)) return bad(v, key, "'%s' must be an integer", key);
    long long d = json_integer_value(x);
    if (d < lo || d > hi) return bad(v, key, "'%s' = %lld is outside [%lld, %lld]", key, d, lo, hi);
    *out = d;
    return 1;
}

static int get_bool(json_t *req, const char *key, bool *out, struct verr *v)
{
    json_t *x = json_object_get(req, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_boolean(x)) return bad(v, key, "'%s' must be true or false", key);
    *out = json_is_true(x);
    return 1;
}

static struct srv_job *job_new(struct srv *s)
{
    struct srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->s = s;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    atomic_fetch_add(&s->jobs_live, 1);
    for (int i = 0; i < SRV_MAX_N; i++) {
        j->ch[i].job = j;
        j->ch[i].index = i;
    }
    return j;
}

/* One prompt: a string or an array of token ids, into *ids (new memory). */
static int read_one_prompt(struct srv *s, json_t *p, int32_t **ids, int *len, struct verr *v)
{
    if (json_is_string(p)) {
        if (!s->have_tok) return bad(v, "prompt", "a text prompt needs the model's tokenizer");
        size_t n = 0;
        bool bad_utf8 = false;
        pthread_mutex_lock(&s->tok_mu);
        enum moe_status st = moe_tokenizer_encode(&s->tok, json_string_value(p), json_string_length(p),
                                                  true, ids, &n, &bad_utf8);
        pthread_mutex_unlock(&s->tok_mu);
        if (st != MOE_OK) return bad(v, "prompt", "the prompt cannot be tokenized: %s", moe_last_error());
        *len = (int)n;
        return 0;
    }
    if (!json_is_array(p))
        return bad(v, "prompt", "'prompt' must be a string, an array of token ids, or an array of "
                   "either");
    size_t n = json_array_size(p), i;
    *ids = malloc((n ? n : 1) * sizeof **ids);
    if (!*ids) return bad(v, "prompt", "out of memory");
    json_t *x;
    json_array_foreach(p, i, x) {
        if (!json_is_integer(x))
            return bad(v, "prompt", "'prompt' must be a string, an array of token ids, or an array "
                       "of either");
        long long id = json_integer_value(x);
        if (id < 0 || id >= s->vocab)
            return bad(v, "prompt", "prompt token %lld at position %zu is outside the vocabulary "
                       "of %d", id, i, s->vocab);
        (*ids)[i] = (int32_t)id;
    }
    *len = (int)n;
    return 0;
}

/* The prompt(s): a string, an array of ids, or an array of up to SRV_MAX_N
 * of either (several prompts: n choices each). */
static int read_prompt(struct srv *s, json_t *p, struct srv_job *j, struct verr *v)
{
    const bool several = json_is_array(p) && json_array_size(p) > 0 &&
                         (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
    const size_t np = several ? json_array_size(p) : 1;
    if (np > SRV_MAX_N) return bad(v, "prompt", "%zu prompts in one request; at most %d", np, SRV_MAX_N);
    for (size_t i = 0; i < np; i++) {
        if (read_one_prompt(s, several ? json_array_get(p, i) : p, &j->prompts[i], &j->prompt_len[i], v) < 0)
            return -1;
        j->n_prompts = (int)i + 1;
        if (j->prompt_len[i] <= 0) return bad(v, "prompt", "prompt %zu is empty", i);
        if (j->prompt_len[i] > j->n_prompt) j->n_prompt = j->prompt_len[i];
        j->prompt_tokens += j->prompt_len[i];
    }
    j->prompt = j->prompts[0];
    return 0;
}

/* vLLM's chat_template_kwargs (an object of template variables, e.g.
 * Qwen3's enable_thinking) and OpenAI's reasoning_effort ("low", "medium",
 * "high": gpt-oss's template reads it) join the template's variables. */
static int read_template_kwargs(struct srv *s, json_t *req, json_t **extra, struct verr *v)
{
    json_t *kw = json_object_get(req, "chat_template_kwargs"), *effort = json_object_get(req, "reasoning_effort");
    if (kw && !json_is_null(kw) && !json_is_object(kw))
        return bad(v, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (effort && !json_is_null(effort)) {
        const char *e = json_string_value(effort);
        if (!e || (strcmp(e, "low") && strcmp(e, "medium") && strcmp(e, "high")))
            return bad(v, "reasoning_effort", "'reasoning_effort' must be \"low\", \"medium\" or \"high\"");
    }
    if ((!kw || !json_is_object(kw) || json_object_size(kw) == 0) && (!effort || json_is_null(effort))) return 0;
    if (!(*extra = s->special ? json_deep_copy(s->special) : json_object()))
        return bad(v, "chat_template_kwargs", "out of memory");
    if (kw && json_is_object(kw) && json_object_update(*extra, kw))
        return bad(v, "chat_template_kwargs", "out of memory");
    if (effort && !json_is_null(effort) && json_object_set(*extra, "reasoning_effort", effort))
        return bad(v, "reasoning_effort", "out of memory");
    return 0;
}

/* A forced call's grammar (vLLM's way, whatever the template's format):
 * for a named function, the JSON Schema of its parameters; for
 * "required", a list (of one when parallel_tool_calls is false) of
 * {"name": one of the tools, "parameters": its parameters}.  A tool
 * without "parameters" takes any object. */
static int forced_grammar(struct srv *s, json_t *req, json_t *tools, struct srv_job *j, struct verr *v)
{
    json_t *any = json_pack("{s:s}", "type", "object"), *schema = NULL, *alts = json_array(), *t;
    size_t i;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function"), *params = json_object_get(f, "parameters");
        if (!params || json_is_null(params)) params = any;
        if (j->tool_forced_name) {
            if (!strcmp(json_string_value(json_object_get(f, "name")), j->tool_forced_name)) schema = json_incref(params);
            continue;
        }
        json_array_append_new(alts, json_pack("{s:s, s:{s:{s:O}, s:O}, s:[s,s], s:b}", "type", "object",
                                              "properties", "name", "const", json_object_get(f, "name"),
                                              "parameters", params, "required", "name", "parameters",
                                              "additionalProperties", 0));
    }
    json_t *par = json_object_get(req, "parallel_tool_calls");
    if (!j->tool_forced_name)
        schema = json_pack("{s:s, s:i, s:{s:O}}", "type", "array", "minItems", 1, "items", "anyOf", alts);
    if (schema && !j->tool_forced_name && json_is_false(par)) json_object_set_new(schema, "maxItems", json_integer(1));
    json_decref(alts);
    json_decref(any);
    if (!schema) return bad(v, "tool_choice", "out of memory");
    const enum moe_status st = moe_json_schema_grammar(schema, &j->grammar);
    json_decref(schema);
    if (st != MOE_OK) return bad(v, "tools", "a forced call's parameters: %s", moe_last_error());
    j->rp.grammar = j->grammar;
    return 0;
}

/* Tools with "strict": true under tool_choice "auto" (SGLang's way): a
 * lazy grammar (engine.h, grammar_triggers) that starts at the format's
 * call marker, when the vocabulary has it as one token, and makes the call
 * that follows valid: hermes {"name": ..., "arguments": ...}, mistral a
 * list of those, kimi_k2 the arguments object (one of the tools'; its
 * name came before the marker).  The other tools' arguments are any
 * object.  Other formats are not constrained (docs/server.md). */
static int strict_grammar(struct srv *s, json_t *req, json_t *tools, struct srv_job *j, struct verr *v)
{
    bool strict = false;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) strict |= json_is_true(json_object_get(json_object_get(t, "function"), "strict"));
    const char *marker = s->tool_fmt == MOE_TOOLS_HERMES ? "<tool_call>" : s->tool_fmt == MOE_TOOLS_MISTRAL
                       ? "[TOOL_CALLS]" : s->tool_fmt == MOE_TOOLS_KIMI_K2 ? "<|tool_call_argument_begin|>" : NULL;
    if (!strict || !marker || !s->json_grammar) return 0;
    pthread_mutex_lock(&s->tok_mu);
    const int32_t id = moe_tokenizer_token_to_id(&s->tok, marker);
    pthread_mutex_unlock(&s->tok_mu);
    if (id < 0) return 0; /* not one token: no trigger */
    if (j->rp.grammar)
        return bad(v, "tools", "strict tools constrain their calls under their own grammar: give either them or a "
                   "response_format / grammar");
    json_t *any = json_pack("{s:s}", "type", "object"), *alts = json_array();
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function"), *params = json_object_get(f, "parameters");
        if (!params || json_is_null(params) || !json_is_true(json_object_get(f, "strict"))) params = any;
        if (s->tool_fmt == MOE_TOOLS_KIMI_K2) json_array_append(alts, params);
        else
            json_array_append_new(alts, json_pack("{s:s, s:{s:{s:O}, s:O}, s:[s,s], s:b}", "type", "object",
                                                  "properties", "name", "const", json_object_get(f, "name"),
                                                  "arguments", params, "required", "name", "arguments",
                                                  "additionalProperties", 0));
    }
    json_t *schema = json_pack("{s:O}", "anyOf", alts);
    if (schema && s->tool_fmt == MOE_TOOLS_MISTRAL) {
        json_t *list = json_pack("{s:s, s:i, s:o}", "type", "array", "minItems", 1, "items", schema);
        if (list && json_is_false(json_object_get(req, "parallel_tool_calls")))
            json_object_set_new(list, "maxItems", json_integer(1));
        schema = list;
    }
    json_decref(alts);
    json_decref(any);
    char *src = NULL;
    size_t n = 0;
    /* the call may start and end with whitespace: "<tool_call>\n{...}\n</tool_call>" */
    enum moe_status st = schema ? moe_json_schema_source(schema, MOE_JSON_SCHEMA_WS_AROUND, &src, &n)
                                : MOE_ERR_NOMEM;
    json_decref(schema);
    if (st == MOE_OK) st = moe_grammar_parse(src, n, &j->grammar);
    free(src);
    if (st != MOE_OK) return bad(v, "tools", "the strict tools' parameters: %s", moe_last_error());
    j->rp.grammar = j->grammar;
    j->rp.grammar_triggers[0] = id;
    j->rp.n_grammar_triggers = 1;
    return 0;
}

/* tools and tool_choice: the tools go to the chat template (as transformers'
 * apply_chat_template(tools=...) passes them) unless tool_choice is "none";
 * calls are parsed from the output (server_engine.c).  "required" or a
 * named function ({"type": "function", "function": {"name": ...}}) force
 * a call: a grammar writes it as JSON (forced_grammar). */
static int read_tools(struct srv *s, json_t *req, struct srv_job *j, json_t **extra, struct verr *v)
{
    json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) return bad(v, "tools", "'tools' must be an array");
    if (!tools || json_is_null(tools) || json_array_size(tools) == 0) {
        const char *c = json_string_value(choice);
        if (choice && !json_is_null(choice) && (!c || (strcmp(c, "none") && strcmp(c, "auto"))))
            return bad(v, "tool_choice", "without 'tools', 'tool_choice' may only be \"none\" or \"auto\"");
        return 0;
    }
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (!json_is_object(t) || !json_is_string(json_object_get(t, "type")) ||
            strcmp(json_string_value(json_object_get(t, "type")), "function") || !json_is_object(f) ||
            !json_is_string(json_object_get(f, "name")))
            return bad(v, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": "
                       "...}}", i);
    }
    json_t *par = json_object_get(req, "parallel_tool_calls");
    if (par && !json_is_null(par) && !json_is_boolean(par))
        return bad(v, "parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    if (choice && !json_is_null(choice)) {
        const char *c = json_string_value(choice);
        if (c && !strcmp(c, "none")) return 0;
        const char *named = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
        const char *type = json_string_value(json_object_get(choice, "type"));
        if (json_is_object(choice) && (!named || !type || strcmp(type, "function")))
            return bad(v, "tool_choice", "a named tool_choice is {\"type\": \"function\", \"function\": "
                       "{\"name\": ...}}");
        if (!named && (!c || (strcmp(c, "auto") && strcmp(c, "required"))))
            return bad(v, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or a named "
                       "function");
        j->tool_forced = named || !strcmp(c, "required");
        if (named) {
            json_array_foreach(tools, i, t) {
                const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
                if (!strcmp(n, named)) j->tool_forced_name = n;
            }
            if (!j->tool_forced_name) return bad(v, "tool_choice", "tool_choice names a function that is not "
                                                 "among the tools: '%.64s'", named);
        }
    }
    if (j->tool_forced) {
        if (j->rp.grammar)
            return bad(v, "tool_choice", "a forced tool call writes JSON under its own grammar: give either it or "
                       "a response_format / grammar");
        if (!s->json_grammar) return bad(v, "tool_choice", "a forced tool call needs the model's tokenizer");
        if (s->tool_fmt == MOE_TOOLS_HARMONY)
            return bad(v, "tool_choice", "a forced tool call is not supported with the harmony format (its "
                       "calls are message headers)");
    }
    if (s->tool_fmt == MOE_TOOLS_NONE)
        return bad(v, "tools", "this model's chat template writes no tool call format moerun reads "
                   "(hermes, mistral, deepseek_v3, glm45, kimi_k2 or gpt-oss harmony); see --tool-call-parser");
    if (!*extra && !(*extra = s->special ? json_deep_copy(s->special) : json_object()))
        return bad(v, "tools", "out of memory");
    if (json_object_set(*extra, "tools", tools)) return bad(v, "tools", "out of memory");
    j->tools = json_array_size(tools) > 0;
    if (!(j->tool_defs = json_deep_copy(tools))) return bad(v, "tools", "out of memory");
    if (j->tool_forced_name) /* the copy's, which lives as long as the job */
        json_array_foreach(j->tool_defs, i, t) {
            const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
            if (!strcmp(n, j->tool_forced_name)) j->tool_forced_name = n;
        }
    return j->tool_forced ? forced_grammar(s, req, j->tool_defs, j, v) : strict_grammar(s, req, j->tool_defs, j, v);
}

/* An assistant message's tool_calls carry arguments as a JSON string (the
 * OpenAI API); templates iterate them as a mapping: each string that holds
 * a JSON object is replaced by it, and the message's null content (the API
 * sends null beside calls) becomes "", as vLLM does before rendering.
 * (DeepSeek's templates concatenate the arguments as text instead:
 * read_messages renders the messages as sent when this fails.)
 * Returns a new reference (msgs itself when nothing changes). */
static json_t *parse_call_arguments(json_t *msgs)
{
    json_t *out = NULL, *m;
    size_t i;
    json_array_foreach(msgs, i, m) {
        json_t *calls = json_object_get(m, "tool_calls"), *c;
        size_t k;
        if (json_array_size(calls) > 0 && json_is_null(json_object_get(m, "content"))) {
            if (!out) out = json_deep_copy(msgs);
            if (out) json_object_set_new(json_array_get(out, i), "content", json_string(""));
        }
        json_array_foreach(calls, k, c) {
            json_t *a = json_object_get(json_object_get(c, "function"), "arguments");
            json_t *obj = json_is_string(a) ? json_loads(json_string_value(a), 0, NULL) : NULL;
            if (!json_is_object(obj)) {
                json_decref(obj);
                continue;
            }
            if (!out) out = json_deep_copy(msgs);
            json_t *f = out ? json_object_get(json_array_get(json_object_get(json_array_get(out, i), "tool_calls"),
                                                             k), "function") : NULL;
            if (!f || json_object_set_new(f, "arguments", obj)) json_decref(obj);
        }
    }
    return out ? out : json_incref(msgs);
}

static int read_messages(struct srv *s, json_t *msgs, struct srv_job *j, json_t *extra, struct verr *v)
{
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return bad(v, "messages", "'messages' must be a non-empty array of messages");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            return bad(v, "messages", "messages[%zu] must be an object with a string 'role'", i);
        json_t *c = json_object_get(m, "content");
        if (c && !json_is_null(c) && !json_is_string(c) && !json_is_array(c))
            return bad(v, "messages", "messages[%zu].content must be a string or an array", i);
    }
    json_t *flat = NULL; /* content part lists as text; roles checked */
    if (moe_chat_messages_text(msgs, &flat) != MOE_OK) return bad(v, "messages", "%s", moe_last_error());
    if (!s->have_chat) {
        json_decref(flat);
        return bad(v, "messages", "this model has no chat template; use /v1/completions");
    }
    msgs = flat;
    char *text = NULL;
    pthread_mutex_lock(&s->tok_mu);
    json_t *rendered = parse_call_arguments(msgs);
    enum moe_status st = moe_chat_template_render(&s->tmpl, rendered, true, extra ? extra : s->special, &text);
    if (st != MOE_OK && rendered != msgs) { /* a template that takes the arguments as text */
        char first[512];
        snprintf(first, sizeof first, "%s", moe_last_error());
        free(text);
        text = NULL;
        if (moe_chat_template_render(&s->tmpl, msgs, true, extra ? extra : s->special, &text) == MOE_OK) st = MOE_OK;
        else (void)moe_fail(st, "%s", first); /* the first failure is the one to report */
    }
    json_decref(rendered);
    json_decref(flat);
    size_t n = 0;
    if (st == MOE_OK)
        st = moe_tokenizer_encode(&s->tok, text, strlen(text), false, &j->prompt, &n, NULL);
    pthread_mutex_unlock(&s->tok_mu);
    j->think_open = text && moe_reasoning_prompt_opens_think(text);
    free(text);
    if (st != MOE_OK) return bad(v, "messages", "the chat template failed: %s", moe_last_error());
    j->n_prompt = j->prompt_len[0] = j->prompt_tokens = (int)n;
    j->prompts[0] = j->prompt;
    j->n_prompts = 1;
    return 0;
}

static int read_stop(json_t *req, struct srv_job *j, struct verr *v)
{
    json_t *stop = json_object_get(req, "stop");
    if (!stop || json_is_null(stop)) return 0;
    json_t *one = json_is_string(stop) ? stop : NULL;
    size_t n = one ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
    if (!one && !json_is_array(stop))
        return bad(v, "stop", "'stop' must be a string or an array of strings");
    if (n > MOE_MAX_STOP_STRINGS)
        return bad(v, "stop", "'stop' holds %zu strings; at most %d", n, MOE_MAX_STOP_STRINGS);
    for (size_t i = 0; i < n; i++) {
        json_t *x = one ? one : json_array_get(stop, i);
        if (!json_is_string(x) || json_string_length(x) == 0)
            return bad(v, "stop", "each stop string must be a non-empty string");
        if (!(j->stops[j->n_stops++] = strdup(json_string_value(x))))
            return bad(v, "stop", "out of memory");
    }
    return 0;
}

/* response_format json_schema: {"name", "schema", "strict"}; the schema
 * compiled to the request's own grammar (runtime/grammar/json_schema.h), a
 * schema outside the supported subset a 400 naming the keyword and where.
 * "strict": false is accepted and constrains the same way. */
static int read_json_schema(struct srv *s, json_t *rf, struct srv_job *j, struct verr *v)
{
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return bad(v, "response_format", "response_format type 'json_schema' needs a 'json_schema' object "
                   "holding 'name' and 'schema'");
    json_t *name = json_object_get(js, "name"), *schema = json_object_get(js, "schema");
    json_t *strict = json_object_get(js, "strict");
    if (!json_is_string(name)) return bad(v, "response_format", "'json_schema.name' must be a string");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
        return bad(v, "response_format", "'json_schema.strict' must be a boolean");
    if (!schema) return bad(v, "response_format", "'json_schema.schema' is missing");
    if (!s->json_grammar) return bad(v, "response_format", "json_schema needs the model's tokenizer");
    if (moe_json_schema_grammar(schema, &j->grammar) != MOE_OK)
        return bad(v, "response_format", "json_schema.schema: %s", moe_last_error());
    j->rp.grammar = j->grammar;
    return 0;
}

/* response_format: "text"; "json_object" constrains the output to a JSON
 * object (the built-in grammar); "json_schema" to the documents a JSON
 * Schema accepts.  "grammar" (moerun's extension, docs/grammar.md)
 * constrains it to a grammar of its own, compiled here (a malformed one is
 * a 400 naming line and column). */
static int read_response_format(struct srv *s, json_t *req, struct srv_job *j, struct verr *v)
{
    json_t *rf = json_object_get(req, "response_format"), *gr = json_object_get(req, "grammar");
    if (gr && !json_is_null(gr)) {
        if (!json_is_string(gr)) return bad(v, "grammar", "'grammar' must be a string");
        if (!s->json_grammar) return bad(v, "grammar", "a grammar needs the model's tokenizer");
        if (moe_grammar_parse(json_string_value(gr), json_string_length(gr), &j->grammar) != MOE_OK)
            return bad(v, "grammar", "%s", moe_last_error());
        j->rp.grammar = j->grammar;
    }
    if (!rf || json_is_null(rf)) return 0;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        return bad(v, "response_format", "'response_format' must be an object with a string 'type'");
    if (!strcmp(type, "text")) return 0;
    bool schema = !strcmp(type, "json_schema");
    if (!schema && strcmp(type, "json_object"))
        return bad(v, "response_format", "unknown response_format type '%.64s'", type);
    if (j->grammar) return bad(v, "response_format", "give either 'grammar' or a JSON response_format");
    if (schema) return read_json_schema(s, rf, j, v);
    if (!s->json_grammar) return bad(v, "response_format", "json_object needs the model's tokenizer");
    j->rp.grammar = s->json_grammar;
    return 0;
}

/* logit_bias keys are token ids written as JSON's canonical integers
 * ("0", "15"; not " 5", "+5", "05"); the values are checked by the sampler. */
static int check_logit_bias_keys(json_t *req, struct verr *v)
{
    json_t *lb = json_object_get(req, "logit_bias");
    const char *key;
    json_t *val;
    if (!json_is_object(lb)) return 0;
    json_object_foreach(lb, key, val) {
        const size_t n = strlen(key);
        if (n == 0 || n > 10 || strspn(key, "0123456789") != n || (key[0] == '0' && n > 1))
            return bad(v, "logit_bias", "a logit_bias key is not a token id written as a plain "
                       "decimal integer");
    }
    return 0;
}

static int blocks_for(const struct srv *s, long long tokens)
{
    return (int)((tokens + s->kv_block - 1) / s->kv_block);
}

static int read_request(struct srv *s, bool chat, json_t *req, struct srv_job *j, struct verr *v)
{
    json_t *model = json_object_get(req, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return bad(v, "model", "'model' must be a string");
        if (strcmp(json_string_value(model), s->model_name))
            return bad(v, "model", "unknown model: this server serves '%s'", s->model_name);
    }
    bool b = false;
    if (get_bool(req, "stream", &j->stream, v) < 0) return -1;
    json_t *so = json_object_get(req, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return bad(v, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &j->include_usage, v) < 0) return -1;
    }
    if (get_bool(req, "return_expert_load", &b, v) < 0) return -1;
    j->expert_load = b;
    json_t *mo = json_object_get(req, "moerun");
    if (mo && !json_is_null(mo)) {
        if (!json_is_object(mo)) return bad(v, "moerun", "'moerun' must be an object");
        b = false;
        if (get_bool(mo, "expert_load", &b, v) < 0) return -1;
        j->expert_load |= b;
    }
    b = false;
    if (get_bool(req, "echo", &b, v) < 0) return -1;
    if (b) return bad(v, "echo", "'echo' is not supported");
    struct moe_sampling *sp = &j->rp.sampling;
    *sp = s->defaults; /* the API's defaults, with the model's generation_config.json */
    if (check_logit_bias_keys(req, v) < 0 || read_response_format(s, req, j, v) < 0) return -1;
    if (moe_sampling_logit_bias_from_json(json_object_get(req, "logit_bias"), s->vocab, sp) != MOE_OK)
        return bad(v, "logit_bias", "%s", moe_last_error());
    double d = 0;
    long long k = 0;
    int r;
    if ((r = get_num(req, "temperature", 0, 2, &d, v)) < 0) return -1;
    if (r) sp->temperature = (float)d;
    if ((r = get_num(req, "top_p", 1e-9, 1, &d, v)) < 0) return -1;
    if (r) sp->top_p = (float)d;
    if ((r = get_int(req, "top_k", -1, 1 << 24, &k, v)) < 0) return -1;
    if (r) sp->top_k = k < 0 ? 0 : (int)k;
    if ((r = get_num(req, "min_p", 0, 1, &d, v)) < 0) return -1;
    if (r) sp->min_p = (float)d;
    if ((r = get_num(req, "repetition_penalty", 1e-6, 100, &d, v)) < 0) return -1;
    if (r) sp->repetition_penalty = (float)d;
    if ((r = get_num(req, "frequency_penalty", -2, 2, &d, v)) < 0) return -1;
    if (r) sp->frequency_penalty = (float)d;
    if ((r = get_num(req, "presence_penalty", -2, 2, &d, v)) < 0) return -1;
    if (r) sp->presence_penalty = (float)d;
    if ((r = get_int(req, "seed", -(1ll << 53), 1ll << 53, &k, v)) < 0) return -1;
    sp->seed = r ? (uint64_t)k : (uint64_t)atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull;
    j->n_per = 1;
    if ((r = get_int(req, "n", 1, SRV_MAX_N, &k, v)) < 0) return -1;
    if (r) j->n_per = (int)k;
    if ((r = get_int(req, "best_of", 1, SRV_MAX_N, &k, v)) < 0) return -1;
    if (r && k != j->n_per) return bad(v, "best_of", "'best_of' other than n is not supported");
    if (chat) {
        if (get_bool(req, "logprobs", &j->chat_logprobs, v) < 0) return -1;
        if ((r = get_int(req, "top_logprobs", 0, MOE_MAX_LOGPROBS, &k, v)) < 0) return -1;
        if (r && !j->chat_logprobs) return bad(v, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        j->logprobs = r ? (int)k : 0;
        sp->n_logprobs = j->chat_logprobs ? j->logprobs : 0;
        sp->logprob = j->chat_logprobs;
    } else {
        j->logprobs = -1;
        if ((r = get_int(req, "logprobs", 0, MOE_MAX_LOGPROBS, &k, v)) < 0) return -1;
        if (r) j->logprobs = sp->n_logprobs = (int)k;
        sp->logprob = r != 0; /* "logprobs": 0 still asks for the chosen token's */
    }
    bool ignore_eos = false, speculative = true;
    if (get_bool(req, "ignore_eos", &ignore_eos, v) < 0) return -1;
    if (get_bool(req, "speculative", &speculative, v) < 0) return -1;
    j->rp.no_spec = !speculative; /* the server's --spec decides otherwise */
    if ((r = get_int(req, "priority", MOE_PRIORITY_MIN, MOE_PRIORITY_MAX, &k, v)) < 0) return -1;
    j->rp.priority = r ? (int)k : 0; /* vLLM's extension: lower is admitted first (engine.h) */
    if (read_stop(req, j, v) < 0) return -1;
    if (j->n_stops && !s->have_tok) return bad(v, "stop", "stop strings need the model's tokenizer");

    if (chat) {
        json_t *extra = NULL; /* the template's variables when the request adds any */
        int rc = read_template_kwargs(s, req, &extra, v);
        if (rc == 0) rc = read_tools(s, req, j, &extra, v);
        if (rc == 0) rc = read_messages(s, json_object_get(req, "messages"), j, extra, v);
        json_decref(extra);
        if (rc < 0) return -1;
        if (j->tool_forced && j->think_open && s->reasoning != MOE_REASONING_NONE)
            return bad(v, "tool_choice", "the chat template opens a think block in the prompt, which a forced "
                       "tool call's JSON cannot close: use tool_choice \"auto\"");
    } else {
        json_t *p = json_object_get(req, "prompt");
        if (!p) return bad(v, "prompt", "'prompt' is required");
        if (read_prompt(s, p, j, v) < 0) return -1;
    }
    if (j->n_prompts * j->n_per > SRV_MAX_N)
        return bad(v, "n", "%d prompts x n %d = %d choices; at most %d", j->n_prompts, j->n_per,
                   j->n_prompts * j->n_per, SRV_MAX_N);
    j->n = j->n_prompts * j->n_per;
    if (j->n_prompt <= 0) return bad(v, chat ? "messages" : "prompt", "the prompt is empty");
    /* max_tokens: completions default 16 (OpenAI); chat: what the context allows */
    long long mt = 16;
    bool mt_set = !chat;
    const char *mt_key = "max_tokens";
    if ((r = get_int(req, "max_tokens", -(1ll << 40), 1ll << 40, &k, v)) < 0) return -1;
    if (r) {
        mt = k;
        mt_set = true;
    }
    if (chat) {
        long long k2 = 0;
        if ((r = get_int(req, "max_completion_tokens", -(1ll << 40), 1ll << 40, &k2, v)) < 0) return -1;
        if (r) {
            mt = k2;
            mt_set = true;
            mt_key = "max_completion_tokens";
        }
    }
    if (!mt_set) {
        mt = (long long)s->max_pos - j->n_prompt;
        long long kv = (long long)s->kv_blocks * s->kv_block - j->n_prompt + 1;
        if (kv < mt) mt = kv;
        if (mt < 1)
            return bad(v, "messages", "the prompt of %d tokens leaves no room to generate: the "
                       "context is %d tokens and the KV cache holds %d", j->n_prompt, s->max_pos,
                       s->kv_blocks * s->kv_block);
    }
    if (mt < 1) return bad(v, mt_key, "'%s' = %lld must be at least 1", mt_key, mt);
    if ((long long)j->n_prompt + mt > s->max_pos)
        return bad(v, mt_key, "this model's maximum context length is %d tokens, but %d prompt "
                   "tokens + %s %lld = %lld tokens were requested", s->max_pos, j->n_prompt,
                   mt_key, mt, (long long)j->n_prompt + mt);
    if (blocks_for(s, j->n_prompt + mt - 1) > s->kv_blocks)
        return bad(v, mt_key, "%d prompt tokens + %lld new tokens need %d KV blocks of %d tokens, "
                   "but the cache holds %d blocks", j->n_prompt, mt,
                   blocks_for(s, j->n_prompt + mt - 1), s->kv_block, s->kv_blocks);
    j->rp.max_tokens = (int)mt;
    if (moe_sampling_validate(sp) != MOE_OK) return bad(v, NULL, "%s", moe_last_error());
    if (!ignore_eos) {
        if (s->have_tok)
            for (size_t i = 0; i < s->tok.n_eos && j->rp.n_stop_ids < MOE_MAX_STOP_IDS; i++)
                j->rp.stop_ids[j->rp.n_stop_ids++] = s->tok.eos_ids[i];
        else if (s->m.cfg.eos_id >= 0)
            j->rp.stop_ids[j->rp.n_stop_ids++] = s->m.cfg.eos_id;
    }
    j->chat = chat;
    return 0;
}

int srv_handle_completion(struct srv *s, bool chat, const char *body, size_t n,
                          struct srv_job **out, char **err_body)
{
    *out = NULL;
    *err_body = NULL;
    json_error_t jerr;
    json_t *req = json_loadb(body, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!req) {
        *err_body = srv_error_json(400, NULL, "the body is not valid JSON (line %d, column %d)",
                                   jerr.line, jerr.column);
        return 400;
    }
    if (!json_is_object(req)) {
        json_decref(req);
        *err_body = srv_error_json(400, NULL, "the body must be a JSON object");
        return 400;
    }
    struct verr v = {0};
    struct srv_job *j = job_new(s);
    if (!j) {
        json_decref(req);
        *err_body = srv_error_json(500, NULL, "out of memory");
        return 500;
    }
    int rc = read_request(s, chat, req, j, &v);
    json_decref(req);
    if (rc < 0) {
        srv_job_unref(j);
        *err_body = v.body;
        return v.status;
    }
    j->created = (long long)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%lld", chat ? "chatcmpl" : "cmpl",
             (long long)atomic_fetch_add(&s->next_id, 1));
    j->t_recv = moe_seconds();
    const int refused = srv_enqueue(s, j);
    if (refused) {
        srv_job_unref(j);
        *err_body = refused == 503 ? srv_error_json(503, NULL, "the server is shutting down")
                                   : srv_error_json(429, NULL, "the server's queue is full (%d waiting "
                                                    "requests); retry later", s->o.max_queue);
        return refused;
    }
    /* the engine thread accepts or refuses at its next loop */
    pthread_mutex_lock(&j->mu);
    while (j->phase == SRV_QUEUED) pthread_cond_wait(&j->cv, &j->mu);
    int status = j->phase == SRV_ACCEPTED ? 200 : j->reject_status;
    if (status != 200) *err_body = srv_error_json(status, NULL, "%s", j->reject_msg);
    pthread_mutex_unlock(&j->mu);
    if (status != 200) {
        srv_job_unref(j);
        return status;
    }
    *out = j;
    return 200;
}
