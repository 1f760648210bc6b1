/* expert_rows.c - expert rows the fast CPU backend computes per second
 * when every expert of a layer has R rows: the case of experts computed on
 * the CPU beside a GPU (--gpu-experts-cpu-rows, host-memory offload) and of
 * CPU prefill, at R = 1, 2, 8 and 32 rows per expert.
 *
 * A synthetic model of CONFIG (bf16 weights, then quantized by the backend
 * to Q8_0 or four-bit) is prepared by the fast CPU backend once per kernel
 * set (AVX-512, and AMX where it runs: the bf16 tiles, and the int8 tiles
 * for Q8_0 and four-bit; else avx512-bf16 where AVX512-BF16 runs).  A measurement is one call of the backend's
 * expert phase (the `experts` op: gather, gate and up products, SwiGLU,
 * down product, weighted combine) per MoE layer of the model, with
 * T = E R / K tokens routed so that every expert gets exactly R rows
 * (token t's k-th choice is expert (t K + k) mod E); the layers' experts
 * together should exceed the caches, so every call reads its weights from
 * memory, as decode-time offload does.  The kernel sets alternate within
 * each round (the machine is shared and noisy); a figure is the median
 * over rounds.  Printed per format and R: ms per layer, expert rows per
 * second (E R per layer call), and the other set over AVX-512; the load average
 * before and after.
 *
 * Build and run (from the repository root, after the CPU build in build-cpu/):
 *   cmake --build build-cpu --target bench_expert_rows &&
 *   build-cpu/bench_expert_rows configs/prefill-olmoe-1b-7b-2l.json [rounds] [threads]
 * Not run by the tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "runtime/backend/backend.h"
#include "runtime/core/status.h"
#include "runtime/model/model.h"

enum { NR = 4, RMAX = 32, NSET = 2 };
static const int Rs[NR] = {1, 2, 8, 32};

/* One kernel set's backend, model and step buffers (backend memory). */
struct side {
    struct moe_backend be;
    struct moe_model m;
    float *x, *w, *out;
    int32_t *ids, *plan_buf;
    struct moe_expert_ws ws;
    bool up;
};

