/* cuda_planes.cuh - the warp dot products the decode expert kernels
 * (experts/experts_cuda.cu) and the small-step dense matmul
 * (runtime/cuda/matmul_cuda.cu) share: MXFP4, FP8_B128, Q8_0, Q6_K and the
 * four-bit formats' weights read in place from their planes (runtime/core/tensor.h, moe_planes_from_rows),
 * F32, BF16 and F16 weights as stored.  Each input row's sums run in an
 * order fixed by the weight row's length alone, never by how many rows
 * share the call: a row's result does not depend on the other rows. */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "runtime/core/tensor.h"
#include "runtime/cuda/cuda_dtype.cuh"

/* A 16-byte weight load: evict-first (__ldcs) when the weights are read
 * once in the call, so they do not push the activations out of L1 and L2;
 * through the read-only cache (__ldg) when they will be read again (an
 * expert with more rows than one tile), so the second read hits L2. */
template <class V> __device__ __forceinline__ V ld_weights(const V *p, bool once)
{
    return once ? __ldcs(p) : __ldg(p);
}

/* Consecutive input rows of one buffer: row r at base + r * stride. */
struct strided_rows {
    const float *base;
    int stride;
    __device__ const float *row(int r) const { return base + (size_t)r * stride; }
};

/* ---- MXFP4, FP8_B128, Q8_0 and four-bit weights, read in place (the
 * planes layout of runtime/core/tensor.h: a 16-byte load is one MXFP4 block
 * of 32 values, or 16 FP8 values of one 128-value block, or 16 Q8_0 codes
 * of one 32-value block, or 32 four-bit codes of one group) ----
 * Two codes become a half2 by placing their bits (moe_e2m1x2_half_bits,
 * moe_e4m3x2_half_bits: the code's value times 2^-14 or 2^-8, exactly),
 * the half2 two floats exactly, and the 2^14 or 2^8 is folded into the
 * block's scale, which multiplies each block's partial dot product once. */
__device__ __forceinline__ float2 half2_bits(uint32_t u)
{
    __half2 h;
    memcpy(&h, &u, 4);
    return __half22float2(h);
}

/* Nibbles 0-3 (x) and 16-19 (y) of t: two E2M1 codes. */
__device__ __forceinline__ float2 e2m1x2(uint32_t t) { return half2_bits(moe_e2m1x2_half_bits(t)); }

/* Bytes 0 (x) and 2 (y) of t: two E4M3 codes. */
__device__ __forceinline__ float2 e4m3x2(uint32_t t) { return half2_bits(moe_e4m3x2_half_bits(t)); }

/* Byte j of t, an int8 Q8_0 code, as its value (moe_q8_f32_bits). */
__device__ __forceinline__ float q8(uint32_t t, int j)
{
    return __uint_as_float(moe_q8_f32_bits(t, j)) - MOE_Q8_F32_BIAS;
}

/* Nibbles 0-3 (x) and 16-19 (y) of t: two unsigned four-bit codes, as
 * the halves 1024 + q (their bits under 0x6400) less 1024, exactly. */
__device__ __forceinline__ float2 u4x2(uint32_t t)
{
    const float2 f = half2_bits((t & 0x000f000fu) | 0x64006400u);
    return make_float2(f.x - 1024.0f, f.y - 1024.0f);
}

/* Whether DT is read from planes (moe_dtype_planes, at compile time). */
template <enum moe_dtype DT>
constexpr bool planes_dt = DT == MOE_DTYPE_MXFP4 || DT == MOE_DTYPE_FP8_B128 || DT == MOE_DTYPE_Q8_0 ||
                           DT == MOE_DTYPE_Q4_1 || DT == MOE_DTYPE_Q4_G32 || DT == MOE_DTYPE_Q4_G128 ||
                           DT == MOE_DTYPE_Q4_K || DT == MOE_DTYPE_Q6_K;

template <enum moe_dtype DT> struct qtraits {
    static constexpr bool fp4 = DT == MOE_DTYPE_MXFP4;
    static constexpr bool q8 = DT == MOE_DTYPE_Q8_0;
    /* the four-bit formats: value q * d + m per group (runtime/core/tensor.h) */
    static constexpr bool q4 = DT == MOE_DTYPE_Q4_1 || DT == MOE_DTYPE_Q4_G32 || DT == MOE_DTYPE_Q4_G128 ||
                               DT == MOE_DTYPE_Q4_K;
    /* Q6_K: value (d sc_A) (q - 32) or (d sc_B) (q - 32), a load's low
     * nibbles of sub-block A, its high ones of B (two scales a load) */
    static constexpr bool q6 = DT == MOE_DTYPE_Q6_K;
    static constexpr bool nib = fp4 || q4 || q6;     /* a 16-byte load of two values a byte */
    static constexpr int per_load = nib ? 32 : 16;   /* values in a 16-byte load */
    static constexpr int block = fp4 ? MOE_MXFP4_BLOCK : q8 ? MOE_Q8_0_BLOCK : DT == MOE_DTYPE_Q4_G128 ? 128
                                 : DT == MOE_DTYPE_Q4_K || q6 ? 256 : q4 ? 32 : MOE_FP8_BLOCK;
    static constexpr float unit = fp4 ? 16384.0f : q8 || q4 || q6 ? 1.0f : 256.0f; /* qword's values times this */
};

