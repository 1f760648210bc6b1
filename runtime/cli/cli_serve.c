/* cli_serve.c - `moerun serve MODEL`: options, start-up and shutdown.
 *
 * Order: the HTTP daemon starts first (GET /health answers 503 while
 * loading), then the model, tokenizer, chat template, engine and statistics
 * recorder load, the engine thread starts and /health flips to 200.
 * SIGINT/SIGTERM: the daemon stops listening and new requests get 503;
 * running ones may finish for --drain-timeout seconds, then each is ended
 * with an error (server_engine.c's job_cut); the daemon stops, everything
 * is freed and the exit status is 0.  A second signal exits at once. */
#include <libgen.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/cli/cli.h"
#include "runtime/core/clock.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/cli/stats_cli.h"
#include "runtime/server/server.h"

/* The command's state: the server and the options it is built from. */
struct serve_cmd {
    struct srv s;
    struct moe_cli_engine eo;
    struct moe_cli_stats so;
    const char *gen_config;   /* --generation-config auto|none */
};

static bool parse_key(const char *arg, void *field)
{
    if (!*arg) return false;
    *(const char **)field = arg;
    return true;
}

static const char *const gen_configs[] = {"auto", "none", NULL};
static const char *const reasoning_parsers[] = {"auto", "none", "think", "harmony", NULL};
static const char *const tool_parsers[] = {"auto", "none", "hermes", "harmony", "mistral", "deepseek_v3", "glm45",
                                           "kimi_k2", NULL};

#define CMD(member) .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct serve_cmd, member)
static const struct moe_cli_opt rows[] = {
    {.name = "host", .arg = "ADDR", .kind = MOE_CLI_STRING, CMD(s.o.host),
     .help = "IPv4 address to listen on (default 127.0.0.1)"},
    {.name = "port", .arg = "N", .kind = MOE_CLI_INT, CMD(s.o.port), .lo = 0, .hi = 65535,
     .help = "port (default 8080; 0: any free port)"},
    {.name = "port-file", .arg = "FILE", .kind = MOE_CLI_STRING, CMD(s.o.port_file),
     .help = "write the port listened on to FILE once ready"},
    {.name = "served-model-name", .arg = "NAME", .kind = MOE_CLI_STRING, CMD(s.o.served_name),
     .help = "model name in the API (default: the folder's name)"},
    {.name = "max-body", .arg = "SIZE", .kind = MOE_CLI_SIZE, CMD(s.o.max_body), .lo = 64,
     .help = "largest request body in bytes (default 4MiB)"},
    {.name = "max-queue", .arg = "N", .kind = MOE_CLI_INT, CMD(s.o.max_queue), .lo = 1, .hi = 1 << 20,
     .help = "waiting requests before 429 (default 256)"},
    {.name = "max-conns", .arg = "N", .kind = MOE_CLI_INT, CMD(s.o.max_conns), .lo = 1, .hi = 1 << 20,
     .help = "simultaneous connections (default 256)"},
    {.name = "max-conns-per-ip", .arg = "N", .kind = MOE_CLI_INT, CMD(s.o.max_conns_per_ip), .lo = 1,
     .hi = 1 << 20, .help = "simultaneous connections from one address (default 128)"},
    {.name = "timeout", .arg = "S", .kind = MOE_CLI_INT, CMD(s.o.timeout_s), .lo = 1, .hi = 1 << 20,
     .help = "idle connection timeout in seconds (default 60)"},
    {.name = "header-timeout", .arg = "S", .kind = MOE_CLI_INT, CMD(s.o.header_timeout_s), .lo = 1,
     .hi = 1 << 20, .help = "a new connection's first request headers must arrive\n"
                            "with no pause longer than S seconds (default 10)"},
    {.name = "drain-timeout", .arg = "S", .kind = MOE_CLI_INT, CMD(s.o.drain_timeout_s), .lo = 0,
     .hi = 1 << 20, .help = "on SIGTERM/SIGINT, running requests may finish for S\n"
                            "seconds, then are ended with an error (default 30)"},
    {.name = "api-key", .arg = "KEY", .kind = MOE_CLI_CUSTOM, CMD(s.o.api_key), .parse = parse_key,
     .what = "a key that is not empty",
     .help = "/v1/ endpoints want 'Authorization: Bearer KEY' (also\n"
             "MOERUN_API_KEY); /health and /metrics stay open"},
    {.name = "generation-config", .arg = "auto|none", .kind = MOE_CLI_CHOICE, CMD(gen_config),
     .choices = gen_configs,
     .help = "sampling defaults from the model's\n"
             "generation_config.json (auto, the default) or the API's"},
    {.name = "reasoning-parser", .arg = "auto|none|think|harmony", .kind = MOE_CLI_CHOICE, CMD(s.o.reasoning),
     .choices = reasoning_parsers,
     .help = "chat completions put a reasoning\n"
             "model's thinking in reasoning_content (think: <think>..</think>,\n"
             "DeepSeek-R1, Qwen3, GLM-4.5; harmony: gpt-oss's analysis\n"
             "channel); auto (the default) reads the chat template"},
    {.name = "tool-call-parser", .arg = "auto|none|hermes|harmony|mistral|deepseek_v3|glm45|kimi_k2",
     .kind = MOE_CLI_CHOICE, CMD(s.o.tool_parser), .choices = tool_parsers,
     .help = "\n"
             "chat completions with tools return the calls the model writes\n"
             "as tool_calls (hermes: <tool_call> JSON blocks, Qwen; harmony:\n"
             "gpt-oss; mistral: [TOOL_CALLS] lists, Mixtral-8x22B; deepseek_v3:\n"
             "DeepSeek-V3, R1 and V3.1; glm45: GLM-4.5/4.6 <arg_key> blocks;\n"
             "kimi_k2: Kimi-K2 sections); auto reads the template"},
};
#undef CMD

