/* attention_mla_cuda.cu - paged attention over one shared K/V row per token:
 * DeepSeek's multi-head latent attention in its absorbed form
 * (runtime/engine/forward_mla.c), the CUDA twin of moe_attention_paged_cpu for
 * caches whose V is their K (kv->v == kv->k), for decode-sized and
 * prefill-sized steps alike (runtime/backend/backend_cuda.c chooses it for every
 * such cache).
 *
 * The shape: every query head attends over the same cache rows
 * [rope(k_rope), latent] of Dh = rope + Rc values (64 + 512 = 576 in
 * DeepSeek-V2/V3), read as key and as value; one KV head (Hkv = 1) and all
 * query heads in its group (G = Hq: 16 in V2-Lite, 128 in V3).  The per-row
 * and tiled GQA kernels stop at Dh = 256: they hold every head's
 * accumulator row in one warp's registers and keep separate K and V tiles,
 * which at Dh = 576 would need 2.3x the registers and 226 KB of tiles.
 *
 * In the manner of FlashMLA (one block per group of heads, each latent row
 * read once from the cache for all of them), in fp32 SIMT: a block of 8
 * warps owns MLA_ROWS = 32 query rows, (token, head) pairs of ONE sequence:
 * tq consecutive tokens times gp heads of the group (G <= 32: gp = G, so 2
 * tokens x 16 heads in V2-Lite; larger groups are cut into ceil(G/32)
 * balanced passes along grid.y, 4 x 32 heads in V3, tq = 1).  The block
 * streams its keys in tiles of MLA_TK = 32 rows, each row read once from the
 * cache, converted to fp32 into shared memory, and used twice by all 32
 * query rows: as K for the scores and as V for P.V.
 *
 *   scores   lane j of warp w dots key j with the warp's 4 rows (float4
 *            shared reads: key rows padded to dhp + 4 floats, conflict-free;
 *            query rows broadcast), times scale;
 *   softmax  causal (and window) mask per row, warp max and sum over the
 *            tile, running max m, sum l, correction exp(m - m'); P into the
 *            warp's rows of shared memory;
 *   P.V      lane owns float4 columns c = lane + 32*k of its warp's 4 rows'
 *            accumulators (registers: NV4 = ceil(Dh / 128) float4 per row,
 *            80 floats at Dh = 576), reading the same tile rows as V.
 *
 * Shared memory (dynamic, floats): Q (32, dhp) + KV (32, dhp + 4) + P
 * (32, 32), dhp = Dh rounded up to 4: 152,064 bytes at Dh = 576, within
 * sm_80's 163 KB and sm_90's 227 KB per block; the limit is raised once
 * per kernel at backend init (moe_attention_mla_setup_cuda, which reports
 * the largest head dim the device allows).
 *
 * Decode-sized steps (a split workspace given): grid.z splits each block's
 * key range (flash-decoding), each split writing (acc, m, l) partials per
 * (row, head) in the per-row kernel's layout, which its split_reduce_kernel
 * merges in split order.  The split count comes from the longest context
 * (the max_ctx hint, or the block table's capacity while a step is being
 * recorded), at least MLA_KPS_MIN keys per split, at most max_splits, and
 * no more than the workspace holds (T x Hq x splits x (Dh + 2) floats; the
 * backend reserves moe_attention_mla_split_floats); each block divides its
 * own range, so a launch depends only on the step's shape.  Prefill-sized
 * steps: one split, the block writes its rows' outputs.
 *
 * Finding the tile, masks, windows and sinks are the tiled prefill
 * kernel's (attention_prefill_cuda.cu); MLA models use neither windows nor
 * sinks, but both work here.  Scores, softmax and accumulation are fp32;
 * summation order differs from the CPU's, so results agree to rounding.
 *
 * Not done: tensor cores (the score and P.V tiles as bf16 MMAs with fp32
 * accumulators, 64 heads per block, double-buffered tiles), and, for long
 * prefills, attention in the unabsorbed form (per-head keys of nope + rope
 * = 192 and values of 128, a third of the absorbed form's work per score). */
