/* backend_ops_cases.h - the table of cases every backend under test walks
 * (tests/test_backend_ops.c: the CPU backends; test_backend_ops_cuda.c:
 * CUDA), cpu-ref and each side's workspaces sized for it, and the walk. */
#pragma once

#include "tests/backend_ops_moe.h"

#define F32 MOE_DTYPE_F32
#define F16 MOE_DTYPE_F16
#define BF16 MOE_DTYPE_BF16
#define FP8 MOE_DTYPE_FP8_B128
#define MXFP4 MOE_DTYPE_MXFP4
#define Q8_0 MOE_DTYPE_Q8_0
#define Q4_1 MOE_DTYPE_Q4_1
#define Q4_G32 MOE_DTYPE_Q4_G32
#define Q4_G128 MOE_DTYPE_Q4_G128
#define E4M3 MOE_DTYPE_F8E4M3

/* Experts in the reserved configuration (expert_load needs all of them). */
enum { RESERVED_E = 67 };

static const struct op_case cases[] = {
    {"embed", run_embed, F32, .T = 17, .N = 50, .D = 37},
    {"embed", run_embed, F16, .T = 1, .N = 50, .D = 300},
    {"embed", run_embed, BF16, .T = 65, .N = 97, .D = 129},
    {"rmsnorm", run_rmsnorm, F32, .T = 1, .D = 64},
    {"rmsnorm", run_rmsnorm, F16, .T = 17, .D = 37},
    {"rmsnorm", run_rmsnorm, BF16, .T = 65, .D = 1000, .flags = IN_PLACE},
    {"rmsnorm", run_rmsnorm, F32, .T = 3, .D = 129, .flags = IN_PLACE},
    /* matmul: every weight dtype, odd widths where the format allows */
    {"matmul", run_matmul, F32, .T = 1, .N = 37, .D = 77, .flags = BIAS},
    {"matmul", run_matmul, F32, .T = 17, .N = 97, .D = 259},
    {"matmul", run_matmul, F32, .T = 65, .N = 33, .D = 64, .flags = BIAS},
    {"matmul", run_matmul, F16, .T = 1, .N = 97, .D = 259, .flags = BIAS},
    {"matmul", run_matmul, F16, .T = 17, .N = 37, .D = 77},
    {"matmul", run_matmul, F16, .T = 65, .N = 130, .D = 100, .flags = BIAS_BF16},
    {"matmul", run_matmul, BF16, .T = 1, .N = 37, .D = 78, .flags = BIAS}, /* even: panels */
    {"matmul", run_matmul, BF16, .T = 17, .N = 97, .D = 258, .flags = BIAS_BF16},
    {"matmul", run_matmul, BF16, .T = 65, .N = 33, .D = 77}, /* odd: natural */
    {"matmul", run_matmul, BF16, .T = 3, .N = 161, .D = 130},
    {"matmul", run_matmul, FP8, .T = 1, .N = 37, .D = 256, .flags = BIAS},
    {"matmul", run_matmul, FP8, .T = 17, .N = 33, .D = 128},
    {"matmul", run_matmul, FP8, .T = 65, .N = 21, .D = 384},
    {"matmul", run_matmul, MXFP4, .T = 1, .N = 37, .D = 96, .flags = BIAS},
    {"matmul", run_matmul, MXFP4, .T = 17, .N = 97, .D = 64},
    {"matmul", run_matmul, MXFP4, .T = 65, .N = 33, .D = 160},
    {"matmul", run_matmul, Q8_0, .T = 1, .N = 37, .D = 96, .flags = BIAS},
    {"matmul", run_matmul, Q8_0, .T = 17, .N = 97, .D = 64},
    {"matmul", run_matmul, Q8_0, .T = 65, .N = 33, .D = 160},
    {"matmul", run_matmul, Q4_1, .T = 1, .N = 37, .D = 96, .flags = BIAS},
    {"matmul", run_matmul, Q4_1, .T = 65, .N = 33, .D = 160},
    {"matmul", run_matmul, Q4_G32, .T = 17, .N = 97, .D = 64},
    {"matmul", run_matmul, Q4_G128, .T = 3, .N = 21, .D = 384},
    {"matmul", run_matmul, Q4_G128, .T = 65, .N = 33, .D = 256},
    {"matmul_multi", run_matmul_multi, BF16, .T = 1, .N = 131, .D = 78},
    {"matmul_multi", run_matmul_multi, BF16, .T = 17, .N = 131, .D = 78},
    {"matmul_multi", run_matmul_multi, F32, .T = 65, .N = 33, .D = 77},
    {"head_matmul", run_head_matmul, F32, .T = 1, .H = 16, .N = 512, .D = 128, .ldx = 192, .ldy = 576, .off = 64},
    {"head_matmul", run_head_matmul, F16, .T = 7, .H = 16, .N = 128, .D = 512, .ldx = 576, .ldy = 128},
    {"head_matmul", run_head_matmul, BF16, .T = 5, .H = 4, .N = 32, .D = 16, .ldx = 24, .ldy = 40, .off = 8},
    {"head_matmul", run_head_matmul, BF16, .T = 17, .H = 3, .N = 37, .D = 21, .ldx = 25, .ldy = 41, .off = 3},
    {"head_matmul", run_head_matmul, BF16, .T = 33, .H = 2, .N = 19, .D = 24, .ldx = 27, .ldy = 23, .off = 2},
    {"add", run_pointwise, F32, .T = 1, .D = 37},
    {"add", run_pointwise, F32, .T = 65, .D = 129},
    {"scale", run_pointwise, F32, .T = 17, .D = 37},
    {"clamp", run_pointwise, F32, .T = 65, .D = 129},
    {"swiglu", run_pointwise, F32, .T = 1, .D = 37},
    {"swiglu", run_pointwise, F32, .T = 65, .D = 129},
    {"sigmoid_scale", run_pointwise, F32, .T = 17, .D = 37},
    {"sigmoid_scale", run_pointwise, F32, .T = 3, .D = 300},
    {"rope", run_rope, F32, .T = 1, .H = 4, .Dh = 16, .rot = 16},
    {"rope", run_rope, F32, .T = 17, .H = 3, .Dh = 20, .rot = 20},
    {"rope", run_rope, F32, .T = 3, .H = 2, .Dh = 64, .rot = 32},  /* partial */
    {"rope", run_rope, F32, .T = 65, .H = 5, .Dh = 36, .rot = 12}, /* partial */
    {"rope", run_rope, F32, .T = 17, .H = 1, .Dh = 40, .rot = 20}, /* MLA's key row */
    /* kv_store + attention: every cache dtype, GQA and MQA, windows, sinks, MLA */
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .n_seqs = 3, .ctx = {1, 17, 41}, .rows = {1, 1, 1}},
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .n_seqs = 2, .ctx = {17, 70}, .rows = {17, 48}},
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .window = 7, .n_seqs = 2, .ctx = {41, 3},
     .rows = {41, 3}, .flags = WINDOW},
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .window = 7, .n_seqs = 2, .ctx = {41, 3},
     .rows = {41, 3}, .flags = WINDOW | SINKS},
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .n_seqs = 2, .ctx = {41, 3}, .rows = {41, 3},
     .flags = SINKS},
    {"attention", run_attention, BF16, .H = 5, .Hkv = 1, .Dh = 36, .window = 7, .n_seqs = 1, .ctx = {65},
     .rows = {65}, .flags = WINDOW | SINKS},
    {"attention", run_attention, F16, .H = 8, .Hkv = 2, .Dh = 64, .n_seqs = 2, .ctx = {3, 100}, .rows = {3, 1}},
    {"attention", run_attention, E4M3, .H = 6, .Hkv = 3, .Dh = 20, .window = 9, .n_seqs = 2, .ctx = {40, 17},
     .rows = {17, 17}, .flags = WINDOW},
    {"attention", run_attention, E4M3, .H = 4, .Hkv = 4, .Dh = 64, .n_seqs = 1, .ctx = {200}, .rows = {1},
     .flags = SINKS},
    {"attention", run_attention, F32, .H = 4, .Hkv = 1, .Dh = 40, .n_seqs = 3, .ctx = {1, 17, 33}, .rows = {1, 1, 5},
     .flags = MLA},
    {"attention", run_attention, E4M3, .H = 4, .Hkv = 1, .Dh = 40, .n_seqs = 2, .ctx = {9, 40}, .rows = {9, 3},
     .flags = MLA},
    /* route: softmax, group-limited softmax, sigmoid with bias and groups */
    {"route", run_route, F32, .T = 1, .E = 9, .K = 3, .flags = RENORM},
    {"route", run_route, F32, .T = 17, .E = 61, .K = 5},
    {"route", run_route, F32, .T = 65, .E = 67, .K = 8, .flags = RENORM},
    {"route", run_route, F32, .T = 17, .E = 63, .K = 5, .groups = 9, .topk_groups = 3, .scale = 2.5f},
    {"route", run_route, F32, .T = 65, .E = 64, .K = 6, .groups = 8, .topk_groups = 3, .flags = RENORM},
    {"route", run_route, F32, .T = 1, .E = 9, .K = 3, .groups = 3, .topk_groups = 2, .flags = SIGMOID},
    {"route", run_route, F32, .T = 17, .E = 63, .K = 5, .groups = 9, .topk_groups = 3, .scale = 2.5f,
     .flags = SIGMOID | RENORM},
    {"route", run_route, F32, .T = 65, .E = 67, .K = 7, .flags = SIGMOID},
    {"dispatch", run_dispatch, F32, .T = 1, .E = 9, .K = 3},
    {"dispatch", run_dispatch, F32, .T = 17, .E = 61, .K = 5},
    {"dispatch", run_dispatch, F32, .T = 65, .E = 67, .K = 8},
    {"dispatch", run_dispatch, F32, .T = 17, .E = 7, .K = 3, .flags = HOT},
    /* experts: every expert dtype, biases and the clamped activation */
    {"experts", run_experts, F32, .T = 1, .K = 3, .E = 7, .D = 37, .F = 21},
    {"experts", run_experts, F16, .T = 17, .K = 3, .E = 9, .D = 40, .F = 33},
    {"experts", run_experts, BF16, .T = 65, .K = 3, .E = 9, .D = 38, .F = 22}, /* even: panels */
    {"experts", run_experts, BF16, .T = 17, .K = 1, .E = 5, .D = 37, .F = 21, .flags = HOT},
    {"experts", run_experts, BF16, .T = 17, .K = 3, .E = 7, .D = 64, .F = 32, .flags = GPT_OSS},
    {"experts", run_experts, F32, .T = 1, .K = 2, .E = 8, .D = 64, .F = 32, .flags = GPT_OSS},
    {"experts", run_experts, F32, .T = 65, .K = 3, .E = 11, .D = 19, .F = 45}, /* many rows, idle experts */
    {"experts", run_experts, F32, .T = 17, .K = 1, .E = 5, .D = 40, .F = 33, .flags = HOT},
    {"experts", run_experts, F16, .T = 5, .K = 4, .E = 16, .D = 64, .F = 100, .flags = HOT},
    {"experts", run_experts, F16, .T = 65, .K = 3, .E = 11, .D = 40, .F = 48, .flags = GPT_OSS},
    {"experts", run_experts, BF16, .T = 1, .K = 2, .E = 8, .D = 38, .F = 22},
    {"experts", run_experts, BF16, .T = 5, .K = 4, .E = 16, .D = 64, .F = 100},
    {"experts", run_experts, BF16, .T = 9, .K = 1, .E = 5, .D = 40, .F = 34, .flags = HOT},
    {"experts", run_experts, BF16, .T = 130, .K = 2, .E = 3, .D = 256, .F = 96}, /* ~87 rows an expert */
    {"experts", run_experts, MXFP4, .T = 17, .K = 3, .E = 7, .D = 64, .F = 96, .flags = GPT_OSS},
    {"experts", run_experts, MXFP4, .T = 1, .K = 3, .E = 5, .D = 96, .F = 32},
    {"experts", run_experts, FP8, .T = 17, .K = 2, .E = 5, .D = 128, .F = 128},
    {"experts", run_experts, Q8_0, .T = 65, .K = 3, .E = 7, .D = 64, .F = 96},
    {"experts", run_experts, Q4_1, .T = 17, .K = 3, .E = 7, .D = 64, .F = 96},
    {"experts", run_experts, Q4_G32, .T = 65, .K = 3, .E = 7, .D = 64, .F = 96},
    {"experts", run_experts, Q4_G128, .T = 5, .K = 2, .E = 5, .D = 128, .F = 256},
    {"experts", run_experts, Q4_G128, .T = 65, .K = 2, .E = 3, .D = 256, .F = 128},
    {"gather_rows", run_gather_rows, F32, .T = 17, .D = 37},
    {"gather_rows", run_gather_rows, F32, .T = 1, .D = 300},
    {"gather_cols", run_gather_cols, F32, .T = 37, .N = 64, .ldx = 576, .ldy = 576, .off = 512},
    {"gather_cols", run_gather_cols, F32, .T = 65, .N = 20, .ldx = 60, .ldy = 40, .off = 40},
    {"gather_cols", run_gather_cols, F32, .T = 17, .N = 37, .ldx = 40, .ldy = 41, .off = -1},
    {"gather_cols", run_gather_cols, F32, .T = 1, .N = 3, .ldx = 7, .ldy = 9, .off = -1},
    {"argmax", run_argmax, F32, .T = 6, .D = 5000},
    {"argmax", run_argmax, F32, .T = 17, .D = 1001},
    {"argmax", run_argmax, F32, .T = 1, .D = 3},
    {"synth_fill", run_synth_fill, F32, .N = 1000, .D = 64},
    {"synth_fill", run_synth_fill, F16, .N = 1000, .D = 64},
    {"synth_fill", run_synth_fill, BF16, .N = 1000, .D = 64},
    {"synth_fill", run_synth_fill, BF16, .N = 17, .D = 37, .flags = ONES},
    {"expert_load", run_expert_load, F32, .T = 17, .K = 3, .E = RESERVED_E},
    {"to_host_async", run_to_host_async, F32, .T = 17, .D = 37},
};

