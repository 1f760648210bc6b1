/* cli_plan.c - `moerun plan`: the memory planner and roofline predictor.
 *
 * Weights are counted by part, in total and as touched per token (an MoE
 * token reads only its K experts of each MoE layer).  The KV cache costs
 * 2 x L x Hkv x Dh x element bytes per token, whatever the experts; so the
 * number of sequences that fit beside the weights is (memory - weights) /
 * (KV per sequence).  Time predictions are rooflines: a step takes the
 * longer of (bytes it must read / bandwidth) and (FLOPs / peak FLOP/s).
 * Decode at batch B reads the non-expert weights once, the experts its B
 * tokens touch (expected E x (1 - (1 - K/E)^B) per MoE layer for uniform
 * routing) and every sequence's KV; prefill of a chunk of P tokens reads
 * all weights once and does P tokens' FLOPs.
 *
 * --gpu-experts C (the CUDA backend's expert offload): C experts of each
 * MoE layer in device memory, the rest in host memory.  A routed expert is
 * found on the device with the hit rate h (C/E for uniform routing, where
 * any policy does as well as LRU; `moerun stats TRACE --cache C` measures
 * it on a real trace); a step copies (1 - h) of its touched experts, and
 * at least all but C of them, over PCIe, not yet overlapped with compute,
 * so the copy time adds to the step's.  Every expert stays in pinned host
 * memory (the checkpoint's own copy comes on top).  With
 * --gpu-experts-cpu-rows R, a step whose touched experts get at most R
 * rows on average (B*K / touched) computes its misses on the CPU instead:
 * each missed expert's weights read once from host memory (--host-bw),
 * overlapped with the device's part of the step, so the step takes the
 * longer of the two. */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <unistd.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "kvcache/kvcache.h"

struct device {
    const char *name;
    double mem_bytes, bw, flops; /* bytes, bytes/s, FLOP/s (bf16 dense) */
    double h2d;                  /* host to device copies, bytes/s (PCIe) */
    const char *note;
};

static const struct device presets[] = {
    /* h2d: PCIe 5.0 x16 (64 GB/s a direction) or 4.0 x16 (32), less what
     * pinned copies typically lose */
    {"h200", 141e9, 4.8e12, 989e12, 55e9, "NVIDIA H200 SXM: 141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s bf16"},
    {"h100", 80e9, 3.35e12, 989e12, 55e9, "NVIDIA H100 SXM: 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s bf16"},
    {"a100", 80e9, 2.039e12, 312e12, 25e9, "NVIDIA A100 SXM 80GB: 2.04 TB/s, 312 TFLOP/s bf16"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moerun plan MODEL_DIR [--ctx N] [--batch B] [--device NAME|BYTES] [options]\n"
            "       moerun plan --synthetic CONFIG.json [--dtype bf16] ...\n\n"
            "Weights by part (total and touched per token), KV bytes per token and per\n"
            "sequence, how many sequences of context N fit beside the weights, FLOPs per\n"
            "token, and roofline predictions of prefill time per token and decode step\n"
            "time at batch B.\n\n"
            "  --ctx N            context length per sequence (default 4096)\n"
            "  --batch B          decode batch size (default 1)\n"
            "  --chunk P          prefill chunk (default 512)\n"
            "  --device D         h200, h100, a100 (default h200), cpu (this machine: memory\n"
            "                     and copy bandwidth measured), or a memory size (80GB)\n"
            "  --bandwidth GB/s   override the memory bandwidth\n"
            "  --tflops T         override the peak compute\n"
            "  --kv-dtype T       f32, f16, bf16, fp8 (default bf16)\n"
            "  --synthetic CONFIG, --dtype T   a configuration instead of a checkpoint\n"
            "  --moe-top-k K    predict with K experts per token instead of the model's top-k\n"
            "  --quantize q8_0  predict with the weights --quantize q8_0 makes (9 bits each,\n"
            "                   routers, the embedding, FP8 and MXFP4 weights as stored)\n"
            "  --gpu-experts C  predict the CUDA expert offload: C experts per MoE layer on\n"
            "                   the device, the others copied in from host memory\n"
            "  --hit-rate H     share of routed experts found on the device (default C/E,\n"
            "                   uniform routing; `moerun stats TRACE --cache C` measures it)\n"
            "  --pcie GB/s      host-to-device copy bandwidth (default 55, a100 25)\n"
            "  --gpu-experts-cpu-rows R  misses of at most R rows a step computed on the CPU\n"
            "  --host-bw GB/s   the CPU's read bandwidth from host memory for those\n"
            "                   (default 100)\n");
}

