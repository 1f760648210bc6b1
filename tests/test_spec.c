/* test_spec.c - speculative decoding in the engine (engine.h, opts.spec)
 * must not change any request's output: greedy requests give the same
 * tokens, finish reasons and samples (log-probabilities bit for bit) with
 * speculation on and off, for K = 1, 2, 4, 8, on the synthetic model, every
 * fixture family and the demo model; seeded sampled requests give the
 * same tokens too; batched, under
 * preemption, with prefix sharing, with stop ids and stops from the
 * caller; the suite spec_fp8 runs the synthetic tests over an fp8 KV
 * cache, spec_cuda the synthetic and fixture ones on a GPU (skipped
 * without one).  The CPU backends are row-independent (docs/ARCHITECTURE.md), so
 * a verification row's logits are a decode row's, bit for bit: equality is
 * exact, no tolerance.  Prompts repeat text, so the n-gram proposer's
 * drafts are accepted; every run ends with every KV block free and only
 * verified tokens in the prefix cache. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/stats.h"
#include "runtime/engine/engine.h"
#include "runtime/text/tokenizer.h"
#include "tests/testutil.h"

static struct moe_backend be;
static enum moe_dtype kv_dtype = MOE_DTYPE_F32;
/* steps of at most this many rows (0: the test's own budget) */
static int max_step_rows;

static void setup_ref(void) { cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK); }
static void setup_fast(void) { cr_assert_eq(moe_backend_cpu_fast_init(&be, 1), MOE_OK); }
static void setup_fp8(void)
{
    kv_dtype = MOE_DTYPE_F8E4M3; /* rows quantize one token at a time */
    setup_ref();
}
static void setup_cuda(void)
{
    /* a row's results are independent of the other rows of its step on the
     * device up to MOE_SMALL_STEP_ROWS rows (docs/cuda.md, "Rows of one step") */
    max_step_rows = MOE_SMALL_STEP_ROWS;
    tu_need_cuda_device();
    cr_assert_eq(tu_backend_init(&be, "cuda"), MOE_OK, "%s", moe_last_error());
}
static void teardown(void) { moe_backend_free(&be); }

TestSuite(spec, .init = setup_ref, .fini = teardown);
TestSuite(spec_fast, .init = setup_fast, .fini = teardown);
TestSuite(spec_fp8, .init = setup_fp8, .fini = teardown);
/* On a GPU (tests/gpu/run.sh): a verification chunk's rows go through the
 * multi-row kernels, a decode row through the one-row ones; whether their
 * fp32 results agree bit for bit there is what this suite finds out. */
TestSuite(spec_cuda, .init = setup_cuda, .fini = teardown);

static void synthetic_model(struct moe_model *m) { tu_tiny_qwen3_moe(m, 2, 97, 11); }

#define MAXJ 16
#define MAXP 256
#define MAXO 48

struct job {
    int32_t prompt[MAXP];
    int n, arrive;
    int stop_at; /* >= 0: the caller stops the request at this output token (a stop string) */
    bool cuts_run; /* stop_at is a token a speculative run emitted with the next one */
    struct moe_request_params p;
};

struct result {
    int32_t out[MAXO];
    struct moe_sample s[MAXO];
    uint64_t step[MAXO]; /* the engine step that emitted each token */
    int n, last_step_tokens;
    uint64_t step_of_last;
    enum moe_finish finish;
    int drafted; /* tokens drafted for it */
};

struct run {
    struct moe_engine e;
    struct job *jobs;
    struct result *res;
    int nj;
};

static struct run *cur; /* Criterion forks each test: one run at a time */
static struct moe_stats *serve_stats; /* attached to the engines serve() builds, or NULL */

static void on_token(void *user, struct moe_request *r, int32_t token, bool finished)
{
    struct job *j = user;
    struct result *res = &cur->res[j - cur->jobs];
    if (token < 0) return;
    if (cur->e.n.steps == res->step_of_last) res->last_step_tokens++;
    else res->last_step_tokens = 1;
    res->step_of_last = cur->e.n.steps;
    res->step[r->n_tokens - r->n_prompt - 1] = cur->e.n.steps;
    if (!finished && r->n_tokens - r->n_prompt - 1 == j->stop_at) moe_engine_stop(&cur->e, r);
}

