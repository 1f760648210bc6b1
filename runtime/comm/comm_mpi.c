/* comm_mpi.c - the MPI transport (Open MPI; see comm.h).  Every collective
 * is posted non-blocking and polled against the communicator's timeout:
 * a short burst of tests yielding the core, then tests with short sleeps,
 * so ranks oversubscribing a machine's cores do not starve each other. */
#include "runtime/comm/comm_impl.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum moe_status moe_comm_mpi_init(struct moe_comm *c, const struct moe_comm_launch *l)
{
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (inited) return MOE_OK;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_IO, "launch: MPI_Init_thread failed (%s rank %d of %d)", l->source, l->rank,
                        l->size);
    c->finalize = true;
    c->mpi = true;
    c->world = c->group = MPI_COMM_SELF;
    if (provided < MPI_THREAD_SERIALIZED)
        return moe_fail(MOE_ERR_UNSUPPORTED, "launch: this MPI library gives thread level %d, moerun needs "
                        "MPI_THREAD_SERIALIZED (the server's engine thread talks to the other ranks)", provided);
    prctl(PR_SET_TIMERSLACK, 1000UL); /* 1 us: short polling sleeps (wait_for) */
    return MOE_OK;
}

enum moe_status moe_comm_mpi_open(struct moe_comm *c, const struct moe_comm_launch *l)
{
    if (!strcmp(l->source, "torchrun")) return moe_comm_rdzv_open(c, l);
    MOE_TRY(moe_comm_mpi_init(c, l));
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != l->rank || size != l->size)
        return moe_fail(MOE_ERR_INVALID_ARG, "launch: the environment says rank %d of %d (%s) but MPI says rank "
                        "%d of %d", l->rank, l->size, l->source, rank, size);
    c->world = c->group = MPI_COMM_WORLD;
    return MOE_OK;
}

void moe_comm_mpi_close(struct moe_comm *c)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (c->mpi && c->group != c->world) { /* a part (moe_comm_split): the world stays */
        if (!fin) MPI_Comm_free(&c->group);
        c->mpi = false;
        return;
    }
    if (c->mpi && !fin && c->world != MPI_COMM_WORLD && c->world != MPI_COMM_SELF) MPI_Comm_free(&c->world);
    if (c->finalize && !fin) MPI_Finalize();
    if (c->rdzv) moe_comm_rdzv_close(c);
    c->mpi = false;
}

/* Waits for rq: tests yielding the core for the first SPIN_S seconds (a
 * collective whose ranks are all there completes in microseconds), then
 * with short sleeps (a rank still computing, an idle follower, or ranks
 * oversubscribing the cores, where spinning would take the core from the
 * rank being waited for); past the timeout (unless idle) the job ends
 * (comm.h).  The MPI transport sets the thread's timer slack to 1 us so
 * those sleeps are short.  An idle follower of a torchrun-style launch also
 * watches rank 0's rendezvous connection (comm_rdzv_mpi.c). */
#define SPIN_S 0.0002
/* A follower seeing rank 0's rendezvous connection close still takes a
 * message already on its way (rank 0 ending normally) for this long. */
#define ORPHAN_GRACE_S 2.0
static enum moe_status wait_for(struct moe_comm *c, MPI_Request *rq, const char *op, const char *what,
                                bool idle)
{
    const double t0 = MPI_Wtime();
    double orphaned = 0; /* when rank 0's rendezvous connection was seen closed */
    for (;;) {
        int done = 0;
        if (MPI_Test(rq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return moe_fail(MOE_ERR_IO, "rank %d: %s (%s) failed", c->world_rank, op, what);
        if (done) break;
        const double waited = MPI_Wtime() - t0;
        if (!idle && waited > c->timeout_s) {
            fprintf(stderr, "moerun: rank %d: %s (%s): no answer from the other ranks within %g s (a rank died, "
                    "hangs or is running something else); ending the job\n", c->world_rank, op, what, c->timeout_s);
            fflush(stderr);
            MPI_Abort(c->world, 3);
        }
        if (idle && c->rdzv && !orphaned && moe_comm_rdzv_orphaned(c)) orphaned = MPI_Wtime();
        if (orphaned && MPI_Wtime() - orphaned > ORPHAN_GRACE_S) {
            fprintf(stderr, "moerun: rank %d: rank 0 is gone (its rendezvous connection closed) while this rank "
                    "waited for its next step (%s); ending\n", c->world_rank, what);
            fflush(stderr);
            _exit(3); /* MPI_Abort would wait on the dead rank */
        }
        if (waited < SPIN_S) {
            sched_yield();
        } else {
            struct timespec ts = {0, idle ? 200000 : 20000};
            nanosleep(&ts, NULL);
        }
    }
    if (!idle) c->n.seconds += MPI_Wtime() - t0;
    c->n.calls++;
    return MOE_OK;
}

static enum moe_status check_int(size_t n, const char *op, const char *what)
{
    if (n > INT_MAX)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s (%s): %zu elements is more than one MPI call carries", op,
                        what, n);
    return MOE_OK;
}

enum moe_status moe_comm_mpi_bcast(struct moe_comm *c, void *buf, size_t bytes, int root, const char *what,
                                   bool idle)
{
    MOE_TRY(check_int(bytes, "broadcast", what));
    MPI_Request rq;
    if (MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, c->group, &rq) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_IO, "rank %d: broadcast (%s) failed to start", c->world_rank, what);
    if (c->rank == root) c->n.bytes_sent += bytes;
    return wait_for(c, &rq, "broadcast", what, idle);
}

