/* test_fast_ops.c - the fast CPU GEMM kernels against the reference, and
 * the contracts of the fast kernels that a comparison with the reference
 * does not pin.
 *
 * Every fast kernel set this processor runs (AVX2, AVX-512, AMX) multiplies
 * seeded random inputs over a grid of awkward shapes (sizes that are not
 * multiples of the vector width, one row, more rows than a cache block,
 * F32/F16/BF16 weights, bf16 panels) to fp32 tolerance of the reference,
 * and each row's result does not depend on the rest of the batch (checked
 * exactly); several
 * products in one region equal the separate ones bit for bit, and the
 * AVX2 and AVX-512 panel kernels give the same bits.  The backend's
 * panels and options are checked here too.  Every op of the fast backend
 * (experts and attention included) is compared with cpu-ref in
 * test_backend_ops.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_fast.h"
#include "runtime/engine/runner.h"
#include "tests/testutil.h"

static const enum moe_dtype dtypes[] = {MOE_DTYPE_F32, MOE_DTYPE_F16, MOE_DTYPE_BF16};

/* Kernel sets to test against fp32 tolerances: those the processor runs,
 * narrowest first (on AMX, the variant whose inputs are exact; the others
 * are held to their inputs' rounding: amx_inputs_within_their_rounding). */
static int isas(enum moe_cpu_isa *out)
{
    enum moe_cpu_isa best = moe_cpu_isa_detect();
    int n = 0;
    for (int i = MOE_CPU_ISA_AVX2; i <= (int)best && i <= MOE_CPU_ISA_AVX512; i++) out[n++] = (enum moe_cpu_isa)i;
    if (best >= MOE_CPU_ISA_AMX) out[n++] = MOE_CPU_ISA_AMX_EXACT;
    return n;
}

/* n random weights in [-1, 1) stored as dtype t (new memory). */
static void *random_weights(size_t n, enum moe_dtype t, uint64_t seed)
{
    float *f = malloc(n * sizeof(float));
    tu_fill_uniform(f, n, seed, -1, 1);
    void *w = malloc(n * moe_dtype_size(t) + 4);
    moe_convert_from_f32(w, f, t, n);
    free(f);
    return w;
}

/* Tolerance for dot products of length n of values in [-1, 1). */
static float dot_atol(int n) { return 2e-6f * (float)n + 1e-6f; }

static void *pack(const void *w, int N, int K);

/* The fast GEMM equals the reference, and each row alone gives the bits it
 * gets in the batch.  With panels (bf16 only) the fast side multiplies a
 * packed copy of the weights. */
static void check_gemm(enum moe_cpu_isa isa, enum moe_dtype t, int T, int N, int Din, bool bias,
                       enum moe_dtype bias_dt, bool panels)
{
    uint64_t seed = (uint64_t)T * 1000003u + (uint64_t)N * 1009u + (uint64_t)Din * 7u + t;
    void *w = random_weights((size_t)N * Din, t, seed);
    void *p = panels ? pack(w, N, Din) : NULL;
    const void *fw = panels ? p : w;
    const enum moe_dtype ft = panels ? MOE_DTYPE_BF16_PANEL : t;
    float *x = malloc((size_t)T * Din * sizeof(float));
    tu_fill_uniform(x, (size_t)T * Din, seed + 1, -1, 1);
    void *bv = random_weights((size_t)N, bias_dt, seed + 2);
    struct moe_tensor b = {.dtype = bias_dt, .ndim = 1, .shape = {N}, .data = bv};
    float *ref = malloc((size_t)T * N * sizeof(float)), *got = malloc((size_t)T * N * sizeof(float));
    float *one = malloc((size_t)N * sizeof(float));
    float *scratch = malloc((size_t)Din * 64 * sizeof(float));
    moe_gemm_cpu(ref, N, x, Din, w, t, N, Din, T, bias ? &b : NULL, scratch);
    moe_gemm_fast(isa, got, N, x, Din, fw, ft, N, Din, T, bias ? &b : NULL);
    char what[160];
    snprintf(what, sizeof what, "gemm %s %s%s T=%d N=%d Din=%d bias=%s", moe_cpu_isa_name(isa),
             moe_dtype_name(t), panels ? " panels" : "", T, N, Din,
             bias ? moe_dtype_name(bias_dt) : "none");
    cr_expect(tu_allclose(what, got, ref, (size_t)T * N, dot_atol(Din), 1e-5f), "%s", what);
    /* row independence: each row alone gives the same bits */
    for (int r = 0; r < T; r += (T > 8 ? 7 : 1)) {
        moe_gemm_fast(isa, one, N, x + (size_t)r * Din, Din, fw, ft, N, Din, 1, bias ? &b : NULL);
        cr_expect(memcmp(one, got + (size_t)r * N, (size_t)N * sizeof(float)) == 0,
                  "%s: row %d alone differs from the batch", what, r);
    }
    free(w);
    free(p);
    free(x);
    free(bv);
    free(ref);
    free(got);
    free(one);
    free(scratch);
}

Test(fast_ops, gemm_matches_reference_awkward_shapes)
{
    enum moe_cpu_isa is[4];
    int ni = isas(is);
    if (ni == 0) cr_skip_test("this processor runs no fast kernel set");
    const int Ts[] = {1, 2, 3, 4, 5, 7, 12, 18, 67};
    const int Ns[] = {1, 5, 13, 50, 97};
    const int Ds[] = {1, 7, 16, 33, 63, 64, 100}; /* bf16 blocks are 32 */
    for (int i = 0; i < ni; i++)
        for (size_t d = 0; d < 3; d++)
            for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
                for (size_t n = 0; n < sizeof Ns / sizeof Ns[0]; n++)
                    for (size_t k = 0; k < sizeof Ds / sizeof Ds[0]; k++)
                        check_gemm(is[i], dtypes[d], Ts[a], Ns[n], Ds[k], (a + n + k) % 2 == 0,
                                   MOE_DTYPE_F32, false);
}

