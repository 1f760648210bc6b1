/* ep_check.c - expert parallelism against one process, run under mpirun
 * (CMake registers it as test_ep_world2 and test_ep_world4 when MPI is
 * built).  A plain program, not a Criterion suite: Criterion runs each test
 * in a forked child, which an MPI process cannot be.
 *
 *     mpirun -n N ep_check BACKEND [--rows R] [--collectives C] FIXTURE...
 *
 * BACKEND cpu, cpu-ref or cuda (under tools/cuda-emu without a GPU: its
 * ci.sh runs it with --rows 40, so the first prefill takes the CUDA
 * backend's grouped expert path).  --collectives auto, nccl or mpi: where
 * the CUDA backend's collectives run (ep.h, enum moe_ep_coll); nccl and
 * mpi fail the check unless the run used them.
 *
 * For each fixture (under tests/fixtures), rank 0 first runs it alone: a
 * 7-token (--rows R: R-token) prefill of sequence A with every row's logits
 * (more than 16 rows: the last one's), then A's greedy
 * decode beside a 5-token prefill of sequence B, then three steps decoding
 * both, recording logits, greedy ids and the routing trace.  Then every
 * rank loads its share of the experts and of the LM head's vocabulary rows
 * (moe_model_vocab_split; rank 0's logits are the ranks' shares gathered)
 * and rank 0 runs the same steps with the others following.  Logits must
 * be bit-identical, ids and routing equal.  Then again with a placement (moe_ep_placement_write from a
 * skewed made-up load, two replicas per MoE layer, so some experts are on
 * two ranks and their rows split between them), which must give the same
 * bits too.  A fixture whose experts do not split over N ranks must be
 * refused at contiguous placement with a message naming the count, and
 * run with the placement.  Exit 0 when all hold; every failure prints one
 * line.
 *
 *     mpirun -n N ep_check BACKEND --dp-attention FIXTURE...
 *
 * The same runs with data-parallel attention (moe_ep_set_dp): A's
 * attention on rank 0, B's on rank 1 (the rank whose sequences hold the
 * fewest blocks when B starts), each rank's rows all-gathered after every
 * attention block; B's chunk comes first in the steps both run, so the
 * rows are not in rank order (and A's prefill leaves the other ranks
 * without rows).  Logits must still be bit-identical, and rank 0 must have
 * computed A's attention rows only.  The rows stay on their ranks through
 * the layers, the experts' pairs travelling all-to-all
 * (forward_dp_local.c); with --dp-gather after it (and on a backend not
 * in host memory) the rows are all-gathered after each attention block
 * instead.
 *
 *     mpirun -n N ep_check BACKEND --tp M FIXTURE...
 *
 * Tensor parallelism instead: groups of M ranks split the heads, dense
 * FFNs and shared experts (moe_model_tp_split), the experts spread over
 * every rank and then over the N / M groups.  The group adds its parts in
 * another order than one process sums a row, so logits must be within a
 * tolerance of one process's (TP_TOL of the row's largest magnitude), ids
 * and routing equal.
 *
 * On the CPU backends, for a fixture with a multi-token-prediction module:
 * the module each rank makes from its share of the model (under --tp from
 * its share of the heads) must give one process's logits bit for bit
 * (check_mtp).
 *
 *     mpirun -n N ep_check BACKEND --plan FIXTURE...
 *
 * Every run (one process's too) with a precision per expert
 * (--expert-dtype-plan): in each MoE layer l, expert e stored, at q8_0 or
 * at q4 by (e + l) mod 3, so every rank holds experts of several formats;
 * logits bit-identical as above.
 *
 * Without --tp, first: rank 0 opens the first fixture and the others a
 * copy of it with another config.json, which rank 0's runner must refuse
 * naming the rank. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/engine/ep.h"
#include "runtime/engine/runner.h"
#include "runtime/model/model.h"

#define STEPS 5
#define MAX_ROWS 16

static int failures;
static int tp = 1;       /* --tp M */
static bool dp;          /* --dp-attention: each sequence's attention on one rank */
static bool dp_gather;   /* --dp-gather: ... its rows gathered after each attention layer */
static const char *coll_name = "auto"; /* --collectives C */

/* --collectives as the layout's choice (ep.h). */
static enum moe_ep_coll coll_mode(void)
{
    return !strcmp(coll_name, "nccl") ? MOE_EP_COLL_DEVICE : !strcmp(coll_name, "mpi") ? MOE_EP_COLL_HOST
                                                                                       : MOE_EP_COLL_AUTO;
}

