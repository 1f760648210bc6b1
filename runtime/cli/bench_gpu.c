/* bench_gpu.c - see bench_gpu.h.  The roofline arithmetic and reporting
 * live here, in plain C; runtime/cli/bench_cuda.cu does the measuring.
 *
 * Roofline of batch-1 decode: a step must read every weight it uses once,
 * which is everything except the embedding table (one row) and the experts
 * a token does not choose (K of E per MoE layer), plus its K/V cache
 * (ctx tokens).  tokens/s at the roofline = bandwidth / those bytes, with
 * the bandwidth of a device-to-device copy measured on the spot. */
#include "runtime/cli/bench_gpu.h"

#include <stdio.h>

#include "runtime/cli/cli_common.h"

#ifndef MOERUN_HAVE_CUDA
enum moe_status moe_bench_copy_bandwidth(size_t bytes, double *bytes_per_s)
{
    *bytes_per_s = 0;
    return moe_fail(MOE_ERR_UNSUPPORTED, "copy bandwidth: moerun was built without CUDA");
}

enum moe_status moe_bench_grouped_gemm(int tokens, int E, int K, int D, int F,
                                       double *grouped_tflops, double *dense_tflops, double *loop_tflops)
{
    *grouped_tflops = *dense_tflops = *loop_tflops = 0;
    return moe_fail(MOE_ERR_UNSUPPORTED, "grouped GEMM benchmark: moerun was built without CUDA");
}

enum moe_status moe_bench_expert_kernels(enum moe_dtype dt, int batch, int E, int K, int D, int F,
                                         double *seconds, double *bytes)
{
    *seconds = *bytes = 0;
    return moe_fail(MOE_ERR_UNSUPPORTED, "expert kernel benchmark: moerun was built without CUDA");
}
#endif

/* The expert kernels at each batch size, in each weight dtype the model's
 * shape allows: bf16 always, MXFP4, Q8_0 and Q4_1 when D and F are
 * multiples of 32, FP8 and Q4_G128 of 128, Q4_K of 256; bandwidth against bw (device
 * copy, read + written). */
static int expert_kernels(const struct moe_config *c, const struct moe_bench_gpu_opts *o, double bw,
                          json_t *g, bool json)
{
    const enum moe_dtype dts[] = {MOE_DTYPE_BF16, MOE_DTYPE_MXFP4,  MOE_DTYPE_FP8_B128,
                                  MOE_DTYPE_Q8_0, MOE_DTYPE_Q4_1, MOE_DTYPE_Q4_G128, MOE_DTYPE_Q4_K};
    const int blk[] = {1, MOE_MXFP4_BLOCK, MOE_FP8_BLOCK, MOE_Q8_0_BLOCK, 32, 128, MOE_Q4_K_BLOCK};
    json_t *arr = json_array();
    json_object_set_new(g, "expert_kernels", arr);
    for (int i = 0; i < o->n_expert; i++)
        for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
            if (c->d_model % blk[k] || c->d_expert % blk[k]) continue;
            double t, bytes;
            if (moe_bench_expert_kernels(dts[k], o->expert_batches[i], c->n_experts, c->top_k, c->d_model,
                                         c->d_expert, &t, &bytes) != MOE_OK)
                return moe_cli_error("bench", "%s", moe_last_error());
            const double gbs = t > 0 ? bytes / t / 1e9 : 0, frac = bw > 0 ? bytes / t / bw : 0;
            json_array_append_new(arr, json_pack("{s:i, s:s, s:f, s:f, s:f, s:f}", "batch", o->expert_batches[i],
                                                 "dtype", moe_dtype_name(dts[k]), "us", t * 1e6, "weight_bytes",
                                                 bytes, "GBps", gbs, "copy_bandwidth_fraction", frac));
            if (!json)
                printf("%-10s %8d %9.1f us %-8s %7.1f GB/s of weights (%.0f%% of the copy bandwidth)\n",
                       "experts", o->expert_batches[i], t * 1e6, moe_dtype_name(dts[k]), gbs, 100 * frac);
        }
    return 0;
}

