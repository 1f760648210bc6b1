/* toolcall.c - the tool-call scanner (see toolcall.h): one streaming state
 * machine for every format that writes its calls in the text; the markers
 * and the parsing of a call's text are the format's (toolcall_formats.c).
 *
 * States: OUT (content), SECTION (inside a section, between its calls),
 * CALL (inside a call, or inside a block that is one call), JSON (mistral:
 * the value after its marker, until that value is complete).  Text waits in
 * `pending` until it is classified; what could still begin a marker stays
 * there, so a marker split between pieces is still found.  A call's text
 * is parsed once its closing marker arrives; a section's stray text waits
 * for the section's end, when it is known whether the section gave calls. */
#include "runtime/chat/toolcall.h"
#include "runtime/core/strbuf.h"
#include "runtime/chat/toolcall_impl.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { S_OUT, S_SECTION, S_CALL, S_JSON };

struct buf {
    char **p;
    size_t *n, *cap;
};

static enum moe_status put(struct buf b, const char *s, size_t k)
{
    return moe_buf_append(b.p, b.n, b.cap, s, k) ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "tool call parser buffer");
}

static enum moe_status put_str(struct buf b, const char *s) { return put(b, s, strlen(s)); }

void moe_tool_calls_init(struct moe_tool_calls *tc, enum moe_tool_format fmt)
{
    memset(tc, 0, sizeof *tc);
    tc->fmt = fmt;
}

void moe_tc_truncate(struct moe_tool_calls *tc, int n)
{
    while (tc->n_calls > n) {
        struct moe_tool_call *c = &tc->calls[--tc->n_calls];
        free(c->name);
        free(c->arguments);
        free(c->id);
    }
}

void moe_tool_calls_free(struct moe_tool_calls *tc)
{
    moe_tc_truncate(tc, 0);
    free(tc->calls);
    free(tc->pending);
    free(tc->block);
    free(tc->section);
    free(tc->content);
    memset(tc, 0, sizeof *tc);
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i])) return false;
    return true;
}

bool moe_tc_add(struct moe_tool_calls *tc, const char *name, size_t n_name, const char *args, size_t n_args,
                bool empty_ok, const char *id)
{
    if (!name || n_name == 0) return false;
    json_t *a = empty_ok && blank(args, n_args) ? json_object() : json_loadb(args, n_args, JSON_DECODE_ANY, NULL);
    if (json_is_string(a)) { /* the object written as a JSON string */
        json_t *in = json_loadb(json_string_value(a), json_string_length(a), 0, NULL);
        json_decref(a);
        a = in;
    }
    char *text = json_is_object(a) ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    if (!text) return false;
    if (tc->n_calls == tc->cap_calls) {
        int cap = tc->cap_calls ? 2 * tc->cap_calls : 4;
        struct moe_tool_call *c = realloc(tc->calls, (size_t)cap * sizeof *c);
        if (!c) {
            free(text);
            return false;
        }
        tc->calls = c;
        tc->cap_calls = cap;
    }
    char *nm = strndup(name, n_name), *i = id ? strdup(id) : NULL;
    if (!nm || (id && !i)) {
        free(nm);
        free(i);
        free(text);
        return false;
    }
    tc->calls[tc->n_calls++] = (struct moe_tool_call){nm, text, i};
    return true;
}

bool moe_tool_calls_add(struct moe_tool_calls *tc, const char *name, const char *arguments)
{
    return name && arguments && moe_tc_add(tc, name, strlen(name), arguments, strlen(arguments), false, NULL);
}

void moe_tool_calls_id(const struct moe_tool_calls *tc, int k, const char *seed, char *buf, size_t n)
{
    if (k >= 0 && k < tc->n_calls && tc->calls[k].id) {
        snprintf(buf, n, "%s", tc->calls[k].id);
        return;
    }
    if (tc->fmt != MOE_TOOLS_MISTRAL) {
        snprintf(buf, n, "call_%s", seed);
        return;
    }
    /* FNV-1a of the seed, written in base 62 */
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = seed; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    char id[10];
    for (int i = 0; i < 9; i++, h /= 62) id[i] = digits[h % 62];
    id[9] = '\0';
    snprintf(buf, n, "%s", id);
}

/* Longest suffix of s[0..n) that is a proper prefix of m. */
static size_t held(const char *s, size_t n, const char *m)
{
    const size_t ml = strlen(m);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

/* Whether s[0..n) ends inside a UTF-8 character. */
static bool cut_utf8(const char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const unsigned char c = (unsigned char)s[n - k];
        if ((c & 0xC0) == 0x80) continue;
        const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return len > k;
    }
    return false;
}

/* mistral: whether s[0..n) begins with a whole JSON array or object (1,
 * its length with the whitespace before it in *used), may still become one
 * (0: the text so far is a prefix of one, as far as Jansson can tell), or
 * cannot (-1). */
