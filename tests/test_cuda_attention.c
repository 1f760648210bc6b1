/* test_cuda_attention.c - the CUDA K/V store and paged attention kernels
 * (per-row decode, tiled prefill, the per-row kernel for prefill steps with
 * MOERUN_CUDA_PREFILL_ATTN=rows, and the MLA kernel over one shared K/V row
 * for decode and prefill) against the CPU reference, on scrambled block
 * tables, every KV dtype (fp8 with its row scales), windows and mixed
 * batches.
 * Same conventions as test_cuda_ops.c (tests/cuda_test.h). */
#include "tests/cuda_test.h"

TestSuite(cuda_ops, .init = setup, .fini = teardown);

/* ---- K/V store and paged attention ---- */

/* Steps of more rows than this take the tiled prefill kernel
 * (ATT_SPLIT_ROWS in runtime/backend/backend_cuda_impl.h), unless the backend was
 * opened with MOERUN_CUDA_PREFILL_ATTN=rows (the cuda_prefill_rows suite). */
#define TILED_ABOVE_ROWS 64
static bool rows_backend, mma_backend;

/* n_seqs sequences of ctx[s] tokens in a cache of blocks handed out in a
 * scrambled order; queries: the last rows[s] positions of each (the earlier
 * positions are context already cached, as for a later chunk of a chunked
 * prefill; one row is a decode step).  mla: the cache of an MLA model, one
 * row per token read as K and V (kv->v == kv->k); kv_store is given a V of
 * other values, which it must not write. */
