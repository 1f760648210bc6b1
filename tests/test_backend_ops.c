/* test_backend_ops.c - every op of every backend table against cpu-ref, in
 * the spirit of ggml's test-backend-ops.
 *
 * One table of cases: each names an op of struct moe_backend_ops, a dtype
 * (weight, embedding table or KV cache) and an awkward shape (T = 1, 3,
 * 17, 65 rows; widths that are not multiples of 8, 16 or 32 where the op
 * allows them; odd K and E).  Each case draws seeded random inputs (never
 * all zeros; router logits with ties, NaN and infinities), runs the op on
 * the backend under test and on cpu-ref (moe_backend_cpu_init) through
 * each side's own memory, and compares: ids, plans, gathers, KV cache
 * bytes and counters exactly, floats as |x - ref| <= atol*S + rtol*|ref|
 * (S the output's largest |ref|) with tolerances written per dtype below.
 * Every output prints one "backend-ops:" line with its worst element; an
 * optional entry a backend leaves NULL prints "skipped".
 *
 * The backends under test: the fast CPU backend ("cpu") at every kernel
 * set this processor runs (cpu_isa_max ref, avx2, avx512), with panels on
 * (bf16 matrices of even width handed over repacked, as its prepare_model
 * leaves them) and off; and CUDA when a device is present, opened in the
 * forked test only (the suite's .init skips without a device).  Ops with
 * no cpu-ref entry compare with what defines them: matmul_multi with n
 * matmuls, synth_fill with runtime/model/synth.c, expert_load with the
 * routed ids counted here.  Policies (tie-breaking, NaN ranking) and whole
 * models keep their own suites (test_router.c, test_forward*.c). */
#include <stdarg.h>

#include "tests/backend_ops.h"

#include "attention/attention.h"
#include "router/router.h"
#include "runtime/cli/cli_common.h"
#include "runtime/core/argmax.h"
#include "runtime/model/synth.h"

/* ---- tolerances, per dtype ----
 * The CPU backends share every entry but matmul, matmul_multi,
 * head_matmul, attention and experts with cpu-ref, so those others must
 * give the same bits there. */

/* matmul, matmul_multi, head_matmul over weights of dtype dt.  Fast CPU:
 * fp32 sums in another order, except Q8_0, whose kernels quantize the
 * inputs too (runtime/cpu/gemm_fast.h).  CUDA: F16 and BF16 inputs rounded
 * to the weight type; block formats widened to BF16 for many rows. */
static struct tol product_tol(const struct side *s, enum moe_dtype dt)
{
    if (s->cuda) switch (dt) {
        case MOE_DTYPE_F32: return (struct tol){2e-5, 1e-5};
        case MOE_DTYPE_F16: return (struct tol){4e-3, 0};
        default: return (struct tol){2e-2, 0}; /* BF16, MXFP4, FP8_B128, Q8_0 */
        }
    switch (dt) {
    case MOE_DTYPE_Q8_0: return (struct tol){2e-2, 0};
    default: return (struct tol){2e-6, 1e-5}; /* F32, F16, BF16 (panels), MXFP4, FP8_B128 */
    }
}

/* The expert FFN: two products and the activation.  CUDA's grouped path
 * (many rows) rounds activations to a half type. */
