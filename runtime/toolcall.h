/* toolcall.h - tool calls in a model's answer, as a chat completion's
 * message.tool_calls (OpenAI's function calling; vLLM's tool parsers).
 *
 * Two formats:
 * - hermes (Qwen2.5, Qwen3, Qwen3-MoE and others whose chat templates ask
 *   for it): blocks `<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`
 *   in the answer text; text outside them is the content.  A block whose
 *   JSON is not a call (no string name, arguments not an object or a
 *   string) stays in the content as written, and so does a block never
 *   closed: nothing the model wrote is dropped.
 * - harmony (gpt-oss): messages addressed `to=functions.NAME`; the harmony
 *   reasoning parser sees the headers and adds those calls here
 *   (runtime/reasoning.h, moe_reasoning.calls).
 * Calls are complete when they are added; streaming sends each whole. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_tool_format { MOE_TOOLS_NONE, MOE_TOOLS_HERMES, MOE_TOOLS_HARMONY };

struct moe_tool_call {
    char *name;      /* owned */
    char *arguments; /* owned: the arguments object as compact JSON text */
};

struct moe_tool_calls {
    enum moe_tool_format fmt;
    bool in_call;          /* hermes: inside a <tool_call> block */
    char *pending;         /* text not yet classified */
    size_t n_pending, cap;
    char *block;           /* hermes: the open block's text */
    size_t n_block, cap_block;
    char *content;         /* the last push's content, owned */
    struct moe_tool_call *calls; /* every complete call so far, owned */
    int n_calls, cap_calls;
};

void moe_tool_calls_init(struct moe_tool_calls *tc, enum moe_tool_format fmt);
/* Feeds answer text; *content (borrowed until the next call, "" when
 * empty) is what is certain to be content now.  New calls appear at the end
 * of tc->calls. */
MOE_MUST_USE enum moe_status moe_tool_calls_push(struct moe_tool_calls *tc, const char *text,
                                                  const char **content);
/* End of output: what was held back (an unclosed block's text). */
MOE_MUST_USE enum moe_status moe_tool_calls_finish(struct moe_tool_calls *tc, const char **content);
/* Adds a complete call (copies).  arguments: JSON text; an object is kept
 * as compact JSON, anything else is refused (false: not a call). */
MOE_MUST_USE bool moe_tool_calls_add(struct moe_tool_calls *tc, const char *name, const char *arguments);
void moe_tool_calls_free(struct moe_tool_calls *tc);
/* The format a chat template implies: hermes when it writes `<tool_call>`,
 * harmony when it writes `<|channel|>`, else none. */
enum moe_tool_format moe_tool_calls_detect(const char *chat_template);

#ifdef __cplusplus
}
#endif
