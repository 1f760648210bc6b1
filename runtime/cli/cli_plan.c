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
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_opts.h"
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

struct plan_opts {
    struct moe_cli_engine eng; /* the model, --kv-dtype, --quantize, --gpu-experts(-cpu-rows) */
    long ctx, batch, chunk;
    const char *device;
    double bandwidth, tflops;  /* GB/s, TFLOP/s; 0: the device's */
    double hit_rate;           /* -1: C/E */
    double pcie, host_bw;      /* GB/s; pcie 0: the device's */
};

#define CMD(member) .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct plan_opts, member)
static const struct moe_cli_opt rows[] = {
    {.name = "ctx", .arg = "N", .kind = MOE_CLI_INT, CMD(ctx), .lo = 1, .hi = 1 << 30,
     .help = "context length per sequence (default 4096)"},
    {.name = "batch", .arg = "B", .kind = MOE_CLI_INT, CMD(batch), .lo = 1, .hi = 1 << 20,
     .help = "decode batch size (default 1)"},
    {.name = "chunk", .arg = "P", .kind = MOE_CLI_INT, CMD(chunk), .lo = 1, .hi = 1 << 24,
     .help = "prefill chunk (default 512)"},
    {.name = "device", .arg = "D", .kind = MOE_CLI_STRING, CMD(device),
     .help = "h200, h100, a100 (default h200), cpu (this machine: memory\n"
             "and copy bandwidth measured), or a memory size (80GB)"},
    {.name = "bandwidth", .arg = "GB/s", .kind = MOE_CLI_DOUBLE, CMD(bandwidth), .lo = 0, .hi = 1e6,
     .open = MOE_CLI_LO_OPEN,
     .help = "override the memory bandwidth"},
    {.name = "tflops", .arg = "T", .kind = MOE_CLI_DOUBLE, CMD(tflops), .lo = 0, .hi = 1e6,
     .open = MOE_CLI_LO_OPEN,
     .help = "override the peak compute"},
    {.name = "hit-rate", .arg = "H", .kind = MOE_CLI_DOUBLE, CMD(hit_rate), .lo = 0, .hi = 1,
     .help = "share of routed experts found on the device (default C/E,\n"
             "uniform routing; `moerun stats TRACE --cache C` measures it)"},
    {.name = "pcie", .arg = "GB/s", .kind = MOE_CLI_DOUBLE, CMD(pcie), .lo = 0, .hi = 1e6,
     .open = MOE_CLI_LO_OPEN,
     .help = "host-to-device copy bandwidth (default 55, a100 25)"},
    {.name = "host-bw", .arg = "GB/s", .kind = MOE_CLI_DOUBLE, CMD(host_bw), .lo = 0, .hi = 1e6,
     .open = MOE_CLI_LO_OPEN,
     .help = "the CPU's read bandwidth from host memory for the misses\n"
             "of --gpu-experts-cpu-rows (default 100)"},
};
#undef CMD

static const char *const shared[] = {"synthetic", "dtype", "moe-top-k", "kv-dtype", "quantize", "gpu-experts",
                                     "gpu-experts-cpu-rows", NULL};

static const struct moe_cli_command plan_cmd = {
    .name = "plan",
    .usage = "usage: moerun plan MODEL_DIR [--ctx N] [--batch B] [--device NAME|BYTES] [options]\n"
             "       moerun plan --synthetic CONFIG.json [--dtype bf16] ...\n\n"
             "Weights by part (total and touched per token), KV bytes per token and per\n"
             "sequence, how many sequences of context N fit beside the weights, FLOPs per\n"
             "token, and roofline predictions of prefill time per token and decode step\n"
             "time at batch B.\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
    .shared = shared,
    .footer = "The model and engine options are predicted with: --moe-top-k K experts per\n"
             "token; --quantize q8_0's weights (9 bits each; routers, the embedding, FP8 and\n"
             "MXFP4 weights as stored); --gpu-experts C experts of each MoE layer on the\n"
             "device, the others copied in from host memory; --gpu-experts-cpu-rows R:\n"
             "misses of at most R rows a step computed on the CPU.  --kv-dtype defaults to\n"
             "bf16 here.\n",
    .engine_at = offsetof(struct plan_opts, eng),
};

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

