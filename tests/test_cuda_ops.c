/* test_cuda_ops.c - the CUDA backend's routing, dispatch, argmax, expert
 * and load-counter ops against the CPU reference, on the paths and
 * policies tests/test_backend_ops.c (every op of every backend table on
 * awkward shapes) does not single out: ties and NaN, the reserved sort
 * space, the decode and grouped expert paths, the tensor-core experts.
 *
 * Seeded random inputs (never all zeros); device outputs start poisoned (all bytes 0xff, NaN as floats)
 * so an element a kernel forgets shows up.  Each check prints one line
 * "parity: OP DTYPE SHAPE max rel err E" (max |gpu - cpu| / max |cpu|),
 * which tests/gpu/run.sh collects.  Expert ids must be identical: the
 * router is fed the same logits on both sides, and the GPU ranks logits with
 * the CPU's comparator.  (Through the whole model the router's logits come
 * from different GEMMs, so ids may differ at near-ties there; see
 * test_cuda_forward.c.)
 *
 * Without a device every test skips: the suite's .init asks the CUDA
 * runtime, in the forked test process, never in Criterion's parent. */
#include "tests/cuda_test.h"

TestSuite(cuda_ops, .init = setup, .fini = teardown);

Test(cuda_ops, argmax_matches_moe_argmax)
{
    const int rows = 6, n = 5000;
    float *x = rand_floats((size_t)rows * n, 41, -5, 5);
    x[1 * n + 10] = x[1 * n + 20] = 9.0f;          /* tie: lower index */
    for (int i = 0; i < n; i++) x[2 * n + i] = NAN; /* all NaN: index 0 */
    x[3 * n + 0] = NAN;
    x[3 * n + 4999] = 7.0f;                         /* NaN never wins */
    int32_t *ids = dev_poisoned(rows * sizeof(int32_t)), got[6];
    float *dx = dev_copy(x, (size_t)rows * n * sizeof(float));
    cr_assert_eq(gpu.ops->argmax(&gpu, ids, dx, rows, n), MOE_OK);
    to_host(got, ids, sizeof got);
    for (int r = 0; r < rows; r++)
        cr_expect_eq(got[r], moe_argmax(x + (size_t)r * n, n), "row %d: %d vs %d", r, got[r],
                     moe_argmax(x + (size_t)r * n, n));
    gpu.ops->dealloc(&gpu, ids);
    gpu.ops->dealloc(&gpu, dx);
    free(x);
}

Test(cuda_ops, sigmoid_route_matches_cpu)
{
    /* T, E, K, n_group, topk_group */
    const int shapes[][5] = {{1, 8, 2, 1, 1}, {9, 64, 6, 8, 3}, {300, 128, 8, 1, 1},
                             {33, 256, 8, 8, 4}, {5, 192, 6, 64, 32}, {17, 16, 4, 4, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], E = shapes[s][1], K = shapes[s][2];
        const size_t TE = (size_t)T * E, TK = (size_t)T * K;
        float *lg = rand_floats(TE, 71 + s, -4, 4), *bias = rand_floats((size_t)E, 81 + s, -0.5f, 0.5f);
        for (int t = 0; t < T; t++) {
            float *r = lg + (size_t)t * E;
            if (t % 3 == 0) r[E - 1] = r[0] = r[E / 2] = 3.0f;
            if (t % 4 == 1) r[1] = NAN;
            if (t % 5 == 2) r[E - 2] = INFINITY;
        }
        if (s % 2) bias[E / 2] = bias[0] = bias[E - 1] = 0.25f; /* equal choice scores too */
        float *dbias = dev_copy(bias, (size_t)E * sizeof(float));
        for (int renorm = 0; renorm < 2; renorm++) {
            struct moe_route hr = {E, K, renorm, true, bias, shapes[s][3], shapes[s][4], 2.5f, false};
            struct moe_route dr = hr;
            dr.bias = dbias;
            int32_t *ids = malloc(TK * sizeof(int32_t)), *gids = malloc(TK * sizeof(int32_t));
            float *w = malloc(TK * sizeof(float)), *gw = malloc(TK * sizeof(float));
            cr_assert_eq(cpu.ops->route(&cpu, ids, w, lg, T, &hr), MOE_OK);
            float *dl = dev_copy(lg, TE * sizeof(float));
            int32_t *dids = dev_poisoned(TK * sizeof(int32_t));
            float *dw = dev_poisoned(TK * sizeof(float));
            cr_assert_eq(gpu.ops->route(&gpu, dids, dw, dl, T, &dr), MOE_OK, "%s", moe_last_error());
            to_host(gids, dids, TK * sizeof(int32_t));
            to_host(gw, dw, TK * sizeof(float));
            char shp[64];
            snprintf(shp, sizeof shp, "T%d E%d K%d G%d/%d%s", T, E, K, shapes[s][3], shapes[s][4],
                     renorm ? " renorm" : "");
            for (size_t i = 0; i < TK; i++) {
                cr_expect_eq(gids[i], ids[i], "%s: id %zu gpu %d cpu %d", shp, i, gids[i], ids[i]);
                if (isnan(w[i])) {
                    cr_expect(isnan(gw[i]), "%s: weight %zu", shp, i);
                    w[i] = gw[i] = 0.0f;
                }
            }
            double e = report("route_sigmoid", "F32", shp, gw, w, TK);
            cr_expect(e <= 1e-5, "route_sigmoid %s: %.3g", shp, e);
            gpu.ops->dealloc(&gpu, dl);
            gpu.ops->dealloc(&gpu, dids);
            gpu.ops->dealloc(&gpu, dw);
            free(ids);
            free(gids);
            free(w);
            free(gw);
        }
        gpu.ops->dealloc(&gpu, dbias);
        free(lg);
        free(bias);
    }
}

