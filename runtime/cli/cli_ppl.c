/* cli_ppl.c - `moerun ppl`: perplexity of a model over a text file, and its
 * divergence from a base run saved earlier, so the cost of a memory-vs-
 * compute knob (--kv-dtype, --moe-top-k, the weights' dtype, the backend) is
 * one number against a reference (runtime/engine/ppl.h has the rule).
 *
 * A base run is a safetensors file: "logprobs" F16 (N, V), the log-softmax
 * of every scored row; "targets" I32 (N); "nll" F32 (N) and "argmax" I32
 * (N) as that run computed them; metadata naming the window settings.  A run
 * against it must score the same targets. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "runtime/cli/cli.h"
#include "runtime/core/clock.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_par.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/engine/ppl.h"
#include "runtime/model/safetensors.h"
#include "runtime/cli/stats_cli.h"
#include "runtime/text/tokenizer.h"

struct ppl_opts {
    struct moe_cli_engine eng;
    struct moe_cli_stats st;
    long ctx, score_from, chunks;  /* ctx 0: min(512, the model's); score_from -1: ctx/2 */
    bool no_prefix, json;
    const char *save_path, *base_path;
};

#define CMD(member) .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct ppl_opts, member)
static const struct moe_cli_opt rows[] = {
    {.name = "ctx", .arg = "N", .kind = MOE_CLI_INT, CMD(ctx), .lo = 3, .hi = 1 << 24,
     .help = "tokens per window, prefix included (default 512, at most\n"
             "the model's context)"},
    {.name = "score-from", .arg = "N", .kind = MOE_CLI_INT, CMD(score_from), .lo = 0, .hi = 1 << 24,
     .help = "first scored row of a window (default ctx/2; 0 scores\n"
             "every token)"},
    {.name = "chunks", .arg = "N", .kind = MOE_CLI_INT, CMD(chunks), .lo = 1, .hi = 1 << 24,
     .help = "evaluate the first N windows only"},
    {.name = "no-prefix", .kind = MOE_CLI_FLAG, CMD(no_prefix),
     .help = "no special tokens (BOS) before each window"},
    {.name = "save-base", .arg = "FILE", .kind = MOE_CLI_STRING, CMD(save_path),
     .help = "keep this run's log-probabilities (f16, N x V: V*2 bytes\n"
             "per scored token) for a later --kl-base"},
    {.name = "kl-base", .arg = "FILE", .kind = MOE_CLI_STRING, CMD(base_path),
     .help = "compare with a saved run: KL divergence, same top-1,\n"
             "ln(PPL/PPL_base), RMS of the change in p(target)"},
    {.name = "json", .kind = MOE_CLI_FLAG, CMD(json), .help = "one JSON object on stdout instead of the table"},
};
#undef CMD

static const char *const shared[] = {"@model", "@engine", "@offload", "@stats", NULL};

static const struct moe_cli_command ppl_cmd = {
    .name = "ppl",
    .usage = "usage: moerun ppl MODEL_DIR FILE [options]\n\n"
             "Perplexity of the model over FILE (a text; '-' reads stdin), in windows that\n"
             "do not overlap; each window starts with the tokenizer's prefix (BOS) and only\n"
             "its second half is scored, as llama.cpp's perplexity does.\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
    .shared = shared,
    .footer = "The KV cache holds the windows of one step; --kv-budget and the prefix cache\n"
              "do not apply.\n",
    .engine_at = offsetof(struct ppl_opts, eng),
    .stats_at = offsetof(struct ppl_opts, st),
};

