/* cli_expert_plan.c - --expert-dtype-plan FILE (--hot-share S): the
 * per-expert precision table the CPU backend quantizes by
 * (moe_backend_opts.expert_quant).
 *
 * FILE is either expert-load statistics or a routing trace (what
 * --stats-out / --trace-out write, read by moe_sdata_load), or an explicit
 * map.  From statistics, each MoE layer's experts are ranked by the
 * routed pairs they took (ties: the lower id first); the shortest run of
 * the most loaded whose pairs reach share S of the layer's is "hot" and
 * keeps the stored precision (q8_0 when --quantize is q8_0 or q4), the rest
 * take q4.  A layer the file saw no pairs for has no hot experts.  The map
 * names experts one by one:
 *
 *   {"expert_dtypes": {"LAYER": {"EXPERT": "q4" | "q8_0" | "stored", ...},
 *                      "LAYER": ["q4", "stored", ...], ...}}
 *
 * LAYER a model layer index, EXPERT an expert id; an expert it does not
 * name follows --quantize.  The backend refuses entries for experts or
 * layers the model does not have when it prepares the model. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli_common.h"
#include "runtime/stats/stats_analyze.h"

enum { PLAN_MAX_EXPERTS = 1 << 16 };

/* A non-negative decimal index below max, all of s. */
static bool index_of(const char *s, long max, long *out)
{
    char *end;
    if (!*s || *s == '-' || *s == '+') return false;
    const long v = strtol(s, &end, 10);
    if (*end || v < 0 || v >= max) return false;
    *out = v;
    return true;
}

static bool format_of(const char *s, uint8_t *out)
{
    if (!s) return false;
    if (!strcmp(s, "q4")) *out = MOE_QUANT_Q4;
    else if (!strcmp(s, "q8_0")) *out = MOE_QUANT_Q8_0;
    else if (!strcmp(s, "stored")) *out = MOE_QUANT_NONE;
    else return false;
    return true;
}

/* The experts a layer's entry names: an object of id -> format or an
 * array of formats; the largest id + 1 into *n. */
static enum moe_status layer_extent(json_t *v, const char *file, const char *layer, long *n)
{
    *n = 0;
    if (json_is_array(v)) {
        *n = (long)json_array_size(v);
        if (*n > PLAN_MAX_EXPERTS)
            return moe_fail(MOE_ERR_INVALID_ARG, "--expert-dtype-plan %s: layer %s lists %ld experts (at most "
                            "%d)", file, layer, *n, PLAN_MAX_EXPERTS);
        return MOE_OK;
    }
    if (!json_is_object(v))
        return moe_fail(MOE_ERR_INVALID_ARG, "--expert-dtype-plan %s: layer %s must map expert ids to formats "
                        "(an object) or list them (an array)", file, layer);
    const char *k;
    json_t *f;
    json_object_foreach(v, k, f) {
        long e;
        if (!index_of(k, PLAN_MAX_EXPERTS, &e))
            return moe_fail(MOE_ERR_INVALID_ARG, "--expert-dtype-plan %s: layer %s: '%s' is not an expert id",
                            file, layer, k);
        if (e + 1 > *n) *n = e + 1;
    }
    return MOE_OK;
}

