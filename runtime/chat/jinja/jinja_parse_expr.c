/* jinja_parse_expr.c - the expression half of the template parser
 * (jinja_parse.c has the statements): token helpers and expressions,
 * following jinja2.parser.Parser.
 *
 * Precedence, lowest first (as Jinja): `x if c else y`; or; and; not;
 * comparisons (==, !=, <, <=, >, >=, in, not in; one per expression, a
 * chain like a < b < c is reported unsupported); + -; ~; * / // %; **;
 * unary - +; then a primary with postfixes (.attr, [key], [a:b:c], (args))
 * and filters/tests (| f(args), is [not] t(args)).  So `a + b | trim` is
 * a + (b | trim) and `x|length - 1` is (x|length) - 1. */
#include <stdlib.h>
#include <string.h>

#include "runtime/chat/jinja/jinja_parse_impl.h"

const struct jtok *jp_peek(struct jparser *p) { return &p->toks.v[p->i]; }
const struct jtok *jp_peek2(struct jparser *p)
{
    return p->i + 1 < p->toks.n ? &p->toks.v[p->i + 1] : &p->toks.v[p->toks.n - 1];
}
const struct jtok *jp_next(struct jparser *p)
{
    const struct jtok *t = &p->toks.v[p->i];
    if (t->kind != JT_EOF) p->i++;
    return t;
}

bool jp_tok_is(const struct jtok *t, enum jtok_kind k, const char *s)
{
    return t->kind == k && strlen(s) == t->len && memcmp(t->s, s, t->len) == 0;
}
bool jp_is_op(struct jparser *p, const char *s) { return jp_tok_is(jp_peek(p), JT_OP, s); }
bool jp_is_name(struct jparser *p, const char *s) { return jp_tok_is(jp_peek(p), JT_NAME, s); }

const char *jp_tok_desc(const struct jtok *t, char *buf, size_t n)
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

enum moe_status jp_syntax_err(const struct jtok *t, const char *expected)
{
    char buf[64];
    return moe_fail(MOE_ERR_FORMAT, "chat template line %d column %d: syntax error: expected %s, got %s",
                    t->line, t->col, expected, jp_tok_desc(t, buf, sizeof buf));
}

enum moe_status jp_nomem(void) { return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory"); }

enum moe_status jp_expect_op(struct jparser *p, const char *s)
{
    if (!jp_is_op(p, s)) {
        char want[16];
        snprintf(want, sizeof want, "'%s'", s);
        return jp_syntax_err(jp_peek(p), want);
    }
    jp_next(p);
    return MOE_OK;
}

enum moe_status jp_expect_kind(struct jparser *p, enum jtok_kind k, const char *what)
{
    if (jp_peek(p)->kind != k) return jp_syntax_err(jp_peek(p), what);
    jp_next(p);
    return MOE_OK;
}

struct jnode *jp_node_new(enum jn_kind kind, const struct jtok *t)
{
    struct jnode *n = calloc(1, sizeof *n);
    if (n) {
        n->kind = kind;
        n->line = t->line;
        n->col = t->col;
    }
    return n;
}

char *jp_tok_strdup(const struct jtok *t)
{
    char *s = malloc(t->len + 1);
    if (s) {
        memcpy(s, t->s, t->len);
        s[t->len] = '\0';
    }
    return s;
}

enum moe_status jp_list_push(struct jlist *l, struct jnode *n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct jnode **v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            jnode_free(n);
            return jp_nomem();
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
    return MOE_OK;
}

void jp_list_free(struct jlist *l)
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
    jp_list_free(&n->args);
    jp_list_free(&n->kwargs);
    jp_list_free(&n->body);
    jp_list_free(&n->orelse);
    free(n);
}

static enum moe_status parse_or(struct jparser *p, struct jnode **out);
static enum moe_status parse_unary(struct jparser *p, bool with_filter, struct jnode **out);

/* Builds a binary node from left and the operand parsed by sub.  On failure
 * both are freed and *left is set to NULL: every parse function leaves its
 * out-parameter NULL when it fails, because the caller may already have
 * linked it into a parent node that it frees in turn (a freed but still
 * linked left operand was a double free, found by fuzzing). */
