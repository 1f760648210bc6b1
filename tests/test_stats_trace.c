/* test_stats_trace.c - .npy files: headers valid per numpy's format (magic,
 * version, 64-byte aligned data, dict text), arrays round-trip for every
 * dtype moerun writes, malformed files are refused, and a recorder's trace
 * written with moe_stats_write_trace reads back identically through
 * `moerun stats`'s loader, whose aggregate equals the recorder's counters. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "router/router.h"
#include "router/stats.h"
#include "runtime/stats/stats_analyze.h"
#include "tests/testutil.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/moerun-npy-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(npy, .init = setup, .fini = teardown);

static size_t slurp(const char *path, unsigned char *buf, size_t n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    return got;
}

Test(npy, header_is_valid_npy_1_0)
{
    char path[128];
    snprintf(path, sizeof path, "%s/a.npy", dir);
    int16_t v[2 * 3 * 2] = {0, 1, 2, 3, 4, 5, -6, 7, 8, 9, 10, 32767};
    int64_t shape[3] = {2, 3, 2};
    cr_assert_eq(moe_npy_write(path, "<i2", 3, shape, v), MOE_OK);
    unsigned char b[256];
    size_t n = slurp(path, b, sizeof b);
    cr_assert_eq(memcmp(b, "\x93NUMPY\x01\x00", 8), 0);
    size_t hlen = b[8] | (size_t)b[9] << 8;
    cr_assert_eq((10 + hlen) % 64, 0, "data starts at a multiple of 64");
    cr_assert_eq(n, 10 + hlen + sizeof v);
    cr_assert_eq(b[10 + hlen - 1], '\n');
    const char *want = "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3, 2), }";
    cr_assert_eq(memcmp(b + 10, want, strlen(want)), 0, "%.*s", (int)hlen, b + 10);
    for (size_t i = 10 + strlen(want); i < 10 + hlen - 1; i++) cr_assert_eq(b[i], ' ');
    cr_assert_eq(memcmp(b + 10 + hlen, v, sizeof v), 0);
    /* a 1-D shape is written as a Python 1-tuple */
    int64_t one[1] = {5};
    float f[5] = {1, 2, 3, 4, 5};
    cr_assert_eq(moe_npy_write(path, "<f4", 1, one, f), MOE_OK);
    slurp(path, b, sizeof b);
    cr_assert(strstr((char *)b + 10, "'shape': (5,), }"));
}

Test(npy, arrays_round_trip)
{
    char path[128];
    snprintf(path, sizeof path, "%s/r.npy", dir);
    const char *descr[] = {"<i2", "<i4", "<i8", "<f4", "<f8", "|u1"};
    const size_t size[] = {2, 4, 8, 4, 8, 1};
    unsigned char data[4 * 5 * 3 * 8];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 37 + 11);
    for (size_t d = 0; d < 6; d++) {
        int64_t shape[3] = {4, 5, 3};
        cr_assert_eq(moe_npy_write(path, descr[d], 3, shape, data), MOE_OK);
        struct moe_npy a;
        cr_assert_eq(moe_npy_read(path, &a), MOE_OK, "%s", moe_last_error());
        cr_assert_str_eq(a.descr, descr[d]);
        cr_assert_eq(a.ndim, 3);
        cr_assert(a.shape[0] == 4 && a.shape[1] == 5 && a.shape[2] == 3);
        cr_assert_eq(a.elem, size[d]);
        cr_assert_eq(memcmp(a.data, data, 60 * size[d]), 0);
        moe_npy_free(&a);
    }
    int64_t empty[2] = {0, 4};
    cr_assert_eq(moe_npy_write(path, "<i8", 2, empty, NULL), MOE_OK);
    struct moe_npy a;
    cr_assert_eq(moe_npy_read(path, &a), MOE_OK);
    cr_assert(a.n == 0 && a.shape[0] == 0 && a.shape[1] == 4);
    moe_npy_free(&a);
}

static void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

