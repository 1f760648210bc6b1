/* test_tokenizer.c - conformance with the Rust tokenizers crate, streaming
 * decode, byte fallback, invalid UTF-8 and malformed tokenizer.json files.
 *
 * Fixtures come from tests/reference/make_tokenizer_fixtures.py: for each
 * pipeline, corpus.json strings with the ids and decoded text the Python
 * `tokenizers` package produced. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/tokenizer.h"
#include "testutil.h"

#define TOK_DIR FIXTURE_DIR "/tokenizers"


static json_t *load_json(const char *path)
{
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert(j, "%s: %s (line %d)", path, err.text, err.line);
    return j;
}

static void load_fixture(struct moe_tokenizer *tok, const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", TOK_DIR, name);
    enum moe_status st = moe_tokenizer_load(tok, dir);
    cr_assert_eq(st, MOE_OK, "%s: %s", name, moe_last_error());
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

/* Every corpus string: identical ids and identical decoded text. */
static void check_conformance(const char *name)
{
    struct moe_tokenizer tok;
    load_fixture(&tok, name);
    json_t *corpus = load_json(TOK_DIR "/corpus.json");
    char path[512];
    snprintf(path, sizeof path, "%s/%s/expected.json", TOK_DIR, name);
    json_t *exp = load_json(path);
    size_t n = json_array_size(corpus), ok_ids = 0, ok_text = 0;
    cr_assert_eq(json_array_size(exp), n);
    long first_bad = -1;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(corpus, i), *e = json_array_get(exp, i);
        json_t *want = json_object_get(e, "ids");
        int32_t *ids;
        size_t k;
        bool bad_utf8;
        cr_assert_eq(moe_tokenizer_encode(&tok, json_string_value(s), json_string_length(s), true,
                                          &ids, &k, &bad_utf8), MOE_OK, "%s", moe_last_error());
        cr_assert_not(bad_utf8);
        bool same = k == json_array_size(want);
        for (size_t j = 0; same && j < k; j++)
            same = ids[j] == (int32_t)json_integer_value(json_array_get(want, j));
        if (same) {
            ok_ids++;
        } else if (first_bad < 0) {
            first_bad = (long)i;
            int32_t *w = malloc((json_array_size(want) + 1) * sizeof *w);
            for (size_t j = 0; j < json_array_size(want); j++)
                w[j] = (int32_t)json_integer_value(json_array_get(want, j));
            fprintf(stderr, "%s: string %zu '%.80s' encodes differently\n", name, i,
                    json_string_value(s));
            print_ids("got ", ids, k);
            print_ids("want", w, json_array_size(want));
            free(w);
        }
        /* decode the reference ids */
        size_t nw = json_array_size(want);
        int32_t *w = malloc((nw + 1) * sizeof *w);
        for (size_t j = 0; j < nw; j++) w[j] = (int32_t)json_integer_value(json_array_get(want, j));
        char *text;
        cr_assert_eq(moe_tokenizer_decode(&tok, w, nw, false, &text), MOE_OK, "%s", moe_last_error());
        json_t *wt = json_object_get(e, "text");
        const char *want_text = json_is_string(wt) ? json_string_value(wt) : json_string_value(s);
        if (strcmp(text, want_text) == 0) ok_text++;
        else if (ok_text + 1 + (n - i - 1) == n)
            fprintf(stderr, "%s: string %zu decodes to '%.80s', want '%.80s'\n", name, i, text,
                    want_text);
        free(text);
        free(w);
        free(ids);
    }
    fprintf(stderr, "%s: ids %zu/%zu identical, text %zu/%zu identical\n", name, ok_ids, n, ok_text, n);
    cr_expect_eq(ok_ids, n, "%s: %zu of %zu strings encode differently (first: %ld)", name,
                 n - ok_ids, n, first_bad);
    cr_expect_eq(ok_text, n, "%s: %zu of %zu strings decode differently", name, n - ok_text, n);
    json_decref(corpus);
    json_decref(exp);
    moe_tokenizer_free(&tok);
}

Test(tokenizer, qwen2_matches_reference) { check_conformance("qwen2"); }
Test(tokenizer, llama3_matches_reference) { check_conformance("llama3"); }
Test(tokenizer, neox_matches_reference) { check_conformance("neox"); }
Test(tokenizer, llama2_matches_reference) { check_conformance("llama2"); }
Test(tokenizer, mixtral_matches_reference) { check_conformance("mixtral"); }
