/* attention.h - the attention block's ops: RMSNorm, RoPE, paged K/V store
 * and paged grouped-query attention.
 *
 * Mirrors the Hugging Face LlamaAttention family (eager path): RMSNorm in
 * fp32, rotate-half RoPE, softmax(q.k * scale) over causal (optionally
 * sliding-window) positions, heads h of a group sharing KV head
 * h / (Hq/Hkv).  The CPU functions here are the reference; *_cuda.cu files
 * are their twins. */
#pragma once

#include <math.h>

#include "kvcache/kvcache.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/core/batch.h"
#include "runtime/model/config.h"
#include "runtime/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One attention layer's shape and options, for the attention ops. */
struct moe_attn_params {
    int layer;
    int n_heads, n_kv_heads, head_dim;
    float scale;       /* 1/sqrt(Dh) */
    int window;        /* 0: full causal; else keys pos-window+1 .. pos */
    int max_ctx;       /* longest ctx_len of the batch (a launch hint; 0: unknown) */
    const float *sinks; /* (Hq) backend memory, or NULL: head h's softmax denominator
                           also holds exp(sinks[h]) (gpt-oss), as a key whose value is 0 */
    int chunk;         /* 0: none; else a query at pos sees keys from pos - pos % chunk on
                          (Llama-4's chunked attention) */
    int temp_floor;    /* 0: none; else Llama-4's attention temperature: a query at pos
                          scaled by log1p(floor((pos + 1) / temp_floor)) * temp_scale + 1 */
    float temp_scale;
    const int32_t *keys; /* NULL: every key from moe_attention_first_key on; else (T, n_keys)
                            backend memory: row t attends only to these positions of its
                            sequence, ascending, -1 past the last (DeepSeek sparse attention) */
    int n_keys;
};

/* The first key a query at pos sees: its window's or its chunk's first. */
static inline int moe_attention_first_key(const struct moe_attn_params *p, int pos)
{
    int first = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
    if (p->chunk > 0 && pos - pos % p->chunk > first) first = pos - pos % p->chunk;
    return first;
}

/* The score scale of a query at pos: p->scale, times the temperature. */
static inline float moe_attention_query_scale(const struct moe_attn_params *p, int pos)
{
    if (p->temp_floor <= 0) return p->scale;
    const float t = log1pf(floorf(((float)pos + 1.0f) / (float)p->temp_floor)) * p->temp_scale + 1.0f;
    return p->scale * t;
}

/* One Gated DeltaNet layer (Qwen3-Next's linear attention, config.h) for
 * the linear-attention ops. */
struct moe_delta_params {
    int layer;                 /* the layer's index among the linear layers (its state) */
    int n_k_heads, n_v_heads;  /* Hk, Hv: value head h reads q/k head h / (Hv / Hk) */
    int k_dim, v_dim;          /* Dk, Dv */
    int conv;                  /* the convolution's width */
    const float *conv_w;       /* (C, conv) F32, C = 2 Hk Dk + Hv Dv, backend memory */
    const float *a_log;        /* (Hv) F32: the decay rate is -exp(a_log) */
    const float *dt_bias;      /* (Hv) F32 */
    int chunk_min;             /* 0: the compilation's choice of form (below); else runs of at
                                  least this many rows take the chunked form (tests, benches) */
};
/* out (T, Hv*Dv) of one linear layer, each sequence's rows in order over
 * its state slot (kvcache.h; zeroed first when the sequence's first row is
 * at position 0), as transformers' Gated DeltaNet computes in fp32:
 *   qkv (T, C): the q, k, v projections; replaced in place by
 *     silu(causal depthwise convolution over the slot's last conv - 1
 *     inputs and these), which also become the slot's new last inputs;
 *   b, a (T, Hv): beta = sigmoid(b), g = -exp(a_log) softplus(a + dt_bias);
 *   per value head, q and k L2-normalised (eps 1e-6), q / sqrt(Dk):
 *     S = S exp(g); d = (v - S^T k) beta; S += k d^T; out = S^T q.
 * A sequence's run of rows takes that recurrence row by row
 * (torch_recurrent_gated_delta_rule) or its chunked form
 * (torch_chunk_gated_delta_rule; linear_attn_impl.h), equal to it within
 * fp32 rounding: the reference, as transformers, takes the chunked form in
 * chunks of 64 for every run of 2 rows or more; the AVX-512 compilation in
 * chunks of 32 for runs of 4 or more (faster per row there than its
 * recurrence, bench/delta_rule.c); the AVX2 one only the recurrence (its
 * chunked form is no faster there); chunk_min overrides the choice.  A row depends only on its
 * sequence's earlier rows and how they were split into steps, not on the
 * other sequences of the batch.  Fails only when per_thread is short of
 * moe_attention_delta_scratch (before any state changes). */
enum moe_status moe_attention_delta_cpu(float *out, float *qkv, const float *b, const float *a,
                                        struct moe_kvcache *kv, const struct moe_batch *bt,
                                        const struct moe_delta_params *p, float *scratch, size_t per_thread);
/* The same loops compiled for the fast backend's kernel set isa (AVX2 or
 * AVX-512 and up; the processor has it). */
enum moe_status moe_attention_delta_fast(enum moe_cpu_isa isa, float *out, float *qkv, const float *b, const float *a,
                                         struct moe_kvcache *kv, const struct moe_batch *bt,
                                         const struct moe_delta_params *p, float *scratch, size_t per_thread);
