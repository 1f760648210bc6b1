/* tokenizer_bpe.c - the BPE model of tokenizer.json.
 *
 * Mirrors tokenizers/src/models/bpe (model.rs merge_word, word.rs
 * merge_all).  A word starts as one symbol per character (unknown
 * characters become <0xXX> byte tokens with byte_fallback, else the unk
 * token, fused when fuse_unk); then the lowest-ranked applicable merge is
 * applied repeatedly.  Symbols are a doubly linked list over an array and
 * candidate merges sit in a binary min-heap keyed (rank, position), stale
 * entries being skipped when popped, so a word of n characters costs
 * O(n log n) -- 100,000 identical letters stay fast.
 *
 * Merge ties break on the lower position, as the Rust heap does.  Merges are
 * a hash map (left id, right id) -> (rank, merged id); a merge listed twice
 * keeps its later rank, as the Rust HashMap collect does.
 *
 * Results for words under 256 bytes are cached in a direct-mapped table of
 * TOK_CACHE_SLOTS entries (a colliding word evicts the old one), so memory
 * stays bounded whatever the input. */
#include "runtime/text/tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_MAX_WORD 256

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static size_t pair_slot(uint64_t k, size_t cap)
{
    k ^= k >> 31;
    k *= 0x9e3779b97f4a7c15ull;
    k ^= k >> 29;
    return (size_t)k & (cap - 1);
}

static const struct tok_merge_slot *merge_get(const struct tok_bpe *m, int32_t a, int32_t b)
{
    if (!m->merges_cap) return NULL;
    uint64_t k = pair_key(a, b);
    size_t j = pair_slot(k, m->merges_cap);
    while (m->merges[j].pair != UINT64_MAX) {
        if (m->merges[j].pair == k) return &m->merges[j];
        j = (j + 1) & (m->merges_cap - 1);
    }
    return NULL;
}

/* Resolves one merge "a b" into the map. */
static enum moe_status add_merge(struct tok_bpe *m, const char *a, size_t al, const char *b,
                                 size_t bl, int32_t rank)
{
    int32_t ia = moe_tok_map_get(&m->vocab_map, a, al);
    int32_t ib = moe_tok_map_get(&m->vocab_map, b, bl);
    if (ia < 0 || ib < 0)
        return moe_fail(MOE_ERR_FORMAT,
                        "tokenizer.json: merge %d ('%.*s' '%.*s') uses token '%.*s' that is not "
                        "in the vocab", rank, (int)al, a, (int)bl, b, (int)(ia < 0 ? al : bl),
                        ia < 0 ? a : b);
    size_t pl = m->prefix ? strlen(m->prefix) : 0;
    if (pl > bl) pl = bl;
    char stack[256], *joined = stack;
    size_t jl = al + bl - pl;
    if (jl > sizeof stack && !(joined = malloc(jl)))
        return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(joined, a, al);
    memcpy(joined + al, b + pl, bl - pl);
    int32_t id = moe_tok_map_get(&m->vocab_map, joined, jl);
    if (joined != stack) free(joined);
    if (id < 0)
        return moe_fail(MOE_ERR_FORMAT,
                        "tokenizer.json: merge %d ('%.*s' '%.*s') makes a token that is not in "
                        "the vocab", rank, (int)al, a, (int)bl, b);
    uint64_t k = pair_key(ia, ib);
    size_t j = pair_slot(k, m->merges_cap);
    while (m->merges[j].pair != UINT64_MAX && m->merges[j].pair != k)
        j = (j + 1) & (m->merges_cap - 1);
    m->merges[j] = (struct tok_merge_slot){k, rank, id};
    return MOE_OK;
}

static enum moe_status opt_string(json_t *model, const char *key, char **out)
{
    json_t *v = json_object_get(model, key);
    if (!v || json_is_null(v)) return MOE_OK;
    if (!json_is_string(v))
        return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: model.%s is not a string", key);
    if (!(*out = strdup(json_string_value(v))))
        return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
    return MOE_OK;
}

