/* kvcache.h - paged key/value storage and its block pool.
 *
 * The cache is a pool of fixed-size blocks of B token slots.  A sequence owns
 * a block table (its i-th block holds positions i*B .. i*B+B-1); the slot of
 * position p is table[p / B] * B + p % B.  Blocks are reference-counted so
 * later prefix sharing can hand one block to several sequences; a block
 * returns to the free list when its count reaches zero.
 *
 * Storage per layer: K and V each (n_blocks, B, Hkv, Dh) fp32, contiguous, in
 * backend memory.  The pool bookkeeping (counts, free list) is on the host. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "runtime/config.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_backend;

struct moe_kvcache {
    int n_layers, n_kv_heads, head_dim;
    int block_size;      /* B */
    int n_blocks;
    size_t layer_elems;  /* floats per layer of K (and of V): n_blocks*B*Hkv*Dh */
    float *k, *v;        /* (L, n_blocks, B, Hkv, Dh) each, backend memory */
    int32_t *refcount;   /* (n_blocks) host */
    int32_t *free_list;  /* (n_blocks) stack of free block ids */
    int n_free;
    struct moe_backend *be; /* borrowed */
};

/* Allocates n_blocks blocks of block_size slots for cfg's shape. Sizes are
 * overflow-checked; a pool of zero blocks is refused. */
MOE_MUST_USE enum moe_status moe_kvcache_init(struct moe_kvcache *kv, struct moe_backend *be,
                                               const struct moe_config *cfg, int n_blocks,
                                               int block_size);
void moe_kvcache_free(struct moe_kvcache *kv);
/* Takes a free block (refcount 1).  MOE_ERR_NOMEM when none is left. */
MOE_MUST_USE enum moe_status moe_kvcache_alloc_block(struct moe_kvcache *kv, int32_t *block);
void moe_kvcache_ref_block(struct moe_kvcache *kv, int32_t block);
/* Drops one reference; the block is free again at zero. */
void moe_kvcache_release_block(struct moe_kvcache *kv, int32_t block);
/* Bytes of K+V storage per token slot. */
size_t moe_kvcache_bytes_per_slot(const struct moe_kvcache *kv);

#ifdef __cplusplus
}
#endif
