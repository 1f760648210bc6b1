/* kvcache.h - paged key/value storage, its block pool and the prefix cache.
 *
 * The cache is a pool of fixed-size blocks of B token slots.  A sequence owns
 * a block table (its i-th block holds positions i*B .. i*B+B-1); the slot of
 * position p is table[p / B] * B + p % B.
 *
 * Blocks are reference-counted.  A full block can be registered in the
 * prefix cache under the key (parent block, parent generation, its B
 * tokens); a later sequence whose prompt starts with the same tokens finds
 * the chain of blocks block by block and shares them instead of recomputing.
 * Lookups compare the parent and all B tokens exactly, so no hash collision
 * can hand one request another's cache; a block's generation changes when it
 * is evicted or freed, so children registered under an evicted parent, or
 * under a block that was never cached itself, never match again.  A cached
 * block whose count drops to zero is kept, evictable, on an LRU list;
 * allocation takes free blocks first and evicts the least recently used
 * cached block only when none is left.
 *
 * Storage per attention layer (linear-attention layers have none: their
 * per-sequence state is the state part below): K and V each
 * (n_blocks, Hkv, B, Dh) in the KV dtype (F32, F16, BF16 or F8E4M3),
 * contiguous, in backend memory: a block keeps each KV head's B rows (a
 * row: one token's Dh values of one head) together, so a walk of one
 * head's keys reads B rows in one run (moe_kv_row).  The pool bookkeeping
 * (counts, free list, cache index, tokens) is on the host.
 *
 * The fp8 cache (MOE_DTYPE_F8E4M3, `--kv-dtype fp8`) is a per-row scaled
 * FP8: each row of Dh values (one token, one KV head, K or V; MLA: the
 * latent row) is Dh OCP E4M3 ("fn") bytes plus one f32 scale s =
 * amax / 448, amax the largest |value| among the row's finite values, and
 * value i reads back as e4m3(q[i]) * s (one fp32 rounding).  The bytes are
 * q[i] = moe_f32_to_e4m3(x[i] / s): round to nearest even, saturating at
 * +-448 (runtime/core/tensor.h).  A row of zeros (or of values so small that s
 * underflows) has s = 0 and zero bytes; a NaN or infinite value is stored
 * as the NaN byte and reads back as NaN, so it propagates through the
 * attention as it would from an f32 cache, and the rest of its row keeps
 * a finite scale.  The scales are planes beside the bytes: ks and vs,
 * (L, n_blocks, Hkv, B) f32 each (a row's scale at its row's index),
 * so a row's bytes keep the alignment of Dh.  Unlike vLLM's fp8 cache
 * (one scale per tensor, 1.0 by default), a scale per row cannot overflow
 * on a model with large K and uses E4M3's whole range on every row.
 * Rounding error of a value x: at most 2^-4 |x| (3 mantissa bits) where
 * |x| >= 2^-6 s, at most 2^-10 s below (the subnormals), plus fp32's
 * rounding of x / s and of e4m3 * s. */
#pragma once

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/core/alloc.h"
#include "runtime/model/config.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_kv_block {
    int32_t refcount;
    uint32_t gen;          /* changes at each eviction and each return to the free list */
    bool cached;           /* registered in the prefix index */
    int32_t parent;        /* key: previous block of the chain, -1 for the first */
    uint32_t parent_gen;
    uint64_t hash;         /* of the key */
    int32_t lru_prev, lru_next; /* evictable list (cached, refcount 0) of its part */
};

/* One part of a divided pool (moe_kvcache_init_part): its free blocks (a
 * stack in free_list) and its evictable cached blocks, oldest first. */
struct moe_kv_part {
    int n_free;
    int n_evictable;
    int32_t lru_head, lru_tail;
};

struct moe_kv_stats {
    uint64_t lookups, hits;    /* prefix cache block lookups and hits */
    uint64_t evictions;        /* cached blocks reclaimed */
};

