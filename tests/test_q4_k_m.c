/* test_q4_k_m.c - --quantize q4_k_m: q4 with llama.cpp's Q4_K_M choices
 * (llama_tensor_get_type: the down projections and attention V of the
 * layers "using more bits", and the LM head, at Q6_K; attention K and V at
 * Q8_0 in every layer of a model of 8 experts) on the CPU backends and in
 * plan's sizes.  The Q6_K blocks themselves are checked against gguf-py in
 * test_quant_q6_k.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/backend/backend.h"
#include "tests/quant_test.h"
#include "tests/testutil.h"

enum { L = QT_WIDE_L };

static void prepare(struct moe_model *m, struct moe_backend *be, const char *name, enum moe_weight_quant q)
{
    cr_assert_eq(tu_backend_init_with(be, name, q, 0, 0), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(be->ops->prepare_model(be, m), MOE_OK, "%s", moe_last_error());
}

/* Each matrix takes the dtype llama.cpp's Q4_K_M gives it, on both CPU
 * backends; the other matrices take q4's (Q4_K), routers and the embedding
 * stay as stored. */
Test(q4_k_m, picks_llama_cpp_s_matrices)
{
    const char *names[] = {"cpu-ref", "cpu"};
    for (int b = 0; b < 2; b++) {
        struct moe_model m;
        struct moe_backend be;
        qt_wide_model(&m, 4, 3);
        prepare(&m, &be, names[b], MOE_QUANT_Q4_K_M);
        cr_expect_eq(m.lm_head.dtype, MOE_DTYPE_Q6_K, "%s: the LM head", names[b]);
        cr_expect_eq(m.embed.dtype, MOE_DTYPE_BF16);
        for (int l = 0; l < L; l++) {
            const struct moe_layer_weights *w = &m.layers[l];
            const enum moe_dtype six = qt_more_bits(l) ? MOE_DTYPE_Q6_K : MOE_DTYPE_Q4_K;
            cr_expect_eq(w->wv.dtype, six, "%s: layer %d's V is %s", names[b], l, moe_dtype_name(w->wv.dtype));
            cr_expect_eq(w->wk.dtype, MOE_DTYPE_Q4_K);
            cr_expect_eq(w->wq.dtype, MOE_DTYPE_Q4_K);
            cr_expect_eq(w->wo.dtype, MOE_DTYPE_Q4_K);
            cr_expect(w->router.dtype == MOE_DTYPE_BF16 || w->router.dtype == MOE_DTYPE_BF16_PANEL,
                      "the router is not quantized");
            for (int e = 0; e < 4; e++) {
                cr_expect_eq(moe_expert_dtype(&w->experts, e), MOE_DTYPE_Q4_K);
                cr_expect_eq(moe_expert_down_dtype(&w->experts, e), six, "%s: layer %d expert %d's down is %s",
                             names[b], l, e, moe_dtype_name(moe_expert_down_dtype(&w->experts, e)));
            }
        }
        moe_backend_free(&be);
        moe_model_free(&m);
    }
}

/* A model of 8 experts (Mixtral-like): attention K and V at Q8_0 in every
 * layer, as llama.cpp does for such models. */
Test(q4_k_m, eight_experts_keep_k_and_v_at_q8_0)
{
    struct moe_model m;
    struct moe_backend be;
    qt_wide_model(&m, 8, 4);
    prepare(&m, &be, "cpu-ref", MOE_QUANT_Q4_K_M);
    for (int l = 0; l < L; l++) {
        cr_expect_eq(m.layers[l].wv.dtype, MOE_DTYPE_Q8_0, "layer %d", l);
        cr_expect_eq(m.layers[l].wk.dtype, MOE_DTYPE_Q8_0, "layer %d", l);
        cr_expect_eq(moe_expert_down_dtype(&m.layers[l].experts, 5), qt_more_bits(l) ? MOE_DTYPE_Q6_K : MOE_DTYPE_Q4_K);
    }
    moe_backend_free(&be);
    moe_model_free(&m);
}

/* The six-bit rows are moe_quantize_row_q6_k of the stored rows: an
 * expert's down matrix in a layer using more bits, and attention V. */
Test(q4_k_m, six_bit_rows_are_the_quantizer_s)
{
    struct moe_model m;
    qt_wide_model(&m, 4, 5);
    const int D = m.cfg.d_model, F = m.cfg.d_expert, l = 4, e = 2;
    const int NV = (int)m.layers[l].wv.shape[0];
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q6_K, (size_t)F), rbv = moe_dtype_row_bytes(MOE_DTYPE_Q6_K, (size_t)D);
    unsigned char *want = malloc((size_t)D * rb), *want_v = malloc((size_t)NV * rbv);
    float *row = malloc((size_t)(D > F ? D : F) * 4);
    for (int r = 0; r < D; r++) {
        moe_convert_row_f32(row, (const uint16_t *)m.layers[l].experts.down[e] + (size_t)r * F, MOE_DTYPE_BF16, (size_t)F);
        cr_assert(moe_quantize_row_q6_k(want + (size_t)r * rb, row, (size_t)F));
    }
    for (int r = 0; r < NV; r++) {
        moe_convert_row_f32(row, (const uint16_t *)m.layers[l].wv.data + (size_t)r * D, MOE_DTYPE_BF16, (size_t)D);
        cr_assert(moe_quantize_row_q6_k(want_v + (size_t)r * rbv, row, (size_t)D));
    }
    struct moe_backend be;
    prepare(&m, &be, "cpu", MOE_QUANT_Q4_K_M);
    cr_assert_eq(moe_expert_down_dtype(&m.layers[l].experts, e), MOE_DTYPE_Q6_K);
    cr_expect(memcmp(m.layers[l].experts.down[e], want, (size_t)D * rb) == 0, "expert %d's down rows differ", e);
    cr_assert_eq(m.layers[l].wv.dtype, MOE_DTYPE_Q6_K);
    cr_expect(memcmp(m.layers[l].wv.data, want_v, (size_t)NV * rbv) == 0, "layer %d's V rows differ", l);
    moe_backend_free(&be);
    moe_model_free(&m);
    free(want);
    free(want_v);
    free(row);
}

