/* tokenizer.c - loading tokenizer.json and its config files, added tokens,
 * encode and the post-processor.
 *
 * Mirrors the Rust tokenizers crate: Tokenizer::encode and
 * AddedVocabulary::extract_and_normalize (tokenizer/added_vocabulary.rs).
 * Added tokens are found leftmost-longest (as its Aho-Corasick automaton
 * with MatchKind::LeftmostLongest does), first those with normalized=false
 * on the raw text, then, in each remaining piece after normalization, those
 * with normalized=true, whose patterns are their content run through the
 * normalizer.  single_word, lstrip and rstrip are applied per match as in
 * AddedVocabulary::find_matches, with Unicode \w and \s. */
#include "runtime/text/tokenizer_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct seg {
    size_t a, b;
    int32_t id; /* added token id, or -1 for text */
};
struct seg_vec {
    struct seg *v;
    size_t n, cap;
};

static enum moe_status seg_push(struct seg_vec *s, size_t a, size_t b, int32_t id)
{
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 16;
        struct seg *p = realloc(s->v, c * sizeof *p);
        if (!p) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
        s->v = p;
        s->cap = c;
    }
    s->v[s->n++] = (struct seg){a, b, id};
    return MOE_OK;
}

static enum moe_status push_ids(int32_t **ids, size_t *n, size_t *cap, const int32_t *src, size_t k)
{
    if (*n + k > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *n + k) c *= 2;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
        *ids = p;
        *cap = c;
    }
    if (k) memcpy(*ids + *n, src, k * sizeof *src);
    *n += k;
    return MOE_OK;
}

/* ------------------------------------------------------ added tokens */

static void matcher_free(struct tok_matcher *m)
{
    if (m->pat)
        for (size_t i = 0; i < m->n; i++) free(m->pat[i]);
    free(m->pat);
    free(m->pat_len);
    free(m->heads);
    free(m->bucket_end);
    free(m->order);
    memset(m, 0, sizeof *m);
}

/* Builds a matcher over the added tokens with added[i].normalized == want;
 * normalized patterns go through the normalizer first. */
static enum moe_status matcher_build(struct moe_tok_impl *im, struct tok_matcher *m, bool want)
{
    size_t n = im->n_added;
    m->n = n;
    m->pat = calloc(n + 1, sizeof *m->pat);
    m->pat_len = calloc(n + 1, sizeof *m->pat_len);
    m->heads = malloc(256 * sizeof *m->heads);
    m->bucket_end = malloc(256 * sizeof *m->bucket_end);
    m->order = malloc((n + 1) * sizeof *m->order);
    if (!m->pat || !m->pat_len || !m->heads || !m->bucket_end || !m->order)
        return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        struct tok_added *t = &im->added[i];
        if (t->normalized != want) continue;
        struct tok_buf io = {0}, tmp = {0};
        enum moe_status st = moe_tok_buf_put(&io, t->content, t->len);
        if (!st && want) st = moe_tok_normalize(im->norm, &io, &tmp);
        moe_tok_buf_free(&tmp);
        if (st) {
            moe_tok_buf_free(&io);
            return st;
        }
        m->pat[i] = io.p;
        m->pat_len[i] = io.len;
    }
    /* bucket by first byte, longest first, then by index */
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        m->heads[b] = (int32_t)k;
        size_t start = k;
        for (size_t i = 0; i < n; i++)
            if (m->pat[i] && m->pat_len[i] && (unsigned char)m->pat[i][0] == b) {
                size_t j = k++;
                while (j > start && m->pat_len[m->order[j - 1]] < m->pat_len[i]) {
                    m->order[j] = m->order[j - 1];
                    j--;
                }
                m->order[j] = (int32_t)i;
            }
        m->bucket_end[b] = (int32_t)k;
    }
    return MOE_OK;
}

