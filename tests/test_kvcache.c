/* test_kvcache.c - block pool, budget sizing and the prefix cache. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache/kvcache.h"
#include "runtime/backend/backend.h"
#include "tests/testutil.h"

static struct moe_backend be;
static struct moe_config cfg = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4};

static void setup(void) { cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK); }
static void teardown(void) { moe_backend_free(&be); }

TestSuite(kvcache, .init = setup, .fini = teardown);

Test(kvcache, budget_sizes_pool_and_refuses_less_than_a_block)
{
    /* one block of 16 tokens: 2 (K,V) * 2 layers * 2 heads * 4 * 16 * 2 bytes */
    cr_assert_eq(moe_kvcache_block_bytes(&cfg, 16, MOE_DTYPE_BF16), 1024u);
    int n;
    cr_assert_eq(moe_kvcache_blocks_for_budget(&cfg, 16, MOE_DTYPE_BF16, 10 * 1024 + 5, &n), MOE_OK);
    cr_assert_eq(n, 10);
    cr_assert_eq(moe_kvcache_blocks_for_budget(&cfg, 16, MOE_DTYPE_BF16, 1023, &n), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "1023 bytes"), "%s", moe_last_error());
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, 0, 16, MOE_DTYPE_F32, false), MOE_ERR_INVALID_ARG);
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, 1 << 30, 1 << 30, MOE_DTYPE_F32, false), MOE_ERR_NOMEM);
}

Test(kvcache, alloc_release_refcount)
{
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, 3, 4, MOE_DTYPE_F32, false), MOE_OK);
    int32_t a, b, c, d;
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &a), MOE_OK);
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &b), MOE_OK);
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &c), MOE_OK);
    cr_assert(a != b && b != c && a != c);
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &d), MOE_ERR_NOMEM);
    moe_kvcache_ref_block(&kv, b);
    moe_kvcache_release_block(&kv, b);
    cr_assert_eq(moe_kvcache_available(&kv), 0, "b still referenced once");
    moe_kvcache_release_block(&kv, b);
    cr_assert_eq(moe_kvcache_available(&kv), 1);
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &d), MOE_OK);
    cr_assert_eq(d, b);
    moe_kvcache_free(&kv);
    moe_kvcache_free(&kv); /* twice is safe */
}

Test(kvcache, prefix_chain_lookup_and_lru_eviction)
{
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, 4, 2, MOE_DTYPE_F32, true), MOE_OK);
    const int32_t t1[2] = {1, 2}, t2[2] = {3, 4}, t3[2] = {5, 6};
    int32_t a, b;
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &a), MOE_OK);
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &b), MOE_OK);
    moe_kvcache_cache_block(&kv, a, -1, t1);
    moe_kvcache_cache_block(&kv, b, a, t2);
    /* the same tokens after a different parent do not match */
    cr_assert_eq(moe_kvcache_lookup(&kv, -1, t2), -1);
    cr_assert_eq(moe_kvcache_lookup(&kv, b, t2), -1);
    cr_assert_eq(moe_kvcache_lookup(&kv, -1, t1), a);
    cr_assert_eq(moe_kvcache_lookup(&kv, a, t2), b);
    cr_assert_eq(kv.blocks[a].refcount, 2);
    /* release everything: both become evictable, not free */
    for (int i = 0; i < 2; i++) {
        moe_kvcache_release_block(&kv, a);
        moe_kvcache_release_block(&kv, b);
    }
    cr_assert_eq(kv.n_free, 2);
    cr_assert_eq(kv.n_evictable, 2);
    cr_assert_eq(moe_kvcache_available(&kv), 4);
    /* a hit on an evictable block takes it off the LRU list */
    cr_assert_eq(moe_kvcache_lookup(&kv, -1, t1), a);
    cr_assert_eq(kv.n_evictable, 1);
    moe_kvcache_release_block(&kv, a); /* now a is the most recently used */
    int32_t x[4];
    for (int i = 0; i < 3; i++) cr_assert_eq(moe_kvcache_alloc_block(&kv, &x[i]), MOE_OK);
    /* two free blocks went first, then the least recently used cached: b */
    cr_assert_eq(x[2], b);
    cr_assert_eq(kv.stats.evictions, 1);
    cr_assert_eq(moe_kvcache_lookup(&kv, a, t2), -1, "evicted block no longer found");
    /* a's child key died with b; re-register b's slot with other content */
    moe_kvcache_cache_block(&kv, x[2], a, t3);
    cr_assert_eq(moe_kvcache_lookup(&kv, a, t3), x[2]);
    /* evict a: its generation changes, so children registered under it never match */
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &x[3]), MOE_OK);
    cr_assert_eq(x[3], a);
    moe_kvcache_cache_block(&kv, a, -1, t1);
    cr_assert_eq(moe_kvcache_lookup(&kv, a, t3), -1);
    moe_kvcache_free(&kv);
}

/* A block that duplicates a cached chain block is not cached itself, but a
 * sequence still registers its next block under it.  Once it is freed and
 * reused for other tokens, that child must not match under it. */
