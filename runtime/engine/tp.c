/* tp.c - tensor parallelism's collectives: the parts of a split layer's
 * output added over the rank's group, and whole rows for a norm over
 * every head (see ep.h, moe_model_tp_split).
 *
 * The sum is a reduce-scatter and an all-gather written with MPI's
 * all-to-all and all-gather rather than MPI_Allreduce: rank j receives
 * every rank's j-th slice and adds them in rank order, then the ranks
 * all-gather the summed slices.  Every value is added once, in rank order,
 * so every rank of a group holds the same bits (MPI does not promise that
 * of a reduction), which the routing, replicated on every rank, needs; a
 * rank sends and receives 2 (M - 1) / M of the values, as a ring
 * all-reduce does.  Against one process the sum differs in the last bits
 * (one process sums a row's products in one order over all its columns,
 * the group sums each rank's share first). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/engine/ep_impl.h"
#include "runtime/core/clock.h"

enum moe_status moe_ep_set_tp(struct moe_ep *ep, int shards, int tp)
{
    const int size = ep->size;
    if (tp < 1 || size % tp)
        return moe_fail(MOE_ERR_INVALID_ARG, "--tp %d does not divide the launch's %d ranks", tp, size);
    if (shards == 0) shards = size;
    const int groups = shards == size ? 0 : shards;
    if (shards != size && (long)shards * tp != size)
        return moe_fail(MOE_ERR_INVALID_ARG, "--ep %d --tp %d with %d ranks: the experts spread over every rank "
                        "(--ep %d) or over the %d groups of %d ranks (--ep %d)", shards, tp, size, size,
                        size / tp, tp, size / tp);
    if (ep->tp > 1 || ep->layers) {
        if (ep->tp == tp && ep->groups == groups) return MOE_OK;
        return moe_fail(MOE_ERR_UNSUPPORTED, "tensor parallelism: one layout per job (--tp %d --ep %d, then "
                        "--tp %d --ep %d)", ep->tp, ep->groups ? ep->groups : size, tp, shards);
    }
    ep->groups = groups;
    ep->tp = tp;
    ep->tp_rank = ep->rank % tp;
    return MOE_OK; /* the groups' communicators at their first use (gather) */
}

/* The scratch holds n floats. */
static enum moe_status scratch(struct moe_ep *ep, size_t n)
{
    if (n <= ep->tp_cap) return MOE_OK;
    float *p = realloc(ep->tp_buf, n * sizeof *p);
    if (!p) return moe_fail(MOE_ERR_NOMEM, "tensor parallelism: %zu floats of scratch", n);
    ep->tp_buf = p;
    ep->tp_cap = n;
    return MOE_OK;
}

/* The group's communicator, made at its first use, in the first step,
 * where every rank is (a follower opens its model only when rank 0's first
 * runner is announced, after rank 0 opened its own); the scratch for
 * `floats`; the collective's name in msg. */
static enum moe_status prepare(struct moe_ep *ep, size_t floats, char *msg, size_t cap, const char *what, int layer)
{
    MOE_TRY(scratch(ep, floats));
    MOE_TRY(moe_ep_tp_comm(ep, NULL));
    snprintf(msg, cap, "layer %d: %s", layer, what);
    return MOE_OK;
}

enum moe_status moe_ep_tp_comm(struct moe_ep *ep, struct moe_comm **out)
{
    if (!ep->tp_comm) MOE_TRY(moe_comm_split(ep->comm, ep->rank / ep->tp, &ep->tp_comm));
    if (out) *out = ep->tp_comm;
    return MOE_OK;
}

