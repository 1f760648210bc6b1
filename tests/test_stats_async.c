/* test_stats_async.c - expert-load statistics through the forward pass's
 * asynchronous path (every step whose routing fits the host buffers: routing
 * copied with to_host_async during the step, every MoE layer recorded after
 * the step's sync) against the synchronous per-layer path (forced with
 * stats_async_rows = 0) on the same steps: identical counters, ring, trace
 * and JSON, on both CPU backends.  Also: the synchronous fallback when the
 * host buffers cannot be allocated (said once on stderr), and the graph gate
 * (steps with asynchronous statistics may be recorded, under a key of their
 * own; synchronous statistics and traces keep graphs off). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "router/stats.h"
#include "runtime/engine/runner.h"
#include "tests/testutil.h"

struct side {
    struct moe_config cfg;
    struct moe_model m;
    struct moe_backend be;
    struct moe_runner r;
    struct moe_stats st;
};

static void side_open(struct side *s, bool fast)
{
    memset(s, 0, sizeof *s);
    cr_assert_eq(moe_config_load(&s->cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    s->cfg.layer_moe[1] = false; /* a dense layer between MoE layers: slices by layer index */
    s->cfg.d_ff = 96;
    cr_assert_eq(moe_model_synthetic(&s->m, &s->cfg, MOE_DTYPE_F32, 9), MOE_OK, "%s",
                 moe_last_error());
    if (fast) cr_assert_eq(moe_backend_cpu_fast_init(&s->be, 1), MOE_OK);
    else cr_assert_eq(moe_backend_cpu_init(&s->be, 1), MOE_OK);
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 4, .max_logits = 64,
                                .block_size = 4, .n_blocks = 128};
    cr_assert_eq(moe_runner_init(&s->r, &s->m, &s->be, &o), MOE_OK, "%s", moe_last_error());
    struct moe_stats_opts so = {.trace = true, .ring_steps = 64};
    cr_assert_eq(moe_stats_init(&s->st, &s->cfg, &so), MOE_OK);
    s->r.fw.stats = &s->st;
}

static void side_close(struct side *s)
{
    moe_stats_free(&s->st);
    moe_runner_free(&s->r);
    moe_backend_free(&s->be);
    moe_model_free(&s->m);
}

