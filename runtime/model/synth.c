/* synth.c - synthetic checkpoints: seeded random weights of any
 * configuration, built in memory (`--synthetic CONFIG.json`) or written as a
 * safetensors checkpoint (`moerun synth`).
 *
 * Tensors use the transformers 5 names and the stacked expert layout
 * (`mlp.experts.gate_up_proj` (E, 2F, D), `mlp.experts.down_proj` (E, D, F)),
 * which transformers loads directly, or, on request, the legacy layout of
 * one tensor per expert and projection (the values then differ from the
 * stacked layout's: each tensor has its own stream).  Norm weights are 1; every other
 * weight is uniform with standard deviation initializer_range.  Values come
 * from a counter-based generator keyed by (seed, tensor, chunk), so they do
 * not depend on the thread count.  gpt-oss is written as transformers keeps
 * it (experts transposed), or with MXFP4 experts as released when its
 * configuration's quantization_config says mxfp4; an fp8 configuration gets
 * its Linear weights in FP8 with 128 x 128 block scales, as released
 * (add_fp8). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/model.h"
#include "runtime/model/synth.h"
#include "runtime/model/synth_skew.h"

#define CHUNK 65536

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t moe_synth_key(uint64_t seed, int index)
{
    return mix64(seed) ^ mix64(0x5eed0000ull + (uint64_t)index);
}

/* Values [lo, hi) of a tensor whose data starts at data: value i is the
 * (i mod CHUNK + 1)-th draw of its chunk's stream, so any range gets the
 * values the whole tensor has there. */
static void fill_random(void *data, enum moe_dtype dt, size_t lo, size_t hi, uint64_t key, float std)
{
    const float a = std * sqrtf(3.0f); /* uniform(-a, a) has std `std` */
    if (lo >= hi) return;
    const size_t c0 = lo / CHUNK, c1 = (hi + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t c = c0; c < c1; c++) {
        float buf[256];
        const size_t start = c * CHUNK > lo ? c * CHUNK : lo;
        uint64_t st = mix64(key ^ mix64(c + 1)) + (start - c * CHUNK) * 0x9e3779b97f4a7c15ull;
        size_t end = (c + 1) * CHUNK < hi ? (c + 1) * CHUNK : hi;
        for (size_t i = start; i < end; i += 256) {
            size_t m = end - i < 256 ? end - i : 256;
            for (size_t j = 0; j < m; j++) {
                st += 0x9e3779b97f4a7c15ull;
                double u = (double)(mix64(st) >> 11) * 0x1.0p-53; /* [0, 1) */
                buf[j] = (float)((2.0 * u - 1.0) * a);
            }
            moe_convert_from_f32((char *)data + i * moe_dtype_size(dt), buf, dt, m);
        }
    }
}

static void fill_ones(void *data, enum moe_dtype dt, size_t n)
{
    float one = 1.0f;
    for (size_t i = 0; i < n; i++) moe_convert_from_f32((char *)data + i * moe_dtype_size(dt), &one, dt, 1);
}

struct gen {
    struct moe_safetensors *st;
    enum moe_dtype dt;
    uint64_t seed;
    float std;
    int index;
    bool deferred; /* 1-byte placeholders instead of weights */
    bool fp8;      /* Linear weights as F8_E4M3 + scales (quantization_config fp8) */
    /* (n_layers x E) the experts to make, or NULL: all; the next adds are
     * the expert stacks (E, .., ..) of layer `stacks` (-1: none): the
     * others' values are left zero, their pages never touched */
    const uint8_t *held;
    int E, stacks;
};

static enum moe_status add_fp8(struct gen *g, int ndim, const int64_t *shape, const char *name);

/* The Linear weights an fp8 checkpoint stores in FP8 (runtime/model/model_fp8.c
 * binds them), by name: projections, stacked experts, Granite's fused
 * ones; not routers, norms, embeddings or the LM head. */
static bool fp8_linear_name(const char *name)
{
    static const char *const ends[] = {"_proj.weight", "_proj_with_mqa.weight", "experts.gate_up_proj",
                                       "experts.down_proj", "_linear.weight"};
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
        const size_t e = strlen(ends[i]);
        if (n >= e && !strcmp(name + n - e, ends[i])) return true;
    }
    return false;
}

static enum moe_status add(struct gen *g, bool ones, int ndim, int64_t d0, int64_t d1, int64_t d2,
                           const char *fmt, ...) MOE_PRINTF(7, 8);

