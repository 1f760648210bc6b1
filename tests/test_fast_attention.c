/* test_fast_attention.c - the fast CPU attention's contracts that a
 * comparison with cpu-ref (test_backend_ops.c) does not pin: a row's bits
 * do not depend on the rest of its batch (the rows of a prefill block
 * share their key loads), the 512-bit kernels give the AVX2 kernels' bits,
 * and the softmax's exponential is within 2 ulps of expf. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "runtime/backend/backend.h"
#include "runtime/cpu/gemm_fast.h"
#include "tests/testutil.h"

/* Fast paged attention over a cache of dtype dt with Hq query heads over
 * Hkv KV heads of Dh values: scrambled blocks, two sequences (41 and 3
 * rows, contexts longer than the softmax tile), a sliding window and
 * sinks when asked.  out (44, Hq, Dh) from kernel set isa; with one_row,
 * every row is also run alone (a decode step) and must give the bits it
 * has in the batch (where the rows share their key loads). */
static void run_attention(enum moe_cpu_isa isa, enum moe_dtype dt, int Hq, int Hkv, int Dh, int window, bool sinks,
                          bool one_row, float *out)
{
    enum { L = 2, B = 5, S0 = 41, S1 = 3, NB = 16 };
    struct moe_config cfg = {.n_layers = L, .n_kv_heads = Hkv, .head_dim = Dh, .n_heads = Hq};
    struct moe_backend be;
    cr_assert_eq(moe_backend_cpu_init(&be, 0), MOE_OK);
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, NB, B, dt, false), MOE_OK);
    const int S = S0 + S1;
    float *q = malloc((size_t)S * Hq * Dh * 4), *k = malloc((size_t)S * Hkv * Dh * 4),
          *v = malloc((size_t)S * Hkv * Dh * 4);
    tu_fill_uniform(q, (size_t)S * Hq * Dh, 21, -2, 2);
    tu_fill_uniform(k, (size_t)S * Hkv * Dh, 22, -2, 2);
    tu_fill_uniform(v, (size_t)S * Hkv * Dh, 23, -1, 1);
    int32_t table[2 * 9] = {9, 2, 14, 0, 7, 11, 3, 5, 13, /* seq 1: */ 1, 4, 6, 8, 10, 12, 15};
    int32_t slots[S], pos[S], seq_of[S], seq_start[3] = {0, S0, S}, ctx[2] = {S0, S1}, rows[1] = {0};
    for (int t = 0; t < S; t++) {
        int s = t < S0 ? 0 : 1, p = t < S0 ? t : t - S0;
        pos[t] = p;
        seq_of[t] = s;
        slots[t] = table[s * 9 + p / B] * B + p % B;
    }
    moe_attention_kv_store_cpu(&kv, 1, k, v, slots, S);
    struct moe_batch b = {.n_tokens = S, .n_seqs = 2, .positions = pos, .seq_of = seq_of,
                          .seq_start = seq_start, .ctx_len = ctx, .block_table = table,
                          .max_blocks = 9, .slot = slots, .logit_rows = rows};
    float *sink = malloc((size_t)Hq * 4);
    tu_fill_uniform(sink, (size_t)Hq, 24, -1, 3);
    struct moe_attn_params p = {1, Hq, Hkv, Dh, 1.0f / sqrtf(Dh), window, S0, sinks ? sink : NULL, 0, 0, 0.0f, NULL, 0};
    size_t per = moe_attention_fast_scratch(Hq / Hkv, Dh) + 64;
    float *scratch = calloc(per * 64, sizeof(float));
    moe_attention_paged_fast(isa, out, q, &kv, &b, &p, scratch, per);
    if (one_row) {
        float *one = malloc((size_t)Hq * Dh * 4);
        for (int t = 0; t < S; t++) {
            const int s = seq_of[t];
            int32_t pos1[1] = {pos[t]}, seq1[1] = {0}, start1[2] = {0, 1}, ctx1[1] = {pos[t] + 1};
            int32_t slot1[1] = {slots[t]};
            struct moe_batch b1 = {.n_tokens = 1, .n_seqs = 1, .positions = pos1, .seq_of = seq1,
                                   .seq_start = start1, .ctx_len = ctx1, .block_table = table + s * 9,
                                   .max_blocks = 9, .slot = slot1, .logit_rows = rows};
            moe_attention_paged_fast(isa, one, q + (size_t)t * Hq * Dh, &kv, &b1, &p, scratch, per);
            cr_expect(memcmp(one, out + (size_t)t * Hq * Dh, (size_t)Hq * Dh * 4) == 0,
                      "%s: row %d alone differs from the same row in the batch (%d heads over %d, window %d, "
                      "sinks %d)", moe_cpu_isa_name(isa), t, Hq, Hkv, window, sinks);
        }
        free(one);
    }
    free(q), free(k), free(v), free(sink), free(scratch);
    moe_kvcache_free(&kv);
    moe_backend_free(&be);
}

