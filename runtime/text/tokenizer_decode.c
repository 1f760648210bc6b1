/* tokenizer_decode.c - decoders, moe_tokenizer_decode and the streaming
 * decoder.
 *
 * Mirrors tokenizers/src/decoders: each decoder maps a list of token strings
 * to a new list (decode_chain) and the result is concatenated.  Supported:
 * ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence.  With
 * no decoder, tokens are joined with spaces, as the Rust Tokenizer does.
 *
 * ByteFallback accepts exactly "<0xHH>" with two hex digits (either case);
 * a run of byte tokens that is not valid UTF-8 becomes one U+FFFD per byte.
 * The streaming decoder follows the Rust DecodeStream (step_decode_stream). */
#include "runtime/text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

enum dec_kind { D_SEQ, D_BYTELEVEL, D_METASPACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_REPLACE };

struct tok_decoder {
    enum dec_kind kind;
    struct tok_decoder **kids;
    size_t n_kids;
    char ch[8];          /* Metaspace replacement / Strip content (one char) */
    size_t ch_len;
    bool prepend;        /* Metaspace: prepend_scheme != never */
    size_t start, stop;  /* Strip */
    struct tok_regex re; /* Replace */
    char *content;
    size_t content_len;
};

void moe_tok_decoder_free(struct tok_decoder *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->n_kids; i++) moe_tok_decoder_free(d->kids[i]);
    free(d->kids);
    moe_tok_regex_free(&d->re);
    free(d->content);
    free(d);
}

static enum moe_status one_char(json_t *v, struct tok_decoder *d, const char *what)
{
    int32_t cp;
    size_t bad;
    size_t n = json_is_string(v) ? json_string_length(v) : 0;
    if (!n || n > 4 ||
        moe_tok_utf8_char((const unsigned char *)json_string_value(v), n, &cp, &bad) != n)
        return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: decoder %s must be one character", what);
    memcpy(d->ch, json_string_value(v), n);
    d->ch_len = n;
    return MOE_OK;
}

enum moe_status moe_tok_decoder_load(struct tok_decoder **out, json_t *j)
{
    *out = NULL;
    if (!j || json_is_null(j)) return MOE_OK;
    json_t *tj = json_object_get(j, "type");
    if (!json_is_string(tj)) return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: decoder has no type");
    const char *t = json_string_value(tj);
    struct tok_decoder *d = calloc(1, sizeof *d);
    if (!d) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    enum moe_status st = MOE_OK;
    if (!strcmp(t, "Sequence")) {
        json_t *a = json_object_get(j, "decoders");
        if (!json_is_array(a)) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: decoder Sequence has no list");
            goto fail;
        }
        d->kind = D_SEQ;
        if (!(d->kids = calloc(json_array_size(a) + 1, sizeof *d->kids))) {
            st = moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
            goto fail;
        }
        for (size_t i = 0; i < json_array_size(a); i++) {
            if ((st = moe_tok_decoder_load(&d->kids[i], json_array_get(a, i)))) goto fail;
            d->n_kids++;
        }
    } else if (!strcmp(t, "ByteLevel")) {
        d->kind = D_BYTELEVEL;
    } else if (!strcmp(t, "Metaspace")) {
        d->kind = D_METASPACE;
        if ((st = one_char(json_object_get(j, "replacement"), d, "Metaspace.replacement"))) goto fail;
        json_t *ps = json_object_get(j, "prepend_scheme");
        if (json_is_string(ps)) d->prepend = strcmp(json_string_value(ps), "never") != 0;
        else d->prepend = !json_is_false(json_object_get(j, "add_prefix_space"));
    } else if (!strcmp(t, "ByteFallback")) {
        d->kind = D_BYTEFALLBACK;
    } else if (!strcmp(t, "Fuse")) {
        d->kind = D_FUSE;
    } else if (!strcmp(t, "Strip")) {
        d->kind = D_STRIP;
        json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        if ((st = one_char(json_object_get(j, "content"), d, "Strip.content"))) goto fail;
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
            json_integer_value(b) < 0) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: decoder Strip needs start and stop counts");
            goto fail;
        }
        d->start = (size_t)json_integer_value(a);
        d->stop = (size_t)json_integer_value(b);
    } else if (!strcmp(t, "Replace")) {
        d->kind = D_REPLACE;
        json_t *pat = json_object_get(j, "pattern"), *c = json_object_get(j, "content");
        json_t *s = json_object_get(pat, "String"), *r = json_object_get(pat, "Regex");
        if (!json_is_string(c)) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: decoder Replace has no content");
            goto fail;
        }
        if (json_is_string(s))
            st = moe_tok_regex_compile(&d->re, json_string_value(s), json_string_length(s), true,
                                       "decoder Replace");
        else if (json_is_string(r))
            st = moe_tok_regex_compile(&d->re, json_string_value(r), json_string_length(r), false,
                                       "decoder Replace");
        else
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: decoder Replace pattern is neither "
                                          "String nor Regex");
        if (st) goto fail;
        d->content_len = json_string_length(c);
        if (!(d->content = malloc(d->content_len + 1))) {
            st = moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
            goto fail;
        }
        memcpy(d->content, json_string_value(c), d->content_len + 1);
    } else {
        st = moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: decoder type '%s' is not supported", t);
        goto fail;
    }
    *out = d;
    return MOE_OK;
