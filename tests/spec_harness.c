/* spec_harness.c - see spec_harness.h. */
#include "tests/spec_harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "tests/testutil.h"

void spec_make_jobs(struct spec_job *jobs, int nj, int vocab, uint64_t seed)
{
    for (int i = 0; i < nj; i++) {
        struct spec_job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->n = 3 + (int)(tu_rand_u64(&seed) % (SPEC_MAXP - 3));
        for (int k = 0; k < j->n; k++) j->prompt[k] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)vocab);
        j->arrive = (int)(tu_rand_u64(&seed) % 6);
        j->p.max_tokens = 8 + (int)(tu_rand_u64(&seed) % (SPEC_MAXO - 8));
        moe_sampling_defaults(&j->p.sampling);
        j->p.sampling.seed = 1000 + (uint64_t)i;
        if (i % 4 == 1) {
            j->p.sampling.temperature = 0.8f;
            j->p.no_spec = i % 8 == 1;
        }
        if (i % 4 == 2) {
            j->p.sampling.logprob = true;
            j->p.sampling.n_logprobs = 3;
        }
        if (i % 4 == 3) j->p.sampling.repetition_penalty = 1.3f;
    }
}

struct moe_engine_opts spec_opts(int n_blocks, int batch_tokens, bool prefix)
{
    return (struct moe_engine_opts){.max_batch_tokens = batch_tokens, .max_seqs = 8,
                                    .block_size = 4, .n_blocks = n_blocks,
                                    .kv_dtype = MOE_DTYPE_F32, .prefix_cache = prefix};
}

struct moe_engine_counters spec_serve(struct moe_backend *be, const struct moe_model *m,
                                      const struct spec_job *jobs, int nj,
                                      const struct moe_engine_opts *o, struct spec_result *res)
{
    struct moe_engine e;
    memset(res, 0, (size_t)nj * sizeof *res);
    cr_assert(nj <= SPEC_MAXJ);
    cr_assert_eq(moe_engine_init(&e, m, be, o), MOE_OK, "%s", moe_last_error());
    struct moe_request *req[SPEC_MAXJ] = {0};
    int step = 0, rows, submitted = 0;
    while (submitted < nj || !moe_engine_idle(&e)) {
        for (int i = 0; i < nj; i++)
            if (!req[i] && jobs[i].arrive <= step) {
                cr_assert_eq(moe_engine_submit(&e, jobs[i].prompt, jobs[i].n, &jobs[i].p, NULL,
                                               &req[i]), MOE_OK, "%s", moe_last_error());
                submitted++;
            }
        cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK, "%s", moe_last_error());
        cr_assert(++step < 20000, "the engine does not finish");
    }
    for (int i = 0; i < nj; i++) {
        const int32_t *out = moe_request_output(req[i], &res[i].n);
        memcpy(res[i].out, out, (size_t)res[i].n * sizeof *out);
        memcpy(res[i].s, req[i]->samples, (size_t)res[i].n * sizeof *res[i].s);
        res[i].finish = req[i]->finish;
        res[i].drafted = req[i]->n_drafted;
        res[i].accepted = req[i]->n_accepted;
        moe_engine_release(&e, req[i]);
    }
    tu_expect_pools_free(&e);
    struct moe_engine_counters n = e.n;
    moe_engine_free(&e);
    return n;
}

void spec_expect_same(const struct spec_result *a, const struct spec_result *b, int nj, const char *what)
{
    for (int i = 0; i < nj; i++) {
        cr_assert_eq(a[i].n, b[i].n, "%s: request %d: %d tokens, without speculation %d", what, i,
                     a[i].n, b[i].n);
        cr_assert_eq(a[i].finish, b[i].finish, "%s: request %d finish", what, i);
        for (int k = 0; k < a[i].n; k++) {
            cr_assert_eq(a[i].out[k], b[i].out[k], "%s: request %d token %d: %d, without "
                         "speculation %d", what, i, k, a[i].out[k], b[i].out[k]);
            cr_assert(tu_same_bits(a[i].s[k].logprob, b[i].s[k].logprob),
                      "%s: request %d token %d: logprob %.9g, without speculation %.9g", what, i,
                      k, a[i].s[k].logprob, b[i].s[k].logprob);
        }
    }
}

struct spec_totals spec_matches_plain(struct moe_backend *be, const struct moe_model *m,
                                      const struct spec_job *jobs, int nj, struct moe_engine_opts o,
                                      const struct moe_spec_opts *sp, bool all_accepted,
                                      const char *what)
{
    static struct spec_result plain[SPEC_MAXJ], spec[SPEC_MAXJ];
    struct spec_totals t = {0};
    struct moe_engine_counters np = spec_serve(be, m, jobs, nj, &o, plain);
    static const int ks[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        struct moe_engine_opts so = o;
        so.spec = *sp;
        so.spec.tokens = ks[i];
        struct moe_engine_counters n = spec_serve(be, m, jobs, nj, &so, spec);
        char label[128];
        snprintf(label, sizeof label, "%s, K = %d", what, ks[i]);
        spec_expect_same(spec, plain, nj, label);
        cr_assert_eq(n.generated_tokens, np.generated_tokens, "%s", label);
        cr_assert(n.spec_draft_tokens > 0, "%s: nothing drafted", label);
        cr_assert(n.spec_accepted <= n.spec_draft_tokens);
        for (int j = 0; j < nj; j++) {
            if (jobs[j].p.no_spec)
                cr_assert_eq(spec[j].drafted, 0, "%s: a sampled request speculated", label);
            if (all_accepted && jobs[j].p.sampling.repetition_penalty == 1.0f &&
                moe_sampling_is_greedy(&jobs[j].p.sampling))
                cr_assert_eq(spec[j].accepted, spec[j].drafted,
                             "%s: request %d: %d of %d tokens the target itself drafted accepted",
                             label, j, spec[j].accepted, spec[j].drafted);
        }
        t.drafted += n.spec_draft_tokens;
        t.accepted += n.spec_accepted;
        t.preemptions += n.preemptions;
        t.prefix_hits += n.prefix_hit_tokens;
    }
    return t;
}

void spec_churn_request(void *ctx, uint64_t *seed, const int32_t **prompt, int *n,
                        struct moe_request_params *p)
{
    const struct spec_job *j = (const struct spec_job *)ctx + tu_rand_u64(seed) % 7;
    *prompt = j->prompt;
    *n = j->n;
    *p = j->p;
    p->max_tokens = 1 + (int)(tu_rand_u64(seed) % 24);
}

void spec_pools_returned(void *ctx, struct moe_request *r)
{
    (void)ctx;
    cr_assert(r->seq.n_blocks == 0 && r->draft_seq.n_blocks == 0 && r->mtp_seq.n_blocks == 0,
              "a finished request holds %d target, %d draft and %d module blocks", r->seq.n_blocks,
              r->draft_seq.n_blocks, r->mtp_seq.n_blocks);
}
