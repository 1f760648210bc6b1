/* backend_cpu_pack.c - the CPU backends' weights at prepare_model
 * (backend_cpu_impl.h, moe_cpu_pack_model): matrices quantized to Q8_0,
 * Q4_1, Q4_K, Q5_K or Q6_K (--quantize, the per-expert plan) and bf16
 * matrices repacked into 16-output panels, each kind into one arena per
 * model that the backend owns, the model's views pointed there and the
 * source pages dropped. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/backend/backend_cpu_impl.h"
#include "runtime/backend/backend_impl.h"
#include "runtime/cpu/gemm.h"

/* ---- the matrices of a model repacked at prepare_model: bf16 panels
 * (fast kernels), or quantization (--quantize q8_0 or q4, either backend) ---- */

/* Quantization runs first (when asked: --quantize q4 is PACK_Q4 of all
 * but the LM head, then PACK_Q8_0 of the LM head; a per-expert plan puts
 * each expert in the pass of its own format), then PACK_PANELS over what
 * is still bf16 (the routers, experts the plan keeps).  Each writes its
 * own arena.  PACK_Q4 makes Q4_K of a matrix whose rows are multiples of
 * 256 long (an expert: of its three matrices), Q4_1 of the others (q5_k
 * and q5_k_m run the same pass, Q5_K in place of Q4_K); under q4_k_m (and
 * q5_k_m) it makes the matrices moe_quant_q4_k_m_dtype names Q6_K or Q8_0
 * instead (an expert's down matrix: then the table's down_dtypes), and
 * PACK_Q8_0 the LM head Q6_K where its rows allow. */
enum pack_kind { PACK_Q8_0, PACK_Q4, PACK_PANELS };
static enum moe_dtype pack_dtype(enum pack_kind k, enum moe_weight_quant q, int64_t K)
{
    return k == PACK_PANELS ? MOE_DTYPE_BF16_PANEL
           : k == PACK_Q4   ? moe_quant_base_dtype(q, K)
                            : MOE_DTYPE_Q8_0;
}
/* Whether q quantizes in PACK_Q4 (q4, q4_k_m, q5_k, q5_k_m). */
static bool pass_q4(enum moe_weight_quant q)
{
    return q == MOE_QUANT_Q4 || q == MOE_QUANT_Q4_K_M || moe_quant_q5(q);
}

/* Which matrices a quantization pass takes: the backend's quant for all
 * but the experts a per-expert plan names (moe_backend_expert_quant). */
static bool pass_takes(enum pack_kind kind, const struct moe_backend *be, bool lm_head)
{
    if (kind == PACK_PANELS) return true;
    const bool q4 = pass_q4(be->quant);
    if (kind == PACK_Q4) return q4 && !lm_head;
    return be->quant == MOE_QUANT_Q8_0 || (q4 && lm_head);
}
static bool pass_takes_expert(enum pack_kind kind, const struct moe_backend *be, int l, int e)
{
    if (kind == PACK_PANELS) return true;
    const enum moe_weight_quant q = moe_backend_expert_quant(be, l, e);
    return kind == PACK_Q4 ? pass_q4(q) : q == MOE_QUANT_Q8_0;
}

/* What a matrix that a quantization pass takes becomes: the pass's dtype
 * `to`, or under q4_k_m and q5_k_m the one named for it (km:
 * moe_quant_q4_k_m_tensor's or moe_quant_q4_k_m_dtype's answer). */
static enum moe_dtype quant_to(enum pack_kind kind, const struct moe_backend *be, enum moe_dtype km,
                               enum moe_dtype to)
{
    if (kind == PACK_PANELS || !moe_quant_k_m(be->quant) || km == MOE_DTYPE_N) return to;
    return km;
}

/* One matrix to repack: a tensor view, or one entry of a layer's expert
 * table (whose dtype is the table's, or its dtypes[expert]). */
struct pack_item {
    struct moe_tensor *t;              /* NULL for an expert entry */
    struct moe_expert_weights *table;  /* the expert entry's table */
    int expert;                        /* the entry's expert */
    const void **slot;                 /* the expert entry */
    const void *src;                   /* (N, K) row-major, of dtype dt */
    enum moe_dtype dt;
    int N, K;
    enum moe_dtype to;                 /* what it becomes (quantization) */
    bool down;                         /* an expert entry's down matrix */
    int layer;                         /* for messages; -1 for the LM head */
    size_t off;                        /* into the arena */
    bool keep_source;                  /* another view still reads the source rows */
};

