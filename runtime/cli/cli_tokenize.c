/* cli_tokenize.c - `moerun tokenize`: encode text to ids or decode ids to
 * text with a model directory's tokenizer.json, for checking a tokenizer by
 * hand or from scripts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <time.h>

#include "runtime/cli/cli_common.h"
#include "runtime/core/clock.h"
#include "runtime/text/tokenizer.h"

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_opts.h"

struct tokenize_opts {
    const char *decode, *bench;
    long repeat;
    bool no_special;
};

#define CMD(member) .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct tokenize_opts, member)
static const struct moe_cli_opt rows[] = {
    {.name = "decode", .arg = "IDS", .kind = MOE_CLI_STRING, CMD(decode), .help = "decode instead of encode"},
    {.name = "bench", .arg = "CORPUS", .kind = MOE_CLI_STRING, CMD(bench),
     .help = "encode every string of CORPUS (a JSON array of strings) --repeat\n"
             "times after one warm-up pass; print bytes/s and tokens/s"},
    {.name = "repeat", .arg = "N", .kind = MOE_CLI_INT, CMD(repeat), .lo = 1, .hi = 1 << 20,
     .help = "passes for --bench (default 3)"},
    {.name = "no-special", .kind = MOE_CLI_FLAG, CMD(no_special),
     .help = "encode without the post-processor's special tokens (BOS);\n"
             "decode skipping special tokens"},
};
#undef CMD

static const struct moe_cli_command tokenize_cmd = {
    .name = "tokenize",
    .usage = "usage: moerun tokenize MODEL_DIR TEXT\n"
             "       moerun tokenize MODEL_DIR --decode IDS\n"
             "\n"
             "Encodes TEXT with MODEL_DIR/tokenizer.json and prints the ids, comma-separated,\n"
             "or decodes IDS (comma- or space-separated) and prints the text.  TEXT or IDS\n"
             "may be '-' to read standard input (taken byte for byte, newline included).\n"
             "A TEXT that starts with '-' goes after '--', the end of the options.\n"
             "\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
};

static int fail(const char *msg)
{
    fprintf(stderr, "moerun tokenize: %s\n", msg);
    return 1;
}

/* "1,2, 3" or "1 2 3" -> ids; new memory.  Returns 0 or prints the error. */
static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return fail("out of memory");
    for (const char *p = s;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX ||
            (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r')) {
            char msg[128];
            snprintf(msg, sizeof msg, "'%.*s' is not a token id", (int)strcspn(p, ", \t\r\n") > 40
                     ? 40 : (int)strcspn(p, ", \t\r\n"), p);
            free(*ids);
            *ids = NULL;
            return fail(msg);
        }
        if (*n == cap) {
            int32_t *q = realloc(*ids, 2 * cap * sizeof *q);
            if (!q) {
                free(*ids);
                *ids = NULL;
                return fail("out of memory");
            }
            *ids = q;
            cap *= 2;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    return 0;
}

/* Encode throughput on one thread over a corpus; the best pass counts. */
static int bench(struct moe_tokenizer *tok, const char *corpus_path, int repeat, bool special)
{
    json_error_t jerr;
    json_t *corpus = json_load_file(corpus_path, 0, &jerr);
    if (!json_is_array(corpus)) {
        json_decref(corpus);
        return fail("--bench needs a JSON array of strings");
    }
    size_t bytes = 0, tokens = 0, i;
    json_t *v;
    double best = 1e30;
    for (int pass = 0; pass <= repeat; pass++) {
        size_t nt = 0, nb = 0;
        double t0 = moe_seconds();
        json_array_foreach(corpus, i, v) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (!json_is_string(v) || moe_tokenizer_encode(tok, json_string_value(v), json_string_length(v),
                                                           special, &ids, &n, NULL) != MOE_OK) {
                json_decref(corpus);
                return fail(json_is_string(v) ? moe_last_error() : "corpus entries must be strings");
            }
            nt += n;
            nb += json_string_length(v);
            free(ids);
        }
        double t = moe_seconds() - t0;
        if (pass > 0 && t < best) best = t; /* pass 0 warms the caches */
        bytes = nb;
        tokens = nt;
    }
    printf("{\"strings\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, "
           "\"bytes_per_s\": %.1f, \"tokens_per_s\": %.1f}\n", json_array_size(corpus), bytes,
           tokens, best, (double)bytes / best, (double)tokens / best);
    json_decref(corpus);
    return 0;
}

int moe_cli_tokenize(int argc, char **argv)
{
    struct tokenize_opts o = {.repeat = 3};
    struct moe_cli_args a;
    const int prc = moe_cli_parse(&tokenize_cmd, argc, argv, &o, &a);
    if (prc >= 0) return prc;
    if (a.n_pos > 2) return fail("too many arguments (try --help)");
    const char *dir = a.n_pos > 0 ? a.pos[0] : NULL, *text = a.n_pos > 1 ? a.pos[1] : NULL, *decode = o.decode,
               *bench_path = o.bench;
    const int repeat = (int)o.repeat;
    const bool special = !o.no_special;
    if (!dir) return fail("missing MODEL_DIR (try --help)");
    if (bench_path) {
        struct moe_tokenizer bt;
        if (moe_tokenizer_load(&bt, dir) != MOE_OK) return fail(moe_last_error());
        int brc = bench(&bt, bench_path, repeat, special);
        moe_tokenizer_free(&bt);
        return brc;
    }
    if (decode && text) return fail("give either TEXT or --decode IDS, not both");
    if (!decode && !text) return fail("missing TEXT (or --decode IDS)");

    char *input = NULL;
    size_t len = 0;
    const char *src = decode ? decode : text;
    if (!strcmp(src, "-")) {
        if (!(input = moe_cli_read_all(stdin, &len))) return fail("cannot read standard input");
        src = input;
    } else {
        len = strlen(src);
    }

    struct moe_tokenizer tok;
    int rc = 0;
    if (moe_tokenizer_load(&tok, dir) != MOE_OK) {
        rc = fail(moe_last_error());
        free(input);
        return rc;
    }
    if (decode) {
        int32_t *ids = NULL;
        size_t n = 0;
        char *out = NULL;
        if (parse_ids(src, &ids, &n)) rc = 1;
        else if (moe_tokenizer_decode(&tok, ids, n, !special, &out) != MOE_OK) rc = fail(moe_last_error());
        else printf("%s\n", out);
        free(out);
        free(ids);
    } else {
        int32_t *ids = NULL;
        size_t n = 0;
        bool bad = false;
        if (moe_tokenizer_encode(&tok, src, len, special, &ids, &n, &bad) != MOE_OK) {
            rc = fail(moe_last_error());
        } else {
            if (bad)
                fprintf(stderr, "moerun tokenize: warning: input is not valid UTF-8; invalid bytes "
                                "were replaced by U+FFFD\n");
            for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
            printf("\n");
        }
        free(ids);
    }
    if (fflush(stdout) != 0 && !rc) rc = fail("cannot write standard output");
    moe_tokenizer_free(&tok);
    free(input);
    return rc;
}
