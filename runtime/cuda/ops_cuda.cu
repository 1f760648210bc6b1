/* ops_cuda.cu - elementwise and data-movement kernels of the CUDA backend:
 * embedding, residual add, clamp, sigmoid scale, row gather, column gather
 * (MLA), bias, the fp32 -> half conversions in front of cuBLAS (contiguous,
 * and strided rows for the per-head MLA products), the synthetic weight
 * generator and a row argmax.  Twins of the loops in runtime/backend/backend_cpu.c
 * and runtime/model/synth.c.  All kernels use grid-stride loops, so any size is
 * covered by a capped grid. */
#include <math.h>

#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_util.h"

#define THREADS 256

extern "C" const char *moe_cublas_status_str(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
    default: return "unknown cuBLAS status";
    }
}

/* emb holds the vocabulary rows [first, first + R); a token outside them
 * (another rank's share; ids are checked against the vocabulary on the
 * host, forward.c) gets zeros. */
static __global__ void embed_kernel(float *x, const int32_t *tokens, int T, const void *emb,
                                    enum moe_dtype dt, int64_t first, int64_t R, int D)
{
    const size_t n = (size_t)T * D;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / D), d = (int)(i % D);
        const int64_t r = (int64_t)tokens[t] - first;
        x[i] = r < 0 || r >= R ? 0.0f : moe_ld(emb, dt, (size_t)r * D + d);
    }
}

