/* forward.c - the forward pass (see forward.h).  Mirrors the decoder layer
 * of the Hugging Face Llama / Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE /
 * Llama-4 implementations; the family differences are fields of moe_config. */
#include "runtime/engine/forward.h"
#include "runtime/core/clock.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention/attention.h"
#include "runtime/engine/ep_impl.h"
#include "router/stats.h"

static enum moe_status walloc(struct moe_backend *be, void **p, size_t n, size_t elem)
{
    size_t bytes;
    if (!moe_mul_size(n, elem, &bytes))
        return moe_fail(MOE_ERR_NOMEM, "forward workspace: size overflows");
    return be->ops->alloc(be, bytes, p);
}

#define WALLOC(ptr, n, type) MOE_TRY(walloc(be, (void **)&(ptr), (size_t)(n), sizeof(type)))

/* Llama-4's routing: the chosen expert's input times its router score
 * (scale_rows into xs), its output times one. */
static enum moe_status init_scaled_input(struct moe_forward *fw, size_t T, size_t D)
{
    struct moe_backend *be = fw->be;
    if (!be->ops->scale_rows)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: no row scaling, which Llama-4's routing (the router "
                        "score scales the expert's input) needs", be->ops->name);
    WALLOC(fw->xs, T * D, float);
    WALLOC(fw->ones, T, float);
    float *one = malloc(T * sizeof(float));
    if (!one) return moe_fail(MOE_ERR_NOMEM, "forward: expert weights");
    for (size_t t = 0; t < T; t++) one[t] = 1.0f;
    enum moe_status s = be->ops->to_device(be, fw->ones, one, T * sizeof(float));
    free(one);
    return s;
}

static enum moe_status init_buffers(struct moe_forward *fw)
{
    struct moe_backend *be = fw->be;
    const struct moe_config *c = &fw->m->cfg;
    const size_t T = (size_t)fw->lim.max_tokens, D = (size_t)c->d_model;
    const size_t Q = (size_t)c->n_heads * c->head_dim, KV = (size_t)c->n_kv_heads * c->head_dim;
    size_t H = (size_t)(c->d_ff > c->d_shared ? c->d_ff : c->d_shared);
    size_t TK = T * (size_t)(c->top_k > 0 ? c->top_k : 1);
    size_t E = (size_t)(c->n_experts > 0 ? c->n_experts : 1);
    if (H == 0) H = 1;
    WALLOC(fw->x, T * D, float);
    WALLOC(fw->xn, T * D, float);
    WALLOC(fw->q, T * Q, float);
    WALLOC(fw->att, T * Q, float);
    WALLOC(fw->k, T * KV, float);
    WALLOC(fw->v, T * KV, float);
    WALLOC(fw->out, T * D, float);
    WALLOC(fw->h1, T * H, float);
    WALLOC(fw->h2, T * H, float);
    WALLOC(fw->sh, T * D, float);
    WALLOC(fw->shg, T, float);
    WALLOC(fw->rlogits, T * E, float);
    WALLOC(fw->ids, TK, int32_t);
    WALLOC(fw->rw, TK, float);
    WALLOC(fw->plan.counts, E, int32_t);
    WALLOC(fw->plan.offsets, E + 1, int32_t);
    WALLOC(fw->plan.perm, TK, int32_t);
    WALLOC(fw->plan.pos, TK, int32_t);
    size_t F = (size_t)(c->d_expert > 0 ? c->d_expert : 1);
    WALLOC(fw->ews.xe, TK * D, float);
    WALLOC(fw->ews.g, TK * F, float);
    WALLOC(fw->ews.u, TK * F, float);
    WALLOC(fw->ews.ye, TK * D, float);
    WALLOC(fw->inv_freq, (size_t)c->head_dim / 2, float);
    WALLOC(fw->lrows, (size_t)fw->lim.max_logits * D, float);
    WALLOC(fw->lxn, (size_t)fw->lim.max_logits * D, float);
    WALLOC(fw->lids, (size_t)fw->lim.max_logits * (size_t)(c->top_k > 0 ? c->top_k : 1), int32_t);
    WALLOC(fw->lrw, (size_t)fw->lim.max_logits * (size_t)(c->top_k > 0 ? c->top_k : 1), float);
    WALLOC(fw->logits, (size_t)fw->lim.max_logits * (size_t)c->vocab, float);
    WALLOC(fw->amax, (size_t)fw->lim.max_logits, int32_t);
    if (fw->lim.hidden) WALLOC(fw->hid, (T + 1) * D, float);
    if (fw->m->cols_permuted) { /* the widest input of a Linear weight */
        const size_t rows = (size_t)(fw->lim.max_tokens > fw->lim.max_logits ? fw->lim.max_tokens : fw->lim.max_logits);
        const size_t widths[] = {D, Q, H, F, 2 * D, (size_t)c->q_lora_rank, (size_t)c->kv_lora_rank,
                                 (size_t)c->n_heads * c->v_head_dim};
        size_t wmax = 1;
        for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) wmax = widths[i] > wmax ? widths[i] : wmax;
        if (!be->ops->gather_cols)
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: no column copies, which act-order four-bit "
                            "weights need", be->ops->name);
        WALLOC(fw->xcols, rows * wmax, float);
    }
    if (fw->m->mtp_eh_proj.data) {
        if (!be->ops->gather_cols)
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: no column copies, which a "
                            "multi-token-prediction layer needs", be->ops->name);
        WALLOC(fw->hin, T * D, float);
        WALLOC(fw->cat, T * 2 * D, float);
    }
    if (c->router_scales_input) MOE_TRY(init_scaled_input(fw, T, D));
    WALLOC(fw->b_tokens, T, int32_t);
    WALLOC(fw->b_pos, T, int32_t);
    WALLOC(fw->b_seq_of, T, int32_t);
    WALLOC(fw->b_slot, T, int32_t);
    WALLOC(fw->b_seq_start, (size_t)fw->lim.max_seqs + 1, int32_t);
    WALLOC(fw->b_ctx_len, (size_t)fw->lim.max_seqs, int32_t);
    WALLOC(fw->b_table, (size_t)fw->lim.max_seqs * (size_t)fw->lim.max_blocks, int32_t);
    WALLOC(fw->b_rows, (size_t)fw->lim.max_logits, int32_t);
    fw->h_ids = malloc(TK * sizeof(int32_t));
    fw->h_w = malloc(TK * sizeof(float));
    fw->h_logits = malloc(T * E * sizeof(float));
    if (!fw->h_ids || !fw->h_w || !fw->h_logits)
        return moe_fail(MOE_ERR_NOMEM, "forward: host routing buffers");
    float *freqs = calloc((size_t)c->head_dim / 2, sizeof(float)); /* rope_dim/2 used */
    if (!freqs) return moe_fail(MOE_ERR_NOMEM, "forward: rope table");
    moe_attention_rope_freqs(freqs, c);
    enum moe_status s = be->ops->to_device(be, fw->inv_freq, freqs, (size_t)c->head_dim / 2 * sizeof(float));
    free(freqs);
    return s;
}

