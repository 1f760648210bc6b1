/* cli_opts.c - see cli_opts.h: the shared rows, the parser built on
 * getopt_long, the help printer and the value checks. */
#include "runtime/cli/cli_opts.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli_common.h"
#include "runtime/cli/stats_cli.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/sampler.h"

/* --- checks of the shared options that are not a plain kind --- */

static bool parse_dtype(const char *arg, void *field)
{
    enum moe_dtype dt;
    if (!moe_cli_parse_dtype(arg, &dt)) return false;
    *(const char **)field = arg;
    return true;
}

static bool parse_kv_dtype(const char *arg, void *field)
{
    enum moe_dtype dt;
    if (!moe_cli_parse_kv_dtype(arg, &dt)) return false;
    *(const char **)field = arg;
    return true;
}

static bool parse_quant(const char *arg, void *field)
{
    enum moe_weight_quant q;
    if (!moe_cli_parse_quant(arg, &q)) return false;
    *(const char **)field = arg;
    return true;
}

static bool parse_budget(const char *arg, void *field)
{
    size_t b;
    if (moe_cli_parse_budget(arg, &b) != MOE_OK) return false;
    *(const char **)field = arg;
    return true;
}

/* "A:B" (record steps A..B-1) or "A:" (from A to the end) into struct moe_stats_opts. */
static bool parse_steps(const char *arg, void *field)
{
    struct moe_stats_opts *o = field;
    char buf[64], *colon;
    long a, b = 0;
    if ((size_t)snprintf(buf, sizeof buf, "%s", arg) >= sizeof buf || !(colon = strchr(buf, ':'))) return false;
    *colon = '\0';
    if (!moe_cli_parse_int(buf, 0, LONG_MAX, &a) || (colon[1] && !moe_cli_parse_int(colon + 1, 1, LONG_MAX, &b)) ||
        (b && b <= a))
        return false;
    o->step_from = a;
    o->step_to = b;
    return true;
}

/* --spec into struct moe_spec_opts (cli_common.c has the proposers' names). */
static bool parse_spec(const char *arg, void *field) { return moe_cli_parse_spec(arg, field); }
#define STR_(x) #x
#define STR(x) STR_(x) /* a number macro as text, for the help */

static const char *const backends[] = {"auto", "cpu", "cpu-ref", "cuda", NULL};
static const char *const policies[] = {"lru", "lfu", NULL};
static const char *const collectives[] = {"auto", "nccl", "mpi", NULL};

#define ENG(member) .at = MOE_CLI_AT_ENGINE, MOE_CLI_FIELD(struct moe_cli_engine, member)
#define STA(member) .at = MOE_CLI_AT_STATS, MOE_CLI_FIELD(struct moe_cli_stats, member)
#define SAM(member) .at = MOE_CLI_AT_SAMPLING, MOE_CLI_FIELD(struct moe_cli_sampling, member)

/* The groups are the runs of rows between the group markers (a row with
 * only a name starting with '@'). */