static bool opt_bool(json_t *model, const char *key)
{
    json_t *v = json_object_get(model, key);
    return v && json_is_true(v);
}

enum moe_status moe_tok_bpe_load(struct tok_bpe *m, json_t *model)
{
    enum moe_status st;
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    for (int i = 0; i < 256; i++) m->byte_ids[i] = -1;
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab))
        return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: model.vocab is missing or not an object");
    if (!json_is_array(merges))
        return moe_fail(MOE_ERR_FORMAT, "tokenizer.json: model.merges is missing or not an array");
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
        return moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
    m->fuse_unk = opt_bool(model, "fuse_unk");
    m->byte_fallback = opt_bool(model, "byte_fallback");
    m->ignore_merges = opt_bool(model, "ignore_merges");
    if ((st = opt_string(model, "continuing_subword_prefix", &m->prefix)) ||
        (st = opt_string(model, "end_of_word_suffix", &m->suffix)))
        goto fail;

    /* vocab: ids may leave holes; n_vocab is the highest id + 1 */
    const char *key;
    json_t *val;
    int64_t max_id = -1;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) > INT32_MAX - 1) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: vocab entry '%s' has no valid id", key);
            goto fail;
        }
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    m->n_vocab = (int32_t)(max_id + 1);
    m->vocab = calloc((size_t)m->n_vocab + 1, sizeof *m->vocab);
    m->vocab_len = calloc((size_t)m->n_vocab + 1, sizeof *m->vocab_len);
    if (!m->vocab || !m->vocab_len) goto nomem;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        size_t len = strlen(key);
        if (m->vocab[id]) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: vocab id %d is used twice", id);
            goto fail;
        }
        if (!(m->vocab[id] = strdup(key))) goto nomem;
        m->vocab_len[id] = (uint32_t)len;
        if ((st = moe_tok_map_put(&m->vocab_map, m->vocab[id], len, id))) goto fail;
    }

    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: model.unk_token is not a string");
            goto fail;
        }
        m->unk_id = moe_tok_map_get(&m->vocab_map, json_string_value(unk),
                                    strlen(json_string_value(unk)));
        if (m->unk_id < 0) {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: unk_token '%s' is not in the vocab",
                          json_string_value(unk));
            goto fail;
        }
    }
    if (m->byte_fallback) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            m->byte_ids[b] = moe_tok_map_get(&m->vocab_map, name, 6);
        }
    }

    /* merges: "a b" strings or ["a", "b"] pairs */
    size_t nm = json_array_size(merges), cap = 64;
    while (cap < nm * 2 + 2) cap *= 2;
    m->merges = malloc(cap * sizeof *m->merges);
    if (!m->merges) goto nomem;
    for (size_t i = 0; i < cap; i++) m->merges[i].pair = UINT64_MAX;
    m->merges_cap = cap;
    for (size_t i = 0; i < nm; i++) {
        json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(e)) {
            a = json_string_value(e);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = moe_fail(MOE_ERR_FORMAT,
                              "tokenizer.json: merge %zu '%s' is not two tokens separated by "
                              "one space", i, a);
                goto fail;
            }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            al = json_string_length(json_array_get(e, 0));
            bl = json_string_length(json_array_get(e, 1));
        } else {
            st = moe_fail(MOE_ERR_FORMAT, "tokenizer.json: merge %zu is neither \"a b\" nor "
                                          "[\"a\", \"b\"]", i);
            goto fail;
        }
        if ((st = add_merge(m, a, al, b, bl, (int32_t)i))) goto fail;
    }
    m->cache = calloc(TOK_CACHE_SLOTS, sizeof *m->cache);
    if (!m->cache) goto nomem;
    return MOE_OK;
nomem:
    st = moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory loading the BPE model");