struct moe_kvcache {
    int n_layers, n_kv_heads, head_dim;
    int block_size;            /* B */
    int n_blocks;
    enum moe_dtype dtype;      /* element type of K and V */
    size_t layer_elems;        /* elements per layer of K (and of V): n_blocks*B*Hkv*Dh */
    size_t layer_rows;         /* rows (and scales) per layer of K (and of V): n_blocks*B*Hkv */
    void *k, *v;               /* (L, n_blocks, Hkv, B, Dh) each, backend memory */
    float *ks, *vs;            /* F8E4M3 only (else NULL): the rows' scales, (L, n_blocks, Hkv,
                                * B) each, backend memory; MLA: vs == ks */
    float *ik;                 /* DeepSeek sparse attention (else NULL): each token's indexer key,
                                * (ik_layers, n_blocks, B, ik_dim) F32, backend memory: the
                                * layers with an indexer (moe_config_dsa_layer) */
    int ik_dim, ik_layers;
    struct moe_kv_block *blocks; /* (n_blocks) */
    /* The pool's block ids fall in `parts` parts of part_blocks blocks
     * (part p: ids [p part_blocks, (p + 1) part_blocks)); an allocation
     * takes from one part.  Storage (k, v, ks, vs, ik) holds part
     * `stored` alone when parts > 1, block id b at b - stored_first: a
     * slot s of that part is s - stored_first * block_size there. */
    int parts, part_blocks, stored;
    int32_t stored_first;
    struct moe_kv_part *part;  /* (parts) */
    int32_t *free_list;        /* part p's stack of never-cached free blocks at p part_blocks */
    int n_free;                /* of every part */
    int n_evictable;           /* of every part */
    bool prefix_cache;         /* register and look up full blocks */
    int32_t *tokens;           /* (n_blocks, B) tokens of cached blocks */
    int32_t *index;            /* open addressing: block id + 1, 0 empty */
    size_t index_cap;          /* power of two >= 2 * n_blocks */
    struct moe_kv_stats stats;
    /* Recurrent state of hybrid models (moe_kvcache_init_state; else
     * zero): n_state_slots slots of state_floats F32 values, backend
     * memory, one per running sequence.  A slot holds, for each linear
     * layer in order, state_layer_floats values: the convolution's last
     * inputs (state_conv_floats: (C, lin_conv - 1)), then the recurrent
     * state (Hv, Dk, Dv).  state_len (host): the tokens the slot's state
     * has taken in; -1 when it holds none that can be continued (new, or
     * a step failed midway), so its next step must start at position 0. */
    int n_state_slots;
    size_t state_floats, state_layer_floats, state_conv_floats;
    float *state;
    int32_t *state_len;        /* (n_state_slots) */
    int32_t *state_free;       /* part p's stack of free slots at p state_part_slots */
    int n_state_free;          /* of every part */
    /* a divided pool's slots are in its parts too (state_part_slots each),
     * the storage holding part `stored` alone: slot s at s - state_first */
    int state_part_slots;
    int32_t state_first;
    int *state_part_free;      /* (parts) free slots of each part */
    struct moe_allocator mem;  /* where k, v, ks and vs live (a backend's memory) */
};

/* Allocates n_blocks blocks of block_size slots for cfg's shape in dtype
 * (F32, F16, BF16 or F8E4M3: bytes and scales, above).  Sizes are
 * overflow-checked; zero blocks are refused. */
MOE_MUST_USE enum moe_status moe_kvcache_init(struct moe_kvcache *kv, struct moe_allocator mem,
                                               const struct moe_config *cfg, int n_blocks,
                                               int block_size, enum moe_dtype dtype,
                                               bool prefix_cache);
/* The same pool divided in `parts` equal parts (n_blocks a multiple of
 * parts) whose storage holds part `stored` alone (data-parallel
 * attention: each rank stores its part; runtime/engine/forward_dp.c).
 * moe_kvcache_init is parts 1. */
MOE_MUST_USE enum moe_status moe_kvcache_init_part(struct moe_kvcache *kv, struct moe_allocator mem,
                                                    const struct moe_config *cfg, int n_blocks,
                                                    int block_size, enum moe_dtype dtype, bool prefix_cache,
                                                    int parts, int stored);
void moe_kvcache_free(struct moe_kvcache *kv);
/* Adds n_slots recurrent-state slots for cfg's linear-attention layers
 * (nothing for a model without); sizes overflow-checked.  A divided pool
 * (moe_kvcache_init_part) divides them alike: n_slots a multiple of its
 * parts, the stored part's alone in storage. */
MOE_MUST_USE enum moe_status moe_kvcache_init_state(struct moe_kvcache *kv, const struct moe_config *cfg,
                                                     int n_slots);
/* Takes a free state slot (its state_len -1); MOE_ERR_NOMEM naming the
 * slot count when none is left.  Release gives it back. */
MOE_MUST_USE enum moe_status moe_kvcache_alloc_state(struct moe_kvcache *kv, int32_t *slot);
/* ... from part p of a divided pool. */
MOE_MUST_USE enum moe_status moe_kvcache_alloc_state_in(struct moe_kvcache *kv, int p, int32_t *slot);
void moe_kvcache_release_state(struct moe_kvcache *kv, int32_t slot);
/* Bytes of one block (K and V, all layers, fp8 scales included; MLA: the
 * one row both read); SIZE_MAX on overflow. */
