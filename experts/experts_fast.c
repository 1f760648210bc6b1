/* experts_fast.c - the fast grouped expert FFN (see experts.h for what it
 * computes; the reference is experts_cpu.c).
 *
 * One parallel region per layer's expert phase, in four work-shared loops:
 *   1. gather the T*K routed rows in expert order (where every gate and
 *      up product reads inputs split into bf16 parts, an AMX set over bf16
 *      panels, the rows are split straight from x instead);
 *   2. gate and up: work items are (active expert, slice of F); an item
 *      runs the register-blocked kernel over all of its expert's rows for
 *      the gate rows and then the up rows of its slice (the input rows are
 *      still in cache for the second), then SwiGLU on the slice;
 *   3. down: items (active expert, slice of D) over the SwiGLU rows;
 *   4. combine in token order, k = 0..K-1: the reference's own loop
 *      (moe_experts_combine_cpu), work-shared.
 * Slices are sized so there are at least 16 items per thread even when only
 * K experts are active (decode), so every core streams weights; each item
 * reads its weight slice once for all the expert's rows.  The sum order of
 * every output is the fast kernel's, independent of the slicing, so results
 * do not depend on the thread count or on other rows of the batch.
 *
 * moe_experts_ffn_stacks_cpu runs steps 2 and 3 over some experts of a
 * layer held in the CUDA backend's stacked layout in host memory (an
 * offloaded layer's missed experts, computed on the CPU): the same items
 * and kernels, MXFP4 / FP8 / Q8_0 planes joined back into rows 16 at a time in a
 * thread's scratch (in cache) just before the kernel reads them. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "experts/experts.h"
#include "runtime/core/par.h"
#include "runtime/cpu/gemm_fast.h"

/* Slices of n outputs so that items * slices >= want, each a multiple of
 * 16 outputs (at least 16). */
static int slice_size(int n, int items, int want)
{
    int slices = (want + items - 1) / items;
    int size = (n + slices - 1) / slices;
    size = (size + 15) / 16 * 16;
    return size < 16 ? 16 : size;
}

/* The rows [n0, n1) of one weight matrix (N, Din) for a slice product:
 * rows of dtype dt at w, or, when planes, values at w and scales at ws
 * (MXFP4 / FP8_B128 / Q8_0 planes of the whole matrix), joined into tmp first. */
struct wsrc {
    const void *w, *ws;
    enum moe_dtype dt;
    bool planes;
};

#define JOIN_ROWS 16 /* plane rows joined at a time */

/* The inputs of a slice product: rows of x (ld ldx), and the same rows
 * split for the AMX kernels (moe_gemm_split_rows; xs NULL: not split). */
struct xin {
    const float *x;
    size_t ldx;
    const uint16_t *xs;
    size_t lds;
};

/* y[t*ldy + n] (n in [n0, n1), t < T) = x_t . W_n (+ b_n) by the calling
 * thread (b NULL or absent: no bias); tmp: JOIN_ROWS joined rows of Din
 * and Din floats (planes, or the reference), else unused. */