Test(fast_ops, gemm_large_parallel_bf16_and_f16)
{
    enum moe_cpu_isa is[4];
    int ni = isas(is);
    if (ni == 0) cr_skip_test("this processor runs no fast kernel set");
    for (int i = 0; i < ni; i++) {
        check_gemm(is[i], MOE_DTYPE_BF16, 130, 301, 259, true, MOE_DTYPE_F32, false);
        check_gemm(is[i], MOE_DTYPE_F16, 1, 1027, 515, false, MOE_DTYPE_F32, false);
    }
}

/* Several products of one input in one region give exactly the separate
 * products (mixed dtypes, one bias, sizes not multiples of a tile). */
Test(fast_ops, gemm_multi_equals_separate_products)
{
    enum moe_cpu_isa is[4];
    int ni = isas(is);
    if (ni == 0) cr_skip_test("this processor runs no fast kernel set");
    enum { T = 5, Din = 77 };
    const int N[3] = {131, 17, 50};
    const enum moe_dtype wt[3] = {MOE_DTYPE_BF16, MOE_DTYPE_F16, MOE_DTYPE_F32};
    float x[T * Din], bv[17];
    tu_fill_uniform(x, T * Din, 5, -1, 1);
    tu_fill_uniform(bv, 17, 6, -1, 1);
    struct moe_tensor b = {.dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {17}, .data = bv};
    const struct moe_tensor *bs[3] = {NULL, &b, NULL};
    for (int i = 0; i < ni; i++) {
        const void *w[3];
        float *y[3], *want[3];
        for (int j = 0; j < 3; j++) {
            w[j] = random_weights((size_t)N[j] * Din, wt[j], 40 + j);
            y[j] = malloc((size_t)T * N[j] * sizeof(float));
            want[j] = malloc((size_t)T * N[j] * sizeof(float));
            moe_gemm_fast(is[i], want[j], N[j], x, Din, w[j], wt[j], N[j], Din, T, bs[j]);
        }
        moe_gemm_fast_multi(is[i], 3, y, x, Din, w, wt, N, T, bs);
        for (int j = 0; j < 3; j++) {
            cr_expect(memcmp(y[j], want[j], (size_t)T * N[j] * sizeof(float)) == 0,
                      "%s: product %d differs", moe_cpu_isa_name(is[i]), j);
            free((void *)w[j]);
            free(y[j]);
            free(want[j]);
        }
    }
}

Test(fast_ops, backend_names_and_selection)
{
    struct moe_backend be;
    cr_assert_eq(moe_backend_init(&be, "cpu-ref", NULL), MOE_OK);
    cr_expect_str_eq(be.ops->name, "cpu-ref");
    cr_expect_eq(moe_backend_cpu_isa(&be), MOE_CPU_ISA_REF);
    moe_backend_free(&be);
    cr_assert_eq(moe_backend_init(&be, "cpu", NULL), MOE_OK);
    cr_expect_eq(moe_backend_cpu_isa(&be), (int)moe_cpu_isa_choose(MOE_CPU_ISA_DEFAULT_CAP));
    cr_expect_str_eq(be.ops->name, moe_cpu_isa_detect() == MOE_CPU_ISA_REF ? "cpu-ref" : "cpu");
    moe_backend_free(&be);
}

/* ---- bf16 weights in panels ---- */

/* Kernel sets with panel kernels this processor runs (all fast ones). */
static int panel_isas(enum moe_cpu_isa *out) { return isas(out); }

/* w (N, K) bf16 in panels (new 64-byte aligned memory). */
static void *pack(const void *w, int N, int K)
{
    size_t bytes;
    cr_assert(moe_gemm_panel_bytes(N, K, &bytes), "panel size of (%d, %d)", N, K);
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    memset(p, 0xa5, bytes); /* every byte must be written */
    moe_gemm_pack_panels(p, w, N, K);
    return p;
}

/* The layout as tensor.h describes it, read back element by element. */
static uint16_t panel_at(const void *p, int K, int n, int k)
{
    const uint32_t *lanes = p;
    uint32_t v = lanes[(size_t)(n / 16) * 16 * (K / 2) + (size_t)(k / 2) * 16 + n % 16];
    return (uint16_t)(k % 2 ? v >> 16 : v & 0xffff);
}

Test(fast_ops, panels_pack_round_trip)
{
    const int Ns[] = {1, 15, 16, 17, 50, 100};
    const int Ks[] = {2, 32, 34, 64, 100, 258};
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t b = 0; b < sizeof Ks / sizeof Ks[0]; b++) {
            const int N = Ns[a], K = Ks[b], Np = (N + 15) / 16 * 16;
            uint16_t *w = random_weights((size_t)N * K, MOE_DTYPE_BF16, (uint64_t)N * 31 + K);
            void *p = pack(w, N, K);
            size_t bytes;
            cr_assert(moe_gemm_panel_bytes(N, K, &bytes));
            cr_expect_eq(bytes, (size_t)Np * K * 2);
            int bad = 0;
            for (int n = 0; n < Np; n++)
                for (int k = 0; k < K; k++)
                    bad += panel_at(p, K, n, k) != (n < N ? w[(size_t)n * K + k] : 0);
            cr_expect_eq(bad, 0, "N=%d K=%d: %d elements differ after unpacking", N, K, bad);
            free(w);
            free(p);
        }
    size_t bytes;
    cr_expect_not(moe_gemm_panel_bytes(16, 7, &bytes), "odd K cannot be packed");
    cr_expect_not(moe_gemm_panel_bytes(0, 8, &bytes));
    cr_expect_not(moe_gemm_panel_bytes((int64_t)1 << 40, 8, &bytes));
}

