/* test_quant_q4.c - four-bit weights (Q4_1, Q4_G32, Q4_G128, Q4_K:
 * runtime/core/tensor.h): the rows dequantize to the values the format
 * defines (hand-worked groups and moe_q4_get), moe_quantize_row_q4_1 makes
 * the codes ggml's rule gives on hand-worked blocks, moe_quantize_row_q4_k
 * stores each value's nearest code and beats Q4_1's error, and the fast kernels
 * (runtime/cpu/gemm_q4.c) multiply them as the reference does to within
 * the bound that quantizing the inputs to int8 allows, giving a row the
 * same bits alone or in any batch and NaN to a row holding a NaN or an
 * infinity.  (The quantizer's agreement with gguf-py on many blocks comes
 * from committed fixtures elsewhere.) */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast.h"
#include "tests/quant_test.h"
#include "tests/testutil.h"

static const enum moe_dtype q4_types[] = {MOE_DTYPE_Q4_1, MOE_DTYPE_Q4_G32, MOE_DTYPE_Q4_G128, MOE_DTYPE_Q4_K};

/* Weight k of a four-bit row: its code and its group's d and m. */
static void q4_weight(const unsigned char *row, enum moe_dtype t, int k, int *q, float *d, float *m)
{
    if (t == MOE_DTYPE_Q4_K) {
        const unsigned char *blk = row + (size_t)(k / 256) * MOE_Q4_K_BYTES;
        const int j = k % 256 / 32;
        float ds[8], ms[8];
        moe_q4_k_heads(blk, ds, ms);
        *d = ds[j];
        *m = ms[j];
        *q = (blk[16 + 32 * (j / 2) + k % 32] >> (4 * (j % 2))) & 15;
        return;
    }
    const int G = moe_q4_group(t), j = k % G;
    const unsigned char *grp = row + (size_t)(k / G) * moe_q4_group_bytes(t);
    if (t == MOE_DTYPE_Q4_1) {
        uint16_t h[2];
        memcpy(h, grp, 4);
        *d = moe_f16_to_f32(h[0]);
        *m = moe_f16_to_f32(h[1]);
    } else {
        memcpy(d, grp, 4);
        memcpy(m, grp + 4, 4);
    }
    const unsigned char byte = grp[(t == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD) + 16 * (j / 32) + j % 16];
    *q = j % 32 < 16 ? byte & 15 : byte >> 4;
}

/* A G32 group of codes 0..15 then 15..0 with d = 0.5, m = -4 reads as q *
 * 0.5 - 4 (every value exact); a Q4_1 block with f16 d = 0.5 (0x3800) and
 * m = -4 (0xC400) and bytes 0x(15-j)(j) reads j * 0.5 - 4 at element j,
 * (15 - j) * 0.5 - 4 at element j + 16; and every element of random rows of
 * each format converts to moe_q4_get's value, bit for bit. */