Test(npy, malformed_files_are_refused)
{
    char path[128];
    snprintf(path, sizeof path, "%s/bad.npy", dir);
    struct moe_npy a;
    write_bytes(path, "NOTNUMPY", 8);
    cr_assert_eq(moe_npy_read(path, &a), MOE_ERR_FORMAT);
    int32_t v[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {2, 3};
    cr_assert_eq(moe_npy_write(path, "<i4", 2, shape, v), MOE_OK);
    unsigned char b[256];
    size_t n = slurp(path, b, sizeof b);
    write_bytes(path, b, n - 4); /* truncated data */
    cr_assert_eq(moe_npy_read(path, &a), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "truncated"), "%s", moe_last_error());
    char *fo = strstr((char *)b + 10, "False");
    memcpy(fo, "True ", 5);
    write_bytes(path, b, n);
    cr_assert_eq(moe_npy_read(path, &a), MOE_ERR_UNSUPPORTED);
    memcpy(fo, "False", 5);
    memcpy(strstr((char *)b + 10, "<i4"), ">i4", 3);
    write_bytes(path, b, n);
    cr_assert_eq(moe_npy_read(path, &a), MOE_ERR_UNSUPPORTED);
    cr_assert(a.data == NULL);
}

/* A 128-byte file whose header declares shape (1099511627776,) is refused
 * before anything is allocated: the declared size is checked against the
 * file first, or the reader would allocate 2 TiB for data that is not
 * there (an input found by tests/fuzz/fuzz_stats; docs/fuzzing.md). */
Test(npy, declared_shape_must_match_the_file_size)
{
    char path[128];
    snprintf(path, sizeof path, "%s/huge.npy", dir);
    char h[128];
    memcpy(h, "\x93NUMPY\x01\x00\x76\x00", 10); /* version 1.0, 118 header bytes */
    int len = snprintf(h + 10, sizeof h - 10, "{'descr': '<i2', 'fortran_order': False, "
                       "'shape': (1099511627776,), }") + 10;
    memset(h + len, ' ', (size_t)(127 - len));
    h[127] = '\n';
    write_bytes(path, h, 128);
    struct moe_npy a;
    cr_assert_eq(moe_npy_read(path, &a), MOE_ERR_FORMAT, "%s", moe_last_error());
    cr_assert(strstr(moe_last_error(), "needs 2199023255552 bytes of data, but the file holds 0"), "%s",
              moe_last_error());
    cr_assert(a.data == NULL);
    /* the same header with more data than the shape covers */
    memcpy(strstr(h + 10, "1099511627776,"), "1,            ", 14); /* h + 10: after the NULs */
    char big[140];
    memcpy(big, h, 128);
    memset(big + 128, 0, 12);
    write_bytes(path, big, sizeof big);
    cr_assert_eq(moe_npy_read(path, &a), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "oversized .npy file"), "%s", moe_last_error());
}

