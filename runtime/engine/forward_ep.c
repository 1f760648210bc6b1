/* forward_ep.c - the forward pass across ranks (runtime/engine/ep.h): a
 * MoE layer's experts spread over the ranks (each rank's slots computed,
 * the rows all-gathered, then the combine) and tensor parallelism's group
 * sums and whole-row norms.  The collectives run on host memory: on the
 * CPU backends in the backend's buffers themselves, on a backend whose
 * memory is not the host's (CUDA) through a host stage, the routing read
 * back and each pair's slot copied in (forward.h, the ep_* fields), unless
 * the backend's own collectives (backend.h coll_*: NCCL) open on every
 * rank: then the expert rows and the sums stay in backend memory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/engine/ep_impl.h"
#include "runtime/core/clock.h"
#include "runtime/engine/forward.h"

static enum moe_status ep_state(struct moe_forward *fw);
static void slot_view_free(struct moe_backend *be, struct moe_expert_weights *v);

/* ---- the backend's own collectives (backend.h coll_*) ---- */

#define COLL_WHY 192 /* bytes of a rank's reason */

/* Every rank's ok (and, when false, why: "rank R: message") gathered over
 * the world; *all_ok whether all were, why (cap) the first failure's. */
static enum moe_status coll_agree(struct moe_ep *ep, bool ok, bool *all_ok, char *why, size_t cap)
{
    char mine[1 + COLL_WHY] = {0};
    mine[0] = ok;
    if (!ok) snprintf(mine + 1, COLL_WHY, "rank %d: %s", ep->rank, moe_last_error());
    char *all = malloc((size_t)ep->size * sizeof mine);
    if (!all) return moe_fail(MOE_ERR_NOMEM, "opening the backend's collectives");
    enum moe_status s = moe_comm_allgather(ep->comm, mine, all, sizeof mine, "opening the backend's collectives");
    *all_ok = s == MOE_OK;
    for (int r = 0; *all_ok && r < ep->size; r++)
        if (!all[(size_t)r * sizeof mine]) {
            *all_ok = false;
            snprintf(why, cap, "%.*s", COLL_WHY - 1, all + (size_t)r * sizeof mine + 1);
        }
    free(all);
    return s;
}

/* Joins group g (communicator c, a part of the world) on every rank: the
 * group's rank 0 makes the id, the others receive it, all join; *ok says
 * whether every rank of the world joined, why (cap) the first failure. */
static enum moe_status coll_join(struct moe_forward *fw, int g, struct moe_comm *c, bool *ok, char *why, size_t cap)
{
    struct moe_backend *be = fw->be;
    struct {
        int32_t ok;
        char id[MOE_COLL_ID_BYTES];
    } m = {0, {0}};
    bool mine = true;
    if (moe_comm_rank(c) == 0) mine = be->ops->coll_id(be, m.id) == MOE_OK;
    m.ok = mine;
    MOE_TRY(moe_comm_bcast(c, &m, sizeof m, 0, "opening the backend's collectives"));
    if (mine && m.ok) /* else the group's rank 0 failed, and says why */
        mine = be->ops->coll_open(be, g, m.id, moe_comm_rank(c), moe_comm_size(c), fw->ep->rank,
                                  moe_comm_timeout(c)) == MOE_OK;
    return coll_agree(fw->ep, mine, ok, why, cap);
}

/* Decides, once per process and at the same step on every rank, whether
 * the backend's collectives carry expert parallelism's rows and tensor
 * parallelism's sums (ep.h, enum moe_ep_coll). */
static enum moe_status coll_decide(struct moe_forward *fw)
{
    struct moe_backend *be = fw->be;
    struct moe_ep *ep = fw->ep;
    if (ep->coll_state) return MOE_OK;
    ep->coll_state = -1;
    if (be->ops->host_memory || ep->coll == MOE_EP_COLL_HOST) return MOE_OK;
    char why[256] = "the backend has no collectives of its own";
    bool ok = be->ops->coll_open != NULL;
    /* first whether every rank can open them at all (so a rank without
     * NCCL costs no timeout), then the groups */
    if (ok) MOE_TRY(coll_agree(ep, be->ops->coll_id(be, NULL) == MOE_OK, &ok, why, sizeof why));
    if (ok) MOE_TRY(coll_join(fw, MOE_COLL_EP, ep->comm, &ok, why, sizeof why));
    if (ok && ep->tp > 1) {
        struct moe_comm *tc;
        MOE_TRY(moe_ep_tp_comm(ep, &tc));
        MOE_TRY(coll_join(fw, MOE_COLL_TP, tc, &ok, why, sizeof why));
    }
    if (ok) {
        ep->coll_state = 1;
        return MOE_OK;
    }
    for (int g = 0; be->ops->coll_close && g < MOE_COLL_GROUPS; g++) be->ops->coll_close(be, g);
    if (ep->coll == MOE_EP_COLL_DEVICE) { /* asked for and impossible: every rank knows, the job ends */
        if (ep->rank == 0) fprintf(stderr, "moerun: --collectives nccl: %s; ending the job\n", why);
        fflush(stderr);
        if (moe_comm_barrier(ep->comm, "ending the job") == MOE_OK) moe_comm_abort(ep->comm);
        return moe_fail(MOE_ERR_UNSUPPORTED, "--collectives nccl: %s", why);
    }
    if (ep->rank == 0)
        fprintf(stderr, "moerun: the %s backend's collectives are staged through host memory and MPI (%s)\n",
                be->ops->name, why);
    return MOE_OK;
}