static enum moe_status binary(struct jparser *p, const struct jtok *t, int op, struct jnode **left,
                              enum moe_status (*sub)(struct jparser *, struct jnode **))
{
    struct jnode *right = NULL;
    enum moe_status st = sub(p, &right);
    if (st) {
        jnode_free(*left);
        *left = NULL;
        return st;
    }
    struct jnode *n = jp_node_new(JN_BINARY, t);
    if (!n) {
        jnode_free(right);
        jnode_free(*left);
        *left = NULL;
        return jp_nomem();
    }
    n->op = op;
    n->a = *left;
    n->b = right;
    *left = n;
    return MOE_OK;
}

/* Call arguments after '(' up to and including ')': positional into args,
 * name=value into kwargs as JN_KWARG. */
static enum moe_status parse_call_args(struct jparser *p, struct jnode *n)
{
    MOE_TRY(jp_expect_op(p, "("));
    while (!jp_is_op(p, ")")) {
        if (n->args.n + n->kwargs.n > 0) MOE_TRY(jp_expect_op(p, ","));
        if (jp_is_op(p, ")")) break; /* trailing comma */
        if (jp_is_op(p, "*") || jp_is_op(p, "**"))
            return moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: *args and **kwargs in calls are not supported",
                            jp_peek(p)->line);
        if (jp_peek(p)->kind == JT_NAME && jp_tok_is(jp_peek2(p), JT_OP, "=")) {
            const struct jtok *t = jp_next(p);
            jp_next(p);
            struct jnode *kw = jp_node_new(JN_KWARG, t);
            if (!kw || !(kw->str = jp_tok_strdup(t))) {
                jnode_free(kw);
                return jp_nomem();
            }
            enum moe_status st = jp_parse_expr(p, &kw->a);
            if (st) {
                jnode_free(kw);
                return st;
            }
            MOE_TRY(jp_list_push(&n->kwargs, kw));
        } else {
            if (n->kwargs.n)
                return jp_syntax_err(jp_peek(p), "a keyword argument (positional after keyword)");
            struct jnode *a = NULL;
            MOE_TRY(jp_parse_expr(p, &a));
            MOE_TRY(jp_list_push(&n->args, a));
        }
    }
    jp_next(p);
    return MOE_OK;
}

static enum moe_status parse_const(const struct jtok *t, json_t *v, struct jnode **out)
{
    if (!v) return jp_nomem();
    struct jnode *n = jp_node_new(JN_CONST, t);
    if (!n) {
        json_decref(v);
        return jp_nomem();
    }
    n->cval = v;
    *out = n;
    return MOE_OK;
}

/* Items of a list/tuple/dict literal up to the closing delimiter. */
static enum moe_status parse_items(struct jparser *p, struct jnode *n, const char *close, bool dict)
{
    while (!jp_is_op(p, close)) {
        if (n->args.n) MOE_TRY(jp_expect_op(p, ","));
        if (jp_is_op(p, close)) break;
        struct jnode *e = NULL;
        MOE_TRY(jp_parse_expr(p, &e));
        MOE_TRY(jp_list_push(&n->args, e));
        if (dict) {
            MOE_TRY(jp_expect_op(p, ":"));
            MOE_TRY(jp_parse_expr(p, &e));
            MOE_TRY(jp_list_push(&n->args, e));
        }
    }
    jp_next(p);
    return MOE_OK;
}