/* DeepSeek-V2's group_limited_greedy softmax router: only the topk_group
 * groups whose best logit ranks highest are eligible; never renormalised
 * in V2 (renorm tested too), times routed_scaling_factor (0 and 1: none).
 * Ties, NaN, infinities, and a group of NaNs only (ranked last). */
Test(cuda_ops, group_limited_softmax_route_matches_cpu)
{
    /* T, E, K, n_group, topk_group, scale x 10 */
    const int shapes[][6] = {{1, 160, 6, 8, 3, 160}, {9, 64, 6, 8, 3, 15}, {70, 160, 6, 8, 3, 10},
                             {17, 64, 6, 64, 10, 25}, {5, 16, 4, 4, 2, 0}, {33, 256, 8, 8, 4, 25}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], E = shapes[s][1], K = shapes[s][2], G = shapes[s][3];
        const size_t TE = (size_t)T * E, TK = (size_t)T * K;
        float *lg = rand_floats(TE, 91 + s, -4, 4);
        for (int t = 0; t < T; t++) {
            float *r = lg + (size_t)t * E;
            if (t % 3 == 0) r[E - 1] = r[0] = r[E / 2] = 3.0f; /* ties across groups */
            if (t % 4 == 1) r[1] = NAN;
            if (t % 5 == 2) r[E - 2] = INFINITY;
            if (t % 7 == 3)
                for (int e = E / G; e < 2 * (E / G); e++) r[e] = NAN; /* group 1 all NaN */
        }
        float *dl = dev_copy(lg, TE * sizeof(float));
        for (int renorm = 0; renorm < 2; renorm++) {
            const struct moe_route rt = {E, K, renorm, false, NULL, G, shapes[s][4], shapes[s][5] / 10.0f, false};
            int32_t *ids = malloc(TK * sizeof(int32_t)), *gids = malloc(TK * sizeof(int32_t));
            float *w = malloc(TK * sizeof(float)), *gw = malloc(TK * sizeof(float));
            cr_assert_eq(cpu.ops->route(&cpu, ids, w, lg, T, &rt), MOE_OK);
            int32_t *dids = dev_poisoned(TK * sizeof(int32_t));
            float *dw = dev_poisoned(TK * sizeof(float));
            cr_assert_eq(gpu.ops->route(&gpu, dids, dw, dl, T, &rt), MOE_OK, "%s", moe_last_error());
            to_host(gids, dids, TK * sizeof(int32_t));
            to_host(gw, dw, TK * sizeof(float));
            char shp[64];
            snprintf(shp, sizeof shp, "T%d E%d K%d G%d/%d%s x%.1f", T, E, K, G, shapes[s][4],
                     renorm ? " renorm" : "", rt.scale);
            int differ = 0;
            for (size_t i = 0; i < TK; i++) {
                differ += gids[i] != ids[i];
                cr_expect_eq(gids[i], ids[i], "%s: id %zu gpu %d cpu %d", shp, i, gids[i], ids[i]);
                if (isnan(w[i])) { /* rows with +inf logits: NaN on both sides */
                    cr_expect(isnan(gw[i]), "%s: weight %zu", shp, i);
                    w[i] = gw[i] = 0.0f;
                }
            }
            fprintf(stderr, "parity: %-12s %-5s %-22s %s\n", "route_group", "I32", shp,
                    differ ? "DIFFERS" : "identical");
            double e = report("route_group", "F32", shp, gw, w, TK);
            cr_expect(e <= 1e-6, "route_group %s: %.3g", shp, e);
            gpu.ops->dealloc(&gpu, dids);
            gpu.ops->dealloc(&gpu, dw);
            free(ids), free(gids), free(w), free(gw);
        }
        gpu.ops->dealloc(&gpu, dl);
        free(lg);
    }
}