static void slice_product(enum moe_cpu_isa isa, float *y, size_t ldy, const struct xin *in, int T,
                          const struct wsrc *src, int Din, int n0, int n1, const struct moe_tensor *b,
                          void *tmp)
{
    const float *x = in->x;
    const size_t ldx = in->ldx;
    if (!src->planes && isa != MOE_CPU_ISA_REF) {
        moe_gemm_fast_rows_split(isa, y, ldy, x, ldx, in->xs, in->lds, T, src->w, src->dt, Din, n0, n1, b);
        return;
    }
    const size_t rb = moe_dtype_row_bytes(src->dt, (size_t)Din);
    const bool has_b = b && b->data;
    for (int c0 = n0; c0 < n1;) {
        /* rows in place: the whole slice; planes: JOIN_ROWS joined in tmp */
        const int c1 = src->planes && n1 - c0 > JOIN_ROWS ? c0 + JOIN_ROWS : n1;
        const char *w = (const char *)src->w + (size_t)c0 * rb;
        if (src->planes) {
            moe_rows_from_planes(src->dt, (const char *)src->w + moe_planes_values_bytes(src->dt, c0, Din),
                                 (const char *)src->ws + moe_planes_scales_bytes(src->dt, c0, Din),
                                 (size_t)(c1 - c0), (size_t)Din, tmp);
            w = tmp;
        }
        if (isa != MOE_CPU_ISA_REF) {
            /* outputs c0.. as outputs 0.. of the joined rows */
            const struct moe_tensor bv = {.dtype = has_b ? b->dtype : MOE_DTYPE_F32, .ndim = 1,
                                          .shape = {c1 - c0},
                                          .data = has_b ? (char *)b->data + (size_t)c0 * moe_dtype_size(b->dtype)
                                                        : NULL,
                                          .device = -1};
            moe_gemm_fast_rows(isa, y + c0, ldy, x, ldx, T, w, src->dt, Din, 0, c1 - c0, &bv);
        } else {
            /* the reference's products: each weight row widened, then dotted in k order */
            float *wf = (float *)((char *)tmp + (size_t)JOIN_ROWS * rb), bn = 0.0f;
            for (int n = c0; n < c1; n++) {
                moe_convert_row_f32(wf, w + (size_t)(n - c0) * rb, src->dt, (size_t)Din);
                if (has_b) moe_convert_row_f32(&bn, (const char *)b->data + (size_t)n * moe_dtype_size(b->dtype),
                                               b->dtype, 1);
                for (int t = 0; t < T; t++) {
                    const float *xt = x + (size_t)t * ldx;
                    float acc = 0.0f;
                    for (int k = 0; k < Din; k++) acc += xt[k] * wf[k];
                    y[(size_t)t * ldy + n] = acc + bn;
                }
            }
        }
        c0 = c1;
    }
}

/* Gate and up over rows [f0, f1) of an expert's c rows xe (ld D) into g
 * and u (ld F), then the activation in place in g. */
static void gate_up_slice(enum moe_cpu_isa isa, float *g, float *u, const struct xin *xe, int c,
                          const struct wsrc *gate, const struct wsrc *up, const struct moe_tensor *bg,
                          const struct moe_tensor *bu, float alpha, float limit, int D, int F, int f0, int f1,
                          void *tmp)
{
    slice_product(isa, g, (size_t)F, xe, c, gate, D, f0, f1, bg, tmp);
    slice_product(isa, u, (size_t)F, xe, c, up, D, f0, f1, bu, tmp);
    for (int r = 0; r < c; r++) {
        float *gr = g + (size_t)r * F;
        const float *ur = u + (size_t)r * F;
        if (isa >= MOE_CPU_ISA_AVX2) moe_act_row_avx2(gr + f0, ur + f0, f1 - f0, alpha, limit);
        else
            for (int f = f0; f < f1; f++) gr[f] = moe_experts_act(gr[f], ur[f], alpha, limit);
    }
}

/* Act-order experts (ex->cols): each active expert's rows gathered from
 * x with their columns in its gate/up order (into ws->xe), or its
 * activations ws->g copied into ws->u in its down order (free by then: the
 * activation has read it); work-shared by expert.  down: which of the two. */
static void permuted_rows(const struct moe_expert_weights *ex, const struct moe_dispatch *plan, const float *x,
                          const struct moe_expert_ws *ws, int K, int D, int F, const int32_t *active, int na,
                          bool down)
{
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < na; i++) {
        const int e = active[i], r0 = plan->offsets[e], c = plan->counts[e];
        const int32_t *cols = ex->cols[2 * e + down];
        const int n = down ? F : D;
        for (int r = r0; r < r0 + c; r++) {
            const float *src = down ? ws->g + (size_t)r * F : x + (size_t)(plan->perm[r] / K) * D;
            float *dst = (down ? ws->u : ws->xe) + (size_t)r * n;
            if (!cols) {
                if (!down) memcpy(dst, src, (size_t)n * sizeof(float));
                continue;
            }
            for (int j = 0; j < n; j++) dst[j] = src[cols[j]];
        }
    }
}

