/* test_toolcall.c - tool calls out of a model's answer (runtime/chat/toolcall.h):
 * the mistral, deepseek_v3, glm45 and kimi_k2 formats (hermes and harmony
 * are also in test_reasoning.c).  Every text is fed in pieces of every size
 * (1: byte by byte) and cut in two at every point.  The expected calls are
 * written out by hand, or (round trips) are the calls an assistant message
 * held before the family's real chat template (tests/fixtures/chat/)
 * rendered it; the template, not this parser, says what the text is. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/chat/chat.h"
#include "runtime/text/tokenizer.h"
#include "runtime/chat/toolcall.h"
#include "tests/testutil.h"

#define CHAT_DIR FIXTURE_DIR "/chat"

struct want {
    const char *name, *args, *id; /* args: JSON text of the object (any layout); id NULL: none */
};

static json_t *parse_json(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, JSON_DECODE_ANY, &e);
    cr_assert(j, "not JSON (%s): %s", e.text, s);
    return j;
}

/* One run: text in pieces of `step` bytes, or (step 0) cut in two at `cut`. */
static void run_once(enum moe_tool_format fmt, const json_t *tools, const char *text, size_t step, size_t cut,
                     const char *want_content, bool trim_content, const struct want *want, int n_want)
{
    struct moe_tool_calls tc;
    moe_tool_calls_init(&tc, fmt);
    tc.tools = tools;
    const size_t n = strlen(text);
    char *content = calloc(1, n + 1), *piece = malloc(n + 1);
    cr_assert(content && piece);
    const char *c;
    for (size_t at = 0; at < n;) {
        const size_t k = step ? (n - at < step ? n - at : step) : (at < cut ? cut - at : n - at);
        memcpy(piece, text + at, k);
        piece[k] = '\0';
        cr_assert_eq(moe_tool_calls_push(&tc, piece, &c), MOE_OK);
        cr_assert(strlen(content) + strlen(c) <= n, "more content than text");
        strcat(content, c);
        at += k;
    }
    cr_assert_eq(moe_tool_calls_finish(&tc, &c), MOE_OK);
    cr_assert(strlen(content) + strlen(c) <= n, "more content than text");
    strcat(content, c);
    const char *got = content;
    size_t len = strlen(got);
    if (trim_content) { /* templates put line breaks around the calls */
        while (len && strchr(" \n", got[0])) got++, len--;
        while (len && strchr(" \n", got[len - 1])) len--;
    }
    cr_assert(len == strlen(want_content) && !memcmp(got, want_content, len),
              "pieces of %zu / cut at %zu: content \"%s\", want \"%s\"", step, cut, content, want_content);
    cr_assert_eq(tc.n_calls, n_want, "pieces of %zu / cut at %zu: %d calls, want %d", step, cut, tc.n_calls,
                 n_want);
    for (int i = 0; i < n_want; i++) {
        const struct moe_tool_call *k = &tc.calls[i];
        cr_assert_str_eq(k->name, want[i].name, "call %d", i);
        json_t *a = parse_json(k->arguments), *w = parse_json(want[i].args);
        char *compact = json_dumps(a, JSON_COMPACT);
        cr_assert(json_is_object(a) && json_equal(a, w), "call %d arguments %s, want %s", i, k->arguments,
                  want[i].args);
        cr_assert_str_eq(k->arguments, compact, "call %d: arguments as compact JSON", i);
        free(compact);
        json_decref(a);
        json_decref(w);
        if (want[i].id) cr_assert(k->id && !strcmp(k->id, want[i].id), "call %d id %s", i, k->id ? k->id : "NULL");
        else cr_assert_null(k->id, "call %d id %s", i, k->id);
    }
    moe_tool_calls_free(&tc);
    free(content);
    free(piece);
}

static void check_tools(enum moe_tool_format fmt, const json_t *tools, const char *text, const char *want_content,
                        bool trim_content, const struct want *want, int n_want)
{
    const size_t n = strlen(text);
    for (size_t step = 1; step <= n; step++)
        run_once(fmt, tools, text, step, 0, want_content, trim_content, want, n_want);
    for (size_t cut = 0; cut <= n; cut++) run_once(fmt, tools, text, 0, cut, want_content, trim_content, want, n_want);
}

