/* test_delta.c - the Gated DeltaNet op (attention.h, delta_net) of the
 * reference and of the fast backend's AVX2 and AVX-512 compilations
 * against the definition (transformers' torch_recurrent_gated_delta_rule
 * after the causal convolution) computed here in double precision, token
 * by token.  Runs of rows taken whole, in steps of 1, 5 and 70 rows, in
 * each compilation's own choice of form and forced to either, reach its
 * recurrent form and its chunked form over several chunks and a partial
 * one; the fixture model tests (test_forward.c) hold
 * both to transformers. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "tests/testutil.h"

enum { HK = 2, HV = 4, DK = 32, DV = 16, KW = 4, C = 2 * HK * DK + HV * DV, NSEQ = 3 };

/* A layer's inputs: qkv (T, C), b, a (T, Hv), the weights. */
struct delta_case {
    int T, len[NSEQ];
    float *qkv, *b, *a, conv_w[C * KW], a_log[HV], dt_bias[HV];
};

static void case_make(struct delta_case *k, const int len[NSEQ], uint64_t seed, float a_lo, float a_hi)
{
    k->T = 0;
    for (int s = 0; s < NSEQ; s++) k->T += k->len[s] = len[s];
    k->qkv = malloc((size_t)k->T * C * sizeof(float));
    k->b = malloc((size_t)k->T * HV * sizeof(float));
    k->a = malloc((size_t)k->T * HV * sizeof(float));
    tu_fill_uniform(k->qkv, (size_t)k->T * C, seed, -1, 1);
    tu_fill_uniform(k->b, (size_t)k->T * HV, seed + 1, -3, 3);
    tu_fill_uniform(k->a, (size_t)k->T * HV, seed + 2, a_lo, a_hi);
    tu_fill_uniform(k->conv_w, C * KW, seed + 3, -0.8f, 0.8f);
    tu_fill_uniform(k->a_log, HV, seed + 4, -1, 1);
    tu_fill_uniform(k->dt_bias, HV, seed + 5, -0.5f, 0.5f);
}

static void case_free(struct delta_case *k)
{
    free(k->qkv);
    free(k->b);
    free(k->a);
}

/* The definition, each sequence alone from a zero state: out (T, Hv Dv). */
static void reference(const struct delta_case *k, double *out)
{
    int r0 = 0;
    for (int s = 0; s < NSEQ; s++) {
        const int n = k->len[s];
        double *x = calloc((size_t)n * C, sizeof(double)), *S = calloc((size_t)HV * DK * DV, sizeof(double));
        for (int t = 0; t < n; t++) /* causal depthwise convolution over zeros before the start, SiLU */
            for (int c = 0; c < C; c++) {
                double y = 0;
                for (int j = 0; j < KW; j++) {
                    const int u = t - (KW - 1) + j;
                    if (u >= 0) y += (double)k->conv_w[c * KW + j] * k->qkv[(size_t)(r0 + u) * C + c];
                }
                x[(size_t)t * C + c] = y / (1 + exp(-y));
            }
        for (int t = 0; t < n; t++)
            for (int h = 0; h < HV; h++) {
                const int kh = h / (HV / HK);
                const double *qr = &x[(size_t)t * C + kh * DK], *kr = &x[(size_t)t * C + HK * DK + kh * DK];
                const double *v = &x[(size_t)t * C + 2 * HK * DK + h * DV];
                double q[DK], kk[DK], nq = 0, nk = 0, d[DV];
                for (int i = 0; i < DK; i++) nq += qr[i] * qr[i], nk += kr[i] * kr[i];
                for (int i = 0; i < DK; i++) {
                    q[i] = qr[i] / sqrt(nq + 1e-6) / sqrt((double)DK);
                    kk[i] = kr[i] / sqrt(nk + 1e-6);
                }
                const double bv = k->b[(size_t)(r0 + t) * HV + h], av = k->a[(size_t)(r0 + t) * HV + h];
                const double beta = 1 / (1 + exp(-bv)), sp = av + k->dt_bias[h] > 20 ? av + k->dt_bias[h]
                                                                                   : log1p(exp(av + k->dt_bias[h]));
                const double decay = exp(-exp((double)k->a_log[h]) * sp);
                double *Sh = &S[(size_t)h * DK * DV];
                for (int j = 0; j < DV; j++) {
                    double y = 0;
                    for (int i = 0; i < DK; i++) y += (Sh[i * DV + j] *= decay) * kk[i];
                    d[j] = (v[j] - y) * beta;
                }
                for (int j = 0; j < DV; j++) {
                    double o = 0;
                    for (int i = 0; i < DK; i++) o += (Sh[i * DV + j] += kk[i] * d[j]) * q[i];
                    out[(size_t)(r0 + t) * HV * DV + h * DV + j] = o;
                }
            }
        free(x);
        free(S);
        r0 += n;
    }
}

