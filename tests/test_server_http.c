/* test_server_http.c - `moerun serve` where HTTP itself is abused and at
 * shutdown: raw requests on loopback sockets (framing the server must
 * refuse, a header deadline, a per-address connection cap, errors counted
 * in /metrics), the OpenAI shapes the API must get exactly (content parts,
 * response_format, roles, logit_bias keys, logprobs, models), and SIGTERM
 * with requests in flight (the engine thread held with engine_gate.h so
 * that the requests are certainly running when the signal comes).  Every
 * wait is bounded; the setup is test_server.c's (server_test.h). */
#include "tests/server_test.h"
#include "tests/engine_gate.h"

/* Sends a raw request; the answer must be one response of the status with
 * an OpenAI error body, after which the server closed the connection. */
static void expect_one_error(const char *req, int status, const char *needle)
{
    static char out[65536];
    const long n = raw_exchange(req, strlen(req), out, sizeof out, 30);
    cr_assert(n > 0, "no answer within 30 s to: %.200s", req);
    char want[32];
    snprintf(want, sizeof want, "HTTP/1.1 %d ", status);
    cr_assert(!strncmp(out, want, strlen(want)), "want %d, got: %.500s", status, out);
    cr_assert(!strstr(out + 1, "HTTP/1."), "more than one response: %.2000s", out);
    const char *body = strstr(out, "\r\n\r\n");
    cr_assert(body, "%s", out);
    json_t *j = parse(body + 4);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    cr_assert(msg && strstr(msg, needle), "want '%s' in %s", needle, body + 4);
    json_decref(j);
}

/* The value of a /metrics sample line ("name{labels} value"), 0 when absent. */
static long long metric(const char *text, const char *series)
{
    char key[256];
    snprintf(key, sizeof key, "\n%s ", series);
    const char *p = strstr(text, key);
    return p ? atoll(p + strlen(key)) : 0;
}

TestSuite(server_http, .init = start_default, .fini = fini, .timeout = 600);

/* RFC 9112 6.3: differing Content-Length values are an unrecoverable
 * framing error.  The bytes after the first length are not a second request. */
