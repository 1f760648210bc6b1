/* jinja_builtins.c - what templates call by name: attribute and item
 * lookup, call arguments, methods on str/dict/loop, and the globals
 * transformers provides (range, namespace, dict, raise_exception,
 * strftime_now).  Filters and tests are in jinja_filters.c.
 *
 * Lookups follow jinja2.sandbox: `a.b` is Python's attribute first, then
 * the item; `a[b]` the item first, then (for a string) the attribute; what
 * neither finds is Undefined (an error only when used), except on an
 * Undefined itself.  An attribute that is a method and is not called at
 * once is a JV_METHOD value (`d['items']` on a dict without that key is
 * dict.items, truthy and callable).  Lists and dicts are immutable
 * (ImmutableSandboxedEnvironment), so list.append and friends are unsafe
 * Undefineds, errors when called, as they are in transformers.  A method
 * Python has but this file does not implement is MOE_ERR_UNSUPPORTED naming
 * it and the template line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/chat/jinja/jinja_builtins_impl.h"

enum moe_status jb_nomem(void) { return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory"); }

/* jinja2.utils.object_type_repr: how Jinja names a value's type in
 * undefined messages ("'dict object' has no attribute 'x'"). */
static const char *obj_name(struct jv v)
{
    switch (v.k) {
    case JV_DICT: return "dict object";
    case JV_LIST: return "list object";
    case JV_STR: return v.b ? "markupsafe.Markup object" : "str object";
    case JV_NONE: return "None";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_BOOL: return "bool object";
    case JV_NS: return "transformers.utils.chat_template_utils.TemplateNamespace object";
    case JV_LOOP: return "jinja2.runtime.LoopContext object";
    case JV_GEN: return "generator object";
    case JV_MACRO: return "jinja2.runtime.Macro object";
    case JV_FUNC:
        return v.fn == JF_DICT        ? "transformers.utils.chat_template_utils.TemplateDict object"
               : v.fn == JF_NAMESPACE ? "type object" /* the TemplateNamespace class */
                                      : "function object";
    case JV_METHOD: return "builtin_function_or_method object";
    default: return "object";
    }
}

/* *out = an Undefined carrying Python's message: fmt takes obj_name(obj),
 * then repr(name). */
static enum moe_status undef_msg(const char *fmt, struct jv obj, struct jv name, struct jv *out)
{
    struct jbuf r = {.limit = 200};
    enum moe_status st = jv_repr_append(&r, name);
    if (st == MOE_ERR_NOMEM) return st;
    char msg[320];
    snprintf(msg, sizeof msg, fmt, obj_name(obj), st ? "..." : r.p ? r.p : "");
    jbuf_free(&r);
    *out = jv_wrap(JV_UNDEF, json_string(msg));
    return MOE_OK;
}

/* ---- Python attributes ----
 *
 * What getattr(obj, name) finds on the types a template sees, as
 * ImmutableSandboxedEnvironment filters it: every public method of str
 * (and Markup), list, dict, int, float and the loop object, except the
 * methods that modify a list or dict, which are "unsafe" (an Undefined
 * whose use raises SecurityError).  Names are sorted for bsearch. */

static const char *const str_attrs[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
    "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
    "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
    "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
    "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill"};
static const char *const markup_attrs[] = {"escape", "striptags", "unescape"}; /* besides str's */
static const char *const list_attrs[] = {"copy", "count", "index"};
static const char *const list_unsafe[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
static const char *const dict_attrs[] = {"copy", "fromkeys", "get", "items", "keys", "values"};
static const char *const dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};
static const char *const int_attrs[] = {"as_integer_ratio", "bit_count", "bit_length", "conjugate", "from_bytes",
                                        "to_bytes"};
static const char *const float_attrs[] = {"as_integer_ratio", "conjugate", "fromhex", "hex", "is_integer"};
static const char *const loop_attrs[] = {"changed", "cycle"};

static int name_cmp(const void *key, const void *elem) { return strcmp(key, *(const char *const *)elem); }
#define HAS(table, name) (bsearch((name), (table), sizeof(table) / sizeof(table)[0], sizeof(table)[0], name_cmp) != NULL)

/* Whether obj has a method called name: 1 yes, -1 an unsafe one, 0 no.
 * Names starting with '_' are never found: the sandbox hides them (and a
 * dict key of that name is then looked up instead). */
static int method_kind(struct jv obj, const char *name)
{
    if (name[0] == '_') return 0;
    switch (obj.k) {
    case JV_STR: return HAS(str_attrs, name) || (obj.b && HAS(markup_attrs, name));
    case JV_LIST: return HAS(list_attrs, name) ? 1 : HAS(list_unsafe, name) ? -1 : 0;
    case JV_DICT: return HAS(dict_attrs, name) ? 1 : HAS(dict_unsafe, name) ? -1 : 0;
    case JV_LOOP: return HAS(loop_attrs, name);
    case JV_INT: case JV_BOOL: return HAS(int_attrs, name);
    case JV_FLOAT: return HAS(float_attrs, name);
    default: return 0;
    }
}

