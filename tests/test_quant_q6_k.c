/* test_quant_q6_k.c - six-bit weights (MOE_DTYPE_Q6_K, runtime/core/tensor.h):
 * the rows dequantize to gguf-py's values bit for bit (a committed fixture
 * of random blocks, tests/reference/make_quant_fixtures.py) and to the
 * format's element formulas on a block packed here; moe_quantize_row_q6_k
 * stores each value's nearest code, beats the plain absmax rule's error
 * and refuses what it must; the fast kernel (runtime/cpu/gemm_q6_k.c)
 * multiplies as the reference does to within the bound that quantizing
 * the inputs to int8 allows, gives a row the same bits alone or in any
 * batch, under every kernel set and split over threads, and NaN to a row
 * holding a NaN or an infinity. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/model/safetensors.h"
#include "tests/quant_test.h"
#include "tests/testutil.h"

enum { B = MOE_Q6_K_BLOCK };

/* gguf-py's dequantization of random blocks (every scale -128 and 127
 * with codes 0 and 63, every scale 0, a subnormal d, random heads of
 * either sign) is moerun's, value for value and bit for bit, through
 * moe_convert_row_f32 and through the per-element moe_q6_k_code and
 * moe_q6_k_scale. */
Test(quant_q6_k, blocks_read_as_gguf_py)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/q6_k.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    const struct moe_st_tensor *q = moe_safetensors_find(&st, "q6_k"), *d = moe_safetensors_find(&st, "dequant");
    cr_assert(q && d);
    const int R = (int)d->shape[0], K = (int)d->shape[1];
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q6_K, (size_t)K);
    cr_assert_eq(rb, (size_t)K / 256 * 210);
    cr_assert_eq((size_t)q->shape[1], rb, "ggml blocks: 210 bytes per 256 values");
    float *back = malloc((size_t)K * sizeof(float));
    for (int r = 0; r < R; r++) {
        const unsigned char *row = (const unsigned char *)q->data + (size_t)r * rb;
        moe_convert_row_f32(back, row, MOE_DTYPE_Q6_K, (size_t)K);
        const float *dq = (const float *)d->data + (size_t)r * K;
        for (int k = 0; k < K; k++) {
            cr_assert(tu_same_bits(back[k], dq[k]), "row %d value %d: %.9g, gguf-py %.9g", r, k, back[k], dq[k]);
            const unsigned char *blk = row + (size_t)(k / B) * MOE_Q6_K_BYTES;
            const float v = moe_q6_k_scale(blk, (unsigned)(k % B)) * (float)((int)moe_q6_k_code(blk, (unsigned)(k % B)) - 32);
            cr_assert(tu_same_bits(v, dq[k]), "row %d value %d: code and scale give %.9g, gguf-py %.9g", r, k, v, dq[k]);
        }
    }
    free(back);
    moe_safetensors_close(&st);
}

/* A block packed here from the element formulas written out bit by bit:
 * element e has code (7 e + 3) % 64, sub-block j the scale j - 8, d = -0.5
 * (f16 0xB800): every code reads back, and every value is (-0.5 * (j -
 * 8)) * (code - 32), exact. */
Test(quant_q6_k, hand_packed_block_reads_its_codes)
{
    unsigned char b[MOE_Q6_K_BYTES];
    memset(b, 0, sizeof b);
    for (int e = 0; e < B; e++) {
        const int c = (7 * e + 3) % 64, h = e / 128, i = e % 128;
        const int ql = 64 * h + i % 64, nib = i / 64, qh = 128 + 32 * h + i % 32, sh = 2 * (i / 32);
        b[ql] |= (unsigned char)((c & 15) << (4 * nib));
        b[qh] |= (unsigned char)((c >> 4) << sh);
    }
    for (int j = 0; j < 16; j++) b[192 + j] = (unsigned char)(int8_t)(j - 8);
    b[208] = 0x00, b[209] = 0xb8;
    float out[B];
    moe_convert_row_f32(out, b, MOE_DTYPE_Q6_K, B);
    for (int e = 0; e < B; e++) {
        const int c = (7 * e + 3) % 64;
        cr_assert_eq((int)moe_q6_k_code(b, (unsigned)e), c, "element %d: code %u, want %d", e, moe_q6_k_code(b, (unsigned)e), c);
        cr_assert_eq(out[e], -0.5f * (float)(e / 16 - 8) * (float)(c - 32), "element %d: %g", e, out[e]);
    }
    cr_expect_str_eq(moe_dtype_name(MOE_DTYPE_Q6_K), "Q6_K");
    cr_expect_eq(moe_dtype_size(MOE_DTYPE_Q6_K), 1);
    cr_expect_eq(moe_dtype_row_bytes(MOE_DTYPE_Q6_K, 1024), 840);
    cr_expect_not(moe_dtype_is_q4(MOE_DTYPE_Q6_K), "the four-bit kernels must not read Q6_K");
    cr_expect(moe_dtype_planes(MOE_DTYPE_Q6_K), "the CUDA backend reads Q6_K as planes");
    cr_expect_eq(moe_dtype_block(MOE_DTYPE_Q6_K), B);
}


