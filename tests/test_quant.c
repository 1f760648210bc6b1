/* test_quant.c - Q8_0 weights (--quantize q8_0): the blocks equal gguf-py's
 * (tests/fixtures/quant, made by tests/reference/make_quant_fixtures.py), the
 * reference and fast kernels multiply them as the dequantized values, and
 * the CPU backends quantize a model's weights at prepare_model, keeping the
 * routers and the embedding, refusing weights that are not finite. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gemm.h"
#include "runtime/gemm_fast.h"
#include "runtime/runner.h"
#include "runtime/safetensors.h"
#include "tests/testutil.h"

Test(quant, q8_0_blocks_equal_gguf_py)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/q8_0.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    const struct moe_st_tensor *x = moe_safetensors_find(&st, "x"), *q = moe_safetensors_find(&st, "q8_0"),
                               *d = moe_safetensors_find(&st, "dequant");
    cr_assert(x && q && d);
    const int R = (int)x->shape[0], K = (int)x->shape[1], nb = K / MOE_Q8_0_BLOCK;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)K), grb = (size_t)q->shape[1];
    cr_assert_eq(grb, (size_t)nb * 34, "ggml blocks: f16 scale + 32 int8");
    unsigned char *got = malloc(rb);
    float *back = malloc((size_t)K * sizeof(float));
    for (int r = 0; r < R; r++) {
        cr_assert(moe_quantize_row_q8_0(got, (const float *)x->data + (size_t)r * K, (size_t)K));
        const unsigned char *want = (const unsigned char *)q->data + (size_t)r * grb;
        for (int b = 0; b < nb; b++) { /* ours: f32 scale (the f16 widened), then the same 32 q */
            const unsigned char *g = got + (size_t)b * MOE_Q8_0_BYTES, *w = want + (size_t)b * 34;
            uint16_t h;
            float d;
            memcpy(&h, w, 2);
            memcpy(&d, g, 4);
            cr_assert_eq(d, moe_f16_to_f32(h), "row %d block %d: scale %g, gguf-py %g", r, b, d,
                         moe_f16_to_f32(h));
            for (int j = 0; j < 32; j++)
                cr_assert_eq(g[4 + j], w[2 + j], "row %d block %d q %d: %d, gguf-py %d", r, b, j,
                             (int8_t)g[4 + j], (int8_t)w[2 + j]);
        }
        moe_convert_row_f32(back, got, MOE_DTYPE_Q8_0, (size_t)K);
        cr_assert(memcmp(back, (const float *)d->data + (size_t)r * K, (size_t)K * sizeof(float)) == 0,
                  "row %d: dequantized values differ from gguf-py's", r);
    }
    /* not finite, or a scale past f16: refused */
    float bad[32] = {0};
    bad[7] = NAN;
    cr_expect_not(moe_quantize_row_q8_0(got, bad, 32));
    bad[7] = INFINITY;
    cr_expect_not(moe_quantize_row_q8_0(got, bad, 32));
    bad[7] = 1e10f;
    cr_expect_not(moe_quantize_row_q8_0(got, bad, 32));
    free(got);
    free(back);
    moe_safetensors_close(&st);
}

/* (N, Din) random weights in [-1, 1) as Q8_0 (new memory). */
static void *q8_weights(int N, int Din, uint64_t seed)
{
    float *f = malloc((size_t)N * Din * sizeof(float));
    tu_fill_uniform(f, (size_t)N * Din, seed, -1, 1);
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)Din);
    unsigned char *w = malloc((size_t)N * rb);
    for (int n = 0; n < N; n++) cr_assert(moe_quantize_row_q8_0(w + (size_t)n * rb, f + (size_t)n * Din, (size_t)Din));
    free(f);
    return w;
}

/* The fast kernels over Q8_0 equal the reference GEMM (which dequantizes
 * rows) to fp32 tolerance, and a row gives the same bits alone or in any
 * batch. */
