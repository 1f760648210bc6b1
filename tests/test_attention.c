/* test_attention.c - RMSNorm, RoPE and paged attention against naive
 * definitions computed here in double precision. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "runtime/backend/backend.h"
#include "tests/testutil.h"

Test(attention, rmsnorm_matches_definition)
{
    enum { R = 3, D = 37 };
    float x[R * D], y[R * D], wv[D];
    tu_fill_uniform(x, R * D, 1, -2, 2);
    tu_fill_uniform(wv, D, 2, 0.5f, 1.5f);
    struct moe_tensor w = {.dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {D}, .data = wv};
    moe_attention_rmsnorm_cpu(y, x, &w, R, D, 1e-5f);
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[r * D + i] * x[r * D + i];
        double inv = 1.0 / sqrt(ss / D + 1e-5);
        for (int i = 0; i < D; i++)
            cr_assert_float_eq(y[r * D + i], wv[i] * x[r * D + i] * inv, 1e-5, "r=%d i=%d", r, i);
    }
}

Test(attention, rmsnorm_bf16_weight)
{
    enum { D = 8 };
    float x[D] = {1, 2, 3, 4, -1, -2, -3, -4}, y[D];
    uint16_t wb[D];
    for (int i = 0; i < D; i++) wb[i] = moe_f32_to_bf16(0.5f * (float)(i + 1));
    struct moe_tensor w = {.dtype = MOE_DTYPE_BF16, .ndim = 1, .shape = {D}, .data = wb};
    moe_attention_rmsnorm_cpu(y, x, &w, 1, D, 0.0f);
    double rms = sqrt(60.0 / 8.0);
    for (int i = 0; i < D; i++) cr_assert_float_eq(y[i], 0.5 * (i + 1) * x[i] / rms, 1e-6);
}

Test(attention, rope_rotates_pairs_half_apart)
{
    enum { H = 2, Dh = 8 };
    struct moe_config cfg = {.head_dim = Dh, .rope_dim = Dh, .rope_theta = 10000.0f,
                             .rope_type = MOE_ROPE_DEFAULT};
    float inv[Dh / 2], x[H * Dh], orig[H * Dh];
    moe_attention_rope_freqs(inv, &cfg);
    for (int i = 0; i < Dh / 2; i++) cr_assert_float_eq(inv[i], pow(10000.0, -2.0 * i / Dh), 1e-6);
    tu_fill_uniform(x, H * Dh, 3, -1, 1);
    memcpy(orig, x, sizeof x);
    int32_t pos = 7;
    moe_attention_rope_cpu(x, &pos, 1, H, Dh, Dh, inv);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < Dh / 2; i++) {
            double a = orig[h * Dh + i], b = orig[h * Dh + i + Dh / 2], th = 7.0 * inv[i];
            cr_assert_float_eq(x[h * Dh + i], a * cos(th) - b * sin(th), 1e-5);
            cr_assert_float_eq(x[h * Dh + i + Dh / 2], b * cos(th) + a * sin(th), 1e-5);
        }
}

/* partial_rotary_factor 0.5 (GLM-4.5): the first half of each head rotates
 * in quarters, with frequencies over that half; the second half passes. */
Test(attention, partial_rope_rotates_the_first_values_only)
{
    enum { H = 2, Dh = 16, R = 8 };
    struct moe_config cfg = {.head_dim = Dh, .rope_dim = R, .rope_theta = 10000.0f,
                             .rope_type = MOE_ROPE_DEFAULT};
    float inv[R / 2], x[H * Dh], orig[H * Dh];
    moe_attention_rope_freqs(inv, &cfg);
    for (int i = 0; i < R / 2; i++) cr_assert_float_eq(inv[i], pow(10000.0, -2.0 * i / R), 1e-6);
    tu_fill_uniform(x, H * Dh, 4, -1, 1);
    memcpy(orig, x, sizeof x);
    int32_t pos = 11;
    moe_attention_rope_cpu(x, &pos, 1, H, Dh, R, inv);
    for (int h = 0; h < H; h++) {
        for (int i = 0; i < R / 2; i++) {
            double a = orig[h * Dh + i], b = orig[h * Dh + i + R / 2], th = 11.0 * inv[i];
            cr_assert_float_eq(x[h * Dh + i], a * cos(th) - b * sin(th), 1e-5);
            cr_assert_float_eq(x[h * Dh + i + R / 2], b * cos(th) + a * sin(th), 1e-5);
        }
        for (int i = R; i < Dh; i++) cr_assert_eq(x[h * Dh + i], orig[h * Dh + i]);
    }
}

