/* status.h - error codes and the thread-local last-error message.
 *
 * Every function that can fail returns enum moe_status and sets a message
 * once, where the problem is found, with its context (file, tensor name,
 * expected vs found).  Callers pass the status up unchanged; the CLI prints
 * moe_last_error() and exits non-zero.  Nothing below main() exits or aborts,
 * except MOE_ASSERT on a broken internal contract. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_MUST_USE __attribute__((warn_unused_result))
#define MOE_PRINTF(a, b) __attribute__((format(printf, a, b)))

enum moe_status {
    MOE_OK = 0,
    MOE_ERR_IO,          /* a file could not be opened, read, mapped or written */
    MOE_ERR_FORMAT,      /* a file or a request is malformed */
    MOE_ERR_UNSUPPORTED, /* well-formed, but a feature we do not implement */
    MOE_ERR_INVALID_ARG, /* a caller passed an impossible value */
    MOE_ERR_NOMEM,       /* allocation failed or a size overflowed */
    MOE_ERR_DEVICE,      /* the accelerator or its runtime failed */
};

/* The message of the last error set on this thread ("" if none). Borrowed. */
const char *moe_last_error(void);
/* Name of a status code, e.g. "format error". Static string. */
const char *moe_status_str(enum moe_status s);
/* Sets the thread's message and returns s, so a failure reads
 * `return moe_fail(MOE_ERR_FORMAT, "%s: ...", path);`. */
enum moe_status moe_fail(enum moe_status s, const char *fmt, ...) MOE_PRINTF(2, 3);
/* Prefixes the current message with context ("loading x: " + old). */
void moe_error_prefix(const char *fmt, ...) MOE_PRINTF(1, 2);
void moe_clear_error(void);

/* Internal contract checks: always on, print the location and abort. */
#define MOE_ASSERT(cond)                                                      \
    do {                                                                      \
        if (!(cond)) moe_assert_fail(#cond, __FILE__, __LINE__);              \
    } while (0)
__attribute__((noreturn)) void moe_assert_fail(const char *expr, const char *file, int line);

#define MOE_TRY(expr)                                                         \
    do {                                                                      \
        enum moe_status moe_try_s_ = (expr);                                  \
        if (moe_try_s_ != MOE_OK) return moe_try_s_;                          \
    } while (0)

/* Overflow-checked size arithmetic: return false on overflow. */
static inline int moe_mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline int moe_add_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

#ifdef __cplusplus
}
#endif
