/* jinja_lex.c - chat template source -> tokens.
 *
 * Mirrors jinja2.lexer.Lexer.tokeniter with the settings transformers uses:
 * trim_blocks=True (the first newline after a block or comment tag is
 * dropped), lstrip_blocks=True (spaces and tabs from the start of a line up
 * to a block or comment tag are dropped), keep_trailing_newline=False (one
 * trailing newline of the source is dropped).  `-` at a tag edge strips all
 * whitespace on that side; `+` turns lstrip/trim off for that edge.
 * {% raw %}...{% endraw %} becomes text.  Inside tags, braces, brackets and
 * parentheses are balanced so `}}` inside a dict literal does not close a
 * `{{`.  String literals are decoded as Python's unicode_escape does. */
#include <stdlib.h>
#include <string.h>

#include "runtime/chat/jinja/jinja.h"

struct lexer {
    const char *src;
    size_t n, pos;
    int line, col; /* of pos */
    struct jtoks *out;
};

static enum moe_status lex_err(const struct lexer *lx, int line, int col, const char *msg)
{
    return moe_fail(MOE_ERR_FORMAT, "chat template line %d column %d: %s", line, col, msg);
}

static void advance(struct lexer *lx, size_t to)
{
    for (; lx->pos < to; lx->pos++) {
        if (lx->src[lx->pos] == '\n') {
            lx->line++;
            lx->col = 1;
        } else if (((unsigned char)lx->src[lx->pos] & 0xc0) != 0x80) {
            lx->col++;
        }
    }
}

static enum moe_status push(struct lexer *lx, struct jtok t)
{
    struct jtoks *o = lx->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        struct jtok *v = realloc(o->v, cap * sizeof *v);
        if (!v) {
            free(t.str);
            return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory");
        }
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = t;
    return MOE_OK;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decodes the body of a string literal (between the quotes). */
static enum moe_status decode_string(struct lexer *lx, const char *s, size_t n, int line, int col,
                                     struct jtok *t)
{
    char *o = malloc(n + 1);
    if (!o) return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            o[k++] = s[i];
            continue;
        }
        char c = s[++i];
        switch (c) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\n': break; /* line continuation */
        case 'x': case 'u': case 'U': {
            size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t cp = 0;
            if (i + digits >= n) {
                free(o);
                return lex_err(lx, line, col, "truncated \\x/\\u escape in string literal");
            }
            for (size_t d = 1; d <= digits; d++) {
                int h = hexval(s[i + d]);
                if (h < 0) {
                    free(o);
                    return lex_err(lx, line, col, "bad \\x/\\u escape in string literal");
                }
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
                free(o);
                return lex_err(lx, line, col, "escape outside Unicode scalar values in string literal");
            }
            i += digits;
            k += put_utf8(o + k, cp); /* at most 4 bytes from at least 4 source bytes */
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                uint32_t cp = 0;
                size_t d = 0;
                while (d < 3 && i < n && s[i] >= '0' && s[i] <= '7') cp = cp * 8 + (uint32_t)(s[i++] - '0'), d++;
                i--;
                k += put_utf8(o + k, cp);
            } else {
                o[k++] = '\\';
                o[k++] = c;
            }
        }
    }
    o[k] = '\0';
    t->str = o;
    t->len = k;
    return MOE_OK;
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                  "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".",
                                  ":", "|"};

/* Lexes the inside of a {{ }} or {% %} tag; on return pos is just past the
 * closing delimiter and *strip_after tells whether it had a '-' (1), '+' (2)
 * or nothing (0). */
