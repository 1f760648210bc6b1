/* test_quant_q4_k.c - the block quantizers behind moe_quantize_row_q4_k
 * (runtime/core/q4_k_impl.h) make the bytes of q4_k_fit.h's q4k_block in
 * plain C (q4k_lanes_c), bit for bit: the portable one (SSE2 lanes) and
 * the AVX2 one with a block's 8 groups in 8 lanes, on random blocks of
 * several distributions and scales, on blocks whose groups each draw an
 * awkward kind (all equal, zero, all negative, all positive, one outlier,
 * values on a grid that make ties, tiny and subnormal values, values near
 * f16's range where d or dmin overflows and the block is refused), on
 * blocks of values from 0 (where a change in the order of the error sums
 * shows most often), and on whole rows through moe_quantize_row_q4_k. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/core/q4_k_fit.h"
#include "runtime/core/q4_k_impl.h"
#include "tests/testutil.h"

enum { B = MOE_Q4_K_BLOCK };

enum { KIND_FROM_0 = 8, KINDS = 12 };
static const char *const kind_names[KINDS] = {"Gaussian", "uniform", "equal",        "zero",
                                              "negative", "positive", "outlier",      "grid",         "from 0",
                                              "subnormal", "signed zeros", "near f16's range"};

/* Group g (32 values) of kind k at scale sc. */
static void fill_group(float *g, int k, float sc, uint64_t *st)
{
    const float c = tu_rand_uniform(st, -1.0f, 1.0f) * sc, off = tu_rand_uniform(st, -2e6f, 2e6f),
                big = tu_rand_log_uniform(st, 5.5f, 7.0f);
    for (int i = 0; i < Q4K_G; i++) {
        const float u = tu_rand_uniform(st, -1.0f, 1.0f);
        switch (k) {
        case 0: g[i] = tu_rand_gauss(st) * sc; break;
        case 1: g[i] = u * sc; break;
        case 2: g[i] = c; break;
        case 3: g[i] = 0.0f; break;
        case 4: g[i] = -fabsf(u) * sc - 0.5f * sc; break;
        case 5: g[i] = fabsf(u) * sc + 0.5f * sc; break;
        case 6: g[i] = i == 17 ? 40.0f * sc : tu_rand_gauss(st) * sc; break;
        case 7: g[i] = (float)((int)(u * 8.0f)) * 0.25f * sc; break;
        case 8: g[i] = fabsf(u) * sc; break;
        case 9: g[i] = u * 1e-39f; break;
        case 10: g[i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 0.0f : u * sc; break;
        default: g[i] = u * big + off; break; /* dmin overflows past 4.1e6 */
        }
    }
}

/* Quantizes block x with the reference and with block; fails naming the
 * first differing byte. */
static void check_block(moe_q4_k_block_fn block, const char *name, const float *x, const char *what, int n)
{
    unsigned char h0[Q4K_HEAD], h1[Q4K_HEAD];
    uint8_t q0[B], q1[B];
    memset(h0, 0, sizeof h0), memset(h1, 0, sizeof h1), memset(q0, 0, sizeof q0), memset(q1, 0, sizeof q1);
    const bool ok0 = q4k_block(x, h0, q0), ok1 = block(x, h1, q1);
    cr_assert_eq(ok1, ok0, "%s, %s block %d: returns %d, the scalar code %d", name, what, n, ok1, ok0);
    if (!ok0) return;
    for (int i = 0; i < Q4K_HEAD; i++)
        cr_assert_eq(h1[i], h0[i], "%s, %s block %d: head byte %d is 0x%02x, the scalar code's 0x%02x", name, what,
                     n, i, h1[i], h0[i]);
    for (int i = 0; i < B; i++)
        cr_assert_eq(q1[i], q0[i], "%s, %s block %d: value %d (%.9g) has code %d, the scalar code's %d", name,
                     what, n, i, x[i], q1[i], q0[i]);
}

/* Every check against one block quantizer: blocks of one kind at scales
 * 1e-6 to 1e3, blocks whose groups draw kinds and scales, and blocks of
 * values from 0 at random scales. */
static void check_quantizer(moe_q4_k_block_fn block, const char *name)
{
    static const float scales[] = {1e-6f, 1e-4f, 1e-2f, 1.0f, 10.0f, 1e3f};
    uint64_t st = 2026;
    float x[B];
    int refused = 0, n = 0;
    for (int k = 0; k < KINDS; k++)
        for (int s = 0; s < 6; s++)
            for (int r = 0; r < 40; r++, n++) {
                for (int j = 0; j < Q4K_NG; j++) fill_group(x + Q4K_G * j, k, scales[s], &st);
                check_block(block, name, x, kind_names[k], n);
            }
    for (int r = 0; r < 16000; r++, n++) {
        for (int j = 0; j < Q4K_NG; j++) {
            /* near f16's range in a quarter of the blocks */
            const int k = (int)(tu_rand_u64(&st) % (KINDS - (r % 4 != 0)));
            fill_group(x + Q4K_G * j, k, tu_rand_log_uniform(&st, -6.0f, 3.0f), &st);
        }
        unsigned char h[Q4K_HEAD];
        uint8_t q[B];
        refused += !q4k_block(x, h, q);
        check_block(block, name, x, "mixed", n);
    }
    /* all groups at least 0 (dmin 0): the kind where the error sums' order
     * shows most often, about one block in 250 */
    for (int r = 0; r < 4000; r++, n++) {
        for (int j = 0; j < Q4K_NG; j++) fill_group(x + Q4K_G * j, KIND_FROM_0, tu_rand_log_uniform(&st, -6.0f, 3.0f), &st);
        check_block(block, name, x, kind_names[KIND_FROM_0], n);
    }
    cr_log_info("%s: %d blocks the same bytes (%d of the mixed ones refused)", name, n, refused);
    cr_expect(refused > 200 && refused < 4000, "%s: %d mixed blocks refused, expected some but not most", name,
              refused);
}

Test(quant_q4_k, portable_block_is_the_scalar_codes)
{
    check_quantizer(moe_q4_k_block_portable, "portable");
}

Test(quant_q4_k, avx2_block_is_the_scalar_codes)
{
    if (!moe_q4_k_has_avx2()) cr_skip_test("the processor has no AVX2");
    check_quantizer(moe_q4_k_block_avx2, "AVX2");
}

/* moe_quantize_row_q4_k (AVX2 where the processor has it) makes the
 * portable quantizer's row. */
Test(quant_q4_k, row_is_the_portable_row)
{
    enum { N = 16 * B };
    static float x[N];
    static unsigned char r0[N / B * MOE_Q4_K_BYTES], r1[N / B * MOE_Q4_K_BYTES];
    uint64_t st = 7;
    for (int i = 0; i < N; i++) x[i] = tu_rand_gauss(&st) * 0.02f;
    for (int i = 0; i < Q4K_G; i++) x[3 * B + i] = -0.5f;
    cr_assert(moe_quantize_row_q4_k(r1, x, N));
    cr_assert(moe_q4_k_quantize_row_with(moe_q4_k_block_portable, r0, x, N));
    cr_assert_eq(memcmp(r0, r1, sizeof r0), 0, "the rows differ");
}
