/* test_cli_opts.c - the moerun binary's options end to end: the option
 * table (runtime/cli/cli_opts.c) as every command's --help and parser see
 * it, and speculative decoding's options, with run, batch and bench giving
 * the same text with --spec as without.  The other commands' tests are in
 * test_cli.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/testutil.h"

/* --- the option table (runtime/cli/cli_opts.c) --- */

static const char *const all_cmds[] = {"inspect", "run", "chat", "serve", "batch", "plan",
                                       "bench", "ppl", "tokenize", "stats", "synth"};

/* Every option a command's --help lists, the parser takes: given with a
 * value and followed by an option no command has, the error is about the
 * value or the later option, never that the listed one is unknown. */
Test(cli, help_lists_only_options_the_parser_takes)
{
    for (size_t c = 0; c < sizeof all_cmds / sizeof all_cmds[0]; c++) {
        char cmd[1024], help[16384], out[4096], unknown[160];
        snprintf(cmd, sizeof cmd, "%s %s --help", MOERUN_BINARY, all_cmds[c]);
        cr_assert_eq(tu_run(cmd, help, sizeof help), 0, "%s --help", all_cmds[c]);
        cr_assert(!strncmp(help, "usage: moerun ", 14), "%s", help);
        int listed = 0;
        for (char *line = help; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
            if (strncmp(line, "  -", 3)) continue;
            char name[64] = "", letter = 0;
            if (line[3] != '-') { /* "  -n, --max-tokens N" */
                letter = line[3];
                cr_assert(!strncmp(line + 4, ", --", 4), "%s: %.60s", all_cmds[c], line);
                sscanf(line + 8, "%63[a-z0-9-]", name);
            } else {
                sscanf(line + 4, "%63[a-z0-9-]", name);
            }
            cr_assert(name[0], "%s: %.60s", all_cmds[c], line);
            if (!strcmp(name, "help")) continue;
            listed++;
            snprintf(cmd, sizeof cmd, "%s %s --%s=1 --zz-no-such-option 2>&1", MOERUN_BINARY, all_cmds[c], name);
            cr_expect_neq(tu_run(cmd, out, sizeof out), 0, "%s --%s", all_cmds[c], name);
            snprintf(unknown, sizeof unknown, "unknown option '--%s'", name);
            cr_expect(!strstr(out, unknown), "%s --help lists --%s, which the parser refuses: %s", all_cmds[c],
                      name, out);
            cr_expect(strstr(out, "moerun ") && !strchr(strchr(out, '\n') + 1, '\n'), "%s --%s: %s", all_cmds[c],
                      name, out);
            if (!letter) continue;
            snprintf(cmd, sizeof cmd, "%s %s -%c 1 --zz-no-such-option 2>&1", MOERUN_BINARY, all_cmds[c], letter);
            tu_run(cmd, out, sizeof out);
            snprintf(unknown, sizeof unknown, "unknown option '-%c'", letter);
            cr_expect(!strstr(out, unknown), "%s: -%c listed, refused: %s", all_cmds[c], letter, out);
        }
        cr_expect(listed > 0 || !strcmp(all_cmds[c], "nothing"), "%s --help lists no option", all_cmds[c]);
        /* and what it does not list, it refuses */
        snprintf(cmd, sizeof cmd, "%s --zz-no-such-option", all_cmds[c]);
        tu_expect_one_line_error(cmd, "unknown option '--zz-no-such-option'");
    }
}

/* A value out of range is one line naming the option, the value and what
 * it takes, generated from the option's row. */
Test(cli, range_error_names_option_value_and_range)
{
    tu_expect_one_line_error("bench --kv-block 0", "moerun bench: --kv-block '0' (an integer from 1 to 4096)");
    tu_expect_one_line_error("run -n 0", "moerun run: --max-tokens '0' (an integer from 1 to 16777216)");
    tu_expect_one_line_error("plan --hit-rate 1.5", "moerun plan: --hit-rate '1.5' (a number x with 0 <= x <= 1)");
    tu_expect_one_line_error("bench --range-ratio 1", "moerun bench: --range-ratio '1' (a number x with 0 <= x < 1)");
    tu_expect_one_line_error("serve --port 70000", "moerun serve: --port '70000' (an integer from 0 to 65535)");
    tu_expect_one_line_error("stats --width x", "moerun stats: --width 'x' (an integer from 8 to 4096)");
    tu_expect_one_line_error("synth --layout flat", "moerun synth: --layout 'flat' (use stacked or per-expert)");
    tu_expect_one_line_error("tokenize --repeat 0", "moerun tokenize: --repeat '0' (an integer from 1 to 1048576)");
}

