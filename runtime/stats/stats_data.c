/* stats_data.c - loads a statistics JSON or a routing trace for `moerun
 * stats` (see stats_analyze.h).  Every array length and id is checked
 * against the declared E, K and layer count before use. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "router/stats.h"
#include "runtime/stats/stats_analyze.h"

void moe_sdata_free(struct moe_sdata *d)
{
    void *p[] = {d->path, d->layers, d->load, d->top1, d->coact, d->ent_norm, d->ids, d->w, d->meta,
                 d->rejected};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    memset(d, 0, sizeof *d);
}

static enum moe_status alloc_counters(struct moe_sdata *d)
{
    const size_t Lm = (size_t)d->Lm, E = (size_t)d->E;
    if (d->Lm == 0 || d->E == 0)
        return moe_fail(MOE_ERR_FORMAT, "%s: the model has no MoE layer, so no expert statistics",
                        d->path);
    if (d->Lm < 0 || d->Lm > 4096 || d->E <= 0 || d->E > 65536 || d->K <= 0 || d->K > d->E)
        return moe_fail(MOE_ERR_FORMAT, "%s: %d MoE layers, %d experts, top-%d", d->path, d->Lm,
                        d->E, d->K);
    /* The co-activation matrix is dense (Lm, E, E): the counts declared by a
     * small file must not decide on their own to allocate gigabytes. */
    if (Lm * E * E > MOE_SDATA_MAX_COACT)
        return moe_fail(MOE_ERR_FORMAT, "%s: %d MoE layers x %d experts need a co-activation table "
                        "of %zu entries; at most %llu are supported", d->path, d->Lm, d->E, Lm * E * E,
                        (unsigned long long)MOE_SDATA_MAX_COACT);
    d->layers = calloc(Lm ? Lm : 1, sizeof(int32_t));
    d->load = calloc(Lm * E + 1, sizeof(double));
    d->top1 = calloc(Lm * E + 1, sizeof(double));
    d->coact = calloc(Lm * E * E + 1, sizeof(double));
    d->ent_norm = calloc(Lm + 1, sizeof(double));
    d->rejected = calloc(Lm * E + 1, sizeof(double));
    if (!d->layers || !d->load || !d->top1 || !d->coact || !d->ent_norm || !d->rejected)
        return moe_fail(MOE_ERR_NOMEM, "%s: counters", d->path);
    for (size_t j = 0; j < Lm; j++) d->ent_norm[j] = NAN;
    return MOE_OK;
}

/* obj[key] as an int in [lo, hi] (0 when absent and not required): a value
 * that is not an integer or is out of range is an error, never truncated. */
static enum moe_status int_field(const struct moe_sdata *d, json_t *obj, const char *where,
                                 const char *key, long long lo, long long hi, bool required, int *out)
{
    json_t *v = json_object_get(obj, key);
    *out = 0;
    if (!v && !required) return MOE_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return moe_fail(MOE_ERR_FORMAT, "%s: '%s%s' must be an integer in [%lld, %lld]", d->path,
                        where, key, lo, hi);
    *out = (int)json_integer_value(v);
    return MOE_OK;
}

/* The model fields shared by both formats. */
static enum moe_status model_fields(struct moe_sdata *d, json_t *obj, const char *where)
{
    MOE_TRY(int_field(d, obj, where, "experts", 0, 65536, true, &d->E));
    MOE_TRY(int_field(d, obj, where, "top_k", 0, 65536, true, &d->K));
    MOE_TRY(int_field(d, obj, where, "d_model", 0, INT32_MAX, false, &d->d_model));
    MOE_TRY(int_field(d, obj, where, "d_expert", 0, INT32_MAX, false, &d->d_expert));
    MOE_TRY(int_field(d, obj, where, "weight_bytes", 0, INT32_MAX, false, &d->weight_bytes));
    json_t *eb = json_object_get(obj, "expert_bytes"); /* absent in files before it */
    d->expert_bytes = 0;
    if (eb && (!json_is_integer(eb) || json_integer_value(eb) < 0))
        return moe_fail(MOE_ERR_FORMAT, "%s: '%sexpert_bytes' must be a non-negative integer", d->path, where);
    if (eb) d->expert_bytes = json_integer_value(eb);
    return MOE_OK;
}

