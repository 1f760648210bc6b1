/* test_q4_model.c - four-bit weights in a model: --quantize q4 (ggml's
 * Q4_1 for every Linear weight but the LM head, which takes Q8_0; routers
 * and the embedding as stored) on the CPU backends and in plan's sizes.
 * The Q4_1 blocks themselves are checked against gguf-py in
 * test_quant_q4.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cli/cli_common.h"
#include "runtime/stats/stats_analyze.h"
#include "tests/quant_test.h"
#include "tests/testutil.h"

/* --quantize q4's blocks are ggml's Q4_1 bit for bit: gguf-py's
 * quantization of the same rows (tests/fixtures/quant/q4_1.safetensors:
 * constant, zero, subnormal-scale, near-f16-range and outlier blocks), and
 * its dequantization. */
Test(q4_model, q4_1_blocks_equal_gguf_py)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/q4_1.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    const struct moe_st_tensor *x = moe_safetensors_find(&st, "x"), *q = moe_safetensors_find(&st, "q4_1"),
                               *d = moe_safetensors_find(&st, "dequant");
    cr_assert(x && q && d);
    const int R = (int)x->shape[0], K = (int)x->shape[1];
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q4_1, (size_t)K);
    cr_assert_eq((size_t)q->shape[1], rb, "ggml blocks: f16 d, f16 m, 16 bytes of codes");
    unsigned char *got = malloc(rb);
    float *back = malloc((size_t)K * sizeof(float));
    for (int r = 0; r < R; r++) {
        cr_assert(moe_quantize_row_q4_1(got, (const float *)x->data + (size_t)r * K, (size_t)K), "row %d", r);
        const unsigned char *want = (const unsigned char *)q->data + (size_t)r * rb;
        for (size_t i = 0; i < rb; i++)
            cr_assert_eq(got[i], want[i], "row %d block %zu byte %zu: 0x%02x, gguf-py 0x%02x", r, i / 20, i % 20,
                         got[i], want[i]);
        moe_convert_row_f32(back, got, MOE_DTYPE_Q4_1, (size_t)K);
        const float *dq = (const float *)d->data + (size_t)r * K;
        for (int k = 0; k < K; k++)
            cr_assert(!memcmp(&back[k], &dq[k], 4), "row %d value %d: %.9g, gguf-py %.9g", r, k, back[k], dq[k]);
    }
    /* not finite, or a scale or minimum past f16: refused */
    float bad[32] = {0};
    const float v[] = {NAN, INFINITY, -1e6f};
    for (int i = 0; i < 3; i++) {
        bad[7] = v[i];
        cr_expect_not(moe_quantize_row_q4_1(got, bad, 32), "%g", v[i]);
    }
    free(got);
    free(back);
    moe_safetensors_close(&st);
}

/* --quantize q4's blocks where rows are multiples of 256 are ggml's Q4_K
 * bit for bit: gguf-py's dequantization of random blocks
 * (tests/fixtures/quant/q4_k.safetensors: every scale and minimum 63, all
 * 0, subnormal f16 heads) is moerun's, value for value and bit for bit. */
Test(q4_model, q4_k_blocks_read_as_gguf_py)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/q4_k.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    const struct moe_st_tensor *q = moe_safetensors_find(&st, "q4_k"), *d = moe_safetensors_find(&st, "dequant");
    cr_assert(q && d);
    const int R = (int)d->shape[0], K = (int)d->shape[1];
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q4_K, (size_t)K);
    cr_assert_eq((size_t)q->shape[1], rb, "ggml blocks: 144 bytes per 256 values");
    float *back = malloc((size_t)K * sizeof(float));
    for (int r = 0; r < R; r++) {
        const unsigned char *row = (const unsigned char *)q->data + (size_t)r * rb;
        moe_convert_row_f32(back, row, MOE_DTYPE_Q4_K, (size_t)K);
        const float *dq = (const float *)d->data + (size_t)r * K;
        for (int k = 0; k < K; k++) {
            cr_assert(!memcmp(&back[k], &dq[k], 4), "row %d value %d: %.9g, gguf-py %.9g", r, k, back[k], dq[k]);
            const float g = moe_q4_get(row, MOE_DTYPE_Q4_K, (size_t)k);
            cr_assert(!memcmp(&g, &dq[k], 4), "row %d value %d: moe_q4_get %.9g, gguf-py %.9g", r, k, g, dq[k]);
        }
    }
    free(back);
    moe_safetensors_close(&st);
}