Test(kvcache, child_of_a_freed_uncached_block_never_matches)
{
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, 4, 2, MOE_DTYPE_F32, true), MOE_OK);
    const int32_t t1[2] = {1, 2}, t2[2] = {3, 4}, t3[2] = {5, 6};
    int32_t a, dup, child, again;
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &a), MOE_OK);
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &dup), MOE_OK);
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &child), MOE_OK);
    moe_kvcache_cache_block(&kv, a, -1, t1);
    moe_kvcache_cache_block(&kv, dup, -1, t1); /* the same chain block: dup stays uncached */
    cr_assert(!kv.blocks[dup].cached);
    moe_kvcache_cache_block(&kv, child, dup, t2);
    cr_assert(kv.blocks[child].cached);
    moe_kvcache_release_block(&kv, dup);
    cr_assert_eq(moe_kvcache_alloc_block(&kv, &again), MOE_OK);
    cr_assert_eq(again, dup, "the freed block is reused");
    moe_kvcache_cache_block(&kv, again, -1, t3);
    cr_assert_eq(moe_kvcache_lookup(&kv, again, t2), -1,
                 "a child of the block's earlier content is not found under its new content");
    moe_kvcache_free(&kv);
}

/* Many random cache/evict cycles: every block the index holds is found by
 * its key, and nothing else is (checks backward-shift deletion). */
Test(kvcache, index_survives_random_churn)
{
    enum { NB = 64, B = 3 };
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, NB, B, MOE_DTYPE_F32, true), MOE_OK);
    uint64_t s = 99;
    int32_t toks[NB][B];
    bool live[NB] = {0};
    for (int it = 0; it < 20000; it++) {
        int32_t b;
        cr_assert_eq(moe_kvcache_alloc_block(&kv, &b), MOE_OK);
        live[b] = false; /* whatever it held is gone */
        for (int i = 0; i < B; i++) toks[b][i] = (int32_t)(tu_rand_u64(&s) % 5);
        moe_kvcache_cache_block(&kv, b, -1, toks[b]);
        live[b] = kv.blocks[b].cached;
        moe_kvcache_release_block(&kv, b);
        if (it % 997 == 0) {
            for (int k = 0; k < NB; k++) {
                if (!live[k] || !kv.blocks[k].cached) continue;
                int32_t got = moe_kvcache_lookup(&kv, -1, toks[k]);
                cr_assert_eq(got, k, "block %d lost from the index", k);
                moe_kvcache_release_block(&kv, got);
            }
        }
    }
    cr_assert_eq(moe_kvcache_available(&kv), NB);
    moe_kvcache_free(&kv);
}

/* MLA (DeepSeek) keeps one latent row per token, read as K and V: half the
 * bytes of separate K and V rows of the same width, so a budget buys twice
 * the blocks. */
Test(kvcache, mla_rows_serve_as_k_and_v)
{
    struct moe_config cfg = {.n_layers = 3, .n_kv_heads = 1, .head_dim = 40, .n_heads = 4};
    const size_t separate = moe_kvcache_block_bytes(&cfg, 16, MOE_DTYPE_BF16);
    cfg.kv_lora_rank = 32;
    cr_assert_eq(moe_kvcache_block_bytes(&cfg, 16, MOE_DTYPE_BF16) * 2, separate);
    struct moe_backend be;
    cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK);
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, 8, 16, MOE_DTYPE_BF16, false), MOE_OK);
    cr_assert(kv.v == kv.k, "one buffer for both");
    cr_assert_eq(moe_kvcache_bytes_per_slot(&kv), (size_t)3 * 40 * 2);
    moe_kvcache_free(&kv);
    moe_backend_free(&be);
}

/* A pool divided in parts (data-parallel attention): each allocation
 * stays in its part, low ids first; a part runs out while the others have
 * room; eviction takes the part's own least recently used cached block;
 * the storage holds the stored part alone. */
