/* test_server_reasoning.c - chat completions of reasoning and tool-calling
 * models.  Reasoning: the text of a think block goes to
 * message.reasoning_content (and streamed delta.reasoning_content), the rest
 * to content (runtime/chat/reasoning.h; the parser's cases are in
 * test_reasoning.c).  The demo model is given a chat template that opens the
 * think block in the prompt, as DeepSeek-R1's does, so everything it writes
 * is reasoning; the expected text is what the completions endpoint writes for
 * the same rendered prompt.  Tools: they reach the chat template (Qwen3's),
 * and requests the server cannot honour are refused; the parsing of calls
 * out of the text is tested in test_reasoning.c and test_toolcall.c (the demo
 * model writes none). */
#include "tests/server_test.h"

static const char *const TEMPLATE =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";
/* the template rendered for one user message "the river garden", as JSON */
static const char *const RENDERED =
    "<|im_start|>user\\nthe river garden<|im_end|>\\n<|im_start|>assistant\\n<think>\\n";
static const char *const CHAT =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"the river garden\"}], \"max_tokens\": 12, "
    "\"temperature\": 0%s}";

static char dir[] = "/tmp/moerun-think-XXXXXX";

/* The demo model in `dir` with chat template text (or, NULL, the file
 * template_file of the source tree). */
static void make_model_with(const char *text, const char *template_file)
{
    char cmd[2048];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "for f in config.json model.safetensors tokenizer.json tokenizer_config.json "
             "generation_config.json; do ln -s %s/$f %s/$f; done", MODEL, dir);
    cr_assert_eq(sh(cmd, NULL, 0), 0);
    if (template_file) {
        snprintf(cmd, sizeof cmd, "cp %s/%s %s/chat_template.jinja", MOERUN_SOURCE_DIR, template_file, dir);
        cr_assert_eq(sh(cmd, NULL, 0), 0);
        return;
    }
    snprintf(cmd, sizeof cmd, "%s/chat_template.jinja", dir);
    FILE *f = fopen(cmd, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

static void make_model(void) { make_model_with(TEMPLATE, NULL); }

static void remove_model(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd, NULL, 0);
}

/* The greedy completion of the rendered prompt. */
static void completion_text(char *out, size_t cap)
{
    static char resp[65536];
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 12, \"temperature\": 0}", RENDERED);
    cr_assert_eq(http("POST", "/v1/completions", body, resp, sizeof resp), 200, "%s", resp);
    json_t *j = parse(resp);
    snprintf(out, cap, "%s", json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                               "text")));
    json_decref(j);
    cr_assert(strlen(out) > 0);
}

Test(server_reasoning, think_block_becomes_reasoning_content, .fini = fini, .timeout = 600)
{
    static char out[65536], want[4096], body[1024];
    make_model();
    server_start_model(dir, "");
    char cmd[256];
    snprintf(cmd, sizeof cmd, "grep -c 'reasoning_content (think parser)' %s/log", sv.dir);
    cr_expect_eq(sh(cmd, NULL, 0), 0, "the template's <think> selects the think parser");
    completion_text(want, sizeof want);
    /* whole response */
    snprintf(body, sizeof body, CHAT, "");
    cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s", out);
    json_t *j = parse(out);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_expect_str_eq(json_string_value(json_object_get(msg, "reasoning_content")), want);
    cr_expect_str_eq(json_string_value(json_object_get(msg, "content")), "");
    json_decref(j);
    /* streamed: every piece of text is a reasoning delta */
    snprintf(body, sizeof body, CHAT, ", \"stream\": true");
    cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s", out);
    static char got[4096];
    got[0] = '\0';
    for (const char *p = out; (p = strstr(p, "data: {")); p++) {
        const char *end = strstr(p, "\n\n");
        cr_assert(end);
        json_t *ev = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL);
        cr_assert(ev);
        json_t *d = json_object_get(json_array_get(json_object_get(ev, "choices"), 0), "delta");
        const char *r = json_string_value(json_object_get(d, "reasoning_content"));
        const char *c = json_string_value(json_object_get(d, "content"));
        if (r) strncat(got, r, sizeof got - strlen(got) - 1);
        cr_expect(!c || !*c, "a content delta '%s' in a reasoning-only answer", c ? c : "");
        json_decref(ev);
    }
    cr_expect_str_eq(got, want);
    cr_assert_eq(server_stop(), 0);
    remove_model();
}

