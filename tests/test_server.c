/* test_server.c - `moerun serve` end to end over loopback: each test starts
 * the server on a free port (--port 0 --port-file), waits for /health, drives
 * it with curl or a Python script (tests/server/), and stops it with
 * SIGTERM, expecting a clean exit.  The server dies with the test process
 * (PR_SET_PDEATHSIG) and .fini kills it on failure; every wait is bounded.
 *
 * Model: models/demo-moe (a tokenizer and a ChatML chat template), one CPU
 * thread, a 16 MiB KV cache (1024 blocks of 16 tokens).  The tests of
 * serve's options (queue, timeouts, loading, API key, generation config,
 * --spec) are in test_server_opts.c. */
#include "tests/server_test.h"

TestSuite(server, .init = start_default, .fini = fini, .timeout = 600);

Test(server, completions_equal_moerun_run_streaming_or_not)
{
    static char out[65536], want[4096], text[4096];
    const char *prompts[] = {"Hello", "the river garden", "experts route a dog"};
    for (int i = 0; i < 3; i++) {
        run_text(prompts[i], 20, want, sizeof want);
        char body[512];
        snprintf(body, sizeof body, "{\"model\": \"demo-moe\", \"prompt\": \"%s\", \"max_tokens\": 20, "
                 "\"temperature\": 0}", prompts[i]);
        cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200, "%s", out);
        json_t *j = parse(out);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(ch, "text")), want);
        cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "text_completion");
        cr_assert(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")) >= 1);
        json_decref(j);
        snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 20, \"temperature\": 0, "
                 "\"stream\": true, \"stream_options\": {\"include_usage\": true}}", prompts[i]);
        cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200);
        bool done;
        sse_text(out, text, sizeof text, &done);
        cr_assert(done, "no [DONE]: %s", out);
        cr_assert_str_eq(text, want);
        cr_assert(strstr(out, "\"usage\":{\"prompt_tokens\""), "no usage chunk");
    }
    cr_assert_eq(server_stop(), 0, "the server did not exit cleanly");
}

Test(server, chat_uses_the_template_and_equals_moerun_run)
{
    static char out[65536], want[4096], text[4096];
    run_text("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", 16, want, sizeof want);
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi there\"}], "
                       "\"max_completion_tokens\": 16, \"temperature\": 0}";
    cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s", out);
    json_t *j = parse(out);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_assert_str_eq(json_string_value(json_object_get(msg, "role")), "assistant");
    cr_assert_str_eq(json_string_value(json_object_get(msg, "content")), want);
    json_decref(j);
    body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi there\"}], \"max_tokens\": 16, "
           "\"temperature\": 0, \"stream\": true}";
    cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200);
    bool done;
    sse_text(out, text, sizeof text, &done);
    cr_assert(done);
    cr_assert_str_eq(text, want);
    cr_assert(strstr(out, "\"role\":\"assistant\""), "the first delta carries the role");
    cr_assert_eq(server_stop(), 0);
}