fail:
    moe_tok_bpe_free(m);
    return st;
}

void moe_tok_bpe_free(struct tok_bpe *m)
{
    if (m->vocab)
        for (int32_t i = 0; i < m->n_vocab; i++) free(m->vocab[i]);
    free(m->vocab);
    free(m->vocab_len);
    moe_tok_map_free(&m->vocab_map);
    free(m->merges);
    free(m->prefix);
    free(m->suffix);
    if (m->cache)
        for (size_t i = 0; i < TOK_CACHE_SLOTS; i++) {
            free(m->cache[i].word);
            free(m->cache[i].ids);
        }
    free(m->cache);
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
}

/* ------------------------------------------------------------- merging */

struct sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool dead;
};
struct cand {
    int32_t rank, pos, new_id;
};

static bool cand_less(struct cand a, struct cand b)
{
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(struct cand *h, size_t *n, struct cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(c, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct cand heap_pop(struct cand *h, size_t *n)
{
    struct cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        struct cand best = last;
        if (l < *n && cand_less(h[l], best)) m = l, best = h[l];
        if (r < *n && cand_less(h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = last;
    return top;
}

static enum moe_status push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory");
        *ids = p;
        *cap = c;
    }
    (*ids)[(*n)++] = id;
    return MOE_OK;
}

/* Character-level symbols of w, as merge_word builds them. */
static enum moe_status initial_symbols(const struct tok_bpe *m, const char *w, size_t n,
                                       struct sym *syms, size_t *ns)
{
    size_t k = 0;
    int32_t unk = -1; /* pending (fused) unk */
    char stackbuf[64];
    size_t pl = m->prefix ? strlen(m->prefix) : 0, sl = m->suffix ? strlen(m->suffix) : 0;
    for (size_t i = 0; i < n;) {
        size_t cl = moe_tok_clen((unsigned char)w[i]);
        if (i + cl > n) cl = n - i;
        const char *s = w + i;
        size_t len = cl;
        if (pl || sl) {
            /* continuing_subword_prefix on all but the first character,
             * end_of_word_suffix on the last */
            size_t p = i > 0 ? pl : 0, q = i + cl == n ? sl : 0;
            if (p + cl + q > sizeof stackbuf)
                return moe_fail(MOE_ERR_UNSUPPORTED, "tokenizer.json: subword prefix too long");
            if (p) memcpy(stackbuf, m->prefix, p);
            memcpy(stackbuf + p, w + i, cl);
            if (q) memcpy(stackbuf + p + cl, m->suffix, q);
            s = stackbuf;
            len = p + cl + q;
        }
        int32_t id = moe_tok_map_get(&m->vocab_map, s, len);
        if (id >= 0) {
            if (unk >= 0) syms[k++].id = unk, unk = -1;
            syms[k++].id = id;
        } else {
            bool done = false;
            if (m->byte_fallback) {
                bool all = true;
                for (size_t b = 0; b < len; b++) all = all && m->byte_ids[(unsigned char)s[b]] >= 0;
                if (all) {
                    /* As in Rust, a pending fused unk is not flushed first. */
                    for (size_t b = 0; b < len; b++) syms[k++].id = m->byte_ids[(unsigned char)s[b]];
                    done = true;
                }
            }
            if (!done && m->unk_id >= 0) {
                if (unk >= 0 && !m->fuse_unk) syms[k++].id = unk;
                unk = m->unk_id;
            }
        }
        i += cl;
    }
    if (unk >= 0) syms[k++].id = unk;
    *ns = k;
    return MOE_OK;
}

static enum moe_status merge_word(const struct tok_bpe *m, const char *w, size_t n,
                                  int32_t **ids, size_t *n_ids, size_t *cap)
{
    enum moe_status st = MOE_OK;
    /* At most one symbol per byte, or per byte of prefix + char + suffix
     * when those fall back to bytes. */
    size_t extra = (m->prefix ? strlen(m->prefix) : 0) + (m->suffix ? strlen(m->suffix) : 0);
    size_t bound = n * (1 + extra) + 1;
    struct sym *syms = malloc(bound * sizeof *syms);
    struct cand *heap = malloc((2 * bound + 2) * sizeof *heap);
    if (!syms || !heap) {
        st = moe_fail(MOE_ERR_NOMEM, "tokenizer: out of memory (word of %zu bytes)", n);
        goto out;
    }
    size_t ns = 0, nh = 0;
    if ((st = initial_symbols(m, w, n, syms, &ns))) goto out;
    for (size_t i = 0; i < ns; i++) {
        syms[i].prev = (int32_t)i - 1;
        syms[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
        syms[i].dead = false;
    }
    for (size_t i = 0; i + 1 < ns; i++) {
        const struct tok_merge_slot *mg = merge_get(m, syms[i].id, syms[i + 1].id);
        if (mg) heap_push(heap, &nh, (struct cand){mg->rank, (int32_t)i, mg->new_id});
    }
    /* Each merge pops one candidate and pushes at most two, so the heap
     * never holds more than 2 * ns entries. */
    while (nh) {
        struct cand c = heap_pop(heap, &nh);
        struct sym *s = &syms[c.pos];
        if (s->dead || s->next < 0) continue;
        struct sym *r = &syms[s->next];
        const struct tok_merge_slot *mg = merge_get(m, s->id, r->id);
        if (!mg || mg->new_id != c.new_id) continue; /* stale */
        s->id = c.new_id;
        r->dead = true;
        s->next = r->next;
        if (r->next >= 0) syms[r->next].prev = c.pos;
        if (s->prev >= 0) {
            const struct tok_merge_slot *pm = merge_get(m, syms[s->prev].id, s->id);
            if (pm) heap_push(heap, &nh, (struct cand){pm->rank, s->prev, pm->new_id});
        }
        if (s->next >= 0) {
            const struct tok_merge_slot *nm = merge_get(m, s->id, syms[s->next].id);
            if (nm) heap_push(heap, &nh, (struct cand){nm->rank, c.pos, nm->new_id});
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (!syms[i].dead && (st = push_id(ids, n_ids, cap, syms[i].id))) goto out;
out:
    free(syms);
    free(heap);
    return st;
}

enum moe_status moe_tok_bpe_encode(struct tok_bpe *m, const char *w, size_t n, int32_t **ids,
                                   size_t *n_ids, size_t *cap)
{
    if (n == 0) return MOE_OK;
    if (m->ignore_merges) {
        int32_t id = moe_tok_map_get(&m->vocab_map, w, n);
        if (id >= 0) return push_id(ids, n_ids, cap, id);
    }
    struct tok_cache_slot *slot = NULL;
    if (n < TOK_CACHE_MAX_WORD) {
        slot = &m->cache[moe_tok_hash(w, n) & (TOK_CACHE_SLOTS - 1)];
        if (slot->word && slot->word_len == n && memcmp(slot->word, w, n) == 0) {
            for (size_t i = 0; i < slot->n_ids; i++) MOE_TRY(push_id(ids, n_ids, cap, slot->ids[i]));
            return MOE_OK;
        }
    }
    size_t start = *n_ids;
    MOE_TRY(merge_word(m, w, n, ids, n_ids, cap));
    if (slot) {
        size_t k = *n_ids - start;
        char *word = malloc(n);
        int32_t *cid = malloc((k ? k : 1) * sizeof *cid);
        if (!word || !cid) { /* caching is optional: skip on failure */
            free(word);
            free(cid);
            return MOE_OK;
        }
        memcpy(word, w, n);
        memcpy(cid, *ids + start, k * sizeof *cid);
        free(slot->word);
        free(slot->ids);
        *slot = (struct tok_cache_slot){word, n, cid, k};
    }
    return MOE_OK;
}