Test(server_http, conflicting_content_length_is_refused_and_closed)
{
    expect_one_error("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\nContent-Length: 60\r\n\r\n"
                     "{\"prompt\": \"Hi\"}GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                     400, "conflicting Content-Length");
    expect_one_error("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "0\r\n\r\n", 400, "both Transfer-Encoding and Content-Length");
    cr_assert_eq(server_stop(), 0);
}

/* A transfer coding other than chunked is answered at once (501), not
 * waited on. */
Test(server_http, transfer_coding_other_than_chunked_gets_501)
{
    expect_one_error("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                     501, "only chunked");
    cr_assert_eq(server_stop(), 0);
}

/* %00 in a path is refused, never routed as the path before it. */
Test(server_http, nul_in_the_path_is_refused)
{
    expect_one_error("GET /health%00junk HTTP/1.1\r\nHost: x\r\n\r\n", 400, "NUL");
    expect_one_error("POST /v1/completions%00abc HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n"
                     "{\"prompt\": \"Hi\"}", 400, "NUL");
    static char out[65536];
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    cr_assert_eq(metric(out, "moerun_generation_tokens_total"), 0, "a completion ran: %.2000s", out);
    cr_assert_eq(server_stop(), 0);
}

/* Errors libmicrohttpd answers itself (bad chunking, headers over the
 * memory limit, a malformed Content-Length) are counted by their status. */
Test(server_http, http_layer_errors_are_counted_by_status)
{
    static char out[65536], big[80000];
    snprintf(big, sizeof big, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: %070000d\r\n\r\n", 0);
    const char *reqs[] = {
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        big,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"};
    for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++)
        cr_assert(raw_exchange(reqs[i], strlen(reqs[i]), out, sizeof out, 30) > 0, "no answer to %s", reqs[i]);
    /* a connection is counted when libmicrohttpd has finished with it,
     * which may be after the client saw it close */
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
        if (metric(out, "moerun_http_requests_total{status=\"400\"}") == 2 &&
            metric(out, "moerun_http_requests_total{status=\"431\"}") == 1)
            break;
        sleep_ms(10);
    }
    cr_assert_eq(metric(out, "moerun_http_requests_total{status=\"400\"}"), 2, "%.1500s", out);
    cr_assert_eq(metric(out, "moerun_http_requests_total{status=\"431\"}"), 1, "%.1500s", out);
    cr_assert_eq(server_stop(), 0);
}

/* The metric names follow Prometheus' rules as promtool checks them: a
 * counter ends in _total, nothing else does, and _sum, _count, _bucket
 * belong to histograms. */
Test(server_http, metric_names_follow_the_prometheus_rules)
{
    static char out[262144];
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 2}", out, sizeof out), 200);
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    int families = 0;
    for (const char *p = strstr(out, "# TYPE "); p; p = strstr(p + 1, "# TYPE ")) {
        char name[128], type[32];
        cr_assert_eq(sscanf(p, "# TYPE %127s %31s", name, type), 2);
        const size_t n = strlen(name);
        const bool total = n > 6 && !strcmp(name + n - 6, "_total");
        if (!strcmp(type, "counter")) cr_assert(total, "counter %s does not end in _total", name);
        else cr_assert(!total, "%s %s ends in _total", type, name);
        const char *reserved[] = {"_sum", "_count", "_bucket"};
        for (size_t r = 0; r < 3; r++) {
            const size_t k = strlen(reserved[r]);
            cr_assert(n <= k || strcmp(name + n - k, reserved[r]), "%s ends in the reserved %s", name, reserved[r]);
        }
        families++;
    }
    cr_assert_gt(families, 10);
    cr_assert(metric(out, "moerun_kv_blocks_capacity") == 1024, "%.3000s", out);
    cr_assert(strstr(out, "moerun_expert_routing_weight_total{"), "%.3000s", out);
    cr_assert_eq(server_stop(), 0);
}

/* GET /v1/models: a real "created"; /v1/models/{id} for the served model,
 * a 404 error object for any other id. */
Test(server_http, models_created_and_by_id)
{
    static char out[8192];
    cr_assert_eq(http("GET", "/v1/models", NULL, out, sizeof out), 200);
    json_t *j = parse(out);
    const long long created = json_integer_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "created"));
    json_decref(j);
    cr_assert(created > 1600000000 && created <= (long long)time(NULL), "created %lld", created);
    cr_assert_eq(http("GET", "/v1/models/demo-moe", NULL, out, sizeof out), 200, "%s", out);
    j = parse(out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "id")), "demo-moe");
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "model");
    cr_assert_eq(json_integer_value(json_object_get(j, "created")), created);
    json_decref(j);
    cr_assert_eq(http("GET", "/v1/models/gpt-4", NULL, out, sizeof out), 404, "%s", out);
    cr_assert(strstr(out, "\"not_found_error\"") && strstr(out, "gpt-4"), "%s", out);
    cr_assert_eq(server_stop(), 0);
}

/* Content as a list of text parts equals the same text as a string; other
 * parts, unknown roles, non-canonical logit_bias keys, malformed grammars,
 * unsupported JSON Schemas and tool_choice without tools are refused with a 400. */