static void check_attention_full(enum moe_dtype kvdt, int Hq, int Hkv, int Dh, int window,
                                 const int *ctx, const int *rows, int n_seqs, bool hint, bool sinks,
                                 bool mla)
{
    const int B = 16, L = 2, layer = 1;
    struct moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.n_layers = L;
    cfg.n_kv_heads = Hkv;
    cfg.head_dim = Dh;
    if (mla) { /* rope + latent: 64 + 512 in DeepSeek-V2/V3 */
        cr_assert(Hkv == 1 && Dh >= 2);
        cfg.rope_dim = Dh > 64 ? 64 : Dh / 2;
        cfg.kv_lora_rank = Dh - cfg.rope_dim;
    }
    int max_ctx = 0, max_blocks = 0, total = 0, T = 0;
    for (int s = 0; s < n_seqs; s++) {
        max_ctx = ctx[s] > max_ctx ? ctx[s] : max_ctx;
        total += ctx[s];
        T += rows[s] < ctx[s] ? rows[s] : ctx[s];
    }
    max_blocks = (max_ctx + B - 1) / B;
    const int n_blocks = n_seqs * max_blocks + 3;
    struct moe_kvcache hkv, dkv;
    cr_assert_eq(moe_kvcache_init(&hkv, moe_backend_allocator(&cpu), &cfg, n_blocks, B, kvdt, false), MOE_OK);
    cr_assert_eq(moe_kvcache_init(&dkv, moe_backend_allocator(&gpu), &cfg, n_blocks, B, kvdt, false), MOE_OK);
    cr_assert_eq(hkv.v == hkv.k, mla);
    cr_assert_eq(dkv.v == dkv.k, mla);
    int32_t *table = calloc((size_t)n_seqs * max_blocks, sizeof(int32_t));
    for (int i = 0; i < n_seqs * max_blocks; i++) table[i] = (int32_t)((i * 7 + 2) % n_blocks);
    /* a permutation needs gcd(7, n_blocks) == 1; fall back to identity */
    if (n_blocks % 7 == 0)
        for (int i = 0; i < n_seqs * max_blocks; i++) table[i] = i;
    /* fill every position of every sequence */
    const int row = Hkv * Dh;
    float *k = rand_floats((size_t)total * row, 71, -1, 1), *v = rand_floats((size_t)total * row, 72, -1, 1);
    int32_t *slots = malloc((size_t)total * sizeof(int32_t));
    for (int s = 0, r = 0; s < n_seqs; s++)
        for (int p = 0; p < ctx[s]; p++, r++)
            slots[r] = table[(size_t)s * max_blocks + p / B] * B + p % B;
    cr_assert_eq(cpu.ops->kv_store(&cpu, &hkv, layer, k, v, slots, total), MOE_OK);
    float *dk = dev_copy(k, (size_t)total * row * sizeof(float)), *dv = dev_copy(v, (size_t)total * row * sizeof(float));
    int32_t *dslots = dev_copy(slots, (size_t)total * sizeof(int32_t));
    cr_assert_eq(gpu.ops->kv_store(&gpu, &dkv, layer, dk, dv, dslots, total), MOE_OK, "%s", moe_last_error());
    /* the stored caches are bit-identical (same rounding) */
    const size_t lbytes = hkv.layer_elems * moe_dtype_size(kvdt);
    char *back = malloc(lbytes);
    to_host(back, (char *)dkv.k + lbytes, lbytes);
    cr_expect(memcmp(back, (char *)hkv.k + lbytes, lbytes) == 0, "kv_store %s: K differs", moe_dtype_name(kvdt));
    to_host(back, (char *)dkv.v + lbytes, lbytes);
    cr_expect(memcmp(back, (char *)hkv.v + lbytes, lbytes) == 0, "kv_store %s: V differs", moe_dtype_name(kvdt));
    if (kvdt == MOE_DTYPE_F8E4M3) { /* and the rows' scales (MLA: vs == ks) */
        const size_t sb = hkv.layer_rows * sizeof(float);
        float *sback = malloc(sb);
        to_host(sback, dkv.ks + hkv.layer_rows, sb);
        cr_expect(memcmp(sback, hkv.ks + hkv.layer_rows, sb) == 0, "kv_store fp8: K scales differ");
        to_host(sback, dkv.vs + hkv.layer_rows, sb);
        cr_expect(memcmp(sback, hkv.vs + hkv.layer_rows, sb) == 0, "kv_store fp8: V scales differ");
        free(sback);
    }
    /* the query batch */
    int32_t *pos = malloc((size_t)T * sizeof(int32_t)), *seq_of = malloc((size_t)T * sizeof(int32_t));
    int32_t *seq_start = malloc(((size_t)n_seqs + 1) * sizeof(int32_t));
    int32_t *ctxv = malloc((size_t)n_seqs * sizeof(int32_t));
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        seq_start[s] = t;
        ctxv[s] = ctx[s];
        int n = rows[s] < ctx[s] ? rows[s] : ctx[s];
        for (int i = 0; i < n; i++, t++) {
            pos[t] = ctx[s] - n + i;
            seq_of[t] = s;
        }
    }
    seq_start[n_seqs] = T;
    struct moe_batch hb = {.n_tokens = T, .n_seqs = n_seqs, .positions = pos, .seq_of = seq_of,
                           .seq_start = seq_start, .ctx_len = ctxv, .block_table = table,
                           .max_blocks = max_blocks};
    struct moe_batch db = hb;
    db.positions = dev_copy(pos, (size_t)T * sizeof(int32_t));
    db.seq_of = dev_copy(seq_of, (size_t)T * sizeof(int32_t));
    db.seq_start = dev_copy(seq_start, ((size_t)n_seqs + 1) * sizeof(int32_t));
    db.ctx_len = dev_copy(ctxv, (size_t)n_seqs * sizeof(int32_t));
    db.block_table = dev_copy(table, (size_t)n_seqs * max_blocks * sizeof(int32_t));
    struct moe_attn_params p = {layer, Hq, Hkv, Dh, 1.0f / sqrtf((float)Dh), window,
                                hint ? max_ctx : 0, NULL, 0, 0, 0.0f, NULL, 0};
    const size_t nq = (size_t)T * Hq * Dh;
    float *q = rand_floats(nq, 73, -2, 2), *ref = malloc(nq * sizeof(float)), *got = malloc(nq * sizeof(float));
    float *sc = malloc(moe_attention_scratch_floats(Hq, Hkv, Dh) * omp_get_max_threads() * sizeof(float));
    float *hsinks = sinks ? rand_floats((size_t)Hq, 74, -1, 3) : NULL;
    p.sinks = hsinks;
    moe_attention_paged_cpu(ref, q, &hkv, &hb, &p, sc);
    float *dq = dev_copy(q, nq * sizeof(float)), *dout = dev_poisoned(nq * sizeof(float));
    struct moe_attn_params pd = p;
    pd.sinks = sinks ? dev_copy(hsinks, (size_t)Hq * sizeof(float)) : NULL;
    cr_assert_eq(gpu.ops->attention(&gpu, dout, dq, &dkv, &db, &pd), MOE_OK, "%s", moe_last_error());
    to_host(got, dout, nq * sizeof(float));
    char shp[96];
    snprintf(shp, sizeof shp, "Hq%d Hkv%d Dh%d ctx%d%s T%d S%d%s%s", Hq, Hkv, Dh, max_ctx,
             window ? " win" : "", T, n_seqs, hint ? "" : " nohint", sinks ? " sinks" : "");
    /* the tensor-core kernel (MOERUN_CUDA_PREFILL_ATTN=mma) where it applies:
     * Q and P rounded to the cache's half type, so that type's tolerance */
    const bool mma = !mla && mma_backend && T > TILED_ABOVE_ROWS &&
                     (kvdt == MOE_DTYPE_BF16 || kvdt == MOE_DTYPE_F16) && (Dh == 64 || Dh == 128);
    const char *op = mla ? (T <= TILED_ABOVE_ROWS ? "mla_decode" : "mla_prefill")
                     : T <= TILED_ABOVE_ROWS ? "attention"
                     : rows_backend          ? "prefill_rows"
                     : mma                   ? "prefill_mma"
                                             : "prefill_tiled";
    double e = report(op, moe_dtype_name(kvdt), shp, got, ref, nq);
    const double tol = !mma ? 1e-4 : kvdt == MOE_DTYPE_BF16 ? 3e-2 : 5e-3;
    cr_expect(e <= tol, "%s %s %s: %.3g", op, moe_dtype_name(kvdt), shp, e);
    void *dbufs[] = {dk, dv, dslots, (void *)db.positions, (void *)db.seq_of, (void *)db.seq_start,
                     (void *)db.ctx_len, (void *)db.block_table, dq, dout, (void *)pd.sinks};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) gpu.ops->dealloc(&gpu, dbufs[i]);
    moe_kvcache_free(&hkv);
    moe_kvcache_free(&dkv);
    free(table), free(k), free(v), free(slots), free(back), free(pos), free(seq_of);
    free(seq_start), free(ctxv), free(q), free(ref), free(got), free(sc), free(hsinks);
}

