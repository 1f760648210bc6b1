/* test_quant.c - Q8_0 weights (--quantize q8_0): the blocks equal gguf-py's
 * (tests/fixtures/quant, made by tests/reference/make_quant_fixtures.py), the
 * reference kernels multiply them as the dequantized values, the fast ones
 * with the inputs quantized per block as well (within the bound that
 * rounding allows), and
 * the CPU backends quantize a model's weights at prepare_model, keeping the
 * routers and the embedding, refusing weights that are not finite.
 * MXFP4 weights (gpt-oss experts): rows repacked from the checkpoint layout
 * dequantize to transformers' values bit for bit, every kernel set
 * multiplies them as those values, and the CPU backends read them in place
 * (never repacked or requantized). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/engine/runner.h"
#include "runtime/model/safetensors.h"
#include "tests/quant_test.h"
#include "tests/testutil.h"

Test(quant, q8_0_blocks_equal_gguf_py)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/q8_0.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    const struct moe_st_tensor *x = moe_safetensors_find(&st, "x"), *q = moe_safetensors_find(&st, "q8_0"),
                               *d = moe_safetensors_find(&st, "dequant");
    cr_assert(x && q && d);
    const int R = (int)x->shape[0], K = (int)x->shape[1], nb = K / MOE_Q8_0_BLOCK;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)K), grb = (size_t)q->shape[1];
    cr_assert_eq(grb, (size_t)nb * 34, "ggml blocks: f16 scale + 32 int8");
    unsigned char *got = malloc(rb);
    float *back = malloc((size_t)K * sizeof(float));
    for (int r = 0; r < R; r++) {
        cr_assert(moe_quantize_row_q8_0(got, (const float *)x->data + (size_t)r * K, (size_t)K));
        const unsigned char *want = (const unsigned char *)q->data + (size_t)r * grb;
        for (int b = 0; b < nb; b++) { /* ours: f32 scale (the f16 widened), then the same 32 q */
            const unsigned char *g = got + (size_t)b * MOE_Q8_0_BYTES, *w = want + (size_t)b * 34;
            uint16_t h;
            float d;
            memcpy(&h, w, 2);
            memcpy(&d, g, 4);
            cr_assert_eq(d, moe_f16_to_f32(h), "row %d block %d: scale %g, gguf-py %g", r, b, d,
                         moe_f16_to_f32(h));
            for (int j = 0; j < 32; j++)
                cr_assert_eq(g[4 + j], w[2 + j], "row %d block %d q %d: %d, gguf-py %d", r, b, j,
                             (int8_t)g[4 + j], (int8_t)w[2 + j]);
        }
        moe_convert_row_f32(back, got, MOE_DTYPE_Q8_0, (size_t)K);
        cr_assert(memcmp(back, (const float *)d->data + (size_t)r * K, (size_t)K * sizeof(float)) == 0,
                  "row %d: dequantized values differ from gguf-py's", r);
    }
    /* not finite, or a scale past f16: refused */
    float bad[32] = {0};
    bad[7] = NAN;
    cr_expect_not(moe_quantize_row_q8_0(got, bad, 32));
    bad[7] = INFINITY;
    cr_expect_not(moe_quantize_row_q8_0(got, bad, 32));
    bad[7] = 1e10f;
    cr_expect_not(moe_quantize_row_q8_0(got, bad, 32));
    free(got);
    free(back);
    moe_safetensors_close(&st);
}

/* (N, Din) random weights in [-1, 1) as Q8_0 (new memory). */
static void *q8_weights(int N, int Din, uint64_t seed)
{
    float *f = malloc((size_t)N * Din * sizeof(float));
    tu_fill_uniform(f, (size_t)N * Din, seed, -1, 1);
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)Din);
    unsigned char *w = malloc((size_t)N * rb);
    for (int n = 0; n < N; n++) cr_assert(moe_quantize_row_q8_0(w + (size_t)n * rb, f + (size_t)n * Din, (size_t)Din));
    free(f);
    return w;
}

/* What the fast kernels compute over Q8_0 (runtime/cpu/gemm_q8.c says it):
 * the input row quantized per block of 32 (dx = amax / 127, q = x * (127 /
 * amax) rounded to nearest even), each block's integer sum exact, times
 * dw * dx (an fp32 product); summed here in double.  abs: the sum of the
 * magnitudes of the kernels' partial sums (fp32 rounding is relative to
 * it); bound: how far the input rounding can move the exact
 * product of x with the dequantized weights (dx / 2 per element, an ulp
 * of slack). */
