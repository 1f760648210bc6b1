/* test_kv_fp8.c - the fp8 KV cache (kvcache.h: per-row scaled E4M3).
 *
 * The encoder rounds as torch's float32 -> float8_e4m3fn does, byte for
 * byte, ties and subnormals included, and a row's scale and bytes are
 * torch's amax / 448 and (x / scale).to(float8_e4m3fn)
 * (tests/fixtures/quant/kv_fp8.safetensors, made by
 * tests/reference/make_quant_fixtures.py); saturation and NaN follow the
 * rule of runtime/core/tensor.h.  Attention over an fp8 cache equals, bit for
 * bit, attention over an f32 cache holding the rows' dequantized values
 * (reference and fast kernels; the fast kernels widen the bytes in
 * registers, and so read f16 and bf16 caches, with the same equality), and stays within the error bound E4M3's
 * rounding allows of the f32 cache's result on the original values.
 * Storing a token's rows does not depend on what else is stored with it,
 * so a cache filled at once, in chunks or token by token holds the same
 * bytes and scales. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "runtime/backend/backend.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/model/safetensors.h"
#include "tests/testutil.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static const void *need(struct moe_safetensors *st, const char *name, enum moe_dtype dt, int64_t *n)
{
    const struct moe_st_tensor *t = moe_safetensors_find(st, name);
    cr_assert(t && t->dtype == dt, "kv_fp8 fixture: %s", name);
    *n = 1;
    for (int i = 0; i < t->ndim; i++) *n *= t->shape[i];
    return t->data;
}

static bool fast_kernels(void) { return moe_cpu_isa_detect() >= MOE_CPU_ISA_AVX2; }

Test(kv_fp8, encode_equals_torch)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/kv_fp8.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    int64_t n, nb, nf;
    const float *x = need(&st, "x", MOE_DTYPE_F32, &n);
    const uint8_t *want = need(&st, "e4m3", MOE_DTYPE_U8, &nb);
    const float *wantf = need(&st, "e4m3_f32", MOE_DTYPE_F32, &nf);
    cr_assert(n == nb && n == nf && n > 3000);
    int ties = 0, sub = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t got = moe_f32_to_e4m3(x[i]), m = got & 0x7f;
        const float back = moe_fp8_e4m3_to_f32(got), a = fabsf(x[i]), am = fabsf(back);
        ties += (m > 0 && (moe_fp8_e4m3_to_f32(m - 1) + am) / 2 == a) ||
                (m < 0x7e && (moe_fp8_e4m3_to_f32(m + 1) + am) / 2 == a);
        sub += (got & 0x78) == 0 && (got & 7);
        if (got != want[i] || bits(back) != bits(wantf[i])) {
            if (bad++ < 10)
                cr_expect_fail("x = %a (%g): byte 0x%02x (%g), torch 0x%02x (%g)", (double)x[i], (double)x[i],
                               got, (double)back, want[i], (double)wantf[i]);
        }
    }
    cr_expect_eq(bad, 0, "%d of %ld values round differently from torch", bad, (long)n);
    cr_expect(ties >= 200 && sub >= 200, "the fixture has %d exact ties and %d subnormal bytes", ties, sub);
    moe_safetensors_close(&st);
}

/* Past torch's range (which gives NaN from 480 on) the rule of tensor.h:
 * finite values saturate to +-448, NaN and infinities are NaN; every byte
 * but NaN encodes back to itself. */
