/* stats_export.c - the recorder as JSON (Jansson), CSV and Prometheus text.
 * The JSON schema is docs/stats-format.md; bump MOE_STATS_VERSION when a
 * field changes meaning or disappears (new fields do not bump it). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "router/stats.h"

static json_t *i64_array(const int64_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *i32_array(const int32_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *real_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

/* Loads of MoE layer j (prefill + decode) as doubles into out (E). */
static void layer_load(const struct moe_stats *st, int j, double *out)
{
    for (int e = 0; e < st->E; e++)
        out[e] = (double)(st->prefill[(size_t)j * st->E + e] + st->decode[(size_t)j * st->E + e]);
}

static json_t *layer_json(const struct moe_stats *st, int j, double *load)
{
    const int E = st->E;
    const size_t o = (size_t)j * E;
    json_t *L = json_object();
    json_object_set_new(L, "layer", json_integer(st->layers[j]));
    layer_load(st, j, load);
    json_t *tot = json_array();
    for (int e = 0; e < E; e++) json_array_append_new(tot, json_integer((json_int_t)load[e]));
    json_object_set_new(L, "tokens", tot);
    json_object_set_new(L, "tokens_prefill", i64_array(st->prefill + o, E));
    json_object_set_new(L, "tokens_decode", i64_array(st->decode + o, E));
    json_object_set_new(L, "tokens_verify", i64_array(st->verify + o, E));
    json_object_set_new(L, "tokens_spec_rejected", i64_array(st->spec_rejected + o, E));
    json_t *ws = json_array();
    for (int e = 0; e < E; e++) json_array_append_new(ws, json_real(st->wsum[o + e]));
    json_object_set_new(L, "weight_sum", ws);
    json_object_set_new(L, "top1", i64_array(st->top1 + o, E));
    double hm = st->ent_n[j] ? st->ent_sum[j] / (double)st->ent_n[j] : NAN;
    json_object_set_new(L, "router_entropy_mean", real_or_null(hm));
    json_object_set_new(L, "router_entropy_norm", real_or_null(E > 1 ? hm / log((double)E) : NAN));
    json_t *co = json_array();
    const int64_t *c = st->coact + o * E;
    for (int a = 0; a < E; a++)
        for (int b = a + 1; b < E; b++)
            if (c[(size_t)a * E + b])
                json_array_append_new(co, json_pack("[i,i,I]", a, b, (json_int_t)c[(size_t)a * E + b]));
    json_object_set_new(L, "coactivation", co);
    json_object_set_new(L, "rejected", json_integer(st->rejected[j]));
    json_object_set_new(L, "bad_weights", json_integer(st->bad_weights[j]));
    struct moe_load_summary s;
    moe_stats_summarize(load, E, &s);
    json_t *dead = json_array();
    for (int e = 0; e < E; e++)
        if (load[e] == 0.0) json_array_append_new(dead, json_integer(e));
    json_object_set_new(L, "derived",
                        json_pack("{s:f, s:f, s:f, s:i, s:i, s:o}", "max_mean_ratio", s.max_mean,
                                  "cv", s.cv, "load_entropy_norm", s.entropy_norm, "hottest",
                                  s.hottest, "coldest", s.coldest, "dead", dead));
    return L;
}

/* Verification rows and what they touched: {"verify_tokens",
 * "rejected_tokens", "chunks": [{"rows", "count", "distinct_experts_mean",
 * "distinct_experts_uniform"}]}, the last the expectation E (1 - (1 -
 * K/E)^rows) under uniform independent routing. */
static json_t *spec_json(const struct moe_stats *st)
{
    json_t *chunks = json_array();
    for (int n = 1; n <= MOE_STATS_SPEC_ROWS; n++) {
        if (!st->spec_chunks[n]) continue;
        double mean = (double)st->spec_distinct[n] / ((double)st->spec_chunks[n] * st->Lm);
        double uni = st->E > 0 ? st->E * (1.0 - pow(1.0 - (double)st->K / st->E, n)) : 0.0;
        json_array_append_new(chunks, json_pack("{s:i, s:I, s:f, s:f}", "rows", n, "count",
                                                (json_int_t)st->spec_chunks[n],
                                                "distinct_experts_mean", mean,
                                                "distinct_experts_uniform", uni));
    }
    return json_pack("{s:I, s:I, s:o}", "verify_tokens", (json_int_t)st->tokens_verify,
                     "rejected_tokens", (json_int_t)st->tokens_spec_rejected, "chunks", chunks);
}

