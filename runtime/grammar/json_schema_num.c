/* json_schema_num.c - numbers for the JSON Schema compiler: integer and
 * number ranges as digit grammars, and literal values (enum, const).
 *
 * An integer range [lo, hi] is the classic digit split: numbers of each
 * length between the bounds' lengths, each length split by its leading
 * digit (12..345 is 1[2-9] | [2-9][0-9] | [1-2][0-9][0-9] | 3[0-3][0-9] |
 * 34[0-5]).  Magnitudes stop at 16 digits, as the json_object grammar's
 * numbers do; a negative range is "-" and the range of its magnitudes
 * ("-0" is never written).  A number range needs whole-number bounds: the
 * integer part is ranged that way and the fraction follows from it (the
 * lower bound's integer part takes any fraction when the bound is
 * inclusive, a non-zero one when exclusive; the upper bound's only zeros,
 * when inclusive).  Ranged numbers are written without an exponent. */
#include "runtime/grammar/json_schema_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAG_MAX 9999999999999999LL  /* 16 digits */
#define BOUND_MAX 1e15              /* the largest bound taken */

/* Digits lo[0..n) .. hi[0..n), same length. */
static void range_same(struct jbuf *b, const char *lo, const char *hi, size_t n)
{
    if (n == 0) {
        jbuf_str(b, "\"\"");
        return;
    }
    if (lo[0] == hi[0]) {
        jbuf_printf(b, "\"%c\" ", lo[0]);
        range_same(b, lo + 1, hi + 1, n - 1);
        return;
    }
    bool lo_zeros = strspn(lo + 1, "0") >= n - 1, hi_nines = strspn(hi + 1, "9") >= n - 1;
    char nines[24], zeros[24];
    memset(nines, '9', n);
    memset(zeros, '0', n);
    jbuf_str(b, "( ");
    char first = lo_zeros ? lo[0] : (char)(lo[0] + 1), last = hi_nines ? hi[0] : (char)(hi[0] - 1);
    bool any = false;
    if (!lo_zeros) {
        jbuf_printf(b, "\"%c\" ( ", lo[0]);
        range_same(b, lo + 1, nines, n - 1);
        jbuf_str(b, " )");
        any = true;
    }
    if (first <= last) {
        jbuf_printf(b, "%s[%c-%c]", any ? " | " : "", first, last);
        if (n > 1) jbuf_printf(b, " [0-9]{%zu}", n - 1);
        any = true;
    }
    if (!hi_nines) {
        jbuf_printf(b, "%s\"%c\" ( ", any ? " | " : "", hi[0]);
        range_same(b, zeros, hi + 1, n - 1);
        jbuf_str(b, " )");
    }
    jbuf_str(b, " )");
}

/* Magnitudes a..b (0 <= a <= b <= MAG_MAX), without leading zeros. */
static void range_uint(struct jbuf *b, long long a, long long hi)
{
    char sa[24], sb[24];
    int la = snprintf(sa, sizeof sa, "%lld", a), lb = snprintf(sb, sizeof sb, "%lld", hi);
    jbuf_str(b, "( ");
    for (int len = la; len <= lb; len++) {
        char lo_s[24], hi_s[24];
        if (len == la) memcpy(lo_s, sa, (size_t)la + 1);
        else snprintf(lo_s, sizeof lo_s, "1%0*d", len - 1, 0);
        if (len == lb) memcpy(hi_s, sb, (size_t)lb + 1);
        else memset(hi_s, '9', (size_t)len), hi_s[len] = 0;
        if (len > la) jbuf_str(b, " | ");
        range_same(b, lo_s, hi_s, (size_t)len);
    }
    jbuf_str(b, " )");
}

struct bound {
    bool set;
    double v;
    bool incl;
};

