/* experts_cuda.cu - CUDA twins of experts/experts_cpu.c.
 *
 * Two paths compute the grouped expert FFN over the dispatch plan (pairs in
 * expert order, counts/offsets per expert), chosen by the backend
 * (runtime/backend/backend_cuda.c) from the number of rows:
 *
 * - Small (decode): two kernels that read counts and offsets on the device,
 *   so a decode step never waits for the host.  Grid (feature tiles, E): a
 *   block of expert e returns at once when e has no rows; otherwise each
 *   warp streams a few weight rows together with evict-first 16-byte loads,
 *   several in flight per lane (the gate and up rows of one feature in the
 *   up kernel, two output features in the down kernel), and dots them with
 *   up to RT of the expert's rows at a time (inputs read straight from x
 *   through perm: no gather).  The up kernel fuses gate, up and SwiGLU; the
 *   down kernel writes ye in expert order.
 *   Every expert weight is read once per tile of RT rows, so at batch 1 the
 *   step reads each chosen expert's weights once.
 *   MXFP4, FP8_B128, Q8_0, four-bit and Q6_K experts (gpt-oss, fp8
 *   checkpoints, four-bit checkpoints, --quantize) are read in place from
 *   their planes (runtime/core/tensor.h): a lane's 16-byte load is 32 or
 *   16 values, decoded in registers (warp_dots_q).  The down kernel is
 *   instantiated for the down stack's own dtype (--quantize q4_k_m).
 * - Grouped (prefill): the rows are gathered into a half-precision buffer
 *   in expert order, then cuBLAS grouped GEMMs do gate_up and down (launched
 *   from the backend); the pieces here are the gather, the SwiGLU over the
 *   (rows, 2F) gate_up output, and the combine, plus the kernel that widens
 *   a layer's experts in planes with rows to bf16 for those GEMMs.
 *
 * The combine is deterministic: out[t] = sum over k = 0..K-1 in order of
 * w[t,k] * ye[pos[t*K+k]], one thread per output element, no atomics. */
#include <math.h>
#include <string.h>

#include "experts/experts.h"
#include "experts/experts_cuda.h"
#include "experts/experts_cuda.cuh"
#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_planes.cuh"
#include "runtime/cuda/cuda_util.h"

#define FFN_WARPS 8
#define FFN_MIN_BLOCKS 3 /* resident blocks per SM the register use must allow */
#define UP_RT 4   /* rows per tile in the up kernel (x2 accumulators: gate, up) */
#define UP_U 2    /* 16-byte loads in flight per lane and weight row, up kernel */
#define DOWN_RT 8 /* rows per tile in the down kernel */
#define DOWN_NW 2 /* output features per warp in the down kernel */
#define DOWN_U 2

/* The expert whose rows (in expert order) hold row r: the e with
 * offsets[e] <= r < offsets[e + 1] (a binary search; empty experts skipped). */
