/* test_cli.c - the moerun binary end to end: greedy ids equal transformers'
 * generate() on a fixture, inspect's numbers, synth round trip, and one
 * clear error line (non-zero exit) for each kind of bad input.  The option
 * table and the --spec options are tested in test_cli_opts.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include <jansson.h>

#include "runtime/cpu/gemm_fast.h"
#include "runtime/model/safetensors.h"
#include "tests/testutil.h"

Test(cli, run_greedy_matches_transformers_generate)
{
    struct moe_safetensors ref = {0};
    cr_assert_eq(moe_safetensors_open_file(&ref, FIXTURE_DIR "/qwen2_moe/reference.safetensors"), MOE_OK);
    const struct moe_st_tensor *pt = moe_safetensors_find(&ref, "prompt.1");
    const struct moe_st_tensor *gt = moe_safetensors_find(&ref, "greedy.1");
    char cmd[4096], ids[1024] = "", want[1024] = "", out[4096];
    for (int i = 0; i < pt->shape[0]; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), i ? ",%d" : "%d", ((int32_t *)pt->data)[i]);
    for (int i = 0; i < 32; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), i ? ",%d" : "%d", ((int32_t *)gt->data)[i]);
    snprintf(cmd, sizeof cmd, "%s run %s/qwen2_moe --prompt-ids %s -n 32 --chunk 5 --kv-block 4 "
             "--backend cpu 2>/dev/null", MOERUN_BINARY, FIXTURE_DIR, ids);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, strcat(want, "\n"));
    moe_safetensors_close(&ref);
}

Test(cli, inspect_reports_structure_and_sizes)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s inspect %s/qwen2_moe", MOERUN_BINARY, FIXTURE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "Qwen2MoeForCausalLM"), "%s", out);
    cr_assert(strstr(out, "3 (2 MoE, 1 dense)"), "%s", out);
    cr_assert(strstr(out, "8 per MoE layer, top-2, width 32"), "%s", out);
    cr_assert(strstr(out, "shared expert of width 48"), "%s", out);
    /* KV per token: 2 * 3 layers * 2 heads * 16 * 4 bytes = 768 B */
    cr_assert(strstr(out, "768 B per token in fp32"), "%s", out);
}

/* --quantize q4 on the demo model (4 layers, D 128, 16 experts of 64):
 * the experts' 4 x 16 x 3 x 64 x 128 weights and the attention's 4 x
 * (128 + 32 + 32 + 128) x 128 at Q4_1 (20 bytes per 32: rows of 64 and
 * 128 are not Q4_K's 256), 1,085,440 B = 1.04 MiB; the tied embedding and
 * the norms stay bf16 (128 KiB + 2.5 KiB); the LM head, tied to the
 * embedding, becomes a Q8_0 copy of its own (512 x 128 x 36 / 32 B = 72
 * KiB); the routers become bf16 panels (4 x 16 x 128 x 2 B = 16 KiB). */
Test(cli, quantize_prints_the_prepared_formats)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s run %s/models/demo-moe --prompt-ids 5,6,7 -n 1 --quantize q4 --backend cpu "
             "2>&1 >/dev/null", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "moerun: weights as prepared: Q4_1 1.04 MiB (82.9%) BF16 130.50 KiB (10.2%) "
                          "Q8_0 72.00 KiB (5.6%) BF16_PANEL 16.00 KiB (1.3%)\n"), "%s", out);
}

static void check_synth_round_trip(const char *config)
{
    char dir[] = "/tmp/moerun-synth-XXXXXX", cmd[2048], out[8192];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "%s synth %s/%s %s/m --dtype bf16 --seed 3 2>&1",
             MOERUN_BINARY, MOERUN_SOURCE_DIR, config, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    /* the written model and the in-memory synthetic one generate the same ids */
    char a[4096], b[4096];
    snprintf(cmd, sizeof cmd, "%s run %s/m --prompt-ids 5,6,7,8 -n 8 --backend cpu 2>/dev/null",
             MOERUN_BINARY, dir);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
    snprintf(cmd, sizeof cmd, "%s run --synthetic %s/%s --dtype bf16 --synthetic-seed 3 "
             "--prompt-ids 5,6,7,8 -n 8 --backend cpu 2>/dev/null", MOERUN_BINARY, MOERUN_SOURCE_DIR,
             config);
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0);
    cr_assert_str_eq(a, b, "%s", config);
    cr_assert(strlen(a) > 8);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(cli, synth_writes_a_loadable_checkpoint)
{
    check_synth_round_trip("configs/tiny-moe.json");
    /* GLM-4.5: an F32 router bias among bf16 weights, shared_experts names */
    check_synth_round_trip("tests/fixtures/glm4_moe/config.json");
    /* Granite: fused experts and shared MLP, the multipliers */
    check_synth_round_trip("tests/fixtures/granitemoeshared/config.json");
    /* gpt-oss: sinks, biases, transposed interleaved experts */
    check_synth_round_trip("tests/fixtures/gpt_oss/config.json");
    check_synth_round_trip("tests/fixtures/gpt_oss_mxfp4/config.json"); /* MXFP4 experts */
    /* DeepSeek: multi-head latent attention, with and without the q LoRA */
    check_synth_round_trip("tests/fixtures/deepseek_v2/config.json");
    check_synth_round_trip("tests/fixtures/deepseek_v3/config.json");
    /* MiniMax-M2: the choice bias a buffer of the MoE block */
    check_synth_round_trip("tests/fixtures/minimax_m2/config.json");
    /* Llama-4: feed_forward names, experts as transformers keeps them */
    check_synth_round_trip("tests/fixtures/llama4/config.json");
    /* Qwen3-Next: linear_attn.* of the Gated DeltaNet layers, q_proj with gates */
    check_synth_round_trip("tests/fixtures/qwen3_next/config.json");
    /* Qwen3.5-MoE: its four linear-attention projections apart */
    check_synth_round_trip("tests/fixtures/qwen3_5_moe/config.json");
    /* DeepSeek-V3.2: the indexer's tensors */
    check_synth_round_trip("tests/fixtures/deepseek_v32/config.json");
    /* GLM-MoE-DSA: no indexer on the shared layers */
    check_synth_round_trip("tests/fixtures/glm_moe_dsa/config.json");
}