/* Every cached block holds B tokens of some request's verified tokens (those
 * with K/V: all but its last), at a block boundary, after its parent's. */
static void check_cache_verified(const struct moe_kvcache *kv, struct moe_request **req, int nj)
{
    const int B = kv->block_size;
    for (int b = 0; b < kv->n_blocks; b++) {
        const struct moe_kv_block *kb = &kv->blocks[b];
        if (!kb->cached) continue;
        const int32_t *t = kv->tokens + (size_t)b * B;
        /* a parent is known while it is cached, under the same generation
         * (a block registered after an identical one is not cached itself,
         * and its children are never found) */
        bool parent_known = kb->parent >= 0 && kv->blocks[kb->parent].cached &&
                            kv->blocks[kb->parent].gen == kb->parent_gen;
        bool found = false;
        for (int i = 0; i < nj && !found; i++)
            for (int k = 0; (k + 1) * B <= req[i]->n_tokens - 1 && !found; k++) {
                const int32_t *s = req[i]->tokens + (size_t)k * B;
                if (memcmp(s, t, (size_t)B * sizeof *t) != 0) continue;
                if (kb->parent < 0) found = k == 0;
                else found = k > 0 && (!parent_known ||
                                      memcmp(kv->tokens + (size_t)kb->parent * B, s - B,
                                             (size_t)B * sizeof *t) == 0);
            }
        cr_assert(found, "cached block %d holds tokens no request verified", b);
    }
}

/* Serves the jobs (job i submitted at step jobs[i].arrive) with options o;
 * fills res, checks the cache and that every block is free after. */
static struct moe_engine_counters serve(const struct moe_model *m, struct job *jobs, int nj,
                                        const struct moe_engine_opts *o, struct result *res)
{
    struct run run = {.jobs = jobs, .res = res, .nj = nj};
    cur = &run;
    memset(res, 0, (size_t)nj * sizeof *res);
    cr_assert_eq(moe_engine_init(&run.e, m, &be, o), MOE_OK, "%s", moe_last_error());
    run.e.on_token = on_token;
    run.e.r.fw.stats = serve_stats;
    struct moe_request *req[MAXJ] = {0};
    int step = 0, rows, submitted = 0;
    while (submitted < nj || !moe_engine_idle(&run.e)) {
        for (int i = 0; i < nj; i++)
            if (!req[i] && jobs[i].arrive <= step) {
                cr_assert_eq(moe_engine_submit(&run.e, jobs[i].prompt, jobs[i].n, &jobs[i].p,
                                               &jobs[i], &req[i]), MOE_OK, "%s", moe_last_error());
                submitted++;
            }
        cr_assert_eq(moe_engine_step(&run.e, &rows), MOE_OK, "%s", moe_last_error());
        cr_assert(++step < 20000, "the engine does not finish");
    }
    check_cache_verified(&run.e.r.kv, req, nj);
    for (int i = 0; i < nj; i++) {
        const int32_t *out = moe_request_output(req[i], &res[i].n);
        memcpy(res[i].out, out, (size_t)res[i].n * sizeof *out);
        memcpy(res[i].s, req[i]->samples, (size_t)res[i].n * sizeof *res[i].s);
        res[i].finish = req[i]->finish;
        res[i].drafted = req[i]->n_drafted;
        for (int k = 1; k < res[i].n; k++)
            cr_assert(req[i]->t_token[k] >= req[i]->t_token[k - 1], "token times in order");
        cr_assert(res[i].n == 0 || req[i]->t_first == req[i]->t_token[0]);
        moe_engine_release(&run.e, req[i]);
    }
    for (int b = 0; b < run.e.r.kv.n_blocks; b++)
        cr_assert_eq(run.e.r.kv.blocks[b].refcount, 0, "block %d still referenced", b);
    cr_assert_eq(moe_kvcache_available(&run.e.r.kv), run.e.r.kv.n_blocks, "every block back");
    struct moe_engine_counters n = run.e.n;
    moe_engine_free(&run.e);
    cur = NULL;
    return n;
}