/* The plain absmax rule, the baseline: per sub-block s = v / -32 (v the
 * value of largest magnitude), d = (the s of largest magnitude) / -128 in
 * f16, sc = round(s / d), each code round(x / (d sc)) clamped. */
static void absmax_row(float *back, const float *x, size_t n)
{
    for (size_t o = 0; o < n; o += B) {
        float s[16], smax = 0;
        for (int j = 0; j < 16; j++) {
            float v = 0;
            for (int i = 0; i < 16; i++) v = fabsf(x[o + 16 * j + i]) > fabsf(v) ? x[o + 16 * j + i] : v;
            s[j] = v / -32.0f;
            smax = fabsf(s[j]) > fabsf(smax) ? s[j] : smax;
        }
        const float d = moe_f16_to_f32(moe_f32_to_f16(smax / -128.0f));
        for (int j = 0; j < 16; j++) {
            const float sc = d != 0 ? fmaxf(-128.0f, fminf(127.0f, nearbyintf(s[j] / d))) : 0.0f, S = d * sc;
            for (int i = 0; i < 16; i++) {
                const float q = S != 0 ? fmaxf(-32.0f, fminf(31.0f, nearbyintf(x[o + 16 * j + i] / S))) : 0.0f;
                back[o + 16 * j + i] = S * q;
            }
        }
    }
}

