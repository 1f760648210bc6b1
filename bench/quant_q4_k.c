/* quant_q4_k.c - what the Q4_K quantizer (moe_quantize_row_q4_k) costs on
 * one thread with each of its block quantizers (runtime/core/q4_k_impl.h):
 * the portable one (q4_k_fit.h's q4k_block with SSE2 lanes) and the AVX2
 * one (the 8 groups of a block in 8 lanes).
 *
 * 512 rows of 2048 Gaussian weights (4 MiB of fp32), quantized whole by
 * each quantizer in turn, the order swapped every round (the machine is
 * shared and noisy).  Printed: the median over rounds of ns per weight
 * from the wall clock and from the thread's CPU time, and the ratio
 * portable / AVX2; the load average before and after, which says how far
 * the figures can be trusted.  The two quantizers' bytes are compared
 * once: a difference is an error.
 *
 * Build and run (from the repository root, after the CPU build in build-cpu/):
 *   cmake --build build-cpu --target bench_quant_q4_k && build-cpu/bench_quant_q4_k [rounds]
 * Not run by the tests. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "runtime/core/q4_k_impl.h"
#include "runtime/core/tensor.h"

enum { ROWS = 512, D = 2048, RMAX = 64 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

/* Quantizes every row with block; seconds of wall and thread CPU time. */
static void run(moe_q4_k_block_fn block, const float *x, unsigned char *q, double *wall, double *cpu)
{
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_Q4_K, D);
    const double t0 = bench_clock(CLOCK_MONOTONIC), c0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
    for (int r = 0; r < ROWS; r++)
        if (!moe_q4_k_quantize_row_with(block, q + r * rb, x + (size_t)r * D, D)) {
            fprintf(stderr, "bench_quant_q4_k: row %d refused\n", r);
            exit(1);
        }
    *wall = bench_clock(CLOCK_MONOTONIC) - t0;
    *cpu = bench_clock(CLOCK_THREAD_CPUTIME_ID) - c0;
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (argc > 2 || rounds < 1 || rounds > RMAX) {
        fprintf(stderr, "usage: bench_quant_q4_k [rounds, 1..64]\n");
        return 2;
    }
    if (!moe_q4_k_has_avx2()) {
        fprintf(stderr, "bench_quant_q4_k: this processor has no AVX2\n");
        return 1;
    }
    const size_t n = (size_t)ROWS * D, qbytes = ROWS * moe_dtype_row_bytes(MOE_DTYPE_Q4_K, D);
    float *x = bench_alloc("bench_quant_q4_k", n * sizeof(float));
    unsigned char *q[2] = {bench_alloc("bench_quant_q4_k", qbytes), bench_alloc("bench_quant_q4_k", qbytes)};
    for (size_t i = 0; i < n; i++) /* Gaussian: the sum of 4 uniforms */
        x[i] = 0.02f * (urand() + urand() + urand() + urand());
    const moe_q4_k_block_fn fn[2] = {moe_q4_k_block_portable, moe_q4_k_block_avx2};
    double wall[2][RMAX], cpu[2][RMAX];
    printf("Q4_K quantizer, one thread, %d rows of %d weights, %d rounds\n", ROWS, D, rounds);
    bench_print_load();
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            const int f = (k + r) % 2;
            run(fn[f], x, q[f], &wall[f][r], &cpu[f][r]);
        }
    if (memcmp(q[0], q[1], qbytes) != 0) {
        fprintf(stderr, "bench_quant_q4_k: the AVX2 quantizer's bytes differ from the portable one's\n");
        return 1;
    }
    double w[2], c[2];
    for (int f = 0; f < 2; f++) {
        qsort(wall[f], (size_t)rounds, sizeof(double), bench_cmp_double);
        qsort(cpu[f], (size_t)rounds, sizeof(double), bench_cmp_double);
        w[f] = wall[f][rounds / 2] * 1e9 / (double)n;
        c[f] = cpu[f][rounds / 2] * 1e9 / (double)n;
    }
    printf("| quantizer | ns/weight (wall) | ns/weight (CPU) |\n|---|---|---|\n");
    printf("| portable (SSE2 lanes) | %.2f | %.2f |\n| AVX2, groups in lanes | %.2f | %.2f |\n", w[0], c[0], w[1],
           c[1]);
    printf("portable / AVX2: %.2fx (wall), %.2fx (CPU)\n", w[0] / w[1], c[0] / c[1]);
    bench_print_load();
    free(x);
    free(q[0]);
    free(q[1]);
    return 0;
}