/* Reads a JSON array of E numbers into out. */
static enum moe_status num_array(const struct moe_sdata *d, json_t *a, const char *what, int layer,
                                 double *out)
{
    if (!json_is_array(a) || (int)json_array_size(a) != d->E)
        return moe_fail(MOE_ERR_FORMAT, "%s: layer %d '%s' is not an array of %d numbers", d->path,
                        layer, what, d->E);
    for (int e = 0; e < d->E; e++) {
        json_t *v = json_array_get(a, (size_t)e);
        if (!json_is_number(v) || json_number_value(v) < 0)
            return moe_fail(MOE_ERR_FORMAT, "%s: layer %d '%s'[%d] is not a count", d->path, layer,
                            what, e);
        out[e] = json_number_value(v);
    }
    return MOE_OK;
}

static enum moe_status load_stats_json(struct moe_sdata *d, json_t *root)
{
    json_t *model = json_object_get(root, "model"), *layers = json_object_get(root, "layers");
    if (json_integer_value(json_object_get(root, "version")) != MOE_STATS_VERSION)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: statistics version %lld (this moerun reads %d)",
                        d->path, (long long)json_integer_value(json_object_get(root, "version")),
                        MOE_STATS_VERSION);
    if (!json_is_object(model) || !json_is_array(layers))
        return moe_fail(MOE_ERR_FORMAT, "%s: no 'model' object or 'layers' array", d->path);
    MOE_TRY(model_fields(d, model, "model."));
    if (json_array_size(layers) > 4096)
        return moe_fail(MOE_ERR_FORMAT, "%s: %zu MoE layers; at most 4096", d->path,
                        json_array_size(layers));
    d->Lm = (int)json_array_size(layers);
    d->tokens = json_integer_value(json_object_get(json_object_get(root, "tokens"), "total"));
    d->steps = json_integer_value(json_object_get(json_object_get(root, "window"), "steps"));
    d->tokens_rejected =
        json_integer_value(json_object_get(json_object_get(root, "speculation"), "rejected_tokens"));
    if (d->tokens_rejected < 0 || d->tokens_rejected > d->tokens)
        return moe_fail(MOE_ERR_FORMAT, "%s: %lld rejected tokens of %lld", d->path,
                        (long long)d->tokens_rejected, (long long)d->tokens);
    MOE_TRY(alloc_counters(d));
    const size_t E = (size_t)d->E;
    for (int j = 0; j < d->Lm; j++) {
        json_t *L = json_array_get(layers, (size_t)j);
        d->layers[j] = (int32_t)json_integer_value(json_object_get(L, "layer"));
        MOE_TRY(num_array(d, json_object_get(L, "tokens"), "tokens", j, d->load + j * E));
        MOE_TRY(num_array(d, json_object_get(L, "top1"), "top1", j, d->top1 + j * E));
        json_t *rej = json_object_get(L, "tokens_spec_rejected"); /* absent before speculation */
        if (rej) MOE_TRY(num_array(d, rej, "tokens_spec_rejected", j, d->rejected + j * E));
        for (size_t e = 0; e < E; e++)
            if (d->rejected[j * E + e] > d->load[j * E + e])
                return moe_fail(MOE_ERR_FORMAT, "%s: layer %d expert %zu: more rejected pairs than "
                                "pairs", d->path, j, e);
        json_t *en = json_object_get(L, "router_entropy_norm");
        if (json_is_number(en)) d->ent_norm[j] = json_number_value(en);
        json_t *co = json_object_get(L, "coactivation"), *pr;
        size_t i;
        json_array_foreach(co, i, pr) {
            json_int_t a = json_integer_value(json_array_get(pr, 0)),
                       b = json_integer_value(json_array_get(pr, 1));
            if (json_array_size(pr) != 3 || a < 0 || b <= a || b >= d->E)
                return moe_fail(MOE_ERR_FORMAT, "%s: layer %d co-activation entry %zu", d->path, j, i);
            d->coact[(j * E + (size_t)a) * E + (size_t)b] = json_number_value(json_array_get(pr, 2));
        }
    }
    return MOE_OK;
}

