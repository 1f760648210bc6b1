/* test_sampler.c - sampling policies: greedy ties, seeds, top-k / top-p /
 * min-p supports and frequencies, penalties, log-probabilities, NaN. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "runtime/engine/sampler.h"

static struct moe_sampler_scratch sc;
static void setup(void) { cr_assert_eq(moe_sampler_scratch_init(&sc, 64), MOE_OK); }
static void teardown(void) { moe_sampler_scratch_free(&sc); }
TestSuite(sampler, .init = setup, .fini = teardown);

static int32_t draw(const struct moe_sampling *p, struct moe_rng *r, const float *logits, int V)
{
    float l[64];
    memcpy(l, logits, (size_t)V * sizeof(float));
    struct moe_sample s;
    moe_sampler_sample(p, r, l, V, NULL, 0, 0, &sc, &s);
    return s.token;
}

Test(sampler, greedy_ties_to_lower_id_and_ignores_nan)
{
    struct moe_sampling p;
    moe_sampling_defaults(&p);
    struct moe_rng r;
    moe_rng_seed(&r, 1);
    float l[5] = {0.5f, 2.0f, NAN, 2.0f, -1.0f};
    cr_assert_eq(draw(&p, &r, l, 5), 1);
    float n[3] = {NAN, NAN, 1.0f};
    cr_assert_eq(draw(&p, &r, n, 3), 2);
}

Test(sampler, same_seed_same_tokens)
{
    struct moe_sampling p;
    moe_sampling_defaults(&p);
    p.temperature = 1.0f;
    float l[32];
    for (int i = 0; i < 32; i++) l[i] = sinf((float)i);
    struct moe_rng a, b, c;
    moe_rng_seed(&a, 42);
    moe_rng_seed(&b, 42);
    moe_rng_seed(&c, 43);
    int same = 1, diff = 0;
    for (int i = 0; i < 50; i++) {
        int32_t x = draw(&p, &a, l, 32), y = draw(&p, &b, l, 32), z = draw(&p, &c, l, 32);
        same &= x == y;
        diff += x != z;
    }
    cr_assert(same);
    cr_assert(diff > 0);
}

/* Frequencies of 20000 draws match the renormalised top-k distribution
 * within 5 standard deviations, and nothing outside top-k is drawn. */
Test(sampler, top_k_frequencies_match_distribution)
{
    struct moe_sampling p;
    moe_sampling_defaults(&p);
    p.temperature = 0.7f;
    p.top_k = 3;
    float l[6] = {1.0f, 3.0f, 2.5f, 0.0f, 2.0f, -1.0f};
    struct moe_rng r;
    moe_rng_seed(&r, 7);
    int count[6] = {0};
    const int N = 20000;
    for (int i = 0; i < N; i++) count[draw(&p, &r, l, 6)]++;
    double z = exp(3.0 / 0.7) + exp(2.5 / 0.7) + exp(2.0 / 0.7);
    const int top[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        double q = exp(l[top[i]] / 0.7) / z, sd = sqrt(N * q * (1 - q));
        cr_assert(fabs(count[top[i]] - N * q) < 5 * sd, "token %d: %d draws, expected %.0f",
                  top[i], count[top[i]], N * q);
    }
    cr_assert_eq(count[0] + count[3] + count[5], 0);
}

Test(sampler, top_p_keeps_smallest_set_reaching_p)
{
    struct moe_sampling p;
    moe_sampling_defaults(&p);
    p.temperature = 1.0f;
    p.top_p = 0.7f;
    /* probabilities 0.5, 0.3, 0.15, 0.05: the set {0, 1} reaches 0.8 >= 0.7 */
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    struct moe_rng r;
    moe_rng_seed(&r, 3);
    int seen[4] = {0};
    for (int i = 0; i < 5000; i++) seen[draw(&p, &r, l, 4)]++;
    cr_assert(seen[0] > 0 && seen[1] > 0);
    cr_assert_eq(seen[2] + seen[3], 0);
}

