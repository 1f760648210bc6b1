/* linear_attn_impl.h - the Gated DeltaNet's loops (attention.h,
 * moe_attention_delta_cpu), included by linear_attn_cpu.c (plain C, the
 * reference backend), linear_attn_avx2.c and linear_attn_avx512.c (the
 * same loops compiled for those sets, the fast backend).  The includer
 * defines DELTA_FMA(a, b, c) (a * b + c, fused or not), DELTA_NC (the
 * columns of a register block), DELTA_CHUNK and DELTA_CHUNK_MIN
 * (attention.h) and the entry's name, DELTA_ENTRY.
 *
 * A sequence's run of rows is taken by the recurrent form token by token
 * when shorter than DELTA_CHUNK_MIN rows (decode; or than the params'
 * chunk_min when set), else by the chunked
 * form (transformers' torch_chunk_gated_delta_rule) in chunks of
 * DELTA_CHUNK rows.  Within a chunk of L rows, state S0 at its start,
 * G_i the chunk's running sum of the log decays g, Kb_i = beta_i k_i:
 *   A_ij = -beta_i e^(G_i - G_j) k_i . k_j (j < i);  T = (I - A)^-1
 *   U = T (beta v) - T (Kb e^G) S0          (each row's d of the recurrence)
 *   out_i = e^(G_i) q_i S0 + sum_(j <= i) e^(G_i - G_j) (q_i . k_j) U_j
 *   S = e^(G_L) S0 + sum_i e^(G_L - G_i) k_i U_i^T
 * The chunk's products are delta_gemm's register blocks of DELTA_RB rows
 * by DELTA_NC columns, kept over the whole inner dimension, their
 * innermost index over contiguous values (a row of S, U, k transposed), so
 * the compiler vectorises them without reassociating a sum, and S is read
 * once per DELTA_RB rows instead of once per row. */
#pragma once

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <string.h>

#include "attention/attention.h"

enum { DELTA_CH = DELTA_CHUNK, DELTA_RB = 4 };

static inline float delta_silu(float x) { return x / (1.0f + expf(-x)); }

/* torch.nn.functional.softplus (beta 1, threshold 20) */
static inline float delta_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* x (n) times 1 / sqrt(sum x^2 + 1e-6), then times s; the sum in 8
 * strided partial sums, added in order */
static inline void delta_l2norm(float *y, const float *x, int n, float s)
{
    float part[8] = {0}, ss = 0.0f;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) part[l] = DELTA_FMA(x[i + l], x[i + l], part[l]);
    for (; i < n; i++) ss = DELTA_FMA(x[i], x[i], ss);
    for (int l = 0; l < 8; l++) ss += part[l];
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * s;
}

/* y += c x over n values */
static inline void delta_axpy(float *restrict y, float c, const float *restrict x, int n)
{
    for (int j = 0; j < n; j++) y[j] = DELTA_FMA(c, x[j], y[j]);
}

/* The layer's state in sequence s's slot. */
static inline float *delta_slot(const struct moe_kvcache *kv, const struct moe_batch *bt, int s, int layer)
{
    return kv->state + (size_t)bt->state_slot[s] * kv->state_floats + (size_t)layer * kv->state_layer_floats;
}

/* Channels c0..c1-1 of one sequence's rows r0..r1-1 (x: the layer's qkv,
 * rows C apart): each channel's convolution with its carried inputs
 * (hist: (K - 1) per channel, from c0's), SiLU, in place; a row's
 * channels taken together, so x is read along its rows. */
static inline void delta_conv(float *x, int C, int r0, int r1, int c0, int c1, float *hist, const float *w, int K)
{
    for (int t = r0; t < r1; t++) {
        float *xr = &x[(size_t)t * C];
        for (int c = c0; c < c1; c++) {
            float *hc = &hist[(size_t)(c - c0) * (K - 1)];
            const float *wc = &w[(size_t)c * K], in = xr[c];
            float y = 0.0f;
            for (int j = 0; j < K - 1; j++) y += wc[j] * hc[j];
            y += wc[K - 1] * in;
            for (int j = 0; j + 1 < K - 1; j++) hc[j] = hc[j + 1];
            if (K > 1) hc[K - 2] = in;
            xr[c] = delta_silu(y);
        }
    }
}

