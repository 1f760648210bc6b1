/* gemm_q6_k.c - what the fast CPU product costs over Q6_K weights
 * (runtime/cpu/gemm_q6_k.c) and Q5_K weights (gemm_q5_k.c) beside Q4_K's
 * and Q8_0's, and what the K-quant quantizers cost.
 *
 * Isolated products y (T, N) = x (T, Din) . W^T on one thread for (N, Din)
 * = 2048 x 2048, 1024 x 4096, 768 x 2048 and 2048 x 768 (an expert's gate
 * and down matrices) at T = 1 (decode), 16 and 64 (a prefill expert's rows), through moe_gemm_fast with
 * the best kernel set.  Each format cycles through distinct copies of its
 * matrix totalling at least 256 MiB, so every product reads its weights
 * from memory (the L3 holds 32 MiB here).  The formats alternate within
 * each round (the machine is shared); a figure is the median over rounds
 * of one product's time: wall ms, GB/s of weight bytes read, ns per
 * weight, and the thread's CPU ms (less disturbed by other work).  Then
 * each quantizer's ns per weight on one thread (CPU time, median of the
 * rounds, 4 Mi Gaussian values).
 *
 * Build and run (from the repository root, after the CPU build in build/):
 *   cmake --build build --target bench_gemm_q6_k && build/bench_gemm_q6_k [rounds]
 * Not run by the tests. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "runtime/core/status.h"
#include "runtime/cpu/gemm_fast.h"

enum { NF = 4, MAXR = 64 };
static const enum moe_dtype fmt_dt[NF] = {MOE_DTYPE_Q4_K, MOE_DTYPE_Q5_K, MOE_DTYPE_Q6_K, MOE_DTYPE_Q8_0};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}
static float gauss(void) { return (urand() + urand() + urand() + urand()) * 0.5f; }

static bool quantize(enum moe_dtype dt, void *dst, const float *x, size_t n)
{
    return dt == MOE_DTYPE_Q4_K   ? moe_quantize_row_q4_k(dst, x, n)
           : dt == MOE_DTYPE_Q5_K ? moe_quantize_row_q5_k(dst, x, n)
           : dt == MOE_DTYPE_Q6_K ? moe_quantize_row_q6_k(dst, x, n)
                                  : moe_quantize_row_q8_0(dst, x, n);
}

/* One shape at T rows: every format's copies, rounds alternating the
 * formats; one table line per format. */
static void bench_shape(int N, int D, int T, int rounds, void *const *arena, const size_t *mbytes,
                        const int *copies, const float *x, float *y, enum moe_cpu_isa isa)
{
    double t[NF][MAXR], cpu[NF][MAXR];
    for (int r = 0; r < rounds; r++)
        for (int f = 0; f < NF; f++) {
            const double t0 = bench_clock(CLOCK_MONOTONIC), c0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
            for (int i = 0; i < copies[f]; i++)
                moe_gemm_fast(isa, y, N, x, D, (const char *)arena[f] + (size_t)i * mbytes[f], fmt_dt[f], N, D, T,
                              NULL);
            t[f][r] = (bench_clock(CLOCK_MONOTONIC) - t0) / copies[f];
            cpu[f][r] = (bench_clock(CLOCK_THREAD_CPUTIME_ID) - c0) / copies[f];
        }
    for (int f = 0; f < NF; f++) {
        qsort(t[f], (size_t)rounds, sizeof(double), bench_cmp_double);
        qsort(cpu[f], (size_t)rounds, sizeof(double), bench_cmp_double);
        const double s = t[f][rounds / 2], c = cpu[f][rounds / 2];
        printf("| %4d x %4d | %2d | %-5s | %7.3f | %6.2f | %6.3f | %7.3f | %6.2f |\n", N, D, T, moe_dtype_name(fmt_dt[f]),
               s * 1e3, (double)mbytes[f] / s * 1e-9, s * 1e9 / ((double)N * D), c * 1e3, (double)mbytes[f] / c * 1e-9);
    }
    fflush(stdout);
}

