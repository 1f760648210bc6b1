/* test_stats_whatif.c - what-ifs of `moerun stats`: the balanced expert
 * placement equals a brute-force optimum on small cases and is never worse
 * than contiguous; the cache and top-k replays and the EP byte count on
 * hand-made traces; the Zipf fit on exact Zipf counts. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts/expert_cache.h"
#include "runtime/stats/stats_analyze.h"
#include "tests/testutil.h"

/* Smallest max device load over every assignment with at most ceil(E/N)
 * experts per device: plain enumeration of N^E assignments. */
static double brute_force(const double *load, int E, int N)
{
    const int cap = (E + N - 1) / N;
    int a[16] = {0};
    double best = INFINITY;
    while (1) {
        double dev[16] = {0};
        int cnt[16] = {0}, ok = 1;
        for (int e = 0; e < E; e++) {
            dev[a[e]] += load[e];
            ok &= ++cnt[a[e]] <= cap;
        }
        if (ok) {
            double mx = 0;
            for (int d = 0; d < N; d++) mx = fmax(mx, dev[d]);
            best = fmin(best, mx);
        }
        int i = 0;
        while (i < E && ++a[i] == N) a[i++] = 0;
        if (i == E) break;
    }
    return best;
}

static void check_feasible(const int32_t *place, int E, int N)
{
    int cnt[256] = {0};
    for (int e = 0; e < E; e++) {
        cr_assert(place[e] >= 0 && place[e] < N);
        cr_assert_leq(++cnt[place[e]], (E + N - 1) / N, "device %d over capacity", place[e]);
    }
}

Test(ep, balanced_equals_brute_force_on_small_cases)
{
    /* the classic case where longest-first alone gives 7: {3,2,2} {3,2} */
    double lpt[5] = {3, 3, 2, 2, 2};
    int32_t place[16];
    moe_ep_balanced(lpt, 5, 2, place);
    cr_assert_float_eq(moe_ep_max_load(lpt, 5, 2, place), 6.0, 1e-12); /* {3,3} {2,2,2} */
    cr_assert_float_eq(brute_force(lpt, 5, 2), 6.0, 1e-12);
    /* capacity binds: 4 experts on 2 devices, 2 each */
    double cap[4] = {10, 1, 1, 1};
    moe_ep_balanced(cap, 4, 2, place);
    cr_assert_float_eq(moe_ep_max_load(cap, 4, 2, place), 11.0, 1e-12);
    uint64_t rng = 42;
    for (int trial = 0; trial < 120; trial++) {
        int E = 4 + (int)(tu_rand_u64(&rng) % 6); /* 4..9 */
        int N = 2 + (int)(tu_rand_u64(&rng) % 3); /* 2..4 */
        double load[16];
        for (int e = 0; e < E; e++) {
            double u = tu_rand_uniform(&rng, 0, 1);
            load[e] = trial % 3 == 0 ? floor(100 * pow(u, 3)) : floor(1 + 20 * u); /* skewed or flat */
        }
        moe_ep_balanced(load, E, N, place);
        check_feasible(place, E, N);
        double got = moe_ep_max_load(load, E, N, place), want = brute_force(load, E, N);
        cr_assert_float_eq(got, want, 1e-9, "trial %d E=%d N=%d: %g vs optimum %g", trial, E, N, got, want);
    }
}

Test(ep, balanced_never_worse_than_contiguous)
{
    uint64_t rng = 7;
    int32_t bal[256], con[256];
    for (int trial = 0; trial < 60; trial++) {
        int E = 16 << (trial % 4);  /* 16..128 */
        int N = 1 << (1 + trial % 4); /* 2..16 */
        double load[256];
        for (int e = 0; e < E; e++) {
            double u = tu_rand_uniform(&rng, 0, 1);
            load[e] = trial % 2 ? floor(1000 / pow(1 + e, 1.1)) : floor(1000 * u * u);
        }
        moe_ep_contiguous(E, N, con);
        moe_ep_balanced(load, E, N, bal);
        check_feasible(con, E, N);
        check_feasible(bal, E, N);
        double b = moe_ep_max_load(load, E, N, bal), c = moe_ep_max_load(load, E, N, con);
        double total = 0;
        for (int e = 0; e < E; e++) total += load[e];
        cr_assert_leq(b, c, "trial %d: balanced %g > contiguous %g", trial, b, c);
        cr_assert_geq(b, total / N - 1e-9);
    }
}