/* Whether s[a..b) (one character) is a regex-crate \w: Alphabetic (which
 * takes e.g. circled letters, category So), marks, decimal digits,
 * connector punctuation, joiners. */
static bool is_word_char(struct moe_tok_impl *im, const char *s, size_t a, size_t b)
{
    return pcre2_match(im->word_re.code, (PCRE2_SPTR)(s + a), b - a, 0,
                       PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, im->word_re.md, NULL) > 0;
}

static int32_t cp_before(const char *s, size_t end, size_t *start)
{
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
    int32_t cp;
    size_t bad;
    if (!moe_tok_utf8_char((const unsigned char *)s + i, end - i, &cp, &bad)) cp = 0xfffd;
    *start = i;
    return cp;
}

static int32_t cp_after(const char *s, size_t n, size_t at, size_t *len)
{
    int32_t cp;
    size_t bad;
    *len = moe_tok_utf8_char((const unsigned char *)s + at, n - at, &cp, &bad);
    if (!*len) {
        *len = 1;
        cp = 0xfffd;
    }
    return cp;
}

/* AddedVocabulary::find_matches: the splits of s[0..n) into text and added
 * tokens.  Empty text pieces are left out. */
static enum moe_status find_matches(struct moe_tok_impl *im, const struct tok_matcher *m,
                                    const char *s, size_t n, struct seg_vec *out)
{
    out->n = 0;
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        /* leftmost-longest match at or after pos */
        size_t ms = 0, me = 0;
        int32_t ti = -1;
        for (size_t i = pos; i < n && ti < 0; i++) {
            unsigned char c = (unsigned char)s[i];
            for (int32_t k = m->heads[c]; k < m->bucket_end[c]; k++) {
                int32_t t = m->order[k];
                size_t l = m->pat_len[t];
                if (l <= n - i && memcmp(s + i, m->pat[t], l) == 0) {
                    ti = t;
                    ms = i;
                    me = i + l;
                    break;
                }
            }
        }
        if (ti < 0) break;
        pos = me; /* the automaton resumes after the raw match */
        const struct tok_added *t = &im->added[ti];
        size_t start = ms, stop = me, k;
        if (t->single_word) {
            bool start_space = start == 0 || (cp_before(s, start, &k), !is_word_char(im, s, k, start));
            bool stop_space = stop == n || (cp_after(s, n, stop, &k), !is_word_char(im, s, stop, stop + k));
            if (!start_space || !stop_space) continue;
        }
        if (t->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t b;
                if (!moe_tok_is_ws(cp_before(s, ns, &b))) break;
                ns = b;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (t->rstrip) {
            while (stop < n && moe_tok_is_ws(cp_after(s, n, stop, &k))) stop += k;
        }
        if (start_offset < start) MOE_TRY(seg_push(out, start_offset, start, -1));
        MOE_TRY(seg_push(out, start, stop, t->id));
        start_offset = stop;
    }
    if (start_offset < n) MOE_TRY(seg_push(out, start_offset, n, -1));
    return MOE_OK;
}

/* ------------------------------------------------------------ encode */

