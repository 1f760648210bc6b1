/* attention_mma_cuda.cu - tiled causal paged attention for prefill-sized
 * steps on tensor cores (mma.sync m16n8k16, sm_80 and later): the same
 * attention as attention_prefill_cuda.cu, for bf16 and f16 caches with head
 * dim 64 or 128 (the common MoE shapes); the backend uses it when
 * MOERUN_CUDA_PREFILL_ATTN=mma, the SIMT kernel otherwise and for every
 * other shape or cache dtype.
 *
 * FlashAttention-2's loop with the products on tensor cores: a block of 4
 * warps owns 64 query rows, (token, head) pairs of one sequence and one KV
 * head as in the SIMT kernel (tq tokens times gp heads of the group, gp <=
 * 8), 16 rows a warp.  Per tile of 64 keys the block copies K and V from the
 * paged cache into shared memory (16-byte loads, rows padded by 8 values so
 * that the fragment reads below are conflict-free); then each warp
 *
 *   S = Q K^T   Q's fragments (converted to the cache's type once, held in
 *               registers for the whole loop) times K's, read from shared
 *               memory as 32-bit pairs: 8 key columns x Dh/16 steps of MMAs;
 *   softmax     S * scale, masked per row (causal, window, invalid keys),
 *               running max per row (the 4 lanes of a row agree through two
 *               shuffles), P = exp(S - max) in fp32, the sum kept per lane
 *               and reduced at the end;
 *   O += P V    P's fp32 fragments are the A operand of the next MMA as they
 *               stand (two 8-key column tiles of S make one 16-key step),
 *               rounded to the cache's type; V's B fragments come straight
 *               from shared memory by ldmatrix .trans.
 *
 * Accumulation is fp32; Q and P are rounded to the cache's half type for the
 * MMAs (the K and V they meet are already of that type), so results agree
 * with the CPU to that type's rounding, not fp32's: the parity test's
 * tolerances say so.  The grid and the tile walk are the SIMT kernel's, so
 * the launch depends only on the step's shape.  Static shared memory: 34 KB
 * at Dh 128.  Never run on a GPU yet (tests/test_cuda_attention.c,
 * cuda_prefill_mma); it passes under tools/cuda-emu, which runs the
 * instructions of runtime/cuda/cuda_mma_ptx.cuh as emulations written from
 * the PTX ISA. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attention_cuda.h"
#include "attention/attention_cuda.cuh"
#include "runtime/cuda/cuda_mma.cuh"
#include "runtime/cuda/cuda_util.h"

#define MA_WARPS 4
#define MA_RPW 16                    /* rows per warp: one MMA tile */
#define MA_ROWS (MA_WARPS * MA_RPW)  /* (token, head) rows per block */
#define MA_TK 64                     /* keys per tile */
#define MA_MAXG 8                    /* query heads per pass */
#define MA_PAD 8                     /* values of padding per shared row */
#define FULL_MASK 0xffffffffu

struct ma_args : att_view {
    const int32_t *seq_start; /* (n_seqs + 1) */
    int T, n_seqs, G, n_pass, gp, tq;
};

