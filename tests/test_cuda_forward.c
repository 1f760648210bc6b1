/* test_cuda_forward.c - the fixture models end to end on the CUDA backend
 * against the CPU backend (and transformers' greedy continuation).
 *
 * fp32 fixtures: the 32 greedy tokens of every prompt identical to the
 * CPU's, logits at every prompt position within 1e-4 relative (max |diff| /
 * max |ref| per position), expert ids identical.  bf16 fixture (olmoe): the
 * GPU rounds GEMM inputs to bf16 (see cuda_matmul), so logits are held to
 * 1e-2 relative and expert-id differences (near-ties) are reported, not
 * failed.  Prefill steps of more than 32 rows take the grouped expert path,
 * decode steps the device-driven one, so both run here.
 *
 * Each line "e2e: ..." is collected by tests/gpu/run.sh.  Without a device
 * the suite skips (checked in the forked test process). */
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

TestSuite(cuda_forward, .init = tu_need_cuda_device);

struct side {
    struct moe_model m;
    struct moe_backend be;
    struct moe_runner r;
};

/* gpu_experts: moe_offload_opts.gpu_experts (CUDA; 0: every expert
 * resident), cpu_rows: moe_offload_opts.cpu_rows */
static void side_open_cpu_rows(struct side *s, const char *name, bool cuda, int gpu_experts, int cpu_rows)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, name);
    memset(s, 0, sizeof *s);
    cr_assert_eq(moe_model_load(&s->m, dir), MOE_OK, "load %s: %s", name, moe_last_error());
    if (cuda)
        cr_assert_eq(tu_backend_init_with(&s->be, "cuda", MOE_QUANT_NONE, gpu_experts, cpu_rows), MOE_OK, "%s",
                     moe_last_error());
    else cr_assert_eq(moe_backend_cpu_init(&s->be, 0), MOE_OK);
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 4, .max_logits = 64,
                                .block_size = 4, .n_blocks = 256};
    cr_assert_eq(moe_runner_init(&s->r, &s->m, &s->be, &o), MOE_OK, "%s", moe_last_error());
}

static void side_open_with(struct side *s, const char *name, bool cuda, int gpu_experts)
{
    side_open_cpu_rows(s, name, cuda, gpu_experts, 0);
}
static void side_open(struct side *s, const char *name, bool cuda) { side_open_with(s, name, cuda, 0); }

static void side_close(struct side *s)
{
    moe_runner_free(&s->r);
    moe_backend_free(&s->be);
    moe_model_free(&s->m);
}

static float *prefill_all(struct side *s, const int32_t *prompt, int S, int32_t *trace)
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

static void check_offload_stats(const struct side *gpu, int C);

/* bf16: the bf16 tolerance (1e-2 unless tol > 0), expert ids and greedy
 * tokens reported, not required.  gpu_experts: as side_open_with.  The
 * first n_prompts prompts of the fixture, n_tokens (<= 32) greedy tokens
 * each. */
