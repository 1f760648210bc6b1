/* spec_mtp.c - the multi-token-prediction proposer (see spec_mtp.h). */
#include "runtime/engine/spec_mtp.h"

#include <stdlib.h>
#include <string.h>

enum moe_status moe_spec_mtp_init(struct moe_spec_mtp *p, const struct moe_model *mtp,
                                  struct moe_backend *be, const struct moe_spec_mtp_opts *o)
{
    memset(p, 0, sizeof *p);
    if (!mtp || !mtp->mtp_eh_proj.data)
        return moe_fail(MOE_ERR_INVALID_ARG, "speculation: the proposer is not a multi-token-prediction module");
    if (!o->hid) return moe_fail(MOE_ERR_INVALID_ARG, "speculation: no hidden states of the target to read");
    if (o->max_seqs <= 0 || o->max_tokens <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "multi-token prediction: rows and sequences per step must be positive");
    p->hid = o->hid;
    p->zero_row = o->zero_row;
    p->vocab = mtp->cfg.vocab;
    struct moe_runner_opts ro = {
        .max_tokens = o->max_tokens, .max_seqs = o->max_seqs, .max_logits = o->max_seqs,
        .block_size = o->block_size, .n_blocks = o->n_blocks, .kv_dtype = o->kv_dtype,
        .kv_dtype_set = true, .prefix_cache = false};
    enum moe_status s = moe_runner_init(&p->r, mtp, be, &ro);
    if (s != MOE_OK) goto fail;
    const size_t S = (size_t)o->max_seqs, T = (size_t)o->max_tokens, D = (size_t)mtp->cfg.d_model;
    p->jobs = calloc(S, sizeof *p->jobs);
    p->chunks = calloc(S, sizeof *p->chunks);
    p->job_of = calloc(S, sizeof *p->job_of);
    p->keep_of = calloc(S, sizeof *p->keep_of);
    p->ids = calloc(S, sizeof *p->ids);
    p->rows = calloc(T > S ? T : S, sizeof *p->rows);
    if (!p->jobs || !p->chunks || !p->job_of || !p->keep_of || !p->ids || !p->rows) {
        s = moe_fail(MOE_ERR_NOMEM, "multi-token prediction: step buffers");
        goto fail;
    }
    size_t kb;
    if (!moe_mul_size(S, D, &kb) || !moe_mul_size(kb, sizeof(float), &kb)) {
        s = moe_fail(MOE_ERR_NOMEM, "multi-token prediction: %zu sequences x %zu", S, D);
        goto fail;
    }
    if ((s = be->ops->alloc(be, T * sizeof(int32_t), (void **)&p->rows_d)) != MOE_OK ||
        (s = be->ops->alloc(be, S * sizeof(int32_t), (void **)&p->krows_d)) != MOE_OK ||
        (s = be->ops->alloc(be, kb, (void **)&p->keep)) != MOE_OK)
        goto fail;
    return MOE_OK;
fail:
    moe_spec_mtp_free(p);
    return s;
}

void moe_spec_mtp_free(struct moe_spec_mtp *p)
{
    struct moe_backend *be = p->r.be;
    if (be) {
        be->ops->dealloc(be, p->rows_d);
        be->ops->dealloc(be, p->krows_d);
        be->ops->dealloc(be, p->keep);
    }
    moe_runner_free(&p->r);
    free(p->jobs);
    free(p->chunks);
    free(p->job_of);
    free(p->keep_of);
    free(p->ids);
    free(p->rows);
    memset(p, 0, sizeof *p);
}

static int blocks_for(const struct moe_spec_mtp *p, int tokens)
{
    return (tokens + p->r.o.block_size - 1) / p->r.o.block_size;
}

/* Fits each job to the module's context and free blocks, in job order: it
 * needs its computed positions and k - 1 rows of guesses.  A job that
 * cannot hold even its positions skips its catch-up (n_computed lowered to
 * what it holds) and drafts nothing. */
static void fit_jobs(struct moe_spec_mtp *p, int n)
{
    int avail = moe_kvcache_available(&p->r.kv);
    const int ctx = p->r.m->cfg.max_pos;
    for (int j = 0; j < n; j++) {
        struct moe_spec_mtp_job *jb = &p->jobs[j];
        if (jb->seq->len > jb->n_computed) moe_seq_truncate(&p->r, jb->seq, jb->n_computed);
        if (jb->k < 0 || jb->n_computed != jb->n_tokens - 1 || jb->seq->len >= jb->n_computed) jb->k = 0;
        if (jb->k > ctx - jb->n_computed + 1) jb->k = ctx - jb->n_computed + 1;
        int need;
        for (;;) {
            int rows = jb->n_computed + (jb->k > 1 ? jb->k - 1 : 0);
            need = blocks_for(p, rows) - jb->seq->n_blocks;
            if (need <= avail || jb->k == 0) break;
            jb->k--;
        }
        if (need > avail) {
            jb->n_computed = jb->seq->len;
            continue;
        }
        if (need > 0) avail -= need;
    }
}

