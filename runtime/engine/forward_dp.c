/* forward_dp.c - data-parallel attention across ranks (ep.h: moe_ep_set_dp).
 *
 * Each sequence of a step has a rank (the batch's dp_rank, given by rank
 * 0's runner).  At the step's start every rank lays out the batch's rows
 * in rank order (the order of their ranks, then of the batch) and makes
 * its own sub-batch: its sequences, their rows, positions, slots, block
 * tables and state slots, renumbered from 0, the blocks and slots counted
 * from the first block of the pool's part this rank stores (the part of
 * the sequence's rank: runner.c gives each sequence its blocks from it).  Per attention layer the rank
 * takes its rows of the residual stream (a gather, or a view when the
 * batch is in rank order already), runs the attention block on its
 * sub-batch alone (its K/V written to the cache, its recurrent states
 * advanced), and the ranks all-gather the rows in rank order and put them
 * back in batch order; the FFN then runs on every row as with replicated
 * attention.  A row's attention is computed from its own sequence only,
 * and the CPU backends compute a row the same whatever rows it is grouped
 * with, so the logits are one process's, bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core/clock.h"
#include "runtime/engine/ep_impl.h"
#include "runtime/engine/forward.h"

/* The host and backend arrays (made at the first step): counts and
 * displs per rank, of the rows and of the logit rows, and a cursor per
 * rank (the next place of its rows while they are laid out); in one int32
 * region, host and backend alike: the sub-batch's tokens, positions,
 * seq_of and slots (T each), seq_start (S + 1), ctx_len and state slots
 * (S), block table (S x max_blocks), the rank order of the rows and its
 * inverse (T each), then this rank's logit rows and the rank order of
 * all of them (max_logits each). */
static enum moe_status dp_state(struct moe_forward *fw, int max_blocks)
{
    struct moe_forward_dp *d = &fw->dp;
    if (d->h) return MOE_OK;
    const size_t T = (size_t)fw->lim.max_tokens, S = (size_t)fw->lim.max_seqs, R = (size_t)fw->ep->size;
    size_t tab, ints, floats;
    const size_t L = (size_t)fw->lim.max_logits;
    if (!moe_mul_size(S, (size_t)max_blocks, &tab) || !moe_add_size(tab, 6 * T + 3 * S + 1 + 2 * L, &ints) ||
        !moe_mul_size(T, (size_t)fw->m->cfg.d_model, &floats))
        return moe_fail(MOE_ERR_NOMEM, "data-parallel attention: sizes overflow");
    d->ints = ints;
    d->counts = calloc(5 * R, sizeof *d->counts);
    d->h = calloc(ints, sizeof *d->h);
    if (!d->counts || !d->h) return moe_fail(MOE_ERR_NOMEM, "data-parallel attention: host arrays");
    d->displs = d->counts + R;
    d->lcounts = d->displs + R;
    d->ldispls = d->lcounts + R;
    d->cursor = d->ldispls + R;
    struct moe_backend *be = fw->be;
    if (be->ops->host_memory) d->d = d->h;
    else {
        MOE_FORWARD_ALLOC(be, d->d, ints, int32_t);
        if (!(d->stage = malloc(floats * sizeof(float))))
            return moe_fail(MOE_ERR_NOMEM, "data-parallel attention: a host stage of %zu rows", T);
    }
    MOE_FORWARD_ALLOC(be, d->rows, floats, float);
    return MOE_OK;
}