const struct moe_cli_opt moe_cli_shared_opts[] = {
    {.name = "@model"},
    {.name = "synthetic", .arg = "CONFIG", .kind = MOE_CLI_STRING, ENG(model.synthetic),
     .help = "random weights for CONFIG.json instead of a model folder"},
    {.name = "dtype", .arg = "T", .kind = MOE_CLI_CUSTOM, ENG(model.dtype), .parse = parse_dtype,
     .what = "use f32, f16 or bf16",
     .help = "synthetic weight dtype: f32, f16, bf16 (default bf16)"},
    {.name = "synthetic-seed", .arg = "S", .kind = MOE_CLI_INT, ENG(model.seed), .lo = 0,
     .hi = (double)LONG_MAX,
     .help = "synthetic weight seed (default 0)"},
    {.name = "moe-top-k", .arg = "K", .kind = MOE_CLI_INT, ENG(model.top_k), .lo = 1, .hi = 1 << 16,
     .help = "route each token to K experts instead of the model's top-k"},
    {.name = "ep", .arg = "N", .kind = MOE_CLI_INT, ENG(model.ep), .lo = 1, .hi = 4096,
     .help = "expert parallelism over N ranks: start with mpirun -n N;\n"
             "each rank holds 1/N of every layer's experts (default: the\n"
             "launch's world size)"},
    {.name = "tp", .arg = "M", .kind = MOE_CLI_INT, ENG(model.tp), .lo = 1, .hi = 4096,
     .help = "tensor parallelism: groups of M consecutive ranks split each\n"
             "attention layer's heads, the dense FFNs and shared experts;\n"
             "the experts spread over every rank, or with --ep N (N x M\n"
             "ranks) over the N groups (docs/parallel.md)"},
    {.name = "dp-attention", .kind = MOE_CLI_FLAG, ENG(model.dp_attention),
     .help = "with several ranks: data-parallel attention: each sequence's\n"
             "attention layers (and its K/V) on one rank, the rows\n"
             "gathered after each (docs/parallel.md)"},
    {.name = "ep-placement", .arg = "FILE", .kind = MOE_CLI_STRING, ENG(model.ep_placement),
     .help = "with several ranks: which experts each rank holds, per\n"
             "layer, with replicas (written by `moerun stats --ep N\n"
             "--placement-out FILE`; docs/parallel.md), or\n"
             "balanced:STATS (placed here from --stats-out's file)"},
    {.name = "comm-timeout", .arg = "S", .kind = MOE_CLI_DOUBLE, ENG(comm_timeout), .lo = 0, .hi = 86400,
     .open = MOE_CLI_LO_OPEN,
     .help = "with several ranks: seconds a collective may wait for the\n"
             "others before the job ends naming it (default 30)"},
    {.name = "collectives", .arg = "C", .kind = MOE_CLI_CHOICE, ENG(collectives), .choices = collectives,
     .help = "with several ranks on the CUDA backend: how expert rows and\n"
             "tensor-parallel sums travel: nccl (on the GPUs), mpi (through\n"
             "host memory), auto (nccl where every rank opens it; default)"},
    {.name = "@engine"},
    {.name = "kv-budget", .arg = "SIZE", .kind = MOE_CLI_CUSTOM, ENG(kv_budget), .parse = parse_budget,
     .what = "a size: 512MiB, 8GiB, or a fraction of available memory such as 0.25",
     .help = "KV cache size: bytes with a unit (512MiB, 8GiB) or a\n"
             "fraction of available memory (0.25)"},
    {.name = "kv-block", .arg = "N", .kind = MOE_CLI_INT, ENG(kv_block), .lo = 1, .hi = 4096,
     .help = "KV block size in tokens (default 16)"},
    {.name = "kv-dtype", .arg = "T", .kind = MOE_CLI_CUSTOM, ENG(kv_dtype), .parse = parse_kv_dtype,
     .what = "use " MOE_CLI_KV_DTYPES,
     .help = "KV element type: f32, f16, bf16, fp8 (default f32 on the CPU)"},
    {.name = "max-batch-tokens", .arg = "N", .kind = MOE_CLI_INT, ENG(max_batch_tokens), .lo = 1, .hi = 1 << 24,
     .help = "tokens per engine step (default 512)"},
    {.name = "max-seqs", .arg = "N", .kind = MOE_CLI_INT, ENG(max_seqs), .lo = 1, .hi = 1 << 16,
     .help = "sequences per engine step (default 64)"},
    {.name = "priority-aging", .arg = "S", .kind = MOE_CLI_DOUBLE, ENG(priority_aging), .lo = 0, .hi = 1e9,
     .open = MOE_CLI_LO_OPEN,
     .help = "seconds of waiting that lift a request one priority level\n"
             "(requests' \"priority\": lower is admitted first; default 10)"},
    {.name = "no-prefix-cache", .kind = MOE_CLI_FLAG, ENG(no_prefix_cache),
     .help = "do not reuse cached prompt blocks"},
    {.name = "backend", .arg = "NAME", .kind = MOE_CLI_CHOICE, ENG(backend), .choices = backends,
     .help = "auto (the default), cpu (fast kernels), cpu-ref (reference), cuda"},
    {.name = "threads", .arg = "N", .kind = MOE_CLI_INT, ENG(threads), .lo = 1, .hi = 4096,
     .help = "CPU threads (default: all cores)"},
    {.name = "quantize", .arg = "Q", .kind = MOE_CLI_CUSTOM, ENG(quantize), .parse = parse_quant,
     .what = "use q8_0, q4, q4_k_m, q5_k, q5_k_m, or none",
     .help = "quantize the weights at load: q8_0, 9 bits a weight (CPU\n"
             "and CUDA backends), or q4, four bits with the LM head at\n"
             "q8_0: ggml's Q4_K (4.5 bits a weight) where rows are\n"
             "multiples of 256, ggml's Q4_1 (5 bits) elsewhere; routers\n"
             "and the embedding stay as stored; or q4_k_m, q4 with\n"
             "llama.cpp's Q4_K_M choices: the LM head, and the down\n"
             "projections and attention V of some layers, at Q6_K\n"
             "(6.56 bits); or (CPU backends) q5_k, q4 with ggml's Q5_K\n"
             "(5.5 bits) in place of Q4_K, and q5_k_m, q5_k with\n"
             "llama.cpp's Q5_K_M choices (q4_k_m's)"},
    {.name = "expert-dtype-plan", .arg = "FILE", .kind = MOE_CLI_STRING, ENG(expert_plan),
     .help = "per-expert precision: FILE is statistics or a trace\n"
             "(--stats-out, --trace-out): each layer's hot experts keep\n"
             "their precision (q8_0 with --quantize), the rest take q4;\n"
             "or a JSON map {\"expert_dtypes\": {LAYER: {EXPERT: q4 |\n"
             "q8_0 | stored}}}"},
    {.name = "hot-share", .arg = "S", .kind = MOE_CLI_DOUBLE, ENG(hot_share), .lo = 0, .hi = 1,
     .open = MOE_CLI_LO_OPEN,
     .help = "--expert-dtype-plan from statistics: the hot experts take\n"
             "this share of a layer's routed pairs (default 0.8)"},
    {.name = "@spec"}, /* speculative decoding: the commands that generate */
    {.name = "spec", .arg = "P", .kind = MOE_CLI_CUSTOM, ENG(spec), .parse = parse_spec,
     .what = "use none, ngram, ngram:N with N from 1 to " STR(MOE_CLI_SPEC_NGRAM_MAX) ", or mtp",
     .help = "speculative decoding's proposer: none (the default), or\n"
             "ngram[:N], prompt lookup of the last N tokens (default 3);\n"
             "same output as without"},
    {.name = "draft", .arg = "DIR", .kind = MOE_CLI_STRING, ENG(model.draft),
     .help = "speculative decoding: the model in DIR (same tokenizer)\n"
             "drafts tokens that the model verifies (docs/engine.md)"},
    {.name = "spec-draft-sample", .kind = MOE_CLI_FLAG, ENG(spec.sample_drafts),
     .help = "--draft: sampled requests' drafts drawn from the draft's\n"
             "distribution, accepted by rejection sampling (more accepted;\n"
             "the same distribution, not a seed's same tokens)"},
    {.name = "spec-tokens", .arg = "K", .kind = MOE_CLI_INT, ENG(spec.tokens), .lo = 1, .hi = MOE_SPEC_MAX_TOKENS,
     .help = "tokens drafted per step (default 4)"},
    {.name = "spec-max-batch", .arg = "N", .kind = MOE_CLI_INT, ENG(spec.max_batch), .lo = 0, .hi = 1 << 16,
     .help = "speculate only while at most N requests run (default "
             STR(MOE_CLI_SPEC_MAX_BATCH) ";\n0: always)"},
    {.name = "spec-adaptive", .kind = MOE_CLI_FLAG, ENG(spec.adaptive),
     .help = "each request's K follows its recent acceptance, at most\n--spec-tokens"},
    {.name = "@offload"},
    {.name = "gpu-experts", .arg = "N", .kind = MOE_CLI_INT, ENG(gpu_experts), .lo = 1, .hi = 1 << 20,
     .help = "CUDA: keep N experts of each MoE layer in GPU memory, the\n"
             "rest in host memory, copied in when routed to (default\nall resident)"},
    {.name = "gpu-experts-policy", .arg = "P", .kind = MOE_CLI_CHOICE, ENG(gpu_experts_policy),
     .choices = policies,
     .help = "lru (default) or lfu: which expert leaves a slot"},
    {.name = "gpu-experts-warm", .arg = "FILE", .kind = MOE_CLI_STRING, ENG(gpu_experts_warm),
     .help = "start each layer's slots with its most loaded experts\n"
             "in FILE (statistics from --stats-out, or a trace)"},
    {.name = "gpu-experts-cpu-rows", .arg = "R", .kind = MOE_CLI_INT, ENG(gpu_experts_cpu_rows), .lo = 0,
     .hi = 1 << 20,
     .help = "a missed expert with at most R rows in a step runs\n"
             "on the CPU from host memory instead of being copied in\n(default 0: every miss copied in)"},
    {.name = "@stats"},
    {.name = "stats-out", .arg = "FILE", .kind = MOE_CLI_STRING, STA(json_path),
     .help = "expert-load statistics as JSON (docs/stats-format.md)"},
    {.name = "stats-csv", .arg = "FILE", .kind = MOE_CLI_STRING, STA(csv_path),
     .help = "the same, one row per (layer, expert)"},
    {.name = "trace-out", .arg = "PREFIX", .kind = MOE_CLI_STRING, STA(trace_prefix),
     .help = "routing trace: PREFIX.ids.npy, .weights.npy, .tokens.npy,\n.trace.json"},
    {.name = "stats-steps", .arg = "A:B", .kind = MOE_CLI_CUSTOM, STA(o), .parse = parse_steps,
     .what = "A:B with A < B, or A: for A to the end",
     .help = "record steps A..B-1 only (B empty: to the end)"},
    {.name = "stats-ring", .arg = "N", .kind = MOE_CLI_INT, STA(o.ring_steps), .lo = 1, .hi = 1 << 20,
     .help = "per-step counts kept for the last N steps (default 64)"},
    {.name = "no-stats", .kind = MOE_CLI_FLAG, STA(off),
     .help = "do not record statistics"},
    {.name = "router-skew", .arg = "SPEC", .kind = MOE_CLI_STRING, ENG(model.router_skew),
     .help = "synthetic router skew: zipf:S or hot:H:F (with --synthetic)"},
    {.name = "@sampling"},
    {.name = "max-tokens", .letter = 'n', .arg = "N", .kind = MOE_CLI_INT, SAM(max_tokens), .lo = 1, .hi = 1 << 24,
     .help = "tokens to generate (default 64; chat: 512 per reply)"},
    {.name = "temp", .arg = "T", .kind = MOE_CLI_DOUBLE, SAM(temperature), .lo = 0, .hi = INFINITY,
     .help = "temperature (0: greedy)"},
    {.name = "temperature", .arg = "T", .kind = MOE_CLI_DOUBLE, SAM(temperature), .lo = 0, .hi = INFINITY,
     .help = "the same as --temp"},
    {.name = "top-k", .arg = "K", .kind = MOE_CLI_INT, SAM(top_k), .lo = 0, .hi = 1 << 24,
     .help = "keep the K most likely tokens (0: all)"},
    {.name = "top-p", .arg = "P", .kind = MOE_CLI_DOUBLE, SAM(top_p), .lo = 0, .hi = 1, .open = MOE_CLI_LO_OPEN,
     .help = "keep the most likely tokens up to probability P"},
    {.name = "min-p", .arg = "M", .kind = MOE_CLI_DOUBLE, SAM(min_p), .lo = 0, .hi = 1,
     .help = "drop tokens less likely than M times the most likely"},
    {.name = "repeat-penalty", .arg = "R", .kind = MOE_CLI_DOUBLE, SAM(repetition_penalty), .lo = 0, .hi = INFINITY,
     .open = MOE_CLI_LO_OPEN,
     .help = "repetition penalty (1: none)"},
    {.name = "frequency-penalty", .arg = "F", .kind = MOE_CLI_DOUBLE, SAM(frequency_penalty), .lo = -INFINITY,
     .hi = INFINITY,
     .help = "frequency penalty (0: none)"},
    {.name = "presence-penalty", .arg = "P", .kind = MOE_CLI_DOUBLE, SAM(presence_penalty), .lo = -INFINITY,
     .hi = INFINITY,
     .help = "presence penalty (0: none)"},
    {.name = "seed", .arg = "S", .kind = MOE_CLI_INT, SAM(seed), .lo = 0, .hi = (double)LONG_MAX,
     .help = "sampling seed (default 0)"},
};
const int moe_cli_n_shared_opts = sizeof moe_cli_shared_opts / sizeof moe_cli_shared_opts[0];