fail:
    moe_tok_decoder_free(d);
    return st;
}

#define ITEM(l, i) ((l)->buf.p + (l)->sp[i].off)

/* "<0xHH>" -> byte, strictly; -1 otherwise */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t bad, k = moe_tok_utf8_char((const unsigned char *)s + i, n - i, &cp, &bad);
        if (!k) return false;
        i += k;
    }
    return true;
}

static enum moe_status flush_bytes(struct tok_buf *bytes, struct tok_list *out)
{
    if (!bytes->len) return MOE_OK;
    if (valid_utf8(bytes->p, bytes->len)) {
        MOE_TRY(moe_tok_list_push(out, bytes->p, bytes->len, false));
    } else {
        for (size_t i = 0; i < bytes->len; i++)
            MOE_TRY(moe_tok_list_push(out, "\xef\xbf\xbd", 3, false));
    }
    bytes->len = 0;
    return MOE_OK;
}

/* One decode_chain step: in -> out. */
static enum moe_status chain(const struct tok_decoder *d, struct tok_list *in, struct tok_list *out,
                             struct tok_buf *tmp)
{
    moe_tok_list_clear(out);
    tmp->len = 0;
    switch (d->kind) {
    case D_SEQ: return MOE_ERR_INVALID_ARG; /* handled by the caller */
    case D_BYTELEVEL:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = ITEM(in, i);
            size_t n = in->sp[i].len, mark = tmp->len;
            bool ok = true;
            for (size_t j = 0; j < n && ok;) {
                int32_t cp;
                size_t bad, k = moe_tok_utf8_char((const unsigned char *)s + j, n - j, &cp, &bad);
                int b = k ? moe_tok_char_byte(cp) : -1;
                if (b < 0) {
                    ok = false;
                    break;
                }
                char c = (char)b;
                MOE_TRY(moe_tok_buf_put(tmp, &c, 1));
                j += k;
            }
            if (!ok) { /* a token outside the byte table decodes as its own bytes */
                tmp->len = mark;
                MOE_TRY(moe_tok_buf_put(tmp, s, n));
            }
        }
        {
            struct tok_buf fixed = {0};
            enum moe_status st = moe_tok_utf8_lossy(&fixed, tmp->p ? tmp->p : "", tmp->len, NULL);
            if (!st) st = moe_tok_list_push(out, fixed.p, fixed.len, false);
            moe_tok_buf_free(&fixed);
            return st;
        }
    case D_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = ITEM(in, i);
            size_t n = in->sp[i].len;
            tmp->len = 0;
            MOE_TRY(moe_tok_buf_put(tmp, "", 0));
            size_t done = 0;
            for (size_t j = 0; j + d->ch_len <= n;) {
                if (memcmp(s + j, d->ch, d->ch_len) == 0) {
                    MOE_TRY(moe_tok_buf_put(tmp, s + done, j - done));
                    if (!(i == 0 && d->prepend)) MOE_TRY(moe_tok_buf_put(tmp, " ", 1));
                    j += d->ch_len;
                    done = j;
                } else {
                    j += moe_tok_clen((unsigned char)s[j]);
                }
            }
            MOE_TRY(moe_tok_buf_put(tmp, s + done, n - done));
            MOE_TRY(moe_tok_list_push(out, tmp->p, tmp->len, false));
        }
        return MOE_OK;
    case D_BYTEFALLBACK:
        for (size_t i = 0; i < in->n; i++) {
            int b = byte_token(ITEM(in, i), in->sp[i].len);
            if (b >= 0) {
                char c = (char)b;
                MOE_TRY(moe_tok_buf_put(tmp, &c, 1));
                continue;
            }
            MOE_TRY(flush_bytes(tmp, out));
            MOE_TRY(moe_tok_list_push(out, ITEM(in, i), in->sp[i].len, false));
        }
        return flush_bytes(tmp, out);
    case D_FUSE:
        for (size_t i = 0; i < in->n; i++) MOE_TRY(moe_tok_buf_put(tmp, ITEM(in, i), in->sp[i].len));
        return moe_tok_list_push(out, tmp->p ? tmp->p : "", tmp->len, false);
    case D_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = ITEM(in, i);
            size_t a = 0, b = in->sp[i].len, c = d->ch_len;
            for (size_t k = 0; k < d->start && a + c <= b && memcmp(s + a, d->ch, c) == 0; k++) a += c;
            for (size_t k = 0; k < d->stop && b >= a + c && memcmp(s + b - c, d->ch, c) == 0; k++) b -= c;
            MOE_TRY(moe_tok_list_push(out, s + a, b - a, false));
        }
        return MOE_OK;
    case D_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = ITEM(in, i);
            size_t n = in->sp[i].len, from = 0, last = SIZE_MAX, ms, me, done = 0;
            tmp->len = 0;
            MOE_TRY(moe_tok_buf_put(tmp, "", 0));
            struct tok_regex *re = (struct tok_regex *)&d->re; /* match data is scratch */
            for (bool found;;) {
                MOE_TRY(moe_tok_regex_next(re, s, n, &from, &last, &ms, &me, &found));
                if (!found) break;
                MOE_TRY(moe_tok_buf_put(tmp, s + done, ms - done));
                MOE_TRY(moe_tok_buf_put(tmp, d->content, d->content_len));
                done = me;
            }
            MOE_TRY(moe_tok_buf_put(tmp, s + done, n - done));
            MOE_TRY(moe_tok_list_push(out, tmp->p, tmp->len, false));
        }
        return MOE_OK;
    }
    return MOE_OK;
}