/* The base run of --kl-base, checked against this run's plan and model. */
static MOE_MUST_USE enum moe_status open_base(struct moe_safetensors *st, const char *path,
                                              const struct moe_ppl_plan *p, int V,
                                              struct moe_ppl_base *base)
{
    MOE_TRY(moe_safetensors_open_file(st, path));
    const struct moe_st_tensor *lp = moe_safetensors_find(st, "logprobs");
    const struct moe_st_tensor *tg = moe_safetensors_find(st, "targets");
    const struct moe_st_tensor *nl = moe_safetensors_find(st, "nll");
    const struct moe_st_tensor *am = moe_safetensors_find(st, "argmax");
    const bool vec_ok = tg && nl && am && tg->dtype == MOE_DTYPE_I32 && am->dtype == MOE_DTYPE_I32 &&
                        nl->dtype == MOE_DTYPE_F32 && tg->ndim == 1 && am->ndim == 1 && nl->ndim == 1;
    if (!lp || lp->dtype != MOE_DTYPE_F16 || lp->ndim != 2 || !vec_ok || tg->shape[0] != lp->shape[0] ||
        am->shape[0] != lp->shape[0] || nl->shape[0] != lp->shape[0])
        return moe_fail(MOE_ERR_FORMAT, "%s: not a base run of moerun ppl (wants logprobs F16 (N, V), "
                        "targets I32 (N), nll F32 (N), argmax I32 (N))", path);
    json_t *md = st->metadata;
    const char *ctx = json_string_value(json_object_get(md, "ctx"));
    const char *from = json_string_value(json_object_get(md, "score_from"));
    if (ctx && from && (atoi(ctx) != p->ctx || atoi(from) != p->score_from))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s was saved with --ctx %s --score-from %s; this run "
                        "uses --ctx %d --score-from %d", path, ctx, from, p->ctx, p->score_from);
    if (lp->shape[1] != V)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: vocabulary of %lld; this model's is %d", path,
                        (long long)lp->shape[1], V);
    if (lp->shape[0] != p->n_scored)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s scores %lld tokens; this run scores %lld (another "
                        "text, tokenizer or --chunks?)", path, (long long)lp->shape[0],
                        (long long)p->n_scored);
    const int32_t *t = tg->data;
    for (int w = 0; w < p->n_windows; w++)
        for (int64_t i = p->scored_start[w]; i < p->scored_start[w + 1]; i++) {
            int32_t want = p->tokens[p->win_start[w] + p->score_from + (i - p->scored_start[w]) + 1];
            if (t[i] != want)
                return moe_fail(MOE_ERR_INVALID_ARG, "%s: scored token %lld is %d there and %d here "
                                "(another text or tokenizer?)", path, (long long)i, t[i], want);
        }
    const int32_t *a = am->data;
    for (int64_t i = 0; i < p->n_scored; i++)
        if (a[i] < 0 || a[i] >= V)
            return moe_fail(MOE_ERR_FORMAT, "%s: argmax %lld is %d, outside the vocabulary of %d", path,
                            (long long)i, a[i], V);
    *base = (struct moe_ppl_base){lp->data, nl->data, a, lp->shape[0], V};
    return MOE_OK;
}

static MOE_MUST_USE enum moe_status save_base(const char *path, const struct moe_ppl_plan *p,
                                              const struct moe_ppl_result *res, uint16_t *lp, int V,
                                              const char *model)
{
    struct moe_st_tensor a = {"logprobs", MOE_DTYPE_F16, 2, {p->n_scored, V}, lp,
                              (size_t)p->n_scored * (size_t)V * 2, -1};
    struct moe_st_tensor b = {"targets", MOE_DTYPE_I32, 1, {p->n_scored}, res->target,
                              (size_t)p->n_scored * 4, -1};
    struct moe_st_tensor c = {"argmax", MOE_DTYPE_I32, 1, {p->n_scored}, res->argmax,
                              (size_t)p->n_scored * 4, -1};
    float *nll = malloc((size_t)p->n_scored * sizeof *nll);
    if (!nll) return moe_fail(MOE_ERR_NOMEM, "%s: %lld NLL values", path, (long long)p->n_scored);
    for (int64_t i = 0; i < p->n_scored; i++) nll[i] = (float)res->nll[i];
    struct moe_st_tensor d = {"nll", MOE_DTYPE_F32, 1, {p->n_scored}, nll, (size_t)p->n_scored * 4, -1};
    const struct moe_st_tensor *ts[] = {&a, &b, &c, &d};
    char ctx[16], from[16];
    snprintf(ctx, sizeof ctx, "%d", p->ctx);
    snprintf(from, sizeof from, "%d", p->score_from);
    json_t *md = json_pack("{s:s, s:s, s:s, s:s}", "format", "moerun ppl base", "ctx", ctx,
                           "score_from", from, "model", model);
    enum moe_status s = md ? moe_safetensors_write(path, ts, 4, md)
                           : moe_fail(MOE_ERR_NOMEM, "%s: metadata", path);
    json_decref(md);
    free(nll);
    return s;
}

