/* grammar_match.c - the recognizer: a set of pushdown stacks advanced one
 * UTF-8 byte at a time (grammar.h).
 *
 * A stack is a chain of nodes in the state's arena; its top node's pos is
 * a character element.  expand() takes a position inside an alternative
 * and pushes every stack it leads to: at a rule reference, each
 * alternative of the rule with a node to continue after the reference
 * (the node below itself when the reference ends its alternative: a tail
 * call); at the end of an alternative, the node below; at the bottom,
 * the empty stack (-1), meaning the root has been matched.  Left
 * recursion is refused at compile time, so expansion terminates.
 *
 * Arena discipline: nodes are only appended.  The mask walk (grammar_mask.c)
 * rolls the arena and the top lists back after each trie edge; a committed
 * advance compacts the arena to the nodes its stacks still use. */
#include "runtime/grammar/grammar_match.h"

#include <stdlib.h>
#include <string.h>

static enum moe_status grow(void **p, int32_t *capp, int32_t need, size_t elem, int32_t limit,
                            const char *what)
{
    if (need <= *capp) return MOE_OK;
    if (need > limit)
        return moe_fail(MOE_ERR_UNSUPPORTED, "grammar: more than %d %s at once; the grammar is too "
                        "ambiguous to follow", limit, what);
    int32_t cap = *capp ? *capp : 64;
    while (cap < need) cap = cap > limit / 2 ? limit : cap * 2;
    void *q = realloc(*p, (size_t)cap * elem);
    if (!q) return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory for %d %s", cap, what);
    *p = q;
    *capp = cap;
    return MOE_OK;
}

static enum moe_status new_node(struct moe_grammar_state *st, int32_t pos, int32_t up, int32_t *out)
{
    MOE_TRY(grow((void **)&st->nodes, &st->cap_nodes, st->n_nodes + 1, sizeof *st->nodes,
                 MOE_GRAMMAR_MAX_NODES, "stack nodes"));
    st->nodes[st->n_nodes] = (struct moe_grammar_node){pos, up};
    *out = st->n_nodes++;
    return MOE_OK;
}

static bool same_stack(const struct moe_grammar_state *st, int32_t a, int32_t b)
{
    while (a != b) {
        if (a < 0 || b < 0) return false;
        if (st->nodes[a].pos != st->nodes[b].pos) return false;
        a = st->nodes[a].up;
        b = st->nodes[b].up;
    }
    return true;
}

/* Appends top t to the list stk[from ..) unless an equal stack is there. */
static enum moe_status add_top(struct moe_grammar_state *st, int32_t from, int32_t t)
{
    for (int32_t k = from; k < st->n_stk; k++)
        if (same_stack(st, st->stk[k], t)) return MOE_OK;
    if (st->n_stk - from >= MOE_GRAMMAR_MAX_STACKS)
        return moe_fail(MOE_ERR_UNSUPPORTED, "grammar: more than %d parse stacks at once; the grammar "
                        "is too ambiguous to follow", MOE_GRAMMAR_MAX_STACKS);
    int32_t cap = st->cap_stk;
    MOE_TRY(grow((void **)&st->stk, &cap, st->n_stk + 1, sizeof *st->stk, INT32_MAX / 8, "stack tops"));
    st->cap_stk = cap;
    st->stk[st->n_stk++] = t;
    return MOE_OK;
}

/* Every stack that continuing at pos with node `up` below leads to. */
static enum moe_status expand(struct moe_grammar_state *st, int32_t from, int32_t pos, int32_t up, int depth)
{
    const struct moe_grammar *g = st->g;
    if (depth > 100000) return moe_fail(MOE_ERR_UNSUPPORTED, "grammar: rules nest too deep");
    while (true) {
        const struct g_elem *e = &g->e[pos];
        if (e->type == G_ALT || e->type == G_END) {
            if (up < 0) return add_top(st, from, up); /* -1: the bottom; MOE_GM_OUTSIDE: the context */
            pos = st->nodes[up].pos;
            up = st->nodes[up].up;
            continue;
        }
        if (e->type == G_REF) {
            int32_t below = up;
            uint32_t nt = g->e[pos + 1].type;
            if (nt != G_ALT && nt != G_END) MOE_TRY(new_node(st, pos + 1, up, &below));
            int32_t a = g->rule_start[e->value];
            while (true) {
                MOE_TRY(expand(st, from, a, below, depth + 1));
                while (g->e[a].type != G_ALT && g->e[a].type != G_END) a++;
                if (g->e[a].type == G_END) break;
                a++;
            }
            return MOE_OK;
        }
        int32_t t;
        MOE_TRY(new_node(st, pos, up, &t));
        return add_top(st, from, t);
    }
}

