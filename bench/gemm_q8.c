/* gemm_q8.c - what the fast CPU matrix product over Q8_0 weights (or Q4_1
 * or Q4_K, with "q4_1" or "q4_k" after the rounds: gemm_q4.c's kernels and
 * gemm_q4_amx.c) costs
 * with the AVX2 kernel (runtime/cpu/gemm_q8.c), the AVX512-VNNI one
 * (runtime/cpu/gemm_q8_vnni.c) and, where the processor has AMX-INT8, the
 * AMX sets' (runtime/cpu/gemm_q8_amx.c), one thread.
 *
 * Products y (T, N) = x (T, Din) . W^T for (N, Din) = 1408 x 2048 (an
 * OLMoE expert's gate or up), 14336 x 4096 (Mixtral's) and 4096 x 4096,
 * T = 1, 4, 16, 64 and 512, through moe_gemm_fast_rows (no OpenMP team)
 * with the AVX2 kernel set, the AVX-512 set (which takes the VNNI
 * kernel where the processor has AVX512-VNNI) and the AMX set.  The matrix is cycled
 * through distinct copies totalling at least 256 MiB, so small batches
 * read their weights from memory as decode does across layers.  The
 * kernels alternate within each round (the machine is shared and noisy);
 * a figure is the median over rounds of the mean time of one product.
 * Printed per case: ms per product and GFLOP/s (2 T N Din per product)
 * of each kernel from the wall clock, and the ratios VNNI / AVX2 and AMX /
 * VNNI of GFLOP/s from the wall clock and from the thread's CPU time
 * (less disturbed by other work on a shared machine); the load average
 * before and after, which says how far the figures can be trusted.
 *
 * Build and run (from the repository root, after the CPU build in build-cpu/):
 *   cmake --build build-cpu --target bench_gemm_q8 && build-cpu/bench_gemm_q8 [rounds] [q4_1|q4_k] [NxDin]
 * (NxDin: that shape alone instead of the three, e.g. 50304x2048 for an LM head)
 * Not run by the tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "runtime/core/status.h"
#include "runtime/cpu/gemm_fast.h"

enum { NK = 3, RMAX = 64 }; /* kernels at most; rounds at most */

static int nk = 2; /* kernels run: 3 with AMX-INT8 */
static enum moe_dtype wt = MOE_DTYPE_Q8_0; /* or Q4_1, Q4_K */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

/* One shape at T rows: rounds alternating the two kernels over the
 * copies of the matrix in arena (mbytes each); prints one line. */
