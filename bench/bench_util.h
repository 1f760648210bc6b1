/* bench_util.h - what the C benchmarks under bench/ share: clocks, aligned
 * allocation (in huge pages where asked) that exits on failure, and the order
 * of doubles for medians. */
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

/* Seconds on clock c (CLOCK_MONOTONIC: wall; CLOCK_THREAD_CPUTIME_ID: the
 * calling thread's CPU time). */
static inline double bench_clock(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* n bytes (rounded up to a multiple of align) aligned to align; the
 * program exits naming itself when out of memory. */
static inline void *bench_alloc_aligned(const char *prog, size_t align, size_t n)
{
    void *p = aligned_alloc(align, (n + align - 1) / align * align);
    if (!p) {
        fprintf(stderr, "%s: out of memory for %zu bytes\n", prog, n);
        exit(1);
    }
    return p;
}

/* n bytes aligned to 64, or exit naming prog. */
static inline void *bench_alloc(const char *prog, size_t n) { return bench_alloc_aligned(prog, 64, n); }

/* n bytes on 2 MiB boundaries, asked for in huge pages (as the CPU
 * backend's packed weights are), or exit naming prog. */
static inline void *bench_alloc_huge(const char *prog, size_t n)
{
    const size_t huge = (size_t)2 << 20;
    void *p = bench_alloc_aligned(prog, huge, n);
#ifdef MADV_HUGEPAGE
    (void)madvise(p, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
    return p;
}

/* qsort's order of doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Prints the machine's load average (the runs share it). */
static inline void bench_print_load(void)
{
    char line[128] = "?\n";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(line, sizeof line, f)) snprintf(line, sizeof line, "?\n");
        fclose(f);
    }
    printf("load average: %s", line);
}