/* ---- the backends ---- */

/* A configuration whose sizes cover every case (CUDA's reserve, the CPU
 * backends' scratch); mla: the attention workspace of an MLA model. */
static void reserve_config(struct moe_config *c, bool mla)
{
    *c = (struct moe_config){.n_layers = 2, .d_model = 1024, .n_heads = 8, .n_kv_heads = 1, .head_dim = 64,
                             .d_ff = 1024, .n_experts = RESERVED_E, .top_k = 8, .d_expert = 256,
                             .experts_mxfp4 = true, .weights_fp8 = true};
    c->layer_moe[0] = c->layer_moe[1] = true;
    if (mla) c->head_dim = 40, c->rope_dim = 20, c->kv_lora_rank = 20, c->n_heads = 4;
}

/* Sizes s's workspaces for every case: CUDA's reserve (normal and MLA
 * attention), or a CPU backend's prepare_model of a model with no layers,
 * which sizes its scratch from the configuration. */
static void side_reserve(struct side *s)
{
    struct moe_config c;
    reserve_config(&c, false);
    if (s->be.ops->reserve) {
        cr_assert_eq(s->be.ops->reserve(&s->be, &c, 512), MOE_OK, "%s", moe_last_error());
        reserve_config(&c, true);
        cr_assert_eq(s->be.ops->reserve(&s->be, &c, 512), MOE_OK, "%s", moe_last_error());
        return;
    }
    struct moe_model m = {.cfg = c};
    m.cfg.n_layers = 0;
    cr_assert_eq(s->be.ops->prepare_model(&s->be, &m), MOE_OK, "%s", moe_last_error());
}

/* cpu-ref, through moe_backend_cpu_init. */
static void open_ref(struct side *s)
{
    *s = (struct side){.label = "cpu-ref"};
    cr_assert_eq(moe_backend_cpu_init(&s->be, 0), MOE_OK, "%s", moe_last_error());
    side_reserve(s);
}

/* Walks the table on tg against ref, the cases of the ops named in only
 * (a NULL-terminated list; NULL: every case); each case's lines, then one
 * expectation per failed case. */
static void walk_cases_of(struct side *ref, struct side *tg, const char *const *only)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool named = !only;
        for (const char *const *o = only; o && *o && !named; o++) named = strcmp(*o, cases[i].op) == 0;
        if (!named) continue;
        const bool ok = cases[i].run(ref, tg, &cases[i]);
        cr_expect(ok, "%s: case %zu (%s %s) differs from cpu-ref; see its backend-ops line", tg->label, i,
                  cases[i].op, moe_dtype_name(cases[i].dt));
        side_release(ref);
        side_release(tg);
    }
}
