/* test_ppl.c - perplexity and divergence (runtime/engine/ppl.c, `moerun ppl`)
 * against transformers: per-token NLL, argmax and KL from
 * tests/fixtures/ppl/reference.json (tests/reference/make_ppl_fixtures.py),
 * for the trained demo model at its top-4 and with --moe-top-k 2, and for a
 * fixture whose tokenizer puts BOS before each window. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "runtime/cli/cli_common.h"
#include "runtime/engine/ppl.h"
#include "runtime/text/tokenizer.h"
#include "tests/testutil.h"

#define PPL_DIR FIXTURE_DIR "/ppl"

static json_t *ref_case(const char *name)
{
    static json_t *root;
    if (!root) {
        json_error_t e;
        root = json_load_file(PPL_DIR "/reference.json", 0, &e);
        cr_assert(root, "reference.json: %s", e.text);
    }
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c)
        if (!strcmp(json_string_value(json_object_get(c, "name")), name)) return c;
    cr_assert_fail("no case %s", name);
    return NULL;
}

static double num_at(json_t *c, const char *key, size_t i)
{
    return json_number_value(json_array_get(json_object_get(c, key), i));
}

/* A model with its tokenizer, the case's plan, a runner and a backend. */
struct setup {
    struct moe_model m;
    struct moe_tokenizer tok;
    struct moe_backend be;
    struct moe_runner r;
    struct moe_ppl_plan plan;
};

