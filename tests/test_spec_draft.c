/* test_spec_draft.c - the draft-model proposer of speculative decoding
 * (spec_draft.h, MOE_SPEC_DRAFT) never changes a request's output: greedy
 * requests give the same tokens, finish reasons and log-probabilities with
 * it and without speculation, for K = 1, 2, 4, 8, batched with sampled
 * (never speculated) requests, under preemption, with a draft pool too
 * small for every request, with prefix sharing, for several fixture
 * families, each paired with itself (every drafted token of a request
 * without penalties is then accepted: the CPU backends are
 * row-independent, so the draft's rows are the target's bit for bit), with
 * itself cut to fewer layers and with another family of the same
 * vocabulary.  A draft of NaN weights changes nothing; a draft of another
 * vocabulary is refused.  After every run each block of both pools is
 * free. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/engine/engine.h"
#include "tests/spec_harness.h"
#include "tests/testutil.h"

static struct moe_backend be;

static void setup_ref(void) { cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK); }
static void setup_fast(void) { cr_assert_eq(moe_backend_cpu_fast_init(&be, 1), MOE_OK); }
static void teardown(void) { moe_backend_free(&be); }

TestSuite(spec_draft, .init = setup_ref, .fini = teardown);
TestSuite(spec_draft_fast, .init = setup_fast, .fini = teardown);

/* A synthetic Qwen3-MoE of `layers` layers and vocabulary `vocab`. */
static void synthetic_model(struct moe_model *m, int layers, int vocab, uint64_t seed)
{
    tu_tiny_qwen3_moe(m, layers, vocab, seed);
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    cr_assert(in && out, "%s -> %s", from, to);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) cr_assert_eq(fwrite(buf, 1, n, out), n, "%s", to);
    fclose(in);
    cr_assert_eq(fclose(out), 0, "%s", to);
}

/* A copy of fixture `name` cut to its first `layers` layers: its config
 * with num_hidden_layers changed, its other files copied (the loader reads
 * the tensors of the layers it has; shards must lie in the model's
 * folder).  dir receives the copy's path. */
static void truncated_fixture(const char *name, int layers, char *dir, size_t n)
{
    char src[512], path[1024], target[1024];
    snprintf(src, sizeof src, "%s/%s", FIXTURE_DIR, name);
    snprintf(dir, n, "/tmp/moerun-draft-XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp");
    DIR *d = opendir(src);
    cr_assert(d, "%s", src);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !strcmp(de->d_name, "config.json")) continue;
        snprintf(target, sizeof target, "%s/%s", src, de->d_name);
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        copy_file(target, path);
    }
    closedir(d);
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    cr_assert(cfg, "%s", path);
    json_object_set_new(cfg, "num_hidden_layers", json_integer(layers));
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(json_dump_file(cfg, path, 0), 0, "%s", path);
    json_decref(cfg);
}

static void remove_dir(const char *dir)
{
    char cmd[600], out[8];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
}

#define MAXJ SPEC_MAXJ

static struct spec_totals draft_matches_plain(const struct moe_model *m, const struct moe_model *draft,
                                              const struct spec_job *jobs, int nj,
                                              struct moe_engine_opts o, int draft_blocks,
                                              bool self_draft, const char *what)
{
    struct moe_spec_opts sp = {.kind = MOE_SPEC_DRAFT, .draft = draft, .draft_blocks = draft_blocks};
    return spec_matches_plain(&be, m, jobs, nj, o, &sp, self_draft, what);
}

/* The synthetic target drafted by itself (a second copy of the same
 * weights): every draft of a request without penalties is accepted. */
static void self_draft_all_accepted(void)
{
    struct moe_model m, d;
    synthetic_model(&m, 2, 97, 11);
    synthetic_model(&d, 2, 97, 11);
    static struct spec_job jobs[MAXJ];
    spec_make_jobs(jobs, MAXJ, 97, 5);
    struct spec_totals t = draft_matches_plain(&m, &d, jobs, MAXJ, spec_opts(256, 1024, false), 0, true,
                                          "self draft");
    cr_assert(t.accepted > 0 && t.accepted <= t.drafted);
    moe_model_free(&d);
    moe_model_free(&m);
}
Test(spec_draft, self_draft_all_accepted) { self_draft_all_accepted(); }
Test(spec_draft_fast, self_draft_all_accepted) { self_draft_all_accepted(); }

/* A one-layer draft of other weights: its guesses are often wrong, the
 * output is still the target's. */