Test(server, sampling_fields_stop_n_logprobs_and_seed)
{
    static char out[65536], want[4096];
    run_text("Hello", 20, want, sizeof want);
    /* a stop string taken from the greedy output: the text ends before it */
    char stop[8] = {0};
    size_t at = 3;
    while (want[at] && !(isalpha((unsigned char)want[at]) && isalpha((unsigned char)want[at + 1]) &&
                         isalpha((unsigned char)want[at + 2])))
        at++;
    cr_assert(want[at], "no ASCII word in the greedy output '%s'", want);
    memcpy(stop, want + at, 3);
    size_t cut = (size_t)(strstr(want, stop) - want);
    json_t *req = json_pack("{s:s, s:i, s:i, s:[s]}", "prompt", "Hello", "max_tokens", 20,
                            "temperature", 0, "stop", stop);
    char *body = json_dumps(req, 0);
    json_decref(req);
    cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200, "%s", out);
    free(body);
    json_t *j = parse(out);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *t = json_string_value(json_object_get(ch, "text"));
    cr_assert(strlen(t) == cut && !strncmp(t, want, cut), "'%s' vs '%s' stop '%s'", t, want, stop);
    cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_decref(j);
    /* n = 3 with a seed: three choices; the same request again gives the same texts */
    const char *nb = "{\"prompt\": \"Hello\", \"max_tokens\": 12, \"temperature\": 1.0, \"top_k\": 40, "
                     "\"top_p\": 0.9, \"min_p\": 0.01, \"repetition_penalty\": 1.1, \"seed\": 7, "
                     "\"n\": 3, \"logprobs\": 2}";
    static char out2[65536];
    cr_assert_eq(http("POST", "/v1/completions", nb, out, sizeof out), 200, "%s", out);
    cr_assert_eq(http("POST", "/v1/completions", nb, out2, sizeof out2), 200);
    json_t *a = parse(out), *b = parse(out2);
    json_t *ca = json_object_get(a, "choices"), *cb = json_object_get(b, "choices");
    cr_assert_eq(json_array_size(ca), 3);
    for (int i = 0; i < 3; i++) {
        json_t *x = json_array_get(ca, i), *y = json_array_get(cb, i);
        cr_assert_eq(json_integer_value(json_object_get(x, "index")), i);
        cr_assert_str_eq(json_string_value(json_object_get(x, "text")),
                         json_string_value(json_object_get(y, "text")));
        json_t *lp = json_object_get(x, "logprobs");
        cr_assert(json_array_size(json_object_get(lp, "tokens")) >= 1);
        cr_assert_eq(json_array_size(json_object_get(lp, "tokens")),
                     json_array_size(json_object_get(lp, "token_logprobs")));
    }
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(a, "usage"), "prompt_tokens")),
                 json_integer_value(json_object_get(json_object_get(b, "usage"), "prompt_tokens")));
    json_decref(a);
    json_decref(b);
    /* streaming n = 2, greedy: both choices are the greedy text */
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 20, "
                      "\"temperature\": 0, \"n\": 2, \"stream\": true}", out, sizeof out), 200);
    for (int i = 0; i < 2; i++) {
        static char t2[4096];
        t2[0] = '\0';
        const char *p = out;
        while ((p = strstr(p, "data: {"))) {
            p += 6;
            const char *end = strstr(p, "\n\n");
            json_t *ev = json_loadb(p, (size_t)(end - p), 0, NULL);
            cr_assert(ev);
            json_t *ch0 = json_array_get(json_object_get(ev, "choices"), 0);
            if (json_integer_value(json_object_get(ch0, "index")) == i)
                strncat(t2, json_string_value(json_object_get(ch0, "text")), sizeof t2 - strlen(t2) - 1);
            json_decref(ev);
            p = end;
        }
        cr_assert_str_eq(t2, want, "choice %d", i);
    }
    cr_assert(strstr(out, "data: [DONE]"));
    /* chat logprobs */
    const char *cb2 = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 4, "
                      "\"temperature\": 0, \"logprobs\": true, \"top_logprobs\": 3}";
    cr_assert_eq(http("POST", "/v1/chat/completions", cb2, out, sizeof out), 200, "%s", out);
    j = parse(out);
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                      "logprobs"), "content");
    cr_assert_eq(json_array_size(content), 4);
    cr_assert_eq(json_array_size(json_object_get(json_array_get(content, 0), "top_logprobs")), 3);
    json_decref(j);
    cr_assert_eq(server_stop(), 0);
}

