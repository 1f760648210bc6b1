/* test_stats_skew.c - synthetic router skew (runtime/model/synth_skew.h) and its
 * recovery by the statistics.
 *
 * "Recover within sampling error": every token id of the vocabulary is run
 * once, so the N = V top-1 choices of a layer are N independent draws from
 * the target p (the Gumbel-max construction, docs/stats-format.md).  The
 * recorded top-1 counts must then pass Pearson's chi-square goodness-of-fit
 * test against N*p at the 0.001 level (E-1 degrees of freedom), every
 * expert's share must lie within 4 standard errors sqrt(p(1-p)/N) of p, and
 * the Zipf exponent fitted to the counts must be within 0.15 of the one
 * asked for. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "router/stats.h"
#include "runtime/engine/runner.h"
#include "runtime/stats/stats_analyze.h"
#include "runtime/model/synth_skew.h"
#include "tests/testutil.h"

static const char *cfg_json =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 128,"
    " \"moe_intermediate_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 32, \"vocab_size\": 2048,"
    " \"max_position_embeddings\": 512, \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-06,"
    " \"num_experts\": 16, \"num_experts_per_tok\": 2, \"norm_topk_prob\": true,"
    " \"tie_word_embeddings\": false, \"initializer_range\": 0.1}";

static struct moe_config load_cfg(void) { return tu_config_json(cfg_json); }

Test(skew, spec_parsing)
{
    struct moe_router_skew sk;
    cr_assert_eq(moe_router_skew_parse("zipf:1.2", &sk), MOE_OK);
    cr_assert(sk.kind == MOE_SKEW_ZIPF && fabs(sk.s - 1.2) < 1e-12);
    cr_assert_eq(moe_router_skew_parse("hot:2:0.6", &sk), MOE_OK);
    cr_assert(sk.kind == MOE_SKEW_HOT && sk.hot == 2 && fabs(sk.frac - 0.6) < 1e-12);
    cr_assert_eq(moe_router_skew_parse("none", &sk), MOE_OK);
    const char *bad[] = {"zipf:", "zipf:-1", "zipf:1x", "hot:0:0.5", "hot:2:1", "hot:2", "uniform", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(moe_router_skew_parse(bad[i], &sk), MOE_ERR_INVALID_ARG, "'%s'", bad[i]);
}

Test(skew, target_probabilities)
{
    struct moe_config c = load_cfg();
    struct moe_router_skew sk;
    cr_assert_eq(moe_router_skew_parse("zipf:1.2", &sk), MOE_OK);
    double p[16], q[16];
    cr_assert_eq(moe_router_skew_probs(&sk, &c, 7, 0, p), MOE_OK);
    cr_assert_eq(moe_router_skew_probs(&sk, &c, 7, 1, q), MOE_OK);
    double sp = 0;
    for (int e = 0; e < 16; e++) sp += p[e];
    cr_assert_float_eq(sp, 1.0, 1e-12);
    /* the two most likely experts differ by (2/1)^s */
    double mx = 0, second = 0;
    for (int e = 0; e < 16; e++) mx = fmax(mx, p[e]);
    for (int e = 0; e < 16; e++)
        if (p[e] < mx) second = fmax(second, p[e]);
    cr_assert_float_eq(mx / second, pow(2.0, 1.2), 1e-9);
    /* the two layers use different code blocks and different hot experts */
    int hp = 0, hq = 0;
    for (int e = 1; e < 16; e++) {
        if (p[e] > p[hp]) hp = e;
        if (q[e] > q[hq]) hq = e;
    }
    cr_assert_neq(hp, hq, "seeded permutations per block (this seed gives different hot experts)");
    cr_assert_eq(moe_router_skew_parse("hot:3:0.75", &sk), MOE_OK);
    cr_assert_eq(moe_router_skew_probs(&sk, &c, 7, 0, p), MOE_OK);
    int n_hot = 0;
    for (int e = 0; e < 16; e++) {
        n_hot += fabs(p[e] - 0.25) < 1e-12;
        cr_assert(fabs(p[e] - 0.25) < 1e-12 || fabs(p[e] - 0.25 / 13) < 1e-12);
    }
    cr_assert_eq(n_hot, 3);
    /* E > D/2 cannot be skewed */
    c.n_experts = 128;
    cr_assert_eq(moe_router_skew_probs(&sk, &c, 7, 0, p), MOE_ERR_UNSUPPORTED);
}