Test(spec_draft, small_draft_matches_plain)
{
    struct moe_model m, d;
    synthetic_model(&m, 2, 97, 11);
    synthetic_model(&d, 1, 97, 23);
    static struct spec_job jobs[MAXJ];
    spec_make_jobs(jobs, MAXJ, 97, 7);
    struct spec_totals t = draft_matches_plain(&m, &d, jobs, MAXJ, spec_opts(256, 1024, false), 0, false,
                                          "one-layer draft");
    cr_assert(t.accepted < t.drafted, "another model's guesses are not all right");
    moe_model_free(&d);
    moe_model_free(&m);
}

/* A 24-block pool: requests are preempted and recomputed, their draft
 * state dropped and rebuilt; a step budget of 6 rows cuts drafts and
 * chunks the draft's catch-up. */
Test(spec_draft, preemption_and_tight_budget_match_plain)
{
    struct moe_model m, d;
    synthetic_model(&m, 2, 97, 11);
    synthetic_model(&d, 2, 97, 11);
    static struct spec_job jobs[MAXJ];
    spec_make_jobs(jobs, MAXJ, 97, 9);
    struct spec_totals t = draft_matches_plain(&m, &d, jobs, MAXJ, spec_opts(24, 64, false), 0, true,
                                          "preemption");
    cr_assert(t.preemptions > 0, "a 24-block pool must preempt");
    t = draft_matches_plain(&m, &d, jobs, MAXJ, spec_opts(256, 6, false), 0, true, "budget 6");
    cr_assert(t.accepted > 0);
    moe_model_free(&d);
    moe_model_free(&m);
}

/* A draft pool of 20 blocks (80 tokens) for eight requests of up to 100:
 * some are not speculated in some steps; nothing else changes. */
Test(spec_draft, small_draft_pool_matches_plain)
{
    struct moe_model m, d;
    synthetic_model(&m, 2, 97, 11);
    synthetic_model(&d, 2, 97, 11);
    static struct spec_job jobs[MAXJ];
    spec_make_jobs(jobs, MAXJ, 97, 15);
    struct spec_totals t = draft_matches_plain(&m, &d, jobs, MAXJ, spec_opts(256, 1024, false), 20, true,
                                          "20-block draft pool");
    struct spec_totals roomy = draft_matches_plain(&m, &d, jobs, MAXJ, spec_opts(256, 1024, false), 0, true,
                                              "a roomy draft pool");
    cr_assert(t.accepted > 0);
    cr_assert(t.drafted < roomy.drafted, "the small pool drafts less (%llu, roomy %llu)",
              (unsigned long long)t.drafted, (unsigned long long)roomy.drafted);
    moe_model_free(&d);
    moe_model_free(&m);
}

/* Pairs of requests share their prompts' first half; the target's prefix
 * cache is on (the draft's pool shares nothing). */
Test(spec_draft, prefix_sharing_matches_plain)
{
    struct moe_model m, d;
    synthetic_model(&m, 2, 97, 11);
    synthetic_model(&d, 1, 97, 11);
    static struct spec_job jobs[MAXJ];
    spec_make_jobs(jobs, MAXJ, 97, 13);
    for (int i = 1; i < MAXJ; i += 2) {
        int n = jobs[i - 1].n / 2 < jobs[i].n ? jobs[i - 1].n / 2 : jobs[i].n;
        memcpy(jobs[i].prompt, jobs[i - 1].prompt, (size_t)n * sizeof *jobs[i].prompt);
        jobs[i].arrive = jobs[i - 1].arrive + 3;
    }
    struct spec_totals t = draft_matches_plain(&m, &d, jobs, MAXJ, spec_opts(256, 64, true), 0, false,
                                          "prefix sharing");
    cr_assert(t.prefix_hits > 0, "prompts share cached blocks");
    moe_model_free(&d);
    moe_model_free(&m);
}

/* Fixture families: each drafted by a second copy of itself (all
 * accepted), by itself cut to one layer, and by another family of the
 * same vocabulary. */
