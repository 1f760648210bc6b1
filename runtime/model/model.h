/* model.h - a loaded checkpoint: configuration plus weight views bound by
 * name for each family.
 *
 * Weights are read in place: every struct moe_tensor here borrows from the
 * safetensors set (a memory map, or in-memory synthetic buffers), which the
 * model owns.  Experts of a MoE layer are presented in one stacked layout,
 * an expert-indexed table of (F, D) gate, (F, D) up and (D, F) down matrices,
 * whether the checkpoint stores one tensor per expert or 3-D stacked tensors
 * (transformers 5 `gate_up_proj` (E, 2F, D) and `down_proj` (E, D, F)).
 * gpt-oss's experts (runtime/model/model_gptoss.c) are an exception: stored
 * transposed with gate and up interleaved, or as MXFP4 blocks, they are
 * rewritten at load into memory the model owns; so are the FP8 Linear
 * weights of fp8 checkpoints (runtime/model/model_fp8.c), packed with their
 * block scales into MOE_DTYPE_FP8_B128 rows. */
#pragma once

#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "runtime/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How many configuration values tensor parallelism divides (model_par.c). */
#define MOE_TP_SPLIT_FIELDS 6

struct moe_expert_weights {
    enum moe_dtype dtype;  /* all experts of a layer share it, unless dtypes says otherwise */
    /* Act-order four-bit experts (moe_tensor.cols): (2E) the column order
     * of expert e's gate and up matrices (one order: they read the same
     * input) at [2e] and of its down matrix at [2e + 1], NULL entries for
     * experts stored in order; NULL when no expert of the layer is
     * permuted.  The expert phase permutes each expert's rows before its
     * products (experts/experts.h). */
    const int32_t **cols;
    /* (E) each expert's own dtype when a per-expert precision plan mixes
     * formats in the layer (--expert-dtype-plan: set by the CPU backend's
     * prepare_model, which owns it; dtype is then expert 0's), else NULL;
     * read through moe_expert_dtype */
    const enum moe_dtype *dtypes;
    /* (E) each expert's down matrix's own dtype where it differs from its
     * gate and up (--quantize q4_k_m and q5_k_m keep some layers' down projections
     * at six bits: set by the prepare_model of the backend that owns it),
     * else NULL; read through moe_expert_down_dtype */
    const enum moe_dtype *down_dtypes;
    const void **gate;     /* (E) -> (F, D) row-major */
    const void **up;       /* (E) -> (F, D) */
    const void **down;     /* (E) -> (D, F) */
    /* gpt-oss: F32 biases, or absent */
    struct moe_tensor b_gate, b_up; /* (E, F) */
    struct moe_tensor b_down;       /* (E, D) */
    /* The activation, from the configuration (swiglu_alpha, swiglu_limit):
     * 0, 0 for silu(g) * u, else the clamped gpt-oss form (config.h). */
    float alpha, limit;
    /* The layer's state in the backend that prepared the model (set by its
     * prepare_model, owned by that backend; NULL: none).  The CUDA backend
     * puts an offloaded layer's slots here, so its experts op knows where
     * the layer's experts are without a lookup. */
    void *backend_layer;
};

static inline enum moe_dtype moe_expert_dtype(const struct moe_expert_weights *x, int e)
{
    return x->dtypes ? x->dtypes[e] : x->dtype;
}

/* The dtype of expert e's down matrix (its gate and up: moe_expert_dtype). */
static inline enum moe_dtype moe_expert_down_dtype(const struct moe_expert_weights *x, int e)
{
    return x->down_dtypes ? x->down_dtypes[e] : moe_expert_dtype(x, e);
}