static struct tol experts_tol(const struct side *s, enum moe_dtype dt)
{
    if (s->cuda) return dt == MOE_DTYPE_F32 ? (struct tol){2e-5, 1e-5} : (struct tol){3e-2, 0};
    return dt == MOE_DTYPE_Q8_0 ? (struct tol){4e-2, 0} : (struct tol){4e-6, 1e-5};
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
    for (int t = 0; t < c->T; t++) tok[t] = (t * 7 + 3) % c->N;
    float *out[2] = {malloc(n * 4), malloc(n * 4)};
    for (int i = 0; i < 2; i++) {
        struct moe_tensor e = side_matrix(sd[i], tab, c->dt, c->N, c->D);
        float *x = side_put(sd[i], NULL, n * 4);
        cr_assert_eq(sd[i]->be.ops->embed(&sd[i]->be, x, side_put(sd[i], tok, (size_t)c->T * 4), c->T, &e),
                     MOE_OK, "%s", moe_last_error());
        side_get(sd[i], out[i], x, n * 4);
    }
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
    return (struct moe_dispatch){buf, buf + E, buf + 2 * (size_t)E + 1, buf + 2 * (size_t)E + 1 + TK, 0, 0};
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
    cr_assert_eq(be->ops->embed(be, x, dtok, 1, &tab), MOE_OK); /* a step starts */
    cr_assert_eq(be->ops->expert_load(be, before, 2, E), MOE_OK, "%s", moe_last_error());
    for (int step = 0; step < 2; step++) {
        cr_assert_eq(be->ops->dispatch(be, &p, dids, T, K, E), MOE_OK, "%s", moe_last_error());
        if (step == 0) cr_assert_eq(be->ops->dispatch(be, &p, dids, T - 2, K, E), MOE_OK);
        cr_assert_eq(be->ops->embed(be, x, dtok, 1, &tab), MOE_OK);
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

#define F32 MOE_DTYPE_F32
#define F16 MOE_DTYPE_F16
#define BF16 MOE_DTYPE_BF16
#define FP8 MOE_DTYPE_FP8_B128
#define MXFP4 MOE_DTYPE_MXFP4
#define Q8_0 MOE_DTYPE_Q8_0
#define E4M3 MOE_DTYPE_F8E4M3

/* Experts in the reserved configuration (expert_load needs all of them). */
enum { RESERVED_E = 67 };

static const struct op_case cases[] = {
    {"embed", run_embed, F32, .T = 17, .N = 50, .D = 37},
    {"embed", run_embed, F16, .T = 1, .N = 50, .D = 300},
    {"embed", run_embed, BF16, .T = 65, .N = 97, .D = 129},
    {"rmsnorm", run_rmsnorm, F32, .T = 1, .D = 64},
    {"rmsnorm", run_rmsnorm, F16, .T = 17, .D = 37},
    {"rmsnorm", run_rmsnorm, BF16, .T = 65, .D = 1000, .flags = IN_PLACE},
    {"rmsnorm", run_rmsnorm, F32, .T = 3, .D = 129, .flags = IN_PLACE},
    /* matmul: every weight dtype, odd widths where the format allows */
    {"matmul", run_matmul, F32, .T = 1, .N = 37, .D = 77, .flags = BIAS},
    {"matmul", run_matmul, F32, .T = 17, .N = 97, .D = 259},
    {"matmul", run_matmul, F32, .T = 65, .N = 33, .D = 64, .flags = BIAS},
    {"matmul", run_matmul, F16, .T = 1, .N = 97, .D = 259, .flags = BIAS},
    {"matmul", run_matmul, F16, .T = 17, .N = 37, .D = 77},
    {"matmul", run_matmul, F16, .T = 65, .N = 130, .D = 100, .flags = BIAS_BF16},
    {"matmul", run_matmul, BF16, .T = 1, .N = 37, .D = 78, .flags = BIAS}, /* even: panels */
    {"matmul", run_matmul, BF16, .T = 17, .N = 97, .D = 258, .flags = BIAS_BF16},
    {"matmul", run_matmul, BF16, .T = 65, .N = 33, .D = 77}, /* odd: natural */
    {"matmul", run_matmul, BF16, .T = 3, .N = 161, .D = 130},
    {"matmul", run_matmul, FP8, .T = 1, .N = 37, .D = 256, .flags = BIAS},
    {"matmul", run_matmul, FP8, .T = 17, .N = 33, .D = 128},
    {"matmul", run_matmul, FP8, .T = 65, .N = 21, .D = 384},
    {"matmul", run_matmul, MXFP4, .T = 1, .N = 37, .D = 96, .flags = BIAS},
    {"matmul", run_matmul, MXFP4, .T = 17, .N = 97, .D = 64},
    {"matmul", run_matmul, MXFP4, .T = 65, .N = 33, .D = 160},
    {"matmul", run_matmul, Q8_0, .T = 1, .N = 37, .D = 96, .flags = BIAS},
    {"matmul", run_matmul, Q8_0, .T = 17, .N = 97, .D = 64},
    {"matmul", run_matmul, Q8_0, .T = 65, .N = 33, .D = 160},
    {"matmul_multi", run_matmul_multi, BF16, .T = 1, .N = 131, .D = 78},
    {"matmul_multi", run_matmul_multi, BF16, .T = 17, .N = 131, .D = 78},
    {"matmul_multi", run_matmul_multi, F32, .T = 65, .N = 33, .D = 77},
    {"head_matmul", run_head_matmul, F32, .T = 1, .H = 16, .N = 512, .D = 128, .ldx = 192, .ldy = 576, .off = 64},
    {"head_matmul", run_head_matmul, F16, .T = 7, .H = 16, .N = 128, .D = 512, .ldx = 576, .ldy = 128},
    {"head_matmul", run_head_matmul, BF16, .T = 5, .H = 4, .N = 32, .D = 16, .ldx = 24, .ldy = 40, .off = 8},
    {"head_matmul", run_head_matmul, BF16, .T = 17, .H = 3, .N = 37, .D = 21, .ldx = 25, .ldy = 41, .off = 3},
    {"add", run_pointwise, F32, .T = 1, .D = 37},
    {"add", run_pointwise, F32, .T = 65, .D = 129},
    {"scale", run_pointwise, F32, .T = 17, .D = 37},
    {"clamp", run_pointwise, F32, .T = 65, .D = 129},
    {"swiglu", run_pointwise, F32, .T = 1, .D = 37},
    {"swiglu", run_pointwise, F32, .T = 65, .D = 129},
    {"sigmoid_scale", run_pointwise, F32, .T = 17, .D = 37},
    {"sigmoid_scale", run_pointwise, F32, .T = 3, .D = 300},
    {"rope", run_rope, F32, .T = 1, .H = 4, .Dh = 16, .rot = 16},
    {"rope", run_rope, F32, .T = 17, .H = 3, .Dh = 20, .rot = 20},
    {"rope", run_rope, F32, .T = 3, .H = 2, .Dh = 64, .rot = 32},  /* partial */
    {"rope", run_rope, F32, .T = 65, .H = 5, .Dh = 36, .rot = 12}, /* partial */
    {"rope", run_rope, F32, .T = 17, .H = 1, .Dh = 40, .rot = 20}, /* MLA's key row */
    /* kv_store + attention: every cache dtype, GQA and MQA, windows, sinks, MLA */
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .n_seqs = 3, .ctx = {1, 17, 41}, .rows = {1, 1, 1}},
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .n_seqs = 2, .ctx = {17, 70}, .rows = {17, 48}},
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .window = 7, .n_seqs = 2, .ctx = {41, 3},
     .rows = {41, 3}, .flags = WINDOW},
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .window = 7, .n_seqs = 2, .ctx = {41, 3},
     .rows = {41, 3}, .flags = WINDOW | SINKS},
    {"attention", run_attention, F32, .H = 6, .Hkv = 2, .Dh = 20, .n_seqs = 2, .ctx = {41, 3}, .rows = {41, 3},
     .flags = SINKS},
    {"attention", run_attention, BF16, .H = 5, .Hkv = 1, .Dh = 36, .window = 7, .n_seqs = 1, .ctx = {65},
     .rows = {65}, .flags = WINDOW | SINKS},
    {"attention", run_attention, F16, .H = 8, .Hkv = 2, .Dh = 64, .n_seqs = 2, .ctx = {3, 100}, .rows = {3, 1}},
    {"attention", run_attention, E4M3, .H = 6, .Hkv = 3, .Dh = 20, .window = 9, .n_seqs = 2, .ctx = {40, 17},
     .rows = {17, 17}, .flags = WINDOW},
    {"attention", run_attention, E4M3, .H = 4, .Hkv = 4, .Dh = 64, .n_seqs = 1, .ctx = {200}, .rows = {1},
     .flags = SINKS},
    {"attention", run_attention, F32, .H = 4, .Hkv = 1, .Dh = 40, .n_seqs = 3, .ctx = {1, 17, 33}, .rows = {1, 1, 5},
     .flags = MLA},
    {"attention", run_attention, E4M3, .H = 4, .Hkv = 1, .Dh = 40, .n_seqs = 2, .ctx = {9, 40}, .rows = {9, 3},
     .flags = MLA},
    /* route: softmax, group-limited softmax, sigmoid with bias and groups */
    {"route", run_route, F32, .T = 1, .E = 9, .K = 3, .flags = RENORM},
    {"route", run_route, F32, .T = 17, .E = 61, .K = 5},
    {"route", run_route, F32, .T = 65, .E = 67, .K = 8, .flags = RENORM},
    {"route", run_route, F32, .T = 17, .E = 63, .K = 5, .groups = 9, .topk_groups = 3, .scale = 2.5f},
    {"route", run_route, F32, .T = 65, .E = 64, .K = 6, .groups = 8, .topk_groups = 3, .flags = RENORM},
    {"route", run_route, F32, .T = 1, .E = 9, .K = 3, .groups = 3, .topk_groups = 2, .flags = SIGMOID},
    {"route", run_route, F32, .T = 17, .E = 63, .K = 5, .groups = 9, .topk_groups = 3, .scale = 2.5f,
     .flags = SIGMOID | RENORM},
    {"route", run_route, F32, .T = 65, .E = 67, .K = 7, .flags = SIGMOID},
    {"dispatch", run_dispatch, F32, .T = 1, .E = 9, .K = 3},
    {"dispatch", run_dispatch, F32, .T = 17, .E = 61, .K = 5},
    {"dispatch", run_dispatch, F32, .T = 65, .E = 67, .K = 8},
    {"dispatch", run_dispatch, F32, .T = 17, .E = 7, .K = 3, .flags = HOT},
    /* experts: every expert dtype, biases and the clamped activation */
    {"experts", run_experts, F32, .T = 1, .K = 3, .E = 7, .D = 37, .F = 21},
    {"experts", run_experts, F16, .T = 17, .K = 3, .E = 9, .D = 40, .F = 33},
    {"experts", run_experts, BF16, .T = 65, .K = 3, .E = 9, .D = 38, .F = 22}, /* even: panels */
    {"experts", run_experts, BF16, .T = 17, .K = 1, .E = 5, .D = 37, .F = 21, .flags = HOT},
    {"experts", run_experts, BF16, .T = 17, .K = 3, .E = 7, .D = 64, .F = 32, .flags = GPT_OSS},
    {"experts", run_experts, F32, .T = 1, .K = 2, .E = 8, .D = 64, .F = 32, .flags = GPT_OSS},
    {"experts", run_experts, F32, .T = 65, .K = 3, .E = 11, .D = 19, .F = 45}, /* many rows, idle experts */
    {"experts", run_experts, F32, .T = 17, .K = 1, .E = 5, .D = 40, .F = 33, .flags = HOT},
    {"experts", run_experts, F16, .T = 5, .K = 4, .E = 16, .D = 64, .F = 100, .flags = HOT},
    {"experts", run_experts, F16, .T = 65, .K = 3, .E = 11, .D = 40, .F = 48, .flags = GPT_OSS},
    {"experts", run_experts, BF16, .T = 1, .K = 2, .E = 8, .D = 38, .F = 22},
    {"experts", run_experts, BF16, .T = 5, .K = 4, .E = 16, .D = 64, .F = 100},
    {"experts", run_experts, BF16, .T = 9, .K = 1, .E = 5, .D = 40, .F = 34, .flags = HOT},
    {"experts", run_experts, BF16, .T = 130, .K = 2, .E = 3, .D = 256, .F = 96}, /* ~87 rows an expert */
    {"experts", run_experts, MXFP4, .T = 17, .K = 3, .E = 7, .D = 64, .F = 96, .flags = GPT_OSS},
    {"experts", run_experts, MXFP4, .T = 1, .K = 3, .E = 5, .D = 96, .F = 32},
    {"experts", run_experts, FP8, .T = 17, .K = 2, .E = 5, .D = 128, .F = 128},
    {"experts", run_experts, Q8_0, .T = 65, .K = 3, .E = 7, .D = 64, .F = 96},
    {"gather_rows", run_gather_rows, F32, .T = 17, .D = 37},
    {"gather_rows", run_gather_rows, F32, .T = 1, .D = 300},
    {"gather_cols", run_gather_cols, F32, .T = 37, .N = 64, .ldx = 576, .ldy = 576, .off = 512},
    {"gather_cols", run_gather_cols, F32, .T = 65, .N = 20, .ldx = 60, .ldy = 40, .off = 40},
    {"gather_cols", run_gather_cols, F32, .T = 17, .N = 37, .ldx = 40, .ldy = 41, .off = -1},
    {"gather_cols", run_gather_cols, F32, .T = 1, .N = 3, .ldx = 7, .ldy = 9, .off = -1},
    {"argmax", run_argmax, F32, .T = 6, .D = 5000},
    {"argmax", run_argmax, F32, .T = 17, .D = 1001},
    {"argmax", run_argmax, F32, .T = 1, .D = 3},
    {"synth_fill", run_synth_fill, F32, .N = 1000, .D = 64},
    {"synth_fill", run_synth_fill, F16, .N = 1000, .D = 64},
    {"synth_fill", run_synth_fill, BF16, .N = 1000, .D = 64},
    {"synth_fill", run_synth_fill, BF16, .N = 17, .D = 37, .flags = ONES},
    {"expert_load", run_expert_load, F32, .T = 17, .K = 3, .E = RESERVED_E},
    {"to_host_async", run_to_host_async, F32, .T = 17, .D = 37},
};