Test(quant_q4, rows_dequantize_to_the_formats_values)
{
    uint8_t codes[128];
    for (int j = 0; j < 32; j++) codes[j] = (uint8_t)(j < 16 ? j : 31 - j);
    unsigned char g[MOE_Q4_HEAD + 64];
    moe_q4_pack_group(g, MOE_DTYPE_Q4_G32, codes, 0.5f, -4.0f);
    cr_expect_eq(g[MOE_Q4_HEAD + 0], 0xf0, "byte 0: element 0 (code 0) low, element 16 (code 15) high");
    cr_expect_eq(g[MOE_Q4_HEAD + 15], 0x0f, "byte 15: element 15 (code 15) low, element 31 (code 0) high");
    float out[128];
    moe_convert_row_f32(out, g, MOE_DTYPE_Q4_G32, 32);
    for (int j = 0; j < 32; j++) cr_expect_eq(out[j], (float)codes[j] * 0.5f - 4.0f, "G32 element %d: %g", j, out[j]);
    cr_expect_eq(out[0], -4.0f);
    cr_expect_eq(out[15], 3.5f);
    cr_expect_eq(out[16], 3.5f);

    unsigned char b1[MOE_Q4_1_BYTES] = {0x00, 0x38, 0x00, 0xc4};
    for (int j = 0; j < 16; j++) b1[4 + j] = (unsigned char)(j | (15 - j) << 4);
    moe_convert_row_f32(out, b1, MOE_DTYPE_Q4_1, 32);
    for (int j = 0; j < 16; j++) {
        cr_expect_eq(out[j], (float)j * 0.5f - 4.0f, "Q4_1 element %d: %g", j, out[j]);
        cr_expect_eq(out[j + 16], (float)(15 - j) * 0.5f - 4.0f, "Q4_1 element %d: %g", j + 16, out[j + 16]);
    }

    /* a G128 group: runs 1..3 hold their own codes */
    uint64_t st = 7;
    for (int j = 0; j < 128; j++) codes[j] = (uint8_t)(tu_rand_u64(&st) & 15);
    unsigned char g128[MOE_Q4_HEAD + 64];
    moe_q4_pack_group(g128, MOE_DTYPE_Q4_G128, codes, 0.25f, 1.0f);
    moe_convert_row_f32(out, g128, MOE_DTYPE_Q4_G128, 128);
    for (int j = 0; j < 128; j++) cr_expect_eq(out[j], (float)codes[j] * 0.25f + 1.0f, "G128 element %d", j);

    for (size_t a = 0; a < sizeof q4_types / sizeof *q4_types; a++) {
        const enum moe_dtype t = q4_types[a];
        const size_t K = 512, rb = moe_dtype_row_bytes(t, K);
        unsigned char *row = malloc(rb);
        for (size_t i = 0; i < rb; i++) row[i] = (unsigned char)tu_rand_u64(&st);
        /* finite heads: f16 of [-2, 2) (Q4_1; Q4_K's d and dmin) or f32 of [-2, 2) */
        for (size_t o = 0; o < rb; o += moe_q4_group_bytes(t)) {
            if (t == MOE_DTYPE_Q4_1 || t == MOE_DTYPE_Q4_K) {
                const uint16_t h[2] = {moe_f32_to_f16(tu_rand_uniform(&st, -2, 2)),
                                       moe_f32_to_f16(tu_rand_uniform(&st, -2, 2))};
                memcpy(row + o, h, 4);
            } else {
                const float h[2] = {tu_rand_uniform(&st, -2, 2), tu_rand_uniform(&st, -2, 2)};
                memcpy(row + o, h, 8);
            }
        }
        float *f = malloc(K * sizeof(float));
        moe_convert_row_f32(f, row, t, K);
        for (size_t k = 0; k < K; k++)
            cr_assert(tu_same_bits(f[k], moe_q4_get(row, t, k)), "%s element %zu: %g, moe_q4_get %g",
                      moe_dtype_name(t), k, f[k], moe_q4_get(row, t, k));
        free(f);
        free(row);
    }
}

/* Hand-worked blocks of ggml's Q4_1 rule (min, d = (max - min) / 15, q =
 * min(15, (int)((x - min) / d + 0.5)), d and min to f16):
 * - 32 values 3.0: d = 0 (f16 0x0000), min 3.0 (0x4200), codes 0;
 * - the ramp x_j = j: min 0, d = 31/15 = 2.0667, f16 2.06640625 (0x4022),
 *   q_j = floor(15 j / 31 + 0.5) = j / 2 (integer division: 15 j / 31 is
 *   never within 1/31 of a half), so byte j is (j/2) | (8 + j/2) << 4;
 * - x_j = j % 16 - 1: min -1, d = 1 (0x3C00), min 0xBC00, q_j = j % 16.
 * Values that are not finite are refused. */
