/* stats.c - recording of expert load statistics and routing traces (see
 * stats.h).  Everything here is host code that reads the routing the
 * forward pass produced; nothing feeds back into the computation. */
#include "router/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *zalloc(size_t n, size_t elem, bool *ok)
{
    void *p = calloc(n ? n : 1, elem);
    if (!p) *ok = false;
    return p;
}

enum moe_status moe_stats_init(struct moe_stats *st, const struct moe_config *cfg,
                               const struct moe_stats_opts *o)
{
    memset(st, 0, sizeof *st);
    if (o) st->o = *o;
    if (st->o.ring_steps <= 0) st->o.ring_steps = 64;
    if (st->o.step_from < 0 || st->o.step_to < 0 || st->o.trace_max_tokens < 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "stats: negative step range or trace limit");
    st->L = cfg->n_layers;
    st->E = cfg->n_experts;
    st->K = cfg->top_k;
    if (st->E > 0 && (st->K <= 0 || st->K > st->E))
        return moe_fail(MOE_ERR_INVALID_ARG, "stats: top-k %d with %d experts", st->K, st->E);
    for (int l = 0; l < st->L; l++) st->Lm += cfg->layer_moe[l] && st->E > 0;
    const size_t Lm = (size_t)st->Lm, E = (size_t)(st->E > 0 ? st->E : 1);
    size_t LE, LEE, RLE;
    st->ring_cap = st->o.ring_steps;
    if (!moe_mul_size(Lm, E, &LE) || !moe_mul_size(LE, E, &LEE) ||
        !moe_mul_size(LE, (size_t)st->ring_cap, &RLE))
        return moe_fail(MOE_ERR_NOMEM, "stats: sizes overflow");
    bool ok = true;
    st->layers = zalloc(Lm, sizeof(int32_t), &ok);
    st->slot = zalloc((size_t)st->L, sizeof(int32_t), &ok);
    st->prefill = zalloc(LE, sizeof(int64_t), &ok);
    st->decode = zalloc(LE, sizeof(int64_t), &ok);
    st->wsum = zalloc(LE, sizeof(double), &ok);
    st->top1 = zalloc(LE, sizeof(int64_t), &ok);
    st->ent_sum = zalloc(Lm, sizeof(double), &ok);
    st->ent_n = zalloc(Lm, sizeof(int64_t), &ok);
    st->coact = zalloc(LEE, sizeof(int64_t), &ok);
    st->rejected = zalloc(Lm, sizeof(int64_t), &ok);
    st->bad_weights = zalloc(Lm, sizeof(int64_t), &ok);
    st->ring_step = zalloc((size_t)st->ring_cap, sizeof(int64_t), &ok);
    st->ring_tokens = zalloc((size_t)st->ring_cap, sizeof(int32_t), &ok);
    st->ring_decode = zalloc((size_t)st->ring_cap, sizeof(int32_t), &ok);
    st->ring_counts = zalloc(RLE, sizeof(int32_t), &ok);
    st->verify = zalloc(LE, sizeof(int64_t), &ok);
    st->spec_rejected = zalloc(LE, sizeof(int64_t), &ok);
    st->seen = zalloc(E, 1, &ok);
    if (!ok) {
        moe_stats_free(st);
        return moe_fail(MOE_ERR_NOMEM, "stats: cannot allocate counters for %d layers x %d experts",
                        (int)Lm, (int)E);
    }
    for (int l = 0, j = 0; l < st->L; l++) {
        bool moe = cfg->layer_moe[l] && st->E > 0;
        st->slot[l] = moe ? j : -1;
        if (moe) st->layers[j++] = l;
    }
    st->first_step = st->last_step = -1;
    st->t_start = st->t_end = unix_now();
    st->cur_tok0 = -1;
    return MOE_OK;
}

void moe_stats_free(struct moe_stats *st)
{
    void *p[] = {st->layers, st->slot, st->prefill, st->decode, st->wsum, st->top1, st->ent_sum,
                 st->ent_n, st->coact, st->rejected, st->bad_weights, st->ring_step,
                 st->ring_tokens, st->ring_decode, st->ring_counts, st->tr.ids, st->tr.w,
                 st->tr.meta, st->row_decode, st->verify, st->spec_rejected, st->row_vrow,
                 st->vchunk, st->vids, st->seen};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    memset(st, 0, sizeof *st);
}

