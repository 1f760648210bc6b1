/* gemm_q4.c - the fast matrix product over four-bit weights (Q4_1, Q4_G32,
 * Q4_G128: runtime/core/tensor.h), for both kernel sets, built as
 * gemm_q8.c is: each input row is quantized to int8 blocks of 32 of its
 * own, and each block's dot with the weight codes is an exact integer
 * sum.  The tiles (gemm_q4_tile.h) are compiled twice: with AVX2
 * instructions, and, for the AVX-512 set on processors that have
 * AVX512-VNNI, with vpdpbusd in place of vpmaddubsw + vpmaddwd (256-bit
 * vectors still; the same integer sums, so the same bits).
 *
 * Why: widening four-bit codes to fp32 (extend, convert, scale and
 * offset, FMA) leaves the product compute bound at well under the memory
 * bandwidth it could use.  Here a run of 32 weights against one input row
 * takes a 16-byte broadcast load, a shift of its upper half by 4 and an
 * AND (the 32 unsigned codes in element order: byte j holds element j low
 * and j + 16 high), vpmaddubsw (codes unsigned times the input's int8
 * codes, pairs summed to int16: at most 2 x 15 x 127, no saturation),
 * vpmaddwd by ones (lane j: elements 4j..4j+3 as int32; or vpdpbusd),
 * convert, the product of the two scales and an FMA; the offset costs one
 * FMA per group.  A group's head is read once per weight row and group (Q4_1: one
 * 4-byte load widened by F16C gives d and m; Q4_G128: once per 4 runs).
 *
 * Input rows: per block of 32, int8 codes qx and a scale dx as gemm_q8.c
 * makes them (moe_quantize_x_q8, simd_avx2.h: |x - qx dx| <= dx / 2; a
 * NaN or an infinity makes dx NaN), and per weight group S, the sum over
 * its blocks in order of dx x (the block's integer code sum), one rounding
 * a step.  The offset term of a group is m S, m times the sum of the
 * quantized inputs, not of the fp32 inputs: an output is then the product
 * of the quantized input row with the exactly dequantized weights w = q d
 * + m, and its error from the reference (fp32 inputs) is the sum of w_k
 * (x_k - qx_k dx_k), at most sum |w_k| dx_k / 2.  With the exact fp32 sum
 * of x instead the error would be the sum of (q_k d)(x_k - qx_k dx_k): no
 * offset in it, but q d = w - m runs from 0 to max - min rather than
 * from min to max, so for weights centred on zero (m near -2 sigma for
 * Gaussian ones) its spread is about sqrt(5) times larger.  Both cost the
 * same (made once per input row and call).  Each row's codes, dx and S
 * are laid out group by group in one stream (struct xq), so a tile of 4
 * input rows addresses 4 streams.
 *
 * Numerics: output n of row t accumulates in lane j, over groups in
 * order, each run k of the group: acc = fma(float(isum_kj), d x dx_k,
 * acc), then the group's offset: acc = fma((0, S, dx_0, ...)_j, (d, m, 0,
 * ...)_j, acc) (m S in lane 1, exact zeros elsewhere: d is finite); then
 * the fixed horizontal sum moe_hsum8, then the bias.  The integer sums are
 * exact, so the only differences from the reference are the input
 * rounding above and fp32 rounding.  Every tile computes that same
 * expression, so a row gives the same bits alone or in any batch, and
 * both kernel sets the same bits.  The rows of up to TBQ inputs are
 * quantized into the calling thread's buffer (moe_gemm_thread_buffer) on
 * each call, once for all its weight rows. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/cpu/simd_avx2.h"
#include "runtime/core/status.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum {
    RUN = 32,  /* elements per run of 16 code bytes (and per input block) */
    TBQ = 64,  /* input rows quantized at a time */
    MAXC = 8,  /* widest tile: weight rows for one input row */
};

/* The quantized input rows of a call, one stream per row (stride rs
 * bytes): per weight group of NR runs, 32 bytes of head (0, S, dx_0 ..
 * dx_{NR-1}, 0, ...) as floats, then the NR blocks' 32 codes each. */
struct xq {
    const char *p;
    size_t rs;
};

/* Input row x (ng groups of nr blocks) into its stream o (struct xq): each
 * block quantized by moe_quantize_x_q8, and S the sum over the group's
 * blocks in order of dx x (the block's code sum), each step one rounding. */
AVX2 static void quantize_input(char *o, const float *x, int ng, int nr)
{
    for (int g = 0; g < ng; g++, o += 32 + 32 * nr) {
        float *h = (float *)o, S = 0.0f;
        _mm256_store_ps(h, _mm256_setzero_ps());
        for (int k = 0; k < nr; k++) {
            int8_t *q = (int8_t *)o + 32 + 32 * k;
            moe_quantize_x_q8(q, h + 2 + k, x + (size_t)(g * nr + k) * RUN, 1);
            const __m256i c = _mm256_load_si256((const __m256i *)q);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), c), _mm256_set1_epi16(1));
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
            S = fmaf(h[2 + k], (float)_mm_cvtsi128_si32(t), S);
        }
        h[1] = S;
    }
}

/* the AVX2 instance: every processor the fast kernels run on */
#define Q4_ATTR AVX2
#define Q4_FN(name) name##_avx2
#define Q4_DOT(w, x) _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
#define Q4_ENTRY moe_gemm_rows_q4_avx2
#include "runtime/cpu/gemm_q4_tile.h"
#undef Q4_ATTR
#undef Q4_FN
#undef Q4_DOT
#undef Q4_ENTRY

/* the AVX-512 set's instance where the processor has AVX512-VNNI
 * (gemm_fast.c checks) */
#define Q4_ATTR __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define Q4_FN(name) name##_vnni
#define Q4_DOT(w, x) _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
#define Q4_ENTRY moe_gemm_rows_q4_vnni
#include "runtime/cpu/gemm_q4_tile.h"
