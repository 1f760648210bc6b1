/* cli_common.c - see cli_common.h. */
#include "runtime/cli_common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "runtime/synth_skew.h"

bool moe_cli_parse_dtype(const char *s, enum moe_dtype *out)
{
    if (!strcasecmp(s, "f32") || !strcasecmp(s, "fp32") || !strcasecmp(s, "float32")) *out = MOE_DTYPE_F32;
    else if (!strcasecmp(s, "f16") || !strcasecmp(s, "fp16") || !strcasecmp(s, "float16")) *out = MOE_DTYPE_F16;
    else if (!strcasecmp(s, "bf16") || !strcasecmp(s, "bfloat16")) *out = MOE_DTYPE_BF16;
    else return false;
    return true;
}

enum moe_status moe_cli_open_model(struct moe_model *m, const struct moe_cli_model_opts *o)
{
    if (o->synthetic) {
        if (o->path)
            return moe_fail(MOE_ERR_INVALID_ARG, "give either a model folder or --synthetic, not both");
        enum moe_dtype dt = MOE_DTYPE_BF16;
        if (o->dtype && !moe_cli_parse_dtype(o->dtype, &dt))
            return moe_fail(MOE_ERR_INVALID_ARG, "--dtype '%s' (use f32, f16 or bf16)", o->dtype);
        struct moe_config cfg;
        MOE_TRY(moe_config_load(&cfg, o->synthetic));
        if (o->router_skew) {
            struct moe_router_skew sk;
            MOE_TRY(moe_router_skew_parse(o->router_skew, &sk));
            return moe_model_synthetic_skew(m, &cfg, dt, o->seed, &sk);
        }
        return moe_model_synthetic(m, &cfg, dt, o->seed);
    }
    if (o->router_skew)
        return moe_fail(MOE_ERR_INVALID_ARG, "--router-skew applies to --synthetic models "
                        "(moerun synth --router-skew writes a skewed checkpoint)");
    if (!o->path) return moe_fail(MOE_ERR_INVALID_ARG, "no model given (a folder, or --synthetic CONFIG.json)");
    return moe_model_load(m, o->path);
}

bool moe_cli_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

enum moe_status moe_cli_parse_ids(const char *s, int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return moe_fail(MOE_ERR_NOMEM, "id list");
    int k = 0;
    const char *p = s;
    while (1) {
        char *end;
        errno = 0;
        while (*p == ' ') p++;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX) {
            free(v);
            return moe_fail(MOE_ERR_INVALID_ARG, "token id list: item %d is not a token id (at '%.20s')",
                            k + 1, p);
        }
        v[k++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p != ',') {
            free(v);
            return moe_fail(MOE_ERR_INVALID_ARG, "token id list: unexpected '%c' after item %d", *p, k);
        }
        p++;
    }
    *ids = v;
    *n = k;
    return MOE_OK;
}

const char *moe_cli_bytes(char *buf, size_t n, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

const char *moe_cli_count(char *buf, size_t n, double x)
{
    const char *u[] = {"", "K", "M", "B", "T"};
    int i = 0;
    while (x >= 1000 && i < 4) {
        x /= 1000;
        i++;
    }
    snprintf(buf, n, i ? "%.2f%s" : "%.0f%s", x, u[i]);
    return buf;
}

int moe_cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moerun %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

double moe_cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
