/* attention_prefill_cuda.cu - tiled causal paged attention for prefill-sized
 * steps: the CUDA twin of moe_attention_paged_cpu for steps of more than
 * ATT_SPLIT_ROWS rows (runtime/backend/backend_cuda.c chooses; decode-sized steps
 * keep paged_attention_kernel of attention_cuda.cu).
 *
 * FlashAttention-2 (Dao, 2023) in plain fp32 SIMT: a block of 4 warps owns
 * PF_ROWS = 32 query rows, which are (token, head) pairs of ONE sequence and
 * ONE KV head kh: tq consecutive tokens of the sequence times gp query heads
 * of kh's group (gp = G when G <= 8, else G is cut into n_pass passes of at
 * most 8 heads, each pass its own blocks along grid.y).  The block streams
 * the keys its rows need, [min first, max pos], in tiles of PF_TK = 32 keys
 * from the paged cache into shared memory (converted to fp32 once, read by
 * all 32 rows), and keeps an online softmax per row:
 *
 *   scores   lane j of warp w dots key j with the warp's 8 rows (float4
 *            reads: K rows padded to dhp + 4 floats, conflict-free; Q rows
 *            broadcast), times scale: q.k * scale as on the CPU;
 *   softmax  causal mask per row (first <= key <= pos, first = pos - window
 *            + 1 with a sliding window, else 0; keys whose block id is out
 *            of range are skipped as the per-row kernel does), warp max and
 *            sum over the tile, running max m, sum l, correction exp(m - m');
 *   P.V      lane owns elements d = lane + 32*k of the 8 rows' accumulators
 *            (registers), P read as float4 broadcasts, V rows lane-contiguous.
 *
 * A warp skips a tile none of its rows can see (causal diagonal, window).
 * Scores, softmax and accumulation are fp32; summation order differs from
 * the CPU's, so results agree to rounding, not bits.
 *
 * Finding the tile: grid.x = ceil(T / tq) + n_seqs, an upper bound on the
 * number of tiles (each sequence wastes less than one tile); block x walks
 * seq_start on the device (n_seqs is small) to its sequence and first row,
 * and returns when it is past the last tile.  So the launch depends only on
 * the step's shape (T, n_seqs, heads, Dh), never on context lengths, and a
 * step can be recorded as a graph.  Rows of a sequence are contiguous
 * (batch.h); positions need not start at 0 (chunked prefill: the earlier
 * chunks are reached through the block table), nor be consecutive (the key
 * range is the min/max over the tile's rows).
 *
 * Shared memory (dynamic, floats): Q (32, dhp) + K (32, dhp + 4) + V (32, Dh)
 * + P (32, 32), dhp = Dh rounded up to 4: 53,760 bytes at Dh = 128, 102,912
 * at Dh = 256; the limit is raised once per kernel at backend init
 * (moe_attention_prefill_setup_cuda).  No global workspace.
 *
 * Not done: tensor cores.  An mma.sync / wgmma version would hold Q and the
 * K/V tiles in bf16/f16 (the cache's own type when it is half), compute the
 * score and P.V tiles as MMAs with fp32 accumulators, use 64-128 query rows
 * per block and double-buffer the K/V tiles with cp.async / TMA; fp32
 * caches would need TF32 or a conversion, and parity tolerances per dtype. */
#include <limits.h>
#include <math.h>

#include "attention/attention.h"
#include "attention/attention_cuda.h"
#include "attention/attention_cuda.cuh"
#include "runtime/cuda/cuda_dtype.cuh"
#include "runtime/cuda/cuda_util.h"

#define PF_WARPS 4
#define PF_RPW 8                        /* rows per warp */
#define PF_ROWS (PF_WARPS * PF_RPW)     /* (token, head) rows per block */
#define PF_TK 32                        /* keys per tile: one per lane */
static_assert(PF_TK == 32, "att_tile_softmax takes one key per lane");
#define PF_MAXG 8                       /* query heads per pass */
#define PF_MAXDH 256
#define FULL_MASK 0xffffffffu

struct pf_args : att_view {
    const int32_t *seq_start;           /* (n_seqs + 1) */
    int T, n_seqs;
    int G;                              /* query heads per KV head */
    int n_pass, gp, tq;                 /* head passes, heads per pass, tokens per tile */
};

/* Dh rounded up to 4: Q and K rows are read as float4. */
static __host__ __device__ int pf_dhp(int Dh) { return (Dh + 3) & ~3; }

/* Dynamic shared memory of one block, in floats: Q, K, V and P tiles. */
static __host__ __device__ size_t pf_smem_floats(int Dh)
{
    const size_t dhp = (size_t)pf_dhp(Dh);
    return PF_ROWS * dhp + PF_TK * (dhp + 4) + PF_TK * (size_t)Dh + PF_ROWS * PF_TK;
}

