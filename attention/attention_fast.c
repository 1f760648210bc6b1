/* attention_fast.c - the fast paged attention (see attention.h; the
 * reference is moe_attention_paged_cpu in attention_cpu.c).
 *
 * Work items are (row, KV head) as in the reference, or (row, KV head, chunk
 * of the group's heads) when those are too few for the threads.  Each item walks its
 * sequence's keys in tiles of up to JT positions: for each key of the tile it
 * computes the scores of all G query heads of the group with vector dot
 * products, then updates the online softmax once per tile (one rescale of
 * the accumulators per tile instead of per key) and adds the tile's values.
 * Every key and value row is read once per item, for all G heads. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attention/attention.h"
#include "runtime/gemm_fast.h"

enum { JT = 16 }; /* keys per softmax tile */

size_t moe_attention_fast_scratch(int G, int Dh) { return (size_t)G * (2 + JT + Dh); }

void moe_attention_paged_fast(float *out, const float *q, const struct moe_kvcache *kv,
                              const struct moe_batch *b, const struct moe_attn_params *p,
                              float *scratch, size_t scratch_per_thread)
{
    const int Hq = p->n_heads, Hkv = p->n_kv_heads, Dh = p->head_dim, G = Hq / Hkv;
    const int B = kv->block_size;
    const size_t row = (size_t)Hkv * Dh;
    MOE_ASSERT(kv->dtype == MOE_DTYPE_F32); /* other KV dtypes take the reference path */
    const float *kl = (const float *)kv->k + (size_t)p->layer * kv->layer_elems;
    const float *vl = (const float *)kv->v + (size_t)p->layer * kv->layer_elems;
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
                const float *kj = kl + slot * row + (size_t)kh * Dh;
                vrow[jj] = vl + slot * row + (size_t)kh * Dh;
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
