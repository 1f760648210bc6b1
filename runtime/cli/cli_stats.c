/* cli_stats.c - `moerun stats FILE...`: expert-load analysis of exported
 * statistics (--stats-out) or routing traces (--trace-out): tables, plots,
 * comparisons and what-ifs.  See stats_analyze.h. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/engine/ep.h"
#include "runtime/stats/stats_analyze.h"

struct stats_opts {
    const char *svg, *warm_path, *placement_out;
    long width, pairs, ep, replicas, act_bytes, hidden, cache, expert_bytes, topk, cpu_rows, placement_replicas;
    bool compare, no_plot, accepted_only;
};

#define CMD(member) .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct stats_opts, member)
static const struct moe_cli_opt rows[] = {
    {.name = "svg", .arg = "FILE", .kind = MOE_CLI_STRING, CMD(svg),
     .help = "write the heatmap and imbalance bars as SVG"},
    {.name = "no-plot", .kind = MOE_CLI_FLAG, CMD(no_plot), .help = "tables only"},
    {.name = "width", .arg = "N", .kind = MOE_CLI_INT, CMD(width), .lo = 8, .hi = 4096,
     .help = "heatmap columns (default 100; experts are binned beyond)"},
    {.name = "pairs", .arg = "N", .kind = MOE_CLI_INT, CMD(pairs), .lo = 0, .hi = 1000,
     .help = "co-activated pairs listed per layer (default 3)"},
    {.name = "compare", .kind = MOE_CLI_FLAG, CMD(compare), .help = "compare the two files given"},
    {.name = "accepted-only", .kind = MOE_CLI_FLAG, CMD(accepted_only),
     .help = "speculative decoding: leave out the rows of rejected\n"
             "drafts (default: every row computed)"},
    {.help = "what-ifs (routing trace only):"},
    {.name = "ep", .arg = "N", .kind = MOE_CLI_INT, CMD(ep), .lo = 1, .hi = 1 << 20,
     .help = "expert parallelism over N devices"},
    {.name = "replicas", .arg = "R", .kind = MOE_CLI_INT, CMD(replicas), .lo = 0, .hi = 1 << 20,
     .help = "... with the R hottest experts of each layer on every device"},
    {.name = "placement-out", .arg = "FILE", .kind = MOE_CLI_STRING, CMD(placement_out),
     .help = "with --ep N: write a placement balancing the load\n"
             "(statistics or trace) for `--ep-placement FILE`"},
    {.name = "placement-replicas", .arg = "R", .kind = MOE_CLI_INT, CMD(placement_replicas), .lo = 0,
     .hi = 1 << 20, .help = "... with R extra slots per layer: replicas of the\n"
                            "experts with the most load per copy (default 0)"},
    {.name = "act-bytes", .arg = "B", .kind = MOE_CLI_INT, CMD(act_bytes), .lo = 1, .hi = 16,
     .help = "bytes per activation element sent (default 2)"},
    {.name = "hidden", .arg = "D", .kind = MOE_CLI_INT, CMD(hidden), .lo = 1, .hi = 1 << 20,
     .help = "hidden size for the all-to-all bytes (default: the trace's)"},
    {.name = "cache", .arg = "C", .kind = MOE_CLI_INT, CMD(cache), .lo = 1, .hi = 1 << 20,
     .help = "keep C experts per layer resident (LRU and LFU)"},
    {.name = "warm", .arg = "FILE", .kind = MOE_CLI_STRING, CMD(warm_path),
     .help = "... also starting from FILE's most loaded experts (statistics)"},
    {.name = "cpu-rows", .arg = "R", .kind = MOE_CLI_INT, CMD(cpu_rows), .lo = 1, .hi = 1 << 20,
     .help = "... misses of at most R rows a step computed on the CPU\n"
             "(--gpu-experts-cpu-rows): CPU uses per token"},
    {.name = "expert-bytes", .arg = "B", .kind = MOE_CLI_INT, CMD(expert_bytes), .lo = 1, .hi = (double)LONG_MAX,
     .help = "bytes copied per expert miss (default 3*D*F*weight bytes)"},
    {.name = "topk", .arg = "k", .kind = MOE_CLI_INT, CMD(topk), .lo = 1, .hi = 1 << 20,
     .help = "routing weight kept with k active experts"},
};
#undef CMD

static const struct moe_cli_command stats_cmd = {
    .name = "stats",
    .usage = "usage: moerun stats FILE... [options]\n"
             "       moerun stats --compare A B\n\n"
             "FILE is a statistics JSON (--stats-out) or a routing trace (--trace-out PREFIX:\n"
             "give PREFIX or PREFIX.trace.json).  Prints per-layer balance tables and a heatmap.\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
};

/* The tables, plot and what-ifs of one file. */
static int analyze(const struct stats_opts *o, const struct moe_sdata *d, const struct moe_sdata *warm)
{
    moe_sdata_print_tables(stdout, d, (int)o->pairs);
    if (!o->no_plot) {
        printf("\n");
        moe_sdata_print_heatmap(stdout, d, (int)o->width);
    }
    enum moe_status s = MOE_OK;
    if (o->placement_out) {
        char *text = NULL;
        double ratio = 0;
        s = moe_ep_placement_write((int)o->ep, d->Lm, d->layers, d->E, d->load, (int)o->placement_replicas, d->path,
                                   &text, &ratio);
        FILE *f = s == MOE_OK ? fopen(o->placement_out, "w") : NULL;
        if (s == MOE_OK && (!f || fputs(text, f) < 0 || fputc('\n', f) < 0))
            s = moe_fail(MOE_ERR_IO, "--placement-out %s: cannot write it", o->placement_out);
        if (f && fclose(f) != 0 && s == MOE_OK) s = moe_fail(MOE_ERR_IO, "--placement-out %s: cannot write it",
                                                             o->placement_out);
        free(text);
        if (s == MOE_OK)
            printf("\nplacement over %ld ranks, %ld extra slots per layer, written to %s: predicted busiest rank "
                   "over the mean %.4f (mean over %d MoE layers, whole-file load)\n", o->ep, o->placement_replicas,
                   o->placement_out, ratio, d->Lm);
    }
    if (s == MOE_OK && o->ep && (d->ids || !o->placement_out)) { /* a statistics file: placement only */
        struct moe_ep_opts eo = {(int)o->ep, (int)o->replicas, (int)o->act_bytes, (int)o->hidden};
        printf("\n");
        s = moe_whatif_ep(stdout, d, &eo);
    }
    if (s == MOE_OK && o->cache) {
        printf("\n");
        s = moe_whatif_cache(stdout, d, (int)o->cache, o->expert_bytes, o->warm_path ? warm : NULL, (int)o->cpu_rows);
    }
    if (s == MOE_OK && o->topk) {
        printf("\n");
        s = moe_whatif_topk(stdout, d, (int)o->topk);
    }
    if (s == MOE_OK) return 0;
    fflush(stdout);
    return moe_cli_error("stats", "%s", moe_last_error());
}