static void check_attention_rows(enum moe_dtype kvdt, int Hq, int Hkv, int Dh, int window,
                                 const int *ctx, const int *rows, int n_seqs, bool hint)
{
    check_attention_full(kvdt, Hq, Hkv, Dh, window, ctx, rows, n_seqs, hint, false, false);
}

/* The same number of query rows for every sequence. */
static void check_attention(enum moe_dtype kvdt, int Hq, int Hkv, int Dh, int window,
                            const int *ctx, int n_seqs, int rows_per_seq, bool hint)
{
    int rows[n_seqs];
    for (int s = 0; s < n_seqs; s++) rows[s] = rows_per_seq;
    check_attention_rows(kvdt, Hq, Hkv, Dh, window, ctx, rows, n_seqs, hint);
}

Test(cuda_ops, attention_decode_matches_cpu)
{
    const enum moe_dtype kvdts[] = {MOE_DTYPE_F32, MOE_DTYPE_F16, MOE_DTYPE_BF16, MOE_DTYPE_F8E4M3};
    const int ctx[] = {1, 17, 600, 1000, 257};
    for (size_t i = 0; i < 4; i++) {
        check_attention(kvdts[i], 4, 2, 16, 0, ctx, 5, 1, true);
        check_attention(kvdts[i], 32, 8, 128, 0, ctx, 5, 1, true);
        check_attention(kvdts[i], 16, 1, 64, 0, ctx, 5, 1, false);
        check_attention(kvdts[i], 8, 8, 128, 100, ctx, 5, 1, true);
    }
}

Test(cuda_ops, attention_prefill_matches_cpu)
{
    const enum moe_dtype kvdts[] = {MOE_DTYPE_F32, MOE_DTYPE_BF16, MOE_DTYPE_F8E4M3};
    const int ctx[] = {70, 300};
    for (size_t i = 0; i < 3; i++) {
        check_attention(kvdts[i], 4, 2, 16, 0, ctx, 2, 70, true);
        check_attention(kvdts[i], 32, 8, 128, 0, ctx, 2, 64, true);
        check_attention(kvdts[i], 16, 4, 256, 33, ctx, 2, 50, true);
    }
}

