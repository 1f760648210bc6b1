/* backend.h - the compute backend interface.
 *
 * The forward pass (runtime/engine/forward.c) is written once against this table;
 * a backend says how each op is computed and where memory lives.  The CPU
 * backend is the reference; the fast CPU and the CUDA backends implement
 * the same ops.  Every pointer an op receives is backend memory (for the
 * CPU, ordinary host memory); weights are struct moe_tensor views that
 * prepare_model may rewrite in place (a repacked or uploaded copy the
 * backend owns), after which the model serves only that backend and is not
 * run after the backend is freed.  How each backend lays its weights out:
 * runtime/backend/backend_cpu.c and backend_cuda_impl.h.  Calling
 * prepare_model again with the same model does nothing; one that failed is
 * final (load the model again).  Activations are fp32 throughout.
 *
 * Numeric policies are pinned here, once, for every backend:
 * - RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, in fp32.
 * - RoPE: rotate-half pairing (i, i + Dh/2), angle = pos * inv_freq[i] in fp32.
 * - Routing: softmax over E in fp32; top-K by descending logit (the order of
 *   the probabilities), ties to the lower expert index; NaN ranks below every number (and NaNs among
 *   themselves by index), so ids are always in [0, E); renormalised weights
 *   divide by the sum of the K chosen.
 * - Dispatch: pairs (t, k) sorted by expert, stable in t*K+k order.
 * - Combine: out[t] = sum over k = 0..K-1 in order of w[t,k] * y[t,k].
 *
 * Threads: a backend and everything it owns are used by one thread at a
 * time (the engine's), which calls every op; a backend takes no lock, and
 * its ops may use a team of threads of their own (the CPU's OpenMP team).
 * Order: ops run in call order.  On the CPU every op is done when it
 * returns.  On CUDA an op queues its work on the backend's stream and
 * returns at once, unless it is marked [waits] below: it returns once the
 * device has finished everything queued before it (or, for experts, may
 * wait inside: see the op).  Host memory given to a queued op must stay
 * valid until the next [waits] op, except the source of to_device. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attention/attention.h"
#include "experts/experts.h"
#include "kvcache/kvcache.h"
#include "router/router.h"
#include "runtime/core/batch.h"
#include "runtime/model/model.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/cpu/gemm_fast.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_backend;

/* Steps of at most this many rows are decode-sized: the CUDA backend runs
 * them without any host synchronisation (device-driven expert kernels) and
 * may record them as graphs, and forward.c copies their routing for the
 * statistics recorder asynchronously (to_host_async). */
#define MOE_SMALL_STEP_ROWS 32

#define MOE_OP(name, ...) MOE_MUST_USE enum moe_status (*name)(struct moe_backend * be, __VA_ARGS__)

struct moe_backend_ops {
    const char *name;
    /* Backend memory is host memory (the CPU backends): the collectives of
     * expert and tensor parallelism (runtime/engine/ep.h) run on its
     * buffers in place; else forward.c stages them through host copies. */
    bool host_memory;
    void (*destroy)(struct moe_backend *be);
    /* memory */
    MOE_OP(alloc, size_t bytes, void **out);        /* zero-filled [waits] */
    /* NULL is fine; never inside a step (CUDA: retires recorded steps) [waits] */
    void (*dealloc)(struct moe_backend *be, void *p);
    /* returns once src may be reused (staged), not once dst holds it */
    MOE_OP(to_device, void *dst, const void *src, size_t bytes);
    MOE_OP(to_host, void *dst, const void *src, size_t bytes); /* [waits] */
    MOE_OP(prepare_model, struct moe_model *m);     /* weights into backend memory [waits] */
    MOE_MUST_USE enum moe_status (*sync)(struct moe_backend *be); /* [waits] */

