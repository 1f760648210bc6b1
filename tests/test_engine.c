/* test_engine.c - continuous batching must not change any request's output:
 * mixed lengths and arrivals, preemption under a small KV budget, prefix
 * reuse, cancellation, thousands of requests without a leaked block.  The
 * suite engine_fp8 runs the batching, preemption and prefix tests again
 * over an fp8 KV cache (kvcache.h): its rows quantize one token at a time,
 * so it keeps every request's output independent of its neighbours too. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine.h"
#include "tests/testutil.h"

static struct moe_model model;
static struct moe_backend be;
static enum moe_dtype kv_dtype = MOE_DTYPE_F32;

static void setup(void)
{
    tu_tiny_qwen3_moe(&model, 2, 97, 11);
    cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK);
}

static void setup_fp8(void)
{
    kv_dtype = MOE_DTYPE_F8E4M3;
    setup();
}

static void teardown(void)
{
    moe_backend_free(&be);
    moe_model_free(&model);
}

/* A hybrid model (Qwen3-Next: linear-attention layers with a recurrent
 * state slot per sequence beside the paged KV of its attention layer) */
static void setup_hybrid(void)
{
    cr_assert_eq(moe_model_load(&model, FIXTURE_DIR "/qwen3_next"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK);
}

TestSuite(engine, .init = setup, .fini = teardown);
TestSuite(engine_fp8, .init = setup_fp8, .fini = teardown);
TestSuite(engine_hybrid, .init = setup_hybrid, .fini = teardown);

static void engine_open(struct moe_engine *e, int n_blocks, int block, int batch_tokens,
                        bool prefix)
{
    struct moe_engine_opts o = {.max_batch_tokens = batch_tokens, .max_seqs = 8,
                                .block_size = block, .n_blocks = n_blocks,
                                .kv_dtype = kv_dtype, .prefix_cache = prefix};
    cr_assert_eq(moe_engine_init(e, &model, &be, &o), MOE_OK, "%s", moe_last_error());
}

static void make_prompt(int32_t *p, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) p[i] = (int32_t)(tu_rand_u64(&seed) % 97);
}

static struct moe_request_params params(int max_tokens, float temperature, uint64_t seed)
{
    struct moe_request_params p = {.max_tokens = max_tokens};
    moe_sampling_defaults(&p.sampling);
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    return p;
}

/* Output of one request served alone by a fresh engine. */
static void solo(const int32_t *prompt, int n, const struct moe_request_params *p, int32_t *out,
                 int *n_out)
{
    struct moe_engine e;
    engine_open(&e, 64, 4, 64, false);
    struct moe_request *r;
    cr_assert_eq(moe_engine_submit(&e, prompt, n, p, NULL, &r), MOE_OK, "%s", moe_last_error());
    int rows;
    while (!moe_engine_idle(&e)) cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK, "%s", moe_last_error());
    const int32_t *o = moe_request_output(r, n_out);
    memcpy(out, o, (size_t)*n_out * sizeof *out);
    moe_engine_release(&e, r);
    moe_engine_free(&e);
}

#define NREQ 12

struct scenario {
    int32_t prompt[NREQ][64];
    int len[NREQ], arrive[NREQ];
    struct moe_request_params p[NREQ];
};

static void make_scenario(struct scenario *s, float temperature)
{
    uint64_t seed = 5;
    for (int i = 0; i < NREQ; i++) {
        s->len[i] = 1 + (int)(tu_rand_u64(&seed) % 60);
        s->arrive[i] = (int)(tu_rand_u64(&seed) % 10);
        make_prompt(s->prompt[i], s->len[i], 100 + (uint64_t)i);
        s->p[i] = params(1 + (int)(tu_rand_u64(&seed) % 20), temperature, 1000 + (uint64_t)i);
    }
}

/* Serves the scenario with continuous batching; checks each output equals
 * its solo output.  Returns the engine counters. */
