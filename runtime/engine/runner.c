/* runner.c - see runner.h. */
#include "runtime/engine/runner.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/ep_impl.h"

static bool held_as_placed(const struct moe_model *m, const struct moe_ep *ep);
static enum moe_status init_local(struct moe_runner *r, const struct moe_model *m, struct moe_backend *be,
                                  const struct moe_runner_opts *o);

enum moe_status moe_runner_init(struct moe_runner *r, const struct moe_model *m,
                                struct moe_backend *be, const struct moe_runner_opts *o)
{
    memset(r, 0, sizeof *r);
    r->m = m;
    r->be = be;
    r->o = *o;
    if (o->max_tokens <= 0 || o->max_seqs <= 0 || o->max_logits <= 0 || o->block_size <= 0 ||
        o->n_blocks <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "runner: every limit must be positive");
    r->max_blocks = (m->cfg.max_pos + o->block_size - 1) / o->block_size;
    if (m->ep_held && !moe_ep_on(o->ep))
        return moe_fail(MOE_ERR_INVALID_ARG, "runner: the model holds a share of its experts only, and this "
                        "runner is not expert-parallel");
    if (m->vocab_parts > 1 && (!moe_ep_on(o->ep) || o->ep->size != m->vocab_parts))
        return moe_fail(MOE_ERR_INVALID_ARG, "runner: the model holds 1/%d of its LM head, and this runner is not "
                        "spread over %d ranks", m->vocab_parts, m->vocab_parts);
    enum moe_status s = init_local(r, m, be, o);
    if (moe_ep_on(o->ep) && o->ep->rank == 0) {
        if (s == MOE_OK && !be->ops->combine)
            s = moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: no expert-parallel path", be->ops->name);
        if (s == MOE_OK && !held_as_placed(m, o->ep))
            s = moe_fail(MOE_ERR_INVALID_ARG, "expert parallelism: the model holds other experts than rank 0's "
                         "placement gives it");
        enum moe_status e = moe_ep_runner_open(o->ep, r, o, s);
        if (s == MOE_OK) s = e;
    }
    if (s != MOE_OK) moe_runner_free(r);
    return s;
}

/* Whether m holds exactly the experts ep places on this rank. */
static bool held_as_placed(const struct moe_model *m, const struct moe_ep *ep)
{
    if (!ep->layers || ep->n_layers != m->cfg.n_layers || ep->n_experts != m->cfg.n_experts || !m->ep_held)
        return false;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; e < m->cfg.n_experts; e++)
            if (moe_ep_holds(ep, l, e) != (bool)moe_model_holds(m, l, e)) return false;
    return true;
}

/* The runner's own state: the model prepared, the cache, the forward
 * workspace and the host batch arrays. */