struct moe_layer_weights {
    struct moe_tensor attn_norm;         /* (D) */
    struct moe_tensor wq, wk, wv, wo;    /* (Hq*Dh, D) (Hkv*Dh, D) (Hkv*Dh, D) (D, Hq*Dh); wq
                                            (2 Hq*Dh, D) with cfg.attn_out_gate: each head's
                                            Dh query rows, then its Dh gate rows */
    struct moe_tensor bq, bk, bv, bo;    /* optional biases */
    struct moe_tensor q_norm, k_norm;    /* (Dh) per head, or (Hq*Dh)/(Hkv*Dh) full */
    struct moe_tensor sinks;             /* (Hq) f32 attention sink logits (gpt-oss), or absent */
    /* MLA (DeepSeek; config.h): wq is q_proj (Hq*(nope+rope), D), or q_b_proj
     * (Hq*(nope+rope), Rq) after wq_a (Rq, D) and q_a_norm (Rq); wo (D, Hq*v) */
    struct moe_tensor wq_a, q_a_norm;
    struct moe_tensor wkv_a;             /* (Rc + rope, D): latent rows, then the rope rows */
    struct moe_tensor kv_a_norm;         /* (Rc) */
    struct moe_tensor w_uk;              /* (Hq, Rc, nope): kv_b_proj's key rows of each head,
                                            transposed (owned), to absorb into the query */
    struct moe_tensor w_uv;              /* (Hq, v, Rc): kv_b_proj's value rows of each head (owned) */
    /* DeepSeek sparse attention's indexer (cfg.dsa_topk > 0; self_attn.indexer.*) */
    struct moe_tensor ix_wq;             /* wq_b (Hi Di, Rq) */
    struct moe_tensor ix_wk;             /* wk (Di, D) */
    struct moe_tensor ix_norm_w, ix_norm_b; /* k_norm, a LayerNorm: (Di) each, F32 */
    struct moe_tensor ix_wproj;          /* weights_proj (Hi, D) */
    struct moe_tensor ffn_norm;          /* (D) */
    /* Linear attention (cfg.layer_linear[l]: linear_attn.*; the attention
     * views above stay empty but the norms).  With C = 2 Hk Dk + Hv Dv and
     * r = Hv / Hk value heads per q/k head: */
    struct moe_tensor lin_in;            /* in_proj_qkvz (2 Hk Dk + 2 Hv Dv, D): per q/k head its
                                            q (Dk), k (Dk), then its r value heads' v and their z */
    struct moe_tensor lin_ba;            /* in_proj_ba (2 Hv, D): per q/k head its r b, then r a */
    /* or, Qwen3.5-MoE (lin_in absent): the four apart, q, k, v in conv order */
    struct moe_tensor lin_qkv;           /* in_proj_qkv (C, D) */
    struct moe_tensor lin_z;             /* in_proj_z (Hv Dv, D) */
    struct moe_tensor lin_b, lin_a;      /* in_proj_b, in_proj_a (Hv, D) */
    struct moe_tensor lin_conv;          /* conv1d (C, conv) F32, channels q, k, v of all heads */
    struct moe_tensor lin_a_log, lin_dt_bias; /* (Hv) F32 */
    struct moe_tensor lin_norm;          /* (Dv) the gated RMSNorm's weight */
    struct moe_tensor lin_out;           /* out_proj (D, Hv Dv) */
    /* dense FFN (layer_moe false) */
    struct moe_tensor w_gate, w_up, w_down;  /* (Fd, D) (Fd, D) (D, Fd) */
    struct moe_tensor b_gate, b_up, b_down;  /* optional (Llama mlp_bias) */
    /* MoE (layer_moe true) */
    struct moe_tensor router;            /* (E, D) */
    struct moe_tensor router_bias;       /* (E) f32, the sigmoid router's choice bias, or absent */
    struct moe_tensor router_b;          /* (E) f32, the router Linear's bias (gpt-oss), or absent */
    struct moe_expert_weights experts;
    struct moe_tensor sh_gate, sh_up, sh_down; /* shared expert (Fs, D) (Fs, D) (D, Fs) */
    struct moe_tensor sh_router;         /* (1, D): sigmoid gate of the shared expert */
};

