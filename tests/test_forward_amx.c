/* test_forward_amx.c - every forward-pass test of test_forward.c again
 * with the fast CPU backend on the AMX kernel set (bf16 products on the
 * tiles, inputs in two bf16 parts), which backends use only when asked
 * (test_forward_fast runs the default set).  Skipped without AMX. */
#include "runtime/backend/backend.h"
#include "runtime/cpu/gemm_fast.h"

static enum moe_status amx_init(struct moe_backend *be, int n_threads)
{
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.n_threads = n_threads;
    o.cpu_isa_max = MOE_CPU_ISA_AMX;
    return moe_backend_init(be, "cpu", &o);
}

#define FORWARD_SUITE forward_amx
#define FORWARD_BACKEND_INIT amx_init
#define FORWARD_FAST 1
#define FORWARD_NEEDS_ISA MOE_CPU_ISA_AMX
#include "test_forward.c"