/* --layout per-expert writes legacy names (Mixtral: block_sparse_moe w1/w3/w2;
 * others: mlp.experts.e.gate_proj) that moerun loads too. */
Test(cli, synth_per_expert_layout_loads)
{
    const char *cfgs[] = {"configs/tiny-moe.json", "tests/fixtures/mixtral/config.json",
                          "tests/fixtures/glm4_moe/config.json"};
    const char *names[] = {"mlp.experts.3.gate_proj.weight", "block_sparse_moe.experts.1.w3.weight",
                           "mlp.gate.e_score_correction_bias"};
    for (int i = 0; i < 3; i++) {
        char dir[] = "/tmp/moerun-synth-XXXXXX", cmd[2048], out[8192];
        cr_assert(mkdtemp(dir));
        snprintf(cmd, sizeof cmd, "%s synth %s/%s %s/m --layout per-expert 2>&1", MOERUN_BINARY,
                 MOERUN_SOURCE_DIR, cfgs[i], dir);
        cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
        snprintf(cmd, sizeof cmd, "grep -c '%s' %s/m/model.safetensors", names[i], dir);
        cr_expect_eq(tu_run(cmd, out, sizeof out), 0, "%s: no tensor %s", cfgs[i], names[i]);
        snprintf(cmd, sizeof cmd, "%s run %s/m --prompt-ids 5,6,7 -n 4 2>/dev/null", MOERUN_BINARY, dir);
        cr_expect_eq(tu_run(cmd, out, sizeof out), 0, "%s: per-expert checkpoint does not run", cfgs[i]);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
    }
}

Test(cli, bad_input_gives_one_clear_line)
{
    char args[1024];
    snprintf(args, sizeof args, "run %s/llama --prompt-ids 1,x,3", FIXTURE_DIR);
    tu_expect_one_line_error(args, "item 2");
    snprintf(args, sizeof args, "run %s/llama --prompt-ids 1,99999", FIXTURE_DIR);
    tu_expect_one_line_error(args, "outside the vocabulary");
    snprintf(args, sizeof args, "run %s/llama --prompt-ids 1,2 -n 600", FIXTURE_DIR);
    tu_expect_one_line_error(args, "context of 512");
    tu_expect_one_line_error("run /nonexistent/model --prompt-ids 1", "/nonexistent/model");
    tu_expect_one_line_error("inspect --synthetic /nonexistent.json", "nonexistent.json");
    tu_expect_one_line_error("frobnicate", "unknown command");
    snprintf(args, sizeof args, "run %s/llama --prompt-ids 1 --backend tpu", FIXTURE_DIR);
    tu_expect_one_line_error(args, "moerun run: --backend 'tpu' (use auto, cpu, cpu-ref or cuda)");
    snprintf(args, sizeof args, "bench --synthetic %s/configs/tiny-moe.json --backend cpu --expert-kernels 1",
             MOERUN_SOURCE_DIR);
    tu_expect_one_line_error(args, "need the CUDA backend");
    snprintf(args, sizeof args, "bench --synthetic %s/configs/tiny-moe.json --expert-kernels 1,0",
             MOERUN_SOURCE_DIR);
    tu_expect_one_line_error(args, "--expert-kernels: values must be positive");
    snprintf(args, sizeof args, "bench --synthetic %s/configs/tiny-moe.json --backend cpu --gpu-experts 2",
             MOERUN_SOURCE_DIR);
    tu_expect_one_line_error(args, "need the CUDA backend");
    snprintf(args, sizeof args, "run %s/mixtral --prompt-ids 1 --gpu-experts 0", FIXTURE_DIR);
    tu_expect_one_line_error(args, "moerun run: --gpu-experts '0' (an integer from 1 to 1048576)");
}

