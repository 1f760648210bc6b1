/* q6_k.c - the Q6_K format's quantizer (MOE_DTYPE_Q6_K, tensor.h).
 *
 * A block of 256 values holds 16 sub-blocks of 16, each with the scale
 * d * sc (sc an int8, d the block's f16) and 16 codes q - 32 in -32..31.
 * The quantizer works in three steps, each on the values the format
 * stores:
 *   1. Per sub-block, a float scale s: the codes of x ~ s q for 7 grids
 *      (the value v of largest magnitude made -t, t = 28 .. 34, so the
 *      grid may clip v or leave room beside it; finer grids gained little:
 *      docs/results/2026-12-06-q6-k.md), each
 *      scale the least-squares fit to its codes, the best fit refitted
 *      once to the nearest codes of its own scale.  The least-squares
 *      error of codes q is sum x^2 - (sum x q)^2 / sum q^2, so the best
 *      fit is the one of largest (sum x q)^2 / sum q^2.
 *   2. The block's d = (the s of largest magnitude) / -128 rounded to f16,
 *      and each sub-block's sc among round(s / d) and its two neighbours
 *      (within -128..127), by the squared error of the codes nearest to
 *      x / (d sc).
 *   3. Each code the nearest of the 64 values (d * sc) * (q - 32) to x,
 *      computed as dequantization computes them (tensor.c).
 * Every operation is fp32 in a fixed order (no fused operations: C11
 * does not contract); the sums over a sub-block's 16 values run in 4
 * lanes, SSE2 registers where the compiler has them, else the same
 * operations in plain C, so the bytes do not depend on which. */
#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <string.h>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

enum {
    SUB = 16,                    /* values per sub-block */
    NSUB = MOE_Q6_K_BLOCK / SUB, /* sub-blocks per block */
    GRIDS = 7,                   /* candidate grids: t = GRID0 + i GRID_STEP */
};
#define GRID0 28.0f
#define GRID_STEP 1.0f

/* The nearest integer to v, ties to even, for |v| < 2^22 (fp32 addition
 * rounds). */
static inline float round_near(float v) { return (v + 12582912.0f) - 12582912.0f; }

/* v clamped to the codes' range -32..31 (a NaN becomes -32): what maxps
 * then minps compute. */
static inline float clamp_code(float v)
{
    v = v > -32.0f ? v : -32.0f;
    return v < 31.0f ? v : 31.0f;
}

#if defined(__SSE2__)
static inline __m128 round_near4(__m128 v)
{
    const __m128 m = _mm_set1_ps(12582912.0f);
    return _mm_sub_ps(_mm_add_ps(v, m), m);
}
static inline __m128 clamp_code4(__m128 v)
{
    return _mm_min_ps(_mm_max_ps(v, _mm_set1_ps(-32.0f)), _mm_set1_ps(31.0f));
}
static inline float sum4(__m128 v)
{
    float l[4];
    _mm_storeu_ps(l, v);
    return (l[0] + l[2]) + (l[1] + l[3]);
}
#endif

/* The sums sum x q and sum q q of x's codes q = clamp(round(x * is)), in
 * 4 lanes (value i in lane i % 4), then (l0 + l2) + (l1 + l3): SSE2
 * registers where the compiler has them, else the same operations in C. */
static inline void code_sums(const float *x, float is, float *sxq, float *sqq)
{
#if defined(__SSE2__)
    __m128 p = _mm_setzero_ps(), r = _mm_setzero_ps();
    for (int i = 0; i < SUB; i += 4) {
        const __m128 xv = _mm_loadu_ps(x + i), q = clamp_code4(round_near4(_mm_mul_ps(xv, _mm_set1_ps(is))));
        p = _mm_add_ps(p, _mm_mul_ps(xv, q));
        r = _mm_add_ps(r, _mm_mul_ps(q, q));
    }
    *sxq = sum4(p);
    *sqq = sum4(r);
#else
    float p[4] = {0}, r[4] = {0};
    for (int i = 0; i < SUB; i += 4)
        for (int k = 0; k < 4; k++) {
            const float q = clamp_code(round_near(x[i + k] * is));
            p[k] += x[i + k] * q;
            r[k] += q * q;
        }
    *sxq = (p[0] + p[2]) + (p[1] + p[3]);
    *sqq = (r[0] + r[2]) + (r[1] + r[3]);
#endif
}