Test(server_http, chat_fields_read_as_openai_defines_them)
{
    static char a[16384], b[16384];
    cr_assert_eq(http("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": "
                      "\"Hi\\nthere\"}], \"max_tokens\": 8, \"temperature\": 0}", a, sizeof a), 200, "%s", a);
    cr_assert_eq(http("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": "
                      "[{\"type\": \"text\", \"text\": \"Hi\"}, {\"type\": \"text\", \"text\": \"there\"}]}], "
                      "\"max_tokens\": 8, \"temperature\": 0}", b, sizeof b), 200, "%s", b);
    json_t *ja = parse(a), *jb = parse(b);
    cr_assert(json_equal(json_object_get(ja, "choices"), json_object_get(jb, "choices")), "%s\n%s", a, b);
    static const char *counts[] = {"prompt_tokens", "completion_tokens", "total_tokens"};
    for (int i = 0; i < 3; i++) /* (the second may find the first's prompt in the prefix cache) */
        cr_assert(json_equal(json_object_get(json_object_get(ja, "usage"), counts[i]),
                             json_object_get(json_object_get(jb, "usage"), counts[i])), "%s\n%s", a, b);
    json_decref(ja);
    json_decref(jb);
    const struct { const char *body, *needle; } bad[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": "
         "\"http://x\"}}]}]}", "content[0] is of type 'image_url'"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", "content[0].text"},
        {"{\"messages\": [{\"role\": \"wizard\", \"content\": \"Hi\"}]}", "messages[0].role must be one of"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"logit_bias\": {\" 5\": 10}}", "logit_bias key"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"logit_bias\": {\"05\": 10}}", "logit_bias key"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"grammar\": \"root ::= \\\"a\"}",
         "grammar: line 1, column 10: string literal is not closed with '\\\"'"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"grammar\": \"root ::= x\"}",
         "grammar: line 1, column 10: rule 'x' is used but not defined"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"grammar\": 5}", "'grammar' must be a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"grammar\": \"root ::= \\\"a\\\"\", "
         "\"response_format\": {\"type\": \"json_object\"}}", "give either 'grammar' or a JSON response_format"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"response_format\": {\"type\": "
         "\"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"not\": {}}}}}",
         "unsupported JSON Schema keyword \\\"not\\\" at the root"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"response_format\": {\"type\": "
         "\"json_schema\", \"json_schema\": {\"name\": \"x\"}}}", "'json_schema.schema' is missing"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"response_format\": \"json\"}", "response_format"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tool_choice\": 123}", "tool_choice"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tool_choice\": \"required\"}", "tool_choice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(http("POST", "/v1/chat/completions", bad[i].body, a, sizeof a), 400, "%s: %s", bad[i].body, a);
        cr_assert(strstr(a, bad[i].needle), "%s: want '%s' in %s", bad[i].body, bad[i].needle, a);
    }
    const char *good[] = {
        "{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief\"}, {\"role\": \"user\", \"content\": "
        "\"Hi\"}], \"max_tokens\": 2, \"response_format\": {\"type\": \"text\"}, \"tool_choice\": \"none\", "
        "\"logit_bias\": {\"5\": 1, \"0\": -1}}"};
    cr_assert_eq(http("POST", "/v1/chat/completions", good[0], a, sizeof a), 200, "%s", a);
    cr_assert_eq(server_stop(), 0);
}

/* Chat logprobs carry each token's UTF-8 bytes; completion logprobs the
 * tokens' offsets in the text. */
Test(server_http, logprobs_bytes_and_text_offset)
{
    static char out[65536];
    cr_assert_eq(http("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                      "\"max_tokens\": 6, \"temperature\": 0, \"logprobs\": true, \"top_logprobs\": 2}", out,
                      sizeof out), 200, "%s", out);
    json_t *j = parse(out);
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"),
                                      "content"), *e;
    size_t i;
    cr_assert_gt(json_array_size(content), 0, "%s", out);
    json_array_foreach(content, i, e) {
        const char *tok = json_string_value(json_object_get(e, "token"));
        json_t *bytes = json_object_get(e, "bytes");
        cr_assert(json_is_array(bytes), "%s", out);
        cr_assert_eq(json_array_size(bytes), strlen(tok));
        for (size_t k = 0; k < strlen(tok); k++)
            cr_assert_eq(json_integer_value(json_array_get(bytes, k)), (unsigned char)tok[k]);
        cr_assert(json_is_array(json_object_get(json_array_get(json_object_get(e, "top_logprobs"), 0), "bytes")));
    }
    json_decref(j);
    cr_assert_eq(http("POST", "/v1/completions", "{\"prompt\": \"Hello\", \"max_tokens\": 6, \"temperature\": 0, "
                      "\"logprobs\": 1}", out, sizeof out), 200, "%s", out);
    j = parse(out);
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *tokens = json_object_get(lp, "tokens"), *offs = json_object_get(lp, "text_offset");
    cr_assert_eq(json_array_size(offs), json_array_size(tokens), "%s", out);
    long long want = 0;
    json_array_foreach(tokens, i, e) {
        cr_assert_eq(json_integer_value(json_array_get(offs, i)), want, "token %zu: %s", i, out);
        const char *t = json_string_value(e);
        for (size_t k = 0; t[k]; k++) want += ((unsigned char)t[k] & 0xC0) != 0x80;
    }
    json_decref(j);
    cr_assert_eq(server_stop(), 0);
}

