/* cli_common.c - see cli_common.h. */
#include "runtime/cli/cli_common.h"
#include "runtime/core/clock.h"
#include "runtime/cli/cli_draft.h"
#include "runtime/cli/cli_par.h"
#include "runtime/comm/comm.h"
#include "runtime/stats/stats_analyze.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include <jansson.h>
#include "runtime/cpu/gemm_fast.h"
#include "runtime/model/synth_skew.h"

bool moe_cli_parse_dtype(const char *s, enum moe_dtype *out)
{
    if (!strcasecmp(s, "f32") || !strcasecmp(s, "fp32") || !strcasecmp(s, "float32")) *out = MOE_DTYPE_F32;
    else if (!strcasecmp(s, "f16") || !strcasecmp(s, "fp16") || !strcasecmp(s, "float16")) *out = MOE_DTYPE_F16;
    else if (!strcasecmp(s, "bf16") || !strcasecmp(s, "bfloat16")) *out = MOE_DTYPE_BF16;
    else return false;
    return true;
}

bool moe_cli_parse_kv_dtype(const char *s, enum moe_dtype *out)
{
    if (!strcasecmp(s, "fp8") || !strcasecmp(s, "f8") || !strcasecmp(s, "fp8_e4m3") || !strcasecmp(s, "e4m3")) {
        *out = MOE_DTYPE_F8E4M3; /* E4M3 bytes and an f32 scale per row (kvcache.h) */
        return true;
    }
    return moe_cli_parse_dtype(s, out);
}

/* Whether the model opens under a layout of several ranks (or asks for one). */
static bool parallel(const struct moe_cli_model_opts *o)
{
    return moe_cli_par_ep() || o->ep > 1 || o->tp > 1 || o->dp_attention;
}

static enum moe_status open_model_weights(struct moe_model *m, const struct moe_cli_model_opts *o)
{
    if (o->synthetic) {
        if (o->path)
            return moe_fail(MOE_ERR_INVALID_ARG, "give either a model folder or --synthetic, not both");
        enum moe_dtype dt = MOE_DTYPE_BF16;
        if (o->dtype && !moe_cli_parse_dtype(o->dtype, &dt))
            return moe_fail(MOE_ERR_INVALID_ARG, "--dtype '%s' (use f32, f16 or bf16)", o->dtype);
        struct moe_config cfg;
        MOE_TRY(moe_config_load(&cfg, o->synthetic));
        struct moe_router_skew sk;
        if (o->router_skew) MOE_TRY(moe_router_skew_parse(o->router_skew, &sk));
        /* expert parallelism: this rank's share of the experts only */
        uint8_t *held = NULL;
        if (parallel(o)) MOE_TRY(moe_cli_par_share(o, &cfg, &held));
        const struct moe_synth_part part = {
            .skew = o->router_skew ? &sk : NULL, .held = held, .deferred = o->device_weights && !o->router_skew};
        enum moe_status s = moe_model_synthetic_part(m, &cfg, dt, o->seed, &part);
        free(held);
        return s;
    }
    if (o->router_skew)
        return moe_fail(MOE_ERR_INVALID_ARG, "--router-skew applies to --synthetic models "
                        "(moerun synth --router-skew writes a skewed checkpoint)");
    if (!o->path) return moe_fail(MOE_ERR_INVALID_ARG, "no model given (a folder, or --synthetic CONFIG.json)");
    if (!parallel(o)) return moe_model_load(m, o->path);
    /* expert parallelism: this rank's share of the experts only */
    char path[4096];
    struct moe_config cfg;
    uint8_t *held;
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", o->path) >= sizeof path)
        return moe_fail(MOE_ERR_INVALID_ARG, "model path is too long");
    MOE_TRY(moe_config_load(&cfg, path));
    MOE_TRY(moe_cli_par_share(o, &cfg, &held));
    enum moe_status s = moe_model_load_part(m, o->path, held);
    free(held);
    return s;
}

