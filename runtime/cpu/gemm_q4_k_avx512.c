/* gemm_q4_k_avx512.c - the product over Q4_K weights for the AVX-512 and
 * avx512-bf16 kernel sets (where the processor has AVX512-VNNI; else
 * gemm_q4_k.c runs): gemm_q4_k.c's expression (read its numerics there) at twice
 * the width, so the same bits.
 *
 * gemm_q4_k.c takes a 32-byte load of codes as two groups, 2t (low
 * nibbles) and 2t + 1 (high), each against its 32 input codes in a ymm.
 * Here a 64-byte load (half a block's codes) is four groups: its low
 * nibbles are groups 4p and 4p + 2 in one zmm, its high nibbles groups
 * 4p + 1 and 4p + 3 in another, each against the input's codes of the
 * same two groups (the input row's 32-byte chunks are arranged once per
 * call to lie in that order, gemm_q4_k.h's q4k_arrange), so one vpmaddubsw and one
 * vpdpwssd (AVX512-VNNI: the vpmaddwd by the two groups' scales and the
 * add in one, the same integers) serve two groups of an input row.  Lanes 0-7 of the block's integer sum gather the first group
 * of each pair, lanes 8-15 the second; at the block's end the two halves
 * are added: integer sums, exact, so each of the 8 lanes holds exactly
 * the integer gemm_q4_k.c's lane holds, and from there the float steps
 * are the same instructions in the same order.  Decode rows take the same
 * tiles (the weights stream from memory either way); prefill's tiles do
 * twice the work an instruction. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/lane_sums.h"
#include "runtime/cpu/gemm_q4_k.h"
#include "runtime/cpu/gemm_q8_k.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* A one-row (decode) tile takes 4 weight rows where gemm_q4_k.c's takes 2:
 * more streams in flight, 4-11% faster decode at OLMoE-1B-7B's widths
 * here (8: no better). */
enum { WC = 4 };

#include "runtime/cpu/gemm_q4_k_tile_avx512.h"
#include "runtime/cpu/gemm_k_panel.h"

#define tile(...) tile_k(false, __VA_ARGS__)

#undef AVX2
#define AVX2 AVX512 /* the driver's functions take this file's instructions */
#define KQ_C1 WC
#define KQ_ARRANGE q4k_arrange
#define KQ_PANEL(...) kp_rows(KP_Q4_K, __VA_ARGS__)
#define KQ_DTYPE MOE_DTYPE_Q4_K
#define KQ_ENTRY moe_gemm_rows_q4_k_avx512
#include "runtime/cpu/gemm_q8_k_rows.h"