static enum moe_status from_map(struct moe_backend_opts *o, json_t *map, const char *file, uint8_t **buf)
{
    if (!json_is_object(map) || json_object_size(map) == 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "--expert-dtype-plan %s: expert_dtypes must be an object of layers",
                        file);
    long L = 0, E = 0;
    const char *k;
    json_t *v;
    json_object_foreach(map, k, v) {
        long l, n;
        if (!index_of(k, MOE_MAX_LAYERS, &l))
            return moe_fail(MOE_ERR_INVALID_ARG, "--expert-dtype-plan %s: '%s' is not a layer index (0 to %d)",
                            file, k, MOE_MAX_LAYERS - 1);
        MOE_TRY(layer_extent(v, file, k, &n));
        if (l + 1 > L) L = l + 1;
        if (n > E) E = n;
    }
    if (E == 0) return moe_fail(MOE_ERR_INVALID_ARG, "--expert-dtype-plan %s: names no expert", file);
    uint8_t *p = malloc((size_t)L * (size_t)E);
    if (!p) return moe_fail(MOE_ERR_NOMEM, "--expert-dtype-plan %s", file);
    memset(p, MOE_EXPERT_QUANT_DEFAULT, (size_t)L * (size_t)E);
    json_object_foreach(map, k, v) {
        long l = 0; /* checked by the pass that sized the table */
        (void)index_of(k, MOE_MAX_LAYERS, &l);
        const size_t n = json_is_array(v) ? json_array_size(v) : 0;
        for (size_t i = 0; i < n; i++)
            if (!format_of(json_string_value(json_array_get(v, i)), &p[(size_t)l * E + i])) {
                free(p);
                return moe_fail(MOE_ERR_INVALID_ARG, "--expert-dtype-plan %s: layer %s, expert %zu: the format "
                                "must be \"q4\", \"q8_0\" or \"stored\"", file, k, i);
            }
        const char *ek;
        json_t *f;
        if (json_is_object(v))
            json_object_foreach(v, ek, f) {
                long e = 0;
                (void)index_of(ek, PLAN_MAX_EXPERTS, &e);
                if (!format_of(json_string_value(f), &p[(size_t)l * E + e])) {
                    free(p);
                    return moe_fail(MOE_ERR_INVALID_ARG, "--expert-dtype-plan %s: layer %s, expert %s: the "
                                    "format must be \"q4\", \"q8_0\" or \"stored\"", file, k, ek);
                }
            }
    }
    *buf = p;
    o->expert_quant = p;
    o->expert_quant_layers = (int)L;
    o->expert_quant_e = (int)E;
    return MOE_OK;
}

static int by_load(const void *a, const void *b, void *load)
{
    const double *ld = load;
    const int x = *(const int *)a, y = *(const int *)b;
    if (ld[x] != ld[y]) return ld[x] > ld[y] ? -1 : 1;
    return (x > y) - (x < y);
}

static enum moe_status from_stats(struct moe_backend_opts *o, const struct moe_sdata *d, double share,
                                  enum moe_weight_quant quant, uint8_t **buf)
{
    int L = 0;
    for (int i = 0; i < d->Lm; i++)
        if (d->layers[i] + 1 > L) L = d->layers[i] + 1;
    uint8_t *p = malloc((size_t)L * (size_t)d->E);
    int *order = malloc((size_t)d->E * sizeof *order);
    if (!p || !order) {
        free(p);
        free(order);
        return moe_fail(MOE_ERR_NOMEM, "--expert-dtype-plan: %d layers x %d experts", L, d->E);
    }
    memset(p, MOE_EXPERT_QUANT_DEFAULT, (size_t)L * (size_t)d->E);
    const uint8_t hot = quant == MOE_QUANT_NONE ? MOE_QUANT_NONE : MOE_QUANT_Q8_0;
    for (int i = 0; i < d->Lm; i++) {
        const double *load = d->load + (size_t)i * d->E;
        double total = 0;
        for (int e = 0; e < d->E; e++) {
            order[e] = e;
            total += load[e];
        }
        qsort_r(order, (size_t)d->E, sizeof *order, by_load, (void *)load);
        uint8_t *row = p + (size_t)d->layers[i] * d->E;
        double cum = 0;
        for (int r = 0; r < d->E; r++) {
            const int e = order[r];
            row[e] = total > 0 && cum < share * total ? hot : MOE_QUANT_Q4;
            cum += load[e];
        }
    }
    free(order);
    *buf = p;
    o->expert_quant = p;
    o->expert_quant_layers = L;
    o->expert_quant_e = d->E;
    return MOE_OK;
}

enum moe_status moe_cli_expert_plan(struct moe_backend_opts *o, const char *file, double hot_share,
                                    enum moe_weight_quant quant, uint8_t **buf)
{
    *buf = NULL;
    json_error_t err;
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &err);
    json_t *map = root ? json_object_get(root, "expert_dtypes") : NULL;
    if (map) {
        const enum moe_status s = from_map(o, map, file, buf);
        json_decref(root);
        return s;
    }
    json_decref(root);
    struct moe_sdata d;
    enum moe_status s = moe_sdata_load(&d, file);
    if (s != MOE_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", moe_last_error());
        return moe_fail(s, "--expert-dtype-plan: %s (expected statistics, a trace, or {\"expert_dtypes\": ...})",
                        why);
    }
    s = from_stats(o, &d, hot_share, quant, buf);
    moe_sdata_free(&d);
    return s;
}