static enum moe_status read_bound(struct jsc *c, const json_t *s, bool upper, struct bound *bd)
{
    const char *kw = upper ? "maximum" : "minimum", *ex = upper ? "exclusiveMaximum" : "exclusiveMinimum";
    const json_t *x = json_object_get(s, kw), *e = json_object_get(s, ex);
    *bd = (struct bound){0};
    if (x && e) return jsc_fail(c, ex, "both \"%s\" and \"%s\" are not supported", kw, ex);
    const json_t *v = x ? x : e;
    if (!v) return MOE_OK;
    if (!json_is_number(v)) return jsc_fail(c, x ? kw : ex, "must be a number");
    bd->set = true;
    bd->v = json_number_value(v);
    bd->incl = x != NULL;
    if (fabs(bd->v) > BOUND_MAX) return jsc_fail(c, x ? kw : ex, "bounds beyond 1e15 are not supported");
    return MOE_OK;
}

/* Integers lo..hi (inclusive; written with at most 16 digits). */
static void integer_range(struct jbuf *b, long long lo, long long hi)
{
    bool alt = false;
    if (hi >= 0) {
        range_uint(b, lo > 0 ? lo : 0, hi);
        alt = true;
    }
    if (lo < 0) {
        jbuf_str(b, alt ? " | \"-\" " : "\"-\" ");
        range_uint(b, hi < 0 ? -hi : 1, -lo);
    }
}

/* Magnitudes m with a <(=) m <(=) hi: the integer part ranged, the
 * fraction by the bounds; *any false when no magnitude fits. */
static void magnitude(struct jbuf *b, long long a, bool a_incl, long long hi, bool hi_open, bool hi_incl, bool *any)
{
    static const char FANY[] = "( \".\" [0-9]{1,16} )?", FZERO[] = "( \".\" \"0\"{1,16} )?",
                      FNZ[] = "\".\" \"0\"{0,15} [1-9] [0-9]{0,15}";
    const char *sep = *any ? " | " : "";
    if (!hi_open && a == hi) {
        if (a_incl && hi_incl) {
            jbuf_printf(b, "%s\"%lld\" %s", sep, a, FZERO);
            *any = true;
        }
        return;
    }
    jbuf_printf(b, "%s\"%lld\" %s", sep, a, a_incl ? FANY : FNZ);
    long long top = hi_open ? MAG_MAX : hi - 1;
    if (a + 1 <= top) {
        jbuf_str(b, " | ");
        range_uint(b, a + 1, top);
        jbuf_printf(b, " %s", FANY);
    }
    if (!hi_open && hi_incl) jbuf_printf(b, " | \"%lld\" %s", hi, FZERO);
    *any = true;
}

enum moe_status jsc_number(struct jsc *c, const json_t *s, bool integer, struct jbuf *b)
{
    struct bound lo, hi;
    MOE_TRY(read_bound(c, s, false, &lo));
    MOE_TRY(read_bound(c, s, true, &hi));
    if (integer) {
        long long l = -MAG_MAX, h = MAG_MAX;
        if (lo.set) l = lo.incl ? (long long)ceil(lo.v) : (long long)floor(lo.v) + 1;
        if (hi.set) h = hi.incl ? (long long)floor(hi.v) : (long long)ceil(hi.v) - 1;
        if (l > h) return jsc_fail(c, lo.set ? "minimum" : "maximum", "the range holds no integer");
        integer_range(b, l, h);
        return MOE_OK;
    }
    if ((lo.set && lo.v != floor(lo.v)) || (hi.set && hi.v != floor(hi.v)))
        return jsc_fail(c, lo.set && lo.v != floor(lo.v) ? (lo.incl ? "minimum" : "exclusiveMinimum")
                                                           : (hi.incl ? "maximum" : "exclusiveMaximum"),
                        "a bound of a \"number\" must be a whole number (fractions are not supported)");
    long long l = (long long)lo.v, h = (long long)hi.v;
    if (lo.set && hi.set && l > h) return jsc_fail(c, "minimum", "is more than the maximum: the range holds no number");
    bool any = false;
    jbuf_str(b, "( ");
    /* x >= 0 */
    if (!hi.set || h > 0 || (h == 0 && hi.incl)) {
        bool from_lo = lo.set && l >= 0;
        magnitude(b, from_lo ? l : 0, from_lo ? lo.incl : true, hi.set ? h : 0, !hi.set, hi.incl, &any);
    }
    /* x < 0: magnitudes above max(0, -hi) up to -lo */
    if (!lo.set || l < 0) {
        struct jbuf neg = {0};
        bool nany = false;
        bool from_hi = hi.set && h < 0;
        magnitude(&neg, from_hi ? -h : 0, from_hi ? hi.incl : false, lo.set ? -l : 0, !lo.set, lo.incl, &nany);
        if (nany) {
            jbuf_printf(b, "%s\"-\" ( ", any ? " | " : "");
            jbuf_put(b, neg.p, neg.n);
            jbuf_str(b, " )");
            any = true;
        }
        if (neg.nomem) b->nomem = true;
        free(neg.p);
    }
    jbuf_str(b, " )");
    if (!any) return jsc_fail(c, "minimum", "the range holds no number");
    return MOE_OK;
}

