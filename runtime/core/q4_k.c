/* q4_k.c - the Q4_K format's heads and quantizer (MOE_DTYPE_Q4_K,
 * tensor.h).
 *
 * The quantizer fits each group of 32 values as x ~ s q - a (codes q in
 * 0..15, s and a >= 0) by least squares over candidate code assignments:
 * the group's range [lo, hi] (lo at most 0) cut into 15 steps (Q4_1's
 * line), and into 15 + i/2 steps for i = -3..3, each assignment's (s, a)
 * the least-squares line through it (a clamped at 0) and its squared
 * error from the closed form; the best line is kept.  Stretching the grid past
 * the range lets the line clip a group's outliers where that lowers the
 * error, which min/max quantizers (Q4_0, Q4_1) cannot.  The block's d and
 * dmin are then the largest s and a over 63 (f16), and each group's 6-bit
 * pair is chosen among the roundings of s / d, a / dmin and their
 * neighbours by the error of its nearest codes, so the stored values, not
 * the unquantized line, are what is optimized last.
 *
 * Measured (docs/quality.md): relative RMS error 0.0543 on uniform random
 * weights (Q4_1's min/max 0.0607; llama.cpp's Q4_K 0.0546 on such
 * weights), 0.0704 on Gaussian ones (Q4_1 0.0782); about 14 ns a weight on
 * one core of the development machine (Q4_1: 2.3).  Wider searches (13
 * or 21 grids) gained under 0.4% of error for 1.3-1.7x the time. */
#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <string.h>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

enum {
    G = 32,   /* values per group */
    NG = 8,   /* groups per block */
    CAND = 3, /* candidate grids each side of 15 steps, CAND_STEP apart */
};
#define CAND_STEP 0.5f

void moe_q4_k_heads(const void *blk, float d[8], float m[8])
{
    const unsigned char *b = blk;
    uint16_t h[2];
    memcpy(h, b, 4);
    const float D = moe_f16_to_f32(h[0]), M = moe_f16_to_f32(h[1]);
    uint64_t sc, mn;
    moe_q4_k_scales(b + 4, &sc, &mn);
    for (int j = 0; j < NG; j++) {
        d[j] = D * (float)((sc >> (8 * j)) & 63u);
        m[j] = -(M * (float)((mn >> (8 * j)) & 63u));
    }
}

