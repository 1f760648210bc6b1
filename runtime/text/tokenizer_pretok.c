/* tokenizer_pretok.c - normalizers and pre-tokenizers of tokenizer.json.
 *
 * Mirrors tokenizers/src/normalizers (NFC/NFD/NFKC/NFKD, Lowercase, Strip,
 * Prepend, Replace, Sequence) and tokenizers/src/pre_tokenizers (Split,
 * ByteLevel, Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit,
 * Sequence).  Offsets are not tracked: moerun only needs ids.
 *
 * Splitting follows NormalizedString::split: a pattern yields the whole
 * piece as alternating (range, is_match) parts; the behaviour (Removed,
 * Isolated, MergedWithPrevious, MergedWithNext, Contiguous) folds them; empty
 * parts are dropped.  Regexes are PCRE2 with UTF + UCP, standing in for the
 * Oniguruma regexes of the Rust crate. */
#include "runtime/text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------ shared */

int32_t moe_tok_byte_cp(unsigned char b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256 + b;
    if (b <= 160) return 256 + 33 + (b - 127);
    return 256 + 67; /* 173 */
}

int moe_tok_char_byte(int32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return cp;
    if (cp >= 256 && cp <= 288) return cp - 256;
    if (cp >= 289 && cp <= 322) return cp - 289 + 127;
    if (cp == 323) return 173;
    return -1;
}

bool moe_tok_is_ws(int32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

static int32_t cp_at(const char *s, size_t *len)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, -1, &cp);
    *len = k > 0 ? (size_t)k : 1;
    return k > 0 ? cp : 0xfffd;
}

