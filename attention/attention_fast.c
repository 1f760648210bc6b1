/* attention_fast.c - the fast paged attention (see attention.h; the
 * reference is moe_attention_paged_cpu in attention_cpu.c).
 *
 * Work items are (block of rows, KV head), or (block, KV head, chunk of
 * the group's heads) when those are too few for the threads; a block is up
 * to VH_CAP / G consecutive rows of one sequence (a prefill chunk; a
 * decode row alone).  Decode rows take several KV heads an item, as many
 * as the scratch holds and the threads leave (fewer items, each walking
 * its heads' rows of a block in order).  A block keeps each KV head's
 * rows together (kvcache.h), so a (tile, head) is a run of rows a block,
 * and a decode item asks for the keys two (tile, head) steps ahead
 * (prefetch_keys).  Each item walks its sequence's keys in tiles of up
 * to MOE_ATT_TILE positions: the scores of the tile's keys for all of the
 * item's rows and query heads (vector dot products), then one
 * online-softmax update per row, head and tile (one rescale of the
 * accumulators per tile instead of per key), then the tile's values into
 * the accumulators.  Every key and value row is read once per item and
 * register block of heads (attention_avx2.c; attention_avx512.c for the
 * AVX-512 kernel sets, the same bits).  A row's numbers do not depend on
 * its block: the same as alone, whatever the batch.
 *
 * Caches: every dtype (f32, f16, bf16, fp8 with its row scales) is read in
 * place at its own width and widened in registers by the kernels, to the
 * reference's values exactly, so an fp8 key costs Dh + 4 bytes of K and of
 * V read instead of 4 Dh, a bf16 one 2 Dh. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attention_fast_impl.h"

enum { JT = MOE_ATT_TILE };

/* Query heads an item takes at once: rows of a sequence times heads of a
 * group, so that a tile of keys, once loaded, serves them all. */
enum { VH_CAP = 64 };

static int rows_per_block(int G) { return G >= VH_CAP ? 1 : VH_CAP / G; }

/* Per thread, for the VH = rows x heads of an item: m, l, corr (VH each),
 * the scores / softmax weights (VH, JT), the accumulators and the queries
 * (VH, Dh each). */
size_t moe_attention_fast_scratch(int G, int Dh)
{
    return (size_t)rows_per_block(G) * (size_t)G * (3 + JT + 2 * (size_t)Dh);
}

/* The call's constants, shared by its work items. */
struct att_job {
    float *out;
    const float *q;
    const struct moe_batch *b;
    const struct moe_attn_params *p;
    const char *kl, *vl;
    const float *ksl, *vsl;
    float *scratch;
    size_t scratch_per_thread;
    size_t es;
    const int32_t *start; /* (blocks + 1) each block's first row; NULL: a row each */
    enum moe_dtype dt;
    bool wide; /* the 512-bit kernels */
    int Hq, Hkv, Dh, G, B, GC, nc;
    int HC, nh; /* KV heads an item takes (blocks of one row only), items a block's heads make */
};

/* The kernels of the job's width (attention_fast_impl.h). */
static void scores(const struct att_job *J, float *sc, const float *q, int gn, const void *const *krow,
                   const float *ks, int nj, float scale)
{
    if (J->wide) moe_attention_scores_avx512(sc, JT, q, gn, J->Dh, J->dt, krow, ks, nj, scale);
    else moe_attention_scores_avx2(sc, JT, q, gn, J->Dh, J->dt, krow, ks, nj, scale);
}

static void accum(const struct att_job *J, float *acc, int gn, const float *corr, const float *p,
                  const void *const *vrow, const float *vs, int nj)
{
    if (J->wide) moe_attention_accum_avx512(acc, gn, J->Dh, corr, p, JT, J->dt, vrow, vs, nj);
    else moe_attention_accum_avx2(acc, gn, J->Dh, corr, p, JT, J->dt, vrow, vs, nj);
}

/* Blocks of rows that walk their keys together: consecutive rows of one
 * sequence at ascending positions with the same first key and query scale,
 * at most rmax of them.  start (T + 1): each block's first row, then T;
 * returns the number of blocks. */