static double rel_rms(const float *x, const float *back, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)x[i] - back[i]) * ((double)x[i] - back[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

/* moe_quantize_row_q6_k: on Gaussian and uniform rows its relative RMS
 * error is below the absmax rule's (printed); with awkward blocks added (a
 * zero block, a constant one, an all-positive one, an outlier, tiny
 * values, values near f16's range, a block of one nonzero value, fp32
 * subnormals) every
 * stored code is the nearest of the values its sub-block can hold (no
 * neighbouring code nearer); values that are not finite, or a d past
 * f16's range, are refused. */
Test(quant_q6_k, quantize_row_stores_nearest_codes)
{
    enum { K = 65536 };
    float *x = malloc(K * sizeof(float)), *back = malloc(K * sizeof(float)), *base = malloc(K * sizeof(float));
    unsigned char *q = malloc(moe_dtype_row_bytes(MOE_DTYPE_Q6_K, K));
    uint64_t st = 17;
    for (int kind = 0; kind < 2; kind++) {
        for (int i = 0; i < K; i++) x[i] = kind == 0 ? 0.02f * tu_rand_gauss(&st) : tu_rand_uniform(&st, -0.05f, 0.05f);
        cr_assert(moe_quantize_row_q6_k(q, x, K));
        moe_convert_row_f32(back, q, MOE_DTYPE_Q6_K, K);
        absmax_row(base, x, K);
        const double e = rel_rms(x, back, K), e0 = rel_rms(x, base, K);
        cr_log_info("q6_k %s rows: relative RMS error %.5f, the absmax rule %.5f", kind ? "uniform" : "Gaussian", e, e0);
        cr_expect(e < e0, "%s rows: error %.5f is not below the absmax rule's %.5f", kind ? "uniform" : "Gaussian", e, e0);

        memset(x, 0, 16 * sizeof(float));
        for (int i = 16; i < 32; i++) x[i] = -1.75f;
        for (int i = 32; i < 48; i++) x[i] = 0.5f + 0.01f * (float)(i - 32);
        x[300] = 0.9f;
        for (int i = 512; i < 768; i++) x[i] *= 1e-6f;
        for (int i = 768; i < 1024; i++) x[i] *= 1e5f;
        for (int i = 1024; i < 1280; i++) x[i] = i == 1100 ? -3.0f : 0.0f;
        for (int i = 1280; i < 1536; i++) x[i] = 1e-40f * (float)(i % 7 - 3);
        cr_assert(moe_quantize_row_q6_k(q, x, K));
        moe_convert_row_f32(back, q, MOE_DTYPE_Q6_K, K);
        for (int k = 0; k < K; k++) {
            const unsigned char *blk = q + (size_t)(k / B) * MOE_Q6_K_BYTES;
            const int c = (int)moe_q6_k_code(blk, (unsigned)(k % B));
            const float S = moe_q6_k_scale(blk, (unsigned)(k % B)), err = fabsf(x[k] - back[k]);
            for (int o = c - 1; o <= c + 1; o += 2)
                if (o >= 0 && o <= 63)
                    cr_assert(err <= fabsf(x[k] - S * (float)(o - 32)), "value %d (%.9g): code %d (%.9g), code %d is nearer "
                              "(%.9g)", k, x[k], c, back[k], o, S * (float)(o - 32));
        }
        for (int i = 0; i < 16; i++) cr_expect_eq(back[i], 0.0f, "the zero block: value %d %g", i, back[i]);
        for (int i = 16; i < 32; i++) cr_expect(fabsf(back[i] + 1.75f) <= 1.75f * 1e-3f, "the constant block: %d %g", i, back[i]);
        cr_expect(fabsf(back[1100] + 3.0f) <= 3.0f * 1e-3f, "a lone value: %g", back[1100]);
    }
    const float v[] = {NAN, INFINITY, -INFINITY, 3e8f, -3e8f};
    for (int i = 0; i < 5; i++) {
        for (int k = 0; k < 512; k++) x[k] = 0.01f * (float)(k % 7);
        x[300] = v[i];
        cr_expect_not(moe_quantize_row_q6_k(q, x, 512), "%g", v[i]);
    }
    x[300] = 2e8f; /* d = 2e8 / 28 / 128, within f16's range */
    cr_expect(moe_quantize_row_q6_k(q, x, 512));
    free(x), free(back), free(base), free(q);
}

/* (N, D) random Q6_K weights (new memory): even rows quantized from
 * uniform floats (row 0's first sub-blocks zero and constant), odd rows
 * random bytes with finite f16 d of either sign, so every code and scale
 * (-128 and 127 included) occurs. */
static unsigned char *q6_k_weights(enum moe_dtype t, int N, int D, uint64_t seed)
{
    (void)t;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q6_K, (size_t)D);
    unsigned char *w = malloc((size_t)N * rb);
    float *f = malloc((size_t)D * sizeof(float));
    uint64_t st = seed;
    for (int n = 0; n < N; n++) {
        unsigned char *row = w + (size_t)n * rb;
        if (n % 2 == 0) {
            tu_fill_uniform(f, (size_t)D, seed + (uint64_t)n, -0.1f, 0.1f);
            for (int j = 0; j < 32; j++) f[j] = n == 0 && j >= 16 ? 0.03f : 0.0f;
            cr_assert(moe_quantize_row_q6_k(row, f, (size_t)D));
            continue;
        }
        for (size_t i = 0; i < rb; i++) row[i] = (unsigned char)tu_rand_u64(&st);
        for (size_t o = 0; o < rb; o += MOE_Q6_K_BYTES) {
            const uint16_t h = moe_f32_to_f16(tu_rand_uniform(&st, -3e-4f, 3e-4f));
            memcpy(row + o + 208, &h, 2);
        }
    }
    free(f);
    return w;
}

Test(quant_q6_k, fast_gemm_256) { qt_check_fast_int8(MOE_DTYPE_Q6_K, 256, q6_k_weights, qt_bound_k256); }
Test(quant_q6_k, fast_gemm_768) { qt_check_fast_int8(MOE_DTYPE_Q6_K, 768, q6_k_weights, qt_bound_k256); }

/* The kernel's expression (runtime/cpu/gemm_q6_k.c) for one output in
 * scalar C: per block, the input quantized as gemm_q8_k.h does (one dy,
 * codes nearest), the exact integer sum of sc q qx over the block's 256
 * elements minus 32 sum_s sc_s t_s, t_s the input codes' sum over
 * sub-block s; acc = fma(that, d dy, acc); + bias. */
static float q6_k_expr(const float *x, const unsigned char *wrow, int D, float bias)
{
    float acc = 0.0f;
    for (int k = 0; k < D / B; k++) {
        const float *xb = x + (size_t)k * B;
        const unsigned char *blk = wrow + (size_t)k * MOE_Q6_K_BYTES;
        bool bad;
        float id;
        const float dy = qt_block_scale(xb, B, &id, &bad);
        int32_t S = 0;
        for (int e = 0; e < B; e++) {
            const int32_t c = bad ? 0 : (int32_t)nearbyintf(xb[e] * id);
            S += (int)(signed char)blk[192 + e / 16] * ((int32_t)moe_q6_k_code(blk, (unsigned)e) - 32) * c;
        }
        uint16_t h;
        memcpy(&h, blk + 208, 2);
        acc = fmaf((float)S, moe_f16_to_f32(h) * dy, acc);
    }
    return acc + bias;
}

/* The kernel gives the bits of the expression above under every kernel
 * set (qt_check_expression's shapes and inputs). */
Test(quant_q6_k, kernel_pins_its_expression)
{
    qt_check_expression(MOE_DTYPE_Q6_K, MOE_CPU_ISA_AMX_BF16, q6_k_weights, q6_k_expr);
}

/* Large enough to split over the OpenMP team: moe_gemm_fast and
 * moe_gemm_fast_multi (a Q6_K matrix beside a Q4_K one and a Q8_0 one, as
 * a Q4_K_M-like mix gives an expert) give the bits the single-threaded
 * rows give. */
Test(quant_q6_k, parallel_products_match_the_rows)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("this processor runs no fast kernel set");
    enum { T = 5, D = 512 };
    const int N[3] = {389, 200, 131};
    const enum moe_dtype dt[3] = {MOE_DTYPE_Q6_K, MOE_DTYPE_Q4_K, MOE_DTYPE_Q8_0};
    unsigned char *w[3];
    float *x = malloc((size_t)T * D * sizeof(float)), *f = malloc((size_t)D * sizeof(float));
    tu_fill_uniform(x, (size_t)T * D, 99, -1, 1);
    for (int i = 0; i < 3; i++) {
        const size_t rb = moe_dtype_row_bytes(dt[i], D);
        w[i] = malloc((size_t)N[i] * rb);
        for (int n = 0; n < N[i]; n++) {
            tu_fill_uniform(f, D, (uint64_t)(50 + 1000 * i + n), -0.1f, 0.1f);
            unsigned char *row = w[i] + (size_t)n * rb;
            cr_assert(i == 0 ? moe_quantize_row_q6_k(row, f, D) : i == 1 ? moe_quantize_row_q4_k(row, f, D)
                                                                         : moe_quantize_row_q8_0(row, f, D));
        }
    }
    qt_check_parallel_rows(best, x, T, D, w, dt, N);
    for (int i = 0; i < 3; i++) free(w[i]);
    free(x), free(f);
}

