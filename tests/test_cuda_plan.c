/* test_cuda_plan.c - per-expert precision plans (--expert-dtype-plan) on
 * the CUDA backend: a layer's experts in up to three formats (stored,
 * Q8_0 and four-bit, quantized on the device), one stack per format
 * (struct cuda_mixed), against the CPU reference given the same plan.
 * Each check prints a "parity:" line for tests/gpu/run.sh.  Without a
 * device every test skips (the suite's .init asks the CUDA runtime in the
 * forked test process). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend.h"
#include "runtime/engine/runner.h"
#include "runtime/model/synth.h"
#include "tests/testutil.h"

TestSuite(cuda_plan, .init = tu_need_cuda_device);

/* The logits of every row of an S-token prompt of m on backend `name`
 * under the plan; *dtypes (layers x E, when not NULL) each expert's dtype
 * after prepare_model. */
static void planned_logits(struct moe_model *m, const char *name, enum moe_weight_quant q, const uint8_t *plan,
                           int S, float *logits, enum moe_dtype *dtypes)
{
    const int L = m->cfg.n_layers, E = m->cfg.n_experts;
    struct moe_backend be;
    cr_assert_eq(tu_backend_init_planned(&be, name, q, plan, L, E, 0, 0), MOE_OK, "%s", moe_last_error());
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = S, .max_seqs = 1, .max_logits = S, .block_size = 8, .n_blocks = 32};
    cr_assert_eq(moe_runner_init(&r, m, &be, &o), MOE_OK, "%s: %s", name, moe_last_error());
    for (int l = 0; l < L && dtypes; l++)
        for (int e = 0; e < E; e++) dtypes[l * E + e] = moe_expert_dtype(&m->layers[l].experts, e);
    int32_t prompt[64];
    cr_assert(S <= 64);
    tu_prompt_logits_n(&r, m->cfg.vocab, S, prompt, logits);
    moe_runner_free(&r);
    moe_backend_free(&be);
}

/* tiny-moe's seeded weights in dt, experts F wide (0: as configured). */
static void tiny_moe(struct moe_model *m, enum moe_dtype dt, int F)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    if (F) cfg.d_expert = F;
    cr_assert_eq(moe_model_synthetic(m, &cfg, dt, 11), MOE_OK, "%s", moe_last_error());
}

/* A plan over L layers of E experts: layer 0 each of stored, q8_0, q4 and
 * the default in turn, layer 1 all q4 (one format: no split), layer 2
 * stored and q4, the last layer the default throughout. */
static uint8_t *mixed_plan(int L, int E)
{
    uint8_t *p = malloc((size_t)L * E);
    const uint8_t turn[4] = {MOE_QUANT_NONE, MOE_QUANT_Q8_0, MOE_QUANT_Q4, MOE_EXPERT_QUANT_DEFAULT};
    for (int e = 0; e < E; e++) {
        p[e] = turn[e % 4];
        p[E + e] = MOE_QUANT_Q4;
        p[2 * E + e] = e % 3 ? MOE_QUANT_Q4 : MOE_QUANT_NONE;
        for (int l = 3; l < L; l++) p[l * E + e] = MOE_EXPERT_QUANT_DEFAULT;
    }
    return p;
}

/* tiny-moe (f32, experts F wide) under mixed_plan and --quantize q8_0 on
 * the device and on the CPU reference: every expert in the format its
 * entry names on both, and the logits of S rows within tol. */
static void check_tiny_plan(int F, int S, double tol, const char *what)
{
    struct moe_model m;
    tiny_moe(&m, MOE_DTYPE_F32, F);
    const int L = m.cfg.n_layers, E = m.cfg.n_experts, V = m.cfg.vocab, Fw = m.cfg.d_expert;
    uint8_t *plan = mixed_plan(L, E);
    float *ref = malloc((size_t)S * V * 4), *got = malloc((size_t)S * V * 4);
    enum moe_dtype *dref = malloc((size_t)L * E * sizeof *dref), *dgot = malloc((size_t)L * E * sizeof *dgot);
    planned_logits(&m, "cpu-ref", MOE_QUANT_Q8_0, plan, S, ref, dref);
    moe_model_free(&m);
    tiny_moe(&m, MOE_DTYPE_F32, F);
    planned_logits(&m, "cuda", MOE_QUANT_Q8_0, plan, S, got, dgot);
    moe_model_free(&m);
    const enum moe_dtype q4 = Fw % 256 == 0 ? MOE_DTYPE_Q4_K : MOE_DTYPE_Q4_1;
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) {
            const uint8_t p = plan[l * E + e];
            const enum moe_dtype want = p == MOE_QUANT_NONE ? MOE_DTYPE_F32 : p == MOE_QUANT_Q4 ? q4 : MOE_DTYPE_Q8_0;
            cr_expect_eq(dgot[l * E + e], want, "%s: layer %d expert %d is %s on the device, expected %s", what, l, e,
                         moe_dtype_name(dgot[l * E + e]), moe_dtype_name(want));
            cr_expect_eq(dref[l * E + e], want, "%s: layer %d expert %d is %s on the CPU", what, l, e,
                         moe_dtype_name(dref[l * E + e]));
        }
    const double err = tu_max_rel_err(got, ref, (size_t)S * V);
    fprintf(stderr, "parity: %-12s %-5s %-22s max rel err %.3g\n", "plan_model", "F32", what, err);
    cr_expect(err <= tol, "%s: %.3g", what, err);
    free(plan), free(ref), free(got), free(dref), free(dgot);
}

