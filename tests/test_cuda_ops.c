/* test_cuda_ops.c - every CUDA backend op against the CPU reference op.
 *
 * Seeded random inputs (never all zeros), several shapes, every weight and
 * KV dtype; device outputs start poisoned (all bytes 0xff, NaN as floats)
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

Test(cuda_ops, matmul_matches_cpu)
{
    const int shapes[][3] = {{1, 64, 64}, {7, 96, 200}, {33, 256, 512}, {300, 130, 1000}};
    for (size_t di = 0; di < 3; di++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const enum moe_dtype dt = wdts[di];
            const int T = shapes[s][0], N = shapes[s][1], Din = shapes[s][2];
            struct wpair w = make_weight(dt, N, Din, 100 + s, 0.1f);
            struct wpair b = make_weight(dt, N, 0, 200 + s, 0.5f);
            float *x = rand_floats((size_t)T * Din, 300 + s, -1, 1);
            float *ref = malloc((size_t)T * N * sizeof(float)), *got = malloc((size_t)T * N * sizeof(float));
            /* the CPU op sizes its scratch in prepare_model: call the GEMM directly */
            float *sc = malloc((size_t)Din * omp_get_max_threads() * sizeof(float));
            moe_gemm_cpu(ref, N, x, Din, w.h.data, dt, N, Din, T, s % 2 ? &b.h : NULL, sc);
            float *dx = dev_copy(x, (size_t)T * Din * sizeof(float));
            float *dy = dev_poisoned((size_t)T * N * sizeof(float));
            cr_assert_eq(gpu.ops->matmul(&gpu, dy, dx, &w.d, s % 2 ? &b.d : NULL, T), MOE_OK, "%s",
                         moe_last_error());
            to_host(got, dy, (size_t)T * N * sizeof(float));
            char shp[64];
            snprintf(shp, sizeof shp, "T%d N%d Din%d%s", T, N, Din, s % 2 ? " +b" : "");
            double e = report("matmul", moe_dtype_name(dt), shp, got, ref, (size_t)T * N);
            cr_expect(e <= gemm_tol(dt), "matmul %s %s: %.3g", moe_dtype_name(dt), shp, e);
            gpu.ops->dealloc(&gpu, dx);
            gpu.ops->dealloc(&gpu, dy);
            free(sc);
            free(x);
            free(ref);
            free(got);
            free_weight(&w);
            free_weight(&b);
        }
}

Test(cuda_ops, rmsnorm_matches_cpu)
{
    const int shapes[][2] = {{1, 64}, {5, 1000}, {64, 16}, {300, 1024}};
    for (size_t di = 0; di < 3; di++)
        for (size_t s = 0; s < 4; s++) {
            const int rows = shapes[s][0], dim = shapes[s][1];
            struct wpair w = make_weight(wdts[di], dim, 0, 11 + s, 2.0f);
            float *x = rand_floats((size_t)rows * dim, 12 + s, -3, 3);
            float *ref = malloc((size_t)rows * dim * sizeof(float)), *got = malloc((size_t)rows * dim * sizeof(float));
            moe_attention_rmsnorm_cpu(ref, x, &w.h, rows, dim, 1e-5f);
            float *dx = dev_copy(x, (size_t)rows * dim * sizeof(float));
            /* in place, as forward.c uses it for q/k norms */
            cr_assert_eq(gpu.ops->rmsnorm(&gpu, dx, dx, &w.d, rows, dim, 1e-5f), MOE_OK);
            to_host(got, dx, (size_t)rows * dim * sizeof(float));
            char shp[64];
            snprintf(shp, sizeof shp, "rows%d dim%d", rows, dim);
            double e = report("rmsnorm", moe_dtype_name(wdts[di]), shp, got, ref, (size_t)rows * dim);
            cr_expect(e <= 1e-5, "rmsnorm %s: %.3g", shp, e);
            gpu.ops->dealloc(&gpu, dx);
            free(x);
            free(ref);
            free(got);
            free_weight(&w);
        }
}

