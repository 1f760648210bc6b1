/* bench_cuda.cu - device measurements for `moerun bench` (see
 * runtime/cli/bench_gpu.h): copy bandwidth and grouped-vs-dense GEMM.  Each
 * call makes its own stream, events and cuBLAS handle, times with CUDA
 * events after a warm-up, and frees everything it made. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/bench_gpu.h"
#include "experts/experts_cuda.h"
#include "runtime/cuda/cuda_util.h"

#define REPS 10

struct bench_res {
    cudaStream_t st;
    cudaEvent_t a, b;
    cublasHandle_t blas;
    void *bufs[8];
};

static void res_free(struct bench_res *r)
{
    if (r->st) cudaStreamSynchronize(r->st);
    for (int i = 0; i < 8; i++) cudaFree(r->bufs[i]);
    if (r->blas) cublasDestroy(r->blas);
    if (r->a) cudaEventDestroy(r->a);
    if (r->b) cudaEventDestroy(r->b);
    if (r->st) cudaStreamDestroy(r->st);
}

static enum moe_status res_init(struct bench_res *r, bool blas)
{
    MOE_CUDA_TRY(cudaStreamCreateWithFlags(&r->st, cudaStreamNonBlocking));
    MOE_CUDA_TRY(cudaEventCreate(&r->a));
    MOE_CUDA_TRY(cudaEventCreate(&r->b));
    if (blas) {
        MOE_CUBLAS_TRY(cublasCreate(&r->blas));
        MOE_CUBLAS_TRY(cublasSetStream(r->blas, r->st));
    }
    return MOE_OK;
}

static enum moe_status elapsed(struct bench_res *r, double *s)
{
    float ms = 0;
    MOE_CUDA_TRY(cudaEventSynchronize(r->b));
    MOE_CUDA_TRY(cudaEventElapsedTime(&ms, r->a, r->b));
    *s = ms * 1e-3;
    return MOE_OK;
}

static enum moe_status copy_bw(struct bench_res *r, size_t bytes, double *bps)
{
    MOE_TRY(res_init(r, false));
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[0], bytes));
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[1], bytes));
    MOE_CUDA_TRY(cudaMemsetAsync(r->bufs[0], 1, bytes, r->st));
    MOE_CUDA_TRY(cudaMemcpyAsync(r->bufs[1], r->bufs[0], bytes, cudaMemcpyDeviceToDevice, r->st));
    MOE_CUDA_TRY(cudaEventRecord(r->a, r->st));
    for (int i = 0; i < REPS; i++)
        MOE_CUDA_TRY(cudaMemcpyAsync(r->bufs[1], r->bufs[0], bytes, cudaMemcpyDeviceToDevice, r->st));
    MOE_CUDA_TRY(cudaEventRecord(r->b, r->st));
    double s;
    MOE_TRY(elapsed(r, &s));
    *bps = 2.0 * (double)bytes * REPS / s;
    return MOE_OK;
}

extern "C" enum moe_status moe_bench_copy_bandwidth(size_t bytes, double *bytes_per_s)
{
    struct bench_res r = {};
    enum moe_status s = copy_bw(&r, bytes, bytes_per_s);
    res_free(&r);
    return s;
}

/* The experts' gate_up GEMM of `tokens` rows routed K ways, spread evenly
 * over E experts: one cublasGemmGroupedBatchedEx (gt), one cublasGemmEx per
 * expert (lt), and one dense cublasGemmEx over every row against one
 * expert's weights (dt), TFLOP/s of each. */