static int row_blocks(int32_t *start, const struct moe_batch *b, const struct moe_attn_params *p, int rmax)
{
    int n = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        const int t0 = n ? start[n - 1] : 0, pt = b->positions[t];
        if (n == 0 || t - t0 >= rmax || b->seq_of[t] != b->seq_of[t0] || pt <= b->positions[t - 1] ||
            moe_attention_first_key(p, pt) != moe_attention_first_key(p, b->positions[t0]) ||
            moe_attention_query_scale(p, pt) != moe_attention_query_scale(p, b->positions[t0]))
            start[n++] = t;
    }
    start[n] = b->n_tokens;
    return n;
}

/* A decode item asks for the key rows it will read PREFETCH_AHEAD
 * (tile, head) steps on, all their cache lines, a run of rows a block
 * (kvcache.h): the processor's own prefetcher does not keep far enough
 * ahead of a walk that computes between its loads (bench_attention_decode
 * at bench-olmoe's shape and 2048 cached tokens, one thread: f32 6.2 ->
 * 5.1 ms, bf16 5.1 -> 3.3 ms; results/2026-12-07-kv-head-major.md).
 * Asking for the values' rows too, or for rows further ahead, gained
 * nothing. */
enum { PREFETCH_AHEAD = 2 };

static void prefetch_keys(const struct att_job *J, const int32_t *table, int j0, int plast, int kh0, int hn, int ah)
{
    const int B = J->B, tj = j0 + ah / hn * JT, kh = kh0 + ah % hn, tl = tj + JT <= plast ? tj + JT - 1 : plast;
    const size_t rs = (size_t)J->Dh * J->es;
    for (int j = tj; j <= tl;) {
        const int o = j % B, n = B - o < tl + 1 - j ? B - o : tl + 1 - j;
        const char *k = J->kl + moe_kv_block_row((size_t)table[j / B], (size_t)o, (size_t)B, (size_t)J->Hkv, (size_t)kh) * rs;
        const size_t len = (size_t)n * rs;
        for (size_t c = 0; c < len; c += 64) __builtin_prefetch(k + c);
        __builtin_prefetch(k + len - 1);
        j += n;
    }
}

/* Work item it: (block of rows, KV heads kh0 .. kh0 + hn (hn > 1: a
 * block of one row), heads g0 .. g0 + gn of each group), in the scratch
 * of thread th.  Each row's numbers are those it has alone: the same
 * tiles from its first key, the scores of its heads computed as alone
 * (the kernels treat heads one by one), its own softmax update over its
 * own keys of a tile, its values summed over those keys; the block and
 * the item's KV heads share only the loading of the keys and values. */