typedef enum moe_status (*delta_fn)(float *, float *, const float *, const float *, struct moe_kvcache *,
                                    const struct moe_batch *, const struct moe_delta_params *, float *, size_t);

/* The op over the case, each sequence's rows split into steps of at most
 * step rows (0: one step for all sequences together): out (T, Hv Dv). */
static void run_op(delta_fn fn, const struct delta_case *k, int step, int chunk_min, float *out)
{
    const size_t conv_f = (size_t)C * (KW - 1), layer_f = conv_f + (size_t)HV * DK * DV;
    struct moe_kvcache kv = {.n_state_slots = NSEQ, .state_floats = layer_f, .state_layer_floats = layer_f,
                             .state_conv_floats = conv_f};
    kv.state = malloc(NSEQ * layer_f * sizeof(float));
    memset(kv.state, 0xff, NSEQ * layer_f * sizeof(float)); /* NaN: a start at position 0 must clear it */
    const struct moe_delta_params p = {.layer = 0, .n_k_heads = HK, .n_v_heads = HV, .k_dim = DK, .v_dim = DV,
                                       .conv = KW, .conv_w = k->conv_w, .a_log = k->a_log, .dt_bias = k->dt_bias,
                                       .chunk_min = chunk_min};
    const size_t per = moe_attention_delta_scratch(DK, DV);
    const size_t sbytes = (size_t)omp_get_max_threads() * per * sizeof(float);
    float *scratch = malloc(sbytes), *qkv = malloc((size_t)k->T * C * sizeof(float));
    memset(scratch, 0xff, sbytes); /* NaN: what the op reads, it wrote first */
    memcpy(qkv, k->qkv, (size_t)k->T * C * sizeof(float));
    int32_t *pos = malloc((size_t)k->T * sizeof(int32_t)), start[NSEQ + 1], slot[NSEQ];
    if (step == 0) { /* every sequence whole, in one batch */
        struct moe_batch bt = {.n_tokens = k->T, .n_seqs = NSEQ, .positions = pos, .seq_start = start,
                               .state_slot = slot};
        start[0] = 0;
        for (int s = 0; s < NSEQ; s++) {
            start[s + 1] = start[s] + k->len[s];
            slot[s] = NSEQ - 1 - s;
            for (int t = 0; t < k->len[s]; t++) pos[start[s] + t] = t;
        }
        cr_assert_eq(fn(out, qkv, k->b, k->a, &kv, &bt, &p, scratch, per), MOE_OK);
    } else {
        int r0 = 0;
        for (int s = 0; s < NSEQ; r0 += k->len[s++])
            for (int t = 0; t < k->len[s]; t += step) {
                const int n = k->len[s] - t < step ? k->len[s] - t : step, r = r0 + t;
                for (int i = 0; i < n; i++) pos[i] = t + i;
                int32_t st[2] = {0, n}, sl = s;
                struct moe_batch bt = {.n_tokens = n, .n_seqs = 1, .positions = pos, .seq_start = st,
                                       .state_slot = &sl};
                cr_assert_eq(fn(out + (size_t)r * HV * DV, qkv + (size_t)r * C, k->b + (size_t)r * HV,
                                k->a + (size_t)r * HV, &kv, &bt, &p, scratch, per), MOE_OK);
            }
    }
    free(pos);
    free(qkv);
    free(scratch);
    free(kv.state);
}

