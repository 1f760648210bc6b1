/* jinja_value.c - the template value type and its Python behaviour:
 * truthiness, equality, str() and repr() for printing, json.dumps for the
 * tojson filter, float repr, generators with deferred errors, and UTF-8
 * code point helpers (Python indexes strings by code point).  Lists and dicts are Jansson arrays and objects
 * (objects keep insertion order, as Python dicts do). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/chat/jinja/jinja.h"

/* ---- buffers ---- */

enum moe_status jbuf_add(struct jbuf *b, const char *s, size_t n)
{
    size_t need;
    if (!moe_add_size(b->n, n + 1, &need)) return moe_fail(MOE_ERR_NOMEM, "chat template: size overflow");
    if (b->limit && b->n + n > b->limit)
        return moe_fail(MOE_ERR_FORMAT, "chat template: rendered text exceeds the limit of %zu bytes", b->limit);
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory");
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return MOE_OK;
}

enum moe_status jbuf_addc(struct jbuf *b, char c) { return jbuf_add(b, &c, 1); }

static enum moe_status jbuf_adds(struct jbuf *b, const char *s) { return jbuf_add(b, s, strlen(s)); }

void jbuf_free(struct jbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- UTF-8 ---- */

size_t ju_decode(const char *s, size_t n, int32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t len = u[0] < 0x80 ? 1 : (u[0] >> 5) == 6 ? 2 : (u[0] >> 4) == 14 ? 3 : (u[0] >> 3) == 30 ? 4 : 1;
    if (len > n) len = 1;
    if (len == 1) {
        *cp = u[0];
        return 1;
    }
    int32_t c = u[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xc0) != 0x80) {
            *cp = u[0];
            return 1;
        }
        c = (c << 6) | (u[i] & 0x3f);
    }
    *cp = c;
    return len;
}

size_t ju_cp_count(const char *s, size_t n)
{
    size_t c = 0;
    int32_t cp;
    for (size_t i = 0; i < n; c++) i += ju_decode(s + i, n - i, &cp);
    return c;
}

size_t ju_cp_offset(const char *s, size_t n, size_t idx)
{
    size_t i = 0;
    int32_t cp;
    for (size_t c = 0; c < idx && i < n; c++) i += ju_decode(s + i, n - i, &cp);
    return i;
}