/* A hand-made trace: Lm = 1, E = 4, K = 2, steps given by `steps`. */
static void make_trace(struct moe_sdata *d, int N, const int32_t *ids, const float *w, const int *step)
{
    memset(d, 0, sizeof *d);
    d->path = strdup("hand");
    d->Lm = 1;
    d->E = 4;
    d->K = 2;
    d->N = N;
    d->d_model = 10;
    d->d_expert = 5;
    d->weight_bytes = 2;
    d->layers = calloc(1, sizeof(int32_t));
    d->load = calloc(4, sizeof(double));
    d->top1 = calloc(4, sizeof(double));
    d->coact = calloc(16, sizeof(double));
    d->ent_norm = calloc(1, sizeof(double));
    d->ids = malloc((size_t)N * 2 * sizeof(int32_t));
    d->w = malloc((size_t)N * 2 * sizeof(float));
    d->meta = calloc((size_t)N * 4, sizeof(int64_t));
    memcpy(d->ids, ids, (size_t)N * 2 * sizeof(int32_t));
    memcpy(d->w, w, (size_t)N * 2 * sizeof(float));
    for (int t = 0; t < N; t++) {
        d->meta[t * 4] = step[t];
        for (int k = 0; k < 2; k++) d->load[ids[t * 2 + k]] += 1;
    }
}

Test(whatif, cache_hits_by_hand)
{
    /* steps: {0,1}, {0,1}, {2,3}, {0,2} ; one token per step */
    int32_t ids[] = {0, 1, 1, 0, 2, 3, 0, 2};
    float w[] = {.6f, .4f, .5f, .5f, .9f, .1f, .7f, .3f};
    int step[] = {0, 1, 2, 3};
    struct moe_sdata d;
    make_trace(&d, 4, ids, w, step);
    struct moe_cache_result r;
    moe_cache_simulate(&d, 0, 4, false, NULL, 0, &r); /* everything fits: only cold misses */
    cr_assert(r.accesses == 8 && r.hits == 4, "%lld/%lld", (long long)r.hits, (long long)r.accesses);
    moe_cache_simulate(&d, 0, 2, false, NULL, 0, &r);
    /* LRU, 2 slots, each step's experts as the CUDA backend takes them
     * (resident first, then by id): {0,1}: 0 miss, 1 miss | 0 hit, 1 hit |
     * {2,3}: 2 miss (evicts 0, least recent), 3 miss (evicts 1: 2 is in the
     * round) | {0,2}: 2 hit (resident first), 0 miss (evicts 3) */
    cr_assert(r.accesses == 8 && r.hits == 3, "LRU %lld", (long long)r.hits);
    moe_cache_simulate(&d, 0, 2, true, NULL, 0, &r);
    /* LFU: the same here (0 and 1 are used equally: ties go to LRU) */
    cr_assert(r.accesses == 8 && r.hits == 3, "LFU %lld", (long long)r.hits);
    /* token order would miss where the backend hits: 2 slots,
     * steps {0,1} | {2,0}.  Taken 2 then 0, 2 would evict 0 (the least
     * recent) and 0 miss; the backend takes the resident 0 first (a hit),
     * then 2 evicts 1 */
    int32_t ids3[] = {0, 1, 2, 0};
    float w3[4] = {0};
    int step3[] = {0, 1};
    struct moe_sdata d3;
    make_trace(&d3, 2, ids3, w3, step3);
    moe_cache_simulate(&d3, 0, 2, false, NULL, 0, &r);
    cr_assert(r.accesses == 4 && r.hits == 1, "backend order: %lld hits", (long long)r.hits);
    moe_sdata_free(&d3);
    /* LFU keeps a frequent expert that LRU drops: one expert per step (both
     * slots), 0 | 0 | 1 | 2 | 0.  LRU evicts 0 for 2 and misses it again (1 hit);
     * LFU evicts 1 (used once) and hits 0 (2 hits) */
    int32_t ids2[] = {0, 0, 0, 0, 1, 1, 2, 2, 0, 0};
    float w2[10] = {0};
    int step2[] = {0, 1, 2, 3, 4};
    struct moe_sdata d2;
    make_trace(&d2, 5, ids2, w2, step2);
    struct moe_cache_result lru, lfu;
    moe_cache_simulate(&d2, 0, 2, false, NULL, 0, &lru);
    moe_cache_simulate(&d2, 0, 2, true, NULL, 0, &lfu);
    cr_assert(lru.hits == 1 && lfu.hits == 2, "LFU %lld vs LRU %lld", (long long)lfu.hits,
              (long long)lru.hits);
    moe_sdata_free(&d2);
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(moe_whatif_topk(f, &d, 1), MOE_OK);
    cr_assert_eq(moe_whatif_cache(f, &d, 2, 0, NULL, 0), MOE_OK);
    fclose(f);
    /* k = 1 keeps mean(.6, .5, .9, .7) = 0.675 */
    cr_assert(strstr(buf, "   1       0.6750"), "%s", buf);
    cr_assert(strstr(buf, "   2       1.0000"), "%s", buf);
    free(buf);
    moe_sdata_free(&d);
}

