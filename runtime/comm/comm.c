/* comm.c - launch detection and the world of one process (see comm.h); the
 * MPI transport is comm_mpi.c. */
#include "runtime/comm/comm_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* *out = the integer in variable `name`; *found false when it is unset. */
static enum moe_status env_int(const char *name, int *out, bool *found)
{
    const char *s = getenv(name);
    *found = s != NULL;
    if (!s) return MOE_OK;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > 1 << 20)
        return moe_fail(MOE_ERR_INVALID_ARG, "launch: %s=\"%s\" is not a rank or a world size", name, s);
    *out = (int)v;
    return MOE_OK;
}

/* A torchrun-style launch's rendezvous point (comm.h, moe_comm_launch). */
static enum moe_status rendezvous_from_env(struct moe_comm_launch *l)
{
    const char *addr = getenv("MASTER_ADDR");
    if (addr && strlen(addr) >= sizeof l->master_addr)
        return moe_fail(MOE_ERR_INVALID_ARG, "launch: MASTER_ADDR is longer than a host name");
    snprintf(l->master_addr, sizeof l->master_addr, "%s", addr ? addr : "");
    int port = 0, own = 0;
    bool has_port, has_own;
    MOE_TRY(env_int("MASTER_PORT", &port, &has_port));
    MOE_TRY(env_int("MOERUN_RDZV_PORT", &own, &has_own));
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (has_port && agent && !strcmp(agent, "True")) port++;
    if (has_own) port = own;
    if ((has_port || has_own) && (port < 1 || port > 65535))
        return moe_fail(MOE_ERR_INVALID_ARG, "launch: rendezvous port %d is not a TCP port", port);
    l->rdzv_port = port;
    const char *uri = getenv("OMPI_MCA_pmix_server_uri");
    if (uri && strlen(uri) >= sizeof l->pmix_uri)
        return moe_fail(MOE_ERR_INVALID_ARG, "launch: OMPI_MCA_pmix_server_uri is longer than %zu bytes",
                        sizeof l->pmix_uri - 1);
    snprintf(l->pmix_uri, sizeof l->pmix_uri, "%s", uri ? uri : "");
    return MOE_OK;
}

/* One launcher's variables: rank, size and (optional) local rank. */
struct source {
    const char *name, *rank, *size, *local;
};

enum moe_status moe_comm_launch_from_env(struct moe_comm_launch *l)
{
    static const struct source sources[] = {
        {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
        {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    };
    *l = (struct moe_comm_launch){.rank = 0, .size = 1, .local_rank = 0, .source = "single"};
    for (size_t i = 0; i < sizeof sources / sizeof *sources; i++) {
        const struct source *s = &sources[i];
        int rank = 0, size = 1, local = 0;
        bool has_rank, has_size, has_local;
        MOE_TRY(env_int(s->rank, &rank, &has_rank));
        MOE_TRY(env_int(s->size, &size, &has_size));
        MOE_TRY(env_int(s->local, &local, &has_local));
        if (!has_rank && !has_size) continue;
        if (has_rank != has_size)
            return moe_fail(MOE_ERR_INVALID_ARG, "launch: %s is set but %s is not", has_rank ? s->rank : s->size,
                            has_rank ? s->size : s->rank);
        if (size < 1 || rank >= size)
            return moe_fail(MOE_ERR_INVALID_ARG, "launch: %s=%d does not fit %s=%d", s->rank, rank, s->size, size);
        *l = (struct moe_comm_launch){.rank = rank, .size = size, .local_rank = has_local ? local : rank, .source = s->name};
        if (!strcmp(s->name, "torchrun")) MOE_TRY(rendezvous_from_env(l));
        return MOE_OK;
    }
    return MOE_OK;
}

bool moe_comm_have_mpi(void)
{
#ifdef MOERUN_HAVE_MPI
    return true;
#else
    return false;
#endif
}

enum moe_status moe_comm_init(struct moe_comm **out, const struct moe_comm_launch *l, double timeout_s)
{
    *out = NULL;
    if (!(timeout_s > 0))
        return moe_fail(MOE_ERR_INVALID_ARG, "communicator: the timeout must be positive (got %g s)", timeout_s);
    struct moe_comm *c = calloc(1, sizeof *c);
    if (!c) return moe_fail(MOE_ERR_NOMEM, "communicator");
    c->rank = c->world_rank = l->rank;
    c->size = l->size;
    c->timeout_s = timeout_s;
    if (l->size > 1) {
#ifdef MOERUN_HAVE_MPI
        enum moe_status s = moe_comm_mpi_open(c, l);
        if (s != MOE_OK) {
            if (c->mpi || c->rdzv) moe_comm_mpi_close(c);
            free(c);
            return s;
        }
#else
        free(c);
        return moe_fail(MOE_ERR_UNSUPPORTED, "launch: %d ranks (%s), but this moerun was built without MPI "
                        "(install libopenmpi-dev and rebuild)", l->size, l->source);
#endif
    }
    *out = c;
    return MOE_OK;
}

void moe_comm_free(struct moe_comm *c)
{
    if (!c) return;
#ifdef MOERUN_HAVE_MPI
    if (c->mpi || c->rdzv) moe_comm_mpi_close(c);
#endif
    free(c);
}

enum moe_status moe_comm_split(const struct moe_comm *c, int color, struct moe_comm **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return moe_fail(MOE_ERR_NOMEM, "communicator");
    **out = (struct moe_comm){.rank = 0, .size = 1, .timeout_s = c->timeout_s, .world_rank = c->world_rank};
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) {
        enum moe_status s = moe_comm_mpi_split(c, color, *out);
        if (s != MOE_OK) {
            free(*out);
            *out = NULL;
        }
        return s;
    }
#endif
    (void)color;
    return MOE_OK;
}

void moe_comm_set_timeout(struct moe_comm *c, double timeout_s)
{
    if (c && timeout_s > 0) c->timeout_s = timeout_s;
}

double moe_comm_timeout(const struct moe_comm *c) { return c ? c->timeout_s : 0; }

void moe_comm_abort(const struct moe_comm *c)
{
#ifdef MOERUN_HAVE_MPI
    if (c && c->mpi) {
        fflush(stderr);
        MPI_Abort(c->world, 3);
    }
#else
    (void)c;
#endif
}

int moe_comm_rank(const struct moe_comm *c) { return c ? c->rank : 0; }
int moe_comm_size(const struct moe_comm *c) { return c ? c->size : 1; }

void moe_comm_counters(const struct moe_comm *c, struct moe_comm_counters *out)
{
    *out = c ? c->n : (struct moe_comm_counters){0};
}

enum moe_status moe_comm_bcast(struct moe_comm *c, void *buf, size_t bytes, int root, const char *what)
{
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) return moe_comm_mpi_bcast(c, buf, bytes, root, what, false);
#endif
    return MOE_OK;
}