static double q8_spec_dot(const float *x, const unsigned char *wrow, int D, double *abs, double *bound)
{
    double s = 0;
    *abs = *bound = 0;
    for (int b = 0; b < D / MOE_Q8_0_BLOCK; b++) {
        const float *xb = x + (size_t)b * MOE_Q8_0_BLOCK;
        const unsigned char *wb = wrow + (size_t)b * MOE_Q8_0_BYTES;
        float amax = 0, dw;
        for (int j = 0; j < MOE_Q8_0_BLOCK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float dx = amax / 127.0f, id = amax >= 127.0f * FLT_MIN ? 127.0f / amax : 0.0f;
        memcpy(&dw, wb, 4);
        long isum = 0, lanes = 0, wsum = 0;
        for (int j = 0; j < MOE_Q8_0_BLOCK; j += 4) { /* the kernels' lanes: 4 elements each */
            long lane = 0;
            for (int i = j; i < j + 4; i++) {
                lane += (long)(int8_t)wb[4 + i] * (long)nearbyintf(xb[i] * id);
                wsum += labs((long)(int8_t)wb[4 + i]);
            }
            isum += lane;
            lanes += labs(lane);
        }
        s += (double)isum * (double)(dw * dx);
        *abs += (double)lanes * fabs((double)(dw * dx));
        *bound += 0.5001 * (double)wsum * fabs((double)dw) * (double)dx;
    }
    return s;
}

/* The fast kernels over Q8_0 quantize the input rows too: every output is
 * the expression above to fp32 rounding, within the input rounding's bound
 * of the reference GEMM (which dequantizes the weights and keeps the fp32
 * inputs); a row gives the same bits alone or in any batch, and every
 * kernel set the same bits; a row holding a NaN or an infinity gives NaN
 * outputs and leaves the other rows alone. */
Test(quant, fast_gemm_q8_0_quantizes_inputs_per_block)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("this processor runs no fast kernel set");
    const int Ts[] = {1, 2, 3, 4, 5, 7, 12, 67, 130}, Ns[] = {1, 5, 13, 50, 97}, Ds[] = {32, 64, 96, 256};
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
        for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
            for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++) {
                const int T = Ts[a], N = Ns[b], D = Ds[c];
                const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)D);
                unsigned char *w = q8_weights(N, D, (uint64_t)(T * 131 + N * 7 + D));
                float *x = malloc((size_t)T * D * sizeof(float)), *ref = malloc((size_t)T * N * 4),
                      *got = malloc((size_t)T * N * 4), *other = malloc((size_t)T * N * 4),
                      *one = malloc((size_t)N * 4), *scratch = malloc((size_t)D * 64 * sizeof(float));
                tu_fill_uniform(x, (size_t)T * D, (uint64_t)(T + N + D), -1, 1);
                for (int t = 0; t < T; t++) /* rows of other scales, and a zero block */
                    for (int k = 0; k < D; k++) x[(size_t)t * D + k] *= (float)(1 + t % 5) * (t % 3 ? 1.0f : 1e-3f);
                memset(x, 0, MOE_Q8_0_BLOCK * sizeof(float));
                moe_gemm_cpu(ref, N, x, D, w, MOE_DTYPE_Q8_0, N, D, T, NULL, scratch);
                char what[96];
                snprintf(what, sizeof what, "q8_0 gemm T=%d N=%d Din=%d", T, N, D);
                moe_gemm_fast(MOE_CPU_ISA_AVX2, got, N, x, D, w, MOE_DTYPE_Q8_0, N, D, T, NULL);
                double worst = 0, worst_ref = 0;
                for (int t = 0; t < T; t++)
                    for (int n = 0; n < N; n++) {
                        double abs, bound;
                        const double want = q8_spec_dot(x + (size_t)t * D, w + (size_t)n * rb, D, &abs, &bound);
                        const double g = got[(size_t)t * N + n], r = ref[(size_t)t * N + n];
                        const double e = fabs(g - want) / (abs + 1e-30), er = fabs(g - r) / (bound + 1e-30);
                        worst = e > worst ? e : worst;
                        worst_ref = er > worst_ref ? er : worst_ref;
                        cr_assert(fabs(g - want) <= 1e-6 * abs + 1e-12, "%s [%d,%d]: %.9g, the expression %.9g",
                                  what, t, n, g, want);
                        cr_assert(fabs(g - r) <= bound + 1e-5 * abs + 1e-9,
                                  "%s [%d,%d]: %.9g, reference %.9g: beyond the input rounding's bound %.3g",
                                  what, t, n, g, r, bound);
                    }
                if (T == 130 && N == 97 && D == 256)
                    cr_log_info("%s: worst |error| %.2g of the terms' sum; %.2f of the rounding bound from the reference",
                                what, worst, worst_ref);
                qt_check_int8_invariants(what, best, x, D, w, MOE_DTYPE_Q8_0, N, T, NULL, got, other, one);
                free(w);
                free(x);
                free(ref);
                free(got);
                free(other);
                free(one);
                free(scratch);
            }
}

/* rows (T, N) of y from the AVX2 and VNNI instances are the same bits;
 * the first mismatch named. */
static void expect_same_bits(const char *what, const float *a, const float *v, int T, int N, size_t ldy, int n0)
{
    for (int t = 0; t < T; t++)
        for (int n = n0; n < N; n++) {
            const float x = a[(size_t)t * ldy + n], y = v[(size_t)t * ldy + n];
            uint32_t bx, by;
            memcpy(&bx, &x, 4), memcpy(&by, &y, 4);
            if (bx != by)
                cr_assert_fail("%s [%d,%d]: vnni %.9g (0x%08x), avx2 %.9g (0x%08x)", what, t, n, y, by, x, bx);
        }
}

/* The awkward case of the Q8_0 kernel tests for N x D weights and tmax
 * input rows: weights (q8_weights) with a zero block and codes of -128 (a
 * GGUF file may hold them); inputs of several scales per row with a zero
 * block in row 3, a block near 1e-38 in row 4 (too small to scale: zero
 * codes) and a NaN in row 5; a bias of N.  Free the three. */
