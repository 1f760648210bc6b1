/* reasoning.c - see reasoning.h. */
#include "runtime/chat/reasoning.h"
#include "runtime/core/strbuf.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

enum { T_ANSWER, T_REASON };                       /* think states */
enum { H_HEADER, H_BODY, H_BETWEEN, H_DONE };      /* harmony states */

static const char *const think_markers[] = {"<think>", "</think>"};
static const char *const harmony_markers[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                                              "<|return|>", "<|call|>", "<|constrain|>"};

struct buf {
    char **p;
    size_t *n, *cap;
};

static enum moe_status put(struct buf b, const char *s, size_t n)
{
    return moe_buf_append(b.p, b.n, b.cap, s, n) ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "reasoning parser buffer");
}

/* The two parts of one call, built here. */
struct parts {
    char *reason, *answer;
    size_t n_reason, n_answer, cap_reason, cap_answer;
};

static enum moe_status route(struct moe_reasoning *r, struct parts *o, const char *s, size_t n)
{
    if (n == 0) return MOE_OK;
    struct buf reason = {&o->reason, &o->n_reason, &o->cap_reason};
    struct buf answer = {&o->answer, &o->n_answer, &o->cap_answer};
    if (r->fmt == MOE_REASONING_THINK) return put(r->state == T_REASON ? reason : answer, s, n);
    if (r->state == H_HEADER)
        return put((struct buf){&r->header, &r->n_header, &r->cap_header}, s, n);
    if (r->state == H_BODY && r->recipient) return put((struct buf){&r->args, &r->n_args, &r->cap_args}, s, n);
    return put(r->state == H_BODY && r->analysis ? reason : answer, s, n);
}

/* harmony: a header's recipient `to=functions.NAME`, as NAME (new), or NULL */
static char *function_recipient(const char *h)
{
    const char *to = strstr(h, "to=functions.");
    if (!to) return NULL;
    to += strlen("to=functions.");
    size_t n = 0;
    while (to[n] && !isspace((unsigned char)to[n]) && to[n] != '\x01' && to[n] != '<') n++;
    return n ? strndup(to, n) : NULL;
}

/* harmony: the end of a message: a tool call's arguments go to the calls
 * (or, not an object, to the answer as written) */
static enum moe_status end_message(struct moe_reasoning *r, struct parts *o)
{
    enum moe_status st = MOE_OK;
    if (r->recipient) {
        const char *a = r->args ? r->args : "";
        if (!moe_tool_calls_add(r->calls, r->recipient, a))
            st = put((struct buf){&o->answer, &o->n_answer, &o->cap_answer}, a, r->n_args);
        free(r->recipient);
        r->recipient = NULL;
        r->n_args = 0;
        if (r->args) r->args[0] = '\0';
    }
    return st;
}

/* harmony: the channel named in the header ends at <|message|> */
static void start_body(struct moe_reasoning *r)
{
    const char *h = r->header ? r->header : "";
    free(r->recipient);
    r->recipient = r->calls ? function_recipient(h) : NULL;
    r->n_args = 0;
    const char *c = strstr(h, "\x01"); /* the last <|channel|> left this mark */
    const char *last = NULL;
    while (c) {
        last = c;
        c = strstr(c + 1, "\x01");
    }
    r->analysis = false;
    if (last) {
        last++;
        while (isspace((unsigned char)*last)) last++;
        r->analysis = !strncmp(last, "analysis", 8) &&
                      (last[8] == '\0' || isspace((unsigned char)last[8]) || last[8] == '\x01');
    }
    r->state = H_BODY;
    r->seen_message = true;
    r->n_header = 0;
    if (r->header) r->header[0] = '\0';
}

static enum moe_status marker(struct moe_reasoning *r, struct parts *o, int m)
{
    if (r->fmt == MOE_REASONING_THINK) {
        r->state = m == 0 ? T_REASON : T_ANSWER;
        return MOE_OK;
    }
    switch (m) {
    case 0: /* <|start|>: a new message's header */
        r->state = H_HEADER;
        r->n_header = 0;
        if (r->header) r->header[0] = '\0';
        return MOE_OK;
    case 1: /* <|channel|>: remembered in the header as a mark byte */
        if (r->state != H_HEADER) {
            r->state = H_HEADER;
            r->n_header = 0;
        }
        return put((struct buf){&r->header, &r->n_header, &r->cap_header}, "\x01", 1);
    case 2: start_body(r); return MOE_OK; /* <|message|> */
    case 3: r->state = H_BETWEEN; return end_message(r, o); /* <|end|> */
    case 4:
    case 5: r->state = H_DONE; return end_message(r, o); /* <|return|>, <|call|> */
    default: /* <|constrain|>: ends the channel's name */
        return r->state == H_HEADER ? put((struct buf){&r->header, &r->n_header, &r->cap_header}, " ", 1)
                                    : MOE_OK;
    }
}