static void check(enum moe_tool_format fmt, const char *text, const char *want_content, const struct want *want,
                  int n_want)
{
    check_tools(fmt, NULL, text, want_content, false, want, n_want);
}

/* text is content as written, no call */
static void check_kept(enum moe_tool_format fmt, const char *text) { check(fmt, text, text, NULL, 0); }

/* ---- mistral: [TOOL_CALLS] then a JSON list ---- */

Test(toolcall, mistral_lists)
{
    check(MOE_TOOLS_MISTRAL,
          "Sure.[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}]",
          "Sure.", (struct want[]){{"get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}", NULL}}, 1);
    /* two calls; a valid id is kept, another is not (the template refuses it);
     * arguments given as a JSON string */
    check(MOE_TOOLS_MISTRAL,
          "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}, \"id\": \"abcDEF123\"}, {\"name\": \"b\", "
          "\"arguments\": \"{\\\"x\\\": [1, 2]}\", \"id\": \"call_1\"}]",
          "", (struct want[]){{"a", "{}", "abcDEF123"}, {"b", "{\"x\": [1, 2]}", NULL}}, 2);
    /* one object; brackets inside strings; text after the list is content */
    check(MOE_TOOLS_MISTRAL, "[TOOL_CALLS]{\"name\": \"say\", \"arguments\": {\"s\": \"x] }\", \"u\": \"\xc3\xa9\"}} done",
          " done", (struct want[]){{"say", "{\"s\": \"x] }\", \"u\": \"\xc3\xa9\"}", NULL}}, 1);
}

Test(toolcall, mistral_malformed_stays_content)
{
    check_kept(MOE_TOOLS_MISTRAL, "[TOOL_CALLS] [{\"name\": \"a\"}]");                  /* no arguments */
    check_kept(MOE_TOOLS_MISTRAL, "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": [1]}]"); /* not an object */
    check_kept(MOE_TOOLS_MISTRAL, "[TOOL_CALLS] []");
    check_kept(MOE_TOOLS_MISTRAL, "[TOOL_CALLS] I cannot call tools.");
    check_kept(MOE_TOOLS_MISTRAL, "[TOOL_CALLS] [{\"name\": \"a\", \"argu");          /* cut off */
    check_kept(MOE_TOOLS_MISTRAL, "Use [TOOL] tags, not [TOOL_CA");
    /* a bad list then a good one: each on its own */
    check(MOE_TOOLS_MISTRAL, "[TOOL_CALLS] [1 2] [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"k\": 1}}]",
          "[TOOL_CALLS] [1 2] ", (struct want[]){{"a", "{\"k\": 1}", NULL}}, 1);
}

/* ---- deepseek_v3: sections of calls, V3/R1 and V3.1 forms ---- */

#define DS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_END "<｜tool▁calls▁end｜>"
#define DS_CALL "<｜tool▁call▁begin｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_SEP "<｜tool▁sep｜>"

Test(toolcall, deepseek_v3_and_r1_form)
{
    check(MOE_TOOLS_DEEPSEEK_V3,
          "Let me check." DS_BEGIN DS_CALL "function" DS_SEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DS_CALL_END
          "\n" DS_CALL "function" DS_SEP "add\n```json\n{\"a\": 1, \"b\": 2.5}\n```" DS_CALL_END DS_END,
          "Let me check.",
          (struct want[]){{"get_weather", "{\"city\": \"Paris\"}", NULL}, {"add", "{\"a\": 1, \"b\": 2.5}", NULL}}, 2);
}

Test(toolcall, deepseek_v31_form)
{
    check(MOE_TOOLS_DEEPSEEK_V3,
          DS_BEGIN DS_CALL "get_weather" DS_SEP "{\"city\": \"Paris\"}" DS_CALL_END DS_CALL "add" DS_SEP
          "\"{\\\"a\\\": 1}\"" DS_CALL_END DS_CALL "ping" DS_SEP DS_CALL_END DS_END " after",
          " after",
          (struct want[]){{"get_weather", "{\"city\": \"Paris\"}", NULL}, {"add", "{\"a\": 1}", NULL}, {"ping", "{}", NULL}},
          3);
}