enum moe_status moe_forward_init(struct moe_forward *fw, const struct moe_model *m,
                                 struct moe_backend *be, const struct moe_forward_limits *lim)
{
    memset(fw, 0, sizeof *fw);
    if (lim->max_tokens <= 0 || lim->max_seqs <= 0 || lim->max_blocks <= 0 || lim->max_logits <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "forward: limits must be positive");
    fw->m = m;
    fw->be = be;
    fw->lim = *lim;
    /* every step's routing goes through the host buffers when they hold all
     * of a full step within MOE_STATS_HOST_BYTES; else small steps only */
    const struct moe_config *mc = &m->cfg;
    const size_t per_row = 4 * (2 * (size_t)(mc->top_k > 0 ? mc->top_k : 0) +
                                (size_t)(mc->n_experts > 0 ? mc->n_experts : 1));
    size_t full;
    fw->hs_rows = lim->max_tokens < MOE_SMALL_STEP_ROWS ? lim->max_tokens : MOE_SMALL_STEP_ROWS;
    if (moe_mul_size(per_row, (size_t)lim->max_tokens, &full) &&
        moe_mul_size(full, (size_t)mc->n_layers, &full) && full <= MOE_STATS_HOST_BYTES)
        fw->hs_rows = lim->max_tokens;
    fw->stats_async_rows = fw->hs_rows;
    enum moe_status s = init_buffers(fw);
    if (s == MOE_OK) s = moe_forward_mla_init(fw);
    if (s == MOE_OK) s = moe_forward_lin_init(fw);
    if (s == MOE_OK && be->ops->reserve) {
        int rows = lim->max_tokens > lim->max_logits ? lim->max_tokens : lim->max_logits;
        struct moe_config cfg = m->cfg; /* dispatches over expert-parallel slots span more */
        if (lim->max_experts > cfg.n_experts) cfg.n_experts = lim->max_experts;
        s = be->ops->reserve(be, &cfg, rows);
    }
    if (s != MOE_OK) moe_forward_free(fw);
    return s;
}

void moe_forward_free(struct moe_forward *fw)
{
    struct moe_backend *be = fw->be;
    if (be) {
        void *bufs[] = {fw->x, fw->xn, fw->q, fw->att, fw->k, fw->v, fw->out, fw->h1, fw->h2,
                        fw->sh, fw->shg, fw->xs, fw->ones, fw->rlogits, fw->ids, fw->rw, fw->plan.counts,
                        fw->plan.offsets, fw->plan.perm, fw->plan.pos, fw->ews.xe, fw->ews.g,
                        fw->ews.u, fw->ews.ye, fw->inv_freq, fw->lrows, fw->lxn, fw->lids, fw->lrw,
                        fw->logits, fw->amax,
                        fw->hid, fw->hin, fw->cat, fw->xcols,
                        fw->b_tokens, fw->b_pos, fw->b_seq_of, fw->b_seq_start, fw->b_ctx_len,
                        fw->b_table, fw->b_slot, fw->b_rows};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->ops->dealloc(be, bufs[i]);
        if (fw->hs_buf) be->ops->host_free(be, fw->hs_buf);
        moe_forward_mla_free(fw);
        moe_forward_lin_free(fw);
    }
    free(fw->h_ids);
    free(fw->h_w);
    free(fw->h_logits);
    moe_forward_ep_free(fw);
    moe_forward_dp_free(fw);
    memset(fw, 0, sizeof *fw);
}

/* Hybrid models: every sequence has its own state slot, and its rows
 * continue the slot's state (or start at position 0, from zero). */
static enum moe_status validate_state(const struct moe_kvcache *kv, const struct moe_batch *b)
{
    if (!b->state_slot || kv->n_state_slots <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "batch: the model has linear-attention layers and the batch "
                        "(or the cache) has no recurrent-state slots");
    for (int s = 0; s < b->n_seqs; s++) {
        const int32_t slot = b->state_slot[s];
        if (slot < 0 || slot >= kv->n_state_slots)
            return moe_fail(MOE_ERR_INVALID_ARG, "batch: sequence %d state slot %d (cache of %d)", s, slot,
                            kv->n_state_slots);
        for (int o = 0; o < s; o++)
            if (b->state_slot[o] == slot)
                return moe_fail(MOE_ERR_INVALID_ARG, "batch: sequences %d and %d share state slot %d", o, s, slot);
        const int first = b->positions[b->seq_start[s]];
        if (first != 0 && first != kv->state_len[slot])
            return moe_fail(MOE_ERR_INVALID_ARG, "batch: sequence %d starts at position %d but its recurrent "
                            "state holds %d tokens (a linear-attention state cannot be rewound)", s, first,
                            kv->state_len[slot]);
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++)
            if (b->positions[t] != first + t - b->seq_start[s])
                return moe_fail(MOE_ERR_INVALID_ARG, "batch: row %d position %d: the rows of a sequence with "
                                "recurrent state must be consecutive", t, b->positions[t]);
    }
    return MOE_OK;
}

