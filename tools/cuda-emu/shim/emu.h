/* Host emulation of the CUDA features the moerun kernels use: each block's
 * threads are fibers on the launching thread (emu_fiber.cc), __syncthreads
 * / __syncwarp are barriers that switch to the next fiber, shuffles go
 * through per-warp slots.  Blocks run one after another. */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <functional>
#include <vector>
#include <memory>
#include <math.h>
#include "emu_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __align__(n) __attribute__((aligned(n)))

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
template <class T> static inline T __ldcs(const T *p) { return *p; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return float2{a, b}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }

extern thread_local uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

/* A barrier of a block's threads or of a warp's lanes: a fiber arriving
 * before the last switches to the others until the last arrives
 * (emu_fiber.cc); a thread that returns drops out of both of its own. */
struct emu_bar {
    int expected, arrived = 0;
    unsigned phase = 0;
    explicit emu_bar(int n) : expected(n) {}
    void arrive_and_wait();
    void arrive_and_drop();
};
struct emu_warp {
    emu_bar bar;
    uint64_t slots[32];
    uint32_t frag[32][6];  /* mma operands, lane by lane (emu_mma.h) */
    const void *rows[32];  /* ldmatrix row addresses */
    explicit emu_warp(int n) : bar(n) {}
};
struct emu_block_ctx {
    std::unique_ptr<emu_bar> bar;
    std::vector<std::unique_ptr<emu_warp>> warps;
    std::vector<unsigned char> dyn;
};
extern thread_local emu_block_ctx *emu_ctx;

static inline void __syncthreads() { emu_ctx->bar->arrive_and_wait(); }
static inline void __syncwarp(unsigned m = 0xffffffffu) { emu_ctx->warps[threadIdx.x >> 5]->bar.arrive_and_wait(); }
template <class T> static inline T emu_exchange(T v, int src)
{
    emu_warp &w = *emu_ctx->warps[threadIdx.x >> 5];
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    w.slots[threadIdx.x & 31] = u;
    w.bar.arrive_and_wait();
    uint64_t r = w.slots[src & 31];
    w.bar.arrive_and_wait();
    T out;
    memcpy(&out, &r, sizeof out);
    return out;
}
template <class T> static inline T __shfl_xor_sync(unsigned m, T v, int o) { return emu_exchange(v, (threadIdx.x & 31) ^ o); }
template <class T> static inline T __shfl_sync(unsigned m, T v, int s) { return emu_exchange(v, s); }
template <class T> static inline T __shfl_up_sync(unsigned m, T v, unsigned d)
{
    const unsigned lane = threadIdx.x & 31;
    return emu_exchange(v, (int)(lane >= d ? lane - d : lane));
}

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline size_t min(size_t a, size_t b) { return a < b ? a : b; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
using std::isnan;

template <class F> static inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }

struct emu_cfg { dim3 grid, block; size_t smem; cudaStream_t st; };
static inline emu_cfg emu_mk(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) { return emu_cfg{g, b, s, st}; }

/* Work on stream st (emu_stream.cc): run now, or recorded when st is
 * capturing; an error (a broken capture, legacy-stream work during one)
 * is returned and kept for cudaGetLastError. */
cudaError_t emu_submit(cudaStream_t st, const char *what, std::function<void()> work);
/* A call no capture may see (cudaMalloc, cudaMemcpy, ...): invalidates any
 * under way and returns the error; cudaSuccess when none is. */
cudaError_t emu_capture_forbids(const char *what);

extern long emu_blocks_run;
/* Every block of the grid, one after another, each thread of a block a
 * fiber running body(arg) (emu_fiber.cc). */
void emu_run_blocks(dim3 grid, dim3 block, size_t smem, void (*body)(void *), void *arg);
template <class... P, class... A>
static void emu_run_grid(void (*k)(P...), const emu_cfg &c, const A &...args)
{
    auto run = [&]() { k(args...); };
    emu_run_blocks(c.grid, c.block, c.smem, [](void *p) { (*(decltype(run) *)p)(); }, &run);
}
/* Launch counts (emu_count.cc): EMU_ENTRY opens each extern "C"
 * moe_*_cuda function (rewrite.pl); a launch is counted by its site and
 * the innermost entry point it runs under. */
struct emu_entry_guard {
    const char *prev;
    explicit emu_entry_guard(const char *f);
    ~emu_entry_guard();
};
#define EMU_ENTRY emu_entry_guard emu_entry_guard_(__func__)
void emu_count_launch(const char *site);
/* k<<<c>>>(args) at site "SRC:LINE kernel": the arguments are copied now,
 * as a launch copies them (a recorded launch replays with these values). */
template <class... P, class... A>
static void emu_launch(const char *site, void (*k)(P...), emu_cfg c, A... args)
{
    emu_count_launch(site);
    emu_submit(c.st, "kernel launch", [=]() { emu_run_grid(k, c, args...); });
}
#define EMU_DYN_SMEM(T) ((T *)(((uintptr_t)emu_ctx->dyn.data() + 15) & ~(uintptr_t)15))
/* additions for the planes and active-expert kernels */
template <class T> static inline T __ldg(const T *p) { return *p; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
/* IEEE single operations, never contracted (the host build has no FMA
 * contraction: -std=c++20 and no -mfma) */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
struct alignas(8) uint2 { unsigned x, y; };
static inline unsigned __ballot_sync(unsigned m, bool pred)
{
    emu_warp &w = *emu_ctx->warps[threadIdx.x >> 5];
    w.slots[threadIdx.x & 31] = pred ? 1 : 0;
    w.bar.arrive_and_wait();
    unsigned r = 0;
    const unsigned n = blockDim.x - (threadIdx.x & ~31u) < 32 ? blockDim.x - (threadIdx.x & ~31u) : 32;
    for (unsigned i = 0; i < n; i++) r |= (w.slots[i] ? 1u : 0u) << i;
    w.bar.arrive_and_wait();
    return r;
}
#include "emu_mma.h"
