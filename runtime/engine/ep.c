/* ep.c - expert parallelism: the layout, rank 0's messages and a follower's
 * loop (see ep.h).
 *
 * A message is a header broadcast from rank 0, then its payload:
 *   HELLO  runner id; payload: the runner's limits (struct geometry), then
 *          the opener's blob; every rank then all-gathers its status
 *   STEP   runner id; payload: T, S, then seq_start (S+1), ctx_len (S),
 *          tokens (T), positions (T), each sequence's blocks in use
 *          (ceil(ctx_len / B) of them), then for a model with
 *          linear-attention layers each sequence's state slot (S), with
 *          data-parallel attention each sequence's rank (S) and whether
 *          the step records its routing (1), then the
 *          logit rows' count and the rows, all int32
 *   FREE   runner id; STOP. */
#include "runtime/engine/ep_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "runtime/engine/runner.h"

#define EP_MAGIC 0x5045454du /* "MEEP" */
#define EP_MAX_RUNNERS 8     /* a follower's open runners at once */
/* The messages' layout; a follower of another layout refuses rank 0's
 * runners (every rank must run the same moerun).  Raise it with any change
 * to struct geometry or a payload. */
#define EP_PROTOCOL 6

enum kind { MSG_HELLO = 1, MSG_STEP, MSG_FREE, MSG_STOP };

struct header {
    uint32_t magic, kind;
    int32_t runner, pad;
    uint64_t bytes;
};

struct geometry {
    int32_t protocol, size; /* EP_PROTOCOL, sizeof(struct geometry) */
    int32_t max_tokens, max_seqs, max_logits, block_size, n_blocks, kv_dtype, state_slots;
    uint8_t kv_dtype_set, prefix_cache, hidden, pad;
};

/* A rank's status after a HELLO, gathered on every rank. */
struct status {
    int32_t ok, pad;
    int64_t peak_kib; /* the rank's peak resident memory so far */
    uint64_t model;   /* moe_model_fingerprint of what the rank opened (0: none or synthetic) */
    char msg[240];
};

void moe_ep_init(struct moe_ep *ep, struct moe_comm *c)
{
    memset(ep, 0, sizeof *ep);
    ep->comm = c;
    ep->rank = moe_comm_rank(c);
    ep->size = moe_comm_size(c);
    ep->tp = 1;
}

enum moe_status moe_ep_set_dp(struct moe_ep *ep, bool on)
{
    if (on && ep->tp > 1)
        return moe_fail(MOE_ERR_UNSUPPORTED, "--dp-attention with --tp %d: data-parallel attention splits the "
                        "sequences over the ranks, tensor parallelism each sequence's heads; choose one", ep->tp);
    ep->dp = on;
    ep->dp_local = on;
    return MOE_OK;
}

void moe_ep_free(struct moe_ep *ep)
{
    moe_ep_unplace(ep);
    free(ep->bounds);
    free(ep->counts);
    free(ep->rows_rank);
    free(ep->open_kib);
    free(ep->msg);
    free(ep->tp_buf);
    moe_comm_free(ep->tp_comm);
    memset(ep, 0, sizeof *ep);
}

/* Makes the message buffer hold a header and `payload` bytes. */
static enum moe_status reserve(struct moe_ep *ep, size_t payload)
{
    size_t need;
    if (!moe_add_size(payload, sizeof(struct header), &need))
        return moe_fail(MOE_ERR_NOMEM, "expert parallelism: message size overflows");
    if (need <= ep->msg_cap) return MOE_OK;
    void *p = realloc(ep->msg, need);
    if (!p) return moe_fail(MOE_ERR_NOMEM, "expert parallelism: a message of %zu bytes", need);
    ep->msg = p;
    ep->msg_cap = need;
    return MOE_OK;
}

/* Rank 0: broadcasts the header and the payload already at msg + header. */
static enum moe_status send(struct moe_ep *ep, enum kind k, int runner, size_t bytes, const char *what)
{
    struct header h = {EP_MAGIC, (uint32_t)k, runner, 0, bytes};
    MOE_TRY(moe_comm_bcast(ep->comm, &h, sizeof h, 0, what));
    if (bytes == 0) return MOE_OK;
    return moe_comm_bcast(ep->comm, (char *)ep->msg + sizeof h, bytes, 0, what);
}

