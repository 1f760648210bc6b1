/* json_schema.c - a JSON Schema into grammar text: the walk over the
 * schema, keywords checked against the supported subset, types, objects,
 * arrays, enum/const, anyOf/oneOf/allOf and local $ref.
 *
 * Each schema becomes a rule "sN"; "root ::= s0".  A $ref target becomes
 * one rule, made on first use and named before its body is compiled, so a
 * recursive schema is a recursive grammar.  The JSON pieces every schema
 * shares (whitespace, a string character, any value) are the rules of
 * SHARED below, written as the json_object grammar writes them. */
#include "runtime/grammar/json_schema_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SHARED[] =
    "ws ::= ( \" \" | \"\\n\" \" \"{0,20} )?\n"
    "jchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "jstring ::= \"\\\"\" jchar* \"\\\"\"\n"
    "jnumber ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "jinteger ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "jvalue ::= jobject | jarray | jstring | jnumber | \"true\" | \"false\" | \"null\"\n"
    "jobject ::= \"{\" ws ( jstring ws \":\" ws jvalue ws ( \",\" ws jstring ws \":\" ws jvalue ws )* )? \"}\"\n"
    "jarray ::= \"[\" ws ( jvalue ws ( \",\" ws jvalue ws )* )? \"]\"\n";

/* Keywords that say nothing about validity. */
static const char *const ANNOTATIONS[] = {"title", "description", "$comment", "default", "examples",
                                          "deprecated", "readOnly", "writeOnly", "$schema", "$defs",
                                          "definitions", NULL};
/* The validation keywords of the subset (the rest are refused). */
static const char *const SUPPORTED[] = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                                        "properties", "required", "additionalProperties", "items",
                                        "prefixItems", "minItems", "maxItems", "uniqueItems",
                                        "minLength", "maxLength", "pattern", "format", "minimum",
                                        "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};

static bool in_list(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

static enum moe_status schema_rule(struct jsc *c, const json_t *s, int *rule);

/* ---- places: the JSON pointer of the schema being compiled ---- */

static size_t path_push(struct jsc *c, const char *seg)
{
    size_t at = c->path_len;
    char *p = c->path + at, *end = c->path + sizeof c->path - 4;
    if (p < end) *p++ = '/';
    for (const char *q = seg; *q && p < end; q++) {
        if (*q == '~' || *q == '/') {
            *p++ = '~';
            if (p < end) *p++ = *q == '~' ? '0' : '1';
        } else {
            *p++ = *q;
        }
    }
    *p = 0;
    c->path_len = (size_t)(p - c->path);
    return at;
}

static size_t path_push_index(struct jsc *c, size_t i)
{
    char n[24];
    snprintf(n, sizeof n, "%zu", i);
    return path_push(c, n);
}

static void path_pop(struct jsc *c, size_t at)
{
    c->path_len = at;
    c->path[at] = 0;
}

const char *jsc_where(const struct jsc *c) { return c->path_len ? c->path : "the root"; }

enum moe_status jsc_unsupported(const struct jsc *c, const char *kw)
{
    return moe_fail(MOE_ERR_UNSUPPORTED, "unsupported JSON Schema keyword \"%.64s\" at %s", kw, jsc_where(c));
}

enum moe_status jsc_fail(const struct jsc *c, const char *kw, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return moe_fail(MOE_ERR_UNSUPPORTED, "JSON Schema: \"%s\" at %s: %s", kw, jsc_where(c), msg);
}

/* ---- rules ---- */

enum moe_status jsc_new_rule(struct jsc *c, int *id)
{
    if (c->n_rules >= MOE_JSON_SCHEMA_MAX_RULES)
        return moe_fail(MOE_ERR_UNSUPPORTED, "JSON Schema: the grammar needs more than %d rules",
                        MOE_JSON_SCHEMA_MAX_RULES);
    *id = c->n_rules++;
    return MOE_OK;
}

enum moe_status jsc_emit_rule(struct jsc *c, int id, const struct jbuf *body)
{
    if (body->nomem) return moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
    jbuf_printf(&c->out, "s%d ::= ", id);
    jbuf_put(&c->out, body->p ? body->p : "", body->n);
    jbuf_str(&c->out, "\n");
    return c->out.nomem ? moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory") : MOE_OK;
}

/* A subschema's rule: s, at the place "key" (and index i when not -1). */
static enum moe_status sub_rule(struct jsc *c, const json_t *s, const char *key, long i, int *rule)
{
    size_t at = path_push(c, key);
    if (i >= 0) path_push_index(c, (size_t)i);
    enum moe_status st = schema_rule(c, s, rule);
    if (!st) path_pop(c, at);
    return st;
}

/* ---- $ref ---- */

/* The schema a local reference "#", "#/a/b" names, or NULL. */
static const json_t *resolve(const json_t *root, const char *ref)
{
    if (ref[0] != '#') return NULL;
    const json_t *cur = root;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        char seg[256];
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~') {
                if (p[1] != '0' && p[1] != '1') return NULL;
                ch = *++p == '0' ? '~' : '/';
            }
            if (ch == '%') return NULL; /* percent-encoding: not followed */
            if (n + 1 >= sizeof seg) return NULL;
            seg[n++] = ch;
        }
        seg[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg);
        } else if (json_is_array(cur)) {
            char *e;
            unsigned long k = strtoul(seg, &e, 10);
            cur = (*seg && !*e) ? json_array_get(cur, k) : NULL;
        } else {
            return NULL;
        }
        if (!cur) return NULL;
    }
    return cur;
}