Test(kv_fp8, encode_saturates_and_keeps_nan)
{
    const float big[] = {448.0f, 463.99f, 464.0f, 479.0f, 480.0f, 500.0f, 1e6f, 3e38f, FLT_MAX};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        cr_expect_eq(moe_f32_to_e4m3(big[i]), 0x7e, "%g", (double)big[i]);
        cr_expect_eq(moe_f32_to_e4m3(-big[i]), 0xfe, "-%g", (double)big[i]);
    }
    cr_expect_eq(moe_f32_to_e4m3(NAN), 0x7f);
    cr_expect_eq(moe_f32_to_e4m3(-NAN), 0xff);
    cr_expect_eq(moe_f32_to_e4m3(INFINITY), 0x7f);
    cr_expect_eq(moe_f32_to_e4m3(-INFINITY), 0xff);
    cr_expect_eq(moe_f32_to_e4m3(0.0f), 0x00);
    cr_expect_eq(moe_f32_to_e4m3(-0.0f), 0x80);
    cr_expect_eq(moe_f32_to_e4m3(ldexpf(1.0f, -10)), 0x00, "2^-10: a tie between 0 and 2^-9, to even");
    cr_expect_eq(moe_f32_to_e4m3(nextafterf(ldexpf(1.0f, -10), 1.0f)), 0x01);
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        cr_expect_eq(moe_f32_to_e4m3(moe_fp8_e4m3_to_f32((uint8_t)b)), b, "byte 0x%02x", b);
    }
}

/* The cache's rows: torch's scale amax / 448 and bytes (x / scale) as
 * float8_e4m3fn, for rows over 40 binades, a zero row, a row with 3e38
 * and a row of fp32 subnormals (a subnormal scale); read back as the
 * bytes' values times the scale, bit for bit, by both readers. */
Test(kv_fp8, rows_equal_torch)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/kv_fp8.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    int64_t n, ns, nq, nd;
    const float *rows = need(&st, "rows", MOE_DTYPE_F32, &n);
    const float *scale = need(&st, "rows_scale", MOE_DTYPE_F32, &ns);
    const uint8_t *want = need(&st, "rows_e4m3", MOE_DTYPE_U8, &nq);
    const float *deq = need(&st, "rows_dequant", MOE_DTYPE_F32, &nd);
    const int R = (int)ns, Dh = (int)(n / ns);
    cr_assert(R == 64 && Dh == 96 && nq == n && nd == n);
    uint8_t q[96];
    float d[96], f[96];
    for (int r = 0; r < R; r++) {
        const float s = moe_kvcache_fp8_quantize_row(q, rows + (size_t)r * Dh, (size_t)Dh);
        cr_expect_eq(bits(s), bits(scale[r]), "row %d: scale %a, torch %a", r, (double)s, (double)scale[r]);
        cr_expect(memcmp(q, want + (size_t)r * Dh, (size_t)Dh) == 0, "row %d: bytes differ from torch", r);
        moe_kvcache_fp8_row_f32(d, q, s, (size_t)Dh);
        if (fast_kernels()) moe_kv_fp8_row_fast(f, q, s, Dh);
        for (int i = 0; i < Dh; i++) {
            cr_expect_eq(bits(d[i]), bits(deq[(size_t)r * Dh + i]), "row %d value %d", r, i);
            if (fast_kernels()) cr_expect_eq(bits(f[i]), bits(d[i]), "fast row %d value %d", r, i);
        }
    }
    moe_safetensors_close(&st);
}

/* A NaN or an infinity in a row reads back as NaN (as an f32 cache would
 * hand it to the attention), the row's other values keep a scale from
 * the finite ones; rows of zeros, of NaN only, or too small for a normal
 * scale store zero bytes and a zero scale. */
Test(kv_fp8, non_finite_values_read_back_as_nan)
{
    enum { N = 19 }; /* two vectors of 8 and a tail */
    float x[N], d[N], f[N];
    tu_fill_uniform(x, N, 5, -3, 3);
    x[2] = NAN;
    x[9] = INFINITY;
    x[17] = -INFINITY;
    x[0] = 3.0f;
    uint8_t q[N];
    const float s = moe_kvcache_fp8_quantize_row(q, x, N);
    cr_expect_eq(s, 3.0f / 448.0f);
    cr_expect(q[2] == 0x7f && q[9] == 0x7f && q[17] == 0xff);
    moe_kvcache_fp8_row_f32(d, q, s, N);
    if (fast_kernels()) moe_kv_fp8_row_fast(f, q, s, N);
    else memcpy(f, d, sizeof f);
    for (int i = 0; i < N; i++) {
        const bool nan = i == 2 || i == 9 || i == 17;
        cr_expect(nan ? isnan(d[i]) && isnan(f[i]) : fabsf(d[i] - x[i]) <= 0x1p-4f * fabsf(x[i]) + 0x1p-10f * s,
                  "value %d: %g (fast %g) for %g", i, (double)d[i], (double)f[i], (double)x[i]);
        if (!nan) cr_expect_eq(bits(f[i]), bits(d[i]));
    }
    const float zero[4] = {0.0f, -0.0f, 0.0f, 0.0f}, tiny[4] = {1e-44f, -1e-44f, 0.0f, 1e-45f};
    const float nans[4] = {NAN, NAN, INFINITY, NAN};
    const float *cases[] = {zero, tiny, nans};
    for (int c = 0; c < 3; c++) {
        cr_expect_eq(moe_kvcache_fp8_quantize_row(q, cases[c], 4), 0.0f, "case %d: scale 0", c);
        for (int i = 0; i < 4; i++) cr_expect_eq(q[i], c == 2 ? 0x7f : 0, "case %d value %d", c, i);
    }
}

