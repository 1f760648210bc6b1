/* linear_attn_avx512.c - the Gated DeltaNet's loops (linear_attn_impl.h)
 * compiled for AVX-512 (16 lanes): the fast backend's delta_net where the
 * processor has it (moe_attention_delta_fast).  The products are fused
 * multiply-adds, so the values differ from the reference's in rounding only. */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "runtime/core/status.h"

#pragma GCC target("avx512f,fma")

#define DELTA_FMA(a, b, c) fmaf(a, b, c)
#define DELTA_NC 32
#define DELTA_CHUNK 32
#define DELTA_CHUNK_MIN 4
#define DELTA_ENTRY delta_entry_avx512
#include "attention/linear_attn_impl.h"

_Static_assert(DELTA_CHUNK <= 64, "moe_attention_delta_scratch counts chunks of 64 at most");

enum moe_status moe_attention_delta_avx512(float *out, float *qkv, const float *b, const float *a, struct moe_kvcache *kv,
                                        const struct moe_batch *bt, const struct moe_delta_params *p, float *scratch,
                                        size_t per_thread)
{
    return delta_entry_avx512(out, qkv, b, a, kv, bt, p, scratch, per_thread);
}