enum moe_status moe_tokenizer_encode(struct moe_tokenizer *tok, const char *text, size_t len,
                                     bool add_special, int32_t **ids_out, size_t *n_out,
                                     bool *invalid_utf8)
{
    *ids_out = NULL;
    *n_out = 0;
    if (invalid_utf8) *invalid_utf8 = false;
    struct moe_tok_impl *im = tok->impl;
    if (!im) return moe_fail(MOE_ERR_INVALID_ARG, "tokenizer: not loaded");
    enum moe_status st;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    struct seg_vec raw = {0}, sub = {0};
    im->clean.len = 0;
    if ((st = moe_tok_utf8_lossy(&im->clean, text ? text : "", len, invalid_utf8))) goto fail;
    if ((st = push_ids(&ids, &n, &cap, NULL, 0))) goto fail;
    if (add_special && (st = push_ids(&ids, &n, &cap, im->post_pre, im->n_post_pre))) goto fail;

    if ((st = find_matches(im, &im->raw_match, im->clean.p, im->clean.len, &raw))) goto fail;
    for (size_t r = 0; r < raw.n; r++) {
        struct seg rs = raw.v[r];
        if (rs.id >= 0) {
            if ((st = push_ids(&ids, &n, &cap, &rs.id, 1))) goto fail;
            continue;
        }
        im->seg.len = 0;
        if ((st = moe_tok_buf_put(&im->seg, im->clean.p + rs.a, rs.b - rs.a)) ||
            (st = moe_tok_normalize(im->norm, &im->seg, &im->tmp)) ||
            (st = find_matches(im, &im->norm_match, im->seg.p, im->seg.len, &sub)))
            goto fail;
        for (size_t k = 0; k < sub.n; k++) {
            struct seg ss = sub.v[k];
            if (ss.id >= 0) {
                if ((st = push_ids(&ids, &n, &cap, &ss.id, 1))) goto fail;
                continue;
            }
            moe_tok_list_clear(&im->words);
            if ((st = moe_tok_list_push(&im->words, im->seg.p + ss.a, ss.b - ss.a,
                                        rs.a == 0 && ss.a == 0)) ||
                (st = moe_tok_pretokenize(im->pretok, &im->words, &im->words_tmp)))
                goto fail;
            for (size_t w = 0; w < im->words.n; w++) {
                struct tok_span sp = im->words.sp[w];
                if ((st = moe_tok_bpe_encode(&im->bpe, im->words.buf.p + sp.off, sp.len, &ids, &n,
                                             &cap)))
                    goto fail;
            }
        }
    }
    if (add_special && (st = push_ids(&ids, &n, &cap, im->post_post, im->n_post_post))) goto fail;
    free(raw.v);
    free(sub.v);
    *ids_out = ids;
    *n_out = n;
    return MOE_OK;
fail:
    free(raw.v);
    free(sub.v);
    free(ids);
    return st;
}

/* ------------------------------------------------------------- lookup */

const char *moe_tokenizer_id_to_token(const struct moe_tokenizer *tok, int32_t id)
{
    const struct moe_tok_impl *im = tok->impl;
    if (!im || id < 0 || id >= tok->n_vocab) return NULL;
    if (im->id_added[id]) return im->id_added[id];
    return id < im->bpe.n_vocab ? im->bpe.vocab[id] : NULL;
}

int32_t moe_tokenizer_token_to_id(const struct moe_tokenizer *tok, const char *token)
{
    const struct moe_tok_impl *im = tok->impl;
    if (!im) return -1;
    size_t l = strlen(token);
    int32_t id = moe_tok_map_get(&im->added_map, token, l);
    return id >= 0 ? id : moe_tok_map_get(&im->bpe.vocab_map, token, l);
}

/* ------------------------------------------------------ post-processor */

static enum moe_status ids_append(int32_t **v, size_t *n, const int32_t *src, size_t k, bool front)
{
    int32_t *p = realloc(*v, (*n + k + 1) * sizeof *p);
    if (!p) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    if (k && front) {
        memmove(p + k, p, *n * sizeof *p);
        memcpy(p, src, k * sizeof *p);
    } else if (k) {
        memcpy(p + *n, src, k * sizeof *p);
    }
    *v = p;
    *n += k;
    return MOE_OK;
}

