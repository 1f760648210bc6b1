/* jinja_builtins.c - what templates call by name: attribute and item
 * lookup, filters, tests, methods on str/dict/loop, and the globals
 * transformers provides (range, namespace, dict, raise_exception,
 * strftime_now).
 *
 * Lookups follow jinja2.sandbox: a missing dict key, list index or
 * attribute is Undefined (an error only when used), except on an Undefined
 * itself.  Lists are immutable (ImmutableSandboxedEnvironment), so
 * list.append and friends are errors, as they are in transformers.  A
 * filter, test or method this file does not implement is
 * MOE_ERR_UNSUPPORTED naming it and the template line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "runtime/jinja.h"

static enum moe_status nomem(void) { return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory"); }

static struct jv undef_msg(const char *fmt, const char *a, const char *b)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a, b);
    return jv_wrap(JV_UNDEF, json_string(msg));
}

static const char *obj_name(struct jv v)
{
    switch (v.k) {
    case JV_DICT: return "dict object";
    case JV_LIST: return "list object";
    case JV_STR: return "str object";
    case JV_NONE: return "None";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_BOOL: return "bool object";
    case JV_NS: return "Namespace object";
    case JV_LOOP: return "LoopContext object";
    default: return "object";
    }
}

enum moe_status jinja_getattr(const struct jnode *at, struct jv obj, const char *name, struct jv *out)
{
    (void)at;
    if (obj.k == JV_DICT || obj.k == JV_NS || obj.k == JV_LOOP) {
        json_t *v = json_object_get(obj.j, name);
        if (v) {
            *out = jv_from_json(v);
            return MOE_OK;
        }
    }
    *out = undef_msg("'%s' has no attribute '%.100s'", obj_name(obj), name);
    return MOE_OK;
}

enum moe_status jinja_getitem(const struct jnode *at, struct jv obj, struct jv key, struct jv *out)
{
    if (key.k == JV_STR && (obj.k == JV_DICT || obj.k == JV_NS || obj.k == JV_LOOP || obj.k == JV_LIST ||
                            obj.k == JV_STR)) {
        json_t *v = obj.k == JV_LIST || obj.k == JV_STR ? NULL : json_object_getn(obj.j, jv_sdata(key), jv_slen(key));
        if (v) {
            *out = jv_from_json(v);
            return MOE_OK;
        }
        *out = undef_msg("'%s' has no attribute '%.100s'", obj_name(obj), jv_sdata(key));
        return MOE_OK;
    }
    if ((key.k == JV_INT || key.k == JV_BOOL) && (obj.k == JV_LIST || obj.k == JV_STR)) {
        int64_t i = key.k == JV_BOOL ? key.b : key.i;
        int64_t n = obj.k == JV_LIST ? (int64_t)json_array_size(obj.j) : (int64_t)ju_cp_count(jv_sdata(obj), jv_slen(obj));
        if (i < 0) i += n;
        if (i < 0 || i >= n) {
            char idx[32];
            snprintf(idx, sizeof idx, "%lld", (long long)(key.k == JV_BOOL ? key.b : key.i));
            *out = undef_msg("'%s' has no attribute %s", obj_name(obj), idx);
            return MOE_OK;
        }
        if (obj.k == JV_LIST) {
            *out = jv_from_json(json_array_get(obj.j, (size_t)i));
        } else {
            const char *s = jv_sdata(obj);
            size_t sn = jv_slen(obj), off = ju_cp_offset(s, sn, (size_t)i);
            int32_t cp;
            *out = jv_str(s + off, ju_decode(s + off, sn - off, &cp));
            if (jv_oom(*out)) return nomem();
        }
        return MOE_OK;
    }
    (void)at;
    *out = undef_msg("'%s' has no attribute '%s'", obj_name(obj), jv_type_name(key));
    return MOE_OK;
}

/* ---- call arguments ---- */

#define MAX_ARGS 16

struct args {
    struct jv pos[MAX_ARGS];
    size_t npos;
    char *kwn[MAX_ARGS];
    struct jv kwv[MAX_ARGS];
    size_t nkw;
};

static void args_free(struct args *a)
{
    for (size_t i = 0; i < a->npos; i++) jv_free(&a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++) jv_free(&a->kwv[i]);
    a->npos = a->nkw = 0;
}

static enum moe_status args_eval(struct jctx *cx, const struct jnode *n, struct args *a)
{
    memset(a, 0, sizeof *a);
    if (n->args.n > MAX_ARGS || n->kwargs.n > MAX_ARGS)
        return jinja_err(MOE_ERR_UNSUPPORTED, n, "more than %d arguments in one call", MAX_ARGS);
    for (size_t i = 0; i < n->args.n; i++) {
        enum moe_status st = jinja_eval(cx, n->args.v[i], &a->pos[i]);
        a->npos = i + 1;
        if (st) {
            args_free(a);
            return st;
        }
    }
    for (size_t i = 0; i < n->kwargs.n; i++) {
        a->kwn[i] = n->kwargs.v[i]->str;
        enum moe_status st = jinja_eval(cx, n->kwargs.v[i]->a, &a->kwv[i]);
        a->nkw = i + 1;
        if (st) {
            args_free(a);
            return st;
        }
    }
    return MOE_OK;
}

/* Positional i or keyword name; NULL if absent.  off shifts positions (a
 * filter's first positional argument is its operand in Python). */
