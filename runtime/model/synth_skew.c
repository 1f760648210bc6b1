/* synth_skew.c - router skew with a known ground truth (see synth_skew.h).
 *
 * Adding a bias direction to the router rows does not give a known amount:
 * the hidden state's projection on any direction varies from token to token,
 * so the offset is only right "on average" and the resulting selection
 * probabilities depend on the rest of the model.  Instead the construction
 * makes each token's routing an exact Gumbel-top-K draw:
 *
 * 1. Code channels.  MoE layer ordinal j uses code block b = j mod nb, nb =
 *    floor(D/2 / E) blocks of E hidden dimensions at the top of the hidden
 *    vector (block b: dims D-(b+1)E .. D-bE-1).  Layers share a block (and
 *    its probabilities) only when L_moe > nb.
 * 2. The embedding row of token v holds, in block b, the code
 *    c[v,b,e] = beta * (log p_b[e] - mean_e log p_b + G[v,b,e] - gamma),
 *    G iid standard Gumbel from a hash of (seed, v, b, e), gamma Euler's
 *    constant (centering only), beta = initializer_range / 2.
 * 3. Nothing writes into code dimensions: the rows of o_proj, of every
 *    expert's and the shared expert's down projection, of the dense FFN's down
 *    projection (and their biases) are zero there, so the residual stream
 *    keeps the embedding's code exactly at every layer.
 * 4. Router row e of a layer on block b is 1 at dim base_b + e, 0 elsewhere.
 *    RMSNorm scales the row by a positive per-token factor, so the router
 *    logits are that factor times c[v,b,:]: their order is the order of
 *    log p_b[e] + G[v,b,e].
 *
 * By the Gumbel-max trick the top-1 expert of token v is distributed exactly
 * as p_b, independently across token ids, and the top-K set is a
 * Plackett-Luce draw (sampling without replacement by p_b).  Routing depends
 * on the token id only.  p_b comes from the spec over ranks; expert
 * perm_b[r] holds rank r, perm_b a seeded shuffle per block.  With bf16 or
 * f16 weights the codes are rounded, which can swap near-equal codes; tests
 * use f32. */
#include "runtime/model/synth_skew.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/synth.h"

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unit(uint64_t h) { return ((double)(h >> 11) + 0.5) * 0x1.0p-53; } /* (0, 1) */

enum moe_status moe_router_skew_parse(const char *spec, struct moe_router_skew *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->spec, sizeof out->spec, "%s", spec);
    char *end;
    if (!strcmp(spec, "none")) return MOE_OK;
    if (!strncmp(spec, "zipf:", 5)) {
        out->kind = MOE_SKEW_ZIPF;
        out->s = strtod(spec + 5, &end);
        if (end != spec + 5 && !*end && out->s >= 0 && out->s <= 16) return MOE_OK;
    } else if (!strncmp(spec, "hot:", 4)) {
        out->kind = MOE_SKEW_HOT;
        long h = strtol(spec + 4, &end, 10);
        if (end != spec + 4 && *end == ':' && h >= 1 && h < 1 << 20) {
            out->hot = (int)h;
            const char *f = end + 1;
            out->frac = strtod(f, &end);
            if (end != f && !*end && out->frac > 0 && out->frac < 1) return MOE_OK;
        }
    }
    return moe_fail(MOE_ERR_INVALID_ARG, "router skew '%s': use zipf:S (S >= 0), hot:H:F "
                    "(H hot experts take a fraction 0 < F < 1 of the top-1 choices) or none", spec);
}

static int n_blocks(const struct moe_config *c)
{
    return c->n_experts > 0 ? c->d_model / 2 / c->n_experts : 0;
}

