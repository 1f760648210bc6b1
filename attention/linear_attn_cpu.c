/* linear_attn_cpu.c - the Gated DeltaNet of hybrid models on the CPU
 * (attention.h, moe_attention_delta_cpu): the causal convolution with its
 * carried inputs, then the delta rule over each value head's state.
 * Sequences and heads run in parallel; within a head, tokens in order. */
#include "attention/attention.h"

#include <math.h>
#include <string.h>

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* torch.nn.functional.softplus (beta 1, threshold 20) */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* x (n) times 1 / sqrt(sum x^2 + 1e-6), then times s */
static void l2norm(float *y, const float *x, int n, float s)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * s;
}

/* The layer's state in sequence s's slot. */
static float *slot_state(const struct moe_kvcache *kv, const struct moe_batch *bt, int s, int layer)
{
    return kv->state + (size_t)bt->state_slot[s] * kv->state_floats + (size_t)layer * kv->state_layer_floats;
}

/* One channel (x: its first row's value, rows C apart) of one sequence's
 * rows r0..r1-1: convolution with the carried inputs hist, SiLU, in place. */
static void conv_channel(float *x0, int C, int r0, int r1, float *hist, const float *w, int K)
{
    for (int t = r0; t < r1; t++) {
        float *x = &x0[(size_t)t * C];
        const float in = *x;
        float y = 0.0f;
        for (int j = 0; j < K - 1; j++) y += w[j] * hist[j];
        y += w[K - 1] * in;
        for (int j = 0; j + 1 < K - 1; j++) hist[j] = hist[j + 1];
        if (K > 1) hist[K - 2] = in;
        *x = silu(y);
    }
}

/* Value head h of sequence s over its rows r0..r1-1. */
static void delta_head(float *out, const float *qkv, const float *b, const float *a, float *S, int r0, int r1,
                       int h, const struct moe_delta_params *p)
{
    const int Hk = p->n_k_heads, Hv = p->n_v_heads, Dk = p->k_dim, Dv = p->v_dim;
    const int C = 2 * Hk * Dk + Hv * Dv, kh = h / (Hv / Hk);
    const float qs = 1.0f / sqrtf((float)Dk), rate = -expf(p->a_log[h]);
    float q[Dk], k[Dk], d[Dv];
    for (int t = r0; t < r1; t++) {
        const float *row = &qkv[(size_t)t * C];
        l2norm(q, row + (size_t)kh * Dk, Dk, qs);
        l2norm(k, row + (size_t)Hk * Dk + (size_t)kh * Dk, Dk, 1.0f);
        const float *v = row + 2 * (size_t)Hk * Dk + (size_t)h * Dv;
        const float beta = 1.0f / (1.0f + expf(-b[(size_t)t * Hv + h]));
        const float decay = expf(rate * softplus(a[(size_t)t * Hv + h] + p->dt_bias[h]));
        /* S *= decay; d = S^T k */
        for (int j = 0; j < Dv; j++) d[j] = 0.0f;
        for (int i = 0; i < Dk; i++) {
            float *Si = &S[(size_t)i * Dv];
            for (int j = 0; j < Dv; j++) {
                Si[j] *= decay;
                d[j] += Si[j] * k[i];
            }
        }
        for (int j = 0; j < Dv; j++) d[j] = (v[j] - d[j]) * beta;
        /* S += k d^T; out = S^T q */
        float *o = &out[(size_t)t * Hv * Dv + (size_t)h * Dv];
        for (int j = 0; j < Dv; j++) o[j] = 0.0f;
        for (int i = 0; i < Dk; i++) {
            float *Si = &S[(size_t)i * Dv];
            for (int j = 0; j < Dv; j++) {
                Si[j] += k[i] * d[j];
                o[j] += Si[j] * q[i];
            }
        }
    }
}

void moe_attention_delta_cpu(float *out, float *qkv, const float *b, const float *a, struct moe_kvcache *kv,
                             const struct moe_batch *bt, const struct moe_delta_params *p)
{
    const int Hk = p->n_k_heads, Hv = p->n_v_heads, Dk = p->k_dim, Dv = p->v_dim, K = p->conv;
    const int C = 2 * Hk * Dk + Hv * Dv, n = bt->n_seqs;
    for (int s = 0; s < n; s++)
        if (bt->positions[bt->seq_start[s]] == 0)
            memset(slot_state(kv, bt, s, p->layer), 0, kv->state_layer_floats * sizeof(float));
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n * C; i++) {
        const int s = (int)(i / C), c = (int)(i % C);
        conv_channel(qkv + c, C, bt->seq_start[s], bt->seq_start[s + 1],
                     slot_state(kv, bt, s, p->layer) + (size_t)c * (size_t)(K - 1), p->conv_w + (size_t)c * K,
                     K);
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n * Hv; i++) {
        const int s = (int)(i / Hv), h = (int)(i % Hv);
        float *S = slot_state(kv, bt, s, p->layer) + kv->state_conv_floats + (size_t)h * Dk * Dv;
        delta_head(out, qkv, b, a, S, bt->seq_start[s], bt->seq_start[s + 1], h, p);
    }
}