static enum moe_status parse_primary(struct jparser *p, struct jnode **out)
{
    const struct jtok *t = jp_peek(p);
    if (t->kind == JT_NAME) {
        jp_next(p);
        if (jp_tok_is(t, JT_NAME, "true") || jp_tok_is(t, JT_NAME, "True")) return parse_const(t, json_true(), out);
        if (jp_tok_is(t, JT_NAME, "false") || jp_tok_is(t, JT_NAME, "False")) return parse_const(t, json_false(), out);
        if (jp_tok_is(t, JT_NAME, "none") || jp_tok_is(t, JT_NAME, "None")) return parse_const(t, json_null(), out);
        struct jnode *n = jp_node_new(JN_NAME, t);
        if (!n || !(n->str = jp_tok_strdup(t))) {
            jnode_free(n);
            return jp_nomem();
        }
        *out = n;
        return MOE_OK;
    }
    if (t->kind == JT_STRING) {
        /* Adjacent literals concatenate: 'a' "b" == 'ab'. */
        struct jbuf b = {0};
        while (jp_peek(p)->kind == JT_STRING) {
            const struct jtok *s = jp_next(p);
            if (jbuf_add(&b, s->str, s->len)) {
                jbuf_free(&b);
                return jp_nomem();
            }
        }
        json_t *v = json_stringn_nocheck(b.p ? b.p : "", b.n);
        jbuf_free(&b);
        return parse_const(t, v, out);
    }
    if (t->kind == JT_INT) {
        jp_next(p);
        return parse_const(t, json_integer(t->ival), out);
    }
    if (t->kind == JT_FLOAT) {
        jp_next(p);
        return parse_const(t, json_real(t->fval), out);
    }
    if (jp_tok_is(t, JT_OP, "(")) {
        jp_next(p);
        if (jp_is_op(p, ")")) { /* empty tuple */
            jp_next(p);
            struct jnode *n = jp_node_new(JN_TUPLE, t);
            if (!n) return jp_nomem();
            *out = n;
            return MOE_OK;
        }
        struct jnode *e = NULL;
        MOE_TRY(jp_parse_expr(p, &e));
        if (jp_is_op(p, ",")) {
            struct jnode *n = jp_node_new(JN_TUPLE, t);
            if (!n) {
                jnode_free(e);
                return jp_nomem();
            }
            enum moe_status st = jp_list_push(&n->args, e);
            if (!st) st = parse_items(p, n, ")", false); /* consumes the ',' */
            if (st) {
                jnode_free(n);
                return st;
            }
            *out = n;
            return MOE_OK;
        }
        enum moe_status st = jp_expect_op(p, ")");
        if (st) {
            jnode_free(e);
            return st;
        }
        *out = e;
        return MOE_OK;
    }
    if (jp_tok_is(t, JT_OP, "[") || jp_tok_is(t, JT_OP, "{")) {
        bool dict = t->s[0] == '{';
        jp_next(p);
        struct jnode *n = jp_node_new(dict ? JN_DICT : JN_LIST, t);
        if (!n) return jp_nomem();
        enum moe_status st = parse_items(p, n, dict ? "}" : "]", dict);
        if (st) {
            jnode_free(n);
            return st;
        }
        *out = n;
        return MOE_OK;
    }
    return jp_syntax_err(t, "an expression");
}

/* obj[...]: an index or a slice. */
static enum moe_status parse_subscript(struct jparser *p, const struct jtok *t, struct jnode **obj)
{
    struct jnode *parts[3] = {NULL, NULL, NULL};
    int nparts = 1;
    enum moe_status st = MOE_OK;
    if (!jp_is_op(p, ":")) st = jp_parse_expr(p, &parts[0]);
    while (!st && jp_is_op(p, ":") && nparts < 3) {
        jp_next(p);
        if (!jp_is_op(p, ":") && !jp_is_op(p, "]")) st = jp_parse_expr(p, &parts[nparts]);
        nparts++;
    }
    if (!st) st = jp_expect_op(p, "]");
    struct jnode *n = NULL;
    if (!st && !(n = jp_node_new(nparts == 1 ? JN_GETITEM : JN_SLICE, t))) st = jp_nomem();
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
                return jp_nomem();
            }
            n->args.v = v;
            n->args.cap = 3;
        }
        n->args.v[n->args.n++] = parts[i]; /* may be NULL */
    }
    return MOE_OK;
}

