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
 * longer of the two.
 *
 * --spec ngram, --spec mtp or --draft DIR with --accept A (docs/plan.md,
 * "Speculative decoding"): each of the B sequences drafts K tokens (K draft
 * decode steps at batch B on the device, the multi-token-prediction module
 * being one layer of the target's shape with its own head; nothing for
 * n-gram lookup), then one
 * target step verifies B (K + 1) rows, reading the experts their union
 * touches, the other weights and the KV once; a step emits
 * (1 - A^(K+1)) / (1 - A) tokens per sequence (plan_spec.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_opts.h"
#include "kvcache/kvcache.h"
#include "runtime/cli/plan_ep.h"
#include "runtime/cli/plan_quant.h"
#include "runtime/cli/plan_spec.h"
#include "runtime/engine/engine.h"

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
    double accept;             /* --accept: -1 not given */
    double net, net_latency;   /* --ep: GB/s, microseconds a hop */
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
             "and copy bandwidth measured; --dp-attention in the CPU\n"
             "backend's all-to-all form), or a memory size (80GB)"},
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
    {.name = "accept", .arg = "A", .kind = MOE_CLI_DOUBLE, CMD(accept), .lo = 0, .hi = 1, .open = MOE_CLI_HI_OPEN,
     .help = "speculation: the chance that a drafted token is kept\n"
             "(default: speedups at 0.5 to 0.9)"},
    {.name = "net", .arg = "GB/s", .kind = MOE_CLI_DOUBLE, CMD(net), .lo = 0, .hi = 1e6, .open = MOE_CLI_LO_OPEN,
     .help = "--ep: the network's bandwidth between ranks (default 400,\n"
             "NVLink-class; 50 for 400 Gb/s between hosts)"},
    {.name = "net-latency", .arg = "US", .kind = MOE_CLI_DOUBLE, CMD(net_latency), .lo = 0, .hi = 1e6,
     .help = "--ep: microseconds per hop of a ring all-gather (default 5)"},
};
#undef CMD

static const char *const shared[] = {"synthetic", "dtype", "moe-top-k", "ep", "tp", "dp-attention", "kv-dtype", "quantize", "expert-dtype-plan", "hot-share", "gpu-experts",
                                     "gpu-experts-cpu-rows", "@spec", NULL};

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
             "bf16 here.  With --spec ngram, --spec mtp (the checkpoint's multi-token-\n"
             "prediction module) or --draft DIR (a model folder, or a config.json for its\n"
             "shape alone), plan predicts speculative decoding's speedup for\n"
             "K = 1..8 drafted tokens, or the --spec-tokens K given.\n",
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
                            .host_bw = 100, .accept = -1, .net = 400, .net_latency = 5};
    moe_cli_engine_defaults(&o->eng);
    o->eng.kv_dtype = "bf16";
    struct moe_cli_args a;
    const int rc = moe_cli_parse(&plan_cmd, argc, argv, o, &a);
    if (rc >= 0) return rc;
    if (a.n_pos > 0) o->eng.model.path = a.pos[0];
    if (a.n_pos > 1) return moe_cli_error("plan", "unexpected argument '%s'", a.pos[1]);
    const bool ngram = o->eng.spec.kind == MOE_SPEC_NGRAM, draft = o->eng.model.draft != NULL,
               mtp = o->eng.spec.kind == MOE_SPEC_MTP;
    if ((ngram || mtp) && draft) return moe_cli_error("plan", "--spec and --draft are two proposers: give one");
    if (!ngram && !draft && !mtp && (o->accept >= 0 || o->eng.spec.tokens))
        return moe_cli_error("plan", "--%s needs a proposer: --spec ngram|mtp or --draft DIR",
                             o->accept >= 0 ? "accept" : "spec-tokens");
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

/* --expert-dtype-plan: the experts' bytes by their formats (stored: at the
 * size counted so far, stored_bytes for all; q8_0 9 bits a weight, q4 5,
 * or 4.5 where moe_plan_quant_sizes says Q4_K),
 * and the line of the report saying how many experts took which. */
