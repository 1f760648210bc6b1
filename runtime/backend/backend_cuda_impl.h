/* backend_cuda_impl.h - the CUDA backend's private state, in named parts,
 * and the functions its files share (struct cuda_ctx says which calls
 * which).  Host C with the CUDA runtime and cuBLAS headers; nothing
 * outside the backend includes it.
 *
 * The weights on the device: prepare_model (backend_cuda_upload.c) uploads
 * every weight once, in its stored dtype, and rewrites the model's tensor
 * views in place to device pointers (device = 0).  The experts of a MoE
 * layer become two stacked device buffers, (E, 2F, D) gate+up (gate rows
 * first) and (E, D, F) down, whatever the checkpoint layout, and the
 * expert table is rewritten to point into them: gate[e] = gate[0] +
 * e*2F*D elements, up[e] = gate[e] + F*D, down[e] = down[0] + e*D*F.
 * MXFP4 and FP8_B128 experts keep their dtype and each stack is planes
 * (runtime/core/tensor.h: the values of all its matrices, then their
 * scales), the table pointing at each matrix's values: gate[e] = gate[0] +
 * 2e*V bytes, up[e] = gate[e] + V, down[e] = down[0] + e*V, V =
 * moe_planes_values_bytes(dtype, F, D).  Under --quantize q4_k_m a
 * layer's down stack may take its own dtype (the table's down_dtypes,
 * moe_expert_down_dtype), its V then that dtype's.  The experts op
 * requires that layout.  An offloaded layer (struct offload_layer) keeps the same layout
 * in pinned host memory and in its device slots. */
#pragma once

#include "attention/attention_cuda.h"
#include "experts/expert_cache.h"
#include "experts/experts.h"
#include "experts/experts_cuda.h"
#include "router/router_cuda.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/backend_impl.h"
#include "runtime/cuda/cuda_util.h"
#include "runtime/cuda/nccl_cuda.h"

#define ATT_SPLIT_ROWS 64  /* rows that may use split-K attention; more: the tiled prefill kernel */
#define ATT_MAX_SPLITS 32
#define SMALL_EXPERT_ROWS MOE_SMALL_STEP_ROWS /* T at or below: device-driven expert kernels */
#define WIDE_DENSE_MAX ((size_t)32 << 20) /* values of a planes matrix widened at a time (64 MiB of bf16) */
#define MAX_GRAPHS 16        /* recorded step graphs kept */
#define BLAS_WS_BYTES ((size_t)32 << 20) /* cuBLAS workspace when graphs are on */

enum part { P_EMBED, P_HEAD, P_ATTN, P_NORM, P_DENSE, P_ROUTER, P_EXPERTS, P_SHARED, P_COUNT };
extern const char *const moe_cuda_part_names[P_COUNT];

struct upload {
    const void *host;
    void *dev;
    enum moe_dtype dtype; /* on the device (FP8 widened to BF16, or kept as planes) */
    const int32_t *cols;  /* its column order on the device (act-order four-bit), or NULL */
    bool quantized;       /* made by --quantize at upload (dtype Q8_0, Q4_1 or Q4_K) */
};

/* Device memory the context owns: weight uploads, deduplicated by host
 * pointer, and further buffers (stacked experts, offload slots), all freed
 * at destroy; bytes of weights by part of the model. */
struct cuda_mem {
    struct upload *up;
    size_t n_up, cap_up;
    void **owned;
    size_t n_owned, cap_owned;
    void **host;             /* host memory (malloc) freed at destroy */
    size_t n_host, cap_host;
    size_t part_bytes[P_COUNT];
};

/* What prepare_model made of the model's weights. */
struct cuda_weights {
    bool widened_fp8;        /* FP8_B128 weights (not experts) widened to bf16 */
    bool mxfp4_experts, fp8_experts; /* such experts kept as planes */
    bool fp8_dense;          /* FP8 matmul weights kept as planes (cuda_matmul reads them in place) */
    bool q8_experts, q8_dense; /* experts or matmul weights quantized to Q8_0 planes */
    bool q4_experts, q4_dense; /* four-bit experts or matmul weights kept as planes */
    bool q4_1_made, q4_k_made; /* those quantized at upload (--quantize q4, q4_k_m), by format */
    bool q6_k_made;            /* Q6_K matrices quantized at upload (--quantize q4_k_m) */
    int *q8_bad;             /* device int: the quantize kernel's flag (owned) */
    size_t planes_dense_max; /* the most values of one planes matrix (N x Din) */
};