enum moe_status moe_cli_open_model(struct moe_model *m, const struct moe_cli_model_opts *o)
{
    MOE_TRY(moe_cli_draft_check(o));
    MOE_TRY(open_model_weights(m, o));
    const struct moe_ep *ep = moe_cli_par_ep();
    if (ep && ep->tp > 1) { /* this rank's heads and widths */
        enum moe_status s = moe_model_tp_split(m, ep->tp_rank, ep->tp);
        if (s != MOE_OK) {
            moe_model_free(m);
            return s;
        }
    }
    if (ep && ep->size > 1) { /* this rank's share of the LM head */
        enum moe_status s = moe_model_vocab_split(m, ep->rank, ep->size);
        if (s != MOE_OK) {
            moe_model_free(m);
            return s;
        }
    }
    if (o->top_k == 0) return MOE_OK;
    enum moe_status s = moe_model_set_top_k(m, (int)o->top_k);
    if (s != MOE_OK) {
        moe_error_prefix("--moe-top-k: ");
        moe_model_free(m);
    }
    return s;
}

int moe_cli_check_writable(const char *cmd, const char *opt, const char *path)
{
    struct stat sb;
    const bool existed = stat(path, &sb) == 0;
    if (existed && S_ISDIR(sb.st_mode)) return moe_cli_error(cmd, "%s %s is a directory", opt, path);
    FILE *f = fopen(path, "a");
    if (!f) return moe_cli_error(cmd, "%s %s cannot be written: %s", opt, path, strerror(errno));
    fclose(f);
    if (!existed) unlink(path);
    return 0;
}

/* The speculation options that do not go together. */
static enum moe_status spec_check(const struct moe_cli_engine *o)
{
    if (o->model.draft && o->spec.kind == MOE_SPEC_NGRAM)
        return moe_fail(MOE_ERR_INVALID_ARG, "--draft and --spec ngram are two proposers; give one");
    if (o->spec.sample_drafts && !o->model.draft)
        return moe_fail(MOE_ERR_INVALID_ARG, "--spec-draft-sample needs --draft DIR");
    if (o->spec.kind == MOE_SPEC_NONE && !o->model.draft && (o->spec.tokens || o->spec.adaptive))
        return moe_fail(MOE_ERR_INVALID_ARG, "--%s needs a proposer: --spec ngram|mtp or --draft DIR",
                        o->spec.tokens ? "spec-tokens" : "spec-adaptive");
    if (o->spec.kind == MOE_SPEC_MTP && o->model.draft)
        return moe_fail(MOE_ERR_INVALID_ARG, "--draft and --spec mtp are two proposers; give one");
    if (o->spec.kind == MOE_SPEC_MTP) {
        const struct moe_cli_model_opts *mo = &o->model;
        char path[4096];
        struct moe_config cfg;
        if (mo->synthetic) snprintf(path, sizeof path, "%s", mo->synthetic);
        else snprintf(path, sizeof path, "%s/config.json", mo->path ? mo->path : ".");
        MOE_TRY(moe_config_load(&cfg, path));
        if (cfg.n_mtp_layers == 0)
            return moe_fail(MOE_ERR_INVALID_ARG, "--spec mtp: %s declares no multi-token-prediction "
                            "layers (num_nextn_predict_layers); use --spec ngram or --draft DIR", path);
        if (o->gpu_experts > 0)
            return moe_fail(MOE_ERR_INVALID_ARG, "--spec mtp with --gpu-experts: the module's layer "
                            "would share the target's expert slots; not supported");
        if (o->spec.sample_drafts)
            return moe_fail(MOE_ERR_INVALID_ARG, "--spec-draft-sample needs --draft DIR (the "
                            "multi-token-prediction module drafts its argmax)");
    }
    return MOE_OK;
}

