/* gemm_panels.c - the fast CPU product over bf16 panels (what the fast
 * backend packs bf16 matrices to) with each kernel set this processor runs:
 * AVX2, AVX-512 (FMA over widened weights, runtime/cpu/gemm_panel.c),
 * AVX512-BF16 (vdpbf16ps over inputs rounded to bf16, gemm_panel_dp.c) and
 * the AMX sets (tiles, runtime/cpu/gemm_amx.c: inputs in two bf16 parts,
 * three, or one), side by side (docs/cpu.md).
 *
 * y (T, N) = x (T, K) . W^T for (N, K) = 4096 x 4096 (a dense layer),
 * 1024 x 2048 and 2048 x 1024 (OLMoE-1B-7B's expert gate/up and down),
 * 14336 x 4096 (Mixtral-8x7B's expert gate/up) and T = 1, 4, 16, 64, 512.
 * Each case cycles through distinct copies of its matrix totalling at
 * least 256 MiB when T <= 4, so those products read their weights from
 * memory as decode does; larger T reuse one copy, unless the 4th argument
 * is `cold` (every T from memory, as a prefill's experts read theirs: each
 * expert's matrices once a layer).  The copies are in huge pages, as the
 * backend's packed weights are.  The kernel sets alternate within each
 * round (the machine is shared and noisy); a figure is the median over
 * rounds of the calling thread's CPU time per product with one thread,
 * and of the wall time per product with the OpenMP team.  Printed: ms per product, GFLOP/s
 * (2 T N K per product) and each set's speed relative to AVX-512.
 *
 * Build and run (from the repository root, after the CPU build in build-cpu/):
 *   cmake --build build-cpu --target bench_gemm_panels && build-cpu/bench_gemm_panels [rounds] [threads] [T] [cold]
 * (T: that row count alone, any count; 0 for the list).
 * Not run by the tests. */
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "runtime/core/status.h"
#include "runtime/cpu/gemm_fast.h"

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 5;
    const int threads = argc > 2 ? atoi(argv[2]) : 1;
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best < MOE_CPU_ISA_AVX512 || rounds < 1 || threads < 1) {
        fprintf(stderr, "bench_gemm_panels: needs AVX-512 (this processor: %s), rounds and threads >= 1\n",
                moe_cpu_isa_name(best));
        return 1;
    }
    omp_set_num_threads(threads);
    const int shapes[][2] = {{4096, 4096}, {1024, 2048}, {2048, 1024}, {14336, 4096}};
    const int Ts[] = {1, 4, 16, 64, 512};
    const int only = argc > 3 ? atoi(argv[3]) : 0; /* one T only */
    const bool cold = argc > 4 && strcmp(argv[4], "cold") == 0; /* every T reads its weights from memory */
    const enum moe_cpu_isa sets[] = {MOE_CPU_ISA_AVX2,     MOE_CPU_ISA_AVX512,    MOE_CPU_ISA_AVX512_BF16,
                                     MOE_CPU_ISA_AMX,      MOE_CPU_ISA_AMX_EXACT, MOE_CPU_ISA_AMX_BF16};
    const int nset = best >= MOE_CPU_ISA_AMX ? 6 : best >= MOE_CPU_ISA_AVX512_BF16 ? 3 : 2;
    printf("kernel sets avx2..%s, %d rounds, %d thread%s (%s time)\n", moe_cpu_isa_name(sets[nset - 1]), rounds, threads,
           threads > 1 ? "s" : "", threads > 1 ? "wall" : "thread CPU");
    printf("%-12s %4s  %-11s %10s %9s %8s\n", "N x K", "T", "set", "ms", "GFLOP/s", "vs avx512");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int N = shapes[si][0], K = shapes[si][1];
        size_t pb;
        MOE_ASSERT(moe_gemm_panel_bytes(N, K, &pb));
        uint16_t *w = bench_alloc("bench_gemm_panels", (size_t)N * K * 2);
        uint64_t st = 88172645463325252ull + si;
        for (size_t i = 0; i < (size_t)N * K; i++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            float f = ((float)(st >> 40) / (float)(1 << 24) - 0.5f) * 0.1f;
            uint32_t u;
            memcpy(&u, &f, 4);
            w[i] = (uint16_t)(u >> 16);
        }
        const size_t copies_decode = ((size_t)256 << 20) / pb + 1;
        char *pk = bench_alloc_huge("bench_gemm_panels", pb * copies_decode);
        for (size_t c = 0; c < copies_decode; c++) moe_gemm_pack_panels(pk + c * pb, w, N, K);
        free(w);
        for (size_t ti = 0; ti < (only ? 1 : sizeof Ts / sizeof Ts[0]); ti++) {
            const int T = only ? only : Ts[ti];
            const size_t copies = T <= 4 || cold ? copies_decode : 1;
            float *x = bench_alloc("bench_gemm_panels", (size_t)T * K * sizeof(float)), *y = bench_alloc("bench_gemm_panels", (size_t)T * N * sizeof(float));
            for (size_t i = 0; i < (size_t)T * K; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
            const double flop = 2.0 * T * (double)N * K;
            const int reps = (int)(2e9 / flop / (T <= 4 || cold ? 1 : 8)) + 1;
            double *ms = bench_alloc("bench_gemm_panels", sizeof(double) * (size_t)rounds * (size_t)nset);
            for (int r = 0; r < rounds; r++)
                for (int k = 0; k < nset; k++) {
                    const int s = (r % 2 ? nset - 1 - k : k); /* alternate the order */
                    const enum moe_cpu_isa isa = sets[s];
                    const clockid_t ck = threads > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID;
                    moe_gemm_fast(isa, y, N, x, K, pk, MOE_DTYPE_BF16_PANEL, N, K, T, NULL); /* warm */
                    const double t0 = bench_clock(ck);
                    for (int i = 0; i < reps; i++)
                        moe_gemm_fast(isa, y, N, x, K, pk + (size_t)i % copies * pb, MOE_DTYPE_BF16_PANEL, N, K, T,
                                      NULL);
                    ms[(size_t)s * rounds + r] = (bench_clock(ck) - t0) / reps * 1e3;
                }
            double med[6];
            for (int s = 0; s < nset; s++) {
                qsort(ms + (size_t)s * rounds, (size_t)rounds, sizeof(double), bench_cmp_double);
                med[s] = ms[(size_t)s * rounds + rounds / 2];
            }
            for (int s = 0; s < nset; s++)
                printf("%5d x %-5d %4d  %-11s %10.3f %9.1f %8.2fx\n", N, K, T, moe_cpu_isa_name(sets[s]), med[s],
                       flop / med[s] * 1e-6, med[1] / med[s]);
            fflush(stdout);
            free(ms);
            free(x);
            free(y);
        }
        free(pk);
    }
    return 0;
}
