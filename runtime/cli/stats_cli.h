/* stats_cli.h - the statistics options shared by the commands that run a
 * model (run, bench, batch, serve): --stats-out, --stats-csv,
 * --trace-out, --stats-steps, --stats-ring, --no-stats, --router-skew.
 *
 * A command adds MOE_CLI_STATS_OPTIONS to its getopt table, passes unknown
 * option codes to moe_cli_stats_option, calls moe_cli_stats_check after
 * parsing, moe_cli_stats_start after the
 * model is open (the recorder is on unless --no-stats), points its forward
 * pass at moe_cli_stats_recorder(), and calls moe_cli_stats_finish at the
 * end to write the files. */
#pragma once

#include <getopt.h>
#include <stdbool.h>

#include "router/stats.h"
#include "runtime/backend/backend.h"
#include "runtime/cli/cli_common.h"

#define MOE_CLI_OPT_STATS 0x5100
#define MOE_CLI_STATS_OPTIONS                                                                  \
    {"stats-out", required_argument, 0, MOE_CLI_OPT_STATS + 0},                                \
        {"stats-csv", required_argument, 0, MOE_CLI_OPT_STATS + 1},                            \
        {"trace-out", required_argument, 0, MOE_CLI_OPT_STATS + 2},                            \
        {"stats-steps", required_argument, 0, MOE_CLI_OPT_STATS + 3},                          \
        {"stats-ring", required_argument, 0, MOE_CLI_OPT_STATS + 4},                           \
        {"no-stats", no_argument, 0, MOE_CLI_OPT_STATS + 5},                                   \
        {"router-skew", required_argument, 0, MOE_CLI_OPT_STATS + 6}

#define MOE_CLI_STATS_USAGE                                                                    \
    "  --stats-out FILE   expert-load statistics as JSON (docs/stats-format.md)\n"             \
    "  --stats-csv FILE   the same, one row per (layer, expert)\n"                             \
    "  --trace-out PREFIX routing trace: PREFIX.ids.npy, .weights.npy, .tokens.npy, .trace.json\n" \
    "  --stats-steps A:B  record steps A..B-1 only (B empty: to the end)\n"                    \
    "  --stats-ring N     per-step counts kept for the last N steps (default 64)\n"            \
    "  --no-stats         do not record statistics\n"                                          \
    "  --router-skew SPEC synthetic router skew: zipf:S or hot:H:F (with --synthetic)\n"

struct moe_cli_stats {
    const char *json_path, *csv_path, *trace_prefix;
    bool off;
    struct moe_stats_opts o;
    struct moe_stats st;
    bool on;          /* recorder initialised */
};

/* 1: handled; 0: not a statistics option; -1: bad value (message printed). */
int moe_cli_stats_option(struct moe_cli_stats *s, struct moe_cli_model_opts *mo, int code,
                         const char *arg, const char *cmd);
/* Checks the options for contradictions; returns 0 or 1 (printed). */
int moe_cli_stats_check(const struct moe_cli_stats *s, const char *cmd);
/* Starts the recorder unless --no-stats; returns 0 or 1 (printed). */
int moe_cli_stats_start(struct moe_cli_stats *s, const struct moe_model *m, const char *cmd);
/* The recorder for moe_forward.stats, or NULL when off. */
struct moe_stats *moe_cli_stats_recorder(struct moe_cli_stats *s);
/* Writes the requested files; returns 0 or 1 (printed). */
int moe_cli_stats_finish(struct moe_cli_stats *s, const struct moe_model *m,
                         const struct moe_cli_model_opts *mo, const struct moe_backend *be,
                         const char *cmd);
void moe_cli_stats_free(struct moe_cli_stats *s);