/* A shared option is one row: the same check, message and help line in
 * every command that takes it. */
Test(cli, shared_option_behaves_the_same_everywhere)
{
    static const struct { const char *opt, *cmds[5]; } cases[] = {
        {"--kv-block 0", {"run", "bench", "batch", "ppl", "serve"}},
        {"--moe-top-k 0", {"plan", "bench", "run", "inspect" /* not taken */, NULL}},
        {"--quantize q3", {"plan", "bench", "chat", "ppl", NULL}},
        {"--kv-dtype f7", {"plan", "bench", "run", "serve", NULL}},
        {"--gpu-experts-cpu-rows -1", {"plan", "bench", "run", NULL}},
        {"--seed -1", {"run", "chat", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char first[512] = "", cmd[1024], out[4096], help0[512] = "";
        for (int k = 0; k < 5 && cases[i].cmds[k]; k++) {
            const char *c = cases[i].cmds[k];
            snprintf(cmd, sizeof cmd, "%s %s %s 2>&1", MOERUN_BINARY, c, cases[i].opt);
            cr_expect_neq(tu_run(cmd, out, sizeof out), 0, "%s %s", c, cases[i].opt);
            if (!strcmp(c, "inspect")) { /* a command without it refuses it by name */
                cr_expect(strstr(out, "unknown option '--moe-top-k'"), "%s", out);
                continue;
            }
            char prefix[64];
            snprintf(prefix, sizeof prefix, "moerun %s: ", c);
            cr_assert(!strncmp(out, prefix, strlen(prefix)), "%s", out);
            if (!first[0]) snprintf(first, sizeof first, "%.500s", out + strlen(prefix));
            cr_expect_str_eq(out + strlen(prefix), first, "%s %s differs", c, cases[i].opt);
            /* its help line is the same too */
            char name[64], *line;
            sscanf(cases[i].opt, "%63s", name);
            snprintf(cmd, sizeof cmd, "%s %s --help | grep -- '^  %s '", MOERUN_BINARY, c, name);
            cr_expect_eq(tu_run(cmd, out, sizeof out), 0, "%s --help has no %s", c, name);
            line = out;
            if (!help0[0]) snprintf(help0, sizeof help0, "%.500s", line);
            cr_expect_str_eq(line, help0, "%s --help: %s", c, name);
        }
    }
}

/* --- speculative decoding's options --- */

/* The --spec options are rows of the one table: every command that
 * generates takes them with the same one-line errors; ppl, which does not
 * generate, refuses them by name. */
Test(cli, spec_options_refuse_bad_values_in_one_line)
{
    static const struct { const char *opt, *msg; } cases[] = {
        {"--spec foo", "--spec 'foo' (use none, ngram, ngram:N with N from 1 to 64, or mtp)"},
        {"--spec ngram:0", "--spec 'ngram:0' (use none, ngram, ngram:N with N from 1 to 64, or mtp)"},
        {"--spec ngram:65", "--spec 'ngram:65' (use none, ngram, ngram:N with N from 1 to 64, or mtp)"},
        {"--spec ngram:", "--spec 'ngram:' (use none, ngram, ngram:N with N from 1 to 64, or mtp)"},
        {"--spec none:3", "--spec 'none:3' (use none, ngram, ngram:N with N from 1 to 64, or mtp)"},
        {"--spec ngramx", "--spec 'ngramx' (use none, ngram, ngram:N with N from 1 to 64, or mtp)"},
        {"--spec-tokens 0", "--spec-tokens '0' (an integer from 1 to 16)"},
        {"--spec-tokens 17", "--spec-tokens '17' (an integer from 1 to 16)"},
        {"--spec-max-batch -1", "--spec-max-batch '-1' (an integer from 0 to 65536)"},
    };
    static const char *const cmds[] = {"run", "chat", "batch", "bench", "serve"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
            char args[256], msg[256];
            snprintf(args, sizeof args, "%s %s", cmds[c], cases[i].opt);
            snprintf(msg, sizeof msg, "moerun %s: %s", cmds[c], cases[i].msg);
            tu_expect_one_line_error(args, msg);
        }
    tu_expect_one_line_error("ppl --spec ngram", "unknown option '--spec'");
}

/* A story prompt of the demo model that quotes itself, so n-grams match. */
#define SPEC_PROMPT                                                                                            \
    "Once upon a time, there was a little cat named Lily. Lily liked to play in the park. One day, Lily "   \
    "found a ball near the river. Lily felt happy. Then Lily met a kind dog. They decided to run together. " \
    "The end. Once upon a time, there was a little cat named Lily. Lily liked to"

/* run --spec ngram: the text is the text without (greedy), token for token,
 * for each K and n-gram size; the summary gives the mean accepted length
 * and the acceptance, and the valid values are taken. */
Test(cli, run_spec_ngram_same_text_and_summary)
{
    char cmd[2048], plain[8192], out[8192], err[4096], errf[64];
    snprintf(errf, sizeof errf, "/tmp/moerun-spec-%d.err", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s run %s/models/demo-moe -p '%s' -n 48 --ignore-eos --backend cpu --threads 1 "
             "2>/dev/null", MOERUN_BINARY, MOERUN_SOURCE_DIR, SPEC_PROMPT);
    cr_assert_eq(tu_run(cmd, plain, sizeof plain), 0);
    cr_assert(strlen(plain) > 40, "%s", plain);
    static const char *const specs[] = {"--spec ngram", "--spec ngram:2 --spec-tokens 1",
                                        "--spec ngram:5 --spec-tokens 8",
                                        "--spec ngram --spec-tokens 16 --spec-max-batch 1 --spec-adaptive"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s run %s/models/demo-moe -p '%s' -n 48 --ignore-eos --backend cpu --threads 1 %s "
                 "2>%s", MOERUN_BINARY, MOERUN_SOURCE_DIR, SPEC_PROMPT, specs[i], errf);
        cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", specs[i]);
        cr_expect_str_eq(out, plain, "%s", specs[i]);
        snprintf(cmd, sizeof cmd, "grep -c '^moerun run: speculation: mean accepted length [0-9.]* "
                 "([1-9][0-9]* drafts, [1-9][0-9]* drafted tokens, acceptance [0-9.]*%%)$' %s", errf);
        cr_expect_eq(tu_run(cmd, err, sizeof err), 0, "%s: no summary line", specs[i]);
    }
    unlink(errf);
    /* without --spec, no speculation line */
    snprintf(cmd, sizeof cmd, "%s run %s/models/demo-moe -p '%s' -n 8 --backend cpu --threads 1 2>&1 >/dev/null",
             MOERUN_BINARY, MOERUN_SOURCE_DIR, SPEC_PROMPT);
    cr_assert_eq(tu_run(cmd, err, sizeof err), 0);
    cr_expect(!strstr(err, "speculation"), "%s", err);
}

/* batch takes the options: the same completions, and its summary says
 * what speculation did. */
Test(cli, batch_spec_same_output)
{
    char dir[] = "/tmp/moerun-bspec-XXXXXX", cmd[4096], a[8192], b[8192], err[4096];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "%s/in.jsonl", dir);
    FILE *f = fopen(cmd, "w");
    cr_assert(f);
    fprintf(f, "{\"prompt\": \"%s\", \"max_tokens\": 32, \"temperature\": 0}\n"
               "{\"prompt\": \"Once upon a time,\", \"max_tokens\": 24, \"temperature\": 0}\n", SPEC_PROMPT);
    fclose(f);
    for (int s = 0; s < 2; s++) {
        snprintf(cmd, sizeof cmd, "%s batch %s/models/demo-moe %s/in.jsonl -o %s/out%d.jsonl --backend cpu "
                 "--threads 1 %s 2>%s/err && cut -d, -f3- %s/out%d.jsonl | sed 's/,\"metrics\":{[^}]*}//'",
                 MOERUN_BINARY, MOERUN_SOURCE_DIR, dir, dir, s, s ? "--spec ngram" : "", dir, dir, s);
        cr_assert_eq(tu_run(cmd, s ? b : a, sizeof a), 0);
    }
    cr_expect(strstr(a, "token_ids"), "%s", a);
    cr_expect_str_eq(b, a);
    snprintf(cmd, sizeof cmd, "grep '^\\[batch\\] speculation: mean accepted length' %s/err", dir);
    cr_expect_eq(tu_run(cmd, err, sizeof err), 0, "no speculation summary");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(tu_run(cmd, a, sizeof a), 0);
}