/* Checks the batch against the limits, the vocabulary and the cache, so no
 * op ever indexes out of range. */
static enum moe_status validate(const struct moe_forward *fw, const struct moe_kvcache *kv,
                                const struct moe_batch *b)
{
    const struct moe_forward_limits *lim = &fw->lim;
    if (b->n_tokens <= 0 || b->n_tokens > lim->max_tokens)
        return moe_fail(MOE_ERR_INVALID_ARG, "batch: %d tokens (limit %d)", b->n_tokens, lim->max_tokens);
    if (b->n_seqs <= 0 || b->n_seqs > lim->max_seqs)
        return moe_fail(MOE_ERR_INVALID_ARG, "batch: %d sequences (limit %d)", b->n_seqs, lim->max_seqs);
    if (b->max_blocks <= 0 || b->max_blocks > lim->max_blocks)
        return moe_fail(MOE_ERR_INVALID_ARG, "batch: block table width %d (limit %d)",
                        b->max_blocks, lim->max_blocks);
    if (b->n_logits < 0 || b->n_logits > lim->max_logits)
        return moe_fail(MOE_ERR_INVALID_ARG, "batch: %d logit rows (limit %d)", b->n_logits,
                        lim->max_logits);
    if (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens)
        return moe_fail(MOE_ERR_INVALID_ARG, "batch: seq_start does not cover the %d rows", b->n_tokens);
    const int64_t cap = (int64_t)kv->block_size * b->max_blocks;
    for (int s = 0; s < b->n_seqs; s++) {
        if (b->seq_start[s + 1] < b->seq_start[s])
            return moe_fail(MOE_ERR_INVALID_ARG, "batch: seq_start not increasing at %d", s);
        if (b->ctx_len[s] <= 0 || b->ctx_len[s] > cap)
            return moe_fail(MOE_ERR_INVALID_ARG, "batch: sequence %d context %d outside 1..%lld", s,
                            b->ctx_len[s], (long long)cap);
        if (b->ctx_len[s] > fw->m->cfg.max_pos)
            return moe_fail(MOE_ERR_INVALID_ARG,
                            "batch: sequence %d reaches %d tokens, beyond the model's context of %d",
                            s, b->ctx_len[s], fw->m->cfg.max_pos);
        int nb = (b->ctx_len[s] + kv->block_size - 1) / kv->block_size;
        for (int i = 0; i < nb; i++) {
            int32_t blk = b->block_table[(size_t)s * b->max_blocks + i];
            if (blk < 0 || blk >= kv->n_blocks)
                return moe_fail(MOE_ERR_INVALID_ARG, "batch: sequence %d block %d is %d (pool of %d)",
                                s, i, blk, kv->n_blocks);
        }
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) {
            if (b->seq_of[t] != s)
                return moe_fail(MOE_ERR_INVALID_ARG, "batch: row %d is not in sequence %d", t, s);
            int p = b->positions[t];
            if (p < 0 || p >= b->ctx_len[s])
                return moe_fail(MOE_ERR_INVALID_ARG, "batch: row %d position %d outside context %d",
                                t, p, b->ctx_len[s]);
            int32_t want = b->block_table[(size_t)s * b->max_blocks + p / kv->block_size] *
                               kv->block_size + p % kv->block_size;
            if (b->slot[t] != want)
                return moe_fail(MOE_ERR_INVALID_ARG, "batch: row %d slot %d, block table says %d",
                                t, b->slot[t], want);
        }
    }
    if (fw->b_state) MOE_TRY(validate_state(kv, b));
    if (moe_ep_on(fw->ep) && fw->ep->dp) { /* data-parallel attention: each sequence's rank */
        if (!b->dp_rank)
            return moe_fail(MOE_ERR_INVALID_ARG, "batch: data-parallel attention, but the batch gives its "
                            "sequences no ranks");
        if (kv->parts != fw->ep->size)
            return moe_fail(MOE_ERR_INVALID_ARG, "batch: data-parallel attention over %d ranks, but the KV pool "
                            "is in %d parts", fw->ep->size, kv->parts);
        for (int s = 0; s < b->n_seqs; s++) {
            if (b->dp_rank[s] < 0 || b->dp_rank[s] >= fw->ep->size)
                return moe_fail(MOE_ERR_INVALID_ARG, "batch: sequence %d on rank %d (of %d)", s, b->dp_rank[s],
                                fw->ep->size);
            if (b->state_slot && kv->state_part_slots > 0 && b->state_slot[s] / kv->state_part_slots != b->dp_rank[s])
                return moe_fail(MOE_ERR_INVALID_ARG, "batch: sequence %d on rank %d has state slot %d of another "
                                "rank's part", s, b->dp_rank[s], b->state_slot[s]);
            const int nb = (b->ctx_len[s] + kv->block_size - 1) / kv->block_size;
            for (int i = 0; i < nb; i++)
                if (moe_kvcache_part_of(kv, b->block_table[(size_t)s * b->max_blocks + i]) != b->dp_rank[s])
                    return moe_fail(MOE_ERR_INVALID_ARG, "batch: sequence %d on rank %d has block %d of rank %d's "
                                    "part of the pool", s, b->dp_rank[s],
                                    b->block_table[(size_t)s * b->max_blocks + i],
                                    moe_kvcache_part_of(kv, b->block_table[(size_t)s * b->max_blocks + i]));
        }
    }
    for (int t = 0; t < b->n_tokens; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= fw->m->cfg.vocab)
            return moe_fail(MOE_ERR_INVALID_ARG, "batch: token id %d at row %d is outside the "
                            "vocabulary of %d", b->tokens[t], t, fw->m->cfg.vocab);
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return moe_fail(MOE_ERR_INVALID_ARG, "batch: logit row %d out of range", b->logit_rows[i]);
    return MOE_OK;
}