static void run_q4(const char *name, enum moe_weight_quant q, float *logits, struct moe_model *m)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(m, &cfg, MOE_DTYPE_BF16, 11), MOE_OK, "%s", moe_last_error());
    qt_prompt_logits(m, name, q, logits);
}

/* What --quantize q4 quantizes (Q4_K where rows are multiples of 256: the
 * attention's 256-wide rows; Q4_1 for the experts, whose down rows are
 * 128 long), and that the model stays near the bf16 one: farther than
 * with q8_0 (4 bits lose more), not far. */
Test(q4_model, quantize_q4_picks_the_weights)
{
    const int V = 1024;
    const size_t n = (size_t)20 * V;
    float *q4 = malloc(n * 4), *q8 = malloc(n * 4), *plain = malloc(n * 4);
    struct moe_model m;
    run_q4("cpu-ref", MOE_QUANT_Q4, q4, &m);
    const struct moe_layer_weights *w = &m.layers[0];
    cr_expect_eq(w->wq.dtype, MOE_DTYPE_Q4_K);
    cr_expect_eq(w->wo.dtype, MOE_DTYPE_Q4_K);
    cr_expect_eq(w->experts.dtype, MOE_DTYPE_Q4_1, "an expert's 128-long down rows: Q4_1 for all its matrices");
    cr_expect_eq(m.lm_head.dtype, MOE_DTYPE_Q8_0, "the LM head takes q8_0");
    cr_expect_eq(w->router.dtype, MOE_DTYPE_BF16, "the router keeps its dtype");
    cr_expect_eq(m.embed.dtype, MOE_DTYPE_BF16, "the embedding keeps its dtype");
    moe_model_free(&m);
    run_q4("cpu-ref", MOE_QUANT_Q8_0, q8, &m);
    moe_model_free(&m);
    run_q4("cpu-ref", MOE_QUANT_NONE, plain, &m);
    moe_model_free(&m);
    const double d4 = tu_mean_abs_diff(q4, plain, n), d8 = tu_mean_abs_diff(q8, plain, n),
                 size = tu_mean_abs_diff(plain, NULL, n);
    cr_log_info("logits vs bf16: q4 %.3g, q8_0 %.3g on average (mean |logit| %.3g)", d4, d8, size);
    cr_expect(d4 > d8, "q4 moves the logits (%g) more than q8_0 (%g)", d4, d8);
    /* random weights route chaotically (one flipped expert moves a row a
     * lot), so the bound is loose; the trained model's KL: test_ppl.c */
    cr_expect(d4 < 0.5 * size, "q4 logits move by %g on average (mean |logit| %g)", d4, size);
    free(q4);
    free(q8);
    free(plain);
}

/* The Q4_1 rows of a quantized weight are moe_quantize_row_q4_1 of the
 * stored rows, the Q4_K rows moe_quantize_row_q4_k's: the backend
 * quantizes what it was given, row by row. */
