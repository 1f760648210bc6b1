/* quant_test.h - what the quantized-weight suites (test_quant.c,
 * test_quant_fp8.c, test_q4_model.c, the K-quant suites) share: a product
 * through any kernel set, a synthetic model of 256-wide rows, the logits
 * of the shared 20-token prompt for a model on a backend, plan's sizes,
 * and in-memory copies of fixtures to break. */
#pragma once

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/backend/backend.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/engine/runner.h"
#include "runtime/model/safetensors.h"
#include "tests/testutil.h"

/* y = x . W^T (W (N, D) of dtype wt) through the reference (isa REF) or a
 * fast kernel set. */
static inline void qt_gemm_any(int isa, float *y, const float *x, const void *w, enum moe_dtype wt, int N,
                               int D, int T, float *scratch)
{
    if (isa == MOE_CPU_ISA_REF)
        moe_gemm_cpu(y, N, x, D, w, wt, N, D, T, NULL, scratch);
    else
        moe_gemm_fast((enum moe_cpu_isa)isa, y, N, x, D, w, wt, N, D, T, NULL);
}

enum { QT_WIDE_L = 16 }; /* layers of qt_wide_model */

/* The layers of 16 that llama.cpp's use_more_bits picks (i < n/8, i >=
 * 7n/8, (i - n/8) % 3 == 2), worked by hand. */
static inline bool qt_more_bits(int l)
{
    static const int picked[] = {0, 1, 4, 7, 10, 13, 14, 15};
    for (size_t i = 0; i < sizeof picked / sizeof *picked; i++)
        if (picked[i] == l) return true;
    return false;
}

/* A synthetic bf16 Qwen3-MoE of QT_WIDE_L layers whose rows are all
 * multiples of 256 (hidden, expert width, attention width), with E
 * experts: the K-quant suites' model (test_q4_k_m.c, test_q5_k_m.c). */
static inline void qt_wide_model(struct moe_model *m, int E, uint64_t seed)
{
    char path[] = "/tmp/moerun-wide-XXXXXX";
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 256, "
               "\"moe_intermediate_size\": 256, \"num_hidden_layers\": %d, \"num_attention_heads\": 8, "
               "\"num_key_value_heads\": 2, \"head_dim\": 32, \"vocab_size\": 512, "
               "\"max_position_embeddings\": 4096, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-06, "
               "\"num_experts\": %d, \"num_experts_per_tok\": 2, \"norm_topk_prob\": true, "
               "\"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"initializer_range\": 0.1}\n",
            QT_WIDE_L, E);
    fclose(f);
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, path), MOE_OK, "%s", moe_last_error());
    unlink(path);
    cr_assert_eq(moe_model_synthetic(m, &cfg, MOE_DTYPE_BF16, seed), MOE_OK, "%s", moe_last_error());
}

/* The logits of the fixed 20-token prompt for model m on backend `name`
 * with weight quantization q. */
static inline void qt_prompt_logits(struct moe_model *m, const char *name, enum moe_weight_quant q,
                                    float *logits)
{
    struct moe_backend be;
    cr_assert_eq(tu_backend_init_with(&be, name, q, 0, 0), MOE_OK, "%s", moe_last_error());
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 1, .max_logits = 64, .block_size = 8,
                                .n_blocks = 32};
    cr_assert_eq(moe_runner_init(&r, m, &be, &o), MOE_OK, "%s", moe_last_error());
    int32_t prompt[20];
    tu_prompt_logits(&r, m->cfg.vocab, prompt, logits);
    moe_runner_free(&r);
    moe_backend_free(&be);
}

/* Every kernel set this processor runs (the reference, AVX2, AVX-512)
 * multiplies w (N, D) of dtype wt (wf: its exact fp32 values) as an fp32
 * product over wf (the reference: bit for bit, it sums in the same order;
 * the fast sets: to 1e-5 of the largest output), and a row's outputs are
 * the same bits in a batch of any size.  label names the format. */
