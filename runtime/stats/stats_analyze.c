/* stats_analyze.c - per-layer balance tables and comparisons (see
 * stats_analyze.h).  The balance numbers come from moe_stats_summarize, the
 * same function the exporter uses, so a table and the JSON's "derived"
 * block agree. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "router/stats.h"
#include "runtime/stats/stats_analyze.h"

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

double moe_sdata_zipf_fit(const double *counts, int E)
{
    double *v = malloc((size_t)(E > 0 ? E : 1) * sizeof(double));
    if (!v) return NAN;
    memcpy(v, counts, (size_t)E * sizeof(double));
    qsort(v, (size_t)E, sizeof(double), cmp_desc);
    double sx = 0, sy = 0, sxx = 0, sxy = 0, tot = 0;
    int n = 0;
    for (int r = 0; r < E; r++) tot += v[r];
    for (int r = 0; r < E && v[r] > 0; r++, n++) {
        double x = log(r + 1.0), y = log(v[r] / tot);
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    free(v);
    if (n < 2) return NAN;
    return -(n * sxy - sx * sy) / (n * sxx - sx * sx);
}

struct pair {
    double n;
    int a, b;
};

static int cmp_pair(const void *x, const void *y)
{
    const struct pair *p = x, *q = y;
    if (p->n != q->n) return (p->n < q->n) - (p->n > q->n);
    return p->a != q->a ? p->a - q->a : p->b - q->b;
}

/* The `top` most co-activated pairs of layer j into out; returns how many. */
static int top_pairs(const struct moe_sdata *d, int j, int top, struct pair *out)
{
    const int E = d->E;
    const double *c = d->coact + (size_t)j * E * E;
    int n = 0;
    if (top <= 0) return 0;
    for (int a = 0; a < E; a++)
        for (int b = a + 1; b < E; b++) {
            double v = c[(size_t)a * E + b];
            if (v <= 0) continue;
            struct pair p = {v, a, b};
            if (n < top) out[n++] = p;
            else if (cmp_pair(&p, &out[n - 1]) < 0) out[n - 1] = p;
            else continue;
            for (int i = n - 1; i > 0 && cmp_pair(&out[i], &out[i - 1]) < 0; i--) {
                struct pair t = out[i];
                out[i] = out[i - 1];
                out[i - 1] = t;
            }
        }
    return n;
}

void moe_sdata_print_tables(FILE *f, const struct moe_sdata *d, int ntop)
{
    const int E = d->E;
    fprintf(f, "%s: %s, %d MoE layers, %d experts, top-%d, %lld tokens, %lld steps\n", d->path,
            d->from_trace ? "routing trace" : "statistics", d->Lm, E, d->K, (long long)d->tokens,
            (long long)d->steps);
    fprintf(f, "%5s %10s %8s %6s %7s %7s %6s %12s %12s %5s  %s\n", "layer", "pairs", "max/mean",
            "cv", "H_load", "H_route", "zipf_s", "hottest", "coldest", "dead", "top co-activated");
    struct pair *pp = malloc((size_t)(ntop > 0 ? ntop : 1) * sizeof *pp);
    for (int j = 0; j < d->Lm; j++) {
        const double *ld = d->load + (size_t)j * E;
        struct moe_load_summary s;
        moe_stats_summarize(ld, E, &s);
        char hot[32], cold[32], hr[16];
        snprintf(hot, sizeof hot, "%d:%.1f%%", s.hottest, s.total > 0 ? 100 * s.max / s.total : 0);
        snprintf(cold, sizeof cold, "%d:%.1f%%", s.coldest, s.total > 0 ? 100 * s.min / s.total : 0);
        if (isnan(d->ent_norm[j])) snprintf(hr, sizeof hr, "-");
        else snprintf(hr, sizeof hr, "%.3f", d->ent_norm[j]);
        fprintf(f, "%5d %10.0f %8.3f %6.3f %7.3f %7s %6.2f %12s %12s %5d ", d->layers[j], s.total,
                s.max_mean, s.cv, s.entropy_norm, hr, moe_sdata_zipf_fit(d->top1 + (size_t)j * E, E),
                hot, cold, s.dead);
        int n = pp ? top_pairs(d, j, ntop, pp) : 0;
        for (int i = 0; i < n; i++) fprintf(f, " %d+%d:%.0f", pp[i].a, pp[i].b, pp[i].n);
        fprintf(f, "\n");
        if (s.dead > 0 && s.dead <= 16) {
            fprintf(f, "      no tokens:");
            for (int e = 0; e < E; e++)
                if (ld[e] == 0) fprintf(f, " %d", e);
            fprintf(f, "\n");
        }
    }
    free(pp);
    fprintf(f, "pairs: token-slot pairs routed; H_load: entropy of the load shares / log E; "
               "H_route: mean router entropy / log E;\nzipf_s: Zipf exponent fitted to the top-1 "
               "shares; hottest/coldest: expert:share of pairs\n");
}

void moe_sdata_print_compare(FILE *f, const struct moe_sdata *a, const struct moe_sdata *b)
{
    fprintf(f, "compare A=%s\n        B=%s\n", a->path, b->path);
    if (a->E != b->E) {
        fprintf(f, "different expert counts (%d vs %d): nothing to compare layer by layer\n", a->E,
                b->E);
        return;
    }
    const int E = a->E;
    fprintf(f, "%5s %8s %8s %7s %7s %7s %7s %8s  %s\n", "layer", "mm_A", "mm_B", "cv_A", "cv_B",
            "H_A", "H_B", "TV dist", "largest share changes (expert: A% -> B%)");
    double tv_sum = 0;
    int matched = 0;
    for (int i = 0; i < a->Lm; i++) {
        int j = -1;
        for (int k = 0; k < b->Lm; k++)
            if (b->layers[k] == a->layers[i]) j = k;
        if (j < 0) continue;
        const double *la = a->load + (size_t)i * E, *lb = b->load + (size_t)j * E;
        struct moe_load_summary sa, sb;
        moe_stats_summarize(la, E, &sa);
        moe_stats_summarize(lb, E, &sb);
        double tv = 0;
        int big[3] = {-1, -1, -1};
        double bigd[3] = {0, 0, 0};
        for (int e = 0; e < E; e++) {
            double pa = sa.total > 0 ? la[e] / sa.total : 0, pb = sb.total > 0 ? lb[e] / sb.total : 0;
            double dd = fabs(pa - pb);
            tv += dd / 2;
            for (int r = 0; r < 3; r++)
                if (dd > bigd[r]) {
                    for (int q = 2; q > r; q--) {
                        bigd[q] = bigd[q - 1];
                        big[q] = big[q - 1];
                    }
                    bigd[r] = dd;
                    big[r] = e;
                    break;
                }
        }
        tv_sum += tv;
        matched++;
        fprintf(f, "%5d %8.3f %8.3f %7.3f %7.3f %7.3f %7.3f %8.4f ", a->layers[i], sa.max_mean,
                sb.max_mean, sa.cv, sb.cv, sa.entropy_norm, sb.entropy_norm, tv);
        for (int r = 0; r < 3 && big[r] >= 0; r++)
            fprintf(f, " %d: %.1f -> %.1f", big[r], sa.total > 0 ? 100 * la[big[r]] / sa.total : 0,
                    sb.total > 0 ? 100 * lb[big[r]] / sb.total : 0);
        fprintf(f, "\n");
    }
    if (matched)
        fprintf(f, "mean total-variation distance between load shares: %.4f over %d layers "
                "(0 = same distribution, 1 = disjoint)\n", tv_sum / matched, matched);
    else
        fprintf(f, "no layer in common\n");
}