/* How the run's collectives travelled (rank 0's layout after the run). */
static const char *coll_used(const struct moe_ep *ep)
{
    return ep->coll_state > 0 ? "collectives on the backend (NCCL)" : "collectives on host memory (MPI)";
}
#define TP_TOL 2e-5f

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "ep_check: FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            failures++;                                                    \
        }                                                                  \
    } while (0)

static const char *backend_name;

/* --plan: the fixture's plan (plan_l x plan_e: by (e + l) mod 3 stored,
 * q8_0, q4) while it runs, else NULL */
static bool plan_on;
static uint8_t *plan;
static int plan_l, plan_e;

static enum moe_status backend_open(struct moe_backend *be)
{
    if (plan) {
        struct moe_backend_opts o;
        moe_backend_opts_defaults(&o);
        o.n_threads = 1;
        o.expert_quant = plan;
        o.expert_quant_layers = plan_l;
        o.expert_quant_e = plan_e;
        return moe_backend_init(be, backend_name, &o);
    }
    if (!strcmp(backend_name, "cuda")) return moe_backend_cuda_init(be, 0);
    return !strcmp(backend_name, "cpu-ref") ? moe_backend_cpu_init(be, 1) : moe_backend_cpu_fast_init(be, 1);
}

/* --rows N: the first prefill's length (more than MOE_SMALL_STEP_ROWS:
 * the CUDA backend's grouped expert path); its logits then for the last
 * row only */
static int first_rows = 7;

/* One run's results: per step, its logits rows, their argmax and the
 * routing of its rows. */
struct record {
    int n_rows[STEPS], n_logits[STEPS];
    float *logits[STEPS];
    int32_t ids[STEPS][MAX_ROWS];
    int32_t *route[STEPS];
};

static void record_free(struct record *r)
{
    for (int s = 0; s < STEPS; s++) free(r->logits[s]), free(r->route[s]);
}

/* The five steps on runner rn (see the header); V vocabulary, L*K route. */
static enum moe_status run_steps(struct moe_runner *rn, struct record *out)
{
    const struct moe_config *c = &rn->m->cfg;
    const int V = c->vocab, LK = c->n_layers * (c->top_k > 0 ? c->top_k : 1);
    struct moe_seq a = {0}, b = {0};
    int32_t pa[64] = {1, 5, 9, 2, 7, 3, 11}, pb[5] = {4, 8, 6, 10, 12}, next_a = 0, next_b = 0;
    for (int i = 7; i < first_rows; i++) pa[i] = 1 + (i * 7) % 12;
    enum moe_status st = MOE_OK;
    for (int s = 0; s < STEPS && st == MOE_OK; s++) {
        struct moe_chunk ch[2];
        int n = 0;
        if (s == 0) ch[n++] = (struct moe_chunk){&a, pa, first_rows, first_rows <= MAX_ROWS, false, 1};
        else ch[n++] = (struct moe_chunk){&a, &next_a, 1, false, true, 1};
        if (s == 1) ch[n++] = (struct moe_chunk){&b, pb, 5, false, false, 2};
        else if (s > 1) ch[n++] = (struct moe_chunk){&b, &next_b, 1, false, true, 2};
        /* data-parallel attention: B (rank 1) before A (rank 0), so the rows
         * are not in rank order and travel through the gathers */
        const bool b_first = dp && n == 2;
        if (b_first) {
            const struct moe_chunk t = ch[0];
            ch[0] = ch[1], ch[1] = t;
        }
        int rows = 0;
        for (int i = 0; i < n; i++) rows += ch[i].n;
        out->n_rows[s] = rows;
        out->logits[s] = malloc((size_t)MAX_ROWS * V * sizeof(float));
        out->route[s] = malloc((size_t)rows * LK * sizeof(int32_t));
        struct moe_route_trace tr = {out->route[s], NULL};
        if (!out->logits[s] || !out->route[s]) return moe_fail(MOE_ERR_NOMEM, "records");
        st = moe_runner_step(rn, ch, n, out->logits[s], NULL, &out->n_logits[s], &tr);
        for (int i = 0; st == MOE_OK && i < out->n_logits[s]; i++)
            out->ids[s][i] = moe_argmax(out->logits[s] + (size_t)i * V, V);
        if (st == MOE_OK) {
            const int last = out->n_logits[s] - 1;
            next_a = s == 0 || b_first ? out->ids[s][last] : out->ids[s][0];
            if (s >= 1) next_b = out->ids[s][b_first ? 0 : last];
        }
    }
    /* a prefix-cache hit on A's first block: C's blocks on A's rank (not for
     * a hybrid model, which the prefix cache does not serve) */
    if (st == MOE_OK && rn->dp && rn->kv.n_state_slots == 0) {
        struct moe_seq c = {0};
        moe_kvcache_ref_block(&rn->kv, a.blocks[0]);
        st = moe_seq_push_block(rn, &c, a.blocks[0]);
        if (st == MOE_OK) st = moe_runner_reserve(rn, &c, 2 * rn->o.block_size);
        CHECK(st != MOE_OK || (c.n_blocks == 2 && moe_kvcache_part_of(&rn->kv, c.blocks[1]) == 0),
              "data-parallel attention: a sequence starting on rank 0's cached block was given rank %d",
              moe_kvcache_part_of(&rn->kv, c.blocks[c.n_blocks - 1]));
        moe_seq_free(rn, &c);
    }
    moe_seq_free(rn, &a);
    moe_seq_free(rn, &b);
    return st;
}

