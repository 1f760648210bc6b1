/* ppl.c - perplexity and divergence over windows of a text (see ppl.h for
 * the rule).  Windows go through the runner several at a time, one sequence
 * each; every scored row is reduced on the host in double precision by one
 * OpenMP thread per row, into arrays indexed by the row's place in the
 * evaluation, so the figures do not depend on the thread count or the
 * number of windows per step. */
#include "runtime/engine/ppl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core/tensor.h"
#include "runtime/text/tokenizer.h"

/* Encodes a probe with and without special tokens and takes what comes
 * before the plain encoding. */
enum moe_status moe_ppl_text_prefix(struct moe_tokenizer *tok, int32_t **prefix, int *n)
{
    int32_t *plain = NULL, *full = NULL;
    size_t np, nf;
    *prefix = NULL;
    *n = 0;
    enum moe_status s = moe_tokenizer_encode(tok, "a", 1, false, &plain, &np, NULL);
    if (s == MOE_OK) s = moe_tokenizer_encode(tok, "a", 1, true, &full, &nf, NULL);
    if (s == MOE_OK) {
        for (size_t p = 0; p + np <= nf; p++)
            if (!memcmp(full + p, plain, np * sizeof *plain)) {
                *prefix = full;
                *n = (int)p;
                full = NULL;
                break;
            }
        if (!*prefix) s = moe_fail(MOE_ERR_FORMAT, "tokenizer: a text's own tokens are not inside its "
                                   "encoding with special tokens");
    }
    free(plain);
    free(full);
    return s;
}

void moe_ppl_plan_free(struct moe_ppl_plan *p)
{
    free(p->tokens);
    free(p->win_start);
    free(p->scored_start);
    memset(p, 0, sizeof *p);
}

enum moe_status moe_ppl_plan_init(struct moe_ppl_plan *p, const int32_t *prefix, int n_prefix,
                                  const int32_t *body, int64_t n_body, int ctx, int score_from,
                                  int max_windows)
{
    memset(p, 0, sizeof *p);
    if (n_prefix < 0 || ctx < n_prefix + 2)
        return moe_fail(MOE_ERR_INVALID_ARG, "window of %d tokens: it must hold the %d prefix "
                        "token(s) and at least 2 text tokens", ctx, n_prefix);
    if (score_from < 0 || score_from > ctx - 2)
        return moe_fail(MOE_ERR_INVALID_ARG, "scoring from row %d of a %d-token window: use 0..%d",
                        score_from, ctx, ctx - 2);
    const int64_t step = ctx - n_prefix;
    int64_t nw = (n_body + step - 1) / step;
    if (max_windows > 0 && nw > max_windows) nw = max_windows;
    /* only the last window can be short; one that scores nothing is left out */
    if (nw > 0) {
        const int64_t last = n_body - (nw - 1) * step < step ? n_body - (nw - 1) * step : step;
        if (n_prefix + last - 1 - score_from <= 0) nw--;
    }
    if (nw == 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "the text has %lld tokens: too short to score any with "
                        "windows of %d tokens scored from row %d", (long long)n_body, ctx, score_from);
    if (nw > INT32_MAX - 1) return moe_fail(MOE_ERR_INVALID_ARG, "%lld windows: too many", (long long)nw);
    p->win_start = malloc((size_t)(nw + 1) * sizeof *p->win_start);
    p->scored_start = malloc((size_t)(nw + 1) * sizeof *p->scored_start);
    size_t n_tok; /* nw * n_prefix + the body tokens used, at most n_body + nw * n_prefix */
    if (__builtin_mul_overflow((size_t)nw, (size_t)n_prefix, &n_tok) ||
        __builtin_add_overflow(n_tok, (size_t)n_body, &n_tok) ||
        __builtin_mul_overflow(n_tok, sizeof(int32_t), &n_tok))
        return moe_fail(MOE_ERR_INVALID_ARG, "%lld text tokens: size overflows", (long long)n_body);
    p->tokens = malloc(n_tok ? n_tok : 1);
    if (!p->win_start || !p->scored_start || !p->tokens) {
        moe_ppl_plan_free(p);
        return moe_fail(MOE_ERR_NOMEM, "perplexity windows of %lld tokens", (long long)n_body);
    }
    int64_t at = 0, scored = 0;
    for (int64_t w = 0; w < nw; w++) {
        const int64_t off = w * step, nb = n_body - off < step ? n_body - off : step;
        p->win_start[w] = at;
        p->scored_start[w] = scored;
        if (n_prefix) memcpy(p->tokens + at, prefix, (size_t)n_prefix * sizeof(int32_t));
        memcpy(p->tokens + at + n_prefix, body + off, (size_t)nb * sizeof(int32_t));
        at += n_prefix + nb;
        scored += n_prefix + nb - 1 - score_from;
    }
    p->win_start[nw] = at;
    p->scored_start[nw] = scored;
    p->n_windows = (int)nw;
    p->ctx = ctx;
    p->score_from = score_from;
    p->n_scored = scored;
    return MOE_OK;
}