static enum moe_status add(struct gen *g, bool ones, int ndim, int64_t d0, int64_t d1, int64_t d2,
                           const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t shape[3] = {d0, d1, d2};
    if (g->fp8 && !g->deferred && !ones && fp8_linear_name(name)) return add_fp8(g, ndim, shape, name);
    size_t n = 1, bytes;
    for (int i = 0; i < ndim; i++)
        if (!moe_mul_size(n, (size_t)shape[i], &n))
            return moe_fail(MOE_ERR_NOMEM, "synthetic tensor %s: size overflows", name);
    if (!moe_mul_size(n, moe_dtype_size(g->dt), &bytes))
        return moe_fail(MOE_ERR_NOMEM, "synthetic tensor %s: size overflows", name);
    const bool part = g->held && g->stacks >= 0 && !g->deferred && !ones && ndim == 3 && d0 == g->E;
    /* calloc: a large buffer is fresh zero pages, resident only where written */
    void *data = part ? calloc(bytes ? bytes : 1, 1) : malloc(bytes && !g->deferred ? bytes : 1);
    if (!data)
        return moe_fail(MOE_ERR_NOMEM, "synthetic tensor %s: cannot allocate %zu bytes", name, bytes);
    const uint64_t key = moe_synth_key(g->seed, g->index);
    if (g->deferred) *(unsigned char *)data = ones;
    else if (ones) fill_ones(data, g->dt, n);
    else if (part) {
        const size_t per = n / (size_t)g->E;
        for (int e = 0; e < g->E; e++)
            if (g->held[(size_t)g->stacks * g->E + e]) fill_random(data, g->dt, e * per, (e + 1) * per, key, g->std);
    } else fill_random(data, g->dt, 0, n, key, g->std);
    g->index++;
    return moe_safetensors_add(g->st, name, g->dt, ndim, shape, data);
}

static enum moe_status synth_tensors(struct moe_safetensors *st, const struct moe_config *c,
                                     enum moe_dtype dt, uint64_t seed, bool deferred,
                                     enum moe_synth_layout layout, const uint8_t *held);

uint8_t moe_synth_mxfp4_scale(float std)
{
    const int e = 127 + (int)lrint(log2(std / 2.93));
    return (uint8_t)(e < 1 ? 1 : e > 254 ? 254 : e);
}

/* MXFP4 experts as the released gpt-oss checkpoints store them: blocks of
 * uniformly random E2M1 codes (rms 2.93), and every scale
 * moe_synth_mxfp4_scale, so the weights have about the configuration's
 * standard deviation. */
static enum moe_status add_mxfp4(struct gen *g, int64_t E, int64_t N, int64_t K, const char *prefix)
{
    char name[256];
    const int64_t G = K / 32, bshape[4] = {E, N, G, 16}, sshape[3] = {E, N, G};
    size_t nb, ns;
    if (!moe_mul_size((size_t)(E * N), (size_t)G * 16, &nb) || !moe_mul_size((size_t)(E * N), (size_t)G, &ns))
        return moe_fail(MOE_ERR_NOMEM, "synthetic tensor %s_blocks: size overflows", prefix);
    /* deferred: 1-byte placeholders (0: random), made on the device */
    uint8_t *b = calloc(g->deferred || !nb ? 1 : nb, 1), *sc = calloc(g->deferred || !ns ? 1 : ns, 1);
    if (!b || !sc) {
        free(b), free(sc);
        return moe_fail(MOE_ERR_NOMEM, "synthetic tensor %s_blocks: cannot allocate %zu bytes", prefix, nb);
    }
    uint64_t st = moe_synth_key(g->seed, g->index++);
    for (size_t i = 0; i < nb && !g->deferred; i += 8) {
        st += 0x9e3779b97f4a7c15ull;
        const uint64_t r = mix64(st);
        for (size_t j = 0; j < 8 && i + j < nb; j++) b[i + j] = (uint8_t)(r >> (8 * j));
    }
    if (!g->deferred) memset(sc, moe_synth_mxfp4_scale(g->std), ns);
    snprintf(name, sizeof name, "%s_blocks", prefix);
    enum moe_status s = moe_safetensors_add(g->st, name, MOE_DTYPE_U8, 4, bshape, b);
    if (s != MOE_OK) {
        free(sc);
        return s;
    }
    snprintf(name, sizeof name, "%s_scales", prefix);
    return moe_safetensors_add(g->st, name, MOE_DTYPE_U8, 3, sshape, sc);
}