/* Whether the class at pos holds cp. */
static bool class_has(const struct g_elem *e, uint32_t cp)
{
    if (e->type == G_ANY) return true;
    bool neg = e->type == G_CHAR_NOT, in = false;
    const struct g_elem *k = e;
    do {
        uint32_t lo = k->value, hi = lo;
        if (k[1].type == G_RANGE_HI) hi = (++k)->value;
        if (cp >= lo && cp <= hi) in = true;
        k++;
    } while (k->type == G_CHAR_ALT);
    return in != neg;
}

/* Whether the class at pos holds some code point of [lo, hi]. */
static bool class_meets(const struct g_elem *e, uint32_t lo, uint32_t hi)
{
    if (e->type == G_ANY) return true;
    if (e->type == G_CHAR) {
        const struct g_elem *k = e;
        do {
            uint32_t a = k->value, b = a;
            if (k[1].type == G_RANGE_HI) b = (++k)->value;
            if (a <= hi && b >= lo) return true;
            k++;
        } while (k->type == G_CHAR_ALT);
        return false;
    }
    uint32_t cur = lo; /* negated: walk cur past the excluded ranges covering it */
    while (true) {
        bool moved = false;
        const struct g_elem *k = e;
        do {
            uint32_t a = k->value, b = a;
            if (k[1].type == G_RANGE_HI) b = (++k)->value;
            if (cur >= a && cur <= b) {
                if (b >= hi) return false;
                cur = b + 1;
                moved = true;
            }
            k++;
        } while (k->type == G_CHAR_ALT);
        if (!moved) return true;
    }
}

static int32_t after_class(const struct moe_grammar *g, int32_t pos)
{
    pos++;
    while (g->e[pos].type == G_RANGE_HI || g->e[pos].type == G_CHAR_ALT) pos++;
    return pos;
}

enum moe_status moe_gm_step_cp(struct moe_grammar_state *st, int32_t from, int32_t to, uint32_t cp)
{
    for (int32_t k = from; k < to; k++) {
        int32_t t = st->stk[k];
        if (t < 0) continue;
        const struct g_elem *e = &st->g->e[st->nodes[t].pos];
        if (!class_has(e, cp)) continue;
        MOE_TRY(expand(st, to, after_class(st->g, st->nodes[t].pos), st->nodes[t].up, 0));
    }
    return MOE_OK;
}

bool moe_gm_any_meets(const struct moe_grammar_state *st, int32_t from, int32_t to, uint32_t lo, uint32_t hi)
{
    for (int32_t k = from; k < to; k++) {
        int32_t t = st->stk[k];
        if (t >= 0 && class_meets(&st->g->e[st->nodes[t].pos], lo, hi)) return true;
    }
    return false;
}

/* UTF-8: the code points a lead byte's character can be, by length. */
static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};

