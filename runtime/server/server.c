/* server.c - the HTTP side of `moerun serve` on libmicrohttpd: the daemon
 * (a thread per connection, bounded connections in all and per address, a
 * header deadline, then the idle timeout, bounded header memory), the
 * framing checks libmicrohttpd leaves to us (conflicting Content-Length,
 * Transfer-Encoding other than chunked, %00 in the path), routing, request
 * bodies (size checked from Content-Length and counted while reading), and
 * the content reader that streams a job's response bytes (see server.h for
 * the threads and ownership).
 *
 * A connection's state (struct conn) is created by the URI log callback,
 * which libmicrohttpd calls for every request once its request line is
 * read, so the completion callback also sees the requests libmicrohttpd
 * answers itself after that (431, bad chunking, a malformed Content-Length)
 * and counts them; a 414 or 505 comes before the request line is read and
 * is not seen (docs/server.md). */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "runtime/server/server.h"

struct conn {
    char *body;
    size_t n, cap;
    bool nul_in_path;         /* the raw path holds %00 */
    bool headers;             /* the handler has seen the headers */
    bool too_large;
    bool started;
    bool answered;            /* the handler queued a response */
};

/* Queues a response (takes text); "Connection: close" when close, or when
 * the server is stopping. */
static enum MHD_Result send_close(struct MHD_Connection *c, struct srv *s, int status,
                                  const char *type, char *text, bool close)
{
    srv_count_status(s, status);
    if (!text) {
        status = 500;
        text = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
        if (!text) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (close || atomic_load(&s->ready) == 2) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_buf(struct MHD_Connection *c, struct srv *s, int status,
                                const char *type, char *text)
{
    return send_close(c, s, status, type, text, false);
}

static enum MHD_Result send_json(struct MHD_Connection *c, struct srv *s, int status, json_t *j)
{
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return send_buf(c, s, status, "application/json", t);
}

static enum MHD_Result send_error(struct MHD_Connection *c, struct srv *s, int status,
                                  const char *msg)
{
    return send_buf(c, s, status, "application/json", srv_error_json(status, NULL, "%s", msg));
}

/* --- the response of a job: bytes from the engine thread --- */

static ssize_t job_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct srv_job *j = cls;
    (void)pos;
    pthread_mutex_lock(&j->mu);
    if (j->sent == j->n_out && !j->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double ka = j->s->o.keepalive_s;
        ts.tv_sec += (time_t)ka;
        ts.tv_nsec += (long)((ka - (double)(time_t)ka) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (j->sent == j->n_out && !j->done)
            if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) break;
    }
    ssize_t n;
    if (j->sent < j->n_out) {
        size_t k = j->n_out - j->sent;
        if (k > max) k = max;
        memcpy(buf, j->out + j->sent, k);
        j->sent += k;
        if (j->sent == j->n_out) j->sent = j->n_out = 0; /* a long stream reuses its buffer */
        n = (ssize_t)k;
    } else if (j->done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        /* nothing yet: keep the connection alive (and learn if it is gone);
         * only at an event boundary, since events are appended whole */
        const char *ka = ": keep-alive\n\n";
        size_t k = strlen(ka);
        if (k > max) k = max;
        memcpy(buf, ka, k);
        n = (ssize_t)k;
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

/* Marks the job abandoned and wakes the engine thread, which cancels its
 * requests. */
static void job_abandon(struct srv_job *j)
{
    struct srv *s = j->s;
    pthread_mutex_lock(&j->mu);
    j->abandoned = true;
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->q_mu);
    pthread_cond_signal(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

static void job_reader_free(void *cls)
{
    struct srv_job *j = cls;
    pthread_mutex_lock(&j->mu);
    bool gone = !j->done || j->sent < j->n_out;
    pthread_mutex_unlock(&j->mu);
    if (gone) job_abandon(j);
    srv_job_unref(j);
}

/* Whether the client closed the connection: end of file or an error on a
 * peek (bytes of a pipelined next request are not a close).  A client that
 * only shuts down its sending side counts as gone, as in uvicorn. */
static bool client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    char b;
    const ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* A non-streaming job: this connection's thread waits for the whole body,
 * looking every keepalive interval whether the client is still there, so
 * that the status line can say how the job ended (200, or 503 when the
 * drain timeout cut it).  Takes the caller's reference to j. */
static enum MHD_Result completion_whole(struct MHD_Connection *c, struct srv *s, struct srv_job *j)
{
    const double ka = s->o.keepalive_s > 0 ? s->o.keepalive_s : 0.5;
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)ka;
        ts.tv_nsec += (long)((ka - (double)(time_t)ka) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) != ETIMEDOUT || j->done) continue;
        pthread_mutex_unlock(&j->mu);
        if (client_gone(c)) {
            job_abandon(j);
            srv_job_unref(j);
            return MHD_NO;
        }
        pthread_mutex_lock(&j->mu);
    }
    const int status = j->status ? j->status : 200;
    const size_t n = j->n_out;
    char *body = n ? malloc(n + 1) : NULL;
    if (body) {
        memcpy(body, j->out, n);
        body[n] = 0;
    }
    pthread_mutex_unlock(&j->mu);
    srv_job_unref(j);
    if (!n) /* the engine thread ended it without a body: it stopped */
        return send_error(c, s, 503, "the server stopped before the request finished");
    return send_buf(c, s, status, "application/json", body);
}

static enum MHD_Result completion(struct MHD_Connection *c, struct srv *s, bool chat,
                                  struct conn *cs)
{
    struct srv_job *j = NULL;
    char *err = NULL;
    int status = srv_handle_completion(s, chat, cs->body ? cs->body : "", cs->n, &j, &err);
    if (status != 200) return send_buf(c, s, status, "application/json", err);
    if (!j->stream) return completion_whole(c, s, j);
    srv_count_status(s, 200);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, job_reader,
                                                               j, job_reader_free);
    if (!r) {
        job_reader_free(j);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (atomic_load(&s->ready) == 2) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result expert_stats(struct MHD_Connection *c, struct srv *s, bool reset)
{
    if (!s->stats) return send_error(c, s, 404, "expert statistics are off (--no-stats)");
    json_t *j;
    pthread_mutex_lock(&s->stats_mu);
    if (reset) {
        moe_stats_reset(s->stats);
        j = json_pack("{s:s, s:I}", "status", "ok", "resets", (json_int_t)s->stats->resets);
    } else {
        int wb;
        const int64_t eb = moe_model_expert_bytes(&s->m, &wb);
        struct moe_stats_meta meta = {.model = s->model_dir, .architecture = s->m.cfg.architecture,
                                      .command = "serve",
                                      .backend = s->be.ops ? s->be.ops->name : NULL,
                                      .threads = s->be.n_threads, .d_model = s->m.cfg.d_model,
                                      .d_expert = s->m.cfg.d_expert,
                                      .weight_bytes = wb, .expert_bytes = eb};
        j = moe_stats_to_json(s->stats, &meta);
    }
    pthread_mutex_unlock(&s->stats_mu);
    return send_json(c, s, 200, j);
}

/* Whether the request carries "Authorization: Bearer key"; the comparison
 * takes the same time wherever the first difference is. */
static bool authorized(struct MHD_Connection *c, const char *key)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    h += 7;
    const size_t n = strlen(key), m = strlen(h);
    unsigned char diff = n != m;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < m ? h[i] : 0);
    return diff == 0;
}