Test(server, every_bad_input_gets_its_status_and_error)
{
    static char out[65536];
    struct { const char *method, *path, *body; int status; } cases[] = {
        {"POST", "/v1/completions", "{\"prompt\": \"SECRET-1\"", 400},
        {"POST", "/v1/completions", "[\"SECRET-2\"]", 400},
        {"POST", "/v1/completions", "{\"prompt\": 5}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"temperature\": \"hot\"}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"stream\": 1}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"model\": \"SECRET-3\"}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": -5}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 0}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 1000000000000}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2048}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"n\": 0}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"n\": 1000}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"logprobs\": 99}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"logprobs\": -1}", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2, 512]}", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, -2]}", 400},
        {"POST", "/v1/completions", "{\"prompt\": []}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"stop\": [\"\"]}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"echo\": true}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"512\": 5}}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"SECRET-5\": 5}}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"3\": 101}}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": [3]}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"priority\": \"high\"}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"priority\": 1.5}", 400},
        {"POST", "/v1/completions", "{\"prompt\": \"x\", \"priority\": 10000000}", 400},
        {"POST", "/v1/completions", "{}", 400},
        {"POST", "/v1/chat/completions", "{\"messages\": []}", 400},
        {"POST", "/v1/chat/completions", "{\"messages\": [{\"content\": \"SECRET-4\"}]}", 400},
        {"POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                                         "\"max_completion_tokens\": 4000}", 400},
        {"GET", "/v1/nothing", NULL, 404},
        {"GET", "/v1/completions", NULL, 405},
        {"DELETE", "/v1/models", NULL, 405},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int st = http(cases[i].method, cases[i].path, cases[i].body, out, sizeof out);
        cr_assert_eq(st, cases[i].status, "case %zu (%s): status %d: %s", i,
                     cases[i].body ? cases[i].body : cases[i].path, st, out);
        json_t *j = parse(out);
        json_t *e = json_object_get(j, "error");
        cr_assert(json_is_string(json_object_get(e, "message")), "case %zu: %s", i, out);
        cr_assert(json_is_string(json_object_get(e, "type")), "case %zu: %s", i, out);
        cr_assert(json_object_get(e, "param") && json_object_get(e, "code"), "case %zu: %s", i, out);
        cr_assert(!strstr(out, "SECRET"), "case %zu echoes the body: %s", i, out);
        json_decref(j);
    }
    /* a priority in range is served (the engine's order: test_engine_priority.c) */
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2, \"priority\": -3}", out,
                      sizeof out), 200, "%s", out);
    /* the context limit is reported with the numbers */
    http("POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2048}", out, sizeof out);
    cr_assert(strstr(out, "2048") && strstr(out, "2049"), "%s", out);
    /* 413: Content-Length over the limit, and a chunked body counted while read */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "head -c 5000000 /dev/zero | curl -s -m 60 -o /dev/null -w '%%{http_code}' "
             "--data-binary @- %s/v1/completions", sv.base);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "413");
    snprintf(cmd, sizeof cmd, "head -c 5000000 /dev/zero | curl -s -m 60 -o /dev/null -w '%%{http_code}' "
             "-H 'Transfer-Encoding: chunked' --data-binary @- %s/v1/completions", sv.base);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "413");
    /* headers beyond the connection memory: libmicrohttpd's 431 */
    snprintf(cmd, sizeof cmd, "printf 'X-Big: %%s\\n' $(head -c 100000 /dev/zero | tr '\\0' a) > %s/hdr && "
             "curl -s -m 60 -o /dev/null -w '%%{http_code}' -H @%s/hdr %s/health", sv.dir, sv.dir, sv.base);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "431");
    /* and the server keeps serving */
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 3}", out,
                      sizeof out), 200, "%s", out);
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    cr_assert(strstr(out, "moerun_http_requests_total{status=\"400\"} 31"), "%.2000s", out);
    cr_assert_eq(server_stop(), 0);
}