enum moe_status moe_comm_mpi_allgather(struct moe_comm *c, const void *mine, void *all, size_t bytes,
                                       const char *what, bool idle)
{
    MOE_TRY(check_int(bytes, "all-gather", what));
    MPI_Request rq;
    if (MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, c->group, &rq) !=
        MPI_SUCCESS)
        return moe_fail(MOE_ERR_IO, "rank %d: all-gather (%s) failed to start", c->world_rank, what);
    c->n.bytes_sent += bytes * (size_t)(c->size - 1);
    return wait_for(c, &rq, "all-gather", what, idle);
}

enum moe_status moe_comm_mpi_allgatherv(struct moe_comm *c, float *buf, const int32_t *counts,
                                        const int32_t *displs, int row_floats, const char *what)
{
    int *cnt = calloc(2 * (size_t)c->size, sizeof(int)), *dsp = cnt + c->size;
    if (!cnt) return moe_fail(MOE_ERR_NOMEM, "all-gather (%s): counts", what);
    enum moe_status s = MOE_OK;
    for (int r = 0; r < c->size && s == MOE_OK; r++) {
        size_t n, d;
        if (counts[r] < 0 || displs[r] < 0 || !moe_mul_size((size_t)counts[r], (size_t)row_floats, &n) ||
            !moe_mul_size((size_t)displs[r], (size_t)row_floats, &d))
            s = moe_fail(MOE_ERR_INVALID_ARG, "all-gather (%s): rank %d's part is out of range", what, r);
        else if ((s = check_int(n, "all-gather", what)) == MOE_OK && (s = check_int(d, "all-gather", what)) == MOE_OK)
            cnt[r] = (int)n, dsp[r] = (int)d;
    }
    MPI_Request rq;
    if (s == MOE_OK &&
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, cnt, dsp, MPI_FLOAT, c->group, &rq) != MPI_SUCCESS)
        s = moe_fail(MOE_ERR_IO, "rank %d: all-gather (%s) failed to start", c->world_rank, what);
    if (s == MOE_OK) {
        c->n.bytes_sent += (size_t)cnt[c->rank] * sizeof(float) * (size_t)(c->size - 1);
        s = wait_for(c, &rq, "all-gather", what, false);
    }
    free(cnt);
    return s;
}

enum moe_status moe_comm_mpi_gatherv(struct moe_comm *c, const float *mine, int n, float *all,
                                     const int32_t *counts, int root, const char *what)
{
    int *cnt = NULL, *dsp = NULL;
    if (c->rank == root) {
        if (!(cnt = calloc(2 * (size_t)c->size, sizeof(int)))) return moe_fail(MOE_ERR_NOMEM, "gather (%s): counts", what);
        dsp = cnt + c->size;
        size_t at = 0;
        for (int r = 0; r < c->size; r++) {
            if (counts[r] < 0 || at > INT_MAX) {
                free(cnt);
                return moe_fail(MOE_ERR_INVALID_ARG, "gather (%s): rank %d's part is out of range", what, r);
            }
            cnt[r] = counts[r], dsp[r] = (int)at;
            at += (size_t)counts[r];
        }
    }
    MPI_Request rq;
    enum moe_status s = MOE_OK;
    if (MPI_Igatherv(mine, n, MPI_FLOAT, all, cnt, dsp, MPI_FLOAT, root, c->group, &rq) != MPI_SUCCESS)
        s = moe_fail(MOE_ERR_IO, "rank %d: gather (%s) failed to start", c->world_rank, what);
    if (s == MOE_OK) {
        if (c->rank != root) c->n.bytes_sent += (size_t)n * sizeof(float);
        s = wait_for(c, &rq, "gather", what, false);
    }
    free(cnt);
    return s;
}

