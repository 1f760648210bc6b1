/* cli_bench.c - `moerun bench`: prefill and decode throughput.
 *
 * Prefill: one sequence of P random tokens, prefilled in chunks of at most
 * --chunk tokens, tokens/s = P / time.  Decode: B sequences, each first
 * prefilled with --ctx tokens (untimed), then N decode steps of B tokens,
 * tokens/s = B*N / time, plus the mean step time.  Each measurement is
 * preceded by a warm-up run and reports the best of --repeat runs.  Token
 * ids are seeded random, so runs are reproducible.
 *
 * With decode sizes, bench also prints the memory-bandwidth roofline of a
 * batch-1 decode step: the bytes one token must read (every weight it
 * touches once: attention, router, its K experts, dense and shared FFNs,
 * norms, the LM head and one embedding row, plus its K/V cache at the mean
 * context of the measurement) divided by a copy bandwidth measured here
 * (memcpy of 256 MiB split over the same threads, best of 5, counting bytes
 * read + written as STREAM's Copy does), and by a read bandwidth measured
 * the same way (one pass of reads over 256 MiB): a decode step only reads,
 * and on a machine whose cores cannot keep enough reads in flight the read
 * figure is well below the copy figure (docs/performance.md). */
#include <getopt.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/bench_gpu.h"
#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/engine/runner.h"
#include "runtime/cli/bench_serve.h"
#include "runtime/cli/stats_cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moerun bench MODEL_DIR [options]\n"
            "       moerun bench --synthetic CONFIG.json [options]\n\n"
            "  --prefill LIST   prompt lengths to time (default 128,512)\n"
            "  --decode LIST    decode batch sizes to time (default 1,8,32)\n"
            "  --ctx N          context of each sequence before decode (default 128)\n"
            "  --steps N        decode steps per measurement (default 16)\n"
            "  --chunk N        prefill chunk size (default 512)\n"
            "  --kv-dtype T     KV cache dtype: f32 (default), f16, bf16, fp8\n"
            "  --repeat N       runs per measurement, best reported (default 3)\n"
            "  --json           one JSON object on stdout instead of a table\n"
            "  --copy-bandwidth measure device copy bandwidth; report decode against the\n"
            "                   HBM roofline (CUDA)\n"
            "  --gemm-compare LIST  grouped expert GEMM vs dense cuBLAS at LIST tokens (CUDA)\n"
            "  --expert-kernels LIST  the decode expert kernels alone at LIST batch sizes, with\n"
            "                   bf16, MXFP4, FP8 and Q8_0 weights of the model's shape (CUDA)\n"
            "  --serve          the serving benchmark instead (vLLM bench serve style):\n"
            "    --requests N       requests (default 64)\n"
            "    --rate R           Poisson arrivals at R requests/s (default: all at once)\n"
            "    --input-len I, --output-len O  tokens per request (default 128, 64)\n"
            "    --range-ratio F    lengths uniform in [len*(1-F), len*(1+F)] (default 0)\n"
            "    --kv-budget SIZE, --kv-block N, --max-batch-tokens N, --max-seqs N,\n"
            "    --no-prefix-cache  engine settings (see moerun batch --help)\n"
            "  --backend NAME   auto, cpu (fast kernels), cpu-ref (reference) or cuda\n"
            "                   (default auto)\n"
            "  --threads N      CPU threads\n"
            "  --synthetic CONFIG, --dtype T, --synthetic-seed S  random weights\n"
            "  --moe-top-k K    route each token to K experts instead of the model's top-k\n"
            "  --quantize q8_0  quantize the weights at load (9 bits a weight)\n"
            "  --gpu-experts N  CUDA: N experts of each MoE layer in GPU memory, the rest\n"
            "                   copied in from host memory when routed to (reports the\n"
            "                   share found on the GPU and the MB copied in per token)\n"
            "  --gpu-experts-policy lru|lfu, --gpu-experts-warm FILE,\n"
            "  --gpu-experts-cpu-rows R  as on run (reports the expert uses computed on\n"
            "                   the CPU)\n"
            MOE_CLI_STATS_USAGE
            "Statistics are recorded unless --no-stats (compare the two to see their cost).\n");
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int parse_list(const char *s, int32_t **v, int *n, const char *what)
{
    if (moe_cli_parse_ids(s, v, n) != MOE_OK) return moe_cli_error("bench", "%s: %s", what, moe_last_error());
    for (int i = 0; i < *n; i++)
        if ((*v)[i] <= 0) return moe_cli_error("bench", "%s: values must be positive", what);
    return 0;
}