Test(quant_q4, quantize_row_q4_1_hand_worked_blocks)
{
    float x[64];
    unsigned char b[2 * MOE_Q4_1_BYTES];
    for (int j = 0; j < 32; j++) x[j] = 3.0f;
    for (int j = 0; j < 32; j++) x[32 + j] = (float)j;
    cr_assert(moe_quantize_row_q4_1(b, x, 64));
    const unsigned char c0[4] = {0x00, 0x00, 0x00, 0x42}, c1[4] = {0x22, 0x40, 0x00, 0x00};
    cr_expect(memcmp(b, c0, 4) == 0, "constant block head %02x %02x %02x %02x", b[0], b[1], b[2], b[3]);
    for (int j = 0; j < 16; j++) cr_expect_eq(b[4 + j], 0, "constant block byte %d: %02x", j, b[4 + j]);
    cr_expect(memcmp(b + 20, c1, 4) == 0, "ramp head %02x %02x %02x %02x", b[20], b[21], b[22], b[23]);
    for (int j = 0; j < 16; j++)
        cr_expect_eq(b[24 + j], (unsigned char)(j / 2 | (8 + j / 2) << 4), "ramp byte %d: %02x", j, b[24 + j]);
    float back[64];
    moe_convert_row_f32(back, b, MOE_DTYPE_Q4_1, 64);
    for (int j = 0; j < 32; j++) cr_expect_eq(back[j], 3.0f);
    for (int j = 0; j < 32; j++) cr_expect_eq(back[32 + j], (float)(j / 2) * 2.06640625f, "ramp element %d", j);

    for (int j = 0; j < 32; j++) x[j] = (float)(j % 16 - 1);
    cr_assert(moe_quantize_row_q4_1(b, x, 32));
    const unsigned char c2[4] = {0x00, 0x3c, 0x00, 0xbc};
    cr_expect(memcmp(b, c2, 4) == 0, "integer block head %02x %02x %02x %02x", b[0], b[1], b[2], b[3]);
    for (int j = 0; j < 16; j++) cr_expect_eq(b[4 + j], (unsigned char)(j | j << 4), "integer block byte %d", j);

    x[5] = NAN;
    cr_expect_not(moe_quantize_row_q4_1(b, x, 32));
    x[5] = INFINITY;
    cr_expect_not(moe_quantize_row_q4_1(b, x, 32));
}

/* Relative RMS error of a quantizer's round trip over n values. */
static double round_trip_error(const float *x, size_t n, enum moe_dtype t, unsigned char *q, float *back)
{
    cr_assert(t == MOE_DTYPE_Q4_K ? moe_quantize_row_q4_k(q, x, n) : moe_quantize_row_q4_1(q, x, n));
    moe_convert_row_f32(back, q, t, n);
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)x[i] - back[i]) * ((double)x[i] - back[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

/* moe_quantize_row_q4_k: every value's stored code is the nearest of the
 * values its group can hold (no neighbouring code is nearer), on Gaussian
 * and uniform rows with a zero block, a constant block, an all-positive
 * block (dmin 0), an outlier, tiny values (subnormal f16 heads) and values
 * near f16's range; its relative RMS error is at most 0.92 of Q4_1's
 * (measured 0.89-0.90) on both kinds of rows; values that are not finite,
 * or heads past f16's range, are refused. */
Test(quant_q4, quantize_row_q4_k_stores_nearest_codes)
{
    enum { K = 4096 };
    float *x = malloc(K * sizeof(float)), *back = malloc(K * sizeof(float));
    unsigned char *q = malloc(moe_dtype_row_bytes(MOE_DTYPE_Q4_K, K) + moe_dtype_row_bytes(MOE_DTYPE_Q4_1, K));
    uint64_t st = 17;
    for (int kind = 0; kind < 2; kind++) {
        for (int i = 0; i < K; i++) {
            if (kind == 0) { /* Gaussian: the sum of 4 uniforms */
                float v = 0;
                for (int j = 0; j < 4; j++) v += tu_rand_uniform(&st, -0.05f, 0.05f);
                x[i] = v;
            } else {
                x[i] = tu_rand_uniform(&st, -0.05f, 0.05f);
            }
        }
        const double e1 = round_trip_error(x, K, MOE_DTYPE_Q4_1, q, back);
        const double ek = round_trip_error(x, K, MOE_DTYPE_Q4_K, q, back);
        cr_log_info("q4_k %s rows: relative RMS error %.5f, Q4_1 %.5f", kind ? "uniform" : "Gaussian", ek, e1);
        cr_expect(ek <= 0.92 * e1, "%s rows: Q4_K's error %.5f is not below 0.92 of Q4_1's %.5f",
                  kind ? "uniform" : "Gaussian", ek, e1);
        /* the awkward blocks, then every code checked against its neighbours */
        memset(x, 0, 32 * sizeof(float));
        for (int i = 32; i < 64; i++) x[i] = -1.75f;
        for (int i = 64; i < 96; i++) x[i] = 0.5f + 0.01f * (float)(i - 64);
        x[300] = 0.9f;
        for (int i = 512; i < 768; i++) x[i] *= 1e-6f;
        for (int i = 768; i < 1024; i++) x[i] *= 1e5f;
        cr_assert(moe_quantize_row_q4_k(q, x, K));
        for (int k = 0; k < K; k++) {
            int c;
            float d, m;
            q4_weight(q, MOE_DTYPE_Q4_K, k, &c, &d, &m);
            const float err = fabsf(x[k] - ((float)c * d + m));
            for (int o = c - 1; o <= c + 1; o += 2)
                if (o >= 0 && o <= 15)
                    cr_assert(err <= fabsf(x[k] - ((float)o * d + m)), "value %d (%.9g): code %d (%.9g), code %d "
                              "is nearer (%.9g)", k, x[k], c, (float)c * d + m, o, (float)o * d + m);
        }
        moe_convert_row_f32(back, q, MOE_DTYPE_Q4_K, K);
        for (int i = 0; i < 32; i++) cr_expect_eq(back[i], 0.0f, "the zero block: value %d %g", i, back[i]);
        for (int i = 32; i < 64; i++)
            cr_expect(fabsf(back[i] + 1.75f) <= 1.75f * 2e-3f, "the constant block: value %d %g", i, back[i]);
    }
    const float v[] = {NAN, INFINITY, 1e8f, -1e8f};
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 256; k++) x[k] = 0.01f * (float)(k % 7);
        x[100] = v[i];
        cr_expect_not(moe_quantize_row_q4_k(q, x, 256), "%g", v[i]);
    }
    free(x);
    free(back);
    free(q);
}