template <class HT, int DH>
static __global__ void __launch_bounds__(MA_WARPS * 32) mma_attention_kernel(struct ma_args a)
{
    typedef mma_half<HT> M;
    constexpr int LD = DH + MA_PAD;      /* shared row stride, in values */
    constexpr int KS = DH / 16;          /* k-steps of Q K^T */
    constexpr int NT = DH / 8;           /* column tiles of O */
    __shared__ __align__(16) HT sk[MA_TK * LD], sv[MA_TK * LD];
    __shared__ int s_kok[MA_TK], s_first[MA_ROWS], s_last[MA_ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int kh = blockIdx.y / a.n_pass, pass = blockIdx.y % a.n_pass;
    if (kh >= a.Hkv) return;

    /* this block's tile: the sequence and its first row (block-uniform) */
    int seq, t0, ntok;
    if (!att_find_tile(a.seq_start, a.n_seqs, a.tq, a.T, blockIdx.x, &seq, &t0, &ntok)) return;

    /* each row's key range [first, last] (empty when the row is unused) */
    for (int r = threadIdx.x; r < MA_ROWS; r += blockDim.x) {
        const int i = r / a.gp, h = pass * a.gp + r % a.gp;
        int first = 1, last = 0;
        if (i < ntok && h < a.G) {
            last = a.positions[t0 + i];
            first = a.window > 0 && last - a.window + 1 > 0 ? last - a.window + 1 : 0;
        }
        s_first[r] = first;
        s_last[r] = last;
    }
    __syncthreads();
    int klo = INT_MAX, khi = -1; /* the block's keys */
    for (int r = 0; r < MA_ROWS; r++)
        if (s_first[r] <= s_last[r]) klo = min(klo, s_first[r]), khi = max(khi, s_last[r]);
    int wlo = INT_MAX, whi = -1; /* the warp's */
    for (int r = warp * MA_RPW; r < (warp + 1) * MA_RPW; r++)
        if (s_first[r] <= s_last[r]) wlo = min(wlo, s_first[r]), whi = max(whi, s_last[r]);
    const int rlo = warp * MA_RPW + g, rhi = rlo + 8; /* this lane's two rows */

    /* Q's A fragments: rows rlo (regs 0, 2) and rhi (1, 3), columns
     * 16 ks + 2c (+1) and 16 ks + 8 + 2c (+1) */
    uint32_t qa[KS][4];
    {
        const float *q2[2] = {NULL, NULL};
        const int rr[2] = {rlo, rhi};
        for (int k = 0; k < 2; k++) {
            const int i = rr[k] / a.gp, h = pass * a.gp + rr[k] % a.gp;
            if (i < ntok && h < a.G) q2[k] = a.q + (size_t)(t0 + i) * a.Hq * DH + (size_t)(kh * a.G + h) * DH;
        }
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float *qr = q2[k & 1];
                const int d = 16 * ks + 8 * (k >> 1) + 2 * c;
                qa[ks][k] = qr ? M::pack(qr[d], qr[d + 1]) : 0u;
            }
    }

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* rows rlo, rhi; l per lane */
    const int first[2] = {s_first[rlo], s_first[rhi]}, last[2] = {s_last[rlo], s_last[rhi]};

    const int32_t *table = a.table + (size_t)seq * a.max_blocks;
    const HT *kl = (const HT *)a.kl, *vl = (const HT *)a.vl;
    for (int k0 = klo; k0 <= khi; k0 += MA_TK) {
        __syncthreads(); /* the previous tile has been consumed */
        /* K and V rows of the tile, 16 bytes (8 values) per thread per step */
        for (int u = threadIdx.x; u < MA_TK * (DH / 8); u += blockDim.x) {
            const int j = u / (DH / 8), d = (u % (DH / 8)) * 8, key = k0 + j;
            int blk = -1;
            if (key <= khi && key / a.B < a.max_blocks) blk = table[key / a.B];
            const bool kok = blk >= 0 && blk < a.n_blocks; /* validated on the host */
            uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
            if (kok) {
                const size_t off = moe_kv_row((size_t)blk * a.B + key % a.B, a.B, a.Hkv, kh) * DH + d;
                kv = *(const uint4 *)(kl + off);
                vv = *(const uint4 *)(vl + off);
            }
            *(uint4 *)(sk + j * LD + d) = kv;
            *(uint4 *)(sv + j * LD + d) = vv;
            if (d == 0) s_kok[j] = kok;
        }
        __syncthreads();
        if (k0 > whi || k0 + MA_TK - 1 < wlo) continue; /* warp-uniform */

        /* S = Q K^T: tile j covers keys 8j .. 8j+7; lane holds (rlo, 8j+2c),
         * (rlo, 8j+2c+1), (rhi, 8j+2c), (rhi, 8j+2c+1) */
        float s[MA_TK / 8][4];
#pragma unroll
        for (int j = 0; j < MA_TK / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const HT *kr = sk + (8 * j + g) * LD + 2 * c;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t b0, b1;
                memcpy(&b0, kr + 16 * ks, 4);
                memcpy(&b1, kr + 16 * ks + 8, 4);
                M::mma(s[j], qa[ks], b0, b1);
            }
        }

        /* masked, scaled scores; the rows' new maxima */
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < MA_TK / 8; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int jj = 8 * j + 2 * c + (k & 1), key = k0 + jj, h = k >> 1;
                const bool ok = s_kok[jj] && key >= first[h] && key <= last[h];
                s[j][k] = ok ? s[j][k] * a.scale : -INFINITY;
                mx[h] = fmaxf(mx[h], s[j][k]);
            }
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 2));
            corr[h] = mx[h] == -INFINITY ? 1.0f : expf(m[h] - mx[h]); /* exp(-inf) = 0 */
            m[h] = mx[h];
            l[h] *= corr[h];
        }
