/* nccl_selftest.cc - the NCCL emulation (emu_nccl.cc) checked on its own,
 * under `mpirun -n 2` or `-n 3` (build.sh nccl_selftest builds it as
 * build-emu/emu_nccl_selftest; ci.sh runs it).
 *
 * Two communicators: the whole world, and the world split by id into
 * pairs (a singleton last when the count is odd), opened non-blocking.
 * On each: allreduce (float32 out of place, int32 and bfloat16 in place,
 * int32 max), a broadcast from every root (in place and not), allgather
 * (in place and not), and a ring of sends and receives in nested groups,
 * receives posted first (a deadlock unless the group defers them).  Then
 * a send and receive outside any group, a collective on a capturing
 * stream (refused), and two openings every rank must fail together (a
 * wrong rank count; one rank with an id never handed to it).  Values are
 * small integers, exact in every type, so any mismatch is a fault.  Each
 * is printed; the exit status is nonzero on any, on every rank.  The
 * refusals checked on purpose say why on stderr ("emu nccl: ..."). */
#include "nccl.h"

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static int wr, ws; /* world rank and size */
static int checks, failures;

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        checks++;                                                                                            \
        if (!(cond)) {                                                                                       \
            char m_[400];                                                                                    \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                            \
            fprintf(stderr, "nccl_selftest: rank %d: %s\n", wr, m_);                                         \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)
#define NCCL_OK(call)                                                                                        \
    do {                                                                                                     \
        ncclResult_t r_ = (call);                                                                            \
        CHECK(r_ == ncclSuccess, "%s: %s (%s)", #call, ncclGetErrorString(r_), ncclGetLastError(nullptr));   \
    } while (0)

struct group {
    const char *name;
    ncclComm_t comm;
    int rank, size;
};

template <class T> static T *dev(size_t n)
{
    void *p = nullptr;
    if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) return nullptr;
    return (T *)p;
}

/* bfloat16 of a small integer: the top half of its float32 (exact) */
static uint16_t bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static void check_allreduce(const group &g, cudaStream_t st)
{
    const int n = 1000 + g.size, S = g.size;
    float *a = dev<float>(n), *b = dev<float>(n);
    int *ia = dev<int>(n), *im = dev<int>(1);
    uint16_t *h = dev<uint16_t>(n);
    for (int i = 0; i < n; i++) {
        a[i] = (float)(g.rank * 1000 + i);
        b[i] = -1;
        ia[i] = (g.rank + 1) * (i + 1);
        h[i] = bf16((float)(i % 8 + g.rank));
    }
    *im = g.rank * 7;
    NCCL_OK(ncclAllReduce(a, b, n, ncclFloat32, ncclSum, g.comm, st));
    NCCL_OK(ncclAllReduce(ia, ia, n, ncclInt32, ncclSum, g.comm, st));
    NCCL_OK(ncclAllReduce(h, h, n, ncclBfloat16, ncclSum, g.comm, st));
    NCCL_OK(ncclAllReduce(im, im, 1, ncclInt, ncclMax, g.comm, st));
    int bad = -1;
    for (int i = n - 1; i >= 0; i--)
        if (b[i] != (float)(1000 * S * (S - 1) / 2 + S * i) || a[i] != (float)(g.rank * 1000 + i) ||
            ia[i] != S * (S + 1) / 2 * (i + 1) || h[i] != bf16((float)(S * (i % 8) + S * (S - 1) / 2)))
            bad = i;
    CHECK(bad < 0, "%s: allreduce sum wrong at %d: float32 %g int32 %d bf16 0x%04x", g.name, bad,
          bad < 0 ? 0 : b[bad], bad < 0 ? 0 : ia[bad], bad < 0 ? 0 : h[bad]);
    CHECK(*im == (S - 1) * 7, "%s: allreduce max: %d, not %d", g.name, *im, (S - 1) * 7);
    cudaFree(a), cudaFree(b), cudaFree(ia), cudaFree(im), cudaFree(h);
}