enum moe_status moe_router_skew_probs(const struct moe_router_skew *sk, const struct moe_config *c,
                                      uint64_t seed, int j, double *p)
{
    const int E = c->n_experts, nb = n_blocks(c);
    if (E <= 0 || nb < 1)
        return moe_fail(MOE_ERR_UNSUPPORTED, "router skew needs E <= D/2 (E = %d, D = %d)", E,
                        c->d_model);
    if (sk->kind == MOE_SKEW_HOT && sk->hot >= E)
        return moe_fail(MOE_ERR_INVALID_ARG, "router skew %s: %d hot experts of %d", sk->spec,
                        sk->hot, E);
    const int b = j % nb;
    double *byrank = malloc((size_t)E * sizeof(double));
    int *perm = malloc((size_t)E * sizeof(int));
    if (!byrank || !perm) {
        free(byrank);
        free(perm);
        return moe_fail(MOE_ERR_NOMEM, "router skew");
    }
    double z = 0;
    for (int r = 0; r < E; r++) {
        byrank[r] = sk->kind == MOE_SKEW_ZIPF  ? pow(r + 1.0, -sk->s)
                    : sk->kind == MOE_SKEW_HOT ? (r < sk->hot ? sk->frac / sk->hot
                                                              : (1 - sk->frac) / (E - sk->hot))
                                               : 1.0;
        z += byrank[r];
        perm[r] = r;
    }
    uint64_t h = mix64(seed ^ 0x5ce3ull) ^ mix64(0xb10c0000ull + (uint64_t)b);
    for (int r = E - 1; r > 0; r--) { /* Fisher-Yates */
        h = mix64(h + 0x9e3779b97f4a7c15ull);
        int k = (int)(h % (uint64_t)(r + 1)), t = perm[r];
        perm[r] = perm[k];
        perm[k] = t;
    }
    for (int r = 0; r < E; r++) p[perm[r]] = byrank[r] / z;
    free(byrank);
    free(perm);
    return MOE_OK;
}

/* In-memory tensor of the set by name, writable (the set owns its buffer). */
static enum moe_status find(struct moe_safetensors *st, const char *name, struct moe_st_tensor **t)
{
    *t = (struct moe_st_tensor *)moe_safetensors_find(st, name);
    if (!*t || (*t)->file != -1)
        return moe_fail(MOE_ERR_INVALID_ARG, "router skew: no in-memory tensor %s", name);
    return MOE_OK;
}

static void set(struct moe_st_tensor *t, size_t i, float v)
{
    size_t es = moe_dtype_size(t->dtype);
    moe_convert_from_f32((char *)(uintptr_t)t->data + i * es, &v, t->dtype, 1);
}

/* Zeroes rows lo..D-1 of a row-major (rows, cols) matrix, `mats` of them
 * (keep: those with keep[m], or NULL: all). */
static void zero_rows(struct moe_st_tensor *t, int64_t mats, int64_t rows, int64_t cols, int64_t lo,
                      const uint8_t *keep)
{
    for (int64_t m = 0; m < mats; m++)
        for (int64_t r = lo; r < rows && (!keep || keep[m]); r++)
            for (int64_t c = 0; c < cols; c++) set(t, (size_t)((m * rows + r) * cols + c), 0.0f);
}

static enum moe_status zero_out(struct moe_safetensors *st, const char *name, int64_t mats,
                                int64_t rows, int64_t cols, int64_t lo, bool optional, const uint8_t *keep)
{
    if (optional && !moe_safetensors_find(st, name)) return MOE_OK;
    struct moe_st_tensor *t;
    MOE_TRY(find(st, name, &t));
    zero_rows(t, mats, rows, cols, lo, keep);
    return MOE_OK;
}