Test(quant, fast_gemm_q8_0_matches_reference)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("this processor runs no fast kernel set");
    const int Ts[] = {1, 2, 3, 4, 5, 7, 12, 67, 130}, Ns[] = {1, 5, 13, 50, 97}, Ds[] = {32, 64, 96, 256};
    for (int isa = MOE_CPU_ISA_AVX2; isa <= (int)best; isa++)
        for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
                for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++) {
                    const int T = Ts[a], N = Ns[b], D = Ds[c];
                    void *w = q8_weights(N, D, (uint64_t)(T * 131 + N * 7 + D));
                    float *x = malloc((size_t)T * D * sizeof(float)), *ref = malloc((size_t)T * N * 4),
                          *got = malloc((size_t)T * N * 4), *one = malloc((size_t)N * 4),
                          *scratch = malloc((size_t)D * 64 * sizeof(float));
                    tu_fill_uniform(x, (size_t)T * D, (uint64_t)(T + N + D), -1, 1);
                    moe_gemm_cpu(ref, N, x, D, w, MOE_DTYPE_Q8_0, N, D, T, NULL, scratch);
                    moe_gemm_fast((enum moe_cpu_isa)isa, got, N, x, D, w, MOE_DTYPE_Q8_0, N, D, T, NULL);
                    char what[96];
                    snprintf(what, sizeof what, "q8_0 gemm %s T=%d N=%d Din=%d",
                             moe_cpu_isa_name((enum moe_cpu_isa)isa), T, N, D);
                    cr_expect(tu_allclose(what, got, ref, (size_t)T * N, 2e-6f * (float)D + 1e-6f, 1e-5f),
                              "%s", what);
                    for (int r = 0; r < T; r += T > 8 ? 7 : 1) {
                        moe_gemm_fast((enum moe_cpu_isa)isa, one, N, x + (size_t)r * D, D, w,
                                      MOE_DTYPE_Q8_0, N, D, 1, NULL);
                        cr_expect(memcmp(one, got + (size_t)r * N, (size_t)N * 4) == 0,
                                  "%s: row %d alone differs from the batch", what, r);
                    }
                    free(w);
                    free(x);
                    free(ref);
                    free(got);
                    free(one);
                    free(scratch);
                }
}

/* A synthetic bf16 model prepared with quant on backend `name`: logits of
 * a 20-token prompt (V each) into logits. */
static void run_quantized(const char *name, enum moe_weight_quant q, float *logits, struct moe_model *m)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(m, &cfg, MOE_DTYPE_BF16, 11), MOE_OK, "%s", moe_last_error());
    struct moe_backend be;
    cr_assert_eq(moe_backend_init(&be, name, 0), MOE_OK, "%s", moe_last_error());
    be.quant = q;
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 1, .max_logits = 64, .block_size = 8,
                                .n_blocks = 32};
    cr_assert_eq(moe_runner_init(&r, m, &be, &o), MOE_OK, "%s", moe_last_error());
    int32_t prompt[20];
    tu_prompt_logits(&r, cfg.vocab, prompt, logits);
    moe_runner_free(&r);
    moe_backend_free(&be);
}

/* What gets quantized, and the reference and fast backends agree on the
 * quantized model; it stays near the bf16 one. */
Test(quant, backends_quantize_a_model)
{
    const int V = 1024;
    float *ref = malloc((size_t)20 * V * 4), *fast = malloc((size_t)20 * V * 4), *plain = malloc((size_t)20 * V * 4);
    struct moe_model m;
    run_quantized("cpu-ref", MOE_QUANT_Q8_0, ref, &m);
    const struct moe_layer_weights *w = &m.layers[0];
    cr_expect_eq(w->wq.dtype, MOE_DTYPE_Q8_0);
    cr_expect_eq(w->wo.dtype, MOE_DTYPE_Q8_0);
    cr_expect_eq(w->experts.dtype, MOE_DTYPE_Q8_0);
    cr_expect_eq(m.lm_head.dtype, MOE_DTYPE_Q8_0);
    cr_expect_eq(w->router.dtype, MOE_DTYPE_BF16, "the router keeps its dtype");
    cr_expect_eq(m.embed.dtype, MOE_DTYPE_BF16, "the embedding keeps its dtype");
    moe_model_free(&m);
    if (moe_cpu_isa_detect() != MOE_CPU_ISA_REF) {
        run_quantized("cpu", MOE_QUANT_Q8_0, fast, &m);
        cr_expect_eq(m.layers[0].router.dtype, MOE_DTYPE_BF16_PANEL, "bf16 routers still go to panels");
        moe_model_free(&m);
        cr_expect(tu_allclose("q8_0 logits fast vs reference", fast, ref, (size_t)20 * V, 1e-4f, 1e-3f));
    }
    run_quantized("cpu-ref", MOE_QUANT_NONE, plain, &m);
    moe_model_free(&m);
    /* random weights route chaotically (one flipped expert moves a row a
     * lot), so the bound is on the mean; the trained model's KL is checked
     * in test_ppl */
    double sum_d = 0, sum_x = 0;
    for (size_t i = 0; i < (size_t)20 * V; i++) {
        sum_d += fabs(ref[i] - plain[i]);
        sum_x += fabs(plain[i]);
    }
    cr_expect(sum_d > 0, "quantization must change something");
    cr_expect(sum_d < 0.1 * sum_x, "q8_0 logits move by %g on average (mean |logit| %g)",
              sum_d / (20.0 * V), sum_x / (20.0 * V));
    free(ref);
    free(fast);
    free(plain);
}

