/* jinja_parse.c - tokens -> AST, following jinja2.parser.Parser.
 *
 * Precedence, lowest first (as Jinja): `x if c else y`; or; and; not;
 * comparisons (==, !=, <, <=, >, >=, in, not in; one per expression, a
 * chain like a < b < c is reported unsupported); + -; ~; * / // %; **;
 * unary - +; then a primary with postfixes (.attr, [key], [a:b:c], (args))
 * and filters/tests (| f(args), is [not] t(args)).  So `a + b | trim` is
 * a + (b | trim) and `x|length - 1` is (x|length) - 1.
 *
 * Statements: if/elif/else, for (targets, `if` filter, else), set (name,
 * ns.attr, tuple targets, block set), macro, break/continue
 * (jinja2.ext.loopcontrols), generation/endgeneration (transformers'
 * AssistantTracker: its body is rendered as is).  Other Jinja tags
 * (extends, include, import, call, filter, with, ...) are MOE_ERR_UNSUPPORTED
 * naming the tag and line; unknown tags and malformed syntax are
 * MOE_ERR_FORMAT naming line and column. */
#include <stdlib.h>
#include <string.h>

#include "runtime/jinja.h"

#define MAX_PARSE_DEPTH 200

struct parser {
    struct jtoks toks;
    size_t i;
    int depth;
};

static const struct jtok *peek(struct parser *p) { return &p->toks.v[p->i]; }
static const struct jtok *peek2(struct parser *p)
{
    return p->i + 1 < p->toks.n ? &p->toks.v[p->i + 1] : &p->toks.v[p->toks.n - 1];
}
static const struct jtok *next(struct parser *p)
{
    const struct jtok *t = &p->toks.v[p->i];
    if (t->kind != JT_EOF) p->i++;
    return t;
}

static bool tok_is(const struct jtok *t, enum jtok_kind k, const char *s)
{
    return t->kind == k && strlen(s) == t->len && memcmp(t->s, s, t->len) == 0;
}
static bool is_op(struct parser *p, const char *s) { return tok_is(peek(p), JT_OP, s); }
static bool is_name(struct parser *p, const char *s) { return tok_is(peek(p), JT_NAME, s); }

static const char *tok_desc(const struct jtok *t, char *buf, size_t n)
{
    switch (t->kind) {
    case JT_EOF: return "end of template";
    case JT_TEXT: return "template text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "end of print statement '}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "end of statement block '%}'";
    case JT_STRING: return "string literal";
    default: snprintf(buf, n, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->s); return buf;
    }
}

static enum moe_status syntax_err(const struct jtok *t, const char *expected)
{
    char buf[64];
    return moe_fail(MOE_ERR_FORMAT, "chat template line %d column %d: syntax error: expected %s, got %s",
                    t->line, t->col, expected, tok_desc(t, buf, sizeof buf));
}