/* getattr(obj, name) for the methods above and the number attributes
 * real, imag, numerator and denominator.  *found: whether obj has the
 * attribute (*out: its value, a method, or the unsafe Undefined); when
 * not, *out is left alone. */
static enum moe_status py_attr(struct jv obj, const char *name, bool *found, struct jv *out)
{
    bool num = obj.k == JV_INT || obj.k == JV_BOOL;
    *found = true;
    if (num || obj.k == JV_FLOAT) {
        if (!strcmp(name, "real") || (num && !strcmp(name, "numerator"))) {
            *out = obj.k == JV_FLOAT ? jv_float(obj.f) : jv_int(obj.k == JV_BOOL ? obj.b : obj.i);
            return MOE_OK;
        }
        if (!strcmp(name, "imag") || (num && !strcmp(name, "denominator"))) {
            *out = obj.k == JV_FLOAT ? jv_float(0.0) : jv_int(name[0] == 'd');
            return MOE_OK;
        }
    }
    int kind = method_kind(obj, name);
    *found = kind != 0;
    if (!kind) return MOE_OK;
    bool unsafe = kind < 0;
    if (unsafe) {
        char msg[160];
        snprintf(msg, sizeof msg, "access to attribute '%.40s' of '%s' object is unsafe.", name, jv_type_name(obj));
        *out = jv_wrap(JV_UNDEF, json_string(msg));
    } else {
        *out = jv_method(obj, name);
    }
    return jv_oom(*out) || (unsafe && !out->j) ? jb_nomem() : MOE_OK;
}

/* The sandbox's getattr: the Python attribute first, then the item
 * (dict key, namespace or loop variable), then Undefined. */
enum moe_status jinja_getattr(const struct jnode *at, struct jv obj, const char *name, struct jv *out)
{
    (void)at;
    bool found;
    MOE_TRY(py_attr(obj, name, &found, out));
    if (found) return MOE_OK;
    if (obj.k == JV_DICT || obj.k == JV_NS || obj.k == JV_LOOP) {
        json_t *v = json_object_get(obj.j, name);
        if (v) {
            *out = jv_from_json(v);
            return MOE_OK;
        }
    }
    struct jv key = jv_str(name, strlen(name));
    if (jv_oom(key)) return jb_nomem();
    enum moe_status st = undef_msg("'%s' has no attribute %s", obj, key, out);
    jv_free(&key);
    return st;
}

/* The sandbox's getitem: obj[key] (a dict key, a list or string index),
 * then, for a string key, the Python attribute of that name (so
 * `d['items']` on a dict without that key is the dict's items method),
 * then Undefined.  A namespace or loop has no [] of its own: a string key
 * is its attribute. */
enum moe_status jinja_getitem(const struct jnode *at, struct jv obj, struct jv key, struct jv *out)
{
    if (key.k == JV_STR) {
        if (obj.k == JV_NS || obj.k == JV_LOOP) return jinja_getattr(at, obj, jv_sdata(key), out);
        json_t *v = obj.k == JV_DICT ? json_object_getn(obj.j, jv_sdata(key), jv_slen(key)) : NULL;
        if (v) {
            *out = jv_from_json(v);
            return MOE_OK;
        }
        bool found = false;
        if (!memchr(jv_sdata(key), '\0', jv_slen(key))) MOE_TRY(py_attr(obj, jv_sdata(key), &found, out));
        return found ? MOE_OK : undef_msg("'%s' has no attribute %s", obj, key, out);
    }
    if ((key.k == JV_INT || key.k == JV_BOOL) && (obj.k == JV_LIST || obj.k == JV_STR)) {
        int64_t i = key.k == JV_BOOL ? key.b : key.i;
        int64_t n = obj.k == JV_LIST ? (int64_t)json_array_size(obj.j) : (int64_t)ju_cp_count(jv_sdata(obj), jv_slen(obj));
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            if (obj.k == JV_LIST) {
                *out = jv_from_json(json_array_get(obj.j, (size_t)i));
            } else {
                const char *s = jv_sdata(obj);
                size_t sn = jv_slen(obj), off = ju_cp_offset(s, sn, (size_t)i);
                int32_t cp;
                *out = jv_str(s + off, ju_decode(s + off, sn - off, &cp));
                if (jv_oom(*out)) return jb_nomem();
            }
            return MOE_OK;
        }
    }
    /* Not a string: Jinja names the key by its repr, without quoting the type. */
    return undef_msg("%s has no element %s", obj, key, out);
}