/* --gpu-experts on a CPU backend: said once, the run unchanged. */
Test(cli, gpu_experts_on_the_cpu_is_a_notice)
{
    char cmd[1024], a[4096], b[4096];
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3 -n 6 --backend cpu 2>&1", MOERUN_BINARY,
             FIXTURE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0, "%s", a);
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3 -n 6 --backend cpu --gpu-experts 2 2>&1",
             MOERUN_BINARY, FIXTURE_DIR);
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0, "%s", b);
    const char *note = strstr(b, "--gpu-experts applies to the CUDA backend");
    cr_assert(note, "%s", b);
    const char *rest = strchr(note, '\n');
    cr_assert(rest);
    /* the generated text is the same (timings differ: compare the first line) */
    cr_assert_eq(strncmp(rest + 1, a, strcspn(a, "\n")), 0, "with:\n%s\nwithout:\n%s", b, a);
}

/* The offload policy and warm start options: bad values and unreadable
 * statistics are errors that name the option (on any backend: they are
 * checked before the model loads). */
Test(cli, gpu_experts_policy_and_warm_start_errors)
{
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3 -n 2 --backend cpu --gpu-experts 2 "
             "--gpu-experts-policy mru 2>&1", MOERUN_BINARY, FIXTURE_DIR);
    cr_expect_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "--gpu-experts-policy 'mru' (use lru or lfu)"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3 -n 2 --backend cpu --gpu-experts 2 "
             "--gpu-experts-warm %s/mixtral/config.json 2>&1", MOERUN_BINARY, FIXTURE_DIR, FIXTURE_DIR);
    cr_expect_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "--gpu-experts-warm: ") && strstr(out, "not moerun statistics"), "%s", out);
    /* statistics the run itself wrote are taken (the CPU backend then says
     * it keeps every expert) */
    char stats[] = "/tmp/moerun_warm_XXXXXX";
    const int fd = mkstemp(stats);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3 -n 2 --backend cpu --stats-out %s 2>&1",
             MOERUN_BINARY, FIXTURE_DIR, stats);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3 -n 2 --backend cpu --gpu-experts 2 "
             "--gpu-experts-policy lfu --gpu-experts-warm %s 2>&1", MOERUN_BINARY, FIXTURE_DIR, stats);
    cr_expect_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "--gpu-experts applies to the CUDA backend"), "%s", out);
    unlink(stats);
    /* --gpu-experts-cpu-rows: without an offload, or negative, refused by name */
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3 -n 2 --backend cpu --gpu-experts-cpu-rows 2 "
             "2>&1", MOERUN_BINARY, FIXTURE_DIR);
    cr_expect_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "--gpu-experts-cpu-rows 2 needs --gpu-experts N"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s bench --synthetic %s/../../configs/tiny-moe.json --backend cpu --prefill 4 "
             "--decode 1 --gpu-experts-cpu-rows 2 2>&1", MOERUN_BINARY, FIXTURE_DIR);
    cr_expect_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "--gpu-experts-cpu-rows 2 needs --gpu-experts N"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s run %s/mixtral --prompt-ids 1,2,3 -n 2 --backend cpu --gpu-experts 2 "
             "--gpu-experts-cpu-rows -1 2>&1", MOERUN_BINARY, FIXTURE_DIR);
    cr_expect_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "-1"), "%s", out);
}

Test(cli, help_on_every_command)
{
    const char *cmds[] = {"inspect", "run", "synth"};
    for (size_t i = 0; i < 3; i++) {
        char cmd[1024], out[16384];
        snprintf(cmd, sizeof cmd, "%s %s --help", MOERUN_BINARY, cmds[i]);
        cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s --help", cmds[i]);
        cr_assert(strstr(out, "usage: moerun"), "%s", out);
    }
}

/* Published sizes: Mixtral-8x7B 46.7B parameters, 12.9B active; Qwen3-30B-A3B
 * 30.5B, 3.3B active; MiniMax-M2 230B, 10B active (11.03B with the 1.23B
 * of embedding and LM head); Llama-4 Scout below; described from the
 * configuration alone. */
