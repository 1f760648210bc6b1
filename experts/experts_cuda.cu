/* experts_cuda.cu - CUDA twins of experts/experts_cpu.c.
 *
 * Two paths compute the grouped expert FFN over the dispatch plan (pairs in
 * expert order, counts/offsets per expert), chosen by the backend
 * (runtime/backend_cuda.c) from the number of rows:
 *
 * - Small (decode): two kernels that read counts and offsets on the device,
 *   so a decode step never waits for the host.  Grid (feature tiles, E): a
 *   block of expert e returns at once when e has no rows; otherwise each
 *   warp owns one output feature, streams its weight row(s) with 16-byte
 *   loads and dots them with up to RT of the expert's rows at a time
 *   (inputs read straight from x through perm: no gather).  The up kernel
 *   fuses gate, up and SwiGLU; the down kernel writes ye in expert order.
 *   Every expert weight is read once per tile of RT rows, so at batch 1 the
 *   step reads each chosen expert's weights once.
 * - Grouped (prefill): the rows are gathered into a half-precision buffer
 *   in expert order, then cuBLAS grouped GEMMs do gate_up and down (launched
 *   from the backend); the pieces here are the gather, the SwiGLU over the
 *   (rows, 2F) gate_up output, and the combine.
 *
 * The combine is deterministic: out[t] = sum over k = 0..K-1 in order of
 * w[t,k] * ye[pos[t*K+k]], one thread per output element, no atomics. */
#include <math.h>

#include "experts/experts.h"
#include "runtime/cuda_dtype.cuh"
#include "runtime/cuda_util.h"

#define FFN_WARPS 8
#define UP_RT 4   /* rows per tile in the up kernel (x2 accumulators: gate, up) */
#define DOWN_RT 8 /* rows per tile in the down kernel */

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

/* 8 consecutive weights at w[i..i+7] as fp32 (16-byte aligned load). */
__device__ __forceinline__ void ld8(float *o, const void *w, enum moe_dtype dt, size_t i)
{
    if (dt == MOE_DTYPE_F32) {
        const float4 *p = (const float4 *)((const float *)w + i);
        float4 a = p[0], b = p[1];
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z,
        o[7] = b.w;
        return;
    }
    uint4 v = *(const uint4 *)((const uint16_t *)w + i);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (dt == MOE_DTYPE_BF16) {
            __nv_bfloat162 h = *(const __nv_bfloat162 *)&u[j];
            float2 f = __bfloat1622float2(h);
            o[2 * j] = f.x, o[2 * j + 1] = f.y;
        } else {
            __half2 h = *(const __half2 *)&u[j];
            float2 f = __half22float2(h);
            o[2 * j] = f.x, o[2 * j + 1] = f.y;
        }
    }
}

/* acc[r] += dot(w[0..n), xs[r][0..n)) over the warp (lane partial sums);
 * vec: n % 8 == 0 and rows 16-byte aligned. */
template <int RT>
__device__ __forceinline__ void warp_dots(float *acc, const void *w, enum moe_dtype dt, size_t wo,
                                          const float *const *xs, int nr, int n, bool vec)
{
    const int lane = threadIdx.x & 31;
    if (vec) {
        for (int i = lane * 8; i < n; i += 32 * 8) {
            float wf[8];
            ld8(wf, w, dt, wo + i);
#pragma unroll
            for (int r = 0; r < RT; r++) {
                if (r >= nr) break;
                const float4 *xp = (const float4 *)(xs[r] + i);
                float4 a = xp[0], b = xp[1];
                acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                          wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
            }
        }
    } else {
        for (int i = lane; i < n; i += 32) {
            float wv = moe_ld(w, dt, wo + i);
#pragma unroll
            for (int r = 0; r < RT; r++) {
                if (r >= nr) break;
                acc[r] += wv * xs[r][i];
            }
        }
    }
}

/* h (rows in expert order, F) = silu(x Wg^T) * (x Wu^T) for expert e's rows. */
static __global__ void __launch_bounds__(FFN_WARPS * 32)
    expert_up_kernel(float *h, const float *x, const int32_t *counts, const int32_t *offsets,
                     const int32_t *perm, const void *gu, enum moe_dtype dt, int K, int D, int F,
                     int E, int n_pairs, bool vec)
{
    const int e = blockIdx.y;
    if (e >= E) return;
    const int c = counts[e], r0 = offsets[e];
    if (c <= 0 || r0 < 0 || r0 + c > n_pairs) return;
    const int f = blockIdx.x * FFN_WARPS + (threadIdx.x >> 5);
    if (f >= F) return;
    const size_t wg = ((size_t)e * 2 * F + f) * D, wu = ((size_t)e * 2 * F + F + f) * D;
    for (int rt = 0; rt < c; rt += UP_RT) {
        const int nr = min(UP_RT, c - rt);
        const float *xs[UP_RT];
#pragma unroll
        for (int r = 0; r < UP_RT; r++)
            xs[r] = x + (size_t)(r < nr ? perm[r0 + rt + r] / K : 0) * D;
        float ag[UP_RT] = {0}, au[UP_RT] = {0};
        warp_dots<UP_RT>(ag, gu, dt, wg, xs, nr, D, vec);
        warp_dots<UP_RT>(au, gu, dt, wu, xs, nr, D, vec);
#pragma unroll
        for (int r = 0; r < UP_RT; r++) {
            if (r >= nr) break;
            float g = moe_warp_sum(ag[r]), u = moe_warp_sum(au[r]);
            if ((threadIdx.x & 31) == 0) h[(size_t)(r0 + rt + r) * F + f] = g / (1.0f + expf(-g)) * u;
        }
    }
}