static inline void qt_check_gemm(const char *label, const void *w, const float *wf, enum moe_dtype wt, int N,
                                 int D)
{
    const int best = (int)moe_cpu_isa_detect();
    const int Ts[] = {1, 2, 3, 5, 8, 17, 67};
    enum { TMAX = 67 };
    float *x = malloc((size_t)TMAX * D * sizeof(float)), *want = malloc((size_t)TMAX * N * 4),
          *full = malloc((size_t)TMAX * N * 4), *got = malloc((size_t)TMAX * N * 4),
          *scratch = malloc((size_t)D * 64 * sizeof(float));
    tu_fill_uniform(x, (size_t)TMAX * D, (uint64_t)(N + D), -1, 1);
    moe_gemm_cpu(want, N, x, D, wf, MOE_DTYPE_F32, N, D, TMAX, NULL, scratch);
    float maxref = 0;
    for (size_t i = 0; i < (size_t)TMAX * N; i++) maxref = fmaxf(maxref, fabsf(want[i]));
    for (int isa = MOE_CPU_ISA_REF; isa <= best; isa++) {
        qt_gemm_any(isa, full, x, w, wt, N, D, TMAX, scratch);
        char what[96];
        snprintf(what, sizeof what, "%s gemm %s T=%d N=%d Din=%d", label, moe_cpu_isa_name((enum moe_cpu_isa)isa),
                 TMAX, N, D);
        if (isa == MOE_CPU_ISA_REF)
            cr_expect(memcmp(full, want, (size_t)TMAX * N * 4) == 0, "%s: the reference differs from its fp32 product",
                      what);
        cr_expect(tu_allclose(what, full, want, (size_t)TMAX * N, 1e-5f * maxref, 1e-5f), "%s", what);
        /* the first T rows alone: the same bits as in the batch of TMAX */
        for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++) {
            const int T = Ts[a];
            qt_gemm_any(isa, got, x, w, wt, N, D, T, scratch);
            for (int r = 0; r < T; r++)
                cr_expect(memcmp(got + (size_t)r * N, full + (size_t)r * N, (size_t)N * 4) == 0,
                          "%s: row %d in a batch of %d differs from the batch of %d", what, r, T, TMAX);
        }
    }
    free(x), free(want), free(full), free(got), free(scratch);
}

/* One-hot input rows pick single weights: every kernel set, on every path
 * (decode tiles, batch tiles, rows widened for a block), gives each weight
 * of w (N, D) of dtype wt exactly its wf value. */
static inline void qt_check_widening(const void *w, const float *wf, enum moe_dtype wt, int N, int D)
{
    const int best = (int)moe_cpu_isa_detect();
    const int groups[] = {1, 2, 3, 5, 8, 17};
    float *x = calloc((size_t)D * D, sizeof(float)), *y = malloc((size_t)D * N * 4),
          *scratch = malloc((size_t)D * 64 * sizeof(float));
    for (int k = 0; k < D; k++) x[(size_t)k * D + k] = 1.0f;
    for (int isa = MOE_CPU_ISA_REF; isa <= best; isa++)
        for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
            const int T = groups[g] < D ? groups[g] : D;
            for (int k0 = 0; k0 < D; k0 += T) {
                const int t = D - k0 < T ? D - k0 : T;
                qt_gemm_any(isa, y, x + (size_t)k0 * D, w, wt, N, D, t, scratch);
                for (int r = 0; r < t; r++)
                    for (int n = 0; n < N; n++)
                        cr_assert_eq(y[(size_t)r * N + n], wf[(size_t)n * D + k0 + r],
                                     "%s N=%d Din=%d rows of %d: weight (%d, %d) is %g, want %g",
                                     moe_cpu_isa_name((enum moe_cpu_isa)isa), N, D, t, n, k0 + r,
                                     y[(size_t)r * N + n], wf[(size_t)n * D + k0 + r]);
            }
        }
    free(x), free(y), free(scratch);
}