/* Windows per step and rows per piece of a window, from the runner's limits. */
static void step_shape(const struct moe_ppl_plan *p, int max_tokens, int max_seqs, int *per_step,
                       int *piece)
{
    int w = max_tokens / p->ctx;
    if (w > max_seqs) w = max_seqs;
    if (w > p->n_windows) w = p->n_windows;
    *per_step = w > 0 ? w : 1;
    *piece = p->ctx < max_tokens ? p->ctx : max_tokens;
}

void moe_ppl_runner_opts(const struct moe_ppl_plan *p, int max_tokens, int max_seqs, int block_size,
                         enum moe_dtype kv_dtype, struct moe_runner_opts *o)
{
    int per_step, piece;
    step_shape(p, max_tokens, max_seqs, &per_step, &piece);
    const int rows = per_step * piece;
    *o = (struct moe_runner_opts){
        .max_tokens = rows, .max_seqs = per_step, .max_logits = rows, .block_size = block_size,
        .n_blocks = per_step * ((p->ctx + block_size - 1) / block_size), .kv_dtype = kv_dtype,
        .kv_dtype_set = true};
}

void moe_ppl_result_free(struct moe_ppl_result *res)
{
    free(res->target);
    free(res->argmax);
    free(res->nll);
    free(res->kl);
    free(res->base_nll);
    free(res->dp);
    free(res->same_top1);
    memset(res, 0, sizeof *res);
}

static int first_max_f32(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Scores one logits row x (V) predicting target; i is its index in res.
 * Returns false when the row is not finite. */
static bool score_row(const float *x, int V, int32_t target, int64_t i, const struct moe_ppl_base *base,
                      uint16_t *save, struct moe_ppl_result *res)
{
    double mx = -INFINITY;
    for (int v = 0; v < V; v++) {
        if (!isfinite(x[v])) return false;
        if (x[v] > mx) mx = x[v];
    }
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)x[v] - mx);
    const double lse = mx + log(sum);
    res->target[i] = target;
    res->argmax[i] = first_max_f32(x, V);
    res->nll[i] = lse - (double)x[target];
    if (save) {
        uint16_t *row = save + (size_t)i * (size_t)V;
        for (int v = 0; v < V; v++) {
            double lp = (double)x[v] - lse;
            row[v] = moe_f32_to_f16((float)(lp < -65504.0 ? -65504.0 : lp));
        }
    }
    if (!base) return true;
    const uint16_t *b = base->logprobs + (size_t)i * (size_t)V;
    double bmx = -INFINITY, bsum = 0;
    for (int v = 0; v < V; v++) {
        double y = moe_f16_to_f32(b[v]);
        if (y > bmx) bmx = y;
    }
    /* one pass: with e_v = exp(y_v - bmx), the renormalised base is e_v / S
     * (S = sum e_v), and KL = sum e_v (y_v - bmx - lp_v) / S - log S */
    double s2 = 0;
    for (int v = 0; v < V; v++) {
        const double d = moe_f16_to_f32(b[v]) - bmx, e = exp(d);
        bsum += e;
        s2 += e * (d - ((double)x[v] - lse));
    }
    res->kl[i] = s2 / bsum - log(bsum);
    res->base_nll[i] = base->nll[i];
    res->same_top1[i] = base->argmax[i] == res->argmax[i];
    res->dp[i] = exp(-res->nll[i]) - exp(-res->base_nll[i]);
    return true;
}