static void setup_case_plan(struct setup *s, json_t *c, const char *backend, int max_tokens,
                            enum moe_weight_quant quant, const struct moe_backend_opts *plan)
{
    memset(s, 0, sizeof *s);
    char dir[1024], *text;
    size_t len, n_body;
    snprintf(dir, sizeof dir, "%s/%s", MOERUN_SOURCE_DIR, json_string_value(json_object_get(c, "model")));
    FILE *f = fopen(PPL_DIR "/stories.txt", "rb");
    cr_assert(f);
    text = moe_cli_read_all(f, &len);
    fclose(f);
    int32_t *body, *prefix;
    int n_prefix;
    cr_assert_eq(moe_model_load(&s->m, dir), MOE_OK, "%s", moe_last_error());
    if (json_is_true(json_object_get(c, "top_k_override")))
        cr_assert_eq(moe_model_set_top_k(&s->m, (int)json_integer_value(json_object_get(c, "top_k"))), MOE_OK);
    cr_assert_eq(moe_tokenizer_load(&s->tok, dir), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_tokenizer_encode(&s->tok, text, len, false, &body, &n_body, NULL), MOE_OK);
    cr_assert_eq(moe_ppl_text_prefix(&s->tok, &prefix, &n_prefix), MOE_OK);
    json_t *want_prefix = json_object_get(c, "prefix");
    cr_assert_eq((size_t)n_prefix, json_array_size(want_prefix));
    for (int i = 0; i < n_prefix; i++)
        cr_assert_eq(prefix[i], json_integer_value(json_array_get(want_prefix, (size_t)i)));
    cr_assert_eq((json_int_t)n_body, json_integer_value(json_object_get(c, "body_tokens")));
    int ctx = (int)json_integer_value(json_object_get(c, "ctx"));
    int from = (int)json_integer_value(json_object_get(c, "score_from"));
    int windows = (int)json_integer_value(json_object_get(c, "windows"));
    cr_assert_eq(moe_ppl_plan_init(&s->plan, prefix, n_prefix, body, (int64_t)n_body, ctx, from,
                                   windows), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(s->plan.n_windows, windows);
    cr_assert_eq(s->plan.n_scored, json_integer_value(json_object_get(c, "scored")));
    struct moe_runner_opts o;
    moe_ppl_runner_opts(&s->plan, max_tokens, 64, 16, MOE_DTYPE_F32, &o);
    struct moe_backend_opts bo;
    moe_cli_backend_opts(&bo, 0);
    bo.quant = quant;
    if (plan) {
        bo.expert_quant = plan->expert_quant;
        bo.expert_quant_layers = plan->expert_quant_layers;
        bo.expert_quant_e = plan->expert_quant_e;
    }
    cr_assert_eq(moe_backend_init(&s->be, backend, &bo), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_runner_init(&s->r, &s->m, &s->be, &o), MOE_OK, "%s", moe_last_error());
    free(body);
    free(prefix);
    free(text);
}

static void setup_case_quant(struct setup *s, json_t *c, const char *backend, int max_tokens,
                             enum moe_weight_quant quant)
{
    setup_case_plan(s, c, backend, max_tokens, quant, NULL);
}

static void setup_case(struct setup *s, json_t *c, const char *backend, int max_tokens)
{
    setup_case_quant(s, c, backend, max_tokens, MOE_QUANT_NONE);
}

static void teardown_case(struct setup *s)
{
    moe_ppl_plan_free(&s->plan);
    moe_runner_free(&s->r);
    moe_backend_free(&s->be);
    moe_tokenizer_free(&s->tok);
    moe_model_free(&s->m);
}

/* Every token's target and NLL as transformers has them; the argmax too,
 * except where transformers' own top two are closer than 1e-4. */
static void expect_matches(json_t *c, const struct moe_ppl_result *res)
{
    const char *name = json_string_value(json_object_get(c, "name"));
    double worst = 0, sum = 0;
    int64_t worst_i = 0;
    for (int64_t i = 0; i < res->n; i++) {
        cr_assert_eq(res->target[i], num_at(c, "targets", (size_t)i), "%s token %lld", name, (long long)i);
        double ref = num_at(c, "nll", (size_t)i), err = fabs(res->nll[i] - ref) / (1e-4 + 1e-4 * fabs(ref));
        if (err > worst) {
            worst = err;
            worst_i = i;
        }
        sum += res->nll[i];
        if (num_at(c, "top2_margin", (size_t)i) > 1e-4)
            cr_expect_eq(res->argmax[i], num_at(c, "argmax", (size_t)i), "%s token %lld argmax", name,
                         (long long)i);
    }
    cr_expect_leq(worst, 1.0, "%s: token %lld NLL %.7f, transformers %.7f", name, (long long)worst_i,
                  res->nll[worst_i], num_at(c, "nll", (size_t)worst_i));
    double mean = sum / (double)res->n, want = json_number_value(json_object_get(c, "mean_nll"));
    cr_expect(fabs(mean - want) <= 1e-5 * (1 + want), "%s: mean NLL %.8f, transformers %.8f", name, mean, want);
}

Test(ppl, nll_and_argmax_match_transformers)
{
    const char *cases[] = {"demo_k4", "demo_k2", "mixtral_bos"};
    for (int k = 0; k < 3; k++) {
        json_t *c = ref_case(cases[k]);
        struct setup s;
        setup_case(&s, c, "cpu", 512);
        struct moe_ppl_result res;
        cr_assert_eq(moe_ppl_run(&s.r, &s.plan, NULL, NULL, &res, NULL, NULL), MOE_OK, "%s", moe_last_error());
        expect_matches(c, &res);
        struct moe_ppl_summary sum;
        cr_assert_eq(moe_ppl_summarize(&res, &sum), MOE_OK);
        double want = json_number_value(json_object_get(c, "ppl"));
        cr_expect(fabs(sum.ppl - want) <= 1e-5 * want, "%s: ppl %.6f, transformers %.6f", cases[k], sum.ppl, want);
        cr_expect(!sum.has_base);
        moe_ppl_result_free(&res);
        teardown_case(&s);
    }
}

/* The reference backend, and windows cut into pieces (max_tokens below the
 * window), score the same. */
Test(ppl, reference_backend_and_window_pieces_match_transformers)
{
    json_t *c = ref_case("mixtral_bos");
    struct setup s;
    setup_case(&s, c, "cpu-ref", 16); /* 40-token windows in pieces of 16 */
    struct moe_ppl_result res;
    cr_assert_eq(moe_ppl_run(&s.r, &s.plan, NULL, NULL, &res, NULL, NULL), MOE_OK, "%s", moe_last_error());
    expect_matches(c, &res);
    moe_ppl_result_free(&res);
    teardown_case(&s);
}

/* Runs case `name` saving its log-probabilities as a base; *save, *argmax
 * and *nll are new memory. */
static void run_base(const char *name, uint16_t **save, int32_t **argmax, float **nll, int64_t *n)
{
    struct setup s;
    setup_case(&s, ref_case(name), "cpu", 512);
    const size_t V = (size_t)s.m.cfg.vocab;
    *n = s.plan.n_scored;
    *save = malloc((size_t)*n * V * 2);
    *argmax = malloc((size_t)*n * sizeof **argmax);
    *nll = malloc((size_t)*n * sizeof **nll);
    struct moe_ppl_result res;
    cr_assert_eq(moe_ppl_run(&s.r, &s.plan, NULL, *save, &res, NULL, NULL), MOE_OK);
    for (int64_t i = 0; i < *n; i++) {
        (*argmax)[i] = res.argmax[i];
        (*nll)[i] = (float)res.nll[i];
    }
    moe_ppl_result_free(&res);
    teardown_case(&s);
}

/* --moe-top-k 2 against the top-4 run: per-token KL as transformers has it
 * (the base goes through f16, so each KL is within 1e-5 + 1%), and the same
 * top-1 agreement. */
Test(ppl, kl_against_base_matches_transformers)
{
    uint16_t *lp;
    int32_t *am;
    float *nll;
    int64_t n;
    run_base("demo_k4", &lp, &am, &nll, &n);
    json_t *c = ref_case("demo_k2");
    struct setup s;
    setup_case(&s, c, "cpu", 512);
    struct moe_ppl_base base = {lp, nll, am, n, s.m.cfg.vocab};
    struct moe_ppl_result res;
    cr_assert_eq(moe_ppl_run(&s.r, &s.plan, &base, NULL, &res, NULL, NULL), MOE_OK, "%s", moe_last_error());
    expect_matches(c, &res);
    double worst = 0, sum_kl = 0;
    int64_t wi = 0, same = 0, want_same = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = num_at(c, "kl", (size_t)i), err = fabs(res.kl[i] - ref) / (1e-5 + 1e-2 * ref);
        if (err > worst) {
            worst = err;
            wi = i;
        }
        sum_kl += res.kl[i];
        same += res.same_top1[i];
        want_same += (int64_t)num_at(c, "same_top1", (size_t)i);
    }
    cr_expect_leq(worst, 1.0, "token %lld KL %.8f, transformers %.8f", (long long)wi, res.kl[wi],
                  num_at(c, "kl", (size_t)wi));
    double want = json_number_value(json_object_get(c, "mean_kl"));
    cr_expect(fabs(sum_kl / (double)n - want) <= 0.01 * want, "mean KL %.8f, transformers %.8f",
              sum_kl / (double)n, want);
    cr_expect_eq(same, want_same);
    struct moe_ppl_summary sm;
    cr_assert_eq(moe_ppl_summarize(&res, &sm), MOE_OK);
    cr_expect(sm.has_base && sm.kl_max >= sm.kl_p99 && sm.kl_p99 >= sm.kl_median && sm.kl_median >= 0);
    cr_expect(fabs(sm.base_ppl - json_number_value(json_object_get(ref_case("demo_k4"), "ppl"))) < 1e-4);
    moe_ppl_result_free(&res);
    teardown_case(&s);
    free(lp);
    free(am);
    free(nll);
}

