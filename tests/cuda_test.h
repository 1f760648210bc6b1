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
#include "runtime/backend.h"
#include "runtime/gemm.h"
#include "runtime/runner.h"
#include "runtime/synth.h"
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
    char why[256] = "";
    if (moe_cuda_device_count(why, sizeof why) == 0) cr_skip_test("no CUDA device: %s", why);
    cr_assert_eq(moe_backend_cpu_init(&cpu, 0), MOE_OK);
    cr_assert_eq(moe_backend_cuda_init(&gpu, 0), MOE_OK, "%s", moe_last_error());
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

/* ---- dense ops ---- */