#include <limits.h>
#include <math.h>

#include "attention/attention.h"
#include "attention/attention_cuda.h"
#include "attention/attention_cuda.cuh"
#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_util.h"

#define MLA_WARPS 8
#define MLA_RPW 4                        /* query rows per warp */
#define MLA_ROWS (MLA_WARPS * MLA_RPW)   /* (token, head) rows per block */
#define MLA_TK 32                        /* keys per tile: one per lane */
static_assert(MLA_TK == 32, "att_tile_softmax takes one key per lane");
#define MLA_MAXG 32                      /* query heads per pass */
#define MLA_MAXNV4 5                     /* float4 columns per lane: Dh <= 640 */
#define MLA_MAXDH 576
#define MLA_KPS_MIN 64                   /* fewest keys per split */
/* (row, head, split) partials the backend's split workspace is sized for:
 * 37.9 MB at Dh = 576; T = 1 takes 32 splits up to 512 heads, T = 64 with
 * 16 heads takes 16, with 128 heads 2 */
#define MLA_SPLIT_PARTIALS 16384

struct mla_args : att_view {
    const int32_t *seq_start;            /* (n_seqs + 1) */
    int T, n_seqs;
    int G;                               /* query heads per KV head */
    int n_pass, gp, tq;                  /* head passes, heads per pass, tokens per tile */
    int n_splits;                        /* of each block's key range */
    float *ws;                           /* (T, Hq, n_splits, Dh + 2) when n_splits > 1 */
};

/* Dh rounded up to 4: rows are read as float4. */
static __host__ __device__ int mla_dhp(int Dh) { return (Dh + 3) & ~3; }

/* Dynamic shared memory of one block, in floats: Q, the K/V tile, P. */
static __host__ __device__ size_t mla_smem_floats(int Dh)
{
    const size_t dhp = (size_t)mla_dhp(Dh);
    return MLA_ROWS * dhp + MLA_TK * (dhp + 4) + MLA_ROWS * MLA_TK;
}

static __device__ __forceinline__ void f4_fma(float4 *acc, float p, float4 v)
{
    acc->x = fmaf(p, v.x, acc->x);
    acc->y = fmaf(p, v.y, acc->y);
    acc->z = fmaf(p, v.z, acc->z);
    acc->w = fmaf(p, v.w, acc->w);
}

