/* jinja_eval.c - walks the AST: statements write to the output buffer,
 * expressions produce values (see jinja.h for the value semantics).
 *
 * Scoping follows Jinja: each for-loop iteration gets a fresh scope whose
 * parent is the scope around the loop, so `set` inside a loop is not seen by
 * the next iteration nor after the loop (hence namespace()); if-blocks do not
 * open a scope; a macro call runs in a scope whose parent is the template's
 * top level.  Runaway templates stop at jinja_limits: output bytes, macro
 * call depth, and a budget of loop iterations plus macro calls. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/chat/jinja/jinja.h"

struct jvar {
    const char *name; /* borrowed: from the AST or the caller's vars */
    struct jv v;
};

struct jscope {
    struct jscope *parent;
    struct jvar *v;
    size_t n, cap;
};

enum moe_status jinja_err(enum moe_status s, const struct jnode *at, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) return moe_fail(s, "chat template line %d: %s", at->line, msg);
    return moe_fail(s, "chat template: %s", msg);
}

enum moe_status jinja_undef_err(const struct jnode *at, struct jv v)
{
    if (v.k == JV_UNDEF && json_is_string(v.j)) return jinja_err(MOE_ERR_FORMAT, at, "%s", json_string_value(v.j));
    return jinja_err(MOE_ERR_FORMAT, at, "a value is undefined");
}

static void scope_free(struct jscope *s)
{
    for (size_t i = 0; i < s->n; i++) jv_free(&s->v[i].v);
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* Binds name in s, taking ownership of v. */
static enum moe_status scope_set(struct jscope *s, const char *name, struct jv v)
{
    for (size_t i = 0; i < s->n; i++) {
        if (!strcmp(s->v[i].name, name)) {
            jv_free(&s->v[i].v);
            s->v[i].v = v;
            return MOE_OK;
        }
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        struct jvar *nv = realloc(s->v, cap * sizeof *nv);
        if (!nv) {
            jv_free(&v);
            return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory");
        }
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = (struct jvar){.name = name, .v = v};
    return MOE_OK;
}

static struct jv *scope_get(struct jscope *s, const char *name)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->v[i].name, name)) return &s->v[i].v;
    return NULL;
}

static struct jv undef_named(const char *name)
{
    char msg[160];
    snprintf(msg, sizeof msg, "'%.100s' is undefined", name);
    return jv_wrap(JV_UNDEF, json_string(msg)); /* NULL hint on OOM is fine */
}

