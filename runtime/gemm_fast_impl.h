/* gemm_fast_impl.h - kernel entry points of each instruction set, private to
 * the fast ops (runtime/gemm_fast.c chooses among them). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "runtime/tensor.h"

void moe_gemm_rows_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                        enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b);
void moe_gemm_rows_avx512(float *y, size_t ldy, const float *x, size_t ldx, int T, const void *w,
                          enum moe_dtype wt, int Din, int n0, int n1, const struct moe_tensor *b);
/* The calling thread's buffer of at least n floats (input rows for the
 * even/odd kernels, gemm_eo.h), kept until the thread exits; NULL when out
 * of memory. */
float *moe_gemm_thread_buffer(size_t n);
uint64_t moe_read_sweep_avx2(const void *p, size_t n);
float moe_dot_avx2(const float *a, const float *b, int n);
void moe_scale_axpy_avx2(float *y, float s, float a, const float *x, int n);
