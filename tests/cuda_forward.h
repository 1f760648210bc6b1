/* cuda_forward.h - what the end-to-end CUDA suites share
 * (test_cuda_forward.c, test_cuda_offload.c): a side (a fixture model, a
 * backend and a runner) opened on the CPU or on CUDA, whole-prompt
 * prefills, and the fixture check: a fixture's prompts prefilled and
 * decoded greedily on both sides, logits, expert ids and tokens compared
 * (test_cuda_forward.c says to what tolerance), the offload counters
 * checked when experts are offloaded. */
#pragma once

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/stats.h"
#include "runtime/cli/cli_common.h"
#include "runtime/engine/runner.h"
#include "runtime/core/tensor.h"
#include "tests/testutil.h"

struct side {
    struct moe_model m;
    struct moe_backend be;
    struct moe_runner r;
};

/* gpu_experts: moe_offload_opts.gpu_experts (CUDA; 0: every expert
 * resident), cpu_rows: moe_offload_opts.cpu_rows; cpu_backend: the CPU
 * side's backend, NULL the default (moe_backend_cpu_init), else a name for
 * moe_backend_init ("cpu-ref": four-bit checkpoints, whose fast kernels
 * quantize their inputs while CUDA's multiply fp32 activations). */
static inline void side_open_on(struct side *s, const char *name, bool cuda, int gpu_experts, int cpu_rows,
                                const char *cpu_backend)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, name);
    memset(s, 0, sizeof *s);
    cr_assert_eq(moe_model_load(&s->m, dir), MOE_OK, "load %s: %s", name, moe_last_error());
    if (cuda)
        cr_assert_eq(tu_backend_init_with(&s->be, "cuda", MOE_QUANT_NONE, gpu_experts, cpu_rows), MOE_OK, "%s",
                     moe_last_error());
    else if (cpu_backend)
        cr_assert_eq(tu_backend_init_with(&s->be, cpu_backend, MOE_QUANT_NONE, 0, 0), MOE_OK, "%s", moe_last_error());
    else cr_assert_eq(moe_backend_cpu_init(&s->be, 0), MOE_OK);
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 4, .max_logits = 64,
                                .block_size = 4, .n_blocks = 256};
    cr_assert_eq(moe_runner_init(&s->r, &s->m, &s->be, &o), MOE_OK, "%s", moe_last_error());
}

static inline void side_open_cpu_rows(struct side *s, const char *name, bool cuda, int gpu_experts, int cpu_rows)
{
    side_open_on(s, name, cuda, gpu_experts, cpu_rows, NULL);
}
static inline void side_open_with(struct side *s, const char *name, bool cuda, int gpu_experts)
{
    side_open_cpu_rows(s, name, cuda, gpu_experts, 0);
}
static inline void side_open(struct side *s, const char *name, bool cuda) { side_open_with(s, name, cuda, 0); }

static inline void side_close(struct side *s)
{
    moe_runner_free(&s->r);
    moe_backend_free(&s->be);
    moe_model_free(&s->m);
}