Test(fast_ops, gemm_panels_match_reference)
{
    enum moe_cpu_isa is[4];
    const int ni = panel_isas(is);
    if (ni == 0) cr_skip_test("this processor runs no fast kernel set");
    const int Ts[] = {1, 2, 3, 4, 5, 7, 12, 18, 47, 48, 67};
    const int Ns[] = {1, 5, 13, 16, 50, 97, 160};
    const int Ks[] = {2, 16, 34, 64, 100}; /* even: K pairs */
    const enum moe_dtype bts[] = {MOE_DTYPE_F32, MOE_DTYPE_BF16, MOE_DTYPE_F16};
    for (int i = 0; i < ni; i++) {
        for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
            for (size_t n = 0; n < sizeof Ns / sizeof Ns[0]; n++)
                for (size_t k = 0; k < sizeof Ks / sizeof Ks[0]; k++)
                    check_gemm(is[i], MOE_DTYPE_BF16, Ts[a], Ns[n], Ks[k], (a + n + k) % 2 == 0,
                               bts[(a + k) % 3], true);
        /* many row blocks, and k blocks of the widened panels (K > 4096) */
        check_gemm(is[i], MOE_DTYPE_BF16, 1100, 70, 64, true, MOE_DTYPE_F32, true);
        check_gemm(is[i], MOE_DTYPE_BF16, 60, 33, 8200, false, MOE_DTYPE_F32, true);
    }
}

/* Every row of x alone gives the same bits as in batches of every size the
 * kernels treat differently (1..67 and 512 rows, at every offset a batch
 * of that size falls on), whole or sliced at panel boundaries, and with k
 * blocks when K is long. */
static void check_panel_bits(enum moe_cpu_isa isa, int N, int K, int rows, const int *sizes,
                             int n_sizes)
{
    void *w = random_weights((size_t)N * K, MOE_DTYPE_BF16, (uint64_t)N * K);
    void *p = pack(w, N, K);
    float *x = malloc((size_t)rows * K * sizeof(float));
    tu_fill_uniform(x, (size_t)rows * K, 77, -1, 1);
    float *alone = malloc((size_t)rows * N * sizeof(float)), *got = malloc((size_t)rows * N * sizeof(float));
    for (int r = 0; r < rows; r++)
        moe_gemm_fast_rows(isa, alone + (size_t)r * N, (size_t)N, x + (size_t)r * K,
                           (size_t)K, 1, p, MOE_DTYPE_BF16_PANEL, K, 0, N, NULL);
    for (int i = 0; i < n_sizes; i++) {
        const int B = sizes[i];
        memset(got, 0, (size_t)rows * N * sizeof(float));
        for (int t0 = 0; t0 < rows; t0 += B) {
            const int tn = rows - t0 < B ? rows - t0 : B;
            moe_gemm_fast(isa, got + (size_t)t0 * N, N, x + (size_t)t0 * K, K, p,
                          MOE_DTYPE_BF16_PANEL, N, K, tn, NULL);
        }
        cr_expect(memcmp(got, alone, (size_t)rows * N * sizeof(float)) == 0,
                  "%s N=%d K=%d: batches of %d rows differ from rows alone",
                  moe_cpu_isa_name(isa), N, K, B);
        /* the same batches, as slices at panel boundaries (and one that is not) */
        const int cuts[][4] = {{0, 16, 48, N}, {0, 32, N, N}, {0, 7, 40, N}};
        for (int c = 0; c < 3; c++) {
            memset(got, 0, (size_t)rows * N * sizeof(float));
            for (int t0 = 0; t0 < rows; t0 += B) {
                const int tn = rows - t0 < B ? rows - t0 : B;
                for (int j = 0; j < 3; j++)
                    moe_gemm_fast_rows(isa, got + (size_t)t0 * N, (size_t)N,
                                       x + (size_t)t0 * K, (size_t)K, tn, p, MOE_DTYPE_BF16_PANEL,
                                       K, cuts[c][j] < N ? cuts[c][j] : N,
                                       cuts[c][j + 1] < N ? cuts[c][j + 1] : N, NULL);
            }
            cr_expect(memcmp(got, alone, (size_t)rows * N * sizeof(float)) == 0,
                      "%s N=%d K=%d: batches of %d rows sliced at %d,%d,%d differ from rows "
                      "alone", moe_cpu_isa_name(isa), N, K, B, cuts[c][1], cuts[c][2], cuts[c][3]);
        }
    }
    free(w);
    free(p);
    free(x);
    free(alone);
    free(got);
}

Test(fast_ops, gemm_panels_rows_bit_identical_in_any_batch)
{
    enum moe_cpu_isa is[4];
    const int ni = panel_isas(is);
    if (ni == 0) cr_skip_test("this processor runs no fast kernel set");
    int sizes[68];
    for (int i = 0; i < 67; i++) sizes[i] = i + 1;
    sizes[67] = 512;
    const int long_k[] = {1, 3, 12, 48, 61};
    for (int i = 0; i < ni; i++) {
        check_panel_bits(is[i], 100, 130, 600, sizes, 68);
        check_panel_bits(is[i], 40, 8200, 61, long_k, 5);
    }
}