/* Wilson-Hilferty approximation of the chi-square quantile. */
static double chi2_quantile(int k, double z)
{
    double a = 2.0 / (9.0 * k);
    return k * pow(1 - a + z * sqrt(a), 3);
}

static void check_recovery(const char *spec, double zipf_s)
{
    struct moe_config c = load_cfg();
    struct moe_router_skew sk;
    cr_assert_eq(moe_router_skew_parse(spec, &sk), MOE_OK);
    const uint64_t seed = 11;
    struct moe_model m;
    cr_assert_eq(moe_model_synthetic_skew(&m, &c, MOE_DTYPE_F32, seed, &sk), MOE_OK, "%s",
                 moe_last_error());
    struct moe_backend be;
    cr_assert_eq(moe_backend_cpu_init(&be, 0), MOE_OK);
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = 512, .max_seqs = 4, .max_logits = 4,
                                .block_size = 16, .n_blocks = 64};
    cr_assert_eq(moe_runner_init(&r, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    struct moe_stats st;
    cr_assert_eq(moe_stats_init(&st, &c, NULL), MOE_OK);
    r.fw.stats = &st;
    const int V = c.vocab, E = c.n_experts, N = V;
    int32_t *tok = malloc((size_t)V * sizeof *tok);
    for (int v = 0; v < V; v++) tok[v] = (int32_t)((v * 1237) % V); /* a permutation */
    struct moe_seq seqs[4] = {{0}};
    for (int step = 0; step < 4; step++) { /* 4 steps x 4 sequences x 128 tokens */
        struct moe_chunk ch[4];
        for (int q = 0; q < 4; q++)
            ch[q] = (struct moe_chunk){&seqs[q], tok + (step * 4 + q) * 128, 128, false, false, 0};
        cr_assert_eq(moe_runner_step(&r, ch, 4, NULL, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
        for (int q = 0; q < 4; q++) moe_seq_reset(&r, &seqs[q]);
    }
    double crit = chi2_quantile(E - 1, 3.090); /* 0.999 */
    for (int j = 0; j < st.Lm; j++) {
        double p[64], chi2 = 0, counts[64], worst = 0;
        cr_assert_eq(moe_router_skew_probs(&sk, &c, seed, j, p), MOE_OK);
        int64_t pairs = 0;
        for (int e = 0; e < E; e++) {
            double o_ = (double)st.top1[j * E + e], ex = N * p[e];
            chi2 += (o_ - ex) * (o_ - ex) / ex;
            counts[e] = o_;
            worst = fmax(worst, fabs(o_ / N - p[e]) / sqrt(p[e] * (1 - p[e]) / N));
            pairs += st.prefill[j * E + e];
        }
        cr_assert_eq(pairs, (int64_t)N * c.top_k);
        cr_assert_lt(chi2, crit, "%s layer %d: chi-square %.2f >= %.2f", spec, j, chi2, crit);
        cr_assert_lt(worst, 4.0, "%s layer %d: an expert is %.2f standard errors off", spec, j, worst);
        double s = moe_sdata_zipf_fit(counts, E);
        if (zipf_s > 0)
            cr_assert(fabs(s - zipf_s) < 0.15, "%s layer %d: fitted exponent %.3f", spec, j, s);
        cr_log_info("%s layer %d: chi-square %.2f (crit %.2f), worst %.2f se, zipf fit %.3f", spec,
                    j, chi2, crit, worst, s);
    }
    free(tok);
    for (int q = 0; q < 4; q++) moe_seq_free(&r, &seqs[q]);
    moe_stats_free(&st);
    moe_runner_free(&r);
    moe_backend_free(&be);
    moe_model_free(&m);
}

Test(skew, zipf_skew_is_recovered_within_sampling_error, .timeout = 600)
{
    check_recovery("zipf:1.2", 1.2);
}

Test(skew, hot_experts_are_recovered_within_sampling_error, .timeout = 600)
{
    check_recovery("hot:2:0.5", 0);
}
