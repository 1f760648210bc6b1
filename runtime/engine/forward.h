/* forward.h - the model's forward pass over one batch, written once against
 * the backend interface.
 *
 * Per layer: RMSNorm -> Q,K,V projections -> (q/k norm) (clip) -> RoPE ->
 * K,V into the paged cache -> paged attention -> O projection -> residual;
 * RMSNorm -> dense SwiGLU FFN, or router -> top-K -> dispatch plan -> grouped
 * expert FFN -> combine (+ shared expert) -> residual.  Then the final norm
 * and the LM head for the rows that need logits only.
 *
 * All workspaces are allocated by moe_forward_init for at most max_tokens
 * rows, max_seqs sequences of at most max_blocks blocks and max_logits logit
 * rows; moe_forward_run allocates nothing (except, once, the host buffers of
 * the asynchronous statistics copies, see moe_forward_run). */
#pragma once

#include "kvcache/kvcache.h"
#include "runtime/backend/backend.h"
#include "runtime/core/batch.h"
#include "runtime/model/model.h"

struct moe_stats;
struct moe_ep;

/* Host buffers for the routing of every step's statistics, at most (beyond
 * it, only steps of up to MOE_SMALL_STEP_ROWS rows copy asynchronously). */
#define MOE_STATS_HOST_BYTES ((size_t)256 << 20)