/* Flattens the post-processor into ids before and after the sequence. */
static enum moe_status post_load(struct moe_tok_impl *im, json_t *j)
{
    if (!j || json_is_null(j)) return MOE_OK;
    json_t *tj = json_object_get(j, "type");
    const char *t = json_is_string(tj) ? json_string_value(tj) : "";
    if (!strcmp(t, "ByteLevel")) return MOE_OK; /* offsets only */
    if (!strcmp(t, "Sequence")) {
        json_t *a = json_object_get(j, "processors");
        if (!json_is_array(a))
            return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: post_processor Sequence has no list");
        for (size_t i = 0; i < json_array_size(a); i++) MOE_TRY(post_load(im, json_array_get(a, i)));
        return MOE_OK;
    }
    int32_t *pre = NULL, *post = NULL;
    size_t npre = 0, npost = 0;
    enum moe_status st = MOE_OK;
    if (!strcmp(t, "RobertaProcessing") || !strcmp(t, "BertProcessing")) {
        json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        if (!json_is_integer(json_array_get(cls, 1)) || !json_is_integer(json_array_get(sep, 1)))
            return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: post_processor %s needs cls and sep", t);
        int32_t c = (int32_t)json_integer_value(json_array_get(cls, 1));
        int32_t s = (int32_t)json_integer_value(json_array_get(sep, 1));
        if ((st = ids_append(&pre, &npre, &c, 1, false)) || (st = ids_append(&post, &npost, &s, 1, false)))
            goto out;
    } else if (!strcmp(t, "TemplateProcessing")) {
        json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
        if (!json_is_array(single)) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: TemplateProcessing has no single template");
            goto out;
        }
        bool seen_a = false;
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i);
            json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
            if (sq) {
                json_t *sid = json_object_get(sq, "id");
                if (!json_is_string(sid) || strcmp(json_string_value(sid), "A") || seen_a) {
                    st = moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: TemplateProcessing single "
                                                       "template must use sequence A once");
                    goto out;
                }
                seen_a = true;
                continue;
            }
            const char *name = json_string_value(json_object_get(sp, "id"));
            json_t *tk = name ? json_object_get(specials, name) : NULL;
            json_t *tids = json_object_get(tk, "ids");
            if (!json_is_array(tids)) {
                st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: TemplateProcessing special token "
                                              "'%s' is not defined", name ? name : "?");
                goto out;
            }
            for (size_t k = 0; k < json_array_size(tids); k++) {
                json_t *v = json_array_get(tids, k);
                if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                    json_integer_value(v) >= INT32_MAX) {
                    st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: TemplateProcessing '%s' has a bad id",
                                  name);
                    goto out;
                }
                int32_t id = (int32_t)json_integer_value(v);
                if ((st = seen_a ? ids_append(&post, &npost, &id, 1, false)
                                 : ids_append(&pre, &npre, &id, 1, false)))
                    goto out;
            }
        }
        if (!seen_a) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: TemplateProcessing single has no $A");
            goto out;
        }
    } else {
        return moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: post_processor type '%s' is not supported",
                        t);
    }
    /* a later processor wraps the result of the earlier ones */
    if ((st = ids_append(&im->post_pre, &im->n_post_pre, pre, npre, true)) ||
        (st = ids_append(&im->post_post, &im->n_post_post, post, npost, false)))
        goto out;
out:
    free(pre);
    free(post);
    return st;
}

/* ---------------------------------------------------------------- load */

void moe_tokenizer_free(struct moe_tokenizer *tok)
{
    struct moe_tok_impl *im = tok->impl;
    if (im) {
        moe_tok_bpe_free(&im->bpe);
        for (size_t i = 0; i < im->n_added; i++) {
            free(im->added[i].content);
            free(im->added[i].decoded);
        }
        free(im->added);
        free(im->id_added);
        free(im->id_special);
        moe_tok_map_free(&im->added_map);
        matcher_free(&im->raw_match);
        matcher_free(&im->norm_match);
        moe_tok_regex_free(&im->word_re);
        moe_tok_norm_free(im->norm);
        moe_tok_pretok_free(im->pretok);
        moe_tok_decoder_free(im->decoder);
        free(im->post_pre);
        free(im->post_post);
        moe_tok_buf_free(&im->clean);
        moe_tok_buf_free(&im->seg);
        moe_tok_buf_free(&im->tmp);
        moe_tok_list_free(&im->words);
        moe_tok_list_free(&im->words_tmp);
        free(im);
    }
    free(tok->bos_token);
    free(tok->eos_token);
    free(tok->chat_template);
    memset(tok, 0, sizeof *tok);
    tok->bos_id = -1;
}

