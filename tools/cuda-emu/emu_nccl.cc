/* NCCL over MPI for the host emulation: the subset shim/nccl.h declares,
 * so the CUDA backend's NCCL code runs under `mpirun -n N` on the emulated
 * device, whose memory is host memory.
 *
 * A communicator is an MPI communicator.  ncclGetUniqueId writes a colour
 * into the id (bytes 0-3: counter * world size + world rank, below 2^31,
 * so no two ids of one job share it) after a marker naming the emulation;
 * ncclCommInitRank splits MPI_COMM_WORLD by that colour with the NCCL rank
 * as key.  MPI_Comm_split is collective over the whole world: every world
 * rank must open its communicators at the same time and in the same order
 * (each rank one communicator per round; the ranks of one job open their
 * groups together).  A rank whose arguments are wrong still takes part in
 * the split, so the others fail with it instead of waiting.
 *
 * Work is synchronous, as the rest of the emulation: a collective runs when
 * called, on any stream but a capturing one (then ncclInvalidUsage: it
 * cannot be recorded into a graph), and the stream has nothing left to do
 * when it returns.  Between ncclGroupStart and ncclGroupEnd (nested:
 * depth counted) collectives still run at once, every rank issuing them in
 * the same order; sends and receives wait for the outermost ncclGroupEnd
 * and are posted there together (MPI_Isend / MPI_Irecv, MPI_Waitall), so
 * a group of them in any order cannot deadlock; the i-th send to a peer
 * meets the peer's i-th receive from this rank, as in NCCL.  A send or
 * receive outside a group blocks until its peer's matching call.
 * Non-blocking communicators (config.blocking = 0) are ready at once.
 *
 * Types: the integer and float types of MPI, and float16 / bfloat16 with
 * user reduction operations (sum, product, max, min: each combination of
 * two buffers in fp32, rounded back to the type); fp8 moves but never
 * reduces.  ncclAvg is not emulated.
 *
 * EMU_NCCL_LOG=FILE appends one line per call, "rank W NAME count N TYPE
 * ...", W the world rank, so a check can see the product called NCCL
 * (ci.sh counts ep_check's calls).  EMU_NCCL_FAIL=W makes ncclGetVersion
 * fail on world rank W, as on a rank where NCCL does not load (the
 * product probes with it before joining a group): ci.sh checks the
 * product's fallback.
 * Built without MPI (build.sh found no ompi-c), every call but the version
 * and the error strings fails with ncclInvalidUsage, saying so. */
#include "nccl.h"

#include <fcntl.h>
#include <unistd.h>

#include <climits>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <vector>

#ifdef EMU_HAVE_MPI
#include <mpi.h> /* ncclGetVersion's rank, and the MPI part below */
#endif

static thread_local std::string last_msg; /* ncclGetLastError */

/* Sets the last error's message, says it on stderr, returns r. */
__attribute__((format(printf, 2, 3))) static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    last_msg = buf;
    fprintf(stderr, "emu nccl: %s\n", buf);
    return r;
}

extern "C" {
ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    const char *w = getenv("EMU_NCCL_FAIL"); /* a world rank where NCCL "does not load" */
    int rank = -1, up = 0;
#ifdef EMU_HAVE_MPI
    MPI_Initialized(&up);
    if (up) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#endif
    if (w && *w && up && atoi(w) == rank)
        return fail(ncclSystemError, "ncclGetVersion: failure injected on world rank %d (EMU_NCCL_FAIL)", rank);
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "emulated: unhandled cuda error";
    case ncclSystemError: return "emulated: unhandled system error (an MPI call failed)";
    case ncclInternalError: return "emulated: internal error";
    case ncclInvalidArgument: return "emulated: invalid argument";
    case ncclInvalidUsage: return "emulated: invalid usage";
    case ncclRemoteError: return "emulated: remote process exited or there was a network error";
    case ncclInProgress: return "emulated: NCCL operation in progress";
    default: return "emulated: unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t) { return last_msg.c_str(); }
}

#if EMU_HAVE_MPI
#include <mpi.h>

#include "runtime/core/tensor.h"

static const char id_marker[16] = "moerun-emu-nccl"; /* bytes 4-19 of every id made here */

struct ncclComm {
    MPI_Comm comm;
    int rank, nranks;
    ncclResult_t async; /* what ncclCommGetAsyncError reports */
};