Test(quant, weights_that_are_not_finite_are_refused)
{
    struct moe_config cfg;
    struct moe_model m;
    struct moe_backend be;
    struct moe_runner r;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(&m, &cfg, MOE_DTYPE_F32, 3), MOE_OK);
    ((float *)m.layers[1].wv.data)[77] = NAN;
    cr_assert_eq(moe_backend_init(&be, "cpu", 0), MOE_OK);
    be.quant = MOE_QUANT_Q8_0;
    const float *wq = m.layers[0].wq.data;
    struct moe_runner_opts o = {.max_tokens = 8, .max_seqs = 1, .max_logits = 8, .block_size = 8, .n_blocks = 4};
    cr_assert_neq(moe_runner_init(&r, &m, &be, &o), MOE_OK);
    cr_expect(strstr(moe_last_error(), "weight of layer 1 holds a value that is not finite"), "%s",
              moe_last_error());
    cr_expect_eq(m.layers[0].wq.data, wq, "a failed quantization leaves the model as it was");
    cr_expect_eq(m.layers[0].wq.dtype, MOE_DTYPE_F32);
    moe_backend_free(&be);
    moe_model_free(&m);
}

Test(quant, cli_options)
{
    char args[1024];
    snprintf(args, sizeof args, "run %s/mixtral --prompt-ids 1,2 --quantize q4", FIXTURE_DIR);
    tu_expect_one_line_error(args, "--quantize 'q4' (use q8_0, or none)");
    /* the mixtral fixture's widths (64, 32) are whole blocks: 8 ids come out */
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3,4 -n 8 --quantize q8_0 --backend cpu "
             "--ignore-eos 2>/dev/null", MOERUN_BINARY, FIXTURE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    int commas = 0;
    for (const char *p = out; *p; p++) commas += *p == ',';
    cr_expect_eq(commas, 7, "%s", out);
}

/* moerun plan --quantize q8_0: the quantized parts at 9 bits per weight,
 * the embedding and the routers as stored (bf16 here). */
static double part_gib(const char *out, const char *name)
{
    const char *p = strstr(out, name);
    cr_assert(p, "no %s line in: %s", name, out);
    double v;
    char unit[8];
    cr_assert_eq(sscanf(p + strlen(name), " %lf %7s", &v, unit), 2);
    return !strcmp(unit, "GiB") ? v : !strcmp(unit, "MiB") ? v / 1024 : v / 1048576;
}

Test(quant, plan_predicts_q8_0_sizes)
{
    char cmd[1024], a[8192], b[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/glm-4.5-air.json", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
    strcat(cmd, " --quantize q8_0");
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0);
    cr_expect(fabs(part_gib(b, "\n  experts") / part_gib(a, "\n  experts") - 9.0 / 16) < 1e-3);
    cr_expect(fabs(part_gib(b, "\n  attention") / part_gib(a, "\n  attention") - 9.0 / 16) < 2e-3);
    cr_expect(part_gib(b, "\n  embeddings") == part_gib(a, "\n  embeddings"));
    cr_expect(part_gib(b, "\n  router") == part_gib(a, "\n  router"));
}