static enum moe_status lex_tag(struct lexer *lx, bool block, int *strip_after)
{
    const char close = block ? '%' : '}';
    int depth = 0;
    int tline = lx->line, tcol = lx->col;
    for (;;) {
        while (lx->pos < lx->n && is_ws(lx->src[lx->pos])) advance(lx, lx->pos + 1);
        if (lx->pos >= lx->n)
            return lex_err(lx, tline, tcol, block ? "unclosed block tag: missing '%}'"
                                                  : "unclosed expression: missing '}}'");
        const char *p = lx->src + lx->pos;
        size_t left = lx->n - lx->pos;
        if (depth == 0) {
            size_t skip = 0;
            int mode = 0;
            if (left >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == close && p[2] == '}') {
                skip = 3;
                mode = p[0] == '-' ? 1 : 2;
            } else if (left >= 2 && p[0] == close && p[1] == '}') {
                skip = 2;
            }
            if (skip) {
                struct jtok t = {.kind = block ? JT_BLOCK_END : JT_VAR_END, .line = lx->line, .col = lx->col};
                MOE_TRY(push(lx, t));
                advance(lx, lx->pos + skip);
                *strip_after = mode;
                return MOE_OK;
            }
        }
        struct jtok t = {.s = p, .line = lx->line, .col = lx->col};
        if (is_name0(*p)) {
            size_t k = 1;
            while (k < left && (is_name0(p[k]) || is_digit(p[k]))) k++;
            t.kind = JT_NAME;
            t.len = k;
        } else if (is_digit(*p)) {
            size_t k = 0;
            while (k < left && (is_digit(p[k]) || p[k] == '_')) k++;
            bool is_float = false;
            if (k + 1 < left && p[k] == '.' && is_digit(p[k + 1])) {
                is_float = true;
                k++;
                while (k < left && (is_digit(p[k]) || p[k] == '_')) k++;
            }
            if (k < left && (p[k] == 'e' || p[k] == 'E')) {
                size_t e = k + 1;
                if (e < left && (p[e] == '+' || p[e] == '-')) e++;
                if (e < left && is_digit(p[e])) {
                    is_float = true;
                    k = e;
                    while (k < left && is_digit(p[k])) k++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t i = 0; i < k && m < sizeof buf - 1; i++)
                if (p[i] != '_') buf[m++] = p[i];
            buf[m] = '\0';
            t.len = k;
            if (is_float) {
                t.kind = JT_FLOAT;
                t.fval = strtod(buf, NULL);
            } else {
                t.kind = JT_INT;
                char *end;
                t.ival = strtoll(buf, &end, 10);
                if (m > 18) return lex_err(lx, t.line, t.col, "integer literal too large");
            }
        } else if (*p == '\'' || *p == '"') {
            size_t k = 1;
            while (k < left && p[k] != *p) k += (p[k] == '\\' && k + 1 < left) ? 2 : 1;
            if (k >= left) return lex_err(lx, t.line, t.col, "unterminated string literal");
            t.kind = JT_STRING;
            MOE_TRY(decode_string(lx, p + 1, k - 1, t.line, t.col, &t));
            t.s = p;
            advance(lx, lx->pos + k + 1);
            MOE_TRY(push(lx, t));
            continue;
        } else {
            t.kind = JT_OP;
            for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++) {
                size_t l = strlen(OPS[i]);
                if (l <= left && memcmp(p, OPS[i], l) == 0) {
                    t.len = l;
                    break;
                }
            }
            if (!t.len) {
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected character '%c'", *p);
                return lex_err(lx, t.line, t.col, msg);
            }
            if (*p == '(' || *p == '[' || *p == '{') depth++;
            if ((*p == ')' || *p == ']' || *p == '}') && depth > 0) depth--;
        }
        advance(lx, lx->pos + t.len);
        MOE_TRY(push(lx, t));
    }
}

/* Is src[pos..] "{%[-+]? raw [-+]?%}"?  Sets *end past it and the signs. */
static bool match_word_tag(const char *s, size_t n, size_t pos, const char *word, size_t *end,
                           char *lsign, char *rsign)
{
    if (pos + 2 > n || s[pos] != '{' || s[pos + 1] != '%') return false;
    size_t i = pos + 2;
    *lsign = (i < n && (s[i] == '-' || s[i] == '+')) ? s[i++] : 0;
    while (i < n && is_ws(s[i])) i++;
    size_t wl = strlen(word);
    if (i + wl > n || memcmp(s + i, word, wl) != 0) return false;
    i += wl;
    while (i < n && is_ws(s[i])) i++;
    *rsign = (i < n && (s[i] == '-' || s[i] == '+')) ? s[i++] : 0;
    if (i + 2 > n || s[i] != '%' || s[i + 1] != '}') return false;
    *end = i + 2;
    return true;
}