Test(cli, inspect_synthetic_shapes_match_published_sizes)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s inspect --synthetic %s/configs/mixtral-8x7b.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "46.70B total, 12.88B active"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s inspect --synthetic %s/configs/qwen3-30b-a3b.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "30.53B total, 3.35B active"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s inspect --synthetic %s/configs/minimax-m2.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "228.69B total, 11.03B active"), "%s", out);
    cr_assert(strstr(out, "over 64 of 128 values per head"), "rotary_dim 64: %s", out);
    /* Llama-4 Scout: 109B, 17B active (the text model: 107.77B, the rest
     * is the vision encoder) */
    snprintf(cmd, sizeof cmd, "%s inspect --synthetic %s/configs/llama4-scout.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "107.77B total, 17.17B active"), "%s", out);
    cr_assert(strstr(out, "chunks of 8192 in 36 layers; 12 layers without RoPE"), "%s", out);
    /* Qwen3-Next-80B-A3B, by hand: embeddings and head 2 x 151936 x 2048;
     * 12 attention layers of q (with gates) 2 x 4096 x 2048, k and v 512 x
     * 2048, o 2048 x 4096, q/k norms 512; 36 linear layers of in_proj_qkvz
     * 12288 x 2048, in_proj_ba 64 x 2048, out_proj 2048 x 4096, conv 8192 x
     * 4, A_log and dt_bias 64, norm 128; 48 MoE layers of 512 experts of 3 x
     * 512 x 2048, router 512 x 2048, shared expert 3 x 512 x 2048 and gate
     * 2048; norms 97 x 2048: 79,674,397,440.  Per sequence a state of 36 x
     * (8192 x 3 + 32 x 128 x 128) F32 = 75.375 MiB; K/V of 12 layers x 2 x 2
     * heads x 256 bf16 = 24 KiB per token. */
    snprintf(cmd, sizeof cmd, "%s inspect --synthetic %s/configs/qwen3-next-80b-a3b.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "79.67B total"), "%s", out);
    cr_assert(strstr(out, "36 of 48 layers Gated DeltaNet"), "%s", out);
    cr_assert(strstr(out, "24.00 KiB in bf16"), "%s", out);
    cr_assert(strstr(out, "75.38 MiB per sequence"), "%s", out);
    /* Qwen3.5-35B-A3B (transformers' defaults for Qwen3_5MoeTextConfig):
     * 30 linear layers, so 30 x 2,195,456 bytes of state = 62.8125 MiB,
     * and 10 attention layers: 20 KiB of bf16 K/V per token */
    snprintf(cmd, sizeof cmd, "%s inspect --synthetic %s/configs/qwen3.5-35b-a3b.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "30 of 40 layers Gated DeltaNet"), "%s", out);
    cr_assert(strstr(out, "20.00 KiB in bf16"), "%s", out);
    cr_assert(strstr(out, "62.81 MiB per sequence"), "%s", out);
}

/* GLM-5 (configs/glm-5.json: GlmMoeDsaConfig's defaults), by hand:
 * embeddings and head 2 x 154880 x 6144; 78 layers of latent attention (q_a
 * 2048 x 6144 and its norm 2048, q_b 64 x 256 x 2048, kv_a 576 x 6144 and
 * its norm 512, kv_b 64 x 448 x 512, o 6144 x 16384), an indexer on each
 * (wq_b 4096 x 2048, wk 128 x 6144, weights_proj 32 x 6144, k_norm 2 x 128)
 * and 2 norms of 6144; 3 dense layers of 3 x 12288 x 6144; 75 MoE layers of
 * 256 experts of 3 x 2048 x 6144, a shared expert of 3 x 2048 x 6144 and a
 * router 256 x 6144 (and its 256 biases); the final norm 6144:
 * 743,911,218,432 (transformers builds 743,911,199,232 parameters and the
 * 75 x 256 biases as buffers).  Per token 78 latent rows of 576 bf16 (87.75
 * KiB) and 78 indexer keys of 128 F32 (39 KiB): 126.75 KiB.  With
 * index_topk_freq 4 (offset 2), layers 0, 1, 5, 9, ..., 77 run an
 * indexer (21) and 57 share: 57 x 9,371,904 indexer parameters fewer
 * (743.38B), and 21 x 512 B of indexer keys: 98.25 KiB per token, 393 MiB
 * per sequence of 4096. */
Test(cli, inspect_and_plan_glm5)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s inspect --synthetic %s/configs/glm-5.json", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "743.91B total"), "%s", out);
    cr_assert(strstr(out, "78 (75 MoE, 3 dense)"), "%s", out);
    cr_assert(strstr(out, "indexer of 32 heads x 128; its keys take 39.00 KiB per token"), "%s", out);
    cr_assert(strstr(out, "126.75 KiB in bf16"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/glm-5.json --ctx 4096 --batch 1", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "126.75 KiB per token (BF16), 507.00 MiB per sequence of 4096 tokens"), "%s", out);
    /* the same with shared layers: only the full ones keep keys */
    char dir[] = "/tmp/moerun-glm5-XXXXXX", path[256];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/configs/glm-5.json", MOERUN_SOURCE_DIR);
    json_t *cfg = json_load_file(path, 0, NULL);
    cr_assert(cfg, "%s", path);
    cr_assert_eq(json_object_set_new(cfg, "index_topk_freq", json_integer(4)), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    snprintf(cmd, sizeof cmd, "%s inspect --synthetic %s", MOERUN_BINARY, path);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "743.38B total"), "%s", out);
    cr_assert(strstr(out, "its keys take 10.50 KiB per token"), "%s", out);
    cr_assert(strstr(out, "21 of 78 layers run an indexer"), "%s", out);
    cr_assert(strstr(out, "98.25 KiB in bf16"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s --ctx 4096 --batch 1", MOERUN_BINARY, path);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "98.25 KiB per token (BF16), 393.00 MiB per sequence of 4096 tokens"), "%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
}

/* plan: Mixtral-8x7B bf16 on an H200 (141 GB): 87 GiB of weights, 128 KiB of
 * KV per token; batch 1 touches 2 of 8 experts per layer, batch 64 all 8. */
Test(cli, plan_mixtral_on_h200)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --ctx 4096 --batch 1",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "86.99 GiB in total"), "%s", out);
    cr_assert(strstr(out, "128.00 KiB per token (BF16), 512.00 MiB per sequence of 4096 tokens"), "%s", out);
    cr_assert(strstr(out, "2.0 of 8 experts per MoE layer touched"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --batch 64 --device a100",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "8.0 of 8 experts"), "%s", out);
    cr_assert(strstr(out, "do not fit"), "87 GiB do not fit in 90%% of 80 GB: %s", out);
}

/* plan --gpu-experts: Mixtral's experts are 84 GiB (32 layers x 8 x 3 x
 * 4096 x 14336 bf16), all pinned in host memory; keeping 4 of 8 on the
 * device puts 42 GiB fewer there, and the 87 GiB model then fits an A100's
 * 80 GB.  Batch 1
 * touches 2 experts per layer; with the hit rate 0.5 one per layer (32 x
 * 336 MiB = 11.27 GB) crosses PCIe at 25 GB/s: 451 ms. */
Test(cli, plan_expert_offload)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --device a100 --gpu-experts 4",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "4 of 8 experts per MoE layer on the device: 44.99 GiB of weights there, every "
                          "expert (84.00 GiB) in pinned host memory; hit rate 0.500"), "%s", out);
    cr_assert(!strstr(out, "do not fit"), "%s", out);
    cr_assert(strstr(out, "+ 450.9"), "32 x 352321536 B / 25 GB/s = 450.97 ms: %s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --gpu-experts 4 --hit-rate 1.5",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    /* the same misses read by the CPU at 40 GB/s: 11.27 GB / 40 GB/s =
     * 281.86 ms, overlapped with the device's part (about 13 ms): the step */
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --device a100 --gpu-experts 4 "
             "--gpu-experts-cpu-rows 1 --host-bw 40", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "281.857 ms per step (memory-bound; misses read by the CPU at 40 GB/s: 281.857 ms, "
                          "overlapped)"), "%s", out);
    /* batch 8: 9.5 rows per touched expert, more than 1: copied as before */
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --device a100 --gpu-experts 4 "
             "--gpu-experts-cpu-rows 1 --batch 8", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "copying experts in at 25 GB/s") && !strstr(out, "read by the CPU"), "%s", out);
}

