/* test_quant_fp8.c - block-scaled FP8 weights (MOE_DTYPE_FP8_B128: the
 * DeepSeek-V3 / Qwen3-FP8 checkpoint format).  Every E4M3 byte converts as
 * torch converts it, rows packed from a checkpoint's weight and
 * weight_scale_inv dequantize to transformers' values bit for bit
 * (tests/fixtures/quant/fp8.safetensors, made by
 * tests/reference/make_quant_fixtures.py), every kernel set multiplies them
 * as those values, a row's outputs do not depend on the batch, and NaN
 * bytes and bad scales are refused.  The loader (runtime/model/model_fp8.c) binds
 * the fixtures' checkpoints per expert and stacked alike, refuses what is
 * not the format by name, and the CPU backends read the rows in place
 * (tests/test_forward.c compares the fp8 fixtures with transformers). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/model/model_impl.h"
#include "runtime/engine/runner.h"
#include "runtime/model/safetensors.h"
#include "tests/quant_test.h"
#include "tests/testutil.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

Test(quant_fp8, dtype)
{
    enum moe_dtype dt;
    cr_expect_str_eq(moe_dtype_name(MOE_DTYPE_FP8_B128), "FP8_B128");
    cr_expect_not(moe_dtype_parse("FP8_B128", &dt), "a storage format of the runtime, not a file dtype");
    cr_expect(moe_dtype_parse("F8_E4M3", &dt) && dt == MOE_DTYPE_F8E4M3, "the checkpoint's own dtype");
    cr_expect_eq(moe_dtype_size(MOE_DTYPE_FP8_B128), 1);
    cr_expect_eq(moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, 7168), 56 * 132, "DeepSeek-V3's hidden size");
    cr_expect(moe_fp8_scale_ok(0.0f) && moe_fp8_scale_ok(1e-40f) && moe_fp8_scale_ok(3e38f) &&
              moe_fp8_scale_ok(-2.0f));
    cr_expect(!moe_fp8_scale_ok(NAN) && !moe_fp8_scale_ok(INFINITY) && !moe_fp8_scale_ok(-INFINITY));
}

/* All 256 bytes: the bits torch's float8_e4m3fn -> float32 gives (NaN for
 * 0x7F and 0xFF, the only NaNs; -0 for 0x80; subnormals m * 2^-9). */
Test(quant_fp8, e4m3_bytes_equal_torch)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/fp8.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    const struct moe_st_tensor *b = moe_safetensors_find(&st, "e4m3"), *f = moe_safetensors_find(&st, "e4m3_f32");
    cr_assert(b && f && b->dtype == MOE_DTYPE_F8E4M3 && b->shape[0] == 256);
    int nans = 0;
    for (int i = 0; i < 256; i++) {
        const uint8_t byte = ((const uint8_t *)b->data)[i];
        const float want = ((const float *)f->data)[i], got = moe_fp8_e4m3_to_f32(byte);
        cr_assert_eq(byte, i);
        if (isnan(want)) {
            cr_expect(isnan(got), "byte 0x%02x: %g, torch NaN", i, got);
            nans++;
            continue;
        }
        cr_expect_eq(bits(got), bits(want), "byte 0x%02x: %g (0x%08x), torch %g (0x%08x)", i, got, bits(got),
                     want, bits(want));
    }
    cr_expect_eq(nans, 2);
    cr_expect_eq(moe_fp8_e4m3_to_f32(0x7e), 448.0f);
    cr_expect_eq(moe_fp8_e4m3_to_f32(0x01), ldexpf(1.0f, -9));
    cr_expect_eq(bits(moe_fp8_e4m3_to_f32(0x80)), 0x80000000u);
    moe_safetensors_close(&st);
}

/* The scale row of row n of a checkpoint weight (K columns), as f32. */
static void scale_row(float *dst, const struct moe_st_tensor *s, int n)
{
    const size_t cols = (size_t)s->shape[1];
    const char *src = (const char *)s->data + (size_t)(n / MOE_FP8_BLOCK) * cols * moe_dtype_size(s->dtype);
    moe_convert_row_f32(dst, src, s->dtype, cols);
}

/* Each row of the fixture's matrices, packed from its bytes and its scale
 * row, dequantizes to transformers' value bit for bit (its last row group
 * shorter than 128 rows too; infinities, subnormals and zero scales
 * included); a NaN byte or a scale that is not finite is refused. */
