/* test_spec_sampling.c - speculative decoding keeps a sampled request's
 * output distribution the target's.  On a synthetic model with a vocabulary
 * of 8, 20,000 seeded requests per setting (temperature, top-k, top-p,
 * min-p, a repetition penalty) each emit three tokens with n-gram
 * speculation: the second step verifies a drafted token, which is accepted
 * or rejected.  The empirical distribution of the three tokens (t0, t1, t2)
 * is compared, by a chi-square test at p = 0.001, with the target's own:
 * P(t0) P(t1 | t0) P(t2 | t0, t1), each factor the sampler's distribution
 * (moe_sampler_probs) over logits the runner computes for that prefix
 * without speculation.  An acceptance rule that keeps a wrong draft, or
 * accepts x with probability p(x) and then draws from p instead of
 * norm(max(0, p - q)), shifts mass onto the drafted tokens and fails. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine.h"
#include "tests/testutil.h"

#define V 8
#define N_REQ 20000
#define N_PROMPT 10

static struct moe_backend be;
static void setup(void) { cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK); }
static void teardown(void) { moe_backend_free(&be); }
TestSuite(spec_sampling, .init = setup, .fini = teardown);

static void small_model(struct moe_model *m, uint64_t seed)
{
    tu_synthetic_model(m,
                       "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 32, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 8, "
                       "\"max_position_embeddings\": 64, \"num_experts\": 4, "
                       "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, "
                       "\"norm_topk_prob\": true, \"initializer_range\": 0.3}",
                       seed);
}

/* The prompt: token 1, then the model's greedy continuation, which on
 * this model falls into a cycle, so the n-gram proposer drafts what the
 * model tends to say (set by make_prompt). */
static int32_t prompt[N_PROMPT];

static void make_prompt(const struct moe_model *m)
{
    struct moe_runner r;
    struct moe_runner_opts ro = {.max_tokens = 16, .max_seqs = 1, .max_logits = 1, .block_size = 4,
                                 .n_blocks = 8};
    cr_assert_eq(moe_runner_init(&r, m, &be, &ro), MOE_OK, "%s", moe_last_error());
    struct moe_seq seq = {0};
    prompt[0] = 1;
    cr_assert_eq(moe_runner_greedy(&r, &seq, prompt, 1, N_PROMPT - 1, 0, prompt + 1), MOE_OK, "%s",
                 moe_last_error());
    moe_seq_free(&r, &seq);
    moe_runner_free(&r);
}