int moe_cli_check_engine(const struct moe_cli_engine *o, const char *cmd)
{
    enum moe_dtype kvt;
    size_t budget;
    enum moe_weight_quant q;
    if (o->kv_dtype && !moe_cli_parse_kv_dtype(o->kv_dtype, &kvt))
        return moe_cli_error(cmd, "--kv-dtype '%s' (use " MOE_CLI_KV_DTYPES ")", o->kv_dtype);
    if (o->kv_budget && moe_cli_parse_budget(o->kv_budget, &budget) != MOE_OK)
        return moe_cli_error(cmd, "%s", moe_last_error());
    if (o->quantize && !moe_cli_parse_quant(o->quantize, &q))
        return moe_cli_error(cmd, "--quantize '%s' (use q8_0, q4, q4_k_m, q5_k, q5_k_m, or none)", o->quantize);
    static const char *const backends[] = {"auto", "cpu", "cpu-ref", "cuda"};
    bool known = false;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) known |= !strcmp(o->backend, backends[i]);
    if (!known) return moe_cli_error(cmd, "unknown backend '%s' (choose cpu, cpu-ref, cuda or auto)", o->backend);
    if (spec_check(o) != MOE_OK) return moe_cli_error(cmd, "%s", moe_last_error());
    const struct moe_cli_model_opts *mo = &o->model;
    char path[4096];
    if (mo->synthetic || mo->path) {
        if (mo->synthetic) snprintf(path, sizeof path, "%s", mo->synthetic);
        else snprintf(path, sizeof path, "%s/config.json", mo->path);
        struct moe_config cfg;
        if (moe_config_load(&cfg, path) != MOE_OK) return moe_cli_error(cmd, "%s", moe_last_error());
    }
    return 0;
}

bool moe_cli_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

enum moe_status moe_cli_parse_ids(const char *s, int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return moe_fail(MOE_ERR_NOMEM, "id list");
    int k = 0;
    const char *p = s;
    while (1) {
        char *end;
        errno = 0;
        while (*p == ' ') p++;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX) {
            free(v);
            return moe_fail(MOE_ERR_INVALID_ARG, "token id list: item %d is not a token id (at '%.20s')",
                            k + 1, p);
        }
        v[k++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p != ',') {
            free(v);
            return moe_fail(MOE_ERR_INVALID_ARG, "token id list: unexpected '%c' after item %d", *p, k);
        }
        p++;
    }
    *ids = v;
    *n = k;
    return MOE_OK;
}

const char *moe_cli_bytes(char *buf, size_t n, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

const char *moe_cli_count(char *buf, size_t n, double x)
{
    const char *u[] = {"", "K", "M", "B", "T"};
    int i = 0;
    while (x >= 1000 && i < 4) {
        x /= 1000;
        i++;
    }
    snprintf(buf, n, i ? "%.2f%s" : "%.0f%s", x, u[i]);
    return buf;
}

int moe_cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts,
                   const char *cmd)
{
    opterr = 0;
    const int c = getopt_long(argc, argv, shortopts, longopts, NULL);
    if (c != '?' && c != ':') return c;
    const char *arg = optind - 1 < argc ? argv[optind - 1] : "";
    char what[160];
    if (!strncmp(arg, "--", 2)) {
        const size_t n = strcspn(arg + 2, "=");
        if (optopt == 0)
            snprintf(what, sizeof what, "unknown option '--%.*s'", (int)n, arg + 2);
        else if (arg[2 + n] == '=')
            snprintf(what, sizeof what, "option '--%.*s' takes no value", (int)n, arg + 2);
        else
            snprintf(what, sizeof what, "option '--%.*s' needs a value", (int)n, arg + 2);
    } else if (optopt > 0 && optopt < 128 && optopt != ':' && strchr(shortopts, optopt)) {
        snprintf(what, sizeof what, "option '-%c' needs a value", optopt);
    } else {
        snprintf(what, sizeof what, "unknown option '-%c'", optopt > 0 && optopt < 128 ? optopt : '?');
    }
    fprintf(stderr, "moerun %s: %s; see 'moerun %s --help'\n", cmd, what, cmd);
    return '?';
}