void moe_stats_reset(struct moe_stats *st)
{
    const size_t LE = (size_t)st->Lm * (size_t)(st->E > 0 ? st->E : 1);
    memset(st->prefill, 0, LE * sizeof(int64_t));
    memset(st->decode, 0, LE * sizeof(int64_t));
    memset(st->verify, 0, LE * sizeof(int64_t));
    memset(st->spec_rejected, 0, LE * sizeof(int64_t));
    memset(st->spec_chunks, 0, sizeof st->spec_chunks);
    memset(st->spec_distinct, 0, sizeof st->spec_distinct);
    st->tokens_verify = st->tokens_spec_rejected = 0;
    memset(st->wsum, 0, LE * sizeof(double));
    memset(st->top1, 0, LE * sizeof(int64_t));
    memset(st->coact, 0, LE * (size_t)(st->E > 0 ? st->E : 1) * sizeof(int64_t));
    memset(st->ent_sum, 0, (size_t)st->Lm * sizeof(double));
    memset(st->ent_n, 0, (size_t)st->Lm * sizeof(int64_t));
    memset(st->rejected, 0, (size_t)st->Lm * sizeof(int64_t));
    memset(st->bad_weights, 0, (size_t)st->Lm * sizeof(int64_t));
    st->ring_n = st->ring_head = 0;
    st->ring_dropped = 0;
    st->tr.n = 0;
    st->tr.truncated = false;
    st->first_step = st->last_step = -1;
    st->steps = st->tokens_prefill = st->tokens_decode = 0;
    st->t_start = st->t_end = unix_now();
    st->resets++;
    st->busy_s = 0;
    st->active = false;
}

/* Grows the trace to hold `need` tokens; false when it may not or cannot. */
static bool trace_reserve(struct moe_stats *st, int64_t need)
{
    struct moe_stats_trace *tr = &st->tr;
    if (need <= tr->cap) return true;
    if (st->o.trace_max_tokens > 0 && need > st->o.trace_max_tokens) return false;
    int64_t cap = tr->cap ? tr->cap : 1024;
    while (cap < need) cap *= 2;
    if (st->o.trace_max_tokens > 0 && cap > st->o.trace_max_tokens) cap = st->o.trace_max_tokens;
    size_t row = (size_t)st->Lm * (size_t)st->K, n, nb;
    if (!moe_mul_size((size_t)cap, row, &n) || !moe_mul_size(n, sizeof(int32_t), &nb)) return false;
    int32_t *ids = realloc(tr->ids, nb);
    if (ids) tr->ids = ids;
    float *w = ids ? realloc(tr->w, nb) : NULL;
    if (w) tr->w = w;
    int64_t *meta = w ? realloc(tr->meta, (size_t)cap * 4 * sizeof(int64_t)) : NULL;
    if (!meta) return false;
    tr->meta = meta;
    tr->cap = cap;
    return true;
}

static enum moe_status step_begin(struct moe_stats *st, const struct moe_batch *b);

enum moe_status moe_stats_step_begin(struct moe_stats *st, const struct moe_batch *b)
{
    double t0 = mono_now();
    enum moe_status s = step_begin(st, b);
    st->busy_s += mono_now() - t0;
    return s;
}