static struct jv *arg(struct args *a, size_t i, const char *name)
{
    for (size_t k = 0; k < a->nkw; k++)
        if (name && !strcmp(a->kwn[k], name)) return &a->kwv[k];
    return i < a->npos ? &a->pos[i] : NULL;
}

static enum moe_status need_str(const struct jnode *at, struct jv *v, const char *what)
{
    if (!v || v->k != JV_STR)
        return jinja_err(MOE_ERR_FORMAT, at, "%s must be a string, not %s", what, v ? jv_type_name(*v) : "missing");
    return MOE_OK;
}

/* ---- string helpers ---- */

static enum moe_status to_str(struct jv v, struct jv *out)
{
    if (v.k == JV_STR) {
        *out = jv_copy(v);
        return MOE_OK;
    }
    struct jbuf b = {0};
    enum moe_status st = jv_str_append(&b, v);
    if (!st) {
        *out = jv_str(b.p, b.n);
        if (jv_oom(*out)) st = nomem();
    }
    jbuf_free(&b);
    return st;
}

static bool in_chars(int32_t cp, struct jv *chars)
{
    if (!chars || chars->k != JV_STR) return ju_isspace(cp);
    const char *s = jv_sdata(*chars);
    size_t n = jv_slen(*chars);
    for (size_t i = 0; i < n;) {
        int32_t c;
        i += ju_decode(s + i, n - i, &c);
        if (c == cp) return true;
    }
    return false;
}

/* str.strip/lstrip/rstrip: which = 3/1/2. */
static enum moe_status strip(struct jv s, struct jv *chars, int which, struct jv *out)
{
    const char *p = jv_sdata(s);
    size_t n = jv_slen(s), b = 0, e = n;
    int32_t cp;
    if (which & 1) {
        while (b < e) {
            size_t l = ju_decode(p + b, e - b, &cp);
            if (!in_chars(cp, chars)) break;
            b += l;
        }
    }
    if (which & 2) {
        while (e > b) {
            size_t s0 = e - 1;
            while (s0 > b && ((unsigned char)p[s0] & 0xc0) == 0x80) s0--;
            ju_decode(p + s0, e - s0, &cp);
            if (!in_chars(cp, chars)) break;
            e = s0;
        }
    }
    *out = jv_str(p + b, e - b);
    return jv_oom(*out) ? nomem() : MOE_OK;
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' title filter, 'T' str.title. */
static enum moe_status recase(struct jv s, int mode, struct jv *out)
{
    const char *p = jv_sdata(s);
    size_t n = jv_slen(s);
    struct jbuf b = {0};
    bool start = true, prev_cased = false;
    enum moe_status st = MOE_OK;
    for (size_t i = 0; i < n && !st;) {
        int32_t cp;
        size_t l = ju_decode(p + i, n - i, &cp);
        int32_t r = cp;
        switch (mode) {
        case 'u': r = utf8proc_toupper(cp); break;
        case 'l': r = utf8proc_tolower(cp); break;
        case 'c': r = i == 0 ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        case 't': {
            bool sep = ju_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            r = sep ? cp : start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            start = sep;
            break;
        }
        case 'T': {
            const utf8proc_property_t *pr = utf8proc_get_property(cp);
            bool cased = pr->category == UTF8PROC_CATEGORY_LU || pr->category == UTF8PROC_CATEGORY_LL ||
                         pr->category == UTF8PROC_CATEGORY_LT;
            r = cased ? (prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp)) : cp;
            prev_cased = cased;
            break;
        }
        }
        if (r == cp) {
            st = jbuf_add(&b, p + i, l);
        } else {
            utf8proc_uint8_t enc[4];
            utf8proc_ssize_t el = utf8proc_encode_char(r, enc);
            st = jbuf_add(&b, (const char *)enc, (size_t)el);
        }
        i += l;
    }
    if (!st) {
        *out = jv_str(b.p, b.n);
        if (jv_oom(*out)) st = nomem();
    }
    jbuf_free(&b);
    return st;
}

static enum moe_status replace(const struct jnode *at, struct jv s, struct jv *old, struct jv *new_,
                               struct jv *count, struct jv *out)
{
    MOE_TRY(need_str(at, old, "replace() argument 1"));
    MOE_TRY(need_str(at, new_, "replace() argument 2"));
    int64_t limit = count && count->k == JV_INT ? count->i : -1;
    const char *p = jv_sdata(s), *o = jv_sdata(*old), *w = jv_sdata(*new_);
    size_t n = jv_slen(s), on = jv_slen(*old), wn = jv_slen(*new_);
    struct jbuf b = {0};
    enum moe_status st = MOE_OK;
    size_t i = 0;
    for (int64_t done = 0; !st && (limit < 0 || done < limit); done++) {
        if (on == 0) { /* Python inserts new between every character */
            if (i > n) break;
            st = jbuf_add(&b, w, wn);
            if (!st && i < n) {
                int32_t cp;
                size_t l = ju_decode(p + i, n - i, &cp);
                st = jbuf_add(&b, p + i, l);
                i += l;
            } else {
                i = n + 1;
            }
            continue;
        }
        const char *hit = memmem(p + i, n - i, o, on);
        if (!hit) break;
        st = jbuf_add(&b, p + i, (size_t)(hit - (p + i)));
        if (!st) st = jbuf_add(&b, w, wn);
        i = (size_t)(hit - p) + on;
    }
    if (!st && i < n) st = jbuf_add(&b, p + i, n - i);
    if (!st) {
        *out = jv_str(b.p, b.n);
        if (jv_oom(*out)) st = nomem();
    }
    jbuf_free(&b);
    return st;
}