/* The AVX2 and AVX-512 panel kernels give the same bits: each output is the
 * same FMA chain over k in its own lane whatever the vector width (batches
 * of the sizes each set treats differently, N not a multiple of 16, every
 * bias dtype, k blocks, slices that do not start on a panel). */
Test(fast_ops, gemm_panels_avx2_bits_equal_avx512)
{
    if (moe_cpu_isa_detect() < MOE_CPU_ISA_AVX512) cr_skip_test("needs AVX-512 to compare");
    const int Ts[] = {1, 2, 3, 4, 5, 7, 12, 47, 48, 100, 512, 530};
    const int Ns[] = {1, 13, 50, 97, 200};
    const int Ks[] = {2, 64, 130};
    const enum moe_dtype bts[] = {MOE_DTYPE_F32, MOE_DTYPE_BF16, MOE_DTYPE_F16};
    int bad = 0, cases = 0;
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (size_t n = 0; n < sizeof Ns / sizeof Ns[0]; n++)
            for (size_t k = 0; k < sizeof Ks / sizeof Ks[0] + 1; k++) {
                const int T = Ts[a], N = Ns[n];
                const int K = k < sizeof Ks / sizeof Ks[0] ? Ks[k] : 8200;
                if (K == 8200 && (T > 100 || N > 50)) continue; /* k blocks: a few suffice */
                void *w = random_weights((size_t)N * K, MOE_DTYPE_BF16, (uint64_t)(T * 31 + N * 7 + K));
                void *p = pack(w, N, K);
                float *x = malloc((size_t)T * K * sizeof(float));
                tu_fill_uniform(x, (size_t)T * K, (uint64_t)(T + N + K), -1, 1);
                const enum moe_dtype bt = bts[(a + n + k) % 3];
                float bf[200];
                uint16_t bh[200];
                tu_fill_uniform(bf, (size_t)N, 9, -1, 1);
                if (bt != MOE_DTYPE_F32) moe_convert_from_f32(bh, bf, bt, (size_t)N);
                struct moe_tensor b = {.dtype = bt, .ndim = 1, .shape = {N},
                                       .data = bt == MOE_DTYPE_F32 ? (void *)bf : (void *)bh};
                const struct moe_tensor *bp = (a + k) % 2 ? &b : NULL;
                float *y2 = malloc((size_t)T * N * sizeof(float));
                float *y5 = malloc((size_t)T * N * sizeof(float));
                memset(y2, 0x55, (size_t)T * N * sizeof(float));
                memset(y5, 0x55, (size_t)T * N * sizeof(float));
                moe_gemm_fast(MOE_CPU_ISA_AVX2, y2, N, x, K, p, MOE_DTYPE_BF16_PANEL, N, K, T, bp);
                moe_gemm_fast(MOE_CPU_ISA_AVX512, y5, N, x, K, p, MOE_DTYPE_BF16_PANEL, N, K, T, bp);
                bad += memcmp(y2, y5, (size_t)T * N * sizeof(float)) != 0;
                cr_expect(memcmp(y2, y5, (size_t)T * N * sizeof(float)) == 0,
                          "T=%d N=%d K=%d bias=%s: AVX2 and AVX-512 panel bits differ", T, N, K,
                          bp ? moe_dtype_name(bt) : "none");
                /* AVX2 in slices that start and end off panel boundaries */
                memset(y2, 0x55, (size_t)T * N * sizeof(float));
                const int cuts[] = {0, N / 3, N / 3 + 21 < N ? N / 3 + 21 : N, N};
                for (int j = 0; j < 3; j++)
                    if (cuts[j] < cuts[j + 1])
                        moe_gemm_fast_rows(MOE_CPU_ISA_AVX2, y2, (size_t)N, x, (size_t)K, T, p,
                                           MOE_DTYPE_BF16_PANEL, K, cuts[j], cuts[j + 1], bp);
                bad += memcmp(y2, y5, (size_t)T * N * sizeof(float)) != 0;
                cr_expect(memcmp(y2, y5, (size_t)T * N * sizeof(float)) == 0,
                          "T=%d N=%d K=%d: AVX2 slices at %d,%d differ from AVX-512", T, N, K,
                          cuts[1], cuts[2]);
                cases += 2;
                free(w);
                free(p);
                free(x);
                free(y2);
                free(y5);
            }
    cr_log_info("panels avx2 vs avx512: %d of %d comparisons differ", bad, cases);
}

/* The kernel sets over inputs split into bf16 parts that this processor
 * runs (the AMX variants, avx512-bf16), with each one's bound on an
 * input's rounding: three parts exact, two within 2^-16, one (bf16)
 * within 2^-8. */
static int split_isas(enum moe_cpu_isa *out, double *bound)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    int n = 0;
    if (best >= MOE_CPU_ISA_AMX) {
        out[n] = MOE_CPU_ISA_AMX_EXACT, bound[n++] = 0.0;
        out[n] = MOE_CPU_ISA_AMX, bound[n++] = 0x1p-16;
        out[n] = MOE_CPU_ISA_AMX_BF16, bound[n++] = 0x1p-8;
    }
    if (best >= MOE_CPU_ISA_AVX512_BF16) out[n] = MOE_CPU_ISA_AVX512_BF16, bound[n++] = 0x1p-8;
    return n;
}

