#include "emu.h"
#include "runtime/tensor.h"
#include <cstdlib>
thread_local uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local emu_block_ctx *emu_ctx;
long emu_blocks_run;
extern "C" {
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaErrorNotSupported ? "emulated: not supported" : "emulated error"; }
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t b) { *p = aligned_alloc(256, (b + 255) & ~(size_t)255); memset(*p, 0xcd, b); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaMallocHost(void **p, size_t b) { return cudaMalloc(p, b); }
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) { memmove(d, s, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t) { return cudaMemcpy(d, s, n, k); }
cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) { return cudaMemset(d, v, n); }
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { *f = (size_t)100 << 30; *t = (size_t)141 << 30; return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { *s = (cudaStream_t)malloc(1); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) { return cudaErrorNotSupported; }
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) { *g = nullptr; return cudaErrorNotSupported; }
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *, cudaGraph_t, unsigned long long) { return cudaErrorNotSupported; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }

long emu_gemms;
cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = (cublasHandle_t)malloc(1); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
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
/* column-major C (m x n) = alpha op(A) op(B) + beta C, per the cuBLAS docs */
static cublasStatus_t gemm1(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                            const void *A, cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb,
                            float beta, void *C, cudaDataType_t ct, int ldc)
{
    if (at != bt) return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((ta == CUBLAS_OP_N ? lda < m : lda < k) || (tb == CUBLAS_OP_N ? ldb < k : ldb < n) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    emu_gemms++;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++) {
                float a = ta == CUBLAS_OP_T ? ldt(A, at, l + (long long)i * lda) : ldt(A, at, i + (long long)l * lda);
                float b = tb == CUBLAS_OP_T ? ldt(B, bt, j + (long long)l * ldb) : ldt(B, bt, l + (long long)j * ldb);
                s += (double)a * b;
            }
            float c = beta != 0 ? beta * ldt(C, ct, i + (long long)j * ldc) : 0.0f;
            stt(C, ct, i + (long long)j * ldc, alpha * (float)s + c);
        }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t, cublasGemmAlgo_t)
{
    return gemm1(ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb, *(const float *)beta, C, ct, ldc);
}
static size_t esz(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                            long long sA, const void *B, cudaDataType_t bt, int ldb, long long sB,
                            const void *beta, void *C, cudaDataType_t ct, int ldc, long long sC, int batch,
                            cublasComputeType_t, cublasGemmAlgo_t)
{
    for (int i = 0; i < batch; i++) {
        cublasStatus_t s = gemm1(ta, tb, m, n, k, *(const float *)alpha, (const char *)A + i * sA * esz(at), at, lda,
                                 (const char *)B + i * sB * esz(bt), bt, ldb, *(const float *)beta,
                                 (char *)C + i * sC * esz(ct), ct, ldc);
        if (s) return s;
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t, const cublasOperation_t *ta,
                            const cublasOperation_t *tb, const int *m, const int *n, const int *k,
                            const void *alpha, const void *const *A, cudaDataType_t at, const int *lda,
                            const void *const *B, cudaDataType_t bt, const int *ldb, const void *beta,
                            void *const *C, cudaDataType_t ct, const int *ldc, int group_count,
                            const int *group_size, cublasComputeType_t)
{
    int p = 0;
    for (int g = 0; g < group_count; g++)
        for (int i = 0; i < group_size[g]; i++, p++) {
            cublasStatus_t s = gemm1(ta[g], tb[g], m[g], n[g], k[g], ((const float *)alpha)[g], A[p], at, lda[g],
                                     B[p], bt, ldb[g], ((const float *)beta)[g], C[p], ct, ldc[g]);
            if (s) return s;
        }
    return CUBLAS_STATUS_SUCCESS;
}
}
extern "C" cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