static enum moe_status ref_rule(struct jsc *c, const char *ref, int *rule)
{
    for (int k = 0; k < c->n_refs; k++)
        if (!strcmp(c->refs[k].ptr, ref)) {
            *rule = c->refs[k].rule;
            return MOE_OK;
        }
    const json_t *t = resolve(c->root, ref);
    if (!t) return jsc_fail(c, "$ref", "'%.200s' is not a JSON pointer into this schema (only local "
                            "references \"#/...\" are followed)", ref);
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? 2 * c->cap_refs : 8;
        struct jsc_ref *q = realloc(c->refs, (size_t)cap * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
        c->refs = q;
        c->cap_refs = cap;
    }
    int id = 0, target;
    MOE_TRY(jsc_new_rule(c, &id));
    char *dup = strdup(ref);
    if (!dup) return moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
    c->refs[c->n_refs++] = (struct jsc_ref){dup, id};
    /* the target's own place, for messages inside it */
    char saved[sizeof c->path];
    size_t saved_len = c->path_len;
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref + 1);
    c->path_len = strlen(c->path);
    enum moe_status st = schema_rule(c, t, &target);
    if (st) return st;
    memcpy(c->path, saved, sizeof saved);
    c->path_len = saved_len;
    struct jbuf b = {0};
    jbuf_printf(&b, "s%d", target);
    st = jsc_emit_rule(c, id, &b);
    free(b.p);
    *rule = id;
    return st;
}

/* ---- objects ---- */

