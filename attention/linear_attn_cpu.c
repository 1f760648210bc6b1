/* linear_attn_cpu.c - the Gated DeltaNet of hybrid models on the CPU
 * (attention.h): the loops of linear_attn_impl.h in plain C for the
 * reference backend, and the fast backend's choice among their AVX2 and
 * AVX-512 compilations (linear_attn_avx2.c, linear_attn_avx512.c). */
#include "runtime/core/status.h"

#define DELTA_FMA(a, b, c) ((a) * (b) + (c))
#define DELTA_NC 16
#define DELTA_CHUNK 64
#define DELTA_CHUNK_MIN 2
#define DELTA_ENTRY delta_entry_ref
#include "attention/linear_attn_impl.h"

enum moe_status moe_attention_delta_cpu(float *out, float *qkv, const float *b, const float *a, struct moe_kvcache *kv,
                                        const struct moe_batch *bt, const struct moe_delta_params *p, float *scratch,
                                        size_t per_thread)
{
    return delta_entry_ref(out, qkv, b, a, kv, bt, p, scratch, per_thread);
}

/* the reference's chunks of 64 are the longest of any compilation (theirs
 * assert it) */
size_t moe_attention_delta_scratch(int Dk, int Dv) { return delta_chunk_floats(Dk, Dv); }

enum moe_status moe_attention_delta_fast(enum moe_cpu_isa isa, float *out, float *qkv, const float *b,
                                         const float *a, struct moe_kvcache *kv, const struct moe_batch *bt,
                                         const struct moe_delta_params *p, float *scratch, size_t per_thread)
{
    if (isa >= MOE_CPU_ISA_AVX512) return moe_attention_delta_avx512(out, qkv, b, a, kv, bt, p, scratch, per_thread);
    if (isa == MOE_CPU_ISA_AVX2) return moe_attention_delta_avx2(out, qkv, b, a, kv, bt, p, scratch, per_thread);
    return delta_entry_ref(out, qkv, b, a, kv, bt, p, scratch, per_thread);
}