/* --api-key: a 401 is counted as 401. */
Test(server_opts, unauthorized_is_counted_as_401, .fini = fini, .timeout = 600)
{
    server_start("--api-key sekret");
    static char out[65536];
    cr_assert_eq(http("GET", "/v1/models", NULL, out, sizeof out), 401);
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    cr_assert_eq(metric(out, "moerun_http_requests_total{status=\"401\"}"), 1, "%.1500s", out);
    cr_assert(!strstr(out, "status=\"5"), "%.1500s", out);
    cr_assert_eq(server_stop(), 0);
}

/* Headers that stop coming are cut at --header-timeout, long before the
 * idle timeout. */
Test(server_opts, partial_headers_meet_the_header_deadline, .fini = fini, .timeout = 600)
{
    server_start("--header-timeout 1 --timeout 3600");
    int fd = raw_connect(120);
    cr_assert(fd >= 0);
    const char *part = "GET /health HTTP/1.1\r\nHost: x\r\n";
    cr_assert_eq(send(fd, part, strlen(part), MSG_NOSIGNAL), (ssize_t)strlen(part));
    char buf[4096];
    cr_assert_eq(raw_read_all(fd, buf, sizeof buf), 0, "the connection was not closed within 120 s");
    close(fd);
    /* a whole request on a connection is then held by the idle timeout only */
    static char out[4096];
    cr_assert_eq(http("GET", "/health", NULL, out, sizeof out), 200);
    cr_assert_eq(server_stop(), 0);
}

/* --max-conns-per-ip: one address past the cap is turned away; the others'
 * connections keep working. */
Test(server_opts, connections_per_address_are_capped, .fini = fini, .timeout = 600)
{
    server_start("--max-conns-per-ip 2");
    int a = raw_connect(30), b = raw_connect(30);
    cr_assert(a >= 0 && b >= 0);
    int c = raw_connect(30);
    char buf[4096];
    if (c >= 0) { /* accepted by the kernel, closed by the server */
        const char *req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
        (void)send(c, req, strlen(req), MSG_NOSIGNAL);
        cr_assert_eq(raw_read_all(c, buf, sizeof buf), 0, "a third connection was served: %s", buf);
        close(c);
    }
    close(a);
    const char *req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    cr_assert_eq(send(b, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    cr_assert_gt(raw_read_all(b, buf, sizeof buf), 0);
    cr_assert(!strncmp(buf, "HTTP/1.1 200", 12), "%s", buf);
    close(b);
    cr_assert_eq(server_stop(), 0);
}

/* --- shutdown --- */

/* Waits (up to 60 s) for a line in the server's log. */
static void log_wait(const char *needle)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "grep -q '%s' %s/log", needle, sv.dir);
    int rc = 1;
    for (int i = 0; i < 6000 && rc; i++) {
        rc = sh(cmd, NULL, 0);
        if (rc) sleep_ms(10);
    }
    cr_assert_eq(rc, 0, "no '%s' in the server's log", needle);
}

