/* cli_inspect.c - `moerun inspect MODEL`: what a checkpoint is. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/cpu/gemm_fast.h"

struct inspect_opts {
    struct moe_cli_engine eng; /* the model options */
};

static const char *const shared[] = {"synthetic", "dtype", NULL};

static const struct moe_cli_command inspect_cmd = {
    .name = "inspect",
    .usage = "usage: moerun inspect MODEL_DIR\n"
             "       moerun inspect --synthetic CONFIG.json [--dtype bf16]\n\n"
             "Prints the family, layer and expert structure, parameters in total and active\n"
             "per token, bytes by part, and KV cache bytes per token.\n\n",
    .shared = shared,
    .engine_at = offsetof(struct inspect_opts, eng),
};

/* The configuration: family, layers, attention, experts, what is special. */
static void print_structure(const struct moe_model *m, const char *name)
{
    const struct moe_config *cfg = &m->cfg;
    int n_moe = moe_config_moe_layers(cfg);
    printf("model        %s\n", name);
    printf("family       %s\n", cfg->architecture);
    printf("layers       %d (%d MoE, %d dense)\n", cfg->n_layers, n_moe, cfg->n_layers - n_moe);
    printf("hidden       %d; attention %d query / %d KV heads x %d", cfg->d_model, cfg->n_heads,
           cfg->n_kv_heads, cfg->head_dim);
    if (cfg->qk_norm != MOE_QK_NORM_NONE)
        printf(", q/k norm %s", cfg->qk_norm == MOE_QK_NORM_HEAD ? "per head" : "full");
    if (cfg->attn_out_gate) printf(", output gated");
    if (moe_config_linear_layers(cfg) > 0)
        printf("\nlinear       %d of %d layers Gated DeltaNet (linear attention): %d q/k heads x %d, %d value "
               "heads x %d, convolution of %d", moe_config_linear_layers(cfg), cfg->n_layers, cfg->lin_k_heads,
               cfg->lin_k_dim, cfg->lin_v_heads, cfg->lin_v_dim, cfg->lin_conv);
    printf("\nvocabulary   %d; context %d; rope theta %g%s", cfg->vocab, cfg->max_pos,
           cfg->rope_theta,
           cfg->rope_type == MOE_ROPE_LLAMA3 ? " (llama3 scaling)"
           : cfg->rope_type == MOE_ROPE_LINEAR ? " (linear scaling)"
           : cfg->rope_type == MOE_ROPE_YARN ? " (yarn scaling)" : "");
    if (cfg->rope_type == MOE_ROPE_YARN)
        printf(" x%g over %d, attention factor %.4g", cfg->rope_factor, cfg->rope_original_max_pos,
               cfg->rope_attn_factor);
    if (cfg->rope_dim < cfg->head_dim) printf(", over %d of %d values per head", cfg->rope_dim, cfg->head_dim);
    printf("\n");
    if (n_moe)
        printf("experts      %d per MoE layer, top-%d, width %d, weights %s\n", cfg->n_experts,
               cfg->top_k, cfg->d_expert, cfg->norm_topk ? "renormalised" : "not renormalised");
    if (n_moe && cfg->router_scales_input)
        printf("router       the top-%d router logits; each chosen expert's input times sigmoid(logit), its output "
               "unweighted\n", cfg->top_k);
    else if (n_moe && cfg->router_sigmoid)
        printf("router       sigmoid scores%s; chosen in the best %d of %d groups; weights x %g\n",
               cfg->router_bias ? " + a per-expert choice bias" : "", cfg->topk_group, cfg->n_group,
               cfg->routed_scale);
    if (cfg->family == MOE_FAMILY_GRANITE_MOE || cfg->family == MOE_FAMILY_GRANITE)
        printf("multipliers  embedding x %g, residual x %g, attention scale %g, logits / %g\n",
               cfg->embed_scale, cfg->residual_scale, cfg->attn_scale, 1.0 / cfg->logit_scale);
    if (cfg->kv_lora_rank > 0)
        printf("latent       multi-head latent attention: kv_lora_rank %d, q_lora_rank %d; per head %d "
               "+ %d (rope) key values, %d value; the cache holds one row of %d per token, read "
               "as K and V\n", cfg->kv_lora_rank, cfg->q_lora_rank, cfg->qk_nope_dim, cfg->rope_dim,
               cfg->v_head_dim, cfg->head_dim);
    if (cfg->dsa_topk > 0) {
        char a[32];
        printf("sparse       DeepSeek sparse attention: each query attends to its %d best keys by an indexer of %d "
               "heads x %d; its keys take %s per token (F32, in the kv cache figures)\n", cfg->dsa_topk,
               cfg->dsa_heads, cfg->dsa_dim, moe_cli_bytes(a, sizeof a, (double)moe_config_dsa_bytes_per_token(cfg)));
        if (moe_config_dsa_layers(cfg) < cfg->n_layers)
            printf("             %d of %d layers run an indexer; the others reuse the keys the last one before "
                   "them chose\n", moe_config_dsa_layers(cfg), cfg->n_layers);
        if (cfg->dsa_rope_interleave) printf("             the indexer rotates interleaved pairs\n");
    }
    if (cfg->family == MOE_FAMILY_LLAMA4) {
        int nope = 0, chunked = 0;
        for (int l = 0; l < cfg->n_layers; l++) nope += cfg->layer_nope[l], chunked += cfg->layer_chunked[l];
        printf("llama-4      attention in chunks of %d in %d layers; %d layers without RoPE%s; q/k L2 norm %s\n",
               cfg->attn_chunk, chunked, nope, cfg->attn_temp_floor > 0 ? " (attention temperature)" : "",
               cfg->qk_l2_norm ? "on the RoPE layers" : "off");
    }
    if (cfg->family == MOE_FAMILY_GPT_OSS)
        printf("gpt-oss      attention sinks; router and expert biases; clamped SwiGLU (alpha %g, "
               "limit %g); experts stored as %s\n", cfg->swiglu_alpha, cfg->swiglu_limit,
               m->layers && n_moe ? moe_dtype_name(m->layers[cfg->n_layers - 1].experts.dtype)
               : cfg->experts_mxfp4 ? "MXFP4" : "the weights' dtype");
    if (cfg->weights_fp8)
        printf("fp8          Linear weights in E4M3 with a scale per 128 x 128 block (1 + 4/128 bytes a "
               "weight as loaded); routers, norms and embeddings as stored\n");
    if (cfg->q4_method != MOE_Q4_NONE)
        printf("four-bit     %s Linear weights, a scale and a zero point per group (4.5 bits a weight as "
               "loaded for groups of 128 and more, 6 for 32 and 64); modules stored in float as stored\n",
               cfg->q4_method == MOE_Q4_GPTQ ? "GPTQ" : cfg->q4_method == MOE_Q4_AWQ ? "AWQ" : "compressed-tensors");
    if (cfg->sliding_window > 0) {
        int n = 0;
        for (int l = 0; l < cfg->n_layers; l++) n += cfg->layer_sliding[l];
        printf("attention    sliding window of %d in %d of %d layers\n", cfg->sliding_window, n,
               cfg->n_layers);
    }
    if (cfg->d_shared)
        printf("shared       1 shared expert of width %d%s\n", cfg->d_shared,
               cfg->shared_gate ? ", sigmoid gate" : "");
    if (n_moe < cfg->n_layers) printf("dense FFN    width %d\n", cfg->d_ff);
}