int moe_bench_gpu_extras(const struct moe_model *m, const struct moe_bench_gpu_opts *o,
                         const struct moe_bench_decode *dec, int n_dec, json_t *out, bool json)
{
    const struct moe_config *c = &m->cfg;
    json_t *g = json_object();
    json_object_set_new(out, "gpu", g);
    double bw = 0;
    if ((o->copy_bandwidth || o->n_expert > 0) && moe_bench_copy_bandwidth((size_t)1 << 30, &bw) != MOE_OK)
        return moe_cli_error("bench", "%s", moe_last_error());
    if (o->copy_bandwidth) {
        struct moe_model_sizes z;
        moe_model_sizes(m, &z);
        const int E = c->n_experts > 0 ? c->n_experts : 1, K = c->top_k;
        double experts_active = c->n_experts > 0 ? (double)z.bytes_experts * K / E : 0.0;
        double kv = (double)o->ctx * (double)moe_config_kv_bytes_per_token(c, o->kv_dtype);
        double head = c->tie_embeddings ? (double)z.bytes_embed : 0.0; /* the LM head reads it */
        double step_bytes = (double)z.bytes_total - (double)z.bytes_embed - (double)z.bytes_experts +
                            experts_active + head + kv;
        double roof_tps = bw / step_bytes;
        double t_experts = (double)z.bytes_experts / bw;
        json_object_set_new(g, "copy_bandwidth_GBps", json_real(bw / 1e9));
        json_object_set_new(g, "decode_bytes_per_step_batch1", json_real(step_bytes));
        json_object_set_new(g, "roofline_tokens_per_s_batch1", json_real(roof_tps));
        json_object_set_new(g, "read_all_experts_ms", json_real(t_experts * 1e3));
        if (!json) {
            printf("%-10s %8s %12.1f GB/s (device-to-device copy, read+write)\n", "bandwidth", "",
                   bw / 1e9);
            printf("%-10s %8d %12.1f tokens/s at the roofline (%.2f GB per step)\n", "roofline", 1,
                   roof_tps, step_bytes / 1e9);
        }
        json_t *darr = json_array();
        json_object_set_new(g, "decode", darr);
        for (int i = 0; i < n_dec; i++) {
            json_t *d = json_object();
            json_object_set_new(d, "batch", json_integer(dec[i].batch));
            json_object_set_new(d, "step_ms", json_real(dec[i].step_s * 1e3));
            json_object_set_new(d, "step_over_read_all_experts",
                                json_real(t_experts > 0 ? dec[i].step_s / t_experts : 0));
            if (dec[i].batch == 1) {
                json_object_set_new(d, "roofline_fraction", json_real(dec[i].tokens_per_s / roof_tps));
                if (!json)
                    printf("%-10s %8d %11.1f%% of the HBM roofline\n", "decode", 1,
                           100.0 * dec[i].tokens_per_s / roof_tps);
            }
            if (!json && t_experts > 0)
                printf("%-10s %8d %9.2f ms/step = %.2fx the time to read every expert once "
                       "(%.2f ms)\n", "decode", dec[i].batch, dec[i].step_s * 1e3,
                       dec[i].step_s / t_experts, t_experts * 1e3);
            json_array_append_new(darr, d);
        }
    }
    if (o->n_gemm > 0) {
        if (c->n_experts <= 0) return moe_cli_error("bench", "--gemm-compare needs a MoE model");
        json_t *arr = json_array();
        json_object_set_new(g, "grouped_gemm", arr);
        for (int i = 0; i < o->n_gemm; i++) {
            double gt, dt, lt;
            if (moe_bench_grouped_gemm(o->gemm_tokens[i], c->n_experts, c->top_k, c->d_model,
                                       c->d_expert, &gt, &dt, &lt) != MOE_OK)
                return moe_cli_error("bench", "%s", moe_last_error());
            json_array_append_new(arr, json_pack("{s:i, s:f, s:f, s:f, s:f, s:f}", "tokens", o->gemm_tokens[i],
                                                 "grouped_tflops", gt, "dense_tflops", dt,
                                                 "ratio", dt > 0 ? gt / dt : 0.0, "loop_tflops", lt,
                                                 "loop_ratio", dt > 0 ? lt / dt : 0.0));
            if (!json)
                printf("%-10s %8d %9.1f TFLOP/s grouped, %.1f a GEMM per expert, %.1f dense (%.0f%%, %.0f%%)\n",
                       "gemm", o->gemm_tokens[i], gt, lt, dt, dt > 0 ? 100.0 * gt / dt : 0.0,
                       dt > 0 ? 100.0 * lt / dt : 0.0);
        }
    }
    if (o->n_expert > 0) {
        if (c->n_experts <= 0) return moe_cli_error("bench", "--expert-kernels needs a MoE model");
        return expert_kernels(c, o, bw, g, json);
    }
    return 0;
}