/* Property names from "properties", in the schema's order. */
static enum moe_status object_body(struct jsc *c, const json_t *s, struct jbuf *b)
{
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return jsc_fail(c, "properties", "must be an object");
    if (req && !json_is_array(req)) return jsc_fail(c, "required", "must be an array of strings");
    size_t n = json_object_size(props), k = 0;
    const char **names = calloc(n + 1, sizeof *names);
    bool *must = calloc(n + 1, sizeof *must);
    int *rules = calloc(n + 1, sizeof *rules);
    enum moe_status st = MOE_OK;
    if (!names || !must || !rules) {
        st = moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
        goto done;
    }
    const char *key;
    const json_t *ps;
    json_object_foreach((json_t *)props, key, ps) {
        size_t at = path_push(c, "properties");
        if (json_is_false(ps)) {
            path_push(c, key);
            st = jsc_fail(c, "properties", "a false schema (a property that may not appear) is not "
                          "supported");
            goto done;
        }
        st = sub_rule(c, ps, key, -1, &rules[k]);
        if (st) goto done;
        path_pop(c, at);
        names[k++] = key;
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *r = json_string_value(json_array_get(req, i));
        if (!r) {
            st = jsc_fail(c, "required", "must be an array of strings");
            goto done;
        }
        size_t j = 0;
        while (j < n && strcmp(names[j], r)) j++;
        if (j == n) {
            st = jsc_fail(c, "required", "'%.100s' is not in \"properties\" (required properties must "
                          "be declared there)", r);
            goto done;
        }
        must[j] = true;
    }
    /* extra: the grammar of one more key and value, or none */
    struct jbuf extra = {0};
    bool has_extra = !json_is_false(ap);
    if (ap && !json_is_boolean(ap) && !json_is_object(ap)) {
        st = jsc_fail(c, "additionalProperties", "must be a boolean or a schema");
        goto done;
    }
    if (has_extra) {
        int vr = -1;
        if (json_is_object(ap)) {
            st = sub_rule(c, ap, "additionalProperties", -1, &vr);
            if (st) goto done;
        }
        st = jsc_other_key(c, names, n, &extra);
        if (st) {
            free(extra.p);
            goto done;
        }
        if (vr >= 0) jbuf_printf(&extra, " ws \":\" ws s%d ws", vr);
        else jbuf_str(&extra, " ws \":\" ws jvalue ws");
    }
    /* rest(i): properties i.. after something was written, each after a
     * comma; the required ones must be there */
    int rest0 = c->n_rules;
    for (size_t i = 0; i <= n; i++) {
        int id;
        st = jsc_new_rule(c, &id);
        if (st) break;
    }
    for (size_t i = 0; i <= n && !st; i++) {
        struct jbuf r = {0};
        if (i == n) {
            if (has_extra) jbuf_printf(&r, "( \",\" ws %s )*", extra.p);
            else jbuf_str(&r, "\"\"");
        } else {
            jbuf_str(&r, must[i] ? "\",\" ws " : "( \",\" ws ");
            jbuf_key(&r, names[i]);
            jbuf_printf(&r, " ws \":\" ws s%d ws%s s%d", rules[i], must[i] ? "" : " )?", rest0 + (int)i + 1);
        }
        st = jsc_emit_rule(c, rest0 + (int)i, &r);
        free(r.p);
    }
    /* the first property written is some j with every one before it optional */
    jbuf_str(b, "\"{\" ws ( ");
    bool all_optional = true;
    for (size_t j = 0; j < n && !st; j++) {
        if (j) jbuf_str(b, " | ");
        jbuf_key(b, names[j]);
        jbuf_printf(b, " ws \":\" ws s%d ws s%d", rules[j], rest0 + (int)j + 1);
        if (must[j]) {
            all_optional = false;
            break;
        }
    }
    if (all_optional && has_extra) jbuf_printf(b, "%s( %s ( \",\" ws %s )* )?", n ? " | " : "", extra.p, extra.p);
    else if (all_optional) jbuf_str(b, n ? " | \"\"" : "\"\"");
    jbuf_str(b, " ) \"}\"");
    free(extra.p);
done:
    free(names);
    free(must);
    free(rules);
    return st;
}

/* ---- arrays ---- */

static enum moe_status get_count(struct jsc *c, const json_t *s, const char *kw, long long dflt, long long *v)
{
    const json_t *x = json_object_get(s, kw);
    *v = dflt;
    if (!x) return MOE_OK;
    double d = json_number_value(x);
    if (!json_is_number(x) || d < 0 || d != floor(d)) return jsc_fail(c, kw, "must be a non-negative integer");
    if (d > MOE_GRAMMAR_MAX_REPEAT)
        return jsc_fail(c, kw, "%.0f is more than the grammar can count (at most %d)", d, MOE_GRAMMAR_MAX_REPEAT);
    *v = (long long)d;
    return MOE_OK;
}

