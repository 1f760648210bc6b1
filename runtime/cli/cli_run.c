/* cli_run.c - `moerun run`: one request through the engine, streamed.
 *
 * With -p TEXT the prompt goes through the model's tokenizer and the text is
 * streamed to stdout as tokens are produced; with --prompt-ids the ids go in
 * directly and the generated ids are printed, comma-separated.  Timings go
 * to stderr.  Sampling defaults come from generation_config.json; any
 * option given overrides them. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli.h"
#include "runtime/core/clock.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/cli/stats_cli.h"
#include "runtime/text/textgen.h"

struct run_opts {
    struct moe_cli_engine eng;
    struct moe_cli_stats st;
    struct moe_cli_sampling sam;
    const char *prompt, *prompt_ids;
    struct moe_cli_list stops;
    bool ignore_eos;
};

#define CMD(member) .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct run_opts, member)
static const struct moe_cli_opt rows[] = {
    {.name = "prompt", .letter = 'p', .arg = "TEXT", .kind = MOE_CLI_STRING, CMD(prompt),
     .help = "prompt text ('-' reads stdin)"},
    {.name = "prompt-ids", .arg = "LIST", .kind = MOE_CLI_STRING, CMD(prompt_ids),
     .help = "prompt token ids, comma-separated"},
    {.name = "stop", .arg = "STR", .kind = MOE_CLI_LIST, CMD(stops), .hi = MOE_MAX_STOP_STRINGS,
     .help = "stop string (repeatable)"},
    {.name = "ignore-eos", .kind = MOE_CLI_FLAG, CMD(ignore_eos),
     .help = "keep generating past the end-of-sequence token"},
    {.name = "chunk", .arg = "N", .kind = MOE_CLI_INT, .at = MOE_CLI_AT_ENGINE,
     MOE_CLI_FIELD(struct moe_cli_engine, max_batch_tokens), .lo = 1, .hi = 1 << 20,
     .help = "prefill chunk size (sets --max-batch-tokens)"},
};
#undef CMD

static const char *const shared[] = {"@sampling", "@model", "@engine", "@spec", "@offload", "@stats", NULL};

static const struct moe_cli_command run_cmd = {
    .name = "run",
    .usage = "usage: moerun run MODEL_DIR -p TEXT [-n N] [options]\n"
             "       moerun run MODEL_DIR --prompt-ids 1,2,3 [-n N] [options]\n\n"
             "Generates from a prompt and streams the text to stdout (or prints the\n"
             "generated ids with --prompt-ids).  Timings go to stderr.  Sampling defaults\n"
             "come from generation_config.json; the options given override them.\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
    .shared = shared,
    .engine_at = offsetof(struct run_opts, eng),
    .stats_at = offsetof(struct run_opts, st),
    .sampling_at = offsetof(struct run_opts, sam),
};

struct run_state {
    struct moe_textgen tg;
    bool text;        /* stream text (else ids) */
    bool first_id;
    struct moe_engine *e;
    enum moe_status err;
};

static void on_token(void *user, struct moe_request *r, int32_t token, bool finished)
{
    struct run_state *st = user;
    if (token < 0) return;
    if (!st->text) {
        printf(st->first_id ? "%d" : ",%d", token);
        st->first_id = false;
        fflush(stdout);
        return;
    }
    const char *t;
    if ((st->err = moe_textgen_push(&st->tg, token, &t)) != MOE_OK) return;
    fputs(t, stdout);
    if (st->tg.stopped && !finished) moe_engine_stop(st->e, r);
    else if (finished && moe_textgen_finish(&st->tg, &t) == MOE_OK) fputs(t, stdout);
    fflush(stdout);
}

/* What run loads and runs; run_free releases it. */
struct run_ctx {
    struct moe_model m;
    struct moe_backend be;
    struct moe_tokenizer tok;
    bool have_tok;
    struct moe_engine e;
    struct run_state st;
    int32_t *prompt;
    int n_prompt;
    char *stdin_text;
};

