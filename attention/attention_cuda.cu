/* attention_cuda.cu - CUDA twins of attention/attention_cpu.c: RMSNorm,
 * RoPE, the paged K/V store (the fp8 cache's rows with their scales:
 * kv_store_fp8_kernel) and paged grouped-query attention for
 * decode-sized steps.  Steps of more than ATT_SPLIT_ROWS rows take the tiled
 * prefill kernel of attention_prefill_cuda.cu instead (the backend chooses;
 * MOERUN_CUDA_PREFILL_ATTN=rows keeps them on this kernel, to compare).
 *
 * Paged attention (per row): a block of 4 warps handles one query row t,
 * one KV head kh and one split of the row's key range (flash-decoding).
 * Each warp walks every 4th key of the split, reads its K and V row once,
 * and updates an online softmax (running max m, sum l, accumulator acc) for
 * all G = Hq/Hkv query heads of the group held in registers (lane owns
 * elements d = lane + 32*j).  The 4 warps' states are merged through shared
 * memory.  With one split the block writes the
 * output; with several it writes (acc, m, l) partials that a second kernel
 * merges in split order (each row divides its own key range into the
 * splits, so the launch depends only on the step's shape).  Rows are
 * independent: each reads its own keys (from L2 when rows of a sequence
 * share them), which suits decode; the tiled kernel shares each K/V tile
 * among 32 query rows.
 *
 * The scores are the CPU's: q.k * scale in fp32 and the softmax over keys
 * first..pos (first = pos - window + 1 with a sliding window).  Summation
 * order differs from the CPU, so results agree to rounding, not bits. */
#include <math.h>

#include "attention/attention.h"
#include "attention/attention_cuda.h"
#include "attention/attention_cuda.cuh"
#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_util.h"

#define NORM_THREADS 256
#define ATT_WARPS 4
#define MAXG 8   /* query heads per register pass; larger groups take passes */
#define MAXDH 256
#define KPS_MIN 64 /* fewest keys per split (16 per warp) */

static __global__ void rmsnorm_kernel(float *y, const float *x, const void *w, enum moe_dtype wdt,
                                      int rows, int dim, float eps)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float *xr = x + (size_t)r * dim;
    float *yr = y + (size_t)r * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    __shared__ float part[32];
    ss = moe_warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        v = moe_warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    const float inv = 1.0f / sqrtf(part[0] / (float)dim + eps);
    /* y may alias x: each element is read before it is written, by the
     * same thread, after the reduction above has finished reading */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = moe_ld(w, wdt, i) * (xr[i] * inv);
}

extern "C" enum moe_status moe_attention_rmsnorm_cuda(cudaStream_t st, float *y, const float *x,
                                                      const void *w, enum moe_dtype wdt, int rows,
                                                      int dim, float eps)
{
    if (rows <= 0) return MOE_OK;
    if (rows > 2147483647 || dim <= 0) return moe_fail(MOE_ERR_INVALID_ARG, "rmsnorm: dim %d", dim);
    rmsnorm_kernel<<<rows, NORM_THREADS, 0, st>>>(y, x, w, wdt, rows, dim, eps);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

static __global__ void rope_kernel(float *x, const int32_t *pos, int T, int H, int Dh, int rot,
                                   const float *inv_freq)
{
    const int half = rot / 2; /* values rot..Dh-1 of a head pass unchanged */
    const size_t n = (size_t)T * H * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int f = (int)(i % half);
        const size_t th = i / half; /* t * H + h */
        const int t = (int)(th / H);
        float angle = (float)pos[t] * inv_freq[f];
        float c = cosf(angle), s = sinf(angle);
        float *v = x + th * Dh;
        float a = v[f], b = v[f + half];
        v[f] = a * c - b * s;
        v[f + half] = b * c + a * s;
    }
}

extern "C" enum moe_status moe_attention_rope_cuda(cudaStream_t st, float *x, const int32_t *pos,
                                                   int T, int H, int Dh, int rot, const float *inv_freq)
{
    if (T <= 0 || H <= 0 || rot < 2) return MOE_OK;
    if (rot > Dh || rot % 2) return moe_fail(MOE_ERR_INVALID_ARG, "rope: %d of %d values", rot, Dh);
    const size_t n = (size_t)T * H * (rot / 2);
    rope_kernel<<<moe_cuda_blocks(n, 256), 256, 0, st>>>(x, pos, T, H, Dh, rot, inv_freq);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* Value d of KV head h of token t goes to row moe_kv_row(slot, B, Hkv, h)
 * (kvcache.h). */
static __global__ void kv_store_kernel(void *kl, void *vl, enum moe_dtype dt, const float *k,
                                       const float *v, const int32_t *slots, int T, int B, int Hkv,
                                       int Dh, size_t layer_elems)
{
    const size_t row = (size_t)Hkv * Dh, n = (size_t)T * row;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(i / row), e = (int)(i % row);
        const size_t dst = moe_kv_row((size_t)slots[t], (size_t)B, (size_t)Hkv, (size_t)(e / Dh)) * Dh + e % Dh;
        if (slots[t] < 0 || dst >= layer_elems) continue; /* validated on the host */
        moe_st(kl, dt, dst, k[i]);
        if (vl != kl) moe_st(vl, dt, dst, v[i]); /* MLA: one row serves as K and V */
    }
}