extern "C" enum moe_status moe_ops_embed_cuda(cudaStream_t st, float *x, const int32_t *tokens,
                                              int T, const void *emb, enum moe_dtype dt, int64_t first,
                                              int64_t R, int D)
{
    if (T <= 0) return MOE_OK;
    embed_kernel<<<moe_cuda_blocks((size_t)T * D, THREADS), THREADS, 0, st>>>(x, tokens, T, emb,
                                                                              dt, first, R, D);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void add_kernel(float *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

extern "C" enum moe_status moe_ops_add_cuda(cudaStream_t st, float *y, const float *x, size_t n)
{
    if (n == 0) return MOE_OK;
    add_kernel<<<moe_cuda_blocks(n, THREADS), THREADS, 0, st>>>(y, x, n);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void scale_kernel(float *x, size_t n, float s)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

extern "C" enum moe_status moe_ops_scale_cuda(cudaStream_t st, float *x, size_t n, float s)
{
    if (n == 0) return MOE_OK;
    scale_kernel<<<moe_cuda_blocks(n, THREADS), THREADS, 0, st>>>(x, n, s);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void clamp_kernel(float *x, size_t n, float limit)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        /* same expression as the CPU: NaN passes through unchanged */
        x[i] = v < -limit ? -limit : (v > limit ? limit : v);
    }
}

extern "C" enum moe_status moe_ops_clamp_cuda(cudaStream_t st, float *x, size_t n, float limit)
{
    if (n == 0) return MOE_OK;
    clamp_kernel<<<moe_cuda_blocks(n, THREADS), THREADS, 0, st>>>(x, n, limit);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void sigmoid_scale_kernel(float *y, const float *g, int T, int D)
{
    const size_t n = (size_t)T * D;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] *= 1.0f / (1.0f + expf(-g[i / D]));
}

extern "C" enum moe_status moe_ops_sigmoid_scale_cuda(cudaStream_t st, float *y, const float *g,
                                                      int T, int D)
{
    if (T <= 0 || D <= 0) return MOE_OK;
    sigmoid_scale_kernel<<<moe_cuda_blocks((size_t)T * D, THREADS), THREADS, 0, st>>>(y, g, T, D);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *rows, int n,
                                          int D)
{
    const size_t m = (size_t)n * D;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / D;
        dst[i] = src[(size_t)rows[r] * D + i % D];
    }
}

extern "C" enum moe_status moe_ops_gather_rows_cuda(cudaStream_t st, float *dst, const float *src,
                                                    const int32_t *rows, int n, int D)
{
    if (n <= 0) return MOE_OK;
    gather_rows_kernel<<<moe_cuda_blocks((size_t)n * D, THREADS), THREADS, 0, st>>>(dst, src, rows,
                                                                                    n, D);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* dst[r*ld_dst + j] = src[r*ld_src + (idx ? idx[j] : j)]: MLA's column
 * gathers (runtime/engine/forward_mla.c) that assemble cache rows and absorbed
 * queries.  One thread per destination element; consecutive threads write
 * consecutive columns of a row. */
static __global__ void gather_cols_kernel(float *dst, int ld_dst, const float *src, int ld_src,
                                          int rows, const int32_t *idx, int n)
{
    const size_t m = (size_t)rows * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / n;
        const int j = (int)(i % n);
        dst[r * ld_dst + j] = src[r * ld_src + (idx ? idx[j] : j)];
    }
}

extern "C" enum moe_status moe_ops_gather_cols_cuda(cudaStream_t st, float *dst, int ld_dst,
                                                    const float *src, int ld_src, int rows,
                                                    const int32_t *idx, int n)
{
    if (rows <= 0 || n <= 0) return MOE_OK;
    if (ld_dst < n || ld_src <= 0 || (!idx && ld_src < n))
        return moe_fail(MOE_ERR_INVALID_ARG, "gather_cols: %d columns, strides %d and %d", n,
                        ld_dst, ld_src);
    gather_cols_kernel<<<moe_cuda_blocks((size_t)rows * n, THREADS), THREADS, 0, st>>>(
        dst, ld_dst, src, ld_src, rows, idx, n);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void bias_kernel(float *y, const void *b, enum moe_dtype dt, int T, int N)
{
    const size_t n = (size_t)T * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += moe_ld(b, dt, i % N);
}

extern "C" enum moe_status moe_ops_bias_cuda(cudaStream_t st, float *y, const void *b,
                                             enum moe_dtype dt, int T, int N)
{
    if (T <= 0 || N <= 0) return MOE_OK;
    bias_kernel<<<moe_cuda_blocks((size_t)T * N, THREADS), THREADS, 0, st>>>(y, b, dt, T, N);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void to_half_kernel(void *dst, const float *src, enum moe_dtype dt, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        moe_st(dst, dt, i, src[i]);
}

extern "C" enum moe_status moe_ops_to_half_cuda(cudaStream_t st, void *dst, const float *src,
                                                enum moe_dtype dt, size_t n)
{
    if (dt != MOE_DTYPE_F16 && dt != MOE_DTYPE_BF16)
        return moe_fail(MOE_ERR_INVALID_ARG, "to_half: dtype %s", moe_dtype_name(dt));
    if (n == 0) return MOE_OK;
    to_half_kernel<<<moe_cuda_blocks(n, THREADS), THREADS, 0, st>>>(dst, src, dt, n);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* dst (rows, n) packed = the first n values of each row of src (rows,
 * stride ld) in dt: the per-head inputs of the MLA products, which sit
 * inside wider rows. */
static __global__ void to_half_rows_kernel(void *dst, const float *src, int ld, enum moe_dtype dt,
                                           size_t rows, int n)
{
    const size_t m = rows * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x)
        moe_st(dst, dt, i, src[i / n * ld + i % n]);
}

extern "C" enum moe_status moe_ops_to_half_rows_cuda(cudaStream_t st, void *dst, const float *src,
                                                     int ld, enum moe_dtype dt, size_t rows, int n)
{
    if (dt != MOE_DTYPE_F16 && dt != MOE_DTYPE_BF16)
        return moe_fail(MOE_ERR_INVALID_ARG, "to_half_rows: dtype %s", moe_dtype_name(dt));
    if (rows == 0 || n <= 0) return MOE_OK;
    if (ld < n) return moe_fail(MOE_ERR_INVALID_ARG, "to_half_rows: %d values in rows of %d", n, ld);
    to_half_rows_kernel<<<moe_cuda_blocks(rows * n, THREADS), THREADS, 0, st>>>(dst, src, ld, dt,
                                                                                rows, n);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* ---- synthetic weights: the exact generator of runtime/model/synth.c ---- */

#define SYNTH_CHUNK 65536

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One thread per chunk of 65536 values (the host generator's unit: the
 * state of element i depends on its chunk's key and its index in the
 * chunk) of the values [off, off + n), written from dst; each thread walks
 * its part of a chunk sequentially, its state entered at the part's first
 * value.  With n/65536 threads an 87 GiB model still gives ~700k threads. */
static __global__ void synth_kernel(void *dst, enum moe_dtype dt, size_t off, size_t n, uint64_t key, float a,
                                    bool ones)
{
    const size_t c0 = off / SYNTH_CHUNK, chunks = (off + n + SYNTH_CHUNK - 1) / SYNTH_CHUNK - c0;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < chunks;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t c = c0 + k, start = c * SYNTH_CHUNK > off ? c * SYNTH_CHUNK : off;
        uint64_t s = mix64(key ^ mix64(c + 1)) + (start - c * SYNTH_CHUNK) * 0x9e3779b97f4a7c15ull;
        size_t end = (c + 1) * SYNTH_CHUNK < off + n ? (c + 1) * SYNTH_CHUNK : off + n;
        for (size_t i = start; i < end; i++) {
            if (ones) {
                moe_st(dst, dt, i - off, 1.0f);
                continue;
            }
            s += 0x9e3779b97f4a7c15ull;
            double u = (double)(mix64(s) >> 11) * 0x1.0p-53;
            moe_st(dst, dt, i - off, (float)((2.0 * u - 1.0) * a));
        }
    }
}

extern "C" enum moe_status moe_ops_synth_fill_at_cuda(cudaStream_t st, void *dst, enum moe_dtype dt, size_t off,
                                                      size_t n, uint64_t key, float std)
{
    if (dt != MOE_DTYPE_F32 && dt != MOE_DTYPE_F16 && dt != MOE_DTYPE_BF16)
        return moe_fail(MOE_ERR_INVALID_ARG, "synth_fill: dtype %s", moe_dtype_name(dt));
    if (n == 0) return MOE_OK;
    if (off + n < off) return moe_fail(MOE_ERR_INVALID_ARG, "synth_fill: values %zu + %zu overflow", off, n);
    const size_t chunks = (off + n + SYNTH_CHUNK - 1) / SYNTH_CHUNK - off / SYNTH_CHUNK;
    const bool ones = std < 0;
    /* the host computes a as std * sqrtf(3.0f) in float */
    const float a = ones ? 0.0f : std * sqrtf(3.0f);
    synth_kernel<<<moe_cuda_blocks(chunks, 128), 128, 0, st>>>(dst, dt, off, n, key, a, ones);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}


/* ---- FP8_B128 rows widened to bf16 (fp8 checkpoints at upload) ---- */

/* An E4M3 byte's value, as moe_fp8_e4m3_to_f32 (runtime/core/tensor.h) computes
 * it: normal values from their bits, subnormals m * 2^-9 (NaN bytes were
 * refused at load). */
static __device__ float e4m3_to_f32(uint8_t b)
{
    const int e = (b >> 3) & 15, m = b & 7;
    const float f = e ? __int_as_float((e + 120) << 23 | m << 20) : (float)m * (1.0f / 512.0f);
    return b & 0x80 ? -f : f;
}

/* One thread per value: the fp32 product q * scale (the CPU's value),
 * rounded once to bf16. */
static __global__ void fp8_to_bf16_kernel(__nv_bfloat16 *dst, const uint8_t *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint8_t *blk = src + i / MOE_FP8_BLOCK * MOE_FP8_BYTES;
        const float s = *(const float *)blk; /* 4-aligned: blocks are 132 bytes */
        dst[i] = __float2bfloat16_rn(e4m3_to_f32(blk[4 + i % MOE_FP8_BLOCK]) * s);
    }
}

extern "C" enum moe_status moe_ops_fp8_to_bf16_cuda(cudaStream_t st, void *dst, const void *src, size_t n_blocks)
{
    if (n_blocks == 0) return MOE_OK;
    const size_t n = n_blocks * MOE_FP8_BLOCK;
    fp8_to_bf16_kernel<<<moe_cuda_blocks(n, 256), 256, 0, st>>>((__nv_bfloat16 *)dst, (const uint8_t *)src, n);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* ---- Q8_0 quantization at upload (--quantize q8_0) ---- */

/* One warp per block of 32 values: moe_quantize_row_q8_0's d = max|x| /
 * 127 and q = roundf(x * (1 / d)) with IEEE division and round-half-away
 * rounding (no fast math in this build), d rounded to f16 as
 * moe_f32_to_f16 rounds (to nearest even); the codes to q, the scale to
 * s.  A block with a value that is not finite, or whose scale overflows
 * f16, sets *bad. */
static __global__ void quantize_q8_0_kernel(int8_t *q, float *s, const void *src, enum moe_dtype dt,
                                            size_t n_blocks, int *bad)
{
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * blockDim.x / 32;
    for (size_t b = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; b < n_blocks; b += warps) {
        const float x = moe_ld(src, dt, b * MOE_Q8_0_BLOCK + lane);
        const bool finite = __ballot_sync(0xffffffffu, !isfinite(x)) == 0;
        const float d = moe_warp_max(fabsf(x)) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const float dh = __half2float(__float2half_rn(d));
        if (!finite || isinf(dh)) {
            if (lane == 0) *bad = 1;
            continue;
        }
        q[b * MOE_Q8_0_BLOCK + lane] = (int8_t)roundf(x * id);
        if (lane == 0) s[b] = dh;
    }
}

/* The checks and grid of a quantization at upload of n values of dt in
 * blocks of `block` (Q8_0, Q4_1): a grid that fills a large GPU, each warp
 * striding over the blocks; *grid 0 when there is nothing to do. */
static enum moe_status quantize_grid(size_t n, enum moe_dtype dt, size_t block, unsigned *grid)
{
    *grid = 0;
    if (n % block || (dt != MOE_DTYPE_F32 && dt != MOE_DTYPE_F16 && dt != MOE_DTYPE_BF16))
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA quantize: %zu %s values", n, moe_dtype_name(dt));
    if (n == 0) return MOE_OK;
    const unsigned g = moe_cuda_blocks(n, 256);
    *grid = g > 1024 ? 1024 : g;
    return MOE_OK;
}

extern "C" enum moe_status moe_ops_quantize_q8_0_cuda(cudaStream_t st, void *dst, const void *src,
                                                      enum moe_dtype dt, size_t n, int *bad)
{
    unsigned grid;
    const enum moe_status s = quantize_grid(n, dt, MOE_Q8_0_BLOCK, &grid);
    if (s != MOE_OK || grid == 0) return s;
    quantize_q8_0_kernel<<<grid, 256, 0, st>>>((int8_t *)dst, (float *)((char *)dst + n), src, dt,
                                               n / MOE_Q8_0_BLOCK, bad);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* ---- Q4_1 quantization at upload (--quantize q4) ---- */

__device__ __forceinline__ float moe_warp_min(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* One warp per block of 32 values: moe_quantize_row_q4_1's lo = min x,
 * d = (max x - lo) / 15, id = 1 / d (0 when d is), each code
 * (int8_t)((x - lo) * id + 0.5) capped at 15, every operation rounded on
 * its own (no contraction into an FMA, IEEE division), d and lo rounded to
 * f16 as moe_f32_to_f16 rounds.  Lane j < 16 writes byte j (its code low,
 * lane j + 16's high) of the block's 16 code bytes at q, lane 0 the two
 * f16 at s.  A block with a value that is not finite, or a d or lo past
 * f16, sets *bad. */
static __global__ void quantize_q4_1_kernel(uint8_t *q, __half2 *s, const void *src, enum moe_dtype dt,
                                            size_t n_blocks, int *bad)
{
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * blockDim.x / 32;
    for (size_t b = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; b < n_blocks; b += warps) {
        const float x = moe_ld(src, dt, b * MOE_Q4_1_BLOCK + lane);
        const bool finite = __ballot_sync(0xffffffffu, !isfinite(x)) == 0;
        const float lo = moe_warp_min(x), hi = moe_warp_max(x);
        const float d = __fdiv_rn(__fsub_rn(hi, lo), 15.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        const __half dh = __float2half_rn(d), mh = __float2half_rn(lo);
        if (!finite || isinf(__half2float(dh)) || isinf(__half2float(mh))) {
            if (lane == 0) *bad = 1;
            continue;
        }
        const int c = (int)(int8_t)__fadd_rn(__fmul_rn(__fsub_rn(x, lo), id), 0.5f);
        const int code = c < 15 ? c : 15;
        const int hi_code = __shfl_xor_sync(0xffffffffu, code, 16);
        if (lane < 16) q[b * 16 + lane] = (uint8_t)(code | hi_code << 4);
        if (lane == 0) s[b] = __halves2half2(dh, mh);
    }
}

extern "C" enum moe_status moe_ops_quantize_q4_1_cuda(cudaStream_t st, void *dst, const void *src,
                                                      enum moe_dtype dt, size_t n, int *bad)
{
    unsigned grid;
    const enum moe_status s = quantize_grid(n, dt, MOE_Q4_1_BLOCK, &grid);
    if (s != MOE_OK || grid == 0) return s;
    quantize_q4_1_kernel<<<grid, 256, 0, st>>>((uint8_t *)dst, (__half2 *)((char *)dst + n / 2), src, dt,
                                               n / MOE_Q4_1_BLOCK, bad);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* ---- argmax: one block per row ---- */

__device__ __forceinline__ bool am_better(float a, int ia, float b, int ib)
{
    /* a at ia beats b at ib: larger, ties to the lower index, NaN never wins */
    bool an = isnan(a), bn = isnan(b);
    if (an || bn) return an == bn ? ia < ib : bn;
    return a > b || (a == b && ia < ib);
}

static __global__ void argmax_kernel(int32_t *ids, const float *x, int rows, int n)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float *xr = x + (size_t)r * n;
    float best = NAN;
    int bi = n; /* sentinel: loses to any real index */
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (bi == n || am_better(xr[i], i, best, bi)) {
            best = xr[i];
            bi = i;
        }
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != n && (bi == n || am_better(ov, oi, best, bi))) {
            best = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++)
            if (si[w] != n && (si[0] == n || am_better(sv[w], si[w], sv[0], si[0]))) {
                sv[0] = sv[w];
                si[0] = si[w];
            }
        ids[r] = si[0] == n ? 0 : si[0];
    }
}

extern "C" enum moe_status moe_ops_argmax_cuda(cudaStream_t st, int32_t *ids, const float *x,
                                               int rows, int n)
{
    if (rows <= 0) return MOE_OK;
    if (n <= 0) return moe_fail(MOE_ERR_INVALID_ARG, "argmax over %d values", n);
    argmax_kernel<<<rows, 256, 0, st>>>(ids, x, rows, n);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
