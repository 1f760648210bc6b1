/* test_spec_mtp.c - the multi-token-prediction proposer (spec_mtp.h,
 * MOE_SPEC_MTP) against the fixtures deepseek_v3_mtp (MLA) and
 * glm4_moe_mtp (GQA), whose references come from transformers' own
 * decoder layer run as vLLM's MTP module runs it
 * (tests/reference/make_mtp_fixtures.py):
 *   - the target's final-normed hidden states, and the module's
 *     teacher-forced block outputs and logits, match the reference;
 *   - the proposer's four drafts after a prompt are the reference's;
 *   - served through the engine, every output is the one without
 *     speculation (greedy, sampled, log-probabilities, penalties; K = 1,
 *     2, 4, 8; preemption; prefix sharing, whose cached positions the
 *     module computes from zero hidden states), and the fixture's greedy
 *     continuation;
 *   - a module of NaN weights changes nothing; 1,000 cancelled and
 *     finished requests leave every block of both pools free;
 *   - what cannot be run is refused, naming why.
 * spec_mtp_cuda runs the reference comparisons and the fixtures' greedy
 * continuations on a GPU (tests/gpu/run.sh), skipped without one. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine.h"
#include "tests/spec_harness.h"
#include "tests/testutil.h"

static struct moe_backend be;

static void setup_ref(void) { cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK); }
static void setup_fast(void) { cr_assert_eq(moe_backend_cpu_fast_init(&be, 1), MOE_OK); }
static void setup_cuda(void)
{
    tu_need_cuda_device();
    cr_assert_eq(tu_backend_init(&be, "cuda"), MOE_OK, "%s", moe_last_error());
}
static void teardown(void) { moe_backend_free(&be); }

TestSuite(spec_mtp, .init = setup_ref, .fini = teardown);
TestSuite(spec_mtp_fast, .init = setup_fast, .fini = teardown);
/* On a GPU (tests/gpu/run.sh); skipped without one. */
TestSuite(spec_mtp_cuda, .init = setup_cuda, .fini = teardown);

static const char *const fixtures[] = {"deepseek_v3_mtp", "glm4_moe_mtp"};

struct fx {
    struct moe_model m, mtp;
    struct moe_safetensors ref;
};

static void fx_open(struct fx *f, const char *name)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, name);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    memset(f, 0, sizeof *f);
    cr_assert_eq(moe_model_load(&f->m, dir), MOE_OK, "%s: %s", name, moe_last_error());
    cr_assert_eq(moe_model_mtp_view(&f->m, 0, &f->mtp), MOE_OK, "%s: %s", name, moe_last_error());
    cr_assert_eq(moe_safetensors_open_file(&f->ref, path), MOE_OK, "%s", moe_last_error());
}

static void fx_close(struct fx *f)
{
    moe_safetensors_close(&f->ref);
    moe_model_free(&f->mtp);
    moe_model_free(&f->m);
}

/* Reference tensor fmt % p, of n elements of dtype dt. */
static const void *ref(struct fx *f, const char *fmt, int p, enum moe_dtype dt, size_t n)
{
    char name[64];
    snprintf(name, sizeof name, fmt, p);
    const struct moe_st_tensor *t = moe_safetensors_find(&f->ref, name);
    cr_assert(t, "reference tensor %s", name);
    cr_assert_eq(t->dtype, dt, "%s dtype", name);
    cr_assert_eq(t->nbytes, n * moe_dtype_size(dt), "%s: %zu bytes", name, (size_t)t->nbytes);
    return t->data;
}

static int prompt_len(struct fx *f, int p)
{
    char name[32];
    snprintf(name, sizeof name, "prompt.%d", p);
    const struct moe_st_tensor *t = moe_safetensors_find(&f->ref, name);
    cr_assert(t, "%s", name);
    return (int)t->shape[0];
}

static struct moe_runner_opts runner_opts(bool hidden)
{
    return (struct moe_runner_opts){.max_tokens = 64, .max_seqs = 4, .max_logits = 64,
                                    .block_size = 4, .n_blocks = 64, .hidden = hidden};
}

/* The target's hidden states, the module's block outputs and logits,
 * teacher-forced over each prompt from the reference's hidden states. */
