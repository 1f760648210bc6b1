/* experts_mma_cuda.cu - the experts' grouped GEMMs on tensor cores, driven
 * from the device: no host synchronisation, any number of rows, weights in
 * bf16, f16, or MXFP4 / FP8_B128 / Q8_0 read in place (dequantised to bf16 in
 * shared memory, never widened in device memory).
 *
 * The rows of a step are in expert order (the dispatch plan's counts and
 * offsets).  A first kernel cuts each expert's rows into tiles of XM_BM
 * rows and lists them (expert's place in the weight stack, first row,
 * expert's end row); the list's length is bounded by n / XM_BM plus one
 * partial tile per expert, so the GEMM's grid depends on n and E alone and
 * a step can be recorded in a graph.  The GEMM's block (4 warps) computes
 * one tile of XM_BM rows x XM_BN outputs of out = A W_e^T: per stage of
 * XM_BK inputs it copies A's rows and W_e's rows into shared memory (rows
 * padded by 8 values, so the fragment reads are conflict-free; the next
 * stage's global loads are issued before this stage's products), then each
 * warp multiplies its 32 x 32 quarter with mma.sync m16n8k16 (fp32
 * accumulators).  Blocks past the list's length return at once.
 *
 * The gate+up GEMM reads its A rows straight from x (T, D) fp32 through
 * the plan's perm (row r of the step is token perm[r] / K) and rounds them
 * to the half type as it stores them into shared memory, as the cuBLAS
 * path's gather rounds them: no gathered copy is written, and the numbers
 * multiplied are the gathered rows'.  The down GEMM's A is the
 * activations the gate+up GEMM wrote (half, in expert order).
 *
 * MXFP4, FP8_B128 and Q8_0 weights become bf16 as the widening kernel makes them
 * (experts_cuda.cu: code x 2^14 or 2^8 x the block's scale, rounded once),
 * so this path and the widened cuBLAS path multiply the same numbers.
 *
 * Opt-in (MOERUN_CUDA_EXPERTS=mma, runtime/backend/backend_cuda_experts.c) until it
 * has run on a device; it passes under tools/cuda-emu, whose emulation of
 * mma.sync comes from the PTX ISA, not from this kernel. */
#include <string.h>

#include "experts/experts.h"
#include "experts/experts_cuda.h"
#include "experts/experts_cuda.cuh"
#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_mma.cuh"
#include "runtime/cuda/cuda_planes.cuh"
#include "runtime/cuda/cuda_util.h"

#define XM_BN 64           /* outputs of a tile */
#define XM_BK 32           /* inputs per stage */
#define XM_LD (XM_BK + 8)  /* shared row stride, in values */
#define XM_THREADS 128
#define FULL_MASK 0xffffffffu

/* The tile list: tiles[0] = count, then per tile (place, first row, end
 * row, expert).  One block of 256 threads walks the experts 256 at a time: each
 * thread counts its expert's tiles, a scan over the block places them. */
static __global__ void mma_tiles_kernel(int32_t *tiles, const int32_t *counts, const int32_t *offsets,
                                        const int32_t *wmap, int E, int n, int max_tiles)
{
    __shared__ int warp_n[8];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int base = 0; /* the same in every thread */
    for (int e0 = 0; e0 < E; e0 += 256) {
        const int e = e0 + (int)threadIdx.x;
        int c = 0, r0 = 0, s = -1;
        if (e < E) {
            c = counts[e], r0 = offsets[e];
            s = wmap ? wmap[e] : e;
        }
        const int nt = c > 0 && s >= 0 && r0 >= 0 && r0 <= n - c ? (c + MOE_EXPERT_MMA_BM - 1) / MOE_EXPERT_MMA_BM : 0;
        int incl = nt;
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl += v;
        }
        if (lane == 31) warp_n[w] = incl;
        __syncthreads();
        int before = 0, all = 0;
        for (int i = 0; i < 8; i++) {
            before += i < w ? warp_n[i] : 0;
            all += warp_n[i];
        }
        for (int j = 0, at = base + before + incl - nt; j < nt && at < max_tiles; j++, at++) {
            int32_t *p = tiles + 1 + 4 * (size_t)at;
            p[0] = s, p[1] = r0 + j * MOE_EXPERT_MMA_BM, p[2] = r0 + c, p[3] = e;
        }
        base += all;
        __syncthreads(); /* warp_n is rewritten next round */
    }
    if (threadIdx.x == 0) tiles[0] = min(base, max_tiles);
}

