/* q5_k_impl.h - the block quantizers behind moe_quantize_row_q5_k (q5_k.c),
 * open to the tests and the bench: the portable one (q5_k_fit.h's
 * q5k_block in plain C) and the AVX2 one (q5_k_avx2.c, a group's 8 lanes
 * in one register).  Both make q5k_block's bytes, bit for bit. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One block of 256 finite values: its 16 leading bytes into head and its
 * codes (0..31) in element order into q; false when d or dmin is past
 * f16's range (q5k_block's contract, q5_k_fit.h). */
typedef bool (*moe_q5_k_block_fn)(const float *x, unsigned char head[16], uint8_t q[256]);

bool moe_q5_k_block_portable(const float *x, unsigned char head[16], uint8_t q[256]);
/* Only on a processor with AVX2 (moe_q4_k_has_avx2, q4_k_impl.h). */
bool moe_q5_k_block_avx2(const float *x, unsigned char head[16], uint8_t q[256]);

/* moe_quantize_row_q5_k with the given block quantizer. */
bool moe_q5_k_quantize_row_with(moe_q5_k_block_fn block, void *dst, const float *src, size_t n);