Test(npy, recorder_trace_round_trips_through_the_stats_loader)
{
    struct moe_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 3;
    c.n_experts = 6;
    c.top_k = 3;
    c.layer_moe[0] = c.layer_moe[2] = true;
    struct moe_stats st;
    struct moe_stats_opts o = {.trace = true};
    cr_assert_eq(moe_stats_init(&st, &c, &o), MOE_OK);
    int32_t seq_of[8] = {0}, pos[8], start[2] = {0, 0}, ids[8 * 3];
    float w[8 * 3], logits[8 * 6];
    uint8_t dec[1] = {0};
    for (int step = 0; step < 4; step++) {
        int T = step == 0 ? 8 : 1;
        for (int t = 0; t < T; t++) pos[t] = step == 0 ? t : 7 + step;
        start[1] = T;
        dec[0] = step > 0;
        struct moe_batch b = {.n_tokens = T, .n_seqs = 1, .positions = pos, .seq_of = seq_of,
                              .seq_start = start, .decode = dec};
        cr_assert_eq(moe_stats_step_begin(&st, &b), MOE_OK);
        for (int l = 0; l < 3; l += 2) {
            tu_fill_uniform(logits, (size_t)T * 6, 100 + (uint64_t)(step * 3 + l), -2, 2);
            moe_router_topk_cpu(ids, w, logits, T, 6, 3, false);
            moe_stats_record_layer(&st, l, T, ids, w, logits);
        }
    }
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s/tr", dir);
    struct moe_stats_meta meta = {.d_model = 32, .d_expert = 16, .weight_bytes = 2};
    cr_assert_eq(moe_stats_write_trace(&st, &meta, prefix), MOE_OK, "%s", moe_last_error());
    struct moe_sdata d;
    cr_assert_eq(moe_sdata_load(&d, prefix), MOE_OK, "%s", moe_last_error());
    cr_assert(d.from_trace);
    cr_assert_eq(d.N, 11);
    cr_assert_eq(d.steps, 4);
    cr_assert(d.Lm == 2 && d.E == 6 && d.K == 3 && d.layers[1] == 2);
    cr_assert_eq(memcmp(d.ids, st.tr.ids, 11 * 2 * 3 * sizeof(int32_t)), 0);
    cr_assert_eq(memcmp(d.w, st.tr.w, 11 * 2 * 3 * sizeof(float)), 0);
    cr_assert_eq(memcmp(d.meta, st.tr.meta, 11 * 4 * sizeof(int64_t)), 0);
    for (int j = 0; j < 2; j++)
        for (int e = 0; e < 6; e++) {
            cr_assert_eq(d.load[j * 6 + e], (double)(st.prefill[j * 6 + e] + st.decode[j * 6 + e]));
            cr_assert_eq(d.top1[j * 6 + e], (double)st.top1[j * 6 + e]);
            for (int f = e + 1; f < 6; f++)
                cr_assert_eq(d.coact[(j * 6 + e) * 6 + f], (double)st.coact[(j * 6 + e) * 6 + f]);
        }
    moe_sdata_free(&d);
    /* the ids file is int16 of shape (N, Lm, K) */
    char path[160];
    snprintf(path, sizeof path, "%s.ids.npy", prefix);
    struct moe_npy a;
    cr_assert_eq(moe_npy_read(path, &a), MOE_OK);
    cr_assert_str_eq(a.descr, "<i2");
    cr_assert(a.ndim == 3 && a.shape[0] == 11 && a.shape[1] == 2 && a.shape[2] == 3);
    moe_npy_free(&a);
    /* and the statistics JSON loads into the same counters */
    snprintf(path, sizeof path, "%s/s.json", dir);
    cr_assert_eq(moe_stats_write_json(&st, &meta, path), MOE_OK);
    cr_assert_eq(moe_sdata_load(&d, path), MOE_OK, "%s", moe_last_error());
    cr_assert(!d.from_trace && d.tokens == 11 && d.steps == 4);
    for (int i = 0; i < 12; i++) cr_assert_eq(d.load[i], (double)(st.prefill[i] + st.decode[i]));
    moe_sdata_free(&d);
    moe_stats_free(&st);
}

/* Found by tests/fuzz/fuzz_stats: a 90-byte statistics file declaring 65536
 * experts made moe_sdata_load allocate the dense (Lm, E, E) co-activation
 * table, 32 GiB, before reading a single count; and a count that does not
 * fit an int ("experts": 2^32 + 4) was truncated to 4 without a word. */
TestSuite(sdata, .init = setup, .fini = teardown);

Test(sdata, declared_sizes_are_checked_before_allocating)
{
    char path[160];
    snprintf(path, sizeof path, "%s/s.json", dir);
    static const char *huge = "{\"format\":\"moerun-expert-stats\",\"version\":1,"
                              "\"model\":{\"experts\":65536,\"top_k\":2},\"layers\":[{}]}";
    write_bytes(path, huge, strlen(huge));
    struct moe_sdata d;
    cr_assert_eq(moe_sdata_load(&d, path), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "1 MoE layers x 65536 experts need a co-activation table of "
                                       "4294967296 entries; at most 134217728"), "%s", moe_last_error());
    static const char *wrapped = "{\"format\":\"moerun-expert-stats\",\"version\":1,"
                                 "\"model\":{\"experts\":4294967300,\"top_k\":2},\"layers\":[{}]}";
    write_bytes(path, wrapped, strlen(wrapped));
    cr_assert_eq(moe_sdata_load(&d, path), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "'model.experts' must be an integer in [0, 65536]"), "%s",
              moe_last_error());
    static const char *trace = "{\"format\":\"moerun-routing-trace\",\"version\":1,\"experts\":8,"
                               "\"top_k\":\"2\",\"moe_layers\":[0]}";
    write_bytes(path, trace, strlen(trace));
    cr_assert_eq(moe_sdata_load(&d, path), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "'top_k' must be an integer"), "%s", moe_last_error());
}