/* Workspaces reserve sizes for steps of max_rows rows. */
struct cuda_work {
    int max_rows, max_din, max_k, max_e, moe_layers;
    void *xh;                /* (max_rows, max_din) half GEMM inputs */
    float *att_ws;           /* split attention partials ... */
    size_t att_ws_floats;    /* ... of the per-row or MLA kernel, in floats */
    void *sort_temp;         /* CUB radix sort space */
    size_t sort_bytes;
    int32_t *sort_vals, *sort_keys; /* (max_rows * max_k) */
    uint64_t *d_load, *h_load; /* expert load counters, (moe_layers, max_e), device and pinned */
    int dispatch_ordinal;    /* MoE layer of the next dispatch in this step */
    void *wide_dense;        /* bf16: a planes matrix widened for a step of many rows */
    size_t wide_dense_bytes;
};

/* The expert kernels' state (backend_cuda_experts.c): the cuBLAS grouped
 * GEMM's parameter arrays, the device-driven kernels' active list, the
 * tensor-core kernels' tiles and the bf16 buffer planes experts widen into. */
/* One MoE layer's slot maps under expert parallelism (struct
 * cuda_experts): key, the layer's stack (or per-expert plan); its slots
 * [lo, hi) of E; held, the rank's slots in each of its stacks. */
struct cuda_ep_maps {
    const void *key;
    int lo, hi, E;
    int held[3];
};

struct cuda_experts {
    /* host parameter arrays (max_e each), pinned pointer arrays (6 max_e:
     * A, B, C of gate_up then of down) and their device copy (the grouped
     * call's; gemm_loop reads the host arrays and leaves it unfilled) */
    int *g_m, *g_n, *g_k, *g_lda, *g_ldb, *g_ldc, *g_size;
    float *g_alpha, *g_beta;
    cublasOperation_t *g_ta, *g_tb;
    int32_t *h_counts;       /* pinned (max_e): a step's rows per expert */
    void **h_ptrs;           /* pinned (6 max_e) */
    void **d_ptrs;           /* device (6 max_e) */
    int32_t *active;         /* device (max_e + 1): the experts with rows (decode path) */
    /* bf16 (E, 2F, D) + (E, D, F): a layer's MXFP4 / FP8 / Q8_0 experts
     * widened for the grouped path (reserved for models with such experts) */
    void *wide;
    size_t wide_bytes;
    /* MOE_EXPERT_KERNELS_MMA: the tensor-core expert kernels, their tile
     * list (moe_expert_mma_tile_ints(max_rows * max_k, max_e) int32s) */
    bool mma;
    int32_t *mma_tiles;
    size_t mma_tile_ints;
    int64_t mma_calls;       /* runs of them (one per expert call, or per offload round) */
    bool no_grouped;         /* cuBLAS refused the grouped GEMM: small path only */
    bool gemm_loop;          /* the grouped path as a cublasGemmEx per expert (cuda_expert_gemm_loop) */
    /* expert parallelism: per MoE layer, each slot's place in the rank's
     * stacks, -1 for other ranks' slots (a map per stack: up to 3, a
     * per-expert plan's formats), made at the layer's first step and kept
     * (ep_layer_maps, backend_cuda_experts.c); host and device, (ep_cap,
     * 3, max_e) */
    struct cuda_ep_maps *ep_maps; /* (ep_cap) */
    int ep_cap, ep_n;
    int32_t *ep_h_map, *ep_d_map;
    /* per-expert plans: (max_rows * max_k, D) fp32 rows, each stack's
     * results gathered there when a stack's path leaves them in half
     * precision (moe_cuda_experts_mixed) */
    float *mixed_rows;
    size_t mixed_rows_floats;
};

/* A recorded step: the ops of one forward workspace for a step shape. */
struct step_graph {
    const void *key;
    int rows, n_logits;
    cudaGraphExec_t exec;
};

/* Step graphs (moe_backend_opts.cuda_graphs; backend_cuda_graphs.c):
 * decode-sized steps recorded once per (workspace, rows, logit rows) and
 * replayed. */