static enum moe_status step_begin(struct moe_stats *st, const struct moe_batch *b)
{
    const int64_t step = st->step++;
    st->active = step >= st->o.step_from && (st->o.step_to == 0 || step < st->o.step_to) &&
                 st->Lm > 0;
    st->cur_tok0 = -1;
    st->cur_nv = st->cur_nvchunks = 0;
    if (!st->active) return MOE_OK;
    const int T = b->n_tokens;
    if (T > st->row_cap) {
        uint8_t *r = realloc(st->row_decode, (size_t)T);
        if (r) st->row_decode = r;
        int32_t *v = r ? realloc(st->row_vrow, (size_t)T * sizeof *v) : NULL;
        if (v) st->row_vrow = v;
        int32_t *c = v ? realloc(st->vchunk, (size_t)T * 2 * sizeof *c) : NULL;
        if (!c) {
            st->active = false; /* the step's layers record nothing */
            return moe_fail(MOE_ERR_NOMEM, "stats: row flags for %d tokens", T);
        }
        st->vchunk = c;
        st->row_cap = T;
    }
    int n_dec = 0;
    for (int t = 0; t < T; t++) {
        int s = b->seq_of[t];
        st->row_decode[t] = b->decode && b->decode[s] ? 1 : 0;
        n_dec += st->row_decode[t];
        st->row_vrow[t] = -1;
    }
    /* verification chunks: their rows numbered, their ids kept */
    for (int s = 0; b->verify && s < b->n_seqs; s++) {
        if (!b->verify[s]) continue;
        int first = b->seq_start[s], n = b->seq_start[s + 1] - first;
        st->vchunk[2 * st->cur_nvchunks] = first;
        st->vchunk[2 * st->cur_nvchunks++ + 1] = n;
        for (int i = 0; i < n; i++) st->row_vrow[first + i] = st->cur_nv++;
        st->spec_chunks[n < MOE_STATS_SPEC_ROWS ? n : MOE_STATS_SPEC_ROWS]++;
    }
    if (st->cur_nv > st->vcap) {
        size_t cnt, bytes;
        int32_t *v = NULL;
        if (moe_mul_size((size_t)st->cur_nv, (size_t)st->Lm * (size_t)st->K, &cnt) &&
            moe_mul_size(cnt, sizeof *v, &bytes))
            v = realloc(st->vids, bytes);
        if (!v) {
            st->active = false;
            return moe_fail(MOE_ERR_NOMEM, "stats: ids of %d verification rows", st->cur_nv);
        }
        st->vids = v;
        st->vcap = st->cur_nv;
    }
    st->tokens_verify += st->cur_nv;
    st->cur_decode = st->row_decode;
    st->cur_T = T;
    st->tokens_decode += n_dec;
    st->tokens_prefill += T - n_dec;
    if (st->first_step < 0) st->first_step = step;
    st->last_step = step;
    st->steps++;
    st->t_end = unix_now();
    /* ring slot */
    const size_t LE = (size_t)st->Lm * (size_t)st->E;
    st->cur_ring = st->ring_head;
    if (st->ring_n == st->ring_cap) st->ring_dropped++;
    else st->ring_n++;
    st->ring_head = (st->ring_head + 1) % st->ring_cap;
    st->ring_step[st->cur_ring] = step;
    st->ring_tokens[st->cur_ring] = T;
    st->ring_decode[st->cur_ring] = n_dec;
    memset(st->ring_counts + (size_t)st->cur_ring * LE, 0, LE * sizeof(int32_t));
    /* trace rows */
    if (st->o.trace && !st->tr.truncated) {
        if (!trace_reserve(st, st->tr.n + T)) {
            st->tr.truncated = true;
        } else {
            st->cur_tok0 = st->tr.n;
            const size_t row = (size_t)st->Lm * (size_t)st->K;
            for (size_t i = (size_t)st->tr.n * row; i < (size_t)(st->tr.n + T) * row; i++) {
                st->tr.ids[i] = -1;
                st->tr.w[i] = 0.0f;
            }
            for (int t = 0; t < T; t++) {
                int s = b->seq_of[t];
                int64_t *m = st->tr.meta + (size_t)(st->tr.n + t) * 4;
                m[0] = step;
                m[1] = b->request_ids ? b->request_ids[s] : s;
                m[2] = b->positions[t];
                m[3] = st->row_decode[t];
            }
            /* dense layers are not in the trace; MoE layers fill every row */
            st->tr.n += T;
        }
    }
    return MOE_OK;
}

/* Softmax entropy of one row of logits in nats; false when undefined (NaN,
 * or no finite maximum).  H = log S - sum_e p_e (z_e - max) / S with
 * p_e = exp(z_e - max); fp32 like the router (relative error ~1e-6). */
static bool row_entropy(const float *z, int E, double *h)
{
    float mx = -INFINITY;
    bool nan = false;
    for (int e = 0; e < E; e++) {
        nan |= isnan(z[e]);
        mx = z[e] > mx ? z[e] : mx;
    }
    if (nan || !isfinite(mx)) return false;
    float s = 0.0f, sz = 0.0f;
    for (int e = 0; e < E; e++) {
        float d = z[e] - mx, p = expf(d);
        s += p;
        sz += p > 0.0f ? p * d : 0.0f; /* d = -inf gives p = 0: no term */
    }
    *h = (double)logf(s) - (double)sz / (double)s;
    return isfinite(*h);
}

static void record_layer(struct moe_stats *st, int layer, int T, const int32_t *ids,
                         const float *w, const float *logits);

/* MoE layer j's routing of the step's verification rows: their pairs, their
 * ids kept, and the distinct experts each chunk touched. */
static void record_verify(struct moe_stats *st, int j, const int32_t *ids)
{
    const int E = st->E, K = st->K;
    int64_t *ver = st->verify + (size_t)j * E;
    for (int c = 0; c < st->cur_nvchunks; c++) {
        int first = st->vchunk[2 * c], n = st->vchunk[2 * c + 1], distinct = 0;
        memset(st->seen, 0, (size_t)E);
        for (int t = first; t < first + n; t++) {
            const int32_t *id = ids + (size_t)t * K;
            memcpy(st->vids + ((size_t)st->row_vrow[t] * st->Lm + j) * K, id, (size_t)K * sizeof *id);
            for (int k = 0; k < K; k++) {
                if (id[k] < 0 || id[k] >= E) continue;
                ver[id[k]]++;
                distinct += !st->seen[id[k]];
                st->seen[id[k]] = 1;
            }
        }
        st->spec_distinct[n < MOE_STATS_SPEC_ROWS ? n : MOE_STATS_SPEC_ROWS] += distinct;
    }
}