/* 16 consecutive values of a half matrix row into r (zeros past Kd or for
 * a row outside the tile: Kd % 8 == 0, so an 8-value load is all in or out). */
template <class HT>
__device__ __forceinline__ void load16(uint4 *r, const HT *row, bool ok, int k, int Kd)
{
#pragma unroll
    for (int c = 0; c < 2; c++)
        r[c] = ok && k + 8 * c < Kd ? __ldg((const uint4 *)(row + k + 8 * c)) : make_uint4(0, 0, 0, 0);
}

/* v rounded to HT as the grouped path's gather (moe_st) rounds it. */
template <class HT> __device__ __forceinline__ HT half_of(float v);
template <> __device__ __forceinline__ __nv_bfloat16 half_of(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half half_of(float v) { return __float2half_rn(v); }

/* The loader's share of an A stage, loaded into registers before the
 * stage's products and stored into shared memory (row-major, stride XM_LD)
 * after them; zeros past Kd or for a row outside the tile (ok false).
 * Half rows (n, Kd) in expert order (the down GEMM's activations): 16
 * consecutive values a part (half of the stage's 32), two 16-byte loads
 * into ra.  fp32 rows of x (the gate+up GEMM: row r of the step is token
 * perm[r] / K, no gathered copy), rounded to HT as they are stored: part
 * p takes values 8c + 4p .. 8c + 4p + 3 (c = 0..3) of the stage, four
 * 16-byte loads into rx, so a row's two loaders read whole 32-byte sectors
 * with each load, and the 8-byte stores of a half warp (8 rows 80 bytes
 * apart, both parts) fall in 32 distinct banks; Kd % 4 == 0, so a 4-value
 * load is all in or out. */
template <class HT, bool FROM_X>
__device__ __forceinline__ void load_a(uint4 *ra, float4 *rx, const void *row, bool ok, int k, int part,
                                       int Kd)
{
    if (FROM_X) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int i = k + 8 * c + 4 * part;
            rx[c] = ok && i < Kd ? __ldg((const float4 *)((const float *)row + i)) : make_float4(0, 0, 0, 0);
        }
    } else {
        load16<HT>(ra, (const HT *)row, ok, k + 16 * part, Kd);
    }
}

template <class HT, bool FROM_X>
__device__ __forceinline__ void store_a(HT *row, const uint4 *ra, const float4 *rx, int part)
{
    if (FROM_X) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const HT v[4] = {half_of<HT>(rx[c].x), half_of<HT>(rx[c].y), half_of<HT>(rx[c].z),
                             half_of<HT>(rx[c].w)};
            uint2 u;
            memcpy(&u, v, 8);
            *(uint2 *)(row + 8 * c + 4 * part) = u;
        }
    } else {
        ((uint4 *)(row + 16 * part))[0] = ra[0], ((uint4 *)(row + 16 * part))[1] = ra[1];
    }
}

/* The loader's share of a weight stage: 16 values of one weight row from
 * input k on (part: which 16 of the stage's 32).  Half weights: the values;
 * planes: the 16-byte load holding them and their block's scale, decoded
 * by store_w after this stage's products. */
template <enum moe_dtype WT, class HT>
__device__ __forceinline__ void load_w(uint4 *r, float *sc, const void *w, const void *ws, size_t wv,
                                       int k, int part, int Kd)
{
    if (WT == MOE_DTYPE_MXFP4) { /* one 32-value block: both parts load it */
        const size_t i = wv + (size_t)k;
        r[0] = __ldg((const uint4 *)((const uint8_t *)w + i / 2));
        *sc = qscale<WT>(ws, i);
    } else if (planes_dt<WT>) { /* FP8, Q8_0: 16 values of a block */
        const size_t i = wv + (size_t)k + 16 * (size_t)part;
        r[0] = __ldg((const uint4 *)((const uint8_t *)w + i));
        *sc = qscale<WT>(ws, i);
    } else {
        load16<HT>(r, (const HT *)w + wv, true, k + 16 * part, Kd);
    }
}

