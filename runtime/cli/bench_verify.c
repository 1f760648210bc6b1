/* bench_verify.c - `moerun bench verify`: what a speculative verification
 * step costs the target.
 *
 * One sequence is prefilled with --ctx random tokens (untimed).  Then, for
 * K = 0..--max-k, --steps steps of K + 1 rows of that sequence are timed,
 * each as the engine runs a verification (logits and the argmax of every
 * row, runtime/engine/engine.c) and each rolled back afterwards
 * (moe_seq_truncate), so every step sees the same context; K = 0 is a
 * plain decode row.  A step's time is the mean over --steps, best of
 * --repeat runs after a warm-up run.  Untimed steps of the same shape,
 * with the routing record on, count the distinct experts each MoE layer
 * touches, beside the uniform-routing expectation E (1 - (1 - k/E)^(K+1))
 * that `moerun plan` predicts with (plan_spec.h). */
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli.h"
#include "runtime/core/clock.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_par.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/cli/plan_spec.h"
#include "runtime/engine/runner.h"

struct verify_opts {
    struct moe_cli_engine eng;
    long ctx, max_k, steps, repeat;
};

#define CMD(member) .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct verify_opts, member)
static const struct moe_cli_opt rows[] = {
    {.name = "ctx", .arg = "N", .kind = MOE_CLI_INT, CMD(ctx), .lo = 1, .hi = 1 << 24,
     .help = "context of the sequence (default 512)"},
    {.name = "max-k", .arg = "K", .kind = MOE_CLI_INT, CMD(max_k), .lo = 1, .hi = 16,
     .help = "verify K = 0 (a decode row) to K drafted tokens (default 8)"},
    {.name = "steps", .arg = "N", .kind = MOE_CLI_INT, CMD(steps), .lo = 1, .hi = 1 << 20,
     .help = "steps per measurement (default 16)"},
    {.name = "repeat", .arg = "N", .kind = MOE_CLI_INT, CMD(repeat), .lo = 1, .hi = 1 << 20,
     .help = "runs per measurement, best reported (default 3)"},
};
#undef CMD

static const char *const shared[] = {"@model", "backend", "threads", "kv-dtype", "quantize", NULL};

static const struct moe_cli_command verify_cmd = {
    .name = "bench verify",
    .usage = "usage: moerun bench verify MODEL_DIR [options]\n"
             "       moerun bench verify --synthetic CONFIG.json [options]\n\n"
             "The time of one step of K + 1 rows of one sequence (a speculative\n"
             "verification) against one decode row, and the distinct experts it touches\n"
             "per MoE layer, for K = 0..max-k.\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
    .shared = shared,
    .engine_at = offsetof(struct verify_opts, eng),
};

/* The measurement of one K. */
struct verify_row {
    double seconds;  /* a step, mean over --steps, best of --repeat */
    double distinct; /* distinct experts per MoE layer, mean over layers and steps */
};

struct verify_ctx {
    struct moe_runner r;
    struct moe_seq seq;
    int32_t *tokens, *ids, *trace_ids; /* (ctx), (rows), (L, rows, top-k) */
    int ctx, V;
    uint64_t rng;
};