static void families_match_plain(void)
{
    static const struct {
        const char *target, *other;
    } pairs[] = {{"qwen3_moe", "mixtral"}, {"mixtral", "olmoe"}, {"deepseek_v2", "qwen3_moe"}};
    for (size_t f = 0; f < sizeof pairs / sizeof *pairs; f++) {
        char dir[512], cut[64];
        snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, pairs[f].target);
        struct moe_model m, self, small, other;
        cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s: %s", dir, moe_last_error());
        cr_assert_eq(moe_model_load(&self, dir), MOE_OK, "%s: %s", dir, moe_last_error());
        truncated_fixture(pairs[f].target, 1, cut, sizeof cut);
        cr_assert_eq(moe_model_load(&small, cut), MOE_OK, "%s: %s", cut, moe_last_error());
        cr_assert_eq(small.cfg.n_layers, 1);
        snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, pairs[f].other);
        cr_assert_eq(moe_model_load(&other, dir), MOE_OK, "%s: %s", dir, moe_last_error());
        static struct spec_job jobs[8];
        spec_make_jobs(jobs, 8, m.cfg.vocab, 17 + f);
        char what[128];
        snprintf(what, sizeof what, "%s drafted by itself", pairs[f].target);
        draft_matches_plain(&m, &self, jobs, 8, spec_opts(256, 64, true), 0, true, what);
        snprintf(what, sizeof what, "%s drafted by its first layer", pairs[f].target);
        struct spec_totals t = draft_matches_plain(&m, &small, jobs, 8, spec_opts(256, 64, true), 0, false, what);
        cr_log_info("%s: %llu of %llu tokens its first layer drafted accepted", pairs[f].target,
                    (unsigned long long)t.accepted, (unsigned long long)t.drafted);
        snprintf(what, sizeof what, "%s drafted by %s", pairs[f].target, pairs[f].other);
        draft_matches_plain(&m, &other, jobs, 8, spec_opts(256, 64, true), 0, false, what);
        moe_model_free(&other);
        moe_model_free(&small);
        moe_model_free(&self);
        moe_model_free(&m);
        remove_dir(cut);
    }
}
Test(spec_draft, fixture_families_match_plain, .timeout = 600) { families_match_plain(); }
Test(spec_draft_fast, fixture_families_match_plain, .timeout = 600) { families_match_plain(); }

/* A draft whose embedding is NaN: every logit it computes is NaN, its
 * guesses are token 0 (the argmax policy), and the output is the
 * target's. */
Test(spec_draft, nan_draft_changes_nothing)
{
    struct moe_model m, d;
    synthetic_model(&m, 2, 97, 11);
    synthetic_model(&d, 1, 97, 11);
    cr_assert_eq(d.embed.dtype, MOE_DTYPE_F32);
    float *emb = d.embed.data;
    for (int64_t i = 0; i < d.embed.shape[0] * d.embed.shape[1]; i++) emb[i] = NAN;
    static struct spec_job jobs[MAXJ];
    spec_make_jobs(jobs, MAXJ, 97, 19);
    struct spec_totals t = draft_matches_plain(&m, &d, jobs, MAXJ, spec_opts(256, 1024, false), 0, false,
                                          "NaN draft");
    cr_assert(t.drafted > 0);
    moe_model_free(&d);
    moe_model_free(&m);
}

/* 1,000 speculative requests in a 40-block pool (and a draft pool of 40),
 * a ninth of the live ones cancelled at random moments each step: a
 * request holds no block of either pool once it is finished, and
 * afterwards no block is referenced. */
Test(spec_draft, cancellation_leaks_no_block)
{
    struct moe_model m, d;
    synthetic_model(&m, 2, 97, 11);
    synthetic_model(&d, 1, 97, 11);
    struct moe_engine_opts o = spec_opts(40, 48, true);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_DRAFT, .tokens = 4, .draft = &d};
    struct moe_engine e;
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    static struct spec_job kinds[7];
    spec_make_jobs(kinds, 7, 97, 31);
    for (int i = 0; i < 7; i++) kinds[i].n = kinds[i].n < 24 ? kinds[i].n : 24;
    tu_engine_churn(&e, 1000, 24, 77, spec_churn_request, spec_pools_returned, kinds);
    cr_assert(e.n.requests_aborted > 50, "cancellations happened (%llu)",
              (unsigned long long)e.n.requests_aborted);
    cr_assert(e.n.spec_draft_tokens > 0 && e.n.prefix_hit_tokens > 0);
    tu_expect_pools_free(&e);
    moe_engine_free(&e);
    moe_model_free(&d);
    moe_model_free(&m);
}

/* A draft of another vocabulary, and the draft proposer without a draft:
 * each refused with one line that says why. */
Test(spec_draft, refuses_bad_drafts)
{
    struct moe_model m, d;
    synthetic_model(&m, 2, 97, 11);
    synthetic_model(&d, 1, 101, 11);
    struct moe_engine e;
    struct moe_engine_opts o = spec_opts(64, 64, false);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_DRAFT, .draft = &d};
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_ERR_INVALID_ARG);
    const char *msg = moe_last_error();
    cr_assert(strstr(msg, "vocabulary of 101 tokens, the target's has 97") && !strchr(msg, '\n'),
              "%s", msg);
    o.spec.draft = NULL;
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_ERR_INVALID_ARG);
    msg = moe_last_error();
    cr_assert(strstr(msg, "without a draft model") && !strchr(msg, '\n'), "%s", msg);
    moe_model_free(&d);
    moe_model_free(&m);
}