static enum moe_status split(const struct jnode *at, struct jv s, struct jv *sep, struct jv *maxsplit,
                             struct jv *out)
{
    json_t *list = json_array();
    if (!list) return nomem();
    const char *p = jv_sdata(s);
    size_t n = jv_slen(s);
    int64_t limit = maxsplit && maxsplit->k == JV_INT ? maxsplit->i : -1;
    int fail = 0;
    if (!sep || sep->k == JV_NONE) { /* runs of whitespace, no empty strings */
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            int32_t cp;
            while (i < n) {
                size_t l = ju_decode(p + i, n - i, &cp);
                if (!ju_isspace(cp)) break;
                i += l;
            }
            if (i >= n) break;
            size_t b = i;
            if (limit >= 0 && done >= limit) {
                size_t e = n;
                while (e > b && (p[e - 1] == ' ' || p[e - 1] == '\t' || p[e - 1] == '\n' || p[e - 1] == '\r')) e--;
                fail |= json_array_append_new(list, json_stringn_nocheck(p + b, e - b));
                break;
            }
            while (i < n) {
                size_t l = ju_decode(p + i, n - i, &cp);
                if (ju_isspace(cp)) break;
                i += l;
            }
            fail |= json_array_append_new(list, json_stringn_nocheck(p + b, i - b));
            done++;
        }
    } else {
        enum moe_status st = need_str(at, sep, "split() separator");
        if (!st && jv_slen(*sep) == 0) st = jinja_err(MOE_ERR_FORMAT, at, "empty separator");
        if (st) {
            json_decref(list);
            return st;
        }
        const char *o = jv_sdata(*sep);
        size_t on = jv_slen(*sep), i = 0;
        for (int64_t done = 0; limit < 0 || done < limit; done++) {
            const char *hit = memmem(p + i, n - i, o, on);
            if (!hit) break;
            fail |= json_array_append_new(list, json_stringn_nocheck(p + i, (size_t)(hit - (p + i))));
            i = (size_t)(hit - p) + on;
        }
        fail |= json_array_append_new(list, json_stringn_nocheck(p + i, n - i));
    }
    if (fail) {
        json_decref(list);
        return nomem();
    }
    *out = jv_wrap(JV_LIST, list);
    return MOE_OK;
}

static bool affix(struct jv s, struct jv x, bool end)
{
    if (x.k != JV_STR) return false;
    size_t n = jv_slen(s), m = jv_slen(x);
    return m <= n && !memcmp(jv_sdata(s) + (end ? n - m : 0), jv_sdata(x), m);
}

static enum moe_status affix_any(const struct jnode *at, struct jv s, struct jv *x, bool end, struct jv *out)
{
    if (x && x->k == JV_LIST) {
        bool r = false;
        for (size_t i = 0; i < json_array_size(x->j) && !r; i++) {
            struct jv e = jv_from_json(json_array_get(x->j, i));
            r = affix(s, e, end);
            jv_free(&e);
        }
        *out = jv_bool(r);
        return MOE_OK;
    }
    MOE_TRY(need_str(at, x, end ? "endswith() argument" : "startswith() argument"));
    *out = jv_bool(affix(s, *x, end));
    return MOE_OK;
}

/* Items of v as a new json array (list(v) in Python). */
static enum moe_status to_list(const struct jnode *at, struct jv v, json_t **out)
{
    *out = NULL;
    if (v.k == JV_LIST) {
        *out = json_copy(v.j);
    } else if (v.k == JV_UNDEF) {
        *out = json_array();
    } else if (v.k == JV_DICT || v.k == JV_NS) {
        *out = json_array();
        const char *k;
        json_t *x;
        json_object_foreach(v.j, k, x) if (*out && json_array_append_new(*out, json_string_nocheck(k))) {
            json_decref(*out);
            *out = NULL;
        }
    } else if (v.k == JV_STR) {
        *out = json_array();
        const char *s = jv_sdata(v);
        size_t n = jv_slen(v);
        for (size_t i = 0; i < n && *out;) {
            int32_t cp;
            size_t l = ju_decode(s + i, n - i, &cp);
            if (json_array_append_new(*out, json_stringn_nocheck(s + i, l))) {
                json_decref(*out);
                *out = NULL;
            }
            i += l;
        }
    } else {
        return jinja_err(MOE_ERR_FORMAT, at, "'%s' object is not iterable", jv_type_name(v));
    }
    return *out ? MOE_OK : nomem();
}

static enum moe_status dict_items(struct jv d, struct jv *out)
{
    json_t *list = json_array();
    if (!list) return nomem();
    if (d.k == JV_DICT || d.k == JV_NS) {
        const char *k;
        size_t kl;
        json_t *x;
        json_object_keylen_foreach(d.j, k, kl, x) {
            if (json_array_append_new(list, json_pack("[s%O]", k, kl, x))) {
                json_decref(list);
                return nomem();
            }
        }
    }
    *out = jv_wrap(JV_LIST, list);
    return MOE_OK;
}

/* ---- tests ---- */