static void bench_quantizers(int rounds)
{
    const size_t n = (size_t)4 << 20;
    float *x = bench_alloc("bench_gemm_q6_k", n * sizeof(float));
    void *q = bench_alloc("bench_gemm_q6_k", n * 2);
    for (size_t i = 0; i < n; i++) x[i] = 0.02f * gauss();
    printf("\n| quantizer | ns per weight (CPU, one thread) |\n|---|---|\n");
    for (int f = 0; f < NF - 1; f++) { /* the K-quants */
        double c[MAXR];
        for (int r = 0; r < rounds; r++) {
            const double c0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
            if (!quantize(fmt_dt[f], q, x, n)) exit(1);
            c[r] = (bench_clock(CLOCK_THREAD_CPUTIME_ID) - c0) / (double)n;
        }
        qsort(c, (size_t)rounds, sizeof(double), bench_cmp_double);
        printf("| %s | %.2f |\n", moe_dtype_name(fmt_dt[f]), c[rounds / 2] * 1e9);
    }
    free(x), free(q);
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > MAXR) {
        fprintf(stderr, "usage: bench_gemm_q6_k [rounds, 1..%d]\n", MAXR);
        return 2;
    }
    const enum moe_cpu_isa isa = moe_cpu_isa_detect();
    if (isa == MOE_CPU_ISA_REF) {
        fprintf(stderr, "bench_gemm_q6_k: this processor runs no fast kernel set\n");
        return 1;
    }
    omp_set_num_threads(1);
    const int shapes[4][2] = {{2048, 2048}, {1024, 4096}, {768, 2048}, {2048, 768}}, Ts[3] = {1, 16, 64};
    const size_t total = (size_t)256 << 20;
    printf("kernel set %s, one thread, %d rounds, each format's copies >= %zu MiB\n", moe_cpu_isa_name(isa), rounds,
           total >> 20);
    bench_print_load();
    printf("| N x Din | T | weights | ms | GB/s | ns/weight | cpu ms | GB/s (cpu) |\n"
           "|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < 4; s++) {
        const int N = shapes[s][0], D = shapes[s][1];
        float *wf = bench_alloc("bench_gemm_q6_k", (size_t)N * D * sizeof(float)),
              *x = bench_alloc("bench_gemm_q6_k", (size_t)64 * D * sizeof(float)),
              *y = bench_alloc("bench_gemm_q6_k", (size_t)64 * N * sizeof(float));
        for (size_t i = 0; i < (size_t)N * D; i++) wf[i] = 0.02f * gauss();
        for (size_t i = 0; i < (size_t)64 * D; i++) x[i] = urand();
        void *arena[NF];
        size_t mbytes[NF];
        int copies[NF];
        for (int f = 0; f < NF; f++) {
            const size_t rb = moe_dtype_row_bytes(fmt_dt[f], (size_t)D);
            mbytes[f] = (size_t)N * rb;
            copies[f] = (int)((total + mbytes[f] - 1) / mbytes[f]);
            arena[f] = bench_alloc("bench_gemm_q6_k", mbytes[f] * (size_t)copies[f]);
            for (int n = 0; n < N; n++)
                if (!quantize(fmt_dt[f], (char *)arena[f] + (size_t)n * rb, wf + (size_t)n * D, (size_t)D)) exit(1);
            for (int i = 1; i < copies[f]; i++) memcpy((char *)arena[f] + (size_t)i * mbytes[f], arena[f], mbytes[f]);
        }
        for (int ti = 0; ti < 3; ti++) bench_shape(N, D, Ts[ti], rounds, arena, mbytes, copies, x, y, isa);
        for (int f = 0; f < NF; f++) free(arena[f]);
        free(wf), free(x), free(y);
    }
    bench_quantizers(rounds);
    bench_print_load();
    return 0;
}
