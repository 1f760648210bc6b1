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
 * figure is well below the copy figure (docs/performance.md).
 *
 * With --spec P, bench instead compares decoding with and without
 * speculation on the same requests (runtime/cli/bench_spec.h); with
 * --serve, the serving benchmark (bench_serve.h) runs on an engine with
 * the --spec options given. */
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/bench_gpu.h"
#include "runtime/core/clock.h"
#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_par.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/engine/runner.h"
#include "runtime/cli/bench_serve.h"
#include "runtime/cli/bench_spec.h"
#include "runtime/text/tokenizer.h"
#include "runtime/cli/stats_cli.h"

struct bench_opts {
    struct moe_cli_engine eng;
    struct moe_cli_stats st;
    const char *prefill, *decode, *gemm_compare, *expert_kernels; /* comma-separated sizes */
    long ctx, steps, chunk, repeat;
    bool json, copy_bandwidth, serve;
    long requests, input_len, output_len; /* --serve; output_len also --spec */
    double rate, range_ratio;
    const char *prompts;                  /* --spec: a prompt file, one per line */
};

#define CMD(member) .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct bench_opts, member)
static const struct moe_cli_opt rows[] = {
    {.name = "prefill", .arg = "LIST", .kind = MOE_CLI_STRING, CMD(prefill),
     .help = "prompt lengths to time (default 128,512)"},
    {.name = "decode", .arg = "LIST", .kind = MOE_CLI_STRING, CMD(decode),
     .help = "decode batch sizes to time (default 1,8,32)"},
    {.name = "ctx", .arg = "N", .kind = MOE_CLI_INT, CMD(ctx), .lo = 1, .hi = 1 << 24,
     .help = "context of each sequence before decode (default 128)"},
    {.name = "steps", .arg = "N", .kind = MOE_CLI_INT, CMD(steps), .lo = 1, .hi = 1 << 24,
     .help = "decode steps per measurement (default 16)"},
    {.name = "chunk", .arg = "N", .kind = MOE_CLI_INT, CMD(chunk), .lo = 1, .hi = 1 << 24,
     .help = "prefill chunk size (default 512)"},
    {.name = "repeat", .arg = "N", .kind = MOE_CLI_INT, CMD(repeat), .lo = 1, .hi = 1 << 24,
     .help = "runs per measurement, best reported (default 3)"},
    {.name = "json", .kind = MOE_CLI_FLAG, CMD(json),
     .help = "one JSON object on stdout instead of a table"},
    {.name = "copy-bandwidth", .kind = MOE_CLI_FLAG, CMD(copy_bandwidth),
     .help = "measure device copy bandwidth; report decode against the\n"
             "HBM roofline (CUDA)"},
    {.name = "gemm-compare", .arg = "LIST", .kind = MOE_CLI_STRING, CMD(gemm_compare),
     .help = "grouped expert GEMM vs dense cuBLAS at LIST tokens (CUDA)"},
    {.name = "expert-kernels", .arg = "LIST", .kind = MOE_CLI_STRING, CMD(expert_kernels),
     .help = "the decode expert kernels alone at LIST batch sizes, with\n"
             "bf16, MXFP4, FP8 and Q8_0 weights of the model's shape (CUDA)"},
    {.name = "serve", .kind = MOE_CLI_FLAG, CMD(serve),
     .help = "the serving benchmark instead (vLLM bench serve style)"},
    {.name = "requests", .arg = "N", .kind = MOE_CLI_INT, CMD(requests), .lo = 1, .hi = 1 << 24,
     .help = "--serve: requests (default 64)"},
    {.name = "rate", .arg = "R", .kind = MOE_CLI_DOUBLE, CMD(rate), .lo = 0, .hi = INFINITY,
     .help = "--serve: Poisson arrivals at R requests/s (default: all\nat once)"},
    {.name = "input-len", .arg = "I", .kind = MOE_CLI_INT, CMD(input_len), .lo = 1, .hi = 1 << 24,
     .help = "--serve: prompt tokens per request (default 128)"},
    {.name = "output-len", .arg = "O", .kind = MOE_CLI_INT, CMD(output_len), .lo = 1, .hi = 1 << 24,
     .help = "--serve, --spec: tokens generated per request (default 64)"},
    {.name = "prompts", .arg = "FILE", .kind = MOE_CLI_STRING, CMD(prompts),
     .help = "--spec: prompts, one a line, through the tokenizer; a\n"
             "line that is a JSON object gives its \"prompt\" string\n"
             "(default: --ctx random ids)"},
    {.name = "range-ratio", .arg = "F", .kind = MOE_CLI_DOUBLE, CMD(range_ratio), .lo = 0, .hi = 1,
     .open = MOE_CLI_HI_OPEN,
     .help = "--serve: lengths uniform in [len*(1-F), len*(1+F)]\n(default 0)"},
};
#undef CMD