    /* ops */
    /* x (T, D) = the rows of emb (R, D) of each token, emb holding the
     * vocabulary's rows [first, first + R) (first 0 and R the vocabulary,
     * or a rank's share under expert parallelism): a token outside them
     * gets a row of zeros.  The caller has checked the ids against the
     * vocabulary. */
    MOE_OP(embed, float *x, const int32_t *tokens, int T, const struct moe_tensor *emb, int64_t first);
    MOE_OP(rmsnorm, float *y, const float *x, const struct moe_tensor *w, int rows, int dim,
           float eps);
    /* y (T, N) = x (T, Din) . W^T (+ b), W (N, Din) in its stored dtype. */
    MOE_OP(matmul, float *y, const float *x, const struct moe_tensor *w,
           const struct moe_tensor *b, int T);
    /* Optional (NULL: the forward pass calls matmul n times): n <= 4
     * products y[i] (T, N_i) = x . W_i^T (+ b_i) of one input, computed
     * together (one parallel region, the input read once per tile). */
    MOE_OP(matmul_multi, int n, float *const *y, const float *x,
           const struct moe_tensor *const *w, const struct moe_tensor *const *b, int T);
    MOE_OP(add, float *y, const float *x, size_t n);            /* y += x */
    MOE_OP(scale, float *x, size_t n, float s);                 /* x *= s (Granite multipliers) */
    MOE_OP(clamp, float *x, size_t n, float limit);             /* x in [-limit, limit] */
    MOE_OP(swiglu, float *g, const float *u, size_t n);         /* g = silu(g) * u */
    /* x (T, H, Dh) rotated in place at positions pos (T): the first rot
     * values of each head, in halves (attention.h); inv_freq (rot/2). */
    MOE_OP(rope, float *x, const int32_t *pos, int T, int H, int Dh, int rot, const float *inv_freq);
    MOE_OP(kv_store, struct moe_kvcache *kv, int layer, const float *k, const float *v,
           const int32_t *slots, int T);
    /* out (T, Hq*Dh) from q (T, Hq*Dh) over the cache. */
    MOE_OP(attention, float *out, const float *q, const struct moe_kvcache *kv,
           const struct moe_batch *b, const struct moe_attn_params *p);
    /* One linear-attention layer's Gated DeltaNet (attention.h,
     * moe_attention_delta_cpu): out (T, Hv*Dv); qkv (T, C) replaced by its
     * convolved values; the state slots of bt's sequences in kv read and
     * updated.  Optional (NULL: the backend does not run hybrid models). */
    MOE_OP(delta_net, float *out, float *qkv, const float *b, const float *a, struct moe_kvcache *kv,
           const struct moe_batch *bt, const struct moe_delta_params *p);
    /* DeepSeek sparse attention's indexer for one layer (attention.h,
     * moe_attention_dsa_select_cpu): k (T, Di) normed, rotated and cached
     * in place (at indexer-key layer `layer`, moe_config_dsa_layer), keys
     * (T, topk) the positions each row attends to; norm_w and norm_b F32.
     * Optional (NULL: the backend does not run it). */
    MOE_OP(dsa_select, int32_t *keys, int topk, const float *q, float *k, const float *w,
           const struct moe_tensor *norm_w, const struct moe_tensor *norm_b, const float *inv_freq, int rot,
           struct moe_kvcache *kv, int layer, const struct moe_batch *b, int Hi, int Di);
    /* ids (T, K), w (T, K) from router logits (T, E). */
    MOE_OP(route, int32_t *ids, float *w, const float *logits, int T, const struct moe_route *r);
    MOE_OP(dispatch, struct moe_dispatch *plan, const int32_t *ids, int T, int K, int E);
    /* out (T, D) = combine of the K experts' SwiGLU FFN of x (T, D), with
     * ex's biases and activation (model.h) when it has them.  CUDA waits
     * inside for the step's per-expert counts on steps of more than
     * MOE_SMALL_STEP_ROWS rows and on every step of an offloaded layer;
     * decode-sized steps of resident layers never wait. */
    MOE_OP(experts, float *out, const float *x, const struct moe_dispatch *plan, const float *w,
           const struct moe_expert_weights *ex, const struct moe_expert_ws *ws, int T, int K, int D,
           int F, int E);
    /* out (T, D) = the weighted combine of ws->ye in token order, k = 0..K-1
     * (experts.h), after an expert-parallel experts call (plan->hi > 0:
     * ex a table of the layer's slots, only slots lo..hi-1 computed, their
     * rows of ws->ye left in fp32 with the down bias, nothing combined)
     * and the gathering of the other ranks' rows.  Optional: NULL, the
     * backend has no expert-parallel path. */
    MOE_OP(combine, float *out, const struct moe_expert_ws *ws, const struct moe_dispatch *plan, const float *w,
           int T, int K, int D);
    /* y (T, D) *= sigmoid(g (T)) */
    MOE_OP(sigmoid_scale, float *y, const float *g, int T, int D);
    /* y (T, D) = x (T, D) with row t times s[t].  Optional (NULL: the
     * backend does not run Llama-4's routing, whose router score scales
     * the chosen expert's input). */
    MOE_OP(scale_rows, float *y, const float *x, const float *s, int T, int D);
    /* dst (n, D) = src rows[i] */
    MOE_OP(gather_rows, float *dst, const float *src, const int32_t *rows, int n, int D);
    /* dst[r*ld_dst + j] = src[r*ld_src + (idx ? idx[j] : j)] for r < rows,
     * j < n: a column gather (idx (n) backend memory, or NULL: a 2-D copy).
     * Optional, with head_matmul: MLA needs both. */
    MOE_OP(gather_cols, float *dst, int ld_dst, const float *src, int ld_src, int rows,
           const int32_t *idx, int n);
    /* Per-head products of MLA's absorbed attention: for each head h < H and
     * row t < T, y[(t*H + h)*ldy + i] = sum_k W[h][i][k] * x[(t*H + h)*ldx + k]
     * for i < N, k < K; W (H, N, K) in its stored dtype.  Optional (NULL: the
     * backend does not run MLA models). */
    MOE_OP(head_matmul, float *y, int ldy, const float *x, int ldx, const struct moe_tensor *w,
           int T);
    /* ids (rows) = argmax of each row of x (rows, n), as moe_argmax
     * (runtime/core/argmax.h): ties to the lower index, NaN never wins. */
    MOE_OP(argmax, int32_t *ids, const float *x, int rows, int n);