Test(server_reasoning, parser_none_keeps_the_text_as_content, .fini = fini, .timeout = 600)
{
    static char out[65536], want[4096], body[1024];
    make_model();
    server_start_model(dir, "--reasoning-parser none");
    completion_text(want, sizeof want);
    snprintf(body, sizeof body, CHAT, "");
    cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s", out);
    json_t *j = parse(out);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_expect_str_eq(json_string_value(json_object_get(msg, "content")), want);
    cr_expect(!json_object_get(msg, "reasoning_content"), "no reasoning field without a parser");
    json_decref(j);
    cr_assert_eq(server_stop(), 0);
    remove_model();
}

Test(server_reasoning, unknown_parser_is_refused)
{
    char cmd[512], out[1024];
    snprintf(cmd, sizeof cmd, "%s serve %s --reasoning-parser r1 2>&1", MOERUN_BINARY, MODEL);
    cr_expect_neq(sh(cmd, out, sizeof out), 0);
    cr_expect(strstr(out, "'r1'"), "%s", out);
}

/* ---- tools ---- */

static int prompt_tokens(const char *body)
{
    static char out[65536];
    cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s", out);
    json_t *j = parse(out);
    int n = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    cr_expect(!json_object_get(json_object_get(ch, "message"), "tool_calls"), "no call was written");
    json_decref(j);
    return n;
}

/* With Qwen3's template (hermes <tool_call> format), tools reach the
 * template (the prompt grows by their schemas) unless tool_choice is none;
 * an unknown tool_choice and malformed tools are refused. */
Test(server_reasoning, tools_reach_the_template, .fini = fini, .timeout = 600)
{
    static char out[65536];
    char cmd[2048];
    make_model_with(NULL, "tests/fixtures/chat/qwen3.jinja");
    server_start_model(dir, "");
    snprintf(cmd, sizeof cmd, "grep -c 'tool_calls (hermes format)' %s/log", sv.dir);
    cr_expect_eq(sh(cmd, NULL, 0), 0, "Qwen3's template selects the hermes format");
#define MSG "\"messages\": [{\"role\": \"user\", \"content\": \"weather in Oslo?\"}], \"max_tokens\": 4"
#define TOOLS "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", " \
              "\"description\": \"Current weather\", \"parameters\": {\"type\": \"object\", " \
              "\"properties\": {\"city\": {\"type\": \"string\"}}}}}]"
    const int plain = prompt_tokens("{" MSG "}");
    const int with = prompt_tokens("{" MSG ", " TOOLS "}");
    const int none = prompt_tokens("{" MSG ", " TOOLS ", \"tool_choice\": \"none\"}");
    cr_expect_gt(with, plain + 20, "the tools' schema is in the prompt (%d vs %d tokens)", with, plain);
    cr_expect_eq(none, plain, "tool_choice none leaves the tools out");
    /* a call and its result in the history: arguments as the API sends them
     * (a JSON string) render as the object itself */
#define TURN(ARGS) "{\"messages\": [{\"role\": \"user\", \"content\": \"weather in Oslo?\"}, " \
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": " \
    "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": " ARGS "}}]}, " \
    "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"12 C\"}], \"max_tokens\": 4, " TOOLS "}"
    const int as_string = prompt_tokens(TURN("\"{\\\"city\\\": \\\"Oslo\\\"}\""));
    const int as_object = prompt_tokens(TURN("{\"city\": \"Oslo\"}"));
    cr_expect_eq(as_string, as_object, "arguments as a string render as the object");
    cr_expect_gt(as_object, with, "the call and its result are in the prompt");
    /* template variables: Qwen3's enable_thinking false writes an empty think
     * block into the prompt */
    const int no_think = prompt_tokens("{" MSG ", \"chat_template_kwargs\": {\"enable_thinking\": false}}");
    cr_expect_gt(no_think, plain, "enable_thinking false reaches the template (%d vs %d)", no_think, plain);
    cr_expect_eq(http("POST", "/v1/chat/completions", "{" MSG ", \"chat_template_kwargs\": [1]}", out,
                      sizeof out), 400, "%s", out);
    cr_expect_eq(http("POST", "/v1/chat/completions", "{" MSG ", \"reasoning_effort\": \"max\"}", out,
                      sizeof out), 400, "%s", out);
    cr_expect_eq(http("POST", "/v1/chat/completions", "{" MSG ", " TOOLS ", \"tool_choice\": \"always\"}",
                      out, sizeof out), 400, "%s", out);
    cr_expect(strstr(out, "tool_choice"), "%s", out);
    cr_expect_eq(http("POST", "/v1/chat/completions", "{" MSG ", \"tools\": [{\"type\": \"function\"}]}", out,
                      sizeof out), 400, "%s", out);
    cr_expect(strstr(out, "tools[0]"), "%s", out);
    cr_assert_eq(server_stop(), 0);
    remove_model();
}