static inline float *prefill_all(struct side *s, const int32_t *prompt, int S, int32_t *trace)
{
    const int V = s->m.cfg.vocab;
    float *logits = malloc((size_t)S * V * sizeof(float));
    struct moe_seq seq = {0};
    struct moe_chunk c = {&seq, prompt, S, true, false, 0};
    struct moe_route_trace tr = {trace, NULL};
    int rows = 0;
    cr_assert_eq(moe_runner_step(&s->r, &c, 1, logits, NULL, &rows, &tr), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(rows, S);
    moe_seq_free(&s->r, &seq);
    return logits;
}

static inline void check_offload_stats(const struct side *gpu, int C);

/* bf16: the bf16 tolerance (1e-2 unless tol > 0), expert ids and greedy
 * tokens reported, not required.  gpu_experts, cpu_backend: as
 * side_open_on.  The first n_prompts prompts of the fixture, n_tokens
 * (<= 32) greedy tokens each. */
static inline void check_fixture_run_on(const char *cpu_backend, const char *name, bool bf16, double tol,
                                        int gpu_experts, int n_prompts, int n_tokens)
{
    struct side cpu, gpu;
    side_open_on(&cpu, name, false, 0, 0, cpu_backend);
    side_open_with(&gpu, name, true, gpu_experts);
    char path[600];
    snprintf(path, sizeof path, "%s/%s/reference.safetensors", FIXTURE_DIR, name);
    struct moe_safetensors ref = {0};
    cr_assert_eq(moe_safetensors_open_file(&ref, path), MOE_OK, "%s", moe_last_error());
    const struct moe_config *c = &cpu.m.cfg;
    const int V = c->vocab, L = c->n_layers, K = c->top_k > 0 ? c->top_k : 1;
    if (tol <= 0) tol = bf16 ? 1e-2 : 1e-4;
    cr_assert(n_prompts <= 3 && n_tokens <= 32);
    for (int p = 0; p < n_prompts; p++) {
        char tn[32];
        snprintf(tn, sizeof tn, "prompt.%d", p);
        const struct moe_st_tensor *pt = moe_safetensors_find(&ref, tn);
        cr_assert(pt, "%s: %s missing", name, tn);
        const int S = (int)pt->shape[0];
        const int32_t *prompt = pt->data;
        int32_t *tc = calloc((size_t)L * S * K, sizeof(int32_t)), *tg = calloc((size_t)L * S * K, sizeof(int32_t));
        float *lc = prefill_all(&cpu, prompt, S, tc), *lg = prefill_all(&gpu, prompt, S, tg);
        double worst = 0;
        for (int s = 0; s < S; s++) {
            double e = tu_max_rel_err(lg + (size_t)s * V, lc + (size_t)s * V, (size_t)V);
            worst = e > worst ? e : worst;
            cr_expect(e <= tol, "%s prompt %d position %d: logits relative error %.3g > %.1g",
                      name, p, s, e, tol);
        }
        int id_diff = 0;
        if (c->n_experts > 0)
            for (size_t i = 0; i < (size_t)L * S * K; i++) id_diff += tc[i] != tg[i];
        if (!bf16) cr_expect_eq(id_diff, 0, "%s prompt %d: %d expert ids differ", name, p, id_diff);
        int32_t oc[32], og[32];
        struct moe_seq qc = {0}, qg = {0};
        cr_assert_eq(moe_runner_greedy(&cpu.r, &qc, prompt, S, n_tokens, 0, oc), MOE_OK, "%s", moe_last_error());
        cr_assert_eq(moe_runner_greedy(&gpu.r, &qg, prompt, S, n_tokens, 0, og), MOE_OK, "%s", moe_last_error());
        int same = 0;
        while (same < n_tokens && oc[same] == og[same]) same++;
        if (!bf16) cr_expect_eq(same, n_tokens, "%s prompt %d: greedy tokens differ from token %d", name, p, same);
        fprintf(stderr, "e2e: %-10s %-4s prompt %d%s: logits max rel err %.3g, expert ids differing %d, "
                "greedy tokens equal to the CPU %d/%d\n", name, bf16 ? "bf16" : "fp32", p,
                gpu_experts ? " (offload)" : "", worst, id_diff, same, n_tokens);
        moe_seq_free(&cpu.r, &qc);
        moe_seq_free(&gpu.r, &qg);
        free(tc), free(tg), free(lc), free(lg);
    }
    cr_assert_eq(moe_kvcache_available(&gpu.r.kv), gpu.r.kv.n_blocks, "every KV block returned");
    if (gpu_experts) check_offload_stats(&gpu, gpu_experts);
    moe_safetensors_close(&ref);
    side_close(&gpu);
    side_close(&cpu);
}

static inline void check_fixture_run(const char *name, bool bf16, double tol, int gpu_experts, int n_prompts,
                                     int n_tokens)
{
    check_fixture_run_on(NULL, name, bf16, tol, gpu_experts, n_prompts, n_tokens);
}

static inline void check_fixture_opts(const char *name, bool bf16, double tol, int gpu_experts)
{
    check_fixture_run(name, bf16, tol, gpu_experts, 3, 32);
}

static inline void check_fixture_tol(const char *name, bool bf16, double tol)
{
    check_fixture_opts(name, bf16, tol, 0);
}
static inline void check_fixture(const char *name, bool bf16) { check_fixture_opts(name, bf16, 0, 0); }

/* Every MoE layer offloaded; misses and bytes copied agree; decode found
 * experts in their slots. */
static inline void check_offload_stats(const struct side *gpu, int C)
{
    const struct moe_config *c = &gpu->m.cfg;
    int moe_layers = 0;
    for (int l = 0; l < c->n_layers; l++) moe_layers += c->layer_moe[l] && c->n_experts > 0;
    struct moe_offload_stats st;
    moe_cuda_offload_stats(&gpu->be, &st);
    cr_assert_eq(st.layers, moe_layers, "%d layers offloaded, %d MoE layers", st.layers, moe_layers);
    const int64_t misses = st.accesses - st.hits;
    cr_assert(st.hits > 0 && misses > 0, "expert uses %lld, found in a slot %lld", (long long)st.accesses,
              (long long)st.hits);
    cr_assert(st.bytes_in > 0 && st.bytes_in % (uint64_t)misses == 0,
              "%llu bytes copied for %lld misses", (unsigned long long)st.bytes_in, (long long)misses);
    enum moe_dtype edt = MOE_DTYPE_F32;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_moe[l]) edt = gpu->m.layers[l].experts.dtype;
    /* one expert: 3 D x F matrices (planes: their values and scales) */
    uint64_t one = 3ull * c->d_model * c->d_expert * 4;
    if (edt == MOE_DTYPE_MXFP4)
        one = 3 * (moe_planes_values_bytes(edt, (size_t)c->d_expert, (size_t)c->d_model) +
                   moe_planes_scales_bytes(edt, (size_t)c->d_expert, (size_t)c->d_model));
    if (edt == MOE_DTYPE_F32 || edt == MOE_DTYPE_MXFP4)
        cr_assert_eq(st.bytes_in / (uint64_t)misses, one, "%s bytes of an expert", moe_dtype_name(edt));
    /* prefills route to more than C experts: some steps ran in rounds */
    cr_assert(st.rounds > st.steps, "%lld rounds in %lld steps", (long long)st.rounds, (long long)st.steps);
    fprintf(stderr, "offload: C=%d of %d, %d layers: %lld expert uses, %.1f%% in a slot, %.2f MB copied in\n",
            C, c->n_experts, st.layers, (long long)st.accesses, 100.0 * st.hits / st.accesses,
            st.bytes_in / 1e6);
}
