/* spec_mtp.h - the multi-token-prediction proposer of speculative
 * decoding: a checkpoint's MTP module (model.h, moe_model_mtp_view; the
 * DeepSeek-V3 report's section 2.2) guesses each sequence's next tokens
 * from the target's own hidden states.
 *
 * Module row p of a sequence reads the target's final-normed hidden state
 * h_p and the token t_{p+1} (eh_proj [enorm(embed(t_{p+1})); hnorm(h_p)],
 * then its decoder layer at position p over its own KV cache) and predicts
 * t_{p+2}.  So after each target step the module computes the rows of the
 * positions the target has just verified, while their hidden states are
 * in the target's workspace (moe_forward.hid, lim.hidden): a catch-up
 * whose last row, at the sequence's last computed position, gives draft
 * token 1; then k - 1 rows of one position each, feeding the token drafted
 * before and, as the hidden state, the module's own block output of the
 * row before (what vLLM's MTP proposer does for k > 1).  Those k - 1 rows
 * read the module's guesses, not the target's hidden states, so they are
 * dropped after proposing: the module's cache holds exactly the positions
 * it computed from the target.  A position whose hidden state no step
 * computed (a prompt prefix taken from the prefix cache) is computed from
 * a zero hidden state.  Drafts are the module's argmax (q one-hot); NaN
 * logits may waste a step, never change the target's output.
 *
 * Invariant: a request's MTP sequence (struct moe_request.mtp_seq) holds
 * positions 0 .. len - 1 with len <= the target's computed tokens.  Its
 * pool never preempts: a job whose rows do not fit is proposed fewer
 * tokens, or skips its catch-up (the skipped positions are then computed
 * later from zero hidden states). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine/runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One sequence after a target step. */
struct moe_spec_mtp_job {
    struct moe_seq *seq;   /* the request's MTP sequence (borrowed) */
    const int32_t *tokens; /* the request's tokens */
    int n_tokens;
    int n_computed;        /* positions the target has computed (< n_tokens) */
    int step_first;        /* the first position of this step's rows ... */
    int step_row;          /* ... and its row in the target's hidden states */
    int k;                 /* in: tokens wanted (0: catch up only; needs n_computed ==
                              n_tokens - 1); out: tokens proposed */
    int32_t *out;          /* (k) */
};

struct moe_spec_mtp {
    struct moe_runner r;        /* the module's runner and KV pool */
    const float *hid;           /* the target's hidden rows (backend memory, borrowed) */
    int zero_row;               /* their row that stays zero */
    int vocab;
    struct moe_spec_mtp_job *jobs; /* (max_seqs) filled by the engine */
    struct moe_chunk *chunks;   /* (max_seqs) */
    int *job_of;                /* (max_seqs) job of each chunk */
    int *keep_of;               /* (max_seqs) each job's row in keep */
    int32_t *ids;               /* (max_seqs) argmax of each chunk's last row */
    int32_t *rows;              /* (max_tokens) host: the hidden row of each module row */
    int32_t *rows_d;            /* (max_tokens) backend */
    int32_t *krows_d;           /* (max_seqs) backend */
    float *keep;                /* (max_seqs, D) backend: block outputs that feed the next row */
};

struct moe_spec_mtp_opts {
    int max_tokens;            /* rows per module step (the target's step) */
    int max_seqs;
    int block_size;
    int n_blocks;              /* the module's pool */
    enum moe_dtype kv_dtype;
    const float *hid;          /* the target's moe_forward.hid */
    int zero_row;              /* its zero row (the target's max_tokens) */
};

/* Prepares the module (a model from moe_model_mtp_view) on be, which must
 * be the target's backend (the hidden states are read in place). */
MOE_MUST_USE enum moe_status moe_spec_mtp_init(struct moe_spec_mtp *p, const struct moe_model *mtp,
                                                struct moe_backend *be,
                                                const struct moe_spec_mtp_opts *o);
/* Safe on a zeroed struct and twice. */
void moe_spec_mtp_free(struct moe_spec_mtp *p);
/* After a target step: catches jobs p->jobs[0..n) up and proposes (see
 * the top).  Fails only on a backend error. */
MOE_MUST_USE enum moe_status moe_spec_mtp_run(struct moe_spec_mtp *p, int n);
/* Gives s's blocks back (preemption, finish); safe with zeroed p and s. */
void moe_spec_mtp_reset(struct moe_spec_mtp *p, struct moe_seq *s);
/* Frees s's block table too. */
void moe_spec_mtp_seq_free(struct moe_spec_mtp *p, struct moe_seq *s);

#ifdef __cplusplus
}
#endif
