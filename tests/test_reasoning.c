/* test_reasoning.c - reasoning/answer splitting (runtime/chat/reasoning.h): the
 * think and harmony formats, every way of cutting the text into pieces. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/chat/reasoning.h"

/* Feeds text in pieces of `step` bytes (0: all at once) and checks both parts. */
static void check_split(enum moe_reasoning_format fmt, bool in_think, const char *text, size_t step,
                        const char *want_reason, const char *want_answer)
{
    struct moe_reasoning r;
    moe_reasoning_init(&r, fmt, in_think);
    char reason[1024] = "", answer[1024] = "";
    const size_t n = strlen(text);
    if (step == 0) step = n ? n : 1;
    const char *rp, *ap;
    for (size_t at = 0; at < n; at += step) {
        char piece[1024];
        const size_t k = n - at < step ? n - at : step;
        memcpy(piece, text + at, k);
        piece[k] = '\0';
        cr_assert_eq(moe_reasoning_push(&r, piece, &rp, &ap), MOE_OK);
        strcat(reason, rp);
        strcat(answer, ap);
    }
    cr_assert_eq(moe_reasoning_finish(&r, &rp, &ap), MOE_OK);
    strcat(reason, rp);
    strcat(answer, ap);
    cr_expect_str_eq(reason, want_reason, "pieces of %zu: reasoning", step);
    cr_expect_str_eq(answer, want_answer, "pieces of %zu: answer", step);
    moe_reasoning_free(&r);
}

static void check_all(enum moe_reasoning_format fmt, bool in_think, const char *text,
                      const char *want_reason, const char *want_answer)
{
    for (size_t step = 0; step <= strlen(text); step++)
        check_split(fmt, in_think, text, step, want_reason, want_answer);
}

Test(reasoning, think_block_in_the_output)
{
    check_all(MOE_REASONING_THINK, false, "<think>\nplan it\n</think>\n\nThe answer.", "\nplan it\n",
              "\n\nThe answer.");
    check_all(MOE_REASONING_THINK, false, "No thinking here.", "", "No thinking here.");
}

/* DeepSeek-R1's template ends the prompt with <think>: the output starts
 * inside the block, and a block never closed is all reasoning. */
Test(reasoning, think_opened_by_the_prompt)
{
    check_all(MOE_REASONING_THINK, true, "step 1\nstep 2</think>Final", "step 1\nstep 2", "Final");
    check_all(MOE_REASONING_THINK, true, "still thinking <thi", "still thinking <thi", "");
    check_all(MOE_REASONING_THINK, false, "a < b and <thinking> is text", "",
              "a < b and <thinking> is text");
}

Test(reasoning, harmony_channels)
{
    check_all(MOE_REASONING_HARMONY, false,
              "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>"
              "final<|message|>2 + 2 = 4.<|return|>",
              "User asks 2+2. Easy.", "2 + 2 = 4.");
    /* a tool call: commentary to a recipient, constrained; the arguments
     * are the answer's text */
    check_all(MOE_REASONING_HARMONY, false,
              "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get "
              "<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>",
              "Need the weather.", "{\"city\": \"Oslo\"}");
    /* a channel named like analysis is not analysis */
    check_all(MOE_REASONING_HARMONY, false, "<|channel|>analysis2<|message|>x<|end|>", "", "x");
}

Test(reasoning, harmony_without_headers_is_the_answer)
{
    check_all(MOE_REASONING_HARMONY, false, "Just text, <|chan not a marker", "",
              "Just text, <|chan not a marker");
    /* a cut-off header after a message is dropped, not shown */
    check_all(MOE_REASONING_HARMONY, false, "<|channel|>final<|message|>Hi<|end|><|start|>assis", "",
              "Hi");
}

Test(reasoning, names_detection_and_open_prompts)
{
    enum moe_reasoning_format f;
    cr_assert(moe_reasoning_parse_name("think", &f) && f == MOE_REASONING_THINK);
    cr_assert(moe_reasoning_parse_name("harmony", &f) && f == MOE_REASONING_HARMONY);
    cr_assert(moe_reasoning_parse_name("none", &f) && f == MOE_REASONING_NONE);
    cr_assert(!moe_reasoning_parse_name("r1", &f));
    cr_assert_eq(moe_reasoning_detect("{{ '<|start|>assistant<|channel|>final' }}"), MOE_REASONING_HARMONY);
    cr_assert_eq(moe_reasoning_detect("{% if x %}<think>\n{% endif %}"), MOE_REASONING_THINK);
    cr_assert_eq(moe_reasoning_detect("{{ messages }}"), MOE_REASONING_NONE);
    cr_assert_eq(moe_reasoning_detect(NULL), MOE_REASONING_NONE);
    cr_assert(moe_reasoning_prompt_opens_think("<|User|>Hi<|Assistant|><think>\n"));
    cr_assert(!moe_reasoning_prompt_opens_think("<think>a</think>\n"));
    cr_assert(!moe_reasoning_prompt_opens_think(""));
}

