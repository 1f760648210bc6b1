/* test_server_opts.c - `moerun serve`'s options end to end, with the setup
 * of test_server.c (server_test.h): --timeout closing idle connections,
 * --max-queue answering 429 while the engine is held (engine_gate.h), 503
 * while the model loads, a chat endpoint without a template, --api-key,
 * the generation config's sampling defaults, and --spec's output and
 * metrics. */
#include "tests/server_test.h"
#include "tests/engine_gate.h"

/* An idle connection is closed after --timeout. */
Test(server_queue, idle_connection_is_closed, .fini = fini, .timeout = 600)
{
    server_start("--timeout 2");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sv.port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char byte;
    cr_assert_eq(recv(fd, &byte, 1, 0), 0, "the idle connection was not closed");
    close(fd);
    cr_assert_eq(server_stop(), 0);
}

/* A long stream in the background: curl's body in DIR/NAME.out, the HTTP
 * status in DIR/NAME.code. */
static pid_t stream_bg(const char *name)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec curl -sN -m 300 -o %1$s/%2$s.out -w '%%{http_code}' "
             "%3$s/v1/completions -d '{\"prompt\": \"Hello\", \"max_tokens\": 64, \"ignore_eos\": true, "
             "\"stream\": true}' >%1$s/%2$s.code 2>/dev/null", sv.dir, name, sv.base);
    return spawn_shell(cmd);
}

/* Waits (up to 300 s) for that stream to end: 200 and [DONE]. */
static void stream_done(pid_t pid, const char *name)
{
    int st = 0;
    pid_t w = 0;
    for (int i = 0; i < 30000 && (w = waitpid(pid, &st, WNOHANG)) == 0; i++) sleep_ms(10);
    cr_assert_eq(w, pid, "stream %s did not end", name);
    char cmd[256], out[64];
    snprintf(cmd, sizeof cmd, "cat %s/%s.code", sv.dir, name);
    sh(cmd, out, sizeof out);
    cr_assert_str_eq(out, "200", "stream %s", name);
    snprintf(cmd, sizeof cmd, "grep -c 'data: \\[DONE\\]' %s/%s.out", sv.dir, name);
    cr_assert_eq(sh(cmd, NULL, 0), 0, "stream %s has no [DONE]", name);
}

/* Both gauges, as /metrics shows them now. */
static void gauges(int *running, int *waiting)
{
    static char out[65536];
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    const char *r = strstr(out, "\nmoerun_requests_running "), *w = strstr(out, "\nmoerun_requests_waiting ");
    cr_assert(r && w, "%.2000s", out);
    *running = atoi(r + strlen("\nmoerun_requests_running "));
    *waiting = atoi(w + strlen("\nmoerun_requests_waiting "));
}

/* --max-queue: one request running and one waiting (--max-seqs 1 --max-queue
 * 1), a third gets 429; once the queue drains, requests get 200 again.  The
 * test holds that state itself, not a timing window: the engine thread
 * stops at the entry of each engine step until the test lets one step run
 * (engine_gate.h), so A cannot finish and B cannot start while C is sent.
 * --no-stats: /metrics then needs no lock the held engine thread has. */
Test(server_queue, full_queue_gets_429, .fini = gate_fini, .timeout = 600)
{
    server_start("--max-seqs 1 --max-queue 1 --no-stats");
    gate_arm(sv.pid);
    const pid_t a = stream_bg("a");
    gate_hold(); /* A accepted; its first step is next */
    gate_step(); /* A ran one step */
    int running, waiting;
    gauges(&running, &waiting);
    cr_assert(running == 1 && waiting == 0, "running %d waiting %d", running, waiting);
    const pid_t b = stream_bg("b");
    for (int i = 0; i < 6000 && waiting != 1; i++) { /* B queued (its client is slower than us) */
        gauges(&running, &waiting);
        if (waiting != 1) sleep_ms(10);
    }
    cr_assert_eq(waiting, 1, "B was not queued");
    gate_step(); /* A ran its second step; the engine took B, which waits for A's slot */
    gauges(&running, &waiting);
    cr_assert(running == 1 && waiting == 1, "running %d waiting %d", running, waiting);
    static char out[65536];
    cr_assert_eq(http("GET", "/health", NULL, out, sizeof out), 200, "the HTTP side answers");
    const int c = http("POST", "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 2}", out, sizeof out);
    cr_assert_eq(c, 429, "the third request got %d, not 429 (0: no answer in 60 s)", c);
    cr_assert(strstr(out, "\"rate_limit_error\"") && strstr(out, "\"queue_full\""), "%s", out);
    gauges(&running, &waiting);
    cr_assert(running == 1 && waiting == 1, "the refused request left the queue as it was");
    /* the gate opens: A and B run to their end, and the queue is empty */
    gate_release();
    stream_done(a, "a");
    stream_done(b, "b");
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 2}", out,
                      sizeof out), 200, "%s", out);
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    cr_assert(strstr(out, "moerun_http_requests_total{status=\"429\"} 1\n"), "%.2000s", out);
    cr_assert_eq(server_stop(), 0);
}

