/* test_stats.c - the expert-load recorder (router/stats.h): counts per layer
 * sum to tokens x K, prefill and decode apart, windows and the ring, no
 * counter touched out of range by NaN / equal / garbage routing, and the
 * JSON, CSV and Prometheus exports against docs/stats-format.md.  Also the
 * recorder hooked into the real forward pass. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/router.h"
#include "router/stats.h"
#include "runtime/engine/runner.h"
#include "tests/testutil.h"

#define E_ 8
#define K_ 2

static struct moe_config small_cfg(void)
{
    struct moe_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 3;
    c.n_experts = E_;
    c.top_k = K_;
    c.layer_moe[0] = c.layer_moe[2] = true; /* layer 1 dense */
    return c;
}

/* A batch of n_seqs sequences of `len` rows each; sequence s decodes when
 * dec[s]. Arrays live in the struct. */
struct tb {
    struct moe_batch b;
    int32_t seq_of[256], pos[256], start[17];
    uint8_t dec[16];
    int64_t req[16];
};

static void make_batch(struct tb *t, int n_seqs, const int *len, const uint8_t *dec)
{
    memset(t, 0, sizeof *t);
    int row = 0;
    for (int s = 0; s < n_seqs; s++) {
        t->start[s] = row;
        for (int i = 0; i < len[s]; i++, row++) {
            t->seq_of[row] = s;
            t->pos[row] = 10 * s + i;
        }
        t->dec[s] = dec[s];
        t->req[s] = 100 + s;
    }
    t->start[n_seqs] = row;
    t->b.n_tokens = row;
    t->b.n_seqs = n_seqs;
    t->b.seq_of = t->seq_of;
    t->b.positions = t->pos;
    t->b.seq_start = t->start;
    t->b.decode = t->dec;
    t->b.request_ids = t->req;
}

/* Routes T rows of seeded random logits through the CPU router. */
static void route(int T, uint64_t seed, int32_t *ids, float *w, float *logits)
{
    tu_fill_uniform(logits, (size_t)T * E_, seed, -3, 3);
    moe_router_topk_cpu(ids, w, logits, T, E_, K_, true);
}

static int64_t sum64(const int64_t *v, int n)
{
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}

Test(stats, counts_sum_to_tokens_times_k)
{
    struct moe_config c = small_cfg();
    struct moe_stats st;
    struct moe_stats_opts o = {.trace = true};
    cr_assert_eq(moe_stats_init(&st, &c, &o), MOE_OK);
    cr_assert_eq(st.Lm, 2);
    cr_assert_eq(st.slot[1], -1);
    int32_t ids[64 * K_];
    float w[64 * K_], logits[64 * E_];
    int64_t tokens = 0, dec_tokens = 0;
    for (int step = 0; step < 5; step++) {
        struct tb t;
        int len[3] = {7 + step, 1, 1};
        uint8_t dec[3] = {0, 1, 1};
        make_batch(&t, 3, len, dec);
        cr_assert_eq(moe_stats_step_begin(&st, &t.b), MOE_OK);
        for (int l = 0; l < 3; l++) {
            route(t.b.n_tokens, 77 + (uint64_t)step * 3 + (uint64_t)l, ids, w, logits);
            moe_stats_record_layer(&st, l, t.b.n_tokens, ids, w, logits);
        }
        tokens += t.b.n_tokens;
        dec_tokens += 2;
    }
    cr_assert_eq(st.tokens_prefill + st.tokens_decode, tokens);
    cr_assert_eq(st.tokens_decode, dec_tokens);
    for (int j = 0; j < st.Lm; j++) {
        int64_t pre = sum64(st.prefill + j * E_, E_), dec = sum64(st.decode + j * E_, E_);
        cr_assert_eq(pre + dec, tokens * K_, "layer %d: %lld pairs", j, (long long)(pre + dec));
        cr_assert_eq(dec, dec_tokens * K_);
        cr_assert_eq(sum64(st.top1 + j * E_, E_), tokens);
        cr_assert_eq(sum64(st.coact + j * E_ * E_, E_ * E_), tokens * K_ * (K_ - 1) / 2);
        double ws = 0;
        for (int e = 0; e < E_; e++) ws += st.wsum[j * E_ + e];
        cr_assert_float_eq(ws, (double)tokens, 1e-4); /* renormalised weights sum to 1 */
        cr_assert_eq(st.ent_n[j], tokens);
        cr_assert_eq(st.rejected[j], 0);
    }
    /* the ring's last entry is the last step */
    int r = (st.ring_head + st.ring_cap - 1) % st.ring_cap;
    cr_assert_eq(st.ring_step[r], 4);
    int64_t rs = 0;
    for (int e = 0; e < E_; e++) rs += st.ring_counts[(size_t)r * 2 * E_ + e];
    cr_assert_eq(rs, (int64_t)st.ring_tokens[r] * K_);
    /* trace rows carry step, request id, position, phase */
    cr_assert_eq(st.tr.n, tokens);
    const int64_t *m = st.tr.meta + (tokens - 1) * 4;
    cr_assert(m[0] == 4 && m[1] == 102 && m[2] == 20 && m[3] == 1, "%lld %lld %lld %lld",
              (long long)m[0], (long long)m[1], (long long)m[2], (long long)m[3]);
    moe_stats_free(&st);
    moe_stats_free(&st); /* twice is fine */
}

