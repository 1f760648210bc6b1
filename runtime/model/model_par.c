/* model_par.c - a model across processes: its share of the attention and
 * dense layers under tensor parallelism (see moe_model_tp_split in
 * model.h), and the fingerprint by which ranks check they opened the same
 * checkpoint.
 *
 * Rank r of a group of M keeps heads [r Hq/M, (r+1) Hq/M) and the key and
 * value heads they read, [r Hkv/M, (r+1) Hkv/M), or with fewer key/value
 * heads than ranks the one head its query heads read (each then held by
 * M / Hkv ranks, as vLLM replicates them): the query, key and value rows of its
 * heads (views, nothing copied), their biases and sinks, and the output
 * projection's columns of its heads (a copy the model owns).  Dense FFNs
 * and shared experts keep a slice of their intermediate width the same way.
 * Multi-head latent attention (split_mla) and linear attention
 * (split_linear) split their heads the same way.
 * A split layer's output is a partial sum; the forward pass adds the
 * group's parts (runtime/engine/tp.c), so the output biases stay with rank
 * 0 alone. */
#include <stdio.h>
#include <string.h>

#include "runtime/model/model_impl.h"

/* Values in one stored block of dtype t along a row. */
static int64_t block_values(enum moe_dtype t)
{
    if (t == MOE_DTYPE_Q8_0) return MOE_Q8_0_BLOCK;
    if (t == MOE_DTYPE_MXFP4) return MOE_MXFP4_BLOCK;
    if (t == MOE_DTYPE_FP8_B128) return MOE_FP8_BLOCK;
    if (t == MOE_DTYPE_Q6_K) return MOE_Q6_K_BLOCK;
    if (t == MOE_DTYPE_Q5_K) return MOE_Q5_K_BLOCK;
    if (moe_dtype_is_q4(t)) return moe_q4_group(t);
    return 1;
}

/* t (N, ...) keeps its rows [r0, r0 + n) along the first dimension: a view. */
static void keep_rows(struct moe_tensor *t, int64_t r0, int64_t n)
{
    if (!t->data) return;
    const size_t row = t->ndim >= 2 ? moe_dtype_row_bytes(t->dtype, (size_t)t->shape[t->ndim - 1])
                                    : moe_dtype_row_bytes(t->dtype, 1);
    size_t rows = 1; /* of the last dimension in one index of the first */
    for (int d = 1; d + 1 < t->ndim; d++) rows *= (size_t)t->shape[d];
    t->data = (char *)t->data + (size_t)r0 * rows * row;
    t->shape[0] = n;
}

/* t (N, K) keeps its columns [k0, k0 + n): copied into memory m owns. */
static enum moe_status keep_cols(struct moe_model *m, struct moe_tensor *t, int64_t k0, int64_t n,
                                 const char *what, int l)
{
    if (!t->data) return MOE_OK;
    const int64_t blk = block_values(t->dtype), N = t->shape[0], K = t->shape[1];
    if (k0 % blk || n % blk)
        return moe_fail(MOE_ERR_UNSUPPORTED, "--tp: layer %d %s is %s in blocks of %lld values, and a rank's "
                        "%lld columns do not fall on its blocks", l, what, moe_dtype_name(t->dtype),
                        (long long)blk, (long long)n);
    const size_t src_row = moe_dtype_row_bytes(t->dtype, (size_t)K), off = moe_dtype_row_bytes(t->dtype, (size_t)k0),
                 row = moe_dtype_row_bytes(t->dtype, (size_t)n);
    size_t bytes;
    if (!moe_mul_size(row, (size_t)N, &bytes)) return moe_fail(MOE_ERR_NOMEM, "--tp: layer %d %s", l, what);
    void *p;
    MOE_TRY(moe_model_own(m, bytes, &p));
    for (int64_t i = 0; i < N; i++)
        memcpy((char *)p + (size_t)i * row, (const char *)t->data + (size_t)i * src_row + off, row);
    moe_safetensors_release(&m->st, t->data, src_row * (size_t)N, true);
    t->data = p;
    t->shape[1] = n;
    return MOE_OK;
}

/* t (N, K) keeps the rows of n ranges [r[i][0], r[i][0] + r[i][1]), in
 * order: copied into memory m owns. */