static void progress(void *arg, int done, int total)
{
    (void)arg;
    fprintf(stderr, "\rmoerun ppl: window %d of %d", done, total);
    if (done == total) fputc('\n', stderr);
}

/* What one ppl run measured: the table and the JSON object come from it. */
struct ppl_report {
    struct moe_ppl_summary sum;
    int windows, ctx, score_from, n_prefix, top_k;
    const char *backend, *quantize, *kv_dtype;
    const char *expert_plan; /* --expert-dtype-plan FILE, or NULL */
    double hot_share;
    double seconds;
    long long window_tokens;
};

static void print_summary(const struct ppl_report *r)
{
    const struct moe_ppl_summary *s = &r->sum;
    printf("windows          %d of %d tokens (%d prefix), scored from row %d\n", r->windows, r->ctx, r->n_prefix,
           r->score_from);
    printf("tokens scored    %lld\n", (long long)s->n);
    printf("perplexity       %.4f +/- %.4f\n", s->ppl, s->se_ppl);
    printf("mean NLL         %.6f +/- %.6f nats\n", s->mean_nll, s->se_nll);
    printf("top-1 accuracy   %.2f%%\n", 100 * s->top1);
    if (!s->has_base) return;
    printf("base perplexity  %.4f\n", s->base_ppl);
    printf("ln(PPL/base)     %.6f +/- %.6f\n", s->mean_dnll, s->se_dnll);
    printf("KL divergence    mean %.6f +/- %.6f; median %.6f, 90%% %.6f, 99%% %.6f, max %.6f\n", s->mean_kl,
           s->se_kl, s->kl_median, s->kl_p90, s->kl_p99, s->kl_max);
    printf("same top-1       %.2f%% +/- %.2f%%\n", 100 * s->same_top1, 100 * s->se_same_top1);
    printf("RMS dp(target)   %.4f%%\n", 100 * s->rms_dp);
}

static void print_json(const struct ppl_report *r)
{
    const struct moe_ppl_summary *s = &r->sum;
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:s, s:i, s:f, s:s, s:s}", "windows",
                          r->windows, "ctx", r->ctx, "prefix_tokens", r->n_prefix, "score_from", r->score_from,
                          "scored", (json_int_t)s->n, "ppl", s->ppl, "ppl_se", s->se_ppl, "mean_nll", s->mean_nll,
                          "mean_nll_se", s->se_nll, "top1_accuracy", s->top1, "backend", r->backend, "top_k",
                          r->top_k, "seconds", r->seconds, "quantize", r->quantize, "kv_dtype", r->kv_dtype);
    if (o && r->expert_plan)
        json_object_set_new(o, "expert_plan", json_pack("{s:s, s:f}", "file", r->expert_plan, "hot_share", r->hot_share));
    if (o && s->has_base)
        json_object_set_new(o, "base",
                            json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "ppl",
                                      s->base_ppl, "ln_ppl_ratio", s->mean_dnll, "ln_ppl_ratio_se", s->se_dnll,
                                      "kl_mean", s->mean_kl, "kl_se", s->se_kl, "kl_median", s->kl_median, "kl_p90",
                                      s->kl_p90, "kl_p99", s->kl_p99, "kl_max", s->kl_max, "same_top1",
                                      s->same_top1, "same_top1_se", s->se_same_top1, "rms_dp", s->rms_dp));
    char *str = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (str) puts(str);
    free(str);
    json_decref(o);
}