static void module_matches_reference(void)
{
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        struct fx f;
        fx_open(&f, fixtures[i]);
        const int D = f.m.cfg.d_model, V = f.m.cfg.vocab;
        struct moe_runner tr, mr;
        struct moe_runner_opts to = runner_opts(true), mo = runner_opts(false);
        cr_assert_eq(moe_runner_init(&tr, &f.m, &be, &to), MOE_OK, "%s", moe_last_error());
        cr_assert_eq(moe_runner_init(&mr, &f.mtp, &be, &mo), MOE_OK, "%s", moe_last_error());
        for (int p = 0; p < 3; p++) {
            const int S = prompt_len(&f, p);
            const int32_t *prompt = ref(&f, "prompt.%d", p, MOE_DTYPE_I32, (size_t)S);
            const float *hidden = ref(&f, "hidden.%d", p, MOE_DTYPE_F32, (size_t)S * D);
            const float *out = ref(&f, "mtp_out.%d", p, MOE_DTYPE_F32, (size_t)(S - 1) * D);
            const float *logits = ref(&f, "mtp_logits.%d", p, MOE_DTYPE_F32, (size_t)(S - 1) * V);
            char what[96];
            struct moe_seq ts = {0}, ms = {0};
            struct moe_chunk tc = {&ts, prompt, S, false, false, 0};
            cr_assert_eq(moe_runner_step(&tr, &tc, 1, NULL, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
            float *got = malloc((size_t)S * V * sizeof *got);
            cr_assert_eq(be.ops->to_host(&be, got, tr.fw.hid, (size_t)S * D * sizeof *got), MOE_OK);
            snprintf(what, sizeof what, "%s prompt %d: the target's hidden states", fixtures[i], p);
            cr_assert(tu_allclose(what, got, hidden, (size_t)S * D, 1e-4f, 1e-4f), "%s", what);
            /* row r: token t_{r+1} and hidden h_r, at position r */
            cr_assert_eq(be.ops->to_device(&be, mr.fw.hin, hidden, (size_t)(S - 1) * D * sizeof(float)), MOE_OK);
            struct moe_chunk mc = {&ms, prompt + 1, S - 1, true, false, 0};
            cr_assert_eq(moe_runner_step(&mr, &mc, 1, got, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
            snprintf(what, sizeof what, "%s prompt %d: the module's logits", fixtures[i], p);
            cr_assert(tu_allclose(what, got, logits, (size_t)(S - 1) * V, 1e-4f, 1e-4f), "%s", what);
            cr_assert_eq(be.ops->to_host(&be, got, mr.fw.x, (size_t)(S - 1) * D * sizeof *got), MOE_OK);
            snprintf(what, sizeof what, "%s prompt %d: the module's block outputs", fixtures[i], p);
            cr_assert(tu_allclose(what, got, out, (size_t)(S - 1) * D, 1e-4f, 1e-4f), "%s", what);
            free(got);
            moe_seq_free(&tr, &ts);
            moe_seq_free(&mr, &ms);
        }
        moe_runner_free(&mr);
        moe_runner_free(&tr);
        fx_close(&f);
    }
}
Test(spec_mtp, module_matches_reference) { module_matches_reference(); }
Test(spec_mtp_fast, module_matches_reference) { module_matches_reference(); }
Test(spec_mtp_cuda, module_matches_reference) { module_matches_reference(); }

/* After the target computed a prompt's first S - 1 tokens, the proposer's
 * catch-up reads their hidden states and drafts four tokens by recursion:
 * the reference's; its cache then holds the S - 1 positions only. */
static void drafts_match_reference(void)
{
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        struct fx f;
        fx_open(&f, fixtures[i]);
        struct moe_runner tr;
        struct moe_runner_opts to = runner_opts(true);
        cr_assert_eq(moe_runner_init(&tr, &f.m, &be, &to), MOE_OK, "%s", moe_last_error());
        struct moe_spec_mtp mtp;
        struct moe_spec_mtp_opts o = {.max_tokens = 64, .max_seqs = 4, .block_size = 4, .n_blocks = 64,
                                      .kv_dtype = MOE_DTYPE_F32, .hid = tr.fw.hid, .zero_row = 64};
        cr_assert_eq(moe_spec_mtp_init(&mtp, &f.mtp, &be, &o), MOE_OK, "%s", moe_last_error());
        for (int p = 0; p < 3; p++) {
            const int S = prompt_len(&f, p);
            const int32_t *prompt = ref(&f, "prompt.%d", p, MOE_DTYPE_I32, (size_t)S);
            const int32_t *want = ref(&f, "mtp_greedy.%d", p, MOE_DTYPE_I32, 4);
            struct moe_seq ts = {0}, ms = {0};
            struct moe_chunk tc = {&ts, prompt, S - 1, false, false, 0};
            cr_assert_eq(moe_runner_step(&tr, &tc, 1, NULL, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
            int32_t out[4] = {-1, -1, -1, -1};
            mtp.jobs[0] = (struct moe_spec_mtp_job){.seq = &ms, .tokens = prompt, .n_tokens = S,
                                                    .n_computed = S - 1, .step_first = 0, .step_row = 0,
                                                    .k = 4, .out = out};
            cr_assert_eq(moe_spec_mtp_run(&mtp, 1), MOE_OK, "%s", moe_last_error());
            cr_assert_eq(mtp.jobs[0].k, 4);
            for (int k = 0; k < 4; k++)
                cr_assert_eq(out[k], want[k], "%s prompt %d draft %d: %d, the reference %d", fixtures[i],
                             p, k, out[k], want[k]);
            cr_assert_eq(ms.len, S - 1, "the module keeps the positions the target's states made");
            moe_seq_free(&tr, &ts);
            moe_spec_mtp_seq_free(&mtp, &ms);
        }
        moe_spec_mtp_free(&mtp);
        moe_runner_free(&tr);
        fx_close(&f);
    }
}
Test(spec_mtp, drafts_match_reference) { drafts_match_reference(); }
Test(spec_mtp_fast, drafts_match_reference) { drafts_match_reference(); }
Test(spec_mtp_cuda, drafts_match_reference) { drafts_match_reference(); }

/* Each prompt's greedy continuation through the engine with the module
 * proposing four tokens a step: the fixture's. */
static void greedy_matches_fixture(struct fx *f, const char *name)
{
    struct spec_job jobs[3];
    memset(jobs, 0, sizeof jobs);
    for (int p = 0; p < 3; p++) {
        jobs[p].n = prompt_len(f, p);
        memcpy(jobs[p].prompt, ref(f, "prompt.%d", p, MOE_DTYPE_I32, (size_t)jobs[p].n),
               (size_t)jobs[p].n * sizeof(int32_t));
        jobs[p].p.max_tokens = 16;
        moe_sampling_defaults(&jobs[p].p.sampling);
    }
    struct moe_engine_opts o = spec_opts(256, 64, false);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_MTP, .tokens = 4, .draft = &f->mtp};
    struct spec_result res[3];
    struct moe_engine_counters n = spec_serve(&be, &f->m, jobs, 3, &o, res);
    cr_assert(n.spec_draft_tokens > 0, "%s: nothing drafted", name);
    for (int p = 0; p < 3; p++) {
        const int32_t *want = ref(f, "greedy.%d", p, MOE_DTYPE_I32, 16);
        cr_assert_eq(res[p].n, 16);
        for (int k = 0; k < 16; k++)
            cr_assert_eq(res[p].out[k], want[k], "%s prompt %d token %d: %d, transformers %d", name,
                         p, k, res[p].out[k], want[k]);
    }
}

static void fixtures_greedy(void)
{
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        struct fx f;
        fx_open(&f, fixtures[i]);
        greedy_matches_fixture(&f, fixtures[i]);
        fx_close(&f);
    }
}
Test(spec_mtp_cuda, greedy_matches_fixture) { fixtures_greedy(); }

/* Random jobs, K = 1, 2, 4, 8, a roomy pool with prefix sharing, then a
 * pool of 24 blocks that preempts: the outputs without speculation. */
static void engine_matches_plain(void)
{
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        struct fx f;
        fx_open(&f, fixtures[i]);
        greedy_matches_fixture(&f, fixtures[i]);
        static struct spec_job jobs[SPEC_MAXJ];
        spec_make_jobs(jobs, SPEC_MAXJ, f.m.cfg.vocab, 29 + i);
        for (int j = 1; j < SPEC_MAXJ; j += 2) { /* pairs share their first half */
            int n = jobs[j - 1].n / 2 < jobs[j].n ? jobs[j - 1].n / 2 : jobs[j].n;
            memcpy(jobs[j].prompt, jobs[j - 1].prompt, (size_t)n * sizeof *jobs[j].prompt);
            jobs[j].arrive = jobs[j - 1].arrive + 3;
        }
        struct moe_spec_opts sp = {.kind = MOE_SPEC_MTP, .draft = &f.mtp};
        char what[96];
        snprintf(what, sizeof what, "%s, prefix sharing", fixtures[i]);
        struct spec_totals t = spec_matches_plain(&be, &f.m, jobs, SPEC_MAXJ, spec_opts(256, 64, true),
                                                  &sp, false, what);
        cr_assert(t.prefix_hits > 0, "prompts share cached blocks");
        snprintf(what, sizeof what, "%s, preemption", fixtures[i]);
        t = spec_matches_plain(&be, &f.m, jobs, SPEC_MAXJ, spec_opts(24, 64, false), &sp, false, what);
        cr_assert(t.preemptions > 0, "a 24-block pool must preempt");
        fx_close(&f);
    }
}
Test(spec_mtp, engine_matches_plain, .timeout = 600) { engine_matches_plain(); }
Test(spec_mtp_fast, engine_matches_plain, .timeout = 600) { engine_matches_plain(); }

/* A module whose input norm is NaN: every logit it computes is NaN, its
 * drafts are token 0, and the outputs are the target's. */
Test(spec_mtp, nan_module_changes_nothing)
{
    struct fx f;
    fx_open(&f, fixtures[0]);
    const int D = f.m.cfg.d_model;
    float *nan_norm = malloc((size_t)D * sizeof *nan_norm);
    for (int d = 0; d < D; d++) nan_norm[d] = NAN;
    cr_assert_eq(f.mtp.mtp_enorm.dtype, MOE_DTYPE_F32);
    f.mtp.mtp_enorm.data = nan_norm;
    static struct spec_job jobs[SPEC_MAXJ];
    spec_make_jobs(jobs, SPEC_MAXJ, f.m.cfg.vocab, 31);
    struct moe_spec_opts sp = {.kind = MOE_SPEC_MTP, .draft = &f.mtp};
    struct spec_totals t = spec_matches_plain(&be, &f.m, jobs, SPEC_MAXJ, spec_opts(256, 64, false), &sp,
                                              false, "NaN module");
    cr_assert(t.drafted > 0);
    fx_close(&f);
    free(nan_norm);
}

/* 1,000 speculative requests in a 40-block pool (the module's too), some
 * cancelled at random moments: no block of either pool stays taken. */
Test(spec_mtp, cancellation_leaks_no_block, .timeout = 600)
{
    struct fx f;
    fx_open(&f, fixtures[1]);
    struct moe_engine_opts o = spec_opts(40, 48, true);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_MTP, .tokens = 4, .draft = &f.mtp};
    struct moe_engine e;
    cr_assert_eq(moe_engine_init(&e, &f.m, &be, &o), MOE_OK, "%s", moe_last_error());
    static struct spec_job jobs[SPEC_MAXJ];
    spec_make_jobs(jobs, 7, f.m.cfg.vocab, 37);
    tu_engine_churn(&e, 1000, 8, 41, spec_churn_request, spec_pools_returned, jobs);
    cr_assert(e.n.spec_draft_tokens > 0, "the churn speculated");
    tu_expect_pools_free(&e);
    moe_engine_free(&e);
    fx_close(&f);
}