static void expect_same(const struct result *a, const struct result *b, int nj, const char *what)
{
    for (int i = 0; i < nj; i++) {
        cr_assert_eq(a[i].n, b[i].n, "%s: request %d: %d tokens, without speculation %d", what, i,
                     a[i].n, b[i].n);
        cr_assert_eq(a[i].finish, b[i].finish, "%s: request %d finish", what, i);
        for (int k = 0; k < a[i].n; k++) {
            const struct moe_sample *x = &a[i].s[k], *y = &b[i].s[k];
            cr_assert_eq(a[i].out[k], b[i].out[k], "%s: request %d token %d: %d, without "
                         "speculation %d", what, i, k, a[i].out[k], b[i].out[k]);
            cr_assert(tu_same_bits(x->logprob, y->logprob) && x->n_top == y->n_top,
                      "%s: request %d token %d: logprob %.9g, without speculation %.9g", what, i,
                      k, x->logprob, y->logprob);
            for (int t = 0; t < x->n_top; t++)
                cr_assert(x->top_ids[t] == y->top_ids[t] &&
                          tu_same_bits(x->top_logprobs[t], y->top_logprobs[t]),
                          "%s: request %d token %d: top %d differs", what, i, k, t);
        }
    }
}

/* Prompts that repeat text (a random phrase said two to four times, a
 * random token between), so the n-gram proposer finds matches; every
 * fourth job has a random prompt.  Parameters cycle: plain greedy (the
 * backend's argmax), sampled at temperature 0.8 (seeded: the same draws
 * with speculation, which keeps a draft when the draw equals it),
 * greedy with log-probabilities, greedy with a repetition penalty and a
 * log-probability (both through the host sampler). */
static void make_jobs(struct job *jobs, int nj, int vocab, uint64_t seed)
{
    for (int i = 0; i < nj; i++) {
        struct job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        int n = 0;
        if (i % 4 == 3) {
            n = 4 + (int)(tu_rand_u64(&seed) % 40);
            for (int k = 0; k < n; k++) j->prompt[k] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)vocab);
        } else {
            int32_t phrase[12];
            int len = 4 + (int)(tu_rand_u64(&seed) % 9), reps = 2 + (int)(tu_rand_u64(&seed) % 3);
            for (int k = 0; k < len; k++) phrase[k] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)vocab);
            for (int r = 0; r < reps; r++) {
                memcpy(j->prompt + n, phrase, (size_t)len * sizeof *phrase);
                n += len;
                j->prompt[n++] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)vocab);
            }
            memcpy(j->prompt + n, phrase, (size_t)(len / 2) * sizeof *phrase);
            n += len / 2;
        }
        j->n = n;
        j->arrive = (int)(tu_rand_u64(&seed) % 6);
        j->stop_at = -1;
        j->p.max_tokens = 8 + (int)(tu_rand_u64(&seed) % (MAXO - 8));
        moe_sampling_defaults(&j->p.sampling);
        j->p.sampling.seed = 1000 + (uint64_t)i;
        if (i % 4 == 1) j->p.sampling.temperature = 0.8f;
        if (i % 4 == 2) {
            j->p.sampling.logprob = true;
            j->p.sampling.n_logprobs = 3;
        }
        if (i % 4 == 3) {
            j->p.sampling.repetition_penalty = 1.3f;
            j->p.sampling.logprob = true;
        }
    }
}

/* The first output token that came as an accepted draft (emitted in the
 * same step as the next one), or -1. */
static int first_accepted_draft(const struct result *res)
{
    for (int k = 0; k + 1 < res->n; k++)
        if (res->step[k] == res->step[k + 1]) return k;
    return -1;
}

/* Stops inside the outputs of a speculative run without them.  A job
 * with an accepted draft stops there: even jobs at its id (an EOS; it
 * fires where the id first appears), odd ones by the caller at that token
 * (a stop string seen there, inside an accepted run: in a run whose drafts
 * no budget or pool limit shortens, a request's verification runs depend
 * on its tokens alone, so the same run is cut).  Of the others, job
 * 3i ends at the id it emits halfway, job 3i + 1 is stopped by the caller
 * a third of the way. */
