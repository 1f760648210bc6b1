/* comm.h - the parallel transport behind one interface: which rank this
 * process is, and the few collectives expert parallelism needs.
 *
 * A launch is described by the environment its launcher sets (read by the
 * CLI only, moe_comm_launch_from_env): mpirun (OMPI_COMM_WORLD_*), a PMI
 * launcher (PMI_RANK / PMI_SIZE), Slurm (SLURM_PROCID / SLURM_NTASKS), or a
 * torchrun-style RANK / WORLD_SIZE / LOCAL_RANK.  World size 1 needs no
 * transport: every collective is then a no-op or a copy.  Larger worlds run
 * on MPI (Open MPI; the build has it when CMake finds it: MOERUN_HAVE_MPI).
 * A torchrun-style launch has no MPI runtime behind its processes: they
 * meet rank 0 over TCP at MASTER_ADDR and join one MPI world through
 * Open MPI's ompi-server, which rank 0 starts (comm_rdzv_mpi.c).  The CUDA backend's own collectives (NCCL, backend.h
 * coll_*) carry expert rows and sums on device memory; their groups are
 * bootstrapped over this transport (runtime/engine/forward_ep.c).
 *
 * Every collective carries a `what` string naming what the rank was doing
 * ("layer 3: expert rows") and runs under the communicator's timeout: it is
 * posted non-blocking and polled.  A collective that does not complete in
 * time (a rank died, hangs or runs another step) prints one line naming this
 * rank, the collective and `what`, then ends the whole job with MPI_Abort:
 * MPI leaves a communicator unusable after a failed collective, so there is
 * nothing to recover, and the other ranks must not wait forever.  The one
 * call without a timeout is moe_comm_bcast_idle, a worker's wait for rank 0's
 * next step (a server may be idle for hours); a dead rank 0 ends those
 * through the launcher (mpirun stops the job when a rank exits abnormally).
 *
 * Collectives must be entered by every rank in the same order with the same
 * sizes (rank 0 decides what runs; the others follow its broadcasts).
 * A communicator is used by one thread at a time (MPI_THREAD_SERIALIZED). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where this process sits in the launch. */
struct moe_comm_launch {
    int rank, size, local_rank;
    const char *source; /* static: "mpirun", "pmi", "slurm", "torchrun", or "single" */
    /* torchrun only: where rank 0 waits for the others (MASTER_ADDR) and on
     * which port: MOERUN_RDZV_PORT if set, else MASTER_PORT, else (when
     * TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves its own
     * store on MASTER_PORT) MASTER_PORT + 1; 0 when unset.  pmix_uri: the
     * URI of an ompi-server the user runs (OMPI_MCA_pmix_server_uri), so
     * rank 0 starts none; "" when unset. */
    char master_addr[256];
    int rdzv_port;
    char pmix_uri[1024];
};

/* The launch this process belongs to, read from the environment (see
 * above); a process started by hand is rank 0 of 1.  Fails on values that
 * are not numbers or are out of range (rank >= size), naming the variable. */
MOE_MUST_USE enum moe_status moe_comm_launch_from_env(struct moe_comm_launch *l);

struct moe_comm; /* opaque */

/* Opens the transport for launch l (new *out, free with moe_comm_free).
 * World size 1: no transport.  Larger: MPI, initialised here
 * (MPI_THREAD_SERIALIZED), its world checked against l.  timeout_s (> 0)
 * bounds every collective but moe_comm_bcast_idle. */
MOE_MUST_USE enum moe_status moe_comm_init(struct moe_comm **out, const struct moe_comm_launch *l,
                                           double timeout_s);
/* Finalises MPI when this communicator initialised it.  Safe on NULL. */
void moe_comm_free(struct moe_comm *c);

/* The ranks of c with the same color as a communicator of their own (new
 * *out, free with moe_comm_free), ranks in c's order; its collectives
 * carry c's timeout and end the whole job on expiry as c's do.  Every rank
 * of c must call it (MPI_Comm_split: blocking, no timeout; a start-up
 * call). */