/* ---- attention over an fp8 cache ---- */

enum { L = 2, Hq = 14, Hkv = 2, Dh = 36, B = 5, S = 41, NB = 16, ROW = Hkv * Dh };

struct att_case {
    struct moe_backend be;
    struct moe_config cfg;
    int32_t table[NB], slots[S], pos[S], seq_of[S], seq_start[2], ctx;
    float q[S * Hq * Dh], k[S * ROW], v[S * ROW];
    float scratch[1 << 17]; /* per thread: 385 floats (fast), 338 (reference) */
};

static void case_init(struct att_case *c)
{
    memset(c, 0, sizeof *c);
    cr_assert_eq(moe_backend_cpu_init(&c->be, 1), MOE_OK);
    c->cfg = (struct moe_config){.n_layers = L, .n_kv_heads = Hkv, .head_dim = Dh, .n_heads = Hq};
    const int32_t table[] = {9, 2, 14, 0, 7, 11, 3, 5, 12}; /* scrambled blocks */
    memcpy(c->table, table, sizeof table);
    for (int t = 0; t < S; t++) {
        c->pos[t] = t;
        c->slots[t] = c->table[t / B] * B + t % B;
    }
    c->seq_start[1] = c->ctx = S;
    tu_fill_uniform(c->q, sizeof c->q / 4, 31, -1, 1);
    tu_fill_uniform(c->k, sizeof c->k / 4, 32, -2, 2);
    tu_fill_uniform(c->v, sizeof c->v / 4, 33, -1, 1);
    for (int i = 0; i < S * ROW; i += 7) c->k[i] *= 8.0f; /* a spread of magnitudes in each row */
}

/* out (S, Hq*Dh): layer 1 of a cache of dt holding k, v (stored in chunks
 * of `chunk` tokens), attended by the reference or the fast kernel; the
 * cache is kept in *keep when given (the caller frees it). */
static void attend(struct att_case *c, float *out, enum moe_dtype dt, bool fast, const float *k,
                   const float *v, int window, int chunk, struct moe_kvcache *keep)
{
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&c->be), &c->cfg, NB, B, dt, false), MOE_OK, "%s", moe_last_error());
    for (int t0 = 0; t0 < S; t0 += chunk) {
        const int n = S - t0 < chunk ? S - t0 : chunk;
        moe_attention_kv_store_cpu(&kv, 1, k + (size_t)t0 * ROW, v + (size_t)t0 * ROW, c->slots + t0, n);
    }
    int32_t rows[1] = {0};
    struct moe_batch b = {.n_tokens = S, .n_seqs = 1, .positions = c->pos, .seq_of = c->seq_of,
                          .seq_start = c->seq_start, .ctx_len = &c->ctx, .block_table = c->table,
                          .max_blocks = 9, .slot = c->slots, .logit_rows = rows};
    struct moe_attn_params p = {1, Hq, Hkv, Dh, 1.0f / sqrtf(Dh), window, S, NULL, 0, 0, 0.0f, NULL, 0};
    const size_t per = moe_attention_fast_scratch(Hq / Hkv, Dh);
    cr_assert(per * (size_t)omp_get_max_threads() <= sizeof c->scratch / 4);
    if (fast) moe_attention_paged_fast(moe_cpu_isa_detect(), out, c->q, &kv, &b, &p, c->scratch, per);
    else moe_attention_paged_cpu(out, c->q, &kv, &b, &p, c->scratch);
    if (keep) *keep = kv;
    else moe_kvcache_free(&kv);
}