/* ye (rows in expert order, D) = h Wd^T for expert e's rows. */
static __global__ void __launch_bounds__(FFN_WARPS * 32)
    expert_down_kernel(float *ye, const float *h, const int32_t *counts, const int32_t *offsets,
                       const void *dn, enum moe_dtype dt, int D, int F, int E, int n_pairs,
                       bool vec)
{
    const int e = blockIdx.y;
    if (e >= E) return;
    const int c = counts[e], r0 = offsets[e];
    if (c <= 0 || r0 < 0 || r0 + c > n_pairs) return;
    const int d = blockIdx.x * FFN_WARPS + (threadIdx.x >> 5);
    if (d >= D) return;
    const size_t wo = ((size_t)e * D + d) * F;
    for (int rt = 0; rt < c; rt += DOWN_RT) {
        const int nr = min(DOWN_RT, c - rt);
        const float *hs[DOWN_RT];
#pragma unroll
        for (int r = 0; r < DOWN_RT; r++) hs[r] = h + (size_t)(r0 + rt + (r < nr ? r : 0)) * F;
        float acc[DOWN_RT] = {0};
        warp_dots<DOWN_RT>(acc, dn, dt, wo, hs, nr, F, vec);
#pragma unroll
        for (int r = 0; r < DOWN_RT; r++) {
            if (r >= nr) break;
            float s = moe_warp_sum(acc[r]);
            if ((threadIdx.x & 31) == 0) ye[(size_t)(r0 + rt + r) * D + d] = s;
        }
    }
}

extern "C" enum moe_status moe_experts_ffn_small_cuda(cudaStream_t st, float *h, float *ye,
                                                      const float *x,
                                                      const struct moe_dispatch *plan,
                                                      const void *gu, const void *dn,
                                                      enum moe_dtype dt, int T, int K, int D,
                                                      int F, int E)
{
    if (T <= 0) return MOE_OK;
    if (E > 65535) return moe_fail(MOE_ERR_UNSUPPORTED, "CUDA experts: %d experts", E);
    /* 16-byte loads need rows that are multiples of 8 elements (cudaMalloc
     * bases are 256-byte aligned) */
    const bool vec = D % 8 == 0 && F % 8 == 0;
    const int n = T * K;
    dim3 g1((unsigned)((F + FFN_WARPS - 1) / FFN_WARPS), (unsigned)E);
    expert_up_kernel<<<g1, FFN_WARPS * 32, 0, st>>>(h, x, plan->counts, plan->offsets, plan->perm,
                                                    gu, dt, K, D, F, E, n, vec);
    MOE_CUDA_LAUNCHED();
    dim3 g2((unsigned)((D + FFN_WARPS - 1) / FFN_WARPS), (unsigned)E);
    expert_down_kernel<<<g2, FFN_WARPS * 32, 0, st>>>(ye, h, plan->counts, plan->offsets, dn, dt,
                                                      D, F, E, n, vec);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void gather_half_kernel(void *xe, const float *x, const int32_t *perm, int n,
                                          int K, int D, enum moe_dtype dt)
{
    const size_t m = (size_t)n * D;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / D;
        moe_st(xe, dt, i, x[(size_t)(perm[r] / K) * D + i % D]);
    }
}

extern "C" enum moe_status moe_experts_gather_half_cuda(cudaStream_t st, void *xe, const float *x,
                                                        const int32_t *perm, int n, int K, int D,
                                                        enum moe_dtype dt)
{
    if (n <= 0) return MOE_OK;
    gather_half_kernel<<<moe_cuda_blocks((size_t)n * D, 256), 256, 0, st>>>(xe, x, perm, n, K, D,
                                                                            dt);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void swiglu_half_kernel(void *h, const void *gu, int n, int F, enum moe_dtype dt)
{
    const size_t m = (size_t)n * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / F, f = i % F;
        const float g = moe_ld(gu, dt, r * 2 * F + f), u = moe_ld(gu, dt, r * 2 * F + F + f);
        moe_st(h, dt, i, g / (1.0f + expf(-g)) * u);
    }
}

extern "C" enum moe_status moe_experts_swiglu_half_cuda(cudaStream_t st, void *h, const void *gu,
                                                        int n, int F, enum moe_dtype dt)
{
    if (n <= 0) return MOE_OK;
    swiglu_half_kernel<<<moe_cuda_blocks((size_t)n * F, 256), 256, 0, st>>>(h, gu, n, F, dt);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void combine_kernel(float *out, const void *ye, enum moe_dtype ydt,
                                      const float *w, const int32_t *pos, int T, int K, int D)
{
    const size_t m = (size_t)T * D;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / D, d = i % D;
        float o = 0.0f;
        for (int k = 0; k < K; k++) {
            const int p = pos[t * K + k];
            o += w[t * K + k] * moe_ld(ye, ydt, (size_t)p * D + d);
        }
        out[i] = o;
    }
}

extern "C" enum moe_status moe_experts_combine_cuda(cudaStream_t st, float *out, const void *ye,
                                                    enum moe_dtype ydt, const float *w,
                                                    const int32_t *pos, int T, int K, int D)
{
    if (T <= 0) return MOE_OK;
    combine_kernel<<<moe_cuda_blocks((size_t)T * D, 256), 256, 0, st>>>(out, ye, ydt, w, pos, T, K,
                                                                        D);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
