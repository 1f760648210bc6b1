/* attention_fast.c - the fast paged attention (see attention.h; the
 * reference is moe_attention_paged_cpu in attention_cpu.c).
 *
 * Work items are (row, KV head) as in the reference, or (row, KV head, chunk
 * of the group's heads) when those are too few for the threads.  Each item walks its
 * sequence's keys in tiles of up to MOE_ATT_TILE positions: the scores of
 * the tile's keys for all of the item's query heads (vector dot products),
 * then one online-softmax update per head and tile (one rescale of the
 * accumulators per tile instead of per key), then the tile's values into
 * the accumulators.  Every key and value row is read once per item and
 * register block of heads (attention_avx2.c; attention_avx512.c for the
 * AVX-512 kernel sets, the same bits).
 *
 * Caches: every dtype (f32, f16, bf16, fp8 with its row scales) is read in
 * place at its own width and widened in registers by the kernels, to the
 * reference's values exactly, so an fp8 key costs Dh + 4 bytes of K and of
 * V read instead of 4 Dh, a bf16 one 2 Dh. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attention_fast_impl.h"

enum { JT = MOE_ATT_TILE };

/* Per thread: m, l, corr (G each), the scores / softmax weights (G, JT), the accumulators (G, Dh). */
size_t moe_attention_fast_scratch(int G, int Dh) { return (size_t)G * (3 + JT + Dh); }

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
    enum moe_dtype dt;
    bool wide; /* the 512-bit kernels */
    int Hq, Hkv, Dh, G, B, GC, nc;
};

/* Work item it: (row t, KV head kh, heads g0 .. g0 + gn of its group), in
 * the scratch of thread th. */
static void attend_item(const struct att_job *J, size_t it, int th)
{
    const int Hq = J->Hq, Hkv = J->Hkv, Dh = J->Dh, G = J->G, B = J->B, GC = J->GC, nc = J->nc;
    const struct moe_batch *b = J->b;
    const struct moe_attn_params *p = J->p;
    const enum moe_dtype dt = J->dt;
    const bool fp8 = dt == MOE_DTYPE_F8E4M3;
    const int t = (int)(it / ((size_t)Hkv * nc)), kh = (int)(it / nc % Hkv);
    const int g0 = (int)(it % nc) * GC, gn = G - g0 < GC ? G - g0 : GC;
    float *m = J->scratch + (size_t)th * J->scratch_per_thread;
    float *l = m + G, *corr = l + G, *sc = corr + G, *acc = sc + (size_t)G * JT;
    const int s = b->seq_of[t], pos = b->positions[t];
    const int32_t *table = b->block_table + (size_t)s * b->max_blocks;
    const float *qg = J->q + (size_t)t * Hq * Dh + (size_t)(kh * G + g0) * Dh;
    const int first = moe_attention_first_key(p, pos);
    const float scale = moe_attention_query_scale(p, pos);
    for (int g = 0; g < gn; g++) { /* a sink is a key of value 0 */
        m[g] = p->sinks ? p->sinks[kh * G + g0 + g] : -INFINITY;
        l[g] = p->sinks ? 1.0f : 0.0f;
    }
    memset(acc, 0, (size_t)gn * Dh * sizeof(float));
    const void *krow[JT], *vrow[JT];
    float ks[JT], vs[JT]; /* fp8: the rows' scales */
    for (int j0 = first; j0 <= pos; j0 += JT) {
        const int nj = pos + 1 - j0 < JT ? pos + 1 - j0 : JT;
        for (int jj = 0; jj < nj; jj++) {
            const int j = j0 + jj;
            const size_t slot = (size_t)table[j / B] * B + (size_t)(j % B);
            const size_t r = slot * (size_t)Hkv + (size_t)kh, off = r * (size_t)Dh * J->es;
            krow[jj] = J->kl + off;
            vrow[jj] = J->vl + off;
            if (fp8) {
                ks[jj] = J->ksl[r];
                vs[jj] = J->vsl[r];
            }
        }
        if (J->wide)
            moe_attention_scores_avx512(sc, JT, qg, gn, Dh, dt, krow, ks, nj, scale);
        else
            moe_attention_scores_avx2(sc, JT, qg, gn, Dh, dt, krow, ks, nj, scale);
        moe_attention_softmax_avx2(sc, JT, gn, nj, m, l, corr); /* the scores become the softmax weights */
        if (J->wide)
            moe_attention_accum_avx512(acc, gn, Dh, corr, sc, JT, dt, vrow, vs, nj);
        else
            moe_attention_accum_avx2(acc, gn, Dh, corr, sc, JT, dt, vrow, vs, nj);
    }
    for (int g = 0; g < gn; g++) {
        float *o = J->out + (size_t)t * Hq * Dh + ((size_t)kh * G + g0 + g) * Dh;
        const float *a = acc + (size_t)g * Dh;
        const float inv = 1.0f / l[g];
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

    /* One thread, or a batch whose keys are few (a decode step at a short
     * context): the items in this thread, without a parallel region (whose
     * team costs more than such a step's attention). */
    size_t keys = 0;
    for (int t = 0; t < T; t++) keys += (size_t)b->positions[t] + 1;
    const int nth = omp_get_max_threads();
    if (nth == 1 || keys * (size_t)Hq * (size_t)Dh <= 16384) {
        J.GC = G;
        J.nc = 1;
        for (size_t it = 0; it < (size_t)T * Hkv; it++) attend_item(&J, it, 0);
        return;
    }
    /* Heads of a group in chunks of GC when (row, KV head) pairs are too few
     * to keep every thread busy (decode with few KV heads; MLA's single
     * one): each head's arithmetic is the same whatever the chunk. */
    const int want = 4 * nth;
    int GC = G;
    while (GC > 1 && (size_t)T * Hkv * (size_t)((G + GC - 1) / GC) < (size_t)want) GC = (GC + 1) / 2;
    J.GC = GC;
    J.nc = (G + GC - 1) / GC;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t it = 0; it < (size_t)T * Hkv * J.nc; it++) attend_item(&J, it, omp_get_thread_num());
}
