/* test_plan_spec.c - `moerun plan`'s prediction of speculative decoding:
 * the expected tokens per step and the distinct experts per layer at
 * points with known values (plan_spec.h), the speedup's sign where it is
 * certain, the draft's memory, and one clear error line for each bad
 * option. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/plan_spec.h"
#include "tests/testutil.h"

Test(plan_spec, expected_tokens_at_known_points)
{
    for (int k = 0; k <= 16; k++) cr_expect_eq(moe_plan_spec_tokens(0, k), 1.0, "A = 0, K = %d: one token", k);
    cr_expect_eq(moe_plan_spec_tokens(0.9, 0), 1.0, "K = 0: the target's token alone");
    cr_expect_eq(moe_plan_spec_tokens(0.5, 1), 1.5);
    cr_expect_eq(moe_plan_spec_tokens(0.5, 2), 1.75);
    /* (1 - 0.8^5) / 0.2 = 3.3616 */
    cr_expect(fabs(moe_plan_spec_tokens(0.8, 4) - 3.3616) < 1e-12, "%.17g", moe_plan_spec_tokens(0.8, 4));
    /* large K: the geometric series' limit 1 / (1 - A) */
    cr_expect(fabs(moe_plan_spec_tokens(0.5, 200) - 2.0) < 1e-12);
    cr_expect(fabs(moe_plan_spec_tokens(0.9, 2000) - 10.0) < 1e-9, "%.17g", moe_plan_spec_tokens(0.9, 2000));
    /* close to 1 it tends to K + 1 */
    cr_expect(fabs(moe_plan_spec_tokens(1 - 1e-12, 8) - 9.0) < 1e-9);
}

Test(plan_spec, distinct_experts_at_known_points)
{
    for (int rows = 1; rows <= 17; rows++) /* every row routed to all E: E */
        cr_expect(fabs(moe_plan_distinct_experts(8, 8, rows) - 8) < 1e-12, "rows %d", rows);
    cr_expect(fabs(moe_plan_distinct_experts(64, 8, 1) - 8) < 1e-12, "one row (K = 0): its k_top");
    cr_expect(fabs(moe_plan_distinct_experts(8, 2, 1) - 2) < 1e-12);
    /* 64 (1 - (7/8)^2) = 15; 8 (1 - (3/4)^2) = 3.5 */
    cr_expect(fabs(moe_plan_distinct_experts(64, 8, 2) - 15) < 1e-12);
    cr_expect(fabs(moe_plan_distinct_experts(8, 2, 2) - 3.5) < 1e-12);
    cr_expect_eq(moe_plan_distinct_experts(0, 0, 4), 0.0, "a dense model");
}

Test(plan_spec, break_even_inverts_expected_tokens)
{
    cr_expect_eq(moe_plan_spec_break_even(0.9, 4), 0.0, "a step cheaper than a decode always pays");
    cr_expect_eq(moe_plan_spec_break_even(5.0, 4), 1.0, "K + 1 tokens at best: never");
    const double a = moe_plan_spec_break_even(1.5, 1);
    cr_expect(fabs(a - 0.5) < 1e-12, "%.17g", a);
    const double b = moe_plan_spec_break_even(2.2, 4);
    cr_expect(fabs(moe_plan_spec_tokens(b, 4) - 2.2) < 1e-12, "%.17g", b);
}

/* The speedup column of the row of K in plan's speculation table. */
static double speedup_of(const char *out, int k)
{
    const char *p = strstr(out, "\nspeculation");
    cr_assert(p, "%s", out);
    char want[16];
    snprintf(want, sizeof want, "\n  %2d ", k);
    p = strstr(p, want);
    cr_assert(p, "no row K = %d: %s", k, out);
    const char *x = strchr(p + 1, 'x');
    cr_assert(x && x < strchr(p + 1, '\n') + 1, "%s", out);
    while (x > p && x[-1] != ' ') x--;
    return atof(x);
}

/* n-gram drafts cost nothing, but a step of K + 1 rows costs at least one
 * decode step: at acceptance 0 (one token a step) it never pays; at high
 * acceptance on a memory-bound H200 step it does. */
Test(plan_spec, ngram_speedup_below_one_at_acceptance_zero)
{
    char cmd[1024], out[16384];
    for (int k = 1; k <= 8; k *= 2) {
        snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --spec ngram --accept 0 "
                 "--spec-tokens %d", MOERUN_BINARY, MOERUN_SOURCE_DIR, k);
        cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
        const double s = speedup_of(out, k);
        cr_expect(s > 0 && s < 1, "K = %d: %g\n%s", k, s, out);
    }
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --spec ngram --accept 0.8",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(speedup_of(out, 1) > 1, "%s", out);
    /* Mixtral at batch 1: the K = 1 verification touches 8 (1 - (3/4)^2) = 3.5 experts per layer */
    cr_expect(strstr(out, "\n   1           3.5 "), "%s", out);
    cr_expect(strchr(out, '*'), "the best K is marked: %s", out);
}

/* A draft as large as the target doubles the weights: Mixtral and a copy
 * of itself (2 x 86.99 GiB) do not fit in 90% of an H200's 141 GB; its KV
 * doubles too; and its K draft steps make speculation lose even at a high
 * acceptance. */