    /* Optional entries (NULL when a backend has no use for them). */
    /* Sizes the backend's own workspaces for steps of at most max_rows rows
     * of cfg's model; called by moe_forward_init, so no op allocates.
     * [waits] when it grows them. */
    MOE_OP(reserve, const struct moe_config *cfg, int max_rows);
    /* dst (n elements of dt, backend memory) = the runtime/model/synth.c generator
     * keyed by key with standard deviation std, or ones when std < 0. */
    MOE_OP(synth_fill, void *dst, enum moe_dtype dt, size_t n, uint64_t key, float std);
    /* out (n_moe_layers, E) host = tokens routed to each expert so far, by
     * MoE layer in forward order (dispatch calls since the step's embed).
     * [waits] */
    MOE_OP(expert_load, uint64_t *out, int n_moe_layers, int E);
    /* Step graphs.  forward.c brackets the ops of a step (after the batch
     * upload, before the logits copy) with graph_begin / graph_end.  key
     * names the forward workspace (its buffers, cache and block-table width
     * are fixed) and what the step copies to the host (a step with
     * statistics copies has a key of its own); a backend that has a recorded step for (key, rows,
     * n_logits) sets *replay and forward.c skips the ops; otherwise it may
     * start recording.  graph_end(ok) finishes: replays, or ends the
     * recording and runs it (ok false: discards it). */
    MOE_OP(graph_begin, const void *key, int rows, int n_logits, bool *replay);
    MOE_OP(graph_end, bool ok);
    /* Host buffers for to_host_async (zero-filled; CPU: calloc/free, CUDA:
     * pinned memory).  host_free(NULL) is fine.  A backend has all three of
     * host_alloc, host_free and to_host_async, or none. */
    MOE_OP(host_alloc, size_t bytes, void **out);
    void (*host_free)(struct moe_backend *be, void *p);
    /* Device-to-host copy in stream order that does not wait: dst (a
     * host_alloc buffer) holds the bytes once the next sync returns, and may
     * not be read before.  Allowed between graph_begin and graph_end (a
     * recorded step replays the copy into the same dst).  CPU: a memcpy. */
    MOE_OP(to_host_async, void *dst, const void *src, size_t bytes);
    /* Collectives on backend memory for expert and tensor parallelism
     * (runtime/engine/forward_ep.c).  Optional: without them, or when a
     * group does not open, the engine stages those collectives through host
     * memory and MPI.  A backend holds up to MOE_COLL_GROUPS groups of
     * ranks (MOE_COLL_EP, MOE_COLL_TP).  coll_id(NULL) says whether the
     * transport can open on this rank at all; coll_id writes a new group id
     * (MOE_COLL_ID_BYTES) on the group's rank 0; every rank then passes it
     * to coll_open as `rank` of `size` (world_rank names the process in
     * messages), which returns once all have joined, or fails after
     * timeout_s; an open group is closed first.  coll_close leaves a
     * group (one not open: nothing).  coll_sum: buf (n) = the sum over the group of each
     * rank's buf.  coll_share: in place over buf, the floats [offs[r],
     * offs[r+1]) of rank r (offs host, size + 1) sent to every rank, for
     * each r.  coll_gather: rank r's mine (offs[r + 1] - offs[r] floats)
     * into the group's rank 0's all at offs[r], for each r (all: rank 0's
     * only, NULL elsewhere).  All three [waits]; past the timeout they
     * fail, and the group is unusable (the caller ends the job). */
    MOE_OP(coll_id, void *id);
    MOE_OP(coll_open, int group, const void *id, int rank, int size, int world_rank, double timeout_s);
    void (*coll_close)(struct moe_backend *be, int group);
    MOE_OP(coll_sum, int group, float *buf, size_t n, const char *what);
    MOE_OP(coll_share, int group, float *buf, const size_t *offs, const char *what);
    MOE_OP(coll_gather, int group, const float *mine, float *all, const size_t *offs, const char *what);
};

