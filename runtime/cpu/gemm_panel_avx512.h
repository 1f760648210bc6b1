/* gemm_panel_avx512.h - the output side of the AVX-512 kernels over bf16
 * panels, shared by runtime/cpu/gemm_panel.c (FMA) and gemm_amx.c (tiles):
 * which lanes of a panel a slice stores, and its bias as 16 fp32 lanes.
 * The includer defines AVX512 (its target attribute) and INLINE. */
#pragma once

#include <immintrin.h>
#include <stdint.h>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

/* Lanes of panel q whose outputs fall in [n0, n1). */
INLINE __mmask16 lane_mask(int q, int n0, int n1)
{
    int lo = n0 - 16 * q, hi = n1 - 16 * q;
    lo = lo < 0 ? 0 : lo;
    hi = hi > 16 ? 16 : hi;
    if (hi <= lo) return 0;
    return (__mmask16)((((uint32_t)1 << hi) - 1) & ~(((uint32_t)1 << lo) - 1));
}

/* Bias of outputs 16q .. 16q+15 as fp32 (lanes outside m zero). */
AVX512 INLINE __m512 bias16(const struct moe_tensor *b, int q, __mmask16 m)
{
    const uint16_t *h = (const uint16_t *)b->data + 16 * q;
    switch (b->dtype) {
    case MOE_DTYPE_F32: return _mm512_maskz_loadu_ps(m, (const float *)b->data + 16 * q);
    case MOE_DTYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, h)), 16));
    case MOE_DTYPE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h));
    default: MOE_ASSERT(!"gemm_panel: bias must be F32, F16 or BF16"); return _mm512_setzero_ps();
    }
}