struct moe_model {
    struct moe_config cfg;
    struct moe_safetensors st;           /* owns the weight memory */
    struct moe_tensor embed;             /* (V, D) */
    struct moe_tensor final_norm;        /* (D) */
    struct moe_tensor lm_head;           /* (V, D); the embedding when tied */
    struct moe_layer_weights *layers;    /* (L) */
    char *dir;                           /* model folder, or NULL for synthetic */
    void **owned;                        /* weights converted at load (transposed, unpacked,
                                            widened to f32), freed with the model */
    size_t n_owned;
    /* Synthetic weights not generated yet (moe_model_synthetic_deferred):
     * every view's data is a 1-byte host placeholder (1: ones, 0: random;
     * expert views are offsets from their stacked tensor's placeholder, never
     * dereferenced).  A backend with synth_fill generates the weights in its
     * own memory at prepare_model, with the same values runtime/model/synth.c
     * would make on the host; other backends refuse such a model. */
    bool weights_deferred;
    uint64_t synth_seed;
    float synth_std;
    /* A multi-token-prediction module (moe_model_mtp_view), else absent:
     * its one layer's input row is eh_proj [enorm(embed(token)); hnorm(h)]
     * of the row's token and a hidden state h the caller supplies
     * (runtime/engine/forward.h, moe_forward.hin), not the embedding. */
    struct moe_tensor mtp_enorm, mtp_hnorm; /* (D) */
    struct moe_tensor mtp_eh_proj;          /* (D, 2D): embedding columns first */
    bool cols_permuted; /* some weight has moe_tensor.cols (act-order four-bit) */
    /* (Dh) F32 ones (owned): the weight of Llama-4's q/k L2 norm, an
     * RMSNorm without one (cfg.qk_l2_norm), else absent */
    struct moe_tensor qk_ones;
    /* Expert parallelism: (n_layers x n_experts, owned) 1 where this
     * process holds expert e of layer l (the others' pointers are NULL,
     * their bytes never read); NULL: all of them.  Set by
     * moe_model_load_part. */
    uint8_t *ep_held;
    /* Tensor parallelism (moe_model_tp_split): this rank's place in its
     * group of tp ranks (0, 0: the whole model), and the configuration
     * values the split divided, as the whole model has them
     * (moe_model_whole_config) */
    int tp, tp_rank;
    int tp_whole[MOE_TP_SPLIT_FIELDS]; /* n_heads, n_kv_heads, lin_k_heads, lin_v_heads, d_ff, d_shared */
    /* The LM head split over several ranks (moe_model_vocab_split):
     * lm_head holds the vocabulary rows [vocab_lo, vocab_lo +
     * lm_head.shape[0]) of cfg.vocab, one of vocab_parts (0: whole) */
    int vocab_lo, vocab_parts;
};

/* Whether m holds expert e of layer l (see ep_held). */
static inline int moe_model_holds(const struct moe_model *m, int l, int e)
{
    return !m->ep_held || m->ep_held[(size_t)l * m->cfg.n_experts + e];
}

/* Loads config.json and the safetensors of a model folder. */
MOE_MUST_USE enum moe_status moe_model_load(struct moe_model *m, const char *dir);
/* The same holding only the experts marked in held (n_layers x n_experts
 * of the folder's configuration, copied; NULL: all), for expert
 * parallelism (ep.h, moe_ep_held).  Experts stored one
 * tensor per expert or stacked in plain float dtypes are mapped, never read;
 * formats rewritten at load (gpt-oss MXFP4, fp8 blocks, four-bit) are
 * rewritten whole and the others' pointers dropped. */
