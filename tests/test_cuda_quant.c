/* test_cuda_quant.c - MXFP4, FP8_B128, Q8_0, four-bit and Q6_K weights
 * read in place on the GPU against the CPU ops reading the same weights,
 * and --quantize's formats made on the device against the host's bytes
 * and a quantized model's logits on the CPU.
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
#include "tests/cuda_quant_test.h"


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


Test(cuda_quant, planes_matmul_matches_cpu)
{
    const enum moe_dtype dts[] = {MOE_DTYPE_FP8_B128, MOE_DTYPE_MXFP4,  MOE_DTYPE_Q8_0, MOE_DTYPE_Q4_1,
                                  MOE_DTYPE_Q4_G32,   MOE_DTYPE_Q4_G128, MOE_DTYPE_Q4_K, MOE_DTYPE_Q6_K};
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
    const enum moe_dtype dts[] = {MOE_DTYPE_FP8_B128, MOE_DTYPE_MXFP4,  MOE_DTYPE_Q8_0, MOE_DTYPE_Q4_1,
                                  MOE_DTYPE_Q4_G32,   MOE_DTYPE_Q4_G128, MOE_DTYPE_Q4_K, MOE_DTYPE_Q6_K};
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
    check_quant_experts(MOE_DTYPE_Q6_K, 4, 4, 2, 256, 256, true);
    /* --quantize q4_k_m's down projections beside four-bit gate and up */
    check_quant_experts_down(MOE_DTYPE_Q4_K, MOE_DTYPE_Q6_K, 4, 4, 2, 256, 256, false);
    check_quant_experts_down(MOE_DTYPE_Q4_K, MOE_DTYPE_Q6_K, 40, 4, 2, 256, 256, true);
    check_quant_experts_down(MOE_DTYPE_Q4_1, MOE_DTYPE_Q8_0, 40, 4, 2, 64, 96, false);
}

/* Q6_K experts (--quantize q4_k_m's down projections, there beside Q4_K
 * or Q4_1 gate and up) on the decode kernels and widened for the grouped
 * GEMMs */
Test(cuda_quant, q6_k_experts_match_cpu)
{
    check_quant_experts(MOE_DTYPE_Q6_K, 1, 8, 2, 256, 512, false);
    check_quant_experts(MOE_DTYPE_Q6_K, 32, 16, 4, 1024, 256, false); /* several row tiles */
    check_quant_experts(MOE_DTYPE_Q6_K, 300, 16, 4, 256, 256, false); /* widened, grouped */
    check_quant_experts_down(MOE_DTYPE_Q4_K, MOE_DTYPE_Q6_K, 1, 8, 2, 256, 512, true);
    check_quant_experts_down(MOE_DTYPE_Q4_K, MOE_DTYPE_Q6_K, 300, 16, 4, 256, 256, false);
    check_quant_experts_down(MOE_DTYPE_Q4_1, MOE_DTYPE_Q8_0, 4, 8, 2, 128, 96, false);
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
        expect_quant_model(&h, &d, dts[i], MOE_QUANT_Q8_0);
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
        expect_quant_model(&h, &d, dts[i % 2], MOE_QUANT_Q4);
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
    expect_quant_model(&h, &d, MOE_DTYPE_BF16, MOE_QUANT_Q4);
    moe_model_free(&d);
    moe_model_free(&h);
}

/* --quantize q4_k_m: tiny-moe's two layers of four 256 x 256 experts in
 * bf16, layer 1 "using more bits" (Q6_K down projections and V beside Q4_K,
 * the LM head Q6_K), the host's bytes from the device's Q4_K and Q6_K
 * quantizers; with 8 experts K and V at Q8_0 too.  The host emulation's CI
 * selection (tools/cuda-emu/ci-tests.txt). */