/* NV4: float4 accumulator columns of a row per lane, ceil(dhp / 128). */
template <int NV4>
static __global__ void __launch_bounds__(MLA_WARPS * 32) mla_attention_kernel(struct mla_args a)
{
    extern __shared__ float4 mla_smem4[];
    __shared__ int s_kok[MLA_TK];                       /* key of the tile readable */
    __shared__ int s_first[MLA_ROWS], s_last[MLA_ROWS]; /* each row's keys; empty when unused */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kh = blockIdx.y / a.n_pass, pass = blockIdx.y % a.n_pass, split = blockIdx.z;
    if (kh >= a.Hkv || split >= a.n_splits) return;
    int seq, t0, ntok;
    if (!att_find_tile(a.seq_start, a.n_seqs, a.tq, a.T, blockIdx.x, &seq, &t0, &ntok))
        return; /* past the last tile (block-uniform) */

    /* lane i < ntok holds token i's key range [first, pos] */
    int my_first = INT_MAX, my_pos = -1;
    if (lane < ntok) {
        my_pos = a.positions[t0 + lane];
        my_first = a.window > 0 && my_pos - a.window + 1 > 0 ? my_pos - a.window + 1 : 0;
    }
    const int kfirst = att_warp_min_int(my_first), klast = att_warp_max_int(my_pos);
    /* this split's keys [j0, j1) of the block's range (block-uniform) */
    const long long range = (long long)klast - kfirst + 1;
    const long long kps = max((long long)MLA_KPS_MIN, (range + a.n_splits - 1) / a.n_splits);
    const long long j0l = kfirst + (long long)split * kps;
    const int j0 = (int)min(j0l, (long long)klast + 1);
    const int j1 = (int)min((long long)klast + 1, j0l + kps);

    const int Dh = a.Dh, dhp = mla_dhp(Dh), n4 = dhp / 4;
    float *sq = (float *)mla_smem4;              /* (MLA_ROWS, dhp) */
    float *skv = sq + MLA_ROWS * dhp;            /* (MLA_TK, dhp + 4): K and V */
    float *sp = skv + MLA_TK * (dhp + 4);        /* (MLA_ROWS, MLA_TK) */
    float *pw = sp + warp * MLA_RPW * MLA_TK;    /* this warp's P rows */

    /* the warp's rows: row r = warp * 4 + rr is token r / gp, head
     * pass * gp + r % gp of kh's group; an unused row has an empty range */
    float m[MLA_RPW], l[MLA_RPW];
    float4 acc[MLA_RPW][NV4];
    int wlo = INT_MAX, whi = -1; /* keys any of the warp's rows may see */
#pragma unroll
    for (int rr = 0; rr < MLA_RPW; rr++) {
        att_row_setup(a, warp * MLA_RPW + rr, pass, kh, t0, ntok, Dh, dhp, my_first, my_pos, s_first, s_last,
                      sq, wlo, whi);
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int k = 0; k < NV4; k++) acc[rr][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    wlo = max(wlo, j0);
    whi = min(whi, j1 - 1);

    const int32_t *table = a.table + (size_t)seq * a.max_blocks;
    for (int k0 = j0; k0 < j1; k0 += MLA_TK) {
        __syncthreads(); /* the previous tile has been consumed */
        for (int j = warp; j < MLA_TK; j += MLA_WARPS) {
            const int key = k0 + j;
            int blk = -1;
            if (key < j1 && key / a.B < a.max_blocks) blk = table[key / a.B];
            const bool kok = blk >= 0 && blk < a.n_blocks; /* validated on the host */
            const size_t off = kok ? moe_kv_row((size_t)blk * a.B + key % a.B, a.B, a.Hkv, kh) * Dh : 0;
            float *kr = skv + j * (dhp + 4);
            const float ks = kok ? att_row_scale(a.ksl, off, Dh) : 0.0f; /* K's and V's: one row */
            for (int d = lane; d < dhp; d += 32) kr[d] = kok && d < Dh ? moe_ld(a.kl, a.dt, off + d) * ks : 0.0f;
            if (lane == 0) s_kok[j] = kok;
        }
        __syncthreads();
        if (k0 > whi || k0 + MLA_TK - 1 < wlo) continue; /* warp-uniform */

        /* scores and online softmax, lane = key, 4 rows (keys past j1 are not kok) */
        float corr[MLA_RPW];
        att_tile_softmax<MLA_RPW, 4>((const float4 *)(skv + lane * (dhp + 4)),
                                     (const float4 *)(sq + warp * MLA_RPW * dhp), n4,
                                     s_first + warp * MLA_RPW, s_last + warp * MLA_RPW,
                                     s_kok, k0, a.scale, m, l, corr, pw, lane);
        __syncwarp();

        /* acc = acc * corr + P.V, V the same tile rows */
#pragma unroll
        for (int rr = 0; rr < MLA_RPW; rr++)
#pragma unroll
            for (int k = 0; k < NV4; k++) {
                acc[rr][k].x *= corr[rr];
                acc[rr][k].y *= corr[rr];
                acc[rr][k].z *= corr[rr];
                acc[rr][k].w *= corr[rr];
            }
        const float4 *p4 = (const float4 *)pw;
#pragma unroll 1
        for (int j4 = 0; j4 < MLA_TK / 4; j4++) {
            float4 pr[MLA_RPW];
#pragma unroll
            for (int rr = 0; rr < MLA_RPW; rr++) pr[rr] = p4[rr * (MLA_TK / 4) + j4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                const float4 *vr = (const float4 *)(skv + (j4 * 4 + jj) * (dhp + 4));
#pragma unroll
                for (int k = 0; k < NV4; k++) {
                    const int c4 = lane + 32 * k;
                    if (c4 >= n4) continue;
                    const float4 v = vr[c4];
#pragma unroll
                    for (int rr = 0; rr < MLA_RPW; rr++) f4_fma(&acc[rr][k], att_f4_get(pr[rr], jj), v);
                }
            }
        }
        __syncwarp(); /* P is rewritten by the next tile */
    }

#pragma unroll
    for (int rr = 0; rr < MLA_RPW; rr++) {
        const int r = warp * MLA_RPW + rr, i = r / a.gp, g = pass * a.gp + r % a.gp;
        if (i >= ntok || g >= a.G) continue;
        const int head = kh * a.G + g;
        const size_t t = (size_t)(t0 + i);
        if (a.n_splits == 1) {
            float *o = a.out + t * a.Hq * Dh + (size_t)head * Dh;
            float L = l[rr], c = 1.0f;
            if (a.sinks) c = att_fold_sink(a.sinks[head], m[rr], &L);
#pragma unroll
            for (int k = 0; k < NV4; k++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int d = 4 * (lane + 32 * k) + e;
                    if (d < Dh) o[d] = att_f4_get(acc[rr][k], e) * c / L;
                }
        } else { /* partials, merged by split_reduce_kernel; empty splits have l = 0 */
            float *p = a.ws + ((t * a.Hq + head) * a.n_splits + split) * (size_t)(Dh + 2);
#pragma unroll
            for (int k = 0; k < NV4; k++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int d = 4 * (lane + 32 * k) + e;
                    if (d < Dh) p[d] = att_f4_get(acc[rr][k], e);
                }
            if (lane == 0) {
                p[Dh] = m[rr];
                p[Dh + 1] = l[rr];
            }
        }
    }
}

template <int NV4>
static bool mla_raise_smem(void)
{
    const int dh = NV4 * 128 < MLA_MAXDH ? NV4 * 128 : MLA_MAXDH;
    const cudaError_t e = cudaFuncSetAttribute(mla_attention_kernel<NV4>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)(mla_smem_floats(dh) * sizeof(float)));
    if (e != cudaSuccess) cudaGetLastError();
    return e == cudaSuccess;
}