template <enum moe_dtype WT, class HT>
__device__ __forceinline__ void store_w(HT *dst, const uint4 *r, float sc, int part)
{
    if (!planes_dt<WT>) {
        ((uint4 *)dst)[0] = r[0], ((uint4 *)dst)[1] = r[1];
        return;
    }
    typedef qtraits<WT> Q;
    const uint32_t word[4] = {r[0].x, r[0].y, r[0].z, r[0].w};
    uint32_t pk[8];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float v[8];
        qword<WT>(v, word[j]);
        /* MXFP4: v[0..3] are elements 4j.. (low nibbles, part 0), v[4..7]
         * elements 16 + 4j.. (part 1); FP8, Q8_0: v[0..3] elements 4j.. of the load */
        const float *q4 = v + (Q::fp4 ? 4 * part : 0);
        pk[2 * j] = mma_half<HT>::pack(q4[0] * Q::unit * sc, q4[1] * Q::unit * sc);
        pk[2 * j + 1] = mma_half<HT>::pack(q4[2] * Q::unit * sc, q4[3] * Q::unit * sc);
    }
    ((uint4 *)dst)[0] = make_uint4(pk[0], pk[1], pk[2], pk[3]);
    ((uint4 *)dst)[1] = make_uint4(pk[4], pk[5], pk[6], pk[7]);
}

static __device__ __forceinline__ uint32_t ld32(const void *p) { return *(const uint32_t *)p; }

#define XM_SLD (XM_BN + 4) /* fp32 row stride of the epilogue's exchange */
#define XM_SA (MOE_EXPERT_MMA_BM * XM_LD) /* a stage of A, values */
#define XM_SB (XM_BN * XM_LD)             /* a stage of W, values */
#define XM_SMEM (4 * (XM_SA + XM_SB))     /* two stages of A and W, bytes */
static_assert(MOE_EXPERT_MMA_BM * XM_SLD * 4 <= XM_SMEM, "the epilogue's exchange fits the stages");

/* out (rows in expert order, N) in HT = A (rows, Kd) times W_s^T for the
 * tiles of the list, W_s the (N, Kd) matrix at place s of the stack w
 * (planes: values at w, scales at ws); A is a (rows, Kd) in HT, or for GLU
 * x (T, Kd) fp32 read through perm (load_a).  GLU: w is the gate+up stack
 * (2N rows a place), a block's 64 weight rows are the gate rows of 32
 * features and their up rows, and out = act(gate (+ b_gate), up (+ b_up))
 * with xb's biases and activation (the warps' accumulators exchanged
 * through shared memory; xb.b_down is the combine's). */
