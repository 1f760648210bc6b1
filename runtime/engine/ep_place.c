/* ep_place.c - where the experts go (see ep.h): contiguous placement, a
 * placement read from JSON (per layer, with replicas), the pairs' slots,
 * the slot view of a layer's experts, and writing a balanced placement
 * from load statistics.
 *
 * A placement (docs/parallel.md):
 *   {"format": "moerun-ep-placement", "version": 1, "ranks": N,
 *    "experts": E, "source": "...",
 *    "layers": {"3": [[0, 1, 7], [2, 3, 7], ...], ...}}
 * each named layer a list of N lists: the experts of each rank, ascending,
 * each expert on at least one rank and at most once per rank, every rank
 * at least one.  Layers not named are contiguous. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/ep_impl.h"
#include "runtime/model/model.h"

static void layer_free(struct moe_ep_layer *pl)
{
    free(pl->expert);
    free(pl->bounds);
    free(pl->rep0);
    free(pl->n_rep);
    free(pl->rep);
    memset(pl, 0, sizeof *pl);
}

void moe_ep_unplace(struct moe_ep *ep)
{
    for (int l = 0; ep->layers && l < ep->n_layers; l++) layer_free(&ep->layers[l]);
    free(ep->layers);
    free(ep->placement_text);
    ep->layers = NULL;
    ep->placement_text = NULL;
    ep->n_layers = ep->n_experts = ep->max_slots = 0;
}

/* Layer pl from each rank's expert membership in[r * E + e] (1: holds). */
static enum moe_status layer_from(struct moe_ep_layer *pl, int size, int E, const uint8_t *in)
{
    int n = 0;
    for (int i = 0; i < size * E; i++) n += in[i] != 0;
    pl->n_slots = n;
    pl->expert = malloc((size_t)n * sizeof(int32_t));
    pl->bounds = malloc(((size_t)size + 1) * sizeof(int32_t));
    pl->rep0 = calloc((size_t)E, sizeof(int32_t));
    pl->n_rep = calloc((size_t)E, sizeof(int32_t));
    pl->rep = malloc((size_t)n * sizeof(int32_t));
    if (!pl->expert || !pl->bounds || !pl->rep0 || !pl->n_rep || !pl->rep)
        return moe_fail(MOE_ERR_NOMEM, "expert parallelism: a layer's slots");
    int k = 0;
    for (int r = 0; r < size; r++) {
        pl->bounds[r] = k;
        for (int e = 0; e < E; e++)
            if (in[(size_t)r * E + e]) {
                pl->expert[k++] = e;
                pl->n_rep[e]++;
            }
    }
    pl->bounds[size] = k;
    for (int e = 1; e < E; e++) pl->rep0[e] = pl->rep0[e - 1] + pl->n_rep[e - 1];
    int32_t *fill = calloc((size_t)E, sizeof(int32_t));
    if (!fill) return moe_fail(MOE_ERR_NOMEM, "expert parallelism: a layer's slots");
    for (int s = 0; s < n; s++) { /* slots ascend by rank: replicas too */
        const int e = pl->expert[s];
        pl->rep[pl->rep0[e] + fill[e]++] = s;
    }
    free(fill);
    return MOE_OK;
}

/* in (size, E): layer `name`'s lists from the placement's JSON value v. */
static enum moe_status parse_layer(const json_t *v, const char *name, int size, int E, uint8_t *in)
{
    if (!json_is_array(v) || (int)json_array_size(v) != size)
        return moe_fail(MOE_ERR_FORMAT, "placement: layer %s: a list of %d ranks' expert lists is expected", name,
                        size);
    memset(in, 0, (size_t)size * E);
    for (int r = 0; r < size; r++) {
        const json_t *list = json_array_get(v, (size_t)r), *x;
        size_t i;
        if (!json_is_array(list) || json_array_size(list) == 0)
            return moe_fail(MOE_ERR_FORMAT, "placement: layer %s, rank %d: a non-empty list of experts is "
                            "expected", name, r);
        json_array_foreach(list, i, x) {
            const json_int_t e = json_integer_value(x);
            if (!json_is_integer(x) || e < 0 || e >= E)
                return moe_fail(MOE_ERR_FORMAT, "placement: layer %s, rank %d, entry %zu: not an expert of 0..%d",
                                name, r, i, E - 1);
            if (in[(size_t)r * E + e])
                return moe_fail(MOE_ERR_FORMAT, "placement: layer %s, rank %d: expert %lld twice", name, r,
                                (long long)e);
            in[(size_t)r * E + e] = 1;
        }
    }
    for (int e = 0; e < E; e++) {
        int on = 0;
        for (int r = 0; r < size; r++) on += in[(size_t)r * E + e];
        if (!on) return moe_fail(MOE_ERR_FORMAT, "placement: layer %s: expert %d is on no rank", name, e);
    }
    return MOE_OK;
}