/* Two Q6_K codes of low-nibble word w and high-bit word c at shift s as
 * their q - 32 (moe_q6_k_half_bits). */
__device__ __forceinline__ float2 q6x2(uint32_t w, uint32_t c, int s)
{
    const float2 f = half2_bits(moe_q6_k_half_bits(w, c, s));
    return make_float2(f.x - MOE_Q6_K_HALF_BIAS, f.y - MOE_Q6_K_HALF_BIAS);
}

/* The 8 (MXFP4, four-bit, Q6_K) or 4 (FP8, Q8_0) values of word j of a
 * 16-byte load, times 2^14, 2^8 or 1, at their offsets o[] in the load:
 * nibble bytes 4j..4j+3 hold elements 4j..4j+3 (low nibbles) and
 * 4j+16..4j+19 (high nibbles); four-bit codes as their unsigned q; Q6_K's
 * as q - 32 with their high bits from hi, the run's 16-bit word j. */
template <enum moe_dtype DT>
__device__ __forceinline__ void qword(float *v, uint32_t w, uint32_t hi = 0)
{
    if (qtraits<DT>::nib) {
        float2 a, b, c, d;
        if (qtraits<DT>::fp4) a = e2m1x2(w), b = e2m1x2(w >> 8), c = e2m1x2(w >> 4), d = e2m1x2(w >> 12);
        else if (qtraits<DT>::q6) a = q6x2(w, hi, 0), b = q6x2(w, hi, 8), c = q6x2(w, hi, 4), d = q6x2(w, hi, 12);
        else a = u4x2(w), b = u4x2(w >> 8), c = u4x2(w >> 4), d = u4x2(w >> 12);
        v[0] = a.x, v[1] = b.x, v[2] = a.y, v[3] = b.y; /* elements 4j .. 4j+3 */
        v[4] = c.x, v[5] = d.x, v[6] = c.y, v[7] = d.y; /* elements 4j+16 .. 4j+19 */
    } else if (qtraits<DT>::q8) {
        v[0] = q8(w, 0), v[1] = q8(w, 1), v[2] = q8(w, 2), v[3] = q8(w, 3);
    } else {
        const float2 a = e4m3x2(w), b = e4m3x2(w >> 8);
        v[0] = a.x, v[1] = b.x, v[2] = a.y, v[3] = b.y;
    }
}

/* The four-bit formats' (d, m) of the group holding value i of the planes
 * at ws: Q4_1's two f16 widened (exactly), Q4_K's d * sc_j and -(dmin *
 * mn_j) from its block's 16-byte head (one load; exact, as the CPU's
 * moe_q4_k_heads), the others' two f32. */
template <enum moe_dtype DT>
__device__ __forceinline__ float2 q4_dm(const void *ws, size_t i)
{
    if (DT == MOE_DTYPE_Q4_1) return __half22float2(((const __half2 *)ws)[i / 32]);
    if (DT == MOE_DTYPE_Q4_K) {
        const uint4 h = __ldg((const uint4 *)ws + i / MOE_Q4_K_BLOCK);
        const uint32_t s[3] = {h.y, h.z, h.w};
        uint64_t sc, mn;
        moe_q4_k_scales((const unsigned char *)s, &sc, &mn);
        const int j = (int)(i % MOE_Q4_K_BLOCK / 32);
        const float2 dm = half2_bits(h.x); /* d, dmin */
        return make_float2(dm.x * (float)(uint32_t)((sc >> (8 * j)) & 63u),
                           -(dm.y * (float)(uint32_t)((mn >> (8 * j)) & 63u)));
    }
    return ((const float2 *)ws)[i / qtraits<DT>::block];
}

/* Q6_K: the scales d sc_A and d sc_B (exact) of the two sub-blocks of
 * the 32 values from i (a multiple of 32) of the planes whose tails are at
 * ws (two 2-byte loads). */
__device__ __forceinline__ float2 q6_scales(const void *ws, size_t i)
{
    const uint8_t *t = (const uint8_t *)ws + i / MOE_Q6_K_BLOCK * MOE_Q6_K_TAIL;
    const uint32_t sc = __ldg((const uint16_t *)t + i % MOE_Q6_K_BLOCK / 32);
    const unsigned short db = __ldg((const unsigned short *)(t + 16));
    __half dh;
    memcpy(&dh, &db, 2);
    const float d = __half2float(dh);
    return make_float2(d * (float)(int8_t)(sc & 0xffu), d * (float)(int8_t)(sc >> 8));
}

