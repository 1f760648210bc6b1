/* kvcache.c - block pool (see kvcache.h).  A minimal allocator: the serving
 * engine adds prefix caching and accounting on top of it. */
#include "kvcache/kvcache.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"

enum moe_status moe_kvcache_init(struct moe_kvcache *kv, struct moe_backend *be,
                                 const struct moe_config *cfg, int n_blocks, int block_size)
{
    memset(kv, 0, sizeof *kv);
    if (n_blocks <= 0 || block_size <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "kv cache: need at least one block of at least one "
                        "slot (got %d blocks of %d)", n_blocks, block_size);
    size_t per_slot, slots, elems, bytes, total;
    if (!moe_mul_size((size_t)cfg->n_kv_heads, (size_t)cfg->head_dim, &per_slot) ||
        !moe_mul_size((size_t)n_blocks, (size_t)block_size, &slots) ||
        !moe_mul_size(slots, per_slot, &elems) ||
        !moe_mul_size(elems, sizeof(float), &bytes) ||
        !moe_mul_size(bytes, (size_t)cfg->n_layers, &total))
        return moe_fail(MOE_ERR_NOMEM, "kv cache: %d blocks of %d slots overflow the address space",
                        n_blocks, block_size);
    kv->n_layers = cfg->n_layers;
    kv->n_kv_heads = cfg->n_kv_heads;
    kv->head_dim = cfg->head_dim;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->layer_elems = elems;
    kv->be = be;
    enum moe_status s;
    if ((s = be->ops->alloc(be, total, (void **)&kv->k)) != MOE_OK) goto fail;
    if ((s = be->ops->alloc(be, total, (void **)&kv->v)) != MOE_OK) goto fail;
    kv->refcount = calloc((size_t)n_blocks, sizeof *kv->refcount);
    kv->free_list = malloc((size_t)n_blocks * sizeof *kv->free_list);
    if (!kv->refcount || !kv->free_list) {
        s = moe_fail(MOE_ERR_NOMEM, "kv cache: block tables for %d blocks", n_blocks);
        goto fail;
    }
    /* Hand out low block ids first. */
    for (int i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    return MOE_OK;
fail:
    moe_kvcache_free(kv);
    return s;
}

void moe_kvcache_free(struct moe_kvcache *kv)
{
    if (kv->be) {
        kv->be->ops->dealloc(kv->be, kv->k);
        kv->be->ops->dealloc(kv->be, kv->v);
    }
    free(kv->refcount);
    free(kv->free_list);
    memset(kv, 0, sizeof *kv);
}

enum moe_status moe_kvcache_alloc_block(struct moe_kvcache *kv, int32_t *block)
{
    if (kv->n_free == 0)
        return moe_fail(MOE_ERR_NOMEM, "kv cache: all %d blocks are in use", kv->n_blocks);
    int32_t b = kv->free_list[--kv->n_free];
    MOE_ASSERT(kv->refcount[b] == 0);
    kv->refcount[b] = 1;
    *block = b;
    return MOE_OK;
}

void moe_kvcache_ref_block(struct moe_kvcache *kv, int32_t block)
{
    MOE_ASSERT(block >= 0 && block < kv->n_blocks && kv->refcount[block] > 0);
    kv->refcount[block]++;
}

void moe_kvcache_release_block(struct moe_kvcache *kv, int32_t block)
{
    MOE_ASSERT(block >= 0 && block < kv->n_blocks && kv->refcount[block] > 0);
    if (--kv->refcount[block] == 0) kv->free_list[kv->n_free++] = block;
}

size_t moe_kvcache_bytes_per_slot(const struct moe_kvcache *kv)
{
    return 2 * (size_t)kv->n_layers * (size_t)kv->n_kv_heads * (size_t)kv->head_dim * sizeof(float);
}