int moe_cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moerun %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* --- engine options --- */

#include <math.h>
#include <omp.h>

void moe_cli_engine_defaults(struct moe_cli_engine *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "auto";
    o->kv_block = 16;
    o->max_batch_tokens = 512;
    o->max_seqs = 64;
    o->spec.max_batch = MOE_CLI_SPEC_MAX_BATCH;
    o->comm_timeout = MOE_CLI_COMM_TIMEOUT;
}

/* --- speculative decoding --- */

/* The proposers --spec names; a row per proposer, takes_n when ":N" sets
 * its n-gram size. */
static const struct {
    const char *name;
    enum moe_spec_kind kind;
    bool takes_n;
} spec_kinds[] = {
    {"none", MOE_SPEC_NONE, false},
    {"ngram", MOE_SPEC_NGRAM, true},
    {"mtp", MOE_SPEC_MTP, false},
};

bool moe_cli_parse_spec(const char *s, struct moe_spec_opts *o)
{
    const size_t name_len = strcspn(s, ":");
    for (size_t i = 0; i < sizeof spec_kinds / sizeof spec_kinds[0]; i++) {
        if (strlen(spec_kinds[i].name) != name_len || strncmp(s, spec_kinds[i].name, name_len)) continue;
        long n = 0;
        if (s[name_len] && (!spec_kinds[i].takes_n ||
                            !moe_cli_parse_int(s + name_len + 1, 1, MOE_CLI_SPEC_NGRAM_MAX, &n)))
            return false;
        o->kind = spec_kinds[i].kind;
        if (spec_kinds[i].takes_n) o->ngram_max = (int)n; /* 0: the engine's default */
        return true;
    }
    return false;
}

bool moe_cli_spec_summary(const struct moe_engine_counters *n, char *buf, size_t len)
{
    buf[0] = '\0';
    if (n->spec_drafts == 0) return false;
    snprintf(buf, len, "mean accepted length %.2f (%llu drafts, %llu drafted tokens, acceptance %.1f%%)",
             (double)n->spec_accepted / (double)n->spec_drafts, (unsigned long long)n->spec_drafts,
             (unsigned long long)n->spec_draft_tokens,
             100.0 * (double)n->spec_accepted / (double)n->spec_draft_tokens);
    return true;
}

enum moe_status moe_cli_parse_budget(const char *s, size_t *bytes)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "KV budget '%s' is not a size (e.g. 8GiB, 512MiB, 0.25)", s);
    while (*end == ' ') end++;
    double mul;
    if (!*end) {
        if (v < 1.0) { /* a fraction of what is available */
            long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
            if (pages <= 0 || psz <= 0) return moe_fail(MOE_ERR_IO, "cannot read available memory");
            *bytes = (size_t)(v * (double)pages * (double)psz);
            return MOE_OK;
        }
        mul = 1;
    } else if (!strcasecmp(end, "k") || !strcasecmp(end, "kib") || !strcasecmp(end, "kb")) {
        mul = 1024.0;
    } else if (!strcasecmp(end, "m") || !strcasecmp(end, "mib") || !strcasecmp(end, "mb")) {
        mul = 1024.0 * 1024;
    } else if (!strcasecmp(end, "g") || !strcasecmp(end, "gib") || !strcasecmp(end, "gb")) {
        mul = 1024.0 * 1024 * 1024;
    } else if (!strcasecmp(end, "t") || !strcasecmp(end, "tib") || !strcasecmp(end, "tb")) {
        mul = 1024.0 * 1024 * 1024 * 1024;
    } else {
        return moe_fail(MOE_ERR_INVALID_ARG, "KV budget '%s': unknown unit '%s' (use KiB, MiB, GiB, TiB)",
                        s, end);
    }
    double b = v * mul;
    if (b >= 9.0e18) return moe_fail(MOE_ERR_INVALID_ARG, "KV budget '%s' is too large", s);
    *bytes = (size_t)b;
    return MOE_OK;
}

