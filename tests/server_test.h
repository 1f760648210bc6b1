/* server_test.h - what the server suites share: start `moerun serve` on a
 * free port with a model, wait for /health, drive it with curl, stop it
 * with SIGTERM expecting a clean exit (test_server.c describes the setup).
 * One server per test process at a time (the static `sv`). */
#pragma once

#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#define MODEL MOERUN_SOURCE_DIR "/models/demo-moe"
#define PYDIR MOERUN_SOURCE_DIR "/tests/server"

static struct {
    pid_t pid;
    int port;
    char dir[64];
    char base[64];
} sv;

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Runs a shell command; stdout into out (NUL-terminated); exit status. */
static inline int sh(const char *cmd, char *out, size_t n)
{
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    size_t got = 0, k;
    char sink[4096];
    while ((k = fread(out && got + 1 < n ? out + got : sink, 1,
                      out && got + 1 < n ? n - 1 - got : sizeof sink, p)) > 0)
        if (out && got + 1 < n) got += k;
    if (out) out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* An HTTP request with curl; returns the status, the body in out. */
static inline int http(const char *method, const char *path, const char *body, char *out, size_t n)
{
    char file[128], cmd[1024];
    snprintf(file, sizeof file, "%s/body", sv.dir);
    if (body) {
        FILE *f = fopen(file, "w");
        cr_assert(f);
        fputs(body, f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd,
             "curl -s -m 60 -X %s %s%s -o %s/resp -w '%%{http_code}' %s%s", method,
             body ? "-H 'Content-Type: application/json' --data-binary @" : "", body ? file : "",
             sv.dir, sv.base, path);
    char code[16];
    sh(cmd, code, sizeof code);
    snprintf(cmd, sizeof cmd, "cat %s/resp 2>/dev/null", sv.dir);
    sh(cmd, out, n);
    return atoi(code);
}

/* Runs cmd with /bin/sh in a child that dies with the test process. */
static inline pid_t spawn_shell(const char *cmd)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* A new loopback connection to the server (SO_RCVTIMEO wait_s); -1 when
 * refused. */
static inline int raw_connect(int wait_s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sv.port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {wait_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Reads from fd until the server closes it; out NUL-terminated.  Returns
 * the bytes read, or -1 when a read waited past the connection's timeout. */
static inline long raw_read_all(int fd, char *out, size_t cap)
{
    size_t got = 0;
    for (;;) {
        ssize_t k = recv(fd, out + got, cap - 1 - got, 0);
        if (k == 0 || (k < 0 && errno == ECONNRESET)) break;
        if (k < 0) {
            out[got] = '\0';
            return -1;
        }
        got += (size_t)k;
        if (got + 1 >= cap) break;
    }
    out[got] = '\0';
    return (long)got;
}

/* Sends data (n bytes) on a new connection and reads the answer until the
 * server closes the connection, waiting at most wait_s per read. */
static inline long raw_exchange(const char *data, size_t n, char *out, size_t cap, int wait_s)
{
    int fd = raw_connect(wait_s);
    cr_assert(fd >= 0, "cannot connect to the server");
    (void)send(fd, data, n, MSG_NOSIGNAL); /* the server may answer and close before it has all */
    long got = raw_read_all(fd, out, cap);
    close(fd);
    return got;
}

static inline void server_start_model(const char *model, const char *extra);
static inline void server_start(const char *extra) { server_start_model(MODEL, extra); }

static inline void server_start_model(const char *model, const char *extra)
{
    strcpy(sv.dir, "/tmp/moerun-serve-XXXXXX");
    cr_assert(mkdtemp(sv.dir));
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec %s serve %s --port 0 --port-file %s/port --backend cpu --threads 1 "
             "--kv-budget 16MiB %s 2>%s/log", MOERUN_BINARY, model, sv.dir, extra, sv.dir);
    const pid_t pid = spawn_shell(cmd);
    sv.pid = pid;
    char path[128], buf[64];
    snprintf(path, sizeof path, "%s/port", sv.dir);
    for (int i = 0; i < 600 && !sv.port; i++) { /* 60 s at most (sanitizer builds are slow) */
        FILE *f = fopen(path, "r");
        if (f) {
            if (fgets(buf, sizeof buf, f)) sv.port = atoi(buf);
            fclose(f);
        }
        if (!sv.port) {
            cr_assert(waitpid(pid, NULL, WNOHANG) == 0, "the server exited during start-up");
            sleep_ms(100);
        }
    }
    cr_assert(sv.port > 0, "the server did not start");
    snprintf(sv.base, sizeof sv.base, "http://127.0.0.1:%d", sv.port);
    char out[256];
    int st = 0;
    for (int i = 0; i < 100 && st != 200; i++) {
        st = http("GET", "/health", NULL, out, sizeof out);
        if (st != 200) sleep_ms(100);
    }
    cr_assert_eq(st, 200, "/health never became ready");
}

/* SIGTERM, then up to 30 s for a clean exit; SIGKILL after.  Exit status. */
static inline int server_stop(void)
{
    if (sv.pid <= 0) return -1;
    kill(sv.pid, SIGTERM);
    int st = 0;
    pid_t w = 0;
    for (int i = 0; i < 300 && (w = waitpid(sv.pid, &st, WNOHANG)) == 0; i++) sleep_ms(100);
    if (w == 0) {
        kill(sv.pid, SIGKILL);
        waitpid(sv.pid, &st, 0);
        st = -1;
    }
    sv.pid = 0;
    sv.port = 0;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", sv.dir);
    sh(cmd, NULL, 0);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline void fini(void)
{
    if (sv.pid > 0) {
        kill(sv.pid, SIGKILL);
        waitpid(sv.pid, NULL, 0);
        sv.pid = 0;
    }
}

static inline void start_default(void) { server_start(""); }

static inline json_t *parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    cr_assert(j, "not JSON (%s): %.300s", e.text, s);
    return j;
}

/* Concatenates the text of an SSE stream (completions or chat). */
static inline void sse_text(const char *body, char *out, size_t cap, bool *done)
{
    out[0] = '\0';
    *done = false;
    const char *p = body;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        if (!strncmp(p, "[DONE]", 6)) {
            *done = true;
            break;
        }
        const char *end = strstr(p, "\n\n");
        cr_assert(end, "unterminated event");
        json_error_t e;
        json_t *j = json_loadb(p, (size_t)(end - p), 0, &e);
        cr_assert(j, "bad event JSON: %s", e.text);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        const char *t = json_string_value(json_object_get(ch, "text"));
        if (!t) t = json_string_value(json_object_get(json_object_get(ch, "delta"), "content"));
        if (t) strncat(out, t, cap - strlen(out) - 1);
        json_decref(j);
        p = end;
    }
}

/* `moerun run` greedy text (the trailing newline removed). */
static inline void run_text(const char *prompt, int n, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s run %s -p '%s' -n %d --temp 0 --backend cpu --threads 1 "
             "--kv-budget 16MiB 2>/dev/null", MOERUN_BINARY, MODEL, prompt, n);
    cr_assert_eq(sh(cmd, out, cap), 0);
    size_t k = strlen(out);
    if (k && out[k - 1] == '\n') out[k - 1] = '\0';
}