/* Steps of up to 32 rows: every stack on the device-driven kernels,
 * their fp32 rows combined in place (Q4_1 experts, then Q4_K). */
Test(cuda_plan, plan_model_matches_cpu)
{
    check_tiny_plan(0, 20, 1e-4, "tiny-moe S20 kernels");
    check_tiny_plan(256, 20, 1e-4, "tiny-moe S20 Q4_K");
}

/* The OLMoE fixture (bf16) under a plan with every format in both layers:
 * S rows on the device against the CPU reference (bf16 router inputs and,
 * past 32 rows, bf16 activations on cuBLAS's grouped GEMMs: 2e-2). */
static void check_olmoe_plan(int S, const char *what)
{
    struct moe_model m;
    cr_assert_eq(moe_model_load(&m, FIXTURE_DIR "/olmoe"), MOE_OK, "%s", moe_last_error());
    const int L = m.cfg.n_layers, E = m.cfg.n_experts, V = m.cfg.vocab;
    uint8_t *plan = malloc((size_t)L * E);
    for (int i = 0; i < L * E; i++) plan[i] = (uint8_t)(i % 3); /* stored, q8_0, q4 */
    float *ref = malloc((size_t)S * V * 4), *got = malloc((size_t)S * V * 4);
    planned_logits(&m, "cpu-ref", MOE_QUANT_NONE, plan, S, ref, NULL);
    moe_model_free(&m);
    cr_assert_eq(moe_model_load(&m, FIXTURE_DIR "/olmoe"), MOE_OK, "%s", moe_last_error());
    planned_logits(&m, "cuda", MOE_QUANT_NONE, plan, S, got, NULL);
    moe_model_free(&m);
    const double err = tu_max_rel_err(got, ref, (size_t)S * V);
    fprintf(stderr, "parity: %-12s %-5s %-22s max rel err %.3g\n", "plan_model", "BF16", what, err);
    cr_expect(err <= 2e-2, "%s: %.3g", what, err);
    free(plan), free(ref), free(got);
}

/* 8 rows: the decode kernels for the three stacks */
Test(cuda_plan, plan_olmoe_short_matches_cpu) { check_olmoe_plan(8, "olmoe S8 kernels"); }

/* 40 rows (10 an expert): each stack on cuBLAS's grouped GEMMs (bf16 as
 * stored, Q8_0 and Q4_1 widened), half rows gathered into fp32 per stack
 * (moe_experts_take_rows_cuda) before one combine */
Test(cuda_plan, plan_olmoe_grouped_matches_cpu) { check_olmoe_plan(40, "olmoe S40 grouped"); }

/* The same with MOERUN_CUDA_EXPERTS=mma: the stored and Q8_0 stacks on the
 * tensor-core kernels, the Q4_1 one (no four-bit tensor-core path) on
 * cuBLAS */
Test(cuda_plan, plan_olmoe_mma_matches_cpu)
{
    setenv("MOERUN_CUDA_EXPERTS", "mma", 1);
    check_olmoe_plan(40, "olmoe S40 mma");
    unsetenv("MOERUN_CUDA_EXPERTS");
}

/* What the device refuses before anything is quantized: a plan naming an
 * expert the model does not have, and a plan with --gpu-experts. */
Test(cuda_plan, plan_refusals)
{
    struct moe_model m;
    tiny_moe(&m, MOE_DTYPE_F32, 0);
    const int L = m.cfg.n_layers, E = m.cfg.n_experts;
    uint8_t *plan = malloc((size_t)L * (E + 1));
    memset(plan, MOE_EXPERT_QUANT_DEFAULT, (size_t)L * (E + 1));
    plan[1 * (E + 1) + E] = MOE_QUANT_Q4; /* layer 1, expert E */
    struct moe_backend be;
    cr_assert_eq(tu_backend_init_planned(&be, "cuda", MOE_QUANT_NONE, plan, L, E + 1, 0, 0), MOE_OK, "%s", moe_last_error());
    cr_expect_neq(be.ops->prepare_model(&be, &m), MOE_OK);
    cr_expect(strstr(moe_last_error(), "expert 32 of layer 1 does not exist"), "%s", moe_last_error());
    moe_backend_free(&be);
    moe_model_free(&m);
    tiny_moe(&m, MOE_DTYPE_F32, 0);
    plan[1 * (E + 1) + E] = MOE_EXPERT_QUANT_DEFAULT;
    plan[0] = MOE_QUANT_Q4;
    cr_assert_eq(tu_backend_init_planned(&be, "cuda", MOE_QUANT_NONE, plan, L, E + 1, 8, 0), MOE_OK, "%s", moe_last_error());
    cr_expect_neq(be.ops->prepare_model(&be, &m), MOE_OK);
    cr_expect(strstr(moe_last_error(), "--expert-dtype-plan with --gpu-experts"), "%s", moe_last_error());
    moe_backend_free(&be);
    moe_model_free(&m);
    free(plan);
}