#ifdef __cplusplus
extern "C" {
#endif

struct moe_forward_limits {
    int max_tokens, max_seqs, max_blocks, max_logits;
    bool hidden;     /* keep every row's final-normed hidden state (moe_forward.hid) */
    int max_experts; /* the most experts a dispatch spans (expert parallelism: slots, which
                        replicas make more than the model's experts); 0: the model's */
};

/* Routing record of one step, filled when passed to moe_forward_run (host). */
struct moe_route_trace {
    int32_t *ids;   /* (L, T, K) chosen experts, -1 on dense layers */
    float *weights; /* (L, T, K) combine weights, or NULL */
};

struct moe_forward {
    const struct moe_model *m;  /* borrowed */
    struct moe_backend *be;     /* borrowed */
    struct moe_forward_limits lim;
    /* activations, backend memory */
    float *x;        /* (T, D) residual stream */
    float *xn;       /* (T, D) normed input of a block */
    float *q, *att;  /* (T, Hq*Dh) */
    float *k, *v;    /* (T, Hkv*Dh) */
    float *out;      /* (T, D) block output */
    float *h1, *h2;  /* (T, max(Fd, Fs)) dense / shared FFN hidden */
    float *sh;       /* (T, D) shared expert output */
    float *shg;      /* (T) shared expert gate logit */
    float *xs;       /* (T, D) the experts' input scaled by the router score (Llama-4), or NULL */
    float *ones;     /* (T) ones: the experts' output weights then, or NULL */
    float *rlogits;  /* (T, E) router logits */
    int32_t *ids;    /* (T, K) */
    float *rw;       /* (T, K) */
    struct moe_dispatch plan;
    struct moe_expert_ws ews;
    float *inv_freq; /* (Dh/2) */
    float *lrows;    /* (max_logits, D) */
    /* the last layer's FFN input, routing and weights of the rows that
     * need logits (forward.c, last_rows) */
    float *lxn;      /* (max_logits, D) */
    int32_t *lids;   /* (max_logits, K) */
    float *lrw;      /* (max_logits, K) */
    bool rows_swapped; /* those are in x, xn, ids, rw now */
    float *logits;   /* (max_logits, V) */
    int32_t *amax;   /* (max_logits) argmax of each logits row */
    /* lim.hidden: (max_tokens + 1, D) each row's hidden state after the
     * final norm (what a multi-token-prediction module reads); the last row
     * stays zero */
    float *hid;
    /* a multi-token-prediction module (model.h: mtp_eh_proj): the caller
     * fills hin (T, D) with each row's hidden state before the step; cat
     * (T, 2D) holds [enorm(embedding); hnorm(hin)] */
    float *hin, *cat;
    /* act-order four-bit weights (m->cols_permuted): (max(max_tokens,
     * max_logits), widest input) an input's columns in a weight's order */
    float *xcols;
    /* MLA (runtime/engine/forward_mla.c), allocated when the model has it */
    struct moe_forward_mla {
        float *qa;       /* (T, Rq) */
        float *qr;       /* (T, Hq, nope + rope) the query as projected */
        float *kva;      /* (T, Rc + rope) the latent and rope key as projected */
        float *c;        /* (T, Rc) the latent, normalised */
        float *o;        /* (T, Hq, v) each head's values */
        int32_t *q_rope; /* (rope) columns of a head's rope values in qr, rotate-half order */
        int32_t *k_rope; /* (rope) the same in kva */
        /* DeepSeek sparse attention (cfg.dsa_topk > 0) */
        float *iq;       /* (T, Hi, Di) the indexer's queries */
        float *ik;       /* (T, Di) its keys */
        float *iw;       /* (T, Hi) its head weights */
        int32_t *keys;   /* (T, topk) the positions each row attends to (kept from a full layer
                            for the shared layers after it) */
    } mla;
    /* Hybrid models (runtime/engine/forward_linear.c), allocated when the
     * model has linear-attention layers or gated attention outputs */
    struct moe_forward_lin {
        float *proj;      /* (T, 2 Hk Dk + 2 Hv Dv) in_proj_qkvz's product, grouped by q/k head */
        float *qkv;       /* (T, C) its q, k, v columns in conv order */
        float *z;         /* (T, Hv Dv) its z columns */
        float *ba;        /* (T, 2 Hv) in_proj_ba's product */
        float *b, *a;     /* (T, Hv) */
        float *o;         /* (T, Hv Dv) the delta rule's output */
        int32_t *ix_qkv, *ix_z, *ix_b, *ix_a; /* the column tables of the four gathers */
        float *qg;        /* (T, 2 Hq Dh) q_proj's product with output gates, per head q then gate */
        float *gate;      /* (T, Hq Dh) the gates */
        int32_t *ix_q, *ix_g;
    } lin;
    /* batch arrays, backend memory */
    int32_t *b_state;   /* (max_seqs) the batch's state slots (hybrid models) */
    int32_t *b_tokens, *b_pos, *b_seq_of, *b_seq_start, *b_ctx_len, *b_table, *b_slot, *b_rows;
    const int32_t *h_pos;    /* the step's positions in host memory (the caller's batch), during a step */
    int max_ctx;     /* longest context of the current step */
    int32_t *h_ids;  /* (T, K) host copy for traces */
    float *h_w;      /* (T, K) */
    float *h_logits; /* (T, E) host copy of router logits for statistics */
    struct moe_stats *stats; /* borrowed expert-load recorder (router/stats.h), NULL = off */
    /* Statistics: per layer l a slice of hs_layer 4-byte words at hs_buf
     * (host_alloc memory) holding ids (R, K), weights (R, K) and router
     * logits (R, E), R = hs_rows; filled by to_host_async during the step,
     * recorded after its final sync.  Allocated by the first step with
     * statistics on (n_layers x R x (2K + E) words). */
    void *hs_buf;
    size_t hs_layer;      /* words per layer slice */
    int hs_rows;          /* R: max_tokens when that fits MOE_STATS_HOST_BYTES, else
                             min(MOE_SMALL_STEP_ROWS, max_tokens) */
    bool hs_failed;       /* the buffers could not be allocated: synchronous copies */
    bool stats_async;     /* the current step copies routing into hs_buf */
    /* Steps of at most this many rows (and at most hs_rows) take the
     * asynchronous statistics path; init sets hs_rows, 0 forces the
     * synchronous per-layer copies (tests compare the two). */
    int stats_async_rows;
    /* Expert parallelism (runtime/engine/ep.h), NULL: one process.  Rank 0
     * sends each step to the followers as runner ep_runner's. */
    struct moe_ep *ep;
    int ep_runner;
    /* its host state, made at the first MoE layer (forward_ep.c):
     * each routed pair's slot, the dispatch over slots, and each MoE
     * layer's expert table seen by slot (ep_impl.h) */
    int32_t *ep_slot_ids, *ep_counts, *ep_offsets;
    struct moe_expert_weights *ep_views; /* (n_layers) */
    /* A backend whose memory is not the host's (ops->host_memory false),
     * made with the above: the routing read back (ep_h_ids (T, K),
     * ep_h_pos (T)); the slot ids, counts and offsets in backend memory;
     * a host stage (ep_stage_floats) for the expert rows and tensor
     * parallelism's sums; backend buffers for whole rows (ep_d_rows, TP,
     * ep_d_rows_floats each) and, over the backend's transport, for the
     * group's parts of them (ep_d_blocks) */
    int32_t *ep_h_ids, *ep_h_pos, *ep_d_slot_ids, *ep_d_counts, *ep_d_offsets;
    float *ep_stage, *ep_d_rows, *ep_d_blocks;
    size_t ep_stage_floats, ep_d_rows_floats;
    bool ep_dev_made;            /* the above made (ep_stage NULL over the backend's transport) */
    /* the backend's transport (ep.h coll_state 1): each rank's first
     * float of the expert rows and the end (size + 1, host), and the rows'
     * capacity in floats */
    size_t *ep_share_offs, ep_share_cap;
    /* The LM head split over the ranks (moe_model_vocab_split): a host
     * buffer for the logits' parts (rank 0: every rank's, and the rows
     * they make; a backend not in host memory: this rank's part too) and
     * each rank's part in floats (size) */
    float *ep_vstage;
    int32_t *ep_vcounts;
    /* ... over the backend's transport instead: every rank's part in rank
     * order (max_logits x V floats, backend memory; rank 0's only, made at
     * first use) */
    float *ep_d_vparts;
    /* Data-parallel attention (runtime/engine/forward_dp.c), made at the
     * first step with it */
    struct moe_forward_dp {
        bool on;             /* this step */
        bool ordered;        /* the batch's rows are in rank order already (no gathers) */
        int32_t *counts, *displs; /* (size) each rank's rows and its first, in rank order (host) */
        int32_t *lcounts, *ldispls; /* (size) ... of the logit rows */
        int32_t *cursor;            /* (size) scratch: the next place of each rank's rows */
        const int32_t *lorder; /* (n_logits) the batch's logit rows in rank order: their indices (host) */
        int32_t *h, *d;      /* the sub-batch and the row orders: host, backend (d == h in host memory) */
        size_t ints;         /* of h and d */
        const int32_t *order, *inv; /* (T) the batch row of each rank-ordered row, and back (in d) */
        float *rows;         /* (max_tokens, D) the rows in rank order, backend memory */
        float *stage;        /* (max_tokens, D) host stage of a backend not in host memory */
        struct moe_batch sub; /* this rank's sequences, in d */
        /* Rows kept on their rank through the layers (a backend in host
         * memory): the experts' pairs sent to their slots' ranks and back
         * (all-to-all), the routing gathered for statistics and traces, the
         * rows gathered once after the last layer */
        bool local;
        int T;               /* the step's rows, every rank's */
        float *x_full;       /* fw->x while it points at this rank's rows (dp.rows) */
        float *send, *recv;  /* (max_tokens K, D) pair rows out and in */
        int32_t *pair_send, *pair_recv; /* (max_tokens K, 2) each pair's slot and row among those sent */
        int32_t *slot_recv;  /* (max_tokens K) the slots of the pairs received */
        int32_t *seen;       /* (2 max_tokens) per row: the last rank it went to, its place there */
        int32_t *mat;        /* (size, 2 size) pairs, then rows, each rank sends each rank, a layer */
        int32_t *usc, *usd, *urc, *urd; /* (size) the rows' counts and firsts, sent and received */
        int32_t *gcnt;       /* (size) each rank's routing words gathered on rank 0 */
        struct moe_dispatch rplan; /* the dispatch of the pairs this rank received (its arrays) */
        int32_t *sc, *sd, *rc, *rd; /* (size) the pairs' counts and firsts, sent and received */
        float *gath;         /* (max_tokens max(K, E)) routing of every rank, in rank order */
    } dp;
};

/* ptr = n zeroed elements of type in be's memory (the size overflow-checked);
 * returns from the calling function on failure.  For the workspace
 * initialisers of forward*.c. */
#define MOE_FORWARD_ALLOC(be, ptr, n, type)                                                          \
    do {                                                                                          \
        size_t bytes_;                                                                            \
        if (!moe_mul_size((size_t)(n), sizeof(type), &bytes_))                                    \
            return moe_fail(MOE_ERR_NOMEM, "forward workspace: size overflows");                  \
        MOE_TRY((be)->ops->alloc((be), bytes_, (void **)&(ptr)));                                 \
    } while (0)

MOE_MUST_USE enum moe_status moe_forward_init(struct moe_forward *fw, const struct moe_model *m,
                                               struct moe_backend *be,
                                               const struct moe_forward_limits *lim);
void moe_forward_free(struct moe_forward *fw);
/* MLA (runtime/engine/forward_mla.c): buffers (nothing without kv_lora_rank), and
 * the attention block from fw->xn to fw->out. */
MOE_MUST_USE enum moe_status moe_forward_mla_init(struct moe_forward *fw);
/* y (T, N) = x (T, K) . W^T (+ b): the backend's matmul, after gathering
 * x's columns in the weight's stored order when it has one (w->cols:
 * act-order four-bit weights). */
MOE_MUST_USE enum moe_status moe_forward_linear(struct moe_forward *fw, float *y, const float *x,
                                                const struct moe_tensor *w, const struct moe_tensor *b, int T);
void moe_forward_mla_free(struct moe_forward *fw);
/* Hybrid models (runtime/engine/forward_linear.c): buffers and column
 * tables (nothing for other models; refused on a backend without
 * delta_net or gather_cols); a linear-attention block from fw->x into the
 * residual stream's block output fw->out; the query and gate columns of a
 * gated attention layer's q_proj product into fw->q and fw->lin.gate. */
MOE_MUST_USE enum moe_status moe_forward_lin_init(struct moe_forward *fw);
void moe_forward_lin_free(struct moe_forward *fw);
MOE_MUST_USE enum moe_status moe_forward_lin_block(struct moe_forward *fw, struct moe_kvcache *kv,
                                                   const struct moe_batch *db, int l);
MOE_MUST_USE enum moe_status moe_forward_lin_split_q(struct moe_forward *fw, int T);
MOE_MUST_USE enum moe_status moe_forward_mla_attention(struct moe_forward *fw, struct moe_kvcache *kv,
                                                        const struct moe_batch *db, int l,
                                                        const struct moe_attn_params *p);
/* Across ranks (runtime/engine/forward_ep.c): a MoE layer's experts when
 * they are spread over the ranks (fw->ep on): of the layer's T routed rows
 * `in` (fw->ids, weights wts) into fw->out; a split layer's output buf
 * (T, D) summed over the tensor-parallel group (nothing without one); an
 * RMSNorm over whole rows of x (T, w), the group's columns gathered first
 * under tensor parallelism; the buffers freed (moe_forward_free). */
MOE_MUST_USE enum moe_status moe_forward_ep_experts(struct moe_forward *fw, int l, int T, const float *in,
                                                    const float *wts);
MOE_MUST_USE enum moe_status moe_forward_tp_sum(struct moe_forward *fw, float *buf, int T, const char *what, int l);
/* The expert-parallel state (slot tables, each layer's slot view), made
 * at the first MoE layer on every rank alike. */
MOE_MUST_USE enum moe_status moe_forward_ep_views(struct moe_forward *fw);
MOE_MUST_USE enum moe_status moe_forward_norm_whole_rows(struct moe_forward *fw, float *x, int T, int w,
                                                         const struct moe_tensor *nw, const char *what, int l);
/* The LM head split over the ranks: this rank's share of the logits of
 * the n rows in fw->lrows, gathered on rank 0 into fw->logits (n, V). */
MOE_MUST_USE enum moe_status moe_forward_vocab_logits(struct moe_forward *fw, int n);
/* The embedding split the same way: x (T, D) holds this rank's rows (zeros
 * for the others' tokens); summed over the ranks, each token's row is the
 * one rank's that holds it, exactly. */
MOE_MUST_USE enum moe_status moe_forward_vocab_embed(struct moe_forward *fw, float *x, int T);
void moe_forward_ep_free(struct moe_forward *fw);
/* Data-parallel attention (runtime/engine/forward_dp.c; fw->ep->dp): the
 * step's rank order and this rank's sub-batch from the host batch b;
 * layer l's attention block on this rank's rows, then every rank's rows
 * gathered back into fw->x (T rows); the buffers freed. */
MOE_MUST_USE enum moe_status moe_forward_dp_begin(struct moe_forward *fw, const struct moe_kvcache *kv,
                                                  const struct moe_batch *b);
MOE_MUST_USE enum moe_status moe_forward_dp_attention(struct moe_forward *fw, struct moe_kvcache *kv, int T, int l);
void moe_forward_dp_free(struct moe_forward *fw);
/* The local mode (fw->dp.local): fw->x made this rank's rows, and back to
 * every row in batch order after the layers (also after a failure, with
 * s not MOE_OK: then only the pointer), or with logit_rows (the last
 * layer ran for the logit rows alone, which it left in fw->lrows) every
 * rank's logit rows into fw->lrows in the batch's order; a MoE layer's routing of every
 * rank recorded (statistics, trace; a dense layer's trace rows -1); the
 * experts of this rank's T rows over the ranks (T may be 0: the rank
 * still serves the others' pairs). */
MOE_MUST_USE enum moe_status moe_forward_dp_take(struct moe_forward *fw);
MOE_MUST_USE enum moe_status moe_forward_dp_give(struct moe_forward *fw, enum moe_status s, bool logit_rows);
MOE_MUST_USE enum moe_status moe_forward_dp_routing(struct moe_forward *fw, int l, struct moe_route_trace *trace);
MOE_MUST_USE enum moe_status moe_forward_dp_experts(struct moe_forward *fw, int l, int T, const float *in,
                                                    const float *wts);
/* One layer's attention block with its residual, over db's rows of fw->x
 * (forward.c). */
MOE_MUST_USE enum moe_status moe_forward_attention_block(struct moe_forward *fw, struct moe_kvcache *kv,
                                                         const struct moe_batch *db, int l);
/* Runs one step.  logits (n_logits, V) host, may be NULL; ids (n_logits)
 * host, may be NULL, receives the argmax of each logits row (moe_argmax's
 * rule), computed by the backend: a greedy caller asks for ids alone, and
 * then no logits row crosses to the host.  trace may be NULL.
 * The batch is validated first (sizes, ids, positions, slots).
 *
 * With stats set, every MoE layer's routing is recorded.  Steps of at most
 * stats_async_rows rows (every step, unless a full step's routing would
 * take more than MOE_STATS_HOST_BYTES) enqueue asynchronous copies into
 * hs_buf and record every MoE layer, in layer order and with the same
 * arguments, after the step's final sync: no host wait inside the step,
 * and the step may be a recorded graph.  Larger steps copy it to the host
 * and record it layer by layer, synchronously: the same statistics.  A
 * step that fails records no layer on the asynchronous path. */
MOE_MUST_USE enum moe_status moe_forward_run(struct moe_forward *fw, struct moe_kvcache *kv,
                                              const struct moe_batch *b, float *logits,
                                              int32_t *ids, struct moe_route_trace *trace);

#ifdef __cplusplus
}
#endif