/* Where the 16-byte load of values from i (a multiple of its per_load) of
 * the planes at q is (Q6_K: and *hi, the 8 bytes of its runs' high bits). */
template <enum moe_dtype DT>
__device__ __forceinline__ const uint8_t *qload_at(const uint8_t *q, size_t i, const uint8_t **hi)
{
    if (qtraits<DT>::q6) {
        const uint8_t *b = q + i / MOE_Q6_K_BLOCK * (MOE_Q6_K_BLOCK / 4 * 3);
        *hi = b + MOE_Q6_K_BLOCK / 2 + i % MOE_Q6_K_BLOCK / 4;
        return b + i % MOE_Q6_K_BLOCK / 2;
    }
    return q + (qtraits<DT>::nib ? i / 2 : i);
}

/* The scale of the block holding value i of the planes at ws (four-bit: d). */
template <enum moe_dtype DT>
__device__ __forceinline__ float qscale(const void *ws, size_t i)
{
    if (qtraits<DT>::q4) return q4_dm<DT>(ws, i).x;
    if (qtraits<DT>::fp4) {
        const uint32_t s = ((const uint8_t *)ws)[i / MOE_MXFP4_BLOCK]; /* 255 refused at load */
        return s ? __uint_as_float(s << 23) : __uint_as_float(0x00400000u);
    }
    return ((const float *)ws)[i / qtraits<DT>::block];
}

/* warp_dots for weights in planes: values at w, scales at ws, rows
 * starting at value index wo[k]; n a multiple of the block.  Each lane
 * keeps NW x U 16-byte loads in flight, decodes one word of each at a time
 * and sums a load's products before its scale multiplies them; four-bit
 * weights add m times the sum of the load's inputs (q * d + m summed as
 * d * sum(q x) + m * sum(x)); Q6_K weights sum the load's two halves
 * (sub-blocks A and B) apart, each times its own scale. */
template <enum moe_dtype DT, int RT, int NW, int U, class Rows>
__device__ __forceinline__ void warp_dots_q(float (*acc)[RT], const void *w, const void *ws,
                                            const size_t *wo, const Rows &xs, int nr, int n, bool once)
{
    typedef qtraits<DT> Q;
    const int lane = threadIdx.x & 31;
    const uint8_t *q = (const uint8_t *)w;
    for (int i0 = lane * Q::per_load; i0 < n; i0 += 32 * Q::per_load * U) {
        uint4 wq[U][NW];
        uint2 wh[U][NW]; /* Q6_K: the high bits */
        float sc[U][NW], mn[U][NW]; /* Q6_K: the scales of sub-blocks A and B */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int k = 0; k < NW; k++) {
                const int i = i0 + u * 32 * Q::per_load;
                if (i < n) {
                    const size_t e = wo[k] + i;
                    const uint8_t *hp = NULL;
                    wq[u][k] = ld_weights((const uint4 *)qload_at<DT>(q, e, &hp), once);
                    if (Q::q4 || Q::q6) {
                        const float2 dm = Q::q6 ? q6_scales(ws, e) : q4_dm<DT>(ws, e);
                        sc[u][k] = dm.x, mn[u][k] = dm.y;
                        if (Q::q6) wh[u][k] = ld_weights((const uint2 *)hp, once);
                    } else {
                        sc[u][k] = qscale<DT>(ws, e);
                    }
                }
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + u * 32 * Q::per_load;
            if (i >= n) break;
            float part[NW][RT], part_b[NW][RT], xsum[RT]; /* part_b: Q6_K's sub-block B */
#pragma unroll
            for (int r = 0; r < RT; r++) xsum[r] = 0.0f;
#pragma unroll
            for (int k = 0; k < NW; k++)
#pragma unroll
                for (int r = 0; r < RT; r++) part[k][r] = part_b[k][r] = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float v[NW][8];
#pragma unroll
                for (int k = 0; k < NW; k++) {
                    const uint32_t word[4] = {wq[u][k].x, wq[u][k].y, wq[u][k].z, wq[u][k].w};
                    const uint32_t hw = Q::q6 ? (j < 2 ? wh[u][k].x : wh[u][k].y) >> (16 * (j & 1)) & 0xffffu : 0;
                    qword<DT>(v[k], word[j], hw);
                }
#pragma unroll
                for (int r = 0; r < RT; r++) {
                    if (r >= nr) break;
                    const float *xr = xs.row(r) + i;
                    const float4 a = *(const float4 *)(xr + 4 * j); /* both: elements 4j..4j+3 */
#pragma unroll
                    for (int k = 0; k < NW; k++)
                        part[k][r] += v[k][0] * a.x + v[k][1] * a.y + v[k][2] * a.z + v[k][3] * a.w;
                    if (Q::nib) {
                        const float4 b = *(const float4 *)(xr + 16 + 4 * j);
#pragma unroll
                        for (int k = 0; k < NW; k++)
                            (Q::q6 ? part_b : part)[k][r] += v[k][4] * b.x + v[k][5] * b.y + v[k][6] * b.z +
                                                             v[k][7] * b.w;
                        if (Q::q4) xsum[r] += (a.x + a.y) + (a.z + a.w) + ((b.x + b.y) + (b.z + b.w));
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < NW; k++)
#pragma unroll
                for (int r = 0; r < RT; r++) {
                    acc[k][r] += part[k][r] * Q::unit * sc[u][k];
                    if (Q::q4) acc[k][r] += xsum[r] * mn[u][k];
                    if (Q::q6) acc[k][r] += part_b[k][r] * mn[u][k];
                }
        }
    }
}

