/* test_expert_stacks.c - the CPU FFN over experts in the CUDA backend's
 * stacked layout (moe_experts_ffn_stacks_cpu): what an offloaded layer's
 * missed experts run when --gpu-experts-cpu-rows sends them to the CPU.
 *
 * Each case builds a layer's experts as rows (the CPU backends' layout),
 * stacks them as the CUDA backend does (gate and up rows of each expert
 * together; MXFP4 / FP8 split into planes by moe_planes_from_rows), and
 * checks that the stacked FFN of a subset of the experts, listed out of
 * order, equals the reference FFN's rows for them (moe_experts_ffn_cpu's
 * per-row results before the combine; over Q8_0 with a fast kernel set,
 * which quantizes the inputs too, moe_experts_ffn_fast's), for the reference products and
 * every fast kernel set, f32/f16/bf16 rows and MXFP4/FP8/Q8_0 planes, with and
 * without gpt-oss's biases and clamp; and that the thread count does not
 * change a bit. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "experts/experts.h"
#include "router/router.h"
#include "runtime/cpu/gemm_fast.h"
#include "tests/testutil.h"

/* n values of dtype t in row layout, rows of K (new memory): f32/f16/bf16
 * from uniform [-1, 1), MXFP4 and FP8 blocks with random codes and scales
 * near 1 (never a NaN code or scale). */
static void *random_rows(enum moe_dtype t, size_t rows, size_t K, uint64_t seed)
{
    const size_t bytes = rows * moe_dtype_row_bytes(t, K);
    unsigned char *w = malloc(bytes);
    uint64_t s = seed;
    if (t == MOE_DTYPE_MXFP4) {
        for (size_t b = 0; b < bytes; b += MOE_MXFP4_BYTES) {
            w[b] = (unsigned char)(124 + tu_rand_u64(&s) % 5); /* 2^-3 .. 2^1 */
            for (int j = 1; j < MOE_MXFP4_BYTES; j++) w[b + j] = (unsigned char)tu_rand_u64(&s);
        }
    } else if (t == MOE_DTYPE_FP8_B128) {
        for (size_t b = 0; b < bytes; b += MOE_FP8_BYTES) {
            const float sc = tu_rand_uniform(&s, 0.001f, 0.004f);
            memcpy(w + b, &sc, 4);
            for (int j = 4; j < MOE_FP8_BYTES; j++) {
                unsigned char c = (unsigned char)tu_rand_u64(&s);
                w[b + j] = (c & 0x7f) == 0x7f ? (unsigned char)(c ^ 1) : c; /* no NaN */
            }
        }
    } else {
        float *f = malloc(rows * K * sizeof(float));
        tu_fill_uniform(f, rows * K, seed, -1, 1);
        if (t == MOE_DTYPE_Q8_0) /* --quantize q8_0's rows */
            for (size_t r = 0; r < rows; r++)
                cr_assert(moe_quantize_row_q8_0(w + r * moe_dtype_row_bytes(t, K), f + r * K, K));
        else if (moe_dtype_is_q4(t)) /* Q4_1's, Q4_K's quantizers; G32 / G128: d and m as Q4_1's, widened */
            for (size_t r = 0; r < rows; r++) {
                unsigned char *row = w + r * moe_dtype_row_bytes(t, K);
                const size_t G = (size_t)moe_q4_group(t), gb = moe_q4_group_bytes(t);
                if (t == MOE_DTYPE_Q4_1 || t == MOE_DTYPE_Q4_K) {
                    cr_assert(t == MOE_DTYPE_Q4_1 ? moe_quantize_row_q4_1(row, f + r * K, K)
                                                  : moe_quantize_row_q4_k(row, f + r * K, K));
                    continue;
                }
                for (size_t g = 0; g < K / G; g++) {
                    unsigned char *b = row + g * gb;
                    const float d = tu_rand_uniform(&s, 0.05f, 0.1f), m = -tu_rand_uniform(&s, 7.0f, 8.0f) * d;
                    memcpy(b, &d, 4);
                    memcpy(b + 4, &m, 4);
                    for (size_t j = MOE_Q4_HEAD; j < gb; j++) b[j] = (unsigned char)tu_rand_u64(&s);
                }
            }
        else
            moe_convert_from_f32(w, f, t, rows * K);
        free(f);
    }
    return w;
}

