/* cli_chat.c - `moerun chat MODEL`: interactive multi-turn chat in the
 * terminal with the model's chat template.
 *
 * Each turn renders the whole conversation with the template (as
 * transformers' apply_chat_template does) and submits it to the engine; the
 * prefix cache finds the blocks of the earlier turns still cached, so only
 * the new tokens (and the partial last block) are prefilled.  /reset starts
 * a new conversation, /exit or Ctrl-D ends. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/chat/chat.h"
#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/chat/reasoning.h"
#include "runtime/core/strbuf.h"
#include "runtime/text/textgen.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moerun chat MODEL_DIR [options]\n\n"
            "Interactive chat: type a message and press Enter; /reset starts over,\n"
            "/exit or Ctrl-D quits.\n\n"
            "  -n, --max-tokens N   tokens per reply (default 512)\n"
            "  --system TEXT        a system message\n"
            "  --temp T, --top-p P, --top-k K, --seed S   sampling (defaults from\n"
            "                       generation_config.json)\n"
            "  --chat-template FILE use this Jinja template instead of the model's\n"
            "  --hide-reasoning     a reasoning model's thinking (<think> blocks, gpt-oss's\n"
            "                       analysis channel) is not shown; otherwise it goes to stderr,\n"
            "                       dimmed on a terminal, and the answer to stdout\n"
            "  -v, --verbose        per turn: prompt tokens, tokens reused from the cache\n"
            MOE_CLI_ENGINE_HELP);
}

enum { O_SYSTEM = MOE_OPT_LAST, O_TEMP, O_TOPP, O_TOPK, O_SEED, O_TEMPLATE, O_HIDE };

struct turn {
    struct moe_textgen tg;
    struct moe_reasoning rs;  /* fmt NONE: the text is all answer */
    bool show_reasoning, dim;
    char *reply, *thought;    /* the answer and the reasoning, for the history */
    size_t n, cap, n_thought, cap_thought;
    struct moe_engine *e;
};

/* Shows text: the reasoning part on stderr (dimmed on a terminal) unless
 * hidden, the answer on stdout; both kept for the history. */
static void show(struct turn *t, const char *text, bool last)
{
    const char *reason = "", *answer = text;
    if (t->rs.fmt != MOE_REASONING_NONE &&
        (last ? moe_reasoning_finish(&t->rs, &reason, &answer)
              : moe_reasoning_push(&t->rs, text, &reason, &answer)) != MOE_OK)
        return;
    if (*reason) {
        (void)moe_buf_append(&t->thought, &t->n_thought, &t->cap_thought, reason, strlen(reason));
        if (t->show_reasoning) fprintf(stderr, t->dim ? "\033[2m%s\033[0m" : "%s", reason);
    }
    fputs(answer, stdout);
    (void)moe_buf_append(&t->reply, &t->n, &t->cap, answer, strlen(answer));
}

static void on_token(void *user, struct moe_request *r, int32_t token, bool finished)
{
    struct turn *t = user;
    const char *s = "";
    /* the end-of-sequence token ends the text without being part of it */
    if (token < 0) return;
    if (!(finished && r->finish == MOE_FINISH_STOP) && moe_textgen_push(&t->tg, token, &s) != MOE_OK) return;
    show(t, s, false);
    if (t->tg.stopped && !finished) moe_engine_stop(t->e, r);
    else if (finished && moe_textgen_finish(&t->tg, &s) == MOE_OK) {
        show(t, s, false);
        show(t, "", true);
    }
    fflush(stdout);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = '\0';
    fclose(f);
    return b;
}