/* A chunk of one step: rows [off, off + n) of window w. */
struct piece {
    int w, off, n;
    bool scored; /* overlaps the scored rows, so all its logits come back */
};

static MOE_MUST_USE enum moe_status score_step(const struct moe_ppl_plan *p, const struct piece *pc,
                                               int n_pc, const float *logits, int V,
                                               const struct moe_ppl_base *base, uint16_t *save,
                                               struct moe_ppl_result *res)
{
    int row0 = 0;
    for (int c = 0; c < n_pc; c++) {
        const struct piece *q = &pc[c];
        if (!q->scored) {
            row0++;
            continue;
        }
        const int64_t ws = p->win_start[q->w], len = p->win_start[q->w + 1] - ws;
        const int lo = q->off > p->score_from ? q->off : p->score_from;
        const int hi = q->off + q->n < len - 1 ? q->off + q->n : (int)len - 1; /* rows [lo, hi) */
        int bad = hi; /* the first position whose logits are not finite */
#pragma omp parallel for schedule(dynamic, 1)
        for (int j = lo; j < hi; j++) {
            const int64_t i = p->scored_start[q->w] + (j - p->score_from);
            const float *x = logits + (size_t)(row0 + j - q->off) * (size_t)V;
            if (!score_row(x, V, p->tokens[ws + j + 1], i, base, save, res)) {
#pragma omp critical(moe_ppl_bad)
                if (j < bad) bad = j;
            }
        }
        if (bad < hi)
            return moe_fail(MOE_ERR_INVALID_ARG, "window %d, position %d: the model's logits are not "
                            "finite (NaN or infinity)", q->w, bad);
        row0 += q->n;
    }
    return MOE_OK;
}

enum moe_status moe_ppl_run(struct moe_runner *r, const struct moe_ppl_plan *p,
                            const struct moe_ppl_base *base, uint16_t *save, struct moe_ppl_result *res,
                            void (*progress)(void *arg, int done, int total), void *arg)
{
    const int V = r->m->cfg.vocab;
    memset(res, 0, sizeof *res);
    if (base && (base->n != p->n_scored || base->vocab != V))
        return moe_fail(MOE_ERR_INVALID_ARG, "base run of %lld tokens x %d vocabulary; this run scores "
                        "%lld x %d", (long long)base->n, base->vocab, (long long)p->n_scored, V);
    int per_step, piece;
    step_shape(p, r->o.max_tokens, r->o.max_seqs, &per_step, &piece);
    if (per_step * piece > r->o.max_logits)
        return moe_fail(MOE_ERR_INVALID_ARG, "runner returns %d logit rows per step; perplexity needs %d",
                        r->o.max_logits, per_step * piece);
    const size_t n = (size_t)p->n_scored;
    res->n = p->n_scored;
    res->target = malloc(n * sizeof *res->target);
    res->argmax = malloc(n * sizeof *res->argmax);
    res->nll = malloc(n * sizeof *res->nll);
    bool ok = res->target && res->argmax && res->nll;
    if (base) {
        res->kl = malloc(n * sizeof *res->kl);
        res->base_nll = malloc(n * sizeof *res->base_nll);
        res->dp = malloc(n * sizeof *res->dp);
        res->same_top1 = malloc(n);
        ok = ok && res->kl && res->base_nll && res->dp && res->same_top1;
    }
    float *logits = malloc((size_t)per_step * (size_t)piece * (size_t)V * sizeof(float));
    struct moe_seq *seqs = calloc((size_t)per_step, sizeof *seqs);
    struct moe_chunk *ch = malloc((size_t)per_step * sizeof *ch);
    struct piece *pc = malloc((size_t)per_step * sizeof *pc);
    enum moe_status s = MOE_OK;
    if (!ok || !logits || !seqs || !ch || !pc) {
        s = moe_fail(MOE_ERR_NOMEM, "perplexity of %lld tokens", (long long)p->n_scored);
        goto done;
    }
    for (int w0 = 0; w0 < p->n_windows && s == MOE_OK; w0 += per_step) {
        const int nw = p->n_windows - w0 < per_step ? p->n_windows - w0 : per_step;
        for (int off = 0; off < p->ctx && s == MOE_OK; off += piece) {
            int n_pc = 0;
            for (int k = 0; k < nw; k++) {
                const int w = w0 + k;
                const int64_t ws = p->win_start[w], len = p->win_start[w + 1] - ws;
                if (off >= len) continue;
                const int cn = len - off < piece ? (int)(len - off) : piece;
                const bool scored = off + cn - 1 >= p->score_from && off < len - 1;
                pc[n_pc] = (struct piece){w, off, cn, scored};
                ch[n_pc++] = (struct moe_chunk){&seqs[k], p->tokens + ws + off, cn, scored, false, w + 1};
            }
            if (n_pc == 0) break;
            s = moe_runner_step(r, ch, n_pc, logits, NULL, NULL, NULL);
            if (s == MOE_OK) s = score_step(p, pc, n_pc, logits, V, base, save, res);
        }
        for (int k = 0; k < per_step; k++) moe_seq_reset(r, &seqs[k]);
        if (s == MOE_OK && progress) progress(arg, w0 + nw, p->n_windows);
    }
done:
    if (seqs)
        for (int k = 0; k < per_step; k++) moe_seq_free(r, &seqs[k]);
    free(seqs);
    free(ch);
    free(pc);
    free(logits);
    if (s != MOE_OK) moe_ppl_result_free(res);
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Mean and standard error of the mean of x (n). */
static void mean_se(const double *x, int64_t n, double *mean, double *se)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) m += x[i];
    m /= (double)n;
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - m) * (x[i] - m);
    *mean = m;
    *se = n > 1 ? sqrt(ss / (double)(n - 1) / (double)n) : 0;
}

