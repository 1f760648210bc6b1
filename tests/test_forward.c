/* test_forward.c - the CPU forward pass against Hugging Face transformers.
 *
 * Each fixture under tests/fixtures was made by tests/reference/make_fixtures.py
 * with transformers (fp32 compute).  For every model and prompt we check:
 * logits at every prompt position within 1e-4 relative (max |diff| / max |ref|
 * per position), the router's top-K expert ids per layer and position
 * identical, and 32 greedy tokens identical.  The bf16 checkpoint is compared
 * with transformers run on the same weights upcast to fp32 (the CPU computes
 * in fp32) and, loosely, with transformers run entirely in bf16.
 *
 * The CPU backend computes each row independently of the others in the batch,
 * so prefilling at once, in chunks, token by token, or beside other
 * sequences must give bit-identical logits: those tests compare exactly.
 * (Hybrid models' linear layers take a long run of a sequence's rows by
 * the delta rule's chunked form and a short one by its recurrent form:
 * split differently into steps, a prompt agrees to fp32 rounding.) */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/runner.h"
#include "tests/testutil.h"

/* test_forward_fast.c includes this file with the fast backend. */
#ifndef FORWARD_SUITE
#define FORWARD_SUITE forward
#define FORWARD_BACKEND_INIT moe_backend_cpu_init
#endif

struct fixture {
    struct moe_model m;
    struct moe_backend be;
    struct moe_runner r;
    struct moe_safetensors ref;
};

static void fixture_open(struct fixture *f, const char *name)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, name);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    memset(f, 0, sizeof *f);
    cr_assert_eq(moe_model_load(&f->m, dir), MOE_OK, "load %s: %s", name, moe_last_error());
    cr_assert_eq(moe_safetensors_open_file(&f->ref, path), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(FORWARD_BACKEND_INIT(&f->be, 0), MOE_OK);
#ifdef FORWARD_FAST
    if (moe_backend_cpu_isa(&f->be) == 0) cr_skip_test("this processor runs no fast kernel set");
#endif
#ifdef FORWARD_NEEDS_ISA
    if (moe_backend_cpu_isa(&f->be) < FORWARD_NEEDS_ISA) cr_skip_test("this processor lacks the kernel set");
#endif
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 4, .max_logits = 64,
                                .block_size = 4, .n_blocks = 256};
    cr_assert_eq(moe_runner_init(&f->r, &f->m, &f->be, &o), MOE_OK, "%s", moe_last_error());
}

static void fixture_close(struct fixture *f)
{
    moe_runner_free(&f->r);
    moe_backend_free(&f->be);
    moe_safetensors_close(&f->ref);
    moe_model_free(&f->m);
}

static const struct moe_st_tensor *ref_tensor(struct fixture *f, const char *fmt, int p)
{
    char name[64];
    snprintf(name, sizeof name, fmt, p);
    return moe_safetensors_find(&f->ref, name);
}

/* Prefills prompt p with logits at every position, returns them (S, V) and
 * the expert trace (L, S, K). */
static float *prefill_all(struct fixture *f, const int32_t *prompt, int S, int32_t *trace_ids)
{
    const int V = f->m.cfg.vocab;
    float *logits = malloc((size_t)S * V * sizeof(float));
    struct moe_seq seq = {0};
    struct moe_chunk c = {&seq, prompt, S, true, false, 0};
    struct moe_route_trace tr = {trace_ids, NULL};
    int rows = 0;
    cr_assert_eq(moe_runner_step(&f->r, &c, 1, logits, NULL, &rows, trace_ids ? &tr : NULL), MOE_OK,
                 "%s", moe_last_error());
    cr_assert_eq(rows, S);
    moe_seq_free(&f->r, &seq);
    return logits;
}