/* Rows [r0, r1) of x (ld K) split into xs (moe_gemm_split_rows), work-shared. */
static void split_rows(enum moe_cpu_isa isa, uint16_t *xs, const float *x, int K, int r0, int r1)
{
    const size_t lds = moe_gemm_split_ld(isa, K);
#pragma omp for schedule(static)
    for (int r = r0; r < r1; r += 16)
        moe_gemm_split_rows(isa, xs, lds, x, (size_t)K, r, r + 16 < r1 ? r + 16 : r1, K);
}

/* The expert phase's work-shared loops: run by every thread of a team, or
 * alone by one thread outside any region.  xs: space for the routed rows
 * split for the AMX kernels (NULL: no expert wants them); split_only:
 * every gate and up product reads them, so the rows are split straight
 * from x (ws->xe is not written: the products do not read it). */
static void ffn_phase(enum moe_cpu_isa isa, float *out, const float *x, const struct moe_dispatch *plan,
                      const float *w, const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                      uint16_t *xs, bool split_only, int T, int K, int D, int F, const int32_t *active, int na,
                      int fs, int nf, int ds, int nd)
{
    const int r0 = plan->hi > 0 ? plan->offsets[plan->lo] : 0, r1 = plan->hi > 0 ? plan->offsets[plan->hi] : T * K;
    if (ex->cols) {
        permuted_rows(ex, plan, x, ws, K, D, F, active, na, false);
    } else if (split_only) {
        const size_t lds = moe_gemm_split_ld(isa, D);
#pragma omp for schedule(static)
        for (int r = r0; r < r1; r++)
            moe_gemm_split_rows(isa, xs + (size_t)r * lds, lds, x + (size_t)(plan->perm[r] / K) * D, (size_t)D, 0,
                                1, D);
    } else {
#pragma omp for schedule(static)
        for (int r = r0; r < r1; r++)
            memcpy(ws->xe + (size_t)r * D, x + (size_t)(plan->perm[r] / K) * D, (size_t)D * sizeof(float));
    }
    if (xs && (ex->cols || !split_only)) split_rows(isa, xs, ws->xe, D, r0, r1);
    const size_t ldsd = xs ? moe_gemm_split_ld(isa, D) : 0, ldsf = xs ? moe_gemm_split_ld(isa, F) : 0;

#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < na * nf; i++) {
        const int e = active[i / nf], r0 = plan->offsets[e], c = plan->counts[e];
        const int f0 = (i % nf) * fs, f1 = f0 + fs < F ? f0 + fs : F;
        const enum moe_dtype dt = moe_expert_dtype(ex, e);
        const struct wsrc gate = {ex->gate[e], NULL, dt, false}, up = {ex->up[e], NULL, dt, false};
        struct moe_tensor vg, vu;
        const struct xin in = {ws->xe + (size_t)r0 * D, (size_t)D, xs ? xs + (size_t)r0 * ldsd : NULL, ldsd};
        gate_up_slice(isa, ws->g + (size_t)r0 * F, ws->u + (size_t)r0 * F, &in, c, &gate, &up, moe_experts_bias_row(&ex->b_gate, e, &vg),
                      moe_experts_bias_row(&ex->b_up, e, &vu), ex->alpha, ex->limit, D, F, f0, f1, NULL);
    }

    if (ex->cols) permuted_rows(ex, plan, x, ws, K, D, F, active, na, true);
    if (xs) {
        /* the activations of rows [r0, r1): each expert's from where down reads them */
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < na; i++) {
            const int e = active[i], a = plan->offsets[e], c = plan->counts[e];
            const float *src = ex->cols && ex->cols[2 * e + 1] ? ws->u : ws->g; /* as down reads them */
            for (int r = a; r < a + c; r += 16)
                moe_gemm_split_rows(isa, xs, ldsf, src, (size_t)F, r, r + 16 < a + c ? r + 16 : a + c, F);
        }
    }
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < na * nd; i++) {
        const int e = active[i / nd], r0 = plan->offsets[e], c = plan->counts[e];
        const float *act = ex->cols && ex->cols[2 * e + 1] ? ws->u : ws->g; /* permuted_rows */
        const int d0 = (i % nd) * ds, d1 = d0 + ds < D ? d0 + ds : D;
        const struct wsrc down = {ex->down[e], NULL, moe_expert_down_dtype(ex, e), false};
        struct moe_tensor vd;
        const struct xin in = {act + (size_t)r0 * F, (size_t)F, xs ? xs + (size_t)r0 * ldsf : NULL, ldsf};
        slice_product(isa, ws->ye + (size_t)r0 * D, (size_t)D, &in, c, &down, F, d0, d1,
                      moe_experts_bias_row(&ex->b_down, e, &vd), NULL);
    }

    if (plan->hi == 0) moe_experts_combine_cpu(out, ws->ye, w, plan->pos, T, K, D);
}

