/* test_q5_k_m.c - --quantize q5_k and q5_k_m on the CPU backends: q5_k
 * makes ggml's Q5_K of every matrix q4 makes Q4_K (Q4_1 elsewhere, the LM
 * head Q8_0); q5_k_m is q5_k with llama.cpp's Q5_K_M choices, its Q4_K_M
 * ones (llama_tensor_get_type: the down projections and attention V of
 * the layers "using more bits", and the LM head, at Q6_K; attention K and
 * V at Q8_0 in every layer of a model of 8 experts) over a Q5_K base.
 * The models compute near the unquantized ones, plan prices the formats,
 * and what cannot be had is refused.  The Q5_K blocks themselves are
 * checked against gguf-py in test_quant_q5_k.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend.h"
#include "tests/quant_test.h"
#include "tests/testutil.h"

enum { L = QT_WIDE_L };

static void prepare(struct moe_model *m, struct moe_backend *be, const char *name, enum moe_weight_quant q)
{
    cr_assert_eq(tu_backend_init_with(be, name, q, 0, 0), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(be->ops->prepare_model(be, m), MOE_OK, "%s", moe_last_error());
}

/* Each matrix takes the dtype llama.cpp's Q5_K_M gives it, on both CPU
 * backends, and q5_k's Q5_K everywhere but the LM head (Q8_0); routers and
 * the embedding stay as stored. */
Test(q5_k_m, picks_llama_cpp_s_matrices)
{
    const char *names[] = {"cpu-ref", "cpu"};
    for (int b = 0; b < 4; b++) {
        const bool km = b < 2;
        struct moe_model m;
        struct moe_backend be;
        qt_wide_model(&m, 4, 3);
        prepare(&m, &be, names[b % 2], km ? MOE_QUANT_Q5_K_M : MOE_QUANT_Q5_K);
        const char *what = km ? "q5_k_m" : "q5_k";
        cr_expect_eq(m.lm_head.dtype, km ? MOE_DTYPE_Q6_K : MOE_DTYPE_Q8_0, "%s %s: the LM head", names[b % 2], what);
        cr_expect_eq(m.embed.dtype, MOE_DTYPE_BF16);
        for (int l = 0; l < L; l++) {
            const struct moe_layer_weights *w = &m.layers[l];
            const enum moe_dtype six = km && qt_more_bits(l) ? MOE_DTYPE_Q6_K : MOE_DTYPE_Q5_K;
            cr_expect_eq(w->wv.dtype, six, "%s %s: layer %d's V is %s", names[b % 2], what, l,
                         moe_dtype_name(w->wv.dtype));
            cr_expect_eq(w->wk.dtype, MOE_DTYPE_Q5_K);
            cr_expect_eq(w->wq.dtype, MOE_DTYPE_Q5_K);
            cr_expect_eq(w->wo.dtype, MOE_DTYPE_Q5_K);
            cr_expect(w->router.dtype == MOE_DTYPE_BF16 || w->router.dtype == MOE_DTYPE_BF16_PANEL,
                      "the router is not quantized");
            for (int e = 0; e < 4; e++) {
                cr_expect_eq(moe_expert_dtype(&w->experts, e), MOE_DTYPE_Q5_K);
                cr_expect_eq(moe_expert_down_dtype(&w->experts, e), six, "%s %s: layer %d expert %d's down is %s",
                             names[b % 2], what, l, e, moe_dtype_name(moe_expert_down_dtype(&w->experts, e)));
            }
        }
        moe_backend_free(&be);
        moe_model_free(&m);
    }
}

/* A model of 8 experts (Mixtral-like): attention K and V at Q8_0 in every
 * layer, as llama.cpp does for such models under Q5_K_M too. */
Test(q5_k_m, eight_experts_keep_k_and_v_at_q8_0)
{
    struct moe_model m;
    struct moe_backend be;
    qt_wide_model(&m, 8, 4);
    prepare(&m, &be, "cpu-ref", MOE_QUANT_Q5_K_M);
    for (int l = 0; l < L; l++) {
        cr_expect_eq(m.layers[l].wv.dtype, MOE_DTYPE_Q8_0, "layer %d", l);
        cr_expect_eq(m.layers[l].wk.dtype, MOE_DTYPE_Q8_0, "layer %d", l);
        cr_expect_eq(m.layers[l].wo.dtype, MOE_DTYPE_Q5_K, "layer %d", l);
        cr_expect_eq(moe_expert_down_dtype(&m.layers[l].experts, 5), qt_more_bits(l) ? MOE_DTYPE_Q6_K : MOE_DTYPE_Q5_K);
    }
    moe_backend_free(&be);
    moe_model_free(&m);
}

