/* kvcache.c - block pool and prefix cache (see kvcache.h). */
#include "kvcache/kvcache.h"

#include <stdlib.h>
#include <string.h>


size_t moe_kvcache_block_bytes(const struct moe_config *cfg, int block_size, enum moe_dtype dtype)
{
    size_t b = moe_config_kv_bytes_per_token(cfg, dtype);
    if (b == SIZE_MAX || block_size < 0 || !moe_mul_size(b, (size_t)block_size, &b)) return SIZE_MAX;
    return b;
}

static bool is_kv_dtype(enum moe_dtype t)
{
    return t == MOE_DTYPE_F32 || t == MOE_DTYPE_F16 || t == MOE_DTYPE_BF16 || t == MOE_DTYPE_F8E4M3;
}

float moe_kvcache_fp8_quantize_row(uint8_t *q, const float *x, size_t n)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float a = moe_kv_fp8_abs(x[i]);
        amax = a > amax ? a : amax;
    }
    const float s = moe_kv_fp8_scale(amax);
    for (size_t i = 0; i < n; i++) q[i] = moe_kv_fp8_encode(x[i], s);
    return s;
}

void moe_kvcache_fp8_row_f32(float *dst, const uint8_t *q, float s, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = moe_fp8_e4m3_to_f32(q[i]) * s;
}

enum moe_status moe_kvcache_blocks_for_budget(const struct moe_config *cfg, int block_size,
                                              enum moe_dtype dtype, size_t budget, int *n_blocks)
{
    size_t per = moe_kvcache_block_bytes(cfg, block_size, dtype);
    if (per == SIZE_MAX || budget / per == 0)
        return moe_fail(MOE_ERR_INVALID_ARG,
                        "kv cache: a budget of %zu bytes holds no block (one block of %d tokens "
                        "takes %zu bytes)", budget, block_size, per);
    size_t n = budget / per;
    *n_blocks = n > (size_t)INT32_MAX / 2 ? INT32_MAX / 2 : (int)n;
    return MOE_OK;
}

enum moe_status moe_kvcache_init(struct moe_kvcache *kv, struct moe_allocator mem,
                                 const struct moe_config *cfg, int n_blocks, int block_size,
                                 enum moe_dtype dtype, bool prefix_cache)
{
    return moe_kvcache_init_part(kv, mem, cfg, n_blocks, block_size, dtype, prefix_cache, 1, 0);
}

