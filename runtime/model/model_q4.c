/* model_q4.c - the four-bit Linear weights of GPTQ, AWQ and
 * compressed-tensors checkpoints, bound as MOE_DTYPE_Q4_G32 / Q4_G128
 * (runtime/core/tensor.h) in memory the model owns.
 *
 * A quantized Linear weight W (N, K) = (out_features, in_features) named
 * PREFIX.weight in a float checkpoint is stored instead as (element (n, k),
 * group g = k / G, G the group size, K for one group a row):
 *
 *   GPTQ  PREFIX.qweight I32 (K/8, N): nibble k % 8 (bits 4(k%8) ..) of
 *         word [k/8][n]; PREFIX.qzeros I32 (K/G, N/8): z of (g, n) in
 *         nibble n % 8 of word [g][n/8]; checkpoint_format gptq (v1)
 *         stores z - 1, read as GPTQModel converts v1 to v2: the whole
 *         word plus 0x11111111, so that the borrow a zero point of 0 made
 *         when it was written carries back (z = 8 for symmetric ones);
 *         PREFIX.scales (K/G, N); PREFIX.g_idx I32 (K), each column's group.
 *   AWQ   PREFIX.qweight I32 (K, N/8): column n in nibble AWQ_POS[n % 8]
 *         of word [k][n/8] (AutoAWQ's interleaved order 0 2 4 6 1 3 5 7);
 *         PREFIX.qzeros I32 (K/G, N/8), the same order; PREFIX.scales
 *         (K/G, N).
 *   compressed-tensors (pack-quantized)  PREFIX.weight_packed I32 (N, K/8):
 *         nibble k % 8 of word [n][k/8], the signed int4 value plus 8;
 *         PREFIX.weight_scale (N, K/G); asymmetric schemes
 *         PREFIX.weight_zero_point I32 (N/8, K/G), packed along N the
 *         same way (the value plus 8); symmetric ones none (z = 8);
 *         PREFIX.weight_shape I64 [N, K]; PREFIX.weight_g_idx optional.
 *
 * and the value is (q - z) * s.  Scales are F16, BF16 or F32 and must be
 * finite.  Which weights are quantized is read from the tensors (a
 * PREFIX.weight present is a float weight, whatever the config's ignore
 * or modules_to_not_convert lists say), so routers, norms, embeddings and
 * an unquantized LM head load as stored.  G must be a multiple of 32 that
 * divides K, or K: G a multiple of 128 (and K of 128) becomes Q4_G128
 * groups, else Q4_G32 ones, each with its source group's d = s and
 * m = -z * s.  A g_idx that is not the identity grouping k / G (desc_act
 * true, act-order: columns quantized in order of importance, so a group's
 * columns are scattered) is read by sorting the columns by group (stable):
 * the stored rows hold the columns in that order, whose groups are then
 * contiguous, and the tensor's cols (runtime/core/tensor.h) says which
 * input column each stored column multiplies.  Every group must then hold
 * exactly G columns (GPTQ's act-order does); a g_idx naming a group out of
 * range, or uneven groups, is refused by name.  A weight dequantized to F32
 * (to_f32) keeps its columns in order.  Stacked (3-D) four-bit expert
 * tensors are refused (no checkpoint writes them yet). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/model_impl.h"

enum { AWQ_PACK = 8 };
static const int AWQ_POS[AWQ_PACK] = {0, 4, 1, 5, 2, 6, 3, 7}; /* nibble holding column n % 8 */

/* One source weight: its tensors and shape. */
struct q4_src {
    enum moe_q4_method fmt;
    const char *prefix;
    const struct moe_st_tensor *q, *z, *s, *gidx;
    int64_t N, K, G, n_groups;
    uint32_t zero_add; /* GPTQ v1: 0x11111111, added to each zero-point word */
    int32_t *perm; /* act-order: (K) the source column of each stored column; NULL: in order */
    float *sf;     /* (N, n_groups) the scales, in F32 */
    uint8_t *zf;   /* (N, n_groups) the zero points */
};

static inline unsigned nib(int32_t w, int i) { return ((uint32_t)w >> (4 * i)) & 15u; }