static enum moe_status nomem(void) { return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory"); }

static enum moe_status exec_body(struct jctx *cx, const struct jlist *body);

/* ---- arithmetic and comparison ---- */

static bool is_numeric(struct jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static double as_double(struct jv v) { return v.k == JV_FLOAT ? v.f : v.k == JV_BOOL ? (double)v.b : (double)v.i; }
static int64_t as_int(struct jv v) { return v.k == JV_BOOL ? (int64_t)v.b : v.i; }

static const char *op_name(int op)
{
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**", "~", "and", "or",
                                        "==", "!=", "<", "<=", ">", ">=", "in", "not in"};
    return op > 0 && op <= JOP_NOTIN ? names[op] : "?";
}

static enum moe_status type_err(const struct jnode *at, int op, struct jv a, struct jv b)
{
    if (op == JOP_ADD && a.k == JV_STR)
        return jinja_err(MOE_ERR_FORMAT, at, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
    if (op == JOP_ADD && a.k == JV_LIST)
        return jinja_err(MOE_ERR_FORMAT, at, "can only concatenate list (not \"%s\") to list", jv_type_name(b));
    if (op >= JOP_LT && op <= JOP_GE)
        return jinja_err(MOE_ERR_FORMAT, at, "'%s' not supported between instances of '%s' and '%s'", op_name(op),
                         jv_type_name(a), jv_type_name(b));
    return jinja_err(MOE_ERR_FORMAT, at, "unsupported operand type(s) for %s: '%s' and '%s'", op_name(op),
                     jv_type_name(a), jv_type_name(b));
}

static enum moe_status concat_str(struct jctx *cx, const struct jnode *at, const char *a, size_t na,
                                  const char *b, size_t nb, size_t times, struct jv *out)
{
    size_t one, total;
    if (!moe_add_size(na, nb, &one) || !moe_mul_size(one, times, &total) ||
        (cx->lim.max_output && total > cx->lim.max_output))
        return jinja_err(MOE_ERR_FORMAT, at, "string exceeds the output limit of %zu bytes", cx->lim.max_output);
    char *p = malloc(total + 1);
    if (!p) return nomem();
    for (size_t t = 0; t < times; t++) {
        if (na) memcpy(p + t * one, a, na);
        if (nb) memcpy(p + t * one + na, b, nb);
    }
    *out = jv_str(p, total);
    free(p);
    return jv_oom(*out) ? nomem() : MOE_OK;
}

static enum moe_status arith(struct jctx *cx, const struct jnode *at, int op, struct jv a, struct jv b,
                             struct jv *out)
{
    if (op == JOP_MOD && a.k == JV_STR)
        return jinja_err(MOE_ERR_UNSUPPORTED, at, "printf-style string formatting ('%%' on a string) is not supported");
    if (a.k == JV_UNDEF) return jinja_undef_err(at, a);
    if (b.k == JV_UNDEF) return jinja_undef_err(at, b);
    if (is_numeric(a) && is_numeric(b)) {
        bool fl = a.k == JV_FLOAT || b.k == JV_FLOAT;
        int64_t x = as_int(a), y = as_int(b), r;
        double fx = as_double(a), fy = as_double(b);
        switch (op) {
        case JOP_ADD:
            if (fl) { *out = jv_float(fx + fy); return MOE_OK; }
            if (__builtin_add_overflow(x, y, &r)) break;
            *out = jv_int(r);
            return MOE_OK;
        case JOP_SUB:
            if (fl) { *out = jv_float(fx - fy); return MOE_OK; }
            if (__builtin_sub_overflow(x, y, &r)) break;
            *out = jv_int(r);
            return MOE_OK;
        case JOP_MUL:
            if (fl) { *out = jv_float(fx * fy); return MOE_OK; }
            if (__builtin_mul_overflow(x, y, &r)) break;
            *out = jv_int(r);
            return MOE_OK;
        case JOP_DIV:
            if (fy == 0) return jinja_err(MOE_ERR_FORMAT, at, "division by zero");
            *out = jv_float(fx / fy);
            return MOE_OK;
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (fl ? fy == 0 : y == 0)
                return jinja_err(MOE_ERR_FORMAT, at, "integer division or modulo by zero");
            if (fl) {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                *out = jv_float(op == JOP_MOD ? m : floor((fx - m) / fy + 0.5));
                return MOE_OK;
            }
            if (x == INT64_MIN && y == -1) break;
            {
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = jv_int(op == JOP_MOD ? m : q);
            }
            return MOE_OK;
        case JOP_POW:
            if (fl || y < 0) { /* float.__pow__ raises where C's pow gives inf, or nan (a complex) */
                double p = pow(fx, fy);
                const char *e = fx == 0.0 && fy < 0                          ? "0.0 cannot be raised to a negative power"
                                : isinf(p) && isfinite(fx) && isfinite(fy) ? "(34, 'Numerical result out of range')"
                                : isnan(p) && !isnan(fx) && !isnan(fy)     ? "a complex result of ** is not supported"
                                                                           : NULL;
                if (e) return jinja_err(e[0] == 'a' ? MOE_ERR_UNSUPPORTED : MOE_ERR_FORMAT, at, "%s", e);
                *out = jv_float(p);
                return MOE_OK;
            }
            r = 1;
            for (int64_t i = 0; i < y; i++)
                if (__builtin_mul_overflow(r, x, &r)) return jinja_err(MOE_ERR_UNSUPPORTED, at, "integer result of ** is too large");
            *out = jv_int(r);
            return MOE_OK;
        }
        return jinja_err(MOE_ERR_UNSUPPORTED, at, "integer result of %s is too large", op_name(op));
    }
    if (op == JOP_ADD && a.k == JV_STR && b.k == JV_STR && (a.b || b.b)) {
        /* Markup + str escapes the str (markupsafe), either side. */
        struct jv ea = jv_undef(), eb = jv_undef();
        enum moe_status st = a.b ? MOE_OK : jinja_html_escape(a, &ea);
        if (!st && !b.b) st = jinja_html_escape(b, &eb);
        struct jv x = a.b ? a : ea, y = b.b ? b : eb;
        if (!st) st = concat_str(cx, at, jv_sdata(x), jv_slen(x), jv_sdata(y), jv_slen(y), 1, out);
        if (!st) out->b = true;
        jv_free(&ea);
        jv_free(&eb);
        return st;
    }
    if (op == JOP_ADD && a.k == JV_STR && b.k == JV_STR)
        return concat_str(cx, at, jv_sdata(a), jv_slen(a), jv_sdata(b), jv_slen(b), 1, out);
    if (op == JOP_ADD && a.k == JV_LIST && b.k == JV_LIST) {
        json_t *r = json_copy(a.j);
        if (!r || json_array_extend(r, b.j)) {
            json_decref(r);
            return nomem();
        }
        *out = jv_wrap(JV_LIST, r);
        return MOE_OK;
    }
    if (op == JOP_MUL && ((a.k == JV_STR && (b.k == JV_INT || b.k == JV_BOOL)) ||
                          (b.k == JV_STR && (a.k == JV_INT || a.k == JV_BOOL)))) {
        struct jv s = a.k == JV_STR ? a : b;
        int64_t n = a.k == JV_STR ? as_int(b) : as_int(a);
        enum moe_status st = concat_str(cx, at, jv_sdata(s), jv_slen(s), "", 0, n > 0 ? (size_t)n : 0, out);
        if (!st) out->b = s.b;
        return st;
    }
    if (op == JOP_MUL && ((a.k == JV_LIST && (b.k == JV_INT || b.k == JV_BOOL)) ||
                          (b.k == JV_LIST && (a.k == JV_INT || a.k == JV_BOOL)))) {
        struct jv l = a.k == JV_LIST ? a : b;
        int64_t n = a.k == JV_LIST ? as_int(b) : as_int(a);
        json_t *r = json_array();
        if (!r) return nomem();
        size_t total;
        if (n > 0 && (!moe_mul_size(json_array_size(l.j), (size_t)n, &total) || total > 1000000)) {
            json_decref(r);
            return jinja_err(MOE_ERR_FORMAT, at, "list repetition of more than 1000000 items");
        }
        for (int64_t t = 0; t < n; t++) {
            if (json_array_extend(r, l.j)) {
                json_decref(r);
                return nomem();
            }
        }
        *out = jv_wrap(JV_LIST, r);
        return MOE_OK;
    }
    return type_err(at, op, a, b);
}

static enum moe_status compare(const struct jnode *at, int op, struct jv a, struct jv b, bool *res)
{
    if (op == JOP_EQ || op == JOP_NE) {
        *res = jv_equal(a, b) == (op == JOP_EQ);
        return MOE_OK;
    }
    if (a.k == JV_UNDEF) return jinja_undef_err(at, a);
    if (b.k == JV_UNDEF) return jinja_undef_err(at, b);
    int c;
    if (is_numeric(a) && is_numeric(b)) {
        double x = as_double(a), y = as_double(b);
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) c = as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
        else c = x < y ? -1 : x > y;
    } else if (a.k == JV_STR && b.k == JV_STR) {
        size_t na = jv_slen(a), nb = jv_slen(b);
        int m = memcmp(jv_sdata(a), jv_sdata(b), na < nb ? na : nb);
        c = m ? m : na < nb ? -1 : na > nb;
    } else {
        return type_err(at, op, a, b);
    }
    *res = op == JOP_LT ? c < 0 : op == JOP_LE ? c <= 0 : op == JOP_GT ? c > 0 : c >= 0;
    return MOE_OK;
}

static enum moe_status contains(const struct jnode *at, struct jv item, struct jv box, bool *res)
{
    *res = false;
    switch (box.k) {
    case JV_UNDEF: return MOE_OK;
    case JV_STR:
        if (item.k == JV_UNDEF) return jinja_undef_err(at, item);
        if (item.k != JV_STR)
            return jinja_err(MOE_ERR_FORMAT, at, "'in <string>' requires string as left operand, not %s",
                             jv_type_name(item));
        *res = memmem(jv_sdata(box), jv_slen(box), jv_sdata(item), jv_slen(item)) != NULL || jv_slen(item) == 0;
        return MOE_OK;
    case JV_LIST: case JV_GEN:
        MOE_TRY(jinja_gen_check(box));
        for (size_t i = 0; i < json_array_size(box.j); i++) {
            struct jv e = jv_from_json(json_array_get(box.j, i));
            *res = jv_equal(item, e);
            jv_free(&e);
            if (*res) break;
        }
        return MOE_OK;
    case JV_DICT: case JV_LOOP:
        if (item.k == JV_LIST || item.k == JV_DICT)
            return jinja_err(MOE_ERR_FORMAT, at, "unhashable type: '%s'", jv_type_name(item));
        *res = item.k == JV_STR && json_object_getn(box.j, jv_sdata(item), jv_slen(item)) != NULL;
        return MOE_OK;
    default:
        return jinja_err(MOE_ERR_FORMAT, at, "argument of type '%s' is not iterable", jv_type_name(box));
    }
}

/* ---- expressions ---- */

static enum moe_status eval_binary(struct jctx *cx, const struct jnode *n, struct jv *out)
{
    struct jv a = jv_undef(), b = jv_undef();
    MOE_TRY(jinja_eval(cx, n->a, &a));
    if (n->op == JOP_AND || n->op == JOP_OR) {
        if (jv_truthy(a) == (n->op == JOP_OR)) {
            *out = a;
            return MOE_OK;
        }
        jv_free(&a);
        return jinja_eval(cx, n->b, out);
    }
    enum moe_status st = jinja_eval(cx, n->b, &b);
    bool r = false;
    if (!st) {
        switch (n->op) {
        case JOP_CONCAT: {
            struct jbuf buf = {0};
            st = jv_str_append(&buf, a);
            if (!st) st = jv_str_append(&buf, b);
            if (!st && cx->lim.max_output && buf.n > cx->lim.max_output)
                st = jinja_err(MOE_ERR_FORMAT, n, "string exceeds the output limit of %zu bytes", cx->lim.max_output);
            if (!st) {
                *out = jv_str(buf.p, buf.n);
                if (jv_oom(*out)) st = nomem();
            }
            jbuf_free(&buf);
            break;
        }
        case JOP_EQ: case JOP_NE: case JOP_LT: case JOP_LE: case JOP_GT: case JOP_GE:
            st = compare(n, n->op, a, b, &r);
            if (!st) *out = jv_bool(r);
            break;
        case JOP_IN: case JOP_NOTIN:
            st = contains(n, a, b, &r);
            if (!st) *out = jv_bool(r == (n->op == JOP_IN));
            break;
        default:
            st = arith(cx, n, n->op, a, b, out);
        }
    }
    jv_free(&a);
    jv_free(&b);
    return st;
}

static enum moe_status eval_slice(struct jctx *cx, const struct jnode *n, struct jv *out)
{
    struct jv obj = jv_undef(), parts[3] = {jv_undef(), jv_undef(), jv_undef()};
    enum moe_status st = jinja_eval(cx, n->a, &obj);
    for (int i = 0; i < 3 && !st; i++) {
        if (!n->args.v[i]) continue;
        st = jinja_eval(cx, n->args.v[i], &parts[i]);
        if (!st && parts[i].k != JV_INT && parts[i].k != JV_NONE && parts[i].k != JV_BOOL)
            st = jinja_err(MOE_ERR_FORMAT, n, "slice indices must be integers or None");
    }
    if (!st && obj.k != JV_LIST && obj.k != JV_STR)
        st = obj.k == JV_UNDEF ? jinja_undef_err(n, obj)
                               : jinja_err(MOE_ERR_FORMAT, n, "'%s' object is not subscriptable with a slice", jv_type_name(obj));
    if (st) goto done;
    {
        int64_t len = obj.k == JV_LIST ? (int64_t)json_array_size(obj.j) : (int64_t)ju_cp_count(jv_sdata(obj), jv_slen(obj));
        int64_t step = parts[2].k == JV_INT || parts[2].k == JV_BOOL ? as_int(parts[2]) : 1;
        if (step == 0) {
            st = jinja_err(MOE_ERR_FORMAT, n, "slice step cannot be zero");
            goto done;
        }
        /* Python's PySlice_AdjustIndices. */
        int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? len - 1 : len;
        int64_t start = step < 0 ? hi : lo, stop = step < 0 ? lo : hi;
        for (int k = 0; k < 2; k++) {
            if (parts[k].k != JV_INT && parts[k].k != JV_BOOL) continue;
            int64_t v = as_int(parts[k]);
            if (v < 0) {
                v += len;
                if (v < lo) v = lo;
            } else if (v > hi) {
                v = hi;
            }
            if (k == 0) start = v;
            else stop = v;
        }
        json_t *list = obj.k == JV_LIST ? json_array() : NULL;
        struct jbuf sb = {0};
        const char *s = obj.k == JV_STR ? jv_sdata(obj) : NULL;
        size_t sn = s ? jv_slen(obj) : 0;
        if (obj.k == JV_LIST && !list) {
            st = nomem();
            goto done;
        }
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (list) {
                if (json_array_append(list, json_array_get(obj.j, (size_t)i))) st = nomem();
            } else {
                size_t off = ju_cp_offset(s, sn, (size_t)i);
                int32_t cp;
                size_t l = ju_decode(s + off, sn - off, &cp);
                st = jbuf_add(&sb, s + off, l);
            }
            if (st) break;
        }
        if (!st) {
            *out = list ? jv_wrap(JV_LIST, json_incref(list)) : jv_str(sb.p, sb.n);
            if (jv_oom(*out)) st = nomem();
        }
        json_decref(list);
        jbuf_free(&sb);
    }
done:
    jv_free(&obj);
    for (int i = 0; i < 3; i++) jv_free(&parts[i]);
    return st;
}

