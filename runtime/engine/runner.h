/* runner.h - runs token chunks of a few sequences through the model: owns
 * the KV cache and the forward workspace, grows each sequence's block table
 * as it fills, and builds the flattened batch.  `moerun run`, the tests and
 * (later) the serving engine's steps go through it.
 *
 * A step takes chunks {sequence, tokens}: a prefill chunk of many tokens and
 * a decode chunk of one token look the same.  Logits come back for the last
 * row of each chunk, or for every row when the chunk asks. */
#pragma once

#include <stdbool.h>

#include "kvcache/kvcache.h"
#include "runtime/engine/forward.h"
#include "runtime/core/argmax.h"
#include "runtime/engine/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_seq {
    int32_t *blocks;   /* (cap) block ids, owned */
    int n_blocks, cap;
    int len;           /* tokens in the cache */
    int32_t state;     /* hybrid models: its recurrent-state slot + 1 (kvcache.h), taken
                          at its first reserve and given back with its blocks; 0: none */
};

struct moe_chunk {
    struct moe_seq *seq;
    const int32_t *tokens;
    int n;
    bool all_logits;   /* logits for every row, else for the last one */
    bool decode;       /* a decode step (for statistics: prefill and decode apart);
                          with n > 1, a decode followed by drafted tokens, which
                          speculative decoding verifies */
    int64_t request_id; /* for traces; 0 = none: the chunk's index in the step */
};

struct moe_runner_opts {
    int max_tokens;    /* rows per step */
    int max_seqs;      /* sequences per step */
    int max_logits;    /* logit rows per step */
    int block_size;    /* B */
    int n_blocks;      /* pool size (data-parallel attention: on each rank; the pool holds
                          n_blocks times the ranks, in a part per rank) */
    enum moe_dtype kv_dtype; /* used when kv_dtype_set, else F32 */
    bool kv_dtype_set;
    bool prefix_cache; /* register full blocks for reuse (the engine's) */
    bool hidden;       /* keep each row's final-normed hidden state (fw.hid) */
    int state_slots;   /* hybrid models: sequences that may hold recurrent state at once
                          (0: max_seqs) */
    /* Expert parallelism (ep.h): on rank 0, the runner is announced to the
     * other ranks, which follow its steps; the model holds rank 0's
     * experts.  NULL: one process. */
    struct moe_ep *ep;
};

struct moe_runner {
    const struct moe_model *m;  /* borrowed */
    struct moe_backend *be;     /* borrowed */
    struct moe_kvcache kv;
    struct moe_forward fw;
    struct moe_runner_opts o;
    int max_blocks;             /* blocks of one sequence at the model's context */
    /* host batch arrays */
    int32_t *tokens, *pos, *seq_of, *slot, *rows;  /* (max_tokens) */
    int32_t *seq_start, *ctx_len;                  /* (max_seqs + 1) */
    int32_t *table;                                /* (max_seqs, max_blocks) */
    int32_t *sslot;                                /* (max_seqs) state slots (hybrid models) */
    int32_t *dp;                                   /* (max_seqs) data-parallel attention: each
                                                      sequence's rank (ep.h), else NULL */
};

MOE_MUST_USE enum moe_status moe_runner_init(struct moe_runner *r, const struct moe_model *m,
                                              struct moe_backend *be,
                                              const struct moe_runner_opts *o);
void moe_runner_free(struct moe_runner *r);
/* Returns a sequence's blocks to the pool and empties it. */
void moe_seq_reset(struct moe_runner *r, struct moe_seq *s);
void moe_seq_free(struct moe_runner *r, struct moe_seq *s);
/* Forgets the cache of s beyond its first len tokens (len <= s->len):
 * blocks past the one holding token len - 1 go back to the pool.  Slots
 * of the kept last block beyond len keep stale K/V that no step reads
 * (attention stops at the context length) and the next tokens overwrite.
 * The caller keeps dropped blocks out of the prefix cache. */
void moe_seq_truncate(struct moe_runner *r, struct moe_seq *s, int len);
/* The part of the pool s takes its blocks from (data-parallel attention:
 * its rank; else 0): its first block's (or recurrent-state slot's), or for
 * a sequence without either the part with the most blocks available (the
 * lowest of equals) among those with a state slot free (a hybrid model:
 * each part holds 1/N of the runner's state slots, rounded up). */
int moe_runner_seq_part(const struct moe_runner *r, const struct moe_seq *s);
/* Makes room in the pool for s to hold len tokens (allocates blocks). */
MOE_MUST_USE enum moe_status moe_runner_reserve(struct moe_runner *r, struct moe_seq *s, int len);
/* Appends an already-referenced block (a prefix cache hit) to s. */
MOE_MUST_USE enum moe_status moe_seq_push_block(struct moe_runner *r, struct moe_seq *s,
                                                 int32_t block);
/* Appends each chunk's tokens to its sequence and runs one forward step.
 * logits (rows, V) host in chunk order, may be NULL; ids (rows) host, may
 * be NULL, the argmax of each of those rows computed by the backend (so a
 * greedy caller passes ids alone and no logits cross to the host); *n_rows
 * receives the row count.  On failure no sequence changes length (blocks
 * taken for it are returned). */
MOE_MUST_USE enum moe_status moe_runner_step(struct moe_runner *r, const struct moe_chunk *chunks,
                                              int n_chunks, float *logits, int32_t *ids,
                                              int *n_rows, struct moe_route_trace *trace);
/* Greedy decoding of one sequence: prefill `prompt` in chunks of at most
 * `chunk` tokens (0 = max_tokens), then n_new tokens into out. */
MOE_MUST_USE enum moe_status moe_runner_greedy(struct moe_runner *r, struct moe_seq *s,
                                                const int32_t *prompt, int n_prompt, int n_new,
                                                int chunk, int32_t *out);

#ifdef __cplusplus
}
#endif