static int32_t in_vocab(const struct moe_spec_mtp *p, int32_t id)
{
    return id >= 0 && id < p->vocab ? id : 0;
}

/* The catch-up: each job's positions from its cache's end to n_computed,
 * chunked to the step's rows, their hidden states gathered from the
 * target's; a job whose last position is computed gets draft token 1 and
 * keeps that row's block output. */
static enum moe_status catch_up(struct moe_spec_mtp *p, int n)
{
    struct moe_backend *be = p->r.be;
    const int D = p->r.m->cfg.d_model;
    int n_kept = 0;
    for (;;) {
        int nc = 0, t = 0, budget = p->r.o.max_tokens;
        for (int j = 0; j < n && budget > 0 && nc < p->r.o.max_seqs; j++) {
            struct moe_spec_mtp_job *jb = &p->jobs[j];
            int left = jb->n_computed - jb->seq->len;
            if (left <= 0) continue;
            int c = left < budget ? left : budget;
            for (int i = 0; i < c; i++) {
                int pos = jb->seq->len + i;
                p->rows[t++] = pos >= jb->step_first ? jb->step_row + pos - jb->step_first : p->zero_row;
            }
            p->chunks[nc] = (struct moe_chunk){jb->seq, jb->tokens + jb->seq->len + 1, c, false, false, 0};
            p->job_of[nc++] = j;
            budget -= c;
        }
        if (nc == 0) return MOE_OK;
        MOE_TRY(be->ops->to_device(be, p->rows_d, p->rows, (size_t)t * sizeof(int32_t)));
        MOE_TRY(be->ops->gather_rows(be, p->r.fw.hin, p->hid, p->rows_d, t, D));
        MOE_TRY(moe_runner_step(&p->r, p->chunks, nc, NULL, p->ids, NULL, NULL));
        int m = 0;
        for (int c = 0, end = 0; c < nc; c++) {
            struct moe_spec_mtp_job *jb = &p->jobs[p->job_of[c]];
            end += p->chunks[c].n;
            if (jb->k == 0 || jb->seq->len != jb->n_computed) continue;
            jb->out[0] = in_vocab(p, p->ids[c]);
            p->keep_of[p->job_of[c]] = n_kept + m;
            p->rows[m++] = end - 1;
        }
        if (m == 0) continue;
        MOE_TRY(be->ops->to_device(be, p->krows_d, p->rows, (size_t)m * sizeof(int32_t)));
        MOE_TRY(be->ops->gather_rows(be, p->keep + (size_t)n_kept * D, p->r.fw.x, p->krows_d, m, D));
        n_kept += m;
    }
}

enum moe_status moe_spec_mtp_run(struct moe_spec_mtp *p, int n)
{
    struct moe_backend *be = p->r.be;
    const int D = p->r.m->cfg.d_model;
    MOE_ASSERT(n >= 0 && n <= p->r.o.max_seqs);
    fit_jobs(p, n);
    enum moe_status s = catch_up(p, n);
    /* then one row per sequence and step: the guess before, and the block
     * output of the row before as the hidden state */
    for (int i = 1; s == MOE_OK; i++) {
        int nc = 0;
        bool more = false;
        for (int j = 0; j < n; j++) {
            struct moe_spec_mtp_job *jb = &p->jobs[j];
            if (jb->k <= i) continue;
            more |= jb->k > i + 1;
            p->chunks[nc] = (struct moe_chunk){jb->seq, &jb->out[i - 1], 1, false, true, 0};
            p->rows[nc] = p->keep_of[j];
            p->job_of[nc++] = j;
        }
        if (nc == 0) break;
        if ((s = be->ops->to_device(be, p->rows_d, p->rows, (size_t)nc * sizeof(int32_t))) != MOE_OK ||
            (s = be->ops->gather_rows(be, p->r.fw.hin, p->keep, p->rows_d, nc, D)) != MOE_OK ||
            (s = moe_runner_step(&p->r, p->chunks, nc, NULL, p->ids, NULL, NULL)) != MOE_OK)
            break;
        for (int c = 0; c < nc; c++) {
            p->jobs[p->job_of[c]].out[i] = in_vocab(p, p->ids[c]);
            p->keep_of[p->job_of[c]] = c;
        }
        if (more) s = be->ops->gather_cols(be, p->keep, D, p->r.fw.x, D, nc, NULL, D);
    }
    /* the rows of guesses go: the cache keeps what the target's states made */
    for (int j = 0; j < n; j++) {
        struct moe_spec_mtp_job *jb = &p->jobs[j];
        if (jb->seq->len > jb->n_computed) moe_seq_truncate(&p->r, jb->seq, jb->n_computed);
    }
    return s;
}

void moe_spec_mtp_reset(struct moe_spec_mtp *p, struct moe_seq *s)
{
    if (p->r.kv.blocks) moe_seq_reset(&p->r, s);
}

void moe_spec_mtp_seq_free(struct moe_spec_mtp *p, struct moe_seq *s)
{
    moe_seq_free(&p->r, s);
}