/* The codes of rows [n0, n0 + R) into c (R, K), row after row: each
 * format's words read in their stored order. */
static void src_codes(const struct q4_src *p, int64_t n0, int64_t R, uint8_t *c)
{
    const int32_t *q = p->q->data;
    const int64_t N = p->N, K = p->K;
    switch (p->fmt) {
    case MOE_Q4_GPTQ: /* word [k/8][n]: a word row holds 8 columns of every row */
        for (int64_t kw = 0; kw < K / 8; kw++)
            for (int64_t r = 0; r < R; r++) {
                const uint32_t w = (uint32_t)q[kw * N + n0 + r];
                uint8_t *d = c + r * K + kw * 8;
                for (int i = 0; i < 8; i++) d[i] = (uint8_t)((w >> (4 * i)) & 15u);
            }
        break;
    case MOE_Q4_AWQ: /* word [k][n/8]: 8 rows of one column, interleaved */
        for (int64_t k = 0; k < K; k++)
            for (int64_t r = 0; r < R; r += 8) {
                const uint32_t w = (uint32_t)q[k * (N / 8) + (n0 + r) / 8];
                for (int i = 0; i < 8; i++) c[(r + i) * K + k] = (uint8_t)((w >> (4 * AWQ_POS[i])) & 15u);
            }
        break;
    default: /* word [n][k/8] */
        for (int64_t r = 0; r < R; r++) {
            const int32_t *row = q + (n0 + r) * (K / 8);
            for (int64_t kw = 0; kw < K / 8; kw++) {
                const uint32_t w = (uint32_t)row[kw];
                for (int i = 0; i < 8; i++) c[r * K + kw * 8 + i] = (uint8_t)((w >> (4 * i)) & 15u);
            }
        }
    }
}

static inline unsigned src_zero(const struct q4_src *p, int64_t n, int64_t g)
{
    if (!p->z) return 8; /* compressed-tensors, symmetric */
    const int32_t *z = p->z->data;
    switch (p->fmt) {
    case MOE_Q4_GPTQ: return nib((int32_t)((uint32_t)z[g * (p->N / 8) + n / 8] + p->zero_add), (int)(n % 8));
    case MOE_Q4_AWQ: return nib(z[g * (p->N / 8) + n / 8], AWQ_POS[n % 8]);
    default: return nib(z[(n / 8) * p->n_groups + g], (int)(n % 8));
    }
}

/* p->sf and p->zf from the scale and zero-point tensors (each converted
 * once, whole). */
static enum moe_status src_tables(struct q4_src *p)
{
    const int64_t N = p->N, ng = p->n_groups;
    float *all = malloc((size_t)N * (size_t)ng * sizeof(float));
    p->sf = malloc((size_t)N * (size_t)ng * sizeof(float));
    p->zf = malloc((size_t)N * (size_t)ng);
    if (!all || !p->sf || !p->zf) {
        free(all);
        return moe_fail(MOE_ERR_NOMEM, "checkpoint: the scales of '%s'", p->prefix);
    }
    moe_convert_row_f32(all, p->s->data, p->s->dtype, (size_t)N * (size_t)ng);
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < ng; g++) {
            p->sf[n * ng + g] = p->fmt == MOE_Q4_CT ? all[n * ng + g] : all[g * N + n];
            p->zf[n * ng + g] = (uint8_t)src_zero(p, n, g);
        }
    free(all);
    return MOE_OK;
}

static void src_free(struct q4_src *p)
{
    free(p->perm);
    free(p->sf);
    free(p->zf);
}

static void shape_text(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t off = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
}

/* PREFIX + suffix, which must exist (required) with dtype in dts and shape
 * (d0, d1) (d1 < 0: one dimension). */