static const char *const shared[] = {"@model", "@engine", "@spec", "@offload", "@stats", NULL};

static const struct moe_cli_command serve_cmd_spec = {
    .name = "serve",
    .usage = "usage: moerun serve MODEL_DIR [--host 127.0.0.1] [--port 8080] [options]\n\n"
             "OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions\n"
             "(streaming with \"stream\": true), GET /v1/models, /health, /metrics,\n"
             "/v1/expert-stats, POST /v1/expert-stats/reset (docs/server.md).\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
    .shared = shared,
    .footer = "The default KV budget here is 0.25 of available memory, at most 4GiB.\n",
    .engine_at = offsetof(struct serve_cmd, eo),
    .stats_at = offsetof(struct serve_cmd, so),
};

static int load(struct serve_cmd *cmd)
{
    struct srv *s = &cmd->s;
    if (moe_cli_open_model(&s->m, &cmd->eo.model) != MOE_OK)
        return moe_cli_error("serve", "%s", moe_last_error());
    if (s->model_dir) {
        s->have_tok = moe_tokenizer_load(&s->tok, s->model_dir) == MOE_OK &&
                      moe_tokenizer_load(&s->tok_eng, s->model_dir) == MOE_OK;
        if (!s->have_tok)
            fprintf(stderr, "moerun serve: no tokenizer (%s): token-id prompts only\n", moe_last_error());
    }
    moe_sampling_defaults(&s->defaults);
    s->defaults.temperature = 1.0f; /* the OpenAI API's default */
    if (!s->o.no_gen_defaults) {
        int n = moe_cli_generation_overlay(s->model_dir, &s->defaults);
        if (n)
            fprintf(stderr, "moerun serve: %d sampling default(s) from generation_config.json "
                    "(temperature %g, top_p %g, top_k %d); --generation-config none ignores them\n",
                    n, s->defaults.temperature, s->defaults.top_p, s->defaults.top_k);
    }
    if (s->have_tok) {
        s->have_chat = moe_chat_template_load(&s->tmpl, s->model_dir, s->tok.chat_template) == MOE_OK;
        s->special = moe_chat_special_tokens(&s->tok);
        if (!s->have_chat)
            fprintf(stderr, "moerun serve: no chat template: /v1/chat/completions is refused\n");
    }
    if (s->o.reasoning && strcmp(s->o.reasoning, "auto"))
        (void)moe_reasoning_parse_name(s->o.reasoning, &s->reasoning); /* checked with the options */
    else
        s->reasoning = s->have_chat ? moe_reasoning_detect(s->tmpl.source) : MOE_REASONING_NONE;
    if (s->reasoning != MOE_REASONING_NONE)
        fprintf(stderr, "moerun serve: chat completions split reasoning_content (%s parser)\n",
                s->reasoning == MOE_REASONING_THINK ? "think" : "harmony");
    if (s->o.tool_parser && strcmp(s->o.tool_parser, "auto"))
        (void)moe_tool_calls_parse_name(s->o.tool_parser, &s->tool_fmt); /* checked with the options */
    else
        s->tool_fmt = s->have_chat ? moe_tool_calls_detect(s->tmpl.source) : MOE_TOOLS_NONE;
    if (s->tool_fmt == MOE_TOOLS_HARMONY && s->reasoning != MOE_REASONING_HARMONY) {
        fprintf(stderr, "moerun serve: harmony tool calls need the harmony reasoning parser; tool calls off\n");
        s->tool_fmt = MOE_TOOLS_NONE;
    }
    if (s->tool_fmt != MOE_TOOLS_NONE)
        fprintf(stderr, "moerun serve: chat completions with tools return tool_calls (%s format)\n",
                moe_tool_calls_name(s->tool_fmt));
    if (s->have_tok) { /* structured outputs: response_format json_object, "grammar" */
        if (moe_grammar_vocab_from_tokenizer(&s->gvocab, &s->tok, s->m.cfg.vocab) != MOE_OK ||
            moe_grammar_json_object(&s->json_grammar) != MOE_OK)
            return moe_cli_error("serve", "%s", moe_last_error());
        cmd->eo.grammar_vocab = &s->gvocab;
    }
    if (!cmd->eo.kv_budget) cmd->eo.kv_budget = "0.25";
    size_t budget;
    if (moe_cli_parse_budget(cmd->eo.kv_budget, &budget) == MOE_OK && budget > ((size_t)4 << 30) &&
        !strchr(cmd->eo.kv_budget, 'i') && !strchr(cmd->eo.kv_budget, 'B'))
        cmd->eo.kv_budget = "4GiB";
    if (moe_cli_backend_start(&s->be, &cmd->eo) != MOE_OK ||
        moe_cli_engine_start(&cmd->eo, &s->m, &s->be, 0, &s->e) != MOE_OK)
        return moe_cli_error("serve", "%s", moe_last_error());
    if (moe_cli_stats_start(&cmd->so, &s->m, "serve")) return 1;
    s->stats = moe_cli_stats_recorder(&cmd->so);
    s->e.r.fw.stats = s->stats;
    s->vocab = s->m.cfg.vocab;
    s->max_pos = s->m.cfg.max_pos;
    s->kv_blocks = s->e.r.kv.part_blocks; /* what one request can hold (data-parallel attention: a rank's part) */
    s->kv_block = s->e.o.block_size;
    if (srv_engine_start(s) != MOE_OK) return moe_cli_error("serve", "%s", moe_last_error());
    return 0;
}

