/* cuda_quant_test.h - what the quantized-weights parity suites share
 * (test_cuda_quant.c): random weights in each planes format on both sides,
 * the expert and matmul checks against the CPU, tiny-moe with the
 * quantizers' edge blocks planted, the device's planes checked byte for
 * byte against the host's quantization, and a model's logits on both
 * backends.  Included by one test file each (static helpers). */
#pragma once

#include "runtime/core/argmax.h"
#include "tests/cuda_test.h"

/* Set by the cuda_quant_mma suite (MOERUN_CUDA_EXPERTS=mma). */
static bool mma_backend;

/* The suite's GPU backend opened again with --quantize q8_0 or q4,
 * unreserved. */
static void reopen_gpu_quant(enum moe_weight_quant q)
{
    moe_backend_free(&gpu);
    cr_assert_eq(tu_backend_init_with(&gpu, "cuda", q, 0, 0), MOE_OK, "%s", moe_last_error());
}
static void reopen_gpu_q8(void) { reopen_gpu_quant(MOE_QUANT_Q8_0); }

/* The host's quantizer of t (Q8_0, Q4_1, Q4_K or Q6_K). */
static bool quantize_row(enum moe_dtype t, void *dst, const float *x, size_t K)
{
    return t == MOE_DTYPE_Q6_K   ? moe_quantize_row_q6_k(dst, x, K)
           : t == MOE_DTYPE_Q4_K ? moe_quantize_row_q4_k(dst, x, K)
           : t == MOE_DTYPE_Q4_1 ? moe_quantize_row_q4_1(dst, x, K)
                                 : moe_quantize_row_q8_0(dst, x, K);
}

/* rows (R, K) of dt blocks with random codes and scales (Q8_0, Q4_1,
 * Q4_K, Q6_K: random values quantized; Q4_G32, Q4_G128: per group d in [2^-8, 2^-7)
 * and m in (-8d, -7d], as a checkpoint's (q - z) * s with z near 8) */
static void *quant_rows(enum moe_dtype dt, size_t R, size_t K, uint64_t seed)
{
    if (dt == MOE_DTYPE_Q8_0 || dt == MOE_DTYPE_Q4_1 || dt == MOE_DTYPE_Q4_K || dt == MOE_DTYPE_Q6_K) {
        const size_t rb = moe_dtype_row_bytes(dt, K);
        unsigned char *out = malloc(R * rb);
        float *x = rand_floats(R * K, seed, -0.1f, 0.1f);
        for (size_t r = 0; r < R; r++)
            cr_assert(quantize_row(dt, out + r * rb, x + r * K, K));
        free(x);
        return out;
    }
    if (moe_dtype_is_q4(dt)) {
        const size_t gb = moe_q4_group_bytes(dt), n = R * (K / (size_t)moe_q4_group(dt));
        unsigned char *out = malloc(n * gb);
        uint64_t st = seed;
        for (size_t g = 0; g < n; g++) {
            unsigned char *b = out + g * gb;
            const float d = ldexpf(1.0f + tu_rand_uniform(&st, 0.0f, 1.0f), -8);
            const float m = -tu_rand_uniform(&st, 7.0f, 8.0f) * d;
            memcpy(b, &d, 4);
            memcpy(b + 4, &m, 4);
            for (size_t j = MOE_Q4_HEAD; j < gb; j++) b[j] = (unsigned char)tu_rand_u64(&st);
        }
        return out;
    }
    const bool fp4 = dt == MOE_DTYPE_MXFP4;
    const size_t blk = fp4 ? MOE_MXFP4_BLOCK : MOE_FP8_BLOCK, rb = moe_dtype_row_bytes(dt, K);
    unsigned char *out = malloc(R * rb), *codes = malloc(K);
    float *u = rand_floats(R * K + R * (K / blk), seed, 0.0f, 1.0f);
    const float *su = u + R * K;
    uint8_t *s8 = malloc(K / blk);
    float *sf = malloc(K / blk * sizeof(float));
    for (size_t r = 0; r < R; r++) {
        for (size_t k = 0; k < K; k++) {
            unsigned c = (unsigned)(u[r * K + k] * 256.0f) & 255u;
            if (!fp4 && (c & 0x7f) == 0x7f) c ^= 1; /* not NaN */
            codes[k] = (unsigned char)c;
        }
        for (size_t g = 0; g < K / blk; g++) {
            /* 2^-7 .. 2^-4 (MXFP4: codes up to 6; FP8: values up to 448 / 2^7) */
            const int e = (int)(su[r * (K / blk) + g] * 4.0f);
            s8[g] = (uint8_t)(120 + e);
            sf[g] = ldexpf(1.0f, (fp4 ? -7 : -14) + e);
        }
        void *row = out + r * rb;
        if (fp4) {
            /* checkpoint blocks: two codes a byte */
            unsigned char *pk = malloc(K / 2);
            for (size_t k = 0; k < K / 2; k++) pk[k] = (unsigned char)((codes[2 * k] & 15) | (codes[2 * k + 1] & 15) << 4);
            cr_assert(moe_mxfp4_pack_row(row, pk, s8, K));
            free(pk);
        } else {
            cr_assert(moe_fp8_pack_row(row, codes, sf, K));
        }
    }
    free(codes), free(u), free(s8), free(sf);
    return out;
}

