/* sampler.c - see sampler.h. */
#include "runtime/engine/sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void moe_sampling_defaults(struct moe_sampling *p)
{
    memset(p, 0, sizeof *p);
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}

bool moe_sampling_is_argmax(const struct moe_sampling *p)
{
    return (p->temperature == 0.0f || p->top_k == 1) && p->n_bias == 0 && p->repetition_penalty == 1.0f &&
           p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f && p->n_logprobs == 0 &&
           !p->logprob;
}

bool moe_sampling_is_greedy(const struct moe_sampling *p)
{
    return p->temperature == 0.0f || p->top_k == 1;
}

enum moe_status moe_sampling_validate(const struct moe_sampling *p)
{
    if (!(p->temperature >= 0.0f && p->temperature <= 100.0f))
        return moe_fail(MOE_ERR_INVALID_ARG, "temperature %g must be in [0, 100]", p->temperature);
    if (p->top_k < 0) return moe_fail(MOE_ERR_INVALID_ARG, "top_k %d must be >= 0", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return moe_fail(MOE_ERR_INVALID_ARG, "top_p %g must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return moe_fail(MOE_ERR_INVALID_ARG, "min_p %g must be in [0, 1]", p->min_p);
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 100.0f))
        return moe_fail(MOE_ERR_INVALID_ARG, "repetition_penalty %g must be in (0, 100]",
                        p->repetition_penalty);
    if (!(fabsf(p->frequency_penalty) <= 2.0f))
        return moe_fail(MOE_ERR_INVALID_ARG, "frequency_penalty %g must be in [-2, 2]",
                        p->frequency_penalty);
    if (!(fabsf(p->presence_penalty) <= 2.0f))
        return moe_fail(MOE_ERR_INVALID_ARG, "presence_penalty %g must be in [-2, 2]",
                        p->presence_penalty);
    if (p->n_logprobs < 0 || p->n_logprobs > MOE_MAX_LOGPROBS)
        return moe_fail(MOE_ERR_INVALID_ARG, "logprobs %d must be in [0, %d]", p->n_logprobs,
                        MOE_MAX_LOGPROBS);
    if (p->n_bias < 0 || p->n_bias > MOE_MAX_LOGIT_BIAS)
        return moe_fail(MOE_ERR_INVALID_ARG, "logit_bias: %d entries (at most %d)", p->n_bias,
                        MOE_MAX_LOGIT_BIAS);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0)
            return moe_fail(MOE_ERR_INVALID_ARG, "logit_bias: token id %d is negative", p->bias_ids[i]);
        if (!(fabsf(p->bias[i]) <= 100.0f))
            return moe_fail(MOE_ERR_INVALID_ARG, "logit_bias: %g for token %d must be in [-100, 100]",
                            p->bias[i], p->bias_ids[i]);
    }
    return MOE_OK;
}

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void moe_rng_seed(struct moe_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

double moe_rng_uniform(struct moe_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(result >> 11) * 0x1.0p-53;
}

enum moe_status moe_sampler_scratch_init(struct moe_sampler_scratch *s, int V)
{
    s->V = V;
    s->p = malloc((size_t)V * sizeof(float));
    s->idx = malloc((size_t)V * sizeof(int32_t));
    if (!s->p || !s->idx) {
        moe_sampler_scratch_free(s);
        return moe_fail(MOE_ERR_NOMEM, "sampler scratch for %d tokens", V);
    }
    return MOE_OK;
}

void moe_sampler_scratch_free(struct moe_sampler_scratch *s)
{
    free(s->p);
    free(s->idx);
    memset(s, 0, sizeof *s);
}

/* Sort key: probability descending, then id ascending (deterministic). */
static int by_prob(const void *a, const void *b, void *ctx)
{
    const float *p = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (p[x] != p[y]) return p[x] > p[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Moves the k largest of idx[0..n) (by p, ties to lower id) to the front,
 * sorted. O(n + k log k) on average (quickselect, then sort). */
static void top_sorted(int32_t *idx, int n, int k, const float *p)
{
    void *ctx = (void *)p;
    if (k < n) {
        int lo = 0, hi = n - 1;
        while (lo < hi) { /* quickselect on the order by_prob */
            int32_t pivot = idx[(lo + hi) / 2];
            int i = lo, j = hi;
            while (i <= j) {
                while (by_prob(&idx[i], &pivot, ctx) < 0) i++;
                while (by_prob(&idx[j], &pivot, ctx) > 0) j--;
                if (i <= j) {
                    int32_t t = idx[i];
                    idx[i++] = idx[j];
                    idx[j--] = t;
                }
            }
            if (k - 1 <= j) hi = j;
            else if (k - 1 >= i) lo = i;
            else break;
        }
    }
    qsort_r(idx, (size_t)k, sizeof *idx, by_prob, ctx);
}

static void apply_penalties(const struct moe_sampling *p, float *logits, int V,
                            const int32_t *hist, int n_prompt, int n_hist, int32_t *counts)
{
    if (p->repetition_penalty != 1.0f) {
        /* each distinct token once: mark with the sign bit of a count array */
        for (int i = 0; i < n_hist; i++) {
            int32_t t = hist[i];
            if (t < 0 || t >= V || counts[t] == -1) continue;
            counts[t] = -1;
            logits[t] = logits[t] > 0 ? logits[t] / p->repetition_penalty
                                      : logits[t] * p->repetition_penalty;
        }
        for (int i = 0; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) counts[hist[i]] = 0;
    }
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        for (int i = n_prompt; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) counts[hist[i]]++;
        for (int i = n_prompt; i < n_hist; i++) {
            int32_t t = hist[i];
            if (t < 0 || t >= V || counts[t] == 0) continue;
            logits[t] -= p->frequency_penalty * (float)counts[t] + p->presence_penalty;
            counts[t] = 0; /* applied once per distinct token */
        }
    }
}

/* Logit bias and penalties into logits, NaN to -inf; returns the largest. */
static float prepare_logits(const struct moe_sampling *p, float *logits, int V,
                            const int32_t *history, int n_prompt, int n_history, int32_t *counts)
{
    for (int i = 0; i < p->n_bias; i++) /* ids checked in range by moe_sampling_validate's caller */
        if (p->bias_ids[i] >= 0 && p->bias_ids[i] < V) logits[p->bias_ids[i]] += p->bias[i];
    /* counts live in the scratch (zeroed) until the penalties are applied */
    if (p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        memset(counts, 0, (size_t)V * sizeof *counts);
        apply_penalties(p, logits, V, history, n_prompt, n_history, counts);
    }
    /* NaN logits can never be chosen */
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (isnan(logits[i])) logits[i] = -INFINITY;
        if (logits[i] > mx) mx = logits[i];
    }
    return mx;
}

/* Greedy: temperature 0 or top-k 1, or nothing but -inf left. */
static bool draws_greedy(const struct moe_sampling *p, float mx)
{
    return p->temperature == 0.0f || p->top_k == 1 || mx == -INFINITY;
}

static int32_t argmax(const float *logits, int V)
{
    int32_t tok = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[tok]) tok = i;
    return tok;
}