Test(quant_fp8, rows_equal_transformers)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, FIXTURE_DIR "/quant/fp8.safetensors"), MOE_OK, "%s",
                 moe_last_error());
    const char *names[] = {"a", "b", "c", "d"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char ns[32], nd[32];
        snprintf(ns, sizeof ns, "%s_scale_inv", names[i]);
        snprintf(nd, sizeof nd, "%s_dequant", names[i]);
        const struct moe_st_tensor *q = moe_safetensors_find(&st, names[i]), *s = moe_safetensors_find(&st, ns),
                                   *dq = moe_safetensors_find(&st, nd);
        cr_assert(q && s && dq, "%s: tensors missing", names[i]);
        const int N = (int)q->shape[0], K = (int)q->shape[1], G = K / MOE_FP8_BLOCK;
        cr_assert(q->dtype == MOE_DTYPE_F8E4M3 && s->ndim == 2 && s->shape[0] == (N + 127) / 128 &&
                  s->shape[1] == G);
        const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, (size_t)K);
        unsigned char *row = malloc(rb);
        uint8_t *bad = malloc((size_t)K);
        float *got = malloc((size_t)K * sizeof(float)), sc[8];
        for (int n = 0; n < N; n++) {
            const uint8_t *qr = (const uint8_t *)q->data + (size_t)n * K;
            const float *want = (const float *)dq->data + (size_t)n * K;
            scale_row(sc, s, n);
            cr_assert(moe_fp8_pack_row(row, qr, sc, (size_t)K));
            for (int g = 0; g < G; g++) {
                float stored;
                memcpy(&stored, row + (size_t)g * MOE_FP8_BYTES, 4);
                cr_expect_eq(bits(stored), bits(sc[g]), "%s row %d block %d: scale", names[i], n, g);
                cr_expect(memcmp(row + (size_t)g * MOE_FP8_BYTES + 4, qr + g * MOE_FP8_BLOCK, MOE_FP8_BLOCK) == 0);
            }
            moe_convert_row_f32(got, row, MOE_DTYPE_FP8_B128, (size_t)K);
            for (int k = 0; k < K; k++) {
                cr_assert_eq(bits(got[k]), bits(want[k]), "%s row %d element %d: %g (0x%08x), transformers %g "
                             "(0x%08x)", names[i], n, k, got[k], bits(got[k]), want[k], bits(want[k]));
                cr_assert_eq(bits(moe_fp8_get(row, (size_t)k)), bits(want[k]), "%s row %d element %d: "
                             "moe_fp8_get", names[i], n, k);
            }
        }
        /* NaN bytes, wherever they are, and scales that are not finite */
        for (int k = 0; k < K; k += 37) {
            memcpy(bad, q->data, (size_t)K);
            scale_row(sc, s, 0);
            bad[k] = k % 2 ? 0x7f : 0xff;
            cr_expect_not(moe_fp8_pack_row(row, bad, sc, (size_t)K), "%s: NaN byte at %d", names[i], k);
        }
        for (int g = 0; g < G; g++) {
            const float nf[] = {NAN, INFINITY, -INFINITY};
            for (int j = 0; j < 3; j++) {
                scale_row(sc, s, 0);
                sc[g] = nf[j];
                cr_expect_not(moe_fp8_pack_row(row, q->data, sc, (size_t)K), "%s: scale %g in block %d",
                              names[i], nf[j], g);
            }
        }
        free(row);
        free(bad);
        free(got);
    }
    moe_safetensors_close(&st);
}

/* (N, Din) random FP8 weights (new memory): random bytes (never NaN) and
 * scales 2^[emin, emax] times [1, 2), every seventh block's scale
 * subnormal when with_tiny.  The dequantized rows into *f32 (new memory). */
static void *fp8_weights(int N, int Din, uint64_t seed, int emin, int emax, bool with_tiny, float **f32)
{
    const int G = Din / MOE_FP8_BLOCK;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, (size_t)Din);
    uint8_t *q = malloc((size_t)Din);
    float sc[64];
    cr_assert(G <= 64);
    unsigned char *w = malloc((size_t)N * rb);
    *f32 = malloc((size_t)N * Din * sizeof(float));
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < Din; k++) {
            q[k] = (uint8_t)tu_rand_u64(&seed);
            if ((q[k] & 0x7f) == 0x7f) q[k] ^= 1;
        }
        for (int g = 0; g < G; g++) {
            const int e = emin + (int)(tu_rand_u64(&seed) % (uint64_t)(emax - emin + 1));
            sc[g] = ldexpf(tu_rand_uniform(&seed, 1.0f, 2.0f), e);
            if (with_tiny && (n * G + g) % 7 == 3) sc[g] = 3e-39f;
        }
        cr_assert(moe_fp8_pack_row(w + (size_t)n * rb, q, sc, (size_t)Din));
        moe_convert_row_f32(*f32 + (size_t)n * Din, w + (size_t)n * rb, MOE_DTYPE_FP8_B128, (size_t)Din);
    }
    free(q);
    return w;
}