/* One stack (n matrices of R x K rows) as planes on the device: matrix i's
 * values at i * values(R, K), its scales after all n matrices' values. */
static void *dev_planes(enum moe_dtype dt, void *const *mats, int n, size_t R, size_t K)
{
    const size_t vb = moe_planes_values_bytes(dt, R, K), sb = moe_planes_scales_bytes(dt, R, K);
    unsigned char *h = malloc((vb + sb) * (size_t)n);
    for (int i = 0; i < n; i++) moe_planes_from_rows(dt, mats[i], R, K, h + vb * i, h + vb * n + sb * i);
    void *d = dev_copy(h, (vb + sb) * (size_t)n);
    free(h);
    return d;
}

/* The experts op over E experts in dt, their down matrices in ddt
 * (--quantize q4_k_m's Q6_K or Q8_0 beside four-bit gate and up), on the
 * path the backend picks for T rows, against the CPU. */
static void check_quant_experts_down(enum moe_dtype dt, enum moe_dtype ddt, int T, int E, int K, int D, int F,
                                     bool gpt_oss)
{
    void *hg[E], *hu[E], *hd[E], *gu_mats[2 * E];
    enum moe_dtype ddts[E];
    for (int e = 0; e < E; e++) {
        hg[e] = quant_rows(dt, (size_t)F, (size_t)D, 1000 + 3 * (uint64_t)e);
        hu[e] = quant_rows(dt, (size_t)F, (size_t)D, 1001 + 3 * (uint64_t)e);
        hd[e] = quant_rows(ddt, (size_t)D, (size_t)F, 1002 + 3 * (uint64_t)e);
        gu_mats[2 * e] = hg[e], gu_mats[2 * e + 1] = hu[e];
        ddts[e] = ddt;
    }
    char *dgu = dev_planes(dt, gu_mats, 2 * E, (size_t)F, (size_t)D);
    char *ddn = dev_planes(ddt, hd, E, (size_t)D, (size_t)F);
    const size_t mat = moe_planes_values_bytes(dt, (size_t)F, (size_t)D),
                 mat_d = moe_planes_values_bytes(ddt, (size_t)D, (size_t)F);
    const void *cg[E], *cu[E], *cd[E], *dg[E], *du[E], *dd[E];
    for (int e = 0; e < E; e++) {
        cg[e] = hg[e], cu[e] = hu[e], cd[e] = hd[e];
        dg[e] = dgu + 2 * mat * e, du[e] = dgu + 2 * mat * e + mat, dd[e] = ddn + mat_d * e;
    }
    struct moe_expert_weights hx = {.dtype = dt, .down_dtypes = ddt != dt ? ddts : NULL, .gate = cg, .up = cu,
                                    .down = cd},
                              dx = hx;
    dx.gate = dg, dx.up = du, dx.down = dd;
    float *bias = NULL, *dbias = NULL;
    if (gpt_oss) gpt_oss_biases(&hx, &dx, E, D, F, 1.0f, &bias, &dbias); /* a limit values cross often */
    char shp[64];
    snprintf(shp, sizeof shp, "T%d E%d K%d D%d F%d%s%s%s", T, E, K, D, F, gpt_oss ? " gpt-oss" : "",
             ddt != dt ? " down " : "", ddt != dt ? moe_dtype_name(ddt) : "");
    /* the backend's rules: widened (grouped) past 32 rows and 8 rows an
     * expert; with MOERUN_CUDA_EXPERTS=mma, the tensor-core kernels past 32
     * rows or from 4 rows an expert */
    const bool q4 = moe_dtype_is_q4(dt) || dt == MOE_DTYPE_Q6_K; /* no tensor-core path: widened */
    const bool mma = !q4 && mma_backend && T > 1 && (T > 32 || T * K >= 4 * E);
    const bool grouped = mma || ((!mma_backend || q4) && T > 32 && (size_t)T * K > 8 * (size_t)E);
    const int64_t calls = moe_cuda_mma_expert_calls(&gpu);
    const double e = experts_parity(&hx, &dx, T, E, K, D, F,
                                    mma ? "experts_mma" : grouped ? "experts_grp" : "experts_dec", shp);
    cr_expect_eq(moe_cuda_mma_expert_calls(&gpu) - calls, mma ? 1 : 0, "experts %s %s: %s the tensor-core "
                 "kernels", moe_dtype_name(dt), shp, mma ? "not on" : "on");
    /* decode: fp32 activations, only the summation order differs; grouped:
     * bf16 activations and (FP8) weights rounded to bf16 */
    cr_expect(e <= (grouped ? 3e-2 : 1e-4), "experts %s %s: %.3g", moe_dtype_name(dt), shp, e);
    void *dbufs[] = {dgu, ddn, dbias};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) gpu.ops->dealloc(&gpu, dbufs[i]);
    for (int e2 = 0; e2 < E; e2++) free(hg[e2]), free(hu[e2]), free(hd[e2]);
    free(bias);
}
static void check_quant_experts(enum moe_dtype dt, int T, int E, int K, int D, int F, bool gpt_oss)
{
    check_quant_experts_down(dt, dt, T, E, K, D, F, gpt_oss);
}