static enum moe_status eval_items(struct jctx *cx, const struct jnode *n, struct jv *out)
{
    bool dict = n->kind == JN_DICT;
    json_t *c = dict ? json_object() : json_array();
    if (!c) return nomem();
    enum moe_status st = MOE_OK;
    for (size_t i = 0; i < n->args.n && !st; i += dict ? 2 : 1) {
        struct jv k = jv_undef(), v = jv_undef();
        st = jinja_eval(cx, n->args.v[i], &k);
        if (!st && dict) {
            if (k.k != JV_STR)
                st = jinja_err(MOE_ERR_UNSUPPORTED, n->args.v[i], "dict keys other than strings are not supported");
            if (!st) st = jinja_eval(cx, n->args.v[i + 1], &v);
            if (!st && json_object_setn_new_nocheck(c, jv_sdata(k), jv_slen(k), jv_to_json(v))) st = nomem();
        } else if (!st && json_array_append_new(c, jv_to_json(k))) {
            st = nomem();
        }
        jv_free(&k);
        jv_free(&v);
    }
    if (st) {
        json_decref(c);
        return st;
    }
    *out = jv_wrap(dict ? JV_DICT : JV_LIST, c);
    return MOE_OK;
}

enum moe_status jinja_eval(struct jctx *cx, const struct jnode *n, struct jv *out)
{
    *out = jv_undef();
    enum moe_status st = MOE_OK;
    switch (n->kind) {
    case JN_CONST:
        *out = jv_from_json(n->cval);
        return MOE_OK;
    case JN_NAME: {
        struct jv *v = scope_get(cx->cur, n->str);
        *out = v ? jv_copy(*v) : undef_named(n->str);
        return MOE_OK;
    }
    case JN_GETATTR: {
        struct jv obj;
        MOE_TRY(jinja_eval(cx, n->a, &obj));
        st = obj.k == JV_UNDEF ? jinja_undef_err(n, obj) : jinja_getattr(n, obj, n->str, out);
        jv_free(&obj);
        return st;
    }
    case JN_GETITEM: {
        struct jv obj, key = jv_undef();
        MOE_TRY(jinja_eval(cx, n->a, &obj));
        st = jinja_eval(cx, n->b, &key);
        if (!st) st = obj.k == JV_UNDEF ? jinja_undef_err(n, obj) : jinja_getitem(n, obj, key, out);
        jv_free(&obj);
        jv_free(&key);
        return st;
    }
    case JN_SLICE: return eval_slice(cx, n, out);
    case JN_CALL: return jinja_call(cx, n, out);
    case JN_FILTER: return jinja_filter(cx, n, out);
    case JN_TEST: return jinja_test(cx, n, out);
    case JN_UNARY: {
        struct jv a;
        MOE_TRY(jinja_eval(cx, n->a, &a));
        if (n->op == 'n') *out = jv_bool(!jv_truthy(a));
        else if (a.k == JV_INT || a.k == JV_BOOL) *out = jv_int(n->op == '-' ? -as_int(a) : as_int(a));
        else if (a.k == JV_FLOAT) *out = jv_float(n->op == '-' ? -a.f : a.f);
        else if (a.k == JV_UNDEF) st = jinja_undef_err(n, a);
        else st = jinja_err(MOE_ERR_FORMAT, n, "bad operand type for unary %c: '%s'", n->op, jv_type_name(a));
        jv_free(&a);
        return st;
    }
    case JN_BINARY: return eval_binary(cx, n, out);
    case JN_COND: {
        struct jv c;
        MOE_TRY(jinja_eval(cx, n->b, &c));
        bool t = jv_truthy(c);
        jv_free(&c);
        if (t) return jinja_eval(cx, n->a, out);
        if (n->c) return jinja_eval(cx, n->c, out);
        return MOE_OK;
    }
    case JN_LIST: case JN_TUPLE: case JN_DICT: return eval_items(cx, n, out);
    default:
        return jinja_err(MOE_ERR_FORMAT, n, "internal: statement used as an expression");
    }
}

