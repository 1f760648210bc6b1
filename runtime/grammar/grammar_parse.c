/* grammar_parse.c - the grammar text into the compiled element array
 * (grammar_impl.h); the left-recursion check; the built-in JSON grammar.
 *
 * Recursive descent over the syntax of docs/grammar.md, close to
 * llama.cpp's GBNF: whitespace and newlines separate items anywhere, a
 * rule ends where the next `name ::=` begins.  Groups and repetitions
 * become helper rules named after the rule they appear in ("value_3"):
 * x* is R ::= x R | empty (right recursion: the recognizer reuses the
 * stack node, so it does not deepen), x+ is x x*, x? is R ::= x | empty,
 * x{m,n} is m copies of x then n-m nested optionals. */
#include "runtime/grammar/grammar_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

struct vec {
    struct g_elem *p;
    size_t n, cap;
};

struct prule {
    char *name;
    struct vec body;
    bool defined;
    size_t ref_at;          /* offset of the first reference (undefined rules) */
    size_t def_at;          /* offset of the definition */
    int parent;             /* helper rules: the rule they were made in, else -1 */
};

struct parser {
    const char *s;
    size_t n, i;
    struct prule *r;
    int n_r, cap_r;
    size_t total;           /* elements in all bodies */
    int cur;                /* rule being defined */
};

static void where(const struct parser *p, size_t at, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        unsigned char c = (unsigned char)p->s[k];
        if (c == '\n') {
            ++*line;
            *col = 1;
        } else if ((c & 0xC0) != 0x80) {
            ++*col;
        }
    }
}

static enum moe_status MOE_PRINTF(3, 4) fail_at(const struct parser *p, size_t at, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    where(p, at, &line, &col);
    return moe_fail(MOE_ERR_FORMAT, "grammar: line %d, column %d: %s", line, col, msg);
}

static enum moe_status push(struct parser *p, struct vec *v, uint32_t type, uint32_t value)
{
    if (p->total >= MOE_GRAMMAR_MAX_ELEMS)
        return fail_at(p, p->i, "the grammar expands to more than %d elements", MOE_GRAMMAR_MAX_ELEMS);
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        struct g_elem *q = realloc(v->p, cap * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
        v->p = q;
        v->cap = cap;
    }
    v->p[v->n++] = (struct g_elem){type, value};
    p->total++;
    return MOE_OK;
}

static enum moe_status push_all(struct parser *p, struct vec *v, const struct g_elem *e, size_t n)
{
    for (size_t k = 0; k < n; k++) MOE_TRY(push(p, v, e[k].type, e[k].value));
    return MOE_OK;
}

/* A new rule (name owned by the caller's copy); *id its index. */
static enum moe_status add_rule(struct parser *p, const char *name, size_t len, int parent, int *id)
{
    if (p->n_r == p->cap_r) {
        int cap = p->cap_r ? p->cap_r * 2 : 16;
        struct prule *q = realloc(p->r, (size_t)cap * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
        p->r = q;
        p->cap_r = cap;
    }
    struct prule *r = &p->r[p->n_r];
    memset(r, 0, sizeof *r);
    r->parent = parent;
    if (!(r->name = malloc(len + 1))) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
    memcpy(r->name, name, len);
    r->name[len] = 0;
    *id = p->n_r++;
    return MOE_OK;
}

static enum moe_status helper_rule(struct parser *p, int *id)
{
    char name[128];
    int root = p->cur;
    while (p->r[root].parent >= 0) root = p->r[root].parent;
    int len = snprintf(name, sizeof name, "%.100s_%d", p->r[root].name, p->n_r);
    MOE_TRY(add_rule(p, name, (size_t)len, root, id));
    p->r[*id].defined = true;
    return MOE_OK;
}

static int find_rule(const struct parser *p, const char *name, size_t len)
{
    for (int k = 0; k < p->n_r; k++)
        if (p->r[k].parent < 0 && strlen(p->r[k].name) == len && !memcmp(p->r[k].name, name, len))
            return k;
    return -1;
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static void skip_ws(struct parser *p)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else {
            break;
        }
    }
}

static size_t name_len(const struct parser *p, size_t at)
{
    size_t k = at;
    while (k < p->n && name_char(p->s[k])) k++;
    return k - at;
}