/* Only float matrices are repacked: Q8_0, Q4_1 and BF16_PANEL are already
 * packed, and MXFP4, FP8_B128 and Q4_G32/Q4_G128 (checkpoints' own formats:
 * gpt-oss experts, fp8 checkpoints' Linear weights, GPTQ, AWQ and
 * compressed-tensors) are read in place, never widened to panels or
 * requantized by --quantize. */
static bool packable(enum pack_kind kind, enum moe_dtype dt, int64_t N, int64_t K)
{
    if (N <= 0 || N > INT32_MAX || K <= 0 || K > INT32_MAX) return false;
    if (kind == PACK_PANELS) return dt == MOE_DTYPE_BF16 && K % 2 == 0;
    return (dt == MOE_DTYPE_F32 || dt == MOE_DTYPE_F16 || dt == MOE_DTYPE_BF16) &&
           K % MOE_Q8_0_BLOCK == 0; /* = MOE_Q4_1_BLOCK */
}

/* A layer's 2-D weights other than the experts: attention (MLA's down
 * projections too; its per-head 3-D matrices stay as loaded), dense FFN,
 * router, shared expert and its gate. */
enum { LAYER_MATRICES = 14 };
static void layer_matrices(struct moe_layer_weights *w, struct moe_tensor *ts[LAYER_MATRICES])
{
    struct moe_tensor *all[LAYER_MATRICES] = {&w->wq,      &w->wk,     &w->wv,      &w->wo,
                                              &w->wq_a,    &w->wkv_a,
                                              &w->w_gate,  &w->w_up,   &w->w_down,  &w->router,
                                              &w->sh_gate, &w->sh_up,  &w->sh_down, &w->sh_router};
    memcpy(ts, all, sizeof all);
}

/* t, a matrix of layer `layer` (-1: outside the layers) */
static void add_tensor(enum pack_kind kind, const struct moe_backend *be, const struct moe_model *m,
                       struct pack_item *items, size_t *n, struct moe_tensor *t, int layer)
{
    if (!t->data || t->ndim != 2 || !packable(kind, t->dtype, t->shape[0], t->shape[1])) return;
    if (items) items[*n] = (struct pack_item){.t = t, .src = t->data, .dt = t->dtype,
                                              .N = (int)t->shape[0], .K = (int)t->shape[1],
                                              .to = quant_to(kind, be, moe_quant_q4_k_m_tensor(m, layer, t),
                                                             pack_dtype(kind, be->quant, t->shape[1])),
                                              .layer = layer};
    ++*n;
}

/* The repackable matrices of m in a fixed order: the LM head, then per
 * layer attention, dense FFN, router (panels only: quantization keeps the
 * routers, as llama.cpp's quantize does), shared expert and the experts
 * (gate, up, down of each in turn: every expert the pass takes whose
 * matrices it can pack).  items NULL: count only. */
static size_t pack_items(enum pack_kind kind, const struct moe_backend *be, struct moe_model *m,
                         struct pack_item *items)
{
    const struct moe_config *c = &m->cfg;
    const int E = c->n_experts, D = c->d_model, F = c->d_expert;
    size_t n = 0;
    if (pass_takes(kind, be, true)) /* first: the largest, so the team ends together */
        add_tensor(kind, be, m, items, &n, &m->lm_head, -1);
    if (items && n == 1 && moe_model_head_tied(m))
        items[0].keep_source = true; /* tied: the embedding reads the same rows */
    const bool dense = pass_takes(kind, be, false);
    if (dense) add_tensor(kind, be, m, items, &n, &m->mtp_eh_proj, 0); /* a multi-token-prediction module's input */
    for (int l = 0; l < c->n_layers; l++) {
        struct moe_layer_weights *w = &m->layers[l];
        struct moe_tensor *ts[LAYER_MATRICES];
        layer_matrices(w, ts);
        for (int i = 0; i < LAYER_MATRICES && dense; i++) {
            if (kind != PACK_PANELS && (ts[i] == &w->router || ts[i] == &w->sh_router)) continue;
            add_tensor(kind, be, m, items, &n, ts[i], l);
        }
        struct moe_expert_weights *x = &w->experts;
        if (E <= 0 || !x->gate) continue;
        for (int e = 0; e < E; e++) {
            const enum moe_dtype dt = moe_expert_dtype(x, e);
            if (!x->gate[e]) continue; /* held by another rank (expert parallelism) */
            if (!pass_takes_expert(kind, be, l, e) || !packable(kind, dt, F, D) || !packable(kind, dt, D, F))
                continue;
            const void **slots[3] = {&x->gate[e], &x->up[e], &x->down[e]};
            const enum moe_weight_quant eq = moe_backend_expert_quant(be, l, e);
            const enum moe_dtype to =
                kind == PACK_Q4 ? moe_quant_base_expert_dtype(eq, D, F) : pack_dtype(kind, be->quant, D);
            const enum moe_dtype to_down =
                quant_to(kind, be, moe_quant_q4_k_m_dtype(MOE_Q4KM_DOWN, l, c->n_layers, E, F), to);
            for (int i = 0; i < 3; i++, n++)
                if (items)
                    items[n] = (struct pack_item){.table = x, .expert = e, .slot = slots[i], .src = *slots[i],
                                                  .dt = dt, .N = i < 2 ? F : D, .K = i < 2 ? D : F,
                                                  .to = i < 2 ? to : to_down, .down = i == 2, .layer = l};
        }
    }
    return n;
}