static enum moe_status run_test(struct jctx *cx, const struct jnode *at, const char *name, struct jv v,
                                struct jv *a1, bool *r)
{
    (void)cx;
    bool num = v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL;
    if (!strcmp(name, "defined")) *r = v.k != JV_UNDEF;
    else if (!strcmp(name, "undefined")) *r = v.k == JV_UNDEF;
    else if (!strcmp(name, "none")) *r = v.k == JV_NONE;
    else if (!strcmp(name, "string")) *r = v.k == JV_STR;
    else if (!strcmp(name, "number")) *r = num;
    else if (!strcmp(name, "integer")) *r = v.k == JV_INT;
    else if (!strcmp(name, "float")) *r = v.k == JV_FLOAT;
    else if (!strcmp(name, "boolean")) *r = v.k == JV_BOOL;
    else if (!strcmp(name, "true")) *r = v.k == JV_BOOL && v.b;
    else if (!strcmp(name, "false")) *r = v.k == JV_BOOL && !v.b;
    else if (!strcmp(name, "mapping")) *r = v.k == JV_DICT;
    else if (!strcmp(name, "sequence")) *r = v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_UNDEF;
    else if (!strcmp(name, "iterable"))
        *r = v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_NS || v.k == JV_LOOP || v.k == JV_UNDEF;
    else if (!strcmp(name, "callable")) *r = v.k == JV_MACRO || v.k == JV_FUNC;
    else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v.k != JV_INT && v.k != JV_BOOL) return jinja_err(MOE_ERR_FORMAT, at, "test '%s' needs an integer", name);
        int64_t x = v.k == JV_BOOL ? v.b : v.i, d = 2;
        if (name[0] == 'd') {
            if (!a1 || a1->k != JV_INT || a1->i == 0)
                return jinja_err(MOE_ERR_FORMAT, at, "divisibleby needs a non-zero integer");
            d = a1->i;
        }
        *r = name[0] == 'o' ? x % 2 != 0 : x % d == 0;
    } else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        struct jv c;
        if (v.k != JV_STR) return jinja_err(MOE_ERR_FORMAT, at, "test '%s' needs a string", name);
        MOE_TRY(recase(v, name[0] == 'l' ? 'l' : 'u', &c));
        *r = jv_equal(c, v);
        jv_free(&c);
    } else {
        static const struct { const char *name; int op; } cmp[] = {
            {"eq", JOP_EQ}, {"equalto", JOP_EQ}, {"==", JOP_EQ}, {"ne", JOP_NE}, {"!=", JOP_NE},
            {"lt", JOP_LT}, {"lessthan", JOP_LT}, {"le", JOP_LE}, {"gt", JOP_GT}, {"greaterthan", JOP_GT},
            {"ge", JOP_GE}, {"in", JOP_IN}, {"sameas", JOP_EQ}};
        for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
            if (strcmp(name, cmp[i].name)) continue;
            if (!a1) return jinja_err(MOE_ERR_FORMAT, at, "test '%s' needs an argument", name);
            struct jnode fake = {.kind = JN_BINARY, .line = at->line, .op = cmp[i].op};
            struct jv res;
            (void)fake;
            /* Reuse the operators through a tiny evaluation. */
            if (cmp[i].op == JOP_EQ) *r = jv_equal(v, *a1) && (strcmp(name, "sameas") || v.k == a1->k);
            else if (cmp[i].op == JOP_NE) *r = !jv_equal(v, *a1);
            else if (cmp[i].op == JOP_IN) {
                *r = false;
                if (a1->k == JV_LIST)
                    for (size_t k = 0; k < json_array_size(a1->j) && !*r; k++) {
                        res = jv_from_json(json_array_get(a1->j, k));
                        *r = jv_equal(v, res);
                        jv_free(&res);
                    }
                else if (a1->k == JV_STR && v.k == JV_STR)
                    *r = memmem(jv_sdata(*a1), jv_slen(*a1), jv_sdata(v), jv_slen(v)) != NULL;
                else if (a1->k == JV_DICT && v.k == JV_STR)
                    *r = json_object_getn(a1->j, jv_sdata(v), jv_slen(v)) != NULL;
            } else {
                bool an = v.k == JV_INT || v.k == JV_FLOAT, bn = a1->k == JV_INT || a1->k == JV_FLOAT;
                if (!an || !bn) return jinja_err(MOE_ERR_FORMAT, at, "test '%s' needs numbers", name);
                double x = v.k == JV_INT ? (double)v.i : v.f, y = a1->k == JV_INT ? (double)a1->i : a1->f;
                *r = cmp[i].op == JOP_LT ? x < y : cmp[i].op == JOP_LE ? x <= y : cmp[i].op == JOP_GT ? x > y : x >= y;
            }
            return MOE_OK;
        }
        return jinja_err(MOE_ERR_UNSUPPORTED, at, "test '%s' is not supported", name);
    }
    return MOE_OK;
}

enum moe_status jinja_test(struct jctx *cx, const struct jnode *n, struct jv *out)
{
    struct jv v;
    struct args a;
    MOE_TRY(jinja_eval(cx, n->a, &v));
    enum moe_status st = args_eval(cx, n, &a);
    bool r = false;
    if (!st) st = run_test(cx, n, n->str, v, arg(&a, 0, NULL), &r);
    if (!st) *out = jv_bool(r != (n->op == 1));
    args_free(&a);
    jv_free(&v);
    return st;
}

/* ---- filters ---- */

