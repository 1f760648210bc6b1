/* attention_fast.c - the fast paged attention (see attention.h; the
 * reference is moe_attention_paged_cpu in attention_cpu.c).
 *
 * Work items are (row, KV head) as in the reference, or (row, KV head, chunk
 * of the group's heads) when those are too few for the threads.  Each item walks its
 * sequence's keys in tiles of up to JT positions: for each key of the tile it
 * computes the scores of all G query heads of the group with vector dot
 * products, then updates the online softmax once per tile (one rescale of
 * the accumulators per tile instead of per key) and adds the tile's values.
 * Every key and value row is read once per item, for all G heads.
 *
 * Caches: f32 rows are read in place; fp8 rows (kvcache.h) are widened
 * into per-thread rows first (moe_kv_fp8_row_fast: the reference's values
 * exactly), each key row once before its scores, the tile's value rows
 * once before the accumulation, so a key costs Dh + 4 bytes of K and of V
 * read instead of 4 Dh.  f16 and bf16 caches take the reference
 * (runtime/backend_cpu.c). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attention/attention.h"
#include "runtime/gemm_fast.h"

enum { JT = 16 }; /* keys per softmax tile */

size_t moe_attention_fast_scratch(int G, int Dh) { return (size_t)G * (2 + JT + Dh) + (size_t)(JT + 1) * Dh; }

void moe_attention_paged_fast(float *out, const float *q, const struct moe_kvcache *kv,
                              const struct moe_batch *b, const struct moe_attn_params *p,
                              float *scratch, size_t scratch_per_thread)
{
    const int Hq = p->n_heads, Hkv = p->n_kv_heads, Dh = p->head_dim, G = Hq / Hkv;
    const int B = kv->block_size;
    const bool fp8 = kv->dtype == MOE_DTYPE_F8E4M3;
    MOE_ASSERT(fp8 || kv->dtype == MOE_DTYPE_F32); /* f16, bf16 take the reference */
    const size_t es = moe_dtype_size(kv->dtype);
    const char *kl = (const char *)kv->k + (size_t)p->layer * kv->layer_elems * es;
    const char *vl = (const char *)kv->v + (size_t)p->layer * kv->layer_elems * es;
    const float *ksl = fp8 ? kv->ks + (size_t)p->layer * kv->layer_rows : NULL;
    const float *vsl = fp8 ? kv->vs + (size_t)p->layer * kv->layer_rows : NULL;
    const int T = b->n_tokens;
    MOE_ASSERT(moe_attention_fast_scratch(G, Dh) <= scratch_per_thread);

    /* Heads of a group in chunks of GC when (row, KV head) pairs are too few
     * to keep every thread busy (decode with few KV heads; MLA's single
     * one): each head's arithmetic is the same whatever the chunk. */
    const int want = 4 * omp_get_max_threads();
    int GC = G;
    while (GC > 1 && (size_t)T * Hkv * (size_t)((G + GC - 1) / GC) < (size_t)want) GC = (GC + 1) / 2;
    const int nc = (G + GC - 1) / GC;

#pragma omp parallel for schedule(dynamic, 1) if ((size_t)T * Hkv * nc > 1)
    for (size_t it = 0; it < (size_t)T * Hkv * nc; it++) {
        const int t = (int)(it / ((size_t)Hkv * nc)), kh = (int)(it / nc % Hkv);
        const int g0 = (int)(it % nc) * GC, gn = G - g0 < GC ? G - g0 : GC;
        float *m = scratch + (size_t)omp_get_thread_num() * scratch_per_thread;
        float *l = m + G, *sc = l + G, *acc = sc + (size_t)G * JT;
        float *kbuf = acc + (size_t)G * Dh, *vbuf = kbuf + Dh; /* fp8: (Dh), (JT, Dh) */
        const int s = b->seq_of[t], pos = b->positions[t];
        const int32_t *table = b->block_table + (size_t)s * b->max_blocks;
        const float *qg = q + (size_t)t * Hq * Dh + (size_t)(kh * G + g0) * Dh;
        const int first = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
        for (int g = 0; g < gn; g++) { /* a sink is a key of value 0 */
            m[g] = p->sinks ? p->sinks[kh * G + g0 + g] : -INFINITY;
            l[g] = p->sinks ? 1.0f : 0.0f;
        }
        memset(acc, 0, (size_t)gn * Dh * sizeof(float));
        const float *vrow[JT];
        for (int j0 = first; j0 <= pos; j0 += JT) {
            const int nj = pos + 1 - j0 < JT ? pos + 1 - j0 : JT;
            for (int jj = 0; jj < nj; jj++) {
                const int j = j0 + jj;
                const size_t slot = (size_t)table[j / B] * B + (size_t)(j % B);
                const size_t r = slot * (size_t)Hkv + (size_t)kh, off = r * (size_t)Dh * es;
                const float *kj = (const float *)(kl + off);
                vrow[jj] = (const float *)(vl + off);
                if (fp8) {
                    moe_kv_fp8_row_fast(kbuf, (const uint8_t *)kl + off, ksl[r], Dh);
                    moe_kv_fp8_row_fast(vbuf + (size_t)jj * Dh, (const uint8_t *)vl + off, vsl[r], Dh);
                    kj = kbuf;
                    vrow[jj] = vbuf + (size_t)jj * Dh;
                }
                for (int g = 0; g < gn; g++)
                    sc[(size_t)g * JT + jj] = moe_dot_fast(qg + (size_t)g * Dh, kj, Dh) * p->scale;
            }
            for (int g = 0; g < gn; g++) {
                float *sg = sc + (size_t)g * JT, mn = m[g];
                for (int jj = 0; jj < nj; jj++) mn = sg[jj] > mn ? sg[jj] : mn;
                const float corr = expf(m[g] - mn);
                float *a = acc + (size_t)g * Dh;
                l[g] *= corr;
                for (int jj = 0; jj < nj; jj++) {
                    const float e = expf(sg[jj] - mn);
                    l[g] += e;
                    moe_scale_axpy_fast(a, jj == 0 ? corr : 1.0f, e, vrow[jj], Dh);
                }
                m[g] = mn;
            }
        }
        for (int g = 0; g < gn; g++) {
            float *o = out + (size_t)t * Hq * Dh + ((size_t)kh * G + g0 + g) * Dh;
            const float *a = acc + (size_t)g * Dh;
            const float inv = 1.0f / l[g];
            for (int d = 0; d < Dh; d++) o[d] = a[d] * inv;
        }
    }
}