/* The five-bit rows are moe_quantize_row_q5_k of the stored rows: an
 * expert's gate and down matrices in a layer not using more bits, and
 * attention Q. */
Test(q5_k_m, five_bit_rows_are_the_quantizer_s)
{
    struct moe_model m;
    qt_wide_model(&m, 4, 5);
    const int D = m.cfg.d_model, F = m.cfg.d_expert, l = 3, e = 1;
    const int NQ = (int)m.layers[l].wq.shape[0];
    const void *src[3] = {m.layers[l].experts.gate[e], m.layers[l].experts.down[e], m.layers[l].wq.data};
    const int rows[3] = {F, D, NQ}, width[3] = {D, F, D};
    unsigned char *want[3];
    float *row = malloc((size_t)(D > F ? D : F) * 4);
    for (int i = 0; i < 3; i++) {
        const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q5_K, (size_t)width[i]);
        want[i] = malloc((size_t)rows[i] * rb);
        for (int r = 0; r < rows[i]; r++) {
            moe_convert_row_f32(row, (const uint16_t *)src[i] + (size_t)r * width[i], MOE_DTYPE_BF16, (size_t)width[i]);
            cr_assert(moe_quantize_row_q5_k(want[i] + (size_t)r * rb, row, (size_t)width[i]));
        }
    }
    struct moe_backend be;
    prepare(&m, &be, "cpu", MOE_QUANT_Q5_K_M);
    const void *got[3] = {m.layers[l].experts.gate[e], m.layers[l].experts.down[e], m.layers[l].wq.data};
    cr_assert_eq(moe_expert_down_dtype(&m.layers[l].experts, e), MOE_DTYPE_Q5_K);
    for (int i = 0; i < 3; i++) {
        cr_expect(memcmp(got[i], want[i], (size_t)rows[i] * moe_dtype_row_bytes(MOE_DTYPE_Q5_K, (size_t)width[i])) == 0,
                  "matrix %d's rows differ", i);
        free(want[i]);
    }
    moe_backend_free(&be);
    moe_model_free(&m);
    free(row);
}

/* The relative RMS distance of x from ref over n values. */
static double rel_rms(const float *x, const float *ref, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        s += (double)ref[i] * ref[i];
    }
    return sqrt(e / s);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median over the 20 rows of the mean |x - ref| of a row (V values). */
static double median_row_diff(const float *x, const float *ref, int V)
{
    double d[20];
    for (int r = 0; r < 20; r++) d[r] = tu_mean_abs_diff(x + (size_t)r * V, ref + (size_t)r * V, (size_t)V);
    qsort(d, 20, sizeof *d, cmp_double);
    return (d[9] + d[10]) / 2;
}

/* The synthetic model of 256-wide rows computes: the fast backend's
 * logits on q5_k_m's weights stay near the reference backend's (it rounds
 * each input row to 8 bits; random weights route chaotically, so one
 * flipped expert moves a row and the rows after it a lot: the median
 * row, not the mean, is held to 0.15 of the mean |logit|, measured 0.11,
 * q4_k_m's 0.08), and q5_k_m's logits sit nearer the bf16 model's than q4_k_m's
 * (one more bit in most matrices), as do q5_k's than q4's; and within
 * the format's tolerance of them: the relative RMS distance of the logits
 * at most 1.25 sqrt(P) e, e = 0.035 Q5_K's relative RMS error on such
 * weights (tests/test_quant_q5_k.c), P = 7 L + 1 quantized products on the
 * path of a row (each adding about e of its output, independently;
 * measured 0.32-0.34 against sqrt(P) e = 0.37, q4_k_m 0.54). */