/* ---- the call log (EMU_NCCL_LOG) ---- */

static int world_rank()
{
    int inited = 0, fin = 0, r = -1;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

/* One line "rank W " + the formatted rest, appended to EMU_NCCL_LOG's
 * file (opened once, O_APPEND: ranks share the file line by line). */
__attribute__((format(printf, 1, 2))) static void log_call(const char *fmt, ...)
{
    static std::mutex mu;
    static int fd = -2;
    const char *path = getenv("EMU_NCCL_LOG");
    if (!path || !*path) return;
    char line[256];
    int n = snprintf(line, sizeof line, "rank %d ", world_rank());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    std::lock_guard<std::mutex> g(mu);
    if (fd == -2) fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0 && write(fd, line, (size_t)n) != (ssize_t)n) fprintf(stderr, "emu nccl: %s: short write\n", path);
}

/* ---- types and reductions ---- */

enum kind { NATIVE, F16, BF16, FP8 };
struct type_info {
    MPI_Datatype mpi;
    size_t bytes;
    kind k;
    const char *name;
};

static bool type_of(ncclDataType_t t, type_info *out)
{
    switch (t) {
    case ncclInt8: *out = {MPI_INT8_T, 1, NATIVE, "int8"}; return true;
    case ncclUint8: *out = {MPI_UINT8_T, 1, NATIVE, "uint8"}; return true;
    case ncclInt32: *out = {MPI_INT32_T, 4, NATIVE, "int32"}; return true;
    case ncclUint32: *out = {MPI_UINT32_T, 4, NATIVE, "uint32"}; return true;
    case ncclInt64: *out = {MPI_INT64_T, 8, NATIVE, "int64"}; return true;
    case ncclUint64: *out = {MPI_UINT64_T, 8, NATIVE, "uint64"}; return true;
    case ncclFloat16: *out = {MPI_UINT16_T, 2, F16, "float16"}; return true;
    case ncclFloat32: *out = {MPI_FLOAT, 4, NATIVE, "float32"}; return true;
    case ncclFloat64: *out = {MPI_DOUBLE, 8, NATIVE, "float64"}; return true;
    case ncclBfloat16: *out = {MPI_UINT16_T, 2, BF16, "bfloat16"}; return true;
    case ncclFloat8e4m3: *out = {MPI_UINT8_T, 1, FP8, "fp8e4m3"}; return true;
    case ncclFloat8e5m2: *out = {MPI_UINT8_T, 1, FP8, "fp8e5m2"}; return true;
    default: return false;
    }
}

static const char *op_name(ncclRedOp_t op)
{
    static const char *names[] = {"sum", "prod", "max", "min", "avg"};
    return (unsigned)op < 5 ? names[op] : "?";
}

/* float16 / bfloat16 element by element in fp32, rounded back once */
template <bool BF, int OP> static void half_reduce(void *in, void *inout, int *len, MPI_Datatype *)
{
    const uint16_t *a = (const uint16_t *)in;
    uint16_t *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++) {
        const float x = BF ? moe_bf16_to_f32(a[i]) : moe_f16_to_f32(a[i]);
        const float y = BF ? moe_bf16_to_f32(b[i]) : moe_f16_to_f32(b[i]);
        const float r = OP == ncclSum ? x + y : OP == ncclProd ? x * y : OP == ncclMax ? (x > y ? x : y)
                                                                                      : (x < y ? x : y);
        b[i] = BF ? moe_f32_to_bf16(r) : moe_f32_to_f16(r);
    }
}

