/* test_fast_act.c - the fast expert phase's activation (moe_act_row_avx2,
 * runtime/cpu/act_fast.c) against the reference's moe_experts_act: silu(g)
 * u and gpt-oss's clamped form, over g from -120 to 120 and random, the
 * special values, rows of 1 to 19 values (the masked tail), nothing
 * written past a row. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "experts/experts.h"
#include "runtime/cpu/gemm_fast.h"
#include "tests/testutil.h"

/* Within 8 ulps of the reference (exp within 2, then a sum, a quotient and
 * a product), or both below 1e-30, or the same infinity, or both NaN. */
static bool close_to(float got, float want)
{
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    return fabsf(got - want) <= 0x1p-21f * fabsf(want) || (fabsf(got) < 1e-30f && fabsf(want) < 1e-30f);
}

Test(fast_act, expert_activation_is_the_reference_within_ulps)
{
    if (moe_cpu_isa_detect() < MOE_CPU_ISA_AVX2) cr_skip_test("this processor runs no AVX2 kernel set");
    enum { N = 1400 };
    float g[N], u[N];
    uint64_t st = 5;
    int n = 0;
    for (float v = -120.0f; v < 120.0f && n < 660; v += 0.37f) g[n] = v, u[n] = tu_rand_uniform(&st, -4, 4), n++;
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 88.0f, -88.0f, 88.5f, -88.5f,
                             89.0f, -89.0f, 3.4e38f, -3.4e38f, 7.0f, -7.0f, 7.5f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        for (size_t j = 0; j < sizeof special / sizeof special[0]; j++)
            if (n < N) g[n] = special[i], u[n] = special[j], n++;
    while (n < N) g[n] = tu_rand_uniform(&st, -30, 30), u[n] = tu_rand_uniform(&st, -30, 30), n++;
    const float forms[][2] = {{1.0f, 0.0f}, {1.702f, 7.0f}};
    for (size_t f = 0; f < 2; f++) {
        const float alpha = forms[f][0], limit = forms[f][1];
        float y[N];
        memcpy(y, g, sizeof y);
        moe_act_row_avx2(y, u, N, alpha, limit);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const float want = moe_experts_act(g[i], u[i], alpha, limit);
            if (!close_to(y[i], want) && bad++ < 5)
                cr_log_error("limit %g: act(%a, %a) = %a, the reference %a", (double)limit, (double)g[i], (double)u[i],
                             (double)y[i], (double)want);
        }
        cr_expect_eq(bad, 0, "limit %g: %d values off the reference", (double)limit, bad);
        /* short rows: the tail by masks, nothing past the row */
        for (int len = 1; len < 20; len++) {
            float r[24];
            for (int i = 0; i < 24; i++) r[i] = i < len ? g[300 + i] : 12345.0f;
            moe_act_row_avx2(r, u + 300, len, alpha, limit);
            for (int i = 0; i < 24; i++)
                cr_expect(i < len ? tu_same_bits(r[i], y[300 + i]) : r[i] == 12345.0f,
                          "limit %g row of %d: value %d is %a", (double)limit, len, i, (double)r[i]);
        }
    }
}
