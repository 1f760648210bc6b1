/* attention_cuda.cuh - what the paged attention kernels of the CUDA backend
 * share (attention_cuda.cu: per-row, split over keys, for decode;
 * attention_prefill_cuda.cu: tiled, for prefill; attention_mla_cuda.cu:
 * one shared K/V row for many heads, DeepSeek's MLA): the view of one
 * layer's paged cache and of the step's batch, checked once on the host,
 * and the device helpers of the tiled kernels (finding a tile, one key
 * tile's scores and online softmax).  Each kernel's argument
 * struct derives from the view (the .cu files are C++). */
#pragma once

#include "attention/attention.h"
#include "runtime/core/status.h"

struct att_view {
    float *out;                          /* (T, Hq*Dh) */
    const float *q;                      /* (T, Hq*Dh) */
    const void *kl, *vl;                 /* the layer's (n_blocks, Hkv, B, Dh) K and V */
    const float *ksl, *vsl;              /* fp8 caches: the layer's row scales (n_blocks, Hkv, B);
                                          * else NULL */
    enum moe_dtype dt;                   /* the cache's */
    const int32_t *table, *positions;    /* (n_seqs, max_blocks), (T): device */
    int max_blocks, B, n_blocks;
    int Hq, Hkv, Dh;
    float scale;
    int window;                          /* 0 = none */
    const float *sinks;                  /* (Hq) device, or NULL (backend.h) */
};

#ifdef __CUDACC__
#include <math.h>

#include "runtime/cuda/cuda_dtype.cuh"

/* The scale of the cache row at element offset off (a multiple of Dh) of
 * a layer: its fp8 scale, or 1 (exact) for the other dtypes; a kernel
 * reads value d of the row as moe_ld(row + d) * this, the CPU's e4m3 * s
 * (kvcache.h) for fp8, the value itself otherwise. */
static __device__ __forceinline__ float att_row_scale(const float *scales, size_t off, int Dh)
{
    return scales ? scales[off / (size_t)Dh] : 1.0f;
}

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

