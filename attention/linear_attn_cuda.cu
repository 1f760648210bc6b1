/* linear_attn_cuda.cu - CUDA twin of attention/linear_attn_cpu.c: the
 * Gated DeltaNet of hybrid models (attention.h, moe_attention_delta_cpu).
 *
 * conv_kernel: a thread per (sequence, channel) walks the sequence's rows
 * in order with the channel's carried inputs in registers (width <= 8),
 * convolves and applies SiLU in place, and writes the last inputs back to
 * the state slot.
 * delta_kernel: a block per (sequence, value head), a thread per value
 * column j (Dv threads): the thread keeps column j of the head's state S
 * (Dk <= 128 values, in registers; larger Dk is refused) for the whole
 * step; per row the block stages q and k of the head's q/k head in shared
 * memory, each thread forms their norms, decays its column, forms
 * (S^T k)[j], the delta, the update and (S^T q)[j], all in the CPU's
 * order.  The device's expf, log1pf and divisions may differ from the
 * host's in the last bit: results agree to rounding.  A sequence whose first row is at
 * position 0 starts from zeros. */
#include <math.h>

#include "attention/attention.h"
#include "attention/attention_cuda.h"
#include "runtime/cuda/cuda_util.h"

#define CONV_THREADS 128
#define CONV_MAX 8
#define MAXDK 128 /* a thread's state column in registers (every released model: 128) */

static __device__ float silu_d(float x) { return x / (1.0f + expf(-x)); }

static __global__ void conv_kernel(float *qkv, float *state, size_t slot_floats, size_t layer_off,
                                   const int32_t *slots, const int32_t *seq_start, const int32_t *pos,
                                   const float *w, int C, int K)
{
    const int s = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float *hist = state + (size_t)slots[s] * slot_floats + layer_off + (size_t)c * (K - 1);
    const int r0 = seq_start[s], r1 = seq_start[s + 1];
    const bool fresh = pos[r0] == 0;
    float h[CONV_MAX];
    for (int j = 0; j < K - 1; j++) h[j] = fresh ? 0.0f : hist[j];
    const float *wc = w + (size_t)c * K;
    for (int t = r0; t < r1; t++) {
        float *x = &qkv[(size_t)t * C + c];
        const float in = *x;
        float y = 0.0f;
        for (int j = 0; j < K - 1; j++) y += wc[j] * h[j];
        y += wc[K - 1] * in;
        for (int j = 0; j + 1 < K - 1; j++) h[j] = h[j + 1];
        if (K > 1) h[K - 2] = in;
        *x = silu_d(y);
    }
    for (int j = 0; j < K - 1; j++) hist[j] = h[j];
}

template <int MAXK>
static __global__ void delta_kernel(float *out, const float *qkv, const float *bg, const float *ag,
                                    float *state, size_t slot_floats, size_t s_off, const int32_t *slots,
                                    const int32_t *seq_start, const int32_t *pos, const float *a_log,
                                    const float *dt_bias, int Hk, int Hv, int Dk, int Dv)
{
    extern __shared__ float sh[]; /* q (Dk), k (Dk) */
    float *q = sh, *k = sh + Dk;
    const int s = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    const int C = 2 * Hk * Dk + Hv * Dv, kh = h / (Hv / Hk);
    const int r0 = seq_start[s], r1 = seq_start[s + 1];
    float *S = state + (size_t)slots[s] * slot_floats + s_off + (size_t)h * Dk * Dv;
    const bool fresh = pos[r0] == 0;
    float col[MAXK];
    for (int i = 0; i < Dk; i++) col[i] = fresh ? 0.0f : S[(size_t)i * Dv + j];
    const float qs = 1.0f / sqrtf((float)Dk), rate = -expf(a_log[h]), dtb = dt_bias[h];
    for (int t = r0; t < r1; t++) {
        const float *row = qkv + (size_t)t * C;
        __syncthreads(); /* the previous row's q and k are read */
        for (int i = j; i < Dk; i += blockDim.x) {
            q[i] = row[(size_t)kh * Dk + i];
            k[i] = row[(size_t)Hk * Dk + (size_t)kh * Dk + i];
        }
        __syncthreads();
        float sq = 0.0f, sk = 0.0f; /* every thread, in the CPU's order */
        for (int i = 0; i < Dk; i++) {
            sq += q[i] * q[i];
            sk += k[i] * k[i];
        }
        const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
        const float bx = bg[(size_t)t * Hv + h], ax = ag[(size_t)t * Hv + h] + dtb;
        const float beta = 1.0f / (1.0f + expf(-bx));
        const float decay = expf(rate * (ax > 20.0f ? ax : log1pf(expf(ax))));
        const float v = row[2 * (size_t)Hk * Dk + (size_t)h * Dv + j];
        float d = 0.0f;
        for (int i = 0; i < Dk; i++) {
            col[i] *= decay;
            d += col[i] * (k[i] * ik);
        }
        d = (v - d) * beta;
        float o = 0.0f;
        for (int i = 0; i < Dk; i++) {
            col[i] += (k[i] * ik) * d;
            o += col[i] * (q[i] * iq * qs);
        }
        out[(size_t)t * Hv * Dv + (size_t)h * Dv + j] = o;
    }
    for (int i = 0; i < Dk; i++) S[(size_t)i * Dv + j] = col[i];
}

extern "C" enum moe_status moe_attention_delta_cuda(cudaStream_t st, float *out, float *qkv, const float *b,
                                                    const float *a, struct moe_kvcache *kv,
                                                    const struct moe_batch *db, const struct moe_delta_params *p)
{
    const int Hk = p->n_k_heads, Hv = p->n_v_heads, Dk = p->k_dim, Dv = p->v_dim, K = p->conv;
    const int C = 2 * Hk * Dk + Hv * Dv, n = db->n_seqs;
    if (n <= 0) return MOE_OK;
    if (K < 1 || K > CONV_MAX || Dv > 1024 || Dk > MAXDK || Dk < 1 || Dv < 1)
        return moe_fail(MOE_ERR_UNSUPPORTED, "cuda linear attention: convolution width %d (at most %d), head "
                        "dimensions %d x %d (at most %d x 1024)", K, CONV_MAX, Dk, Dv, MAXDK);
    const size_t layer_off = (size_t)p->layer * kv->state_layer_floats;
    dim3 cg((unsigned)((C + CONV_THREADS - 1) / CONV_THREADS), (unsigned)n);
    conv_kernel<<<cg, CONV_THREADS, 0, st>>>(qkv, kv->state, kv->state_floats, layer_off, db->state_slot,
                                              db->seq_start, db->positions, p->conv_w, C, K);
    MOE_CUDA_LAUNCHED();
    const size_t shm = 2 * (size_t)Dk * sizeof(float), s_off = layer_off + kv->state_conv_floats;
    dim3 dg((unsigned)n, (unsigned)Hv);
    delta_kernel<MAXDK><<<dg, Dv, shm, st>>>(out, qkv, b, a, kv->state, kv->state_floats, s_off,
                                              db->state_slot, db->seq_start, db->positions, p->a_log,
                                              p->dt_bias, Hk, Hv, Dk, Dv);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