/* Sums 8 partial sums in a fixed order. */
static inline float sum8(const float p[8])
{
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

/* Per lane k (0..7), over the values x[k], x[k + 8], ... of a group:
 * each value's code c = the rounding half up of v, v = (x + a) * is
 * clamped to [0, 15] (mode CODES), or of v = (x - lo) * is (mode LINE);
 * CODES: e[k] the sum of (x - (c s - a))^2, and the codes into q when not
 * NULL; LINE: e, e2, e3 the sums of c, c^2 and c x.  SSE2 where the
 * compiler has it, else the same lanes in C: each lane's operations and
 * their order are the same, so the same bits. */
enum lanes_mode { CODES, LINE };
static inline void lanes(enum lanes_mode mode, const float *x, float s, float a, float lo, float is, float e[8],
                         float e2[8], float e3[8], uint8_t *q)
{
#if defined(__SSE2__)
    for (int h = 0; h < 2; h++) {
        __m128 acc = _mm_setzero_ps(), acc2 = _mm_setzero_ps(), acc3 = _mm_setzero_ps();
        for (int i = 4 * h; i < G; i += 8) {
            const __m128 xv = _mm_loadu_ps(x + i);
            __m128 v = mode == CODES ? _mm_mul_ps(_mm_add_ps(xv, _mm_set1_ps(a)), _mm_set1_ps(is))
                                     : _mm_mul_ps(_mm_sub_ps(xv, _mm_set1_ps(lo)), _mm_set1_ps(is));
            v = _mm_min_ps(_mm_max_ps(v, _mm_setzero_ps()), _mm_set1_ps(15.0f));
            const __m128i ci = _mm_cvttps_epi32(_mm_add_ps(v, _mm_set1_ps(0.5f)));
            const __m128 c = _mm_cvtepi32_ps(ci);
            if (mode == CODES) {
                const __m128 r = _mm_sub_ps(xv, _mm_sub_ps(_mm_mul_ps(c, _mm_set1_ps(s)), _mm_set1_ps(a)));
                acc = _mm_add_ps(acc, _mm_mul_ps(r, r));
                if (q) {
                    int32_t cs[4];
                    _mm_storeu_si128((__m128i *)cs, ci);
                    for (int k = 0; k < 4; k++) q[i + k] = (uint8_t)cs[k];
                }
            } else {
                acc = _mm_add_ps(acc, c);
                acc2 = _mm_add_ps(acc2, _mm_mul_ps(c, c));
                acc3 = _mm_add_ps(acc3, _mm_mul_ps(c, xv));
            }
        }
        _mm_storeu_ps(e + 4 * h, acc);
        if (mode == LINE) {
            _mm_storeu_ps(e2 + 4 * h, acc2);
            _mm_storeu_ps(e3 + 4 * h, acc3);
        }
    }
#else
    for (int k = 0; k < 8; k++) {
        float acc = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
        for (int i = k; i < G; i += 8) {
            float v = mode == CODES ? (x[i] + a) * is : (x[i] - lo) * is;
            v = v > 0.0f ? v : 0.0f;
            v = v < 15.0f ? v : 15.0f;
            const int ci = (int)(v + 0.5f);
            const float c = (float)ci;
            if (mode == CODES) {
                const float r = x[i] - (c * s - a);
                acc += r * r;
                if (q) q[i] = (uint8_t)ci;
            } else {
                acc += c;
                acc2 += c * c;
                acc3 += c * x[i];
            }
        }
        e[k] = acc;
        if (mode == LINE) {
            e2[k] = acc2;
            e3[k] = acc3;
        }
    }
#endif
}

/* The group's squared error at (s, a) with each value's code the nearest
 * to (x + a) / s (0 when s is 0), into q when not NULL. */
static float group_error(const float *x, float s, float a, uint8_t *q)
{
    float e[8];
    lanes(CODES, x, s, a, 0.0f, s > 0.0f ? 1.0f / s : 0.0f, e, NULL, NULL, q);
    return sum8(e);
}

/* The least-squares line x ~ s q - a over the candidate grids (above). */
static void fit_group(const float *x, float *s_out, float *a_out)
{
    float lo = x[0], hi = x[0];
    double sx = 0.0, sxx = 0.0;
    for (int i = 0; i < G; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sx += x[i];
        sxx += (double)x[i] * x[i];
    }
    if (lo > 0.0f) lo = 0.0f;
    if (!(hi > lo)) { /* all equal, at most 0 */
        *s_out = 0.0f;
        *a_out = -lo;
        return;
    }
    float bs = (hi - lo) / 15.0f, ba = -lo; /* min/max: Q4_1's line */
    double best = group_error(x, bs, ba, NULL);
    /* the codes' sums are small integers, exact in fp32 */
    for (int i = -CAND; i <= CAND; i++) {
        const float is = (15.0f + CAND_STEP * (float)i) / (hi - lo);
        float pq[8], pqq[8], pqx[8];
        lanes(LINE, x, 0.0f, 0.0f, lo, is, pq, pqq, pqx, NULL);
        const float sq = sum8(pq), sqq = sum8(pqq), sqx = sum8(pqx);
        const double det = G * (double)sqq - (double)sq * sq;
        if (!(det > 0.0)) continue;
        double s = (G * (double)sqx - sq * sx) / det, b = (sx - s * sq) / G;
        if (b > 0.0) { /* the offset must be at most 0 */
            b = 0.0;
            s = sqx / sqq;
        }
        if (!(s > 0.0)) continue;
        /* squared error of the line at these codes, in closed form */
        const double e = sxx - 2.0 * s * sqx - 2.0 * b * sx + s * s * sqq + 2.0 * s * b * sq + G * b * b;
        if (e < best) {
            best = e;
            bs = (float)s;
            ba = (float)-b;
        }
    }
    *s_out = bs;
    *a_out = ba;
}

/* The 6-bit multiple of unit nearest v, clamped to 0..63 (0 when unit is
 * 0). */
static int six_bits(float v, float unit)
{
    if (!(unit > 0.0f)) return 0;
    const float r = v / unit;
    return r <= 0.0f ? 0 : r >= 63.0f ? 63 : (int)(r + 0.5f);
}

bool moe_quantize_row_q4_k(void *dst, const float *src, size_t n)
{
    unsigned char *b = dst;
    MOE_ASSERT(n % MOE_Q4_K_BLOCK == 0);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(src[i])) return false;
    for (size_t o = 0; o < n; o += MOE_Q4_K_BLOCK, b += MOE_Q4_K_BYTES) {
        const float *x = src + o;
        float s[NG], a[NG], smax = 0.0f, amax = 0.0f;
        for (int j = 0; j < NG; j++) {
            fit_group(x + G * j, &s[j], &a[j]);
            smax = s[j] > smax ? s[j] : smax;
            amax = a[j] > amax ? a[j] : amax;
        }
        const uint16_t h[2] = {moe_f32_to_f16(smax / 63.0f), moe_f32_to_f16(amax / 63.0f)};
        if ((h[0] & 0x7c00u) == 0x7c00u || (h[1] & 0x7c00u) == 0x7c00u) return false; /* past f16's range */
        const float D = moe_f16_to_f32(h[0]), M = moe_f16_to_f32(h[1]);
        uint8_t sc[NG], mn[NG], q[MOE_Q4_K_BLOCK];
        for (int j = 0; j < NG; j++) {
            const int s0 = six_bits(s[j], D), a0 = six_bits(a[j], M);
            double best = INFINITY;
            for (int ds = -1; ds <= 1; ds++)
                for (int da = -1; da <= 1; da++) {
                    const int si = s0 + ds, ai = a0 + da;
                    if (si < 0 || si > 63 || ai < 0 || ai > 63) continue;
                    const double e = group_error(x + G * j, D * (float)si, M * (float)ai, NULL);
                    if (e < best) {
                        best = e;
                        sc[j] = (uint8_t)si;
                        mn[j] = (uint8_t)ai;
                    }
                }
            group_error(x + G * j, D * (float)sc[j], M * (float)mn[j], q + G * j);
        }
        memcpy(b, h, 4);
        for (int j = 0; j < 4; j++) {
            b[4 + j] = (unsigned char)(sc[j] | (sc[j + 4] >> 4) << 6);
            b[8 + j] = (unsigned char)(mn[j] | (mn[j + 4] >> 4) << 6);
            b[12 + j] = (unsigned char)((sc[j + 4] & 15u) | (mn[j + 4] & 15u) << 4);
        }
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 32; k++)
                b[16 + 32 * c + k] = (unsigned char)(q[64 * c + k] | q[64 * c + 32 + k] << 4);
    }
    return true;
}
