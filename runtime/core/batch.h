/* batch.h - one forward step: tokens of several sequences, flattened.
 *
 * Rows of a sequence are contiguous (seq_start) and in position order.  Each
 * new token's K/V go to `slot`; its query attends to positions 0..pos of its
 * own sequence through the block table.  Prefill chunks and single decode
 * tokens mix freely. */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct moe_batch {
    int n_tokens;                 /* T */
    int n_seqs;
    const int32_t *tokens;        /* (T) */
    const int32_t *positions;     /* (T) */
    const int32_t *seq_of;        /* (T) sequence index of each row */
    const int32_t *seq_start;     /* (n_seqs+1) first row of each sequence */
    const int32_t *ctx_len;       /* (n_seqs) tokens in cache after this step */
    const int32_t *block_table;   /* (n_seqs, max_blocks) */
    int max_blocks;               /* row stride of block_table */
    const int32_t *slot;          /* (T) cache slot of each new token */
    const int32_t *logit_rows;    /* (n_logits) rows whose logits are wanted */
    int n_logits;
    /* hybrid models (linear-attention layers): each sequence's recurrent
     * state slot (kvcache.h); a sequence whose first row is at position 0
     * starts from a zero state, any other continues its slot's.  NULL
     * otherwise. */
    const int32_t *state_slot;    /* (n_seqs) */
    /* data-parallel attention (runtime/engine/ep.h): the rank that runs
     * each sequence's attention and holds its K/V; NULL otherwise */
    const int32_t *dp_rank;       /* (n_seqs) */
    /* optional, for statistics and traces (NULL = none) */
    const uint8_t *decode;        /* (n_seqs) 1 if the sequence's chunk is a decode step */
    const int64_t *request_ids;   /* (n_seqs) request id of each sequence */
    const uint8_t *verify;        /* (n_seqs) 1 if the chunk verifies drafted tokens
                                     (speculative decoding; a decode too) */
};

#ifdef __cplusplus
}
#endif
