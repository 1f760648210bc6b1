/* backend_ops_dense.h - the cases' vocabulary (tolerances per dtype,
 * struct op_case) and the runners of the dense ops: embed, rmsnorm,
 * matmul, matmul_multi, head_matmul, the elementwise ops, rope, kv_store
 * and attention.  tests/test_backend_ops.c says how a case runs. */
#pragma once

#include <stdarg.h>

#include "tests/backend_ops.h"

#include "attention/attention.h"

/* ---- tolerances, per dtype ----
 * The CPU backends share every entry but matmul, matmul_multi,
 * head_matmul, attention and experts with cpu-ref, so those others must
 * give the same bits there. */

/* matmul, matmul_multi, head_matmul over weights of dtype dt.  Fast CPU:
 * fp32 sums in another order, except Q8_0 and four-bit, whose kernels
 * quantize the inputs too (runtime/cpu/gemm_fast.h).  CUDA: F16 and BF16 inputs rounded
 * to the weight type; block formats widened to BF16 for many rows. */
static struct tol product_tol(const struct side *s, enum moe_dtype dt)
{
    if (s->cuda) switch (dt) {
        case MOE_DTYPE_F32: return (struct tol){2e-5, 1e-5};
        case MOE_DTYPE_F16: return (struct tol){4e-3, 0};
        default: return (struct tol){2e-2, 0}; /* BF16, MXFP4, FP8_B128, Q8_0 */
        }
    switch (dt) {
    case MOE_DTYPE_Q8_0:
    case MOE_DTYPE_Q4_1:
    case MOE_DTYPE_Q4_G32:
    case MOE_DTYPE_Q4_G128: return (struct tol){2e-2, 0};
    default: return (struct tol){2e-6, 1e-5}; /* F32, F16, BF16 (panels), MXFP4, FP8_B128 */
    }
}

/* The expert FFN: two products and the activation.  CUDA's grouped path
 * (many rows) rounds activations to a half type. */
static struct tol experts_tol(const struct side *s, enum moe_dtype dt)
{
    if (s->cuda) return dt == MOE_DTYPE_F32 ? (struct tol){2e-5, 1e-5} : (struct tol){3e-2, 0};
    return dt == MOE_DTYPE_Q8_0 || moe_dtype_is_q4(dt) ? (struct tol){4e-2, 0} : (struct tol){4e-6, 1e-5};
}

/* Attention over a cache of dtype kv: both sides read the same stored
 * values, so every cache dtype has fp32's tolerance. */
static struct tol attention_tol(const struct side *s, enum moe_dtype kv)
{
    (void)kv;
    return s->cuda ? (struct tol){1e-4, 0} : (struct tol){2e-6, 1e-5};
}

/* rmsnorm, rope, swiglu, sigmoid_scale, route weights: CUDA's expf,
 * sincosf and rsqrtf against libm's. */
static struct tol pointwise_tol(const struct side *s)
{
    return s->cuda ? (struct tol){1e-5, 1e-5} : EXACT;
}

/* ---- the cases ---- */

struct op_case;
typedef bool (*case_fn)(struct side *ref, struct side *tg, const struct op_case *c);

enum { /* op_case.flags */
    BIAS = 1 << 0,      /* matmul: an F32 bias */
    BIAS_BF16 = 1 << 1, /* matmul: a BF16 bias */
    IN_PLACE = 1 << 2,  /* rmsnorm: y == x, as forward.c's q/k norms */
    WINDOW = 1 << 3,    /* attention: sliding window c->window */
    SINKS = 1 << 4,     /* attention: gpt-oss sinks */
    MLA = 1 << 5,       /* attention: one cached row read as K and V (Hkv 1) */
    SIGMOID = 1 << 6,   /* route: sigmoid scores with a choice bias */
    RENORM = 1 << 7,    /* route: the K weights renormalised */
    GPT_OSS = 1 << 8,   /* experts: biases and the clamped activation */
    HOT = 1 << 9,       /* experts, dispatch: expert 0 takes every row */
    ONES = 1 << 10,     /* synth_fill: std < 0 */
};

/* Field use per op (see each runner): T rows; N output width (vocabulary
 * for embed, columns for gather_cols); D input or row width; E, K, F
 * experts; H, Hkv, Dh, rot heads; ldx, ldy, off strides and offsets;
 * n_seqs, ctx, rows the sequences of an attention step. */
