/* json_schema_str.c - strings for the JSON Schema compiler: the text
 * buffer, grammar literals and classes, the string keywords (minLength,
 * maxLength, format, pattern) and object keys outside a set of names.
 *
 * Formats follow the checks the jsonschema package's FormatChecker makes
 * (docs/grammar.md): date is YYYY-MM-DD with the month's days (29
 * February in leap years only, year 0000 refused), time is RFC 3339's
 * HH:MM:SS[.frac of 1-9 digits](Z|+HH:MM), date-time the two joined by T; uuid is the
 * hyphenated 8-4-4-4-12 hexadecimal form; email is a regex-level subset
 * (local@domain.tld), stricter than the package's check (an "@").
 *
 * A pattern is compiled when it lies in a regex subset the grammar says
 * exactly: literals, classes (negated too), \d \w \s as their ASCII
 * classes, ".", groups, alternation, the quantifiers ? * + {m} {m,} {m,n};
 * a pattern without ^ (or $) may have anything before (after) it, as a
 * regex search.  Matched characters are written without JSON escapes (a
 * class never matches '"', '\' or control characters), which is stricter
 * than the schema where a character could be escaped.  Anything else
 * (backreferences, lookaround, lazy quantifiers, \b, anchors inside) is
 * refused naming "pattern". */
#include "runtime/grammar/json_schema_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

void jbuf_put(struct jbuf *b, const char *s, size_t n)
{
    if (b->nomem) return;
    if (n >= SIZE_MAX / 2 - b->n) {
        b->nomem = true;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->nomem = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jbuf_printf(struct jbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->nomem = true;
        return;
    }
    if ((size_t)n < sizeof tmp) {
        jbuf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->nomem = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    jbuf_put(b, big, (size_t)n);
    free(big);
}

void jbuf_lit(struct jbuf *b, const char *s, size_t n)
{
    jbuf_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') jbuf_printf(b, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7F) jbuf_printf(b, "\\x%02X", ch);
        else jbuf_put(b, (const char *)&ch, 1);
    }
    jbuf_str(b, "\"");
}

void jbuf_key(struct jbuf *b, const char *name)
{
    json_t *k = json_string(name);
    char *enc = k ? json_dumps(k, JSON_ENCODE_ANY) : NULL;
    json_decref(k);
    if (!enc) {
        b->nomem = true;
        return;
    }
    jbuf_lit(b, enc, strlen(enc));
    free(enc);
}

void jbuf_class_cp(struct jbuf *b, uint32_t cp)
{
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9')) {
        char ch = (char)cp;
        jbuf_put(b, &ch, 1);
    } else {
        jbuf_printf(b, "\\U%08X", cp);
    }
}

/* ---- formats ---- */

static const char *const FORMATS[][2] = {
    {"date", "fdate"}, {"time", "ftime"}, {"date-time", "fdatetime"}, {"uuid", "fuuid"}, {"email", "femail"},
};

static const char FORMAT_RULES[] =
    "fyear ::= \"000\" [1-9] | \"00\" [1-9] [0-9] | \"0\" [1-9] [0-9]{2} | [1-9] [0-9]{3}\n"
    "fleap ::= [0-9]{2} ( \"0\" [48] | [2468] [048] | [13579] [26] ) | ( \"0\" [48] | [2468] [048] | [13579] [26] ) \"00\"\n"
    "fd28 ::= \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]\n"
    "fd30 ::= fd28 | \"29\" | \"30\"\n"
    "fd31 ::= fd30 | \"31\"\n"
    "fdate ::= fyear \"-\" ( ( \"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\" ) \"-\" fd31 | ( \"04\" | \"06\" | \"09\" | \"11\" ) \"-\" fd30 | \"02-\" fd28 ) | fleap \"-02-29\"\n"
    "fhour ::= [01] [0-9] | \"2\" [0-3]\n"
    "ftime ::= fhour \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( [Zz] | [-+] fhour \":\" [0-5] [0-9] )\n"
    "fdatetime ::= fdate [Tt] ftime\n"
    "fuuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}\n"
    "femail ::= [A-Za-z0-9._%+\\-]+ \"@\" [A-Za-z0-9\\-]+ ( \".\" [A-Za-z0-9\\-]+ )+\n";

static enum moe_status format_body(struct jsc *c, const char *f, struct jbuf *b)
{
    for (size_t k = 0; k < sizeof FORMATS / sizeof FORMATS[0]; k++) {
        if (strcmp(f, FORMATS[k][0])) continue;
        if (!c->formats_written) {
            jbuf_str(&c->out, FORMAT_RULES);
            c->formats_written = true;
        }
        jbuf_printf(b, "\"\\\"\" %s \"\\\"\"", FORMATS[k][1]);
        return MOE_OK;
    }
    return jsc_fail(c, "format", "'%.64s' is not supported (date, time, date-time, uuid, email are)", f);
}