/* Filters that take only the value, shared by map('name'). */
static enum moe_status simple_filter(const struct jnode *at, const char *name, struct jv v, struct jv *out, bool *found)
{
    *found = true;
    struct jv s;
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "capitalize") || !strcmp(name, "title") ||
        !strcmp(name, "trim")) {
        MOE_TRY(to_str(v, &s));
        enum moe_status st = name[0] == 't' && name[1] == 'r' ? strip(s, NULL, 3, out)
                             : recase(s, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 'c' ? 'c' : 't', out);
        jv_free(&s);
        return st;
    }
    if (!strcmp(name, "string")) return to_str(v, out);
    if (!strcmp(name, "safe")) {
        *out = jv_copy(v);
        return MOE_OK;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v.k == JV_STR) *out = jv_int((int64_t)ju_cp_count(jv_sdata(v), jv_slen(v)));
        else if (v.k == JV_LIST) *out = jv_int((int64_t)json_array_size(v.j));
        else if (v.k == JV_DICT || v.k == JV_NS) *out = jv_int((int64_t)json_object_size(v.j));
        else if (v.k == JV_UNDEF) *out = jv_int(0);
        else return jinja_err(MOE_ERR_FORMAT, at, "object of type '%s' has no len()", jv_type_name(v));
        return MOE_OK;
    }
    *found = false;
    return MOE_OK;
}

static enum moe_status filter_tojson(const struct jnode *at, struct jv v, struct args *a, struct jv *out)
{
    struct jv *ind = arg(a, 0, "indent"), *ea = arg(a, 1, "ensure_ascii"), *sep = arg(a, 2, "separators"),
              *sk = arg(a, 3, "sort_keys");
    if (ea && jv_truthy(*ea)) return jinja_err(MOE_ERR_UNSUPPORTED, at, "tojson(ensure_ascii=True) is not supported");
    if (ind && ind->k != JV_INT && ind->k != JV_NONE)
        return jinja_err(MOE_ERR_UNSUPPORTED, at, "tojson indent other than an integer is not supported");
    if (v.k == JV_UNDEF) return jinja_err(MOE_ERR_FORMAT, at, "Object of type Undefined is not JSON serializable");
    if (v.k == JV_MACRO || v.k == JV_FUNC)
        return jinja_err(MOE_ERR_FORMAT, at, "Object of type %s is not JSON serializable", jv_type_name(v));
    const char *isep = NULL, *ksep = NULL;
    if (sep && sep->k == JV_LIST) {
        json_t *x = json_array_get(sep->j, 0), *y = json_array_get(sep->j, 1);
        if (json_array_size(sep->j) != 2 || !json_is_string(x) || !json_is_string(y))
            return jinja_err(MOE_ERR_FORMAT, at, "tojson separators must be two strings");
        isep = json_string_value(x);
        ksep = json_string_value(y);
    }
    json_t *j = jv_to_json(v);
    struct jbuf b = {0};
    enum moe_status st = j ? jv_tojson_append(&b, j, ind && ind->k == JV_INT ? (int)ind->i : -1, isep, ksep,
                                              sk && jv_truthy(*sk))
                           : nomem();
    json_decref(j);
    if (!st) {
        *out = jv_str(b.p, b.n);
        if (jv_oom(*out)) st = nomem();
    }
    jbuf_free(&b);
    return st;
}

static enum moe_status select_items(struct jctx *cx, const struct jnode *at, const char *name, struct jv v,
                                    struct args *a, struct jv *out)
{
    bool by_attr = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr");
    bool reject = name[0] == 'r';
    struct jv *attr = by_attr ? arg(a, 0, NULL) : NULL;
    struct jv *test = arg(a, by_attr ? 1 : 0, NULL);
    struct jv *targ = arg(a, by_attr ? 2 : 1, NULL);
    if (by_attr) MOE_TRY(need_str(at, attr, "attribute name"));
    if (test && test->k != JV_STR) return jinja_err(MOE_ERR_FORMAT, at, "test name must be a string");
    json_t *items = NULL, *kept = json_array();
    enum moe_status st = kept ? to_list(at, v, &items) : nomem();
    for (size_t i = 0; !st && i < json_array_size(items); i++) {
        struct jv item = jv_from_json(json_array_get(items, i)), x = jv_undef();
        bool r;
        if (by_attr) st = jinja_getattr(at, item, jv_sdata(*attr), &x);
        else x = jv_copy(item);
        if (!st) {
            if (test) st = run_test(cx, at, jv_sdata(*test), x, targ, &r);
            else r = jv_truthy(x);
        }
        if (!st && r != reject && json_array_append(kept, json_array_get(items, i))) st = nomem();
        jv_free(&item);
        jv_free(&x);
    }
    json_decref(items);
    if (st) {
        json_decref(kept);
        return st;
    }
    *out = jv_wrap(JV_LIST, kept);
    return MOE_OK;
}

static enum moe_status filter_map(struct jctx *cx, const struct jnode *at, struct jv v, struct args *a, struct jv *out)
{
    (void)cx;
    struct jv *attr = arg(a, 99, "attribute"), *def = arg(a, 99, "default"), *fname = arg(a, 0, NULL);
    if (!attr && (!fname || fname->k != JV_STR))
        return jinja_err(MOE_ERR_UNSUPPORTED, at, "map() is supported with attribute= or a filter name only");
    if (attr) MOE_TRY(need_str(at, attr, "map attribute"));
    json_t *items = NULL, *res = json_array();
    enum moe_status st = res ? to_list(at, v, &items) : nomem();
    for (size_t i = 0; !st && i < json_array_size(items); i++) {
        struct jv item = jv_from_json(json_array_get(items, i)), x = jv_undef();
        if (attr) {
            st = jinja_getattr(at, item, jv_sdata(*attr), &x);
            if (!st && x.k == JV_UNDEF && def) {
                jv_free(&x);
                x = jv_copy(*def);
            }
        } else {
            bool found;
            st = simple_filter(at, jv_sdata(*fname), item, &x, &found);
            if (!st && !found)
                st = jinja_err(MOE_ERR_UNSUPPORTED, at, "map('%s') is not supported", jv_sdata(*fname));
        }
        if (!st && json_array_append_new(res, jv_to_json(x))) st = nomem();
        jv_free(&item);
        jv_free(&x);
    }
    json_decref(items);
    if (st) {
        json_decref(res);
        return st;
    }
    *out = jv_wrap(JV_LIST, res);
    return MOE_OK;
}

