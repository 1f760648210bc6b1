/* Streams, stream capture and CUDA graphs of the host emulation.
 *
 * Work is synchronous: emu_submit runs it at once, unless its stream is
 * capturing, when it is appended to the stream's recording instead (a
 * closure holding the kernel's arguments, a copy's or memset's pointers and
 * sizes, a GEMM's pointers: a graph replays the work on the same
 * addresses, reading whatever they hold then).  cudaStreamEndCapture hands
 * the recording over as a graph, cudaGraphInstantiate copies it, and
 * cudaGraphLaunch submits the whole of it to a stream (run now, or recorded
 * into a capture in its turn).
 *
 * What breaks a capture, as it does on a device:
 * - cudaStreamSynchronize or cudaStreamQuery on the capturing stream,
 *   cudaDeviceSynchronize:
 *   cudaErrorStreamCaptureUnsupported, and the capture is invalidated;
 * - work on the legacy stream (a launch without a stream, a copy on stream
 *   0) while any stream captures: cudaErrorStreamCaptureImplicit;
 * - a cudaMemcpyAsync between a capturing stream and pageable host memory
 *   (not from cudaMallocHost): cudaErrorStreamCaptureUnsupported.
 * Stricter than the relaxed mode the backend captures in: cudaMalloc,
 * cudaFree, cudaMallocHost, cudaFreeHost and the synchronous cudaMemcpy and
 * cudaMemset during a capture invalidate it too (on a device they would run
 * once, at record time, never in a replay: in a recorded step that is a bug).
 * Work submitted to an invalidated capture returns
 * cudaErrorStreamCaptureInvalidated, and so does cudaStreamEndCapture, with
 * no graph.  Each break is reported on stderr with what caused it. */
#include "emu.h"
#include <cstdlib>
#include <map>
#include <mutex>

struct emu_stream {
    bool capturing;
    cudaError_t broken; /* why the capture was invalidated, or cudaSuccess */
    std::vector<std::function<void()>> nodes;
};
struct emu_graph { std::vector<std::function<void()>> nodes; };
struct emu_graph_exec { std::vector<std::function<void()>> nodes; };

static std::mutex mu;                          /* guards the state below */
static std::vector<emu_stream *> streams;      /* those created, for the legacy-stream rule */
static std::map<uintptr_t, size_t> pinned;     /* cudaMallocHost blocks: start, bytes */
static thread_local cudaError_t last_error;
long emu_graph_launches;

static void set_error(cudaError_t e)
{
    if (e != cudaSuccess) last_error = e;
}

static bool any_capturing()
{
    for (emu_stream *s : streams)
        if (s->capturing) return true;
    return false;
}

static void invalidate(emu_stream *s, cudaError_t why, const char *what)
{
    if (!s->capturing || s->broken != cudaSuccess) return;
    fprintf(stderr, "emu: stream capture invalidated: %s (error %d)\n", what, (int)why);
    s->broken = why;
    s->nodes.clear();
}

/* A call that may not happen while any stream captures: invalidates every
 * capture; cudaSuccess when none is under way. */
cudaError_t emu_capture_forbids(const char *what)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!any_capturing()) return cudaSuccess;
    for (emu_stream *s : streams) invalidate(s, cudaErrorStreamCaptureUnsupported, what);
    set_error(cudaErrorStreamCaptureUnsupported);
    return cudaErrorStreamCaptureUnsupported;
}

cudaError_t emu_submit(cudaStream_t st, const char *what, std::function<void()> work)
{
    {
        std::lock_guard<std::mutex> lk(mu);
        if (!st && any_capturing()) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s on the legacy stream", what);
            for (emu_stream *s : streams) invalidate(s, cudaErrorStreamCaptureImplicit, msg);
            set_error(cudaErrorStreamCaptureImplicit);
            return cudaErrorStreamCaptureImplicit;
        }
        if (st && st->capturing) {
            if (st->broken != cudaSuccess) {
                set_error(cudaErrorStreamCaptureInvalidated);
                return cudaErrorStreamCaptureInvalidated;
            }
            st->nodes.push_back(std::move(work));
            return cudaSuccess;
        }
    }
    work();
    return cudaSuccess;
}

static bool is_pinned(const void *p, size_t n)
{
    auto it = pinned.upper_bound((uintptr_t)p);
    if (it == pinned.begin()) return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

extern "C" {
cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaErrorNotReady: return "emulated: device not ready";
    case cudaErrorNotSupported: return "emulated: not supported";
    case cudaErrorStreamCaptureUnsupported: return "emulated: operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "emulated: operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "emulated: operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorIllegalState: return "emulated: illegal state (the stream is not capturing)";
    default: return "emulated error";
    }
}

