/* test_router.c - top-K policy (ties, NaN, renormalisation) and the
 * dispatch plan's invariants. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "router/router.h"
#include "tests/testutil.h"

Test(router, topk_ties_pick_lower_index)
{
    float logits[8] = {0.5f, 2.0f, 1.0f, 2.0f, 2.0f, -1.0f, 1.0f, 0.0f};
    int32_t ids[3];
    float w[3];
    moe_router_topk_cpu(ids, w, logits, 1, 8, 3, false);
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(ids[1], 3);
    cr_assert_eq(ids[2], 4);
    cr_assert_float_eq(w[0], w[1], 0.0f);
}

Test(router, topk_all_equal_gives_first_k_and_uniform_weights)
{
    float logits[6] = {0};
    int32_t ids[2];
    float w[2];
    moe_router_topk_cpu(ids, w, logits, 1, 6, 2, true);
    cr_assert_eq(ids[0], 0);
    cr_assert_eq(ids[1], 1);
    cr_assert_float_eq(w[0], 0.5f, 1e-7f);
    cr_assert_float_eq(w[1], 0.5f, 1e-7f);
}

Test(router, nan_scores_never_give_out_of_range_ids)
{
    float logits[2][8] = {{NAN, 1, 2, NAN, 3, 0, NAN, -1},
                          {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN}};
    int32_t ids[2][4];
    float w[2][4];
    moe_router_topk_cpu(&ids[0][0], &w[0][0], &logits[0][0], 2, 8, 4, true);
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 4; k++) cr_assert(ids[t][k] >= 0 && ids[t][k] < 8);
    /* distinct ids in each row */
    for (int t = 0; t < 2; t++)
        for (int a = 0; a < 4; a++)
            for (int b = a + 1; b < 4; b++) cr_assert_neq(ids[t][a], ids[t][b]);
    /* an all-NaN row still yields K distinct valid experts */
    cr_assert_eq(ids[1][0], 0);
    cr_assert_eq(ids[1][3], 3);
}

Test(router, infinities_rank_correctly)
{
    float logits[4] = {-INFINITY, 1.0f, INFINITY, 0.0f};
    int32_t ids[2];
    float w[2];
    moe_router_topk_cpu(ids, w, logits, 1, 4, 2, false);
    cr_assert_eq(ids[0], 2);
    cr_assert(ids[1] >= 0 && ids[1] < 4);
}

Test(router, softmax_and_renormalisation_match_definition)
{
    enum { T = 5, E = 16, K = 4 };
    float logits[T * E];
    tu_fill_uniform(logits, T * E, 7, -3, 3);
    int32_t ids[T * K];
    float w[T * K], wn[T * K];
    moe_router_topk_cpu(ids, w, logits, T, E, K, false);
    moe_router_topk_cpu(ids, wn, logits, T, E, K, true);
    for (int t = 0; t < T; t++) {
        double z = 0;
        for (int e = 0; e < E; e++) z += exp(logits[t * E + e]);
        double sum = 0;
        for (int k = 0; k < K; k++) {
            double p = exp(logits[t * E + ids[t * K + k]]) / z;
            cr_assert_float_eq(w[t * K + k], p, 1e-6, "t=%d k=%d", t, k);
            sum += p;
            if (k) cr_assert(w[t * K + k] <= w[t * K + k - 1], "descending");
            /* nothing outside the chosen set beats the K-th */
        }
        for (int e = 0; e < E; e++) {
            int chosen = 0;
            for (int k = 0; k < K; k++) chosen |= ids[t * K + k] == e;
            if (!chosen) cr_assert(logits[t * E + e] <= logits[t * E + ids[t * K + K - 1]]);
        }
        for (int k = 0; k < K; k++) cr_assert_float_eq(wn[t * K + k], w[t * K + k] / sum, 1e-6);
    }
}

static void check_plan(const int32_t *ids, int T, int K, int E)
{
    const int n = T * K;
    struct moe_dispatch plan = {
        .counts = malloc(E * sizeof(int32_t)), .offsets = malloc((E + 1) * sizeof(int32_t)),
        .perm = malloc(n * sizeof(int32_t)), .pos = malloc(n * sizeof(int32_t))};
    moe_router_dispatch_cpu(&plan, ids, T, K, E);
    int64_t total = 0;
    for (int e = 0; e < E; e++) total += plan.counts[e];
    cr_assert_eq(total, (int64_t)T * K, "counts sum to T*K");
    cr_assert_eq(plan.offsets[0], 0);
    for (int e = 0; e < E; e++) cr_assert_eq(plan.offsets[e + 1] - plan.offsets[e], plan.counts[e]);
    char *seen = calloc(n, 1);
    for (int r = 0; r < n; r++) {
        int p = plan.perm[r];
        cr_assert(p >= 0 && p < n);
        cr_assert_not(seen[p], "perm is a permutation");
        seen[p] = 1;
        cr_assert_eq(plan.pos[p], r, "pos inverts perm");
    }
    for (int e = 0; e < E; e++)
        for (int r = plan.offsets[e]; r < plan.offsets[e + 1]; r++) {
            cr_assert_eq(ids[plan.perm[r]], e, "rows of expert %d are contiguous", e);
            if (r > plan.offsets[e]) cr_assert(plan.perm[r] > plan.perm[r - 1], "stable order");
        }
    free(seen);
    free(plan.counts);
    free(plan.offsets);
    free(plan.perm);
    free(plan.pos);
}