static __device__ __forceinline__ int expert_of_row(const int32_t *offsets, int E, int r)
{
    int lo = 0, hi = E; /* offsets[lo] <= r < offsets[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (offsets[mid] <= r) lo = mid;
        else hi = mid;
    }
    return lo;
}

static __global__ void swiglu_kernel(float *g, const float *u, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

extern "C" enum moe_status moe_experts_swiglu_cuda(cudaStream_t st, float *g, const float *u,
                                                   size_t n)
{
    if (n == 0) return MOE_OK;
    swiglu_kernel<<<moe_cuda_blocks(n, 256), 256, 0, st>>>(g, u, n);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* The input rows of a tile: gathered through perm (up kernel), or
 * consecutive rows of the expert-ordered hidden buffer (down kernel, which
 * keeps no pointer per row: fewer registers; strided_rows in
 * runtime/cuda/cuda_planes.cuh). */
template <int RT> struct gathered_rows {
    const float *p[RT];
    __device__ const float *row(int r) const { return p[r]; }
};

/* h (rows in expert order, F) = silu(x Wg^T) * (x Wu^T) for expert e's rows:
 * a warp per feature f, its gate and up rows streamed together. */
template <enum moe_dtype DT>
static __global__ void __launch_bounds__(FFN_WARPS * 32, FFN_MIN_BLOCKS)
    expert_up_kernel(float *h, const float *x, const int32_t *active, const int32_t *counts,
                     const int32_t *offsets, const int32_t *perm, const int32_t *wmap,
                     const void *gu, const void *gus, struct expert_extra xb, int K, int D, int F, int E, int n_pairs, bool vec)
{
    if ((int)blockIdx.y >= active[0]) return;
    const int e = active[1 + blockIdx.y];
    if (e < 0 || e >= E) return;
    const int c = counts[e], r0 = offsets[e];
    if (c <= 0 || r0 < 0 || r0 + c > n_pairs) return;
    const int s = wmap ? wmap[e] : e; /* its place in the weight stack */
    if (s < 0) return;
    const int f = blockIdx.x * FFN_WARPS + (threadIdx.x >> 5);
    if (f >= F) return;
    const size_t wo[2] = {((size_t)s * 2 * F + f) * D, ((size_t)s * 2 * F + F + f) * D};
    for (int rt = 0; rt < c; rt += UP_RT) {
        const int nr = min(UP_RT, c - rt);
        gathered_rows<UP_RT> xs;
#pragma unroll
        for (int r = 0; r < UP_RT; r++) /* perm NULL: x already in expert order */
            xs.p[r] = x + (size_t)(r >= nr ? 0 : perm ? perm[r0 + rt + r] / K : r0 + rt + r) * D;
        float acc[2][UP_RT] = {};
        weight_dots<DT, UP_RT, 2, UP_U>(acc, gu, gus, wo, xs, nr, D, vec, c <= UP_RT);
#pragma unroll
        for (int r = 0; r < UP_RT; r++) {
            if (r >= nr) break;
            float g = moe_warp_sum(acc[0][r]), u = moe_warp_sum(acc[1][r]);
            if (xb.b_gate) {
                g += xb.b_gate[(size_t)e * F + f];
                u += xb.b_up[(size_t)e * F + f];
            }
            if ((threadIdx.x & 31) == 0)
                h[(size_t)(r0 + rt + r) * F + f] = moe_experts_act(g, u, xb.alpha, xb.limit);
        }
    }
}

/* ye (rows in expert order, D) = h Wd^T for expert e's rows: a warp per
 * DOWN_NW consecutive output features, sharing the loads of h. */
template <enum moe_dtype DT>
static __global__ void __launch_bounds__(FFN_WARPS * 32, FFN_MIN_BLOCKS)
    expert_down_kernel(float *ye, const float *h, const int32_t *active, const int32_t *counts,
                       const int32_t *offsets, const int32_t *wmap, const void *dn, const void *dns,
                       const float *b_down,
                       int D, int F, int E, int n_pairs, bool vec)
{
    if ((int)blockIdx.y >= active[0]) return;
    const int e = active[1 + blockIdx.y];
    if (e < 0 || e >= E) return;
    const int c = counts[e], r0 = offsets[e];
    if (c <= 0 || r0 < 0 || r0 + c > n_pairs) return;
    const int s = wmap ? wmap[e] : e;
    if (s < 0) return;
    const int d0 = (blockIdx.x * FFN_WARPS + (threadIdx.x >> 5)) * DOWN_NW;
    if (d0 >= D) return;
    size_t wo[DOWN_NW];
#pragma unroll
    for (int k = 0; k < DOWN_NW; k++) /* past D: repeat the last row, not stored */
        wo[k] = ((size_t)s * D + min(d0 + k, D - 1)) * F;
    for (int rt = 0; rt < c; rt += DOWN_RT) {
        const int nr = min(DOWN_RT, c - rt);
        const strided_rows hs = {h + (size_t)(r0 + rt) * F, F};
        float acc[DOWN_NW][DOWN_RT] = {};
        /* planes: one load per row in flight (registers: the block partials) */
        constexpr int U = planes_dt<DT> ? 1 : DOWN_U;
        weight_dots<DT, DOWN_RT, DOWN_NW, U>(acc, dn, dns, wo, hs, nr, F, vec, c <= DOWN_RT);
#pragma unroll
        for (int k = 0; k < DOWN_NW; k++) {
            if (d0 + k >= D) break;
#pragma unroll
            for (int r = 0; r < DOWN_RT; r++) {
                if (r >= nr) break;
                float s = moe_warp_sum(acc[k][r]);
                if (b_down) s += b_down[(size_t)e * D + d0 + k];
                if ((threadIdx.x & 31) == 0) ye[(size_t)(r0 + rt + r) * D + d0 + k] = s;
            }
        }
    }
}

/* active[0] = the number of experts with rows, active[1..] their ids in
 * ascending order: one block of 256 threads walks the counts 256 at a time
 * (a ballot and the warps' popcounts place each id). */
static __global__ void active_experts_kernel(int32_t *active, const int32_t *counts, int E)
{
    __shared__ int warp_n[8];
    int base = 0; /* the same in every thread */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int e0 = 0; e0 < E; e0 += 256) {
        const int e = e0 + (int)threadIdx.x;
        const bool on = e < E && counts[e] > 0;
        const unsigned m = __ballot_sync(0xffffffffu, on);
        if (lane == 0) warp_n[w] = __popc(m);
        __syncthreads();
        int before = 0, all = 0;
        for (int i = 0; i < 8; i++) {
            before += i < w ? warp_n[i] : 0;
            all += warp_n[i];
        }
        if (on) active[1 + base + before + __popc(m & ((1u << lane) - 1u))] = e;
        base += all;
        __syncthreads(); /* warp_n is rewritten next round */
    }
    if (threadIdx.x == 0) active[0] = base;
}

