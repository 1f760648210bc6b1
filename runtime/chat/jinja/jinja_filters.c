/* jinja_filters.c - the filters and tests templates use, with Jinja's
 * semantics (jinja2.filters / jinja2.tests) and transformers' tojson
 * (json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=)).
 * A filter or test not here is MOE_ERR_UNSUPPORTED naming it and the line,
 * raised when the template reaches it. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <utf8proc.h>

#include "runtime/chat/jinja/jinja_builtins_impl.h"

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
        *r = v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_LOOP || v.k == JV_GEN || v.k == JV_UNDEF;
    else if (!strcmp(name, "callable")) /* Undefined too: it has __call__ (which raises) */
        *r = v.k == JV_MACRO || v.k == JV_FUNC || v.k == JV_METHOD || v.k == JV_UNDEF;
    else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        /* value % 2 == 1, value % 2 == 0, value % num == 0, with Python's %. */
        struct jv *d = name[0] == 'd' ? a1 : NULL;
        if (name[0] == 'd' && !d) return jinja_err(MOE_ERR_FORMAT, at, "divisibleby needs an argument");
        bool xn = v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL;
        bool dn = !d || d->k == JV_INT || d->k == JV_FLOAT || d->k == JV_BOOL;
        if (v.k == JV_UNDEF) return jinja_undef_err(at, v);
        if (!xn || !dn)
            return jinja_err(MOE_ERR_FORMAT, at, "unsupported operand type(s) for %%: '%s' and '%s'", jv_type_name(v),
                             d ? jv_type_name(*d) : "int");
        double x = v.k == JV_FLOAT ? v.f : v.k == JV_BOOL ? v.b : (double)v.i;
        double m = !d ? 2 : d->k == JV_FLOAT ? d->f : d->k == JV_BOOL ? d->b : (double)d->i;
        if (m == 0) return jinja_err(MOE_ERR_FORMAT, at, "integer division or modulo by zero");
        double rem;
        if (v.k != JV_FLOAT && (!d || d->k != JV_FLOAT)) {
            int64_t xi = v.k == JV_BOOL ? v.b : v.i, mi = (int64_t)m, ri = mi == -1 ? 0 : xi % mi;
            if (ri != 0 && ((ri < 0) != (mi < 0))) ri += mi;
            rem = (double)ri;
        } else {
            rem = fmod(x, m);
            if (rem != 0 && ((rem < 0) != (m < 0))) rem += m;
        }
        *r = name[0] == 'o' ? rem == 1 : rem == 0;
    } else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        /* str(value).islower() / .isupper(): some cased character, and
         * none of the other case. */
        struct jv s;
        MOE_TRY(jb_to_str(v, &s));
        const char *p = jv_sdata(s);
        size_t len = jv_slen(s);
        bool cased = false, other = false;
        for (size_t i = 0; i < len;) {
            int32_t cp;
            i += ju_decode(p + i, len - i, &cp);
            bool is_lower = utf8proc_toupper(cp) != cp || utf8proc_get_property(cp)->category == UTF8PROC_CATEGORY_LL;
            bool is_upper = utf8proc_tolower(cp) != cp || utf8proc_get_property(cp)->category == UTF8PROC_CATEGORY_LU ||
                            utf8proc_get_property(cp)->category == UTF8PROC_CATEGORY_LT;
            cased |= name[0] == 'l' ? is_lower : is_upper;
            other |= name[0] == 'l' ? is_upper : is_lower;
        }
        jv_free(&s);
        *r = cased && !other;
    } else {
        static const struct { const char *name; int op; } cmp[] = {
            {"eq", JOP_EQ}, {"equalto", JOP_EQ}, {"==", JOP_EQ}, {"ne", JOP_NE}, {"!=", JOP_NE},
            {"lt", JOP_LT}, {"lessthan", JOP_LT}, {"le", JOP_LE}, {"gt", JOP_GT}, {"greaterthan", JOP_GT},
            {"ge", JOP_GE}, {"in", JOP_IN}, {"sameas", JOP_EQ}};
        for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
            if (strcmp(name, cmp[i].name)) continue;
            if (!a1) return jinja_err(MOE_ERR_FORMAT, at, "test '%s' needs an argument", name);
            struct jv res;
            if (cmp[i].op == JOP_EQ && v.k == JV_METHOD && !strcmp(name, "sameas"))
                *r = v.j == a1->j; /* each lookup makes a new method object, as in Python */
            else if (cmp[i].op == JOP_EQ) *r = jv_equal(v, *a1) && (strcmp(name, "sameas") || v.k == a1->k);
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
    enum moe_status st = jb_args_eval(cx, n, &a);
    bool r = false;
    if (!st) st = run_test(cx, n, n->str, v, jb_arg(&a, 0, NULL), &r);
    if (!st) *out = jv_bool(r != (n->op == 1));
    jb_args_free(&a);
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
        MOE_TRY(jb_to_str(v, &s));
        enum moe_status st = name[0] == 't' && name[1] == 'r' ? jb_strip(s, NULL, 3, out)
                             : jb_recase(s, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 'c' ? 'c' : 't', out);
        jv_free(&s);
        return st;
    }
    if (!strcmp(name, "string")) return jb_to_str(v, out);
    if (!strcmp(name, "safe")) {
        if (v.k == JV_STR) {
            *out = jv_copy(v);
            out->b = true;
            return MOE_OK;
        }
        MOE_TRY(jb_to_str(v, out));
        out->b = true;
        return MOE_OK;
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e")) return jinja_html_escape(v, out);
    if (!strcmp(name, "forceescape")) {
        struct jv plain = v;
        plain.b = false;
        return jinja_html_escape(plain, out);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v.k == JV_STR) *out = jv_int((int64_t)ju_cp_count(jv_sdata(v), jv_slen(v)));
        else if (v.k == JV_LIST) *out = jv_int((int64_t)json_array_size(v.j));
        else if (v.k == JV_DICT) *out = jv_int((int64_t)json_object_size(v.j));
        else if (v.k == JV_UNDEF) *out = jv_int(0);
        else return jinja_err(MOE_ERR_FORMAT, at, "object of type '%s' has no len()", jv_type_name(v));
        return MOE_OK;
    }
    *found = false;
    return MOE_OK;
}

