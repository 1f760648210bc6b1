/* grammar_mask.c - the vocabulary trie and per-step token masks.
 *
 * The trie is built from the byte strings sorted, so the tokens under a
 * node are one contiguous range: a node's tokens (those whose bytes end
 * there) come first, then one child per distinct next byte.  A mask walks
 * it depth first from the state's stacks, advancing by the edge's byte
 * (grammar_match.h) and descending only while some stack survives, so a
 * prefix that the grammar refuses prunes every token under it.
 *
 * Cost bound: one step per trie node visited; a node is visited only when
 * its whole prefix is allowed.  The state's cache keeps the last
 * MOE_GRAMMAR_MASK_CACHE masks keyed by the serialised stacks, so a state
 * the request returns to (inside a string, between array items) costs a
 * copy of V bits. */
#include "runtime/grammar/grammar_match.h"

#include <stdlib.h>
#include <string.h>

void moe_grammar_vocab_free(struct moe_grammar_vocab *gv)
{
    free(gv->off);
    free(gv->bytes);
    free(gv->in_trie);
    free(gv->first);
    free(gv->n_child);
    free(gv->child);
    free(gv->tok_first);
    free(gv->ids);
    free(gv->edge);
    memset(gv, 0, sizeof *gv);
}

struct tok_ref {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
};