/* (N, D) random weights of four-bit dtype t (new memory).  Q4_1: random
 * floats through moe_quantize_row_q4_1, row 0's first block constant (d =
 * 0).  Q4_G32 / Q4_G128: random codes, and per group one of: d in [0.005,
 * 0.1) with m = -z d (z in 0..15, GPTQ's zero point), d = 0 with m in
 * [-0.5, 0.5), an f16-valued d with m = -z d, d with m in [-0.8, 0). */
static unsigned char *q4_weights(enum moe_dtype t, int N, int D, uint64_t seed)
{
    const size_t rb = moe_dtype_row_bytes(t, (size_t)D), gb = moe_q4_group_bytes(t);
    const int G = moe_q4_group(t);
    unsigned char *w = malloc((size_t)N * rb);
    uint64_t st = seed;
    if (t == MOE_DTYPE_Q4_1) {
        float *f = malloc((size_t)D * sizeof(float));
        for (int n = 0; n < N; n++) {
            tu_fill_uniform(f, (size_t)D, seed + (uint64_t)n, -0.1f, 0.1f);
            if (n == 0)
                for (int j = 0; j < 32; j++) f[j] = 0.03f;
            cr_assert(moe_quantize_row_q4_1(w + (size_t)n * rb, f, (size_t)D));
        }
        free(f);
        return w;
    }
    if (t == MOE_DTYPE_Q4_K) { /* even rows quantized, odd rows random bytes with f16 heads */
        float *f = malloc((size_t)D * sizeof(float));
        for (int n = 0; n < N; n++) {
            unsigned char *row = w + (size_t)n * rb;
            if (n % 2 == 0) {
                tu_fill_uniform(f, (size_t)D, seed + (uint64_t)n, -0.1f, 0.1f);
                for (int j = 0; j < 32; j++) f[j] = n == 0 ? 0.03f : 0.0f; /* a positive block's dmin 0, or zeros */
                cr_assert(moe_quantize_row_q4_k(row, f, (size_t)D));
                continue;
            }
            for (size_t i = 0; i < rb; i++) row[i] = (unsigned char)tu_rand_u64(&st);
            for (size_t o = 0; o < rb; o += MOE_Q4_K_BYTES) {
                const uint16_t h[2] = {moe_f32_to_f16(tu_rand_uniform(&st, 1e-3f, 3e-2f)),
                                       moe_f32_to_f16(tu_rand_uniform(&st, 1e-3f, 3e-2f))};
                memcpy(row + o, h, 4);
            }
        }
        free(f);
        return w;
    }
    uint8_t codes[128];
    for (int n = 0; n < N; n++)
        for (int g = 0; g < D / G; g++) {
            for (int j = 0; j < G; j++) codes[j] = (uint8_t)(tu_rand_u64(&st) & 15);
            const int mode = (int)(tu_rand_u64(&st) % 4), z = (int)(tu_rand_u64(&st) % 16);
            float d = tu_rand_uniform(&st, 0.005f, 0.1f), m = -(float)z * d;
            if (mode == 1) {
                d = 0;
                m = tu_rand_uniform(&st, -0.5f, 0.5f);
            } else if (mode == 2) {
                d = moe_f16_to_f32(moe_f32_to_f16(d));
                m = -(float)z * d;
            } else if (mode == 3) {
                m = tu_rand_uniform(&st, -0.8f, 0.0f);
            }
            moe_q4_pack_group(w + (size_t)n * rb + (size_t)g * gb, t, codes, d, m);
        }
    return w;
}

