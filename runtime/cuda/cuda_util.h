/* cuda_util.h - error checking for CUDA code, and the launchers of the
 * shared elementwise and matmul kernels (runtime/cuda/).  The compute
 * modules declare their own launchers in their *_cuda.h headers.  Included
 * only by *_cuda.cu files, *_cuda.h headers and the CUDA backend (the only
 * places allowed to see CUDA headers).
 *
 * Every CUDA runtime and cuBLAS call goes through MOE_CUDA_TRY /
 * MOE_CUBLAS_TRY, which return MOE_ERR_DEVICE with the call's text and the
 * error string; every kernel launch is followed by MOE_CUDA_LAUNCHED(), which
 * checks cudaGetLastError.  Launchers are `extern "C"`, take a stream and
 * device pointers, and return enum moe_status.  Kernels check their bounds;
 * launchers check shapes that would make a kernel read out of range. */
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

const char *moe_cublas_status_str(cublasStatus_t s);

/* The file name without its directories, for messages. */
static inline const char *moe_src_name(const char *path)
{
    const char *s = path;
    for (const char *p = path; *p; p++)
        if (*p == '/') s = p + 1;
    return s;
}

#define MOE_CUDA_TRY(call)                                                                   \
    do {                                                                                     \
        cudaError_t moe_e_ = (call);                                                         \
        if (moe_e_ != cudaSuccess)                                                           \
            return moe_fail(MOE_ERR_DEVICE, "%s:%d: %s: %s", moe_src_name(__FILE__), __LINE__, #call,      \
                            cudaGetErrorString(moe_e_));                                     \
    } while (0)

#define MOE_CUBLAS_TRY(call)                                                                 \
    do {                                                                                     \
        cublasStatus_t moe_b_ = (call);                                                      \
        if (moe_b_ != CUBLAS_STATUS_SUCCESS)                                                 \
            return moe_fail(MOE_ERR_DEVICE, "%s:%d: %s: %s", moe_src_name(__FILE__), __LINE__, #call,      \
                            moe_cublas_status_str(moe_b_));                                  \
    } while (0)

/* After every <<<>>> launch. */
#define MOE_CUDA_LAUNCHED() MOE_CUDA_TRY(cudaGetLastError())

/* Grid size for n items in blocks of b, capped so 1-D grids stay legal
 * (kernels use grid-stride loops). */
static inline unsigned moe_cuda_blocks(size_t n, unsigned b)
{
    size_t g = (n + b - 1) / b;
    if (g == 0) g = 1;
    return g > 65535u * 16u ? 65535u * 16u : (unsigned)g;
}

/* ---- runtime/cuda/ops_cuda.cu: elementwise and data movement ---- */
enum moe_status moe_ops_embed_cuda(cudaStream_t st, float *x, const int32_t *tokens, int T,
                                   const void *emb, enum moe_dtype dt, int64_t first, int64_t R, int D);
enum moe_status moe_ops_add_cuda(cudaStream_t st, float *y, const float *x, size_t n);
enum moe_status moe_ops_scale_cuda(cudaStream_t st, float *x, size_t n, float s);
enum moe_status moe_ops_clamp_cuda(cudaStream_t st, float *x, size_t n, float limit);
enum moe_status moe_ops_sigmoid_scale_cuda(cudaStream_t st, float *y, const float *g, int T, int D);
enum moe_status moe_ops_gather_rows_cuda(cudaStream_t st, float *dst, const float *src,
                                         const int32_t *rows, int n, int D);
/* dst[r*ld_dst + j] = src[r*ld_src + (idx ? idx[j] : j)], r < rows, j < n
 * (the backend's gather_cols; idx device memory or NULL). */
enum moe_status moe_ops_gather_cols_cuda(cudaStream_t st, float *dst, int ld_dst, const float *src,
                                         int ld_src, int rows, const int32_t *idx, int n);
/* y (T, N) += b (N) broadcast over rows; b in dtype dt. */
enum moe_status moe_ops_bias_cuda(cudaStream_t st, float *y, const void *b, enum moe_dtype dt,
                                  int T, int N);
/* dst = src converted to dt (F16 or BF16), n elements, round to nearest even. */
enum moe_status moe_ops_to_half_cuda(cudaStream_t st, void *dst, const float *src,
                                     enum moe_dtype dt, size_t n);
/* dst (rows, n) packed in dt (F16 or BF16) = the first n values of each
 * row of src (rows, stride ld), round to nearest even. */