static int by_bytes(const void *a, const void *b)
{
    const struct tok_ref *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

struct build {
    struct moe_grammar_vocab *gv;
    const int32_t *sorted;
    int32_t n_ids, n_edges;
};

static uint32_t len_of(const struct moe_grammar_vocab *gv, int32_t id) { return gv->off[id + 1] - gv->off[id]; }
static uint8_t byte_at(const struct moe_grammar_vocab *gv, int32_t id, uint32_t d) { return gv->bytes[gv->off[id] + d]; }

/* The node of the tokens sorted[lo..hi), which share their first d bytes. */
static int32_t build_node(struct build *b, int32_t lo, int32_t hi, uint32_t d)
{
    struct moe_grammar_vocab *gv = b->gv;
    int32_t id = gv->n_nodes++;
    gv->tok_first[id] = b->n_ids;
    while (lo < hi && len_of(gv, b->sorted[lo]) == d) gv->ids[b->n_ids++] = b->sorted[lo++];
    int32_t groups = 0;
    for (int32_t k = lo; k < hi; k++)
        if (k == lo || byte_at(gv, b->sorted[k], d) != byte_at(gv, b->sorted[k - 1], d)) groups++;
    gv->first[id] = b->n_edges;
    gv->n_child[id] = groups;
    int32_t slot = b->n_edges;
    b->n_edges += groups;
    for (int32_t a = lo; a < hi;) {
        uint8_t c = byte_at(gv, b->sorted[a], d);
        int32_t z = a;
        while (z < hi && byte_at(gv, b->sorted[z], d) == c) z++;
        gv->edge[slot] = c;
        int32_t kid = build_node(b, a, z, d + 1);
        gv->child[slot++] = kid;
        a = z;
    }
    return id;
}

enum moe_status moe_grammar_vocab_init(struct moe_grammar_vocab *gv, int V, const uint32_t *off,
                                       const uint8_t *bytes, const uint8_t *in_trie)
{
    memset(gv, 0, sizeof *gv);
    if (V <= 0) return moe_fail(MOE_ERR_INVALID_ARG, "grammar: vocabulary of %d tokens", V);
    size_t total = off[V];
    int32_t n_in = 0;
    for (int i = 0; i < V; i++) {
        if (off[i + 1] < off[i])
            return moe_fail(MOE_ERR_INVALID_ARG, "grammar: token %d: byte offsets decrease", i);
        if (in_trie[i] && off[i + 1] - off[i] > MOE_GRAMMAR_MAX_TOKEN)
            return moe_fail(MOE_ERR_INVALID_ARG, "grammar: token %d has %u bytes (at most %d)", i,
                            off[i + 1] - off[i], MOE_GRAMMAR_MAX_TOKEN);
        if (in_trie[i] && off[i + 1] > off[i]) n_in++;
    }
    gv->V = V;
    gv->off = malloc(((size_t)V + 1) * sizeof *gv->off);
    gv->bytes = malloc(total + 1);
    gv->in_trie = calloc((size_t)V, 1);
    gv->first = malloc((total + 2) * sizeof *gv->first);
    gv->n_child = malloc((total + 2) * sizeof *gv->n_child);
    gv->child = malloc((total + 2) * sizeof *gv->child);
    gv->edge = malloc(total + 2);
    gv->tok_first = malloc((total + 3) * sizeof *gv->tok_first);
    gv->ids = malloc(((size_t)n_in + 1) * sizeof *gv->ids);
    int32_t *sorted = malloc(((size_t)n_in + 1) * sizeof *sorted);
    if (!gv->off || !gv->bytes || !gv->in_trie || !gv->first || !gv->n_child || !gv->child ||
        !gv->edge || !gv->tok_first || !gv->ids || !sorted) {
        free(sorted);
        moe_grammar_vocab_free(gv);
        return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory for a vocabulary of %d tokens", V);
    }
    memcpy(gv->off, off, ((size_t)V + 1) * sizeof *off);
    memcpy(gv->bytes, bytes, total);
    int32_t n = 0;
    for (int i = 0; i < V; i++)
        if (in_trie[i] && off[i + 1] > off[i]) {
            gv->in_trie[i] = 1;
            sorted[n++] = i;
            if ((int)(off[i + 1] - off[i]) > gv->max_len) gv->max_len = (int)(off[i + 1] - off[i]);
        }
    struct tok_ref *refs = malloc(((size_t)n + 1) * sizeof *refs);
    if (!refs) {
        free(sorted);
        moe_grammar_vocab_free(gv);
        return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory for a vocabulary of %d tokens", V);
    }
    for (int32_t k = 0; k < n; k++)
        refs[k] = (struct tok_ref){gv->bytes + off[sorted[k]], off[sorted[k] + 1] - off[sorted[k]], sorted[k]};
    qsort(refs, (size_t)n, sizeof *refs, by_bytes);
    for (int32_t k = 0; k < n; k++) sorted[k] = refs[k].id;
    free(refs);
    struct build b = {gv, sorted, 0, 0};
    build_node(&b, 0, n, 0);
    gv->tok_first[gv->n_nodes] = b.n_ids;
    free(sorted);
    return MOE_OK;
}

static enum moe_status walk(struct moe_grammar_state *st, const struct moe_grammar_vocab *gv, int32_t node,
                            struct moe_gm_utf8 u, int32_t from, int32_t to, uint32_t *bits)
{
    for (int32_t c = gv->first[node], end = c + gv->n_child[node]; c < end; c++) {
        int32_t save_nodes = st->n_nodes, kid = gv->child[c];
        struct moe_gm_utf8 u2 = u;
        bool ok;
        enum moe_status s = moe_gm_step_byte(st, &u2, from, to, gv->edge[c], &ok);
        if (!s && ok) {
            for (int32_t k = gv->tok_first[kid]; k < gv->tok_first[kid + 1]; k++)
                bits[gv->ids[k] >> 5] |= 1u << (gv->ids[k] & 31);
            if (gv->n_child[kid]) s = walk(st, gv, kid, u2, to, st->n_stk, bits);
        }
        st->n_nodes = save_nodes;
        st->n_stk = to;
        MOE_TRY(s);
    }
    return MOE_OK;
}

/* The state as int32s: its incomplete character, then each stack's
 * positions from the top down, each stack ended by -1. */
static enum moe_status serialise(struct moe_grammar_state *st, int *n_key)
{
    int n = 4;
    for (int k = 0; k < st->n_tops; k++) {
        for (int32_t t = st->tops[k]; t >= 0; t = st->nodes[t].up) n++;
        n++;
    }
    if (n > st->cap_key) {
        int32_t *q = realloc(st->key, (size_t)n * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
        st->key = q;
        st->cap_key = n;
    }
    int i = 0;
    st->key[i++] = (int32_t)st->utf8.value;
    st->key[i++] = st->utf8.need;
    st->key[i++] = st->utf8.len;
    st->key[i++] = st->n_tops;
    for (int k = 0; k < st->n_tops; k++) {
        for (int32_t t = st->tops[k]; t >= 0; t = st->nodes[t].up) st->key[i++] = st->nodes[t].pos;
        st->key[i++] = -1;
    }
    *n_key = n;
    return MOE_OK;
}

static uint64_t fnv(const int32_t *k, int n)
{
    uint64_t h = 1469598103934665603ull;
    const uint8_t *b = (const uint8_t *)k;
    for (size_t i = 0; i < (size_t)n * sizeof *k; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

enum moe_status moe_grammar_mask(struct moe_grammar_state *st, const struct moe_grammar_vocab *gv, uint32_t *bits)
{
    const size_t words = ((size_t)gv->V + 31) / 32;
    int n_key = 0;
    MOE_TRY(serialise(st, &n_key));
    uint64_t h = fnv(st->key, n_key);
    struct moe_grammar_mask_entry *old = &st->cache[0];
    st->clock++;
    for (int k = 0; k < MOE_GRAMMAR_MASK_CACHE; k++) {
        struct moe_grammar_mask_entry *c = &st->cache[k];
        if (c->bits && c->hash == h && c->n_key == n_key && !memcmp(c->key, st->key, (size_t)n_key * sizeof *st->key)) {
            memcpy(bits, c->bits, words * sizeof *bits);
            c->used = st->clock;
            st->n_mask_hits++;
            return MOE_OK;
        }
        if (c->used < old->used) old = c;
    }
    st->n_mask_misses++;
    memset(bits, 0, words * sizeof *bits);
    int32_t save_nodes = st->n_nodes;
    MOE_TRY(moe_gm_load_tops(st));
    enum moe_status s = walk(st, gv, 0, st->utf8, 0, st->n_tops, bits);
    st->n_nodes = save_nodes;
    st->n_stk = 0;
    MOE_TRY(s);
    /* remember it in the least recently used entry */
    if (!old->bits && !(old->bits = malloc(words * sizeof *bits))) return MOE_OK;
    int32_t *key = realloc(old->key, (size_t)n_key * sizeof *key);
    if (!key) {
        free(old->bits);
        old->bits = NULL;
        return MOE_OK;
    }
    old->key = key;
    memcpy(old->key, st->key, (size_t)n_key * sizeof *key);
    memcpy(old->bits, bits, words * sizeof *bits);
    old->n_key = n_key;
    old->hash = h;
    old->used = st->clock;
    return MOE_OK;
}

enum moe_status moe_grammar_mask_brute(const struct moe_grammar_state *st, const struct moe_grammar_vocab *gv,
                                       uint32_t *bits)
{
    memset(bits, 0, ((size_t)gv->V + 31) / 32 * sizeof *bits);
    struct moe_grammar_state t = {0};
    enum moe_status s = MOE_OK;
    for (int i = 0; i < gv->V && !s; i++) {
        if (!gv->in_trie[i]) continue;
        bool ok;
        if ((s = moe_grammar_state_copy(&t, st))) break;
        if ((s = moe_grammar_state_advance(&t, gv->bytes + gv->off[i], gv->off[i + 1] - gv->off[i], &ok))) break;
        if (ok) bits[i >> 5] |= 1u << (i & 31);
    }
    moe_grammar_state_free(&t);
    return s;
}