/* The set a non-greedy draw is made from: prob[i] = exp((logit - mx) / T)
 * unnormalised, the kept ids in idx[0..n) by descending probability after
 * top-k, top-p and min-p; returns n, their sum in *zn. */
static int kept_set(const struct moe_sampling *p, const float *logits, int V, float mx,
                    float *prob, int32_t *idx, double *zn)
{
    const float inv_t = 1.0f / p->temperature;
    for (int i = 0; i < V; i++) {
        prob[i] = expf((logits[i] - mx) * inv_t);
        idx[i] = i;
    }
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    top_sorted(idx, V, k, prob);
    int n = k;
    if (p->top_p < 1.0f) {
        double zk = 0, acc = 0;
        for (int i = 0; i < n; i++) zk += prob[idx[i]];
        int m = 0;
        while (m < n) {
            acc += prob[idx[m++]];
            if (acc >= p->top_p * zk) break;
        }
        n = m;
    }
    if (p->min_p > 0.0f) {
        float floor_p = p->min_p * prob[idx[0]];
        int m = 1;
        while (m < n && prob[idx[m]] >= floor_p) m++;
        n = m;
    }
    *zn = 0;
    for (int i = 0; i < n; i++) *zn += prob[idx[i]];
    return n;
}

/* out->logprob of out->token and the n most likely, of the penalised
 * distribution at temperature 1. */
static void logprobs(const struct moe_sampling *p, const float *logits, int V, float mx,
                     struct moe_sampler_scratch *sc, struct moe_sample *out)
{
    float *prob = sc->p;
    int32_t *idx = sc->idx;
    double z1 = 0;
    for (int i = 0; i < V; i++) z1 += exp((double)logits[i] - mx);
    const double lz = mx + log(z1);
    out->logprob = (float)(logits[out->token] - lz);
    out->n_top = 0;
    if (p->n_logprobs > 0) {
        for (int i = 0; i < V; i++) {
            prob[i] = logits[i];
            idx[i] = i;
        }
        int k = p->n_logprobs < V ? p->n_logprobs : V;
        top_sorted(idx, V, k, prob);
        out->n_top = k;
        for (int i = 0; i < k; i++) {
            out->top_ids[i] = idx[i];
            out->top_logprobs[i] = (float)(logits[idx[i]] - lz);
        }
    }
}