enum moe_status jb_getattr_path(const struct jnode *at, struct jv item, struct jv path, struct jv *out)
{
    const char *p = jv_sdata(path);
    size_t n = jv_slen(path);
    struct jv cur = jv_copy(item);
    for (size_t i = 0; i <= n;) {
        size_t e = i;
        while (e < n && p[e] != '.') e++;
        bool digits = e > i;
        for (size_t k = i; k < e; k++) digits &= p[k] >= '0' && p[k] <= '9';
        struct jv key = digits && e - i < 18 ? jv_int(strtoll(p + i, NULL, 10)) : jv_str(p + i, e - i);
        struct jv next = jv_undef();
        enum moe_status st = jv_oom(key)           ? jb_nomem()
                             : cur.k == JV_UNDEF ? jinja_undef_err(at, cur) /* Undefined[...] raises */
                                                 : jinja_getitem(at, cur, key, &next);
        jv_free(&key);
        jv_free(&cur);
        if (st) return st;
        cur = next;
        i = e + 1;
    }
    *out = cur;
    return MOE_OK;
}

/* ---- call arguments ---- */


void jb_args_free(struct args *a)
{
    for (size_t i = 0; i < a->npos; i++) jv_free(&a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++) jv_free(&a->kwv[i]);
    a->npos = a->nkw = 0;
}

enum moe_status jb_args_eval(struct jctx *cx, const struct jnode *n, struct args *a)
{
    memset(a, 0, sizeof *a);
    if (n->args.n > MAX_ARGS || n->kwargs.n > MAX_ARGS)
        return jinja_err(MOE_ERR_UNSUPPORTED, n, "more than %d arguments in one call", MAX_ARGS);
    for (size_t i = 0; i < n->args.n; i++) {
        enum moe_status st = jinja_eval(cx, n->args.v[i], &a->pos[i]);
        a->npos = i + 1;
        if (st) {
            jb_args_free(a);
            return st;
        }
    }
    for (size_t i = 0; i < n->kwargs.n; i++) {
        a->kwn[i] = n->kwargs.v[i]->str;
        enum moe_status st = jinja_eval(cx, n->kwargs.v[i]->a, &a->kwv[i]);
        a->nkw = i + 1;
        if (st) {
            jb_args_free(a);
            return st;
        }
    }
    return MOE_OK;
}

/* Positional i or keyword name; NULL if absent.  (A filter's operand is not
 * among its arguments: i counts from the first argument in parentheses.) */
struct jv *jb_arg(struct args *a, size_t i, const char *name)
{
    for (size_t k = 0; k < a->nkw; k++)
        if (name && !strcmp(a->kwn[k], name)) return &a->kwv[k];
    return i < a->npos ? &a->pos[i] : NULL;
}

/* ---- calls ---- */