static void check_model(const char *name, double logit_tol)
{
    struct fixture f;
    fixture_open(&f, name);
    const struct moe_config *c = &f.m.cfg;
    const int V = c->vocab, L = c->n_layers, K = c->top_k > 0 ? c->top_k : 1;
    for (int p = 0; p < 3; p++) {
        const struct moe_st_tensor *pt = ref_tensor(&f, "prompt.%d", p);
        const struct moe_st_tensor *lt = ref_tensor(&f, "logits.%d", p);
        const struct moe_st_tensor *gt = ref_tensor(&f, "greedy.%d", p);
        cr_assert(pt && lt && gt, "%s: reference tensors for prompt %d", name, p);
        const int S = (int)pt->shape[0];
        const int32_t *prompt = pt->data;
        const float *ref = lt->data;
        int32_t *trace = malloc((size_t)L * S * K * sizeof(int32_t));
        float *logits = prefill_all(&f, prompt, S, trace);
        for (int s = 0; s < S; s++) {
            double e = tu_max_rel_err(logits + (size_t)s * V, ref + (size_t)s * V, (size_t)V);
            cr_expect(e <= logit_tol, "%s prompt %d position %d: logits relative error %.3g > %.1g",
                      name, p, s, e, logit_tol);
        }
        const struct moe_st_tensor *et = ref_tensor(&f, "experts.%d", p);
        if (c->n_experts > 0) {
            cr_assert(et, "%s: experts.%d missing", name, p);
            cr_assert_eq(et->shape[0], L);
            cr_assert_eq(et->shape[2], K);
            const int32_t *want = et->data;
            for (size_t i = 0; i < (size_t)L * S * K; i++)
                cr_expect_eq(trace[i], want[i], "%s prompt %d: layer %zu position %zu slot %zu: "
                             "expert %d, transformers chose %d", name, p, i / ((size_t)S * K),
                             i / K % S, i % K, trace[i], want[i]);
        }
        /* greedy continuation */
        int32_t out[32];
        struct moe_seq seq = {0};
        cr_assert_eq(moe_runner_greedy(&f.r, &seq, prompt, S, 32, 0, out), MOE_OK, "%s",
                     moe_last_error());
        const int32_t *want = gt->data;
        for (int i = 0; i < 32; i++)
            cr_expect_eq(out[i], want[i], "%s prompt %d greedy token %d: %d, transformers %d",
                         name, p, i, out[i], want[i]);
        moe_seq_free(&f.r, &seq);
        free(logits);
        free(trace);
    }
    cr_assert_eq(moe_kvcache_available(&f.r.kv), f.r.kv.n_blocks, "every KV block returned");
    fixture_close(&f);
}

Test(FORWARD_SUITE, mixtral_matches_transformers) { check_model("mixtral", 1e-4); }
Test(FORWARD_SUITE, qwen2_moe_matches_transformers) { check_model("qwen2_moe", 1e-4); }
Test(FORWARD_SUITE, qwen3_moe_sharded_matches_transformers) { check_model("qwen3_moe", 1e-4); }
Test(FORWARD_SUITE, olmoe_bf16_matches_transformers_fp32_compute) { check_model("olmoe", 1e-4); }
Test(FORWARD_SUITE, llama_matches_transformers) { check_model("llama", 1e-4); }
Test(FORWARD_SUITE, qwen2_matches_transformers) { check_model("qwen2", 1e-4); }
Test(FORWARD_SUITE, qwen3_matches_transformers) { check_model("qwen3", 1e-4); }
/* sigmoid router with a choice bias, 4 groups of which 2 eligible, scaled
 * weights; shared expert; first layer dense; q/k norm; half-rotary RoPE */
Test(FORWARD_SUITE, glm4_moe_matches_transformers) { check_model("glm4_moe", 1e-4); }
/* embedding, residual, attention and logits multipliers; fused experts */
Test(FORWARD_SUITE, granitemoe_matches_transformers) { check_model("granitemoe", 1e-4); }
Test(FORWARD_SUITE, granitemoeshared_bf16_matches_transformers) { check_model("granitemoeshared", 1e-4); }
Test(FORWARD_SUITE, granite_matches_transformers) { check_model("granite", 1e-4); }
/* gpt-oss: attention sinks, YaRN, sliding and full layers, router and expert
 * biases, clamped SwiGLU over interleaved gate/up; experts stored transposed
 * (as transformers saves them) and as MXFP4 blocks (as released) */