Test(toolcall, deepseek_malformed_stays_content)
{
    /* a call that does not parse stays as written, the others are calls */
    check(MOE_TOOLS_DEEPSEEK_V3,
          DS_BEGIN DS_CALL "get_weather" DS_SEP "not json" DS_CALL_END DS_CALL "add" DS_SEP "{\"a\": 1}" DS_CALL_END DS_END,
          DS_CALL "get_weather" DS_SEP "not json" DS_CALL_END, (struct want[]){{"add", "{\"a\": 1}", NULL}}, 1);
    /* a section with no call at all, one cut off, one whose fence is not closed */
    check_kept(MOE_TOOLS_DEEPSEEK_V3, "x" DS_BEGIN "nothing here" DS_END "y");
    check_kept(MOE_TOOLS_DEEPSEEK_V3, "Hi" DS_BEGIN DS_CALL "get_weather" DS_SEP "{\"ci");
    check_kept(MOE_TOOLS_DEEPSEEK_V3, DS_BEGIN DS_CALL "function" DS_SEP "f\n```json\n{}" DS_CALL_END DS_END);
    check_kept(MOE_TOOLS_DEEPSEEK_V3, DS_BEGIN DS_CALL "two words" DS_SEP "{}" DS_CALL_END DS_END);
    check_kept(MOE_TOOLS_DEEPSEEK_V3, "a <｜tool▁calls▁beg");
    /* cut off after a complete call: the call stands, the rest is content */
    check(MOE_TOOLS_DEEPSEEK_V3, DS_BEGIN DS_CALL "a" DS_SEP "{}" DS_CALL_END DS_CALL "b" DS_SEP "{\"k\"",
          DS_CALL "b" DS_SEP "{\"k\"", (struct want[]){{"a", "{}", NULL}}, 1);
    /* a call never ended before the section ends */
    check(MOE_TOOLS_DEEPSEEK_V3, DS_BEGIN DS_CALL "a" DS_SEP "{}" DS_CALL_END DS_CALL "b" DS_SEP "{" DS_END "z",
          DS_CALL "b" DS_SEP "{z", (struct want[]){{"a", "{}", NULL}}, 1);
}

/* ---- glm45: <tool_call>NAME <arg_key>/<arg_value> pairs ---- */

Test(toolcall, glm45_blocks)
{
    check(MOE_TOOLS_GLM45,
          "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
          "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
          "Let me check.\n", (struct want[]){{"get_weather", "{\"city\": \"Paris\", \"days\": 2}", NULL}}, 1);
    /* values: JSON when they parse as JSON, else the text as written */
    check(MOE_TOOLS_GLM45,
          "<tool_call>f\n<arg_key>note</arg_key>\n<arg_value>x \"y\" </arg_value>\n<arg_key>list</arg_key>"
          "<arg_value>[1, \"\xc3\xa9\"]</arg_value><arg_key>none</arg_key><arg_value>null</arg_value>"
          "<arg_key>code</arg_key>\n<arg_value>a < b\n</arg_value>\n</tool_call><tool_call>ping</tool_call>",
          "",
          (struct want[]){{"f", "{\"note\": \"x \\\"y\\\" \", \"list\": [1, \"\xc3\xa9\"], \"none\": null, "
                                "\"code\": \"a < b\\n\"}", NULL},
                          {"ping", "{}", NULL}},
          2);
}

/* A parameter the tools type "string" keeps its text even when it reads as
 * JSON (the template writes strings raw: "0042" and 42 look alike). */
Test(toolcall, glm45_string_parameters_follow_the_tools)
{
    const char *text = "<tool_call>lookup\n<arg_key>zip</arg_key>\n<arg_value>0042</arg_value>\n"
                       "<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n<arg_key>flag</arg_key>\n"
                       "<arg_value>true</arg_value>\n</tool_call>";
    json_t *tools = parse_json("[{\"type\": \"function\", \"function\": {\"name\": \"lookup\", \"parameters\": "
                               "{\"type\": \"object\", \"properties\": {\"zip\": {\"type\": \"string\"}, "
                               "\"n\": {\"type\": \"integer\"}, \"flag\": {\"type\": \"string\"}}}}}]");
    check_tools(MOE_TOOLS_GLM45, tools, text, "", false,
                (struct want[]){{"lookup", "{\"zip\": \"0042\", \"n\": 7, \"flag\": \"true\"}", NULL}}, 1);
    check_tools(MOE_TOOLS_GLM45, NULL, "<tool_call>lookup\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n</tool_call>",
                "", false, (struct want[]){{"lookup", "{\"n\": 7}", NULL}}, 1);
    json_decref(tools);
}