/* ---- the backends ---- */

/* A configuration whose sizes cover every case (CUDA's reserve, the CPU
 * backends' scratch); mla: the attention workspace of an MLA model. */
static void reserve_config(struct moe_config *c, bool mla)
{
    *c = (struct moe_config){.n_layers = 2, .d_model = 1024, .n_heads = 8, .n_kv_heads = 1, .head_dim = 64,
                             .d_ff = 1024, .n_experts = RESERVED_E, .top_k = 8, .d_expert = 256,
                             .experts_mxfp4 = true, .weights_fp8 = true};
    c->layer_moe[0] = c->layer_moe[1] = true;
    if (mla) c->head_dim = 40, c->rope_dim = 20, c->kv_lora_rank = 20, c->n_heads = 4;
}

/* Sizes s's workspaces for every case: CUDA's reserve (normal and MLA
 * attention), or a CPU backend's prepare_model of a model with no layers,
 * which sizes its scratch from the configuration. */
static void side_reserve(struct side *s)
{
    struct moe_config c;
    reserve_config(&c, false);
    if (s->be.ops->reserve) {
        cr_assert_eq(s->be.ops->reserve(&s->be, &c, 512), MOE_OK, "%s", moe_last_error());
        reserve_config(&c, true);
        cr_assert_eq(s->be.ops->reserve(&s->be, &c, 512), MOE_OK, "%s", moe_last_error());
        return;
    }
    struct moe_model m = {.cfg = c};
    m.cfg.n_layers = 0;
    cr_assert_eq(s->be.ops->prepare_model(&s->be, &m), MOE_OK, "%s", moe_last_error());
}