static ncclResult_t op_of(const char *what, ncclRedOp_t op, const type_info &t, MPI_Op *out)
{
    static const MPI_Op native[] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};
    static MPI_User_function *const half_fns[2][4] = {
        {half_reduce<false, 0>, half_reduce<false, 1>, half_reduce<false, 2>, half_reduce<false, 3>},
        {half_reduce<true, 0>, half_reduce<true, 1>, half_reduce<true, 2>, half_reduce<true, 3>}};
    static MPI_Op half_ops[2][4]; /* made when first needed, kept to the end */
    static bool made[2][4];
    static std::mutex mu;
    if ((unsigned)op > ncclMin)
        return fail(ncclInvalidArgument, "%s: reduction %d (%s) is not emulated (sum, prod, max, min are)", what,
                    (int)op, op_name(op));
    if (t.k == FP8) return fail(ncclInvalidArgument, "%s: %s is not reduced by the emulation", what, t.name);
    if (t.k == NATIVE) {
        *out = native[op];
        return ncclSuccess;
    }
    std::lock_guard<std::mutex> g(mu);
    const int b = t.k == BF16;
    if (!made[b][op]) {
        const int rc = MPI_Op_create(half_fns[b][op], 1, &half_ops[b][op]);
        if (rc != MPI_SUCCESS) return fail(ncclSystemError, "%s: MPI_Op_create failed (%d)", what, rc);
        made[b][op] = true;
    }
    *out = half_ops[b][op];
    return ncclSuccess;
}

/* ---- checks every call makes ---- */

static ncclResult_t mpi_failed(const char *what, int rc, ncclComm_t comm)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    if (comm) comm->async = ncclSystemError;
    return fail(ncclSystemError, "%s: MPI failed: %s", what, s);
}

static bool mpi_usable()
{
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    return inited && !fin;
}

/* The communicator, the stream and the count, then the type into *t. */
static ncclResult_t check_call(const char *what, ncclComm_t comm, cudaStream_t st, size_t count,
                               ncclDataType_t dt, type_info *t)
{
    if (!comm || comm->comm == MPI_COMM_NULL) return fail(ncclInvalidArgument, "%s: no communicator", what);
    if (!mpi_usable()) return fail(ncclInvalidUsage, "%s: MPI is finalised (NCCL runs over it here)", what);
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
        return fail(ncclInvalidUsage, "%s on %s: the emulation runs NCCL calls when they are made and cannot "
                    "record them into a graph", what, st ? "a capturing stream" : "the legacy stream during a capture");
    if (!type_of(dt, t)) return fail(ncclInvalidArgument, "%s: data type %d", what, (int)dt);
    if (count > (size_t)INT_MAX) return fail(ncclInvalidArgument, "%s: count %zu is more than MPI's int", what, count);
    return ncclSuccess;
}

/* ---- communicators ---- */

extern "C" {
ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static std::mutex mu;
    static long long made; /* ids this process made */
    if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
    if (!mpi_usable())
        return fail(ncclInvalidUsage, "ncclGetUniqueId: MPI is not initialised (the emulation runs NCCL over MPI; "
                    "the comm room initialises it first)");
    int wr = 0, ws = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    std::lock_guard<std::mutex> g(mu);
    const long long color = made * ws + wr;
    if (color > INT_MAX) return fail(ncclInternalError, "ncclGetUniqueId: this process has made too many ids");
    const int c = (int)color, pid = (int)getpid();
    const long long now = (long long)time(nullptr), n = made++;
    memset(id->internal, 0, sizeof id->internal);
    memcpy(id->internal, &c, 4);
    memcpy(id->internal + 4, id_marker, sizeof id_marker);
    memcpy(id->internal + 20, &pid, 4);
    memcpy(id->internal + 24, &now, 8);
    memcpy(id->internal + 32, &n, 8);
    return ncclSuccess;
}

/* What is wrong with the arguments, found before the split; "" if nothing. */
static std::string init_problem(ncclComm_t *comm, int nranks, const ncclUniqueId &id, int rank,
                                const ncclConfig_t *cfg)
{
    char s[160];
    if (!comm) return "comm is NULL";
    if (memcmp(id.internal + 4, id_marker, sizeof id_marker))
        return "the id was not made by ncclGetUniqueId (was it handed to this rank?)";
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        snprintf(s, sizeof s, "rank %d of %d", rank, nranks);
        return s;
    }
    if (cfg && (cfg->magic != 0xcafebeef || cfg->size < offsetof(ncclConfig_t, blocking) + sizeof(int)))
        return "the config was not set with NCCL_CONFIG_INITIALIZER";
    return "";
}

/* ncclCommInitRank(Config): the ranks that pass this id form the
 * communicator, checked together so that all succeed or all fail. */