/* The matmul op with an MXFP4 or FP8 matrix (N, Din) as planes: read in
 * place for steps of up to 32 rows (fp32 throughout: the CPU's sum in
 * another order), widened to bf16 for cuBLAS past them. */
static void check_planes_matmul(enum moe_dtype dt, int T, int N, int Din, bool bias)
{
    void *rows = quant_rows(dt, (size_t)N, (size_t)Din, 2000 + (uint64_t)N);
    void *const mats[1] = {rows};
    struct moe_tensor hw = {dt, 2, {N, Din}, rows, -1, NULL}, dw = hw;
    dw.data = dev_planes(dt, mats, 1, (size_t)N, (size_t)Din);
    dw.device = 0;
    float *hb = rand_floats((size_t)N, 2001, -0.5f, 0.5f);
    struct moe_tensor bh = {MOE_DTYPE_F32, 1, {N}, hb, -1, NULL}, bd = bh;
    bd.data = dev_copy(hb, (size_t)N * sizeof(float));
    float *x = rand_floats((size_t)T * Din, 2002, -1, 1);
    float *ref = malloc((size_t)T * N * sizeof(float)), *got = malloc((size_t)T * N * sizeof(float));
    float *sc = malloc((size_t)Din * omp_get_max_threads() * sizeof(float));
    moe_gemm_cpu(ref, N, x, Din, rows, dt, N, Din, T, bias ? &bh : NULL, sc);
    float *dx = dev_copy(x, (size_t)T * Din * sizeof(float));
    float *dy = dev_poisoned((size_t)T * N * sizeof(float));
    cr_assert_eq(gpu.ops->matmul(&gpu, dy, dx, &dw, bias ? &bd : NULL, T), MOE_OK, "%s", moe_last_error());
    to_host(got, dy, (size_t)T * N * sizeof(float));
    char shp[64];
    snprintf(shp, sizeof shp, "T%d N%d Din%d%s", T, N, Din, bias ? " +b" : "");
    const bool wide = T > 32;
    const double e = report(wide ? "matmul_wide" : "matmul_planes", moe_dtype_name(dt), shp, got, ref,
                            (size_t)T * N);
    cr_expect(e <= (wide ? 2e-2 : 1e-4), "matmul %s %s: %.3g", moe_dtype_name(dt), shp, e);
    void *dbufs[] = {dw.data, bd.data, dx, dy};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) gpu.ops->dealloc(&gpu, dbufs[i]);
    free(rows), free(hb), free(x), free(ref), free(got), free(sc);
}

