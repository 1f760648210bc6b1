/* fuzz_chat_template.c - the input is a chat template source: parse it and
 * render a small fixed conversation.  Runaway templates must stop at the
 * interpreter's documented limits (output size, recursion), not hang. */
#include <jansson.h>
#include "runtime/chat/chat.h"
#include "tests/fuzz/fuzz_util.h"

static json_t *messages, *extra;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    messages = json_loads("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                          "{\"role\":\"user\",\"content\":\"Hi <b> & \\\"you\\\"\"},"
                          "{\"role\":\"assistant\",\"content\":\"Hello!\",\"tool_calls\":[{\"type\":"
                          "\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}}]},"
                          "{\"role\":\"tool\",\"content\":[{\"type\":\"text\",\"text\":\"42\"}]},"
                          "{\"role\":\"user\",\"content\":null,\"reasoning_content\":\"hmm\"}]",
                          0, NULL);
    extra = json_loads("{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"enable_thinking\":false,"
                       "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
                       0, NULL);
    if (!messages || !extra) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *src = fuzz_strndup(data, size);
    struct moe_chat_template t;
    if (moe_chat_template_init(&t, src) == MOE_OK) {
        t.fixed_time = 1721995200;
        t.max_output = 1 << 20; /* keeps each run fast; the limit itself is under test */
        char *out = NULL;
        if (moe_chat_template_render(&t, messages, size & 1, extra, &out) == MOE_OK) {
            FUZZ_CHECK(strlen(out) <= t.max_output, "%zu bytes rendered", strlen(out));
            free(out);
        }
    }
    moe_chat_template_free(&t);
    moe_chat_template_free(&t);
    free(src);
    return 0;
}
