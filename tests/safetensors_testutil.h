/* safetensors_testutil.h - fixtures shared by the safetensors suites: a
 * fresh mkdtemp folder per test (Criterion forks each test, so the static
 * state is per test) and files built from header strings. */
#pragma once

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/model/safetensors.h"

static char tmpdir[64];

static inline void setup(void)
{
    strcpy(tmpdir, "/tmp/moe_st_XXXXXX");
    cr_assert(mkdtemp(tmpdir), "mkdtemp failed");
}

static inline int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static inline void teardown(void)
{
    if (tmpdir[0]) nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- helpers -------------------------------------------------------------- */

/* tmpdir/name, in a static ring so a test can hold a few at once. */
static inline const char *tpath(const char *name)
{
    static char ring[4][256];
    static int k;
    char *p = ring[k++ % 4];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

static inline void write_bytes(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(buf, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* Builds [u64 header_len][header][data_len bytes of 0..255 pattern] in
 * memory; header_len is strlen(header) unless forced_n != -1. */
static inline unsigned char *build(const char *header, size_t data_len, long long forced_n,
                                   size_t *size)
{
    size_t h = strlen(header);
    uint64_t n = forced_n < 0 ? h : (uint64_t)forced_n;
    *size = 8 + h + data_len;
    unsigned char *b = malloc(*size);
    cr_assert(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < data_len; i++) b[8 + h + i] = (unsigned char)i;
    return b;
}

/* Writes a raw safetensors file into tmpdir; returns its path. */
static inline const char *write_raw(const char *name, const char *header, size_t data_len)
{
    size_t size;
    unsigned char *b = build(header, data_len, -1, &size);
    const char *p = tpath(name);
    write_bytes(p, b, size);
    free(b);
    return p;
}

/* Opens path and expects failure s with msg (and the file name) in the
 * message; the set must stay empty. */
static inline void expect_open_fails(const char *path, enum moe_status want, const char *msg)
{
    struct moe_safetensors st = {0};
    enum moe_status s = moe_safetensors_open_file(&st, path);
    cr_assert_eq(s, want, "status %s, want %s (message: %s)", moe_status_str(s),
                 moe_status_str(want), moe_last_error());
    cr_assert(strstr(moe_last_error(), msg), "message \"%s\" lacks \"%s\"", moe_last_error(), msg);
    cr_assert(strstr(moe_last_error(), path), "message \"%s\" lacks the file name",
              moe_last_error());
    cr_assert_eq(st.n_tensors, 0);
    cr_assert_eq(st.n_files, 0);
    moe_safetensors_close(&st);
}

static inline void expect_header_fails(const char *header, size_t data_len, const char *msg)
{
    expect_open_fails(write_raw("bad.safetensors", header, data_len), MOE_ERR_FORMAT, msg);
}

/* One F32 tensor "w" of shape (2, 2): the smallest interesting valid file. */
#define GOOD_HEADER "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"

static inline void write_text(const char *path, const char *text)
{
    write_bytes(path, text, strlen(text));
}