Test(cuda_quant, q4_k_m_upload_small_equals_host_quantization)
{
    reopen_gpu_quant(MOE_QUANT_Q4_K_M);
    for (int E = 4; E <= 8; E += 4) {
        struct moe_model h, d;
        q8_model_shape(&h, MOE_DTYPE_BF16, 256, 2, E);
        q8_model_shape(&d, MOE_DTYPE_BF16, 256, 2, E);
        cr_assert_eq(gpu.ops->prepare_model(&gpu, &d), MOE_OK, "%s", moe_last_error());
        cr_expect_eq(d.lm_head.dtype, MOE_DTYPE_Q6_K);
        cr_expect_eq(moe_expert_down_dtype(&d.layers[1].experts, 0), MOE_DTYPE_Q6_K);
        expect_quant_model(&h, &d, MOE_DTYPE_BF16, MOE_QUANT_Q4_K_M);
        moe_model_free(&d);
        moe_model_free(&h);
    }
}

/* q4_k_m keeps one dtype a stack where the offload needs it: refused with
 * the option named, never run with the wrong dtype. */
Test(cuda_quant, q4_k_m_refuses_offload)
{
    moe_backend_free(&gpu);
    cr_assert_eq(tu_backend_init_with(&gpu, "cuda", MOE_QUANT_Q4_K_M, 2, 0), MOE_OK, "%s", moe_last_error());
    struct moe_model m;
    q8_model_shape(&m, MOE_DTYPE_BF16, 256, 2, 4);
    cr_expect_neq(gpu.ops->prepare_model(&gpu, &m), MOE_OK);
    cr_expect(strstr(moe_last_error(), "--gpu-experts with --quantize q4_k_m's Q6_K down projections"), "%s",
              moe_last_error());
    moe_model_free(&m);
}

/* --quantize q5_k and q5_k_m make ggml's Q5_K, which only the CPU
 * backends read: refused with the option and the format named. */
Test(cuda_quant, q5_k_is_refused)
{
    const enum moe_weight_quant qs[2] = {MOE_QUANT_Q5_K, MOE_QUANT_Q5_K_M};
    const char *names[2] = {"--quantize q5_k ", "--quantize q5_k_m "};
    for (int i = 0; i < 2; i++) {
        moe_backend_free(&gpu);
        cr_assert_eq(tu_backend_init_with(&gpu, "cuda", qs[i], 0, 0), MOE_OK, "%s", moe_last_error());
        struct moe_model m;
        q8_model_shape(&m, MOE_DTYPE_BF16, 256, 2, 4);
        cr_expect_eq(gpu.ops->prepare_model(&gpu, &m), MOE_ERR_UNSUPPORTED);
        cr_expect(strstr(moe_last_error(), names[i]) && strstr(moe_last_error(), "Q5_K"), "%s", moe_last_error());
        moe_model_free(&m);
    }
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
    expect_quant_model(&h, &d, MOE_DTYPE_BF16, MOE_QUANT_Q8_0);
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

/* --quantize q4_k_m end to end against the CPU reference's: tiny-moe's
 * two layers of four 256 x 256 experts in f32 (Q6_K down projections, V
 * and LM head beside Q4_K; fp32 on the decode kernels: 1e-4, the same
 * greedy tokens), and the OLMoE fixture (rows of 64 and 32: Q4_1, its
 * Q6_K choices Q8_0; bf16 router inputs on the device: 2e-2).  The host
 * emulation's CI selection (tools/cuda-emu/ci-tests.txt). */
Test(cuda_quant, q4_k_m_model_short_matches_cpu)
{
    check_quant_model_shape(MOE_QUANT_Q4_K_M, 8, 1e-4, "decode kernels, Q6_K", 256, 2, 4, true);
    const double e = olmoe_quant_error(MOE_QUANT_Q4_K_M, 8, "cpu-ref", 0, 0, "olmoe S8 decode kernels");
    cr_expect(e <= 2e-2, "olmoe S8 q4_k_m: %.3g", e);
}