/* A mixed step of 467 rows: a first chunk from position 0, later chunks
 * after cached context (positions not starting at 0, chunk lengths that
 * are not multiples of a tile), and decode rows between them. */
static const int mixed_ctx[] = {250, 41, 77, 1000, 40, 129};
static const int mixed_rows[] = {250, 1, 20, 130, 1, 65};
#define MIXED_SEQS 6

static const enum moe_dtype kv_dtypes[] = {MOE_DTYPE_F32, MOE_DTYPE_F16, MOE_DTYPE_BF16, MOE_DTYPE_F8E4M3};
#define N_KV_DTYPES (sizeof kv_dtypes / sizeof kv_dtypes[0])

/* The tiled prefill kernel over group sizes G = 1, 3, 4, 8, 12, 16, 40 (G > 8
 * in passes of at most 8 heads), head dims 16 to 256 (some not multiples of
 * 32 or 8), sliding windows wider and narrower than a tile, every KV dtype. */
Test(cuda_ops, attention_prefill_tiled_mixed_batch_matches_cpu)
{
    for (size_t i = 0; i < N_KV_DTYPES; i++) {
        const enum moe_dtype dt = kv_dtypes[i];
        check_attention_rows(dt, 8, 8, 64, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true);
        check_attention_rows(dt, 32, 8, 128, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true);
        check_attention_rows(dt, 16, 2, 256, 100, mixed_ctx, mixed_rows, MIXED_SEQS, true);
        check_attention_rows(dt, 32, 2, 16, 0, mixed_ctx, mixed_rows, MIXED_SEQS, false);
        check_attention_rows(dt, 24, 2, 80, 7, mixed_ctx, mixed_rows, MIXED_SEQS, true);
        check_attention_rows(dt, 3, 1, 20, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true);
        check_attention_rows(dt, 40, 1, 32, 33, mixed_ctx, mixed_rows, MIXED_SEQS, true);
    }
}

/* One sequence: a later chunk after 500 cached tokens, the smallest tiled
 * step (65 rows), and a whole prompt with G = 8 at Dh = 128. */
Test(cuda_ops, attention_prefill_tiled_single_sequence_matches_cpu)
{
    const int ctx_a[] = {700}, rows_a[] = {200};
    const int ctx_b[] = {65}, rows_b[] = {65};
    const int ctx_c[] = {333}, rows_c[] = {333};
    for (size_t i = 0; i < N_KV_DTYPES; i++) {
        const enum moe_dtype dt = kv_dtypes[i];
        check_attention_rows(dt, 32, 8, 128, 0, ctx_a, rows_a, 1, true);
        check_attention_rows(dt, 32, 8, 128, 256, ctx_a, rows_a, 1, true);
        check_attention_rows(dt, 8, 8, 64, 0, ctx_b, rows_b, 1, true);
        check_attention_rows(dt, 64, 8, 128, 0, ctx_c, rows_c, 1, true);
    }
}

/* MOERUN_CUDA_PREFILL_ATTN=rows: prefill steps take the per-row kernel.
 * The variable is set in the forked test process before the backend
 * opens (tu_backend_init maps it onto the backend's options, as the CLI
 * does). */
static void setup_rows(void)
{
    setenv("MOERUN_CUDA_PREFILL_ATTN", "rows", 1);
    rows_backend = true;
    setup();
}

TestSuite(cuda_prefill_rows, .init = setup_rows, .fini = teardown);

Test(cuda_prefill_rows, per_row_kernel_matches_cpu)
{
    check_attention_rows(MOE_DTYPE_F16, 32, 8, 128, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true);
    check_attention_rows(MOE_DTYPE_BF16, 16, 2, 256, 100, mixed_ctx, mixed_rows, MIXED_SEQS, true);
    check_attention_rows(MOE_DTYPE_F32, 3, 1, 20, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true);
    check_attention_rows(MOE_DTYPE_F8E4M3, 24, 2, 80, 7, mixed_ctx, mixed_rows, MIXED_SEQS, true);
}

/* MOERUN_CUDA_PREFILL_ATTN=mma: prefill steps of bf16/f16 caches with head
 * dim 64 or 128 take the tensor-core kernel (attention_mma_cuda.cu); the
 * rest (fp32 caches, other head dims) the tiled SIMT kernel still. */