static enum moe_status array_body(struct jsc *c, const json_t *s, struct jbuf *b)
{
    const json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
    const json_t *uniq = json_object_get(s, "uniqueItems");
    long long lo, hi;
    MOE_TRY(get_count(c, s, "minItems", 0, &lo));
    MOE_TRY(get_count(c, s, "maxItems", -1, &hi));
    if (uniq && !json_is_false(uniq)) return jsc_unsupported(c, "uniqueItems");
    if (json_is_array(items))
        return jsc_fail(c, "items", "an array of schemas is the older drafts' form; write \"prefixItems\"");
    if (pre && !json_is_array(pre)) return jsc_fail(c, "prefixItems", "must be an array of schemas");
    if (items && !json_is_boolean(items) && !json_is_object(items))
        return jsc_fail(c, "items", "must be a schema");
    size_t m = json_array_size(pre);
    int tail = -1; /* the rule of items beyond the prefix; -2: none may follow */
    if (json_is_false(items)) tail = -2;
    else if (json_is_object(items)) MOE_TRY(sub_rule(c, items, "items", -1, &tail));
    if (hi < 0 && tail == -2) hi = (long long)m;
    if (hi >= 0 && lo > hi) return jsc_fail(c, "minItems", "is more than maxItems: no array is valid");
    if (tail == -2 && lo > (long long)m)
        return jsc_fail(c, "minItems", "is more than the %zu items allowed: no array is valid", m);
    if (hi >= 0 && (size_t)hi < m) m = (size_t)hi;
    int *pr = calloc(m + 1, sizeof *pr);
    if (!pr) return moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
    for (size_t i = 0; i < m; i++) {
        enum moe_status st = sub_rule(c, json_array_get(pre, i), "prefixItems", (long)i, &pr[i]);
        if (st) {
            free(pr);
            return st;
        }
    }
    /* element i (0-based): "," first unless i == 0; the prefix nested, the
     * tail counted: items lo.. up to hi (or any) */
    jbuf_str(b, "\"[\" ws ");
    if (hi == 0) {
        jbuf_str(b, "\"]\"");
        free(pr);
        return MOE_OK;
    }
    char tr[32];
    snprintf(tr, sizeof tr, tail >= 0 ? "s%d" : "jvalue", tail);
    int open = 0;
    for (size_t i = 0; i < m; i++) {
        bool opt = (long long)i >= lo;
        jbuf_printf(b, "%s%ss%d ws ", opt ? "( " : "", i ? "\",\" ws " : "", pr[i]);
        open += opt;
    }
    if (tail != -2 && (hi < 0 || (long long)m < hi)) {
        long long need = lo > (long long)m ? lo - (long long)m : 0;
        long long more = hi < 0 ? -1 : hi - (long long)m - need;
        if (m == 0) { /* the first element has no comma */
            bool opt = need == 0;
            jbuf_printf(b, "%s%s ws ", opt ? "( " : "", tr);
            open += opt;
            if (need) need--;
            else if (more > 0) more--;
        }
        if (need) jbuf_printf(b, "( \",\" ws %s ws ){%lld} ", tr, need);
        if (more < 0) jbuf_printf(b, "( \",\" ws %s ws )* ", tr);
        else if (more > 0) jbuf_printf(b, "( \",\" ws %s ws ){0,%lld} ", tr, more);
    }
    for (int k = 0; k < open; k++) jbuf_str(b, ")? ");
    jbuf_str(b, "\"]\"");
    free(pr);
    return MOE_OK;
}

/* ---- the combinators ---- */

static const char *const OBJECT_KW[] = {"properties", "required", "additionalProperties", NULL};
static const char *const ARRAY_KW[] = {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", NULL};
static const char *const STRING_KW[] = {"minLength", "maxLength", "pattern", "format", NULL};
static const char *const NUMBER_KW[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};

/* The first validation keyword of s outside allowed (NULL: none). */
static const char *other_keyword(const json_t *s, const char *const *allowed)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (in_list(SUPPORTED, k) && !in_list(allowed, k)) return k;
    }
    return NULL;
}