/* A forced call's tools: get_weather(city: Oslo | Bergen), get_time(zone: UTC | CET). */
#define FTOOLS "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": " \
    "{\"type\": \"object\", \"properties\": {\"city\": {\"enum\": [\"Oslo\", \"Bergen\"]}}, \"required\": [\"city\"], " \
    "\"additionalProperties\": false}}}, {\"type\": \"function\", \"function\": {\"name\": \"get_time\", " \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"zone\": {\"enum\": [\"UTC\", \"CET\"]}}, " \
    "\"required\": [\"zone\"], \"additionalProperties\": false}}}]"
#define FMSG "\"messages\": [{\"role\": \"user\", \"content\": \"weather in Oslo?\"}], \"max_tokens\": 400, " \
    "\"temperature\": 0"

/* Call k of a choice's tool_calls: its name and arguments the tool's schema accepts. */
static const char *expect_call(json_t *calls, size_t k)
{
    json_t *f = json_object_get(json_array_get(calls, k), "function");
    const char *name = json_string_value(json_object_get(f, "name"));
    const char *text = json_string_value(json_object_get(f, "arguments"));
    cr_assert(name && text, "call %zu has a name and arguments", k);
    json_t *a = parse(text);
    const bool weather = !strcmp(name, "get_weather");
    const char *v = json_string_value(json_object_get(a, weather ? "city" : "zone"));
    cr_expect(weather || !strcmp(name, "get_time"), "call %zu names a tool: %s", k, name);
    cr_expect(json_object_size(a) == 1 && v &&
                  (weather ? !strcmp(v, "Oslo") || !strcmp(v, "Bergen") : !strcmp(v, "UTC") || !strcmp(v, "CET")),
              "call %zu: %s(%s) is outside its schema", k, name, text);
    json_decref(a);
    return name;
}

/* Forcing a call (tool_choice "required" or a named function): a grammar
 * makes the model write it as JSON, whatever the template's format; the
 * answer is message.tool_calls (arguments the tool's schema accepts),
 * finish_reason "tool_calls", no content; streamed, a tool_calls delta; cut
 * short by max_tokens, the text as written.  (The tiny demo model, free to
 * list calls, lists them until max_tokens: the "required" cases here take
 * parallel_tool_calls false, a list of one.)  Unknown names, malformed
 * choices and a response_format beside are 400s. */