/* The input split: three parts sum to the input exactly (bf16 values;
 * residues below bf16's normal range flushed), two to within 2^-16 of
 * it, one (bf16) to within 2^-8; infinities keep zero residues, NaN
 * stays NaN, the padding past K is zero. */
Test(fast_ops, input_split_within_its_parts)
{
    enum moe_cpu_isa sets[4];
    double bound[4];
    const int ns = split_isas(sets, bound);
    if (ns == 0) cr_skip_test("needs AMX or AVX512-BF16");
    enum { K = 1000, R = 3 };
    float *x = malloc((size_t)R * K * sizeof(float));
    uint64_t st = 7;
    for (int i = 0; i < R * K; i++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        const float m = (float)(st >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
        x[i] = ldexpf(m, (int)(st % 200) - 100);
    }
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 1.0f + 0x1p-23f, -3.0e38f, 0x1.fffffep-1f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[K + (int)i] = special[i];
    for (int v = 0; v < ns; v++) {
        const enum moe_cpu_isa isa = sets[v];
        const int P = moe_amx_parts(isa);
        const size_t lds = moe_gemm_split_ld(isa, K), kp = (lds - 32) / (size_t)P;
        cr_assert_eq(P, bound[v] == 0.0 ? 3 : bound[v] == 0x1p-16 ? 2 : 1, "%s: %d parts", moe_cpu_isa_name(isa), P);
        cr_assert(kp >= K && kp % 32 == 0 && lds == (size_t)P * kp + 32, "split row of K=%d: ld %zu", K, lds);
        uint16_t *xs = moe_gemm_split_buffer(isa, R, K);
        cr_assert(xs);
        memset(xs, 0x5a, (size_t)R * lds * sizeof(uint16_t));
        moe_gemm_split_rows(isa, xs, lds, x, K, 0, R, K);
        int bad = 0;
        for (int r = 0; r < R; r++)
            for (size_t k = 0; k < kp; k++) {
                const uint16_t *h = xs + (size_t)r * lds + k;
                double sum = 0.0;
                float part[3] = {0, 0, 0};
                for (int j = 0; j < P; j++) {
                    const uint32_t u = (uint32_t)h[(size_t)j * kp] << 16;
                    memcpy(&part[j], &u, 4);
                    sum += part[j];
                }
                const float val = k < K ? x[(size_t)r * K + k] : 0.0f;
                bool ok;
                if (isnan(val))
                    ok = isnan(part[0]);
                else if (isinf(val))
                    ok = part[0] == val && part[1] == 0 && part[2] == 0;
                else if (fabsf(val) < 0x1p-100f)
                    ok = fabs(sum - val) <= fmax(0x1p-126, bound[v] * fabs(val));
                else if (fabsf(val) > 3.3e38f)
                    ok = true; /* past bf16's range: documented to become infinite */
                else
                    ok = fabs(sum - val) <= bound[v] * fabs(val);
                bad += !ok;
                if (!ok && bad < 5)
                    cr_log_error("%s row %d k %zu: %a split %a + %a + %a", moe_cpu_isa_name(isa), r, k,
                                 (double)val, (double)part[0], (double)part[1], (double)part[2]);
            }
        cr_expect_eq(bad, 0, "%s: %d inputs outside their split's bound", moe_cpu_isa_name(isa), bad);
    }
    free(x);
}

/* The sets whose inputs are split into bf16 parts (amx-exact: exact;
 * amx, two parts, and amx-bf16 and avx512-bf16, one, rounded): each
 * output within its inputs' rounding of the exact sum, sum over k of
 * bound |x_k w_k|, plus fp32's; and a row's bits the same alone or in any
 * batch, sliced or not.  Shapes: decode's 1-3 rows, row tiles of 1-6
 * rows, several k blocks (K 4098 and 600), row blocks past 256. */
Test(fast_ops, split_inputs_within_their_rounding)
{
    enum moe_cpu_isa sets[4];
    double bound[4];
    const int ns = split_isas(sets, bound);
    if (ns == 0) cr_skip_test("needs AMX or AVX512-BF16");
    const int shapes[][3] = {{1, 37, 78}, {2, 200, 34}, {3, 129, 600}, {17, 97, 258}, {65, 130, 2},
                             {300, 40, 4098}, {261, 70, 600}};
    for (int v = 0; v < ns; v++)
        for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
            const int T = shapes[c][0], N = shapes[c][1], K = shapes[c][2];
            uint16_t *w = random_weights((size_t)N * K, MOE_DTYPE_BF16, (uint64_t)(c + 11));
            void *p = pack(w, N, K);
            float *x = malloc((size_t)T * K * sizeof(float)), *y = malloc((size_t)T * N * sizeof(float));
            tu_fill_uniform(x, (size_t)T * K, (uint64_t)(c + 21), -1, 1);
            moe_gemm_fast(sets[v], y, N, x, K, p, MOE_DTYPE_BF16_PANEL, N, K, T, NULL);
            int bad = 0;
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++) {
                    double exact = 0.0, mag = 0.0;
                    for (int k = 0; k < K; k++) {
                        const uint32_t u = (uint32_t)w[(size_t)n * K + k] << 16;
                        float wv;
                        memcpy(&wv, &u, 4);
                        exact += (double)x[(size_t)t * K + k] * wv;
                        mag += fabs((double)x[(size_t)t * K + k] * wv);
                    }
                    const double err = fabs(y[(size_t)t * N + n] - exact);
                    if (!(err <= bound[v] * mag + dot_atol(K))) {
                        if (bad++ < 3)
                            cr_log_error("%s T=%d N=%d K=%d: y[%d][%d] off by %g, bound %g",
                                         moe_cpu_isa_name(sets[v]), T, N, K, t, n, err, bound[v] * mag + dot_atol(K));
                    }
                }
            cr_expect_eq(bad, 0, "%s T=%d N=%d K=%d: %d outputs outside the bound", moe_cpu_isa_name(sets[v]), T, N,
                         K, bad);
            free(w);
            free(p);
            free(x);
            free(y);
        }
    int sizes[48];
    for (int i = 0; i < 39; i++) sizes[i] = i + 1;
    const int wide[] = {200, 47, 48, 49, 63, 64, 65, 100, 130};
    for (int i = 0; i < 9; i++) sizes[39 + i] = wide[i];
    const int long_k[] = {1, 3, 7, 61}, wide_n[] = {1, 17, 40, 70};
    for (int v = 0; v < ns; v++) {
        check_panel_bits(sets[v], 70, 300, 300, sizes, 48);
        check_panel_bits(sets[v], 40, 1030, 61, long_k, 4);
        check_panel_bits(sets[v], 600, 160, 70, wide_n, 4); /* 38 panels: blocks of 16 and a partial one */
    }
}

