/* nccl_cuda.c - NCCL groups and the collectives the CUDA backend needs
 * (nccl_cuda.h).  Built against nccl.h when the toolkit has it
 * (MOERUN_HAVE_NCCL); the library itself is loaded at first use, or, where
 * its functions are linked in (MOERUN_NCCL_LINKED: tools/cuda-emu's
 * emulation), called directly. */
#include "runtime/cuda/nccl_cuda.h"
#include "runtime/core/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef MOERUN_HAVE_NCCL
#include <nccl.h>
#ifndef MOERUN_NCCL_LINKED
#include <dlfcn.h>
#endif
#include <pthread.h>

/* The NCCL functions used, resolved once. */
struct nccl_fns {
    ncclResult_t (*get_unique_id)(ncclUniqueId *id);
    ncclResult_t (*init_config)(ncclComm_t *c, int n, ncclUniqueId id, int rank, ncclConfig_t *cfg);
    ncclResult_t (*async_error)(ncclComm_t c, ncclResult_t *e);
    ncclResult_t (*finalize)(ncclComm_t c);
    ncclResult_t (*destroy)(ncclComm_t c);
    ncclResult_t (*abort)(ncclComm_t c);
    ncclResult_t (*all_reduce)(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t st);
    ncclResult_t (*broadcast)(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                              cudaStream_t st);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t e);
    const char *(*last_error)(ncclComm_t c);
    ncclResult_t (*get_version)(int *v);
    ncclResult_t (*send)(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st);
    ncclResult_t (*recv)(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st);
};

static struct nccl_fns fns;
static char load_error[256]; /* why the library did not load, or "" */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void)
{
#ifdef MOERUN_NCCL_LINKED
    fns = (struct nccl_fns){ncclGetUniqueId, ncclCommInitRankConfig, ncclCommGetAsyncError, ncclCommFinalize,
                            ncclCommDestroy, ncclCommAbort, ncclAllReduce, ncclBroadcast, ncclGroupStart,
                            ncclGroupEnd, ncclGetErrorString, ncclGetLastError, ncclGetVersion, ncclSend,
                            ncclRecv};
#else
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_error, sizeof load_error, "NCCL is not installed here (%s)", dlerror());
        return;
    }
    /* the symbol names of nccl.h, resolved into the table in its order */
    static const char *const names[] = {"ncclGetUniqueId", "ncclCommInitRankConfig", "ncclCommGetAsyncError",
                                        "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort", "ncclAllReduce",
                                        "ncclBroadcast", "ncclGroupStart", "ncclGroupEnd", "ncclGetErrorString",
                                        "ncclGetLastError", "ncclGetVersion", "ncclSend", "ncclRecv"};
    void *got[sizeof names / sizeof *names];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!(got[i] = dlsym(h, names[i]))) {
            snprintf(load_error, sizeof load_error, "libnccl.so.2 has no %s (NCCL 2.14 or later is needed)",
                     names[i]);
            dlclose(h);
            return;
        }
    _Static_assert(sizeof got == sizeof fns, "one pointer per function");
    memcpy(&fns, got, sizeof fns);
#endif
}

static enum moe_status loaded(void)
{
    pthread_once(&load_once, load);
    if (load_error[0] || !fns.get_unique_id) return moe_fail(MOE_ERR_UNSUPPORTED, "%s", load_error);
    return MOE_OK;
}

struct moe_nccl {
    ncclComm_t comm;
    int rank, size, world_rank;
    double timeout_s;
};