static enum moe_status run(const struct tok_decoder *d, struct tok_list **cur, struct tok_list **other,
                           struct tok_buf *tmp)
{
    if (d->kind == D_SEQ) {
        for (size_t i = 0; i < d->n_kids; i++) MOE_TRY(run(d->kids[i], cur, other, tmp));
        return MOE_OK;
    }
    MOE_TRY(chain(d, *cur, *other, tmp));
    struct tok_list *t = *cur;
    *cur = *other;
    *other = t;
    return MOE_OK;
}

enum moe_status moe_tok_decode_tokens(const struct tok_decoder *d, struct tok_list *tokens,
                                      struct tok_buf *out)
{
    out->len = 0;
    MOE_TRY(moe_tok_buf_put(out, "", 0));
    if (!d) {
        for (size_t i = 0; i < tokens->n; i++) {
            if (i) MOE_TRY(moe_tok_buf_put(out, " ", 1));
            MOE_TRY(moe_tok_buf_put(out, ITEM(tokens, i), tokens->sp[i].len));
        }
        return MOE_OK;
    }
    struct tok_list other = {0}, *cur = tokens, *oth = &other;
    struct tok_buf tmp = {0};
    enum moe_status st = run(d, &cur, &oth, &tmp);
    for (size_t i = 0; !st && i < cur->n; i++) st = moe_tok_buf_put(out, ITEM(cur, i), cur->sp[i].len);
    /* the steps ping-pong between the caller's list (now scratch) and ours */
    moe_tok_list_free(&other);
    moe_tok_buf_free(&tmp);
    return st;
}

