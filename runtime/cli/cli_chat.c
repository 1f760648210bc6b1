/* cli_chat.c - `moerun chat MODEL`: interactive multi-turn chat in the
 * terminal with the model's chat template.
 *
 * Each turn renders the whole conversation with the template (as
 * transformers' apply_chat_template does) and submits it to the engine; the
 * prefix cache finds the blocks of the earlier turns still cached, so only
 * the new tokens (and the partial last block) are prefilled.  /reset starts
 * a new conversation, /exit or Ctrl-D ends. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/chat/chat.h"
#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/chat/reasoning.h"
#include "runtime/core/strbuf.h"
#include "runtime/text/textgen.h"

struct chat_opts {
    struct moe_cli_engine eng;
    struct moe_cli_sampling sam;
    const char *system, *template_path;
    bool verbose, hide;
};

#define CMD(member) .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct chat_opts, member)
static const struct moe_cli_opt rows[] = {
    {.name = "system", .arg = "TEXT", .kind = MOE_CLI_STRING, CMD(system), .help = "a system message"},
    {.name = "chat-template", .arg = "FILE", .kind = MOE_CLI_STRING, CMD(template_path),
     .help = "use this Jinja template instead of the model's"},
    {.name = "hide-reasoning", .kind = MOE_CLI_FLAG, CMD(hide),
     .help = "a reasoning model's thinking (<think> blocks, gpt-oss's\n"
             "analysis channel) is not shown; otherwise it goes to stderr,\n"
             "dimmed on a terminal, and the answer to stdout"},
    {.name = "verbose", .letter = 'v', .kind = MOE_CLI_FLAG, CMD(verbose),
     .help = "per turn: prompt tokens, tokens reused from the cache"},
};
#undef CMD

static const char *const shared[] = {"max-tokens", "temp", "top-p", "top-k", "seed", "@model", "@engine",
                                     "@spec", "@offload", NULL};

static const struct moe_cli_command chat_cmd = {
    .name = "chat",
    .usage = "usage: moerun chat MODEL_DIR [options]\n\n"
             "Interactive chat: type a message and press Enter; /reset starts over,\n"
             "/exit or Ctrl-D quits.  Sampling defaults come from generation_config.json;\n"
             "each turn's seed is --seed plus the turn's number.\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
    .shared = shared,
    .engine_at = offsetof(struct chat_opts, eng),
    .sampling_at = offsetof(struct chat_opts, sam),
};

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
    if (!(finished && r->stop_token) && moe_textgen_push(&t->tg, token, &s) != MOE_OK) return;
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

/* What chat loads; chat_free releases it. */
struct chat_ctx {
    struct moe_model m;
    struct moe_backend be;
    struct moe_tokenizer tok;
    struct moe_engine e;
    struct moe_chat_template tpl;
    enum moe_reasoning_format rfmt;
    json_t *messages, *extra;
    char *tsrc;
};

static void chat_free(struct chat_ctx *c)
{
    free(c->tsrc);
    json_decref(c->messages);
    json_decref(c->extra);
    moe_chat_template_free(&c->tpl);
    moe_engine_free(&c->e);
    moe_backend_free(&c->be);
    moe_tokenizer_free(&c->tok);
    moe_model_free(&c->m);
}

/* The model, tokenizer, chat template and engine. */
static int chat_load(struct chat_opts *o, struct chat_ctx *c)
{
    if (moe_cli_open_model(&c->m, &o->eng.model) != MOE_OK || moe_tokenizer_load(&c->tok, o->eng.model.path) != MOE_OK)
        return moe_cli_error("chat", "%s", moe_last_error());
    if (o->template_path) {
        if (!(c->tsrc = read_file(o->template_path))) return moe_cli_error("chat", "cannot read %s", o->template_path);
        if (moe_chat_template_init(&c->tpl, c->tsrc) != MOE_OK)
            return moe_cli_error("chat", "%s: %s", o->template_path, moe_last_error());
    } else if (moe_chat_template_load(&c->tpl, o->eng.model.path, c->tok.chat_template) != MOE_OK) {
        return moe_cli_error("chat", "%s (give one with --chat-template FILE)", moe_last_error());
    }
    c->extra = moe_chat_special_tokens(&c->tok);
    c->rfmt = moe_reasoning_detect(c->tpl.source);
    if (!o->eng.kv_budget) o->eng.kv_budget = "256MiB";
    if (moe_cli_backend_start(&c->be, &o->eng) != MOE_OK || moe_cli_engine_start(&o->eng, &c->m, &c->be, 0, &c->e) != MOE_OK)
        return moe_cli_error("chat", "%s", moe_last_error());
    c->e.on_token = on_token;
    return 0;
}

static void chat_reset(const struct chat_opts *o, struct chat_ctx *c)
{
    json_array_clear(c->messages);
    if (o->system) json_array_append_new(c->messages, json_pack("{s:s, s:s}", "role", "system", "content", o->system));
}

static void turn_free(struct turn *t)
{
    moe_textgen_free(&t->tg);
    moe_reasoning_free(&t->rs);
    free(t->reply);
    free(t->thought);
}

/* One turn for the user's line: render, submit, stream the reply and keep
 * it in the history.  0 (a refused turn leaves the history as it was), or
 * 1 when the engine failed. */