enum moe_status moe_kvcache_init_part(struct moe_kvcache *kv, struct moe_allocator mem,
                                      const struct moe_config *cfg, int n_blocks, int block_size,
                                      enum moe_dtype dtype, bool prefix_cache, int parts, int stored)
{
    memset(kv, 0, sizeof *kv);
    if (n_blocks <= 0 || block_size <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "kv cache: need at least one block of at least one "
                        "slot (got %d blocks of %d)", n_blocks, block_size);
    if (parts <= 0 || n_blocks % parts || stored < 0 || stored >= parts)
        return moe_fail(MOE_ERR_INVALID_ARG, "kv cache: %d blocks in %d parts, part %d stored", n_blocks, parts,
                        stored);
    const int part_blocks = n_blocks / parts;
    if (!is_kv_dtype(dtype))
        return moe_fail(MOE_ERR_UNSUPPORTED, "kv cache: dtype %s (use F32, F16, BF16 or F8_E4M3)",
                        moe_dtype_name(dtype));
    const bool fp8 = dtype == MOE_DTYPE_F8E4M3;
    const int kv_layers = moe_config_kv_layers(cfg); /* linear-attention layers keep no K/V */
    size_t per_slot, slots, elems, rows, bytes, total, stotal = 0, ntok, iktotal = 0;
    if (!moe_mul_size((size_t)cfg->n_kv_heads, (size_t)cfg->head_dim, &per_slot) ||
        !moe_mul_size((size_t)part_blocks, (size_t)block_size, &slots) ||
        !moe_mul_size(slots, per_slot, &elems) ||
        !moe_mul_size(slots, (size_t)cfg->n_kv_heads, &rows) ||
        !moe_mul_size(elems, moe_dtype_size(dtype), &bytes) ||
        !moe_mul_size(bytes, (size_t)kv_layers, &total) ||
        (fp8 && (!moe_mul_size(rows, sizeof(float), &stotal) ||
                 !moe_mul_size(stotal, (size_t)kv_layers, &stotal))) ||
        !moe_mul_size((size_t)n_blocks * (size_t)block_size, sizeof(int32_t), &ntok) ||
        (cfg->dsa_topk > 0 && (!moe_mul_size(slots, (size_t)cfg->dsa_dim * sizeof(float), &iktotal) ||
                               !moe_mul_size(iktotal, (size_t)moe_config_dsa_layers(cfg), &iktotal))))
        return moe_fail(MOE_ERR_NOMEM, "kv cache: %d blocks of %d slots overflow the address space",
                        n_blocks, block_size);
    kv->n_layers = kv_layers;
    kv->n_kv_heads = cfg->n_kv_heads;
    kv->head_dim = cfg->head_dim;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->dtype = dtype;
    kv->layer_elems = elems;
    kv->layer_rows = rows;
    kv->prefix_cache = prefix_cache;
    kv->parts = parts;
    kv->part_blocks = part_blocks;
    kv->stored = stored;
    kv->stored_first = (int32_t)stored * part_blocks;
    kv->mem = mem;
    enum moe_status s;
    if ((s = mem.alloc(mem.ctx, total, &kv->k)) != MOE_OK) goto fail;
    /* MLA: one latent row per token serves as K and V (runtime/model/config.h) */
    if (cfg->kv_lora_rank > 0) kv->v = kv->k;
    else if ((s = mem.alloc(mem.ctx, total, &kv->v)) != MOE_OK) goto fail;
    if (fp8) {
        if ((s = mem.alloc(mem.ctx, stotal, (void **)&kv->ks)) != MOE_OK) goto fail;
        if (cfg->kv_lora_rank > 0) kv->vs = kv->ks;
        else if ((s = mem.alloc(mem.ctx, stotal, (void **)&kv->vs)) != MOE_OK) goto fail;
    }
    if (iktotal && (s = mem.alloc(mem.ctx, iktotal, (void **)&kv->ik)) != MOE_OK) goto fail;
    kv->ik_dim = cfg->dsa_topk > 0 ? cfg->dsa_dim : 0;
    kv->ik_layers = moe_config_dsa_layers(cfg); /* layers that share a selection keep no keys */
    kv->index_cap = 16;
    while (kv->index_cap < 2 * (size_t)n_blocks) kv->index_cap *= 2;
    kv->blocks = calloc((size_t)n_blocks, sizeof *kv->blocks);
    kv->free_list = malloc((size_t)n_blocks * sizeof *kv->free_list);
    kv->part = malloc((size_t)parts * sizeof *kv->part);
    kv->tokens = prefix_cache ? malloc(ntok) : NULL;
    kv->index = prefix_cache ? calloc(kv->index_cap, sizeof *kv->index) : NULL;
    if (!kv->blocks || !kv->free_list || !kv->part || (prefix_cache && (!kv->tokens || !kv->index))) {
        s = moe_fail(MOE_ERR_NOMEM, "kv cache: bookkeeping for %d blocks", n_blocks);
        goto fail;
    }
    /* Hand out low block ids first, in each part. */
    for (int p = 0; p < parts; p++) {
        int32_t *stack = kv->free_list + (size_t)p * part_blocks;
        for (int i = 0; i < part_blocks; i++) stack[i] = (int32_t)((p + 1) * part_blocks - 1 - i);
        kv->part[p] = (struct moe_kv_part){part_blocks, 0, -1, -1};
    }
    kv->n_free = n_blocks;
    return MOE_OK;
fail:
    moe_kvcache_free(kv);
    return s;
}