/* moe_tokenizer_decode, keeping the special ids keep[0..n_keep) */
static enum moe_status decode_keep(const struct moe_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                                   const int32_t *keep, int n_keep, char **out)
{
    *out = NULL;
    const struct moe_tok_impl *im = tok->impl;
    if (!im) return moe_fail(MOE_ERR_INVALID_ARG, "tokenizer: not loaded");
    struct tok_list toks = {0};
    struct tok_buf text = {0};
    enum moe_status st = MOE_OK;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        const char *s = moe_tokenizer_id_to_token(tok, id);
        if (!s) {
            st = moe_fail(MOE_ERR_INVALID_ARG, "tokenizer: token id %d is out of range [0, %d)", id,
                          tok->n_vocab);
            goto out;
        }
        bool kept = false;
        for (int k = 0; k < n_keep && !kept; k++) kept = keep[k] == id;
        if (skip_special && im->id_special[id] && !kept) continue;
        if ((st = moe_tok_list_push(&toks, s, strlen(s), false))) goto out;
    }
    if ((st = moe_tok_decode_tokens(im->decoder, &toks, &text))) goto out;
    if (!text.p && (st = moe_tok_buf_put(&text, "", 0))) goto out;
    *out = text.p;
    text.p = NULL;
out:
    moe_tok_list_free(&toks);
    moe_tok_buf_free(&text);
    return st;
}

enum moe_status moe_tokenizer_decode(const struct moe_tokenizer *tok, const int32_t *ids, size_t n,
                                     bool skip_special, char **out)
{
    return decode_keep(tok, ids, n, skip_special, NULL, 0, out);
}

/* ------------------------------------------------------------ streaming */

void moe_detok_init(struct moe_detok *d, const struct moe_tokenizer *tok, bool skip_special)
{
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
}

void moe_detok_keep(struct moe_detok *d, const char *const *tokens)
{
    for (int i = 0; tokens && tokens[i] && d->n_keep < MOE_DETOK_MAX_KEEP; i++) {
        const int32_t id = moe_tokenizer_token_to_id(d->tok, tokens[i]);
        if (id >= 0) d->keep[d->n_keep++] = id;
    }
}

void moe_detok_free(struct moe_detok *d)
{
    free(d->ids);
    free(d->prefix);
    free(d->text);
    const struct moe_tokenizer *tok = d->tok;
    bool skip = d->skip_special;
    int32_t keep[MOE_DETOK_MAX_KEEP];
    const int n_keep = d->n_keep;
    memcpy(keep, d->keep, sizeof keep);
    moe_detok_init(d, tok, skip);
    memcpy(d->keep, keep, sizeof keep);
    d->n_keep = n_keep;
}

static bool ends_with_fffd(const char *s, size_t n)
{
    return n >= 3 && memcmp(s + n - 3, "\xef\xbf\xbd", 3) == 0;
}

/* Emits decode(ids) minus the prefix when it grew (or always, when
 * flushing), then slides the window to the last ids. */
static enum moe_status step(struct moe_detok *d, bool flush, const char **text)
{
    char *s = NULL;
    *text = "";
    MOE_TRY(decode_keep(d->tok, d->ids, d->n, d->skip_special, d->keep, d->n_keep, &s));
    size_t len = strlen(s);
    if (len <= d->prefix_len || (!flush && ends_with_fffd(s, len))) {
        free(s);
        return MOE_OK;
    }
    free(d->text);
    d->text = NULL;
    if (memcmp(s, d->prefix ? d->prefix : "", d->prefix_len) == 0) {
        d->text = strdup(s + d->prefix_len);
        free(s);
        if (!d->text) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    } else {
        /* The context decodes differently once followed by the new ids (a
         * ByteFallback run judged as a whole: complete bytes followed by a
         * dangling one).  Rust's DecodeStream fails here; we emit the new ids
         * decoded on their own. */
        free(s);
        MOE_TRY(decode_keep(d->tok, d->ids + d->prefix_index, d->n - d->prefix_index, d->skip_special, d->keep,
                            d->n_keep, &d->text));
    }
    *text = d->text;
    /* keep ids[prefix_index..] as context for the next step */
    size_t keep = d->n - d->prefix_index;
    memmove(d->ids, d->ids + d->prefix_index, keep * sizeof *d->ids);
    d->n = keep;
    free(d->prefix);
    d->prefix = NULL;
    MOE_TRY(decode_keep(d->tok, d->ids, d->n, d->skip_special, d->keep, d->n_keep, &d->prefix));
    d->prefix_len = strlen(d->prefix);
    d->prefix_index = d->n;
    return MOE_OK;
}