MOE_MUST_USE enum moe_status moe_comm_split(const struct moe_comm *c, int color, struct moe_comm **out);
/* Sets the timeout of the collectives from now on (> 0). */
void moe_comm_set_timeout(struct moe_comm *c, double timeout_s);
double moe_comm_timeout(const struct moe_comm *c);
/* Ends the whole job at once (MPI_Abort), as a collective past its
 * timeout does: for a transport beside this one (a backend's) that failed
 * mid-step, which leaves the ranks out of step.  World size 1: returns. */
void moe_comm_abort(const struct moe_comm *c);
int moe_comm_rank(const struct moe_comm *c);
int moe_comm_size(const struct moe_comm *c);
/* Whether this build can run worlds larger than 1. */
bool moe_comm_have_mpi(void);

/* Broadcasts bytes of buf from root to every rank. */
MOE_MUST_USE enum moe_status moe_comm_bcast(struct moe_comm *c, void *buf, size_t bytes, int root,
                                            const char *what);
/* The same without the timeout: a worker waiting for rank 0's next step
 * polls gently (sleeping between tests) so an idle job costs no core. */
MOE_MUST_USE enum moe_status moe_comm_bcast_idle(struct moe_comm *c, void *buf, size_t bytes,
                                                 int root, const char *what);
/* Every rank's `bytes` bytes at mine gathered, rank by rank, into all
 * (size * bytes). */
MOE_MUST_USE enum moe_status moe_comm_allgather(struct moe_comm *c, const void *mine, void *all,
                                                size_t bytes, const char *what);
/* The same without the timeout (every rank's status after loading, which
 * may take minutes). */
MOE_MUST_USE enum moe_status moe_comm_allgather_idle(struct moe_comm *c, const void *mine, void *all,
                                                     size_t bytes, const char *what);
/* Every rank sends block j of send (`bytes` bytes each, size blocks) to
 * rank j and receives rank i's block for it into block i of recv. */
MOE_MUST_USE enum moe_status moe_comm_alltoall(struct moe_comm *c, const void *send, void *recv, size_t bytes,
                                               const char *what);
/* In place over buf: rank r's part is the rows [displs[r], displs[r] +
 * counts[r]) of `row_floats` floats each, already in buf on rank r; after
 * the call every rank holds every part.  counts and displs (size) in rows. */
MOE_MUST_USE enum moe_status moe_comm_allgatherv_rows(struct moe_comm *c, float *buf,
                                                      const int32_t *counts, const int32_t *displs,
                                                      int row_floats, const char *what);
/* Rank r sends its rows [sdispls[j], sdispls[j] + scounts[j]) of send
 * to rank j, and receives rank j's rows for it into recv at rdispls[j]
 * (rcounts[j] of them); rows of row_floats floats, counts and displs
 * (size) in rows.  send and recv must not overlap. */
MOE_MUST_USE enum moe_status moe_comm_alltoallv_rows(struct moe_comm *c, const float *send, const int32_t *scounts,
                                                     const int32_t *sdispls, float *recv, const int32_t *rcounts,
                                                     const int32_t *rdispls, int row_floats, const char *what);
/* Every rank's n floats at mine gathered on root, rank by rank, into all
 * (root: the sum of counts (size), counts[r] rank r's n; other ranks: all
 * and counts unread). */
MOE_MUST_USE enum moe_status moe_comm_gatherv(struct moe_comm *c, const float *mine, int n, float *all,
                                              const int32_t *counts, int root, const char *what);
/* buf (n) = the sum over ranks of every rank's buf (MPI_Allreduce: the
 * summation order is MPI's, so it may differ from one process's in the last
 * bits). */
MOE_MUST_USE enum moe_status moe_comm_allreduce_sum(struct moe_comm *c, float *buf, size_t n,
                                                    const char *what);
MOE_MUST_USE enum moe_status moe_comm_barrier(struct moe_comm *c, const char *what);

/* Seconds spent inside collectives and bytes this rank sent through them
 * since the communicator opened (for step statistics). */
struct moe_comm_counters {
    double seconds;
    uint64_t bytes_sent, calls;
};
void moe_comm_counters(const struct moe_comm *c, struct moe_comm_counters *out);

#ifdef __cplusplus
}
#endif
