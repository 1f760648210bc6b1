/* grammar_mask.c - what a grammar's token mask costs (docs/grammar.md).
 *
 * 1. The mask alone on a 151,646-token vocabulary (Qwen2's size): the
 *    qwen2 fixture tokenizer's 3,000 tokens plus tokens made by joining 2
 *    or 3 of them (seeded), with the json_object grammar, at every byte of
 *    a JSON document, from a state with an empty mask cache: masks that
 *    first computed a position's token set (cold), masks from the sets
 *    already computed (warm), a state's cached mask, and the trie walk
 *    from the whole state (what a mask inside a UTF-8 character does).
 * 2. Decoding on models/demo-moe: tokens/s of 32 sampled requests with and
 *    without json_object, same prompts and seeds, rounds alternated.
 *
 * Build (after the CPU build in build/):
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -I. bench/grammar_mask.c -o build/bench_grammar_mask \
 *     -Lbuild -lmoerun_all $(pkg-config --libs jansson libpcre2-8 libutf8proc) -fopenmp -lm
 * Run from the repository root: build/bench_grammar_mask [mask|decode] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "runtime/backend/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/grammar/grammar_impl.h" /* n_pm: the per-position sets computed so far */
#include "runtime/text/tokenizer.h"

#define CHECK(x)                                                                    \
    do {                                                                            \
        if ((x) != MOE_OK) {                                                        \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, moe_last_error());    \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static void mask_cost(void)
{
    struct moe_tokenizer tok;
    CHECK(moe_tokenizer_load(&tok, "tests/fixtures/tokenizers/qwen2"));
    const int V = 151646, base = tok.n_vocab;
    uint32_t *off = malloc(((size_t)V + 1) * sizeof *off);
    uint8_t *bytes = malloc((size_t)V * 64), *in = calloc((size_t)V, 1);
    char **bt = calloc((size_t)base, sizeof *bt);
    size_t *bl = calloc((size_t)base, sizeof *bl);
    int32_t *plain = malloc((size_t)base * sizeof *plain);
    int n_plain = 0;
    for (int i = 0; i < base; i++) {
        bool special;
        CHECK(moe_tokenizer_token_bytes(&tok, i, &bt[i], &bl[i], &special));
        if (!special && bl[i] > 0 && bl[i] < 20) plain[n_plain++] = i;
    }
    uint32_t at = 0;
    uint64_t seed = 12345;
    for (int i = 0; i < V; i++) {
        off[i] = at;
        if (i < base) {
            memcpy(bytes + at, bt[i], bl[i]);
            at += (uint32_t)bl[i];
            in[i] = bl[i] > 0;
            continue;
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int parts = 2 + (int)((seed >> 33) % 2);
        for (int k = 0; k < parts; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int32_t t = plain[(seed >> 33) % (uint64_t)n_plain];
            memcpy(bytes + at, bt[t], bl[t]);
            at += (uint32_t)bl[t];
        }
        in[i] = 1;
    }
    off[V] = at;
    struct moe_grammar_vocab gv;
    double t0 = bench_clock(CLOCK_MONOTONIC);
    CHECK(moe_grammar_vocab_init(&gv, V, off, bytes, in));
    printf("vocabulary: %d tokens, %u bytes, trie of %d nodes built in %.1f ms\n", V, at, gv.n_nodes,
           1e3 * (bench_clock(CLOCK_MONOTONIC) - t0));
    struct moe_grammar *g;
    CHECK(moe_grammar_json_object(&g));
    const char *doc = "{\"name\": \"Alice Smith\", \"age\": 42, \"tags\": [\"a\", \"b c\"], \"score\": -3.25e2,\n"
                      "  \"nested\": {\"ok\": true, \"none\": null, \"text\": \"caf\xc3\xa9 \\\"quoted\\\"\"}}";
    struct moe_grammar_state st, fresh = {0};
    CHECK(moe_grammar_state_init(&st, g));
    uint32_t *bits = malloc(((size_t)V + 31) / 32 * 4), *ref = malloc(((size_t)V + 31) / 32 * 4);
    double cold = 0, cold_max = 0, warm = 0, warm_max = 0, hit = 0, full = 0;
    int n = 0, n_cold = 0;
    long allowed = 0;
    for (size_t i = 0; doc[i]; i++, n++) {
        CHECK(moe_grammar_state_copy(&fresh, &st)); /* st never masks: an empty cache */
        int32_t sets = g->n_pm;
        double a = bench_clock(CLOCK_MONOTONIC);
        CHECK(moe_grammar_mask(&fresh, &gv, bits));
        double b = bench_clock(CLOCK_MONOTONIC);
        CHECK(moe_grammar_mask(&fresh, &gv, bits)); /* the same state again: its cache */
        double c = bench_clock(CLOCK_MONOTONIC);
        CHECK(moe_grammar_mask_walk(&fresh, &gv, ref));
        double d = bench_clock(CLOCK_MONOTONIC);
        if (memcmp(bits, ref, ((size_t)V + 31) / 32 * 4)) {
            fprintf(stderr, "masks differ at byte %zu\n", i);
            exit(1);
        }
        if (g->n_pm > sets) {
            cold += b - a;
            n_cold++;
            if (b - a > cold_max) cold_max = b - a;
        } else {
            warm += b - a;
            if (b - a > warm_max) warm_max = b - a;
        }
        hit += c - b;
        full += d - c;
        for (int t = 0; t < V; t++) allowed += bits[t >> 5] >> (t & 31) & 1;
        bool ok;
        CHECK(moe_grammar_state_advance(&st, (const uint8_t *)doc + i, 1, &ok));
        if (!ok) {
            fprintf(stderr, "document refused at byte %zu\n", i);
            exit(1);
        }
    }
    printf("json_object over %d states (%.0f tokens allowed on average):\n"
           "  cold (a position's set computed): %d masks, %.2f ms mean, %.2f ms max\n"
           "  warm (sets known, state not cached): %d masks, %.3f ms mean, %.3f ms max\n"
           "  from the state's cache: %.4f ms mean\n"
           "  trie walk from the whole state: %.2f ms mean\n", n, (double)allowed / n, n_cold,
           1e3 * cold / (n_cold ? n_cold : 1), 1e3 * cold_max, n - n_cold, 1e3 * warm / (n - n_cold),
           1e3 * warm_max, 1e3 * hit / n, 1e3 * full / n);
    moe_grammar_state_free(&fresh);
    moe_grammar_state_free(&st);
    moe_grammar_free(g);
    moe_grammar_vocab_free(&gv);
    for (int i = 0; i < base; i++) free(bt[i]);
    free(bt);
    free(bl);
    free(plain);
    free(off);
    free(bytes);
    free(in);
    free(bits);
    free(ref);
    moe_tokenizer_free(&tok);
}

/* 32 sampled requests of 128 tokens (no stop ids): tokens/s. */
static uint64_t hits, misses;

static double decode_rate(struct moe_engine *e, struct moe_tokenizer *tok, const struct moe_grammar *g,
                          long *n_tokens)
{
    const char *prompt = "Once upon a time, there was a happy dog named";
    int32_t *ids;
    size_t np;
    CHECK(moe_tokenizer_encode(tok, prompt, strlen(prompt), false, &ids, &np, NULL));
    struct moe_request *rs[32];
    for (int i = 0; i < 32; i++) {
        struct moe_request_params p = {.max_tokens = 128, .grammar = g};
        moe_sampling_defaults(&p.sampling);
        p.sampling.temperature = 1.0f;
        p.sampling.seed = (uint64_t)i + 1;
        CHECK(moe_engine_submit(e, ids, (int)np, &p, NULL, &rs[i]));
    }
    /* prefill first, then time the decode steps */
    int rows;
    CHECK(moe_engine_step(e, &rows));
    uint64_t before = e->n.generated_tokens;
    double t0 = bench_clock(CLOCK_MONOTONIC);
    while (!moe_engine_idle(e)) CHECK(moe_engine_step(e, &rows));
    double dt = bench_clock(CLOCK_MONOTONIC) - t0;
    *n_tokens = (long)(e->n.generated_tokens - before);
    for (int i = 0; i < 32; i++) {
        if (rs[i]->gstate) {
            hits += rs[i]->gstate->n_mask_hits;
            misses += rs[i]->gstate->n_mask_misses;
        }
        moe_engine_release(e, rs[i]);
    }
    free(ids);
    return (double)*n_tokens / dt;
}

static void decode_cost(void)
{
    const char *dir = "models/demo-moe";
    struct moe_backend be;
    struct moe_model m;
    struct moe_tokenizer tok;
    struct moe_grammar_vocab gv;
    struct moe_grammar *g;
    CHECK(moe_backend_cpu_fast_init(&be, 1));
    CHECK(moe_model_load(&m, dir));
    CHECK(moe_tokenizer_load(&tok, dir));
    CHECK(moe_grammar_vocab_from_tokenizer(&gv, &tok, m.cfg.vocab));
    CHECK(moe_grammar_json_object(&g));
    struct moe_engine_opts o = {.max_batch_tokens = 512, .max_seqs = 32, .block_size = 16, .n_blocks = 32 * 12,
                                .kv_dtype = MOE_DTYPE_F32, .prefix_cache = false, .grammar_vocab = &gv};
    struct moe_engine e;
    CHECK(moe_engine_init(&e, &m, &be, &o));
    double with = 0, without = 0;
    long nw = 0, nwo = 0;
    for (int round = 0; round < 3; round++) {
        long k;
        double r = decode_rate(&e, &tok, NULL, &k);
        without += r;
        nwo += k;
        printf("round %d: no grammar %.0f tokens/s (%ld tokens)", round, r, k);
        r = decode_rate(&e, &tok, g, &k);
        with += r;
        nw += k;
        printf(", json_object %.0f tokens/s (%ld tokens)\n", r, k);
    }
    printf("demo-moe, 32 sampled requests, 1 thread: %.0f tokens/s without, %.0f with json_object (%.1f%% "
           "slower); %llu masks, %.1f%% from the cache\n", without / 3, with / 3, 100.0 * (1 - with / without),
           (unsigned long long)e.n.grammar_masks, 100.0 * (double)hits / (double)(hits + misses));
    moe_engine_free(&e);
    moe_grammar_free(g);
    moe_grammar_vocab_free(&gv);
    moe_tokenizer_free(&tok);
    moe_model_free(&m);
    moe_backend_free(&be);
}

int main(int argc, char **argv)
{
    bool all = argc < 2;
    if (all || !strcmp(argv[1], "mask")) mask_cost();
    if (all || !strcmp(argv[1], "decode")) decode_cost();
    return 0;
}
