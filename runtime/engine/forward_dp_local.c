/* forward_dp_local.c - data-parallel attention with the rows kept on their
 * ranks (forward.h: fw->dp.local; a backend in host memory).
 *
 * After the embedding each rank keeps its own rows (its sequences', in
 * batch order; forward_dp.c lays out the step) and runs every layer on
 * them alone: attention on its sub-batch, the FFN norm, the router, dense
 * FFNs and shared experts on its rows.  A MoE layer's routed pairs travel
 * to the ranks of their slots and back (expert parallelism's dispatch and
 * combine as all-to-alls):
 *
 *   1. the rank's pairs are dispatched over the layer's slots, which
 *      orders them by slot, so each rank's share is one run of rows;
 *   2. the ranks exchange their counts (an all-gather of the N x N
 *      matrix, which also gives rank 0 the step's expert counters);
 *   3. each rank sends each of its rows once to each rank one of the
 *      row's pairs goes to, and each pair's slot and row there
 *      (all-to-all);
 *   4. a rank runs its slots' experts over the pairs it received (their
 *      rows laid out again, a dispatch of one pair a row) and sends each
 *      output back, in the order it came (all-to-all);
 *   5. the sender finds its pairs' outputs where its own dispatch put them
 *      and combines its rows in the fixed k order.
 *
 * Each pair's output is the product one process computes (the CPU
 * backends compute a row the same in any group) and each row's combine
 * runs in the same order, so logits stay bit-identical.  A rank receives
 * the rows routed to its slots rather than every rank's rows: against
 * the gathers of replicated attention, about N times fewer bytes at N
 * ranks.  Statistics and traces need every row's routing on rank 0: when
 * they are on, each MoE layer's ids, weights and router logits are
 * gathered there.  The last layer's FFN runs for a rank's logit rows
 * alone (as in one process, when no later reader wants every row), and
 * those are all-gathered; else every row is, once, after the last layer
 * (hidden states read them all). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/stats.h"
#include "runtime/core/clock.h"
#include "runtime/engine/ep_impl.h"
#include "runtime/engine/forward.h"

/* The local mode's host buffers, made at first use. */
static enum moe_status local_state(struct moe_forward *fw)
{
    struct moe_forward_dp *d = &fw->dp;
    if (d->send) return MOE_OK;
    const struct moe_config *c = &fw->m->cfg;
    const size_t R = (size_t)fw->ep->size, K = (size_t)(c->top_k > 0 ? c->top_k : 1),
                 E = (size_t)(c->n_experts > 0 ? c->n_experts : 1);
    size_t pairs, floats, gath;
    if (!moe_mul_size((size_t)fw->lim.max_tokens, K, &pairs) ||
        !moe_mul_size(pairs > (size_t)fw->lim.max_logits ? pairs : (size_t)fw->lim.max_logits, (size_t)c->d_model,
                      &floats) ||
        !moe_mul_size((size_t)fw->lim.max_tokens, K > E ? K : E, &gath))
        return moe_fail(MOE_ERR_NOMEM, "data-parallel attention: sizes overflow");
    d->send = malloc(floats * sizeof(float));
    d->recv = malloc(floats * sizeof(float));
    d->pair_send = malloc(2 * pairs * sizeof(int32_t));
    d->pair_recv = malloc(2 * pairs * sizeof(int32_t));
    d->slot_recv = malloc(pairs * sizeof(int32_t));
    d->seen = malloc(2 * (size_t)fw->lim.max_tokens * sizeof(int32_t));
    d->mat = malloc(R * (2 * R + 11) * sizeof(int32_t));
    d->gath = malloc(gath * sizeof(float));
    const size_t S = (size_t)(fw->ep->max_slots > 0 ? fw->ep->max_slots : 1);
    d->rplan.counts = malloc((2 * S + 1 + 2 * pairs) * sizeof(int32_t));
    if (!d->send || !d->recv || !d->pair_send || !d->pair_recv || !d->slot_recv || !d->seen || !d->mat || !d->gath ||
        !d->rplan.counts)
        return moe_fail(MOE_ERR_NOMEM, "data-parallel attention: buffers of %zu expert rows", pairs);
    d->rplan.offsets = d->rplan.counts + S;
    d->rplan.perm = d->rplan.offsets + S + 1;
    d->rplan.pos = d->rplan.perm + pairs;
    d->sc = d->mat + 2 * R * R; /* then the rows' counts, sent with them (umine) */
    d->sd = d->sc + 2 * R;
    d->rc = d->sd + R;
    d->rd = d->rc + R;
    d->usc = d->rd + R;
    d->usd = d->usc + R;
    d->urc = d->usd + R;
    d->urd = d->urc + R;
    d->gcnt = d->urd + R;
    return MOE_OK;
}

