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
#include "tests/cuda_forward.h"

TestSuite(cuda_forward, .init = tu_need_cuda_device);

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
/* Four-bit checkpoints as released (GPTQ, AWQ, compressed-tensors), read
 * in place from planes, against the CPU reference (the fast CPU kernels
 * quantize their inputs): fp32 tolerance, the same expert ids and greedy
 * tokens.  The prompts (5 to 21 rows) take the row kernels; the bf16
 * widening for longer steps is checked by backend_ops_cuda. */
static void check_q4_fixture(const char *name, int n_prompts, int n_tokens)
{
    check_fixture_run_on("cpu-ref", name, false, 0, 0, n_prompts, n_tokens);
}
Test(cuda_forward, qwen3_moe_gptq_matches_cpu) { check_q4_fixture("qwen3_moe_gptq", 3, 32); }
Test(cuda_forward, qwen3_moe_gptq_asym_g32_matches_cpu) { check_q4_fixture("qwen3_moe_gptq_asym_g32", 3, 32); }
Test(cuda_forward, qwen3_moe_gptq_v2_matches_cpu) { check_q4_fixture("qwen3_moe_gptq_v2", 3, 32); }
Test(cuda_forward, qwen3_moe_awq_matches_cpu) { check_q4_fixture("qwen3_moe_awq", 3, 32); }
Test(cuda_forward, qwen3_moe_ct_w4_matches_cpu) { check_q4_fixture("qwen3_moe_ct_w4", 3, 32); }
Test(cuda_forward, qwen3_moe_ct_w4_asym_matches_cpu) { check_q4_fixture("qwen3_moe_ct_w4_asym", 3, 32); }
Test(cuda_forward, llama_ct_w4_channel_matches_cpu) { check_q4_fixture("llama_ct_w4_channel", 3, 32); }
/* act order (desc_act, g_idx): each projection's inputs gathered by its
 * column order on the device, each expert's inputs and hidden row by its */
Test(cuda_forward, qwen3_moe_gptq_actorder_matches_cpu) { check_q4_fixture("qwen3_moe_gptq_actorder", 3, 32); }
/* the host emulation's CI selection: one prompt, 8 tokens */
Test(cuda_forward, qwen3_moe_gptq_asym_g32_short_matches_cpu) { check_q4_fixture("qwen3_moe_gptq_asym_g32", 1, 8); }

/* the host emulation's CI selection: one prompt, 8 tokens (the decode path) */
Test(cuda_forward, qwen3_moe_gptq_actorder_short_matches_cpu) { check_q4_fixture("qwen3_moe_gptq_actorder", 1, 8); }

/* A four-bit checkpoint on the grouped path: a 48-token prompt (past 32
 * rows: the experts widened to bf16; act order: their inputs gathered per
 * expert in its column order, h reordered for the down GEMM), bf16
 * activations, against the CPU reference: worst logits relative error at
 * most tol over the positions */
static void check_q4_grouped(const char *name, double tol)
{
    struct side cpu, gpu;
    side_open_on(&cpu, name, false, 0, 0, "cpu-ref");
    side_open(&gpu, name, true);
    enum { S = 48 };
    const int V = cpu.m.cfg.vocab, L = cpu.m.cfg.n_layers, K = cpu.m.cfg.top_k > 0 ? cpu.m.cfg.top_k : 1;
    int32_t prompt[S];
    for (int i = 0; i < S; i++) prompt[i] = (int32_t)((17 * i + 3) % V);
    int32_t *tc = calloc((size_t)L * S * K, sizeof(int32_t)), *tg = calloc((size_t)L * S * K, sizeof(int32_t));
    float *lc = prefill_all(&cpu, prompt, S, tc), *lg = prefill_all(&gpu, prompt, S, tg);
    double worst = 0;
    for (int p = 0; p < S; p++) {
        const double e = tu_max_rel_err(lg + (size_t)p * V, lc + (size_t)p * V, (size_t)V);
        worst = e > worst ? e : worst;
    }
    fprintf(stderr, "e2e: %s grouped S%d: logits max rel err %.3g\n", name, S, worst);
    cr_expect(worst <= tol, "%s grouped: logits relative error %.3g > %.1g", name, worst, tol);
    free(lc), free(lg), free(tc), free(tg);
    side_close(&gpu);
    side_close(&cpu);
}
Test(cuda_forward, qwen3_moe_gptq_grouped_matches_cpu) { check_q4_grouped("qwen3_moe_gptq", 5e-2); }
Test(cuda_forward, qwen3_moe_gptq_actorder_grouped_matches_cpu) { check_q4_grouped("qwen3_moe_gptq_actorder", 5e-2); }

/* one prompt and 8 greedy tokens, GQA and MLA: the host emulation's CI
 * selection (tools/cuda-emu/ci-tests.txt) */