/* Each (token, KV head) row of x quantized and read back. */
static void dequantize_rows(float *dst, const float *x, int n_rows)
{
    uint8_t qb[Dh];
    for (int r = 0; r < n_rows; r++) {
        const float s = moe_kvcache_fp8_quantize_row(qb, x + (size_t)r * Dh, Dh);
        moe_kvcache_fp8_row_f32(dst + (size_t)r * Dh, qb, s, Dh);
    }
}

/* G = 7 heads per KV head: the fast kernels' register blocks of 4, 2 and
 * 1 heads; Dh = 36: a block of 16, one of 8 and a tail of 4. */
static void check_exact(bool fast, int window, enum moe_dtype dt)
{
    if (fast && !fast_kernels()) cr_skip_test("this processor runs no fast kernel set");
    static struct att_case c;
    case_init(&c);
    static float kd[S * ROW], vd[S * ROW], o8[S * Hq * Dh], o32[S * Hq * Dh];
    static uint16_t h[S * ROW];
    if (dt == MOE_DTYPE_F8E4M3) {
        dequantize_rows(kd, c.k, S * Hkv);
        dequantize_rows(vd, c.v, S * Hkv);
    } else { /* f16, bf16: the values rounded to dt */
        moe_convert_from_f32(h, c.k, dt, S * ROW);
        moe_convert_row_f32(kd, h, dt, S * ROW);
        moe_convert_from_f32(h, c.v, dt, S * ROW);
        moe_convert_row_f32(vd, h, dt, S * ROW);
    }
    attend(&c, o8, dt, fast, c.k, c.v, window, S, NULL);
    attend(&c, o32, MOE_DTYPE_F32, fast, kd, vd, window, S, NULL);
    cr_expect(memcmp(o8, o32, sizeof o8) == 0, "%s, %s, window %d: the cache differs from an f32 cache of "
              "its values (max rel err %.3g)", moe_dtype_name(dt), fast ? "fast" : "reference", window,
              tu_max_rel_err(o8, o32, (size_t)S * Hq * Dh));
    moe_backend_free(&c.be);
}

Test(kv_fp8, reference_attention_equals_f32_cache_of_its_values) { check_exact(false, 0, MOE_DTYPE_F8E4M3); }
Test(kv_fp8, fast_attention_equals_f32_cache_of_its_values) { check_exact(true, 0, MOE_DTYPE_F8E4M3); }
Test(kv_fp8, fast_sliding_attention_equals_f32_cache_of_its_values) { check_exact(true, 9, MOE_DTYPE_F8E4M3); }
Test(kv_fp8, fast_bf16_and_f16_attention_equal_f32_cache_of_their_values)
{
    check_exact(true, 0, MOE_DTYPE_BF16);
    check_exact(true, 9, MOE_DTYPE_F16);
}

/* A NaN in one key and one value of the cache: the fast kernel's output is
 * NaN exactly where the reference's is (every row that sees that token, in
 * that KV head's query heads), and equal elsewhere within tolerance. */
Test(kv_fp8, nan_in_cache_gives_nan_where_reference_does)
{
    if (!fast_kernels()) cr_skip_test("this processor runs no fast kernel set");
    static struct att_case c;
    case_init(&c);
    static float ofast[S * Hq * Dh], oref[S * Hq * Dh];
    c.k[7 * ROW + 3] = NAN;            /* token 7, KV head 0 */
    c.v[20 * ROW + Dh + 33] = -NAN;    /* token 20, KV head 1, in the Dh tail */
    attend(&c, ofast, MOE_DTYPE_F8E4M3, true, c.k, c.v, 0, S, NULL);
    attend(&c, oref, MOE_DTYPE_F8E4M3, false, c.k, c.v, 0, S, NULL);
    int nans = 0, bad = 0;
    for (size_t i = 0; i < (size_t)S * Hq * Dh; i++) {
        nans += isnan(oref[i]) != 0;
        bad += (isnan(oref[i]) != 0) != (isnan(ofast[i]) != 0) ||
               (!isnan(oref[i]) && fabsf(ofast[i] - oref[i]) > 1e-5f + 1e-5f * fabsf(oref[i]));
    }
    cr_expect(nans > 0 && bad == 0, "%d NaNs in the reference, %d elements differ", nans, bad);
    moe_backend_free(&c.be);
}