/* The placement's header and its "layers" object. */
static enum moe_status parse_header(const json_t *j, int size, int E, int n_layers, const bool *is_moe,
                                    const json_t **layers)
{
    const char *fmt = json_string_value(json_object_get(j, "format"));
    if (!json_is_object(j) || !fmt || strcmp(fmt, "moerun-ep-placement"))
        return moe_fail(MOE_ERR_FORMAT, "placement: not a moerun expert placement (\"format\": "
                        "\"moerun-ep-placement\")");
    if (json_integer_value(json_object_get(j, "version")) != 1)
        return moe_fail(MOE_ERR_FORMAT, "placement: version %lld (1 is read)",
                        (long long)json_integer_value(json_object_get(j, "version")));
    const json_int_t ranks = json_integer_value(json_object_get(j, "ranks")),
                     experts = json_integer_value(json_object_get(j, "experts"));
    if (ranks != size)
        return moe_fail(MOE_ERR_INVALID_ARG, "placement: for %lld ranks, the launch has %d", (long long)ranks, size);
    if (experts != E)
        return moe_fail(MOE_ERR_INVALID_ARG, "placement: for %lld experts per layer, the model has %d",
                        (long long)experts, E);
    *layers = json_object_get(j, "layers");
    if (!json_is_object(*layers)) return moe_fail(MOE_ERR_FORMAT, "placement: \"layers\" must be an object");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)*layers, key, v) {
        char *end;
        const long l = strtol(key, &end, 10);
        if (!*key || *end || l < 0 || l >= n_layers || !is_moe[l])
            return moe_fail(MOE_ERR_FORMAT, "placement: layer \"%s\" is not a MoE layer of the model (0..%d)", key,
                            n_layers - 1);
    }
    return MOE_OK;
}