/* The GPU's planes (moe_planes_from_rows) hold each row's bytes and f32
 * scales where runtime/core/tensor.h says: read back by that description (and
 * by the kernels' decoding, moe_e4m3x2_half_bits: the byte as a half times
 * 2^8), every value is the row's dequantized value, bit for bit. */
Test(quant_fp8, planes_hold_each_value)
{
    const int N = 3, Din = 256;
    float *wf;
    void *w = fp8_weights(N, Din, 78, -20, 4, true, &wf);
    const size_t vb = moe_planes_values_bytes(MOE_DTYPE_FP8_B128, N, Din);
    cr_assert_eq(vb, (size_t)N * Din);
    cr_assert_eq(moe_planes_scales_bytes(MOE_DTYPE_FP8_B128, N, Din), (size_t)N * Din / 128 * 4);
    uint8_t *v = malloc(vb);
    float *sc = malloc((size_t)N * Din / 128 * sizeof(float));
    moe_planes_from_rows(MOE_DTYPE_FP8_B128, w, N, Din, v, sc);
    for (int r = 0; r < N; r++)
        for (int k = 0; k < Din; k++) {
            const uint8_t b = v[(size_t)r * Din + k];
            const float s = sc[r * Din / 128 + k / 128], want = wf[(size_t)r * Din + k];
            const float got = moe_fp8_e4m3_to_f32(b) * s;
            /* the kernels: the half's value times 2^8 (exact), then the scale */
            const float half = moe_f16_to_f32((uint16_t)moe_e4m3x2_half_bits(b)) * 256.0f * s;
            cr_assert(tu_same_bits(got, want) && tu_same_bits(half, want), "row %d value %d: %g %g, want %g",
                      r, k, got, half, want);
        }
    for (unsigned b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue; /* NaN: refused at load */
        const uint32_t h = moe_e4m3x2_half_bits(b << 16 | 0xff00ff00u | (b ^ 0x80));
        cr_assert(tu_same_bits(moe_f16_to_f32((uint16_t)(h >> 16)) * 256.0f, moe_fp8_e4m3_to_f32((uint8_t)b)) &&
                      tu_same_bits(moe_f16_to_f32((uint16_t)h) * 256.0f, moe_fp8_e4m3_to_f32((uint8_t)(b ^ 0x80))),
                  "byte 0x%02x", b);
    }
    free(v), free(sc), free(w), free(wf);
}

/* Every kernel set this processor runs (the reference, AVX2, AVX-512)
 * multiplies FP8 weights as an fp32 product over the dequantized values
 * (the reference: bit for bit, it sums in the same order; the fast sets:
 * to 1e-5 of the largest output), and a row's outputs are the same bits in
 * a batch of any size. */
Test(quant_fp8, gemm_matches_dequantized_f32)
{
    const int Ns[] = {1, 5, 13, 50, 97}, Ds[] = {128, 256, 384, 1024};
    for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
        for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++) {
            float *wf;
            void *w = fp8_weights(Ns[b], Ds[c], (uint64_t)(Ns[b] * 7 + Ds[c]), -12, -4, true, &wf);
            qt_check_gemm("fp8", w, wf, MOE_DTYPE_FP8_B128, Ns[b], Ds[c]);
            free(w);
            free(wf);
        }
}

/* One-hot input rows pick single weights: every kernel set, on every path
 * (decode tiles, batch tiles, rows widened for a block), gives each
 * dequantized weight exactly, so the byte order, the E4M3 widening
 * (subnormals included) and the scale (from 2^-126 to 2^100, and
 * subnormal) are the reference's. */
Test(quant_fp8, kernels_widen_exactly)
{
    const int Ns[] = {3, 13, 50}, Ds[] = {128, 384};
    for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
        for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++) {
            float *wf;
            void *w = fp8_weights(Ns[b], Ds[c], (uint64_t)(Ns[b] * 3 + Ds[c]), -126, 100, true, &wf);
            qt_check_widening(w, wf, MOE_DTYPE_FP8_B128, Ns[b], Ds[c]);
            free(w);
            free(wf);
        }
}