Test(stats, nan_equal_and_garbage_routing_stay_in_range)
{
    struct moe_config c = small_cfg();
    struct moe_stats st;
    cr_assert_eq(moe_stats_init(&st, &c, NULL), MOE_OK);
    struct tb t;
    int len[1] = {4};
    uint8_t dec[1] = {0};
    make_batch(&t, 1, len, dec);
    cr_assert_eq(moe_stats_step_begin(&st, &t.b), MOE_OK);
    float logits[4 * E_];
    int32_t ids[4 * K_];
    float w[4 * K_];
    for (int i = 0; i < 4 * E_; i++) logits[i] = 0.5f; /* all equal */
    for (int e = 0; e < E_; e++) logits[E_ + e] = NAN; /* a NaN row */
    logits[2 * E_ + 3] = NAN;                          /* one NaN */
    logits[3 * E_ + 5] = 1e30f;                        /* one huge logit: entropy 0 */
    moe_router_topk_cpu(ids, w, logits, 4, E_, K_, true);
    for (int i = 0; i < 4 * K_; i++) cr_assert(ids[i] >= 0 && ids[i] < E_);
    moe_stats_record_layer(&st, 0, 4, ids, w, logits);
    cr_assert_eq(sum64(st.prefill, E_), 4 * K_);
    cr_assert_eq(st.ent_n[0], 2, "entropy only where defined (all-equal, one NaN is not)");
    cr_assert_float_eq(st.ent_sum[0], log((double)E_), 1e-6);
    /* garbage ids and weights straight into the recorder */
    int32_t bad_ids[4 * K_] = {-1, 3, 8, 1 << 30, 2, 2, INT32_MIN, 7};
    float bad_w[4 * K_] = {NAN, 0.5f, INFINITY, 1, -INFINITY, 0.25f, 1, NAN};
    moe_stats_record_layer(&st, 2, 4, bad_ids, bad_w, NULL);
    cr_assert_eq(st.rejected[1], 4);
    cr_assert_eq(st.bad_weights[1], 2); /* -inf on expert 2, NaN on 7 */
    cr_assert_eq(st.prefill[E_ + 2], 2);
    cr_assert_eq(st.coact[(size_t)E_ * E_ + 2 * E_ + 2], 0, "an expert twice is no pair");
    cr_assert_eq(st.top1[E_ + 2], 1);
    /* dense, out-of-range and negative layers are ignored */
    moe_stats_record_layer(&st, 1, 4, ids, w, NULL);
    moe_stats_record_layer(&st, 3, 4, ids, w, NULL);
    moe_stats_record_layer(&st, -1, 4, ids, w, NULL);
    cr_assert_eq(sum64(st.prefill, 2 * E_), 4 * K_ + 4);
    moe_stats_free(&st);
}

static void run_steps(struct moe_stats *st, int n)
{
    int32_t ids[8 * K_];
    float w[8 * K_], logits[8 * E_];
    for (int s = 0; s < n; s++) {
        struct tb t;
        int len[1] = {3};
        uint8_t dec[1] = {(uint8_t)(s > 0)};
        make_batch(&t, 1, len, dec);
        cr_assert_eq(moe_stats_step_begin(st, &t.b), MOE_OK);
        route(3, (uint64_t)s + 1, ids, w, logits);
        moe_stats_record_layer(st, 0, 3, ids, w, logits);
        moe_stats_record_layer(st, 2, 3, ids, w, logits);
    }
}