/* The dtypes only this backend's prepare_model makes (MXFP4 and FP8_B128
 * are not: the loader makes them, in memory the model owns). */
static bool packed_dtype(enum moe_dtype dt)
{
    return dt == MOE_DTYPE_BF16_PANEL || dt == MOE_DTYPE_Q8_0 || dt == MOE_DTYPE_Q4_1 || dt == MOE_DTYPE_Q4_K ||
           dt == MOE_DTYPE_Q5_K || dt == MOE_DTYPE_Q6_K;
}

/* A weight of m in panels or quantized, or NULL when it has none. */
static const void *some_packed(struct moe_model *m)
{
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct moe_layer_weights *w = &m->layers[l];
        if (w->experts.gate && packed_dtype(w->experts.dtype))
            for (int e = 0; e < m->cfg.n_experts; e++)
                if (w->experts.gate[e]) return w->experts.gate[e];
        if (w->experts.dtypes) return w->experts.dtypes; /* a plan's tables, in an arena */
        if (w->experts.down_dtypes) return w->experts.down_dtypes; /* q4_k_m's */
        struct moe_tensor *ts[LAYER_MATRICES];
        layer_matrices(w, ts);
        for (int i = 0; i < LAYER_MATRICES; i++)
            if (packed_dtype(ts[i]->dtype)) return ts[i]->data;
    }
    return packed_dtype(m->lm_head.dtype) ? m->lm_head.data : NULL;
}

/* Bytes of item it in the arena, as a multiple of 64. */
static bool packed_bytes(enum pack_kind kind, const struct pack_item *it, size_t *out)
{
    if (kind == PACK_PANELS) return moe_gemm_panel_bytes(it->N, it->K, out);
    size_t b;
    if (__builtin_mul_overflow((size_t)it->N, moe_dtype_row_bytes(it->to, (size_t)it->K), &b) ||
        b > SIZE_MAX - 63)
        return false;
    *out = (b + 63) / 64 * 64;
    return true;
}

/* Quantizes item it into dst (it->to: Q8_0, Q4_1, Q4_K, Q5_K or Q6_K); false
 * when a value is not finite. */
static bool quantize_item(char *dst, const struct pack_item *it)
{
    const enum moe_dtype to = it->to;
    float *row = malloc((size_t)it->K * sizeof(float));
    if (!row) return false;
    const size_t src_row = moe_dtype_row_bytes(it->dt, (size_t)it->K),
                 dst_row = moe_dtype_row_bytes(to, (size_t)it->K);
    bool ok = true;
    for (int n = 0; n < it->N && ok; n++) {
        moe_convert_row_f32(row, (const char *)it->src + (size_t)n * src_row, it->dt, (size_t)it->K);
        char *d = dst + (size_t)n * dst_row;
        ok = to == MOE_DTYPE_Q6_K   ? moe_quantize_row_q6_k(d, row, (size_t)it->K)
             : to == MOE_DTYPE_Q4_K ? moe_quantize_row_q4_k(d, row, (size_t)it->K)
             : to == MOE_DTYPE_Q5_K ? moe_quantize_row_q5_k(d, row, (size_t)it->K)
             : to == MOE_DTYPE_Q4_1 ? moe_quantize_row_q4_1(d, row, (size_t)it->K)
                                    : moe_quantize_row_q8_0(d, row, (size_t)it->K);
    }
    free(row);
    return ok;
}