/* ---- statements ---- */

static enum moe_status bind_targets(struct jctx *cx, const struct jnode *at, struct jscope *s,
                                    struct jnode *const *names, size_t n, struct jv v)
{
    if (n == 1) return scope_set(s, names[0]->str, jv_copy(v));
    if (v.k != JV_LIST)
        return jinja_err(MOE_ERR_FORMAT, at, "cannot unpack non-sequence %s into %zu names", jv_type_name(v), n);
    size_t m = json_array_size(v.j);
    if (m != n)
        return m > n ? jinja_err(MOE_ERR_FORMAT, at, "too many values to unpack (expected %zu)", n)
                     : jinja_err(MOE_ERR_FORMAT, at, "not enough values to unpack (expected %zu, got %zu)", n, m);
    for (size_t i = 0; i < n; i++)
        MOE_TRY(scope_set(s, names[i]->str, jv_from_json(json_array_get(v.j, i))));
    return MOE_OK;
}

/* The items a for loop walks, as a new json array. */
static enum moe_status iter_items(const struct jnode *at, struct jv v, json_t **items)
{
    *items = NULL;
    switch (v.k) {
    case JV_UNDEF: *items = json_array(); break;
    case JV_GEN: MOE_TRY(jinja_gen_check(v)); *items = json_incref(v.j); break;
    case JV_LIST: *items = json_incref(v.j); break;
    case JV_DICT: case JV_LOOP: {
        *items = json_array();
        const char *k;
        size_t kl;
        json_t *x;
        json_object_keylen_foreach(v.j, k, kl, x) {
            if (*items && json_array_append_new(*items, json_stringn_nocheck(k, kl))) {
                json_decref(*items);
                *items = NULL;
            }
        }
        break;
    }
    case JV_STR: {
        *items = json_array();
        const char *s = jv_sdata(v);
        size_t n = jv_slen(v);
        for (size_t i = 0; i < n && *items;) {
            int32_t cp;
            size_t l = ju_decode(s + i, n - i, &cp);
            if (json_array_append_new(*items, json_stringn_nocheck(s + i, l))) {
                json_decref(*items);
                *items = NULL;
            }
            i += l;
        }
        break;
    }
    default:
        return jinja_err(MOE_ERR_FORMAT, at, "'%s' object is not iterable", jv_type_name(v));
    }
    return *items ? MOE_OK : nomem();
}

