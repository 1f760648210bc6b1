/* backend_ops_moe.h - the runners of routing, dispatch and the experts, of
 * the gathers and argmax, and of the entries cpu-ref does not have
 * (synth_fill, expert_load, to_host_async). */
#pragma once

#include "tests/backend_ops_dense.h"

#include "router/router.h"
#include "runtime/core/argmax.h"
#include "runtime/model/synth.h"

/* ---- route, dispatch, experts ---- */

/* Router logits (T, E) in [-4, 4) with three-way ties, a NaN, +inf and
 * -inf in some rows (the cases the policy pins; rows with +inf give NaN
 * softmax weights on every backend). */
static float *router_logits(int T, int E, uint64_t seed)
{
    float *lg = rand_floats((size_t)T * E, seed, -4, 4);
    for (int t = 0; t < T; t++) {
        float *r = lg + (size_t)t * E;
        if (t % 3 == 0) r[E - 1] = r[0] = r[E / 2] = 3.0f;
        if (t % 4 == 1) r[1] = NAN;
        if (t % 5 == 2) r[E - 2] = INFINITY;
        if (t % 7 == 3) r[2] = -INFINITY;
    }
    return lg;
}

static bool run_route(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const int T = c->T, E = c->E, K = c->K;
    const size_t TK = (size_t)T * K;
    float *lg = router_logits(T, E, 91 + T * E), *bias = rand_floats((size_t)E, 92 + E, -0.5f, 0.5f);
    bias[0] = bias[E / 2] = bias[E - 1] = 0.25f; /* equal choice scores too */
    int32_t *ids[2] = {malloc(TK * 4), malloc(TK * 4)};
    float *w[2] = {malloc(TK * 4), malloc(TK * 4)};
    for (int i = 0; i < 2; i++) {
        const bool sig = c->flags & SIGMOID;
        const struct moe_route r = {E, K, (c->flags & RENORM) != 0, sig,
                                    sig ? side_put(sd[i], bias, (size_t)E * 4) : NULL,
                                    c->groups ? c->groups : 1, c->topk_groups ? c->topk_groups : 1,
                                    c->scale != 0 ? c->scale : 1.0f, false};
        int32_t *di = side_put(sd[i], NULL, TK * 4);
        float *dw = side_put(sd[i], NULL, TK * 4);
        cr_assert_eq(sd[i]->be.ops->route(&sd[i]->be, di, dw, side_put(sd[i], lg, (size_t)T * E * 4), T, &r), MOE_OK,
                     "%s", moe_last_error());
        side_get(sd[i], ids[i], di, TK * 4);
        side_get(sd[i], w[i], dw, TK * 4);
    }
    char shp[64];
    shape_of(shp, sizeof shp, "T%d E%d K%d G%d/%d x%.2g%s%s", T, E, K, c->groups ? c->groups : 1,
             c->topk_groups ? c->topk_groups : 1, c->scale != 0 ? c->scale : 1.0, c->flags & SIGMOID ? " sigmoid+b" : "",
             c->flags & RENORM ? " renorm" : "");
    bool ok = report_same_ints(tg, "route ids", shp, ids[1], ids[0], TK);
    ok &= report_close(tg, "route w", "F32", shp, w[1], w[0], TK, pointwise_tol(tg));
    free(lg), free(bias), free(ids[0]), free(ids[1]), free(w[0]), free(w[1]);
    return ok;
}

/* ids (T, K): K distinct experts per row drawn from [0, E - 1) (expert
 * E - 1 never routed to), expert 0 in slot 0 of every row with HOT. */
static int32_t *routing(const struct op_case *c, uint64_t seed)
{
    int32_t *ids = malloc((size_t)c->T * c->K * 4);
    uint64_t s = seed;
    tu_random_routing(ids, c->T, c->K, c->E - 1, c->flags & HOT ? 0 : -1, &s);
    return ids;
}

/* The plan's four arrays in one buffer: counts (E), offsets (E+1), perm,
 * pos (T*K each). */
static struct moe_dispatch plan_in(int32_t *buf, int T, int K, int E)
{
    const size_t TK = (size_t)T * K;
    return (struct moe_dispatch){buf, buf + E, buf + 2 * (size_t)E + 1, buf + 2 * (size_t)E + 1 + TK, 0, 0, 0};
}

