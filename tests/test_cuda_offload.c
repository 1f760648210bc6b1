/* test_cuda_offload.c - expert offload (--gpu-experts C) end to end on the
 * CUDA backend against the CPU backend, with the fixtures and checks of
 * test_cuda_forward.c (cuda_forward.h): the fixture models with C slots,
 * long prefills on the grouped and tensor-core paths, misses computed on
 * the CPU (--gpu-experts-cpu-rows) and the warm start from statistics.
 * Each "e2e:" and "offload:" line is collected by tests/gpu/run.sh.
 * Without a device the suite skips (checked in the forked test process). */
#include "tests/cuda_forward.h"

TestSuite(cuda_forward, .init = tu_need_cuda_device);

/* ---- expert offload (moe_backend.gpu_experts) ----
 * C of a layer's 8 experts in device slots, the rest copied in from host
 * memory when routed to: the same numbers as the CPU (and as the resident
 * experts).  The fixtures' prompts (5 to 21 rows) take the device-driven
 * kernels, their prefill in several rounds (more than C experts a step);
 * a 40-row prefill of a bf16 or MXFP4 model takes the grouped GEMMs. */

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
static void check_long_prefill_tol(const char *name, bool bf16, int C, bool mma, double tol)
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
    double vs_cpu = 0, vs_res = 0;
    if (tol <= 0) tol = bf16 ? 2e-2 : 1e-4;
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

static void check_long_prefill(const char *name, bool bf16, int C, bool mma)
{
    check_long_prefill_tol(name, bf16, C, mma, 0);
}

Test(cuda_forward, offload_long_prefill_olmoe) { check_long_prefill("olmoe", true, 3, false); }
Test(cuda_forward, offload_long_prefill_gpt_oss_mxfp4) { check_long_prefill("gpt_oss_mxfp4", true, 2, false); }
Test(cuda_forward, offload_long_prefill_mixtral) { check_long_prefill("mixtral", false, 5, false); }
/* the tensor-core expert kernels, resident and offloaded (in rounds) */
Test(cuda_forward, mma_experts_long_prefill_olmoe) { check_long_prefill("olmoe", true, 0, true); }
Test(cuda_forward, mma_experts_long_prefill_gpt_oss_mxfp4) { check_long_prefill("gpt_oss_mxfp4", true, 0, true); }
Test(cuda_forward, offload_mma_long_prefill_olmoe) { check_long_prefill("olmoe", true, 3, true); }
Test(cuda_forward, offload_mma_long_prefill_gpt_oss_mxfp4) { check_long_prefill("gpt_oss_mxfp4", true, 2, true); }

/* Act-order four-bit experts (GPTQ desc_act) offloaded, 3 of 6 in slots:
 * every expert's column orders stay resident (indexed by expert, not by
 * slot), so the fixture's prompts on the decode kernels are the CPU
 * reference's (fp32 tolerance), and a 40-row prefill on the widened
 * grouped GEMMs in rounds is the resident experts' (bf16 activations
 * against the CPU: 5e-2, as resident). */
Test(cuda_forward, offload_gptq_actorder_matches_cpu)
{
    check_fixture_run_on("cpu-ref", "qwen3_moe_gptq_actorder", false, 0, 3, 3, 32);
}
/* the host emulation's CI selection: one prompt, 8 tokens */
Test(cuda_forward, offload_gptq_actorder_short_matches_cpu)
{
    check_fixture_run_on("cpu-ref", "qwen3_moe_gptq_actorder", false, 0, 3, 1, 8);
}
/* ... but not with misses computed on the CPU (its kernels read the
 * columns in stored order): refused at load, naming both */
Test(cuda_forward, offload_gptq_actorder_cpu_rows_refused)
{
    struct side s;
    cr_assert_eq(moe_model_load(&s.m, FIXTURE_DIR "/qwen3_moe_gptq_actorder"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(tu_backend_init_with(&s.be, "cuda", MOE_QUANT_NONE, 3, 2), MOE_OK, "%s", moe_last_error());
    struct moe_runner_opts o = {.max_tokens = 8, .max_seqs = 1, .max_logits = 8, .block_size = 4, .n_blocks = 16};
    cr_assert_eq(moe_runner_init(&s.r, &s.m, &s.be, &o), MOE_ERR_UNSUPPORTED);
    cr_expect(strstr(moe_last_error(), "--gpu-experts-cpu-rows with act-order"), "%s", moe_last_error());
    moe_backend_free(&s.be);
    moe_model_free(&s.m);
}
Test(cuda_forward, offload_long_prefill_gptq_actorder)
{
    check_long_prefill_tol("qwen3_moe_gptq_actorder", true, 3, false, 5e-2);
}

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