/* Q6_K rows split into the CUDA backend's planes (tensor.h) and joined
 * back are the same bytes; each code of the planes, taken apart as the
 * kernels take it (moe_q6_k_half_bits: a word of low nibbles and its word
 * of high bits at shifts 0, 8, 4, 12), is the row's code. */
Test(quant_q6_k, planes_split_join_and_decode)
{
    enum { R = 3, K = 2 * B };
    float *x = malloc((size_t)R * K * sizeof(float));
    uint64_t st = 5;
    for (int i = 0; i < R * K; i++) x[i] = tu_rand_gauss(&st);
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q6_K, K), vb = moe_planes_values_bytes(MOE_DTYPE_Q6_K, R, K),
                 sb = moe_planes_scales_bytes(MOE_DTYPE_Q6_K, R, K);
    cr_assert_eq(vb, (size_t)R * K * 3 / 4);
    cr_assert_eq(sb, (size_t)R * (K / B) * MOE_Q6_K_TAIL);
    unsigned char *rows = malloc(R * rb), *v = malloc(vb), *sc = malloc(sb), *back = malloc(R * rb);
    for (int r = 0; r < R; r++) cr_assert(moe_quantize_row_q6_k(rows + r * rb, x + (size_t)r * K, K));
    moe_planes_from_rows(MOE_DTYPE_Q6_K, rows, R, K, v, sc);
    moe_rows_from_planes(MOE_DTYPE_Q6_K, v, sc, R, K, back);
    cr_expect(memcmp(rows, back, R * rb) == 0, "rows -> planes -> rows");
    static const int shift[4] = {0, 8, 4, 12}, at[4][2] = {{0, 2}, {1, 3}, {16, 18}, {17, 19}};
    for (int b = 0; b < R * K / B; b++) {
        const unsigned char *blk = rows + b * MOE_Q6_K_BYTES, *pv = v + (size_t)b * (B / 4 * 3);
        cr_assert(memcmp(sc + b * MOE_Q6_K_TAIL, blk + MOE_Q6_K_BYTES - MOE_Q6_K_TAIL, MOE_Q6_K_TAIL) == 0);
        for (int run = 0; run < 8; run++)
            for (int j = 0; j < 4; j++) {
                uint32_t w;
                uint16_t c;
                memcpy(&w, pv + 16 * run + 4 * j, 4);
                memcpy(&c, pv + 128 + 8 * run + 2 * j, 2);
                for (int k = 0; k < 4; k++)
                    for (int y = 0; y < 2; y++) {
                        const uint16_t h = (uint16_t)(moe_q6_k_half_bits(w, c, shift[k]) >> (16 * y));
                        const unsigned e = (unsigned)(32 * run + 4 * j + at[k][y]);
                        cr_assert_eq(moe_f16_to_f32(h) - MOE_Q6_K_HALF_BIAS, (float)moe_q6_k_code(blk, e) - 32.0f,
                                     "block %d element %u", b, e);
                    }
            }
    }
    free(x), free(rows), free(v), free(sc), free(back);
}