/* Steps of a runner with these limits need at most this many payload bytes. */
static enum moe_status step_bytes(const struct geometry *g, int max_blocks, size_t *out)
{
    size_t ints, tab;
    if (!moe_mul_size((size_t)g->max_seqs, (size_t)max_blocks, &tab) ||
        !moe_add_size(tab, 6 + 4 * (size_t)g->max_seqs + 2 * (size_t)g->max_tokens + (size_t)g->max_logits, &ints) ||
        !moe_mul_size(ints, sizeof(int32_t), out))
        return moe_fail(MOE_ERR_NOMEM, "expert parallelism: step message size overflows");
    return MOE_OK;
}

enum moe_status moe_ep_stop(struct moe_ep *ep)
{
    if (!moe_ep_on(ep) || ep->rank != 0) return MOE_OK;
    MOE_TRY(reserve(ep, 0));
    return send(ep, MSG_STOP, -1, 0, "telling the other ranks to stop");
}

/* Every rank's status gathered; the first failure (lowest rank) as the
 * error, or a rank that opened another checkpoint than rank 0 (m: the
 * model this rank opened, or NULL). */
static enum moe_status exchange_status(struct moe_ep *ep, enum moe_status mine, int runner,
                                       const struct moe_model *m)
{
    struct rusage ru;
    struct status me = {mine == MOE_OK, 0, getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_maxrss : -1,
                        m ? moe_model_fingerprint(m) : 0, ""},
                  *all = calloc((size_t)ep->size, sizeof *all);
    if (mine != MOE_OK) snprintf(me.msg, sizeof me.msg, "%s", moe_last_error());
    if (!all) return mine != MOE_OK ? mine : moe_fail(MOE_ERR_NOMEM, "expert parallelism: status table");
    enum moe_status s = moe_comm_allgather_idle(ep->comm, &me, all, sizeof me, "opening a runner on every rank");
    for (int r = 0; r < ep->size && s == MOE_OK && ep->open_kib; r++) ep->open_kib[r] = all[r].peak_kib;
    for (int r = 0; r < ep->size && s == MOE_OK; r++)
        if (!all[r].ok)
            s = r == ep->rank ? mine
                              : moe_fail(MOE_ERR_IO, "rank %d could not open runner %d: %.*s", r, runner,
                                         (int)sizeof all[r].msg, all[r].msg);
    for (int r = 1; r < ep->size && s == MOE_OK; r++)
        if (all[r].model != all[0].model)
            s = moe_fail(MOE_ERR_INVALID_ARG, "rank %d opened another checkpoint than rank 0 (its config.json or "
                         "safetensors headers differ: fingerprint %016llx, rank 0's %016llx); every rank must "
                         "read the same files", r, (unsigned long long)all[r].model,
                         (unsigned long long)all[0].model);
    free(all);
    return s;
}

enum moe_status moe_ep_runner_open(struct moe_ep *ep, struct moe_runner *r, const struct moe_runner_opts *o,
                                   enum moe_status local)
{
    /* rank 0: announce the runner, then learn whether every rank opened it */
    const int id = ep->next_runner++;
    const struct geometry g = {EP_PROTOCOL, (int32_t)sizeof(struct geometry), o->max_tokens, o->max_seqs,
                               o->max_logits, o->block_size, o->n_blocks, (int32_t)o->kv_dtype,
                               r->kv.n_state_slots, o->kv_dtype_set, o->prefix_cache, o->hidden, 0};
    size_t steps = 0, hello;
    enum moe_status s = step_bytes(&g, r->max_blocks, &steps);
    if (s == MOE_OK && !moe_add_size(sizeof g, ep->hello_bytes, &hello))
        s = moe_fail(MOE_ERR_NOMEM, "expert parallelism: HELLO size overflows");
    if (s == MOE_OK) s = reserve(ep, hello > steps ? hello : steps);
    if (s != MOE_OK) return s;
    char *p = (char *)ep->msg + sizeof(struct header);
    memcpy(p, &g, sizeof g);
    if (ep->hello_bytes) memcpy(p + sizeof g, ep->hello, ep->hello_bytes);
    MOE_TRY(send(ep, MSG_HELLO, id, hello, "announcing a runner"));
    MOE_TRY(exchange_status(ep, local, id, r->m));
    r->fw.ep = ep;
    r->fw.ep_runner = id;
    return MOE_OK;
}

