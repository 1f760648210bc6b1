/* chat.h - render a model's chat template (tokenizer_config.json
 * "chat_template", Jinja2) into the prompt text, byte-identical to
 * transformers' tokenizer.apply_chat_template(messages, tokenize=False).
 *
 * The template sees what transformers passes to it:
 *   messages              the conversation (an array of {role, content, ...}
 *                         objects, e.g. an OpenAI request's "messages" as is;
 *                         tool_calls and other fields pass through)
 *   tools, documents      from extra, else none
 *   add_generation_prompt
 *   every other key of extra: bos_token, eos_token (transformers passes the
 *                         tokenizer's special tokens), enable_thinking,
 *                         date_string, ...
 * As transformers does, a message's reasoning under "reasoning_content",
 * "thinking" or "reasoning" is offered to the template under all of
 * "thinking" (first) and "reasoning_content" (last).
 *
 * The interpreter (runtime/jinja*.c) covers what the supported families'
 * templates use: Qwen2.5, Qwen3, Llama-3.x, Mistral/Mixtral, OLMoE, ChatML.
 * Errors: MOE_ERR_FORMAT with "chat template line L[ column C]: ..." for
 * syntax errors and for failures while rendering, including the template's
 * own raise_exception(msg) (the message contains msg); MOE_ERR_UNSUPPORTED
 * naming the filter, test, method or tag this interpreter lacks. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct jtemplate;

struct moe_chat_template {
    struct jtemplate *impl; /* parsed AST, owned */
    char *source;           /* the template's text, owned (what reasoning.h detects from) */
    int64_t fixed_time;     /* strftime_now's clock, seconds since the epoch
                               rendered in local time; 0: the real clock */
    size_t max_output;      /* bytes; rendering more fails (default 16 MiB) */
};

/* Parses src (NUL-terminated, UTF-8).  On failure t is zeroed (free is safe)
 * and the message names the line and column. */
MOE_MUST_USE enum moe_status moe_chat_template_init(struct moe_chat_template *t, const char *src);
/* Safe on a zeroed struct and twice. */
void moe_chat_template_free(struct moe_chat_template *t);

/* Renders the conversation.  messages (a JSON array) and extra (a JSON
 * object or NULL) are borrowed.  *out is new memory (free()). */
MOE_MUST_USE enum moe_status moe_chat_template_render(const struct moe_chat_template *t, json_t *messages,
                                                      bool add_generation_prompt, json_t *extra,
                                                      char **out);

/* The template transformers uses for a model directory: MODEL_DIR/
 * chat_template.jinja when that file exists (it takes priority, as in
 * PreTrainedTokenizerBase.from_pretrained), else config_template (the
 * tokenizer_config.json "chat_template", i.e. moe_tokenizer.chat_template;
 * may be NULL).  Neither: MOE_ERR_FORMAT naming the directory. */
MOE_MUST_USE enum moe_status moe_chat_template_load(struct moe_chat_template *t, const char *model_dir,
                                                    const char *config_template);

struct moe_tokenizer;
/* {"bos_token": ..., "eos_token": ...} for extra: the special tokens the
 * tokenizer knows (transformers passes its special_tokens_map).  New
 * reference; NULL on allocation failure. */
json_t *moe_chat_special_tokens(const struct moe_tokenizer *tok);

/* The OpenAI API's messages as chat templates read them: a content given
 * as a list of parts ([{"type": "text", "text": "Hi"}, ...]) becomes the
 * parts' texts joined with "\n" (as vLLM joins them); every role must be
 * system, developer, user, assistant, tool or function.  messages is
 * borrowed; *out is a new reference (messages itself when nothing
 * changes).  A role outside the list, a part that is not text (image_url,
 * input_audio, file, ...) or a malformed part fails with
 * MOE_ERR_INVALID_ARG naming the message and part. */
MOE_MUST_USE enum moe_status moe_chat_messages_text(json_t *messages, json_t **out);

/* One shot: parse template_src, render, free. */
MOE_MUST_USE enum moe_status moe_chat_render(const char *template_src, json_t *messages,
                                             bool add_generation_prompt, json_t *extra, char **out);

#ifdef __cplusplus
}
#endif
