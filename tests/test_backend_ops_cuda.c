/* test_backend_ops_cuda.c - the cases of tests/test_backend_ops.c
 * (tests/backend_ops_cases.h) on the CUDA backend against cpu-ref: every
 * case, and the cheap ops alone for the host emulation's CI.  CUDA is
 * opened in the forked test only; the suite's .init skips without a
 * device. */
#include "tests/backend_ops_cases.h"

#include "runtime/cli/cli_common.h"

/* CUDA, opened in the forked test (never in Criterion's parent) with the
 * options the environment gives the program (moe_cli_backend_opts, as
 * tu_backend_init). */
TestSuite(backend_ops_cuda, .init = tu_need_cuda_device);

static void check_cuda(const char *const *only)
{
    struct side ref, tg = {.label = "cuda", .cuda = true};
    open_ref(&ref);
    struct moe_backend_opts o;
    moe_cli_backend_opts(&o, 0);
    use_q8_0_weights(&o);
    cr_assert_eq(moe_backend_init(&tg.be, "cuda", &o), MOE_OK, "%s", moe_last_error());
    side_reserve(&tg);
    walk_cases_of(&ref, &tg, only);
    moe_backend_free(&tg.be);
    moe_backend_free(&ref.be);
}

Test(backend_ops_cuda, cuda) { check_cuda(NULL); }

/* The table's cheap ops (no attention, routing or experts, which the
 * parity suites' small shapes cover): the host emulation's CI selection
 * (tools/cuda-emu/ci-tests.txt). */
Test(backend_ops_cuda, cuda_small_ops)
{
    static const char *const only[] = {"embed", "rmsnorm", "matmul", "matmul_multi", "head_matmul", "add",
                                       "scale", "clamp", "sigmoid_scale", "swiglu", "rope", "gather_rows",
                                       "gather_cols", "argmax", "synth_fill", "expert_load",
                                       "to_host_async", NULL};
    check_cuda(only);
}