static const char *type_of(json_t *j)
{
    json_t *t = json_object_get(j, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static bool get_bool(json_t *j, const char *key, bool dflt)
{
    json_t *v = json_object_get(j, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* {"String": s} or {"Regex": r} */
static enum moe_status load_pattern(json_t *pat, struct tok_regex *re, const char *what)
{
    json_t *s = json_object_get(pat, "String"), *r = json_object_get(pat, "Regex");
    if (json_is_string(s))
        return moe_tok_regex_compile(re, json_string_value(s), json_string_length(s), true, what);
    if (json_is_string(r))
        return moe_tok_regex_compile(re, json_string_value(r), json_string_length(r), false, what);
    return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: %s pattern is neither String nor Regex", what);
}

/* --------------------------------------------------------- normalizers */

enum norm_kind { N_SEQ, N_UNICODE, N_LOWER, N_STRIP, N_PREPEND, N_REPLACE };

struct tok_norm {
    enum norm_kind kind;
    struct tok_norm **kids; /* N_SEQ */
    size_t n_kids;
    int uflags;             /* N_UNICODE: utf8proc options */
    bool left, right;       /* N_STRIP */
    char *str;              /* N_PREPEND text, N_REPLACE content */
    size_t str_len;
    struct tok_regex re;    /* N_REPLACE */
};

void moe_tok_norm_free(struct tok_norm *n)
{
    if (!n) return;
    for (size_t i = 0; i < n->n_kids; i++) moe_tok_norm_free(n->kids[i]);
    free(n->kids);
    free(n->str);
    moe_tok_regex_free(&n->re);
    free(n);
}

static enum moe_status dup_str(json_t *v, char **out, size_t *len, const char *what)
{
    if (!json_is_string(v)) return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: %s is not a string", what);
    *len = json_string_length(v);
    if (!(*out = malloc(*len + 1))) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(*out, json_string_value(v), *len + 1);
    return MOE_OK;
}

enum moe_status moe_tok_norm_load(struct tok_norm **out, json_t *j)
{
    *out = NULL;
    if (!j || json_is_null(j)) return MOE_OK;
    const char *t = type_of(j);
    if (!t) return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: normalizer has no type");
    struct tok_norm *n = calloc(1, sizeof *n);
    if (!n) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    enum moe_status st = MOE_OK;
    if (!strcmp(t, "Sequence")) {
        json_t *a = json_object_get(j, "normalizers");
        if (!json_is_array(a)) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: normalizer Sequence has no list");
            goto fail;
        }
        n->kind = N_SEQ;
        n->kids = calloc(json_array_size(a) + 1, sizeof *n->kids);
        if (!n->kids) goto nomem;
        for (size_t i = 0; i < json_array_size(a); i++) {
            if ((st = moe_tok_norm_load(&n->kids[i], json_array_get(a, i)))) goto fail;
            n->n_kids++;
        }
    } else if (!strcmp(t, "NFC") || !strcmp(t, "NFD") || !strcmp(t, "NFKC") || !strcmp(t, "NFKD")) {
        n->kind = N_UNICODE;
        n->uflags = UTF8PROC_STABLE | (t[2] == 'C' || t[3] == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                    (t[2] == 'K' ? UTF8PROC_COMPAT : 0);
    } else if (!strcmp(t, "Lowercase")) {
        n->kind = N_LOWER;
    } else if (!strcmp(t, "Strip")) {
        n->kind = N_STRIP;
        n->left = get_bool(j, "strip_left", false);
        n->right = get_bool(j, "strip_right", false);
    } else if (!strcmp(t, "Prepend")) {
        n->kind = N_PREPEND;
        if ((st = dup_str(json_object_get(j, "prepend"), &n->str, &n->str_len,
                          "normalizer Prepend.prepend")))
            goto fail;
    } else if (!strcmp(t, "Replace")) {
        n->kind = N_REPLACE;
        if ((st = dup_str(json_object_get(j, "content"), &n->str, &n->str_len,
                          "normalizer Replace.content")) ||
            (st = load_pattern(json_object_get(j, "pattern"), &n->re, "normalizer Replace")))
            goto fail;
    } else {
        st = moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: normalizer type '%s' is not supported", t);
        goto fail;
    }
    *out = n;
    return MOE_OK;
nomem:
    st = moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
fail:
    moe_tok_norm_free(n);
    return st;
}

static enum moe_status norm_one(struct tok_norm *n, struct tok_buf *in, struct tok_buf *out)
{
    out->len = 0;
    switch (n->kind) {
    case N_SEQ: break;
    case N_UNICODE: {
        /* Fast path: ASCII is invariant under all four forms, and text below
         * U+0300 (no combining marks) is already NFC. */
        unsigned char limit = n->uflags == (UTF8PROC_STABLE | UTF8PROC_COMPOSE) ? 0xcc : 0x80;
        size_t i = 0;
        while (i < in->len && (unsigned char)in->p[i] < limit) i++;
        if (i == in->len) return moe_tok_buf_put(out, in->p, in->len);
        utf8proc_uint8_t *r = NULL;
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)in->p, (utf8proc_ssize_t)in->len,
                                          &r, (utf8proc_option_t)n->uflags);
        if (k < 0) return moe_fail(MOE_ERR_FORMAT, "tokenizer: normalization failed: %s",
                                   utf8proc_errmsg(k));
        enum moe_status st = moe_tok_buf_put(out, (const char *)r, (size_t)k);
        free(r);
        return st;
    }
    case N_LOWER:
        for (size_t i = 0; i < in->len;) {
            size_t k;
            int32_t cp = cp_at(in->p + i, &k);
            char u[8];
            size_t m;
            if (cp == 0x130) { /* the one unconditional multi-char lowercase mapping */
                memcpy(u, "i\xcc\x87", 3);
                m = 3;
            } else {
                m = moe_tok_utf8_put(u, utf8proc_tolower(cp));
            }
            MOE_TRY(moe_tok_buf_put(out, u, m));
            i += k;
        }
        return moe_tok_buf_put(out, "", 0);
    case N_STRIP: {
        size_t a = 0, b = in->len;
        while (n->left && a < b) {
            size_t k;
            if (!moe_tok_is_ws(cp_at(in->p + a, &k))) break;
            a += k;
        }
        while (n->right && b > a) {
            size_t s = b - 1, k;
            while (s > a && ((unsigned char)in->p[s] & 0xc0) == 0x80) s--;
            if (!moe_tok_is_ws(cp_at(in->p + s, &k))) break;
            b = s;
        }
        return moe_tok_buf_put(out, in->p + a, b - a);
    }
    case N_PREPEND:
        if (in->len) MOE_TRY(moe_tok_buf_put(out, n->str, n->str_len));
        return moe_tok_buf_put(out, in->p, in->len);
    case N_REPLACE: {
        size_t from = 0, last = SIZE_MAX, ms, me, done = 0;
        for (bool found;;) {
            MOE_TRY(moe_tok_regex_next(&n->re, in->p, in->len, &from, &last, &ms, &me, &found));
            if (!found) break;
            MOE_TRY(moe_tok_buf_put(out, in->p + done, ms - done));
            MOE_TRY(moe_tok_buf_put(out, n->str, n->str_len));
            done = me;
        }
        return moe_tok_buf_put(out, in->p + done, in->len - done);
    }
    }
    return MOE_OK;
}

enum moe_status moe_tok_normalize(struct tok_norm *n, struct tok_buf *io, struct tok_buf *tmp)
{
    if (!n) return MOE_OK;
    if (n->kind == N_SEQ) {
        for (size_t i = 0; i < n->n_kids; i++) MOE_TRY(moe_tok_normalize(n->kids[i], io, tmp));
        return MOE_OK;
    }
    MOE_TRY(norm_one(n, io, tmp));
    struct tok_buf t = *io;
    *io = *tmp;
    *tmp = t;
    return MOE_OK;
}

/* ------------------------------------------------------ pre-tokenizers */

enum pt_kind { P_SEQ, P_SPLIT, P_BYTELEVEL, P_METASPACE, P_DIGITS, P_PUNCT, P_WS, P_WSSPLIT };
enum behavior { B_REMOVED, B_ISOLATED, B_PREV, B_NEXT, B_CONTIG };
enum prepend { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

struct part {
    size_t a, b;
    bool match;
};

struct tok_pretok {
    enum pt_kind kind;
    struct tok_pretok **kids; /* P_SEQ */
    size_t n_kids;
    enum behavior behavior;
    bool invert;
    bool has_re;
    struct tok_regex re;      /* P_SPLIT, P_BYTELEVEL (GPT-2 regex), P_WS */
    bool add_prefix_space, use_regex; /* P_BYTELEVEL */
    char repl[8];             /* P_METASPACE replacement character */
    size_t repl_len;
    int32_t repl_cp;
    enum prepend prepend;
    bool split;
    bool individual_digits;   /* P_DIGITS */
    struct part *parts;       /* scratch */
    size_t parts_cap;
    struct tok_buf scratch;
};

static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

void moe_tok_pretok_free(struct tok_pretok *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n_kids; i++) moe_tok_pretok_free(p->kids[i]);
    free(p->kids);
    moe_tok_regex_free(&p->re);
    free(p->parts);
    moe_tok_buf_free(&p->scratch);
    free(p);
}

static enum moe_status load_behavior(json_t *j, enum behavior *b, enum behavior dflt)
{
    json_t *v = json_object_get(j, "behavior");
    *b = dflt;
    if (!v) return MOE_OK;
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (!strcmp(s, "Removed")) *b = B_REMOVED;
    else if (!strcmp(s, "Isolated")) *b = B_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *b = B_PREV;
    else if (!strcmp(s, "MergedWithNext")) *b = B_NEXT;
    else if (!strcmp(s, "Contiguous")) *b = B_CONTIG;
    else return moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: split behavior '%s' is not supported", s);
    return MOE_OK;
}

enum moe_status moe_tok_pretok_load(struct tok_pretok **out, json_t *j)
{
    *out = NULL;
    if (!j || json_is_null(j)) return MOE_OK;
    const char *t = type_of(j);
    if (!t) return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: pre_tokenizer has no type");
    struct tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    enum moe_status st = MOE_OK;
    if (!strcmp(t, "Sequence")) {
        json_t *a = json_object_get(j, "pretokenizers");
        if (!json_is_array(a)) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: pre_tokenizer Sequence has no list");
            goto fail;
        }
        p->kind = P_SEQ;
        if (!(p->kids = calloc(json_array_size(a) + 1, sizeof *p->kids))) goto nomem;
        for (size_t i = 0; i < json_array_size(a); i++) {
            if ((st = moe_tok_pretok_load(&p->kids[i], json_array_get(a, i)))) goto fail;
            p->n_kids++;
        }
    } else if (!strcmp(t, "Split")) {
        p->kind = P_SPLIT;
        p->invert = get_bool(j, "invert", false);
        if ((st = load_behavior(j, &p->behavior, B_REMOVED)) ||
            (st = load_pattern(json_object_get(j, "pattern"), &p->re, "pre_tokenizer Split")))
            goto fail;
        p->has_re = true;
    } else if (!strcmp(t, "ByteLevel")) {
        p->kind = P_BYTELEVEL;
        p->add_prefix_space = get_bool(j, "add_prefix_space", true);
        p->use_regex = get_bool(j, "use_regex", true);
        if (p->use_regex) {
            if ((st = moe_tok_regex_compile(&p->re, GPT2_RE, sizeof GPT2_RE - 1, false, "ByteLevel")))
                goto fail;
            p->has_re = true;
        }
        p->behavior = B_ISOLATED;
    } else if (!strcmp(t, "Metaspace")) {
        p->kind = P_METASPACE;
        json_t *r = json_object_get(j, "replacement");
        size_t k;
        if (!json_is_string(r) || json_string_length(r) == 0 ||
            (p->repl_cp = cp_at(json_string_value(r), &k), k != json_string_length(r))) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: Metaspace replacement must be one character");
            goto fail;
        }
        memcpy(p->repl, json_string_value(r), k);
        p->repl_len = k;
        p->split = get_bool(j, "split", true);
        json_t *ps = json_object_get(j, "prepend_scheme");
        if (json_is_string(ps)) {
            const char *s = json_string_value(ps);
            if (!strcmp(s, "always")) p->prepend = PREPEND_ALWAYS;
            else if (!strcmp(s, "first")) p->prepend = PREPEND_FIRST;
            else if (!strcmp(s, "never")) p->prepend = PREPEND_NEVER;
            else {
                st = moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: Metaspace prepend_scheme '%s' "
                                                   "is not supported", s);
                goto fail;
            }
        } else { /* older files: add_prefix_space */
            p->prepend = get_bool(j, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
        }
        p->behavior = B_NEXT;
    } else if (!strcmp(t, "Digits")) {
        p->kind = P_DIGITS;
        p->individual_digits = get_bool(j, "individual_digits", false);
        p->behavior = p->individual_digits ? B_ISOLATED : B_CONTIG;
    } else if (!strcmp(t, "Punctuation")) {
        p->kind = P_PUNCT;
        if ((st = load_behavior(j, &p->behavior, B_ISOLATED))) goto fail;
    } else if (!strcmp(t, "Whitespace")) {
        p->kind = P_WS;
        /* \w+|[^\w\s]+ with the Rust regex crate's Unicode \w and \s */
        static const char ws_re[] =
            "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]+|"
            "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\p{White_Space}]+";
        if ((st = moe_tok_regex_compile(&p->re, ws_re, sizeof ws_re - 1, false, "Whitespace")))
            goto fail;
        p->has_re = true;
        p->invert = true;
        p->behavior = B_REMOVED;
    } else if (!strcmp(t, "WhitespaceSplit")) {
        p->kind = P_WSSPLIT;
        p->behavior = B_REMOVED;
    } else {
        st = moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: pre_tokenizer type '%s' is not supported", t);
        goto fail;
    }
    *out = p;
    return MOE_OK;
nomem:
    st = moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
fail:
    moe_tok_pretok_free(p);
    return st;
}