/* The fp8 cache's store (kvcache.h): one warp per (token, KV head, K or
 * V) row of Dh values: the row's finite amax by a warp max (exact in any
 * order), the scale amax / 448, each value's byte by moe_kv_fp8_encode:
 * the CPU's moe_kvcache_fp8_quantize_row bit for bit.  Rows (T, Hkv, 2)
 * in blockIdx.x * 4 + warp; MLA's one row (vl == kl) is written once. */
#define FP8_STORE_WARPS 4
static __global__ void __launch_bounds__(FP8_STORE_WARPS * 32)
    kv_store_fp8_kernel(uint8_t *kl, uint8_t *vl, float *ksl, float *vsl, const float *k, const float *v,
                        const int32_t *slots, int T, int B, int Hkv, int Dh, size_t layer_rows)
{
    const int lane = threadIdx.x & 31;
    const size_t r = (size_t)blockIdx.x * FP8_STORE_WARPS + (threadIdx.x >> 5);
    const int which = (int)(r % 2), h = (int)(r / 2 % Hkv);
    const size_t t = r / 2 / Hkv;
    if (t >= (size_t)T || (which == 1 && vl == kl)) return;
    const size_t dst = moe_kv_row((size_t)slots[t], (size_t)B, (size_t)Hkv, (size_t)h);
    if (slots[t] < 0 || dst >= layer_rows) return; /* validated on the host */
    const float *x = (which ? v : k) + (t * Hkv + h) * Dh;
    float amax = 0.0f;
    for (int d = lane; d < Dh; d += 32) amax = fmaxf(amax, moe_kv_fp8_abs(x[d]));
    const float s = moe_kv_fp8_scale(moe_warp_max(amax));
    uint8_t *q = (which ? vl : kl) + dst * Dh;
    for (int d = lane; d < Dh; d += 32) q[d] = moe_kv_fp8_encode(x[d], s);
    if (lane == 0) (which ? vsl : ksl)[dst] = s;
}