/* A decode row of fast paged attention alone (its heads then split over
 * the threads) has the bits it has in a prefill batch (blocks of rows
 * walking the keys together): G = 3 and G = 1 heads per KV head, Dh not a
 * multiple of 8, with and without a sliding window and sinks, on every
 * kernel set.  (Its agreement with the reference:
 * test_backend_ops.c.) */
Test(fast_attention, attention_row_alone_bits_equal_batch)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("no fast kernel set");
    float *out = malloc((size_t)44 * 6 * 20 * 4);
    for (int isa = MOE_CPU_ISA_AVX2; isa <= (int)best && isa <= MOE_CPU_ISA_AVX512; isa++)
        for (int c = 0; c < 4; c++)
            for (int g = 0; g < 2; g++)
                run_attention((enum moe_cpu_isa)isa, g ? MOE_DTYPE_BF16 : MOE_DTYPE_F32, g ? 4 : 6, g ? 4 : 2,
                              20, c & 1 ? 7 : 0, c & 2, true, out);
    free(out);
}

/* The AVX-512 kernels (attention_avx512.c) give the AVX2 kernels' bits:
 * every cache dtype, head widths with and without a block of 8 and a
 * tail, 1 to 6 heads per KV head, windows and sinks. */
Test(fast_attention, attention_avx512_bits_equal_avx2)
{
    if (moe_cpu_isa_detect() < MOE_CPU_ISA_AVX512) cr_skip_test("this processor runs no AVX-512 kernel set");
    const enum moe_dtype dts[] = {MOE_DTYPE_F32, MOE_DTYPE_F16, MOE_DTYPE_BF16, MOE_DTYPE_F8E4M3};
    const int Dhs[] = {20, 24, 40, 64, 72, 128}, Gs[][2] = {{4, 4}, {6, 2}, {8, 2}, {6, 1}};
    for (size_t a = 0; a < sizeof dts / sizeof *dts; a++)
        for (size_t d = 0; d < sizeof Dhs / sizeof *Dhs; d++)
            for (size_t g = 0; g < sizeof Gs / sizeof *Gs; g++) {
                const int Hq = Gs[g][0], Hkv = Gs[g][1], Dh = Dhs[d], c = (int)(a + d + g) % 4;
                const size_t n = (size_t)44 * Hq * Dh;
                float *x = malloc(n * 4), *y = malloc(n * 4);
                run_attention(MOE_CPU_ISA_AVX2, dts[a], Hq, Hkv, Dh, c & 1 ? 7 : 0, c & 2, false, x);
                run_attention(MOE_CPU_ISA_AVX512, dts[a], Hq, Hkv, Dh, c & 1 ? 7 : 0, c & 2, false, y);
                for (size_t i = 0; i < n; i++)
                    if (memcmp(x + i, y + i, 4) != 0)
                        cr_assert_fail("%s cache, %d heads over %d, Dh %d: value %zu: avx512 %.9g, avx2 %.9g",
                                       moe_dtype_name(dts[a]), Hq, Hkv, Dh, i, y[i], x[i]);
                free(x), free(y);
            }
}

/* ---- the fast attention's exponential ---- */

/* Distance in units in the last place between two positive floats. */
static int64_t ulps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

Test(fast_attention, attention_exp_within_2_ulps_of_expf)
{
    if (moe_cpu_isa_detect() == MOE_CPU_ISA_REF) cr_skip_test("no fast kernel set");
    enum { N = 200003 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = -87.0f * (float)i / (N - 1); /* the softmax's range: s - max <= 0 */
    x[1] = 0.0f;
    x[2] = -1e-30f;
    x[3] = 5.0f;
    x[4] = 88.0f;
    moe_attention_exp_avx2(y, x, N);
    int64_t worst = 0;
    for (int i = 0; i < N; i++) {
        const int64_t u = ulps(y[i], expf(x[i]));
        worst = u > worst ? u : worst;
    }
    cr_expect(worst <= 2, "the exponential is %lld ulps from expf", (long long)worst);
    const float sp[4] = {-INFINITY, -100.0f, -87.5f, NAN};
    float sy[4];
    moe_attention_exp_avx2(sy, sp, 4);
    cr_expect(sy[0] == 0.0f && sy[1] == 0.0f && sy[2] == 0.0f, "e^-inf, e^-100, e^-87.5: %g %g %g", sy[0], sy[1], sy[2]);
    cr_expect(isnan(sy[3]), "e^NaN is %g", sy[3]);
    free(x);
    free(y);
}
