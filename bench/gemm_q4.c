/* gemm_q4.c - what the fast CPU matrix product costs over four-bit weights
 * (runtime/cpu/gemm_q4.c) beside bf16 and Q8_0 (docs/cpu.md).
 *
 * Decode-shaped products y (T, N) = x (T, Din) . W^T for (N, Din) = 2048 x
 * 2048, 1024 x 4096 and 768 x 2048 (an expert's matrix) and T = 1, 8, 64,
 * over weights in BF16 rows, BF16 panels (what the fast backend packs
 * bf16 matrices to), Q8_0, Q4_1 and Q4_G128, through moe_gemm_fast with
 * the best kernel set, and where that is AVX-512, Q4_1 and Q4_G128 again
 * with the AVX2 set (the four-bit kernels without AVX512-VNNI).  Each
 * format cycles through distinct copies of its matrix totalling at least
 * 256 MiB, so every product reads its weights from memory as decode does
 * across layers (the L3 holds 32 MiB here).  The formats alternate within
 * each round (the machine is shared and noisy); a figure is the median
 * over rounds of the mean time of one product.  Printed per case: ms per
 * product, GB/s of weight bytes read, GFLOP/s (2 T N Din per product),
 * the best round's ms, and with one thread the median of the thread's
 * CPU time per product (both less disturbed by other work on a shared
 * machine), single-threaded and over 2 OpenMP threads; the load average
 * before and after, which says how far the figures can be trusted.
 *
 * With "decode" after the rounds: the expert and LM-head shapes of the
 * bench models instead (bench-olmoe: 512 x 1024 and 1024 x 512;
 * bench-mixtral: 3584 x 1024 and 1024 x 3584; an LM head 8192 rows of
 * 1024), at T = 1 only, one thread and two.
 *
 * Build and run (from the repository root, after the CPU build in build-cpu/):
 *   cmake --build build-cpu --target bench_gemm_q4 && build-cpu/bench_gemm_q4 [rounds] [decode]
 * Not run by the tests. */
#include <math.h>
#include <stdbool.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "runtime/core/status.h"
#include "runtime/cpu/gemm_fast.h"

/* the formats; the last two: the four-bit kernels' AVX2 instance where the
 * best kernel set is AVX-512 (which takes the AVX512-VNNI instance) */
enum { NF = 7 };
static const char *const fmt_name[NF] = {"bf16", "bf16-panel", "q8_0", "q4_1", "q4_g128", "q4_1-avx2", "q4_g128-avx2"};
static const enum moe_dtype fmt_dt[NF] = {MOE_DTYPE_BF16, MOE_DTYPE_BF16_PANEL, MOE_DTYPE_Q8_0, MOE_DTYPE_Q4_1,
                                          MOE_DTYPE_Q4_G128, MOE_DTYPE_Q4_1, MOE_DTYPE_Q4_G128};
static int nf = NF; /* formats measured: 5 where the best set is AVX2 */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

/* One (N, D) matrix of format f (new memory, *bytes its size) made from
 * the random floats wf. */