static char expert_plan_line[512];
static int plan_expert_sizes(const struct plan_opts *o, const struct moe_config *cfg, enum moe_weight_quant q,
                             int64_t stored_bytes, struct moe_model_sizes *z)
{
    struct moe_backend_opts bo;
    uint8_t *plan;
    if (moe_quant_q5(q))
        return moe_cli_error("plan", "--expert-dtype-plan with --quantize %s: not supported (use q4 or q8_0)",
                             moe_cli_quant_name(q));
    moe_backend_opts_defaults(&bo);
    const double share = o->eng.hot_share > 0 ? o->eng.hot_share : MOE_CLI_HOT_SHARE;
    if (moe_cli_expert_plan(&bo, o->eng.expert_plan, share, q, &plan) != MOE_OK)
        return moe_cli_error("plan", "%s", moe_last_error());
    const int E = cfg->n_experts, n_moe = moe_config_moe_layers(cfg);
    if (n_moe == 0 || E <= 0) {
        free(plan);
        return moe_cli_error("plan", "--expert-dtype-plan: the model has no experts");
    }
    const int64_t params = 3 * (int64_t)cfg->d_expert * cfg->d_model, stored = stored_bytes / n_moe / E;
    const bool k = moe_plan_q4_k_rows(cfg->d_model, cfg->d_expert);
    int64_t bytes = 0, count[3] = {0}; /* stored, q8_0, q4 */
    for (int l = 0; l < cfg->n_layers; l++) {
        if (!cfg->layer_moe[l]) continue;
        for (int e = 0; e < E; e++) {
            const uint8_t p = l < bo.expert_quant_layers && e < bo.expert_quant_e
                                  ? plan[(size_t)l * bo.expert_quant_e + e] : MOE_EXPERT_QUANT_DEFAULT;
            const enum moe_weight_quant f = p == MOE_EXPERT_QUANT_DEFAULT ? q : (enum moe_weight_quant)p;
            const int i = f == MOE_QUANT_Q8_0 ? 1 : f == MOE_QUANT_Q4 ? 2 : 0;
            count[i]++;
            bytes += i == 0 ? stored : i == 1 ? params * 9 / 8 : k ? params * 9 / 16 : params * 5 / 8;
        }
    }
    free(plan);
    z->bytes_total += bytes - z->bytes_experts;
    z->bytes_experts = bytes;
    snprintf(expert_plan_line, sizeof expert_plan_line, "  expert plan %lld experts stored, %lld q8_0, %lld q4 "
             "(%.200s, hot share %g)\n", (long long)count[0], (long long)count[1], (long long)count[2],
             o->eng.expert_plan, share);
    return 0;
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
        struct moe_cli_model_opts target = *mo;
        target.draft = NULL; /* plan reads the draft's shape itself (plan_draft) */
        target.ep = 0;       /* predicted, not loaded so */
        if (moe_cli_open_model(m, &target) != MOE_OK) return moe_cli_error("plan", "%s", moe_last_error());
        moe_model_sizes(m, z);
    }
    enum moe_weight_quant q = MOE_QUANT_NONE;
    if (o->eng.quantize) (void)moe_cli_parse_quant(o->eng.quantize, &q);
    const int64_t stored_experts = z->bytes_experts;
    if (q != MOE_QUANT_NONE) moe_plan_quant_sizes(&m->cfg, q, z);
    if (o->eng.expert_plan && plan_expert_sizes(o, &m->cfg, q, stored_experts, z)) return 1;
    return 0;
}

/* --draft: a model folder, or a config.json for its shape alone at the
 * target's --dtype; quantized as the target is (it runs on the target's
 * backend).  Its vocabulary must be the target's. */
static int plan_draft(const struct plan_opts *o, const struct moe_config *target, struct moe_model *d,
                      struct moe_model_sizes *z)
{
    const char *path = o->eng.model.draft;
    const size_t n = strlen(path);
    struct plan_opts dopts = *o;
    dopts.eng.model = (struct moe_cli_model_opts){.dtype = o->eng.model.dtype};
    if (n > 5 && !strcmp(path + n - 5, ".json")) dopts.eng.model.synthetic = path;
    else dopts.eng.model.path = path;
    if (plan_model(&dopts, d, z)) return 1;
    if (d->cfg.vocab != target->vocab)
        return moe_cli_error("plan", "--draft %s: a vocabulary of %d tokens, the target's has %d", path,
                             d->cfg.vocab, target->vocab);
    return 0;
}