/* A failed collective of the backend's transport leaves the ranks out of
 * step: its message is printed and the job ends (comm.h). */
static enum moe_status coll_check(struct moe_forward *fw, enum moe_status s)
{
    if (s == MOE_OK) return s;
    fprintf(stderr, "moerun: rank %d: %s; ending the job\n", fw->ep->rank, moe_last_error());
    moe_comm_abort(fw->ep->comm);
    return s;
}

/* Tensor parallelism (ep.h): whether this rank's layers hold a share of
 * the heads and widths, so their outputs are parts of a sum. */
static bool tp_on(const struct moe_forward *fw) { return fw->ep && fw->ep->tp > 1; }

/* The part of a split layer's output in buf (T, D) summed over the group
 * (a backend not in host memory: through the host stage). */
enum moe_status moe_forward_tp_sum(struct moe_forward *fw, float *buf, int T, const char *what, int l)
{
    if (!tp_on(fw)) return MOE_OK;
    const size_t n = (size_t)T * fw->m->cfg.d_model;
    struct moe_backend *be = fw->be;
    if (be->ops->host_memory) return moe_ep_tp_sum(fw->ep, buf, n, what, l);
    MOE_TRY(ep_state(fw));
    if (fw->ep->coll_state > 0) {
        struct moe_ep *ep = fw->ep;
        char msg[64];
        snprintf(msg, sizeof msg, "layer %d: %s", l, what);
        const double t0 = moe_seconds();
        MOE_TRY(coll_check(fw, be->ops->coll_sum(be, MOE_COLL_TP, buf, n, msg)));
        ep->tp_s += moe_seconds() - t0;
        ep->tp_bytes += 2 * (uint64_t)n * sizeof(float) * (uint64_t)(ep->tp - 1) / (uint64_t)ep->tp;
        return MOE_OK;
    }
    MOE_TRY(be->ops->to_host(be, fw->ep_stage, buf, n * sizeof(float)));
    MOE_TRY(moe_ep_tp_sum(fw->ep, fw->ep_stage, n, what, l));
    return be->ops->to_device(be, buf, fw->ep_stage, n * sizeof(float));
}

/* moe_forward_norm_whole_rows over the backend's transport: every rank's
 * (T, w) block shared over the group into ep_d_blocks (rank r's at r T w),
 * the whole rows laid out in ep_d_rows from the first rank holding each
 * part (as moe_ep_tp_rows does), normed there, and this rank's columns
 * taken back into x.  Never through the host. */
static enum moe_status norm_rows_shared(struct moe_forward *fw, float *x, int T, int w, int parts,
                                        const struct moe_tensor *nw, const char *what, int l)
{
    struct moe_backend *be = fw->be;
    struct moe_ep *ep = fw->ep;
    const int M = ep->tp, step = M / parts;
    const size_t n = (size_t)T * (size_t)w;
    size_t *offs = fw->ep_share_offs; /* size + 1 entries, M <= size */
    if (!be->ops->gather_cols) return moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: no column copies", be->ops->name);
    if (n * (size_t)M > fw->ep_d_rows_floats) /* parts <= M */
        return moe_fail(MOE_ERR_INVALID_ARG, "tensor parallelism: %d rows of %d over %d ranks exceed the rows' buffer",
                        T, w, M);
    for (int r = 0; r <= M; r++) offs[r] = (size_t)r * n;
    char msg[64];
    snprintf(msg, sizeof msg, "layer %d: %s", l, what);
    const double t0 = moe_seconds();
    MOE_TRY(be->ops->gather_cols(be, fw->ep_d_blocks + offs[ep->tp_rank], w, x, w, T, NULL, w));
    MOE_TRY(coll_check(fw, be->ops->coll_share(be, MOE_COLL_TP, fw->ep_d_blocks, offs, msg)));
    ep->tp_s += moe_seconds() - t0;
    ep->tp_bytes += (uint64_t)n * sizeof(float) * (uint64_t)(M - 1);
    const int W = w * parts;
    for (int p = 0; p < parts; p++)
        MOE_TRY(be->ops->gather_cols(be, fw->ep_d_rows + (size_t)p * w, W, fw->ep_d_blocks + offs[p * step], w, T,
                                     NULL, w));
    MOE_TRY(be->ops->rmsnorm(be, fw->ep_d_rows, fw->ep_d_rows, nw, T, W, fw->m->cfg.rms_eps));
    return be->ops->gather_cols(be, x, w, fw->ep_d_rows + (size_t)(ep->tp_rank / step) * w, W, T, NULL, w);
}