static void add_stops(struct job *jobs, int nj, const struct result *res)
{
    for (int i = 0; i < nj; i++) {
        if (res[i].n < 3) continue;
        int k = first_accepted_draft(&res[i]);
        if (k >= 0 && i % 2 == 0) {
            jobs[i].p.stop_ids[0] = res[i].out[k];
            jobs[i].p.n_stop_ids = 1;
        } else if (k >= 0) {
            jobs[i].stop_at = k;
            jobs[i].cuts_run = true;
        } else if (i % 3 == 0) {
            jobs[i].p.stop_ids[0] = res[i].out[res[i].n / 2];
            jobs[i].p.n_stop_ids = 1;
        } else if (i % 3 == 1) {
            jobs[i].stop_at = res[i].n / 3;
        }
    }
}

static struct moe_engine_opts opts(int n_blocks, int batch_tokens, bool prefix)
{
    if (max_step_rows && batch_tokens > max_step_rows) batch_tokens = max_step_rows;
    return (struct moe_engine_opts){.max_batch_tokens = batch_tokens, .max_seqs = 8,
                                    .block_size = 4, .n_blocks = n_blocks,
                                    .kv_dtype = kv_dtype, .prefix_cache = prefix};
}

struct totals {
    uint64_t accepted, drafted, preemptions, prefix_hits;
    uint64_t sampled_drafted; /* tokens drafted for sampled requests */
    int stops_in_accepted_run; /* caller stops that cut a verification run */
};

/* Serves the jobs without speculation, then with it for K = 1, 2, 4, 8:
 * the same outputs each time.  Returns what the speculative runs did. */
static struct totals spec_matches_plain(const struct moe_model *m, struct job *jobs, int nj,
                                        struct moe_engine_opts o, const char *what)
{
    static struct result plain[MAXJ], spec[MAXJ];
    struct totals t = {0};
    struct moe_engine_counters np = serve(m, jobs, nj, &o, plain);
    /* K = 1, 2, 4, 8, then adaptive K up to 8 */
    static const int ks[] = {1, 2, 4, 8, 8};
    for (int i = 0; i < 5; i++) {
        struct moe_engine_opts so = o;
        so.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .tokens = ks[i], .adaptive = i == 4};
        struct moe_engine_counters n = serve(m, jobs, nj, &so, spec);
        char label[96];
        snprintf(label, sizeof label, "%s, K = %d%s", what, ks[i], i == 4 ? " adaptive" : "");
        expect_same(spec, plain, nj, label);
        cr_assert_eq(n.generated_tokens, np.generated_tokens, "%s", label);
        cr_assert(n.spec_draft_tokens > 0, "%s: nothing drafted", label);
        cr_assert(n.spec_accepted <= n.spec_draft_tokens);
        uint64_t sum = 0;
        for (int k = 0; k < MOE_SPEC_MAX_TOKENS; k++) {
            sum += n.spec_accepted_at[k];
            if (k > 0) cr_assert(n.spec_accepted_at[k] <= n.spec_accepted_at[k - 1]);
            if (k >= ks[i]) cr_assert_eq(n.spec_accepted_at[k], 0);
        }
        cr_assert_eq(sum, n.spec_accepted, "%s: accepted per position adds up", label);
        t.accepted += n.spec_accepted;
        t.drafted += n.spec_draft_tokens;
        t.preemptions += n.preemptions;
        t.prefix_hits += n.prefix_hit_tokens;
        for (int j = 0; j < nj; j++)
            if (!moe_sampling_is_greedy(&jobs[j].p.sampling)) t.sampled_drafted += spec[j].drafted;
        for (int j = 0; j < nj; j++)
            if (jobs[j].cuts_run && spec[j].finish == MOE_FINISH_STOP &&
                spec[j].n == jobs[j].stop_at + 1)
                t.stops_in_accepted_run++;
    }
    return t;
}

/* The synthetic model, batched requests of every kind, then again with
 * stop ids (among them accepted drafts) and caller stops inside their
 * outputs. */