static enum moe_status init_local(struct moe_runner *r, const struct moe_model *m, struct moe_backend *be,
                                  const struct moe_runner_opts *o)
{
    const bool hybrid = moe_config_linear_layers(&m->cfg) > 0;
    if (hybrid && o->prefix_cache)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: the prefix cache cannot serve a model with linear-attention "
                        "layers (their state is not kept per block)", m->cfg.architecture);
    MOE_TRY(be->ops->prepare_model(be, (struct moe_model *)m));
    /* data-parallel attention: a part of n_blocks per rank, this rank's stored */
    const bool dp = moe_ep_on(o->ep) && o->ep->dp;
    const int parts = dp ? o->ep->size : 1;
    if ((long long)o->n_blocks * parts > INT32_MAX / 2)
        return moe_fail(MOE_ERR_INVALID_ARG, "runner: %d blocks on each of %d ranks are too many", o->n_blocks, parts);
    MOE_TRY(moe_kvcache_init_part(&r->kv, moe_backend_allocator(be), &m->cfg, o->n_blocks * parts, o->block_size,
                                  o->kv_dtype_set ? o->kv_dtype : MOE_DTYPE_F32, o->prefix_cache, parts,
                                  dp ? o->ep->rank : 0));
    if (hybrid) { /* data-parallel attention: each rank's part holds its share, rounded up */
        const int want = o->state_slots > 0 ? o->state_slots : o->max_seqs;
        MOE_TRY(moe_kvcache_init_state(&r->kv, &m->cfg, (want + parts - 1) / parts * parts));
    }
    struct moe_forward_limits lim = {o->max_tokens, o->max_seqs, r->max_blocks, o->max_logits,
                                     o->hidden, moe_ep_on(o->ep) ? o->ep->max_slots : 0};
    MOE_TRY(moe_forward_init(&r->fw, m, be, &lim));
    size_t T = (size_t)o->max_tokens, S = (size_t)o->max_seqs + 1, tab;
    if (!moe_mul_size(S, (size_t)r->max_blocks, &tab))
        return moe_fail(MOE_ERR_NOMEM, "runner: block table size overflows");
    r->tokens = malloc(T * sizeof(int32_t));
    r->pos = malloc(T * sizeof(int32_t));
    r->seq_of = malloc(T * sizeof(int32_t));
    r->slot = malloc(T * sizeof(int32_t));
    r->rows = malloc(((size_t)o->max_logits > T ? (size_t)o->max_logits : T) * sizeof(int32_t));
    r->seq_start = malloc(S * sizeof(int32_t));
    r->ctx_len = malloc(S * sizeof(int32_t));
    r->table = malloc(tab * sizeof(int32_t));
    r->sslot = malloc(S * sizeof(int32_t));
    if (!r->tokens || !r->pos || !r->seq_of || !r->slot || !r->rows || !r->seq_start ||
        !r->ctx_len || !r->table || !r->sslot)
        return moe_fail(MOE_ERR_NOMEM, "runner: batch arrays");
    if (moe_ep_on(o->ep) && o->ep->dp && !(r->dp = malloc(S * sizeof(int32_t))))
        return moe_fail(MOE_ERR_NOMEM, "runner: data-parallel attention's ranks");
    return MOE_OK;
}

void moe_runner_free(struct moe_runner *r)
{
    if (moe_ep_on(r->fw.ep) && r->fw.ep->rank == 0) moe_ep_runner_close(r->fw.ep, r->fw.ep_runner);
    moe_forward_free(&r->fw);
    moe_kvcache_free(&r->kv);
    free(r->tokens);
    free(r->pos);
    free(r->seq_of);
    free(r->slot);
    free(r->rows);
    free(r->seq_start);
    free(r->ctx_len);
    free(r->table);
    free(r->sslot);
    free(r->dp);
    memset(r, 0, sizeof *r);
}

void moe_seq_reset(struct moe_runner *r, struct moe_seq *s)
{
    for (int i = 0; i < s->n_blocks; i++) moe_kvcache_release_block(&r->kv, s->blocks[i]);
    if (s->state) moe_kvcache_release_state(&r->kv, s->state - 1);
    s->n_blocks = 0;
    s->len = 0;
    s->state = 0;
}

void moe_seq_truncate(struct moe_runner *r, struct moe_seq *s, int len)
{
    MOE_ASSERT(len >= 0 && len <= s->len);
    const int keep = (len + r->o.block_size - 1) / r->o.block_size;
    while (s->n_blocks > keep) moe_kvcache_release_block(&r->kv, s->blocks[--s->n_blocks]);
    s->len = len;
}