/* Copies the host batch into backend buffers and returns a view of them. */
static enum moe_status upload_batch(struct moe_forward *fw, const struct moe_batch *b,
                                    struct moe_batch *db)
{
    struct moe_backend *be = fw->be;
    const size_t T = (size_t)b->n_tokens * sizeof(int32_t), S = (size_t)b->n_seqs * sizeof(int32_t);
    MOE_TRY(be->ops->to_device(be, fw->b_tokens, b->tokens, T));
    MOE_TRY(be->ops->to_device(be, fw->b_pos, b->positions, T));
    fw->h_pos = b->positions;
    MOE_TRY(be->ops->to_device(be, fw->b_seq_of, b->seq_of, T));
    MOE_TRY(be->ops->to_device(be, fw->b_slot, b->slot, T));
    MOE_TRY(be->ops->to_device(be, fw->b_seq_start, b->seq_start, S + sizeof(int32_t)));
    MOE_TRY(be->ops->to_device(be, fw->b_ctx_len, b->ctx_len, S));
    MOE_TRY(be->ops->to_device(be, fw->b_table, b->block_table, S * (size_t)b->max_blocks));
    MOE_TRY(be->ops->to_device(be, fw->b_rows, b->logit_rows, (size_t)b->n_logits * sizeof(int32_t)));
    if (fw->b_state) MOE_TRY(be->ops->to_device(be, fw->b_state, b->state_slot, S));
    *db = *b;
    db->state_slot = fw->b_state;
    db->tokens = fw->b_tokens;
    db->positions = fw->b_pos;
    db->seq_of = fw->b_seq_of;
    db->slot = fw->b_slot;
    db->seq_start = fw->b_seq_start;
    db->ctx_len = fw->b_ctx_len;
    db->block_table = fw->b_table;
    db->logit_rows = fw->b_rows;
    return MOE_OK;
}

enum moe_status moe_forward_linear(struct moe_forward *fw, float *y, const float *x, const struct moe_tensor *w,
                                   const struct moe_tensor *b, int T)
{
    struct moe_backend *be = fw->be;
    if (w->cols) {
        const int K = (int)w->shape[1];
        MOE_TRY(be->ops->gather_cols(be, fw->xcols, K, x, K, T, w->cols, K));
        x = fw->xcols;
    }
    return be->ops->matmul(be, y, x, w, b, T);
}

/* n products of one input x: matmul_multi when the backend has it and no
 * weight orders its columns, else one at a time. */
static enum moe_status linear_multi(struct moe_forward *fw, int n, float *const *y, const float *x,
                                    const struct moe_tensor *const *ws, const struct moe_tensor *const *bs, int T)
{
    struct moe_backend *be = fw->be;
    bool plain = be->ops->matmul_multi != NULL;
    for (int i = 0; i < n; i++) plain = plain && !ws[i]->cols;
    if (plain) return be->ops->matmul_multi(be, n, y, x, ws, bs, T);
    for (int i = 0; i < n; i++) MOE_TRY(moe_forward_linear(fw, y[i], x, ws[i], bs[i], T));
    return MOE_OK;
}

/* x += out (times Granite's residual_multiplier) */
static enum moe_status residual_add(struct moe_forward *fw, int T)
{
    const struct moe_config *c = &fw->m->cfg;
    const size_t n = (size_t)T * c->d_model;
    if (c->residual_scale != 1.0f && c->residual_scale != 0.0f)
        MOE_TRY(fw->be->ops->scale(fw->be, fw->out, n, c->residual_scale));
    return fw->be->ops->add(fw->be, fw->x, fw->out, n);
}

enum moe_status moe_forward_attention_block(struct moe_forward *fw, struct moe_kvcache *kv,
                                            const struct moe_batch *db, int l)
{
    struct moe_backend *be = fw->be;
    const struct moe_backend_ops *op = be->ops;
    const struct moe_config *c = &fw->m->cfg;
    const struct moe_layer_weights *w = &fw->m->layers[l];
    const int T = db->n_tokens, D = c->d_model, Hq = c->n_heads, Hkv = c->n_kv_heads,
              Dh = c->head_dim;
    const bool rope = !c->layer_nope[l]; /* Llama-4's layers without RoPE */
    MOE_TRY(op->rmsnorm(be, fw->xn, fw->x, &w->attn_norm, T, D, c->rms_eps));
    if (c->layer_linear[l]) {
        MOE_TRY(moe_forward_lin_block(fw, kv, db, l));
        MOE_TRY(moe_forward_tp_sum(fw, fw->out, T, "linear attention output", l));
        return residual_add(fw, T);
    }
    /* yarn scales cos and sin, so q and k: every score by its square (0 in
     * a zeroed configuration built by hand means none) */
    const float af = c->rope_attn_factor > 0 ? c->rope_attn_factor : 1.0f;
    struct moe_attn_params p = {
        .layer = moe_config_kv_layer(c, l), .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = Dh,
        .scale = (c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)Dh)) * af * af,
        .window = c->layer_sliding[l] ? c->sliding_window : 0,
        .max_ctx = fw->max_ctx,
        .sinks = w->sinks.data,
        .chunk = c->layer_chunked[l] ? c->attn_chunk : 0,
        .temp_floor = rope ? 0 : c->attn_temp_floor,
        .temp_scale = c->attn_temp_scale,
    };
    if (c->kv_lora_rank > 0) {
        MOE_TRY(moe_forward_mla_attention(fw, kv, db, l, &p));
        MOE_TRY(moe_forward_tp_sum(fw, fw->out, T, "attention output", l));
        return residual_add(fw, T);
    }
    float *const y[3] = {c->attn_out_gate ? fw->lin.qg : fw->q, fw->k, fw->v};
    const struct moe_tensor *const ws[3] = {&w->wq, &w->wk, &w->wv};
    const struct moe_tensor *const bs[3] = {&w->bq, &w->bk, &w->bv};
    MOE_TRY(linear_multi(fw, 3, y, fw->xn, ws, bs, T));
    if (c->attn_out_gate) MOE_TRY(moe_forward_lin_split_q(fw, T));
    if (c->qk_norm == MOE_QK_NORM_HEAD) {
        MOE_TRY(op->rmsnorm(be, fw->q, fw->q, &w->q_norm, T * Hq, Dh, c->rms_eps));
        MOE_TRY(op->rmsnorm(be, fw->k, fw->k, &w->k_norm, T * Hkv, Dh, c->rms_eps));
    } else if (c->qk_norm == MOE_QK_NORM_FULL) {
        MOE_TRY(moe_forward_norm_whole_rows(fw, fw->q, T, Hq * Dh, &w->q_norm, "query rows", l));
        MOE_TRY(moe_forward_norm_whole_rows(fw, fw->k, T, Hkv * Dh, &w->k_norm, "key rows", l));
    }
    if (c->clip_qkv > 0) {
        MOE_TRY(op->clamp(be, fw->q, (size_t)T * Hq * Dh, c->clip_qkv));
        MOE_TRY(op->clamp(be, fw->k, (size_t)T * Hkv * Dh, c->clip_qkv));
        MOE_TRY(op->clamp(be, fw->v, (size_t)T * Hkv * Dh, c->clip_qkv));
    }
    if (rope) {
        MOE_TRY(op->rope(be, fw->q, db->positions, T, Hq, Dh, c->rope_dim, fw->inv_freq));
        MOE_TRY(op->rope(be, fw->k, db->positions, T, Hkv, Dh, c->rope_dim, fw->inv_freq));
    }
    if (rope && c->qk_l2_norm) { /* Llama-4: after RoPE, each head over its RMS */
        MOE_TRY(op->rmsnorm(be, fw->q, fw->q, &fw->m->qk_ones, T * Hq, Dh, c->rms_eps));
        MOE_TRY(op->rmsnorm(be, fw->k, fw->k, &fw->m->qk_ones, T * Hkv, Dh, c->rms_eps));
    }
    MOE_TRY(op->kv_store(be, kv, p.layer, fw->k, fw->v, db->slot, T));
    MOE_TRY(op->attention(be, fw->att, fw->q, kv, db, &p));
    if (c->attn_out_gate) /* each value times sigmoid(its gate): rows of one value */
        MOE_TRY(op->sigmoid_scale(be, fw->att, fw->lin.gate, T * Hq * Dh, 1));
    MOE_TRY(moe_forward_linear(fw, fw->out, fw->att, &w->wo, &w->bo, T));
    MOE_TRY(moe_forward_tp_sum(fw, fw->out, T, "attention output", l));
    return residual_add(fw, T);
}