Test(quant_fp8, is_not_written_to_safetensors)
{
    unsigned char row[MOE_FP8_BYTES] = {0};
    struct moe_st_tensor t = {.name = "w", .dtype = MOE_DTYPE_FP8_B128, .ndim = 2, .shape = {1, 128},
                              .data = row, .nbytes = sizeof row};
    const struct moe_st_tensor *list[] = {&t};
    char path[] = "/tmp/moerun_fp8_XXXXXX";
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_expect_neq(moe_safetensors_write(path, list, 1, NULL), MOE_OK);
    cr_expect(strstr(moe_last_error(), "bad dtype"), "%s", moe_last_error());
    unlink(path);
}

/* ---- loading (runtime/model/model_fp8.c) ---- */

#define L0 "model.layers.0."

Test(quant_fp8, nan_bytes_and_bad_scales_are_refused_at_load)
{
    struct moe_model h;
    qt_copy_fixture(&h, "qwen3_moe_fp8", NULL);
    ((uint8_t *)qt_data_of(&h, L0 "mlp.experts.3.down_proj.weight"))[5 * 128 + 17] = 0xff;
    qt_expect_refused(&h, MOE_ERR_FORMAT, "'" L0 "mlp.experts.3.down_proj.weight' holds a NaN (byte 0xff)",
                   "row 5, column 17");
    qt_copy_fixture(&h, "deepseek_v3_fp8", NULL); /* kv_b_proj, dequantized to F32, too */
    ((uint8_t *)qt_data_of(&h, L0 "self_attn.kv_b_proj.weight"))[200 * 128 + 3] = 0x7f;
    qt_expect_refused(&h, MOE_ERR_FORMAT, "kv_b_proj.weight' holds a NaN (byte 0x7f)", "row 200, column 3");
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        qt_copy_fixture(&h, "qwen3_moe_fp8", NULL);
        ((float *)qt_data_of(&h, L0 "self_attn.o_proj.weight_scale_inv"))[1] = bad[i];
        qt_expect_refused(&h, MOE_ERR_FORMAT, "'" L0 "self_attn.o_proj.weight_scale_inv' holds a scale that is "
                       "not finite", "element 1");
    }
}

Test(quant_fp8, scales_missing_or_of_the_wrong_shape_or_dtype_are_refused)
{
    struct moe_model h;
    qt_copy_fixture(&h, "qwen3_moe_fp8", L0 "self_attn.k_proj.weight_scale_inv");
    qt_expect_refused(&h, MOE_ERR_FORMAT, "'" L0 "self_attn.k_proj.weight' is F8_E4M3 but its scales '" L0
                   "self_attn.k_proj.weight_scale_inv' are missing", NULL);
    /* q_proj (128, 256): scales (1, 2); (2, 2) and (1, 2, 1) are refused */
    const int64_t shapes[][3] = {{2, 2, 0}, {1, 2, 1}};
    for (int i = 0; i < 2; i++) {
        qt_copy_fixture(&h, "qwen3_moe_fp8", L0 "self_attn.q_proj.weight_scale_inv");
        cr_assert_eq(moe_safetensors_add(&h.st, L0 "self_attn.q_proj.weight_scale_inv", MOE_DTYPE_F32, i ? 3 : 2,
                                         shapes[i], calloc(4, sizeof(float))), MOE_OK);
        qt_expect_refused(&h, MOE_ERR_FORMAT, "q_proj.weight_scale_inv' has shape", "expected (1, 2) (blocks of 128 "
                       "x 128 over '" L0 "self_attn.q_proj.weight' (128, 256))");
    }
    qt_copy_fixture(&h, "qwen3_moe_fp8", L0 "self_attn.q_proj.weight_scale_inv");
    cr_assert_eq(moe_safetensors_add(&h.st, L0 "self_attn.q_proj.weight_scale_inv", MOE_DTYPE_U8, 2,
                                     (int64_t[]){1, 2}, calloc(2, 1)), MOE_OK);
    qt_expect_refused(&h, MOE_ERR_UNSUPPORTED, "q_proj.weight_scale_inv' has dtype U8", "E8M0");
}