/* --spec mtp: the checkpoint's multi-token-prediction module 0, one
 * layer of the target's shape (MoE when it has experts) with its own LM
 * head and embedding, plus eh_proj (D, 2D), at the target's --dtype. */
static int plan_mtp(const struct plan_opts *o, const struct moe_config *target, struct moe_model *d,
                    struct moe_model_sizes *z)
{
    if (target->n_mtp_layers <= 0)
        return moe_cli_error("plan", "--spec mtp: the model declares no multi-token-prediction layers "
                             "(num_nextn_predict_layers)");
    enum moe_dtype wdt = MOE_DTYPE_BF16;
    if (o->eng.model.dtype) (void)moe_cli_parse_dtype(o->eng.model.dtype, &wdt); /* checked when parsed */
    d->cfg = *target;
    d->cfg.n_layers = 1;
    d->cfg.n_mtp_layers = 0;
    d->cfg.layer_moe[0] = target->n_experts > 0;
    d->cfg.layer_sliding[0] = false;
    moe_config_sizes(&d->cfg, moe_dtype_size(wdt), z);
    enum moe_weight_quant q = MOE_QUANT_NONE;
    if (o->eng.quantize) (void)moe_cli_parse_quant(o->eng.quantize, &q);
    if (q != MOE_QUANT_NONE) moe_plan_quant_sizes(&d->cfg, q, z);
    const int64_t eh = 2 * (int64_t)target->d_model * target->d_model;
    z->params_total += eh;
    z->params_active += eh;
    z->bytes_attn += eh * (int64_t)moe_dtype_size(wdt);
    z->bytes_total += eh * (int64_t)moe_dtype_size(wdt);
    return 0;
}

/* One model's figures for the roofline: what a step of it reads and computes. */
struct shape {
    double W;            /* weight bytes */
    double non_expert;   /* bytes a step reads once whatever its rows: all but the experts
                            and the embedding (a row a token; a tied one is the LM head) */
    double one_expert;   /* bytes of one expert of one MoE layer */
    double E, K;         /* experts per MoE layer, routed per token */
    int n_moe;           /* MoE layers */
    double f_tok, f_pos; /* FLOPs per token in the weights; per cached position in attention */
    double kv_tok;       /* KV bytes per token */
    double state_seq;    /* recurrent-state bytes per sequence (linear-attention layers) */
};

static void shape_of(const struct moe_config *cfg, const struct moe_model_sizes *z, enum moe_dtype kv,
                     struct shape *s)
{
    const int n_moe = moe_config_moe_layers(cfg);
    const double embed = z->bytes_lm_head > 0 ? (double)z->bytes_embed : 0; /* tied: read whole as the head */
    *s = (struct shape){
        .W = (double)z->bytes_total, .E = cfg->n_experts, .K = cfg->top_k, .n_moe = n_moe,
        .one_expert = n_moe && cfg->n_experts > 0 ? (double)z->bytes_experts / n_moe / cfg->n_experts : 0,
        .non_expert = (double)z->bytes_total - (double)z->bytes_experts - embed,
        /* 2 per touched weight, the embedding's lookup excluded (tied: it is
         * the head); a linear layer's delta rule: 8 per state value (decay,
         * S^T k, the update, S^T q) */
        .f_tok = 2.0 * ((double)z->params_active - (cfg->tie_embeddings ? 0 : (double)cfg->vocab * cfg->d_model)) +
                 8.0 * moe_config_linear_layers(cfg) * (double)cfg->lin_v_heads * cfg->lin_k_dim * cfg->lin_v_dim,
        /* QK^T and PV: 2 * 2 * Hq * Dh per cached position per attention layer */
        .f_pos = 4.0 * moe_config_kv_layers(cfg) * (double)cfg->n_heads * cfg->head_dim,
        .kv_tok = (double)moe_config_kv_bytes_per_token(cfg, kv),
        .state_seq = (double)moe_config_state_bytes(cfg)};
}

/* What one step reads and how long it takes. */
struct step {
    double uniq;              /* distinct experts per MoE layer */
    double bytes, time, copy; /* bytes read; seconds, copies included; seconds copying experts in */
    bool compute_bound, on_cpu; /* on_cpu: the misses read by the CPU (--gpu-experts-cpu-rows) */
};