/* The size on plan's output line `name` ("\n  experts"), in GiB. */
static inline double qt_part_gib(const char *out, const char *name)
{
    const char *p = strstr(out, name);
    cr_assert(p, "no %s line in: %s", name, out);
    double v;
    char unit[8];
    cr_assert_eq(sscanf(p + strlen(name), " %lf %7s", &v, unit), 2);
    return !strcmp(unit, "GiB") ? v : !strcmp(unit, "MiB") ? v / 1024 : v / 1048576;
}

/* A copy of fixture `name`'s tensors in memory (in *h, configured as the
 * fixture; not bound), but those whose names start with `skip`. */
static inline void qt_copy_fixture(struct moe_model *h, const char *name, const char *skip)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, name);
    struct moe_model src;
    cr_assert_eq(moe_model_load(&src, dir), MOE_OK, "%s", moe_last_error());
    memset(h, 0, sizeof *h);
    h->cfg = src.cfg;
    for (size_t i = 0; i < src.st.n_tensors; i++) {
        const struct moe_st_tensor *t = &src.st.tensors[i];
        if (skip && !strncmp(t->name, skip, strlen(skip))) continue;
        void *d = malloc(t->nbytes ? t->nbytes : 1);
        memcpy(d, t->data, t->nbytes);
        cr_assert_eq(moe_safetensors_add(&h->st, t->name, t->dtype, t->ndim, t->shape, d), MOE_OK);
    }
    moe_model_free(&src);
}

/* Writable data of tensor `name` of h (in memory: copy_fixture). */
static inline void *qt_data_of(struct moe_model *h, const char *name)
{
    const struct moe_st_tensor *t = moe_safetensors_find(&h->st, name);
    cr_assert(t, "%s missing", name);
    return (void *)t->data;
}

/* Binding h fails with `status` and a message holding each needle. */
static inline void qt_expect_refused(struct moe_model *h, enum moe_status status, const char *n1, const char *n2)
{
    cr_expect_eq(moe_model_bind(h), status, "%s", moe_last_error());
    cr_expect(strstr(moe_last_error(), n1), "'%s' not in: %s", n1, moe_last_error());
    if (n2) cr_expect(strstr(moe_last_error(), n2), "'%s' not in: %s", n2, moe_last_error());
    moe_model_free(h);
}

/* The fast integer kernels' invariants for y = x . W^T (+ b), got (T, N)
 * from the AVX2 set: every set gives the same bits (the AMX sets' Q8_0 and
 * four-bit products on the int8 tiles bits of their own, the same in each
 * AMX set);
 * each row alone gives its bits in the batch; a NaN and an infinity in
 * rows 1 and 2 make those rows NaN and leave the others' bits (x's rows 1
 * and 2 are changed).  other (T, N) and one (N) are scratch. */