static enum moe_status call_method(struct jctx *cx, const struct jnode *n, struct jv obj, const char *m,
                                   struct args *a, struct jv *out)
{
    (void)cx;
    if (obj.k == JV_STR) {
        if (!strcmp(m, "strip")) return jb_strip(obj, jb_arg(a, 0, NULL), 3, out);
        if (!strcmp(m, "lstrip")) return jb_strip(obj, jb_arg(a, 0, NULL), 1, out);
        if (!strcmp(m, "rstrip")) return jb_strip(obj, jb_arg(a, 0, NULL), 2, out);
        if (!strcmp(m, "split")) return jb_split(n, obj, jb_arg(a, 0, "sep"), jb_arg(a, 1, "maxsplit"), out);
        if (!strcmp(m, "startswith")) return jb_affix_any(n, obj, jb_arg(a, 0, NULL), false, out);
        if (!strcmp(m, "endswith")) return jb_affix_any(n, obj, jb_arg(a, 0, NULL), true, out);
        if (!strcmp(m, "upper")) return jb_recase(obj, 'u', out);
        if (!strcmp(m, "lower")) return jb_recase(obj, 'l', out);
        if (!strcmp(m, "capitalize")) return jb_recase(obj, 'c', out);
        if (!strcmp(m, "title")) return jb_recase(obj, 'T', out);
        if (!strcmp(m, "replace")) return jb_replace(n, obj, jb_arg(a, 0, NULL), jb_arg(a, 1, NULL), jb_arg(a, 2, NULL), out);
        if (!strcmp(m, "join")) {
            struct args ja = {.npos = 1};
            ja.pos[0] = obj;
            return jb_join(n, a->npos ? a->pos[0] : jv_undef(), &ja, out);
        }
        if (!strcmp(m, "find") || !strcmp(m, "count")) {
            MOE_TRY(jb_need_str(n, jb_arg(a, 0, NULL), "argument"));
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
    } else if (obj.k == JV_DICT) {
        if (!strcmp(m, "get")) {
            struct jv *k = jb_arg(a, 0, NULL), *d = jb_arg(a, 1, NULL);
            json_t *x = k && k->k == JV_STR ? json_object_getn(obj.j, jv_sdata(*k), jv_slen(*k)) : NULL;
            *out = x ? jv_from_json(x) : d ? jv_copy(*d) : jv_none();
            return MOE_OK;
        }
        if (!strcmp(m, "items")) return jb_dict_items(obj, out);
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            json_t *list = json_array();
            if (!list) return jb_nomem();
            const char *k;
            json_t *x;
            json_object_foreach(obj.j, k, x) {
                if (json_array_append_new(list, m[0] == 'k' ? json_string_nocheck(k) : json_incref(x))) {
                    json_decref(list);
                    return jb_nomem();
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
    } else if (obj.k == JV_LIST && !strcmp(m, "count")) {
        struct jv *x = jb_arg(a, 0, NULL);
        if (!x) return jinja_err(MOE_ERR_FORMAT, n, "count() takes exactly one argument (0 given)");
        int64_t c = 0;
        for (size_t i = 0; i < json_array_size(obj.j); i++) {
            struct jv e = jv_from_json(json_array_get(obj.j, i));
            c += jv_equal(e, *x);
            jv_free(&e);
        }
        *out = jv_int(c);
        return MOE_OK;
    } else if (obj.k == JV_UNDEF) {
        return jinja_undef_err(n, obj);
    }
    /* Python has the method (method_kind), this file does not implement it. */
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
        if (!list) return jb_nomem();
        for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
            if (json_array_append_new(list, json_integer(i))) {
                json_decref(list);
                return jb_nomem();
            }
        }
        *out = jv_wrap(JV_LIST, list);
        return MOE_OK;
    }
    case JF_NAMESPACE:
    case JF_DICT: {
        json_t *o = json_object();
        if (!o) return jb_nomem();
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
                st = jb_nomem();
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
        MOE_TRY(jb_to_str(a->npos ? a->pos[0] : jv_undef(), &s));
        enum moe_status st = jinja_err(MOE_ERR_FORMAT, n, "%s", jv_sdata(s));
        jv_free(&s);
        return st;
    }
    case JF_STRFTIME: {
        struct jv *f = jb_arg(a, 0, NULL);
        MOE_TRY(jb_need_str(n, f, "strftime_now format"));
        struct tm tm;
        char buf[256];
        time_t t = cx->now;
        if (!localtime_r(&t, &tm)) return jinja_err(MOE_ERR_FORMAT, n, "strftime_now: time out of range");
        size_t len = strftime(buf, sizeof buf, jv_sdata(*f), &tm);
        *out = jv_str(buf, len);
        return jv_oom(*out) ? jb_nomem() : MOE_OK;
    }
    }
    return jinja_err(MOE_ERR_FORMAT, n, "internal: unknown function");
}

/* Calls a value: a macro, a global function, a method value. */
static enum moe_status call_value(struct jctx *cx, const struct jnode *n, struct jv callee, struct args *a,
                                  struct jv *out)
{
    switch (callee.k) {
    case JV_MACRO: return jinja_call_macro(cx, n, callee.macro, a->pos, a->npos, a->kwn, a->kwv, a->nkw, out);
    case JV_FUNC: return call_func(cx, n, callee.fn, a, out);
    case JV_METHOD: {
        struct jv recv = jv_method_receiver(callee);
        enum moe_status st = call_method(cx, n, recv, jv_method_name(callee), a, out);
        jv_free(&recv);
        return st;
    }
    case JV_UNDEF: return jinja_undef_err(n, callee);
    default: return jinja_err(MOE_ERR_FORMAT, n, "'%s' object is not callable", jv_type_name(callee));
    }
}

enum moe_status jinja_call(struct jctx *cx, const struct jnode *n, struct jv *out)
{
    struct jv callee = jv_undef(), obj = jv_undef();
    struct args a;
    enum moe_status st;
    const struct jnode *c = n->a;
    bool method = false; /* obj.name(...) with a method of obj: called without making a method value */
    if (c->kind == JN_GETATTR) {
        MOE_TRY(jinja_eval(cx, c->a, &obj));
        if (obj.k == JV_UNDEF) st = jinja_undef_err(n, obj);
        else if ((method = method_kind(obj, c->str) == 1)) st = MOE_OK;
        else st = jinja_getattr(n, obj, c->str, &callee);
        if (st) goto done;
    } else {
        MOE_TRY(jinja_eval(cx, c, &callee));
    }
    st = jb_args_eval(cx, n, &a);
    if (st) goto done;
    st = method ? call_method(cx, n, obj, c->str, &a, out) : call_value(cx, n, callee, &a, out);
    jb_args_free(&a);
done:
    jv_free(&callee);
    jv_free(&obj);
    return st;
}
