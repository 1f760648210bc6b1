/* backend_ops.h - what tests/test_backend_ops.c and test_backend_ops_cuda.c
 * build their cases from (backend_ops_cases.h).
 *
 * A side is one backend opened for the test: cpu-ref (the reference every
 * case is compared with) or a backend under test.  A case gives both sides
 * the same host inputs through the side's own memory (be->ops->alloc,
 * to_device, to_host, so the same code drives CUDA), weights laid out as
 * that backend takes them after prepare_model (bf16 matrices in panels on
 * the fast CPU backend with panels on, MXFP4 / FP8_B128 / Q8_0 as planes
 * and expert stacks on CUDA: runtime/backend/backend.h), and compares
 * each output elementwise, |x - ref| <= atol*S + rtol*|ref| with S the
 * largest finite |ref| of the output, printing one line per output with
 * its worst element. */
#pragma once

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts/experts.h"
#include "runtime/backend/backend.h"
#include "runtime/cpu/gemm_fast.h"
#include "tests/testutil.h"

enum { SIDE_BUFS = 64 };

struct side {
    char label[32];       /* "cpu-ref", "cpu avx2 panels", "cuda" */
    struct moe_backend be;
    bool panels;          /* bf16 2-D weights of even width handed over in panels */
    bool cuda;            /* block formats as planes; buffers start poisoned */
    void *mem[SIDE_BUFS]; /* the case's backend buffers */
    int n_mem;
    void *host[SIDE_BUFS]; /* the case's host memory the backend reads (panels, expert tables) */
    int n_host;
};

/* |x - ref| <= atol * S + rtol * |ref|, S the largest finite |ref|. */
struct tol {
    double atol, rtol;
};
static const struct tol EXACT = {0, 0};

/* Weights the cases hand over in Q8_0 are quantized weights as --quantize
 * q8_0 makes them, so each backend under test is opened with that option
 * (CUDA's reserve sizes its Q8_0 widening buffers by it; a CPU backend
 * reads it only at prepare_model, of a model with no weights here).  The
 * one place the test sets the quantization knob. */
static void use_q8_0_weights(struct moe_backend_opts *o) { o->quant = MOE_QUANT_Q8_0; }

/* ---- memory of one case ---- */

static void *side_track_host(struct side *s, void *p)
{
    cr_assert(p && s->n_host < SIDE_BUFS);
    return s->host[s->n_host++] = p;
}

/* New backend memory holding the bytes h (or, h NULL, poison: all bytes
 * 0xff, NaN as floats, so an element an op forgets shows). */
static void *side_put(struct side *s, const void *h, size_t bytes)
{
    void *d = NULL;
    cr_assert(s->n_mem < SIDE_BUFS);
    cr_assert_eq(s->be.ops->alloc(&s->be, bytes ? bytes : 1, &d), MOE_OK, "%s", moe_last_error());
    s->mem[s->n_mem++] = d;
    if (!h) {
        void *p = malloc(bytes ? bytes : 1);
        memset(p, 0xff, bytes);
        cr_assert_eq(s->be.ops->to_device(&s->be, d, p, bytes), MOE_OK, "%s", moe_last_error());
        free(p);
    } else if (bytes) {
        cr_assert_eq(s->be.ops->to_device(&s->be, d, h, bytes), MOE_OK, "%s", moe_last_error());
    }
    return d;
}

static void side_get(struct side *s, void *h, const void *d, size_t bytes)
{
    cr_assert_eq(s->be.ops->to_host(&s->be, h, d, bytes), MOE_OK, "%s", moe_last_error());
}

/* Frees the case's memory. */
static void side_release(struct side *s)
{
    for (int i = 0; i < s->n_mem; i++) s->be.ops->dealloc(&s->be, s->mem[i]);
    for (int i = 0; i < s->n_host; i++) free(s->host[i]);
    s->n_mem = s->n_host = 0;
}

/* ---- inputs ---- */

static float *rand_floats(size_t n, uint64_t seed, float lo, float hi)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    tu_fill_uniform(x, n, seed, lo, hi);
    return x;
}

/* rows x K values of dtype t in row layout (new host memory): F32, F16 and
 * BF16 from uniform [-a, a); Q8_0 quantized from those; MXFP4 and FP8_B128
 * blocks of random codes with scales that keep values near [-a, a]
 * (never a NaN code or scale). */