static void bench_case(int N, int D, int T, int rounds, const char *arena, size_t mbytes, int copies,
                       const float *x, float *y)
{
    static const enum moe_cpu_isa isa[NK] = {MOE_CPU_ISA_AVX2, MOE_CPU_ISA_AVX512, MOE_CPU_ISA_AMX};
    double t[NK][RMAX], cpu[NK][RMAX];
    /* products per measurement: every copy once while the weights stream
     * from memory; fewer once compute bound */
    const int n = T <= 8 ? copies : T == 16 ? (copies < 8 ? copies : 8) : T == 64 ? 2 : 1;
    int next = 0;
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < nk; k++) {
            const double t0 = bench_clock(CLOCK_MONOTONIC), c0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
            for (int i = 0; i < n; i++, next = (next + 1) % copies)
                moe_gemm_fast_rows(isa[k], y, (size_t)N, x, (size_t)D, T, arena + (size_t)next * mbytes,
                                   wt, D, 0, N, NULL);
            t[k][r] = (bench_clock(CLOCK_MONOTONIC) - t0) / n;
            cpu[k][r] = (bench_clock(CLOCK_THREAD_CPUTIME_ID) - c0) / n;
        }
    double s[NK], c[NK];
    for (int k = 0; k < nk; k++) {
        qsort(t[k], (size_t)rounds, sizeof(double), bench_cmp_double);
        qsort(cpu[k], (size_t)rounds, sizeof(double), bench_cmp_double);
        s[k] = t[k][rounds / 2];
        c[k] = cpu[k][rounds / 2];
    }
    const double flop = 2.0 * T * N * D;
    printf("| %5d x %4d | %3d |", N, D, T);
    for (int k = 0; k < nk; k++) printf(" %9.3f |", s[k] * 1e3);
    for (int k = 0; k < nk; k++) printf(" %7.1f |", flop / s[k] * 1e-9);
    for (int k = 1; k < nk; k++) printf(" %5.2f | %5.2f |", s[k - 1] / s[k], c[k - 1] / c[k]);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 7;
    int shapes[3][2] = {{1408, 2048}, {14336, 4096}, {4096, 4096}}, ns = 3, bad = rounds < 1 || rounds > RMAX;
    for (int a = 2; a < argc; a++) {
        char tail;
        if (strcmp(argv[a], "q4_1") == 0)
            wt = MOE_DTYPE_Q4_1;
        else if (strcmp(argv[a], "q4_k") == 0)
            wt = MOE_DTYPE_Q4_K;
        else if (ns == 3 && sscanf(argv[a], "%dx%d%c", &shapes[0][0], &shapes[0][1], &tail) == 2 &&
                 shapes[0][0] > 0 && shapes[0][0] <= 1 << 20 && shapes[0][1] > 0 && shapes[0][1] % 32 == 0 &&
                 shapes[0][1] <= 1 << 16)
            ns = 1;
        else
            bad = 1;
    }
    if (wt == MOE_DTYPE_Q4_K && shapes[0][1] % MOE_Q4_K_BLOCK) bad = 1;
    if (bad) {
        fprintf(stderr, "usage: bench_gemm_q8 [rounds, 1..64] [q4_1|q4_k] [NxDin, Din a multiple of 32; of 256 for "
                "q4_k]\n");
        return 2;
    }
    if (moe_cpu_isa_detect() < MOE_CPU_ISA_AVX512) {
        fprintf(stderr, "bench_gemm_q8: this processor runs no AVX-512 kernel set\n");
        return 1;
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "bench_gemm_q8: this processor lacks AVX512-VNNI (both columns would be the AVX2 kernel)\n");
        return 1;
    }
    if (moe_cpu_isa_detect() >= MOE_CPU_ISA_AMX && moe_cpu_amx_int8()) nk = 3;
    const int Ts[7] = {1, 2, 4, 8, 16, 64, 512};
    const size_t total = (size_t)256 << 20;
    printf("%s weights, one thread, %d rounds, copies >= %zu MiB\n", moe_dtype_name(wt), rounds, total >> 20);
    bench_print_load();
    if (nk == 3)
        printf("| N x Din | T | avx2 ms | vnni ms | amx ms | avx2 GFLOP/s | vnni GFLOP/s | amx GFLOP/s | vnni/avx2 | "
               "cpu | amx/vnni | cpu |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    else
        printf("| N x Din | T | avx2 ms | vnni ms | avx2 GFLOP/s | vnni GFLOP/s | vnni/avx2 | cpu |\n"
               "|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < ns; s++) {
        const int N = shapes[s][0], D = shapes[s][1];
        const size_t mbytes = (size_t)N * moe_dtype_row_bytes(wt, (size_t)D);
        const int copies = (int)((total + mbytes - 1) / mbytes);
        float *row = bench_alloc("bench_gemm_q8", (size_t)D * sizeof(float)),
              *x = bench_alloc("bench_gemm_q8", (size_t)512 * D * sizeof(float)),
              *y = bench_alloc("bench_gemm_q8", (size_t)512 * N * sizeof(float));
        char *arena = bench_alloc("bench_gemm_q8", mbytes * (size_t)copies);
        for (int n = 0; n < N; n++) {
            for (int k = 0; k < D; k++) row[k] = urand();
            char *dst = arena + (size_t)n * (mbytes / N);
            if (!(wt == MOE_DTYPE_Q8_0   ? moe_quantize_row_q8_0(dst, row, (size_t)D)
                  : wt == MOE_DTYPE_Q4_K ? moe_quantize_row_q4_k(dst, row, (size_t)D)
                                         : moe_quantize_row_q4_1(dst, row, (size_t)D)))
                return 1;
        }
        for (int i = 1; i < copies; i++) memcpy(arena + (size_t)i * mbytes, arena, mbytes);
        for (size_t i = 0; i < (size_t)512 * D; i++) x[i] = urand();
        for (int ti = 0; ti < 7; ti++) bench_case(N, D, Ts[ti], rounds, arena, mbytes, copies, x, y);
        free(arena), free(row), free(x), free(y);
    }
    bench_print_load();
    return 0;
}