Test(quant_fp8, fp8_outside_linear_weights_and_fp8_configs_is_refused)
{
    struct moe_model h;
    /* a router (kept in bf16 by every fp8 checkpoint) */
    qt_copy_fixture(&h, "qwen3_moe_fp8", L0 "mlp.gate.weight");
    cr_assert_eq(moe_safetensors_add(&h.st, L0 "mlp.gate.weight", MOE_DTYPE_F8E4M3, 2, (int64_t[]){8, 256},
                                     calloc(8, 256)), MOE_OK);
    qt_expect_refused(&h, MOE_ERR_UNSUPPORTED, "'" L0 "mlp.gate.weight' is F8_E4M3; only Linear weights", NULL);
    qt_copy_fixture(&h, "qwen3_moe_fp8", "model.embed_tokens.weight");
    cr_assert_eq(moe_safetensors_add(&h.st, "model.embed_tokens.weight", MOE_DTYPE_F8E4M3, 2,
                                     (int64_t[]){256, 256}, calloc(256, 256)), MOE_OK);
    qt_expect_refused(&h, MOE_ERR_UNSUPPORTED, "'model.embed_tokens.weight' is F8_E4M3; only Linear", NULL);
    /* F8_E4M3 in a checkpoint whose config says nothing of fp8 */
    qt_copy_fixture(&h, "qwen3_moe_fp8", NULL);
    h.cfg.weights_fp8 = false;
    qt_expect_refused(&h, MOE_ERR_UNSUPPORTED, "is F8_E4M3 but config.json has no quantization_config", NULL);
    /* K = 64 columns: FP8 rows hold whole blocks of 128 */
    memset(&h, 0, sizeof h);
    h.cfg.weights_fp8 = true;
    cr_assert_eq(moe_safetensors_add(&h.st, "w.weight", MOE_DTYPE_F8E4M3, 2, (int64_t[]){4, 64}, calloc(4, 64)),
                 MOE_OK);
    cr_assert_eq(moe_safetensors_add(&h.st, "w.weight_scale_inv", MOE_DTYPE_F32, 2, (int64_t[]){1, 1},
                                     calloc(1, 4)), MOE_OK);
    struct moe_tensor t;
    cr_expect_eq(moe_model_bind_linear(&h, &t, true, false, "w.weight", 2, 4, 64, 0), MOE_ERR_UNSUPPORTED);
    cr_expect(strstr(moe_last_error(), "'w.weight' is F8_E4M3 with 64 columns; FP8 weights need a multiple of "
                     "128"), "%s", moe_last_error());
    /* ... unless the loader dequantizes it (MLA's kv_b_proj): then any K */
    cr_expect_eq(moe_model_bind_linear(&h, &t, true, true, "w.weight", 2, 4, 64, 0), MOE_OK, "%s",
                 moe_last_error());
    cr_expect_eq(t.dtype, MOE_DTYPE_F32);
    moe_model_free(&h);
}

/* qwen3_moe_fp8 with layer 0's experts restacked as transformers 5 names
 * them: gate_up_proj (E, 2F, D) F8_E4M3 (gate rows first) with
 * gate_up_proj_scale_inv (E, 2F/128, D/128), down_proj (E, D, F) with
 * down_proj_scale_inv; in h, bound, holding the experts held says (NULL:
 * all; else (layers, E): expert parallelism's share). */
static void load_stacked(struct moe_model *h, const uint8_t *held)
{
    struct moe_model src;
    qt_copy_fixture(&src, "qwen3_moe_fp8", NULL);
    qt_copy_fixture(h, "qwen3_moe_fp8", L0 "mlp.experts.");
    const int64_t E = h->cfg.n_experts, F = h->cfg.d_expert, D = h->cfg.d_model;
    uint8_t *gu = malloc((size_t)(E * 2 * F * D)), *dn = malloc((size_t)(E * D * F));
    float *gus = malloc((size_t)(E * 2 * F / 128 * D / 128) * 4), *dns = malloc((size_t)(E * D / 128 * F / 128) * 4);
    const size_t mat = (size_t)(F * D), smat = (size_t)(F / 128 * D / 128);
    for (int64_t e = 0; e < E; e++) {
        const char *proj[] = {"gate_proj", "up_proj", "down_proj"};
        for (int i = 0; i < 3; i++) {
            char n[96], sn[128];
            snprintf(n, sizeof n, L0 "mlp.experts.%lld.%s.weight", (long long)e, proj[i]);
            snprintf(sn, sizeof sn, "%s_scale_inv", n);
            memcpy(i < 2 ? gu + (size_t)(2 * e + i) * mat : dn + (size_t)e * mat, qt_data_of(&src, n), mat);
            memcpy(i < 2 ? gus + (size_t)(2 * e + i) * smat : dns + (size_t)e * smat, qt_data_of(&src, sn), smat * 4);
        }
    }
    moe_model_free(&src);
    cr_assert_eq(moe_safetensors_add(&h->st, L0 "mlp.experts.gate_up_proj", MOE_DTYPE_F8E4M3, 3,
                                     (int64_t[]){E, 2 * F, D}, gu), MOE_OK);
    cr_assert_eq(moe_safetensors_add(&h->st, L0 "mlp.experts.gate_up_proj_scale_inv", MOE_DTYPE_F32, 3,
                                     (int64_t[]){E, 2 * F / 128, D / 128}, gus), MOE_OK);
    cr_assert_eq(moe_safetensors_add(&h->st, L0 "mlp.experts.down_proj", MOE_DTYPE_F8E4M3, 3,
                                     (int64_t[]){E, D, F}, dn), MOE_OK);
    cr_assert_eq(moe_safetensors_add(&h->st, L0 "mlp.experts.down_proj_scale_inv", MOE_DTYPE_F32, 3,
                                     (int64_t[]){E, D / 128, F / 128}, dns), MOE_OK);
    if (held) cr_assert_eq(moe_model_set_held(h, held), MOE_OK);
    cr_assert_eq(moe_model_bind(h), MOE_OK, "%s", moe_last_error());
}

