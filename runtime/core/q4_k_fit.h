/* q4_k_fit.h - the Q4_K quantizer of one block (MOE_DTYPE_Q4_K,
 * tensor.h), shared by the CPU (q4_k.c: moe_quantize_row_q4_k) and the
 * CUDA backend's quantizer at upload (runtime/cuda/quant_k_cuda.cu), so
 * that both make the same bytes: fp32 and fp64 operations in a fixed
 * order, none fused (C11 does not contract expressions; the CUDA file is
 * built with --fmad=false).
 *
 * Each group of 32 values is fitted as x ~ s q - a (codes q in 0..15, s
 * and a >= 0) by least squares over candidate code assignments: the
 * group's range [lo, hi] (lo at most 0) cut into 15 steps (Q4_1's line),
 * and into 15 + i/2 steps for i = -3..3, each assignment's (s, a) the
 * least-squares line through it (a clamped at 0) and its squared error
 * from the closed form; the best line is kept.  Stretching the grid past
 * the range lets the line clip a group's outliers where that lowers the
 * error, which min/max quantizers (Q4_0, Q4_1) cannot.  The block's d and
 * dmin are then the largest s and a over 63 (f16), and each group's 6-bit
 * pair is chosen among the roundings of s / d, a / dmin and their
 * neighbours by the error of its nearest codes, so the stored values, not
 * the unquantized line, are what is optimized last.
 *
 * An includer may define Q4K_LANES before including: a function with
 * q4k_lanes_c's arguments and results, bit for bit (q4_k.c: SSE2).
 * q4_k_avx2.c runs q4k_fit_group and q4k_block for a block's 8 groups at
 * once with the same operations: a change here must be made there too. */
#pragma once

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "runtime/core/fit_f16.h"
#include "runtime/core/tensor.h"

#define Q4K_FN MOE_FIT_FN

#define Q4K_G 32         /* values per group */
#define Q4K_NG 8         /* groups per block */
#define Q4K_CAND 3       /* candidate grids each side of 15 steps, Q4K_CAND_STEP apart */
#define Q4K_CAND_STEP 0.5f
#define Q4K_HEAD 16      /* the block's leading bytes: f16 d, f16 dmin, 12 of scales */
#define Q4K_CODES 0      /* q4k_lanes_c modes (below) */
#define Q4K_LINE 1

/* Per lane k (0..7), over the values x[k], x[k + 8], ... of a group:
 * each value's code c = the rounding half up of v, v = (x + a) * is
 * clamped to [0, 15] (mode Q4K_CODES), or of v = (x - lo) * is (mode
 * Q4K_LINE); Q4K_CODES: e[k] the sum of (x - (c s - a))^2, and the codes
 * into q when not NULL; Q4K_LINE: e, e2, e3 the sums of c, c^2 and c x. */