#define MOE_COLL_ID_BYTES 128 /* a group id (NCCL's unique id) */
enum { MOE_COLL_EP, MOE_COLL_TP, MOE_COLL_GROUPS };

/* Weights quantized at prepare_model (a memory-vs-compute knob;
 * moe_backend_opts.quant). */
enum moe_weight_quant {
    MOE_QUANT_NONE,
    MOE_QUANT_Q8_0, /* every 2-D weight but the routers and the embedding, K % 32 == 0,
                       to ggml's Q8_0 (runtime/core/tensor.h) */
    MOE_QUANT_Q4,   /* the same weights but the LM head to ggml's Q4_1, the LM head
                       to Q8_0 (as llama.cpp's four-bit presets keep the output
                       layer at six bits or more) */
    MOE_QUANT_Q4_K_M, /* q4, but with llama.cpp's Q4_K_M choices (every backend;
                         moe_quant_q4_k_m_dtype): the down projections and
                         attention V of some layers, and the LM head, at Q6_K */
    MOE_QUANT_Q5_K,   /* q4's weights to ggml's Q5_K (moe_q5_quant_dtype: Q4_1
                         where rows are not multiples of 256), the LM head to
                         Q8_0; the CPU backends only */
    MOE_QUANT_Q5_K_M, /* q5_k with llama.cpp's Q5_K_M choices, which are its
                         Q4_K_M ones over a Q5_K base (moe_quant_q4_k_m_dtype);
                         the CPU backends only */
};
/* Whether q takes llama.cpp's _K_M choices (q4_k_m, q5_k_m); whether its
 * base is five-bit (q5_k, q5_k_m). */