const char *moe_cli_quant_name(enum moe_weight_quant q)
{
    return q == MOE_QUANT_Q8_0     ? "q8_0"
           : q == MOE_QUANT_Q4     ? "q4"
           : q == MOE_QUANT_Q4_K_M ? "q4_k_m"
           : q == MOE_QUANT_Q5_K   ? "q5_k"
           : q == MOE_QUANT_Q5_K_M ? "q5_k_m"
                                   : "none";
}

bool moe_cli_parse_quant(const char *s, enum moe_weight_quant *out)
{
    if (!strcasecmp(s, "q8_0")) *out = MOE_QUANT_Q8_0;
    else if (!strcasecmp(s, "q4")) *out = MOE_QUANT_Q4;
    else if (!strcasecmp(s, "q4_k_m")) *out = MOE_QUANT_Q4_K_M;
    else if (!strcasecmp(s, "q5_k")) *out = MOE_QUANT_Q5_K;
    else if (!strcasecmp(s, "q5_k_m")) *out = MOE_QUANT_Q5_K_M;
    else if (!strcasecmp(s, "none")) *out = MOE_QUANT_NONE;
    else return false;
    return true;
}

enum moe_status moe_cli_offload_opts(struct moe_backend_opts *o, long gpu_experts, const char *policy,
                                     const char *warm, long cpu_rows, double **warm_counts)
{
    *warm_counts = NULL;
    if (cpu_rows > 0 && gpu_experts <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "--gpu-experts-cpu-rows %ld needs --gpu-experts N (experts in "
                        "host memory to compute)", cpu_rows);
    if (policy && strcmp(policy, "lru") && strcmp(policy, "lfu"))
        return moe_fail(MOE_ERR_INVALID_ARG, "--gpu-experts-policy '%s' (use lru or lfu)", policy);
    o->offload.gpu_experts = (int)gpu_experts;
    o->offload.cpu_rows = (int)cpu_rows;
    o->offload.lfu = policy && !strcmp(policy, "lfu");
    if (!warm) return MOE_OK;
    struct moe_sdata d;
    enum moe_status s = moe_sdata_load(&d, warm);
    size_t n = 0;
    if (s != MOE_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", moe_last_error());
        s = moe_fail(s, "--gpu-experts-warm: %s", why);
    } else if (!moe_mul_size((size_t)d.Lm, (size_t)d.E, &n) || !moe_mul_size(n, sizeof(double), &n) ||
               !(*warm_counts = malloc(n ? n : 1))) {
        s = moe_fail(MOE_ERR_NOMEM, "--gpu-experts-warm %s: %d layers x %d experts", warm, d.Lm, d.E);
    } else {
        memcpy(*warm_counts, d.load, n);
        o->offload.warm = *warm_counts;
        o->offload.warm_layers = d.Lm;
        o->offload.warm_e = d.E;
    }
    moe_sdata_free(&d);
    return s;
}

/* An environment variable's value among names (NULL-terminated), as its
 * index; unset or empty: dflt; anything else: dflt with a one-line notice. */
static int env_choice(const char *var, const char *const *names, int dflt)
{
    const char *v = getenv(var);
    if (!v || !*v) return dflt;
    for (int i = 0; names[i]; i++)
        if (!strcmp(v, names[i])) return i;
    fprintf(stderr, "moerun: %s=%s is not one of", var, v);
    for (int i = 0; names[i]; i++) fprintf(stderr, "%s %s", i ? "," : "", names[i]);
    fprintf(stderr, ": %s\n", names[dflt]);
    return dflt;
}

