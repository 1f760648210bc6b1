/* attention_decode.c - the fast CPU attention of one decode row at a long
 * context, alone: each layer's K and V of ctx cached tokens read once, on
 * `threads` threads (the attention's own split of a decode row: its KV
 * heads in as many items), beside a plain read of the same bytes in the
 * same run on as many threads (the rate they stream memory at just then:
 * the machine is shared).
 *
 *   bench_attention_decode [Hq Hkv Dh ctx layers dtype reps [threads]]
 *   (default: 8 8 128 2048 8 f32 20 1, bench-olmoe's attention)
 *
 * Prints the median over reps of a step's attention (all layers) in ms,
 * the KV bytes over that time, and the plain read's figures, alternated
 * run by run. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "bench/bench_util.h"
#include "runtime/backend/backend.h"
#include "runtime/cpu/gemm_fast.h"

static const char *PROG = "bench_attention_decode";

/* The sum of n floats at p, four lanes of chains (what a reader of p at
 * full speed does). */
__attribute__((target("avx2"))) static float plain_read(const float *p, size_t n)
{
    float s[16] = {0};
    for (size_t i = 0; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) s[l] += p[i + l];
    float t = 0;
    for (int l = 0; l < 16; l++) t += s[l];
    return t;
}

int main(int argc, char **argv)
{
    int Hq = 8, Hkv = 8, Dh = 128, ctx = 2048, L = 8, reps = 20;
    const char *dts = "f32";
    int nth = 1;
    if (argc > 1 && argc != 8 && argc != 9) {
        fprintf(stderr, "usage: %s [Hq Hkv Dh ctx layers f32|bf16|f16 reps [threads]]\n", PROG);
        return 2;
    }
    if (argc >= 8) {
        Hq = atoi(argv[1]), Hkv = atoi(argv[2]), Dh = atoi(argv[3]), ctx = atoi(argv[4]), L = atoi(argv[5]);
        dts = argv[6], reps = atoi(argv[7]);
    }
    if (argc == 9) nth = atoi(argv[8]);
    const enum moe_dtype dt = !strcmp(dts, "bf16") ? MOE_DTYPE_BF16 : !strcmp(dts, "f16") ? MOE_DTYPE_F16
                                                                                           : MOE_DTYPE_F32;
    if (Hq <= 0 || Hkv <= 0 || Hq % Hkv || Dh <= 0 || ctx <= 0 || L <= 0 || reps <= 0 || ctx > (1 << 20) || nth <= 0 || nth > 256 ||
        (size_t)Hkv * Dh > (1u << 16)) {
        fprintf(stderr, "%s: shapes out of range\n", PROG);
        return 2;
    }
    omp_set_num_threads(nth);
    enum { B = 16 };
    const int nb = (ctx + B - 1) / B;
    struct moe_config cfg = {.n_layers = L, .n_kv_heads = Hkv, .head_dim = Dh, .n_heads = Hq};
    struct moe_backend be;
    struct moe_kvcache kv;
    if (moe_backend_cpu_init(&be, 0) != MOE_OK ||
        moe_kvcache_init(&kv, moe_backend_allocator(&be), &cfg, nb, B, dt, false) != MOE_OK) {
        fprintf(stderr, "%s: %s\n", PROG, moe_last_error());
        return 1;
    }
    /* the cache: random K/V for ctx tokens in blocks in order, every layer */
    const size_t row = (size_t)Hkv * Dh;
    float *k = bench_alloc(PROG, (size_t)ctx * row * 4), *v = bench_alloc(PROG, (size_t)ctx * row * 4);
    int32_t *slots = bench_alloc(PROG, (size_t)ctx * 4), *table = bench_alloc(PROG, (size_t)nb * 4);
    for (size_t i = 0; i < (size_t)ctx * row; i++) {
        k[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
        v[i] = (float)((i * 40503u) % 1999) * 1e-3f - 1.0f;
    }
    for (int i = 0; i < nb; i++) table[i] = i;
    for (int t = 0; t < ctx; t++) slots[t] = t;
    for (int l = 0; l < L; l++) moe_attention_kv_store_cpu(&kv, l, k, v, slots, ctx);
    float *q = bench_alloc(PROG, (size_t)Hq * Dh * 4), *out = bench_alloc(PROG, (size_t)Hq * Dh * 4);
    for (int i = 0; i < Hq * Dh; i++) q[i] = (float)(i % 17) * 0.05f - 0.4f;
    int32_t pos[1] = {ctx - 1}, seq_of[1] = {0}, start[2] = {0, 1}, clen[1] = {ctx}, slot[1] = {ctx - 1}, lr[1] = {0};
    struct moe_batch b = {.n_tokens = 1, .n_seqs = 1, .positions = pos, .seq_of = seq_of, .seq_start = start,
                          .ctx_len = clen, .block_table = table, .max_blocks = nb, .slot = slot, .logit_rows = lr};
    const size_t per = moe_attention_fast_scratch(Hq / Hkv, Dh) + 64;
    float *scratch = bench_alloc(PROG, per * (size_t)nth * sizeof(float)); /* a thread's each */
    const enum moe_cpu_isa isa = moe_cpu_isa_detect();
    const size_t kv_bytes = 2 * (size_t)L * (size_t)ctx * row * moe_dtype_size(dt);
    /* the plain read: the same number of bytes, laid out the same (the
     * pool's K then V of every layer) */
    const float *pool_k = kv.k, *pool_v = kv.v;
    const size_t pool_floats = (size_t)L * kv.layer_elems * moe_dtype_size(dt) / 4;
    const size_t part = pool_floats / (size_t)nth / 16 * 16; /* a thread's share of the plain read */
    double *ta = bench_alloc(PROG, (size_t)reps * sizeof(double)), *tp = bench_alloc(PROG, (size_t)reps * sizeof(double));
    /* a buffer read between the runs, so that neither finds the other's
     * bytes in the last-level cache (as a decode step's weights evict its
     * cache from it) */
    const size_t evict_floats = (size_t)48 << 20;
    float *evict = bench_alloc(PROG, evict_floats * sizeof(float));
    for (size_t i = 0; i < evict_floats; i++) evict[i] = (float)(i & 7);
    float sink = 0;
    for (int r = 0; r < reps; r++) {
        sink += plain_read(evict, evict_floats);
        const double t0 = bench_clock(CLOCK_MONOTONIC);
        for (int l = 0; l < L; l++) {
            struct moe_attn_params p = {l, Hq, Hkv, Dh, 1.0f / sqrtf((float)Dh), 0, 0, NULL, 0, 0, 0.0f, NULL, 0};
            moe_attention_paged_fast(isa, out, q, &kv, &b, &p, scratch, per);
            sink += out[l % (Hq * Dh)];
        }
        const double t1 = bench_clock(CLOCK_MONOTONIC);
        sink += plain_read(evict, evict_floats);
        const double t2 = bench_clock(CLOCK_MONOTONIC);
        float sp = 0; /* each thread a part of K and of V */
#pragma omp parallel for num_threads(nth) reduction(+ : sp)
        for (int i = 0; i < nth; i++)
            sp += plain_read(pool_k + part * (size_t)i, part) + plain_read(pool_v + part * (size_t)i, part);
        sink += sp;
        const double t3 = bench_clock(CLOCK_MONOTONIC);
        ta[r] = t1 - t0;
        tp[r] = t3 - t2;
    }
    qsort(ta, (size_t)reps, sizeof *ta, bench_cmp_double);
    qsort(tp, (size_t)reps, sizeof *tp, bench_cmp_double);
    const double a = ta[reps / 2], pr = tp[reps / 2];
    const double plain_bytes = 2.0 * (double)part * (double)nth * 4.0;
    bench_print_load();
    printf("%s: Hq %d Hkv %d Dh %d ctx %d layers %d %s, set %s, %d thread%s, median of %d\n", PROG, Hq, Hkv, Dh,
           ctx, L, dts, moe_cpu_isa_name(isa), nth, nth > 1 ? "s" : "", reps);
    printf("attention: %.3f ms a step, %.1f GB/s of KV (%.1f MB)\n", a * 1e3, (double)kv_bytes / a * 1e-9,
           (double)kv_bytes * 1e-6);
    printf("plain read: %.3f ms, %.1f GB/s (%.1f MB); attention at %.0f%% of it (%g)\n", pr * 1e3,
           plain_bytes / pr * 1e-9, plain_bytes * 1e-6, 100.0 * ((double)kv_bytes / a) / (plain_bytes / pr),
           (double)sink * 0.0);
    return 0;
}