static void attend_item(const struct att_job *J, size_t it, int th)
{
    const int Hq = J->Hq, Hkv = J->Hkv, Dh = J->Dh, G = J->G, B = J->B, GC = J->GC, nc = J->nc;
    const struct moe_batch *b = J->b;
    const struct moe_attn_params *p = J->p;
    const enum moe_dtype dt = J->dt;
    const bool fp8 = dt == MOE_DTYPE_F8E4M3;
    const size_t blk = it / ((size_t)J->nh * nc);
    const int kh0 = (int)(it / nc % J->nh) * J->HC, hn = Hkv - kh0 < J->HC ? Hkv - kh0 : J->HC;
    const int t0 = J->start ? J->start[blk] : (int)blk, R = J->start ? J->start[blk + 1] - t0 : 1;
    const int g0 = (int)(it % nc) * GC, gn = G - g0 < GC ? G - g0 : GC, VH = R * gn; /* a KV head's */
    const int32_t *pos = b->positions + t0;
    float *m = J->scratch + (size_t)th * J->scratch_per_thread;
    float *l = m + (size_t)hn * VH, *corr = l + (size_t)hn * VH, *sc = corr + (size_t)hn * VH,
          *acc = sc + (size_t)hn * VH * JT, *qb = acc + (size_t)hn * VH * Dh;
    const int32_t *table = b->block_table + (size_t)b->seq_of[t0] * b->max_blocks;
    const int first = moe_attention_first_key(p, pos[0]), plast = pos[R - 1];
    const float scale = moe_attention_query_scale(p, pos[0]);
    const float *qrow = J->q + (size_t)t0 * Hq * Dh + (size_t)(kh0 * G + g0) * Dh;
    for (int r = 0; r < R; r++) {
        if (R > 1) /* the block's queries side by side (a lone row's already are; hn is 1) */
            memcpy(qb + (size_t)r * gn * Dh, qrow + (size_t)r * Hq * Dh, (size_t)gn * Dh * sizeof(float));
        for (int h = 0; h < hn; h++)
            for (int g = 0; g < gn; g++) { /* a sink is a key of value 0 */
                m[h * VH + r * gn + g] = p->sinks ? p->sinks[(kh0 + h) * G + g0 + g] : -INFINITY;
                l[h * VH + r * gn + g] = p->sinks ? 1.0f : 0.0f;
            }
    }
    memset(acc, 0, (size_t)hn * VH * Dh * sizeof(float));
    const void *krow[JT], *vrow[JT];
    float ks[JT], vs[JT]; /* fp8: the rows' scales */
    int ra = 0;           /* the first row whose keys reach this tile (positions ascend) */
    for (int j0 = first; j0 <= plast; j0 += JT) {
        const int nj = plast + 1 - j0 < JT ? plast + 1 - j0 : JT;
        while (pos[ra] < j0) ra++;
        size_t r0[JT]; /* each key's row of the item's first head; head kh0 + h's is B rows on */
        for (int jj = 0, bi = j0 / B, o = j0 % B; jj < nj; jj++) {
            r0[jj] = moe_kv_block_row((size_t)table[bi], (size_t)o, (size_t)B, (size_t)Hkv, (size_t)kh0);
            if (++o == B) o = 0, bi++;
        }
        const size_t rs = (size_t)Dh * J->es;
        for (int h = 0; h < hn; h++) {
            if (R == 1) prefetch_keys(J, table, j0, plast, kh0, hn, h + PREFETCH_AHEAD);
            for (int jj = 0; jj < nj; jj++) {
                const size_t r = r0[jj] + (size_t)h * (size_t)B;
                krow[jj] = J->kl + r * rs;
                vrow[jj] = J->vl + r * rs;
                if (fp8) {
                    ks[jj] = J->ksl[r];
                    vs[jj] = J->vsl[r];
                }
            }
            float *mh = m + h * VH, *lh = l + h * VH, *ch = corr + h * VH, *sch = sc + (size_t)h * VH * JT,
                  *ah = acc + (size_t)h * VH * Dh;
            /* scores of every row reaching the tile, over the keys of the last
             * (a row ignores those past its position) */
            float *sa = sch + (size_t)ra * gn * JT;
            const float *qa = R > 1 ? qb + (size_t)ra * gn * Dh : qrow + (size_t)h * G * Dh;
            scores(J, sa, qa, (R - ra) * gn, krow, ks, nj, scale);
            /* rows ra .. rf - 1 see part of the tile, each alone; rf .. R - 1 all of it, together */
            int rf = ra;
            while (rf < R && pos[rf] + 1 - j0 < nj) rf++;
            for (int r = ra; r < R; r++) {
                const int njr = r < rf ? pos[r] + 1 - j0 : nj, v = r * gn;
                moe_attention_softmax_avx2(sch + (size_t)v * JT, JT, gn, njr, mh + v, lh + v, ch + v);
                if (r < rf) accum(J, ah + (size_t)v * Dh, gn, ch + v, sch + (size_t)v * JT, vrow, vs, njr);
            }
            if (rf < R)
                accum(J, ah + (size_t)rf * gn * Dh, (R - rf) * gn, ch + rf * gn, sch + (size_t)rf * gn * JT, vrow,
                      vs, nj);
        }
    }
    for (int h = 0; h < hn; h++)
        for (int r = 0; r < R; r++)
            for (int g = 0; g < gn; g++) {
                float *o = J->out + (size_t)(t0 + r) * Hq * Dh + ((size_t)(kh0 + h) * G + g0 + g) * Dh;
                const float *a = acc + (size_t)(h * VH + r * gn + g) * Dh;
                const float inv = 1.0f / l[h * VH + r * gn + g];
                for (int d = 0; d < Dh; d++) o[d] = a[d] * inv;
            }
}