MOE_MUST_USE enum moe_status moe_model_load_part(struct moe_model *m, const char *dir, const uint8_t *held);
/* m holds the experts marked in held (n_layers x n_experts, copied). */
MOE_MUST_USE enum moe_status moe_model_set_held(struct moe_model *m, const uint8_t *held);
/* Drops the pointers of the experts m does not hold (after binding). */
void moe_model_drop_experts(struct moe_model *m);
/* Tensor parallelism: keeps rank's share of a group of size ranks (after
 * binding, before a backend prepares the model).  Its configuration then
 * says its own: n_heads and n_kv_heads (and d_ff, d_shared, the linear
 * attention's heads) divided by size.  Each attention layer keeps its
 * heads' query, key and value rows and their output projection columns;
 * multi-head latent attention its heads' query rows, latent maps and
 * output columns (the latent projection, the cache of latents and the
 * indexer whole); linear attention its q/k heads and their value heads
 * (the recurrent state then theirs alone); each dense FFN and shared
 * expert a slice of its width (gate and up rows, down columns); the output
 * biases stay with rank 0.  Such a layer's output is this rank's part of a
 * sum over the group (runtime/engine/tp.c adds them).  Refused, naming the
 * cause: heads or widths that do not divide by size (key/value heads may
 * be fewer than size when size is a multiple of them: see
 * moe_tp_kv_heads), act-order four-bit weights, block formats whose blocks
 * a rank's columns would cut. */
MOE_MUST_USE enum moe_status moe_model_tp_split(struct moe_model *m, int rank, int size);
/* m's configuration as the whole model has it (before moe_model_tp_split
 * divided its heads and widths) into c. */
void moe_model_whole_config(const struct moe_model *m, struct moe_config *c);
/* Rank's share of the vocabulary when `size` ranks split the LM head: rows
 * [*lo, *lo + *n) of V (the same rule on every rank; size <= V). */
static inline void moe_vocab_share(int V, int rank, int size, int *lo, int *n)
{
    *lo = (int)((int64_t)V * rank / size);
    *n = (int)((int64_t)V * (rank + 1) / size) - *lo;
}
/* The LM head and the embedding keep rank's share of the vocabulary rows
 * (moe_vocab_share) of a split over size ranks (views: no copy; before a
 * backend prepares the model).  size 1: nothing. */
MOE_MUST_USE enum moe_status moe_model_vocab_split(struct moe_model *m, int rank, int size);
/* m's LM head or embedding (share) over the whole vocabulary, also where
 * moe_model_vocab_split kept a share of it (a view of the same rows). */
struct moe_tensor moe_model_whole_vocab(const struct moe_model *m, const struct moe_tensor *share);
/* Whether the LM head's rows lie in the embedding's (tied weights, or a
 * tied head's share of them). */
bool moe_model_head_tied(const struct moe_model *m);
/* A fingerprint of the checkpoint m was loaded from (config.json, and each
 * safetensors file's size and header), so processes can check they opened
 * the same one; 0 for a model not read from files (synthetic). */
uint64_t moe_model_fingerprint(const struct moe_model *m);
/* Key/value heads a rank of a group of size holds: Hkv / size, or 1 when
 * there are fewer heads than ranks (size a multiple of Hkv: each head then
 * held by size / Hkv ranks). */
static inline int moe_tp_kv_heads(int Hkv, int size) { return Hkv >= size ? Hkv / size : 1; }
/* Which of the group's Hkv / moe_tp_kv_heads parts of the key/value heads
 * rank holds (its first head over moe_tp_kv_heads). */
static inline int moe_tp_kv_part(int Hkv, int size, int rank)
{
    return Hkv >= size ? rank : rank / (size / Hkv);
}
/* Builds a model with seeded random weights in memory (no file). dtype is
 * the weight dtype (F32, F16 or BF16). */
MOE_MUST_USE enum moe_status moe_model_synthetic(struct moe_model *m, const struct moe_config *cfg,
                                                  enum moe_dtype dtype, uint64_t seed);
/* Binds every weight of m->cfg's family from m->st (used by both above). */
MOE_MUST_USE enum moe_status moe_model_bind(struct moe_model *m);
/* As moe_model_synthetic, but no weight memory is allocated or filled: the
 * backend makes the weights on the device (see weights_deferred), so a
 * model larger than host memory can be benchmarked. */
MOE_MUST_USE enum moe_status moe_model_synthetic_deferred(struct moe_model *m,
                                                           const struct moe_config *cfg,
                                                           enum moe_dtype dtype, uint64_t seed);