Test(FORWARD_SUITE, gpt_oss_matches_transformers) { check_model("gpt_oss", 1e-4); }
Test(FORWARD_SUITE, gpt_oss_mxfp4_matches_transformers) { check_model("gpt_oss_mxfp4", 1e-4); }
/* DeepSeek multi-head latent attention, absorbed (runtime/engine/forward_mla.c):
 * V2 with q_proj, interleaved rope, greedy softmax routing scaled, yarn's
 * mscale in the score scale; V3 with the q LoRA and the sigmoid router */
Test(FORWARD_SUITE, deepseek_v2_matches_transformers) { check_model("deepseek_v2", 1e-4); }
Test(FORWARD_SUITE, deepseek_v3_matches_transformers) { check_model("deepseek_v3", 1e-4); }
/* DeepSeek-V3.2: V3 with the lightning indexer choosing each query's 4
 * best past keys (the fixture's selections differ from dense attention's
 * logits and have no near-tie at the cut) */
Test(FORWARD_SUITE, deepseek_v32_matches_transformers) { check_model("deepseek_v32", 1e-4); }
/* GLM-MoE-DSA (GLM-5): V3.2's sparse attention with the indexer rotating
 * interleaved pairs, layers 1 and 3 "shared" (no indexer: the 4 keys layers
 * 0 and 2 chose) */
Test(FORWARD_SUITE, glm_moe_dsa_matches_transformers) { check_model("glm_moe_dsa", 1e-4); }
/* MiniMax-M2, as released (block_sparse_moe, w1/w3/w2 per expert): q/k
 * RMSNorm over the whole projections, RoPE over rotary_dim values of each
 * head, the sigmoid router with the block's choice bias, renormalised */
Test(FORWARD_SUITE, minimax_m2_matches_transformers) { check_model("minimax_m2", 1e-4); }
/* Llama-4 (text): chunked attention (chunks of 8) on the RoPE layers, two
 * layers without RoPE with the attention temperature, the q/k L2 norm,
 * rope pairs interleaved, top-1 sigmoid routing scaling the expert's
 * input, a shared expert, dense and MoE layers interleaved, experts as
 * transformers keeps them ((E, D, 2F), (E, F, D)) */
Test(FORWARD_SUITE, llama4_matches_transformers) { check_model("llama4", 1e-4); }
/* Qwen3-Next: Gated DeltaNet layers (causal convolution and delta rule over
 * a recurrent state per sequence; 2 q/k heads for 4 value heads, Dk 16 !=
 * Dv 8), a gated full-attention layer with quarter-rotary RoPE, (1 + w)
 * RMSNorms (random w), a dense layer among MoE layers with a gated shared
 * expert.  transformers prefills with its chunked delta rule and decodes
 * with the recurrent one; moerun runs the recurrent one throughout */
Test(FORWARD_SUITE, qwen3_next_matches_transformers) { check_model("qwen3_next", 1e-4); }
/* Qwen3.5-MoE: the same layers with in_proj_qkv, in_proj_z, in_proj_b and
 * in_proj_a apart, every layer MoE, the router always renormalised, the
 * text's mrope (one position for all three sections: plain RoPE) */
Test(FORWARD_SUITE, qwen3_5_moe_matches_transformers) { check_model("qwen3_5_moe", 1e-4); }
/* the same text model in a Qwen3_5MoeForConditionalGeneration checkpoint
 * (text_config, model.language_model.* tensors, a vision tower not read) */
Test(FORWARD_SUITE, qwen3_5_moe_multimodal_text_matches_transformers) { check_model("qwen3_5_moe_multimodal", 1e-4); }
/* the same text model in a Llama4ForConditionalGeneration checkpoint
 * (text_config, language_model.* tensors, a vision tower not read) */