/* What ppl loads and computes; ppl_free releases it. */
struct ppl_ctx {
    struct moe_model m;
    struct moe_backend be;
    struct moe_tokenizer tok;
    struct moe_runner r;
    struct moe_ppl_plan plan;
    struct moe_ppl_result res;
    struct moe_safetensors base_st;
    struct moe_ppl_base base;
    int32_t *body, *prefix;
    int n_prefix;
    uint16_t *save;
    char *text;
};

static void ppl_free(struct ppl_ctx *c)
{
    moe_ppl_result_free(&c->res);
    moe_safetensors_close(&c->base_st);
    moe_ppl_plan_free(&c->plan);
    moe_runner_free(&c->r);
    moe_backend_free(&c->be);
    moe_tokenizer_free(&c->tok);
    moe_model_free(&c->m);
    free(c->save);
    free(c->body);
    free(c->prefix);
    free(c->text);
}

/* The text, the model and its tokenizer, the windows (and the base run to compare with). */
static int ppl_windows(struct ppl_opts *o, const char *text_path, struct ppl_ctx *c)
{
    size_t text_len = 0, n_body = 0;
    bool bad_utf8 = false;
    FILE *f = strcmp(text_path, "-") ? fopen(text_path, "rb") : stdin;
    if (!f) return moe_cli_error("ppl", "%s: cannot open", text_path);
    c->text = moe_cli_read_all(f, &text_len);
    if (f != stdin) fclose(f);
    if (!c->text) return moe_cli_error("ppl", "%s: read error", text_path);
    if (moe_cli_open_model(&c->m, &o->eng.model) != MOE_OK || moe_tokenizer_load(&c->tok, o->eng.model.path) != MOE_OK ||
        moe_tokenizer_encode(&c->tok, c->text, text_len, false, &c->body, &n_body, &bad_utf8) != MOE_OK ||
        (!o->no_prefix && moe_ppl_text_prefix(&c->tok, &c->prefix, &c->n_prefix) != MOE_OK))
        return moe_cli_error("ppl", "%s", moe_last_error());
    if (bad_utf8)
        fprintf(stderr, "moerun ppl: %s is not valid UTF-8; invalid bytes were replaced with U+FFFD\n", text_path);
    const int max_pos = c->m.cfg.max_pos, V = c->m.cfg.vocab;
    if (o->ctx == 0) o->ctx = max_pos < 512 ? max_pos : 512;
    if (o->ctx > max_pos) return moe_cli_error("ppl", "--ctx %ld exceeds the model's context of %d", o->ctx, max_pos);
    if (o->score_from < 0) o->score_from = o->ctx / 2;
    for (size_t i = 0; i < n_body; i++)
        if (c->body[i] < 0 || c->body[i] >= V)
            return moe_cli_error("ppl", "token %d of the text is outside the model's vocabulary of %d", c->body[i], V);
    if (moe_ppl_plan_init(&c->plan, c->prefix, c->n_prefix, c->body, (int64_t)n_body, (int)o->ctx, (int)o->score_from,
                          (int)o->chunks) != MOE_OK ||
        (o->base_path && open_base(&c->base_st, o->base_path, &c->plan, V, &c->base) != MOE_OK))
        return moe_cli_error("ppl", "%s", moe_last_error());
    size_t bytes;
    if (o->save_path && (__builtin_mul_overflow((size_t)c->plan.n_scored, (size_t)V * 2, &bytes) ||
                         !(c->save = malloc(bytes))))
        return moe_cli_error("ppl", "--save-base: %lld tokens x %d vocabulary x 2 bytes do not fit in memory (use "
                             "--chunks)", (long long)c->plan.n_scored, V);
    return 0;
}

