/* json_schema.c - a JSON Schema into grammar text: the walk over the
 * schema, keywords checked against the supported subset, types, objects,
 * enum/const, anyOf/oneOf/allOf and local $ref (objects and arrays are in
 * json_schema_obj.c).
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

size_t jsc_path_push(struct jsc *c, const char *seg)
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

size_t jsc_path_push_index(struct jsc *c, size_t i)
{
    char n[24];
    snprintf(n, sizeof n, "%zu", i);
    return jsc_path_push(c, n);
}

void jsc_path_pop(struct jsc *c, size_t at)
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
enum moe_status jsc_sub_rule(struct jsc *c, const json_t *s, const char *key, long i, int *rule)
{
    size_t at = jsc_path_push(c, key);
    if (i >= 0) jsc_path_push_index(c, (size_t)i);
    enum moe_status st = schema_rule(c, s, rule);
    if (!st) jsc_path_pop(c, at);
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
        MOE_TRY(jsc_sub_rule(c, json_array_get(a, i), kw, (long)i, &r));
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
            jsc_path_push_index(c, i);
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
        return jsc_object(c, s, b);
    case T_ARR:
        if (!has_any(s, ARRAY_KW)) break;
        return jsc_array(c, s, b);
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
        size_t at = jsc_path_push(c, "allOf");
        enum moe_status st = all_of_merge(c, s, &m);
        if (!st) st = jsc_object(c, m, b);
        json_decref(m);
        if (!st) jsc_path_pop(c, at);
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

enum moe_status moe_json_schema_source(const json_t *schema, unsigned flags, char **src, size_t *len)
{
    *src = NULL;
    *len = 0;
    struct jsc c = {.root = schema};
    int root;
    jbuf_str(&c.out, flags & MOE_JSON_SCHEMA_WS_AROUND ? "root ::= ws s0 ws\n" : "root ::= s0\n");
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
    MOE_TRY(moe_json_schema_source(schema, 0, &src, &len));
    enum moe_status st = moe_grammar_parse(src, len, out);
    if (st) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", moe_last_error());
        st = moe_fail(st, "JSON Schema: a $ref cycle that reads no input (a schema that refers to itself "
                      "before any JSON token), or a schema too large to compile: %s", msg);
    }
    free(src);
    return st;
}