Test(toolcall, glm45_malformed_stays_content)
{
    check_kept(MOE_TOOLS_GLM45, "<tool_call>get weather\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>");
    check_kept(MOE_TOOLS_GLM45, "<tool_call>f\n<arg_key>a</arg_key>oops<arg_value>1</arg_value></tool_call>");
    check_kept(MOE_TOOLS_GLM45, "<tool_call>f\n<arg_key>a</arg_key><arg_value>1</tool_call>");
    check_kept(MOE_TOOLS_GLM45, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"); /* hermes' form */
    check_kept(MOE_TOOLS_GLM45, "a <tool_call>f\n<arg_key>a</arg_key>");                        /* cut off */
    check_kept(MOE_TOOLS_GLM45, "x < y <tool_ca");
}

/* ---- kimi_k2: sections, ids functions.NAME:IDX ---- */

#define KB "<|tool_calls_section_begin|>"
#define KE "<|tool_calls_section_end|>"
#define KC "<|tool_call_begin|>"
#define KA "<|tool_call_argument_begin|>"
#define KCE "<|tool_call_end|>"

Test(toolcall, kimi_k2_sections)
{
    check(MOE_TOOLS_KIMI_K2,
          "Checking." KB KC "functions.get_weather:0" KA "{\"city\": \"Paris\"}" KCE KC "functions.add:1" KA
          "{\"a\": 1, \"b\": 2.5}" KCE KE,
          "Checking.",
          (struct want[]){{"get_weather", "{\"city\": \"Paris\"}", "functions.get_weather:0"},
                          {"add", "{\"a\": 1, \"b\": 2.5}", "functions.add:1"}},
          2);
    /* white space around the parts; an id without the functions. prefix */
    check(MOE_TOOLS_KIMI_K2, KB "\n" KC " get_time:3 " KA " {} " KCE "\n" KE "\nDone.", "\nDone.",
          (struct want[]){{"get_time", "{}", "get_time:3"}}, 1);
}

Test(toolcall, kimi_k2_malformed_stays_content)
{
    check_kept(MOE_TOOLS_KIMI_K2, KB KC "functions.f:0 {\"a\": 1}" KCE KE); /* no argument marker */
    check_kept(MOE_TOOLS_KIMI_K2, KB KC "functions.f:0" KA "{\"a\": " KCE KE);
    check_kept(MOE_TOOLS_KIMI_K2, "so " KB KC "functions.f:0" KA "{\"a\"");
    check(MOE_TOOLS_KIMI_K2, KB KC "functions.f:0" KA "[1]" KCE KC "functions.g:1" KA "{}" KCE KE,
          KC "functions.f:0" KA "[1]" KCE, (struct want[]){{"g", "{}", "functions.g:1"}}, 1);
}

/* ---- streaming: content as soon as it is certain, each call once whole ---- */

/* Pushes piece; checks what came out as content and how many calls exist. */
static void step_is(struct moe_tool_calls *tc, const char *piece, const char *want_content, int want_calls)
{
    const char *c;
    cr_assert_eq(moe_tool_calls_push(tc, piece, &c), MOE_OK);
    cr_expect_str_eq(c, want_content, "after \"%s\"", piece);
    cr_expect_eq(tc->n_calls, want_calls, "after \"%s\"", piece);
}

Test(toolcall, streaming_gives_what_is_certain)
{
    struct moe_tool_calls tc;
    const char *c;
    moe_tool_calls_init(&tc, MOE_TOOLS_MISTRAL);
    step_is(&tc, "Hello [TOOL", "Hello ", 0); /* "[TOOL" may begin the marker */
    step_is(&tc, "_CALLS] [{\"name\": \"a\", ", "", 0);
    step_is(&tc, "\"arguments\": {}}]", "", 1); /* the list is complete: the call is there */
    step_is(&tc, " bye", " bye", 1);
    cr_assert_eq(moe_tool_calls_finish(&tc, &c), MOE_OK);
    cr_expect_str_eq(c, "");
    moe_tool_calls_free(&tc);

    moe_tool_calls_init(&tc, MOE_TOOLS_DEEPSEEK_V3);
    step_is(&tc, "Hi <｜tool", "Hi ", 0);
    step_is(&tc, "▁calls▁begin｜>" DS_CALL "a" DS_SEP "{}", "", 0);
    step_is(&tc, DS_CALL_END, "", 1); /* each call as it ends, before the section does */
    step_is(&tc, DS_CALL "b" DS_SEP "{}" DS_CALL_END, "", 2);
    step_is(&tc, DS_END "ok", "ok", 2);
    moe_tool_calls_free(&tc);

    moe_tool_calls_init(&tc, MOE_TOOLS_KIMI_K2);
    step_is(&tc, "x <|tool_calls_sec", "x ", 0);
    step_is(&tc, "tion_begin|>" KC "functions.a:0" KA "{}" KCE, "", 1);
    step_is(&tc, KE " y", " y", 1);
    moe_tool_calls_free(&tc);

    moe_tool_calls_init(&tc, MOE_TOOLS_GLM45);
    step_is(&tc, "a < b <tool_", "a < b ", 0);
    step_is(&tc, "call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n", "", 0);
    step_is(&tc, "</tool_call>\nc", "\nc", 1);
    moe_tool_calls_free(&tc);
}

/* ---- round trips through the real templates ---- */


/* Renders messages with tests/fixtures/chat/<name>.jinja (no generation
 * prompt), checks the format the template implies, cuts out the last
 * assistant turn - from the end of `after` to `until` (or the end) - and
 * parses it: the calls must be the last message's, its content `content`
 * (line breaks around it aside). */
static void round_trip(const char *name, enum moe_tool_format fmt, const char *messages, const char *extra,
                       const char *after, const char *until, const char *content, bool ids)
{
    char path[512];
    snprintf(path, sizeof path, CHAT_DIR "/%s.jinja", name);
    char *src = tu_read_text(path);
    cr_assert_eq(moe_tool_calls_detect(src), fmt, "%s: the template's format", name);
    struct moe_chat_template t;
    cr_assert_eq(moe_chat_template_init(&t, src), MOE_OK, "%s", moe_last_error());
    json_t *msgs = parse_json(messages), *ex = parse_json(extra);
    char *out = NULL;
    cr_assert_eq(moe_chat_template_render(&t, msgs, false, ex, &out), MOE_OK, "%s: %s", name, moe_last_error());
    const char *from = NULL;
    for (const char *p = out; (p = strstr(p, after)); p++) from = p;
    cr_assert(from, "%s: no '%s' in %s", name, after, out);
    from += strlen(after);
    const char *to = until ? strstr(from, until) : NULL;
    char *answer = strndup(from, to ? (size_t)(to - from) : strlen(from));
    /* the calls the message held */
    json_t *calls = json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "tool_calls");
    const int n = (int)json_array_size(calls);
    struct want want[4] = {{NULL, NULL, NULL}};
    char *args[4] = {NULL};
    cr_assert(n > 0 && n <= 4);
    for (int i = 0; i < n; i++) {
        json_t *c = json_array_get(calls, i), *f = json_object_get(c, "function");
        json_t *a = json_object_get(f, "arguments");
        args[i] = json_is_string(a) ? strdup(json_string_value(a)) : json_dumps(a, 0);
        want[i] = (struct want){json_string_value(json_object_get(f, "name")), args[i],
                                ids ? json_string_value(json_object_get(c, "id")) : NULL};
    }
    check_tools(fmt, NULL, answer, content, true, want, n);
    for (int i = 0; i < n; i++) free(args[i]);
    free(answer);
    free(out);
    free(src);
    json_decref(msgs);
    json_decref(ex);
    moe_chat_template_free(&t);
}