#pragma unroll
        for (int j = 0; j < MA_TK / 8; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int h = k >> 1;
                const float p = s[j][k] == -INFINITY ? 0.0f : expf(s[j][k] - m[h]);
                s[j][k] = p;
                l[h] += p;
            }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            o[n][0] *= corr[0], o[n][1] *= corr[0];
            o[n][2] *= corr[1], o[n][3] *= corr[1];
        }

        /* O += P V: key step kk is S tiles 2kk and 2kk+1 as an A fragment */
#pragma unroll
        for (int kk = 0; kk < MA_TK / 16; kk++) {
            const uint32_t pa[4] = {M::pack(s[2 * kk][0], s[2 * kk][1]), M::pack(s[2 * kk][2], s[2 * kk][3]),
                                    M::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    M::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            const HT *vr = sv + (16 * kk + (lane & 15)) * LD;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                uint32_t b[2];
                ldmatrix_x2_trans(b, vr + 8 * n);
                M::mma(o[n], pa, b[0], b[1]);
            }
        }
    }

    /* the rows' sums over their 4 lanes, sinks, and the output */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(FULL_MASK, l[h], 1);
        l[h] += __shfl_xor_sync(FULL_MASK, l[h], 2);
    }
    const int rr[2] = {rlo, rhi};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = rr[h] / a.gp, hd = pass * a.gp + rr[h] % a.gp;
        if (i >= ntok || hd >= a.G) continue;
        float L = l[h], f = 1.0f;
        if (a.sinks) f = att_fold_sink(a.sinks[kh * a.G + hd], m[h], &L);
        f = L > 0.0f ? f / L : 0.0f;
        float *out = a.out + (size_t)(t0 + i) * a.Hq * DH + (size_t)(kh * a.G + hd) * DH;
#pragma unroll
        for (int n = 0; n < NT; n++)
            *(float2 *)(out + 8 * n + 2 * c) = make_float2(o[n][2 * h] * f, o[n][2 * h + 1] * f);
    }
}

template <class HT, int DH>
static enum moe_status launch_mma(cudaStream_t st, const struct ma_args *a)
{
    const unsigned tiles = (unsigned)((a->T + a->tq - 1) / a->tq + a->n_seqs);
    dim3 grid(tiles, (unsigned)(a->Hkv * a->n_pass));
    mma_attention_kernel<HT, DH><<<grid, MA_WARPS * 32, 0, st>>>(*a);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" bool moe_attention_mma_supported(const struct moe_kvcache *kv, const struct moe_attn_params *p)
{
    return (kv->dtype == MOE_DTYPE_BF16 || kv->dtype == MOE_DTYPE_F16) &&
           (p->head_dim == 64 || p->head_dim == 128);
}

extern "C" enum moe_status moe_attention_prefill_mma_cuda(cudaStream_t st, float *out, const float *q,
                                                          const struct moe_kvcache *kv,
                                                          const struct moe_batch *db,
                                                          const struct moe_attn_params *p)
{
    const int T = db->n_tokens;
    if (T <= 0) return MOE_OK;
    if (!moe_attention_mma_supported(kv, p))
        return moe_fail(MOE_ERR_UNSUPPORTED, "CUDA mma attention: %s cache, head dim %d",
                        moe_dtype_name(kv->dtype), p->head_dim);
    struct ma_args a;
    MOE_TRY(att_view_init(&a, out, q, kv, db, p, 128));
    if (db->n_seqs <= 0 || db->n_seqs > 65535 * 1024)
        return moe_fail(MOE_ERR_INVALID_ARG, "attention: %d sequences", db->n_seqs);
    a.G = p->n_heads / p->n_kv_heads;
    a.n_pass = (a.G + MA_MAXG - 1) / MA_MAXG;
    a.gp = (a.G + a.n_pass - 1) / a.n_pass;
    a.tq = MA_ROWS / a.gp;
    if ((long long)p->n_kv_heads * a.n_pass > 65535)
        return moe_fail(MOE_ERR_INVALID_ARG, "attention: %d KV heads x %d passes", p->n_kv_heads, a.n_pass);
    a.seq_start = db->seq_start;
    a.T = T;
    a.n_seqs = db->n_seqs;
    const bool bf = kv->dtype == MOE_DTYPE_BF16;
    if (p->head_dim == 64) return bf ? launch_mma<__nv_bfloat16, 64>(st, &a) : launch_mma<__half, 64>(st, &a);
    return bf ? launch_mma<__nv_bfloat16, 128>(st, &a) : launch_mma<__half, 128>(st, &a);
}