Test(sampler, min_p_drops_unlikely_tokens)
{
    struct moe_sampling p;
    moe_sampling_defaults(&p);
    p.temperature = 1.0f;
    p.min_p = 0.25f;
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)}; /* floor 0.125 */
    struct moe_rng r;
    moe_rng_seed(&r, 5);
    int seen[4] = {0};
    for (int i = 0; i < 5000; i++) seen[draw(&p, &r, l, 4)]++;
    cr_assert(seen[2] > 0);
    cr_assert_eq(seen[3], 0);
}

Test(sampler, penalties_follow_their_definitions)
{
    struct moe_sampling p;
    moe_sampling_defaults(&p);
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    float l[4] = {1.0f, -1.0f, 3.0f, 0.5f};
    /* history: prompt {0, 1}, generated {2, 2, 1} */
    const int32_t hist[5] = {0, 1, 2, 2, 1};
    struct moe_rng r;
    moe_rng_seed(&r, 1);
    struct moe_sample s;
    moe_sampler_sample(&p, &r, l, 4, hist, 2, 5, &sc, &s);
    cr_assert_float_eq(l[0], 0.5f, 1e-6);                     /* repetition: 1/2 */
    cr_assert_float_eq(l[1], -2.0f - 0.5f - 0.25f, 1e-6);     /* -1*2, then once generated */
    cr_assert_float_eq(l[2], 1.5f - 2 * 0.5f - 0.25f, 1e-6);  /* 3/2, generated twice */
    cr_assert_float_eq(l[3], 0.5f, 1e-6);                     /* untouched */
}

Test(sampler, logprobs_are_sorted_and_normalised)
{
    struct moe_sampling p;
    moe_sampling_defaults(&p);
    p.n_logprobs = 4;
    float l[8] = {0.1f, 2.0f, -1.0f, 1.5f, 1.5f, 0.0f, -3.0f, 0.3f};
    struct moe_rng r;
    moe_rng_seed(&r, 1);
    struct moe_sample s;
    moe_sampler_sample(&p, &r, l, 8, NULL, 0, 0, &sc, &s);
    cr_assert_eq(s.token, 1);
    cr_assert_eq(s.n_top, 4);
    cr_assert_eq(s.top_ids[0], 1);
    cr_assert_eq(s.top_ids[1], 3);
    cr_assert_eq(s.top_ids[2], 4);
    double z = 0;
    for (int i = 0; i < 8; i++) z += exp(l[i]);
    cr_assert_float_eq(s.logprob, 2.0 - log(z), 1e-5);
    for (int i = 1; i < 4; i++) cr_assert(s.top_logprobs[i] <= s.top_logprobs[i - 1]);
}

Test(sampler, validate_names_the_bad_field)
{
    struct moe_sampling p;
    moe_sampling_defaults(&p);
    cr_assert_eq(moe_sampling_validate(&p), MOE_OK);
    p.top_p = 0.0f;
    cr_assert_eq(moe_sampling_validate(&p), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "top_p"));
    moe_sampling_defaults(&p);
    p.temperature = NAN;
    cr_assert_eq(moe_sampling_validate(&p), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "temperature"));
    moe_sampling_defaults(&p);
    p.n_logprobs = 21;
    cr_assert_eq(moe_sampling_validate(&p), MOE_ERR_INVALID_ARG);
}

/* logit_bias (OpenAI): added to the raw logits first; greedy follows it,
 * the chosen token's logprob includes it, and the argmax shortcut is off. */
Test(sampler, logit_bias_moves_greedy_and_logprobs)
{
    float l[4] = {1.0f, 3.0f, 2.0f, 0.0f};
    struct moe_sampling p;
    moe_sampling_defaults(&p);
    cr_assert(moe_sampling_is_argmax(&p));
    p.n_bias = 2;
    p.bias_ids[0] = 1, p.bias[0] = -100.0f; /* the argmax pushed out */
    p.bias_ids[1] = 3, p.bias[1] = 2.5f;    /* 0 + 2.5 beats 2 */
    cr_assert_not(moe_sampling_is_argmax(&p));
    cr_assert_eq(moe_sampling_validate(&p), MOE_OK);
    struct moe_rng r;
    moe_rng_seed(&r, 1);
    struct moe_sample s;
    moe_sampler_sample(&p, &r, l, 4, NULL, 0, 0, &sc, &s);
    cr_assert_eq(s.token, 3);
    const double z = exp(1.0) + exp(3.0 - 100.0) + exp(2.0) + exp(2.5);
    cr_assert_float_eq(s.logprob, 2.5 - log(z), 1e-5);
    p.bias[1] = 101.0f;
    cr_assert_neq(moe_sampling_validate(&p), MOE_OK);
    cr_assert(strstr(moe_last_error(), "logit_bias"), "%s", moe_last_error());
    p.bias[1] = 1.0f;
    p.bias_ids[1] = -3;
    cr_assert_neq(moe_sampling_validate(&p), MOE_OK);
}