void moe_ep_runner_close(struct moe_ep *ep, int id)
{
    if (reserve(ep, 0) != MOE_OK || send(ep, MSG_FREE, id, 0, "closing a runner") != MOE_OK)
        fprintf(stderr, "moerun: %s\n", moe_last_error());
}

enum moe_status moe_ep_send_step(struct moe_ep *ep, int runner, const struct moe_batch *b, int block_size)
{
    const int T = b->n_tokens, S = b->n_seqs;
    int32_t *p = (int32_t *)((char *)ep->msg + sizeof(struct header)), *q = p;
    *q++ = T;
    *q++ = S;
    memcpy(q, b->seq_start, ((size_t)S + 1) * sizeof *q), q += S + 1;
    memcpy(q, b->ctx_len, (size_t)S * sizeof *q), q += S;
    memcpy(q, b->tokens, (size_t)T * sizeof *q), q += T;
    memcpy(q, b->positions, (size_t)T * sizeof *q), q += T;
    for (int s = 0; s < S; s++) {
        const int nb = (b->ctx_len[s] + block_size - 1) / block_size;
        memcpy(q, b->block_table + (size_t)s * b->max_blocks, (size_t)nb * sizeof *q);
        q += nb;
    }
    if (b->state_slot) memcpy(q, b->state_slot, (size_t)S * sizeof *q), q += S;
    if (ep->dp) {
        memcpy(q, b->dp_rank, (size_t)S * sizeof *q), q += S;
        *q++ = ep->dp_record;
    }
    /* the rows that need logits: the last layer's FFN runs for them alone */
    *q++ = b->n_logits;
    memcpy(q, b->logit_rows, (size_t)b->n_logits * sizeof *q), q += b->n_logits;
    return send(ep, MSG_STEP, runner, (size_t)(q - p) * sizeof *q, "sending a step");
}

int32_t moe_ep_gather_count(struct moe_ep *ep, const int32_t *offsets, int layer)
{
    const int32_t *bounds = ep->layers[layer].bounds;
    int most = 0;
    for (int r = 0; r < ep->size; r++) {
        ep->displs[r] = offsets[bounds[r]];
        ep->counts[r] = offsets[bounds[r + 1]] - ep->displs[r];
        most = ep->counts[r] > most ? ep->counts[r] : most;
        ep->rows_rank[r] += (uint64_t)ep->counts[r];
    }
    ep->n.rows_own += (uint64_t)ep->counts[ep->rank];
    ep->n.rows_all += (uint64_t)offsets[bounds[ep->size]];
    ep->n.rows_max += (uint64_t)most;
    const int32_t all = offsets[bounds[ep->size]];
    if (all > 0) {
        ep->n.ratio_sum += (double)most * ep->size / all;
        ep->n.cells++;
    }
    return all;
}

enum moe_status moe_ep_gather(struct moe_ep *ep, float *ye, const int32_t *offsets, int D, int layer)
{
    const int32_t all = moe_ep_gather_count(ep, offsets, layer);
    char what[48];
    snprintf(what, sizeof what, "layer %d: expert rows", layer);
    struct moe_comm_counters a, b;
    moe_comm_counters(ep->comm, &a);
    enum moe_status s = moe_comm_allgatherv_rows(ep->comm, ye, ep->counts, ep->displs, D, what);
    moe_comm_counters(ep->comm, &b);
    ep->n.gather_s += b.seconds - a.seconds;
    ep->n.gather_bytes += (uint64_t)(all - ep->counts[ep->rank]) * (uint64_t)D * sizeof(float);
    return s;
}

/* ---- a follower ---- */

struct follower {
    struct moe_ep *ep;
    const struct moe_ep_follower *f;
    const struct moe_model *m;
    struct moe_backend *be;
    struct moe_runner r[EP_MAX_RUNNERS];
    int id[EP_MAX_RUNNERS]; /* -1: free slot */
};

static int slot_of(const struct follower *w, int id)
{
    for (int i = 0; i < EP_MAX_RUNNERS; i++)
        if (w->id[i] == id) return i;
    return -1;
}