Test(cuda_ops, route_and_dispatch_match_cpu)
{
    const int shapes[][3] = {{1, 8, 2}, {5, 60, 4}, {300, 128, 8}, {64, 8, 1}, {17, 64, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], E = shapes[s][1], K = shapes[s][2];
        const size_t TE = (size_t)T * E, TK = (size_t)T * K;
        float *lg = rand_floats(TE, 51 + s, -3, 3);
        /* ties (to the lower index), NaN and infinities */
        for (int t = 0; t < T; t++) {
            float *r = lg + (size_t)t * E;
            if (t % 3 == 0) r[E - 1] = r[0] = r[E / 2] = 5.0f;
            if (t % 4 == 1) r[1] = NAN;
            if (t % 5 == 2) r[E - 2] = INFINITY;
            if (t % 7 == 3) r[2] = -INFINITY;
        }
        for (int renorm = 0; renorm < 2; renorm++) {
            int32_t *ids = malloc(TK * sizeof(int32_t)), *gids = malloc(TK * sizeof(int32_t));
            float *w = malloc(TK * sizeof(float)), *gw = malloc(TK * sizeof(float));
            const struct moe_route rt = {E, K, renorm, false, NULL, 1, 1, 1.0f, false};
            cr_assert_eq(cpu.ops->route(&cpu, ids, w, lg, T, &rt), MOE_OK);
            float *dl = dev_copy(lg, TE * sizeof(float));
            int32_t *dids = dev_poisoned(TK * sizeof(int32_t));
            float *dw = dev_poisoned(TK * sizeof(float));
            cr_assert_eq(gpu.ops->route(&gpu, dids, dw, dl, T, &rt), MOE_OK, "%s",
                         moe_last_error());
            to_host(gids, dids, TK * sizeof(int32_t));
            to_host(gw, dw, TK * sizeof(float));
            for (size_t i = 0; i < TK; i++)
                cr_expect_eq(gids[i], ids[i], "T%d E%d K%d: id %zu gpu %d cpu %d", T, E, K, i,
                             gids[i], ids[i]);
            char shp[64];
            snprintf(shp, sizeof shp, "T%d E%d K%d%s", T, E, K, renorm ? " renorm" : "");
            /* rows with +inf logits give NaN weights on both sides: compare
             * the finite ones */
            for (size_t i = 0; i < TK; i++)
                if (isnan(w[i])) {
                    cr_expect(isnan(gw[i]), "%s: weight %zu", shp, i);
                    w[i] = gw[i] = 0.0f;
                }
            double e = report("route", "F32", shp, gw, w, TK);
            cr_expect(e <= 1e-5, "route %s: %.3g", shp, e);

            /* dispatch of the same ids */
            struct moe_dispatch hp, dp;
            int32_t *hbuf = malloc((2 * (size_t)E + 1 + 2 * TK) * sizeof(int32_t));
            hp.counts = hbuf;
            hp.offsets = hbuf + E;
            hp.perm = hbuf + 2 * E + 1;
            hp.pos = hp.perm + TK;
            cr_assert_eq(cpu.ops->dispatch(&cpu, &hp, ids, T, K, E), MOE_OK);
            int32_t *dbuf = dev_poisoned((2 * (size_t)E + 1 + 2 * TK) * sizeof(int32_t));
            dp.counts = dbuf;
            dp.offsets = dbuf + E;
            dp.perm = dbuf + 2 * E + 1;
            dp.pos = dp.perm + TK;
            cr_assert_eq(gpu.ops->dispatch(&gpu, &dp, dids, T, K, E), MOE_OK, "%s", moe_last_error());
            int32_t *gbuf = malloc((2 * (size_t)E + 1 + 2 * TK) * sizeof(int32_t));
            to_host(gbuf, dbuf, (2 * (size_t)E + 1 + 2 * TK) * sizeof(int32_t));
            cr_expect(memcmp(gbuf, hbuf, (2 * (size_t)E + 1 + 2 * TK) * sizeof(int32_t)) == 0,
                      "dispatch %s: plan differs from the CPU's", shp);
            fprintf(stderr, "parity: %-12s %-5s %-22s %s\n", "dispatch", "I32", shp,
                    memcmp(gbuf, hbuf, (2 * (size_t)E + 1 + 2 * TK) * sizeof(int32_t)) ? "DIFFERS"
                                                                                        : "identical");
            gpu.ops->dealloc(&gpu, dl);
            gpu.ops->dealloc(&gpu, dids);
            gpu.ops->dealloc(&gpu, dw);
            gpu.ops->dealloc(&gpu, dbuf);
            free(hbuf);
            free(gbuf);
            free(ids);
            free(gids);
            free(w);
            free(gw);
        }
        free(lg);
    }
}