static const char *const shared[] = {"@model", "@engine", "@spec", "@offload", "@stats", NULL};

static const struct moe_cli_command bench_cmd = {
    .name = "bench",
    .usage = "usage: moerun bench MODEL_DIR [options]\n"
             "       moerun bench --synthetic CONFIG.json [options]\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
    .shared = shared,
    .footer = "The engine options (--kv-budget, --kv-block, --max-batch-tokens, --max-seqs,\n"
             "--no-prefix-cache) set the engine of --serve.  With --gpu-experts, bench\n"
             "reports the share of routed experts found on the GPU and the MB copied in per\n"
             "token, and with --gpu-experts-cpu-rows the expert uses computed on the CPU.\n"
             "Statistics are recorded unless --no-stats (compare the two to see their cost).\n"
             "With --spec P, bench times greedy decoding at each --decode batch size with\n"
             "and without speculation, alternating the two --repeat times, and reports\n"
             "tokens/s, the speedup and the acceptance (--output-len tokens a request;\n"
             "request i takes line i of --prompts, cycling).\n",
    .engine_at = offsetof(struct bench_opts, eng),
    .stats_at = offsetof(struct bench_opts, st),
};

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct bench_ctx {
    struct moe_runner r;
    struct moe_seq *seqs;
    int32_t *tokens;
    int V, chunk, repeat;
    uint64_t rng;
    /* expert offload (--gpu-experts) within the timed steps of a phase */
    int n_seqs;
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

/* One measurement: a prefill of `size` tokens or decode steps at batch `size`. */
struct bench_phase {
    int size;
    double seconds;          /* best of --repeat: the whole prefill, or all --steps decode steps */
    bool offload;            /* --gpu-experts: the figures below were measured */
    double hit_rate, mb_in_per_token, cpu_per_token;
};

/* The phase's offload figures over its timed steps (when offloaded); resets them. */
static void offload_phase(struct bench_ctx *b, struct bench_phase *ph)
{
    struct moe_offload_stats now;
    moe_cuda_offload_stats(b->be, &now);
    if (now.layers > 0 && b->off_tokens > 0) {
        ph->offload = true;
        ph->hit_rate = b->off.accesses ? (double)b->off.hits / (double)b->off.accesses : 1;
        ph->mb_in_per_token = (double)b->off.bytes_in / b->off_tokens / 1e6;
        ph->cpu_per_token = (double)b->off.cpu_uses / b->off_tokens;
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
        double t0 = moe_seconds();
        for (int off = 0; off < P; off += b->chunk) {
            int n = P - off < b->chunk ? P - off : b->chunk;
            struct moe_chunk c = {&b->seqs[0], b->tokens + off, n, false, false, 0};
            MOE_TRY(moe_runner_step(&b->r, &c, 1, NULL, NULL, NULL, NULL));
        }
        double t = moe_seconds() - t0;
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
        double t0 = moe_seconds();
        for (int st = 0; st < steps && s == MOE_OK; st++)
            s = moe_runner_step(&b->r, ch, B, NULL, b->tokens, NULL, NULL);
        double t = moe_seconds() - t0;
        if (rep > 0) offload_add(b, &at, (double)B * steps);
        for (int q = 0; q < B; q++) moe_seq_reset(&b->r, &b->seqs[q]);
        if (rep > 0 && t < *best) *best = t;
    }
    free(ch);
    return s;
}

/* --serve: the engine under a stream of requests (runtime/cli/bench_serve.c). */
static int bench_serve_mode(const struct moe_model *m, struct moe_backend *be, struct bench_opts *o)
{
    const struct moe_bench_serve_opts sv = {.n_requests = (int)o->requests, .rate = o->rate,
                                            .input_len = (int)o->input_len, .output_len = (int)o->output_len,
                                            .range_ratio = o->range_ratio, .seed = 7};
    const struct moe_cli_model_opts *mo = &o->eng.model;
    struct moe_engine e = {0};
    json_t *res = NULL;
    int rc = 1;
    if (!o->eng.kv_budget) o->eng.kv_budget = "0.25";
    if ((long)sv.input_len * 2 + sv.output_len * 2 > m->cfg.max_pos)
        return moe_cli_error("bench", "input and output lengths exceed the model's context of %d", m->cfg.max_pos);
    if (moe_cli_engine_start(&o->eng, m, be, 0, &e) != MOE_OK) return moe_cli_error("bench", "%s", moe_last_error());
    if (moe_cli_stats_start(&o->st, m, "bench")) goto done;
    e.r.fw.stats = moe_cli_stats_recorder(&o->st);
    if (moe_bench_serve(&e, &sv, o->json, &res) != MOE_OK) {
        moe_cli_error("bench", "%s", moe_last_error());
        goto done;
    }
    if (o->json) {
        json_t *out = json_pack("{s:s, s:s, s:i, s:O}", "model", mo->path ? mo->path : mo->synthetic,
                                "backend", be->ops->name, "threads", be->n_threads, "serve", res);
        char *s = out ? json_dumps(out, JSON_COMPACT) : NULL;
        if (s) puts(s);
        free(s);
        json_decref(out);
    }
    rc = moe_cli_stats_finish(&o->st, m, mo, be, "bench");
done:
    json_decref(res);
    moe_engine_free(&e);
    return rc;
}

/* The sizes of the list options, each a comma-separated list of positive integers. */
struct bench_lists {
    int32_t *prefill, *decode, *gemm, *experts;
    int n_prefill, n_decode, n_gemm, n_experts;
};

/* --spec: the prompts, one a line of --prompts through the model's
 * tokenizer (a line that is a JSON object: its "prompt" string), or one of
 * --ctx seeded random ids. */
struct spec_prompts {
    int32_t **ids;
    int *len;
    int n;
};

static void spec_prompts_free(struct spec_prompts *p)
{
    for (int i = 0; i < p->n; i++) free(p->ids[i]);
    free(p->ids);
    free(p->len);
}

static int spec_prompts_read(const struct bench_opts *o, const struct moe_model *m, struct spec_prompts *p)
{
    *p = (struct spec_prompts){0};
    if (!o->prompts) {
        uint64_t rng = 12345;
        p->ids = malloc(sizeof *p->ids);
        p->len = malloc(sizeof *p->len);
        if (!p->ids || !p->len || !(p->ids[0] = malloc((size_t)o->ctx * sizeof(int32_t))))
            return moe_cli_error("bench", "out of memory");
        p->n = 1;
        p->len[0] = (int)o->ctx;
        for (int i = 0; i < o->ctx; i++) p->ids[0][i] = (int32_t)(rng_next(&rng) % (uint64_t)m->cfg.vocab);
        return 0;
    }
    struct moe_tokenizer tok = {0};
    FILE *f = fopen(o->prompts, "rb");
    size_t len = 0;
    char *text = f ? moe_cli_read_all(f, &len) : NULL;
    if (f) fclose(f);
    int rc = 0;
    if (!text) rc = moe_cli_error("bench", "--prompts %s cannot be read", o->prompts);
    else if (!o->eng.model.path || moe_tokenizer_load(&tok, o->eng.model.path) != MOE_OK)
        rc = moe_cli_error("bench", "--prompts needs the model's tokenizer%s%s", o->eng.model.path ? ": " : "",
                           o->eng.model.path ? moe_last_error() : " (a model folder, not --synthetic)");
    int cap = 1;
    for (size_t i = 0; !rc && i < len; i++) cap += text[i] == '\n';
    if (!rc && (!(p->ids = calloc((size_t)cap, sizeof *p->ids)) || !(p->len = calloc((size_t)cap, sizeof *p->len))))
        rc = moe_cli_error("bench", "out of memory");
    int line_no = 0;
    for (char *line = text, *end; !rc && line && *line; line = end ? end + 1 : NULL) {
        end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line), k;
        bool bad = false;
        line_no++;
        if (n == 0) continue;
        /* a JSON line (models/demo-prompts.jsonl): its "prompt" string */
        json_t *j = line[0] == '{' ? json_loadb(line, n, 0, NULL) : NULL;
        const char *prompt = json_string_value(json_object_get(j, "prompt"));
        if (line[0] == '{' && !prompt) {
            rc = moe_cli_error("bench", "--prompts %s line %d: a JSON line needs a \"prompt\" string",
                               o->prompts, line_no);
            json_decref(j);
            break;
        }
        const char *src = prompt ? prompt : line;
        if (prompt) n = json_string_length(json_object_get(j, "prompt"));
        if (moe_tokenizer_encode(&tok, src, n, true, &p->ids[p->n], &k, &bad) != MOE_OK)
            rc = moe_cli_error("bench", "--prompts %s: %s", o->prompts, moe_last_error());
        else if ((long)k + o->output_len > m->cfg.max_pos)
            rc = moe_cli_error("bench", "--prompts %s: a prompt of %zu tokens + --output-len %ld exceeds the "
                               "model's context of %d", o->prompts, k, o->output_len, m->cfg.max_pos);
        else p->len[p->n++] = (int)k;
        json_decref(j);
    }
    if (!rc && p->n == 0) rc = moe_cli_error("bench", "--prompts %s holds no prompt", o->prompts);
    free(text);
    moe_tokenizer_free(&tok);
    return rc;
}