static const struct moe_cli_opt help_row = {.name = "help", .letter = 'h', .help = "this text", .kind = MOE_CLI_FLAG};

/* --- the command's rows: its own, the shared ones it names, --help --- */

static void add_row(struct moe_cli_args *a, const struct moe_cli_opt *o)
{
    MOE_ASSERT(a->n_rows < MOE_CLI_MAX_OPTS);
    for (int i = 0; i < a->n_rows && o->name; i++) /* declared once */
        MOE_ASSERT(!a->rows[i]->name || strcmp(a->rows[i]->name, o->name));
    a->rows[a->n_rows++] = o;
}

static void add_shared(struct moe_cli_args *a, const char *name)
{
    bool found = false, in_group = false;
    for (int i = 0; i < moe_cli_n_shared_opts; i++) {
        const struct moe_cli_opt *o = &moe_cli_shared_opts[i];
        if (o->name[0] == '@') {
            in_group = !strcmp(o->name, name);
            found |= in_group;
        } else if (in_group || !strcmp(o->name, name)) {
            add_row(a, o);
            found = true;
        }
    }
    MOE_ASSERT(found); /* a command names a shared option that does not exist */
}

static void collect(const struct moe_cli_command *cmd, struct moe_cli_args *a)
{
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    for (int i = 0; i < cmd->n_rows; i++) add_row(a, &cmd->rows[i]);
    for (int i = 0; cmd->shared && cmd->shared[i]; i++) add_shared(a, cmd->shared[i]);
    add_row(a, &help_row);
}