static enum moe_status parse_postfix(struct jparser *p, struct jnode **e, bool filters)
{
    for (;;) {
        const struct jtok *t = jp_peek(p);
        struct jnode *n = NULL;
        if (jp_tok_is(t, JT_OP, ".")) {
            jp_next(p);
            const struct jtok *a = jp_next(p);
            if (a->kind == JT_INT) {
                n = jp_node_new(JN_GETITEM, t);
                if (!n) return jp_nomem();
                n->a = *e;
                *e = n;
                MOE_TRY(parse_const(a, json_integer(a->ival), &n->b));
                continue;
            }
            if (a->kind != JT_NAME) return jp_syntax_err(a, "an attribute name");
            if (!(n = jp_node_new(JN_GETATTR, t)) || !(n->str = jp_tok_strdup(a))) {
                jnode_free(n);
                return jp_nomem();
            }
            n->a = *e;
            *e = n;
        } else if (jp_tok_is(t, JT_OP, "[")) {
            jp_next(p);
            MOE_TRY(parse_subscript(p, t, e));
        } else if (jp_tok_is(t, JT_OP, "(")) {
            if (!(n = jp_node_new(JN_CALL, t))) return jp_nomem();
            n->a = *e;
            *e = n;
            MOE_TRY(parse_call_args(p, n));
        } else if (filters && jp_tok_is(t, JT_OP, "|")) {
            jp_next(p);
            const struct jtok *f = jp_next(p);
            if (f->kind != JT_NAME) return jp_syntax_err(f, "a filter name");
            if (!(n = jp_node_new(JN_FILTER, f)) || !(n->str = jp_tok_strdup(f))) {
                jnode_free(n);
                return jp_nomem();
            }
            n->a = *e;
            *e = n;
            if (jp_is_op(p, "(")) MOE_TRY(parse_call_args(p, n));
        } else if (filters && jp_tok_is(t, JT_NAME, "is")) {
            jp_next(p);
            bool negated = false;
            if (jp_is_name(p, "not")) {
                jp_next(p);
                negated = true;
            }
            const struct jtok *f = jp_next(p);
            if (f->kind != JT_NAME) return jp_syntax_err(f, "a test name");
            if (!(n = jp_node_new(JN_TEST, f)) || !(n->str = jp_tok_strdup(f))) {
                jnode_free(n);
                return jp_nomem();
            }
            n->op = negated;
            n->a = *e;
            *e = n;
            const struct jtok *q = jp_peek(p);
            if (jp_is_op(p, "(")) {
                MOE_TRY(parse_call_args(p, n));
            } else if ((q->kind == JT_NAME || q->kind == JT_STRING || q->kind == JT_INT ||
                        q->kind == JT_FLOAT || jp_tok_is(q, JT_OP, "[") || jp_tok_is(q, JT_OP, "{")) &&
                       !jp_tok_is(q, JT_NAME, "else") && !jp_tok_is(q, JT_NAME, "or") &&
                       !jp_tok_is(q, JT_NAME, "and")) {
                struct jnode *arg = NULL;
                MOE_TRY(parse_primary(p, &arg));
                MOE_TRY(jp_list_push(&n->args, arg));
                MOE_TRY(parse_postfix(p, &n->args.v[n->args.n - 1], false));
            }
        } else {
            return MOE_OK;
        }
    }
}