/* Warm start: the slots begin with the statistics' most loaded experts.
 * Trace steps {0,1}, {0,1}, {2,3}, {0,2}, 2 slots, load {10, 1, 5, 0}:
 * slots start {0, 2}.  LRU: {0,1}: 0 hit, 1 miss (evicts 2) | 0, 1 hit |
 * {2,3}: 2 miss (evicts 0, less recent), 3 miss (evicts 1) | {0,2}: 2 hit,
 * 0 miss: 4 hits where the empty start gave 3.  LFU (uses 10, 1, 5, 0
 * seeded): {0,1}: 0 hit, 1 miss (evicts 2, the only slot not in the
 * round) | hits | {2,3}: 2 miss evicts 1 (3 uses against 0's 12), 3 miss
 * evicts 0 | {0,2}: 2 hit, 0 miss: 4 hits.  A statistics file of other
 * dimensions is refused by name. */
Test(whatif, cache_warm_start_by_hand)
{
    int32_t ids[] = {0, 1, 1, 0, 2, 3, 0, 2};
    float w[8] = {0};
    int step[] = {0, 1, 2, 3};
    struct moe_sdata d, warm;
    make_trace(&d, 4, ids, w, step);
    const double load[4] = {10, 1, 5, 0};
    struct moe_cache_result r;
    moe_cache_simulate(&d, 0, 2, false, load, 0, &r);
    cr_expect(r.accesses == 8 && r.hits == 4, "LRU + warm: %lld/%lld", (long long)r.hits, (long long)r.accesses);
    moe_cache_simulate(&d, 0, 2, true, load, 0, &r);
    cr_expect(r.accesses == 8 && r.hits == 4, "LFU + warm: %lld/%lld", (long long)r.hits, (long long)r.accesses);
    make_trace(&warm, 1, ids, w, step); /* load {1, 1, 0, 0}: slots {0, 1} */
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(moe_whatif_cache(f, &d, 2, 0, &warm, 0), MOE_OK);
    fclose(f);
    /* LRU + warm from {0, 1}: 0, 1 hit | hits | 2, 3 miss | 2 hit, 0 miss: 5 of 8 */
    cr_expect(strstr(buf, "LRU+warm     0.6250"), "%s", buf);
    cr_expect(strstr(buf, "LRU          0.3750"), "%s", buf);
    free(buf);
    warm.E = 5;
    cr_expect_eq(moe_whatif_cache(stdout, &d, 2, 0, &warm, 0), MOE_ERR_INVALID_ARG);
    cr_expect(strstr(moe_last_error(), "5 experts") != NULL, "%s", moe_last_error());
    warm.E = 4;
    moe_sdata_free(&warm);
    moe_sdata_free(&d);
}

/* --cpu-rows R (the backend's --gpu-experts-cpu-rows): a miss of at most R
 * rows in the step runs on the CPU and never takes a slot.  Steps (2 slots,
 * LRU, R = 1): {0,1},{0,2}: counts 0:2 1:1 2:1: 1 and 2 to the CPU, 0 miss
 * | {1,3}: both one row, not resident: the CPU | {0,3},{3,2}: 0 (one row
 * but resident) hit, 3 (two rows) miss, 2 to the CPU.  Device uses 3,
 * hits 1; CPU uses 5 of 5 rows over 5 tokens. */