/* ---- --quantize q8_0 on the GPU: weights quantized on the device ---- */

/* tiny-moe's seeded weights in dt, with blocks at the quantizer's edges
 * planted at the start of layer 0's q_proj: all zeros, values whose scale
 * is an f16 subnormal, exact halves (d = 1: roundf rounds them away from
 * zero, rint would not), the largest code at both signs. */
static void q8_model_shape(struct moe_model *m, enum moe_dtype dt, int F, int L, int E)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK);
    if (F) cfg.d_expert = F;
    if (L) cfg.n_layers = L;
    if (E) cfg.n_experts = E;
    cr_assert_eq(moe_model_synthetic(m, &cfg, dt, 11), MOE_OK, "%s", moe_last_error());
    float edge[4][32];
    for (int j = 0; j < 32; j++) {
        edge[0][j] = 0.0f;
        edge[1][j] = (float)(j - 16) * 1e-7f;
        edge[2][j] = j == 0 ? 127.0f : (float)(j - 16) + 0.5f;
        edge[3][j] = j % 2 ? -3.0f : 3.0f;
    }
    for (int b = 0; b < 4; b++)
        moe_convert_from_f32((char *)m->layers[0].wq.data + (size_t)b * 32 * moe_dtype_size(dt), edge[b], dt, 32);
}
/* tiny-moe (q8_model_shape: F, L, E its expert width, layers and experts, 0
 * as configured) */
static void q8_model_f(struct moe_model *m, enum moe_dtype dt, int F) { q8_model_shape(m, dt, F, 0, 0); }
static void q8_model(struct moe_model *m, enum moe_dtype dt) { q8_model_shape(m, dt, 0, 0, 0); }

/* The device planes (values at dv, scales at ds) of R rows of K host
 * values of dt at h hold the host's quantization to t (Q8_0, Q4_1 or
 * Q4_K), byte for byte. */
static void expect_quant_planes(const char *what, const void *h, enum moe_dtype dt, enum moe_dtype t,
                                const void *dv, const void *ds, size_t R, size_t K)
{
    const size_t rb = moe_dtype_row_bytes(t, K), vb = moe_planes_values_bytes(t, R, K),
                 sb = moe_planes_scales_bytes(t, R, K);
    unsigned char *rows = malloc(R * rb), *want = malloc(vb + sb), *got = malloc(vb + sb);
    float *f = malloc(K * sizeof(float));
    for (size_t r = 0; r < R; r++) {
        moe_convert_row_f32(f, (const char *)h + r * K * moe_dtype_size(dt), dt, K);
        cr_assert(quantize_row(t, rows + r * rb, f, K));
    }
    moe_planes_from_rows(t, rows, R, K, want, want + vb);
    to_host(got, dv, vb);
    to_host(got + vb, ds, sb);
    const bool same = memcmp(got, want, vb + sb) == 0;
    fprintf(stderr, "parity: %s_upload %-16s %-5s (%zu,%zu) %s\n", moe_dtype_name(t), what, moe_dtype_name(dt), R,
            K, same ? "identical" : "DIFFERS");
    cr_expect(same, "%s (%s): device %s planes differ from the host's quantization", what, moe_dtype_name(dt),
              moe_dtype_name(t));
    free(rows), free(want), free(got), free(f);
}

static const char *planes_scales(const struct moe_tensor *t)
{
    return (const char *)t->data + moe_planes_values_bytes(t->dtype, (size_t)t->shape[0], (size_t)t->shape[1]);
}

/* --quantize q4's dtype for rows of K values (of an expert: K = F when
 * D is a multiple of 256): the CPU backend's rule. */
static enum moe_dtype q4_dtype(int64_t K) { return K % 256 == 0 ? MOE_DTYPE_Q4_K : MOE_DTYPE_Q4_1; }

/* The dtype --quantize q (q8_0, q4, q4_k_m) makes of the float matrix t
 * (rows of K) of layer l of the host model h (the LM head: l -1): the CPU
 * backend's rule. */
static enum moe_dtype quant_want(enum moe_weight_quant q, const struct moe_model *h, int l, const struct moe_tensor *t,
                                 int64_t K)
{
    const enum moe_dtype km = q == MOE_QUANT_Q4_K_M ? moe_quant_q4_k_m_tensor(h, l, t) : MOE_DTYPE_N;
    if (km != MOE_DTYPE_N) return km;
    return q == MOE_QUANT_Q8_0 || t == &h->lm_head ? MOE_DTYPE_Q8_0 : q4_dtype(K);
}