Test(q4_model, quantized_rows_are_the_quantizer_s)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    struct moe_model m;
    cr_assert_eq(moe_model_synthetic(&m, &cfg, MOE_DTYPE_BF16, 5), MOE_OK, "%s", moe_last_error());
    const int F = cfg.d_expert, D = cfg.d_model;
    float *row = malloc((size_t)D * 4);
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q4_1, (size_t)D);
    const size_t rbk = moe_dtype_row_bytes(MOE_DTYPE_Q4_K, (size_t)D);
    const int NQ = (int)m.layers[1].wq.shape[0];
    cr_assert_eq(m.layers[1].wq.shape[1], D);
    unsigned char *want = malloc((size_t)F * rb), *want_k = malloc((size_t)NQ * rbk);
    const uint16_t *g = m.layers[1].experts.gate[3];
    for (int r = 0; r < F; r++) {
        moe_convert_row_f32(row, g + (size_t)r * D, MOE_DTYPE_BF16, (size_t)D);
        cr_assert(moe_quantize_row_q4_1(want + (size_t)r * rb, row, (size_t)D));
    }
    for (int r = 0; r < NQ; r++) {
        moe_convert_row_f32(row, (const uint16_t *)m.layers[1].wq.data + (size_t)r * D, MOE_DTYPE_BF16, (size_t)D);
        cr_assert(moe_quantize_row_q4_k(want_k + (size_t)r * rbk, row, (size_t)D));
    }
    struct moe_backend be;
    cr_assert_eq(tu_backend_init_with(&be, "cpu", MOE_QUANT_Q4, 0, 0), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(be.ops->prepare_model(&be, &m), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(m.layers[1].experts.dtype, MOE_DTYPE_Q4_1);
    cr_expect(memcmp(m.layers[1].experts.gate[3], want, (size_t)F * rb) == 0, "expert 3's gate rows differ");
    cr_assert_eq(m.layers[1].wq.dtype, MOE_DTYPE_Q4_K);
    cr_expect(memcmp(m.layers[1].wq.data, want_k, (size_t)NQ * rbk) == 0, "layer 1's query rows differ");
    moe_backend_free(&be);
    moe_model_free(&m);
    free(row);
    free(want);
    free(want_k);
}

/* A weight past f16's range cannot be Q4_1 (its minimum is an f16) nor
 * Q4_K (dmin, its minimums' unit, an f16: past 63 x 65504): the load
 * fails naming the weight's layer, the model as it was. */
Test(q4_model, weights_past_f16_are_refused)
{
    struct moe_config cfg;
    struct moe_model m;
    struct moe_backend be;
    struct moe_runner r;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(&m, &cfg, MOE_DTYPE_F32, 3), MOE_OK);
    ((float *)m.layers[1].wv.data)[77] = -1e8f;
    cr_assert_eq(tu_backend_init_with(&be, "cpu-ref", MOE_QUANT_Q4, 0, 0), MOE_OK);
    struct moe_runner_opts o = {.max_tokens = 8, .max_seqs = 1, .max_logits = 8, .block_size = 8, .n_blocks = 4};
    cr_assert_neq(moe_runner_init(&r, &m, &be, &o), MOE_OK);
    cr_expect(strstr(moe_last_error(), "--quantize q4: a (") && strstr(moe_last_error(), "of layer 1"), "%s",
              moe_last_error());
    cr_expect_eq(m.layers[0].wq.dtype, MOE_DTYPE_F32, "a failed quantization leaves the model as it was");
    moe_backend_free(&be);
    moe_model_free(&m);
}


/* moerun plan --quantize q4: the attention, whose rows are multiples of
 * 256 (4096 and 96 x 128), at 4.5 bits a weight (Q4_K), the experts
 * (1408-wide) at 5 (Q4_1), the LM head at 9, the embedding and routers as
 * stored (bf16); the same on the GPU (the default device) and the CPU. */
Test(q4_model, plan_predicts_q4_sizes)
{
    char cmd[1024], a[8192], b[8192], c[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/glm-4.5-air.json", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
    strcat(cmd, " --quantize q4");
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0, "%s", b);
    cr_expect(fabs(qt_part_gib(b, "\n  experts") / qt_part_gib(a, "\n  experts") - 5.0 / 16) < 1e-3);
    cr_expect(fabs(qt_part_gib(b, "\n  attention") / qt_part_gib(a, "\n  attention") - 4.5 / 16) < 2e-3,
              "attention on the GPU: %g of bf16", qt_part_gib(b, "\n  attention") / qt_part_gib(a, "\n  attention"));
    cr_expect(fabs(qt_part_gib(b, "\n  lm head") / qt_part_gib(a, "\n  lm head") - 9.0 / 16) < 2e-3);
    cr_expect(qt_part_gib(b, "\n  embeddings") == qt_part_gib(a, "\n  embeddings"));
    cr_expect(qt_part_gib(b, "\n  router") == qt_part_gib(a, "\n  router"));
    strcat(cmd, " --device cpu");
    cr_assert_eq(tu_run(cmd, c, sizeof c), 0, "%s", c);
    cr_expect(fabs(qt_part_gib(c, "\n  experts") / qt_part_gib(a, "\n  experts") - 5.0 / 16) < 1e-3);
    cr_expect(fabs(qt_part_gib(c, "\n  attention") / qt_part_gib(a, "\n  attention") - 4.5 / 16) < 2e-3,
              "attention on the CPU: %g of bf16", qt_part_gib(c, "\n  attention") / qt_part_gib(a, "\n  attention"));
    cr_expect(fabs(qt_part_gib(c, "\n  lm head") / qt_part_gib(a, "\n  lm head") - 9.0 / 16) < 2e-3);
}