/* What moe_model_synthetic_part makes. */
struct moe_router_skew;
struct moe_synth_part {
    const struct moe_router_skew *skew; /* routers skewed as it says (synth_skew.h), or NULL */
    const uint8_t *held; /* (n_layers x n_experts) the experts to hold (ep_held), or NULL: all */
    bool deferred;       /* made by the backend (moe_model_synthetic_deferred); not with a skew */
};
/* moe_model_synthetic, _deferred or _skew (synth_skew.h) as o says,
 * holding only the experts marked in o->held (expert parallelism): the
 * others' values are never made and the pages of their parts of the
 * expert stacks never touched, so a rank's memory holds its share. */
MOE_MUST_USE enum moe_status moe_model_synthetic_part(struct moe_model *m, const struct moe_config *cfg,
                                                       enum moe_dtype dtype, uint64_t seed,
                                                       const struct moe_synth_part *o);
void moe_model_free(struct moe_model *m);
/* Multi-token-prediction module i (0 <= i < cfg.n_mtp_layers) of a loaded
 * DeepSeek-V3 / GLM-4.5 style checkpoint, as a model of one layer:
 * tensors model.layers.{L+i}.* (L = cfg.n_layers): the decoder layer
 * (MoE when the model has experts), enorm, hnorm, eh_proj, shared_head.norm
 * as its final norm, shared_head.head as its LM head (absent: m's) and
 * embed_tokens as its embedding (absent: m's).  out borrows m's weights
 * (free it with moe_model_free before m) and owns what the binding
 * converts.  Refused, naming the tensor, when the checkpoint left the
 * module's weights out (many converted checkpoints do).  Under expert
 * parallelism the module is whole on the rank that makes it: all its
 * experts bound whatever m holds, and m's LM head whole where m's is
 * split (moe_model_whole_vocab); the same for the embedding. */
MOE_MUST_USE enum moe_status moe_model_mtp_view(const struct moe_model *m, int i, struct moe_model *out);
/* Routes every token of every MoE layer to k experts instead of the
 * checkpoint's num_experts_per_tok (a memory-vs-compute knob: fewer experts
 * read per token; `moerun ppl` measures what it costs).  The renormalisation
 * rule of the family (norm_topk_prob) applies to the k chosen.  Call before
 * anything is sized from the model (runner, statistics).  Errors: a model
 * without experts, k outside [1, E]. */
MOE_MUST_USE enum moe_status moe_model_set_top_k(struct moe_model *m, int k);

/* Parameter and byte counts by part. */
struct moe_model_sizes {
    int64_t params_total, params_active;  /* active: touched per token */
    int64_t bytes_embed, bytes_attn, bytes_dense_ffn, bytes_experts, bytes_shared, bytes_router,
        bytes_norm, bytes_lm_head;
    int64_t bytes_total;
};
/* From the loaded tensors (each part at its stored dtype). */
void moe_model_sizes(const struct moe_model *m, struct moe_model_sizes *out);
/* The loaded tensors' bytes by dtype: by[t] for each enum moe_dtype t
 * (MOE_DTYPE_N entries; a tied LM head counted once). */
void moe_model_bytes_by_dtype(const struct moe_model *m, int64_t *by);
/* Bytes of one expert of the first MoE layer (gate, up, down as stored; 0
 * for a dense model), and the bytes per weight of its dtype, 0 for a block
 * format (MXFP4, FP8, Q8_0): what the statistics files record. */
int64_t moe_model_expert_bytes(const struct moe_model *m, int *weight_bytes);
/* From the configuration alone, every weight elem_size bytes but those the
 * configuration stores otherwise (quantization_config: FP8 Linear weights
 * at 1 + 4/128 bytes, MLA's kv_b_proj then F32 as loaded; MXFP4 experts at
 * 17/32; the sigmoid router's choice bias in F32): what a checkpoint of
 * this shape holds once loaded, without building it. */
void moe_config_sizes(const struct moe_config *cfg, size_t elem_size, struct moe_model_sizes *out);

#ifdef __cplusplus
}
#endif