bool ju_isspace(int32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* ---- values ---- */

void jv_free(struct jv *v)
{
    json_decref(v->j);
    *v = jv_undef();
}

struct jv jv_copy(struct jv v)
{
    json_incref(v.j);
    return v;
}

bool jv_oom(struct jv v)
{
    return !v.j && (v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_NS || v.k == JV_LOOP ||
                    v.k == JV_GEN || v.k == JV_METHOD);
}

struct jv jv_str(const char *s, size_t n) { return jv_wrap(JV_STR, json_stringn_nocheck(s ? s : "", n)); }

bool jv_is_str(struct jv v) { return v.k == JV_STR; }
const char *jv_sdata(struct jv v) { return json_string_value(v.j); }
size_t jv_slen(struct jv v) { return json_string_length(v.j); }

/* An Undefined kept in a list, dict or namespace (Python keeps the object):
 * a json object whose only key is "\0u" (a NUL byte cannot occur in keys
 * of parsed JSON), holding the undefined's message or null. */
#define UNDEF_KEY "\0u"
#define UNDEF_KEY_LEN 2

static bool is_undef_json(json_t *j)
{
    return json_is_object(j) && json_object_size(j) == 1 && json_object_getn(j, UNDEF_KEY, UNDEF_KEY_LEN);
}

/* A bound method: a json object whose only key is "\0m", holding
 * [receiver, name, receiver's jv_kind, receiver's markup flag]. */
#define METHOD_KEY "\0m"
#define METHOD_KEY_LEN 2

static json_t *method_parts(json_t *j)
{
    return json_is_object(j) && json_object_size(j) == 1 ? json_object_getn(j, METHOD_KEY, METHOD_KEY_LEN) : NULL;
}

struct jv jv_method(struct jv recv, const char *name)
{
    json_t *o = json_object(), *recv_j = jv_to_json(recv);
    json_t *parts = recv_j ? json_pack("[osib]", recv_j, name, (int)recv.k, (int)recv.b) : NULL;
    if (!o || !parts || json_object_setn_new_nocheck(o, METHOD_KEY, METHOD_KEY_LEN, parts)) {
        json_decref(o);
        return jv_wrap(JV_METHOD, NULL);
    }
    return jv_wrap(JV_METHOD, o);
}

struct jv jv_method_receiver(struct jv m)
{
    json_t *p = method_parts(m.j);
    struct jv r = jv_from_json(json_array_get(p, 0));
    r.k = (enum jv_kind)json_integer_value(json_array_get(p, 2)); /* int, bool, str, list, dict or loop */
    r.b = r.b || json_is_true(json_array_get(p, 3));
    return r;
}

const char *jv_method_name(struct jv m) { return json_string_value(json_array_get(method_parts(m.j), 1)); }

struct jv jv_from_json(json_t *j)
{
    if (is_undef_json(j)) {
        json_t *hint = json_object_getn(j, UNDEF_KEY, UNDEF_KEY_LEN);
        return jv_wrap(JV_UNDEF, json_is_string(hint) ? json_incref(hint) : NULL);
    }
    if (method_parts(j)) return jv_wrap(JV_METHOD, json_incref(j));
    switch (json_typeof(j)) {
    case JSON_OBJECT: return jv_wrap(JV_DICT, json_incref(j));
    case JSON_ARRAY: return jv_wrap(JV_LIST, json_incref(j));
    case JSON_STRING: return jv_wrap(JV_STR, json_incref(j));
    case JSON_INTEGER: return jv_int(json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    default: return jv_none();
    }
}

json_t *jv_to_json(struct jv v)
{
    switch (v.k) {
    case JV_STR: case JV_LIST: case JV_DICT: case JV_NS: case JV_LOOP: case JV_GEN: case JV_METHOD:
        return json_incref(v.j);
    case JV_BOOL: return json_boolean(v.b);
    case JV_INT: return json_integer(v.i);
    case JV_FLOAT: return json_real(v.f);
    case JV_UNDEF: {
        json_t *o = json_object();
        if (o && json_object_setn_new_nocheck(o, UNDEF_KEY, UNDEF_KEY_LEN, v.j ? json_incref(v.j) : json_null())) {
            json_decref(o);
            return NULL;
        }
        return o;
    }
    default: return json_null();
    }
}

const char *jv_type_name(struct jv v)
{
    switch (v.k) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_DICT: return "dict";
    case JV_NS: return "TemplateNamespace"; /* transformers' subclass of jinja2's Namespace */
    case JV_LOOP: return "LoopContext";
    case JV_GEN: return "generator";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_METHOD: return "builtin_function_or_method";
    }
    return "object";
}

bool jv_truthy(struct jv v)
{
    switch (v.k) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STR: return json_string_length(v.j) > 0;
    case JV_LIST: return json_array_size(v.j) > 0;
    case JV_DICT: return json_object_size(v.j) > 0;
    default: return true;
    }
}

static bool json_py_equal(json_t *a, json_t *b);

static bool is_num(json_t *j) { return json_is_number(j) || json_is_boolean(j); }
static double num_val(json_t *j) { return json_is_boolean(j) ? (json_is_true(j) ? 1 : 0) : json_number_value(j); }

static bool json_py_equal(json_t *a, json_t *b)
{
    if (is_undef_json(a) || is_undef_json(b)) return is_undef_json(a) && is_undef_json(b);
    json_t *ma = method_parts(a), *mb = method_parts(b);
    if (ma || mb) /* Python: the same receiver object (identity) and the same method */
        return ma && mb && json_array_get(ma, 0) == json_array_get(mb, 0) &&
               json_py_equal(json_array_get(ma, 1), json_array_get(mb, 1));
    if (is_num(a) && is_num(b)) {
        if (json_is_integer(a) && json_is_integer(b)) return json_integer_value(a) == json_integer_value(b);
        return num_val(a) == num_val(b);
    }
    if (json_typeof(a) != json_typeof(b)) return false;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!json_py_equal(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k;
        json_t *va;
        json_object_foreach(a, k, va) {
            json_t *vb = json_object_get(b, k);
            if (!vb || !json_py_equal(va, vb)) return false;
        }
        return true;
    }
    default: return true; /* null */
    }
}