static void *random_rows(enum moe_dtype t, size_t rows, size_t K, uint64_t seed, float a)
{
    const size_t bytes = rows * moe_dtype_row_bytes(t, K);
    unsigned char *w = malloc(bytes);
    uint64_t s = seed;
    if (t == MOE_DTYPE_MXFP4) {
        for (size_t b = 0; b < bytes; b += MOE_MXFP4_BYTES) {
            w[b] = (unsigned char)(123 + tu_rand_u64(&s) % 3); /* 2^-4 .. 2^-2, codes up to 6 */
            for (int j = 1; j < MOE_MXFP4_BYTES; j++) w[b + j] = (unsigned char)tu_rand_u64(&s);
        }
    } else if (t == MOE_DTYPE_FP8_B128) {
        for (size_t b = 0; b < bytes; b += MOE_FP8_BYTES) {
            const float sc = tu_rand_uniform(&s, 0.5f, 1.0f) * a / 448.0f;
            memcpy(w + b, &sc, 4);
            for (int j = 4; j < MOE_FP8_BYTES; j++) {
                unsigned char c = (unsigned char)tu_rand_u64(&s);
                w[b + j] = (c & 0x7f) == 0x7f ? (unsigned char)(c ^ 1) : c; /* no NaN */
            }
        }
    } else if (t == MOE_DTYPE_Q4_G32 || t == MOE_DTYPE_Q4_G128) {
        /* per group: d in [a/16, a/8], m in [-8d, -7d] (asymmetric codes
         * around zero), then random codes */
        const size_t gb = moe_q4_group_bytes(t);
        for (size_t b = 0; b < bytes; b += gb) {
            const float d = tu_rand_uniform(&s, 0.5f, 1.0f) * a / 8.0f, m = -tu_rand_uniform(&s, 7.0f, 8.0f) * d;
            memcpy(w + b, &d, 4);
            memcpy(w + b + 4, &m, 4);
            for (size_t j = MOE_Q4_HEAD; j < gb; j++) w[b + j] = (unsigned char)tu_rand_u64(&s);
        }
    } else {
        float *f = rand_floats(rows * K, seed, -a, a);
        if (t == MOE_DTYPE_Q4_1) /* --quantize q4's rows */
            for (size_t r = 0; r < rows; r++)
                cr_assert(moe_quantize_row_q4_1(w + r * moe_dtype_row_bytes(t, K), f + r * K, K));
        else if (t == MOE_DTYPE_Q8_0)
            for (size_t r = 0; r < rows; r++)
                cr_assert(moe_quantize_row_q8_0(w + r * moe_dtype_row_bytes(t, K), f + r * K, K));
        else
            moe_convert_from_f32(w, f, t, rows * K);
        free(f);
    }
    return w;
}

/* ---- weights as each backend takes them ---- */

static bool side_wants_panels(const struct side *s, enum moe_dtype t, int K)
{
    return s->panels && t == MOE_DTYPE_BF16 && K % 2 == 0;
}

/* w (N, K) bf16 in panels, in host memory s owns for the case (64-byte
 * aligned, as the backend's arena). */
static void *side_panels(struct side *s, const void *w, int N, int K)
{
    size_t bytes;
    cr_assert(moe_gemm_panel_bytes(N, K, &bytes), "panel size of (%d, %d)", N, K);
    void *p = side_track_host(s, aligned_alloc(64, (bytes + 63) / 64 * 64));
    moe_gemm_pack_panels(p, w, N, K);
    return p;
}

/* The matrix w (N, K) of dtype t in host rows as s takes it: bf16 in panels
 * where the fast backend packs (prepare_model's rule: K even), block
 * formats as planes on CUDA, else the rows. */
static struct moe_tensor side_matrix(struct side *s, const void *w, enum moe_dtype t, int N, int K)
{
    struct moe_tensor m = {.dtype = t, .ndim = 2, .shape = {N, K}, .device = s->cuda ? 0 : -1, .cols = NULL};
    const size_t rows_bytes = (size_t)N * moe_dtype_row_bytes(t, (size_t)K);
    if (side_wants_panels(s, t, K)) {
        m.dtype = MOE_DTYPE_BF16_PANEL;
        m.data = side_panels(s, w, N, K);
    } else if (s->cuda && moe_dtype_planes(t)) {
        const size_t vb = moe_planes_values_bytes(t, (size_t)N, (size_t)K);
        const size_t sb = moe_planes_scales_bytes(t, (size_t)N, (size_t)K);
        char *p = malloc(vb + sb);
        moe_planes_from_rows(t, w, (size_t)N, (size_t)K, p, p + vb);
        m.data = side_put(s, p, vb + sb);
        free(p);
    } else {
        m.data = side_put(s, w, rows_bytes);
    }
    return m;
}