/* --quantize q8_0 on the trained demo model: the output distribution
 * barely moves (KL 3e-6 when this was written; the bound leaves 30x). */
Test(ppl, q8_0_weights_stay_close_to_bf16)
{
    uint16_t *lp;
    int32_t *am;
    float *nll;
    int64_t n;
    run_base("demo_k4", &lp, &am, &nll, &n);
    struct setup s;
    setup_case_quant(&s, ref_case("demo_k4"), "cpu", 512, MOE_QUANT_Q8_0);
    cr_assert_eq(s.m.layers[0].experts.dtype, MOE_DTYPE_Q8_0);
    struct moe_ppl_base base = {lp, nll, am, n, s.m.cfg.vocab};
    struct moe_ppl_result res;
    struct moe_ppl_summary sm;
    cr_assert_eq(moe_ppl_run(&s.r, &s.plan, &base, NULL, &res, NULL, NULL), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_ppl_summarize(&res, &sm), MOE_OK);
    cr_expect(sm.mean_kl > 0 && sm.mean_kl < 1e-4, "mean KL %g", sm.mean_kl);
    cr_expect(fabs(sm.mean_dnll) < 1e-3, "ln(PPL/base) %g", sm.mean_dnll);
    moe_ppl_result_free(&res);
    teardown_case(&s);
    free(lp);
    free(am);
    free(nll);
}

