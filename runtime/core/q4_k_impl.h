/* q4_k_impl.h - the block quantizers behind moe_quantize_row_q4_k (q4_k.c),
 * open to the tests and the bench: the portable one (q4_k_fit.h's
 * q4k_block, its lanes in SSE2 where the compiler has it) and the AVX2 one
 * (q4_k_avx2.c, the 8 groups of a block in 8 lanes).  Both make q4k_block's
 * bytes, bit for bit. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