static bool flag(json_t *o, const char *k)
{
    return json_is_true(json_object_get(o, k));
}

static enum moe_status load_added(struct moe_tok_impl *im, json_t *arr, int32_t *max_id)
{
    if (!arr || json_is_null(arr)) return MOE_OK;
    if (!json_is_array(arr))
        return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: added_tokens is not an array");
    size_t n = json_array_size(arr);
    if (!(im->added = calloc(n + 1, sizeof *im->added)))
        return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(arr, i), *id = json_object_get(e, "id"),
               *c = json_object_get(e, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX - 1 || !json_is_string(c) || !json_string_length(c))
            return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] needs an id and "
                                            "non-empty content", i);
        struct tok_added *t = &im->added[im->n_added];
        t->len = json_string_length(c);
        if (!(t->content = malloc(t->len + 1))) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
        memcpy(t->content, json_string_value(c), t->len + 1);
        im->n_added++;
        t->id = (int32_t)json_integer_value(id);
        t->special = flag(e, "special");
        /* serde default for a missing "normalized" is !special */
        json_t *nz = json_object_get(e, "normalized");
        t->normalized = nz ? json_is_true(nz) : !t->special;
        t->lstrip = flag(e, "lstrip");
        t->rstrip = flag(e, "rstrip");
        t->single_word = flag(e, "single_word");
        if (t->id > *max_id) *max_id = t->id;
    }
    return MOE_OK;
}

static enum moe_status load_tokenizer_json(struct moe_tokenizer *tok, json_t *root)
{
    enum moe_status st;
    if (!json_is_object(root)) return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: top level is not an object");
    struct moe_tok_impl *im = calloc(1, sizeof *im);
    if (!im) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    tok->impl = im;

    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: no model object");
    json_t *mt = json_object_get(model, "type");
    if (mt && !json_is_string(mt)) return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: model.type is not a string");
    if (mt && strcmp(json_string_value(mt), "BPE") != 0)
        return moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: model type '%s' is not supported",
                        json_string_value(mt));
    json_t *tr = json_object_get(root, "truncation"), *pad = json_object_get(root, "padding");
    if (tr && !json_is_null(tr)) return moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: truncation is not supported");
    if (pad && !json_is_null(pad)) return moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: padding is not supported");

    if ((st = moe_tok_bpe_load(&im->bpe, model)) ||
        (st = moe_tok_norm_load(&im->norm, json_object_get(root, "normalizer"))) ||
        (st = moe_tok_pretok_load(&im->pretok, json_object_get(root, "pre_tokenizer"))) ||
        (st = moe_tok_decoder_load(&im->decoder, json_object_get(root, "decoder"))) ||
        (st = post_load(im, json_object_get(root, "post_processor"))))
        return st;

    int32_t max_id = im->bpe.n_vocab - 1;
    MOE_TRY(load_added(im, json_object_get(root, "added_tokens"), &max_id));
    tok->n_vocab = max_id + 1;
    im->id_added = calloc((size_t)tok->n_vocab + 1, sizeof *im->id_added);
    im->id_special = calloc((size_t)tok->n_vocab + 1, sizeof *im->id_special);
    if (!im->id_added || !im->id_special) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    struct tok_map special = {0}; /* contents of the special tokens, borrowed */
    enum moe_status st2 = MOE_OK;
    for (size_t i = 0; i < im->n_added && !st2; i++) {
        struct tok_added *t = &im->added[i];
        /* A normalized token decodes as its normalized form, as the Rust
         * AddedVocabulary::simple_id_to_token does. */
        if (t->normalized && im->norm) {
            struct tok_buf io = {0}, tmp = {0};
            st2 = moe_tok_buf_put(&io, t->content, t->len);
            if (!st2) st2 = moe_tok_normalize(im->norm, &io, &tmp);
            moe_tok_buf_free(&tmp);
            if (!st2 && (io.len != t->len || memcmp(io.p, t->content, t->len) != 0)) {
                t->decoded = io.p;
                io.p = NULL;
            }
            moe_tok_buf_free(&io);
        }
        im->id_added[t->id] = t->decoded ? t->decoded : t->content;
        if (!st2) st2 = moe_tok_map_put(&im->added_map, t->content, t->len, t->id);
        if (!st2 && t->special) st2 = moe_tok_map_put(&special, t->content, t->len, t->id);
    }
    /* skip_special drops every id whose token string is a special token's
     * content (Tokenizer::decode filters on the string, not the id) */
    for (int32_t id = 0; id < tok->n_vocab && !st2 && special.n; id++) {
        const char *str = moe_tokenizer_id_to_token(tok, id);
        im->id_special[id] = str && moe_tok_map_get(&special, str, strlen(str)) >= 0;
    }
    moe_tok_map_free(&special);
    if (st2) return st2;
    for (size_t i = 0; i < im->n_post_pre; i++)
        if (im->post_pre[i] < 0 || im->post_pre[i] >= tok->n_vocab)
            return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: post_processor id %d is out of range",
                            im->post_pre[i]);
    for (size_t i = 0; i < im->n_post_post; i++)
        if (im->post_post[i] < 0 || im->post_post[i] >= tok->n_vocab)
            return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: post_processor id %d is out of range",
                            im->post_post[i]);
    static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";
    MOE_TRY(moe_tok_regex_compile(&im->word_re, word, sizeof word - 1, false, "word class"));
    MOE_TRY(matcher_build(im, &im->raw_match, false));
    MOE_TRY(matcher_build(im, &im->norm_match, true));
    return MOE_OK;
}