enum moe_status moe_ep_place(struct moe_ep *ep, int n_layers, const bool *is_moe, int n_experts,
                             const char *placement)
{
    const int size = ep->size, E = n_experts;
    if (ep->layers) {
        const bool same = ep->n_layers == n_layers && ep->n_experts == E &&
                          !placement == !ep->placement_text &&
                          (!placement || !strcmp(placement, ep->placement_text));
        if (same) return MOE_OK;
        return moe_fail(MOE_ERR_UNSUPPORTED, "expert parallelism: a second model (%d layers, %d experts) beside "
                        "one of %d layers and %d experts, or another placement (one expert-parallel model per "
                        "job)", n_layers, E, ep->n_layers, ep->n_experts);
    }
    if (E <= 0) return moe_fail(MOE_ERR_UNSUPPORTED, "expert parallelism: the model has no experts");
    json_error_t err;
    json_t *j = NULL;
    const json_t *named = NULL;
    if (placement) {
        if (!(j = json_loads(placement, 0, &err)))
            return moe_fail(MOE_ERR_FORMAT, "placement: line %d: %s", err.line, err.text);
        enum moe_status s = parse_header(j, size, E, n_layers, is_moe, &named);
        if (s != MOE_OK) {
            json_decref(j);
            return s;
        }
    }
    bool contiguous = false;
    for (int l = 0; l < n_layers; l++) {
        char key[16];
        snprintf(key, sizeof key, "%d", l);
        contiguous |= is_moe[l] && !json_object_get(named, key);
    }
    const int G = ep->groups > 0 ? ep->groups : size, per = size / G; /* shards, ranks per shard */
    if (contiguous && E % G) {
        json_decref(j);
        if (G < size)
            return moe_fail(MOE_ERR_UNSUPPORTED, "expert parallelism: %d experts per layer do not split evenly "
                            "over %d shards of %d ranks (contiguous placement needs a multiple)", E, G, per);
        return moe_fail(MOE_ERR_UNSUPPORTED, "expert parallelism: %d experts per layer do not split evenly over "
                        "%d ranks (contiguous placement needs a multiple; a placement file can say otherwise)", E,
                        size);
    }
    ep->layers = calloc((size_t)n_layers, sizeof *ep->layers);
    ep->bounds = malloc(((size_t)size + 1) * sizeof(int32_t));
    ep->counts = malloc(2 * (size_t)size * sizeof(int32_t));
    ep->rows_rank = calloc((size_t)size, sizeof(uint64_t));
    ep->open_kib = calloc((size_t)size, sizeof(int64_t));
    uint8_t *in = malloc((size_t)size * E);
    ep->n_layers = n_layers;
    ep->n_experts = E;
    enum moe_status s = MOE_OK;
    if (!ep->layers || !ep->bounds || !ep->counts || !ep->rows_rank || !ep->open_kib || !in ||
        (placement && !(ep->placement_text = strdup(placement))))
        s = moe_fail(MOE_ERR_NOMEM, "expert parallelism: rank tables");
    if (s == MOE_OK) {
        ep->displs = ep->counts + size;
        /* rank r's shard's first expert (its own range when a shard is one rank) */
        for (int r = 0; r < size; r++) ep->bounds[r] = (int32_t)((int64_t)E * (r / per) / G);
        ep->bounds[size] = E;
        ep->placement = named && json_object_size(named) > 0 ? "file" : per > 1 ? "shards" : "contiguous";
    }
    for (int l = 0; l < n_layers && s == MOE_OK; l++) {
        if (!is_moe[l]) continue;
        char key[16];
        snprintf(key, sizeof key, "%d", l);
        const json_t *v = json_object_get(named, key);
        if (v) {
            s = parse_layer(v, key, size, E, in);
        } else {
            memset(in, 0, (size_t)size * E);
            for (int r = 0; r < size; r++)
                for (int e = ep->bounds[r]; e < (int)((int64_t)E * (r / per + 1) / G); e++) in[(size_t)r * E + e] = 1;
        }
        if (s == MOE_OK) s = layer_from(&ep->layers[l], size, E, in);
        if (s == MOE_OK && ep->layers[l].n_slots > ep->max_slots) ep->max_slots = ep->layers[l].n_slots;
    }
    free(in);
    json_decref(j);
    if (s != MOE_OK) {
        moe_ep_unplace(ep);
        free(ep->bounds), free(ep->counts), free(ep->rows_rank), free(ep->open_kib);
        ep->bounds = ep->counts = ep->displs = NULL;
        ep->rows_rank = NULL;
        ep->open_kib = NULL;
    }
    return s;
}

bool moe_ep_holds(const struct moe_ep *ep, int l, int e)
{
    const struct moe_ep_layer *pl = &ep->layers[l];
    if (pl->n_slots == 0) return true;
    for (int i = 0; i < pl->n_rep[e]; i++) {
        const int s = pl->rep[pl->rep0[e] + i];
        if (s >= pl->bounds[ep->rank] && s < pl->bounds[ep->rank + 1]) return true;
    }
    return false;
}

enum moe_status moe_ep_held(const struct moe_ep *ep, uint8_t **held)
{
    const int L = ep->n_layers, E = ep->n_experts;
    if (!(*held = malloc((size_t)L * E))) return moe_fail(MOE_ERR_NOMEM, "expert parallelism: the held experts");
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) (*held)[(size_t)l * E + e] = moe_ep_holds(ep, l, e);
    return MOE_OK;
}

void moe_ep_slot_ids(const struct moe_ep *ep, int l, const int32_t *ids, int T, int K, const int32_t *pos,
                     int32_t *slots)
{
    const struct moe_ep_layer *pl = &ep->layers[l];
    const int E = ep->n_experts;
    for (int i = 0; i < T * K; i++) {
        const int e = ids[i] >= 0 && ids[i] < E ? ids[i] : 0; /* the router's ids are in 0..E-1 */
        const int R = pl->n_rep[e];
        /* a replicated expert: by the row's position, so that consecutive
         * rows (a prefill) and consecutive steps (a decode) take turns */
        const int r = R < 2 ? 0 : (int)(((int64_t)pos[i / K] + e) % R);
        slots[i] = pl->rep[pl->rep0[e] + (r < 0 ? r + R : r)];
    }
}