static enum moe_status step(struct jctx *cx, const struct jnode *at)
{
    if (cx->lim.max_steps && ++cx->steps > cx->lim.max_steps)
        return jinja_err(MOE_ERR_FORMAT, at, "template exceeded %llu loop iterations and macro calls",
                         (unsigned long long)cx->lim.max_steps);
    return MOE_OK;
}

static enum moe_status exec_for(struct jctx *cx, const struct jnode *n)
{
    struct jv seq;
    MOE_TRY(jinja_eval(cx, n->a, &seq));
    json_t *items = NULL;
    enum moe_status st = iter_items(n, seq, &items);
    jv_free(&seq);
    if (st) return st;
    struct jscope *outer = cx->cur;
    if (n->b) { /* {% for x in xs if cond %}: filter first, so loop.length counts what is kept */
        json_t *kept = json_array();
        if (!kept) st = nomem();
        for (size_t i = 0; !st && i < json_array_size(items); i++) {
            struct jscope s = {.parent = outer};
            struct jv item = jv_from_json(json_array_get(items, i)), c = jv_undef();
            cx->cur = &s;
            st = bind_targets(cx, n, &s, n->args.v, n->args.n, item);
            if (!st) st = jinja_eval(cx, n->b, &c);
            if (!st && jv_truthy(c) && json_array_append(kept, json_array_get(items, i))) st = nomem();
            cx->cur = outer;
            jv_free(&c);
            jv_free(&item);
            scope_free(&s);
        }
        json_decref(items);
        items = kept;
        if (st) {
            json_decref(items);
            return st;
        }
    }
    size_t len = json_array_size(items);
    for (size_t i = 0; i < len && !st; i++) {
        if ((st = step(cx, n))) break;
        struct jscope s = {.parent = outer};
        json_t *loop = json_pack("{sIsIsIsIsbsbsIsIsI}", "index", (json_int_t)i + 1, "index0", (json_int_t)i,
                                 "revindex", (json_int_t)(len - i), "revindex0", (json_int_t)(len - i - 1),
                                 "first", i == 0, "last", i + 1 == len, "length", (json_int_t)len,
                                 "depth", (json_int_t)1, "depth0", (json_int_t)0);
        if (!loop) st = nomem();
        if (!st && i > 0 && json_object_set(loop, "previtem", json_array_get(items, i - 1))) st = nomem();
        if (!st && i + 1 < len && json_object_set(loop, "nextitem", json_array_get(items, i + 1))) st = nomem();
        if (!st) st = scope_set(&s, "loop", jv_wrap(JV_LOOP, loop));
        else json_decref(loop);
        struct jv item = jv_from_json(json_array_get(items, i));
        if (!st) st = bind_targets(cx, n, &s, n->args.v, n->args.n, item);
        jv_free(&item);
        cx->cur = &s;
        if (!st) st = exec_body(cx, &n->body);
        cx->cur = outer;
        scope_free(&s);
        int ctrl = cx->ctrl;
        cx->ctrl = 0;
        if (ctrl == 'b') break;
    }
    json_decref(items);
    if (!st && len == 0) st = exec_body(cx, &n->orelse);
    return st;
}