static struct moe_runner_opts runner_opts = {.max_tokens = 32, .max_seqs = 4, .max_logits = MAX_ROWS,
                                             .block_size = 4, .n_blocks = 64};

/* Rank 0 alone: the reference record. */
static enum moe_status reference(const char *dir, struct record *ref)
{
    struct moe_model m;
    struct moe_backend be = {0};
    struct moe_runner rn;
    MOE_TRY(moe_model_load(&m, dir));
    enum moe_status s = backend_open(&be);
    if (s == MOE_OK && (s = moe_runner_init(&rn, &m, &be, &runner_opts)) == MOE_OK) {
        s = run_steps(&rn, ref);
        moe_runner_free(&rn);
    }
    moe_backend_free(&be);
    moe_model_free(&m);
    return s;
}

/* Places the experts of the model at dir (placement: JSON text, or NULL:
 * contiguous) and loads this rank's share. */
static enum moe_status open_share(struct moe_ep *ep, const char *dir, const char *placement, struct moe_model *m)
{
    char path[600];
    struct moe_config cfg;
    uint8_t *held;
    snprintf(path, sizeof path, "%s/config.json", dir);
    MOE_TRY(moe_config_load(&cfg, path));
    MOE_TRY(moe_ep_place(ep, cfg.n_layers, cfg.layer_moe, cfg.n_experts, placement));
    MOE_TRY(moe_ep_held(ep, &held));
    enum moe_status s = moe_model_load_part(m, dir, held);
    free(held);
    if (s == MOE_OK && ep->tp > 1 && (s = moe_model_tp_split(m, ep->tp_rank, ep->tp)) != MOE_OK) moe_model_free(m);
    else if (s == MOE_OK && (s = moe_model_vocab_split(m, ep->rank, ep->size)) != MOE_OK) moe_model_free(m);
    return s;
}

/* A placement over `size` ranks with two replicas per MoE layer, from a
 * made-up load skewed towards low expert ids (malloc'd JSON). */
static char *replica_placement(const struct moe_config *cfg, int size)
{
    const int E = cfg->n_experts;
    int32_t layer[MOE_MAX_LAYERS];
    int n = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        if (cfg->layer_moe[l]) layer[n++] = l;
    double *load = malloc((size_t)n * E * sizeof(double));
    char *text = NULL;
    double ratio;
    if (!load) return NULL;
    for (int j = 0; j < n; j++)
        for (int e = 0; e < E; e++) load[(size_t)j * E + e] = 1000.0 / (1 + (e + 3 * j) % E);
    if (moe_ep_placement_write(size, n, layer, E, load, 2, "ep_check", &text, &ratio) != MOE_OK) text = NULL;
    free(load);
    return text;
}

struct follower {
    struct moe_ep *ep;
    struct moe_model m;
    struct moe_backend be;
    bool open;
};