#define USER "{\"role\": \"user\", \"content\": \"Weather in Paris, and 1 + 2.5?\"}"
/* a call's arguments as an object (most templates) or as the API's string */
#define OBJ_CALLS(ID1, ID2) \
    "[{\"id\": \"" ID1 "\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": " \
    "{\"city\": \"Paris\", \"unit\": \"celsius\", \"note\": \"\\u00e9 \\\"q\\\"\"}}}, {\"id\": \"" ID2 "\", " \
    "\"type\": \"function\", \"function\": {\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2.5, \"list\": " \
    "[1, {\"k\": null}]}}}]"
#define STR_CALLS \
    "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": " \
    "\"{\\\"city\\\": \\\"Paris\\\", \\\"unit\\\": \\\"celsius\\\"}\"}}, {\"id\": \"c2\", \"type\": " \
    "\"function\", \"function\": {\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2.5}\"}}]"

Test(toolcall, round_trip_mistral_v3)
{
    round_trip("mistral-v3", MOE_TOOLS_MISTRAL,
               "[" USER ", {\"role\": \"assistant\", \"content\": null, \"tool_calls\": " OBJ_CALLS("abcDEF123", "xyz987ABC")
               "}]",
               "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}", "[/INST]", "</s>", "", true);
}

Test(toolcall, round_trip_deepseek_r1)
{
    round_trip("deepseek-r1", MOE_TOOLS_DEEPSEEK_V3,
               "[" USER ", {\"role\": \"assistant\", \"content\": null, \"tool_calls\": " STR_CALLS "}]",
               "{\"bos_token\": \"<｜begin▁of▁sentence｜>\", \"eos_token\": \"<｜end▁of▁sentence｜>\"}", "<｜Assistant｜>",
               "<｜end▁of▁sentence｜>", "", false);
}

Test(toolcall, round_trip_deepseek_v3_1)
{
    round_trip("deepseek-v3.1", MOE_TOOLS_DEEPSEEK_V3,
               "[" USER ", {\"role\": \"assistant\", \"content\": \"Checking.\", \"tool_calls\": " STR_CALLS "}]",
               "{\"bos_token\": \"<｜begin▁of▁sentence｜>\", \"eos_token\": \"<｜end▁of▁sentence｜>\"}", "</think>",
               "<｜end▁of▁sentence｜>", "Checking.", false);
}

Test(toolcall, round_trip_glm_4_6)
{
    round_trip("glm-4.6", MOE_TOOLS_GLM45,
               "[" USER ", {\"role\": \"assistant\", \"content\": \"Let me check.\", \"tool_calls\": "
               OBJ_CALLS("c1", "c2") "}]",
               "{\"eos_token\": \"<|endoftext|>\"}", "</think>", NULL, "Let me check.", false);
}

Test(toolcall, round_trip_kimi_k2)
{
    round_trip("kimi-k2", MOE_TOOLS_KIMI_K2,
               "[" USER ", {\"role\": \"assistant\", \"content\": \"Checking.\", \"tool_calls\": "
               OBJ_CALLS("functions.get_weather:0", "functions.add:1") "}]",
               "{}", "</think>", "<|im_end|>", "Checking.", true);
    /* the API's string arguments, written as they are */
    round_trip("kimi-k2", MOE_TOOLS_KIMI_K2,
               "[" USER ", {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"functions.add:0\", "
               "\"type\": \"function\", \"function\": {\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}}]}]",
               "{}", "</think>", "<|im_end|>", "", true);
}

Test(toolcall, round_trip_qwen3_hermes)
{
    round_trip("qwen3", MOE_TOOLS_HERMES,
               "[" USER ", {\"role\": \"assistant\", \"content\": \"Let me check.\", \"tool_calls\": " OBJ_CALLS("c1", "c2")
               "}]",
               "{\"eos_token\": \"<|im_end|>\"}", "</think>", "<|im_end|>", "Let me check.", false);
}

/* ---- names, detection, ids ---- */

Test(toolcall, detection_from_the_templates)
{
    static const struct {
        const char *file;
        enum moe_tool_format fmt;
    } cases[] = {{"qwen3", MOE_TOOLS_HERMES},         {"qwen2.5", MOE_TOOLS_HERMES},
                 {"mistral-v3", MOE_TOOLS_MISTRAL},    {"mixtral", MOE_TOOLS_NONE},
                 {"deepseek-r1", MOE_TOOLS_DEEPSEEK_V3}, {"deepseek-v3.1", MOE_TOOLS_DEEPSEEK_V3},
                 {"glm-4.6", MOE_TOOLS_GLM45},         {"kimi-k2", MOE_TOOLS_KIMI_K2},
                 {"gpt-oss", MOE_TOOLS_HARMONY},       {"llama3.1", MOE_TOOLS_NONE},
                 {"chatml", MOE_TOOLS_NONE}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, CHAT_DIR "/%s.jinja", cases[i].file);
        char *src = tu_read_text(path);
        cr_expect_eq(moe_tool_calls_detect(src), cases[i].fmt, "%s: %s", cases[i].file,
                     moe_tool_calls_name(moe_tool_calls_detect(src)));
        free(src);
    }
    /* Kimi-K2's first template declared tools without writing calls back */
    cr_expect_eq(moe_tool_calls_detect("{{ '<|im_system|>tool_declare<|im_middle|>' }}"), MOE_TOOLS_KIMI_K2);
    cr_expect_eq(moe_tool_calls_detect(NULL), MOE_TOOLS_NONE);
}