bool jv_equal(struct jv a, struct jv b)
{
    bool an = a.k == JV_BOOL || a.k == JV_INT || a.k == JV_FLOAT;
    bool bn = b.k == JV_BOOL || b.k == JV_INT || b.k == JV_FLOAT;
    if (an && bn) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT)
            return (a.k == JV_BOOL ? a.b : a.i) == (b.k == JV_BOOL ? b.b : b.i);
        double x = a.k == JV_FLOAT ? a.f : a.k == JV_BOOL ? a.b : (double)a.i;
        double y = b.k == JV_FLOAT ? b.f : b.k == JV_BOOL ? b.b : (double)b.i;
        return x == y;
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: case JV_LIST: case JV_DICT: case JV_LOOP: case JV_METHOD: return json_py_equal(a.j, b.j);
    case JV_NS: return a.j == b.j; /* no __eq__: identity */
    case JV_MACRO: return a.macro == b.macro;
    case JV_FUNC: return a.fn == b.fn;
    default: return false;
    }
}

/* ---- generators ---- */

enum moe_status jinja_gen_check(struct jv v)
{
    if (v.k == JV_GEN && json_is_string(v.j)) return moe_fail(MOE_ERR_FORMAT, "%s", json_string_value(v.j));
    return MOE_OK;
}

enum moe_status jinja_gen_result(enum moe_status st, json_t *list, struct jv *out)
{
    if (st == MOE_OK) {
        *out = jv_wrap(JV_GEN, list);
        return MOE_OK;
    }
    json_decref(list);
    if (st != MOE_ERR_FORMAT) return st;
    *out = jv_wrap(JV_GEN, json_string(moe_last_error()));
    return jv_oom(*out) ? moe_fail(MOE_ERR_NOMEM, "chat template: out of memory") : MOE_OK;
}

/* ---- float repr ---- */

void jv_float_repr(double f, char out[40])
{
    if (isnan(f)) { strcpy(out, "nan"); return; }
    if (isinf(f)) { strcpy(out, f > 0 ? "inf" : "-inf"); return; }
    if (f == 0) { strcpy(out, signbit(f) ? "-0.0" : "0.0"); return; }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.' && nd < sizeof digits - 1) digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    char *o = out;
    if (neg) *o++ = '-';
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++) *o++ = (size_t)i < nd ? digits[i] : '0';
            *o++ = '.';
            if ((size_t)exp + 1 < nd) {
                for (size_t i = (size_t)exp + 1; i < nd; i++) *o++ = digits[i];
            } else {
                *o++ = '0';
            }
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -exp - 1; i++) *o++ = '0';
            for (size_t i = 0; i < nd; i++) *o++ = digits[i];
        }
        *o = '\0';
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (size_t i = 1; i < nd; i++) *o++ = digits[i];
        }
        int ae = exp < 0 ? -exp : exp;
        *o++ = 'e';
        *o++ = exp < 0 ? '-' : '+';
        if (ae >= 100) *o++ = (char)('0' + ae / 100 % 10);
        *o++ = (char)('0' + ae / 10 % 10);
        *o++ = (char)('0' + ae % 10);
        *o = '\0';
    }
}

/* ---- repr / str ---- */

static enum moe_status py_str_repr(struct jbuf *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    MOE_TRY(jbuf_addc(b, q));
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t l = ju_decode(s + i, n - i, &cp);
        char esc[12] = {0};
        if (cp == '\\') strcpy(esc, "\\\\");
        else if (cp == q) snprintf(esc, sizeof esc, "\\%c", q);
        else if (cp == '\n') strcpy(esc, "\\n");
        else if (cp == '\r') strcpy(esc, "\\r");
        else if (cp == '\t') strcpy(esc, "\\t");
        else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) snprintf(esc, sizeof esc, "\\x%02x", cp);
        if (esc[0]) MOE_TRY(jbuf_adds(b, esc));
        else MOE_TRY(jbuf_add(b, s + i, l));
        i += l;
    }
    return jbuf_addc(b, q);
}

