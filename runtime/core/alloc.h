/* alloc.h - an allocator handed down to a module that owns buffers in
 * memory it does not manage itself (the KV cache's pool in a backend's
 * memory), so the module needs no knowledge of who provides it. */
#pragma once

#include <stddef.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_allocator {
    void *ctx;                                             /* borrowed */
    /* bytes zero-filled into *out */
    MOE_MUST_USE enum moe_status (*alloc)(void *ctx, size_t bytes, void **out);
    void (*dealloc)(void *ctx, void *p);                   /* NULL is fine */
};

#ifdef __cplusplus
}
#endif