Test(toolcall, names)
{
    static const char *const names[] = {"none", "hermes", "harmony", "mistral", "deepseek_v3", "glm45", "kimi_k2"};
    static const enum moe_tool_format fmts[] = {MOE_TOOLS_NONE, MOE_TOOLS_HERMES, MOE_TOOLS_HARMONY,
                                                MOE_TOOLS_MISTRAL, MOE_TOOLS_DEEPSEEK_V3, MOE_TOOLS_GLM45,
                                                MOE_TOOLS_KIMI_K2};
    for (int i = 0; i < 7; i++) {
        enum moe_tool_format f;
        cr_expect(moe_tool_calls_parse_name(names[i], &f) && f == fmts[i], "%s", names[i]);
        cr_expect_str_eq(moe_tool_calls_name(fmts[i]), names[i]);
    }
    enum moe_tool_format f;
    cr_expect(moe_tool_calls_parse_name("deepseek_v31", &f) && f == MOE_TOOLS_DEEPSEEK_V3);
    cr_expect(!moe_tool_calls_parse_name("glm4", &f));
    cr_expect(!moe_tool_calls_parse_name("auto", &f));
}

/* Mistral's template takes back only ids of nine letters and digits: the
 * ones made for its calls render in the next turn's history. */
Test(toolcall, ids_the_templates_take_back)
{
    struct moe_tool_calls tc;
    moe_tool_calls_init(&tc, MOE_TOOLS_MISTRAL);
    cr_assert(moe_tool_calls_add(&tc, "get_weather", "{\"city\": \"Paris\"}"));
    char a[32], b[32], again[32];
    moe_tool_calls_id(&tc, 0, "chatcmpl-1_0_0", a, sizeof a);
    moe_tool_calls_id(&tc, 0, "chatcmpl-1_0_1", b, sizeof b);
    moe_tool_calls_id(&tc, 0, "chatcmpl-1_0_0", again, sizeof again);
    cr_expect_eq(strlen(a), 9);
    for (int i = 0; i < 9; i++) cr_expect(isalnum((unsigned char)a[i]), "%s", a);
    cr_expect_str_neq(a, b);
    cr_expect_str_eq(a, again);
    char *src = tu_read_text(CHAT_DIR "/mistral-v3.jinja");
    struct moe_chat_template t;
    cr_assert_eq(moe_chat_template_init(&t, src), MOE_OK);
    char msgs[1024];
    snprintf(msgs, sizeof msgs,
             "[" USER ", {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"%s\", \"type\": \"function\", "
             "\"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": "
             "\"tool\", \"tool_call_id\": \"%s\", \"content\": \"sunny\"}]", a, a);
    json_t *m = parse_json(msgs), *ex = parse_json("{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}");
    char *out = NULL;
    cr_expect_eq(moe_chat_template_render(&t, m, true, ex, &out), MOE_OK, "%s", moe_last_error());
    free(out);
    json_decref(m);
    json_decref(ex);
    moe_chat_template_free(&t);
    free(src);
    moe_tool_calls_free(&tc);
    /* others: the id the model wrote, else call_SEED */
    moe_tool_calls_init(&tc, MOE_TOOLS_HERMES);
    cr_assert(moe_tool_calls_add(&tc, "f", "{}"));
    moe_tool_calls_id(&tc, 0, "x_0_0", a, sizeof a);
    cr_expect_str_eq(a, "call_x_0_0");
    moe_tool_calls_free(&tc);
}