void moe_stats_spec_rejected(struct moe_stats *st, int first, int n)
{
    if (!st->active || first < 0 || n <= 0 || first > st->cur_T - n) return;
    const int E = st->E, K = st->K, Lm = st->Lm;
    for (int t = first; t < first + n; t++) {
        int v = st->row_vrow[t];
        if (v < 0) continue;
        st->tokens_spec_rejected++;
        for (int j = 0; j < Lm; j++) {
            const int32_t *id = st->vids + ((size_t)v * Lm + j) * K;
            for (int k = 0; k < K; k++)
                if (id[k] >= 0 && id[k] < E) st->spec_rejected[(size_t)j * E + id[k]]++;
        }
        if (st->cur_tok0 >= 0) st->tr.meta[(size_t)(st->cur_tok0 + t) * 4 + 3] = 2;
    }
}

void moe_stats_record_layer(struct moe_stats *st, int layer, int T, const int32_t *ids,
                            const float *w, const float *logits)
{
    double t0 = mono_now();
    record_layer(st, layer, T, ids, w, logits);
    st->busy_s += mono_now() - t0;
}

static void record_layer(struct moe_stats *st, int layer, int T, const int32_t *ids,
                         const float *w, const float *logits)
{
    if (!st->active || layer < 0 || layer >= st->L || st->slot[layer] < 0) return;
    MOE_ASSERT(T == st->cur_T);
    const int j = st->slot[layer], E = st->E, K = st->K, Lm = st->Lm;
    int64_t *pre = st->prefill + (size_t)j * E, *dec = st->decode + (size_t)j * E;
    int64_t *top1 = st->top1 + (size_t)j * E, *co = st->coact + (size_t)j * E * E;
    double *ws = st->wsum + (size_t)j * E;
    int32_t *ring = st->ring_counts + ((size_t)st->cur_ring * Lm + j) * E;
    int64_t rejected = 0, bad = 0;
    for (int t = 0; t < T; t++) {
        const int32_t *id = ids + (size_t)t * K;
        const float *wt = w + (size_t)t * K;
        int64_t *cnt = st->cur_decode[t] ? dec : pre;
        for (int k = 0; k < K; k++) {
            int32_t e = id[k];
            if (e < 0 || e >= E) {
                rejected++;
                continue;
            }
            cnt[e]++;
            ring[e]++;
            if (isfinite(wt[k])) ws[e] += wt[k];
            else bad++;
            for (int k2 = k + 1; k2 < K; k2++) {
                int32_t f = id[k2];
                if (f < 0 || f >= E || f == e) continue;
                co[e < f ? (size_t)e * E + f : (size_t)f * E + e]++;
            }
        }
        if (id[0] >= 0 && id[0] < E) top1[id[0]]++;
    }
    st->rejected[j] += rejected;
    st->bad_weights[j] += bad;
    record_verify(st, j, ids);
    if (logits) {
        /* single-threaded on purpose: an OpenMP region here costs more than
         * the loop (docs/stats-format.md, "Cost") */
        double hs = 0.0;
        int64_t hn = 0;
        for (int t = 0; t < T; t++) {
            double h;
            if (row_entropy(logits + (size_t)t * E, E, &h)) {
                hs += h;
                hn++;
            }
        }
        st->ent_sum[j] += hs;
        st->ent_n[j] += hn;
    }
    if (st->cur_tok0 >= 0) {
        const size_t row = (size_t)Lm * K;
        for (int t = 0; t < T; t++) {
            size_t o = (size_t)(st->cur_tok0 + t) * row + (size_t)j * K;
            memcpy(st->tr.ids + o, ids + (size_t)t * K, (size_t)K * sizeof(int32_t));
            memcpy(st->tr.w + o, w + (size_t)t * K, (size_t)K * sizeof(float));
        }
    }
}

void moe_stats_summarize(const double *load, int E, struct moe_load_summary *out)
{
    memset(out, 0, sizeof *out);
    if (E <= 0) return;
    double tot = 0.0, mx = load[0], mn = load[0];
    for (int e = 0; e < E; e++) {
        tot += load[e];
        if (load[e] > mx) {
            mx = load[e];
            out->hottest = e;
        }
        if (load[e] < mn) {
            mn = load[e];
            out->coldest = e;
        }
        out->dead += load[e] == 0.0;
    }
    out->total = tot;
    out->mean = tot / E;
    out->max = mx;
    out->min = mn;
    if (tot <= 0) return;
    double var = 0.0, h = 0.0;
    for (int e = 0; e < E; e++) {
        double d = load[e] - out->mean, p = load[e] / tot;
        var += d * d;
        if (p > 0) h -= p * log(p);
    }
    out->max_mean = mx / out->mean;
    out->cv = sqrt(var / E) / out->mean;
    out->entropy_norm = E > 1 ? h / log((double)E) : 1.0;
}
