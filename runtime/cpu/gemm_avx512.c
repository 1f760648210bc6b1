/* gemm_avx512.c - AVX-512 kernels of the fast matrix product (see
 * gemm_fast.h for the contract and the numeric policy): the templates
 * gemm_nat.h (f32, f16) and gemm_eo.h (bf16) at 16 lanes.
 *
 * 32 zmm registers: the batch tile is 4 input rows x 6 weight rows (24
 * accumulators); rows of a decode step take 8 (one or two rows) or 6
 * weight rows at a time.  bf16 weights take the even/odd order in 64-byte
 * blocks (a cache line), decode tiles of 16, 8 or 6 weight rows. */
#include <immintrin.h>
#include <stdbool.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/core/status.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* 16 weights of dtype dt from element k, widened to fp32 (MXFP4: each
 * nibble, zero-extended to a 32-bit lane, indexes a 16-float table of the
 * doubled E2M1 values (vpermps reads the low 4 bits, so no mask) and is
 * multiplied by half the block's scale, exact; FP8_B128: as gemm_avx2.c,
 * 16 bytes at a time; k is a multiple of 16, so within one block).  For
 * MXFP4 the float table saves the byte shuffle's int -> float conversion
 * and the scale's computation per block. */
AVX512 INLINE __m512 load_w16(const char *row, const enum moe_dtype dt, int k)
{
    if (dt == MOE_DTYPE_F32) return _mm512_loadu_ps((const float *)row + k);
    if (dt == MOE_DTYPE_MXFP4) {
        const unsigned char *blk = (const unsigned char *)row + (size_t)(k / MOE_MXFP4_BLOCK) * MOE_MXFP4_BYTES;
        /* k % 32 == 0: the low nibbles of qs, 16: the high ones (a predictable
         * branch: the loops alternate, and an immediate shift is one uop) */
        __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 1)));
        if (k & 16) q = _mm512_srli_epi32(q, 4);
        const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, -0.0f, -1, -2, -3, -4, -6, -8, -12);
        return _mm512_mul_ps(_mm512_permutexvar_ps(q, lut),
                             _mm512_castsi512_ps(_mm512_set1_epi32((int)moe_e8m0_half_bits[blk[0]])));
    }
    if (dt == MOE_DTYPE_FP8_B128) {
        const char *blk = row + (size_t)(k / MOE_FP8_BLOCK) * MOE_FP8_BYTES;
        float s;
        memcpy(&s, blk, 4);
        const __m256i q = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 4 + k % MOE_FP8_BLOCK)));
        const __m512 v =
            _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(q, 7), _mm256_set1_epi16(MOE_FP8_F16_MASK)));
        return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(256.0f)), _mm512_set1_ps(s));
    }
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k));
    if (dt == MOE_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* Fixed order: 256-bit halves added, then as gemm_avx2.c. */
AVX512 INLINE float hsum16(__m512 v)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 inputs to 16 even then 16 odd. */
AVX512 INLINE void deinterleave32(float *d, const float *s)
{
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const __m512 a = _mm512_loadu_ps(s), c = _mm512_loadu_ps(s + 16);
    _mm512_storeu_ps(d, _mm512_permutex2var_ps(a, ev, c));
    _mm512_storeu_ps(d + 16, _mm512_permutex2var_ps(a, od, c));
}

/* The lane vocabulary of both templates (gemm_nat.h lists it). */
#define V_ATTR AVX512
#define V_F __m512
#define V_I __m512i
#define V_W 16
#define V_REGS 32
#define V_ZERO _mm512_setzero_ps
#define V_SET1I _mm512_set1_epi32
#define V_LOADU _mm512_loadu_ps
#define V_LOADI _mm512_loadu_si512
#define V_STOREU _mm512_storeu_ps
#define V_CASTPS _mm512_castsi512_ps
#define V_SLLI _mm512_slli_epi32
#define V_AND _mm512_and_si512
#define V_FMA _mm512_fmadd_ps
#define V_HSUM hsum16
#define V_LOAD_W load_w16

#define NAT_MAXC 8
#define NAT_C1 8
#define NAT_C2 8
#define NAT_C3 6
#define NAT_C4 6
#include "runtime/cpu/gemm_nat.h"

#define EO_FN(name) name##_512
#define EO_MAXC 16
#define EO_C1 16
#define EO_C2 8
#define EO_C3 6
#define EO_C4 6
#define EO_PF 256
#define EO_DEINTERLEAVE(d, s) deinterleave32(d, s)
#include "runtime/cpu/gemm_eo.h"

AVX512 void moe_gemm_rows_avx512(float *y, size_t ldy, const float *x, size_t ldx, int T,
                                 const void *w, enum moe_dtype wt, int Din, int n0, int n1,
                                 const struct moe_tensor *b)
{
    switch (wt) {
    case MOE_DTYPE_F32: rows_dt(MOE_DTYPE_F32, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_BF16: rows_bf16_512(y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_F16: rows_dt(MOE_DTYPE_F16, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_MXFP4: rows_dt(MOE_DTYPE_MXFP4, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    case MOE_DTYPE_FP8_B128: rows_dt(MOE_DTYPE_FP8_B128, y, ldy, x, ldx, T, w, Din, n0, n1, b); break;
    default: MOE_ASSERT(!"gemm_fast: weights must be F32, F16, BF16, MXFP4 or FP8_B128 (Q8_0: gemm_q8.c)");
    }
}