Test(kvcache, parts_allocate_and_evict_within_their_range)
{
    struct moe_kvcache kv, whole;
    cr_assert_eq(moe_kvcache_init_part(&kv, moe_backend_allocator(&be), &cfg, 7, 2, MOE_DTYPE_F32, true, 2, 1),
                 MOE_ERR_INVALID_ARG, "7 blocks do not divide in 2 parts");
    cr_assert_eq(moe_kvcache_init_part(&kv, moe_backend_allocator(&be), &cfg, 6, 2, MOE_DTYPE_F32, true, 3, 3),
                 MOE_ERR_INVALID_ARG, "part 3 of 3");
    cr_assert_eq(moe_kvcache_init_part(&kv, moe_backend_allocator(&be), &cfg, 6, 2, MOE_DTYPE_F32, true, 3, 1),
                 MOE_OK);
    cr_assert_eq(moe_kvcache_init(&whole, moe_backend_allocator(&be), &cfg, 6, 2, MOE_DTYPE_F32, true), MOE_OK);
    cr_assert_eq(kv.part_blocks, 2);
    cr_assert_eq(kv.stored_first, 2);
    cr_assert_eq(kv.layer_elems * 3, whole.layer_elems, "storage for one part of three");
    int32_t x[6];
    cr_assert_eq(moe_kvcache_alloc_block_in(&kv, 1, &x[0]), MOE_OK);
    cr_assert_eq(moe_kvcache_alloc_block_in(&kv, 1, &x[1]), MOE_OK);
    cr_assert_eq(x[0], 2);
    cr_assert_eq(x[1], 3);
    cr_assert_eq(moe_kvcache_part_of(&kv, x[1]), 1);
    cr_assert_eq(moe_kvcache_available_in(&kv, 1), 0);
    cr_assert_eq(moe_kvcache_available_in(&kv, 0), 2);
    cr_assert_eq(moe_kvcache_available(&kv), 4);
    cr_assert_eq(moe_kvcache_alloc_block_in(&kv, 1, &x[2]), MOE_ERR_NOMEM, "part 1 is full, part 0 is not");
    cr_assert(strstr(moe_last_error(), "part 1"), "%s", moe_last_error());
    cr_assert_eq(moe_kvcache_alloc_block_in(&kv, 2, &x[2]), MOE_OK);
    cr_assert_eq(x[2], 4);
    cr_assert_eq(moe_kvcache_alloc_block_in(&kv, 0, &x[3]), MOE_OK);
    cr_assert_eq(x[3], 0);
    /* cached and released: evictable in its own part only */
    const int32_t t[2] = {7, 8}, u[2] = {9, 10};
    moe_kvcache_cache_block(&kv, x[0], -1, t);
    moe_kvcache_cache_block(&kv, x[3], -1, u);
    moe_kvcache_release_block(&kv, x[0]);
    moe_kvcache_release_block(&kv, x[3]);
    cr_assert_eq(moe_kvcache_available_in(&kv, 1), 1);
    cr_assert_eq(moe_kvcache_available_in(&kv, 0), 2);
    cr_assert_eq(moe_kvcache_alloc_block_in(&kv, 0, &x[4]), MOE_OK);
    cr_assert_eq(x[4], 1, "part 0's free block before its cached one");
    cr_assert_eq(moe_kvcache_alloc_block_in(&kv, 1, &x[5]), MOE_OK);
    cr_assert_eq(x[5], 2, "part 1's cached block evicted, not part 0's");
    cr_assert_eq(moe_kvcache_lookup(&kv, -1, t), -1);
    cr_assert_eq(moe_kvcache_lookup(&kv, -1, u), 0, "part 0's cached block still there");
    moe_kvcache_free(&kv);
    moe_kvcache_free(&whole);
}

/* The recurrent-state slots of a divided pool (a hybrid model under
 * data-parallel attention): in the pool's parts, taken and given back
 * within a part, storage for the stored part's alone. */
Test(kvcache, state_slots_in_parts)
{
    struct moe_config h = cfg;
    h.n_layers = 2;
    h.lin_k_heads = 1, h.lin_v_heads = 1, h.lin_k_dim = 4, h.lin_v_dim = 4, h.lin_conv = 4;
    for (int l = 0; l < 2; l++) h.layer_linear[l] = l == 0;
    const size_t per_slot = moe_config_state_bytes(&h);
    cr_assert(per_slot > 0 && per_slot != SIZE_MAX);
    struct moe_kvcache kv;
    cr_assert_eq(moe_kvcache_init_part(&kv, moe_backend_allocator(&be), &h, 4, 2, MOE_DTYPE_F32, false, 2, 1), MOE_OK);
    cr_assert_eq(moe_kvcache_init_state(&kv, &h, 5), MOE_ERR_INVALID_ARG, "5 slots in 2 parts");
    cr_assert_eq(moe_kvcache_init_state(&kv, &h, 6), MOE_OK);
    cr_assert_eq(kv.state_part_slots, 3);
    cr_assert_eq(kv.state_first, 3);
    int32_t a, b, c, d;
    cr_assert_eq(moe_kvcache_alloc_state_in(&kv, 1, &a), MOE_OK);
    cr_assert_eq(a, 3);
    cr_assert_eq(moe_kvcache_alloc_state_in(&kv, 1, &b), MOE_OK);
    cr_assert_eq(moe_kvcache_alloc_state_in(&kv, 1, &c), MOE_OK);
    cr_assert_eq(c, 5);
    cr_assert_eq(moe_kvcache_alloc_state_in(&kv, 1, &d), MOE_ERR_NOMEM, "part 1's three are taken");
    cr_assert_eq(moe_kvcache_alloc_state_in(&kv, 0, &d), MOE_OK);
    cr_assert_eq(d, 0);
    moe_kvcache_release_state(&kv, b);
    cr_assert_eq(moe_kvcache_alloc_state_in(&kv, 1, &d), MOE_OK);
    cr_assert_eq(d, b, "back to its part");
    cr_assert_eq(kv.n_state_free, 2);
    moe_kvcache_free(&kv);
}