static struct moe_engine_counters serve(struct scenario *s, int n_blocks, int block,
                                        int batch_tokens, bool prefix)
{
    struct moe_engine e;
    engine_open(&e, n_blocks, block, batch_tokens, prefix);
    struct moe_request *req[NREQ] = {0};
    int step = 0, rows;
    for (;;) {
        for (int i = 0; i < NREQ; i++)
            if (!req[i] && s->arrive[i] <= step)
                cr_assert_eq(moe_engine_submit(&e, s->prompt[i], s->len[i], &s->p[i], NULL, &req[i]),
                             MOE_OK, "%s", moe_last_error());
        bool all = true;
        for (int i = 0; i < NREQ; i++) all &= req[i] != NULL;
        if (all && moe_engine_idle(&e)) break;
        cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK, "%s", moe_last_error());
        step++;
        cr_assert(step < 10000, "engine does not finish");
    }
    for (int i = 0; i < NREQ; i++) {
        int32_t want[64];
        int n_want, n_got;
        solo(s->prompt[i], s->len[i], &s->p[i], want, &n_want);
        const int32_t *got = moe_request_output(req[i], &n_got);
        cr_assert_eq(req[i]->finish, MOE_FINISH_LENGTH);
        cr_assert_eq(n_got, n_want, "request %d: %d tokens, alone %d", i, n_got, n_want);
        for (int k = 0; k < n_got; k++)
            cr_assert_eq(got[k], want[k], "request %d token %d: %d, alone %d", i, k, got[k], want[k]);
        moe_engine_release(&e, req[i]);
    }
    struct moe_engine_counters n = e.n;
    cr_assert_eq(moe_kvcache_available(&e.r.kv), e.r.kv.n_blocks, "every block back");
    moe_engine_free(&e);
    return n;
}

static void continuous_batching_matches_solo_greedy(void)
{
    struct scenario s;
    make_scenario(&s, 0.0f);
    struct moe_engine_counters n = serve(&s, 256, 4, 32, false);
    cr_assert_eq(n.preemptions, 0);
}
Test(engine, continuous_batching_matches_solo_greedy) { continuous_batching_matches_solo_greedy(); }
Test(engine_fp8, continuous_batching_matches_solo_greedy) { continuous_batching_matches_solo_greedy(); }
Test(engine_hybrid, continuous_batching_matches_solo_greedy) { continuous_batching_matches_solo_greedy(); }

static void continuous_batching_matches_solo_sampled(void)
{
    struct scenario s;
    make_scenario(&s, 0.9f);
    serve(&s, 256, 4, 48, true);
}
Test(engine, continuous_batching_matches_solo_sampled) { continuous_batching_matches_solo_sampled(); }
Test(engine_fp8, continuous_batching_matches_solo_sampled) { continuous_batching_matches_solo_sampled(); }
Test(engine_hybrid, continuous_batching_matches_solo_sampled) { continuous_batching_matches_solo_sampled(); }

static void preemption_keeps_outputs_identical(void)
{
    struct scenario s;
    make_scenario(&s, 0.0f);
    struct moe_engine_counters n = serve(&s, 24, 4, 64, false);
    cr_assert(n.preemptions > 0, "a 24-block pool must preempt");
    make_scenario(&s, 0.8f);
    n = serve(&s, 24, 4, 64, true);
    cr_assert(n.preemptions > 0);
}
Test(engine, preemption_keeps_outputs_identical) { preemption_keeps_outputs_identical(); }
Test(engine_fp8, preemption_keeps_outputs_identical) { preemption_keeps_outputs_identical(); }
/* a preempted hybrid request gives its state slot back and recomputes it
 * from position 0 */
Test(engine_hybrid, preemption_keeps_outputs_identical) { preemption_keeps_outputs_identical(); }