struct cuda_graphs {
    bool on;
    void *blas_ws;           /* the cuBLAS workspace recorded calls use */
    struct step_graph list[MAX_GRAPHS];
    int n, next_evict;
    struct step_graph pending; /* the step being recorded */
    int capturing;           /* 1 while recording */
    int replaying;           /* index + 1 of the graph graph_end launches */
    int64_t replays;         /* recorded steps replayed so far */
};

/* A MoE layer whose experts a per-expert precision plan put in several
 * formats (--expert-dtype-plan; backend_cuda_upload.c): one stack per
 * format, each holding its C experts in expert order, stacked as a whole
 * layer's are (gate+up at gu, down at dn; planes: the scales after the C
 * experts' values).  The table's backend_layer points here and its
 * dtypes at dtypes; the experts op runs each stack over its experts as an
 * offloaded layer's round does (map: each expert's place in the stack, -1
 * where another stack holds it; host for cuBLAS, device for the
 * kernels). */
struct cuda_mixed_set {
    enum moe_dtype dtype;
    int C;
    const void *gu, *dn;
    int32_t *h_map, *d_map;  /* (E) */
};
struct cuda_mixed {
    int n;                   /* stacks (2 or 3) */
    struct cuda_mixed_set set[3];
    enum moe_dtype dtypes[]; /* (E) each expert's */
};

/* A MoE layer whose experts live in pinned host memory, C of them in
 * device slots at a time (moe_offload_opts.gpu_experts;
 * backend_cuda_offload.c).  The layer's expert table holds it as its
 * backend_layer (model.h), so the experts op knows the layer is offloaded
 * without a lookup.  Host stacks and slots have the device layout of a
 * layer's stacks (E experts, resp. C), each expert's share ge + gs bytes
 * of the gate+up stack (values, scales: planes only) and de + ds of the
 * down stack. */
struct offload_layer {
    void *host_gu, *host_dn;   /* pinned (E experts) */
    void *gu, *dn;             /* device (C slots; struct cuda_mem's) */
    size_t ge, gs, de, ds;
    int32_t *d_map;            /* device (E): slot of each expert of the round, -1 */
    int32_t *h_map;            /* host (E) */
    int32_t *order;            /* host (E): the step's experts, resident ones first */
    int32_t *slot;             /* host (E): a round's slots (moe_expert_cache_fill) */
    bool *loaded;              /* host (E): ... and which must be copied in */
    struct moe_expert_cache cache;
    int64_t steps, rounds, grouped_steps; /* steps with rows; rounds; steps of half rows (cuBLAS or mma) */
    struct moe_expert_stacks host;   /* the host stacks and biases for the CPU (views) */
    float *h_bias;                   /* host: the biases host's views show (NULL: none) */
    int64_t cpu_uses, cpu_rows;      /* expert uses computed on the CPU, their rows */
};

/* Missed experts computed on the CPU (moe_offload_opts.cpu_rows =
 * R > 0): their rows gathered on the device (d_x), copied to the host,
 * multiplied there by moe_experts_ffn_stacks_cpu, the results copied into
 * the step's ye.  Buffers sized by reserve for up to `rows` rows a step. */
struct offload_cpu {
    int R, rows, threads, width;     /* width: D of the buffers */
    enum moe_cpu_isa isa;
    int32_t *h_perm;                 /* pinned (n_perm): the step's permutation */
    int n_perm;
    int32_t *h_tok, *d_tok;          /* pinned, device (rows): each CPU row's token */
    float *d_x, *h_x, *h_y;          /* device, pinned, pinned (rows, width) */
    cudaEvent_t x_ready;             /* h_x holds the step's CPU rows */
    uint16_t *h_yh;                  /* pinned (rows, width): results as halves */
    int32_t *list, *gpu_counts, *off; /* host (E), (E), (E + 1) */
    int max_e;
    void *scratch;                   /* host, moe_experts_stacks_scratch_bytes */
    size_t scratch_bytes;
};

/* Expert offload (backend_cuda_offload.c). */
struct cuda_offload {
    struct moe_offload_opts opts;    /* its warm counts owned here */
    struct offload_layer **layers;   /* each allocated alone (the tables point at them) */
    int n, cap;
    uint64_t bytes_in;               /* bytes of experts copied in so far */
    size_t host_bytes;               /* the layers' pinned host copies */
    struct offload_cpu cpu;
};

