/* status.c - thread-local error messages (see status.h). */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOE_ERROR_MAX 1024

static _Thread_local char last_error[MOE_ERROR_MAX];

const char *moe_last_error(void) { return last_error; }

void moe_clear_error(void) { last_error[0] = '\0'; }

const char *moe_status_str(enum moe_status s)
{
    switch (s) {
    case MOE_OK: return "ok";
    case MOE_ERR_IO: return "i/o error";
    case MOE_ERR_FORMAT: return "format error";
    case MOE_ERR_UNSUPPORTED: return "unsupported";
    case MOE_ERR_INVALID_ARG: return "invalid argument";
    case MOE_ERR_NOMEM: return "out of memory";
    case MOE_ERR_DEVICE: return "device error";
    }
    return "unknown status";
}

enum moe_status moe_fail(enum moe_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

void moe_error_prefix(const char *fmt, ...)
{
    char prefix[MOE_ERROR_MAX], old[MOE_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    size_t n = strlen(prefix);
    if (n >= sizeof last_error) n = sizeof last_error - 1;
    memcpy(last_error, prefix, n);
    size_t m = strnlen(old, sizeof old - 1);
    if (m > sizeof last_error - 1 - n) m = sizeof last_error - 1 - n;
    memcpy(last_error + n, old, m);
    last_error[n + m] = '\0';
}

__attribute__((noreturn)) void moe_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "moerun: internal error: assertion '%s' failed at %s:%d\n", expr, file,
            line);
    abort();
}