/* Every row of out within tol of the definition, relative to the row's largest value. */
static void expect_close(const char *what, const float *out, const double *ref, int T, double tol)
{
    for (int t = 0; t < T; t++) {
        double m = 0, e = 0;
        for (int j = 0; j < HV * DV; j++) {
            const double r = ref[(size_t)t * HV * DV + j];
            m = fmax(m, fabs(r));
            e = fmax(e, fabs(out[(size_t)t * HV * DV + j] - r));
        }
        cr_expect(e <= tol * m, "%s: row %d: max |diff| %.3g of max %.3g", what, t, e, m);
        if (!(e <= tol * m)) return;
    }
}

static void check(const int len[NSEQ], uint64_t seed, float a_lo, float a_hi, double tol)
{
    struct delta_case k;
    case_make(&k, len, seed, a_lo, a_hi);
    double *ref = malloc((size_t)k.T * HV * DV * sizeof(double));
    float *out = malloc((size_t)k.T * HV * DV * sizeof(float));
    reference(&k, ref);
    const delta_fn fns[3] = {moe_attention_delta_cpu, moe_attention_delta_avx2, moe_attention_delta_avx512};
    const char *names[3] = {"reference", "avx2", "avx-512"};
    const int steps[4] = {0, 1, 5, 70}, forms[3] = {0, 1 << 30, 2}; /* the compilation's, recurrent, chunked */
    const char *form_names[3] = {"its own forms", "recurrent", "chunked"};
    for (int f = 0; f < 3 && f <= (int)moe_cpu_isa_detect(); f++)
        for (int m = 0; m < 3; m++)
            for (int i = 0; i < 4; i++) {
                char what[96];
                snprintf(what, sizeof what, "%s, %s, steps of %d", names[f], form_names[m], steps[i]);
                memset(out, 0, (size_t)k.T * HV * DV * sizeof(float));
                run_op(fns[f], &k, steps[i], forms[m], out);
                expect_close(what, out, ref, k.T, tol);
            }
    free(out);
    free(ref);
    case_free(&k);
}

/* 150 rows: chunks of 64, 64, 22; 9: one short chunk; 3: recurrent */
Test(delta, both_forms_match_the_definition) { check((const int[NSEQ]){150, 9, 3}, 11, -4, 2, 2e-5); }

/* decays near 1 (a very negative: the state keeps everything) and near 0
 * (a large: g of -10 and below, e^G of a chunk underflows to 0).  There
 * the chunked form's e^(G_i - G_j) differences two running sums of
 * hundreds, losing about 2^-24 of them: 1e-4 of the (tiny) outputs, as in
 * transformers' chunked form. */
Test(delta, slow_decay) { check((const int[NSEQ]){130, 64, 1}, 21, -12, -8, 2e-5); }
Test(delta, fast_decay) { check((const int[NSEQ]){130, 65, 7}, 31, 8, 12, 1e-4); }

/* A sequence's rows give the same bits in a batch as alone: the other
 * sequences' rows and slots change nothing. */
Test(delta, batch_neighbours_change_nothing)
{
    struct delta_case k;
    case_make(&k, (const int[NSEQ]){100, 20, 4}, 41, -4, 2);
    const size_t n = (size_t)k.T * HV * DV;
    float *together = malloc(n * sizeof(float)), *apart = malloc(n * sizeof(float));
    const delta_fn fns[3] = {moe_attention_delta_cpu, moe_attention_delta_avx2, moe_attention_delta_avx512};
    for (int f = 0; f < 3 && f <= (int)moe_cpu_isa_detect(); f++) {
        run_op(fns[f], &k, 0, 2, together);
        run_op(fns[f], &k, 1 << 20, 2, apart); /* each sequence whole, alone */
        cr_expect(memcmp(together, apart, n * sizeof(float)) == 0, "backend %d: batched differs from alone", f);
    }
    free(together);
    free(apart);
    case_free(&k);
}