static int json_value(const char *s, size_t n, size_t *used)
{
    json_error_t e;
    json_t *j = json_loadb(s, n, JSON_DISABLE_EOF_CHECK, &e);
    if (j) {
        json_decref(j);
        *used = (size_t)e.position;
        return 1;
    }
    if (json_error_code(&e) == json_error_premature_end_of_input || e.position < 0 || (size_t)e.position >= n ||
        cut_utf8(s, n))
        return 0;
    return -1;
}

/* The markers that end the text of tc's state (at most 3). */
static int markers(const struct moe_tool_calls *tc, const struct moe_tc_syntax *sx, const char *m[3])
{
    if (tc->state == S_OUT) {
        m[0] = sx->open;
        return 1;
    }
    if (tc->state == S_SECTION) {
        m[0] = sx->call_open;
        m[1] = sx->close;
        return 2;
    }
    if (!sx->call_open) { /* S_CALL in a block that is one call */
        m[0] = sx->close;
        return 1;
    }
    m[0] = sx->call_close; /* S_CALL in a section: it ends, or the section does, or a new call begins */
    m[1] = sx->close;
    m[2] = sx->call_open;
    return 3;
}

/* The end of a section (closed: with its marker): with no call, all of it
 * is content as written; else what in it was no call, unless blank. */
static enum moe_status end_section(struct moe_tool_calls *tc, const struct moe_tc_syntax *sx, bool closed,
                                   struct buf out)
{
    const char *s = tc->section ? tc->section : "";
    enum moe_status st = MOE_OK;
    if (tc->section_calls == 0) {
        st = put_str(out, sx->open);
        if (st == MOE_OK) st = put(out, s, tc->n_section);
        if (st == MOE_OK && closed) st = put_str(out, sx->close);
    } else if (!blank(s, tc->n_section)) {
        st = put(out, s, tc->n_section);
    }
    tc->n_section = 0;
    tc->section_calls = 0;
    tc->state = S_OUT;
    return st;
}

/* A call that did not parse, or never ended: its text as written, kept
 * with the section's other stray text. */
static enum moe_status keep_call(struct moe_tool_calls *tc, const struct moe_tc_syntax *sx, bool closed)
{
    struct buf sect = {&tc->section, &tc->n_section, &tc->cap_section};
    enum moe_status st = put_str(sect, sx->call_open);
    if (st == MOE_OK) st = put(sect, tc->block ? tc->block : "", tc->n_block);
    if (st == MOE_OK && closed) st = put_str(sect, sx->call_close);
    tc->n_block = 0;
    return st;
}

/* Marker m (one of sx's) was found in tc's state. */
static enum moe_status step(struct moe_tool_calls *tc, const struct moe_tc_syntax *sx, const char *m, struct buf out)
{
    const char *b = tc->block ? tc->block : "";
    enum moe_status st = MOE_OK;
    switch (tc->state) {
    case S_OUT: /* m is open */
        tc->n_block = 0;
        tc->state = !sx->close ? S_JSON : sx->call_open ? S_SECTION : S_CALL;
        tc->n_section = 0;
        tc->section_calls = 0;
        return MOE_OK;
    case S_SECTION:
        if (m == sx->call_open) {
            tc->n_block = 0;
            tc->state = S_CALL;
            return MOE_OK;
        }
        return end_section(tc, sx, true, out);
    default: /* S_CALL */
        if (!sx->call_open) { /* the block is the call: m is close */
            if (!sx->call(tc, b, tc->n_block)) {
                st = put_str(out, sx->open);
                if (st == MOE_OK) st = put(out, b, tc->n_block);
                if (st == MOE_OK) st = put_str(out, sx->close);
            }
            tc->state = S_OUT;
            return st;
        }
        if (m == sx->call_close) {
            if (sx->call(tc, b, tc->n_block)) tc->section_calls++;
            else st = keep_call(tc, sx, true);
            tc->state = S_SECTION;
            return st;
        }
        st = keep_call(tc, sx, false); /* never ended: the section ends, or another call begins */
        if (st != MOE_OK || m == sx->call_open) return st;
        return end_section(tc, sx, true, out);
    }
}

/* End of output: whatever is open is content as written. */
static enum moe_status close_open(struct moe_tool_calls *tc, const struct moe_tc_syntax *sx, struct buf out)
{
    enum moe_status st = MOE_OK;
    switch (tc->state) {
    case S_JSON: st = put_str(out, sx->open); break;
    case S_SECTION: st = end_section(tc, sx, false, out); break;
    case S_CALL:
        if (sx->call_open) {
            st = keep_call(tc, sx, false);
            if (st == MOE_OK) st = end_section(tc, sx, false, out);
        } else {
            st = put_str(out, sx->open);
            if (st == MOE_OK) st = put(out, tc->block ? tc->block : "", tc->n_block);
        }
        break;
    default: break;
    }
    tc->state = S_OUT;
    return st;
}