static double quantile(const double *sorted, int64_t n, double q)
{
    double at = q * (double)(n - 1);
    int64_t i = (int64_t)at;
    if (i >= n - 1) return sorted[n - 1];
    return sorted[i] + (at - (double)i) * (sorted[i + 1] - sorted[i]);
}

enum moe_status moe_ppl_summarize(const struct moe_ppl_result *res, struct moe_ppl_summary *s)
{
    memset(s, 0, sizeof *s);
    const int64_t n = res->n;
    s->n = n;
    if (n == 0) return MOE_OK;
    mean_se(res->nll, n, &s->mean_nll, &s->se_nll);
    s->ppl = exp(s->mean_nll);
    s->se_ppl = s->ppl * s->se_nll;
    int64_t hit = 0;
    for (int64_t i = 0; i < n; i++) hit += res->argmax[i] == res->target[i];
    s->top1 = (double)hit / (double)n;
    if (!res->kl) return MOE_OK;
    s->has_base = true;
    double *d = malloc((size_t)n * sizeof *d);
    if (!d) return moe_fail(MOE_ERR_NOMEM, "perplexity summary of %lld tokens", (long long)n);
    double se_unused;
    mean_se(res->base_nll, n, &s->base_mean_nll, &se_unused);
    s->base_ppl = exp(s->base_mean_nll);
    for (int64_t i = 0; i < n; i++) d[i] = res->nll[i] - res->base_nll[i];
    mean_se(d, n, &s->mean_dnll, &s->se_dnll);
    mean_se(res->kl, n, &s->mean_kl, &s->se_kl);
    memcpy(d, res->kl, (size_t)n * sizeof *d);
    qsort(d, (size_t)n, sizeof *d, cmp_double);
    s->kl_median = quantile(d, n, 0.5);
    s->kl_p90 = quantile(d, n, 0.9);
    s->kl_p99 = quantile(d, n, 0.99);
    s->kl_max = d[n - 1];
    int64_t same = 0;
    double ss = 0;
    for (int64_t i = 0; i < n; i++) {
        same += res->same_top1[i];
        ss += res->dp[i] * res->dp[i];
    }
    s->same_top1 = (double)same / (double)n;
    s->se_same_top1 = sqrt(s->same_top1 * (1 - s->same_top1) / (double)n);
    s->rms_dp = sqrt(ss / (double)n);
    free(d);
    return MOE_OK;
}