static enum moe_status open_runner(struct follower *w, int id, const char *p, size_t bytes)
{
    struct geometry g;
    enum moe_status s = MOE_OK;
    const int i = slot_of(w, -1);
    if (bytes < sizeof g)
        s = moe_fail(MOE_ERR_FORMAT, "expert parallelism: a HELLO of %zu bytes", bytes);
    else if (i < 0 || slot_of(w, id) >= 0)
        s = moe_fail(MOE_ERR_INVALID_ARG, "expert parallelism: runner %d: no free slot or already open", id);
    if (s == MOE_OK) memcpy(&g, p, sizeof g);
    if (s == MOE_OK && (g.protocol != EP_PROTOCOL || g.size != (int32_t)sizeof g))
        s = moe_fail(MOE_ERR_UNSUPPORTED, "rank %d runs another moerun than rank 0 (message layout %d, rank 0's "
                     "%d): run the same moerun on every rank", w->ep->rank, EP_PROTOCOL, g.protocol);
    if (s == MOE_OK && !w->m) s = w->f->open(w->f->ctx, p + sizeof g, bytes - sizeof g, &w->m, &w->be);
    if (s == MOE_OK) {
        const struct moe_runner_opts o = {.max_tokens = g.max_tokens, .max_seqs = g.max_seqs,
                                          .max_logits = g.max_logits, .block_size = g.block_size,
                                          .n_blocks = g.n_blocks, .kv_dtype = (enum moe_dtype)g.kv_dtype,
                                          .kv_dtype_set = g.kv_dtype_set, .prefix_cache = g.prefix_cache,
                                          .hidden = g.hidden,
                                          .state_slots = g.state_slots, .ep = w->ep};
        s = moe_runner_init(&w->r[i], w->m, w->be, &o);
        size_t steps = 0;
        if (s == MOE_OK && (s = step_bytes(&g, w->r[i].max_blocks, &steps)) == MOE_OK) s = reserve(w->ep, steps);
        if (s == MOE_OK) {
            w->id[i] = id;
            w->r[i].fw.ep = w->ep;
            w->r[i].fw.ep_runner = id;
        } else {
            moe_runner_free(&w->r[i]);
        }
    }
    /* a failure (here or on another rank) fails rank 0's runner; this rank
     * goes on following (rank 0 prints the message and stops the job) */
    if (exchange_status(w->ep, s, id, w->m) != MOE_OK && s == MOE_OK) {
        moe_runner_free(&w->r[i]);
        w->id[i] = -1;
    }
    moe_clear_error();
    return MOE_OK;
}

/* Unpacks a STEP into runner r's host arrays and runs it (no logits). */
static enum moe_status run_step(struct moe_runner *r, const int32_t *p, size_t bytes)
{
    const size_t n = bytes / sizeof *p;
    const int B = r->o.block_size;
    if (n < 2 || p[0] <= 0 || p[0] > r->o.max_tokens || p[1] <= 0 || p[1] > r->o.max_seqs ||
        (size_t)(2 + 2 * p[1] + 1 + 2 * p[0]) > n)
        return moe_fail(MOE_ERR_FORMAT, "expert parallelism: a malformed step");
    const int T = p[0], S = p[1];
    const int32_t *q = p + 2, *end = p + n;
    memcpy(r->seq_start, q, ((size_t)S + 1) * sizeof *q), q += S + 1;
    memcpy(r->ctx_len, q, (size_t)S * sizeof *q), q += S;
    memcpy(r->tokens, q, (size_t)T * sizeof *q), q += T;
    memcpy(r->pos, q, (size_t)T * sizeof *q), q += T;
    if (r->seq_start[0] != 0 || r->seq_start[S] != T)
        return moe_fail(MOE_ERR_FORMAT, "expert parallelism: a step's rows do not add up");
    for (int s = 0; s < S; s++) {
        const int a = r->seq_start[s], z = r->seq_start[s + 1], c = r->ctx_len[s];
        if (z < a || c <= 0 || c > r->max_blocks * B)
            return moe_fail(MOE_ERR_FORMAT, "expert parallelism: a step's sequence %d is malformed", s);
        const int nb = (c + B - 1) / B;
        if (end - q < nb) return moe_fail(MOE_ERR_FORMAT, "expert parallelism: a step's block table is short");
        int32_t *row = r->table + (size_t)s * r->max_blocks;
        memcpy(row, q, (size_t)nb * sizeof *q), q += nb;
        for (int t = a; t < z; t++) {
            const int pos = r->pos[t];
            r->seq_of[t] = s;
            r->slot[t] = pos >= 0 && pos < c ? row[pos / B] * B + pos % B : -1; /* validate names a bad one */
        }
    }
    const bool hybrid = r->kv.n_state_slots > 0; /* forward validates the slots */
    if (hybrid) {
        if (end - q < S) return moe_fail(MOE_ERR_FORMAT, "expert parallelism: a step's state slots are short");
        memcpy(r->sslot, q, (size_t)S * sizeof *q), q += S;
    }
    if (r->dp) { /* forward validates the ranks */
        if (end - q < S + 1) return moe_fail(MOE_ERR_FORMAT, "expert parallelism: a step's sequence ranks are short");
        memcpy(r->dp, q, (size_t)S * sizeof *q), q += S;
        r->o.ep->dp_record = *q++ != 0;
    }
    const int n_logits = end - q >= 1 ? *q++ : -1;
    if (n_logits < 0 || n_logits > T || n_logits > r->o.max_logits || end - q < n_logits)
        return moe_fail(MOE_ERR_FORMAT, "expert parallelism: a step's logit rows are malformed");
    memcpy(r->rows, q, (size_t)n_logits * sizeof *q);
    /* a follower computes its share of the logits and sends it to rank 0
     * (forward_ep.c), keeping none */
    const struct moe_batch b = {.n_tokens = T, .n_seqs = S, .tokens = r->tokens, .positions = r->pos,
                                .seq_of = r->seq_of, .seq_start = r->seq_start, .ctx_len = r->ctx_len,
                                .block_table = r->table, .max_blocks = r->max_blocks, .slot = r->slot,
                                .logit_rows = r->rows, .n_logits = n_logits, .state_slot = hybrid ? r->sslot : NULL,
                                .dp_rank = r->dp};
    return moe_forward_run(&r->fw, &r->kv, &b, NULL, NULL, NULL);
}