/* DPL: accumulator elements of a row per lane, ceil(Dh / 32) rounded up to
 * a power of two. */
template <int DPL>
static __global__ void __launch_bounds__(PF_WARPS * 32) prefill_attention_kernel(struct pf_args a)
{
    extern __shared__ float4 pf_smem4[];
    __shared__ int s_kok[PF_TK]; /* key of the tile readable (in range, valid block) */
    __shared__ int s_first[PF_ROWS], s_last[PF_ROWS]; /* each row's keys; empty when unused */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kh = blockIdx.y / a.n_pass, pass = blockIdx.y % a.n_pass;
    if (kh >= a.Hkv) return;

    /* this block's tile: the sequence and its first row (block-uniform) */
    int seq, t0, ntok;
    if (!att_find_tile(a.seq_start, a.n_seqs, a.tq, a.T, blockIdx.x, &seq, &t0, &ntok))
        return; /* past the last tile */

    /* lane i < ntok holds token i's key range [first, pos] */
    int my_first = INT_MAX, my_pos = -1;
    if (lane < ntok) {
        my_pos = a.positions[t0 + lane];
        my_first = a.window > 0 && my_pos - a.window + 1 > 0 ? my_pos - a.window + 1 : 0;
    }
    const int kfirst = att_warp_min_int(my_first), klast = att_warp_max_int(my_pos);

    const int Dh = a.Dh, dhp = pf_dhp(Dh);
    float *sq = (float *)pf_smem4;                 /* (PF_ROWS, dhp) */
    float *sk = sq + PF_ROWS * dhp;                /* (PF_TK, dhp + 4) */
    float *sv = sk + PF_TK * (dhp + 4);            /* (PF_TK, Dh) */
    float *sp = sv + PF_TK * Dh;                   /* (PF_ROWS, PF_TK) */
    float *pw = sp + warp * PF_RPW * PF_TK;        /* this warp's P rows */

    /* the warp's rows: row r = warp * 8 + rr is token r / gp, head
     * pass * gp + r % gp of kh's group; an unused row has an empty range */
    float m[PF_RPW], l[PF_RPW], acc[PF_RPW][DPL];
    int wlo = INT_MAX, whi = -1; /* keys any of the warp's rows may see */
#pragma unroll
    for (int rr = 0; rr < PF_RPW; rr++) {
        att_row_setup(a, warp * PF_RPW + rr, pass, kh, t0, ntok, Dh, dhp, my_first, my_pos, s_first, s_last,
                      sq, wlo, whi);
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; k++) acc[rr][k] = 0.0f;
    }

    const int32_t *table = a.table + (size_t)seq * a.max_blocks;
    for (int k0 = kfirst; k0 <= klast; k0 += PF_TK) {
        __syncthreads(); /* the previous tile has been consumed */
        for (int j = warp; j < PF_TK; j += PF_WARPS) {
            const int key = k0 + j;
            int blk = -1;
            if (key <= klast && key / a.B < a.max_blocks) blk = table[key / a.B];
            const bool kok = blk >= 0 && blk < a.n_blocks; /* validated on the host */
            const size_t off = kok ? moe_kv_row((size_t)blk * a.B + key % a.B, a.B, a.Hkv, kh) * Dh : 0;
            float *kr = sk + j * (dhp + 4), *vr = sv + j * Dh;
            const float ks = kok ? att_row_scale(a.ksl, off, Dh) : 0.0f;
            const float vs = kok ? att_row_scale(a.vsl, off, Dh) : 0.0f;
            for (int d = lane; d < dhp; d += 32) kr[d] = kok && d < Dh ? moe_ld(a.kl, a.dt, off + d) * ks : 0.0f;
            for (int d = lane; d < Dh; d += 32) vr[d] = kok ? moe_ld(a.vl, a.dt, off + d) * vs : 0.0f;
            if (lane == 0) s_kok[j] = kok;
        }
        __syncthreads();
        if (k0 > whi || k0 + PF_TK - 1 < wlo) continue; /* warp-uniform */

        /* scores and online softmax, lane = key, 8 rows */
        float corr[PF_RPW];
        att_tile_softmax<PF_RPW, 2>((const float4 *)(sk + lane * (dhp + 4)),
                                    (const float4 *)(sq + warp * PF_RPW * dhp), dhp / 4,
                                    s_first + warp * PF_RPW, s_last + warp * PF_RPW,
                                    s_kok, k0, a.scale, m, l, corr, pw, lane);
        __syncwarp();

        /* acc = acc * corr + P.V */
#pragma unroll
        for (int rr = 0; rr < PF_RPW; rr++)
#pragma unroll
            for (int k = 0; k < DPL; k++) acc[rr][k] *= corr[rr];
        const float4 *p4 = (const float4 *)pw;
#pragma unroll 1
        for (int j4 = 0; j4 < PF_TK / 4; j4++) {
            float4 pr[PF_RPW];
#pragma unroll
            for (int rr = 0; rr < PF_RPW; rr++) pr[rr] = p4[rr * (PF_TK / 4) + j4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                const float *vr = sv + (j4 * 4 + jj) * Dh;
#pragma unroll
                for (int k = 0; k < DPL; k++) {
                    const int d = lane + 32 * k;
                    const float v = d < Dh ? vr[d] : 0.0f;
#pragma unroll
                    for (int rr = 0; rr < PF_RPW; rr++)
                        acc[rr][k] = fmaf(att_f4_get(pr[rr], jj), v, acc[rr][k]);
                }
            }
        }
        __syncwarp(); /* P is rewritten by the next tile */
    }