/* A bf16 value for the AMX bits test: 1 in 16 a signed zero, 1 in 16 a
 * denormal, else sign, mantissa and an exponent within +-40 at random. */
static uint16_t wild_bf16(uint64_t *st)
{
    *st ^= *st << 13, *st ^= *st >> 7, *st ^= *st << 17;
    const uint64_t v = *st;
    const uint16_t sign = (uint16_t)((v >> 20 & 1) << 15), mant = (uint16_t)(v >> 8 & 0x7f);
    if (v % 16 == 0) return sign;
    if (v % 16 == 1) return sign | (mant ? mant : 1);
    return sign | (uint16_t)((127 + (int)(v >> 32 & 0x7f) % 81 - 40) << 7) | mant;
}

/* The AMX sets' one-row products (FMAs under MXCSR's flush to zero,
 * gemm_amx.c) give the bits the tiles give the same rows in a batch of 20,
 * on values that tell the tiles' sum apart from one chain of FMAs or from
 * a rounded exact sum: exponents over +-40 (inputs down to 2^-100, so
 * some products fall below fp32's normal range), denormal bf16 weights,
 * signed zeros; K under 32, not a multiple of it, and long. */
Test(fast_ops, amx_one_row_is_the_tiles_bits)
{
    if (moe_cpu_isa_detect() < MOE_CPU_ISA_AMX) cr_skip_test("needs the AMX tiles (this processor or kernel gives none)");
    const enum moe_cpu_isa sets[] = {MOE_CPU_ISA_AMX_EXACT, MOE_CPU_ISA_AMX, MOE_CPU_ISA_AMX_BF16};
    const int Ks[] = {2, 30, 32, 34, 96, 1000};
    enum { N = 136, T = 20 };
    uint64_t st = 99;
    for (size_t c = 0; c < sizeof Ks / sizeof Ks[0]; c++) {
        const int K = Ks[c];
        uint16_t *w = malloc((size_t)N * K * sizeof(uint16_t));
        float *x = malloc((size_t)T * K * sizeof(float));
        float *batch = malloc((size_t)T * N * sizeof(float)), *alone = malloc((size_t)T * N * sizeof(float));
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = wild_bf16(&st);
        for (size_t i = 0; i < (size_t)T * K; i++) {
            const uint32_t u = (uint32_t)wild_bf16(&st) << 16 | (uint32_t)(st & 0xffff);
            memcpy(&x[i], &u, 4);
            if (st % 64 == 5) x[i] = ldexpf(x[i] == 0 ? 1.0f : x[i], -60); /* tiny */
        }
        void *p = pack(w, N, K);
        for (size_t v = 0; v < sizeof sets / sizeof sets[0]; v++) {
            moe_gemm_fast_rows(sets[v], batch, N, x, K, T, p, MOE_DTYPE_BF16_PANEL, K, 0, N, NULL);
            for (int r = 0; r < T; r++)
                moe_gemm_fast_rows(sets[v], alone + (size_t)r * N, N, x + (size_t)r * K, K, 1, p,
                                   MOE_DTYPE_BF16_PANEL, K, 0, N, NULL);
            int bad = 0;
            for (int i = 0; i < T * N; i++)
                if (memcmp(&alone[i], &batch[i], 4) != 0 && bad++ < 3)
                    cr_log_error("%s K=%d: y[%d][%d] = %a alone, the tiles give %a", moe_cpu_isa_name(sets[v]), K,
                                 i / N, i % N, (double)alone[i], (double)batch[i]);
            cr_expect_eq(bad, 0, "%s K=%d: %d outputs of rows alone differ from the tiles'", moe_cpu_isa_name(sets[v]),
                         K, bad);
        }
        free(w), free(x), free(batch), free(alone), free(p);
    }
}

/* The AMX tiles read 32 k at a time: where K is not a multiple of 32 the
 * last step's weights must not come from the next panel's bytes (which
 * may be infinite: the inputs' zero padding times inf is NaN) nor from
 * past the matrix. */