Test(plan_spec, draft_memory_and_cost)
{
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --draft %s/configs/mixtral-8x7b.json "
             "--accept 0.8 --spec-tokens 4", MOERUN_BINARY, MOERUN_SOURCE_DIR, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "86.99 GiB of weights, 128.00 KiB of KV per token (512.00 MiB per sequence)"), "%s", out);
    cr_expect(strstr(out, "the weights and the draft's (173.98 GiB) do not fit"), "%s", out);
    cr_expect(speedup_of(out, 4) < 1, "%s", out);
    /* the same on a 2 TB device: sequences of 4096 tokens need 1 GiB of KV each */
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --draft %s/configs/mixtral-8x7b.json "
             "--device 400GiB", MOERUN_BINARY, MOERUN_SOURCE_DIR, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    /* 0.9 x 400 GiB - 173.98 GiB = 186.02 GiB: 186 sequences of 1 GiB */
    cr_expect(strstr(out, "186.02 GiB left beside the weights and the draft's (90% of memory usable): 186 sequences"),
              "%s", out);
}

/* DeepSeek-V3's multi-token-prediction module in bf16: its embedding and
 * head (2 x 129280 x 7168 x 2 B), eh_proj (2 x 7168^2 x 2 B), one MoE
 * layer (256 + 1 experts of 3 x 7168 x 2048, the router, MLA's five
 * projections, 187.1M parameters) come to 26.93 GB, 25.08 GiB; a draft
 * step reads its attention, head and 8 experts; the K = 1 verification
 * touches 256 (1 - (1 - 8/256)^2) = 15.8 experts per layer. */
Test(plan_spec, mtp_module)
{
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/deepseek-v3.json --spec mtp --accept 0.8",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "draft        the multi-token-prediction module (DeepseekV3ForCausalLM): 25.08 GiB of weights"),
              "%s", out);
    cr_expect(strstr(out, "\n   1          15.8 "), "%s", out);
    cr_expect(speedup_of(out, 1) > 1, "%s", out);
}

Test(plan_spec, bad_options_are_one_line_errors)
{
    char args[1024];
#define MIX "plan --synthetic " MOERUN_SOURCE_DIR "/configs/mixtral-8x7b.json "
    tu_expect_one_line_error(MIX "--spec ngram --accept 1.5", "moerun plan: --accept '1.5' (a number x with 0 <= x < 1)");
    tu_expect_one_line_error(MIX "--spec ngram --accept 1", "moerun plan: --accept '1' (a number x with 0 <= x < 1)");
    tu_expect_one_line_error(MIX "--spec ngram --spec-tokens 0",
                             "moerun plan: --spec-tokens '0' (an integer from 1 to 16)");
    tu_expect_one_line_error(MIX "--spec ngram --spec-tokens 17",
                             "moerun plan: --spec-tokens '17' (an integer from 1 to 16)");
    tu_expect_one_line_error(MIX "--spec mtp", "moerun plan: --spec mtp: the model declares no multi-token-prediction layers");
    tu_expect_one_line_error(MIX "--accept 0.7", "moerun plan: --accept needs a proposer: --spec ngram|mtp or --draft DIR");
    tu_expect_one_line_error(MIX "--spec-tokens 4", "moerun plan: --spec-tokens needs a proposer");
    snprintf(args, sizeof args, MIX "--spec ngram --draft %s/configs/mixtral-8x7b.json", MOERUN_SOURCE_DIR);
    tu_expect_one_line_error(args, "moerun plan: --spec and --draft are two proposers: give one");
    snprintf(args, sizeof args, MIX "--draft %s/configs/bench-olmoe.json", MOERUN_SOURCE_DIR);
    tu_expect_one_line_error(args, "a vocabulary of 50304 tokens, the target's has 32000");
#undef MIX
}

/* bench verify on the OLMoe fixture (8 experts, top-2): a decode row
 * touches exactly its 2 experts per layer; K + 1 rows touch at least 2 and
 * at most min(8, 2 (K + 1)); each row's time is reported. */
Test(plan_spec, bench_verify_counts_distinct_experts)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s bench verify %s/olmoe --ctx 16 --max-k 5 --steps 3 --repeat 1 --backend cpu "
             "2>/dev/null", MOERUN_BINARY, FIXTURE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    const char *p = strstr(out, "expected\n");
    cr_assert(p, "%s", out);
    p += strlen("expected\n");
    for (int k = 0; k <= 5; k++) {
        int kk, rows;
        double ms, ratio, got, want;
        cr_assert_eq(sscanf(p, "%d %d %lf %lf %lf %lf", &kk, &rows, &ms, &ratio, &got, &want), 6, "%s", p);
        cr_expect(kk == k && rows == k + 1 && ms > 0, "%s", out);
        cr_expect(fabs(want - moe_plan_distinct_experts(8, 2, k + 1)) < 0.006, "%s", out);
        if (k == 0) cr_expect(fabs(got - 2) < 1e-9, "a decode row: its own 2 experts\n%s", out);
        cr_expect(got >= 2 - 1e-9 && got <= fmin(8, 2.0 * (k + 1)) + 1e-9, "K = %d: %g\n%s", k, got, out);
        p = strchr(p, '\n') + 1;
    }
}