static enum moe_status gemm_cmp(struct bench_res *r, int tokens, int E, int K, int D, int F,
                                double *gt, double *dt, double *lt)
{
    MOE_TRY(res_init(r, true));
    const size_t n = (size_t)tokens * K, es = 2;
    if (n > 2147483647 || E <= 0) return moe_fail(MOE_ERR_INVALID_ARG, "gemm compare: %zu rows", n);
    const size_t wel = (size_t)E * 2 * F * D, xel = n * D, cel = n * 2 * F;
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[0], wel * es));
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[1], xel * es));
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[2], cel * es));
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[3], 3 * (size_t)E * sizeof(void *)));
    MOE_TRY(moe_ops_synth_fill_cuda(r->st, r->bufs[0], MOE_DTYPE_BF16, wel, 1, 0.02f));
    MOE_TRY(moe_ops_synth_fill_cuda(r->st, r->bufs[1], MOE_DTYPE_BF16, xel, 2, 1.0f));
    /* rows spread evenly over the experts */
    void **hp = (void **)malloc(3 * (size_t)E * sizeof(void *));
    int *arr = (int *)malloc(8 * (size_t)E * sizeof(int));
    float *ab = (float *)malloc(2 * (size_t)E * sizeof(float));
    cublasOperation_t *ops = (cublasOperation_t *)malloc(2 * (size_t)E * sizeof(cublasOperation_t));
    if (!hp || !arr || !ab || !ops) {
        free(hp), free(arr), free(ab), free(ops);
        return moe_fail(MOE_ERR_NOMEM, "gemm compare: host arrays");
    }
    int *m = arr, *nn = arr + E, *k = arr + 2 * E, *lda = arr + 3 * E, *ldb = arr + 4 * E,
        *ldc = arr + 5 * E, *gs = arr + 6 * E;
    size_t r0 = 0;
    int groups = 0;
    for (int e = 0; e < E; e++) {
        int cnt = (int)(n / E + ((size_t)e < n % E ? 1 : 0));
        if (cnt == 0) continue;
        hp[groups] = (char *)r->bufs[0] + (size_t)e * 2 * F * D * es;
        hp[E + groups] = (char *)r->bufs[1] + r0 * D * es;
        hp[2 * E + groups] = (char *)r->bufs[2] + r0 * 2 * F * es;
        m[groups] = 2 * F, nn[groups] = cnt, k[groups] = D;
        lda[groups] = D, ldb[groups] = D, ldc[groups] = 2 * F, gs[groups] = 1;
        ab[groups] = 1.0f, ab[E + groups] = 0.0f;
        ops[groups] = CUBLAS_OP_T, ops[E + groups] = CUBLAS_OP_N;
        groups++;
        r0 += (size_t)cnt;
    }
    void **dp = (void **)r->bufs[3];
    enum moe_status s = MOE_OK;
    cudaError_t ce = cudaMemcpyAsync(dp, hp, 3 * (size_t)E * sizeof(void *), cudaMemcpyHostToDevice, r->st);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(r->st);
    if (ce != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "gemm compare: %s", cudaGetErrorString(ce));
    const double flops = 2.0 * (double)n * 2.0 * F * D;
    const float one = 1.0f, zero = 0.0f;
    for (int pass = 0; pass < 3 && s == MOE_OK; pass++) {
        for (int rep = -2; rep < REPS && s == MOE_OK; rep++) { /* two warm-ups */
            if (rep == 0 && cudaEventRecord(r->a, r->st) != cudaSuccess)
                s = moe_fail(MOE_ERR_DEVICE, "gemm compare: event");
            cublasStatus_t bs;
            if (pass == 0)
                bs = cublasGemmGroupedBatchedEx(r->blas, ops, ops + E, m, nn, k, ab,
                                                (const void *const *)dp, CUDA_R_16BF, lda,
                                                (const void *const *)(dp + E), CUDA_R_16BF, ldb,
                                                ab + E, dp + 2 * E, CUDA_R_16BF, ldc, groups, gs,
                                                CUBLAS_COMPUTE_32F);
            else if (pass == 1)
                bs = cublasGemmEx(r->blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * F, (int)n, D, &one,
                                  r->bufs[0], CUDA_R_16BF, D, r->bufs[1], CUDA_R_16BF, D, &zero,
                                  r->bufs[2], CUDA_R_16BF, 2 * F, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT);
            else {
                bs = CUBLAS_STATUS_SUCCESS;
                for (int i = 0; i < groups && bs == CUBLAS_STATUS_SUCCESS; i++)
                    bs = cublasGemmEx(r->blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * F, nn[i], D, &one, hp[i],
                                      CUDA_R_16BF, D, hp[E + i], CUDA_R_16BF, D, &zero, hp[2 * E + i],
                                      CUDA_R_16BF, 2 * F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            }
            if (bs != CUBLAS_STATUS_SUCCESS)
                s = moe_fail(MOE_ERR_DEVICE, "gemm compare: %s: %s", pass ? "cublasGemmEx"
                             : "cublasGemmGroupedBatchedEx", moe_cublas_status_str(bs));
        }
        if (s != MOE_OK) break;
        if (cudaEventRecord(r->b, r->st) != cudaSuccess) {
            s = moe_fail(MOE_ERR_DEVICE, "gemm compare: event");
            break;
        }
        double t;
        s = elapsed(r, &t);
        if (s == MOE_OK) *(pass == 0 ? gt : pass == 1 ? dt : lt) = flops * REPS / t / 1e12;
    }
    free(hp), free(arr), free(ab), free(ops);
    return s;
}