/* plan --ep 4: Mixtral-8x7B's 84 GiB of experts over 4 ranks, 21 GiB each
 * beside the 2.99 GiB replicated less 3/4 of the 250 MiB LM head and 3/4
 * of the 250 MiB embedding (their vocabulary rows split): 2.9907 + 21 -
 * 0.3662 = 23.62 GiB a rank.  Decode at batch 1 gathers 2 rows of 4096
 * fp32 per MoE layer; a rank receives 3/4 of them in 32 layers: 32 x 0.75
 * x 32768 B = 768 KiB, in 32 x (3 x 10 us + 0.75 x 32768 B / 100 GB/s) =
 * 0.968 ms; the embedding's all-reduce of one row of 4096 fp32, 2 x (3 x
 * 10 us + 0.75 x 16384 B / 100 GB/s) = 0.060 ms, 24 KiB; then rank 0
 * gathers 3/4 of the row's 32000 logits, 96000 B in 10 us + 0.96 us:
 * 885.75 KiB in 1.039 ms; a 512-token chunk 31 x 0.75 x 512 x 2 x 4096 x 4
 * B = 372 MiB, the last layer's for its one logit row 0.75 x 2 x 4096 x 4
 * B = 24 KiB (its FFN runs for that row alone), the embedding's 2 x 0.75
 * x 8 MiB = 12 MiB and one logits row (93.75 KiB): 384.11 MiB. */
Test(cli, plan_expert_parallel)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --ep 4 --net 100 --net-latency 10",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "per rank   23.62 GiB of weights (experts 21.00 GiB of 84.00 GiB)"), "%s", out);
    cr_assert(strstr(out, "+ 1.039 ms all-gathering 885.75 KiB a rank receives"), "%s", out);
    cr_assert(strstr(out, "all-gathering 384.11 MiB;"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --ep 3 2>&1", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "8 experts per layer do not split evenly over 3 ranks"), "%s", out);
}

/* plan --ep 4 --dp-attention: the same ranks, each sequence's attention on
 * one: 4 x 189 = 756 sequences fit (each rank holds its own sequences'
 * KV); decode at batch 1 adds to the above one all-gather of the row's
 * 4096 fp32 per attention layer, 32 x (3 x 10 us + 0.75 x 16384 B / 100
 * GB/s) = 0.964 ms and 32 x 0.75 x 16384 B = 384 KiB: 2.003 ms, 1269.75
 * KiB = 1.24 MiB; a chunk of 512 rows 32 x 0.75 x 8 MiB = 192 MiB more,
 * 576.11 MiB.  Refused with --tp and without --ep. */
Test(cli, plan_data_parallel_attention)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --ep 4 --net 100 --net-latency 10 "
             "--dp-attention", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "attention data-parallel"), "%s", out);
    cr_assert(strstr(out, "756 sequences of 4096 tokens fit"), "%s", out);
    cr_assert(strstr(out, "+ 2.003 ms all-gathering 1.24 MiB a rank receives"), "%s", out);
    cr_assert(strstr(out, "all-gathering 576.11 MiB;"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --ep 2 --tp 2 --dp-attention 2>&1",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "--dp-attention with --tp 2: choose one"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --dp-attention 2>&1", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "give the ranks with --ep N"), "%s", out);
}