/* ---- pattern ---- */

struct rx {
    struct jsc *c;
    const uint8_t *s;
    size_t n, i;
    struct jbuf *b;
    int depth;
};

static enum moe_status rx_fail(struct rx *r, const char *what)
{
    return jsc_fail(r->c, "pattern", "%s at offset %zu is outside the regex subset the grammar can say "
                    "exactly (docs/grammar.md)", what, r->i);
}

static int32_t rx_peek(const struct rx *r, size_t *len)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate(r->s + r->i, (utf8proc_ssize_t)(r->n - r->i), &cp);
    *len = k > 0 ? (size_t)k : 1;
    return k > 0 ? cp : -1;
}

/* The class of an escape \d \w \s, or 0. */
static const char *rx_class_escape(int32_t e)
{
    switch (e) {
    case 'd': return "0-9";
    case 'w': return "a-zA-Z0-9_";
    case 's': return " \\t\\n\\r\\x0B\\x0C";
    }
    return NULL;
}

/* A literal code point escaped in a regex: punctuation only. */
static bool rx_punct(int32_t e)
{
    return e > 0x20 && e < 0x7F && !((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'));
}

/* A code point JSON can hold unescaped. */
static bool rx_plain(int32_t cp) { return cp >= 0x20 && cp != '"' && cp != '\\'; }

static enum moe_status rx_class(struct rx *r)
{
    r->i++; /* [ */
    bool neg = r->i < r->n && r->s[r->i] == '^';
    if (neg) r->i++;
    jbuf_str(r->b, neg ? "[^\"\\\\\\x00-\\x1F" : "[");
    bool first = true;
    while (true) {
        size_t len;
        int32_t cp = rx_peek(r, &len);
        if (cp < 0) return rx_fail(r, "an unclosed or malformed class");
        if (cp == ']' && !first) break;
        first = false;
        r->i += len;
        if (cp == '\\') {
            int32_t e = rx_peek(r, &len);
            const char *cls = rx_class_escape(e);
            if (cls && !neg && e == 's') return rx_fail(r, "\\s inside a class");
            if (cls) {
                jbuf_str(r->b, cls);
                r->i += len;
                continue;
            }
            if (!rx_punct(e)) return rx_fail(r, "an escape");
            cp = e;
            r->i += len;
        } else if (cp == '[') {
            return rx_fail(r, "'[' inside a class");
        }
        if (!neg && !rx_plain(cp)) return rx_fail(r, "a character JSON must escape");
        if (cp == '-' && r->i < r->n && r->s[r->i] != ']' && !first) {
            int32_t hi = rx_peek(r, &len);
            if (hi == '\\' || hi < 0) return rx_fail(r, "a range ending in an escape");
            if (!neg && !rx_plain(hi)) return rx_fail(r, "a character JSON must escape");
            jbuf_str(r->b, "-");
            jbuf_class_cp(r->b, (uint32_t)hi);
            r->i += len;
            continue;
        }
        jbuf_class_cp(r->b, (uint32_t)cp);
    }
    r->i++; /* ] */
    jbuf_str(r->b, "]");
    return MOE_OK;
}

static enum moe_status rx_alts(struct rx *r);

static enum moe_status rx_atom(struct rx *r)
{
    size_t len;
    int32_t cp = rx_peek(r, &len);
    if (cp == '(') {
        r->i++;
        if (r->i < r->n && r->s[r->i] == '?') {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':') r->i += 2;
            else return rx_fail(r, "a group with (?");
        }
        if (++r->depth > 32) return rx_fail(r, "groups nested deeper than 32");
        jbuf_str(r->b, "( ");
        MOE_TRY(rx_alts(r));
        r->depth--;
        if (r->i >= r->n || r->s[r->i] != ')') return rx_fail(r, "an unclosed group");
        r->i++;
        jbuf_str(r->b, " )");
        return MOE_OK;
    }
    if (cp == '[') return rx_class(r);
    r->i += len;
    if (cp == '.') {
        jbuf_str(r->b, "[^\"\\\\\\x00-\\x1F]");
        return MOE_OK;
    }
    if (cp == '\\') {
        int32_t e = rx_peek(r, &len);
        const char *cls = rx_class_escape(e);
        r->i += len;
        if (cls) {
            jbuf_printf(r->b, "[%s]", cls);
            if (e == 's') return rx_fail(r, "\\s (a whitespace JSON must escape)");
            return MOE_OK;
        }
        if (!rx_punct(e) || e == '"' || e == '\\') return rx_fail(r, "an escape");
        cp = e;
    } else if (cp < 0 || cp == '^' || cp == '$' || cp == '{' || cp == '}' || cp == ']' || cp == '*' ||
               cp == '+' || cp == '?') {
        return rx_fail(r, "a misplaced metacharacter");
    }
    if (!rx_plain(cp)) return rx_fail(r, "a character JSON must escape");
    jbuf_str(r->b, "[");
    jbuf_class_cp(r->b, (uint32_t)cp);
    jbuf_str(r->b, "]");
    return MOE_OK;
}

static bool rx_number(struct rx *r, long *v)
{
    size_t at = r->i;
    *v = 0;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9' && *v <= MOE_GRAMMAR_MAX_REPEAT)
        *v = *v * 10 + (r->s[r->i++] - '0');
    return r->i > at;
}

static enum moe_status rx_quant(struct rx *r)
{
    char q = (char)r->s[r->i];
    if (q == '*' || q == '+' || q == '?') {
        r->i++;
        jbuf_printf(r->b, "%c", q);
    } else { /* { */
        long m, n = -1;
        r->i++;
        if (!rx_number(r, &m)) return rx_fail(r, "a '{' that is not a counted repetition");
        bool comma = r->i < r->n && r->s[r->i] == ',';
        if (comma) {
            r->i++;
            if (!rx_number(r, &n)) n = -1;
        } else {
            n = m;
        }
        if (r->i >= r->n || r->s[r->i] != '}') return rx_fail(r, "a malformed counted repetition");
        r->i++;
        if (m > MOE_GRAMMAR_MAX_REPEAT || n > MOE_GRAMMAR_MAX_REPEAT || (n >= 0 && n < m))
            return rx_fail(r, "a count over 1000 or backwards");
        if (n < 0) jbuf_printf(r->b, "{%ld,}", m);
        else jbuf_printf(r->b, "{%ld,%ld}", m, n);
    }
    if (r->i < r->n && (r->s[r->i] == '?' || r->s[r->i] == '+')) return rx_fail(r, "a lazy or possessive quantifier");
    return MOE_OK;
}

static enum moe_status rx_alts(struct rx *r)
{
    while (true) {
        bool empty = true;
        while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
            if (r->s[r->i] == '$' && r->depth == 0 && r->i + 1 == r->n) break;
            jbuf_str(r->b, " ");
            MOE_TRY(rx_atom(r));
            if (r->i < r->n && strchr("*+?{", r->s[r->i])) MOE_TRY(rx_quant(r));
            empty = false;
        }
        if (empty) jbuf_str(r->b, " \"\"");
        if (r->i >= r->n || r->s[r->i] != '|') return MOE_OK;
        r->i++;
        jbuf_str(r->b, " |");
    }
}