/* Whether `name ::=` starts at p->i (the next rule). */
static bool at_rule_head(struct parser *p)
{
    size_t save = p->i, nl = name_len(p, p->i);
    if (!nl) return false;
    p->i += nl;
    skip_ws(p);
    bool yes = p->n - p->i >= 3 && !memcmp(p->s + p->i, "::=", 3);
    p->i = save;
    return yes;
}

/* One code point of the source at p->i. */
static enum moe_status next_cp(struct parser *p, uint32_t *cp)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)p->s + p->i,
                                          (utf8proc_ssize_t)(p->n - p->i), &c);
    if (k <= 0) return fail_at(p, p->i, "invalid UTF-8");
    p->i += (size_t)k;
    *cp = (uint32_t)c;
    return MOE_OK;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A character of a literal or class, escapes decoded. */
static enum moe_status parse_char(struct parser *p, uint32_t *cp)
{
    size_t at = p->i;
    if (p->i >= p->n) return fail_at(p, at, "unexpected end of the grammar");
    if (p->s[p->i] != '\\') return next_cp(p, cp);
    p->i++;
    if (p->i >= p->n) return fail_at(p, at, "unexpected end of the grammar after '\\'");
    char c = p->s[p->i++];
    int digits = 0;
    switch (c) {
    case 'n': *cp = '\n'; return MOE_OK;
    case 't': *cp = '\t'; return MOE_OK;
    case 'r': *cp = '\r'; return MOE_OK;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
        *cp = (uint32_t)c;
        return MOE_OK;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default: return fail_at(p, at, "unknown escape '\\%c'", c);
    }
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
        if (h < 0) return fail_at(p, at, "'\\%c' needs %d hex digits", c, digits);
        v = v * 16 + (uint32_t)h;
        p->i++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return fail_at(p, at, "'\\%c' escape U+%X is not a Unicode scalar value", c, v);
    *cp = v;
    return MOE_OK;
}

static enum moe_status parse_class(struct parser *p, struct vec *out)
{
    size_t at = p->i++;
    bool neg = p->i < p->n && p->s[p->i] == '^';
    if (neg) p->i++;
    bool first = true;
    while (true) {
        if (p->i >= p->n) return fail_at(p, at, "character class is not closed with ']'");
        if (p->s[p->i] == ']') break;
        uint32_t lo, hi;
        size_t ca = p->i;
        MOE_TRY(parse_char(p, &lo));
        MOE_TRY(push(p, out, first ? (neg ? G_CHAR_NOT : G_CHAR) : G_CHAR_ALT, lo));
        first = false;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            MOE_TRY(parse_char(p, &hi));
            if (hi < lo) return fail_at(p, ca, "range U+%X-U+%X is empty (its end is below its start)", lo, hi);
            MOE_TRY(push(p, out, G_RANGE_HI, hi));
        }
    }
    if (first) return fail_at(p, at, "empty character class '[]'");
    p->i++;
    return MOE_OK;
}

static enum moe_status parse_alts(struct parser *p, struct vec *out, int depth);

/* One rule holding body b: R ::= b (ALT/END included by the caller). */
static enum moe_status new_helper(struct parser *p, const struct g_elem *b, size_t n, int *id)
{
    MOE_TRY(helper_rule(p, id));
    struct vec *v = &p->r[*id].body;
    return push_all(p, v, b, n);
}