Test(server_reasoning, forced_tool_calls, .fini = fini, .timeout = 600)
{
    static char out[65536];
    make_model_with(NULL, "tests/fixtures/chat/qwen3.jinja");
    server_start_model(dir, "");
    const char *cases[] = {
        "{" FMSG ", " FTOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}}",
        "{" FMSG ", " FTOOLS ", \"tool_choice\": \"required\", \"parallel_tool_calls\": false}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_eq(http("POST", "/v1/chat/completions", cases[i], out, sizeof out), 200, "%s", out);
        json_t *j = parse(out), *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *msg = json_object_get(ch, "message"), *calls = json_object_get(msg, "tool_calls");
        cr_expect_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls", "case %zu: %s", i,
                         out);
        const char *content = json_string_value(json_object_get(msg, "content"));
        cr_expect(!content || !*content, "case %zu: no content: %s", i, out);
        cr_assert(json_array_size(calls) >= 1, "case %zu: %s", i, out);
        cr_expect_eq(json_array_size(calls), 1, "case %zu: one call: %s", i, out);
        for (size_t k = 0; k < json_array_size(calls); k++) {
            const char *name = expect_call(calls, k);
            if (i == 0) cr_expect_str_eq(name, "get_time", "the named function");
        }
        json_decref(j);
    }
    /* cut short by max_tokens: no call, the text as written is the content */
    cr_assert_eq(http("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                      "\"max_tokens\": 6, " FTOOLS ", \"tool_choice\": \"required\"}", out, sizeof out), 200, "%s", out);
    json_t *j = parse(out), *ch = json_array_get(json_object_get(j, "choices"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "length", "%s", out);
    cr_expect(!json_object_get(json_object_get(ch, "message"), "tool_calls"), "%s", out);
    const char *content = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
    cr_expect(content && content[0] == '[', "the list begun is the content: %s", out);
    json_decref(j);
    /* streamed: the call arrives as a tool_calls delta, then finish_reason */
    cr_assert_eq(http("POST", "/v1/chat/completions", "{" FMSG ", " FTOOLS ", \"tool_choice\": \"required\", "
                      "\"parallel_tool_calls\": false, \"stream\": true}", out, sizeof out), 200, "%s", out);
    const char *d = strstr(out, "\"tool_calls\"");
    cr_expect(d && strstr(out, "\"finish_reason\":\"tool_calls\"") && strstr(out, "data: [DONE]"), "%s", out);
    const char *bad[][2] = {
        {"{" FMSG ", " FTOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"nope\"}}}",
         "not among the tools"},
        {"{" FMSG ", " FTOOLS ", \"tool_choice\": {\"type\": \"function\"}}", "a named tool_choice"},
        {"{" FMSG ", " FTOOLS ", \"tool_choice\": \"required\", \"response_format\": {\"type\": \"json_object\"}}",
         "give either"},
        {"{" FMSG ", " FTOOLS ", \"tool_choice\": \"required\", \"parallel_tool_calls\": 1}", "parallel_tool_calls"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(http("POST", "/v1/chat/completions", bad[i][0], out, sizeof out), 400, "%s", out);
        cr_expect(strstr(out, bad[i][1]), "bad case %zu: %s", i, out);
    }
    cr_assert_eq(server_stop(), 0);
    remove_model();
}

/* A template with no tool format: tools are refused, not ignored. */
Test(server_reasoning, tools_without_a_format_are_refused, .fini = fini, .timeout = 600)
{
    static char out[65536];
    server_start("");
    cr_expect_eq(http("POST", "/v1/chat/completions", "{" MSG ", " TOOLS "}", out, sizeof out), 400, "%s", out);
    cr_expect(strstr(out, "tool call format"), "%s", out);
    cr_assert_eq(server_stop(), 0);
}

/* Strict tools under tool_choice "auto" (SGLang's way): the mistral
 * template, and the demo model with a tokenizer whose [TOOL_CALLS] is one
 * token (tests/reference/make_toolcall_tokenizer.py), biased so that the
 * model calls: with "strict": true every call it writes has arguments its
 * schema accepts; the same request without "strict" gets no such call (the
 * demo model writes stories after the marker). */
#define STOOLS(strict) "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", " \
    "\"strict\": " strict ", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"enum\": " \
    "[\"Oslo\", \"Bergen\"]}}, \"required\": [\"city\"], \"additionalProperties\": false}}}, {\"type\": " \
    "\"function\", \"function\": {\"name\": \"get_time\", \"strict\": " strict ", \"parameters\": {\"type\": " \
    "\"object\", \"properties\": {\"zone\": {\"enum\": [\"UTC\", \"CET\"]}}, \"required\": [\"zone\"], " \
    "\"additionalProperties\": false}}}]"
#define SMSG "\"messages\": [{\"role\": \"user\", \"content\": \"weather in Oslo?\"}], \"max_tokens\": 400, " \
    "\"logit_bias\": {\"511\": 30}, \"tool_choice\": \"auto\", \"parallel_tool_calls\": false"

Test(server_reasoning, strict_tools_constrain_auto_calls, .fini = fini, .timeout = 600)
{
    static char out[65536];
    char cmd[1024];
    make_model_with(NULL, "tests/fixtures/chat/mistral-v3.jinja");
    snprintf(cmd, sizeof cmd, "rm %s/tokenizer.json && cp %s/tests/fixtures/toolcall_tokenizer/tokenizer.json %s/",
             dir, MOERUN_SOURCE_DIR, dir);
    cr_assert_eq(sh(cmd, NULL, 0), 0);
    server_start_model(dir, "");
    for (int temp = 0; temp < 2; temp++) {
        char body[4096];
        snprintf(body, sizeof body, "{" SMSG ", \"temperature\": %d, \"seed\": 5, " STOOLS("true") "}", temp);
        cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s", out);
        json_t *j = parse(out), *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *calls = json_object_get(json_object_get(ch, "message"), "tool_calls");
        cr_log_info("strict, temperature %d: %zu calls: %.600s", temp, json_array_size(calls), out);
        cr_assert_geq(json_array_size(calls), 2, "%s", out);
        for (size_t k = 0; k < json_array_size(calls); k++) expect_call(calls, k);
        json_decref(j);
        snprintf(body, sizeof body, "{" SMSG ", \"temperature\": %d, \"seed\": 5, " STOOLS("false") "}", temp);
        cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s", out);
        j = parse(out);
        ch = json_array_get(json_object_get(j, "choices"), 0);
        calls = json_object_get(json_object_get(ch, "message"), "tool_calls");
        cr_log_info("not strict, temperature %d: %.300s", temp, out);
        cr_assert_eq(json_array_size(calls), 0, "%s", out);
        json_decref(j);
    }
    cr_assert_eq(server_stop(), 0);
    remove_model();
}

/* The MoE families' templates select their tool formats, and a history
 * with a call (its arguments a JSON string, as the API sends them) renders:
 * DeepSeek's templates concatenate the arguments as text, so the messages
 * go as sent when the object form fails; the others take the object. */
Test(server_reasoning, tool_formats_of_the_families, .fini = fini, .timeout = 600)
{
    static const struct {
        const char *file, *fmt, *id;
    } cases[] = {
        {"tests/fixtures/chat/mistral-v3.jinja", "mistral", "abcDEF123"},
        {"tests/fixtures/chat/deepseek-r1.jinja", "deepseek_v3", "c1"},
        {"tests/fixtures/chat/deepseek-v3.1.jinja", "deepseek_v3", "c1"},
        {"tests/fixtures/chat/glm-4.6.jinja", "glm45", "c1"},
        {"tests/fixtures/chat/kimi-k2.jinja", "kimi_k2", "functions.get_weather:0"},
    };
    static char out[65536], body[4096];
    char cmd[2048];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        strcpy(dir, "/tmp/moerun-think-XXXXXX");
        make_model_with(NULL, cases[i].file);
        server_start_model(dir, "");
        snprintf(cmd, sizeof cmd, "grep -c 'tool_calls (%s format)' %s/log", cases[i].fmt, sv.dir);
        cr_expect_eq(sh(cmd, NULL, 0), 0, "%s selects %s", cases[i].file, cases[i].fmt);
        const int plain = prompt_tokens("{" MSG ", " TOOLS "}");
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"weather in Oslo?\"}, {\"role\": \"assistant\", "
                 "\"content\": null, \"tool_calls\": [{\"id\": \"%s\", \"type\": \"function\", \"function\": "
                 "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}}]}, {\"role\": "
                 "\"tool\", \"tool_call_id\": \"%s\", \"content\": \"12 C\"}], \"max_tokens\": 4, " TOOLS "}",
                 cases[i].id, cases[i].id);
        cr_expect_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s: %s", cases[i].file, out);
        json_t *j = parse(out);
        const int with_call = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
        json_decref(j);
        cr_expect_gt(with_call, plain, "%s: the call and its result are in the prompt", cases[i].file);
        cr_assert_eq(server_stop(), 0);
        remove_model();
    }
}

Test(server_reasoning, unknown_tool_parser_is_refused)
{
    char cmd[512], out[1024];
    snprintf(cmd, sizeof cmd, "%s serve %s --tool-call-parser glm4 2>&1", MOERUN_BINARY, MODEL);
    cr_expect_neq(sh(cmd, out, sizeof out), 0);
    cr_expect(strstr(out, "'glm4'") && strstr(out, "kimi_k2"), "%s", out);
}