/* The CUDA backend's context: one device, one stream, one cuBLAS handle,
 * and a part per job.  The files that use the parts call each other in one
 * direction only: backend_cuda.c (the op table, reserve, init and destroy)
 * calls backend_cuda_upload.c (prepare_model), which calls
 * backend_cuda_offload.c, which calls backend_cuda_experts.c; each of them
 * may call backend_cuda_mem.c and backend_cuda_graphs.c, which call none. */
struct cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    bool strict;             /* no fallback on an invalid value (moe_backend_opts.cuda_strict) */
    bool prefill_rows;       /* per-row kernel for prefill too (MOE_PREFILL_ATTN_ROWS) */
    bool prefill_mma;        /* tensor cores where they apply (MOE_PREFILL_ATTN_MMA) */
    bool small_cublas;       /* few-row F32/BF16/F16 projections on cuBLAS (cuda_small_cublas) */
    enum moe_cpu_isa cpu_isa; /* kernel set of experts computed on the CPU (offload) */
    int mla_max_dh;          /* largest head dim the MLA attention kernel may run (shared memory) */
    struct cuda_mem mem;
    struct cuda_weights weights;
    struct cuda_work work;
    struct cuda_experts experts;
    struct cuda_graphs graphs;
    struct cuda_offload off;
    int mixed_layers;        /* MoE layers whose experts a per-expert plan split (struct cuda_mixed) */
    struct moe_nccl *coll[MOE_COLL_GROUPS]; /* collective groups (backend_cuda_coll.c), or NULL */
};

static inline struct cuda_ctx *ctx_of(struct moe_backend *be) { return be->ctx; }