/* ---- literals ---- */

enum moe_status jsc_literal(struct jsc *c, const json_t *v, struct jbuf *b)
{
    if (c->depth + 1 >= MOE_JSON_SCHEMA_MAX_DEPTH)
        return moe_fail(MOE_ERR_UNSUPPORTED, "JSON Schema: a value nested deeper than %d at %s",
                        MOE_JSON_SCHEMA_MAX_DEPTH, jsc_where(c));
    char num[64];
    switch (json_typeof(v)) {
    case JSON_NULL: jbuf_str(b, "\"null\""); return MOE_OK;
    case JSON_TRUE: jbuf_str(b, "\"true\""); return MOE_OK;
    case JSON_FALSE: jbuf_str(b, "\"false\""); return MOE_OK;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        jbuf_lit(b, num, strlen(num));
        return MOE_OK;
    case JSON_REAL: {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 1e16) {
            snprintf(num, sizeof num, "%.0f.0", d);
        } else {
            for (int p = 1; p <= 17; p++) { /* the shortest form that reads back */
                snprintf(num, sizeof num, "%.*g", p, d);
                if (strtod(num, NULL) == d) break;
            }
        }
        jbuf_lit(b, num, strlen(num));
        return MOE_OK;
    }
    case JSON_STRING: {
        char *enc = json_dumps(v, JSON_ENCODE_ANY);
        if (!enc) return moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
        jbuf_lit(b, enc, strlen(enc));
        free(enc);
        return MOE_OK;
    }
    case JSON_ARRAY:
    case JSON_OBJECT:
        break;
    }
    bool arr = json_is_array(v);
    enum moe_status st = MOE_OK;
    c->depth++;
    jbuf_str(b, arr ? "\"[\" ws" : "\"{\" ws");
    size_t i = 0;
    if (arr) {
        const json_t *x;
        json_array_foreach((json_t *)v, i, x) {
            jbuf_str(b, i ? " \",\" ws " : " ");
            if ((st = jsc_literal(c, x, b))) break;
            jbuf_str(b, " ws");
        }
    } else {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            jbuf_str(b, i++ ? " \",\" ws " : " ");
            json_t *key = json_string(k);
            char *enc = key ? json_dumps(key, JSON_ENCODE_ANY) : NULL;
            json_decref(key);
            if (!enc) {
                st = moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
                break;
            }
            jbuf_lit(b, enc, strlen(enc));
            free(enc);
            jbuf_str(b, " ws \":\" ws ");
            if ((st = jsc_literal(c, x, b))) break;
            jbuf_str(b, " ws");
        }
    }
    jbuf_str(b, arr ? " \"]\"" : " \"}\"");
    c->depth--;
    return st;
}