/* Python prints these objects with their address. */
static enum moe_status unprintable(const char *what)
{
    return moe_fail(MOE_ERR_UNSUPPORTED, "chat template: printing %s is not supported; Python prints its address",
                    what);
}

static enum moe_status json_repr(struct jbuf *b, json_t *j, int depth)
{
    if (depth > 200) return moe_fail(MOE_ERR_FORMAT, "chat template: value nested too deeply to print");
    if (is_undef_json(j)) return jbuf_adds(b, "Undefined");
    if (method_parts(j)) return unprintable("a method");
    char num[40];
    switch (json_typeof(j)) {
    case JSON_STRING: return py_str_repr(b, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: snprintf(num, sizeof num, "%lld", (long long)json_integer_value(j)); return jbuf_adds(b, num);
    case JSON_REAL: jv_float_repr(json_real_value(j), num); return jbuf_adds(b, num);
    case JSON_TRUE: return jbuf_adds(b, "True");
    case JSON_FALSE: return jbuf_adds(b, "False");
    case JSON_NULL: return jbuf_adds(b, "None");
    case JSON_ARRAY:
        MOE_TRY(jbuf_addc(b, '['));
        for (size_t i = 0; i < json_array_size(j); i++) {
            if (i) MOE_TRY(jbuf_adds(b, ", "));
            MOE_TRY(json_repr(b, json_array_get(j, i), depth + 1));
        }
        return jbuf_addc(b, ']');
    case JSON_OBJECT: {
        MOE_TRY(jbuf_addc(b, '{'));
        const char *k;
        size_t klen;
        json_t *v;
        bool first = true;
        json_object_keylen_foreach(j, k, klen, v) {
            if (!first) MOE_TRY(jbuf_adds(b, ", "));
            first = false;
            MOE_TRY(py_str_repr(b, k, klen));
            MOE_TRY(jbuf_adds(b, ": "));
            MOE_TRY(json_repr(b, v, depth + 1));
        }
        return jbuf_addc(b, '}');
    }
    }
    return MOE_OK;
}

enum moe_status jv_str_append(struct jbuf *b, struct jv v)
{
    char num[40];
    switch (v.k) {
    case JV_UNDEF: return MOE_OK;
    case JV_NONE: return jbuf_adds(b, "None");
    case JV_BOOL: return jbuf_adds(b, v.b ? "True" : "False");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.i); return jbuf_adds(b, num);
    case JV_FLOAT: jv_float_repr(v.f, num); return jbuf_adds(b, num);
    case JV_STR: return jbuf_add(b, json_string_value(v.j), json_string_length(v.j));
    case JV_LIST: case JV_DICT: return json_repr(b, v.j, 0);
    case JV_NS:
        MOE_TRY(jbuf_adds(b, "<Namespace "));
        MOE_TRY(json_repr(b, v.j, 0));
        return jbuf_addc(b, '>');
    case JV_LOOP: return jbuf_adds(b, "<LoopContext>");
    case JV_GEN: return unprintable("a generator (a map/select/reject result)");
    case JV_METHOD: return unprintable("a method");
    case JV_MACRO:
        MOE_TRY(jbuf_adds(b, "<Macro '"));
        MOE_TRY(jbuf_adds(b, v.macro->str));
        return jbuf_adds(b, "'>");
    case JV_FUNC: return jbuf_adds(b, "<built-in function>");
    }
    return MOE_OK;
}

enum moe_status jv_repr_append(struct jbuf *b, struct jv v)
{
    if (v.k == JV_UNDEF) return jbuf_adds(b, "Undefined");
    if (v.k == JV_STR && !v.b) return py_str_repr(b, jv_sdata(v), jv_slen(v));
    if (v.k == JV_STR) { /* markupsafe.Markup.__repr__ */
        MOE_TRY(jbuf_adds(b, "Markup("));
        MOE_TRY(py_str_repr(b, jv_sdata(v), jv_slen(v)));
        return jbuf_addc(b, ')');
    }
    return jv_str_append(b, v);
}

/* ---- json.dumps ---- */