Test(server, health_models_metrics_and_expert_stats)
{
    static char out[262144];
    cr_assert_eq(http("GET", "/v1/models", NULL, out, sizeof out), 200);
    json_t *j = parse(out);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0),
                                                       "id")), "demo-moe");
    json_decref(j);
    /* expert_load: per layer, the K choices of every computed token */
    const char *body = "{\"prompt\": [5, 6, 7, 8, 9], \"max_tokens\": 6, \"temperature\": 0, "
                       "\"ignore_eos\": true, \"moerun\": {\"expert_load\": true}}";
    cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200, "%s", out);
    j = parse(out);
    json_t *el = json_object_get(json_object_get(j, "usage"), "expert_load");
    cr_assert(el, "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(el, "experts")), 16);
    json_t *tokens = json_object_get(el, "tokens");
    cr_assert_eq(json_array_size(tokens), 4);
    for (size_t l = 0; l < 4; l++) {
        json_t *row = json_array_get(tokens, l);
        cr_assert_eq(json_array_size(row), 16);
        long long sum = 0;
        for (size_t e = 0; e < 16; e++) sum += json_integer_value(json_array_get(row, e));
        cr_assert_eq(sum, (5 + 6 - 1) * 4, "layer %zu: %lld", l, sum); /* the last token is not run */
    }
    json_decref(j);
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": [5, 6], \"max_tokens\": 2, "
                      "\"return_expert_load\": true}", out, sizeof out), 200);
    cr_assert(strstr(out, "\"expert_load\""));
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": [5, 6], \"max_tokens\": 2}", out,
                      sizeof out), 200);
    cr_assert(!strstr(out, "expert_load"), "not asked, not given");
    /* metrics */
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    const char *want[] = {"moerun_http_requests_total{status=\"200\"}",
                          "moerun_prompt_tokens_total", "moerun_generation_tokens_total",
                          "moerun_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3",
                          "moerun_inter_token_latency_seconds_count",
                          "moerun_requests_waiting 0", "moerun_requests_running 0",
                          "moerun_kv_blocks{state=\"used\"} 0", "moerun_kv_blocks{state=\"free\"}",
                          "moerun_kv_blocks{state=\"cached\"}", "moerun_kv_blocks_capacity 1024",
                          "moerun_preemptions_total 0", "moerun_expert"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(strstr(out, want[i]), "missing %s in\n%.3000s", want[i], out);
    /* expert statistics: the window, then a reset starts a new one */
    cr_assert_eq(http("GET", "/v1/expert-stats", NULL, out, sizeof out), 200);
    j = parse(out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "format")), "moerun-expert-stats");
    json_decref(j);
    cr_assert_eq(http("POST", "/v1/expert-stats/reset", NULL, out, sizeof out), 200, "%s", out);
    cr_assert(strstr(out, "\"resets\":1"), "%s", out);
    cr_assert_eq(http("GET", "/v1/expert-stats/reset", NULL, out, sizeof out), 405);
    cr_assert_eq(server_stop(), 0);
}

static void python(const char *script, const char *args)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "cd %s && timeout 300 python3 %s %s %s 2>&1", PYDIR, script, sv.base, args);
    int rc = sh(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "%s failed:\n%s", script, out);
    cr_log_info("%s", out);
}

Test(server, concurrent_streams_equal_their_solo_outputs)
{
    if (sh("python3 -c 'import sys' 2>/dev/null", NULL, 0)) cr_skip_test("no python3");
    python("load.py", "24");
    cr_assert_eq(server_stop(), 0);
}

Test(server, disconnect_storm_frees_every_kv_block)
{
    if (sh("python3 -c 'import sys' 2>/dev/null", NULL, 0)) cr_skip_test("no python3");
    python("disconnect.py", "24");
    cr_assert_eq(server_stop(), 0);
}

/* the openai package (with pydantic): installed, or installed now into a
 * folder of the source tree's build area (pip --target works beside a
 * system Python) */
