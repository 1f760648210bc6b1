/* test_cuda_quant.c - MXFP4 and FP8_B128 experts read in place on the GPU
 * against the CPU experts op reading the same weights.
 *
 * The CPU keeps such experts as rows of blocks (runtime/core/tensor.h); the CUDA
 * backend keeps them as planes (values, then scales; moe_planes_from_rows).
 * Each case builds random checkpoint-like weights (every E2M1 code and E4M3
 * byte but NaN, scales spread over a few octaves), lays them out as
 * prepare_model does, and compares the decode-path kernels (few rows) and
 * the grouped path (enough rows an expert that the layer is widened to
 * bf16 for cuBLAS) with the CPU, gpt-oss's biases and clamped activation
 * included.  Each check prints a "parity:" line for tests/gpu/run.sh.
 *
 * Without a device every test skips (the suite's .init asks the CUDA
 * runtime in the forked test process). */
#include "tests/cuda_test.h"

/* Set by the cuda_quant_mma suite (MOERUN_CUDA_EXPERTS=mma). */
static bool mma_backend;

static void setup_quant(void)
{
    setup();
    struct moe_config c;
    reserve_cfg(&c);
    c.experts_mxfp4 = true; /* reserves the buffer the grouped path widens into */
    c.weights_fp8 = true;   /* ... and the one many-row matmuls widen into */
    cr_assert_eq(gpu.ops->reserve(&gpu, &c, 512), MOE_OK, "%s", moe_last_error());
}

TestSuite(cuda_quant, .init = setup_quant, .fini = teardown);

/* The suite's GPU backend opened again with --quantize q8_0 or q4,
 * unreserved. */
static void reopen_gpu_quant(enum moe_weight_quant q)
{
    moe_backend_free(&gpu);
    cr_assert_eq(tu_backend_init_with(&gpu, "cuda", q, 0, 0), MOE_OK, "%s", moe_last_error());
}
static void reopen_gpu_q8(void) { reopen_gpu_quant(MOE_QUANT_Q8_0); }

/* MOERUN_CUDA_EXPERTS=mma: MXFP4 / FP8 experts of steps of many rows read
 * in place by the tensor-core kernels, never widened (nothing reserved
 * for it). */
static void setup_quant_mma(void)
{
    setenv("MOERUN_CUDA_EXPERTS", "mma", 1);
    mma_backend = true;
    setup_quant();
}

TestSuite(cuda_quant_mma, .init = setup_quant_mma, .fini = teardown);

/* The host's quantizer of t (Q8_0, Q4_1 or Q4_K). */
static bool quantize_row(enum moe_dtype t, void *dst, const float *x, size_t K)
{
    return t == MOE_DTYPE_Q4_K   ? moe_quantize_row_q4_k(dst, x, K)
           : t == MOE_DTYPE_Q4_1 ? moe_quantize_row_q4_1(dst, x, K)
                                 : moe_quantize_row_q8_0(dst, x, K);
}

/* rows (R, K) of dt blocks with random codes and scales (Q8_0, Q4_1,
 * Q4_K: random values quantized; Q4_G32, Q4_G128: per group d in [2^-8, 2^-7)
 * and m in (-8d, -7d], as a checkpoint's (q - z) * s with z near 8) */
static void *quant_rows(enum moe_dtype dt, size_t R, size_t K, uint64_t seed)
{
    if (dt == MOE_DTYPE_Q8_0 || dt == MOE_DTYPE_Q4_1 || dt == MOE_DTYPE_Q4_K) {
        const size_t rb = moe_dtype_row_bytes(dt, K);
        unsigned char *out = malloc(R * rb);
        float *x = rand_floats(R * K, seed, -0.1f, 0.1f);
        for (size_t r = 0; r < R; r++)
            cr_assert(quantize_row(dt, out + r * rb, x + r * K, K));
        free(x);
        return out;
    }
    if (moe_dtype_is_q4(dt)) {
        const size_t gb = moe_q4_group_bytes(dt), n = R * (K / (size_t)moe_q4_group(dt));
        unsigned char *out = malloc(n * gb);
        uint64_t st = seed;
        for (size_t g = 0; g < n; g++) {
            unsigned char *b = out + g * gb;
            const float d = ldexpf(1.0f + tu_rand_uniform(&st, 0.0f, 1.0f), -8);
            const float m = -tu_rand_uniform(&st, 7.0f, 8.0f) * d;
            memcpy(b, &d, 4);
            memcpy(b + 4, &m, 4);
            for (size_t j = MOE_Q4_HEAD; j < gb; j++) b[j] = (unsigned char)tu_rand_u64(&st);
        }
        return out;
    }
    const bool fp4 = dt == MOE_DTYPE_MXFP4;
    const size_t blk = fp4 ? MOE_MXFP4_BLOCK : MOE_FP8_BLOCK, rb = moe_dtype_row_bytes(dt, K);
    unsigned char *out = malloc(R * rb), *codes = malloc(K);
    float *u = rand_floats(R * K + R * (K / blk), seed, 0.0f, 1.0f);
    const float *su = u + R * K;
    uint8_t *s8 = malloc(K / blk);
    float *sf = malloc(K / blk * sizeof(float));
    for (size_t r = 0; r < R; r++) {
        for (size_t k = 0; k < K; k++) {
            unsigned c = (unsigned)(u[r * K + k] * 256.0f) & 255u;
            if (!fp4 && (c & 0x7f) == 0x7f) c ^= 1; /* not NaN */
            codes[k] = (unsigned char)c;
        }
        for (size_t g = 0; g < K / blk; g++) {
            /* 2^-7 .. 2^-4 (MXFP4: codes up to 6; FP8: values up to 448 / 2^7) */
            const int e = (int)(su[r * (K / blk) + g] * 4.0f);
            s8[g] = (uint8_t)(120 + e);
            sf[g] = ldexpf(1.0f, (fp4 ? -7 : -14) + e);
        }
        void *row = out + r * rb;
        if (fp4) {
            /* checkpoint blocks: two codes a byte */
            unsigned char *pk = malloc(K / 2);
            for (size_t k = 0; k < K / 2; k++) pk[k] = (unsigned char)((codes[2 * k] & 15) | (codes[2 * k + 1] & 15) << 4);
            cr_assert(moe_mxfp4_pack_row(row, pk, s8, K));
            free(pk);
        } else {
            cr_assert(moe_fp8_pack_row(row, codes, sf, K));
        }
    }
    free(codes), free(u), free(s8), free(sf);
    return out;
}

