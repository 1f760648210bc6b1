/* reasoning.h - a reasoning model's output split into its reasoning and its
 * answer, as a chat completion's `reasoning_content` and `content` (vLLM's
 * reasoning parsers; OpenAI-compatible clients read `reasoning_content`).
 *
 * Two formats:
 * - think (DeepSeek-R1, Qwen3, GLM-4.5, Kimi): text between `<think>` and
 *   `</think>` is reasoning, the rest the answer.  A prompt that already
 *   opened the block (a template ending its generation prompt with
 *   `<think>`) starts the output inside it; the tags are dropped.
 * - harmony (gpt-oss): messages `<|start|>ROLE<|channel|>CHANNEL<|message|>
 *   TEXT<|end|>`, the last one ending in `<|return|>` or `<|call|>`.  TEXT
 *   of the `analysis` channel is reasoning, of any other channel (`final`,
 *   `commentary`) the answer; headers and markers are dropped.  The
 *   detokenizer must keep special tokens for this one (they are the
 *   markers).  Output that never reaches a `<|message|>` is the answer.
 *
 * Text arrives in pieces of any length (a marker may be split between
 * pieces); the parser holds back only what could still begin a marker. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "runtime/core/status.h"
#include "runtime/chat/toolcall.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_reasoning_format { MOE_REASONING_NONE, MOE_REASONING_THINK, MOE_REASONING_HARMONY };

struct moe_reasoning {
    enum moe_reasoning_format fmt;
    int state;         /* parser state (reasoning.c) */
    bool analysis;     /* harmony: the current message's channel is analysis */
    bool seen_message; /* harmony: a <|message|> has been read */
    char *pending;     /* text not yet classified */
    size_t n_pending, cap;
    char *header;      /* harmony: the current message header */
    size_t n_header, cap_header;
    char *reason, *answer; /* the last push's two parts, owned */
    /* harmony: with calls set (borrowed), a message addressed
     * `to=functions.NAME` is a tool call, added there when it ends (text
     * that is not a JSON object stays in the answer); NULL: its text is
     * the answer */
    struct moe_tool_calls *calls;
    char *recipient;       /* the current message's function name, or NULL */
    char *args;
    size_t n_args, cap_args;
};

/* in_think: (think) the prompt ended inside a reasoning block. */
void moe_reasoning_init(struct moe_reasoning *r, enum moe_reasoning_format fmt, bool in_think);
/* Feeds text; *reason and *answer (borrowed until the next call, "" when
 * empty) are its parts that are certain now. */
MOE_MUST_USE enum moe_status moe_reasoning_push(struct moe_reasoning *r, const char *text,
                                                 const char **reason, const char **answer);
/* End of output: the parts held back. */
MOE_MUST_USE enum moe_status moe_reasoning_finish(struct moe_reasoning *r, const char **reason,
                                                   const char **answer);
void moe_reasoning_free(struct moe_reasoning *r);
/* "none", "think", "harmony" -> format; false if unknown. */
bool moe_reasoning_parse_name(const char *name, enum moe_reasoning_format *out);
/* The format a chat template's text implies: harmony when it writes
 * `<|channel|>`, think when it writes `<think>` or `</think>`, else none. */
enum moe_reasoning_format moe_reasoning_detect(const char *chat_template);
/* Whether a rendered prompt ends inside a think block (its last non-space
 * text is `<think>`). */
bool moe_reasoning_prompt_opens_think(const char *prompt);

#ifdef __cplusplus
}
#endif
