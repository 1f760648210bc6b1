/* q6_k_impl.h - the block quantizers behind moe_quantize_row_q6_k (q6_k.c),
 * open to the tests and the bench: the portable one (q6_k_fit.h's
 * q6k_block, its sub-block sums in SSE2 where the compiler has it) and the
 * AVX2 one (q6_k_avx2.c, 8 sub-blocks of a block in 8 lanes).  Both make
 * q6k_block's bytes, bit for bit. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One block of 256 finite values: its 16 int8 scales into sc, its f16 d
 * into *dh and its codes (0..63) in element order into q; false when d is
 * past f16's range (q6k_block's contract, q6_k_fit.h). */
typedef bool (*moe_q6_k_block_fn)(const float *x, int8_t sc[16], uint16_t *dh, uint8_t q[256]);

bool moe_q6_k_block_portable(const float *x, int8_t sc[16], uint16_t *dh, uint8_t q[256]);
/* Only on a processor with AVX2 (moe_q4_k_has_avx2, q4_k_impl.h). */
bool moe_q6_k_block_avx2(const float *x, int8_t sc[16], uint16_t *dh, uint8_t q[256]);

/* moe_quantize_row_q6_k with the given block quantizer. */
bool moe_q6_k_quantize_row_with(moe_q6_k_block_fn block, void *dst, const float *src, size_t n);
