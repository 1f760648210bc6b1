/* grammar_mask.c - the vocabulary trie and per-step token masks.
 *
 * The trie is built from the byte strings sorted, so the tokens under a
 * node are one contiguous range: a node's tokens (those whose bytes end
 * there) come first, then one child per distinct next byte.
 *
 * A mask comes from, cheapest first: the state's cache of its last masks
 * (keyed by its serialised stacks); the grammar's per-position sets (each
 * stack's top SET_DEPTH nodes key the tokens it accepts whatever lies
 * below, ORed, plus the tokens that read past those nodes, checked against
 * the whole state); or, inside a UTF-8 character, a depth-first walk of
 * the trie from the state, advancing by each edge's byte and descending
 * only while some stack survives, so a refused prefix prunes every token
 * under it.  A set is computed by the same walk from its nodes alone, the
 * stacks that leave them marking the tokens that read on as uncertain. */
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
    free(gv->sub_end);
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
    gv->sub_end[id] = b->n_ids;
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
    gv->sub_end = malloc((total + 3) * sizeof *gv->sub_end);
    gv->ids = malloc(((size_t)n_in + 1) * sizeof *gv->ids);
    int32_t *sorted = malloc(((size_t)n_in + 1) * sizeof *sorted);
    if (!gv->off || !gv->bytes || !gv->in_trie || !gv->first || !gv->n_child || !gv->child ||
        !gv->edge || !gv->tok_first || !gv->sub_end || !gv->ids || !sorted) {
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

/* ---- per-position token sets ---- */

#define MAX_POSMASKS 4096 /* sets kept per grammar; beyond, they start over */
#define SET_DEPTH 8       /* stack nodes a set is keyed by */

void moe_gm_posmask_clear(struct moe_grammar *g)
{
    for (int32_t k = 0; k < g->n_pm; k++) {
        free(g->pm[k].key);
        free(g->pm[k].acc);
        free(g->pm[k].unc);
    }
    free(g->pm);
    g->pm = NULL;
    g->n_pm = g->cap_pm = 0;
    g->pm_vocab = NULL;
}

struct unc_list {
    int32_t *p;
    int32_t n, cap;
};

static enum moe_status unc_add(struct unc_list *u, const int32_t *ids, int32_t n)
{
    if (n <= 0) return MOE_OK;
    if (u->n + n > u->cap) {
        int32_t cap = u->cap ? u->cap : 256;
        while (cap < u->n + n) cap *= 2;
        int32_t *q = realloc(u->p, (size_t)cap * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
        u->p = q;
        u->cap = cap;
    }
    memcpy(u->p + u->n, ids, (size_t)n * sizeof *ids);
    u->n += n;
    return MOE_OK;
}

/* The walk of one position with the context unknown: stacks that finish
 * the position's alternative become MOE_GM_OUTSIDE tops, dropped from the
 * list; `out` says one did on the path to this node. */
static enum moe_status walk_pos(struct moe_grammar_state *st, const struct moe_grammar_vocab *gv, int32_t node,
                                struct moe_gm_utf8 u, int32_t from, int32_t to, bool out, uint32_t *acc,
                                struct unc_list *unc)
{
    for (int32_t c = gv->first[node], end = c + gv->n_child[node]; c < end; c++) {
        int32_t save_nodes = st->n_nodes, kid = gv->child[c];
        struct moe_gm_utf8 u2 = u;
        bool ok;
        enum moe_status s = moe_gm_step_byte(st, &u2, from, to, gv->edge[c], &ok);
        if (s) goto next;
        bool here = false; /* a stack left the alternative with this byte */
        int32_t w = to;
        for (int32_t k = to; k < st->n_stk; k++) {
            if (st->stk[k] == MOE_GM_OUTSIDE) here = true;
            else st->stk[w++] = st->stk[k];
        }
        st->n_stk = w;
        bool inside = w > to, o = out || here;
        const int32_t *ids = gv->ids + gv->tok_first[kid];
        int32_t n_here = gv->tok_first[kid + 1] - gv->tok_first[kid];
        if (inside || here) { /* ending here: accepted whatever follows */
            for (int32_t k = 0; k < n_here; k++) acc[ids[k] >> 5] |= 1u << (ids[k] & 31);
        } else if (o) {
            s = unc_add(unc, ids, n_here);
        }
        if (!s && gv->n_child[kid]) {
            if (inside) s = walk_pos(st, gv, kid, u2, to, w, o, acc, unc);
            else if (o) s = unc_add(unc, ids + n_here, gv->sub_end[kid] - gv->tok_first[kid + 1]);
        }
    next:
        st->n_nodes = save_nodes;
        st->n_stk = to;
        MOE_TRY(s);
    }
    return MOE_OK;
}

static enum moe_status reserve(struct moe_grammar_state *st, int32_t nodes, int32_t tops)
{
    if (st->n_nodes + nodes > st->cap_nodes) {
        int32_t cap = st->n_nodes + nodes + 64;
        struct moe_grammar_node *q = realloc(st->nodes, (size_t)cap * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
        st->nodes = q;
        st->cap_nodes = cap;
    }
    if (st->n_stk + tops > st->cap_stk) {
        int32_t cap = st->n_stk + tops + 64;
        int32_t *q = realloc(st->stk, (size_t)cap * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
        st->stk = q;
        st->cap_stk = cap;
    }
    return MOE_OK;
}

/* The set of the stack topped by node t (computed on first use, with st's
 * arena and lists as scratch). */
static enum moe_status posmask(struct moe_grammar_state *st, const struct moe_grammar_vocab *gv, int32_t t,
                               const struct g_posmask **out)
{
    struct moe_grammar *g = (struct moe_grammar *)st->g; /* the sets are the grammar's cache */
    int32_t key[SET_DEPTH + 1];
    int n_key = 0;
    for (int32_t x = t; n_key < SET_DEPTH + 1; x = st->nodes[x].up) {
        if (x < 0 || n_key == SET_DEPTH) {
            key[n_key++] = x < 0 ? -1 : MOE_GM_OUTSIDE;
            break;
        }
        key[n_key++] = st->nodes[x].pos;
    }
    uint64_t h = fnv(key, n_key);
    if (g->pm_vocab != gv || g->n_pm >= MAX_POSMASKS) moe_gm_posmask_clear(g);
    g->pm_vocab = gv;
    for (int32_t k = 0; k < g->n_pm; k++)
        if (g->pm[k].hash == h && g->pm[k].n_key == n_key && !memcmp(g->pm[k].key, key, (size_t)n_key * sizeof *key)) {
            *out = &g->pm[k];
            return MOE_OK;
        }
    if (g->n_pm == g->cap_pm) {
        int32_t cap = g->cap_pm ? g->cap_pm * 2 : 32;
        struct g_posmask *q = realloc(g->pm, (size_t)cap * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
        g->pm = q;
        g->cap_pm = cap;
    }
    const size_t words = ((size_t)gv->V + 31) / 32;
    struct g_posmask m = {.hash = h, .n_key = n_key};
    struct unc_list unc = {0};
    m.key = malloc((size_t)n_key * sizeof *key);
    m.acc = calloc(words, sizeof *m.acc);
    enum moe_status s = m.key && m.acc ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
    int32_t save_nodes = st->n_nodes, save_stk = st->n_stk;
    if (!s) s = reserve(st, n_key, 1);
    if (!s) { /* the key's nodes, bottom first, the lowest one's up the context */
        memcpy(m.key, key, (size_t)n_key * sizeof *key);
        int32_t up = key[n_key - 1];
        for (int i = n_key - 2; i >= 0; i--) {
            st->nodes[st->n_nodes] = (struct moe_grammar_node){key[i], up};
            up = st->n_nodes++;
        }
        st->stk[st->n_stk++] = up;
        s = walk_pos(st, gv, 0, (struct moe_gm_utf8){0}, save_stk, st->n_stk, false, m.acc, &unc);
    }
    st->n_nodes = save_nodes;
    st->n_stk = save_stk;
    if (s) {
        free(unc.p);
        free(m.key);
        free(m.acc);
        return s;
    }
    m.unc = unc.p;
    m.n_unc = unc.n;
    g->pm[g->n_pm] = m;
    *out = &g->pm[g->n_pm++];
    return MOE_OK;
}

/* Whether bytes b[0..n) advance st (no partial character pending). */
static enum moe_status token_fits(struct moe_grammar_state *st, const uint8_t *b, uint32_t n, bool *ok)
{
    int32_t save_nodes = st->n_nodes;
    MOE_TRY(moe_gm_load_tops(st));
    struct moe_gm_utf8 u = st->utf8;
    int32_t from = 0;
    enum moe_status s = MOE_OK;
    *ok = true;
    for (uint32_t k = 0; k < n && *ok && !s; k++) {
        int32_t to = st->n_stk;
        s = moe_gm_step_byte(st, &u, from, to, b[k], ok);
        from = to;
    }
    st->n_nodes = save_nodes;
    st->n_stk = 0;
    return s;
}

/* The mask from the sets of st's stacks. */
static enum moe_status mask_by_positions(struct moe_grammar_state *st, const struct moe_grammar_vocab *gv,
                                         uint32_t *bits)
{
    const size_t words = ((size_t)gv->V + 31) / 32;
    const struct moe_grammar *g = st->g;
    int32_t sets[MOE_GRAMMAR_MAX_STACKS]; /* indices: computing a set may move g->pm */
    memset(bits, 0, words * sizeof *bits);
    int n = 0;
    for (int k = 0; k < st->n_tops; k++) {
        if (st->tops[k] < 0) continue; /* the end: no token follows it */
        const struct g_posmask *m = NULL;
        MOE_TRY(posmask(st, gv, st->tops[k], &m));
        int32_t id = (int32_t)(m - g->pm);
        int i = 0;
        while (i < n && sets[i] != id) i++;
        if (i < n) continue; /* two stacks alike in their top nodes */
        sets[n++] = id;
        for (size_t w = 0; w < words; w++) bits[w] |= m->acc[w];
    }
    for (int k = 0; k < n; k++)
        for (int32_t i = 0; i < g->pm[sets[k]].n_unc; i++) {
            int32_t t = g->pm[sets[k]].unc[i];
            if (bits[t >> 5] >> (t & 31) & 1) continue;
            bool ok;
            MOE_TRY(token_fits(st, gv->bytes + gv->off[t], gv->off[t + 1] - gv->off[t], &ok));
            if (ok) bits[t >> 5] |= 1u << (t & 31);
        }
    return MOE_OK;
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
        if (c->bits && (size_t)c->n_words == words && c->hash == h && c->n_key == n_key &&
            !memcmp(c->key, st->key, (size_t)n_key * sizeof *st->key)) {
            memcpy(bits, c->bits, words * sizeof *bits);
            c->used = st->clock;
            st->n_mask_hits++;
            return MOE_OK;
        }
        if (c->used < old->used) old = c;
    }
    st->n_mask_misses++;
    if (st->utf8.need == 0) {
        MOE_TRY(mask_by_positions(st, gv, bits));
    } else { /* inside a character: walk the trie from the state */
        MOE_TRY(moe_grammar_mask_walk(st, gv, bits));
    }
    /* remember it in the least recently used entry */
    if (old->bits && (size_t)old->n_words != words) {
        free(old->bits);
        old->bits = NULL;
    }
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
    old->n_words = (int)words;
    old->hash = h;
    old->used = st->clock;
    return MOE_OK;
}

enum moe_status moe_grammar_mask_walk(struct moe_grammar_state *st, const struct moe_grammar_vocab *gv,
                                      uint32_t *bits)
{
    memset(bits, 0, ((size_t)gv->V + 31) / 32 * sizeof *bits);
    int32_t save_nodes = st->n_nodes;
    MOE_TRY(moe_gm_load_tops(st));
    enum moe_status s = walk(st, gv, 0, st->utf8, 0, st->n_tops, bits);
    st->n_nodes = save_nodes;
    st->n_stk = 0;
    return s;
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
        if ((s = moe_grammar_state_copy_uncached(&t, st))) break;
        if ((s = moe_grammar_state_advance(&t, gv->bytes + gv->off[i], gv->off[i + 1] - gv->off[i], &ok))) break;
        if (ok) bits[i >> 5] |= 1u << (i & 31);
    }
    moe_grammar_state_free(&t);
    return s;
}