/* One stack (n matrices of R x K rows) as planes on the device: matrix i's
 * values at i * values(R, K), its scales after all n matrices' values. */
static void *dev_planes(enum moe_dtype dt, void *const *mats, int n, size_t R, size_t K)
{
    const size_t vb = moe_planes_values_bytes(dt, R, K), sb = moe_planes_scales_bytes(dt, R, K);
    unsigned char *h = malloc((vb + sb) * (size_t)n);
    for (int i = 0; i < n; i++) moe_planes_from_rows(dt, mats[i], R, K, h + vb * i, h + vb * n + sb * i);
    void *d = dev_copy(h, (vb + sb) * (size_t)n);
    free(h);
    return d;
}

static void check_quant_experts(enum moe_dtype dt, int T, int E, int K, int D, int F, bool gpt_oss)
{
    void *hg[E], *hu[E], *hd[E], *gu_mats[2 * E];
    for (int e = 0; e < E; e++) {
        hg[e] = quant_rows(dt, (size_t)F, (size_t)D, 1000 + 3 * (uint64_t)e);
        hu[e] = quant_rows(dt, (size_t)F, (size_t)D, 1001 + 3 * (uint64_t)e);
        hd[e] = quant_rows(dt, (size_t)D, (size_t)F, 1002 + 3 * (uint64_t)e);
        gu_mats[2 * e] = hg[e], gu_mats[2 * e + 1] = hu[e];
    }
    char *dgu = dev_planes(dt, gu_mats, 2 * E, (size_t)F, (size_t)D);
    char *ddn = dev_planes(dt, hd, E, (size_t)D, (size_t)F);
    const size_t mat = moe_planes_values_bytes(dt, (size_t)F, (size_t)D);
    const void *cg[E], *cu[E], *cd[E], *dg[E], *du[E], *dd[E];
    for (int e = 0; e < E; e++) {
        cg[e] = hg[e], cu[e] = hu[e], cd[e] = hd[e];
        dg[e] = dgu + 2 * mat * e, du[e] = dgu + 2 * mat * e + mat, dd[e] = ddn + mat * e;
    }
    struct moe_expert_weights hx = {.dtype = dt, .gate = cg, .up = cu, .down = cd}, dx = hx;
    dx.gate = dg, dx.up = du, dx.down = dd;
    float *bias = NULL, *dbias = NULL;
    if (gpt_oss) gpt_oss_biases(&hx, &dx, E, D, F, 1.0f, &bias, &dbias); /* a limit values cross often */
    char shp[64];
    snprintf(shp, sizeof shp, "T%d E%d K%d D%d F%d%s", T, E, K, D, F, gpt_oss ? " gpt-oss" : "");
    /* the backend's rules: widened (grouped) past 32 rows and 8 rows an
     * expert; with MOERUN_CUDA_EXPERTS=mma, the tensor-core kernels past 32
     * rows or from 4 rows an expert */
    const bool q4 = moe_dtype_is_q4(dt); /* no tensor-core path: widened */
    const bool mma = !q4 && mma_backend && T > 1 && (T > 32 || T * K >= 4 * E);
    const bool grouped = mma || ((!mma_backend || q4) && T > 32 && (size_t)T * K > 8 * (size_t)E);
    const int64_t calls = moe_cuda_mma_expert_calls(&gpu);
    const double e = experts_parity(&hx, &dx, T, E, K, D, F,
                                    mma ? "experts_mma" : grouped ? "experts_grp" : "experts_dec", shp);
    cr_expect_eq(moe_cuda_mma_expert_calls(&gpu) - calls, mma ? 1 : 0, "experts %s %s: %s the tensor-core "
                 "kernels", moe_dtype_name(dt), shp, mma ? "not on" : "on");
    /* decode: fp32 activations, only the summation order differs; grouped:
     * bf16 activations and (FP8) weights rounded to bf16 */
    cr_expect(e <= (grouped ? 3e-2 : 1e-4), "experts %s %s: %.3g", moe_dtype_name(dt), shp, e);
    void *dbufs[] = {dgu, ddn, dbias};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) gpu.ops->dealloc(&gpu, dbufs[i]);
    for (int e2 = 0; e2 < E; e2++) free(hg[e2]), free(hu[e2]), free(hd[e2]);
    free(bias);
}

/* The matmul op with an MXFP4 or FP8 matrix (N, Din) as planes: read in
 * place for steps of up to 32 rows (fp32 throughout: the CPU's sum in
 * another order), widened to bf16 for cuBLAS past them. */
static void check_planes_matmul(enum moe_dtype dt, int T, int N, int Din, bool bias)
{
    void *rows = quant_rows(dt, (size_t)N, (size_t)Din, 2000 + (uint64_t)N);
    void *const mats[1] = {rows};
    struct moe_tensor hw = {dt, 2, {N, Din}, rows, -1, NULL}, dw = hw;
    dw.data = dev_planes(dt, mats, 1, (size_t)N, (size_t)Din);
    dw.device = 0;
    float *hb = rand_floats((size_t)N, 2001, -0.5f, 0.5f);
    struct moe_tensor bh = {MOE_DTYPE_F32, 1, {N}, hb, -1, NULL}, bd = bh;
    bd.data = dev_copy(hb, (size_t)N * sizeof(float));
    float *x = rand_floats((size_t)T * Din, 2002, -1, 1);
    float *ref = malloc((size_t)T * N * sizeof(float)), *got = malloc((size_t)T * N * sizeof(float));
    float *sc = malloc((size_t)Din * omp_get_max_threads() * sizeof(float));
    moe_gemm_cpu(ref, N, x, Din, rows, dt, N, Din, T, bias ? &bh : NULL, sc);
    float *dx = dev_copy(x, (size_t)T * Din * sizeof(float));
    float *dy = dev_poisoned((size_t)T * N * sizeof(float));
    cr_assert_eq(gpu.ops->matmul(&gpu, dy, dx, &dw, bias ? &bd : NULL, T), MOE_OK, "%s", moe_last_error());
    to_host(got, dy, (size_t)T * N * sizeof(float));
    char shp[64];
    snprintf(shp, sizeof shp, "T%d N%d Din%d%s", T, N, Din, bias ? " +b" : "");
    const bool wide = T > 32;
    const double e = report(wide ? "matmul_wide" : "matmul_planes", moe_dtype_name(dt), shp, got, ref,
                            (size_t)T * N);
    cr_expect(e <= (wide ? 2e-2 : 1e-4), "matmul %s %s: %.3g", moe_dtype_name(dt), shp, e);
    void *dbufs[] = {dw.data, bd.data, dx, dy};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) gpu.ops->dealloc(&gpu, dbufs[i]);
    free(rows), free(hb), free(x), free(ref), free(got), free(sc);
}