/* Parses the command line into o; -1 to go on, else the exit code. */
static int plan_parse(int argc, char **argv, struct plan_opts *o)
{
    *o = (struct plan_opts){.ctx = 4096, .batch = 1, .chunk = 512, .device = "h200", .hit_rate = -1,
                            .host_bw = 100};
    moe_cli_engine_defaults(&o->eng);
    o->eng.kv_dtype = "bf16";
    struct moe_cli_args a;
    const int rc = moe_cli_parse(&plan_cmd, argc, argv, o, &a);
    if (rc >= 0) return rc;
    if (a.n_pos > 0) o->eng.model.path = a.pos[0];
    if (a.n_pos > 1) return moe_cli_error("plan", "unexpected argument '%s'", a.pos[1]);
    return -1;
}

/* --device, with --pcie, --bandwidth and --tflops over its figures; note
 * holds the description of a device that is not a preset. */
static int plan_device(const struct plan_opts *o, struct device *dev, char *note, size_t n)
{
    *dev = presets[0];
    bool found = false;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(o->device, presets[i].name)) {
            *dev = presets[i];
            found = true;
        }
    if (!found && !strcmp(o->device, "cpu")) {
        if (o->eng.gpu_experts)
            return moe_cli_error("plan", "--gpu-experts predicts a GPU's expert offload, not --device cpu");
        dev->name = "cpu";
        dev->mem_bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        dev->bw = moe_cli_copy_bandwidth();
        dev->flops = cpu_peak_flops();
        snprintf(note, n, "this machine: %ld cores, copy bandwidth measured, peak = cores x clock x fp32 FMA "
                 "lanes x 2 units x 2", sysconf(_SC_NPROCESSORS_ONLN));
        dev->note = note;
    } else if (!found) {
        size_t bytes;
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%s", o->device);
        const size_t l = strlen(tmp);
        if (l > 2 && !strcasecmp(tmp + l - 2, "GB")) { /* decimal GB, as vendors quote */
            tmp[l - 2] = '\0';
            dev->mem_bytes = atof(tmp) * 1e9;
        } else if (moe_cli_parse_budget(o->device, &bytes) == MOE_OK) {
            dev->mem_bytes = (double)bytes;
        } else {
            return moe_cli_error("plan", "--device '%s' (h200, h100, a100, cpu, or a size)", o->device);
        }
        dev->name = "custom";
        snprintf(note, n, "custom memory size; bandwidth and compute of an H200 unless given");
        dev->note = note;
    }
    if (o->pcie > 0) dev->h2d = o->pcie * 1e9;
    if (o->bandwidth > 0) dev->bw = o->bandwidth * 1e9;
    if (o->tflops > 0) dev->flops = o->tflops * 1e12;
    return 0;
}

/* The bytes of the parts --quantize q8_0 quantizes, at 9 bits per weight;
 * FP8 and MXFP4 matrices are read as stored, never requantized. */
static void q8_sizes(const struct moe_config *cfg, struct moe_model_sizes *z)
{
    struct moe_config plain = *cfg;
    plain.weights_fp8 = plain.experts_mxfp4 = false;
    struct moe_model_sizes p;
    moe_config_sizes(&plain, 1, &p); /* parameters per part */
    int64_t *parts[] = {&z->bytes_lm_head, &z->bytes_attn, &z->bytes_dense_ffn, &z->bytes_experts, &z->bytes_shared};
    const int64_t params[] = {cfg->tie_embeddings ? p.bytes_embed : p.bytes_lm_head, p.bytes_attn,
                              p.bytes_dense_ffn, p.bytes_experts, p.bytes_shared};
    const bool as_stored[] = {false, cfg->weights_fp8, cfg->weights_fp8, cfg->weights_fp8 || cfg->experts_mxfp4,
                              cfg->weights_fp8};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (!as_stored[i]) *parts[i] = params[i] * 9 / 8;
    z->bytes_total = z->bytes_embed + z->bytes_lm_head + z->bytes_attn + z->bytes_dense_ffn + z->bytes_experts +
                     z->bytes_shared + z->bytes_router + z->bytes_norm;
}