void moe_sampler_sample(const struct moe_sampling *p, struct moe_rng *rng, float *logits, int V,
                        const int32_t *history, int n_prompt, int n_history,
                        struct moe_sampler_scratch *sc, struct moe_sample *out)
{
    float *prob = sc->p;
    int32_t *idx = sc->idx;
    memset(out, 0, sizeof *out);
    const float mx = prepare_logits(p, logits, V, history, n_prompt, n_history, idx);
    int32_t tok = argmax(logits, V);
    if (!draws_greedy(p, mx)) {
        double zn;
        int n = kept_set(p, logits, V, mx, prob, idx, &zn);
        double u = moe_rng_uniform(rng) * zn, acc = 0;
        tok = idx[n - 1];
        for (int i = 0; i < n; i++) {
            acc += prob[idx[i]];
            if (u < acc) {
                tok = idx[i];
                break;
            }
        }
    }
    out->token = tok;
    logprobs(p, logits, V, mx, sc, out);
}

void moe_sampler_probs(const struct moe_sampling *p, float *logits, int V, const int32_t *history,
                       int n_prompt, int n_history, struct moe_sampler_scratch *sc, double *probs)
{
    const float mx = prepare_logits(p, logits, V, history, n_prompt, n_history, sc->idx);
    for (int i = 0; i < V; i++) probs[i] = 0;
    if (draws_greedy(p, mx)) {
        probs[argmax(logits, V)] = 1;
        return;
    }
    double zn;
    int n = kept_set(p, logits, V, mx, sc->p, sc->idx, &zn);
    for (int i = 0; i < n; i++) probs[sc->idx[i]] = sc->p[sc->idx[i]] / zn;
}

enum moe_status moe_sampling_logit_bias_from_json(json_t *lb, int vocab, struct moe_sampling *sp)
{
    sp->n_bias = 0;
    if (!lb || json_is_null(lb)) return MOE_OK;
    if (!json_is_object(lb)) return moe_fail(MOE_ERR_INVALID_ARG, "'logit_bias' must be an object");
    if (json_object_size(lb) > MOE_MAX_LOGIT_BIAS)
        return moe_fail(MOE_ERR_INVALID_ARG, "'logit_bias' has %zu entries (at most %d)",
                        json_object_size(lb), MOE_MAX_LOGIT_BIAS);
    const char *key;
    json_t *val;
    json_object_foreach(lb, key, val) {
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (errno || end == key || *end || id < 0 || id >= vocab)
            return moe_fail(MOE_ERR_INVALID_ARG, "a logit_bias key is not a token id below %d", vocab);
        if (!json_is_number(val) || !(fabs(json_number_value(val)) <= 100.0))
            return moe_fail(MOE_ERR_INVALID_ARG, "logit_bias for token %ld must be a number in [-100, 100]",
                            id);
        sp->bias_ids[sp->n_bias] = (int32_t)id;
        sp->bias[sp->n_bias++] = (float)json_number_value(val);
    }
    return MOE_OK;
}

bool moe_sampler_accept(const struct moe_sampling *p, struct moe_rng *rng, float *logits, int V,
                        const int32_t *history, int n_prompt, int n_history,
                        struct moe_sampler_scratch *sc, const float *q, int32_t x,
                        struct moe_sample *out)
{
    memset(out, 0, sizeof *out);
    const float mx = prepare_logits(p, logits, V, history, n_prompt, n_history, sc->idx);
    /* p over the kept set: prob[idx[0..n)] / zn, zero elsewhere */
    float *prob = sc->p;
    int32_t *idx = sc->idx;
    int n = 1;
    double zn = 1;
    if (draws_greedy(p, mx)) {
        idx[0] = argmax(logits, V);
        prob[idx[0]] = 1;
    } else {
        n = kept_set(p, logits, V, mx, prob, idx, &zn);
    }
    double px = 0;
    for (int i = 0; i < n; i++)
        if (idx[i] == x) px = prob[x] / zn;
    double qx = x >= 0 && x < V ? q[x] : 0;
    bool accepted = px > 0 && (qx <= px || moe_rng_uniform(rng) * qx < px);
    if (accepted) {
        out->token = x;
    } else {
        /* the residual max(0, p - q), over the kept set (p is 0 elsewhere) */
        double z = 0;
        for (int i = 0; i < n; i++) {
            double r = prob[idx[i]] / zn - q[idx[i]];
            z += r > 0 ? r : 0;
        }
        double u = moe_rng_uniform(rng) * z, acc = 0;
        out->token = idx[0];
        for (int i = 0; i < n && z > 0; i++) {
            double r = prob[idx[i]] / zn - q[idx[i]];
            if (r <= 0) continue;
            out->token = idx[i];
            acc += r;
            if (u < acc) break;
        }
    }
    logprobs(p, logits, V, mx, sc, out);
    return accepted;
}
