/* stats_whatif.c - what-ifs replayed from a routing trace (see
 * stats_analyze.h and docs/stats-format.md for the models):
 *
 * --ep N      expert parallelism over N devices.  Each step's rows are split
 *             contiguously over the devices (row i of T on device iN/T); a
 *             (token, slot) pair is computed on the device holding its
 *             expert; a token sends its hidden vector once to every other
 *             device holding one of its experts and gets it back (dispatch +
 *             combine: 2 * D * act_bytes per distinct remote device).
 *             Placements: contiguous, balanced (from the measured load), and
 *             balanced with the R hottest experts replicated on every device
 *             (their pairs stay on the token's device).
 * --cache C   C experts per layer resident; each step needs its distinct
 *             experts, taken as the CUDA backend takes them with
 *             --gpu-experts C (experts/expert_cache.c, the same code: those
 *             resident first, by id, in rounds of at most C); a miss copies
 *             one expert (3 * D * F * weight bytes) from the host; LRU and
 *             LFU (all-time use counts, ties to LRU) evict, preferring experts
 *             the step has not used.  Starts cold.
 * --topk k    routing weight kept by the k largest of the K weights. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "experts/expert_cache.h"
#include "runtime/stats/stats_analyze.h"

void moe_ep_contiguous(int E, int N, int32_t *place)
{
    for (int e = 0; e < E; e++) place[e] = (int32_t)((int64_t)e * N / E);
}

double moe_ep_max_load(const double *load, int E, int N, const int32_t *place)
{
    double *dev = calloc((size_t)N, sizeof(double)), mx = 0;
    if (!dev) return INFINITY;
    for (int e = 0; e < E; e++) dev[place[e]] += load[e];
    for (int d = 0; d < N; d++) mx = fmax(mx, dev[d]);
    free(dev);
    return mx;
}

struct bb {
    const double *load;
    int E, N, cap;
    int *order, *cnt;
    double *dev, best_max, bound;
    int32_t *cur, *best;
    long nodes;
};

static void bb_search(struct bb *b, int i, double cur_max)
{
    if (cur_max >= b->best_max || b->best_max <= b->bound || b->nodes > 20000000) return;
    if (i == b->E) {
        b->best_max = cur_max;
        memcpy(b->best, b->cur, (size_t)b->E * sizeof(int32_t));
        return;
    }
    b->nodes++;
    const int e = b->order[i];
    bool tried_empty = false;
    for (int d = 0; d < b->N; d++) {
        if (b->cnt[d] >= b->cap) continue;
        if (b->cnt[d] == 0) { /* empty devices are interchangeable */
            if (tried_empty) continue;
            tried_empty = true;
        }
        b->dev[d] += b->load[e];
        b->cnt[d]++;
        b->cur[e] = d;
        bb_search(b, i + 1, fmax(cur_max, b->dev[d]));
        b->dev[d] -= b->load[e];
        b->cnt[d]--;
    }
}

/* qsort_r order of expert indices: load descending, then index. */
static int cmp_load_desc(const void *x, const void *y, void *ctx)
{
    const double *key = ctx;
    int a = *(const int *)x, b = *(const int *)y;
    if (key[a] != key[b]) return key[a] < key[b] ? 1 : -1;
    return a - b;
}

