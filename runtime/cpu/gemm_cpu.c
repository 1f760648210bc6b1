/* gemm_cpu.c - see gemm.h. */
#include "runtime/cpu/gemm.h"

#include <omp.h>

float moe_dot_f32(const float *a, const float *b, int n)
{
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    for (; i < n; i++) s[i & 7] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void moe_gemm_cpu(float *y, int ldy, const float *x, int ldx, const void *w, enum moe_dtype wt,
                  int N, int Din, int T, const struct moe_tensor *b, float *scratch)
{
    const size_t row_bytes = moe_dtype_row_bytes(wt, (size_t)Din);
    const bool has_bias = b && b->data;
#pragma omp parallel for schedule(static) if ((size_t)N * Din * (size_t)T > 32768)
    for (int n = 0; n < N; n++) {
        const void *src = (const char *)w + (size_t)n * row_bytes;
        const float *wrow = src;
        if (wt != MOE_DTYPE_F32) {
            float *buf = scratch + (size_t)omp_get_thread_num() * (size_t)Din;
            moe_convert_row_f32(buf, src, wt, (size_t)Din);
            wrow = buf;
        }
        float bias = has_bias ? moe_tensor_get_f32(b, n) : 0.0f;
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + n] = moe_dot_f32(x + (size_t)t * ldx, wrow, Din) + bias;
    }
}