/* ---- per-expert precision (--expert-dtype-plan) ---- */

/* tiny-moe (bf16) prepared on backend `name` with quant and the plan
 * (layers x E, or NULL). */
static enum moe_status prepare_planned(struct moe_model *m, struct moe_backend *be, const char *name,
                                       enum moe_weight_quant q, const uint8_t *plan, int layers, int E)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(m, &cfg, MOE_DTYPE_BF16, 7), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(tu_backend_init_planned(be, name, q, plan, layers, E, 0, 0), MOE_OK, "%s", moe_last_error());
    return be->ops->prepare_model(be, m);
}

/* Each expert takes the format its entry names (the default entry: the
 * backend's --quantize), on both CPU backends; the model computes, and its
 * fast and reference logits agree as closely as q4 everywhere allows. */
Test(q4_model, plan_gives_each_expert_its_format)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    const int L = cfg.n_layers, E = cfg.n_experts;
    uint8_t *plan = malloc((size_t)L * E);
    for (int i = 0; i < L * E; i++)
        plan[i] = i % 4 == 0 ? MOE_QUANT_NONE : i % 4 == 1 ? MOE_QUANT_Q8_0 : i % 4 == 2 ? MOE_QUANT_Q4
                                                                                        : MOE_EXPERT_QUANT_DEFAULT;
    const char *names[] = {"cpu-ref", "cpu"};
    for (int b = 0; b < 2; b++) {
        struct moe_model m;
        struct moe_backend be;
        cr_assert_eq(prepare_planned(&m, &be, names[b], MOE_QUANT_Q8_0, plan, L, E), MOE_OK, "%s",
                     moe_last_error());
        const enum moe_dtype stored = b == 1 ? MOE_DTYPE_BF16_PANEL : MOE_DTYPE_BF16; /* panels on the fast one */
        for (int l = 0; l < L; l++) {
            const struct moe_expert_weights *x = &m.layers[l].experts;
            cr_assert(x->dtypes, "layer %d has no per-expert dtypes", l);
            for (int e = 0; e < E; e++) {
                const int i = l * E + e;
                const enum moe_dtype want = i % 4 == 0 ? stored : i % 4 == 2 ? MOE_DTYPE_Q4_1 : MOE_DTYPE_Q8_0;
                cr_expect_eq(moe_expert_dtype(x, e), want, "%s: layer %d expert %d is %s, expected %s", names[b],
                             l, e, moe_dtype_name(moe_expert_dtype(x, e)), moe_dtype_name(want));
            }
            cr_expect_eq(m.layers[l].wq.dtype, MOE_DTYPE_Q8_0, "the other weights follow --quantize");
        }
        moe_backend_free(&be);
        moe_model_free(&m);
    }
    free(plan);
}

/* A plan naming an expert or a layer the model does not have, or a dense
 * layer, is refused by name before anything is quantized. */
Test(q4_model, plan_naming_a_missing_expert_is_refused)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    const int L = cfg.n_layers, E = cfg.n_experts;
    const struct { int layers, e, at; const char *needle; } bad[] = {
        {L, E + 1, E, "expert 32 of layer 0 does not exist"},
        {L + 1, E, L * E, "expert 0 of layer 4 does not exist"},
    };
    cr_assert_eq(E, 32);
    cr_assert_eq(L, 4);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint8_t *plan = malloc((size_t)bad[i].layers * bad[i].e);
        memset(plan, MOE_EXPERT_QUANT_DEFAULT, (size_t)bad[i].layers * bad[i].e);
        plan[bad[i].at] = MOE_QUANT_Q4;
        struct moe_model m;
        struct moe_backend be;
        cr_expect_neq(prepare_planned(&m, &be, "cpu-ref", MOE_QUANT_NONE, plan, bad[i].layers, bad[i].e), MOE_OK);
        cr_expect(strstr(moe_last_error(), bad[i].needle), "%s", moe_last_error());
        cr_expect_eq(m.layers[0].experts.dtype, MOE_DTYPE_BF16, "nothing quantized");
        moe_backend_free(&be);
        moe_model_free(&m);
        free(plan);
    }
}

/* --expert-dtype-plan from statistics: per layer the most loaded experts
 * up to --hot-share of the routed pairs keep their precision (q8_0 under
 * --quantize), the others take q4; from an explicit map, as it says. */