static enum moe_status follower_open(void *ctx, const void *blob, size_t bytes, const struct moe_model **m,
                                     struct moe_backend **be)
{
    struct follower *f = ctx;
    if (bytes == 0 || ((const char *)blob)[bytes - 1]) return moe_fail(MOE_ERR_FORMAT, "bad blob");
    /* "DIR\nPLACEMENT" */
    char *dir = strdup(blob), *nl = dir ? strchr(dir, '\n') : NULL;
    if (!nl) {
        free(dir);
        return moe_fail(MOE_ERR_FORMAT, "bad blob");
    }
    *nl = 0;
    enum moe_status s = open_share(f->ep, dir, nl[1] ? nl + 1 : NULL, &f->m);
    free(dir);
    MOE_TRY(s);
    f->open = true;
    MOE_TRY(backend_open(&f->be));
    *m = &f->m;
    *be = &f->be;
    return MOE_OK;
}

static void follower_close(void *ctx)
{
    struct follower *f = ctx;
    moe_backend_free(&f->be);
    if (f->open) moe_model_free(&f->m);
}

/* The worst |got - ref| of a step's logits over its row's largest |ref|. */
static double worst_rel(const struct record *ref, const struct record *got, int s, int V)
{
    double worst = 0;
    for (int i = 0; i < ref->n_logits[s]; i++) {
        const float *a = ref->logits[s] + (size_t)i * V, *b = got->logits[s] + (size_t)i * V;
        double big = 0, d = 0;
        for (int v = 0; v < V; v++) {
            big = fabs(a[v]) > big ? fabs(a[v]) : big;
            d = fabs((double)a[v] - b[v]) > d || b[v] != b[v] ? fabs((double)a[v] - b[v]) : d;
        }
        if (d != d) return INFINITY;
        worst = d / (big > 0 ? big : 1) > worst ? d / (big > 0 ? big : 1) : worst;
    }
    return worst;
}

static double worst_seen; /* the largest worst_rel of a --tp run */

static void compare(const char *name, const struct record *ref, const struct record *got, int V, int LK)
{
    for (int s = 0; s < STEPS; s++) {
        CHECK(ref->n_logits[s] == got->n_logits[s], "%s step %d: %d logit rows, alone %d", name, s,
              got->n_logits[s], ref->n_logits[s]);
        if (ref->n_logits[s] != got->n_logits[s]) continue;
        if (tp > 1) {
            const double w = worst_rel(ref, got, s, V);
            worst_seen = w > worst_seen ? w : worst_seen;
            CHECK(w <= TP_TOL, "%s step %d: logits %.3g (of the row's largest) from one process's, more than %g",
                  name, s, w, (double)TP_TOL);
        } else {
            size_t diff = 0;
            for (size_t i = 0; i < (size_t)ref->n_logits[s] * V; i++)
                diff += memcmp(&ref->logits[s][i], &got->logits[s][i], sizeof(float)) != 0;
            CHECK(diff == 0, "%s step %d: %zu of %zu logits differ from one process's", name, s, diff,
                  (size_t)ref->n_logits[s] * V);
        }
        CHECK(!memcmp(ref->ids[s], got->ids[s], (size_t)ref->n_logits[s] * sizeof(int32_t)),
              "%s step %d: greedy ids differ", name, s);
        CHECK(!memcmp(ref->route[s], got->route[s], (size_t)ref->n_rows[s] * LK * sizeof(int32_t)),
              "%s step %d: routing differs", name, s);
    }
}

/* Rank 0's share prepared under --plan: each expert it holds in its plan's
 * format (q8_0: Q8_0; q4: a four-bit dtype; stored: as it was), at least
 * one of each. */
static void check_planned(const char *name, const struct moe_model *m)
{
    int seen[3] = {0};
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; e < m->cfg.n_experts && m->cfg.layer_moe[l]; e++) {
            if (!moe_model_holds(m, l, e)) continue;
            const int q = (e + l) % 3;
            const enum moe_dtype dt = moe_expert_dtype(&m->layers[l].experts, e);
            const bool ok = q == 1 ? dt == MOE_DTYPE_Q8_0 : q == 2 ? moe_dtype_is_q4(dt)
                                                                     : dt != MOE_DTYPE_Q8_0 && !moe_dtype_is_q4(dt);
            CHECK(ok, "%s: layer %d expert %d is %s, not what the plan says", name, l, e, moe_dtype_name(dt));
            seen[q]++;
        }
    CHECK(seen[0] && seen[1] && seen[2], "%s: rank 0 holds %d stored, %d q8_0 and %d q4 experts", name, seen[0],
          seen[1], seen[2]);
}

/* One fixture on every rank, placed contiguously or with replicas; under
 * --tp with the experts in `shards` shards. */