/* Aggregates the trace into the counters. */
static void aggregate_trace(struct moe_sdata *d)
{
    const int Lm = d->Lm, E = d->E, K = d->K;
    int64_t last_step = -1;
    for (int64_t t = 0; t < d->N; t++) {
        if (d->meta[t * 4] != last_step) {
            d->steps++;
            last_step = d->meta[t * 4];
        }
        for (int j = 0; j < Lm; j++) {
            const int32_t *id = d->ids + ((size_t)t * Lm + j) * K;
            for (int k = 0; k < K; k++) {
                if (id[k] < 0 || id[k] >= E) continue;
                d->load[(size_t)j * E + id[k]] += 1;
                for (int k2 = k + 1; k2 < K; k2++)
                    if (id[k2] >= 0 && id[k2] < E && id[k2] != id[k]) {
                        int a = id[k] < id[k2] ? id[k] : id[k2], b = id[k] ^ id[k2] ^ a;
                        d->coact[((size_t)j * E + a) * E + b] += 1;
                    }
            }
            if (id[0] >= 0 && id[0] < E) d->top1[(size_t)j * E + id[0]] += 1;
            if (d->meta[t * 4 + 3] == 2)
                for (int k = 0; k < K; k++)
                    if (id[k] >= 0 && id[k] < E) d->rejected[(size_t)j * E + id[k]] += 1;
        }
        d->tokens_rejected += d->meta[t * 4 + 3] == 2;
    }
    d->tokens = d->N;
}

int64_t moe_sdata_accepted_only(struct moe_sdata *d)
{
    const size_t LE = (size_t)d->Lm * (size_t)d->E, row = (size_t)d->Lm * (size_t)d->K;
    int64_t dropped = d->tokens_rejected;
    if (!d->from_trace) {
        for (size_t i = 0; i < LE; i++) d->load[i] -= d->rejected[i];
        d->tokens -= d->tokens_rejected;
    } else {
        int64_t n = 0;
        for (int64_t t = 0; t < d->N; t++) {
            if (d->meta[t * 4 + 3] == 2) continue;
            memmove(d->ids + (size_t)n * row, d->ids + (size_t)t * row, row * sizeof *d->ids);
            memmove(d->w + (size_t)n * row, d->w + (size_t)t * row, row * sizeof *d->w);
            memmove(d->meta + n * 4, d->meta + t * 4, 4 * sizeof *d->meta);
            n++;
        }
        d->N = n;
        memset(d->load, 0, LE * sizeof *d->load);
        memset(d->top1, 0, LE * sizeof *d->top1);
        memset(d->coact, 0, LE * (size_t)d->E * sizeof *d->coact);
        d->steps = 0;
        aggregate_trace(d);
    }
    memset(d->rejected, 0, LE * sizeof *d->rejected);
    d->tokens_rejected = 0;
    return dropped;
}