Test(q4_model, cli_plans_from_statistics_and_maps)
{
    char dir[] = "/tmp/moerun-q4plan-XXXXXX";
    cr_assert(mkdtemp(dir));
    char stats[256], map[256];
    snprintf(stats, sizeof stats, "%s/stats.json", dir);
    snprintf(map, sizeof map, "%s/map.json", dir);
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s run %s/models/demo-moe --prompt 'Once upon a time' -n 24 --stats-out %s "
             "2>&1 >/dev/null", MOERUN_BINARY, MOERUN_SOURCE_DIR, stats);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    struct moe_sdata d;
    cr_assert_eq(moe_sdata_load(&d, stats), MOE_OK, "%s", moe_last_error());
    struct moe_backend_opts o;
    uint8_t *buf;
    const double shares[] = {0.5, 0.8};
    const enum moe_weight_quant quants[] = {MOE_QUANT_NONE, MOE_QUANT_Q4};
    for (int si = 0; si < 2; si++) {
        moe_backend_opts_defaults(&o);
        cr_assert_eq(moe_cli_expert_plan(&o, stats, shares[si], quants[si], &buf), MOE_OK, "%s", moe_last_error());
        cr_assert_eq(o.expert_quant_e, d.E);
        const uint8_t hot = quants[si] == MOE_QUANT_NONE ? MOE_QUANT_NONE : MOE_QUANT_Q8_0;
        for (int i = 0; i < d.Lm; i++) {
            const double *ld = d.load + (size_t)i * d.E;
            const uint8_t *row = buf + (size_t)d.layers[i] * d.E;
            double total = 0, hot_sum = 0, hot_min = INFINITY, cold_max = -1;
            for (int e = 0; e < d.E; e++) {
                total += ld[e];
                cr_assert(row[e] == hot || row[e] == MOE_QUANT_Q4, "layer %d expert %d: %u", d.layers[i], e, row[e]);
                if (row[e] == hot) {
                    hot_sum += ld[e];
                    hot_min = fmin(hot_min, ld[e]);
                } else {
                    cold_max = fmax(cold_max, ld[e]);
                }
            }
            /* the hot experts are the most loaded, just enough of them */
            cr_expect(hot_min >= cold_max, "layer %d: a cold expert (%g) outweighs a hot one (%g)", d.layers[i],
                      cold_max, hot_min);
            cr_expect(hot_sum >= shares[si] * total, "layer %d: hot %g of %g", d.layers[i], hot_sum, total);
            cr_expect(hot_sum - hot_min < shares[si] * total, "layer %d: one hot expert too many", d.layers[i]);
        }
        free(buf);
    }
    moe_sdata_free(&d);
    FILE *f = fopen(map, "w");
    fputs("{\"expert_dtypes\": {\"1\": [\"q4\", \"stored\", \"q8_0\"], \"3\": {\"5\": \"q4\"}}}", f);
    fclose(f);
    moe_backend_opts_defaults(&o);
    cr_assert_eq(moe_cli_expert_plan(&o, map, 0.8, MOE_QUANT_NONE, &buf), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(o.expert_quant_layers, 4);
    cr_assert_eq(o.expert_quant_e, 6);
    const uint8_t D = MOE_EXPERT_QUANT_DEFAULT;
    const uint8_t want[4][6] = {{D, D, D, D, D, D},
                                {MOE_QUANT_Q4, MOE_QUANT_NONE, MOE_QUANT_Q8_0, D, D, D},
                                {D, D, D, D, D, D},
                                {D, D, D, D, D, MOE_QUANT_Q4}};
    cr_expect(memcmp(buf, want, sizeof want) == 0);
    free(buf);
    const char *bad[][2] = {
        {"{\"expert_dtypes\": {\"0\": {\"1\": \"q3\"}}}", "expert 1: the format must be"},
        {"{\"expert_dtypes\": {\"x\": {\"1\": \"q4\"}}}", "'x' is not a layer index"},
        {"{\"expert_dtypes\": {\"0\": {\"-1\": \"q4\"}}}", "'-1' is not an expert id"},
        {"{\"expert_dtypes\": {\"0\": \"q4\"}}", "layer 0 must map expert ids"},
        {"{\"expert_dtypes\": {}}", "expert_dtypes must be an object of layers"},
        {"{\"layers\": 3}", "expected statistics, a trace"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        f = fopen(map, "w");
        fputs(bad[i][0], f);
        fclose(f);
        cr_expect_neq(moe_cli_expert_plan(&o, map, 0.8, MOE_QUANT_NONE, &buf), MOE_OK, "%s", bad[i][0]);
        cr_expect(strstr(moe_last_error(), bad[i][1]), "%s: %s", bad[i][0], moe_last_error());
    }
    unlink(map);
    unlink(stats);
    rmdir(dir);
}

/* moerun plan --expert-dtype-plan: the experts' bytes by the plan (the
 * demo model's bf16 experts; layer 0's 16 at q4, 5 bits a weight). */
Test(q4_model, plan_prices_an_expert_plan)
{
    char map[] = "/tmp/moerun-q4map-XXXXXX";
    const int fd = mkstemp(map);
    cr_assert(fd >= 0);
    const char *text = "{\"expert_dtypes\": {\"0\": [\"q4\", \"q4\", \"q4\", \"q4\", \"q4\", \"q4\", \"q4\", \"q4\", "
                       "\"q4\", \"q4\", \"q4\", \"q4\", \"q4\", \"q4\", \"q4\", \"q4\"]}}";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char cmd[1024], a[8192], b[8192];
    snprintf(cmd, sizeof cmd, "%s plan %s/models/demo-moe", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0, "%s", a);
    snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " --expert-dtype-plan %s", map);
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0, "%s", b);
    unlink(map);
    cr_expect(fabs(qt_part_gib(b, "\n  experts") / qt_part_gib(a, "\n  experts") - (0.75 + 0.25 * 5 / 16)) < 3e-3, /* printed to 0.01 MiB */
              "%s", b);
    cr_expect(strstr(b, "expert plan 48 experts stored, 0 q8_0, 16 q4"), "%s", b);
}