/* RMSNorm over whole rows of x (T, w): this rank's w columns, the norm's
 * weight nw over all of the group's; the group's rows gathered first
 * under tensor parallelism. */
enum moe_status moe_forward_norm_whole_rows(struct moe_forward *fw, float *x, int T, int w, const struct moe_tensor *nw,
                                            const char *what, int l)
{
    struct moe_backend *be = fw->be;
    const float eps = fw->m->cfg.rms_eps;
    if (!tp_on(fw)) return be->ops->rmsnorm(be, x, x, nw, T, w, eps);
    const int parts = (int)(nw->shape[0] / w); /* fewer than tp: heads held by several ranks */
    float *full;
    if (be->ops->host_memory) {
        MOE_TRY(moe_ep_tp_rows(fw->ep, x, T, w, parts, &full, what, l));
        MOE_TRY(be->ops->rmsnorm(be, full, full, nw, T, w * parts, eps));
        moe_ep_tp_take(fw->ep, x, full, T, w, parts);
        return MOE_OK;
    }
    MOE_TRY(ep_state(fw));
    if (fw->ep->coll_state > 0) return norm_rows_shared(fw, x, T, w, parts, nw, what, l);
    /* staged: this rank's columns to the host, the group's rows gathered
     * there and normed in ep_d_rows, this rank's columns back */
    const size_t n = (size_t)T * (size_t)w, all = n * (size_t)parts;
    if (all > fw->ep_stage_floats)
        return moe_fail(MOE_ERR_INVALID_ARG, "tensor parallelism: %d rows of %d exceed the stage", T, w * parts);
    MOE_TRY(be->ops->to_host(be, fw->ep_stage, x, n * sizeof(float)));
    MOE_TRY(moe_ep_tp_rows(fw->ep, fw->ep_stage, T, w, parts, &full, what, l));
    MOE_TRY(be->ops->to_device(be, fw->ep_d_rows, full, all * sizeof(float)));
    MOE_TRY(be->ops->rmsnorm(be, fw->ep_d_rows, fw->ep_d_rows, nw, T, w * parts, eps));
    MOE_TRY(be->ops->to_host(be, full, fw->ep_d_rows, all * sizeof(float)));
    moe_ep_tp_take(fw->ep, fw->ep_stage, full, T, w, parts);
    return be->ops->to_device(be, x, fw->ep_stage, n * sizeof(float));
}

/* The widest row a norm over a tensor-parallel group's whole rows sees
 * (q_norm and k_norm over every head), at least d_model. */
static size_t whole_row_floats(const struct moe_model *m)
{
    size_t w = (size_t)m->cfg.d_model;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct moe_tensor *t[] = {&m->layers[l].q_norm, &m->layers[l].k_norm};
        for (int i = 0; i < 2; i++)
            if (t[i]->data && t[i]->ndim == 1 && (size_t)t[i]->shape[0] > w) w = (size_t)t[i]->shape[0];
    }
    return w;
}

/* The bytes of an (n, W) f32 bias table; false on overflow. */
static bool bias_bytes(const struct moe_tensor *b, size_t *bytes)
{
    size_t n;
    return b->shape[0] >= 0 && b->shape[1] >= 0 && moe_mul_size((size_t)b->shape[0], (size_t)b->shape[1], &n) &&
           moe_mul_size(n, sizeof(float), bytes);
}

/* Act-order experts in backend memory: each slot's column orders (its
 * expert's, in order where it has none) laid out by slot, inputs (n, D)
 * then down (n, F), in one buffer of the backend's (v->cols[0]), the
 * layout its kernels index by slot. */