int moe_cli_chat(int argc, char **argv)
{
    struct moe_cli_engine eo;
    moe_cli_engine_defaults(&eo);
    const char *system = NULL, *template_path = NULL;
    long n_new = 512;
    bool verbose = false, hide = false;
    struct moe_sampling over = {0};
    bool set_temp = false, set_topp = false, set_topk = false, set_seed = false;
    static const struct option opts[] = {
        {"max-tokens", required_argument, 0, 'n'}, {"system", required_argument, 0, O_SYSTEM},
        {"temp", required_argument, 0, O_TEMP},    {"top-p", required_argument, 0, O_TOPP},
        {"top-k", required_argument, 0, O_TOPK},   {"seed", required_argument, 0, O_SEED},
        {"chat-template", required_argument, 0, O_TEMPLATE},
        {"verbose", no_argument, 0, 'v'}, {"hide-reasoning", no_argument, 0, O_HIDE},          {"help", no_argument, 0, 'h'},
        MOE_CLI_ENGINE_LONGOPTS, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = moe_cli_getopt(argc, argv, "n:vh", opts, "chat")) != -1) {
        int k = moe_cli_engine_option(&eo, "chat", c, optarg);
        if (k < 0) return 1;
        if (k > 0) continue;
        long iv;
        switch (c) {
        case 'n':
            if (!moe_cli_parse_int(optarg, 1, 1 << 24, &n_new)) return moe_cli_error("chat", "-n '%s'", optarg);
            break;
        case O_SYSTEM: system = optarg; break;
        case O_TEMPLATE: template_path = optarg; break;
        case O_TEMP: over.temperature = (float)atof(optarg); set_temp = true; break;
        case O_TOPP: over.top_p = (float)atof(optarg); set_topp = true; break;
        case O_TOPK:
            if (!moe_cli_parse_int(optarg, 0, 1 << 24, &iv)) return moe_cli_error("chat", "--top-k '%s'", optarg);
            over.top_k = (int)iv;
            set_topk = true;
            break;
        case O_SEED:
            if (!moe_cli_parse_int(optarg, 0, __LONG_MAX__, &iv)) return moe_cli_error("chat", "--seed '%s'", optarg);
            over.seed = (uint64_t)iv;
            set_seed = true;
            break;
        case 'v': verbose = true; break;
        case O_HIDE: hide = true; break;
        case 'h': usage(stdout); return 0;
        default: return 2;
        }
    }
    if (optind < argc) eo.model.path = argv[optind++];
    if (optind < argc) return moe_cli_error("chat", "unexpected argument '%s'", argv[optind]);
    if (!eo.model.path) return moe_cli_error("chat", "give a model folder (chat needs its tokenizer)");

    int rc = 1;
    struct moe_model m = {0};
    struct moe_backend be = {0};
    struct moe_tokenizer tok = {0};
    struct moe_engine e = {0};
    struct moe_chat_template tpl = {0};
    json_t *messages = json_array(), *extra = NULL;
    char *line = NULL, *tsrc = NULL;
    size_t lcap = 0;
    const bool tty = isatty(0);
    if (moe_cli_open_model(&m, &eo.model) != MOE_OK || moe_tokenizer_load(&tok, eo.model.path) != MOE_OK) {
        moe_cli_error("chat", "%s", moe_last_error());
        goto done;
    }
    if (template_path) {
        if (!(tsrc = read_file(template_path))) {
            moe_cli_error("chat", "cannot read %s", template_path);
            goto done;
        }
        if (moe_chat_template_init(&tpl, tsrc) != MOE_OK) {
            moe_cli_error("chat", "%s: %s", template_path, moe_last_error());
            goto done;
        }
    } else if (moe_chat_template_load(&tpl, eo.model.path, tok.chat_template) != MOE_OK) {
        moe_cli_error("chat", "%s (give one with --chat-template FILE)", moe_last_error());
        goto done;
    }
    extra = moe_chat_special_tokens(&tok);
    const enum moe_reasoning_format rfmt = moe_reasoning_detect(tpl.source);
    if (!eo.kv_budget) eo.kv_budget = "256MiB";
    if (moe_cli_backend_start(&be, &eo) != MOE_OK ||
        moe_cli_engine_start(&eo, &m, &be, 0, &e) != MOE_OK) {
        moe_cli_error("chat", "%s", moe_last_error());
        goto done;
    }
    e.on_token = on_token;
    if (system) json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system", "content", system));
    if (tty) fprintf(stderr, "moerun chat: %s; /reset starts over, /exit or Ctrl-D quits\n", eo.model.path);
    int turn_no = 0;
    for (;;) {
        if (tty) fprintf(stderr, "> ");
        ssize_t len = getline(&line, &lcap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(messages);
            if (system)
                json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system", "content", system));
            if (tty) fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "user", "content", line));
        char *text = NULL;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (moe_chat_template_render(&tpl, messages, true, extra, &text) != MOE_OK ||
            moe_tokenizer_encode(&tok, text, strlen(text), false, &ids, &n_ids, NULL) != MOE_OK) {
            moe_cli_error("chat", "%s", moe_last_error());
            free(text);
            json_array_remove(messages, json_array_size(messages) - 1);
            continue;
        }
        const bool opens_think = moe_reasoning_prompt_opens_think(text);
        free(text);
        struct moe_request_params rp = {.max_tokens = (int)n_new};
        moe_cli_generation_defaults(eo.model.path, &rp.sampling);
        if (set_temp) rp.sampling.temperature = over.temperature;
        if (set_topp) rp.sampling.top_p = over.top_p;
        if (set_topk) rp.sampling.top_k = over.top_k;
        rp.sampling.seed = set_seed ? over.seed + (uint64_t)turn_no : (uint64_t)turn_no;
        for (size_t i = 0; i < tok.n_eos && rp.n_stop_ids < MOE_MAX_STOP_IDS; i++)
            rp.stop_ids[rp.n_stop_ids++] = tok.eos_ids[i];
        if ((long)n_ids + rp.max_tokens > m.cfg.max_pos) rp.max_tokens = m.cfg.max_pos - (int)n_ids;
        struct turn t = {.e = &e, .show_reasoning = !hide, .dim = isatty(2)};
        moe_reasoning_init(&t.rs, rfmt, opens_think);
        struct moe_request *r = NULL;
        if (rp.max_tokens < 1 ||
            moe_textgen_init(&t.tg, &tok, NULL, 0, rfmt != MOE_REASONING_HARMONY) != MOE_OK ||
            moe_engine_submit(&e, ids, (int)n_ids, &rp, &t, &r) != MOE_OK) {
            moe_cli_error("chat", "%s", rp.max_tokens < 1 ? "the conversation fills the model's "
                          "context; /reset to start over" : moe_last_error());
            free(ids);
            moe_textgen_free(&t.tg);
            moe_reasoning_free(&t.rs);
            json_array_remove(messages, json_array_size(messages) - 1);
            continue;
        }
        free(ids);
        int rows;
        enum moe_status s = MOE_OK;
        while (!moe_engine_idle(&e) && s == MOE_OK) s = moe_engine_step(&e, &rows);
        fputc('\n', stdout);
        fflush(stdout);
        if (s != MOE_OK) {
            moe_cli_error("chat", "%s", moe_last_error());
            moe_engine_release(&e, r);
            moe_textgen_free(&t.tg);
            moe_reasoning_free(&t.rs);
            free(t.reply);
            free(t.thought);
            goto done;
        }
        if (verbose)
            fprintf(stderr, "[turn %d: %d prompt tokens, %d reused from the cache, %d prefilled, %d "
                    "generated]\n", turn_no + 1, r->n_prompt, r->n_prefix_hit, r->n_prefilled,
                    r->n_tokens - r->n_prompt);
        json_t *reply = json_pack("{s:s, s:s}", "role", "assistant", "content", t.reply ? t.reply : "");
        if (t.n_thought) /* templates that keep the last turn's thinking read it (chat.c aliases it) */
            json_object_set_new(reply, "reasoning_content", json_string(t.thought));
        json_array_append_new(messages, reply);
        moe_engine_release(&e, r);
        moe_textgen_free(&t.tg);
        moe_reasoning_free(&t.rs);
        free(t.reply);
        free(t.thought);
        turn_no++;
    }
    rc = 0;
done:
    free(line);
    free(tsrc);
    json_decref(messages);
    json_decref(extra);
    moe_chat_template_free(&tpl);
    moe_engine_free(&e);
    moe_backend_free(&be);
    moe_tokenizer_free(&tok);
    moe_model_free(&m);
    return rc;
}