static enum moe_status load_trace(struct moe_sdata *d, json_t *root, const char *prefix)
{
    json_t *layers = json_object_get(root, "moe_layers");
    d->from_trace = true;
    MOE_TRY(model_fields(d, root, ""));
    if (json_array_size(layers) > 4096)
        return moe_fail(MOE_ERR_FORMAT, "%s: %zu MoE layers; at most 4096", d->path,
                        json_array_size(layers));
    d->Lm = (int)json_array_size(layers);
    MOE_TRY(alloc_counters(d));
    for (int j = 0; j < d->Lm; j++)
        d->layers[j] = (int32_t)json_integer_value(json_array_get(layers, (size_t)j));
    char path[4096];
    struct moe_npy ids = {0}, w = {0}, tok = {0};
    enum moe_status s;
    snprintf(path, sizeof path, "%s.ids.npy", prefix);
    if ((s = moe_npy_read(path, &ids)) != MOE_OK) goto done;
    snprintf(path, sizeof path, "%s.weights.npy", prefix);
    if ((s = moe_npy_read(path, &w)) != MOE_OK) goto done;
    snprintf(path, sizeof path, "%s.tokens.npy", prefix);
    if ((s = moe_npy_read(path, &tok)) != MOE_OK) goto done;
    const int64_t N = ids.ndim == 3 ? ids.shape[0] : -1;
    if (ids.ndim != 3 || ids.shape[1] != d->Lm || ids.shape[2] != d->K ||
        (strcmp(ids.descr, "<i2") && strcmp(ids.descr, "<i4")) || w.ndim != 3 ||
        w.shape[0] != N || w.shape[1] != d->Lm || w.shape[2] != d->K || strcmp(w.descr, "<f4") ||
        tok.ndim != 2 || tok.shape[0] != N || tok.shape[1] != 4 || strcmp(tok.descr, "<i8")) {
        s = moe_fail(MOE_ERR_FORMAT, "%s: trace arrays do not match (tokens, %d layers, top-%d)",
                     prefix, d->Lm, d->K);
        goto done;
    }
    d->N = N;
    const size_t n = (size_t)N * d->Lm * d->K;
    d->ids = malloc((n ? n : 1) * sizeof(int32_t));
    if (!d->ids) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: trace ids", prefix);
        goto done;
    }
    json_t *declared = json_object_get(root, "tokens");
    if (declared && (!json_is_integer(declared) || json_integer_value(declared) != N)) {
        s = moe_fail(MOE_ERR_FORMAT, "%s.trace.json: \"tokens\" says %lld, but %s.ids.npy holds %lld tokens",
                     prefix, (long long)json_integer_value(declared), prefix, (long long)N);
        goto done;
    }
    size_t valid = 0;
    for (size_t i = 0; i < n; i++) {
        d->ids[i] = ids.elem == 2 ? ((int16_t *)ids.data)[i] : ((int32_t *)ids.data)[i];
        if (d->ids[i] < -1 || d->ids[i] >= d->E) { /* -1: a slot the recorder left empty */
            const size_t row = (size_t)d->Lm * (size_t)d->K;
            s = moe_fail(MOE_ERR_FORMAT, "%s.ids.npy: token %zu, MoE layer %zu, choice %zu: expert id %d "
                         "is outside [0, %d)", prefix, i / row, i % row / (size_t)d->K, i % (size_t)d->K,
                         d->ids[i], d->E);
            goto done;
        }
        valid += d->ids[i] >= 0;
    }
    if (n > 0 && valid == 0) {
        s = moe_fail(MOE_ERR_FORMAT, "%s.ids.npy: %lld tokens, but no expert id in any of them", prefix,
                     (long long)N);
        goto done;
    }
    d->w = w.data;
    d->meta = tok.data;
    w.data = tok.data = NULL;
    aggregate_trace(d);
done:
    moe_npy_free(&ids);
    moe_npy_free(&w);
    moe_npy_free(&tok);
    return s;
}

enum moe_status moe_sdata_load(struct moe_sdata *d, const char *path)
{
    memset(d, 0, sizeof *d);
    char buf[4096], prefix[4096];
    struct stat sb;
    size_t n = strlen(path);
    if (n + 6 > sizeof buf) return moe_fail(MOE_ERR_INVALID_ARG, "path too long");
    snprintf(buf, sizeof buf, "%s", path);
    if (stat(buf, &sb) != 0) {
        snprintf(buf, sizeof buf, "%s.trace.json", path); /* bare prefix */
        if (stat(buf, &sb) != 0)
            return moe_fail(MOE_ERR_IO, "%s: no such file (nor a trace %s.trace.json)", path, path);
    }
    d->path = strdup(path);
    if (!d->path) return moe_fail(MOE_ERR_NOMEM, "path");
    json_error_t err;
    json_t *root = json_load_file(buf, 0, &err);
    enum moe_status s;
    if (!root) {
        s = moe_fail(MOE_ERR_FORMAT, "%s: %s (line %d)", buf, err.text, err.line);
        goto fail;
    }
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (fmt && !strcmp(fmt, MOE_STATS_FORMAT)) {
        s = load_stats_json(d, root);
    } else if (fmt && !strcmp(fmt, MOE_TRACE_FORMAT)) {
        snprintf(prefix, sizeof prefix, "%s", buf);
        size_t pl = strlen(prefix);
        if (pl > 11 && !strcmp(prefix + pl - 11, ".trace.json")) prefix[pl - 11] = '\0';
        else if (pl > 5 && !strcmp(prefix + pl - 5, ".json")) prefix[pl - 5] = '\0';
        s = load_trace(d, root, prefix);
    } else {
        s = moe_fail(MOE_ERR_FORMAT, "%s: not moerun statistics or a routing trace (format '%s')",
                     buf, fmt ? fmt : "missing");
    }
    json_decref(root);
    if (s == MOE_OK) return MOE_OK;
fail:
    moe_sdata_free(d);
    return s;
}