static enum moe_status nomem(void) { return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory"); }

static enum moe_status expect_op(struct parser *p, const char *s)
{
    if (!is_op(p, s)) {
        char want[16];
        snprintf(want, sizeof want, "'%s'", s);
        return syntax_err(peek(p), want);
    }
    next(p);
    return MOE_OK;
}

static enum moe_status expect_kind(struct parser *p, enum jtok_kind k, const char *what)
{
    if (peek(p)->kind != k) return syntax_err(peek(p), what);
    next(p);
    return MOE_OK;
}

static struct jnode *node_new(enum jn_kind kind, const struct jtok *t)
{
    struct jnode *n = calloc(1, sizeof *n);
    if (n) {
        n->kind = kind;
        n->line = t->line;
        n->col = t->col;
    }
    return n;
}

static char *tok_strdup(const struct jtok *t)
{
    char *s = malloc(t->len + 1);
    if (s) {
        memcpy(s, t->s, t->len);
        s[t->len] = '\0';
    }
    return s;
}

static enum moe_status list_push(struct jlist *l, struct jnode *n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct jnode **v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            jnode_free(n);
            return nomem();
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
    return MOE_OK;
}

static void list_free(struct jlist *l)
{
    for (size_t i = 0; i < l->n; i++) jnode_free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

void jnode_free(struct jnode *n)
{
    if (!n) return;
    free(n->str);
    json_decref(n->cval);
    jnode_free(n->a);
    jnode_free(n->b);
    jnode_free(n->c);
    list_free(&n->args);
    list_free(&n->kwargs);
    list_free(&n->body);
    list_free(&n->orelse);
    free(n);
}

static enum moe_status parse_expr(struct parser *p, struct jnode **out);
static enum moe_status parse_or(struct parser *p, struct jnode **out);
static enum moe_status parse_unary(struct parser *p, bool with_filter, struct jnode **out);

/* Builds a binary node from left and the operand parsed by sub; frees both
 * on failure. */
static enum moe_status binary(struct parser *p, const struct jtok *t, int op, struct jnode **left,
                              enum moe_status (*sub)(struct parser *, struct jnode **))
{
    struct jnode *right = NULL;
    enum moe_status st = sub(p, &right);
    if (st) return st;
    struct jnode *n = node_new(JN_BINARY, t);
    if (!n) {
        jnode_free(right);
        return nomem();
    }
    n->op = op;
    n->a = *left;
    n->b = right;
    *left = n;
    return MOE_OK;
}

/* Call arguments after '(' up to and including ')': positional into args,
 * name=value into kwargs as JN_KWARG. */
static enum moe_status parse_call_args(struct parser *p, struct jnode *n)
{
    MOE_TRY(expect_op(p, "("));
    while (!is_op(p, ")")) {
        if (n->args.n + n->kwargs.n > 0) MOE_TRY(expect_op(p, ","));
        if (is_op(p, ")")) break; /* trailing comma */
        if (is_op(p, "*") || is_op(p, "**"))
            return moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: *args and **kwargs in calls are not supported",
                            peek(p)->line);
        if (peek(p)->kind == JT_NAME && tok_is(peek2(p), JT_OP, "=")) {
            const struct jtok *t = next(p);
            next(p);
            struct jnode *kw = node_new(JN_KWARG, t);
            if (!kw || !(kw->str = tok_strdup(t))) {
                jnode_free(kw);
                return nomem();
            }
            enum moe_status st = parse_expr(p, &kw->a);
            if (st) {
                jnode_free(kw);
                return st;
            }
            MOE_TRY(list_push(&n->kwargs, kw));
        } else {
            if (n->kwargs.n)
                return syntax_err(peek(p), "a keyword argument (positional after keyword)");
            struct jnode *a = NULL;
            MOE_TRY(parse_expr(p, &a));
            MOE_TRY(list_push(&n->args, a));
        }
    }
    next(p);
    return MOE_OK;
}

static enum moe_status parse_const(const struct jtok *t, json_t *v, struct jnode **out)
{
    if (!v) return nomem();
    struct jnode *n = node_new(JN_CONST, t);
    if (!n) {
        json_decref(v);
        return nomem();
    }
    n->cval = v;
    *out = n;
    return MOE_OK;
}

/* Items of a list/tuple/dict literal up to the closing delimiter. */
static enum moe_status parse_items(struct parser *p, struct jnode *n, const char *close, bool dict)
{
    while (!is_op(p, close)) {
        if (n->args.n) MOE_TRY(expect_op(p, ","));
        if (is_op(p, close)) break;
        struct jnode *e = NULL;
        MOE_TRY(parse_expr(p, &e));
        MOE_TRY(list_push(&n->args, e));
        if (dict) {
            MOE_TRY(expect_op(p, ":"));
            MOE_TRY(parse_expr(p, &e));
            MOE_TRY(list_push(&n->args, e));
        }
    }
    next(p);
    return MOE_OK;
}

static enum moe_status parse_primary(struct parser *p, struct jnode **out)
{
    const struct jtok *t = peek(p);
    if (t->kind == JT_NAME) {
        next(p);
        if (tok_is(t, JT_NAME, "true") || tok_is(t, JT_NAME, "True")) return parse_const(t, json_true(), out);
        if (tok_is(t, JT_NAME, "false") || tok_is(t, JT_NAME, "False")) return parse_const(t, json_false(), out);
        if (tok_is(t, JT_NAME, "none") || tok_is(t, JT_NAME, "None")) return parse_const(t, json_null(), out);
        struct jnode *n = node_new(JN_NAME, t);
        if (!n || !(n->str = tok_strdup(t))) {
            jnode_free(n);
            return nomem();
        }
        *out = n;
        return MOE_OK;
    }
    if (t->kind == JT_STRING) {
        /* Adjacent literals concatenate: 'a' "b" == 'ab'. */
        struct jbuf b = {0};
        while (peek(p)->kind == JT_STRING) {
            const struct jtok *s = next(p);
            if (jbuf_add(&b, s->str, s->len)) {
                jbuf_free(&b);
                return nomem();
            }
        }
        json_t *v = json_stringn_nocheck(b.p ? b.p : "", b.n);
        jbuf_free(&b);
        return parse_const(t, v, out);
    }
    if (t->kind == JT_INT) {
        next(p);
        return parse_const(t, json_integer(t->ival), out);
    }
    if (t->kind == JT_FLOAT) {
        next(p);
        return parse_const(t, json_real(t->fval), out);
    }
    if (tok_is(t, JT_OP, "(")) {
        next(p);
        if (is_op(p, ")")) { /* empty tuple */
            next(p);
            struct jnode *n = node_new(JN_TUPLE, t);
            if (!n) return nomem();
            *out = n;
            return MOE_OK;
        }
        struct jnode *e = NULL;
        MOE_TRY(parse_expr(p, &e));
        if (is_op(p, ",")) {
            struct jnode *n = node_new(JN_TUPLE, t);
            if (!n) {
                jnode_free(e);
                return nomem();
            }
            enum moe_status st = list_push(&n->args, e);
            if (!st) st = parse_items(p, n, ")", false); /* consumes the ',' */
            if (st) {
                jnode_free(n);
                return st;
            }
            *out = n;
            return MOE_OK;
        }
        enum moe_status st = expect_op(p, ")");
        if (st) {
            jnode_free(e);
            return st;
        }
        *out = e;
        return MOE_OK;
    }
    if (tok_is(t, JT_OP, "[") || tok_is(t, JT_OP, "{")) {
        bool dict = t->s[0] == '{';
        next(p);
        struct jnode *n = node_new(dict ? JN_DICT : JN_LIST, t);
        if (!n) return nomem();
        enum moe_status st = parse_items(p, n, dict ? "}" : "]", dict);
        if (st) {
            jnode_free(n);
            return st;
        }
        *out = n;
        return MOE_OK;
    }
    return syntax_err(t, "an expression");
}

/* obj[...]: an index or a slice. */
static enum moe_status parse_subscript(struct parser *p, const struct jtok *t, struct jnode **obj)
{
    struct jnode *parts[3] = {NULL, NULL, NULL};
    int nparts = 1;
    enum moe_status st = MOE_OK;
    if (!is_op(p, ":")) st = parse_expr(p, &parts[0]);
    while (!st && is_op(p, ":") && nparts < 3) {
        next(p);
        if (!is_op(p, ":") && !is_op(p, "]")) st = parse_expr(p, &parts[nparts]);
        nparts++;
    }
    if (!st) st = expect_op(p, "]");
    struct jnode *n = NULL;
    if (!st && !(n = node_new(nparts == 1 ? JN_GETITEM : JN_SLICE, t))) st = nomem();
    if (st) {
        for (int i = 0; i < 3; i++) jnode_free(parts[i]);
        return st;
    }
    n->a = *obj;
    *obj = n;
    if (nparts == 1) {
        n->b = parts[0];
        return MOE_OK;
    }
    for (int i = 0; i < 3; i++) {
        if (n->args.n == n->args.cap) {
            struct jnode **v = realloc(n->args.v, 3 * sizeof *v);
            if (!v) {
                for (int j = i; j < 3; j++) jnode_free(parts[j]);
                return nomem();
            }
            n->args.v = v;
            n->args.cap = 3;
        }
        n->args.v[n->args.n++] = parts[i]; /* may be NULL */
    }
    return MOE_OK;
}

static enum moe_status parse_postfix(struct parser *p, struct jnode **e, bool filters)
{
    for (;;) {
        const struct jtok *t = peek(p);
        struct jnode *n = NULL;
        if (tok_is(t, JT_OP, ".")) {
            next(p);
            const struct jtok *a = next(p);
            if (a->kind == JT_INT) {
                n = node_new(JN_GETITEM, t);
                if (!n) return nomem();
                n->a = *e;
                *e = n;
                MOE_TRY(parse_const(a, json_integer(a->ival), &n->b));
                continue;
            }
            if (a->kind != JT_NAME) return syntax_err(a, "an attribute name");
            if (!(n = node_new(JN_GETATTR, t)) || !(n->str = tok_strdup(a))) {
                jnode_free(n);
                return nomem();
            }
            n->a = *e;
            *e = n;
        } else if (tok_is(t, JT_OP, "[")) {
            next(p);
            MOE_TRY(parse_subscript(p, t, e));
        } else if (tok_is(t, JT_OP, "(")) {
            if (!(n = node_new(JN_CALL, t))) return nomem();
            n->a = *e;
            *e = n;
            MOE_TRY(parse_call_args(p, n));
        } else if (filters && tok_is(t, JT_OP, "|")) {
            next(p);
            const struct jtok *f = next(p);
            if (f->kind != JT_NAME) return syntax_err(f, "a filter name");
            if (!(n = node_new(JN_FILTER, f)) || !(n->str = tok_strdup(f))) {
                jnode_free(n);
                return nomem();
            }
            n->a = *e;
            *e = n;
            if (is_op(p, "(")) MOE_TRY(parse_call_args(p, n));
        } else if (filters && tok_is(t, JT_NAME, "is")) {
            next(p);
            bool negated = false;
            if (is_name(p, "not")) {
                next(p);
                negated = true;
            }
            const struct jtok *f = next(p);
            if (f->kind != JT_NAME) return syntax_err(f, "a test name");
            if (!(n = node_new(JN_TEST, f)) || !(n->str = tok_strdup(f))) {
                jnode_free(n);
                return nomem();
            }
            n->op = negated;
            n->a = *e;
            *e = n;
            const struct jtok *q = peek(p);
            if (is_op(p, "(")) {
                MOE_TRY(parse_call_args(p, n));
            } else if ((q->kind == JT_NAME || q->kind == JT_STRING || q->kind == JT_INT ||
                        q->kind == JT_FLOAT || tok_is(q, JT_OP, "[") || tok_is(q, JT_OP, "{")) &&
                       !tok_is(q, JT_NAME, "else") && !tok_is(q, JT_NAME, "or") &&
                       !tok_is(q, JT_NAME, "and")) {
                struct jnode *arg = NULL;
                MOE_TRY(parse_primary(p, &arg));
                MOE_TRY(list_push(&n->args, arg));
                MOE_TRY(parse_postfix(p, &n->args.v[n->args.n - 1], false));
            }
        } else {
            return MOE_OK;
        }
    }
}

static enum moe_status parse_unary(struct parser *p, bool with_filter, struct jnode **out)
{
    const struct jtok *t = peek(p);
    if (++p->depth > MAX_PARSE_DEPTH) {
        p->depth--;
        return moe_fail(MOE_ERR_FORMAT, "chat template line %d: expression nested too deeply", t->line);
    }
    enum moe_status st;
    struct jnode *e = NULL;
    if (tok_is(t, JT_OP, "-") || tok_is(t, JT_OP, "+")) {
        next(p);
        struct jnode *n = node_new(JN_UNARY, t);
        if (!n) {
            st = nomem();
            goto out;
        }
        n->op = t->s[0];
        if ((st = parse_unary(p, false, &n->a))) {
            jnode_free(n);
            goto out;
        }
        e = n;
    } else if ((st = parse_primary(p, &e))) {
        goto out;
    }
    if ((st = parse_postfix(p, &e, with_filter))) {
        jnode_free(e);
        goto out;
    }
    *out = e;
out:
    p->depth--;
    return st;
}

static enum moe_status parse_unary_f(struct parser *p, struct jnode **out) { return parse_unary(p, true, out); }

static enum moe_status parse_pow(struct parser *p, struct jnode **out)
{
    MOE_TRY(parse_unary(p, true, out));
    while (is_op(p, "**")) {
        const struct jtok *t = next(p);
        enum moe_status st = binary(p, t, JOP_POW, out, parse_unary_f);
        if (st) {
            jnode_free(*out);
            return st;
        }
    }
    return MOE_OK;
}

static enum moe_status parse_math2(struct parser *p, struct jnode **out)
{
    MOE_TRY(parse_pow(p, out));
    for (;;) {
        int op = is_op(p, "*") ? JOP_MUL : is_op(p, "/") ? JOP_DIV : is_op(p, "//") ? JOP_FLOORDIV
               : is_op(p, "%") ? JOP_MOD : 0;
        if (!op) return MOE_OK;
        const struct jtok *t = next(p);
        enum moe_status st = binary(p, t, op, out, parse_pow);
        if (st) {
            jnode_free(*out);
            return st;
        }
    }
}

static enum moe_status parse_concat(struct parser *p, struct jnode **out)
{
    MOE_TRY(parse_math2(p, out));
    while (is_op(p, "~")) {
        const struct jtok *t = next(p);
        enum moe_status st = binary(p, t, JOP_CONCAT, out, parse_math2);
        if (st) {
            jnode_free(*out);
            return st;
        }
    }
    return MOE_OK;
}

static enum moe_status parse_math1(struct parser *p, struct jnode **out)
{
    MOE_TRY(parse_concat(p, out));
    for (;;) {
        int op = is_op(p, "+") ? JOP_ADD : is_op(p, "-") ? JOP_SUB : 0;
        if (!op) return MOE_OK;
        const struct jtok *t = next(p);
        enum moe_status st = binary(p, t, op, out, parse_concat);
        if (st) {
            jnode_free(*out);
            return st;
        }
    }
}

static int compare_op(struct parser *p)
{
    static const struct { const char *s; int op; } ops[] = {
        {"==", JOP_EQ}, {"!=", JOP_NE}, {"<", JOP_LT}, {"<=", JOP_LE}, {">", JOP_GT}, {">=", JOP_GE}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (is_op(p, ops[i].s)) return ops[i].op;
    if (is_name(p, "in")) return JOP_IN;
    if (is_name(p, "not") && tok_is(peek2(p), JT_NAME, "in")) return JOP_NOTIN;
    return 0;
}

static enum moe_status parse_compare(struct parser *p, struct jnode **out)
{
    MOE_TRY(parse_math1(p, out));
    int op = compare_op(p);
    if (!op) return MOE_OK;
    const struct jtok *t = next(p);
    if (op == JOP_NOTIN) next(p);
    enum moe_status st = binary(p, t, op, out, parse_math1);
    if (!st && compare_op(p))
        st = moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: chained comparisons (a < b < c) are not supported",
                      peek(p)->line);
    if (st) {
        jnode_free(*out);
        *out = NULL;
    }
    return st;
}

static enum moe_status parse_not(struct parser *p, struct jnode **out)
{
    if (is_name(p, "not")) {
        const struct jtok *t = next(p);
        struct jnode *n = node_new(JN_UNARY, t);
        if (!n) return nomem();
        n->op = 'n';
        if (++p->depth > MAX_PARSE_DEPTH) {
            p->depth--;
            jnode_free(n);
            return moe_fail(MOE_ERR_FORMAT, "chat template line %d: expression nested too deeply", t->line);
        }
        enum moe_status st = parse_not(p, &n->a);
        p->depth--;
        if (st) {
            jnode_free(n);
            return st;
        }
        *out = n;
        return MOE_OK;
    }
    return parse_compare(p, out);
}

static enum moe_status parse_and(struct parser *p, struct jnode **out)
{
    MOE_TRY(parse_not(p, out));
    while (is_name(p, "and")) {
        const struct jtok *t = next(p);
        enum moe_status st = binary(p, t, JOP_AND, out, parse_not);
        if (st) {
            jnode_free(*out);
            return st;
        }
    }
    return MOE_OK;
}

static enum moe_status parse_or(struct parser *p, struct jnode **out)
{
    MOE_TRY(parse_and(p, out));
    while (is_name(p, "or")) {
        const struct jtok *t = next(p);
        enum moe_status st = binary(p, t, JOP_OR, out, parse_and);
        if (st) {
            jnode_free(*out);
            return st;
        }
    }
    return MOE_OK;
}

static enum moe_status parse_expr(struct parser *p, struct jnode **out)
{
    *out = NULL;
    MOE_TRY(parse_or(p, out));
    while (is_name(p, "if")) {
        const struct jtok *t = next(p);
        struct jnode *n = node_new(JN_COND, t);
        if (!n) {
            jnode_free(*out);
            return nomem();
        }
        n->a = *out;
        *out = n;
        enum moe_status st = parse_or(p, &n->b);
        if (!st && is_name(p, "else")) {
            next(p);
            st = parse_expr(p, &n->c);
        }
        if (st) {
            jnode_free(n);
            *out = NULL;
            return st;
        }
    }
    return MOE_OK;
}

/* expr, or expr, expr, ... as a tuple (for {{ }} and set values). */
static enum moe_status parse_tuple(struct parser *p, struct jnode **out, bool condexpr)
{
    const struct jtok *t = peek(p);
    MOE_TRY(condexpr ? parse_expr(p, out) : parse_or(p, out));
    if (!is_op(p, ",")) return MOE_OK;
    struct jnode *n = node_new(JN_TUPLE, t);
    if (!n) {
        jnode_free(*out);
        return nomem();
    }
    enum moe_status st0 = list_push(&n->args, *out);
    *out = NULL;
    if (st0) {
        jnode_free(n);
        return st0;
    }
    *out = n;
    while (is_op(p, ",")) {
        next(p);
        if (peek(p)->kind == JT_BLOCK_END || peek(p)->kind == JT_VAR_END || is_name(p, "in")) break;
        struct jnode *e = NULL;
        enum moe_status st = condexpr ? parse_expr(p, &e) : parse_or(p, &e);
        if (!st) st = list_push(&n->args, e);
        if (st) {
            jnode_free(n);
            *out = NULL;
            return st;
        }
    }
    return MOE_OK;
}

/* Assignment targets: name, name.attr (set only), or name, name, ... */
static enum moe_status parse_target(struct parser *p, bool allow_attr, struct jnode **out)
{
    struct jnode *tuple = NULL;
    for (;;) {
        const struct jtok *t = next(p);
        if (t->kind != JT_NAME) {
            jnode_free(tuple);
            return syntax_err(t, "a variable name");
        }
        struct jnode *n = node_new(JN_NAME, t);
        if (!n || !(n->str = tok_strdup(t))) {
            jnode_free(n);
            jnode_free(tuple);
            return nomem();
        }
        if (allow_attr && !tuple && is_op(p, ".")) {
            const struct jtok *d = next(p);
            const struct jtok *a = next(p);
            struct jnode *g = a->kind == JT_NAME ? node_new(JN_GETATTR, d) : NULL;
            if (a->kind != JT_NAME) {
                jnode_free(n);
                return syntax_err(a, "an attribute name");
            }
            if (!g || !(g->str = tok_strdup(a))) {
                jnode_free(g);
                jnode_free(n);
                return nomem();
            }
            g->a = n;
            *out = g;
            return MOE_OK;
        }
        if (!tuple && !is_op(p, ",")) {
            *out = n;
            return MOE_OK;
        }
        if (!tuple && !(tuple = node_new(JN_TUPLE, t))) {
            jnode_free(n);
            return nomem();
        }
        enum moe_status st = list_push(&tuple->args, n);
        if (st) {
            jnode_free(tuple);
            return st;
        }
        if (!is_op(p, ",")) break;
        next(p);
    }
    *out = tuple;
    return MOE_OK;
}

static enum moe_status parse_body(struct parser *p, struct jlist *body, const char *const *ends,
                                  const char *what, const struct jtok *opened, const char **ended);

/* After the tag name: "%}" closing the current tag. */
static enum moe_status end_tag(struct parser *p) { return expect_kind(p, JT_BLOCK_END, "end of statement block '%}'"); }

static enum moe_status parse_if(struct parser *p, const struct jtok *t, struct jnode **out)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct jnode *n = node_new(JN_IF, t);
    if (!n) return nomem();
    *out = n;
    const char *ended = NULL;
    MOE_TRY(parse_expr(p, &n->a));
    MOE_TRY(end_tag(p));
    MOE_TRY(parse_body(p, &n->body, ends, "if", t, &ended));
    if (!strcmp(ended, "elif")) {
        struct jnode *e = NULL;
        enum moe_status st = parse_if(p, t, &e);
        if (st) {
            jnode_free(e);
            return st;
        }
        return list_push(&n->orelse, e); /* the nested if consumed endif */
    }
    if (!strcmp(ended, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        MOE_TRY(end_tag(p));
        MOE_TRY(parse_body(p, &n->orelse, ends2, "if", t, &ended));
    }
    return end_tag(p);
}

static enum moe_status parse_statement(struct parser *p, struct jlist *body)
{
    const struct jtok *begin = next(p); /* {% */
    const struct jtok *t = next(p);
    if (t->kind != JT_NAME) return syntax_err(t, "a tag name");
    struct jnode *n = NULL;
    enum moe_status st = MOE_OK;
    const char *ended = NULL;
    (void)begin;
    if (tok_is(t, JT_NAME, "if")) {
        st = parse_if(p, t, &n);
    } else if (tok_is(t, JT_NAME, "for")) {
        static const char *const ends[] = {"else", "endfor", NULL};
        if (!(n = node_new(JN_FOR, t))) return nomem();
        struct jnode *target = NULL;
        if (!(st = parse_target(p, false, &target))) {
            if (target->kind == JN_TUPLE) {
                n->args = target->args;
                memset(&target->args, 0, sizeof target->args);
                jnode_free(target);
            } else {
                st = list_push(&n->args, target);
            }
        }
        if (!st && !is_name(p, "in")) st = syntax_err(peek(p), "'in'");
        if (!st) {
            next(p);
            st = parse_tuple(p, &n->a, false);
        }
        if (!st && is_name(p, "if")) {
            next(p);
            st = parse_expr(p, &n->b);
        }
        if (!st && is_name(p, "recursive"))
            st = moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: recursive for loops are not supported", t->line);
        if (!st) st = end_tag(p);
        if (!st) st = parse_body(p, &n->body, ends, "for", t, &ended);
        if (!st && !strcmp(ended, "else")) {
            static const char *const ends2[] = {"endfor", NULL};
            st = end_tag(p);
            if (!st) st = parse_body(p, &n->orelse, ends2, "for", t, &ended);
        }
        if (!st) st = end_tag(p);
    } else if (tok_is(t, JT_NAME, "set")) {
        if (!(n = node_new(JN_SET, t))) return nomem();
        st = parse_target(p, true, &n->c);
        if (!st && is_op(p, "=")) {
            next(p);
            st = parse_tuple(p, &n->a, true);
            if (!st) st = end_tag(p);
        } else if (!st) {
            static const char *const ends[] = {"endset", NULL};
            if (is_op(p, "|"))
                st = moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: filtered block set is not supported", t->line);
            if (!st && n->c->kind != JN_NAME) st = syntax_err(peek(p), "'='");
            if (!st) st = end_tag(p);
            if (!st) st = parse_body(p, &n->body, ends, "set", t, &ended);
            if (!st) st = end_tag(p);
        }
    } else if (tok_is(t, JT_NAME, "macro")) {
        static const char *const ends[] = {"endmacro", NULL};
        const struct jtok *name = next(p);
        if (name->kind != JT_NAME) return syntax_err(name, "a macro name");
        if (!(n = node_new(JN_MACRO, t)) || !(n->str = tok_strdup(name))) {
            jnode_free(n);
            return nomem();
        }
        st = expect_op(p, "(");
        while (!st && !is_op(p, ")")) {
            if (n->kwargs.n) st = expect_op(p, ",");
            const struct jtok *a = st ? NULL : next(p);
            if (!st && a->kind != JT_NAME) st = syntax_err(a, "a parameter name");
            struct jnode *param = NULL;
            if (!st && (!(param = node_new(JN_KWARG, a)) || !(param->str = tok_strdup(a)))) {
                jnode_free(param);
                st = nomem();
            }
            if (!st && is_op(p, "=")) {
                next(p);
                st = parse_expr(p, &param->a);
            }
            if (!st) st = list_push(&n->kwargs, param);
            else jnode_free(param);
        }
        if (!st) {
            next(p);
            st = end_tag(p);
        }
        if (!st) st = parse_body(p, &n->body, ends, "macro", t, &ended);
        if (!st) st = end_tag(p);
    } else if (tok_is(t, JT_NAME, "break") || tok_is(t, JT_NAME, "continue")) {
        if (!(n = node_new(t->s[0] == 'b' ? JN_BREAK : JN_CONTINUE, t))) return nomem();
        st = end_tag(p);
    } else if (tok_is(t, JT_NAME, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        st = end_tag(p);
        if (!st) st = parse_body(p, body, ends, "generation", t, &ended);
        if (!st) st = end_tag(p);
        return st;
    } else {
        static const char *const unsupported[] = {"extends", "block", "include", "import", "from",
                                                  "call", "filter", "with", "autoescape", "do",
                                                  "trans", "pluralize", "print", NULL};
        for (size_t i = 0; unsupported[i]; i++)
            if (tok_is(t, JT_NAME, unsupported[i]))
                return moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: the '%s' tag is not supported",
                                t->line, unsupported[i]);
        char buf[64];
        return moe_fail(MOE_ERR_FORMAT, "chat template line %d column %d: syntax error: unknown tag %s",
                        t->line, t->col, tok_desc(t, buf, sizeof buf));
    }
    if (st) {
        jnode_free(n);
        return st;
    }
    return list_push(body, n);
}

/* Parses nodes into body until a {% <end> %} tag with end in ends (NULL-
 * terminated; ends NULL: until end of template).  Consumes "{% end" and
 * leaves the rest of the tag for the caller; *ended names the end tag. */
static enum moe_status parse_body(struct parser *p, struct jlist *body, const char *const *ends,
                                  const char *what, const struct jtok *opened, const char **ended)
{
    if (++p->depth > MAX_PARSE_DEPTH) {
        p->depth--;
        return moe_fail(MOE_ERR_FORMAT, "chat template line %d: blocks nested too deeply", opened ? opened->line : 1);
    }
    enum moe_status st = MOE_OK;
    for (;;) {
        const struct jtok *t = peek(p);
        if (t->kind == JT_EOF) {
            if (ends) {
                const char *want = ends[0];
                for (size_t i = 0; ends[i]; i++)
                    if (!strncmp(ends[i], "end", 3)) want = ends[i];
                st = moe_fail(MOE_ERR_FORMAT, "chat template line %d: syntax error: unexpected end of template, "
                              "the '%s' tag opened on line %d is not closed (expected '%s')",
                              t->line, what, opened->line, want);
            }
            break;
        }
        if (t->kind == JT_TEXT) {
            next(p);
            struct jnode *n = node_new(JN_TEXT, t);
            if (!n || !(n->str = malloc(t->len + 1))) {
                jnode_free(n);
                st = nomem();
                break;
            }
            memcpy(n->str, t->s, t->len);
            n->str[t->len] = '\0';
            n->len = t->len;
            if ((st = list_push(body, n))) break;
        } else if (t->kind == JT_VAR_BEGIN) {
            next(p);
            struct jnode *n = node_new(JN_OUTPUT, t);
            if (!n) {
                st = nomem();
                break;
            }
            st = parse_tuple(p, &n->a, true);
            if (!st) st = expect_kind(p, JT_VAR_END, "end of print statement '}}'");
            if (!st) st = list_push(body, n);
            else jnode_free(n);
            if (st) break;
        } else if (t->kind == JT_BLOCK_BEGIN) {
            const struct jtok *name = peek2(p);
            bool is_end = false;
            for (size_t i = 0; ends && ends[i]; i++) {
                if (tok_is(name, JT_NAME, ends[i])) {
                    *ended = ends[i];
                    is_end = true;
                }
            }
            if (is_end) {
                next(p);
                next(p);
                break;
            }
            if (name->kind == JT_NAME && name->len > 3 && !memcmp(name->s, "end", 3)) {
                char buf[64];
                st = moe_fail(MOE_ERR_FORMAT, "chat template line %d column %d: syntax error: unexpected %s%s%s",
                              name->line, name->col, tok_desc(name, buf, sizeof buf),
                              what ? " inside " : "", what ? what : "");
                break;
            }
            if ((st = parse_statement(p, body))) break;
        } else {
            st = syntax_err(t, "template text or a tag");
            break;
        }
    }
    p->depth--;
    return st;
}

enum moe_status jinja_parse(const char *src, struct jtemplate *tpl)
{
    memset(tpl, 0, sizeof *tpl);
    struct parser p = {0};
    MOE_TRY(jinja_lex(src, &p.toks));
    const char *ended = NULL;
    enum moe_status st = parse_body(&p, &tpl->body, NULL, NULL, NULL, &ended);
    jinja_tokens_free(&p.toks);
    if (st) jinja_free(tpl);
    return st;
}

void jinja_free(struct jtemplate *tpl)
{
    list_free(&tpl->body);
}