/* A speculative step's rows and their cost. */
struct spec_row {
    int k;
    double uniq;          /* distinct experts per MoE layer the verification touches */
    double draft, verify; /* seconds: K draft steps, the verification step */
    double cost;          /* (draft + verify) / a plain decode step */
    double break_even;    /* the acceptance at which speculation pays */
};

#define PLAN_ACCEPTS 5

struct plan_spec {
    bool on, ngram;
    const char *draft;             /* the draft's folder or config */
    const struct moe_config *dcfg; /* the draft's (borrowed) */
    struct shape d;                /* the draft's figures (zero for n-gram) */
    struct step d_step;            /* one draft decode step at batch B */
    double accept[PLAN_ACCEPTS];   /* the acceptances a speedup is given at */
    int n_accept;
    struct spec_row rows[MOE_SPEC_MAX_TOKENS];
    int n_rows;
};

/* What plan predicts: the text report reads only this. */
struct plan_result {
    const char *model, *architecture;
    struct device dev;
    struct moe_model_sizes z;
    struct shape t;                    /* the target */
    double touched;                    /* weight bytes touched per token */
    bool off, hit_given;               /* --gpu-experts offloads some experts; --hit-rate given */
    long gpu_experts;
    double hit, Wdev, host_bytes;      /* hit rate, bytes on the device, pinned host bytes */
    double cpu_rows, host_bw;          /* --gpu-experts-cpu-rows, --host-bw (bytes/s) */
    enum moe_dtype kv;
    long ctx, chunk, batch;
    double kv_seq;                     /* KV bytes per sequence of ctx */
    double f_attn;                     /* FLOPs per token in attention at ctx */
    double p_time, p_copy;             /* prefill: a chunk's roofline time, its copies */
    bool p_compute_bound;
    struct step dec;                   /* decode at batch B */
    struct plan_spec sp;               /* speculative decoding */
};

/* A step of `rows` rows from `seqs` sequences at context ctx: the weights
 * but the experts read once, the experts the rows touch, each sequence's
 * KV; with offload (the target's --gpu-experts) the copies of its misses. */
static void step_of(const struct plan_result *r, const struct shape *s, double rows, double seqs, bool offload,
                    struct step *st)
{
    const struct device *dev = &r->dev;
    const double ctx = (double)r->ctx;
    *st = (struct step){.uniq = moe_plan_distinct_experts(s->E, s->K, rows)};
    /* each sequence's recurrent state read and written once */
    st->bytes = s->non_expert + s->n_moe * st->uniq * s->one_expert + seqs * (s->kv_tok * ctx + 2 * s->state_seq);
    const double compute = rows * (s->f_tok + s->f_pos * ctx) / dev->flops, memory = st->bytes / dev->bw;
    st->compute_bound = compute > memory;
    st->time = fmax(compute, memory);
    if (!offload || !r->off) return;
    /* --gpu-experts-cpu-rows: the misses read by the CPU from host memory,
     * beside the device's part of the step; else copied in before it */
    const double layer = s->n_moe * s->one_expert;
    st->on_cpu = r->cpu_rows > 0 && st->uniq > 0 && rows * s->K / st->uniq <= r->cpu_rows;
    st->copy = copy_seconds(s->E, s->K, (double)r->gpu_experts, r->hit, rows,
                            layer / (st->on_cpu ? r->host_bw : dev->h2d));
    st->time = st->on_cpu ? fmax(st->time, st->copy) : st->time + st->copy;
}