static void setup_mma(void)
{
    setenv("MOERUN_CUDA_PREFILL_ATTN", "mma", 1);
    mma_backend = true;
    setup();
}

TestSuite(cuda_prefill_mma, .init = setup_mma, .fini = teardown);

Test(cuda_prefill_mma, tensor_core_kernel_matches_cpu)
{
    const enum moe_dtype half[] = {MOE_DTYPE_BF16, MOE_DTYPE_F16};
    const int ctx_a[] = {700}, rows_a[] = {200}, ctx_b[] = {65}, rows_b[] = {65};
    for (size_t i = 0; i < 2; i++) {
        const enum moe_dtype dt = half[i];
        /* G = 1, 4, 8, 12 (two passes); windows wider and narrower than a tile */
        check_attention_rows(dt, 8, 8, 64, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true);
        check_attention_rows(dt, 32, 8, 128, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true);
        check_attention_rows(dt, 64, 8, 64, 128, mixed_ctx, mixed_rows, MIXED_SEQS, true);
        check_attention_rows(dt, 24, 2, 128, 33, mixed_ctx, mixed_rows, MIXED_SEQS, false);
        check_attention_rows(dt, 32, 8, 128, 0, ctx_a, rows_a, 1, true); /* after 500 cached */
        check_attention_rows(dt, 8, 8, 64, 0, ctx_b, rows_b, 1, true);  /* the smallest step */
        /* gpt-oss's shape with sinks */
        check_attention_full(dt, 64, 8, 64, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true, true, false);
    }
    /* not taken: an fp32 or fp8 cache, a head dim of 80 (the tiled kernel, 1e-4) */
    check_attention_rows(MOE_DTYPE_F32, 32, 8, 128, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true);
    check_attention_rows(MOE_DTYPE_F8E4M3, 32, 8, 128, 0, mixed_ctx, mixed_rows, MIXED_SEQS, true);
    check_attention_rows(MOE_DTYPE_BF16, 24, 2, 80, 7, mixed_ctx, mixed_rows, MIXED_SEQS, true);
}

/* The tensor-core kernel at small shapes, quick enough for the host
 * emulation's CI selection (tools/cuda-emu/ci-tests.txt): the smallest
 * prefill step (G = 1), a later chunk and a decode row in one step with a
 * window (G = 4, Dh 128, f16), and gpt-oss's sinks (G = 8). */
Test(cuda_prefill_mma, tensor_core_kernel_small_shapes_match_cpu)
{
    const int ctx_b[] = {65}, rows_b[] = {65}, pctx[] = {90, 30}, prow[] = {70, 1};
    check_attention_rows(MOE_DTYPE_BF16, 8, 8, 64, 0, ctx_b, rows_b, 1, true);
    check_attention_rows(MOE_DTYPE_F16, 8, 2, 128, 33, pctx, prow, 2, true);
    check_attention_full(MOE_DTYPE_BF16, 16, 2, 64, 0, pctx, prow, 2, true, true, false);
}

/* gpt-oss's attention sinks on every kernel: decode with and without key
 * splits, sliding window, and prefill (tiled and per row). */
Test(cuda_ops, attention_sinks_match_cpu)
{
    const int ctx[] = {1, 17, 600, 1000, 257};
    const int one[] = {1, 1, 1, 1, 1}, many[] = {1, 17, 300, 64, 257};
    for (int hint = 0; hint < 2; hint++) {
        check_attention_full(MOE_DTYPE_BF16, 64, 8, 64, 0, ctx, one, 5, hint, true, false);
        check_attention_full(MOE_DTYPE_F32, 8, 2, 64, 128, ctx, one, 5, hint, true, false);
    }
    check_attention_full(MOE_DTYPE_BF16, 64, 8, 64, 0, ctx, many, 5, true, true, false);
    check_attention_full(MOE_DTYPE_F32, 8, 2, 64, 128, ctx, many, 5, true, true, false);
}

/* The fp8 store of special rows: zeros, a NaN, infinities, fp32
 * subnormals (a scale that underflows to 0), 3e38, ties of E4M3: bytes
 * and scales bit for bit the CPU's (moe_kvcache_fp8_quantize_row). */