void moe_reasoning_init(struct moe_reasoning *r, enum moe_reasoning_format fmt, bool in_think)
{
    memset(r, 0, sizeof *r);
    r->fmt = fmt;
    r->state = fmt == MOE_REASONING_THINK ? (in_think ? T_REASON : T_ANSWER) : H_HEADER;
}

void moe_reasoning_free(struct moe_reasoning *r)
{
    free(r->pending);
    free(r->header);
    free(r->reason);
    free(r->answer);
    free(r->recipient);
    free(r->args);
    memset(r, 0, sizeof *r);
}

static void markers_of(const struct moe_reasoning *r, const char *const **m, int *n)
{
    if (r->fmt == MOE_REASONING_THINK) {
        *m = think_markers;
        *n = 2;
    } else {
        *m = harmony_markers;
        *n = (int)(sizeof harmony_markers / sizeof harmony_markers[0]);
    }
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of a marker. */
static size_t held(const struct moe_reasoning *r, const char *s, size_t n)
{
    const char *const *m;
    int nm;
    markers_of(r, &m, &nm);
    size_t best = 0;
    for (int i = 0; i < nm; i++) {
        const size_t ml = strlen(m[i]);
        for (size_t k = ml - 1 < n ? ml - 1 : n; k > best; k--)
            if (!memcmp(s + n - k, m[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

static enum moe_status run(struct moe_reasoning *r, bool last, const char **reason, const char **answer)
{
    struct parts o = {0};
    enum moe_status st = MOE_OK;
    const char *const *m;
    int nm;
    markers_of(r, &m, &nm);
    size_t at = 0;
    while (st == MOE_OK) {
        const char *s = r->pending ? r->pending + at : "";
        const char *hit = NULL;
        int which = -1;
        for (int i = 0; i < nm; i++) {
            const char *h = strstr(s, m[i]);
            if (h && (!hit || h < hit)) hit = h, which = i;
        }
        if (!hit) {
            const size_t n = strlen(s), keep = last ? 0 : held(r, s, n);
            st = route(r, &o, s, n - keep);
            at += n - keep;
            break;
        }
        st = route(r, &o, s, (size_t)(hit - s));
        if (st == MOE_OK) st = marker(r, &o, which);
        at += (size_t)(hit - s) + strlen(m[which]);
    }
    if (st == MOE_OK && last && r->state == H_BODY) st = end_message(r, &o); /* cut off: as ended */
    if (st == MOE_OK && last && r->fmt == MOE_REASONING_HARMONY && r->state == H_HEADER && r->n_header &&
        !r->seen_message) {
        /* a header never closed by <|message|>: the text itself is the answer */
        for (size_t i = 0; i < r->n_header; i++)
            if (r->header[i] == '\x01') r->header[i] = ' ';
        st = put((struct buf){&o.answer, &o.n_answer, &o.cap_answer}, r->header, r->n_header);
        r->n_header = 0;
    }
    if (r->pending) {
        memmove(r->pending, r->pending + at, r->n_pending - at + 1);
        r->n_pending -= at;
    }
    free(r->reason);
    free(r->answer);
    r->reason = o.reason;
    r->answer = o.answer;
    *reason = r->reason ? r->reason : "";
    *answer = r->answer ? r->answer : "";
    return st;
}

enum moe_status moe_reasoning_push(struct moe_reasoning *r, const char *text, const char **reason,
                                   const char **answer)
{
    MOE_TRY(put((struct buf){&r->pending, &r->n_pending, &r->cap}, text, strlen(text)));
    return run(r, false, reason, answer);
}

enum moe_status moe_reasoning_finish(struct moe_reasoning *r, const char **reason, const char **answer)
{
    return run(r, true, reason, answer);
}

bool moe_reasoning_parse_name(const char *name, enum moe_reasoning_format *out)
{
    static const struct { const char *n; enum moe_reasoning_format f; } names[] = {
        {"none", MOE_REASONING_NONE}, {"think", MOE_REASONING_THINK}, {"harmony", MOE_REASONING_HARMONY}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i].n)) {
            *out = names[i].f;
            return true;
        }
    return false;
}

enum moe_reasoning_format moe_reasoning_detect(const char *t)
{
    if (!t) return MOE_REASONING_NONE;
    if (strstr(t, "<|channel|>")) return MOE_REASONING_HARMONY;
    if (strstr(t, "<think>") || strstr(t, "</think>")) return MOE_REASONING_THINK;
    return MOE_REASONING_NONE;
}

bool moe_reasoning_prompt_opens_think(const char *prompt)
{
    size_t n = strlen(prompt);
    while (n > 0 && isspace((unsigned char)prompt[n - 1])) n--;
    return n >= 7 && !memcmp(prompt + n - 7, "<think>", 7);
}