static enum moe_status add_part(struct tok_pretok *p, size_t *n, size_t a, size_t b, bool m)
{
    if (*n == p->parts_cap) {
        size_t c = p->parts_cap ? p->parts_cap * 2 : 64;
        struct part *q = realloc(p->parts, c * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
        p->parts = q;
        p->parts_cap = c;
    }
    p->parts[(*n)++] = (struct part){a, b, m};
    return MOE_OK;
}

static bool char_matches(const struct tok_pretok *p, int32_t cp)
{
    switch (p->kind) {
    case P_METASPACE: return cp == p->repl_cp;
    case P_DIGITS: {
        utf8proc_category_t c = utf8proc_category(cp);
        return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
    }
    case P_PUNCT: {
        if (cp < 128) return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) ||
                             (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126);
        utf8proc_category_t c = utf8proc_category(cp);
        return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
    }
    case P_WSSPLIT: return moe_tok_is_ws(cp);
    default: return false;
    }
}

/* Splits s[0..n) into (range, is_match) parts covering it (Pattern::find_matches),
 * folds them by behaviour and appends the kept non-empty parts to out. */
static enum moe_status split_piece(struct tok_pretok *p, const char *s, size_t n, bool first,
                                   struct tok_list *out)
{
    size_t np = 0;
    if (p->has_re) {
        size_t from = 0, last = SIZE_MAX, ms, me, prev = 0;
        for (bool found;;) {
            MOE_TRY(moe_tok_regex_next(&p->re, s, n, &from, &last, &ms, &me, &found));
            if (!found) break;
            if (prev != ms) MOE_TRY(add_part(p, &np, prev, ms, p->invert));
            MOE_TRY(add_part(p, &np, ms, me, !p->invert));
            prev = me;
        }
        if (prev != n) MOE_TRY(add_part(p, &np, prev, n, p->invert));
    } else {
        size_t last = 0;
        for (size_t i = 0; i < n;) {
            size_t k;
            int32_t cp = cp_at(s + i, &k);
            if (char_matches(p, cp)) {
                if (last < i) MOE_TRY(add_part(p, &np, last, i, false));
                MOE_TRY(add_part(p, &np, i, i + k, true));
                last = i + k;
            }
            i += k;
        }
        if (last < n) MOE_TRY(add_part(p, &np, last, n, false));
    }
    /* fold (NormalizedString::split) into kept ranges, in place */
    struct part *v = p->parts;
    size_t nk = 0;
    bool prev_match = false;
    switch (p->behavior) {
    case B_ISOLATED:
        for (size_t i = 0; i < np; i++) v[nk++] = (struct part){v[i].a, v[i].b, false};
        break;
    case B_REMOVED:
        for (size_t i = 0; i < np; i++)
            if (!v[i].match) v[nk++] = v[i];
        break;
    case B_CONTIG:
        for (size_t i = 0; i < np; i++) {
            bool m = v[i].match;
            if (nk && m == prev_match) v[nk - 1].b = v[i].b;
            else v[nk++] = (struct part){v[i].a, v[i].b, false};
            prev_match = m;
        }
        break;
    case B_PREV:
        for (size_t i = 0; i < np; i++) {
            bool m = v[i].match;
            if (nk && m && !prev_match) v[nk - 1].b = v[i].b;
            else v[nk++] = (struct part){v[i].a, v[i].b, false};
            prev_match = m;
        }
        break;
    case B_NEXT: {
        /* walk backwards, merging a match into the part after it */
        size_t w = np;
        for (size_t i = np; i-- > 0;) {
            bool m = v[i].match;
            if (w < np && m && !prev_match) v[w].a = v[i].a;
            else v[--w] = (struct part){v[i].a, v[i].b, false};
            prev_match = m;
        }
        memmove(v, v + w, (np - w) * sizeof *v);
        nk = np - w;
        break;
    }
    }
    for (size_t i = 0; i < nk; i++)
        if (v[i].b > v[i].a) MOE_TRY(moe_tok_list_push(out, s + v[i].a, v[i].b - v[i].a,
                                                      first && v[i].a == 0));
    return MOE_OK;
}