Test(fast_ops, gemm_panels_k_tail_reads_only_its_panel)
{
    enum moe_cpu_isa is[4];
    const int ni = panel_isas(is);
    if (ni == 0) cr_skip_test("this processor runs no fast kernel set");
    enum { N = 40, K = 34, T = 5 };
    float wf[N * K], x[T * K];
    tu_fill_uniform(wf, (size_t)N * K, 3, -1, 1);
    tu_fill_uniform(x, (size_t)T * K, 4, -1, 1);
    for (int n = 16; n < N; n++)
        for (int k = 0; k < K; k++) wf[n * K + k] = INFINITY;
    uint16_t w[N * K];
    moe_convert_from_f32(w, wf, MOE_DTYPE_BF16, (size_t)N * K);
    void *p = pack(w, N, K);
    for (int i = 0; i < ni; i++) {
        float y[T * 16];
        moe_gemm_fast_rows(is[i], y, 16, x, K, T, p, MOE_DTYPE_BF16_PANEL, K, 0, 16, NULL);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < 16; n++) {
                float want = 0.0f;
                for (int k = 0; k < K; k++) {
                    const uint32_t u = (uint32_t)w[n * K + k] << 16;
                    float wv;
                    memcpy(&wv, &u, 4);
                    want += x[t * K + k] * wv;
                }
                cr_expect(fabsf(y[t * 16 + n] - want) <= dot_atol(K), "%s: y[%d][%d] = %g, want %g",
                          moe_cpu_isa_name(is[i]), t, n, (double)y[t * 16 + n], (double)want);
            }
    }
    free(p);
}

Test(fast_ops, gemm_multi_with_panels_equals_separate_products)
{
    enum moe_cpu_isa is[5];
    int ni = panel_isas(is);
    if (moe_cpu_isa_detect() >= MOE_CPU_ISA_AVX512_BF16) is[ni++] = MOE_CPU_ISA_AVX512_BF16; /* one split part */
    if (ni == 0) cr_skip_test("this processor runs no fast kernel set");
    enum { Din = 78 };
    const int N[3] = {131, 17, 50}, Ts[] = {1, 5, 60};
    for (int c = 0; c < 3 * ni; c++) {
        const int T = Ts[c % 3];
        const enum moe_cpu_isa isa = is[c / 3];
        float *x = malloc((size_t)T * Din * sizeof(float));
        tu_fill_uniform(x, (size_t)T * Din, 5, -1, 1);
        const void *w[3];
        void *nat[3];
        float *y[3], *want[3];
        const enum moe_dtype wt[3] = {MOE_DTYPE_BF16_PANEL, MOE_DTYPE_F16, MOE_DTYPE_BF16_PANEL};
        for (int j = 0; j < 3; j++) {
            nat[j] = random_weights((size_t)N[j] * Din, wt[j] == MOE_DTYPE_F16 ? MOE_DTYPE_F16 : MOE_DTYPE_BF16, 40 + j);
            w[j] = wt[j] == MOE_DTYPE_F16 ? nat[j] : pack(nat[j], N[j], Din);
            y[j] = malloc((size_t)T * N[j] * sizeof(float));
            want[j] = malloc((size_t)T * N[j] * sizeof(float));
            moe_gemm_fast(isa, want[j], N[j], x, Din, w[j], wt[j], N[j], Din, T, NULL);
        }
        moe_gemm_fast_multi(isa, 3, y, x, Din, w, wt, N, T, NULL);
        for (int j = 0; j < 3; j++) {
            cr_expect(memcmp(y[j], want[j], (size_t)T * N[j] * sizeof(float)) == 0,
                      "%s T=%d: product %d differs", moe_cpu_isa_name(isa), T, j);
            if (w[j] != nat[j]) free((void *)w[j]);
            free(nat[j]);
            free(y[j]);
            free(want[j]);
        }
        free(x);
    }
}

/* The fast backend (each kernel set, by cpu_isa_max) repacks a bf16 model's
 * matrices at prepare_model unless cpu_panels is off; both give the same
 * greedy tokens and logits within fp32 tolerance, preparing again does
 * nothing, and a backend that did not pack the model refuses it. */