static inline void qt_check_int8_invariants(const char *what, enum moe_cpu_isa best, float *x, int D,
                                            const void *w, enum moe_dtype wt, int N, int T,
                                            const struct moe_tensor *b, const float *got, float *other, float *one)
{
    const bool own = (wt == MOE_DTYPE_Q8_0 || moe_dtype_is_q4(wt)) && best >= MOE_CPU_ISA_AMX && moe_cpu_amx_int8();
    float *mine = NULL;
    if (own) {
        mine = malloc((size_t)T * N * 4);
        cr_assert(mine);
        moe_gemm_fast(MOE_CPU_ISA_AMX, mine, N, x, D, w, wt, N, D, T, b);
    }
    const int last = best >= MOE_CPU_ISA_AMX ? MOE_CPU_ISA_AMX_BF16 : (int)best;
    for (int isa = MOE_CPU_ISA_AVX512; isa <= last; isa++) {
        const bool amx = own && isa >= MOE_CPU_ISA_AMX;
        moe_gemm_fast((enum moe_cpu_isa)isa, other, N, x, D, w, wt, N, D, T, b);
        cr_expect(memcmp(other, amx ? mine : got, (size_t)T * N * 4) == 0, "%s: %s differs from %s", what,
                  moe_cpu_isa_name((enum moe_cpu_isa)isa), amx ? "amx" : "avx2");
    }
    if (own) got = mine;
    for (int r = 0; r < T; r += T > 8 ? 7 : 1) {
        moe_gemm_fast(best, one, N, x + (size_t)r * D, D, w, wt, N, D, 1, b);
        cr_expect(memcmp(one, got + (size_t)r * N, (size_t)N * 4) == 0, "%s: row %d alone differs from the batch",
                  what, r);
    }
    if (T >= 3) {
        x[(size_t)1 * D + D - 1] = NAN;
        x[(size_t)2 * D + 3] = -INFINITY;
        moe_gemm_fast(best, other, N, x, D, w, wt, N, D, T, b);
        for (int r = 0; r < T; r++)
            for (int n = 0; n < N; n++) {
                const float v = other[(size_t)r * N + n];
                if (r == 1 || r == 2)
                    cr_assert(isnan(v), "%s: row %d holds a non-finite input, output %d is %g", what, r, n, v);
                else
                    cr_assert(memcmp(&v, &got[(size_t)r * N + n], 4) == 0, "%s: row %d changed with row 1's NaN",
                              what, r);
            }
    }
    free(mine);
}

/* A weight matrix (N, D) of dtype t made from seed, and the bound of
 * |fast - reference| for input row x against weight row wf (its exact
 * values; wrow its bytes). */
typedef unsigned char *(*qt_weights_fn)(enum moe_dtype t, int N, int D, uint64_t seed);
typedef double (*qt_bound_fn)(const float *x, const float *wf, const unsigned char *wrow, enum moe_dtype t, int D);

/* The bound for the K-quants (Q5_K, Q6_K), whose kernels quantize the
 * input per block of 256 (dx = max |x| / 127, |x - x^| <= dx / 2): the
 * product differs from the reference by sum_k w_k (x_k - x^_k), at most
 * sum_k |w_k| dx_k / 2; plus fp32 rounding of both sums, taken as 1e-5 of
 * sum_k |w_k x_k|. */
static inline double qt_bound_k256(const float *x, const float *wf, const unsigned char *wrow, enum moe_dtype t,
                                   int D)
{
    (void)wrow, (void)t;
    enum { KB = 256 };
    double input = 0, mag = 0;
    for (int b = 0; b < D / KB; b++) {
        float amax = 0;
        for (int j = 0; j < KB; j++) amax = fmaxf(amax, fabsf(x[KB * b + j]));
        const double dx = (double)amax / 127.0;
        for (int j = 0; j < KB; j++) {
            input += fabs((double)wf[KB * b + j]) * dx / 2;
            mag += fabs((double)wf[KB * b + j] * x[KB * b + j]);
        }
    }
    return input * (1 + 1e-6) + 1e-5 * mag + 1e-30;
}

/* A block of n inputs at xb quantized as the int8-route kernels do
 * (gemm_q8_k.h): its scale dy = max |x| / 127, returned, NaN when *bad (a
 * NaN or an infinity in it: then every code is 0); its codes
 * nearbyint(x *id), *id 0 below 127 FLT_MIN. */
static inline float qt_block_scale(const float *xb, int n, float *id, bool *bad)
{
    float amax = 0.0f;
    *bad = false;
    for (int i = 0; i < n; i++) {
        *bad |= !isfinite(xb[i]);
        amax = fmaxf(amax, fabsf(xb[i]));
    }
    *id = amax >= 127.0f * FLT_MIN ? 127.0f / amax : 0.0f;
    return *bad ? NAN : amax / 127.0f;
}

/* The Q4_K and Q5_K kernels' expression (runtime/cpu/gemm_q4_k.c) for one
 * output in scalar C, five-bit codes when five: per block of 256, the
 * input quantized as gemm_q8_k.h does (one dy, codes nearest), the exact
 * integers S = sum_j sc_j sum_{e in j} q_e c_e and M = sum_j mn_j sum_{e
 * in j} c_e, then acc = fma(-M, dmin dy, fma(S, d dy, acc)); + bias. */