static enum moe_status filter_join(const struct jnode *at, struct jv v, struct args *a, struct jv *out)
{
    struct jv *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    if (sep && sep->k != JV_STR) return jinja_err(MOE_ERR_FORMAT, at, "join separator must be a string");
    json_t *items = NULL;
    MOE_TRY(to_list(at, v, &items));
    struct jbuf b = {0};
    enum moe_status st = jbuf_add(&b, "", 0);
    for (size_t i = 0; !st && i < json_array_size(items); i++) {
        struct jv item = jv_from_json(json_array_get(items, i)), x = jv_undef();
        if (i && sep) st = jbuf_add(&b, jv_sdata(*sep), jv_slen(*sep));
        if (!st && attr && attr->k == JV_STR) st = jinja_getattr(at, item, jv_sdata(*attr), &x);
        else x = jv_copy(item);
        if (!st) st = jv_str_append(&b, x);
        jv_free(&item);
        jv_free(&x);
    }
    json_decref(items);
    if (!st) {
        *out = jv_str(b.p, b.n);
        if (jv_oom(*out)) st = nomem();
    }
    jbuf_free(&b);
    return st;
}

static enum moe_status apply_filter(struct jctx *cx, const struct jnode *n, const char *name, struct jv v,
                                    struct args *a, struct jv *out)
{
    bool found;
    struct jv s;
    if (strcmp(name, "trim")) {
        MOE_TRY(simple_filter(n, name, v, out, &found));
        if (found) return MOE_OK;
    } else {
        MOE_TRY(to_str(v, &s));
        enum moe_status st = strip(s, arg(a, 0, "chars"), 3, out);
        jv_free(&s);
        return st;
    }
    if (!strcmp(name, "tojson")) return filter_tojson(n, v, a, out);
    if (!strcmp(name, "replace")) {
        MOE_TRY(to_str(v, &s));
        enum moe_status st = replace(n, s, arg(a, 0, "old"), arg(a, 1, "new"), arg(a, 2, "count"), out);
        jv_free(&s);
        return st;
    }
    if (!strcmp(name, "join")) return filter_join(n, v, a, out);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        struct jv *def = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
        bool use = v.k == JV_UNDEF || (boolean && jv_truthy(*boolean) && !jv_truthy(v));
        *out = use ? (def ? jv_copy(*def) : jv_str("", 0)) : jv_copy(v);
        return jv_oom(*out) ? nomem() : MOE_OK;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        json_t *items = NULL;
        MOE_TRY(to_list(n, v, &items));
        size_t len = json_array_size(items);
        *out = len ? jv_from_json(json_array_get(items, name[0] == 'f' ? 0 : len - 1))
                   : jv_wrap(JV_UNDEF, json_string("No first item, sequence was empty."));
        json_decref(items);
        return MOE_OK;
    }
    if (!strcmp(name, "list")) {
        json_t *items = NULL;
        MOE_TRY(to_list(n, v, &items));
        *out = jv_wrap(JV_LIST, items);
        return MOE_OK;
    }
    if (!strcmp(name, "reverse")) {
        if (v.k == JV_STR) {
            const char *p = jv_sdata(v);
            size_t len = jv_slen(v);
            char *r = malloc(len + 1);
            if (!r) return nomem();
            for (size_t i = 0; i < len;) {
                int32_t cp;
                size_t l = ju_decode(p + i, len - i, &cp);
                memcpy(r + len - i - l, p + i, l);
                i += l;
            }
            *out = jv_str(r, len);
            free(r);
            return jv_oom(*out) ? nomem() : MOE_OK;
        }
        json_t *items = NULL, *rev = json_array();
        if (!rev) return nomem();
        enum moe_status st = to_list(n, v, &items);
        for (size_t i = json_array_size(items); !st && i-- > 0;)
            if (json_array_append(rev, json_array_get(items, i))) st = nomem();
        json_decref(items);
        if (st) {
            json_decref(rev);
            return st;
        }
        *out = jv_wrap(JV_LIST, rev);
        return MOE_OK;
    }
    if (!strcmp(name, "items")) {
        if (v.k != JV_DICT && v.k != JV_UNDEF && v.k != JV_NS)
            return jinja_err(MOE_ERR_FORMAT, n, "items filter needs a mapping, not %s", jv_type_name(v));
        return dict_items(v, out);
    }
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        bool fl = name[0] == 'f';
        struct jv *def = arg(a, 0, "default");
        double f = 0;
        bool ok = true;
        if (v.k == JV_INT || v.k == JV_BOOL) f = (double)(v.k == JV_BOOL ? v.b : v.i);
        else if (v.k == JV_FLOAT) f = v.f;
        else if (v.k == JV_STR) {
            char *end;
            const char *p = jv_sdata(v);
            f = strtod(p, &end);
            ok = end != p;
            while (ok && *end && ju_isspace((unsigned char)*end)) end++;
            ok = ok && *end == '\0';
        } else {
            ok = false;
        }
        if (!ok) {
            *out = def ? jv_copy(*def) : fl ? jv_float(0) : jv_int(0);
            return MOE_OK;
        }
        if (!fl && v.k == JV_INT) *out = v;
        else *out = fl ? jv_float(f) : jv_int((int64_t)f);
        return MOE_OK;
    }
    if (!strcmp(name, "abs")) {
        if (v.k == JV_INT || v.k == JV_BOOL) *out = jv_int(llabs(v.k == JV_BOOL ? v.b : v.i));
        else if (v.k == JV_FLOAT) *out = jv_float(v.f < 0 ? -v.f : v.f);
        else return jinja_err(MOE_ERR_FORMAT, n, "bad operand type for abs(): '%s'", jv_type_name(v));
        return MOE_OK;
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "select") ||
        !strcmp(name, "reject"))
        return select_items(cx, n, name, v, a, out);
    if (!strcmp(name, "map")) return filter_map(cx, n, v, a, out);
    return jinja_err(MOE_ERR_UNSUPPORTED, n, "filter '%s' is not supported", name);
}