#pragma unroll
    for (int rr = 0; rr < PF_RPW; rr++) {
        const int r = warp * PF_RPW + rr, i = r / a.gp, g = pass * a.gp + r % a.gp;
        if (i >= ntok || g >= a.G) continue;
        float *o = a.out + (size_t)(t0 + i) * a.Hq * Dh + (size_t)(kh * a.G + g) * Dh;
        float L = l[rr], c = 1.0f;
        if (a.sinks) c = att_fold_sink(a.sinks[kh * a.G + g], m[rr], &L);
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            const int d = lane + 32 * k;
            if (d < Dh) o[d] = acc[rr][k] * c / L;
        }
    }
}

extern "C" enum moe_status moe_attention_prefill_setup_cuda(void)
{
    MOE_CUDA_TRY(cudaFuncSetAttribute(prefill_attention_kernel<1>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)(pf_smem_floats(32) * sizeof(float))));
    MOE_CUDA_TRY(cudaFuncSetAttribute(prefill_attention_kernel<2>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)(pf_smem_floats(64) * sizeof(float))));
    MOE_CUDA_TRY(cudaFuncSetAttribute(prefill_attention_kernel<4>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)(pf_smem_floats(128) * sizeof(float))));
    MOE_CUDA_TRY(cudaFuncSetAttribute(prefill_attention_kernel<8>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)(pf_smem_floats(PF_MAXDH) * sizeof(float))));
    return MOE_OK;
}

template <int DPL>
static enum moe_status launch_prefill(cudaStream_t st, const struct pf_args *a)
{
    const unsigned tiles = (unsigned)((a->T + a->tq - 1) / a->tq + a->n_seqs);
    dim3 grid(tiles, (unsigned)(a->Hkv * a->n_pass));
    const size_t smem = pf_smem_floats(a->Dh) * sizeof(float);
    prefill_attention_kernel<DPL><<<grid, PF_WARPS * 32, smem, st>>>(*a);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" enum moe_status moe_attention_prefill_cuda(cudaStream_t st, float *out, const float *q,
                                                      const struct moe_kvcache *kv,
                                                      const struct moe_batch *db,
                                                      const struct moe_attn_params *p)
{
    const int T = db->n_tokens, Dh = p->head_dim;
    if (T <= 0) return MOE_OK;
    struct pf_args a;
    MOE_TRY(att_view_init(&a, out, q, kv, db, p, PF_MAXDH));
    if (db->n_seqs <= 0 || db->n_seqs > 65535 * 1024)
        return moe_fail(MOE_ERR_INVALID_ARG, "attention: %d sequences", db->n_seqs);
    a.G = p->n_heads / p->n_kv_heads;
    a.n_pass = (a.G + PF_MAXG - 1) / PF_MAXG;
    a.gp = (a.G + a.n_pass - 1) / a.n_pass; /* balanced passes: G = 12 is 6 + 6 */
    a.tq = PF_ROWS / a.gp;
    if ((long long)p->n_kv_heads * a.n_pass > 65535)
        return moe_fail(MOE_ERR_INVALID_ARG, "attention: %d KV heads x %d passes", p->n_kv_heads,
                        a.n_pass);
    a.seq_start = db->seq_start;
    a.T = T;
    a.n_seqs = db->n_seqs;
    const int dpl = (Dh + 31) / 32;
    if (dpl <= 1) return launch_prefill<1>(st, &a);
    if (dpl <= 2) return launch_prefill<2>(st, &a);
    if (dpl <= 4) return launch_prefill<4>(st, &a);
    return launch_prefill<8>(st, &a);
}