struct bench_ctx {
    struct moe_runner r;
    struct moe_seq *seqs;
    int32_t *tokens;
    int V, chunk, repeat;
    uint64_t rng;
    /* expert offload (--gpu-experts) within the timed steps of a phase */
    const struct moe_backend *be;
    struct moe_offload_stats off;
    double off_tokens;
};

/* Adds the offload counters' change over a timed region of `tokens`
 * tokens (at is the value at its start). */
static void offload_add(struct bench_ctx *b, const struct moe_offload_stats *at, double tokens)
{
    struct moe_offload_stats now;
    moe_cuda_offload_stats(b->be, &now);
    b->off.accesses += now.accesses - at->accesses;
    b->off.hits += now.hits - at->hits;
    b->off.bytes_in += now.bytes_in - at->bytes_in;
    b->off.cpu_uses += now.cpu_uses - at->cpu_uses;
    b->off_tokens += tokens;
}

/* Reports a phase's offload figures (when offloaded) and resets them. */
static void offload_phase(struct bench_ctx *b, json_t *entry, bool json)
{
    struct moe_offload_stats now;
    moe_cuda_offload_stats(b->be, &now);
    if (now.layers > 0 && b->off_tokens > 0) {
        const double hit = b->off.accesses ? (double)b->off.hits / (double)b->off.accesses : 1,
                     mb = (double)b->off.bytes_in / b->off_tokens / 1e6,
                     cpu = (double)b->off.cpu_uses / b->off_tokens;
        json_object_set_new(entry, "offload", json_pack("{s:f, s:f, s:f}", "hit_rate", hit, "mb_in_per_token", mb,
                                                        "cpu_experts_per_token", cpu));
        if (!json) printf("%-10s %8s %11.1f%% %9.2f MB/token copied in, %.2f expert uses/token on the CPU\n",
                          "  offload", "", 100 * hit, mb, cpu);
    }
    memset(&b->off, 0, sizeof b->off);
    b->off_tokens = 0;
}

static enum moe_status time_prefill(struct bench_ctx *b, int P, double *best)
{
    *best = 1e30;
    for (int i = 0; i < P; i++) b->tokens[i] = (int32_t)(rng_next(&b->rng) % (uint64_t)b->V);
    for (int rep = 0; rep <= b->repeat; rep++) { /* rep 0 warms up */
        struct moe_offload_stats at;
        moe_cuda_offload_stats(b->be, &at);
        double t0 = moe_cli_now();
        for (int off = 0; off < P; off += b->chunk) {
            int n = P - off < b->chunk ? P - off : b->chunk;
            struct moe_chunk c = {&b->seqs[0], b->tokens + off, n, false, false, 0};
            MOE_TRY(moe_runner_step(&b->r, &c, 1, NULL, NULL, NULL, NULL));
        }
        double t = moe_cli_now() - t0;
        if (rep > 0) offload_add(b, &at, P);
        moe_seq_reset(&b->r, &b->seqs[0]);
        if (rep > 0 && t < *best) *best = t;
    }
    return MOE_OK;
}