Test(stats, step_range_ring_and_reset)
{
    struct moe_config c = small_cfg();
    struct moe_stats st;
    struct moe_stats_opts o = {.ring_steps = 3, .step_from = 2, .step_to = 5};
    cr_assert_eq(moe_stats_init(&st, &c, &o), MOE_OK);
    run_steps(&st, 7);
    cr_assert_eq(st.steps, 3);
    cr_assert_eq(st.first_step, 2);
    cr_assert_eq(st.last_step, 4);
    cr_assert_eq(st.step, 7);
    cr_assert_eq(sum64(st.prefill, E_) + sum64(st.decode, E_), 3 * 3 * K_);
    cr_assert_eq(st.ring_n, 3);
    json_t *j = moe_stats_to_json(&st, NULL);
    json_t *ent = json_object_get(json_object_get(j, "steps"), "entries");
    cr_assert_eq(json_array_size(ent), 3);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(ent, 0), "step")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "window"), "kind")),
                     "step_range");
    json_decref(j);
    moe_stats_reset(&st);
    cr_assert_eq(st.resets, 1);
    cr_assert_eq(st.steps, 0);
    cr_assert_eq(sum64(st.prefill, 2 * E_) + sum64(st.decode, 2 * E_), 0);
    cr_assert_eq(st.ring_n, 0);
    moe_stats_free(&st);

    /* a small ring drops the oldest steps and says so */
    struct moe_stats_opts o2 = {.ring_steps = 2};
    cr_assert_eq(moe_stats_init(&st, &c, &o2), MOE_OK);
    run_steps(&st, 5);
    cr_assert_eq(st.ring_n, 2);
    cr_assert_eq(st.ring_dropped, 3);
    cr_assert_eq(st.ring_step[(st.ring_head + 1) % 2], 4);
    moe_stats_free(&st);
}

static void expect_type(json_t *o, const char *key, json_type type)
{
    json_t *v = json_object_get(o, key);
    cr_assert(v, "missing key '%s'", key);
    cr_assert(json_typeof(v) == type || (type == JSON_REAL && json_is_integer(v)),
              "key '%s' has type %d, want %d", key, (int)json_typeof(v), (int)type);
}