static bool has_any(const json_t *s, const char *const *kw)
{
    for (; *kw; kw++)
        if (json_object_get(s, *kw)) return true;
    return false;
}

enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_NUM = 32, T_INT = 64, T_ALL = 127 };

static int type_bit(const char *t)
{
    static const char *const names[] = {"null", "boolean", "object", "array", "string", "number", "integer"};
    for (int k = 0; k < 7; k++)
        if (t && !strcmp(t, names[k])) return 1 << k;
    return 0;
}

static enum moe_status type_set(struct jsc *c, const json_t *s, int *types)
{
    const json_t *t = json_object_get(s, "type");
    *types = t ? 0 : T_ALL;
    if (!t) return MOE_OK;
    size_t n = json_is_array(t) ? json_array_size(t) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
        int bit = type_bit(json_string_value(x));
        if (!bit) return jsc_fail(c, "type", "must be one of null, boolean, object, array, string, number, "
                                  "integer, or an array of them");
        *types |= bit;
    }
    if (!*types) return jsc_fail(c, "type", "an empty list of types accepts nothing");
    return MOE_OK;
}

static bool literal_has_type(const json_t *v, int types)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return types & T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return types & T_BOOL;
    case JSON_OBJECT: return types & T_OBJ;
    case JSON_ARRAY: return types & T_ARR;
    case JSON_STRING: return types & T_STR;
    case JSON_INTEGER: return types & (T_NUM | T_INT);
    case JSON_REAL: {
        double d = json_real_value(v);
        return (types & T_NUM) || ((types & T_INT) && d == floor(d));
    }
    }
    return false;
}

/* enum / const, with type as the only other validation keyword. */
static enum moe_status enum_body(struct jsc *c, const json_t *s, struct jbuf *b)
{
    static const char *const allowed[] = {"enum", "const", "type", NULL};
    const char *kw = json_object_get(s, "enum") ? "enum" : "const";
    const char *o = other_keyword(s, allowed);
    if (o) return jsc_fail(c, kw, "\"%s\" next to it is not supported", o);
    if (json_object_get(s, "enum") && json_object_get(s, "const"))
        return jsc_fail(c, "const", "both \"enum\" and \"const\" are not supported");
    int types;
    MOE_TRY(type_set(c, s, &types));
    const json_t *e = json_object_get(s, "enum");
    if (e && (!json_is_array(e) || !json_array_size(e))) return jsc_fail(c, "enum", "must be a non-empty array");
    size_t n = e ? json_array_size(e) : 1, written = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = e ? json_array_get(e, i) : json_object_get(s, "const");
        if (!literal_has_type(v, types)) continue;
        if (written++) jbuf_str(b, " | ");
        jbuf_str(b, "( ");
        MOE_TRY(jsc_literal(c, v, b));
        jbuf_str(b, " )");
    }
    if (!written) return jsc_fail(c, kw, "no value of it has the schema's \"type\": the schema accepts nothing");
    return MOE_OK;
}

static enum moe_status any_of_body(struct jsc *c, const json_t *s, const char *kw, struct jbuf *b)
{
    static const char *const allowed[] = {"anyOf", "oneOf", NULL};
    const char *o = other_keyword(s, allowed);
    if (o) return jsc_fail(c, kw, "\"%s\" next to it is not supported (move it into each branch)", o);
    if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf"))
        return jsc_fail(c, kw, "both \"anyOf\" and \"oneOf\" are not supported");
    const json_t *a = json_object_get(s, kw);
    if (!json_is_array(a) || !json_array_size(a)) return jsc_fail(c, kw, "must be a non-empty array of schemas");
    for (size_t i = 0; i < json_array_size(a); i++) {
        int r;
        MOE_TRY(sub_rule(c, json_array_get(a, i), kw, (long)i, &r));
        jbuf_printf(b, "%ss%d", i ? " | " : "", r);
    }
    return MOE_OK;
}

/* allOf of object schemas (type object, properties, required) whose
 * properties are disjoint: one object schema with all of them. */
