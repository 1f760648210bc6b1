/* tokenizer_util.c - buffers, UTF-8, hash map and PCRE2 regex helpers for
 * the tokenizer (see tokenizer_impl.h). */
#include "runtime/text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ buffers */

static enum moe_status grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return MOE_OK;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2) return moe_fail(MOE_ERR_NOMEM, "tokenizer: buffer size overflow");
        c *= 2;
    }
    size_t bytes;
    if (!moe_mul_size(c, elem, &bytes)) return moe_fail(MOE_ERR_NOMEM, "tokenizer: size overflow");
    void *q = realloc(*p, bytes);
    if (!q) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", bytes);
    *p = q;
    *cap = c;
    return MOE_OK;
}

enum moe_status moe_tok_buf_put(struct tok_buf *b, const char *s, size_t n)
{
    size_t need;
    if (!moe_add_size(b->len, n + 1, &need)) return moe_fail(MOE_ERR_NOMEM, "tokenizer: overflow");
    MOE_TRY(grow((void **)&b->p, &b->cap, need, 1));
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0'; /* always NUL-terminated, not counted in len */
    return MOE_OK;
}

void moe_tok_buf_free(struct tok_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

enum moe_status moe_tok_list_push(struct tok_list *l, const char *s, size_t n, bool first)
{
    MOE_TRY(grow((void **)&l->sp, &l->cap, l->n + 1, sizeof *l->sp));
    size_t off = l->buf.len;
    MOE_TRY(moe_tok_buf_put(&l->buf, s, n));
    l->sp[l->n++] = (struct tok_span){off, n, first};
    return MOE_OK;
}

void moe_tok_list_clear(struct tok_list *l)
{
    l->n = 0;
    l->buf.len = 0;
}

void moe_tok_list_free(struct tok_list *l)
{
    moe_tok_buf_free(&l->buf);
    free(l->sp);
    memset(l, 0, sizeof *l);
}

/* --------------------------------------------------------------- UTF-8 */

size_t moe_tok_utf8_char(const unsigned char *s, size_t n, int32_t *cp, size_t *bad)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = (int32_t)c;
        return 1;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    int32_t v;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
        v = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        v = c & 0x0f;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        v = c & 0x07;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        *bad = 1;
        return 0;
    }
    /* Maximal subpart: the lead byte plus every continuation byte that could
     * still begin a valid sequence. */
    for (size_t i = 1; i < need; i++) {
        unsigned b = i < n ? s[i] : 0;
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xbf;
        if (i >= n || b < l || b > h) {
            *bad = i;
            return 0;
        }
        v = (v << 6) | (int32_t)(b & 0x3f);
    }
    *cp = v;
    return need;
}

size_t moe_tok_utf8_put(char *out, int32_t cp)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

enum moe_status moe_tok_utf8_lossy(struct tok_buf *out, const char *s, size_t n, bool *replaced)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* copy valid runs in one go */
    while (i < n) {
        int32_t cp;
        size_t bad = 0;
        size_t k = u[i] < 0x80 ? 1 : moe_tok_utf8_char(u + i, n - i, &cp, &bad);
        if (k) {
            i += k;
            continue;
        }
        MOE_TRY(moe_tok_buf_put(out, s + run, i - run));
        MOE_TRY(moe_tok_buf_put(out, "\xef\xbf\xbd", 3));
        if (replaced) *replaced = true;
        i += bad;
        run = i;
    }
    return moe_tok_buf_put(out, s + run, n - run);
}

/* ------------------------------------------------------------ hash map */