/* The model's configuration (a --synthetic shape from its config alone) and its bytes by part. */
static int plan_model(const struct plan_opts *o, struct moe_model *m, struct moe_model_sizes *z)
{
    const struct moe_cli_model_opts *mo = &o->eng.model;
    enum moe_dtype wdt = MOE_DTYPE_BF16;
    if (mo->dtype) (void)moe_cli_parse_dtype(mo->dtype, &wdt); /* checked when parsed */
    if (mo->synthetic && !mo->path) {
        if (moe_config_load(&m->cfg, mo->synthetic) != MOE_OK ||
            (mo->top_k && moe_model_set_top_k(m, (int)mo->top_k) != MOE_OK))
            return moe_cli_error("plan", "%s", moe_last_error());
        moe_config_sizes(&m->cfg, moe_dtype_size(wdt), z);
    } else {
        if (moe_cli_open_model(m, mo) != MOE_OK) return moe_cli_error("plan", "%s", moe_last_error());
        moe_model_sizes(m, z);
    }
    enum moe_weight_quant q = MOE_QUANT_NONE;
    if (o->eng.quantize) (void)moe_cli_parse_quant(o->eng.quantize, &q);
    if (q == MOE_QUANT_Q8_0) q8_sizes(&m->cfg, z);
    return 0;
}

/* What plan predicts: the text report reads only this. */
struct plan_result {
    const char *model, *architecture;
    struct device dev;
    struct moe_model_sizes z;
    double W, touched;                 /* weight bytes in total, touched per token */
    int n_moe, n_experts, top_k;
    bool off, hit_given;               /* --gpu-experts offloads some experts; --hit-rate given */
    long gpu_experts;
    double hit, Wdev, host_bytes;      /* hit rate, bytes on the device, pinned host bytes */
    enum moe_dtype kv;
    long ctx, chunk, batch;
    double kv_tok, kv_seq;             /* KV bytes per token, per sequence of ctx */
    double f_tok, f_attn;              /* FLOPs per token in the weights, in attention at ctx */
    double p_time, p_copy;             /* prefill: a chunk's roofline time, its copies */
    bool p_compute_bound;
    double uniq, d_bytes, d_step, d_copy; /* decode: experts touched per layer, bytes read, step, copies */
    bool d_compute_bound, on_cpu;      /* on_cpu: the misses read by the CPU (--gpu-experts-cpu-rows) */
    double host_bw;
};