static enum moe_status find(const struct moe_model *m, const char *prefix, const char *suffix, bool required,
                            const enum moe_dtype *dts, int n_dts, int64_t d0, int64_t d1,
                            const struct moe_st_tensor **out)
{
    char name[MOE_NAME_MAX];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    const struct moe_st_tensor *t = moe_safetensors_find(&m->st, name);
    *out = t;
    if (!t) {
        if (!required) return MOE_OK;
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' is missing (a four-bit weight's %s)", name,
                        suffix + 1);
    }
    bool ok = false;
    for (int i = 0; i < n_dts; i++) ok = ok || t->dtype == dts[i];
    if (!ok)
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' has dtype %s (expected %s%s)", name,
                        moe_dtype_name(t->dtype), moe_dtype_name(dts[0]),
                        n_dts > 1 ? ", or another float type" : "");
    const int64_t want[2] = {d0, d1};
    const int nd = d1 < 0 ? 1 : 2;
    if (t->ndim != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        char a[96], b[96];
        shape_text(a, sizeof a, t->ndim, t->shape);
        shape_text(b, sizeof b, nd, want);
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' has shape %s, expected %s", name, a, b);
    }
    return MOE_OK;
}

/* The group count from a scale tensor's shape (its group axis ax), which
 * gives G = K / groups: a whole number that the runtime groups divide. */
static enum moe_status group_size(struct q4_src *p, const struct moe_st_tensor *s, int ax)
{
    const int64_t ng = s->ndim == 2 ? s->shape[ax] : 0;
    if (ng <= 0 || p->K % ng || (p->K / ng) % 32)
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: tensor '%s' gives %lld groups over %lld columns: "
                        "groups of a multiple of 32 columns are supported", s->name, (long long)ng,
                        (long long)p->K);
    p->n_groups = ng;
    p->G = p->K / ng;
    return MOE_OK;
}

static const enum moe_dtype SCALE_DTS[] = {MOE_DTYPE_F16, MOE_DTYPE_BF16, MOE_DTYPE_F32};
static const enum moe_dtype I32[] = {MOE_DTYPE_I32};

/* The tensors of PREFIX as fmt stores them, checked against (N, K). */
static enum moe_status open_src(const struct moe_model *m, struct q4_src *p)
{
    const int64_t N = p->N, K = p->K;
    if (K % 32 || N % 8)
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: four-bit weight '%s' is (%lld, %lld); rows of a "
                        "multiple of 32 columns, and a multiple of 8 rows, are supported", p->prefix,
                        (long long)N, (long long)K);
    if (p->fmt == MOE_Q4_CT) {
        MOE_TRY(find(m, p->prefix, ".weight_packed", true, I32, 1, N, K / 8, &p->q));
        const struct moe_st_tensor *s;
        char name[MOE_NAME_MAX];
        snprintf(name, sizeof name, "%s.weight_scale", p->prefix);
        if (!(s = moe_safetensors_find(&m->st, name)))
            return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' is missing (a four-bit weight's scales)",
                            name);
        MOE_TRY(group_size(p, s, 1));
        MOE_TRY(find(m, p->prefix, ".weight_scale", true, SCALE_DTS, 3, N, p->n_groups, &p->s));
        MOE_TRY(find(m, p->prefix, ".weight_zero_point", false, I32, 1, N / 8, p->n_groups, &p->z));
        const struct moe_st_tensor *shape;
        static const enum moe_dtype I64[] = {MOE_DTYPE_I64, MOE_DTYPE_I32};
        MOE_TRY(find(m, p->prefix, ".weight_shape", false, I64, 2, 2, -1, &shape));
        if (shape) {
            int64_t v[2];
            for (int i = 0; i < 2; i++)
                v[i] = shape->dtype == MOE_DTYPE_I64 ? ((const int64_t *)shape->data)[i]
                                                     : ((const int32_t *)shape->data)[i];
            if (v[0] != N || v[1] != K)
                return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' says [%lld, %lld], expected "
                                "[%lld, %lld]", shape->name, (long long)v[0], (long long)v[1], (long long)N,
                                (long long)K);
        }
        return find(m, p->prefix, ".weight_g_idx", false, I32, 1, K, -1, &p->gidx);
    }
    char name[MOE_NAME_MAX];
    snprintf(name, sizeof name, "%s.scales", p->prefix);
    const struct moe_st_tensor *s = moe_safetensors_find(&m->st, name);
    if (!s) return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' is missing (a four-bit weight's scales)", name);
    MOE_TRY(group_size(p, s, 0));
    if (p->fmt == MOE_Q4_GPTQ) {
        MOE_TRY(find(m, p->prefix, ".qweight", true, I32, 1, K / 8, N, &p->q));
        MOE_TRY(find(m, p->prefix, ".g_idx", false, I32, 1, K, -1, &p->gidx));
    } else {
        MOE_TRY(find(m, p->prefix, ".qweight", true, I32, 1, K, N / 8, &p->q));
    }
    MOE_TRY(find(m, p->prefix, ".scales", true, SCALE_DTS, 3, p->n_groups, N, &p->s));
    return find(m, p->prefix, ".qzeros", true, I32, 1, p->n_groups, N / 8, &p->z);
}