/* Repacks m's matrices of this kind into a new arena owned by c and points
 * m's views at it (nothing to do when it has none); on failure m is
 * unchanged.  Each source's pages go back as soon as it is packed, except,
 * when quantizing, those of in-memory tensors: quantization can fail (a
 * value that is not finite) and such a source would not come back, so they
 * go once every matrix is done (a file's pages are read again if needed). */
static enum moe_status pack_model(struct cpu_ctx *c, struct moe_model *m, enum pack_kind kind,
                                  const struct moe_backend *be)
{
    const size_t n = pack_items(kind, be, m, NULL);
    if (n == 0) return MOE_OK;
    enum moe_status s = MOE_OK;
    char *arena = NULL;
    struct pack_item *items = calloc(n, sizeof *items);
    struct cpu_arena *arenas = realloc(c->arenas, ((size_t)c->n_arenas + 1) * sizeof *arenas);
    if (arenas) c->arenas = arenas;
    if (!items || !arenas) {
        s = moe_fail(MOE_ERR_NOMEM, "cpu backend: panel list of %zu matrices", n);
        goto fail;
    }
    pack_items(kind, be, m, items);
    const size_t huge = (size_t)2 << 20;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bytes;
        if (!packed_bytes(kind, &items[i], &bytes) || total > SIZE_MAX - bytes - huge) {
            s = moe_fail(MOE_ERR_NOMEM, "cpu backend: repacked weight sizes overflow");
            goto fail;
        }
        items[i].off = total;
        total += bytes; /* a multiple of 64 */
    }
    /* whole 2 MiB pages, so the kernel may back the arena with huge pages
     * (fewer TLB misses while decode streams it) */
    const size_t cap = (total + huge - 1) / huge * huge;
    if (!(arena = aligned_alloc(huge, cap))) {
        s = moe_fail(MOE_ERR_NOMEM, kind == PACK_PANELS
                     ? "cpu backend: cannot allocate %zu bytes for the weight panels "
                       "(MOERUN_CPU_PANELS=0 keeps the natural layout)"
                     : "cpu backend: cannot allocate %zu bytes for the quantized weights", cap);
        goto fail;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(arena, cap, MADV_HUGEPAGE);
#endif
    /* one matrix per item across the team */
    int64_t bad = -1; /* the first item that could not be quantized */
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < n; i++) {
        const struct pack_item *it = &items[i];
        if (kind == PACK_PANELS) {
            moe_gemm_pack_panels(arena + it->off, it->src, it->N, it->K);
            if (!it->keep_source) moe_safetensors_release(&m->st, it->src, (size_t)it->N * (size_t)it->K * 2, false);
        } else if (!quantize_item(arena + it->off, it)) {
#pragma omp critical(moe_cpu_quant_bad)
            if (bad < 0 || (int64_t)i < bad) bad = (int64_t)i;
        } else if (!it->keep_source) {
            moe_safetensors_release(&m->st, it->src, moe_dtype_row_bytes(it->dt, (size_t)it->K) * (size_t)it->N, true);
        }
    }
    if (bad >= 0) {
        const struct pack_item *it = &items[bad];
        const char *q = be->quant == MOE_QUANT_Q4_K_M ? "q4_k_m" : be->quant == MOE_QUANT_Q5_K_M ? "q5_k_m"
                        : be->quant == MOE_QUANT_Q5_K  ? "q5_k" : kind == PACK_Q4 ? "q4" : "q8_0";
        s = it->layer < 0 ? moe_fail(MOE_ERR_FORMAT, "--quantize %s: the LM head holds a value that "
                                     "is not finite (or cannot be allocated)", q)
                          : moe_fail(MOE_ERR_FORMAT, "--quantize %s: a (%d, %d) weight of layer %d holds "
                                     "a value that is not finite or past f16's range (or cannot be "
                                     "allocated)", q, it->N, it->K, it->layer);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        const struct pack_item *it = &items[i];
        const enum moe_dtype to = kind == PACK_PANELS ? MOE_DTYPE_BF16_PANEL : it->to;
        if (kind != PACK_PANELS && !it->keep_source)
            moe_safetensors_release(&m->st, it->src, moe_dtype_row_bytes(it->dt, (size_t)it->K) * (size_t)it->N,
                           false);
        if (it->t) {
            it->t->data = arena + it->off;
            it->t->dtype = to;
        } else {
            *it->slot = arena + it->off;
            if (it->down && it->table->down_dtypes) {
                ((enum moe_dtype *)it->table->down_dtypes)[it->expert] = to; /* this backend's (down_tables) */
            } else if (it->table->dtypes) {
                ((enum moe_dtype *)it->table->dtypes)[it->expert] = to; /* this backend's (mixed_tables) */
                it->table->dtype = it->table->dtypes[0];
            } else {
                it->table->dtype = to;
            }
        }
    }
    c->arenas[c->n_arenas++] = (struct cpu_arena){arena, cap};
    free(items);
    return MOE_OK;