enum moe_status moe_kvcache_init_state(struct moe_kvcache *kv, const struct moe_config *cfg, int n_slots)
{
    const size_t bytes_per = moe_config_state_bytes(cfg);
    size_t total;
    if (n_slots <= 0 || n_slots % kv->parts)
        return moe_fail(MOE_ERR_INVALID_ARG, "kv cache: %d recurrent-state slots (need at least one, in %d equal "
                        "parts)", n_slots, kv->parts);
    const int per = n_slots / kv->parts; /* this cache stores part `stored` of them */
    if (bytes_per == SIZE_MAX || !moe_mul_size(bytes_per, (size_t)per, &total))
        return moe_fail(MOE_ERR_NOMEM, "kv cache: %d recurrent-state slots overflow the address space", n_slots);
    if (bytes_per == 0) return MOE_OK;
    kv->state_floats = bytes_per / sizeof(float);
    kv->state_layer_floats = moe_config_state_floats(cfg);
    kv->state_conv_floats = (size_t)moe_config_conv_dim(cfg) * (size_t)(cfg->lin_conv - 1);
    kv->state_len = malloc((size_t)n_slots * sizeof *kv->state_len);
    kv->state_free = malloc((size_t)n_slots * sizeof *kv->state_free);
    kv->state_part_free = calloc((size_t)kv->parts, sizeof *kv->state_part_free);
    if (!kv->state_len || !kv->state_free || !kv->state_part_free)
        return moe_fail(MOE_ERR_NOMEM, "kv cache: bookkeeping for %d state slots", n_slots);
    MOE_TRY(kv->mem.alloc(kv->mem.ctx, total, (void **)&kv->state));
    kv->n_state_slots = n_slots;
    kv->state_part_slots = per;
    kv->state_first = (int32_t)kv->stored * per;
    for (int p = 0; p < kv->parts; p++) { /* low slots first, in each part */
        for (int i = 0; i < per; i++) kv->state_free[(size_t)p * per + i] = (int32_t)((p + 1) * per - 1 - i);
        kv->state_part_free[p] = per;
    }
    for (int i = 0; i < n_slots; i++) kv->state_len[i] = -1;
    kv->n_state_free = n_slots;
    return MOE_OK;
}

enum moe_status moe_kvcache_alloc_state(struct moe_kvcache *kv, int32_t *slot)
{
    MOE_ASSERT(kv->parts == 1);
    return moe_kvcache_alloc_state_in(kv, 0, slot);
}

enum moe_status moe_kvcache_alloc_state_in(struct moe_kvcache *kv, int p, int32_t *slot)
{
    MOE_ASSERT(p >= 0 && p < kv->parts);
    if (kv->state_part_free[p] == 0)
        return moe_fail(MOE_ERR_NOMEM, "kv cache: every one of the %d recurrent-state slots%s is taken",
                        kv->state_part_slots, kv->parts > 1 ? " of its part" : "");
    *slot = kv->state_free[(size_t)p * kv->state_part_slots + (size_t)--kv->state_part_free[p]];
    kv->n_state_free--;
    kv->state_len[*slot] = -1; /* its first step starts at position 0 */
    return MOE_OK;
}

void moe_kvcache_release_state(struct moe_kvcache *kv, int32_t slot)
{
    MOE_ASSERT(slot >= 0 && slot < kv->n_state_slots && kv->n_state_free < kv->n_state_slots);
    const int p = slot / kv->state_part_slots;
    kv->state_len[slot] = -1;
    kv->state_free[(size_t)p * kv->state_part_slots + (size_t)kv->state_part_free[p]++] = slot;
    kv->n_state_free++;
}

void moe_kvcache_free(struct moe_kvcache *kv)
{
    free(kv->state_len);
    free(kv->state_free);
    free(kv->state_part_free);
    if (kv->mem.dealloc) {
        kv->mem.dealloc(kv->mem.ctx, kv->state);
        kv->mem.dealloc(kv->mem.ctx, kv->ik);
        if (kv->vs != kv->ks) kv->mem.dealloc(kv->mem.ctx, kv->vs);
        kv->mem.dealloc(kv->mem.ctx, kv->ks);
        if (kv->v != kv->k) kv->mem.dealloc(kv->mem.ctx, kv->v);
        kv->mem.dealloc(kv->mem.ctx, kv->k);
    }
    free(kv->blocks);
    free(kv->free_list);
    free(kv->part);
    free(kv->tokens);
    free(kv->index);
    memset(kv, 0, sizeof *kv);
}