Test(cuda_ops, kv_store_fp8_special_rows_match_cpu)
{
    enum { T = 6, Hkv = 2, Dh = 40, B = 4, NB = 4, ROW = Hkv * Dh };
    struct moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.n_layers = 1, cfg.n_kv_heads = Hkv, cfg.head_dim = Dh;
    float *k = rand_floats((size_t)T * ROW, 81, -3, 3), *v = rand_floats((size_t)T * ROW, 82, -1, 1);
    for (int i = 0; i < Dh; i++) {
        k[i] = 0.0f;                                  /* token 0, head 0: zeros */
        k[2 * ROW + i] = 1e-44f;                      /* token 2, head 0: the scale underflows */
        v[3 * ROW + Dh + i] = (float)(i % 16) * 28.0f; /* token 3, head 1: exact E4M3 values and ties */
    }
    k[Dh + 5] = NAN, k[ROW + 3] = INFINITY, k[ROW + 4] = -INFINITY, v[4 * ROW + 7] = 3e38f;
    int32_t slots[T] = {9, 2, 14, 0, 7, 11};
    struct moe_kvcache hkv, dkv;
    cr_assert_eq(moe_kvcache_init(&hkv, moe_backend_allocator(&cpu), &cfg, NB, B, MOE_DTYPE_F8E4M3, false), MOE_OK);
    cr_assert_eq(moe_kvcache_init(&dkv, moe_backend_allocator(&gpu), &cfg, NB, B, MOE_DTYPE_F8E4M3, false), MOE_OK);
    cr_assert_eq(cpu.ops->kv_store(&cpu, &hkv, 0, k, v, slots, T), MOE_OK);
    float *dk = dev_copy(k, sizeof(float) * T * ROW), *dv = dev_copy(v, sizeof(float) * T * ROW);
    int32_t *ds = dev_copy(slots, sizeof slots);
    cr_assert_eq(gpu.ops->kv_store(&gpu, &dkv, 0, dk, dv, ds, T), MOE_OK, "%s", moe_last_error());
    const size_t nb = hkv.layer_elems, ns = hkv.layer_rows * sizeof(float);
    uint8_t *back = malloc(nb);
    float *sback = malloc(ns);
    for (int w = 0; w < 2; w++) {
        const uint8_t *hq = (const uint8_t *)(w ? hkv.v : hkv.k);
        const float *hs = w ? hkv.vs : hkv.ks;
        to_host(back, w ? dkv.v : dkv.k, nb);
        to_host(sback, w ? dkv.vs : dkv.ks, ns);
        for (int t = 0; t < T; t++) /* only the written slots: the rest is unset memory */
            for (int h = 0; h < Hkv; h++) {
                const size_t r = moe_kv_row((size_t)slots[t], B, Hkv, (size_t)h);
                cr_expect(memcmp(back + r * Dh, hq + r * Dh, Dh) == 0, "%s token %d head %d: bytes differ",
                          w ? "V" : "K", t, h);
                cr_expect(memcmp(&sback[r], &hs[r], 4) == 0, "%s token %d head %d: scale %g, CPU %g",
                          w ? "V" : "K", t, h, (double)sback[r], (double)hs[r]);
            }
    }
    cr_expect_eq(hkv.ks[moe_kv_row((size_t)slots[0], B, Hkv, 0)], 0.0f);
    cr_expect_eq(((const uint8_t *)hkv.k)[moe_kv_row((size_t)slots[0], B, Hkv, 1) * Dh + 5] & 0x7f, 0x7f,
                 "NaN stays NaN");
    void *dbufs[] = {dk, dv, ds};
    for (size_t i = 0; i < 3; i++) gpu.ops->dealloc(&gpu, dbufs[i]);
    moe_kvcache_free(&hkv);
    moe_kvcache_free(&dkv);
    free(k), free(v), free(back), free(sback);
}

/* ---- MLA: one row per token, read as K and V (attention_mla_cuda.cu) ---- */

/* The backend reserved for an MLA model (DeepSeek-V3's attention: 128
 * heads over rows of 64 + 512), so the split workspace is the MLA
 * kernel's (what a DeepSeek model gets). */
static void reserve_mla(void)
{
    struct moe_config c;
    reserve_cfg(&c);
    c.n_heads = 128, c.head_dim = 576, c.kv_lora_rank = 512, c.rope_dim = 64;
    c.qk_nope_dim = 128, c.v_head_dim = 128, c.q_lora_rank = 1536;
    cr_assert_eq(gpu.ops->reserve(&gpu, &c, 512), MOE_OK, "%s", moe_last_error());
}