/* The mean KL of a run of the demo model against base (its weights' bytes
 * into *bytes), prepared with quant and the per-expert plan (or NULL). */
static double demo_kl(const struct moe_ppl_base *base, enum moe_weight_quant quant,
                      const struct moe_backend_opts *plan, int64_t *bytes)
{
    struct setup s;
    setup_case_plan(&s, ref_case("demo_k4"), "cpu", 512, quant, plan);
    struct moe_model_sizes z;
    moe_model_sizes(&s.m, &z);
    *bytes = z.bytes_total;
    struct moe_ppl_result res;
    struct moe_ppl_summary sm;
    cr_assert_eq(moe_ppl_run(&s.r, &s.plan, base, NULL, &res, NULL, NULL), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_ppl_summarize(&res, &sm), MOE_OK);
    moe_ppl_result_free(&res);
    teardown_case(&s);
    return sm.mean_kl;
}

/* --quantize q4 on the trained demo model moves the output distribution
 * more than q8_0 but little (KL 4e-5 when this was written, the bound
 * leaves 25x); keeping the experts that took half of each layer's routed
 * pairs on other prompts (models/demo-prompts.jsonl) at q8_0 lowers that
 * KL for less than 1.5 times the bytes (docs/quality.md). */
Test(ppl, q4_weights_and_an_expert_plan)
{
    uint16_t *lp;
    int32_t *am;
    float *nll;
    int64_t n, b8, b4, bmix;
    run_base("demo_k4", &lp, &am, &nll, &n);
    struct moe_ppl_base base = {lp, nll, am, n, 512};
    const double kl8 = demo_kl(&base, MOE_QUANT_Q8_0, NULL, &b8), kl4 = demo_kl(&base, MOE_QUANT_Q4, NULL, &b4);
    char dir[] = "/tmp/moerun-ppl-plan-XXXXXX", stats[256], cmd[1024], out[4096];
    cr_assert(mkdtemp(dir));
    snprintf(stats, sizeof stats, "%s/stats.json", dir);
    snprintf(cmd, sizeof cmd, "%s batch %s/models/demo-moe %s/models/demo-prompts.jsonl -o %s/out.jsonl "
             "--stats-out %s 2>&1 >/dev/null", MOERUN_BINARY, MOERUN_SOURCE_DIR, MOERUN_SOURCE_DIR, dir, stats);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    struct moe_backend_opts plan;
    uint8_t *buf;
    moe_backend_opts_defaults(&plan);
    cr_assert_eq(moe_cli_expert_plan(&plan, stats, 0.5, MOE_QUANT_Q4, &buf), MOE_OK, "%s", moe_last_error());
    const double klmix = demo_kl(&base, MOE_QUANT_Q4, &plan, &bmix);
    cr_log_info("mean KL: q8_0 %.3g (%lld bytes), q4 %.3g (%lld), q4 with the hot half at q8_0 %.3g (%lld)", kl8,
                (long long)b8, kl4, (long long)b4, klmix, (long long)bmix);
    cr_expect(kl4 > kl8 && kl4 < 1e-3, "q4 KL %g, q8_0 %g", kl4, kl8);
    cr_expect(b4 < b8, "q4 %lld bytes, q8_0 %lld", (long long)b4, (long long)b8);
    cr_expect(klmix < kl4, "the plan's KL %g is not below q4's %g", klmix, kl4);
    cr_expect(bmix > b4 && bmix < 1.5 * (double)b4, "the plan's %lld bytes, q4's %lld", (long long)bmix,
              (long long)b4);
    free(buf);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(lp);
    free(am);
    free(nll);
}