static void plan_compute(const struct plan_opts *o, const struct moe_config *cfg, struct plan_result *r)
{
    const struct moe_model_sizes *z = &r->z;
    const struct device *dev = &r->dev;
    const double W = (double)z->bytes_total, E = cfg->n_experts, K = cfg->top_k;
    const int n_moe = moe_config_moe_layers(cfg);
    const double one_expert = n_moe && E > 0 ? (double)z->bytes_experts / n_moe / E : 0;
    const double non_expert = W - (double)z->bytes_experts - (double)z->bytes_embed; /* embedding: rows only */
    r->W = W;
    r->n_moe = n_moe;
    r->n_experts = cfg->n_experts;
    r->top_k = cfg->top_k;
    r->touched = non_expert + n_moe * K * one_expert;
    /* --gpu-experts: the experts of each MoE layer past C stay in host memory */
    r->off = o->eng.gpu_experts > 0 && n_moe > 0 && o->eng.gpu_experts < cfg->n_experts;
    r->gpu_experts = o->eng.gpu_experts;
    const double C = r->off ? (double)o->eng.gpu_experts : E;
    r->hit_given = o->hit_rate >= 0;
    r->hit = !r->off ? 1 : r->hit_given ? o->hit_rate : C / E;
    /* every expert is pinned in host memory; the device holds C per layer */
    r->host_bytes = r->off ? (double)z->bytes_experts : 0;
    r->Wdev = r->off ? W - n_moe * (E - C) * one_expert : W;
    r->kv_tok = (double)moe_config_kv_bytes_per_token(cfg, r->kv);
    r->kv_seq = r->kv_tok * (double)o->ctx;
    /* FLOPs per token: 2 per touched weight (embedding rows excluded), plus
     * attention: QK^T and PV, 2 * 2 * Hq * Dh per cached position per layer. */
    r->f_tok = 2.0 * ((double)z->params_active - (double)cfg->vocab * cfg->d_model);
    const double f_pos = 4.0 * cfg->n_layers * (double)cfg->n_heads * cfg->head_dim;
    r->f_attn = f_pos * (double)o->ctx;
    /* prefill: a chunk of P tokens at half context on average, reading the weights once */
    const double p_compute = (double)o->chunk * (r->f_tok + f_pos * (double)o->chunk / 2) / dev->flops,
                 p_memory = r->Wdev / dev->bw;
    r->p_compute_bound = p_compute > p_memory;
    r->p_time = fmax(p_compute, p_memory);
    r->p_copy = copy_seconds(E, K, C, r->hit, (double)o->chunk, n_moe * one_expert / dev->h2d);
    /* decode at batch B */
    r->uniq = E > 0 ? E * (1.0 - pow(1.0 - K / E, (double)o->batch)) : 0;
    r->d_bytes = non_expert + n_moe * r->uniq * one_expert + (double)o->batch * r->kv_seq;
    const double d_compute = (double)o->batch * (r->f_tok + r->f_attn) / dev->flops, d_memory = r->d_bytes / dev->bw,
                 d_time = fmax(d_compute, d_memory);
    r->d_compute_bound = d_compute > d_memory;
    r->d_copy = copy_seconds(E, K, C, r->hit, (double)o->batch, n_moe * one_expert / dev->h2d);
    r->d_step = d_time + r->d_copy;
    /* --gpu-experts-cpu-rows: the same misses read by the CPU from host
     * memory, beside the device's part of the step */
    const double cpu_rows = (double)o->eng.gpu_experts_cpu_rows;
    r->on_cpu = r->off && cpu_rows > 0 && r->uniq > 0 && (double)o->batch * K / r->uniq <= cpu_rows;
    if (r->on_cpu) {
        r->d_copy = copy_seconds(E, K, C, r->hit, (double)o->batch, n_moe * one_expert / r->host_bw);
        r->d_step = fmax(d_time, r->d_copy);
    }
}