static enum moe_status slot_cols(struct moe_forward *fw, int l, struct moe_expert_weights *v)
{
    struct moe_backend *be = fw->be;
    const struct moe_expert_weights *x = &fw->m->layers[l].experts;
    const struct moe_ep_layer *pl = &fw->ep->layers[l];
    const size_t n = (size_t)pl->n_slots, D = (size_t)fw->m->cfg.d_model, F = (size_t)fw->m->cfg.d_expert;
    size_t ints, bytes;
    if (!moe_mul_size(n, D + F, &ints) || !moe_mul_size(ints, sizeof(int32_t), &bytes))
        return moe_fail(MOE_ERR_NOMEM, "expert parallelism: layer %d: column orders overflow", l);
    int32_t **cols = calloc(2 * n, sizeof *cols), *h = malloc(bytes), *d = NULL;
    enum moe_status s = cols && h ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "expert parallelism: column orders");
    for (size_t i = 0; i < n && s == MOE_OK; i++)
        for (int k = 0; k < 2 && s == MOE_OK; k++) {
            const size_t W = k ? F : D;
            int32_t *o = h + (k ? n * D + i * F : i * D);
            const int32_t *src = x->cols[2 * (size_t)pl->expert[i] + (size_t)k];
            if (src)
                s = be->ops->to_host(be, o, src, W * sizeof(int32_t));
            else
                for (size_t j = 0; j < W; j++) o[j] = (int32_t)j;
        }
    if (s == MOE_OK) s = be->ops->alloc(be, bytes, (void **)&d);
    if (s == MOE_OK) s = be->ops->to_device(be, d, h, bytes);
    free(h);
    if (s != MOE_OK) {
        if (d) be->ops->dealloc(be, d);
        free(cols);
        return s;
    }
    for (size_t i = 0; i < n; i++) cols[2 * i] = d + i * D, cols[2 * i + 1] = d + n * D + i * F;
    free(v->cols);
    v->cols = (const int32_t **)cols;
    return MOE_OK;
}

/* A view of layer l's experts by slot (ep_impl.h).  Its biases (gpt-oss)
 * and column orders (act-order), copies by slot, are in the backend's
 * memory: for a backend not in host memory the table's are read back,
 * laid out by slot and sent there. */
static enum moe_status slot_view(struct moe_forward *fw, int l, struct moe_expert_weights *v)
{
    struct moe_backend *be = fw->be;
    const struct moe_expert_weights *x = &fw->m->layers[l].experts;
    if (be->ops->host_memory || !(x->b_gate.data || x->b_up.data || x->b_down.data || x->cols))
        return moe_ep_slot_view(fw->ep, l, x, v);
    struct moe_expert_weights hx = *x;
    hx.cols = NULL; /* below */
    struct moe_tensor *hb[] = {&hx.b_gate, &hx.b_up, &hx.b_down};
    enum moe_status s = MOE_OK;
    for (int i = 0; i < 3; i++) hb[i]->data = NULL;
    const struct moe_tensor *db[] = {&x->b_gate, &x->b_up, &x->b_down};
    for (int i = 0; i < 3 && s == MOE_OK; i++) {
        if (!db[i]->data) continue;
        size_t bytes;
        if (db[i]->dtype != MOE_DTYPE_F32 || db[i]->ndim != 2 || !bias_bytes(db[i], &bytes))
            s = moe_fail(MOE_ERR_INVALID_ARG, "expert parallelism: layer %d: expert biases must be (E, W) f32", l);
        else if (!(hb[i]->data = malloc(bytes)))
            s = moe_fail(MOE_ERR_NOMEM, "expert parallelism: layer %d: expert biases", l);
        else
            s = be->ops->to_host(be, hb[i]->data, db[i]->data, bytes);
    }
    if (s == MOE_OK) s = moe_ep_slot_view(fw->ep, l, &hx, v);
    for (int i = 0; i < 3; i++) free(hb[i]->data);
    if (s != MOE_OK) return s;
    struct moe_tensor *vb[] = {&v->b_gate, &v->b_up, &v->b_down};
    for (int i = 0; i < 3; i++) {
        void *host = vb[i]->data, *dev = NULL;
        if (!host) continue;
        size_t bytes = 0;
        (void)bias_bytes(vb[i], &bytes); /* n_slots rows of a table checked above */
        s = be->ops->alloc(be, bytes, &dev);
        if (s == MOE_OK) s = be->ops->to_device(be, dev, host, bytes);
        free(host);
        vb[i]->data = dev; /* NULL on failure: slot_view_free deallocates the others */
        if (s != MOE_OK) {
            for (int j = i + 1; j < 3; j++) free(vb[j]->data), vb[j]->data = NULL;
            slot_view_free(be, v);
            return s;
        }
    }
    if (x->cols && (s = slot_cols(fw, l, v)) != MOE_OK) slot_view_free(be, v);
    return s;
}

/* Frees a slot view, its biases the backend's when not in host memory. */
static void slot_view_free(struct moe_backend *be, struct moe_expert_weights *v)
{
    if (be && !be->ops->host_memory) {
        struct moe_tensor *vb[] = {&v->b_gate, &v->b_up, &v->b_down};
        for (int i = 0; i < 3; i++) be->ops->dealloc(be, vb[i]->data), vb[i]->data = NULL;
        if (v->cols) be->ops->dealloc(be, (void *)v->cols[0]); /* slot_cols's buffer */
    }
    moe_ep_slot_view_free(v);
}

/* Expert parallelism's state (forward.h), made once: host tables, and for
 * a backend not in host memory their backend twins and the host stage. */