/* Renders body into a new string (block set, macro bodies). */
static enum moe_status capture(struct jctx *cx, const struct jlist *body, struct jv *out)
{
    struct jbuf saved = cx->out;
    cx->out = (struct jbuf){.limit = saved.limit};
    enum moe_status st = exec_body(cx, body);
    if (!st) {
        *out = jv_str(cx->out.p, cx->out.n);
        if (jv_oom(*out)) st = nomem();
    }
    jbuf_free(&cx->out);
    cx->out = saved;
    return st;
}

static enum moe_status exec_set(struct jctx *cx, const struct jnode *n)
{
    struct jv v;
    MOE_TRY(n->a ? jinja_eval(cx, n->a, &v) : capture(cx, &n->body, &v));
    const struct jnode *t = n->c;
    enum moe_status st = MOE_OK;
    if (t->kind == JN_NAME) {
        return scope_set(cx->cur, t->str, v);
    } else if (t->kind == JN_GETATTR) {
        struct jv *ns = scope_get(cx->cur, t->a->str);
        if (!ns || ns->k != JV_NS)
            st = jinja_err(MOE_ERR_FORMAT, n, "cannot assign attribute on non-namespace object '%s'", t->a->str);
        else if (t->str[0] == '_')
            st = jinja_err(MOE_ERR_FORMAT, n, "Chat templates cannot store underscore-prefixed attributes on a "
                           "namespace, but got '%s'. Please rename the attribute.", t->str);
        else if (json_object_set_new(ns->j, t->str, jv_to_json(v)))
            st = nomem();
    } else {
        st = bind_targets(cx, n, cx->cur, t->args.v, t->args.n, v);
    }
    jv_free(&v);
    return st;
}