Test(q5_k_m, logits_near_the_reference_and_bf16)
{
    const int V = 512;
    const size_t n = (size_t)20 * V;
    enum { RUNS = 7 };
    const char *names[RUNS] = {"cpu-ref", "cpu", "cpu-ref", "cpu-ref", "cpu-ref", "cpu-ref", "cpu"};
    const enum moe_weight_quant qs[RUNS] = {MOE_QUANT_Q5_K_M, MOE_QUANT_Q5_K_M, MOE_QUANT_Q4_K_M, MOE_QUANT_NONE,
                                            MOE_QUANT_Q5_K,   MOE_QUANT_Q4,     MOE_QUANT_Q4_K_M};
    float *out[RUNS];
    for (int i = 0; i < RUNS; i++) {
        struct moe_model m;
        out[i] = malloc(n * 4);
        qt_wide_model(&m, 4, 9);
        qt_prompt_logits(&m, names[i], qs[i], out[i]);
        moe_model_free(&m);
    }
    const float *ref = out[0], *fast = out[1], *q4km = out[2], *plain = out[3], *q5 = out[4], *q4 = out[5],
                *q4km_fast = out[6];
    const double size = tu_mean_abs_diff(plain, NULL, n), dfr = median_row_diff(fast, ref, V),
                 dfr4 = median_row_diff(q4km_fast, q4km, V), d5 = rel_rms(ref, plain, n), d4 = rel_rms(q4km, plain, n),
                 d5k = rel_rms(q5, plain, n), d4k = rel_rms(q4, plain, n), tol = 1.25 * sqrt(7.0 * L + 1) * 0.035;
    cr_log_info("fast vs reference, median row: q5_k_m %.3g, q4_k_m %.3g (mean |logit| %.3g); relative RMS from bf16: q5_k_m "
                "%.4f, q4_k_m %.4f, q5_k %.4f, q4 %.4f; tolerance %.3f", dfr, dfr4, size, d5, d4, d5k, d4k, tol);
    cr_expect(dfr < 0.15 * size, "fast and reference logits' median row apart by %g (q4_k_m: %g; mean |logit| %g)",
              dfr, dfr4, size);
    cr_expect(d5 < d4, "q5_k_m moves the logits (%g) less than q4_k_m (%g)", d5, d4);
    cr_expect(d5k < d4k, "q5_k moves the logits (%g) less than q4 (%g)", d5k, d4k);
    cr_expect(d5 <= tol && d5k <= tol, "q5_k_m (%g) and q5_k (%g) past the tolerance %g", d5, d5k, tol);
    for (int i = 0; i < RUNS; i++) free(out[i]);
}

/* The demo model (rows of 64 and 128, none a multiple of 256) under
 * q5_k_m makes what q4_k_m makes (Q4_1 for the base, Q8_0 where Q6_K's
 * rows do not fit), as llama.cpp falls back from 256-blocks: the same
 * greedy tokens as q4_k_m, and logits within the fallback formats'
 * tolerance of the unquantized model's (the relative RMS distance at most
 * 1.25 sqrt(7 L + 1) e, e = 0.079 Q4_1's relative RMS error on the demo's
 * weights, docs/quality.md; measured 0.14). */