Test(whatif, cache_cpu_rows_by_hand)
{
    int32_t ids[] = {0, 1, 0, 2, 1, 3, 0, 3, 3, 2};
    float w[10] = {0};
    int step[] = {0, 0, 1, 2, 2};
    struct moe_sdata d;
    make_trace(&d, 5, ids, w, step);
    struct moe_cache_result r;
    moe_cache_simulate(&d, 0, 2, false, NULL, 1, &r);
    cr_expect(r.accesses == 3 && r.hits == 1 && r.cpu_uses == 5 && r.cpu_rows == 5,
              "R = 1: %lld of %lld device uses hit, %lld CPU uses of %lld rows", (long long)r.hits,
              (long long)r.accesses, (long long)r.cpu_uses, (long long)r.cpu_rows);
    /* R = 2 takes every use (no step has more than 2 rows an expert), so
     * nothing is ever resident: 3 + 2 + 3 uses, all 10 rows */
    moe_cache_simulate(&d, 0, 2, false, NULL, 2, &r);
    cr_expect(r.accesses == 0 && r.cpu_uses == 8 && r.cpu_rows == 10, "R = 2: %lld device, %lld CPU uses",
              (long long)r.accesses, (long long)r.cpu_uses);
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(moe_whatif_cache(f, &d, 2, 0, NULL, 1), MOE_OK);
    fclose(f);
    /* hit rate 1/3; 2 misses x 300 bytes / 5 tokens; 5 CPU uses / 5 tokens, 1 row each */
    cr_expect(strstr(buf, "LRU          0.3333     0.3333     0.3333           0.0001          1.0000      1.00"),
              "%s", buf);
    free(buf);
    moe_sdata_free(&d);
}

Test(whatif, ep_bytes_by_hand)
{
    /* one step of 2 tokens on 2 devices: token 0 on device 0, token 1 on 1.
     * contiguous: experts 0,1 on device 0, 2,3 on device 1.
     * token 0 -> {0, 3}: one remote device; token 1 -> {2, 3}: none. */
    int32_t ids[] = {0, 3, 2, 3};
    float w[] = {.5f, .5f, .5f, .5f};
    int step[] = {0, 0};
    struct moe_sdata d;
    make_trace(&d, 2, ids, w, step);
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    struct moe_ep_opts o = {.devices = 2, .act_bytes = 2};
    cr_assert_eq(moe_whatif_ep(f, &d, &o), MOE_OK);
    fclose(f);
    /* 1 send * 2 (dispatch + combine) * D=10 * 2 bytes = 40 bytes = 0.00004 MB;
     * contiguous device loads 1 and 3 pairs: max/mean 3 / 2 = 1.5 */
    cr_assert(strstr(buf, "contiguous             1.500     1.500           3.0         0.000"), "%s", buf);
    cr_assert(strstr(buf, "device shares: 25.0% 75.0%"), "%s", buf);
    free(buf);
    o.replicas = 4;
    cr_assert_eq(moe_whatif_ep(stdout, &d, &o), MOE_ERR_INVALID_ARG);
    moe_sdata_free(&d);
}

Test(whatif, zipf_fit_on_exact_counts)
{
    double c[64];
    for (int e = 0; e < 64; e++) c[(e * 17) % 64] = 1e6 / pow(e + 1, 1.3);
    cr_assert_float_eq(moe_sdata_zipf_fit(c, 64), 1.3, 1e-9);
    double one[3] = {5, 0, 0};
    cr_assert(isnan(moe_sdata_zipf_fit(one, 3)));
}

/* The runtime side of the same policy (experts/expert_cache.h): rounds
 * never evict an expert of the current round, so a step needing more
 * experts than slots runs in several rounds, each with every one of its
 * experts resident at once. */