uint64_t moe_tok_hash(const char *s, size_t n)
{
    /* FNV-1a, then a final avalanche so low bits are usable as an index. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static enum moe_status map_resize(struct tok_map *m, size_t cap)
{
    struct tok_map nm = {0};
    nm.key = calloc(cap, sizeof *nm.key);
    nm.klen = calloc(cap, sizeof *nm.klen);
    nm.val = calloc(cap, sizeof *nm.val);
    nm.cap = cap;
    if (!nm.key || !nm.klen || !nm.val) {
        moe_tok_map_free(&nm);
        return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory (hash map of %zu)", cap);
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->key[i]) continue;
        size_t j = moe_tok_hash(m->key[i], m->klen[i]) & (cap - 1);
        while (nm.key[j]) j = (j + 1) & (cap - 1);
        nm.key[j] = m->key[i];
        nm.klen[j] = m->klen[i];
        nm.val[j] = m->val[i];
        nm.n++;
    }
    moe_tok_map_free(m);
    *m = nm;
    return MOE_OK;
}

enum moe_status moe_tok_map_put(struct tok_map *m, const char *k, size_t klen, int32_t v)
{
    if ((m->n + 1) * 2 > m->cap) MOE_TRY(map_resize(m, m->cap ? m->cap * 2 : 64));
    size_t j = moe_tok_hash(k, klen) & (m->cap - 1);
    while (m->key[j]) {
        if (m->klen[j] == klen && memcmp(m->key[j], k, klen) == 0) {
            m->val[j] = v;
            return MOE_OK;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->key[j] = k;
    m->klen[j] = (uint32_t)klen;
    m->val[j] = v;
    m->n++;
    return MOE_OK;
}

int32_t moe_tok_map_get(const struct tok_map *m, const char *k, size_t klen)
{
    if (!m->cap) return -1;
    size_t j = moe_tok_hash(k, klen) & (m->cap - 1);
    while (m->key[j]) {
        if (m->klen[j] == klen && memcmp(m->key[j], k, klen) == 0) return m->val[j];
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

void moe_tok_map_free(struct tok_map *m)
{
    free(m->key);
    free(m->klen);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* --------------------------------------------------------------- regex */

/* tokenizer.json regexes are Oniguruma's, Ruby syntax.  With PCRE2_UCP the
 * shorthand classes differ: PCRE2's \s also takes U+180E and its \w (10.42)
 * skips marks, while Oniguruma's \s is White_Space and its \w is Letter,
 * Mark, Decimal_Number and Connector_Punctuation; Ruby's \h is a hex digit.
 * Rewrite them to explicit properties, inside and outside character
 * classes.  (^ and $ being line anchors in Ruby is PCRE2_MULTILINE.) */
#define ONIG_W "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"
static enum moe_status onig_to_pcre2(const char *p, size_t n, struct tok_buf *out)
{
    bool in_class = false;
    for (size_t i = 0; i < n;) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            const char *rep = NULL;
            if (e == 's') rep = "\\p{White_Space}";
            else if (e == 'S') rep = "\\P{White_Space}";
            else if (e == 'w') rep = in_class ? ONIG_W : "[" ONIG_W "]";
            else if (e == 'W' && !in_class) rep = "[^" ONIG_W "]";
            else if (e == 'h') rep = in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
            else if (e == 'H' && !in_class) rep = "[^0-9a-fA-F]";
            if (rep) {
                MOE_TRY(moe_tok_buf_put(out, rep, strlen(rep)));
                i += 2;
                continue;
            }
            if (e == 'Q') { /* \Q...\E is literal: copy it whole */
                size_t j = i + 2;
                while (j + 1 < n && !(p[j] == '\\' && p[j + 1] == 'E')) j++;
                j = j + 1 < n ? j + 2 : n;
                MOE_TRY(moe_tok_buf_put(out, p + i, j - i));
                i = j;
                continue;
            }
            size_t k = 1 + moe_tok_clen((unsigned char)e);
            if (i + k > n) k = n - i;
            MOE_TRY(moe_tok_buf_put(out, p + i, k));
            i += k;
            continue;
        }
        if (!in_class && c == '[') {
            /* a ']' right after '[' or '[^' is a literal member */
            size_t j = i + 1;
            if (j < n && p[j] == '^') j++;
            if (j < n && p[j] == ']') j++;
            MOE_TRY(moe_tok_buf_put(out, p + i, j - i));
            in_class = true;
            i = j;
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
            const char *end = strstr(p + i, ":]");
            size_t j = end && (size_t)(end - p) < n ? (size_t)(end - p) + 2 : i + 2;
            MOE_TRY(moe_tok_buf_put(out, p + i, j - i));
            i = j;
            continue;
        }
        if (in_class && c == ']') in_class = false;
        MOE_TRY(moe_tok_buf_put(out, p + i, 1));
        i++;
    }
    return moe_tok_buf_put(out, "", 0);
}

enum moe_status moe_tok_regex_compile(struct tok_regex *re, const char *pat, size_t len,
                                      bool literal, const char *what)
{
    int err;
    PCRE2_SIZE at;
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    struct tok_buf rw = {0};
    pcre2_compile_context *cctx = pcre2_compile_context_create(NULL);
    if (!cctx) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory (regex)");
    pcre2_set_newline(cctx, PCRE2_NEWLINE_LF); /* Oniguruma's newline is \n only */
    if (!literal) {
        enum moe_status st = onig_to_pcre2(pat, len, &rw);
        if (st) {
            moe_tok_buf_free(&rw);
            pcre2_compile_context_free(cctx);
            return st;
        }
    }
    re->code = pcre2_compile((PCRE2_SPTR)(literal ? pat : rw.p), literal ? len : rw.len, opt, &err,
                             &at, cctx);
    moe_tok_buf_free(&rw);
    pcre2_compile_context_free(cctx);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: %s regex '%.*s' does not compile: %s (at %zu)",
                        what, (int)(len > 200 ? 200 : len), pat, (const char *)msg, (size_t)at);
    }
    re->md = pcre2_match_data_create_from_pattern(re->code, NULL);
    re->mctx = pcre2_match_context_create(NULL);
    if (!re->md || !re->mctx) {
        moe_tok_regex_free(re);
        return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory (regex match data)");
    }
    /* JIT when the library has it, else the interpreter. */
    if (pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0) {
        re->jit_stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL);
        if (re->jit_stack) pcre2_jit_stack_assign(re->mctx, NULL, re->jit_stack);
    }
    return MOE_OK;
}

void moe_tok_regex_free(struct tok_regex *re)
{
    if (re->md) pcre2_match_data_free(re->md);
    if (re->mctx) pcre2_match_context_free(re->mctx);
    if (re->jit_stack) pcre2_jit_stack_free(re->jit_stack);
    if (re->code) pcre2_code_free(re->code);
    memset(re, 0, sizeof *re);
}

enum moe_status moe_tok_regex_next(struct tok_regex *re, const char *s, size_t n, size_t *from,
                                   size_t *last_end, size_t *ms, size_t *me, bool *found)
{
    *found = false;
    while (*from <= n) {
        int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, *from, PCRE2_NO_UTF_CHECK, re->md, re->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) return MOE_OK;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return moe_fail(MOE_ERR_INVALID_ARG, "tokenizer: regex matching failed on a %zu-byte "
                                                 "piece: %s", n, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(re->md);
        size_t s0 = ov[0], e0 = ov[1];
        if (s0 == e0 && e0 == *last_end) {
            /* Empty match where the previous one ended: step one character. */
            if (*from >= n) return MOE_OK;
            *from += moe_tok_clen((unsigned char)s[*from]);
            continue;
        }
        *from = e0;
        *last_end = e0;
        *ms = s0;
        *me = e0;
        *found = true;
        return MOE_OK;
    }
    return MOE_OK;
}