enum moe_status moe_forward_dp_take(struct moe_forward *fw)
{
    struct moe_forward_dp *d = &fw->dp;
    MOE_TRY(local_state(fw));
    const size_t D = (size_t)fw->m->cfg.d_model;
    const int n = d->sub.n_tokens, at = d->displs[fw->ep->rank];
    for (int i = 0; i < n; i++) memcpy(d->rows + (size_t)i * D, fw->x + (size_t)d->order[at + i] * D, D * sizeof(float));
    d->x_full = fw->x;
    fw->x = d->rows;
    return MOE_OK;
}

/* Every rank's logit rows (this rank's in fw->lrows) gathered into
 * fw->lrows in the batch's order, through d->send. */
static enum moe_status give_logit_rows(struct moe_forward *fw)
{
    struct moe_forward_dp *d = &fw->dp;
    struct moe_ep *ep = fw->ep;
    const size_t D = (size_t)fw->m->cfg.d_model;
    const int n = d->lcounts[ep->rank], all = d->ldispls[ep->size - 1] + d->lcounts[ep->size - 1];
    memcpy(d->send + (size_t)d->ldispls[ep->rank] * D, fw->lrows, (size_t)n * D * sizeof(float));
    const double t0 = moe_seconds();
    MOE_TRY(moe_comm_allgatherv_rows(ep->comm, d->send, d->lcounts, d->ldispls, (int)D, "the logit rows"));
    ep->dp_s += moe_seconds() - t0;
    ep->dp_bytes += (uint64_t)(all - n) * D * sizeof(float);
    for (int j = 0; j < all; j++) memcpy(fw->lrows + (size_t)d->lorder[j] * D, d->send + (size_t)j * D, D * sizeof(float));
    return MOE_OK;
}

enum moe_status moe_forward_dp_give(struct moe_forward *fw, enum moe_status s, bool logit_rows)
{
    struct moe_forward_dp *d = &fw->dp;
    struct moe_ep *ep = fw->ep;
    float *mine = fw->x, *full = d->x_full;
    fw->x = full;
    if (s != MOE_OK) return s;
    if (logit_rows) return give_logit_rows(fw);
    const size_t D = (size_t)fw->m->cfg.d_model;
    const int n = d->sub.n_tokens, at = d->displs[ep->rank];
    memmove(full + (size_t)at * D, mine, (size_t)n * D * sizeof(float));
    const double t0 = moe_seconds();
    MOE_TRY(moe_comm_allgatherv_rows(ep->comm, full, d->counts, d->displs, (int)D, "the rows after the last layer"));
    ep->dp_s += moe_seconds() - t0;
    ep->dp_bytes += (uint64_t)(d->T - n) * D * sizeof(float);
    if (d->ordered) return MOE_OK;
    for (int t = 0; t < d->T; t++) memcpy(mine + (size_t)t * D, full + (size_t)d->inv[t] * D, D * sizeof(float));
    memcpy(full, mine, (size_t)d->T * D * sizeof(float));
    return MOE_OK;
}

/* src (T_r rows of w words on each rank) gathered on rank 0 into dst (T
 * rows of the step, in batch order), through d->gath. */
