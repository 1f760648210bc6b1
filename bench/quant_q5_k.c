/* quant_q5_k.c - what the Q5_K quantizer costs on one thread with each of
 * its block quantizers (runtime/core/q5_k_impl.h: plain C, and a group's
 * lanes in one AVX2 register) beside the Q4_K one (moe_quantize_row_q4_k:
 * AVX2 where the processor has it), and the relative RMS error of each.
 *
 * An OLMoE-1B-7B expert matrix's shape, 1024 rows of 2048 Gaussian
 * weights (8 MiB of fp32), quantized whole by each quantizer in turn,
 * the order swapped every round (the machine is shared and noisy).
 * Printed: the median over rounds of ns per weight from the wall clock and
 * from the thread's CPU time; the load average before and after, which
 * says how far the figures can be trusted.
 *
 * Build and run (from the repository root, after the CPU build in build-cpu/):
 *   cmake --build build-cpu --target bench_quant_q5_k && build-cpu/bench_quant_q5_k [rounds]
 * Not run by the tests. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "runtime/core/q5_k_impl.h"
#include "runtime/core/tensor.h"

enum { ROWS = 1024, D = 2048, RMAX = 64 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

typedef bool (*quant_fn)(void *dst, const float *src, size_t n);

static bool q5_k_plain(void *dst, const float *src, size_t n)
{
    return moe_q5_k_quantize_row_with(moe_q5_k_block_portable, dst, src, n);
}

/* Quantizes every row to t with f; seconds of wall and thread CPU time. */
static void run(quant_fn f, enum moe_dtype t, const float *x, unsigned char *q, double *wall, double *cpu)
{
    const size_t rb = moe_dtype_row_bytes(t, D);
    const double t0 = bench_clock(CLOCK_MONOTONIC), c0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
    for (int r = 0; r < ROWS; r++)
        if (!f(q + r * rb, x + (size_t)r * D, D)) {
            fprintf(stderr, "bench_quant_q5_k: row %d refused\n", r);
            exit(1);
        }
    *wall = bench_clock(CLOCK_MONOTONIC) - t0;
    *cpu = bench_clock(CLOCK_THREAD_CPUTIME_ID) - c0;
}

/* The relative RMS error of the rows q (dtype t) against x. */
static double rel_rms(const float *x, const unsigned char *q, enum moe_dtype t)
{
    const size_t rb = moe_dtype_row_bytes(t, D);
    float back[D];
    double e = 0, s = 0;
    for (int r = 0; r < ROWS; r++) {
        moe_convert_row_f32(back, q + r * rb, t, D);
        for (int k = 0; k < D; k++) {
            const double v = x[(size_t)r * D + k];
            e += (v - back[k]) * (v - back[k]);
            s += v * v;
        }
    }
    return sqrt(e / s);
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (argc > 2 || rounds < 1 || rounds > RMAX) {
        fprintf(stderr, "usage: bench_quant_q5_k [rounds, 1..64]\n");
        return 2;
    }
    const size_t n = (size_t)ROWS * D;
    enum { NF = 3 };
    const enum moe_dtype ts[NF] = {MOE_DTYPE_Q5_K, MOE_DTYPE_Q5_K, MOE_DTYPE_Q4_K};
    const quant_fn fn[NF] = {moe_quantize_row_q5_k, q5_k_plain, moe_quantize_row_q4_k};
    const char *names[NF] = {"Q5_K (AVX2 lanes where the processor has them)", "Q5_K (plain C)", "Q4_K"};
    float *x = bench_alloc("bench_quant_q5_k", n * sizeof(float));
    unsigned char *q[NF];
    for (int f = 0; f < NF; f++) q[f] = bench_alloc("bench_quant_q5_k", ROWS * moe_dtype_row_bytes(ts[f], D));
    for (size_t i = 0; i < n; i++) /* Gaussian: the sum of 4 uniforms */
        x[i] = 0.02f * (urand() + urand() + urand() + urand());
    double wall[NF][RMAX], cpu[NF][RMAX];
    printf("Q5_K and Q4_K quantizers, one thread, %d rows of %d weights, %d rounds\n", ROWS, D, rounds);
    bench_print_load();
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < NF; k++) {
            const int f = (k + r) % NF;
            run(fn[f], ts[f], x, q[f], &wall[f][r], &cpu[f][r]);
        }
    printf("| quantizer | ns/weight (wall) | ns/weight (CPU) | relative RMS error |\n|---|---|---|---|\n");
    for (int f = 0; f < NF; f++) {
        qsort(wall[f], (size_t)rounds, sizeof(double), bench_cmp_double);
        qsort(cpu[f], (size_t)rounds, sizeof(double), bench_cmp_double);
        printf("| %s | %.2f | %.2f | %.5f |\n", names[f], wall[f][rounds / 2] * 1e9 / (double)n,
               cpu[f][rounds / 2] * 1e9 / (double)n, rel_rms(x, q[f], ts[f]));
    }
    bench_print_load();
    if (memcmp(q[0], q[1], ROWS * moe_dtype_row_bytes(MOE_DTYPE_Q5_K, D)) != 0) {
        fprintf(stderr, "bench_quant_q5_k: the two Q5_K quantizers' bytes differ\n");
        return 1;
    }
    free(x);
    for (int f = 0; f < NF; f++) free(q[f]);
    return 0;
}