/* ---- tool calls (runtime/chat/toolcall.h) ---- */

/* Hermes blocks out of the answer, fed in pieces of every size. */
static void check_hermes(const char *text, const char *want_content, int want_calls, const char *name0,
                         const char *args0)
{
    for (size_t step = 1; step <= strlen(text); step++) {
        struct moe_tool_calls tc;
        moe_tool_calls_init(&tc, MOE_TOOLS_HERMES);
        char content[1024] = "";
        const char *c;
        for (size_t at = 0; at < strlen(text); at += step) {
            char piece[1024];
            const size_t k = strlen(text) - at < step ? strlen(text) - at : step;
            memcpy(piece, text + at, k);
            piece[k] = '\0';
            cr_assert_eq(moe_tool_calls_push(&tc, piece, &c), MOE_OK);
            strcat(content, c);
        }
        cr_assert_eq(moe_tool_calls_finish(&tc, &c), MOE_OK);
        strcat(content, c);
        cr_expect_str_eq(content, want_content, "pieces of %zu", step);
        cr_expect_eq(tc.n_calls, want_calls, "pieces of %zu", step);
        if (want_calls > 0 && tc.n_calls > 0) {
            cr_expect_str_eq(tc.calls[0].name, name0);
            cr_expect_str_eq(tc.calls[0].arguments, args0);
        }
        moe_tool_calls_free(&tc);
    }
}

Test(reasoning, hermes_tool_calls)
{
    check_hermes("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                 "\"Oslo\", \"days\": 2}}\n</tool_call>",
                 "Let me check.\n", 1, "get_weather", "{\"city\":\"Oslo\",\"days\":2}");
    /* two calls; arguments given as a JSON string */
    check_hermes("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", "
                 "\"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>",
                 "", 2, "a", "{}");
    /* not a call, and a block never closed: kept as written */
    check_hermes("<tool_call>not json</tool_call> and <tool_call>{\"name\"",
                 "<tool_call>not json</tool_call> and <tool_call>{\"name\"", 0, NULL, NULL);
    check_hermes("a < b <tool_ca", "a < b <tool_ca", 0, NULL, NULL);
}

/* gpt-oss: a commentary message to functions.NAME is a call (the recipient
 * before or after the channel), its reasoning stays reasoning */
Test(reasoning, harmony_tool_calls)
{
    const char *texts[] = {
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>",
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather"
        "<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}<|call|>"};
    for (int i = 0; i < 2; i++)
        for (size_t step = 1; step <= strlen(texts[i]); step++) {
            struct moe_reasoning r;
            struct moe_tool_calls tc;
            moe_reasoning_init(&r, MOE_REASONING_HARMONY, false);
            moe_tool_calls_init(&tc, MOE_TOOLS_HARMONY);
            r.calls = &tc;
            char reason[512] = "", answer[512] = "";
            const char *rp, *ap;
            for (size_t at = 0; at < strlen(texts[i]); at += step) {
                char piece[512];
                const size_t k = strlen(texts[i]) - at < step ? strlen(texts[i]) - at : step;
                memcpy(piece, texts[i] + at, k);
                piece[k] = '\0';
                cr_assert_eq(moe_reasoning_push(&r, piece, &rp, &ap), MOE_OK);
                strcat(reason, rp), strcat(answer, ap);
            }
            cr_assert_eq(moe_reasoning_finish(&r, &rp, &ap), MOE_OK);
            strcat(reason, rp), strcat(answer, ap);
            cr_expect_str_eq(reason, "Need weather.");
            cr_expect_str_eq(answer, "");
            cr_assert_eq(tc.n_calls, 1, "text %d pieces of %zu", i, step);
            cr_expect_str_eq(tc.calls[0].name, "get_weather");
            cr_expect_str_eq(tc.calls[0].arguments, "{\"city\":\"Oslo\"}");
            moe_reasoning_free(&r);
            moe_tool_calls_free(&tc);
        }
    cr_assert_eq(moe_tool_calls_detect("{{ '<tool_call>' }}"), MOE_TOOLS_HERMES);
    cr_assert_eq(moe_tool_calls_detect("<|channel|>"), MOE_TOOLS_HARMONY);
    cr_assert_eq(moe_tool_calls_detect("plain"), MOE_TOOLS_NONE);
}
