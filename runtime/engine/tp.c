/* tp.c - tensor parallelism's collectives: the parts of a split layer's
 * output added over the rank's group, and whole rows for a norm over
 * every head (see ep.h, moe_model_tp_split).
 *
 * The parts are all-gathered and added here in rank order rather than by
 * MPI_Allreduce: every rank of a group then holds the same bits (MPI does
 * not promise that of a reduction), which the routing, replicated on every
 * rank, needs.  Against one process the sum differs in the last bits (one
 * process sums a row's products in one order over all its columns, the
 * group sums each rank's share first). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/engine/ep_impl.h"

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

/* The group's n floats at mine into ep->tp_buf (tp * n), timed. */
static enum moe_status gather(struct moe_ep *ep, const float *mine, size_t n, const char *what, int layer)
{
    size_t all, bytes;
    if (!moe_mul_size(n, (size_t)ep->tp, &all) || !moe_mul_size(n, sizeof(float), &bytes))
        return moe_fail(MOE_ERR_NOMEM, "tensor parallelism: %zu floats per rank", n);
    MOE_TRY(scratch(ep, all));
    /* made here, in the first step, where every rank is (a follower opens
     * its model only when rank 0's first runner is announced, after rank 0
     * opened its own) */
    if (!ep->tp_comm) MOE_TRY(moe_comm_split(ep->comm, ep->rank / ep->tp, &ep->tp_comm));
    char msg[64];
    snprintf(msg, sizeof msg, "layer %d: %s", layer, what);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    MOE_TRY(moe_comm_allgather(ep->tp_comm, mine, ep->tp_buf, bytes, msg));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ep->tp_s += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ep->tp_bytes += (uint64_t)bytes * (uint64_t)(ep->tp - 1);
    return MOE_OK;
}

enum moe_status moe_ep_tp_sum(struct moe_ep *ep, float *buf, size_t n, const char *what, int layer)
{
    MOE_TRY(gather(ep, buf, n, what, layer));
    memcpy(buf, ep->tp_buf, n * sizeof *buf);
    for (int r = 1; r < ep->tp; r++) {
        const float *p = ep->tp_buf + (size_t)r * n;
        for (size_t i = 0; i < n; i++) buf[i] += p[i];
    }
    return MOE_OK;
}

enum moe_status moe_ep_tp_rows(struct moe_ep *ep, const float *x, int T, int w, int parts, float **full,
                               const char *what, int layer)
{
    const size_t n = (size_t)T * (size_t)w, tp = (size_t)ep->tp, P = (size_t)parts, step = tp / P;
    MOE_TRY(gather(ep, x, n, what, layer));
    size_t need;
    if (!moe_mul_size(n, tp + P, &need)) return moe_fail(MOE_ERR_NOMEM, "tensor parallelism: rows");
    MOE_TRY(scratch(ep, need));
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