extern "C" enum moe_status moe_attention_kv_store_cuda(cudaStream_t st, struct moe_kvcache *kv,
                                                       int layer, const float *k, const float *v,
                                                       const int32_t *slots, int T)
{
    if (T <= 0) return MOE_OK;
    if (layer < 0 || layer >= kv->n_layers)
        return moe_fail(MOE_ERR_INVALID_ARG, "kv_store: layer %d of %d", layer, kv->n_layers);
    const int row = kv->n_kv_heads * kv->head_dim;
    const size_t es = moe_dtype_size(kv->dtype);
    char *kl = (char *)kv->k + (size_t)layer * kv->layer_elems * es;
    char *vl = (char *)kv->v + (size_t)layer * kv->layer_elems * es;
    if (kv->dtype == MOE_DTYPE_F8E4M3) {
        const size_t rows = (size_t)T * kv->n_kv_heads * 2, so = (size_t)layer * kv->layer_rows;
        const size_t blocks = (rows + FP8_STORE_WARPS - 1) / FP8_STORE_WARPS;
        if (blocks > 2147483647u)
            return moe_fail(MOE_ERR_INVALID_ARG, "kv_store: %d rows of %d KV heads", T, kv->n_kv_heads);
        kv_store_fp8_kernel<<<(unsigned)blocks, FP8_STORE_WARPS * 32, 0, st>>>(
            (uint8_t *)kl, (uint8_t *)vl, kv->ks + so, kv->vs + so, k, v, slots, T, kv->block_size,
            kv->n_kv_heads, kv->head_dim, kv->layer_rows);
        MOE_CUDA_LAUNCHED();
        return MOE_OK;
    }
    kv_store_kernel<<<moe_cuda_blocks((size_t)T * row, 256), 256, 0, st>>>(
        kl, vl, kv->dtype, k, v, slots, T, kv->block_size, kv->n_kv_heads, kv->head_dim, kv->layer_elems);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" size_t moe_attention_split_floats(int rows, int Hq, int Dh, int max_splits)
{
    return (size_t)rows * Hq * max_splits * (size_t)(Dh + 2);
}

struct att_args : att_view {
    const int32_t *seq_of; /* (T) */
    int n_splits;          /* splits of each row's key range */
    int kps_min;           /* fewest keys a split takes */
    float *ws;             /* (T, Hq, n_splits, Dh + 2) when n_splits > 1 */
};

/* DPL: elements of a head row per lane, ceil(Dh / 32). */
template <int DPL>
static __global__ void __launch_bounds__(ATT_WARPS * 32)
    paged_attention_kernel(struct att_args a, int T)
{
    const int t = blockIdx.x, kh = blockIdx.y, split = blockIdx.z;
    if (t >= T || kh >= a.Hkv || split >= a.n_splits) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = a.Hq / a.Hkv, Dh = a.Dh;
    const int pos = a.positions[t], seq = a.seq_of[t];
    const int first = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
    /* each row splits its own range: launch parameters depend only on the
     * step's shape, never on context lengths (so a step can be a graph) */
    const int range = pos + 1 - first;
    const int kps = max(a.kps_min, (range + a.n_splits - 1) / a.n_splits);
    const int j0 = first + split * kps;
    const int j1 = min(pos + 1, j0 + kps);
    const int32_t *table = a.table + (size_t)seq * a.max_blocks;

    __shared__ float s_acc[ATT_WARPS][MAXG][MAXDH];
    __shared__ float s_m[ATT_WARPS][MAXG], s_l[ATT_WARPS][MAXG];

    for (int g0 = 0; g0 < G; g0 += MAXG) {
        const int gn = min(MAXG, G - g0);
        float qr[MAXG][DPL], acc[MAXG][DPL], m[MAXG], l[MAXG];
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
#pragma unroll
            for (int j = 0; j < DPL; j++) {
                const int d = lane + 32 * j;
                acc[g][j] = 0.0f;
                qr[g][j] = g < gn && d < Dh
                               ? a.q[(size_t)t * a.Hq * Dh + (size_t)(kh * G + g0 + g) * Dh + d]
                               : 0.0f;
            }
        }
        for (int key = j0 + warp; key < j1; key += ATT_WARPS) {
            const int blk = table[key / a.B];
            if (blk < 0 || blk >= a.n_blocks) continue; /* validated on the host */
            const size_t off = moe_kv_row((size_t)blk * a.B + key % a.B, a.B, a.Hkv, kh) * Dh;
            float kf[DPL], vf[DPL];
            const float ks = att_row_scale(a.ksl, off, Dh), vs = att_row_scale(a.vsl, off, Dh);
#pragma unroll
            for (int j = 0; j < DPL; j++) {
                const int d = lane + 32 * j;
                kf[j] = d < Dh ? moe_ld(a.kl, a.dt, off + d) * ks : 0.0f;
                vf[j] = d < Dh ? moe_ld(a.vl, a.dt, off + d) * vs : 0.0f;
            }
#pragma unroll
            for (int g = 0; g < MAXG; g++) {
                if (g >= gn) break;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < DPL; j++) s += qr[g][j] * kf[j];
                s = moe_warp_sum(s) * a.scale;
                const float mn = fmaxf(m[g], s);
                const float corr = expf(m[g] - mn), e = expf(s - mn);
#pragma unroll
                for (int j = 0; j < DPL; j++) acc[g][j] = acc[g][j] * corr + e * vf[j];
                l[g] = l[g] * corr + e;
                m[g] = mn;
            }
        }
        /* merge the warps' states */
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            if (g >= gn) break;
#pragma unroll
            for (int j = 0; j < DPL; j++) {
                const int d = lane + 32 * j;
                if (d < Dh) s_acc[warp][g][d] = acc[g][j];
            }
            if (lane == 0) {
                s_m[warp][g] = m[g];
                s_l[warp][g] = l[g];
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < gn * Dh; i += blockDim.x) {
            const int g = i / Dh, d = i % Dh;
            float M = -INFINITY;
            for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, s_m[w][g]);
            float L = 0.0f, A = 0.0f;
            if (M != -INFINITY) {
                for (int w = 0; w < ATT_WARPS; w++) {
                    if (s_l[w][g] == 0.0f && s_m[w][g] == -INFINITY) continue;
                    const float c = expf(s_m[w][g] - M);
                    L += s_l[w][g] * c;
                    A += s_acc[w][g][d] * c;
                }
            }
            const int head = kh * G + g0 + g;
            if (a.n_splits == 1) {
                if (a.sinks) A *= att_fold_sink(a.sinks[head], M, &L);
                a.out[(size_t)t * a.Hq * Dh + (size_t)head * Dh + d] = A / L;
            } else {
                float *p = a.ws + (((size_t)t * a.Hq + head) * a.n_splits + split) * (Dh + 2);
                p[d] = A;
                if (d == 0) {
                    p[Dh] = M;
                    p[Dh + 1] = L;
                }
            }
        }
        __syncthreads();
    }
}