Test(cuda_forward, qwen3_moe_short_matches_cpu) { check_fixture_run("qwen3_moe", false, 0, 0, 1, 8); }
Test(cuda_forward, deepseek_v2_short_matches_cpu) { check_fixture_run("deepseek_v2", false, 0, 0, 1, 8); }
Test(cuda_forward, llama_matches_cpu) { check_fixture("llama", false); }
Test(cuda_forward, qwen2_matches_cpu) { check_fixture("qwen2", false); }
Test(cuda_forward, qwen3_matches_cpu) { check_fixture("qwen3", false); }

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

/* Steps of at most 32 rows (docs/cuda.md, "Rows of one step"): a row's
 * logits do not depend on the other rows of its step, bit for bit.
 * Sequence A (90 tokens) decodes 4 tokens one step at a time alone, then,
 * prefilled again the same way, takes the same 4 tokens as one chunk (as
 * speculation verifies them) beside a decode row of B (170 tokens: its
 * attention splits the keys, A's alone would not need to) and of C: 6 rows
 * against 1 (the projections' row count, attention's split count and the
 * experts' rows all differ). */
static void prefill_chunks(struct side *g, struct moe_seq *s, const int32_t *p, int n, float *scratch)
{
    for (int i = 0; i < n; i += 32) {
        const struct moe_chunk c = {s, p + i, n - i < 32 ? n - i : 32, false, false, 0};
        cr_assert_eq(moe_runner_step(&g->r, &c, 1, scratch, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    }
}

static void check_rows_independent(const char *name)
{
    struct side g;
    side_open(&g, name, true);
    enum { NA = 90, NB = 170, NC = 40, R = 4 };
    const int V = g.m.cfg.vocab;
    int32_t a[NA + R], b[NB + 1], c[NC + 1];
    for (int i = 0; i < NA + R; i++) a[i] = (int32_t)((7 * i + 3) % V);
    for (int i = 0; i <= NB; i++) b[i] = (int32_t)((11 * i + 5) % V);
    for (int i = 0; i <= NC; i++) c[i] = (int32_t)((13 * i + 1) % V);
    float *solo = malloc((size_t)R * V * sizeof(float)), *batch = malloc((size_t)(R + 2) * V * sizeof(float)),
          *scratch = malloc((size_t)V * sizeof(float));
    cr_assert(solo && batch && scratch);
    struct moe_seq sa = {0};
    prefill_chunks(&g, &sa, a, NA, scratch);
    for (int r = 0; r < R; r++) {
        const struct moe_chunk ch = {&sa, a + NA + r, 1, false, true, 0};
        cr_assert_eq(moe_runner_step(&g.r, &ch, 1, solo + (size_t)r * V, NULL, NULL, NULL), MOE_OK, "%s",
                     moe_last_error());
    }
    moe_seq_free(&g.r, &sa);
    struct moe_seq s2[3] = {{0}};
    prefill_chunks(&g, &s2[0], a, NA, scratch);
    prefill_chunks(&g, &s2[1], b, NB, scratch);
    prefill_chunks(&g, &s2[2], c, NC, scratch);
    const struct moe_chunk ch[3] = {{&s2[0], a + NA, R, true, true, 0}, {&s2[1], b + NB, 1, false, true, 0},
                                    {&s2[2], c + NC, 1, false, true, 0}};
    int rows = 0;
    cr_assert_eq(moe_runner_step(&g.r, ch, 3, batch, NULL, &rows, NULL), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(rows, R + 2);
    for (int r = 0; r < R; r++) {
        int differ = 0;
        for (int v = 0; v < V; v++)
            differ += !tu_same_bits(batch[(size_t)r * V + v], solo[(size_t)r * V + v]);
        const double e = tu_max_rel_err(batch + (size_t)r * V, solo + (size_t)r * V, (size_t)V);
        cr_log_info("rows: %s row %d: %d of %d logits differ, max rel err %.3g", name, r, differ, V, e);
        cr_expect_eq(differ, 0, "%s: row %d of the 6-row step: %d of %d logits differ from the row's own step "
                     "(max rel err %.3g)", name, r, differ, V, e);
    }
    for (int i = 0; i < 3; i++) moe_seq_free(&g.r, &s2[i]);
    free(solo);
    free(batch);
    free(scratch);
    side_close(&g);
}
Test(cuda_forward, rows_independent_qwen3_moe) { check_rows_independent("qwen3_moe"); }
Test(cuda_forward, rows_independent_olmoe_bf16) { check_rows_independent("olmoe"); }
Test(cuda_forward, rows_independent_gpt_oss_mxfp4) { check_rows_independent("gpt_oss_mxfp4"); }
Test(cuda_forward, rows_independent_deepseek_v2) { check_rows_independent("deepseek_v2"); }

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