static enum moe_status gather_routing(struct moe_forward *fw, void *dst, const void *src, int w, const char *what)
{
    struct moe_forward_dp *d = &fw->dp;
    struct moe_ep *ep = fw->ep;
    const size_t row = (size_t)w * sizeof(float);
    for (int r = 0; r < ep->size; r++) d->gcnt[r] = d->counts[r] * w; /* fits: T max_tokens rows of w */
    const double t0 = moe_seconds();
    MOE_TRY(moe_comm_gatherv(ep->comm, src, d->sub.n_tokens * w, d->gath, d->gcnt, 0, what));
    ep->dp_s += moe_seconds() - t0;
    if (ep->rank != 0) return MOE_OK;
    ep->dp_bytes += (uint64_t)(d->T - d->sub.n_tokens) * row;
    for (int i = 0; i < d->T; i++) memcpy((char *)dst + (size_t)d->order[i] * row, d->gath + (size_t)i * w, row);
    return MOE_OK;
}

enum moe_status moe_forward_dp_routing(struct moe_forward *fw, int l, struct moe_route_trace *trace)
{
    struct moe_forward_dp *d = &fw->dp;
    const struct moe_config *c = &fw->m->cfg;
    const int K = c->top_k, E = c->n_experts, all = d->T;
    /* the same on every rank: rank 0 alone holds statistics and a trace,
     * but every rank must take part in the gathers */
    if (!fw->ep->dp_record) return MOE_OK;
    char what[48];
    snprintf(what, sizeof what, "layer %d: routing", l);
    MOE_TRY(gather_routing(fw, fw->h_ids, fw->ids, K, what));
    MOE_TRY(gather_routing(fw, fw->h_w, fw->rw, K, what));
    MOE_TRY(gather_routing(fw, fw->h_logits, fw->rlogits, E, what));
    if (fw->stats) moe_stats_record_layer(fw->stats, l, all, fw->h_ids, fw->h_w, fw->h_logits);
    if (trace && trace->ids) {
        memcpy(trace->ids + (size_t)l * all * K, fw->h_ids, (size_t)all * K * sizeof(int32_t));
        if (trace->weights) memcpy(trace->weights + (size_t)l * all * K, fw->h_w, (size_t)all * K * sizeof(float));
    }
    return MOE_OK;
}