enum moe_status moe_ops_to_half_rows_cuda(cudaStream_t st, void *dst, const float *src, int ld,
                                          enum moe_dtype dt, size_t rows, int n);
/* The synth.c generator on the device: the values [off, off + n) of a
 * tensor's stream into dst[0, n) (a part of a tensor: the values the whole
 * tensor has there) of dt, uniform with standard deviation std keyed by
 * key, or ones when std < 0. */
enum moe_status moe_ops_synth_fill_at_cuda(cudaStream_t st, void *dst, enum moe_dtype dt, size_t off, size_t n,
                                           uint64_t key, float std);
/* The same from the tensor's first value: n values. */
static inline enum moe_status moe_ops_synth_fill_cuda(cudaStream_t st, void *dst, enum moe_dtype dt, size_t n,
                                                      uint64_t key, float std)
{
    return moe_ops_synth_fill_at_cuda(st, dst, dt, 0, n, key, std);
}
/* dst (n_blocks * 128 bf16 values) = FP8_B128 blocks src (n_blocks of
 * MOE_FP8_BYTES: runtime/core/tensor.h): each value the fp32 product of its
 * E4M3 byte and its block's scale (the CPU's weight), rounded to bf16 (as
 * transformers' dequantization to a bf16 model). */
enum moe_status moe_ops_fp8_to_bf16_cuda(cudaStream_t st, void *dst, const void *src, size_t n_blocks);
/* n values of dt (F32, F16 or BF16; n a multiple of 32) at src quantized
 * to Q8_0 planes at dst (runtime/core/tensor.h: n int8 codes, then n/32 f32
 * scales), bit for bit as moe_quantize_row_q8_0 and moe_planes_from_rows
 * make them; a value that is not finite, or a scale past f16, sets the
 * device int *bad (its block unwritten). */
enum moe_status moe_ops_quantize_q8_0_cuda(cudaStream_t st, void *dst, const void *src, enum moe_dtype dt,
                                           size_t n, int *bad);
/* The same to Q4_1 planes (n/2 bytes of codes, then n/32 pairs of f16 d
 * and m), bit for bit as moe_quantize_row_q4_1 and moe_planes_from_rows
 * make them; a value that is not finite, or a d or m past f16, sets *bad. */
enum moe_status moe_ops_quantize_q4_1_cuda(cudaStream_t st, void *dst, const void *src, enum moe_dtype dt,
                                           size_t n, int *bad);
/* The same to `to` planes, Q4_K (n/2 bytes of codes in runs of 32, then
 * each block's 16-byte head) or Q6_K (3n/4 bytes of codes, then each
 * block's 18-byte tail); n a multiple of 256; bit for bit as
 * moe_quantize_row_q4_k or moe_quantize_row_q6_k and moe_planes_from_rows
 * make them (runtime/cuda/quant_k_cuda.cu); a value that is not finite,
 * or a block scale past f16, sets *bad. */
enum moe_status moe_ops_quantize_k_cuda(cudaStream_t st, enum moe_dtype to, void *dst, const void *src,
                                        enum moe_dtype dt, size_t n, int *bad);
/* y (T, N) = x (T, Din) . W^T (+ b (N) in bdt, or NULL) with W (N, Din) in
 * F32, BF16 or F16 rows, or as MXFP4, FP8_B128 or Q8_0 planes
 * (runtime/core/tensor.h), at w, read in place: for steps of few rows (each
 * weight row is read once per 8 input rows).  A row's result does not
 * depend on T or on the other rows. */
enum moe_status moe_ops_matmul_rows_cuda(cudaStream_t st, float *y, const float *x, const void *w,
                                         enum moe_dtype dt, int N, int Din, int T, const void *b,
                                         enum moe_dtype bdt);
/* The same per head, for steps of few rows: y[t, h*ldy .. +N) = W[h] (N, K)
 * . x[t, h*ldx .. +K) for H heads, rows H*ldy and H*ldx apart, W (H, N, K)
 * in F32, BF16 or F16 (the head_matmul op). */
enum moe_status moe_ops_head_matmul_rows_cuda(cudaStream_t st, float *y, int ldy, const float *x, int ldx,
                                              const void *w, enum moe_dtype dt, int H, int N, int K, int T);
/* ids (rows) = argmax of each row of x (rows, n): ties to the lower index,
 * NaN never wins (moe_argmax). */
enum moe_status moe_ops_argmax_cuda(cudaStream_t st, int32_t *ids, const float *x, int rows, int n);

#ifdef __cplusplus
}
#endif