static void *make_matrix(int f, const float *wf, int N, int D, size_t *bytes)
{
    const enum moe_dtype dt = fmt_dt[f];
    if (dt == MOE_DTYPE_BF16_PANEL) {
        size_t nb, rb = (size_t)D * 2;
        if (!moe_gemm_panel_bytes(N, D, &nb)) exit(1);
        uint16_t *rows = bench_alloc("bench_gemm_q4", (size_t)N * rb);
        moe_convert_from_f32(rows, wf, MOE_DTYPE_BF16, (size_t)N * D);
        void *p = bench_alloc("bench_gemm_q4", nb);
        moe_gemm_pack_panels(p, rows, N, D);
        free(rows);
        *bytes = nb;
        return p;
    }
    const size_t rb = moe_dtype_row_bytes(dt, (size_t)D);
    unsigned char *w = bench_alloc("bench_gemm_q4", (size_t)N * rb);
    *bytes = (size_t)N * rb;
    for (int n = 0; n < N; n++) {
        const float *r = wf + (size_t)n * D;
        unsigned char *o = w + (size_t)n * rb;
        if (dt == MOE_DTYPE_BF16) {
            moe_convert_from_f32(o, r, dt, (size_t)D);
        } else if (dt == MOE_DTYPE_Q8_0) {
            if (!moe_quantize_row_q8_0(o, r, (size_t)D)) exit(1);
        } else if (dt == MOE_DTYPE_Q4_1) {
            if (!moe_quantize_row_q4_1(o, r, (size_t)D)) exit(1);
        } else { /* GPTQ-like: codes of the floats over [-1, 1), zero point 8 */
            uint8_t codes[128];
            for (int g = 0; g < D / 128; g++) {
                for (int j = 0; j < 128; j++) {
                    const int q = (int)lrintf(r[128 * g + j] * 7.5f + 7.5f);
                    codes[j] = (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
                }
                moe_q4_pack_group(o + (size_t)g * moe_q4_group_bytes(dt), dt, codes, 2.0f / 15, -8 * 2.0f / 15);
            }
        }
    }
    return w;
}

/* One shape at T rows and nth threads: every format's copies, rounds
 * alternating the formats; prints one line per format. */
static void bench_shape(int N, int D, int T, int nth, int rounds, void *const *arena, const size_t *mbytes,
                        const int *copies, const float *x, float *y, enum moe_cpu_isa isa)
{
    double t[NF][64], cpu[NF][64];
    omp_set_num_threads(nth);
    /* products per measurement: every copy once (each from memory) at T =
     * 1; at larger T, compute bound, at most 24 */
    for (int r = 0; r < rounds; r++)
        for (int f = 0; f < nf; f++) {
            const enum moe_cpu_isa fi = f >= 5 ? MOE_CPU_ISA_AVX2 : isa;
            const int n = T == 1 ? copies[f] : copies[f] < 24 ? copies[f] : 24;
            const double t0 = bench_clock(CLOCK_MONOTONIC), c0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
            for (int i = 0; i < n; i++)
                moe_gemm_fast(fi, y, N, x, D, (const char *)arena[f] + (size_t)i * mbytes[f], fmt_dt[f], N, D, T,
                              NULL);
            t[f][r] = (bench_clock(CLOCK_MONOTONIC) - t0) / n;
            cpu[f][r] = (bench_clock(CLOCK_THREAD_CPUTIME_ID) - c0) / n;
        }
    for (int f = 0; f < nf; f++) {
        qsort(t[f], (size_t)rounds, sizeof(double), bench_cmp_double);
        qsort(cpu[f], (size_t)rounds, sizeof(double), bench_cmp_double);
        const double s = t[f][rounds / 2];
        char c[16] = "-";
        if (nth == 1) snprintf(c, sizeof c, "%.3f", cpu[f][rounds / 2] * 1e3);
        printf("| %4d x %4d | %2d | %d | %-12s | %8.3f | %6.2f | %7.1f | %8.3f | %8s |\n", N, D, T, nth, fmt_name[f],
               s * 1e3, (double)mbytes[f] / s * 1e-9, 2.0 * T * N * D / s * 1e-9, t[f][0] * 1e3, c);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 7;
    const bool decode = argc > 2 && strcmp(argv[2], "decode") == 0;
    if (rounds < 1 || rounds > 64 || (argc > 2 && !decode)) {
        fprintf(stderr, "usage: bench_gemm_q4 [rounds, 1..64] [decode]\n");
        return 2;
    }
    const enum moe_cpu_isa isa = moe_cpu_isa_detect();
    if (isa == MOE_CPU_ISA_REF) {
        fprintf(stderr, "bench_gemm_q4: this processor runs no fast kernel set\n");
        return 1;
    }
    if (isa == MOE_CPU_ISA_AVX2) nf = 5;
    const int train[5][2] = {{2048, 2048}, {1024, 4096}, {768, 2048}},
              dec[5][2] = {{512, 1024}, {1024, 512}, {3584, 1024}, {1024, 3584}, {8192, 1024}};
    const int(*shapes)[2] = decode ? dec : train, nshapes = decode ? 5 : 3, Ts[3] = {1, 16, 64},
                          nT = decode ? 1 : 3;
    const size_t total = (size_t)256 << 20;
    printf("kernel set %s, %d rounds, each format's copies >= %zu MiB\n", moe_cpu_isa_name(isa), rounds,
           total >> 20);
    bench_print_load();
    printf("| N x Din | T | threads | weights | ms | GB/s | GFLOP/s | best ms | cpu ms |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < nshapes; s++) {
        const int N = shapes[s][0], D = shapes[s][1];
        float *wf = bench_alloc("bench_gemm_q4", (size_t)N * D * sizeof(float)), *x = bench_alloc("bench_gemm_q4", (size_t)64 * D * sizeof(float)),
              *y = bench_alloc("bench_gemm_q4", (size_t)64 * N * sizeof(float));
        for (size_t i = 0; i < (size_t)N * D; i++) wf[i] = urand();
        for (size_t i = 0; i < (size_t)64 * D; i++) x[i] = urand();
        void *arena[NF];
        size_t mbytes[NF];
        int copies[NF];
        for (int f = 0; f < nf; f++) {
            void *one = make_matrix(f, wf, N, D, &mbytes[f]);
            copies[f] = (int)((total + mbytes[f] - 1) / mbytes[f]);
            arena[f] = bench_alloc("bench_gemm_q4", mbytes[f] * (size_t)copies[f]);
            for (int i = 0; i < copies[f]; i++) memcpy((char *)arena[f] + (size_t)i * mbytes[f], one, mbytes[f]);
            free(one);
        }
        for (int ti = 0; ti < nT; ti++)
            for (int nth = 1; nth <= 1; nth++) bench_shape(N, D, Ts[ti], nth, rounds, arena, mbytes, copies, x, y, isa);
        for (int f = 0; f < nf; f++) free(arena[f]);
        free(wf), free(x), free(y);
    }
    bench_print_load();
    return 0;
}
