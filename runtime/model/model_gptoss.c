/* model_gptoss.c - gpt-oss (GptOssForCausalLM) weights.
 *
 * gpt-oss differs from the other families in four tensors:
 *   self_attn.sinks (Hq)                 a logit per query head (attention.h)
 *   mlp.router.weight (E, D), .bias (E)  the router is a Linear with a bias
 *   mlp.experts.gate_up_proj{,_bias}     gate and up interleaved: output 2f is
 *                                        gate f, output 2f+1 is up f
 *   mlp.experts.down_proj{,_bias}
 * and the experts come in one of two layouts:
 *   - as transformers keeps them: gate_up_proj (E, D, 2F) and down_proj
 *     (E, F, D), i.e. transposed (x @ W), in a float dtype;
 *   - as the released checkpoints store them: MXFP4, gate_up_proj_blocks
 *     (E, 2F, D/32, 16) and gate_up_proj_scales (E, 2F, D/32) uint8, and
 *     down_proj_blocks (E, D, F/32, 16) / down_proj_scales (E, D, F/32)
 *     (the format: runtime/core/tensor.h, MOE_DTYPE_MXFP4).
 * Either way the experts are rewritten at load into moerun's table of
 * (F, D) gate, (F, D) up and (D, F) down matrices, in memory the model owns
 * (per layer: gate and up of the experts this process holds stacked (H,
 * 2F, D) gate rows first, then (H, D, F) down; H = E but under expert
 * parallelism, where the other ranks' experts are neither read nor
 * given memory); the source pages are given back once read.  Biases and
 * sinks are widened to F32. */
#include <string.h>

#include "runtime/model/model_impl.h"

#define NAMEF(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

enum moe_status moe_model_bind_gpt_oss_sinks(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    char n[MOE_NAME_MAX];
    NAMEF(n, "model.layers.%d.self_attn.sinks", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->sinks, true, n, 1, m->cfg.n_heads, 0, 0));
    return moe_model_widen_f32(m, &w->sinks);
}

/* b_gate, b_up (E, F) F32 from gate_up_proj_bias src (E, 2F) interleaved. */
static enum moe_status deinterleave(struct moe_model *m, struct moe_expert_weights *x, const float *src,
                                    int64_t E, int64_t F)
{
    float *b;
    MOE_TRY(moe_model_own(m, (size_t)(2 * E * F) * sizeof(float), (void **)&b));
    for (int64_t i = 0; i < E * F; i++) {
        b[i] = src[2 * i];
        b[E * F + i] = src[2 * i + 1];
    }
    x->b_gate = (struct moe_tensor){.dtype = MOE_DTYPE_F32, .ndim = 2, .shape = {E, F}, .data = b,
                                    .device = -1};
    x->b_up = x->b_gate;
    x->b_up.data = b + E * F;
    return MOE_OK;
}

/* gate_up_proj_bias (E, 2F) interleaved -> b_gate, b_up (E, F); down_proj_bias
 * (E, D) -> b_down, all F32.  Deferred (weights made on the device): b_gate
 * and b_up one placeholder, made as F32 there. */