static void run_free(struct run_ctx *c)
{
    moe_textgen_free(&c->st.tg);
    moe_engine_free(&c->e);
    moe_backend_free(&c->be);
    moe_tokenizer_free(&c->tok);
    moe_model_free(&c->m);
    free(c->prompt);
    free(c->stdin_text);
}

/* What one run measured: the timings line on stderr. */
struct run_result {
    int n_prompt, n_gen;
    enum moe_finish finish;
    double load_s, ttft_s, decode_s;
    bool spec;                         /* speculation was on */
    struct moe_engine_counters n;      /* the engine's, at the end */
};

static void print_result(const struct run_result *r)
{
    fprintf(stderr,
            "moerun run: %d prompt tokens, %d generated (%s); load %.2f s; TTFT %.1f ms; "
            "prefill %.1f tokens/s; decode %.1f tokens/s\n",
            r->n_prompt, r->n_gen, moe_finish_name(r->finish), r->load_s, r->ttft_s * 1e3,
            r->ttft_s > 0 ? r->n_prompt / r->ttft_s : 0.0, r->decode_s > 0 ? (r->n_gen - 1) / r->decode_s : 0.0);
    char spec[256];
    if (moe_cli_spec_summary(&r->n, spec, sizeof spec))
        fprintf(stderr, "moerun run: speculation: %s\n", spec);
    else if (r->spec)
        fprintf(stderr, "moerun run: speculation: nothing drafted (only greedy requests speculate, where the "
                "proposer finds a match)\n");
}

static int run_parse(int argc, char **argv, struct run_opts *o, struct moe_cli_args *a)
{
    *o = (struct run_opts){.sam.max_tokens = 64};
    moe_cli_engine_defaults(&o->eng);
    const int rc = moe_cli_parse(&run_cmd, argc, argv, o, a);
    if (rc >= 0) return rc;
    if (a->n_pos > 0) o->eng.model.path = a->pos[0];
    if (a->n_pos > 1) return moe_cli_error("run", "unexpected argument '%s'", a->pos[1]);
    if (!o->prompt == !o->prompt_ids)
        return moe_cli_error("run", "give exactly one prompt: -p TEXT or --prompt-ids 1,2,3");
    if (moe_cli_stats_check(&o->st, "run")) return 1;
    return -1;
}

/* The model, its tokenizer, and the prompt as ids, checked against the model. */
static int run_prompt(const struct run_opts *o, struct run_ctx *c)
{
    const char *text = o->prompt;
    if (moe_cli_open_model(&c->m, &o->eng.model) != MOE_OK) return moe_cli_error("run", "%s", moe_last_error());
    if (o->eng.model.path) {
        c->have_tok = moe_tokenizer_load(&c->tok, o->eng.model.path) == MOE_OK;
        if (!c->have_tok && text)
            return moe_cli_error("run", "%s (use --prompt-ids to run without a tokenizer)", moe_last_error());
    } else if (text) {
        return moe_cli_error("run", "a synthetic model has no tokenizer: use --prompt-ids");
    }
    if (text) {
        size_t len, n;
        bool bad_utf8 = false;
        if (!strcmp(text, "-") && !(text = c->stdin_text = moe_cli_read_all(stdin, &len)))
            return moe_cli_error("run", "cannot read the prompt from stdin");
        if (moe_tokenizer_encode(&c->tok, text, strlen(text), true, &c->prompt, &n, &bad_utf8) != MOE_OK)
            return moe_cli_error("run", "%s", moe_last_error());
        if (bad_utf8)
            fprintf(stderr, "moerun run: the prompt is not valid UTF-8; invalid bytes were replaced with U+FFFD\n");
        c->n_prompt = (int)n;
    } else if (moe_cli_parse_ids(o->prompt_ids, &c->prompt, &c->n_prompt) != MOE_OK) {
        return moe_cli_error("run", "%s", moe_last_error());
    }
    /* sizes are checked before anything is allocated for the request */
    if ((long)c->n_prompt + o->sam.max_tokens > c->m.cfg.max_pos)
        return moe_cli_error("run", "prompt of %d tokens + %ld new tokens exceeds the model's context of %d",
                             c->n_prompt, o->sam.max_tokens, c->m.cfg.max_pos);
    for (int i = 0; i < c->n_prompt; i++)
        if (c->prompt[i] >= c->m.cfg.vocab)
            return moe_cli_error("run", "prompt token %d (item %d) is outside the vocabulary of %d", c->prompt[i],
                                 i + 1, c->m.cfg.vocab);
    return 0;
}