/* The sort space is sized once, at reserve (512 rows x 8 over 128
 * experts here): a dispatch past it fails with a message, and the next
 * one that fits still works. */
Test(cuda_ops, dispatch_past_the_reserved_sort_space_fails)
{
    const int T = 513, K = 8, E = 128;
    const size_t TK = (size_t)T * K;
    int32_t *ids = malloc(TK * sizeof(int32_t));
    for (size_t i = 0; i < TK; i++) ids[i] = (int32_t)(i * 7 % E);
    int32_t *dids = dev_copy(ids, TK * sizeof(int32_t));
    int32_t *dbuf = dev_poisoned((2 * (size_t)E + 3 + 2 * TK) * sizeof(int32_t));
    struct moe_dispatch dp = {dbuf, dbuf + E + 1, dbuf + 2 * E + 3, dbuf + 2 * E + 3 + TK, 0, 0, 0};
    cr_expect_eq(gpu.ops->dispatch(&gpu, &dp, dids, T, K, E), MOE_ERR_INVALID_ARG);
    cr_expect(strstr(moe_last_error(), "exceed") != NULL, "%s", moe_last_error());
    cr_expect_eq(gpu.ops->dispatch(&gpu, &dp, dids, 4, K, E + 1), MOE_ERR_INVALID_ARG);
    cr_expect_eq(gpu.ops->dispatch(&gpu, &dp, dids, T - 1, K, E), MOE_OK, "%s", moe_last_error());
    gpu.ops->dealloc(&gpu, dids);
    gpu.ops->dealloc(&gpu, dbuf);
    free(ids);
}

/* ---- experts ---- */

/* Set by the cuda_experts_mma suite (MOERUN_CUDA_EXPERTS=mma). */
static bool mma_backend;

/* The backend's rule for the tensor-core expert kernels (backend_cuda_experts.c). */
static bool expects_mma(enum moe_dtype dt, int T, int E, int K, int D, int F)
{
    return mma_backend && dt != MOE_DTYPE_F32 && D % 8 == 0 && F % 8 == 0 && T > 1 &&
           (T > 32 || T * K >= 4 * E);
}