static enum moe_status bind_biases(struct moe_model *m, int l, struct moe_expert_weights *x)
{
    const struct moe_config *c = &m->cfg;
    const int64_t E = c->n_experts, F = c->d_expert, D = c->d_model;
    char n[MOE_NAME_MAX];
    struct moe_tensor gu;
    NAMEF(n, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
    MOE_TRY(moe_model_bind_tensor(m, &gu, true, n, 2, E, 2 * F, 0));
    MOE_TRY(moe_model_widen_f32(m, &gu));
    if (m->weights_deferred) { /* one device buffer of random values for both */
        x->b_gate = gu;
        x->b_gate.shape[1] = F;
        x->b_up = x->b_gate;
    } else {
        MOE_TRY(deinterleave(m, x, gu.data, E, F));
    }
    NAMEF(n, "model.layers.%d.mlp.experts.down_proj_bias", l);
    MOE_TRY(moe_model_bind_tensor(m, &x->b_down, true, n, 2, E, D, 0));
    return moe_model_widen_f32(m, &x->b_down);
}

/* The expert table of layer l over one owned buffer: the gate and up
 * rows of the i-th expert m holds at i * 2F rows (gate first), then its
 * down rows at H * 2F + i * D; experts m does not hold stay NULL. */
static enum moe_status expert_table(struct moe_model *m, int l, struct moe_expert_weights *x, enum moe_dtype dt)
{
    const struct moe_config *c = &m->cfg;
    const size_t E = (size_t)c->n_experts, F = (size_t)c->d_expert, D = (size_t)c->d_model;
    const size_t gate = F * moe_dtype_row_bytes(dt, D), down = D * moe_dtype_row_bytes(dt, F);
    size_t H = 0;
    for (size_t e = 0; e < E; e++) H += moe_model_holds(m, l, (int)e);
    size_t per, all;
    if (!moe_mul_size(2, gate, &per) || per + down < per || !moe_mul_size(per + down, H ? H : 1, &all))
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: experts of %zu x %zu x %zu overflow", E, F, D);
    x->gate = calloc(E, sizeof *x->gate);
    x->up = calloc(E, sizeof *x->up);
    x->down = calloc(E, sizeof *x->down);
    if (!x->gate || !x->up || !x->down) return moe_fail(MOE_ERR_NOMEM, "expert table");
    void *buf;
    MOE_TRY(moe_model_own(m, all, &buf));
    char *gu = buf, *dn = (char *)buf + H * per;
    x->dtype = dt;
    for (size_t e = 0, i = 0; e < E; e++) {
        if (!moe_model_holds(m, l, (int)e)) continue;
        x->gate[e] = gu + i * per;
        x->up[e] = gu + i * per + gate;
        x->down[e] = dn + i * down;
        i++;
    }
    return MOE_OK;
}

enum moe_status moe_model_bind_experts_transposed(struct moe_model *m, int l, const char *gu_name,
                                                  const char *dn_name, bool interleaved, struct moe_expert_weights *x)
{
    const struct moe_config *c = &m->cfg;
    const int64_t E = c->n_experts, F = c->d_expert, D = c->d_model;
    struct moe_tensor gu, dn;
    MOE_TRY(moe_model_bind_tensor(m, &gu, true, gu_name, 3, E, D, 2 * F));
    MOE_TRY(moe_model_bind_tensor(m, &dn, true, dn_name, 3, E, F, D));
    if (dn.dtype != gu.dtype)
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: %s and %s differ in dtype", dn_name, gu_name);
    MOE_TRY(expert_table(m, l, x, gu.dtype));
    const size_t es = moe_dtype_size(gu.dtype);
    for (int64_t e = 0; e < E; e++) {
        if (!x->gate[e]) continue; /* another rank's */
        const char *src = (const char *)gu.data + (size_t)(e * D * 2 * F) * es;
        char *gate = (char *)x->gate[e], *up = (char *)x->up[e];
        for (int64_t i = 0; i < D; i++) /* row i of the source: input i, all 2F outputs */
            for (int64_t f = 0; f < F; f++) {
                const int64_t gf = interleaved ? 2 * f : f, uf = interleaved ? 2 * f + 1 : F + f;
                memcpy(gate + (size_t)(f * D + i) * es, src + (size_t)(i * 2 * F + gf) * es, es);
                memcpy(up + (size_t)(f * D + i) * es, src + (size_t)(i * 2 * F + uf) * es, es);
            }
        const char *dsrc = (const char *)dn.data + (size_t)(e * F * D) * es;
        char *down = (char *)x->down[e];
        for (int64_t f = 0; f < F; f++)
            for (int64_t i = 0; i < D; i++)
                memcpy(down + (size_t)(i * F + f) * es, dsrc + (size_t)(f * D + i) * es, es);
    }
    moe_safetensors_release(&m->st, gu.data, (size_t)(E * D * 2 * F) * es, true);
    moe_safetensors_release(&m->st, dn.data, (size_t)(E * F * D) * es, true);
    return MOE_OK;
}

/* A uint8 tensor `name` of exactly the given shape. */
static enum moe_status find_u8(const struct moe_model *m, const char *name, int ndim,
                               const int64_t *shape, const uint8_t **out)
{
    const struct moe_st_tensor *t = moe_safetensors_find(&m->st, name);
    if (!t) return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' is missing", name);
    bool ok = t->dtype == MOE_DTYPE_U8 && t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[96] = "", got[96] = "";
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), i ? ", %lld" : "%lld",
                     (long long)shape[i]);
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), i ? ", %lld" : "%lld",
                     (long long)t->shape[i]);
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' is %s (%s), expected U8 (%s)", name,
                        moe_dtype_name(t->dtype), got, want);
    }
    *out = t->data;
    return MOE_OK;
}

/* Packs rows [0, N) of one expert's MXFP4 matrix (N, K) into dst, taking
 * source row src_row(r) = r * stride + offset (stride 2 de-interleaves). */
static enum moe_status pack_rows(char *dst, const uint8_t *blocks, const uint8_t *scales, int64_t N,
                                 int64_t K, int stride, int offset, const char *name, int64_t e)
{
    const size_t row = moe_dtype_row_bytes(MOE_DTYPE_MXFP4, (size_t)K), G = (size_t)K / 32;
    for (int64_t r = 0; r < N; r++) {
        const size_t s = (size_t)(r * stride + offset);
        if (!moe_mxfp4_pack_row(dst + (size_t)r * row, blocks + s * G * 16, scales + s * G, (size_t)K))
            return moe_fail(MOE_ERR_FORMAT, "checkpoint: %s: expert %lld row %zu has a scale of 255 "
                            "(E8M0 NaN)", name, (long long)e, s);
    }
    return MOE_OK;
}