fail:
    free(arena);
    free(items);
    return s;
}

/* (L, E) dtypes for the experts' tables of m, in memory c owns (an arena
 * entry: freed with the weights); NULL when out of memory. */
static enum moe_dtype *dtype_tables(struct cpu_ctx *c, const struct moe_config *cfg)
{
    size_t bytes;
    if (!moe_mul_size((size_t)cfg->n_layers * (size_t)(cfg->n_experts > 0 ? cfg->n_experts : 1),
                      sizeof(enum moe_dtype), &bytes))
        return NULL;
    struct cpu_arena *arenas = realloc(c->arenas, ((size_t)c->n_arenas + 1) * sizeof *arenas);
    if (!arenas) return NULL;
    c->arenas = arenas;
    enum moe_dtype *all = malloc(bytes);
    if (all) c->arenas[c->n_arenas++] = (struct cpu_arena){(char *)all, bytes};
    return all;
}

/* A per-expert plan: checks it against m (its layers and experts) and
 * gives each MoE layer's table its own dtypes (E), all the table's dtype
 * for now. */
static enum moe_status mixed_tables(struct cpu_ctx *c, struct moe_model *m, const struct moe_backend *be)
{
    const struct moe_config *cfg = &m->cfg;
    const int E = cfg->n_experts;
    MOE_TRY(moe_backend_check_expert_plan(be, m));
    enum moe_dtype *all = dtype_tables(c, cfg);
    if (!all) return moe_fail(MOE_ERR_NOMEM, "cpu backend: expert dtype tables");
    for (int l = 0; l < cfg->n_layers; l++) {
        struct moe_expert_weights *x = &m->layers[l].experts;
        if (!cfg->layer_moe[l] || !x->gate) continue;
        enum moe_dtype *d = all + (size_t)l * E;
        for (int e = 0; e < E; e++) d[e] = x->dtype;
        x->dtypes = d;
    }
    return MOE_OK;
}

/* q4_k_m, q5_k_m: each MoE layer whose down projections take another dtype than
 * their gate and up gets its own down_dtypes (E), the experts' dtypes for
 * now (the passes set them). */
static enum moe_status down_tables(struct cpu_ctx *c, struct moe_model *m, const struct moe_backend *be)
{
    const struct moe_config *cfg = &m->cfg;
    const int E = cfg->n_experts;
    if (!moe_quant_k_m(be->quant) || E <= 0) return MOE_OK;
    enum moe_dtype *all = dtype_tables(c, cfg);
    if (!all) return moe_fail(MOE_ERR_NOMEM, "cpu backend: expert down dtype tables");
    for (int l = 0; l < cfg->n_layers; l++) {
        struct moe_expert_weights *x = &m->layers[l].experts;
        if (!cfg->layer_moe[l] || !x->gate ||
            moe_quant_q4_k_m_dtype(MOE_Q4KM_DOWN, l, cfg->n_layers, E, cfg->d_expert) == MOE_DTYPE_N)
            continue;
        enum moe_dtype *d = all + (size_t)l * E;
        for (int e = 0; e < E; e++) d[e] = moe_expert_dtype(x, e);
        x->down_dtypes = d;
    }
    return MOE_OK;
}

enum moe_status moe_cpu_pack_model(struct cpu_ctx *c, const struct moe_backend *be, struct moe_model *m)
{
    const char *packed = some_packed(m);
    if (packed) { /* prepared before: by this backend (then nothing to do) or another */
        bool ours = false;
        for (int i = 0; i < c->n_arenas && !ours; i++)
            ours = packed >= c->arenas[i].p && packed < c->arenas[i].p + c->arenas[i].size;
        if (!ours)
            return moe_fail(MOE_ERR_INVALID_ARG, "cpu backend: the model's weights were "
                            "repacked or quantized for another backend; load it again for this one");
    } else {
        if (be->expert_quant) MOE_TRY(mixed_tables(c, m, be));
        MOE_TRY(down_tables(c, m, be));
        MOE_TRY(pack_model(c, m, PACK_Q4, be));
        MOE_TRY(pack_model(c, m, PACK_Q8_0, be));
        if (c->panels) MOE_TRY(pack_model(c, m, PACK_PANELS, be));
    }
    return MOE_OK;
}
