/* test_backend_ops.c - every op of every backend table against cpu-ref, in
 * the spirit of ggml's test-backend-ops.
 *
 * One table of cases: each names an op of struct moe_backend_ops, a dtype
 * (weight, embedding table or KV cache) and an awkward shape (T = 1, 3,
 * 17, 65 rows; widths that are not multiples of 8, 16 or 32 where the op
 * allows them; odd K and E).  Each case draws seeded random inputs (never
 * all zeros; router logits with ties, NaN and infinities), runs the op on
 * the backend under test and on cpu-ref (moe_backend_cpu_init) through
 * each side's own memory, and compares: ids, plans, gathers, KV cache
 * bytes and counters exactly, floats as |x - ref| <= atol*S + rtol*|ref|
 * (S the output's largest |ref|) with tolerances written per dtype below.
 * Every output prints one "backend-ops:" line with its worst element; an
 * optional entry a backend leaves NULL prints "skipped".
 *
 * The backends under test: the fast CPU backend ("cpu") at every kernel
 * set this processor runs (cpu_isa_max ref, avx2, avx512), with panels on
 * (bf16 matrices of even width handed over repacked, as its prepare_model
 * leaves them) and off, here; and CUDA when a device is present
 * (test_backend_ops_cuda.c).  The runners and the table are in
 * backend_ops_dense.h, backend_ops_moe.h and backend_ops_cases.h.  Ops
 * with no cpu-ref entry compare with what defines them: matmul_multi with
 * n matmuls, synth_fill with runtime/model/synth.c, expert_load with the
 * routed ids counted there.  Policies (tie-breaking, NaN ranking) and whole
 * models keep their own suites (test_router.c, test_forward*.c). */
#include "tests/backend_ops_cases.h"

static void walk_cases(struct side *ref, struct side *tg) { walk_cases_of(ref, tg, NULL); }

/* The fast CPU backend with kernel set isa (at most) and panels on or off. */
static void check_cpu(enum moe_cpu_isa isa, bool panels)
{
    const enum moe_cpu_isa need = isa > MOE_CPU_ISA_AMX ? MOE_CPU_ISA_AMX : isa; /* the AMX variants */
    if (moe_cpu_isa_detect() < need) cr_skip_test("this processor does not run %s", moe_cpu_isa_name(isa));
    struct side ref, tg = {0};
    open_ref(&ref);
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.cpu_isa_max = isa;
    o.cpu_panels = panels;
    use_q8_0_weights(&o);
    cr_assert_eq(moe_backend_init(&tg.be, "cpu", &o), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_backend_cpu_isa(&tg.be), (int)isa);
    snprintf(tg.label, sizeof tg.label, "cpu %s%s", moe_cpu_isa_name(isa), panels ? " panels" : "");
    tg.panels = panels && isa != MOE_CPU_ISA_REF;
    side_reserve(&tg);
    walk_cases(&ref, &tg);
    moe_backend_free(&tg.be);
    moe_backend_free(&ref.be);
}

Test(backend_ops, cpu_ref_kernels) { check_cpu(MOE_CPU_ISA_REF, false); }
Test(backend_ops, cpu_avx2) { check_cpu(MOE_CPU_ISA_AVX2, false); }
Test(backend_ops, cpu_avx2_panels) { check_cpu(MOE_CPU_ISA_AVX2, true); }
Test(backend_ops, cpu_avx512) { check_cpu(MOE_CPU_ISA_AVX512, false); }
Test(backend_ops, cpu_avx512_panels) { check_cpu(MOE_CPU_ISA_AVX512, true); }
/* AMX with exact inputs: held to the fp32 tolerances (the default, two
 * parts, is bounded by its inputs' rounding in test_fast_ops.c) */
Test(backend_ops, cpu_amx_exact_panels) { check_cpu(MOE_CPU_ISA_AMX_EXACT, true); }