static void plan_compute(const struct plan_opts *o, const struct moe_config *cfg, struct plan_result *r)
{
    const struct moe_model_sizes *z = &r->z;
    const struct device *dev = &r->dev;
    shape_of(cfg, z, r->kv, &r->t);
    const struct shape *s = &r->t;
    const double E = s->E, K = s->K, W = s->W;
    r->touched = s->non_expert + s->n_moe * K * s->one_expert;
    /* --gpu-experts: the experts of each MoE layer past C stay in host memory */
    r->off = o->eng.gpu_experts > 0 && s->n_moe > 0 && o->eng.gpu_experts < cfg->n_experts;
    r->gpu_experts = r->off ? o->eng.gpu_experts : cfg->n_experts;
    const double C = (double)r->gpu_experts;
    r->hit_given = o->hit_rate >= 0;
    r->hit = !r->off ? 1 : r->hit_given ? o->hit_rate : C / E;
    r->cpu_rows = (double)o->eng.gpu_experts_cpu_rows;
    /* every expert is pinned in host memory; the device holds C per layer */
    r->host_bytes = r->off ? (double)z->bytes_experts : 0;
    r->Wdev = r->off ? W - s->n_moe * (E - C) * s->one_expert : W;
    r->kv_seq = s->kv_tok * (double)o->ctx + s->state_seq;
    r->f_attn = s->f_pos * (double)o->ctx;
    /* prefill: a chunk of P tokens at half context on average, reading the weights once */
    const double p_compute = (double)o->chunk * (s->f_tok + s->f_pos * (double)o->chunk / 2) / dev->flops,
                 p_memory = r->Wdev / dev->bw;
    r->p_compute_bound = p_compute > p_memory;
    r->p_time = fmax(p_compute, p_memory);
    r->p_copy = copy_seconds(E, K, C, r->hit, (double)o->chunk, s->n_moe * s->one_expert / dev->h2d);
    step_of(r, s, (double)o->batch, (double)o->batch, true, &r->dec);
}

/* Speculative decoding at batch B: each sequence's K draft steps (the
 * draft's roofline at batch B; none for n-gram lookup) and one target step
 * of B (K + 1) rows, against the plain decode step. */
