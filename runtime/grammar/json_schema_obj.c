/* json_schema_obj.c - objects and arrays for the JSON Schema compiler.
 *
 * An object's properties are written in the schema's order; the required
 * ones must be there, the optional ones may be left out.  The first
 * property written is some j whose predecessors are all optional; after
 * it, rule rest(i) writes properties i.. each after a comma, so the
 * grammar grows linearly with the properties.  Keys beyond "properties"
 * (additionalProperties true or a schema) come after the declared ones,
 * written without escapes (jsc_other_key).
 *
 * An array is its prefixItems in order, then items, counted by minItems
 * and maxItems (at most 1000, the grammar's largest count). */
#include "runtime/grammar/json_schema_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Property names from "properties", in the schema's order. */
enum moe_status jsc_object(struct jsc *c, const json_t *s, struct jbuf *b)
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
        size_t at = jsc_path_push(c, "properties");
        if (json_is_false(ps)) {
            jsc_path_push(c, key);
            st = jsc_fail(c, "properties", "a false schema (a property that may not appear) is not "
                          "supported");
            goto done;
        }
        st = jsc_sub_rule(c, ps, key, -1, &rules[k]);
        if (st) goto done;
        jsc_path_pop(c, at);
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
            st = jsc_sub_rule(c, ap, "additionalProperties", -1, &vr);
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

enum moe_status jsc_array(struct jsc *c, const json_t *s, struct jbuf *b)
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
    if (m > MOE_GRAMMAR_MAX_REPEAT) return jsc_fail(c, "prefixItems", "more than %d schemas", MOE_GRAMMAR_MAX_REPEAT);
    int tail = -1; /* the rule of items beyond the prefix; -2: none may follow */
    if (json_is_false(items)) tail = -2;
    else if (json_is_object(items)) MOE_TRY(jsc_sub_rule(c, items, "items", -1, &tail));
    if (hi < 0 && tail == -2) hi = (long long)m;
    if (hi >= 0 && lo > hi) return jsc_fail(c, "minItems", "is more than maxItems: no array is valid");
    if (tail == -2 && lo > (long long)m)
        return jsc_fail(c, "minItems", "is more than the %zu items allowed: no array is valid", m);
    if (hi >= 0 && (size_t)hi < m) m = (size_t)hi;
    int *pr = calloc(m + 1, sizeof *pr);
    if (!pr) return moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
    for (size_t i = 0; i < m; i++) {
        enum moe_status st = jsc_sub_rule(c, json_array_get(pre, i), "prefixItems", (long)i, &pr[i]);
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