static inline bool moe_quant_k_m(enum moe_weight_quant q) { return q == MOE_QUANT_Q4_K_M || q == MOE_QUANT_Q5_K_M; }
static inline bool moe_quant_q5(enum moe_weight_quant q) { return q == MOE_QUANT_Q5_K || q == MOE_QUANT_Q5_K_M; }
/* The format q4, q4_k_m, q5_k and q5_k_m make of a matrix with rows of K
 * values before their _K_M choices: moe_q4_quant_dtype or
 * moe_q5_quant_dtype; of an expert of D x F (all three matrices): the
 * expert forms. */
static inline enum moe_dtype moe_quant_base_dtype(enum moe_weight_quant q, int64_t K)
{
    return moe_quant_q5(q) ? moe_q5_quant_dtype(K) : moe_q4_quant_dtype(K);
}
static inline enum moe_dtype moe_quant_base_expert_dtype(enum moe_weight_quant q, int64_t D, int64_t F)
{
    return moe_quant_q5(q) ? moe_q5_quant_expert_dtype(D, F) : moe_q4_quant_expert_dtype(D, F);
}

/* Under --quantize q4_k_m (and q5_k_m), the dtype a matrix with rows of K
 * values takes instead of q4's (q5_k's), or MOE_DTYPE_N when it takes the
 * base format: llama.cpp's Q4_K_M rule (llama_tensor_get_type) with layer
 * l of n (the layers that have such a matrix) "using more bits" when l <
 * n/8, l >= 7n/8 or (l - n/8) % 3 == 2.  llama.cpp's Q5_K_M makes the same
 * choices for these parts (its attention V and down projections name
 * Q4_K_M and Q5_K_M together, the LM head rule and the 8-expert K and V
 * rule hold for any type), with Q5_K as the default; the one Q4_K_M rule
 * Q5_K_M lacks, attention's output at Q5_K with 8 experts, moerun does
 * not make under q4_k_m either.  down: a down projection (an expert's, the shared expert's, a
 * dense feed-forward's); v, k: attention's value and key projections;
 * lm_head: the LM head.  Q6_K for down and v in the layers using more bits
 * and the LM head; Q8_0 for v and k in every layer when the model has 8
 * experts (as llama.cpp does for Mixtral-like models); Q8_0 where Q6_K's
 * rows of 256 do not fit K. */
enum moe_q4_k_m_part { MOE_Q4KM_DOWN, MOE_Q4KM_V, MOE_Q4KM_K, MOE_Q4KM_LM_HEAD };
enum moe_dtype moe_quant_q4_k_m_dtype(enum moe_q4_k_m_part part, int l, int n, int n_experts, int64_t K);
/* The same for 2-D matrix t of m: of layer l (its V and K projections
 * counted over the layers that have V, its down projections over all),
 * or the LM head (t == &m->lm_head); MOE_DTYPE_N for the other matrices.
 * Every backend's packer asks it. */
enum moe_dtype moe_quant_q4_k_m_tensor(const struct moe_model *m, int l, const struct moe_tensor *t);

#define MOE_EXPERT_QUANT_DEFAULT 255 /* moe_backend_opts.expert_quant: follow quant */

struct moe_backend {
    const struct moe_backend_ops *ops;
    void *ctx;                   /* backend private state */
    int n_threads;
    enum moe_weight_quant quant; /* moe_backend_opts.quant, read-only */
    const uint8_t *expert_quant; /* moe_backend_opts.expert_quant (and its sizes), read-only */
    int expert_quant_layers, expert_quant_e;
};

/* Expert offload so far (moe_offload_opts.gpu_experts): layers offloaded,
 * expert uses (once per expert per layer step) and those that found the
 * expert in a slot, bytes copied in, bytes held in host memory; layer
 * steps, their rounds (more than one when a step routes to more than C
 * experts) and the steps that took the grouped GEMMs; expert uses computed
 * on the CPU instead (moe_offload_opts.cpu_rows; not among the accesses) and
 * their rows. */