/* plan --ep 4 --dp-attention --device cpu: the all-to-all form the CPU
 * backend runs.  Decode at batch 1: the one row stays on its rank, which
 * receives its 2 pairs' outputs from the ranks of 3 of the 4 (on
 * average 2 x 3/4 = 1.5 of 16384 B) and the other 3 ranks' count
 * matrices (3 x 2 x 4 int32 = 96 B) in each of 32 MoE layers: 32 x
 * (24576 + 96) = 789504 B; the embedding's all-reduce 24576 B and rank 0's
 * logits 96000 B as above: 910080 B = 888.75 KiB.  A layer takes the
 * count matrices' all-gather (30 us + 96 B at 100 GB/s) and three
 * all-to-alls of 30 us each, the busiest receiver's bytes (7607 B of
 * rows: a row reaches a rank with 1 - 6/8 x 5/7 = 0.4643; 4 B of pairs;
 * 24576 B of outputs) at 100 GB/s: 120.32 us, x 32 = 3.850 ms; the
 * logit rows 30 us, the embedding 60.25 us and the logits 10.96 us more:
 * 3.952 ms. */
Test(cli, plan_data_parallel_attention_cpu)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --ep 4 --net 100 --net-latency 10 "
             "--dp-attention --device cpu", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "all-to-all form, the CPU backend's"), "%s", out);
    cr_assert(strstr(out, "+ 3.952 ms exchanging 888.75 KiB a rank receives"), "%s", out);
    cr_assert(strstr(out, "a row reaches another rank with probability 0.4643"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --ep 4 --dp-attention --device h100",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "gathering form, the CUDA backend's") && !strstr(out, "all-to-all"), "%s", out);
}

/* plan --ep 2 --tp 2: 4 ranks, the experts in 2 shards (42 GiB a rank),
 * each rank 1/2 of the 2.50 GiB of attention and 1/4 of the LM head and of
 * the embedding: 2.9907 + 42 - 1.25 - 0.3662 = 43.37 GiB.  Decode at batch
 * 1 adds to the expert rows' all-gathers over the 4 ranks, the embedding's
 * all-reduce and the logits' gather (885.75 KiB in 1.039 ms, as above) one
 * group sum per attention layer: a reduce-scatter and an all-gather of
 * 4096 fp32, half of each received, 32 x 2 x (10 us + 0.5 x 16384 B / 100
 * GB/s) = 0.645 ms, 512 KiB: 1397.75 KiB = 1.36 MiB in 1.684 ms.
 * A hybrid predicted; refusals: heads that do not divide. */
Test(cli, plan_tensor_parallel)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --ep 2 --tp 2 --net 100 "
             "--net-latency 10", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "4 ranks in groups of 2"), "%s", out);
    cr_assert(strstr(out, "per rank   43.37 GiB of weights (experts 42.00 GiB of 84.00 GiB)"), "%s", out);
    cr_assert(strstr(out, "+ 1.684 ms all-gathering 1.36 MiB a rank receives (0.645 ms of it in the groups)"),
              "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --tp 3 2>&1", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "8 experts per layer do not split evenly over 3"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/mixtral-8x7b.json --ep 1 --tp 3 2>&1", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "32 query and 8 key/value heads do not split evenly over 3 ranks"), "%s", out);
    /* Qwen3-Next: 16 q/k heads in its linear layers, 2 key/value heads in
     * its attention layers, replicated over 4 ranks */
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/qwen3-next-80b-a3b.json --tp 4 2>&1", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "4 ranks in groups of 4") && strstr(out, "its key/value heads' KV"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/qwen3-next-80b-a3b.json --tp 32 2>&1",
             MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_neq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "linear-attention layers' 16 q/k and 32 value heads do not split evenly"), "%s", out);
}

/* bench --serve: every request completes and the JSON carries the metrics. */
Test(cli, bench_serve_reports_latencies)
{
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd, "%s bench --synthetic %s/configs/tiny-moe.json --backend cpu --serve "
             "--requests 12 --input-len 24 --output-len 6 --range-ratio 0.5 --kv-budget 4MiB --json "
             "--no-stats", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j, "%s", out);
    json_t *s = json_object_get(j, "serve");
    cr_assert_eq(json_integer_value(json_object_get(s, "requests")), 12);
    cr_assert(json_real_value(json_object_get(s, "output_tokens_per_s")) > 0);
    for (int k = 0; k < 3; k++) {
        json_t *m = json_object_get(s, k == 0 ? "ttft" : k == 1 ? "tpot" : "itl");
        double mean = json_real_value(json_object_get(m, "mean_ms")),
               med = json_real_value(json_object_get(m, "median_ms")),
               p99 = json_real_value(json_object_get(m, "p99_ms"));
        cr_assert(mean > 0 && med > 0 && p99 >= med, "%s", out);
    }
    json_decref(j);
}

/* moerun chat with a reasoning model's template (it opens a think block, as
 * DeepSeek-R1's does): the thinking goes to stderr, not to stdout (the
 * answer), and --hide-reasoning drops it. */