static void spec_compute(const struct plan_opts *o, struct plan_result *r)
{
    struct plan_spec *sp = &r->sp;
    const double B = (double)r->batch;
    if (!sp->ngram) step_of(r, &sp->d, B, B, false, &sp->d_step);
    const int k0 = o->eng.spec.tokens ? o->eng.spec.tokens : 1, k1 = o->eng.spec.tokens ? k0 : 8;
    for (int k = k0; k <= k1; k++) {
        struct spec_row *w = &sp->rows[sp->n_rows++];
        struct step v;
        step_of(r, &r->t, B * (k + 1), B, true, &v);
        *w = (struct spec_row){.k = k, .uniq = v.uniq, .draft = sp->ngram ? 0 : k * sp->d_step.time,
                               .verify = v.time};
        w->cost = (w->draft + w->verify) / r->dec.time;
        w->break_even = moe_plan_spec_break_even(w->cost, k);
    }
    if (o->accept >= 0) {
        sp->accept[sp->n_accept++] = o->accept;
    } else {
        for (int i = 0; i < PLAN_ACCEPTS; i++) sp->accept[sp->n_accept++] = 0.5 + 0.1 * i;
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
    printf("\nweights      %s in total\n", moe_cli_bytes(a, sizeof a, r->t.W));
    const struct { const char *n; int64_t v; } parts[] = {
        {"embeddings", z->bytes_embed}, {"lm head", z->bytes_lm_head}, {"attention", z->bytes_attn},
        {"dense FFN", z->bytes_dense_ffn}, {"experts", z->bytes_experts}, {"shared", z->bytes_shared},
        {"router", z->bytes_router}, {"norms", z->bytes_norm}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (parts[i].v)
            printf("  %-11s %12s  %5.1f%%\n", parts[i].n, moe_cli_bytes(a, sizeof a, (double)parts[i].v),
                   100.0 * (double)parts[i].v / r->t.W);
    fputs(expert_plan_line, stdout);
    printf("touched      %s per token (%.1f%% of the weights: %s%d of %d experts per MoE layer)\n",
           moe_cli_bytes(a, sizeof a, r->touched), 100.0 * r->touched / r->t.W, r->t.n_moe ? "" : "dense, ",
           r->t.n_moe ? (int)r->t.K : 0, (int)r->t.E);
    if (r->off)
        printf("offload      %ld of %d experts per MoE layer on the device: %s of weights there, every expert (%s) "
               "in pinned host memory; hit rate %.3f%s\n", r->gpu_experts, (int)r->t.E,
               moe_cli_bytes(a, sizeof a, r->Wdev), moe_cli_bytes(b, sizeof b, r->host_bytes), r->hit,
               r->hit_given ? "" : " (uniform routing: C/E)");
}

/* The memory: the KV cache, the draft beside the target, how many sequences fit. */
static void print_memory(const struct plan_result *r)
{
    char a[96], b[160], d[32];
    const struct device *dev = &r->dev;
    const struct plan_spec *sp = &r->sp;
    printf("\nkv cache     %s per token (%s), %s per sequence of %ld tokens\n",
           moe_cli_bytes(a, sizeof a, r->t.kv_tok), moe_dtype_name(r->kv), moe_cli_bytes(b, sizeof b, r->kv_seq),
           r->ctx);
    if (r->t.state_seq > 0)
        printf("state        %s per sequence (F32: the linear-attention layers' convolution inputs and "
               "delta-rule states), in the figure above\n", moe_cli_bytes(a, sizeof a, r->t.state_seq));
    double weights = r->Wdev, kv_tok = r->t.kv_tok;
    if (sp->on && !sp->ngram) { /* its own pool, as many tokens as the target's */
        weights += sp->d.W;
        kv_tok += sp->d.kv_tok;
        printf("draft        %s (%s): %s of weights, %s of KV per token (%s per sequence), on the device\n",
               sp->draft, sp->dcfg->architecture, moe_cli_bytes(a, sizeof a, sp->d.W),
               moe_cli_bytes(b, sizeof b, sp->d.kv_tok), moe_cli_bytes(d, sizeof d, sp->d.kv_tok * (double)r->ctx));
    }
    const char *with = sp->on && !sp->ngram ? " and the draft's" : "";
    const double usable = dev->mem_bytes * 0.9; /* leave room for activations and the runtime */
    if (weights >= usable) {
        printf("fit          the weights%s (%s) do not fit in 90%% of %s\n", with, moe_cli_bytes(a, sizeof a, weights),
               moe_cli_bytes(b, sizeof b, dev->mem_bytes));
    } else {
        const double left = usable - weights;
        printf("fit          %s left beside the weights%s (90%% of memory usable): %.0f sequences of %ld tokens (%s "
               "tokens in all)\n", moe_cli_bytes(a, sizeof a, left), with,
               floor(left / (kv_tok * (double)r->ctx + r->t.state_seq)),
               r->ctx, moe_cli_count(d, sizeof d, floor(left / kv_tok)));
    }
}

static void print_times(const struct plan_result *r)
{
    char a[96], b[160];
    const struct device *dev = &r->dev;
    printf("\nflops        %s per token in the weights, + %s for attention at context %ld\n",
           moe_cli_count(a, sizeof a, r->t.f_tok), moe_cli_count(b, sizeof b, r->f_attn), r->ctx);
    const double P = (double)r->chunk;
    printf("prefill      chunk of %ld: %.3f ms per token (%s-bound%s), %.0f tokens/s\n", r->chunk,
           (r->p_time + r->p_copy) / P * 1e3, r->p_compute_bound ? "compute" : "memory",
           r->off ? copy_note(a, sizeof a, r->p_copy / P, dev->h2d) : "", P / (r->p_time + r->p_copy));
    const struct step *d = &r->dec;
    if (d->on_cpu)
        snprintf(b, sizeof b, "; misses read by the CPU at %.0f GB/s: %.3f ms, overlapped", r->host_bw / 1e9,
                 d->copy * 1e3);
    printf("decode       batch %ld at context %ld: reads %s per step (%.1f of %d experts per MoE layer touched), "
           "%.3f ms per step (%s-bound%s), %.0f tokens/s\n", r->batch, r->ctx, moe_cli_bytes(a, sizeof a, d->bytes),
           d->uniq, (int)r->t.E, d->time * 1e3, d->compute_bound ? "compute" : "memory",
           d->on_cpu ? b : r->off ? copy_note(b, sizeof b, d->copy, dev->h2d) : "", (double)r->batch / d->time);
}

/* The table over K: the cost of a step, where it pays, and the speedup at
 * each acceptance, the best K of each marked '*'. */
static void print_spec(const struct plan_result *r)
{
    const struct plan_spec *sp = &r->sp;
    char a[96];
    if (sp->ngram)
        printf("\nspeculation  n-gram lookup (drafting costs nothing)");
    else
        printf("\nspeculation  draft %s: a draft decode step %.3f ms (%s-bound, %s read)", sp->draft,
               sp->d_step.time * 1e3, sp->d_step.compute_bound ? "compute" : "memory",
               moe_cli_bytes(a, sizeof a, sp->d_step.bytes));
    printf(", batch %ld at context %ld; cost: a speculative step's time over a plain decode step's\n", r->batch,
           r->ctx);
    int best[PLAN_ACCEPTS] = {0};
    for (int j = 0; j < sp->n_accept; j++)
        for (int i = 1; i < sp->n_rows; i++)
            if (moe_plan_spec_tokens(sp->accept[j], sp->rows[i].k) / sp->rows[i].cost >
                moe_plan_spec_tokens(sp->accept[j], sp->rows[best[j]].k) / sp->rows[best[j]].cost)
                best[j] = i;
    printf("  %2s %13s %9s %10s %6s %13s", "K", "experts/layer", "draft ms", "verify ms", "cost", "break-even A");
    if (sp->n_accept == 1) printf(" %12s %8s\n", "tokens/step", "speedup");
    else
        for (int j = 0; j < sp->n_accept; j++) printf("  x at %.1f%s", sp->accept[j], j + 1 < sp->n_accept ? "" : "\n");
    for (int i = 0; i < sp->n_rows; i++) {
        const struct spec_row *w = &sp->rows[i];
        if (w->break_even >= 1) snprintf(a, sizeof a, "never");
        else snprintf(a, sizeof a, "%.2f", w->break_even);
        printf("  %2d %13.1f %9.3f %10.3f %6.2f %13s", w->k, w->uniq, w->draft * 1e3, w->verify * 1e3, w->cost, a);
        if (sp->n_accept == 1)
            printf(" %12.2f", moe_plan_spec_tokens(sp->accept[0], w->k));
        for (int j = 0; j < sp->n_accept; j++)
            printf(" %7.2fx%c", moe_plan_spec_tokens(sp->accept[j], w->k) / w->cost,
                   sp->n_rows > 1 && best[j] == i ? '*' : ' ');
        printf("\n");
    }
}

/* --ep N: the expert-parallel figures of the target on N devices like
 * r's, the network of --net and --net-latency (plan_ep.h). */
static int plan_ep(const struct plan_opts *o, const struct moe_config *cfg, const struct plan_result *r,
                   struct moe_plan_ep *p)
{
    const int M = o->eng.model.tp > 1 ? (int)o->eng.model.tp : 1;
    /* --ep N --tp M: N x M ranks, the experts in N shards; --tp M alone:
     * M ranks, the experts over every rank */
    const int N = o->eng.model.ep > 0 ? (int)o->eng.model.ep : M, world = o->eng.model.ep > 0 ? N * M : M;
    if (r->t.n_moe == 0 || cfg->n_experts % N)
        return moe_cli_error("plan", "--ep %d: %d experts per layer do not split evenly over %d %s", N,
                             cfg->n_experts, N, M > 1 ? "shards" : "ranks");
    if (r->off) return moe_cli_error("plan", "--ep or --tp with --gpu-experts is not predicted");
    if (moe_plan_tp_check(cfg, M)) return 1;
    const bool dp = o->eng.model.dp_attention;
    if (dp && M > 1) return moe_cli_error("plan", "--dp-attention with --tp %d: choose one", M);
    const struct shape *s = &r->t;
    const double f_experts = 2.0 * s->n_moe * s->K * 3.0 * cfg->d_model * cfg->d_expert;
    const int n_dense = cfg->n_layers - s->n_moe, n_attn = moe_config_kv_layers(cfg),
              n_lin = moe_config_linear_layers(cfg);
    const double D = cfg->d_model, cut = (M - 1.0) / M;
    double a_all, a_rank;
    moe_plan_tp_attn_params(cfg, M, &a_all, &a_rank);
    const double ffn = 3.0 * D * ((double)n_dense * cfg->d_ff + (double)s->n_moe * (cfg->d_shared > 0 ? cfg->d_shared : 0));
    const double saved = (double)r->z.bytes_attn * (a_all > 0 ? (a_all - a_rank) / a_all : 0) +
                         (double)(r->z.bytes_dense_ffn + r->z.bytes_shared) * cut;
    /* a linear layer's delta rule: 8 FLOPs per state value (shape_of), split with its heads */
    const double delta = 8.0 * n_lin * (double)cfg->lin_v_heads * cfg->lin_k_dim * cfg->lin_v_dim;
    *p = (struct moe_plan_ep){.ranks = world, .tp = M, .shards = N, .saved = saved,
                              .f_saved = 2.0 * (a_all - a_rank + ffn * cut) + delta * cut,
                              .kv_share = (double)moe_tp_kv_heads(cfg->n_kv_heads, M) / cfg->n_kv_heads,
                              .head = cfg->tie_embeddings ? 0 : (double)r->z.bytes_lm_head, .vocab = cfg->vocab,
                              .embed = (double)r->z.bytes_embed,
                              .tp_sums = M > 1 ? n_attn + n_lin + n_dense + (cfg->d_shared > 0 ? s->n_moe : 0) : 0,
                              /* the form moerun runs: all-to-all on the CPU backend (host
                               * memory), gathering on a GPU (forward_dp.c) */
                              .dp = dp, .a2a = dp && !strcmp(r->dev.name, "cpu"), .n_attn = n_attn + n_lin,
                              .f_attn = 2.0 * a_all + delta,
                              .net_bw = o->net * 1e9, .latency = o->net_latency * 1e-6,
                              .dev_bw = r->dev.bw, .dev_flops = r->dev.flops, .mem = r->dev.mem_bytes,
                              .W = s->W, .experts = (double)r->z.bytes_experts, .non_expert = s->non_expert,
                              .one_expert = s->one_expert, .E = s->E, .K = s->K, .D = cfg->d_model,
                              .n_moe = s->n_moe, .last_moe = cfg->n_layers > 0 && cfg->layer_moe[cfg->n_layers - 1],
                              .f_dense = s->f_tok - f_experts, .f_experts = f_experts,
                              .f_pos = s->f_pos, .kv_tok = s->kv_tok, .batch = (double)r->batch,
                              .chunk = (double)r->chunk, .ctx = (double)r->ctx};
    moe_plan_ep_compute(p);
    return 0;
}

int moe_cli_plan(int argc, char **argv)
{
    struct plan_opts o;
    struct plan_result r = {0};
    struct moe_model m = {0}, dm = {0};
    struct moe_model_sizes dz = {0};
    char note[256];
    int rc = plan_parse(argc, argv, &o);
    if (rc >= 0) return rc;
    rc = 1;
    if (plan_device(&o, &r.dev, note, sizeof note) || plan_model(&o, &m, &r.z) ||
        (o.eng.model.draft && plan_draft(&o, &m.cfg, &dm, &dz)) ||
        (o.eng.spec.kind == MOE_SPEC_MTP && plan_mtp(&o, &m.cfg, &dm, &dz)))
        goto done;
    r.model = o.eng.model.path ? o.eng.model.path : o.eng.model.synthetic;
    r.architecture = m.cfg.architecture;
    (void)moe_cli_parse_kv_dtype(o.eng.kv_dtype, &r.kv); /* checked when parsed */
    r.ctx = o.ctx;
    r.chunk = o.chunk;
    r.batch = o.batch;
    r.host_bw = o.host_bw * 1e9;
    plan_compute(&o, &m.cfg, &r);
    r.sp.on = o.eng.spec.kind == MOE_SPEC_NGRAM || o.eng.spec.kind == MOE_SPEC_MTP || o.eng.model.draft;
    r.sp.ngram = o.eng.spec.kind == MOE_SPEC_NGRAM;
    if (o.eng.model.draft || o.eng.spec.kind == MOE_SPEC_MTP) {
        r.sp.draft = o.eng.model.draft ? o.eng.model.draft : "the multi-token-prediction module";
        r.sp.dcfg = &dm.cfg;
        shape_of(&dm.cfg, &dz, r.kv, &r.sp.d);
    }
    if (r.sp.on) spec_compute(&o, &r);
    struct moe_plan_ep ep = {0};
    if (o.eng.model.dp_attention && o.eng.model.ep <= 1) {
        moe_cli_error("plan", "--dp-attention: give the ranks with --ep N");
        goto done;
    }
    if ((o.eng.model.ep > 1 || o.eng.model.tp > 1) && plan_ep(&o, &m.cfg, &r, &ep)) goto done;
    print_weights(&r);
    print_memory(&r);
    print_times(&r);
    if (ep.ranks > 1) moe_plan_ep_print(&ep);
    if (r.sp.on) print_spec(&r);
    rc = 0;
done:
    moe_model_free(&dm);
    moe_model_free(&m);
    return rc;
}