extern "C" int moe_attention_mla_setup_cuda(void)
{
    if (!mla_raise_smem<1>()) return 0;
    if (!mla_raise_smem<2>()) return 128;
    if (!mla_raise_smem<3>()) return 256;
    if (!mla_raise_smem<4>()) return 384;
    if (!mla_raise_smem<5>()) return 512;
    return MLA_MAXDH;
}

extern "C" size_t moe_attention_mla_split_floats(int Dh)
{
    return (size_t)MLA_SPLIT_PARTIALS * (size_t)((Dh > 0 ? Dh : 1) + 2);
}

template <int NV4>
static enum moe_status launch_mla(cudaStream_t st, const struct mla_args *a, unsigned tiles)
{
    dim3 grid(tiles, (unsigned)(a->Hkv * a->n_pass), (unsigned)a->n_splits);
    const size_t smem = mla_smem_floats(a->Dh) * sizeof(float);
    mla_attention_kernel<NV4><<<grid, MLA_WARPS * 32, smem, st>>>(*a);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

/* The split count of a decode-sized step (see the top of the file): 1
 * when there is no workspace or the contexts are short. */
static int mla_splits(const struct moe_kvcache *kv, const struct moe_batch *db,
                      const struct moe_attn_params *p, size_t ws_floats, int max_splits)
{
    long long max_ctx = p->max_ctx > 0 ? p->max_ctx : (long long)db->max_blocks * kv->block_size;
    if (p->window > 0 && p->window < max_ctx) max_ctx = p->window;
    if (max_splits < 2 || max_ctx <= MLA_KPS_MIN) return 1;
    long long n = (max_ctx + MLA_KPS_MIN - 1) / MLA_KPS_MIN;
    if (n > max_splits) n = max_splits;
    size_t per; /* floats of one split's partials */
    if (!moe_mul_size((size_t)db->n_tokens * (size_t)p->n_heads, (size_t)p->head_dim + 2, &per))
        return 1;
    if ((size_t)n > ws_floats / per) n = (long long)(ws_floats / per);
    return n > 1 ? (int)n : 1;
}

extern "C" enum moe_status moe_attention_mla_cuda(cudaStream_t st, float *out, const float *q,
                                                  const struct moe_kvcache *kv,
                                                  const struct moe_batch *db,
                                                  const struct moe_attn_params *p, int max_dh,
                                                  float *ws, size_t ws_floats, int max_splits)
{
    const int T = db->n_tokens, Dh = p->head_dim;
    if (T <= 0) return MOE_OK;
    struct mla_args a;
    MOE_TRY(att_view_init(&a, out, q, kv, db, p, MLA_MAXDH));
    if (kv->v != kv->k)
        return moe_fail(MOE_ERR_INVALID_ARG, "CUDA MLA attention: the cache keeps V apart from K "
                        "(this kernel reads one row as both)");
    if (Dh > max_dh)
        return moe_fail(MOE_ERR_UNSUPPORTED, "CUDA MLA attention: head dim %d needs %zu bytes of "
                        "shared memory per block; this device allows head dims up to %d", Dh,
                        mla_smem_floats(Dh) * sizeof(float), max_dh);
    if (db->n_seqs <= 0 || db->n_seqs > 65535 * 1024)
        return moe_fail(MOE_ERR_INVALID_ARG, "attention: %d sequences", db->n_seqs);
    a.G = p->n_heads / p->n_kv_heads;
    a.n_pass = (a.G + MLA_MAXG - 1) / MLA_MAXG;
    a.gp = (a.G + a.n_pass - 1) / a.n_pass; /* balanced passes: G = 40 is 20 + 20 */
    a.tq = MLA_ROWS / a.gp;
    if ((long long)p->n_kv_heads * a.n_pass > 65535)
        return moe_fail(MOE_ERR_INVALID_ARG, "attention: %d KV heads x %d passes", p->n_kv_heads,
                        a.n_pass);
    const long long tiles = ((long long)T + a.tq - 1) / a.tq + db->n_seqs;
    if (tiles > INT_MAX)
        return moe_fail(MOE_ERR_INVALID_ARG, "attention: %d rows in %d sequences", T, db->n_seqs);
    a.seq_start = db->seq_start;
    a.T = T;
    a.n_seqs = db->n_seqs;
    a.ws = ws;
    a.n_splits = ws ? mla_splits(kv, db, p, ws_floats, max_splits) : 1;
    const int nv4 = (mla_dhp(Dh) / 4 + 31) / 32;
    enum moe_status s;
    switch (nv4) {
    case 1: s = launch_mla<1>(st, &a, (unsigned)tiles); break;
    case 2: s = launch_mla<2>(st, &a, (unsigned)tiles); break;
    case 3: s = launch_mla<3>(st, &a, (unsigned)tiles); break;
    case 4: s = launch_mla<4>(st, &a, (unsigned)tiles); break;
    default: s = launch_mla<MLA_MAXNV4>(st, &a, (unsigned)tiles); break;
    }
    if (s != MOE_OK || a.n_splits == 1) return s;
    return moe_attention_split_reduce_cuda(st, out, ws, a.sinks, T, p->n_heads, Dh, a.n_splits);
}
