/* forward_linear.c - the layers of hybrid models (Qwen3-Next, Qwen3.5-MoE): the Gated
 * DeltaNet block of a linear-attention layer, and the gated output of
 * its attention layers (the configuration: runtime/model/config.h, the
 * weights: runtime/model/model_qwen3next.c).
 *
 * Linear-attention block, from the normed input xn:
 *   proj = in_proj_qkvz xn, ba = in_proj_ba xn   (grouped by q/k head)
 *   qkv, z, b, a = their columns, gathered        (q, k, v in conv order)
 *     (Qwen3.5-MoE: qkv, z, b, a = four products)
 *   o = delta_net(qkv, b, a) over each sequence's state slot
 *   out = out_proj (silu(z) * rmsnorm_per_value_head(o) * norm)
 * Attention layer with an output gate: q_proj gives each head's queries
 * and then its gates; the attention output times sigmoid(gate). */
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/forward.h"

#define WALLOC(ptr, n, type) MOE_FORWARD_ALLOC(be, ptr, n, type)

/* A column table to backend memory. */
static enum moe_status upload_index(struct moe_backend *be, int32_t **dst, const int32_t *idx, size_t n)
{
    WALLOC(*dst, n, int32_t);
    return be->ops->to_device(be, *dst, idx, n * sizeof(int32_t));
}

/* The column tables of in_proj_qkvz's and in_proj_ba's products: per q/k
 * head g (of W = 2 Dk + 2 r Dv columns, r = Hv / Hk) q, k, r v and r z;
 * (of 2 r) r b then r a. */
static enum moe_status linear_tables(struct moe_forward *fw)
{
    struct moe_backend *be = fw->be;
    const struct moe_config *c = &fw->m->cfg;
    const int Hk = c->lin_k_heads, Hv = c->lin_v_heads, Dk = c->lin_k_dim, Dv = c->lin_v_dim, r = Hv / Hk;
    const int W = 2 * Dk + 2 * r * Dv, C = moe_config_conv_dim(c);
    int32_t *qkv = malloc((size_t)C * sizeof *qkv), *z = malloc((size_t)Hv * Dv * sizeof *z),
            *bb = malloc((size_t)Hv * sizeof *bb), *aa = malloc((size_t)Hv * sizeof *aa);
    enum moe_status s = MOE_OK;
    if (!qkv || !z || !bb || !aa) s = moe_fail(MOE_ERR_NOMEM, "forward: linear-attention column tables");
    for (int g = 0; s == MOE_OK && g < Hk; g++) {
        for (int i = 0; i < Dk; i++) {
            qkv[g * Dk + i] = g * W + i;
            qkv[Hk * Dk + g * Dk + i] = g * W + Dk + i;
        }
        for (int j = 0; j < r * Dv; j++) {
            qkv[2 * Hk * Dk + g * r * Dv + j] = g * W + 2 * Dk + j;
            z[g * r * Dv + j] = g * W + 2 * Dk + r * Dv + j;
        }
        for (int j = 0; j < r; j++) {
            bb[g * r + j] = g * 2 * r + j;
            aa[g * r + j] = g * 2 * r + r + j;
        }
    }
    struct moe_forward_lin *a = &fw->lin;
    if (s == MOE_OK) s = upload_index(be, &a->ix_qkv, qkv, (size_t)C);
    if (s == MOE_OK) s = upload_index(be, &a->ix_z, z, (size_t)Hv * Dv);
    if (s == MOE_OK) s = upload_index(be, &a->ix_b, bb, (size_t)Hv);
    if (s == MOE_OK) s = upload_index(be, &a->ix_a, aa, (size_t)Hv);
    if (s == MOE_OK) s = be->ops->sync(be); /* the staging copies are done before the tables go */
    free(qkv);
    free(z);
    free(bb);
    free(aa);
    return s;
}

/* q_proj's product of a gated attention layer: head h's queries at
 * columns h 2Dh .. h 2Dh + Dh - 1, its gates after them. */
static enum moe_status gate_tables(struct moe_forward *fw)
{
    struct moe_backend *be = fw->be;
    const struct moe_config *c = &fw->m->cfg;
    const int Q = c->n_heads * c->head_dim, Dh = c->head_dim;
    int32_t *q = malloc((size_t)Q * sizeof *q), *g = malloc((size_t)Q * sizeof *g);
    enum moe_status s = q && g ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "forward: attention gate tables");
    for (int i = 0; s == MOE_OK && i < Q; i++) {
        q[i] = i / Dh * 2 * Dh + i % Dh;
        g[i] = q[i] + Dh;
    }
    if (s == MOE_OK) s = upload_index(be, &fw->lin.ix_q, q, (size_t)Q);
    if (s == MOE_OK) s = upload_index(be, &fw->lin.ix_g, g, (size_t)Q);
    if (s == MOE_OK) s = be->ops->sync(be);
    free(q);
    free(g);
    return s;
}