/* --- help --- */

#define HELP_COL 23

static void print_row(FILE *f, const struct moe_cli_opt *o)
{
    if (!o->name) { /* a heading */
        fprintf(f, "%s\n", o->help);
        return;
    }
    char head[96];
    const char *sp = o->arg ? " " : "", *arg = o->arg ? o->arg : "";
    const int n = o->letter ? snprintf(head, sizeof head, "  -%c, --%s%s%s", o->letter, o->name, sp, arg)
                            : snprintf(head, sizeof head, "  --%s%s%s", o->name, sp, arg);
    fprintf(f, "%s%*s", head, n < HELP_COL ? HELP_COL - n : 2, "");
    for (const char *p = o->help; *p;) {
        const size_t len = strcspn(p, "\n");
        fprintf(f, "%.*s\n", (int)len, p);
        p += len;
        if (*p == '\n' && *++p) fprintf(f, "%*s", HELP_COL, "");
    }
}

void moe_cli_help(const struct moe_cli_command *cmd, FILE *f)
{
    struct moe_cli_args a;
    collect(cmd, &a);
    fputs(cmd->usage, f);
    for (int i = 0; i < a.n_rows; i++) print_row(f, a.rows[i]);
    if (cmd->footer) fprintf(f, "\n%s", cmd->footer);
}

