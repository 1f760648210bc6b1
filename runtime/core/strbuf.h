/* strbuf.h - appending to a growable, NUL-terminated text buffer held as
 * (pointer, length, capacity), as the streaming text stages keep theirs
 * (reasoning.c, toolcall.c, the server's and the CLI's replies).  The chat
 * template's jbuf (jinja.h) has a size limit and its own messages. */
#pragma once

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core/status.h"

/* Appends k bytes of s to *p (length *n, capacity *cap; all zero at first)
 * and keeps it NUL-terminated.  false, the buffer unchanged, when memory
 * or the size runs out. */
static inline bool moe_buf_append(char **p, size_t *n, size_t *cap, const char *s, size_t k)
{
    size_t need;
    if (!moe_add_size(*n, k, &need) || !moe_add_size(need, 1, &need)) return false;
    if (need > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < need) c = c > SIZE_MAX / 2 ? need : 2 * c;
        char *q = realloc(*p, c);
        if (!q) return false;
        *p = q;
        *cap = c;
    }
    if (k) memcpy(*p + *n, s, k);
    *n += k;
    (*p)[*n] = '\0';
    return true;
}