static enum moe_status ep_state(struct moe_forward *fw)
{
    if (fw->ep_views) return MOE_OK;
    struct moe_backend *be = fw->be;
    const struct moe_ep *ep = fw->ep;
    const size_t T = (size_t)fw->lim.max_tokens, TK = T * (size_t)(fw->m->cfg.top_k > 0 ? fw->m->cfg.top_k : 1);
    const size_t S = (size_t)(ep->max_slots > 0 ? ep->max_slots : 1);
    if (!ep->layers || ep->n_layers != fw->m->cfg.n_layers)
        return moe_fail(MOE_ERR_INVALID_ARG, "expert parallelism: the experts are not placed for this model");
    /* a failure leaves ep_views NULL: the next call starts again (what was
     * made before is freed with the workspace) */
    free(fw->ep_slot_ids), free(fw->ep_counts), free(fw->ep_offsets), free(fw->ep_share_offs);
    fw->ep_slot_ids = malloc(TK * sizeof(int32_t));
    fw->ep_counts = malloc(S * sizeof(int32_t));
    fw->ep_offsets = malloc((S + 1) * sizeof(int32_t));
    fw->ep_share_offs = malloc(((size_t)ep->size + 1) * sizeof(size_t));
    if (!fw->ep_slot_ids || !fw->ep_counts || !fw->ep_offsets || !fw->ep_share_offs)
        return moe_fail(MOE_ERR_NOMEM, "expert parallelism: slot tables");
    if (!moe_mul_size(TK, (size_t)fw->m->cfg.d_model, &fw->ep_share_cap))
        return moe_fail(MOE_ERR_NOMEM, "expert parallelism: %zu rows overflow", TK);
    MOE_TRY(coll_decide(fw));
    if (!be->ops->host_memory && !fw->ep_dev_made) {
        const size_t D = (size_t)fw->m->cfg.d_model, wide = whole_row_floats(fw->m);
        size_t rows, whole, bytes;
        if (!moe_mul_size(TK, D, &rows) || !moe_mul_size(T, wide, &whole))
            return moe_fail(MOE_ERR_NOMEM, "expert parallelism: the host stage overflows");
        /* the stage carries the staged collectives alone: none over the
         * backend's transport (which keeps the rows in its memory) */
        const size_t stage = ep->coll_state > 0 ? 0 : rows > whole ? rows : whole;
        if (!moe_mul_size(stage, sizeof(float), &bytes))
            return moe_fail(MOE_ERR_NOMEM, "expert parallelism: the host stage overflows");
        if (stage && !be->ops->host_alloc)
            return moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: no host buffers for expert parallelism", be->ops->name);
        free(fw->ep_h_ids), free(fw->ep_h_pos);
        fw->ep_h_ids = malloc(TK * sizeof(int32_t));
        fw->ep_h_pos = malloc(T * sizeof(int32_t));
        if (!fw->ep_h_ids || !fw->ep_h_pos) return moe_fail(MOE_ERR_NOMEM, "expert parallelism: routing copies");
        void *bufs[] = {fw->ep_d_slot_ids, fw->ep_d_counts, fw->ep_d_offsets, fw->ep_d_rows, fw->ep_d_blocks};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->ops->dealloc(be, bufs[i]);
        fw->ep_d_slot_ids = fw->ep_d_counts = fw->ep_d_offsets = NULL;
        fw->ep_d_rows = fw->ep_d_blocks = NULL;
        MOE_FORWARD_ALLOC(be, fw->ep_d_slot_ids, TK, int32_t);
        MOE_FORWARD_ALLOC(be, fw->ep_d_counts, S, int32_t);
        MOE_FORWARD_ALLOC(be, fw->ep_d_offsets, S + 1, int32_t);
        if (ep->tp > 1) MOE_FORWARD_ALLOC(be, fw->ep_d_rows, whole, float);
        /* a rank's part of a whole row is at most the row over the group
         * size (its heads, or one head held by several ranks) */
        if (ep->tp > 1 && ep->coll_state > 0) MOE_FORWARD_ALLOC(be, fw->ep_d_blocks, whole, float);
        fw->ep_d_rows_floats = whole;
        if (fw->ep_stage) be->ops->host_free(be, fw->ep_stage), fw->ep_stage = NULL;
        if (stage) MOE_TRY(be->ops->host_alloc(be, bytes, (void **)&fw->ep_stage));
        fw->ep_stage_floats = stage;
        fw->ep_dev_made = true;
    }
    struct moe_expert_weights *v = calloc((size_t)fw->m->cfg.n_layers, sizeof *v);
    if (!v) return moe_fail(MOE_ERR_NOMEM, "expert parallelism: slot views");
    enum moe_status s = MOE_OK;
    for (int l = 0; l < fw->m->cfg.n_layers && s == MOE_OK; l++)
        if (ep->layers[l].n_slots) s = slot_view(fw, l, &v[l]);
    if (s != MOE_OK) {
        for (int l = 0; l < fw->m->cfg.n_layers; l++) slot_view_free(be, &v[l]);
        free(v);
        return s;
    }
    fw->ep_views = v;
    return MOE_OK;
}