/* --- values --- */

static long hi_long(double hi) { return hi >= (double)LONG_MAX ? LONG_MAX : (long)hi; }

/* What the option takes, for its error: "an integer from 1 to 4096". */
static void describe(const struct moe_cli_opt *o, char *buf, size_t n)
{
    const long lo = (long)o->lo, hi = hi_long(o->hi);
    switch (o->kind) {
    case MOE_CLI_INT:
        if (hi == LONG_MAX) snprintf(buf, n, lo == 0 ? "a non-negative integer" : "an integer of at least %ld", lo);
        else snprintf(buf, n, "an integer from %ld to %ld", lo, hi);
        break;
    case MOE_CLI_SIZE: snprintf(buf, n, "a size of at least %ld bytes: 65536, 512KiB, 4MiB", lo); break;
    case MOE_CLI_DOUBLE: {
        const char *l = o->open & MOE_CLI_LO_OPEN ? "<" : "<=", *h = o->open & MOE_CLI_HI_OPEN ? "<" : "<=";
        if (isinf(o->lo) && isinf(o->hi)) snprintf(buf, n, "a number");
        else if (isinf(o->hi)) snprintf(buf, n, "a number x with %g %s x", o->lo, l);
        else snprintf(buf, n, "a number x with %g %s x %s %g", o->lo, l, h, o->hi);
        break;
    }
    case MOE_CLI_CHOICE: {
        size_t k = (size_t)snprintf(buf, n, "use");
        for (int i = 0; o->choices[i] && k < n; i++)
            k += (size_t)snprintf(buf + k, n - k, "%s %s", !i ? "" : o->choices[i + 1] ? "," : " or",
                                  o->choices[i]);
        break;
    }
    default: snprintf(buf, n, "%s", o->what ? o->what : "see --help"); break;
    }
}