static bool run_dispatch(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const size_t TK = (size_t)c->T * c->K, n = 2 * (size_t)c->E + 1 + 2 * TK;
    int32_t *ids = routing(c, 101 + TK);
    int32_t *plan[2] = {malloc(n * 4), malloc(n * 4)};
    for (int i = 0; i < 2; i++) {
        int32_t *d = side_put(sd[i], NULL, n * 4);
        struct moe_dispatch p = plan_in(d, c->T, c->K, c->E);
        cr_assert_eq(sd[i]->be.ops->dispatch(&sd[i]->be, &p, side_put(sd[i], ids, TK * 4), c->T, c->K, c->E), MOE_OK,
                     "%s", moe_last_error());
        side_get(sd[i], plan[i], d, n * 4);
    }
    char shp[64];
    shape_of(shp, sizeof shp, "T%d E%d K%d%s", c->T, c->E, c->K, c->flags & HOT ? " hot" : "");
    bool ok = report_same_ints(tg, "dispatch", shp, plan[1], plan[0], n);
    free(ids), free(plan[0]), free(plan[1]);
    return ok;
}

/* out (T, D) = the combine of K of E experts (gate, up (F, D), down (D, F)
 * of dtype dt) over x (T, D), one plan and one set of weights on both
 * sides; expert E - 1 gets no rows. */
static bool run_experts(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const int T = c->T, K = c->K, E = c->E, D = c->D, F = c->F;
    const size_t TK = (size_t)T * K, nb = 2 * (size_t)E + 1 + 2 * TK;
    const uint64_t seed = 111 + (uint64_t)T * E + D + F;
    void *gu = random_rows(c->dt, 2 * (size_t)E * F, (size_t)D, seed, 2.0f / sqrtf((float)D));
    void *dn = random_rows(c->dt, (size_t)E * D, (size_t)F, seed + 1, 2.0f / sqrtf((float)F));
    float *bias = c->flags & GPT_OSS ? rand_floats((size_t)E * (2 * F + D), seed + 2, -0.3f, 0.3f) : NULL;
    const struct host_experts hx = {c->dt, E, D, F, gu, dn, bias, bias ? 1.702f : 0.0f, bias ? 1.0f : 0.0f};
    int32_t *ids = routing(c, seed + 3), *plan = malloc(nb * 4);
    float *w = rand_floats(TK, seed + 4, 0.1f, 1.0f), *x = rand_floats((size_t)T * D, seed + 5, -1, 1);
    struct moe_dispatch hp = plan_in(plan, T, K, E);
    moe_router_dispatch_cpu(&hp, ids, T, K, E);
    float *out[2] = {malloc((size_t)T * D * 4), malloc((size_t)T * D * 4)};
    for (int i = 0; i < 2; i++) {
        struct side *s = sd[i];
        const struct moe_expert_weights ex = side_experts(s, &hx);
        const struct moe_dispatch p = plan_in(side_put(s, plan, nb * 4), T, K, E);
        const struct moe_expert_ws ws = {side_put(s, NULL, TK * D * 4), side_put(s, NULL, TK * F * 4),
                                         side_put(s, NULL, TK * F * 4), side_put(s, NULL, TK * D * 4)};
        float *o = side_put(s, NULL, (size_t)T * D * 4);
        cr_assert_eq(s->be.ops->experts(&s->be, o, side_put(s, x, (size_t)T * D * 4), &p, side_put(s, w, TK * 4), &ex,
                                        &ws, T, K, D, F, E),
                     MOE_OK, "%s", moe_last_error());
        side_get(s, out[i], o, (size_t)T * D * 4);
    }
    char shp[64];
    shape_of(shp, sizeof shp, "T%d K%d E%d D%d F%d%s%s", T, K, E, D, F, c->flags & HOT ? " hot" : "",
             bias ? " gpt-oss" : "");
    const char *dt = side_wants_panels(tg, c->dt, D) && F % 2 == 0 ? "BF16_PANEL" : moe_dtype_name(c->dt);
    bool ok = report_close(tg, "experts", dt, shp, out[1], out[0], (size_t)T * D, experts_tol(tg, c->dt));
    free(gu), free(dn), free(bias), free(ids), free(plan), free(w), free(x), free(out[0]), free(out[1]);
    return ok;
}

/* ---- gathers, argmax ---- */

/* dst (T, D) = rows of src (37, D), repeats included. */
static bool run_gather_rows(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const int S = 37;
    const size_t n = (size_t)c->T * c->D;
    float *src = rand_floats((size_t)S * c->D, 121 + c->D, -3, 3);
    int32_t *rows = malloc((size_t)c->T * 4);
    for (int i = 0; i < c->T; i++) rows[i] = (i * 13 + 36) % S / (i % 3 ? 1 : 2);
    float *out[2] = {malloc(n * 4), malloc(n * 4)};
    for (int i = 0; i < 2; i++) {
        float *d = side_put(sd[i], NULL, n * 4);
        cr_assert_eq(sd[i]->be.ops->gather_rows(&sd[i]->be, d, side_put(sd[i], src, (size_t)S * c->D * 4),
                                                side_put(sd[i], rows, (size_t)c->T * 4), c->T, c->D),
                     MOE_OK);
        side_get(sd[i], out[i], d, n * 4);
    }
    char shp[64];
    shape_of(shp, sizeof shp, "%d of %dx%d", c->T, S, c->D);
    bool ok = report_close(tg, "gather_rows", "F32", shp, out[1], out[0], n, EXACT);
    free(src), free(rows), free(out[0]), free(out[1]);
    return ok;
}

