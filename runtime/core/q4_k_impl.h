/* q4_k_impl.h - the block quantizers behind moe_quantize_row_q4_k (q4_k.c),
 * open to the tests and the bench: the portable one (q4_k_fit.h's
 * q4k_block, its lanes in SSE2 where the compiler has it) and the AVX2 one
 * (q4_k_avx2.c, the 8 groups of a block in 8 lanes).  Both make q4k_block's
 * bytes, bit for bit. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* One block of 256 finite values: its 16 leading bytes into head and its
 * codes in element order into q; false when d or dmin is past f16's range
 * (q4k_block's contract, q4_k_fit.h). */
typedef bool (*moe_q4_k_block_fn)(const float *x, unsigned char head[16], uint8_t q[256]);

bool moe_q4_k_block_portable(const float *x, unsigned char head[16], uint8_t q[256]);
/* Only on a processor with AVX2 (moe_q4_k_has_avx2). */
bool moe_q4_k_block_avx2(const float *x, unsigned char head[16], uint8_t q[256]);
bool moe_q4_k_has_avx2(void);

/* moe_quantize_row_q4_k with the given block quantizer. */
bool moe_q4_k_quantize_row_with(moe_q4_k_block_fn block, void *dst, const float *src, size_t n);

/* Whether any of the n floats at x is infinite or NaN (an exponent of all
 * ones), in a loop the compiler vectorizes: the row quantizers' check
 * before their blocks (q4_k.c, q5_k.c). */
static inline bool moe_k_quant_row_bad(const float *x, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return bad != 0;
}