/* The bound on |fast - reference| for input row x against weight row w
 * (its exact values wf, D of them).  The fast kernels multiply the input
 * quantized per block of 32 (Q4_K: of 256 on the AVX2 and AVX-512 sets,
 * which bounds the AMX sets' blocks of 32 too; dx = max |x| / 127,
 * |x - x^| <= dx / 2) by
 * the exact weights, so they differ from the reference (the fp32 x) by
 * sum_k w_k (x_k - x^_k), at most sum_k |w_k| dx_k / 2; plus fp32
 * rounding of both products, taken as 1e-5 of the magnitudes the kernels'
 * sums add (sum_k (|q_k d_k| + |m_k|) |x_k|: the code and offset terms
 * apart; a few dozen roundings of 2^-24 in any chain for D <= 512). */
static double q4_bound(const float *x, const float *wf, const unsigned char *wrow, enum moe_dtype t, int D)
{
    double input = 0, mag = 0;
    const int B = t == MOE_DTYPE_Q4_K ? 256 : 32;
    for (int b = 0; b < D / B; b++) {
        float amax = 0;
        for (int j = 0; j < B; j++) amax = fmaxf(amax, fabsf(x[B * b + j]));
        const double dx = (double)amax / 127.0;
        for (int j = 0; j < B; j++) {
            const int k = B * b + j;
            input += fabs((double)wf[k]) * dx / 2;
            /* m_k: the value of code 0 */
            int q;
            float d, m;
            q4_weight(wrow, t, k, &q, &d, &m);
            mag += (fabs((double)wf[k] - m) + fabs((double)m)) * fabs((double)x[k]);
        }
    }
    return input * (1 + 1e-6) + 1e-5 * mag + 1e-30;
}

/* The four-bit kernels' expression (runtime/cpu/gemm_q4.c's tiles, the
 * AMX sets' gemm_q4_amx.c) for one output in scalar C: per group, per run k, the input block quantized as
 * moe_quantize_x_q8 does, P the run's 32 products of codes summed exactly,
 * acc = fma(float(P), dx * d, acc); then acc = fma(S, m, acc) with S the
 * group's sum of dx times the block's code sum (fma a step); + bias. */
static float q4_expr(enum moe_dtype t, const float *x, const unsigned char *wrow, int D, float bias)
{
    const int nr = moe_q4_head_runs(t);
    float acc = 0.0f;
    for (int g = 0; g < D / 32 / nr; g++) {
        float d, m, S = 0.0f;
        for (int k = 0; k < nr; k++) {
            const float *xb = x + (size_t)(g * nr + k) * 32;
            float amax = 0.0f;
            bool bad = false;
            for (int j = 0; j < 32; j++) {
                bad |= !isfinite(xb[j]);
                amax = fmaxf(amax, fabsf(xb[j]));
            }
            const float dx = bad ? NAN : amax / 127.0f, id = amax >= 127.0f * FLT_MIN ? 127.0f / amax : 0.0f;
            int32_t P = 0, cs = 0;
            for (int j = 0; j < 32; j++) {
                int q;
                q4_weight(wrow, t, (g * nr + k) * 32 + j, &q, &d, &m);
                const int32_t c = bad ? 0 : (int32_t)nearbyintf(xb[j] * id);
                P += q * c;
                cs += c;
            }
            S = fmaf(dx, (float)cs, S);
            const float sc = dx * d;
            acc = fmaf((float)P, sc, acc);
        }
        acc = fmaf(S, m, acc);
    }
    return acc + bias;
}

