/* test_quant_q5_k.c - five-bit weights (MOE_DTYPE_Q5_K, runtime/core/tensor.h):
 * the rows dequantize to gguf-py's values bit for bit (a committed fixture
 * of random blocks, tests/reference/make_quant_fixtures.py) and a block
 * packed here from its codes reads them back; moe_quantize_row_q5_k
 * stores each value's nearest code, keeps each group's error within half
 * a step of its range's grid, halves Q4_K's error and refuses what it
 * must, and its AVX2 block quantizer makes the plain C's bytes; the fast
 * kernels (runtime/cpu/gemm_q5_k.c, gemm_q5_k_avx512.c) multiply as the
 * reference does to within the bound that quantizing the inputs to int8
 * allows, give the bits of their expression written in scalar C under
 * every kernel set, a row the same bits alone or in any batch and split
 * over threads, and NaN to a row holding a NaN or an infinity. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core/q4_k_impl.h"
#include "runtime/core/q5_k_fit.h"
#include "runtime/core/q5_k_impl.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/model/safetensors.h"
#include "tests/quant_test.h"
#include "tests/testutil.h"

enum { B = MOE_Q5_K_BLOCK };

/* gguf-py's dequantization of random blocks (every scale and minimum 63
 * with codes 31 and 0, every scale and minimum 0, subnormal heads, random
 * heads) is moerun's, value for value and bit for bit, through
 * moe_convert_row_f32 and through moe_q5_k_code and moe_q5_k_heads. */
Test(quant_q5_k, blocks_read_as_gguf_py)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/q5_k.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    const struct moe_st_tensor *q = moe_safetensors_find(&st, "q5_k"), *d = moe_safetensors_find(&st, "dequant");
    cr_assert(q && d);
    const int R = (int)d->shape[0], K = (int)d->shape[1];
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q5_K, (size_t)K);
    cr_assert_eq(rb, (size_t)K / 256 * 176);
    cr_assert_eq((size_t)q->shape[1], rb, "ggml blocks: 176 bytes per 256 values");
    float *back = malloc((size_t)K * sizeof(float));
    for (int r = 0; r < R; r++) {
        const unsigned char *row = (const unsigned char *)q->data + (size_t)r * rb;
        moe_convert_row_f32(back, row, MOE_DTYPE_Q5_K, (size_t)K);
        const float *dq = (const float *)d->data + (size_t)r * K;
        for (int k = 0; k < K; k++) {
            cr_assert(tu_same_bits(back[k], dq[k]), "row %d value %d: %.9g, gguf-py %.9g", r, k, back[k], dq[k]);
            const unsigned char *blk = row + (size_t)(k / B) * MOE_Q5_K_BYTES;
            float dj[8], mj[8];
            moe_q5_k_heads(blk, dj, mj);
            const float v = (float)moe_q5_k_code(blk, (unsigned)(k % B)) * dj[k % B / 32] + mj[k % B / 32];
            cr_assert(tu_same_bits(v, dq[k]), "row %d value %d: code and head give %.9g, gguf-py %.9g", r, k, v,
                      dq[k]);
        }
    }
    free(back);
    moe_safetensors_close(&st);
}

/* A block packed here by moe_q5_k_pack_codes from codes (11 e + 5) % 32,
 * the high bits written out by hand (bit j of qh[l] for element 32j + l)
 * beside it: the same bytes, every code reads back, and with d = 0.5,
 * dmin = 0.25, sc_j = j + 1, mn_j = 2j each value is 0.5 (j + 1) q - 0.5 j,
 * exact. */