/* Under expert parallelism a stacked FP8 layer is rewritten only for the
 * experts this rank holds: the held ones' rows are the bytes of a whole
 * load, the others' pointers stay NULL and their part of the stack's
 * memory is never written (zeros: pages never touched, so not resident). */
Test(quant_fp8, stacked_experts_rewrite_only_the_held)
{
    struct moe_model all, part;
    load_stacked(&all, NULL);
    const int L = all.cfg.n_layers, E = all.cfg.n_experts, F = all.cfg.d_expert, D = all.cfg.d_model;
    uint8_t *held = malloc((size_t)L * E);
    memset(held, 1, (size_t)L * E);
    for (int e = 1; e < E; e += 2) held[e] = 0; /* layer 0: the even experts */
    load_stacked(&part, held);
    const struct moe_expert_weights *a = &all.layers[0].experts, *p = &part.layers[0].experts;
    const size_t gate = (size_t)F * moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, (size_t)D),
                 down = (size_t)D * moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, (size_t)F);
    const char *gu0 = p->gate[0], *dn0 = p->down[0];
    for (int e = 0; e < E; e++) {
        if (e % 2 == 0) {
            cr_expect(memcmp(p->gate[e], a->gate[e], gate) == 0 && memcmp(p->up[e], a->up[e], gate) == 0 &&
                      memcmp(p->down[e], a->down[e], down) == 0, "held expert %d: other rows than a whole load", e);
            continue;
        }
        cr_expect(!p->gate[e] && !p->up[e] && !p->down[e], "expert %d is another rank's", e);
        size_t nz = 0;
        for (size_t i = 0; i < 2 * gate; i++) nz += gu0[(size_t)e * 2 * gate + i] != 0;
        for (size_t i = 0; i < down; i++) nz += dn0[(size_t)e * down + i] != 0;
        cr_expect_eq(nz, 0, "expert %d (another rank's): %zu bytes of its stack written", e, nz);
    }
    free(held);
    moe_model_free(&all);
    moe_model_free(&part);
}

/* The stacked layout binds to the same weights as the per-expert one: the
 * logits are the same bits, on either CPU backend. */
Test(quant_fp8, stacked_experts_equal_per_expert)
{
    const int V = 256;
    float *a = malloc((size_t)20 * V * 4), *b = malloc((size_t)20 * V * 4);
    const char *backends[] = {"cpu-ref", "cpu"};
    for (int i = 0; i < 2; i++) {
        struct moe_model h;
        qt_copy_fixture(&h, "qwen3_moe_fp8", NULL);
        cr_assert_eq(moe_model_bind(&h), MOE_OK, "%s", moe_last_error());
        qt_prompt_logits(&h, backends[i], MOE_QUANT_NONE, a);
        moe_model_free(&h);
        load_stacked(&h, NULL);
        cr_expect_eq(h.layers[0].experts.dtype, MOE_DTYPE_FP8_B128);
        qt_prompt_logits(&h, backends[i], MOE_QUANT_NONE, b);
        moe_model_free(&h);
        cr_expect(memcmp(a, b, (size_t)20 * V * 4) == 0, "%s: stacked experts give other logits (max rel err %g)",
                  backends[i], tu_max_rel_err(b, a, (size_t)20 * V));
    }
    free(a);
    free(b);
}

/* What the loader makes: FP8_B128 for every Linear weight, the source's
 * bf16 elsewhere, kv_b_proj split in F32; the CPU backends read the rows in
 * place (neither repacked to panels nor requantized by --quantize q8_0,
 * while the bf16 router still goes to panels), and agree. */
