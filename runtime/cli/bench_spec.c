/* bench_spec.c - see bench_spec.h. */
#include "runtime/cli/bench_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One run of B requests on e to their end: the timed window's tokens and
 * seconds, and every request's output into out (B, output_len). */
static enum moe_status run_batch(struct moe_engine *e, const struct moe_bench_spec_opts *o, int B,
                                 struct moe_request **req, int32_t *out, double *tokens, double *seconds)
{
    struct moe_request_params p = {.max_tokens = o->output_len};
    moe_sampling_defaults(&p.sampling); /* greedy */
    enum moe_status s = MOE_OK;
    int q = 0, rows;
    for (; q < B && s == MOE_OK; q++)
        s = moe_engine_submit(e, o->prompts[q % o->n_prompts], o->prompt_len[q % o->n_prompts], &p, NULL,
                              &req[q]);
    if (s != MOE_OK) q--; /* req[q] was not made */
    bool started = false;
    double t0 = 0, gen0 = 0;
    while (s == MOE_OK && !moe_engine_idle(e)) {
        if (!started) {
            started = true;
            for (int i = 0; i < B; i++) started &= req[i]->n_tokens > req[i]->n_prompt;
            if (started) {
                t0 = e->clock();
                for (int i = 0; i < B; i++) gen0 += req[i]->n_tokens - req[i]->n_prompt;
            }
        }
        s = moe_engine_step(e, &rows);
    }
    const double t1 = e->clock();
    double gen1 = 0;
    for (int i = 0; i < q; i++) {
        int n;
        const int32_t *t = moe_request_output(req[i], &n);
        gen1 += n;
        if (s == MOE_OK && n != o->output_len)
            s = moe_fail(MOE_ERR_UNSUPPORTED, "bench --spec: request %d generated %d tokens of %d", i, n,
                         o->output_len);
        if (s == MOE_OK) memcpy(out + (size_t)i * (size_t)o->output_len, t, (size_t)n * sizeof *t);
        if (req[i]->state != MOE_REQ_FINISHED) moe_engine_cancel(e, req[i]);
        moe_engine_release(e, req[i]);
    }
    *tokens = started ? gen1 - gen0 : 0;
    *seconds = started ? t1 - t0 : 0;
    return s;
}

/* What one batch size measured. */
struct spec_row {
    int batch;
    double plain_s, plain_tok, spec_s, spec_tok; /* the best round's window */
    double speedup;                              /* the median round's spec / plain tokens/s */
    uint64_t drafts, draft_tokens, accepted;     /* the speculative engine's, all rounds */
    int differ;                                  /* requests whose output differed from the first run's */
    int first_req, first_tok;                    /* where the first difference was (differ > 0) */
};

static void print_row(const struct spec_row *r)
{
    const double p = r->plain_s > 0 ? r->plain_tok / r->plain_s : 0, s = r->spec_s > 0 ? r->spec_tok / r->spec_s : 0;
    printf("%5d %12.1f %12.1f %8.2fx", r->batch, p, s, r->speedup);
    if (r->drafts) printf(" %14.2f %10.1f%%\n", (double)r->accepted / (double)r->drafts,
                          100.0 * (double)r->accepted / (double)r->draft_tokens);
    else printf(" %14s %11s\n", "-", "-");
    if (r->differ)
        printf("      outputs differ from the first run in %d of %d requests (first: request %d, token %d)\n",
               r->differ, r->batch, r->first_req, r->first_tok);
}