static void check_mla(enum moe_dtype kvdt, int Hq, int Dh, const int *ctx, const int *rows,
                      int n_seqs, bool hint)
{
    check_attention_full(kvdt, Hq, 1, Dh, 0, ctx, rows, n_seqs, hint, false, true);
}

/* Decode-sized steps at DeepSeek-V2-Lite's 16 heads and V3's 128 (4 passes
 * of 32) over rows of 576, every KV dtype: key splits from the max_ctx
 * hint, from the block table's capacity (as while a graph is recorded),
 * none (contexts of at most 128 keys), and a small step of several rows
 * per sequence (tiles of 2 tokens x 16 heads); then the fixtures' shapes. */
Test(cuda_ops, attention_mla_decode_matches_cpu)
{
    reserve_mla();
    const int ctx[] = {1, 17, 600, 1000, 257}, one[] = {1, 1, 1, 1, 1};
    const int shortc[] = {1, 17, 100, 128}, few[] = {1, 3, 1, 2};
    const int chunk[] = {300, 40}, chunk_rows[] = {33, 31};
    for (size_t i = 0; i < N_KV_DTYPES; i++) {
        const enum moe_dtype dt = kv_dtypes[i];
        for (int G = 16; G <= 128; G *= 8) {
            check_mla(dt, G, 576, ctx, one, 5, true);
            check_mla(dt, G, 576, ctx, one, 5, false);
            check_mla(dt, G, 576, shortc, few, 4, true);
        }
        check_mla(dt, 16, 576, chunk, chunk_rows, 2, true);
    }
    check_mla(MOE_DTYPE_F32, 4, 40, ctx, one, 5, true);  /* deepseek_v2/v3 fixtures */
    check_mla(MOE_DTYPE_F32, 4, 160, ctx, one, 5, true); /* deepseek_v3_fp8 */
    check_mla(MOE_DTYPE_BF16, 40, 512, ctx, one, 5, true); /* 2 passes of 20 heads */
}

/* Prefill-sized steps (no key splits): a whole prompt from position 0, a
 * later chunk after 500 cached tokens, and the mixed batch (chunks after
 * cached context, decode rows between them) at 16 heads. */
Test(cuda_ops, attention_mla_prefill_matches_cpu)
{
    reserve_mla();
    const int ctx_a[] = {200}, rows_a[] = {200};
    const int ctx_b[] = {700}, rows_b[] = {150};
    for (size_t i = 0; i < N_KV_DTYPES; i++) {
        const enum moe_dtype dt = kv_dtypes[i];
        check_mla(dt, 16, 576, ctx_a, rows_a, 1, true);
        check_mla(dt, 16, 576, ctx_b, rows_b, 1, true);
        check_mla(dt, 16, 576, mixed_ctx, mixed_rows, MIXED_SEQS, true);
    }
    check_mla(MOE_DTYPE_BF16, 128, 576, ctx_a, rows_a, 1, true);
    check_mla(MOE_DTYPE_BF16, 128, 576, ctx_b, rows_b, 1, true);
    check_mla(MOE_DTYPE_F32, 4, 40, mixed_ctx, mixed_rows, MIXED_SEQS, true);
}

/* The fp8 cache on every kernel at small shapes (the suites above run it
 * at full size too; this one is quick enough for the host emulation,
 * tools/cuda-emu): decode with key splits and without, the tiled prefill
 * over a mixed step with a window, and MLA decode and prefill. */
Test(cuda_ops, attention_fp8_small_shapes_match_cpu)
{
    reserve_mla();
    const enum moe_dtype f8 = MOE_DTYPE_F8E4M3;
    const int ctx[] = {1, 17, 600}, one[] = {1, 1, 1};
    check_attention(f8, 4, 2, 16, 0, ctx, 3, 1, true);
    check_attention(f8, 6, 2, 40, 0, ctx, 3, 1, false);
    const int pctx[] = {90, 30}, prow[] = {70, 1};
    check_attention_rows(f8, 6, 2, 40, 7, pctx, prow, 2, true);
    check_mla(f8, 4, 40, ctx, one, 3, true);
    check_mla(f8, 4, 40, pctx, prow, 2, true);
}