/* The source group of column k. */
static inline int64_t src_group(const struct q4_src *p, int64_t k)
{
    return p->gidx ? ((const int32_t *)p->gidx->data)[k] : k / p->G;
}

static int by_group(const void *a, const void *b, void *gidx)
{
    const int32_t *g = gidx;
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g[x] != g[y]) return g[x] < g[y] ? -1 : 1;
    return (x > y) - (x < y); /* stable */
}

/* Every scale finite; g_idx (if any) in range, and, unless it is the
 * identity grouping k / G, p->perm: the columns sorted by group, each
 * group exactly G of them. */
static enum moe_status check_src(struct q4_src *p)
{
    MOE_TRY(src_tables(p));
    for (int64_t g = 0; g < p->n_groups; g++)
        for (int64_t n = 0; n < p->N; n++) {
            const float s = p->sf[n * p->n_groups + g];
            if (!isfinite(s))
                return moe_fail(MOE_ERR_FORMAT, "checkpoint: the scales of '%s' hold %g (row %lld, group %lld)",
                                p->prefix, s, (long long)n, (long long)g);
        }
    if (!p->gidx) return MOE_OK;
    const int32_t *gi = p->gidx->data;
    bool identity = true;
    for (int64_t k = 0; k < p->K; k++) {
        if (gi[k] < 0 || gi[k] >= p->n_groups)
            return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' puts column %lld in group %d (there are "
                            "%lld)", p->gidx->name, (long long)k, gi[k], (long long)p->n_groups);
        identity = identity && gi[k] == k / p->G;
    }
    if (identity) {
        p->gidx = NULL;
        return MOE_OK;
    }
    if (!(p->perm = malloc((size_t)p->K * sizeof *p->perm)))
        return moe_fail(MOE_ERR_NOMEM, "checkpoint: the column order of '%s'", p->prefix);
    for (int64_t k = 0; k < p->K; k++) p->perm[k] = (int32_t)k;
    qsort_r(p->perm, (size_t)p->K, sizeof *p->perm, by_group, (void *)gi);
    for (int64_t j = 0; j < p->K; j++)
        if (gi[p->perm[j]] != j / p->G)
            return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: tensor '%s' gives group %lld %s than %lld columns: "
                            "act-order groups of equal size are supported", p->gidx->name,
                            (long long)(j / p->G), gi[p->perm[j]] > j / p->G ? "fewer" : "more",
                            (long long)p->G);
    return MOE_OK;
}

/* Row n of p (its codes c, K of them) into dst as Q4_G32/Q4_G128 (dt),
 * its columns in p->perm's order, or dequantized to F32 in the stored
 * order. */
static void pack_row(const struct q4_src *p, int64_t n, const uint8_t *c, enum moe_dtype dt, bool to_f32, void *dst)
{
    const float *sf = p->sf + n * p->n_groups;
    const uint8_t *zf = p->zf + n * p->n_groups;
    if (to_f32) {
        float *f = dst;
        for (int64_t k = 0; k < p->K; k++) {
            const int64_t g = src_group(p, k);
            f[k] = ((float)c[k] - (float)zf[g]) * sf[g];
        }
        return;
    }
    const int64_t RG = moe_q4_group(dt);
    uint8_t codes[128];
    char *out = dst;
    for (int64_t k0 = 0; k0 < p->K; k0 += RG, out += moe_q4_group_bytes(dt)) {
        const int64_t g = k0 / p->G; /* the stored columns' groups are contiguous */
        const float s = sf[g], z = (float)zf[g];
        const uint8_t *src = c + k0;
        if (p->perm)
            for (int64_t j = 0; j < RG; j++) codes[j] = c[p->perm[k0 + j]];
        moe_q4_pack_group(out, dt, p->perm ? codes : src, s, -z * s);
    }
}