enum moe_status moe_tokenizer_load_json(struct moe_tokenizer *tok, const char *json, size_t len)
{
    memset(tok, 0, sizeof *tok);
    tok->bos_id = -1;
    json_error_t err;
    json_t *root = json_loadb(json, len, 0, &err);
    if (!root)
        return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: not valid JSON (line %d, column %d): %s",
                        err.line, err.column, err.text);
    enum moe_status st = load_tokenizer_json(tok, root);
    json_decref(root);
    if (st) moe_tokenizer_free(tok);
    return st;
}

static char *join_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Loads dir/name; *out = NULL when the file does not exist. */
static enum moe_status load_optional(const char *dir, const char *name, json_t **out)
{
    *out = NULL;
    char *path = join_path(dir, name);
    if (!path) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    FILE *f = fopen(path, "rb");
    if (!f) {
        free(path);
        return MOE_OK;
    }
    json_error_t err;
    *out = json_loadf(f, 0, &err);
    fclose(f);
    enum moe_status st = MOE_OK;
    if (!*out || !json_is_object(*out)) {
        st = moe_fail(MOE_ERR_FORMAT, "%s: not a valid JSON object (line %d, column %d): %s", path,
                      err.line, err.column, *out ? "top level is not an object" : err.text);
        json_decref(*out);
        *out = NULL;
    }
    free(path);
    return st;
}

/* bos_token / eos_token: a string or {"content": ...} */
static enum moe_status config_token(json_t *cfg, const char *key, char **out)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return MOE_OK;
    if (!(*out = strdup(json_string_value(v)))) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    return MOE_OK;
}

