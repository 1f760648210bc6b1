/* bench_gpu.h - the GPU side of `moerun bench`: device-to-device copy
 * bandwidth, grouped expert GEMM against dense cuBLAS at the same FLOPs,
 * and the HBM roofline of a decode step (runtime/cli/bench_gpu.c; the
 * measurements in runtime/cli/bench_cuda.cu).  Built without CUDA, the
 * measurements fail with MOE_ERR_UNSUPPORTED. */
#pragma once

#include <jansson.h>
#include <stdbool.h>

#include "runtime/backend/backend.h"
#include "runtime/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device-to-device cudaMemcpy of `bytes`: (bytes read + bytes written) / s. */
MOE_MUST_USE enum moe_status moe_bench_copy_bandwidth(size_t bytes, double *bytes_per_s);
/* The gate_up projection of `tokens` tokens routed K ways, spread evenly
 * over E experts of (2F, D) bf16 weights: one cublasGemmGroupedBatchedEx,
 * and one cublasGemmEx per expert (loop), against one cublasGemmEx of the
 * same FLOPs (2 * tokens*K * 2F * D). */
MOE_MUST_USE enum moe_status moe_bench_grouped_gemm(int tokens, int E, int K, int D, int F,
                                                    double *grouped_tflops, double *dense_tflops,
                                                    double *loop_tflops);

/* The decode-path expert kernels alone (one up and one down launch) for
 * batch tokens routed K ways over E experts of D x F in dt (BF16, F16,
 * F32, or MXFP4 / FP8_B128 planes): seconds per call and the weight bytes
 * a call must read (every expert with rows, once). */
MOE_MUST_USE enum moe_status moe_bench_expert_kernels(enum moe_dtype dt, int batch, int E, int K, int D,
                                                      int F, double *seconds, double *bytes);

struct moe_bench_gpu_opts {
    bool copy_bandwidth;        /* measure bandwidth and report roofline fractions */
    const int32_t *gemm_tokens; /* token counts for the GEMM comparison */
    int n_gemm;
    int ctx;                    /* decode context (for the KV bytes per step) */
    enum moe_dtype kv_dtype;
    const int32_t *expert_batches; /* batch sizes for the expert kernel benchmark */
    int n_expert;
};

/* Decode results of the bench, by batch size. */
struct moe_bench_decode {
    int batch;
    double step_s, tokens_per_s;
};

/* Runs the requested measurements; adds "gpu" to out and prints table rows
 * unless json.  Returns non-zero after printing an error. */
int moe_bench_gpu_extras(const struct moe_model *m, const struct moe_bench_gpu_opts *o,
                         const struct moe_bench_decode *dec, int n_dec, json_t *out, bool json);

#ifdef __cplusplus
}
#endif