static ncclResult_t comm_init(const char *what, ncclComm_t *comm, int nranks, const ncclUniqueId &id, int rank,
                              const ncclConfig_t *cfg)
{
    if (comm) *comm = nullptr;
    if (!mpi_usable())
        return fail(ncclInvalidUsage, "%s: MPI is not initialised (the emulation runs NCCL over MPI; the comm "
                    "room initialises it first)", what);
    const std::string problem = init_problem(comm, nranks, id, rank, cfg);
    int color = MPI_UNDEFINED;
    if (problem.empty()) {
        memcpy(&color, id.internal, 4);
        color &= INT_MAX;
    }
    MPI_Comm c = MPI_COMM_NULL;
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color, rank, &c); /* every world rank, in the same order */
    if (rc != MPI_SUCCESS) return mpi_failed(what, rc, nullptr);
    if (!problem.empty()) return fail(ncclInvalidArgument, "%s: %s", what, problem.c_str());
    int size = 0, r = -1, ok, all_ok = 0;
    MPI_Comm_size(c, &size);
    MPI_Comm_rank(c, &r);
    ok = size == nranks && r == rank;
    rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, c);
    if (rc != MPI_SUCCESS) return mpi_failed(what, rc, nullptr);
    if (!all_ok) {
        MPI_Comm_free(&c);
        if (ok) return fail(ncclInvalidArgument, "%s: rank %d of %d: another rank of the group has a mismatch", what,
                            rank, nranks);
        return fail(ncclInvalidArgument, "%s: rank %d of %d: the ranks that passed this id are %d, this one their "
                    "rank %d (a rank passed another id, count or rank)", what, rank, nranks, size, r);
    }
    *comm = new ncclComm{c, rank, nranks, ncclSuccess};
    log_call("%s nranks %d rank %d", what, nranks, rank);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return comm_init("ncclCommInitRank", comm, nranks, id, rank, nullptr);
}

/* blocking or not, the communicator is ready when this returns */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config)
{
    return comm_init("ncclCommInitRankConfig", comm, nranks, id, rank, config);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    if (!comm || !err) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
    *err = comm->async;
    return ncclSuccess;
}

/* nothing is left in flight: finalising has nothing to wait for */
ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    return ncclSuccess;
}

/* Frees the MPI communicator (unless MPI is finalised already: then it is
 * gone with it). */
static ncclResult_t comm_free(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    if (mpi_usable() && comm->comm != MPI_COMM_NULL) MPI_Comm_free(&comm->comm);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return comm_free(comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return comm_free(comm); }

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count) return fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

/* ---- collectives: run at once ---- */

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t st)
{
    const char *what = "ncclAllReduce";
    type_info t;
    MPI_Op mop = MPI_OP_NULL;
    if (ncclResult_t r = check_call(what, comm, st, count, dt, &t)) return r;
    if (ncclResult_t r = op_of(what, op, t, &mop)) return r;
    log_call("%s count %zu %s %s nranks %d", what, count, t.name, op_name(op), comm->nranks);
    const int rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, t.mpi, mop, comm->comm);
    return rc == MPI_SUCCESS ? ncclSuccess : mpi_failed(what, rc, comm);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root,
                           ncclComm_t comm, cudaStream_t st)
{
    const char *what = "ncclBroadcast";
    type_info t;
    if (ncclResult_t r = check_call(what, comm, st, count, dt, &t)) return r;
    if (root < 0 || root >= comm->nranks)
        return fail(ncclInvalidArgument, "%s: root %d of %d ranks", what, root, comm->nranks);
    log_call("%s count %zu %s root %d nranks %d", what, count, t.name, root, comm->nranks);
    if (comm->rank == root && send != recv) memmove(recv, send, count * t.bytes);
    const int rc = MPI_Bcast(recv, (int)count, t.mpi, root, comm->comm);
    return rc == MPI_SUCCESS ? ncclSuccess : mpi_failed(what, rc, comm);
}

/* recv (nranks * count) holds rank r's send at r * count; in place when
 * send is already there */
ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t st)
{
    const char *what = "ncclAllGather";
    type_info t;
    if (ncclResult_t r = check_call(what, comm, st, count, dt, &t)) return r;
    log_call("%s count %zu %s nranks %d", what, count, t.name, comm->nranks);
    const bool in_place = send == (const char *)recv + (size_t)comm->rank * count * t.bytes;
    const int rc = MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)count, t.mpi, recv, (int)count, t.mpi,
                                 comm->comm);
    return rc == MPI_SUCCESS ? ncclSuccess : mpi_failed(what, rc, comm);
}