static enum moe_status pattern_body(struct jsc *c, const char *p, struct jbuf *b)
{
    struct rx r = {.c = c, .s = (const uint8_t *)p, .n = strlen(p), .b = b};
    bool head = r.n && p[0] == '^', tail = r.n > 1 && p[r.n - 1] == '$' && p[r.n - 2] != '\\';
    if (head) r.i = 1;
    jbuf_str(b, "\"\\\"\" ");
    if (!head) jbuf_str(b, "jchar* ");
    jbuf_str(b, "(");
    MOE_TRY(rx_alts(&r));
    if (r.i < r.n && !(tail && r.i + 1 == r.n)) return rx_fail(&r, "an unmatched ')' or '$'");
    jbuf_str(b, " )");
    if (!tail) jbuf_str(b, " jchar*");
    jbuf_str(b, " \"\\\"\"");
    return MOE_OK;
}

/* ---- strings ---- */

static enum moe_status length_of(struct jsc *c, const json_t *s, const char *kw, long long *v)
{
    const json_t *x = json_object_get(s, kw);
    if (!x) return MOE_OK;
    double d = json_number_value(x);
    if (!json_is_number(x) || d < 0 || d != floor(d)) return jsc_fail(c, kw, "must be a non-negative integer");
    if (d > MOE_GRAMMAR_MAX_REPEAT)
        return jsc_fail(c, kw, "%.0f is more than the grammar can count (at most %d)", d, MOE_GRAMMAR_MAX_REPEAT);
    *v = (long long)d;
    return MOE_OK;
}