Test(cli, chat_shows_reasoning_apart)
{
    char dir[] = "/tmp/moerun-chat-XXXXXX", cmd[2048], out[8192], err[8192];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "for f in config.json model.safetensors tokenizer.json tokenizer_config.json "
             "generation_config.json; do ln -s %s/models/demo-moe/$f %s/$f; done; printf '%%s' "
             "'{%% for m in messages %%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%% endfor %%}"
             "{%% if add_generation_prompt %%}<|im_start|>assistant\n<think>\n{%% endif %%}' > %s/chat_template.jinja",
             MOERUN_SOURCE_DIR, dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "echo 'the river garden' | %s chat %s -n 12 --temp 0 --backend cpu 2>%s/err",
             MOERUN_BINARY, dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "grep -v 'moerun' %s/err", dir);
    tu_run(cmd, err, sizeof err);
    cr_expect_str_eq(out, "\n", "the answer is empty: everything was thinking");
    cr_expect(strlen(err) > 4, "the thinking is on stderr: '%s'", err);
    snprintf(cmd, sizeof cmd, "echo 'the river garden' | %s chat %s -n 12 --temp 0 --backend cpu "
             "--hide-reasoning 2>&1 | grep -v moerun", MOERUN_BINARY, dir);
    tu_run(cmd, out, sizeof out);
    cr_expect_str_eq(out, "\n", "--hide-reasoning shows nothing of it");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
}

/* moerun batch with chat lines: the chat template renders the messages (the
 * same tokens and greedy text as the completions line of the rendered
 * text), the result is a chat.completion; bad lines get their error. */
Test(cli, batch_chat_lines)
{
    char dir[] = "/tmp/moerun-bchat-XXXXXX", cmd[2048], out[8192];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "%s/in.jsonl", dir);
    FILE *f = fopen(cmd, "w");
    cr_assert(f);
    fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"the river garden\"}], \"max_tokens\": 8, "
          "\"temperature\": 0}\n"
          "{\"prompt\": \"<|im_start|>user\\nthe river garden<|im_end|>\\n<|im_start|>assistant\\n\", "
          "\"max_tokens\": 8, \"temperature\": 0}\n"
          "{\"messages\": []}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s batch %s/models/demo-moe %s/in.jsonl -o %s/out.jsonl --backend cpu 2>/dev/null",
             MOERUN_BINARY, MOERUN_SOURCE_DIR, dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s/out.jsonl", dir);
    f = fopen(cmd, "r");
    cr_assert(f);
    json_t *line[3];
    for (int i = 0; i < 3; i++) {
        cr_assert(fgets(out, sizeof out, f), "line %d", i);
        line[i] = json_loads(out, 0, NULL);
        cr_assert(line[i], "line %d: %s", i, out);
    }
    fclose(f);
    json_t *chat = json_array_get(json_object_get(line[0], "choices"), 0);
    json_t *comp = json_array_get(json_object_get(line[1], "choices"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(line[0], "object")), "chat.completion");
    cr_expect(json_equal(json_object_get(json_object_get(line[0], "usage"), "prompt_tokens"),
                         json_object_get(json_object_get(line[1], "usage"), "prompt_tokens")));
    cr_expect(json_equal(json_object_get(chat, "token_ids"), json_object_get(comp, "token_ids")));
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(chat, "message"), "content")),
                     json_string_value(json_object_get(comp, "text")));
    cr_expect(strstr(json_string_value(json_object_get(json_object_get(line[2], "error"), "message")),
                     "messages"));
    for (int i = 0; i < 3; i++) json_decref(line[i]);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
}

/* The statistics record one expert's bytes as stored, which --cache
 * what-ifs move per miss: MXFP4 experts (gpt-oss) at 17 bytes per 32
 * weights, where a bytes-per-weight count cannot say it. */
Test(cli, stats_record_expert_bytes_of_block_formats)
{
    char dir[] = "/tmp/moerun-eb-XXXXXX", cmd[2048], out[4096];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "%s run %s/gpt_oss_mxfp4 --prompt-ids 5,6,7 -n 2 --backend cpu --stats-out "
             "%s/s.json 2>/dev/null", MOERUN_BINARY, FIXTURE_DIR, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s/s.json", dir);
    json_t *j = json_load_file(cmd, 0, NULL);
    cr_assert(j);
    json_t *m = json_object_get(j, "model");
    /* D = 64, F = 64: (2F rows of D + D rows of F) x 17 bytes per 32 weights */
    cr_expect_eq(json_integer_value(json_object_get(m, "expert_bytes")), (2 * 64 + 64) * 2 * 17);
    cr_expect_eq(json_integer_value(json_object_get(m, "weight_bytes")), 0);
    json_decref(j);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
}

/* The documented MOERUN_* variables reach the backend through the CLI's
 * one mapping; a value that is none of the choices is named in one line
 * and the default kept. */
