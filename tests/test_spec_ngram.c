/* test_spec_ngram.c - the n-gram proposer (runtime/engine/spec_ngram.h):
 * the most recent earlier match of the longest n-gram in n_min..n_max, its
 * continuation copied on past the end of the sequence, and nothing when no
 * n-gram recurs.  A property test over random sequences checks the rule
 * itself: the chosen occurrence matches, no later one does, no longer n
 * matches anywhere. */
#include <criterion/criterion.h>
#include <string.h>

#include "runtime/engine/spec_ngram.h"
#include "tests/testutil.h"

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void expect(const int32_t *got, int n_got, const int32_t *want, int n_want)
{
    cr_assert_eq(n_got, n_want, "%d tokens proposed, want %d", n_got, n_want);
    for (int j = 0; j < n_want; j++)
        cr_assert_eq(got[j], want[j], "draft %d: %d, want %d", j, got[j], want[j]);
}

Test(spec_ngram, copies_what_followed_the_match)
{
    const int32_t t[] = {1, 2, 3, 4, 9, 1, 2, 3};
    int32_t d[4];
    const int32_t want[] = {4, 9, 1, 2};
    expect(d, moe_spec_ngram_propose(t, N_OF(t), 1, 3, 4, d), want, 4);
}

Test(spec_ngram, takes_the_most_recent_match)
{
    const int32_t t[] = {1, 2, 7, 1, 2, 8, 5, 1, 2};
    int32_t d[4];
    const int32_t want[] = {8, 5, 1, 2};
    expect(d, moe_spec_ngram_propose(t, N_OF(t), 2, 2, 4, d), want, 4);
}

Test(spec_ngram, longer_ngram_wins_over_a_more_recent_shorter_one)
{
    const int32_t t[] = {1, 2, 3, 4, 2, 3, 5, 1, 2, 3};
    int32_t d[2];
    const int32_t three[] = {4, 2}, two[] = {5, 1};
    expect(d, moe_spec_ngram_propose(t, N_OF(t), 1, 3, 2, d), three, 2);
    expect(d, moe_spec_ngram_propose(t, N_OF(t), 1, 2, 2, d), two, 2);
}

Test(spec_ngram, falls_back_to_shorter_ngrams_down_to_n_min)
{
    const int32_t t[] = {5, 6, 1, 9, 6, 1};
    int32_t d[3];
    const int32_t want[] = {9, 6, 1};
    expect(d, moe_spec_ngram_propose(t, N_OF(t), 1, 3, 3, d), want, 3);
    expect(d, moe_spec_ngram_propose(t, N_OF(t), 2, 3, 3, d), want, 3);
    cr_assert_eq(moe_spec_ngram_propose(t, N_OF(t), 3, 3, 3, d), 0, "no 3-gram recurs");
}

Test(spec_ngram, copy_runs_past_the_end_into_its_own_proposal)
{
    const int32_t t[] = {1, 2, 3, 1, 2};
    int32_t d[7];
    const int32_t want[] = {3, 1, 2, 3, 1, 2, 3};
    expect(d, moe_spec_ngram_propose(t, N_OF(t), 1, 2, 7, d), want, 7);
    const int32_t same[] = {4, 4};
    const int32_t fours[] = {4, 4, 4};
    expect(d, moe_spec_ngram_propose(same, 2, 1, 3, 3, d), fours, 3);
}

Test(spec_ngram, proposes_nothing_without_a_recurrence)
{
    const int32_t t[] = {1, 2, 3, 4, 5, 6};
    int32_t d[4] = {-7, -7, -7, -7};
    cr_assert_eq(moe_spec_ngram_propose(t, N_OF(t), 1, 3, 4, d), 0);
    cr_assert_eq(moe_spec_ngram_propose(t, 1, 1, 3, 4, d), 0, "one token has no earlier match");
    const int32_t r[] = {3, 3, 3};
    cr_assert_eq(moe_spec_ngram_propose(r, 3, 1, 3, 0, d), 0, "k = 0");
    cr_assert_eq(moe_spec_ngram_propose(r, 3, 0, 3, 4, d), 0, "n_min = 0 is refused");
    cr_assert_eq(moe_spec_ngram_propose(r, 3, 3, 2, 4, d), 0, "n_max < n_min is refused");
    cr_assert_eq(d[0], -7, "draft untouched");
}

/* The rule, checked as properties on random sequences over small
 * alphabets (so n-grams recur). */
Test(spec_ngram, random_sequences_follow_the_rule)
{
    uint64_t seed = 2024;
    int32_t t[64], d[8];
    int proposed = 0;
    for (int it = 0; it < 5000; it++) {
        int len = 1 + (int)(tu_rand_u64(&seed) % 64), alpha = 2 + (int)(tu_rand_u64(&seed) % 8);
        int n_min = 1 + (int)(tu_rand_u64(&seed) % 3), n_max = n_min + (int)(tu_rand_u64(&seed) % 3);
        int k = 1 + (int)(tu_rand_u64(&seed) % 8);
        for (int i = 0; i < len; i++) t[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)alpha);
        int got = moe_spec_ngram_propose(t, len, n_min, n_max, k, d);
        /* the longest n in range with an earlier occurrence, and its most
         * recent occurrence, found by brute force */
        int best_n = 0, best_s = -1;
        for (int n = n_max; n >= n_min && best_n == 0; n--)
            for (int i = len - n - 1; i >= 0 && n < len; i--)
                if (memcmp(t + i, t + len - n, (size_t)n * sizeof *t) == 0) {
                    best_n = n;
                    best_s = i + n;
                    break;
                }
        if (best_n == 0) {
            cr_assert_eq(got, 0, "iteration %d: proposed without a match", it);
            continue;
        }
        cr_assert_eq(got, k, "iteration %d", it);
        proposed++;
        /* the sequence extended by the draft continues from best_s */
        int32_t ext[72];
        memcpy(ext, t, (size_t)len * sizeof *t);
        memcpy(ext + len, d, (size_t)k * sizeof *d);
        for (int j = 0; j < k; j++)
            cr_assert_eq(ext[len + j], ext[best_s + j], "iteration %d draft %d", it, j);
    }
    cr_assert(proposed > 1000, "the random sequences exercise matches (%d)", proposed);
}
