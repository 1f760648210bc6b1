/* test_text.c - text in, text out, end to end through the binary: on every
 * fixture model, `moerun run -p TEXT` (tokenizer -> engine -> streaming
 * decode) prints exactly the text transformers' generate() + decode produced
 * (tests/fixtures/<model>/text_reference.json, made by
 * tests/reference/make_text_fixtures.py); stop strings across token
 * boundaries; bad input. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/testutil.h"

/* Single-quotes s for the shell. */
static void shq(char *dst, size_t n, const char *s)
{
    size_t o = 0;
    dst[o++] = '\'';
    for (; *s && o + 5 < n; s++) {
        if (*s == '\'') {
            memcpy(dst + o, "'\\''", 4);
            o += 4;
        } else {
            dst[o++] = *s;
        }
    }
    dst[o++] = '\'';
    dst[o] = '\0';
}

static void check_model_text(const char *name)
{
    char path[512], cmd[4096], q[1024], out[8192];
    snprintf(path, sizeof path, "%s/%s/text_reference.json", FIXTURE_DIR, name);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    cr_assert(root, "%s: %s", path, jerr.text);
    json_t *cases = json_object_get(root, "cases"), *c;
    size_t i;
    cr_assert(json_array_size(cases) >= 3);
    json_array_foreach(cases, i, c) {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        const char *want = json_string_value(json_object_get(c, "text"));
        shq(q, sizeof q, prompt);
        /* the tokenizer gives transformers' prompt ids */
        snprintf(cmd, sizeof cmd, "%s tokenize %s/%s %s", MOERUN_BINARY, FIXTURE_DIR, name, q);
        cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
        char ids[1024] = "";
        size_t k;
        json_t *v;
        json_array_foreach(json_object_get(c, "prompt_ids"), k, v)
            snprintf(ids + strlen(ids), sizeof ids - strlen(ids), k ? ",%lld" : "%lld",
                     (long long)json_integer_value(v));
        strcat(ids, "\n");
        cr_expect_str_eq(out, ids, "%s: prompt ids of %s", name, prompt);
        /* generation streams transformers' text */
        snprintf(cmd, sizeof cmd, "%s run %s/%s -p %s -n 24 --ignore-eos --backend cpu 2>/dev/null",
                 MOERUN_BINARY, FIXTURE_DIR, name, q);
        cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
        char expect[4096];
        snprintf(expect, sizeof expect, "%s\n", want);
        cr_expect_str_eq(out, expect, "%s: text generated from '%s'", name, prompt);
    }
    json_decref(root);
}

Test(text, mixtral_generates_transformers_text) { check_model_text("mixtral"); }
Test(text, qwen2_moe_generates_transformers_text) { check_model_text("qwen2_moe"); }
Test(text, qwen3_moe_generates_transformers_text) { check_model_text("qwen3_moe"); }
Test(text, olmoe_generates_transformers_text) { check_model_text("olmoe"); }
Test(text, llama_generates_transformers_text) { check_model_text("llama"); }
Test(text, qwen2_generates_transformers_text) { check_model_text("qwen2"); }
Test(text, qwen3_generates_transformers_text) { check_model_text("qwen3"); }

/* A stop string that spans token boundaries cuts the text just before it. */
Test(text, stop_string_across_tokens)
{
    char path[512], cmd[4096], q[1024], qs[256], out[8192];
    snprintf(path, sizeof path, "%s/llama/text_reference.json", FIXTURE_DIR);
    json_t *root = json_load_file(path, 0, NULL);
    json_t *c = json_array_get(json_object_get(root, "cases"), 0);
    const char *prompt = json_string_value(json_object_get(c, "prompt"));
    const char *text = json_string_value(json_object_get(c, "text"));
    cr_assert(strlen(text) > 16);
    char stop[8];
    memcpy(stop, text + 9, 5); /* 5 characters from the middle */
    stop[5] = '\0';
    size_t cut = (size_t)(strstr(text, stop) - text);
    shq(q, sizeof q, prompt);
    shq(qs, sizeof qs, stop);
    snprintf(cmd, sizeof cmd, "%s run %s/llama -p %s -n 24 --ignore-eos --stop %s --backend cpu 2>&1",
             MOERUN_BINARY, FIXTURE_DIR, q, qs);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    char expect[512];
    snprintf(expect, sizeof expect, "%.*s\n", (int)cut, text);
    cr_assert(strncmp(out, expect, strlen(expect)) == 0, "stop '%s': got '%s', want '%s'", stop, out, expect);
    cr_assert(strstr(out, "(stop)"), "finish reason stop: %s", out);
    json_decref(root);
}