enum moe_status moe_forward_ep_views(struct moe_forward *fw) { return ep_state(fw); }

/* Each routed pair's slot into fw->ep_slot_ids (host) and, for a backend
 * not in host memory, its copy in backend memory; the ids the dispatch
 * reads. */
static enum moe_status ep_slots(struct moe_forward *fw, int l, int T, int K, const int32_t **slots)
{
    struct moe_backend *be = fw->be;
    const size_t TK = (size_t)T * (size_t)K;
    if (be->ops->host_memory) {
        moe_ep_slot_ids(fw->ep, l, fw->ids, T, K, fw->b_pos, fw->ep_slot_ids);
        *slots = fw->ep_slot_ids;
        return MOE_OK;
    }
    MOE_TRY(be->ops->to_host(be, fw->ep_h_ids, fw->ids, TK * sizeof(int32_t)));
    const int32_t *pos = fw->h_pos; /* the host batch's, else read back */
    if (!pos) MOE_TRY(be->ops->to_host(be, fw->ep_h_pos, fw->b_pos, (size_t)T * sizeof(int32_t)));
    moe_ep_slot_ids(fw->ep, l, fw->ep_h_ids, T, K, pos ? pos : fw->ep_h_pos, fw->ep_slot_ids);
    MOE_TRY(be->ops->to_device(be, fw->ep_d_slot_ids, fw->ep_slot_ids, TK * sizeof(int32_t)));
    *slots = fw->ep_d_slot_ids;
    return MOE_OK;
}

/* Every rank's rows of ye gathered in backend memory by the backend's
 * transport, the slot offsets (fw->ep_offsets) on the host. */
static enum moe_status ep_share(struct moe_forward *fw, int D, int l)
{
    struct moe_ep *ep = fw->ep;
    struct moe_backend *be = fw->be;
    const int32_t all = moe_ep_gather_count(ep, fw->ep_offsets, l);
    size_t *offs = fw->ep_share_offs;
    for (int r = 0; r < ep->size; r++) offs[r] = (size_t)ep->displs[r] * (size_t)D;
    offs[ep->size] = (size_t)all * (size_t)D;
    for (int r = 0; r < ep->size; r++)
        if (offs[r] > offs[r + 1] || offs[r + 1] > fw->ep_share_cap)
            return moe_fail(MOE_ERR_DEVICE, "expert parallelism: layer %d: slot offsets out of order", l);
    char what[48];
    snprintf(what, sizeof what, "layer %d: expert rows", l);
    const double t0 = moe_seconds();
    MOE_TRY(coll_check(fw, be->ops->coll_share(be, MOE_COLL_EP, fw->ews.ye, offs, what)));
    ep->n.gather_s += moe_seconds() - t0;
    ep->n.gather_bytes += (uint64_t)(all - ep->counts[ep->rank]) * (uint64_t)D * sizeof(float);
    return MOE_OK;
}

/* Every rank's rows of ye gathered (ep.h); a backend not in host memory
 * sends its rows from the host stage and takes all of them back. */
static enum moe_status ep_gather(struct moe_forward *fw, const struct moe_dispatch *plan, int n_slots, int D, int l)
{
    struct moe_backend *be = fw->be;
    if (be->ops->host_memory) return moe_ep_gather(fw->ep, fw->ews.ye, plan->offsets, D, l);
    MOE_TRY(be->ops->to_host(be, fw->ep_offsets, plan->offsets, ((size_t)n_slots + 1) * sizeof(int32_t)));
    if (fw->ep->coll_state > 0) return ep_share(fw, D, l);
    const int32_t *o = fw->ep_offsets;
    const size_t r0 = (size_t)o[plan->lo], r1 = (size_t)o[plan->hi], all = (size_t)o[n_slots], row = (size_t)D;
    if (!(r0 <= r1 && r1 <= all && all * row <= fw->ep_stage_floats))
        return moe_fail(MOE_ERR_DEVICE, "expert parallelism: layer %d: slot offsets out of order", l);
    MOE_TRY(be->ops->to_host(be, fw->ep_stage + r0 * row, fw->ews.ye + r0 * row, (r1 - r0) * row * sizeof(float)));
    MOE_TRY(moe_ep_gather(fw->ep, fw->ep_stage, o, D, l));
    return be->ops->to_device(be, fw->ews.ye, fw->ep_stage, all * row * sizeof(float));
}

/* The expert-parallel part of a MoE layer (forward.c's experts phase):
 * the pairs dispatched over the layer's slots, this rank's slots
 * computed, every rank's rows gathered, then the combine (ep.h). */