int moe_cli_stats(int argc, char **argv)
{
    struct stats_opts o = {.width = 100, .pairs = 3, .act_bytes = 2};
    struct moe_cli_args a;
    int rc = moe_cli_parse(&stats_cmd, argc, argv, &o, &a);
    if (rc >= 0) return rc;
    const int n = a.n_pos;
    if (n < 1) {
        moe_cli_help(&stats_cmd, stderr);
        return 2;
    }
    if (o.compare && n != 2) return moe_cli_error("stats", "--compare takes exactly two files");
    if (o.replicas && !o.ep) return moe_cli_error("stats", "--replicas goes with --ep N");
    if (o.placement_out && !o.ep) return moe_cli_error("stats", "--placement-out goes with --ep N");
    if (o.placement_replicas && !o.placement_out)
        return moe_cli_error("stats", "--placement-replicas goes with --placement-out FILE");
    if (o.placement_out && n != 1) return moe_cli_error("stats", "--placement-out takes one file");
    if (o.placement_out && moe_cli_check_writable("stats", "--placement-out", o.placement_out))
        return 1;
    if (o.cpu_rows && !o.cache) return moe_cli_error("stats", "--cpu-rows goes with --cache C");
    if (o.warm_path && !o.cache) return moe_cli_error("stats", "--warm goes with --cache C");
    struct moe_sdata *d = calloc((size_t)n + 1, sizeof *d), *warm = d + n;
    if (!d) return moe_cli_error("stats", "out of memory");
    rc = 1;
    if (o.warm_path && moe_sdata_load(warm, o.warm_path) != MOE_OK) {
        moe_cli_error("stats", "--warm: %s", moe_last_error());
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (moe_sdata_load(&d[i], a.pos[i]) != MOE_OK) {
            moe_cli_error("stats", "%s", moe_last_error());
            goto done;
        }
        if (o.accepted_only)
            printf("%s: accepted rows only: %lld rows of rejected drafts left out\n", a.pos[i],
                   (long long)moe_sdata_accepted_only(&d[i]));
    }
    if (o.compare) {
        moe_sdata_print_compare(stdout, &d[0], &d[1]);
        rc = 0;
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (i) printf("\n");
        if (analyze(&o, &d[i], warm)) goto done;
    }
    if (o.svg) {
        if (n > 1) fprintf(stderr, "moerun stats: --svg plots the first file\n");
        if (moe_sdata_write_svg(&d[0], o.svg) != MOE_OK) {
            moe_cli_error("stats", "%s", moe_last_error());
            goto done;
        }
    }
    rc = 0;
done:
    for (int i = 0; i <= n; i++) moe_sdata_free(&d[i]); /* d[n]: --warm's */
    free(d);
    return rc;
}