template <enum moe_dtype WT, class HT, bool GLU>
static __global__ void __launch_bounds__(XM_THREADS)
    expert_mma_kernel(HT *out, const void *a, const int32_t *perm, int K, const void *w, const void *ws,
                      const int32_t *tiles, int N, int Kd, struct expert_extra xb)
{
    typedef mma_half<HT> M;
    __shared__ __align__(16) unsigned char smem[XM_SMEM];
    /* stage b of A at sa + b * XM_SA, of W at sb + b * XM_SB (offsets: an
     * array of pointers indexed by the stage would live in local memory) */
    HT *const sa = (HT *)smem, *const sb = sa + 2 * XM_SA;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32; /* the warp's quarter */
    const int lr = threadIdx.x >> 1, part = threadIdx.x & 1; /* the loader's row and half stage */
    const int n0 = blockIdx.x * (GLU ? XM_BN / 2 : XM_BN), steps = (Kd + XM_BK - 1) / XM_BK, nt = tiles[0];
    for (int ti = blockIdx.y; ti < nt; ti += gridDim.y) {
        const int32_t *tp = tiles + 1 + 4 * (size_t)ti;
        const int s = tp[0], r0 = tp[1], rend = tp[2], e = tp[3];
        const bool arow = r0 + lr < rend;
        /* the loader's A row: its token's row of x (GLU), or its row of a */
        const void *ap = GLU ? (const void *)((const float *)a + (size_t)(arow ? perm[r0 + lr] / K : 0) * Kd)
                             : (const void *)((const HT *)a + (size_t)(arow ? r0 + lr : r0) * Kd);
        /* the loader's weight row (past N: the last, not stored) */
        const int f = min(n0 + (GLU ? lr & 31 : lr), N - 1);
        const size_t wv = (GLU ? (size_t)s * 2 * N + (lr < 32 ? f : N + f) : (size_t)s * N + f) * Kd;
        uint4 ra[2], rb[2];
        float4 rx[4];
        float sc = 0.0f;
        load_a<HT, GLU>(ra, rx, ap, arow, 0, part, Kd);
        load_w<WT, HT>(rb, &sc, w, ws, wv, 0, part, Kd);
        store_a<HT, GLU>(sa + lr * XM_LD, ra, rx, part);
        store_w<WT, HT>(sb + lr * XM_LD + 16 * part, rb, sc, part);
        __syncthreads();
        float acc[2][4][4] = {};
        for (int st = 0; st < steps; st++) {
            const int buf = st & 1;
            const bool more = st + 1 < steps;
            if (more) { /* the next stage's loads in flight during the products */
                load_a<HT, GLU>(ra, rx, ap, arow, (st + 1) * XM_BK, part, Kd);
                load_w<WT, HT>(rb, &sc, w, ws, wv, (st + 1) * XM_BK, part, Kd);
            }
            const HT *A = sa + buf * XM_SA, *B = sb + buf * XM_SB;
#pragma unroll
            for (int ks = 0; ks < XM_BK; ks += 16) {
                uint32_t af[2][4], bf[4][2];
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    const HT *p = A + (wm + mi * 16 + g) * XM_LD + ks + 2 * t;
                    af[mi][0] = ld32(p), af[mi][1] = ld32(p + 8 * XM_LD);
                    af[mi][2] = ld32(p + 8), af[mi][3] = ld32(p + 8 * XM_LD + 8);
                }
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const HT *p = B + (wn + ni * 8 + g) * XM_LD + ks + 2 * t;
                    bf[ni][0] = ld32(p), bf[ni][1] = ld32(p + 8);
                }
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) M::mma(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
            }
            if (more) {
                store_a<HT, GLU>(sa + (buf ^ 1) * XM_SA + lr * XM_LD, ra, rx, part);
                store_w<WT, HT>(sb + (buf ^ 1) * XM_SB + lr * XM_LD + 16 * part, rb, sc, part);
            }
            __syncthreads(); /* the stage read, the next one written */
        }
        if (!GLU) {
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const int col = n0 + wn + ni * 8 + 2 * t; /* N even: col + 1 < N too */
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = r0 + wm + mi * 16 + g + 8 * h;
                        if (r < rend && col < N)
                            *(uint32_t *)(out + (size_t)r * N + col) =
                                M::pack(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                    }
                }
            continue;
        }
        /* GLU: gate (columns 0-31) and up (32-63) of a row meet in shared
         * memory (free: the last stage ended with a barrier) */
        float *S = (float *)smem;
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(float2 *)(S + (wm + mi * 16 + g + 8 * h) * XM_SLD + wn + ni * 8 + 2 * t) =
                        make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        __syncthreads();
        for (int i = threadIdx.x; i < MOE_EXPERT_MMA_BM * (XM_BN / 2); i += XM_THREADS) {
            const int r = i / (XM_BN / 2), c = i % (XM_BN / 2), fo = n0 + c;
            if (r0 + r >= rend || fo >= N) continue;
            float gv = S[r * XM_SLD + c], uv = S[r * XM_SLD + XM_BN / 2 + c];
            if (xb.b_gate) {
                gv += xb.b_gate[(size_t)e * N + fo];
                uv += xb.b_up[(size_t)e * N + fo];
            }
            out[(size_t)(r0 + r) * N + fo] = half_of<HT>(moe_experts_act(gv, uv, xb.alpha, xb.limit));
        }
        __syncthreads(); /* S is the next tile's first stage */
    }
}