/* The released layout: MXFP4 blocks and scales. */
static enum moe_status bind_mxfp4(struct moe_model *m, int l, struct moe_expert_weights *x)
{
    const struct moe_config *c = &m->cfg;
    const int64_t E = c->n_experts, F = c->d_expert, D = c->d_model;
    if (D % 32 || F % 32)
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: MXFP4 experts need hidden_size (%lld) and "
                        "intermediate_size (%lld) to be multiples of 32", (long long)D, (long long)F);
    char gb[MOE_NAME_MAX], gs[MOE_NAME_MAX], db[MOE_NAME_MAX], ds[MOE_NAME_MAX];
    NAMEF(gb, "model.layers.%d.mlp.experts.gate_up_proj_blocks", l);
    NAMEF(gs, "model.layers.%d.mlp.experts.gate_up_proj_scales", l);
    NAMEF(db, "model.layers.%d.mlp.experts.down_proj_blocks", l);
    NAMEF(ds, "model.layers.%d.mlp.experts.down_proj_scales", l);
    const uint8_t *gub = NULL, *gus = NULL, *dnb = NULL, *dns = NULL;
    MOE_TRY(find_u8(m, gb, 4, (int64_t[]){E, 2 * F, D / 32, 16}, &gub));
    MOE_TRY(find_u8(m, gs, 3, (int64_t[]){E, 2 * F, D / 32}, &gus));
    MOE_TRY(find_u8(m, db, 4, (int64_t[]){E, D, F / 32, 16}, &dnb));
    MOE_TRY(find_u8(m, ds, 3, (int64_t[]){E, D, F / 32}, &dns));
    if (m->weights_deferred) { /* made on the device: the table names the placeholders, each expert's
                                  pointer offset by its codes' place in the stack (a key, never read) */
        x->gate = calloc((size_t)E, sizeof *x->gate);
        x->up = calloc((size_t)E, sizeof *x->up);
        x->down = calloc((size_t)E, sizeof *x->down);
        if (!x->gate || !x->up || !x->down) return moe_fail(MOE_ERR_NOMEM, "expert table");
        for (int64_t e = 0; e < E; e++)
            x->gate[e] = x->up[e] = gub + (size_t)e * (size_t)(F * D), x->down[e] = dnb + (size_t)e * (size_t)(D * F / 2);
        x->dtype = MOE_DTYPE_MXFP4;
        return MOE_OK;
    }
    MOE_TRY(expert_table(m, l, x, MOE_DTYPE_MXFP4));
    const size_t gu_rows = (size_t)(2 * F), dn_rows = (size_t)D;
    for (int64_t e = 0; e < E; e++) {
        if (!x->gate[e]) continue; /* another rank's */
        const uint8_t *b = gub + (size_t)e * gu_rows * (size_t)D / 2, *s = gus + (size_t)e * gu_rows * (size_t)D / 32;
        MOE_TRY(pack_rows((char *)x->gate[e], b, s, F, D, 2, 0, gb, e));
        MOE_TRY(pack_rows((char *)x->up[e], b, s, F, D, 2, 1, gb, e));
        MOE_TRY(pack_rows((char *)x->down[e], dnb + (size_t)e * dn_rows * (size_t)F / 2,
                          dns + (size_t)e * dn_rows * (size_t)F / 32, D, F, 1, 0, db, e));
    }
    moe_safetensors_release(&m->st, gub, (size_t)E * gu_rows * (size_t)D / 2, true);
    moe_safetensors_release(&m->st, dnb, (size_t)E * dn_rows * (size_t)F / 2, true);
    return MOE_OK;
}

enum moe_status moe_model_bind_gpt_oss_moe(struct moe_model *m, int l, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    char n[MOE_NAME_MAX], d[MOE_NAME_MAX];
    NAMEF(n, "model.layers.%d.mlp.router.weight", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->router, true, n, 2, c->n_experts, c->d_model, 0));
    NAMEF(n, "model.layers.%d.mlp.router.bias", l);
    MOE_TRY(moe_model_bind_tensor(m, &w->router_b, true, n, 1, c->n_experts, 0, 0));
    MOE_TRY(moe_model_widen_f32(m, &w->router_b));
    struct moe_expert_weights *x = &w->experts;
    NAMEF(n, "model.layers.%d.mlp.experts.gate_up_proj_blocks", l);
    if (moe_safetensors_find(&m->st, n)) {
        MOE_TRY(bind_mxfp4(m, l, x));
    } else {
        NAMEF(n, "model.layers.%d.mlp.experts.gate_up_proj", l);
        NAMEF(d, "model.layers.%d.mlp.experts.down_proj", l);
        MOE_TRY(moe_model_bind_experts_transposed(m, l, n, d, true, x));
    }
    x->alpha = c->swiglu_alpha;
    x->limit = c->swiglu_limit;
    return bind_biases(m, l, x);
}