bool moe_model_q4_present(const struct moe_model *m, const char *prefix)
{
    char name[MOE_NAME_MAX];
    snprintf(name, sizeof name, "%s%s", prefix, m->cfg.q4_method == MOE_Q4_CT ? ".weight_packed" : ".qweight");
    return moe_safetensors_find(&m->st, name) != NULL;
}

enum moe_status moe_model_q4_bind(struct moe_model *m, const char *prefix, int ndim, int64_t N, int64_t K,
                                  bool to_f32, struct moe_tensor *out)
{
    if (ndim != 2)
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: '%s' is a stack of four-bit matrices; four-bit "
                        "experts are supported one tensor per expert", prefix);
    struct q4_src p = {.fmt = m->cfg.q4_method, .prefix = prefix, .N = N, .K = K,
                       .zero_add = m->cfg.q4_zero_plus_one ? 0x11111111u : 0};
    MOE_TRY(open_src(m, &p));
    enum moe_status s = check_src(&p);
    const enum moe_dtype dt = p.G % 128 == 0 && K % 128 == 0 ? MOE_DTYPE_Q4_G128 : MOE_DTYPE_Q4_G32;
    const size_t row = to_f32 ? (size_t)K * sizeof(float) : moe_dtype_row_bytes(dt, (size_t)K);
    size_t bytes;
    char *base = NULL;
    int32_t *cols = NULL;
    if (s == MOE_OK && !moe_mul_size((size_t)N, row, &bytes))
        s = moe_fail(MOE_ERR_FORMAT, "checkpoint: four-bit weight '%s' is too large", prefix);
    if (s == MOE_OK) s = moe_model_own(m, bytes, (void **)&base);
    if (s == MOE_OK && p.perm && !to_f32 && (s = moe_model_own(m, (size_t)K * sizeof *cols, (void **)&cols)) == MOE_OK)
        memcpy(cols, p.perm, (size_t)K * sizeof *cols);
    enum { RB = 64 }; /* rows unpacked at once: a multiple of 8 (AWQ's words hold 8 rows) */
    if (s != MOE_OK) {
        src_free(&p);
        return s;
    }
    bool nomem = false;
    /* blocks of rows over the threads (a matrix of 64 rows or fewer: one) */
#pragma omp parallel if (N > RB) reduction(|| : nomem)
    {
        uint8_t *codes = malloc((size_t)RB * (size_t)K);
        nomem = !codes;
#pragma omp for schedule(dynamic, 1)
        for (int64_t n0 = 0; n0 < N; n0 += RB) {
            if (!codes) continue;
            const int64_t R = N - n0 < RB ? N - n0 : RB;
            src_codes(&p, n0, R, codes);
            for (int64_t r = 0; r < R; r++)
                pack_row(&p, n0 + r, codes + r * K, dt, to_f32, base + (size_t)(n0 + r) * row);
        }
        free(codes);
    }
    src_free(&p);
    if (nomem) return moe_fail(MOE_ERR_NOMEM, "checkpoint: unpacking '%s'", prefix);
    *out = (struct moe_tensor){.dtype = to_f32 ? MOE_DTYPE_F32 : dt, .ndim = 2, .shape = {N, K}, .data = base,
                               .device = -1, .cols = cols};
    if (cols) m->cols_permuted = true;
    const struct moe_st_tensor *done[] = {p.q, p.z, p.s};
    for (int i = 0; i < 3; i++)
        if (done[i]) moe_safetensors_release(&m->st, done[i]->data, done[i]->nbytes, true);
    return MOE_OK;
}
