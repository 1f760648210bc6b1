/* gemm_q5_k_avx512.c - the product over Q5_K weights for the AVX-512 and
 * avx512-bf16 kernel sets, and the AMX sets (where the processor has
 * AVX512-VNNI; else gemm_q5_k.c runs): gemm_q5_k.c's expression (read
 * its numerics there and in gemm_q4_k.c) at twice the width, as
 * gemm_q4_k_avx512.c does it for Q4_K, so the same bits.
 *
 * A 64-byte load of half a block's nibbles is four groups: its low
 * nibbles groups 4p (lower 256 bits) and 4p + 2 (upper), its high nibbles
 * 4p + 1 and 4p + 3, each against the input's codes of the same two
 * groups (the input row arranged once per call, gemm_q4_k.h's
 * q4k_arrange).  The fifth bits: the block's 32 qh bytes in both halves
 * of a zmm, shifted in 16-bit lanes by a count per half (vpsllvw for the
 * first half-block, whose groups 0-3 move left by 4 - j, vpsrlvw for the
 * second, groups 4-7 right by j - 4) so that each half's group bit lands
 * on bit 4, an AND and an OR.  Then one vpmaddubsw and one vpdpwssd (the
 * vpmaddwd by the two groups' scales and the add in one) serve two groups
 * of an input row; at the block's end the two halves are added: integer
 * sums, exact, each of the 8 lanes exactly gemm_q5_k.c's lane, and the
 * float steps are gemm_q4_k.h's q4k_block_end. */
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

/* A one-row (decode) tile takes 4 weight rows, as gemm_q4_k_avx512.c's. */
enum { WC = 4 };

#include "runtime/cpu/gemm_q4_k_tile_avx512.h"
#include "runtime/cpu/gemm_k_panel.h"

#define tile(...) tile_k(true, __VA_ARGS__)

#undef AVX2
#define AVX2 AVX512 /* the driver's functions take this file's instructions */
#define KQ_C1 WC
#define KQ_ARRANGE q4k_arrange
#define KQ_PANEL(...) kp_rows(KP_Q5_K, __VA_ARGS__)
#define KQ_DTYPE MOE_DTYPE_Q5_K
#define KQ_ENTRY moe_gemm_rows_q5_k_avx512
#include "runtime/cpu/gemm_q8_k_rows.h"