/* The shape of value head h, shared by both forms. */
struct delta_head {
    int Hk, Hv, Dk, Dv, C, h;
    const float *qkv, *b, *a; /* the layer's rows */
    float *out, *S;           /* out's rows, the head's state (Dk, Dv) */
    float qs, rate, dt_bias;  /* 1 / sqrt(Dk), -exp(a_log), dt_bias */
};

static inline struct delta_head delta_head_of(float *out, const float *qkv, const float *b, const float *a,
                                              float *S, int h, const struct moe_delta_params *p)
{
    return (struct delta_head){
        .Hk = p->n_k_heads, .Hv = p->n_v_heads, .Dk = p->k_dim, .Dv = p->v_dim,
        .C = 2 * p->n_k_heads * p->k_dim + p->n_v_heads * p->v_dim, .h = h,
        .qkv = qkv, .b = b, .a = a, .out = out, .S = S,
        .qs = 1.0f / sqrtf((float)p->k_dim), .rate = -expf(p->a_log[h]), .dt_bias = p->dt_bias[h],
    };
}

/* Row t's normalised q and k, beta and log decay g. */
static inline void delta_row(const struct delta_head *d, int t, float *q, float *k, float *beta, float *g)
{
    const int kh = d->h / (d->Hv / d->Hk);
    const float *row = &d->qkv[(size_t)t * d->C];
    delta_l2norm(q, row + (size_t)kh * d->Dk, d->Dk, d->qs);
    delta_l2norm(k, row + (size_t)d->Hk * d->Dk + (size_t)kh * d->Dk, d->Dk, 1.0f);
    *beta = 1.0f / (1.0f + expf(-d->b[(size_t)t * d->Hv + d->h]));
    *g = d->rate * delta_softplus(d->a[(size_t)t * d->Hv + d->h] + d->dt_bias);
}

static inline const float *delta_v(const struct delta_head *d, int t)
{
    return &d->qkv[(size_t)t * d->C + 2 * (size_t)d->Hk * d->Dk + (size_t)d->h * d->Dv];
}

static inline float *delta_out(const struct delta_head *d, int t)
{
    return &d->out[(size_t)t * d->Hv * d->Dv + (size_t)d->h * d->Dv];
}

/* The recurrent form over rows r0..r1-1, two passes over S a row:
 *   y = S^T k, e = S^T q (read); decay = e^g; d = (v - decay y) beta;
 *   S = decay S + k d^T (read and write); out = decay e + (k . q) d.
 * ws: 4 Dv + 2 Dk floats. */
static inline void delta_recurrent(const struct delta_head *d, int r0, int r1, float *ws)
{
    const int Dk = d->Dk, Dv = d->Dv;
    float *q = ws, *k = q + Dk, *y = k + Dk, *e = y + Dv, *dd = e + Dv;
    float *S = d->S;
    for (int t = r0; t < r1; t++) {
        float beta, g;
        delta_row(d, t, q, k, &beta, &g);
        const float decay = expf(g), *v = delta_v(d, t);
        float kq = 0.0f;
        for (int i = 0; i < Dk; i++) kq += k[i] * q[i];
        memset(y, 0, 2 * (size_t)Dv * sizeof(float));
        for (int i = 0; i < Dk; i++) {
            const float *Si = &S[(size_t)i * Dv];
            for (int j = 0; j < Dv; j++) {
                y[j] = DELTA_FMA(Si[j], k[i], y[j]);
                e[j] = DELTA_FMA(Si[j], q[i], e[j]);
            }
        }
        for (int j = 0; j < Dv; j++) dd[j] = (v[j] - decay * y[j]) * beta;
        for (int i = 0; i < Dk; i++) {
            float *Si = &S[(size_t)i * Dv];
            for (int j = 0; j < Dv; j++) Si[j] = DELTA_FMA(k[i], dd[j], Si[j] * decay);
        }
        float *o = delta_out(d, t);
        for (int j = 0; j < Dv; j++) o[j] = DELTA_FMA(kq, dd[j], decay * e[j]);
    }
}