static void shared_prefix_reuses_blocks(void)
{
    struct moe_engine e;
    engine_open(&e, 64, 4, 64, true);
    int32_t a[30], b[30];
    make_prompt(a, 30, 1);
    memcpy(b, a, 22 * sizeof *a); /* 22 shared tokens: 5 full blocks of 4 */
    make_prompt(b + 22, 8, 2);
    struct moe_request_params p = params(6, 0.0f, 0);
    struct moe_request *ra, *rb;
    int rows;
    cr_assert_eq(moe_engine_submit(&e, a, 30, &p, NULL, &ra), MOE_OK);
    while (!moe_engine_idle(&e)) cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK);
    cr_assert_eq(moe_engine_submit(&e, b, 30, &p, NULL, &rb), MOE_OK);
    while (!moe_engine_idle(&e)) cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK);
    cr_assert_eq(rb->n_prefix_hit, 20, "5 blocks of 4 reused");
    cr_assert_eq(rb->n_prefilled, 10, "only the 10 new prompt tokens computed");
    int32_t want[8];
    int n_want, n_got;
    solo(b, 30, &p, want, &n_want);
    const int32_t *got = moe_request_output(rb, &n_got);
    cr_assert_eq(n_got, n_want);
    cr_assert(memcmp(got, want, (size_t)n_got * sizeof *got) == 0, "same output as without sharing");
    /* the same prompt again: all but the last block come from the cache */
    struct moe_request *rc;
    cr_assert_eq(moe_engine_submit(&e, a, 30, &p, NULL, &rc), MOE_OK);
    while (!moe_engine_idle(&e)) cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK);
    cr_assert_eq(rc->n_prefix_hit, 28);
    int n_a, n_c;
    const int32_t *oa = moe_request_output(ra, &n_a), *oc = moe_request_output(rc, &n_c);
    cr_assert(n_a == n_c && memcmp(oa, oc, (size_t)n_a * sizeof *oa) == 0);
    /* a prompt of exactly two blocks: the second block is recomputed, since
     * the last prompt token's logits are needed */
    struct moe_request *rd, *re;
    cr_assert_eq(moe_engine_submit(&e, a, 8, &p, NULL, &rd), MOE_OK);
    while (!moe_engine_idle(&e)) cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK);
    cr_assert_eq(moe_engine_submit(&e, a, 8, &p, NULL, &re), MOE_OK);
    for (int i = 0; i < 50 && !moe_engine_idle(&e); i++) cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK);
    cr_assert_eq(re->state, MOE_REQ_FINISHED);
    cr_assert_eq(re->n_prefix_hit, 4);
    moe_engine_release(&e, ra);
    moe_engine_release(&e, rb);
    moe_engine_release(&e, rc);
    moe_engine_release(&e, rd);
    moe_engine_release(&e, re);
    moe_engine_free(&e);
}
Test(engine, shared_prefix_reuses_blocks) { shared_prefix_reuses_blocks(); }
Test(engine_fp8, shared_prefix_reuses_blocks) { shared_prefix_reuses_blocks(); }

Test(engine, refuses_what_cannot_fit)
{
    struct moe_engine e;
    engine_open(&e, 4, 4, 64, false); /* 16 token slots */
    int32_t p[20];
    make_prompt(p, 20, 3);
    struct moe_request_params rp = params(4, 0.0f, 0);
    struct moe_request *r;
    cr_assert_eq(moe_engine_submit(&e, p, 20, &rp, NULL, &r), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "cache holds only 4 blocks"), "%s", moe_last_error());
    cr_assert_eq(moe_engine_submit(&e, p, 0, &rp, NULL, &r), MOE_ERR_INVALID_ARG);
    rp.max_tokens = 250;
    cr_assert_eq(moe_engine_submit(&e, p, 10, &rp, NULL, &r), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "context of 256"), "%s", moe_last_error());
    p[3] = 97;
    rp.max_tokens = 2;
    cr_assert_eq(moe_engine_submit(&e, p, 10, &rp, NULL, &r), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "outside the vocabulary"), "%s", moe_last_error());
    cr_assert(moe_engine_idle(&e));
    moe_engine_free(&e);
}

/* A request of the churn: 1..12 tokens of one of seven prompts (so
 * prefixes are shared), 1..6 new tokens sampled at temperature 0.5. */
static void churn_request(void *ctx, uint64_t *seed, const int32_t **prompt, int *n,
                          struct moe_request_params *p)
{
    static int32_t buf[12];
    (void)ctx;
    *n = 1 + (int)(tu_rand_u64(seed) % 12);
    make_prompt(buf, *n, tu_rand_u64(seed) % 7);
    *prompt = buf;
    *p = params(1 + (int)(tu_rand_u64(seed) % 6), 0.5f, *seed);
}

/* 3000 short requests, a third cancelled at random moments: afterwards no
 * block is referenced. */
Test(engine, thousands_of_requests_leak_no_block)
{
    struct moe_engine e;
    engine_open(&e, 40, 4, 48, true);
    tu_engine_churn(&e, 3000, 64, 77, churn_request, NULL, NULL);
    cr_assert(e.n.requests_aborted > 100, "cancellations happened (%llu)",
              (unsigned long long)e.n.requests_aborted);
    cr_assert(e.n.prefix_hit_tokens > 0);
    tu_expect_pools_free(&e);
    moe_engine_free(&e);
}

/* 1000 requests on the hybrid model, a third cancelled: every block and
 * every recurrent-state slot back; the prefix cache, asked for, is off */