static json_t *model_json(const struct srv *s)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", s->model_name, "object", "model", "created",
                     (json_int_t)s->created, "owned_by", "moerun", "max_model_len", s->max_pos);
}

static enum MHD_Result route(struct MHD_Connection *c, struct srv *s, const char *url,
                             const char *method, struct conn *cs)
{
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    static const struct { const char *path; bool post; } paths[] = {
        {"/health", false}, {"/v1/models", false}, {"/metrics", false},
        {"/v1/expert-stats", false}, {"/v1/completions", true}, {"/v1/chat/completions", true},
        {"/v1/expert-stats/reset", true}, {"/v1/models/", false}};
    const int n_paths = (int)(sizeof paths / sizeof paths[0]);
    int k = -1;
    for (int i = 0; i < n_paths - 1; i++)
        if (!strcmp(url, paths[i].path)) k = i;
    const char *model_id = NULL; /* GET /v1/models/{id} */
    if (k < 0 && !strncmp(url, paths[n_paths - 1].path, strlen(paths[n_paths - 1].path)) &&
        url[strlen(paths[n_paths - 1].path)]) {
        k = n_paths - 1;
        model_id = url + strlen(paths[n_paths - 1].path);
    }
    if (k < 0) return send_error(c, s, 404, "no such endpoint");
    if (paths[k].post ? !post : !get) return send_error(c, s, 405, "method not allowed here");
    if (s->o.api_key && !strncmp(url, "/v1/", 4) && !authorized(c, s->o.api_key))
        return send_error(c, s, 401, "invalid or missing API key (Authorization: Bearer KEY)");
    int ready = atomic_load(&s->ready);
    if (k == 0)
        return ready == 1 ? send_json(c, s, 200, json_pack("{s:s}", "status", "ok"))
                          : send_error(c, s, 503, ready ? "shutting down" : "the model is loading");
    if (ready != 1)
        return send_error(c, s, 503, ready ? "the server is shutting down" : "the model is loading");
    switch (k) {
    case 1: return send_json(c, s, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(s)));
    case 2: {
        char *t = srv_metrics_text(s);
        return send_buf(c, s, t ? 200 : 500, "text/plain; version=0.0.4", t);
    }
    case 3: return expert_stats(c, s, false);
    case 4: return completion(c, s, false, cs);
    case 5: return completion(c, s, true, cs);
    case 6: return expert_stats(c, s, true);
    default:
        if (strcmp(model_id, s->model_name))
            return send_buf(c, s, 404, "application/json",
                            srv_error_json(404, "model", "the model '%.200s' does not exist; this server "
                                           "serves '%s'", model_id, s->model_name));
        return send_json(c, s, 200, model_json(s));
    }
}