void moe_cli_backend_opts(struct moe_backend_opts *o, long threads)
{
    static const char *const isa[] = {"ref", "avx2", "avx512", "avx512-bf16", "amx", "amx-exact", "amx-bf16", NULL};
    static const char *const off_on[] = {"0", "1", NULL};
    static const char *const attn[] = {"tiled", "rows", "mma", NULL};
    static const char *const experts[] = {"cublas", "mma", NULL};
    moe_backend_opts_defaults(o);
    o->n_threads = (int)threads;
    struct moe_comm_launch l; /* several ranks on a machine: a device each (CUDA) */
    if (moe_comm_launch_from_env(&l) == MOE_OK && l.size > 1) o->local_rank = l.local_rank;
    moe_clear_error();
    o->cpu_isa_max = (enum moe_cpu_isa)env_choice("MOERUN_CPU_ISA", isa, MOE_CPU_ISA_DEFAULT_CAP);
    o->cpu_panels = env_choice("MOERUN_CPU_PANELS", off_on, 1);
    o->cuda_graphs = env_choice("MOERUN_CUDA_GRAPHS", off_on, 0);
    o->cuda_strict = env_choice("MOERUN_CUDA_STRICT", off_on, 0);
    o->prefill_attn = (enum moe_prefill_attn)env_choice("MOERUN_CUDA_PREFILL_ATTN", attn,
                                                        MOE_PREFILL_ATTN_TILED);
    o->expert_kernels = (enum moe_expert_kernels)env_choice("MOERUN_CUDA_EXPERTS", experts,
                                                            MOE_EXPERT_KERNELS_CUBLAS);
    static const char *const small[] = {"rows", "cublas", NULL};
    o->cuda_small_cublas = env_choice("MOERUN_CUDA_SMALL_MATMUL", small, 0) == 1;
    static const char *const grouped[] = {"grouped", "loop", NULL};
    o->cuda_expert_gemm_loop = env_choice("MOERUN_CUDA_GROUPED", grouped, 0) == 1;
}

void moe_cli_isa_for_quant(struct moe_backend_opts *o)
{
    if (getenv("MOERUN_CPU_ISA") || o->quant == MOE_QUANT_NONE) return;
    if (moe_cpu_isa_detect() >= MOE_CPU_ISA_AMX && moe_cpu_amx_int8()) o->cpu_isa_max = MOE_CPU_ISA_AMX;
}

enum moe_status moe_cli_backend_start(struct moe_backend *be, const struct moe_cli_engine *o)
{
    MOE_TRY(spec_check(o)); /* before anything starts or loads */
    struct moe_backend_opts bo;
    moe_cli_backend_opts(&bo, o->threads);
    enum moe_weight_quant q = MOE_QUANT_NONE;
    if (o->quantize && !moe_cli_parse_quant(o->quantize, &q))
        return moe_fail(MOE_ERR_INVALID_ARG, "--quantize '%s' (use q8_0, q4, q4_k_m, q5_k, q5_k_m, or none)",
                        o->quantize);
    bo.quant = q;
    moe_cli_isa_for_quant(&bo);
    double *warm;
    uint8_t *plan = NULL;
    enum moe_status s = moe_cli_offload_opts(&bo, o->gpu_experts, o->gpu_experts_policy, o->gpu_experts_warm,
                                             o->gpu_experts_cpu_rows, &warm);
    if (s == MOE_OK && o->expert_plan)
        s = moe_cli_expert_plan(&bo, o->expert_plan, o->hot_share > 0 ? o->hot_share : MOE_CLI_HOT_SHARE, q,
                                &plan);
    if (s == MOE_OK) s = moe_backend_init(be, o->backend, &bo);
    free(warm);
    free(plan);
    MOE_TRY(s);
    if (o->gpu_experts && strcmp(be->ops->name, "cuda"))
        fprintf(stderr, "moerun: --gpu-experts applies to the CUDA backend; the %s backend keeps every "
                "expert in host memory\n", be->ops->name);
    return MOE_OK;
}