static void check_fixture_run(const char *name, bool bf16, double tol, int gpu_experts, int n_prompts,
                              int n_tokens)
{
    struct side cpu, gpu;
    side_open(&cpu, name, false);
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

static void check_fixture_opts(const char *name, bool bf16, double tol, int gpu_experts)
{
    check_fixture_run(name, bf16, tol, gpu_experts, 3, 32);
}

static void check_fixture_tol(const char *name, bool bf16, double tol)
{
    check_fixture_opts(name, bf16, tol, 0);
}
static void check_fixture(const char *name, bool bf16) { check_fixture_opts(name, bf16, 0, 0); }

Test(cuda_forward, mixtral_matches_cpu) { check_fixture("mixtral", false); }
Test(cuda_forward, qwen2_moe_matches_cpu) { check_fixture("qwen2_moe", false); }
Test(cuda_forward, qwen3_moe_matches_cpu) { check_fixture("qwen3_moe", false); }
Test(cuda_forward, glm4_moe_matches_cpu) { check_fixture("glm4_moe", false); }
Test(cuda_forward, granitemoe_matches_cpu) { check_fixture("granitemoe", false); }
/* sinks, yarn, biases, clamped activation; MXFP4 experts read in place
 * (the same weights as the CPU's) */
Test(cuda_forward, gpt_oss_matches_cpu) { check_fixture("gpt_oss", false); }
Test(cuda_forward, gpt_oss_mxfp4_matches_cpu) { check_fixture("gpt_oss_mxfp4", true); }
Test(cuda_forward, olmoe_bf16_matches_cpu) { check_fixture("olmoe", true); }
/* FP8 experts and projections read in place (the prompts, 5 to 21 rows,
 * never widen them), its bf16 router and LM head fed bf16-rounded
 * activations: this small random model's logits move by up to 1.02e-2 so
 * under the host emulation of the kernels (tools/cuda-emu), so 2e-2. */
Test(cuda_forward, qwen3_moe_fp8_matches_cpu) { check_fixture_tol("qwen3_moe_fp8", true, 2e-2); }
/* DeepSeek's multi-head latent attention (gather_cols, head_matmul, the MLA
 * attention kernel over one cached row per token): V2 with the q LoRA
 * absent and group-limited softmax routing (group_limited_greedy, x 1.5),
 * V3 with the q LoRA and the sigmoid router.  Not deepseek_v3_fp8 yet: its
 * FP8 weights are read in place for steps of up to 32 rows, but a step of
 * more widens them to bf16, and rounding them so moves its logits by 4-5%
 * on the CPU alone (expert ids flip with it), past any bf16 tolerance; its
 * MLA weights' upload is checked byte for byte instead (test_cuda_quant.c,
 * fp8_mla_weights_upload). */
Test(cuda_forward, deepseek_v2_matches_cpu) { check_fixture("deepseek_v2", false); }
Test(cuda_forward, deepseek_v3_matches_cpu) { check_fixture("deepseek_v3", false); }
/* MiniMax-M2: OLMoE's whole-projection q/k norms, GLM-4.5's partial RoPE
 * and sigmoid router (here without groups): no kernel of its own */
Test(cuda_forward, minimax_m2_matches_cpu) { check_fixture("minimax_m2", false); }
Test(cuda_forward, minimax_m2_short_matches_cpu) { check_fixture_run("minimax_m2", false, 0, 0, 1, 8); }
/* Qwen3-Next: the Gated DeltaNet kernels (convolution with carried inputs,
 * the delta rule over each sequence's state slot, attention/linear_attn_cuda.cu),
 * the gated attention output; the prompt prefilled at once, then decoded
 * token by token over the state */
Test(cuda_forward, qwen3_next_matches_cpu) { check_fixture("qwen3_next", false); }
Test(cuda_forward, qwen3_next_short_matches_cpu) { check_fixture_run("qwen3_next", false, 0, 0, 1, 8); }
/* Llama-4: no kernels for its chunked attention, layers without RoPE, q/k
 * L2 norm or routing (docs/cuda.md): refused at load, in one line */
Test(cuda_forward, llama4_is_refused_at_load)
{
    struct side s;
    memset(&s, 0, sizeof s);
    cr_assert_eq(moe_model_load(&s.m, FIXTURE_DIR "/llama4"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(tu_backend_init_with(&s.be, "cuda", MOE_QUANT_NONE, 0, 0), MOE_OK, "%s", moe_last_error());
    struct moe_runner_opts o = {.max_tokens = 8, .max_seqs = 1, .max_logits = 8, .block_size = 4, .n_blocks = 16};
    cr_assert_eq(moe_runner_init(&s.r, &s.m, &s.be, &o), MOE_ERR_UNSUPPORTED);
    cr_assert(strstr(moe_last_error(), "Llama4ForCausalLM") && strstr(moe_last_error(), "no CUDA kernels"), "%s",
              moe_last_error());
    moe_backend_free(&s.be);
    moe_model_free(&s.m);
}
/* one prompt and 8 greedy tokens, GQA and MLA: the host emulation's CI
 * selection (tools/cuda-emu/ci-tests.txt) */
Test(cuda_forward, qwen3_moe_short_matches_cpu) { check_fixture_run("qwen3_moe", false, 0, 0, 1, 8); }
Test(cuda_forward, deepseek_v2_short_matches_cpu) { check_fixture_run("deepseek_v2", false, 0, 0, 1, 8); }
Test(cuda_forward, llama_matches_cpu) { check_fixture("llama", false); }
Test(cuda_forward, qwen2_matches_cpu) { check_fixture("qwen2", false); }
Test(cuda_forward, qwen3_matches_cpu) { check_fixture("qwen3", false); }

/* ---- expert offload (moe_backend.gpu_experts) ----
 * C of a layer's 8 experts in device slots, the rest copied in from host
 * memory when routed to: the same numbers as the CPU (and as the resident
 * experts).  The fixtures' prompts (5 to 21 rows) take the device-driven
 * kernels, their prefill in several rounds (more than C experts a step);
 * a 40-row prefill of a bf16 or MXFP4 model takes the grouped GEMMs. */

/* Every MoE layer offloaded; misses and bytes copied agree; decode found
 * experts in their slots. */
static void check_offload_stats(const struct side *gpu, int C)
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

Test(cuda_forward, offload_mixtral_matches_cpu) { check_fixture_opts("mixtral", false, 0, 3); }
Test(cuda_forward, offload_one_slot_qwen3_moe_matches_cpu) { check_fixture_opts("qwen3_moe", false, 0, 1); }
Test(cuda_forward, offload_gpt_oss_mxfp4_matches_cpu) { check_fixture_opts("gpt_oss_mxfp4", true, 0, 3); }

/* A 40-row prefill (the grouped path for bf16 and MXFP4 experts) with C
 * slots (0: every expert resident): the resident experts' logits on
 * cuBLAS's grouped GEMMs to rounding (the same GEMMs, in other groups),
 * and the CPU's within the path's tolerance (bf16 activations for the
 * grouped GEMMs: 2e-2).  mma: the side under test runs the tensor-core
 * expert kernels (MOERUN_CUDA_EXPERTS=mma), whose fused activation takes
 * gate and up in fp32 where the cuBLAS path rounds them to bf16 first:
 * the two paths differ by as much as each differs from the CPU (2e-2). */
static void check_long_prefill(const char *name, bool bf16, int C, bool mma)
{
    struct side cpu, res, gpu;
    side_open(&cpu, name, false);
    side_open(&res, name, true);
    if (mma) setenv("MOERUN_CUDA_EXPERTS", "mma", 1);
    side_open_with(&gpu, name, true, C);
    unsetenv("MOERUN_CUDA_EXPERTS");
    const int V = cpu.m.cfg.vocab, S = 40;
    int32_t prompt[40];
    for (int i = 0; i < S; i++) prompt[i] = (int32_t)((i * 7919 + 13) % V);
    float *lc = prefill_all(&cpu, prompt, S, NULL), *lr = prefill_all(&res, prompt, S, NULL),
          *lg = prefill_all(&gpu, prompt, S, NULL);
    double vs_cpu = 0, vs_res = 0, tol = bf16 ? 2e-2 : 1e-4;
    for (int s = 0; s < S; s++) {
        vs_cpu = fmax(vs_cpu, tu_max_rel_err(lg + (size_t)s * V, lc + (size_t)s * V, (size_t)V));
        vs_res = fmax(vs_res, tu_max_rel_err(lg + (size_t)s * V, lr + (size_t)s * V, (size_t)V));
    }
    cr_expect(vs_res <= (mma ? tol : 1e-3), "%s, %d rows, C=%d%s: logits vs resident experts %.3g", name,
              S, C, mma ? " (mma)" : "", vs_res);
    cr_expect(vs_cpu <= tol, "%s, %d rows, C=%d%s: logits vs the CPU %.3g > %.1g", name, S, C,
              mma ? " (mma)" : "", vs_cpu, tol);
    const int64_t mma_calls = moe_cuda_mma_expert_calls(&gpu.be);
    cr_expect(mma ? mma_calls > 0 : mma_calls == 0, "%s: %lld runs of the tensor-core expert kernels", name,
              (long long)mma_calls);
    fprintf(stderr, "e2e: %-10s %-4s %d-row prefill (C=%d%s): logits max rel err %.3g vs the CPU, "
            "%.3g vs resident experts on cuBLAS\n", name, bf16 ? "bf16" : "fp32", S, C,
            mma ? ", mma" : "", vs_cpu, vs_res);
    if (C > 0) {
        struct moe_offload_stats st;
        moe_cuda_offload_stats(&gpu.be, &st);
        cr_expect(st.layers > 0 && st.accesses > 0 && st.bytes_in > 0, "%s: nothing offloaded", name);
        /* the grouped GEMMs for bf16 and MXFP4 experts (fp32 ones: the
         * device-driven kernels), in rounds: 40 rows route to more than C */
        cr_expect_eq(st.grouped_steps, bf16 ? st.layers : 0, "%s: %lld steps on the grouped GEMMs", name,
                     (long long)st.grouped_steps);
        cr_expect(st.rounds > st.steps, "%s: %lld rounds in %lld steps", name, (long long)st.rounds,
                  (long long)st.steps);
    }
    free(lc), free(lr), free(lg);
    side_close(&gpu);
    side_close(&res);
    side_close(&cpu);
}

Test(cuda_forward, offload_long_prefill_olmoe) { check_long_prefill("olmoe", true, 3, false); }
Test(cuda_forward, offload_long_prefill_gpt_oss_mxfp4) { check_long_prefill("gpt_oss_mxfp4", true, 2, false); }
Test(cuda_forward, offload_long_prefill_mixtral) { check_long_prefill("mixtral", false, 5, false); }
/* the tensor-core expert kernels, resident and offloaded (in rounds) */
Test(cuda_forward, mma_experts_long_prefill_olmoe) { check_long_prefill("olmoe", true, 0, true); }
Test(cuda_forward, mma_experts_long_prefill_gpt_oss_mxfp4) { check_long_prefill("gpt_oss_mxfp4", true, 0, true); }
Test(cuda_forward, offload_mma_long_prefill_olmoe) { check_long_prefill("olmoe", true, 3, true); }
Test(cuda_forward, offload_mma_long_prefill_gpt_oss_mxfp4) { check_long_prefill("gpt_oss_mxfp4", true, 2, true); }

/* --gpu-experts-cpu-rows R: a miss of at most R rows is computed on the
 * CPU from the host copy while the device runs the resident experts.  The
 * logits stay the CPU's (fp32: 1e-4, and the same greedy tokens; bf16
 * models their path's tolerance), some uses ran on the CPU, each with at
 * most R rows.  S-row prefills and 8 decode steps; S = 12 takes the
 * device-driven kernels (fp32 rows, the down bias in them), S = 40 the
 * grouped GEMMs or, with mma, the tensor-core kernels (half rows, the down
 * bias added by the combine). */
static void check_cpu_misses(const char *name, bool bf16, int C, int R, int S, bool mma)
{
    struct side cpu, gpu;
    side_open(&cpu, name, false);
    if (mma) setenv("MOERUN_CUDA_EXPERTS", "mma", 1);
    side_open_cpu_rows(&gpu, name, true, C, R);
    unsetenv("MOERUN_CUDA_EXPERTS");
    const int V = cpu.m.cfg.vocab;
    int32_t prompt[40], oc[8], og[8];
    cr_assert(S <= 40);
    for (int i = 0; i < S; i++) prompt[i] = (int32_t)((i * 7919 + 13) % V);
    float *lc = prefill_all(&cpu, prompt, S, NULL), *lg = prefill_all(&gpu, prompt, S, NULL);
    double worst = 0, tol = bf16 ? 2e-2 : 1e-4;
    for (int s = 0; s < S; s++) worst = fmax(worst, tu_max_rel_err(lg + (size_t)s * V, lc + (size_t)s * V, (size_t)V));
    struct moe_offload_stats st;
    moe_cuda_offload_stats(&gpu.be, &st);
    const int64_t prefill_cpu = st.cpu_uses;
    struct moe_seq qc = {0}, qg = {0};
    cr_assert_eq(moe_runner_greedy(&cpu.r, &qc, prompt, S, 8, 0, oc), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_runner_greedy(&gpu.r, &qg, prompt, S, 8, 0, og), MOE_OK, "%s", moe_last_error());
    int same = 0;
    while (same < 8 && oc[same] == og[same]) same++;
    moe_cuda_offload_stats(&gpu.be, &st);
    cr_expect(worst <= tol, "%s C=%d R=%d, %d rows%s: logits vs the CPU %.3g > %.1g", name, C, R, S,
              mma ? " (mma)" : "", worst, tol);
    if (!bf16) cr_expect_eq(same, 8, "%s: greedy tokens differ from token %d", name, same);
    cr_expect(prefill_cpu > 0 && st.cpu_uses > prefill_cpu, "%s: %lld expert uses on the CPU in the prefill, "
              "%lld in all", name, (long long)prefill_cpu, (long long)st.cpu_uses);
    cr_expect(st.cpu_rows >= st.cpu_uses && st.cpu_rows <= st.cpu_uses * R, "%s: %lld CPU rows for %lld uses",
              name, (long long)st.cpu_rows, (long long)st.cpu_uses);
    const int64_t mma_calls = moe_cuda_mma_expert_calls(&gpu.be);
    cr_expect_eq(mma_calls > 0, mma, "%s: %lld runs of the tensor-core expert kernels", name, (long long)mma_calls);
    cr_expect(st.accesses > st.hits, "%s: no expert copied in (%lld uses on the device)", name, (long long)st.accesses);
    fprintf(stderr, "e2e: %-10s %-4s offload C=%d, misses of <= %d rows on the CPU, %d-row prefill%s: logits "
            "max rel err %.3g vs the CPU, greedy tokens equal %d/8; %lld uses (%lld rows) on the CPU, %lld of "
            "%lld device uses in a slot, %.2f MB copied in\n", name, bf16 ? "bf16" : "fp32", C, R, S,
            mma ? " (mma)" : "", worst, same, (long long)st.cpu_uses, (long long)st.cpu_rows, (long long)st.hits,
            (long long)st.accesses, st.bytes_in / 1e6);
    moe_seq_free(&cpu.r, &qc);
    moe_seq_free(&gpu.r, &qg);
    free(lc), free(lg);
    side_close(&gpu);
    side_close(&cpu);
}

Test(cuda_forward, offload_cpu_misses_mixtral) { check_cpu_misses("mixtral", false, 3, 1, 12, false); }
Test(cuda_forward, offload_cpu_misses_gpt_oss_mxfp4) { check_cpu_misses("gpt_oss_mxfp4", true, 2, 3, 12, false); }
Test(cuda_forward, offload_cpu_misses_long_prefill_olmoe) { check_cpu_misses("olmoe", true, 3, 6, 40, false); }
Test(cuda_forward, offload_cpu_misses_long_prefill_gpt_oss_mxfp4)
{
    check_cpu_misses("gpt_oss_mxfp4", true, 2, 5, 40, false);
}
Test(cuda_forward, offload_cpu_misses_mma_gpt_oss_mxfp4) { check_cpu_misses("gpt_oss_mxfp4", true, 2, 5, 40, true); }

/* --gpu-experts-warm: the slots start with the experts a CPU run of the
 * same prompt routed to most (per MoE layer, from its route trace).  The
 * warm side's first prefill finds some experts resident (the cold side
 * none), copies in fewer bytes (the warm start itself is not counted), and
 * its logits equal the cold side's.  Statistics of another shape are
 * refused when the model is prepared. */
Test(cuda_forward, offload_warm_start_from_statistics)
{
    const char *name = "qwen3_moe";
    const int C = 3;
    struct side cpu, cold, warm;
    side_open(&cpu, name, false);
    const struct moe_config *c = &cpu.m.cfg;
    const int L = c->n_layers, K = c->top_k, E = c->n_experts, S = 24, Lm = moe_config_moe_layers(c);
    int32_t prompt[24];
    for (int i = 0; i < S; i++) prompt[i] = (int32_t)((i * 31 + 7) % c->vocab);
    int32_t *tr = malloc((size_t)L * S * K * sizeof(int32_t));
    float *lc = prefill_all(&cpu, prompt, S, tr);
    double *load = calloc((size_t)Lm * E, sizeof(double));
    for (int l = 0, j = 0; l < L; l++) {
        if (tr[(size_t)l * S * K] < 0) continue; /* dense layer */
        for (int i = 0; i < S * K; i++) load[(size_t)j * E + tr[(size_t)l * S * K + i]] += 1;
        j++;
    }
    side_open_with(&cold, name, true, C);
    /* the warm side: the backend gets the statistics before the runner prepares the model */
    memset(&warm, 0, sizeof warm);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, name);
    cr_assert_eq(moe_model_load(&warm.m, dir), MOE_OK, "%s", moe_last_error());
    struct moe_backend_opts bo;
    moe_cli_backend_opts(&bo, 0);
    bo.offload = (struct moe_offload_opts){.gpu_experts = C, .warm = load, .warm_layers = Lm, .warm_e = E};
    cr_assert_eq(moe_backend_init(&warm.be, "cuda", &bo), MOE_OK, "%s", moe_last_error());
    free(load); /* the backend keeps a copy */
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 4, .max_logits = 64, .block_size = 4,
                                .n_blocks = 256};
    cr_assert_eq(moe_runner_init(&warm.r, &warm.m, &warm.be, &o), MOE_OK, "%s", moe_last_error());
    float *lw = prefill_all(&warm, prompt, S, NULL), *lo = prefill_all(&cold, prompt, S, NULL);
    struct moe_offload_stats sw, so;
    moe_cuda_offload_stats(&warm.be, &sw);
    moe_cuda_offload_stats(&cold.be, &so);
    double vs_cold = 0, vs_cpu = 0;
    for (int i = 0; i < S; i++) {
        vs_cold = fmax(vs_cold, tu_max_rel_err(lw + (size_t)i * c->vocab, lo + (size_t)i * c->vocab, (size_t)c->vocab));
        vs_cpu = fmax(vs_cpu, tu_max_rel_err(lw + (size_t)i * c->vocab, lc + (size_t)i * c->vocab, (size_t)c->vocab));
    }
    cr_expect(vs_cold <= 1e-6 && vs_cpu <= 1e-4, "warm start logits: %.3g vs cold, %.3g vs the CPU", vs_cold, vs_cpu);
    cr_expect(so.hits == 0 && sw.hits > 0, "hits: %lld warm, %lld cold", (long long)sw.hits, (long long)so.hits);
    cr_expect(sw.accesses == so.accesses && sw.bytes_in < so.bytes_in, "bytes in: %llu warm, %llu cold",
              (unsigned long long)sw.bytes_in, (unsigned long long)so.bytes_in);
    fprintf(stderr, "e2e: %-10s offload C=%d warm start: %lld of %lld uses found on the device (cold: %lld), "
            "logits %.3g from cold\n", name, C, (long long)sw.hits, (long long)sw.accesses, (long long)so.hits,
            vs_cold);
    free(lw), free(lo), free(lc), free(tr);
    side_close(&warm);
    side_close(&cold);
    /* statistics of another shape: refused by name */
    struct side bad;
    memset(&bad, 0, sizeof bad);
    cr_assert_eq(moe_model_load(&bad.m, dir), MOE_OK, "%s", moe_last_error());
    double *wide = calloc((size_t)Lm * (E + 1), sizeof(double));
    bo.offload = (struct moe_offload_opts){.gpu_experts = C, .warm = wide, .warm_layers = Lm, .warm_e = E + 1};
    cr_assert_eq(moe_backend_init(&bad.be, "cuda", &bo), MOE_OK, "%s", moe_last_error());
    free(wide);
    cr_expect_neq(moe_runner_init(&bad.r, &bad.m, &bad.be, &o), MOE_OK);
    cr_expect(strstr(moe_last_error(), "--gpu-experts-warm") != NULL, "%s", moe_last_error());
    moe_backend_free(&bad.be);
    moe_model_free(&bad.m);
    side_close(&cpu);
}

/* Batched steps: three sequences prefilled and decoded together on the GPU
 * give the logits each gets alone (rows never mix within a step), to
 * rounding: cuBLAS may pick another algorithm for another row count. */
Test(cuda_forward, batched_steps_match_solo)
{
    struct side g;
    side_open(&g, "qwen3_moe", true);
    const int V = g.m.cfg.vocab, STEPS = 6;
    int32_t prompts[3][6] = {{1, 5, 9, 13, 2, 7}, {4, 4, 4, 8, 1, 3}, {11, 2, 6, 6, 9, 10}};
    int32_t cont[3][6] = {{3, 1, 4, 1, 5, 9}, {2, 6, 5, 3, 5, 8}, {9, 7, 9, 3, 2, 3}};
    float *solo = malloc(3 * (size_t)(STEPS + 1) * V * sizeof(float));
    for (int p = 0; p < 3; p++) {
        struct moe_seq s = {0};
        struct moe_chunk c = {&s, prompts[p], 6, false, false, 0};
        cr_assert_eq(moe_runner_step(&g.r, &c, 1, solo + ((size_t)p * (STEPS + 1)) * V, NULL, NULL, NULL),
                     MOE_OK, "%s", moe_last_error());
        for (int i = 0; i < STEPS; i++) {
            c = (struct moe_chunk){&s, &cont[p][i], 1, false, false, 0};
            cr_assert_eq(moe_runner_step(&g.r, &c, 1, solo + ((size_t)p * (STEPS + 1) + i + 1) * V, NULL,
                                         NULL, NULL), MOE_OK, "%s", moe_last_error());
        }
        moe_seq_free(&g.r, &s);
    }
    struct moe_seq seqs[3] = {{0}};
    float *logits = malloc(3 * (size_t)V * sizeof(float));
    struct moe_chunk ch[3];
    for (int p = 0; p < 3; p++) ch[p] = (struct moe_chunk){&seqs[p], prompts[p], 6, false, false, 0};
    for (int i = 0; i <= STEPS; i++) {
        cr_assert_eq(moe_runner_step(&g.r, ch, 3, logits, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
        for (int p = 0; p < 3; p++) {
            double e = tu_max_rel_err(logits + (size_t)p * V, solo + ((size_t)p * (STEPS + 1) + i) * V,
                                      (size_t)V);
            cr_expect(e <= 1e-4, "sequence %d step %d: batched vs solo logits %.3g", p, i, e);
            if (i < STEPS) ch[p] = (struct moe_chunk){&seqs[p], &cont[p][i], 1, false, false, 0};
        }
    }
    for (int p = 0; p < 3; p++) moe_seq_free(&g.r, &seqs[p]);
    free(logits);
    free(solo);
    side_close(&g);
}

/* Two CUDA sides of one fixture: eager steps, and step graphs on. */
static void open_eager_and_graphs(struct side *eager, struct side *graph, const char *name)
{
    unsetenv("MOERUN_CUDA_GRAPHS");
    side_open(eager, name, true);
    setenv("MOERUN_CUDA_GRAPHS", "1", 1);
    side_open(graph, name, true);
    unsetenv("MOERUN_CUDA_GRAPHS");
}

/* One step of the same tokens on both sides, logits of each into le, lg. */
static void step_both(struct side *eager, struct side *graph, struct moe_seq *se,
                      struct moe_seq *sg, const int32_t *tokens, int n, bool decode, float *le,
                      float *lg)
{
    struct moe_chunk ce = {se, tokens, n, false, decode, 0}, cg = {sg, tokens, n, false, decode, 0};
    cr_assert_eq(moe_runner_step(&eager->r, &ce, 1, le, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_runner_step(&graph->r, &cg, 1, lg, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
}

/* Whether the fixture's weights are fp32 (else bf16: the GEMM inputs are
 * rounded to bf16 on the GPU, so the few-ulp differences of a reordered sum
 * (recorded steps split attention by the table's capacity, eager ones by
 * the context) can move a logit by a bf16 ulp of an activation). */
static bool fp32_weights(const struct side *s) { return s->m.layers[0].wq.dtype == MOE_DTYPE_F32; }

/* Step graphs (MOERUN_CUDA_GRAPHS=1): decode steps recorded once and
 * replayed give the tokens and, to rounding, the logits of eager steps.
 * steps: decode steps (the first recorded, the rest replayed). */
static void check_graphs_steps(const char *name, int steps)
{
    struct side eager, graph;
    open_eager_and_graphs(&eager, &graph, name);
    const double tol = fp32_weights(&eager) ? 1e-5 : 5e-3;
    const int V = eager.m.cfg.vocab;
    int32_t prompt[7] = {3, 14, 15, 9, 2, 6, 5};
    struct moe_seq se = {0}, sg = {0};
    float *le = malloc((size_t)V * sizeof(float)), *lg = malloc((size_t)V * sizeof(float));
    step_both(&eager, &graph, &se, &sg, prompt, 7, false, le, lg);
    double worst = 0;
    int i;
    for (i = 0; i < steps; i++) {
        int32_t te = moe_argmax(le, V), tg = moe_argmax(lg, V);
        double e = tu_max_rel_err(lg, le, (size_t)V);
        worst = e > worst ? e : worst;
        cr_expect(e <= tol, "%s step %d: graph vs eager logits %.3g", name, i, e);
        cr_expect_eq(tg, te, "%s step %d: graph token %d, eager %d", name, i, tg, te);
        step_both(&eager, &graph, &se, &sg, &te, 1, false, le, lg);
    }
    /* the first decode step is recorded, the ones after it replayed */
    cr_expect_eq(moe_cuda_graph_replays(&graph.be), steps - 1, "%s: %lld steps replayed", name,
                 (long long)moe_cuda_graph_replays(&graph.be));
    fprintf(stderr, "e2e: %-10s graphs: %lld decode steps replayed, logits max rel err vs eager %.3g\n",
            name, (long long)moe_cuda_graph_replays(&graph.be), worst);
    moe_seq_free(&eager.r, &se);
    moe_seq_free(&graph.r, &sg);
    free(le), free(lg);
    side_close(&graph);
    side_close(&eager);
}

static void check_graphs(const char *name) { check_graphs_steps(name, 24); }

Test(cuda_forward, graphs_match_eager_qwen3_moe) { check_graphs("qwen3_moe"); }
/* four decode steps, three replayed: the host emulation's CI selection
 * (tools/cuda-emu/ci-tests.txt) */
Test(cuda_forward, graphs_short_match_eager_qwen3_moe) { check_graphs_steps("qwen3_moe", 4); }

/* The tensor-core expert kernels (MOERUN_CUDA_EXPERTS=mma) wait for
 * nothing: steps of 16 rows on olmoe (8 experts, top-2: 4 rows an expert)
 * take them and are recorded and replayed like decode steps, to the
 * logits of eager steps. */
Test(cuda_forward, graphs_with_mma_experts_match_eager_olmoe)
{
    struct side eager, graph;
    setenv("MOERUN_CUDA_EXPERTS", "mma", 1);
    open_eager_and_graphs(&eager, &graph, "olmoe");
    unsetenv("MOERUN_CUDA_EXPERTS");
    const int V = eager.m.cfg.vocab;
    int32_t chunk[16];
    struct moe_seq se = {0}, sg = {0};
    float *le = malloc((size_t)V * sizeof(float)), *lg = malloc((size_t)V * sizeof(float));
    double worst = 0;
    for (int i = 0; i < 4; i++) { /* a 64-token prompt in chunks of 16 */
        for (int j = 0; j < 16; j++) chunk[j] = (int32_t)((i * 16 + j) * 7919 % V);
        step_both(&eager, &graph, &se, &sg, chunk, 16, false, le, lg);
        const double e = tu_max_rel_err(lg, le, (size_t)V);
        worst = e > worst ? e : worst;
        cr_expect(e <= 5e-3, "chunk %d: graph vs eager logits %.3g", i, e);
    }
    /* the first chunk recorded, the three after it replayed */
    cr_expect_eq(moe_cuda_graph_replays(&graph.be), 3, "%lld steps replayed",
                 (long long)moe_cuda_graph_replays(&graph.be));
    cr_expect(moe_cuda_mma_expert_calls(&eager.be) > 0 && moe_cuda_mma_expert_calls(&graph.be) > 0,
              "tensor-core expert kernels: %lld eager, %lld recorded", (long long)moe_cuda_mma_expert_calls(&eager.be),
              (long long)moe_cuda_mma_expert_calls(&graph.be));
    fprintf(stderr, "e2e: olmoe      graphs with tensor-core experts: %lld steps replayed, logits max rel "
            "err vs eager %.3g\n", (long long)moe_cuda_graph_replays(&graph.be), worst);
    moe_seq_free(&eager.r, &se);
    moe_seq_free(&graph.r, &sg);
    free(le), free(lg);
    side_close(&graph);
    side_close(&eager);
}

/* Graphs asked for while experts are offloaded: every step waits for the
 * routing counts, so none is recorded (a recording would break on the
 * synchronisation), and the steps match eager resident ones. */
Test(cuda_forward, offload_records_no_graphs)
{
    struct side eager, off;
    unsetenv("MOERUN_CUDA_GRAPHS");
    side_open(&eager, "qwen3_moe", true);
    setenv("MOERUN_CUDA_GRAPHS", "1", 1);
    side_open_with(&off, "qwen3_moe", true, 2);
    unsetenv("MOERUN_CUDA_GRAPHS");
    const int V = eager.m.cfg.vocab;
    int32_t prompt[7] = {3, 14, 15, 9, 2, 6, 5};
    struct moe_seq se = {0}, so = {0};
    float *le = malloc((size_t)V * sizeof(float)), *lo = malloc((size_t)V * sizeof(float));
    step_both(&eager, &off, &se, &so, prompt, 7, false, le, lo);
    for (int i = 0; i < 8; i++) {
        int32_t te = moe_argmax(le, V), to = moe_argmax(lo, V);
        double e = tu_max_rel_err(lo, le, (size_t)V);
        cr_expect(e <= 1e-5, "step %d: offloaded vs resident logits %.3g", i, e);
        cr_expect_eq(to, te, "step %d: token %d, resident %d", i, to, te);
        step_both(&eager, &off, &se, &so, &te, 1, false, le, lo);
    }
    cr_expect_eq(moe_cuda_graph_replays(&off.be), 0);
    moe_seq_free(&eager.r, &se);
    moe_seq_free(&off.r, &so);
    free(le), free(lo);
    side_close(&off);
    side_close(&eager);
}
Test(cuda_forward, graphs_match_eager_olmoe) { check_graphs("olmoe"); }
/* MLA recorded: the attention's key splits from the block table's capacity */
Test(cuda_forward, graphs_match_eager_deepseek_v2) { check_graphs("deepseek_v2"); }

/* Counters a and b (n) equal (exact), or apart by at most 2% of their sum
 * in total. */
static void counts_match(const char *what, const int64_t *a, const int64_t *b, size_t n, bool exact)
{
    int64_t diff = 0, sum = 0;
    for (size_t i = 0; i < n; i++) {
        diff += a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
        sum += a[i];
    }
    fprintf(stderr, "e2e: graphs + statistics: %s counters apart by %lld of %lld\n", what, (long long)diff,
            (long long)sum);
    if (exact) cr_expect_eq(diff, 0, "%s counts differ", what);
    else cr_expect(diff * 50 <= sum, "%s counts apart by %lld of %lld", what, (long long)diff, (long long)sum);
}

/* Step graphs with statistics on (the default of run/batch/bench/serve):
 * decode steps copy their routing asynchronously into pinned buffers, as
 * nodes of the recorded graph, and are recorded after the step; tokens and
 * the integer counters equal those of eager steps with statistics (bf16
 * models: to near-ties), the weight sums agree to rounding. */
static void check_graphs_stats(const char *name)
{
    struct side eager, graph;
    open_eager_and_graphs(&eager, &graph, name);
    struct moe_stats se_st, sg_st;
    cr_assert_eq(moe_stats_init(&se_st, &eager.m.cfg, NULL), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_stats_init(&sg_st, &graph.m.cfg, NULL), MOE_OK, "%s", moe_last_error());
    eager.r.fw.stats = &se_st;
    graph.r.fw.stats = &sg_st;
    const int V = eager.m.cfg.vocab;
    int32_t prompt[7] = {3, 14, 15, 9, 2, 6, 5};
    struct moe_seq se = {0}, sg = {0};
    float *le = malloc((size_t)V * sizeof(float)), *lg = malloc((size_t)V * sizeof(float));
    step_both(&eager, &graph, &se, &sg, prompt, 7, false, le, lg);
    for (int i = 0; i < 24; i++) {
        int32_t te = moe_argmax(le, V), tg = moe_argmax(lg, V);
        cr_expect_eq(tg, te, "%s step %d: graph token %d, eager %d", name, i, tg, te);
        step_both(&eager, &graph, &se, &sg, &te, 1, true, le, lg);
    }
    cr_expect(graph.r.fw.hs_buf != NULL, "decode steps took the asynchronous statistics path");
    const size_t LE = (size_t)se_st.Lm * se_st.E;
    cr_expect_eq(sg_st.steps, 25);
    cr_expect_eq(sg_st.tokens_decode, 24);
    /* fp32: the same ids, so the same counters; bf16: an id may differ at a
     * near-tie (see fp32_weights), a few of the 25 x Lm x K choices */
    const bool exact = fp32_weights(&eager);
    counts_match("prefill", se_st.prefill, sg_st.prefill, LE, exact);
    counts_match("decode", se_st.decode, sg_st.decode, LE, exact);
    counts_match("top-1", se_st.top1, sg_st.top1, LE, exact);
    counts_match("co-activation", se_st.coact, sg_st.coact, LE * se_st.E, exact);
    cr_expect(memcmp(se_st.ent_n, sg_st.ent_n, (size_t)se_st.Lm * sizeof(int64_t)) == 0);
    int64_t dec = 0;
    double worst = 0, apart = 0, total = 0;
    for (size_t i = 0; i < LE; i++) {
        dec += sg_st.decode[i];
        double d = fabs(sg_st.wsum[i] - se_st.wsum[i]);
        worst = fmax(worst, d / (1e-6 + fabs(se_st.wsum[i])));
        apart += d;
        total += fabs(se_st.wsum[i]);
    }
    cr_expect_eq(dec, (int64_t)24 * se_st.Lm * se_st.K, "every decode pair recorded");
    if (exact) cr_expect(worst <= 1e-4, "%s: routing weight sums differ by %.3g relative", name, worst);
    else cr_expect(apart <= 0.02 * total, "%s: routing weight sums apart by %.3g of %.3g", name, apart, total);
    fprintf(stderr, "e2e: %-10s graphs + statistics: weight sums %.3g relative (%.3g of %.3g in all)\n",
            name, worst, apart, total);
    moe_seq_free(&eager.r, &se);
    moe_seq_free(&graph.r, &sg);
    free(le), free(lg);
    side_close(&graph);
    side_close(&eager);
    moe_stats_free(&sg_st);
    moe_stats_free(&se_st);
}

Test(cuda_forward, graphs_with_stats_match_eager_qwen3_moe) { check_graphs_stats("qwen3_moe"); }
Test(cuda_forward, graphs_with_stats_match_eager_olmoe) { check_graphs_stats("olmoe"); }

/* Backend selection: runs everywhere.  Without a device "cuda" is a clear
 * error and "auto" is the CPU; with one, both are the CUDA backend. */
Test(cuda_backend, selection_follows_the_device)
{
    char why[256] = "";
    int n = moe_cuda_device_count(why, sizeof why);
    struct moe_backend be;
    enum moe_status s = moe_backend_init(&be, "cuda", NULL);
    if (n == 0) {
        cr_expect_eq(s, MOE_ERR_DEVICE, "--backend cuda without a device: %s", moe_last_error());
        cr_expect(strstr(moe_last_error(), "no CUDA device") != NULL, "%s", moe_last_error());
    } else {
        cr_assert_eq(s, MOE_OK, "%s", moe_last_error());
        cr_expect_str_eq(be.ops->name, "cuda");
        moe_backend_free(&be);
    }
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.n_threads = 1;
    cr_assert_eq(moe_backend_init(&be, "auto", &o), MOE_OK, "%s", moe_last_error());
    cr_expect_str_eq(be.ops->name, n == 0 ? "cpu" : "cuda");
    moe_backend_free(&be);
}

/* The CPU backend refuses the deferred model d; d and h are freed. */
static void cpu_refuses_and_free(struct moe_model *d, struct moe_model *h)
{
    struct moe_backend cpu;
    cr_assert_eq(moe_backend_cpu_init(&cpu, 1), MOE_OK);
    cr_expect_eq(cpu.ops->prepare_model(&cpu, d), MOE_ERR_INVALID_ARG);
    moe_backend_free(&cpu);
    moe_model_free(d);
    moe_model_free(h);
}

/* Runs everywhere: a deferred synthetic model (weights to be made by a
 * device backend) binds every tensor with the shapes of the host-made one,
 * marks norm weights as ones, and the CPU backend refuses it. */
Test(synth_deferred, binds_like_the_host_model_and_cpu_refuses_it)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK, "%s",
                 moe_last_error());
    struct moe_model h, d;
    cr_assert_eq(moe_model_synthetic(&h, &cfg, MOE_DTYPE_BF16, 3), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_model_synthetic_deferred(&d, &cfg, MOE_DTYPE_BF16, 3), MOE_OK, "%s",
                 moe_last_error());
    cr_expect(d.weights_deferred && !h.weights_deferred);
    cr_assert_eq(d.st.n_tensors, h.st.n_tensors);
    for (size_t i = 0; i < h.st.n_tensors; i++) {
        cr_expect_str_eq(d.st.tensors[i].name, h.st.tensors[i].name);
        cr_expect_eq(d.st.tensors[i].ndim, h.st.tensors[i].ndim);
        cr_expect(memcmp(d.st.tensors[i].shape, h.st.tensors[i].shape, sizeof h.st.tensors[i].shape) == 0);
    }
    struct moe_model_sizes a, b;
    moe_model_sizes(&h, &a);
    moe_model_sizes(&d, &b);
    cr_expect(memcmp(&a, &b, sizeof a) == 0, "sizes of the deferred model differ");
    cr_expect_eq(*(const unsigned char *)d.final_norm.data, 1, "norm weights are ones");
    cr_expect_eq(*(const unsigned char *)d.layers[0].wq.data, 0, "projections are random");
    cpu_refuses_and_free(&d, &h);
}

/* gpt-oss with MXFP4 experts binds deferred too (no host rewriting: the
 * experts stay MXFP4 placeholders for the device to fill, biases, sinks and
 * the router bias become F32 there); gpt-oss with float experts, and fp8
 * or MLA configurations, are refused with a message. */
Test(synth_deferred, gpt_oss_with_mxfp4_experts_binds)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, FIXTURE_DIR "/gpt_oss_mxfp4/config.json"), MOE_OK, "%s", moe_last_error());
    cr_assert(cfg.experts_mxfp4);
    struct moe_model h, d;
    cr_assert_eq(moe_model_synthetic(&h, &cfg, MOE_DTYPE_BF16, 5), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_model_synthetic_deferred(&d, &cfg, MOE_DTYPE_BF16, 5), MOE_OK, "%s", moe_last_error());
    struct moe_model_sizes a, b;
    moe_model_sizes(&h, &a);
    moe_model_sizes(&d, &b);
    cr_expect_eq(a.bytes_experts, b.bytes_experts, "expert bytes %lld vs %lld", (long long)a.bytes_experts,
                 (long long)b.bytes_experts);
    for (int l = 0; l < cfg.n_layers; l++) {
        const struct moe_layer_weights *w = &d.layers[l];
        cr_expect_eq(w->experts.dtype, MOE_DTYPE_MXFP4);
        cr_expect_eq(h.layers[l].experts.dtype, MOE_DTYPE_MXFP4);
        const struct moe_tensor *f32[] = {&w->sinks, &w->router_b, &w->experts.b_gate, &w->experts.b_up,
                                          &w->experts.b_down};
        for (size_t i = 0; i < sizeof f32 / sizeof *f32; i++) cr_expect_eq(f32[i]->dtype, MOE_DTYPE_F32);
        cr_expect_eq(w->experts.b_gate.shape[1], cfg.d_expert);
        cr_expect_eq(*(const unsigned char *)w->experts.gate[0], 0, "random, not ones");
    }
    cpu_refuses_and_free(&d, &h);
    const char *refused[] = {FIXTURE_DIR "/gpt_oss/config.json", FIXTURE_DIR "/deepseek_v3/config.json",
                             FIXTURE_DIR "/qwen3_moe_fp8/config.json"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        cr_assert_eq(moe_config_load(&cfg, refused[i]), MOE_OK, "%s", moe_last_error());
        cr_expect_eq(moe_model_synthetic_deferred(&d, &cfg, MOE_DTYPE_BF16, 5), MOE_ERR_UNSUPPORTED, "%s",
                     refused[i]);
        cr_expect(strstr(moe_last_error(), "made on the device") != NULL, "%s", moe_last_error());
    }
}