enum moe_status moe_forward_dp_experts(struct moe_forward *fw, int l, int T, const float *in, const float *wts)
{
    struct moe_forward_dp *d = &fw->dp;
    struct moe_ep *ep = fw->ep;
    struct moe_backend *be = fw->be;
    const struct moe_config *c = &fw->m->cfg;
    const int D = c->d_model, K = c->top_k, R = ep->size, me = ep->rank;
    const struct moe_ep_layer *pl = &ep->layers[l];
    const int32_t *bounds = pl->bounds;
    MOE_TRY(local_state(fw));
    MOE_TRY(moe_forward_ep_views(fw));
    /* 1. this rank's pairs over the slots */
    struct moe_dispatch plan = fw->plan;
    plan.counts = fw->ep_counts;
    plan.offsets = fw->ep_offsets;
    if (T > 0) {
        moe_ep_slot_ids(ep, l, fw->ids, T, K, d->sub.positions, fw->ep_slot_ids);
        MOE_TRY(be->ops->dispatch(be, &plan, fw->ep_slot_ids, T, K, pl->n_slots));
    } else {
        memset(plan.offsets, 0, ((size_t)pl->n_slots + 1) * sizeof *plan.offsets);
    }
    const int32_t *off = plan.offsets;
    /* 2. each rank's distinct rows once (a row routed to two slots of a
     * rank travels once), with each pair's slot and its row's index among
     * them: pairs in slot order, so each rank's are one run */
    const size_t row = (size_t)D;
    int32_t *seen = d->seen, *at = seen + (T > 0 ? T : 1), *mine = d->sc, *umine = mine + R;
    for (int t = 0; t < T; t++) seen[t] = -1;
    int u = 0;
    for (int q = 0; q < R; q++) {
        const int u0 = u;
        for (int j = off[bounds[q]]; j < off[bounds[q + 1]]; j++) {
            const int32_t pair = plan.perm[j], t = pair / K;
            if (seen[t] != q) {
                seen[t] = q;
                at[t] = u - u0;
                memcpy(d->send + (size_t)u++ * row, in + (size_t)t * row, row * sizeof(float));
            }
            d->pair_send[2 * j] = fw->ep_slot_ids[pair];
            d->pair_send[2 * j + 1] = at[t];
        }
        mine[q] = off[bounds[q + 1]] - off[bounds[q]];
        umine[q] = u - u0;
    }
    /* 3. the counts: row p of mat is what rank p sends each rank, pairs then rows */
    char what[48];
    snprintf(what, sizeof what, "layer %d: expert pairs", l);
    const double t0 = moe_seconds();
    MOE_TRY(moe_comm_allgather(ep->comm, mine, d->mat, 2 * (size_t)R * sizeof(int32_t), what));
    int32_t got = 0, all = 0, most = 0, ugot = 0, usent = 0;
    for (int q = 0; q < R; q++) {
        int32_t to_q = 0;
        for (int p = 0; p < R; p++) to_q += d->mat[(size_t)p * 2 * R + q];
        d->rc[q] = d->mat[(size_t)q * 2 * R + me];
        d->rd[q] = got;
        got += d->rc[q];
        d->sc[q] = d->mat[(size_t)me * 2 * R + q];
        d->sd[q] = off[bounds[q]];
        d->urc[q] = d->mat[(size_t)q * 2 * R + R + me];
        d->urd[q] = ugot;
        ugot += d->urc[q];
        d->usc[q] = d->mat[(size_t)me * 2 * R + R + q];
        d->usd[q] = usent;
        usent += d->usc[q];
        all += to_q;
        most = to_q > most ? to_q : most;
        ep->rows_rank[q] += (uint64_t)to_q;
    }
    ep->n.rows_own += (uint64_t)got;
    ep->n.rows_all += (uint64_t)all;
    ep->n.rows_max += (uint64_t)most;
    if (all > 0) {
        ep->n.ratio_sum += (double)most * R / all;
        ep->n.cells++;
    }
    /* 4. the rows and the pairs to the slots' ranks; each pair's row laid out again */
    MOE_TRY(moe_comm_alltoallv_rows(ep->comm, d->send, d->usc, d->usd, d->recv, d->urc, d->urd, D, what));
    MOE_TRY(moe_comm_alltoallv_rows(ep->comm, (const float *)d->pair_send, d->sc, d->sd, (float *)d->pair_recv,
                                    d->rc, d->rd, 2, what));
    for (int p = 0; p < R; p++)
        for (int i = d->rd[p]; i < d->rd[p] + d->rc[p]; i++) {
            const int32_t k = d->pair_recv[2 * i + 1];
            if (k < 0 || k >= d->urc[p])
                return moe_fail(MOE_ERR_FORMAT, "data-parallel attention: layer %d: rank %d sent pair %d of "
                                "row %d of %d", l, p, i - d->rd[p], k, d->urc[p]);
            d->slot_recv[i] = d->pair_recv[2 * i];
            memcpy(d->send + (size_t)i * row, d->recv + (size_t)(d->urd[p] + k) * row, row * sizeof(float));
        }
    /* 5. this rank's slots over those rows, one pair a row; the outputs back
     * in the order they came */
    if (got > 0) {
        struct moe_dispatch mp = d->rplan;
        MOE_TRY(be->ops->dispatch(be, &mp, d->slot_recv, got, 1, pl->n_slots));
        mp.lo = bounds[me];
        mp.hi = bounds[me + 1];
        mp.experts = c->n_experts;
        MOE_TRY(be->ops->experts(be, fw->out, d->send, &mp, NULL, &fw->ep_views[l], &fw->ews, got, 1, D,
                                 c->d_expert, pl->n_slots));
        for (int i = 0; i < got; i++)
            memcpy(d->recv + (size_t)i * row, fw->ews.ye + (size_t)mp.pos[i] * row, row * sizeof(float));
    }
    MOE_TRY(moe_comm_alltoallv_rows(ep->comm, d->recv, d->rc, d->rd, d->send, d->sc, d->sd, D, what));
    ep->n.gather_s += moe_seconds() - t0;
    ep->n.gather_bytes += ((uint64_t)(ugot - d->urc[me] + T * K - d->sc[me]) * row +
                           2 * (uint64_t)(got - d->rc[me])) * sizeof(float);
    if (T == 0) return MOE_OK;
    /* 6. every pair's output where this rank's dispatch put it: combined */
    struct moe_expert_ws ws = fw->ews;
    ws.ye = d->send;
    return be->ops->combine(be, fw->out, &ws, &plan, wts, T, K, D);
}