/* What cannot run is refused, naming why. */
Test(spec_mtp, refusals)
{
    struct fx f;
    fx_open(&f, fixtures[0]);
    struct moe_engine e;
    struct moe_engine_opts o = spec_opts(64, 64, false);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_MTP, .draft = &f.m};
    cr_assert_eq(moe_engine_init(&e, &f.m, &be, &o), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "needs the checkpoint's multi-token-prediction module"), "%s",
              moe_last_error());
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_MTP, .draft = &f.mtp, .sample_drafts = true};
    cr_assert_eq(moe_engine_init(&e, &f.m, &be, &o), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "sampled drafts need a draft model"), "%s", moe_last_error());
    fx_close(&f);
    /* a checkpoint that declares a module but left its weights out */
    struct moe_model m, v;
    cr_assert_eq(moe_model_load(&m, FIXTURE_DIR "/deepseek_v3"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(m.cfg.n_mtp_layers, 1);
    cr_assert_eq(moe_model_mtp_view(&m, 0, &v), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "model.layers.3.eh_proj.weight is not in the checkpoint"), "%s",
              moe_last_error());
    cr_assert_eq(moe_model_mtp_view(&m, 1, &v), MOE_ERR_INVALID_ARG);
    moe_model_free(&m);
    /* a model that declares none */
    cr_assert_eq(moe_model_load(&m, FIXTURE_DIR "/mixtral"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_model_mtp_view(&m, 0, &v), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "declares no multi-token-prediction layers"), "%s", moe_last_error());
    moe_model_free(&m);
}

/* The command line: `run --spec mtp` prints the fixture's continuation and
 * its speculation summary. */
Test(spec_mtp, cli_run)
{
    char out[4096];
    int rc = tu_run(MOERUN_BINARY " run " FIXTURE_DIR "/deepseek_v3_mtp --backend cpu --prompt-ids "
                    "226,0,29,129,164 -n 16 --ignore-eos --temperature 0 --spec mtp 2>&1", out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    struct fx f;
    fx_open(&f, fixtures[0]);
    const int32_t *prompt = ref(&f, "prompt.0", 0, MOE_DTYPE_I32, 5);
    cr_assert(prompt[0] == 226 && prompt[4] == 164, "the fixture's prompt 0");
    const int32_t *want = ref(&f, "greedy.0", 0, MOE_DTYPE_I32, 16);
    char line[256];
    int off = 0;
    for (int k = 0; k < 16; k++) off += snprintf(line + off, sizeof line - (size_t)off, k ? ",%d" : "%d", want[k]);
    cr_assert(strstr(out, line), "expected %s in: %s", line, out);
    cr_assert(strstr(out, "speculation: mean accepted length"), "%s", out);
    fx_close(&f);
}
