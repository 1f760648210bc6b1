/* test_quant_q5_k.c - five-bit weights (MOE_DTYPE_Q5_K, runtime/core/tensor.h):
 * the rows dequantize to gguf-py's values bit for bit (a committed fixture
 * of random blocks, tests/reference/make_quant_fixtures.py) and a block
 * packed here from its codes reads them back. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/safetensors.h"
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