struct op_case {
    const char *op;
    case_fn run;
    enum moe_dtype dt; /* weight, table or cache dtype; F32 where the op has none */
    int T, N, D;
    int E, K, F;
    int H, Hkv, Dh, rot;
    int ldx, ldy, off;
    int groups, topk_groups;
    float scale;
    int window, n_seqs, ctx[4], rows[4];
    unsigned flags;
};

static void shape_of(char *b, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void shape_of(char *b, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, n, fmt, ap);
    va_end(ap);
}

#define SIDES(ref, tg) struct side *sd[2] = {ref, tg}

/* ---- embed, rmsnorm, matmul, matmul_multi, head_matmul ---- */

/* x (T, D) = rows of the table (N, D) of dtype dt. */
static bool run_embed(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const size_t n = (size_t)c->T * c->D;
    void *tab = random_rows(c->dt, (size_t)c->N, (size_t)c->D, 11 + c->T, 1.0f);
    int32_t *tok = malloc((size_t)c->T * sizeof(int32_t));
    /* the table holds vocabulary rows [2, 2 + N) (a rank's share): tokens
     * 0, 1 and N + 2 on are another rank's and give zeros */
    const int first = 2;
    for (int t = 0; t < c->T; t++) tok[t] = (t * 7 + 3) % (c->N + 4);
    float *out[2] = {malloc(n * 4), malloc(n * 4)};
    for (int i = 0; i < 2; i++) {
        struct moe_tensor e = side_matrix(sd[i], tab, c->dt, c->N, c->D);
        float *x = side_put(sd[i], NULL, n * 4);
        cr_assert_eq(sd[i]->be.ops->embed(&sd[i]->be, x, side_put(sd[i], tok, (size_t)c->T * 4), c->T, &e, first),
                     MOE_OK, "%s", moe_last_error());
        side_get(sd[i], out[i], x, n * 4);
    }
    float *want = malloc((size_t)c->D * 4);
    const size_t row = moe_dtype_row_bytes(c->dt, (size_t)c->D);
    for (int t = 0; t < c->T; t++) {
        const int r = tok[t] - first;
        if (r >= 0 && r < c->N) moe_convert_row_f32(want, (const char *)tab + (size_t)r * row, c->dt, (size_t)c->D);
        else memset(want, 0, (size_t)c->D * 4);
        cr_assert(!memcmp(want, out[0] + (size_t)t * c->D, (size_t)c->D * 4), "embed: token %d (row %d of the "
                  "share from %d) is not its row", tok[t], r, first);
    }
    free(want);
    char shp[64];
    shape_of(shp, sizeof shp, "T%d V%d D%d", c->T, c->N, c->D);
    bool ok = report_close(tg, "embed", moe_dtype_name(c->dt), shp, out[1], out[0], n, EXACT);
    free(tab), free(tok), free(out[0]), free(out[1]);
    return ok;
}

static bool run_rmsnorm(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const size_t n = (size_t)c->T * c->D;
    float *x = rand_floats(n, 21 + c->D, -3, 3);
    void *w = random_rows(c->dt, 1, (size_t)c->D, 22 + c->D, 2.0f);
    float *out[2] = {malloc(n * 4), malloc(n * 4)};
    for (int i = 0; i < 2; i++) {
        struct moe_tensor wt = side_vector(sd[i], w, c->dt, c->D);
        float *dx = side_put(sd[i], x, n * 4), *dy = c->flags & IN_PLACE ? dx : side_put(sd[i], NULL, n * 4);
        cr_assert_eq(sd[i]->be.ops->rmsnorm(&sd[i]->be, dy, dx, &wt, c->T, c->D, 1e-5f), MOE_OK);
        side_get(sd[i], out[i], dy, n * 4);
    }
    char shp[64];
    shape_of(shp, sizeof shp, "rows%d dim%d%s", c->T, c->D, c->flags & IN_PLACE ? " in place" : "");
    bool ok = report_close(tg, "rmsnorm", moe_dtype_name(c->dt), shp, out[1], out[0], n, pointwise_tol(tg));
    free(x), free(w), free(out[0]), free(out[1]);
    return ok;
}

