/* toolcall.c - see toolcall.h. */
#include "runtime/toolcall.h"
#include "runtime/strbuf.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";

static enum moe_status put(char **p, size_t *n, size_t *cap, const char *s, size_t k)
{
    return moe_buf_append(p, n, cap, s, k) ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "tool call parser buffer");
}

void moe_tool_calls_init(struct moe_tool_calls *tc, enum moe_tool_format fmt)
{
    memset(tc, 0, sizeof *tc);
    tc->fmt = fmt;
}

void moe_tool_calls_free(struct moe_tool_calls *tc)
{
    for (int i = 0; i < tc->n_calls; i++) {
        free(tc->calls[i].name);
        free(tc->calls[i].arguments);
    }
    free(tc->calls);
    free(tc->pending);
    free(tc->block);
    free(tc->content);
    memset(tc, 0, sizeof *tc);
}

bool moe_tool_calls_add(struct moe_tool_calls *tc, const char *name, const char *arguments)
{
    json_error_t e;
    json_t *a = json_loads(arguments, JSON_DECODE_ANY, &e);
    bool ok = a && json_is_object(a) && name && *name;
    char *args = ok ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    if (!args) return false;
    if (tc->n_calls == tc->cap_calls) {
        int cap = tc->cap_calls ? 2 * tc->cap_calls : 4;
        struct moe_tool_call *c = realloc(tc->calls, (size_t)cap * sizeof *c);
        if (!c) {
            free(args);
            return false;
        }
        tc->calls = c;
        tc->cap_calls = cap;
    }
    char *n = strdup(name);
    if (!n) {
        free(args);
        return false;
    }
    tc->calls[tc->n_calls++] = (struct moe_tool_call){n, args};
    return true;
}

/* A closed hermes block's text: a call, or false (it stays content). */
static bool hermes_call(struct moe_tool_calls *tc, const char *text)
{
    json_t *j = json_loads(text, 0, NULL);
    const char *name = json_string_value(json_object_get(j, "name"));
    json_t *args = json_object_get(j, "arguments");
    if (!args) args = json_object_get(j, "parameters"); /* some models write this */
    bool ok = false;
    if (name && json_is_object(args)) {
        char *t = json_dumps(args, JSON_COMPACT);
        ok = t && moe_tool_calls_add(tc, name, t);
        free(t);
    } else if (name && json_is_string(args)) {
        ok = moe_tool_calls_add(tc, name, json_string_value(args));
    }
    json_decref(j);
    return ok;
}

/* Longest suffix of s[0..n) that is a proper prefix of m. */
static size_t held(const char *s, size_t n, const char *m)
{
    const size_t ml = strlen(m);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

static enum moe_status run(struct moe_tool_calls *tc, bool last, const char **content)
{
    char *out = NULL;
    size_t n_out = 0, cap_out = 0, at = 0;
    enum moe_status st = MOE_OK;
    while (st == MOE_OK && tc->pending) {
        const char *s = tc->pending + at;
        const char *m = tc->in_call ? CLOSE : OPEN;
        const char *hit = strstr(s, m);
        if (!hit) {
            const size_t n = strlen(s), keep = last ? 0 : held(s, n, m);
            if (tc->in_call) st = put(&tc->block, &tc->n_block, &tc->cap_block, s, n - keep);
            else st = put(&out, &n_out, &cap_out, s, n - keep);
            at += n - keep;
            break;
        }
        const size_t k = (size_t)(hit - s);
        if (!tc->in_call) {
            st = put(&out, &n_out, &cap_out, s, k);
            tc->in_call = true;
            tc->n_block = 0;
            if (tc->block) tc->block[0] = '\0';
        } else {
            st = put(&tc->block, &tc->n_block, &tc->cap_block, s, k);
            if (st == MOE_OK && !hermes_call(tc, tc->block ? tc->block : "")) { /* not a call: as written */
                st = put(&out, &n_out, &cap_out, OPEN, strlen(OPEN));
                if (st == MOE_OK) st = put(&out, &n_out, &cap_out, tc->block ? tc->block : "", tc->n_block);
                if (st == MOE_OK) st = put(&out, &n_out, &cap_out, CLOSE, strlen(CLOSE));
            }
            tc->in_call = false;
        }
        at += k + strlen(m);
    }
    if (st == MOE_OK && last && tc->in_call) { /* never closed: the text is content */
        st = put(&out, &n_out, &cap_out, OPEN, strlen(OPEN));
        if (st == MOE_OK) st = put(&out, &n_out, &cap_out, tc->block ? tc->block : "", tc->n_block);
        tc->in_call = false;
    }
    if (tc->pending) {
        memmove(tc->pending, tc->pending + at, tc->n_pending - at + 1);
        tc->n_pending -= at;
    }
    free(tc->content);
    tc->content = out;
    *content = out ? out : "";
    return st;
}

enum moe_status moe_tool_calls_push(struct moe_tool_calls *tc, const char *text, const char **content)
{
    if (tc->fmt != MOE_TOOLS_HERMES) { /* nothing to find in the text itself */
        free(tc->content);
        tc->content = strdup(text);
        *content = tc->content ? tc->content : "";
        return tc->content ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "tool call parser buffer");
    }
    MOE_TRY(put(&tc->pending, &tc->n_pending, &tc->cap, text, strlen(text)));
    return run(tc, false, content);
}

enum moe_status moe_tool_calls_finish(struct moe_tool_calls *tc, const char **content)
{
    if (tc->fmt != MOE_TOOLS_HERMES) {
        *content = "";
        return MOE_OK;
    }
    return run(tc, true, content);
}

enum moe_tool_format moe_tool_calls_detect(const char *t)
{
    if (!t) return MOE_TOOLS_NONE;
    if (strstr(t, "<|channel|>")) return MOE_TOOLS_HARMONY;
    if (strstr(t, OPEN)) return MOE_TOOLS_HERMES;
    return MOE_TOOLS_NONE;
}
