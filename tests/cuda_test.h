/* cuda_test.h - what the CUDA parity suites share (test_cuda_ops.c,
 * test_cuda_attention.c): the CPU and CUDA backends opened in the suite's
 * .init (skipping without a device, never touching CUDA in Criterion's
 * parent), device buffers that start poisoned, seeded inputs, weights in
 * each dtype on both sides, and the "parity:" report line tests/gpu/run.sh
 * collects. */
#pragma once

#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "experts/experts.h"
#include "runtime/backend/backend.h"
#include "runtime/cpu/gemm.h"
#include "runtime/engine/runner.h"
#include "runtime/model/synth.h"
#include "tests/testutil.h"

static struct moe_backend cpu, gpu;

/* A configuration whose sizes cover every shape below (for reserve). */
static inline void reserve_cfg(struct moe_config *c)
{
    memset(c, 0, sizeof *c);
    c->n_layers = 2;
    c->d_model = 1024;
    c->n_heads = 32;
    c->n_kv_heads = 1;
    c->head_dim = 256;
    c->d_ff = 1024;
    c->d_shared = 0;
    c->n_experts = 128;
    c->top_k = 8;
    c->d_expert = 256;
    c->layer_moe[0] = c->layer_moe[1] = true;
}

static inline void setup(void)
{
    tu_need_cuda_device();
    cr_assert_eq(moe_backend_cpu_init(&cpu, 0), MOE_OK);
    cr_assert_eq(tu_backend_init(&gpu, "cuda"), MOE_OK, "%s", moe_last_error());
    struct moe_config c;
    reserve_cfg(&c);
    cr_assert_eq(gpu.ops->reserve(&gpu, &c, 512), MOE_OK, "%s", moe_last_error());
}

static inline void teardown(void)
{
    moe_backend_free(&gpu);
    moe_backend_free(&cpu);
}


/* ---- helpers ---- */

static inline void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    cr_assert_eq(gpu.ops->alloc(&gpu, bytes, &d), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(gpu.ops->to_device(&gpu, d, h, bytes), MOE_OK, "%s", moe_last_error());
    return d;
}

static inline void *dev_poisoned(size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    memset(h, 0xff, bytes);
    void *d = dev_copy(h, bytes);
    free(h);
    return d;
}

static inline void to_host(void *h, const void *d, size_t bytes)
{
    cr_assert_eq(gpu.ops->to_host(&gpu, h, d, bytes), MOE_OK, "%s", moe_last_error());
}

static inline float *rand_floats(size_t n, uint64_t seed, float lo, float hi)
{
    float *x = malloc(n * sizeof(float));
    tu_fill_uniform(x, n, seed, lo, hi);
    return x;
}

/* A host weight tensor of dtype dt (random in [-a, a]) and its device twin. */
struct wpair {
    struct moe_tensor h, d;
};

static inline struct wpair make_weight(enum moe_dtype dt, int64_t r, int64_t c, uint64_t seed, float a)
{
    struct wpair w;
    size_t n = (size_t)r * (size_t)(c > 0 ? c : 1);
    float *f = rand_floats(n, seed, -a, a);
    void *h = malloc(n * moe_dtype_size(dt));
    moe_convert_from_f32(h, f, dt, n);
    free(f);
    memset(&w, 0, sizeof w);
    w.h.dtype = dt;
    w.h.ndim = c > 0 ? 2 : 1;
    w.h.shape[0] = r;
    w.h.shape[1] = c;
    w.h.data = h;
    w.h.device = -1;
    w.d = w.h;
    w.d.data = dev_copy(h, n * moe_dtype_size(dt));
    w.d.device = 0;
    return w;
}

static inline void free_weight(struct wpair *w)
{
    free(w->h.data);
    gpu.ops->dealloc(&gpu, w->d.data);
}

static inline double report(const char *op, const char *dt, const char *shape, const float *x,
                     const float *ref, size_t n)
{
    double e = tu_max_rel_err(x, ref, n);
    fprintf(stderr, "parity: %-12s %-5s %-22s max rel err %.3g\n", op, dt, shape, e);
    return e;
}

static const enum moe_dtype wdts[] = {MOE_DTYPE_F32, MOE_DTYPE_BF16, MOE_DTYPE_F16};
/* max-relative tolerances: bf16/f16 GEMM inputs are rounded to the weight
 * type on the GPU (see cuda_matmul), the CPU keeps them in fp32 */
static inline double gemm_tol(enum moe_dtype dt)
{
    return dt == MOE_DTYPE_F32 ? 1e-5 : dt == MOE_DTYPE_F16 ? 4e-3 : 2e-2;
}

/* ---- experts ---- */

/* gpt-oss's expert biases (seeded, on both sides; *host and *dev to free)
 * and clamped activation with the given limit. */