enum moe_status moe_forward_dp_begin(struct moe_forward *fw, const struct moe_kvcache *kv, const struct moe_batch *b)
{
    struct moe_forward_dp *d = &fw->dp;
    struct moe_ep *ep = fw->ep;
    d->on = moe_ep_on(ep) && ep->dp;
    if (!d->on) return MOE_OK;
    MOE_TRY(dp_state(fw, b->max_blocks));
    const int T = b->n_tokens, S = b->n_seqs, MB = b->max_blocks, R = ep->size;
    /* in host memory the rows stay on their ranks (forward_dp_local.c); the
     * routing of every rank is recorded after each layer's gather */
    d->local = fw->be->ops->host_memory && ep->dp_local;
    d->T = T;
    if (d->local) fw->stats_async = false;
    int32_t *tokens = d->h, *pos = tokens + T, *seq_of = pos + T, *slot = seq_of + T, *start = slot + T,
            *ctx = start + S + 1, *state = ctx + S, *table = state + S, *order = table + (size_t)S * MB,
            *inv = order + T, *lrows = inv + T, *lorder = lrows + fw->lim.max_logits;
    memset(d->counts, 0, (size_t)R * sizeof *d->counts);
    for (int s = 0; s < S; s++) d->counts[b->dp_rank[s]] += b->seq_start[s + 1] - b->seq_start[s];
    int n = 0, mine = 0;
    for (int r = 0; r < R; r++) {
        d->displs[r] = n;
        n += d->counts[r];
    }
    d->ordered = true;
    start[0] = 0;
    /* rank order by counting: each sequence's rows at its rank's cursor,
     * the sequences of a rank in batch order */
    memcpy(d->cursor, d->displs, (size_t)R * sizeof *d->cursor);
    for (int s = 0; s < S; s++) {
        const int r = b->dp_rank[s], a = b->seq_start[s], z = b->seq_start[s + 1];
        for (int t = a; t < z; t++) {
            const int p = d->cursor[r]++;
            order[p] = t;
            inv[t] = p;
            d->ordered = d->ordered && p == t;
        }
        if (r != ep->rank) continue;
        /* its blocks and slots where this rank stores its part of the pool */
        const int at = start[mine], nb = (b->ctx_len[s] + kv->block_size - 1) / kv->block_size;
        const int32_t first = kv->stored_first, first_slot = first * kv->block_size;
        for (int t = a; t < z; t++) {
            tokens[at + t - a] = b->tokens[t];
            pos[at + t - a] = b->positions[t];
            seq_of[at + t - a] = mine;
            slot[at + t - a] = b->slot[t] - first_slot;
        }
        start[mine + 1] = at + z - a;
        ctx[mine] = b->ctx_len[s];
        state[mine] = b->state_slot ? b->state_slot[s] - kv->state_first : -1;
        int32_t *row = table + (size_t)mine * MB;
        const int32_t *from = b->block_table + (size_t)s * MB;
        for (int i = 0; i < MB; i++) row[i] = i < nb ? from[i] - first : 0;
        mine++;
    }
    /* the logit rows: this rank's as rows of its own (the last layer's FFN
     * runs for them alone), and all of them in rank order (lorder: each
     * one's index in the batch's list) */
    int lo = 0;
    memset(d->lcounts, 0, (size_t)R * sizeof *d->lcounts);
    for (int i = 0; i < b->n_logits; i++) d->lcounts[b->dp_rank[b->seq_of[b->logit_rows[i]]]]++;
    for (int r = 0; r < R; r++) {
        d->ldispls[r] = d->cursor[r] = lo;
        lo += d->lcounts[r];
    }
    for (int i = 0; i < b->n_logits; i++) {
        const int r = b->dp_rank[b->seq_of[b->logit_rows[i]]], at = d->cursor[r]++;
        lorder[at] = i;
        if (r == ep->rank) lrows[at - d->ldispls[r]] = inv[b->logit_rows[i]] - d->displs[r];
    }
    ep->dp_rows += (uint64_t)d->counts[ep->rank];
    ep->dp_rows_all += (uint64_t)T;
    if (mine > 0 || !d->ordered) { /* the rows the attention reads, and the orders the gathers read */
        struct moe_backend *be = fw->be;
        if (d->d != d->h) MOE_TRY(be->ops->to_device(be, d->d, d->h, d->ints * sizeof *d->h));
    }
    int32_t *dv = d->d;
    d->sub = (struct moe_batch){
        .n_tokens = d->counts[ep->rank], .n_seqs = mine, .tokens = dv, .positions = dv + (pos - tokens),
        .seq_of = dv + (seq_of - tokens), .slot = dv + (slot - tokens), .seq_start = dv + (start - tokens),
        .ctx_len = dv + (ctx - tokens), .state_slot = b->state_slot ? dv + (state - tokens) : NULL,
        .block_table = dv + (table - tokens), .max_blocks = MB, .logit_rows = dv + (lrows - tokens),
        .n_logits = d->lcounts[ep->rank]};
    d->order = dv + (order - tokens);
    d->inv = dv + (inv - tokens);
    d->lorder = lorder;
    return MOE_OK;
}