/* out (n, W) in odt (F32, F16 or BF16), rows in expert order: row r is
 * row perm[r] / K of in (perm NULL: row r), its columns in the order of
 * its expert's cols (cols (E, W), expert e's order at e*W: act-order
 * four-bit experts, moe_expert_weights.cols; NULL: as they are). */
static __global__ void gather_kernel(void *out, enum moe_dtype odt, const float *in, const int32_t *perm, int K,
                                     const int32_t *cols, const int32_t *offsets, int E, int n, int W)
{
    const size_t m = (size_t)n * W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / W, j = i % W;
        const size_t c = cols ? (size_t)cols[(size_t)expert_of_row(offsets, E, (int)r) * W + j] : j;
        moe_st(out, odt, i, in[(perm ? (size_t)(perm[r] / K) : r) * W + c]);
    }
}

static enum moe_status gather(cudaStream_t st, void *out, enum moe_dtype odt, const float *in, const int32_t *perm,
                              int K, const int32_t *cols, const int32_t *offsets, int E, int n, int W)
{
    if (n <= 0) return MOE_OK;
    gather_kernel<<<moe_cuda_blocks((size_t)n * W, 256), 256, 0, st>>>(out, odt, in, perm, K, cols, offsets, E, n,
                                                                       W);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* The weight dtypes the decode kernels take (X(DT) for each). */
#define SMALL_DTYPES(X)                                                                                           \
    X(MOE_DTYPE_F32) X(MOE_DTYPE_F16) X(MOE_DTYPE_BF16) X(MOE_DTYPE_MXFP4) X(MOE_DTYPE_FP8_B128) X(MOE_DTYPE_Q8_0) \
    X(MOE_DTYPE_Q4_1) X(MOE_DTYPE_Q4_G32) X(MOE_DTYPE_Q4_G128) X(MOE_DTYPE_Q4_K) X(MOE_DTYPE_Q6_K)

/* The decode path's kernels, the up kernel's instance for the gate and up
 * stack's dtype dt, the down kernel's for the down stack's ddt;
 * act-order experts (gcols, dcols: their input and down column orders,
 * (E, D) and (E, F)) first gather x into xg and reorder h into hp. */
static enum moe_status launch_small(cudaStream_t st, dim3 g1, dim3 g2, float *h, float *ye, const float *x,
                                   const struct moe_dispatch *plan, int32_t *active, const int32_t *wmap,
                                   const void *gu, const void *gus, const void *dn, const void *dns,
                                   struct expert_extra xb, enum moe_dtype dt, enum moe_dtype ddt, int K, int D,
                                   int F, int E, int n, bool vec, const int32_t *gcols, const int32_t *dcols,
                                   float *xg, float *hp)
{
    active_experts_kernel<<<1, 256, 0, st>>>(active, plan->counts, E);
    MOE_CUDA_LAUNCHED();
    const int32_t *perm = plan->perm;
    if (gcols) {
        MOE_TRY(gather(st, xg, MOE_DTYPE_F32, x, perm, K, gcols, plan->offsets, E, n, D));
        x = xg, perm = NULL;
    }
#define UP(DT)                                                                                                    \
    case DT:                                                                                                      \
        expert_up_kernel<DT><<<g1, FFN_WARPS * 32, 0, st>>>(h, x, active, plan->counts, plan->offsets, perm, wmap, \
                                                            gu, gus, xb, K, D, F, E, n, vec);                     \
        break;
    switch (dt) {
        SMALL_DTYPES(UP)
    default: return moe_fail(MOE_ERR_UNSUPPORTED, "CUDA experts: %s weights", moe_dtype_name(dt));
    }
#undef UP
    MOE_CUDA_LAUNCHED();
    if (dcols) {
        MOE_TRY(gather(st, hp, MOE_DTYPE_F32, h, NULL, 1, dcols, plan->offsets, E, n, F));
        h = hp;
    }
#define DOWN(DT)                                                                                                  \
    case DT:                                                                                                      \
        expert_down_kernel<DT><<<g2, FFN_WARPS * 32, 0, st>>>(ye, h, active, plan->counts, plan->offsets, wmap,   \
                                                              dn, dns, xb.b_down, D, F, E, n, vec);               \
        break;
    switch (ddt) {
        SMALL_DTYPES(DOWN)
    default: return moe_fail(MOE_ERR_UNSUPPORTED, "CUDA experts: %s down weights", moe_dtype_name(ddt));
    }
#undef DOWN
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" enum moe_status moe_experts_ffn_small_cuda(cudaStream_t st, float *h, float *ye, float *xg,
                                                      float *hp, const float *x,
                                                      const struct moe_dispatch *plan, int32_t *active,
                                                      const int32_t *wmap, int Ew, const void *gu,
                                                      const void *dn,
                                                      const struct moe_expert_weights *ex,
                                                      enum moe_dtype dt, enum moe_dtype ddt, int T, int K,
                                                      int D, int F, int E)
{
    const struct expert_extra xb = extra_of(ex);
    if (T <= 0) return MOE_OK;
    if (E > 65535) return moe_fail(MOE_ERR_UNSUPPORTED, "CUDA experts: %d experts", E);
    /* 16-byte loads need rows that are multiples of 8 elements (cudaMalloc
     * bases are 256-byte aligned) */
    const bool vec = D % 8 == 0 && F % 8 == 0;
    const int n = T * K;
    /* grid.y: one row of blocks per expert with rows, at most T*K of them
     * (the launch depends on T alone: recordable in a graph) */
    const unsigned ny = (unsigned)(n < E ? n : E);
    dim3 g1((unsigned)((F + FFN_WARPS - 1) / FFN_WARPS), ny);
    const int dw = (D + DOWN_NW - 1) / DOWN_NW; /* warps per expert in the down kernel */
    dim3 g2((unsigned)((dw + FFN_WARPS - 1) / FFN_WARPS), ny);
    /* planes (MXFP4, FP8_B128, Q8_0, four-bit, Q6_K): the scales follow the
     * values of all Ew experts of each stack */
    const void *gus = NULL, *dns = NULL;
    const enum moe_dtype dts[2] = {dt, ddt};
    for (int i = 0; i < 2; i++)
        if (moe_dtype_planes(dts[i]) && (D % moe_dtype_block(dts[i]) || F % moe_dtype_block(dts[i])))
            return moe_fail(MOE_ERR_INVALID_ARG, "CUDA experts: %s rows of %d and %d values",
                            moe_dtype_name(dts[i]), D, F);
    if (moe_dtype_planes(dt)) gus = (const char *)gu + moe_planes_values_bytes(dt, 2 * (size_t)F * Ew, (size_t)D);
    if (moe_dtype_planes(ddt)) dns = (const char *)dn + moe_planes_values_bytes(ddt, (size_t)D * Ew, (size_t)F);
    /* one instantiation per weight type: no dtype branch in the inner loop */
    const int32_t *gcols = ex && ex->cols ? ex->cols[0] : NULL, *dcols = ex && ex->cols ? ex->cols[1] : NULL;
    if ((gcols || dcols) && (!xg || !hp))
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA experts: act-order experts without scratch");
    return launch_small(st, g1, g2, h, ye, x, plan, active, wmap, gu, gus, dn, dns, xb, dt, ddt, K, D, F, E, n, vec,
                        gcols, dcols, xg, hp);
}

/* ---- planes widened to bf16 for the grouped path ----
 * One thread per 16-byte load of values; experts without rows (counts[e]
 * == 0) are skipped.  Each value is the CPU's fp32 value (code x scale;
 * four-bit: q x d, rounded, + m, rounded; Q6_K: (d sc) x (q - 32)),
 * rounded once to bf16 (exact for MXFP4 within bf16's range). */
template <enum moe_dtype DT>
static __global__ void widen_planes_kernel(__nv_bfloat16 *dst, const void *src, const void *scales,
                                           const int32_t *counts, size_t per_expert, size_t n_loads)
{
    typedef qtraits<DT> Q;
    for (size_t l = blockIdx.x * (size_t)blockDim.x + threadIdx.x; l < n_loads;
         l += (size_t)gridDim.x * blockDim.x) {
        const size_t i = l * Q::per_load; /* first value */
        if (counts && counts[i / per_expert] <= 0) continue;
        const uint8_t *hp = NULL;
        const uint4 wq = __ldcs((const uint4 *)qload_at<DT>((const uint8_t *)src, i, &hp));
        uint2 wh = {0, 0};
        if (Q::q6) wh = __ldcs((const uint2 *)hp);
        /* four-bit: d and m of the group in one decode (Q4_K's from its
         * block's head); Q6_K: the scales of its two sub-blocks */
        const float2 dm = Q::q4 ? q4_dm<DT>(scales, i) : Q::q6 ? q6_scales(scales, i)
                                                      : make_float2(qscale<DT>(scales, i), 0.0f);
        const float sc = dm.x, mn = dm.y;
        const uint32_t word[4] = {wq.x, wq.y, wq.z, wq.w};
        __nv_bfloat16 *o = dst + i; /* 32-byte aligned: 8-byte stores of 4 values */
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float v[8];
            qword<DT>(v, word[j], Q::q6 ? (j < 2 ? wh.x : wh.y) >> (16 * (j & 1)) & 0xffffu : 0);
#pragma unroll
            for (int half = 0; half < (Q::nib ? 2 : 1); half++) {
                float f[4];
#pragma unroll
                for (int t = 0; t < 4; t++)
                    f[t] = Q::q4   ? __fadd_rn(__fmul_rn(v[4 * half + t], sc), mn)
                           : Q::q6 ? __fmul_rn(half ? mn : sc, v[4 * half + t])
                                   : v[4 * half + t] * Q::unit * sc;
                const __nv_bfloat162 a = __floats2bfloat162_rn(f[0], f[1]), b = __floats2bfloat162_rn(f[2], f[3]);
                uint2 p;
                memcpy(&p.x, &a, 4);
                memcpy(&p.y, &b, 4);
                *(uint2 *)(o + 16 * half + 4 * j) = p;
            }
        }
    }
}