/* A bias table (E, W) F32 repeated per slot (n, W), or absent. */
static enum moe_status bias_view(const struct moe_tensor *b, const int32_t *expert, int n, struct moe_tensor *out)
{
    *out = *b;
    if (!b->data) return MOE_OK;
    const size_t W = (size_t)b->shape[1];
    float *p = malloc((size_t)n * W * sizeof(float));
    if (!p) return moe_fail(MOE_ERR_NOMEM, "expert parallelism: slot biases");
    for (int s = 0; s < n; s++) memcpy(p + (size_t)s * W, (const float *)b->data + (size_t)expert[s] * W, W * sizeof(float));
    out->data = p;
    out->shape[0] = n;
    return MOE_OK;
}

enum moe_status moe_ep_slot_view(const struct moe_ep *ep, int l, const struct moe_expert_weights *x,
                                 struct moe_expert_weights *out)
{
    const struct moe_ep_layer *pl = &ep->layers[l];
    const int n = pl->n_slots;
    *out = *x;
    out->gate = calloc((size_t)n, sizeof *out->gate);
    out->up = calloc((size_t)n, sizeof *out->up);
    out->down = calloc((size_t)n, sizeof *out->down);
    out->dtypes = out->down_dtypes = NULL;
    out->cols = NULL;
    out->b_gate.data = out->b_up.data = out->b_down.data = NULL;
    enum moe_dtype *dt = x->dtypes ? malloc((size_t)n * sizeof *dt) : NULL;
    enum moe_dtype *ddt = x->down_dtypes ? malloc((size_t)n * sizeof *ddt) : NULL;
    const int32_t **cols = x->cols ? calloc(2 * (size_t)n, sizeof *cols) : NULL;
    out->dtypes = dt;
    out->down_dtypes = ddt;
    out->cols = cols;
    if (!out->gate || !out->up || !out->down || (x->dtypes && !dt) || (x->down_dtypes && !ddt) ||
        (x->cols && !cols)) {
        moe_ep_slot_view_free(out);
        return moe_fail(MOE_ERR_NOMEM, "expert parallelism: a slot view");
    }
    for (int s = 0; s < n; s++) {
        const int e = pl->expert[s];
        out->gate[s] = x->gate[e];
        out->up[s] = x->up[e];
        out->down[s] = x->down[e];
        if (dt) dt[s] = x->dtypes[e];
        if (ddt) ddt[s] = x->down_dtypes[e];
        if (cols) cols[2 * s] = x->cols[2 * e], cols[2 * s + 1] = x->cols[2 * e + 1];
    }
    enum moe_status st = bias_view(&x->b_gate, pl->expert, n, &out->b_gate);
    if (st == MOE_OK) st = bias_view(&x->b_up, pl->expert, n, &out->b_up);
    if (st == MOE_OK) st = bias_view(&x->b_down, pl->expert, n, &out->b_down);
    if (st != MOE_OK) moe_ep_slot_view_free(out);
    return st;
}

void moe_ep_slot_view_free(struct moe_expert_weights *v)
{
    free(v->gate);
    free(v->up);
    free(v->down);
    free((void *)v->dtypes);
    free((void *)v->down_dtypes);
    free(v->cols);
    free(v->b_gate.data);
    free(v->b_up.data);
    free(v->b_down.data);
    memset(v, 0, sizeof *v);
}

/* ---- writing a placement from load statistics ---- */

struct item {
    int e;
    double load;
};

static int item_desc(const void *a, const void *b)
{
    const struct item *x = a, *y = b;
    return x->load < y->load ? 1 : x->load > y->load ? -1 : x->e - y->e;
}

/* One layer: replicas, then slots packed longest-first onto the rank with
 * the least load that has room and lacks the expert; in (size, E) filled;
 * returns max / mean rank load. */
