/* fuzz_stats.c - `moerun stats FILE`: moe_sdata_load on a statistics JSON or
 * a routing trace.  The input holds up to four parts separated by the line
 * "\n--8<--\n": PREFIX.trace.json (or a statistics JSON), PREFIX.ids.npy,
 * PREFIX.weights.npy and PREFIX.tokens.npy, written to a private temporary
 * folder because the loader reads files by path. */
#include <unistd.h>
#include "runtime/stats/stats_analyze.h"
#include "tests/fuzz/fuzz_util.h"

static char dir[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    snprintf(dir, sizeof dir, "/tmp/moerun-fuzz-stats-XXXXXX");
    if (!mkdtemp(dir)) abort();
    return 0;
}

static void put(const char *name, const uint8_t *p, size_t n)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *names[4] = {"t.trace.json", "t.ids.npy", "t.weights.npy", "t.tokens.npy"};
    static const char sep[] = "\n--8<--\n";
    const uint8_t *p = data, *end = data + size;
    for (int i = 0; i < 4; i++) {
        const uint8_t *q = i < 3 ? memmem(p, (size_t)(end - p), sep, sizeof sep - 1) : NULL;
        put(names[i], p, q ? (size_t)(q - p) : (size_t)(end - p));
        p = q ? q + sizeof sep - 1 : end;
    }
    char path[128];
    snprintf(path, sizeof path, "%s/t.trace.json", dir);
    struct moe_sdata d;
    if (moe_sdata_load(&d, path) == MOE_OK) {
        FUZZ_CHECK(d.Lm > 0 && d.E > 0 && d.K > 0 && d.K <= d.E, "Lm %d E %d K %d", d.Lm, d.E, d.K);
        if (d.from_trace && d.N) /* ASan checks the last element is inside */
            FUZZ_CHECK(d.ids[(size_t)d.N * d.Lm * d.K - 1] != INT32_MIN, "ids");
        moe_sdata_free(&d);
    }
    return 0;
}