size_t moe_kvcache_block_bytes(const struct moe_config *cfg, int block_size, enum moe_dtype dtype);
/* Blocks that fit in budget bytes; MOE_ERR_INVALID_ARG (naming both sizes)
 * if not even one. */
MOE_MUST_USE enum moe_status moe_kvcache_blocks_for_budget(const struct moe_config *cfg,
                                                            int block_size, enum moe_dtype dtype,
                                                            size_t budget, int *n_blocks);

/* Takes a block (refcount 1): a free one, else the least recently used
 * evictable cached one.  MOE_ERR_NOMEM when every block is referenced. */
MOE_MUST_USE enum moe_status moe_kvcache_alloc_block(struct moe_kvcache *kv, int32_t *block);
/* The same from part p alone (its free blocks, then its least recently
 * used evictable one). */
MOE_MUST_USE enum moe_status moe_kvcache_alloc_block_in(struct moe_kvcache *kv, int p, int32_t *block);
void moe_kvcache_ref_block(struct moe_kvcache *kv, int32_t block);
/* Drops one reference; at zero a cached block becomes evictable, another
 * one free. */
void moe_kvcache_release_block(struct moe_kvcache *kv, int32_t block);
/* Blocks an allocation can still get (free + evictable). */
int moe_kvcache_available(const struct moe_kvcache *kv);
/* ... of part p; the part block b is in. */
int moe_kvcache_available_in(const struct moe_kvcache *kv, int p);
static inline int moe_kvcache_part_of(const struct moe_kvcache *kv, int32_t block)
{
    return (int)(block / kv->part_blocks);
}

/* Registers a full block holding `tokens` (B of them) after `parent` (-1 for
 * a sequence's first block).  If an identical chain block is already cached,
 * nothing changes.  No-op when the prefix cache is off. */
void moe_kvcache_cache_block(struct moe_kvcache *kv, int32_t block, int32_t parent,
                             const int32_t *tokens);
/* Finds the cached block holding `tokens` after `parent`; on a hit takes a
 * reference and returns its id, else -1. */
int32_t moe_kvcache_lookup(struct moe_kvcache *kv, int32_t parent, const int32_t *tokens);

/* Bytes of K+V storage per token slot, fp8 scales included (MLA: K and V
 * are one buffer, v == k). */
size_t moe_kvcache_bytes_per_slot(const struct moe_kvcache *kv);

/* The row of KV head h at offset o of block `block` in a layer's K or V
 * plane, B the block size: the row's first value is at its index * Dh,
 * its fp8 scale at its index.  Offsets o .. o + n of a block are n + 1
 * consecutive rows, and head h + 1's row is B rows after head h's. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline size_t moe_kv_block_row(size_t block, size_t o, size_t B, size_t Hkv, size_t h)
{
    return (block * Hkv + h) * B + o;
}
/* The same by slot (position p's slot: table[p / B] * B + p % B). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline size_t moe_kv_row(size_t slot, size_t B, size_t Hkv, size_t h)
{
    return moe_kv_block_row(slot / B, slot % B, B, Hkv, h);
}

/* --- fp8 rows (MOE_DTYPE_F8E4M3 caches, see the top of this file) --- */

/* The scale of a row whose largest finite |value| is amax (0 for none). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline float moe_kv_fp8_scale(float amax) { return amax / MOE_E4M3_MAX; }
/* |x| where x is finite, else 0: what a row's amax is the maximum of. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline float moe_kv_fp8_abs(float x) { return x - x == 0.0f ? fabsf(x) : 0.0f; }
/* The byte of value x in a row of scale s: e4m3(x / s); 0 for a finite x
 * when s is 0; NaN (0x7F / 0xFF) for NaN or infinite x. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline uint8_t moe_kv_fp8_encode(float x, float s)
{
    if (s == 0.0f && x - x == 0.0f) return 0;
    return moe_f32_to_e4m3(x / s);
}
/* Quantizes the row x (n values) into q (n bytes); returns its scale. */
float moe_kvcache_fp8_quantize_row(uint8_t *q, const float *x, size_t n);
/* dst (n) = e4m3(q[i]) * s, each the exact product rounded once. */
void moe_kvcache_fp8_row_f32(float *dst, const uint8_t *q, float s, size_t n);

#ifdef __cplusplus
}
#endif