static int chat_turn(const struct chat_opts *o, const struct moe_cli_args *a, struct chat_ctx *c, int turn_no)
{
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (moe_chat_template_render(&c->tpl, c->messages, true, c->extra, &text) != MOE_OK ||
        moe_tokenizer_encode(&c->tok, text, strlen(text), false, &ids, &n_ids, NULL) != MOE_OK) {
        moe_cli_error("chat", "%s", moe_last_error());
        free(text);
        json_array_remove(c->messages, json_array_size(c->messages) - 1);
        return 0;
    }
    const bool opens_think = moe_reasoning_prompt_opens_think(text);
    free(text);
    struct moe_request_params rp = {.max_tokens = (int)o->sam.max_tokens};
    moe_cli_generation_defaults(o->eng.model.path, &rp.sampling);
    moe_cli_sampling_apply(a, &o->sam, &rp.sampling);
    rp.sampling.seed = (moe_cli_given(a, "seed") ? (uint64_t)o->sam.seed : 0) + (uint64_t)turn_no;
    for (size_t i = 0; i < c->tok.n_eos && rp.n_stop_ids < MOE_MAX_STOP_IDS; i++)
        rp.stop_ids[rp.n_stop_ids++] = c->tok.eos_ids[i];
    if ((long)n_ids + rp.max_tokens > c->m.cfg.max_pos) rp.max_tokens = c->m.cfg.max_pos - (int)n_ids;
    struct turn t = {.e = &c->e, .show_reasoning = !o->hide, .dim = isatty(2)};
    moe_reasoning_init(&t.rs, c->rfmt, opens_think);
    struct moe_request *r = NULL;
    if (rp.max_tokens < 1 || moe_textgen_init(&t.tg, &c->tok, NULL, 0, c->rfmt != MOE_REASONING_HARMONY) != MOE_OK ||
        moe_engine_submit(&c->e, ids, (int)n_ids, &rp, &t, &r) != MOE_OK) {
        moe_cli_error("chat", "%s", rp.max_tokens < 1 ? "the conversation fills the model's context; /reset to "
                      "start over" : moe_last_error());
        free(ids);
        turn_free(&t);
        json_array_remove(c->messages, json_array_size(c->messages) - 1);
        return 0;
    }
    free(ids);
    int rows;
    enum moe_status s = MOE_OK;
    while (!moe_engine_idle(&c->e) && s == MOE_OK) s = moe_engine_step(&c->e, &rows);
    fputc('\n', stdout);
    fflush(stdout);
    if (s != MOE_OK) {
        moe_cli_error("chat", "%s", moe_last_error());
    } else {
        if (o->verbose)
            fprintf(stderr, "[turn %d: %d prompt tokens, %d reused from the cache, %d prefilled, %d generated]\n",
                    turn_no + 1, r->n_prompt, r->n_prefix_hit, r->n_prefilled, r->n_tokens - r->n_prompt);
        if (o->verbose && r->n_spec_steps)
            fprintf(stderr, "[turn %d speculation: %d verifications, %d drafted tokens, %d accepted (%.1f%%)]\n",
                    turn_no + 1, r->n_spec_steps, r->n_drafted, r->n_accepted,
                    r->n_drafted ? 100.0 * r->n_accepted / r->n_drafted : 0.0);
        json_t *reply = json_pack("{s:s, s:s}", "role", "assistant", "content", t.reply ? t.reply : "");
        if (t.n_thought) /* templates that keep the last turn's thinking read it (chat.c aliases it) */
            json_object_set_new(reply, "reasoning_content", json_string(t.thought));
        json_array_append_new(c->messages, reply);
    }
    moe_engine_release(&c->e, r);
    turn_free(&t);
    return s != MOE_OK;
}

int moe_cli_chat(int argc, char **argv)
{
    struct chat_opts o = {.sam.max_tokens = 512};
    moe_cli_engine_defaults(&o.eng);
    struct moe_cli_args a;
    int rc = moe_cli_parse(&chat_cmd, argc, argv, &o, &a);
    if (rc >= 0) return rc;
    if (a.n_pos > 0) o.eng.model.path = a.pos[0];
    if (a.n_pos > 1) return moe_cli_error("chat", "unexpected argument '%s'", a.pos[1]);
    if (!o.eng.model.path) return moe_cli_error("chat", "give a model folder (chat needs its tokenizer)");
    struct chat_ctx c = {.messages = json_array()};
    char *line = NULL;
    size_t lcap = 0;
    const bool tty = isatty(0);
    rc = chat_load(&o, &c);
    if (!rc) {
        chat_reset(&o, &c);
        if (tty) fprintf(stderr, "moerun chat: %s; /reset starts over, /exit or Ctrl-D quits\n", o.eng.model.path);
    }
    for (int turn_no = 0; !rc;) {
        if (tty) fprintf(stderr, "> ");
        ssize_t len = getline(&line, &lcap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            chat_reset(&o, &c);
            if (tty) fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        json_array_append_new(c.messages, json_pack("{s:s, s:s}", "role", "user", "content", line));
        const size_t before = json_array_size(c.messages);
        rc = chat_turn(&o, &a, &c, turn_no);
        turn_no += json_array_size(c.messages) > before; /* a refused turn does not count */
    }
    free(line);
    chat_free(&c);
    return rc;
}