/* Step 1: the sub-block's float scale (0 when every value is 0). */
static float fit_sub(const float *x)
{
    float v = 0.0f;
    for (int i = 0; i < SUB; i++) v = fabsf(x[i]) > fabsf(v) ? x[i] : v;
    if (v == 0.0f) return 0.0f;
    double best_num = -1.0, best_den = 1.0; /* the best (sum x q)^2 and sum q^2 */
    float best = v / -32.0f;
    for (int g = 0; g <= GRIDS; g++) {
        /* the grids, then the best scale's own nearest codes */
        const float is = g < GRIDS ? -(GRID0 + GRID_STEP * (float)g) / v : 1.0f / best;
        float sxq, sqq;
        code_sums(x, is, &sxq, &sqq);
        if (!(sqq > 0.0f)) continue;
        const double num = (double)sxq * sxq;
        if (num * best_den > best_num * sqq) {
            best_num = num;
            best_den = sqq;
            best = sxq / sqq;
        }
    }
    return best;
}

/* The squared error of x's codes round(x / S) at scale S (S != 0), in the
 * order dequantization rounds, in 4 lanes as code_sums. */
static float sub_error(const float *x, float S)
{
    const float is = 1.0f / S;
#if defined(__SSE2__)
    __m128 e = _mm_setzero_ps();
    for (int i = 0; i < SUB; i += 4) {
        const __m128 xv = _mm_loadu_ps(x + i), q = clamp_code4(round_near4(_mm_mul_ps(xv, _mm_set1_ps(is))));
        const __m128 r = _mm_sub_ps(xv, _mm_mul_ps(_mm_set1_ps(S), q));
        e = _mm_add_ps(e, _mm_mul_ps(r, r));
    }
    return sum4(e);
#else
    float e[4] = {0};
    for (int i = 0; i < SUB; i += 4)
        for (int k = 0; k < 4; k++) {
            const float r = x[i + k] - S * clamp_code(round_near(x[i + k] * is));
            e[k] += r * r;
        }
    return (e[0] + e[2]) + (e[1] + e[3]);
#endif
}

/* Step 3: the codes (0..63) of a sub-block at scale S: each the one whose
 * value S * (q - 32) is nearest x; of two as near, the rounding of x / S
 * (of its two neighbours, the lower); every code 32 when S is 0. */
static void nearest_codes(const float *x, float S, uint8_t *q)
{
    if (S == 0.0f) {
        memset(q, 32, SUB);
        return;
    }
#if defined(__SSE2__)
    for (int i = 0; i < SUB; i += 4) {
        const __m128 xv = _mm_loadu_ps(x + i), sv = _mm_set1_ps(S), one = _mm_set1_ps(1.0f);
        const __m128 absm = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff)), inf = _mm_set1_ps(INFINITY);
        const __m128 k = clamp_code4(round_near4(_mm_div_ps(xv, sv)));
        const __m128 km = _mm_sub_ps(k, one), kp = _mm_add_ps(k, one);
        const __m128 e0 = _mm_and_ps(_mm_sub_ps(xv, _mm_mul_ps(sv, k)), absm);
        const __m128 vm = _mm_cmpge_ps(km, _mm_set1_ps(-32.0f)), vp = _mm_cmple_ps(kp, _mm_set1_ps(31.0f));
        const __m128 em = _mm_or_ps(_mm_and_ps(vm, _mm_and_ps(_mm_sub_ps(xv, _mm_mul_ps(sv, km)), absm)),
                                    _mm_andnot_ps(vm, inf));
        const __m128 ep = _mm_or_ps(_mm_and_ps(vp, _mm_and_ps(_mm_sub_ps(xv, _mm_mul_ps(sv, kp)), absm)),
                                    _mm_andnot_ps(vp, inf));
        const __m128 lm = _mm_cmplt_ps(em, e0);
        __m128 c = _mm_or_ps(_mm_and_ps(lm, km), _mm_andnot_ps(lm, k));
        const __m128 ec = _mm_or_ps(_mm_and_ps(lm, em), _mm_andnot_ps(lm, e0));
        const __m128 lp = _mm_cmplt_ps(ep, ec);
        c = _mm_or_ps(_mm_and_ps(lp, kp), _mm_andnot_ps(lp, c));
        int32_t ci[4];
        _mm_storeu_si128((__m128i *)ci, _mm_cvttps_epi32(c));
        for (int l = 0; l < 4; l++) q[i + l] = (uint8_t)(ci[l] + 32);
    }