/* out (T, D) = down(silu(gate(xn)) * up(xn)) */
static enum moe_status swiglu_ffn(struct moe_forward *fw, float *out, int T,
                                  const struct moe_tensor *g, const struct moe_tensor *bg,
                                  const struct moe_tensor *u, const struct moe_tensor *bu,
                                  const struct moe_tensor *d, const struct moe_tensor *bd)
{
    struct moe_backend *be = fw->be;
    float *const y[2] = {fw->h1, fw->h2};
    const struct moe_tensor *const ws[2] = {g, u}, *const bs[2] = {bg, bu};
    MOE_TRY(linear_multi(fw, 2, y, fw->xn, ws, bs, T));
    MOE_TRY(be->ops->swiglu(be, fw->h1, fw->h2, (size_t)T * g->shape[0]));
    return moe_forward_linear(fw, out, fw->h1, d, bd, T);
}

/* Layer l's slice of the statistics host buffers (see forward.h). */
static void hs_slice(const struct moe_forward *fw, int l, int32_t **ids, float **w, float **logits)
{
    const int top_k = fw->m->cfg.top_k;
    const size_t R = (size_t)fw->hs_rows, K = (size_t)(top_k > 0 ? top_k : 0);
    uint32_t *base = (uint32_t *)fw->hs_buf + (size_t)l * fw->hs_layer;
    *ids = (int32_t *)base;
    *w = (float *)(base + R * K);
    *logits = (float *)(base + 2 * R * K);
}

/* Whether a step of T rows copies its routing asynchronously; allocates the
 * host buffers the first time.  Any failure leaves the synchronous path. */
static bool stats_async_ready(struct moe_forward *fw, int T)
{
    const struct moe_backend_ops *op = fw->be->ops;
    const struct moe_config *c = &fw->m->cfg;
    if (T > fw->stats_async_rows || T > fw->hs_rows || fw->hs_failed || !op->to_host_async ||
        !op->host_alloc || !op->host_free)
        return false;
    if (fw->hs_buf) return true;
    /* per row: K ids, K weights, E logits, 4 bytes each */
    const size_t per_row = 2 * (size_t)(c->top_k > 0 ? c->top_k : 0) +
                           (size_t)(c->n_experts > 0 ? c->n_experts : 1);
    size_t layer, words, bytes;
    enum moe_status s;
    if (moe_mul_size(per_row, (size_t)fw->hs_rows, &layer) &&
        moe_mul_size(layer, (size_t)c->n_layers, &words) &&
        moe_mul_size(words, sizeof(uint32_t), &bytes))
        s = op->host_alloc(fw->be, bytes, &fw->hs_buf);
    else
        s = moe_fail(MOE_ERR_NOMEM, "statistics host buffers: size overflows");
    if (s != MOE_OK) {
        fw->hs_buf = NULL;
        fw->hs_failed = true;
        fprintf(stderr, "moerun: statistics: no host buffers for asynchronous routing copies "
                "(%s); copying them synchronously, layer by layer\n", moe_last_error());
        return false;
    }
    fw->hs_layer = layer;
    return true;
}

/* The layer's expert FFN of the rows `in` and combine, weighted by wts,
 * into fw->out: the pairs of fw->ids dispatched over the experts (fw->plan).
 * Expert parallelism: dispatched over the layer's slots instead, this
 * rank's slots computed, every rank's rows gathered, then the combine
 * (ep.h). */