/* The proposer alone, against the draft model's own greedy decoding: three
 * sequences, over rounds in which each either gets a proposal (k of 1 to
 * 8, verified with a random number accepted and a token of its own after,
 * then rolled back as the engine does) or a plain decode token (no call).
 * Every proposal equals the greedy continuation a fresh runner computes
 * from the sequence's tokens, so no rejected guess's K/V survives; a
 * catch-up longer than the 16 rows of a draft step is chunked. */
Test(spec_draft, proposals_are_the_drafts_greedy_continuation)
{
    struct moe_model dm;
    synthetic_model(&dm, 1, 97, 29);
    struct moe_spec_draft d;
    struct moe_spec_draft_opts dop = {.max_tokens = 16, .max_seqs = 4, .block_size = 4,
                                      .n_blocks = 128, .kv_dtype = MOE_DTYPE_F32};
    cr_assert_eq(moe_spec_draft_init(&d, &dm, &be, 97, &dop), MOE_OK, "%s", moe_last_error());
    struct moe_runner ref;
    struct moe_runner_opts ro = {.max_tokens = 256, .max_seqs = 1, .max_logits = 1,
                                 .block_size = 4, .n_blocks = 64};
    cr_assert_eq(moe_runner_init(&ref, &dm, &be, &ro), MOE_OK, "%s", moe_last_error());
    enum { NS = 3, CAP = 200 };
    static int32_t tok[NS][CAP];
    int n[NS];
    struct moe_seq seq[NS];
    memset(seq, 0, sizeof seq);
    uint64_t seed = 3;
    for (int s = 0; s < NS; s++) {
        n[s] = 5 + (int)(tu_rand_u64(&seed) % 36);
        for (int i = 0; i < n[s]; i++) tok[s][i] = (int32_t)(tu_rand_u64(&seed) % 97);
    }
    int proposals = 0, rejections = 0, plain = 0;
    for (int round = 0; round < 30; round++) {
        int nj = 0, who[NS];
        for (int s = 0; s < NS; s++) {
            if (n[s] + 10 > CAP) continue;
            if (tu_rand_u64(&seed) % 3 == 0) { /* a plain decode token */
                tok[s][n[s]++] = (int32_t)(tu_rand_u64(&seed) % 97);
                plain++;
                continue;
            }
            int k = 1 + (int)(tu_rand_u64(&seed) % 8);
            d.jobs[nj] = (struct moe_spec_draft_job){.seq = &seq[s], .tokens = tok[s], .n_tokens = n[s],
                                                     .k = k, .out = tok[s] + n[s]};
            who[nj++] = s;
        }
        if (nj == 0) continue;
        cr_assert_eq(moe_spec_draft_propose(&d, nj), MOE_OK, "%s", moe_last_error());
        for (int j = 0; j < nj; j++) {
            int s = who[j], k = d.jobs[j].k;
            cr_assert(k >= 1, "a roomy pool proposes");
            int32_t want[8];
            struct moe_seq fresh = {0};
            cr_assert_eq(moe_runner_greedy(&ref, &fresh, tok[s], n[s], k, 0, want), MOE_OK, "%s",
                         moe_last_error());
            moe_seq_free(&ref, &fresh);
            for (int i = 0; i < k; i++)
                cr_assert_eq(tok[s][n[s] + i], want[i], "round %d sequence %d guess %d: %d, the "
                             "draft's greedy token %d", round, s, i, tok[s][n[s] + i], want[i]);
            proposals++;
            /* verification: a accepted, then a token of the target's */
            int a = (int)(tu_rand_u64(&seed) % (uint64_t)(k + 1));
            int32_t t = (int32_t)(tu_rand_u64(&seed) % 97);
            if (a < k && t == tok[s][n[s] + a]) t = (t + 1) % 97;
            if (a < k) rejections++;
            n[s] += a;
            tok[s][n[s]++] = t;
            moe_spec_draft_rollback(&d, &seq[s], n[s] - 1);
            cr_assert(seq[s].len <= n[s] - 1);
        }
    }
    cr_assert(proposals > 20 && rejections > 5 && plain > 5, "%d proposals, %d rejections, %d plain",
              proposals, rejections, plain);
    for (int s = 0; s < NS; s++) moe_spec_draft_seq_free(&d, &seq[s]);
    cr_assert_eq(moe_kvcache_available(&d.r.kv), d.r.kv.n_blocks, "every draft block back");
    moe_runner_free(&ref);
    moe_spec_draft_free(&d);
    moe_model_free(&dm);
}