/* --- evictable LRU list (doubly linked through the block table) --- */

static void lru_remove(struct moe_kvcache *kv, int32_t b)
{
    struct moe_kv_block *m = &kv->blocks[b];
    struct moe_kv_part *p = &kv->part[moe_kvcache_part_of(kv, b)];
    if (m->lru_prev >= 0) kv->blocks[m->lru_prev].lru_next = m->lru_next;
    else p->lru_head = m->lru_next;
    if (m->lru_next >= 0) kv->blocks[m->lru_next].lru_prev = m->lru_prev;
    else p->lru_tail = m->lru_prev;
    p->n_evictable--;
    kv->n_evictable--;
}

static void lru_push(struct moe_kvcache *kv, int32_t b)
{
    struct moe_kv_block *m = &kv->blocks[b];
    struct moe_kv_part *p = &kv->part[moe_kvcache_part_of(kv, b)];
    m->lru_prev = p->lru_tail;
    m->lru_next = -1;
    if (p->lru_tail >= 0) kv->blocks[p->lru_tail].lru_next = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_evictable++;
    kv->n_evictable++;
}

/* --- the index: linear probing, backward-shift deletion --- */

static uint64_t key_hash(int32_t parent, uint32_t parent_gen, const int32_t *tokens, int n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ ((uint64_t)(uint32_t)parent << 32 | parent_gen);
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

static bool key_equal(const struct moe_kvcache *kv, int32_t b, int32_t parent, uint32_t parent_gen,
                      const int32_t *tokens)
{
    const struct moe_kv_block *m = &kv->blocks[b];
    return m->parent == parent && m->parent_gen == parent_gen &&
           !memcmp(kv->tokens + (size_t)b * kv->block_size, tokens,
                   (size_t)kv->block_size * sizeof(int32_t));
}

static void index_remove(struct moe_kvcache *kv, int32_t b)
{
    size_t mask = kv->index_cap - 1, i = kv->blocks[b].hash & mask;
    while (kv->index[i] != b + 1) {
        MOE_ASSERT(kv->index[i] != 0);
        i = (i + 1) & mask;
    }
    /* backward shift: move later entries of the run into the hole */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; kv->index[j]; j = (j + 1) & mask) {
        size_t home = kv->blocks[kv->index[j] - 1].hash & mask;
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            kv->index[hole] = kv->index[j];
            hole = j;
        }
    }
    kv->index[hole] = 0;
}

static void uncache(struct moe_kvcache *kv, int32_t b)
{
    index_remove(kv, b);
    kv->blocks[b].cached = false;
    kv->blocks[b].gen++;
}

enum moe_status moe_kvcache_alloc_block(struct moe_kvcache *kv, int32_t *block)
{
    MOE_ASSERT(kv->parts == 1);
    return moe_kvcache_alloc_block_in(kv, 0, block);
}

enum moe_status moe_kvcache_alloc_block_in(struct moe_kvcache *kv, int p, int32_t *block)
{
    MOE_ASSERT(p >= 0 && p < kv->parts);
    struct moe_kv_part *pt = &kv->part[p];
    int32_t b;
    if (pt->n_free > 0) {
        b = kv->free_list[(size_t)p * kv->part_blocks + (size_t)--pt->n_free];
        kv->n_free--;
    } else if (pt->n_evictable > 0) {
        b = pt->lru_head;
        lru_remove(kv, b);
        uncache(kv, b);
        kv->stats.evictions++;
    } else if (kv->parts > 1) {
        return moe_fail(MOE_ERR_NOMEM, "kv cache: all %d blocks of part %d are in use", kv->part_blocks, p);
    } else {
        return moe_fail(MOE_ERR_NOMEM, "kv cache: all %d blocks are in use", kv->n_blocks);
    }
    MOE_ASSERT(kv->blocks[b].refcount == 0 && !kv->blocks[b].cached);
    kv->blocks[b].refcount = 1;
    *block = b;
    return MOE_OK;
}