static bool is_planes(enum moe_dtype t) { return moe_dtype_planes(t); }

/* Matrix i of a stack of n matrices of R rows of K, written into its place
 * (rows: consecutive; planes: values, then every matrix's scales). */
static void place(void *stack, int i, int n, const void *rows, enum moe_dtype t, size_t R, size_t K)
{
    char *s = stack;
    if (!is_planes(t)) {
        const size_t mb = R * moe_dtype_row_bytes(t, K);
        memcpy(s + (size_t)i * mb, rows, mb);
        return;
    }
    const size_t vb = moe_planes_values_bytes(t, R, K), sb = moe_planes_scales_bytes(t, R, K);
    moe_planes_from_rows(t, rows, R, K, s + (size_t)i * vb, s + (size_t)n * vb + (size_t)i * sb);
}

static void check_stacks(enum moe_cpu_isa isa, enum moe_dtype t, int T, int K, int E, int D, int F,
                         bool gpt_oss)
{
    uint64_t seed = (uint64_t)T * 131u + (uint64_t)E * 17u + (uint64_t)D * 3u + (uint64_t)F + t;
    const size_t gb = (size_t)F * moe_dtype_row_bytes(t, (size_t)D), db = (size_t)D * moe_dtype_row_bytes(t, (size_t)F);
    const void *gate[16], *up[16], *down[16];
    cr_assert(E <= 16);
    char *gu = malloc(2 * (size_t)E * gb), *dn = malloc((size_t)E * db);
    for (int e = 0; e < E; e++) {
        gate[e] = random_rows(t, (size_t)F, (size_t)D, seed + 10 * e);
        up[e] = random_rows(t, (size_t)F, (size_t)D, seed + 10 * e + 1);
        down[e] = random_rows(t, (size_t)D, (size_t)F, seed + 10 * e + 2);
        place(gu, 2 * e, 2 * E, gate[e], t, (size_t)F, (size_t)D);
        place(gu, 2 * e + 1, 2 * E, up[e], t, (size_t)F, (size_t)D);
        place(dn, e, E, down[e], t, (size_t)D, (size_t)F);
    }
    struct moe_expert_weights ex = {.dtype = t, .gate = gate, .up = up, .down = down};
    struct moe_expert_stacks st = {.dtype = t, .gu = gu, .dn = dn, .E = E, .D = D, .F = F};
    float *bias = malloc((size_t)E * (2 * F + D) * sizeof(float));
    tu_fill_uniform(bias, (size_t)E * (2 * F + D), seed + 7, -0.5f, 0.5f);
    if (gpt_oss) { /* per-expert biases, a limit crossed often */
        const struct moe_tensor b = {MOE_DTYPE_F32, 2, {E, F}, bias, -1, NULL};
        ex.b_gate = ex.b_up = ex.b_down = b;
        ex.b_up.data = bias + (size_t)E * F;
        ex.b_down.data = bias + 2 * (size_t)E * F;
        ex.b_down.shape[1] = D;
        ex.alpha = st.alpha = 1.702f;
        ex.limit = st.limit = 1.0f;
        st.b_gate = ex.b_gate, st.b_up = ex.b_up, st.b_down = ex.b_down;
    }
    /* routing: K distinct experts a row, expert E - 1 never chosen */
    const int n = T * K;
    int32_t *ids = malloc((size_t)n * sizeof(int32_t)), counts[16], offsets[17];
    int32_t *perm = malloc((size_t)n * sizeof(int32_t)), *pos = malloc((size_t)n * sizeof(int32_t));
    uint64_t s = seed;
    tu_random_routing(ids, T, K, E - 1, -1, &s);
    struct moe_dispatch plan = {counts, offsets, perm, pos, 0, 0, 0};
    moe_router_dispatch_cpu(&plan, ids, T, K, E);
    float *x = malloc((size_t)T * D * sizeof(float)), *w = malloc((size_t)n * sizeof(float));
    tu_fill_uniform(x, (size_t)T * D, seed + 99, -1, 1);
    for (int i = 0; i < n; i++) w[i] = 1.0f;
    struct moe_expert_ws ws = {malloc((size_t)n * D * 4), malloc((size_t)n * F * 4), malloc((size_t)n * F * 4),
                               malloc((size_t)n * D * 4)};
    float *out = malloc((size_t)T * D * sizeof(float));
    float *scratch = malloc((size_t)(D > F ? D : F) * 64 * sizeof(float));
    int32_t active[16];
    if ((t == MOE_DTYPE_Q8_0 || moe_dtype_is_q4(t)) && isa != MOE_CPU_ISA_REF) /* the fast kernels quantize
                                                        * the inputs (gemm_q8.c, gemm_q4.c): the fast FFN over rows */
        moe_experts_ffn_fast(isa, out, x, &plan, w, &ex, &ws, T, K, D, F, E, active);
    else
        moe_experts_ffn_cpu(out, x, &plan, w, &ex, &ws, T, K, D, F, E, scratch);
    /* the list: every other expert from the top down, E - 1 (no rows) included */
    int32_t list[16];
    int nl = 0, rows = 0;
    for (int e = E - 1; e >= 0; e -= 2) list[nl++] = e, rows += counts[e];
    cr_assert(rows > 0);
    /* their rows gathered in list order (the CUDA backend gathers on the device) */
    float *xe = malloc((size_t)rows * D * sizeof(float));
    for (int i = 0, r = 0; i < nl; i++)
        for (int j = 0; j < counts[list[i]]; j++, r++)
            memcpy(xe + (size_t)r * D, x + (size_t)(perm[offsets[list[i]] + j] / K) * D, (size_t)D * sizeof(float));
    float *y1 = malloc((size_t)rows * D * sizeof(float)), *y3 = malloc((size_t)rows * D * sizeof(float));
    const size_t sb1 = moe_experts_stacks_scratch_bytes(&st, rows, 1), sb3 = moe_experts_stacks_scratch_bytes(&st, rows, 3);
    cr_assert(sb1 > 0 && sb3 > sb1);
    void *s1 = malloc(sb1), *s3 = malloc(sb3);
    char what[160];
    snprintf(what, sizeof what, "stacks %s %s%s T=%d K=%d E=%d D=%d F=%d", isa == MOE_CPU_ISA_REF ? "ref" : moe_cpu_isa_name(isa),
             moe_dtype_name(t), gpt_oss ? " gpt-oss" : "", T, K, E, D, F);
    for (int down_bias = gpt_oss; down_bias >= 0; down_bias--) {
        moe_experts_ffn_stacks_cpu(isa, y1, xe, counts, list, nl, &st, down_bias, 1, s1);
        moe_experts_ffn_stacks_cpu(isa, y3, xe, counts, list, nl, &st, down_bias, 3, s3);
        cr_expect(memcmp(y1, y3, (size_t)rows * D * sizeof(float)) == 0, "%s: 3 threads differ from 1", what);
        for (int i = 0, r = 0; i < nl; i++)
            for (int j = 0; j < counts[list[i]]; j++, r++) {
                float *ref = ws.ye + (size_t)(offsets[list[i]] + j) * D;
                if (gpt_oss && !down_bias) /* the reference row less its bias */
                    for (int d = 0; d < D; d++) ref[d] -= bias[2 * (size_t)E * F + (size_t)list[i] * D + d];
                char at[200];
                snprintf(at, sizeof at, "%s%s expert %d row %d", what, down_bias ? "" : " (no down bias)", list[i], j);
                cr_expect(tu_allclose(at, y1 + (size_t)r * D, ref, (size_t)D, 2e-5f * (float)(D + F), 1e-4f), "%s", at);
            }
    }
    for (int e = 0; e < E; e++) free((void *)gate[e]), free((void *)up[e]), free((void *)down[e]);
    free(gu), free(dn), free(bias), free(ids), free(perm), free(pos), free(x), free(w);
    free(ws.xe), free(ws.g), free(ws.u), free(ws.ye), free(out), free(scratch);
    free(y1), free(y3), free(s1), free(s3), free(xe);
}