#define PYPATH "PYTHONPATH=" MOERUN_SOURCE_DIR "/build-pydeps "
static void need_openai(void)
{
    if (sh("python3 -c 'import sys' 2>/dev/null", NULL, 0)) cr_skip_test("no python3");
    if (sh(PYPATH "python3 -c 'import openai' 2>/dev/null", NULL, 0))
        sh("timeout 300 python3 -m pip install -q --target " MOERUN_SOURCE_DIR "/build-pydeps openai "
           ">/dev/null 2>&1", NULL, 0);
    cr_assert_eq(sh(PYPATH "python3 -c 'import openai' 2>/dev/null", NULL, 0), 0,
                 "the openai package could not be installed (pip install openai)");
}

/* Structured outputs as the openai client's users write them:
 * chat.completions.parse with 16 Pydantic models, sampled and greedy, and
 * a stream with response_format (tests/server/openai_parse.py): every
 * answer ends with "stop" and parses into its model. */
Test(server, openai_client_parses_pydantic_models)
{
    need_openai();
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd, "cd %s && " PYPATH "timeout 600 python3 openai_parse.py %s demo-moe 2>&1", PYDIR,
             sv.base);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "OK 16 models"), "%s", out);
    cr_log_info("%s", out);
    cr_assert_eq(server_stop(), 0);
}

Test(server, official_openai_client)
{
    need_openai();
    char cmd[1024], out[16384], want[4096];
    snprintf(cmd, sizeof cmd, "cd %s && " PYPATH "timeout 300 python3 openai_client.py %s demo-moe 2>&1",
             PYDIR, sv.base);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    json_t *j = parse(out);
    run_text("Hello", 16, want, sizeof want);
    cr_assert_str_eq(json_string_value(json_object_get(j, "completion")), want);
    cr_assert_str_eq(json_string_value(json_object_get(j, "completion_stream")), want);
    run_text("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 12, want, sizeof want);
    cr_assert_str_eq(json_string_value(json_object_get(j, "chat")), want);
    cr_assert_str_eq(json_string_value(json_object_get(j, "chat_stream")), want);
    cr_assert_eq(json_integer_value(json_object_get(j, "bad_model_status")), 400);
    json_decref(j);
    cr_assert_eq(server_stop(), 0);
}

/* logit_bias: +100 on one token makes greedy decoding repeat it; -100 on
 * the greedy continuation's first token changes it; the text is what the
 * tokenizer decodes. */
/* response_format json_object on both endpoints, streaming too, and the
 * "grammar" field.  The demo model writes stories, so a logit bias of +10
 * on '"' (id 4) and '}' (id 95) makes its JSON strings close within
 * max_tokens (test_grammar_engine.c shows the unbiased outputs). */
Test(server, structured_outputs_json_object_and_grammar)
{
    static char out[65536], text[16384];
    const char *bias = "\"logit_bias\": {\"4\": 10, \"95\": 10}, \"temperature\": 1.0, \"seed\": 3";
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 300, \"n\": 8, %s, "
             "\"response_format\": {\"type\": \"json_object\"}}", bias);
    cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200, "%s", out);
    json_t *j = parse(out), *ch;
    size_t i;
    cr_assert_eq(json_array_size(json_object_get(j, "choices")), 8);
    json_array_foreach(json_object_get(j, "choices"), i, ch) {
        const char *t = json_string_value(json_object_get(ch, "text"));
        json_error_t e;
        json_t *v = json_loads(t, 0, &e);
        cr_assert(json_is_object(v), "choice %zu is not a JSON object (%s): %s", i, e.text, t);
        cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
        json_decref(v);
    }
    json_decref(j);
    /* chat, streamed: the deltas make up one object */
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"Give me JSON\"}], "
             "\"max_tokens\": 300, %s, \"stream\": true, \"response_format\": {\"type\": \"json_object\"}}", bias);
    cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s", out);
    bool done;
    sse_text(out, text, sizeof text, &done);
    cr_assert(done);
    json_error_t e;
    json_t *v = json_loads(text, 0, &e);
    cr_assert(json_is_object(v), "streamed chat content is not a JSON object (%s): %s", e.text, text);
    json_decref(v);
    cr_assert(strstr(out, "\"finish_reason\":\"stop\""), "%s", out);
    /* the grammar extension: only yes or no, sampled */
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 16, "
                      "\"n\": 8, \"temperature\": 1.0, \"seed\": 5, \"grammar\": \"root ::= \\\"yes\\\" | "
                      "\\\"no\\\"\"}", out, sizeof out), 200, "%s", out);
    j = parse(out);
    json_array_foreach(json_object_get(j, "choices"), i, ch) {
        const char *t = json_string_value(json_object_get(ch, "text"));
        cr_assert(!strcmp(t, "yes") || !strcmp(t, "no"), "choice %zu: '%s'", i, t);
        cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    }
    json_decref(j);
    cr_assert_eq(server_stop(), 0);
}