static void step(struct side *s, struct moe_chunk *ch, int n, int32_t *next)
{
    const int V = s->cfg.vocab;
    float *logits = malloc((size_t)n * V * sizeof(float));
    cr_assert_eq(moe_runner_step(&s->r, ch, n, logits, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    for (int i = 0; i < n; i++) next[i] = moe_argmax(logits + (size_t)i * V, V);
    free(logits);
}

/* Prefill steps of 40 (synchronous either way), 7, 32 and 33 rows, then 8
 * batched decode steps of two and three sequences.  out: the greedy tokens
 * of the decode steps (24). */
static void workload(struct side *s, int32_t *out)
{
    int32_t p[4][40];
    for (int q = 0; q < 4; q++)
        for (int i = 0; i < 40; i++) p[q][i] = (int32_t)((37 * i + 101 * q + 5) % s->cfg.vocab);
    struct moe_seq seq[4] = {{0}};
    const int len[4] = {40, 7, 32, 33};
    int32_t tok[4];
    for (int q = 0; q < 4; q++) {
        struct moe_chunk c = {&seq[q], p[q], len[q], false, false, 10 + q};
        step(s, &c, 1, &tok[q]);
    }
    int o = 0;
    for (int i = 0; i < 8; i++) {
        const int n = i < 4 ? 2 : 3;
        struct moe_chunk ch[3];
        for (int q = 0; q < n; q++) ch[q] = (struct moe_chunk){&seq[q], &tok[q], 1, false, true, 10 + q};
        int32_t next[3];
        step(s, ch, n, next);
        for (int q = 0; q < n; q++) out[o++] = tok[q] = next[q];
    }
    cr_assert_eq(o, 20);
    for (int q = 0; q < 4; q++) moe_seq_free(&s->r, &seq[q]);
}

#define SAME(field, n) \
    cr_expect(memcmp(a->field, b->field, (size_t)(n) * sizeof *a->field) == 0, #field " differs")

static void expect_same_stats(struct moe_stats *a, struct moe_stats *b)
{
    const size_t LE = (size_t)a->Lm * a->E;
    cr_assert_eq(a->Lm, b->Lm);
    cr_expect_eq(a->steps, b->steps);
    cr_expect_eq(a->tokens_prefill, b->tokens_prefill);
    cr_expect_eq(a->tokens_decode, b->tokens_decode);
    SAME(prefill, LE);
    SAME(decode, LE);
    SAME(wsum, LE); /* bitwise: the same sums in the same order */
    SAME(top1, LE);
    SAME(ent_sum, a->Lm);
    SAME(ent_n, a->Lm);
    SAME(coact, LE * a->E);
    SAME(rejected, a->Lm);
    SAME(bad_weights, a->Lm);
    cr_expect_eq(a->ring_n, b->ring_n);
    cr_expect_eq(a->ring_head, b->ring_head);
    SAME(ring_counts, (size_t)a->ring_n * LE);
    SAME(ring_tokens, a->ring_n);
    cr_assert_eq(a->tr.n, b->tr.n);
    SAME(tr.ids, (size_t)a->tr.n * a->Lm * a->K);
    SAME(tr.w, (size_t)a->tr.n * a->Lm * a->K);
    SAME(tr.meta, (size_t)a->tr.n * 4);
    /* the exported JSON, but for the clocks */
    b->t_start = a->t_start, b->t_end = a->t_end, b->busy_s = a->busy_s;
    struct moe_stats_meta meta = {.model = "m", .architecture = "X", .command = "test",
                                  .backend = "cpu", .threads = 1, .d_model = 256,
                                  .d_expert = 128, .weight_bytes = 4};
    json_t *ja = moe_stats_to_json(a, &meta), *jb = moe_stats_to_json(b, &meta);
    cr_assert(ja && jb);
    cr_expect(json_equal(ja, jb), "the statistics JSON differs");
    json_decref(ja);
    json_decref(jb);
}

/* Non-trivial counters: every MoE layer saw every routed pair. */
static void expect_counts(const struct moe_stats *st)
{
    const int64_t pre = 40 + 7 + 32 + 33, dec = 4 * 2 + 4 * 3;
    cr_expect_eq(st->tokens_prefill, pre);
    cr_expect_eq(st->tokens_decode, dec);
    for (int j = 0; j < st->Lm; j++) {
        int64_t sp = 0, sd = 0;
        for (int e = 0; e < st->E; e++) {
            sp += st->prefill[(size_t)j * st->E + e];
            sd += st->decode[(size_t)j * st->E + e];
        }
        cr_expect_eq(sp, pre * st->K, "layer %d prefill pairs", j);
        cr_expect_eq(sd, dec * st->K, "layer %d decode pairs", j);
        cr_expect_eq(st->ent_n[j], pre + dec, "layer %d entropy rows", j);
    }
}

static void check_async_matches_sync(bool fast)
{
    struct side as, sy;
    side_open(&as, fast);
    side_open(&sy, fast);
    sy.r.fw.stats_async_rows = 0;
    cr_assert_eq(as.st.Lm, 3, "tiny-moe with layer 1 dense: 3 MoE layers");
    int32_t ta[20], tb[20];
    workload(&as, ta);
    workload(&sy, tb);
    cr_expect(as.r.fw.hs_buf != NULL, "small steps took the asynchronous path");
    cr_expect(sy.r.fw.hs_buf == NULL, "forced synchronous path allocates nothing");
    cr_expect(memcmp(ta, tb, sizeof ta) == 0, "greedy tokens differ");
    expect_counts(&as.st);
    expect_same_stats(&as.st, &sy.st);
    side_close(&sy);
    side_close(&as);
}

Test(stats_async, same_statistics_as_synchronous_cpu_ref) { check_async_matches_sync(false); }
Test(stats_async, same_statistics_as_synchronous_cpu_fast) { check_async_matches_sync(true); }

/* ---- a CPU backend with some entries replaced ---- */

static struct moe_backend_ops wrapped;
static int graph_begins;
static const void *graph_key;

static enum moe_status no_host_alloc(struct moe_backend *be, size_t bytes, void **out)
{
    *out = NULL;
    return moe_fail(MOE_ERR_NOMEM, "test: no pinned memory today");
}

static enum moe_status count_graph_begin(struct moe_backend *be, const void *key, int rows,
                                         int n_logits, bool *replay)
{
    graph_begins++;
    graph_key = key;
    *replay = false;
    return MOE_OK;
}

static enum moe_status count_graph_end(struct moe_backend *be, bool ok) { return MOE_OK; }

Test(stats_async, host_buffers_refused_fall_back_to_synchronous_copies)
{
    struct side fb, sy;
    side_open(&fb, false);
    side_open(&sy, false);
    sy.r.fw.stats_async_rows = 0;
    wrapped = *fb.be.ops;
    wrapped.host_alloc = no_host_alloc;
    fb.be.ops = &wrapped;
    fflush(stderr);
    FILE *err = tmpfile();
    cr_assert(err);
    int saved = dup(2);
    dup2(fileno(err), 2);
    int32_t ta[20], tb[20];
    workload(&fb, ta);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    workload(&sy, tb);
    cr_expect(fb.r.fw.hs_failed && fb.r.fw.hs_buf == NULL);
    cr_expect(memcmp(ta, tb, sizeof ta) == 0, "greedy tokens differ");
    expect_counts(&fb.st);
    expect_same_stats(&fb.st, &sy.st);
    char text[4096] = "";
    rewind(err);
    size_t n = fread(text, 1, sizeof text - 1, err);
    text[n] = 0;
    fclose(err);
    const char *first = strstr(text, "no host buffers");
    cr_expect(first != NULL, "the fallback is said on stderr: '%s'", text);
    cr_expect(first && !strstr(first + 1, "no host buffers"), "said once: '%s'", text);
    cr_expect(strstr(text, "no pinned memory today") != NULL, "with the reason: '%s'", text);
    side_close(&sy);
    side_close(&fb);
}

Test(stats_async, graphs_allowed_with_asynchronous_statistics_only)
{
    struct side s;
    side_open(&s, false);
    wrapped = *s.be.ops;
    wrapped.graph_begin = count_graph_begin;
    wrapped.graph_end = count_graph_end;
    s.be.ops = &wrapped;
    int32_t p[40], next;
    for (int i = 0; i < 40; i++) p[i] = 3 * i + 2;
    struct moe_seq q = {0};
    struct moe_chunk c = {&q, p, 40, false, false, 0};
    graph_begins = 0;
    const int async_rows = s.r.fw.stats_async_rows;
    cr_expect_eq(async_rows, s.r.o.max_tokens, "a full step's routing fits the host buffers");
    step(&s, &c, 1, &next); /* 40 rows, statistics on: asynchronous too */
    cr_expect_eq(graph_begins, 1, "a prefill step with asynchronous statistics may be recorded "
                 "(the backend decides by its rows)");
    cr_expect(graph_key == (const void *)&s.r.fw.hs_buf, "under the statistics key");
    c = (struct moe_chunk){&q, &next, 1, false, true, 0};
    step(&s, &c, 1, &next); /* decode, statistics on */
    cr_expect_eq(graph_begins, 2, "a decode step with statistics may be recorded");
    cr_expect(graph_key == (const void *)&s.r.fw.hs_buf, "under the statistics key");
    s.r.fw.stats = NULL;
    c = (struct moe_chunk){&q, &next, 1, false, true, 0};
    step(&s, &c, 1, &next); /* no statistics */
    cr_expect_eq(graph_begins, 3);
    cr_expect(graph_key == (const void *)&s.r.fw, "under the workspace key");
    s.r.fw.stats = &s.st;
    s.r.fw.stats_async_rows = 0;
    c = (struct moe_chunk){&q, &next, 1, false, true, 0};
    step(&s, &c, 1, &next); /* forced synchronous statistics */
    cr_expect_eq(graph_begins, 3, "synchronous statistics keep graphs off");
    s.r.fw.stats_async_rows = async_rows;
    int32_t ids[4 * 4];
    struct moe_route_trace tr = {ids, NULL};
    c = (struct moe_chunk){&q, &next, 1, false, true, 0};
    cr_assert_eq(moe_runner_step(&s.r, &c, 1, NULL, NULL, NULL, &tr), MOE_OK, "%s", moe_last_error());
    cr_expect_eq(graph_begins, 3, "traces keep graphs off");
    cr_expect_eq(s.st.steps, 4, "every step but the one without statistics");
    moe_seq_free(&s.r, &q);
    side_close(&s);
}
