/* attention_cpu.c - CPU reference of the attention ops (see attention.h).
 *
 * Paged attention walks each sequence's keys in position order with an
 * online softmax (running max m, running sum l, accumulator acc), one pass
 * over every key and value for all G query heads that share its KV head, so
 * no score buffer of context length is needed. */
#include "attention/attention.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "runtime/core/par.h"
#include "runtime/cpu/gemm.h"

static void rmsnorm_row(float *yr, const float *xr, const struct moe_tensor *w, int dim, float eps)
{
    float ss = moe_dot_f32(xr, xr, dim);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = 0; i < dim; i++) yr[i] = moe_tensor_get_f32(w, i) * (xr[i] * inv);
}

void moe_attention_rmsnorm_cpu(float *y, const float *x, const struct moe_tensor *w, int rows,
                               int dim, float eps)
{
    if (!moe_par_worth((size_t)rows * dim, 65536)) {
        for (int r = 0; r < rows; r++) rmsnorm_row(y + (size_t)r * dim, x + (size_t)r * dim, w, dim, eps);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) rmsnorm_row(y + (size_t)r * dim, x + (size_t)r * dim, w, dim, eps);
}

/* YaRN (transformers' _compute_yarn_parameters): dimensions that turn more
 * than beta_fast times over the original context keep their frequency,
 * those under beta_slow turns are divided by factor, a linear ramp between. */
static double yarn_correction_dim(double rotations, int dim, double base, int max_pos)
{
    return dim * log(max_pos / (rotations * 2 * M_PI)) / (2 * log(base));
}

static void yarn_freqs(float *inv_freq, const struct moe_config *cfg)
{
    const int dim = cfg->rope_dim, half = dim / 2;
    double lo = yarn_correction_dim(cfg->rope_beta_fast, dim, cfg->rope_theta, cfg->rope_original_max_pos);
    double hi = yarn_correction_dim(cfg->rope_beta_slow, dim, cfg->rope_theta, cfg->rope_original_max_pos);
    if (cfg->rope_truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001; /* as transformers: no singular ramp */
    for (int i = 0; i < half; i++) {
        float ramp = ((float)i - (float)lo) / (float)(hi - lo);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        const float extrapolation = 1.0f - ramp;
        const float pos_freq = powf(cfg->rope_theta, (float)(2 * i) / (float)dim);
        inv_freq[i] = 1.0f / (cfg->rope_factor * pos_freq) * (1.0f - extrapolation) +
                      1.0f / pos_freq * extrapolation;
    }
}

void moe_attention_rope_freqs(float *inv_freq, const struct moe_config *cfg)
{
    const int half = cfg->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        /* transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in fp32,
         * dim = the rotated part of a head */
        float expo = (float)(2 * i) / (float)cfg->rope_dim;
        inv_freq[i] = 1.0f / powf(cfg->rope_theta, expo);
    }
    if (cfg->rope_type == MOE_ROPE_YARN) {
        yarn_freqs(inv_freq, cfg);
    } else if (cfg->rope_type == MOE_ROPE_LINEAR) {
        for (int i = 0; i < half; i++) inv_freq[i] /= cfg->rope_factor;
    } else if (cfg->rope_type == MOE_ROPE_LLAMA3) {
        /* Llama 3.1: long wavelengths divided by factor, short ones kept,
         * a smooth interpolation between. */
        const double old_ctx = cfg->rope_original_max_pos;
        const double lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
        const double factor = cfg->rope_factor;
        const double low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
        for (int i = 0; i < half; i++) {
            float f = inv_freq[i];
            float wavelen = 2.0f * (float)M_PI / f;
            if (wavelen > low_wavelen) {
                inv_freq[i] = f / (float)factor;
            } else if (hi > lo && wavelen >= high_wavelen) {
                float smooth = (float)((old_ctx / wavelen - lo) / (hi - lo));
                inv_freq[i] = (1.0f - smooth) * f / (float)factor + smooth * f;
            }
        }
    }
}