static void q8_awkward(int N, int D, int tmax, unsigned char **w, float **x, float **bias)
{
    const int nb = D / MOE_Q8_0_BLOCK;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)D);
    *w = q8_weights(N, D, (uint64_t)(N * 7 + D));
    memset(*w + (size_t)(N - 1) * rb + (size_t)(nb - 1) * MOE_Q8_0_BYTES + 4, 0, 32); /* a zero block */
    for (int n = 0; n < N; n += 2) /* -128 codes */
        (*w)[(size_t)n * rb + (size_t)(n % nb) * MOE_Q8_0_BYTES + 4 + (size_t)(n % 32)] = 0x80;
    *x = malloc((size_t)tmax * D * sizeof(float));
    *bias = malloc((size_t)N * 4);
    tu_fill_uniform(*x, (size_t)tmax * D, (uint64_t)(N + D), -1, 1);
    for (int t = 0; t < tmax; t++)
        for (int k = 0; k < D; k++) (*x)[(size_t)t * D + k] *= (float)(1 + t % 5) * (t % 3 ? 1.0f : 1e-3f);
    memset(*x + (size_t)D * 3 + (size_t)(nb - 1) * MOE_Q8_0_BLOCK, 0, MOE_Q8_0_BLOCK * sizeof(float));
    for (int k = 0; k < MOE_Q8_0_BLOCK; k++) (*x)[(size_t)D * 4 + k] *= 1e-38f; /* below 127 FLT_MIN: zero codes */
    (*x)[(size_t)D * 5 + (size_t)(nb / 2) * MOE_Q8_0_BLOCK + 7] = NAN;
    tu_fill_uniform(*bias, (size_t)N, (uint64_t)N, -1, 1);
}

/* The AVX-512 set's Q8_0 kernel where the processor has AVX512-VNNI
 * (gemm_q8_vnni.c) gives the AVX2 kernel's bits (gemm_q8.c) on awkward
 * shapes: every T from 1 to 40 (tiles of 8 and 1 input rows and their
 * remainders), Din of 1 to 129 blocks, N not a multiple of any tile and a
 * slice [n0, N) not starting at 0, with and without bias; the inputs hold
 * a zero block, rows of other scales and a row with a NaN block, the
 * weights a zero block and codes of -128 (a GGUF file may hold them). */
Test(quant, q8_0_vnni_kernel_matches_avx2_bit_for_bit)
{
    __builtin_cpu_init();
    if (moe_cpu_isa_detect() < MOE_CPU_ISA_AVX512 || !__builtin_cpu_supports("avx512vnni"))
        cr_skip_test("this processor lacks AVX-512 with AVX512-VNNI: no VNNI instance of the Q8_0 kernel to check");
    enum { TMAX = 40 };
    const int Ds[] = {32, 64, 96, 4096 + 32}, Ns[] = {1, 2, 3, 7, 13, 37};
    for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++)
        for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++) {
            const int D = Ds[c], N = Ns[a];
            unsigned char *w;
            float *x, *bias, *ya = malloc((size_t)TMAX * N * 4), *yv = malloc((size_t)TMAX * N * 4);
            q8_awkward(N, D, TMAX, &w, &x, &bias);
            const struct moe_tensor bt = {.dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {N}, .data = bias, .device = -1};
            for (int T = 1; T <= TMAX; T++) {
                const int n0 = T % 2 ? 0 : N / 3; /* a slice of the outputs */
                const struct moe_tensor *b = T % 3 == 1 ? &bt : NULL;
                char what[96];
                snprintf(what, sizeof what, "q8_0 T=%d N=%d Din=%d n0=%d%s", T, N, D, n0, b ? " +bias" : "");
                memset(ya, 0, (size_t)T * N * 4);
                memset(yv, 0, (size_t)T * N * 4);
                moe_gemm_fast_rows(MOE_CPU_ISA_AVX2, ya, (size_t)N, x, (size_t)D, T, w, MOE_DTYPE_Q8_0, D, n0, N, b);
                moe_gemm_fast_rows(MOE_CPU_ISA_AVX512, yv, (size_t)N, x, (size_t)D, T, w, MOE_DTYPE_Q8_0, D, n0, N,
                                   b);
                expect_same_bits(what, ya, yv, T, N, (size_t)N, n0);
                if (T > 5) cr_assert(isnan(yv[(size_t)5 * N + n0]), "%s: row 5 holds a NaN input", what);
            }
            free(w), free(x), free(bias), free(ya), free(yv);
        }
}

/* The Q8_0 kernels' expression (runtime/cpu/gemm_q8.c, gemm_q8_vnni.c and
 * its panels, gemm_q8_amx.c) for one output, in scalar C: the input row quantized per block as
 * moe_quantize_x_q8 does, each block's 32 products summed exactly, then
 * acc = fma(float(S), dx * dw, acc) block by block, then + bias. */
static float q8_0_expr(const float *x, const unsigned char *wrow, int D, float bias)
{
    float acc = 0.0f;
    for (int k = 0; k < D / MOE_Q8_0_BLOCK; k++) {
        const float *xb = x + (size_t)k * MOE_Q8_0_BLOCK;
        const unsigned char *wb = wrow + (size_t)k * MOE_Q8_0_BYTES;
        float amax = 0.0f, dw;
        bool bad = false;
        for (int j = 0; j < MOE_Q8_0_BLOCK; j++) {
            bad |= !isfinite(xb[j]);
            amax = fmaxf(amax, fabsf(xb[j]));
        }
        const float dx = bad ? NAN : amax / 127.0f, id = amax >= 127.0f * FLT_MIN ? 127.0f / amax : 0.0f;
        memcpy(&dw, wb, 4);
        int32_t S = 0;
        for (int j = 0; j < MOE_Q8_0_BLOCK && !bad; j++) S += (int32_t)(int8_t)wb[4 + j] * (int32_t)nearbyintf(xb[j] * id);
        const float sc = dx * dw;
        acc = fmaf((float)S, sc, acc);
    }
    return acc + bias;
}