static void synthetic_matches_plain(void)
{
    struct moe_model m;
    synthetic_model(&m);
    static struct job jobs[12];
    static struct result spec[12];
    make_jobs(jobs, 12, 97, 5);
    struct moe_engine_opts o = opts(256, 1024, false);
    struct totals t = spec_matches_plain(&m, jobs, 12, o, "synthetic");
    cr_assert(t.accepted > 0, "repeated text gets drafts accepted");
    cr_assert(t.sampled_drafted > 0, "sampled requests speculate");
    struct moe_engine_opts so = o;
    so.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .tokens = 4};
    serve(&m, jobs, 12, &so, spec);
    add_stops(jobs, 12, spec);
    t = spec_matches_plain(&m, jobs, 12, o, "synthetic, stops");
    cr_assert(t.stops_in_accepted_run > 0, "a stop cut an accepted run");
    moe_model_free(&m);
}
Test(spec, synthetic_greedy_matches_plain) { synthetic_matches_plain(); }
Test(spec_fast, synthetic_greedy_matches_plain) { synthetic_matches_plain(); }
Test(spec_fp8, synthetic_greedy_matches_plain) { synthetic_matches_plain(); }
Test(spec_cuda, synthetic_greedy_matches_plain) { synthetic_matches_plain(); }

/* A 24-block pool: requests are preempted and recomputed. */
static void preemption_matches_plain(void)
{
    struct moe_model m;
    synthetic_model(&m);
    static struct job jobs[12];
    make_jobs(jobs, 12, 97, 9);
    struct totals t = spec_matches_plain(&m, jobs, 12, opts(24, 64, false), "preemption");
    cr_assert(t.preemptions > 0, "a 24-block pool must preempt");
    cr_assert(t.accepted > 0);
    moe_model_free(&m);
}
Test(spec, preemption_matches_plain) { preemption_matches_plain(); }
Test(spec_fp8, preemption_matches_plain) { preemption_matches_plain(); }

/* A step budget of 6 rows for 8 sequences: drafts are cut to what is left
 * of it, and prefill chunks share steps with verification chunks. */
Test(spec, tight_budget_matches_plain)
{
    struct moe_model m;
    synthetic_model(&m);
    static struct job jobs[12];
    make_jobs(jobs, 12, 97, 11);
    struct totals t = spec_matches_plain(&m, jobs, 12, opts(256, 6, false), "budget 6");
    cr_assert(t.accepted > 0);
    moe_model_free(&m);
}

/* Pairs of requests share their prompts' first half; the prefix cache is
 * on, and the serve() check finds only verified tokens in it. */
static void prefix_sharing_matches_plain(void)
{
    struct moe_model m;
    synthetic_model(&m);
    static struct job jobs[12];
    make_jobs(jobs, 12, 97, 13);
    for (int i = 1; i < 12; i += 2) {
        int n = jobs[i - 1].n / 2 < jobs[i].n ? jobs[i - 1].n / 2 : jobs[i].n;
        memcpy(jobs[i].prompt, jobs[i - 1].prompt, (size_t)n * sizeof *jobs[i].prompt);
        jobs[i].arrive = jobs[i - 1].arrive + 3;
    }
    struct totals t = spec_matches_plain(&m, jobs, 12, opts(256, 64, true), "prefix sharing");
    cr_assert(t.prefix_hits > 0, "prompts share cached blocks");
    cr_assert(t.accepted > 0);
    moe_model_free(&m);
}
Test(spec, prefix_sharing_matches_plain) { prefix_sharing_matches_plain(); }
Test(spec_fp8, prefix_sharing_matches_plain) { prefix_sharing_matches_plain(); }