Test(quant_q5_k, hand_packed_block_reads_its_codes)
{
    unsigned char b[MOE_Q5_K_BYTES], qh[32] = {0};
    uint8_t codes[B];
    memset(b, 0, sizeof b);
    for (int e = 0; e < B; e++) {
        codes[e] = (uint8_t)((11 * e + 5) % 32);
        qh[e % 32] |= (unsigned char)((codes[e] >> 4) << (e / 32));
    }
    moe_q5_k_pack_codes(b, codes);
    cr_assert(memcmp(b + MOE_Q5_K_QH, qh, 32) == 0, "the high bits differ from the hand-packed ones");
    b[0] = 0x00, b[1] = 0x38; /* d 0.5 */
    b[2] = 0x00, b[3] = 0x34; /* dmin 0.25 */
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) sc[j] = (uint8_t)(j + 1), mn[j] = (uint8_t)(2 * j);
    for (int j = 0; j < 4; j++) { /* Q4_K's packing */
        b[4 + j] = (unsigned char)(sc[j] | (sc[j + 4] >> 4) << 6);
        b[8 + j] = (unsigned char)(mn[j] | (mn[j + 4] >> 4) << 6);
        b[12 + j] = (unsigned char)((sc[j + 4] & 15u) | (mn[j + 4] & 15u) << 4);
    }
    float out[B];
    moe_convert_row_f32(out, b, MOE_DTYPE_Q5_K, B);
    for (int e = 0; e < B; e++) {
        const int j = e / 32;
        cr_assert_eq((int)moe_q5_k_code(b, (unsigned)e), codes[e], "element %d: code %u, want %d", e,
                     moe_q5_k_code(b, (unsigned)e), codes[e]);
        cr_assert_eq(out[e], 0.5f * (float)(j + 1) * (float)codes[e] - 0.5f * (float)j, "element %d: %g", e, out[e]);
    }
    cr_expect_str_eq(moe_dtype_name(MOE_DTYPE_Q5_K), "Q5_K");
    cr_expect_eq(moe_dtype_size(MOE_DTYPE_Q5_K), 1);
    cr_expect_eq(moe_dtype_row_bytes(MOE_DTYPE_Q5_K, 1024), 704);
    cr_expect_eq(moe_dtype_row_bytes(MOE_DTYPE_Q5_K, SIZE_MAX / 256 * 256), SIZE_MAX / 256 * 176,
                 "a row's bytes are fewer than its values: no overflow");
    cr_expect_not(moe_dtype_is_q4(MOE_DTYPE_Q5_K), "the four-bit kernels must not read Q5_K");
    cr_expect_not(moe_dtype_planes(MOE_DTYPE_Q5_K), "the CUDA backend does not read Q5_K");
}