static unsigned char *q8_weights_of(enum moe_dtype t, int N, int D, uint64_t seed)
{
    (void)t;
    return q8_weights(N, D, seed);
}

/* Every kernel set's Q8_0 kernel (tiles below 14 input rows, the AVX-512
 * set's panels from 14) gives the bits of the expression above
 * (qt_check_expression's shapes and inputs). */
Test(quant, q8_0_kernel_pins_its_expression)
{
    qt_check_expression(MOE_DTYPE_Q8_0, MOE_CPU_ISA_AMX_BF16, q8_weights_of, q8_0_expr);
}

/* The AMX sets' Q8_0 kernel (int8 tiles from 9 input rows, AVX512-VNNI
 * below, 8 or 16 weight rows a pass) gives the bits of the expression above on awkward shapes: every T
 * from 1 to 40 (groups of 16 input rows and their remainders) and 230
 * (two passes of input rows at Din 4128), Din of 1 to 129 blocks, N not a
 * multiple of 16 and a slice [n0, N) not starting at 0, with and without
 * bias; the inputs hold a zero block, rows of other scales and a row with
 * a NaN block, the weights a zero block and codes of -128. */
Test(quant, q8_0_amx_kernel_sums_whole_blocks)
{
    if (moe_cpu_isa_detect() < MOE_CPU_ISA_AMX || !moe_cpu_amx_int8())
        cr_skip_test("this processor (or its kernel) gives no AMX-INT8 tiles: no AMX Q8_0 kernel to check");
    enum { TMAX = 230 };
    const int Ds[] = {32, 64, 96, 4096 + 32}, Ns[] = {1, 2, 3, 7, 13, 17, 37};
    for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++)
        for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++) {
            const int D = Ds[c], N = Ns[a];
            const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)D);
            unsigned char *w;
            float *x, *bias, *y = malloc((size_t)TMAX * N * 4);
            q8_awkward(N, D, TMAX, &w, &x, &bias);
            const struct moe_tensor bt = {.dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {N}, .data = bias, .device = -1};
            for (int T = 1; T <= TMAX; T = T < 40 ? T + 1 : T == 40 && D > 4096 ? TMAX : TMAX + 1) {
                const int n0 = T % 2 ? 0 : N / 3; /* a slice of the outputs */
                const struct moe_tensor *b = T % 3 == 1 ? &bt : NULL;
                memset(y, 0, (size_t)T * N * 4);
                moe_gemm_fast_rows(MOE_CPU_ISA_AMX, y, (size_t)N, x, (size_t)D, T, w, MOE_DTYPE_Q8_0, D, n0, N, b);
                for (int t = 0; t < T; t++)
                    for (int n = n0; n < N; n++) {
                        const float want = q8_0_expr(x + (size_t)t * D, w + (size_t)n * rb, D, b ? bias[n] : 0.0f);
                        const float got = y[(size_t)t * N + n];
                        uint32_t bw, bg;
                        memcpy(&bw, &want, 4), memcpy(&bg, &got, 4);
                        if (bw != bg && !(isnan(want) && isnan(got)))
                            cr_assert_fail("q8_0 amx T=%d N=%d Din=%d n0=%d%s [%d,%d]: %.9g (0x%08x), the expression "
                                           "%.9g (0x%08x)", T, N, D, n0, b ? " +bias" : "", t, n, got, bg, want, bw);
                    }
                if (T > 5) cr_assert(isnan(y[(size_t)5 * N + n0]), "T=%d: row 5 holds a NaN input", T);
            }
            free(w), free(x), free(bias), free(y);
        }
}

/* A synthetic bf16 model prepared with quant on backend `name`: logits of
 * a 20-token prompt (V each) into logits. */
static void run_quantized(const char *name, enum moe_weight_quant q, float *logits, struct moe_model *m)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(m, &cfg, MOE_DTYPE_BF16, 11), MOE_OK, "%s", moe_last_error());
    qt_prompt_logits(m, name, q, logits);
}

/* The same synthetic tiny-moe prepared with --quantize q8_0 by both CPU
 * backends: identical Q8_0 bytes in every quantized matrix (the fast
 * backend quantizes exactly what the reference does). */
static void check_same_q8_bytes(void)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    struct moe_model m[2];
    struct moe_backend be[2];
    const char *names[2] = {"cpu-ref", "cpu"};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(moe_model_synthetic(&m[i], &cfg, MOE_DTYPE_BF16, 11), MOE_OK, "%s", moe_last_error());
        cr_assert_eq(tu_backend_init_with(&be[i], names[i], MOE_QUANT_Q8_0, 0, 0), MOE_OK, "%s",
                     moe_last_error());
        cr_assert_eq(be[i].ops->prepare_model(&be[i], &m[i]), MOE_OK, "%s", moe_last_error());
    }
    const int D = cfg.d_model, Hq = cfg.n_heads * cfg.head_dim;
    const size_t rD = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)D);
    for (int l = 0; l < cfg.n_layers; l++) {
        const struct moe_layer_weights *a = &m[0].layers[l], *b = &m[1].layers[l];
        cr_assert_eq(b->wq.dtype, MOE_DTYPE_Q8_0);
        cr_expect(memcmp(a->wq.data, b->wq.data, (size_t)Hq * rD) == 0, "layer %d: wq bytes differ", l);
        cr_expect(memcmp(a->wo.data, b->wo.data, (size_t)D * moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)Hq)) == 0,
                  "layer %d: wo bytes differ", l);
        const int F = cfg.d_expert;
        for (int e = 0; e < cfg.n_experts; e++)
            cr_expect(memcmp(a->experts.down[e], b->experts.down[e],
                             (size_t)D * moe_dtype_row_bytes(MOE_DTYPE_Q8_0, (size_t)F)) == 0,
                      "layer %d expert %d: down bytes differ", l, e);
    }
    cr_expect(memcmp(m[0].lm_head.data, m[1].lm_head.data, (size_t)cfg.vocab * rD) == 0, "LM head bytes differ");
    for (int i = 0; i < 2; i++) {
        moe_model_free(&m[i]);
        moe_backend_free(&be[i]);
    }
}