struct moe_offload_stats {
    int layers;
    int64_t accesses, hits, steps, rounds, grouped_steps, cpu_uses, cpu_rows;
    uint64_t bytes_in, host_bytes;
};
/* Zeros unless be is a CUDA backend with offloaded layers. */
void moe_cuda_offload_stats(const struct moe_backend *be, struct moe_offload_stats *st);

/* The kernel of the CUDA backend's prefill-sized attention steps. */
enum moe_prefill_attn {
    MOE_PREFILL_ATTN_TILED, /* tiled causal kernel (the default) */
    MOE_PREFILL_ATTN_ROWS,  /* the per-row decode kernel (to compare the two) */
    MOE_PREFILL_ATTN_MMA,   /* tensor cores, bf16/f16 caches of head dim 64 or 128 (opt-in) */
};

/* The kernels of the CUDA backend's expert steps of many rows. */
enum moe_expert_kernels {
    MOE_EXPERT_KERNELS_CUBLAS, /* widened weights, cuBLAS grouped GEMMs (the default) */
    MOE_EXPERT_KERNELS_MMA,    /* tensor-core grouped GEMMs driven from the device (opt-in) */
};

/* CUDA expert offload: each MoE layer keeps gpu_experts of its experts in
 * device slots and the rest in pinned host memory, copied in when routed
 * to (docs/offload.md).  Ignored by the CPU backends. */
struct moe_offload_opts {
    int gpu_experts; /* slots per MoE layer; 0 or at least the layer's experts: all resident */
    bool lfu;        /* slot policy LFU (false: LRU) */
    /* warm start: each MoE layer's routed counts from earlier statistics,
     * (warm_layers, warm_e) doubles, borrowed (init copies them), or NULL:
     * slots start empty (experts/expert_cache.h); prepare_model refuses a
     * shape other than the model's */
    const double *warm;
    int warm_layers, warm_e;
    /* a step's missed experts with at most this many rows each computed on
     * the CPU from the host copy instead of copied in (0: every miss copied in) */
    int cpu_rows;
};

/* How a backend is set up.  The library reads no environment: the CLI maps
 * its options and the documented MOERUN_* variables onto this struct
 * (runtime/cli/cli_common.c, docs/cli.md).  Start from
 * moe_backend_opts_defaults; a NULL opts means those defaults. */
struct moe_backend_opts {
    int n_threads;                /* CPU threads; 0: all cores (OpenMP's default) */
    int device;                   /* CUDA device ordinal */
    int local_rank;               /* several ranks: the process's rank on its machine; the CUDA
                                     backend takes device (device + local_rank) mod the count */
    enum moe_cpu_isa cpu_isa_max; /* fast CPU: the widest kernel set it may use (an
                                     AMX variant: that one, where AMX runs) */
    bool cpu_panels;              /* fast CPU: bf16 matrices repacked into panels at
                                     prepare_model (false: the stored layout) */
    bool cuda_graphs;             /* CUDA: decode steps recorded as graphs and replayed */
    bool cuda_strict;             /* CUDA: a grouped GEMM cuBLAS refuses is an error, not
                                     a reason to take the other path (tests/gpu/run.sh) */
    enum moe_prefill_attn prefill_attn;
    enum moe_expert_kernels expert_kernels;
    bool cuda_small_cublas;       /* CUDA: steps of few rows' F32/BF16/F16 projections on
                                     cuBLAS too (to compare; rows then depend on each other) */
    bool cuda_expert_gemm_loop;   /* CUDA: the grouped path's GEMMs one cublasGemmEx per
                                     expert instead of one grouped call (to compare) */
    enum moe_weight_quant quant;  /* weights quantized at prepare_model */
    /* Per-expert precision (--expert-dtype-plan), CPU backends: the
     * quantization of expert e of model layer l is expert_quant[l * E + e]
     * for l < expert_quant_layers, e < E = expert_quant_e: MOE_QUANT_NONE
     * (as stored), MOE_QUANT_Q8_0, MOE_QUANT_Q4, or MOE_EXPERT_QUANT_DEFAULT
     * (follow quant, as every expert outside the table does); the other
     * weights follow quant.  prepare_model refuses an entry other than the
     * default for an expert or layer the model does not have, or a dense
     * layer.  NULL: every expert follows quant.  moe_backend_init copies
     * it. */
    const uint8_t *expert_quant;
    int expert_quant_layers, expert_quant_e;
    struct moe_offload_opts offload;
};