enum moe_status moe_comm_bcast_idle(struct moe_comm *c, void *buf, size_t bytes, int root, const char *what)
{
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) return moe_comm_mpi_bcast(c, buf, bytes, root, what, true);
#endif
    return MOE_OK;
}

static enum moe_status allgather(struct moe_comm *c, const void *mine, void *all, size_t bytes, const char *what,
                                 bool idle)
{
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) return moe_comm_mpi_allgather(c, mine, all, bytes, what, idle);
#endif
    if (all != mine) memmove(all, mine, bytes);
    return MOE_OK;
}

enum moe_status moe_comm_allgather(struct moe_comm *c, const void *mine, void *all, size_t bytes,
                                   const char *what)
{
    return allgather(c, mine, all, bytes, what, false);
}

enum moe_status moe_comm_allgather_idle(struct moe_comm *c, const void *mine, void *all, size_t bytes,
                                        const char *what)
{
    return allgather(c, mine, all, bytes, what, true);
}

enum moe_status moe_comm_allgatherv_rows(struct moe_comm *c, float *buf, const int32_t *counts,
                                         const int32_t *displs, int row_floats, const char *what)
{
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) return moe_comm_mpi_allgatherv(c, buf, counts, displs, row_floats, what);
#endif
    return MOE_OK;
}

enum moe_status moe_comm_gatherv(struct moe_comm *c, const float *mine, int n, float *all, const int32_t *counts,
                                 int root, const char *what)
{
    if (n < 0) return moe_fail(MOE_ERR_INVALID_ARG, "gather (%s): %d values", what, n);
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) return moe_comm_mpi_gatherv(c, mine, n, all, counts, root, what);
#endif
    (void)counts, (void)root;
    if (all != mine) memmove(all, mine, (size_t)n * sizeof(float));
    return MOE_OK;
}

enum moe_status moe_comm_alltoall(struct moe_comm *c, const void *send, void *recv, size_t bytes,
                                  const char *what)
{
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) return moe_comm_mpi_alltoall(c, send, recv, bytes, what);
#endif
    if (recv != send) memmove(recv, send, bytes);
    return MOE_OK;
}

enum moe_status moe_comm_alltoallv_rows(struct moe_comm *c, const float *send, const int32_t *scounts,
                                        const int32_t *sdispls, float *recv, const int32_t *rcounts,
                                        const int32_t *rdispls, int row_floats, const char *what)
{
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) return moe_comm_mpi_alltoallv(c, send, scounts, sdispls, recv, rcounts, rdispls, row_floats, what);
#endif
    if (scounts[0] != rcounts[0])
        return moe_fail(MOE_ERR_INVALID_ARG, "all-to-all (%s): %d rows sent, %d received", what, scounts[0],
                        rcounts[0]);
    memmove(recv + (size_t)rdispls[0] * (size_t)row_floats, send + (size_t)sdispls[0] * (size_t)row_floats,
            (size_t)scounts[0] * (size_t)row_floats * sizeof(float));
    return MOE_OK;
}

enum moe_status moe_comm_allreduce_sum(struct moe_comm *c, float *buf, size_t n, const char *what)
{
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) return moe_comm_mpi_allreduce(c, buf, n, what);
#endif
    return MOE_OK;
}

enum moe_status moe_comm_barrier(struct moe_comm *c, const char *what)
{
#ifdef MOERUN_HAVE_MPI
    if (c->mpi) return moe_comm_mpi_barrier(c, what);
#endif
    return MOE_OK;
}