enum moe_status moe_synth_apply_skew(struct moe_safetensors *st, const struct moe_config *c,
                                     const struct moe_router_skew *sk, uint64_t seed, const uint8_t *held)
{
    if (sk->kind == MOE_SKEW_NONE) return MOE_OK;
    const int E = c->n_experts, nb = n_blocks(c), Lm = moe_config_moe_layers(c);
    const int64_t D = c->d_model, V = c->vocab, Q = (int64_t)c->n_heads * c->head_dim;
    if (Lm == 0) return moe_fail(MOE_ERR_INVALID_ARG, "router skew: the model has no MoE layer");
    if (nb == 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "router skew: hidden_size %lld is less than twice num_experts %d "
                        "(the skew writes each layer's expert codes in a block of the hidden state)", (long long)D, E);
    const int used = Lm < nb ? Lm : nb;
    const int64_t lo = D - (int64_t)used * E; /* first code dimension */
    const double beta = (c->init_std > 0 ? c->init_std : 0.02) / 2, gamma = 0.5772156649015329;
    double *p = malloc((size_t)E * sizeof(double)), *lp = malloc((size_t)E * sizeof(double));
    enum moe_status s = MOE_OK;
    struct moe_st_tensor *emb, *t;
    char name[256];
    if (!p || !lp) {
        s = moe_fail(MOE_ERR_NOMEM, "router skew");
        goto done;
    }
    if ((s = find(st, "model.embed_tokens.weight", &emb)) != MOE_OK) goto done;
    for (int b = 0; b < used; b++) {
        if ((s = moe_router_skew_probs(sk, c, seed, b, p)) != MOE_OK) goto done;
        double mean = 0;
        for (int e = 0; e < E; e++) mean += (lp[e] = log(p[e])) / E;
        const int64_t base = D - (int64_t)(b + 1) * E;
        for (int64_t v = 0; v < V; v++)
            for (int e = 0; e < E; e++) {
                uint64_t h = mix64(mix64(seed ^ 0x6a3b1ull) ^ mix64(((uint64_t)v << 20) ^
                                   ((uint64_t)b << 12) ^ (uint64_t)e));
                double g = -log(-log(unit(h)));
                set(emb, (size_t)(v * D + base + e), (float)(beta * (lp[e] - mean + g - gamma)));
            }
    }
    for (int l = 0, j = 0; l < c->n_layers; l++) {
        const char *pre = "model.layers";
        snprintf(name, sizeof name, "%s.%d.self_attn.o_proj.weight", pre, l);
        if ((s = zero_out(st, name, 1, D, Q, lo, false, NULL)) != MOE_OK) goto done;
        snprintf(name, sizeof name, "%s.%d.self_attn.o_proj.bias", pre, l);
        if ((s = zero_out(st, name, 1, D, 1, lo, true, NULL)) != MOE_OK) goto done;
        if (!c->layer_moe[l]) {
            snprintf(name, sizeof name, "%s.%d.mlp.down_proj.weight", pre, l);
            if ((s = zero_out(st, name, 1, D, c->d_ff, lo, false, NULL)) != MOE_OK) goto done;
            snprintf(name, sizeof name, "%s.%d.mlp.down_proj.bias", pre, l);
            if ((s = zero_out(st, name, 1, D, 1, lo, true, NULL)) != MOE_OK) goto done;
            continue;
        }
        snprintf(name, sizeof name, "%s.%d.mlp.experts.down_proj", pre, l);
        if ((s = zero_out(st, name, E, D, c->d_expert, lo, false, held ? held + (size_t)l * E : NULL)) != MOE_OK)
            goto done;
        snprintf(name, sizeof name, "%s.%d.mlp.shared_expert.down_proj.weight", pre, l);
        if ((s = zero_out(st, name, 1, D, c->d_shared, lo, true, NULL)) != MOE_OK) goto done;
        snprintf(name, sizeof name, "%s.%d.mlp.gate.weight", pre, l);
        if ((s = find(st, name, &t)) != MOE_OK) goto done;
        const int64_t base = D - (int64_t)(j % nb + 1) * E;
        for (int e = 0; e < E; e++)
            for (int64_t d = 0; d < D; d++) set(t, (size_t)(e * D + d), d == base + e ? 1.0f : 0.0f);
        j++;
    }
done:
    free(p);
    free(lp);
    return s;
}

enum moe_status moe_model_synthetic_skew(struct moe_model *m, const struct moe_config *cfg,
                                         enum moe_dtype dtype, uint64_t seed,
                                         const struct moe_router_skew *sk)
{
    const struct moe_synth_part o = {.skew = sk};
    return moe_model_synthetic_part(m, cfg, dtype, seed, &o);
}

json_t *moe_router_skew_json(const struct moe_router_skew *sk, const struct moe_config *c,
                             uint64_t seed)
{
    json_t *layers = json_array();
    double *p = malloc((size_t)(c->n_experts > 0 ? c->n_experts : 1) * sizeof(double));
    const int Lm = moe_config_moe_layers(c);
    for (int j = 0; p && j < Lm; j++) {
        if (moe_router_skew_probs(sk, c, seed, j, p) != MOE_OK) break;
        json_t *a = json_array();
        for (int e = 0; e < c->n_experts; e++) json_array_append_new(a, json_real(p[e]));
        json_array_append_new(layers, a);
    }
    free(p);
    return json_pack("{s:s, s:I, s:o}", "spec", sk->spec, "seed", (json_int_t)seed,
                     "top1_probability", layers);
}