/* y (mb <= DELTA_RB rows, ldy apart) += x (mb rows of k, ldx apart) times
 * B (k rows of n, ldb apart): a register block of DELTA_RB rows by
 * DELTA_NC columns kept over the whole of k, each row of B read once per
 * block. */
static inline void delta_gemm(float *y, size_t ldy, const float *x, size_t ldx, int mb, const float *B,
                              size_t ldb, int n, int k)
{
    int j0 = 0;
    for (; j0 + DELTA_NC <= n; j0 += DELTA_NC) {
        float acc[DELTA_RB][DELTA_NC];
        for (int r = 0; r < DELTA_RB; r++)
            for (int j = 0; j < DELTA_NC; j++) acc[r][j] = r < mb ? y[(size_t)r * ldy + j0 + j] : 0.0f;
        for (int p = 0; p < k; p++) {
            const float *b = &B[(size_t)p * ldb + j0];
            for (int r = 0; r < DELTA_RB; r++) {
                const float xv = r < mb ? x[(size_t)r * ldx + p] : 0.0f;
                for (int j = 0; j < DELTA_NC; j++) acc[r][j] = DELTA_FMA(xv, b[j], acc[r][j]);
            }
        }
        for (int r = 0; r < mb; r++)
            for (int j = 0; j < DELTA_NC; j++) y[(size_t)r * ldy + j0 + j] = acc[r][j];
    }
    if (j0 < n) /* the last n % DELTA_NC columns (small heads) */
        for (int r = 0; r < mb; r++)
            for (int p = 0; p < k; p++) delta_axpy(&y[(size_t)r * ldy + j0], x[(size_t)r * ldx + p],
                                                   &B[(size_t)p * ldb + j0], n - j0);
}

/* Floats of the chunked form's workspace. */
static inline size_t delta_chunk_floats(int Dk, int Dv)
{
    return (size_t)DELTA_CH * (4 * (size_t)Dk + 2 * (size_t)Dv + 2 * DELTA_CH + 4);
}

/* The chunked form over the L <= DELTA_CH rows from t0 (the header's
 * comment); ws: delta_chunk_floats.  Products by T, QK and within A only
 * over their lower triangles. */