Test(FORWARD_SUITE, llama4_multimodal_text_matches_transformers) { check_model("llama4_multimodal", 1e-4); }
/* fp8 checkpoints (quantization_config fp8, blocks of 128 x 128), read as
 * released: F8_E4M3 Linear weights with F32 scales, BF16 elsewhere;
 * transformers dequantizes them itself (tests/reference/make_fp8_fixtures.py).
 * Qwen3-MoE: attention, experts and a dense FFN in FP8; DeepSeek-V3: MLA's
 * projections (kv_a_proj_with_mqa's last row group short, kv_b_proj
 * dequantized and split), dense and shared FFN, experts */
Test(FORWARD_SUITE, qwen3_moe_fp8_matches_transformers) { check_model("qwen3_moe_fp8", 1e-4); }
Test(FORWARD_SUITE, deepseek_v3_fp8_matches_transformers) { check_model("deepseek_v3_fp8", 1e-4); }
/* four-bit checkpoints as the libraries write them (tests/reference/make_q4_fixtures.py):
 * compressed-tensors pack-quantized (symmetric groups of 128, asymmetric
 * groups of 32, a per-channel dense Llama), GPTQModel's GPTQ (v1 symmetric
 * groups of 128, asymmetric groups of 32, act order with a permuted g_idx,
 * gptq_v2 zero points) and AWQ (gemm); the reference is transformers in
 * fp32 over the exact dequantization (q - z) * s, which the reference
 * backend computes.  (The fast backend quantizes its inputs to 8 bits for
 * these weights, as for Q8_0: test_q4_model.c bounds it against the
 * reference.) */
#ifndef FORWARD_FAST
Test(FORWARD_SUITE, qwen3_moe_ct_w4_matches_transformers) { check_model("qwen3_moe_ct_w4", 1e-4); }
Test(FORWARD_SUITE, qwen3_moe_ct_w4_asym_matches_transformers) { check_model("qwen3_moe_ct_w4_asym", 1e-4); }
Test(FORWARD_SUITE, llama_ct_w4_channel_matches_transformers) { check_model("llama_ct_w4_channel", 1e-4); }
Test(FORWARD_SUITE, qwen3_moe_gptq_matches_transformers) { check_model("qwen3_moe_gptq", 1e-4); }
Test(FORWARD_SUITE, qwen3_moe_gptq_asym_g32_matches_transformers) { check_model("qwen3_moe_gptq_asym_g32", 1e-4); }
Test(FORWARD_SUITE, qwen3_moe_gptq_actorder_matches_transformers) { check_model("qwen3_moe_gptq_actorder", 1e-4); }
Test(FORWARD_SUITE, qwen3_moe_gptq_v2_matches_transformers) { check_model("qwen3_moe_gptq_v2", 1e-4); }
Test(FORWARD_SUITE, qwen3_moe_awq_matches_transformers) { check_model("qwen3_moe_awq", 1e-4); }
#endif

/* transformers computing entirely in bf16 rounds every activation to 8 bits
 * of mantissa: agreement is only to bf16 precision. */
Test(FORWARD_SUITE, olmoe_bf16_close_to_transformers_bf16_compute)
{
    struct fixture f;
    fixture_open(&f, "olmoe");
    const int V = f.m.cfg.vocab;
    for (int p = 0; p < 3; p++) {
        const struct moe_st_tensor *pt = ref_tensor(&f, "prompt.%d", p);
        const struct moe_st_tensor *bt = ref_tensor(&f, "logits_bf16.%d", p);
        cr_assert(pt && bt);
        const int S = (int)pt->shape[0];
        float *logits = prefill_all(&f, pt->data, S, NULL);
        double e = tu_max_rel_err(logits, bt->data, (size_t)S * V);
        cr_expect(e <= 3e-2, "olmoe prompt %d: relative error vs bf16 compute %.3g", p, e);
        free(logits);
    }
    fixture_close(&f);
}