/* Expert parallelism's layout and counters, or null in one process. */
static json_t *parallel_json(const struct moe_stats_meta *mt)
{
    if (mt->ep_ranks < 2 || !mt->ep_bounds || !mt->ep_rows) return json_null();
    const bool contiguous = !mt->ep_placement || !strcmp(mt->ep_placement, "contiguous");
    json_t *experts = contiguous ? json_array() : json_null(), *rows = json_array();
    for (int r = 0; r < mt->ep_ranks; r++) {
        if (contiguous) json_array_append_new(experts, json_pack("[i,i]", mt->ep_bounds[r], mt->ep_bounds[r + 1]));
        json_array_append_new(rows, json_integer((json_int_t)mt->ep_rows[r]));
    }
    return json_pack("{s:i, s:i, s:s, s:o, s:o, s:I, s:f, s:f}", "ranks", mt->ep_ranks, "tensor_parallel",
                     mt->ep_tp > 1 ? mt->ep_tp : 1, "placement", contiguous ? "contiguous" : mt->ep_placement,
                     "experts", experts, "expert_rows", rows, "steps", (json_int_t)mt->ep_steps, "imbalance",
                     mt->ep_imbalance, "gather_seconds", mt->ep_gather_s);
}

json_t *moe_stats_to_json(const struct moe_stats *st, const struct moe_stats_meta *mt)
{
    static const struct moe_stats_meta none = {0};
    if (!mt) mt = &none;
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string(MOE_STATS_FORMAT));
    json_object_set_new(root, "version", json_integer(MOE_STATS_VERSION));
    json_object_set_new(root, "model",
                        json_pack("{s:o, s:o, s:i, s:o, s:i, s:i, s:i, s:i, s:i}", "source",
                                  str_or_null(mt->model), "architecture",
                                  str_or_null(mt->architecture), "layers", st->L, "moe_layers",
                                  i32_array(st->layers, st->Lm), "experts", st->E, "top_k", st->K,
                                  "d_model", mt->d_model, "d_expert", mt->d_expert, "weight_bytes",
                                  mt->weight_bytes));
    json_object_set_new(json_object_get(root, "model"), "expert_bytes", json_integer(mt->expert_bytes));
    json_object_set_new(root, "config",
                        json_pack("{s:o, s:o, s:i, s:o, s:o, s:i, s:b}", "command",
                                  str_or_null(mt->command), "backend", str_or_null(mt->backend),
                                  "threads", mt->threads, "dtype", str_or_null(mt->dtype),
                                  "router_skew", str_or_null(mt->router_skew), "ring_steps",
                                  st->ring_cap, "trace", st->o.trace));
    json_t *range = json_pack("[I,o]", (json_int_t)st->o.step_from,
                              st->o.step_to ? json_integer(st->o.step_to) : json_null());
    json_object_set_new(
        root, "window",
        json_pack("{s:s, s:o, s:I, s:I, s:I, s:o, s:f, s:f, s:f, s:I}", "kind",
                  st->o.step_from || st->o.step_to ? "step_range" : "since_reset", "step_range",
                  range, "first_step", (json_int_t)st->first_step, "last_step",
                  (json_int_t)st->last_step, "steps", (json_int_t)st->steps, "steps_seen",
                  json_integer(st->step), "start_unix", st->t_start, "end_unix", st->t_end,
                  "seconds", st->t_end - st->t_start, "resets", (json_int_t)st->resets));
    json_object_set_new(root, "tokens",
                        json_pack("{s:I, s:I, s:I}", "prefill", (json_int_t)st->tokens_prefill,
                                  "decode", (json_int_t)st->tokens_decode, "total",
                                  (json_int_t)(st->tokens_prefill + st->tokens_decode)));
    json_object_set_new(root, "speculation", spec_json(st));
    json_object_set_new(root, "parallel", parallel_json(mt));
    double *load = malloc((size_t)(st->E > 0 ? st->E : 1) * sizeof(double));
    json_t *layers = json_array();
    for (int j = 0; load && j < st->Lm; j++) json_array_append_new(layers, layer_json(st, j, load));
    free(load);
    json_object_set_new(root, "layers", layers);
    json_t *entries = json_array();
    const size_t LE = (size_t)st->Lm * st->E;
    for (int i = 0; i < st->ring_n; i++) {
        int r = (st->ring_head - st->ring_n + i + st->ring_cap) % st->ring_cap;
        json_t *counts = json_array();
        for (int j = 0; j < st->Lm; j++)
            json_array_append_new(counts,
                                  i32_array(st->ring_counts + r * LE + (size_t)j * st->E, st->E));
        json_array_append_new(entries, json_pack("{s:I, s:i, s:i, s:o}", "step",
                                                 (json_int_t)st->ring_step[r], "tokens",
                                                 st->ring_tokens[r], "decode_tokens",
                                                 st->ring_decode[r], "counts", counts));
    }
    json_object_set_new(root, "steps",
                        json_pack("{s:i, s:I, s:o}", "capacity", st->ring_cap, "dropped",
                                  (json_int_t)st->ring_dropped, "entries", entries));
    json_object_set_new(root, "recorder", json_pack("{s:f}", "seconds", st->busy_s));
    json_object_set_new(root, "trace",
                        st->o.trace ? json_pack("{s:o, s:I, s:b}", "prefix",
                                                str_or_null(mt->trace_prefix), "tokens",
                                                (json_int_t)st->tr.n, "truncated", st->tr.truncated)
                                    : json_null());
    return root;
}