extern "C" enum moe_status moe_experts_mma_tiles_cuda(cudaStream_t st, int32_t *tiles,
                                                      const struct moe_dispatch *plan,
                                                      const int32_t *wmap, int n, int E)
{
    const size_t ints = moe_expert_mma_tile_ints(n, E);
    if (!ints || (ints - 1) / 4 > INT32_MAX)
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA expert tiles: %d rows over %d experts", n, E);
    mma_tiles_kernel<<<1, 256, 0, st>>>(tiles, plan->counts, plan->offsets, wmap, E, n,
                                        (int)((ints - 1) / 4));
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* Either GEMM of the step: GLU (the gate+up stack, A = x through perm,
 * biases and activation of ex) or the down GEMM (A = a in at). */
template <bool GLU>
static enum moe_status launch_mma(cudaStream_t st, void *out, const void *a, const int32_t *perm, int K,
                                  enum moe_dtype at, const void *w, enum moe_dtype wt, int Ew, int N, int Kd,
                                  const int32_t *tiles, int n, int E, const struct moe_expert_weights *ex)
{
    const bool planes = moe_dtype_planes(wt);
    if ((at != MOE_DTYPE_BF16 && at != MOE_DTYPE_F16) || (wt != at && !(planes && at == MOE_DTYPE_BF16)))
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA expert GEMM: %s weights with %s rows",
                        moe_dtype_name(wt), moe_dtype_name(at));
    const int blk = planes ? moe_dtype_block(wt) : 8;
    if (N <= 0 || Kd <= 0 || Ew <= 0 || N % 2 || Kd % blk)
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA expert GEMM: %d x %d matrices of %s", N, Kd,
                        moe_dtype_name(wt));
    if (GLU && K <= 0) return moe_fail(MOE_ERR_INVALID_ARG, "CUDA expert GEMM: %d experts a token", K);
    if (GLU && (uintptr_t)a % 16) /* 16-byte loads of x's rows (Kd % 8 == 0) */
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA expert GEMM: x at %p, not 16-byte aligned", a);
    const size_t ints = moe_expert_mma_tile_ints(n, E);
    if (!ints) return moe_fail(MOE_ERR_INVALID_ARG, "CUDA expert GEMM: %d rows over %d experts", n, E);
    if (n == 0) return MOE_OK;
    const size_t max_tiles = (ints - 1) / 4;
    const int per_block = GLU ? XM_BN / 2 : XM_BN; /* outputs */
    const dim3 grid((unsigned)((N + per_block - 1) / per_block),
                    (unsigned)(max_tiles < 65535 ? max_tiles : 65535));
    const size_t rows = GLU ? 2 * (size_t)N : (size_t)N; /* a place's rows in the stack */
    const void *ws = planes ? (const char *)w + moe_planes_values_bytes(wt, rows * Ew, (size_t)Kd) : NULL;
    const struct expert_extra xb = extra_of(ex); /* b_down: added by the combine */
#define XMMA(WT, HT)                                                                                 \
    expert_mma_kernel<WT, HT, GLU><<<grid, XM_THREADS, 0, st>>>((HT *)out, a, perm, K, w, ws, tiles, N, Kd, \
                                                                xb)
    switch (wt) {
    case MOE_DTYPE_BF16: XMMA(MOE_DTYPE_BF16, __nv_bfloat16); break;
    case MOE_DTYPE_F16: XMMA(MOE_DTYPE_F16, __half); break;
    case MOE_DTYPE_MXFP4: XMMA(MOE_DTYPE_MXFP4, __nv_bfloat16); break;
    case MOE_DTYPE_FP8_B128: XMMA(MOE_DTYPE_FP8_B128, __nv_bfloat16); break;
    case MOE_DTYPE_Q8_0: XMMA(MOE_DTYPE_Q8_0, __nv_bfloat16); break;
    default: return moe_fail(MOE_ERR_UNSUPPORTED, "CUDA expert GEMM: %s weights", moe_dtype_name(wt));
    }
#undef XMMA
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" enum moe_status moe_experts_mma_gate_up_cuda(cudaStream_t st, void *h, const float *x,
                                                        const int32_t *perm, int K, enum moe_dtype at,
                                                        const void *gu, enum moe_dtype wt, int Ew, int F,
                                                        int D, const int32_t *tiles, int n, int E,
                                                        const struct moe_expert_weights *ex)
{
    return launch_mma<true>(st, h, x, perm, K, at, gu, wt, Ew, F, D, tiles, n, E, ex);
}

extern "C" enum moe_status moe_experts_mma_down_cuda(cudaStream_t st, void *ye, const void *h,
                                                     enum moe_dtype at, const void *dn, enum moe_dtype wt,
                                                     int Ew, int D, int F, const int32_t *tiles, int n, int E)
{
    return launch_mma<false>(st, ye, h, NULL, 1, at, dn, wt, Ew, D, F, tiles, n, E, NULL);
}