/* Relative RMS error of back against x over n values. */
static double rel_rms(const float *x, const float *back, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)x[i] - back[i]) * ((double)x[i] - back[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

/* Per group of the Q5_K row q of x (K values): every stored code is the
 * nearest of the 32 values its group can hold (no neighbouring code is
 * nearer), and the group's RMS error is at most half the step of the
 * grid of 31 steps over its range [min(lo, 0), hi] widened by the
 * block's 6-bit units d and dmin (what rounding the scale and the minimum
 * to them may cost), where d and dmin are normal f16 values (a subnormal
 * or zero one is a step of 2^-24 apart from what the fit asked for). */
static void check_groups(const float *x, const unsigned char *q, int K)
{
    for (int g = 0; g < K / 32; g++) {
        const unsigned char *blk = q + (size_t)(g / 8) * MOE_Q5_K_BYTES;
        float dj[8], mj[8], lo = 0.0f, hi = x[32 * g];
        moe_q5_k_heads(blk, dj, mj);
        uint16_t dh, mh;
        memcpy(&dh, blk, 2), memcpy(&mh, blk + 2, 2);
        const float d = dj[g % 8], m = mj[g % 8];
        double e = 0;
        for (int i = 32 * g; i < 32 * g + 32; i++) {
            const int c = (int)moe_q5_k_code(blk, (unsigned)(i % B));
            const float err = fabsf(x[i] - ((float)c * d + m));
            for (int o = c - 1; o <= c + 1; o += 2)
                if (o >= 0 && o <= 31)
                    cr_assert(err <= fabsf(x[i] - ((float)o * d + m)), "value %d (%.9g): code %d (%.9g), code %d "
                              "is nearer (%.9g)", i, x[i], c, (float)c * d + m, o, (float)o * d + m);
            e += (double)err * err;
            lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
        }
        const double rms = sqrt(e / 32),
                     bound = 0.5 * ((double)(hi - lo) / 31 + moe_f16_to_f32(dh) + moe_f16_to_f32(mh)) * (1 + 1e-6);
        const bool subnormal = (dh & 0x7c00u) == 0 || (mh & 0x7c00u) == 0; /* absolute steps of 2^-24 */
        cr_assert(subnormal || rms <= bound, "group %d: RMS error %.9g past half a step %.9g", g, rms, bound);
    }
}

/* moe_quantize_row_q5_k: on Gaussian and uniform rows its relative RMS
 * error is at most 0.55 of Q4_K's (about half: one more bit), and every
 * group passes check_groups, awkward blocks added (a zero group, a
 * constant one, an all-positive one, an outlier, tiny values with
 * subnormal f16 heads, values near f16's range, fp32 subnormals); values
 * that are not finite, or heads past f16's range, are refused. */
Test(quant_q5_k, quantize_row_stores_nearest_codes_within_the_bound)
{
    enum { K = 65536 };
    float *x = malloc(K * sizeof(float)), *back = malloc(K * sizeof(float));
    unsigned char *q = malloc(moe_dtype_row_bytes(MOE_DTYPE_Q5_K, K)),
                  *q4 = malloc(moe_dtype_row_bytes(MOE_DTYPE_Q4_K, K));
    uint64_t st = 17;
    for (int kind = 0; kind < 2; kind++) {
        for (int i = 0; i < K; i++) x[i] = kind == 0 ? 0.02f * tu_rand_gauss(&st) : tu_rand_uniform(&st, -0.05f, 0.05f);
        cr_assert(moe_quantize_row_q5_k(q, x, K));
        cr_assert(moe_quantize_row_q4_k(q4, x, K));
        moe_convert_row_f32(back, q, MOE_DTYPE_Q5_K, K);
        const double e = rel_rms(x, back, K);
        moe_convert_row_f32(back, q4, MOE_DTYPE_Q4_K, K);
        const double e4 = rel_rms(x, back, K);
        cr_log_info("q5_k %s rows: relative RMS error %.5f, Q4_K %.5f", kind ? "uniform" : "Gaussian", e, e4);
        cr_expect(e <= 0.55 * e4, "%s rows: error %.5f is not below 0.55 of Q4_K's %.5f", kind ? "uniform" : "Gaussian",
                  e, e4);
        check_groups(x, q, K);

        memset(x, 0, 32 * sizeof(float));
        for (int i = 32; i < 64; i++) x[i] = -1.75f;
        for (int i = 64; i < 96; i++) x[i] = 0.5f + 0.01f * (float)(i - 64);
        x[300] = 0.9f;
        for (int i = 512; i < 768; i++) x[i] *= 1e-6f;
        for (int i = 768; i < 1024; i++) x[i] *= 1e5f;
        for (int i = 1024; i < 1280; i++) x[i] = 1e-40f * (float)(i % 7 - 3);
        cr_assert(moe_quantize_row_q5_k(q, x, K));
        check_groups(x, q, K);
        moe_convert_row_f32(back, q, MOE_DTYPE_Q5_K, K);
        for (int i = 0; i < 32; i++) cr_expect_eq(back[i], 0.0f, "the zero group: value %d %g", i, back[i]);
        for (int i = 32; i < 64; i++)
            cr_expect(fabsf(back[i] + 1.75f) <= 1.75f * 2e-3f, "the constant group: value %d %g", i, back[i]);
    }
    /* 3e8: d = 3e8 / 31 / 63 past f16's 65504; -1e7: dmin = 1e7 / 63 past it */
    const float v[] = {NAN, INFINITY, -INFINITY, 3e8f, -1e7f};
    for (int i = 0; i < 5; i++) {
        for (int k = 0; k < 256; k++) x[k] = 0.01f * (float)(k % 7);
        x[100] = v[i];
        cr_expect_not(moe_quantize_row_q5_k(q, x, 256), "%g", v[i]);
    }
    x[100] = 1e8f; /* d = 1e8 / 31 / 63, within f16's range */
    cr_expect(moe_quantize_row_q5_k(q, x, 256));
    free(x), free(back), free(q), free(q4);
}

/* Group g (32 values) of kind k at scale sc: Gaussian, uniform, equal,
 * zero, negative, positive, an outlier, on a grid (ties), from 0,
 * subnormal, signed zeros, near f16's range (dmin may overflow). */
enum { KINDS = 12 };
static void fill_group(float *g, int k, float sc, uint64_t *st)
{
    const float c = tu_rand_uniform(st, -1.0f, 1.0f) * sc, off = tu_rand_uniform(st, -2e6f, 2e6f),
                big = tu_rand_log_uniform(st, 5.5f, 7.0f);
    for (int i = 0; i < Q5K_G; i++) {
        const float u = tu_rand_uniform(st, -1.0f, 1.0f);
        switch (k) {
        case 0: g[i] = tu_rand_gauss(st) * sc; break;
        case 1: g[i] = u * sc; break;
        case 2: g[i] = c; break;
        case 3: g[i] = 0.0f; break;
        case 4: g[i] = -fabsf(u) * sc - 0.5f * sc; break;
        case 5: g[i] = fabsf(u) * sc + 0.5f * sc; break;
        case 6: g[i] = i == 17 ? 40.0f * sc : tu_rand_gauss(st) * sc; break;
        case 7: g[i] = (float)((int)(u * 16.0f)) * 0.125f * sc; break;
        case 8: g[i] = fabsf(u) * sc; break;
        case 9: g[i] = u * 1e-39f; break;
        case 10: g[i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 0.0f : u * sc; break;
        default: g[i] = u * big + off; break;
        }
    }
}

/* The AVX2 block quantizer (a group's lanes in one register) makes the
 * plain C's bytes, and refuses the same blocks, on 20,000 blocks whose
 * groups draw kinds and scales (1e-6 to 1e3); moe_quantize_row_q5_k is
 * the portable row on a row of such blocks. */
Test(quant_q5_k, avx2_block_is_the_portable_codes)
{
    if (!moe_q4_k_has_avx2()) cr_skip_test("the processor has no AVX2");
    uint64_t st = 2026;
    float x[B];
    int refused = 0;
    for (int n = 0; n < 20000; n++) {
        for (int j = 0; j < Q5K_NG; j++) {
            const int k = (int)(tu_rand_u64(&st) % (KINDS - (n % 4 != 0))); /* near f16's range in a quarter */
            fill_group(x + Q5K_G * j, k, tu_rand_log_uniform(&st, -6.0f, 3.0f), &st);
        }
        unsigned char h0[Q5K_HEAD] = {0}, h1[Q5K_HEAD] = {0};
        uint8_t q0[B] = {0}, q1[B] = {0};
        const bool ok0 = moe_q5_k_block_portable(x, h0, q0), ok1 = moe_q5_k_block_avx2(x, h1, q1);
        cr_assert_eq(ok1, ok0, "block %d: AVX2 returns %d, the plain C %d", n, ok1, ok0);
        refused += !ok0;
        if (!ok0) continue;
        cr_assert(memcmp(h0, h1, sizeof h0) == 0, "block %d: the heads differ", n);
        for (int i = 0; i < B; i++)
            cr_assert_eq(q1[i], q0[i], "block %d value %d (%.9g): code %d, the plain C's %d", n, i, x[i], q1[i], q0[i]);
    }
    cr_log_info("%d blocks, %d refused", 20000, refused);
    cr_expect(refused > 100 && refused < 5000, "%d blocks refused, expected some but not most", refused);
    enum { N = 16 * B };
    static float row[N];
    static unsigned char r0[N / B * MOE_Q5_K_BYTES], r1[N / B * MOE_Q5_K_BYTES];
    for (int i = 0; i < N; i++) row[i] = tu_rand_gauss(&st) * 0.02f;
    cr_assert(moe_quantize_row_q5_k(r1, row, N));
    cr_assert(moe_q5_k_quantize_row_with(moe_q5_k_block_portable, r0, row, N));
    cr_assert(memcmp(r0, r1, sizeof r0) == 0, "the rows differ");
}

/* (N, D) random Q5_K weights (new memory): even rows quantized from
 * uniform floats (row 0's first groups zero and constant), odd rows random
 * bytes with finite f16 d and dmin (row 1's first block every scale and
 * minimum 63 and every code 31), so every code, scale and minimum
 * occurs. */
static unsigned char *q5_k_weights(enum moe_dtype t, int N, int D, uint64_t seed)
{
    (void)t;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q5_K, (size_t)D);
    unsigned char *w = malloc((size_t)N * rb);
    float *f = malloc((size_t)D * sizeof(float));
    uint64_t st = seed;
    for (int n = 0; n < N; n++) {
        unsigned char *row = w + (size_t)n * rb;
        if (n % 2 == 0) {
            tu_fill_uniform(f, (size_t)D, seed + (uint64_t)n, -0.1f, 0.1f);
            for (int j = 0; j < 64; j++) f[j] = n == 0 && j >= 32 ? 0.03f : 0.0f;
            cr_assert(moe_quantize_row_q5_k(row, f, (size_t)D));
            continue;
        }
        for (size_t i = 0; i < rb; i++) row[i] = (unsigned char)tu_rand_u64(&st);
        for (size_t o = 0; o < rb; o += MOE_Q5_K_BYTES) {
            const uint16_t h[2] = {moe_f32_to_f16(tu_rand_uniform(&st, 1e-5f, 3e-4f)),
                                   moe_f32_to_f16(tu_rand_uniform(&st, 0.0f, 3e-3f))};
            memcpy(row + o, h, 4);
        }
        if (n == 1) memset(row + 4, 0xff, MOE_Q5_K_BYTES - 4);
    }
    free(f);
    return w;
}

Test(quant_q5_k, fast_gemm_256) { qt_check_fast_int8(MOE_DTYPE_Q5_K, 256, q5_k_weights, qt_bound_k256); }
Test(quant_q5_k, fast_gemm_768) { qt_check_fast_int8(MOE_DTYPE_Q5_K, 768, q5_k_weights, qt_bound_k256); }

/* The kernels' expression (runtime/cpu/gemm_q4_k.c's, five-bit codes as
 * moe_q5_k_code reads them) for one output in scalar C. */
static float q5_k_expr(const float *x, const unsigned char *wrow, int D, float bias)
{
    return qt_k_expr(x, wrow, D, bias, true);
}

/* The kernels give the bits of the expression above under every kernel
 * set (qt_check_expression's shapes and inputs: T 1-9, 63-65, 130; N 1,
 * 3, 17; Din 256 and 768; a slice not at 0; bias or none). */
Test(quant_q5_k, kernel_pins_its_expression)
{
    qt_check_expression(MOE_DTYPE_Q5_K, MOE_CPU_ISA_AMX_BF16, q5_k_weights, q5_k_expr);
}

/* Large enough to split over the OpenMP team: moe_gemm_fast and
 * moe_gemm_fast_multi (a Q5_K matrix beside a Q6_K one and a Q4_K one, as
 * q5_k_m gives a layer) give the bits the single-threaded rows give. */
Test(quant_q5_k, parallel_products_match_the_rows)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("this processor runs no fast kernel set");
    enum { T = 5, D = 512 };
    const int N[3] = {389, 200, 131};
    const enum moe_dtype dt[3] = {MOE_DTYPE_Q5_K, MOE_DTYPE_Q6_K, MOE_DTYPE_Q4_K};
    unsigned char *w[3];
    float *x = malloc((size_t)T * D * sizeof(float)), *f = malloc((size_t)D * sizeof(float));
    tu_fill_uniform(x, (size_t)T * D, 99, -1, 1);
    for (int i = 0; i < 3; i++) {
        const size_t rb = moe_dtype_row_bytes(dt[i], D);
        w[i] = malloc((size_t)N[i] * rb);
        for (int n = 0; n < N[i]; n++) {
            tu_fill_uniform(f, D, (uint64_t)(50 + 1000 * i + n), -0.1f, 0.1f);
            unsigned char *row = w[i] + (size_t)n * rb;
            cr_assert(i == 0 ? moe_quantize_row_q5_k(row, f, D) : i == 1 ? moe_quantize_row_q6_k(row, f, D)
                                                                         : moe_quantize_row_q4_k(row, f, D));
        }
    }
    qt_check_parallel_rows(best, x, T, D, w, dt, N);
    for (int i = 0; i < 3; i++) free(w[i]);
    free(x), free(f);
}