/* /health and the API answer 503 while the model loads, then 200.  The test
 * holds the loading state itself: the model folder's tokenizer.json is a
 * FIFO, so the server waits in its tokenizer load until the test writes the
 * real file into it (twice: the HTTP side and the engine each load one). */
Test(server_queue, loading_answers_503_then_ready, .fini = fini, .timeout = 600)
{
    strcpy(sv.dir, "/tmp/moerun-serve-XXXXXX");
    cr_assert(mkdtemp(sv.dir));
    char cmd[4096], out[4096];
    snprintf(cmd, sizeof cmd,
             "mkdir %1$s/m && for f in config.json generation_config.json model.safetensors "
             "tokenizer_config.json; do ln -s %2$s/$f %1$s/m/$f; done && mkfifo %1$s/m/tokenizer.json",
             sv.dir, MODEL);
    cr_assert_eq(sh(cmd, NULL, 0), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd,
             "exec %s serve %s/m --port 0 --backend cpu --threads 1 --kv-budget 16MiB 2>%s/log",
             MOERUN_BINARY, sv.dir, sv.dir);
    sv.pid = spawn_shell(cmd);
    snprintf(cmd, sizeof cmd, "sed -n 's/.*listening on http:\\/\\/127.0.0.1:\\([0-9]*\\).*/\\1/p' %s/log",
             sv.dir);
    for (int i = 0; i < 600 && !sv.port; i++) {
        sh(cmd, out, sizeof out);
        sv.port = atoi(out);
        if (!sv.port) sleep_ms(20);
    }
    cr_assert(sv.port > 0, "no port in the log");
    snprintf(sv.base, sizeof sv.base, "http://127.0.0.1:%d", sv.port);
    cr_assert_eq(http("GET", "/health", NULL, out, sizeof out), 503, "%s", out);
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"Hello\"}", out, sizeof out), 503);
    cr_assert(strstr(out, "\"error\"") && strstr(out, "loading"), "%s", out);
    /* release the load, one copy per open: a writer that opens the FIFO
     * while the first reader still has it open appends to that reader's
     * stream, so the second copy waits until the first reader has closed.
     * The server's descriptor shows in /proc only once its open returns,
     * which can be after the first copy is in the pipe; the test holds the
     * write end open until it sees that descriptor (the reader cannot reach
     * end of file and close before), then closes it and waits for the
     * descriptor to go.  The second open then waits for the second cat. */
    snprintf(cmd, sizeof cmd, "timeout 120 sh -c 'exec 3>%2$s/m/tokenizer.json && "
             "cat %1$s/tokenizer.json >&3 && "
             "until ls -l /proc/%3$d/fd 2>/dev/null | grep -q m/tokenizer.json; do sleep 0.01; done && "
             "exec 3>&- && "
             "while ls -l /proc/%3$d/fd 2>/dev/null | grep -q m/tokenizer.json; do sleep 0.01; done && "
             "cat %1$s/tokenizer.json > %2$s/m/tokenizer.json'", MODEL, sv.dir, (int)sv.pid);
    cr_assert_eq(sh(cmd, NULL, 0), 0, "the server did not read its tokenizer twice");
    int st = 0;
    for (int i = 0; i < 600 && st != 200; i++) {
        st = http("GET", "/health", NULL, out, sizeof out);
        if (st != 200) sleep_ms(100);
    }
    cr_assert_eq(st, 200);
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 2}", out,
                      sizeof out), 200, "%s", out);
    cr_assert_eq(server_stop(), 0);
}

/* A model without a chat template: completions work, chat is refused. */
Test(server_queue, chat_without_a_template_is_refused, .fini = fini, .timeout = 600)
{
    server_start_model(MOERUN_SOURCE_DIR "/tests/fixtures/qwen3_moe", "--served-model-name tiny");
    char out[8192];
    cr_assert_eq(http("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", "
                      "\"content\": \"hi\"}]}", out, sizeof out), 400, "%s", out);
    cr_assert(strstr(out, "no chat template"), "%s", out);
    cr_assert_eq(http("POST", "/v1/completions", "{\"model\": \"tiny\", \"prompt\": [1, 2, 3], "
                      "\"max_tokens\": 3}", out, sizeof out), 200, "%s", out);
    cr_assert_eq(http("GET", "/v1/models", NULL, out, sizeof out), 200);
    cr_assert(strstr(out, "\"id\":\"tiny\""), "%s", out);
    cr_assert_eq(server_stop(), 0);
}

