/* backend_impl.h - the backends' constructors behind moe_backend_init
 * (backend.c, which calls them with options, never NULL; they call nothing
 * of backend.c back). */
#pragma once

#include <stdbool.h>

#include "runtime/backend/backend.h"

/* fast false: the reference ("cpu-ref"), which ignores the kernel options. */
MOE_MUST_USE enum moe_status moe_backend_cpu_open(struct moe_backend *be, bool fast,
                                                   const struct moe_backend_opts *o);
/* MOE_ERR_UNSUPPORTED when built without CUDA. */
MOE_MUST_USE enum moe_status moe_backend_cuda_open(struct moe_backend *be,
                                                    const struct moe_backend_opts *o);
