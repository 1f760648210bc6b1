/* test_ep_place.c - expert placement (runtime/engine/ep_place.c) without
 * MPI: placements read from JSON (each malformed one refused naming what
 * and where), the held experts, the slots of routed pairs (a replicated
 * expert's rows take turns by position), and writing a balanced placement
 * with replicas from load statistics.  The placement running across
 * processes, bit-identical to one process, is tests/mpi/ep_check.c's. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/ep.h"

/* A layout of `size` ranks seen from `rank`, without a transport (nothing
 * here communicates). */
static void layout(struct moe_ep *ep, int size, int rank)
{
    moe_ep_init(ep, NULL);
    ep->size = size;
    ep->rank = rank;
}

static const bool moe4[4] = {false, true, true, true}; /* layer 0 dense */

Test(ep_place, file_layers_and_contiguous_rest)
{
    struct moe_ep ep;
    layout(&ep, 2, 1);
    const char *p = "{\"format\": \"moerun-ep-placement\", \"version\": 1, \"ranks\": 2, \"experts\": 4, "
                    "\"layers\": {\"2\": [[0, 1, 3], [2, 3]]}}";
    cr_assert_eq(moe_ep_place(&ep, 4, moe4, 4, p), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(ep.layers[0].n_slots, 0);
    cr_assert_eq(ep.layers[1].n_slots, 4); /* contiguous: {0, 1} {2, 3} */
    cr_assert(moe_ep_holds(&ep, 1, 2) && moe_ep_holds(&ep, 1, 3) && !moe_ep_holds(&ep, 1, 0));
    cr_assert_eq(ep.layers[2].n_slots, 5);
    cr_assert(moe_ep_holds(&ep, 2, 2) && moe_ep_holds(&ep, 2, 3) && !moe_ep_holds(&ep, 2, 1));
    cr_assert_eq(ep.layers[2].n_rep[3], 2);
    cr_assert_eq(ep.max_slots, 5);
    uint8_t *held;
    cr_assert_eq(moe_ep_held(&ep, &held), MOE_OK);
    const uint8_t want[16] = {1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1};
    cr_assert_arr_eq(held, want, 16);
    free(held);
    /* expert 3 of layer 2 is on both ranks (slots 2 and 4): its rows take
     * turns by position; the others keep their one slot */
    const int32_t ids[8] = {3, 0, 3, 2, 3, 1, 3, 3}, pos[4] = {10, 11, 12, 13};
    int32_t slots[8];
    moe_ep_slot_ids(&ep, 2, ids, 4, 2, pos, slots);
    const int32_t want_slots[8] = {4, 0, 2, 3, 4, 1, 2, 2};
    cr_assert_arr_eq(slots, want_slots, sizeof want_slots, "slots %d %d %d %d %d %d %d %d", slots[0], slots[1],
                     slots[2], slots[3], slots[4], slots[5], slots[6], slots[7]);
    /* the same again: no-op; another placement: refused */
    cr_assert_eq(moe_ep_place(&ep, 4, moe4, 4, p), MOE_OK);
    cr_assert_neq(moe_ep_place(&ep, 4, moe4, 4, NULL), MOE_OK);
    moe_ep_free(&ep);
}

Test(ep_place, malformed_placements_are_refused_naming_why)
{
    static const struct {
        const char *layers, *want;
    } cases[] = {
        {"{\"1\": [[0, 1]]}", "a list of 2 ranks"},
        {"{\"1\": [[0, 1], []]}", "rank 1: a non-empty list"},
        {"{\"1\": [[0, 1, 1], [2, 3]]}", "expert 1 twice"},
        {"{\"1\": [[0, 1], [2, 9]]}", "entry 1: not an expert of 0..3"},
        {"{\"1\": [[0, 1], [2, \"3\"]]}", "entry 1: not an expert"},
        {"{\"1\": [[0, 1], [2]]}", "expert 3 is on no rank"},
        {"{\"0\": [[0, 1], [2, 3]]}", "layer \"0\" is not a MoE layer"},
        {"{\"7\": [[0, 1], [2, 3]]}", "layer \"7\" is not a MoE layer"},
        {"[]", "\"layers\" must be an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char p[512];
        snprintf(p, sizeof p, "{\"format\": \"moerun-ep-placement\", \"version\": 1, \"ranks\": 2, \"experts\": 4, "
                 "\"layers\": %s}", cases[i].layers);
        struct moe_ep ep;
        layout(&ep, 2, 0);
        cr_expect_neq(moe_ep_place(&ep, 4, moe4, 4, p), MOE_OK, "case %zu accepted", i);
        cr_expect(strstr(moe_last_error(), cases[i].want), "case %zu: '%s' lacks '%s'", i, moe_last_error(),
                  cases[i].want);
        cr_expect_null(ep.layers, "case %zu left a placement", i);
        moe_ep_free(&ep);
    }
    static const struct {
        const char *p, *want;
    } heads[] = {
        {"{\"version\": 1}", "not a moerun expert placement"},
        {"{\"format\": \"moerun-ep-placement\", \"version\": 2}", "version 2"},
        {"{\"format\": \"moerun-ep-placement\", \"version\": 1, \"ranks\": 4, \"experts\": 4, \"layers\": {}}",
         "for 4 ranks, the launch has 2"},
        {"{\"format\": \"moerun-ep-placement\", \"version\": 1, \"ranks\": 2, \"experts\": 8, \"layers\": {}}",
         "for 8 experts per layer, the model has 4"},
        {"{\"format\": ", "line 1"},
    };
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++) {
        struct moe_ep ep;
        layout(&ep, 2, 0);
        cr_expect_neq(moe_ep_place(&ep, 4, moe4, 4, heads[i].p), MOE_OK, "header %zu accepted", i);
        cr_expect(strstr(moe_last_error(), heads[i].want), "header %zu: '%s' lacks '%s'", i, moe_last_error(),
                  heads[i].want);
        moe_ep_free(&ep);
    }
    /* contiguous needs a multiple; a placement naming every MoE layer lifts it */
    struct moe_ep ep;
    layout(&ep, 3, 0);
    cr_expect_neq(moe_ep_place(&ep, 4, moe4, 4, NULL), MOE_OK);
    cr_expect(strstr(moe_last_error(), "do not split evenly"), "%s", moe_last_error());
    moe_ep_free(&ep);
}

/* A skewed load over 8 experts: the writer replicates the hottest, keeps
 * every rank within ceil((E + R) / N) slots, puts every expert somewhere,
 * and predicts a better balance than contiguous; what it writes reads
 * back. */
Test(ep_place, written_placement_balances_and_reads_back)
{
    const int E = 8, N = 2, R = 2;
    const double load[2 * 8] = {80, 40, 20, 10, 5, 5, 5, 5, 1, 1, 1, 1, 1, 1, 1, 60};
    const int32_t layer[2] = {1, 3};
    char *text;
    double ratio;
    cr_assert_eq(moe_ep_placement_write(N, 2, layer, E, load, R, "test", &text, &ratio), MOE_OK, "%s",
                 moe_last_error());
    cr_log_info("predicted max/mean %.4f: %s", ratio, text);
    /* contiguous: layer 1 {0..3} 150 vs {4..7} 20; layer 3 4 vs 63 */
    const double contiguous = (150.0 * 2 / 170 + 63.0 * 2 / 67) / 2;
    cr_assert_lt(ratio, contiguous);
    cr_assert_lt(ratio, 1.1);
    struct moe_ep ep;
    layout(&ep, N, 0);
    const bool moe[4] = {false, true, false, true};
    cr_assert_eq(moe_ep_place(&ep, 4, moe, E, text), MOE_OK, "%s", moe_last_error());
    for (int j = 0; j < 2; j++) {
        const struct moe_ep_layer *pl = &ep.layers[layer[j]];
        cr_assert_eq(pl->n_slots, E + R, "layer %d: %d slots", layer[j], pl->n_slots);
        for (int r = 0; r < N; r++) cr_assert_leq(pl->bounds[r + 1] - pl->bounds[r], (E + R + N - 1) / N);
        int hottest = 0;
        for (int e = 0; e < E; e++) hottest = load[j * E + e] > load[j * E + hottest] ? e : hottest;
        cr_assert_eq(pl->n_rep[hottest], 2, "layer %d: the hottest expert %d has %d slots", layer[j], hottest,
                     pl->n_rep[hottest]);
    }
    moe_ep_free(&ep);
    free(text);
    /* impossible asks */
    cr_assert_neq(moe_ep_placement_write(1, 2, layer, E, load, 0, NULL, &text, &ratio), MOE_OK);
    cr_assert_neq(moe_ep_placement_write(N, 2, layer, E, load, E + 1, NULL, &text, &ratio), MOE_OK);
    cr_assert(strstr(moe_last_error(), "replicas"), "%s", moe_last_error());
}