/* The device twin d of the host model h, prepared with --quantize q, holds
 * in its projections, experts and LM head the host's quantization of h's
 * weights (of dtype dt), byte for byte, in quant_want's dtypes (q4: Q4_K
 * where rows are multiples of 256, else Q4_1, the LM head Q8_0; q4_k_m:
 * Q6_K or Q8_0 where moe_quant_q4_k_m_dtype says, an expert's down matrix
 * too); its router and embedding keep their dtype.  The experts of layer
 * 1 (q4_k_m: of every layer). */
static void expect_quant_model(const struct moe_model *h, const struct moe_model *d, enum moe_dtype dt,
                               enum moe_weight_quant q)
{
    const struct moe_config *c = &h->cfg;
    const int D = c->d_model, F = c->d_expert, E = c->n_experts, L = c->n_layers, xl = L > 1 ? 1 : 0;
    const enum moe_dtype qt = q != MOE_QUANT_Q8_0 ? q4_dtype(D % 256 ? D : F) : MOE_DTYPE_Q8_0; /* the experts' */
    cr_expect_eq(d->layers[0].router.dtype, dt, "the router keeps its dtype");
    cr_expect_eq(d->embed.dtype, dt, "the embedding keeps its dtype");
    const struct { const char *what; int l; const struct moe_tensor *h, *d; } mats[] = {
        {"q_proj 0", 0, &h->layers[0].wq, &d->layers[0].wq}, {"o_proj 0", 0, &h->layers[0].wo, &d->layers[0].wo},
        {"k_proj last", L - 1, &h->layers[L - 1].wk, &d->layers[L - 1].wk},
        {"v_proj last", L - 1, &h->layers[L - 1].wv, &d->layers[L - 1].wv},
        {"lm_head", -1, &h->lm_head, &d->lm_head}};
    for (size_t j = 0; j < sizeof mats / sizeof *mats; j++) {
        const enum moe_dtype want = quant_want(q, h, mats[j].l, mats[j].h, mats[j].h->shape[1]);
        cr_expect(mats[j].d->dtype == want && mats[j].d->device >= 0, "%s: %s, want %s", mats[j].what,
                  moe_dtype_name(mats[j].d->dtype), moe_dtype_name(want));
        if (mats[j].d->dtype != want) continue;
        expect_quant_planes(mats[j].what, mats[j].h->data, dt, want, mats[j].d->data, planes_scales(mats[j].d),
                            (size_t)mats[j].h->shape[0], (size_t)mats[j].h->shape[1]);
    }
    for (int l = q == MOE_QUANT_Q4_K_M ? 0 : xl; l <= (q == MOE_QUANT_Q4_K_M ? L - 1 : xl); l++) {
        const struct moe_expert_weights *a = &h->layers[l].experts, *b = &d->layers[l].experts;
        const enum moe_dtype km = q == MOE_QUANT_Q4_K_M ? moe_quant_q4_k_m_dtype(MOE_Q4KM_DOWN, l, L, E, F)
                                                        : MOE_DTYPE_N,
                             qd = km != MOE_DTYPE_N ? km : qt;
        cr_assert_eq(b->dtype, qt);
        cr_assert_eq(moe_expert_down_dtype(b, 0), qd, "layer %d: down %s, want %s", l,
                     moe_dtype_name(moe_expert_down_dtype(b, 0)), moe_dtype_name(qd));
        const size_t S = moe_planes_scales_bytes(qt, (size_t)F, (size_t)D),
                     Sd = moe_planes_scales_bytes(qd, (size_t)D, (size_t)F);
        const char *gus = (const char *)b->gate[0] + moe_planes_values_bytes(qt, 2 * (size_t)F * E, (size_t)D);
        const char *dns = (const char *)b->down[0] + moe_planes_values_bytes(qd, (size_t)D * E, (size_t)F);
        for (int e = 0; e < E; e += E > 8 ? 7 : 1) {
            expect_quant_planes("expert gate", a->gate[e], dt, qt, b->gate[e], gus + 2 * e * S, (size_t)F, (size_t)D);
            expect_quant_planes("expert up", a->up[e], dt, qt, b->up[e], gus + (2 * e + 1) * S, (size_t)F, (size_t)D);
            expect_quant_planes("expert down", a->down[e], dt, qd, b->down[e], dns + e * Sd, (size_t)D, (size_t)F);
        }
    }
}