enum moe_status moe_gm_step_byte(struct moe_grammar_state *st, struct moe_gm_utf8 *u, int32_t from,
                                 int32_t to, uint8_t b, bool *ok)
{
    *ok = false;
    uint32_t cp;
    if (u->need == 0) {
        int n;
        if (b < 0x80) n = 0;
        else if (b >= 0xC2 && b <= 0xDF) n = 1;
        else if (b >= 0xE0 && b <= 0xEF) n = 2;
        else if (b >= 0xF0 && b <= 0xF4) n = 3;
        else return MOE_OK;
        if (n == 0) {
            cp = b;
        } else {
            u->need = n;
            u->len = n;
            u->value = (uint32_t)b & (0x3Fu >> n);
            goto partial;
        }
    } else {
        if ((b & 0xC0) != 0x80) return MOE_OK;
        u->value = (u->value << 6) | (b & 0x3Fu);
        if (--u->need > 0) goto partial;
        cp = u->value;
        if (cp < min_cp[u->len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return MOE_OK;
    }
    MOE_TRY(moe_gm_step_cp(st, from, to, cp));
    *ok = st->n_stk > to;
    return MOE_OK;
partial: {
        uint32_t lo = u->value << (6 * u->need), hi = lo | ((1u << (6 * u->need)) - 1);
        if (lo < min_cp[u->len]) lo = min_cp[u->len];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi) return MOE_OK;
        /* the stacks do not change until the character completes: copy the list */
        if (!moe_gm_any_meets(st, from, to, lo, hi)) return MOE_OK;
        int32_t cap = st->cap_stk;
        MOE_TRY(grow((void **)&st->stk, &cap, st->n_stk + (to - from), sizeof *st->stk, INT32_MAX / 8,
                     "stack tops"));
        st->cap_stk = cap;
        memcpy(st->stk + st->n_stk, st->stk + from, (size_t)(to - from) * sizeof *st->stk);
        st->n_stk += to - from;
        *ok = true;
        return MOE_OK;
    }
}

/* ---- the committed state ---- */

/* Keeps only the nodes reachable from stk[from..to), renumbered, and
 * makes them the state's tops. */
static enum moe_status commit(struct moe_grammar_state *st, int32_t from, int32_t to)
{
    int32_t n = st->n_nodes;
    int32_t *map = malloc(((size_t)n + 1) * sizeof *map);
    struct moe_grammar_node *nn = malloc(((size_t)n + 1) * sizeof *nn);
    int32_t *tops = malloc(((size_t)(to - from) + 1) * sizeof *tops);
    if (!map || !nn || !tops) {
        free(map);
        free(nn);
        free(tops);
        return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
    }
    for (int32_t k = 0; k < n; k++) map[k] = -1;
    int32_t m = 0;
    /* nodes only point down to older nodes: renumber in index order */
    char *live = calloc((size_t)n + 1, 1);
    if (!live) {
        free(map);
        free(nn);
        free(tops);
        return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
    }
    for (int32_t k = from; k < to; k++)
        for (int32_t t = st->stk[k]; t >= 0 && !live[t]; t = st->nodes[t].up) live[t] = 1;
    for (int32_t k = 0; k < n; k++) {
        if (!live[k]) continue;
        int32_t up = st->nodes[k].up;
        nn[m] = (struct moe_grammar_node){st->nodes[k].pos, up >= 0 ? map[up] : -1};
        map[k] = m++;
    }
    for (int32_t k = from; k < to; k++) tops[k - from] = st->stk[k] >= 0 ? map[st->stk[k]] : -1;
    free(live);
    free(map);
    free(st->nodes);
    free(st->tops);
    st->nodes = nn;
    st->cap_nodes = n + 1;
    st->n_nodes = m;
    st->tops = tops;
    st->n_tops = to - from;
    st->cap_tops = to - from + 1;
    return MOE_OK;
}

enum moe_status moe_gm_load_tops(struct moe_grammar_state *st)
{
    st->n_stk = 0;
    int32_t cap = st->cap_stk;
    MOE_TRY(grow((void **)&st->stk, &cap, st->n_tops + 1, sizeof *st->stk, INT32_MAX / 8, "stack tops"));
    st->cap_stk = cap;
    memcpy(st->stk, st->tops, (size_t)st->n_tops * sizeof *st->tops);
    st->n_stk = st->n_tops;
    return MOE_OK;
}

enum moe_status moe_grammar_state_init(struct moe_grammar_state *st, const struct moe_grammar *g)
{
    memset(st, 0, sizeof *st);
    st->g = g;
    int32_t a = g->rule_start[g->root];
    while (true) {
        MOE_TRY(expand(st, 0, a, -1, 0));
        while (g->e[a].type != G_ALT && g->e[a].type != G_END) a++;
        if (g->e[a].type == G_END) break;
        a++;
    }
    return commit(st, 0, st->n_stk);
}

void moe_grammar_state_free(struct moe_grammar_state *st)
{
    free(st->nodes);
    free(st->tops);
    free(st->stk);
    free(st->key);
    for (int k = 0; k < MOE_GRAMMAR_MASK_CACHE; k++) {
        free(st->cache[k].key);
        free(st->cache[k].bits);
    }
    memset(st, 0, sizeof *st);
}

enum moe_status moe_grammar_state_copy_uncached(struct moe_grammar_state *dst, const struct moe_grammar_state *src)
{
    moe_grammar_state_free(dst);
    dst->g = src->g;
    dst->nodes = malloc(((size_t)src->n_nodes + 1) * sizeof *dst->nodes);
    dst->tops = malloc(((size_t)src->n_tops + 1) * sizeof *dst->tops);
    if (!dst->nodes || !dst->tops) {
        moe_grammar_state_free(dst);
        return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
    }
    memcpy(dst->nodes, src->nodes, (size_t)src->n_nodes * sizeof *dst->nodes);
    memcpy(dst->tops, src->tops, (size_t)src->n_tops * sizeof *dst->tops);
    dst->n_nodes = src->n_nodes;
    dst->cap_nodes = src->n_nodes + 1;
    dst->n_tops = src->n_tops;
    dst->cap_tops = src->n_tops + 1;
    dst->utf8 = src->utf8;
    return MOE_OK;
}

enum moe_status moe_grammar_state_copy(struct moe_grammar_state *dst, const struct moe_grammar_state *src)
{
    MOE_TRY(moe_grammar_state_copy_uncached(dst, src));
    for (int k = 0; k < MOE_GRAMMAR_MASK_CACHE; k++) {
        const struct moe_grammar_mask_entry *c = &src->cache[k];
        struct moe_grammar_mask_entry *d = &dst->cache[k];
        if (!c->bits) continue; /* an empty entry */
        d->key = malloc((size_t)c->n_key * sizeof *d->key);
        d->bits = malloc((size_t)c->n_words * sizeof *d->bits);
        if (!d->key || !d->bits) {
            moe_grammar_state_free(dst);
            return moe_fail(MOE_ERR_NOMEM, "grammar: out of memory");
        }
        memcpy(d->key, c->key, (size_t)c->n_key * sizeof *d->key);
        memcpy(d->bits, c->bits, (size_t)c->n_words * sizeof *d->bits);
        d->hash = c->hash;
        d->n_key = c->n_key;
        d->n_words = c->n_words;
        d->used = c->used;
    }
    dst->clock = src->clock;
    return MOE_OK;
}

enum moe_status moe_grammar_state_advance_token(struct moe_grammar_state *st, const struct moe_grammar_vocab *gv,
                                                int32_t t, bool *ok)
{
    *ok = false;
    if (t < 0 || t >= gv->V || !gv->in_trie[t]) return MOE_OK;
    return moe_grammar_state_advance(st, gv->bytes + gv->off[t], gv->off[t + 1] - gv->off[t], ok);
}

enum moe_status moe_grammar_state_advance(struct moe_grammar_state *st, const uint8_t *b, size_t n, bool *ok)
{
    *ok = true;
    if (n == 0) return MOE_OK;
    int32_t keep_nodes = st->n_nodes;
    MOE_TRY(moe_gm_load_tops(st));
    struct moe_gm_utf8 u = st->utf8;
    int32_t from = 0;
    enum moe_status s = MOE_OK;
    for (size_t k = 0; k < n; k++) {
        int32_t to = st->n_stk;
        if ((s = moe_gm_step_byte(st, &u, from, to, b[k], ok)) || !*ok) goto undo;
        from = to;
    }
    st->utf8 = u;
    return commit(st, from, st->n_stk);
undo:
    st->n_nodes = keep_nodes;
    st->n_stk = 0;
    if (s) *ok = false;
    return s;
}

bool moe_grammar_state_accepting(const struct moe_grammar_state *st)
{
    if (st->utf8.need) return false;
    for (int k = 0; k < st->n_tops; k++)
        if (st->tops[k] < 0) return true;
    return false;
}

bool moe_grammar_state_can_continue(const struct moe_grammar_state *st)
{
    for (int k = 0; k < st->n_tops; k++)
        if (st->tops[k] >= 0) return true;
    return false;
}