/* The dtype name of a weight as the side holds it. */
static const char *held_name(const struct side *s, enum moe_dtype dt, int K)
{
    return side_wants_panels(s, dt, K) ? "BF16_PANEL" : moe_dtype_name(dt);
}

/* y (T, N) = x (T, D) . W^T (+ b), W (N, D) of dtype dt. */
static bool run_matmul(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const int T = c->T, N = c->N, D = c->D;
    const enum moe_dtype bt = c->flags & BIAS_BF16 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
    const bool has_b = c->flags & (BIAS | BIAS_BF16);
    void *w = random_rows(c->dt, (size_t)N, (size_t)D, 31 + (uint64_t)N * D + T, 1.0f);
    void *bv = random_rows(bt, 1, (size_t)N, 32 + N, 1.0f);
    float *x = rand_floats((size_t)T * D, 33 + T, -1, 1);
    float *out[2] = {malloc((size_t)T * N * 4), malloc((size_t)T * N * 4)};
    for (int i = 0; i < 2; i++) {
        struct moe_tensor wt = side_matrix(sd[i], w, c->dt, N, D), b = side_vector(sd[i], bv, bt, N);
        float *y = side_put(sd[i], NULL, (size_t)T * N * 4);
        cr_assert_eq(sd[i]->be.ops->matmul(&sd[i]->be, y, side_put(sd[i], x, (size_t)T * D * 4), &wt,
                                           has_b ? &b : NULL, T),
                     MOE_OK, "%s", moe_last_error());
        side_get(sd[i], out[i], y, (size_t)T * N * 4);
    }
    char shp[64];
    shape_of(shp, sizeof shp, "T%d N%d Din%d%s%s", T, N, D, has_b ? " +b " : "", has_b ? moe_dtype_name(bt) : "");
    bool ok = report_close(tg, "matmul", held_name(tg, c->dt, D), shp, out[1], out[0], (size_t)T * N,
                           product_tol(tg, c->dt));
    free(w), free(bv), free(x), free(out[0]), free(out[1]);
    return ok;
}

/* Three products of one input x (T, D): W0 (N, D) of dtype dt, W1 (17, D)
 * F16 with an F32 bias, W2 (50, D) F32; the reference runs matmul three
 * times (what forward.c does where the entry is NULL). */
static bool run_matmul_multi(struct side *ref, struct side *tg, const struct op_case *c)
{
    char shp[64];
    shape_of(shp, sizeof shp, "T%d N%d,17,50 Din%d", c->T, c->N, c->D);
    if (!tg->be.ops->matmul_multi) {
        report_skipped(tg, "matmul_multi", moe_dtype_name(c->dt), shp);
        return true;
    }
    SIDES(ref, tg);
    const int T = c->T, D = c->D, N[3] = {c->N, 17, 50};
    const enum moe_dtype wt[3] = {c->dt, MOE_DTYPE_F16, MOE_DTYPE_F32};
    void *w[3];
    float *out[2][3];
    for (int j = 0; j < 3; j++) {
        w[j] = random_rows(wt[j], (size_t)N[j], (size_t)D, 41 + j, 1.0f);
        out[0][j] = malloc((size_t)T * N[j] * 4);
        out[1][j] = malloc((size_t)T * N[j] * 4);
    }
    float *bv = rand_floats(17, 44, -1, 1), *x = rand_floats((size_t)T * D, 45, -1, 1);
    for (int i = 0; i < 2; i++) {
        struct moe_tensor m[3], b = side_vector(sd[i], bv, MOE_DTYPE_F32, 17);
        const struct moe_tensor *mp[3] = {&m[0], &m[1], &m[2]}, *bp[3] = {NULL, &b, NULL};
        float *y[3], *dx = side_put(sd[i], x, (size_t)T * D * 4);
        for (int j = 0; j < 3; j++) {
            m[j] = side_matrix(sd[i], w[j], wt[j], N[j], D);
            y[j] = side_put(sd[i], NULL, (size_t)T * N[j] * 4);
        }
        struct moe_backend *be = &sd[i]->be;
        if (i == 1) cr_assert_eq(be->ops->matmul_multi(be, 3, y, dx, mp, bp, T), MOE_OK, "%s", moe_last_error());
        else
            for (int j = 0; j < 3; j++) cr_assert_eq(be->ops->matmul(be, y[j], dx, mp[j], bp[j], T), MOE_OK);
        for (int j = 0; j < 3; j++) side_get(sd[i], out[i][j], y[j], (size_t)T * N[j] * 4);
    }
    bool ok = true;
    for (int j = 0; j < 3; j++) {
        char what[32];
        shape_of(what, sizeof what, "matmul_multi.%d", j);
        ok &= report_close(tg, what, held_name(tg, wt[j], D), shp, out[1][j], out[0][j], (size_t)T * N[j],
                           product_tol(tg, wt[j]));
        free(w[j]), free(out[0][j]), free(out[1][j]);
    }
    free(bv), free(x);
    return ok;
}