static enum moe_status all_of_merge(struct jsc *c, const json_t *s, json_t **out)
{
    static const char *const parent_ok[] = {"allOf", "type", NULL};
    static const char *const member_ok[] = {"type", "properties", "required", NULL};
    const json_t *a = json_object_get(s, "allOf"), *t = json_object_get(s, "type");
    const char *o = other_keyword(s, parent_ok);
    if (o || (t && type_bit(json_string_value(t)) != T_OBJ))
        return jsc_fail(c, "allOf", "only object schemas (\"type\": \"object\", \"properties\", "
                        "\"required\") with disjoint properties and nothing beside allOf can be combined");
    if (!json_is_array(a) || !json_array_size(a)) return jsc_fail(c, "allOf", "must be a non-empty array of schemas");
    json_t *props = json_object(), *req = json_array();
    *out = json_pack("{s:s, s:o, s:o}", "type", "object", "properties", props, "required", req);
    if (!*out) return moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *m = json_array_get(a, i);
        for (int hop = 0; json_is_object(m) && json_object_get(m, "$ref") && hop < MOE_JSON_SCHEMA_MAX_DEPTH; hop++)
            m = resolve(c->root, json_string_value(json_object_get(m, "$ref")) ? json_string_value(json_object_get(m, "$ref")) : "");
        const json_t *mt = json_is_object(m) ? json_object_get(m, "type") : NULL;
        const json_t *mp = json_is_object(m) ? json_object_get(m, "properties") : NULL;
        const json_t *mr = json_is_object(m) ? json_object_get(m, "required") : NULL;
        const char *k;
        json_t *v;
        bool ok = json_is_object(m) && !other_keyword(m, member_ok) && (!mt || type_bit(json_string_value(mt)) == T_OBJ) &&
                  (!mp || json_is_object(mp)) && (!mr || json_is_array(mr));
        json_object_foreach((json_t *)mp, k, v) {
            if (!ok || json_object_get(props, k)) {
                ok = false;
                break;
            }
            json_object_set(props, k, v);
        }
        if (ok && mr) json_array_extend(req, (json_t *)mr);
        if (!ok) {
            json_decref(*out);
            *out = NULL;
            path_push_index(c, i);
            return jsc_fail(c, "allOf", "only object schemas (\"type\": \"object\", \"properties\", "
                            "\"required\") with disjoint properties can be combined");
        }
    }
    return MOE_OK;
}

/* The branch of one type. */
static enum moe_status type_branch(struct jsc *c, const json_t *s, int bit, struct jbuf *b)
{
    switch (bit) {
    case T_NULL: jbuf_str(b, "\"null\""); return MOE_OK;
    case T_BOOL: jbuf_str(b, "\"true\" | \"false\""); return MOE_OK;
    case T_OBJ:
        if (!has_any(s, OBJECT_KW)) break;
        return object_body(c, s, b);
    case T_ARR:
        if (!has_any(s, ARRAY_KW)) break;
        return array_body(c, s, b);
    case T_STR:
        if (!has_any(s, STRING_KW)) break;
        return jsc_string(c, s, b);
    case T_NUM:
    case T_INT:
        if (!has_any(s, NUMBER_KW)) break;
        return jsc_number(c, s, bit == T_INT, b);
    }
    static const char *const generic[] = {"", "", "jobject", "jarray", "jstring", "jnumber", "jinteger"};
    for (int k = 0; k < 7; k++)
        if (bit == 1 << k) jbuf_str(b, generic[k]);
    return MOE_OK;
}

static enum moe_status typed_body(struct jsc *c, const json_t *s, struct jbuf *b)
{
    int types;
    MOE_TRY(type_set(c, s, &types));
    if (types & T_NUM) types &= ~T_INT;
    int written = 0;
    for (int bit = 1; bit <= T_INT; bit <<= 1) {
        if (!(types & bit)) continue;
        jbuf_str(b, written++ ? " | ( " : "( ");
        MOE_TRY(type_branch(c, s, bit, b));
        jbuf_str(b, " )");
    }
    return MOE_OK;
}