static inline cudaDataType_t cuda_type(enum moe_dtype t)
{
    return t == MOE_DTYPE_BF16 ? CUDA_R_16BF : t == MOE_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* ---- backend_cuda_coll.c: the coll_* ops (backend.h) on NCCL ---- */

MOE_MUST_USE enum moe_status moe_cuda_coll_id(struct moe_backend *be, void *id);
MOE_MUST_USE enum moe_status moe_cuda_coll_open(struct moe_backend *be, int group, const void *id, int rank,
                                                int size, int world_rank, double timeout_s);
void moe_cuda_coll_close(struct moe_backend *be, int group);
MOE_MUST_USE enum moe_status moe_cuda_coll_sum(struct moe_backend *be, int group, float *buf, size_t n,
                                               const char *what);
MOE_MUST_USE enum moe_status moe_cuda_coll_share(struct moe_backend *be, int group, float *buf, const size_t *offs,
                                                 const char *what);
MOE_MUST_USE enum moe_status moe_cuda_coll_gather(struct moe_backend *be, int group, const float *mine, float *all,
                                                  const size_t *offs, const char *what);

/* ---- backend_cuda_mem.c: device memory the context owns ---- */

/* Records a device buffer freed at destroy. */
MOE_MUST_USE enum moe_status moe_cuda_mem_keep(struct cuda_mem *m, void *p);
/* Records host memory (malloc'd) freed at destroy. */
MOE_MUST_USE enum moe_status moe_cuda_mem_keep_host(struct cuda_mem *m, void *p);

/* ---- backend_cuda_report.c ---- */
/* --quantize's name for q ("q8_0", "q4", "q4_k_m"). */
const char *moe_cuda_quant_name(enum moe_weight_quant q);
/* The load summary on stderr after prepare_model (c's weights flags and
 * part bytes; the device's free memory). */
MOE_MUST_USE enum moe_status moe_cuda_report_load(struct cuda_ctx *c, const struct moe_backend *be,
                                                  const struct moe_config *cfg);
/* A new device buffer of bytes (at least 1), freed at destroy. */
MOE_MUST_USE enum moe_status moe_cuda_mem_buffer(struct cuda_mem *m, size_t bytes, void **out);
void moe_cuda_mem_free(struct cuda_mem *m);

/* ---- backend_cuda_graphs.c: step graphs ---- */

/* on: step graphs wanted; their cuBLAS calls get a workspace of their own. */
MOE_MUST_USE enum moe_status moe_cuda_graphs_init(struct cuda_graphs *g, cublasHandle_t blas, bool on);
/* The graph_begin and graph_end ops (backend.h) on stream s, for a step
 * the caller found recordable. */
MOE_MUST_USE enum moe_status moe_cuda_graphs_begin(struct cuda_graphs *g, cudaStream_t s, const void *key,
                                                   int rows, int n_logits, bool *replay);
MOE_MUST_USE enum moe_status moe_cuda_graphs_end(struct cuda_graphs *g, cudaStream_t s, bool ok);
/* Retires every recorded step (they hold buffer addresses: called when any
 * buffer is freed). */
void moe_cuda_graphs_drop(struct cuda_graphs *g);
/* Drops them and frees the workspace: after the cuBLAS handle is gone. */
void moe_cuda_graphs_free(struct cuda_graphs *g);

/* ---- backend_cuda_experts.c: the resident experts and the expert kernels ---- */

/* Bytes of bf16 a layer's E experts of D x F widen to (3 matrices each),
 * or 0 on overflow. */
size_t moe_cuda_widened_layer_bytes(int E, int D, int F);
/* The expert kernels' buffers for steps of up to n routed rows over E
 * experts in L MoE layers, with wide bytes to widen planes experts into
 * (0: none) and mixed floats of rows for per-expert plans (0: none). */
MOE_MUST_USE enum moe_status moe_cuda_experts_reserve(struct cuda_ctx *c, int E, int L, int n, size_t wide,
                                                      size_t mixed);
void moe_cuda_experts_free(struct cuda_experts *x);
/* The experts op (backend.h) for a layer whose experts are all resident,
 * stacked as prepare_model lays them out. */
MOE_MUST_USE enum moe_status moe_cuda_experts_resident(struct cuda_ctx *c, float *out, const float *x,
                                                       const struct moe_dispatch *plan, const float *w,
                                                       const struct moe_expert_weights *ex,
                                                       const struct moe_expert_ws *ws, int T, int K, int D,
                                                       int F, int E);
/* The experts op for an expert-parallel step (plan->hi > 0, backend.h):
 * ex a table of the layer's E slots, those of this rank (lo..hi-1) stacked
 * as prepare_model lays out the experts it holds; their rows of ws->ye
 * left in fp32, nothing combined. */
/* The three ways through a step's experts: the device-driven kernels (fp32
 * rows, the down bias in them), cuBLAS's grouped GEMMs (planes widened to
 * bf16 first), the tensor-core kernels (both: half rows, the bias left to
 * the combine). */
enum expert_path { PATH_KERNELS, PATH_CUBLAS, PATH_MMA };
/* The path a step of T rows (K an expert each, E experts in the layer)
 * takes over a stack of C experts of dtype dt. */
enum expert_path moe_cuda_expert_path(const struct cuda_ctx *c, enum moe_dtype dt, int T, int K, int D, int F,
                                      int E, int C);
/* One stack of C experts of dtype ex->dtype at gu and dn (stacked as a
 * layer's are) over the experts its map places (h_map on the host for
 * cuBLAS, d_map on the device for the kernels; -1: not in the stack), on
 * path: those experts' rows of ws->ye, in *ydt (F32 from the kernels, else
 * half); the other rows untouched.  PATH_CUBLAS needs the step's counts in
 * c->experts.h_counts and its rows gathered in half into ws->xe;
 * MOE_ERR_UNSUPPORTED when cuBLAS refuses the grouped call. */
MOE_MUST_USE enum moe_status moe_cuda_run_stack(struct cuda_ctx *c, enum expert_path path, const void *gu,
                                                const void *dn, int C, const int32_t *h_map, const int32_t *d_map,
                                                const float *x, const struct moe_dispatch *plan,
                                                const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                                                int T, int K, int D, int F, int E, enum moe_dtype *ydt);
/* A step's experts in a layer a per-expert plan split (struct cuda_mixed,
 * the table's backend_layer): each stack over its experts on the path its
 * format and the step's rows choose, one weighted combine into out. */
MOE_MUST_USE enum moe_status moe_cuda_experts_mixed(struct cuda_ctx *c, const struct cuda_mixed *mx, float *out,
                                                    const float *x, const struct moe_dispatch *plan, const float *w,
                                                    const struct moe_expert_weights *ex,
                                                    const struct moe_expert_ws *ws, int T, int K, int D, int F,
                                                    int E);
MOE_MUST_USE enum moe_status moe_cuda_experts_ep(struct cuda_ctx *c, const float *x, const struct moe_dispatch *plan,
                                                 const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                                                 int T, int K, int D, int F, int E);
/* The path the experts op takes for a step of T rows over E experts whose
 * weights stack Ew (E, or an offloaded layer's slots): the cuBLAS grouped
 * GEMMs (true) or the device-driven kernels. */
bool moe_cuda_experts_grouped(const struct cuda_ctx *c, enum moe_dtype dt, int T, int K, int D, int F,
                              int E, int Ew);
/* MOERUN_CUDA_EXPERTS=mma and a step the tensor-core kernels take. */
bool moe_cuda_experts_mma(const struct cuda_ctx *c, enum moe_dtype dt, int T, int K, int D, int F, int E);
/* The tensor-core GEMMs and activation of a step of T tokens (x (T, D)
 * fp32, its T*K rows read through plan->perm, not gathered): the experts e
 * with rows and wmap[e] >= 0 (device; NULL: every expert, at place e)
 * multiply their rows by their weights at that place of the stacks gu, dn
 * of Ew experts; results in ws->ye (half: F16 for F16 weights, else BF16). */
MOE_MUST_USE enum moe_status moe_cuda_mma_gemms(struct cuda_ctx *c, const int32_t *wmap, const void *gu,
                                                const void *dn, int Ew, const float *x,
                                                const struct moe_dispatch *plan,
                                                const struct moe_expert_weights *ex,
                                                const struct moe_expert_ws *ws, int T, int K, int D, int F,
                                                int E);
/* The grouped path could not run (cuBLAS refused): says so once on
 * stderr; the device-driven kernels take every later step. */
void moe_cuda_no_grouped(struct cuda_ctx *c);
/* The grouped GEMMs of a step, its rows gathered in xe (ws->xe, half) and
 * its counts in c->experts.h_counts: the experts e with rows and place[e]
 * >= 0 (place NULL: every expert with rows, at place e) multiply their
 * rows by their weights at that place of the stacks gu, dn (dt F16 or
 * BF16), the results in ws->ye (half).  MOE_ERR_UNSUPPORTED: cuBLAS
 * refused. */
MOE_MUST_USE enum moe_status moe_cuda_grouped_gemms(struct cuda_ctx *c, const int32_t *place,
                                                    const void *gu, const void *dn, enum moe_dtype dt,
                                                    const struct moe_dispatch *plan,
                                                    const struct moe_expert_weights *ex,
                                                    const struct moe_expert_ws *ws, int n, int D, int F,
                                                    int E);

/* ---- backend_cuda_offload.c: expert offload ---- */

/* Moves a layer's stacks, built in the device buffers gu and dn for E
 * experts with the shares ge, gs, de, ds of struct offload_layer, to
 * pinned host memory, gives the layer C < E device slots (policy LFU or
 * LRU; warm (E) or NULL: the layer's routed counts in earlier statistics,
 * whose most loaded experts are copied in at once), and makes it ex's
 * backend_layer. */
MOE_MUST_USE enum moe_status moe_cuda_offload_layer(struct cuda_ctx *c, struct moe_expert_weights *ex,
                                                    int C, bool lfu, const double *warm, int E, int D,
                                                    int F, const void *gu, const void *dn, size_t ge,
                                                    size_t gs, size_t de, size_t ds);
/* reserve's part for offloaded layers: the buffers of struct offload_cpu
 * for steps of up to n routed rows, when opts.cpu_rows > 0 and a layer is
 * offloaded. */
MOE_MUST_USE enum moe_status moe_cuda_offload_reserve(struct cuda_ctx *c, int n);
/* The experts op (backend.h) for the offloaded layer ol. */
MOE_MUST_USE enum moe_status moe_cuda_offload_experts(struct cuda_ctx *c, struct offload_layer *ol,
                                                      float *out, const float *x,
                                                      const struct moe_dispatch *plan, const float *w,
                                                      const struct moe_expert_weights *ex,
                                                      const struct moe_expert_ws *ws, int T, int K,
                                                      int D, int F, int E);
void moe_cuda_offload_free(struct cuda_offload *o);

/* ---- backend_cuda_upload.c ---- */

/* prepare_model: uploads every weight once (see the top of this file). */
MOE_MUST_USE enum moe_status moe_cuda_prepare_model(struct moe_backend *be, struct moe_model *m);
