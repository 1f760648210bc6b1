/* cli_serve.c - `moerun serve MODEL`: options, start-up and shutdown.
 *
 * Order: the HTTP daemon starts first (GET /health answers 503 while
 * loading), then the model, tokenizer, chat template, engine and statistics
 * recorder load, the engine thread starts and /health flips to 200.
 * SIGINT/SIGTERM: new requests are refused, running ones aborted (their
 * streams end), the daemon stops and everything is freed. */
#include <getopt.h>
#include <libgen.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/stats_cli.h"
#include "runtime/server/server.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moerun serve MODEL_DIR [--host 127.0.0.1] [--port 8080] [options]\n\n"
            "OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions\n"
            "(streaming with \"stream\": true), GET /v1/models, /health, /metrics,\n"
            "/v1/expert-stats, POST /v1/expert-stats/reset (docs/server.md).\n\n"
            "  --host ADDR          IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port N             port (default 8080; 0: any free port)\n"
            "  --port-file FILE     write the port listened on to FILE once ready\n"
            "  --served-model-name NAME  model name in the API (default: the folder's name)\n"
            "  --max-body SIZE      largest request body in bytes (default 4MiB)\n"
            "  --max-queue N        waiting requests before 429 (default 256)\n"
            "  --max-conns N        simultaneous connections (default 256)\n"
            "  --timeout S          idle connection timeout in seconds (default 60)\n"
            "  --api-key KEY        /v1/ endpoints want 'Authorization: Bearer KEY' (also\n"
            "                       MOERUN_API_KEY); /health and /metrics stay open\n"
            "  --generation-config auto|none  sampling defaults from the model's\n"
            "                       generation_config.json (auto, the default) or the API's\n"
            "  --reasoning-parser auto|none|think|harmony  chat completions put a reasoning\n"
            "                       model's thinking in reasoning_content (think: <think>..</think>,\n"
            "                       DeepSeek-R1, Qwen3, GLM-4.5; harmony: gpt-oss's analysis\n"
            "                       channel); auto (the default) reads the chat template\n"
            "  --tool-call-parser auto|none|hermes|harmony|mistral|deepseek_v3|glm45|kimi_k2\n"
            "                       chat completions with tools return the calls the model writes\n"
            "                       as tool_calls (hermes: <tool_call> JSON blocks, Qwen; harmony:\n"
            "                       gpt-oss; mistral: [TOOL_CALLS] lists, Mixtral-8x22B; deepseek_v3:\n"
            "                       DeepSeek-V3, R1 and V3.1; glm45: GLM-4.5/4.6 <arg_key> blocks;\n"
            "                       kimi_k2: Kimi-K2 sections); auto reads the template\n"
            "  (the default KV budget here is 0.25 of available memory, at most 4GiB)\n"
            MOE_CLI_ENGINE_HELP MOE_CLI_STATS_USAGE);
}

/* The command's state: the server and the options it is built from. */
struct serve_cmd {
    struct srv s;
    struct moe_cli_engine eo;
    struct moe_cli_stats so;
};

enum { O_HOST = MOE_OPT_LAST, O_PORT, O_PORT_FILE, O_NAME, O_MAX_BODY, O_MAX_QUEUE, O_MAX_CONNS,
       O_TIMEOUT, O_API_KEY, O_GEN_CONFIG, O_REASONING, O_TOOLS };

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
    s->kv_blocks = s->e.r.kv.n_blocks;
    s->kv_block = s->e.o.block_size;
    if (srv_engine_start(s) != MOE_OK) return moe_cli_error("serve", "%s", moe_last_error());
    return 0;
}