/* Parses the command line into cmd and checks what can be wrong before
 * the port opens or "listening" is said; -1 to go on, else the exit code. */
static int serve_parse(int argc, char **argv, struct serve_cmd *cmd)
{
    struct srv *s = &cmd->s;
    moe_cli_engine_defaults(&cmd->eo);
    s->o = (struct srv_opts){.host = "127.0.0.1", .port = 8080, .max_body = 4u << 20, .max_queue = 256,
                             .max_conns = 256, .max_conns_per_ip = 128, .timeout_s = 60,
                             .header_timeout_s = 10, .drain_timeout_s = 30, .keepalive_s = 0.5};
    struct moe_cli_args a;
    const int rc = moe_cli_parse(&serve_cmd_spec, argc, argv, cmd, &a);
    if (rc >= 0) return rc;
    s->o.no_gen_defaults = cmd->gen_config && !strcmp(cmd->gen_config, "none");
    if (!s->o.api_key && getenv("MOERUN_API_KEY") && *getenv("MOERUN_API_KEY")) s->o.api_key = getenv("MOERUN_API_KEY");
    int k = 0;
    if (!cmd->eo.model.synthetic && k < a.n_pos) cmd->eo.model.path = a.pos[k++];
    if (k < a.n_pos) return moe_cli_error("serve", "unexpected argument '%s'", a.pos[k]);
    if (!cmd->eo.model.path && !cmd->eo.model.synthetic) {
        moe_cli_help(&serve_cmd_spec, stderr);
        return 2;
    }
    if (moe_cli_stats_check(&cmd->so, "serve") || moe_cli_check_engine(&cmd->eo, "serve") ||
        (s->o.port_file && moe_cli_check_writable("serve", "--port-file", s->o.port_file)))
        return 1;
    return -1;
}