static void families_match_plain(void)
{
    static const char *names[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama", "qwen2",
                                  "qwen3", "granitemoe", "granitemoeshared", "granite", "glm4_moe",
                                  "gpt_oss", "gpt_oss_mxfp4", "deepseek_v2", "deepseek_v3",
                                  "deepseek_v3_fp8", "qwen3_moe_fp8", "minimax_m2", "llama4"};
    uint64_t accepted = 0;
    for (size_t f = 0; f < sizeof names / sizeof *names; f++) {
        if (!be.ops->scale_rows && !strcmp(names[f], "llama4")) continue; /* refused there (CUDA) */
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, names[f]);
        struct moe_model m;
        cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s: %s", names[f], moe_last_error());
        static struct job jobs[8];
        make_jobs(jobs, 8, m.cfg.vocab, 17 + f);
        struct totals t = spec_matches_plain(&m, jobs, 8, opts(256, 64, true), names[f]);
        /* random weights: how often a draft is right is the model's affair
         * (gpt_oss accepts none of these); the total is not zero */
        cr_log_info("%s: %llu of %llu drafted tokens accepted", names[f],
                    (unsigned long long)t.accepted, (unsigned long long)t.drafted);
        accepted += t.accepted;
        moe_model_free(&m);
    }
    cr_assert(accepted > 0);
}
Test(spec, fixture_families_match_plain, .timeout = 600) { families_match_plain(); }
Test(spec_fast, fixture_families_match_plain, .timeout = 600) { families_match_plain(); }
Test(spec_cuda, fixture_families_match_plain, .timeout = 600) { families_match_plain(); }

/* The demo model (trained on a story grammar): prompts that quote a story
 * and start it again, so the proposer's copies are what the model says. */
Test(spec, demo_model_matches_plain, .timeout = 600)
{
    static const char *texts[] = {
        "Once upon a time, there was a little cat named Tom. Tom liked to play in the park. "
        "One day, Tom found a ball near the river. Tom felt happy. Then Tom met a kind dog. "
        "They decided to run together. The dog shared the ball with Tom. They became good "
        "friends. The end. Once upon a time, there was a little cat named Tom. Tom liked to",
        "Once upon a time, there was a brave fox named Mia. Mia liked to swim in the lake. "
        "One day, Mia found a kite near the farm. Mia felt",
        "Once upon a time, there was a sleepy owl named Leo. Leo liked to read in the forest. "
        "The end. Once upon a time, there was a sleepy owl named Leo.",
        "Once upon a time, there was a shy duck named Ben. Ben liked to",
    };
    const char *dir = MOERUN_SOURCE_DIR "/models/demo-moe";
    struct moe_model m;
    struct moe_tokenizer tok;
    cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_tokenizer_load(&tok, dir), MOE_OK, "%s", moe_last_error());
    static struct job jobs[8];
    make_jobs(jobs, 8, m.cfg.vocab, 21); /* parameters and arrivals; prompts below */
    for (int i = 0; i < 8; i++) {
        int32_t *ids;
        size_t n;
        const char *t = texts[i % 4];
        cr_assert_eq(moe_tokenizer_encode(&tok, t, strlen(t), false, &ids, &n, NULL), MOE_OK);
        cr_assert(n > 0 && n <= MAXP, "%zu prompt tokens", n);
        memcpy(jobs[i].prompt, ids, n * sizeof *ids);
        jobs[i].n = (int)n;
        free(ids);
    }
    struct totals t = spec_matches_plain(&m, jobs, 8, opts(512, 64, true), "demo-moe");
    cr_assert(t.accepted > 0, "the quoted story gets drafts accepted");
    cr_log_info("demo-moe: %llu of %llu drafted tokens accepted over K = 1, 2, 4, 8",
                (unsigned long long)t.accepted, (unsigned long long)t.drafted);
    moe_tokenizer_free(&tok);
    moe_model_free(&m);
}

/* A request of the churn: one of seven jobs, max_tokens 1..24. */
static void churn_request(void *ctx, uint64_t *seed, const int32_t **prompt, int *n,
                          struct moe_request_params *p)
{
    const struct job *j = (const struct job *)ctx + tu_rand_u64(seed) % 7;
    *prompt = j->prompt;
    *n = j->n;
    *p = j->p;
    p->max_tokens = 1 + (int)(tu_rand_u64(seed) % 24);
}

/* 1,000 speculative requests (few distinct prompts, so prefixes are shared
 * and drafts accepted) in a 40-block pool, a ninth of the live ones
 * cancelled at random moments each step: afterwards no block is referenced. */
Test(spec, cancellation_leaks_no_block)
{
    struct moe_model m;
    synthetic_model(&m);
    struct moe_engine_opts o = opts(40, 48, true);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .tokens = 4};
    struct moe_engine e;
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    static struct job kinds[7];
    make_jobs(kinds, 7, 97, 31);
    tu_engine_churn(&e, 1000, 24, 77, churn_request, NULL, kinds);
    cr_assert(e.n.requests_aborted > 50, "cancellations happened (%llu)",
              (unsigned long long)e.n.requests_aborted);
    cr_assert(e.n.spec_accepted > 0 && e.n.prefix_hit_tokens > 0);
    tu_expect_pools_free(&e);
    moe_engine_free(&e);
    moe_model_free(&m);
}