/* The model computes: the fast backend's logits stay as near the reference
 * backend's on q4_k_m's weights as on q4's (both round each input row to 8
 * bits; random weights route chaotically, so one flipped expert moves a
 * row a lot and the bound is relative), and q4_k_m's logits sit nearer the
 * bf16 model's than q4's (more bits in some matrices). */
Test(q4_k_m, logits_near_the_reference_and_bf16)
{
    const int V = 512;
    const size_t n = (size_t)20 * V;
    float *fast = malloc(n * 4), *ref = malloc(n * 4), *q4 = malloc(n * 4), *plain = malloc(n * 4),
          *q4_fast = malloc(n * 4);
    float **outs[] = {&ref, &fast, &q4, &plain, &q4_fast};
    const char *names[] = {"cpu-ref", "cpu", "cpu-ref", "cpu-ref", "cpu"};
    const enum moe_weight_quant qs[] = {MOE_QUANT_Q4_K_M, MOE_QUANT_Q4_K_M, MOE_QUANT_Q4, MOE_QUANT_NONE,
                                        MOE_QUANT_Q4};
    for (int i = 0; i < 5; i++) {
        struct moe_model m;
        qt_wide_model(&m, 4, 9);
        qt_prompt_logits(&m, names[i], qs[i], *outs[i]);
        moe_model_free(&m);
    }
    const double size = tu_mean_abs_diff(plain, NULL, n), dfr = tu_mean_abs_diff(fast, ref, n),
                 dfr4 = tu_mean_abs_diff(q4_fast, q4, n), dkm = tu_mean_abs_diff(ref, plain, n),
                 d4 = tu_mean_abs_diff(q4, plain, n);
    cr_log_info("fast vs reference: q4_k_m %.3g, q4 %.3g; vs bf16: q4_k_m %.3g, q4 %.3g (mean |logit| %.3g)", dfr,
                dfr4, dkm, d4, size);
    cr_expect(dfr < 1.5 * dfr4 && dfr < 0.15 * size, "fast and reference logits apart by %g (q4: %g; mean |logit| %g)",
              dfr, dfr4, size);
    cr_expect(dkm < d4, "q4_k_m moves the logits (%g) less than q4 (%g)", dkm, d4);
    free(fast);
    free(ref);
    free(q4);
    free(plain);
    free(q4_fast);
}

/* moerun plan --quantize q4_k_m, worked by hand from llama.cpp's rule:
 * OLMoE-1B-7B (16 layers, 8 of them using more bits; every row a multiple
 * of 256): experts (2 x 4.5 + (8 x 6.5625 + 8 x 4.5) / 16) / 3 bits a
 * weight, attention (Q, K, O at 4.5, V at 6.5625 in 8 layers of 16) the
 * same over 4 matrices, the LM head at 6.5625; Mixtral-8x7B (8 experts):
 * K and V (1024 x 4096) at 9 bits, Q and O (4096 x 4096) at 4.5. */
Test(q4_k_m, plan_predicts_q4_k_m_sizes)
{
    char cmd[1024], a[8192], b[8192];
    snprintf(cmd, sizeof cmd, "%s plan --device cpu --synthetic %s/configs/olmoe-1b-7b.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
    strcat(cmd, " --quantize q4_k_m");
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0, "%s", b);
    const double experts = (2 * 4.5 + (8 * 6.5625 + 8 * 4.5) / 16) / 3 / 16,
                 attn = (3 * 4.5 + (8 * 6.5625 + 8 * 4.5) / 16) / 4 / 16;
    const double ge = qt_part_gib(b, "\n  experts") / qt_part_gib(a, "\n  experts"),
                 ga = qt_part_gib(b, "\n  attention") / qt_part_gib(a, "\n  attention"),
                 gh = qt_part_gib(b, "\n  lm head") / qt_part_gib(a, "\n  lm head");
    cr_expect(fabs(ge / experts - 1) < 2e-3, "experts: %g of bf16, expected %g", ge, experts);
    cr_expect(fabs(ga / attn - 1) < 2e-3, "attention: %g of bf16, expected %g", ga, attn);
    cr_expect(fabs(gh / (6.5625 / 16) - 1) < 2e-3, "LM head: %g of bf16", gh);
    cr_expect(qt_part_gib(b, "\n  router") == qt_part_gib(a, "\n  router"));
    snprintf(cmd, sizeof cmd, "%s plan --device cpu --synthetic %s/configs/mixtral-8x7b.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
    strcat(cmd, " --quantize q4_k_m");
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0, "%s", b);
    const double q = 4096.0 * 4096, kv = 1024.0 * 4096, want = (2 * q * 4.5 + 2 * kv * 9) / 16 / (2 * q + 2 * kv);
    const double gm = qt_part_gib(b, "\n  attention") / qt_part_gib(a, "\n  attention");
    cr_expect(fabs(gm / want - 1) < 2e-3, "Mixtral's attention: %g of bf16, expected %g", gm, want);
}