/* An fp8 checkpoint's Linear weight (N, K), or a stack (E, N, K): `name`
 * F8_E4M3 of random codes (sign, exponent 2^-2 .. 2^2, mantissa uniform:
 * rms 3.03) and its scales (.., ceil(N/128), ceil(K/128)) F32, each std /
 * rms, so the weights have about the configuration's standard deviation
 * (as add_mxfp4). */
static enum moe_status add_fp8(struct gen *g, int ndim, const int64_t *shape, const char *name)
{
    const int64_t B = ndim == 3 ? shape[0] : 1, N = shape[ndim - 2], K = shape[ndim - 1];
    const int64_t sshape[3] = {B, (N + 127) / 128, (K + 127) / 128};
    size_t nq, ns;
    if (!moe_mul_size((size_t)(B * N), (size_t)K, &nq) ||
        !moe_mul_size((size_t)B, (size_t)(sshape[1] * sshape[2]), &ns))
        return moe_fail(MOE_ERR_NOMEM, "synthetic tensor %s: size overflows", name);
    uint8_t *q = malloc(nq ? nq : 1);
    float *sc = malloc(ns ? ns * sizeof(float) : 1);
    if (!q || !sc) {
        free(q), free(sc);
        return moe_fail(MOE_ERR_NOMEM, "synthetic tensor %s: cannot allocate %zu bytes", name, nq);
    }
    double sum = 0; /* mean square of the codes drawn */
    for (int e = 5; e <= 9; e++)
        for (int m = 0; m < 8; m++) sum += pow(moe_fp8_e4m3_to_f32((uint8_t)(e << 3 | m)), 2);
    const float scale = (float)(g->std / sqrt(sum / 40));
    uint64_t st = moe_synth_key(g->seed, g->index++);
    for (size_t i = 0; i < nq; i++) {
        st += 0x9e3779b97f4a7c15ull;
        const uint64_t r = mix64(st);
        q[i] = (uint8_t)((r & 0x80) | (5 + (r >> 8) % 5) << 3 | (r >> 16 & 7));
    }
    for (size_t i = 0; i < ns; i++) sc[i] = scale;
    char sname[288];
    const size_t len = strlen(name);
    if (len > 7 && !strcmp(name + len - 7, ".weight"))
        snprintf(sname, sizeof sname, "%.*s.weight_scale_inv", (int)(len - 7), name);
    else
        snprintf(sname, sizeof sname, "%s_scale_inv", name);
    const int off = ndim == 3 ? 0 : 1; /* 2-D: the grid without the stack dimension */
    enum moe_status s = moe_safetensors_add(g->st, name, MOE_DTYPE_F8E4M3, ndim, shape, q);
    if (s != MOE_OK) {
        free(sc);
        return s;
    }
    return moe_safetensors_add(g->st, sname, MOE_DTYPE_F32, ndim, sshape + off, sc);
}

/* DeepSeek's multi-head latent attention (runtime/model/model_deepseek.c). */
static enum moe_status add_mla(struct gen *g, const struct moe_config *c, int l)
{
    const int64_t D = c->d_model, H = c->n_heads, Rc = c->kv_lora_rank, Rq = c->q_lora_rank,
                  R = c->rope_dim, QK = c->qk_nope_dim + c->rope_dim, V = c->v_head_dim;
    const char *p = "model.layers";
    if (Rq > 0) {
        MOE_TRY(add(g, false, 2, Rq, D, 0, "%s.%d.self_attn.q_a_proj.weight", p, l));
        MOE_TRY(add(g, true, 1, Rq, 0, 0, "%s.%d.self_attn.q_a_layernorm.weight", p, l));
        MOE_TRY(add(g, false, 2, H * QK, Rq, 0, "%s.%d.self_attn.q_b_proj.weight", p, l));
    } else {
        MOE_TRY(add(g, false, 2, H * QK, D, 0, "%s.%d.self_attn.q_proj.weight", p, l));
    }
    MOE_TRY(add(g, false, 2, Rc + R, D, 0, "%s.%d.self_attn.kv_a_proj_with_mqa.weight", p, l));
    MOE_TRY(add(g, true, 1, Rc, 0, 0, "%s.%d.self_attn.kv_a_layernorm.weight", p, l));
    MOE_TRY(add(g, false, 2, H * (c->qk_nope_dim + V), Rc, 0, "%s.%d.self_attn.kv_b_proj.weight", p, l));
    if (c->dsa_topk > 0 && !c->layer_dsa_shared[l]) { /* the sparse attention's indexer (not on shared layers) */
        const int64_t Hi = c->dsa_heads, Di = c->dsa_dim;
        MOE_TRY(add(g, false, 2, Hi * Di, Rq, 0, "%s.%d.self_attn.indexer.wq_b.weight", p, l));
        MOE_TRY(add(g, false, 2, Di, D, 0, "%s.%d.self_attn.indexer.wk.weight", p, l));
        MOE_TRY(add(g, true, 1, Di, 0, 0, "%s.%d.self_attn.indexer.k_norm.weight", p, l));
        MOE_TRY(add(g, false, 1, Di, 0, 0, "%s.%d.self_attn.indexer.k_norm.bias", p, l));
        MOE_TRY(add(g, false, 2, Hi, D, 0, "%s.%d.self_attn.indexer.weights_proj.weight", p, l));
    }
    return add(g, false, 2, D, H * V, 0, "%s.%d.self_attn.o_proj.weight", p, l);
}