enum moe_status moe_cli_engine_start(const struct moe_cli_engine *o, const struct moe_model *m,
                                     struct moe_backend *be, long default_tokens,
                                     struct moe_engine *e)
{
    enum moe_dtype kvt = MOE_DTYPE_F32;
    if (o->kv_dtype && !moe_cli_parse_kv_dtype(o->kv_dtype, &kvt))
        return moe_fail(MOE_ERR_INVALID_ARG, "--kv-dtype '%s' (use " MOE_CLI_KV_DTYPES ")", o->kv_dtype);
    int n_blocks;
    const bool hybrid = moe_config_linear_layers(&m->cfg) > 0;
    size_t states = 0; /* hybrid models: a recurrent-state slot per sequence of a step */
    if (hybrid && !moe_mul_size(moe_config_state_bytes(&m->cfg), (size_t)o->max_seqs, &states))
        return moe_fail(MOE_ERR_INVALID_ARG, "--max-seqs %ld: the recurrent states overflow", o->max_seqs);
    if (o->kv_budget) {
        size_t budget;
        MOE_TRY(moe_cli_parse_budget(o->kv_budget, &budget));
        if (states >= budget)
            return moe_fail(MOE_ERR_INVALID_ARG, "--kv-budget %s: the recurrent states of %ld sequences take "
                            "%zu bytes of it, leaving nothing for K/V blocks", o->kv_budget, o->max_seqs, states);
        MOE_TRY(moe_kvcache_blocks_for_budget(&m->cfg, (int)o->kv_block, kvt, budget - states, &n_blocks));
    } else {
        n_blocks = (int)((default_tokens + o->kv_block - 1) / o->kv_block);
        if (n_blocks < 1) n_blocks = 1;
    }
    struct moe_engine_opts eo = {
        .max_batch_tokens = (int)o->max_batch_tokens, .max_seqs = (int)o->max_seqs,
        .priority_aging = o->priority_aging,
        .block_size = (int)o->kv_block, .n_blocks = n_blocks, .kv_dtype = kvt,
        .prefix_cache = !o->no_prefix_cache && !hybrid, .spec = o->spec, .grammar_vocab = o->grammar_vocab};
    if (hybrid && !o->no_prefix_cache)
        fprintf(stderr, "moerun: prefix cache off: %s's linear-attention layers keep a recurrent state per "
                "sequence, not per cache block, so a cached prefix could not be resumed\n", m->cfg.architecture);
    MOE_TRY(moe_cli_par_describe(o, be));
    eo.ep = moe_cli_par_ep();
    MOE_TRY(moe_cli_draft_attach(o, m, be, &eo));
    enum moe_status s = moe_engine_init(e, m, be, &eo);
    if (s != MOE_OK && eo.spec.draft_release) eo.spec.draft_release(eo.spec.draft_ctx);
    /* the formats the backend made (the model's views point at them now) */
    if (s == MOE_OK && (o->quantize || o->expert_plan)) moe_cli_print_formats(stderr, "moerun: weights as prepared:", m);
    return s;
}

void moe_cli_print_formats(FILE *f, const char *prefix, const struct moe_model *m)
{
    int64_t by[MOE_DTYPE_N], total = 0;
    moe_model_bytes_by_dtype(m, by);
    for (int t = 0; t < MOE_DTYPE_N; t++) total += by[t];
    char a[32];
    fputs(prefix, f);
    for (;;) {
        int best = -1;
        for (int t = 0; t < MOE_DTYPE_N; t++)
            if (by[t] > 0 && (best < 0 || by[t] > by[best])) best = t;
        if (best < 0) break;
        fprintf(f, " %s %s (%.1f%%)", moe_dtype_name((enum moe_dtype)best), moe_cli_bytes(a, sizeof a, (double)by[best]),
                100.0 * (double)by[best] / (double)(total ? total : 1));
        by[best] = 0;
    }
    fputc('\n', f);
}