static enum moe_status time_decode(struct bench_ctx *b, int B, int ctx, int steps, double *best)
{
    *best = 1e30;
    struct moe_chunk *ch = malloc((size_t)B * sizeof *ch);
    if (!ch) return moe_fail(MOE_ERR_NOMEM, "bench: chunks");
    enum moe_status s = MOE_OK;
    for (int rep = 0; rep <= b->repeat && s == MOE_OK; rep++) {
        for (int q = 0; q < B && s == MOE_OK; q++) {
            for (int i = 0; i < ctx; i++) b->tokens[i] = (int32_t)(rng_next(&b->rng) % (uint64_t)b->V);
            for (int off = 0; off < ctx && s == MOE_OK; off += b->chunk) {
                int n = ctx - off < b->chunk ? ctx - off : b->chunk;
                struct moe_chunk c = {&b->seqs[q], b->tokens + off, n, false, false, 0};
                s = moe_runner_step(&b->r, &c, 1, NULL, NULL, NULL, NULL);
            }
        }
        /* greedy decoding: each step feeds back the backend's argmax, so
         * only B token ids cross to the host per step, as in serving */
        for (int q = 0; q < B; q++) {
            b->tokens[q] = (int32_t)(rng_next(&b->rng) % (uint64_t)b->V);
            ch[q] = (struct moe_chunk){&b->seqs[q], &b->tokens[q], 1, false, true, 0};
        }
        struct moe_offload_stats at;
        moe_cuda_offload_stats(b->be, &at);
        double t0 = moe_cli_now();
        for (int st = 0; st < steps && s == MOE_OK; st++)
            s = moe_runner_step(&b->r, ch, B, NULL, b->tokens, NULL, NULL);
        double t = moe_cli_now() - t0;
        if (rep > 0) offload_add(b, &at, (double)B * steps);
        for (int q = 0; q < B; q++) moe_seq_reset(&b->r, &b->seqs[q]);
        if (rep > 0 && t < *best) *best = t;
    }
    free(ch);
    return s;
}

/* --serve: the engine under a stream of requests (runtime/cli/bench_serve.c). */
static int bench_serve_mode(const struct moe_model *m, struct moe_backend *be,
                            const struct moe_cli_model_opts *mo, struct moe_cli_engine *eo,
                            const struct moe_bench_serve_opts *sv, struct moe_cli_stats *so, int json)
{
    struct moe_engine e = {0};
    json_t *res = NULL;
    int rc = 1;
    if (!eo->kv_budget) eo->kv_budget = "0.25";
    if ((long)sv->input_len * 2 + sv->output_len * 2 > m->cfg.max_pos) {
        moe_cli_error("bench", "input and output lengths exceed the model's context of %d", m->cfg.max_pos);
        return 1;
    }
    if (moe_cli_engine_start(eo, m, be, 0, &e) != MOE_OK) {
        moe_cli_error("bench", "%s", moe_last_error());
        return 1;
    }
    if (moe_cli_stats_start(so, m, "bench")) goto done;
    e.r.fw.stats = moe_cli_stats_recorder(so);
    if (moe_bench_serve(&e, sv, json, &res) != MOE_OK) {
        moe_cli_error("bench", "%s", moe_last_error());
        goto done;
    }
    if (json) {
        json_t *out = json_pack("{s:s, s:s, s:i, s:O}", "model", mo->path ? mo->path : mo->synthetic,
                                "backend", be->ops->name, "threads", be->n_threads, "serve", res);
        char *s = out ? json_dumps(out, JSON_COMPACT) : NULL;
        if (s) puts(s);
        free(s);
        json_decref(out);
    }
    rc = moe_cli_stats_finish(so, m, mo, be, "bench");
done:
    json_decref(res);
    moe_engine_free(&e);
    return rc;
}

/* Bytes a batch-1 decode token reads at context ctx. */
static double decode_bytes(const struct moe_model *m, double ctx, enum moe_dtype kv_dtype)
{
    const struct moe_config *c = &m->cfg;
    struct moe_model_sizes z;
    moe_model_sizes(m, &z);
    double experts = c->n_experts > 0 ? (double)z.bytes_experts * c->top_k / c->n_experts : 0;
    double embed_row = (double)z.bytes_embed / (double)c->vocab;
    double head = c->tie_embeddings ? (double)z.bytes_embed : (double)z.bytes_lm_head;
    double kv = ctx * (double)moe_config_kv_bytes_per_token(c, kv_dtype);
    return (double)(z.bytes_attn + z.bytes_router + z.bytes_norm + z.bytes_dense_ffn +
                    z.bytes_shared) + experts + embed_row + head + kv;
}