/* A run against its own base reads as no change at all. */
Test(ppl, own_base_reads_as_no_change)
{
    uint16_t *lp;
    int32_t *am;
    float *nll;
    int64_t n;
    run_base("mixtral_bos", &lp, &am, &nll, &n);
    struct setup s;
    setup_case(&s, ref_case("mixtral_bos"), "cpu", 512);
    struct moe_ppl_base base = {lp, nll, am, n, s.m.cfg.vocab};
    struct moe_ppl_result res;
    struct moe_ppl_summary sm;
    cr_assert_eq(moe_ppl_run(&s.r, &s.plan, &base, NULL, &res, NULL, NULL), MOE_OK);
    cr_assert_eq(moe_ppl_summarize(&res, &sm), MOE_OK);
    cr_expect_eq(sm.same_top1, 1.0);
    cr_expect(fabs(sm.mean_dnll) < 1e-6, "ln ratio %g", sm.mean_dnll);
    cr_expect(sm.kl_max < 1e-5, "KL max %g (f16 rounding only)", sm.kl_max);
    cr_expect(sm.rms_dp < 1e-6);
    moe_ppl_result_free(&res);
    /* a base of another length is refused */
    base.n = n - 1;
    cr_expect_neq(moe_ppl_run(&s.r, &s.plan, &base, NULL, &res, NULL, NULL), MOE_OK);
    cr_expect(strstr(moe_last_error(), "base run of"), "%s", moe_last_error());
    moe_ppl_result_free(&res);
    teardown_case(&s);
    free(lp);
    free(am);
    free(nll);
}

Test(ppl, plan_cuts_windows_by_the_rule)
{
    int32_t body[23], bos = 1;
    for (int i = 0; i < 23; i++) body[i] = 100 + i;
    struct moe_ppl_plan p;
    /* BOS + 7 body tokens per window: 3 full windows and one of 2 body tokens */
    cr_assert_eq(moe_ppl_plan_init(&p, &bos, 1, body, 23, 8, 4, 0), MOE_OK);
    cr_expect_eq(p.n_windows, 3, "the last window (3 tokens) scores nothing from row 4");
    cr_expect_eq(p.n_scored, 3 * 3);
    cr_expect_eq(p.tokens[8], 1);
    cr_expect_eq(p.tokens[9], 107);
    moe_ppl_plan_free(&p);
    cr_assert_eq(moe_ppl_plan_init(&p, &bos, 1, body, 23, 8, 0, 0), MOE_OK);
    cr_expect_eq(p.n_windows, 4);
    cr_expect_eq(p.n_scored, 3 * 7 + 2);
    cr_expect_eq(p.win_start[4], 4 + 23);
    moe_ppl_plan_free(&p);
    cr_assert_eq(moe_ppl_plan_init(&p, NULL, 0, body, 23, 8, 0, 2), MOE_OK);
    cr_expect_eq(p.n_windows, 2);
    cr_expect_eq(p.n_scored, 14);
    moe_ppl_plan_free(&p);
    cr_expect_neq(moe_ppl_plan_init(&p, &bos, 1, body, 23, 2, 0, 0), MOE_OK);
    cr_expect(strstr(moe_last_error(), "at least 2 text tokens"), "%s", moe_last_error());
    cr_expect_neq(moe_ppl_plan_init(&p, NULL, 0, body, 23, 8, 7, 0), MOE_OK);
    cr_expect(strstr(moe_last_error(), "use 0..6"), "%s", moe_last_error());
    cr_expect_neq(moe_ppl_plan_init(&p, NULL, 0, body, 3, 8, 4, 0), MOE_OK);
    cr_expect(strstr(moe_last_error(), "too short"), "%s", moe_last_error());
    moe_ppl_plan_free(&p);
}

/* A model whose logits are NaN gets an error naming where, not a number. */
Test(ppl, nan_logits_are_an_error)
{
    struct moe_config cfg;
    struct moe_model m;
    struct moe_backend be;
    struct moe_runner r;
    struct moe_ppl_plan p;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(&m, &cfg, MOE_DTYPE_F32, 5), MOE_OK);
    int32_t body[40];
    for (int i = 0; i < 40; i++) body[i] = (i * 7) % cfg.vocab;
    cr_assert_eq(moe_ppl_plan_init(&p, NULL, 0, body, 40, 16, 8, 0), MOE_OK);
    struct moe_runner_opts o;
    moe_ppl_runner_opts(&p, 512, 64, 16, MOE_DTYPE_F32, &o);
    cr_assert_eq(moe_backend_init(&be, "cpu", NULL), MOE_OK);
    cr_assert_eq(moe_runner_init(&r, &m, &be, &o), MOE_OK);
    struct moe_ppl_result res;
    cr_assert_eq(moe_ppl_run(&r, &p, NULL, NULL, &res, NULL, NULL), MOE_OK, "%s", moe_last_error());
    moe_ppl_result_free(&res);
    cr_assert_eq(m.final_norm.dtype, MOE_DTYPE_F32);
    ((float *)m.final_norm.data)[3] = NAN; /* in-memory weights */
    cr_assert_neq(moe_ppl_run(&r, &p, NULL, NULL, &res, NULL, NULL), MOE_OK);
    cr_expect(strstr(moe_last_error(), "window 0, position 8: the model's logits are not finite"), "%s",
              moe_last_error());
    moe_runner_free(&r);
    moe_backend_free(&be);
    moe_ppl_plan_free(&p);
    moe_model_free(&m);
}