Test(cli, environment_sets_backend_options)
{
    char cmd[1024], out[8192];
    const char *args = "bench --synthetic " MOERUN_SOURCE_DIR "/configs/tiny-moe.json --prefill 8 "
                       "--decode 1 --threads 1 --json 2>&1";
    snprintf(cmd, sizeof cmd, "MOERUN_CPU_ISA=ref %s %s", MOERUN_BINARY, args);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "\"kernels\":\"ref\"") != NULL, "MOERUN_CPU_ISA=ref: %s", out);
    snprintf(cmd, sizeof cmd, "MOERUN_CUDA_EXPERTS=fast %s %s", MOERUN_BINARY, args);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "moerun: MOERUN_CUDA_EXPERTS=fast is not one of cublas, mma: cublas\n") != NULL,
              "%s", out);
    /* --quantize q8_0 takes the amx set where its products run on the int8
     * tiles, unless MOERUN_CPU_ISA says which */
    const char *q = "bench --synthetic " MOERUN_SOURCE_DIR "/configs/tiny-moe.json --quantize q8_0 --prefill 8 "
                    "--decode 1 --threads 1 --json 2>&1";
    const bool tiles = moe_cpu_isa_detect() >= MOE_CPU_ISA_AMX && moe_cpu_amx_int8();
    char want[64];
    snprintf(want, sizeof want, "\"kernels\":\"%s\"",
             tiles ? "amx" : moe_cpu_isa_name(moe_cpu_isa_choose(MOE_CPU_ISA_DEFAULT_CAP)));
    snprintf(cmd, sizeof cmd, "env -u MOERUN_CPU_ISA %s %s", MOERUN_BINARY, q);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, want) != NULL, "--quantize q8_0, want %s: %s", want, out);
    snprintf(cmd, sizeof cmd, "MOERUN_CPU_ISA=avx2 %s %s", MOERUN_BINARY, q);
    snprintf(want, sizeof want, "\"kernels\":\"%s\"", moe_cpu_isa_name(moe_cpu_isa_choose(MOE_CPU_ISA_AVX2)));
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, want) != NULL, "--quantize q8_0 with MOERUN_CPU_ISA=avx2, want %s: %s", want, out);
}

Test(cli, version_names_the_build)
{
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s --version", MOERUN_BINARY);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(!strncmp(out, "moerun 0.", 9), "%s", out);
    cr_expect(strstr(out, "CUDA backend: ") && strstr(out, "CPU kernels: "), "%s", out);
}

/* A bad option is one line that names it and points to the command's help,
 * not the whole help text. */
Test(cli, bad_option_is_one_line_pointing_to_help)
{
    const char *cmds[] = {"inspect", "run", "chat", "serve", "batch", "plan", "bench", "ppl", "stats", "synth"};
    char args[256], needle[256];
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(args, sizeof args, "%s --no-such-option", cmds[i]);
        snprintf(needle, sizeof needle, "moerun %s: unknown option '--no-such-option'; see 'moerun %s --help'",
                 cmds[i], cmds[i]);
        tu_expect_one_line_error(args, needle);
    }
    tu_expect_one_line_error("run x -n", "moerun run: option '-n' needs a value; see 'moerun run --help'");
    tu_expect_one_line_error("bench --prefill", "option '--prefill' needs a value");
    tu_expect_one_line_error("plan --help=1", "option '--help' takes no value");
}

Test(cli, stats_names_the_missing_file)
{
    tu_expect_one_line_error("stats /nonexistent/s.json",
                             "/nonexistent/s.json: no such file (nor a trace /nonexistent/s.json.trace.json)");
}

/* serve checks what it can before it opens the port or says "listening";
 * output files are checked writable before anything is loaded or
 * generated.  Each is one line naming what was wrong. */
Test(cli, serve_and_outputs_checked_before_work)
{
    /* command, model folder under the fixtures ("" the fixtures folder
     * itself, NULL none), the rest, the expected message */
    static const struct { const char *cmd, *model, *rest, *needle; } cases[] = {
        {"serve --port 0", NULL, "--synthetic /nonexistent/c.json", "/nonexistent/c.json"},
        {"serve --port 0", "/olmoe", "--kv-dtype f7", "moerun serve: --kv-dtype 'f7'"},
        {"serve --port 0", "/olmoe", "--backend gpu", "moerun serve: --backend 'gpu' (use auto, cpu, cpu-ref or cuda)"},
        {"serve --port 0", "/olmoe", "--kv-budget lots", "moerun serve: --kv-budget 'lots' (a size"},
        {"serve --port 0", "/olmoe", "--port-file /nonexistent/p", "--port-file /nonexistent/p cannot be written"},
        {"serve --port 0", "", "", "config.json"},
        {"run", "/olmoe", "--prompt-ids 1,2 -n 1 --stats-out /nonexistent/s.json",
         "moerun run: --stats-out /nonexistent/s.json cannot be written"},
        {"run", "/olmoe", "--prompt-ids 1,2 -n 1 --trace-out /nonexistent/t",
         "--trace-out /nonexistent/t.trace.json cannot be written"},
        {"batch", "/olmoe", "/dev/null -o /nonexistent/o.jsonl",
         "moerun batch: -o /nonexistent/o.jsonl cannot be written"},
    };
    char args[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "%s %s%s %s", cases[i].cmd, cases[i].model ? FIXTURE_DIR : "",
                 cases[i].model ? cases[i].model : "", cases[i].rest);
        tu_expect_one_line_error(args, cases[i].needle);
    }
}