/* What gets quantized; the fast backend quantizes the same bytes and its
 * logits (inputs quantized too, gemm_q8.c) stay near the reference's; the
 * quantized model stays near the bf16 one. */
Test(quant, backends_quantize_a_model)
{
    const int V = 1024;
    float *ref = malloc((size_t)20 * V * 4), *fast = malloc((size_t)20 * V * 4), *plain = malloc((size_t)20 * V * 4);
    struct moe_model m;
    run_quantized("cpu-ref", MOE_QUANT_Q8_0, ref, &m);
    const struct moe_layer_weights *w = &m.layers[0];
    cr_expect_eq(w->wq.dtype, MOE_DTYPE_Q8_0);
    cr_expect_eq(w->wo.dtype, MOE_DTYPE_Q8_0);
    cr_expect_eq(w->experts.dtype, MOE_DTYPE_Q8_0);
    cr_expect_eq(m.lm_head.dtype, MOE_DTYPE_Q8_0);
    cr_expect_eq(w->router.dtype, MOE_DTYPE_BF16, "the router keeps its dtype");
    cr_expect_eq(m.embed.dtype, MOE_DTYPE_BF16, "the embedding keeps its dtype");
    moe_model_free(&m);
    run_quantized("cpu-ref", MOE_QUANT_NONE, plain, &m);
    moe_model_free(&m);
    /* random weights route chaotically (one flipped expert moves a row a
     * lot), so the bounds are on the mean; the trained model's KL is
     * checked in test_ppl */
    const double moved = tu_mean_abs_diff(ref, plain, (size_t)20 * V), size = tu_mean_abs_diff(plain, NULL, (size_t)20 * V);
    cr_expect(moved > 0, "quantization must change something");
    cr_expect(moved < 0.1 * size, "q8_0 logits move by %g on average (mean |logit| %g)", moved, size);
    if (moe_cpu_isa_detect() != MOE_CPU_ISA_REF) {
        check_same_q8_bytes();
        run_quantized("cpu", MOE_QUANT_Q8_0, fast, &m);
        cr_expect_eq(m.layers[0].router.dtype, MOE_DTYPE_BF16_PANEL, "bf16 routers still go to panels");
        moe_model_free(&m);
        /* the inputs' rounding is the weights' own size: the fast logits
         * sit no farther from the reference's than the quantization moved
         * those */
        const double apart = tu_mean_abs_diff(fast, ref, (size_t)20 * V);
        cr_log_info("q8_0 logits: fast vs reference %.3g on average, reference vs bf16 %.3g (mean |logit| %.3g)",
                    apart, moved, size);
        cr_expect(apart > 0 && apart < moved, "fast vs reference %g on average, quantization %g", apart, moved);
        if (moe_cpu_isa_detect() >= MOE_CPU_ISA_AMX && moe_cpu_amx_int8()) {
            /* the AMX set: Q8_0 products on the int8 tiles (gemm_q8_amx.c) */
            setenv("MOERUN_CPU_ISA", "amx", 1);
            run_quantized("cpu", MOE_QUANT_Q8_0, plain, &m);
            unsetenv("MOERUN_CPU_ISA");
            moe_model_free(&m);
            const double amx = tu_mean_abs_diff(plain, ref, (size_t)20 * V);
            cr_log_info("q8_0 logits: amx set vs reference %.3g on average", amx);
            cr_expect(amx > 0 && amx < moved, "amx set vs reference %g on average, quantization %g", amx, moved);
        }
    }
    free(ref);
    free(fast);
    free(plain);
}

Test(quant, weights_that_are_not_finite_are_refused)
{
    struct moe_config cfg;
    struct moe_model m;
    struct moe_backend be;
    struct moe_runner r;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(&m, &cfg, MOE_DTYPE_F32, 3), MOE_OK);
    ((float *)m.layers[1].wv.data)[77] = NAN;
    cr_assert_eq(tu_backend_init_with(&be, "cpu", MOE_QUANT_Q8_0, 0, 0), MOE_OK);
    const float *wq = m.layers[0].wq.data;
    struct moe_runner_opts o = {.max_tokens = 8, .max_seqs = 1, .max_logits = 8, .block_size = 8, .n_blocks = 4};
    cr_assert_neq(moe_runner_init(&r, &m, &be, &o), MOE_OK);
    cr_expect(strstr(moe_last_error(), "weight of layer 1 holds a value that is not finite"), "%s",
              moe_last_error());
    cr_expect_eq(m.layers[0].wq.data, wq, "a failed quantization leaves the model as it was");
    cr_expect_eq(m.layers[0].wq.dtype, MOE_DTYPE_F32);
    moe_backend_free(&be);
    moe_model_free(&m);
}