Test(router, dispatch_plan_invariants_random)
{
    uint64_t s = 42;
    for (int trial = 0; trial < 50; trial++) {
        int T = 1 + (int)(tu_rand_u64(&s) % 300), E = 1 + (int)(tu_rand_u64(&s) % 300);
        int K = 1 + (int)(tu_rand_u64(&s) % (E < 8 ? E : 8));
        int32_t *ids = malloc((size_t)T * K * sizeof(int32_t));
        for (int i = 0; i < T * K; i++) ids[i] = (int32_t)(tu_rand_u64(&s) % (uint64_t)E);
        check_plan(ids, T, K, E);
        free(ids);
    }
}

Test(router, dispatch_all_rows_to_one_expert)
{
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = 5;
    check_plan(ids, 32, 2, 8);
}

/* The sigmoid router, worked by hand: 8 experts in 4 groups of 2; the
 * bias moves the choice, the weights stay the unbiased sigmoids. */
Test(router, sigmoid_groups_bias_and_scale)
{
    /* sigmoid(0) = 0.5, sigmoid(2) = 0.881, sigmoid(-2) = 0.119 */
    float logits[8] = {2, 2, 0, 0, -2, 0, 2, -2};
    float bias[8] = {0, 0, 0, 0, 1, 1, 0, 0};
    /* choice: {0.881, 0.881 | 0.5, 0.5 | 1.119, 1.5 | 0.881, 0.119}
     * group sums: 1.762, 1.0, 2.619, 1.0 -> groups 2 and 0 eligible */
    int32_t ids[3];
    float w[3];
    struct moe_route r = {8, 3, false, true, bias, 4, 2, 1.0f, false};
    moe_router_topk_sigmoid_cpu(ids, w, logits, 1, &r);
    cr_assert_eq(ids[0], 5); /* 1.5 */
    cr_assert_eq(ids[1], 4); /* 1.119 */
    cr_assert_eq(ids[2], 0); /* 0.881, tie with 1 (and 6, not eligible): lower index */
    const double s2 = 1 / (1 + exp(-2.0)), sm2 = 1 / (1 + exp(2.0));
    cr_assert_float_eq(w[0], 0.5f, 1e-6);
    cr_assert_float_eq(w[1], sm2, 1e-6, "the weight is the unbiased score");
    cr_assert_float_eq(w[2], s2, 1e-6);
    /* renormalised and scaled */
    r.renorm = true;
    r.scale = 2.5f;
    moe_router_topk_sigmoid_cpu(ids, w, logits, 1, &r);
    const double sum = 0.5 + sm2 + s2;
    cr_assert_float_eq(w[0], 0.5 / sum * 2.5, 1e-6);
    cr_assert_float_eq(w[1] + w[2] + w[0], 2.5, 1e-5);
    /* one group: expert 6 (0.881) now competes and ties go to the lower index */
    r.n_group = r.topk_group = 1;
    moe_router_topk_sigmoid_cpu(ids, w, logits, 1, &r);
    cr_assert_eq(ids[0], 5);
    cr_assert_eq(ids[1], 4);
    cr_assert_eq(ids[2], 0);
    /* no bias: 0, 1, 6 by score */
    r.bias = NULL;
    moe_router_topk_sigmoid_cpu(ids, w, logits, 1, &r);
    cr_assert_eq(ids[0], 0);
    cr_assert_eq(ids[1], 1);
    cr_assert_eq(ids[2], 6);
}

/* Llama-4's router takes the top-K logits (torch.topk on them), then their
 * sigmoids: logits 17 and 20 both have a sigmoid of 1.0f, so only the
 * logits tell them apart. */
Test(router, by_logit_chooses_by_the_logits)
{
    float logits[4] = {17, -1, 20, 0};
    int32_t id;
    float w;
    struct moe_route r = {4, 1, false, true, NULL, 1, 1, 1.0f, true};
    moe_router_topk_sigmoid_cpu(&id, &w, logits, 1, &r);
    cr_assert_eq(id, 2);
    cr_assert_float_eq(w, 1.0f, 1e-7, "the weight is the sigmoid");
    r.by_logit = false; /* by the sigmoid: a tie, to the lower index */
    moe_router_topk_sigmoid_cpu(&id, &w, logits, 1, &r);
    cr_assert_eq(id, 0);
}

Test(router, sigmoid_nan_scores_keep_ids_valid)
{
    float logits[2][8] = {{NAN, 1, 2, NAN, 3, 0, NAN, -1},
                          {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN}};
    int32_t ids[2][4];
    float w[2][4];
    struct moe_route r = {8, 4, true, true, NULL, 2, 1, 1.0f, false};
    moe_router_topk_sigmoid_cpu(&ids[0][0], &w[0][0], &logits[0][0], 2, &r);
    for (int t = 0; t < 2; t++)
        for (int a = 0; a < 4; a++) {
            cr_assert(ids[t][a] >= 0 && ids[t][a] < 8);
            for (int b = a + 1; b < 4; b++) cr_assert_neq(ids[t][a], ids[t][b]);
        }
    /* row 0: group 0 (sigmoid(2) + sigmoid(1) = 1.61, its NaNs ranked last)
     * beats group 1 (sigmoid(3) + sigmoid(0) = 1.45); K = 4 fills it, the
     * NaN experts last by index */
    cr_assert_eq(ids[0][0], 2);
    cr_assert_eq(ids[0][1], 1);
    cr_assert_eq(ids[0][2], 0);
    cr_assert_eq(ids[0][3], 3);
}