static inline float qt_k_expr(const float *x, const unsigned char *wrow, int D, float bias, bool five)
{
    enum { KB = 256 };
    float acc = 0.0f;
    for (int k = 0; k < D / KB; k++) {
        const float *xb = x + (size_t)k * KB;
        const unsigned char *blk = wrow + (size_t)k * (five ? MOE_Q5_K_BYTES : MOE_Q4_K_BYTES);
        bool bad;
        float id;
        const float dy = qt_block_scale(xb, KB, &id, &bad);
        uint16_t h[2];
        memcpy(h, blk, 4);
        uint64_t scw, mnw;
        moe_q4_k_scales(blk + 4, &scw, &mnw);
        int32_t S = 0, M = 0;
        for (int j = 0; j < 8; j++) {
            const int sc = (int)(scw >> (8 * j) & 0xff), mn = (int)(mnw >> (8 * j) & 0xff);
            for (int e = 0; e < 32; e++) {
                const int32_t c = bad ? 0 : (int32_t)nearbyintf(xb[32 * j + e] * id);
                const int q = five ? (int)moe_q5_k_code(blk, (unsigned)(32 * j + e))
                                   : blk[16 + 32 * (j / 2) + e] >> (4 * (j % 2)) & 15;
                S += sc * q * c;
                M += mn * c;
            }
        }
        const float dd = moe_f16_to_f32(h[0]) * dy, dm = moe_f16_to_f32(h[1]) * dy;
        acc = fmaf(-(float)M, dm, fmaf((float)S, dd, acc));
    }
    return acc + bias;
}

/* The fast product over int8-route weights t (four-bit, Q6_K) for every T
 * of a decode step and a batch, N not a multiple of any tile width, with
 * and without bias: within bound of the reference GEMM (moe_gemm_cpu:
 * exact dequantized weights, fp32 inputs), the AMX sets too where they
 * run; every kernel set the same bits, a row alone the same bits as in the
 * batch, a NaN or an infinity in a row NaN there only
 * (qt_check_int8_invariants). */
