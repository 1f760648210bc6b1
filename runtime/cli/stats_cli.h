/* stats_cli.h - the statistics options shared by the commands that run a
 * model (run, bench, batch, serve): --stats-out, --stats-csv,
 * --trace-out, --stats-steps, --stats-ring, --no-stats, --router-skew.
 *
 * A command takes the "@stats" rows of the option table (cli_opts.c),
 * which fill its struct moe_cli_stats, calls moe_cli_stats_check after
 * parsing, moe_cli_stats_start after the
 * model is open (the recorder is on unless --no-stats), points its forward
 * pass at moe_cli_stats_recorder(), and calls moe_cli_stats_finish at the
 * end to write the files. */
#pragma once

#include <stdbool.h>

#include "router/stats.h"
#include "runtime/backend/backend.h"
#include "runtime/cli/cli_common.h"

struct moe_cli_stats {
    const char *json_path, *csv_path, *trace_prefix;
    bool off;
    struct moe_stats_opts o;
    struct moe_stats st;
    bool on;          /* recorder initialised */
};

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