/* The AMX sets' four-bit kernel (int8 tiles from 8 rows, AVX512-VNNI for
 * fewer) gives the bits of the expression above for every format, every T
 * from 1 to 40 and 150 (two passes of input rows at Din 8192: 1 MiB of
 * streams), N not a multiple of 16, a slice not starting at 0, with and
 * without bias; inputs with a zero block, rows of other scales and a NaN. */
Test(quant_q4, amx_kernel_pins_its_expression)
{
    if (moe_cpu_isa_detect() < MOE_CPU_ISA_AMX || !moe_cpu_amx_int8())
        cr_skip_test("this processor (or its kernel) gives no AMX-INT8 tiles: no AMX four-bit kernel to check");
    enum { TMAX = 150 };
    const int Ds[] = {128, 384, 8192}, Ns[] = {1, 3, 17, 37};
    for (size_t a = 0; a < sizeof q4_types / sizeof *q4_types; a++)
        for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++)
            for (size_t e = 0; e < sizeof Ns / sizeof *Ns; e++) {
                const enum moe_dtype t = q4_types[a];
                const int D = t == MOE_DTYPE_Q4_K && Ds[c] < 8192 ? 2 * Ds[c] : Ds[c], N = Ns[e]; /* 256, 768 */
                if (D == 8192 && N > 3) continue;
                const size_t rb = moe_dtype_row_bytes(t, (size_t)D);
                unsigned char *w = q4_weights(t, N, D, (uint64_t)(N * 7 + D + (int)t));
                float *x = malloc((size_t)TMAX * D * sizeof(float)), *bias = malloc((size_t)N * 4),
                      *y = malloc((size_t)TMAX * N * 4);
                tu_fill_uniform(x, (size_t)TMAX * D, (uint64_t)(N + D), -1, 1);
                for (int r = 0; r < TMAX; r++)
                    for (int k = 0; k < D; k++) x[(size_t)r * D + k] *= (float)(1 + r % 5) * (r % 3 ? 1.0f : 1e-3f);
                memset(x + (size_t)D * 3, 0, 32 * sizeof(float));
                x[(size_t)D * 5 + (size_t)D / 2 + 7] = NAN;
                tu_fill_uniform(bias, (size_t)N, (uint64_t)N, -1, 1);
                const struct moe_tensor bt = {.dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {N}, .data = bias, .device = -1};
                for (int T = 1; T <= TMAX; T = T < 40 ? T + 1 : T == 40 && D == 8192 ? TMAX : TMAX + 1) {
                    const int n0 = T % 2 ? 0 : N / 3;
                    const struct moe_tensor *b = T % 3 == 1 ? &bt : NULL;
                    memset(y, 0, (size_t)T * N * 4);
                    moe_gemm_fast_rows(MOE_CPU_ISA_AMX, y, (size_t)N, x, (size_t)D, T, w, t, D, n0, N, b);
                    for (int r = 0; r < T; r++)
                        for (int n = n0; n < N; n++) {
                            const float want = q4_expr(t, x + (size_t)r * D, w + (size_t)n * rb, D, b ? bias[n] : 0.0f);
                            const float got = y[(size_t)r * N + n];
                            uint32_t bw, bg;
                            memcpy(&bw, &want, 4), memcpy(&bg, &got, 4);
                            if (bw != bg && !(isnan(want) && isnan(got)))
                                cr_assert_fail("%s amx T=%d N=%d Din=%d n0=%d%s [%d,%d]: %.9g (0x%08x), the expression "
                                               "%.9g (0x%08x)", moe_dtype_name(t), T, N, D, n0, b ? " +bias" : "", r, n,
                                               got, bg, want, bw);
                        }
                    if (T > 5) cr_assert(isnan(y[(size_t)5 * N + n0]), "T=%d: row 5 holds a NaN input", T);
                }
                free(w), free(x), free(bias), free(y);
            }
}