static enum moe_status keep_row_ranges(struct moe_model *m, struct moe_tensor *t, int n, const int64_t (*r)[2])
{
    if (!t->data) return MOE_OK;
    const size_t row = moe_dtype_row_bytes(t->dtype, (size_t)t->shape[1]);
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += r[i][1];
    void *p;
    MOE_TRY(moe_model_own(m, (size_t)rows * row, &p));
    char *q = p;
    for (int i = 0; i < n; i++) {
        memcpy(q, (const char *)t->data + (size_t)r[i][0] * row, (size_t)r[i][1] * row);
        q += (size_t)r[i][1] * row;
    }
    t->data = p;
    t->shape[0] = rows;
    return MOE_OK;
}

/* Whether any of the n tensors reads its input columns out of order. */
static bool permuted(const struct moe_tensor *const *t, int n)
{
    for (int i = 0; i < n; i++)
        if (t[i]->cols) return true;
    return false;
}

/* A SwiGLU block of width F split: gate and up rows, down columns. */
static enum moe_status split_ffn(struct moe_model *m, int l, int r, int M, int64_t F, struct moe_tensor *g,
                                 struct moe_tensor *bg, struct moe_tensor *u, struct moe_tensor *bu,
                                 struct moe_tensor *d, struct moe_tensor *bd, const char *what)
{
    const int64_t f = F / M;
    const struct moe_tensor *all[3] = {g, u, d};
    if (permuted(all, 3))
        return moe_fail(MOE_ERR_UNSUPPORTED, "--tp: layer %d %s reads its inputs out of order (act-order "
                        "four-bit); not split", l, what);
    keep_rows(g, r * f, f);
    keep_rows(u, r * f, f);
    if (bg) keep_rows(bg, r * f, f);
    if (bu) keep_rows(bu, r * f, f);
    MOE_TRY(keep_cols(m, d, r * f, f, what, l));
    if (bd && r != 0) bd->data = NULL;
    return MOE_OK;
}

/* Multi-head latent attention: each rank its heads' query rows (q_proj or
 * q_b_proj), their key and value maps from the latent (w_uk, w_uv) and
 * their output columns; the latent projection (kv_a_proj, q_a_proj), its
 * norms, the cache of latents and DeepSeek sparse attention's indexer stay
 * whole on every rank. */
static enum moe_status split_mla(struct moe_model *m, int l, int r, int M, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    const int64_t h = c->n_heads / M, QK = (int64_t)c->qk_nope_dim + c->rope_dim, V = c->v_head_dim;
    keep_rows(&w->wq, r * h * QK, h * QK);
    keep_rows(&w->w_uk, r * h, h);
    keep_rows(&w->w_uv, r * h, h);
    MOE_TRY(keep_cols(m, &w->wo, r * h * V, h * V, "o_proj", l));
    return MOE_OK;
}

/* A Gated DeltaNet layer (Qwen3-Next, Qwen3.5-MoE): each rank its q/k
 * heads [r Hk/M, ...) and the value heads that read them [r Hv/M, ...)
 * (value head h reads q/k head h / (Hv / Hk)): their input-projection
 * rows (grouped by q/k head in Qwen3-Next's in_proj_qkvz and in_proj_ba;
 * q, k and v ranges of in_proj_qkv and of the convolution's channels
 * otherwise), gates, decays and output columns; the per-value-head norm's
 * weight is shared.  Its recurrent state is then the rank's heads'. */
static enum moe_status split_linear(struct moe_model *m, int l, int r, int M, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    const int64_t Hk = c->lin_k_heads, Hv = c->lin_v_heads, Dk = c->lin_k_dim, Dv = c->lin_v_dim;
    const int64_t hk = Hk / M, hv = Hv / M, rep = Hv / Hk, Kd = Hk * Dk;
    const int64_t chans[3][2] = {{r * hk * Dk, hk * Dk}, {Kd + r * hk * Dk, hk * Dk}, {2 * Kd + r * hv * Dv, hv * Dv}};
    const struct moe_tensor *all[4] = {&w->lin_in, &w->lin_qkv, &w->lin_z, &w->lin_out};
    if (permuted(all, 4))
        return moe_fail(MOE_ERR_UNSUPPORTED, "--tp: layer %d linear attention reads its inputs out of order "
                        "(act-order four-bit); not split", l);
    if (w->lin_in.data) { /* per q/k head: q, k, its values' v and z; b then a */
        const int64_t W = 2 * Dk + 2 * rep * Dv;
        keep_rows(&w->lin_in, r * hk * W, hk * W);
        keep_rows(&w->lin_ba, r * hk * 2 * rep, hk * 2 * rep);
    } else {
        MOE_TRY(keep_row_ranges(m, &w->lin_qkv, 3, chans));
        keep_rows(&w->lin_z, r * hv * Dv, hv * Dv);
        keep_rows(&w->lin_b, r * hv, hv);
        keep_rows(&w->lin_a, r * hv, hv);
    }
    MOE_TRY(keep_row_ranges(m, &w->lin_conv, 3, chans));
    keep_rows(&w->lin_a_log, r * hv, hv);
    keep_rows(&w->lin_dt_bias, r * hv, hv);
    return keep_cols(m, &w->lin_out, r * hv * Dv, hv * Dv, "out_proj", l);
}