Test(engine_hybrid, a_thousand_requests_leak_no_state_slot)
{
    struct moe_engine e;
    engine_open(&e, 40, 4, 48, true);
    cr_assert(!e.r.kv.prefix_cache, "no prefix cache over recurrent state");
    cr_assert_eq(e.r.kv.n_state_slots, 8, "a slot per sequence of a step");
    tu_engine_churn(&e, 1000, 64, 77, churn_request, NULL, NULL);
    cr_assert(e.n.requests_aborted > 50, "cancellations happened (%llu)", (unsigned long long)e.n.requests_aborted);
    cr_assert_eq(e.n.prefix_hit_tokens, 0);
    tu_expect_pools_free(&e);
    moe_engine_free(&e);
}

/* Speculative decoding would have to rewind the recurrent state: refused. */
Test(engine_hybrid, refuses_speculation)
{
    struct moe_engine e;
    struct moe_engine_opts o = {.max_batch_tokens = 32, .max_seqs = 4, .block_size = 4, .n_blocks = 32,
                                .kv_dtype = MOE_DTYPE_F32,
                                .spec = {.kind = MOE_SPEC_NGRAM, .tokens = 3}};
    cr_assert_eq(moe_engine_init(&e, &model, &be, &o), MOE_ERR_UNSUPPORTED);
    cr_expect(strstr(moe_last_error(), "rewound"), "%s", moe_last_error());
}

/* Plain greedy requests take their tokens from the backend's argmax and no
 * logits row reaches the host; requests that want log-probabilities go
 * through the host sampler.  Both give the tokens of the host sampler, in
 * one batch or alone. */
Test(engine, backend_argmax_matches_host_sampler)
{
    struct scenario s;
    make_scenario(&s, 0.0f);
    for (int i = 0; i < NREQ; i += 2) s.p[i].sampling.logprob = true;
    struct moe_engine e;
    engine_open(&e, 256, 4, 32, false);
    struct moe_request *req[NREQ];
    int rows;
    for (int i = 0; i < NREQ; i++)
        cr_assert_eq(moe_engine_submit(&e, s.prompt[i], s.len[i], &s.p[i], NULL, &req[i]), MOE_OK,
                     "%s", moe_last_error());
    while (!moe_engine_idle(&e)) cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK, "%s", moe_last_error());
    for (int i = 0; i < NREQ; i++) {
        struct moe_request_params host = s.p[i];
        host.sampling.logprob = true;
        int32_t want[64];
        int n_want, n_got;
        solo(s.prompt[i], s.len[i], &host, want, &n_want);
        const int32_t *got = moe_request_output(req[i], &n_got);
        cr_assert_eq(n_got, n_want, "request %d", i);
        for (int k = 0; k < n_got; k++) {
            cr_assert_eq(got[k], want[k], "request %d token %d: %d, host sampler %d", i, k, got[k],
                         want[k]);
            float lp = req[i]->samples[k].logprob;
            if (i % 2 == 0) cr_assert(lp <= 0.0f, "request %d token %d: logprob %g", i, k, lp);
            else cr_assert(isnan(lp), "request %d token %d: no logprob was asked for", i, k);
        }
        moe_engine_release(&e, req[i]);
    }
    moe_engine_free(&e);

    /* only plain greedy requests: the logits buffer is never written */
    engine_open(&e, 256, 4, 32, false);
    const size_t nl = (size_t)e.o.max_seqs * (size_t)model.cfg.vocab;
    for (size_t k = 0; k < nl; k++) e.logits[k] = NAN;
    for (int i = 1; i < NREQ; i += 2)
        cr_assert_eq(moe_engine_submit(&e, s.prompt[i], s.len[i], &s.p[i], NULL, &req[i]), MOE_OK);
    while (!moe_engine_idle(&e)) cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK);
    for (size_t k = 0; k < nl; k++) cr_assert(isnan(e.logits[k]), "logits element %zu copied", k);
    for (int i = 1; i < NREQ; i += 2) moe_engine_release(&e, req[i]);
    /* one request with log-probabilities: now they are */
    cr_assert_eq(moe_engine_submit(&e, s.prompt[0], s.len[0], &s.p[0], NULL, &req[0]), MOE_OK);
    while (!moe_engine_idle(&e)) cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK);
    cr_assert(!isnan(e.logits[0]), "a logprob request's row reaches the host");
    moe_engine_release(&e, req[0]);
    moe_engine_free(&e);
}