static __device__ __forceinline__ int att_warp_min_int(int v)
{
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ int att_warp_max_int(int v)
{
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The tiled kernels cut each sequence's rows (contiguous: batch.h) into
 * tiles of tq consecutive rows, numbered sequence after sequence; grid.x is
 * an upper bound on their number (ceil(T / tq) + n_seqs: each sequence
 * wastes less than one tile), so a launch depends only on the step's
 * shape.  Tile `tile`'s sequence, first row and row count (>= 1); false
 * past the last tile.  Walks seq_start (n_seqs is small). */
static __device__ __forceinline__ bool att_find_tile(const int32_t *seq_start, int n_seqs, int tq,
                                                     int T, int tile, int *seq, int *t0, int *ntok)
{
    for (int s = 0; s < n_seqs; s++) {
        const int r0 = seq_start[s], n = seq_start[s + 1] - r0;
        const int tiles = n > 0 ? (n + tq - 1) / tq : 0;
        if (tile < tiles) {
            *seq = s;
            *t0 = r0 + tile * tq;
            if (*t0 < 0 || *t0 >= T) return false;
            *ntok = min(min(tq, n - tile * tq), T - *t0);
            return true;
        }
        tile -= tiles;
    }
    return false;
}

static __device__ __forceinline__ float att_f4_get(float4 v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* One key tile of the tiled kernels (attention_prefill_cuda.cu,
 * attention_mla_cuda.cu) for a warp's RPW query rows: the scores, then the
 * online softmax.  The tile has 32 keys k0 + j, one per lane j: its row k4
 * (n4 float4; rows padded to dhp + 4 floats, so the lanes' reads do not
 * conflict), and tile_ok[j] nonzero when it is readable.  q4: the warp's
 * query rows (RPW, n4) float4, read as broadcasts.  Row rr sees keys
 * [first[rr], last[rr]] (an unused row has an empty range).  Per row: s =
 * q.k * scale (-inf when masked), m' = max(m, warp max of s), the
 * correction corr = exp(m - m') of the accumulator, p = exp(s - m') into
 * pw (RPW, 32), l = l * corr + warp sum of p, m = m'.  A row that has seen
 * no key keeps m = -inf, corr = 1 and p = 0 (the test is warp-uniform).
 * SCORE_UNROLL is the score loop's unroll factor (each kernel's own). */
/* Row r of a tiled kernel's block (the prefill and MLA kernels; Args has
 * their q, Hq, gp and G): token i = r / gp of the block's tokens from t0
 * (ntok of them), head g = pass * gp + r % gp of KV head kh's group.
 * Lane j < ntok holds token j's key range in my_first, my_pos.  Lane 0
 * writes the row's range to s_first[r], s_last[r] (empty, 1 > 0, when the
 * row is unused), the warp widens [wlo, whi] to it, and the row's query
 * goes to sq[r * dhp ..] (zero past Dh or when unused). */
template <class Args>
static __device__ __forceinline__ void att_row_setup(const Args &a, int r, int pass, int kh, int t0, int ntok,
                                                     int Dh, int dhp, int my_first, int my_pos,
                                                     int *s_first, int *s_last, float *sq, int &wlo,
                                                     int &whi)
{
    const int lane = threadIdx.x & 31, i = r / a.gp, g = pass * a.gp + r % a.gp;
    const bool ok = i < ntok && g < a.G;
    const int fi = __shfl_sync(0xffffffffu, my_first, i & 31);
    const int po = __shfl_sync(0xffffffffu, my_pos, i & 31);
    if (lane == 0) {
        s_first[r] = ok ? fi : 1;
        s_last[r] = ok ? po : 0;
    }
    if (ok && fi <= po) {
        wlo = min(wlo, fi);
        whi = max(whi, po);
    }
    const float *qr = ok ? a.q + (size_t)(t0 + i) * a.Hq * Dh + (size_t)(kh * a.G + g) * Dh : a.q;
    for (int d = lane; d < dhp; d += 32) sq[r * dhp + d] = ok && d < Dh ? qr[d] : 0.0f;
}

template <int RPW, int SCORE_UNROLL>
static __device__ __forceinline__ void att_tile_softmax(const float4 *k4, const float4 *q4, int n4,
                                                        const int *first, const int *last,
                                                        const int *tile_ok, int k0, float scale,
                                                        float (&m)[RPW], float (&l)[RPW],
                                                        float (&corr)[RPW], float *pw, int lane)
{
    float s[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) s[rr] = 0.0f;
#pragma unroll SCORE_UNROLL
    for (int d4 = 0; d4 < n4; d4++) {
        const float4 kv = k4[d4];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const float4 qv = q4[rr * n4 + d4];
            s[rr] = fmaf(qv.x, kv.x, s[rr]);
            s[rr] = fmaf(qv.y, kv.y, s[rr]);
            s[rr] = fmaf(qv.z, kv.z, s[rr]);
            s[rr] = fmaf(qv.w, kv.w, s[rr]);
        }
    }
    const int key = k0 + lane;
    const bool kok = tile_ok[lane] != 0;
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const bool ok = kok && key >= first[rr] && key <= last[rr];
        const float sc = ok ? s[rr] * scale : -INFINITY;
        const float mn = fmaxf(m[rr], moe_warp_max(sc));
        float c = 1.0f, p = 0.0f;
        if (mn != -INFINITY) { /* warp-uniform */
            c = expf(m[rr] - mn);
            p = ok ? expf(sc - mn) : 0.0f;
        }
        l[rr] = l[rr] * c + moe_warp_sum(p);
        m[rr] = mn;
        corr[rr] = c;
        pw[rr * 32 + lane] = p;
    }
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
    v->ksl = kv->ks ? kv->ks + (size_t)p->layer * kv->layer_rows : NULL;
    v->vsl = kv->vs ? kv->vs + (size_t)p->layer * kv->layer_rows : NULL;
    v->dt = kv->dtype;
    v->table = db->block_table;
    v->positions = db->positions;
    v->max_blocks = db->max_blocks;
    v->B = kv->block_size;
    v->n_blocks = kv->part_blocks; /* the blocks stored here (kvcache.h) */
    v->Hq = p->n_heads;
    v->Hkv = p->n_kv_heads;
    v->Dh = Dh;
    v->scale = p->scale;
    v->window = p->window;
    v->sinks = p->sinks;
    return MOE_OK;
}