void moe_cli_generation_defaults(const char *model_dir, struct moe_sampling *s)
{
    moe_sampling_defaults(s);
    if (!model_dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    json_t *g = json_load_file(path, 0, NULL);
    if (!g) return;
    if (json_is_true(json_object_get(g, "do_sample"))) {
        json_t *v;
        s->temperature = 1.0f;
        s->top_k = 50; /* transformers' GenerationConfig default */
        if ((v = json_object_get(g, "temperature")) && json_is_number(v))
            s->temperature = (float)json_number_value(v);
        if ((v = json_object_get(g, "top_p")) && json_is_number(v)) s->top_p = (float)json_number_value(v);
        if ((v = json_object_get(g, "top_k")) && json_is_integer(v)) s->top_k = (int)json_integer_value(v);
        if ((v = json_object_get(g, "min_p")) && json_is_number(v)) s->min_p = (float)json_number_value(v);
    }
    json_t *v = json_object_get(g, "repetition_penalty");
    if (v && json_is_number(v)) s->repetition_penalty = (float)json_number_value(v);
    json_decref(g);
}

int moe_cli_generation_overlay(const char *model_dir, struct moe_sampling *s)
{
    if (!model_dir) return 0;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/generation_config.json", model_dir) >= sizeof path)
        return 0;
    json_t *g = json_load_file(path, 0, NULL), *v;
    int n = 0;
    if (!g) return 0;
    if ((v = json_object_get(g, "temperature")) && json_is_number(v) && json_number_value(v) >= 0)
        s->temperature = (float)json_number_value(v), n++;
    if ((v = json_object_get(g, "top_p")) && json_is_number(v) && json_number_value(v) > 0 &&
        json_number_value(v) <= 1)
        s->top_p = (float)json_number_value(v), n++;
    if ((v = json_object_get(g, "top_k")) && json_is_integer(v) && json_integer_value(v) >= 0 &&
        json_integer_value(v) <= (1 << 24))
        s->top_k = (int)json_integer_value(v), n++;
    if ((v = json_object_get(g, "min_p")) && json_is_number(v) && json_number_value(v) >= 0 &&
        json_number_value(v) <= 1)
        s->min_p = (float)json_number_value(v), n++;
    if ((v = json_object_get(g, "repetition_penalty")) && json_is_number(v) && json_number_value(v) > 0)
        s->repetition_penalty = (float)json_number_value(v), n++;
    json_decref(g);
    return n;
}

double moe_cli_copy_bandwidth(void)
{
    const size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int rep = 0; rep < 6; rep++) {
            double t0 = moe_seconds();
#pragma omp parallel
            {
                const int nt = omp_get_num_threads(), id = omp_get_thread_num();
                const size_t per = n / (size_t)nt, off = per * (size_t)id;
                memcpy(b + off, a + off, id == nt - 1 ? n - off : per);
            }
            double bw = 2.0 * (double)n / (moe_seconds() - t0);
            if (rep > 0 && bw > best) best = bw; /* rep 0 faults the pages in */
        }
    }
    free(a);
    free(b);
    return best;
}

double moe_cli_read_bandwidth(void)
{
    const size_t n = (size_t)256 << 20;
    char *a = malloc(n);
    double best = 0;
    uint64_t sink = 0;
    if (a) {
        memset(a, 1, n);
        for (int rep = 0; rep < 6; rep++) {
            double t0 = moe_seconds();
#pragma omp parallel reduction(^ : sink)
            {
                const int nt = omp_get_num_threads(), id = omp_get_thread_num();
                const size_t per = n / (size_t)nt, off = per * (size_t)id;
                sink ^= moe_read_sweep(a + off, id == nt - 1 ? n - off : per);
            }
            double bw = (double)n / (moe_seconds() - t0);
            if (rep > 0 && bw > best) best = bw;
        }
    }
    free(a);
    (void)sink; /* moe_read_sweep is opaque here: the reads stay */
    return best;
}

char *moe_cli_read_all(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
        if (n + 1 == cap) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                return NULL;
            }
            buf = p;
            cap *= 2;
        }
    }
    if (!buf || ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}