static inline void qt_check_fast_int8(enum moe_dtype t, int D, qt_weights_fn make, qt_bound_fn bound_of)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("this processor runs no fast kernel set");
    const int Ts[] = {1, 2, 3, 4, 5, 7, 8, 63, 64, 65, 130}, Ns[] = {1, 13, 51};
    const size_t rb = moe_dtype_row_bytes(t, (size_t)D);
    double worst = 0;
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
        for (size_t c = 0; c < sizeof Ns / sizeof *Ns; c++) {
            const int T = Ts[a], N = Ns[c];
            const bool biased = (a + c) % 2 == 1;
            unsigned char *w = make(t, N, D, (uint64_t)(T * 131 + N * 7 + D + (int)t));
            float *wf = malloc((size_t)N * D * sizeof(float)), *x = malloc((size_t)T * D * sizeof(float)),
                  *ref = malloc((size_t)T * N * 4), *got = malloc((size_t)T * N * 4),
                  *other = malloc((size_t)T * N * 4), *one = malloc((size_t)N * 4),
                  *scratch = malloc((size_t)D * 64 * sizeof(float)), *bias = malloc((size_t)N * 4);
            for (int n = 0; n < N; n++) moe_convert_row_f32(wf + (size_t)n * D, w + (size_t)n * rb, t, (size_t)D);
            tu_fill_uniform(bias, (size_t)N, (uint64_t)N, -1, 1);
            const struct moe_tensor bt = {.dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {N}, .data = bias, .device = -1};
            const struct moe_tensor *b = biased ? &bt : NULL;
            tu_fill_uniform(x, (size_t)T * D, (uint64_t)(T + N + D), -1, 1);
            for (int r = 0; r < T; r++) /* rows of other scales, and a zero block */
                for (int k = 0; k < D; k++) x[(size_t)r * D + k] *= (float)(1 + r % 5) * (r % 3 ? 1.0f : 1e-3f);
            memset(x, 0, 32 * sizeof(float));
            moe_gemm_cpu(ref, N, x, D, w, t, N, D, T, b, scratch);
            char what[96];
            snprintf(what, sizeof what, "%s gemm T=%d N=%d Din=%d%s", moe_dtype_name(t), T, N, D,
                     biased ? " +bias" : "");
            const bool amx = best >= MOE_CPU_ISA_AMX && moe_cpu_amx_int8(); /* the AMX sets' tiles: bits of their own */
            for (int s = 0; s < (amx ? 2 : 1); s++) {
                float *y = s ? other : got;
                moe_gemm_fast(s ? MOE_CPU_ISA_AMX : MOE_CPU_ISA_AVX2, y, N, x, D, w, t, N, D, T, b);
                for (int r = 0; r < T; r++)
                    for (int n = 0; n < N; n++) {
                        const double bound = bound_of(x + (size_t)r * D, wf + (size_t)n * D, w + (size_t)n * rb, t, D);
                        const double g = y[(size_t)r * N + n], e = ref[(size_t)r * N + n];
                        cr_assert(fabs(g - e) <= bound, "%s%s [%d,%d]: %.9g, reference %.9g: beyond the bound %.3g",
                                  what, s ? " amx" : "", r, n, g, e, bound);
                        if (!s) worst = fmax(worst, fabs(g - e) / bound);
                    }
            }
            qt_check_int8_invariants(what, best, x, D, w, t, N, T, b, got, other, one);
            free(w), free(wf), free(x), free(ref), free(got), free(other), free(one), free(scratch), free(bias);
        }
    cr_log_info("%s Din=%d: worst |fast - reference| %.2f of the bound", moe_dtype_name(t), D, worst);
}

/* One output of the fast product in scalar C: input row x, weight row
 * bytes wrow (D values), + bias. */
typedef float (*qt_expr_fn)(const float *x, const unsigned char *wrow, int D, float bias);

/* The fast kernel over weights t (made by make) gives the bits of expr
 * under every kernel set from AVX2 to last (those the processor runs) for
 * every T from 1 to 9, 63-65 and 130 (two passes of input rows), Din 256
 * and 768, N not a multiple of any tile, a slice not starting at 0, with
 * and without bias; inputs of other scales, a zero block, a block whose
 * one large value sets its scale (a kernel scaling blocks of 32 misses
 * it), a block of values near 1e-38 (below 127 FLT_MIN: zero codes), a
 * NaN and an infinity (their rows NaN). */