/* cpu-ref, through moe_backend_cpu_init. */
static void open_ref(struct side *s)
{
    *s = (struct side){.label = "cpu-ref"};
    cr_assert_eq(moe_backend_cpu_init(&s->be, 0), MOE_OK, "%s", moe_last_error());
    side_reserve(s);
}

/* Walks the table on tg against ref, the cases of the ops named in only
 * (a NULL-terminated list; NULL: every case); each case's lines, then one
 * expectation per failed case. */
static void walk_cases_of(struct side *ref, struct side *tg, const char *const *only)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool named = !only;
        for (const char *const *o = only; o && *o && !named; o++) named = strcmp(*o, cases[i].op) == 0;
        if (!named) continue;
        const bool ok = cases[i].run(ref, tg, &cases[i]);
        cr_expect(ok, "%s: case %zu (%s %s) differs from cpu-ref; see its backend-ops line", tg->label, i,
                  cases[i].op, moe_dtype_name(cases[i].dt));
        side_release(ref);
        side_release(tg);
    }
}

static void walk_cases(struct side *ref, struct side *tg) { walk_cases_of(ref, tg, NULL); }

/* The fast CPU backend with kernel set isa (at most) and panels on or off. */
static void check_cpu(enum moe_cpu_isa isa, bool panels)
{
    const enum moe_cpu_isa need = isa > MOE_CPU_ISA_AMX ? MOE_CPU_ISA_AMX : isa; /* the AMX variants */
    if (moe_cpu_isa_detect() < need) cr_skip_test("this processor does not run %s", moe_cpu_isa_name(isa));
    struct side ref, tg = {0};
    open_ref(&ref);
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.cpu_isa_max = isa;
    o.cpu_panels = panels;
    use_q8_0_weights(&o);
    cr_assert_eq(moe_backend_init(&tg.be, "cpu", &o), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_backend_cpu_isa(&tg.be), (int)isa);
    snprintf(tg.label, sizeof tg.label, "cpu %s%s", moe_cpu_isa_name(isa), panels ? " panels" : "");
    tg.panels = panels && isa != MOE_CPU_ISA_REF;
    side_reserve(&tg);
    walk_cases(&ref, &tg);
    moe_backend_free(&tg.be);
    moe_backend_free(&ref.be);
}