enum moe_status jinja_filter(struct jctx *cx, const struct jnode *n, struct jv *out)
{
    struct jv v;
    struct args a;
    MOE_TRY(jinja_eval(cx, n->a, &v));
    enum moe_status st = args_eval(cx, n, &a);
    if (!st) st = apply_filter(cx, n, n->str, v, &a, out);
    args_free(&a);
    jv_free(&v);
    return st;
}

/* ---- calls ---- */

static enum moe_status call_method(struct jctx *cx, const struct jnode *n, struct jv obj, const char *m,
                                   struct args *a, struct jv *out)
{
    (void)cx;
    if (obj.k == JV_STR) {
        if (!strcmp(m, "strip")) return strip(obj, arg(a, 0, NULL), 3, out);
        if (!strcmp(m, "lstrip")) return strip(obj, arg(a, 0, NULL), 1, out);
        if (!strcmp(m, "rstrip")) return strip(obj, arg(a, 0, NULL), 2, out);
        if (!strcmp(m, "split")) return split(n, obj, arg(a, 0, "sep"), arg(a, 1, "maxsplit"), out);
        if (!strcmp(m, "startswith")) return affix_any(n, obj, arg(a, 0, NULL), false, out);
        if (!strcmp(m, "endswith")) return affix_any(n, obj, arg(a, 0, NULL), true, out);
        if (!strcmp(m, "upper")) return recase(obj, 'u', out);
        if (!strcmp(m, "lower")) return recase(obj, 'l', out);
        if (!strcmp(m, "capitalize")) return recase(obj, 'c', out);
        if (!strcmp(m, "title")) return recase(obj, 'T', out);
        if (!strcmp(m, "replace")) return replace(n, obj, arg(a, 0, NULL), arg(a, 1, NULL), arg(a, 2, NULL), out);
        if (!strcmp(m, "join")) {
            struct args ja = {.npos = 1};
            ja.pos[0] = obj;
            return filter_join(n, a->npos ? a->pos[0] : jv_undef(), &ja, out);
        }
        if (!strcmp(m, "find") || !strcmp(m, "count")) {
            MOE_TRY(need_str(n, arg(a, 0, NULL), "argument"));
            const char *p = jv_sdata(obj), *x = jv_sdata(a->pos[0]);
            size_t pn = jv_slen(obj), xn = jv_slen(a->pos[0]);
            if (m[0] == 'f') {
                const char *hit = memmem(p, pn, x, xn);
                *out = jv_int(hit ? (int64_t)ju_cp_count(p, (size_t)(hit - p)) : -1);
            } else {
                int64_t c = 0;
                for (const char *q = p; xn && (q = memmem(q, pn - (size_t)(q - p), x, xn)); q += xn) c++;
                *out = jv_int(xn ? c : (int64_t)ju_cp_count(p, pn) + 1);
            }
            return MOE_OK;
        }
    } else if (obj.k == JV_DICT || obj.k == JV_NS) {
        if (!strcmp(m, "get")) {
            struct jv *k = arg(a, 0, NULL), *d = arg(a, 1, NULL);
            json_t *x = k && k->k == JV_STR ? json_object_getn(obj.j, jv_sdata(*k), jv_slen(*k)) : NULL;
            *out = x ? jv_from_json(x) : d ? jv_copy(*d) : jv_none();
            return MOE_OK;
        }
        if (!strcmp(m, "items")) return dict_items(obj, out);
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            json_t *list = json_array();
            if (!list) return nomem();
            const char *k;
            json_t *x;
            json_object_foreach(obj.j, k, x) {
                if (json_array_append_new(list, m[0] == 'k' ? json_string_nocheck(k) : json_incref(x))) {
                    json_decref(list);
                    return nomem();
                }
            }
            *out = jv_wrap(JV_LIST, list);
            return MOE_OK;
        }
    } else if (obj.k == JV_LOOP && !strcmp(m, "cycle")) {
        if (!a->npos) return jinja_err(MOE_ERR_FORMAT, n, "no items for cycling given");
        int64_t i = json_integer_value(json_object_get(obj.j, "index0"));
        *out = jv_copy(a->pos[(size_t)i % a->npos]);
        return MOE_OK;
    } else if (obj.k == JV_LIST) {
        static const char *const mutators[] = {"append", "extend", "insert", "pop", "remove", "clear",
                                               "sort", "reverse", NULL};
        for (size_t i = 0; mutators[i]; i++)
            if (!strcmp(m, mutators[i]))
                return jinja_err(MOE_ERR_FORMAT, n, "access to attribute '%s' of 'list' object is unsafe.", m);
    } else if (obj.k == JV_UNDEF) {
        return jinja_undef_err(n, obj);
    }
    return jinja_err(MOE_ERR_UNSUPPORTED, n, "method '%s' of %s is not supported", m, jv_type_name(obj));
}