/* ---- the markers reach the parser through a decoder that skips special
 * tokens (the server's), in tokenizers that mark them special ---- */

Test(toolcall, special_markers_survive_decoding)
{
    char *text = tu_read_text(FIXTURE_DIR "/tokenizers/deepseek3/tokenizer.json");
    json_t *j = parse_json(text);
    free(text);
    size_t i;
    json_t *a;
    const char *const *marks = moe_tool_calls_markers(MOE_TOOLS_DEEPSEEK_V3);
    int flipped = 0;
    json_array_foreach(json_object_get(j, "added_tokens"), i, a) /* as a tokenizer that marks them special */
        for (int k = 0; marks[k]; k++)
            if (!strcmp(json_string_value(json_object_get(a, "content")), marks[k])) {
                json_object_set_new(a, "special", json_true());
                flipped++;
            }
    cr_assert_eq(flipped, 5);
    char *dumped = json_dumps(j, 0);
    json_decref(j);
    struct moe_tokenizer tok;
    cr_assert_eq(moe_tokenizer_load_json(&tok, dumped, strlen(dumped)), MOE_OK, "%s", moe_last_error());
    free(dumped);
    const char *answer = "Sure." DS_BEGIN DS_CALL "get_weather" DS_SEP "{\"city\": \"Paris\"}" DS_CALL_END DS_END;
    char with_eos[512];
    snprintf(with_eos, sizeof with_eos, "%s<｜end▁of▁sentence｜>", answer);
    int32_t *ids;
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, with_eos, strlen(with_eos), false, &ids, &n, NULL), MOE_OK);
    for (int keep = 0; keep < 2; keep++) {
        struct moe_detok d;
        moe_detok_init(&d, &tok, true);
        if (keep) moe_detok_keep(&d, marks);
        char out[512] = "";
        const char *piece;
        for (size_t k = 0; k < n; k++) {
            cr_assert_eq(moe_detok_push(&d, ids[k], &piece), MOE_OK);
            strcat(out, piece);
        }
        cr_assert_eq(moe_detok_flush(&d, &piece), MOE_OK);
        strcat(out, piece);
        moe_detok_free(&d);
        if (!keep) { /* skipped: the call is gone */
            cr_expect_str_eq(out, "Sure.get_weather{\"city\": \"Paris\"}");
            continue;
        }
        cr_expect_str_eq(out, answer, "the markers kept, the end of sentence still skipped");
        check(MOE_TOOLS_DEEPSEEK_V3, out, "Sure.", (struct want[]){{"get_weather", "{\"city\": \"Paris\"}", NULL}}, 1);
    }
    free(ids);
    moe_tokenizer_free(&tok);
}

