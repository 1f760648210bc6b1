/* cli_ppl.c - `moerun ppl`: perplexity of a model over a text file, and its
 * divergence from a base run saved earlier, so the cost of a memory-vs-
 * compute knob (--kv-dtype, --moe-top-k, the weights' dtype, the backend) is
 * one number against a reference (runtime/engine/ppl.h has the rule).
 *
 * A base run is a safetensors file: "logprobs" F16 (N, V), the log-softmax
 * of every scored row; "targets" I32 (N); "nll" F32 (N) and "argmax" I32
 * (N) as that run computed them; metadata naming the window settings.  A run
 * against it must score the same targets. */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/engine/ppl.h"
#include "runtime/model/safetensors.h"
#include "runtime/cli/stats_cli.h"
#include "runtime/text/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moerun ppl MODEL_DIR FILE [options]\n\n"
            "Perplexity of the model over FILE (a text; '-' reads stdin), in windows that\n"
            "do not overlap; each window starts with the tokenizer's prefix (BOS) and only\n"
            "its second half is scored, as llama.cpp's perplexity does.\n\n"
            "  --ctx N            tokens per window, prefix included (default 512, at most\n"
            "                     the model's context)\n"
            "  --score-from N     first scored row of a window (default ctx/2; 0 scores\n"
            "                     every token)\n"
            "  --chunks N         evaluate the first N windows only\n"
            "  --no-prefix        no special tokens (BOS) before each window\n"
            "  --save-base FILE   keep this run's log-probabilities (f16, N x V: V*2 bytes\n"
            "                     per scored token) for a later --kl-base\n"
            "  --kl-base FILE     compare with a saved run: KL divergence, same top-1,\n"
            "                     ln(PPL/PPL_base), RMS of the change in p(target)\n"
            "  --json             one JSON object on stdout instead of the table\n"
            MOE_CLI_ENGINE_HELP
            "  (the KV cache holds the windows of one step; --kv-budget and the prefix\n"
            "  cache do not apply)\n" MOE_CLI_STATS_USAGE);
}

enum { O_CTX = MOE_OPT_LAST, O_SCORE_FROM, O_CHUNKS, O_NO_PREFIX, O_SAVE, O_BASE, O_JSON };

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

static void print_summary(const struct moe_ppl_summary *s, const struct moe_ppl_plan *p, int n_prefix)
{
    printf("windows          %d of %d tokens (%d prefix), scored from row %d\n", p->n_windows,
           p->ctx, n_prefix, p->score_from);
    printf("tokens scored    %lld\n", (long long)s->n);
    printf("perplexity       %.4f +/- %.4f\n", s->ppl, s->se_ppl);
    printf("mean NLL         %.6f +/- %.6f nats\n", s->mean_nll, s->se_nll);
    printf("top-1 accuracy   %.2f%%\n", 100 * s->top1);
    if (!s->has_base) return;
    printf("base perplexity  %.4f\n", s->base_ppl);
    printf("ln(PPL/base)     %.6f +/- %.6f\n", s->mean_dnll, s->se_dnll);
    printf("KL divergence    mean %.6f +/- %.6f; median %.6f, 90%% %.6f, 99%% %.6f, max %.6f\n",
           s->mean_kl, s->se_kl, s->kl_median, s->kl_p90, s->kl_p99, s->kl_max);
    printf("same top-1       %.2f%% +/- %.2f%%\n", 100 * s->same_top1, 100 * s->se_same_top1);
    printf("RMS dp(target)   %.4f%%\n", 100 * s->rms_dp);
}

static json_t *summary_json(const struct moe_ppl_summary *s, const struct moe_ppl_plan *p,
                            int n_prefix, const char *backend, int top_k, double seconds,
                            enum moe_weight_quant quant, enum moe_dtype kv)
{
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:s, s:i, s:f}",
                          "windows", p->n_windows, "ctx", p->ctx, "prefix_tokens", n_prefix,
                          "score_from", p->score_from, "scored", (json_int_t)s->n, "ppl", s->ppl,
                          "ppl_se", s->se_ppl, "mean_nll", s->mean_nll, "mean_nll_se", s->se_nll,
                          "top1_accuracy", s->top1, "backend", backend, "top_k", top_k, "seconds",
                          seconds);
    if (o) {
        json_object_set_new(o, "quantize", json_string(quant == MOE_QUANT_Q8_0 ? "q8_0" : "none"));
        json_object_set_new(o, "kv_dtype", json_string(moe_dtype_name(kv)));
    }
    if (o && s->has_base)
        json_object_set_new(o, "base",
                            json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                                      "ppl", s->base_ppl, "ln_ppl_ratio", s->mean_dnll,
                                      "ln_ppl_ratio_se", s->se_dnll, "kl_mean", s->mean_kl,
                                      "kl_se", s->se_kl, "kl_median", s->kl_median, "kl_p90",
                                      s->kl_p90, "kl_p99", s->kl_p99, "kl_max", s->kl_max,
                                      "same_top1", s->same_top1, "same_top1_se", s->se_same_top1,
                                      "rms_dp", s->rms_dp));
    return o;
}