Test(cuda_quant, planes_matmul_matches_cpu)
{
    const enum moe_dtype dts[] = {MOE_DTYPE_FP8_B128, MOE_DTYPE_MXFP4,  MOE_DTYPE_Q8_0,   MOE_DTYPE_Q4_1,
                                  MOE_DTYPE_Q4_G32,   MOE_DTYPE_Q4_G128, MOE_DTYPE_Q4_K};
    for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
        check_planes_matmul(dts[i], 1, 256, 512, false);
        check_planes_matmul(dts[i], 5, 97, 1024, true);  /* odd N: the last warp's second row */
        check_planes_matmul(dts[i], 32, 300, 256, true); /* four row passes */
        check_planes_matmul(dts[i], 100, 200, 768, true); /* widened for cuBLAS */
    }
    /* more values than the reserved widening buffer (1024 x 1024): widened
     * and multiplied 2048 rows of W at a time */
    check_planes_matmul(MOE_DTYPE_Q8_0, 40, 2100, 512, true);
}

/* Read in place (up to 32 rows) and widened for cuBLAS, each format, at
 * small shapes: the host emulation's CI selection
 * (tools/cuda-emu/ci-tests.txt). */
Test(cuda_quant, planes_matmul_small_shapes_match_cpu)
{
    const enum moe_dtype dts[] = {MOE_DTYPE_FP8_B128, MOE_DTYPE_MXFP4,  MOE_DTYPE_Q8_0,   MOE_DTYPE_Q4_1,
                                  MOE_DTYPE_Q4_G32,   MOE_DTYPE_Q4_G128, MOE_DTYPE_Q4_K};
    for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
        check_planes_matmul(dts[i], 5, 33, 256, true); /* odd N: the last warp's second row */
        check_planes_matmul(dts[i], 40, 24, 256, i % 2 == 0);
    }
}

Test(cuda_quant, mxfp4_experts_match_cpu)
{
    check_quant_experts(MOE_DTYPE_MXFP4, 1, 8, 2, 64, 96, false);    /* one block row tail */
    check_quant_experts(MOE_DTYPE_MXFP4, 4, 8, 2, 2880 / 10, 288, false);
    check_quant_experts(MOE_DTYPE_MXFP4, 32, 16, 4, 1024, 256, false); /* several row tiles */
    check_quant_experts(MOE_DTYPE_MXFP4, 1, 8, 2, 64, 96, true);
    check_quant_experts(MOE_DTYPE_MXFP4, 300, 16, 4, 256, 128, true); /* widened, grouped */
    check_quant_experts(MOE_DTYPE_MXFP4, 64, 32, 2, 128, 64, false);  /* 4 rows an expert: kernels */
}

Test(cuda_quant, fp8_experts_match_cpu)
{
    check_quant_experts(MOE_DTYPE_FP8_B128, 1, 8, 2, 128, 256, false);
    check_quant_experts(MOE_DTYPE_FP8_B128, 32, 16, 4, 1024, 256, false);
    check_quant_experts(MOE_DTYPE_FP8_B128, 300, 16, 4, 256, 128, false); /* widened, grouped */
    check_quant_experts(MOE_DTYPE_FP8_B128, 300, 16, 4, 256, 128, true);
}

Test(cuda_quant, q8_0_experts_match_cpu)
{
    check_quant_experts(MOE_DTYPE_Q8_0, 1, 8, 2, 96, 160, false);
    check_quant_experts(MOE_DTYPE_Q8_0, 32, 16, 4, 1024, 256, false);  /* several row tiles */
    check_quant_experts(MOE_DTYPE_Q8_0, 4, 8, 2, 64, 96, true);        /* biases, clamp */
    check_quant_experts(MOE_DTYPE_Q8_0, 300, 16, 4, 256, 128, false); /* widened, grouped */
}

/* The four-bit formats (Q4_1 and Q4_K from --quantize q4's quantizers;
 * Q4_G32 and Q4_G128 as GPTQ, AWQ and compressed-tensors checkpoints
 * load) */
Test(cuda_quant, q4_experts_match_cpu)
{
    const enum moe_dtype dts[] = {MOE_DTYPE_Q4_1, MOE_DTYPE_Q4_G32, MOE_DTYPE_Q4_G128};
    for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
        check_quant_experts(dts[i], 1, 8, 2, 128, 256, false);
        check_quant_experts(dts[i], 32, 16, 4, 1024, 256, false);  /* several row tiles */
        check_quant_experts(dts[i], 4, 8, 2, 128, 384, true);      /* biases, clamp */
        check_quant_experts(dts[i], 300, 16, 4, 256, 128, false); /* widened, grouped */
    }
    check_quant_experts(MOE_DTYPE_Q4_K, 1, 8, 2, 256, 512, false);
    check_quant_experts(MOE_DTYPE_Q4_K, 32, 16, 4, 1024, 256, false);
    check_quant_experts(MOE_DTYPE_Q4_K, 4, 8, 2, 256, 768, true);
    check_quant_experts(MOE_DTYPE_Q4_K, 300, 16, 4, 256, 256, false);
}

/* Decode kernels and the grouped path for each planes format at small
 * shapes, quick enough for the host emulation's CI selection
 * (tools/cuda-emu/ci-tests.txt). */
