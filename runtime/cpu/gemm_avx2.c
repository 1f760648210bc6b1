/* gemm_avx2.c - AVX2/FMA/F16C kernels of the fast matrix product (see
 * gemm_fast.h for the contract and the numeric policy): the templates
 * gemm_nat.h (f32, f16) and gemm_eo.h (bf16) at 8 lanes (the attention's
 * kernels are attention/attention_avx2.c).
 *
 * 16 ymm registers: the batch tile is 4 input rows x 3 weight rows (12
 * accumulators + 3 weights, inputs as memory operands); rows of a decode
 * step take 8 (one row) or 4 weight rows at a time.  bf16 weights take the
 * even/odd order in 32-byte blocks, decode tiles of 8, 4 or 2 weight rows. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* 8 weights of dtype dt from element k, widened to fp32 (MXFP4: the E2M1
 * values doubled to integers by a byte shuffle, times half the block's
 * scale, exact; FP8_B128: each E4M3 byte made the f16 of its value / 2^8
 * (gemm_fast_impl.h), widened by F16C, times 2^8 (exact: the E4M3 value),
 * times the block's scale: the reference's product; k is a multiple of 8,
 * so within one block). */
AVX2 INLINE __m256 load_w8(const char *row, const enum moe_dtype dt, int k)
{
    if (dt == MOE_DTYPE_F32) return _mm256_loadu_ps((const float *)row + k);
    if (dt == MOE_DTYPE_MXFP4) {
        const unsigned char *blk = (const unsigned char *)row + (size_t)(k / MOE_MXFP4_BLOCK) * MOE_MXFP4_BYTES;
        const int j = k % MOE_MXFP4_BLOCK; /* 0, 8: low nibbles of qs[j..]; 16, 24: high of qs[j-16..] */
        /* a byte shuffle: vpermps (AVX-512's way) indexes only 8 floats
         * here, and a 3-bit table would need the sign bit added back */
        __m128i q = _mm_loadl_epi64((const __m128i *)(blk + 1 + (j & 15)));
        if (j & 16) q = _mm_srli_epi16(q, 4);
        q = _mm_and_si128(q, _mm_set1_epi8(15));
        q = _mm_shuffle_epi8(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), q);
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                             _mm256_castsi256_ps(_mm256_set1_epi32((int)moe_e8m0_half_bits[blk[0]])));
    }
    if (dt == MOE_DTYPE_FP8_B128) {
        const char *blk = row + (size_t)(k / MOE_FP8_BLOCK) * MOE_FP8_BYTES;
        float s;
        memcpy(&s, blk, 4);
        const __m256 v = _mm256_cvtph_ps(moe_e4m3x8_half(_mm_loadl_epi64((const __m128i *)(blk + 4 + k % MOE_FP8_BLOCK)), 0));
        return _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(256.0f)), _mm256_set1_ps(s));
    }
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    if (dt == MOE_DTYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* 16 inputs to 8 even then 8 odd. */
AVX2 INLINE void deinterleave16(float *d, const float *s)
{
    const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(s), idx);     /* e0..e3 o0..o3 */
    const __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(s + 8), idx); /* e4..e7 o4..o7 */
    _mm256_storeu_ps(d, _mm256_permute2f128_ps(a, b, 0x20));
    _mm256_storeu_ps(d + 8, _mm256_permute2f128_ps(a, b, 0x31));
}

/* The lane vocabulary of both templates (gemm_nat.h lists it). */
#define V_ATTR AVX2
#define V_F __m256
#define V_I __m256i
#define V_W 8
#define V_REGS 16
#define V_ZERO _mm256_setzero_ps
#define V_SET1I _mm256_set1_epi32
#define V_LOADU _mm256_loadu_ps
#define V_LOADI(p) _mm256_loadu_si256((const __m256i *)(p))
#define V_STOREU _mm256_storeu_ps
#define V_CASTPS _mm256_castsi256_ps
#define V_SLLI _mm256_slli_epi32
#define V_AND _mm256_and_si256
#define V_FMA _mm256_fmadd_ps
#define V_HSUM moe_hsum8
#define V_LOAD_W load_w8

#define NAT_MAXC 8
#define NAT_C1 8
#define NAT_C2 4
#define NAT_C3 4
#define NAT_C4 3
#include "runtime/cpu/gemm_nat.h"

#define EO_FN(name) name##_256
#define EO_MAXC 8
#define EO_C1 8
#define EO_C2 4
#define EO_C3 2
#define EO_C4 3
#define EO_PF 512
#define EO_DEINTERLEAVE(d, s) deinterleave16(d, s)
#include "runtime/cpu/gemm_eo.h"

AVX2 void moe_gemm_rows_avx2(float *y, size_t ldy, const float *x, size_t ldx, int T,
                             const void *w, enum moe_dtype wt, int Din, int n0, int n1,
                             const struct moe_tensor *b)
{
    switch (wt) {
    case MOE_DTYPE_F32: rows_dt(MOE_DTYPE_F32, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_BF16: rows_bf16_256(y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_F16: rows_dt(MOE_DTYPE_F16, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_MXFP4: rows_dt(MOE_DTYPE_MXFP4, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_FP8_B128: rows_dt(MOE_DTYPE_FP8_B128, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    default: MOE_ASSERT(!"gemm_fast: weights must be F32, F16, BF16, MXFP4 or FP8_B128 (Q8_0: gemm_q8.c)");
    }
}

/* Four independent XOR chains over 32-byte loads: never compute bound. */
AVX2 uint64_t moe_read_sweep_avx2(const void *p, size_t n)
{
    const char *c = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(c + i)));
        a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(c + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(c + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(c + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    uint64_t r = (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 1) ^
                 (uint64_t)_mm256_extract_epi64(a0, 2) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
    for (; i < n; i++) r ^= (uint64_t)(unsigned char)c[i] << (i % 8 * 8);
    return r;
}
