/* gemm.h - the CPU reference matrix product used by every projection.
 *
 * y (T, N) [row stride ldy] = x (T, Din) [row stride ldx] . W^T (+ b), where
 * W is (N, Din) row-major in F32, F16, BF16, Q8_0, MXFP4, FP8_B128, Q4_1,
 * Q4_G32, Q4_G128, Q4_K, Q5_K or Q6_K (runtime/core/tensor.h), read in place.  Each weight row is converted to fp32 once per call into
 * the caller's scratch and dotted with all T input rows, so a step reads
 * every weight once.  Parallel over output rows (OpenMP); the summation
 * order of each output is fixed, so the result does not depend on the
 * thread count. */
#pragma once

#include "runtime/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* scratch: (omp_get_max_threads(), Din) floats. b may be NULL or absent. */
void moe_gemm_cpu(float *y, int ldy, const float *x, int ldx, const void *w, enum moe_dtype wt,
                  int N, int Din, int T, const struct moe_tensor *b, float *scratch);

/* Dot product of n floats with a fixed summation order (8 partial sums). */
float moe_dot_f32(const float *a, const float *b, int n);

/* Element i of a 1-D F32/F16/BF16 tensor as fp32. */
static inline float moe_tensor_get_f32(const struct moe_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case MOE_DTYPE_F32: return ((const float *)t->data)[i];
    case MOE_DTYPE_BF16: return moe_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case MOE_DTYPE_F16: return moe_f16_to_f32(((const uint16_t *)t->data)[i]);
    default: return 0.0f;
    }
}

#ifdef __cplusplus
}
#endif