void moe_kvcache_ref_block(struct moe_kvcache *kv, int32_t block)
{
    MOE_ASSERT(block >= 0 && block < kv->n_blocks);
    struct moe_kv_block *m = &kv->blocks[block];
    MOE_ASSERT(m->refcount > 0 || m->cached);
    if (m->refcount++ == 0) lru_remove(kv, block);
}

void moe_kvcache_release_block(struct moe_kvcache *kv, int32_t block)
{
    MOE_ASSERT(block >= 0 && block < kv->n_blocks && kv->blocks[block].refcount > 0);
    if (--kv->blocks[block].refcount > 0) return;
    if (kv->blocks[block].cached) {
        lru_push(kv, block);
    } else {
        /* an uncached block may still be the parent of cached children (it
         * duplicated a chain block already cached, so cache_block kept it
         * out); a new generation keeps them from matching its next content */
        kv->blocks[block].gen++;
        const int p = moe_kvcache_part_of(kv, block);
        kv->free_list[(size_t)p * kv->part_blocks + (size_t)kv->part[p].n_free++] = block;
        kv->n_free++;
    }
}

int moe_kvcache_available(const struct moe_kvcache *kv) { return kv->n_free + kv->n_evictable; }

int moe_kvcache_available_in(const struct moe_kvcache *kv, int p)
{
    return kv->part[p].n_free + kv->part[p].n_evictable;
}

void moe_kvcache_cache_block(struct moe_kvcache *kv, int32_t block, int32_t parent,
                             const int32_t *tokens)
{
    if (!kv->prefix_cache) return;
    MOE_ASSERT(block >= 0 && block < kv->n_blocks && kv->blocks[block].refcount > 0);
    struct moe_kv_block *m = &kv->blocks[block];
    if (m->cached) return;
    uint32_t pgen = parent >= 0 ? kv->blocks[parent].gen : 0;
    uint64_t h = key_hash(parent, pgen, tokens, kv->block_size);
    size_t mask = kv->index_cap - 1, i = h & mask;
    for (; kv->index[i]; i = (i + 1) & mask) {
        int32_t o = kv->index[i] - 1;
        if (kv->blocks[o].hash == h && key_equal(kv, o, parent, pgen, tokens)) return;
    }
    m->parent = parent;
    m->parent_gen = pgen;
    m->hash = h;
    m->cached = true;
    memcpy(kv->tokens + (size_t)block * kv->block_size, tokens, (size_t)kv->block_size * sizeof(int32_t));
    kv->index[i] = block + 1;
}

int32_t moe_kvcache_lookup(struct moe_kvcache *kv, int32_t parent, const int32_t *tokens)
{
    if (!kv->prefix_cache) return -1;
    kv->stats.lookups++;
    uint32_t pgen = parent >= 0 ? kv->blocks[parent].gen : 0;
    uint64_t h = key_hash(parent, pgen, tokens, kv->block_size);
    size_t mask = kv->index_cap - 1;
    for (size_t i = h & mask; kv->index[i]; i = (i + 1) & mask) {
        int32_t b = kv->index[i] - 1;
        if (kv->blocks[b].hash == h && key_equal(kv, b, parent, pgen, tokens)) {
            moe_kvcache_ref_block(kv, b);
            kv->stats.hits++;
            return b;
        }
    }
    return -1;
}

size_t moe_kvcache_bytes_per_slot(const struct moe_kvcache *kv)
{
    /* the sizes were checked at init */
    return (kv->v == kv->k ? 1 : 2) * (size_t)kv->n_layers * (size_t)kv->n_kv_heads *
               moe_config_kv_row_bytes(kv->head_dim, kv->dtype) +
           (size_t)kv->ik_layers * (size_t)kv->ik_dim * sizeof(float);
}
