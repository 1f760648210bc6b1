/* bench_serve.c - see bench_serve.h. */
#include "runtime/cli/bench_serve.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Linear-interpolated percentile of sorted v (n > 0). */
static double pct(const double *v, size_t n, double p)
{
    double pos = p / 100.0 * (double)(n - 1);
    size_t i = (size_t)pos;
    double f = pos - (double)i;
    return i + 1 < n ? v[i] * (1 - f) + v[i + 1] * f : v[n - 1];
}

static json_t *summary(double *v, size_t n)
{
    if (n == 0) return json_pack("{s:n, s:n, s:n}", "mean_ms", "median_ms", "p99_ms");
    qsort(v, n, sizeof *v, cmp_double);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += v[i];
    return json_pack("{s:f, s:f, s:f}", "mean_ms", s / (double)n * 1e3, "median_ms",
                     pct(v, n, 50) * 1e3, "p99_ms", pct(v, n, 99) * 1e3);
}

static int draw_len(uint64_t *s, int len, double r)
{
    if (r <= 0) return len;
    double lo = len * (1 - r), hi = len * (1 + r);
    int v = (int)floor(lo + unit(s) * (hi - lo + 1));
    return v < 1 ? 1 : v;
}

static void sleep_until(double t, double (*clock)(void))
{
    double d = t - clock();
    if (d <= 0) return;
    struct timespec ts = {(time_t)d, (long)((d - floor(d)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Submits each request at its arrival time and steps the engine until all
 * are finished; req[i] gets request i. */
static enum moe_status drive(struct moe_engine *e, int N, const double *arrive, const int *in_len,
                             const int *out_len, int max_in, uint64_t *rngp, double start, struct moe_request **req)
{
    const int V = e->m->cfg.vocab;
    uint64_t rng = *rngp;
    enum moe_status s = MOE_OK;
    int32_t *prompt = malloc((size_t)max_in * sizeof *prompt);
    if (!prompt) return moe_fail(MOE_ERR_NOMEM, "bench serve prompt");
    int next = 0, done = 0, rows;
    while (done < N) {
        double now = e->clock() - start;
        while (next < N && arrive[next] <= now) {
            struct moe_request_params p = {.max_tokens = out_len[next]}; /* greedy, no EOS stop */
            moe_sampling_defaults(&p.sampling);
            for (int k = 0; k < in_len[next]; k++) prompt[k] = (int32_t)(next_u64(&rng) % (uint64_t)V);
            s = moe_engine_submit(e, prompt, in_len[next], &p, NULL, &req[next]);
            if (s != MOE_OK) break;
            req[next]->t_arrival = start + arrive[next]; /* latency counts from the scheduled arrival */
            next++;
        }
        if (s != MOE_OK) break;
        if (moe_engine_idle(e)) {
            if (next < N) sleep_until(start + arrive[next], e->clock);
            continue;
        }
        uint64_t before = e->n.requests_finished;
        if ((s = moe_engine_step(e, &rows)) != MOE_OK) break;
        done += (int)(e->n.requests_finished - before);
    }
    free(prompt);
    *rngp = rng;
    return s;
}

/* The table of a result (the JSON object moe_bench_serve returns). */
static void print_serve(const json_t *res, const struct moe_bench_serve_opts *o, long in_tokens)
{
    const double dur = json_real_value(json_object_get(res, "duration_s"));
    const int N = (int)json_integer_value(json_object_get(res, "requests"));
    char rate[64];
    if (o->rate > 0) snprintf(rate, sizeof rate, "Poisson arrivals at %.2f requests/s", o->rate);
    else snprintf(rate, sizeof rate, "all at once");
    printf("serving: %d requests, input %d, output %d tokens, %s: %.2f s\n", N, o->input_len, o->output_len, rate,
           dur);
    printf("  requests/s %.2f   output tokens/s %.1f   input tokens %ld   preemptions %llu\n",
           json_real_value(json_object_get(res, "requests_per_s")),
           json_real_value(json_object_get(res, "output_tokens_per_s")), in_tokens,
           (unsigned long long)json_integer_value(json_object_get(res, "preemptions")));
    const char *names[3] = {"TTFT", "TPOT", "ITL"};
    for (int k = 0; k < 3; k++) {
        json_t *m = json_object_get(res, k == 0 ? "ttft" : k == 1 ? "tpot" : "itl");
        printf("  %-5s mean %9.2f ms   median %9.2f ms   p99 %9.2f ms\n", names[k],
               json_real_value(json_object_get(m, "mean_ms")), json_real_value(json_object_get(m, "median_ms")),
               json_real_value(json_object_get(m, "p99_ms")));
    }
}

enum moe_status moe_bench_serve(struct moe_engine *e, const struct moe_bench_serve_opts *o,
                                bool quiet, json_t **result)
{
    const int N = o->n_requests;
    *result = NULL;
    if (N <= 0 || o->input_len <= 0 || o->output_len <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "bench serve: requests, input and output lengths must be positive");
    struct moe_request **req = calloc((size_t)N, sizeof *req);
    double *arrive = malloc((size_t)N * sizeof *arrive);
    int *in_len = malloc((size_t)N * sizeof *in_len), *out_len = malloc((size_t)N * sizeof *out_len);
    int max_in = 1;
    uint64_t rng = o->seed ? o->seed : 1;
    enum moe_status s = MOE_OK;
    if (!req || !arrive || !in_len || !out_len) {
        s = moe_fail(MOE_ERR_NOMEM, "bench serve");
        goto out;
    }
    double t = 0;
    for (int i = 0; i < N; i++) {
        if (o->rate > 0) t += -log(1.0 - unit(&rng)) / o->rate; /* exponential gaps */
        arrive[i] = t;
        in_len[i] = draw_len(&rng, o->input_len, o->range_ratio);
        out_len[i] = draw_len(&rng, o->output_len, o->range_ratio);
        if (in_len[i] > max_in) max_in = in_len[i];
    }
    const double start = e->clock();
    s = drive(e, N, arrive, in_len, out_len, max_in, &rng, start, req);
    if (s != MOE_OK) goto out;
    const double dur = e->clock() - start;
    double *ttft = malloc((size_t)N * sizeof *ttft), *tpot = malloc((size_t)N * sizeof *tpot);
    size_t n_itl = 0, n_tpot = 0;
    long out_tokens = 0, in_tokens = 0;
    for (int i = 0; i < N; i++) n_itl += (size_t)out_len[i];
    double *itl = malloc((n_itl ? n_itl : 1) * sizeof *itl);
    if (!ttft || !tpot || !itl) {
        free(ttft);
        free(tpot);
        free(itl);
        s = moe_fail(MOE_ERR_NOMEM, "bench serve metrics");
        goto out;
    }
    n_itl = 0;
    for (int i = 0; i < N; i++) {
        struct moe_request *r = req[i];
        int n;
        moe_request_output(r, &n);
        out_tokens += n;
        in_tokens += r->n_prompt;
        ttft[i] = r->t_first - r->t_arrival;
        if (n > 1) tpot[n_tpot++] = (r->t_token[n - 1] - r->t_first) / (n - 1);
        for (int k = 1; k < n; k++) itl[n_itl++] = r->t_token[k] - r->t_token[k - 1];
    }
    *result = json_pack("{s:i, s:f, s:i, s:i, s:f, s:f, s:f, s:f, s:o, s:o, s:o, s:I, s:I}",
                        "requests", N, "rate", o->rate > 0 ? o->rate : 0.0, "input_len",
                        o->input_len, "output_len", o->output_len, "range_ratio", o->range_ratio,
                        "duration_s", dur, "requests_per_s", N / dur, "output_tokens_per_s",
                        (double)out_tokens / dur, "ttft", summary(ttft, (size_t)N), "tpot",
                        summary(tpot, n_tpot), "itl", summary(itl, n_itl), "preemptions",
                        (json_int_t)e->n.preemptions, "prefix_hit_tokens",
                        (json_int_t)e->n.prefix_hit_tokens);
    if (!*result) {
        s = moe_fail(MOE_ERR_NOMEM, "bench serve: result JSON");
    } else if (o->rate <= 0) {
        json_object_set_new(*result, "rate", json_string("inf"));
    }
    if (!quiet && *result) print_serve(*result, o, in_tokens);
    free(ttft);
    free(tpot);
    free(itl);
out:
    if (req)
        for (int i = 0; i < N; i++) moe_engine_release(e, req[i]);
    free(req);
    free(arrive);
    free(in_len);
    free(out_len);
    return s;
}