enum moe_status moe_forward_ep_experts(struct moe_forward *fw, int l, int T, const float *in, const float *wts)
{
    struct moe_backend *be = fw->be;
    const struct moe_config *c = &fw->m->cfg;
    const int D = c->d_model, K = c->top_k;
    MOE_TRY(ep_state(fw));
    const struct moe_ep_layer *pl = &fw->ep->layers[l];
    const int32_t *slots;
    MOE_TRY(ep_slots(fw, l, T, K, &slots));
    struct moe_dispatch plan = fw->plan;
    plan.counts = be->ops->host_memory ? fw->ep_counts : fw->ep_d_counts;
    plan.offsets = be->ops->host_memory ? fw->ep_offsets : fw->ep_d_offsets;
    MOE_TRY(be->ops->dispatch(be, &plan, slots, T, K, pl->n_slots));
    plan.lo = pl->bounds[fw->ep->rank];
    plan.hi = pl->bounds[fw->ep->rank + 1]; /* > 0: every rank has a slot */
    plan.experts = c->n_experts;
    MOE_TRY(be->ops->experts(be, fw->out, in, &plan, wts, &fw->ep_views[l], &fw->ews, T, K, D, c->d_expert,
                             pl->n_slots));
    MOE_TRY(be->ops->sync(be)); /* the rows are complete before they travel */
    MOE_TRY(ep_gather(fw, &plan, pl->n_slots, D, l));
    return be->ops->combine(be, fw->out, &fw->ews, &plan, wts, T, K, D);
}

/* The host buffer and counts of moe_forward_vocab_logits, made once:
 * rank 0 gathers L rows of V (and, not in host memory, sends from a
 * second such region); the others send from the logits themselves in host
 * memory, else from L rows of their share. */
static enum moe_status vocab_state(struct moe_forward *fw)
{
    if (fw->ep_vstage) return MOE_OK;
    const struct moe_ep *ep = fw->ep;
    const bool host = fw->be->ops->host_memory;
    const size_t L = (size_t)fw->lim.max_logits, V = (size_t)fw->m->cfg.vocab;
    const size_t per = ep->rank == 0 ? (host ? 1 : 2) * V : host ? 1 : (size_t)fw->m->lm_head.shape[0];
    size_t n;
    if (!moe_mul_size(L, per, &n) || !moe_mul_size(n, sizeof(float), &n))
        return moe_fail(MOE_ERR_NOMEM, "the LM head's parts: %zu rows of %zu overflow", L, V);
    free(fw->ep_vcounts);
    if (!(fw->ep_vcounts = malloc((size_t)ep->size * sizeof(int32_t))))
        return moe_fail(MOE_ERR_NOMEM, "the LM head's parts");
    if (!(fw->ep_vstage = malloc(n))) return moe_fail(MOE_ERR_NOMEM, "the LM head's parts: %zu bytes", n);
    return MOE_OK;
}

/* The logits' parts over the backend's transport (coll_state 1): each
 * rank's (n, Vs) block sent to rank 0 (coll_gather), into ep_d_vparts at
 * n * lo (the blocks in rank order; rank 0's buffer alone), and rank 0
 * lays them out as (n, V) in fw->logits: no copy through the host. */
static enum moe_status vocab_share(struct moe_forward *fw, int n)
{
    struct moe_backend *be = fw->be;
    struct moe_ep *ep = fw->ep;
    const int V = fw->m->cfg.vocab, N = ep->size;
    if (!be->ops->gather_cols || !be->ops->coll_gather)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s backend: no column copies or gathers", be->ops->name);
    if (ep->rank == 0 && !fw->ep_d_vparts)
        MOE_FORWARD_ALLOC(be, fw->ep_d_vparts, (size_t)fw->lim.max_logits * (size_t)V, float);
    size_t *offs = fw->ep_share_offs;
    int lo, vs;
    for (int r = 0; r < N; r++) {
        moe_vocab_share(V, r, N, &lo, &vs);
        offs[r] = (size_t)n * (size_t)lo;
    }
    offs[N] = (size_t)n * (size_t)V;
    MOE_TRY(coll_check(fw, be->ops->coll_gather(be, MOE_COLL_EP, fw->logits, fw->ep_d_vparts, offs,
                                                "the LM head's logits")));
    for (int r = 0; ep->rank == 0 && r < N; r++) {
        moe_vocab_share(V, r, N, &lo, &vs);
        MOE_TRY(be->ops->gather_cols(be, fw->logits + lo, V, fw->ep_d_vparts + offs[r], vs, n, NULL, vs));
    }
    return MOE_OK;
}