/* moe_sampler_accept, the modified rejection sampling of speculative
 * decoding: whatever the draft's distribution q, the emitted token is
 * distributed as the target's p (moe_sampler_probs), and x is accepted
 * with probability sum_x min(p(x), q(x)).  200,000 draws per setting over
 * 6 tokens, chi-square against p at p = 0.001 (critical value for 5
 * degrees of freedom: 20.52).  A residual drawn from p instead of
 * norm(max(0, p - q)) puts too much on the tokens q favours and fails. */
Test(sampler, rejection_sampling_keeps_the_targets_distribution)
{
    enum { V = 6, N = 200000 };
    const float base[V] = {1.2f, 0.3f, -0.5f, 2.0f, 0.9f, -1.5f};
    const float qs[3][V] = {{0.05, 0.05, 0.6, 0.1, 0.1, 0.1},  /* far from p */
                             {0.1, 0.05, 0.02, 0.6, 0.2, 0.03}, /* close to p */
                             {0, 0, 0, 0, 1, 0}};               /* one-hot */
    struct moe_sampling sets[3];
    for (int s = 0; s < 3; s++) moe_sampling_defaults(&sets[s]);
    sets[0].temperature = 1.0f;
    sets[1].temperature = 0.8f;
    sets[1].top_k = 4;
    sets[2].temperature = 1.3f;
    sets[2].top_p = 0.9f;
    for (int s = 0; s < 3; s++)
        for (int qi = 0; qi < 3; qi++) {
            float logits[V];
            double p[V], expect_acc = 0;
            memcpy(logits, base, sizeof logits);
            moe_sampler_probs(&sets[s], logits, V, NULL, 0, 0, &sc, p);
            for (int i = 0; i < V; i++) expect_acc += fmin(p[i], (double)qs[qi][i]);
            struct moe_rng rng, draft;
            moe_rng_seed(&rng, 11 + (uint64_t)s);
            moe_rng_seed(&draft, 99 + (uint64_t)qi);
            int counts[V] = {0}, accepted = 0;
            for (int n = 0; n < N; n++) {
                double u = moe_rng_uniform(&draft), c = 0;
                int32_t x = V - 1;
                for (int i = 0; i < V; i++)
                    if (u < (c += qs[qi][i])) {
                        x = i;
                        break;
                    }
                struct moe_sample out;
                memcpy(logits, base, sizeof logits);
                bool acc = moe_sampler_accept(&sets[s], &rng, logits, V, NULL, 0, 0, &sc, qs[qi], x,
                                              &out);
                cr_assert(out.token >= 0 && out.token < V);
                cr_assert(!acc || out.token == x);
                accepted += acc;
                counts[out.token]++;
            }
            double chi = 0;
            int df = -1;
            for (int i = 0; i < V; i++) {
                if (p[i] == 0) {
                    cr_assert_eq(counts[i], 0, "setting %d, q %d: token %d has p = 0", s, qi, i);
                    continue;
                }
                chi += (counts[i] - N * p[i]) * (counts[i] - N * p[i]) / (N * p[i]);
                df++;
            }
            static const double crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52}; /* p = 0.001 */
            cr_assert(chi < crit[df], "setting %d, q %d: chi-square %.1f, %d degrees of freedom", s,
                      qi, chi, df);
            double rate = (double)accepted / N;
            cr_assert(fabs(rate - expect_acc) < 0.01, "setting %d, q %d: acceptance %.4f, expected %.4f",
                      s, qi, rate, expect_acc);
        }
}
