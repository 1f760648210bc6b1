/* stats_cli.c - see stats_cli.h. */
#include "runtime/cli/stats_cli.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli_par.h"

int moe_cli_stats_check(const struct moe_cli_stats *s, const char *cmd)
{
    if (s->off && (s->json_path || s->csv_path || s->trace_prefix))
        return moe_cli_error(cmd, "--no-stats contradicts --stats-out, --stats-csv and --trace-out");
    char tj[4096];
    if (s->trace_prefix) {
        snprintf(tj, sizeof tj, "%s.trace.json", s->trace_prefix);
        if ((s->json_path && !strcmp(s->json_path, tj)) || (s->csv_path && !strcmp(s->csv_path, tj)))
            return moe_cli_error(cmd, "%s would be both the statistics and the trace description", tj);
    }
    if (s->json_path && s->csv_path && !strcmp(s->json_path, s->csv_path))
        return moe_cli_error(cmd, "--stats-out and --stats-csv name the same file");
    if (s->json_path && moe_cli_check_writable(cmd, "--stats-out", s->json_path)) return 1;
    if (s->csv_path && moe_cli_check_writable(cmd, "--stats-csv", s->csv_path)) return 1;
    if (s->trace_prefix && moe_cli_check_writable(cmd, "--trace-out", tj)) return 1;
    return 0;
}

int moe_cli_stats_start(struct moe_cli_stats *s, const struct moe_model *m, const char *cmd)
{
    if (moe_cli_stats_check(s, cmd)) return 1;
    if (s->off) return 0;
    s->o.trace = s->trace_prefix != NULL;
    if (moe_stats_init(&s->st, &m->cfg, &s->o) != MOE_OK)
        return moe_cli_error(cmd, "%s", moe_last_error());
    s->on = true;
    return 0;
}

struct moe_stats *moe_cli_stats_recorder(struct moe_cli_stats *s) { return s->on ? &s->st : NULL; }

int moe_cli_stats_finish(struct moe_cli_stats *s, const struct moe_model *m,
                         const struct moe_cli_model_opts *mo, const struct moe_backend *be,
                         const char *cmd)
{
    if (!s->on) return 0;
    const struct moe_config *c = &m->cfg;
    int wb;
    const int64_t eb = moe_model_expert_bytes(m, &wb);
    struct moe_stats_meta meta = {
        .model = mo->path ? mo->path : mo->synthetic,
        .architecture = c->architecture,
        .command = cmd,
        .backend = be->ops ? be->ops->name : NULL,
        .threads = be->n_threads,
        .dtype = mo->synthetic ? (mo->dtype ? mo->dtype : "bf16") : NULL,
        .router_skew = mo->router_skew,
        .trace_prefix = s->trace_prefix,
        .d_model = c->d_model,
        .d_expert = c->d_expert,
        .weight_bytes = wb,
        .expert_bytes = eb,
    };
    const struct moe_ep *ep = moe_cli_par_ep();
    if (ep && ep->bounds && ep->rows_rank) {
        meta.ep_ranks = ep->size;
        meta.ep_tp = ep->tp;
        meta.ep_bounds = ep->bounds;
        meta.ep_placement = ep->placement;
        meta.ep_rows = ep->rows_rank;
        meta.ep_steps = ep->n.steps;
        meta.ep_imbalance = ep->n.cells ? ep->n.ratio_sum / (double)ep->n.cells : 0.0;
        meta.ep_gather_s = ep->n.gather_s;
    }
    if (s->json_path && moe_stats_write_json(&s->st, &meta, s->json_path) != MOE_OK)
        return moe_cli_error(cmd, "%s", moe_last_error());
    if (s->csv_path && moe_stats_write_csv(&s->st, s->csv_path) != MOE_OK)
        return moe_cli_error(cmd, "%s", moe_last_error());
    if (s->trace_prefix && moe_stats_write_trace(&s->st, &meta, s->trace_prefix) != MOE_OK)
        return moe_cli_error(cmd, "%s", moe_last_error());
    return 0;
}

void moe_cli_stats_free(struct moe_cli_stats *s)
{
    moe_stats_free(&s->st);
    s->on = false;
}