static inline void qt_check_expression(enum moe_dtype t, enum moe_cpu_isa last, qt_weights_fn make, qt_expr_fn expr)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("this processor runs no fast kernel set");
    if (last > best) last = best;
    /* Din 3840: the K-quant panels (gemm_k_panel.h) take 130 rows in two
     * chunks; T 10 and 16: their first rows */
    const int Ds[] = {256, 768, 3840}, Ns[] = {1, 3, 17}, Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 63, 64, 65, 130};
    for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++)
        for (size_t e = 0; e < sizeof Ns / sizeof *Ns; e++) {
            const int D = Ds[c], N = Ns[e], TMAX = 130;
            const size_t rb = moe_dtype_row_bytes(t, (size_t)D);
            unsigned char *w = make(t, N, D, (uint64_t)(N * 5 + D));
            float *x = malloc((size_t)TMAX * D * sizeof(float)), *bias = malloc((size_t)N * 4),
                  *y = malloc((size_t)TMAX * N * 4);
            tu_fill_uniform(x, (size_t)TMAX * D, (uint64_t)(N + 3 * D), -1, 1);
            for (int r = 0; r < TMAX; r++)
                for (int k = 0; k < D; k++) x[(size_t)r * D + k] *= (float)(1 + r % 5) * (r % 3 ? 1.0f : 1e-3f);
            memset(x + (size_t)D * 3, 0, 256 * sizeof(float));
            x[(size_t)D * 2 + 200] = 37.0f;
            /* a block too small to scale: below 127 FLT_MIN (its codes would overflow), so zero codes */
            for (int k = 0; k < 256; k++) x[(size_t)D * 4 + k] *= 1e-38f;
            x[(size_t)D * 5 + (size_t)D / 2 + 7] = NAN;
            x[(size_t)D * 6 + 3] = -INFINITY;
            tu_fill_uniform(bias, (size_t)N, (uint64_t)N, -1, 1);
            const struct moe_tensor bt = {.dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {N}, .data = bias, .device = -1};
            for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
                for (int isa = MOE_CPU_ISA_AVX2; isa <= (int)last; isa++) {
                    const int T = Ts[a], n0 = T % 2 ? 0 : N / 3;
                    const struct moe_tensor *b = T % 3 == 1 ? &bt : NULL;
                    memset(y, 0, (size_t)T * N * 4);
                    moe_gemm_fast_rows((enum moe_cpu_isa)isa, y, (size_t)N, x, (size_t)D, T, w, t, D, n0, N, b);
                    for (int r = 0; r < T; r++)
                        for (int n = n0; n < N; n++) {
                            const float want = expr(x + (size_t)r * D, w + (size_t)n * rb, D, b ? bias[n] : 0.0f);
                            const float got = y[(size_t)r * N + n];
                            uint32_t bw, bg;
                            memcpy(&bw, &want, 4), memcpy(&bg, &got, 4);
                            if (bw != bg && !(isnan(want) && isnan(got)))
                                cr_assert_fail("%s %s T=%d N=%d Din=%d n0=%d%s [%d,%d]: %.9g (0x%08x), the "
                                               "expression %.9g (0x%08x)", moe_dtype_name(t),
                                               moe_cpu_isa_name((enum moe_cpu_isa)isa), T, N, D, n0,
                                               b ? " +bias" : "", r, n, got, bg, want, bw);
                        }
                    if (T > 6) cr_assert(isnan(y[(size_t)5 * N + n0]) && isnan(y[(size_t)6 * N + n0]));
                }
            free(w), free(x), free(bias), free(y);
        }
}

/* moe_gemm_fast and moe_gemm_fast_multi over the three matrices w (N[i],
 * D) of dtypes dt against x (T, D), large enough to split over the OpenMP
 * team, give the bits the single-threaded rows give (kernel set best). */
static inline void qt_check_parallel_rows(enum moe_cpu_isa best, const float *x, int T, int D,
                                          unsigned char *const w[3], const enum moe_dtype dt[3], const int N[3])
{
    float *y[3], *want[3];
    for (int i = 0; i < 3; i++) {
        y[i] = malloc((size_t)T * N[i] * 4);
        want[i] = malloc((size_t)T * N[i] * 4);
        moe_gemm_fast_rows(best, want[i], (size_t)N[i], x, D, T, w[i], dt[i], D, 0, N[i], NULL);
        moe_gemm_fast(best, y[i], N[i], x, D, w[i], dt[i], N[i], D, T, NULL);
        cr_expect(memcmp(y[i], want[i], (size_t)T * N[i] * 4) == 0, "%s: moe_gemm_fast differs from the rows",
                  moe_dtype_name(dt[i]));
        memset(y[i], 0, (size_t)T * N[i] * 4);
    }
    const void *wv[3] = {w[0], w[1], w[2]};
    moe_gemm_fast_multi(best, 3, y, x, D, wv, dt, N, T, NULL);
    for (int i = 0; i < 3; i++) {
        cr_expect(memcmp(y[i], want[i], (size_t)T * N[i] * 4) == 0, "%s: moe_gemm_fast_multi differs from the rows",
                  moe_dtype_name(dt[i]));
        free(y[i]), free(want[i]);
    }
}