/* Same logits whether the prompt is prefilled at once, in chunks of 5, or
 * token by token: identical (tol 0) or within tol relative. */
static void check_chunking_tol(const char *name, double tol)
{
    struct fixture f;
    fixture_open(&f, name);
    const int V = f.m.cfg.vocab;
    const struct moe_st_tensor *pt = ref_tensor(&f, "prompt.%d", 2);
    const int S = (int)pt->shape[0];
    const int32_t *prompt = pt->data;
    float *whole = prefill_all(&f, prompt, S, NULL);
    for (int chunk = 1; chunk <= 5; chunk += 4) {
        float *part = malloc((size_t)S * V * sizeof(float));
        struct moe_seq seq = {0};
        for (int off = 0; off < S; off += chunk) {
            int n = S - off < chunk ? S - off : chunk;
            struct moe_chunk c = {&seq, prompt + off, n, true, false, 0};
            cr_assert_eq(moe_runner_step(&f.r, &c, 1, part + (size_t)off * V, NULL, NULL, NULL), MOE_OK);
        }
        if (tol == 0)
            cr_expect(memcmp(part, whole, (size_t)S * V * sizeof(float)) == 0,
                      "%s: chunks of %d differ from one prefill (max rel err %.3g)", name, chunk,
                      tu_max_rel_err(part, whole, (size_t)S * V));
        else
            for (int t = 0; t < S; t++) {
                const double e = tu_max_rel_err(part + (size_t)t * V, whole + (size_t)t * V, (size_t)V);
                cr_expect(e <= tol, "%s: chunks of %d, row %d: rel err %.3g from one prefill", name, chunk, t, e);
            }
        moe_seq_free(&f.r, &seq);
        free(part);
    }
    free(whole);
    fixture_close(&f);
}

static void check_chunking(const char *name) { check_chunking_tol(name, 0); }

Test(FORWARD_SUITE, chunked_prefill_is_identical_qwen2_moe) { check_chunking("qwen2_moe"); }
Test(FORWARD_SUITE, chunked_prefill_is_identical_mixtral) { check_chunking("mixtral"); }
Test(FORWARD_SUITE, chunked_prefill_is_identical_llama) { check_chunking("llama"); }
/* prefill chunks of 1 and 5 across Llama-4's attention chunks of 8 */
Test(FORWARD_SUITE, chunked_prefill_is_identical_llama4) { check_chunking("llama4"); }

/* prefill chunks of 1 and 5 (the recurrent form): each carries the linear
 * layers' recurrent state (convolution inputs and delta-rule state) to the
 * next; the whole prompt takes the chunked form */
Test(FORWARD_SUITE, chunked_prefill_agrees_qwen3_next) { check_chunking_tol("qwen3_next", 1e-5); }
Test(FORWARD_SUITE, chunked_prefill_agrees_qwen3_5_moe) { check_chunking_tol("qwen3_5_moe", 1e-5); }
/* the indexer's keys cached beside the latent rows: later chunks select
 * among earlier chunks' keys */
Test(FORWARD_SUITE, chunked_prefill_is_identical_deepseek_v32) { check_chunking("deepseek_v32"); }
/* the shared layers reuse the selection their full layer made for the same
 * chunk's rows */
Test(FORWARD_SUITE, chunked_prefill_is_identical_glm_moe_dsa) { check_chunking("glm_moe_dsa"); }

/* Three prompts batched in one step, then decoded together, give exactly
 * their solo logits: prefill of one mixed with decodes of others. */