void moe_ep_balanced(const double *load, int E, int N, int32_t *place)
{
    const int cap = (E + N - 1) / N;
    int *order = malloc((size_t)E * sizeof(int)), *cnt = calloc((size_t)N, sizeof(int));
    double *dev = calloc((size_t)N, sizeof(double));
    int32_t *cur = malloc((size_t)E * sizeof(int32_t));
    moe_ep_contiguous(E, N, place);
    if (!order || !cnt || !dev || !cur) goto done;
    for (int e = 0; e < E; e++) order[e] = e;
    qsort_r(order, (size_t)E, sizeof(int), cmp_load_desc, (void *)load);
    /* longest first onto the least loaded device with room */
    for (int i = 0; i < E; i++) {
        int best = -1;
        for (int d = 0; d < N; d++)
            if (cnt[d] < cap && (best < 0 || dev[d] < dev[best])) best = d;
        cur[order[i]] = best;
        dev[best] += load[order[i]];
        cnt[best]++;
    }
    /* moves and swaps off the most loaded device while they lower it; the
     * sum of squared device loads falls strictly, so this ends */
    for (int it = 0; it < 100000; it++) {
        int dm = 0;
        for (int d = 1; d < N; d++)
            if (dev[d] > dev[dm]) dm = d;
        bool improved = false;
        for (int a = 0; a < E && !improved; a++) {
            if (cur[a] != dm) continue;
            for (int d = 0; d < N && !improved; d++) {
                if (d == dm) continue;
                if (cnt[d] < cap && load[a] > 0 && dev[d] + load[a] < dev[dm]) {
                    dev[dm] -= load[a];
                    dev[d] += load[a];
                    cnt[dm]--;
                    cnt[d]++;
                    cur[a] = d;
                    improved = true;
                    break;
                }
                for (int b = 0; b < E; b++) {
                    if (cur[b] != d || load[b] >= load[a]) continue;
                    double delta = load[a] - load[b];
                    if (dev[d] + delta < dev[dm]) {
                        dev[dm] -= delta;
                        dev[d] += delta;
                        cur[a] = d;
                        cur[b] = dm;
                        improved = true;
                        break;
                    }
                }
            }
        }
        if (!improved) break;
    }
    double heur = moe_ep_max_load(load, E, N, cur);
    if (E <= 16) { /* exact for small cases */
        double total = 0, mx = 0;
        for (int e = 0; e < E; e++) {
            total += load[e];
            mx = fmax(mx, load[e]);
        }
        int32_t *best = malloc((size_t)E * sizeof(int32_t));
        if (best) {
            memcpy(best, cur, (size_t)E * sizeof(int32_t));
            memset(cnt, 0, (size_t)N * sizeof(int));
            memset(dev, 0, (size_t)N * sizeof(double));
            int32_t *tmp = malloc((size_t)E * sizeof(int32_t));
            if (tmp) {
                struct bb b = {load, E,   N,  cap, order, cnt, dev, heur, fmax(total / N, mx),
                               tmp,  best, 0};
                bb_search(&b, 0, 0.0);
                memcpy(cur, best, (size_t)E * sizeof(int32_t));
                heur = b.best_max;
            }
            free(tmp);
            free(best);
        }
    }
    if (heur <= moe_ep_max_load(load, E, N, place)) memcpy(place, cur, (size_t)E * sizeof(int32_t));
done:
    free(order);
    free(cnt);
    free(dev);
    free(cur);
}

struct ep_scheme {
    const char *name;
    int32_t *place;   /* (Lm, E); -1 = replicated */
    double sum_ratio, worst_ratio, sum_max, bytes, agg_max;
    double *dev_total; /* (N) */
    int per_device;   /* experts held per device */
};

static void ep_replay(const struct moe_sdata *d, int N, double bytes_per_send, struct ep_scheme *s,
                      int64_t *n_steps, int64_t *n_cells)
{
    const int Lm = d->Lm, E = d->E, K = d->K;
    double *dev = calloc((size_t)N, sizeof(double));
    char *remote = calloc((size_t)N, 1);
    if (!dev || !remote) goto done;
    *n_steps = *n_cells = 0;
    int64_t t0 = 0;
    while (t0 < d->N) {
        int64_t t1 = t0 + 1;
        while (t1 < d->N && d->meta[t1 * 4] == d->meta[t0 * 4]) t1++;
        const int64_t T = t1 - t0;
        (*n_steps)++;
        for (int j = 0; j < Lm; j++) {
            memset(dev, 0, (size_t)N * sizeof(double));
            const int32_t *pl = s->place + (size_t)j * E;
            for (int64_t t = t0; t < t1; t++) {
                const int src = (int)((t - t0) * N / T);
                const int32_t *id = d->ids + ((size_t)t * Lm + j) * K;
                memset(remote, 0, (size_t)N);
                for (int k = 0; k < K; k++) {
                    if (id[k] < 0 || id[k] >= E) continue;
                    int dst = pl[id[k]] < 0 ? src : pl[id[k]];
                    dev[dst] += 1;
                    if (dst != src && !remote[dst]) {
                        remote[dst] = 1;
                        s->bytes += bytes_per_send;
                    }
                }
            }
            double mx = 0, mean = (double)T * K / N;
            for (int q = 0; q < N; q++) {
                mx = fmax(mx, dev[q]);
                s->dev_total[q] += dev[q];
            }
            s->sum_max += mx;
            s->sum_ratio += mx / mean;
            s->worst_ratio = fmax(s->worst_ratio, mx / mean);
            (*n_cells)++;
        }
        t0 = t1;
    }
done:
    free(dev);
    free(remote);
}