static enum moe_status experts_phase(struct moe_forward *fw, int l, int T, const struct moe_expert_weights *x,
                                     const float *in, const float *wts)
{
    struct moe_backend *be = fw->be;
    const struct moe_config *c = &fw->m->cfg;
    const int D = c->d_model, K = c->top_k, E = c->n_experts;
    if (!moe_ep_on(fw->ep)) {
        MOE_TRY(be->ops->dispatch(be, &fw->plan, fw->ids, T, K, E));
        return be->ops->experts(be, fw->out, in, &fw->plan, wts, x, &fw->ews, T, K, D, c->d_expert, E);
    }
    if (fw->dp.local) return moe_forward_dp_experts(fw, l, T, in, wts);
    return moe_forward_ep_experts(fw, l, T, in, wts);
}

/* The rows that need logits, db->logit_rows, go on alone (the last
 * layer's FFN; n may be 0): x, xn, ids and rw swap with compact copies of
 * those rows (lrows, lxn, lids, lrw), so the rest of the block runs over n
 * rows and leaves them in lrows; run_ops swaps back. */
static void swap_rows(struct moe_forward *fw)
{
    float *f = fw->x;
    fw->x = fw->lrows, fw->lrows = f;
    f = fw->xn, fw->xn = fw->lxn, fw->lxn = f;
    f = fw->rw, fw->rw = fw->lrw, fw->lrw = f;
    int32_t *i = fw->ids;
    fw->ids = fw->lids, fw->lids = i;
}

static enum moe_status last_rows(struct moe_forward *fw, const struct moe_batch *db, bool moe)
{
    struct moe_backend *be = fw->be;
    const struct moe_backend_ops *op = be->ops;
    const int n = db->n_logits, D = fw->m->cfg.d_model, K = fw->m->cfg.top_k;
    if (n > 0) {
        MOE_TRY(op->gather_rows(be, fw->lrows, fw->x, db->logit_rows, n, D));
        MOE_TRY(op->gather_rows(be, fw->lxn, fw->xn, db->logit_rows, n, D));
        if (moe) { /* ids as K-wide rows of 32-bit words: copied, not converted */
            MOE_TRY(op->gather_rows(be, (float *)fw->lids, (const float *)fw->ids, db->logit_rows, n, K));
            MOE_TRY(op->gather_rows(be, fw->lrw, fw->rw, db->logit_rows, n, K));
        }
    }
    swap_rows(fw);
    fw->rows_swapped = true;
    return MOE_OK;
}

/* The layer's FFN with its residual.  last: the model's last layer of a
 * step whose other rows need nothing after it (last_rows): its routing,
 * statistics and trace cover every row, its FFN only the rows that need
 * logits, whose result is left in fw->lrows. */
static enum moe_status ffn_block(struct moe_forward *fw, int l, int T, const struct moe_batch *db, bool last,
                                 struct moe_route_trace *trace)
{
    struct moe_backend *be = fw->be;
    const struct moe_backend_ops *op = be->ops;
    const struct moe_config *c = &fw->m->cfg;
    const struct moe_layer_weights *w = &fw->m->layers[l];
    const int D = c->d_model, K = c->top_k, E = c->n_experts;
    const bool local = fw->dp.local; /* data-parallel attention: T is this rank's rows */
    MOE_TRY(op->rmsnorm(be, fw->xn, fw->x, &w->ffn_norm, T, D, c->rms_eps));
    if (!c->layer_moe[l]) {
        const int all = local ? fw->dp.T : T;
        if (trace && trace->ids)
            for (int i = 0; i < all * K; i++) trace->ids[(size_t)l * all * K + i] = -1;
        if (last) {
            MOE_TRY(last_rows(fw, db, false));
            T = db->n_logits;
        }
        if (T == 0) return MOE_OK;
        MOE_TRY(swiglu_ffn(fw, fw->out, T, &w->w_gate, &w->b_gate, &w->w_up, &w->b_up, &w->w_down, &w->b_down));
        MOE_TRY(moe_forward_tp_sum(fw, fw->out, T, "dense FFN output", l));
        return residual_add(fw, T);
    }
    if (T > 0) {
        MOE_TRY(moe_forward_linear(fw, fw->rlogits, fw->xn, &w->router, &w->router_b, T));
        const struct moe_route rt = {E, K, c->norm_topk, c->router_sigmoid, w->router_bias.data,
                                     c->n_group, c->topk_group, c->routed_scale, c->router_scales_input};
        MOE_TRY(op->route(be, fw->ids, fw->rw, fw->rlogits, T, &rt));
    }
    if (local) { /* every rank's routing gathered where it is recorded; this rank's pairs over the ranks */
        MOE_TRY(moe_forward_dp_routing(fw, l, trace));
        if (T == 0) return moe_forward_dp_experts(fw, l, 0, NULL, NULL);
    } else if (fw->stats && fw->stats_async) { /* recorded after the step's sync */
        int32_t *hi;
        float *hw, *hl;
        hs_slice(fw, l, &hi, &hw, &hl);
        MOE_TRY(op->to_host_async(be, hi, fw->ids, (size_t)T * K * sizeof(int32_t)));
        MOE_TRY(op->to_host_async(be, hw, fw->rw, (size_t)T * K * sizeof(float)));
        MOE_TRY(op->to_host_async(be, hl, fw->rlogits, (size_t)T * E * sizeof(float)));
    } else if (fw->stats) { /* host copies: a memcpy on the CPU */
        MOE_TRY(op->to_host(be, fw->h_ids, fw->ids, (size_t)T * K * sizeof(int32_t)));
        MOE_TRY(op->to_host(be, fw->h_w, fw->rw, (size_t)T * K * sizeof(float)));
        MOE_TRY(op->to_host(be, fw->h_logits, fw->rlogits, (size_t)T * E * sizeof(float)));
        moe_stats_record_layer(fw->stats, l, T, fw->h_ids, fw->h_w, fw->h_logits);
    }
    if (trace && trace->ids && !local) {
        MOE_TRY(op->to_host(be, trace->ids + (size_t)l * T * K, fw->ids, (size_t)T * K * sizeof(int32_t)));
        if (trace->weights)
            MOE_TRY(op->to_host(be, trace->weights + (size_t)l * T * K, fw->rw,
                                (size_t)T * K * sizeof(float)));
    }
    if (last) {
        MOE_TRY(last_rows(fw, db, true));
        /* data-parallel attention: a rank without logit rows still serves the others' pairs */
        if ((T = db->n_logits) == 0) return local ? moe_forward_dp_experts(fw, l, 0, NULL, NULL) : MOE_OK;
    }
    const float *in = fw->xn, *wts = fw->rw;
    if (c->router_scales_input) { /* top-1 (config.c): the input times the score, the output times 1 */
        MOE_TRY(op->scale_rows(be, fw->xs, fw->xn, fw->rw, T, D));
        in = fw->xs;
        wts = fw->ones;
    }
    MOE_TRY(experts_phase(fw, l, T, &w->experts, in, wts));
    if (c->d_shared > 0) {
        MOE_TRY(swiglu_ffn(fw, fw->sh, T, &w->sh_gate, NULL, &w->sh_up, NULL, &w->sh_down, NULL));
        MOE_TRY(moe_forward_tp_sum(fw, fw->sh, T, "shared expert output", l));
        if (c->shared_gate) {
            MOE_TRY(moe_forward_linear(fw, fw->shg, fw->xn, &w->sh_router, NULL, T));
            MOE_TRY(op->sigmoid_scale(be, fw->sh, fw->shg, T, D));
        }
        MOE_TRY(op->add(be, fw->out, fw->sh, (size_t)T * D));
    }
    return residual_add(fw, T);
}