/* A vector (n) of dtype t (biases, norm weights), uploaded as it is. */
static struct moe_tensor side_vector(struct side *s, const void *v, enum moe_dtype t, int n)
{
    return (struct moe_tensor){.dtype = t, .ndim = 1, .shape = {n},
                               .data = side_put(s, v, (size_t)n * moe_dtype_size(t)),
                               .device = s->cuda ? 0 : -1, .cols = NULL};
}

/* A layer's E experts in host rows: gu (E, 2F, D) (each expert's F gate
 * rows, then its F up rows), dn (E, D, F); optional gpt-oss biases
 * (E*(2F + D) floats: gate (E, F), up (E, F), down (E, D)). */
struct host_experts {
    enum moe_dtype dt;
    int E, D, F;
    const void *gu, *dn;
    const float *bias; /* or NULL */
    float alpha, limit;
};

/* Matrix i of a stack of n matrices of R rows of K in planes: values of
 * all n, then their scales (runtime/core/tensor.h). */
static void place_planes(char *stack, int i, int n, const void *rows, enum moe_dtype t, size_t R, size_t K)
{
    const size_t vb = moe_planes_values_bytes(t, R, K), sb = moe_planes_scales_bytes(t, R, K);
    moe_planes_from_rows(t, rows, R, K, stack + (size_t)i * vb, stack + (size_t)n * vb + (size_t)i * sb);
}

/* h as s takes it: CUDA's stacks (planes for block formats), panels on the
 * fast backend, the stacked rows otherwise (the CPU backends read any
 * per-expert pointers). */
static struct moe_expert_weights side_experts(struct side *s, const struct host_experts *h)
{
    const int E = h->E, D = h->D, F = h->F;
    const void **tab = side_track_host(s, malloc(3 * (size_t)E * sizeof(void *)));
    struct moe_expert_weights x = {.dtype = h->dt, .gate = tab, .up = tab + E, .down = tab + 2 * E,
                                   .alpha = h->alpha, .limit = h->limit};
    const size_t gb = (size_t)F * moe_dtype_row_bytes(h->dt, (size_t)D); /* one (F, D) in rows */
    const size_t db = (size_t)D * moe_dtype_row_bytes(h->dt, (size_t)F); /* one (D, F) */
    if (side_wants_panels(s, h->dt, D) && F % 2 == 0) {
        x.dtype = MOE_DTYPE_BF16_PANEL;
        for (int e = 0; e < E; e++) {
            const char *g = (const char *)h->gu + 2 * (size_t)e * gb;
            x.gate[e] = side_panels(s, g, F, D);
            x.up[e] = side_panels(s, g + gb, F, D);
            x.down[e] = side_panels(s, (const char *)h->dn + (size_t)e * db, D, F);
        }
    } else if (s->cuda && moe_dtype_planes(h->dt)) {
        const size_t vg = moe_planes_values_bytes(h->dt, (size_t)F, (size_t)D);
        const size_t vd = moe_planes_values_bytes(h->dt, (size_t)D, (size_t)F);
        char *gu = malloc(2 * (size_t)E * gb), *dn = malloc((size_t)E * db);
        for (int e = 0; e < E; e++) {
            const char *g = (const char *)h->gu + 2 * (size_t)e * gb;
            place_planes(gu, 2 * e, 2 * E, g, h->dt, (size_t)F, (size_t)D);
            place_planes(gu, 2 * e + 1, 2 * E, g + gb, h->dt, (size_t)F, (size_t)D);
            place_planes(dn, e, E, (const char *)h->dn + (size_t)e * db, h->dt, (size_t)D, (size_t)F);
        }
        char *dgu = side_put(s, gu, 2 * (size_t)E * gb), *ddn = side_put(s, dn, (size_t)E * db);
        for (int e = 0; e < E; e++) {
            x.gate[e] = dgu + 2 * (size_t)e * vg;
            x.up[e] = dgu + (2 * (size_t)e + 1) * vg;
            x.down[e] = ddn + (size_t)e * vd;
        }
        free(gu), free(dn);
    } else {
        char *dgu = side_put(s, h->gu, 2 * (size_t)E * gb), *ddn = side_put(s, h->dn, (size_t)E * db);
        for (int e = 0; e < E; e++) {
            x.gate[e] = dgu + 2 * (size_t)e * gb;
            x.up[e] = dgu + (2 * (size_t)e + 1) * gb;
            x.down[e] = ddn + (size_t)e * db;
        }
    }
    if (h->bias) {
        float *b = side_put(s, h->bias, (size_t)E * (2 * F + D) * sizeof(float));
        const int dev = s->cuda ? 0 : -1;
        x.b_gate = (struct moe_tensor){MOE_DTYPE_F32, 2, {E, F}, b, dev, NULL};
        x.b_up = (struct moe_tensor){MOE_DTYPE_F32, 2, {E, F}, b + (size_t)E * F, dev, NULL};
        x.b_down = (struct moe_tensor){MOE_DTYPE_F32, 2, {E, D}, b + 2 * (size_t)E * F, dev, NULL};
    }
    return x;
}

