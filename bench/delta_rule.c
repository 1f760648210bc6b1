/* delta_rule.c - the Gated DeltaNet op (attention.h, delta_net) at
 * Qwen3-Next's head shape (16 q/k heads and 32 value heads of 128,
 * convolution 4), one thread: the reference, AVX2 and AVX-512
 * compilations, each in its recurrent form and in its chunked form, on one
 * sequence's run of n rows in one step, for n = 1 (decode) up to 512 (a
 * prompt); attention.h says which form each compilation takes when.  The compilations
 * alternate within each round (the machine is shared and noisy); a figure
 * is the median over rounds of the thread's CPU time, in microseconds per
 * row and value head.
 *
 * Build and run (from the repository root, after the CPU build in build-cpu/):
 *   cmake --build build-cpu --target bench_delta_rule && build-cpu/bench_delta_rule [rounds]
 * Not run by the tests. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "attention/attention.h"

enum { HK = 16, HV = 32, DK = 128, DV = 128, KW = 4, C = 2 * HK * DK + HV * DV, TMAX = 512, MAXR = 64 };

typedef enum moe_status (*delta_fn)(float *, float *, const float *, const float *, struct moe_kvcache *,
                                    const struct moe_batch *, const struct moe_delta_params *, float *, size_t);

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 - 0.5f;
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 && atoi(argv[1]) > 0 ? (atoi(argv[1]) < MAXR ? atoi(argv[1]) : MAXR) : 5;
    omp_set_num_threads(1);
    const enum moe_cpu_isa isa = moe_cpu_isa_detect();
    const delta_fn fns[3] = {moe_attention_delta_cpu, moe_attention_delta_avx2, moe_attention_delta_avx512};
    const char *names[3] = {"reference", "avx2", "avx-512"};
    const int nf = isa >= MOE_CPU_ISA_AVX512 ? 3 : isa >= MOE_CPU_ISA_AVX2 ? 2 : 1;
    uint64_t seed = 1;
    float *qkv0 = malloc((size_t)TMAX * C * sizeof(float)), *qkv = malloc((size_t)TMAX * C * sizeof(float));
    float *b = malloc((size_t)TMAX * HV * sizeof(float)), *a = malloc((size_t)TMAX * HV * sizeof(float));
    float *out = malloc((size_t)TMAX * HV * DV * sizeof(float)), conv_w[C * KW], a_log[HV], dt_bias[HV];
    const size_t layer_f = (size_t)C * (KW - 1) + (size_t)HV * DK * DV;
    float *state = calloc(layer_f, sizeof(float));
    const size_t per = moe_attention_delta_scratch(DK, DV);
    float *scratch = calloc(per, sizeof(float)); /* one thread */
    if (!qkv0 || !qkv || !b || !a || !out || !state || !scratch) return 1;
    for (size_t i = 0; i < (size_t)TMAX * C; i++) qkv0[i] = frand(&seed);
    for (int i = 0; i < TMAX * HV; i++) b[i] = 4 * frand(&seed), a[i] = 4 * frand(&seed);
    for (int i = 0; i < C * KW; i++) conv_w[i] = frand(&seed);
    for (int i = 0; i < HV; i++) a_log[i] = frand(&seed), dt_bias[i] = frand(&seed);
    struct moe_kvcache kv = {.n_state_slots = 1, .state_floats = layer_f, .state_layer_floats = layer_f,
                             .state_conv_floats = (size_t)C * (KW - 1), .state = state};
    struct moe_delta_params p = {.n_k_heads = HK, .n_v_heads = HV, .k_dim = DK, .v_dim = DV, .conv = KW,
                                 .conv_w = conv_w, .a_log = a_log, .dt_bias = dt_bias};
    const int forms[2] = {1 << 30, 1}; /* chunk_min: recurrent, chunked */
    int32_t pos[TMAX], slot = 0;
    for (int i = 0; i < TMAX; i++) pos[i] = 100 + i; /* continues the slot's state */
    printf("Gated DeltaNet op, Qwen3-Next heads (%d x %d x %d), 1 thread, us per row and value head "
           "(median of %d rounds)\n%6s", HV, DK, DV, rounds, "rows");
    for (int f = 0; f < nf; f++) printf(" %11s %11s", names[f], "");
    printf("\n%6s", "");
    for (int f = 0; f < nf; f++) printf(" %11s %11s", "recurrent", "chunked");
    printf("\n");
    const int ns[] = {1, 2, 4, 8, 16, 64, 512};
    for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
        const int n = ns[in], reps = n < 64 ? 64 / n : 1;
        int32_t start[2] = {0, n};
        const struct moe_batch bt = {.n_tokens = n, .n_seqs = 1, .positions = pos, .seq_start = start,
                                     .state_slot = &slot};
        double t[6][MAXR];
        for (int r = 0; r < rounds; r++)
            for (int f = 0; f < 2 * nf; f++) {
                p.chunk_min = forms[f % 2];
                memset(state, 0, layer_f * sizeof(float));
                double s = 0;
                for (int k = 0; k < reps; k++) {
                    memcpy(qkv, qkv0, (size_t)n * C * sizeof(float));
                    const double t0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
                    if (fns[f / 2](out, qkv, b, a, &kv, &bt, &p, scratch, per) != MOE_OK) return 1;
                    s += bench_clock(CLOCK_THREAD_CPUTIME_ID) - t0;
                }
                t[f][r] = s / reps / n / HV * 1e6;
            }
        printf("%6d", n);
        for (int f = 0; f < 2 * nf; f++) {
            qsort(t[f], (size_t)rounds, sizeof(double), bench_cmp_double);
            printf(" %11.2f", t[f][rounds / 2]);
        }
        printf("\n");
    }
    free(qkv0);
    free(qkv);
    free(b);
    free(a);
    free(out);
    free(state);
    free(scratch);
    return 0;
}
