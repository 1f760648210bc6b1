/* dsa_cpu.c - DeepSeek sparse attention's indexer on the CPU (attention.h,
 * moe_attention_dsa_select_cpu): the step's indexer keys normed, rotated
 * and cached, then each row's top-k past positions by index score.  Rows
 * run in parallel; a row's scores are summed over heads in order, so its
 * selection does not depend on the step around it. */
#include "attention/attention.h"
#include "runtime/cpu/gemm.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* x (n) = LayerNorm(x) * w + b, eps 1e-6 (torch.nn.LayerNorm, fp32) */
static void layernorm(float *x, int n, const float *w, const float *b)
{
    float mean = 0.0f, var = 0.0f;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)n;
    const float inv = 1.0f / sqrtf(var + 1e-6f);
    for (int i = 0; i < n; i++) x[i] = (x[i] - mean) * inv * w[i] + b[i];
}

/* Whether position a (score sa) ranks before b (sb): higher score, then lower position. */
static bool before(float sa, int a, float sb, int b) { return sa > sb || (sa == sb && a < b); }

static int cmp_int(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void moe_attention_dsa_select_cpu(int32_t *keys, int topk, const float *q, float *k, const float *w,
                                  const float *norm_w, const float *norm_b, const float *inv_freq, int rot,
                                  struct moe_kvcache *kv, int layer, const struct moe_batch *b, int Hi, int Di)
{
    const int T = b->n_tokens, B = kv->block_size;
    float *ik = kv->ik + (size_t)layer * (size_t)kv->part_blocks * B * Di; /* the blocks stored here */
    for (int t = 0; t < T; t++) layernorm(k + (size_t)t * Di, Di, norm_w, norm_b);
    moe_attention_rope_cpu(k, b->positions, T, 1, Di, rot, inv_freq);
    for (int t = 0; t < T; t++) memcpy(ik + (size_t)b->slot[t] * Di, k + (size_t)t * Di, (size_t)Di * sizeof(float));
    const float ds = 1.0f / sqrtf((float)Di), hs = 1.0f / sqrtf((float)Hi);
#pragma omp parallel for schedule(dynamic, 1) if (T > 1)
    for (int t = 0; t < T; t++) {
        int32_t *sel = keys + (size_t)t * topk;
        const int pos = b->positions[t];
        const int32_t *table = b->block_table + (size_t)b->seq_of[t] * b->max_blocks;
        if (pos < topk) { /* every causal key */
            for (int i = 0; i < topk; i++) sel[i] = i <= pos ? i : -1;
            continue;
        }
        /* the topk best so far, kept sorted best first in (score, position) */
        float best[topk];
        int n = 0;
        const float *qt = q + (size_t)t * Hi * Di, *wt = w + (size_t)t * Hi;
        for (int j = 0; j <= pos; j++) {
            const float *kj = ik + ((size_t)table[j / B] * B + (size_t)(j % B)) * Di;
            float sc = 0.0f;
            for (int h = 0; h < Hi; h++) {
                const float d = moe_dot_f32(qt + (size_t)h * Di, kj, Di) * ds;
                sc += wt[h] * hs * (d > 0.0f ? d : 0.0f);
            }
            if (n == topk && !before(sc, j, best[n - 1], sel[n - 1])) continue;
            int i = n < topk ? n++ : n - 1;
            while (i > 0 && before(sc, j, best[i - 1], sel[i - 1])) {
                best[i] = best[i - 1];
                sel[i] = sel[i - 1];
                i--;
            }
            best[i] = sc;
            sel[i] = j;
        }
        qsort(sel, (size_t)topk, sizeof *sel, cmp_int);
    }
}