Test(quant, cli_options)
{
    char args[1024];
    snprintf(args, sizeof args, "run %s/mixtral --prompt-ids 1,2 --quantize q3", FIXTURE_DIR);
    tu_expect_one_line_error(args, "--quantize 'q3' (use q8_0, q4, q4_k_m, q5_k, q5_k_m, or none)");
    /* the mixtral fixture's widths (64, 32) are whole blocks: 8 ids come out */
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3,4 -n 8 --quantize q8_0 --backend cpu "
             "--ignore-eos 2>/dev/null", MOERUN_BINARY, FIXTURE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    int commas = 0;
    for (const char *p = out; *p; p++) commas += *p == ',';
    cr_expect_eq(commas, 7, "%s", out);
}

/* moerun plan --quantize q8_0: the quantized parts at 9 bits per weight,
 * the embedding and the routers as stored (bf16 here). */
Test(quant, plan_predicts_q8_0_sizes)
{
    char cmd[1024], a[8192], b[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/glm-4.5-air.json", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
    strcat(cmd, " --quantize q8_0");
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0);
    cr_expect(fabs(qt_part_gib(b, "\n  experts") / qt_part_gib(a, "\n  experts") - 9.0 / 16) < 1e-3);
    cr_expect(fabs(qt_part_gib(b, "\n  attention") / qt_part_gib(a, "\n  attention") - 9.0 / 16) < 2e-3);
    cr_expect(qt_part_gib(b, "\n  embeddings") == qt_part_gib(a, "\n  embeddings"));
    cr_expect(qt_part_gib(b, "\n  router") == qt_part_gib(a, "\n  router"));
}

/* ---- MXFP4 ---- */

Test(quant, mxfp4_dtype_and_scales)
{
    enum moe_dtype dt;
    cr_expect_str_eq(moe_dtype_name(MOE_DTYPE_MXFP4), "MXFP4");
    cr_expect_not(moe_dtype_parse("MXFP4", &dt), "a storage format of the runtime, not a file dtype");
    cr_expect_eq(moe_dtype_size(MOE_DTYPE_MXFP4), 1);
    cr_expect_eq(moe_dtype_row_bytes(MOE_DTYPE_MXFP4, 2880), 90 * 17);
    const struct { uint8_t s; uint32_t bits; } want[] = {
        {0, 0x00400000u}, {1, 0x00800000u}, {2, 0x01000000u}, {126, 0x3f000000u},
        {127, 0x3f800000u}, {128, 0x40000000u}, {254, 0x7f000000u}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const float f = moe_e8m0_to_f32(want[i].s);
        uint32_t u;
        memcpy(&u, &f, 4);
        cr_expect_eq(u, want[i].bits, "E8M0 %d: 0x%08x, want 0x%08x", want[i].s, u, want[i].bits);
    }
    cr_expect(isnan(moe_e8m0_to_f32(255)));
    cr_expect_eq(moe_e8m0_to_f32(0), ldexpf(1.0f, -127));
    cr_expect_eq(moe_e8m0_to_f32(100), ldexpf(1.0f, -27));
}

/* Each row of the fixture's matrices, packed and dequantized, is the
 * transformers value bit for bit (infinities, subnormals and -0 included);
 * a NaN scale is refused. */
Test(quant, mxfp4_rows_equal_transformers)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/mxfp4.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    const char *names[] = {"a", "b", "c"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char nb[32], ns[32], nd[32];
        snprintf(nb, sizeof nb, "%s_blocks", names[i]);
        snprintf(ns, sizeof ns, "%s_scales", names[i]);
        snprintf(nd, sizeof nd, "%s_dequant", names[i]);
        const struct moe_st_tensor *bt = moe_safetensors_find(&st, nb), *sct = moe_safetensors_find(&st, ns),
                                   *dq = moe_safetensors_find(&st, nd);
        cr_assert(bt && sct && dq, "%s: tensors missing", names[i]);
        const int N = (int)dq->shape[0], K = (int)dq->shape[1], G = K / MOE_MXFP4_BLOCK;
        cr_assert(bt->ndim == 3 && bt->shape[0] == N && bt->shape[1] == G && bt->shape[2] == 16);
        cr_assert(sct->ndim == 2 && sct->shape[0] == N && sct->shape[1] == G);
        const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_MXFP4, (size_t)K);
        unsigned char *row = malloc(rb);
        float *got = malloc((size_t)K * sizeof(float));
        for (int n = 0; n < N; n++) {
            const uint8_t *blocks = (const uint8_t *)bt->data + (size_t)n * G * 16,
                          *scales = (const uint8_t *)sct->data + (size_t)n * G;
            const float *want = (const float *)dq->data + (size_t)n * K;
            cr_assert(moe_mxfp4_pack_row(row, blocks, scales, (size_t)K));
            for (int g = 0; g < G; g++)
                cr_expect_eq(row[(size_t)g * MOE_MXFP4_BYTES], scales[g], "%s row %d block %d: scale byte",
                             names[i], n, g);
            moe_convert_row_f32(got, row, MOE_DTYPE_MXFP4, (size_t)K);
            for (int k = 0; k < K; k++) {
                uint32_t a, b;
                const float one = moe_mxfp4_get(row, (size_t)k);
                memcpy(&a, &got[k], 4);
                memcpy(&b, &want[k], 4);
                cr_assert_eq(a, b, "%s row %d element %d: %g (0x%08x), transformers %g (0x%08x)", names[i],
                             n, k, got[k], a, want[k], b);
                memcpy(&a, &one, 4);
                cr_assert_eq(a, b, "%s row %d element %d: moe_mxfp4_get %g", names[i], n, k, one);
            }
        }
        /* scale 255 is NaN in E8M0: the row is refused, whichever block holds it */
        uint8_t *bad = malloc((size_t)G);
        for (int g = 0; g < G; g++) {
            memcpy(bad, sct->data, (size_t)G);
            bad[g] = 255;
            cr_expect_not(moe_mxfp4_pack_row(row, bt->data, bad, (size_t)K), "%s: scale 255 in block %d",
                          names[i], g);
        }
        free(bad);
        free(row);
        free(got);
    }
    moe_safetensors_close(&st);
}