/* The bound of E4M3's rounding.  Each stored value x is off by at most
 * e(x) = max(2^-4 |x|, 2^-10 s) (s its row's scale; kvcache.h).  A score
 * q.k * scale moves by at most d_j = scale * sum_i |q_i| e(k_ji), so each
 * softmax weight by a factor within exp(+-2 max_j d_j); the output
 * sum_j p_j v_j then moves by at most (exp(2 max d) - 1) max|v| (weights)
 * plus max e(v) (values), plus fp32 rounding (1e-5). */
static void check_bound(bool fast)
{
    if (fast && !fast_kernels()) cr_skip_test("this processor runs no fast kernel set");
    static struct att_case c;
    case_init(&c);
    static float ek[S * ROW], ev[S * ROW], o8[S * Hq * Dh], o32[S * Hq * Dh];
    for (int r = 0; r < S * Hkv; r++) {
        float amk = 0, amv = 0;
        for (int i = 0; i < Dh; i++) {
            amk = fmaxf(amk, fabsf(c.k[r * Dh + i]));
            amv = fmaxf(amv, fabsf(c.v[r * Dh + i]));
        }
        for (int i = 0; i < Dh; i++) {
            ek[r * Dh + i] = fmaxf(0x1p-4f * fabsf(c.k[r * Dh + i]), 0x1p-10f * amk / 448.0f);
            ev[r * Dh + i] = fmaxf(0x1p-4f * fabsf(c.v[r * Dh + i]), 0x1p-10f * amv / 448.0f);
        }
    }
    attend(&c, o8, MOE_DTYPE_F8E4M3, fast, c.k, c.v, 0, S, NULL);
    attend(&c, o32, MOE_DTYPE_F32, fast, c.k, c.v, 0, S, NULL);
    double worst = 0, worst_err = 0;
    for (int t = 0; t < S; t++)
        for (int h = 0; h < Hq; h++) {
            const int kh = h / (Hq / Hkv);
            double dmax = 0, vmax = 0, evmax = 0;
            for (int j = 0; j <= t; j++) {
                double d = 0;
                for (int i = 0; i < Dh; i++) {
                    d += fabs(c.q[(t * Hq + h) * Dh + i]) * ek[(j * Hkv + kh) * Dh + i];
                    vmax = fmax(vmax, fabs(c.v[(j * Hkv + kh) * Dh + i]));
                    evmax = fmax(evmax, ev[(j * Hkv + kh) * Dh + i]);
                }
                dmax = fmax(dmax, d / sqrt(Dh));
            }
            const double bound = (exp(2 * dmax) - 1) * vmax + evmax + 1e-5;
            for (int i = 0; i < Dh; i++) {
                const size_t o = ((size_t)t * Hq + h) * Dh + i;
                const double err = fabs((double)o8[o] - o32[o]);
                cr_expect(err <= bound, "t=%d h=%d i=%d: |%g - %g| > bound %g", t, h, i, (double)o8[o],
                          (double)o32[o], bound);
                if (err / bound > worst) worst = err / bound;
                if (err > worst_err) worst_err = err;
            }
        }
    cr_log_info("%s: worst |fp8 - f32| %.3g, %.2f of its bound", fast ? "fast" : "reference", worst_err, worst);
    moe_backend_free(&c.be);
}

Test(kv_fp8, reference_attention_within_e4m3_bound_of_f32) { check_bound(false); }
Test(kv_fp8, fast_attention_within_e4m3_bound_of_f32) { check_bound(true); }