/* MLA's column gathers: dst[r*ldy + j] = src[r*ldx + idx[j]], j < N, the
 * rope columns from off in rotate-half order (evens, then odds), or a
 * plain 2-D copy when off < 0; the columns past N keep their poison. */
static bool run_gather_cols(struct side *ref, struct side *tg, const struct op_case *c)
{
    const int rows = c->T, n = c->N;
    char shp[64];
    shape_of(shp, sizeof shp, "%d rows %d of %d->%d%s", rows, n, c->ldx, c->ldy, c->off >= 0 ? " idx" : "");
    if (!tg->be.ops->gather_cols) {
        report_skipped(tg, "gather_cols", "F32", shp);
        return true;
    }
    SIDES(ref, tg);
    int32_t *idx = malloc((size_t)n * 4);
    for (int j = 0; j < n; j++) idx[j] = c->off + (j < n / 2 ? 2 * j : 2 * (j - n / 2) + 1);
    const size_t ns = (size_t)rows * c->ldx, nd = (size_t)rows * c->ldy;
    float *src = rand_floats(ns, 131 + ns, -3, 3);
    float *out[2] = {malloc(nd * 4), malloc(nd * 4)};
    for (int i = 0; i < 2; i++) {
        float *d = side_put(sd[i], NULL, nd * 4);
        cr_assert_eq(sd[i]->be.ops->gather_cols(&sd[i]->be, d, c->ldy, side_put(sd[i], src, ns * 4), c->ldx, rows,
                                                c->off >= 0 ? side_put(sd[i], idx, (size_t)n * 4) : NULL, n),
                     MOE_OK, "%s", moe_last_error());
        side_get(sd[i], out[i], d, nd * 4);
    }
    bool ok = report_close(tg, "gather_cols", "F32", shp, out[1], out[0], nd, EXACT);
    free(idx), free(src), free(out[0]), free(out[1]);
    return ok;
}

/* ids (T) = argmax of each row of x (T, D), with a tie, an all-NaN row and
 * a leading NaN among the rows. */
static bool run_argmax(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const int T = c->T, n = c->D;
    float *x = rand_floats((size_t)T * n, 141 + n, -5, 5);
    for (int r = 1; r < T; r++) {
        float *row = x + (size_t)r * n;
        if (r % 3 == 1) row[n / 3] = row[n - 1] = 9.0f;
        if (r % 3 == 2)
            for (int i = 0; i < n; i++) row[i] = NAN;
        if (r % 4 == 3) row[0] = NAN;
    }
    int32_t *ids[2] = {malloc((size_t)T * 4), malloc((size_t)T * 4)};
    for (int i = 0; i < 2; i++) {
        int32_t *d = side_put(sd[i], NULL, (size_t)T * 4);
        cr_assert_eq(sd[i]->be.ops->argmax(&sd[i]->be, d, side_put(sd[i], x, (size_t)T * n * 4), T, n), MOE_OK);
        side_get(sd[i], ids[i], d, (size_t)T * 4);
    }
    char shp[64];
    shape_of(shp, sizeof shp, "rows%d n%d", T, n);
    bool ok = report_same_ints(tg, "argmax", shp, ids[1], ids[0], (size_t)T);
    free(x), free(ids[0]), free(ids[1]);
    return ok;
}

/* ---- entries cpu-ref does not have ---- */

/* The (V=N, D) embedding of a synthetic model of dtype dt (generator key
 * index 0 of seed 7, std 0.02), or ones with ONES, against
 * runtime/model/synth.c's own. */