/* ---- four-bit checkpoints (GPTQ, AWQ, compressed-tensors) ---- */

/* The loaded weight named `name` (an attention q_proj, a dense FFN's or an
 * expert's gate/up/down_proj) as fp32 rows (N, K) in the checkpoint's
 * column order, into w. */
static void loaded_weight(const struct moe_model *m, const char *name, int64_t N, int64_t K, float *w)
{
    int l, e;
    char proj[16];
    const void *data = NULL;
    enum moe_dtype dt = MOE_DTYPE_F32;
    const int32_t *cols = NULL;
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.%15[a-z]_proj.weight", &l, &e, proj) == 3) {
        const struct moe_expert_weights *x = &m->layers[l].experts;
        const bool down = !strcmp(proj, "down");
        data = !strcmp(proj, "gate") ? x->gate[e] : !strcmp(proj, "up") ? x->up[e] : x->down[e];
        dt = moe_expert_dtype(x, e);
        cols = x->cols ? x->cols[2 * e + down] : NULL;
    } else if (sscanf(name, "model.layers.%d.mlp.%15[a-z]_proj.weight", &l, proj) == 2) {
        const struct moe_layer_weights *w = &m->layers[l];
        const struct moe_tensor *t = !strcmp(proj, "gate") ? &w->w_gate : !strcmp(proj, "up") ? &w->w_up : &w->w_down;
        data = t->data, dt = t->dtype, cols = t->cols;
    } else if (sscanf(name, "model.layers.%d.self_attn.q_proj.weight", &l) == 1) {
        data = m->layers[l].wq.data, dt = m->layers[l].wq.dtype, cols = m->layers[l].wq.cols;
    }
    cr_assert(data, "no loaded weight for %s", name);
    cr_assert(moe_dtype_is_q4(dt), "%s loaded as %s", name, moe_dtype_name(dt));
    float *row = malloc((size_t)K * sizeof(float));
    for (int64_t n = 0; n < N; n++) {
        moe_convert_row_f32(row, (const char *)data + (size_t)n * moe_dtype_row_bytes(dt, (size_t)K), dt, (size_t)K);
        for (int64_t j = 0; j < K; j++) w[n * K + (cols ? cols[j] : j)] = row[j];
    }
    free(row);
}

/* Each fixture's dequant.safetensors holds a few weights as the library
 * itself dequantizes them (in fp32, exactly): the loaded four-bit rows,
 * their columns put back in order, are those values bit for bit. */