/* A JSON Schema output, checked in C against the schema: the three
 * properties in order, age an integer in 0..120, pet one of the enum. */
static void check_person(const char *t)
{
    json_error_t e;
    json_t *v = json_loads(t, 0, &e);
    cr_assert(json_is_object(v), "not a JSON object (%s): %s", e.text, t);
    cr_assert_eq(json_object_size(v), 3, "%s", t);
    cr_assert(json_is_string(json_object_get(v, "name")), "%s", t);
    json_t *age = json_object_get(v, "age");
    cr_assert(json_is_integer(age) && json_integer_value(age) >= 0 && json_integer_value(age) <= 120, "%s", t);
    const char *pet = json_string_value(json_object_get(v, "pet"));
    cr_assert(pet && (!strcmp(pet, "cat") || !strcmp(pet, "dog")), "%s", t);
    cr_assert(strstr(t, "name") < strstr(t, "age") && strstr(t, "age") < strstr(t, "pet"), "%s", t);
    json_decref(v);
}

/* response_format json_schema on both endpoints, streaming too; a schema
 * outside the subset is a 400 naming the keyword and where it is. */
Test(server, structured_outputs_json_schema)
{
    static char out[65536], text[16384];
    static const char rf[] = "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
        "\"person\", \"strict\": true, \"schema\": {\"type\": \"object\", \"properties\": {\"name\": "
        "{\"type\": \"string\", \"maxLength\": 12}, \"age\": {\"type\": \"integer\", \"minimum\": 0, "
        "\"maximum\": 120}, \"pet\": {\"enum\": [\"cat\", \"dog\"]}}, \"required\": [\"name\", \"age\", "
        "\"pet\"], \"additionalProperties\": false}}}";
    char body[2048];
    snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 200, \"n\": 8, "
             "\"temperature\": 1.0, \"seed\": 3, %s}", rf);
    cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200, "%s", out);
    json_t *j = parse(out), *ch;
    size_t i;
    cr_assert_eq(json_array_size(json_object_get(j, "choices")), 8);
    json_array_foreach(json_object_get(j, "choices"), i, ch) {
        check_person(json_string_value(json_object_get(ch, "text")));
        cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    }
    json_decref(j);
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"Who?\"}], "
             "\"max_tokens\": 200, \"temperature\": 1.0, \"seed\": 4, \"stream\": true, %s}", rf);
    cr_assert_eq(http("POST", "/v1/chat/completions", body, out, sizeof out), 200, "%s", out);
    bool done;
    sse_text(out, text, sizeof text, &done);
    cr_assert(done);
    check_person(text);
    cr_assert_eq(http("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": "
                      "\"Hi\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
                      "\"x\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                      "\"string\", \"propertyNames\": {}}}}}}}", out, sizeof out), 400, "%s", out);
    cr_assert(strstr(out, "unsupported JSON Schema keyword \\\"propertyNames\\\" at /properties/a"), "%s", out);
    cr_assert_eq(server_stop(), 0);
}