/* The group's n floats at mine into ep->tp_buf (tp * n), timed. */
static enum moe_status gather(struct moe_ep *ep, const float *mine, size_t n, const char *what, int layer)
{
    size_t all, bytes;
    char msg[64];
    if (!moe_mul_size(n, (size_t)ep->tp, &all) || !moe_mul_size(n, sizeof(float), &bytes))
        return moe_fail(MOE_ERR_NOMEM, "tensor parallelism: %zu floats per rank", n);
    MOE_TRY(prepare(ep, all, msg, sizeof msg, what, layer));
    const double t0 = moe_seconds();
    MOE_TRY(moe_comm_allgather(ep->tp_comm, mine, ep->tp_buf, bytes, msg));
    ep->tp_s += moe_seconds() - t0;
    ep->tp_bytes += (uint64_t)bytes * (uint64_t)(ep->tp - 1);
    return MOE_OK;
}

enum moe_status moe_ep_tp_sum(struct moe_ep *ep, float *buf, size_t n, const char *what, int layer)
{
    const size_t M = (size_t)ep->tp, chunk = (n + M - 1) / M; /* rank j sums slice j */
    size_t all, bytes;
    char msg[64];
    if (!moe_mul_size(chunk, M, &all) || !moe_mul_size(all, 3, &all) || !moe_mul_size(chunk, sizeof(float), &bytes))
        return moe_fail(MOE_ERR_NOMEM, "tensor parallelism: %zu floats per rank", n);
    MOE_TRY(prepare(ep, all, msg, sizeof msg, what, layer));
    /* n a multiple of M: sent from buf and gathered back into it; else
     * padded with zeros in the scratch */
    const bool whole = chunk * M == n;
    float *parts = ep->tp_buf, *got = parts + chunk * M, *sums = whole ? buf : got + chunk * M;
    if (!whole) {
        memcpy(parts, buf, n * sizeof *buf);
        memset(parts + n, 0, (chunk * M - n) * sizeof *buf);
    }
    const double t0 = moe_seconds();
    MOE_TRY(moe_comm_alltoall(ep->tp_comm, whole ? buf : parts, got, bytes, msg));
    float *mine = parts; /* slice tp_rank of the sum, in rank order */
    for (size_t i = 0; i < chunk; i++) mine[i] = got[i];
    for (size_t r = 1; r < M; r++)
        for (size_t i = 0; i < chunk; i++) mine[i] += got[r * chunk + i];
    MOE_TRY(moe_comm_allgather(ep->tp_comm, mine, sums, bytes, msg));
    ep->tp_s += moe_seconds() - t0;
    ep->tp_bytes += 2 * (uint64_t)bytes * (uint64_t)(M - 1);
    if (!whole) memcpy(buf, sums, n * sizeof *buf);
    return MOE_OK;
}

enum moe_status moe_ep_tp_rows(struct moe_ep *ep, const float *x, int T, int w, int parts, float **full,
                               const char *what, int layer)
{
    const size_t n = (size_t)T * (size_t)w, tp = (size_t)ep->tp, P = (size_t)parts, step = tp / P;
    size_t need;
    if (!moe_mul_size(n, tp + P, &need)) return moe_fail(MOE_ERR_NOMEM, "tensor parallelism: rows");
    MOE_TRY(scratch(ep, need)); /* the gathered rows, then the parts in order */
    MOE_TRY(gather(ep, x, n, what, layer));
    float *out = ep->tp_buf + n * tp;
    for (size_t p = 0; p < P; p++) /* part p from the first rank holding it */
        for (size_t t = 0; t < (size_t)T; t++)
            memcpy(out + (t * P + p) * (size_t)w, ep->tp_buf + p * step * n + t * (size_t)w,
                   (size_t)w * sizeof *out);
    *full = out;
    return MOE_OK;
}

void moe_ep_tp_take(const struct moe_ep *ep, float *x, const float *full, int T, int w, int parts)
{
    const size_t P = (size_t)parts, p = (size_t)ep->tp_rank / ((size_t)ep->tp / P);
    for (size_t t = 0; t < (size_t)T; t++)
        memcpy(x + t * (size_t)w, full + (t * P + p) * (size_t)w, (size_t)w * sizeof *x);
}