Test(text, invalid_utf8_prompt_is_replaced_and_reported)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "printf 'ab\\377cd' | %s run %s/llama -p - -n 2 --backend cpu 2>&1",
             MOERUN_BINARY, FIXTURE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "not valid UTF-8"), "%s", out);
}

Test(text, prompt_beyond_context_is_refused_before_allocation)
{
    char *long_prompt = malloc(8000);
    memset(long_prompt, 0, 8000);
    for (int i = 0; i < 700; i++) strcat(long_prompt, "cat ");
    char *cmd = malloc(10000), out[4096];
    snprintf(cmd, 10000, "%s run %s/llama -p '%s' -n 4 --backend cpu 2>&1", MOERUN_BINARY,
             FIXTURE_DIR, long_prompt);
    cr_assert_neq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "exceeds the model's context of 512"), "%s", out);
    free(cmd);
    free(long_prompt);
}

Test(text, broken_tokenizer_is_an_error_but_ids_still_work)
{
    char dir[] = "/tmp/moerun-tok-XXXXXX", cmd[2048], out[4096];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp %s/qwen2/config.json %s/qwen2/model.safetensors %s/ && "
             "printf '{\"model\": {\"type\": \"BPE\", \"vocab\": ' > %s/tokenizer.json",
             FIXTURE_DIR, FIXTURE_DIR, dir, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s run %s -p hello -n 2 --backend cpu 2>&1", MOERUN_BINARY, dir);
    cr_assert_neq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "tokenizer.json"), "%s", out);
    cr_assert(strstr(out, "--prompt-ids"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s run %s --prompt-ids 1,2,3 -n 2 --backend cpu 2>/dev/null",
             MOERUN_BINARY, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* moerun batch: every good line gets what `moerun run` gives it alone; bad
 * lines get an error naming the line; output in input order. */
Test(text, batch_matches_run_and_reports_bad_lines)
{
    char dir[] = "/tmp/moerun-batch-XXXXXX", path[256], out_path[256], cmd[4096], out[65536];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/in.jsonl", dir);
    snprintf(out_path, sizeof out_path, "%s/out.jsonl", dir);
    const char *prompts[] = {"Once upon a time", "The quick brown fox", "hello world", "a b c",
                             "the cat sat on the mat", "We route tokens"};
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 6; i++) {
        fprintf(f, "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}\n",
                prompts[i], 3 + 4 * i);
        if (i == 2) fprintf(f, "{\"prompt\": \"x\", \"max_tokens\": \"many\"}\n");
        if (i == 4) fprintf(f, "{oops\n");
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s batch %s/qwen3_moe %s -o %s --backend cpu --kv-budget 64KiB "
             "--kv-block 4 --max-batch-tokens 16 2>&1", MOERUN_BINARY, FIXTURE_DIR, path, out_path);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "8 requests (2 refused)"), "%s", out);
    FILE *o = fopen(out_path, "r");
    char *line = NULL;
    size_t cap = 0;
    int n = 0, good = 0;
    while (getline(&line, &cap, o) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        cr_assert(j, "output line %d is JSON", n);
        cr_assert_eq(json_integer_value(json_object_get(j, "index")), n);
        if (n == 3 || n == 6) {
            const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
            cr_assert(msg && strstr(msg, n == 3 ? "line 4" : "line 7"), "%s", line);
        } else {
            const char *text = json_string_value(
                json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
            char q[256], solo[4096];
            shq(q, sizeof q, prompts[good]);
            snprintf(cmd, sizeof cmd, "%s run %s/qwen3_moe -p %s -n %d --ignore-eos --backend cpu "
                     "2>/dev/null", MOERUN_BINARY, FIXTURE_DIR, q, 3 + 4 * good);
            cr_assert_eq(tu_run(cmd, solo, sizeof solo), 0);
            solo[strlen(solo) - 1] = '\0';
            cr_assert_str_eq(text, solo, "request %d ('%s')", good, prompts[good]);
            good++;
        }
        json_decref(j);
        n++;
    }
    free(line);
    fclose(o);
    cr_assert_eq(n, 8);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* moerun batch takes logit_bias as the server does: +100 on token 7 makes
 * every greedy token 7; a key outside the vocabulary refuses the line. */
Test(text, batch_logit_bias)
{
    char dir[] = "/tmp/moerun-batch-XXXXXX", path[256], out_path[256], cmd[4096], out[65536];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/in.jsonl", dir);
    snprintf(out_path, sizeof out_path, "%s/out.jsonl", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"prompt\": [1, 2, 3], \"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true, "
               "\"logit_bias\": {\"7\": 100}}\n");
    fprintf(f, "{\"prompt\": [1, 2, 3], \"max_tokens\": 4, \"logit_bias\": {\"256\": 1}}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s batch %s/qwen3_moe %s -o %s --backend cpu 2>&1", MOERUN_BINARY,
             FIXTURE_DIR, path, out_path);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "cat %s", out_path);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    char *nl = strchr(out, '\n');
    cr_assert(nl);
    *nl = '\0';
    json_t *a = json_loads(out, 0, NULL), *b = json_loads(nl + 1, 0, NULL);
    cr_assert(a && b, "%s", out);
    json_t *ids = json_object_get(json_array_get(json_object_get(a, "choices"), 0), "token_ids");
    cr_assert_eq(json_array_size(ids), 4);
    for (size_t i = 0; i < 4; i++) cr_expect_eq(json_integer_value(json_array_get(ids, i)), 7);
    const char *msg = json_string_value(json_object_get(json_object_get(b, "error"), "message"));
    cr_expect(msg && strstr(msg, "not a token id below 256"), "%s", nl + 1);
    json_decref(a);
    json_decref(b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* moerun chat: turns through the model's chat template; the second turn
 * reuses the first turn's cached blocks; /reset and end of input work. */
Test(text, chat_reuses_earlier_turns_from_the_cache)
{
    char cmd[2048], out[16384];
    snprintf(cmd, sizeof cmd, "printf 'Hello there, how are you today\\nAnd then?\\n/reset\\nAgain\\n' | "
             "%s chat %s/models/demo-moe -n 8 -v --temp 0 --backend cpu 2>&1", MOERUN_BINARY,
             MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "[turn 1: "), "%s", out);
    const char *t2 = strstr(out, "[turn 2: ");
    cr_assert(t2, "%s", out);
    int prompt, reused;
    cr_assert_eq(sscanf(t2, "[turn 2: %d prompt tokens, %d reused", &prompt, &reused), 2);
    cr_assert(reused >= 16, "turn 2 reuses the first turn's full blocks: %s", t2);
    cr_assert(strstr(out, "[turn 3: "), "%s", out);
    cr_assert(!strstr(out, "speculation"), "no speculation, no line: %s", out);
}

/* moerun chat --spec ngram -v: each turn says what speculation did. */
Test(text, chat_reports_speculation)
{
    char cmd[2048], out[16384];
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time\n' | %s chat %s/models/demo-moe -n 24 -v --temp 0 "
             "--backend cpu --spec ngram --spec-tokens 2 2>&1", MOERUN_BINARY, MOERUN_SOURCE_DIR);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    const char *l = strstr(out, "[turn 1 speculation: ");
    cr_assert(l, "%s", out);
    int steps, drafted, accepted;
    cr_assert_eq(sscanf(l, "[turn 1 speculation: %d verifications, %d drafted tokens, %d accepted", &steps,
                        &drafted, &accepted), 3, "%s", l);
    cr_assert(steps > 0 && drafted >= steps && drafted <= 2 * steps && accepted <= drafted, "%s", l);
}