/* every rank the root once; even roots in place, odd ones not */
static void check_broadcast(const group &g, cudaStream_t st)
{
    const int n = 257;
    float *send = dev<float>(n), *recv = dev<float>(n);
    for (int root = 0; root < g.size; root++) {
        const bool in_place = root % 2 == 0;
        for (int i = 0; i < n; i++) {
            send[i] = g.rank == root ? (float)(root * 100 + i) : (float)(-1000 - g.rank);
            recv[i] = in_place && g.rank == root ? send[i] : -7;
        }
        NCCL_OK(ncclBroadcast(in_place ? recv : send, recv, n, ncclFloat32, root, g.comm, st));
        int bad = -1;
        for (int i = n - 1; i >= 0; i--)
            if (recv[i] != (float)(root * 100 + i)) bad = i;
        CHECK(bad < 0, "%s: broadcast from root %d (%s): element %d is %g, not %d", g.name, root,
              in_place ? "in place" : "out of place", bad, bad < 0 ? 0 : recv[bad], root * 100 + bad);
    }
    cudaFree(send), cudaFree(recv);
}

static void check_allgather(const group &g, cudaStream_t st)
{
    const int c = 33, S = g.size;
    int *send = dev<int>(c), *recv = dev<int>((size_t)S * c), *inpl = dev<int>((size_t)S * c);
    for (int i = 0; i < c; i++) send[i] = g.rank * 10 + i;
    for (int i = 0; i < S * c; i++) recv[i] = inpl[i] = -1;
    memcpy(inpl + g.rank * c, send, c * sizeof(int));
    NCCL_OK(ncclAllGather(send, recv, c, ncclInt32, g.comm, st));
    NCCL_OK(ncclAllGather(inpl + g.rank * c, inpl, c, ncclInt32, g.comm, st));
    int bad = -1;
    for (int i = S * c - 1; i >= 0; i--)
        if (recv[i] != (i / c) * 10 + i % c || inpl[i] != recv[i]) bad = i;
    CHECK(bad < 0, "%s: allgather: element %d is %d (in place %d), not %d", g.name, bad, bad < 0 ? 0 : recv[bad],
          bad < 0 ? 0 : inpl[bad], bad < 0 ? 0 : (bad / c) * 10 + bad % c);
    cudaFree(send), cudaFree(recv), cudaFree(inpl);
}

/* A to the next rank, B to the previous one; x from the previous, y from
 * the next: x = A of prev, y = B of next (with one rank, its own) */
static void check_ring(const group &g, cudaStream_t st)
{
    const int n = 4099; /* past Open MPI's eager limit for floats: a blocking send would wait */
    const int next = (g.rank + 1) % g.size, prev = (g.rank + g.size - 1) % g.size;
    float *A = dev<float>(n), *B = dev<float>(n), *x = dev<float>(n), *y = dev<float>(n);
    for (int i = 0; i < n; i++) {
        A[i] = (float)(g.rank * 10000 + i);
        B[i] = -(float)(g.rank * 10000 + i) - 1;
        x[i] = y[i] = 0.5f;
    }
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclRecv(x, n, ncclFloat32, prev, g.comm, st));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclRecv(y, n, ncclFloat32, next, g.comm, st));
    NCCL_OK(ncclSend(A, n, ncclFloat32, next, g.comm, st));
    NCCL_OK(ncclGroupEnd());
    CHECK(x[0] == 0.5f && y[0] == 0.5f, "%s: an inner ncclGroupEnd ran the group", g.name);
    NCCL_OK(ncclSend(B, n, ncclFloat32, prev, g.comm, st));
    NCCL_OK(ncclGroupEnd());
    int bad = -1;
    for (int i = n - 1; i >= 0; i--)
        if (x[i] != (float)(prev * 10000 + i) || y[i] != -(float)(next * 10000 + i) - 1) bad = i;
    CHECK(bad < 0, "%s: send/recv ring: element %d: from prev %g, from next %g", g.name, bad,
          bad < 0 ? 0 : x[bad], bad < 0 ? 0 : y[bad]);
    cudaFree(A), cudaFree(B), cudaFree(x), cudaFree(y);
}

static void check_group(const group &g, cudaStream_t st)
{
    int n = -1, r = -1;
    NCCL_OK(ncclCommCount(g.comm, &n));
    NCCL_OK(ncclCommUserRank(g.comm, &r));
    CHECK(n == g.size && r == g.rank, "%s: count %d rank %d, not %d %d", g.name, n, r, g.size, g.rank);
    check_allreduce(g, st);
    check_broadcast(g, st);
    check_allgather(g, st);
    check_ring(g, st);
}

/* every world rank: a new id from rank 0 (others make one too, unused) */
static ncclUniqueId world_id()
{
    ncclUniqueId id;
    NCCL_OK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    return id;
}

