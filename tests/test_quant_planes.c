/* test_quant_planes.c - the GPU's layouts of quantized weights, read on
 * the host (runtime/core/tensor.h, "planes"): Q8_0 and Q4_K planes hold
 * each row's values where the layout says and join back into the rows
 * byte for byte; the kernels' decodings of codes placed in halves and
 * floats give each code's value (MXFP4's planes: test_quant.c, beside its
 * weights). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core/tensor.h"
#include "tests/testutil.h"

/* Q8_0 planes (the CUDA backend's --quantize q8_0): each value, read by
 * the description in runtime/core/tensor.h (code byte times f32 scale), is the
 * row's dequantized value; joining the planes gives the rows back; and
 * the kernels' decoding (moe_q8_f32_bits) gives every code at every place
 * of a word, whatever the other bytes hold. */
Test(quant, q8_0_planes_hold_each_value)
{
    const int N = 3, K = 96;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q8_0, K);
    uint64_t st = 41;
    float *x = malloc((size_t)N * K * sizeof(float)), *want = malloc((size_t)N * K * sizeof(float));
    unsigned char *rows = malloc((size_t)N * rb), *back = malloc((size_t)N * rb);
    for (int i = 0; i < N * K; i++) x[i] = tu_rand_uniform(&st, -3.0f, 3.0f);
    for (int r = 0; r < N; r++) {
        cr_assert(moe_quantize_row_q8_0(rows + (size_t)r * rb, x + (size_t)r * K, K));
        moe_convert_row_f32(want + (size_t)r * K, rows + (size_t)r * rb, MOE_DTYPE_Q8_0, K);
    }
    const size_t vb = moe_planes_values_bytes(MOE_DTYPE_Q8_0, N, K), sb = moe_planes_scales_bytes(MOE_DTYPE_Q8_0, N, K);
    cr_assert_eq(vb, (size_t)N * K);
    cr_assert_eq(sb, (size_t)N * K / 32 * 4);
    int8_t *v = malloc(vb);
    float *sc = malloc(sb);
    moe_planes_from_rows(MOE_DTYPE_Q8_0, rows, N, K, v, sc);
    for (int i = 0; i < N * K; i++)
        cr_assert(tu_same_bits((float)v[i] * sc[i / 32], want[i]), "value %d: %g, want %g", i,
                  (float)v[i] * sc[i / 32], want[i]);
    moe_rows_from_planes(MOE_DTYPE_Q8_0, v, sc, N, K, back);
    cr_assert(memcmp(back, rows, (size_t)N * rb) == 0);
    for (uint32_t b = 0; b < 256; b++)
        for (int j = 0; j < 4; j++) {
            const uint32_t w = (0x5aa5c33cu & ~(0xffu << (8 * j))) | b << (8 * j);
            const uint32_t bits = moe_q8_f32_bits(w, j);
            float f;
            memcpy(&f, &bits, 4);
            cr_assert_eq(f - MOE_Q8_F32_BIAS, (float)(int8_t)b, "byte %u at %d: %g", b, j, f - MOE_Q8_F32_BIAS);
        }
    free(x), free(want), free(rows), free(back), free(v), free(sc);
}

/* Q4_K planes (the CUDA backend's --quantize q4 where rows are multiples
 * of 256): each value, read by the description in runtime/core/tensor.h
 * (the code at its place in its run of 32, the group's d_j and m_j from the
 * block's head in the scale plane), is the row's dequantized value; joining
 * the planes gives the rows back, byte for byte. */
Test(quant, q4_k_planes_hold_each_value)
{
    const int N = 3, K = 512;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q4_K, K);
    uint64_t st = 43;
    float *x = malloc((size_t)N * K * sizeof(float)), *want = malloc((size_t)N * K * sizeof(float));
    unsigned char *rows = malloc((size_t)N * rb), *back = malloc((size_t)N * rb);
    for (int i = 0; i < N * K; i++) x[i] = tu_rand_uniform(&st, -2.0f, 3.0f);
    for (int r = 0; r < N; r++) {
        cr_assert(moe_quantize_row_q4_k(rows + (size_t)r * rb, x + (size_t)r * K, K));
        moe_convert_row_f32(want + (size_t)r * K, rows + (size_t)r * rb, MOE_DTYPE_Q4_K, K);
    }
    const size_t vb = moe_planes_values_bytes(MOE_DTYPE_Q4_K, N, K), sb = moe_planes_scales_bytes(MOE_DTYPE_Q4_K, N, K);
    cr_assert_eq(vb, (size_t)N * K / 2);
    cr_assert_eq(sb, (size_t)N * K / 256 * 16);
    cr_assert_eq(moe_dtype_block(MOE_DTYPE_Q4_K), 256);
    cr_assert(moe_dtype_planes(MOE_DTYPE_Q4_K));
    unsigned char *v = malloc(vb), *sc = malloc(sb);
    moe_planes_from_rows(MOE_DTYPE_Q4_K, rows, N, K, v, sc);
    for (int i = 0; i < N * K; i++) {
        const int run = i / 32, j = i % 32;
        const int q = (v[16 * run + j % 16] >> (j / 16 * 4)) & 15;
        float d[8], m[8];
        moe_q4_k_heads(sc + 16 * (i / 256), d, m);
        const float got = (float)q * d[i % 256 / 32] + m[i % 256 / 32];
        cr_assert(tu_same_bits(got, want[i]), "value %d: %g, want %g", i, got, want[i]);
    }
    memset(back, 0xa5, (size_t)N * rb);
    moe_rows_from_planes(MOE_DTYPE_Q4_K, v, sc, N, K, back);
    cr_assert(memcmp(back, rows, (size_t)N * rb) == 0);
    free(x), free(want), free(rows), free(back), free(v), free(sc);
}

/* The GPU kernels' decoding (moe_e2m1x2_half_bits): each of the 16 codes in
 * either half, read as a half and times 2^14, is the code's value. */
Test(quant, e2m1_codes_placed_in_halves_are_their_values)
{
    static const float lut[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (uint32_t a = 0; a < 16; a++)
        for (uint32_t b = 0; b < 16; b++) {
            /* junk in the other bits must not leak in */
            const uint32_t h = moe_e2m1x2_half_bits(a | b << 16 | 0xfff0fff0u);
            const float lo = moe_f16_to_f32((uint16_t)h) * 16384.0f, hi = moe_f16_to_f32((uint16_t)(h >> 16)) * 16384.0f;
            cr_assert(tu_same_bits(lo, lut[a]) && tu_same_bits(hi, lut[b]), "codes %u %u: %g %g", a, b, lo, hi);
        }
}