Test(cuda_ops, rope_matches_cpu)
{
    /* T, H, Dh, rotated values (partial_rotary_factor 0.5 in the last two) */
    const int shapes[][4] = {{1, 4, 16, 16}, {9, 8, 128, 128}, {100, 2, 64, 64}, {7, 4, 128, 64},
                             {33, 2, 16, 8}};
    for (size_t s = 0; s < 5; s++) {
        const int T = shapes[s][0], H = shapes[s][1], Dh = shapes[s][2], R = shapes[s][3];
        size_t n = (size_t)T * H * Dh;
        float *x = rand_floats(n, 21 + s, -1, 1), *got = malloc(n * sizeof(float));
        float *inv = calloc((size_t)Dh / 2, sizeof(float));
        for (int i = 0; i < R / 2; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)R);
        int32_t *pos = malloc((size_t)T * sizeof(int32_t));
        for (int t = 0; t < T; t++) pos[t] = (t * 37 + 5) % 4000;
        float *dx = dev_copy(x, n * sizeof(float));
        int32_t *dpos = dev_copy(pos, (size_t)T * sizeof(int32_t));
        float *dinv = dev_copy(inv, (size_t)Dh / 2 * sizeof(float));
        moe_attention_rope_cpu(x, pos, T, H, Dh, R, inv);
        cr_assert_eq(gpu.ops->rope(&gpu, dx, dpos, T, H, Dh, R, dinv), MOE_OK);
        to_host(got, dx, n * sizeof(float));
        char shp[64];
        snprintf(shp, sizeof shp, "T%d H%d Dh%d rot%d", T, H, Dh, R);
        double e = report("rope", "F32", shp, got, x, n);
        cr_expect(e <= 1e-5, "rope %s: %.3g", shp, e);
        gpu.ops->dealloc(&gpu, dx);
        gpu.ops->dealloc(&gpu, dpos);
        gpu.ops->dealloc(&gpu, dinv);
        free(x);
        free(got);
        free(inv);
        free(pos);
    }
}

/* add, clamp, swiglu, sigmoid_scale, gather_rows, embed */
Test(cuda_ops, elementwise_ops_match_cpu)
{
    const int T = 37, D = 300;
    const size_t n = (size_t)T * D, bytes = n * sizeof(float);
    float *a = rand_floats(n, 31, -4, 4), *b = rand_floats(n, 32, -4, 4);
    float *ref = malloc(bytes), *got = malloc(bytes);
    float *da = dev_copy(a, bytes), *db = dev_copy(b, bytes);
    /* add */
    memcpy(ref, a, bytes);
    cr_assert_eq(cpu.ops->add(&cpu, ref, b, n), MOE_OK);
    cr_assert_eq(gpu.ops->add(&gpu, da, db, n), MOE_OK);
    to_host(got, da, bytes);
    cr_expect(report("add", "F32", "37x300", got, ref, n) == 0.0);
    /* clamp */
    cr_assert_eq(cpu.ops->clamp(&cpu, ref, n, 2.5f), MOE_OK);
    cr_assert_eq(gpu.ops->clamp(&gpu, da, n, 2.5f), MOE_OK);
    to_host(got, da, bytes);
    cr_expect(report("clamp", "F32", "37x300", got, ref, n) == 0.0);
    /* swiglu */
    cr_assert_eq(cpu.ops->swiglu(&cpu, ref, b, n), MOE_OK);
    cr_assert_eq(gpu.ops->swiglu(&gpu, da, db, n), MOE_OK);
    to_host(got, da, bytes);
    cr_expect(report("swiglu", "F32", "37x300", got, ref, n) <= 1e-6);
    /* sigmoid_scale */
    float *g = rand_floats((size_t)T, 33, -3, 3);
    float *dg = dev_copy(g, (size_t)T * sizeof(float));
    cr_assert_eq(cpu.ops->sigmoid_scale(&cpu, ref, g, T, D), MOE_OK);
    cr_assert_eq(gpu.ops->sigmoid_scale(&gpu, da, dg, T, D), MOE_OK);
    to_host(got, da, bytes);
    cr_expect(report("sigmoid_scl", "F32", "37x300", got, ref, n) <= 1e-6);
    /* gather_rows */
    int32_t rows[5] = {36, 0, 17, 17, 3};
    int32_t *drows = dev_copy(rows, sizeof rows);
    float *dd = dev_poisoned(5 * (size_t)D * sizeof(float));
    cr_assert_eq(cpu.ops->gather_rows(&cpu, got, ref, rows, 5, D), MOE_OK);
    float *got2 = malloc(5 * (size_t)D * sizeof(float));
    cr_assert_eq(gpu.ops->gather_rows(&gpu, dd, da, drows, 5, D), MOE_OK);
    to_host(got2, dd, 5 * (size_t)D * sizeof(float));
    cr_expect(report("gather_rows", "F32", "5 of 37x300", got2, got, 5 * (size_t)D) == 0.0);
    /* embed, every dtype */
    for (size_t di = 0; di < 3; di++) {
        struct wpair e = make_weight(wdts[di], 50, D, 34 + di, 1.0f);
        int32_t tok[T];
        for (int t = 0; t < T; t++) tok[t] = (t * 7 + 3) % 50;
        int32_t *dtok = dev_copy(tok, sizeof tok);
        float *dx = dev_poisoned(bytes);
        cr_assert_eq(cpu.ops->embed(&cpu, ref, tok, T, &e.h), MOE_OK);
        cr_assert_eq(gpu.ops->embed(&gpu, dx, dtok, T, &e.d), MOE_OK);
        to_host(got, dx, bytes);
        cr_expect(report("embed", moe_dtype_name(wdts[di]), "V50 D300", got, ref, n) == 0.0);
        gpu.ops->dealloc(&gpu, dtok);
        gpu.ops->dealloc(&gpu, dx);
        free_weight(&e);
    }
    gpu.ops->dealloc(&gpu, da);
    gpu.ops->dealloc(&gpu, db);
    gpu.ops->dealloc(&gpu, dg);
    gpu.ops->dealloc(&gpu, drows);
    gpu.ops->dealloc(&gpu, dd);
    free(a);
    free(b);
    free(g);
    free(ref);
    free(got);
    free(got2);
}

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