extern "C" enum moe_status moe_bench_grouped_gemm(int tokens, int E, int K, int D, int F,
                                                  double *grouped_tflops, double *dense_tflops,
                                                  double *loop_tflops)
{
    struct bench_res r = {};
    *grouped_tflops = *dense_tflops = *loop_tflops = 0;
    enum moe_status s = gemm_cmp(&r, tokens, E, K, D, F, grouped_tflops, dense_tflops, loop_tflops);
    res_free(&r);
    return s;
}

/* ---- the decode-path expert kernels alone, by weight dtype ---- */

/* batch tokens routed K ways, token t to experts (t*K + k) % E (distinct
 * within a token), over E experts of (2F, D) gate+up and (D, F) down
 * weights in dt (planes for MXFP4 / FP8 / Q8_0 / four-bit, runtime/core/tensor.h) filled with
 * random codes: the time of one moe_experts_ffn_small_cuda call and the
 * weight bytes it must read (the experts with rows, each once). */
static enum moe_status expert_kernels(struct bench_res *r, enum moe_dtype dt, int batch, int E, int K,
                                      int D, int F, double *seconds, double *bytes)
{
    MOE_TRY(res_init(r, false));
    const bool planes = moe_dtype_planes(dt);
    const size_t n = (size_t)batch * K, FD = (size_t)F * D;
    const int blk = moe_dtype_block(dt);
    if (E <= 0 || K <= 0 || K > E || n > 2147483647 || D % blk || F % blk)
        return moe_fail(MOE_ERR_INVALID_ARG, "expert kernels: %s, %d experts of %d x %d, top-%d",
                        moe_dtype_name(dt), E, D, F, K);
    /* one matrix: its bytes (values), its scale bytes */
    const size_t vb = planes ? moe_planes_values_bytes(dt, (size_t)F, (size_t)D) : FD * moe_dtype_size(dt);
    const size_t sb = planes ? moe_planes_scales_bytes(dt, (size_t)F, (size_t)D) : 0;
    const size_t gu_bytes = 2 * (vb + sb) * (size_t)E, dn_bytes = (vb + sb) * (size_t)E;
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[0], gu_bytes));
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[1], dn_bytes));
    /* values: random bits (every E2M1 code; FP8 NaN codes cost the same;
     * any byte is a Q8_0 code) */
    for (int i = 0; i < 2; i++) {
        const size_t v = (i ? 1 : 2) * vb * (size_t)E;
        MOE_TRY(moe_ops_synth_fill_cuda(r->st, r->bufs[i], planes ? MOE_DTYPE_BF16 : dt,
                                        planes ? v / 2 : v / moe_dtype_size(dt), 10 + (uint64_t)i, 0.02f));
        char *sc = (char *)r->bufs[i] + v;
        const size_t s = (i ? 1 : 2) * sb * (size_t)E;
        if (dt == MOE_DTYPE_MXFP4) MOE_CUDA_TRY(cudaMemsetAsync(sc, 120, s, r->st));
        if (dt == MOE_DTYPE_FP8_B128 || dt == MOE_DTYPE_Q8_0 || dt == MOE_DTYPE_Q4_G32 || dt == MOE_DTYPE_Q4_G128)
            MOE_TRY(moe_ops_synth_fill_cuda(r->st, sc, MOE_DTYPE_F32, s / 4, 0, -1.0f));
        /* Q4_K: d = dmin = 1, the scale bytes those halves' bits */
        if (dt == MOE_DTYPE_Q4_1 || dt == MOE_DTYPE_Q4_K)
            MOE_TRY(moe_ops_synth_fill_cuda(r->st, sc, MOE_DTYPE_F16, s / 2, 0, -1.0f));
    }
    /* the plan, made on the host: counts, offsets, perm (stable), pos */
    int32_t *h = (int32_t *)calloc(2 * (size_t)E + 1 + 2 * n, sizeof(int32_t));
    if (!h) return moe_fail(MOE_ERR_NOMEM, "expert kernels: plan");
    int32_t *counts = h, *offsets = h + E, *perm = offsets + E + 1, *pos = perm + n;
    for (size_t p = 0; p < n; p++) counts[p % E]++; /* pair p = t*K + k: expert (t*K + k) % E */
    int touched = 0;
    for (int e = 0; e < E; e++) {
        offsets[e + 1] = offsets[e] + counts[e];
        touched += counts[e] > 0;
    }
    int32_t *fill = (int32_t *)calloc((size_t)E, sizeof(int32_t));
    if (!fill) {
        free(h);
        return moe_fail(MOE_ERR_NOMEM, "expert kernels: plan");
    }
    for (size_t p = 0; p < n; p++) {
        const int e = (int)(p % E);
        const int row = offsets[e] + fill[e]++;
        perm[row] = (int32_t)p;
        pos[p] = row;
    }
    free(fill);
    enum moe_status s = MOE_OK;
    cudaError_t ce = cudaMalloc(&r->bufs[2], (2 * (size_t)E + 1 + 2 * n) * sizeof(int32_t));
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(r->bufs[2], h, (2 * (size_t)E + 1 + 2 * n) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, r->st);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(r->st);
    free(h);
    if (ce != cudaSuccess) return moe_fail(MOE_ERR_DEVICE, "expert kernels: %s", cudaGetErrorString(ce));
    int32_t *d = (int32_t *)r->bufs[2];
    struct moe_dispatch plan = {d, d + E, d + 2 * E + 1, d + 2 * E + 1 + n, 0, 0, 0};
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[3], (size_t)batch * D * sizeof(float)));
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[4], n * F * sizeof(float)));
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[5], n * D * sizeof(float)));
    MOE_CUDA_TRY(cudaMalloc(&r->bufs[6], ((size_t)E + 1) * sizeof(int32_t)));
    MOE_TRY(moe_ops_synth_fill_cuda(r->st, r->bufs[3], MOE_DTYPE_F32, (size_t)batch * D, 3, 1.0f));
    struct moe_expert_weights ex;
    memset(&ex, 0, sizeof ex);
    ex.dtype = dt;
    for (int rep = -2; rep < REPS && s == MOE_OK; rep++) { /* two warm-ups */
        if (rep == 0 && cudaEventRecord(r->a, r->st) != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "expert kernels: event");
        if (s == MOE_OK)
            s = moe_experts_ffn_small_cuda(r->st, (float *)r->bufs[4], (float *)r->bufs[5], NULL, NULL,
                                           (const float *)r->bufs[3], &plan, (int32_t *)r->bufs[6],
                                           NULL, E, r->bufs[0], r->bufs[1], &ex, dt, dt,
                                           batch, K, D, F, E);
    }
    if (s == MOE_OK && cudaEventRecord(r->b, r->st) != cudaSuccess) s = moe_fail(MOE_ERR_DEVICE, "expert kernels: event");
    double t = 0;
    if (s == MOE_OK) s = elapsed(r, &t);
    *seconds = t / REPS;
    *bytes = 3.0 * (double)(vb + sb) * touched;
    return s;
}

extern "C" enum moe_status moe_bench_expert_kernels(enum moe_dtype dt, int batch, int E, int K, int D, int F,
                                                    double *seconds, double *bytes)
{
    struct bench_res r = {};
    *seconds = *bytes = 0;
    enum moe_status s = expert_kernels(&r, dt, batch, E, K, D, F, seconds, bytes);
    res_free(&r);
    return s;
}