static double cpu_peak_flops(void)
{
    /* cores x clock x fp32 FLOP per cycle: two FMA units of 16 lanes with
     * AVX-512, of 8 with AVX2 */
    double mhz = 2000;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "cpu MHz", 7)) {
            char *c = strchr(line, ':');
            if (c) mhz = atof(c + 1);
            break;
        }
    if (f) fclose(f);
    __builtin_cpu_init();
    double per_cycle = __builtin_cpu_supports("avx512f") ? 64 : 32;
    return (double)sysconf(_SC_NPROCESSORS_ONLN) * mhz * 1e6 * per_cycle;
}

/* Seconds a step of `tokens` tokens spends copying experts in: of the
 * experts it touches per MoE layer (uniform routing), the share 1 - hit
 * are not on the device, and at least all but C; t1 is the time to copy
 * one expert of every MoE layer. */
static double copy_seconds(double E, double K, double C, double hit, double tokens, double t1)
{
    if (E <= 0 || C >= E) return 0;
    const double uniq = E * (1.0 - pow(1.0 - K / E, tokens));
    return fmax(uniq * (1 - hit), uniq - C) * t1;
}

/* ", + X ms copying experts in at Y GB/s" for a time of `sec`. */
static const char *copy_note(char *buf, size_t n, double sec, double h2d)
{
    snprintf(buf, n, " + %.3f ms copying experts in at %.0f GB/s", sec * 1e3, h2d / 1e9);
    return buf;
}