static enum moe_status call_func(struct jctx *cx, const struct jnode *n, int fn, struct args *a, struct jv *out)
{
    switch (fn) {
    case JF_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (a->npos < 1 || a->npos > 3) return jinja_err(MOE_ERR_FORMAT, n, "range expected 1 to 3 arguments");
        for (size_t i = 0; i < a->npos; i++) {
            if (a->pos[i].k != JV_INT && a->pos[i].k != JV_BOOL)
                return jinja_err(MOE_ERR_FORMAT, n, "range() arguments must be integers");
            v[a->npos == 1 ? 1 : i] = a->pos[i].k == JV_BOOL ? a->pos[i].b : a->pos[i].i;
        }
        if (v[2] == 0) return jinja_err(MOE_ERR_FORMAT, n, "range() arg 3 must not be zero");
        double count = ((double)v[1] - (double)v[0]) / (double)v[2];
        if (count > 1e6) return jinja_err(MOE_ERR_FORMAT, n, "range() of more than 1000000 items");
        json_t *list = json_array();
        if (!list) return nomem();
        for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
            if (json_array_append_new(list, json_integer(i))) {
                json_decref(list);
                return nomem();
            }
        }
        *out = jv_wrap(JV_LIST, list);
        return MOE_OK;
    }
    case JF_NAMESPACE:
    case JF_DICT: {
        json_t *o = json_object();
        if (!o) return nomem();
        enum moe_status st = MOE_OK;
        for (size_t i = 0; i < a->npos && !st; i++) {
            if (a->pos[i].k != JV_DICT || json_object_update(o, a->pos[i].j))
                st = jinja_err(MOE_ERR_UNSUPPORTED, n, "positional arguments to %s() other than a dict are not supported",
                               fn == JF_DICT ? "dict" : "namespace");
        }
        for (size_t i = 0; i < a->nkw && !st; i++) {
            if (fn == JF_NAMESPACE && a->kwn[i][0] == '_')
                st = jinja_err(MOE_ERR_FORMAT, n, "Chat templates cannot store underscore-prefixed attributes on a "
                               "namespace, but got '%s'. Please rename the attribute.", a->kwn[i]);
            else if (json_object_set_new(o, a->kwn[i], jv_to_json(a->kwv[i])))
                st = nomem();
        }
        if (st) {
            json_decref(o);
            return st;
        }
        *out = jv_wrap(fn == JF_DICT ? JV_DICT : JV_NS, o);
        return MOE_OK;
    }
    case JF_RAISE: {
        struct jv s = jv_undef();
        MOE_TRY(to_str(a->npos ? a->pos[0] : jv_undef(), &s));
        enum moe_status st = jinja_err(MOE_ERR_FORMAT, n, "%s", jv_sdata(s));
        jv_free(&s);
        return st;
    }
    case JF_STRFTIME: {
        struct jv *f = arg(a, 0, NULL);
        MOE_TRY(need_str(n, f, "strftime_now format"));
        struct tm tm;
        char buf[256];
        time_t t = cx->now;
        if (!localtime_r(&t, &tm)) return jinja_err(MOE_ERR_FORMAT, n, "strftime_now: time out of range");
        size_t len = strftime(buf, sizeof buf, jv_sdata(*f), &tm);
        *out = jv_str(buf, len);
        return jv_oom(*out) ? nomem() : MOE_OK;
    }
    }
    return jinja_err(MOE_ERR_FORMAT, n, "internal: unknown function");
}

enum moe_status jinja_call(struct jctx *cx, const struct jnode *n, struct jv *out)
{
    struct jv callee = jv_undef(), obj = jv_undef();
    struct args a;
    enum moe_status st;
    const struct jnode *c = n->a;
    bool method = c->kind == JN_GETATTR;
    if (method) {
        MOE_TRY(jinja_eval(cx, c->a, &obj));
        if (obj.k == JV_NS) { /* a namespace attribute holding a callable */
            json_t *x = json_object_get(obj.j, c->str);
            st = x ? jinja_err(MOE_ERR_FORMAT, n, "namespace attribute '%s' is not callable", c->str)
                   : jinja_err(MOE_ERR_FORMAT, n, "'Namespace object' has no attribute '%s'", c->str);
            jv_free(&obj);
            return st;
        }
    } else {
        MOE_TRY(jinja_eval(cx, c, &callee));
    }
    st = args_eval(cx, n, &a);
    if (st) goto done;
    if (method) st = call_method(cx, n, obj, c->str, &a, out);
    else if (callee.k == JV_MACRO)
        st = jinja_call_macro(cx, n, callee.macro, a.pos, a.npos, a.kwn, a.kwv, a.nkw, out);
    else if (callee.k == JV_FUNC) st = call_func(cx, n, callee.fn, &a, out);
    else if (callee.k == JV_UNDEF) st = jinja_undef_err(n, callee);
    else st = jinja_err(MOE_ERR_FORMAT, n, "'%s' object is not callable", jv_type_name(callee));
    args_free(&a);
done:
    jv_free(&callee);
    jv_free(&obj);
    return st;
}