static inline void gpt_oss_biases(struct moe_expert_weights *hx, struct moe_expert_weights *dx, int E, int D,
                                  int F, float limit, float **host, float **dev)
{
    const size_t n = (size_t)E * (2 * F + D);
    float *bias = rand_floats(n, 65, -0.3f, 0.3f), *dbias = (float *)dev_copy(bias, n * sizeof(float));
    const struct moe_tensor b = {MOE_DTYPE_F32, 2, {E, F}, NULL, -1, NULL};
    hx->b_gate = hx->b_up = b, hx->b_down = b;
    hx->b_down.shape[1] = D;
    hx->b_gate.data = bias, hx->b_up.data = bias + (size_t)E * F, hx->b_down.data = bias + 2 * (size_t)E * F;
    dx->b_gate = hx->b_gate, dx->b_up = hx->b_up, dx->b_down = hx->b_down;
    dx->b_gate.data = dbias, dx->b_up.data = dbias + (size_t)E * F, dx->b_down.data = dbias + 2 * (size_t)E * F;
    hx->alpha = dx->alpha = 1.702f;
    hx->limit = dx->limit = limit;
    *host = bias;
    *dev = dbias;
}

/* The experts op on both backends over hx (host weights) and dx (their
 * device twin) for T tokens routed K ways by seeded logits: one "parity:"
 * line (op experts_grp when the backend's grouped path ran, per grouped),
 * and the worst relative error. */
static inline double experts_parity(const struct moe_expert_weights *hx, const struct moe_expert_weights *dx,
                                    int T, int E, int K, int D, int F, const char *what, const char *shape)
{
    const size_t TK = (size_t)T * K;
    float *lg = rand_floats((size_t)T * E, 63, -2, 2);
    int32_t *ids = malloc(TK * sizeof(int32_t));
    float *w = malloc(TK * sizeof(float));
    const struct moe_route rt = {E, K, true, false, NULL, 1, 1, 1.0f, false};
    cr_assert_eq(cpu.ops->route(&cpu, ids, w, lg, T, &rt), MOE_OK);
    int32_t *hbuf = malloc((2 * (size_t)E + 1 + 2 * TK) * sizeof(int32_t));
    struct moe_dispatch hp = {hbuf, hbuf + E, hbuf + 2 * E + 1, hbuf + 2 * E + 1 + TK, 0, 0, 0};
    cr_assert_eq(cpu.ops->dispatch(&cpu, &hp, ids, T, K, E), MOE_OK);
    int32_t *dbuf = (int32_t *)dev_copy(hbuf, (2 * (size_t)E + 1 + 2 * TK) * sizeof(int32_t));
    struct moe_dispatch dp = {dbuf, dbuf + E, dbuf + 2 * E + 1, dbuf + 2 * E + 1 + TK, 0, 0, 0};
    float *x = rand_floats((size_t)T * D, 64, -1, 1);
    float *ref = malloc((size_t)T * D * sizeof(float)), *got = malloc((size_t)T * D * sizeof(float));
    struct moe_expert_ws hws = {malloc(TK * D * sizeof(float)), malloc(TK * F * sizeof(float)),
                                malloc(TK * F * sizeof(float)), malloc(TK * D * sizeof(float))};
    struct moe_expert_ws dws = {dev_poisoned(TK * D * sizeof(float)), dev_poisoned(TK * F * sizeof(float)),
                                dev_poisoned(TK * F * sizeof(float)), dev_poisoned(TK * D * sizeof(float))};
    float *sc = malloc((size_t)(D > F ? D : F) * omp_get_max_threads() * sizeof(float));
    /* the CPU op sizes its scratch in prepare_model: call the module */
    moe_experts_ffn_cpu(ref, x, &hp, w, hx, &hws, T, K, D, F, E, sc);
    float *dxin = (float *)dev_copy(x, (size_t)T * D * sizeof(float));
    float *dw = (float *)dev_copy(w, TK * sizeof(float));
    float *dout = (float *)dev_poisoned((size_t)T * D * sizeof(float));
    cr_assert_eq(gpu.ops->experts(&gpu, dout, dxin, &dp, dw, dx, &dws, T, K, D, F, E), MOE_OK, "%s",
                 moe_last_error());
    to_host(got, dout, (size_t)T * D * sizeof(float));
    const double e = report(what, moe_dtype_name(hx->dtype), shape, got, ref,
                            (size_t)T * D);
    void *dbufs[] = {dbuf, dws.xe, dws.g, dws.u, dws.ye, dxin, dw, dout};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) gpu.ops->dealloc(&gpu, dbufs[i]);
    free(hws.xe), free(hws.g), free(hws.u), free(hws.ye);
    free(lg), free(ids), free(w), free(hbuf), free(x), free(ref), free(got), free(sc);
    return e;
}

/* ---- dense ops ---- */