/* ---- plain weights (F32, BF16, F16) and either kind ---- */

/* 8 consecutive weights at w[i..i+7] as fp32 (16-byte aligned load;
 * once: see ld_weights). */
template <enum moe_dtype DT>
__device__ __forceinline__ void ld8(float *o, const void *w, size_t i, bool once)
{
    if (DT == MOE_DTYPE_F32) {
        const float4 *p = (const float4 *)((const float *)w + i);
        float4 a = ld_weights(p, once), b = ld_weights(p + 1, once);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z,
        o[7] = b.w;
        return;
    }
    uint4 v = ld_weights((const uint4 *)((const uint16_t *)w + i), once);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (DT == MOE_DTYPE_BF16) {
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

/* acc[k][r] += dot(weight row k, xs.row(r)) over the warp (lane partial sums),
 * for NW weight rows starting at w + wo[k] and up to RT input rows (nr of
 * them valid), each of length n.  The NW rows share every load of x, and
 * each lane issues NW x U 16-byte weight loads before it uses any, so a
 * warp keeps NW x U x 512 bytes of weights in flight: at batch 1 the kernel
 * is a pure weight stream, and the bytes in flight are what bound it.
 * vec: n % 8 == 0 and rows 16-byte aligned; else one element per lane. */
template <enum moe_dtype DT, int RT, int NW, int U, class Rows>
__device__ __forceinline__ void warp_dots(float (*acc)[RT], const void *w, const size_t *wo,
                                          const Rows &xs, int nr, int n,
                                          bool vec, bool once)
{
    const int lane = threadIdx.x & 31;
    if (vec) {
        for (int i0 = lane * 8; i0 < n; i0 += 32 * 8 * U) {
            float wf[U][NW][8];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int k = 0; k < NW; k++)
                    if (i0 + u * 256 < n) ld8<DT>(wf[u][k], w, wo[k] + i0 + u * 256, once);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = i0 + u * 256;
                if (i >= n) break;
#pragma unroll
                for (int r = 0; r < RT; r++) {
                    if (r >= nr) break;
                    const float4 *xp = (const float4 *)(xs.row(r) + i);
                    const float4 a = xp[0], b = xp[1];
#pragma unroll
                    for (int k = 0; k < NW; k++)
                        acc[k][r] += wf[u][k][0] * a.x + wf[u][k][1] * a.y + wf[u][k][2] * a.z +
                                     wf[u][k][3] * a.w + wf[u][k][4] * b.x + wf[u][k][5] * b.y +
                                     wf[u][k][6] * b.z + wf[u][k][7] * b.w;
                }
            }
        }
    } else {
        for (int i = lane; i < n; i += 32) {
            float wv[NW];
#pragma unroll
            for (int k = 0; k < NW; k++) wv[k] = moe_ld(w, DT, wo[k] + i);
#pragma unroll
            for (int r = 0; r < RT; r++) {
                if (r >= nr) break;
                const float xv = xs.row(r)[i];
#pragma unroll
                for (int k = 0; k < NW; k++) acc[k][r] += wv[k] * xv;
            }
        }
    }
}

/* Either kind of weights: planes or plain rows. */
template <enum moe_dtype DT, int RT, int NW, int U, class Rows>
__device__ __forceinline__ void weight_dots(float (*acc)[RT], const void *w, const void *ws,
                                            const size_t *wo, const Rows &xs, int nr, int n,
                                            bool vec, bool once)
{
    if (planes_dt<DT>)
        warp_dots_q<DT, RT, NW, U>(acc, w, ws, wo, xs, nr, n, once);
    else
        warp_dots<DT, RT, NW, U>(acc, w, wo, xs, nr, n, vec, once);
}