Test(q4_model, checkpoint_weights_equal_the_library_s_dequantization)
{
    const char *names[] = {"qwen3_moe_ct_w4", "qwen3_moe_ct_w4_asym", "llama_ct_w4_channel", "qwen3_moe_gptq",
                           "qwen3_moe_gptq_asym_g32", "qwen3_moe_gptq_actorder", "qwen3_moe_gptq_v2",
                           "qwen3_moe_awq"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char dir[512], path[600];
        snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, names[i]);
        snprintf(path, sizeof path, "%s/dequant.safetensors", dir);
        struct moe_model m;
        cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s: %s", names[i], moe_last_error());
        struct moe_safetensors st = {0};
        cr_assert_eq(moe_safetensors_open_file(&st, path), MOE_OK, "%s", moe_last_error());
        cr_assert(st.n_tensors >= 3, "%s: %zu weights", names[i], st.n_tensors);
        for (size_t k = 0; k < st.n_tensors; k++) {
            const struct moe_st_tensor *t = &st.tensors[k];
            const int64_t N = t->shape[0], K = t->shape[1];
            float *got = malloc((size_t)(N * K) * sizeof(float));
            loaded_weight(&m, t->name, N, K, got);
            const float *want = t->data;
            int64_t bad = -1;
            for (int64_t j = 0; j < N * K && bad < 0; j++)
                if (memcmp(&got[j], &want[j], 4)) bad = j;
            cr_expect(bad < 0, "%s %s: element (%lld, %lld) is %.9g, the library's %.9g", names[i], t->name,
                      (long long)(bad / K), (long long)(bad % K), bad >= 0 ? got[bad] : 0.0,
                      bad >= 0 ? want[bad] : 0.0);
            free(got);
        }
        moe_safetensors_close(&st);
        moe_model_free(&m);
    }
}

#define L0 "model.layers.0."

/* What a broken four-bit checkpoint gets: a message naming the tensor and
 * what is wrong with it, never a crash or a silently wrong weight. */
Test(q4_model, broken_checkpoints_are_refused_by_name)
{
    struct moe_model h;
    /* scales missing; of the wrong dtype; not finite */
    qt_copy_fixture(&h, "qwen3_moe_gptq", L0 "self_attn.k_proj.scales");
    qt_expect_refused(&h, MOE_ERR_FORMAT, "'" L0 "self_attn.k_proj.scales' is missing", NULL);
    qt_copy_fixture(&h, "qwen3_moe_ct_w4", L0 "self_attn.q_proj.weight_scale");
    qt_expect_refused(&h, MOE_ERR_FORMAT, "'" L0 "self_attn.q_proj.weight_scale' is missing", NULL);
    const struct moe_st_tensor *t;
    qt_copy_fixture(&h, "qwen3_moe_awq", NULL);
    cr_assert((t = moe_safetensors_find(&h.st, L0 "mlp.experts.2.up_proj.scales")));
    ((uint16_t *)t->data)[7] = 0x7e00; /* an f16 NaN */
    qt_expect_refused(&h, MOE_ERR_FORMAT, "the scales of '" L0 "mlp.experts.2.up_proj' hold nan", "row 7, group 0");
    /* the packed codes of the wrong shape or dtype */
    qt_copy_fixture(&h, "qwen3_moe_gptq", L0 "self_attn.o_proj.qweight");
    cr_assert_eq(moe_safetensors_add(&h.st, L0 "self_attn.o_proj.qweight", MOE_DTYPE_I32, 2, (int64_t[]){8, 128},
                                     calloc(8 * 128, 4)), MOE_OK);
    qt_expect_refused(&h, MOE_ERR_FORMAT, "'" L0 "self_attn.o_proj.qweight' has shape (8, 128), expected (16, 128)",
                      NULL);
    qt_copy_fixture(&h, "qwen3_moe_ct_w4", L0 "self_attn.o_proj.weight_packed");
    cr_assert_eq(moe_safetensors_add(&h.st, L0 "self_attn.o_proj.weight_packed", MOE_DTYPE_U8, 2,
                                     (int64_t[]){128, 16}, calloc(128 * 16, 1)), MOE_OK);
    qt_expect_refused(&h, MOE_ERR_FORMAT, "weight_packed' has dtype U8 (expected I32)", NULL);
    /* a g_idx naming a group that does not exist; act-order groups of
     * unequal size */
    qt_copy_fixture(&h, "qwen3_moe_gptq_actorder", NULL);
    cr_assert((t = moe_safetensors_find(&h.st, L0 "self_attn.v_proj.g_idx")));
    ((int32_t *)t->data)[9] = 5; /* groups of 32 over 128 columns */
    qt_expect_refused(&h, MOE_ERR_FORMAT, "'" L0 "self_attn.v_proj.g_idx' puts column 9 in group 5 (there are 4)",
                      NULL);
    qt_copy_fixture(&h, "qwen3_moe_gptq_asym_g32", NULL);
    cr_assert((t = moe_safetensors_find(&h.st, L0 "self_attn.v_proj.g_idx")));
    int32_t *g = (int32_t *)t->data;
    g[0] = 1; /* group 0 loses a column to group 1 */
    qt_expect_refused(&h, MOE_ERR_UNSUPPORTED, "v_proj.g_idx' gives group 0 fewer than 32 columns", NULL);
    /* a compressed-tensors weight_shape that is not the weight's */
    qt_copy_fixture(&h, "qwen3_moe_ct_w4", NULL);
    cr_assert((t = moe_safetensors_find(&h.st, L0 "self_attn.q_proj.weight_shape")));
    ((int64_t *)t->data)[1] = 64;
    qt_expect_refused(&h, MOE_ERR_FORMAT, "q_proj.weight_shape' says [128, 64], expected [128, 128]", NULL);
}

