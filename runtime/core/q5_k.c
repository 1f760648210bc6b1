/* q5_k.c - the Q5_K format's quantizer (MOE_DTYPE_Q5_K, tensor.h): the
 * fit of each block is q5_k_fit.h's, here in plain C, and where the
 * processor has AVX2 q5_k_avx2.c's (a group's 8 lanes in one register,
 * the same bytes); the packing of the rows. */
#include <string.h>

#include "runtime/core/q4_k_impl.h"
#include "runtime/core/q5_k_fit.h"
#include "runtime/core/q5_k_impl.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

bool moe_q5_k_block_portable(const float *x, unsigned char head[16], uint8_t q[256]) { return q5k_block(x, head, q); }

bool moe_q5_k_quantize_row_with(moe_q5_k_block_fn block, void *dst, const float *src, size_t n)
{
    unsigned char *b = dst;
    MOE_ASSERT(n % MOE_Q5_K_BLOCK == 0);
    if (moe_k_quant_row_bad(src, n)) return false;
    for (size_t o = 0; o < n; o += MOE_Q5_K_BLOCK, b += MOE_Q5_K_BYTES) {
        uint8_t q[MOE_Q5_K_BLOCK];
        if (!block(src + o, b, q)) return false;
        moe_q5_k_pack_codes(b, q);
    }
    return true;
}

bool moe_quantize_row_q5_k(void *dst, const float *src, size_t n)
{
    return moe_q5_k_quantize_row_with(moe_q4_k_has_avx2() ? moe_q5_k_block_avx2 : moe_q5_k_block_portable, dst,
                                      src, n);
}