static bool run_synth_fill(struct side *ref, struct side *tg, const struct op_case *c)
{
    const size_t n = (size_t)c->N * c->D, bytes = n * moe_dtype_size(c->dt);
    char shp[64];
    shape_of(shp, sizeof shp, "%zu values%s", n, c->flags & ONES ? " ones" : " std 0.02");
    if (!tg->be.ops->synth_fill) {
        report_skipped(tg, "synth_fill", moe_dtype_name(c->dt), shp);
        return true;
    }
    void *want = malloc(bytes), *got = malloc(bytes);
    struct moe_model m = {0};
    if (c->flags & ONES) {
        float *one = malloc(n * 4);
        for (size_t i = 0; i < n; i++) one[i] = 1.0f;
        moe_convert_from_f32(want, one, c->dt, n);
        free(one);
    } else {
        struct moe_config cfg = {.family = MOE_FAMILY_LLAMA, .n_layers = 1, .d_model = c->D, .vocab = c->N,
                                 .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .d_ff = 96, .init_std = 0.02f,
                                 .max_pos = 128, .rms_eps = 1e-5f, .rope_theta = 10000.0f};
        cr_assert_eq(moe_model_synthetic(&m, &cfg, c->dt, 7), MOE_OK, "%s", moe_last_error());
        memcpy(want, m.embed.data, bytes);
        moe_model_free(&m);
    }
    void *d = side_put(tg, NULL, bytes);
    cr_assert_eq(tg->be.ops->synth_fill(&tg->be, d, c->dt, n, moe_synth_key(7, 0), c->flags & ONES ? -1.0f : 0.02f),
                 MOE_OK, "%s", moe_last_error());
    side_get(tg, got, d, bytes);
    bool ok = report_same_bytes(tg, "synth_fill", moe_dtype_name(c->dt), shp, got, want, bytes);
    free(want), free(got);
    return ok;
}

/* The expert load counters (layers 2, E the reserved experts): a step of
 * two MoE layers (dispatch of T rows, then of T - 2), a new step (embed)
 * and its first layer again; the counters grow by the routed ids. */
static bool run_expert_load(struct side *ref, struct side *tg, const struct op_case *c)
{
    char shp[64];
    const int T = c->T, K = c->K, E = c->E;
    shape_of(shp, sizeof shp, "layers2 T%d,%d K%d E%d", T, T - 2, K, E);
    if (!tg->be.ops->expert_load) {
        report_skipped(tg, "expert_load", "U64", shp);
        return true;
    }
    struct moe_backend *be = &tg->be;
    const size_t TK = (size_t)T * K, nb = 2 * (size_t)E + 1 + 2 * TK;
    int32_t *ids = routing(c, 151), *want = calloc(2 * (size_t)E, 4), *got = malloc(2 * (size_t)E * 4);
    uint64_t *before = malloc(2 * (size_t)E * 8), *after = malloc(2 * (size_t)E * 8);
    const float one[4] = {1, 2, 3, 4};
    const int32_t tok = 0;
    const struct moe_tensor tab = side_matrix(tg, one, MOE_DTYPE_F32, 1, 4);
    float *x = side_put(tg, NULL, 16);
    int32_t *dtok = side_put(tg, &tok, 4), *dids = side_put(tg, ids, TK * 4);
    struct moe_dispatch p = plan_in(side_put(tg, NULL, nb * 4), T, K, E);
    cr_assert_eq(be->ops->embed(be, x, dtok, 1, &tab, 0), MOE_OK); /* a step starts */
    cr_assert_eq(be->ops->expert_load(be, before, 2, E), MOE_OK, "%s", moe_last_error());
    for (int step = 0; step < 2; step++) {
        cr_assert_eq(be->ops->dispatch(be, &p, dids, T, K, E), MOE_OK, "%s", moe_last_error());
        if (step == 0) cr_assert_eq(be->ops->dispatch(be, &p, dids, T - 2, K, E), MOE_OK);
        cr_assert_eq(be->ops->embed(be, x, dtok, 1, &tab, 0), MOE_OK);
    }
    cr_assert_eq(be->ops->expert_load(be, after, 2, E), MOE_OK, "%s", moe_last_error());
    for (size_t i = 0; i < TK; i++) want[ids[i]] += 2;
    for (size_t i = 0; i < (size_t)(T - 2) * K; i++) want[E + ids[i]] += 1;
    for (size_t i = 0; i < 2 * (size_t)E; i++) got[i] = (int32_t)(after[i] - before[i]);
    bool ok = report_same_ints(tg, "expert_load", shp, got, want, 2 * (size_t)E);
    free(ids), free(want), free(got), free(before), free(after);
    return ok;
}

/* host_alloc, to_host_async, sync: the bytes arrive by the sync. */
static bool run_to_host_async(struct side *ref, struct side *tg, const struct op_case *c)
{
    const size_t n = (size_t)c->T * c->D;
    char shp[64];
    shape_of(shp, sizeof shp, "%zu floats", n);
    if (!tg->be.ops->to_host_async) {
        report_skipped(tg, "to_host_async", "F32", shp);
        return true;
    }
    struct moe_backend *be = &tg->be;
    float *x = rand_floats(n, 161, -1, 1), *h = NULL;
    cr_assert_eq(be->ops->host_alloc(be, n * 4, (void **)&h), MOE_OK);
    cr_assert_eq(be->ops->to_host_async(be, h, side_put(tg, x, n * 4), n * 4), MOE_OK);
    cr_assert_eq(be->ops->sync(be), MOE_OK);
    bool ok = report_close(tg, "to_host_async", "F32", shp, h, x, n, EXACT);
    be->ops->host_free(be, h);
    free(x);
    return ok;
}