/* Receives one message into ep->msg; *h its header. */
static enum moe_status receive(struct moe_ep *ep, struct header *h)
{
    MOE_TRY(moe_comm_bcast_idle(ep->comm, h, sizeof *h, 0, "waiting for rank 0"));
    if (h->magic != EP_MAGIC || h->kind < MSG_HELLO || h->kind > MSG_STOP)
        return moe_fail(MOE_ERR_FORMAT, "expert parallelism: rank %d received a message it does not know "
                        "(another program on the other ranks?)", ep->rank);
    if (h->bytes == 0) return MOE_OK;
    if (h->kind == MSG_HELLO) MOE_TRY(reserve(ep, h->bytes)); /* a step fits its runner's HELLO reserve */
    if (h->bytes > ep->msg_cap - sizeof *h)
        return moe_fail(MOE_ERR_FORMAT, "expert parallelism: a message of %llu bytes exceeds the %zu its runner "
                        "announced", (unsigned long long)h->bytes, ep->msg_cap - sizeof *h);
    return moe_comm_bcast(ep->comm, (char *)ep->msg + sizeof *h, h->bytes, 0, "receiving a message");
}

enum moe_status moe_ep_follow(struct moe_ep *ep, const struct moe_ep_follower *f)
{
    struct follower w = {.ep = ep, .f = f};
    for (int i = 0; i < EP_MAX_RUNNERS; i++) w.id[i] = -1;
    enum moe_status s = reserve(ep, 0);
    for (struct header h; s == MOE_OK;) {
        if ((s = receive(ep, &h)) != MOE_OK) break;
        const char *p = (const char *)ep->msg + sizeof h;
        const int i = slot_of(&w, h.runner);
        if (h.kind == MSG_STOP) break;
        if (h.kind == MSG_HELLO) {
            s = open_runner(&w, h.runner, p, h.bytes);
        } else if (i < 0) {
            s = moe_fail(MOE_ERR_FORMAT, "expert parallelism: rank 0 named runner %d, which is not open", h.runner);
        } else if (h.kind == MSG_FREE) {
            moe_runner_free(&w.r[i]);
            w.id[i] = -1;
        } else {
            s = run_step(&w.r[i], (const int32_t *)p, h.bytes);
        }
    }
    for (int i = 0; i < EP_MAX_RUNNERS; i++)
        if (w.id[i] >= 0) moe_runner_free(&w.r[i]);
    if (f->close) f->close(f->ctx);
    return s;
}