/* ---- MLA's column gathers and per-head products ---- */

/* The gathers of runtime/engine/forward_mla.c: rope columns through an index
 * table (interleaved pairs read evens then odds) and 2-D copies between
 * rows of different strides; the columns past n stay poisoned. */
Test(cuda_ops, gather_cols_matches_cpu)
{
    /* rows, ld_src, ld_dst, n, first indexed column (-1: a plain copy) */
    const int shapes[][5] = {{37, 576, 576, 64, 512}, {37 * 16, 192, 576, 64, 128},
                             {300, 512, 576, 512, -1}, {5, 40, 40, 8, 32}, {1, 7, 9, 3, -1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int rows = shapes[s][0], lds = shapes[s][1], ldd = shapes[s][2], n = shapes[s][3];
        const int first = shapes[s][4];
        int32_t *idx = first >= 0 ? malloc((size_t)n * sizeof(int32_t)) : NULL;
        for (int j = 0; idx && j < n; j++) idx[j] = first + (j < n / 2 ? 2 * j : 2 * (j - n / 2) + 1);
        const size_t ns = (size_t)rows * lds, nd = (size_t)rows * ldd;
        float *src = rand_floats(ns, 111 + s, -3, 3), *ref = malloc(nd * sizeof(float));
        float *got = malloc(nd * sizeof(float));
        memset(ref, 0xff, nd * sizeof(float));
        cr_assert_eq(cpu.ops->gather_cols(&cpu, ref, ldd, src, lds, rows, idx, n), MOE_OK);
        float *dsrc = dev_copy(src, ns * sizeof(float)), *ddst = dev_poisoned(nd * sizeof(float));
        int32_t *didx = idx ? dev_copy(idx, (size_t)n * sizeof(int32_t)) : NULL;
        cr_assert_eq(gpu.ops->gather_cols(&gpu, ddst, ldd, dsrc, lds, rows, didx, n), MOE_OK, "%s",
                     moe_last_error());
        to_host(got, ddst, nd * sizeof(float));
        char shp[64];
        snprintf(shp, sizeof shp, "%d rows %d of %d->%d%s", rows, n, lds, ldd, idx ? " idx" : "");
        cr_expect(memcmp(got, ref, nd * sizeof(float)) == 0, "gather_cols %s differs", shp);
        fprintf(stderr, "parity: %-12s %-5s %-22s %s\n", "gather_cols", "F32", shp,
                memcmp(got, ref, nd * sizeof(float)) ? "DIFFERS" : "identical");
        gpu.ops->dealloc(&gpu, dsrc);
        gpu.ops->dealloc(&gpu, ddst);
        gpu.ops->dealloc(&gpu, didx);
        free(idx), free(src), free(ref), free(got);
    }
}

/* y[(t*H + h)*ldy + i] = sum_k W[h][i][k] x[(t*H + h)*ldx + k] (backend.h),
 * the shapes of runtime/engine/forward_mla.c: W_uk^T q_nope into the absorbed
 * query after its rope values (ldx nope + rope, ldy rope + Rc) and W_uv
 * o'[rope:] out of the attention rows (ldx rope + Rc, ldy v), at
 * DeepSeek-V2-Lite's 16 and V3's 128 heads.  The values between N and ldy
 * of each row (the absorbed query's rope part) must stay untouched. */
static void check_head_matmul(enum moe_dtype dt, int T, int H, int N, int K, int ldx, int ldy, int y_off)
{
    struct wpair w = make_weight(dt, (int64_t)H * N, K, 121 + T, 0.08f);
    w.h.ndim = w.d.ndim = 3;
    w.h.shape[0] = w.d.shape[0] = H;
    w.h.shape[1] = w.d.shape[1] = N;
    w.h.shape[2] = w.d.shape[2] = K;
    const size_t nx = (size_t)T * H * ldx, ny = (size_t)T * H * ldy;
    float *x = rand_floats(nx, 122 + T, -1, 1), *ref = malloc(ny * sizeof(float));
    float *got = malloc(ny * sizeof(float));
    memset(ref, 0xff, ny * sizeof(float));
    /* the CPU op's loop (cpu_head_matmul) with scratch of our own: the
     * CPU backend sizes its scratch in prepare_model */
    const size_t mat = (size_t)N * moe_dtype_row_bytes(dt, (size_t)K);
    float *sc = malloc((size_t)K * omp_get_max_threads() * sizeof(float));
    for (int h = 0; h < H; h++)
        moe_gemm_cpu(ref + y_off + (size_t)h * ldy, H * ldy, x + (size_t)h * ldx, H * ldx,
                     (const char *)w.h.data + h * mat, dt, N, K, T, NULL, sc);
    float *dx = dev_copy(x, nx * sizeof(float)), *dy = dev_poisoned(ny * sizeof(float));
    cr_assert_eq(gpu.ops->head_matmul(&gpu, dy + y_off, ldy, dx, ldx, &w.d, T), MOE_OK, "%s",
                 moe_last_error());
    to_host(got, dy, ny * sizeof(float));
    /* untouched values: poison (NaN) in both; compare those bytes exactly */
    int clobbered = 0;
    for (size_t i = 0; i < ny; i++) {
        const size_t c = (i + ldy - (size_t)y_off % ldy) % ldy; /* column from y + y_off */
        if (i < (size_t)y_off || c >= (size_t)N) {
            clobbered += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
            got[i] = ref[i] = 0.0f;
        }
    }
    char shp[64];
    snprintf(shp, sizeof shp, "T%d H%d N%d K%d ld%d/%d", T, H, N, K, ldx, ldy);
    cr_expect_eq(clobbered, 0, "head_matmul %s %s: %d values outside the products written",
                 moe_dtype_name(dt), shp, clobbered);
    double e = report("head_matmul", moe_dtype_name(dt), shp, got, ref, ny);
    cr_expect(e <= gemm_tol(dt), "head_matmul %s %s: %.3g", moe_dtype_name(dt), shp, e);
    gpu.ops->dealloc(&gpu, dx);
    gpu.ops->dealloc(&gpu, dy);
    free(x), free(ref), free(got), free(sc);
    free_weight(&w);
}

Test(cuda_ops, head_matmul_matches_cpu)
{
    /* the workspace for half inputs: T x H x K values (reserve counts MLA's) */
    struct moe_config c;
    reserve_cfg(&c);
    c.n_heads = 128, c.head_dim = 576, c.kv_lora_rank = 512, c.qk_nope_dim = 128, c.v_head_dim = 128;
    c.rope_dim = 64, c.q_lora_rank = 1536;
    cr_assert_eq(gpu.ops->reserve(&gpu, &c, 80), MOE_OK, "%s", moe_last_error());
    for (size_t di = 0; di < 3; di++) {
        const enum moe_dtype dt = wdts[di];
        const int Ts[] = {1, 7, 70};
        for (int i = 0; i < 3; i++) {
            check_head_matmul(dt, Ts[i], 16, 512, 128, 192, 576, 64); /* W_uk^T q_nope */
            check_head_matmul(dt, Ts[i], 16, 128, 512, 576, 128, 0);  /* W_uv o' (x at + 64) */
        }
        check_head_matmul(dt, 3, 128, 512, 128, 192, 576, 64);
        check_head_matmul(dt, 3, 128, 128, 512, 576, 128, 0);
        check_head_matmul(dt, 5, 4, 32, 16, 24, 40, 8); /* the deepseek fixtures' shape */
    }
}

/* ---- routing ---- */

/* The sigmoid router (GLM-4.5 / DeepSeek-V3): bias, groups, scale, with
 * ties, NaN and infinities, as the softmax test below has them. */
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
            struct moe_route hr = {E, K, renorm, true, bias, shapes[s][3], shapes[s][4], 2.5f};
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
            const struct moe_route rt = {E, K, renorm, false, NULL, G, shapes[s][4], shapes[s][5] / 10.0f};
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
            const struct moe_route rt = {E, K, renorm, false, NULL, 1, 1, 1.0f};
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
    struct moe_dispatch dp = {dbuf, dbuf + E + 1, dbuf + 2 * E + 3, dbuf + 2 * E + 3 + TK};
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

/* ---- synthetic weights on the device equal runtime/model/synth.c ---- */

Test(cuda_ops, synth_fill_matches_host_generator)
{
    struct moe_config c;
    memset(&c, 0, sizeof c);
    c.family = MOE_FAMILY_LLAMA;
    c.n_layers = 1, c.d_model = 64, c.vocab = 1000, c.n_heads = 4, c.n_kv_heads = 2;
    c.head_dim = 16, c.d_ff = 96, c.init_std = 0.02f, c.max_pos = 128, c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    for (size_t di = 0; di < 3; di++) {
        struct moe_model m;
        cr_assert_eq(moe_model_synthetic(&m, &c, wdts[di], 7), MOE_OK, "%s", moe_last_error());
        /* the first tensor is the embedding, key index 0 */
        const size_t n = 1000 * 64, bytes = n * moe_dtype_size(wdts[di]);
        void *d = dev_poisoned(bytes), *h = malloc(bytes);
        cr_assert_eq(gpu.ops->synth_fill(&gpu, d, wdts[di], n, moe_synth_key(7, 0), 0.02f), MOE_OK);
        to_host(h, d, bytes);
        cr_expect(memcmp(h, m.embed.data, bytes) == 0, "synth_fill %s differs from the host",
                  moe_dtype_name(wdts[di]));
        gpu.ops->dealloc(&gpu, d);
        free(h);
        moe_model_free(&m);
    }
}

/* Expert load counters: one row per MoE layer (dispatch calls in order),
 * accumulated on the device, read back on demand. */
Test(cuda_ops, expert_load_counts_dispatches_by_layer)
{
    const int T = 6, K = 2, E = 128;
    int32_t ids[12] = {0, 5, 5, 7, 127, 0, 3, 5, 0, 1, 2, 5};
    int32_t *dids = dev_copy(ids, sizeof ids);
    int32_t *dbuf = dev_poisoned((2 * (size_t)E + 1 + 2 * T * K) * sizeof(int32_t));
    struct moe_dispatch dp = {dbuf, dbuf + E, dbuf + 2 * E + 1, dbuf + 2 * E + 1 + T * K};
    /* layer 0 twice (two steps), layer 1 once */
    for (int step = 0; step < 2; step++) {
        cr_assert_eq(gpu.ops->dispatch(&gpu, &dp, dids, T, K, E), MOE_OK, "%s", moe_last_error());
        if (step == 0) cr_assert_eq(gpu.ops->dispatch(&gpu, &dp, dids, 3, K, E), MOE_OK);
        /* a new step starts at embed; any embedding will do */
        float *x = dev_poisoned(4 * sizeof(float));
        int32_t tok = 0;
        int32_t *dtok = dev_copy(&tok, sizeof tok);
        struct wpair e = make_weight(MOE_DTYPE_F32, 1, 4, 1, 1.0f);
        cr_assert_eq(gpu.ops->embed(&gpu, x, dtok, 1, &e.d), MOE_OK);
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