/* The fast backend on the four-bit checkpoints: inputs quantized to 8 bits
 * per block of 32 (as for Q8_0, runtime/cpu/gemm_q4.c), so its logits sit
 * near the reference backend's (which match transformers to 1e-4,
 * test_forward.c), not on them: the same prompt's logits apart by a small
 * fraction of their size on average, the same argmax at most rows. */
Test(q4_model, fast_backend_stays_near_the_reference_on_checkpoints)
{
    if (moe_cpu_isa_detect() == MOE_CPU_ISA_REF) cr_skip_test("this processor runs no fast kernel set");
    const char *names[] = {"qwen3_moe_ct_w4", "qwen3_moe_ct_w4_asym", "llama_ct_w4_channel", "qwen3_moe_gptq",
                           "qwen3_moe_gptq_asym_g32", "qwen3_moe_gptq_actorder", "qwen3_moe_gptq_v2",
                           "qwen3_moe_awq"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, names[i]);
        struct moe_model m;
        cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s", moe_last_error());
        const int V = m.cfg.vocab;
        const size_t n = (size_t)20 * V;
        float *ref = malloc(n * 4), *fast = malloc(n * 4);
        qt_prompt_logits(&m, "cpu-ref", MOE_QUANT_NONE, ref);
        qt_prompt_logits(&m, "cpu", MOE_QUANT_NONE, fast);
        const double apart = tu_mean_abs_diff(fast, ref, n), size = tu_mean_abs_diff(ref, NULL, n);
        int same = 0;
        for (int r = 0; r < 20; r++) {
            int a = 0, b = 0;
            for (int v = 1; v < V; v++) {
                if (ref[(size_t)r * V + v] > ref[(size_t)r * V + a]) a = v;
                if (fast[(size_t)r * V + v] > fast[(size_t)r * V + b]) b = v;
            }
            same += a == b;
        }
        cr_log_info("%s: fast vs reference %.3g on average (mean |logit| %.3g), same argmax %d of 20", names[i],
                    apart, size, same);
        cr_expect(apart > 0 && apart < 0.05 * size, "%s: fast vs reference %g, mean |logit| %g", names[i], apart,
                  size);
        cr_expect(same >= 16, "%s: same argmax at %d of 20 rows", names[i], same);
        free(ref);
        free(fast);
        moe_model_free(&m);
    }
}

/* inspect names a four-bit checkpoint's method and gives the loaded bytes
 * by format: GPTQ groups of 128 as Q4_G128 beside the f16 tensors. */
Test(q4_model, inspect_reports_bytes_by_format)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s inspect %s/qwen3_moe_gptq", MOERUN_BINARY, FIXTURE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "four-bit     GPTQ Linear weights"), "%s", out);
    const char *f = strstr(out, "formats      Q4_G128 ");
    cr_expect(f && strstr(f, " F16 "), "%s", out);
}