/* Every rank's rows of buf (T, D) in rank order gathered on every rank;
 * a backend not in host memory sends its rows through the host stage. */
static enum moe_status dp_allgather(struct moe_forward *fw, float *buf, int D, int l)
{
    struct moe_forward_dp *d = &fw->dp;
    struct moe_ep *ep = fw->ep;
    struct moe_backend *be = fw->be;
    char what[56];
    snprintf(what, sizeof what, "layer %d: attention rows", l);
    const size_t row = (size_t)D, at = (size_t)d->displs[ep->rank], n = (size_t)d->counts[ep->rank];
    const size_t all = (size_t)d->displs[ep->size - 1] + (size_t)d->counts[ep->size - 1];
    const double t0 = moe_seconds();
    if (be->ops->host_memory) {
        MOE_TRY(moe_comm_allgatherv_rows(ep->comm, buf, d->counts, d->displs, D, what));
    } else {
        MOE_TRY(be->ops->to_host(be, d->stage + at * row, buf + at * row, n * row * sizeof(float)));
        MOE_TRY(moe_comm_allgatherv_rows(ep->comm, d->stage, d->counts, d->displs, D, what));
        MOE_TRY(be->ops->to_device(be, buf, d->stage, all * row * sizeof(float)));
    }
    ep->dp_s += moe_seconds() - t0;
    ep->dp_bytes += (uint64_t)(all - n) * row * sizeof(float);
    return MOE_OK;
}

enum moe_status moe_forward_dp_attention(struct moe_forward *fw, struct moe_kvcache *kv, int T, int l)
{
    struct moe_forward_dp *d = &fw->dp;
    struct moe_backend *be = fw->be;
    const int D = fw->m->cfg.d_model, n = d->sub.n_tokens, at = d->displs[fw->ep->rank];
    float *x = fw->x, *rows = d->ordered ? x : d->rows;
    if (n > 0) {
        if (!d->ordered) MOE_TRY(be->ops->gather_rows(be, rows + (size_t)at * D, x, d->order + at, n, D));
        fw->x = rows + (size_t)at * D;
        enum moe_status s = moe_forward_attention_block(fw, kv, &d->sub, l);
        fw->x = x;
        MOE_TRY(s);
    }
    MOE_TRY(be->ops->sync(be)); /* the rows are complete before they travel */
    MOE_TRY(dp_allgather(fw, rows, D, l));
    if (d->ordered) return MOE_OK;
    return be->ops->gather_rows(be, x, rows, d->inv, T, D);
}

void moe_forward_dp_free(struct moe_forward *fw)
{
    struct moe_forward_dp *d = &fw->dp;
    struct moe_backend *be = fw->be;
    if (be && d->d != d->h) be->ops->dealloc(be, d->d);
    if (be) be->ops->dealloc(be, d->rows);
    free(d->h);
    free(d->counts);
    free(d->stage);
    free(d->send);
    free(d->recv);
    free(d->pair_send);
    free(d->pair_recv);
    free(d->slot_recv);
    free(d->seen);
    free(d->mat);
    free(d->gath);
    free(d->rplan.counts);
    memset(d, 0, sizeof *d);
}