int moe_cli_serve(int argc, char **argv)
{
    struct serve_cmd *cmd = calloc(1, sizeof *cmd);
    if (!cmd) return moe_cli_error("serve", "out of memory");
    struct srv *s = &cmd->s;
    moe_cli_engine_defaults(&cmd->eo);
    s->o = (struct srv_opts){.host = "127.0.0.1", .port = 8080, .max_body = 4u << 20,
                             .max_queue = 256, .max_conns = 256, .timeout_s = 60,
                             .keepalive_s = 0.5};
    static const struct option opts[] = {
        {"host", required_argument, 0, O_HOST}, {"port", required_argument, 0, O_PORT},
        {"port-file", required_argument, 0, O_PORT_FILE},
        {"served-model-name", required_argument, 0, O_NAME},
        {"max-body", required_argument, 0, O_MAX_BODY},
        {"max-queue", required_argument, 0, O_MAX_QUEUE},
        {"max-conns", required_argument, 0, O_MAX_CONNS},
        {"timeout", required_argument, 0, O_TIMEOUT}, {"help", no_argument, 0, 'h'},
        {"api-key", required_argument, 0, O_API_KEY},
        {"generation-config", required_argument, 0, O_GEN_CONFIG},
        {"reasoning-parser", required_argument, 0, O_REASONING},
        {"tool-call-parser", required_argument, 0, O_TOOLS},
        MOE_CLI_ENGINE_LONGOPTS, MOE_CLI_STATS_OPTIONS, {0, 0, 0, 0}};
    int c, rc = 1;
    long v;
    optind = 1;
    while ((c = moe_cli_getopt(argc, argv, "h", opts, "serve")) != -1) {
        int k = moe_cli_engine_option(&cmd->eo, "serve", c, optarg);
        if (k == 0) k = moe_cli_stats_option(&cmd->so, &cmd->eo.model, c, optarg, "serve");
        if (k < 0) goto out;
        if (k > 0) continue;
        switch (c) {
        case O_HOST: s->o.host = optarg; break;
        case O_PORT:
            if (!moe_cli_parse_int(optarg, 0, 65535, &v)) {
                moe_cli_error("serve", "--port '%s' must be in [0, 65535]", optarg);
                goto out;
            }
            s->o.port = (int)v;
            break;
        case O_PORT_FILE: s->o.port_file = optarg; break;
        case O_NAME: s->o.served_name = optarg; break;
        case O_MAX_BODY: {
            size_t b;
            if (moe_cli_parse_budget(optarg, &b) != MOE_OK || b < 64) {
                moe_cli_error("serve", "--max-body '%s' is not a size of at least 64 bytes", optarg);
                goto out;
            }
            s->o.max_body = b;
            break;
        }
        case O_MAX_QUEUE: case O_MAX_CONNS: case O_TIMEOUT:
            if (!moe_cli_parse_int(optarg, 1, 1 << 20, &v)) {
                moe_cli_error("serve", "option value '%s' must be a positive count", optarg);
                goto out;
            }
            if (c == O_MAX_QUEUE) s->o.max_queue = (int)v;
            else if (c == O_MAX_CONNS) s->o.max_conns = (int)v;
            else s->o.timeout_s = (int)v;
            break;
        case O_API_KEY:
            if (!*optarg) {
                moe_cli_error("serve", "--api-key must not be empty");
                goto out;
            }
            s->o.api_key = optarg;
            break;
        case O_GEN_CONFIG:
            if (strcmp(optarg, "auto") && strcmp(optarg, "none")) {
                moe_cli_error("serve", "--generation-config '%s' (use auto or none)", optarg);
                goto out;
            }
            s->o.no_gen_defaults = !strcmp(optarg, "none");
            break;
        case O_REASONING: {
            enum moe_reasoning_format f;
            if (strcmp(optarg, "auto") && !moe_reasoning_parse_name(optarg, &f)) {
                moe_cli_error("serve", "--reasoning-parser '%s' (use auto, none, think or harmony)", optarg);
                goto out;
            }
            s->o.reasoning = optarg;
            break;
        }
        case O_TOOLS: {
            enum moe_tool_format f;
            if (strcmp(optarg, "auto") && !moe_tool_calls_parse_name(optarg, &f)) {
                moe_cli_error("serve", "--tool-call-parser '%s' (use auto, none, hermes, harmony, mistral, "
                              "deepseek_v3, glm45 or kimi_k2)", optarg);
                goto out;
            }
            s->o.tool_parser = optarg;
            break;
        }
        case 'h': usage(stdout); rc = 0; goto out;
        default: rc = 2; goto out;
        }
    }
    if (!s->o.api_key && getenv("MOERUN_API_KEY") && *getenv("MOERUN_API_KEY"))
        s->o.api_key = getenv("MOERUN_API_KEY");
    if (!cmd->eo.model.synthetic && optind < argc) cmd->eo.model.path = argv[optind++];
    if (optind < argc) {
        moe_cli_error("serve", "unexpected argument '%s'", argv[optind]);
        goto out;
    }
    if (!cmd->eo.model.path && !cmd->eo.model.synthetic) {
        usage(stderr);
        rc = 2;
        goto out;
    }
    /* everything that can be wrong before the port opens or "listening" is said */
    if (moe_cli_stats_check(&cmd->so, "serve") || moe_cli_check_engine(&cmd->eo, "serve") ||
        (s->o.port_file && moe_cli_check_writable("serve", "--port-file", s->o.port_file)))
        goto out;
    s->model_dir = cmd->eo.model.path;
    if (s->o.served_name) {
        s->model_name = strdup(s->o.served_name);
    } else {
        char *tmp = strdup(s->model_dir ? s->model_dir : cmd->eo.model.synthetic);
        if (tmp) {
            size_t n = strlen(tmp);
            while (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
            s->model_name = strdup(basename(tmp));
        }
        free(tmp);
    }
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    pthread_mutex_init(&s->stats_mu, NULL);
    pthread_mutex_init(&s->m_mu, NULL);
    atomic_init(&s->next_id, 1);
    /* signals are taken by sigwait in this thread; every thread blocks them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (!s->model_name || srv_http_start(s) != MOE_OK) {
        moe_cli_error("serve", "%s", s->model_name ? moe_last_error() : "out of memory");
        goto out;
    }
    fprintf(stderr, "moerun serve: listening on http://%s:%d, loading %s\n", s->o.host, s->o.port,
            s->model_name);
    if (load(cmd)) goto stop;
    atomic_store(&s->ready, 1);
    if (s->o.port_file) {
        FILE *f = fopen(s->o.port_file, "w");
        if (!f || fprintf(f, "%d\n", s->o.port) < 0 || fclose(f)) {
            moe_cli_error("serve", "cannot write %s", s->o.port_file);
            goto stop;
        }
    }
    fprintf(stderr, "moerun serve: ready (%d KV blocks of %d tokens)\n", s->kv_blocks, s->kv_block);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "moerun serve: signal %d, shutting down\n", sig);
    rc = 0;
stop:
    atomic_store(&s->ready, 2);
    srv_engine_stop(s);
    srv_http_stop(s);
    if (rc == 0) rc = moe_cli_stats_finish(&cmd->so, &s->m, &cmd->eo.model, &s->be, "serve");
    pthread_mutex_destroy(&s->tok_mu);
    pthread_mutex_destroy(&s->q_mu);
    pthread_cond_destroy(&s->q_cv);
    pthread_mutex_destroy(&s->stats_mu);
    pthread_mutex_destroy(&s->m_mu);
out:
    moe_cli_stats_free(&cmd->so);
    moe_engine_free(&s->e);
    moe_backend_free(&s->be);
    json_decref(s->special);
    moe_chat_template_free(&s->tmpl);
    moe_tokenizer_free(&s->tok);
    moe_tokenizer_free(&s->tok_eng);
    moe_model_free(&s->m);
    free(s->model_name);
    free(cmd);
    return rc;
}