/* Waits (up to 60 s) for the server to exit; its exit status (-1: signal). */
static int exit_wait(void)
{
    int st = 0;
    pid_t w = 0;
    for (int i = 0; i < 6000 && (w = waitpid(sv.pid, &st, WNOHANG)) == 0; i++) sleep_ms(10);
    cr_assert_eq(w, sv.pid, "the server did not exit within 60 s");
    sv.pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A request in the background: curl's body in DIR/NAME.out, the status in
 * DIR/NAME.code. */
static pid_t request_bg(const char *name, bool stream, int max_tokens)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec curl -sN -m 300 -o %1$s/%2$s.out -w '%%{http_code}' "
             "%3$s/v1/completions -d '{\"prompt\": \"Hello\", \"max_tokens\": %4$d, \"ignore_eos\": true, "
             "\"stream\": %5$s}' >%1$s/%2$s.code 2>/dev/null", sv.dir, name, sv.base, max_tokens,
             stream ? "true" : "false");
    return spawn_shell(cmd);
}

/* Waits (up to 300 s) for that request to end with HTTP status code; its
 * body in out. */
static void request_done_with(pid_t pid, const char *name, const char *code_want, char *out,
                              size_t cap)
{
    int st = 0;
    pid_t w = 0;
    for (int i = 0; i < 30000 && (w = waitpid(pid, &st, WNOHANG)) == 0; i++) sleep_ms(10);
    cr_assert_eq(w, pid, "request %s did not end", name);
    char cmd[256], code[64];
    snprintf(cmd, sizeof cmd, "cat %s/%s.code", sv.dir, name);
    sh(cmd, code, sizeof code);
    cr_assert_str_eq(code, code_want, "request %s", name);
    snprintf(cmd, sizeof cmd, "cat %s/%s.out", sv.dir, name);
    sh(cmd, out, cap);
}

static void request_done(pid_t pid, const char *name, char *out, size_t cap)
{
    request_done_with(pid, name, "200", out, cap);
}

/* The waiting gauge as /metrics shows it (needs --no-stats while held). */
static int waiting_now(void)
{
    static char out[65536];
    cr_assert_eq(http("GET", "/metrics", NULL, out, sizeof out), 200);
    return (int)metric(out, "moerun_requests_waiting");
}

/* SIGTERM with a stream running: the port closes, the stream runs to its
 * end ([DONE], finish_reason "length"), the server exits 0. */
Test(server_drain, running_requests_finish_after_sigterm, .fini = gate_fini, .timeout = 600)
{
    server_start("--no-stats");
    gate_arm(sv.pid);
    const pid_t a = request_bg("a", true, 40);
    gate_hold(); /* A accepted; its first step is next */
    kill(sv.pid, SIGTERM);
    log_wait("draining");
    const int fd = raw_connect(30);
    cr_assert_eq(fd, -1, "the server still accepts connections while draining");
    gate_release();
    static char out[65536];
    request_done(a, "a", out, sizeof out);
    cr_assert(strstr(out, "\"finish_reason\":\"length\"") && strstr(out, "data: [DONE]"), "%s", out);
    cr_assert(!strstr(out, "\"error\""), "%s", out);
    cr_assert_eq(exit_wait(), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", sv.dir);
    sh(cmd, NULL, 0);
}

/* --drain-timeout 0: a running stream ends with finish_reason "abort", an
 * error event and [DONE]; a running non-streaming request is answered 503
 * with the error object; the server exits 0. */
Test(server_drain, drain_timeout_ends_each_request_with_an_error, .fini = gate_fini, .timeout = 600)
{
    server_start("--no-stats --drain-timeout 0");
    gate_arm(sv.pid);
    const pid_t a = request_bg("a", true, 1500);
    gate_hold(); /* A accepted (and waiting in the engine until this step) */
    gate_step(); /* A ran one step: nothing waits */
    const pid_t b = request_bg("b", false, 1500);
    int waiting = 0;
    for (int i = 0; i < 6000 && waiting != 1; i++) { /* B queued */
        waiting = waiting_now();
        if (waiting != 1) sleep_ms(10);
    }
    cr_assert_eq(waiting, 1, "B was not queued");
    gate_step(); /* the engine took B and accepted it */
    kill(sv.pid, SIGTERM);
    log_wait("drain timeout: ending 2 running");
    gate_release();
    static char out[65536];
    request_done(a, "a", out, sizeof out);
    const char *fin = strstr(out, "\"finish_reason\":\"abort\""), *err = strstr(out, "data: {\"error\":"),
               *done = strstr(out, "data: [DONE]");
    cr_assert(fin && err && done && fin < err && err < done, "%s", out);
    cr_assert(strstr(err, "\"service_unavailable\""), "%s", err);
    request_done_with(b, "b", "503", out, sizeof out);
    json_t *j = parse(out);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "type")), "service_unavailable",
                     "%s", out);
    json_decref(j);
    cr_assert_eq(exit_wait(), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", sv.dir);
    sh(cmd, NULL, 0);
}