static enum moe_status filter_tojson(const struct jnode *at, struct jv v, struct args *a, struct jv *out)
{
    struct jv *ind = jb_arg(a, 0, "indent"), *ea = jb_arg(a, 1, "ensure_ascii"), *sep = jb_arg(a, 2, "separators"),
              *sk = jb_arg(a, 3, "sort_keys");
    if (ea && jv_truthy(*ea)) return jinja_err(MOE_ERR_UNSUPPORTED, at, "tojson(ensure_ascii=True) is not supported");
    if (ind && ind->k != JV_INT && ind->k != JV_NONE)
        return jinja_err(MOE_ERR_UNSUPPORTED, at, "tojson indent other than an integer is not supported");
    if (v.k == JV_UNDEF) return jinja_err(MOE_ERR_FORMAT, at, "Object of type Undefined is not JSON serializable");
    if (v.k == JV_MACRO || v.k == JV_FUNC || v.k == JV_GEN || v.k == JV_METHOD || v.k == JV_NS)
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
                           : jb_nomem();
    json_decref(j);
    if (!st) {
        *out = jv_str(b.p, b.n);
        if (jv_oom(*out)) st = jb_nomem();
    }
    jbuf_free(&b);
    return st;
}

static enum moe_status select_items(struct jctx *cx, const struct jnode *at, const char *name, struct jv v,
                                    struct args *a, struct jv *out)
{
    bool by_attr = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr");
    bool reject = name[0] == 'r';
    struct jv *attr = by_attr ? jb_arg(a, 0, NULL) : NULL;
    struct jv *test = jb_arg(a, by_attr ? 1 : 0, NULL);
    struct jv *targ = jb_arg(a, by_attr ? 2 : 1, NULL);
    if (by_attr) MOE_TRY(jb_need_str(at, attr, "attribute name"));
    if (test && test->k != JV_STR) return jinja_err(MOE_ERR_FORMAT, at, "test name must be a string");
    json_t *items = NULL, *kept = json_array();
    /* Jinja iterates only `if value`: none and undefined give nothing. */
    enum moe_status st = !kept ? jb_nomem() : jv_truthy(v) ? jb_to_list(at, v, &items) : MOE_OK;
    for (size_t i = 0; !st && i < json_array_size(items); i++) {
        struct jv item = jv_from_json(json_array_get(items, i)), x = jv_undef();
        bool r;
        if (by_attr) st = jb_getattr_path(at, item, *attr, &x);
        else x = jv_copy(item);
        if (!st) {
            if (test) st = run_test(cx, at, jv_sdata(*test), x, targ, &r);
            else r = jv_truthy(x);
        }
        if (!st && r != reject && json_array_append(kept, json_array_get(items, i))) st = jb_nomem();
        jv_free(&item);
        jv_free(&x);
    }
    json_decref(items);
    return jinja_gen_result(st, kept, out);
}