/* n_threads 0, device 0, kernel sets up to MOE_CPU_ISA_DEFAULT_CAP (AMX
 * only when asked), panels on, graphs off, strict
 * off, tiled prefill attention, cuBLAS experts, no quantization, every
 * expert resident. */
void moe_backend_opts_defaults(struct moe_backend_opts *o);

/* The CPU reference backend ("cpu-ref"); n_threads 0 = all cores (OpenMP
 * default). */
MOE_MUST_USE enum moe_status moe_backend_cpu_init(struct moe_backend *be, int n_threads);
/* The CUDA backend on device ordinal `device`, default options; MOE_ERR_DEVICE
 * when the device cannot be used, MOE_ERR_UNSUPPORTED when built without
 * CUDA. */
MOE_MUST_USE enum moe_status moe_backend_cuda_init(struct moe_backend *be, int device);
/* The fast CPU backend ("cpu"), default options: the reference with matmul,
 * experts and attention replaced by AVX2 or AVX-512 kernels, whichever is the
 * best this processor runs (runtime/cpu/gemm_fast.h); the reference where it
 * runs neither. */
MOE_MUST_USE enum moe_status moe_backend_cpu_fast_init(struct moe_backend *be, int n_threads);
/* Kernel set a CPU backend uses: 0 (MOE_CPU_ISA_REF) for the reference,
 * see enum moe_cpu_isa in runtime/cpu/gemm_fast.h. */
int moe_backend_cpu_isa(const struct moe_backend *be);
/* Chooses a backend by name: "cpu" (fast), "cpu-ref" (reference), "cuda",
 * or "auto" (CUDA when a device is present, else "cpu" with a one-line
 * notice on stderr), set up with o (NULL: the defaults). */
MOE_MUST_USE enum moe_status moe_backend_init(struct moe_backend *be, const char *name,
                                               const struct moe_backend_opts *o);
void moe_backend_free(struct moe_backend *be);
/* --expert-dtype-plan: the quantization expert e of model layer l takes
 * under be (be->expert_quant's entry, or be->quant where the plan has
 * none or says follow it). */
enum moe_weight_quant moe_backend_expert_quant(const struct moe_backend *be, int l, int e);
/* Checks be's per-expert plan against m before anything is quantized: an
 * entry other than the default for an expert or layer m does not have,
 * or for a dense layer, or of an unknown format, is refused by name. */
MOE_MUST_USE enum moe_status moe_backend_check_expert_plan(const struct moe_backend *be,
                                                            const struct moe_model *m);
/* be's alloc and dealloc as an allocator for a module that owns buffers in
 * backend memory (the KV cache); be is borrowed and outlives those buffers. */
struct moe_allocator moe_backend_allocator(struct moe_backend *be);

/* Number of usable CUDA devices; 0 when built without CUDA, with no driver
 * or no device (why is written to `why` when non-NULL). */
int moe_cuda_device_count(char *why, size_t why_len);
/* Steps the CUDA backend be has replayed from recorded graphs (0 for any
 * other backend, or without CUDA). */
int64_t moe_cuda_graph_replays(const struct moe_backend *be);
/* Times the CUDA backend be has run its tensor-core expert kernels
 * (MOERUN_CUDA_EXPERTS=mma): once per experts call, or per round of an
 * offloaded layer; 0 for any other backend, or without CUDA. */
int64_t moe_cuda_mma_expert_calls(const struct moe_backend *be);

#ifdef __cplusplus
}
#endif