enum moe_status jinja_call_macro(struct jctx *cx, const struct jnode *call, const struct jnode *m,
                                 struct jv *args, size_t nargs, char **kwnames, struct jv *kwvals,
                                 size_t nkw, struct jv *out)
{
    if (nargs > m->kwargs.n)
        return jinja_err(MOE_ERR_FORMAT, call, "macro '%s' takes not more than %zu argument(s)", m->str, m->kwargs.n);
    if (cx->depth >= cx->lim.max_depth)
        return jinja_err(MOE_ERR_FORMAT, call, "macro calls nested deeper than %d", cx->lim.max_depth);
    MOE_TRY(step(cx, call));
    struct jscope s = {.parent = cx->root};
    struct jscope *saved = cx->cur;
    enum moe_status st = MOE_OK;
    cx->cur = &s;
    for (size_t k = 0; k < nkw && !st; k++) {
        bool known = false;
        for (size_t i = 0; i < m->kwargs.n; i++) known |= !strcmp(m->kwargs.v[i]->str, kwnames[k]);
        if (!known) st = jinja_err(MOE_ERR_FORMAT, call, "macro '%s' takes no keyword argument '%s'", m->str, kwnames[k]);
    }
    for (size_t i = 0; i < m->kwargs.n && !st; i++) {
        const struct jnode *p = m->kwargs.v[i];
        struct jv v = jv_undef();
        bool got = false;
        if (i < nargs) {
            v = jv_copy(args[i]);
            got = true;
        }
        for (size_t k = 0; k < nkw; k++) {
            if (!strcmp(kwnames[k], p->str)) {
                jv_free(&v);
                v = jv_copy(kwvals[k]);
                got = true;
            }
        }
        if (!got && p->a) st = jinja_eval(cx, p->a, &v);
        if (!got && !p->a) v = undef_named(p->str);
        if (!st) st = scope_set(&s, p->str, v);
        else jv_free(&v);
    }
    cx->depth++;
    if (!st) st = capture(cx, &m->body, out);
    cx->depth--;
    cx->ctrl = 0;
    cx->cur = saved;
    scope_free(&s);
    return st;
}