void moe_experts_ffn_fast(enum moe_cpu_isa isa, float *out, const float *x,
                          const struct moe_dispatch *plan, const float *w,
                          const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                          int T, int K, int D, int F, int E, int32_t *active)
{
    const int n = T * K;
    int na = 0;
    for (int e = plan->hi > 0 ? plan->lo : 0; e < (plan->hi > 0 ? plan->hi : E); e++)
        if (plan->counts[e] > 0) active[na++] = e;
    if (na == 0) return; /* expert parallelism: no rows for this rank's experts */
    const int want = 16 * omp_get_max_threads();
    const int fs = slice_size(F, na, want), ds = slice_size(D, na, want);
    const int nf = (F + fs - 1) / fs, nd = (D + ds - 1) / ds;

    uint16_t *xs = NULL;
    bool split_only = true; /* every gate and up product reads split rows (then xs is set: na > 0) */
    for (int i = 0; i < na; i++) {
        const bool gu = moe_gemm_split_wanted(isa, moe_expert_dtype(ex, active[i]));
        split_only = split_only && gu;
        if (!xs && (gu || moe_gemm_split_wanted(isa, moe_expert_down_dtype(ex, active[i])))) {
            xs = moe_gemm_split_buffer(isa, (size_t)n, D > F ? D : F);
            MOE_ASSERT(xs && "experts: out of memory for the split inputs");
        }
    }
    if (!moe_par_worth((size_t)n * D * F, 32768)) {
        ffn_phase(isa, out, x, plan, w, ex, ws, xs, split_only, T, K, D, F, active, na, fs, nf, ds, nd);
        return;
    }
#pragma omp parallel
    ffn_phase(isa, out, x, plan, w, ex, ws, xs, split_only, T, K, D, F, active, na, fs, nf, ds, nd);
}

/* Per-thread scratch of moe_experts_ffn_stacks_cpu: JOIN_ROWS joined rows
 * of the longer input width and a widened row (the reference). */
static size_t thread_scratch(const struct moe_expert_stacks *st)
{
    const int K = st->D > st->F ? st->D : st->F;
    return ((size_t)JOIN_ROWS * moe_dtype_row_bytes(st->dtype, (size_t)K) + (size_t)K * sizeof(float) + 63) /
           64 * 64;
}

size_t moe_experts_stacks_scratch_bytes(const struct moe_expert_stacks *st, int rows, int threads)
{
    size_t a, b, t;
    if (rows < 0 || threads < 1 || st->E < 1 || st->D < 1 || st->F < 1 ||
        !moe_mul_size((size_t)rows, 2 * (size_t)st->F, &a) || !moe_mul_size(a, sizeof(float), &a) ||
        !moe_mul_size((size_t)threads, thread_scratch(st), &b) || (t = a + b) < a ||
        (t += ((size_t)st->E + 1) * sizeof(int32_t)) < a)
        return 0;
    return t;
}