static enum moe_status run(struct moe_tool_calls *tc, const struct moe_tc_syntax *sx, bool last,
                           const char **content)
{
    char *o = NULL;
    size_t n_o = 0, cap_o = 0, at = 0;
    const struct buf out = {&o, &n_o, &cap_o};
    const struct buf block = {&tc->block, &tc->n_block, &tc->cap_block};
    const struct buf sect = {&tc->section, &tc->n_section, &tc->cap_section};
    enum moe_status st = MOE_OK;
    while (st == MOE_OK && at < tc->n_pending) {
        const char *s = tc->pending + at;
        const size_t n = tc->n_pending - at;
        if (tc->state == S_JSON) {
            size_t used = 0;
            const int r = json_value(s, n, &used);
            if (r == 0 && !last) break;
            if (r == 1) {
                if (!sx->call(tc, s, used)) { /* JSON, but not calls: as written */
                    st = put_str(out, sx->open);
                    if (st == MOE_OK) st = put(out, s, used);
                }
                at += used;
            } else { /* no JSON value (or one cut off): the marker is content, the rest is scanned again */
                st = put_str(out, sx->open);
            }
            tc->state = S_OUT;
            continue;
        }
        const char *m[3], *hit = NULL;
        const int nm = markers(tc, sx, m);
        int which = -1;
        for (int i = 0; i < nm; i++) {
            const char *h = strstr(s, m[i]);
            if (h && (!hit || h < hit)) hit = h, which = i;
        }
        const struct buf sink = tc->state == S_OUT ? out : tc->state == S_SECTION ? sect : block;
        if (!hit) {
            size_t keep = 0;
            for (int i = 0; i < nm && !last; i++) {
                const size_t k = held(s, n, m[i]);
                if (k > keep) keep = k;
            }
            st = put(sink, s, n - keep);
            at += n - keep;
            break;
        }
        const size_t k = (size_t)(hit - s);
        st = put(sink, s, k);
        at += k + strlen(m[which]);
        if (st == MOE_OK) st = step(tc, sx, m[which], out);
    }
    if (st == MOE_OK && last) st = close_open(tc, sx, out);
    if (tc->pending) {
        memmove(tc->pending, tc->pending + at, tc->n_pending - at + 1);
        tc->n_pending -= at;
    }
    free(tc->content);
    tc->content = o;
    *content = o ? o : "";
    return st;
}

void moe_tool_calls_force(struct moe_tool_calls *tc, const char *name)
{
    tc->forced = true;
    tc->forced_name = name;
}

/* A forced answer's calls (moe_tool_calls_force); false, none added, when
 * the text is not of that form. */
static bool forced_calls(struct moe_tool_calls *tc, const char *text, size_t n)
{
    if (tc->forced_name) return moe_tc_add(tc, tc->forced_name, strlen(tc->forced_name), text, n, false, NULL);
    json_t *list = json_loadb(text, n, 0, NULL), *item;
    size_t i;
    bool ok = json_array_size(list) > 0;
    json_array_foreach(list, i, item) {
        const char *name = json_string_value(json_object_get(item, "name"));
        json_t *params = json_object_get(item, "parameters");
        char *args = json_is_object(params) ? json_dumps(params, JSON_COMPACT) : NULL;
        ok = ok && name && args && moe_tool_calls_add(tc, name, args);
        free(args);
    }
    json_decref(list);
    if (!ok) moe_tc_truncate(tc, 0);
    return ok;
}

enum moe_status moe_tool_calls_push(struct moe_tool_calls *tc, const char *text, const char **content)
{
    if (tc->forced) { /* held whole until the finish */
        *content = "";
        return put((struct buf){&tc->pending, &tc->n_pending, &tc->cap}, text, strlen(text));
    }
    const struct moe_tc_syntax *sx = moe_tc_syntax(tc->fmt);
    if (!sx) { /* nothing to find in the text itself */
        free(tc->content);
        tc->content = strdup(text);
        *content = tc->content ? tc->content : "";
        return tc->content ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "tool call parser buffer");
    }
    MOE_TRY(put((struct buf){&tc->pending, &tc->n_pending, &tc->cap}, text, strlen(text)));
    return run(tc, sx, false, content);
}

enum moe_status moe_tool_calls_finish(struct moe_tool_calls *tc, const char **content)
{
    if (tc->forced) {
        *content = "";
        if (tc->n_pending == 0 || forced_calls(tc, tc->pending, tc->n_pending)) return MOE_OK;
        free(tc->content);
        if (!(tc->content = strndup(tc->pending, tc->n_pending)))
            return moe_fail(MOE_ERR_NOMEM, "tool call parser buffer");
        *content = tc->content;
        return MOE_OK;
    }
    const struct moe_tc_syntax *sx = moe_tc_syntax(tc->fmt);
    if (!sx) {
        *content = "";
        return MOE_OK;
    }
    return run(tc, sx, true, content);
}