int moe_cli_ppl(int argc, char **argv)
{
    struct moe_cli_engine eo;
    moe_cli_engine_defaults(&eo);
    long ctx = 0, score_from = -1, chunks = 0;
    bool no_prefix = false, json = false;
    const char *save_path = NULL, *base_path = NULL;
    static const struct option opts[] = {
        {"ctx", required_argument, 0, O_CTX}, {"score-from", required_argument, 0, O_SCORE_FROM},
        {"chunks", required_argument, 0, O_CHUNKS}, {"no-prefix", no_argument, 0, O_NO_PREFIX},
        {"save-base", required_argument, 0, O_SAVE}, {"kl-base", required_argument, 0, O_BASE},
        {"json", no_argument, 0, O_JSON}, {"help", no_argument, 0, 'h'},
        MOE_CLI_ENGINE_LONGOPTS, MOE_CLI_STATS_OPTIONS, {0, 0, 0, 0}};
    struct moe_cli_stats so = {0};
    int c;
    optind = 1;
    while ((c = moe_cli_getopt(argc, argv, "h", opts, "ppl")) != -1) {
        int k = moe_cli_engine_option(&eo, "ppl", c, optarg);
        if (k == 0) k = moe_cli_stats_option(&so, &eo.model, c, optarg, "ppl");
        if (k < 0) return 1;
        if (k > 0) continue;
        long *dst = NULL, lo = 1;
        switch (c) {
        case O_CTX: dst = &ctx; lo = 3; break;
        case O_SCORE_FROM: dst = &score_from; lo = 0; break;
        case O_CHUNKS: dst = &chunks; break;
        case O_NO_PREFIX: no_prefix = true; break;
        case O_SAVE: save_path = optarg; break;
        case O_BASE: base_path = optarg; break;
        case O_JSON: json = true; break;
        case 'h': usage(stdout); return 0;
        default: return 2;
        }
        if (dst && !moe_cli_parse_int(optarg, lo, 1 << 24, dst))
            return moe_cli_error("ppl", "option value '%s' must be an integer in [%ld, %d]", optarg, lo,
                                 1 << 24);
    }
    if (optind + 2 != argc) {
        usage(stderr);
        return 2;
    }
    eo.model.path = argv[optind];
    const char *text_path = argv[optind + 1];
    if (eo.model.synthetic) return moe_cli_error("ppl", "a synthetic model has no tokenizer: give a model folder");
    if (moe_cli_stats_check(&so, "ppl")) return 1;
    enum moe_dtype kvt = MOE_DTYPE_F32;
    if (eo.kv_dtype && !moe_cli_parse_kv_dtype(eo.kv_dtype, &kvt))
        return moe_cli_error("ppl", "--kv-dtype '%s' (use " MOE_CLI_KV_DTYPES ")", eo.kv_dtype);

    int rc = 1, n_prefix = 0;
    struct moe_model m = {0};
    struct moe_backend be = {0};
    struct moe_tokenizer tok = {0};
    struct moe_runner r = {0};
    struct moe_ppl_plan plan = {0};
    struct moe_ppl_result res = {0};
    struct moe_safetensors base_st = {0};
    struct moe_ppl_base base;
    int32_t *body = NULL, *prefix = NULL;
    uint16_t *save = NULL;
    char *text = NULL;
    size_t text_len = 0, n_body = 0;
    bool bad_utf8 = false;
    FILE *f = strcmp(text_path, "-") ? fopen(text_path, "rb") : stdin;
    if (!f) {
        moe_cli_error("ppl", "%s: cannot open", text_path);
        goto done;
    }
    text = moe_cli_read_all(f, &text_len);
    if (f != stdin) fclose(f);
    if (!text) {
        moe_cli_error("ppl", "%s: read error", text_path);
        goto done;
    }
    if (moe_cli_open_model(&m, &eo.model) != MOE_OK || moe_tokenizer_load(&tok, eo.model.path) != MOE_OK ||
        moe_tokenizer_encode(&tok, text, text_len, false, &body, &n_body, &bad_utf8) != MOE_OK ||
        (!no_prefix && moe_ppl_text_prefix(&tok, &prefix, &n_prefix) != MOE_OK)) {
        moe_cli_error("ppl", "%s", moe_last_error());
        goto done;
    }
    if (bad_utf8)
        fprintf(stderr, "moerun ppl: %s is not valid UTF-8; invalid bytes were replaced with U+FFFD\n",
                text_path);
    if (ctx == 0) ctx = m.cfg.max_pos < 512 ? m.cfg.max_pos : 512;
    if (ctx > m.cfg.max_pos) {
        moe_cli_error("ppl", "--ctx %ld exceeds the model's context of %d", ctx, m.cfg.max_pos);
        goto done;
    }
    if (score_from < 0) score_from = ctx / 2;
    for (size_t i = 0; i < n_body; i++)
        if (body[i] < 0 || body[i] >= m.cfg.vocab) {
            moe_cli_error("ppl", "token %d of the text is outside the model's vocabulary of %d", body[i],
                          m.cfg.vocab);
            goto done;
        }
    if (moe_ppl_plan_init(&plan, prefix, n_prefix, body, (int64_t)n_body, (int)ctx, (int)score_from,
                          (int)chunks) != MOE_OK ||
        (base_path && open_base(&base_st, base_path, &plan, m.cfg.vocab, &base) != MOE_OK)) {
        moe_cli_error("ppl", "%s", moe_last_error());
        goto done;
    }
    if (save_path) {
        size_t bytes;
        if (__builtin_mul_overflow((size_t)plan.n_scored, (size_t)m.cfg.vocab * 2, &bytes) ||
            !(save = malloc(bytes))) {
            moe_cli_error("ppl", "--save-base: %lld tokens x %d vocabulary x 2 bytes do not fit in memory "
                          "(use --chunks)", (long long)plan.n_scored, m.cfg.vocab);
            goto done;
        }
    }
    struct moe_runner_opts ro;
    moe_ppl_runner_opts(&plan, (int)eo.max_batch_tokens, (int)eo.max_seqs, (int)eo.kv_block, kvt, &ro);
    if (moe_cli_backend_start(&be, &eo) != MOE_OK ||
        moe_runner_init(&r, &m, &be, &ro) != MOE_OK) {
        moe_cli_error("ppl", "%s", moe_last_error());
        goto done;
    }
    if (moe_cli_stats_start(&so, &m, "ppl")) goto done;
    r.fw.stats = moe_cli_stats_recorder(&so);
    const double t0 = moe_cli_now();
    if (moe_ppl_run(&r, &plan, base_path ? &base : NULL, save, &res, isatty(2) ? progress : NULL, NULL) !=
        MOE_OK) {
        moe_cli_error("ppl", "%s", moe_last_error());
        goto done;
    }
    const double secs = moe_cli_now() - t0;
    struct moe_ppl_summary sum;
    if (moe_ppl_summarize(&res, &sum) != MOE_OK ||
        (save_path && save_base(save_path, &plan, &res, save, m.cfg.vocab, eo.model.path) != MOE_OK)) {
        moe_cli_error("ppl", "%s", moe_last_error());
        goto done;
    }
    if (json) {
        json_t *o = summary_json(&sum, &plan, n_prefix, be.ops->name, m.cfg.top_k, secs, be.quant,
                                 r.kv.dtype);
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else {
        print_summary(&sum, &plan, n_prefix);
    }
    fprintf(stderr, "moerun ppl: %lld window tokens in %.2f s (%.1f tokens/s, backend %s)\n",
            (long long)plan.win_start[plan.n_windows], secs,
            secs > 0 ? (double)plan.win_start[plan.n_windows] / secs : 0.0, be.ops->name);
    rc = moe_cli_stats_finish(&so, &m, &eo.model, &be, "ppl");
done:
    moe_cli_stats_free(&so);
    moe_ppl_result_free(&res);
    moe_safetensors_close(&base_st);
    moe_ppl_plan_free(&plan);
    moe_runner_free(&r);
    moe_backend_free(&be);
    moe_tokenizer_free(&tok);
    moe_model_free(&m);
    free(save);
    free(body);
    free(prefix);
    free(text);
    return rc;
}
