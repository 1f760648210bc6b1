/* q5_k_fit.h - the Q5_K quantizer of one block (MOE_DTYPE_Q5_K, tensor.h),
 * q4_k_fit.h's search with five-bit codes: fp32 and fp64 operations in a
 * fixed order, none fused (C11 does not contract expressions), so that a
 * device twin built with --fmad=false could make the same bytes.
 *
 * Each group of 32 values is fitted as x ~ s q - a (codes q in 0..31, s
 * and a >= 0) by least squares over candidate code assignments: the
 * group's range [lo, hi] (lo at most 0) cut into 31 steps (the min/max
 * line), and into 31 + i steps for i = -3..3, each assignment's (s, a) the
 * least-squares line through it (a clamped at 0) and its squared error
 * from the closed form; the best line is kept.  Stretching the grid past
 * the range lets the line clip a group's outliers where that lowers the
 * error.  The block's d and dmin are then the largest s and a over 63
 * (f16), and each group's 6-bit pair (sc, mn) is chosen among the
 * roundings of s / d, a / dmin and their neighbours by the error of its
 * nearest codes, so the stored values, not the unquantized line, are
 * what is optimized last.  The codes are then the nearest ones, q =
 * clamp(round half up((x + m) / d_j), 0, 31) with d_j = d sc, m = dmin mn.
 *
 * The sums over a group run in 8 lanes (value i in lane i % 8), then
 * q5k_sum8's fixed order, as q4_k_fit.h's; the grids' step is one code
 * where Q4_K's is half of one (the same share of the range).
 *
 * An includer may define Q5K_ERROR and Q5K_LINE before including:
 * functions with q5k_error_c's and q5k_line_c's arguments and results,
 * bit for bit (q5_k_avx2.c: the 8 lanes in one register). */
#pragma once

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "runtime/core/fit_f16.h"
#include "runtime/core/tensor.h"

#define Q5K_FN MOE_FIT_FN

#define Q5K_G 32         /* values per group */
#define Q5K_NG 8         /* groups per block */
#define Q5K_TOP 31.0f    /* the largest code */
#define Q5K_CAND 3       /* candidate grids each side of 31 steps, Q5K_CAND_STEP apart */
#define Q5K_CAND_STEP 1.0f
#define Q5K_HEAD 16      /* the block's leading bytes: f16 d, f16 dmin, 12 of scales */

/* The code of v clamped to [0, 31], rounded half up. */
Q5K_FN int q5k_code(float v)
{
    v = v > 0.0f ? v : 0.0f;
    v = v < Q5K_TOP ? v : Q5K_TOP;
    return (int)(v + 0.5f);
}