Test(expert_cache, rounds_keep_their_experts)
{
    struct moe_expert_cache c;
    cr_assert_eq(moe_expert_cache_init(&c, 8, 3, false), MOE_OK);
    bool loaded;
    int ev;
    moe_expert_cache_step(&c);
    const int need[] = {0, 2, 4, 6, 7};
    int slots[5], done = 0, rounds = 0;
    while (done < 5) {
        if (rounds++) moe_expert_cache_round(&c);
        int first = done;
        while (done < 5) {
            int s = moe_expert_cache_use(&c, need[done], &loaded, &ev);
            if (s < 0) break;
            cr_assert(loaded, "expert %d was not resident", need[done]);
            slots[done++] = s;
        }
        cr_assert(done > first, "a round made no progress");
        /* every expert of this round still in its slot, slots distinct */
        for (int i = first; i < done; i++) {
            cr_assert_eq(c.slot[need[i]], slots[i]);
            cr_assert_eq(c.owner[slots[i]], need[i]);
            for (int k = first; k < i; k++) cr_assert_neq(slots[k], slots[i]);
        }
    }
    cr_assert_eq(rounds, 2);
    cr_assert(c.accesses == 5 && c.hits == 0);
    /* next step: 6 and 7 are resident (the last round's), 0 is not */
    moe_expert_cache_step(&c);
    cr_assert(moe_expert_cache_use(&c, 7, &loaded, &ev) >= 0 && !loaded && ev == -1);
    cr_assert(moe_expert_cache_use(&c, 0, &loaded, &ev) >= 0 && loaded);
    /* the victim is 4 (not used this step, least recent); 6 and 7 stay */
    cr_assert_eq(ev, 4);
    cr_assert(c.slot[6] >= 0 && c.slot[7] >= 0 && c.slot[4] == -1);
    /* a third expert in the same round fits (6's slot: used last step, not this one) */
    cr_assert(moe_expert_cache_use(&c, 1, &loaded, &ev) >= 0 && loaded && ev == 6);
    /* the round is full: 0, 1, 7 all in use */
    cr_assert_eq(moe_expert_cache_use(&c, 5, &loaded, &ev), -1);
    cr_assert(c.accesses == 8 && c.hits == 1, "%lld %lld", (long long)c.accesses, (long long)c.hits);
    moe_expert_cache_free(&c);
    cr_assert_neq(moe_expert_cache_init(&c, 4, 5, false), MOE_OK);
    cr_assert_neq(moe_expert_cache_init(&c, 4, 0, true), MOE_OK);
}

/* Warm start of the runtime policy: the most loaded experts (ties to the
 * lower id, none without load) take the slots in order; under LFU the
 * counts stay as use counts, so a hot expert outlives a cold one that LRU
 * would keep. */
Test(expert_cache, warm_start_takes_the_most_loaded)
{
    struct moe_expert_cache c;
    cr_assert_eq(moe_expert_cache_init(&c, 4, 2, false), MOE_OK);
    const double tie[4] = {1, 5, 5, 0};
    cr_expect_eq(moe_expert_cache_warm(&c, tie), 2);
    cr_expect(c.owner[0] == 1 && c.owner[1] == 2, "slots %d %d", c.owner[0], c.owner[1]);
    moe_expert_cache_free(&c);
    cr_assert_eq(moe_expert_cache_init(&c, 4, 2, false), MOE_OK);
    const double few[4] = {0, -3, 3, NAN};
    cr_expect_eq(moe_expert_cache_warm(&c, few), 1);
    cr_expect(c.owner[0] == 2 && c.owner[1] == -1 && c.slot[3] == -1, "slots %d %d", c.owner[0], c.owner[1]);
    moe_expert_cache_free(&c);
    /* slots {0, 1} from {100, 1, 0, 0}; steps {2} then {0} */
    const double hot[4] = {100, 1, 0, 0};
    const int32_t s2[4] = {0, 0, 1, 0}, s0[4] = {1, 0, 0, 0};
    int64_t hits[2];
    for (int lfu = 0; lfu < 2; lfu++) {
        cr_assert_eq(moe_expert_cache_init(&c, 4, 2, lfu), MOE_OK);
        cr_expect_eq(moe_expert_cache_warm(&c, hot), 2);
        int32_t order[4], slot[4];
        bool loaded[4];
        const int32_t *steps[2] = {s2, s0};
        for (int st = 0; st < 2; st++) {
            const int m = moe_expert_cache_order(&c, steps[st], order);
            int next = 0;
            cr_assert_eq(moe_expert_cache_fill(&c, order, m, &next, slot, loaded), 1);
        }
        hits[lfu] = c.hits;
        moe_expert_cache_free(&c);
    }
    /* LRU: 2 evicts 0 (equal clocks: the first slot), 0 misses; LFU: 2
     * evicts 1 (1 use against 100), 0 hits */
    cr_expect(hits[0] == 0 && hits[1] == 1, "hits LRU %lld, LFU %lld", (long long)hits[0], (long long)hits[1]);
}
