/* cli_stats.c - `moerun stats FILE...`: expert-load analysis of exported
 * statistics (--stats-out) or routing traces (--trace-out): tables, plots,
 * comparisons and what-ifs.  See stats_analyze.h. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/stats/stats_analyze.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moerun stats FILE... [options]\n"
            "       moerun stats --compare A B\n\n"
            "FILE is a statistics JSON (--stats-out) or a routing trace (--trace-out PREFIX:\n"
            "give PREFIX or PREFIX.trace.json).  Prints per-layer balance tables and a heatmap.\n\n"
            "  --svg FILE        write the heatmap and imbalance bars as SVG\n"
            "  --no-plot         tables only\n"
            "  --width N         heatmap columns (default 100; experts are binned beyond)\n"
            "  --pairs N         co-activated pairs listed per layer (default 3)\n"
            "  --compare         compare the two files given\n"
            "what-ifs (routing trace only):\n"
            "  --ep N            expert parallelism over N devices\n"
            "  --replicas R      ... with the R hottest experts of each layer on every device\n"
            "  --act-bytes B     bytes per activation element sent (default 2)\n"
            "  --hidden D        hidden size for the all-to-all bytes (default: the trace's)\n"
            "  --cache C         keep C experts per layer resident (LRU and LFU)\n"
            "  --warm FILE       ... also starting from FILE's most loaded experts (statistics)\n"
            "  --cpu-rows R      ... misses of at most R rows a step computed on the CPU\n"
            "                    (--gpu-experts-cpu-rows): CPU uses per token\n"
            "  --expert-bytes B  bytes copied per expert miss (default 3*D*F*weight bytes)\n"
            "  --topk k          routing weight kept with k active experts\n");
}

int moe_cli_stats(int argc, char **argv)
{
    const char *svg = NULL, *warm_path = NULL;
    long width = 100, pairs = 3, ep = 0, replicas = 0, act_bytes = 2, hidden = 0, cache = 0,
         expert_bytes = 0, topk = 0, cpu_rows = 0;
    int compare = 0, plot = 1;
    static const struct option opts[] = {
        {"svg", required_argument, 0, 's'},     {"no-plot", no_argument, 0, 'P'},
        {"width", required_argument, 0, 'w'},   {"pairs", required_argument, 0, 'p'},
        {"compare", no_argument, 0, 'c'},       {"ep", required_argument, 0, 'e'},
        {"replicas", required_argument, 0, 'r'}, {"act-bytes", required_argument, 0, 'a'},
        {"hidden", required_argument, 0, 'D'},  {"cache", required_argument, 0, 'C'},
        {"expert-bytes", required_argument, 0, 'b'}, {"topk", required_argument, 0, 'k'},
        {"warm", required_argument, 0, 'W'},    {"cpu-rows", required_argument, 0, 'R'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = moe_cli_getopt(argc, argv, "h", opts, "stats")) != -1) {
        long *dst = NULL, lo = 1, hi = 1 << 20;
        switch (c) {
        case 's': svg = optarg; break;
        case 'W': warm_path = optarg; break;
        case 'P': plot = 0; break;
        case 'c': compare = 1; break;
        case 'w': dst = &width; lo = 8; hi = 4096; break;
        case 'p': dst = &pairs; lo = 0; hi = 1000; break;
        case 'e': dst = &ep; break;
        case 'r': dst = &replicas; lo = 0; break;
        case 'a': dst = &act_bytes; hi = 16; break;
        case 'D': dst = &hidden; break;
        case 'C': dst = &cache; break;
        case 'b': dst = &expert_bytes; hi = __LONG_MAX__; break;
        case 'k': dst = &topk; break;
        case 'R': dst = &cpu_rows; break;
        case 'h': usage(stdout); return 0;
        default: return 2;
        }
        if (dst && !moe_cli_parse_int(optarg, lo, hi, dst))
            return moe_cli_error("stats", "option value '%s' is out of range", optarg);
    }
    int n = argc - optind;
    if (n < 1) {
        usage(stderr);
        return 2;
    }
    if (compare && n != 2) return moe_cli_error("stats", "--compare takes exactly two files");
    if (replicas && !ep) return moe_cli_error("stats", "--replicas goes with --ep N");
    if (cpu_rows && !cache) return moe_cli_error("stats", "--cpu-rows goes with --cache C");
    if (warm_path && !cache) return moe_cli_error("stats", "--warm goes with --cache C");
    struct moe_sdata *d = calloc((size_t)n + 1, sizeof *d), *warm = d + n;
    if (!d) return moe_cli_error("stats", "out of memory");
    int rc = 1;
    if (warm_path && moe_sdata_load(warm, warm_path) != MOE_OK) {
        moe_cli_error("stats", "--warm: %s", moe_last_error());
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (moe_sdata_load(&d[i], argv[optind + i]) != MOE_OK) {
            moe_cli_error("stats", "%s", moe_last_error());
            goto done;
        }
    if (compare) {
        moe_sdata_print_compare(stdout, &d[0], &d[1]);
        rc = 0;
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (i) printf("\n");
        moe_sdata_print_tables(stdout, &d[i], (int)pairs);
        if (plot) {
            printf("\n");
            moe_sdata_print_heatmap(stdout, &d[i], (int)width);
        }
        enum moe_status s = MOE_OK;
        if (ep) {
            struct moe_ep_opts eo = {(int)ep, (int)replicas, (int)act_bytes, (int)hidden};
            printf("\n");
            s = moe_whatif_ep(stdout, &d[i], &eo);
        }
        if (s == MOE_OK && cache) {
            printf("\n");
            s = moe_whatif_cache(stdout, &d[i], (int)cache, expert_bytes, warm_path ? warm : NULL, (int)cpu_rows);
        }
        if (s == MOE_OK && topk) {
            printf("\n");
            s = moe_whatif_topk(stdout, &d[i], (int)topk);
        }
        if (s != MOE_OK) {
            fflush(stdout);
            moe_cli_error("stats", "%s", moe_last_error());
            goto done;
        }
    }
    if (svg) {
        if (n > 1) fprintf(stderr, "moerun stats: --svg plots the first file\n");
        if (moe_sdata_write_svg(&d[0], svg) != MOE_OK) {
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