enum moe_status moe_whatif_ep(FILE *f, const struct moe_sdata *d, const struct moe_ep_opts *o)
{
    const int Lm = d->Lm, E = d->E, N = o->devices, R = o->replicas;
    if (!d->ids) return moe_fail(MOE_ERR_INVALID_ARG, "%s: --ep needs a routing trace", d->path);
    if (N < 1 || N > E) return moe_fail(MOE_ERR_INVALID_ARG, "--ep %d with %d experts", N, E);
    if (R < 0 || R >= E) return moe_fail(MOE_ERR_INVALID_ARG, "--replicas %d with %d experts", R, E);
    const int D = o->d_model > 0 ? o->d_model : d->d_model, ab = o->act_bytes > 0 ? o->act_bytes : 2;
    struct ep_scheme sc[3] = {
        {.name = "contiguous"}, {.name = "balanced"}, {.name = "balanced+replicas"}};
    const int ns = R > 0 ? 3 : 2;
    enum moe_status st = MOE_OK;
    double *sub = malloc((size_t)E * sizeof(double));
    int *idx = malloc((size_t)E * sizeof(int));
    int32_t *subp = malloc((size_t)E * sizeof(int32_t));
    for (int s = 0; s < ns; s++) {
        sc[s].place = malloc((size_t)Lm * E * sizeof(int32_t) + 1);
        sc[s].dev_total = calloc((size_t)N, sizeof(double));
        if (!sc[s].place || !sc[s].dev_total) st = MOE_ERR_NOMEM;
    }
    if (st != MOE_OK || !sub || !idx || !subp) {
        st = moe_fail(MOE_ERR_NOMEM, "ep what-if");
        goto done;
    }
    for (int j = 0; j < Lm; j++) {
        const double *ld = d->load + (size_t)j * E;
        moe_ep_contiguous(E, N, sc[0].place + (size_t)j * E);
        moe_ep_balanced(ld, E, N, sc[1].place + (size_t)j * E);
        sc[0].agg_max += moe_ep_max_load(ld, E, N, sc[0].place + (size_t)j * E);
        sc[1].agg_max += moe_ep_max_load(ld, E, N, sc[1].place + (size_t)j * E);
        if (R > 0) { /* the R hottest on every device, the rest balanced */
            for (int e = 0; e < E; e++) idx[e] = e;
            qsort_r(idx, (size_t)E, sizeof(int), cmp_load_desc, (void *)ld);
            int32_t *pl = sc[2].place + (size_t)j * E;
            for (int r = 0; r < R; r++) pl[idx[r]] = -1;
            for (int r = R; r < E; r++) sub[r - R] = ld[idx[r]];
            moe_ep_balanced(sub, E - R, N, subp);
            for (int r = R; r < E; r++) pl[idx[r]] = subp[r - R];
        }
    }
    sc[0].per_device = sc[1].per_device = (E + N - 1) / N;
    sc[2].per_device = (E - R + N - 1) / N + R;
    const double send = 2.0 * D * ab;
    int64_t steps = 0, cells = 0;
    for (int s = 0; s < ns; s++) ep_replay(d, N, send, &sc[s], &steps, &cells);
    fprintf(f, "expert parallelism over %d devices: %lld tokens, %lld steps, %d MoE layers; "
            "D = %d, %d bytes per activation%s\n", N, (long long)d->N, (long long)steps, Lm, D, ab,
            D ? "" : " (D unknown: give --hidden)");
    fprintf(f, "%-18s %9s %9s %13s %13s %11s\n", "placement", "max/mean", "worst",
            "max dev pairs", "a2a MB/step", "experts/dev");
    for (int s = 0; s < ns; s++) {
        double tot = 0;
        for (int q = 0; q < N; q++) tot += sc[s].dev_total[q];
        double aggr = s < 2 && tot > 0 ? sc[s].agg_max / (tot / N) : NAN;
        fprintf(f, "%-18s %9.3f %9.3f %13.1f %13.3f %11d\n", sc[s].name,
                cells ? sc[s].sum_ratio / cells : 0, sc[s].worst_ratio,
                cells ? sc[s].sum_max / cells : 0, steps ? sc[s].bytes / steps / 1e6 : 0,
                sc[s].per_device);
        if (!isnan(aggr))
            fprintf(f, "%-18s   whole-trace max/mean device load (what the placement "
                    "minimises): %.4f\n", "", aggr);
        fprintf(f, "%-18s   device shares:", "");
        for (int q = 0; q < N && q < 16; q++)
            fprintf(f, " %.1f%%", tot > 0 ? 100 * sc[s].dev_total[q] / tot : 0);
        fprintf(f, "%s\n", N > 16 ? " ..." : "");
    }
    fprintf(f, "max/mean: per (step, layer), max device pairs over T*K/N, averaged; worst: its "
            "maximum;\nmax dev pairs: mean of the max device's pairs per (step, layer); a2a: "
            "dispatch + combine bytes per step\nover all MoE layers; replicas: the %d hottest "
            "experts of each layer on every device\n", R);
done:
    for (int s = 0; s < 3; s++) {
        free(sc[s].place);
        free(sc[s].dev_total);
    }
    free(sub);
    free(idx);
    free(subp);
    return st;
}