/* The request: generation_config.json's sampling under the options given, the stop ids. */
static void run_params(const struct run_opts *o, const struct moe_cli_args *a, const struct run_ctx *c,
                       struct moe_request_params *rp)
{
    *rp = (struct moe_request_params){.max_tokens = (int)o->sam.max_tokens};
    moe_cli_generation_defaults(o->eng.model.path, &rp->sampling);
    moe_cli_sampling_apply(a, &o->sam, &rp->sampling);
    if (o->ignore_eos) return;
    if (c->have_tok)
        for (size_t i = 0; i < c->tok.n_eos && rp->n_stop_ids < MOE_MAX_STOP_IDS; i++)
            rp->stop_ids[rp->n_stop_ids++] = c->tok.eos_ids[i];
    else if (c->m.cfg.eos_id >= 0)
        rp->stop_ids[rp->n_stop_ids++] = c->m.cfg.eos_id;
}

/* Starts the engine, runs the request to its end and fills r. */
static int run_generate(struct run_opts *o, const struct moe_request_params *rp, struct run_ctx *c,
                        struct run_result *r)
{
    c->st = (struct run_state){.text = o->prompt != NULL, .first_id = true, .e = &c->e};
    if (c->st.text && moe_textgen_init(&c->st.tg, &c->tok, o->stops.v, o->stops.n, true) != MOE_OK)
        return moe_cli_error("run", "%s", moe_last_error());
    if (moe_cli_backend_start(&c->be, &o->eng) != MOE_OK ||
        moe_cli_engine_start(&o->eng, &c->m, &c->be, c->n_prompt + o->sam.max_tokens, &c->e) != MOE_OK)
        return moe_cli_error("run", "%s", moe_last_error());
    c->e.on_token = on_token;
    if (moe_cli_stats_start(&o->st, &c->m, "run")) return 1;
    c->e.r.fw.stats = moe_cli_stats_recorder(&o->st);
    struct moe_request *req;
    if (moe_engine_submit(&c->e, c->prompt, c->n_prompt, rp, &c->st, &req) != MOE_OK)
        return moe_cli_error("run", "%s", moe_last_error());
    const double t1 = moe_seconds();
    r->load_s = t1 - r->load_s;
    int rows;
    while (!moe_engine_idle(&c->e)) {
        if (moe_engine_step(&c->e, &rows) != MOE_OK || c->st.err != MOE_OK) {
            fputc('\n', stdout);
            return moe_cli_error("run", "%s", moe_last_error());
        }
    }
    fputc('\n', stdout);
    fflush(stdout);
    moe_request_output(req, &r->n_gen);
    r->n_prompt = c->n_prompt;
    r->finish = req->finish;
    r->ttft_s = req->t_first - req->t_arrival;
    r->decode_s = r->n_gen > 1 ? req->t_token[r->n_gen - 1] - req->t_first : 0;
    r->spec = c->e.o.spec.kind != MOE_SPEC_NONE;
    r->n = c->e.n;
    moe_engine_release(&c->e, req);
    return 0;
}

int moe_cli_run(int argc, char **argv)
{
    struct run_opts o;
    struct moe_cli_args a;
    int rc = run_parse(argc, argv, &o, &a);
    if (rc >= 0) return rc;
    struct run_ctx c = {0};
    struct run_result r = {.load_s = moe_seconds()}; /* the start, until the request is in */
    struct moe_request_params rp;
    rc = run_prompt(&o, &c);
    if (!rc) {
        run_params(&o, &a, &c, &rp);
        rc = run_generate(&o, &rp, &c, &r);
    }
    if (!rc) {
        print_result(&r);
        rc = moe_cli_stats_finish(&o.st, &c.m, &o.eng.model, &c.be, "run");
    }
    moe_cli_stats_free(&o.st);
    run_free(&c);
    return rc;
}