/* Sums 8 partial sums in a fixed order. */
Q5K_FN float q5k_sum8(const float p[8])
{
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

/* The group's squared error at (s, a) with each value's code the nearest
 * to (x + a) / s (0 when s is 0), the codes into q when not NULL.  Lane k
 * sums values k, k + 8, k + 16, k + 24 in that order (the lanes are the
 * inner loop, so the compiler may run them as vectors: the same
 * operations, the same bits). */
Q5K_FN float q5k_error_c(const float *x, float s, float a, uint8_t *q)
{
    const float is = s > 0.0f ? 1.0f / s : 0.0f;
    float e[8] = {0};
    for (int i = 0; i < Q5K_G; i += 8)
        for (int k = 0; k < 8; k++) {
            const int ci = q5k_code((x[i + k] + a) * is);
            const float r = x[i + k] - ((float)ci * s - a);
            e[k] += r * r;
            if (q) q[i + k] = (uint8_t)ci;
        }
    return q5k_sum8(e);
}

/* The sums of the codes c = code((x - lo) * is), of c^2 and of c x, in
 * q5k_error_c's lanes. */
Q5K_FN void q5k_line_c(const float *x, float lo, float is, float *sq, float *sqq, float *sqx)
{
    float p[8] = {0}, pp[8] = {0}, px[8] = {0};
    for (int i = 0; i < Q5K_G; i += 8)
        for (int k = 0; k < 8; k++) {
            const float c = (float)q5k_code((x[i + k] - lo) * is);
            p[k] += c;
            pp[k] += c * c;
            px[k] += c * x[i + k];
        }
    *sq = q5k_sum8(p), *sqq = q5k_sum8(pp), *sqx = q5k_sum8(px);
}

#ifndef Q5K_ERROR
#define Q5K_ERROR q5k_error_c
#endif
#ifndef Q5K_LINE
#define Q5K_LINE q5k_line_c
#endif

/* The least-squares line x ~ s q - a over the candidate grids (above). */
Q5K_FN void q5k_fit_group(const float *x, float *s_out, float *a_out)
{
    float lo = x[0], hi = x[0];
    double sx = 0.0, sxx = 0.0;
    for (int i = 0; i < Q5K_G; i++) {
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
    float bs = (hi - lo) / Q5K_TOP, ba = -lo; /* the min/max line */
    double best = Q5K_ERROR(x, bs, ba, NULL);
    /* the codes' sums are small integers, exact in fp32 */
    for (int i = -Q5K_CAND; i <= Q5K_CAND; i++) {
        float sq, sqq, sqx;
        Q5K_LINE(x, lo, (Q5K_TOP + Q5K_CAND_STEP * (float)i) / (hi - lo), &sq, &sqq, &sqx);
        const double det = Q5K_G * (double)sqq - (double)sq * sq;
        if (!(det > 0.0)) continue;
        double s = (Q5K_G * (double)sqx - sq * sx) / det, b = (sx - s * sq) / Q5K_G;
        if (b > 0.0) { /* the offset must be at most 0 */
            b = 0.0;
            s = sqx / sqq;
        }
        if (!(s > 0.0)) continue;
        /* squared error of the line at these codes, in closed form */
        const double e = sxx - 2.0 * s * sqx - 2.0 * b * sx + s * s * sqq + 2.0 * s * b * sq + Q5K_G * b * b;
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
Q5K_FN int q5k_six_bits(float v, float unit)
{
    if (!(unit > 0.0f)) return 0;
    const float r = v / unit;
    return r <= 0.0f ? 0 : r >= 63.0f ? 63 : (int)(r + 0.5f);
}

/* One block of 256 finite values x: its 16 leading bytes into head (f16 d,
 * f16 dmin, the 12 bytes of 6-bit scales and minimums as MOE_DTYPE_Q5_K
 * stores them: Q4_K's packing) and its codes (0..31) in element order
 * into q.  False when d or dmin is past f16's range. */
Q5K_FN bool q5k_block(const float *x, unsigned char head[Q5K_HEAD], uint8_t q[MOE_Q5_K_BLOCK])
{
    float s[Q5K_NG], a[Q5K_NG], smax = 0.0f, amax = 0.0f;
    for (int j = 0; j < Q5K_NG; j++) {
        q5k_fit_group(x + Q5K_G * j, &s[j], &a[j]);
        smax = s[j] > smax ? s[j] : smax;
        amax = a[j] > amax ? a[j] : amax;
    }
    const uint16_t h[2] = {moe_fit_f16(smax / 63.0f), moe_fit_f16(amax / 63.0f)};
    if ((h[0] & 0x7c00u) == 0x7c00u || (h[1] & 0x7c00u) == 0x7c00u) return false;
    const float D = moe_fit_f32(h[0]), M = moe_fit_f32(h[1]);
    uint8_t sc[Q5K_NG], mn[Q5K_NG];
    for (int j = 0; j < Q5K_NG; j++) {
        const int s0 = q5k_six_bits(s[j], D), a0 = q5k_six_bits(a[j], M);
        double best = INFINITY;
        sc[j] = mn[j] = 0;
        for (int ds = -1; ds <= 1; ds++)
            for (int da = -1; da <= 1; da++) {
                const int si = s0 + ds, ai = a0 + da;
                if (si < 0 || si > 63 || ai < 0 || ai > 63) continue;
                const double e = Q5K_ERROR(x + Q5K_G * j, D * (float)si, M * (float)ai, NULL);
                if (e < best) {
                    best = e;
                    sc[j] = (uint8_t)si;
                    mn[j] = (uint8_t)ai;
                }
            }
        Q5K_ERROR(x + Q5K_G * j, D * (float)sc[j], M * (float)mn[j], q + Q5K_G * j);
    }
    memcpy(head, h, 4);
    for (int j = 0; j < 4; j++) {
        head[4 + j] = (unsigned char)(sc[j] | (sc[j + 4] >> 4) << 6);
        head[8 + j] = (unsigned char)(mn[j] | (mn[j + 4] >> 4) << 6);
        head[12 + j] = (unsigned char)((sc[j + 4] & 15u) | (mn[j + 4] & 15u) << 4);
    }
    return true;
}
