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
    MPI_Comm group;           /* MPI_COMM_WORLD, or a part of it (moe_comm_split) */
#endif
    int world_rank;           /* this process's rank in the whole job (messages) */
    struct moe_comm_counters n;
};

#ifdef MOERUN_HAVE_MPI
enum moe_status moe_comm_mpi_open(struct moe_comm *c, const struct moe_comm_launch *l);
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
enum moe_status moe_comm_mpi_allreduce(struct moe_comm *c, float *buf, size_t n, const char *what);
enum moe_status moe_comm_mpi_barrier(struct moe_comm *c, const char *what);
enum moe_status moe_comm_mpi_split(const struct moe_comm *c, int color, struct moe_comm *out);
#endif