/* bench --spec: both configurations on the same requests (on the CPU no
 * request's output differs), tokens/s of each, the speedup and the
 * acceptance. */
Test(cli, bench_spec_reports_both_and_acceptance)
{
    char cmd[2048], out[16384];
    snprintf(cmd, sizeof cmd, "%s bench %s/models/demo-moe --backend cpu --threads 1 --spec ngram --prompts "
             "%s/bench/spec-prompts.txt --decode 1,3 --repeat 2 --output-len 16 --spec-max-batch 2 --json "
             "--no-stats 2>&1", MOERUN_BINARY, MOERUN_SOURCE_DIR, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e), *sp = json_object_get(j, "spec"), *rows = json_object_get(sp, "rows");
    cr_assert(j, "%s: %s", e.text, out);
    cr_expect_str_eq(json_string_value(json_object_get(sp, "proposer")), "ngram");
    cr_expect_eq(json_integer_value(json_object_get(sp, "tokens")), 4);
    cr_assert_eq(json_array_size(rows), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *r = json_array_get(rows, i);
        cr_expect(json_real_value(json_object_get(r, "plain_tokens_per_s")) > 0);
        cr_expect(json_real_value(json_object_get(r, "spec_tokens_per_s")) > 0);
        cr_expect(json_real_value(json_object_get(r, "speedup")) > 0);
        json_t *differ = json_object_get(r, "requests_differing");
        cr_expect(json_is_integer(differ) && json_integer_value(differ) == 0, "%s", out);
        const json_int_t drafts = json_integer_value(json_object_get(r, "drafts")),
                         drafted = json_integer_value(json_object_get(r, "draft_tokens")),
                         accepted = json_integer_value(json_object_get(r, "accepted_tokens"));
        if (i == 0) { /* batch 1 speculates; batch 3 is above --spec-max-batch 2 */
            cr_expect(drafts > 0 && drafted >= drafts && accepted <= drafted, "%s", out);
            cr_expect_float_eq(json_real_value(json_object_get(r, "mean_accepted_length")),
                               (double)accepted / (double)drafts, 1e-9);
        } else {
            cr_expect_eq(drafts, 0, "%s", out);
        }
    }
    json_decref(j);
    /* the text table */
    snprintf(cmd, sizeof cmd, "%s bench %s/models/demo-moe --backend cpu --threads 1 --spec ngram --prompts "
             "%s/bench/spec-prompts.txt --decode 1 --repeat 1 --output-len 8 --no-stats 2>&1",
             MOERUN_BINARY, MOERUN_SOURCE_DIR, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "plain tok/s") && strstr(out, "spec tok/s") && strstr(out, "acceptance"), "%s", out);
    snprintf(cmd, sizeof cmd, "bench %s/models/demo-moe --backend cpu --spec ngram --prompts /nonexistent/p.txt",
             MOERUN_SOURCE_DIR);
    tu_expect_one_line_error(cmd, "--prompts /nonexistent/p.txt cannot be read");
    /* JSON lines: each line's "prompt" (models/demo-prompts.jsonl holds 16) */
    snprintf(cmd, sizeof cmd, "%s bench %s/models/demo-moe --backend cpu --threads 1 --spec ngram --prompts "
             "%s/models/demo-prompts.jsonl --decode 1 --repeat 1 --output-len 4 --json --no-stats 2>&1",
             MOERUN_BINARY, MOERUN_SOURCE_DIR, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    j = json_loads(out, 0, &e);
    cr_assert(j, "%s: %s", e.text, out);
    cr_expect_eq(json_integer_value(json_object_get(j, "n_prompts")), 16, "%s", out);
    json_decref(j);
    /* a JSON line's prompt is read as the same text on a line of its own */
    json_int_t toks[2];
    static const char *const files[2] = {"{\"prompt\": \"Once upon a time\"}\n{\"id\": 2, \"prompt\": \"The dog\"}\n",
                                         "Once upon a time\nThe dog\n"};
    for (int f = 0; f < 2; f++) {
        char path[] = "/tmp/moerun-prompts-XXXXXX";
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        cr_assert_eq(write(fd, files[f], strlen(files[f])), (ssize_t)strlen(files[f]));
        close(fd);
        snprintf(cmd, sizeof cmd, "%s bench %s/models/demo-moe --backend cpu --threads 1 --spec ngram --prompts %s "
                 "--decode 1 --repeat 1 --output-len 2 --json --no-stats 2>&1", MOERUN_BINARY, MOERUN_SOURCE_DIR, path);
        cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
        unlink(path);
        j = json_loads(out, 0, &e);
        cr_assert(j, "%s: %s", e.text, out);
        cr_expect_eq(json_integer_value(json_object_get(j, "n_prompts")), 2, "%s", out);
        toks[f] = json_integer_value(json_object_get(j, "prompt_tokens"));
        json_decref(j);
    }
    cr_expect(toks[0] > 2 && toks[0] == toks[1], "JSON lines %lld tokens, text lines %lld", (long long)toks[0],
              (long long)toks[1]);
    char path[] = "/tmp/moerun-prompts-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "Once upon a time\n{\"text\": \"x\"}\n", 31), 31);
    close(fd);
    snprintf(cmd, sizeof cmd, "bench %s/models/demo-moe --backend cpu --spec ngram --prompts %s", MOERUN_SOURCE_DIR, path);
    tu_expect_one_line_error(cmd, "line 2: a JSON line needs a \"prompt\" string");
    unlink(path);
}