static enum moe_status json_str_dump(struct jbuf *b, const char *s, size_t n)
{
    MOE_TRY(jbuf_addc(b, '"'));
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (esc) {
            MOE_TRY(jbuf_add(b, s + i - run, run));
            run = 0;
            MOE_TRY(jbuf_adds(b, esc));
        } else {
            run++;
        }
    }
    MOE_TRY(jbuf_add(b, s + n - run, run));
    return jbuf_addc(b, '"');
}

static enum moe_status newline_indent(struct jbuf *b, int indent, int level)
{
    MOE_TRY(jbuf_addc(b, '\n'));
    for (int i = 0; i < indent * level; i++) MOE_TRY(jbuf_addc(b, ' '));
    return MOE_OK;
}

struct dump_opts {
    int indent;
    const char *item_sep, *key_sep;
    bool sort_keys;
};

static int key_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static enum moe_status dump(struct jbuf *b, json_t *j, const struct dump_opts *o, int level)
{
    if (level > 200) return moe_fail(MOE_ERR_FORMAT, "chat template: tojson value nested too deeply");
    if (is_undef_json(j)) return moe_fail(MOE_ERR_FORMAT, "chat template: Object of type Undefined is not JSON serializable");
    if (method_parts(j))
        return moe_fail(MOE_ERR_FORMAT, "chat template: Object of type builtin_function_or_method is not JSON serializable");
    char num[40];
    switch (json_typeof(j)) {
    case JSON_STRING: return json_str_dump(b, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: snprintf(num, sizeof num, "%lld", (long long)json_integer_value(j)); return jbuf_adds(b, num);
    case JSON_REAL: {
        double f = json_real_value(j);
        if (isnan(f)) return jbuf_adds(b, "NaN");
        if (isinf(f)) return jbuf_adds(b, f > 0 ? "Infinity" : "-Infinity");
        jv_float_repr(f, num);
        return jbuf_adds(b, num);
    }
    case JSON_TRUE: return jbuf_adds(b, "true");
    case JSON_FALSE: return jbuf_adds(b, "false");
    case JSON_NULL: return jbuf_adds(b, "null");
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (!n) return jbuf_adds(b, "[]");
        MOE_TRY(jbuf_addc(b, '['));
        for (size_t i = 0; i < n; i++) {
            if (i) MOE_TRY(jbuf_adds(b, o->item_sep));
            if (o->indent >= 0) MOE_TRY(newline_indent(b, o->indent, level + 1));
            MOE_TRY(dump(b, json_array_get(j, i), o, level + 1));
        }
        if (o->indent >= 0) MOE_TRY(newline_indent(b, o->indent, level));
        return jbuf_addc(b, ']');
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(j);
        if (!n) return jbuf_adds(b, "{}");
        const char **keys = malloc(n * sizeof *keys);
        if (!keys) return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory");
        size_t k = 0;
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) keys[k++] = key;
        if (o->sort_keys) qsort(keys, n, sizeof *keys, key_cmp);
        enum moe_status st = jbuf_addc(b, '{');
        for (size_t i = 0; i < n && !st; i++) {
            if (i) st = jbuf_adds(b, o->item_sep);
            if (!st && o->indent >= 0) st = newline_indent(b, o->indent, level + 1);
            if (!st) st = json_str_dump(b, keys[i], strlen(keys[i]));
            if (!st) st = jbuf_adds(b, o->key_sep);
            if (!st) st = dump(b, json_object_get(j, keys[i]), o, level + 1);
        }
        free(keys);
        MOE_TRY(st);
        if (o->indent >= 0) MOE_TRY(newline_indent(b, o->indent, level));
        return jbuf_addc(b, '}');
    }
    }
    return MOE_OK;
}

enum moe_status jv_tojson_append(struct jbuf *b, json_t *v, int indent, const char *item_sep,
                                 const char *key_sep, bool sort_keys)
{
    struct dump_opts o = {.indent = indent, .sort_keys = sort_keys,
                          .item_sep = item_sep ? item_sep : indent >= 0 ? "," : ", ",
                          .key_sep = key_sep ? key_sep : ": "};
    return dump(b, v, &o, 0);
}