/* Two openings that must fail on every rank, and return. */
static void check_bad_opening()
{
    ncclComm_t c = nullptr;
    ncclUniqueId id = world_id();
    ncclResult_t r = ncclCommInitRank(&c, ws + 1, id, wr);
    CHECK(r == ncclInvalidArgument && !c, "a group of %d opened as %d: %s", ws, ws + 1, ncclGetErrorString(r));
    id = world_id();
    if (wr == ws - 1) memset(&id, 0, sizeof id); /* never handed to the last rank */
    r = ncclCommInitRank(&c, ws, id, wr);
    CHECK(r == ncclInvalidArgument && !c, "a group with one id missing opened: %s", ncclGetErrorString(r));
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    int version = 0;
    NCCL_OK(ncclGetVersion(&version));
    CHECK(version == NCCL_VERSION_CODE, "version %d", version);
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);

    /* the world, blocking */
    group world = {"world", nullptr, wr, ws};
    const ncclUniqueId wid = world_id();
    NCCL_OK(ncclCommInitRank(&world.comm, ws, wid, wr));

    /* pairs: every rank makes an id (the same count of ids made on every
     * rank, so a colour from the counter alone would collide), the even
     * ones are used; non-blocking */
    ncclUniqueId mine;
    NCCL_OK(ncclGetUniqueId(&mine));
    std::vector<ncclUniqueId> ids(ws);
    MPI_Allgather(&mine, sizeof mine, MPI_BYTE, ids.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
    for (int i = 0; i < ws; i++)
        for (int j = 0; j < i; j++) CHECK(memcmp(&ids[i], &ids[j], sizeof mine), "ids of ranks %d and %d equal", i, j);
    CHECK(memcmp(&mine, &wid, sizeof mine), "two ids of rank %d equal", wr);
    const int root = wr / 2 * 2;
    group pair = {ws - root >= 2 ? "pair" : "singleton", nullptr, wr - root, ws - root >= 2 ? 2 : 1};
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&pair.comm, pair.size, ids[root], pair.rank, &cfg);
    while (r == ncclInProgress) ncclCommGetAsyncError(pair.comm, &r);
    CHECK(r == ncclSuccess, "opening the %s: %s", pair.name, ncclGetErrorString(r));

    if (world.comm && pair.comm) {
        check_group(world, st);
        check_group(pair, st);
        /* the world again, after the pairs: communicators alternate */
        check_allreduce(world, st);
        /* a send and receive outside any group, rank 0 to the last */
        if (ws > 1 && (wr == 0 || wr == ws - 1)) {
            int v = wr == 0 ? 4242 : 0;
            NCCL_OK(wr == 0 ? ncclSend(&v, 1, ncclInt, ws - 1, world.comm, st)
                            : ncclRecv(&v, 1, ncclInt, 0, world.comm, st));
            CHECK(v == 4242, "send outside a group: %d arrived", v);
        }
        CHECK(cudaStreamQuery(st) == cudaSuccess, "cudaStreamQuery: not done");
        /* a capturing stream is refused, at once, on this rank alone */
        cudaStream_t cap;
        cudaGraph_t graph = nullptr;
        float f = 1;
        cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking);
        cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed);
        r = ncclAllReduce(&f, &f, 1, ncclFloat32, ncclSum, world.comm, cap);
        CHECK(r == ncclInvalidUsage && *ncclGetLastError(world.comm), "allreduce on a capturing stream: %s",
              ncclGetErrorString(r));
        cudaStreamEndCapture(cap, &graph);
        if (graph) cudaGraphDestroy(graph);
        cudaStreamDestroy(cap);
        ncclResult_t async = ncclInternalError;
        NCCL_OK(ncclCommGetAsyncError(world.comm, &async));
        CHECK(async == ncclSuccess, "async error %d", (int)async);
    }
    check_bad_opening();

    NCCL_OK(ncclCommFinalize(pair.comm));
    NCCL_OK(ncclCommDestroy(pair.comm));
    NCCL_OK(ncclCommDestroy(world.comm));
    cudaStreamDestroy(st);
    int all[2] = {0, 0}, mine2[2] = {checks, failures};
    MPI_Allreduce(mine2, all, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (wr == 0)
        printf("nccl_selftest: %d ranks, %d checks, %d failed: %s\n", ws, all[0], all[1], all[1] ? "FAIL" : "pass");
    MPI_Finalize();
    return all[1] ? 1 : 0;
}