static void rope_row(float *x, const int32_t *pos, int t, int H, int Dh, int half, const float *inv_freq)
{
    for (int i = 0; i < half; i++) {
        float angle = (float)pos[t] * inv_freq[i];
        float c = cosf(angle), s = sinf(angle);
        for (int h = 0; h < H; h++) {
            float *v = x + ((size_t)t * H + h) * Dh;
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

void moe_attention_rope_cpu(float *x, const int32_t *pos, int T, int H, int Dh, int rot,
                            const float *inv_freq)
{
    if (!moe_par_worth((size_t)T * H * Dh, 65536)) {
        for (int t = 0; t < T; t++) rope_row(x, pos, t, H, Dh, rot / 2, inv_freq);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) rope_row(x, pos, t, H, Dh, rot / 2, inv_freq);
}

/* Writes token row x (Hkv heads of Dh values) into slot `slot` of a
 * layer's plane: each head's row at its moe_kv_row, in the cache's dtype;
 * fp8 caches one scaled row each (kvcache.h), its scale in `scales` at
 * the row's index. */
static void kv_store_token(char *dst, float *scales, const float *x, const struct moe_kvcache *kv, size_t slot)
{
    const size_t Dh = (size_t)kv->head_dim, es = moe_dtype_size(kv->dtype);
    for (int h = 0; h < kv->n_kv_heads; h++) {
        const size_t r = moe_kv_row(slot, (size_t)kv->block_size, (size_t)kv->n_kv_heads, (size_t)h);
        if (kv->dtype == MOE_DTYPE_F8E4M3)
            scales[r] = moe_kvcache_fp8_quantize_row((uint8_t *)dst + r * Dh, x + (size_t)h * Dh, Dh);
        else
            moe_convert_from_f32(dst + r * Dh * es, x + (size_t)h * Dh, kv->dtype, Dh);
    }
}

void moe_attention_kv_store_cpu(struct moe_kvcache *kv, int layer, const float *k,
                                const float *v, const int32_t *slots, int T)
{
    const size_t row = (size_t)kv->n_kv_heads * kv->head_dim, es = moe_dtype_size(kv->dtype);
    char *kl = (char *)kv->k + (size_t)layer * kv->layer_elems * es;
    char *vl = (char *)kv->v + (size_t)layer * kv->layer_elems * es;
    const size_t so = (size_t)layer * kv->layer_rows;
    float *ks = kv->ks ? kv->ks + so : NULL, *vs = kv->vs ? kv->vs + so : NULL;
    for (int t = 0; t < T; t++) {
        MOE_ASSERT(slots[t] >= 0 && (size_t)slots[t] * row < kv->layer_elems);
        kv_store_token(kl, ks, k + (size_t)t * row, kv, (size_t)slots[t]);
        if (vl != kl) /* MLA: one row serves as K and V (v == k) */
            kv_store_token(vl, vs, v + (size_t)t * row, kv, (size_t)slots[t]);
    }
}

void moe_attention_paged_cpu(float *out, const float *q, const struct moe_kvcache *kv,
                             const struct moe_batch *b, const struct moe_attn_params *p,
                             float *scratch)
{
    const int Hq = p->n_heads, Hkv = p->n_kv_heads, Dh = p->head_dim, G = Hq / Hkv;
    const int B = kv->block_size;
    const size_t es = moe_dtype_size(kv->dtype);
    const bool f32 = kv->dtype == MOE_DTYPE_F32;
    const char *kl = (const char *)kv->k + (size_t)p->layer * kv->layer_elems * es;
    const char *vl = (const char *)kv->v + (size_t)p->layer * kv->layer_elems * es;
    const float *ksl = kv->ks ? kv->ks + (size_t)p->layer * kv->layer_rows : NULL;
    const float *vsl = kv->vs ? kv->vs + (size_t)p->layer * kv->layer_rows : NULL;
    const size_t per_thread = moe_attention_scratch_floats(Hq, Hkv, Dh);
    const int T = b->n_tokens;

#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (T * Hkv > 1)
    for (int t = 0; t < T; t++) {
        for (int kh = 0; kh < Hkv; kh++) {
            float *m = scratch + (size_t)omp_get_thread_num() * per_thread;
            float *l = m + G, *acc = l + G, *kbuf = acc + (size_t)G * Dh, *vbuf = kbuf + Dh;
            const int s = b->seq_of[t], pos = b->positions[t];
            const int32_t *table = b->block_table + (size_t)s * b->max_blocks;
            const float *qg = q + (size_t)t * Hq * Dh + (size_t)kh * G * Dh;
            const int first = moe_attention_first_key(p, pos);
            const float scale = moe_attention_query_scale(p, pos);
            for (int g = 0; g < G; g++) { /* a sink is a key of value 0 */
                m[g] = p->sinks ? p->sinks[kh * G + g] : -INFINITY;
                l[g] = p->sinks ? 1.0f : 0.0f;
            }
            memset(acc, 0, (size_t)G * Dh * sizeof(float));
            const int32_t *sel = p->keys ? p->keys + (size_t)t * p->n_keys : NULL;
            const int n_it = sel ? p->n_keys : pos - first + 1;
            for (int it = 0; it < n_it; it++) {
                const int j = sel ? sel[it] : first + it;
                if (j < 0) break; /* a selection's end */
                const size_t slot = (size_t)table[j / B] * B + (size_t)(j % B);
                const size_t r = moe_kv_row(slot, (size_t)B, (size_t)Hkv, (size_t)kh), off = r * Dh * es;
                const float *kj = (const float *)(kl + off), *vj = (const float *)(vl + off);
                if (ksl) { /* fp8: the row's scale at its index */
                    moe_kvcache_fp8_row_f32(kbuf, (const uint8_t *)kl + off, ksl[r], (size_t)Dh);
                    moe_kvcache_fp8_row_f32(vbuf, (const uint8_t *)vl + off, vsl[r], (size_t)Dh);
                    kj = kbuf;
                    vj = vbuf;
                } else if (!f32) {
                    moe_convert_row_f32(kbuf, kl + off, kv->dtype, (size_t)Dh);
                    moe_convert_row_f32(vbuf, vl + off, kv->dtype, (size_t)Dh);
                    kj = kbuf;
                    vj = vbuf;
                }
                for (int g = 0; g < G; g++) {
                    float sc = moe_dot_f32(qg + (size_t)g * Dh, kj, Dh) * scale;
                    float mn = sc > m[g] ? sc : m[g];
                    float corr = expf(m[g] - mn), e = expf(sc - mn);
                    float *a = acc + (size_t)g * Dh;
                    for (int d = 0; d < Dh; d++) a[d] = a[d] * corr + e * vj[d];
                    l[g] = l[g] * corr + e;
                    m[g] = mn;
                }
            }
            for (int g = 0; g < G; g++) {
                float *o = out + (size_t)t * Hq * Dh + ((size_t)kh * G + g) * Dh;
                const float *a = acc + (size_t)g * Dh;
                for (int d = 0; d < Dh; d++) o[d] = a[d] / l[g];
            }
        }
    }
}