Test(stats, json_parses_and_matches_the_documented_schema)
{
    struct moe_config c = small_cfg();
    struct moe_stats st;
    struct moe_stats_opts o = {.trace = true};
    cr_assert_eq(moe_stats_init(&st, &c, &o), MOE_OK);
    run_steps(&st, 4);
    char path[] = "/tmp/moerun-stats-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    struct moe_stats_meta meta = {.model = "m", .architecture = "X", .command = "test",
                                  .backend = "cpu", .threads = 1, .trace_prefix = "/tmp/p",
                                  .d_model = 16, .d_expert = 8, .weight_bytes = 2};
    cr_assert_eq(moe_stats_write_json(&st, &meta, path), MOE_OK);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert(j, "%s", err.text);
    cr_assert_str_eq(json_string_value(json_object_get(j, "format")), "moerun-expert-stats");
    cr_assert_eq(json_integer_value(json_object_get(j, "version")), 1);
    json_t *m = json_object_get(j, "model");
    const char *mk[] = {"layers", "experts", "top_k", "d_model", "d_expert", "weight_bytes"};
    for (size_t i = 0; i < 6; i++) expect_type(m, mk[i], JSON_INTEGER);
    expect_type(m, "moe_layers", JSON_ARRAY);
    expect_type(m, "source", JSON_STRING);
    expect_type(m, "architecture", JSON_STRING);
    json_t *cf = json_object_get(j, "config");
    expect_type(cf, "command", JSON_STRING);
    expect_type(cf, "backend", JSON_STRING);
    expect_type(cf, "threads", JSON_INTEGER);
    expect_type(cf, "ring_steps", JSON_INTEGER);
    cr_assert(json_is_boolean(json_object_get(cf, "trace")));
    cr_assert(json_is_null(json_object_get(cf, "router_skew")));
    json_t *w = json_object_get(j, "window");
    expect_type(w, "kind", JSON_STRING);
    expect_type(w, "step_range", JSON_ARRAY);
    const char *wk[] = {"first_step", "last_step", "steps", "steps_seen", "resets"};
    for (size_t i = 0; i < 5; i++) expect_type(w, wk[i], JSON_INTEGER);
    const char *wr[] = {"start_unix", "end_unix", "seconds"};
    for (size_t i = 0; i < 3; i++) expect_type(w, wr[i], JSON_REAL);
    json_t *tk = json_object_get(j, "tokens");
    cr_assert_eq(json_integer_value(json_object_get(tk, "total")), 12);
    cr_assert_eq(json_integer_value(json_object_get(tk, "decode")), 9);
    json_t *layers = json_object_get(j, "layers");
    cr_assert_eq(json_array_size(layers), 2);
    for (size_t l = 0; l < 2; l++) {
        json_t *L = json_array_get(layers, l);
        cr_assert_eq(json_integer_value(json_object_get(L, "layer")), l == 0 ? 0 : 2);
        const char *arrs[] = {"tokens", "tokens_prefill", "tokens_decode", "weight_sum", "top1"};
        json_int_t total = 0;
        for (size_t a = 0; a < 5; a++) {
            json_t *v = json_object_get(L, arrs[a]);
            cr_assert_eq(json_array_size(v), E_, "%s", arrs[a]);
            for (size_t e = 0; e < E_; e++) cr_assert(json_is_number(json_array_get(v, e)));
        }
        json_t *tok = json_object_get(L, "tokens");
        for (size_t e = 0; e < E_; e++) total += json_integer_value(json_array_get(tok, e));
        cr_assert_eq(total, 12 * K_);
        expect_type(L, "router_entropy_mean", JSON_REAL);
        expect_type(L, "router_entropy_norm", JSON_REAL);
        expect_type(L, "coactivation", JSON_ARRAY);
        json_t *pr = json_array_get(json_object_get(L, "coactivation"), 0);
        cr_assert_eq(json_array_size(pr), 3);
        cr_assert_lt(json_integer_value(json_array_get(pr, 0)),
                     json_integer_value(json_array_get(pr, 1)));
        json_t *d = json_object_get(L, "derived");
        const char *dk[] = {"max_mean_ratio", "cv", "load_entropy_norm"};
        for (size_t i = 0; i < 3; i++) expect_type(d, dk[i], JSON_REAL);
        expect_type(d, "hottest", JSON_INTEGER);
        expect_type(d, "coldest", JSON_INTEGER);
        expect_type(d, "dead", JSON_ARRAY);
    }
    json_t *steps = json_object_get(j, "steps");
    expect_type(steps, "capacity", JSON_INTEGER);
    expect_type(steps, "dropped", JSON_INTEGER);
    json_t *e0 = json_array_get(json_object_get(steps, "entries"), 0);
    cr_assert_eq(json_array_size(json_object_get(e0, "counts")), 2);
    json_t *tr = json_object_get(j, "trace");
    cr_assert_str_eq(json_string_value(json_object_get(tr, "prefix")), "/tmp/p");
    cr_assert_eq(json_integer_value(json_object_get(tr, "tokens")), 12);
    json_decref(j);
    remove(path);
    moe_stats_free(&st);
}