enum moe_status jsc_string(struct jsc *c, const json_t *s, struct jbuf *b)
{
    const json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    long long lo = 0, hi = -1;
    MOE_TRY(length_of(c, s, "minLength", &lo));
    MOE_TRY(length_of(c, s, "maxLength", &hi));
    bool counted = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    if (fmt && (pat || counted))
        return jsc_fail(c, "format", "\"format\" with \"%s\" is not supported", pat ? "pattern" : "minLength/maxLength");
    if (pat && counted) return jsc_fail(c, "pattern", "\"pattern\" with \"minLength\"/\"maxLength\" is not supported");
    if (fmt) {
        if (!json_is_string(fmt)) return jsc_fail(c, "format", "must be a string");
        return format_body(c, json_string_value(fmt), b);
    }
    if (pat) {
        if (!json_is_string(pat)) return jsc_fail(c, "pattern", "must be a string");
        return pattern_body(c, json_string_value(pat), b);
    }
    if (hi >= 0 && lo > hi) return jsc_fail(c, "minLength", "is more than maxLength: no string is valid");
    if (hi < 0) jbuf_printf(b, "\"\\\"\" jchar{%lld,} \"\\\"\"", lo);
    else jbuf_printf(b, "\"\\\"\" jchar{%lld,%lld} \"\\\"\"", lo, hi);
    return MOE_OK;
}

/* ---- keys outside a set ---- */

/* The names as a trie over their code points; a key outside the set
 * leaves the trie (a code point no child has, then any plain characters)
 * or ends at a node that is not a name.  Keys are written without escapes
 * (names holding characters JSON must escape can never match and are left
 * out). */
enum moe_status jsc_other_key(struct jsc *c, const char *const *names, size_t n, struct jbuf *b)
{
    int id;
    struct jbuf body = {0};
    MOE_TRY(jsc_new_rule(c, &id));
    jbuf_printf(b, "\"\\\"\" s%d", id);
    struct trie_todo {
        const char *prefix; /* a name whose first len bytes are the node's prefix */
        size_t len;
        int rule;
    } *todo;
    size_t total = 1;
    for (size_t k = 0; k < n; k++) total += strlen(names[k]);
    bool *plain = calloc(n + 1, sizeof *plain);
    todo = malloc((total + 1) * sizeof *todo);
    if (!todo || !plain) {
        free(todo);
        free(plain);
        return moe_fail(MOE_ERR_NOMEM, "JSON Schema: out of memory");
    }
    for (size_t k = 0; k < n; k++) {
        plain[k] = true;
        for (const char *q = names[k]; *q; q++) plain[k] &= (unsigned char)*q >= 0x20 && *q != '"' && *q != '\\';
    }
    size_t n_todo = 1, next = 0;
    todo[0] = (struct trie_todo){"", 0, id};
    enum moe_status st = MOE_OK;
    while (next < n_todo && !st) {
        struct trie_todo t = todo[next++];
        bool is_name = false;
        body.n = 0;
        jbuf_str(&body, "[^\"\\\\\\x00-\\x1F");
        /* children: distinct next code points of names with this prefix */
        struct jbuf kids = {0};
        for (size_t k = 0; k < n; k++) {
            const char *nm = names[k];
            if (strncmp(nm, t.prefix, t.len) || strlen(nm) < t.len) continue;
            if (!plain[k]) continue;
            if (!nm[t.len]) {
                is_name = true;
                continue;
            }
            utf8proc_int32_t cp;
            utf8proc_ssize_t len = utf8proc_iterate((const uint8_t *)nm + t.len, -1, &cp);
            if (len <= 0) continue;
            bool seen = false; /* an earlier name with the same next code point */
            for (size_t j = 0; j < k && !seen; j++)
                seen = plain[j] && strlen(names[j]) >= t.len + (size_t)len &&
                       !strncmp(names[j], nm, t.len + (size_t)len);
            if (seen) continue;
            int kid;
            st = jsc_new_rule(c, &kid);
            if (st) break;
            todo[n_todo++] = (struct trie_todo){nm, t.len + (size_t)len, kid};
            jbuf_class_cp(&body, (uint32_t)cp);
            jbuf_lit(&kids, nm + t.len, (size_t)len);
            jbuf_printf(&kids, " s%d | ", kid);
        }
        jbuf_str(&body, "] jkeytail");
        struct jbuf rule = {0};
        jbuf_put(&rule, kids.p ? kids.p : "", kids.n);
        jbuf_put(&rule, body.p, body.n);
        if (!is_name) jbuf_str(&rule, " | \"\\\"\"");
        if (!st) st = jsc_emit_rule(c, t.rule, &rule);
        free(rule.p);
        free(kids.p);
    }
    free(body.p);
    free(todo);
    free(plain);
    if (!st && !c->keytail_written) {
        jbuf_str(&c->out, "jkeytail ::= [^\"\\\\\\x00-\\x1F]* \"\\\"\"\n");
        c->keytail_written = true;
    }
    return st;
}