void moe_cache_simulate(const struct moe_sdata *d, int j, int C, bool lfu, const double *warm,
                        int cpu_rows, struct moe_cache_result *r)
{
    const int E = d->E, K = d->K, Lm = d->Lm;
    memset(r, 0, sizeof *r);
    struct moe_expert_cache c;
    if (moe_expert_cache_init(&c, E, C, lfu) != MOE_OK) return;
    if (warm) moe_expert_cache_warm(&c, warm);
    int32_t *counts = calloc(2 * (size_t)E, sizeof *counts), *order = malloc((size_t)E * sizeof *order),
            *slot = malloc((size_t)E * sizeof *slot), *rest = counts + E;
    bool *loaded = malloc((size_t)E * sizeof *loaded);
    int64_t t0 = 0;
    while (counts && order && slot && loaded && t0 < d->N) {
        int64_t t1 = t0 + 1;
        while (t1 < d->N && d->meta[t1 * 4] == d->meta[t0 * 4]) t1++;
        /* the step's rows of each expert, then the backend's rounds */
        memset(counts, 0, (size_t)E * sizeof *counts);
        for (int64_t t = t0; t < t1; t++)
            for (int k = 0; k < K; k++) {
                const int e = d->ids[((size_t)t * Lm + j) * K + k];
                if (e >= 0 && e < E) counts[e]++;
            }
        /* misses of few rows to the CPU (order is free until the cache's own) */
        const int n_cpu = moe_expert_cache_split(&c, counts, cpu_rows, rest, order);
        r->cpu_uses += n_cpu;
        for (int i = 0; i < n_cpu; i++) r->cpu_rows += counts[order[i]];
        const int m = moe_expert_cache_order(&c, rest, order);
        for (int next = 0; next < m;)
            if (moe_expert_cache_fill(&c, order, m, &next, slot, loaded) == 0) break;
        t0 = t1;
    }
    r->accesses = c.accesses;
    r->hits = c.hits;
    moe_expert_cache_free(&c);
    free(counts);
    free(order);
    free(slot);
    free(loaded);
}