/* Checks arg and stores it in field; false when it is not a value of o. */
static bool store(const struct moe_cli_opt *o, const char *arg, void *field)
{
    switch (o->kind) {
    case MOE_CLI_FLAG: *(bool *)field = true; return true;
    case MOE_CLI_STRING: *(const char **)field = arg; return true;
    case MOE_CLI_CUSTOM: return o->parse(arg, field);
    case MOE_CLI_INT: {
        long v;
        if (!moe_cli_parse_int(arg, (long)o->lo, hi_long(o->hi), &v)) return false;
        if (o->size == sizeof(int)) *(int *)field = (int)v;
        else *(int64_t *)field = v;
        return true;
    }
    case MOE_CLI_SIZE: {
        size_t b;
        if (moe_cli_parse_budget(arg, &b) != MOE_OK || (double)b < o->lo) return false;
        *(size_t *)field = b;
        return true;
    }
    case MOE_CLI_DOUBLE: {
        char *end;
        const double v = strtod(arg, &end);
        if (end == arg || *end || isnan(v) || v < o->lo || v > o->hi || ((o->open & MOE_CLI_LO_OPEN) && v == o->lo) ||
            ((o->open & MOE_CLI_HI_OPEN) && v == o->hi))
            return false;
        if (o->size == sizeof(float)) *(float *)field = (float)v;
        else *(double *)field = v;
        return true;
    }
    case MOE_CLI_CHOICE:
        for (int i = 0; o->choices[i]; i++)
            if (!strcmp(arg, o->choices[i])) {
                *(const char **)field = o->choices[i];
                return true;
            }
        return false;
    case MOE_CLI_LIST: {
        struct moe_cli_list *l = field;
        if (l->n >= (int)o->hi || l->n >= (int)(sizeof l->v / sizeof l->v[0])) return false;
        l->v[l->n++] = arg;
        return true;
    }
    }
    return false;
}