/* x (T, D) = the embeddings of the batch's tokens; with the embedding
 * split over the ranks by vocabulary rows, each rank's rows added up. */
static enum moe_status embed_tokens(struct moe_forward *fw, float *x, const struct moe_batch *db)
{
    const struct moe_model *m = fw->m;
    const bool split = m->embed.shape[0] < m->cfg.vocab;
    MOE_TRY(fw->be->ops->embed(fw->be, x, db->tokens, db->n_tokens, &m->embed, split ? m->vocab_lo : 0));
    return split ? moe_forward_vocab_embed(fw, x, db->n_tokens) : MOE_OK;
}

/* A multi-token-prediction module's input rows: x = eh_proj [enorm(embedding);
 * hnorm(hin)] (model.h). */
static enum moe_status mtp_input(struct moe_forward *fw, const struct moe_batch *db)
{
    struct moe_backend *be = fw->be;
    const struct moe_backend_ops *op = be->ops;
    const struct moe_model *m = fw->m;
    const int T = db->n_tokens, D = m->cfg.d_model;
    const float eps = m->cfg.rms_eps;
    MOE_TRY(embed_tokens(fw, fw->xn, db));
    MOE_TRY(op->rmsnorm(be, fw->xn, fw->xn, &m->mtp_enorm, T, D, eps));
    MOE_TRY(op->gather_cols(be, fw->cat, 2 * D, fw->xn, D, T, NULL, D));
    MOE_TRY(op->rmsnorm(be, fw->xn, fw->hin, &m->mtp_hnorm, T, D, eps));
    MOE_TRY(op->gather_cols(be, fw->cat + D, 2 * D, fw->xn, D, T, NULL, D));
    return moe_forward_linear(fw, fw->x, fw->cat, &m->mtp_eh_proj, NULL, T);
}

/* The ops of one step, from the embedding to the logits (backend memory). */
static enum moe_status run_ops(struct moe_forward *fw, struct moe_kvcache *kv,
                               const struct moe_batch *db, struct moe_route_trace *trace)
{
    struct moe_backend *be = fw->be;
    const struct moe_backend_ops *op = be->ops;
    const struct moe_model *m = fw->m;
    const struct moe_config *c = &m->cfg;
    const int T = db->n_tokens;
    if (m->mtp_eh_proj.data) {
        MOE_TRY(mtp_input(fw, db));
    } else {
        MOE_TRY(embed_tokens(fw, fw->x, db));
        if (c->embed_scale != 1.0f && c->embed_scale != 0.0f)
            MOE_TRY(op->scale(be, fw->x, (size_t)T * c->d_model, c->embed_scale));
    }
    /* the last layer's FFN only for the rows that need logits, when no
     * other row's state is wanted after it (hidden states, a
     * multi-token-prediction module, whose proposer reads fw->x); the
     * other ranks of expert parallelism do the same (rank 0 sends them
     * the rows) and compute logits only for their share of a split head */
    const bool skip = db->n_logits < T && !fw->hid && !m->mtp_eh_proj.data;
    const bool follower = moe_ep_on(fw->ep) && fw->ep->rank > 0;
    enum moe_status s = MOE_OK;
    if (fw->dp.local) { /* data-parallel attention: every layer on this rank's rows */
        MOE_TRY(moe_forward_dp_take(fw));
        const struct moe_batch *sub = &fw->dp.sub;
        for (int l = 0; l < c->n_layers && s == MOE_OK; l++) {
            if (sub->n_tokens > 0) s = moe_forward_attention_block(fw, kv, sub, l);
            if (s == MOE_OK) s = ffn_block(fw, l, sub->n_tokens, sub, skip && l == c->n_layers - 1, trace);
            if (fw->rows_swapped) { /* back: this rank's logit rows are in lrows */
                swap_rows(fw);
                fw->rows_swapped = false;
            }
        }
        MOE_TRY(moe_forward_dp_give(fw, s, skip));
    }
    for (int l = 0; l < c->n_layers && s == MOE_OK && !fw->dp.local; l++) {
        const bool last = skip && l == c->n_layers - 1;
        s = fw->dp.on ? moe_forward_dp_attention(fw, kv, T, l) : moe_forward_attention_block(fw, kv, db, l);
        if (s == MOE_OK) s = ffn_block(fw, l, T, db, last, trace);
        if (fw->rows_swapped) { /* back: the rows are in lrows */
            swap_rows(fw);
            fw->rows_swapped = false;
        }
    }
    MOE_TRY(s);
    if (fw->hid) MOE_TRY(op->rmsnorm(be, fw->hid, fw->x, &m->final_norm, T, c->d_model, c->rms_eps));
    /* the LM head split over the ranks: each computes its share, rank 0
     * gathers them; else rank 0 alone */
    const bool vocab_split = m->vocab_parts > 1 && moe_ep_on(fw->ep);
    if (db->n_logits == 0 || (follower && !vocab_split)) return MOE_OK;
    if (!skip) MOE_TRY(op->gather_rows(be, fw->lrows, fw->x, db->logit_rows, db->n_logits, c->d_model));
    MOE_TRY(op->rmsnorm(be, fw->lrows, fw->lrows, &m->final_norm, db->n_logits, c->d_model, c->rms_eps));
    if (vocab_split) MOE_TRY(moe_forward_vocab_logits(fw, db->n_logits));
    else MOE_TRY(moe_forward_linear(fw, fw->logits, fw->lrows, &m->lm_head, NULL, db->n_logits));
    if (follower) return MOE_OK;
    if (c->logit_scale != 1.0f && c->logit_scale != 0.0f)
        MOE_TRY(op->scale(be, fw->logits, (size_t)db->n_logits * c->vocab, c->logit_scale));
    /* always, so a recorded step serves callers with and without ids */
    return op->argmax(be, fw->amax, fw->logits, db->n_logits, c->vocab);
}