/* --api-key: /v1/ wants the bearer key (401 in OpenAI's shape otherwise);
 * /health and /metrics stay open. */
Test(server_auth, api_key_guards_the_v1_endpoints, .fini = fini, .timeout = 600)
{
    server_start("--api-key 's3cret key'");
    static char out[65536];
    cr_expect_eq(http("GET", "/v1/models", NULL, out, sizeof out), 401, "%s", out);
    cr_expect(strstr(out, "\"authentication_error\"") && strstr(out, "invalid_api_key"), "%s", out);
    cr_expect_eq(http("POST", "/v1/completions", "{\"prompt\": \"Hi\", \"max_tokens\": 2}", out,
                      sizeof out), 401);
    cr_expect_eq(http("GET", "/metrics", NULL, out, sizeof out), 200, "metrics stay open");
    char cmd[1024], code[16];
    const char *keys[] = {"Bearer s3cret key", "Bearer s3cret ke", "Bearer s3cret keyy", "s3cret key"};
    const int want[] = {200, 401, 401, 401};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "curl -s -m 30 -o /dev/null -w '%%{http_code}' -H 'Authorization: %s' "
                 "%s/v1/models", keys[i], sv.base);
        sh(cmd, code, sizeof code);
        cr_expect_eq(atoi(code), want[i], "header '%s': %s", keys[i], code);
    }
    snprintf(cmd, sizeof cmd, "curl -s -m 60 -H 'Authorization: Bearer s3cret key' -H 'Content-Type: "
             "application/json' -d '{\"prompt\": \"Hello\", \"max_tokens\": 4, \"temperature\": 0}' "
             "%s/v1/completions", sv.base);
    sh(cmd, out, sizeof out);
    cr_expect(strstr(out, "\"text_completion\""), "%s", out);
    cr_assert_eq(server_stop(), 0);
}

/* The model's generation_config.json sampling values are the defaults of a
 * request that leaves them out (as vLLM's server does): temperature 0
 * there makes a request without one greedy, equal to `moerun run --temp 0`;
 * --generation-config none keeps the API's temperature 1. */
Test(server_auth, generation_config_sets_the_sampling_defaults, .fini = fini, .timeout = 600)
{
    char dir[] = "/tmp/moerun-gencfg-XXXXXX", cmd[2048];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "for f in config.json model.safetensors tokenizer.json tokenizer_config.json; "
             "do ln -s %s/$f %s/$f; done", MODEL, dir);
    cr_assert_eq(sh(cmd, NULL, 0), 0);
    json_t *g = json_load_file(MODEL "/generation_config.json", 0, NULL);
    cr_assert(g);
    json_object_set_new(g, "temperature", json_real(0.0));
    snprintf(cmd, sizeof cmd, "%s/generation_config.json", dir);
    cr_assert_eq(json_dump_file(g, cmd, 0), 0);
    json_decref(g);
    static char out[65536], want[4096];
    run_text("the river garden", 16, want, sizeof want);
    const char *body = "{\"prompt\": \"the river garden\", \"max_tokens\": 16, \"seed\": 7}";
    server_start_model(dir, "");
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200, "%s", out);
        json_t *j = parse(out);
        cr_expect_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                           "text")), want);
        json_decref(j);
    }
    snprintf(cmd, sizeof cmd, "grep -c 'sampling default(s) from generation_config.json' %s/log", sv.dir);
    cr_expect_eq(sh(cmd, NULL, 0), 0, "the server says where its defaults come from");
    cr_assert_eq(server_stop(), 0);
    server_start_model(dir, "--generation-config none");
    int differ = 0;
    for (int seed = 1; seed <= 4; seed++) { /* temperature 1: some seed leaves the greedy path */
        char b[256];
        snprintf(b, sizeof b, "{\"prompt\": \"the river garden\", \"max_tokens\": 16, \"seed\": %d}", seed);
        cr_assert_eq(http("POST", "/v1/completions", b, out, sizeof out), 200, "%s", out);
        json_t *j = parse(out);
        differ += strcmp(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                           "text")), want) != 0;
        json_decref(j);
    }
    cr_expect(differ > 0, "with --generation-config none a request samples at temperature 1");
    cr_assert_eq(server_stop(), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(sh(cmd, NULL, 0), 0);
}

/* --- speculative decoding (serve --spec) --- */

/* A story prompt of the demo model that quotes itself, so n-grams match. */
#define SPEC_PROMPT                                                                                            \
    "Once upon a time, there was a little cat named Lily. Lily liked to play in the park. One day, Lily "   \
    "found a ball near the river. Lily felt happy. Then Lily met a kind dog. They decided to run together. " \
    "The end. Once upon a time, there was a little cat named Lily. Lily liked to"