Test(quant_fp8, backends_read_fp8_weights_in_place)
{
    const int V = 256;
    float *ref = malloc((size_t)20 * V * 4), *fast = malloc((size_t)20 * V * 4);
    const char *names[] = {"qwen3_moe_fp8", "deepseek_v3_fp8"};
    for (int f = 0; f < 2; f++) {
        struct moe_model m;
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, names[f]);
        cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s", moe_last_error());
        const struct moe_layer_weights *w0 = &m.layers[0], *w1 = &m.layers[1];
        if (f == 0) {
            cr_expect(w0->wq.dtype == MOE_DTYPE_FP8_B128 && w0->wk.dtype == MOE_DTYPE_FP8_B128 &&
                      w0->wv.dtype == MOE_DTYPE_FP8_B128 && w0->wo.dtype == MOE_DTYPE_FP8_B128);
            cr_expect_eq(w0->experts.dtype, MOE_DTYPE_FP8_B128);
            cr_expect(w1->w_gate.dtype == MOE_DTYPE_FP8_B128 && w1->w_down.dtype == MOE_DTYPE_FP8_B128);
            cr_expect_eq(w0->router.dtype, MOE_DTYPE_BF16);
            cr_expect_eq(w0->q_norm.dtype, MOE_DTYPE_BF16);
        } else {
            cr_expect(w0->wq_a.dtype == MOE_DTYPE_FP8_B128 && w0->wq.dtype == MOE_DTYPE_FP8_B128 &&
                      w0->wkv_a.dtype == MOE_DTYPE_FP8_B128 && w0->wo.dtype == MOE_DTYPE_FP8_B128);
            cr_expect(w0->w_uk.dtype == MOE_DTYPE_F32 && w0->w_uv.dtype == MOE_DTYPE_F32);
            cr_expect(w1->sh_gate.dtype == MOE_DTYPE_FP8_B128 && w1->sh_down.dtype == MOE_DTYPE_FP8_B128);
            cr_expect_eq(w1->experts.dtype, MOE_DTYPE_FP8_B128);
            cr_expect_eq(w1->router_bias.dtype, MOE_DTYPE_F32);
        }
        cr_expect_eq(m.embed.dtype, MOE_DTYPE_BF16);
        cr_expect_eq(m.lm_head.dtype, MOE_DTYPE_BF16);
        const struct moe_expert_weights *x = f == 0 ? &w0->experts : &w1->experts;
        const void *wo = w0->wo.data, *ex = x->gate[0];
        qt_prompt_logits(&m, "cpu-ref", MOE_QUANT_Q8_0, ref);
        cr_expect_eq(w0->wo.dtype, MOE_DTYPE_FP8_B128, "%s: not requantized", names[f]);
        cr_expect(w0->wo.data == wo && x->gate[0] == ex && x->dtype == MOE_DTYPE_FP8_B128,
                  "%s: read where the loader put them", names[f]);
        cr_expect_eq(m.lm_head.dtype, MOE_DTYPE_Q8_0, "%s: the bf16 LM head still is", names[f]);
        moe_model_free(&m);
        if (moe_cpu_isa_detect() == MOE_CPU_ISA_REF) continue;
        cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s", moe_last_error());
        qt_prompt_logits(&m, "cpu", MOE_QUANT_NONE, fast);
        cr_expect_eq(m.layers[0].wo.dtype, MOE_DTYPE_FP8_B128, "%s: not repacked to panels", names[f]);
        cr_expect_eq(m.lm_head.dtype, MOE_DTYPE_BF16_PANEL, "%s: bf16 weights still are", names[f]);
        moe_model_free(&m);
        cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s", moe_last_error());
        qt_prompt_logits(&m, "cpu-ref", MOE_QUANT_NONE, ref);
        moe_model_free(&m);
        cr_expect(tu_allclose(names[f], fast, ref, (size_t)20 * V, 1e-4f, 1e-3f), "%s: fast vs reference", names[f]);
    }
    free(ref);
    free(fast);
}

/* moerun plan with an fp8 configuration: its FP8 parts at 1 + 4/128 bytes
 * a weight, the embedding and the routers as stored (bf16); --quantize
 * q8_0 requantizes only the bf16 LM head. */
static double part_gib(const char *out, const char *name)
{
    const char *p = strstr(out, name);
    cr_assert(p, "no %s line in: %s", name, out);
    double v;
    char unit[8];
    cr_assert_eq(sscanf(p + strlen(name), " %lf %7s", &v, unit), 2);
    return !strcmp(unit, "TiB") ? v * 1024 : !strcmp(unit, "GiB") ? v : !strcmp(unit, "MiB") ? v / 1024 : v / 1048576;
}

