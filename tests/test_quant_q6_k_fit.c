/* test_quant_q6_k_fit.c - the block quantizers behind moe_quantize_row_q6_k
 * (runtime/core/q6_k_impl.h) make the bytes of q6_k_fit.h's q6k_block in
 * plain C, bit for bit: the portable one (SSE2 sums) and the AVX2 one
 * with 8 sub-blocks in 8 lanes, on random blocks whose sub-blocks each
 * draw a kind (Gaussian, uniform, all equal, zero, all negative, all
 * positive, one outlier, values on a grid that make ties, subnormal,
 * signed zeros, values near f16's range where d overflows and the block
 * is refused) and a scale from 1e-6 to 1e3, and on whole rows through
 * moe_quantize_row_q6_k. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/core/q4_k_impl.h"
#include "runtime/core/q6_k_fit.h"
#include "runtime/core/q6_k_impl.h"
#include "tests/testutil.h"

enum { B = MOE_Q6_K_BLOCK, KINDS = 11 };
static const char *const kind_names[KINDS] = {"Gaussian", "uniform", "equal",     "zero",         "negative",
                                              "positive", "outlier", "grid",      "subnormal",    "signed zeros",
                                              "near f16's range"};

/* Sub-block g (16 values) of kind k at scale sc. */
static void fill_sub(float *g, int k, float sc, uint64_t *st)
{
    const float c = tu_rand_uniform(st, -1.0f, 1.0f) * sc, big = tu_rand_log_uniform(st, 7.5f, 9.0f);
    for (int i = 0; i < Q6K_SUB; i++) {
        const float u = tu_rand_uniform(st, -1.0f, 1.0f);
        switch (k) {
        case 0: g[i] = tu_rand_gauss(st) * sc; break;
        case 1: g[i] = u * sc; break;
        case 2: g[i] = c; break;
        case 3: g[i] = 0.0f; break;
        case 4: g[i] = -fabsf(u) * sc - 0.5f * sc; break;
        case 5: g[i] = fabsf(u) * sc + 0.5f * sc; break;
        case 6: g[i] = i == 9 ? 40.0f * sc : tu_rand_gauss(st) * sc; break;
        case 7: g[i] = (float)((int)(u * 40.0f)) * 0.5f * sc; break;
        case 8: g[i] = u * 1e-39f; break;
        case 9: g[i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 0.0f : u * sc; break;
        default: g[i] = u * big; break;
        }
    }
}

/* Quantizes block x with the plain C q6k_block and with block; fails
 * naming the first differing byte. */
static void check_block(moe_q6_k_block_fn block, const char *name, const float *x, const char *what, int n)
{
    int8_t s0[Q6K_NSUB], s1[Q6K_NSUB];
    uint16_t d0 = 0, d1 = 0;
    uint8_t q0[B], q1[B];
    memset(s0, 0, sizeof s0), memset(s1, 0, sizeof s1), memset(q0, 0, sizeof q0), memset(q1, 0, sizeof q1);
    const bool ok0 = q6k_block(x, s0, &d0, q0), ok1 = block(x, s1, &d1, q1);
    cr_assert_eq(ok1, ok0, "%s, %s block %d: returns %d, the scalar code %d", name, what, n, ok1, ok0);
    if (!ok0) return;
    cr_assert_eq(d1, d0, "%s, %s block %d: d 0x%04x, the scalar code's 0x%04x", name, what, n, d1, d0);
    for (int j = 0; j < Q6K_NSUB; j++)
        cr_assert_eq(s1[j], s0[j], "%s, %s block %d: sub-block %d's scale %d, the scalar code's %d", name, what, n, j, s1[j],
                     s0[j]);
    for (int i = 0; i < B; i++)
        cr_assert_eq(q1[i], q0[i], "%s, %s block %d: value %d (%.9g) has code %d, the scalar code's %d", name, what, n, i,
                     x[i], q1[i], q0[i]);
}

/* Every check against one block quantizer: blocks of one kind at scales
 * 1e-6 to 1e3, and blocks whose sub-blocks draw kinds and scales. */
static void check_quantizer(moe_q6_k_block_fn block, const char *name)
{
    static const float scales[] = {1e-6f, 1e-4f, 1e-2f, 1.0f, 10.0f, 1e3f};
    uint64_t st = 2026;
    float x[B];
    int refused = 0, n = 0;
    for (int k = 0; k < KINDS; k++)
        for (int s = 0; s < 6; s++)
            for (int r = 0; r < 20; r++, n++) {
                for (int j = 0; j < Q6K_NSUB; j++) fill_sub(x + Q6K_SUB * j, k, scales[s], &st);
                check_block(block, name, x, kind_names[k], n);
            }
    for (int r = 0; r < 12000; r++, n++) {
        for (int j = 0; j < Q6K_NSUB; j++) {
            /* near f16's range in one block in 8 */
            const int k = (int)(tu_rand_u64(&st) % (KINDS - (r % 8 != 0)));
            fill_sub(x + Q6K_SUB * j, k, tu_rand_log_uniform(&st, -6.0f, 3.0f), &st);
        }
        int8_t sc[Q6K_NSUB];
        uint16_t dh;
        uint8_t q[B];
        refused += !q6k_block(x, sc, &dh, q);
        check_block(block, name, x, "mixed", n);
    }
    cr_log_info("%s: %d blocks the same bytes (%d of the mixed ones refused)", name, n, refused);
    cr_expect(refused > 100 && refused < 1500, "%s: %d mixed blocks refused, expected some but not most", name,
              refused);
}

Test(quant_q6_k_fit, portable_block_is_the_scalar_codes)
{
    check_quantizer(moe_q6_k_block_portable, "portable");
}

Test(quant_q6_k_fit, avx2_block_is_the_scalar_codes)
{
    if (!moe_q4_k_has_avx2()) cr_skip_test("the processor has no AVX2");
    check_quantizer(moe_q6_k_block_avx2, "AVX2");
}

/* moe_quantize_row_q6_k (AVX2 where the processor has it) makes the
 * portable quantizer's row. */
Test(quant_q6_k_fit, row_is_the_portable_row)
{
    enum { N = 16 * B };
    static float x[N];
    static unsigned char r0[N / B * MOE_Q6_K_BYTES], r1[N / B * MOE_Q6_K_BYTES];
    uint64_t st = 7;
    for (int i = 0; i < N; i++) x[i] = tu_rand_gauss(&st) * 0.02f;
    for (int i = 0; i < Q6K_SUB; i++) x[3 * B + i] = -0.5f;
    cr_assert(moe_quantize_row_q6_k(r1, x, N));
    cr_assert(moe_q6_k_quantize_row_with(moe_q6_k_block_portable, r0, x, N));
    cr_assert_eq(memcmp(r0, r1, sizeof r0), 0, "the rows differ");
}