enum moe_status moe_whatif_cache(FILE *f, const struct moe_sdata *d, int C, int64_t expert_bytes,
                                 const struct moe_sdata *warm, int cpu_rows)
{
    if (!d->ids) return moe_fail(MOE_ERR_INVALID_ARG, "%s: --cache needs a routing trace", d->path);
    if (C < 1 || C > d->E) return moe_fail(MOE_ERR_INVALID_ARG, "--cache %d with %d experts", C, d->E);
    if (warm && (warm->Lm != d->Lm || warm->E != d->E))
        return moe_fail(MOE_ERR_INVALID_ARG, "--warm %s: %d MoE layers of %d experts, the trace %s has %d of %d",
                        warm->path, warm->Lm, warm->E, d->path, d->Lm, d->E);
    if (expert_bytes <= 0) expert_bytes = d->expert_bytes;
    if (expert_bytes <= 0)
        expert_bytes = 3ll * d->d_model * d->d_expert * (d->weight_bytes ? d->weight_bytes : 2);
    fprintf(f, "expert cache of %d of %d experts per layer, %lld tokens; one expert = %.3f MB\n", C,
            d->E, (long long)d->N, expert_bytes / 1e6);
    if (cpu_rows > 0)
        fprintf(f, "misses of at most %d rows in a step computed on the CPU, not copied in\n", cpu_rows);
    fprintf(f, "%-9s %9s %10s %10s %16s%s\n", "policy", "hit rate", "worst layer", "best layer",
            "H2D MB/token", cpu_rows > 0 ? "  CPU uses/token  rows/use" : "");
    for (int run = 0; run < (warm ? 4 : 2); run++) {
        const bool lfu = run & 1, w = run >= 2;
        int64_t acc = 0, hits = 0, cpu = 0, cpu_r = 0;
        double lo = 1, hi = 0;
        for (int j = 0; j < d->Lm; j++) {
            struct moe_cache_result r;
            moe_cache_simulate(d, j, C, lfu, w ? warm->load + (size_t)j * d->E : NULL, cpu_rows, &r);
            acc += r.accesses;
            hits += r.hits;
            cpu += r.cpu_uses;
            cpu_r += r.cpu_rows;
            double h = r.accesses ? (double)r.hits / r.accesses : 1;
            lo = fmin(lo, h);
            hi = fmax(hi, h);
        }
        fprintf(f, "%-9s %9.4f %10.4f %10.4f %16.4f", w ? (lfu ? "LFU+warm" : "LRU+warm") : lfu ? "LFU" : "LRU",
                acc ? (double)hits / acc : 1.0, lo, hi,
                d->N ? (double)(acc - hits) * expert_bytes / d->N / 1e6 : 0);
        if (cpu_rows > 0)
            fprintf(f, "  %14.4f  %8.2f", d->N ? (double)cpu / d->N : 0, cpu ? (double)cpu_r / cpu : 0);
        fputc('\n', f);
    }
    fprintf(f, "accesses: distinct experts each step needs per layer; a miss copies one expert "
            "(3*D*F*weight bytes) from the host; +warm: the slots start with each layer's %d most "
            "loaded experts of the --warm statistics.  The CUDA backend runs these with --gpu-experts %d "
            "[--gpu-experts-policy lfu] [--gpu-experts-warm FILE]", C, C);
    if (cpu_rows > 0) fprintf(f, " --gpu-experts-cpu-rows %d (hit rate: of the uses on the device)", cpu_rows);
    fputc('\n', f);
    return MOE_OK;
}

enum moe_status moe_whatif_topk(FILE *f, const struct moe_sdata *d, int k)
{
    const int K = d->K, Lm = d->Lm;
    if (!d->ids) return moe_fail(MOE_ERR_INVALID_ARG, "%s: --topk needs a routing trace", d->path);
    if (k < 1 || k > K) return moe_fail(MOE_ERR_INVALID_ARG, "--topk %d: the model routes to %d", k, K);
    double *kept = calloc((size_t)K, sizeof(double)), *wk = malloc((size_t)K * sizeof(double));
    if (!kept || !wk) {
        free(kept);
        free(wk);
        return moe_fail(MOE_ERR_NOMEM, "topk what-if");
    }
    int64_t n = 0;
    for (int64_t t = 0; t < d->N; t++)
        for (int j = 0; j < Lm; j++) {
            const float *w = d->w + ((size_t)t * Lm + j) * K;
            double tot = 0;
            bool ok = true;
            for (int i = 0; i < K; i++) {
                wk[i] = w[i];
                ok &= isfinite(w[i]) && w[i] >= 0;
                tot += w[i];
            }
            if (!ok || tot <= 0) continue;
            for (int a = 1; a < K; a++) /* descending, K is small */
                for (int b = a; b > 0 && wk[b] > wk[b - 1]; b--) {
                    double x = wk[b];
                    wk[b] = wk[b - 1];
                    wk[b - 1] = x;
                }
            double acc = 0;
            for (int i = 0; i < K; i++) kept[i] += (acc += wk[i]) / tot;
            n++;
        }
    fprintf(f, "routing weight kept with fewer active experts (%lld token-layers)\n", (long long)n);
    fprintf(f, "%4s %12s\n", "k", "weight kept");
    for (int i = 0; i < K; i++)
        fprintf(f, "%4d %12.4f%s\n", i + 1, n ? kept[i] / n : 0, i + 1 == k ? "   <- --topk" : "");
    fprintf(f, "fraction of the K chosen experts' weight carried by the k largest, mean over "
            "tokens and layers\n");
    free(kept);
    free(wk);
    return MOE_OK;
}