/* --spec: the same requests on an engine with speculation and one without
 * (runtime/cli/bench_spec.c). */
static int bench_spec_mode(const struct moe_model *m, struct moe_backend *be, struct bench_opts *o,
                           const struct bench_lists *l)
{
    struct spec_prompts p;
    struct moe_engine plain = {0}, spec = {0};
    json_t *res = NULL;
    int rc = spec_prompts_read(o, m, &p);
    long max_b = 1, max_len = 0;
    for (int i = 0; i < l->n_decode; i++) max_b = l->decode[i] > max_b ? l->decode[i] : max_b;
    for (int i = 0; i < p.n; i++) max_len = p.len[i] > max_len ? p.len[i] : max_len;
    /* every request at once, with room for its drafts */
    const long tokens = max_b * (max_len + o->output_len + MOE_SPEC_MAX_TOKENS + o->eng.kv_block);
    struct moe_cli_engine plain_eo = o->eng;
    plain_eo.spec.kind = MOE_SPEC_NONE;
    plain_eo.model.draft = NULL;
    if (!rc && (moe_cli_engine_start(&plain_eo, m, be, tokens, &plain) != MOE_OK ||
                moe_cli_engine_start(&o->eng, m, be, tokens, &spec) != MOE_OK))
        rc = moe_cli_error("bench", "%s", moe_last_error());
    if (!rc) rc = moe_cli_stats_start(&o->st, m, "bench");
    const struct moe_bench_spec_opts so = {(const int32_t *const *)p.ids, p.len, p.n, l->decode, l->n_decode,
                                           (int)o->output_len, (int)o->repeat};
    if (!rc) {
        plain.r.fw.stats = spec.r.fw.stats = moe_cli_stats_recorder(&o->st);
        if (moe_bench_spec(&plain, &spec, &so, o->json, &res) != MOE_OK)
            rc = moe_cli_error("bench", "%s", moe_last_error());
    }
    if (!rc && o->json) {
        const struct moe_cli_model_opts *mo = &o->eng.model;
        json_int_t prompt_tokens = 0;
        for (int i = 0; i < p.n; i++) prompt_tokens += p.len[i];
        json_t *out = json_pack("{s:s, s:s, s:i, s:s, s:i, s:I, s:O}", "model", mo->path ? mo->path : mo->synthetic,
                                "backend", be->ops->name, "threads", be->n_threads, "prompts",
                                o->prompts ? o->prompts : "random", "n_prompts", p.n, "prompt_tokens",
                                prompt_tokens, "spec", res);
        char *txt = out ? json_dumps(out, JSON_COMPACT) : NULL;
        if (txt) puts(txt);
        free(txt);
        json_decref(out);
    }
    if (!rc) rc = moe_cli_stats_finish(&o->st, m, &o->eng.model, be, "bench");
    json_decref(res);
    moe_engine_free(&spec);
    moe_engine_free(&plain);
    spec_prompts_free(&p);
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

static void lists_free(struct bench_lists *l)
{
    free(l->prefill);
    free(l->decode);
    free(l->gemm);
    free(l->experts);
}

static int parse_list(const char *s, int32_t **v, int *n, const char *what)
{
    if (!s) return 0;
    if (moe_cli_parse_ids(s, v, n) != MOE_OK) return moe_cli_error("bench", "%s: %s", what, moe_last_error());
    for (int i = 0; i < *n; i++)
        if ((*v)[i] <= 0) return moe_cli_error("bench", "%s: values must be positive", what);
    return 0;
}

/* Parses the command line into o and l; -1 to go on, else the exit code. */
static int bench_parse(int argc, char **argv, struct bench_opts *o, struct bench_lists *l)
{
    *o = (struct bench_opts){.prefill = "128,512", .decode = "1,8,32", .ctx = 128, .steps = 16, .chunk = 512,
                             .repeat = 3, .requests = 64, .input_len = 128, .output_len = 64};
    moe_cli_engine_defaults(&o->eng);
    struct moe_cli_args a;
    int rc = moe_cli_parse(&bench_cmd, argc, argv, o, &a);
    if (rc >= 0) return rc;
    if (moe_cli_stats_check(&o->st, "bench")) return 1;
    if (a.n_pos > 0) o->eng.model.path = a.pos[0];
    if (a.n_pos > 1) return moe_cli_error("bench", "unexpected argument '%s'", a.pos[1]);
    if (parse_list(o->prefill, &l->prefill, &l->n_prefill, "--prefill") ||
        parse_list(o->decode, &l->decode, &l->n_decode, "--decode") ||
        parse_list(o->gemm_compare, &l->gemm, &l->n_gemm, "--gemm-compare") ||
        parse_list(o->expert_kernels, &l->experts, &l->n_experts, "--expert-kernels"))
        return 1;
    return -1;
}

/* The backend first: one that can make synthetic weights itself gets them
 * deferred, so no host copy of a large model is ever built.  Then the model. */
static int bench_open(struct bench_opts *o, struct moe_backend *be, struct moe_model *m)
{
    struct moe_backend_opts bo;
    moe_cli_backend_opts(&bo, o->eng.threads);
    enum moe_weight_quant q = MOE_QUANT_NONE;
    if (o->eng.quantize) (void)moe_cli_parse_quant(o->eng.quantize, &q); /* checked when parsed */
    bo.quant = q;
    moe_cli_isa_for_quant(&bo);
    double *warm = NULL;
    uint8_t *plan = NULL;
    if (moe_cli_offload_opts(&bo, o->eng.gpu_experts, o->eng.gpu_experts_policy, o->eng.gpu_experts_warm,
                             o->eng.gpu_experts_cpu_rows, &warm) == MOE_OK &&
        (!o->eng.expert_plan ||
         moe_cli_expert_plan(&bo, o->eng.expert_plan, o->eng.hot_share > 0 ? o->eng.hot_share : MOE_CLI_HOT_SHARE,
                             q, &plan) == MOE_OK) &&
        moe_backend_init(be, o->eng.backend, &bo) == MOE_OK)
        o->eng.model.device_weights = o->eng.model.synthetic && be->ops->synth_fill;
    free(warm);
    free(plan);
    if (!be->ops || moe_cli_open_model(m, &o->eng.model) != MOE_OK) return moe_cli_error("bench", "%s", moe_last_error());
    return 0;
}

/* What bench measured: the text table and the JSON object both come from it. */
struct bench_result {
    const char *model, *backend, *kernels, *quantize;
    int threads, top_k, ctx, steps;
    bool stats;                       /* the recorder was on */
    struct bench_phase *prefill, *decode;
    int n_prefill, n_decode;
    double stats_s, loop_s;           /* stats: the recorder's time, all timed steps' time */
    bool cuda;                        /* the CUDA backend: which paths the steps took */
    long long graph_replays, mma_expert_calls;
    json_t *gpu;                      /* the GPU measurements (bench_gpu.c), or NULL */
    bool roofline;                    /* the host memory roofline of batch-1 decode */
    double decode_bytes, copy_bw, read_bw;
};

static void result_free(struct bench_result *r)
{
    free(r->prefill);
    free(r->decode);
    json_decref(r->gpu);
}

/* --- the text report: a row as each measurement ends, then the lines after them --- */

static void print_phase(const char *phase, const struct bench_result *r, const struct bench_phase *ph)
{
    if (phase[0] == 'p')
        printf("%-10s %8d %12.1f %12.2f ms\n", phase, ph->size, ph->size / ph->seconds, ph->seconds * 1e3);
    else
        printf("%-10s %8d %12.1f %9.2f ms/step\n", phase, ph->size, (double)ph->size * r->steps / ph->seconds,
               ph->seconds / r->steps * 1e3);
    if (ph->offload)
        printf("%-10s %8s %11.1f%% %9.2f MB/token copied in, %.2f expert uses/token on the CPU\n", "  offload", "",
               100 * ph->hit_rate, ph->mb_in_per_token, ph->cpu_per_token);
}

static void print_paths(const struct bench_result *r)
{
    if (r->stats)
        printf("statistics recording: %.3f ms of %.3f s of steps (%.4f%%); --no-stats turns it off\n",
               r->stats_s * 1e3, r->loop_s, r->loop_s > 0 ? 100 * r->stats_s / r->loop_s : 0);
    if (r->cuda)
        printf("cuda: %lld steps replayed from graphs, %lld expert calls on the tensor-core kernels\n",
               r->graph_replays, r->mma_expert_calls);
}

static void print_roofline(const struct bench_result *r)
{
    if (r->roofline)
        printf("roofline: %.1f MB read per decode token; copy bandwidth %.2f GB/s (read + written) -> %.1f "
               "tokens/s, read bandwidth %.2f GB/s -> %.1f tokens/s at batch 1\n", r->decode_bytes / 1e6,
               r->copy_bw / 1e9, r->copy_bw / r->decode_bytes, r->read_bw / 1e9, r->read_bw / r->decode_bytes);
}

/* --- the JSON report --- */

static json_t *phase_json(const struct bench_result *r, const struct bench_phase *ph, bool decode)
{
    json_t *e = decode ? json_pack("{s:i, s:i, s:i, s:f, s:f}", "batch", ph->size, "ctx", r->ctx, "steps", r->steps,
                                   "step_ms", ph->seconds / r->steps * 1e3, "tokens_per_s",
                                   (double)ph->size * r->steps / ph->seconds)
                       : json_pack("{s:i, s:f, s:f}", "tokens", ph->size, "seconds", ph->seconds, "tokens_per_s",
                                   ph->size / ph->seconds);
    if (e && ph->offload)
        json_object_set_new(e, "offload", json_pack("{s:f, s:f, s:f}", "hit_rate", ph->hit_rate, "mb_in_per_token",
                                                    ph->mb_in_per_token, "cpu_experts_per_token", ph->cpu_per_token));
    return e;
}

static void print_json(const struct bench_result *r)
{
    json_t *out = json_pack("{s:s, s:s, s:s, s:i, s:b, s:s, s:i, s:[], s:[]}", "model", r->model, "backend",
                            r->backend, "kernels", r->kernels, "threads", r->threads, "stats", r->stats,
                            "quantize", r->quantize, "top_k", r->top_k, "prefill", "decode");
    if (!out) return;
    for (int i = 0; i < r->n_prefill; i++)
        json_array_append_new(json_object_get(out, "prefill"), phase_json(r, &r->prefill[i], false));
    for (int i = 0; i < r->n_decode; i++)
        json_array_append_new(json_object_get(out, "decode"), phase_json(r, &r->decode[i], true));
    if (r->stats) {
        json_object_set_new(out, "stats_seconds", json_real(r->stats_s));
        json_object_set_new(out, "loop_seconds", json_real(r->loop_s));
    }
    if (r->cuda)
        json_object_set_new(out, "cuda_paths", json_pack("{s:I, s:I}", "graph_replays", (json_int_t)r->graph_replays,
                                                         "mma_expert_calls", (json_int_t)r->mma_expert_calls));
    if (r->gpu) json_object_set(out, "gpu", r->gpu);
    if (r->roofline)
        json_object_set_new(out, "roofline",
                            json_pack("{s:f, s:f, s:f, s:f, s:f}", "decode_bytes_per_token", r->decode_bytes,
                                      "copy_bytes_per_s", r->copy_bw, "decode_tokens_per_s",
                                      r->copy_bw > 0 ? r->copy_bw / r->decode_bytes : 0, "read_bytes_per_s",
                                      r->read_bw, "read_decode_tokens_per_s", r->read_bw / r->decode_bytes));
    char *s = json_dumps(out, JSON_COMPACT);
    if (s) puts(s);
    free(s);
    json_decref(out);
}

/* --- the measurements --- */

/* The runner for the largest sizes asked, and the bench's buffers. */
static int bench_prepare(struct bench_ctx *b, const struct bench_opts *o, const struct bench_lists *l,
                         const struct moe_model *m, struct moe_backend *be)
{
    int max_p = 0, max_b = 1;
    for (int i = 0; i < l->n_prefill; i++) max_p = l->prefill[i] > max_p ? l->prefill[i] : max_p;
    for (int i = 0; i < l->n_decode; i++) max_b = l->decode[i] > max_b ? l->decode[i] : max_b;
    if (max_p > m->cfg.max_pos || o->ctx + o->steps > m->cfg.max_pos)
        return moe_cli_error("bench", "lengths exceed the model's context of %d", m->cfg.max_pos);
    const int block = 16;
    const long blocks_p = (max_p + block - 1) / block,
               blocks_d = (long)max_b * ((o->ctx + o->steps + block - 1) / block);
    struct moe_runner_opts ro = {
        .max_tokens = (int)(o->chunk > max_b ? o->chunk : max_b), .max_seqs = max_b, .max_logits = max_b,
        .block_size = block, .n_blocks = (int)(blocks_p > blocks_d ? blocks_p : blocks_d)};
    if (o->eng.kv_dtype) ro.kv_dtype_set = moe_cli_parse_kv_dtype(o->eng.kv_dtype, &ro.kv_dtype);
    *b = (struct bench_ctx){.chunk = (int)o->chunk, .repeat = (int)o->repeat, .rng = 12345, .V = m->cfg.vocab,
                            .be = be, .n_seqs = max_b};
    b->seqs = calloc((size_t)max_b, sizeof *b->seqs);
    b->tokens = malloc((size_t)(max_p > o->ctx ? max_p : o->ctx) * sizeof(int32_t) + (size_t)max_b * 4);
    if (!b->seqs || !b->tokens || moe_cli_par_runner(&o->eng, be, &ro) != MOE_OK ||
        moe_runner_init(&b->r, m, be, &ro) != MOE_OK)
        return moe_cli_error("bench", "%s", moe_last_error());
    return 0;
}

static void bench_ctx_free(struct bench_ctx *b)
{
    if (b->seqs)
        for (int q = 0; q < b->n_seqs; q++) moe_seq_free(&b->r, &b->seqs[q]);
    free(b->seqs);
    free(b->tokens);
    moe_runner_free(&b->r);
}

/* Times every --prefill and --decode size into r, printing each row as it ends. */
static int bench_measure(struct bench_ctx *b, const struct bench_opts *o, const struct bench_lists *l,
                         struct bench_result *r)
{
    r->prefill = calloc((size_t)l->n_prefill + 1, sizeof *r->prefill);
    r->decode = calloc((size_t)l->n_decode + 1, sizeof *r->decode);
    if (!r->prefill || !r->decode) return moe_cli_error("bench", "out of memory");
    if (!o->json && !r->cuda) printf("backend %s, kernels %s, %d threads\n", r->backend, r->kernels, r->threads);
    if (!o->json) printf("%-10s %8s %12s %14s\n", "phase", "size", "tokens/s", "time");
    const double t_loop = moe_seconds();
    for (int i = 0; i < l->n_prefill; i++, r->n_prefill++) {
        struct bench_phase *ph = &r->prefill[i];
        ph->size = l->prefill[i];
        if (time_prefill(b, ph->size, &ph->seconds) != MOE_OK) return moe_cli_error("bench", "%s", moe_last_error());
        offload_phase(b, ph);
        if (!o->json) print_phase("prefill", r, ph);
    }
    for (int i = 0; i < l->n_decode; i++, r->n_decode++) {
        struct bench_phase *ph = &r->decode[i];
        ph->size = l->decode[i];
        if (time_decode(b, ph->size, (int)o->ctx, (int)o->steps, &ph->seconds) != MOE_OK)
            return moe_cli_error("bench", "%s", moe_last_error());
        offload_phase(b, ph);
        if (!o->json) print_phase("decode", r, ph);
    }
    r->loop_s = moe_seconds() - t_loop;
    r->stats_s = o->st.on ? o->st.st.busy_s : 0; /* the recorder times itself */
    return 0;
}

/* The CUDA measurements of --copy-bandwidth, --gemm-compare and --expert-kernels. */
static int bench_gpu(const struct bench_opts *o, const struct bench_lists *l, const struct moe_model *m,
                     const struct bench_ctx *b, struct bench_result *r)
{
    if (!o->copy_bandwidth && l->n_gemm == 0 && l->n_experts == 0) return 0;
    struct moe_bench_decode *dec = calloc((size_t)r->n_decode + 1, sizeof *dec);
    json_t *holder = json_object();
    int rc = 1;
    if (dec && holder) {
        for (int i = 0; i < r->n_decode; i++)
            dec[i] = (struct moe_bench_decode){r->decode[i].size, r->decode[i].seconds / r->steps,
                                               (double)r->decode[i].size * r->steps / r->decode[i].seconds};
        const struct moe_bench_gpu_opts go = {o->copy_bandwidth, l->gemm, l->n_gemm, (int)o->ctx, b->r.kv.dtype,
                                              l->experts, l->n_experts};
        rc = moe_bench_gpu_extras(m, &go, dec, r->n_decode, holder, o->json);
        r->gpu = json_incref(json_object_get(holder, "gpu"));
    }
    free(dec);
    json_decref(holder);
    return rc;
}

int moe_cli_bench(int argc, char **argv)
{
    struct bench_opts o;
    struct bench_lists l = {0};
    struct moe_model m = {0};
    struct moe_backend be = {0};
    struct bench_ctx b = {0};
    struct bench_result r = {0};
    if (argc > 1 && !strcmp(argv[1], "verify")) return moe_cli_bench_verify(argc - 1, argv + 1);
    int rc = bench_parse(argc, argv, &o, &l);
    if (rc >= 0 || (rc = bench_open(&o, &be, &m))) goto done;
    rc = 1;
    if (o.serve) {
        rc = bench_serve_mode(&m, &be, &o);
        goto done;
    }
    if (o.eng.spec.kind != MOE_SPEC_NONE || o.eng.model.draft) {
        rc = bench_spec_mode(&m, &be, &o, &l);
        goto done;
    }
    if ((o.copy_bandwidth || l.n_gemm > 0 || l.n_experts > 0 || o.eng.gpu_experts) && strcmp(be.ops->name, "cuda")) {
        moe_cli_error("bench", "--copy-bandwidth, --gemm-compare, --expert-kernels and --gpu-experts need "
                      "the CUDA backend");
        goto done;
    }
    if (bench_prepare(&b, &o, &l, &m, &be) || moe_cli_stats_start(&o.st, &m, "bench")) goto done;
    b.r.fw.stats = moe_cli_stats_recorder(&o.st);
    r = (struct bench_result){
        .model = o.eng.model.path ? o.eng.model.path : o.eng.model.synthetic, .backend = be.ops->name,
        .kernels = moe_cpu_isa_name((enum moe_cpu_isa)moe_backend_cpu_isa(&be)), .threads = be.n_threads,
        .stats = o.st.on, .quantize = moe_cli_quant_name(be.quant), .top_k = m.cfg.top_k,
        .ctx = (int)o.ctx, .steps = (int)o.steps, .cuda = !strcmp(be.ops->name, "cuda")};
    if (bench_measure(&b, &o, &l, &r)) goto done;
    if (r.cuda) {
        r.graph_replays = (long long)moe_cuda_graph_replays(&be);
        r.mma_expert_calls = (long long)moe_cuda_mma_expert_calls(&be);
    }
    if (!o.json) print_paths(&r);
    if (bench_gpu(&o, &l, &m, &b, &r)) goto done;
    if (r.n_decode > 0 && !r.cuda) { /* the host memory roofline */
        r.roofline = true;
        r.decode_bytes = decode_bytes(&m, (double)o.ctx + (double)o.steps / 2.0, b.r.kv.dtype);
        r.copy_bw = moe_cli_copy_bandwidth();
        r.read_bw = moe_cli_read_bandwidth();
    }
    if (o.json) print_json(&r);
    else print_roofline(&r);
    rc = moe_cli_stats_finish(&o.st, &m, &o.eng.model, &be, "bench");
done:
    moe_cli_stats_free(&o.st);
    bench_ctx_free(&b);
    result_free(&r);
    moe_backend_free(&be);
    moe_model_free(&m);
    lists_free(&l);
    return rc;
}
