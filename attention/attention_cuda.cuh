/* attention_cuda.cuh - what the two paged attention kernels of the CUDA
 * backend share (attention_cuda.cu: per-row, split over keys, for decode;
 * attention_prefill_cuda.cu: tiled, for prefill): the view of one layer's
 * paged cache and of the step's batch, checked once on the host.  Each
 * kernel's argument struct derives from it (the .cu files are C++). */
#pragma once

#include "attention/attention.h"
#include "runtime/status.h"

struct att_view {
    float *out;                          /* (T, Hq*Dh) */
    const float *q;                      /* (T, Hq*Dh) */
    const void *kl, *vl;                 /* the layer's (n_blocks, B, Hkv, Dh) K and V */
    enum moe_dtype dt;                   /* the cache's */
    const int32_t *table, *positions;    /* (n_seqs, max_blocks), (T): device */
    int max_blocks, B, n_blocks;
    int Hq, Hkv, Dh;
    float scale;
    int window;                          /* 0 = none */
    const float *sinks;                  /* (Hq) device, or NULL (backend.h) */
};

#ifdef __CUDACC__
/* Folds head h's sink logit into a finished online softmax of running max
 * m and sum *l: *l gains exp(sink) on the same scale, and the returned
 * factor rescales the accumulator (out = acc * factor / *l). */
static __device__ __forceinline__ float att_fold_sink(float sink, float m, float *l)
{
    const float M = fmaxf(m, sink);
    const float c = m == -INFINITY ? 0.0f : expf(m - M);
    *l = *l * c + expf(sink - M);
    return c;
}
#endif

/* Checks p against the cache (heads, head dim at most max_dh, layer) and
 * fills v for layer p->layer of kv and the device batch db. */
static inline enum moe_status att_view_init(struct att_view *v, float *out, const float *q,
                                            const struct moe_kvcache *kv,
                                            const struct moe_batch *db,
                                            const struct moe_attn_params *p, int max_dh)
{
    const int Dh = p->head_dim;
    if (p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads != 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "attention: %d query heads over %d KV heads",
                        p->n_heads, p->n_kv_heads);
    if (Dh <= 0 || Dh > max_dh)
        return moe_fail(MOE_ERR_UNSUPPORTED, "CUDA attention: head dim %d (at most %d)", Dh,
                        max_dh);
    if (p->layer < 0 || p->layer >= kv->n_layers || kv->n_kv_heads != p->n_kv_heads ||
        kv->head_dim != Dh)
        return moe_fail(MOE_ERR_INVALID_ARG, "attention: cache shape does not match layer %d",
                        p->layer);
    const size_t es = moe_dtype_size(kv->dtype);
    v->out = out;
    v->q = q;
    v->kl = (const char *)kv->k + (size_t)p->layer * kv->layer_elems * es;
    v->vl = (const char *)kv->v + (size_t)p->layer * kv->layer_elems * es;
    v->dt = kv->dtype;
    v->table = db->block_table;
    v->positions = db->positions;
    v->max_blocks = db->max_blocks;
    v->B = kv->block_size;
    v->n_blocks = kv->n_blocks;
    v->Hq = p->n_heads;
    v->Hkv = p->n_kv_heads;
    v->Dh = Dh;
    v->scale = p->scale;
    v->window = p->window;
    v->sinks = p->sinks;
    return MOE_OK;
}
