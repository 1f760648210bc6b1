/* toolcall_impl.h - what the streaming scanner (toolcall.c) and the formats
 * (toolcall_formats.c) share: a format's markers and its call parser. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "runtime/chat/toolcall.h"

/* How a format's calls sit in the text.  A block runs from open to close:
 * with no call markers it is one call (hermes, glm45); with them it is a
 * section of calls, each from call_open to call_close (deepseek_v3,
 * kimi_k2).  close NULL: what follows open is one JSON value (mistral). */
struct moe_tc_syntax {
    const char *open, *close;
    const char *call_open, *call_close;
    /* One call's text (between the call markers, or the whole block, or the
     * JSON value; not NUL-terminated): adds its calls to tc and returns
     * true, or adds none and returns false (the text stays content). */
    bool (*call)(struct moe_tool_calls *tc, const char *text, size_t n);
};

/* NULL for the formats with nothing to find in the text (none, harmony). */
const struct moe_tc_syntax *moe_tc_syntax(enum moe_tool_format fmt);

/* Adds a call: name (n_name bytes, need not be NUL-terminated), arguments
 * JSON text (n_args bytes: an object, a string holding one, or, with
 * empty_ok, nothing but whitespace for {}), id or NULL. */
bool moe_tc_add(struct moe_tool_calls *tc, const char *name, size_t n_name, const char *args, size_t n_args,
                bool empty_ok, const char *id);
/* Drops the calls past the first n (undoes a list that failed midway). */
void moe_tc_truncate(struct moe_tool_calls *tc, int n);