Q4K_FN void q4k_lanes_c(int mode, const float *x, float s, float a, float lo, float is, float e[8], float e2[8],
                        float e3[8], uint8_t *q)
{
    for (int k = 0; k < 8; k++) {
        float acc = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
        for (int i = k; i < Q4K_G; i += 8) {
            float v = mode == Q4K_CODES ? (x[i] + a) * is : (x[i] - lo) * is;
            v = v > 0.0f ? v : 0.0f;
            v = v < 15.0f ? v : 15.0f;
            const int ci = (int)(v + 0.5f);
            const float c = (float)ci;
            if (mode == Q4K_CODES) {
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
        if (mode == Q4K_LINE) {
            e2[k] = acc2;
            e3[k] = acc3;
        }
    }
}
#ifndef Q4K_LANES
#define Q4K_LANES q4k_lanes_c
#endif

/* Sums 8 partial sums in a fixed order. */
Q4K_FN float q4k_sum8(const float p[8])
{
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

/* The group's squared error at (s, a) with each value's code the nearest
 * to (x + a) / s (0 when s is 0), into q when not NULL. */
Q4K_FN float q4k_group_error(const float *x, float s, float a, uint8_t *q)
{
    float e[8];
    Q4K_LANES(Q4K_CODES, x, s, a, 0.0f, s > 0.0f ? 1.0f / s : 0.0f, e, NULL, NULL, q);
    return q4k_sum8(e);
}

/* The least-squares line x ~ s q - a over the candidate grids (above). */
Q4K_FN void q4k_fit_group(const float *x, float *s_out, float *a_out)
{
    float lo = x[0], hi = x[0];
    double sx = 0.0, sxx = 0.0;
    for (int i = 0; i < Q4K_G; i++) {
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
    double best = q4k_group_error(x, bs, ba, NULL);
    /* the codes' sums are small integers, exact in fp32 */
    for (int i = -Q4K_CAND; i <= Q4K_CAND; i++) {
        const float is = (15.0f + Q4K_CAND_STEP * (float)i) / (hi - lo);
        float pq[8], pqq[8], pqx[8];
        Q4K_LANES(Q4K_LINE, x, 0.0f, 0.0f, lo, is, pq, pqq, pqx, NULL);
        const float sq = q4k_sum8(pq), sqq = q4k_sum8(pqq), sqx = q4k_sum8(pqx);
        const double det = Q4K_G * (double)sqq - (double)sq * sq;
        if (!(det > 0.0)) continue;
        double s = (Q4K_G * (double)sqx - sq * sx) / det, b = (sx - s * sq) / Q4K_G;
        if (b > 0.0) { /* the offset must be at most 0 */
            b = 0.0;
            s = sqx / sqq;
        }
        if (!(s > 0.0)) continue;
        /* squared error of the line at these codes, in closed form */
        const double e = sxx - 2.0 * s * sqx - 2.0 * b * sx + s * s * sqq + 2.0 * s * b * sq + Q4K_G * b * b;
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
Q4K_FN int q4k_six_bits(float v, float unit)
{
    if (!(unit > 0.0f)) return 0;
    const float r = v / unit;
    return r <= 0.0f ? 0 : r >= 63.0f ? 63 : (int)(r + 0.5f);
}

/* One block of 256 finite values x: its 16 leading bytes into head (f16 d,
 * f16 dmin, the 12 bytes of 6-bit scales and minimums as MOE_DTYPE_Q4_K
 * stores them) and its codes in element order into q.  False when d or
 * dmin is past f16's range. */
Q4K_FN bool q4k_block(const float *x, unsigned char head[Q4K_HEAD], uint8_t q[MOE_Q4_K_BLOCK])
{
    float s[Q4K_NG], a[Q4K_NG], smax = 0.0f, amax = 0.0f;
    for (int j = 0; j < Q4K_NG; j++) {
        q4k_fit_group(x + Q4K_G * j, &s[j], &a[j]);
        smax = s[j] > smax ? s[j] : smax;
        amax = a[j] > amax ? a[j] : amax;
    }
    const uint16_t h[2] = {moe_fit_f16(smax / 63.0f), moe_fit_f16(amax / 63.0f)};
    if ((h[0] & 0x7c00u) == 0x7c00u || (h[1] & 0x7c00u) == 0x7c00u) return false;
    const float D = moe_fit_f32(h[0]), M = moe_fit_f32(h[1]);
    uint8_t sc[Q4K_NG], mn[Q4K_NG];
    for (int j = 0; j < Q4K_NG; j++) {
        const int s0 = q4k_six_bits(s[j], D), a0 = q4k_six_bits(a[j], M);
        double best = INFINITY;
        sc[j] = mn[j] = 0;
        for (int ds = -1; ds <= 1; ds++)
            for (int da = -1; da <= 1; da++) {
                const int si = s0 + ds, ai = a0 + da;
                if (si < 0 || si > 63 || ai < 0 || ai > 63) continue;
                const double e = q4k_group_error(x + Q4K_G * j, D * (float)si, M * (float)ai, NULL);
                if (e < best) {
                    best = e;
                    sc[j] = (uint8_t)si;
                    mn[j] = (uint8_t)ai;
                }
            }
        q4k_group_error(x + Q4K_G * j, D * (float)sc[j], M * (float)mn[j], q + Q4K_G * j);
    }
    memcpy(head, h, 4);
    for (int j = 0; j < 4; j++) {
        head[4 + j] = (unsigned char)(sc[j] | (sc[j + 4] >> 4) << 6);
        head[8 + j] = (unsigned char)(mn[j] | (mn[j + 4] >> 4) << 6);
        head[12 + j] = (unsigned char)((sc[j + 4] & 15u) | (mn[j + 4] & 15u) << 4);
    }
    return true;
}