/* ---- sends, receives and groups ---- */

struct p2p {
    bool send;
    void *buf;
    int count, peer;
    MPI_Datatype type;
    ncclComm_t comm;
};
static thread_local int group_depth;
static thread_local std::vector<p2p> pending; /* this group's sends and receives, in call order */

/* Posts them all, then waits for them all. */
static ncclResult_t run_p2p(std::vector<p2p> &ops)
{
    std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < ops.size(); i++) {
        const p2p &o = ops[i];
        const int rc = o.send ? MPI_Isend(o.buf, o.count, o.type, o.peer, 0, o.comm->comm, &reqs[i])
                              : MPI_Irecv(o.buf, o.count, o.type, o.peer, 0, o.comm->comm, &reqs[i]);
        if (rc != MPI_SUCCESS) {
            MPI_Waitall((int)i, reqs.data(), MPI_STATUSES_IGNORE);
            ops.clear();
            return mpi_failed(o.send ? "ncclSend" : "ncclRecv", rc, o.comm);
        }
    }
    const int rc = MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE);
    ncclComm_t c = ops.empty() ? nullptr : ops[0].comm;
    ops.clear();
    return rc == MPI_SUCCESS ? ncclSuccess : mpi_failed("ncclGroupEnd", rc, c);
}

static ncclResult_t p2p_call(const char *what, bool send, void *buf, size_t count, ncclDataType_t dt, int peer,
                             ncclComm_t comm, cudaStream_t st)
{
    type_info t;
    if (ncclResult_t r = check_call(what, comm, st, count, dt, &t)) return r;
    if (peer < 0 || peer >= comm->nranks)
        return fail(ncclInvalidArgument, "%s: peer %d of %d ranks", what, peer, comm->nranks);
    log_call("%s count %zu %s peer %d nranks %d", what, count, t.name, peer, comm->nranks);
    const p2p o = {send, buf, (int)count, peer, t.mpi, comm};
    if (group_depth > 0) {
        pending.push_back(o);
        return ncclSuccess;
    }
    std::vector<p2p> one = {o};
    return run_p2p(one);
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t st)
{
    return p2p_call("ncclSend", true, (void *)send, count, dt, peer, comm, st);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t st)
{
    return p2p_call("ncclRecv", false, recv, count, dt, peer, comm, st);
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

/* the outermost end runs the group's sends and receives */
ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    return run_p2p(pending);
}
}

#else /* built without MPI: nothing can be opened */

static ncclResult_t no_mpi(const char *what)
{
    return fail(ncclInvalidUsage, "%s: the emulation was built without MPI (build.sh found no ompi-c)", what);
}

extern "C" {
ncclResult_t ncclGetUniqueId(ncclUniqueId *) { return no_mpi("ncclGetUniqueId"); }
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int, ncclUniqueId, int)
{
    if (comm) *comm = nullptr;
    return no_mpi("ncclCommInitRank");
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int, ncclUniqueId, int, ncclConfig_t *)
{
    if (comm) *comm = nullptr;
    return no_mpi("ncclCommInitRankConfig");
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *) { return no_mpi("ncclCommGetAsyncError"); }
ncclResult_t ncclCommFinalize(ncclComm_t) { return no_mpi("ncclCommFinalize"); }
ncclResult_t ncclCommDestroy(ncclComm_t) { return no_mpi("ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t) { return no_mpi("ncclCommAbort"); }
ncclResult_t ncclCommCount(const ncclComm_t, int *) { return no_mpi("ncclCommCount"); }
ncclResult_t ncclCommUserRank(const ncclComm_t, int *) { return no_mpi("ncclCommUserRank"); }
ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
{
    return no_mpi("ncclAllReduce");
}
ncclResult_t ncclBroadcast(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
{
    return no_mpi("ncclBroadcast");
}
ncclResult_t ncclAllGather(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
{
    return no_mpi("ncclAllGather");
}
ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return no_mpi("ncclSend"); }
ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return no_mpi("ncclRecv"); }
ncclResult_t ncclGroupStart(void) { return no_mpi("ncclGroupStart"); }
ncclResult_t ncclGroupEnd(void) { return no_mpi("ncclGroupEnd"); }
}
#endif