Test(cuda_quant, experts_small_shapes_match_cpu)
{
    check_quant_experts(MOE_DTYPE_MXFP4, 1, 8, 2, 64, 96, true);
    check_quant_experts(MOE_DTYPE_MXFP4, 40, 4, 2, 64, 96, false); /* widened, grouped */
    check_quant_experts(MOE_DTYPE_FP8_B128, 4, 4, 2, 128, 128, false);
    check_quant_experts(MOE_DTYPE_FP8_B128, 40, 4, 2, 128, 128, true);
    check_quant_experts(MOE_DTYPE_Q8_0, 4, 8, 2, 64, 96, true);
    check_quant_experts(MOE_DTYPE_Q8_0, 40, 4, 2, 64, 96, false);
    check_quant_experts(MOE_DTYPE_Q4_1, 4, 8, 2, 64, 96, true);
    check_quant_experts(MOE_DTYPE_Q4_G32, 40, 4, 2, 64, 96, false);
    check_quant_experts(MOE_DTYPE_Q4_G128, 4, 4, 2, 128, 256, false);
    check_quant_experts(MOE_DTYPE_Q4_G128, 40, 4, 2, 128, 128, false);
    check_quant_experts(MOE_DTYPE_Q4_K, 4, 4, 2, 256, 256, true);
    check_quant_experts(MOE_DTYPE_Q4_K, 40, 4, 2, 256, 256, false);
}

Test(cuda_quant_mma, tensor_core_experts_small_shapes_match_cpu)
{
    check_quant_experts(MOE_DTYPE_MXFP4, 40, 4, 1, 64, 96, true);
    check_quant_experts(MOE_DTYPE_FP8_B128, 40, 4, 1, 128, 128, false);
    check_quant_experts(MOE_DTYPE_Q8_0, 16, 8, 2, 64, 96, false); /* decode-sized, 4 rows an expert */
    check_quant_experts(MOE_DTYPE_Q4_G32, 16, 8, 2, 64, 96, false); /* four-bit: not on them */
}

Test(cuda_quant_mma, tensor_core_experts_match_cpu)
{
    check_quant_experts(MOE_DTYPE_Q8_0, 300, 16, 4, 256, 128, false);
    check_quant_experts(MOE_DTYPE_Q8_0, 16, 8, 2, 64, 96, true); /* decode-sized, 4 rows an expert */
    check_quant_experts(MOE_DTYPE_MXFP4, 300, 16, 4, 256, 128, true); /* 75 rows an expert */
    check_quant_experts(MOE_DTYPE_MXFP4, 64, 32, 2, 2880 / 10, 288, false); /* D: 9 stages */
    check_quant_experts(MOE_DTYPE_MXFP4, 16, 8, 2, 64, 96, false); /* decode-sized, 4 rows an expert */
    check_quant_experts(MOE_DTYPE_MXFP4, 4, 8, 2, 64, 96, false);  /* 1 row an expert: kernels */
    check_quant_experts(MOE_DTYPE_FP8_B128, 300, 16, 4, 256, 128, false);
    check_quant_experts(MOE_DTYPE_FP8_B128, 100, 4, 2, 128, 384, true); /* 50 rows an expert */
}

/* An FP8_B128 weight no matmul reads (here the embedding) is widened to
 * bf16 on upload (moe_ops_fp8_to_bf16_cuda): each value the bf16 rounding
 * of its fp32 value, bit for bit. */
Test(cuda_quant, fp8_view_widened_to_bf16)
{
    enum { V = 6, D = 384 };
    void *rows = quant_rows(MOE_DTYPE_FP8_B128, V, D, 77);
    struct moe_model m;
    memset(&m, 0, sizeof m);
    m.cfg.vocab = V, m.cfg.d_model = D;
    m.embed = (struct moe_tensor){MOE_DTYPE_FP8_B128, 2, {V, D}, rows, -1, NULL};
    cr_assert_eq(gpu.ops->prepare_model(&gpu, &m), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(m.embed.dtype, MOE_DTYPE_BF16);
    cr_assert(m.embed.device >= 0);
    uint16_t *back = malloc((size_t)V * D * 2);
    float *ref = malloc((size_t)D * sizeof(float));
    to_host(back, m.embed.data, (size_t)V * D * 2);
    int differ = 0;
    for (int r = 0; r < V; r++) {
        moe_convert_row_f32(ref, (const char *)rows + (size_t)r * moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, D),
                            MOE_DTYPE_FP8_B128, D);
        for (int k = 0; k < D; k++) differ += back[(size_t)r * D + k] != moe_f32_to_bf16(ref[k]);
    }
    cr_expect_eq(differ, 0, "%d of %d widened values differ from the host's bf16 rounding", differ, V * D);
    free(back), free(ref), free(rows);
}

/* A matrix of R rows of K on the device, values at dv and scales at ds,
 * holds the host rows' planes byte for byte. */
static void expect_planes(const char *what, const void *rows, const void *dv, const void *ds, int R, int K)
{
    const enum moe_dtype t = MOE_DTYPE_FP8_B128;
    const size_t vb = moe_planes_values_bytes(t, (size_t)R, (size_t)K), sb = moe_planes_scales_bytes(t, (size_t)R, (size_t)K);
    unsigned char *want = malloc(vb + sb), *got = malloc(vb + sb);
    moe_planes_from_rows(t, rows, (size_t)R, (size_t)K, want, want + vb);
    to_host(got, dv, vb);
    to_host(got + vb, ds, sb);
    const bool same = memcmp(got, want, vb + sb) == 0;
    fprintf(stderr, "parity: fp8_planes  %-16s (%d,%d) %s\n", what, R, K, same ? "identical" : "DIFFERS");
    cr_expect(same, "%s: planes differ from the host rows", what);
    free(want), free(got);
}

/* An fp8 checkpoint prepared on the GPU: the projections (attention, the
 * dense FFN) and every expert kept as FP8 planes, byte for byte. */