enum moe_status jinja_lex(const char *src, struct jtoks *out)
{
    memset(out, 0, sizeof *out);
    struct lexer lx = {.src = src, .n = strlen(src), .line = 1, .col = 1, .out = out};
    if (lx.n && src[lx.n - 1] == '\n') lx.n--; /* keep_trailing_newline=False */
    bool line_starting = true;
    enum moe_status st = MOE_OK;
    while (lx.pos < lx.n) {
        /* Find the next tag opening. */
        size_t q = lx.pos;
        while (q + 1 < lx.n && !(src[q] == '{' && (src[q + 1] == '{' || src[q + 1] == '%' || src[q + 1] == '#'))) q++;
        if (q + 1 >= lx.n) q = lx.n;
        size_t tend = q;
        char kind = q < lx.n ? src[q + 1] : 0;
        char sign = q + 2 < lx.n ? src[q + 2] : 0;
        if (kind && sign == '-') {
            while (tend > lx.pos && is_ws(src[tend - 1])) tend--;
        } else if ((kind == '%' || kind == '#') && sign != '+') {
            size_t l = tend;
            while (l > lx.pos && (src[l - 1] == ' ' || src[l - 1] == '\t' || src[l - 1] == '\r' ||
                                  src[l - 1] == '\f' || src[l - 1] == '\v'))
                l--;
            if ((l > lx.pos && src[l - 1] == '\n') || (l == lx.pos && line_starting)) tend = l;
        }
        if (tend > lx.pos) {
            struct jtok t = {.kind = JT_TEXT, .s = src + lx.pos, .len = tend - lx.pos,
                             .line = lx.line, .col = lx.col};
            if ((st = push(&lx, t))) goto fail;
        }
        advance(&lx, q);
        if (q >= lx.n) break;
        int tline = lx.line, tcol = lx.col;
        int strip_after = 0;
        bool trim = false;
        size_t rend;
        char ls, rs;
        if (kind == '#') {
            size_t e = q + 2;
            while (e + 1 < lx.n && !(src[e] == '#' && src[e + 1] == '}')) e++;
            if (e + 1 >= lx.n) {
                st = lex_err(&lx, tline, tcol, "unclosed comment: missing '#}'");
                goto fail;
            }
            strip_after = src[e - 1] == '-' && e - 1 > q + 1 ? 1 : src[e - 1] == '+' ? 2 : 0;
            advance(&lx, e + 2);
            trim = true;
        } else if (kind == '%' && match_word_tag(src, lx.n, q, "raw", &rend, &ls, &rs)) {
            /* Find {% endraw %}; the text between is literal. */
            size_t e = rend, eend = 0;
            char els = 0, ers = 0;
            while (e < lx.n && !match_word_tag(src, lx.n, e, "endraw", &eend, &els, &ers)) e++;
            if (e >= lx.n) {
                st = lex_err(&lx, tline, tcol, "unclosed {% raw %}: missing {% endraw %}");
                goto fail;
            }
            size_t b = rend, te = e;
            if (rs == '-') while (b < te && is_ws(src[b])) b++;
            if (els == '-') while (te > b && is_ws(src[te - 1])) te--;
            advance(&lx, b);
            if (te > b) {
                struct jtok t = {.kind = JT_TEXT, .s = src + b, .len = te - b, .line = lx.line, .col = lx.col};
                if ((st = push(&lx, t))) goto fail;
            }
            advance(&lx, eend);
            strip_after = ers == '-' ? 1 : ers == '+' ? 2 : 0;
            trim = true;
        } else {
            bool block = kind == '%';
            struct jtok t = {.kind = block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, .line = tline, .col = tcol};
            if ((st = push(&lx, t))) goto fail;
            advance(&lx, q + 2 + ((sign == '-' || sign == '+') ? 1 : 0));
            if ((st = lex_tag(&lx, block, &strip_after))) goto fail;
            trim = block;
        }
        if (strip_after == 1) {
            size_t e = lx.pos;
            while (e < lx.n && is_ws(src[e])) e++;
            advance(&lx, e);
        } else if (strip_after == 0 && trim && lx.pos < lx.n && src[lx.pos] == '\n') {
            advance(&lx, lx.pos + 1);
        }
        line_starting = lx.pos > 0 && src[lx.pos - 1] == '\n';
    }
    struct jtok eof = {.kind = JT_EOF, .line = lx.line, .col = lx.col};
    if ((st = push(&lx, eof))) goto fail;
    return MOE_OK;
fail:
    jinja_tokens_free(out);
    return st;
}

void jinja_tokens_free(struct jtoks *t)
{
    for (size_t i = 0; i < t->n; i++) free(t->v[i].str);
    free(t->v);
    memset(t, 0, sizeof *t);
}