int moe_cli_bench(int argc, char **argv)
{
    struct moe_cli_model_opts mo = {0};
    const char *backend = "auto", *prefill_arg = "128,512", *decode_arg = "1,8,32";
    long ctx = 128, steps = 16, chunk = 512, repeat = 3, threads = 0, seed = 0;
    int json = 0, copy_bw = 0;
    const char *gemm_arg = NULL, *expert_arg = NULL, *kv_arg = NULL;
    static const struct option opts[] = {
        {"prefill", required_argument, 0, 'p'}, {"decode", required_argument, 0, 'D'},
        {"ctx", required_argument, 0, 'x'},     {"steps", required_argument, 0, 'n'},
        {"chunk", required_argument, 0, 'c'},   {"repeat", required_argument, 0, 'r'},
        {"json", no_argument, 0, 'j'},          {"backend", required_argument, 0, 'B'},
        {"threads", required_argument, 0, 't'}, {"synthetic", required_argument, 0, 's'},
        {"dtype", required_argument, 0, 'd'},   {"synthetic-seed", required_argument, 0, 'S'},
        {"copy-bandwidth", no_argument, 0, 'W'}, {"gemm-compare", required_argument, 0, 'G'},
        {"serve", no_argument, 0, 0x200},        {"requests", required_argument, 0, 0x201},
        {"rate", required_argument, 0, 0x202},   {"input-len", required_argument, 0, 0x203},
        {"output-len", required_argument, 0, 0x204}, {"range-ratio", required_argument, 0, 0x205},
        {"kv-budget", required_argument, 0, 0x206}, {"kv-block", required_argument, 0, 0x207},
        {"max-batch-tokens", required_argument, 0, 0x208}, {"max-seqs", required_argument, 0, 0x209},
        {"no-prefix-cache", no_argument, 0, 0x20a}, {"moe-top-k", required_argument, 0, 0x20b},
        {"quantize", required_argument, 0, 0x20c}, {"expert-kernels", required_argument, 0, 0x20d},
        {"kv-dtype", required_argument, 0, 0x20e}, {"gpu-experts", required_argument, 0, 0x20f},
        {"gpu-experts-policy", required_argument, 0, 0x210}, {"gpu-experts-warm", required_argument, 0, 0x211},
        {"gpu-experts-cpu-rows", required_argument, 0, 0x212},
        {"help", no_argument, 0, 'h'},          MOE_CLI_STATS_OPTIONS,
        {0, 0, 0, 0}};
    struct moe_cli_stats so = {0};
    struct moe_cli_engine eo;
    moe_cli_engine_defaults(&eo);
    struct moe_bench_serve_opts sv = {.n_requests = 64, .input_len = 128, .output_len = 64, .seed = 7};
    long serve = 0, lv, gpu_experts = 0, cpu_rows = 0;
    const char *xpolicy = NULL, *xwarm = NULL; /* --gpu-experts-policy, --gpu-experts-warm */
    enum moe_weight_quant quant = MOE_QUANT_NONE;
    int c;
    optind = 1;
    while ((c = moe_cli_getopt(argc, argv, "h", opts, "bench")) != -1) {
        long *dst = NULL, lo = 1, hi = 1 << 24;
        switch (c) {
        case 'p': prefill_arg = optarg; break;
        case 'D': decode_arg = optarg; break;
        case 'x': dst = &ctx; break;
        case 'n': dst = &steps; break;
        case 'c': dst = &chunk; break;
        case 'r': dst = &repeat; break;
        case 't': dst = &threads; hi = 4096; break;
        case 'S': dst = &seed; lo = 0; hi = __LONG_MAX__; break;
        case 'j': json = 1; break;
        case 'W': copy_bw = 1; break;
        case 'G': gemm_arg = optarg; break;
        case 'B': backend = optarg; break;
        case 's': mo.synthetic = optarg; break;
        case 'd': mo.dtype = optarg; break;
        case 'h': usage(stdout); return 0;
        case 0x200: serve = 1; break;
        case 0x201: case 0x203: case 0x204:
            if (!moe_cli_parse_int(optarg, 1, 1 << 24, &lv))
                return moe_cli_error("bench", "'%s' must be a positive count", optarg);
            if (c == 0x201) sv.n_requests = (int)lv;
            if (c == 0x203) sv.input_len = (int)lv;
            if (c == 0x204) sv.output_len = (int)lv;
            break;
        case 0x202: case 0x205: {
            char *end;
            double v = strtod(optarg, &end);
            if (end == optarg || *end || !(v >= 0) || (c == 0x205 && v >= 1))
                return moe_cli_error("bench", "'%s' is not a valid %s", optarg,
                                     c == 0x202 ? "rate" : "range ratio (0 <= r < 1)");
            if (c == 0x202) sv.rate = v;
            else sv.range_ratio = v;
            break;
        }
        case 0x206: eo.kv_budget = optarg; break;
        case 0x207: case 0x208: case 0x209:
            if (!moe_cli_parse_int(optarg, 1, 1 << 24, &lv))
                return moe_cli_error("bench", "'%s' must be a positive count", optarg);
            if (c == 0x207) eo.kv_block = lv;
            if (c == 0x208) eo.max_batch_tokens = lv;
            if (c == 0x209) eo.max_seqs = lv;
            break;
        case 0x20a: eo.no_prefix_cache = true; break;
        case 0x20d: expert_arg = optarg; break;
        case 0x20e: kv_arg = optarg; break;
        case 0x20b: dst = &mo.top_k; hi = 1 << 16; break;
        case 0x20f: dst = &gpu_experts; hi = 1 << 20; break;
        case 0x210: xpolicy = optarg; break;
        case 0x211: xwarm = optarg; break;
        case 0x212: dst = &cpu_rows; lo = 0; hi = 1 << 20; break;
        case 0x20c:
            if (!moe_cli_parse_quant(optarg, &quant))
                return moe_cli_error("bench", "--quantize '%s' (use q8_0, or none)", optarg);
            break;
        default: {
            int k = moe_cli_stats_option(&so, &mo, c, optarg, "bench");
            if (k < 0) return 1;
            if (k == 0) return 2; /* moe_cli_getopt said why */
        }
        }
        if (dst && !moe_cli_parse_int(optarg, lo, hi, dst))
            return moe_cli_error("bench", "option value '%s' is out of range", optarg);
    }
    mo.seed = (uint64_t)seed;
    if (moe_cli_stats_check(&so, "bench")) return 1;
    if (optind < argc) mo.path = argv[optind++];
    if (optind < argc) return moe_cli_error("bench", "unexpected argument '%s'", argv[optind]);
    int32_t *plens = NULL, *bsizes = NULL, *gtoks = NULL, *ebs = NULL;
    int np = 0, nb = 0, ng = 0, ne = 0, rc = 1, max_p = 0, max_b = 1;
    if (parse_list(prefill_arg, &plens, &np, "--prefill") || parse_list(decode_arg, &bsizes, &nb, "--decode") ||
        (gemm_arg && parse_list(gemm_arg, &gtoks, &ng, "--gemm-compare")) ||
        (expert_arg && parse_list(expert_arg, &ebs, &ne, "--expert-kernels"))) {
        free(plens);
        free(bsizes);
        free(gtoks);
        free(ebs);
        return 1;
    }
    struct moe_bench_decode *dec = calloc((size_t)nb, sizeof *dec);
    struct moe_model m = {0};
    struct moe_backend be = {0};
    struct bench_ctx b = {.chunk = (int)chunk, .repeat = (int)repeat, .rng = 12345};
    json_t *out = NULL;
    /* the backend first: one that can make synthetic weights itself gets
     * them deferred, so no host copy of a large model is ever built */
    struct moe_backend_opts bo;
    moe_cli_backend_opts(&bo, threads);
    bo.quant = quant;
    double *warm = NULL;
    if (moe_cli_offload_opts(&bo, gpu_experts, xpolicy, xwarm, cpu_rows, &warm) == MOE_OK &&
        moe_backend_init(&be, backend, &bo) == MOE_OK)
        mo.device_weights = mo.synthetic && be.ops->synth_fill;
    free(warm);
    if (!be.ops || !dec || moe_cli_open_model(&m, &mo) != MOE_OK) {
        moe_cli_error("bench", "%s", moe_last_error());
        goto done;
    }
    if (serve) {
        rc = bench_serve_mode(&m, &be, &mo, &eo, &sv, &so, json);
        goto done;
    }
    if ((copy_bw || ng > 0 || ne > 0 || gpu_experts) && strcmp(be.ops->name, "cuda")) {
        moe_cli_error("bench", "--copy-bandwidth, --gemm-compare, --expert-kernels and --gpu-experts need "
                      "the CUDA backend");
        goto done;
    }
    for (int i = 0; i < np; i++) max_p = plens[i] > max_p ? plens[i] : max_p;
    for (int i = 0; i < nb; i++) max_b = bsizes[i] > max_b ? bsizes[i] : max_b;
    if (max_p > m.cfg.max_pos || ctx + steps > m.cfg.max_pos) {
        moe_cli_error("bench", "lengths exceed the model's context of %d", m.cfg.max_pos);
        goto done;
    }
    const int block = 16;
    long blocks_p = (max_p + block - 1) / block, blocks_d = (long)max_b * ((ctx + steps + block - 1) / block);
    struct moe_runner_opts o = {
        .max_tokens = (int)(chunk > max_b ? chunk : max_b), .max_seqs = max_b, .max_logits = max_b,
        .block_size = block, .n_blocks = (int)(blocks_p > blocks_d ? blocks_p : blocks_d)};
    if (kv_arg) {
        if (!moe_cli_parse_kv_dtype(kv_arg, &o.kv_dtype)) {
            moe_cli_error("bench", "--kv-dtype '%s' (use " MOE_CLI_KV_DTYPES ")", kv_arg);
            goto done;
        }
        o.kv_dtype_set = true;
    }
    b.V = m.cfg.vocab;
    b.seqs = calloc((size_t)max_b, sizeof *b.seqs);
    b.tokens = malloc((size_t)(max_p > ctx ? max_p : ctx) * sizeof(int32_t) + (size_t)max_b * 4);
    if (!b.seqs || !b.tokens || moe_runner_init(&b.r, &m, &be, &o) != MOE_OK) {
        moe_cli_error("bench", "%s", moe_last_error());
        goto done;
    }
    if (moe_cli_stats_start(&so, &m, "bench")) goto done;
    b.r.fw.stats = moe_cli_stats_recorder(&so);
    out = json_pack("{s:s, s:s, s:s, s:i, s:b, s:s, s:i, s:[], s:[]}", "model",
                    mo.path ? mo.path : mo.synthetic, "backend", be.ops->name, "kernels",
                    moe_cpu_isa_name((enum moe_cpu_isa)moe_backend_cpu_isa(&be)), "threads",
                    be.n_threads, "stats", !so.off, "quantize",
                    be.quant == MOE_QUANT_Q8_0 ? "q8_0" : "none", "top_k", m.cfg.top_k, "prefill",
                    "decode");
    if (!json)
        printf("%-10s %8s %12s %14s\n", "phase", "size", "tokens/s", "time");
    const double t_loop = moe_cli_now();
    b.be = &be;
    for (int i = 0; i < np; i++) {
        double t;
        if (time_prefill(&b, plens[i], &t) != MOE_OK) {
            moe_cli_error("bench", "%s", moe_last_error());
            goto done;
        }
        json_t *e = json_pack("{s:i, s:f, s:f}", "tokens", plens[i], "seconds", t, "tokens_per_s", plens[i] / t);
        json_array_append_new(json_object_get(out, "prefill"), e);
        if (!json) printf("%-10s %8d %12.1f %12.2f ms\n", "prefill", plens[i], plens[i] / t, t * 1e3);
        offload_phase(&b, e, json);
    }
    for (int i = 0; i < nb; i++) {
        double t;
        if (time_decode(&b, bsizes[i], (int)ctx, (int)steps, &t) != MOE_OK) {
            moe_cli_error("bench", "%s", moe_last_error());
            goto done;
        }
        double tps = (double)bsizes[i] * (double)steps / t;
        dec[i] = (struct moe_bench_decode){bsizes[i], t / (double)steps, tps};
        json_t *e = json_pack("{s:i, s:i, s:i, s:f, s:f}", "batch", bsizes[i], "ctx", (int)ctx, "steps",
                              (int)steps, "step_ms", t / (double)steps * 1e3, "tokens_per_s", tps);
        json_array_append_new(json_object_get(out, "decode"), e);
        if (!json)
            printf("%-10s %8d %12.1f %9.2f ms/step\n", "decode", bsizes[i], tps, t / (double)steps * 1e3);
        offload_phase(&b, e, json);
    }
    if (so.on) { /* the recorder times itself: its share of all forward steps run here */
        double loop = moe_cli_now() - t_loop, rec = so.st.busy_s;
        json_object_set_new(out, "stats_seconds", json_real(rec));
        json_object_set_new(out, "loop_seconds", json_real(loop));
        if (!json)
            printf("statistics recording: %.3f ms of %.3f s of steps (%.4f%%); --no-stats turns it "
                   "off\n", rec * 1e3, loop, loop > 0 ? 100 * rec / loop : 0);
    }
    if (!strcmp(be.ops->name, "cuda")) { /* which paths the steps took */
        const json_int_t gr = moe_cuda_graph_replays(&be), xm = moe_cuda_mma_expert_calls(&be);
        json_object_set_new(out, "cuda_paths", json_pack("{s:I, s:I}", "graph_replays", gr,
                                                         "mma_expert_calls", xm));
        if (!json)
            printf("cuda: %lld steps replayed from graphs, %lld expert calls on the tensor-core "
                   "kernels\n", (long long)gr, (long long)xm);
    }
    if (copy_bw || ng > 0 || ne > 0) {
        struct moe_bench_gpu_opts go = {copy_bw, gtoks, ng, (int)ctx, b.r.kv.dtype, ebs, ne};
        if (moe_bench_gpu_extras(&m, &go, dec, nb, out, json)) goto done;
    }
    if (nb > 0 && strcmp(be.ops->name, "cuda")) { /* host memory roofline */
        const double bytes = decode_bytes(&m, (double)ctx + (double)steps / 2.0, b.r.kv.dtype);
        const double bw = moe_cli_copy_bandwidth(), rbw = moe_cli_read_bandwidth();
        const double roof = bw > 0 ? bw / bytes : 0, rroof = rbw / bytes;
        json_object_set_new(out, "roofline",
                            json_pack("{s:f, s:f, s:f, s:f, s:f}", "decode_bytes_per_token", bytes,
                                      "copy_bytes_per_s", bw, "decode_tokens_per_s", roof,
                                      "read_bytes_per_s", rbw, "read_decode_tokens_per_s", rroof));
        if (!json)
            printf("roofline: %.1f MB read per decode token; copy bandwidth %.2f GB/s (read + "
                   "written) -> %.1f tokens/s, read bandwidth %.2f GB/s -> %.1f tokens/s at "
                   "batch 1\n", bytes / 1e6, bw / 1e9, roof, rbw / 1e9, rroof);
    }
    if (json) {
        char *s = json_dumps(out, JSON_COMPACT);
        if (s) puts(s);
        free(s);
    }
    rc = moe_cli_stats_finish(&so, &m, &mo, &be, "bench");
done:
    moe_cli_stats_free(&so);
    if (b.seqs)
        for (int q = 0; q < max_b; q++) moe_seq_free(&b.r, &b.seqs[q]);
    free(b.seqs);
    free(b.tokens);
    moe_runner_free(&b.r);
    json_decref(out);
    moe_backend_free(&be);
    moe_model_free(&m);
    free(plens);
    free(bsizes);
    free(gtoks);
    free(ebs);
    free(dec);
    return rc;
}