static enum moe_status exec_node(struct jctx *cx, const struct jnode *n)
{
    switch (n->kind) {
    case JN_TEXT: return jbuf_add(&cx->out, n->str, n->len);
    case JN_OUTPUT: {
        struct jv v;
        MOE_TRY(jinja_eval(cx, n->a, &v));
        enum moe_status st = jv_str_append(&cx->out, v);
        jv_free(&v);
        return st;
    }
    case JN_IF: {
        struct jv c;
        MOE_TRY(jinja_eval(cx, n->a, &c));
        bool t = jv_truthy(c);
        jv_free(&c);
        return exec_body(cx, t ? &n->body : &n->orelse);
    }
    case JN_FOR: return exec_for(cx, n);
    case JN_SET: return exec_set(cx, n);
    case JN_MACRO: return scope_set(cx->cur, n->str, (struct jv){.k = JV_MACRO, .macro = n});
    case JN_BREAK: cx->ctrl = 'b'; return MOE_OK;
    case JN_CONTINUE: cx->ctrl = 'c'; return MOE_OK;
    default: return jinja_err(MOE_ERR_FORMAT, n, "internal: expression used as a statement");
    }
}

static enum moe_status exec_body(struct jctx *cx, const struct jlist *body)
{
    for (size_t i = 0; i < body->n && !cx->ctrl; i++) MOE_TRY(exec_node(cx, body->v[i]));
    return MOE_OK;
}

enum moe_status jinja_render(const struct jtemplate *tpl, json_t *vars, const struct jinja_limits *lim,
                             time_t now, char **out)
{
    *out = NULL;
    struct jscope root = {0};
    struct jctx cx = {.root = &root, .cur = &root, .lim = *lim, .now = now};
    cx.out.limit = lim->max_output;
    static const struct { const char *name; enum jfunc fn; } funcs[] = {
        {"range", JF_RANGE}, {"namespace", JF_NAMESPACE}, {"dict", JF_DICT},
        {"raise_exception", JF_RAISE}, {"strftime_now", JF_STRFTIME}};
    enum moe_status st = MOE_OK;
    for (size_t i = 0; i < sizeof funcs / sizeof funcs[0] && !st; i++)
        st = scope_set(&root, funcs[i].name, (struct jv){.k = JV_FUNC, .fn = funcs[i].fn});
    const char *k;
    json_t *v;
    if (json_is_object(vars)) {
        json_object_foreach(vars, k, v) {
            if (st) break;
            st = scope_set(&root, k, jv_from_json(v));
        }
    }
    if (!st) st = exec_body(&cx, &tpl->body);
    if (!st && !cx.out.p) st = jbuf_add(&cx.out, "", 0);
    if (!st) {
        *out = cx.out.p;
        cx.out.p = NULL;
    }
    jbuf_free(&cx.out);
    scope_free(&root);
    return st;
}