static enum moe_status check_keywords(struct jsc *c, const json_t *s)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (!strcmp(k, "$id") && c->path_len == 0 && c->depth == 1) continue;
        if (!in_list(ANNOTATIONS, k) && !in_list(SUPPORTED, k)) return jsc_unsupported(c, k);
    }
    return MOE_OK;
}

static enum moe_status schema_body(struct jsc *c, const json_t *s, struct jbuf *b)
{
    if (json_is_true(s)) {
        jbuf_str(b, "jvalue");
        return MOE_OK;
    }
    if (json_is_false(s))
        return moe_fail(MOE_ERR_UNSUPPORTED, "JSON Schema: the false schema at %s accepts nothing", jsc_where(c));
    if (!json_is_object(s))
        return moe_fail(MOE_ERR_FORMAT, "JSON Schema: the schema at %s is not an object or a boolean", jsc_where(c));
    MOE_TRY(check_keywords(c, s));
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        static const char *const alone[] = {"$ref", NULL};
        const char *o = other_keyword(s, alone);
        if (o) return jsc_fail(c, "$ref", "\"%s\" next to it is not supported", o);
        if (!json_is_string(ref)) return jsc_fail(c, "$ref", "must be a string");
        int r;
        MOE_TRY(ref_rule(c, json_string_value(ref), &r));
        jbuf_printf(b, "s%d", r);
        return MOE_OK;
    }
    if (json_object_get(s, "allOf")) {
        json_t *m = NULL;
        size_t at = path_push(c, "allOf");
        enum moe_status st = all_of_merge(c, s, &m);
        if (!st) st = object_body(c, m, b);
        json_decref(m);
        if (!st) path_pop(c, at);
        return st;
    }
    if (json_object_get(s, "anyOf")) return any_of_body(c, s, "anyOf", b);
    if (json_object_get(s, "oneOf")) return any_of_body(c, s, "oneOf", b);
    if (json_object_get(s, "enum") || json_object_get(s, "const")) return enum_body(c, s, b);
    return typed_body(c, s, b);
}

static enum moe_status schema_rule(struct jsc *c, const json_t *s, int *rule)
{
    if (c->depth >= MOE_JSON_SCHEMA_MAX_DEPTH)
        return moe_fail(MOE_ERR_UNSUPPORTED, "JSON Schema: nested deeper than %d schemas at %s",
                        MOE_JSON_SCHEMA_MAX_DEPTH, jsc_where(c));
    c->depth++;
    struct jbuf b = {0};
    enum moe_status st = jsc_new_rule(c, rule);
    if (!st) st = schema_body(c, s, &b);
    if (!st) st = jsc_emit_rule(c, *rule, &b);
    free(b.p);
    c->depth--;
    return st;
}

static void jsc_free(struct jsc *c)
{
    for (int k = 0; k < c->n_refs; k++) free(c->refs[k].ptr);
    free(c->refs);
    free(c->out.p);
}

enum moe_status moe_json_schema_source(const json_t *schema, char **src, size_t *len)
{
    *src = NULL;
    *len = 0;
    struct jsc c = {.root = schema};
    int root;
    jbuf_str(&c.out, "root ::= s0\n");
    jbuf_str(&c.out, SHARED);
    enum moe_status st = schema_rule(&c, schema, &root);
    if (!st && c.out.nomem) st = moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
    if (st) {
        jsc_free(&c);
        return st;
    }
    *src = c.out.p;
    *len = c.out.n;
    c.out.p = NULL;
    jsc_free(&c);
    return MOE_OK;
}

enum moe_status moe_json_schema_grammar(const json_t *schema, struct moe_grammar **out)
{
    *out = NULL;
    char *src;
    size_t len;
    MOE_TRY(moe_json_schema_source(schema, &src, &len));
    enum moe_status st = moe_grammar_parse(src, len, out);
    if (st) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", moe_last_error());
        st = moe_fail(st, "JSON Schema: %s (a $ref cycle that consumes no input, or a schema too large)", msg);
    }
    free(src);
    return st;
}