static float q4_1_expr(const float *x, const unsigned char *w, int D, float bias)
{
    return q4_expr(MOE_DTYPE_Q4_1, x, w, D, bias);
}
static float q4_g32_expr(const float *x, const unsigned char *w, int D, float bias)
{
    return q4_expr(MOE_DTYPE_Q4_G32, x, w, D, bias);
}
static float q4_g128_expr(const float *x, const unsigned char *w, int D, float bias)
{
    return q4_expr(MOE_DTYPE_Q4_G128, x, w, D, bias);
}

/* Every kernel set's four-bit kernel gives the bits of the expression
 * above (qt_check_expression's shapes and inputs), each format. */
Test(quant_q4, four_bit_kernels_pin_their_expression)
{
    qt_check_expression(MOE_DTYPE_Q4_1, MOE_CPU_ISA_AMX_BF16, q4_weights, q4_1_expr);
    qt_check_expression(MOE_DTYPE_Q4_G32, MOE_CPU_ISA_AMX_BF16, q4_weights, q4_g32_expr);
    qt_check_expression(MOE_DTYPE_Q4_G128, MOE_CPU_ISA_AMX_BF16, q4_weights, q4_g128_expr);
}

/* The AVX2 and AVX-512 sets' Q4_K expression (runtime/cpu/gemm_q4_k.c)
 * for one output in scalar C. */
static float q4_k_expr(const float *x, const unsigned char *wrow, int D, float bias)
{
    return qt_k_expr(x, wrow, D, bias, false);
}

/* The AVX2 and AVX-512 sets' Q4_K kernel gives the bits of the expression
 * above (qt_check_expression's shapes and inputs). */
Test(quant_q4, q4_k_kernel_pins_its_expression)
{
    qt_check_expression(MOE_DTYPE_Q4_K, MOE_CPU_ISA_AVX512, q4_weights, q4_k_expr);
}

Test(quant_q4, fast_gemm_q4_1)
{
    qt_check_fast_int8(MOE_DTYPE_Q4_1, 32, q4_weights, q4_bound);
    qt_check_fast_int8(MOE_DTYPE_Q4_1, 256, q4_weights, q4_bound);
}
Test(quant_q4, fast_gemm_q4_g32)
{
    qt_check_fast_int8(MOE_DTYPE_Q4_G32, 32, q4_weights, q4_bound);
    qt_check_fast_int8(MOE_DTYPE_Q4_G32, 160, q4_weights, q4_bound);
}
Test(quant_q4, fast_gemm_q4_g128)
{
    qt_check_fast_int8(MOE_DTYPE_Q4_G128, 128, q4_weights, q4_bound);
    qt_check_fast_int8(MOE_DTYPE_Q4_G128, 384, q4_weights, q4_bound);
}
Test(quant_q4, fast_gemm_q4_k)
{
    qt_check_fast_int8(MOE_DTYPE_Q4_K, 256, q4_weights, q4_bound);
    qt_check_fast_int8(MOE_DTYPE_Q4_K, 768, q4_weights, q4_bound);
}

/* Large enough to split over the OpenMP team: moe_gemm_fast and
 * moe_gemm_fast_multi (three four-bit matrices of one input) give the bits
 * the single-threaded rows give. */
Test(quant_q4, parallel_products_match_the_rows)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("this processor runs no fast kernel set");
    enum { T = 5, D = 512 };
    const int N[3] = {389, 200, 131};
    unsigned char *w[3];
    float *x = malloc((size_t)T * D * sizeof(float));
    tu_fill_uniform(x, (size_t)T * D, 99, -1, 1);
    for (int i = 0; i < 3; i++) w[i] = q4_weights(q4_types[i], N[i], D, (uint64_t)(50 + i));
    qt_check_parallel_rows(best, x, T, D, w, q4_types, N);
    for (int i = 0; i < 3; i++) free(w[i]);
    free(x);
}