enum moe_status moe_forward_vocab_logits(struct moe_forward *fw, int n)
{
    const struct moe_model *m = fw->m;
    struct moe_backend *be = fw->be;
    struct moe_ep *ep = fw->ep;
    const int V = m->cfg.vocab, N = ep->size, Vs = (int)m->lm_head.shape[0];
    if (m->vocab_parts != N)
        return moe_fail(MOE_ERR_INVALID_ARG, "the LM head is split %d ways over %d ranks", m->vocab_parts, N);
    MOE_TRY(moe_forward_linear(fw, fw->logits, fw->lrows, &m->lm_head, NULL, n));
    if (!be->ops->host_memory) {
        MOE_TRY(ep_state(fw));
        if (ep->coll_state > 0) return vocab_share(fw, n);
    }
    MOE_TRY(vocab_state(fw));
    const size_t L = (size_t)fw->lim.max_logits;
    float *recv = fw->ep_vstage, *send = ep->rank == 0 ? recv + L * (size_t)V : recv;
    /* rows at a time such that one gather's floats fit an int */
    const int step = (int)(INT32_MAX / V) < n ? (int)(INT32_MAX / V) : n;
    if (step < 1) return moe_fail(MOE_ERR_INVALID_ARG, "the LM head's parts: a vocabulary of %d", V);
    if (!be->ops->host_memory) MOE_TRY(be->ops->to_host(be, send, fw->logits, (size_t)n * Vs * sizeof(float)));
    else send = fw->logits;
    for (int i0 = 0; i0 < n; i0 += step) {
        const int k = n - i0 < step ? n - i0 : step;
        for (int r = 0; r < N; r++) {
            int lo, vs;
            moe_vocab_share(V, r, N, &lo, &vs);
            fw->ep_vcounts[r] = k * vs;
        }
        float *to = ep->rank == 0 ? recv + (size_t)i0 * V : NULL; /* read on rank 0 only */
        MOE_TRY(moe_comm_gatherv(ep->comm, send + (size_t)i0 * Vs, k * Vs, to, fw->ep_vcounts, 0,
                                 "the LM head's logits"));
    }
    if (ep->rank != 0) return MOE_OK;
    /* rank by rank, each a block of n rows of its share, made (n, V): in
     * place on the host, through the second region otherwise */
    float *out = be->ops->host_memory ? fw->logits : send;
    for (int i0 = 0; i0 < n; i0 += step) {
        const int k = n - i0 < step ? n - i0 : step;
        const float *src = recv + (size_t)i0 * V;
        for (int r = 0; r < N; r++) {
            int lo, vs;
            moe_vocab_share(V, r, N, &lo, &vs);
            for (int i = 0; i < k; i++) memcpy(out + (size_t)(i0 + i) * V + lo, src + (size_t)i * vs, (size_t)vs * sizeof(float));
            src += (size_t)k * vs;
        }
    }
    if (!be->ops->host_memory) MOE_TRY(be->ops->to_device(be, fw->logits, out, (size_t)n * V * sizeof(float)));
    return MOE_OK;
}

enum moe_status moe_forward_vocab_embed(struct moe_forward *fw, float *x, int T)
{
    struct moe_ep *ep = fw->ep;
    struct moe_backend *be = fw->be;
    if (!moe_ep_on(ep) || fw->m->vocab_parts != ep->size)
        return moe_fail(MOE_ERR_INVALID_ARG, "the embedding holds a share of the vocabulary (%d of %d parts) "
                        "over another layout of ranks", fw->m->vocab_lo, fw->m->vocab_parts);
    const size_t n = (size_t)T * fw->m->cfg.d_model;
    if (be->ops->host_memory) {
        MOE_TRY(moe_comm_allreduce_sum(ep->comm, x, n, "the embedding"));
    } else {
        MOE_TRY(ep_state(fw));
        if (ep->coll_state > 0) {
            MOE_TRY(coll_check(fw, be->ops->coll_sum(be, MOE_COLL_EP, x, n, "the embedding")));
        } else {
            MOE_TRY(be->ops->to_host(be, fw->ep_stage, x, n * sizeof(float)));
            MOE_TRY(moe_comm_allreduce_sum(ep->comm, fw->ep_stage, n, "the embedding"));
            MOE_TRY(be->ops->to_device(be, x, fw->ep_stage, n * sizeof(float)));
        }
    }
    return MOE_OK;
}

void moe_forward_ep_free(struct moe_forward *fw)
{
    free(fw->ep_vstage);
    free(fw->ep_vcounts);
    struct moe_backend *be = fw->be;
    if (be) {
        void *bufs[] = {fw->ep_d_slot_ids, fw->ep_d_counts, fw->ep_d_offsets, fw->ep_d_rows, fw->ep_d_blocks,
                        fw->ep_d_vparts};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->ops->dealloc(be, bufs[i]);
        if (fw->ep_stage) be->ops->host_free(be, fw->ep_stage);
    }
    free(fw->ep_slot_ids);
    free(fw->ep_counts);
    free(fw->ep_offsets);
    free(fw->ep_share_offs);
    free(fw->ep_h_ids);
    free(fw->ep_h_pos);
    for (int l = 0; fw->ep_views && l < fw->m->cfg.n_layers; l++) slot_view_free(fw->be, &fw->ep_views[l]);
    free(fw->ep_views);
}