static void check_fixture(struct moe_comm *c, const char *name, bool replicas, int shards)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", MOERUN_SOURCE_DIR, name);
    struct moe_ep ep;
    moe_ep_init(&ep, c);
    ep.coll = coll_mode();
    const int rank = moe_comm_rank(c), size = moe_comm_size(c);
    if (moe_ep_set_tp(&ep, shards, tp) != MOE_OK || moe_ep_set_dp(&ep, dp) != MOE_OK) {
        CHECK(0, "%s: %s", name, moe_last_error());
        moe_ep_free(&ep);
        return;
    }
    if (dp_gather) ep.dp_local = false;
    char cpath[600];
    struct moe_config cfg;
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    if (moe_config_load(&cfg, cpath) != MOE_OK) {
        CHECK(0, "%s: %s", name, moe_last_error());
        return;
    }
    if (plan_on) {
        static const uint8_t turn[3] = {MOE_QUANT_NONE, MOE_QUANT_Q8_0, MOE_QUANT_Q4};
        plan_l = cfg.n_layers, plan_e = cfg.n_experts;
        if (!(plan = malloc((size_t)plan_l * plan_e))) {
            CHECK(0, "%s: no memory for a plan", name);
            return;
        }
        for (int l = 0; l < plan_l; l++)
            for (int e = 0; e < plan_e; e++)
                plan[l * plan_e + e] = cfg.layer_moe[l] ? turn[(e + l) % 3] : MOE_EXPERT_QUANT_DEFAULT;
    }
    char *placement = replicas ? replica_placement(&cfg, size) : NULL;
    if (replicas && !placement) {
        CHECK(0, "%s: no placement: %s", name, moe_last_error());
        free(plan), plan = NULL;
        return;
    }
    if (!replicas && cfg.n_experts % shards) { /* refused, naming the count */
        enum moe_status s = moe_ep_place(&ep, cfg.n_layers, cfg.layer_moe, cfg.n_experts, NULL);
        CHECK(s != MOE_OK && strstr(moe_last_error(), "do not split evenly"), "%s: %d experts over %d shards "
              "not refused (%s)", name, cfg.n_experts, shards, moe_last_error());
        if (rank == 0) printf("ep_check: %s: %d experts over %d shards refused as it should be\n", name,
                              cfg.n_experts, shards);
        moe_ep_free(&ep);
        free(plan), plan = NULL;
        return;
    }
    if (rank != 0) {
        struct follower f = {.ep = &ep};
        const struct moe_ep_follower hooks = {follower_open, follower_close, &f};
        enum moe_status s = moe_ep_follow(&ep, &hooks);
        CHECK(s == MOE_OK, "%s: rank %d: %s", name, rank, moe_last_error());
        moe_ep_free(&ep);
        free(placement);
        free(plan), plan = NULL;
        return;
    }
    struct record ref = {0}, got = {0};
    struct moe_model m;
    struct moe_backend be = {0};
    struct moe_runner rn;
    long long head_rows = 0;
    enum moe_status s = reference(dir, &ref);
    CHECK(s == MOE_OK, "%s alone: %s", name, moe_last_error());
    char blob[65536];
    snprintf(blob, sizeof blob, "%s\n%s", dir, placement ? placement : "");
    ep.hello = blob;
    ep.hello_bytes = strlen(blob) + 1;
    struct moe_runner_opts o = runner_opts;
    o.ep = &ep;
    if (s == MOE_OK && (s = open_share(&ep, dir, placement, &m)) == MOE_OK) {
        int lo, vs; /* rank 0's share of the LM head: the logits it checks are gathered */
        moe_vocab_share(cfg.vocab, rank, size, &lo, &vs);
        head_rows = m.lm_head.shape[0];
        CHECK(m.vocab_parts == size && m.vocab_lo == lo && m.lm_head.shape[0] == vs,
              "%s: the LM head holds %lld rows from %d (%d parts), not %d from %d", name,
              (long long)m.lm_head.shape[0], m.vocab_lo, m.vocab_parts, vs, lo);
        if ((s = backend_open(&be)) == MOE_OK && (s = moe_runner_init(&rn, &m, &be, &o)) == MOE_OK) {
            if (plan) check_planned(name, &m);
            s = run_steps(&rn, &got);
            moe_runner_free(&rn);
        }
        moe_backend_free(&be);
        moe_model_free(&m);
    }
    const bool lin_uneven = moe_config_linear_layers(&cfg) > 0 && cfg.lin_k_heads % tp != 0;
    if (s != MOE_OK && tp > 1 && (strstr(moe_last_error(), "do not fall on its blocks") ||
                                  (lin_uneven && strstr(moe_last_error(), "do not split evenly")))) {
        /* a rank's share of the fixture's quantized o_proj is not whole
         * blocks, or its linear attention's q/k heads are fewer than M */
        printf("ep_check: %s: --tp %d refused as it should be: %s\n", name, tp, moe_last_error());
        free(placement);
        CHECK(moe_ep_stop(&ep) == MOE_OK, "%s: stop: %s", name, moe_last_error());
        record_free(&ref);
        moe_ep_free(&ep);
        free(plan), plan = NULL;
        return;
    }
    CHECK(s == MOE_OK, "%s over %d ranks: %s", name, size, moe_last_error());
    if (s == MOE_OK) {
        const int before = failures;
        worst_seen = 0;
        compare(name, &ref, &got, cfg.vocab, cfg.n_layers * cfg.top_k);
        CHECK(ep.coll != MOE_EP_COLL_DEVICE || ep.coll_state > 0, "%s: --collectives nccl, but %s", name,
              coll_used(&ep));
        CHECK(ep.coll != MOE_EP_COLL_HOST || ep.coll_state <= 0, "%s: --collectives mpi, but %s", name,
              coll_used(&ep));
        if (failures == before && tp > 1)
            printf("ep_check: %s (%s, --tp %d, experts in %d shards, %s): %d ranks, %d steps: logits within "
                   "%.2g of one process's (of the row's largest), ids and routing equal; rank 0 computed %llu of "
                   "%llu expert rows\n", name, backend_name, tp, shards, coll_used(&ep), size, STEPS, worst_seen,
                   (unsigned long long)ep.n.rows_own, (unsigned long long)ep.n.rows_all);
        /* A's rows (7 + 4 decodes) on rank 0, B's (5 + 3 decodes) on rank 1 */
        const unsigned long long dp_a = (unsigned long long)(first_rows + STEPS - 1);
        CHECK(!dp || (ep.dp_rows == dp_a && ep.dp_rows_all == dp_a + 8),
              "%s: data-parallel attention: rank 0 computed %llu of %llu attention rows, not sequence A's %llu",
              name, (unsigned long long)ep.dp_rows, (unsigned long long)ep.dp_rows_all, dp_a);
        char att[96] = "";
        if (dp)
            snprintf(att, sizeof att, ", %llu of %llu attention rows (data-parallel)",
                     (unsigned long long)ep.dp_rows, (unsigned long long)ep.dp_rows_all);
        if (failures == before)
            printf("ep_check: %s (%s, %s%s, %s): %d ranks, %d steps: logits bit-identical, ids and routing equal; "
                   "rank 0 computed %llu of %llu expert rows%s, %lld of %d vocabulary rows\n", name, backend_name,
                   replicas ? "placement with 2 replicas a layer" : "contiguous",
                   plan ? ", experts stored, q8_0 and q4 by a plan" : "", coll_used(&ep), size, STEPS,
                   (unsigned long long)ep.n.rows_own, (unsigned long long)ep.n.rows_all, att, head_rows, cfg.vocab);
    }
    free(placement);
    CHECK(moe_ep_stop(&ep) == MOE_OK, "%s: stop: %s", name, moe_last_error());
    record_free(&ref);
    record_free(&got);
    moe_ep_free(&ep);
    free(plan), plan = NULL;
}