static enum moe_status load_configs(struct moe_tokenizer *tok, const char *dir)
{
    json_t *cfg = NULL, *gen = NULL;
    enum moe_status st;
    if ((st = load_optional(dir, "tokenizer_config.json", &cfg)) ||
        (st = load_optional(dir, "generation_config.json", &gen)))
        goto out;
    if (cfg) {
        if ((st = config_token(cfg, "bos_token", &tok->bos_token)) ||
            (st = config_token(cfg, "eos_token", &tok->eos_token)))
            goto out;
        json_t *ct = json_object_get(cfg, "chat_template");
        if (json_is_array(ct)) { /* [{"name": ..., "template": ...}]: the default one */
            json_t *pick = json_array_get(ct, 0);
            for (size_t i = 0; i < json_array_size(ct); i++) {
                const char *nm = json_string_value(json_object_get(json_array_get(ct, i), "name"));
                if (nm && !strcmp(nm, "default")) pick = json_array_get(ct, i);
            }
            ct = json_object_get(pick, "template");
        }
        if (json_is_string(ct) && !(tok->chat_template = strdup(json_string_value(ct)))) {
            st = moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
            goto out;
        }
    }
    if (tok->bos_token) tok->bos_id = moe_tokenizer_token_to_id(tok, tok->bos_token);
    json_t *gb = json_object_get(gen, "bos_token_id");
    if (tok->bos_id < 0 && json_is_integer(gb)) tok->bos_id = (int32_t)json_integer_value(gb);
    json_t *ab = json_object_get(cfg, "add_bos_token");
    if (json_is_boolean(ab)) {
        tok->add_bos = json_is_true(ab);
    } else {
        for (size_t i = 0; i < tok->impl->n_post_pre; i++)
            tok->add_bos = tok->add_bos || (tok->bos_id >= 0 && tok->impl->post_pre[i] == tok->bos_id);
    }
    json_t *ge = json_object_get(gen, "eos_token_id");
    if (json_is_integer(ge)) {
        tok->eos_ids[tok->n_eos++] = (int32_t)json_integer_value(ge);
    } else if (json_is_array(ge)) {
        for (size_t i = 0; i < json_array_size(ge) && tok->n_eos < MOE_TOKENIZER_MAX_EOS; i++) {
            json_t *v = json_array_get(ge, i);
            if (!json_is_integer(v)) {
                st = moe_fail(MOE_ERR_FORMAT, "generation_config.json: eos_token_id[%zu] is not an "
                                              "integer", i);
                goto out;
            }
            tok->eos_ids[tok->n_eos++] = (int32_t)json_integer_value(v);
        }
    }
    if (!tok->n_eos && tok->eos_token) {
        int32_t id = moe_tokenizer_token_to_id(tok, tok->eos_token);
        if (id >= 0) tok->eos_ids[tok->n_eos++] = id;
    }
    for (size_t i = 0; i < tok->n_eos; i++)
        if (tok->eos_ids[i] < 0 || tok->eos_ids[i] >= tok->n_vocab) {
            st = moe_fail(MOE_ERR_FORMAT, "generation_config.json: eos_token_id %d is out of range "
                                          "[0, %d)", tok->eos_ids[i], tok->n_vocab);
            goto out;
        }
out:
    json_decref(cfg);
    json_decref(gen);
    return st;
}

enum moe_status moe_tokenizer_load(struct moe_tokenizer *tok, const char *model_dir)
{
    memset(tok, 0, sizeof *tok);
    tok->bos_id = -1;
    char *path = join_path(model_dir, "tokenizer.json");
    if (!path) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    FILE *f = fopen(path, "rb");
    if (!f) {
        enum moe_status st = moe_fail(MOE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        free(path);
        return st;
    }
    json_error_t err;
    json_t *root = json_loadf(f, 0, &err);
    fclose(f);
    enum moe_status st;
    if (!root) {
        st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: not valid JSON (line %d, column %d): %s",
                      err.line, err.column, err.text);
    } else {
        st = load_tokenizer_json(tok, root);
        json_decref(root);
        if (!st) st = load_configs(tok, model_dir);
    }
    if (st) {
        moe_error_prefix("%s: ", model_dir);
        moe_tokenizer_free(tok);
    }
    free(path);
    return st;
}