static void print_weights(const struct plan_result *r)
{
    char a[96], b[96];
    const struct device *dev = &r->dev;
    const struct moe_model_sizes *z = &r->z;
    printf("model        %s (%s)\n", r->model, r->architecture);
    printf("device       %s: %s\n", dev->name, dev->note);
    if (dev->bw >= 1e12)
        printf("             %s memory, %.2f TB/s, %.0f TFLOP/s\n", moe_cli_bytes(a, sizeof a, dev->mem_bytes),
               dev->bw / 1e12, dev->flops / 1e12);
    else
        printf("             %s memory, %.2f GB/s, %.0f GFLOP/s\n", moe_cli_bytes(a, sizeof a, dev->mem_bytes),
               dev->bw / 1e9, dev->flops / 1e9);
    printf("\nweights      %s in total\n", moe_cli_bytes(a, sizeof a, r->W));
    const struct { const char *n; int64_t v; } parts[] = {
        {"embeddings", z->bytes_embed}, {"lm head", z->bytes_lm_head}, {"attention", z->bytes_attn},
        {"dense FFN", z->bytes_dense_ffn}, {"experts", z->bytes_experts}, {"shared", z->bytes_shared},
        {"router", z->bytes_router}, {"norms", z->bytes_norm}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (parts[i].v)
            printf("  %-11s %12s  %5.1f%%\n", parts[i].n, moe_cli_bytes(a, sizeof a, (double)parts[i].v),
                   100.0 * (double)parts[i].v / r->W);
    printf("touched      %s per token (%.1f%% of the weights: %s%d of %d experts per MoE layer)\n",
           moe_cli_bytes(a, sizeof a, r->touched), 100.0 * r->touched / r->W, r->n_moe ? "" : "dense, ",
           r->n_moe ? r->top_k : 0, r->n_experts);
    if (r->off)
        printf("offload      %ld of %d experts per MoE layer on the device: %s of weights there, every expert (%s) "
               "in pinned host memory; hit rate %.3f%s\n", r->gpu_experts, r->n_experts,
               moe_cli_bytes(a, sizeof a, r->Wdev), moe_cli_bytes(b, sizeof b, r->host_bytes), r->hit,
               r->hit_given ? "" : " (uniform routing: C/E)");
}

static void print_times(const struct plan_result *r)
{
    char a[96], b[160], d[32];
    const struct device *dev = &r->dev;
    printf("\nkv cache     %s per token (%s), %s per sequence of %ld tokens\n", moe_cli_bytes(a, sizeof a, r->kv_tok),
           moe_dtype_name(r->kv), moe_cli_bytes(b, sizeof b, r->kv_seq), r->ctx);
    const double usable = dev->mem_bytes * 0.9; /* leave room for activations and the runtime */
    if (r->Wdev >= usable) {
        printf("fit          the weights (%s) do not fit in 90%% of %s\n", moe_cli_bytes(a, sizeof a, r->Wdev),
               moe_cli_bytes(b, sizeof b, dev->mem_bytes));
    } else {
        const double left = usable - r->Wdev;
        printf("fit          %s left beside the weights (90%% of memory usable): %.0f sequences of %ld tokens (%s "
               "tokens in all)\n", moe_cli_bytes(a, sizeof a, left), floor(left / r->kv_seq), r->ctx,
               moe_cli_count(d, sizeof d, floor(left / r->kv_tok)));
    }
    printf("\nflops        %s per token in the weights, + %s for attention at context %ld\n",
           moe_cli_count(a, sizeof a, r->f_tok), moe_cli_count(b, sizeof b, r->f_attn), r->ctx);
    const double P = (double)r->chunk;
    printf("prefill      chunk of %ld: %.3f ms per token (%s-bound%s), %.0f tokens/s\n", r->chunk,
           (r->p_time + r->p_copy) / P * 1e3, r->p_compute_bound ? "compute" : "memory",
           r->off ? copy_note(a, sizeof a, r->p_copy / P, dev->h2d) : "", P / (r->p_time + r->p_copy));
    if (r->on_cpu)
        snprintf(b, sizeof b, "; misses read by the CPU at %.0f GB/s: %.3f ms, overlapped", r->host_bw / 1e9,
                 r->d_copy * 1e3);
    printf("decode       batch %ld at context %ld: reads %s per step (%.1f of %d experts per MoE layer touched), "
           "%.3f ms per step (%s-bound%s), %.0f tokens/s\n", r->batch, r->ctx, moe_cli_bytes(a, sizeof a, r->d_bytes),
           r->uniq, r->n_experts, r->d_step * 1e3, r->d_compute_bound ? "compute" : "memory",
           r->on_cpu ? b : r->off ? copy_note(b, sizeof b, r->d_copy, dev->h2d) : "", (double)r->batch / r->d_step);
}

int moe_cli_plan(int argc, char **argv)
{
    struct plan_opts o;
    struct plan_result r = {0};
    struct moe_model m = {0};
    char note[256];
    int rc = plan_parse(argc, argv, &o);
    if (rc >= 0) return rc;
    if (plan_device(&o, &r.dev, note, sizeof note) || plan_model(&o, &m, &r.z)) return 1;
    r.model = o.eng.model.path ? o.eng.model.path : o.eng.model.synthetic;
    r.architecture = m.cfg.architecture;
    (void)moe_cli_parse_kv_dtype(o.eng.kv_dtype, &r.kv); /* checked when parsed */
    r.ctx = o.ctx;
    r.chunk = o.chunk;
    r.batch = o.batch;
    r.host_bw = o.host_bw * 1e9;
    plan_compute(&o, &m.cfg, &r);
    print_weights(&r);
    print_times(&r);
    moe_model_free(&m);
    return 0;
}