/* Merges the splits of each (t, head) in split order. */
static __global__ void split_reduce_kernel(float *out, const float *ws, const float *sinks, int T,
                                           int Hq, int Dh, int n_splits)
{
    const int t = blockIdx.x, h = blockIdx.y;
    if (t >= T || h >= Hq) return;
    const float *p = ws + ((size_t)t * Hq + h) * n_splits * (Dh + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++)
        if (p[(size_t)s * (Dh + 2) + Dh + 1] > 0.0f) M = fmaxf(M, p[(size_t)s * (Dh + 2) + Dh]);
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        float L = 0.0f, A = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float *q = p + (size_t)s * (Dh + 2);
            if (!(q[Dh + 1] > 0.0f)) continue;
            const float c = expf(q[Dh] - M);
            L += q[Dh + 1] * c;
            A += q[d] * c;
        }
        if (sinks) A *= att_fold_sink(sinks[h], M, &L);
        out[(size_t)t * Hq * Dh + (size_t)h * Dh + d] = A / L;
    }
}

template <int DPL>
static enum moe_status launch_attention(cudaStream_t st, const struct att_args *a, int T)
{
    dim3 grid((unsigned)T, (unsigned)a->Hkv, (unsigned)a->n_splits);
    paged_attention_kernel<DPL><<<grid, ATT_WARPS * 32, 0, st>>>(*a, T);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" enum moe_status moe_attention_paged_cuda(cudaStream_t st, float *out, const float *q,
                                                    const struct moe_kvcache *kv,
                                                    const struct moe_batch *db,
                                                    const struct moe_attn_params *p, float *ws,
                                                    int ws_rows, int max_splits)
{
    const int T = db->n_tokens, Dh = p->head_dim;
    if (T <= 0) return MOE_OK;
    if (T > 65535 * 1024) return moe_fail(MOE_ERR_INVALID_ARG, "attention: %d rows", T);
    struct att_args a;
    MOE_TRY(att_view_init(&a, out, q, kv, db, p, MAXDH));
    a.seq_of = db->seq_of;
    a.ws = ws;
    /* Split the key range only for decode-sized batches: prefill rows give
     * enough blocks on their own.  The split count comes from the longest
     * possible range (the max_ctx hint when given, else the block table's
     * capacity, capped by the window) at KPS_MIN keys per split at least.
     * A row's splits are then those of its own range alone (KPS_MIN keys
     * each, or range / max_splits past max_splits x KPS_MIN keys), and one
     * split merged by split_reduce_kernel equals the unsplit write bit for
     * bit: a row's result does not depend on the other rows of the step. */
    int max_ctx = p->max_ctx > 0 ? p->max_ctx : db->max_blocks * kv->block_size;
    if (p->window > 0 && p->window < max_ctx) max_ctx = p->window;
    a.kps_min = KPS_MIN;
    a.n_splits = 1;
    if (ws && T <= ws_rows && max_splits > 1 && max_ctx > KPS_MIN) {
        int n = (max_ctx + KPS_MIN - 1) / KPS_MIN;
        a.n_splits = n < max_splits ? n : max_splits;
    }
    enum moe_status s;
    const int dpl = (Dh + 31) / 32;
    if (dpl <= 1) s = launch_attention<1>(st, &a, T);
    else if (dpl <= 2) s = launch_attention<2>(st, &a, T);
    else if (dpl <= 4) s = launch_attention<4>(st, &a, T);
    else s = launch_attention<8>(st, &a, T);
    if (s != MOE_OK || a.n_splits == 1) return s;
    return moe_attention_split_reduce_cuda(st, out, ws, a.sinks, T, a.Hq, Dh, a.n_splits);
}

extern "C" enum moe_status moe_attention_split_reduce_cuda(cudaStream_t st, float *out,
                                                           const float *ws, const float *sinks,
                                                           int T, int Hq, int Dh, int n_splits)
{
    if (T <= 0) return MOE_OK;
    if (Hq <= 0 || Hq > 65535 || Dh <= 0 || n_splits <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "split reduce: %d rows of %d heads of %d", T, Hq, Dh);
    dim3 grid((unsigned)T, (unsigned)Hq);
    split_reduce_kernel<<<grid, Dh < 32 ? 32 : (Dh > 256 ? 256 : Dh), 0, st>>>(out, ws, sinks, T,
                                                                              Hq, Dh, n_splits);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