enum moe_status moe_stats_write_json(const struct moe_stats *st, const struct moe_stats_meta *meta,
                                     const char *path)
{
    json_t *j = moe_stats_to_json(st, meta);
    if (!j) return moe_fail(MOE_ERR_NOMEM, "stats: building the JSON");
    int rc = json_dump_file(j, path, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(j);
    if (rc != 0) return moe_fail(MOE_ERR_IO, "%s: cannot write statistics", path);
    return MOE_OK;
}

enum moe_status moe_stats_write_csv(const struct moe_stats *st, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
    fprintf(f, "layer,expert,tokens,tokens_prefill,tokens_decode,weight_sum,mean_weight,top1,"
               "load_share,load_ratio,tokens_verify,tokens_spec_rejected\n");
    for (int j = 0; j < st->Lm; j++) {
        double tot = 0;
        for (int e = 0; e < st->E; e++)
            tot += (double)(st->prefill[(size_t)j * st->E + e] + st->decode[(size_t)j * st->E + e]);
        for (int e = 0; e < st->E; e++) {
            size_t o = (size_t)j * st->E + e;
            int64_t n = st->prefill[o] + st->decode[o];
            double share = tot > 0 ? (double)n / tot : 0.0;
            fprintf(f, "%d,%d,%lld,%lld,%lld,%.9g,%.9g,%lld,%.9g,%.9g,%lld,%lld\n", st->layers[j],
                    e, (long long)n, (long long)st->prefill[o], (long long)st->decode[o],
                    st->wsum[o], n ? st->wsum[o] / (double)n : 0.0, (long long)st->top1[o], share,
                    share * st->E, (long long)st->verify[o], (long long)st->spec_rejected[o]);
        }
    }
    if (fclose(f) != 0) return moe_fail(MOE_ERR_IO, "%s: write failed", path);
    return MOE_OK;
}

static void prom_head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

enum moe_status moe_stats_prometheus(const struct moe_stats *st, FILE *f)
{
    const int E = st->E;
    struct {
        const char *name, *help;
        const int64_t *a, *b; /* value = a (+ b) */
        const double *d;
    } per_expert[] = {
        {"moerun_expert_tokens_total", "Token-slot pairs routed to the expert.", st->prefill,
         st->decode, NULL},
        {"moerun_expert_prefill_tokens_total", "Prefill token-slot pairs routed to the expert.",
         st->prefill, NULL, NULL},
        {"moerun_expert_decode_tokens_total", "Decode token-slot pairs routed to the expert.",
         st->decode, NULL, NULL},
        {"moerun_expert_top1_tokens_total", "Tokens whose first choice was the expert.", st->top1,
         NULL, NULL},
        {"moerun_expert_routing_weight_total", "Sum of the expert's routing weights.", NULL, NULL,
         st->wsum},
    };
    for (size_t m = 0; m < sizeof per_expert / sizeof per_expert[0]; m++) {
        prom_head(f, per_expert[m].name, "counter", per_expert[m].help);
        for (int j = 0; j < st->Lm; j++)
            for (int e = 0; e < E; e++) {
                size_t o = (size_t)j * E + e;
                fprintf(f, "%s{layer=\"%d\",expert=\"%d\"} ", per_expert[m].name, st->layers[j], e);
                if (per_expert[m].d) fprintf(f, "%.9g\n", per_expert[m].d[o]);
                else
                    fprintf(f, "%lld\n", (long long)(per_expert[m].a[o] +
                                                     (per_expert[m].b ? per_expert[m].b[o] : 0)));
            }
    }
    double *load = malloc((size_t)(E > 0 ? E : 1) * sizeof(double));
    struct moe_load_summary *s = malloc((size_t)(st->Lm > 0 ? st->Lm : 1) * sizeof *s);
    if (!load || !s) {
        free(load);
        free(s);
        return moe_fail(MOE_ERR_NOMEM, "stats: prometheus scratch");
    }
    for (int j = 0; j < st->Lm; j++) {
        layer_load(st, j, load);
        moe_stats_summarize(load, E, &s[j]);
    }
    free(load);
    struct {
        const char *name, *help;
        int what;
    } per_layer[] = {
        {"moerun_layer_load_max_mean_ratio", "Max over mean expert load in the window.", 0},
        {"moerun_layer_load_cv", "Coefficient of variation of expert load in the window.", 1},
        {"moerun_layer_load_entropy_norm", "Entropy of the load shares over log(E).", 2},
        {"moerun_layer_router_entropy_mean", "Mean router softmax entropy per token, nats.", 3},
        {"moerun_layer_dead_experts", "Experts that received no token in the window.", 4},
    };
    for (size_t m = 0; m < sizeof per_layer / sizeof per_layer[0]; m++) {
        prom_head(f, per_layer[m].name, "gauge", per_layer[m].help);
        for (int j = 0; j < st->Lm; j++) {
            const double ent = st->ent_n[j] ? st->ent_sum[j] / (double)st->ent_n[j] : NAN;
            double v = per_layer[m].what == 0   ? s[j].max_mean
                       : per_layer[m].what == 1 ? s[j].cv
                       : per_layer[m].what == 2 ? s[j].entropy_norm
                       : per_layer[m].what == 3 ? ent
                                                : s[j].dead;
            fprintf(f, "%s{layer=\"%d\"} ", per_layer[m].name, st->layers[j]);
            if (isnan(v)) fprintf(f, "NaN\n");
            else fprintf(f, "%.9g\n", v);
        }
    }
    free(s);
    prom_head(f, "moerun_stats_tokens_total", "counter", "Tokens recorded in the window by phase.");
    fprintf(f, "moerun_stats_tokens_total{phase=\"prefill\"} %lld\n", (long long)st->tokens_prefill);
    fprintf(f, "moerun_stats_tokens_total{phase=\"decode\"} %lld\n", (long long)st->tokens_decode);
    prom_head(f, "moerun_stats_steps_total", "counter", "Forward steps recorded in the window.");
    fprintf(f, "moerun_stats_steps_total %lld\n", (long long)st->steps);
    prom_head(f, "moerun_stats_window_start_seconds", "gauge", "Unix time the window started.");
    fprintf(f, "moerun_stats_window_start_seconds %.3f\n", st->t_start);
    return ferror(f) ? moe_fail(MOE_ERR_IO, "stats: writing Prometheus text failed") : MOE_OK;
}

enum moe_status moe_stats_prometheus_string(const struct moe_stats *st, char **out)
{
    size_t len = 0;
    *out = NULL;
    FILE *f = open_memstream(out, &len);
    if (!f) return moe_fail(MOE_ERR_NOMEM, "stats: memory stream");
    enum moe_status s = moe_stats_prometheus(st, f);
    if (fclose(f) != 0 && s == MOE_OK) s = moe_fail(MOE_ERR_NOMEM, "stats: memory stream");
    if (s != MOE_OK) {
        free(*out);
        *out = NULL;
    }
    return s;
}