/* A Gated DeltaNet layer's linear_attn.* (model_qwen3next.c); the gated
 * norm's weight is ones, the others random */
static enum moe_status add_linear_attn(struct gen *g, const struct moe_config *c, int l)
{
    const int64_t D = c->d_model, Hv = c->lin_v_heads, Kd = (int64_t)c->lin_k_heads * c->lin_k_dim,
                  Vd = Hv * c->lin_v_dim;
    const char *p = "model.layers";
    if (c->family == MOE_FAMILY_QWEN3_5_MOE) {
        MOE_TRY(add(g, false, 2, 2 * Kd + Vd, D, 0, "%s.%d.linear_attn.in_proj_qkv.weight", p, l));
        MOE_TRY(add(g, false, 2, Vd, D, 0, "%s.%d.linear_attn.in_proj_z.weight", p, l));
        MOE_TRY(add(g, false, 2, Hv, D, 0, "%s.%d.linear_attn.in_proj_b.weight", p, l));
        MOE_TRY(add(g, false, 2, Hv, D, 0, "%s.%d.linear_attn.in_proj_a.weight", p, l));
    } else {
        MOE_TRY(add(g, false, 2, 2 * Kd + 2 * Vd, D, 0, "%s.%d.linear_attn.in_proj_qkvz.weight", p, l));
        MOE_TRY(add(g, false, 2, 2 * Hv, D, 0, "%s.%d.linear_attn.in_proj_ba.weight", p, l));
    }
    MOE_TRY(add(g, false, 3, 2 * Kd + Vd, 1, c->lin_conv, "%s.%d.linear_attn.conv1d.weight", p, l));
    MOE_TRY(add(g, false, 1, Hv, 0, 0, "%s.%d.linear_attn.A_log", p, l));
    MOE_TRY(add(g, false, 1, Hv, 0, 0, "%s.%d.linear_attn.dt_bias", p, l));
    MOE_TRY(add(g, true, 1, c->lin_v_dim, 0, 0, "%s.%d.linear_attn.norm.weight", p, l));
    return add(g, false, 2, D, Vd, 0, "%s.%d.linear_attn.out_proj.weight", p, l);
}

/* gpt-oss's MoE block: router with bias; experts transposed (E, D, 2F) and
 * (E, F, D) as transformers keeps them, or MXFP4 when the configuration
 * says so; biases. */
static enum moe_status add_gpt_oss_moe(struct gen *g, const struct moe_config *c, int l)
{
    const int64_t D = c->d_model, E = c->n_experts, F = c->d_expert;
    const char *p = "model.layers";
    char pre[128];
    MOE_TRY(add(g, false, 2, E, D, 0, "%s.%d.mlp.router.weight", p, l));
    MOE_TRY(add(g, false, 1, E, 0, 0, "%s.%d.mlp.router.bias", p, l));
    if (c->experts_mxfp4) {
        snprintf(pre, sizeof pre, "%s.%d.mlp.experts.gate_up_proj", p, l);
        MOE_TRY(add_mxfp4(g, E, 2 * F, D, pre));
        snprintf(pre, sizeof pre, "%s.%d.mlp.experts.down_proj", p, l);
        MOE_TRY(add_mxfp4(g, E, D, F, pre));
    } else {
        MOE_TRY(add(g, false, 3, E, D, 2 * F, "%s.%d.mlp.experts.gate_up_proj", p, l));
        MOE_TRY(add(g, false, 3, E, F, D, "%s.%d.mlp.experts.down_proj", p, l));
    }
    MOE_TRY(add(g, false, 2, E, 2 * F, 0, "%s.%d.mlp.experts.gate_up_proj_bias", p, l));
    return add(g, false, 2, E, D, 0, "%s.%d.mlp.experts.down_proj_bias", p, l);
}