/* The multi-token-prediction module of m (--spec mtp) run alone, its
 * input hidden states a fixed pattern: the record of run_steps. */
static enum moe_status mtp_record(const struct moe_model *m, struct record *out)
{
    struct moe_model v;
    struct moe_backend be = {0};
    struct moe_runner rn;
    MOE_TRY(moe_model_mtp_view(m, 0, &v));
    enum moe_status s = backend_open(&be);
    if (s == MOE_OK && (s = moe_runner_init(&rn, &v, &be, &runner_opts)) == MOE_OK) {
        const size_t n = (size_t)runner_opts.max_tokens * (size_t)v.cfg.d_model;
        for (size_t i = 0; i < n; i++) rn.fw.hin[i] = sinf(0.37f * (float)i);
        s = run_steps(&rn, out);
        moe_runner_free(&rn);
    }
    moe_backend_free(&be);
    moe_model_free(&v);
    return s;
}

/* --spec mtp under expert parallelism: the module runs whole in the
 * process that made it from its share of the model (all the module's
 * experts and heads, the LM head's whole vocabulary), so every rank's
 * module gives one process's logits bit for bit, under --tp too.  No
 * collectives: each rank checks its own share's module. */
static void check_mtp(struct moe_comm *c, const char *name)
{
    char dir[512], cpath[600];
    struct moe_config cfg;
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", MOERUN_SOURCE_DIR, name);
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    if (moe_config_load(&cfg, cpath) != MOE_OK || cfg.n_mtp_layers == 0) return;
    struct moe_ep ep;
    moe_ep_init(&ep, c);
    if (moe_ep_set_tp(&ep, moe_comm_size(c), tp) != MOE_OK) {
        CHECK(0, "%s: mtp: %s", name, moe_last_error());
        moe_ep_free(&ep);
        return;
    }
    struct moe_model whole, share;
    struct record ref = {0}, got = {0};
    const int before = failures;
    CHECK(moe_model_load(&whole, dir) == MOE_OK, "%s: mtp: %s", name, moe_last_error());
    struct moe_model probe; /* many checkpoints declare a module and leave its weights out */
    if (failures == before && moe_model_mtp_view(&whole, 0, &probe) != MOE_OK) {
        moe_model_free(&whole);
        moe_ep_free(&ep);
        return;
    }
    if (failures == before) {
        moe_model_free(&probe);
        CHECK(mtp_record(&whole, &ref) == MOE_OK, "%s: mtp alone: %s", name, moe_last_error());
        CHECK(open_share(&ep, dir, NULL, &share) == MOE_OK, "%s: mtp share: %s", name, moe_last_error());
        if (failures == before) {
            /* the fixtures' modules have heads of their own: the target's
             * whole head (a module without one reads it) checked here */
            const struct moe_tensor h = moe_model_whole_vocab(&share, &share.lm_head);
            const size_t bytes = moe_dtype_row_bytes(h.dtype, (size_t)h.shape[1]) * (size_t)cfg.vocab;
            CHECK(share.vocab_parts == moe_comm_size(c), "%s: the share's LM head is not split", name);
            CHECK(share.tp == (tp > 1 ? tp : 0), "%s: the share's heads are not split (--tp %d)", name, tp);
            CHECK(h.shape[0] == cfg.vocab && h.dtype == whole.lm_head.dtype &&
                  !memcmp(h.data, whole.lm_head.data, bytes), "%s: the share's whole LM head is not the model's",
                  name);
            CHECK(mtp_record(&share, &got) == MOE_OK, "%s: mtp from the share: %s", name, moe_last_error());
            moe_model_free(&share);
        }
        moe_model_free(&whole);
    }
    if (failures == before) compare(name, &ref, &got, cfg.vocab, cfg.top_k > 0 ? cfg.top_k : 1);
    if (failures == before && moe_comm_rank(c) == 0)
        printf("ep_check: %s: the multi-token-prediction module made from each rank's share%s gives one "
               "process's logits bit for bit\n", name, tp > 1 ? " (heads split by --tp)" : "");
    record_free(&ref);
    record_free(&got);
    moe_ep_free(&ep);
}

