/* q6_k_fit.h - the Q6_K quantizer of one block (MOE_DTYPE_Q6_K, tensor.h),
 * shared by the CPU (q6_k.c: moe_quantize_row_q6_k) and the CUDA
 * backend's quantizer at upload (runtime/cuda/quant_q6_k_cuda.cu), so that
 * both make the same bytes: fp32 and fp64 operations in a fixed order,
 * none fused (C11 does not contract expressions; the CUDA file is built
 * with --fmad=false).
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
 * The sums over a sub-block's 16 values run in 4 lanes (value i in lane
 * i % 4), then (l0 + l2) + (l1 + l3).  An includer may define Q6K_SUMS,
 * Q6K_ERROR and Q6K_NEAREST before including: functions with
 * q6k_sums_c's, q6k_error_c's and q6k_nearest_c's arguments and results,
 * bit for bit (q6_k.c: SSE2). */
#pragma once

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "runtime/core/fit_f16.h"
#include "runtime/core/tensor.h"

#define Q6K_FN MOE_FIT_FN
#define Q6K_SUB 16                        /* values per sub-block */
#define Q6K_NSUB (MOE_Q6_K_BLOCK / Q6K_SUB) /* sub-blocks per block */
#define Q6K_GRIDS 7                       /* candidate grids: t = Q6K_GRID0 + i Q6K_GRID_STEP */
#define Q6K_GRID0 28.0f
#define Q6K_GRID_STEP 1.0f

/* The nearest integer to v, ties to even, for |v| < 2^22 (fp32 addition
 * rounds). */
Q6K_FN float q6k_round(float v) { return (v + 12582912.0f) - 12582912.0f; }

/* v clamped to the codes' range -32..31 (a NaN becomes -32): what maxps
 * then minps compute. */
Q6K_FN float q6k_clamp(float v)
{
    v = v > -32.0f ? v : -32.0f;
    return v < 31.0f ? v : 31.0f;
}

/* The sums sum x q and sum q q of x's codes q = clamp(round(x * is)). */
Q6K_FN void q6k_sums_c(const float *x, float is, float *sxq, float *sqq)
{
    float p[4] = {0}, r[4] = {0};
    for (int i = 0; i < Q6K_SUB; i += 4)
        for (int k = 0; k < 4; k++) {
            const float q = q6k_clamp(q6k_round(x[i + k] * is));
            p[k] += x[i + k] * q;
            r[k] += q * q;
        }
    *sxq = (p[0] + p[2]) + (p[1] + p[3]);
    *sqq = (r[0] + r[2]) + (r[1] + r[3]);
}

/* The squared error of x's codes round(x / S) at scale S (S != 0), in the
 * order dequantization rounds. */
Q6K_FN float q6k_error_c(const float *x, float S)
{
    const float is = 1.0f / S;
    float e[4] = {0};
    for (int i = 0; i < Q6K_SUB; i += 4)
        for (int k = 0; k < 4; k++) {
            const float r = x[i + k] - S * q6k_clamp(q6k_round(x[i + k] * is));
            e[k] += r * r;
        }
    return (e[0] + e[2]) + (e[1] + e[3]);
}

/* Step 3: the codes (0..63) of a sub-block at scale S: each the one whose
 * value S * (q - 32) is nearest x; of two as near, the rounding of x / S
 * (of its two neighbours, the lower); every code 32 when S is 0. */
Q6K_FN void q6k_nearest_c(const float *x, float S, uint8_t *q)
{
    if (S == 0.0f) {
        memset(q, 32, Q6K_SUB);
        return;
    }
    for (int i = 0; i < Q6K_SUB; i++) {
        const float k = q6k_clamp(q6k_round(x[i] / S)), km = k - 1.0f, kp = k + 1.0f;
        const float e0 = fabsf(x[i] - S * k);
        const float em = km >= -32.0f ? fabsf(x[i] - S * km) : INFINITY;
        const float ep = kp <= 31.0f ? fabsf(x[i] - S * kp) : INFINITY;
        float c = em < e0 ? km : k;
        const float ec = em < e0 ? em : e0;
        c = ep < ec ? kp : c;
        q[i] = (uint8_t)((int)c + 32);
    }
}
#ifndef Q6K_SUMS
#define Q6K_SUMS q6k_sums_c
#endif
#ifndef Q6K_ERROR
#define Q6K_ERROR q6k_error_c
#endif
#ifndef Q6K_NEAREST
#define Q6K_NEAREST q6k_nearest_c
#endif

/* Step 1: the sub-block's float scale (0 when every value is 0). */
Q6K_FN float q6k_fit_sub(const float *x)
{
    float v = 0.0f;
    for (int i = 0; i < Q6K_SUB; i++) v = fabsf(x[i]) > fabsf(v) ? x[i] : v;
    if (v == 0.0f) return 0.0f;
    double best_num = -1.0, best_den = 1.0; /* the best (sum x q)^2 and sum q^2 */
    float best = v / -32.0f;
    for (int g = 0; g <= Q6K_GRIDS; g++) {
        /* the grids, then the best scale's own nearest codes */
        const float is = g < Q6K_GRIDS ? -(Q6K_GRID0 + Q6K_GRID_STEP * (float)g) / v : 1.0f / best;
        float sxq, sqq;
        Q6K_SUMS(x, is, &sxq, &sqq);
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

/* One block of 256 finite values x: its 16 int8 scales into sc, its f16 d
 * into *dh and its codes (0..63) in element order into q.  False when d
 * is past f16's range. */
Q6K_FN bool q6k_block(const float *x, int8_t sc[Q6K_NSUB], uint16_t *dh, uint8_t q[MOE_Q6_K_BLOCK])
{
    float s[Q6K_NSUB], smax = 0.0f;
    for (int j = 0; j < Q6K_NSUB; j++) {
        s[j] = q6k_fit_sub(x + Q6K_SUB * j);
        smax = fabsf(s[j]) > fabsf(smax) ? s[j] : smax;
    }
    *dh = moe_fit_f16(smax / -128.0f);
    if ((*dh & 0x7c00u) == 0x7c00u) return false; /* past f16's range */
    const float d = moe_fit_f32(*dh);
    for (int j = 0; j < Q6K_NSUB; j++) {
        float S = 0.0f;
        sc[j] = 0;
        if (d != 0.0f && s[j] != 0.0f) {
            const float r = q6k_round(fmaxf(-128.0f, fminf(127.0f, s[j] / d)));
            float best = INFINITY;
            for (int o = -1; o <= 1; o++) {
                const float c = r + (float)o;
                if (c < -128.0f || c > 127.0f || c == 0.0f) continue;
                const float e = Q6K_ERROR(x + Q6K_SUB * j, d * c);
                if (e < best) {
                    best = e;
                    sc[j] = (int8_t)c;
                    S = d * c;
                }
            }
        }
        Q6K_NEAREST(x + Q6K_SUB * j, S, q + Q6K_SUB * j);
    }
    return true;
}
