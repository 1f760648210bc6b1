/* cli_run.c - `moerun run`: one request through the engine, streamed.
 *
 * With -p TEXT the prompt goes through the model's tokenizer and the text is
 * streamed to stdout as tokens are produced; with --prompt-ids the ids go in
 * directly and the generated ids are printed, comma-separated.  Timings go
 * to stderr.  Sampling defaults come from generation_config.json; any
 * option given overrides them. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/stats_cli.h"
#include "runtime/text/textgen.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moerun run MODEL_DIR -p TEXT [-n N] [options]\n"
            "       moerun run MODEL_DIR --prompt-ids 1,2,3 [-n N] [options]\n\n"
            "Generates from a prompt and streams the text to stdout (or prints the\n"
            "generated ids with --prompt-ids).  Timings go to stderr.\n\n"
            "  -p, --prompt TEXT    prompt text ('-' reads stdin)\n"
            "  --prompt-ids LIST    prompt token ids, comma-separated\n"
            "  -n, --max-tokens N   tokens to generate (default 64)\n"
            "  --temp T             temperature (0: greedy)\n"
            "  --top-k K, --top-p P, --min-p M     sampling filters\n"
            "  --repeat-penalty R, --frequency-penalty F, --presence-penalty P\n"
            "  --seed S             sampling seed (default 0)\n"
            "  --stop STR           stop string (repeatable)\n"
            "  --ignore-eos         keep generating past the end-of-sequence token\n"
            "  --chunk N            prefill chunk size (sets --max-batch-tokens)\n"
            MOE_CLI_ENGINE_HELP MOE_CLI_STATS_USAGE);
}

enum { O_PROMPT_IDS = MOE_OPT_LAST, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_REP, O_FREQ, O_PRES,
       O_SEED, O_STOP, O_IGNORE_EOS, O_CHUNK };

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

int moe_cli_run(int argc, char **argv)
{
    struct moe_cli_engine eo;
    moe_cli_engine_defaults(&eo);
    const char *prompt_text = NULL, *ids_arg = NULL, *stops[MOE_MAX_STOP_STRINGS];
    int n_stops = 0;
    long n_new = 64;
    bool ignore_eos = false;
    struct moe_sampling over;            /* explicit options */
    bool set[16] = {0};
    memset(&over, 0, sizeof over);
    static const struct option opts[] = {
        {"prompt", required_argument, 0, 'p'},   {"prompt-ids", required_argument, 0, O_PROMPT_IDS},
        {"max-tokens", required_argument, 0, 'n'}, {"temp", required_argument, 0, O_TEMP},
        {"temperature", required_argument, 0, O_TEMP}, {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP}, {"min-p", required_argument, 0, O_MINP},
        {"repeat-penalty", required_argument, 0, O_REP},
        {"frequency-penalty", required_argument, 0, O_FREQ},
        {"presence-penalty", required_argument, 0, O_PRES}, {"seed", required_argument, 0, O_SEED},
        {"stop", required_argument, 0, O_STOP},  {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"chunk", required_argument, 0, O_CHUNK}, {"help", no_argument, 0, 'h'},
        MOE_CLI_ENGINE_LONGOPTS, MOE_CLI_STATS_OPTIONS, {0, 0, 0, 0}};
    struct moe_cli_stats so = {0};
    int c;
    optind = 1;
    while ((c = moe_cli_getopt(argc, argv, "p:n:h", opts, "run")) != -1) {
        int k = moe_cli_engine_option(&eo, "run", c, optarg);
        if (k == 0) k = moe_cli_stats_option(&so, &eo.model, c, optarg, "run");
        if (k < 0) return 1;
        if (k > 0) continue;
        char *end = NULL;
        double v = optarg ? strtod(optarg, &end) : 0;
        bool num_ok = optarg && end != optarg && !*end;
        long iv;
        switch (c) {
        case 'p': prompt_text = optarg; break;
        case O_PROMPT_IDS: ids_arg = optarg; break;
        case 'n':
            if (!moe_cli_parse_int(optarg, 1, 1 << 24, &n_new))
                return moe_cli_error("run", "-n '%s' must be a positive count", optarg);
            break;
        case O_CHUNK:
            if (!moe_cli_parse_int(optarg, 1, 1 << 20, &eo.max_batch_tokens))
                return moe_cli_error("run", "--chunk '%s' must be a positive count", optarg);
            break;
        case O_TOPK:
        case O_SEED:
            if (!moe_cli_parse_int(optarg, 0, __LONG_MAX__, &iv))
                return moe_cli_error("run", "'%s' is not a non-negative integer", optarg);
            if (c == O_TOPK) over.top_k = (int)iv;
            else over.seed = (uint64_t)iv;
            set[c - MOE_OPT_LAST] = true;
            break;
        case O_TEMP: case O_TOPP: case O_MINP: case O_REP: case O_FREQ: case O_PRES:
            if (!num_ok) return moe_cli_error("run", "'%s' is not a number", optarg);
            if (c == O_TEMP) over.temperature = (float)v;
            if (c == O_TOPP) over.top_p = (float)v;
            if (c == O_MINP) over.min_p = (float)v;
            if (c == O_REP) over.repetition_penalty = (float)v;
            if (c == O_FREQ) over.frequency_penalty = (float)v;
            if (c == O_PRES) over.presence_penalty = (float)v;
            set[c - MOE_OPT_LAST] = true;
            break;
        case O_STOP:
            if (n_stops == MOE_MAX_STOP_STRINGS)
                return moe_cli_error("run", "at most %d --stop strings", MOE_MAX_STOP_STRINGS);
            stops[n_stops++] = optarg;
            break;
        case O_IGNORE_EOS: ignore_eos = true; break;
        case 'h': usage(stdout); return 0;
        default: return 2;
        }
    }
    if (optind < argc) eo.model.path = argv[optind++];
    if (optind < argc) return moe_cli_error("run", "unexpected argument '%s'", argv[optind]);
    if (!prompt_text == !ids_arg)
        return moe_cli_error("run", "give exactly one prompt: -p TEXT or --prompt-ids 1,2,3");
    if (moe_cli_stats_check(&so, "run")) return 1;

    int rc = 1;
    struct moe_model m = {0};
    struct moe_backend be = {0};
    struct moe_tokenizer tok = {0};
    struct moe_engine e = {0};
    struct run_state st = {.text = prompt_text != NULL, .first_id = true, .e = &e};
    int32_t *prompt = NULL;
    int n_prompt = 0;
    char *stdin_text = NULL;
    size_t stdin_len = 0;
    bool have_tok = false;

    double t0 = moe_cli_now();
    if (moe_cli_open_model(&m, &eo.model) != MOE_OK) {
        moe_cli_error("run", "%s", moe_last_error());
        goto done;
    }
    if (eo.model.path) {
        have_tok = moe_tokenizer_load(&tok, eo.model.path) == MOE_OK;
        if (!have_tok && prompt_text) {
            moe_cli_error("run", "%s (use --prompt-ids to run without a tokenizer)", moe_last_error());
            goto done;
        }
    } else if (prompt_text) {
        moe_cli_error("run", "a synthetic model has no tokenizer: use --prompt-ids");
        goto done;
    }
    if (prompt_text) {
        if (!strcmp(prompt_text, "-") && !(prompt_text = stdin_text = moe_cli_read_all(stdin, &stdin_len))) {
            moe_cli_error("run", "cannot read the prompt from stdin");
            goto done;
        }
        size_t n;
        bool bad_utf8 = false;
        if (moe_tokenizer_encode(&tok, prompt_text, strlen(prompt_text), true, &prompt, &n, &bad_utf8) != MOE_OK) {
            moe_cli_error("run", "%s", moe_last_error());
            goto done;
        }
        if (bad_utf8)
            fprintf(stderr, "moerun run: the prompt is not valid UTF-8; invalid bytes were replaced "
                    "with U+FFFD\n");
        n_prompt = (int)n;
    } else if (moe_cli_parse_ids(ids_arg, &prompt, &n_prompt) != MOE_OK) {
        moe_cli_error("run", "%s", moe_last_error());
        goto done;
    }
    /* sizes are checked before anything is allocated for the request */
    if ((long)n_prompt + n_new > m.cfg.max_pos) {
        moe_cli_error("run", "prompt of %d tokens + %ld new tokens exceeds the model's context of %d",
                      n_prompt, n_new, m.cfg.max_pos);
        goto done;
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= m.cfg.vocab) {
            moe_cli_error("run", "prompt token %d (item %d) is outside the vocabulary of %d",
                          prompt[i], i + 1, m.cfg.vocab);
            goto done;
        }
    struct moe_request_params rp = {.max_tokens = (int)n_new};
    moe_cli_generation_defaults(eo.model.path, &rp.sampling);
    const int S = MOE_OPT_LAST;
    if (set[O_TEMP - S]) rp.sampling.temperature = over.temperature;
    if (set[O_TOPK - S]) rp.sampling.top_k = over.top_k;
    if (set[O_TOPP - S]) rp.sampling.top_p = over.top_p;
    if (set[O_MINP - S]) rp.sampling.min_p = over.min_p;
    if (set[O_REP - S]) rp.sampling.repetition_penalty = over.repetition_penalty;
    if (set[O_FREQ - S]) rp.sampling.frequency_penalty = over.frequency_penalty;
    if (set[O_PRES - S]) rp.sampling.presence_penalty = over.presence_penalty;
    if (set[O_SEED - S]) rp.sampling.seed = over.seed;
    if (!ignore_eos) {
        if (have_tok)
            for (size_t i = 0; i < tok.n_eos && rp.n_stop_ids < MOE_MAX_STOP_IDS; i++)
                rp.stop_ids[rp.n_stop_ids++] = tok.eos_ids[i];
        else if (m.cfg.eos_id >= 0)
            rp.stop_ids[rp.n_stop_ids++] = m.cfg.eos_id;
    }
    if (st.text && moe_textgen_init(&st.tg, &tok, stops, n_stops, true) != MOE_OK) {
        moe_cli_error("run", "%s", moe_last_error());
        goto done;
    }
    if (moe_cli_backend_start(&be, &eo) != MOE_OK ||
        moe_cli_engine_start(&eo, &m, &be, n_prompt + n_new, &e) != MOE_OK) {
        moe_cli_error("run", "%s", moe_last_error());
        goto done;
    }
    e.on_token = on_token;
    if (moe_cli_stats_start(&so, &m, "run")) goto done;
    e.r.fw.stats = moe_cli_stats_recorder(&so);
    struct moe_request *r;
    if (moe_engine_submit(&e, prompt, n_prompt, &rp, &st, &r) != MOE_OK) {
        moe_cli_error("run", "%s", moe_last_error());
        goto done;
    }
    double t1 = moe_cli_now();
    int rows;
    while (!moe_engine_idle(&e)) {
        if (moe_engine_step(&e, &rows) != MOE_OK || st.err != MOE_OK) {
            fputc('\n', stdout);
            moe_cli_error("run", "%s", moe_last_error());
            goto done;
        }
    }
    fputc('\n', stdout);
    fflush(stdout);
    int n_gen;
    moe_request_output(r, &n_gen);
    double ttft = r->t_first - r->t_arrival;
    double dec = n_gen > 1 ? r->t_token[n_gen - 1] - r->t_first : 0;
    fprintf(stderr,
            "moerun run: %d prompt tokens, %d generated (%s); load %.2f s; TTFT %.1f ms; "
            "prefill %.1f tokens/s; decode %.1f tokens/s\n",
            n_prompt, n_gen, moe_finish_name(r->finish), t1 - t0, ttft * 1e3,
            ttft > 0 ? n_prompt / ttft : 0.0, dec > 0 ? (n_gen - 1) / dec : 0.0);
    moe_engine_release(&e, r);
    rc = moe_cli_stats_finish(&so, &m, &eo.model, &be, "run");
done:
    moe_cli_stats_free(&so);
    moe_textgen_free(&st.tg);
    moe_engine_free(&e);
    moe_backend_free(&be);
    moe_tokenizer_free(&tok);
    moe_model_free(&m);
    free(prompt);
    free(stdin_text);
    return rc;
}