static enum moe_status filter_map(struct jctx *cx, const struct jnode *at, struct jv v, struct args *a, struct jv *out)
{
    (void)cx;
    struct jv *attr = jb_arg(a, 99, "attribute"), *def = jb_arg(a, 99, "default"), *fname = jb_arg(a, 0, NULL);
    if (!attr && (!fname || fname->k != JV_STR))
        return jinja_err(MOE_ERR_UNSUPPORTED, at, "map() is supported with attribute= or a filter name only");
    if (attr) MOE_TRY(jb_need_str(at, attr, "map attribute"));
    json_t *items = NULL, *res = json_array();
    enum moe_status st = !res ? jb_nomem() : jv_truthy(v) ? jb_to_list(at, v, &items) : MOE_OK;
    for (size_t i = 0; !st && i < json_array_size(items); i++) {
        struct jv item = jv_from_json(json_array_get(items, i)), x = jv_undef();
        if (attr) {
            st = jb_getattr_path(at, item, *attr, &x);
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
        if (!st && json_array_append_new(res, jv_to_json(x))) st = jb_nomem();
        jv_free(&item);
        jv_free(&x);
    }
    json_decref(items);
    return jinja_gen_result(st, res, out);
}

/* Python's str.splitlines() boundaries; returns the separator length at p
 * (0: none). */
static size_t line_break(const char *p, size_t n)
{
    int32_t cp;
    size_t l = ju_decode(p, n, &cp);
    if (cp == '\r') return n > 1 && p[1] == '\n' ? 2 : 1;
    if (cp == '\n' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 || cp == 0x2028 ||
        cp == 0x2029)
        return l;
    return 0;
}

/* jinja2.filters.do_indent(s, width=4, first=False, blank=False). */
static enum moe_status filter_indent(const struct jnode *at, struct jv v, struct args *a, struct jv *out)
{
    struct jv *w = jb_arg(a, 0, "width"), *first = jb_arg(a, 1, "first"), *blank = jb_arg(a, 2, "blank");
    struct jbuf ind = {0}, b = {0};
    enum moe_status st = MOE_OK;
    if (w && w->k == JV_STR) st = jbuf_add(&ind, jv_sdata(*w), jv_slen(*w));
    else if (w && w->k != JV_INT) st = jinja_err(MOE_ERR_FORMAT, at, "indent width must be an integer or a string");
    else for (int64_t i = 0; i < (w ? w->i : 4) && !st; i++) st = jbuf_addc(&ind, ' ');
    if (!st) st = jbuf_add(&ind, "", 0);
    struct jv s = jv_undef();
    /* do_indent does s += "\n", then s.splitlines(): strings only. */
    if (!st && v.k == JV_UNDEF) st = jinja_undef_err(at, v);
    else if (!st && v.k == JV_LIST) /* list += "\n" works, then .splitlines() fails */
        st = jinja_err(MOE_ERR_FORMAT, at, "'list' object has no attribute 'splitlines'");
    else if (!st && v.k != JV_STR)
        st = jinja_err(MOE_ERR_FORMAT, at, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(v));
    if (!st) s = jv_copy(v);
    if (st) goto done;
    /* (s + "\n").splitlines(): every segment between line breaks, the last
     * one included even when empty. */
    const char *p = jv_sdata(s);
    size_t n = jv_slen(s), i = 0;
    bool first_line = true;
    st = jbuf_add(&b, "", 0);
    if (!st && first && jv_truthy(*first)) st = jbuf_add(&b, ind.p, ind.n);
    while (!st && i <= n) {
        size_t e = i, sep = 0;
        while (e < n && !(sep = line_break(p + e, n - e))) {
            int32_t cp;
            e += ju_decode(p + e, n - e, &cp);
        }
        if (!first_line) {
            st = jbuf_addc(&b, '\n');
            if (!st && (e > i || (blank && jv_truthy(*blank)))) st = jbuf_add(&b, ind.p, ind.n);
        }
        if (!st) st = jbuf_add(&b, p + i, e - i);
        first_line = false;
        i = e + (e < n ? sep : 1);
    }
    if (!st) {
        *out = jv_str(b.p, b.n);
        out->b = s.b;
        if (jv_oom(*out)) st = jb_nomem();
    }
done:
    jv_free(&s);
    jbuf_free(&ind);
    jbuf_free(&b);
    return st;
}

/* Sorting for sort / dictsort / unique keys: numbers with numbers, strings
 * with strings (lowercased unless case_sensitive), as Python compares. */
struct sort_item {
    struct jv key;
    size_t index; /* original position: Python's sort is stable */
};
struct sort_ctx {
    bool bad;
    const char *t1, *t2; /* the first pair that did not compare: later item's type first, as Python reports */
    bool reverse; /* descending keys; equal keys keep their order, as in Python */
};

static int cmp_keys(const void *x, const void *y, void *ctxp)
{
    const struct sort_item *a = x, *b = y;
    struct sort_ctx *ctx = ctxp;
    int c = 0;
    bool an = a->key.k == JV_INT || a->key.k == JV_FLOAT || a->key.k == JV_BOOL;
    bool bn = b->key.k == JV_INT || b->key.k == JV_FLOAT || b->key.k == JV_BOOL;
    if (an && bn) {
        double p = a->key.k == JV_FLOAT ? a->key.f : a->key.k == JV_BOOL ? a->key.b : (double)a->key.i;
        double q = b->key.k == JV_FLOAT ? b->key.f : b->key.k == JV_BOOL ? b->key.b : (double)b->key.i;
        c = p < q ? -1 : p > q;
    } else if (a->key.k == JV_STR && b->key.k == JV_STR) {
        size_t na = jv_slen(a->key), nb = jv_slen(b->key);
        int m = memcmp(jv_sdata(a->key), jv_sdata(b->key), na < nb ? na : nb);
        c = m ? m : na < nb ? -1 : na > nb;
    } else if (!ctx->bad) {
        ctx->bad = true;
        const struct sort_item *later = a->index > b->index ? a : b, *earlier = later == a ? b : a;
        ctx->t1 = jv_type_name(later->key);
        ctx->t2 = jv_type_name(earlier->key);
    }
    if (c) return ctx->reverse ? -c : c;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* The sort key of an item: item[attribute] or the item, lowercased when a
 * string and not case_sensitive. */
static enum moe_status sort_key(const struct jnode *at, struct jv item, struct jv *attr, bool case_sensitive,
                                struct jv *key)
{
    struct jv k = jv_undef();
    if (attr && attr->k == JV_STR) MOE_TRY(jb_getattr_path(at, item, *attr, &k));
    else k = jv_copy(item);
    if (k.k == JV_STR && !case_sensitive) {
        enum moe_status st = jb_recase(k, 'l', key);
        jv_free(&k);
        return st;
    }
    *key = k;
    return MOE_OK;
}

/* sort(reverse, case_sensitive, attribute), dictsort(case_sensitive, by,
 * reverse), unique(case_sensitive, attribute). */
static enum moe_status filter_sorted(const struct jnode *at, const char *name, struct jv v, struct args *a,
                                     struct jv *out)
{
    bool dict = name[0] == 'd', uniq = name[0] == 'u';
    struct jv *rev = jb_arg(a, dict ? 2 : uniq ? 99 : 0, "reverse");
    struct jv *cs = jb_arg(a, dict || uniq ? 0 : 1, "case_sensitive");
    struct jv *attr = dict ? NULL : jb_arg(a, uniq ? 1 : 2, "attribute");
    struct jv *by = dict ? jb_arg(a, 1, "by") : NULL;
    bool by_value = by && by->k == JV_STR && !strcmp(jv_sdata(*by), "value");
    if (by && !(by->k == JV_STR && (by_value || !strcmp(jv_sdata(*by), "key"))))
        return jinja_err(MOE_ERR_FORMAT, at, "You can only sort by either \"key\" or \"value\"");
    json_t *items = NULL;
    enum moe_status st;
    if (dict) {
        if (v.k != JV_DICT) return jinja_err(MOE_ERR_FORMAT, at, "dictsort needs a mapping, not %s", jv_type_name(v));
        struct jv pairs;
        MOE_TRY(jb_dict_items(v, &pairs));
        items = json_incref(pairs.j);
        jv_free(&pairs);
    } else {
        st = jb_to_list(at, v, &items);
        if (st) return uniq ? jinja_gen_result(st, NULL, out) : st; /* unique is a generator */
    }
    size_t n = json_array_size(items);
    struct sort_item *si = calloc(n ? n : 1, sizeof *si);
    json_t *res = json_array();
    st = si && res ? MOE_OK : jb_nomem();
    for (size_t i = 0; i < n && !st; i++) {
        struct jv item = jv_from_json(json_array_get(items, i));
        struct jv base = dict ? jv_from_json(json_array_get(item.j, by_value ? 1 : 0)) : jv_copy(item);
        st = sort_key(at, base, attr, cs && jv_truthy(*cs), &si[i].key);
        si[i].index = i;
        jv_free(&base);
        jv_free(&item);
    }
    struct sort_ctx ctx = {0};
    if (!st && uniq) {
        for (size_t i = 0; i < n && !st; i++) {
            if (si[i].key.k == JV_LIST || si[i].key.k == JV_DICT) { /* do_unique keeps a set */
                st = jinja_err(MOE_ERR_FORMAT, at, "unhashable type: '%s'", jv_type_name(si[i].key));
                break;
            }
            bool seen = false;
            for (size_t j = 0; j < i && !seen; j++) seen = jv_equal(si[i].key, si[j].key);
            if (!seen && json_array_append(res, json_array_get(items, i))) st = jb_nomem();
        }
    } else if (!st) {
        ctx.reverse = rev && jv_truthy(*rev);
        qsort_r(si, n, sizeof *si, cmp_keys, &ctx);
        if (ctx.bad)
            st = jinja_err(MOE_ERR_FORMAT, at, "'<' not supported between instances of '%s' and '%s'", ctx.t1, ctx.t2);
        for (size_t i = 0; i < n && !st; i++)
            if (json_array_append(res, json_array_get(items, si[i].index))) st = jb_nomem();
    }
    for (size_t i = 0; si && i < n; i++) jv_free(&si[i].key);
    free(si);
    json_decref(items);
    if (uniq) return jinja_gen_result(st, res, out); /* errors show when consumed */
    if (st) {
        json_decref(res);
        return st;
    }
    *out = jv_wrap(JV_LIST, res);
    return MOE_OK;
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
        MOE_TRY(jb_to_str(v, &s));
        enum moe_status st = jb_strip(s, jb_arg(a, 0, "chars"), 3, out);
        jv_free(&s);
        return st;
    }
    if (!strcmp(name, "tojson")) return filter_tojson(n, v, a, out);
    if (!strcmp(name, "replace")) {
        MOE_TRY(jb_to_str(v, &s));
        enum moe_status st = jb_replace(n, s, jb_arg(a, 0, "old"), jb_arg(a, 1, "new"), jb_arg(a, 2, "count"), out);
        jv_free(&s);
        return st;
    }
    if (!strcmp(name, "join")) return jb_join(n, v, a, out);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        struct jv *def = jb_arg(a, 0, "default_value"), *boolean = jb_arg(a, 1, "boolean");
        bool use = v.k == JV_UNDEF || (boolean && jv_truthy(*boolean) && !jv_truthy(v));
        *out = use ? (def ? jv_copy(*def) : jv_str("", 0)) : jv_copy(v);
        return jv_oom(*out) ? jb_nomem() : MOE_OK;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        json_t *items = NULL;
        if (name[0] == 'l' && v.k == JV_GEN) return jinja_err(MOE_ERR_FORMAT, n, "'generator' object is not reversible");
        MOE_TRY(jb_to_list(n, v, &items));
        size_t len = json_array_size(items);
        *out = len ? jv_from_json(json_array_get(items, name[0] == 'f' ? 0 : len - 1))
                   : jv_wrap(JV_UNDEF, json_string("No first item, sequence was empty."));
        json_decref(items);
        return MOE_OK;
    }
    if (!strcmp(name, "list")) {
        json_t *items = NULL;
        MOE_TRY(jb_to_list(n, v, &items));
        *out = jv_wrap(JV_LIST, items);
        return MOE_OK;
    }
    if (!strcmp(name, "reverse")) {
        if (v.k == JV_STR) {
            const char *p = jv_sdata(v);
            size_t len = jv_slen(v);
            char *r = malloc(len + 1);
            if (!r) return jb_nomem();
            for (size_t i = 0; i < len;) {
                int32_t cp;
                size_t l = ju_decode(p + i, len - i, &cp);
                memcpy(r + len - i - l, p + i, l);
                i += l;
            }
            *out = jv_str(r, len);
            free(r);
            return jv_oom(*out) ? jb_nomem() : MOE_OK;
        }
        json_t *items = NULL, *rev = json_array();
        if (!rev) return jb_nomem();
        enum moe_status st = jb_to_list(n, v, &items);
        for (size_t i = json_array_size(items); !st && i-- > 0;)
            if (json_array_append(rev, json_array_get(items, i))) st = jb_nomem();
        json_decref(items);
        if (st) {
            json_decref(rev);
            return st;
        }
        *out = jv_wrap(JV_GEN, rev); /* reversed(list): an iterator */
        return MOE_OK;
    }
    if (!strcmp(name, "items")) {
        /* do_items is a generator: a non-mapping fails when it is consumed. */
        if (v.k != JV_DICT && v.k != JV_UNDEF)
            return jinja_gen_result(jinja_err(MOE_ERR_FORMAT, n, "Can only get item pairs from a mapping."), NULL,
                                    out);
        MOE_TRY(jb_dict_items(v, out));
        out->k = JV_GEN;
        return MOE_OK;
    }
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        bool fl = name[0] == 'f';
        if (v.k == JV_UNDEF) return jinja_undef_err(n, v); /* int(Undefined) raises */
        struct jv *def = jb_arg(a, 0, "default");
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
    if (!strcmp(name, "indent")) return filter_indent(n, v, a, out);
    if (!strcmp(name, "sort") || !strcmp(name, "dictsort") || !strcmp(name, "unique"))
        return filter_sorted(n, name, v, a, out);
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
    enum moe_status st = jb_args_eval(cx, n, &a);
    if (!st) st = apply_filter(cx, n, n->str, v, &a, out);
    jb_args_free(&a);
    jv_free(&v);
    return st;
}