/* The widening of rows x K values in planes (values, scales) into dst. */
static enum moe_status widen(cudaStream_t st, void *dst, const void *src, const void *scales, enum moe_dtype dt,
                             size_t rows, size_t K, int E, const int32_t *counts)
{
    if (!moe_dtype_planes(dt))
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA widen: %s weights", moe_dtype_name(dt));
    if (E <= 0 || rows % (size_t)E || K % (size_t)moe_dtype_block(dt))
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA widen: %zu rows of %zu over %d experts", rows, K, E);
    if (rows == 0) return MOE_OK;
    const size_t n = rows * K,
                 per_load = dt == MOE_DTYPE_MXFP4 || moe_dtype_is_q4(dt) || dt == MOE_DTYPE_Q6_K ? 32 : 16;
    __nv_bfloat16 *d = (__nv_bfloat16 *)dst;
    const size_t per_expert = n / (size_t)E, loads = n / per_load;
    const unsigned grid = moe_cuda_blocks(loads, 256);
#define WIDEN(DT) widen_planes_kernel<DT><<<grid, 256, 0, st>>>(d, src, scales, counts, per_expert, loads)
    if (dt == MOE_DTYPE_MXFP4) WIDEN(MOE_DTYPE_MXFP4);
    else if (dt == MOE_DTYPE_FP8_B128) WIDEN(MOE_DTYPE_FP8_B128);
    else if (dt == MOE_DTYPE_Q8_0) WIDEN(MOE_DTYPE_Q8_0);
    else if (dt == MOE_DTYPE_Q4_1) WIDEN(MOE_DTYPE_Q4_1);
    else if (dt == MOE_DTYPE_Q4_G32) WIDEN(MOE_DTYPE_Q4_G32);
    else if (dt == MOE_DTYPE_Q4_G128) WIDEN(MOE_DTYPE_Q4_G128);
    else if (dt == MOE_DTYPE_Q6_K) WIDEN(MOE_DTYPE_Q6_K);
    else if (dt == MOE_DTYPE_Q4_K) WIDEN(MOE_DTYPE_Q4_K);
    else return moe_fail(MOE_ERR_INVALID_ARG, "CUDA widen: no kernel for %s weights", moe_dtype_name(dt));
#undef WIDEN
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" enum moe_status moe_experts_widen_cuda(cudaStream_t st, void *dst, const void *src,
                                                  enum moe_dtype dt, size_t rows, size_t K, int E,
                                                  const int32_t *counts)
{
    const void *scales = moe_dtype_planes(dt) ? (const char *)src + moe_planes_values_bytes(dt, rows, K) : NULL;
    return widen(st, dst, src, scales, dt, rows, K, E, counts);
}