void moe_attention_paged_fast(enum moe_cpu_isa isa, float *out, const float *q, const struct moe_kvcache *kv,
                              const struct moe_batch *b, const struct moe_attn_params *p,
                              float *scratch, size_t scratch_per_thread)
{
    MOE_ASSERT(isa >= MOE_CPU_ISA_AVX2);
    const int Hq = p->n_heads, Hkv = p->n_kv_heads, Dh = p->head_dim, G = Hq / Hkv;
    const enum moe_dtype dt = kv->dtype;
    const bool fp8 = dt == MOE_DTYPE_F8E4M3;
    const size_t es = moe_dtype_size(dt);
    const int T = b->n_tokens;
    MOE_ASSERT(moe_attention_fast_scratch(G, Dh) <= scratch_per_thread);
    struct att_job J = {
        .out = out, .q = q, .b = b, .p = p,
        .kl = (const char *)kv->k + (size_t)p->layer * kv->layer_elems * es,
        .vl = (const char *)kv->v + (size_t)p->layer * kv->layer_elems * es,
        .ksl = fp8 ? kv->ks + (size_t)p->layer * kv->layer_rows : NULL,
        .vsl = fp8 ? kv->vs + (size_t)p->layer * kv->layer_rows : NULL,
        .scratch = scratch, .scratch_per_thread = scratch_per_thread, .es = es, .dt = dt,
        .wide = isa >= MOE_CPU_ISA_AVX512,
        .Hq = Hq, .Hkv = Hkv, .Dh = Dh, .G = G, .B = kv->block_size,
    };

    /* Blocks of a sequence's rows (prefill chunks, verification rows),
     * or a row each (decode steps; no memory for the list). */
    int32_t *start = NULL;
    int nblk = T;
    if (T > b->n_seqs && (start = malloc(((size_t)T + 1) * sizeof *start)))
        nblk = row_blocks(start, b, p, rows_per_block(G));
    J.start = start;

    /* One thread, or a batch whose keys are few (a decode step at a short
     * context): the items in this thread, without a parallel region (whose
     * team costs more than such a step's attention). */
    size_t keys = 0;
    for (int t = 0; t < T; t++) keys += (size_t)b->positions[t] + 1;
    const int nth = omp_get_max_threads();
    /* decode rows: KV heads an item takes, up to what the scratch holds
     * for one row (rows_per_block(G) groups of G), leaving an item per
     * thread at least */
    J.HC = 1;
    if (!start) {
        const int per = nblk >= nth ? Hkv : Hkv / ((nth + nblk - 1) / nblk);
        J.HC = per < 1 ? 1 : per > rows_per_block(G) ? rows_per_block(G) : per;
    }
    J.nh = (Hkv + J.HC - 1) / J.HC;
    if (nth == 1 || keys * (size_t)Hq * (size_t)Dh <= 16384) {
        J.GC = G;
        J.nc = 1;
        for (size_t it = 0; it < (size_t)nblk * J.nh; it++) attend_item(&J, it, 0);
        free(start);
        return;
    }
    /* Heads of a group in chunks of GC when (block, KV head) pairs are too
     * few to keep every thread busy (decode with few KV heads; MLA's single
     * one): each head's arithmetic is the same whatever the chunk. */
    const int want = 4 * nth;
    int GC = G;
    while (J.HC == 1 && GC > 1 && (size_t)nblk * Hkv * (size_t)((G + GC - 1) / GC) < (size_t)want) GC = (GC + 1) / 2;
    J.GC = GC;
    J.nc = (G + GC - 1) / GC;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t it = 0; it < (size_t)nblk * J.nh * J.nc; it++) attend_item(&J, it, omp_get_thread_num());
    free(start);
}
