/* toolcall.h - tool calls in a model's answer, as a chat completion's
 * message.tool_calls (OpenAI's function calling; vLLM's tool parsers).
 *
 * Formats (the exact text each model family's chat template writes for a
 * call in the history, which is what the model learnt to write):
 * - hermes (Qwen2.5, Qwen3, Qwen3-MoE and others whose chat templates ask
 *   for it): blocks `<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`.
 * - glm45 (GLM-4.5, GLM-4.6): blocks `<tool_call>NAME` then pairs
 *   `<arg_key>K</arg_key><arg_value>V</arg_value>` (newlines between) and
 *   `</tool_call>`.  V is JSON when it parses as JSON, else the text itself;
 *   a parameter the request's tools type "string" always keeps the text.
 * - deepseek_v3 (DeepSeek-V3, R1, V3.1): a section `<｜tool▁calls▁begin｜>`
 *   .. `<｜tool▁calls▁end｜>` of calls `<｜tool▁call▁begin｜>` ..
 *   `<｜tool▁call▁end｜>`, each either V3/R1's `function<｜tool▁sep｜>NAME\n
 *   ```json\nARGS\n```` or V3.1's `NAME<｜tool▁sep｜>ARGS`.
 * - kimi_k2 (Kimi-K2): a section `<|tool_calls_section_begin|>` ..
 *   `<|tool_calls_section_end|>` of calls `<|tool_call_begin|>ID
 *   <|tool_call_argument_begin|>ARGS<|tool_call_end|>`, ID being
 *   `functions.NAME:IDX`; the call keeps ID as its id.
 * - mistral (Mixtral-8x22B-Instruct, Mistral v3 tokenizers): `[TOOL_CALLS]`
 *   then a JSON list of `{"name", "arguments"[, "id"]}` (one object is
 *   taken as a list of one); the list ends where its JSON ends.
 * - harmony (gpt-oss): messages addressed `to=functions.NAME`; the harmony
 *   reasoning parser sees the headers and adds those calls here
 *   (runtime/chat/reasoning.h, moe_reasoning.calls).
 * Arguments may also be a JSON string holding the object; in deepseek_v3
 * and kimi_k2, where they stand alone, nothing at all is {}.
 *
 * Text outside blocks and sections is the content; it is returned as soon
 * as it is certain, only a tail that could begin a marker is held back.
 * Nothing the model wrote is dropped: a block that is not a call, or never
 * closed, stays in the content as written, markers and all; in a section,
 * a call that fails (or never ends) stays as written, and so does the
 * whole section when it gave no call.  Calls are complete when they are
 * added; streaming sends each whole.
 *
 * The markers of mistral, deepseek_v3, kimi_k2 and glm45 are special tokens
 * in some of those tokenizers: a detokenizer that skips special tokens must
 * keep them (moe_tool_calls_markers, moe_detok_keep). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_tool_format {
    MOE_TOOLS_NONE,
    MOE_TOOLS_HERMES,
    MOE_TOOLS_HARMONY,
    MOE_TOOLS_MISTRAL,
    MOE_TOOLS_DEEPSEEK_V3,
    MOE_TOOLS_GLM45,
    MOE_TOOLS_KIMI_K2,
};

struct moe_tool_call {
    char *name;      /* owned */
    char *arguments; /* owned: the arguments object as compact JSON text */
    char *id;        /* owned, or NULL: the id the model wrote (Kimi-K2's functions.NAME:IDX,
                        a Mistral call's 9 characters) */
};

struct moe_tool_calls {
    enum moe_tool_format fmt;
    const json_t *tools;   /* borrowed, or NULL: the request's tools (glm45 reads the types) */
    int state;             /* scanner state (toolcall.c) */
    char *pending;         /* text not yet classified */
    size_t n_pending, cap;
    char *block;           /* the open call's text */
    size_t n_block, cap_block;
    char *section;         /* deepseek_v3, kimi_k2: the open section's text that is no call */
    size_t n_section, cap_section;
    int section_calls;     /* calls the open section gave */
    char *content;         /* the last push's content, owned */
    struct moe_tool_call *calls; /* every complete call so far, owned */
    int n_calls, cap_calls;
    bool forced;           /* moe_tool_calls_force: the answer is JSON, held whole */
    const char *forced_name; /* borrowed, or NULL: the forced function */
};

void moe_tool_calls_init(struct moe_tool_calls *tc, enum moe_tool_format fmt);
/* Feeds answer text; *content (borrowed until the next call, "" when
 * empty) is what is certain to be content now.  New calls appear at the end
 * of tc->calls. */
MOE_MUST_USE enum moe_status moe_tool_calls_push(struct moe_tool_calls *tc, const char *text,
                                                  const char **content);
/* End of output: what was held back (an unclosed block's text). */
MOE_MUST_USE enum moe_status moe_tool_calls_finish(struct moe_tool_calls *tc, const char **content);
/* Adds a complete call (copies).  arguments: JSON text of an object, or of
 * a string holding one; kept as compact JSON.  Anything else is refused
 * (false: not a call), and so is an empty name. */
MOE_MUST_USE bool moe_tool_calls_add(struct moe_tool_calls *tc, const char *name, const char *arguments);
void moe_tool_calls_free(struct moe_tool_calls *tc);
/* A forced call (tool_choice "required" or a named function), whatever
 * the format: the answer is JSON that a grammar made it write, and no
 * content.  name given (borrowed, outlives tc): the answer is the
 * arguments object of one call of name; NULL: a list of {"name": NAME,
 * "parameters": {...}} objects, each a call (vLLM's form).  Pushes return
 * no content; the finish adds the calls, or, when the answer is not that
 * (cut short by max_tokens), returns it whole as content. */
void moe_tool_calls_force(struct moe_tool_calls *tc, const char *name);
/* The id of call k into buf (n bytes): the one the model wrote, else one
 * the format's chat template takes back in the history: for mistral nine
 * letters and digits made from seed (its template refuses other ids), else
 * "call_SEED". */
void moe_tool_calls_id(const struct moe_tool_calls *tc, int k, const char *seed, char *buf, size_t n);

/* "none", "hermes", "harmony", "mistral", "deepseek_v3" (also
 * "deepseek_v31"), "glm45", "kimi_k2" -> format; false if unknown. */
bool moe_tool_calls_parse_name(const char *name, enum moe_tool_format *out);
/* The format's name ("hermes", ...). */
const char *moe_tool_calls_name(enum moe_tool_format fmt);
/* The strings the format's blocks are made of, NULL-terminated (empty for
 * none and harmony): the special tokens among them must reach the parser. */
const char *const *moe_tool_calls_markers(enum moe_tool_format fmt);
/* The format a chat template implies: harmony when it writes `<|channel|>`;
 * kimi_k2 when `<|tool_calls_section_begin|>` or `tool_declare`;
 * deepseek_v3 when `<｜tool▁calls▁begin｜>`; mistral when `[TOOL_CALLS]`;
 * glm45 when `<arg_key>`; hermes when `<tool_call>`; else none. */
enum moe_tool_format moe_tool_calls_detect(const char *chat_template);

#ifdef __cplusplus
}
#endif