/* Above max_batch running requests nothing is drafted: four requests that
 * run side by side from the first step to the last. */
Test(spec, max_batch_turns_speculation_off)
{
    struct moe_model m;
    synthetic_model(&m);
    static struct job jobs[4];
    static struct result res[4];
    make_jobs(jobs, 4, 97, 5);
    for (int i = 0; i < 4; i++) {
        jobs[i] = jobs[0];
        jobs[i].arrive = 0;
    }
    struct moe_engine_opts o = opts(256, 256, false);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .max_batch = 3};
    struct moe_engine_counters n = serve(&m, jobs, 4, &o, res);
    cr_assert_eq(n.spec_drafts, 0, "four running requests, limit 3");
    o.spec.max_batch = 4;
    n = serve(&m, jobs, 4, &o, res);
    cr_assert(n.spec_drafts > 0, "limit 4");
    moe_model_free(&m);
}

Test(spec, refuses_bad_settings)
{
    struct moe_model m;
    synthetic_model(&m);
    struct moe_engine e;
    struct moe_engine_opts o = opts(64, 64, false);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .tokens = MOE_SPEC_MAX_TOKENS + 1};
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "17 speculative tokens (1 to 16)"), "%s", moe_last_error());
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .ngram_min = 3, .ngram_max = 2};
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "n-gram sizes 3..2"), "%s", moe_last_error());
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_MTP};
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "needs the checkpoint's multi-token-prediction module"),
              "%s", moe_last_error());
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM};
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    cr_assert(e.o.spec.tokens == 4 && e.o.spec.ngram_max == 3 && e.o.spec.ngram_min == 1,
              "the defaults");
    moe_engine_free(&e);
    moe_model_free(&m);
}

/* Adaptive K: a request whose drafts are all accepted (greedy, with a
 * logit bias that makes token 5 the target's every choice, after a prompt
 * of 5s) drafts 2 tokens first (no history: acceptance 1/2) and then the
 * full 8; one whose drafts are rarely accepted (sampled at temperature 4
 * among four tokens a bias makes the only candidates, after a prompt that
 * cycles through them, so the proposer always drafts) drafts a single
 * token once its history shows it. */
static void adaptive_drafts(const struct moe_model *m, const int32_t *prompt,
                            const struct moe_sampling *sp, int *drafted, int max_steps)
{
    struct moe_engine e;
    struct moe_engine_opts o = opts(256, 256, false);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .tokens = 8, .adaptive = true};
    cr_assert_eq(moe_engine_init(&e, m, &be, &o), MOE_OK, "%s", moe_last_error());
    struct moe_request *r;
    struct moe_request_params p = {.max_tokens = 120, .sampling = *sp};
    cr_assert_eq(moe_engine_submit(&e, prompt, 8, &p, NULL, &r), MOE_OK, "%s", moe_last_error());
    int rows;
    for (int s = 0; s < max_steps; s++) {
        drafted[s] = 0;
        if (r->state == MOE_REQ_FINISHED) continue;
        cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK, "%s", moe_last_error());
        drafted[s] = e.drafted[0];
    }
    moe_engine_release(&e, r);
    moe_engine_free(&e);
}