/* Applies the postfix operator at p->i to the item out[start..). */
static enum moe_status repeat(struct parser *p, struct vec *out, size_t start, size_t at)
{
    size_t n_item = out->n - start;
    struct g_elem *item = malloc((n_item ? n_item : 1) * sizeof *item);
    if (!item) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
    if (n_item) memcpy(item, out->p + start, n_item * sizeof *item);
    p->total -= n_item;
    out->n = start;
    enum moe_status st = MOE_OK;
    char op = p->s[p->i++];
    long m = 0, mx = -1; /* -1: unbounded */
    if (op == '*') m = 0;
    else if (op == '+') m = 1;
    else if (op == '?') mx = 1;
    else { /* {m}, {m,}, {m,n} */
        char *end;
        m = strtol(p->s + p->i, &end, 10);
        if (end == p->s + p->i || m < 0 || m > MOE_GRAMMAR_MAX_REPEAT) {
            st = fail_at(p, at, "'{' needs a count from 0 to %d", MOE_GRAMMAR_MAX_REPEAT);
            goto done;
        }
        p->i = (size_t)(end - p->s);
        mx = m;
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            mx = -1;
            if (p->i < p->n && p->s[p->i] != '}') {
                mx = strtol(p->s + p->i, &end, 10);
                if (end == p->s + p->i || mx < m || mx > MOE_GRAMMAR_MAX_REPEAT) {
                    st = fail_at(p, at, "'{%ld,n}' needs n from %ld to %d", m, m, MOE_GRAMMAR_MAX_REPEAT);
                    goto done;
                }
                p->i = (size_t)(end - p->s);
            }
        }
        if (p->i >= p->n || p->s[p->i] != '}') {
            st = fail_at(p, at, "repetition '{' is not closed with '}'");
            goto done;
        }
        p->i++;
    }
    if (n_item == 0) {
        st = fail_at(p, at, "'%c' repeats an empty item", op);
        goto done;
    }
    for (long k = 0; k < m; k++)
        if ((st = push_all(p, out, item, n_item))) goto done;
    if (mx < 0) { /* R ::= item R | empty */
        int id;
        if ((st = helper_rule(p, &id))) goto done;
        struct vec *v = &p->r[id].body;
        if ((st = push_all(p, v, item, n_item)) || (st = push(p, &p->r[id].body, G_REF, (uint32_t)id)) ||
            (st = push(p, &p->r[id].body, G_ALT, 0)) || (st = push(p, &p->r[id].body, G_END, 0)))
            goto done;
        st = push(p, out, G_REF, (uint32_t)id);
    } else if (mx > m) { /* R_1 ::= item | empty; R_k ::= item R_{k-1} | empty */
        int prev = -1;
        for (long k = 0; k < mx - m; k++) {
            int id;
            if ((st = new_helper(p, item, n_item, &id))) goto done;
            if (prev >= 0 && (st = push(p, &p->r[id].body, G_REF, (uint32_t)prev))) goto done;
            if ((st = push(p, &p->r[id].body, G_ALT, 0)) || (st = push(p, &p->r[id].body, G_END, 0)))
                goto done;
            prev = id;
        }
        st = push(p, out, G_REF, (uint32_t)prev);
    }
done:
    free(item);
    return st;
}

static enum moe_status parse_seq(struct parser *p, struct vec *out, int depth)
{
    while (true) {
        skip_ws(p);
        if (p->i >= p->n) return MOE_OK;
        char c = p->s[p->i];
        if (c == '|' || c == ')') return MOE_OK;
        if (name_char(c) && at_rule_head(p)) return MOE_OK;
        size_t start = out->n, at = p->i;
        if (c == '"') {
            p->i++;
            while (true) {
                if (p->i >= p->n || p->s[p->i] == '\n')
                    return fail_at(p, at, "string literal is not closed with '\"'");
                if (p->s[p->i] == '"') break;
                uint32_t cp;
                MOE_TRY(parse_char(p, &cp));
                MOE_TRY(push(p, out, G_CHAR, cp));
            }
            p->i++;
        } else if (c == '[') {
            MOE_TRY(parse_class(p, out));
        } else if (c == '.') {
            p->i++;
            MOE_TRY(push(p, out, G_ANY, 0));
        } else if (c == '(') {
            if (depth > 100) return fail_at(p, at, "groups nested more than 100 deep");
            p->i++;
            int id;
            MOE_TRY(helper_rule(p, &id));
            struct vec body = {0};
            enum moe_status st = parse_alts(p, &body, depth + 1);
            p->r[id].body = body; /* p->r may have moved */
            MOE_TRY(st);
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ')') return fail_at(p, at, "'(' is not closed with ')'");
            p->i++;
            MOE_TRY(push(p, out, G_REF, (uint32_t)id));
        } else if (name_char(c)) {
            size_t nl = name_len(p, p->i);
            int id = find_rule(p, p->s + p->i, nl);
            if (id < 0) {
                MOE_TRY(add_rule(p, p->s + p->i, nl, -1, &id));
                p->r[id].ref_at = p->i;
            }
            p->i += nl;
            MOE_TRY(push(p, out, G_REF, (uint32_t)id));
        } else {
            uint32_t cp = 0;
            MOE_TRY(next_cp(p, &cp));
            if (cp < 0x80) return fail_at(p, at, "unexpected '%c'", (char)cp);
            return fail_at(p, at, "unexpected character U+%04X", cp);
        }
        while (p->i < p->n && (p->s[p->i] == '*' || p->s[p->i] == '+' || p->s[p->i] == '?' ||
                               p->s[p->i] == '{'))
            MOE_TRY(repeat(p, out, start, p->i));
    }
}

