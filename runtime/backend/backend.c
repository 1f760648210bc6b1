/* backend.c - backend selection.  The choice is made here, once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend.h"
#include "runtime/backend/backend_impl.h"

#ifndef MOERUN_HAVE_CUDA
int moe_cuda_device_count(char *why, size_t why_len)
{
    if (why) snprintf(why, why_len, "moerun was built without CUDA");
    return 0;
}

int64_t moe_cuda_graph_replays(const struct moe_backend *be) { return 0; }
int64_t moe_cuda_mma_expert_calls(const struct moe_backend *be) { return 0; }

void moe_cuda_offload_stats(const struct moe_backend *be, struct moe_offload_stats *st)
{
    (void)be;
    memset(st, 0, sizeof *st);
}

enum moe_status moe_backend_cuda_open(struct moe_backend *be, const struct moe_backend_opts *o)
{
    memset(be, 0, sizeof *be);
    return moe_fail(MOE_ERR_UNSUPPORTED, "moerun was built without CUDA");
}
#endif

void moe_backend_opts_defaults(struct moe_backend_opts *o)
{
    memset(o, 0, sizeof *o);
    o->cpu_isa_max = MOE_CPU_ISA_DEFAULT_CAP;
    o->cpu_panels = true;
    o->prefill_attn = MOE_PREFILL_ATTN_TILED;
    o->expert_kernels = MOE_EXPERT_KERNELS_CUBLAS;
}

enum moe_status moe_backend_cuda_init(struct moe_backend *be, int device)
{
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.device = device;
    return moe_backend_cuda_open(be, &o);
}

enum moe_status moe_backend_cpu_init(struct moe_backend *be, int n_threads)
{
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.n_threads = n_threads;
    return moe_backend_init(be, "cpu-ref", &o);
}

enum moe_status moe_backend_cpu_fast_init(struct moe_backend *be, int n_threads)
{
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.n_threads = n_threads;
    return moe_backend_init(be, "cpu", &o);
}

static enum moe_status open_named(struct moe_backend *be, const char *name,
                                   const struct moe_backend_opts *o)
{
    if (!strcmp(name, "cpu")) return moe_backend_cpu_open(be, true, o);
    if (!strcmp(name, "cpu-ref")) return moe_backend_cpu_open(be, false, o);
    if (!strcmp(name, "cuda") || !strcmp(name, "auto")) {
        char why[256] = "";
        int n = moe_cuda_device_count(why, sizeof why);
        if (!strcmp(name, "cuda")) {
            if (n == 0) return moe_fail(MOE_ERR_DEVICE, "no CUDA device: %s", why);
            return moe_backend_cuda_open(be, o);
        }
        if (n == 0) {
            fprintf(stderr, "moerun: no CUDA device (%s); using the CPU backend\n", why);
            return moe_backend_cpu_open(be, true, o);
        }
        if (moe_backend_cuda_open(be, o) == MOE_OK) return MOE_OK;
        fprintf(stderr, "moerun: the CUDA device could not be used (%s); using the CPU backend\n",
                moe_last_error());
        return moe_backend_cpu_open(be, true, o);
    }
    return moe_fail(MOE_ERR_INVALID_ARG,
                    "unknown backend '%s' (choose cpu, cpu-ref, cuda or auto)", name);
}

enum moe_status moe_backend_init(struct moe_backend *be, const char *name,
                                 const struct moe_backend_opts *o)
{
    struct moe_backend_opts def;
    if (!o) {
        moe_backend_opts_defaults(&def);
        o = &def;
    }
    memset(be, 0, sizeof *be);
    MOE_TRY(open_named(be, name, o));
    be->quant = o->quant;
    if (o->expert_quant) { /* a copy the backend owns */
        size_t n;
        uint8_t *p = NULL;
        if (o->expert_quant_layers <= 0 || o->expert_quant_e <= 0 ||
            !moe_mul_size((size_t)o->expert_quant_layers, (size_t)o->expert_quant_e, &n) || !(p = malloc(n))) {
            moe_backend_free(be);
            return moe_fail(MOE_ERR_NOMEM, "backend: a per-expert precision plan of %d layers x %d experts",
                            o->expert_quant_layers, o->expert_quant_e);
        }
        memcpy(p, o->expert_quant, n);
        be->expert_quant = p;
        be->expert_quant_layers = o->expert_quant_layers;
        be->expert_quant_e = o->expert_quant_e;
    }
    return MOE_OK;
}

void moe_backend_free(struct moe_backend *be)
{
    if (be->ops && be->ops->destroy) be->ops->destroy(be);
    free((void *)be->expert_quant);
    memset(be, 0, sizeof *be);
}

static enum moe_status allocator_alloc(void *ctx, size_t bytes, void **out)
{
    struct moe_backend *be = ctx;
    return be->ops->alloc(be, bytes, out);
}

static void allocator_dealloc(void *ctx, void *p)
{
    struct moe_backend *be = ctx;
    be->ops->dealloc(be, p);
}

struct moe_allocator moe_backend_allocator(struct moe_backend *be)
{
    return (struct moe_allocator){be, allocator_alloc, allocator_dealloc};
}