Test(q5_k_m, demo_model_takes_q4_k_m_s_fallbacks)
{
    char cmd[1024], a[4096], b[4096];
    const char *fmt = "%s run %s/models/demo-moe --prompt-ids 5,6,7,8 -n 12 --temp 0 --backend cpu --threads 1 "
                      "--quantize %s 2>&1";
    snprintf(cmd, sizeof cmd, fmt, MOERUN_BINARY, MOERUN_SOURCE_DIR, "q4_k_m");
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0, "%s", a);
    snprintf(cmd, sizeof cmd, fmt, MOERUN_BINARY, MOERUN_SOURCE_DIR, "q5_k_m");
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0, "%s", b);
    /* the formats line and the generated ids: everything but the timings */
    char *ta = strstr(a, "moerun run:"), *tb = strstr(b, "moerun run:");
    cr_assert(ta && tb && strstr(b, "weights as prepared"), "%s", b);
    *ta = *tb = '\0';
    cr_expect(!strstr(b, "Q5_K"), "no demo matrix can be Q5_K: %s", b);
    cr_expect_str_eq(b, a, "q5_k_m's formats and tokens differ from q4_k_m's");

    struct moe_model m;
    const int V = 512;
    const size_t n = (size_t)20 * V;
    float *plain = malloc(n * 4), *q = malloc(n * 4);
    cr_assert_eq(moe_model_load(&m, MOERUN_SOURCE_DIR "/models/demo-moe"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(m.cfg.vocab, V);
    qt_prompt_logits(&m, "cpu-ref", MOE_QUANT_NONE, plain);
    moe_model_free(&m);
    cr_assert_eq(moe_model_load(&m, MOERUN_SOURCE_DIR "/models/demo-moe"), MOE_OK, "%s", moe_last_error());
    qt_prompt_logits(&m, "cpu", MOE_QUANT_Q5_K_M, q);
    const int layers = m.cfg.n_layers;
    moe_model_free(&m);
    const double d = rel_rms(q, plain, n), tol = 1.25 * sqrt(7.0 * layers + 1) * 0.079;
    cr_log_info("demo q5_k_m: logits' relative RMS distance from bf16 %.4f (tolerance %.3f)", d, tol);
    cr_expect(d <= tol, "demo q5_k_m logits %g from bf16's, past %g", d, tol);
    free(plain), free(q);
}

/* moerun plan --quantize q5_k and q5_k_m, worked by hand: OLMoE-1B-7B (16
 * layers, 8 of them using more bits; every row a multiple of 256): q5_k
 * 5.5 bits a weight for experts and attention, the LM head 9; q5_k_m the
 * experts (2 x 5.5 + (8 x 6.5625 + 8 x 5.5) / 16) / 3 bits, attention (Q,
 * K, O at 5.5, V at 6.5625 in 8 layers of 16) the same over 4 matrices,
 * the LM head 6.5625. */
Test(q5_k_m, plan_predicts_the_sizes)
{
    char cmd[1024], a[8192], b[8192], c[8192];
    snprintf(cmd, sizeof cmd, "%s plan --device cpu --synthetic %s/configs/olmoe-1b-7b.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
    const size_t len = strlen(cmd);
    strcat(cmd, " --quantize q5_k_m");
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0, "%s", b);
    cmd[len] = '\0';
    strcat(cmd, " --quantize q5_k");
    cr_assert_eq(tu_run(cmd, c, sizeof c), 0, "%s", c);
    const double experts = (2 * 5.5 + (8 * 6.5625 + 8 * 5.5) / 16) / 3 / 16,
                 attn = (3 * 5.5 + (8 * 6.5625 + 8 * 5.5) / 16) / 4 / 16;
    const double ge = qt_part_gib(b, "\n  experts") / qt_part_gib(a, "\n  experts"),
                 ga = qt_part_gib(b, "\n  attention") / qt_part_gib(a, "\n  attention"),
                 gh = qt_part_gib(b, "\n  lm head") / qt_part_gib(a, "\n  lm head");
    cr_expect(fabs(ge / experts - 1) < 2e-3, "q5_k_m experts: %g of bf16, expected %g", ge, experts);
    cr_expect(fabs(ga / attn - 1) < 2e-3, "q5_k_m attention: %g of bf16, expected %g", ga, attn);
    cr_expect(fabs(gh / (6.5625 / 16) - 1) < 2e-3, "q5_k_m LM head: %g of bf16", gh);
    const double ce = qt_part_gib(c, "\n  experts") / qt_part_gib(a, "\n  experts"),
                 ca = qt_part_gib(c, "\n  attention") / qt_part_gib(a, "\n  attention"),
                 ch = qt_part_gib(c, "\n  lm head") / qt_part_gib(a, "\n  lm head");
    cr_expect(fabs(ce / (5.5 / 16) - 1) < 2e-3 && fabs(ca / (5.5 / 16) - 1) < 2e-3, "q5_k: experts %g, attention %g",
              ce, ca);
    cr_expect(fabs(ch / (9.0 / 16) - 1) < 2e-3, "q5_k LM head: %g of bf16", ch);
    cr_expect(qt_part_gib(b, "\n  router") == qt_part_gib(a, "\n  router"));
}

/* A per-expert precision plan with q5_k_m is refused with one line naming
 * why (its plans name q8_0, q4 or stored). */
Test(q5_k_m, plans_are_refused)
{
    char dir[] = "/tmp/moerun-q5km-XXXXXX", path[600];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/plan.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"expert_dtypes\": {\"0\": {\"0\": \"q8_0\"}}}\n", f);
    fclose(f);
    char args[1024];
    snprintf(args, sizeof args, "run %s/models/demo-moe --prompt-ids 5 -n 1 --backend cpu --quantize q5_k_m "
             "--expert-dtype-plan %s", MOERUN_SOURCE_DIR, path);
    tu_expect_one_line_error(args, "not with --quantize q5_k or q5_k_m");
    unlink(path);
    rmdir(dir);
}