enum moe_status moe_forward_lin_init(struct moe_forward *fw)
{
    struct moe_backend *be = fw->be;
    const struct moe_config *c = &fw->m->cfg;
    struct moe_forward_lin *a = &fw->lin;
    const bool linear = moe_config_linear_layers(c) > 0;
    if (!linear && !c->attn_out_gate) return MOE_OK;
    if (!be->ops->gather_cols || (linear && !be->ops->delta_net))
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: %s's linear-attention layers (Gated DeltaNet) are not "
                        "supported yet; use a CPU backend", be->ops->name, c->architecture);
    const size_t T = (size_t)fw->lim.max_tokens, Q = (size_t)c->n_heads * c->head_dim;
    if (c->attn_out_gate) {
        WALLOC(a->qg, T * 2 * Q, float);
        WALLOC(a->gate, T * Q, float);
        MOE_TRY(gate_tables(fw));
    }
    if (!linear) return MOE_OK;
    const size_t Kd = (size_t)c->lin_k_heads * c->lin_k_dim, Vd = (size_t)c->lin_v_heads * c->lin_v_dim,
                 Hv = (size_t)c->lin_v_heads;
    WALLOC(a->proj, T * (2 * Kd + 2 * Vd), float);
    WALLOC(a->qkv, T * (2 * Kd + Vd), float);
    WALLOC(a->z, T * Vd, float);
    WALLOC(a->ba, T * 2 * Hv, float);
    WALLOC(a->b, T * Hv, float);
    WALLOC(a->a, T * Hv, float);
    WALLOC(a->o, T * Vd, float);
    WALLOC(fw->b_state, (size_t)fw->lim.max_seqs, int32_t);
    return linear_tables(fw);
}

void moe_forward_lin_free(struct moe_forward *fw)
{
    struct moe_forward_lin *a = &fw->lin;
    void *bufs[] = {a->proj, a->qkv, a->z, a->ba, a->b, a->a, a->o, a->ix_qkv, a->ix_z, a->ix_b, a->ix_a,
                    a->qg, a->gate, a->ix_q, a->ix_g, fw->b_state};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) fw->be->ops->dealloc(fw->be, bufs[i]);
    memset(a, 0, sizeof *a);
    fw->b_state = NULL;
}

/* n <= 4 products of fw->xn without biases: together when the backend can
 * and no weight orders its columns */
static enum moe_status products(struct moe_forward *fw, int n, float *const *y, const struct moe_tensor *const *ws,
                                int T)
{
    struct moe_backend *be = fw->be;
    const struct moe_tensor *const none[4] = {NULL, NULL, NULL, NULL};
    bool plain = be->ops->matmul_multi != NULL;
    for (int i = 0; i < n; i++) plain = plain && !ws[i]->cols;
    if (plain) return be->ops->matmul_multi(be, n, y, fw->xn, ws, none, T);
    for (int i = 0; i < n; i++) MOE_TRY(moe_forward_linear(fw, y[i], fw->xn, ws[i], NULL, T));
    return MOE_OK;
}

enum moe_status moe_forward_lin_block(struct moe_forward *fw, struct moe_kvcache *kv, const struct moe_batch *db,
                                      int l)
{
    struct moe_backend *be = fw->be;
    const struct moe_backend_ops *op = be->ops;
    const struct moe_config *c = &fw->m->cfg;
    const struct moe_layer_weights *w = &fw->m->layers[l];
    struct moe_forward_lin *a = &fw->lin;
    const int T = db->n_tokens, Hv = c->lin_v_heads, Dv = c->lin_v_dim, Vd = Hv * Dv, C = moe_config_conv_dim(c);
    const int P = 2 * c->lin_k_heads * c->lin_k_dim + 2 * Vd;
    if (w->lin_in.data) { /* Qwen3-Next: two products grouped by q/k head, their columns gathered */
        float *const y[2] = {a->proj, a->ba};
        const struct moe_tensor *const ws[2] = {&w->lin_in, &w->lin_ba};
        MOE_TRY(products(fw, 2, y, ws, T));
        MOE_TRY(op->gather_cols(be, a->qkv, C, a->proj, P, T, a->ix_qkv, C));
        MOE_TRY(op->gather_cols(be, a->z, Vd, a->proj, P, T, a->ix_z, Vd));
        MOE_TRY(op->gather_cols(be, a->b, Hv, a->ba, 2 * Hv, T, a->ix_b, Hv));
        MOE_TRY(op->gather_cols(be, a->a, Hv, a->ba, 2 * Hv, T, a->ix_a, Hv));
    } else { /* Qwen3.5-MoE: four apart, in order */
        float *const y[4] = {a->qkv, a->z, a->b, a->a};
        const struct moe_tensor *const ws[4] = {&w->lin_qkv, &w->lin_z, &w->lin_b, &w->lin_a};
        MOE_TRY(products(fw, 4, y, ws, T));
    }
    const struct moe_delta_params p = {
        .layer = moe_config_linear_layer(c, l), .n_k_heads = c->lin_k_heads, .n_v_heads = Hv,
        .k_dim = c->lin_k_dim, .v_dim = Dv, .conv = c->lin_conv, .conv_w = w->lin_conv.data,
        .a_log = w->lin_a_log.data, .dt_bias = w->lin_dt_bias.data,
    };
    MOE_TRY(op->delta_net(be, a->o, a->qkv, a->b, a->a, kv, db, &p));
    MOE_TRY(op->rmsnorm(be, a->o, a->o, &w->lin_norm, T * Hv, Dv, c->rms_eps));
    MOE_TRY(op->swiglu(be, a->z, a->o, (size_t)T * Vd)); /* z = silu(z) * o */
    return moe_forward_linear(fw, fw->out, a->z, &w->lin_out, NULL, T);
}

enum moe_status moe_forward_lin_split_q(struct moe_forward *fw, int T)
{
    struct moe_backend *be = fw->be;
    const struct moe_config *c = &fw->m->cfg;
    const int Q = c->n_heads * c->head_dim;
    MOE_TRY(be->ops->gather_cols(be, fw->q, Q, fw->lin.qg, 2 * Q, T, fw->lin.ix_q, Q));
    return be->ops->gather_cols(be, fw->lin.gate, Q, fw->lin.qg, 2 * Q, T, fw->lin.ix_g, Q);
}