/* Those compilations themselves (linear_attn_avx2.c, linear_attn_avx512.c). */
enum moe_status moe_attention_delta_avx2(float *out, float *qkv, const float *b, const float *a,
                                         struct moe_kvcache *kv, const struct moe_batch *bt,
                                         const struct moe_delta_params *p, float *scratch, size_t per_thread);
enum moe_status moe_attention_delta_avx512(float *out, float *qkv, const float *b, const float *a,
                                           struct moe_kvcache *kv, const struct moe_batch *bt,
                                           const struct moe_delta_params *p, float *scratch, size_t per_thread);
/* The scratch each thread of those ops needs (scratch: (omp threads,
 * per_thread) floats, per_thread at least this), for any compilation and form. */
size_t moe_attention_delta_scratch(int Dk, int Dv);
/* DeepSeek sparse attention's indexer for one layer (config.h): for each
 * row t of b, its key k (T, Di) as projected (wk) is LayerNorm-ed (eps
 * 1e-6, norm_w, norm_b), rotated over its first rot values (halves, at its
 * position, inv_freq (rot/2)) and stored at its slot of indexer-key
 * layer `layer` in kv (moe_config_dsa_layer: layers without an indexer
 * keep none); then every key j <= pos of its sequence scores
 *   sum_h w[t,h] / sqrt(Hi) * relu(q[t,h] . k_j / sqrt(Di))
 * with q (T, Hi*Di) already rotated, and keys (T, topk) receives the topk
 * best positions (ties to the lower position), ascending, -1 past the
 * last: all of 0..pos while pos < topk.  fp32 throughout. */
void moe_attention_dsa_select_cpu(int32_t *keys, int topk, const float *q, float *k, const float *w,
                                  const float *norm_w, const float *norm_b, const float *inv_freq, int rot,
                                  struct moe_kvcache *kv, int layer, const struct moe_batch *b, int Hi, int Di);
/* y (rows, dim) = rmsnorm(x) * w; w has dim elements. y may equal x. */
void moe_attention_rmsnorm_cpu(float *y, const float *x, const struct moe_tensor *w, int rows,
                               int dim, float eps);
/* inv_freq (rope_dim/2) for cfg's RoPE type (default, linear, llama3),
 * computed as transformers does in fp32. */
void moe_attention_rope_freqs(float *inv_freq, const struct moe_config *cfg);
/* x (T, H, Dh) rotated in place: in each head, values i and i + rot/2 for
 * i < rot/2 (rot <= Dh; the rest pass unchanged, partial_rotary_factor). */
void moe_attention_rope_cpu(float *x, const int32_t *pos, int T, int H, int Dh, int rot,
                            const float *inv_freq);
/* Writes k, v (T, Hkv*Dh) into the cache slots of layer `layer` (v once
 * more only when the cache keeps V apart: MLA's v == k). */
void moe_attention_kv_store_cpu(struct moe_kvcache *kv, int layer, const float *k,
                                const float *v, const int32_t *slots, int T);
/* Scratch floats per thread of moe_attention_paged_cpu: running max and sum
 * and an accumulator for the G = Hq/Hkv heads of a group, plus one K and one
 * V row converted from the KV dtype. */
static inline size_t moe_attention_scratch_floats(int Hq, int Hkv, int Dh)
{
    size_t G = (size_t)(Hq / Hkv);
    return 2 * G + G * (size_t)Dh + 2 * (size_t)Dh;
}
/* out (T, Hq*Dh): paged attention of q (T, Hq*Dh) over each row's sequence.
 * Each KV head's keys are read once for all query heads of its group.
 * scratch: (omp threads, moe_attention_scratch_floats) floats. */
void moe_attention_paged_cpu(float *out, const float *q, const struct moe_kvcache *kv,
                             const struct moe_batch *b, const struct moe_attn_params *p,
                             float *scratch);
/* The fast twin (attention_fast.c, AVX2 vector dot products and one softmax
 * update per tile of keys; f32, f16, bf16 and fp8 caches read at their own
 * width); within fp32 tolerance of the reference, and for every dtype the
 * bits of an f32 cache holding the cache's values.  isa: the kernel set,
 * MOE_CPU_ISA_AVX2 or wider (AVX-512 and AMX take 512-bit kernels, the
 * same bits), no wider than moe_cpu_isa_detect().
 * scratch: (omp threads, scratch_per_thread) floats, scratch_per_thread at
 * least moe_attention_fast_scratch(G, Dh). */
size_t moe_attention_fast_scratch(int G, int Dh);
void moe_attention_paged_fast(enum moe_cpu_isa isa, float *out, const float *q, const struct moe_kvcache *kv,
                              const struct moe_batch *b, const struct moe_attn_params *p,
                              float *scratch, size_t scratch_per_thread);
/* dst (n) = e4m3(q[i]) * s, an fp8 KV row (kvcache.h) widened as the fast
 * attention widens it (AVX2): the bits of moe_kvcache_fp8_row_f32 (a NaN
 * byte: a NaN). */
void moe_kv_fp8_row_fast(float *dst, const uint8_t *q, float s, int n);
/* dst[i] = e^x[i], i < n, as the fast attention's softmax takes it (AVX2,
 * for x <= 88): within 2 ulps of expf; 0 under -87.33 (-inf included,
 * where expf would give a subnormal), NaN for NaN. */
void moe_attention_exp_avx2(float *dst, const float *x, int n);

#ifdef __cplusplus
}
#endif
