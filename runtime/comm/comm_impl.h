/* comm_impl.h - the communicator's state, shared by comm.c (launch, world
 * size 1) and comm_mpi.c (the MPI transport, built when MPI is found). */
#pragma once

#include "runtime/comm/comm.h"

#ifdef MOERUN_HAVE_MPI
#include <mpi.h>
#endif

struct moe_comm {
    int rank, size;
    double timeout_s;
    bool mpi;                 /* the MPI transport is open (size > 1) */
    bool finalize;            /* this communicator initialised MPI */
#ifdef MOERUN_HAVE_MPI
    MPI_Comm group;           /* the world, or a part of it (moe_comm_split) */
    MPI_Comm world;           /* MPI_COMM_WORLD, or the one a rendezvous joined (comm_rdzv_mpi.c) */
#endif
    bool rdzv;                /* the rendezvous made this world; the fields below are its */
    int rdzv_fd;              /* ranks > 0: the connection to rank 0 */
    int *rdzv_fds;            /* rank 0: the connection to each rank (size; [0] unused) */
    int rdzv_server;          /* rank 0: the pid of the ompi-server it started, or 0 */
    int world_rank;           /* this process's rank in the whole job (messages) */
    struct moe_comm_counters n;
};

#ifdef MOERUN_HAVE_MPI
enum moe_status moe_comm_mpi_init(struct moe_comm *c, const struct moe_comm_launch *l);
enum moe_status moe_comm_mpi_open(struct moe_comm *c, const struct moe_comm_launch *l);
/* A torchrun-style launch's world (comm_rdzv_mpi.c): opened over the TCP
 * rendezvous; whether rank 0 is gone (a follower's connection to it
 * closed); the connections closed and rank 0's ompi-server stopped. */
enum moe_status moe_comm_rdzv_open(struct moe_comm *c, const struct moe_comm_launch *l);
bool moe_comm_rdzv_orphaned(struct moe_comm *c);
void moe_comm_rdzv_close(struct moe_comm *c);
void moe_comm_mpi_close(struct moe_comm *c);
enum moe_status moe_comm_mpi_bcast(struct moe_comm *c, void *buf, size_t bytes, int root,
                                   const char *what, bool idle);
enum moe_status moe_comm_mpi_allgather(struct moe_comm *c, const void *mine, void *all, size_t bytes,
                                       const char *what, bool idle);
MOE_MUST_USE enum moe_status moe_comm_mpi_gatherv(struct moe_comm *c, const float *mine, int n, float *all,
                                                  const int32_t *counts, int root, const char *what);
enum moe_status moe_comm_mpi_allgatherv(struct moe_comm *c, float *buf, const int32_t *counts,
                                        const int32_t *displs, int row_floats, const char *what);
enum moe_status moe_comm_mpi_alltoall(struct moe_comm *c, const void *send, void *recv, size_t bytes,
                                      const char *what);
enum moe_status moe_comm_mpi_alltoallv(struct moe_comm *c, const float *send, const int32_t *scounts,
                                       const int32_t *sdispls, float *recv, const int32_t *rcounts,
                                       const int32_t *rdispls, int row_floats, const char *what);
enum moe_status moe_comm_mpi_allreduce(struct moe_comm *c, float *buf, size_t n, const char *what);
enum moe_status moe_comm_mpi_barrier(struct moe_comm *c, const char *what);
enum moe_status moe_comm_mpi_split(const struct moe_comm *c, int color, struct moe_comm *out);
#endif