extern "C" enum moe_status moe_planes_widen_cuda(cudaStream_t st, void *dst, const void *values,
                                                 const void *scales, enum moe_dtype dt, size_t rows, size_t K)
{
    return widen(st, dst, values, scales, dt, rows, K, 1, NULL);
}

extern "C" enum moe_status moe_experts_gather_half_cuda(cudaStream_t st, void *xe, const float *x,
                                                        const int32_t *perm, int n, int K, int D,
                                                        enum moe_dtype dt, const int32_t *cols,
                                                        const int32_t *offsets, int E)
{
    return gather(st, xe, dt, x, perm, K, cols, offsets, E, n, D);
}

/* h[r][j] = the activation of gate/up feature f = j (act-order experts:
 * f = dcols[e*F + j], e row r's expert: the down matrix's column order) */
static __global__ void swiglu_half_kernel(void *h, const void *gu, int n, int F, enum moe_dtype dt,
                                          const int32_t *offsets, int E, struct expert_extra xb,
                                          const int32_t *dcols)
{
    const size_t m = (size_t)n * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / F, j = i % F;
        const size_t e = xb.b_gate || dcols ? (size_t)expert_of_row(offsets, E, (int)r) : 0;
        const size_t f = dcols ? (size_t)dcols[e * F + j] : j;
        float g = moe_ld(gu, dt, r * 2 * F + f), u = moe_ld(gu, dt, r * 2 * F + F + f);
        if (xb.b_gate) {
            g += xb.b_gate[e * F + f];
            u += xb.b_up[e * F + f];
        }
        moe_st(h, dt, i, moe_experts_act(g, u, xb.alpha, xb.limit));
    }
}