static void run_synthetic(enum moe_cpu_isa isa, bool panels, int32_t *out, float *logits, bool *packed)
{
    struct moe_backend_opts bo;
    moe_backend_opts_defaults(&bo);
    bo.cpu_isa_max = isa;
    bo.cpu_panels = panels;
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK, "%s",
                 moe_last_error());
    struct moe_model m;
    cr_assert_eq(moe_model_synthetic(&m, &cfg, MOE_DTYPE_BF16, 11), MOE_OK, "%s", moe_last_error());
    struct moe_backend be;
    cr_assert_eq(moe_backend_init(&be, "cpu", &bo), MOE_OK);
    cr_assert_eq(moe_backend_cpu_isa(&be), (int)isa);
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 1, .max_logits = 64, .block_size = 8,
                                .n_blocks = 32};
    cr_assert_eq(moe_runner_init(&r, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    *packed = m.layers[0].wq.dtype == MOE_DTYPE_BF16_PANEL &&
              m.layers[0].experts.dtype == MOE_DTYPE_BF16_PANEL &&
              m.lm_head.dtype == MOE_DTYPE_BF16_PANEL;
    const void *wq = m.layers[0].wq.data;
    cr_assert_eq(be.ops->prepare_model(&be, &m), MOE_OK, "%s", moe_last_error());
    cr_expect_eq(m.layers[0].wq.data, wq, "preparing again must change nothing");
    int32_t prompt[20];
    tu_prompt_logits(&r, cfg.vocab, prompt, logits);
    struct moe_seq seq = {0};
    cr_assert_eq(moe_runner_greedy(&r, &seq, prompt, 20, 12, 7, out), MOE_OK, "%s", moe_last_error());
    moe_seq_free(&r, &seq);
    if (*packed) {
        struct moe_backend ref;
        cr_assert_eq(moe_backend_cpu_init(&ref, 0), MOE_OK);
        cr_expect_eq(ref.ops->prepare_model(&ref, &m), MOE_ERR_INVALID_ARG,
                     "a backend must refuse a model packed by another");
        moe_backend_free(&ref);
    }
    moe_runner_free(&r);
    moe_backend_free(&be);
    moe_model_free(&m);
}

Test(fast_ops, backend_packs_panels_unless_disabled)
{
    enum moe_cpu_isa is[4];
    const int ni = panel_isas(is);
    if (ni == 0) cr_skip_test("this processor runs no fast kernel set");
    const int V = 1024;
    float *lon = malloc((size_t)20 * V * sizeof(float)), *loff = malloc((size_t)20 * V * sizeof(float));
    for (int i = 0; i < ni; i++) {
        int32_t on[12], off[12];
        bool packed_on, packed_off;
        run_synthetic(is[i], true, on, lon, &packed_on);
        run_synthetic(is[i], false, off, loff, &packed_off);
        const char *n = moe_cpu_isa_name(is[i]);
        cr_expect(packed_on, "%s: bf16 matrices must be in panels", n);
        cr_expect_not(packed_off, "%s: cpu_panels off must keep the natural layout", n);
        cr_expect(tu_allclose("logits panels vs natural", lon, loff, (size_t)20 * V, 1e-4f, 1e-3f));
        cr_expect(memcmp(on, off, sizeof on) == 0, "%s: greedy tokens differ between the layouts", n);
    }
    free(lon);
    free(loff);
}

/* What a cap gives on this processor: never a set it does not run; an
 * AMX variant where there are no tiles, `amx-bf16` as `avx512-bf16` (the
 * same rounding of the inputs) where AVX512-BF16 is there, the others as
 * `avx512` (vdpbf16ps would round their inputs more); a backend asked for
 * avx512-bf16 runs it, bf16 matrices in panels, and its greedy tokens
 * on the synthetic model are those of avx512 (the first position's
 * logits within what the inputs' bf16 rounding moves them). */
Test(fast_ops, choose_caps_and_avx512_bf16_backend)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("no fast kernel set");
    for (int c = MOE_CPU_ISA_REF; c <= MOE_CPU_ISA_AMX_BF16; c++) {
        const enum moe_cpu_isa cap = (enum moe_cpu_isa)c, got = moe_cpu_isa_choose(cap);
        enum moe_cpu_isa want = cap < best ? cap : best;
        if (best == MOE_CPU_ISA_AMX && cap >= MOE_CPU_ISA_AMX) want = cap;
        else if (cap == MOE_CPU_ISA_AMX_BF16) want = best < MOE_CPU_ISA_AVX512_BF16 ? best : MOE_CPU_ISA_AVX512_BF16;
        else if (cap >= MOE_CPU_ISA_AMX) want = best < MOE_CPU_ISA_AVX512 ? best : MOE_CPU_ISA_AVX512;
        cr_expect_eq(got, want, "cap %s on a %s processor gave %s", moe_cpu_isa_name(cap), moe_cpu_isa_name(best),
                     moe_cpu_isa_name(got));
    }
    if (best < MOE_CPU_ISA_AVX512_BF16) cr_skip_test("this processor has no AVX512-BF16 (%s)", moe_cpu_isa_name(best));
    const int V = 1024;
    float *lb = malloc((size_t)20 * V * sizeof(float)), *l5 = malloc((size_t)20 * V * sizeof(float));
    int32_t tb[12], t5[12];
    bool packed;
    run_synthetic(MOE_CPU_ISA_AVX512_BF16, true, tb, lb, &packed);
    cr_expect(packed, "avx512-bf16: bf16 matrices must be in panels");
    run_synthetic(MOE_CPU_ISA_AVX512, true, t5, l5, &packed);
    /* the first position's logits (later ones may see another expert
     * chosen where two of the router's scores were within the rounding) */
    cr_expect(tu_allclose("logits avx512-bf16 vs avx512 at position 0", lb, l5, (size_t)V, 5e-2f, 2e-2f));
    cr_expect(memcmp(tb, t5, sizeof tb) == 0, "avx512-bf16: greedy tokens differ from avx512's");
    free(lb);
    free(l5);
}

/* The library reads no environment: the kernel set comes from the options
 * alone, and MOERUN_CPU_ISA reaches a backend only through the CLI's
 * mapping (moe_cli_backend_opts, checked in the cli suite). */
Test(fast_ops, backend_options_not_the_environment)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_REF) cr_skip_test("no fast kernel set");
    setenv("MOERUN_CPU_ISA", "ref", 1);
    cr_expect_eq(moe_cpu_isa_detect(), best, "the environment changed the detected kernel set");
    struct moe_backend be;
    cr_assert_eq(moe_backend_cpu_fast_init(&be, 1), MOE_OK);
    cr_expect_eq(moe_backend_cpu_isa(&be), (int)moe_cpu_isa_choose(MOE_CPU_ISA_DEFAULT_CAP),
                 "the environment chose the kernels");
    moe_backend_free(&be);
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.cpu_isa_max = MOE_CPU_ISA_REF;
    cr_assert_eq(moe_backend_init(&be, "cpu", &o), MOE_OK);
    cr_expect_eq(moe_backend_cpu_isa(&be), MOE_CPU_ISA_REF, "cpu_isa_max ref must give the reference kernels");
    moe_backend_free(&be);
    unsetenv("MOERUN_CPU_ISA");
}