/* (N, Din) random MXFP4 weights (new memory), packed from the checkpoint
 * layout: random bytes, scales drawn from [smin, smax] with every eighth
 * block's scale 0 or 1 when with_tiny (subnormal values).  The dequantized
 * rows into *f32 (new memory). */
static void *mxfp4_weights(int N, int Din, uint64_t seed, int smin, int smax, bool with_tiny, float **f32)
{
    const int G = Din / MOE_MXFP4_BLOCK;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_MXFP4, (size_t)Din);
    uint8_t blocks[16 * 64], scales[64];
    cr_assert(G <= 64);
    unsigned char *w = malloc((size_t)N * rb);
    *f32 = malloc((size_t)N * Din * sizeof(float));
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < 16 * G; i++) blocks[i] = (uint8_t)tu_rand_u64(&seed);
        for (int g = 0; g < G; g++) {
            scales[g] = (uint8_t)(smin + (int)(tu_rand_u64(&seed) % (uint64_t)(smax - smin + 1)));
            if (with_tiny && (n * G + g) % 8 == 3) scales[g] = (uint8_t)((n + g) & 1);
        }
        cr_assert(moe_mxfp4_pack_row(w + (size_t)n * rb, blocks, scales, (size_t)Din));
        moe_convert_row_f32(*f32 + (size_t)n * Din, w + (size_t)n * rb, MOE_DTYPE_MXFP4, (size_t)Din);
    }
    return w;
}

/* The GPU's planes (moe_planes_from_rows) hold each row's nibbles and
 * scales where runtime/core/tensor.h says: read back by that description, every
 * value is the row's dequantized value, bit for bit. */
Test(quant, mxfp4_planes_hold_each_value)
{
    static const float lut[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    const int N = 5, Din = 96;
    float *wf;
    void *w = mxfp4_weights(N, Din, 77, 0, 254, true, &wf);
    const size_t vb = moe_planes_values_bytes(MOE_DTYPE_MXFP4, N, Din);
    cr_assert_eq(vb, (size_t)N * Din / 2);
    cr_assert_eq(moe_planes_scales_bytes(MOE_DTYPE_MXFP4, N, Din), (size_t)N * Din / 32);
    uint8_t *v = malloc(vb), *sc = malloc((size_t)N * Din / 32);
    moe_planes_from_rows(MOE_DTYPE_MXFP4, w, N, Din, v, sc);
    for (int r = 0; r < N; r++)
        for (int k = 0; k < Din; k++) {
            const int j = k % 32;
            const uint8_t byte = v[(size_t)r * Din / 2 + k / 32 * 16 + j % 16];
            const float got = lut[(byte >> (j / 16 * 4)) & 15] * ldexpf(1.0f, sc[r * Din / 32 + k / 32] - 127);
            cr_assert(tu_same_bits(got, wf[(size_t)r * Din + k]), "row %d value %d: %g, want %g", r, k, got,
                      wf[(size_t)r * Din + k]);
        }
    free(v), free(sc), free(w), free(wf);
}

/* Every kernel set this processor runs (the reference, AVX2, AVX-512)
 * multiplies MXFP4 weights as an fp32 product over the dequantized values
 * (the reference: bit for bit, it sums in the same order; the fast sets:
 * to 1e-5 of the largest output), and a row's outputs are the same bits
 * in a batch of any size. */
Test(quant, mxfp4_gemm_matches_dequantized_f32)
{
    const int Ns[] = {1, 5, 13, 50, 97}, Ds[] = {32, 64, 96, 256};
    for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
        for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++) {
            float *wf;
            void *w = mxfp4_weights(Ns[b], Ds[c], (uint64_t)(Ns[b] * 7 + Ds[c]), 120, 132, true, &wf);
            qt_check_gemm("mxfp4", w, wf, MOE_DTYPE_MXFP4, Ns[b], Ds[c]);
            free(w);
            free(wf);
        }
}

/* One-hot input rows pick single weights: every kernel set, on every path
 * (decode tiles, batch tiles, rows widened for a block), gives each
 * dequantized weight exactly, so the nibble order, the lookup table and the
 * scale (subnormal ones included: 0 and 1) are the reference's. */
Test(quant, mxfp4_kernels_widen_exactly)
{
    const int Ns[] = {3, 13, 50}, Ds[] = {32, 96, 256};
    for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
        for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++) {
            float *wf; /* scales up to 252: every value finite (253 and 254 overflow) */
            void *w = mxfp4_weights(Ns[b], Ds[c], (uint64_t)(Ns[b] * 3 + Ds[c]), 0, 252, true, &wf);
            qt_check_widening(w, wf, MOE_DTYPE_MXFP4, Ns[b], Ds[c]);
            free(w);
            free(wf);
        }
}

/* tiny-moe (bf16) with every layer's experts replaced by MXFP4 weights
 * (*buf, new memory), prepared on backend `name` with quant: logits of the
 * shared 20-token prompt into logits. */