Test(server, logit_bias_moves_the_choice)
{
    static char out[65536], want[4096], plain[4096];
    char cmd[1024], ids[256];
    snprintf(cmd, sizeof cmd, "%s tokenize %s ' cat' 2>/dev/null", MOERUN_BINARY, MODEL);
    cr_assert_eq(sh(cmd, ids, sizeof ids), 0);
    const int cat = atoi(ids);
    snprintf(cmd, sizeof cmd, "%s tokenize %s --decode %d,%d,%d 2>/dev/null", MOERUN_BINARY, MODEL, cat, cat, cat);
    cr_assert_eq(sh(cmd, want, sizeof want), 0);
    size_t k = strlen(want);
    if (k && want[k - 1] == '\n') want[k - 1] = '\0';
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\": \"Hello\", \"max_tokens\": 3, \"temperature\": 0, "
             "\"ignore_eos\": true, \"logit_bias\": {\"%d\": 100}}", cat);
    cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200, "%s", out);
    json_t *j = parse(out);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")),
                     want);
    json_decref(j);
    run_text("Hello", 1, plain, sizeof plain);
    /* the first greedy token, pushed down: another token comes out */
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 1, \"temperature\": 0, "
                      "\"logprobs\": 1}", out, sizeof out), 200, "%s", out);
    j = parse(out);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(ch, "text")), plain);
    json_decref(j);
    snprintf(cmd, sizeof cmd, "%s tokenize %s '%.200s' 2>/dev/null", MOERUN_BINARY, MODEL, plain);
    cr_assert_eq(sh(cmd, ids, sizeof ids), 0);
    char b2[512];
    snprintf(b2, sizeof b2, "{\"prompt\": \"Hello\", \"max_tokens\": 1, \"temperature\": 0, "
             "\"logit_bias\": {\"%d\": -100}}", atoi(ids));
    cr_assert_eq(http("POST", "/v1/completions", b2, out, sizeof out), 200, "%s", out);
    j = parse(out);
    cr_expect_str_neq(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")),
                      plain);
    json_decref(j);
}

/* Several prompts in one completions request: n choices each, in prompt
 * order, each what `moerun run` gives that prompt; usage counts every
 * prompt once. */
Test(server, several_prompts_in_one_request)
{
    static char out[65536], a[4096], b[4096];
    run_text("Hello", 12, a, sizeof a);
    run_text("the river garden", 12, b, sizeof b);
    const char *body = "{\"prompt\": [\"Hello\", \"the river garden\"], \"n\": 2, \"max_tokens\": 12, "
                       "\"temperature\": 0}";
    cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200, "%s", out);
    json_t *j = parse(out), *ch = json_object_get(j, "choices");
    cr_assert_eq(json_array_size(ch), 4);
    for (size_t i = 0; i < 4; i++) {
        json_t *c = json_array_get(ch, i);
        cr_expect_eq(json_integer_value(json_object_get(c, "index")), (json_int_t)i);
        cr_expect_str_eq(json_string_value(json_object_get(c, "text")), i < 2 ? a : b, "choice %zu", i);
    }
    char cmd[1024], n1[64], n2[64];
    snprintf(cmd, sizeof cmd, "%s tokenize %s 'Hello' 2>/dev/null | tr ',' '\\n' | wc -l", MOERUN_BINARY, MODEL);
    sh(cmd, n1, sizeof n1);
    snprintf(cmd, sizeof cmd, "%s tokenize %s 'the river garden' 2>/dev/null | tr ',' '\\n' | wc -l",
             MOERUN_BINARY, MODEL);
    sh(cmd, n2, sizeof n2);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")),
                 atoi(n1) + atoi(n2));
    json_decref(j);
    /* ids prompts too, and too many choices is refused */
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": [[1, 2], [3]], \"max_tokens\": 2}", out,
                      sizeof out), 200, "%s", out);
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", "
                      "\"g\", \"h\", \"i\"], \"n\": 2}", out, sizeof out), 400, "%s", out);
    cr_expect(strstr(out, "at most 16"), "%s", out);
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": [\"a\", [1, 99999]]}", out, sizeof out), 400);
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": [\"a\", []]}", out, sizeof out), 400);
}