static enum moe_status split_attention(struct moe_model *m, int l, int r, int M, struct moe_layer_weights *w)
{
    const struct moe_config *c = &m->cfg;
    if (c->kv_lora_rank > 0) return split_mla(m, l, r, M, w);
    if (c->layer_linear[l]) return split_linear(m, l, r, M, w);
    const int64_t Dh = c->head_dim, q = (int64_t)c->n_heads / M * Dh, kv = moe_tp_kv_heads(c->n_kv_heads, M) * Dh;
    const int64_t kv0 = (int64_t)moe_tp_kv_part(c->n_kv_heads, M, r) * kv; /* its key/value heads' first row */
    const struct moe_tensor *all[4] = {&w->wq, &w->wk, &w->wv, &w->wo};
    if (permuted(all, 4))
        return moe_fail(MOE_ERR_UNSUPPORTED, "--tp: layer %d attention reads its inputs out of order "
                        "(act-order four-bit); not split", l);
    const int64_t qw = c->attn_out_gate ? 2 : 1; /* gated: each head's queries, then its gates */
    keep_rows(&w->wq, r * q * qw, q * qw);
    keep_rows(&w->bq, r * q * qw, q * qw);
    keep_rows(&w->wk, kv0, kv);
    keep_rows(&w->bk, kv0, kv);
    keep_rows(&w->wv, kv0, kv);
    keep_rows(&w->bv, kv0, kv);
    keep_rows(&w->sinks, (int64_t)r * (c->n_heads / M), c->n_heads / M);
    MOE_TRY(keep_cols(m, &w->wo, r * q, q, "o_proj", l));
    if (r != 0) w->bo.data = NULL;
    /* q_norm and k_norm over whole rows (OLMoE) stay whole: the forward
     * pass gathers the group's rows for them */
    return MOE_OK;
}

/* The configuration values moe_model_tp_split divides, in the order
 * model.h's tp_whole keeps them as the whole model has them. */
#define TP_SPLIT_FIELDS(c) \
    {&(c)->n_heads, &(c)->n_kv_heads, &(c)->lin_k_heads, &(c)->lin_v_heads, &(c)->d_ff, &(c)->d_shared}

enum moe_status moe_model_tp_split(struct moe_model *m, int rank, int size)
{
    struct moe_config *c = &m->cfg;
    if (size <= 1) return MOE_OK;
    if (m->tp > 1) return moe_fail(MOE_ERR_INVALID_ARG, "--tp: the model is split already");
    if (rank < 0 || rank >= size) return moe_fail(MOE_ERR_INVALID_ARG, "--tp: rank %d of %d", rank, size);
    if (m->weights_deferred)
        return moe_fail(MOE_ERR_UNSUPPORTED, "--tp with weights made on the device");
    if (moe_config_linear_layers(c) > 0 && (c->lin_k_heads % size || c->lin_v_heads % size))
        return moe_fail(MOE_ERR_UNSUPPORTED, "--tp %d: the linear-attention layers' %d q/k and %d value heads do "
                        "not split evenly over %d ranks", size, c->lin_k_heads, c->lin_v_heads, size);
    if (m->mtp_eh_proj.data) return moe_fail(MOE_ERR_UNSUPPORTED, "--tp with a multi-token-prediction module");
    if (c->n_heads % size || (c->n_kv_heads % size && size % c->n_kv_heads))
        return moe_fail(MOE_ERR_UNSUPPORTED, "--tp %d: the model's %d query and %d key/value heads do not "
                        "split evenly over %d ranks (nor each key/value head over a whole number of them)", size,
                        c->n_heads, c->n_kv_heads, size);
    bool dense = false;
    for (int l = 0; l < c->n_layers; l++) dense |= !c->layer_moe[l];
    if (dense && c->d_ff % size)
        return moe_fail(MOE_ERR_UNSUPPORTED, "--tp %d: the dense layers' width %d does not split evenly over %d "
                        "ranks", size, c->d_ff, size);
    if (c->d_shared > 0 && c->d_shared % size)
        return moe_fail(MOE_ERR_UNSUPPORTED, "--tp %d: the shared expert's width %d does not split evenly over "
                        "%d ranks", size, c->d_shared, size);
    for (int l = 0; l < c->n_layers; l++) {
        struct moe_layer_weights *w = &m->layers[l];
        MOE_TRY(split_attention(m, l, rank, size, w));
        if (!c->layer_moe[l])
            MOE_TRY(split_ffn(m, l, rank, size, c->d_ff, &w->w_gate, &w->b_gate, &w->w_up, &w->b_up,
                              &w->w_down, &w->b_down, "dense FFN"));
        else if (c->d_shared > 0)
            MOE_TRY(split_ffn(m, l, rank, size, c->d_shared, &w->sh_gate, NULL, &w->sh_up, NULL, &w->sh_down,
                              NULL, "shared expert"));
    }
    int *kept[] = TP_SPLIT_FIELDS(c);
    for (int i = 0; i < MOE_TP_SPLIT_FIELDS; i++) m->tp_whole[i] = *kept[i];
    c->n_heads /= size;
    c->n_kv_heads = moe_tp_kv_heads(c->n_kv_heads, size);
    c->lin_k_heads /= size;
    c->lin_v_heads /= size;
    if (dense) c->d_ff /= size;
    if (c->d_shared > 0) c->d_shared /= size;
    m->tp = size;
    m->tp_rank = rank;
    return MOE_OK;
}