/* Rank 0 opens tests/fixtures/NAME, the others a copy whose config.json
 * has one more space: rank 0's runner must fail naming the rank and the
 * other checkpoint. */
static void check_other_checkpoint(struct moe_comm *c, const char *name)
{
    char dir[512], alt[600], cmd[4096];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", MOERUN_SOURCE_DIR, name);
    snprintf(alt, sizeof alt, "%s/ep_check_alt_%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name);
    const int rank = moe_comm_rank(c);
    if (rank == 0) { /* the copy: the same files, config.json with a trailing space */
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp '%s'/* '%s'/ && printf ' ' >> '%s/config.json'",
                 alt, alt, dir, alt, alt);
        CHECK(system(cmd) == 0, "%s: could not make %s", name, alt);
    }
    CHECK(moe_comm_barrier(c, "the copy") == MOE_OK, "%s", moe_last_error());
    struct moe_ep ep;
    moe_ep_init(&ep, c);
    if (rank != 0) {
        struct follower f = {.ep = &ep};
        const struct moe_ep_follower hooks = {follower_open, follower_close, &f};
        CHECK(moe_ep_follow(&ep, &hooks) == MOE_OK, "%s: rank %d: %s", name, rank, moe_last_error());
        moe_ep_free(&ep);
        return;
    }
    char blob[1024];
    snprintf(blob, sizeof blob, "%s\n", alt);
    ep.hello = blob;
    ep.hello_bytes = strlen(blob) + 1;
    struct moe_model m;
    struct moe_backend be = {0};
    struct moe_runner rn;
    struct moe_runner_opts o = runner_opts;
    o.ep = &ep;
    enum moe_status s = open_share(&ep, dir, NULL, &m);
    CHECK(s == MOE_OK, "%s: %s", name, moe_last_error());
    if (s == MOE_OK) {
        if ((s = backend_open(&be)) == MOE_OK) {
            s = moe_runner_init(&rn, &m, &be, &o);
            CHECK(s != MOE_OK && strstr(moe_last_error(), "rank 1 opened another checkpoint than rank 0"),
                  "%s: a follower's other checkpoint was not refused (%s)", name,
                  s == MOE_OK ? "opened" : moe_last_error());
            if (s == MOE_OK) moe_runner_free(&rn);
            else printf("ep_check: %s: a follower with another config.json refused as it should be: %s\n", name,
                        moe_last_error());
        }
        moe_backend_free(&be);
        moe_model_free(&m);
    }
    CHECK(moe_ep_stop(&ep) == MOE_OK, "%s: stop: %s", name, moe_last_error());
    moe_ep_free(&ep);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", alt);
    CHECK(system(cmd) == 0, "%s: could not remove %s", name, alt);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mpirun -n N ep_check cpu|cpu-ref|cuda [--rows N] [--tp M] [--collectives C] "
                "[--plan] [--dp-attention [--dp-gather]] FIXTURE...\n");
        return 2;
    }
    backend_name = argv[1];
    int first = 2;
    for (; argc > first + 1 && !strncmp(argv[first], "--", 2); first += 2) {
        if (!strcmp(argv[first], "--rows")) first_rows = atoi(argv[first + 1]);
        else if (!strcmp(argv[first], "--tp")) tp = atoi(argv[first + 1]);
        else if (!strcmp(argv[first], "--collectives")) coll_name = argv[first + 1];
        else break;
    }
    if (first < argc && !strcmp(argv[first], "--plan")) plan_on = true, first++;
    if (first < argc && !strcmp(argv[first], "--dp-attention")) dp = true, first++;
    if (first < argc && !strcmp(argv[first], "--dp-gather")) dp = dp_gather = true, first++;
    if (strcmp(coll_name, "auto") && strcmp(coll_name, "nccl") && strcmp(coll_name, "mpi")) {
        fprintf(stderr, "ep_check: --collectives %s: auto, nccl or mpi\n", coll_name);
        return 2;
    }
    if (first_rows < 1 || first_rows > 64) {
        fprintf(stderr, "ep_check: --rows %d: 1 to 64\n", first_rows);
        return 2;
    }
    if (first_rows > runner_opts.max_tokens) runner_opts.max_tokens = first_rows;
    struct moe_comm_launch l;
    struct moe_comm *c;
    if (moe_comm_launch_from_env(&l) != MOE_OK || moe_comm_init(&c, &l, 300) != MOE_OK) {
        fprintf(stderr, "ep_check: %s\n", moe_last_error());
        return 1;
    }
    if (l.size < 2) fprintf(stderr, "ep_check: one rank: run it under mpirun -n 2 or more\n"), failures++;
    if (tp < 1 || l.size % tp) fprintf(stderr, "ep_check: --tp %d does not divide %d ranks\n", tp, l.size), failures++;
    if (l.size > 1 && tp == 1 && !dp && first < argc) check_other_checkpoint(c, argv[first]);
    for (int i = first; i < argc && l.size > 1; i++) {
        if (tp > 1) { /* the experts over every rank, then over the groups */
            check_fixture(c, argv[i], false, l.size);
            check_fixture(c, argv[i], false, l.size / tp);
            if (strncmp(backend_name, "cuda", 4)) check_mtp(c, argv[i]);
            continue;
        }
        check_fixture(c, argv[i], false, l.size);
        check_fixture(c, argv[i], true, l.size);
        if (strncmp(backend_name, "cuda", 4) && !dp) check_mtp(c, argv[i]);
    }
    CHECK(moe_comm_barrier(c, "the end") == MOE_OK, "barrier: %s", moe_last_error());
    moe_comm_free(c); /* each rank's exit status: mpirun fails when any fails */
    return failures ? 1 : 0;
}