static enum moe_status pretok_piece(struct tok_pretok *p, const char *s, size_t n, bool first,
                                    struct tok_list *out)
{
    struct tok_buf *sc = &p->scratch;
    sc->len = 0;
    switch (p->kind) {
    case P_SEQ: return MOE_ERR_INVALID_ARG; /* handled by the caller */
    case P_BYTELEVEL: {
        if (p->add_prefix_space && (n == 0 || s[0] != ' ')) MOE_TRY(moe_tok_buf_put(sc, " ", 1));
        MOE_TRY(moe_tok_buf_put(sc, s, n));
        size_t start = out->n;
        if (p->use_regex) {
            MOE_TRY(split_piece(p, sc->p, sc->len, first, out));
        } else if (sc->len) {
            MOE_TRY(moe_tok_list_push(out, sc->p, sc->len, first));
        }
        /* map every byte of the new words to its table character, in place
         * at the end of out's buffer */
        for (size_t w = start; w < out->n; w++) {
            struct tok_span sp = out->sp[w];
            size_t off = out->buf.len;
            for (size_t i = 0; i < sp.len; i++) {
                char u[4];
                size_t k = moe_tok_utf8_put(u, moe_tok_byte_cp((unsigned char)out->buf.p[sp.off + i]));
                MOE_TRY(moe_tok_buf_put(&out->buf, u, k));
            }
            out->sp[w].off = off;
            out->sp[w].len = out->buf.len - off;
        }
        return MOE_OK;
    }
    case P_METASPACE: {
        bool need = false;
        if (p->prepend == PREPEND_ALWAYS) need = true;
        if (p->prepend == PREPEND_FIRST) need = first;
        /* prepended unless the piece (after replacement) already starts
         * with the replacement character */
        bool starts = (n >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0) || (n && s[0] == ' ');
        if (need && !starts) MOE_TRY(moe_tok_buf_put(sc, p->repl, p->repl_len));
        size_t done = 0;
        for (size_t i = 0; i < n; i++)
            if (s[i] == ' ') {
                MOE_TRY(moe_tok_buf_put(sc, s + done, i - done));
                MOE_TRY(moe_tok_buf_put(sc, p->repl, p->repl_len));
                done = i + 1;
            }
        MOE_TRY(moe_tok_buf_put(sc, s + done, n - done));
        if (!p->split) return sc->len ? moe_tok_list_push(out, sc->p, sc->len, first) : MOE_OK;
        return split_piece(p, sc->p, sc->len, first, out);
    }
    default:
        return split_piece(p, s, n, first, out);
    }
}

enum moe_status moe_tok_pretokenize(struct tok_pretok *p, struct tok_list *io, struct tok_list *tmp)
{
    if (!p) return MOE_OK;
    if (p->kind == P_SEQ) {
        for (size_t i = 0; i < p->n_kids; i++) MOE_TRY(moe_tok_pretokenize(p->kids[i], io, tmp));
        return MOE_OK;
    }
    moe_tok_list_clear(tmp);
    for (size_t i = 0; i < io->n; i++)
        MOE_TRY(pretok_piece(p, io->buf.p + io->sp[i].off, io->sp[i].len, io->sp[i].first, tmp));
    struct tok_list t = *io;
    *io = *tmp;
    *tmp = t;
    return MOE_OK;
}