Test(spec, adaptive_k_follows_acceptance)
{
    struct moe_model m;
    synthetic_model(&m);
    struct moe_sampling sp;
    moe_sampling_defaults(&sp);
    sp.n_bias = 1;
    sp.bias_ids[0] = 5;
    sp.bias[0] = 100.0f;
    int d[16];
    const int32_t fives[8] = {5, 5, 5, 5, 5, 5, 5, 5}, four[8] = {5, 6, 7, 8, 5, 6, 7, 8};
    adaptive_drafts(&m, fives, &sp, d, 12);
    cr_assert_eq(d[0], 0, "the prefill step drafts nothing");
    cr_assert_eq(d[1], 2, "the first verification drafts 2, not %d", d[1]);
    for (int s = 2; s < 8; s++) cr_assert_eq(d[s], 8, "step %d drafts %d, not 8", s, d[s]);
    moe_sampling_defaults(&sp);
    sp.temperature = 4.0f;
    sp.seed = 3;
    sp.n_bias = 4;
    for (int i = 0; i < 4; i++) {
        sp.bias_ids[i] = 5 + i;
        sp.bias[i] = 100.0f;
    }
    adaptive_drafts(&m, four, &sp, d, 16);
    int ones = 0;
    for (int s = 8; s < 16; s++) ones += d[s] == 1;
    cr_assert(ones >= 6, "rarely accepted drafts shrink to one token: %d of 8 steps", ones);
    moe_model_free(&m);
}

/* Expert-load statistics under speculation: every computed row counts,
 * verification rows apart, and once the rows of rejected drafts are taken
 * out (tokens_spec_rejected), what is left is, expert by expert, what the
 * same requests routed without speculation (no preemption here, so both
 * runs compute each kept token once).  Each verification chunk of n rows
 * reports the distinct experts it touched per layer, between K (top-k of
 * one row) and min(E, n K). */
Test(spec, stats_accepted_rows_are_the_plain_runs)
{
    struct moe_model m;
    synthetic_model(&m);
    static struct job jobs[12];
    static struct result res[12];
    make_jobs(jobs, 12, 97, 9);
    struct moe_stats plain, spec;
    cr_assert_eq(moe_stats_init(&plain, &m.cfg, NULL), MOE_OK);
    cr_assert_eq(moe_stats_init(&spec, &m.cfg, NULL), MOE_OK);
    struct moe_engine_opts o = opts(256, 1024, false);
    serve_stats = &plain;
    serve(&m, jobs, 12, &o, res);
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .tokens = 4};
    serve_stats = &spec;
    struct moe_engine_counters n = serve(&m, jobs, 12, &o, res);
    serve_stats = NULL;
    const int E = spec.E, K = spec.K;
    cr_assert(n.spec_accepted > 0 && n.spec_accepted < n.spec_draft_tokens);
    cr_assert_eq(spec.tokens_verify, (int64_t)(n.spec_drafts + n.spec_draft_tokens),
                 "every row of every verification chunk");
    cr_assert(spec.tokens_spec_rejected > 0 &&
              spec.tokens_spec_rejected <= (int64_t)(n.spec_draft_tokens - n.spec_accepted));
    cr_assert_eq(spec.tokens_prefill + spec.tokens_decode - spec.tokens_spec_rejected,
                 plain.tokens_prefill + plain.tokens_decode);
    for (int j = 0; j < spec.Lm; j++)
        for (int e = 0; e < E; e++) {
            size_t o2 = (size_t)j * E + e;
            int64_t kept = spec.prefill[o2] + spec.decode[o2] - spec.spec_rejected[o2];
            cr_assert_eq(kept, plain.prefill[o2] + plain.decode[o2],
                         "layer %d expert %d: %lld accepted pairs, %lld without speculation", j, e,
                         (long long)kept, (long long)(plain.prefill[o2] + plain.decode[o2]));
            cr_assert(spec.verify[o2] <= spec.decode[o2] && spec.spec_rejected[o2] <= spec.verify[o2]);
            cr_assert_eq(plain.verify[o2], 0);
        }
    int64_t chunks = 0;
    for (int r = 1; r <= MOE_STATS_SPEC_ROWS; r++) {
        chunks += spec.spec_chunks[r];
        if (!spec.spec_chunks[r]) continue;
        double mean = (double)spec.spec_distinct[r] / ((double)spec.spec_chunks[r] * spec.Lm);
        cr_assert(r >= 2 && r <= 5, "chunks of %d rows with K = 4", r);
        cr_assert(mean >= K && mean <= (r * K < E ? r * K : E), "%d rows: %.2f distinct experts", r,
                  mean);
    }
    cr_assert_eq(chunks, (int64_t)n.spec_drafts);
    moe_stats_free(&plain);
    moe_stats_free(&spec);
    moe_model_free(&m);
}
