/* stats_plot.c - the layer x expert load heatmap and per-layer imbalance
 * bars, in the terminal (Unicode blocks) and as SVG (hand-written markup,
 * no dependency).  Cell value: the expert's share of its layer's pairs
 * divided by 1/E (its load ratio; 1 = the balanced share). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "router/stats.h"
#include "runtime/stats/stats_analyze.h"

static const char *const eighths[] = {" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
static const char *const hbar[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉", "█"};

static double ratio(const struct moe_sdata *d, int j, int e, double total)
{
    return total > 0 ? d->load[(size_t)j * d->E + e] * d->E / total : 0.0;
}

void moe_sdata_print_heatmap(FILE *f, const struct moe_sdata *d, int width)
{
    const int E = d->E;
    if (width < 8) width = 8;
    const int bin = (E + width - 1) / width; /* experts per column */
    double vmax = 0;
    double *tot = calloc((size_t)d->Lm + 1, sizeof(double));
    if (!tot) return;
    for (int j = 0; j < d->Lm; j++) {
        for (int e = 0; e < E; e++) tot[j] += d->load[(size_t)j * E + e];
        for (int e = 0; e < E; e++) vmax = fmax(vmax, ratio(d, j, e, tot[j]));
    }
    fprintf(f, "load heatmap (rows: layers, columns: experts%s; bar height = load ratio, full = %.2fx "
            "the balanced share, '.' = no tokens)\n", bin > 1 ? " binned, max per column" : "", vmax);
    for (int j = 0; j < d->Lm; j++) {
        fprintf(f, "%5d |", d->layers[j]);
        for (int c = 0; c * bin < E; c++) {
            double v = 0;
            bool any = false;
            for (int e = c * bin; e < (c + 1) * bin && e < E; e++) {
                v = fmax(v, ratio(d, j, e, tot[j]));
                any |= d->load[(size_t)j * E + e] > 0;
            }
            int lvl = vmax > 0 ? (int)ceil(8 * v / vmax) : 0;
            fputs(!any ? "." : eighths[lvl < 1 ? 1 : lvl > 8 ? 8 : lvl], f);
        }
        fprintf(f, "|\n");
    }
    fprintf(f, "per-layer imbalance (max/mean load)\n");
    double mmax = 1;
    struct moe_load_summary s;
    for (int j = 0; j < d->Lm; j++) {
        moe_stats_summarize(d->load + (size_t)j * E, E, &s);
        mmax = fmax(mmax, s.max_mean);
    }
    for (int j = 0; j < d->Lm; j++) {
        moe_stats_summarize(d->load + (size_t)j * E, E, &s);
        int units = (int)lround(s.max_mean / mmax * 40 * 8);
        fprintf(f, "%5d ", d->layers[j]);
        for (int i = 0; i < units / 8; i++) fputs(hbar[8], f);
        fputs(hbar[units % 8], f);
        fprintf(f, " %.2f\n", s.max_mean);
    }
    free(tot);
}

/* White -> orange -> dark red for t in [0, 1]. */
static void color(double t, char *buf, size_t n)
{
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    int r, g, b;
    if (t < 0.5) {
        double u = t / 0.5;
        r = 255;
        g = (int)(255 - u * (255 - 140));
        b = (int)(255 - u * 255);
    } else {
        double u = (t - 0.5) / 0.5;
        r = (int)(255 - u * (255 - 128));
        g = (int)(140 - u * 140);
        b = 0;
    }
    snprintf(buf, n, "#%02x%02x%02x", r, g, b);
}

enum moe_status moe_sdata_write_svg(const struct moe_sdata *d, const char *path)
{
    const int E = d->E, Lm = d->Lm;
    const int cw = E > 64 ? 6 : 12, ch = 14, left = 60, top = 40;
    const int hw = E * cw, hh = Lm * ch, bar_top = top + hh + 60, bar_h = 14, bar_w = 400;
    const int W = left + (hw > bar_w ? hw : bar_w) + 140, H = bar_top + Lm * (bar_h + 2) + 40;
    FILE *f = fopen(path, "w");
    if (!f) return moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
    double *tot = calloc((size_t)Lm + 1, sizeof(double)), vmax = 0, mmax = 1;
    struct moe_load_summary s;
    if (!tot) {
        fclose(f);
        return moe_fail(MOE_ERR_NOMEM, "svg");
    }
    for (int j = 0; j < Lm; j++) {
        for (int e = 0; e < E; e++) tot[j] += d->load[(size_t)j * E + e];
        for (int e = 0; e < E; e++) vmax = fmax(vmax, ratio(d, j, e, tot[j]));
        moe_stats_summarize(d->load + (size_t)j * E, E, &s);
        mmax = fmax(mmax, s.max_mean);
    }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"11\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Expert load ratio (share x E) per layer; "
            "darkest = %.2f</text>\n", left, vmax);
    char col[16];
    for (int j = 0; j < Lm; j++) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">L%d</text>\n", left - 4,
                top + j * ch + ch - 3, d->layers[j]);
        for (int e = 0; e < E; e++) {
            double r = ratio(d, j, e, tot[j]);
            color(vmax > 0 ? r / vmax : 0, col, sizeof col);
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\">"
                    "<title>layer %d expert %d: %.0f pairs, ratio %.3f</title></rect>\n",
                    left + e * cw, top + j * ch, cw, ch, col, d->layers[j], e,
                    d->load[(size_t)j * E + e], r);
        }
    }
    for (int e = 0; e < E; e += E > 32 ? 8 : 4)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", left + e * cw + cw / 2,
                top + hh + 14, e);
    fprintf(f, "<text x=\"%d\" y=\"%d\">expert</text>\n", left + hw / 2, top + hh + 28);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"14\">Imbalance per layer (max/mean load)"
            "</text>\n", left, bar_top - 10);
    for (int j = 0; j < Lm; j++) {
        moe_stats_summarize(d->load + (size_t)j * E, E, &s);
        int y = bar_top + j * (bar_h + 2);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">L%d</text>\n", left - 4,
                y + bar_h - 3, d->layers[j]);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#4a7ab5\"/>\n", left,
                y, s.max_mean / mmax * bar_w, bar_h);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\">%.2f</text>\n", left + s.max_mean / mmax * bar_w + 4,
                y + bar_h - 3, s.max_mean);
    }
    fprintf(f, "</svg>\n");
    free(tot);
    if (ferror(f) | (fclose(f) != 0)) return moe_fail(MOE_ERR_IO, "%s: write failed", path);
    return MOE_OK;
}