/* MLA's per-head products: y[(t*H + h)*ldy + off + i] = sum_k W[h][i][k]
 * x[(t*H + h)*ldx + k], W (H, N, D) of dtype dt; the rest of y stays as it
 * was (poison, compared too). */
static bool run_head_matmul(struct side *ref, struct side *tg, const struct op_case *c)
{
    const int T = c->T, H = c->H, N = c->N, K = c->D;
    char shp[64];
    shape_of(shp, sizeof shp, "T%d H%d N%d K%d ld%d/%d+%d", T, H, N, K, c->ldx, c->ldy, c->off);
    if (!tg->be.ops->head_matmul) {
        report_skipped(tg, "head_matmul", moe_dtype_name(c->dt), shp);
        return true;
    }
    SIDES(ref, tg);
    const size_t nx = (size_t)T * H * c->ldx, ny = (size_t)T * H * c->ldy, wb = (size_t)H * N * moe_dtype_size(c->dt) * K;
    void *w = random_rows(c->dt, (size_t)H * N, (size_t)K, 51 + T, 0.1f);
    float *x = rand_floats(nx, 52 + T, -1, 1);
    float *out[2] = {malloc(ny * 4), malloc(ny * 4)};
    for (int i = 0; i < 2; i++) {
        struct moe_tensor wt = {.dtype = c->dt, .ndim = 3, .shape = {H, N, K}, .data = side_put(sd[i], w, wb),
                                .device = sd[i]->cuda ? 0 : -1};
        float *y = side_put(sd[i], NULL, ny * 4);
        cr_assert_eq(sd[i]->be.ops->head_matmul(&sd[i]->be, y + c->off, c->ldy, side_put(sd[i], x, nx * 4), c->ldx,
                                                &wt, T),
                     MOE_OK, "%s", moe_last_error());
        side_get(sd[i], out[i], y, ny * 4);
    }
    bool ok = report_close(tg, "head_matmul", moe_dtype_name(c->dt), shp, out[1], out[0], ny, product_tol(tg, c->dt));
    free(w), free(x), free(out[0]), free(out[1]);
    return ok;
}

/* ---- elementwise: add, scale, clamp, swiglu, sigmoid_scale, rope ---- */

/* a (T, D) op= b: add (y += x), scale (x *= 0.37), clamp (2.5), swiglu
 * (g = silu(g) * u), sigmoid_scale (y (T, D) *= sigmoid(g (T))). */
static bool run_pointwise(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const size_t n = (size_t)c->T * c->D;
    float *a = rand_floats(n, 61 + n, -4, 4), *b = rand_floats(n, 62 + n, -4, 4);
    float *out[2] = {malloc(n * 4), malloc(n * 4)};
    const bool exact_op = !strcmp(c->op, "add") || !strcmp(c->op, "scale") || !strcmp(c->op, "clamp");
    for (int i = 0; i < 2; i++) {
        struct moe_backend *be = &sd[i]->be;
        float *da = side_put(sd[i], a, n * 4), *db = side_put(sd[i], b, n * 4);
        enum moe_status st;
        if (!strcmp(c->op, "add")) st = be->ops->add(be, da, db, n);
        else if (!strcmp(c->op, "scale")) st = be->ops->scale(be, da, n, 0.37f);
        else if (!strcmp(c->op, "clamp")) st = be->ops->clamp(be, da, n, 2.5f);
        else if (!strcmp(c->op, "swiglu")) st = be->ops->swiglu(be, da, db, n);
        else st = be->ops->sigmoid_scale(be, da, db, c->T, c->D);
        cr_assert_eq(st, MOE_OK, "%s: %s", c->op, moe_last_error());
        side_get(sd[i], out[i], da, n * 4);
    }
    char shp[64];
    shape_of(shp, sizeof shp, "T%d D%d", c->T, c->D);
    bool ok = report_close(tg, c->op, "F32", shp, out[1], out[0], n, exact_op ? EXACT : pointwise_tol(tg));
    free(a), free(b), free(out[0]), free(out[1]);
    return ok;
}