/* One validated step (moe_forward_run). */
static enum moe_status run_step(struct moe_forward *fw, struct moe_kvcache *kv, const struct moe_batch *b,
                                float *logits, int32_t *ids, struct moe_route_trace *trace)
{
    struct moe_backend *be = fw->be;
    const struct moe_backend_ops *op = be->ops;
    const struct moe_config *c = &fw->m->cfg;
    fw->max_ctx = 0;
    for (int i = 0; i < b->n_seqs; i++)
        if (b->ctx_len[i] > fw->max_ctx) fw->max_ctx = b->ctx_len[i];
    /* before anything is enqueued: may allocate (once) */
    fw->stats_async = fw->stats && stats_async_ready(fw, b->n_tokens);
    struct moe_batch db;
    MOE_TRY(upload_batch(fw, b, &db));
    MOE_TRY(moe_forward_dp_begin(fw, kv, b));
    if (fw->stats) MOE_TRY(moe_stats_step_begin(fw->stats, b));
    /* traces and synchronous statistics copy to the host inside the step:
     * no graph then.  Asynchronous statistics copies are part of the step
     * (fixed destinations), so such a step is recorded under its own key. */
    /* nor a step over recurrent state: its kernels' grids follow the
     * step's sequences, which a recorded step of the same rows may not have */
    /* nor a step that exchanges rows with other ranks (it waits for them) */
    const bool graph = op->graph_begin && op->graph_end && !(trace && trace->ids) &&
                       (!fw->stats || fw->stats_async) && !fw->b_state && !fw->ep;
    const void *key = fw->stats_async ? (const void *)&fw->hs_buf : (const void *)fw;
    bool replay = false;
    if (graph) MOE_TRY(op->graph_begin(be, key, b->n_tokens, b->n_logits, &replay));
    enum moe_status s = replay ? MOE_OK : run_ops(fw, kv, &db, trace);
    fw->h_pos = NULL; /* the caller's, valid during the ops only */
    if (graph) {
        enum moe_status e = op->graph_end(be, s == MOE_OK);
        if (s == MOE_OK) s = e;
    }
    MOE_TRY(s);
    if (logits && b->n_logits > 0)
        MOE_TRY(op->to_host(be, logits, fw->logits, (size_t)b->n_logits * c->vocab * sizeof(float)));
    if (ids && b->n_logits > 0)
        MOE_TRY(op->to_host(be, ids, fw->amax, (size_t)b->n_logits * sizeof(int32_t)));
    MOE_TRY(op->sync(be));
    if (fw->stats_async)
        for (int l = 0; l < c->n_layers; l++) {
            if (!c->layer_moe[l]) continue;
            int32_t *hi;
            float *hw, *hl;
            hs_slice(fw, l, &hi, &hw, &hl);
            moe_stats_record_layer(fw->stats, l, b->n_tokens, hi, hw, hl);
        }
    return MOE_OK;
}

/* The step, on every rank under expert parallelism: rank 0 sends it first;
 * every rank times it. */
static enum moe_status run_step_ep(struct moe_forward *fw, struct moe_kvcache *kv, const struct moe_batch *b,
                                   float *logits, int32_t *ids, struct moe_route_trace *trace)
{
    if (!moe_ep_on(fw->ep)) return run_step(fw, kv, b, logits, ids, trace);
    const double t0 = moe_seconds();
    enum moe_status s = MOE_OK;
    if (fw->ep->rank == 0) { /* the followers learn from the step whether it records its routing */
        fw->ep->dp_record = fw->stats || (trace && trace->ids);
        s = moe_ep_send_step(fw->ep, fw->ep_runner, b, kv->block_size);
    }
    if (s == MOE_OK) s = run_step(fw, kv, b, logits, ids, trace);
    fw->ep->n.step_s += moe_seconds() - t0;
    fw->ep->n.steps++;
    return s;
}

enum moe_status moe_forward_run(struct moe_forward *fw, struct moe_kvcache *kv,
                                const struct moe_batch *b, float *logits, int32_t *ids,
                                struct moe_route_trace *trace)
{
    MOE_TRY(validate(fw, kv, b));
    if (!fw->b_state) return run_step_ep(fw, kv, b, logits, ids, trace);
    /* a step that fails midway leaves states that cannot be continued */
    for (int s = 0; s < b->n_seqs; s++) kv->state_len[b->state_slot[s]] = -1;
    MOE_TRY(run_step_ep(fw, kv, b, logits, ids, trace));
    for (int s = 0; s < b->n_seqs; s++) kv->state_len[b->state_slot[s]] = b->positions[b->seq_start[s + 1] - 1] + 1;
    return MOE_OK;
}