/* A token's rows quantize alone: a cache filled at once, in chunks of 5 or
 * token by token holds the same bytes and scales, so attention over it is
 * the same too (forward-pass chunking: tests/test_forward_kv8.c). */
Test(kv_fp8, store_does_not_depend_on_chunking)
{
    static struct att_case c;
    case_init(&c);
    static float base[S * Hq * Dh], out[S * Hq * Dh];
    struct moe_kvcache whole, part;
    attend(&c, base, MOE_DTYPE_F8E4M3, false, c.k, c.v, 0, S, &whole);
    for (int chunk = 1; chunk <= 5; chunk += 4) {
        attend(&c, out, MOE_DTYPE_F8E4M3, false, c.k, c.v, 0, chunk, &part);
        /* layer 1 (the one stored): E4M3 bytes, then the scales */
        const size_t n = whole.layer_elems, r = whole.layer_rows;
        cr_expect(memcmp((char *)whole.k + n, (char *)part.k + n, n) == 0 &&
                  memcmp((char *)whole.v + n, (char *)part.v + n, n) == 0, "chunks of %d: other bytes", chunk);
        cr_expect(memcmp(whole.ks + r, part.ks + r, r * 4) == 0 && memcmp(whole.vs + r, part.vs + r, r * 4) == 0,
                  "chunks of %d: other scales", chunk);
        cr_expect(memcmp(base, out, sizeof out) == 0, "chunks of %d: other attention", chunk);
        moe_kvcache_free(&part);
    }
    moe_kvcache_free(&whole);
    moe_backend_free(&c.be);
}

/* Sizes: Dh bytes and a 4-byte scale per row; MLA's one latent row has
 * one scale that K and V share. */
Test(kv_fp8, sizes_count_the_scales)
{
    struct moe_config cfg = {.n_layers = 3, .n_kv_heads = 2, .head_dim = 40, .n_heads = 4};
    cr_expect_eq(moe_config_kv_row_bytes(40, MOE_DTYPE_F8E4M3), 44u);
    cr_expect_eq(moe_config_kv_bytes_per_token(&cfg, MOE_DTYPE_F8E4M3), (size_t)2 * 3 * 2 * 44);
    cr_expect_eq(moe_config_kv_bytes_per_token(&cfg, MOE_DTYPE_F32), (size_t)2 * 3 * 2 * 160);
    cr_expect_eq(moe_kvcache_block_bytes(&cfg, 16, MOE_DTYPE_F8E4M3), (size_t)16 * 2 * 3 * 2 * 44);
    cr_expect_eq(moe_config_kv_row_bytes(40, MOE_DTYPE_F8E5M2), SIZE_MAX, "not a cache dtype");
    struct moe_config huge = cfg;
    huge.n_layers = 1 << 30, huge.n_kv_heads = 1 << 30, huge.head_dim = 1 << 30;
    cr_expect_eq(moe_config_kv_bytes_per_token(&huge, MOE_DTYPE_F8E4M3), SIZE_MAX, "overflow");
    struct moe_backend be;
    cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK);
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, 8, 16, MOE_DTYPE_F8E4M3, false), MOE_OK);
    cr_expect(kv.ks && kv.vs && kv.ks != kv.vs);
    cr_expect_eq(kv.layer_rows, (size_t)8 * 16 * 2);
    cr_expect_eq(moe_kvcache_bytes_per_slot(&kv), (size_t)2 * 3 * 2 * 44);
    moe_kvcache_free(&kv);
    cfg.kv_lora_rank = 32, cfg.n_kv_heads = 1;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, 8, 16, MOE_DTYPE_F8E4M3, false), MOE_OK);
    cr_expect(kv.v == kv.k && kv.vs == kv.ks, "MLA: one row, one scale");
    cr_expect_eq(moe_kvcache_bytes_per_slot(&kv), (size_t)3 * 44);
    moe_kvcache_free(&kv);
    cr_expect_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, 8, 16, MOE_DTYPE_F8E5M2, false), MOE_ERR_UNSUPPORTED);
    moe_backend_free(&be);
}