Test(stats, csv_and_prometheus_agree_with_the_counters)
{
    struct moe_config c = small_cfg();
    struct moe_stats st;
    cr_assert_eq(moe_stats_init(&st, &c, NULL), MOE_OK);
    run_steps(&st, 3);
    char path[] = "/tmp/moerun-csv-XXXXXX";
    cr_assert(mkstemp(path) >= 0);
    cr_assert_eq(moe_stats_write_csv(&st, path), MOE_OK);
    FILE *f = fopen(path, "r");
    char line[512];
    int rows = 0;
    cr_assert(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "layer,expert,tokens,tokens_prefill,tokens_decode,weight_sum,mean_weight,"
                           "top1,load_share,load_ratio,tokens_verify,tokens_spec_rejected\n");
    while (fgets(line, sizeof line, f)) {
        int layer, e;
        long long n, pre, dec;
        cr_assert_eq(sscanf(line, "%d,%d,%lld,%lld,%lld", &layer, &e, &n, &pre, &dec), 5, "%s", line);
        int j = st.slot[layer];
        cr_assert_eq(n, st.prefill[j * E_ + e] + st.decode[j * E_ + e]);
        cr_assert_eq(pre + dec, n);
        rows++;
    }
    fclose(f);
    remove(path);
    cr_assert_eq(rows, 2 * E_);

    char *text = NULL;
    cr_assert_eq(moe_stats_prometheus_string(&st, &text), MOE_OK);
    char want[128];
    snprintf(want, sizeof want, "moerun_expert_tokens_total{layer=\"2\",expert=\"7\"} %lld\n",
             (long long)(st.prefill[E_ + 7] + st.decode[E_ + 7]));
    cr_assert(strstr(text, want), "%s not in:\n%s", want, text);
    cr_assert(strstr(text, "# TYPE moerun_expert_tokens_total counter\n"));
    cr_assert(strstr(text, "# TYPE moerun_layer_load_max_mean_ratio gauge\n"));
    cr_assert(strstr(text, "moerun_stats_tokens_total{phase=\"decode\"} 6\n"), "%s", text);
    /* every sample line: name{labels} value, or name value */
    for (char *p = text, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        cr_assert(nl, "text ends with a newline");
        if (*p == '#') continue;
        char name[128], rest[256];
        double v;
        bool ok = sscanf(p, "%127[a-z_]%255[^ ] %lf", name, rest, &v) == 3 ||
                  sscanf(p, "%127[a-z_] %lf", name, &v) == 2;
        cr_assert(ok, "bad line %.*s", (int)(nl - p), p);
    }
    free(text);
    moe_stats_free(&st);
}

/* The recorder inside the real forward pass: prefill and decode apart, the
 * trace equals the forward pass's own routing record. */
Test(stats, forward_pass_records_every_moe_layer)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cfg.n_layers = 2;
    struct moe_model m;
    cr_assert_eq(moe_model_synthetic(&m, &cfg, MOE_DTYPE_F32, 5), MOE_OK, "%s", moe_last_error());
    struct moe_backend be;
    cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK);
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = 16, .max_seqs = 2, .max_logits = 16, .block_size = 4,
                                .n_blocks = 32};
    cr_assert_eq(moe_runner_init(&r, &m, &be, &o), MOE_OK);
    struct moe_stats st;
    struct moe_stats_opts so = {.trace = true};
    cr_assert_eq(moe_stats_init(&st, &cfg, &so), MOE_OK);
    r.fw.stats = &st;
    int32_t prompt[12], out[5];
    for (int i = 0; i < 12; i++) prompt[i] = 3 * i + 1;
    struct moe_seq s = {0};
    cr_assert_eq(moe_runner_greedy(&r, &s, prompt, 12, 5, 5, out), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(st.tokens_prefill, 12);
    cr_assert_eq(st.tokens_decode, 4);
    cr_assert_eq(st.steps, 3 + 4);
    const int K = cfg.top_k, E = cfg.n_experts;
    for (int j = 0; j < 2; j++) {
        cr_assert_eq(sum64(st.prefill + j * E, E), 12 * K);
        cr_assert_eq(sum64(st.decode + j * E, E), 4 * K);
    }
    /* one more step beside a second sequence, with the forward's own trace */
    struct moe_seq s2 = {0};
    int32_t ids_ref[2 * 3 * 8];
    struct moe_route_trace rt = {ids_ref, NULL};
    struct moe_chunk ch[2] = {{&s, out, 1, false, true, 41}, {&s2, prompt, 2, false, false, 0}};
    int64_t n0 = st.tr.n;
    cr_assert_eq(moe_runner_step(&r, ch, 2, NULL, NULL, NULL, &rt), MOE_OK, "%s", moe_last_error());
    for (int l = 0; l < 2; l++)
        for (int t = 0; t < 3; t++)
            for (int k = 0; k < K; k++)
                cr_assert_eq(st.tr.ids[((n0 + t) * 2 + l) * K + k], ids_ref[(l * 3 + t) * K + k]);
    const int64_t *meta = st.tr.meta + n0 * 4;
    cr_assert(meta[1] == 41 && meta[2] == 16 && meta[3] == 1, "decode row of request 41 at 16");
    cr_assert(meta[5] == 1 && meta[6] == 0 && meta[7] == 0, "prefill row: request = chunk index 1");
    moe_seq_free(&r, &s);
    moe_seq_free(&r, &s2);
    moe_stats_free(&st);
    moe_runner_free(&r);
    moe_backend_free(&be);
    moe_model_free(&m);
}