cudaError_t cudaMallocHost(void **p, size_t b)
{
    if (cudaError_t e = emu_capture_forbids("cudaMallocHost")) return e;
    *p = aligned_alloc(256, (b + 255) & ~(size_t)255);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xcd, b);
    std::lock_guard<std::mutex> lk(mu);
    pinned[(uintptr_t)*p] = b;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (cudaError_t e = emu_capture_forbids("cudaFreeHost")) return e;
    {
        std::lock_guard<std::mutex> lk(mu);
        pinned.erase((uintptr_t)p);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st)
{
    if (st && st->capturing) {
        const void *host = k == cudaMemcpyHostToDevice ? s : k == cudaMemcpyDeviceToHost ? d : nullptr;
        std::lock_guard<std::mutex> lk(mu);
        if (host && !is_pinned(host, n)) {
            invalidate(st, cudaErrorStreamCaptureUnsupported, "cudaMemcpyAsync with pageable host memory");
            set_error(cudaErrorStreamCaptureUnsupported);
            return cudaErrorStreamCaptureUnsupported;
        }
    }
    return emu_submit(st, "cudaMemcpyAsync", [=]() { memmove(d, s, n); });
}

cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st)
{
    return emu_submit(st, "cudaMemsetAsync", [=]() { memset(d, v, n); });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned)
{
    std::lock_guard<std::mutex> lk(mu);
    *s = new emu_stream{false, cudaSuccess, {}};
    streams.push_back(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    std::lock_guard<std::mutex> lk(mu);
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == s) streams.erase(streams.begin() + (long)i);
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    if (!st) return emu_capture_forbids("cudaStreamSynchronize on the legacy stream");
    std::lock_guard<std::mutex> lk(mu);
    if (st->capturing) {
        invalidate(st, cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize on the capturing stream");
        set_error(cudaErrorStreamCaptureUnsupported);
        return cudaErrorStreamCaptureUnsupported;
    }
    return cudaSuccess;
}

/* Done at once (work runs when submitted); a query is a synchronisation
 * as far as a capture is concerned, as on a device. */
cudaError_t cudaStreamQuery(cudaStream_t st)
{
    if (!st) return emu_capture_forbids("cudaStreamQuery on the legacy stream");
    std::lock_guard<std::mutex> lk(mu);
    if (st->capturing) {
        invalidate(st, cudaErrorStreamCaptureUnsupported, "cudaStreamQuery on the capturing stream");
        set_error(cudaErrorStreamCaptureUnsupported);
        return cudaErrorStreamCaptureUnsupported;
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return emu_capture_forbids("cudaDeviceSynchronize"); }

cudaError_t cudaStreamBeginCapture(cudaStream_t st, cudaStreamCaptureMode)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!st) return cudaErrorInvalidValue; /* the legacy stream cannot be captured */
    if (st->capturing) return cudaErrorIllegalState;
    st->capturing = true;
    st->broken = cudaSuccess;
    st->nodes.clear();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *g)
{
    std::lock_guard<std::mutex> lk(mu);
    *g = nullptr;
    if (!st || !st->capturing) return cudaErrorIllegalState;
    st->capturing = false;
    if (st->broken != cudaSuccess) {
        st->broken = cudaSuccess;
        return cudaErrorStreamCaptureInvalidated;
    }
    *g = new emu_graph{std::move(st->nodes)};
    st->nodes.clear();
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t st, enum cudaStreamCaptureStatus *status)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!st) { /* asking about the legacy stream while a capture is under way is itself illegal */
        *status = cudaStreamCaptureStatusNone;
        return any_capturing() ? cudaErrorStreamCaptureImplicit : cudaSuccess;
    }
    *status = !st->capturing ? cudaStreamCaptureStatusNone
              : st->broken != cudaSuccess ? cudaStreamCaptureStatusInvalidated
                                          : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long)
{
    if (!g) return cudaErrorInvalidValue;
    *e = new emu_graph_exec{g->nodes};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t st)
{
    if (!e) return cudaErrorInvalidValue;
    emu_graph_launches++;
    return emu_submit(st, "cudaGraphLaunch", [e]() {
        for (auto &node : e->nodes) node();
    });
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    delete e;
    return cudaSuccess;
}
}