int moe_cli_plan(int argc, char **argv)
{
    struct moe_cli_model_opts mo = {0};
    long ctx = 4096, batch = 1, chunk = 512;
    const char *dev_arg = "h200", *kv_dtype_arg = "bf16";
    double bw_override = 0, tflops_override = 0;
    static const struct option opts[] = {
        {"ctx", required_argument, 0, 'c'},       {"batch", required_argument, 0, 'b'},
        {"chunk", required_argument, 0, 'p'},     {"device", required_argument, 0, 'D'},
        {"bandwidth", required_argument, 0, 'W'}, {"tflops", required_argument, 0, 'F'},
        {"kv-dtype", required_argument, 0, 'k'},  {"synthetic", required_argument, 0, 's'},
        {"dtype", required_argument, 0, 'd'},     {"help", no_argument, 0, 'h'},
        {"moe-top-k", required_argument, 0, 'K'}, {"quantize", required_argument, 0, 'Q'},
        {"gpu-experts", required_argument, 0, 'G'}, {"hit-rate", required_argument, 0, 'H'},
        {"pcie", required_argument, 0, 'P'},      {"gpu-experts-cpu-rows", required_argument, 0, 'R'},
        {"host-bw", required_argument, 0, 'B'},   {0, 0, 0, 0}};
    long gpu_experts = 0;
    double hit_arg = -1, pcie_arg = 0, host_bw = 100e9;
    long cpu_rows = 0;
    char *end;
    enum moe_weight_quant quant = MOE_QUANT_NONE;
    int c;
    optind = 1;
    while ((c = moe_cli_getopt(argc, argv, "h", opts, "plan")) != -1) {
        switch (c) {
        case 'c':
            if (!moe_cli_parse_int(optarg, 1, 1 << 30, &ctx)) return moe_cli_error("plan", "--ctx '%s'", optarg);
            break;
        case 'b':
            if (!moe_cli_parse_int(optarg, 1, 1 << 20, &batch)) return moe_cli_error("plan", "--batch '%s'", optarg);
            break;
        case 'p':
            if (!moe_cli_parse_int(optarg, 1, 1 << 24, &chunk)) return moe_cli_error("plan", "--chunk '%s'", optarg);
            break;
        case 'D': dev_arg = optarg; break;
        case 'W': bw_override = atof(optarg) * 1e9; break;
        case 'F': tflops_override = atof(optarg) * 1e12; break;
        case 'k': kv_dtype_arg = optarg; break;
        case 's': mo.synthetic = optarg; break;
        case 'd': mo.dtype = optarg; break;
        case 'K':
            if (!moe_cli_parse_int(optarg, 1, 1 << 16, &mo.top_k))
                return moe_cli_error("plan", "--moe-top-k '%s'", optarg);
            break;
        case 'Q':
            if (!moe_cli_parse_quant(optarg, &quant))
                return moe_cli_error("plan", "--quantize '%s' (use q8_0, or none)", optarg);
            break;
        case 'G':
            if (!moe_cli_parse_int(optarg, 1, 1 << 20, &gpu_experts))
                return moe_cli_error("plan", "--gpu-experts '%s'", optarg);
            break;
        case 'H':
            hit_arg = strtod(optarg, &end);
            if (end == optarg || *end || !(hit_arg >= 0 && hit_arg <= 1))
                return moe_cli_error("plan", "--hit-rate '%s' (a share from 0 to 1)", optarg);
            break;
        case 'P':
            pcie_arg = strtod(optarg, &end) * 1e9;
            if (end == optarg || *end || !(pcie_arg > 0 && pcie_arg < 1e15))
                return moe_cli_error("plan", "--pcie '%s' (GB/s)", optarg);
            break;
        case 'R':
            if (!moe_cli_parse_int(optarg, 0, 1 << 20, &cpu_rows))
                return moe_cli_error("plan", "--gpu-experts-cpu-rows '%s'", optarg);
            break;
        case 'B': {
            char *end;
            host_bw = strtod(optarg, &end) * 1e9;
            if (end == optarg || *end || !(host_bw > 0 && host_bw < 1e15))
                return moe_cli_error("plan", "--host-bw '%s' (GB/s)", optarg);
            break;
        }
        case 'h': usage(stdout); return 0;
        default: return 2;
        }
    }
    if (optind < argc) mo.path = argv[optind++];
    if (optind < argc) return moe_cli_error("plan", "unexpected argument '%s'", argv[optind]);
    enum moe_dtype kvt, wdt = MOE_DTYPE_BF16;
    if (!moe_cli_parse_kv_dtype(kv_dtype_arg, &kvt))
        return moe_cli_error("plan", "--kv-dtype '%s' (use " MOE_CLI_KV_DTYPES ")", kv_dtype_arg);
    if (mo.dtype && !moe_cli_parse_dtype(mo.dtype, &wdt)) return moe_cli_error("plan", "--dtype '%s'", mo.dtype);

    struct device dev = presets[0];
    bool found = false;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(dev_arg, presets[i].name)) {
            dev = presets[i];
            found = true;
        }
    char note[256];
    if (!found && !strcmp(dev_arg, "cpu")) {
        dev.name = "cpu";
        dev.mem_bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        dev.bw = moe_cli_copy_bandwidth();
        dev.flops = cpu_peak_flops();
        if (gpu_experts) return moe_cli_error("plan", "--gpu-experts predicts a GPU's expert offload, not --device cpu");
        snprintf(note, sizeof note, "this machine: %ld cores, copy bandwidth measured, peak = cores x "
                 "clock x fp32 FMA lanes x 2 units x 2", sysconf(_SC_NPROCESSORS_ONLN));
        dev.note = note;
    } else if (!found) {
        size_t bytes;
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%s", dev_arg);
        size_t l = strlen(tmp);
        if (l > 2 && !strcasecmp(tmp + l - 2, "GB")) { /* decimal GB, as vendors quote */
            tmp[l - 2] = '\0';
            dev.mem_bytes = atof(tmp) * 1e9;
        } else if (moe_cli_parse_budget(dev_arg, &bytes) == MOE_OK) {
            dev.mem_bytes = (double)bytes;
        } else {
            return moe_cli_error("plan", "--device '%s' (h200, h100, a100, cpu, or a size)", dev_arg);
        }
        dev.name = "custom";
        snprintf(note, sizeof note, "custom memory size; bandwidth and compute of an H200 unless given");
        dev.note = note;
    }
    if (pcie_arg > 0) dev.h2d = pcie_arg;
    if (bw_override > 0) dev.bw = bw_override;
    if (tflops_override > 0) dev.flops = tflops_override;

    struct moe_model m = {0};
    struct moe_model_sizes z;
    if (mo.synthetic && !mo.path) {
        if (moe_config_load(&m.cfg, mo.synthetic) != MOE_OK ||
            (mo.top_k && moe_model_set_top_k(&m, (int)mo.top_k) != MOE_OK))
            return moe_cli_error("plan", "%s", moe_last_error());
        moe_config_sizes(&m.cfg, moe_dtype_size(wdt), &z);
    } else {
        if (moe_cli_open_model(&m, &mo) != MOE_OK) return moe_cli_error("plan", "%s", moe_last_error());
        moe_model_sizes(&m, &z);
    }
    const struct moe_config *cfg = &m.cfg;
    if (quant == MOE_QUANT_Q8_0) {
        /* the parts --quantize q8_0 quantizes, at 9 bits per weight; FP8 and
         * MXFP4 matrices are read as stored, never requantized */
        struct moe_config plain = *cfg;
        plain.weights_fp8 = plain.experts_mxfp4 = false;
        struct moe_model_sizes p;
        moe_config_sizes(&plain, 1, &p); /* parameters per part */
        int64_t *parts[] = {&z.bytes_lm_head, &z.bytes_attn, &z.bytes_dense_ffn, &z.bytes_experts,
                            &z.bytes_shared};
        const int64_t params[] = {cfg->tie_embeddings ? p.bytes_embed : p.bytes_lm_head, p.bytes_attn,
                                  p.bytes_dense_ffn, p.bytes_experts, p.bytes_shared};
        const bool as_stored[] = {false, cfg->weights_fp8, cfg->weights_fp8,
                                  cfg->weights_fp8 || cfg->experts_mxfp4, cfg->weights_fp8};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            if (!as_stored[i]) *parts[i] = params[i] * 9 / 8;
        z.bytes_total = z.bytes_embed + z.bytes_lm_head + z.bytes_attn + z.bytes_dense_ffn +
                        z.bytes_experts + z.bytes_shared + z.bytes_router + z.bytes_norm;
    }
    char a[96], b[96], d[32];
    const double W = (double)z.bytes_total, E = cfg->n_experts, K = cfg->top_k;
    const int n_moe = moe_config_moe_layers(cfg);
    const double expert_bytes_layer = n_moe ? (double)z.bytes_experts / n_moe : 0; /* all E */
    const double one_expert = E > 0 ? expert_bytes_layer / E : 0;
    const double non_expert = W - (double)z.bytes_experts - (double)z.bytes_embed; /* embedding: rows only */
    const double touched = non_expert + n_moe * K * one_expert;
    /* --gpu-experts: the experts of each MoE layer past C stay in host memory */
    const bool off = gpu_experts > 0 && n_moe > 0 && gpu_experts < cfg->n_experts;
    const double C = off ? (double)gpu_experts : E;
    const double hit = !off ? 1 : hit_arg >= 0 ? hit_arg : C / E;
    /* every expert is pinned in host memory; the device holds C per layer */
    const double host_bytes = off ? (double)z.bytes_experts : 0,
                 Wdev = off ? W - n_moe * (E - C) * one_expert : W;
    printf("model        %s (%s)\n", mo.path ? mo.path : mo.synthetic, cfg->architecture);
    printf("device       %s: %s\n", dev.name, dev.note);
    if (dev.bw >= 1e12)
        printf("             %s memory, %.2f TB/s, %.0f TFLOP/s\n", moe_cli_bytes(a, sizeof a, dev.mem_bytes),
               dev.bw / 1e12, dev.flops / 1e12);
    else
        printf("             %s memory, %.2f GB/s, %.0f GFLOP/s\n", moe_cli_bytes(a, sizeof a, dev.mem_bytes),
               dev.bw / 1e9, dev.flops / 1e9);
    printf("\nweights      %s in total\n", moe_cli_bytes(a, sizeof a, W));
    const struct { const char *n; int64_t v; } parts[] = {
        {"embeddings", z.bytes_embed}, {"lm head", z.bytes_lm_head}, {"attention", z.bytes_attn},
        {"dense FFN", z.bytes_dense_ffn}, {"experts", z.bytes_experts}, {"shared", z.bytes_shared},
        {"router", z.bytes_router}, {"norms", z.bytes_norm}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (parts[i].v)
            printf("  %-11s %12s  %5.1f%%\n", parts[i].n, moe_cli_bytes(a, sizeof a, (double)parts[i].v),
                   100.0 * (double)parts[i].v / W);
    printf("touched      %s per token (%.1f%% of the weights: %s%d of %d experts per MoE layer)\n",
           moe_cli_bytes(a, sizeof a, touched), 100.0 * touched / W, n_moe ? "" : "dense, ",
           n_moe ? cfg->top_k : 0, cfg->n_experts);

    if (off)
        printf("offload      %ld of %d experts per MoE layer on the device: %s of weights there, every "
               "expert (%s) in pinned host memory; hit rate %.3f%s\n", gpu_experts, cfg->n_experts,
               moe_cli_bytes(a, sizeof a, Wdev), moe_cli_bytes(b, sizeof b, host_bytes), hit,
               hit_arg >= 0 ? "" : " (uniform routing: C/E)");
    const double kv_tok = (double)moe_config_kv_bytes_per_token(cfg, kvt);
    const double kv_seq = kv_tok * (double)ctx;
    printf("\nkv cache     %s per token (%s), %s per sequence of %ld tokens\n",
           moe_cli_bytes(a, sizeof a, kv_tok), moe_dtype_name(kvt), moe_cli_bytes(b, sizeof b, kv_seq), ctx);
    const double usable = dev.mem_bytes * 0.9; /* leave room for activations and the runtime */
    if (Wdev >= usable) {
        printf("fit          the weights (%s) do not fit in 90%% of %s\n", moe_cli_bytes(a, sizeof a, Wdev),
               moe_cli_bytes(b, sizeof b, dev.mem_bytes));
    } else {
        double left = usable - Wdev;
        printf("fit          %s left beside the weights (90%% of memory usable): %.0f sequences of %ld "
               "tokens (%s tokens in all)\n", moe_cli_bytes(a, sizeof a, left), floor(left / kv_seq), ctx,
               moe_cli_count(d, sizeof d, floor(left / kv_tok)));
    }
    /* FLOPs per token: 2 per touched weight (embedding rows excluded), plus
     * attention: QK^T and PV, 2 * 2 * Hq * Dh per cached position per layer. */
    const double active_params = (double)z.params_active - (double)cfg->vocab * cfg->d_model;
    const double f_tok = 2.0 * active_params;
    const double f_attn = 4.0 * cfg->n_layers * (double)cfg->n_heads * cfg->head_dim * (double)ctx;
    printf("\nflops        %s per token in the weights, + %s for attention at context %ld\n",
           moe_cli_count(a, sizeof a, f_tok), moe_cli_count(b, sizeof b, f_attn), ctx);
    /* prefill: a chunk of P tokens at half context on average */
    const double f_attn_prefill = 4.0 * cfg->n_layers * (double)cfg->n_heads * cfg->head_dim * (double)chunk / 2;
    double p_compute = (double)chunk * (f_tok + f_attn_prefill) / dev.flops;
    double p_memory = Wdev / dev.bw;
    double p_time = p_compute > p_memory ? p_compute : p_memory;
    const double p_copy = copy_seconds(E, K, C, hit, (double)chunk, n_moe * one_expert / dev.h2d);
    printf("prefill      chunk of %ld: %.3f ms per token (%s-bound%s), %.0f tokens/s\n", chunk,
           (p_time + p_copy) / (double)chunk * 1e3, p_compute > p_memory ? "compute" : "memory",
           off ? copy_note(a, sizeof a, p_copy / (double)chunk, dev.h2d) : "", (double)chunk / (p_time + p_copy));
    /* decode at batch B */
    double uniq = E > 0 ? E * (1.0 - pow(1.0 - K / E, (double)batch)) : 0;
    double d_bytes = non_expert + n_moe * uniq * one_expert + (double)batch * kv_seq;
    double d_compute = (double)batch * (f_tok + f_attn) / dev.flops;
    double d_memory = d_bytes / dev.bw;
    double d_time = d_compute > d_memory ? d_compute : d_memory;
    double d_copy = copy_seconds(E, K, C, hit, (double)batch, n_moe * one_expert / dev.h2d), d_step = d_time + d_copy;
    /* --gpu-experts-cpu-rows: the same misses read by the CPU from host
     * memory, beside the device's part of the step */
    const bool on_cpu = off && cpu_rows > 0 && uniq > 0 && (double)batch * K / uniq <= (double)cpu_rows;
    if (on_cpu) {
        d_copy = copy_seconds(E, K, C, hit, (double)batch, n_moe * one_expert / host_bw);
        d_step = fmax(d_time, d_copy);
        snprintf(b, sizeof b, "; misses read by the CPU at %.0f GB/s: %.3f ms, overlapped", host_bw / 1e9,
                 d_copy * 1e3);
    }
    printf("decode       batch %ld at context %ld: reads %s per step (%.1f of %d experts per MoE layer "
           "touched), %.3f ms per step (%s-bound%s), %.0f tokens/s\n", batch, ctx,
           moe_cli_bytes(a, sizeof a, d_bytes), uniq, cfg->n_experts, d_step * 1e3,
           d_compute > d_memory ? "compute" : "memory",
           on_cpu ? b : off ? copy_note(b, sizeof b, d_copy, dev.h2d) : "", (double)batch / d_step);
    moe_model_free(&m);
    return 0;
}