Test(backend_ops, cpu_ref_kernels) { check_cpu(MOE_CPU_ISA_REF, false); }
Test(backend_ops, cpu_avx2) { check_cpu(MOE_CPU_ISA_AVX2, false); }
Test(backend_ops, cpu_avx2_panels) { check_cpu(MOE_CPU_ISA_AVX2, true); }
Test(backend_ops, cpu_avx512) { check_cpu(MOE_CPU_ISA_AVX512, false); }
Test(backend_ops, cpu_avx512_panels) { check_cpu(MOE_CPU_ISA_AVX512, true); }
/* AMX with exact inputs: held to the fp32 tolerances (the default, two
 * parts, is bounded by its inputs' rounding in test_fast_ops.c) */
Test(backend_ops, cpu_amx_exact_panels) { check_cpu(MOE_CPU_ISA_AMX_EXACT, true); }

/* CUDA, opened in the forked test (never in Criterion's parent) with the
 * options the environment gives the program (moe_cli_backend_opts, as
 * tu_backend_init). */
TestSuite(backend_ops_cuda, .init = tu_need_cuda_device);

static void check_cuda(const char *const *only)
{
    struct side ref, tg = {.label = "cuda", .cuda = true};
    open_ref(&ref);
    struct moe_backend_opts o;
    moe_cli_backend_opts(&o, 0);
    use_q8_0_weights(&o);
    cr_assert_eq(moe_backend_init(&tg.be, "cuda", &o), MOE_OK, "%s", moe_last_error());
    side_reserve(&tg);
    walk_cases_of(&ref, &tg, only);
    moe_backend_free(&tg.be);
    moe_backend_free(&ref.be);
}

Test(backend_ops_cuda, cuda) { check_cuda(NULL); }

/* The table's cheap ops (no attention, routing or experts, which the
 * parity suites' small shapes cover): the host emulation's CI selection
 * (tools/cuda-emu/ci-tests.txt). */
Test(backend_ops_cuda, cuda_small_ops)
{
    static const char *const only[] = {"embed", "rmsnorm", "matmul", "matmul_multi", "head_matmul", "add",
                                       "scale", "clamp", "sigmoid_scale", "swiglu", "rope", "gather_rows",
                                       "gather_cols", "argmax", "synth_fill", "expert_load",
                                       "to_host_async", NULL};
    check_cuda(only);
}