/* x (T, H, Dh) rotated in place, the first rot values of each head. */
static bool run_rope(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const size_t n = (size_t)c->T * c->H * c->Dh;
    float *x = rand_floats(n, 71 + n, -1, 1), *inv = malloc((size_t)c->rot / 2 * 4);
    for (int i = 0; i < c->rot / 2; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)c->rot);
    int32_t *pos = malloc((size_t)c->T * 4);
    for (int t = 0; t < c->T; t++) pos[t] = (t * 37 + 5) % 4000;
    float *out[2] = {malloc(n * 4), malloc(n * 4)};
    for (int i = 0; i < 2; i++) {
        float *dx = side_put(sd[i], x, n * 4);
        cr_assert_eq(sd[i]->be.ops->rope(&sd[i]->be, dx, side_put(sd[i], pos, (size_t)c->T * 4), c->T, c->H,
                                         c->Dh, c->rot, side_put(sd[i], inv, (size_t)c->rot / 2 * 4)),
                     MOE_OK);
        side_get(sd[i], out[i], dx, n * 4);
    }
    char shp[64];
    shape_of(shp, sizeof shp, "T%d H%d Dh%d rot%d", c->T, c->H, c->Dh, c->rot);
    bool ok = report_close(tg, "rope", "F32", shp, out[1], out[0], n, pointwise_tol(tg));
    free(x), free(inv), free(pos), free(out[0]), free(out[1]);
    return ok;
}

/* ---- kv_store and attention ---- */

/* A step of n_seqs sequences over a cache of dtype dt with blocks of 5
 * slots handed out scrambled: kv_store writes every position of each
 * sequence (ctx[s] tokens) into layer 1 (compared byte for byte, scales
 * too), then attention runs the last rows[s] positions of each as queries
 * (the rest is context already cached, as for a later chunk). */