/* The report's name of a model quantized as q. */
static const char *quant_model_name(enum moe_weight_quant q)
{
    return q == MOE_QUANT_Q4_K_M ? "q4_k_m_model" : q == MOE_QUANT_Q4 ? "q4_model" : "q8_0_model";
}

/* Logits for every row of an S-token prompt of m on backend `name` with
 * weights quantized as q (gpu_experts, cpu_rows: the CUDA offload's). */
static void quant_logits(struct moe_model *m, const char *name, enum moe_weight_quant q, int S, int gpu_experts,
                         int cpu_rows, float *logits)
{
    struct moe_backend be;
    cr_assert_eq(tu_backend_init_with(&be, name, q, gpu_experts, cpu_rows), MOE_OK, "%s", moe_last_error());
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = S, .max_seqs = 1, .max_logits = S, .block_size = 8, .n_blocks = 32};
    cr_assert_eq(moe_runner_init(&r, m, &be, &o), MOE_OK, "%s", moe_last_error());
    int32_t prompt[128];
    cr_assert(S <= 128);
    tu_prompt_logits_n(&r, m->cfg.vocab, S, prompt, logits);
    moe_runner_free(&r);
    moe_backend_free(&be);
}

/* The logits of tiny-moe (f32 weights, edges planted; F, L, E: as
 * q8_model_shape's) quantized as q on the CPU reference and on the GPU, S
 * tokens; the worst relative error must be at most tol, and with greedy
 * each row's greedy token the same. */
static void check_quant_model_shape(enum moe_weight_quant q, int S, double tol, const char *what, int F, int L, int E,
                                    bool greedy)
{
    const int V = 1024;
    float *ref = malloc((size_t)S * V * 4), *got = malloc((size_t)S * V * 4);
    struct moe_model m;
    q8_model_shape(&m, MOE_DTYPE_F32, F, L, E);
    quant_logits(&m, "cpu-ref", q, S, 0, 0, ref);
    moe_model_free(&m);
    q8_model_shape(&m, MOE_DTYPE_F32, F, L, E);
    quant_logits(&m, "cuda", q, S, 0, 0, got);
    moe_model_free(&m);
    char shp[64];
    snprintf(shp, sizeof shp, "tiny-moe S%d %s", S, what);
    const double e = report(quant_model_name(q), "F32", shp, got, ref, (size_t)S * V);
    cr_expect(e <= tol, "%s: %.3g", shp, e);
    for (int t = 0; greedy && t < S; t++)
        cr_expect_eq(moe_argmax(got + (size_t)t * V, V), moe_argmax(ref + (size_t)t * V, V), "%s: row %d's greedy token",
                     shp, t);
    free(ref), free(got);
}
static void check_quant_model(enum moe_weight_quant q, int S, double tol, const char *what, int F)
{
    check_quant_model_shape(q, S, tol, what, F, 0, 0, false);
}

/* The worst relative error of the OLMoE fixture's logits for an S-token
 * prompt quantized on the GPU with the given offload, against backend
 * ref_name resident. */
static double olmoe_quant_error(enum moe_weight_quant q, int S, const char *ref_name, int gpu_experts, int cpu_rows,
                                const char *what)
{
    struct moe_model m;
    cr_assert_eq(moe_model_load(&m, FIXTURE_DIR "/olmoe"), MOE_OK, "%s", moe_last_error());
    const int V = m.cfg.vocab;
    float *ref = malloc((size_t)S * V * 4), *got = malloc((size_t)S * V * 4);
    quant_logits(&m, ref_name, q, S, 0, 0, ref);
    moe_model_free(&m);
    cr_assert_eq(moe_model_load(&m, FIXTURE_DIR "/olmoe"), MOE_OK, "%s", moe_last_error());
    quant_logits(&m, "cuda", q, S, gpu_experts, cpu_rows, got);
    moe_model_free(&m);
    const double e = report(quant_model_name(q), "BF16", what, got, ref, (size_t)S * V);
    free(ref), free(got);
    return e;
}