/* A second signal while draining exits at once (status 1). */
Test(server_drain, second_signal_exits_at_once, .fini = gate_fini, .timeout = 600)
{
    server_start("--no-stats --drain-timeout 3600");
    gate_arm(sv.pid);
    const pid_t a = request_bg("a", true, 40);
    gate_hold();
    kill(sv.pid, SIGTERM);
    log_wait("draining");
    kill(sv.pid, SIGTERM);
    /* the traced engine thread is reaped by us, its tracer, before the
     * process's exit is reported */
    int st = 0;
    pid_t w = 0;
    for (int i = 0; i < 6000 && w == 0; i++) {
        if (gate.tid && waitpid(gate.tid, NULL, __WALL | WNOHANG) == gate.tid) gate.tid = 0;
        w = waitpid(sv.pid, &st, WNOHANG);
        if (w == 0) sleep_ms(10);
    }
    cr_assert_eq(w, sv.pid, "the server did not exit within 60 s of the second signal");
    sv.pid = 0;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %#x", st);
    gate.tid = 0;
    waitpid(a, &st, 0); /* curl sees the connection close */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", sv.dir);
    sh(cmd, NULL, 0);
}

/* usage.prompt_tokens_details.cached_tokens: what the prefix cache gave
 * the prompt, none the first time, whole blocks of it the second. */
Test(server_http, usage_counts_cached_prompt_tokens)
{
    static char a[16384], b[16384];
    const char *body = "{\"prompt\": \"Once upon a time, there was a little girl named Lily. She liked to play "
                       "outside with her ball. One day, she saw a big dog near the tree.\", \"max_tokens\": 2, "
                       "\"temperature\": 0}";
    cr_assert_eq(http("POST", "/v1/completions", body, a, sizeof a), 200, "%s", a);
    cr_assert_eq(http("POST", "/v1/completions", body, b, sizeof b), 200, "%s", b);
    json_t *ja = parse(a), *jb = parse(b);
    json_t *ua = json_object_get(ja, "usage"), *ub = json_object_get(jb, "usage");
    const json_int_t n = json_integer_value(json_object_get(ua, "prompt_tokens")),
                     ca = json_integer_value(json_object_get(json_object_get(ua, "prompt_tokens_details"), "cached_tokens")),
                     cb = json_integer_value(json_object_get(json_object_get(ub, "prompt_tokens_details"), "cached_tokens"));
    cr_assert(n > 32, "%s", a);
    cr_expect(json_is_integer(json_object_get(json_object_get(ua, "prompt_tokens_details"), "cached_tokens")), "%s", a);
    cr_expect_eq(ca, 0, "the first time: %s", a);
    cr_expect(cb >= 16 && cb < n, "the second time %lld of %lld prompt tokens cached: %s", (long long)cb, (long long)n, b);
    json_decref(ja);
    json_decref(jb);
}

