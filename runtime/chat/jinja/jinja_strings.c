/* jinja_strings.c - Python's str methods (strip, split, replace, casing,
 * startswith/endswith), list() and dict.items() over template values, and
 * the join filter; shared by the filters (jinja_filters.c) and the methods
 * (jinja_builtins.c).  Strings are UTF-8 and handled by code point, with
 * Python's whitespace set (str.isspace) and utf8proc's simple case maps
 * (Python uses full case mapping: 'ß'.upper() is 'SS' there, 'ß' here). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "runtime/chat/jinja/jinja_builtins_impl.h"

enum moe_status jb_need_str(const struct jnode *at, struct jv *v, const char *what)
{
    if (!v || v->k != JV_STR)
        return jinja_err(MOE_ERR_FORMAT, at, "%s must be a string, not %s", what, v ? jv_type_name(*v) : "missing");
    return MOE_OK;
}

enum moe_status jb_to_str(struct jv v, struct jv *out)
{
    if (v.k == JV_STR) {
        *out = jv_copy(v);
        return MOE_OK;
    }
    struct jbuf b = {0};
    enum moe_status st = jv_str_append(&b, v);
    if (!st) {
        *out = jv_str(b.p, b.n);
        if (jv_oom(*out)) st = jb_nomem();
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
enum moe_status jb_strip(struct jv s, struct jv *chars, int which, struct jv *out)
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
    return jv_oom(*out) ? jb_nomem() : MOE_OK;
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' title filter, 'T' str.title. */
enum moe_status jb_recase(struct jv s, int mode, struct jv *out)
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
        if (jv_oom(*out)) st = jb_nomem();
    }
    jbuf_free(&b);
    return st;
}

enum moe_status jb_replace(const struct jnode *at, struct jv s, struct jv *old, struct jv *new_,
                               struct jv *count, struct jv *out)
{
    MOE_TRY(jb_need_str(at, old, "jb_replace() argument 1"));
    MOE_TRY(jb_need_str(at, new_, "jb_replace() argument 2"));
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
        if (jv_oom(*out)) st = jb_nomem();
    }
    jbuf_free(&b);
    return st;
}

enum moe_status jb_split(const struct jnode *at, struct jv s, struct jv *sep, struct jv *maxsplit,
                             struct jv *out)
{
    json_t *list = json_array();
    if (!list) return jb_nomem();
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
        enum moe_status st = jb_need_str(at, sep, "jb_split() separator");
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
        return jb_nomem();
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

enum moe_status jb_affix_any(const struct jnode *at, struct jv s, struct jv *x, bool end, struct jv *out)
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
    MOE_TRY(jb_need_str(at, x, end ? "endswith() argument" : "startswith() argument"));
    *out = jv_bool(affix(s, *x, end));
    return MOE_OK;
}

/* Items of v as a new json array (list(v) in Python). */
enum moe_status jb_to_list(const struct jnode *at, struct jv v, json_t **out)
{
    *out = NULL;
    MOE_TRY(jinja_gen_check(v));
    if (v.k == JV_LIST || v.k == JV_GEN) {
        *out = json_copy(v.j);
    } else if (v.k == JV_UNDEF) {
        *out = json_array();
    } else if (v.k == JV_DICT) {
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
    return *out ? MOE_OK : jb_nomem();
}

enum moe_status jb_dict_items(struct jv d, struct jv *out)
{
    json_t *list = json_array();
    if (!list) return jb_nomem();
    if (d.k == JV_DICT) {
        const char *k;
        size_t kl;
        json_t *x;
        json_object_keylen_foreach(d.j, k, kl, x) {
            if (json_array_append_new(list, json_pack("[s%O]", k, kl, x))) {
                json_decref(list);
                return jb_nomem();
            }
        }
    }
    *out = jv_wrap(JV_LIST, list);
    return MOE_OK;
}

enum moe_status jb_join(const struct jnode *at, struct jv v, struct args *a, struct jv *out)
{
    struct jv *sep = jb_arg(a, 0, "d"), *attr = jb_arg(a, 1, "attribute");
    if (sep && sep->k != JV_STR) return jinja_err(MOE_ERR_FORMAT, at, "join separator must be a string");
    json_t *items = NULL;
    MOE_TRY(jb_to_list(at, v, &items));
    struct jbuf b = {0};
    enum moe_status st = jbuf_add(&b, "", 0);
    for (size_t i = 0; !st && i < json_array_size(items); i++) {
        struct jv item = jv_from_json(json_array_get(items, i)), x = jv_undef();
        if (i && sep) st = jbuf_add(&b, jv_sdata(*sep), jv_slen(*sep));
        if (!st && attr && attr->k == JV_STR) st = jb_getattr_path(at, item, *attr, &x);
        else x = jv_copy(item);
        if (!st) st = jv_str_append(&b, x);
        jv_free(&item);
        jv_free(&x);
    }
    json_decref(items);
    if (!st) {
        *out = jv_str(b.p, b.n);
        if (jv_oom(*out)) st = jb_nomem();
    }
    jbuf_free(&b);
    return st;
}

enum moe_status jinja_html_escape(struct jv v, struct jv *out)
{
    if (v.k == JV_STR && v.b) {
        *out = jv_copy(v);
        return MOE_OK;
    }
    struct jv s;
    MOE_TRY(jb_to_str(v, &s));
    struct jbuf b = {0};
    enum moe_status st = jbuf_add(&b, "", 0);
    const char *p = jv_sdata(s);
    for (size_t i = 0, n = jv_slen(s); i < n && !st; i++) {
        switch (p[i]) {
        case '&': st = jbuf_add(&b, "&amp;", 5); break;
        case '<': st = jbuf_add(&b, "&lt;", 4); break;
        case '>': st = jbuf_add(&b, "&gt;", 4); break;
        case '"': st = jbuf_add(&b, "&#34;", 5); break;
        case '\'': st = jbuf_add(&b, "&#39;", 5); break;
        default: st = jbuf_addc(&b, p[i]);
        }
    }
    if (!st) {
        *out = jv_str(b.p, b.n);
        out->b = true;
        if (jv_oom(*out)) st = jb_nomem();
    }
    jbuf_free(&b);
    jv_free(&s);
    return st;
}