/* The reference products and every fast kernel set this processor runs. */
static int isas(enum moe_cpu_isa *out)
{
    int n = 0;
    out[n++] = MOE_CPU_ISA_REF;
    for (int i = MOE_CPU_ISA_AVX2; i <= (int)moe_cpu_isa_detect(); i++) out[n++] = (enum moe_cpu_isa)i;
    return n;
}

Test(expert_stacks, rows_match_the_reference_ffn)
{
    enum moe_cpu_isa is[8];
    const int ni = isas(is);
    const enum moe_dtype rows[] = {MOE_DTYPE_F32, MOE_DTYPE_F16, MOE_DTYPE_BF16};
    for (int i = 0; i < ni; i++)
        for (int d = 0; d < 3; d++) {
            check_stacks(is[i], rows[d], 1, 2, 8, 37, 21, false);  /* decode: a row an expert */
            check_stacks(is[i], rows[d], 9, 3, 7, 40, 50, false);  /* several rows, slices cut short */
            check_stacks(is[i], rows[d], 6, 2, 5, 64, 32, true);
        }
}

/* MXFP4, FP8, Q8_0 and four-bit planes joined back into rows 16 at a time: F
 * and D longer than one join, so joins start mid-slice. */
Test(expert_stacks, planes_match_the_reference_ffn)
{
    enum moe_cpu_isa is[8];
    const int ni = isas(is);
    for (int i = 0; i < ni; i++) {
        check_stacks(is[i], MOE_DTYPE_MXFP4, 1, 2, 6, 64, 96, false);
        check_stacks(is[i], MOE_DTYPE_MXFP4, 7, 2, 5, 96, 64, true);
        check_stacks(is[i], MOE_DTYPE_FP8_B128, 1, 2, 6, 128, 256, false);
        check_stacks(is[i], MOE_DTYPE_FP8_B128, 5, 3, 7, 256, 128, true);
        check_stacks(is[i], MOE_DTYPE_Q8_0, 2, 2, 6, 64, 96, false);
        check_stacks(is[i], MOE_DTYPE_Q8_0, 6, 3, 5, 96, 160, true);
        check_stacks(is[i], MOE_DTYPE_Q4_1, 2, 2, 6, 64, 96, false);
        check_stacks(is[i], MOE_DTYPE_Q4_G32, 6, 3, 5, 96, 160, true);
        check_stacks(is[i], MOE_DTYPE_Q4_G128, 3, 2, 5, 128, 256, false);
        check_stacks(is[i], MOE_DTYPE_Q4_K, 3, 2, 5, 256, 512, true); /* the CUDA offload's CPU misses */
    }
}

/* The scratch size refuses shapes whose bytes overflow. */
Test(expert_stacks, scratch_size_overflow_is_zero)
{
    struct moe_expert_stacks st = {.dtype = MOE_DTYPE_BF16, .E = 8, .D = 1 << 30, .F = 1 << 30};
    cr_expect_eq(moe_experts_stacks_scratch_bytes(&st, INT32_MAX, 4), 0);
    st.D = st.F = 64;
    cr_expect_gt(moe_experts_stacks_scratch_bytes(&st, 4, 2), 0);
    cr_expect_eq(moe_experts_stacks_scratch_bytes(&st, -1, 2), 0);
    cr_expect_eq(moe_experts_stacks_scratch_bytes(&st, 4, 0), 0);
}