/* A forced call (moe_tool_calls_force): the answer, pushed in pieces, is
 * held whole; at the finish a named function's arguments object, or a list
 * of {"name", "parameters"}, become the calls; anything else (a list cut
 * short, an item without parameters) is returned as content, as written. */
static void check_forced(const char *name, const char *text, int want_calls, const char *want_args0)
{
    struct moe_tool_calls tc;
    moe_tool_calls_init(&tc, MOE_TOOLS_HERMES);
    moe_tool_calls_force(&tc, name);
    const char *content;
    char piece[4] = {0};
    for (size_t i = 0, n = strlen(text); i < n; i += 3) {
        strncpy(piece, text + i, 3);
        cr_assert_eq(moe_tool_calls_push(&tc, piece, &content), MOE_OK);
        cr_expect_str_eq(content, "", "no content while the answer is written");
    }
    cr_assert_eq(moe_tool_calls_finish(&tc, &content), MOE_OK);
    cr_expect_eq(tc.n_calls, want_calls, "%s", text);
    cr_expect_str_eq(content, want_calls ? "" : text, "%s", text);
    if (want_calls && want_args0) cr_expect_str_eq(tc.calls[0].arguments, want_args0);
    if (want_calls && name) cr_expect_str_eq(tc.calls[0].name, name);
    moe_tool_calls_free(&tc);
}

Test(toolcall, forced_calls)
{
    check_forced("get_time", "{ \"zone\" :\n \"UTC\" }", 1, "{\"zone\":\"UTC\"}");
    check_forced(NULL, "[{\"name\": \"a\", \"parameters\": {\"x\": 1}}, {\"name\": \"b\", \"parameters\": {}}]", 2,
                 "{\"x\":1}");
    check_forced(NULL, "[{\"name\": \"a\", \"parameters\": {\"x\": 1}}, {\"name\"", 0, NULL);
    check_forced(NULL, "[{\"name\": \"a\"}]", 0, NULL);
    check_forced("f", "{\"zone\"", 0, NULL);
}