static inline void delta_chunk(const struct delta_head *d, int t0, int L, float *ws)
{
    const int Dk = d->Dk, Dv = d->Dv, ldo = d->Hv * d->Dv;
    float *Q = ws, *Kb = Q + (size_t)DELTA_CH * Dk, *W = Kb + (size_t)DELTA_CH * Dk;
    float *KT = W + (size_t)DELTA_CH * Dk, *Vb = KT + (size_t)Dk * DELTA_CH, *U = Vb + (size_t)DELTA_CH * Dv;
    float *A = U + (size_t)DELTA_CH * Dv, *QK = A + DELTA_CH * DELTA_CH, *G = QK + DELTA_CH * DELTA_CH;
    float *beta = G + DELTA_CH, *eg = beta + DELTA_CH, *tmp = eg + DELTA_CH;
    float *S = d->S, *out = delta_out(d, t0);
    float gs = 0.0f;
    for (int i = 0; i < L; i++) {
        float g, *k = &W[(size_t)i * Dk]; /* W holds k until the rows of k are transposed */
        delta_row(d, t0 + i, &Q[(size_t)i * Dk], k, &beta[i], &g);
        G[i] = gs += g;
        eg[i] = expf(G[i]);
        const float *v = delta_v(d, t0 + i);
        for (int j = 0; j < Dv; j++) U[(size_t)i * Dv + j] = Vb[(size_t)i * Dv + j] = v[j] * beta[i];
        for (int p = 0; p < Dk; p++) {
            KT[(size_t)p * DELTA_CH + i] = k[p];
            Kb[(size_t)i * Dk + p] = k[p] * (beta[i] * eg[i]);
        }
    }
    if (L < DELTA_CH) /* the products below read KT's columns up to a whole block past L */
        for (int p = 0; p < Dk; p++) memset(&KT[(size_t)p * DELTA_CH + L], 0, (size_t)(DELTA_CH - L) * sizeof(float));
    /* A = K K^T and QK = Q K^T over the keys j <= i, then their factors */
    memset(A, 0, sizeof(float) * DELTA_CH * DELTA_CH);
    memset(QK, 0, sizeof(float) * DELTA_CH * DELTA_CH);
    for (int i0 = 0; i0 < L; i0 += DELTA_RB) {
        const int mb = L - i0 < DELTA_RB ? L - i0 : DELTA_RB;
        int n = (i0 + mb + DELTA_NC - 1) / DELTA_NC * DELTA_NC; /* whole blocks: columns past i are cleared below */
        if (n > DELTA_CH) n = DELTA_CH;
        delta_gemm(&A[(size_t)i0 * DELTA_CH], DELTA_CH, &W[(size_t)i0 * Dk], (size_t)Dk, mb, KT, DELTA_CH, n, Dk);
        delta_gemm(&QK[(size_t)i0 * DELTA_CH], DELTA_CH, &Q[(size_t)i0 * Dk], (size_t)Dk, mb, KT, DELTA_CH, n, Dk);
    }
    memcpy(W, Kb, (size_t)L * Dk * sizeof(float));
    for (int i = 0; i < L; i++) {
        float *Ai = &A[(size_t)i * DELTA_CH], *Qi = &QK[(size_t)i * DELTA_CH];
        for (int j = 0; j <= i; j++) {
            const float e = expf(G[i] - G[j]);
            Ai[j] *= -beta[i] * e;
            Qi[j] *= e;
        }
        for (int j = i; j < DELTA_CH; j++) Ai[j] = 0.0f; /* strictly lower */
        for (int j = i + 1; j < DELTA_CH; j++) Qi[j] = 0.0f;
    }
    /* T's strict lower part in place of A: T_i = A_i + sum_(m < i) A_im T_m */
    for (int i = 2; i < L; i++) {
        float *Ai = &A[(size_t)i * DELTA_CH];
        memcpy(tmp, Ai, (size_t)i * sizeof(float));
        for (int m = 1; m < i; m++) delta_axpy(Ai, tmp[m], &A[(size_t)m * DELTA_CH], m);
    }
    /* U = (I + T) (beta v), W = (I + T) Kb; then U -= W S0, out = (e^G q) S0 */
    for (int i = 0; i < L; i++) {
        memset(out + (size_t)i * ldo, 0, (size_t)Dv * sizeof(float));
        for (int p = 0; p < Dk; p++) Q[(size_t)i * Dk + p] *= eg[i];
    }
    for (int i0 = 0; i0 < L; i0 += DELTA_RB) {
        const int mb = L - i0 < DELTA_RB ? L - i0 : DELTA_RB, k = i0 + mb - 1;
        const float *Ti = &A[(size_t)i0 * DELTA_CH];
        delta_gemm(&U[(size_t)i0 * Dv], (size_t)Dv, Ti, DELTA_CH, mb, Vb, (size_t)Dv, Dv, k);
        delta_gemm(&W[(size_t)i0 * Dk], (size_t)Dk, Ti, DELTA_CH, mb, Kb, (size_t)Dk, Dk, k);
        for (size_t x = (size_t)i0 * Dk; x < (size_t)(i0 + mb) * Dk; x++) W[x] = -W[x];
        delta_gemm(&U[(size_t)i0 * Dv], (size_t)Dv, &W[(size_t)i0 * Dk], (size_t)Dk, mb, S, (size_t)Dv, Dv, Dk);
        delta_gemm(out + (size_t)i0 * ldo, (size_t)ldo, &Q[(size_t)i0 * Dk], (size_t)Dk, mb, S, (size_t)Dv, Dv,
                   Dk);
    }
    /* out += the chunk's own rows: QK U over j <= i */
    for (int i0 = 0; i0 < L; i0 += DELTA_RB) {
        const int mb = L - i0 < DELTA_RB ? L - i0 : DELTA_RB;
        delta_gemm(out + (size_t)i0 * ldo, (size_t)ldo, &QK[(size_t)i0 * DELTA_CH], DELTA_CH, mb, U, (size_t)Dv,
                   Dv, i0 + mb);
    }
    /* the state after the chunk: S = e^(G_L) S + (k e^(G_L - G))^T U */
    const float eL = eg[L - 1];
    for (int i = 0; i < L; i++) tmp[i] = expf(G[L - 1] - G[i]);
    for (int p = 0; p < Dk; p++) {
        float *kt = &KT[(size_t)p * DELTA_CH];
        for (int i = 0; i < L; i++) kt[i] *= tmp[i];
        for (int j = 0; j < Dv; j++) S[(size_t)p * Dv + j] *= eL;
    }
    for (int p0 = 0; p0 < Dk; p0 += DELTA_RB) {
        const int mb = Dk - p0 < DELTA_RB ? Dk - p0 : DELTA_RB;
        delta_gemm(&S[(size_t)p0 * Dv], (size_t)Dv, &KT[(size_t)p0 * DELTA_CH], DELTA_CH, mb, U, (size_t)Dv, Dv, L);
    }
}