static bool run_attention(struct side *ref, struct side *tg, const struct op_case *c)
{
    SIDES(ref, tg);
    const int B = 5, layer = 1, Hq = c->H, Hkv = c->Hkv, Dh = c->Dh;
    struct moe_config cfg = {.n_layers = 2, .n_kv_heads = Hkv, .head_dim = Dh, .n_heads = Hq};
    if (c->flags & MLA) cfg.rope_dim = Dh / 2, cfg.kv_lora_rank = Dh - Dh / 2;
    int max_ctx = 0, total = 0, T = 0;
    for (int s = 0; s < c->n_seqs; s++) {
        max_ctx = c->ctx[s] > max_ctx ? c->ctx[s] : max_ctx;
        total += c->ctx[s];
        T += c->rows[s];
    }
    const int max_blocks = (max_ctx + B - 1) / B, n_blocks = c->n_seqs * max_blocks + 3;
    int32_t *table = malloc((size_t)c->n_seqs * max_blocks * 4), *slots = malloc((size_t)total * 4);
    for (int i = 0; i < c->n_seqs * max_blocks; i++)
        table[i] = n_blocks % 7 ? (int32_t)((i * 7 + 2) % n_blocks) : i; /* a permutation */
    for (int s = 0, r = 0; s < c->n_seqs; s++)
        for (int p = 0; p < c->ctx[s]; p++, r++) slots[r] = table[s * max_blocks + p / B] * B + p % B;
    const size_t row = (size_t)Hkv * Dh, nq = (size_t)T * Hq * Dh;
    float *k = rand_floats((size_t)total * row, 81 + T, -2, 2), *v = rand_floats((size_t)total * row, 82 + T, -1, 1);
    float *q = rand_floats(nq, 83 + T, -2, 2), *sinks = rand_floats((size_t)Hq, 84, -1, 3);
    int32_t *pos = malloc((size_t)T * 4), *seq_of = malloc((size_t)T * 4);
    int32_t seq_start[5], ctxv[4];
    for (int s = 0, t = 0; s < c->n_seqs; s++) {
        seq_start[s] = t;
        ctxv[s] = c->ctx[s];
        for (int j = 0; j < c->rows[s]; j++, t++) {
            pos[t] = c->ctx[s] - c->rows[s] + j;
            seq_of[t] = s;
        }
    }
    seq_start[c->n_seqs] = T;
    float *out[2] = {malloc(nq * 4), malloc(nq * 4)};
    char *cache[2] = {NULL, NULL};
    size_t cache_bytes = 0;
    for (int i = 0; i < 2; i++) {
        struct side *s = sd[i];
        struct moe_kvcache kv;
        cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&s->be), &cfg, n_blocks, B, c->dt, false), MOE_OK,
                     "%s", moe_last_error());
        cr_assert_eq(kv.v == kv.k, (c->flags & MLA) != 0);
        cr_assert_eq(s->be.ops->kv_store(&s->be, &kv, layer, side_put(s, k, (size_t)total * row * 4),
                                         side_put(s, v, (size_t)total * row * 4), side_put(s, slots, (size_t)total * 4),
                                         total),
                     MOE_OK, "%s", moe_last_error());
        /* the layer written: K, V (MLA: none apart), fp8 row scales */
        const size_t eb = kv.layer_elems * moe_dtype_size(c->dt), sb = kv.ks ? kv.layer_rows * 4 : 0;
        const int parts = kv.v == kv.k ? 1 : 2;
        cache_bytes = (size_t)parts * (eb + sb);
        cache[i] = malloc(cache_bytes);
        side_get(s, cache[i], (char *)kv.k + layer * eb, eb);
        if (parts == 2) side_get(s, cache[i] + eb, (char *)kv.v + layer * eb, eb);
        if (sb) side_get(s, cache[i] + parts * eb, kv.ks + layer * kv.layer_rows, sb);
        if (sb && parts == 2) side_get(s, cache[i] + parts * eb + sb, kv.vs + layer * kv.layer_rows, sb);
        struct moe_batch b = {.n_tokens = T, .n_seqs = c->n_seqs, .positions = side_put(s, pos, (size_t)T * 4),
                              .seq_of = side_put(s, seq_of, (size_t)T * 4),
                              .seq_start = side_put(s, seq_start, (size_t)(c->n_seqs + 1) * 4),
                              .ctx_len = side_put(s, ctxv, (size_t)c->n_seqs * 4),
                              .block_table = side_put(s, table, (size_t)c->n_seqs * max_blocks * 4),
                              .max_blocks = max_blocks};
        const struct moe_attn_params p = {layer, Hq, Hkv, Dh, 1.0f / sqrtf((float)Dh),
                                          c->flags & WINDOW ? c->window : 0, max_ctx,
                                          c->flags & SINKS ? side_put(s, sinks, (size_t)Hq * 4) : NULL, 0, 0,
                                          0.0f, NULL, 0};
        float *o = side_put(s, NULL, nq * 4);
        cr_assert_eq(s->be.ops->attention(&s->be, o, side_put(s, q, nq * 4), &kv, &b, &p), MOE_OK, "%s",
                     moe_last_error());
        side_get(s, out[i], o, nq * 4);
        moe_kvcache_free(&kv);
    }
    char shp[96];
    shape_of(shp, sizeof shp, "Hq%d Hkv%d Dh%d T%d S%d ctx%d%s%s%s", Hq, Hkv, Dh, T, c->n_seqs, max_ctx,
             c->flags & WINDOW ? " win" : "", c->flags & SINKS ? " sinks" : "", c->flags & MLA ? " mla" : "");
    bool ok = report_same_bytes(tg, "kv_store", moe_dtype_name(c->dt), shp, cache[1], cache[0], cache_bytes);
    ok &= report_close(tg, "attention", moe_dtype_name(c->dt), shp, out[1], out[0], nq, attention_tol(tg, c->dt));
    free(table), free(slots), free(k), free(v), free(q), free(sinks), free(pos), free(seq_of);
    free(out[0]), free(out[1]), free(cache[0]), free(cache[1]);
    return ok;
}