static enum moe_status parse_unary(struct jparser *p, bool with_filter, struct jnode **out)
{
    const struct jtok *t = jp_peek(p);
    if (++p->depth > MAX_PARSE_DEPTH) {
        p->depth--;
        return moe_fail(MOE_ERR_FORMAT, "chat template line %d: expression nested too deeply", t->line);
    }
    enum moe_status st;
    struct jnode *e = NULL;
    if (jp_tok_is(t, JT_OP, "-") || jp_tok_is(t, JT_OP, "+")) {
        jp_next(p);
        struct jnode *n = jp_node_new(JN_UNARY, t);
        if (!n) {
            st = jp_nomem();
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

static enum moe_status parse_unary_f(struct jparser *p, struct jnode **out) { return parse_unary(p, true, out); }

static enum moe_status parse_pow(struct jparser *p, struct jnode **out)
{
    MOE_TRY(parse_unary(p, true, out));
    while (jp_is_op(p, "**")) {
        const struct jtok *t = jp_next(p);
        enum moe_status st = binary(p, t, JOP_POW, out, parse_unary_f);
        if (st) return st;
    }
    return MOE_OK;
}

static enum moe_status parse_math2(struct jparser *p, struct jnode **out)
{
    MOE_TRY(parse_pow(p, out));
    for (;;) {
        int op = jp_is_op(p, "*") ? JOP_MUL : jp_is_op(p, "/") ? JOP_DIV : jp_is_op(p, "//") ? JOP_FLOORDIV
               : jp_is_op(p, "%") ? JOP_MOD : 0;
        if (!op) return MOE_OK;
        const struct jtok *t = jp_next(p);
        enum moe_status st = binary(p, t, op, out, parse_pow);
        if (st) return st;
    }
}

static enum moe_status parse_concat(struct jparser *p, struct jnode **out)
{
    MOE_TRY(parse_math2(p, out));
    while (jp_is_op(p, "~")) {
        const struct jtok *t = jp_next(p);
        enum moe_status st = binary(p, t, JOP_CONCAT, out, parse_math2);
        if (st) return st;
    }
    return MOE_OK;
}

static enum moe_status parse_math1(struct jparser *p, struct jnode **out)
{
    MOE_TRY(parse_concat(p, out));
    for (;;) {
        int op = jp_is_op(p, "+") ? JOP_ADD : jp_is_op(p, "-") ? JOP_SUB : 0;
        if (!op) return MOE_OK;
        const struct jtok *t = jp_next(p);
        enum moe_status st = binary(p, t, op, out, parse_concat);
        if (st) return st;
    }
}

static int compare_op(struct jparser *p)
{
    static const struct { const char *s; int op; } ops[] = {
        {"==", JOP_EQ}, {"!=", JOP_NE}, {"<", JOP_LT}, {"<=", JOP_LE}, {">", JOP_GT}, {">=", JOP_GE}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (jp_is_op(p, ops[i].s)) return ops[i].op;
    if (jp_is_name(p, "in")) return JOP_IN;
    if (jp_is_name(p, "not") && jp_tok_is(jp_peek2(p), JT_NAME, "in")) return JOP_NOTIN;
    return 0;
}

static enum moe_status parse_compare(struct jparser *p, struct jnode **out)
{
    MOE_TRY(parse_math1(p, out));
    int op = compare_op(p);
    if (!op) return MOE_OK;
    const struct jtok *t = jp_next(p);
    if (op == JOP_NOTIN) jp_next(p);
    enum moe_status st = binary(p, t, op, out, parse_math1);
    if (!st && compare_op(p))
        st = moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: chained comparisons (a < b < c) are not supported",
                      jp_peek(p)->line);
    if (st) {
        jnode_free(*out);
        *out = NULL;
    }
    return st;
}

static enum moe_status parse_not(struct jparser *p, struct jnode **out)
{
    if (jp_is_name(p, "not")) {
        const struct jtok *t = jp_next(p);
        struct jnode *n = jp_node_new(JN_UNARY, t);
        if (!n) return jp_nomem();
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

static enum moe_status parse_and(struct jparser *p, struct jnode **out)
{
    MOE_TRY(parse_not(p, out));
    while (jp_is_name(p, "and")) {
        const struct jtok *t = jp_next(p);
        enum moe_status st = binary(p, t, JOP_AND, out, parse_not);
        if (st) return st;
    }
    return MOE_OK;
}

static enum moe_status parse_or(struct jparser *p, struct jnode **out)
{
    MOE_TRY(parse_and(p, out));
    while (jp_is_name(p, "or")) {
        const struct jtok *t = jp_next(p);
        enum moe_status st = binary(p, t, JOP_OR, out, parse_and);
        if (st) return st;
    }
    return MOE_OK;
}

enum moe_status jp_parse_expr(struct jparser *p, struct jnode **out)
{
    *out = NULL;
    MOE_TRY(parse_or(p, out));
    while (jp_is_name(p, "if")) {
        const struct jtok *t = jp_next(p);
        struct jnode *n = jp_node_new(JN_COND, t);
        if (!n) {
            jnode_free(*out);
            *out = NULL;
            return jp_nomem();
        }
        n->a = *out;
        *out = n;
        enum moe_status st = parse_or(p, &n->b);
        if (!st && jp_is_name(p, "else")) {
            jp_next(p);
            st = jp_parse_expr(p, &n->c);
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
enum moe_status jp_parse_tuple(struct jparser *p, struct jnode **out, bool condexpr)
{
    const struct jtok *t = jp_peek(p);
    MOE_TRY(condexpr ? jp_parse_expr(p, out) : parse_or(p, out));
    if (!jp_is_op(p, ",")) return MOE_OK;
    struct jnode *n = jp_node_new(JN_TUPLE, t);
    if (!n) {
        jnode_free(*out);
        *out = NULL;
        return jp_nomem();
    }
    enum moe_status st0 = jp_list_push(&n->args, *out);
    *out = NULL;
    if (st0) {
        jnode_free(n);
        return st0;
    }
    *out = n;
    while (jp_is_op(p, ",")) {
        jp_next(p);
        if (jp_peek(p)->kind == JT_BLOCK_END || jp_peek(p)->kind == JT_VAR_END || jp_is_name(p, "in")) break;
        struct jnode *e = NULL;
        enum moe_status st = condexpr ? jp_parse_expr(p, &e) : parse_or(p, &e);
        if (!st) st = jp_list_push(&n->args, e);
        if (st) {
            jnode_free(n);
            *out = NULL;
            return st;
        }
    }
    return MOE_OK;
}