Test(quant_fp8, plan_predicts_fp8_sizes)
{
    char cmd[1024], a[8192], b[8192], q[8192];
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/qwen3-30b-a3b.json", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/qwen3-30b-a3b-fp8.json", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0);
    strcat(cmd, " --quantize q8_0");
    cr_assert_eq(tu_run(cmd, q, sizeof q), 0);
    const double fp8 = (1 + 4.0 / 128) / 2; /* against bf16 */
    cr_expect(fabs(part_gib(b, "\n  experts") / part_gib(a, "\n  experts") - fp8) < 1e-3, "%s", b);
    cr_expect(fabs(part_gib(b, "\n  attention") / part_gib(a, "\n  attention") - fp8) < 2e-3, "%s", b);
    cr_expect(part_gib(b, "\n  embeddings") == part_gib(a, "\n  embeddings"));
    cr_expect(part_gib(b, "\n  lm head") == part_gib(a, "\n  lm head"));
    cr_expect(part_gib(b, "\n  router") == part_gib(a, "\n  router"));
    cr_expect(part_gib(q, "\n  experts") == part_gib(b, "\n  experts"), "FP8 experts are not requantized");
    cr_expect(part_gib(q, "\n  attention") == part_gib(b, "\n  attention"));
    cr_expect(fabs(part_gib(q, "\n  lm head") / part_gib(b, "\n  lm head") - 9.0 / 16) < 1e-3);
    /* DeepSeek-V3 as released: 649 GiB (its kv_b_proj in F32 once split) */
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/deepseek-v3-fp8.json", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, b, sizeof b), 0);
    snprintf(cmd, sizeof cmd, "%s plan --synthetic %s/configs/deepseek-v3.json", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
    cr_expect(fabs(part_gib(b, "\n  experts") / part_gib(a, "\n  experts") - fp8) < 1e-3, "%s", b);
    cr_expect(fabs(part_gib(b, "weights") - 649.07) < 0.01, "%s", b);
}

Test(quant_fp8, inspect_reports_fp8_bytes)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s inspect %s/qwen3_moe_fp8", MOERUN_BINARY, FIXTURE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "fp8          Linear weights in E4M3 with a scale per 128 x 128 block"), "%s", out);
    /* 8 experts x 3 x (128 x 256) weights x 132/128 bytes = 792 KiB */
    cr_expect(strstr(out, "experts       792.00 KiB"), "%s", out);
    cr_expect(strstr(out, "embeddings    128.00 KiB"), "bf16 as stored: %s", out);
}

/* Synthetic weights of an fp8 configuration are FP8 as released (so that
 * bench and plan agree), with about the configured standard deviation;
 * weights made on the device are refused (they would need packing on the
 * host). */
Test(quant_fp8, synthetic_weights_of_an_fp8_config)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, FIXTURE_DIR "/qwen3_moe_fp8/config.json"), MOE_OK, "%s", moe_last_error());
    struct moe_model m;
    cr_assert_eq(moe_model_synthetic(&m, &cfg, MOE_DTYPE_BF16, 5), MOE_OK, "%s", moe_last_error());
    const struct moe_layer_weights *w = &m.layers[0];
    cr_expect(w->wq.dtype == MOE_DTYPE_FP8_B128 && w->experts.dtype == MOE_DTYPE_FP8_B128 &&
              m.layers[1].w_down.dtype == MOE_DTYPE_FP8_B128);
    cr_expect(w->router.dtype == MOE_DTYPE_BF16 && m.embed.dtype == MOE_DTYPE_BF16);
    const int D = cfg.d_model, F = cfg.d_expert;
    float *row = malloc((size_t)D * sizeof(float));
    double sum = 0;
    const size_t rb = moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, (size_t)D);
    for (int r = 0; r < F; r++) {
        moe_convert_row_f32(row, (const char *)w->experts.up[3] + (size_t)r * rb, MOE_DTYPE_FP8_B128, (size_t)D);
        for (int k = 0; k < D; k++) sum += (double)row[k] * row[k];
    }
    const double std = sqrt(sum / ((double)F * D));
    cr_expect(fabs(std / cfg.init_std - 1) < 0.05, "std %g, configured %g", std, cfg.init_std);
    free(row);
    moe_model_free(&m);
    cr_expect_eq(moe_model_synthetic_deferred(&m, &cfg, MOE_DTYPE_BF16, 5), MOE_ERR_UNSUPPORTED);
    cr_expect(strstr(moe_last_error(), "weights made on the device are not supported"), "%s", moe_last_error());
}