/* The sources of expert e's gate, up and down matrices in the stacks. */
static void stack_sources(const struct moe_expert_stacks *st, int e, struct wsrc *g, struct wsrc *u,
                          struct wsrc *d)
{
    const enum moe_dtype dt = st->dtype;
    const size_t D = (size_t)st->D, F = (size_t)st->F, E = (size_t)st->E;
    const char *gu = st->gu, *dn = st->dn;
    if (moe_dtype_planes(dt)) {
        /* values of gate 2e, up 2e + 1 and down e, then the scales alike */
        const size_t vb = moe_planes_values_bytes(dt, F, D), sb = moe_planes_scales_bytes(dt, F, D);
        *g = (struct wsrc){gu + 2 * e * vb, gu + 2 * E * vb + 2 * e * sb, dt, true};
        *u = (struct wsrc){gu + (2 * e + 1) * vb, gu + 2 * E * vb + (2 * e + 1) * sb, dt, true};
        *d = (struct wsrc){dn + e * vb, dn + E * vb + e * sb, dt, true};
        return;
    }
    const size_t mat = F * D * moe_dtype_size(dt);
    *g = (struct wsrc){gu + 2 * e * mat, NULL, dt, false};
    *u = (struct wsrc){gu + (2 * e + 1) * mat, NULL, dt, false};
    *d = (struct wsrc){dn + e * mat, NULL, dt, false};
}

void moe_experts_ffn_stacks_cpu(enum moe_cpu_isa isa, float *y, const float *xe, const int32_t *counts,
                                const int32_t *list, int n, const struct moe_expert_stacks *st, bool down_bias,
                                int threads, void *scratch)
{
    const int D = st->D, F = st->F;
    int rows = 0;
    for (int i = 0; i < n; i++) rows += counts[list[i]];
    if (rows == 0) return;
    /* scratch: g and u (rows, F), the threads' join space, then each
     * listed expert's first row */
    float *g = scratch, *u = g + (size_t)rows * F;
    char *tmp0 = (char *)(u + (size_t)rows * F);
    const size_t tstride = thread_scratch(st);
    int32_t *at = (int32_t *)(tmp0 + (size_t)threads * tstride);
    at[0] = 0;
    for (int i = 0; i < n; i++) at[i + 1] = at[i] + counts[list[i]];
    const int want = 16 * threads;
    const int fs = slice_size(F, n, want), ds = slice_size(D, n, want);
    const int nf = (F + fs - 1) / fs, nd = (D + ds - 1) / ds;

#pragma omp parallel num_threads(threads) if ((size_t)rows * D * F > 32768)
    {
        void *tmp = tmp0 + (size_t)omp_get_thread_num() * tstride;
#pragma omp for schedule(dynamic, 1)
        for (int j = 0; j < n * nf; j++) {
            const int i = j / nf, e = list[i], f0 = (j % nf) * fs, f1 = f0 + fs < F ? f0 + fs : F;
            struct wsrc gate, up, down;
            struct moe_tensor vg, vu;
            stack_sources(st, e, &gate, &up, &down);
            const struct xin in = {xe + (size_t)at[i] * D, (size_t)D, NULL, 0};
            gate_up_slice(isa, g + (size_t)at[i] * F, u + (size_t)at[i] * F, &in, counts[e], &gate, &up, moe_experts_bias_row(&st->b_gate, e, &vg),
                          moe_experts_bias_row(&st->b_up, e, &vu),
                          st->alpha, st->limit, D, F, f0, f1, tmp);
        }

#pragma omp for schedule(dynamic, 1)
        for (int j = 0; j < n * nd; j++) {
            const int i = j / nd, e = list[i], d0 = (j % nd) * ds, d1 = d0 + ds < D ? d0 + ds : D;
            struct wsrc gate, up, down;
            struct moe_tensor vd;
            stack_sources(st, e, &gate, &up, &down);
            const struct xin in = {g + (size_t)at[i] * F, (size_t)F, NULL, 0};
            slice_product(isa, y + (size_t)at[i] * D, (size_t)D, &in, counts[e], &down, F, d0, d1, down_bias ? moe_experts_bias_row(&st->b_down, e, &vd) : NULL, tmp);
        }
    }
}