Test(attention, llama3_rope_scaling_bands)
{
    struct moe_config cfg = {.head_dim = 16, .rope_dim = 16, .rope_theta = 10000.0f, .rope_type = MOE_ROPE_LLAMA3,
                             .rope_factor = 8, .rope_low_freq_factor = 1,
                             .rope_high_freq_factor = 4, .rope_original_max_pos = 64};
    float inv[8];
    moe_attention_rope_freqs(inv, &cfg);
    /* values transformers computes for this configuration */
    const double want[8] = {1.0, 0.244385, 0.0130423, 0.00395285, 0.00125, 3.95285e-4, 1.25e-4,
                            3.95285e-5};
    for (int i = 0; i < 8; i++) cr_assert_float_eq(inv[i], want[i], want[i] * 1e-5, "i=%d", i);
}

/* Paged attention over a scrambled block table equals naive causal GQA
 * attention over contiguous K/V. */
static void check_paged_sinks(int window, enum moe_dtype dt, bool sinks)
{
    enum { L = 1, Hq = 6, Hkv = 2, Dh = 8, B = 3, S = 13, NB = 16 };
    struct moe_config cfg = {.n_layers = L, .n_kv_heads = Hkv, .head_dim = Dh, .n_heads = Hq};
    struct moe_backend be;
    cr_assert_eq(moe_backend_cpu_init(&be, 0), MOE_OK);
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, NB, B, dt, false), MOE_OK);
    float q[S * Hq * Dh], k[S * Hkv * Dh], v[S * Hkv * Dh], out[S * Hq * Dh];
    tu_fill_uniform(q, sizeof q / 4, 11, -1, 1);
    tu_fill_uniform(k, sizeof k / 4, 12, -1, 1);
    tu_fill_uniform(v, sizeof v / 4, 13, -1, 1);
    int32_t table[5] = {9, 2, 14, 0, 7}; /* scrambled blocks */
    int32_t slots[S], pos[S], seq_of[S], seq_start[2] = {0, S}, ctx = S, rows[1] = {0};
    for (int t = 0; t < S; t++) {
        pos[t] = t;
        seq_of[t] = 0;
        slots[t] = table[t / B] * B + t % B;
    }
    moe_attention_kv_store_cpu(&kv, 0, k, v, slots, S);
    struct moe_batch b = {.n_tokens = S, .n_seqs = 1, .positions = pos, .seq_of = seq_of,
                          .seq_start = seq_start, .ctx_len = &ctx, .block_table = table,
                          .max_blocks = 5, .slot = slots, .logit_rows = rows};
    float sink[Hq];
    tu_fill_uniform(sink, Hq, 14, -1, 3);
    struct moe_attn_params p = {0, Hq, Hkv, Dh, 1.0f / sqrtf(Dh), window, 0, sinks ? sink : NULL, 0, 0, 0.0f, NULL, 0};
    float *scratch = calloc(64 * 64, sizeof(float));
    moe_attention_paged_cpu(out, q, &kv, &b, &p, scratch);
    for (int t = 0; t < S; t++)
        for (int h = 0; h < Hq; h++) {
            int kh = h / (Hq / Hkv);
            int first = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
            double sc[S], mx = -1e30, z = 0;
            for (int j = first; j <= t; j++) {
                double d = 0;
                for (int i = 0; i < Dh; i++) d += (double)q[(t * Hq + h) * Dh + i] * k[(j * Hkv + kh) * Dh + i];
                sc[j] = d / sqrt(Dh);
                if (sc[j] > mx) mx = sc[j];
            }
            if (sinks && sink[h] > mx) mx = sink[h];
            for (int j = first; j <= t; j++) z += exp(sc[j] - mx);
            if (sinks) z += exp(sink[h] - mx); /* transformers: a column of the softmax, dropped */
            for (int i = 0; i < Dh; i++) {
                double o = 0;
                for (int j = first; j <= t; j++) o += exp(sc[j] - mx) / z * v[(j * Hkv + kh) * Dh + i];
                /* f16/bf16 storage rounds K and V: 2^-11 / 2^-8 relative */
                double tol = dt == MOE_DTYPE_F32 ? 1e-5 : dt == MOE_DTYPE_F16 ? 2e-3 : 2e-2;
                cr_assert_float_eq(out[(t * Hq + h) * Dh + i], o, tol, "t=%d h=%d i=%d", t, h, i);
            }
        }
    free(scratch);
    moe_kvcache_free(&kv);
    moe_backend_free(&be);
}

static void check_paged(int window, enum moe_dtype dt) { check_paged_sinks(window, dt, false); }

Test(attention, paged_matches_naive_contiguous) { check_paged(0, MOE_DTYPE_F32); }
Test(attention, paged_sinks_match_naive) { check_paged_sinks(0, MOE_DTYPE_F32, true); }
Test(attention, paged_sinks_sliding_bf16_match_naive) { check_paged_sinks(3, MOE_DTYPE_BF16, true); }
Test(attention, paged_sliding_window_matches_naive) { check_paged(4, MOE_DTYPE_F32); }
Test(attention, paged_f16_cache_matches_naive) { check_paged(0, MOE_DTYPE_F16); }
Test(attention, paged_bf16_cache_matches_naive) { check_paged(3, MOE_DTYPE_BF16); }