static void nap(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

static enum moe_status nccl_failed(const struct moe_nccl *c, ncclResult_t e, const char *op, const char *what)
{
    const char *last = fns.last_error ? fns.last_error(c ? c->comm : NULL) : NULL;
    return moe_fail(MOE_ERR_DEVICE, "NCCL %s (%s): %s%s%s", op, what, fns.error_string(e),
                    last && *last ? ": " : "", last && *last ? last : "");
}

/* Waits until c has no operation in progress and (s not NULL) s is
 * drained; past the timeout, says so on stderr, aborts c and fails. */
static enum moe_status wait_for(struct moe_nccl *c, cudaStream_t s, bool stream, const char *op, const char *what)
{
    const double t0 = moe_seconds();
    for (;;) {
        ncclResult_t e = ncclSuccess;
        ncclResult_t q = fns.async_error(c->comm, &e);
        if (q != ncclSuccess) return nccl_failed(c, q, op, what);
        if (e != ncclSuccess && e != ncclInProgress) return nccl_failed(c, e, op, what);
        if (e == ncclSuccess) {
            if (!stream) return MOE_OK;
            cudaError_t ce = cudaStreamQuery(s);
            if (ce == cudaSuccess) return MOE_OK;
            if (ce != cudaErrorNotReady)
                return moe_fail(MOE_ERR_DEVICE, "NCCL %s (%s): %s", op, what, cudaGetErrorString(ce));
        }
        if (moe_seconds() - t0 > c->timeout_s) {
            fprintf(stderr, "moerun: rank %d: NCCL %s (%s): no answer from the other ranks within %g s (a rank "
                    "died, hangs or is running something else); ending the job\n", c->world_rank, op, what,
                    c->timeout_s);
            fflush(stderr);
            fns.abort(c->comm);
            c->comm = NULL;
            return moe_fail(MOE_ERR_DEVICE, "NCCL %s (%s) timed out after %g s", op, what, c->timeout_s);
        }
        nap();
    }
}

enum moe_status moe_nccl_probe(void)
{
    MOE_TRY(loaded());
    int v = 0;
    ncclResult_t e = fns.get_version(&v);
    if (e != ncclSuccess) return nccl_failed(NULL, e, "version", "loading the library");
    if (v < 21400) return moe_fail(MOE_ERR_UNSUPPORTED, "NCCL %d is too old (2.14 or later is needed)", v);
    return MOE_OK;
}

enum moe_status moe_nccl_unique_id(void *id)
{
    MOE_TRY(loaded());
    ncclUniqueId u;
    ncclResult_t e = fns.get_unique_id(&u);
    if (e != ncclSuccess) return nccl_failed(NULL, e, "unique id", "opening a group");
    _Static_assert(sizeof u == MOE_NCCL_ID_BYTES, "NCCL_UNIQUE_ID_BYTES");
    memcpy(id, &u, sizeof u);
    return MOE_OK;
}

enum moe_status moe_nccl_open(struct moe_nccl **out, const void *id, int rank, int size, int world_rank,
                              double timeout_s)
{
    *out = NULL;
    MOE_TRY(loaded());
    if (size < 1 || rank < 0 || rank >= size || !(timeout_s > 0))
        return moe_fail(MOE_ERR_INVALID_ARG, "NCCL: rank %d of %d (timeout %g s)", rank, size, timeout_s);
    struct moe_nccl *c = calloc(1, sizeof *c);
    if (!c) return moe_fail(MOE_ERR_NOMEM, "NCCL group");
    *c = (struct moe_nccl){NULL, rank, size, world_rank, timeout_s};
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* joining polls, so a missing rank times out */
    ncclResult_t e = fns.init_config(&c->comm, size, u, rank, &cfg);
    enum moe_status s = MOE_OK;
    if (e != ncclSuccess && e != ncclInProgress)
        s = nccl_failed(c, e, "init", "joining the group");
    else
        s = wait_for(c, NULL, false, "init", "joining the group");
    if (s != MOE_OK) {
        if (c->comm) fns.abort(c->comm);
        free(c);
        return s;
    }
    *out = c;
    return MOE_OK;
}

void moe_nccl_free(struct moe_nccl *c)
{
    if (!c) return;
    if (c->comm) {
        ncclResult_t e = fns.finalize(c->comm);
        if ((e == ncclSuccess || e == ncclInProgress) && wait_for(c, NULL, false, "finalize", "closing") == MOE_OK)
            fns.destroy(c->comm);
        else if (c->comm)
            fns.abort(c->comm);
    }
    free(c);
}

enum moe_status moe_nccl_sum(struct moe_nccl *c, float *buf, size_t n, cudaStream_t s, const char *what)
{
    if (!c->comm) return moe_fail(MOE_ERR_DEVICE, "NCCL all-reduce (%s): the group was aborted", what);
    ncclResult_t e = fns.all_reduce(buf, buf, n, ncclFloat32, ncclSum, c->comm, s);
    if (e != ncclSuccess && e != ncclInProgress) return nccl_failed(c, e, "all-reduce", what);
    return wait_for(c, s, true, "all-reduce", what);
}

enum moe_status moe_nccl_share(struct moe_nccl *c, float *buf, const size_t *offs, cudaStream_t s, const char *what)
{
    if (!c->comm) return moe_fail(MOE_ERR_DEVICE, "NCCL broadcasts (%s): the group was aborted", what);
    ncclResult_t e = fns.group_start();
    for (int r = 0; r < c->size && (e == ncclSuccess || e == ncclInProgress); r++)
        if (offs[r + 1] > offs[r])
            e = fns.broadcast(buf + offs[r], buf + offs[r], offs[r + 1] - offs[r], ncclFloat32, r, c->comm, s);
    ncclResult_t g = fns.group_end(); /* always, to close the group */
    if (e == ncclSuccess || e == ncclInProgress) e = g;
    if (e != ncclSuccess && e != ncclInProgress) return nccl_failed(c, e, "broadcasts", what);
    return wait_for(c, s, true, "broadcasts", what);
}

enum moe_status moe_nccl_gather(struct moe_nccl *c, const float *mine, float *all, const size_t *offs, cudaStream_t s,
                                const char *what)
{
    if (!c->comm) return moe_fail(MOE_ERR_DEVICE, "NCCL sends to rank 0 (%s): the group was aborted", what);
    const size_t n = offs[c->rank + 1] - offs[c->rank];
    if (c->rank == 0 && n) {
        cudaError_t ce = cudaMemcpyAsync(all, mine, n * sizeof(float), cudaMemcpyDeviceToDevice, s);
        if (ce != cudaSuccess)
            return moe_fail(MOE_ERR_DEVICE, "NCCL sends to rank 0 (%s): %s", what, cudaGetErrorString(ce));
    }
    ncclResult_t e = fns.group_start();
    if (c->rank != 0 && n && (e == ncclSuccess || e == ncclInProgress))
        e = fns.send(mine, n, ncclFloat32, 0, c->comm, s);
    for (int r = 1; c->rank == 0 && r < c->size && (e == ncclSuccess || e == ncclInProgress); r++)
        if (offs[r + 1] > offs[r]) e = fns.recv(all + offs[r], offs[r + 1] - offs[r], ncclFloat32, r, c->comm, s);
    ncclResult_t g = fns.group_end(); /* always, to close the group */
    if (e == ncclSuccess || e == ncclInProgress) e = g;
    if (e != ncclSuccess && e != ncclInProgress) return nccl_failed(c, e, "sends to rank 0", what);
    return wait_for(c, s, true, "sends to rank 0", what);
}

#else /* no nccl.h at build time */

static enum moe_status not_built(void)
{
    return moe_fail(MOE_ERR_UNSUPPORTED, "this build has no NCCL (nccl.h was not found with the CUDA toolkit)");
}

enum moe_status moe_nccl_probe(void) { return not_built(); }

enum moe_status moe_nccl_unique_id(void *id)
{
    (void)id;
    return not_built();
}

enum moe_status moe_nccl_open(struct moe_nccl **out, const void *id, int rank, int size, int world_rank,
                              double timeout_s)
{
    (void)id, (void)rank, (void)size, (void)world_rank, (void)timeout_s;
    *out = NULL;
    return not_built();
}

void moe_nccl_free(struct moe_nccl *c) { (void)c; }

enum moe_status moe_nccl_sum(struct moe_nccl *c, float *buf, size_t n, cudaStream_t s, const char *what)
{
    (void)c, (void)buf, (void)n, (void)s, (void)what;
    return not_built();
}

enum moe_status moe_nccl_share(struct moe_nccl *c, float *buf, const size_t *offs, cudaStream_t s, const char *what)
{
    (void)c, (void)buf, (void)offs, (void)s, (void)what;
    return not_built();
}

enum moe_status moe_nccl_gather(struct moe_nccl *c, const float *mine, float *all, const size_t *offs, cudaStream_t s,
                                const char *what)
{
    (void)c, (void)mine, (void)all, (void)offs, (void)s, (void)what;
    return not_built();
}

#endif