static void check_batched(const char *name)
{
    struct fixture f;
    fixture_open(&f, name);
    const int V = f.m.cfg.vocab;
    const int32_t *prompts[3];
    int S[3];
    float *solo[3];
    for (int p = 0; p < 3; p++) {
        const struct moe_st_tensor *pt = ref_tensor(&f, "prompt.%d", p);
        prompts[p] = pt->data;
        S[p] = (int)pt->shape[0];
        solo[p] = prefill_all(&f, prompts[p], S[p], NULL);
    }
    /* prompt 1 alone in the two steps it takes below (for a hybrid model,
     * its 4 rows then the rest differ in rounding from one prefill) */
    struct moe_seq one = {0};
    struct moe_chunk halves[2] = {{&one, prompts[1], 4, true, false, 0},
                                  {&one, prompts[1] + 4, S[1] - 4, true, false, 0}};
    cr_assert_eq(moe_runner_step(&f.r, &halves[0], 1, solo[1], NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_runner_step(&f.r, &halves[1], 1, solo[1] + (size_t)4 * V, NULL, NULL, NULL), MOE_OK, "%s",
                 moe_last_error());
    moe_seq_free(&f.r, &one);
    /* step 1: prompt 0 whole + first 4 tokens of prompt 1; step 2: one decode
     * token of prompt 0 (its own token at S[0]-... replaced by prompt 2's
     * start) + the rest of prompt 1 + all of prompt 2 */
    struct moe_seq a = {0}, b = {0}, c = {0};
    float *out = malloc((size_t)64 * V * sizeof(float));
    struct moe_chunk step1[2] = {{&a, prompts[0], S[0], true, false, 0},
                                 {&b, prompts[1], 4, true, false, 0}};
    int rows;
    int32_t ids[64];
    cr_assert_eq(moe_runner_step(&f.r, step1, 2, out, ids, &rows, NULL), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(rows, S[0] + 4);
    for (int i = 0; i < rows; i++) /* the backend's argmax of each row */
        cr_expect_eq(ids[i], moe_argmax(out + (size_t)i * V, V), "row %d", i);
    cr_expect(memcmp(out, solo[0], (size_t)S[0] * V * sizeof(float)) == 0, "prompt 0 in a batch");
    cr_expect(memcmp(out + (size_t)S[0] * V, solo[1], (size_t)4 * V * sizeof(float)) == 0,
              "prompt 1 first chunk in a batch");
    struct moe_chunk step2[2] = {{&b, prompts[1] + 4, S[1] - 4, true, false, 0},
                                 {&c, prompts[2], S[2], true, false, 0}};
    for (int i = 0; i < 64; i++) ids[i] = -1;
    cr_assert_eq(moe_runner_step(&f.r, step2, 2, out, ids, &rows, NULL), MOE_OK, "%s", moe_last_error());
    for (int i = 0; i < rows; i++)
        cr_expect_eq(ids[i], moe_argmax(out + (size_t)i * V, V), "row %d", i);
    cr_expect(memcmp(out, solo[1] + (size_t)4 * V, (size_t)(S[1] - 4) * V * sizeof(float)) == 0,
              "prompt 1 second chunk beside prompt 2");
    cr_expect(memcmp(out + (size_t)(S[1] - 4) * V, solo[2], (size_t)S[2] * V * sizeof(float)) == 0,
              "prompt 2 beside prompt 1");
    moe_seq_free(&f.r, &a);
    moe_seq_free(&f.r, &b);
    moe_seq_free(&f.r, &c);
    cr_assert_eq(moe_kvcache_available(&f.r.kv), f.r.kv.n_blocks);
    cr_assert_eq(f.r.kv.n_state_free, f.r.kv.n_state_slots, "every state slot returned");
    for (int p = 0; p < 3; p++) free(solo[p]);
    free(out);
    fixture_close(&f);
}

Test(FORWARD_SUITE, batched_sequences_match_solo) { check_batched("qwen3_moe"); }
/* each sequence's linear layers read and write only its own state slot */
Test(FORWARD_SUITE, batched_sequences_match_solo_qwen3_next) { check_batched("qwen3_next"); }

/* A linear-attention state cannot be rewound: a step that does not
 * continue a sequence's state is refused, naming why, and changes
 * nothing; restarting the sequence from position 0 works. */
Test(FORWARD_SUITE, qwen3_next_refuses_rewinding_its_state)
{
    struct fixture f;
    fixture_open(&f, "qwen3_next");
    const int V = f.m.cfg.vocab;
    const struct moe_st_tensor *pt = ref_tensor(&f, "prompt.%d", 1);
    const int S = (int)pt->shape[0];
    const int32_t *prompt = pt->data;
    float *whole = prefill_all(&f, prompt, S, NULL);
    float *part = malloc((size_t)S * V * sizeof(float));
    struct moe_seq seq = {0};
    struct moe_chunk c = {&seq, prompt, 6, true, false, 0};
    cr_assert_eq(moe_runner_step(&f.r, &c, 1, part, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    moe_seq_truncate(&f.r, &seq, 4);
    c = (struct moe_chunk){&seq, prompt + 4, S - 4, true, false, 0};
    cr_assert_eq(moe_runner_step(&f.r, &c, 1, part, NULL, NULL, NULL), MOE_ERR_INVALID_ARG);
    cr_expect(strstr(moe_last_error(), "cannot be rewound"), "%s", moe_last_error());
    cr_assert_eq(seq.len, 4, "the refused step left the sequence as it was");
    moe_seq_truncate(&f.r, &seq, 0);
    c = (struct moe_chunk){&seq, prompt, S, true, false, 0};
    cr_assert_eq(moe_runner_step(&f.r, &c, 1, part, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    cr_expect(memcmp(part, whole, (size_t)S * V * sizeof(float)) == 0, "restarted at position 0");
    moe_seq_free(&f.r, &seq);
    cr_assert_eq(f.r.kv.n_state_free, f.r.kv.n_state_slots);
    free(part);
    free(whole);
    fixture_close(&f);
}

/* Every state slot taken: the next sequence is refused at its first
 * step, naming the slots, and gets one once a sequence is freed. */
Test(FORWARD_SUITE, qwen3_next_state_slots_run_out_cleanly)
{
    struct fixture f;
    fixture_open(&f, "qwen3_next");
    const int32_t tok[1] = {7};
    struct moe_seq seqs[5] = {{0}};
    for (int i = 0; i < 4; i++) {
        struct moe_chunk c = {&seqs[i], tok, 1, false, false, 0};
        cr_assert_eq(moe_runner_step(&f.r, &c, 1, NULL, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    }
    struct moe_chunk c = {&seqs[4], tok, 1, false, false, 0};
    const int blocks = moe_kvcache_available(&f.r.kv);
    cr_assert_eq(moe_runner_step(&f.r, &c, 1, NULL, NULL, NULL, NULL), MOE_ERR_NOMEM);
    cr_expect(strstr(moe_last_error(), "recurrent-state slots"), "%s", moe_last_error());
    cr_expect_eq(moe_kvcache_available(&f.r.kv), blocks, "no block kept by the refused step");
    moe_seq_free(&f.r, &seqs[1]);
    cr_assert_eq(moe_runner_step(&f.r, &c, 1, NULL, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    for (int i = 0; i < 5; i++) moe_seq_free(&f.r, &seqs[i]);
    cr_assert_eq(f.r.kv.n_state_free, f.r.kv.n_state_slots);
    cr_assert_eq(moe_kvcache_available(&f.r.kv), f.r.kv.n_blocks);
    fixture_close(&f);
}

Test(FORWARD_SUITE, rejects_token_outside_vocabulary_without_side_effects)
{
    struct fixture f;
    fixture_open(&f, "llama");
    int32_t bad[3] = {1, f.m.cfg.vocab, 2};
    struct moe_seq seq = {0};
    struct moe_chunk c = {&seq, bad, 3, false, false, 0};
    cr_assert_eq(moe_runner_step(&f.r, &c, 1, NULL, NULL, NULL, NULL), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "outside the vocabulary"), "%s", moe_last_error());
    cr_assert_eq(seq.len, 0);
    cr_assert_eq(moe_kvcache_available(&f.r.kv), f.r.kv.n_blocks);
    moe_seq_free(&f.r, &seq);
    fixture_close(&f);
}

/* The same checkpoint stored in F16: weights read and converted in place
 * give logits within f16 rounding of the fp32 reference. */
Test(FORWARD_SUITE, f16_weights_close_to_reference)
{
    struct fixture f;
    fixture_open(&f, "qwen3_moe");
    struct moe_model h = {0};
    h.cfg = f.m.cfg;
    for (size_t i = 0; i < f.m.st.n_tensors; i++) {
        const struct moe_st_tensor *t = &f.m.st.tensors[i];
        size_t n = t->nbytes / 4;
        float *tmp = malloc(n * sizeof(float));
        uint16_t *d = malloc(n * 2 + 2);
        moe_convert_row_f32(tmp, t->data, t->dtype, n);
        moe_convert_from_f32(d, tmp, MOE_DTYPE_F16, n);
        free(tmp);
        cr_assert_eq(moe_safetensors_add(&h.st, t->name, MOE_DTYPE_F16, t->ndim, t->shape, d), MOE_OK);
    }
    cr_assert_eq(moe_model_bind(&h), MOE_OK, "%s", moe_last_error());
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 1, .max_logits = 64, .block_size = 8,
                                .n_blocks = 16};
    cr_assert_eq(moe_runner_init(&r, &h, &f.be, &o), MOE_OK, "%s", moe_last_error());
    const struct moe_st_tensor *pt = ref_tensor(&f, "prompt.%d", 2), *lt = ref_tensor(&f, "logits.%d", 2);
    const int S = (int)pt->shape[0], V = h.cfg.vocab;
    float *logits = malloc((size_t)S * V * sizeof(float));
    struct moe_seq seq = {0};
    struct moe_chunk c = {&seq, pt->data, S, true, false, 0};
    cr_assert_eq(moe_runner_step(&r, &c, 1, logits, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    double e = tu_max_rel_err(logits, lt->data, (size_t)S * V);
    cr_expect(e < 5e-3, "f16 weights: relative error %.3g", e);
    cr_expect(e > 0, "f16 rounding must change something (weights were converted)");
    moe_seq_free(&r, &seq);
    moe_runner_free(&r);
    moe_model_free(&h);
    free(logits);
    fixture_close(&f);
}

/* Sizes computed from the configuration equal those of the loaded tensors
 * (f32 checkpoints; the fp8 ones keep bf16 beside their FP8 weights, the
 * four-bit ones (groups of 128) f16). */
Test(FORWARD_SUITE, config_sizes_equal_loaded_sizes)
{
    const char *names[] = {"mixtral", "qwen2_moe", "qwen3_moe", "llama", "qwen2", "qwen3", "glm4_moe",
                           "granitemoe", "granite", "gpt_oss", "gpt_oss_mxfp4",
                           "deepseek_v2", "deepseek_v3", "minimax_m2", "llama4", "qwen3_next", "qwen3_5_moe", "deepseek_v32", "glm_moe_dsa", "qwen3_moe_fp8",
                           "deepseek_v3_fp8",
                           "qwen3_moe_gptq", "qwen3_moe_gptq_v2", "qwen3_moe_awq"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, names[i]);
        struct moe_model m;
        cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s", moe_last_error());
        struct moe_model_sizes a, b;
        moe_model_sizes(&m, &a);
        moe_config_sizes(&m.cfg, m.cfg.weights_fp8 || m.cfg.q4_method != MOE_Q4_NONE ? 2 : 4, &b);
        cr_expect(memcmp(&a, &b, sizeof a) == 0,
                  "%s: loaded %lld params / %lld bytes, config says %lld / %lld", names[i],
                  (long long)a.params_total, (long long)a.bytes_total, (long long)b.params_total,
                  (long long)b.bytes_total);
        moe_model_free(&m);
    }
}
