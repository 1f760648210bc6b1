/* fuzz_util.h - helpers shared by the libFuzzer harnesses (tests/fuzz/).
 *
 * Harnesses never judge an error status: every input is allowed to fail, and
 * the only findings are crashes, sanitizer reports, leaks, hangs and memory
 * blow-ups, plus the few invariants a harness checks with FUZZ_CHECK. */
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A NUL-terminated copy of data[0..n) (new memory; abort on OOM, which is a
 * harness failure rather than a finding). */
static inline char *fuzz_strndup(const uint8_t *data, size_t n)
{
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, data, n);
    s[n] = '\0';
    return s;
}

/* Splits data at the first occurrence of the byte sep: *a gets the part
 * before (na bytes), *b the part after (nb bytes; empty when sep is absent). */
static inline void fuzz_split(const uint8_t *data, size_t n, uint8_t sep, const uint8_t **a,
                              size_t *na, const uint8_t **b, size_t *nb)
{
    const uint8_t *p = memchr(data, sep, n);
    *a = data;
    *na = p ? (size_t)(p - data) : n;
    *b = p ? p + 1 : data + n;
    *nb = p ? n - *na - 1 : 0;
}

/* An invariant the code documents; a violation is a finding. */
#define FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "fuzz invariant failed: %s: ", #cond);              \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* A repository path chosen at compile time (MOERUN_SOURCE_DIR), or the
 * environment variable env when it is set. */
static inline const char *fuzz_repo_path(const char *env, const char *rel)
{
    const char *e = getenv(env);
    if (e && *e) return e;
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", MOERUN_SOURCE_DIR, rel);
    return buf;
}