/* The sampler's distribution after the prompt and the n tokens of prefix. */
static void target_probs(struct moe_runner *r, const struct moe_sampling *sp, const int32_t *prefix,
                         int n, struct moe_sampler_scratch *sc, double *probs)
{
    int32_t hist[N_PROMPT + 2];
    memcpy(hist, prompt, sizeof prompt);
    if (n) memcpy(hist + N_PROMPT, prefix, (size_t)n * sizeof *prefix);
    float logits[V];
    struct moe_seq seq = {0};
    struct moe_chunk c = {&seq, hist, N_PROMPT + n, false, false, 0};
    cr_assert_eq(moe_runner_step(r, &c, 1, logits, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    moe_seq_free(r, &seq);
    moe_sampler_probs(sp, logits, V, hist, N_PROMPT, N_PROMPT + n, sc, probs);
}

/* P(t0, t1, t2) of the target alone, (V, V, V). */
static void joint_probs(const struct moe_model *m, const struct moe_sampling *sp, double *joint)
{
    struct moe_runner r;
    struct moe_runner_opts ro = {.max_tokens = 16, .max_seqs = 1, .max_logits = 1, .block_size = 4,
                                 .n_blocks = 8};
    cr_assert_eq(moe_runner_init(&r, m, &be, &ro), MOE_OK, "%s", moe_last_error());
    struct moe_sampler_scratch sc;
    cr_assert_eq(moe_sampler_scratch_init(&sc, V), MOE_OK);
    double p0[V], p1[V], p2[V];
    target_probs(&r, sp, NULL, 0, &sc, p0);
    for (int a = 0; a < V; a++) {
        int32_t pre[2] = {a, 0};
        target_probs(&r, sp, pre, 1, &sc, p1);
        for (int b = 0; b < V; b++) {
            pre[1] = b;
            if (p0[a] * p1[b] == 0) {
                for (int c = 0; c < V; c++) joint[(a * V + b) * V + c] = 0;
                continue;
            }
            target_probs(&r, sp, pre, 2, &sc, p2);
            for (int c = 0; c < V; c++) joint[(a * V + b) * V + c] = p0[a] * p1[b] * p2[c];
        }
    }
    moe_sampler_scratch_free(&sc);
    moe_runner_free(&r);
}

/* Pearson's statistic over the cells, those expected below 5 pooled into
 * one, against the upper 0.001 point of chi-square (Wilson-Hilferty). */
static void chi_square(const double *joint, const int *counts, int n, const char *what)
{
    double stat = 0, pool_e = 0;
    int pool_o = 0, df = -1;
    for (int i = 0; i < V * V * V; i++) {
        double e = joint[i] * n;
        if (e < 5) {
            pool_e += e;
            pool_o += counts[i];
            cr_assert(joint[i] > 0 || counts[i] == 0, "%s: cell %d drawn, probability 0", what, i);
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        df++;
    }
    if (pool_e > 0) {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        df++;
    }
    cr_assert(df >= 3, "%s: %d degrees of freedom", what, df);
    double h = 2.0 / (9.0 * df), crit = df * pow(1 - h + 3.090232 * sqrt(h), 3);
    cr_log_info("%s: chi-square %.1f, %d degrees of freedom, p = 0.001 at %.1f", what, stat, df, crit);
    cr_assert(stat < crit, "%s: chi-square %.1f with %d degrees of freedom exceeds %.1f (p < 0.001)",
              what, stat, df, crit);
}

/* Serves N_REQ seeded requests of three tokens with n-gram speculation
 * (max_tokens 3 leaves one token to draft in the second step). */
static struct moe_engine_counters draw(const struct moe_model *m, const struct moe_spec_opts *spec,
                                       const struct moe_sampling *sp, int *counts)
{
    struct moe_engine e;
    struct moe_engine_opts o = {.max_batch_tokens = 256, .max_seqs = 64, .block_size = 4,
                                .n_blocks = 64 * 4, .prefix_cache = true, .spec = *spec};
    cr_assert_eq(moe_engine_init(&e, m, &be, &o), MOE_OK, "%s", moe_last_error());
    static struct moe_request *req[N_REQ];
    int submitted = 0, done = 0, rows;
    while (done < N_REQ) {
        while (submitted < N_REQ && e.n_running + e.n_waiting < 64) {
            struct moe_request_params p = {.max_tokens = 3, .sampling = *sp};
            p.sampling.seed = 7919 * (uint64_t)submitted + 1;
            cr_assert_eq(moe_engine_submit(&e, prompt, N_PROMPT, &p, NULL, &req[submitted]), MOE_OK,
                         "%s", moe_last_error());
            submitted++;
        }
        cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK, "%s", moe_last_error());
        for (; done < submitted && req[done]->state == MOE_REQ_FINISHED; done++) {
            int n;
            const int32_t *out = moe_request_output(req[done], &n);
            cr_assert_eq(n, 3);
            counts[(out[0] * V + out[1]) * V + out[2]]++;
            moe_engine_release(&e, req[done]);
        }
    }
    struct moe_engine_counters c = e.n;
    moe_engine_free(&e);
    return c;
}

static void check_setting(const struct moe_model *m, const struct moe_spec_opts *spec,
                          struct moe_sampling sp, const char *what)
{
    static double joint[V * V * V];
    static int counts[V * V * V];
    memset(counts, 0, sizeof counts);
    joint_probs(m, &sp, joint);
    struct moe_engine_counters c = draw(m, spec, &sp, counts);
    cr_assert(c.spec_draft_tokens >= N_REQ / 2, "%s: %llu tokens drafted", what,
              (unsigned long long)c.spec_draft_tokens);
    cr_assert(c.spec_accepted >= 500 && c.spec_accepted < c.spec_draft_tokens,
              "%s: %llu of %llu drafts accepted: the rule is not exercised both ways", what,
              (unsigned long long)c.spec_accepted, (unsigned long long)c.spec_draft_tokens);
    cr_log_info("%s: %llu of %llu drafts accepted", what, (unsigned long long)c.spec_accepted,
                (unsigned long long)c.spec_draft_tokens);
    chi_square(joint, counts, N_REQ, what);
}

/* The settings, each checked with the proposer spec. */
static void check_settings(const struct moe_model *m, const struct moe_spec_opts *spec, const char *name)
{
    struct moe_sampling sp;
    char what[128];
    moe_sampling_defaults(&sp);
    sp.temperature = 1.0f;
    snprintf(what, sizeof what, "%s, temperature 1", name);
    check_setting(m, spec, sp, what);
    sp.temperature = 0.7f;
    sp.top_k = 4;
    snprintf(what, sizeof what, "%s, temperature 0.7, top-k 4", name);
    check_setting(m, spec, sp, what);
    sp.temperature = 1.3f;
    sp.top_k = 0;
    sp.top_p = 0.8f;
    snprintf(what, sizeof what, "%s, temperature 1.3, top-p 0.8", name);
    check_setting(m, spec, sp, what);
    sp.temperature = 1.0f;
    sp.top_p = 1.0f;
    sp.min_p = 0.1f;
    sp.repetition_penalty = 1.5f;
    snprintf(what, sizeof what, "%s, min-p 0.1, repetition penalty 1.5", name);
    check_setting(m, spec, sp, what);
}

Test(spec_sampling, output_distribution_is_the_targets, .timeout = 600)
{
    struct moe_model m;
    small_model(&m, 3);
    make_prompt(&m);
    check_settings(&m, &(struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .tokens = 4}, "n-gram");
    moe_model_free(&m);
}

/* A draft model (the same shape, other weights): its argmax (q one-hot,
 * accepted when the target's draw equals it), then drafts drawn from its
 * own distribution q and accepted by rejection sampling. */
Test(spec_sampling, draft_distribution_is_the_targets, .timeout = 600)
{
    struct moe_model m, d;
    small_model(&m, 3);
    small_model(&d, 4);
    make_prompt(&m);
    struct moe_spec_opts spec = {.kind = MOE_SPEC_DRAFT, .tokens = 4, .draft = &d};
    check_settings(&m, &spec, "draft argmax");
    spec.sample_drafts = true;
    check_settings(&m, &spec, "sampled drafts");
    moe_model_free(&d);
    moe_model_free(&m);
}