Test(cuda_quant, fp8_checkpoint_upload)
{
    struct moe_model h, d;
    cr_assert_eq(moe_model_load(&h, FIXTURE_DIR "/qwen3_moe_fp8"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_model_load(&d, FIXTURE_DIR "/qwen3_moe_fp8"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(gpu.ops->prepare_model(&gpu, &d), MOE_OK, "%s", moe_last_error());
    const struct moe_layer_weights *a = &h.layers[0], *b = &d.layers[0];
    const int D = h.cfg.d_model, F = h.cfg.d_expert, Fd = h.cfg.d_ff, Q = h.cfg.n_heads * h.cfg.head_dim,
              KV = h.cfg.n_kv_heads * h.cfg.head_dim, E = h.cfg.n_experts;
    cr_expect(b->wq.dtype == MOE_DTYPE_FP8_B128 && b->wq.device >= 0);
    cr_expect_eq(b->experts.dtype, MOE_DTYPE_FP8_B128);
    const struct { const char *what; const void *h, *d; int R, K; } mats[] = {
        {"q_proj", a->wq.data, b->wq.data, Q, D}, {"k_proj", a->wk.data, b->wk.data, KV, D},
        {"o_proj", a->wo.data, b->wo.data, D, Q},
        {"dense down_proj", h.layers[1].w_down.data, d.layers[1].w_down.data, D, Fd}};
    for (size_t i = 0; i < sizeof mats / sizeof *mats; i++)
        expect_planes(mats[i].what, mats[i].h, mats[i].d,
                      (const char *)mats[i].d + moe_planes_values_bytes(MOE_DTYPE_FP8_B128, (size_t)mats[i].R,
                                                                         (size_t)mats[i].K),
                      mats[i].R, mats[i].K);
    const enum moe_dtype t = MOE_DTYPE_FP8_B128;
    const size_t S = moe_planes_scales_bytes(t, (size_t)F, (size_t)D);
    const char *gus = (const char *)b->experts.gate[0] + moe_planes_values_bytes(t, 2 * (size_t)F * E, (size_t)D);
    const char *dns = (const char *)b->experts.down[0] + moe_planes_values_bytes(t, (size_t)D * E, (size_t)F);
    for (int e = 0; e < E; e++) {
        expect_planes("expert gate", a->experts.gate[e], b->experts.gate[e], gus + 2 * e * S, F, D);
        expect_planes("expert up", a->experts.up[e], b->experts.up[e], gus + (2 * e + 1) * S, F, D);
        expect_planes("expert down", a->experts.down[e], b->experts.down[e], dns + e * S, D, F);
    }
    moe_model_free(&d);
    moe_model_free(&h);
}

/* An fp8 DeepSeek-V3 checkpoint prepared on the GPU: MLA's FP8 projections
 * (q_a_proj, q_b_proj, kv_a_proj_with_mqa, o_proj) kept as planes byte for
 * byte; kv_b_proj's per-head halves (dequantized to F32 at load) and the
 * norms uploaded as they are. */
Test(cuda_quant, fp8_mla_weights_upload)
{
    struct moe_model h, d;
    cr_assert_eq(moe_model_load(&h, FIXTURE_DIR "/deepseek_v3_fp8"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_model_load(&d, FIXTURE_DIR "/deepseek_v3_fp8"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(gpu.ops->prepare_model(&gpu, &d), MOE_OK, "%s", moe_last_error());
    for (int l = 0; l < h.cfg.n_layers; l++) {
        const struct moe_layer_weights *a = &h.layers[l], *b = &d.layers[l];
        const struct moe_tensor *fp8[][2] = {{&a->wq_a, &b->wq_a}, {&a->wq, &b->wq},
                                             {&a->wkv_a, &b->wkv_a}, {&a->wo, &b->wo}};
        const char *names[] = {"q_a_proj", "q_b_proj", "kv_a_proj", "o_proj"};
        for (int i = 0; i < 4; i++) {
            const int R = (int)fp8[i][0]->shape[0], K = (int)fp8[i][0]->shape[1];
            cr_assert_eq(fp8[i][0]->dtype, MOE_DTYPE_FP8_B128, "%s", names[i]);
            cr_expect(fp8[i][1]->dtype == MOE_DTYPE_FP8_B128 && fp8[i][1]->device >= 0, "%s", names[i]);
            expect_planes(names[i], fp8[i][0]->data, fp8[i][1]->data,
                          (const char *)fp8[i][1]->data + moe_planes_values_bytes(MOE_DTYPE_FP8_B128, (size_t)R, (size_t)K),
                          R, K);
        }
        const struct moe_tensor *same[][2] = {{&a->w_uk, &b->w_uk}, {&a->w_uv, &b->w_uv},
                                              {&a->q_a_norm, &b->q_a_norm},
                                              {&a->kv_a_norm, &b->kv_a_norm}};
        for (int i = 0; i < 4; i++) {
            const size_t bytes = (size_t)moe_tensor_numel(same[i][0]) * moe_dtype_size(same[i][0]->dtype);
            cr_expect(same[i][1]->dtype == same[i][0]->dtype && same[i][1]->device >= 0);
            void *back = malloc(bytes);
            to_host(back, same[i][1]->data, bytes);
            const bool ok = memcmp(back, same[i][0]->data, bytes) == 0;
            cr_expect(ok, "layer %d: MLA tensor %d differs after upload", l, i);
            fprintf(stderr, "parity: mla_upload  layer%d tensor%d (%s, %zu bytes) %s\n", l, i,
                    moe_dtype_name(same[i][0]->dtype), bytes, ok ? "identical" : "DIFFERS");
            free(back);
        }
    }
    moe_model_free(&d);
    moe_model_free(&h);
}

/* ---- --quantize q8_0 on the GPU: weights quantized on the device ---- */

/* tiny-moe's seeded weights in dt, with blocks at the quantizer's edges
 * planted at the start of layer 0's q_proj: all zeros, values whose scale
 * is an f16 subnormal, exact halves (d = 1: roundf rounds them away from
 * zero, rint would not), the largest code at both signs. */
static void q8_model_shape(struct moe_model *m, enum moe_dtype dt, int F, int L, int E)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    if (F) cfg.d_expert = F;
    if (L) cfg.n_layers = L;
    if (E) cfg.n_experts = E;
    cr_assert_eq(moe_model_synthetic(m, &cfg, dt, 11), MOE_OK, "%s", moe_last_error());
    float edge[4][32];
    for (int j = 0; j < 32; j++) {
        edge[0][j] = 0.0f;
        edge[1][j] = (float)(j - 16) * 1e-7f;
        edge[2][j] = j == 0 ? 127.0f : (float)(j - 16) + 0.5f;
        edge[3][j] = j % 2 ? -3.0f : 3.0f;
    }
    for (int b = 0; b < 4; b++)
        moe_convert_from_f32((char *)m->layers[0].wq.data + (size_t)b * 32 * moe_dtype_size(dt), edge[b], dt, 32);
}
/* tiny-moe (q8_model_shape: F, L, E its expert width, layers and experts, 0
 * as configured) */
static void q8_model_f(struct moe_model *m, enum moe_dtype dt, int F) { q8_model_shape(m, dt, F, 0, 0); }
static void q8_model(struct moe_model *m, enum moe_dtype dt) { q8_model_shape(m, dt, 0, 0, 0); }

/* The device planes (values at dv, scales at ds) of R rows of K host
 * values of dt at h hold the host's quantization to t (Q8_0, Q4_1 or
 * Q4_K), byte for byte. */
static void expect_quant_planes(const char *what, const void *h, enum moe_dtype dt, enum moe_dtype t,
                                const void *dv, const void *ds, size_t R, size_t K)
{
    const size_t rb = moe_dtype_row_bytes(t, K), vb = moe_planes_values_bytes(t, R, K),
                 sb = moe_planes_scales_bytes(t, R, K);
    unsigned char *rows = malloc(R * rb), *want = malloc(vb + sb), *got = malloc(vb + sb);
    float *f = malloc(K * sizeof(float));
    for (size_t r = 0; r < R; r++) {
        moe_convert_row_f32(f, (const char *)h + r * K * moe_dtype_size(dt), dt, K);
        cr_assert(quantize_row(t, rows + r * rb, f, K));
    }
    moe_planes_from_rows(t, rows, R, K, want, want + vb);
    to_host(got, dv, vb);
    to_host(got + vb, ds, sb);
    const bool same = memcmp(got, want, vb + sb) == 0;
    fprintf(stderr, "parity: %s_upload %-16s %-5s (%zu,%zu) %s\n", moe_dtype_name(t), what, moe_dtype_name(dt), R,
            K, same ? "identical" : "DIFFERS");
    cr_expect(same, "%s (%s): device %s planes differ from the host's quantization", what, moe_dtype_name(dt),
              moe_dtype_name(t));
    free(rows), free(want), free(got), free(f);
}

static const char *planes_scales(const struct moe_tensor *t)
{
    return (const char *)t->data + moe_planes_values_bytes(t->dtype, (size_t)t->shape[0], (size_t)t->shape[1]);
}

/* --quantize q4's dtype for rows of K values (of an expert: K = F when
 * D is a multiple of 256): the CPU backend's rule. */
static enum moe_dtype q4_dtype(int64_t K) { return K % 256 == 0 ? MOE_DTYPE_Q4_K : MOE_DTYPE_Q4_1; }

/* The device twin d of the host model h, prepared with --quantize q8_0
 * (q4: false) or q4 (true), holds in its projections, experts and LM head
 * the host's quantization of h's weights (of dtype dt), byte for byte
 * (q4: Q4_K where rows are multiples of 256, else Q4_1; the LM head
 * Q8_0); its router and embedding keep their dtype. */
static void expect_quant_model(const struct moe_model *h, const struct moe_model *d, enum moe_dtype dt, bool q4)
{
    const struct moe_config *c = &h->cfg;
    const int D = c->d_model, F = c->d_expert, E = c->n_experts, L = c->n_layers, xl = L > 1 ? 1 : 0;
    const enum moe_dtype qt = q4 ? q4_dtype(D % 256 ? D : F) : MOE_DTYPE_Q8_0; /* the experts' */
    cr_expect_eq(d->layers[0].router.dtype, dt, "the router keeps its dtype");
    cr_expect_eq(d->embed.dtype, dt, "the embedding keeps its dtype");
    const struct { const char *what; const struct moe_tensor *h, *d; } mats[] = {
        {"q_proj 0", &h->layers[0].wq, &d->layers[0].wq}, {"o_proj 0", &h->layers[0].wo, &d->layers[0].wo},
        {"k_proj last", &h->layers[L - 1].wk, &d->layers[L - 1].wk}, {"lm_head", &h->lm_head, &d->lm_head}};
    for (size_t j = 0; j < sizeof mats / sizeof *mats; j++) {
        const enum moe_dtype want = j == 3 || !q4 ? MOE_DTYPE_Q8_0 : q4_dtype(mats[j].h->shape[1]); /* the LM head: Q8_0 */
        cr_expect(mats[j].d->dtype == want && mats[j].d->device >= 0, "%s", mats[j].what);
        if (mats[j].d->dtype != want) continue;
        expect_quant_planes(mats[j].what, mats[j].h->data, dt, want, mats[j].d->data, planes_scales(mats[j].d),
                            (size_t)mats[j].h->shape[0], (size_t)mats[j].h->shape[1]);
    }
    const struct moe_expert_weights *a = &h->layers[xl].experts, *b = &d->layers[xl].experts;
    cr_assert_eq(b->dtype, qt);
    const size_t S = moe_planes_scales_bytes(qt, (size_t)F, (size_t)D);
    const char *gus = (const char *)b->gate[0] + moe_planes_values_bytes(qt, 2 * (size_t)F * E, (size_t)D);
    const char *dns = (const char *)b->down[0] + moe_planes_values_bytes(qt, (size_t)D * E, (size_t)F);
    for (int e = 0; e < E; e += E > 8 ? 7 : 1) {
        expect_quant_planes("expert gate", a->gate[e], dt, qt, b->gate[e], gus + 2 * e * S, (size_t)F, (size_t)D);
        expect_quant_planes("expert up", a->up[e], dt, qt, b->up[e], gus + (2 * e + 1) * S, (size_t)F, (size_t)D);
        expect_quant_planes("expert down", a->down[e], dt, qt, b->down[e], dns + e * S, (size_t)D, (size_t)F);
    }
}

/* prepare_model with --quantize q8_0 quantizes on the device what the CPU
 * backends quantize (projections, experts, the LM head; not the routers
 * or the embedding), to the host's bytes, from f32 and bf16 weights. */
Test(cuda_quant, q8_0_upload_equals_host_quantization)
{
    const enum moe_dtype dts[] = {MOE_DTYPE_F32, MOE_DTYPE_BF16};
    reopen_gpu_q8();
    for (int i = 0; i < 2; i++) {
        struct moe_model h, d;
        q8_model(&h, dts[i]);
        q8_model(&d, dts[i]);
        cr_assert_eq(gpu.ops->prepare_model(&gpu, &d), MOE_OK, "%s", moe_last_error());
        expect_quant_model(&h, &d, dts[i], false);
        moe_model_free(&d);
        moe_model_free(&h);
    }
}

/* --quantize q4: the same weights to Q4_K where rows are multiples of 256
 * (tiny-moe's attention; its experts too when F is 256), else Q4_1 (the
 * LM head to Q8_0), the host's bytes, from f32 and bf16 weights with
 * q8_model's edge blocks (zeros: d = 0; subnormal spreads; halves at the
 * rounding boundary) */
Test(cuda_quant, q4_upload_equals_host_quantization)
{
    const enum moe_dtype dts[] = {MOE_DTYPE_F32, MOE_DTYPE_BF16};
    reopen_gpu_quant(MOE_QUANT_Q4);
    for (int i = 0; i < 4; i++) {
        struct moe_model h, d;
        const int F = i < 2 ? 0 : 256; /* tiny-moe's 128 (Q4_1 experts), or 256 (Q4_K) */
        q8_model_f(&h, dts[i % 2], F);
        q8_model_f(&d, dts[i % 2], F);
        cr_assert_eq(gpu.ops->prepare_model(&gpu, &d), MOE_OK, "%s", moe_last_error());
        expect_quant_model(&h, &d, dts[i % 2], true);
        moe_model_free(&d);
        moe_model_free(&h);
    }
}

/* The same at a size the host emulation's CI selection can afford
 * (tools/cuda-emu/ci-tests.txt): two layers of four 256 x 256 experts
 * (Q4_K throughout), bf16. */
Test(cuda_quant, q4_k_upload_small_equals_host_quantization)
{
    reopen_gpu_quant(MOE_QUANT_Q4);
    struct moe_model h, d;
    q8_model_shape(&h, MOE_DTYPE_BF16, 256, 2, 4);
    q8_model_shape(&d, MOE_DTYPE_BF16, 256, 2, 4);
    cr_assert_eq(gpu.ops->prepare_model(&gpu, &d), MOE_OK, "%s", moe_last_error());
    expect_quant_model(&h, &d, MOE_DTYPE_BF16, true);
    moe_model_free(&d);
    moe_model_free(&h);
}

/* A deferred synthetic model (moerun bench --synthetic: weights made on
 * the device, then quantized there) holds the quantization of the host
 * generator's weights. */
Test(cuda_quant, q8_0_upload_of_weights_made_on_the_device)
{
    reopen_gpu_q8();
    struct moe_config cfg;
    struct moe_model h, d;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(&h, &cfg, MOE_DTYPE_BF16, 12), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_model_synthetic_deferred(&d, &cfg, MOE_DTYPE_BF16, 12), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(gpu.ops->prepare_model(&gpu, &d), MOE_OK, "%s", moe_last_error());
    expect_quant_model(&h, &d, MOE_DTYPE_BF16, false);
    moe_model_free(&d);
    moe_model_free(&h);
}

/* A weight that is not finite fails prepare_model with the weight named. */
Test(cuda_quant, q8_0_refuses_weights_that_are_not_finite)
{
    reopen_gpu_q8();
    struct moe_model m;
    q8_model(&m, MOE_DTYPE_F32);
    ((float *)m.layers[1].wv.data)[77] = NAN;
    cr_expect_neq(gpu.ops->prepare_model(&gpu, &m), MOE_OK);
    cr_expect(strstr(moe_last_error(), "weight of layer 1 holds a value that is not finite"), "%s",
              moe_last_error());
    moe_model_free(&m);
    q8_model(&m, MOE_DTYPE_F32);
    ((float *)m.layers[2].experts.down[5])[3] = INFINITY;
    cr_expect_neq(gpu.ops->prepare_model(&gpu, &m), MOE_OK);
    cr_expect(strstr(moe_last_error(), "an expert of MoE layer 2 holds a value that is not finite"), "%s",
              moe_last_error());
    moe_model_free(&m);
}

/* The same with --quantize q4, Q4_K (tiny-moe's attention; experts of
 * 256 x 256) and Q4_1 (its experts of 256 x 128); two layers of four
 * experts. */
Test(cuda_quant, q4_refuses_weights_that_are_not_finite)
{
    reopen_gpu_quant(MOE_QUANT_Q4);
    const struct { int F; const char *want; } cases[] = {
        {0, "weight of layer 1 holds a value that is not finite"},    /* v_proj: Q4_K */
        {0, "an expert of MoE layer 1 holds a value that is not finite"},   /* Q4_1 */
        {256, "an expert of MoE layer 1 holds a value that is not finite"}, /* Q4_K */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct moe_model m;
        q8_model_shape(&m, MOE_DTYPE_F32, cases[i].F, 2, 4);
        if (strstr(cases[i].want, "expert")) ((float *)m.layers[1].experts.down[3])[300] = INFINITY;
        else ((float *)m.layers[1].wv.data)[300] = NAN;
        cr_expect_neq(gpu.ops->prepare_model(&gpu, &m), MOE_OK, "case %zu", i);
        cr_expect(strstr(moe_last_error(), cases[i].want) && strstr(moe_last_error(), "--quantize q4"),
                  "case %zu: %s", i, moe_last_error());
        moe_model_free(&m);
    }
}

/* Logits for every row of an S-token prompt of m on backend `name` with
 * weights quantized as q (gpu_experts, cpu_rows: the CUDA offload's). */
static void quant_logits(struct moe_model *m, const char *name, enum moe_weight_quant q, int S, int gpu_experts,
                         int cpu_rows, float *logits)
{
    struct moe_backend be;
    cr_assert_eq(tu_backend_init_with(&be, name, q, gpu_experts, cpu_rows), MOE_OK, "%s", moe_last_error());
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = S, .max_seqs = 1, .max_logits = S, .block_size = 8, .n_blocks = 32};
    cr_assert_eq(moe_runner_init(&r, m, &be, &o), MOE_OK, "%s", moe_last_error());
    int32_t prompt[128];
    cr_assert(S <= 128);
    tu_prompt_logits_n(&r, m->cfg.vocab, S, prompt, logits);
    moe_runner_free(&r);
    moe_backend_free(&be);
}

/* The logits of tiny-moe (f32 weights, edges planted) quantized as q on
 * the CPU reference and on the GPU, S tokens; the worst relative error
 * must be at most tol. */
static void check_quant_model(enum moe_weight_quant q, int S, double tol, const char *what, int F)
{
    const int V = 1024;
    float *ref = malloc((size_t)S * V * 4), *got = malloc((size_t)S * V * 4);
    struct moe_model m;
    q8_model_f(&m, MOE_DTYPE_F32, F);
    quant_logits(&m, "cpu-ref", q, S, 0, 0, ref);
    moe_model_free(&m);
    q8_model_f(&m, MOE_DTYPE_F32, F);
    quant_logits(&m, "cuda", q, S, 0, 0, got);
    moe_model_free(&m);
    char shp[64];
    snprintf(shp, sizeof shp, "tiny-moe S%d %s", S, what);
    const double e = report(q == MOE_QUANT_Q4 ? "q4_model" : "q8_0_model", "F32", shp, got, ref, (size_t)S * V);
    cr_expect(e <= tol, "%s: %.3g", shp, e);
    free(ref), free(got);
}

/* A model quantized on the GPU computes what the CPU's quantized model
 * does: a 20-token prompt on the device-driven kernels, fp32 throughout
 * (offloaded: q8_0_offload_cpu_misses_match_resident below). */
Test(cuda_quant, q8_0_model_matches_cpu)
{
    check_quant_model(MOE_QUANT_Q8_0, 20, 1e-4, "decode kernels", 0);
}

/* The same with --quantize q4 (Q4_K attention, Q4_1 experts, the LM
 * head Q8_0; then experts of 256 x 256, Q4_K) */
Test(cuda_quant, q4_model_matches_cpu)
{
    check_quant_model(MOE_QUANT_Q4, 20, 1e-4, "decode kernels", 0);
    check_quant_model(MOE_QUANT_Q4, 20, 1e-4, "decode kernels, Q4_K experts", 256);
}

/* The worst relative error of the OLMoE fixture's logits for an S-token
 * prompt quantized on the GPU with the given offload, against backend
 * ref_name resident. */
static double olmoe_quant_error(enum moe_weight_quant q, int S, const char *ref_name, int gpu_experts, int cpu_rows,
                                const char *what)
{
    struct moe_model m;
    cr_assert_eq(moe_model_load(&m, FIXTURE_DIR "/olmoe"), MOE_OK, "%s", moe_last_error());
    const int V = m.cfg.vocab;
    float *ref = malloc((size_t)S * V * 4), *got = malloc((size_t)S * V * 4);
    quant_logits(&m, ref_name, q, S, 0, 0, ref);
    moe_model_free(&m);
    cr_assert_eq(moe_model_load(&m, FIXTURE_DIR "/olmoe"), MOE_OK, "%s", moe_last_error());
    quant_logits(&m, "cuda", q, S, gpu_experts, cpu_rows, got);
    moe_model_free(&m);
    const double e = report(q == MOE_QUANT_Q4 ? "q4_model" : "q8_0_model", "BF16", what, got, ref, (size_t)S * V);
    free(ref), free(got);
    return e;
}

/* The OLMoE fixture quantized on the GPU, an 8-token prompt on the decode
 * kernels, against the CPU reference's quantization (bf16 router inputs on
 * the device: 2e-2): the host emulation's CI selection
 * (tools/cuda-emu/ci-tests.txt). */
Test(cuda_quant, q8_0_model_short_matches_cpu)
{
    const double e = olmoe_quant_error(MOE_QUANT_Q8_0, 8, "cpu-ref", 0, 0, "olmoe S8 decode kernels");
    cr_expect(e <= 2e-2, "olmoe S8: %.3g", e);
}

/* Offloaded, misses of more than 2 rows copied to the device and the
 * others computed on the CPU: those take the fast CPU kernels, which
 * quantize their inputs over Q8_0 (runtime/cpu/gemm_q8.c), so the OLMoE
 * fixture (trained routers, no near-ties moved by such rounding in this
 * prompt), 4 of its 8 experts resident, against the same model all
 * resident (both route with the device's bf16 router inputs: against the
 * CPU reference, row 8 of this prompt flips an expert at a near-tie,
 * resident or not). */
Test(cuda_quant, q8_0_offload_cpu_misses_match_resident)
{
    const double e = olmoe_quant_error(MOE_QUANT_Q8_0, 20, "cuda", 4, 2, "olmoe S20 offload 4, CPU rows 2");
    cr_expect(e <= 2e-2, "olmoe S20 offload 4, CPU rows 2 against resident: %.3g", e);
}

/* The same with --quantize q4 (Q4_1, the LM head Q8_0) */
Test(cuda_quant, q4_model_short_matches_cpu)
{
    const double e = olmoe_quant_error(MOE_QUANT_Q4, 8, "cpu-ref", 0, 0, "olmoe S8 decode kernels");
    cr_expect(e <= 2e-2, "olmoe S8 q4: %.3g", e);
}

/* Q4_1 widened for the grouped GEMMs and projections (40 rows) */
Test(cuda_quant, q4_model_grouped_matches_cpu)
{
    const double e = olmoe_quant_error(MOE_QUANT_Q4, 40, "cpu-ref", 0, 0, "olmoe S40 grouped (widened)");
    cr_expect(e <= 2e-2, "olmoe S40 q4 grouped: %.3g", e);
}

/* The OLMoE fixture's 40-token prompt (10 rows an expert) quantized on the
 * GPU, on the widened grouped GEMMs and projections: bf16 activations, as
 * for the bf16 model (9.8e-3 of the CPU), and weights rounded to bf16 when widened
 * (q x d has up to 18 significant bits), so 2e-2 (tiny-moe's random
 * routers flip experts on such rounding: its logits move too far to
 * compare). */
Test(cuda_quant, q8_0_model_grouped_matches_cpu)
{
    const double e = olmoe_quant_error(MOE_QUANT_Q8_0, 40, "cpu-ref", 0, 0, "olmoe S40 grouped (widened)");
    cr_expect(e <= 2e-2, "olmoe S40 grouped: %.3g", e);
}