/* The op (attention.h): conv per (sequence, channel block), then the delta
 * rule per (sequence, value head), each thread in its own per_thread
 * floats of scratch. */
static enum moe_status DELTA_ENTRY(float *out, float *qkv, const float *b, const float *a, struct moe_kvcache *kv,
                                   const struct moe_batch *bt, const struct moe_delta_params *p, float *scratch,
                                   size_t per_thread)
{
    const int Hk = p->n_k_heads, Hv = p->n_v_heads, Dk = p->k_dim, Dv = p->v_dim, K = p->conv;
    const int C = 2 * Hk * Dk + Hv * Dv, n = bt->n_seqs;
    for (int s = 0; s < n; s++)
        if (bt->positions[bt->seq_start[s]] == 0)
            memset(delta_slot(kv, bt, s, p->layer), 0, kv->state_layer_floats * sizeof(float));
    enum { CB = 64 }; /* channels per work item */
    const int nb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n * nb; i++) {
        const int s = (int)(i / nb), c0 = (int)(i % nb) * CB, c1 = c0 + CB < C ? c0 + CB : C;
        delta_conv(qkv, C, bt->seq_start[s], bt->seq_start[s + 1], c0, c1,
                   delta_slot(kv, bt, s, p->layer) + (size_t)c0 * (size_t)(K - 1), p->conv_w, K);
    }
    const int cmin = p->chunk_min > 0 ? p->chunk_min : DELTA_CHUNK_MIN;
    bool chunked = false;
    for (int s = 0; s < n; s++) chunked = chunked || bt->seq_start[s + 1] - bt->seq_start[s] >= cmin;
    const size_t wsf = chunked ? delta_chunk_floats(Dk, Dv) : 4 * (size_t)Dv + 2 * (size_t)Dk;
    if (wsf > per_thread)
        return moe_fail(MOE_ERR_INVALID_ARG, "delta_net: %zu floats of scratch per thread, %zu needed", per_thread,
                        wsf);
#pragma omp parallel
    {
        float *ws = scratch + (size_t)omp_get_thread_num() * per_thread;
#pragma omp for schedule(dynamic)
        for (long i = 0; i < (long)n * Hv; i++) {
            const int s = (int)(i / Hv), h = (int)(i % Hv), r0 = bt->seq_start[s], r1 = bt->seq_start[s + 1];
            float *S = delta_slot(kv, bt, s, p->layer) + kv->state_conv_floats + (size_t)h * Dk * Dv;
            const struct delta_head d = delta_head_of(out, qkv, b, a, S, h, p);
            if (r1 - r0 < cmin) delta_recurrent(&d, r0, r1, ws);
            else
                for (int t = r0; t < r1; t += DELTA_CH) delta_chunk(&d, t, r1 - t < DELTA_CH ? r1 - t : DELTA_CH, ws);
        }
    }
    return MOE_OK;
}