/* The API's model name: --served-model-name, or the folder's (or config's) base name. */
static char *serve_name(const struct serve_cmd *cmd)
{
    if (cmd->s.o.served_name) return strdup(cmd->s.o.served_name);
    char *tmp = strdup(cmd->s.model_dir ? cmd->s.model_dir : cmd->eo.model.synthetic), *name = NULL;
    if (tmp) {
        size_t n = strlen(tmp);
        while (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
        name = strdup(basename(tmp));
    }
    free(tmp);
    return name;
}

static void serve_locks(struct srv *s, bool init)
{
    pthread_mutex_t *mu[] = {&s->tok_mu, &s->q_mu, &s->stats_mu, &s->m_mu};
    for (size_t i = 0; i < sizeof mu / sizeof mu[0]; i++) {
        if (init) pthread_mutex_init(mu[i], NULL);
        else pthread_mutex_destroy(mu[i]);
    }
    if (init) pthread_cond_init(&s->q_cv, NULL);
    else pthread_cond_destroy(&s->q_cv);
}

/* Shutdown: stop listening, refuse new requests, let the running ones
 * finish for --drain-timeout, then end the rest (their clients get an
 * error) and give them 10 s more to be sent.  A second signal ends the
 * process at once (_exit: nothing is freed or written).  sig: the signal
 * that began it. */
static void serve_drain(struct srv *s, sigset_t *sigs, int sig)
{
    atomic_store(&s->ready, 2);
    srv_drain_begin(s);
    srv_http_quiesce(s);
    /* said once the port is closed: a client that reads it finds no listener */
    fprintf(stderr, "moerun serve: signal %d, draining (up to %d s; a second signal exits at once)\n", sig,
            s->o.drain_timeout_s);
    const double end = moe_seconds() + s->o.drain_timeout_s;
    bool cut = false;
    while (atomic_load(&s->jobs_live) > 0) {
        const double now = moe_seconds();
        if (!cut && now >= end) {
            fprintf(stderr, "moerun serve: drain timeout: ending %d running request(s)\n",
                    atomic_load(&s->jobs_live));
            srv_drain_cut(s);
            cut = true;
        }
        if (cut && now >= end + 10) break; /* clients that do not read: the daemon's stop closes them */
        const struct timespec ts = {0, 20 * 1000000L};
        const int sig = sigtimedwait(sigs, NULL, &ts);
        if (sig > 0) {
            fprintf(stderr, "moerun serve: signal %d again, exiting now\n", sig);
            _exit(1);
        }
    }
}

/* Opens the port, loads, says "ready" and waits for SIGINT or SIGTERM;
 * 0 after a signal, 1 when something failed (printed). */
static int serve_run(struct serve_cmd *cmd, sigset_t *sigs)
{
    struct srv *s = &cmd->s;
    if (!s->model_name || srv_http_start(s) != MOE_OK)
        return moe_cli_error("serve", "%s", s->model_name ? moe_last_error() : "out of memory");
    fprintf(stderr, "moerun serve: listening on http://%s:%d, loading %s\n", s->o.host, s->o.port, s->model_name);
    if (load(cmd)) return 1;
    atomic_store(&s->ready, 1);
    if (s->o.port_file) {
        FILE *f = fopen(s->o.port_file, "w");
        if (!f || fprintf(f, "%d\n", s->o.port) < 0 || fclose(f))
            return moe_cli_error("serve", "cannot write %s", s->o.port_file);
    }
    fprintf(stderr, "moerun serve: ready (%d KV blocks of %d tokens%s)\n", s->kv_blocks, s->kv_block,
            s->e.r.kv.parts > 1 ? " on each rank" : "");
    int sig = 0;
    sigwait(sigs, &sig);
    serve_drain(s, sigs, sig);
    return 0;
}

static void serve_free(struct serve_cmd *cmd)
{
    struct srv *s = &cmd->s;
    moe_cli_stats_free(&cmd->so);
    moe_engine_free(&s->e);
    moe_grammar_free(s->json_grammar);
    moe_grammar_vocab_free(&s->gvocab);
    moe_backend_free(&s->be);
    json_decref(s->special);
    moe_chat_template_free(&s->tmpl);
    moe_tokenizer_free(&s->tok);
    moe_tokenizer_free(&s->tok_eng);
    moe_model_free(&s->m);
    free(s->model_name);
    free(cmd);
}

int moe_cli_serve(int argc, char **argv)
{
    struct serve_cmd *cmd = calloc(1, sizeof *cmd);
    if (!cmd) return moe_cli_error("serve", "out of memory");
    struct srv *s = &cmd->s;
    int rc = serve_parse(argc, argv, cmd);
    if (rc >= 0) {
        serve_free(cmd);
        return rc;
    }
    s->model_dir = cmd->eo.model.path;
    s->model_name = serve_name(cmd);
    serve_locks(s, true);
    atomic_init(&s->next_id, 1);
    s->created = (long long)time(NULL);
    /* signals are taken by sigwait in this thread; every thread blocks them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    rc = serve_run(cmd, &sigs);
    atomic_store(&s->ready, 2);
    srv_engine_stop(s);
    srv_http_stop(s);
    if (rc == 0) rc = moe_cli_stats_finish(&cmd->so, &s->m, &cmd->eo.model, &s->be, "serve");
    serve_locks(s, false);
    serve_free(cmd);
    return rc;
}
