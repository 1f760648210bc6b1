/* gemm_q5_k.c - the fast matrix product over Q5_K weights (MOE_DTYPE_Q5_K,
 * runtime/core/tensor.h: Q4_K's head and nibbles, and 32 bytes qh whose
 * bit j of byte l is the fifth bit of element 32j + l), AVX2 instructions
 * for the AVX2 kernel set (the AVX-512 sets, where the processor has
 * AVX512-VNNI, take gemm_q5_k_avx512.c: the same expression at twice the
 * width, the same bits), built as the Q4_K kernel is (gemm_q4_k.c: read
 * its numerics there).
 *
 * Inputs: each row quantized to int8 blocks of 256 with one scale dy
 * (gemm_q8_k.h).  A weight w = d sc_j q - dmin mn_j (q the 5-bit code)
 * against an input qx dy sums over the block to
 *   d dy (sum_j sc_j sum_{k in j} q_k qx_k) - dmin dy (sum_j mn_j s_j),
 * Q4_K's expression with codes to 31.  A group of 32 weights takes half
 * of a 32-byte load of nibbles (byte i: element i of group 2t low, of
 * group 2t + 1 high), an AND (and a shift), and its fifth bits: the
 * block's 32 qh bytes (loaded once per block and weight row) shifted in
 * 16-bit lanes so that bit j of each byte lands on bit 4 (no other byte's
 * bit can land there for shifts of at most 4), an AND and an OR; then
 * vpmaddubsw against the input's codes (at most 2 x 31 x 127, no
 * saturation), vpmaddwd by sc_j and an integer add.  Once per block the
 * float steps of gemm_q4_k.h's q4k_block_end.
 *
 * Numerics: Q4_K's (gemm_q4_k.c), the lanes' integer sums S_l now at most
 * 8 x 4 x 31 x 127 x 63 < 2^23, exact as float: an output is the
 * quantized input row times the exactly dequantized weights, to fp32
 * rounding, within sum |w| dy / 2 of the reference; every tile computes
 * that expression, so a row gives the same bits alone or in any batch,
 * under every kernel set. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/gemm_q4_k.h"
#include "runtime/cpu/gemm_q8_k.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

#include "runtime/cpu/gemm_q4_k_tile.h"

#define tile(...) tile_k(true, __VA_ARGS__)

#define KQ_DTYPE MOE_DTYPE_Q5_K
#define KQ_ENTRY moe_gemm_rows_q5_k_avx2
#include "runtime/cpu/gemm_q8_k_rows.h"