struct cl_check {
    int n;                    /* Content-Length headers */
    bool bad;                 /* one is not digits only, or they differ */
    const char *first;
};

static enum MHD_Result cl_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct cl_check *k = cls;
    (void)kind;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) return MHD_YES;
    if (!value || !*value || strspn(value, "0123456789") != strlen(value)) k->bad = true;
    else if (k->n && strcmp(value, k->first)) k->bad = true;
    if (!k->n) k->first = value;
    k->n++;
    return MHD_YES;
}

/* The framing checks at the headers (RFC 9112 6.1-6.3): conflicting or
 * malformed Content-Length, Content-Length beside Transfer-Encoding, a
 * transfer coding other than chunked, %00 in the path, a body over the
 * limit.  Each answers with the connection closed, since the rest of what
 * the client sent cannot be framed.  0: the request goes on. */
static int framing_error(struct MHD_Connection *c, struct srv *s, struct conn *cs, enum MHD_Result *ret)
{
    struct cl_check k = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, cl_header, &k);
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    int status = 0;
    char msg[256];
    if (cs->nul_in_path) {
        status = 400;
        snprintf(msg, sizeof msg, "the path holds an encoded NUL byte (%%00)");
    } else if (k.bad) {
        status = 400;
        snprintf(msg, sizeof msg, "%s", k.n > 1 ? "conflicting Content-Length headers"
                                                : "the Content-Length header is not a decimal number");
    } else if (te && k.n) {
        status = 400;
        snprintf(msg, sizeof msg, "both Transfer-Encoding and Content-Length are given");
    } else if (te && strcasecmp(te, "chunked")) {
        status = 501;
        snprintf(msg, sizeof msg, "Transfer-Encoding '%.100s' is not supported; only chunked", te);
    } else if (k.n) {
        errno = 0;
        unsigned long long v = strtoull(k.first, NULL, 10);
        if (errno || v > s->o.max_body) {
            status = 413;
            snprintf(msg, sizeof msg, "the body is larger than the limit of %zu bytes", s->o.max_body);
        }
    }
    if (!status) return 0;
    cs->answered = true;
    *ret = send_close(c, s, status, "application/json", srv_error_json(status, NULL, "%s", msg), true);
    return 1;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *data,
                               size_t *data_size, void **con_cls)
{
    struct srv *s = cls;
    struct conn *cs = *con_cls;
    (void)version;
    if (!cs) return MHD_NO; /* uri_log made it; NULL: out of memory */
    if (!cs->headers) {
        cs->headers = true;
        /* the header deadline is over: the idle timeout from here on */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.timeout_s);
        enum MHD_Result ret;
        if (framing_error(c, s, cs, &ret)) return ret;
        return MHD_YES;
    }
    if (*data_size) {
        if (!cs->too_large && cs->n + *data_size > s->o.max_body) {
            cs->too_large = true;
            free(cs->body);
            cs->body = NULL;
            cs->n = cs->cap = 0;
        }
        if (!cs->too_large) {
            if (cs->n + *data_size + 1 > cs->cap) {
                size_t cap = cs->cap ? cs->cap : 4096;
                while (cap < cs->n + *data_size + 1) cap *= 2;
                char *p = realloc(cs->body, cap);
                if (!p) return MHD_NO;
                cs->body = p;
                cs->cap = cap;
            }
            memcpy(cs->body + cs->n, data, *data_size);
            cs->n += *data_size;
            cs->body[cs->n] = '\0';
        }
        *data_size = 0;
        return MHD_YES;
    }
    if (cs->started) return MHD_YES;
    cs->started = true;
    cs->answered = true;
    if (cs->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is larger than the limit of %zu bytes", s->o.max_body);
        return send_close(c, s, 413, "application/json", srv_error_json(413, NULL, "%s", msg), true);
    }
    return route(c, s, url, method, cs);
}