#else
    for (int i = 0; i < SUB; i++) {
        const float k = clamp_code(round_near(x[i] / S)), km = k - 1.0f, kp = k + 1.0f;
        const float e0 = fabsf(x[i] - S * k);
        const float em = km >= -32.0f ? fabsf(x[i] - S * km) : INFINITY;
        const float ep = kp <= 31.0f ? fabsf(x[i] - S * kp) : INFINITY;
        float c = em < e0 ? km : k;
        const float ec = em < e0 ? em : e0;
        c = ep < ec ? kp : c;
        q[i] = (uint8_t)((int)c + 32);
    }
#endif
}

/* One block of 256 finite values into the 210 bytes at b; false when d
 * overflows f16. */
static bool q6_k_block(const float *x, unsigned char *b)
{
    float s[NSUB], smax = 0.0f;
    for (int j = 0; j < NSUB; j++) {
        s[j] = fit_sub(x + SUB * j);
        smax = fabsf(s[j]) > fabsf(smax) ? s[j] : smax;
    }
    const uint16_t dh = moe_f32_to_f16(smax / -128.0f);
    if ((dh & 0x7c00u) == 0x7c00u) return false; /* past f16's range */
    const float d = moe_f16_to_f32(dh);
    int8_t sc[NSUB];
    float S[NSUB];
    for (int j = 0; j < NSUB; j++) {
        sc[j] = 0;
        S[j] = 0.0f;
        if (d == 0.0f || s[j] == 0.0f) continue;
        const float r = round_near(fmaxf(-128.0f, fminf(127.0f, s[j] / d)));
        float best = INFINITY;
        for (int o = -1; o <= 1; o++) {
            const float c = r + (float)o;
            if (c < -128.0f || c > 127.0f || c == 0.0f) continue;
            const float e = sub_error(x + SUB * j, d * c);
            if (e < best) {
                best = e;
                sc[j] = (int8_t)c;
                S[j] = d * c;
            }
        }
    }
    uint8_t q[MOE_Q6_K_BLOCK];
    for (int j = 0; j < NSUB; j++) nearest_codes(x + SUB * j, S[j], q + SUB * j);
    /* the packing of MOE_DTYPE_Q6_K, half by half */
    memset(b, 0, MOE_Q6_K_BYTES);
    for (int h = 0; h < 2; h++) {
        const uint8_t *qh = q + 128 * h;
        unsigned char *ql = b + 64 * h, *hi = b + 128 + 32 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (unsigned char)((qh[l] & 15u) | (qh[l + 64] & 15u) << 4);
            ql[l + 32] = (unsigned char)((qh[l + 32] & 15u) | (qh[l + 96] & 15u) << 4);
            hi[l] = (unsigned char)(qh[l] >> 4 | (qh[l + 32] >> 4) << 2 | (qh[l + 64] >> 4) << 4 | (qh[l + 96] >> 4) << 6);
        }
    }
    memcpy(b + 192, sc, NSUB);
    memcpy(b + 208, &dh, 2);
    return true;
}

bool moe_quantize_row_q6_k(void *dst, const float *src, size_t n)
{
    unsigned char *b = dst;
    MOE_ASSERT(n % MOE_Q6_K_BLOCK == 0);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(src[i])) return false;
    for (size_t o = 0; o < n; o += MOE_Q6_K_BLOCK, b += MOE_Q6_K_BYTES)
        if (!q6_k_block(src + o, b)) return false;
    return true;
}