static double place_layer(int size, int E, const double *given, int R, uint8_t *in, int *nrep, struct item *it,
                          double *rank_load, int *rank_n, double *load)
{
    for (int e = 0; e < E; e++) { /* a count that is not a finite non-negative number counts as none */
        nrep[e] = 1;
        load[e] = isfinite(given[e]) && given[e] > 0 ? given[e] : 0;
    }
    for (int k = 0; k < R; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (nrep[e] < size && (best < 0 || load[e] / nrep[e] > load[best] / nrep[best])) best = e;
        if (best < 0) break;
        nrep[best]++;
    }
    int n = 0;
    for (int e = 0; e < E; e++)
        for (int k = 0; k < nrep[e]; k++) it[n++] = (struct item){e, load[e] / nrep[e]};
    qsort(it, (size_t)n, sizeof *it, item_desc);
    const int cap = (n + size - 1) / size;
    memset(in, 0, (size_t)size * E);
    for (int r = 0; r < size; r++) rank_load[r] = 0, rank_n[r] = 0;
    /* longest first, each to the rank of least load (then fewest slots:
     * an empty rank always wins a tie, so every rank gets one) with room
     * that does not hold the expert yet */
    for (int i = 0; i < n; i++) {
        int best = -1;
        for (int r = 0; r < size; r++) {
            if (rank_n[r] >= cap || in[(size_t)r * E + it[i].e]) continue;
            if (best < 0 || rank_load[r] < rank_load[best] ||
                (rank_load[r] == rank_load[best] && rank_n[r] < rank_n[best]))
                best = r;
        }
        if (best < 0) continue; /* every rank with room holds it: the replica is dropped */
        in[(size_t)best * E + it[i].e] = 1;
        rank_load[best] += it[i].load;
        rank_n[best]++;
    }
    double most = 0, all = 0;
    for (int r = 0; r < size; r++) most = rank_load[r] > most ? rank_load[r] : most, all += rank_load[r];
    return all > 0 ? most * size / all : 1.0;
}

enum moe_status moe_ep_placement_write(int size, int n_layers, const int32_t *layer, int E, const double *load, int R,
                                       const char *source, char **text, double *ratio)
{
    *text = NULL;
    *ratio = 0;
    if (size < 2 || E < size)
        return moe_fail(MOE_ERR_INVALID_ARG, "placement: %d ranks for %d experts (2 to E ranks)", size, E);
    if (R < 0 || (int64_t)R > (int64_t)E * (size - 1))
        return moe_fail(MOE_ERR_INVALID_ARG, "placement: %d replicas per layer (0 to %lld with %d experts on %d "
                        "ranks)", R, (long long)E * (size - 1), E, size);
    uint8_t *in = malloc((size_t)size * E);
    int *nrep = malloc((size_t)E * sizeof *nrep), *rank_n = malloc((size_t)size * sizeof *rank_n);
    struct item *it = malloc(((size_t)E + R) * sizeof *it);
    double *rank_load = malloc((size_t)size * sizeof *rank_load), *clean = malloc((size_t)E * sizeof *clean);
    json_t *j = json_pack("{s:s, s:i, s:i, s:i, s:s, s:i, s:{}}", "format", "moerun-ep-placement", "version", 1,
                          "ranks", size, "experts", E, "source", source ? source : "", "replicas", R, "layers");
    enum moe_status st = in && nrep && rank_n && it && rank_load && clean && j ? MOE_OK
                       : moe_fail(MOE_ERR_NOMEM, "placement: tables");
    json_t *layers = json_object_get(j, "layers");
    double sum = 0;
    for (int k = 0; k < n_layers && st == MOE_OK; k++) {
        sum += place_layer(size, E, load + (size_t)k * E, R, in, nrep, it, rank_load, rank_n, clean);
        json_t *ranks = json_array();
        for (int r = 0; r < size && ranks; r++) {
            json_t *list = json_array();
            for (int e = 0; e < E && list; e++)
                if (in[(size_t)r * E + e]) json_array_append_new(list, json_integer(e));
            json_array_append_new(ranks, list);
        }
        char key[16];
        snprintf(key, sizeof key, "%d", layer[k]);
        if (!ranks || json_object_set_new(layers, key, ranks)) st = moe_fail(MOE_ERR_NOMEM, "placement: JSON");
    }
    if (st == MOE_OK && !(*text = json_dumps(j, JSON_INDENT(1) | JSON_COMPACT)))
        st = moe_fail(MOE_ERR_NOMEM, "placement: JSON");
    *ratio = n_layers > 0 ? sum / n_layers : 1.0;
    json_decref(j);
    free(in), free(nrep), free(rank_n), free(it), free(rank_load), free(clean);
    return st;
}
