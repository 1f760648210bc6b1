#include "emu.h"
#include "runtime/core/tensor.h"
#include <cstdlib>
#include <ctime>
thread_local uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local emu_block_ctx *emu_ctx;
long emu_blocks_run;
extern "C" {
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
/* allocation and the synchronous copies may not happen in a capture (emu_stream.cc) */
cudaError_t cudaMalloc(void **p, size_t b)
{
    if (cudaError_t e = emu_capture_forbids("cudaMalloc")) return e;
    *p = aligned_alloc(256, (b + 255) & ~(size_t)255);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xcd, b);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (cudaError_t e = emu_capture_forbids("cudaFree")) return e;
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind)
{
    if (cudaError_t e = emu_capture_forbids("cudaMemcpy (synchronous)")) return e;
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n)
{
    if (cudaError_t e = emu_capture_forbids("cudaMemset (synchronous)")) return e;
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { *f = (size_t)100 << 30; *t = (size_t)141 << 30; return cudaSuccess; }

long emu_gemms;
struct emu_blas { cudaStream_t st; };
cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new emu_blas{nullptr}; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->st = s; return CUBLAS_STATUS_SUCCESS; }
/* a GEMM is work on the handle's stream: run, or recorded in a capture */
static cublasStatus_t blas_submit(cublasHandle_t h, std::function<void()> work)
{
    return emu_submit(h->st, "cuBLAS GEMM", std::move(work)) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                            : CUBLAS_STATUS_EXECUTION_FAILED;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t) { return CUBLAS_STATUS_SUCCESS; }
static float ldt(const void *p, cudaDataType_t t, long long i)
{
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    uint16_t u = ((const uint16_t *)p)[i];
    return t == CUDA_R_16BF ? moe_bf16_to_f32(u) : moe_f16_to_f32(u);
}
static void stt(void *p, cudaDataType_t t, long long i, float v)
{
    if (t == CUDA_R_32F) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = t == CUDA_R_16BF ? moe_f32_to_bf16(v) : moe_f32_to_f16(v);
}
/* column-major C (m x n) = alpha op(A) op(B) + beta C, per the cuBLAS docs;
 * the scalars are taken at the call (host pointer mode), the matrices read
 * when the GEMM runs (at once, or in a replay of a recorded capture) */
struct gemm_args {
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha, beta;
    const void *A, *B;
    void *C;
    cudaDataType_t at, bt, ct;
    int lda, ldb, ldc;
};
static cublasStatus_t gemm_check(const gemm_args &g)
{
    if (g.at != g.bt) return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((g.ta == CUBLAS_OP_N ? g.lda < g.m : g.lda < g.k) || (g.tb == CUBLAS_OP_N ? g.ldb < g.k : g.ldb < g.n) ||
        g.ldc < g.m)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
/* Like cuBLAS, whose algorithm (tile, split-K) follows the problem's shape,
 * the sums' order here follows n: k is cut into 1 + n % 4 slices, each
 * summed in fp32, then added in order.  A column's result so depends on
 * how many columns share the call, as on a GPU: code that needs a row of
 * a step to be independent of the other rows fails here too. */
static void gemm_run(const gemm_args &g)
{
    emu_gemms++;
    const int slices = 1 + g.n % 4, per = (g.k + slices - 1) / slices;
    for (int j = 0; j < g.n; j++)
        for (int i = 0; i < g.m; i++) {
            float s = 0;
            for (int l0 = 0; l0 < g.k; l0 += per) {
                float part = 0;
                for (int l = l0; l < g.k && l < l0 + per; l++) {
                    float a = g.ta == CUBLAS_OP_T ? ldt(g.A, g.at, l + (long long)i * g.lda) : ldt(g.A, g.at, i + (long long)l * g.lda);
                    float b = g.tb == CUBLAS_OP_T ? ldt(g.B, g.bt, j + (long long)l * g.ldb) : ldt(g.B, g.bt, l + (long long)j * g.ldb);
                    part += a * b;
                }
                s += part;
            }
            float c = g.beta != 0 ? g.beta * ldt(g.C, g.ct, i + (long long)j * g.ldc) : 0.0f;
            stt(g.C, g.ct, i + (long long)j * g.ldc, g.alpha * s + c);
        }
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t, cublasGemmAlgo_t)
{
    const gemm_args g = {ta, tb, m, n, k, *(const float *)alpha, *(const float *)beta, A, B, C, at, bt, ct,
                         lda, ldb, ldc};
    if (cublasStatus_t s = gemm_check(g)) return s;
    return blas_submit(h, [g]() { gemm_run(g); });
}
static size_t esz(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                            long long sA, const void *B, cudaDataType_t bt, int ldb, long long sB,
                            const void *beta, void *C, cudaDataType_t ct, int ldc, long long sC, int batch,
                            cublasComputeType_t, cublasGemmAlgo_t)
{
    const gemm_args g = {ta, tb, m, n, k, *(const float *)alpha, *(const float *)beta, A, B, C, at, bt, ct,
                         lda, ldb, ldc};
    if (cublasStatus_t s = gemm_check(g)) return s;
    return blas_submit(h, [g, sA, sB, sC, batch]() {
        for (int i = 0; i < batch; i++) {
            gemm_args gi = g;
            gi.A = (const char *)g.A + i * sA * esz(g.at);
            gi.B = (const char *)g.B + i * sB * esz(g.bt);
            gi.C = (char *)g.C + i * sC * esz(g.ct);
            gemm_run(gi);
        }
    });
}
/* The shapes, leading dimensions and scalars are host arrays, read at the
 * call; A, B and C are device arrays of pointers, read when it runs. */
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t *ta,
                            const cublasOperation_t *tb, const int *m, const int *n, const int *k,
                            const void *alpha, const void *const *A, cudaDataType_t at, const int *lda,
                            const void *const *B, cudaDataType_t bt, const int *ldb, const void *beta,
                            void *const *C, cudaDataType_t ct, const int *ldc, int group_count,
                            const int *group_size, cublasComputeType_t)
{
    std::vector<gemm_args> gs; /* one per problem, pointers filled in when run */
    for (int g = 0; g < group_count; g++)
        for (int i = 0; i < group_size[g]; i++) {
            const gemm_args a = {ta[g], tb[g], m[g], n[g], k[g], ((const float *)alpha)[g],
                                 ((const float *)beta)[g], nullptr, nullptr, nullptr, at, bt, ct,
                                 lda[g], ldb[g], ldc[g]};
            if (cublasStatus_t s = gemm_check(a)) return s;
            gs.push_back(a);
        }
    return blas_submit(h, [gs, A, B, C]() {
        for (size_t p = 0; p < gs.size(); p++) {
            gemm_args a = gs[p];
            a.A = A[p], a.B = B[p], a.C = C[p];
            gemm_run(a);
        }
    });
}
}

struct emu_event {
    double t; /* seconds, CLOCK_MONOTONIC */
};
static double emu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new emu_event{0};
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) { e->t = emu_now(); return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)((b->t - a->t) * 1e3);
    return cudaSuccess;
}