static int32_t next_token(struct verify_ctx *v)
{
    uint64_t z = (v->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (int32_t)((z ^ (z >> 31)) % (uint64_t)v->V);
}

/* One step of n rows after the context, rolled back; with trace, the
 * distinct experts per MoE layer added to *distinct and the layers to *layers. */
static enum moe_status verify_step(struct verify_ctx *v, int n, bool trace, double *distinct, int *layers)
{
    for (int i = 0; i < n; i++) v->tokens[v->ctx + i] = next_token(v);
    struct moe_route_trace tr = {.ids = v->trace_ids};
    const struct moe_chunk c = {&v->seq, v->tokens + v->ctx, n, true, n == 1, 0};
    MOE_TRY(moe_runner_step(&v->r, &c, 1, NULL, v->ids, NULL, trace ? &tr : NULL));
    moe_seq_truncate(&v->r, &v->seq, v->ctx);
    if (!trace) return MOE_OK;
    const struct moe_config *cfg = &v->r.m->cfg;
    const int K = cfg->top_k;
    for (int l = 0; l < cfg->n_layers; l++) {
        const int32_t *ids = v->trace_ids + (size_t)l * n * K;
        if (ids[0] < 0) continue; /* a dense layer */
        int count = 0;
        for (int i = 0; i < n * K; i++) {
            bool seen = false;
            for (int j = 0; j < i && !seen; j++) seen = ids[j] == ids[i];
            count += !seen;
        }
        *distinct += count;
        ++*layers;
    }
    return MOE_OK;
}

static enum moe_status verify_measure(struct verify_ctx *v, const struct verify_opts *o, int n,
                                      struct verify_row *row)
{
    row->seconds = 1e30;
    for (int rep = 0; rep <= o->repeat; rep++) { /* rep 0 warms up */
        const double t0 = moe_seconds();
        for (int st = 0; st < o->steps; st++) MOE_TRY(verify_step(v, n, false, NULL, NULL));
        const double t = (moe_seconds() - t0) / (double)o->steps;
        if (rep > 0 && t < row->seconds) row->seconds = t;
    }
    double distinct = 0;
    int layers = 0;
    for (int st = 0; st < o->steps; st++) MOE_TRY(verify_step(v, n, true, &distinct, &layers));
    row->distinct = layers ? distinct / layers : 0;
    return MOE_OK;
}

/* The runner and buffers for one sequence of ctx + max_k + 1 tokens, its context prefilled. */
static enum moe_status verify_prepare(struct verify_ctx *v, const struct verify_opts *o, const struct moe_model *m,
                                      struct moe_backend *be)
{
    const int rows_max = (int)o->max_k + 1, len = (int)o->ctx + rows_max, block = 16;
    if (len > m->cfg.max_pos)
        return moe_fail(MOE_ERR_INVALID_ARG, "--ctx %ld and --max-k %ld exceed the model's context of %d", o->ctx,
                        o->max_k, m->cfg.max_pos);
    const int chunk = o->ctx < 512 ? (int)o->ctx : 512;
    struct moe_runner_opts ro = {.max_tokens = chunk > rows_max ? chunk : rows_max, .max_seqs = 1,
                                 .max_logits = rows_max, .block_size = block, .n_blocks = (len + block - 1) / block};
    if (o->eng.kv_dtype) ro.kv_dtype_set = moe_cli_parse_kv_dtype(o->eng.kv_dtype, &ro.kv_dtype);
    *v = (struct verify_ctx){.ctx = (int)o->ctx, .V = m->cfg.vocab, .rng = 12345};
    v->tokens = malloc((size_t)len * sizeof *v->tokens);
    v->ids = malloc((size_t)rows_max * sizeof *v->ids);
    v->trace_ids = malloc((size_t)m->cfg.n_layers * rows_max * (m->cfg.top_k ? m->cfg.top_k : 1) * sizeof(int32_t));
    if (!v->tokens || !v->ids || !v->trace_ids) return moe_fail(MOE_ERR_NOMEM, "bench verify: buffers");
    MOE_TRY(moe_cli_par_runner(&o->eng, be, &ro));
    MOE_TRY(moe_runner_init(&v->r, m, be, &ro));
    for (int i = 0; i < v->ctx; i++) v->tokens[i] = next_token(v);
    for (int off = 0; off < v->ctx; off += chunk) {
        const int n = v->ctx - off < chunk ? v->ctx - off : chunk;
        const struct moe_chunk c = {&v->seq, v->tokens + off, n, false, false, 0};
        MOE_TRY(moe_runner_step(&v->r, &c, 1, NULL, NULL, NULL, NULL));
    }
    return MOE_OK;
}

static void verify_free(struct verify_ctx *v)
{
    if (v->r.m) moe_seq_free(&v->r, &v->seq);
    moe_runner_free(&v->r);
    free(v->tokens);
    free(v->ids);
    free(v->trace_ids);
}

int moe_cli_bench_verify(int argc, char **argv)
{
    struct verify_opts o = {.ctx = 512, .max_k = 8, .steps = 16, .repeat = 3};
    struct moe_model m = {0};
    struct moe_backend be = {0};
    struct verify_ctx v = {0};
    struct moe_cli_args a;
    moe_cli_engine_defaults(&o.eng);
    int rc = moe_cli_parse(&verify_cmd, argc, argv, &o, &a);
    if (rc >= 0) return rc;
    if (a.n_pos > 0) o.eng.model.path = a.pos[0];
    if (a.n_pos > 1) return moe_cli_error("bench verify", "unexpected argument '%s'", a.pos[1]);
    if (!o.eng.model.path && !o.eng.model.synthetic) return moe_cli_error("bench verify", "no model given");
    rc = 1;
    if (moe_cli_backend_start(&be, &o.eng) != MOE_OK) goto fail;
    o.eng.model.device_weights = o.eng.model.synthetic && be.ops->synth_fill;
    if (moe_cli_open_model(&m, &o.eng.model) != MOE_OK || verify_prepare(&v, &o, &m, &be) != MOE_OK) goto fail;
    const double E = m.cfg.n_experts, k = m.cfg.top_k;
    printf("%s on %s, %d threads: one sequence at context %ld, mean of %ld steps, best of %ld runs\n",
           o.eng.model.path ? o.eng.model.path : o.eng.model.synthetic, be.ops->name, be.n_threads, o.ctx, o.steps,
           o.repeat);
    printf("%3s %5s %9s %9s %14s %10s\n", "K", "rows", "step ms", "x decode", "experts/layer", "expected");
    double t_decode = 0;
    for (int K = 0; K <= o.max_k; K++) {
        struct verify_row row;
        if (verify_measure(&v, &o, K + 1, &row) != MOE_OK) goto fail;
        if (K == 0) t_decode = row.seconds;
        printf("%3d %5d %9.3f %9.2f %14.2f %10.2f\n", K, K + 1, row.seconds * 1e3, row.seconds / t_decode,
               row.distinct, moe_plan_distinct_experts(E, k, K + 1));
        fflush(stdout);
    }
    rc = 0;
    goto done;
fail:
    moe_cli_error("bench verify", "%s", moe_last_error());
done:
    verify_free(&v);
    moe_backend_free(&be);
    moe_model_free(&m);
    return rc;
}
