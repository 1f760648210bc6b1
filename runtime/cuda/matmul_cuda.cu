/* matmul_cuda.cu - dense products for steps of few rows, y (T, N) = x (T,
 * Din) . W^T (+ b), with F32, BF16 or F16 weights as stored or MXFP4,
 * FP8_B128, Q8_0, Q6_K or four-bit weights read in place (planes, runtime/core/tensor.h).  A
 * warp computes two output features for up to 8 rows at a time, streaming
 * the two weight rows once per 8 input rows with the decode expert kernels'
 * dot products (runtime/cuda/cuda_planes.cuh); blocks of 8 warps.  The
 * activations stay fp32, and a row's sums run in the same order whatever
 * the other rows of the step: its result does not depend on them (cuBLAS
 * picks its algorithm by the row count).  Larger steps go to cuBLAS
 * (runtime/backend/backend_cuda.c). */
#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_planes.cuh"
#include "runtime/cuda/cuda_util.h"

#define MV_WARPS 8
#define MV_NW 2 /* output features per warp */
#define MV_RT 8 /* input rows per pass */

/* Where the rows and heads are: input row t of head h at x + t * ldx + h
 * * hx, output row t at y + t * ldy + h * hy, head h's weights hw elements
 * after w (blockIdx.y is the head; one head: hx = hy = hw = 0). */
struct rows_geom {
    int ldx, ldy;
    size_t hx, hy, hw;
};

template <enum moe_dtype DT>
static __global__ void __launch_bounds__(MV_WARPS * 32)
    rows_matvec_kernel(float *y, const float *x, const void *w, const void *ws, const void *b,
                       enum moe_dtype bdt, int N, int Din, int T, bool vec, struct rows_geom gm)
{
    const int n0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * MV_NW;
    if (n0 >= N) return; /* the whole warp */
    x += blockIdx.y * gm.hx;
    y += blockIdx.y * gm.hy;
    size_t wo[MV_NW];
#pragma unroll
    for (int k = 0; k < MV_NW; k++) /* past N: repeat the last row, not stored */
        wo[k] = blockIdx.y * gm.hw + (size_t)min(n0 + k, N - 1) * Din;
    for (int t0 = 0; t0 < T; t0 += MV_RT) {
        const int nr = min(MV_RT, T - t0);
        const strided_rows xs = {x + (size_t)t0 * gm.ldx, gm.ldx};
        float acc[MV_NW][MV_RT] = {};
        weight_dots<DT, MV_RT, MV_NW, planes_dt<DT> ? 1 : 2>(acc, w, ws, wo, xs, nr, Din, vec, T <= MV_RT);
#pragma unroll
        for (int k = 0; k < MV_NW; k++) {
            if (n0 + k >= N) break;
#pragma unroll
            for (int r = 0; r < MV_RT; r++) {
                if (r >= nr) break;
                float s = moe_warp_sum(acc[k][r]);
                if (b) s += moe_ld(b, bdt, (size_t)n0 + k);
                if ((threadIdx.x & 31) == 0) y[(size_t)(t0 + r) * gm.ldy + n0 + k] = s;
            }
        }
    }
}

extern "C" enum moe_status moe_ops_matmul_rows_cuda(cudaStream_t st, float *y, const float *x,
                                                    const void *w, enum moe_dtype dt, int N, int Din,
                                                    int T, const void *b, enum moe_dtype bdt)
{
    const bool plain = dt == MOE_DTYPE_F32 || dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16;
    if ((!plain && !moe_dtype_planes(dt)) || N <= 0 || Din <= 0 || (!plain && Din % moe_dtype_block(dt)))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda matmul: %s weights of %d x %d", moe_dtype_name(dt), N, Din);
    if (T <= 0) return MOE_OK;
    const void *ws = plain ? NULL : (const char *)w + moe_planes_values_bytes(dt, (size_t)N, (size_t)Din);
    /* 16-byte loads: every weight and input row starts 16-byte aligned */
    const bool vec = Din % 8 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0;
    const unsigned grid = (unsigned)((N + MV_WARPS * MV_NW - 1) / (MV_WARPS * MV_NW));
    const struct rows_geom gm = {Din, N, 0, 0, 0};
#define MATVEC(DT) rows_matvec_kernel<DT><<<grid, MV_WARPS * 32, 0, st>>>(y, x, w, ws, b, bdt, N, Din, T, vec, gm)
    switch (dt) {
    case MOE_DTYPE_F32: MATVEC(MOE_DTYPE_F32); break;
    case MOE_DTYPE_BF16: MATVEC(MOE_DTYPE_BF16); break;
    case MOE_DTYPE_F16: MATVEC(MOE_DTYPE_F16); break;
    case MOE_DTYPE_MXFP4: MATVEC(MOE_DTYPE_MXFP4); break;
    case MOE_DTYPE_FP8_B128: MATVEC(MOE_DTYPE_FP8_B128); break;
    case MOE_DTYPE_Q8_0: MATVEC(MOE_DTYPE_Q8_0); break;
    case MOE_DTYPE_Q4_1: MATVEC(MOE_DTYPE_Q4_1); break;
    case MOE_DTYPE_Q4_G32: MATVEC(MOE_DTYPE_Q4_G32); break;
    case MOE_DTYPE_Q4_G128: MATVEC(MOE_DTYPE_Q4_G128); break;
    case MOE_DTYPE_Q6_K: MATVEC(MOE_DTYPE_Q6_K); break;
    case MOE_DTYPE_Q4_K: MATVEC(MOE_DTYPE_Q4_K); break;
    default: return moe_fail(MOE_ERR_INVALID_ARG, "cuda matmul: no kernel for %s weights", moe_dtype_name(dt));
    }
#undef MATVEC
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" enum moe_status moe_ops_head_matmul_rows_cuda(cudaStream_t st, float *y, int ldy, const float *x,
                                                         int ldx, const void *w, enum moe_dtype dt, int H, int N,
                                                         int K, int T)
{
    if ((dt != MOE_DTYPE_F32 && dt != MOE_DTYPE_BF16 && dt != MOE_DTYPE_F16) || H <= 0 || H > 65535 ||
        N <= 0 || K <= 0 || ldy < N || ldx < K)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda head_matmul: %s weights of %d heads of %d x %d, strides %d and %d",
                        moe_dtype_name(dt), H, N, K, ldy, ldx);
    if (T <= 0) return MOE_OK;
    const struct rows_geom gm = {H * ldx, H * ldy, (size_t)ldx, (size_t)ldy, (size_t)N * K};
    const bool vec = K % 8 == 0 && ldx % 4 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0;
    const dim3 grid((unsigned)((N + MV_WARPS * MV_NW - 1) / (MV_WARPS * MV_NW)), (unsigned)H);
#define HEADS(DT) rows_matvec_kernel<DT><<<grid, MV_WARPS * 32, 0, st>>>(y, x, w, (const void *)NULL, (const void *)NULL, MOE_DTYPE_F32, N, K, T, vec, gm)
    if (dt == MOE_DTYPE_F32) HEADS(MOE_DTYPE_F32);
    else if (dt == MOE_DTYPE_BF16) HEADS(MOE_DTYPE_BF16);
    else HEADS(MOE_DTYPE_F16);
#undef HEADS
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