void moe_seq_free(struct moe_runner *r, struct moe_seq *s)
{
    if (r->kv.blocks) moe_seq_reset(r, s);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

static enum moe_status seq_grow(struct moe_runner *r, struct moe_seq *s)
{
    if (s->cap >= r->max_blocks) return MOE_OK;
    int32_t *nb = realloc(s->blocks, (size_t)r->max_blocks * sizeof(int32_t));
    if (!nb) return moe_fail(MOE_ERR_NOMEM, "sequence block table");
    s->blocks = nb;
    s->cap = r->max_blocks;
    return MOE_OK;
}

int moe_runner_seq_part(const struct moe_runner *r, const struct moe_seq *s)
{
    const struct moe_kvcache *kv = &r->kv;
    if (kv->parts == 1) return 0;
    if (s->n_blocks > 0) return moe_kvcache_part_of(kv, s->blocks[0]);
    if (s->state) return (s->state - 1) / kv->state_part_slots;
    /* of the parts with a recurrent-state slot free (when the model keeps
     * them), the one with the most blocks available */
    int best = -1;
    for (int p = 0; p < kv->parts; p++)
        if ((kv->n_state_slots == 0 || kv->state_part_free[p] > 0) &&
            (best < 0 || moe_kvcache_available_in(kv, p) > moe_kvcache_available_in(kv, best)))
            best = p;
    return best < 0 ? 0 : best;
}

enum moe_status moe_runner_reserve(struct moe_runner *r, struct moe_seq *s, int len)
{
    const int B = r->o.block_size;
    int need = (len + B - 1) / B;
    if (need > r->max_blocks)
        return moe_fail(MOE_ERR_INVALID_ARG, "sequence of %d tokens exceeds the model's context "
                        "of %d", len, r->m->cfg.max_pos);
    MOE_TRY(seq_grow(r, s));
    const int part = moe_runner_seq_part(r, s);
    if (r->kv.n_state_slots > 0 && s->state == 0) {
        int32_t slot;
        MOE_TRY(moe_kvcache_alloc_state_in(&r->kv, part, &slot));
        s->state = slot + 1;
    }
    while (s->n_blocks < need) {
        MOE_TRY(moe_kvcache_alloc_block_in(&r->kv, part, &s->blocks[s->n_blocks]));
        s->n_blocks++;
    }
    return MOE_OK;
}

enum moe_status moe_seq_push_block(struct moe_runner *r, struct moe_seq *s, int32_t block)
{
    MOE_TRY(seq_grow(r, s));
    MOE_ASSERT(s->n_blocks < s->cap);
    s->blocks[s->n_blocks++] = block;
    return MOE_OK;
}

enum moe_status moe_runner_step(struct moe_runner *r, const struct moe_chunk *chunks,
                                int n_chunks, float *logits, int32_t *ids, int *n_rows,
                                struct moe_route_trace *trace)
{
    const int B = r->o.block_size;
    int T = 0, n_logits = 0;
    if (n_chunks <= 0 || n_chunks > r->o.max_seqs)
        return moe_fail(MOE_ERR_INVALID_ARG, "runner: %d chunks (limit %d)", n_chunks, r->o.max_seqs);
    for (int c = 0; c < n_chunks; c++) {
        if (chunks[c].n <= 0) return moe_fail(MOE_ERR_INVALID_ARG, "runner: empty chunk %d", c);
        for (int d = 0; d < c; d++)
            if (chunks[d].seq == chunks[c].seq)
                return moe_fail(MOE_ERR_INVALID_ARG, "runner: a sequence appears twice in one step");
        T += chunks[c].n;
        n_logits += chunks[c].all_logits ? chunks[c].n : 1;
        if (T > r->o.max_tokens)
            return moe_fail(MOE_ERR_INVALID_ARG, "runner: %d tokens exceed the step limit of %d", T,
                            r->o.max_tokens);
    }
    if (n_logits > r->o.max_logits)
        return moe_fail(MOE_ERR_INVALID_ARG, "runner: %d logit rows exceed the limit of %d",
                        n_logits, r->o.max_logits);
    /* reserve blocks; on failure give back what this step took */
    int saved_blocks[n_chunks];
    uint8_t decode[n_chunks], verify[n_chunks]; /* per chunk, for the batch's statistics fields */
    int64_t request_ids[n_chunks];
    enum moe_status s = MOE_OK;
    for (int c = 0; c < n_chunks; c++) saved_blocks[c] = chunks[c].seq->n_blocks;
    for (int c = 0; c < n_chunks && s == MOE_OK; c++)
        s = moe_runner_reserve(r, chunks[c].seq, chunks[c].seq->len + chunks[c].n);
    if (s != MOE_OK) goto undo;

    int row = 0, lrow = 0;
    r->seq_start[0] = 0;
    for (int c = 0; c < n_chunks; c++) {
        struct moe_seq *q = chunks[c].seq;
        for (int i = 0; i < chunks[c].n; i++, row++) {
            int p = q->len + i;
            r->tokens[row] = chunks[c].tokens[i];
            r->pos[row] = p;
            r->seq_of[row] = c;
            r->slot[row] = q->blocks[p / B] * B + p % B;
            if (chunks[c].all_logits || i == chunks[c].n - 1) r->rows[lrow++] = row;
        }
        r->seq_start[c + 1] = row;
        r->ctx_len[c] = q->len + chunks[c].n;
        r->sslot[c] = q->state - 1;
        if (r->dp) r->dp[c] = moe_kvcache_part_of(&r->kv, q->blocks[0]);
        decode[c] = chunks[c].decode;
        verify[c] = chunks[c].decode && chunks[c].n > 1;
        request_ids[c] = chunks[c].request_id ? chunks[c].request_id : c;
        memcpy(r->table + (size_t)c * r->max_blocks, q->blocks, (size_t)q->n_blocks * sizeof(int32_t));
    }
    struct moe_batch b = {
        .n_tokens = T, .n_seqs = n_chunks, .tokens = r->tokens, .positions = r->pos,
        .seq_of = r->seq_of, .seq_start = r->seq_start, .ctx_len = r->ctx_len,
        .block_table = r->table, .max_blocks = r->max_blocks, .slot = r->slot,
        .logit_rows = r->rows, .n_logits = n_logits, .decode = decode,
        .request_ids = request_ids, .verify = verify,
        .state_slot = r->kv.n_state_slots > 0 ? r->sslot : NULL, .dp_rank = r->dp,
    };
    if ((s = moe_forward_run(&r->fw, &r->kv, &b, logits, ids, trace)) != MOE_OK) goto undo;
    for (int c = 0; c < n_chunks; c++) chunks[c].seq->len += chunks[c].n;
    if (n_rows) *n_rows = n_logits;
    return MOE_OK;
undo:
    for (int c = 0; c < n_chunks; c++) {
        struct moe_seq *q = chunks[c].seq;
        while (q->n_blocks > saved_blocks[c]) moe_kvcache_release_block(&r->kv, q->blocks[--q->n_blocks]);
    }
    return s;
}

enum moe_status moe_runner_greedy(struct moe_runner *r, struct moe_seq *s, const int32_t *prompt,
                                  int n_prompt, int n_new, int chunk, int32_t *out)
{
    if (chunk <= 0 || chunk > r->o.max_tokens) chunk = r->o.max_tokens;
    if (n_new <= 0) return MOE_OK;
    /* the backend's argmax: only token ids come back to the host */
    enum moe_status st = MOE_OK;
    for (int off = 0; off < n_prompt && st == MOE_OK; off += chunk) {
        int n = n_prompt - off < chunk ? n_prompt - off : chunk;
        struct moe_chunk c = {s, prompt + off, n, false, false, 0};
        st = moe_runner_step(r, &c, 1, NULL, &out[0], NULL, NULL);
    }
    for (int i = 1; i < n_new && st == MOE_OK; i++) {
        struct moe_chunk c = {s, &out[i - 1], 1, false, true, 0};
        st = moe_runner_step(r, &c, 1, NULL, &out[i], NULL, NULL);
    }
    return st;
}