enum moe_status moe_comm_mpi_alltoall(struct moe_comm *c, const void *send, void *recv, size_t bytes,
                                      const char *what)
{
    MOE_TRY(check_int(bytes, "all-to-all", what));
    MPI_Request rq;
    if (MPI_Ialltoall(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->group, &rq) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_IO, "rank %d: all-to-all (%s) failed to start", c->world_rank, what);
    c->n.bytes_sent += bytes * (size_t)(c->size - 1);
    return wait_for(c, &rq, "all-to-all", what, false);
}

/* counts and displs in rows -> in floats, each within an int */
static enum moe_status floats_of(const struct moe_comm *c, const int32_t *counts, const int32_t *displs,
                                 int row_floats, int *cnt, int *dsp, const char *what)
{
    for (int r = 0; r < c->size; r++) {
        size_t n, d;
        if (counts[r] < 0 || displs[r] < 0 || !moe_mul_size((size_t)counts[r], (size_t)row_floats, &n) ||
            !moe_mul_size((size_t)displs[r], (size_t)row_floats, &d))
            return moe_fail(MOE_ERR_INVALID_ARG, "all-to-all (%s): rank %d's part is out of range", what, r);
        MOE_TRY(check_int(n, "all-to-all", what));
        MOE_TRY(check_int(d, "all-to-all", what));
        cnt[r] = (int)n, dsp[r] = (int)d;
    }
    return MOE_OK;
}

enum moe_status moe_comm_mpi_alltoallv(struct moe_comm *c, const float *send, const int32_t *scounts,
                                       const int32_t *sdispls, float *recv, const int32_t *rcounts,
                                       const int32_t *rdispls, int row_floats, const char *what)
{
    int *sc = calloc(4 * (size_t)c->size, sizeof(int)), *sd = sc + c->size, *rc = sd + c->size, *rd = rc + c->size;
    if (!sc) return moe_fail(MOE_ERR_NOMEM, "all-to-all (%s): counts", what);
    enum moe_status s = floats_of(c, scounts, sdispls, row_floats, sc, sd, what);
    if (s == MOE_OK) s = floats_of(c, rcounts, rdispls, row_floats, rc, rd, what);
    MPI_Request rq;
    if (s == MOE_OK && MPI_Ialltoallv(send, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, c->group, &rq) != MPI_SUCCESS)
        s = moe_fail(MOE_ERR_IO, "rank %d: all-to-all (%s) failed to start", c->world_rank, what);
    if (s == MOE_OK) {
        for (int r = 0; r < c->size; r++)
            if (r != c->rank) c->n.bytes_sent += (size_t)sc[r] * sizeof(float);
        s = wait_for(c, &rq, "all-to-all", what, false);
    }
    free(sc);
    return s;
}

enum moe_status moe_comm_mpi_allreduce(struct moe_comm *c, float *buf, size_t n, const char *what)
{
    MOE_TRY(check_int(n, "all-reduce", what));
    MPI_Request rq;
    if (MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->group, &rq) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_IO, "rank %d: all-reduce (%s) failed to start", c->world_rank, what);
    c->n.bytes_sent += n * sizeof(float);
    return wait_for(c, &rq, "all-reduce", what, false);
}

enum moe_status moe_comm_mpi_barrier(struct moe_comm *c, const char *what)
{
    MPI_Request rq;
    if (MPI_Ibarrier(c->group, &rq) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_IO, "rank %d: barrier (%s) failed to start", c->world_rank, what);
    return wait_for(c, &rq, "barrier", what, false);
}

enum moe_status moe_comm_mpi_split(const struct moe_comm *c, int color, struct moe_comm *out)
{
    MPI_Comm g;
    if (MPI_Comm_split(c->group, color, c->rank, &g) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_IO, "rank %d: splitting the ranks into groups failed", c->world_rank);
    int rank = 0, size = 0;
    MPI_Comm_rank(g, &rank);
    MPI_Comm_size(g, &size);
    *out = (struct moe_comm){.rank = rank, .size = size, .timeout_s = c->timeout_s, .mpi = true, .group = g,
                             .world = c->world, .world_rank = c->world_rank};
    return MOE_OK;
}
