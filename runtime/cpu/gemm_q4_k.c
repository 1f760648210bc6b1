/* gemm_q4_k.c - the fast matrix product over Q4_K weights (ggml's block:
 * f16 d and dmin, 6-bit scales sc_j and minimums mn_j of 8 groups of 32,
 * 128 bytes of codes; runtime/core/tensor.h), AVX2 instructions for the
 * AVX2 kernel set (the AVX-512 set takes gemm_q4_k_avx512.c, the same
 * expression at twice the width, the same bits; the AMX sets, where the
 * processor has AMX-INT8, take gemm_q4_amx.c, bits of their own).
 *
 * Inputs: each row quantized to int8 blocks of 256 with one scale dy
 * (gemm_q8_k.h), so a weight block's whole dot is one exact integer: a
 * weight w = d sc_j q - dmin mn_j (q the 4-bit code) against an input
 * qx dy sums over the block to
 *   d dy (sum_j sc_j sum_{k in j} q_k qx_k) - dmin dy (sum_j mn_j s_j),
 * s_j the sum of group j's input codes (the stream's two sums of 16).  A
 * group of 32 weights against the input takes: half of a 32-byte load of
 * codes (byte i holds element i of group 2t low, of group 2t + 1 high), an
 * AND (and a shift), vpmaddubsw against the input's codes (unsigned codes
 * times int8, pairs summed to int16: at most 2 x 15 x 127, no
 * saturation), vpmaddwd by sc_j as int16 (one byte shuffle of the block's
 * 16 scale bytes) and an integer add: no conversion, no float operation.
 * The floats come once per block: the lanes added into the block's two
 * exact integers and two FMAs (q4k_block_end).  The group's d_j = d sc_j
 * and m_j are never formed: the integers carry them exactly.
 *
 * Numerics: output n of row t accumulates over blocks in order acc =
 * fma(-float(M), dmin x dy, fma(float(S), d x dy, acc)), with S the
 * block's exact sum over its 8 groups of sc_j times the products of codes
 * (at most 256 x 15 x 127 x 63 < 2^25, Q5_K 2^26; rounded once to fp32 where it
 * passes 2^24), M = sum_j mn_j s_j (s_j group j's input code sum), d x dy
 * and dmin x dy each one fp32 product; then the bias.  So an output is
 * the quantized input row times the exactly dequantized weights, to fp32
 * rounding: its difference from the reference (fp32 inputs) is sum w_k
 * (x_k - qx_k dy_k), at most sum |w_k| dy_k / 2, dy_k its block's (a
 * block of 256 has a larger dy than one of 32: the price of one float per
 * block; llama.cpp pays the same).  Every tile computes that expression,
 * and so do the AVX-512 set's prefill panels (gemm_k_panel.h), so a row gives
 * the same bits alone or in any batch, under both kernel sets (AVX2 here,
 * AVX-512 in gemm_q4_k_avx512.c). */
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

#define tile(...) tile_k(false, __VA_ARGS__)

#define KQ_DTYPE MOE_DTYPE_Q4_K
#define KQ_ENTRY moe_gemm_rows_q4_k_avx2
#include "runtime/cpu/gemm_q8_k_rows.h"