Test(ppl_cli, json_and_base_round_trip)
{
    char dir[] = "/tmp/moerun-ppl-XXXXXX", cmd[4096], out[8192];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "%s ppl %s/models/demo-moe %s/stories.txt --ctx 64 --save-base %s/base.st "
             "--json 2>/dev/null", MOERUN_BINARY, MOERUN_SOURCE_DIR, PPL_DIR, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    json_t *o = json_loads(out, 0, NULL);
    cr_assert(o, "%s", out);
    double want = json_number_value(json_object_get(ref_case("demo_k4"), "ppl"));
    cr_expect(fabs(json_number_value(json_object_get(o, "ppl")) - want) < 1e-5 * want, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(o, "scored")), 1271);
    json_decref(o);
    snprintf(cmd, sizeof cmd, "%s ppl %s/models/demo-moe %s/stories.txt --ctx 64 --kl-base %s/base.st "
             "--moe-top-k 2 --json 2>/dev/null", MOERUN_BINARY, MOERUN_SOURCE_DIR, PPL_DIR, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    o = json_loads(out, 0, NULL);
    cr_assert(o, "%s", out);
    json_t *b = json_object_get(o, "base");
    want = json_number_value(json_object_get(ref_case("demo_k2"), "mean_kl"));
    cr_expect(fabs(json_number_value(json_object_get(b, "kl_mean")) - want) < 0.01 * want, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(o, "top_k")), 2);
    json_decref(o);

    char args[2048];
    snprintf(args, sizeof args, "ppl %s/models/demo-moe %s/stories.txt --ctx 32 --kl-base %s/base.st",
             MOERUN_SOURCE_DIR, PPL_DIR, dir);
    tu_expect_one_line_error(args, "was saved with --ctx 64 --score-from 32");
    snprintf(args, sizeof args, "ppl %s/models/demo-moe %s/README.md --ctx 64 --kl-base %s/base.st",
             MOERUN_SOURCE_DIR, MOERUN_SOURCE_DIR, dir);
    tu_expect_one_line_error(args, "scores 1271 tokens; this run scores");
    snprintf(args, sizeof args, "ppl %s/models/demo-moe %s/stories.txt --ctx 64 --kl-base "
             "%s/models/demo-moe/model.safetensors", MOERUN_SOURCE_DIR, PPL_DIR, MOERUN_SOURCE_DIR);
    tu_expect_one_line_error(args, "not a base run of moerun ppl");
    snprintf(args, sizeof args, "ppl %s/models/demo-moe %s/stories.txt --moe-top-k 17", MOERUN_SOURCE_DIR, PPL_DIR);
    tu_expect_one_line_error(args, "--moe-top-k: top-k 17: the model has 16 experts per MoE layer");
    snprintf(args, sizeof args, "ppl %s/qwen3 %s/stories.txt --moe-top-k 2", FIXTURE_DIR, PPL_DIR);
    tu_expect_one_line_error(args, "is a dense model");
    snprintf(args, sizeof args, "ppl %s/models/demo-moe %s/nothing.txt", MOERUN_SOURCE_DIR, PPL_DIR);
    tu_expect_one_line_error(args, "nothing.txt: cannot open");
    snprintf(args, sizeof args, "ppl %s/models/demo-moe %s/stories.txt --ctx 4096", MOERUN_SOURCE_DIR, PPL_DIR);
    tu_expect_one_line_error(args, "exceeds the model's context of 2048");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