void moe_model_whole_config(const struct moe_model *m, struct moe_config *c)
{
    *c = m->cfg;
    if (m->tp <= 1) return;
    int *kept[] = TP_SPLIT_FIELDS(c);
    for (int i = 0; i < MOE_TP_SPLIT_FIELDS; i++) *kept[i] = m->tp_whole[i];
}

enum moe_status moe_model_vocab_split(struct moe_model *m, int rank, int size)
{
    const int V = m->cfg.vocab;
    if (size <= 1) return MOE_OK;
    if (m->vocab_parts > 1) return moe_fail(MOE_ERR_INVALID_ARG, "the LM head is split already");
    if (rank < 0 || rank >= size || size > V)
        return moe_fail(MOE_ERR_INVALID_ARG, "LM head: rank %d of %d over a vocabulary of %d", rank, size, V);
    if (m->lm_head.ndim != 2 || m->lm_head.shape[0] != V || !m->lm_head.data)
        return moe_fail(MOE_ERR_INVALID_ARG, "LM head: not a (%d, D) matrix", V);
    if (m->weights_deferred) return MOE_OK; /* made on the device whole */
    int lo, n;
    moe_vocab_share(V, rank, size, &lo, &n);
    keep_rows(&m->lm_head, lo, n);
    /* the embedding's same rows: each rank embeds the tokens of its share
     * and the ranks add their rows (forward_ep.c, moe_forward_vocab_embed) */
    if (m->embed.ndim == 2 && m->embed.shape[0] == V) keep_rows(&m->embed, lo, n);
    m->vocab_lo = lo;
    m->vocab_parts = size;
    return MOE_OK;
}

struct moe_tensor moe_model_whole_vocab(const struct moe_model *m, const struct moe_tensor *share)
{
    struct moe_tensor t = *share;
    if (m->vocab_parts > 1 && t.data && t.ndim == 2 && t.shape[0] < m->cfg.vocab) {
        t.data = (char *)t.data - (size_t)m->vocab_lo * moe_dtype_row_bytes(t.dtype, (size_t)t.shape[1]);
        t.shape[0] = m->cfg.vocab;
    }
    return t;
}

bool moe_model_head_tied(const struct moe_model *m)
{
    const char *h = m->lm_head.data, *e = m->embed.data;
    if (!h || !e || m->embed.ndim != 2) return false;
    const size_t bytes = moe_dtype_row_bytes(m->embed.dtype, (size_t)m->embed.shape[1]) * (size_t)m->embed.shape[0];
    return h >= e && h < e + bytes;
}

/* FNV-1a, 64 bits, continued from h over n bytes. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t moe_model_fingerprint(const struct moe_model *m)
{
    if (!m->dir) return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", m->dir) < sizeof path) {
        FILE *f = fopen(path, "rb");
        char buf[4096];
        size_t n;
        while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) h = fnv(h, buf, n);
        if (f) fclose(f);
    }
    for (int i = 0; i < m->st.n_files; i++) { /* each file's size and header */
        const struct moe_st_file *f = &m->st.files[i];
        uint64_t hl = 0;
        h = fnv(h, &f->size, sizeof f->size);
        if (!f->map || f->size < 8) continue;
        memcpy(&hl, f->map, 8);
        h = fnv(h, f->map, (size_t)(hl < f->size - 8 ? hl + 8 : f->size));
    }
    return h ? h : 1;
}