static void run_mxfp4_experts(const char *name, enum moe_weight_quant q, float *logits, struct moe_model *m,
                              void **buf)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    cr_assert_eq(moe_model_synthetic(m, &cfg, MOE_DTYPE_BF16, 11), MOE_OK, "%s", moe_last_error());
    const int L = cfg.n_layers, E = cfg.n_experts, D = cfg.d_model, F = cfg.d_expert;
    const size_t gu = (size_t)F * moe_dtype_row_bytes(MOE_DTYPE_MXFP4, (size_t)D),
                 dn = (size_t)D * moe_dtype_row_bytes(MOE_DTYPE_MXFP4, (size_t)F), per = 2 * gu + dn;
    char *p = malloc((size_t)L * E * per);
    *buf = p;
    for (int l = 0; l < L; l++) {
        struct moe_expert_weights *x = &m->layers[l].experts;
        cr_assert(x->gate);
        for (int e = 0; e < E; e++, p += per) {
            float *f;
            /* scales 2^-7 .. 2^-5: values up to 0.19, as the synthetic ones */
            void *g = mxfp4_weights(F, D, (uint64_t)(l * E + e) * 3, 120, 122, false, &f);
            free(f);
            void *u = mxfp4_weights(F, D, (uint64_t)(l * E + e) * 3 + 1, 120, 122, false, &f);
            free(f);
            void *d = mxfp4_weights(D, F, (uint64_t)(l * E + e) * 3 + 2, 120, 122, false, &f);
            free(f);
            memcpy(p, g, gu);
            memcpy(p + gu, u, gu);
            memcpy(p + 2 * gu, d, dn);
            free(g);
            free(u);
            free(d);
            x->gate[e] = p;
            x->up[e] = p + gu;
            x->down[e] = p + 2 * gu;
        }
        x->dtype = MOE_DTYPE_MXFP4;
    }
    qt_prompt_logits(m, name, q, logits);
}

/* The CPU backends read MXFP4 experts in place: never requantized by
 * --quantize q8_0 nor repacked to panels (the other weights still are), and
 * the reference and fast expert phases agree. */
Test(quant, backends_read_mxfp4_experts_in_place)
{
    const int V = 1024;
    float *ref = malloc((size_t)20 * V * 4), *fast = malloc((size_t)20 * V * 4);
    struct moe_model m;
    void *buf;
    run_mxfp4_experts("cpu-ref", MOE_QUANT_Q8_0, ref, &m, &buf);
    cr_expect_eq(m.layers[0].experts.dtype, MOE_DTYPE_MXFP4);
    cr_expect_eq(m.layers[0].experts.gate[0], buf, "the experts are read where the loader put them");
    cr_expect_eq(m.layers[0].wq.dtype, MOE_DTYPE_Q8_0, "attention is still quantized");
    moe_model_free(&m);
    free(buf);
    bool finite = true;
    for (size_t i = 0; i < (size_t)20 * V; i++) finite = finite && isfinite(ref[i]);
    cr_expect(finite, "logits not finite");
    if (moe_cpu_isa_detect() != MOE_CPU_ISA_REF) {
        run_mxfp4_experts("cpu", MOE_QUANT_Q8_0, fast, &m, &buf);
        cr_expect_eq(m.layers[1].experts.dtype, MOE_DTYPE_MXFP4);
        cr_expect_eq(m.layers[0].experts.gate[0], buf);
        cr_expect_eq(m.layers[1].router.dtype, MOE_DTYPE_BF16_PANEL);
        moe_model_free(&m);
        free(buf);
        /* the fast backend quantizes the inputs of the Q8_0 matrices too
         * (gemm_q8.c): near on average, not element by element; the
         * panels run below compares the expert phases closely */
        const double apart = tu_mean_abs_diff(fast, ref, (size_t)20 * V), size = tu_mean_abs_diff(ref, NULL, (size_t)20 * V);
        cr_log_info("mxfp4 experts, q8_0 elsewhere: fast vs reference %.3g on average (mean |logit| %.3g)", apart, size);
        cr_expect(apart < 0.05 * size, "mxfp4 experts, q8_0 elsewhere: fast vs reference %g on average, mean |logit| %g",
                  apart, size);
        run_mxfp4_experts("cpu", MOE_QUANT_NONE, fast, &m, &buf);
        cr_expect_eq(m.layers[0].experts.dtype, MOE_DTYPE_MXFP4, "not repacked to panels");
        cr_expect_eq(m.layers[0].experts.gate[0], buf);
        cr_expect_eq(m.layers[0].wq.dtype, MOE_DTYPE_BF16_PANEL);
        moe_model_free(&m);
        free(buf);
        run_mxfp4_experts("cpu-ref", MOE_QUANT_NONE, ref, &m, &buf);
        moe_model_free(&m);
        free(buf);
        cr_expect(tu_allclose("mxfp4 experts, panels elsewhere: fast vs reference", fast, ref, (size_t)20 * V,
                              1e-4f, 1e-3f));
    }
    free(ref);
    free(fast);
}

Test(quant, mxfp4_is_not_written_to_safetensors)
{
    unsigned char row[17] = {127};
    struct moe_st_tensor t = {.name = "w", .dtype = MOE_DTYPE_MXFP4, .ndim = 2, .shape = {1, 32},
                              .data = row, .nbytes = sizeof row};
    const struct moe_st_tensor *list[] = {&t};
    char path[] = "/tmp/moerun_mxfp4_XXXXXX";
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_expect_neq(moe_safetensors_write(path, list, 1, NULL), MOE_OK);
    cr_expect(strstr(moe_last_error(), "bad dtype"), "%s", moe_last_error());
    unlink(path);
}