static void check_experts_full(enum moe_dtype dt, int T, int E, int K, int D, int F, bool gpt_oss)
{
    const size_t es = moe_dtype_size(dt), mat = (size_t)F * D;
    /* stacked host weights (E, 2F, D) and (E, D, F) */
    float *fgu = rand_floats(2 * mat * E, 61, -0.1f, 0.1f), *fdn = rand_floats(mat * E, 62, -0.1f, 0.1f);
    char *hgu = malloc(2 * mat * E * es), *hdn = malloc(mat * E * es);
    moe_convert_from_f32(hgu, fgu, dt, 2 * mat * E);
    moe_convert_from_f32(hdn, fdn, dt, mat * E);
    char *dgu = dev_copy(hgu, 2 * mat * E * es), *ddn = dev_copy(hdn, mat * E * es);
    const void *hg[E], *hu[E], *hd[E], *dg[E], *du[E], *dd[E];
    for (int e = 0; e < E; e++) {
        hg[e] = hgu + 2 * mat * e * es, hu[e] = hgu + (2 * mat * e + mat) * es, hd[e] = hdn + mat * e * es;
        dg[e] = dgu + 2 * mat * e * es, du[e] = dgu + (2 * mat * e + mat) * es, dd[e] = ddn + mat * e * es;
    }
    struct moe_expert_weights hx = {.dtype = dt, .gate = hg, .up = hu, .down = hd}, dx = hx;
    dx.gate = dg, dx.up = du, dx.down = dd;
    /* gpt-oss: biases, and a limit the values cross often */
    float *bias = NULL, *dbias = NULL;
    if (gpt_oss) gpt_oss_biases(&hx, &dx, E, D, F, 0.3f, &bias, &dbias); /* a limit values cross often */
    char shp[64];
    snprintf(shp, sizeof shp, "T%d E%d K%d D%d F%d%s", T, E, K, D, F, gpt_oss ? " gpt-oss" : "");
    /* the grouped path (cuBLAS, or the tensor-core kernels) rounds
     * activations to the weights' half type; the decode path keeps them in
     * fp32 like the CPU, so only the summation order differs there */
    const bool mma = expects_mma(dt, T, E, K, D, F);
    const bool grouped = mma || (T > 32 && dt != MOE_DTYPE_F32);
    const int64_t calls = moe_cuda_mma_expert_calls(&gpu);
    const double e = experts_parity(&hx, &dx, T, E, K, D, F,
                                    mma ? "experts_mma" : grouped ? "experts_grp" : "experts_dec", shp);
    cr_expect_eq(moe_cuda_mma_expert_calls(&gpu) - calls, mma ? 1 : 0, "experts %s %s: %s the tensor-core "
                 "kernels", moe_dtype_name(dt), shp, mma ? "not on" : "on");
    cr_expect(e <= (grouped ? 3e-2 : dt == MOE_DTYPE_F32 ? 1e-5 : 1e-4), "experts %s %s: %.3g",
              moe_dtype_name(dt), shp, e);
    void *dbufs[] = {dgu, ddn, dbias};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) gpu.ops->dealloc(&gpu, dbufs[i]);
    free(fgu), free(fdn), free(hgu), free(hdn), free(bias);
}

static void check_experts(enum moe_dtype dt, int T, int E, int K, int D, int F)
{
    check_experts_full(dt, T, E, K, D, F, false);
}

/* gpt-oss: per-expert biases and the clamped activation, on both paths */
Test(cuda_ops, experts_biases_and_clamped_activation_match_cpu)
{
    for (size_t di = 0; di < 3; di++) {
        check_experts_full(wdts[di], 1, 8, 2, 64, 96, true);
        check_experts_full(wdts[di], 32, 64, 8, 128, 64, true);
    }
    check_experts_full(MOE_DTYPE_BF16, 300, 32, 4, 128, 64, true); /* grouped */
}

Test(cuda_ops, experts_decode_path_matches_cpu)
{
    for (size_t di = 0; di < 3; di++) {
        check_experts(wdts[di], 1, 8, 2, 64, 96);
        check_experts(wdts[di], 4, 8, 2, 256, 128);
        check_experts(wdts[di], 32, 64, 8, 128, 64);
        check_experts(wdts[di], 3, 4, 2, 60, 36); /* not multiples of 8: scalar loads */
        check_experts(wdts[di], 5, 4, 2, 61, 36); /* odd D: the down kernel's last pair */
        /* ~16 rows per expert: several row tiles; 17 warps of output pairs */
        check_experts(wdts[di], 32, 4, 2, 136, 72);
    }
}

Test(cuda_ops, experts_grouped_path_matches_cpu)
{
    check_experts(MOE_DTYPE_BF16, 64, 8, 2, 256, 128);
    check_experts(MOE_DTYPE_BF16, 300, 64, 8, 128, 64);
    check_experts(MOE_DTYPE_F16, 100, 16, 4, 128, 96);
    check_experts(MOE_DTYPE_F32, 100, 16, 4, 128, 96); /* fp32 weights: decode kernels */
}

/* Both paths at small shapes, quick enough for the host emulation's CI
 * selection (tools/cuda-emu/ci-tests.txt): decode kernels for bf16 and
 * fp32 (scalar loads), the grouped path for bf16 with gpt-oss's biases. */
Test(cuda_ops, experts_small_shapes_match_cpu)
{
    check_experts(MOE_DTYPE_BF16, 1, 8, 2, 64, 96);
    check_experts(MOE_DTYPE_F32, 3, 4, 2, 60, 36);
    check_experts(MOE_DTYPE_BF16, 40, 4, 2, 64, 96);
    check_experts_full(MOE_DTYPE_BF16, 40, 4, 2, 64, 32, true);
}

/* MOERUN_CUDA_EXPERTS=mma: steps of many rows, and decode-sized steps of
 * 4 rows an expert or more, take the tensor-core kernels
 * (experts/experts_mma_cuda.cu); the variable is set in the forked test
 * process before the backend opens. */
