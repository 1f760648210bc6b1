/* fuzz_toolcall.c - the tool-call parsers (runtime/chat/toolcall.h) on arbitrary
 * model output.  Byte 0 picks the format (hermes, mistral, deepseek_v3,
 * glm45, kimi_k2), byte 1 the size of the pieces; the rest (to the first
 * NUL) is the text.  Invariants: the outcome does not depend on how the
 * text is cut (whole vs pieces: same content, same calls), the content is
 * never longer than the text, and every call's arguments are a compact
 * JSON object. */
#include <jansson.h>
#include "runtime/chat/toolcall.h"
#include "tests/fuzz/fuzz_util.h"

static const enum moe_tool_format FMTS[] = {MOE_TOOLS_HERMES, MOE_TOOLS_MISTRAL, MOE_TOOLS_DEEPSEEK_V3,
                                            MOE_TOOLS_GLM45, MOE_TOOLS_KIMI_K2};

/* Runs text through fmt in pieces of step bytes (0: whole); the content
 * (new memory) and the calls in tc. */
static char *parse(enum moe_tool_format fmt, const char *text, size_t step, struct moe_tool_calls *tc)
{
    const size_t n = strlen(text);
    char *out = calloc(1, n + 1), *piece = malloc(n + 1);
    if (!out || !piece) abort();
    size_t len = 0;
    const char *c;
    moe_tool_calls_init(tc, fmt);
    for (size_t at = 0; at <= n; at += step ? step : n + 1) {
        const size_t k = step && n - at > step ? step : n - at;
        memcpy(piece, text + at, k);
        piece[k] = '\0';
        const bool last = at + k >= n;
        for (int pass = 0; pass < 1 + last; pass++) {
            const enum moe_status st = pass ? moe_tool_calls_finish(tc, &c) : moe_tool_calls_push(tc, piece, &c);
            FUZZ_CHECK(st == MOE_OK, "status %d", (int)st);
            FUZZ_CHECK(len + strlen(c) <= n, "content longer than the text");
            memcpy(out + len, c, strlen(c) + 1);
            len += strlen(c);
        }
        if (last) break;
    }
    free(piece);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    const enum moe_tool_format fmt = FMTS[data[0] % 5];
    const size_t step = data[1] % 16 + 1;
    char *text = fuzz_strndup(data + 2, size - 2);
    struct moe_tool_calls whole, pieces;
    char *a = parse(fmt, text, 0, &whole), *b = parse(fmt, text, step, &pieces);
    FUZZ_CHECK(!strcmp(a, b), "content differs in pieces of %zu", step);
    FUZZ_CHECK(whole.n_calls == pieces.n_calls, "%d vs %d calls", whole.n_calls, pieces.n_calls);
    for (int i = 0; i < whole.n_calls; i++) {
        const struct moe_tool_call *x = &whole.calls[i], *y = &pieces.calls[i];
        FUZZ_CHECK(!strcmp(x->name, y->name) && !strcmp(x->arguments, y->arguments) &&
                       !x->id == !y->id && (!x->id || !strcmp(x->id, y->id)),
                   "call %d differs", i);
        json_t *j = json_loads(x->arguments, 0, NULL);
        char *compact = json_is_object(j) ? json_dumps(j, JSON_COMPACT) : NULL;
        FUZZ_CHECK(compact && !strcmp(compact, x->arguments), "arguments %s", x->arguments);
        free(compact);
        json_decref(j);
    }
    moe_tool_calls_free(&whole);
    moe_tool_calls_free(&pieces);
    free(a);
    free(b);
    free(text);
    return 0;
}