/* Runs every window and summarizes into r (and --save-base). */
static int ppl_eval(struct ppl_opts *o, struct ppl_ctx *c, struct ppl_report *r)
{
    enum moe_dtype kvt = MOE_DTYPE_F32;
    if (o->eng.kv_dtype) (void)moe_cli_parse_kv_dtype(o->eng.kv_dtype, &kvt); /* checked when parsed */
    struct moe_runner_opts ro;
    moe_ppl_runner_opts(&c->plan, (int)o->eng.max_batch_tokens, (int)o->eng.max_seqs, (int)o->eng.kv_block, kvt, &ro);
    if (moe_cli_backend_start(&c->be, &o->eng) != MOE_OK || moe_cli_par_runner(&o->eng, &c->be, &ro) != MOE_OK ||
        moe_runner_init(&c->r, &c->m, &c->be, &ro) != MOE_OK)
        return moe_cli_error("ppl", "%s", moe_last_error());
    if (moe_cli_stats_start(&o->st, &c->m, "ppl")) return 1;
    c->r.fw.stats = moe_cli_stats_recorder(&o->st);
    const double t0 = moe_seconds();
    if (moe_ppl_run(&c->r, &c->plan, o->base_path ? &c->base : NULL, c->save, &c->res, isatty(2) ? progress : NULL,
                    NULL) != MOE_OK)
        return moe_cli_error("ppl", "%s", moe_last_error());
    *r = (struct ppl_report){.windows = c->plan.n_windows, .ctx = c->plan.ctx, .score_from = c->plan.score_from,
                             .n_prefix = c->n_prefix, .top_k = c->m.cfg.top_k, .backend = c->be.ops->name,
                             .quantize = moe_cli_quant_name(c->be.quant), .expert_plan = o->eng.expert_plan,
                             .hot_share = o->eng.hot_share > 0 ? o->eng.hot_share : MOE_CLI_HOT_SHARE,
                             .kv_dtype = moe_dtype_name(c->r.kv.dtype), .seconds = moe_seconds() - t0,
                             .window_tokens = (long long)c->plan.win_start[c->plan.n_windows]};
    if (moe_ppl_summarize(&c->res, &r->sum) != MOE_OK ||
        (o->save_path && save_base(o->save_path, &c->plan, &c->res, c->save, c->m.cfg.vocab, o->eng.model.path) != MOE_OK))
        return moe_cli_error("ppl", "%s", moe_last_error());
    return 0;
}

int moe_cli_ppl(int argc, char **argv)
{
    struct ppl_opts o = {.score_from = -1};
    moe_cli_engine_defaults(&o.eng);
    struct moe_cli_args a;
    int rc = moe_cli_parse(&ppl_cmd, argc, argv, &o, &a);
    if (rc >= 0) return rc;
    if (a.n_pos != 2) {
        moe_cli_help(&ppl_cmd, stderr);
        return 2;
    }
    o.eng.model.path = a.pos[0];
    if (o.eng.model.synthetic) return moe_cli_error("ppl", "a synthetic model has no tokenizer: give a model folder");
    if (moe_cli_stats_check(&o.st, "ppl")) return 1;
    struct ppl_ctx c = {0};
    struct ppl_report r;
    rc = ppl_windows(&o, a.pos[1], &c);
    if (!rc) rc = ppl_eval(&o, &c, &r);
    if (!rc) {
        if (o.json) print_json(&r);
        else print_summary(&r);
        fprintf(stderr, "moerun ppl: %lld window tokens in %.2f s (%.1f tokens/s, backend %s)\n", r.window_tokens,
                r.seconds, r.seconds > 0 ? (double)r.window_tokens / r.seconds : 0.0, r.backend);
        rc = moe_cli_stats_finish(&o.st, &c.m, &o.eng.model, &c.be, "ppl");
    }
    moe_cli_stats_free(&o.st);
    ppl_free(&c);
    return rc;
}