static void setup_mma(void)
{
    setenv("MOERUN_CUDA_EXPERTS", "mma", 1);
    mma_backend = true;
    setup();
}

TestSuite(cuda_experts_mma, .init = setup_mma, .fini = teardown);

Test(cuda_experts_mma, tensor_core_experts_match_cpu)
{
    for (size_t di = 1; di < 3; di++) { /* bf16, f16 */
        check_experts(wdts[di], 64, 8, 2, 256, 128);  /* 16 rows an expert */
        check_experts(wdts[di], 300, 64, 8, 128, 64); /* 37 rows an expert on average */
        check_experts(wdts[di], 200, 4, 2, 64, 96);   /* 100 rows an expert: two row tiles */
        /* decode-sized, 4 rows an expert; D = 136: a half stage, 2F = 144
         * and D: output tiles cut short */
        check_experts(wdts[di], 16, 8, 2, 136, 72);
    }
    check_experts_full(MOE_DTYPE_BF16, 300, 32, 4, 128, 64, true); /* gpt-oss's biases */
    check_experts(MOE_DTYPE_BF16, 100, 4, 2, 60, 36); /* D % 8: cuBLAS */
    check_experts(MOE_DTYPE_BF16, 4, 8, 2, 64, 96);   /* 1 row an expert: decode kernels */
    check_experts(MOE_DTYPE_F32, 100, 16, 4, 128, 96); /* fp32 weights: decode kernels */
}

/* The tensor-core kernels at small shapes (the CI selection): a prefill
 * of 10 rows an expert, decode-sized f16 with tiles cut short (D = 136),
 * gpt-oss's biases. */
Test(cuda_experts_mma, tensor_core_experts_small_shapes_match_cpu)
{
    check_experts(MOE_DTYPE_BF16, 40, 4, 1, 64, 96);
    check_experts(MOE_DTYPE_F16, 16, 8, 2, 136, 72);
    check_experts_full(MOE_DTYPE_BF16, 40, 4, 1, 64, 32, true);
}

/* Expert load counters: one row per MoE layer (dispatch calls in order),
 * accumulated on the device, read back on demand. */
Test(cuda_ops, expert_load_counts_dispatches_by_layer)
{
    const int T = 6, K = 2, E = 128;
    int32_t ids[12] = {0, 5, 5, 7, 127, 0, 3, 5, 0, 1, 2, 5};
    int32_t *dids = dev_copy(ids, sizeof ids);
    int32_t *dbuf = dev_poisoned((2 * (size_t)E + 1 + 2 * T * K) * sizeof(int32_t));
    struct moe_dispatch dp = {dbuf, dbuf + E, dbuf + 2 * E + 1, dbuf + 2 * E + 1 + T * K, 0, 0, 0};
    /* layer 0 twice (two steps), layer 1 once */
    for (int step = 0; step < 2; step++) {
        cr_assert_eq(gpu.ops->dispatch(&gpu, &dp, dids, T, K, E), MOE_OK, "%s", moe_last_error());
        if (step == 0) cr_assert_eq(gpu.ops->dispatch(&gpu, &dp, dids, 3, K, E), MOE_OK);
        /* a new step starts at embed; any embedding will do */
        float *x = dev_poisoned(4 * sizeof(float));
        int32_t tok = 0;
        int32_t *dtok = dev_copy(&tok, sizeof tok);
        struct wpair e = make_weight(MOE_DTYPE_F32, 1, 4, 1, 1.0f);
        cr_assert_eq(gpu.ops->embed(&gpu, x, dtok, 1, &e.d, 0), MOE_OK);
        free_weight(&e);
        gpu.ops->dealloc(&gpu, x);
        gpu.ops->dealloc(&gpu, dtok);
    }
    uint64_t load[2 * 128];
    cr_assert_eq(gpu.ops->expert_load(&gpu, load, 2, E), MOE_OK, "%s", moe_last_error());
    uint64_t want0[128] = {0}, want1[128] = {0};
    for (int i = 0; i < T * K; i++) want0[ids[i]] += 2;
    for (int i = 0; i < 3 * K; i++) want1[ids[i]] += 1;
    cr_expect(memcmp(load, want0, sizeof want0) == 0, "layer 0 counters");
    cr_expect(memcmp(load + E, want1, sizeof want1) == 0, "layer 1 counters");
    gpu.ops->dealloc(&gpu, dids);
    gpu.ops->dealloc(&gpu, dbuf);
}
