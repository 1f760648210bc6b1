/* fuzz_chat_messages.c - a real template (MOE_FUZZ_TEMPLATE, default the
 * Qwen3 fixture, the most involved one) with fuzzed input: the bytes are a
 * JSON messages array, optionally followed by a NUL and a JSON object of
 * extras (tools, enable_thinking, ...).  render takes an array (chat.h), so
 * other JSON is skipped. */
#include <jansson.h>
#include "runtime/chat/chat.h"
#include "tests/fuzz/fuzz_util.h"

static struct moe_chat_template tmpl;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *path = fuzz_repo_path("MOE_FUZZ_TEMPLATE", "tests/fixtures/chat/qwen3.jinja");
    FILE *f = fopen(path, "rb");
    if (!f) abort();
    static char src[1 << 20];
    size_t n = fread(src, 1, sizeof src - 1, f);
    fclose(f);
    src[n] = '\0';
    if (moe_chat_template_init(&tmpl, src) != MOE_OK) {
        fprintf(stderr, "fuzz_chat_messages: %s\n", moe_last_error());
        abort();
    }
    tmpl.fixed_time = 1721995200;
    tmpl.max_output = 1 << 20;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *a, *b;
    size_t na, nb;
    fuzz_split(data, size, 0, &a, &na, &b, &nb);
    json_t *msgs = json_loadb((const char *)a, na, 0, NULL);
    json_t *extra = nb ? json_loadb((const char *)b, nb, 0, NULL) : NULL;
    if (json_is_array(msgs) && (!nb || json_is_object(extra))) {
        char *out = NULL;
        if (moe_chat_template_render(&tmpl, msgs, size & 1, extra, &out) == MOE_OK) free(out);
    }
    json_decref(msgs);
    json_decref(extra);
    return 0;
}