/* Parameters and bytes by part (the model's sizes z), KV bytes per token. */
static void print_sizes(const struct moe_config *cfg, const struct moe_model_sizes *z)
{
    char a[32], b[32];
    printf("parameters   %s total, %s active per token (%.1f%%)\n",
           moe_cli_count(a, sizeof a, (double)z->params_total),
           moe_cli_count(b, sizeof b, (double)z->params_active),
           100.0 * (double)z->params_active / (double)(z->params_total ? z->params_total : 1));
    printf("bytes        %s total\n", moe_cli_bytes(a, sizeof a, (double)z->bytes_total));
    const struct { const char *name; int64_t v; } parts[] = {
        {"embeddings", z->bytes_embed}, {"lm head", z->bytes_lm_head}, {"attention", z->bytes_attn},
        {"experts", z->bytes_experts},  {"shared", z->bytes_shared},   {"router", z->bytes_router},
        {"dense FFN", z->bytes_dense_ffn}, {"norms", z->bytes_norm}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (parts[i].v)
            printf("  %-11s %12s  %5.1f%%\n", parts[i].name, moe_cli_bytes(a, sizeof a, (double)parts[i].v),
                   100.0 * (double)parts[i].v / (double)z->bytes_total);
    char c8[32];
    printf("kv cache     %s per token in fp32, %s in bf16/fp16, %s in fp8\n",
           moe_cli_bytes(a, sizeof a, (double)moe_config_kv_bytes_per_token(cfg, MOE_DTYPE_F32)),
           moe_cli_bytes(b, sizeof b, (double)moe_config_kv_bytes_per_token(cfg, MOE_DTYPE_BF16)),
           moe_cli_bytes(c8, sizeof c8, (double)moe_config_kv_bytes_per_token(cfg, MOE_DTYPE_F8E4M3)));
    if (moe_config_linear_layers(cfg) > 0)
        printf("state        %s per sequence in F32 beside the KV cache (a sequence takes it plus the bytes per "
               "token above)\n", moe_cli_bytes(a, sizeof a, (double)moe_config_state_bytes(cfg)));
}


/* The CPU kernel set the fast backend would run here, and why. */
static void print_kernels(void)
{
    struct moe_backend_opts bo;
    moe_cli_backend_opts(&bo, 0);
    const enum moe_cpu_isa best = moe_cpu_isa_detect(), isa = moe_cpu_isa_choose(bo.cpu_isa_max);
    static const char *const inputs[] = {"two bf16 parts (16 bits)", "three bf16 parts (exact)",
                                         "bf16 (8 bits)"};
    printf("cpu kernels  %s", moe_cpu_isa_name(isa));
    const char *env = getenv("MOERUN_CPU_ISA");
    if (isa < best && (!env || !*env))
        printf(" (the default; this processor runs %s too: MOERUN_CPU_ISA=%s)", moe_cpu_isa_name(best),
               moe_cpu_isa_name(best));
    else if (isa < best)
        printf(" (MOERUN_CPU_ISA=%s on this processor's %s)", env, moe_cpu_isa_name(best));
    if (isa == MOE_CPU_ISA_AVX512_BF16)
        printf(" (bf16 products by vdpbf16ps, inputs rounded to bf16 (8 bits); the rest AVX-512)");
    else if (isa >= MOE_CPU_ISA_AMX)
        printf(" (bf16 products on the AMX tiles, inputs in %s;%s the rest AVX-512)", inputs[isa - MOE_CPU_ISA_AMX],
               moe_cpu_amx_int8() ? " Q8_0 and four-bit on the int8 tiles;" : "");
    else if (!getenv("MOERUN_CPU_ISA") && best >= MOE_CPU_ISA_AMX && moe_cpu_amx_int8())
        printf("; amx with --quantize q8_0 or q4");
    printf("\n");
}

int moe_cli_inspect(int argc, char **argv)
{
    struct inspect_opts o;
    moe_cli_engine_defaults(&o.eng);
    struct moe_cli_args args;
    const int rc = moe_cli_parse(&inspect_cmd, argc, argv, &o, &args);
    if (rc >= 0) return rc;
    struct moe_cli_model_opts mo = o.eng.model;
    if (args.n_pos > 0) mo.path = args.pos[0];
    if (args.n_pos > 1) return moe_cli_error("inspect", "unexpected argument '%s'", args.pos[1]);
    /* A synthetic shape is described from its configuration alone, so
     * Mixtral-8x7B-sized configurations need no memory for weights. */
    struct moe_model m = {0};
    struct moe_model_sizes z;
    enum moe_dtype dt = MOE_DTYPE_BF16;
    if (mo.synthetic && !mo.path) {
        if (mo.dtype && !moe_cli_parse_dtype(mo.dtype, &dt))
            return moe_cli_error("inspect", "--dtype '%s' (use f32, f16 or bf16)", mo.dtype);
        if (moe_config_load(&m.cfg, mo.synthetic) != MOE_OK)
            return moe_cli_error("inspect", "%s", moe_last_error());
        moe_config_sizes(&m.cfg, moe_dtype_size(dt), &z);
    } else {
        if (moe_cli_open_model(&m, &mo) != MOE_OK)
            return moe_cli_error("inspect", "%s", moe_last_error());
        moe_model_sizes(&m, &z);
    }
    print_structure(&m, mo.path ? mo.path : mo.synthetic);
    print_sizes(&m.cfg, &z);
    if (m.layers) moe_cli_print_formats(stdout, "formats     ", &m);
    print_kernels();
    moe_model_free(&m);
    return 0;
}