static json_t *row_json(const struct spec_row *r)
{
    const double p = r->plain_s > 0 ? r->plain_tok / r->plain_s : 0, s = r->spec_s > 0 ? r->spec_tok / r->spec_s : 0;
    return json_pack("{s:i, s:f, s:f, s:f, s:I, s:I, s:I, s:f, s:f, s:i}", "batch", r->batch, "plain_tokens_per_s", p,
                     "spec_tokens_per_s", s, "speedup", r->speedup, "drafts", (json_int_t)r->drafts,
                     "draft_tokens", (json_int_t)r->draft_tokens, "accepted_tokens", (json_int_t)r->accepted,
                     "mean_accepted_length", r->drafts ? (double)r->accepted / (double)r->drafts : 0.0,
                     "acceptance", r->draft_tokens ? (double)r->accepted / (double)r->draft_tokens : 0.0,
                     "requests_differing", r->differ);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Both engines on B requests, o->rounds times, alternating; r filled.
 * ratio: (o->rounds) scratch for each round's speedup.  Every run's output
 * is compared with the first's: a request that differs in any run is
 * counted in r->differ (the CPU backends never differ; on a GPU a row's
 * results can depend on the other rows of its step, docs/cuda.md). */
static enum moe_status measure(struct moe_engine *plain, struct moe_engine *spec, const struct moe_bench_spec_opts *o,
                               int B, struct moe_request **req, int32_t *want, int32_t *got, double *ratio,
                               bool *differs, struct spec_row *r)
{
    memset(differs, 0, (size_t)B * sizeof *differs);
    const struct moe_engine_counters before = spec->n;
    *r = (struct spec_row){.batch = B};
    for (int round = 0; round < o->rounds; round++) {
        double rate[2] = {0, 0}; /* plain, spec */
        for (int which = 0; which < 2; which++) { /* the order flips each round */
            const bool sp = (which + round) % 2 == 1;
            double tok, sec;
            MOE_TRY(run_batch(sp ? spec : plain, o, B, req, round == 0 && which == 0 ? want : got, &tok, &sec));
            if (!(round == 0 && which == 0))
                for (int q = 0; q < B; q++)
                    for (int k = 0; k < o->output_len; k++) {
                        const size_t i = (size_t)q * (size_t)o->output_len + (size_t)k;
                        if (want[i] == got[i]) continue;
                        if (!differs[q]) {
                            differs[q] = true;
                            if (!r->differ++ || q < r->first_req) r->first_req = q, r->first_tok = k;
                        }
                        break;
                    }
            rate[sp] = sec > 0 ? tok / sec : 0;
            double *best_s = sp ? &r->spec_s : &r->plain_s, *best_tok = sp ? &r->spec_tok : &r->plain_tok;
            if (sec > 0 && (*best_s == 0 || tok / sec > *best_tok / *best_s)) {
                *best_s = sec;
                *best_tok = tok;
            }
        }
        ratio[round] = rate[0] > 0 ? rate[1] / rate[0] : 0;
    }
    qsort(ratio, (size_t)o->rounds, sizeof *ratio, cmp_double);
    r->speedup = o->rounds % 2 ? ratio[o->rounds / 2] : (ratio[o->rounds / 2 - 1] + ratio[o->rounds / 2]) / 2;
    r->drafts = spec->n.spec_drafts - before.spec_drafts;
    r->draft_tokens = spec->n.spec_draft_tokens - before.spec_draft_tokens;
    r->accepted = spec->n.spec_accepted - before.spec_accepted;
    return MOE_OK;
}

enum moe_status moe_bench_spec(struct moe_engine *plain, struct moe_engine *spec, const struct moe_bench_spec_opts *o,
                               bool quiet, json_t **result)
{
    *result = NULL;
    int max_b = 1;
    for (int i = 0; i < o->n_batches; i++) max_b = o->batches[i] > max_b ? o->batches[i] : max_b;
    size_t n_out;
    if (!moe_mul_size((size_t)max_b, (size_t)o->output_len, &n_out) || !moe_mul_size(n_out, sizeof(int32_t), &n_out))
        return moe_fail(MOE_ERR_INVALID_ARG, "bench --spec: %d requests x %d tokens", max_b, o->output_len);
    struct moe_request **req = calloc((size_t)max_b, sizeof *req);
    int32_t *want = malloc(n_out), *got = malloc(n_out);
    double *ratio = malloc((size_t)o->rounds * sizeof *ratio);
    bool *differs = malloc((size_t)max_b * sizeof *differs);
    json_t *rows = json_array();
    enum moe_status s = req && want && got && ratio && differs && rows ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "bench --spec: buffers");
    const struct moe_spec_opts *so = &spec->o.spec;
    if (s == MOE_OK && !quiet) {
        char limit[64] = "at every batch size";
        if (so->max_batch) snprintf(limit, sizeof limit, "while at most %d requests run", so->max_batch);
        printf("speculation: %s, K %d, %s; %d tokens per request; tokens/s: the best of %d rounds, "
               "speedup: their median ratio\n", so->kind == MOE_SPEC_NGRAM ? "ngram" : "draft", so->tokens, limit, o->output_len, o->rounds);
        printf("%5s %12s %12s %9s %14s %11s\n", "batch", "plain tok/s", "spec tok/s", "speedup", "accepted len",
               "acceptance");
    }
    for (int i = 0; i < o->n_batches && s == MOE_OK; i++) {
        struct spec_row r;
        s = measure(plain, spec, o, o->batches[i], req, want, got, ratio, differs, &r);
        if (s != MOE_OK) break;
        if (!quiet) {
            print_row(&r);
            fflush(stdout);
        }
        json_array_append_new(rows, row_json(&r));
    }
    if (s == MOE_OK)
        *result = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:O}", "proposer",
                            so->kind == MOE_SPEC_NGRAM ? "ngram" : "draft", "tokens", so->tokens, "ngram_max",
                            so->ngram_max, "max_batch", so->max_batch, "output_len", o->output_len, "rounds",
                            o->rounds, "rows", rows);
    json_decref(rows);
    free(req);
    free(want);
    free(got);
    free(ratio);
    free(differs);
    return s;
}