static enum moe_status parse_alts(struct parser *p, struct vec *out, int depth)
{
    MOE_TRY(parse_seq(p, out, depth));
    while (p->i < p->n && p->s[p->i] == '|') {
        p->i++;
        MOE_TRY(push(p, out, G_ALT, 0));
        MOE_TRY(parse_seq(p, out, depth));
    }
    return push(p, out, G_END, 0);
}

static enum moe_status parse_rules(struct parser *p)
{
    while (true) {
        skip_ws(p);
        if (p->i >= p->n) return MOE_OK;
        size_t at = p->i, nl = name_len(p, p->i);
        if (!nl) return fail_at(p, at, "expected a rule name");
        int id = find_rule(p, p->s + at, nl);
        if (id >= 0 && p->r[id].defined) {
            int line, col;
            where(p, p->r[id].def_at, &line, &col);
            return fail_at(p, at, "rule '%s' is defined twice (first at line %d)", p->r[id].name, line);
        }
        if (id < 0) MOE_TRY(add_rule(p, p->s + at, nl, -1, &id));
        p->i += nl;
        skip_ws(p);
        if (p->n - p->i < 3 || memcmp(p->s + p->i, "::=", 3))
            return fail_at(p, p->i, "expected '::=' after rule name '%s'", p->r[id].name);
        p->i += 3;
        p->r[id].defined = true;
        p->r[id].def_at = at;
        p->cur = id;
        struct vec body = {0};
        enum moe_status st = parse_alts(p, &body, 0);
        p->r[id].body = body;
        MOE_TRY(st);
        if (p->i < p->n && p->s[p->i] == ')') return fail_at(p, p->i, "unexpected ')'");
    }
}

/* ---- checks on the rules ---- */

static bool alt_end(uint32_t t) { return t == G_ALT || t == G_END; }

/* nullable[r]: rule r derives the empty string (fixpoint). */
static void nullable_rules(const struct parser *p, bool *nul)
{
    bool changed = true;
    while (changed) {
        changed = false;
        for (int r = 0; r < p->n_r; r++) {
            if (nul[r]) continue;
            const struct vec *b = &p->r[r].body;
            bool ok = true;
            for (size_t k = 0; k < b->n; k++) {
                uint32_t t = b->p[k].type;
                if (alt_end(t)) {
                    if (ok) {
                        nul[r] = changed = true;
                        break;
                    }
                    ok = true;
                } else if (g_is_char(t) || (t == G_REF && !nul[b->p[k].value])) {
                    ok = false;
                }
            }
        }
    }
}

/* Depth-first over "r may begin with s" edges; color 1: on the path. */
static int left_cycle(const struct parser *p, const bool *nul, int r, char *color, int *path, int depth)
{
    color[r] = 1;
    path[depth] = r;
    const struct vec *b = &p->r[r].body;
    bool lead = true; /* everything before k in this alternative is nullable */
    for (size_t k = 0; k < b->n; k++) {
        uint32_t t = b->p[k].type;
        if (alt_end(t)) {
            lead = true;
            continue;
        }
        if (!lead) continue;
        if (g_is_char(t)) {
            lead = false;
        } else if (t == G_REF) {
            int s = (int)b->p[k].value;
            if (color[s] == 1) {
                path[depth + 1] = s;
                return depth + 2;
            }
            if (color[s] == 0) {
                int n = left_cycle(p, nul, s, color, path, depth + 1);
                if (n) return n;
            }
            lead = nul[s];
        }
    }
    color[r] = 2;
    return 0;
}