/* The value of the /metrics sample that starts with `sample ` (-1: none). */
static long long metric(const char *text, const char *sample)
{
    char key[256];
    snprintf(key, sizeof key, "\n%s ", sample);
    const char *p = strstr(text, key);
    return p ? atoll(p + strlen(key)) : -1;
}

static void spec_start(void) { server_start("--spec ngram --spec-tokens 4"); }

/* A speculative server: a greedy request's text equals the plain one's
 * (moerun run without --spec), with "speculative": false too; a
 * "speculative" that is not a boolean is refused by name; /metrics counts
 * drafts, drafted and accepted tokens (per position up to K) that add up. */
Test(server_spec, greedy_output_field_and_metrics, .init = spec_start, .fini = fini, .timeout = 600)
{
    static char out[65536], want[8192], body[2048];
    run_text(SPEC_PROMPT, 40, want, sizeof want);
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    cr_expect_eq(metric(out, "moerun_spec_decode_num_drafts_total"), 0, "%s", out);
    const char *fields[] = {"", ", \"speculative\": true", ", \"speculative\": false", ", \"speculative\": null"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 40, \"temperature\": 0%s}", SPEC_PROMPT,
                 fields[i]);
        cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 200, "%s: %s", fields[i], out);
        json_t *j = parse(out);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        cr_expect_str_eq(json_string_value(json_object_get(ch, "text")), want, "%s", fields[i]);
        json_decref(j);
    }
    const char *bad[] = {"\"no\"", "0", "1", "{}", "[false]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"max_tokens\": 4, \"speculative\": %s}", bad[i]);
        cr_assert_eq(http("POST", "/v1/completions", body, out, sizeof out), 400, "%s: %s", bad[i], out);
        json_t *j = parse(out), *e = json_object_get(j, "error");
        cr_expect_str_eq(json_string_value(json_object_get(e, "param")), "speculative", "%s", out);
        cr_expect(strstr(json_string_value(json_object_get(e, "message")), "'speculative' must be true or false"),
                  "%s", out);
        json_decref(j);
    }
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    const long long drafts = metric(out, "moerun_spec_decode_num_drafts_total"),
                    drafted = metric(out, "moerun_spec_decode_num_draft_tokens_total"),
                    accepted = metric(out, "moerun_spec_decode_num_accepted_tokens_total");
    cr_expect(drafts > 0, "%s", out);
    cr_expect(drafted >= drafts && drafted <= 4 * drafts, "%lld drafts, %lld drafted", drafts, drafted);
    cr_expect(accepted >= 0 && accepted <= drafted, "%lld accepted of %lld", accepted, drafted);
    long long sum = 0, prev = -1;
    for (int i = 0; i < 4; i++) {
        char name[128];
        snprintf(name, sizeof name, "moerun_spec_decode_num_accepted_tokens_per_pos_total{position=\"%d\"}", i);
        const long long v = metric(out, name);
        cr_expect(v >= 0, "no %s", name);
        cr_expect(prev < 0 || v <= prev, "position %d accepted more often than %d", i, i - 1);
        sum += v;
        prev = v;
    }
    cr_expect_eq(sum, accepted, "the positions' counts add up to the accepted tokens");
    cr_expect(!strstr(out, "position=\"4\""), "positions past K");
    /* the HELP and TYPE lines */
    cr_expect(strstr(out, "# TYPE moerun_spec_decode_num_drafts_total counter\n"), "%s", out);
    cr_expect(strstr(out, "# HELP moerun_spec_decode_num_accepted_tokens_per_pos_total "), "%s", out);
    cr_expect(strstr(out, "# TYPE moerun_spec_decode_num_accepted_tokens_per_pos_total counter\n"), "%s", out);
    cr_expect(strstr(out, "# TYPE moerun_spec_decode_num_draft_tokens_total counter\n"), "%s", out);
    cr_expect(strstr(out, "# TYPE moerun_spec_decode_num_accepted_tokens_total counter\n"), "%s", out);
    cr_assert_eq(server_stop(), 0, "the server did not exit cleanly");
}

/* A plain server shows no speculation metrics, and takes the field. */
Test(server_spec, plain_server_has_no_spec_metrics, .init = start_default, .fini = fini, .timeout = 600)
{
    static char out[65536];
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2, \"speculative\": false}",
                      out, sizeof out), 200, "%s", out);
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    cr_expect(!strstr(out, "spec_decode"), "%s", out);
    cr_assert_eq(server_stop(), 0, "the server did not exit cleanly");
}