/* ---- comparison and the report line ---- */

/* Prints one report line: the backend, op, dtype and shape, then the
 * outcome (one write, so lines of tests running in parallel stay whole). */
static void report_line(const struct side *s, const char *op, const char *dt, const char *shape,
                        const char *outcome)
{
    fprintf(stderr, "backend-ops: %-16s %-13s %-10s %-38s %s\n", s->label, op, dt, shape, outcome);
}

/* Compares x with ref (n floats) under t, NaN matching NaN; prints the
 * line with the worst element (the largest error as a fraction of its
 * limit; the first that differs when t is EXACT) and returns whether all
 * are within. */
static bool report_close(const struct side *s, const char *op, const char *dt, const char *shape,
                         const float *x, const float *ref, size_t n, struct tol t)
{
    double S = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs(ref[i]) > S) S = fabs(ref[i]);
    size_t worst = 0;
    double worst_ratio = -1, worst_d = 0, worst_lim = 0;
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        const bool nan_x = isnan(x[i]), nan_r = isnan(ref[i]);
        double d = nan_x && nan_r ? 0 : nan_x || nan_r ? INFINITY
                   : x[i] == ref[i] ? 0 : fabs((double)x[i] - (double)ref[i]);
        if (isnan(d)) d = INFINITY; /* inf - inf of the same sign is equal above */
        /* a non-finite ref admits only itself */
        const double lim = isfinite(ref[i]) ? t.atol * S + t.rtol * fabs((double)ref[i]) : 0;
        if (!(d <= lim)) ok = false;
        const double ratio = d == 0 ? 0 : lim > 0 ? d / lim : INFINITY; /* of the limit */
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            worst = i;
            worst_d = d;
            worst_lim = lim;
        }
    }
    char out[160];
    snprintf(out, sizeof out, "worst [%6zu] got % .8g want % .8g err %.3g (tol %.3g) %s", worst,
             n ? x[worst] : 0.0, n ? ref[worst] : 0.0, worst_d, worst_lim, ok ? "ok" : "FAIL");
    report_line(s, op, dt, shape, out);
    return ok;
}

/* Exact comparison of n int32 values (ids, plans, counts). */
static bool report_same_ints(const struct side *s, const char *op, const char *shape, const int32_t *x,
                             const int32_t *ref, size_t n)
{
    size_t i = 0;
    while (i < n && x[i] == ref[i]) i++;
    char out[160];
    if (i == n) snprintf(out, sizeof out, "all %zu identical, exact ok", n);
    else snprintf(out, sizeof out, "worst [%6zu] got %d want %d (the first that differs) exact FAIL", i, x[i], ref[i]);
    report_line(s, op, "I32", shape, out);
    return i == n;
}

/* Exact comparison of bytes (a KV cache's storage, synthetic weights). */
static bool report_same_bytes(const struct side *s, const char *op, const char *dt, const char *shape,
                              const void *x, const void *ref, size_t n)
{
    const unsigned char *a = x, *b = ref;
    size_t i = 0;
    while (i < n && a[i] == b[i]) i++;
    char out[160];
    if (i == n) snprintf(out, sizeof out, "all %zu bytes identical, exact ok", n);
    else snprintf(out, sizeof out, "worst [%6zu] got 0x%02x want 0x%02x (the first byte that differs) exact FAIL", i,
                  a[i], b[i]);
    report_line(s, op, dt, shape, out);
    return i == n;
}

/* The line of a case the backend cannot run: its table leaves the entry NULL. */
static void report_skipped(const struct side *s, const char *op, const char *dt, const char *shape)
{
    char out[96];
    snprintf(out, sizeof out, "skipped: the backend's table has no %s", op);
    report_line(s, op, dt, shape, out);
}
