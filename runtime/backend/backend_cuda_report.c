/* backend_cuda_report.c - the lines the CUDA backend's prepare_model
 * prints on stderr once the weights are on the device: bytes resident by
 * part and free memory, the offload, and which weights are read in place
 * or were quantized on the device, in which formats and by which option.
 * Calls no other file of the room. */
#include <stdio.h>
#include <string.h>

#include "runtime/backend/backend_cuda_impl.h"

const char *moe_cuda_quant_name(enum moe_weight_quant q)
{
    return q == MOE_QUANT_Q4_K_M ? "q4_k_m" : q == MOE_QUANT_Q4 ? "q4" : "q8_0";
}

enum moe_status moe_cuda_report_load(struct cuda_ctx *c, const struct moe_backend *be, const struct moe_config *cfg)
{
    const struct moe_offload_opts *oo = &c->off.opts;
    size_t fr = 0, tot = 0, all = 0;
    MOE_CUDA_TRY(cudaMemGetInfo(&fr, &tot));
    char line[512];
    int off = 0;
    for (int p = 0; p < P_COUNT; p++) {
        all += c->mem.part_bytes[p];
        if (c->mem.part_bytes[p] && off < (int)sizeof line)
            off += snprintf(line + off, sizeof line - (size_t)off, " %s %.2f", moe_cuda_part_names[p],
                            c->mem.part_bytes[p] / 1073741824.0);
    }
    fprintf(stderr, "moerun: cuda: weights resident %.2f GiB (%s ) free %.2f of %.2f GiB\n",
            all / 1073741824.0, line, fr / 1073741824.0, tot / 1073741824.0);
    if (c->off.n)
        fprintf(stderr, "moerun: cuda: experts offloaded: %d of %d per MoE layer in device slots, all of "
                "them in %.2f GiB of pinned host memory, copied in when routed to (%d layers)%s\n",
                oo->gpu_experts, cfg->n_experts, c->off.host_bytes / 1073741824.0, c->off.n,
                oo->cpu_rows > 0 ? "; missed experts with few rows computed on the CPU" : "");
    if (c->weights.mxfp4_experts || c->weights.fp8_experts || c->weights.fp8_dense)
        fprintf(stderr, "moerun: cuda: %s%s%s%s resident as stored, read in place\n",
                c->weights.mxfp4_experts ? "MXFP4 experts" : "", c->weights.mxfp4_experts && c->weights.fp8_experts ? ", " : "",
                c->weights.fp8_experts ? "FP8 experts" : "",
                c->weights.fp8_dense ? (c->weights.mxfp4_experts || c->weights.fp8_experts ? ", FP8 projections" : "FP8 projections") : "");
    if (c->mixed_layers)
        fprintf(stderr, "moerun: cuda: --expert-dtype-plan: %d MoE layers hold their experts in several formats, "
                "one stack per format\n", c->mixed_layers);
    if (c->weights.q8_experts || c->weights.q8_dense)
        fprintf(stderr, "moerun: cuda: %s quantized to Q8_0 on the device (--quantize %s), read in place\n",
                c->weights.q8_experts && c->weights.q8_dense ? "experts and projections" : c->weights.q8_experts ? "experts" : "projections",
                be->expert_quant ? "--quantize, --expert-dtype-plan" : moe_cuda_quant_name(be->quant));
    if (c->weights.q4_k_made || c->weights.q4_1_made || c->weights.q6_k_made) {
        char made[32] = "";
        const char *fmts[3] = {c->weights.q4_k_made ? "Q4_K" : NULL, c->weights.q4_1_made ? "Q4_1" : NULL,
                               c->weights.q6_k_made ? "Q6_K" : NULL};
        for (int i = 0; i < 3; i++)
            if (fmts[i]) snprintf(made + strlen(made), sizeof made - strlen(made), "%s%s", made[0] ? ", " : "", fmts[i]);
        fprintf(stderr, "moerun: cuda: %s quantized to %s on the device (--quantize %s%s: Q4_K where rows are "
                "multiples of 256, else Q4_1%s), read in place\n",
                c->weights.q4_experts && c->weights.q4_dense ? "experts and projections"
                : c->weights.q4_experts ? "experts" : "projections", made, moe_cuda_quant_name(be->quant),
                be->expert_quant ? ", --expert-dtype-plan" : "",
                be->quant == MOE_QUANT_Q4_K_M ? "; Q6_K or Q8_0 where llama.cpp's Q4_K_M says" : "; the LM head to Q8_0");
    }
    else if (c->weights.q4_experts || c->weights.q4_dense)
        fprintf(stderr, "moerun: cuda: four-bit %s resident as stored, read in place\n",
                c->weights.q4_experts && c->weights.q4_dense ? "experts and projections"
                : c->weights.q4_experts ? "experts" : "projections");
    if (c->weights.widened_fp8)
        fprintf(stderr, "moerun: cuda: other FP8 weights widened to bf16 at upload (each rounded once: "
                "1.9x their bytes)\n");
    return MOE_OK;
}
