/* expert_cache.c - the slot policy of expert_cache.h. */
#include <stdlib.h>
#include <string.h>

#include "experts/expert_cache.h"

enum moe_status moe_expert_cache_init(struct moe_expert_cache *c, int E, int C, bool lfu)
{
    memset(c, 0, sizeof *c);
    if (E < 1 || C < 1 || C > E)
        return moe_fail(MOE_ERR_INVALID_ARG, "expert cache: %d slots for %d experts", C, E);
    c->E = E;
    c->C = C;
    c->lfu = lfu;
    c->slot = malloc((size_t)E * sizeof *c->slot);
    c->owner = malloc((size_t)C * sizeof *c->owner);
    c->last = calloc((size_t)E, sizeof *c->last);
    c->freq = calloc((size_t)E, sizeof *c->freq);
    c->step_of = malloc((size_t)E * sizeof *c->step_of);
    c->round_of = malloc((size_t)E * sizeof *c->round_of);
    if (!c->slot || !c->owner || !c->last || !c->freq || !c->step_of || !c->round_of) {
        moe_expert_cache_free(c);
        return moe_fail(MOE_ERR_NOMEM, "expert cache: %d experts", E);
    }
    for (int e = 0; e < E; e++) c->slot[e] = -1, c->step_of[e] = c->round_of[e] = -1;
    for (int s = 0; s < C; s++) c->owner[s] = -1;
    c->clock = 1;
    return MOE_OK;
}

/* A count from a statistics file as a use count: non-finite or negative
 * counts are none, huge ones capped well below overflow. */
static int64_t load_uses(double v)
{
    if (!(v > 0)) return 0;
    return v < 1e18 ? (int64_t)v : (int64_t)1e18;
}

int moe_expert_cache_warm(struct moe_expert_cache *c, const double *load)
{
    int n = 0;
    for (int e = 0; e < c->E; e++) c->freq[e] = load_uses(load[e]);
    for (; n < c->C; n++) {
        int best = -1;
        for (int e = 0; e < c->E; e++)
            if (c->slot[e] < 0 && c->freq[e] > 0 && (best < 0 || c->freq[e] > c->freq[best])) best = e;
        if (best < 0) break;
        c->slot[best] = n;
        c->owner[n] = best;
    }
    if (!c->lfu) memset(c->freq, 0, (size_t)c->E * sizeof *c->freq);
    return n;
}

void moe_expert_cache_free(struct moe_expert_cache *c)
{
    free(c->slot);
    free(c->owner);
    free(c->last);
    free(c->freq);
    free(c->step_of);
    free(c->round_of);
    memset(c, 0, sizeof *c);
}

void moe_expert_cache_step(struct moe_expert_cache *c)
{
    c->step++;
    c->round++;
}

void moe_expert_cache_round(struct moe_expert_cache *c) { c->round++; }

/* The slot a miss takes: a free one, else the victim the policy picks
 * among the experts the current round does not use; -1 when none. */
static int victim_slot(const struct moe_expert_cache *c)
{
    int victim = -1;
    for (int pass = 0; pass < 2 && victim < 0; pass++)
        for (int s = 0; s < c->C; s++) {
            const int v = c->owner[s];
            if (v < 0) return s;
            if (c->round_of[v] == c->round || (pass == 0 && c->step_of[v] == c->step)) continue;
            const int w = victim < 0 ? -1 : c->owner[victim];
            const bool by_freq = c->lfu && w >= 0 && c->freq[v] != c->freq[w];
            if (w < 0 || (by_freq ? c->freq[v] < c->freq[w] : c->last[v] < c->last[w])) victim = s;
        }
    return victim;
}

int moe_expert_cache_order(struct moe_expert_cache *c, const int32_t *counts, int32_t *order)
{
    moe_expert_cache_step(c);
    c->round_uses = 0;
    int m = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int e = 0; e < c->E; e++)
            if (counts[e] > 0 && (c->slot[e] >= 0) == (pass == 0)) order[m++] = e;
    return m;
}

int moe_expert_cache_split(const struct moe_expert_cache *c, const int32_t *counts, int R, int32_t *rest,
                           int32_t *list)
{
    int n = 0;
    for (int e = 0; e < c->E; e++) {
        const bool cpu = counts[e] > 0 && counts[e] <= R && c->slot[e] < 0;
        rest[e] = cpu ? 0 : counts[e];
        if (cpu) list[n++] = e;
    }
    return n;
}

int moe_expert_cache_fill(struct moe_expert_cache *c, const int32_t *order, int m, int *next,
                          int32_t *slot, bool *loaded)
{
    if (c->round_uses) {
        moe_expert_cache_round(c);
        c->round_uses = 0;
    }
    int n = 0, evicted;
    while (*next < m) {
        const int s = moe_expert_cache_use(c, order[*next], &loaded[n], &evicted);
        if (s < 0) break;
        slot[n++] = s;
        (*next)++;
    }
    c->round_uses = n;
    return n;
}

int moe_expert_cache_use(struct moe_expert_cache *c, int e, bool *loaded, int *evicted)
{
    *loaded = false;
    *evicted = -1;
    if (e < 0 || e >= c->E) return -1;
    int s = c->slot[e];
    if (s < 0) {
        s = victim_slot(c);
        if (s < 0) return -1;
        if (c->owner[s] >= 0) {
            *evicted = c->owner[s];
            c->slot[c->owner[s]] = -1;
        }
        c->owner[s] = e;
        c->slot[e] = s;
        *loaded = true;
    }
    if (c->step_of[e] != c->step) {
        c->accesses++;
        c->freq[e]++;
        if (!*loaded) c->hits++;
    }
    c->step_of[e] = c->step;
    c->round_of[e] = c->round;
    c->last[e] = c->clock++;
    return s;
}