/* Llama-4's MoE block as transformers keeps it (model_llama4.c). */
static enum moe_status add_llama4_moe(struct gen *g, const struct moe_config *c, int l)
{
    const int64_t D = c->d_model, E = c->n_experts, F = c->d_expert, S = c->d_shared;
    MOE_TRY(add(g, false, 2, E, D, 0, "model.layers.%d.feed_forward.router.weight", l));
    MOE_TRY(add(g, false, 3, E, D, 2 * F, "model.layers.%d.feed_forward.experts.gate_up_proj", l));
    MOE_TRY(add(g, false, 3, E, F, D, "model.layers.%d.feed_forward.experts.down_proj", l));
    MOE_TRY(add(g, false, 2, S, D, 0, "model.layers.%d.feed_forward.shared_expert.gate_proj.weight", l));
    MOE_TRY(add(g, false, 2, S, D, 0, "model.layers.%d.feed_forward.shared_expert.up_proj.weight", l));
    return add(g, false, 2, D, S, 0, "model.layers.%d.feed_forward.shared_expert.down_proj.weight", l);
}

/* The sigmoid router's choice bias: F32 whatever the weights' dtype, as
 * transformers keeps it. */
static enum moe_status add_router_bias(struct gen *g, const struct moe_config *c, int64_t E, int l)
{
    if (!c->router_bias) return MOE_OK;
    const enum moe_dtype keep = g->dt;
    g->dt = MOE_DTYPE_F32;
    enum moe_status s = c->family == MOE_FAMILY_MINIMAX_M2 /* a buffer of the MoE block */
        ? add(g, false, 1, E, 0, 0, "model.layers.%d.mlp.e_score_correction_bias", l)
        : add(g, false, 1, E, 0, 0, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
    g->dt = keep;
    return s;
}

enum moe_status moe_synth_tensors(struct moe_safetensors *st, const struct moe_config *c,
                                  enum moe_dtype dt, uint64_t seed, enum moe_synth_layout layout)
{
    return synth_tensors(st, c, dt, seed, false, layout, NULL);
}

static enum moe_status synth_tensors(struct moe_safetensors *st, const struct moe_config *c,
                                     enum moe_dtype dt, uint64_t seed, bool deferred,
                                     enum moe_synth_layout layout, const uint8_t *held)
{
    if (dt != MOE_DTYPE_F32 && dt != MOE_DTYPE_F16 && dt != MOE_DTYPE_BF16)
        return moe_fail(MOE_ERR_INVALID_ARG, "synthetic weights: dtype %s (use F32, F16 or BF16)",
                        moe_dtype_name(dt));
    struct gen g = {st,       dt,   seed, c->init_std > 0 ? c->init_std : 0.02f, 0, deferred, c->weights_fp8,
                    held, c->n_experts, -1};
    const int64_t D = c->d_model, V = c->vocab, Q = (int64_t)c->n_heads * c->head_dim,
                  KV = (int64_t)c->n_kv_heads * c->head_dim, E = c->n_experts, F = c->d_expert;
    MOE_TRY(add(&g, false, 2, V, D, 0, "model.embed_tokens.weight"));
    MOE_TRY(add(&g, true, 1, D, 0, 0, "model.norm.weight"));
    if (!c->tie_embeddings) MOE_TRY(add(&g, false, 2, V, D, 0, "lm_head.weight"));
    for (int l = 0; l < c->n_layers; l++) {
        const char *p = "model.layers";
        MOE_TRY(add(&g, true, 1, D, 0, 0, "%s.%d.input_layernorm.weight", p, l));
        MOE_TRY(add(&g, true, 1, D, 0, 0, "%s.%d.post_attention_layernorm.weight", p, l));
        if (c->layer_linear[l]) {
            MOE_TRY(add_linear_attn(&g, c, l));
        } else if (c->kv_lora_rank > 0) {
            MOE_TRY(add_mla(&g, c, l));
        } else {
            MOE_TRY(add(&g, false, 2, c->attn_out_gate ? 2 * Q : Q, D, 0, "%s.%d.self_attn.q_proj.weight", p, l));
            MOE_TRY(add(&g, false, 2, KV, D, 0, "%s.%d.self_attn.k_proj.weight", p, l));
            MOE_TRY(add(&g, false, 2, KV, D, 0, "%s.%d.self_attn.v_proj.weight", p, l));
            MOE_TRY(add(&g, false, 2, D, Q, 0, "%s.%d.self_attn.o_proj.weight", p, l));
        }
        if (c->qkv_bias && !c->layer_linear[l]) {
            MOE_TRY(add(&g, false, 1, Q, 0, 0, "%s.%d.self_attn.q_proj.bias", p, l));
            MOE_TRY(add(&g, false, 1, KV, 0, 0, "%s.%d.self_attn.k_proj.bias", p, l));
            MOE_TRY(add(&g, false, 1, KV, 0, 0, "%s.%d.self_attn.v_proj.bias", p, l));
        }
        if (c->o_bias && !c->layer_linear[l]) MOE_TRY(add(&g, false, 1, D, 0, 0, "%s.%d.self_attn.o_proj.bias", p, l));
        if (c->qk_norm != MOE_QK_NORM_NONE && !c->layer_linear[l]) {
            bool full = c->qk_norm == MOE_QK_NORM_FULL;
            MOE_TRY(add(&g, true, 1, full ? Q : c->head_dim, 0, 0, "%s.%d.self_attn.q_norm.weight", p, l));
            MOE_TRY(add(&g, true, 1, full ? KV : c->head_dim, 0, 0, "%s.%d.self_attn.k_norm.weight", p, l));
        }
        if (!c->layer_moe[l]) {
            const int64_t Fd = c->d_ff;
            const char *f = c->family == MOE_FAMILY_LLAMA4 ? "feed_forward" : "mlp";
            MOE_TRY(add(&g, false, 2, Fd, D, 0, "%s.%d.%s.gate_proj.weight", p, l, f));
            MOE_TRY(add(&g, false, 2, Fd, D, 0, "%s.%d.%s.up_proj.weight", p, l, f));
            MOE_TRY(add(&g, false, 2, D, Fd, 0, "%s.%d.%s.down_proj.weight", p, l, f));
            if (c->mlp_bias) {
                MOE_TRY(add(&g, false, 1, Fd, 0, 0, "%s.%d.mlp.gate_proj.bias", p, l));
                MOE_TRY(add(&g, false, 1, Fd, 0, 0, "%s.%d.mlp.up_proj.bias", p, l));
                MOE_TRY(add(&g, false, 1, D, 0, 0, "%s.%d.mlp.down_proj.bias", p, l));
            }
            continue;
        }
        if (c->attn_sinks) MOE_TRY(add(&g, false, 1, c->n_heads, 0, 0, "%s.%d.self_attn.sinks", p, l));
        if (c->family == MOE_FAMILY_LLAMA4) { /* whatever the layout asked */
            MOE_TRY(add_llama4_moe(&g, c, l));
            continue;
        }
        if (c->family == MOE_FAMILY_GPT_OSS) { /* whatever the layout asked */
            MOE_TRY(add_gpt_oss_moe(&g, c, l));
            continue;
        }
        if (c->family == MOE_FAMILY_GRANITE_MOE) { /* fused, whatever the layout asked */
            MOE_TRY(add(&g, false, 2, E, D, 0, "%s.%d.block_sparse_moe.router.layer.weight", p, l));
            g.stacks = l;
            MOE_TRY(add(&g, false, 3, E, 2 * F, D, "%s.%d.block_sparse_moe.input_linear.weight", p, l));
            MOE_TRY(add(&g, false, 3, E, D, F, "%s.%d.block_sparse_moe.output_linear.weight", p, l));
            g.stacks = -1;
            if (c->d_shared > 0) {
                MOE_TRY(add(&g, false, 2, 2 * (int64_t)c->d_shared, D, 0,
                            "%s.%d.shared_mlp.input_linear.weight", p, l));
                MOE_TRY(add(&g, false, 2, D, c->d_shared, 0, "%s.%d.shared_mlp.output_linear.weight", p, l));
            }
            continue;
        }
        if (layout == MOE_SYNTH_PER_EXPERT) {
            const bool mx = c->family == MOE_FAMILY_MIXTRAL;
            const char *blk = mx ? "block_sparse_moe" : "mlp";
            const char *gn = mx ? "w1" : "gate_proj", *un = mx ? "w3" : "up_proj",
                       *dn = mx ? "w2" : "down_proj";
            MOE_TRY(add(&g, false, 2, E, D, 0, "%s.%d.%s.gate.weight", p, l, blk));
            MOE_TRY(add_router_bias(&g, c, E, l));
            for (int64_t e = 0; e < E; e++) {
                MOE_TRY(add(&g, false, 2, F, D, 0, "%s.%d.%s.experts.%lld.%s.weight", p, l, blk,
                            (long long)e, gn));
                MOE_TRY(add(&g, false, 2, F, D, 0, "%s.%d.%s.experts.%lld.%s.weight", p, l, blk,
                            (long long)e, un));
                MOE_TRY(add(&g, false, 2, D, F, 0, "%s.%d.%s.experts.%lld.%s.weight", p, l, blk,
                            (long long)e, dn));
            }
        } else {
            MOE_TRY(add(&g, false, 2, E, D, 0, "%s.%d.mlp.gate.weight", p, l));
            MOE_TRY(add_router_bias(&g, c, E, l));
            g.stacks = l;
            MOE_TRY(add(&g, false, 3, E, 2 * F, D, "%s.%d.mlp.experts.gate_up_proj", p, l));
            MOE_TRY(add(&g, false, 3, E, D, F, "%s.%d.mlp.experts.down_proj", p, l));
            g.stacks = -1;
        }
        if (c->d_shared > 0) {
            const int64_t S = c->d_shared;
            const char *sh = c->family == MOE_FAMILY_QWEN2_MOE || c->family == MOE_FAMILY_QWEN3_NEXT ||
                             c->family == MOE_FAMILY_QWEN3_5_MOE ? "shared_expert" : "shared_experts";
            MOE_TRY(add(&g, false, 2, S, D, 0, "%s.%d.mlp.%s.gate_proj.weight", p, l, sh));
            MOE_TRY(add(&g, false, 2, S, D, 0, "%s.%d.mlp.%s.up_proj.weight", p, l, sh));
            MOE_TRY(add(&g, false, 2, D, S, 0, "%s.%d.mlp.%s.down_proj.weight", p, l, sh));
            if (c->shared_gate)
                MOE_TRY(add(&g, false, 2, 1, D, 0, "%s.%d.mlp.shared_expert_gate.weight", p, l));
        }
    }
    return MOE_OK;
}

enum moe_status moe_model_synthetic_part(struct moe_model *m, const struct moe_config *cfg, enum moe_dtype dtype,
                                         uint64_t seed, const struct moe_synth_part *o)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    enum moe_status s = MOE_OK;
    if (o->skew && o->deferred)
        s = moe_fail(MOE_ERR_INVALID_ARG, "a router skew is applied on the host, not to weights made on the device");
    if (o->deferred) {
        m->weights_deferred = true;
        m->synth_seed = seed;
        m->synth_std = cfg->init_std > 0 ? cfg->init_std : 0.02f;
    }
    if (s == MOE_OK && o->held) s = moe_model_set_held(m, o->held);
    if (s == MOE_OK) s = synth_tensors(&m->st, cfg, dtype, seed, o->deferred, MOE_SYNTH_STACKED, o->held);
    if (s == MOE_OK && o->skew) s = moe_synth_apply_skew(&m->st, cfg, o->skew, seed, o->held);
    if (s == MOE_OK) s = moe_model_bind(m);
    if (s != MOE_OK) {
        moe_error_prefix("synthetic model: ");
        moe_model_free(m);
    }
    return s;
}

enum moe_status moe_model_synthetic(struct moe_model *m, const struct moe_config *cfg, enum moe_dtype dtype,
                                    uint64_t seed)
{
    const struct moe_synth_part o = {0};
    return moe_model_synthetic_part(m, cfg, dtype, seed, &o);
}

enum moe_status moe_model_synthetic_deferred(struct moe_model *m, const struct moe_config *cfg,
                                             enum moe_dtype dtype, uint64_t seed)
{
    const struct moe_synth_part o = {.deferred = true};
    return moe_model_synthetic_part(m, cfg, dtype, seed, &o);
}