static void *field_of(const struct moe_cli_command *cmd, const struct moe_cli_opt *o, void *opts)
{
    const size_t base = o->at == MOE_CLI_AT_ENGINE     ? cmd->engine_at
                        : o->at == MOE_CLI_AT_STATS    ? cmd->stats_at
                        : o->at == MOE_CLI_AT_SAMPLING ? cmd->sampling_at
                                                       : 0;
    return (char *)opts + base + o->off;
}

/* --- the parser --- */

int moe_cli_parse(const struct moe_cli_command *cmd, int argc, char **argv, void *opts, struct moe_cli_args *a)
{
    collect(cmd, a);
    struct option lopts[MOE_CLI_MAX_OPTS + 1];
    char shortopts[2 * MOE_CLI_MAX_OPTS + 1];
    int ns = 0, nl = 0;
    for (int i = 0; i < a->n_rows; i++) {
        const struct moe_cli_opt *o = a->rows[i];
        if (!o->name) continue;
        lopts[nl++] = (struct option){o->name, o->kind == MOE_CLI_FLAG ? no_argument : required_argument, NULL,
                                      0x1000 + i};
        if (o->letter) {
            shortopts[ns++] = o->letter;
            if (o->kind != MOE_CLI_FLAG) shortopts[ns++] = ':';
        }
    }
    lopts[nl] = (struct option){0, 0, 0, 0};
    shortopts[ns] = '\0';
    int c;
    optind = 1;
    while ((c = moe_cli_getopt(argc, argv, shortopts, lopts, cmd->name)) != -1) {
        if (c == '?') return 2;
        int i = c - 0x1000;
        if (c < 0x1000)
            for (i = 0; i < a->n_rows && a->rows[i]->letter != c; i++) continue;
        MOE_ASSERT(i >= 0 && i < a->n_rows);
        const struct moe_cli_opt *o = a->rows[i];
        if (o == &help_row) {
            moe_cli_help(cmd, stdout);
            return 0;
        }
        if (!store(o, optarg, field_of(cmd, o, opts))) {
            char what[256];
            if (o->kind == MOE_CLI_LIST) return moe_cli_error(cmd->name, "--%s: at most %d", o->name, (int)o->hi);
            describe(o, what, sizeof what);
            return moe_cli_error(cmd->name, "--%s '%s' (%s)", o->name, optarg, what);
        }
        a->given[i] = true;
    }
    a->pos = argv + optind;
    a->n_pos = argc - optind;
    return -1;
}

bool moe_cli_given(const struct moe_cli_args *a, const char *name)
{
    const struct moe_cli_opt *named = NULL;
    for (int i = 0; i < a->n_rows && !named; i++)
        if (a->rows[i]->name && !strcmp(a->rows[i]->name, name)) named = a->rows[i];
    if (!named) return false;
    for (int i = 0; i < a->n_rows; i++)
        if (a->given[i] && a->rows[i]->at == named->at && a->rows[i]->off == named->off) return true;
    return false;
}

void moe_cli_sampling_apply(const struct moe_cli_args *a, const struct moe_cli_sampling *o, struct moe_sampling *s)
{
    if (moe_cli_given(a, "temp")) s->temperature = o->temperature;
    if (moe_cli_given(a, "top-k")) s->top_k = o->top_k;
    if (moe_cli_given(a, "top-p")) s->top_p = o->top_p;
    if (moe_cli_given(a, "min-p")) s->min_p = o->min_p;
    if (moe_cli_given(a, "repeat-penalty")) s->repetition_penalty = o->repetition_penalty;
    if (moe_cli_given(a, "frequency-penalty")) s->frequency_penalty = o->frequency_penalty;
    if (moe_cli_given(a, "presence-penalty")) s->presence_penalty = o->presence_penalty;
    if (moe_cli_given(a, "seed")) s->seed = (uint64_t)o->seed;
}