static enum moe_status check_rules(struct parser *p)
{
    for (int r = 0; r < p->n_r; r++)
        if (!p->r[r].defined) {
            struct parser q = *p;
            return fail_at(&q, p->r[r].ref_at, "rule '%s' is used but not defined", p->r[r].name);
        }
    if (find_rule(p, "root", 4) < 0) return moe_fail(MOE_ERR_FORMAT, "grammar: no 'root' rule");
    bool *nul = calloc((size_t)p->n_r, sizeof *nul);
    char *color = calloc((size_t)p->n_r, 1);
    int *path = calloc((size_t)p->n_r + 2, sizeof *path);
    enum moe_status st = MOE_OK;
    if (!nul || !color || !path) {
        st = moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
        goto done;
    }
    nullable_rules(p, nul);
    for (int r = 0; r < p->n_r && !st; r++) {
        if (color[r]) continue;
        int n = left_cycle(p, nul, r, color, path, 0);
        if (!n) continue;
        int from = 0; /* the cycle starts where its last rule first appears */
        while (path[from] != path[n - 1]) from++;
        char cyc[512];
        size_t len = 0;
        for (int k = from; k < n && len < sizeof cyc - 1; k++)
            len += (size_t)snprintf(cyc + len, sizeof cyc - len, "%s%s", k > from ? " -> " : "",
                                    p->r[path[k]].name);
        st = moe_fail(MOE_ERR_FORMAT, "grammar: rule '%s' is left-recursive (%s): it can reach itself "
                      "without consuming input; rewrite it with repetition", p->r[path[n - 1]].name, cyc);
    }
done:
    free(nul);
    free(color);
    free(path);
    return st;
}

static void free_parser(struct parser *p)
{
    for (int r = 0; r < p->n_r; r++) {
        free(p->r[r].name);
        free(p->r[r].body.p);
    }
    free(p->r);
}

void moe_grammar_free(struct moe_grammar *g)
{
    if (!g) return;
    moe_gm_posmask_clear(g);
    if (g->rule_name)
        for (int r = 0; r < g->n_rules; r++) free(g->rule_name[r]);
    free(g->rule_name);
    free(g->rule_start);
    free(g->e);
    free(g);
}

int moe_grammar_n_rules(const struct moe_grammar *g) { return g->n_rules; }

enum moe_status moe_grammar_parse(const char *src, size_t len, struct moe_grammar **out)
{
    *out = NULL;
    if (len > MOE_GRAMMAR_MAX_SOURCE)
        return moe_fail(MOE_ERR_FORMAT, "grammar: %zu bytes (at most %d)", len, MOE_GRAMMAR_MAX_SOURCE);
    struct parser p = {.s = src, .n = len, .cur = -1};
    struct moe_grammar *g = NULL;
    enum moe_status st = parse_rules(&p);
    if (!st) st = check_rules(&p);
    if (st) goto fail;
    if (!(g = calloc(1, sizeof *g))) goto nomem;
    g->n_rules = p.n_r;
    g->n_e = (int32_t)p.total;
    g->e = malloc((p.total ? p.total : 1) * sizeof *g->e);
    g->rule_start = malloc((size_t)p.n_r * sizeof *g->rule_start);
    g->rule_name = calloc((size_t)p.n_r, sizeof *g->rule_name);
    if (!g->e || !g->rule_start || !g->rule_name) goto nomem;
    size_t at = 0;
    for (int r = 0; r < p.n_r; r++) {
        g->rule_start[r] = (int32_t)at;
        memcpy(g->e + at, p.r[r].body.p, p.r[r].body.n * sizeof *g->e);
        at += p.r[r].body.n;
        g->rule_name[r] = p.r[r].name;
        p.r[r].name = NULL;
    }
    for (int r = 0; r < p.n_r; r++)
        if (!strcmp(g->rule_name[r], "root")) g->root = r;
    free_parser(&p);
    *out = g;
    return MOE_OK;
nomem:
    st = moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
fail:
    free_parser(&p);
    moe_grammar_free(g);
    return st;
}

/* JSON (RFC 8259) with the top level an object.  Whitespace between
 * tokens is at most one space, or one newline followed by up to 20 spaces
 * (the indentation of pretty-printed JSON), so a model cannot spend its
 * tokens on runaway whitespace; none before the object or after it. */
const char moe_grammar_json_object_source[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"
    "array  ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "ws     ::= ( \" \" | \"\\n\" \" \"{0,20} )?\n";

enum moe_status moe_grammar_json_object(struct moe_grammar **out)
{
    return moe_grammar_parse(moe_grammar_json_object_source, sizeof moe_grammar_json_object_source - 1, out);
}