enum moe_status moe_detok_push(struct moe_detok *d, int32_t id, const char **text)
{
    *text = "";
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 16;
        int32_t *p = realloc(d->ids, c * sizeof *p);
        if (!p) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
        d->ids = p;
        d->cap = c;
    }
    d->ids[d->n++] = id;
    return step(d, false, text);
}

enum moe_status moe_detok_flush(struct moe_detok *d, const char **text)
{
    *text = "";
    if (d->n == d->prefix_index) return MOE_OK;
    return step(d, true, text);
}

/* The bytes one token contributes in the middle of a text: the decoder
 * chain on the token alone, with every step that depends on the token's
 * place in the text left out (Metaspace's and Strip's removal of a leading
 * space) and byte tokens ("<0xHH>", ByteLevel characters) kept as raw
 * bytes, not checked as UTF-8. */
static enum moe_status raw_bytes(const struct tok_decoder *d, struct tok_buf *b, struct tok_buf *tmp)
{
    switch (d->kind) {
    case D_SEQ:
        for (size_t i = 0; i < d->n_kids; i++) MOE_TRY(raw_bytes(d->kids[i], b, tmp));
        return MOE_OK;
    case D_FUSE:
    case D_STRIP:
        return MOE_OK;
    case D_BYTEFALLBACK: {
        int v = byte_token(b->p, b->len);
        if (v >= 0) {
            b->p[0] = (char)v;
            b->len = 1;
        }
        return MOE_OK;
    }
    case D_REPLACE: { /* position-free: the decoder's own step on a list of one */
        struct tok_list in = {0}, out = {0};
        enum moe_status st = moe_tok_list_push(&in, b->p, b->len, false);
        if (!st) st = chain(d, &in, &out, tmp);
        if (!st) {
            b->len = 0;
            st = moe_tok_buf_put(b, ITEM(&out, 0), out.sp[0].len);
        }
        moe_tok_list_free(&in);
        moe_tok_list_free(&out);
        return st;
    }
    case D_BYTELEVEL:
    case D_METASPACE:
        break;
    }
    tmp->len = 0;
    MOE_TRY(moe_tok_buf_put(tmp, "", 0));
    for (size_t j = 0; j < b->len;) {
        int32_t cp;
        size_t bad, k = moe_tok_utf8_char((const unsigned char *)b->p + j, b->len - j, &cp, &bad);
        if (!k) k = 1;
        if (d->kind == D_BYTELEVEL) {
            int v = moe_tok_char_byte(cp);
            char c = (char)v;
            if (v < 0) MOE_TRY(moe_tok_buf_put(tmp, b->p + j, k));
            else MOE_TRY(moe_tok_buf_put(tmp, &c, 1));
        } else if (k == d->ch_len && !memcmp(b->p + j, d->ch, k)) {
            MOE_TRY(moe_tok_buf_put(tmp, " ", 1));
        } else {
            MOE_TRY(moe_tok_buf_put(tmp, b->p + j, k));
        }
        j += k;
    }
    b->len = 0;
    return moe_tok_buf_put(b, tmp->p, tmp->len);
}

enum moe_status moe_tokenizer_token_bytes(const struct moe_tokenizer *tok, int32_t id, char **bytes,
                                          size_t *len, bool *special)
{
    *bytes = NULL;
    *len = 0;
    const struct moe_tok_impl *im = tok->impl;
    const char *s = moe_tokenizer_id_to_token(tok, id);
    if (!im || !s)
        return moe_fail(MOE_ERR_INVALID_ARG, "tokenizer: token id %d is out of range [0, %d)", id,
                        tok->n_vocab);
    *special = im->id_special[id] || im->id_added[id] != NULL;
    struct tok_buf b = {0}, tmp = {0};
    enum moe_status st = moe_tok_buf_put(&b, s, strlen(s));
    if (!st && !im->id_added[id] && im->decoder) st = raw_bytes(im->decoder, &b, &tmp);
    free(tmp.p);
    if (st) {
        free(b.p);
        return st;
    }
    if (!b.p && !(b.p = malloc(1))) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    *bytes = b.p;
    *len = b.len;
    return MOE_OK;
}