static bool side_init(struct side *s, const struct moe_config *cfg, enum moe_cpu_isa isa,
                      enum moe_weight_quant q, int threads, int Tmax)
{
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.n_threads = threads;
    o.cpu_isa_max = isa;
    o.quant = q;
    const int E = cfg->n_experts, K = cfg->top_k, D = cfg->d_model, F = cfg->d_expert;
    const size_t TK = (size_t)Tmax * K;
    if (moe_backend_init(&s->be, "cpu", &o) != MOE_OK) return false;
    s->up = true;
    if (moe_model_synthetic(&s->m, cfg, MOE_DTYPE_BF16, 7) != MOE_OK ||
        s->be.ops->prepare_model(&s->be, &s->m) != MOE_OK ||
        (s->be.ops->reserve && s->be.ops->reserve(&s->be, cfg, Tmax) != MOE_OK))
        return false;
    void *p[8];
    const size_t bytes[8] = {(size_t)Tmax * D * 4, TK * 4, (size_t)Tmax * D * 4, TK * 4,
                             (2 * (size_t)E + 1 + 2 * TK) * 4, TK * D * 4, 2 * TK * F * 4, TK * D * 4};
    for (int i = 0; i < 8; i++)
        if (s->be.ops->alloc(&s->be, bytes[i], &p[i]) != MOE_OK) return false;
    s->x = p[0], s->w = p[1], s->out = p[2], s->ids = p[3], s->plan_buf = p[4];
    s->ws = (struct moe_expert_ws){.xe = p[5], .g = p[6], .u = (float *)p[6] + TK * F, .ye = p[7]};
    uint64_t st = 88172645463325252ull;
    for (size_t i = 0; i < (size_t)Tmax * D; i++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        s->x[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (size_t i = 0; i < TK; i++) s->w[i] = 1.0f / (float)K;
    return true;
}

static void side_free(struct side *s)
{
    if (!s->up) return;
    moe_model_free(&s->m);
    moe_backend_free(&s->be);
}

/* Seconds per layer call of the expert phase with T tokens: every MoE
 * layer once (weights from memory), twice over. */
static double measure(struct side *s, const struct moe_config *cfg, int T)
{
    const int E = cfg->n_experts, K = cfg->top_k;
    const size_t TK = (size_t)T * K;
    for (size_t i = 0; i < TK; i++) s->ids[i] = (int32_t)(i % (size_t)E);
    int32_t *b = s->plan_buf;
    struct moe_dispatch plan = {b, b + E, b + 2 * (size_t)E + 1, b + 2 * (size_t)E + 1 + TK, 0, 0, 0};
    const double t0 = bench_clock(CLOCK_MONOTONIC);
    int calls = 0;
    for (int rep = 0; rep < 2; rep++)
        for (int l = 0; l < cfg->n_layers; l++) {
            const struct moe_expert_weights *ex = &s->m.layers[l].experts;
            if (!ex->gate) continue; /* a dense layer */
            MOE_ASSERT(s->be.ops->dispatch(&s->be, &plan, s->ids, T, K, E) == MOE_OK);
            MOE_ASSERT(s->be.ops->experts(&s->be, s->out, s->x, &plan, s->w, ex, &s->ws, T, K, cfg->d_model,
                                          cfg->d_expert, E) == MOE_OK);
            calls++;
        }
    MOE_ASSERT(s->be.ops->sync(&s->be) == MOE_OK);
    return (bench_clock(CLOCK_MONOTONIC) - t0) / calls;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: bench_expert_rows CONFIG.json [rounds] [threads]\n");
        return 2;
    }
    const int rounds = argc > 2 ? atoi(argv[2]) : 3, threads = argc > 3 ? atoi(argv[3]) : 2;
    struct moe_config cfg;
    if (rounds < 1 || rounds > 64 || threads < 1 || moe_config_load(&cfg, argv[1]) != MOE_OK) {
        fprintf(stderr, "bench_expert_rows: %s\n", rounds < 1 || rounds > 64 || threads < 1
                                                       ? "rounds 1..64, threads >= 1" : moe_last_error());
        return 2;
    }
    if (cfg.n_experts <= 0 || cfg.top_k > cfg.n_experts || cfg.n_experts % cfg.top_k != 0) {
        fprintf(stderr, "bench_expert_rows: %s needs experts, E a multiple of K\n", argv[1]);
        return 2;
    }
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    const int nset = best >= MOE_CPU_ISA_AVX512_BF16 ? 2 : 1;
    /* the other side: AMX where the tiles run, else vdpbf16ps (bf16 only;
     * Q8_0 and four-bit run the AVX-512 set's kernels there) */
    const enum moe_cpu_isa sets[NSET] = {MOE_CPU_ISA_AVX512, best >= MOE_CPU_ISA_AMX ? MOE_CPU_ISA_AMX
                                                                                     : MOE_CPU_ISA_AVX512_BF16};
    const char *other = moe_cpu_isa_name(sets[1]);
    const struct { enum moe_weight_quant q; const char *name; } fmts[] = {
        {MOE_QUANT_NONE, "bf16"}, {MOE_QUANT_Q8_0, "q8_0"}, {MOE_QUANT_Q4, "q4"}};
    const int E = cfg.n_experts, K = cfg.top_k, Tmax = E * RMAX / K;
    printf("%s: E %d, K %d, D %d, F %d, %d MoE layers; %d threads, %d rounds; sets avx512%s%s\n", argv[1], E, K,
           cfg.d_model, cfg.d_expert, moe_config_moe_layers(&cfg), threads, rounds, nset > 1 ? ", " : "",
           nset > 1 ? other : "");
    bench_print_load();
    printf("| format | rows/expert | tokens | avx512 ms | avx512 rows/s |");
    if (nset > 1) printf(" %s ms | %s rows/s | %s/avx512 |", other, other, other);
    printf("\n|---|---|---|---|---|%s\n", nset > 1 ? "---|---|---|" : "");
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        struct side s[NSET] = {0};
        bool ok = true;
        for (int i = 0; i < nset && ok; i++) ok = side_init(&s[i], &cfg, sets[i], fmts[f].q, threads, Tmax);
        if (!ok) {
            fprintf(stderr, "bench_expert_rows: %s: %s\n", fmts[f].name, moe_last_error());
            for (int i = 0; i < nset; i++) side_free(&s[i]);
            return 1;
        }
        for (int r = 0; r < NR; r++) {
            const int T = E * Rs[r] / K;
            double t[NSET][64];
            for (int i = 0; i < nset; i++) (void)measure(&s[i], &cfg, T); /* warm */
            for (int k = 0; k < rounds; k++)
                for (int i = 0; i < nset; i++) t[i][k] = measure(&s[i], &cfg, T);
            printf("| %s | %d | %d |", fmts[f].name, Rs[r], T);
            double med[NSET];
            for (int i = 0; i < nset; i++) {
                qsort(t[i], (size_t)rounds, sizeof(double), bench_cmp_double);
                med[i] = t[i][rounds / 2];
                printf(" %.2f | %.0f |", med[i] * 1e3, (double)E * Rs[r] / med[i]);
            }
            if (nset > 1) printf(" %.2f |", med[0] / med[1]);
            printf("\n");
            fflush(stdout);
        }
        for (int i = 0; i < nset; i++) side_free(&s[i]);
    }
    bench_print_load();
    return 0;
}