/* Called once a request line is read: the connection's state, and whether
 * the raw path holds %00 (libmicrohttpd's unescaped path ends there). */
static void *uri_log(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls;
    (void)c;
    struct conn *cs = calloc(1, sizeof *cs);
    if (cs && uri) {
        const size_t path = strcspn(uri, "?");
        for (size_t i = 0; i + 2 < path; i++)
            if (uri[i] == '%' && uri[i + 1] == '0' && uri[i + 2] == '0') cs->nul_in_path = true;
    }
    return cs;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    struct srv *s = cls;
    struct conn *cs = *con_cls;
    if (cs && !cs->answered) { /* an error libmicrohttpd answered itself */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
        if (ci && ci->http_status >= 400) srv_count_status(s, (int)ci->http_status);
    }
    (void)toe;
    if (cs) {
        free(cs->body);
        free(cs);
    }
    *con_cls = NULL;
}

enum moe_status srv_http_start(struct srv *s)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->o.port)};
    if (inet_pton(AF_INET, s->o.host, &a.sin_addr) != 1)
        return moe_fail(MOE_ERR_INVALID_ARG, "serve: --host '%s' is not an IPv4 address", s->o.host);
    /* the daemon's timeout is the header deadline; the handler sets the
     * idle timeout once a request's headers are in */
    s->d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG,
        0, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->o.max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->o.max_conns_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.header_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_URI_LOG_CALLBACK, uri_log, s,
        MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_END);
    if (!s->d)
        return moe_fail(MOE_ERR_IO, "serve: cannot listen on %s:%d (%s)", s->o.host, s->o.port,
                        strerror(errno));
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    if (info) s->o.port = info->port;
    return MOE_OK;
}

void srv_http_quiesce(struct srv *s)
{
    if (!s->d) return;
    const MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void srv_http_stop(struct srv *s)
{
    if (s->d) MHD_stop_daemon(s->d);
    s->d = NULL;
}