extern "C" enum moe_status moe_experts_swiglu_half_cuda(cudaStream_t st, void *h, const void *gu,
                                                        int n, int F, enum moe_dtype dt,
                                                        const int32_t *offsets, int E,
                                                        const struct moe_expert_weights *ex)
{
    if (n <= 0) return MOE_OK;
    const int32_t *dcols = ex && ex->cols ? ex->cols[1] : NULL;
    swiglu_half_kernel<<<moe_cuda_blocks((size_t)n * F, 256), 256, 0, st>>>(h, gu, n, F, dt, offsets,
                                                                            E, extra_of(ex), dcols);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void combine_kernel(float *out, const void *ye, enum moe_dtype ydt,
                                      const float *w, const int32_t *pos, int T, int K, int D,
                                      const int32_t *offsets, int E, const float *b_down)
{
    const size_t m = (size_t)T * D;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / D, d = i % D;
        float o = 0.0f;
        for (int k = 0; k < K; k++) {
            const int p = pos[t * K + k];
            float y = moe_ld(ye, ydt, (size_t)p * D + d);
            if (b_down) y += b_down[(size_t)expert_of_row(offsets, E, p) * D + d];
            o += w[t * K + k] * y;
        }
        out[i] = o;
    }
}

/* One block a row: the rows of the experts map places into dst. */
static __global__ void take_rows_kernel(float *dst, const void *src, enum moe_dtype dt, const int32_t *map,
                                        const int32_t *offsets, int E, int D, const float *b_down)
{
    const int r = blockIdx.x, e = expert_of_row(offsets, E, r);
    if (map[e] < 0) return;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float y = moe_ld(src, dt, (size_t)r * D + d);
        if (b_down) y += b_down[(size_t)e * D + d];
        dst[(size_t)r * D + d] = y;
    }
}

extern "C" enum moe_status moe_experts_take_rows_cuda(cudaStream_t st, float *dst, const void *src,
                                                      enum moe_dtype dt, const int32_t *map,
                                                      const int32_t *offsets, int E, int n, int D,
                                                      const float *b_down)
{
    if (n <= 0 || D <= 0) return MOE_OK;
    take_rows_kernel<<<n, 128, 0, st>>>(dst, src, dt, map, offsets, E, D, b_down);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" enum moe_status moe_experts_combine_cuda(cudaStream_t st, float *out, const void *ye,
                                                    enum moe_dtype ydt, const float *w,
                                                    const int32_t *pos, int T, int K, int D,
                                                    const int32_t *offsets, int E,
                                                    const float *b_down)
{
    if (T <= 0) return MOE_OK;
    combine_kernel<<<moe_cuda_blocks((size_t)T * D, 256), 256, 0, st>>>(out, ye, ydt, w, pos, T, K,
                                                                        D, offsets, E, b_down);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
