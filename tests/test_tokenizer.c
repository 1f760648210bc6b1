/* test_tokenizer.c - conformance with the Rust tokenizers crate, streaming
 * decode, byte fallback, invalid UTF-8 and malformed tokenizer.json files.
 *
 * Fixtures come from tests/reference/make_tokenizer_fixtures.py: for each
 * pipeline, corpus.json strings with the ids and decoded text the Python
 * `tokenizers` package produced. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/text/tokenizer.h"
#include "testutil.h"

int moe_cli_tokenize(int argc, char **argv);

#define TOK_DIR FIXTURE_DIR "/tokenizers"


static json_t *load_json(const char *path)
{
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert(j, "%s: %s (line %d)", path, err.text, err.line);
    return j;
}

/* name is a fixture folder, or an absolute model directory */
static void load_fixture(struct moe_tokenizer *tok, const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", name[0] == '/' ? "" : TOK_DIR, name);
    enum moe_status st = moe_tokenizer_load(tok, dir);
    cr_assert_eq(st, MOE_OK, "%s: %s", name, moe_last_error());
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

/* The strings a folder is checked on: the shared corpus.json, then the
 * folder's own extra.json when it has one (family-specific special tokens). */
static json_t *load_corpus(const char *name)
{
    json_t *corpus = load_json(TOK_DIR "/corpus.json");
    char path[512];
    snprintf(path, sizeof path, "%s/%s/extra.json", name[0] == '/' ? "" : TOK_DIR, name);
    if (access(path, R_OK) == 0) {
        json_t *extra = load_json(path);
        cr_assert(json_is_array(extra), "%s is not an array", path);
        cr_assert_eq(json_array_extend(corpus, extra), 0);
        json_decref(extra);
    }
    return corpus;
}

/* Every corpus string: identical ids and identical decoded text. */
static void check_conformance(const char *name)
{
    struct moe_tokenizer tok;
    load_fixture(&tok, name);
    json_t *corpus = load_corpus(name);
    char path[512];
    snprintf(path, sizeof path, "%s/%s/expected.json", name[0] == '/' ? "" : TOK_DIR, name);
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
        /* the reference text is stored only where it differs from the input */
        json_t *wt = json_object_get(e, "text"), *wp = json_object_get(e, "text_prefix");
        const char *want_text = json_is_string(wt) ? json_string_value(wt) : json_string_value(s);
        size_t pl = json_is_string(wp) ? json_string_length(wp) : 0;
        bool text_ok = strncmp(text, pl ? json_string_value(wp) : "", pl) == 0 &&
                       strcmp(text + pl, want_text) == 0;
        if (text_ok) ok_text++;
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
Test(tokenizer, misc_a_matches_reference) { check_conformance("misc_a"); }
Test(tokenizer, misc_b_matches_reference) { check_conformance("misc_b"); }
Test(tokenizer, gptoss_matches_reference) { check_conformance("gptoss"); }
Test(tokenizer, deepseek3_matches_reference) { check_conformance("deepseek3"); }

/* A real model's tokenizer, too large to commit: set MOERUN_TOKENIZER_CHECK_DIR
 * to an absolute directory holding tokenizer.json and the expected.json that
 * `make_tokenizer_fixtures.py --check-dir DIR` writes. */
Test(tokenizer, real_model_dir_matches_reference)
{
    const char *dir = getenv("MOERUN_TOKENIZER_CHECK_DIR");
    if (!dir || dir[0] != '/') cr_skip_test("MOERUN_TOKENIZER_CHECK_DIR not set");
    check_conformance(dir);
}

/* ------------------------------------------------------------ streaming */

/* Pushing ids one at a time (then flushing) yields exactly the full decode. */
static void check_streaming(const char *name, bool skip_special)
{
    struct moe_tokenizer tok;
    load_fixture(&tok, name);
    char path[512];
    snprintf(path, sizeof path, "%s/%s/expected.json", TOK_DIR, name);
    json_t *exp = load_json(path);
    for (size_t i = 0; i < json_array_size(exp); i++) {
        json_t *want = json_object_get(json_array_get(exp, i), "ids");
        size_t n = json_array_size(want);
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        for (size_t j = 0; j < n; j++) ids[j] = (int32_t)json_integer_value(json_array_get(want, j));
        char *full;
        cr_assert_eq(moe_tokenizer_decode(&tok, ids, n, skip_special, &full), MOE_OK);
        struct moe_detok d;
        moe_detok_init(&d, &tok, skip_special);
        size_t cap = strlen(full) + 64, len = 0;
        char *cat = calloc(1, cap);
        for (size_t j = 0; j <= n; j++) {
            const char *piece;
            if (j < n) cr_assert_eq(moe_detok_push(&d, ids[j], &piece), MOE_OK, "%s", moe_last_error());
            else cr_assert_eq(moe_detok_flush(&d, &piece), MOE_OK);
            size_t k = strlen(piece);
            cr_assert(len + k < cap, "%s: string %zu: streaming produced too much text", name, i);
            memcpy(cat + len, piece, k + 1);
            len += k;
        }
        cr_assert_str_eq(cat, full, "%s: string %zu: streamed '%.60s' != decoded '%.60s'", name, i,
                         cat, full);
        moe_detok_free(&d);
        free(cat);
        free(full);
        free(ids);
    }
    json_decref(exp);
    moe_tokenizer_free(&tok);
}

Test(tokenizer, streaming_equals_full_decode)
{
    static const char *const names[] = {"qwen2", "llama3", "neox",   "llama2",   "mixtral",
                                        "misc_a", "misc_b", "gptoss", "deepseek3"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        check_streaming(names[i], false);
        check_streaming(names[i], true);
    }
}

/* ------------------------------------------------------- small fixtures */

/* A tiny byte-fallback BPE: a, b, ab, byte tokens for the bytes of 中 and
 * A, and lookalikes that must not parse as bytes. */
static const char TINY[] =
    "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true,"
    " \"fuse_unk\": true, \"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3,"
    " \"<0xE4>\": 4, \"<0xB8>\": 5, \"<0xAD>\": 6, \"<0x41>\": 7, \"<0x+4>\": 8, \"<0x4G>\": 9,"
    " \"<0x041>\": 10, \"<0x4>\": 11, \"<0xe4>\": 12, \"<0x\\u00e9>\": 13, \"<0X41>\": 14},"
    " \"merges\": [\"a b\"]},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"},"
    " {\"type\": \"Fuse\"}]}}";

static void load_tiny(struct moe_tokenizer *tok)
{
    cr_assert_eq(moe_tokenizer_load_json(tok, TINY, sizeof TINY - 1), MOE_OK, "%s", moe_last_error());
}

static void expect_decode(struct moe_tokenizer *tok, const int32_t *ids, size_t n, const char *want)
{
    char *s;
    cr_assert_eq(moe_tokenizer_decode(tok, ids, n, false, &s), MOE_OK, "%s", moe_last_error());
    cr_expect_str_eq(s, want);
    free(s);
}

Test(tokenizer, byte_fallback_tokens_parse_strictly)
{
    struct moe_tokenizer tok;
    load_tiny(&tok);
    expect_decode(&tok, (int32_t[]){7}, 1, "A");
    expect_decode(&tok, (int32_t[]){12, 5, 6}, 3, "\xe4\xb8\xad"); /* lower-case hex is a byte */
    expect_decode(&tok, (int32_t[]){8}, 1, "<0x+4>");   /* Rust's from_str_radix would take '+' */
    expect_decode(&tok, (int32_t[]){9}, 1, "<0x4G>");
    expect_decode(&tok, (int32_t[]){10}, 1, "<0x041>");
    expect_decode(&tok, (int32_t[]){11}, 1, "<0x4>");
    expect_decode(&tok, (int32_t[]){13}, 1, "<0x\xc3\xa9>");
    expect_decode(&tok, (int32_t[]){14}, 1, "<0X41>");
    /* an incomplete sequence: one U+FFFD per byte, then the text goes on */
    expect_decode(&tok, (int32_t[]){4, 5, 1}, 3, "\xef\xbf\xbd\xef\xbf\xbd" "a");
    expect_decode(&tok, (int32_t[]){1, 4, 5, 6, 2}, 5, "a\xe4\xb8\xad" "b");
    /* encode: unknown characters fall back to their bytes, merges apply */
    int32_t *ids;
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, "ab\xe4\xb8\xad" "A", 6, false, &ids, &n, NULL), MOE_OK);
    cr_assert_eq(n, 5);
    cr_expect(ids[0] == 3 && ids[1] == 4 && ids[2] == 5 && ids[3] == 6 && ids[4] == 7);
    free(ids);
    /* no byte token for 'z' (0x7A): unknown characters fuse into one <unk> */
    cr_assert_eq(moe_tokenizer_encode(&tok, "azzb", 4, false, &ids, &n, NULL), MOE_OK);
    cr_assert_eq(n, 3);
    cr_expect(ids[0] == 1 && ids[1] == 0 && ids[2] == 2);
    free(ids);
    /* out-of-range ids are an error, not a crash */
    char *s = NULL;
    cr_expect_eq(moe_tokenizer_decode(&tok, (int32_t[]){99}, 1, false, &s), MOE_ERR_INVALID_ARG);
    cr_expect_eq(moe_tokenizer_decode(&tok, (int32_t[]){-1}, 1, false, &s), MOE_ERR_INVALID_ARG);
    cr_expect_null(s);
    moe_tokenizer_free(&tok);
    moe_tokenizer_free(&tok); /* twice is safe */
}

Test(tokenizer, streaming_holds_back_incomplete_bytes)
{
    struct moe_tokenizer tok;
    load_tiny(&tok);
    struct moe_detok d;
    moe_detok_init(&d, &tok, false);
    const char *t;
    cr_assert_eq(moe_detok_push(&d, 1, &t), MOE_OK);
    cr_expect_str_eq(t, "a");
    cr_assert_eq(moe_detok_push(&d, 4, &t), MOE_OK);
    cr_expect_str_eq(t, "");
    cr_assert_eq(moe_detok_push(&d, 5, &t), MOE_OK);
    cr_expect_str_eq(t, "");
    cr_assert_eq(moe_detok_push(&d, 6, &t), MOE_OK);
    cr_expect_str_eq(t, "\xe4\xb8\xad");
    cr_assert_eq(moe_detok_push(&d, 4, &t), MOE_OK);
    cr_expect_str_eq(t, "");
    /* The dangling byte comes out on flush.  (A full decode of these ids
     * gives "a" + four U+FFFD: ByteFallback judges the whole run of byte
     * tokens at once; streaming has already emitted the complete character.) */
    cr_assert_eq(moe_detok_flush(&d, &t), MOE_OK);
    cr_expect_str_eq(t, "\xef\xbf\xbd");
    moe_detok_free(&d);
    moe_tokenizer_free(&tok);
}

/* ---------------------------------------------------------- invalid UTF-8 */

Test(tokenizer, invalid_utf8_is_replaced_and_flagged)
{
    struct moe_tokenizer tok;
    load_fixture(&tok, "qwen2");
    static const struct {
        const char *in;
        size_t len;
        const char *want; /* String::from_utf8_lossy */
    } cases[] = {
        {"a\xff" "b", 3, "a\xef\xbf\xbd" "b"},
        {"\xe4\xb8", 2, "\xef\xbf\xbd"},                       /* truncated: one U+FFFD */
        {"\xe4\xb8z", 3, "\xef\xbf\xbdz"},
        {"\xf0\x80\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* bad 2nd byte */
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate */
        {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd"},           /* overlong */
        {"x\xf4\x90\x80\x80", 5, "x\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"<|im_start|>\x80", 13, "<|im_start|>\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int32_t *ids, *ref;
        size_t n, nref;
        bool bad = false, bad_ref = true;
        cr_assert_eq(moe_tokenizer_encode(&tok, cases[i].in, cases[i].len, true, &ids, &n, &bad), MOE_OK);
        cr_expect(bad, "case %zu not flagged", i);
        cr_assert_eq(moe_tokenizer_encode(&tok, cases[i].want, strlen(cases[i].want), true, &ref, &nref,
                                          &bad_ref), MOE_OK);
        cr_expect_not(bad_ref);
        cr_expect(n == nref && memcmp(ids, ref, n * sizeof *ids) == 0, "case %zu: ids differ", i);
        char *s;
        cr_assert_eq(moe_tokenizer_decode(&tok, ids, n, false, &s), MOE_OK);
        cr_expect_str_eq(s, cases[i].want, "case %zu", i);
        free(s);
        free(ids);
        free(ref);
    }
    moe_tokenizer_free(&tok);
}

/* ------------------------------------------------------- malformed files */

static enum moe_status load_text(const char *json, char *msg, size_t cap)
{
    char dir[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/moetokXXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fputs(json, f);
    fclose(f);
    struct moe_tokenizer tok;
    enum moe_status st = moe_tokenizer_load(&tok, dir);
    snprintf(msg, cap, "%s", moe_last_error());
    moe_tokenizer_free(&tok);
    unlink(path);
    rmdir(dir);
    return st;
}

#define MODEL_OK "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void expect_error(const char *json, enum moe_status want, const char *needle)
{
    char msg[1024];
    enum moe_status st = load_text(json, msg, sizeof msg);
    cr_expect_eq(st, want, "status %d (want %d) for %.80s: %s", st, want, json, msg);
    cr_expect(strstr(msg, needle), "message '%s' lacks '%s'", msg, needle);
}

Test(tokenizer, malformed_files_give_clear_errors)
{
    char msg[1024];
    cr_assert_eq(load_text("{" MODEL_OK "}", msg, sizeof msg), MOE_OK, "%s", msg);
    expect_error("not json at all", MOE_ERR_FORMAT, "not valid JSON");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {}", MOE_ERR_FORMAT, "not valid JSON");
    expect_error("[1, 2]", MOE_ERR_FORMAT, "not an object");
    expect_error("{\"normalizer\": null}", MOE_ERR_FORMAT, "no model");
    expect_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", MOE_ERR_UNSUPPORTED,
                 "model type 'WordPiece' is not supported");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}}",
                 MOE_ERR_FORMAT, "not in the vocab");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}",
                 MOE_ERR_FORMAT, "makes a token that is not in the vocab");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}",
                 MOE_ERR_FORMAT, "merge 0");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}",
                 MOE_ERR_FORMAT, "vocab entry 'a'");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", MOE_ERR_FORMAT, "merges");
    expect_error("{" MODEL_OK ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
                 "\"(\\\\p{L\"}, \"behavior\": \"Isolated\", \"invert\": false}}",
                 MOE_ERR_FORMAT, "does not compile");
    expect_error("{" MODEL_OK ", \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}",
                 MOE_ERR_UNSUPPORTED, "pre_tokenizer type 'BertPreTokenizer' is not supported");
    expect_error("{" MODEL_OK ", \"normalizer\": {\"type\": \"Precompiled\"}}", MOE_ERR_UNSUPPORTED,
                 "normalizer type 'Precompiled' is not supported");
    expect_error("{" MODEL_OK ", \"decoder\": {\"type\": \"WordPiece\"}}", MOE_ERR_UNSUPPORTED,
                 "decoder type 'WordPiece' is not supported");
    expect_error("{" MODEL_OK ", \"post_processor\": {\"type\": \"BertLike\"}}", MOE_ERR_UNSUPPORTED,
                 "post_processor type 'BertLike' is not supported");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
                 "\"dropout\": 0.1}}", MOE_ERR_UNSUPPORTED, "dropout");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
                 "\"unk_token\": \"<unk>\"}}", MOE_ERR_FORMAT, "unk_token '<unk>'");
    expect_error("{" MODEL_OK ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
                 "\"a\"}, \"behavior\": \"Sideways\"}}", MOE_ERR_UNSUPPORTED, "behavior 'Sideways'");
    expect_error("{" MODEL_OK ", \"added_tokens\": [{\"id\": 5}]}", MOE_ERR_FORMAT, "added_tokens[0]");
    expect_error("{" MODEL_OK ", \"truncation\": {\"max_length\": 5}}", MOE_ERR_UNSUPPORTED,
                 "truncation");

    struct moe_tokenizer tok;
    cr_expect_eq(moe_tokenizer_load(&tok, TOK_DIR "/no-such-model"), MOE_ERR_IO);
    cr_expect(strstr(moe_last_error(), "tokenizer.json: cannot open"), "%s", moe_last_error());
    moe_tokenizer_free(&tok);
}

/* ----------------------------------------------------------- long inputs */

/* 100,000 identical letters: the merge queue keeps this near-linear (an
 * O(n^2) rescan would take minutes); assert it completes and round-trips. */
Test(tokenizer, hundred_thousand_letters_round_trip, .timeout = 120)
{
    static const char *const names[] = {"qwen2",   "llama3", "neox",     "llama2",
                                        "mixtral", "gptoss", "deepseek3"};
    size_t n = 100000;
    char *text = malloc(n + 1);
    memset(text, 'l', n); /* "l l" -> "ll" is a merge in every fixture */
    text[n] = '\0';
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        struct moe_tokenizer tok;
        load_fixture(&tok, names[k]);
        int32_t *ids;
        size_t m;
        cr_assert_eq(moe_tokenizer_encode(&tok, text, n, false, &ids, &m, NULL), MOE_OK);
        cr_expect(m > 0 && m <= n / 2 + 1, "%s: %zu ids: merges were not applied", names[k], m);
        char *back;
        cr_assert_eq(moe_tokenizer_decode(&tok, ids, m, false, &back), MOE_OK);
        cr_expect(strcmp(back, text) == 0, "%s: round trip differs", names[k]);
        free(back);
        free(ids);
        moe_tokenizer_free(&tok);
    }
    free(text);
}

/* ----------------------------------------------------------- config files */

Test(tokenizer, config_files_give_bos_eos_and_template)
{
    struct moe_tokenizer tok;
    load_fixture(&tok, "llama2");
    cr_expect_eq(tok.bos_id, 1);
    cr_expect(tok.add_bos);
    cr_expect_eq(tok.n_eos, 1);
    cr_expect_eq(tok.eos_ids[0], 2);
    cr_expect_str_eq(tok.bos_token, "<s>");
    cr_expect_str_eq(moe_tokenizer_id_to_token(&tok, 1), "<s>");
    cr_expect_eq(moe_tokenizer_token_to_id(&tok, "</s>"), 2);
    int32_t *ids;
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, "hi", 2, true, &ids, &n, NULL), MOE_OK);
    cr_expect(n >= 2 && ids[0] == 1);
    free(ids);
    cr_assert_eq(moe_tokenizer_encode(&tok, "hi", 2, false, &ids, &n, NULL), MOE_OK);
    cr_expect(n >= 1 && ids[0] != 1);
    free(ids);
    moe_tokenizer_free(&tok);

    load_fixture(&tok, "qwen2");
    cr_expect_eq(tok.bos_id, -1);
    cr_expect_not(tok.add_bos);
    cr_expect_eq(tok.n_eos, 2); /* generation_config lists two */
    cr_expect_eq(tok.eos_ids[0], moe_tokenizer_token_to_id(&tok, "<|im_end|>"));
    cr_expect_eq(tok.eos_ids[1], moe_tokenizer_token_to_id(&tok, "<|endoftext|>"));
    cr_expect(tok.chat_template && strstr(tok.chat_template, "<|im_start|>"));
    /* skip_special drops <|im_start|> but keeps the non-special <think> */
    cr_assert_eq(moe_tokenizer_encode(&tok, "<|im_start|><think>x", 20, true, &ids, &n, NULL), MOE_OK);
    char *s;
    cr_assert_eq(moe_tokenizer_decode(&tok, ids, n, true, &s), MOE_OK);
    cr_expect_str_eq(s, "<think>x");
    free(s);
    free(ids);
    moe_tokenizer_free(&tok);
}

/* A streaming decoder that skips special tokens keeps the ones it is told
 * to (a tool-call format's markers), and only those: qwen2's <|im_start|>
 * comes through, <|im_end|> and <|endoftext|> do not; texts that are no
 * token are ignored. */
Test(tokenizer, detok_keeps_the_named_special_tokens)
{
    struct moe_tokenizer tok;
    load_fixture(&tok, "qwen2");
    const char *text = "<|im_start|>a<|im_end|>b<|endoftext|>";
    int32_t *ids;
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, text, strlen(text), false, &ids, &n, NULL), MOE_OK);
    for (int pass = 0; pass < 2; pass++) {
        struct moe_detok d;
        moe_detok_init(&d, &tok, true);
        if (pass) moe_detok_keep(&d, (const char *const[]){"<|im_start|>", "not a token", NULL});
        char out[128] = "";
        const char *t;
        for (size_t i = 0; i < n; i++) {
            cr_assert_eq(moe_detok_push(&d, ids[i], &t), MOE_OK);
            strcat(out, t);
        }
        cr_assert_eq(moe_detok_flush(&d, &t), MOE_OK);
        strcat(out, t);
        cr_expect_eq(d.n_keep, pass);
        cr_expect_str_eq(out, pass ? "<|im_start|>ab" : "ab");
        moe_detok_free(&d);
        cr_expect_eq(d.n_keep, pass, "free keeps the kept tokens, as it keeps skip_special");
    }
    free(ids);
    moe_tokenizer_free(&tok);
}

/* gpt-oss: bos/eos/pad as plain strings, three eos ids in generation_config,
 * no add_bos_token; DeepSeek-V3: tokens as {"__type": "AddedToken", ...}
 * objects, add_bos_token with a TemplateProcessing that prepends the BOS. */
Test(tokenizer, config_files_of_gptoss_and_deepseek3)
{
    struct moe_tokenizer tok;
    load_fixture(&tok, "gptoss");
    cr_expect_str_eq(tok.bos_token, "<|startoftext|>");
    cr_expect_eq(tok.bos_id, moe_tokenizer_token_to_id(&tok, "<|startoftext|>"));
    cr_expect_not(tok.add_bos);
    cr_assert_eq(tok.n_eos, 3);
    cr_expect_eq(tok.eos_ids[0], moe_tokenizer_token_to_id(&tok, "<|return|>"));
    cr_expect_eq(tok.eos_ids[1], moe_tokenizer_token_to_id(&tok, "<|endoftext|>"));
    cr_expect_eq(tok.eos_ids[2], moe_tokenizer_token_to_id(&tok, "<|call|>"));
    moe_tokenizer_free(&tok);

    load_fixture(&tok, "deepseek3");
    cr_expect_str_eq(tok.bos_token, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    cr_expect_str_eq(tok.eos_token, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    cr_expect_eq(tok.bos_id, 0);
    cr_expect(tok.add_bos);
    cr_assert_eq(tok.n_eos, 1);
    cr_expect_eq(tok.eos_ids[0], 1);
    int32_t *ids;
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, "hi", 2, true, &ids, &n, NULL), MOE_OK);
    cr_expect(n >= 2 && ids[0] == 0);
    free(ids);
    moe_tokenizer_free(&tok);
}

/* Chat markers come out as single ids; skip_special drops the harmony
 * markers (all special) but keeps DeepSeek's <｜User｜>, <｜Assistant｜> and
 * <think>, which are added tokens without the special flag.  Expected text
 * from the Python tokenizers package. */
static void expect_markers(const char *name, const char *text, const char *const *markers,
                           size_t n_markers, const char *want_skipped)
{
    struct moe_tokenizer tok;
    load_fixture(&tok, name);
    int32_t *ids;
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, text, strlen(text), false, &ids, &n, NULL), MOE_OK);
    size_t seen = 0;
    for (size_t i = 0; i < n && seen < n_markers; i++)
        if (ids[i] == moe_tokenizer_token_to_id(&tok, markers[seen])) seen++;
    cr_expect_eq(seen, n_markers, "%s: marker '%s' is not one id, in order", name,
                 seen < n_markers ? markers[seen] : "");
    char *s;
    cr_assert_eq(moe_tokenizer_decode(&tok, ids, n, false, &s), MOE_OK);
    cr_expect_str_eq(s, text);
    free(s);
    cr_assert_eq(moe_tokenizer_decode(&tok, ids, n, true, &s), MOE_OK);
    cr_expect_str_eq(s, want_skipped);
    free(s);
    free(ids);
    moe_tokenizer_free(&tok);
}

Test(tokenizer, chat_markers_are_single_ids)
{
    static const char *const harmony[] = {"<|start|>", "<|message|>", "<|end|>", "<|start|>",
                                          "<|channel|>", "<|message|>"};
    expect_markers("gptoss",
                   "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>",
                   harmony, 6, "userHiassistantfinal");
#define FW "\xef\xbd\x9c" /* U+FF5C FULLWIDTH VERTICAL LINE */
#define LB "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */
    static const char *const deepseek[] = {"<" FW "User" FW ">", "<" FW "Assistant" FW ">", "<think>",
                                           "</think>", "<" FW "end" LB "of" LB "sentence" FW ">"};
    expect_markers("deepseek3",
                   "<" FW "User" FW ">Hi<" FW "Assistant" FW "><think>\nhm\n</think>\n\nHello!<" FW
                   "end" LB "of" LB "sentence" FW ">",
                   deepseek, 5,
                   "<" FW "User" FW ">Hi<" FW "Assistant" FW "><think>\nhm\n</think>\n\nHello!");
#undef FW
#undef LB
}

/* ------------------------------------------------------------------ CLI */

static int cli(const char *a1, const char *a2, const char *a3)
{
    char *argv[] = {"tokenize", (char *)a1, (char *)a2, (char *)a3, NULL};
    int argc = 1 + (a1 != NULL) + (a2 != NULL) + (a3 != NULL);
    return moe_cli_tokenize(argc, argv);
}

Test(tokenizer_cli, encodes_to_comma_separated_ids, .init = cr_redirect_stdout)
{
    cr_assert_eq(cli(TOK_DIR "/llama2", "Hello world", NULL), 0);
    fflush(stdout);
    cr_assert_stdout_eq_str("1,1785,1286\n");
}

Test(tokenizer_cli, decodes_ids, .init = cr_redirect_stdout)
{
    cr_assert_eq(cli(TOK_DIR "/llama2", "--decode", "1,1785, 1286"), 0);
    fflush(stdout);
    cr_assert_stdout_eq_str("<s> Hello world\n");
}

Test(tokenizer_cli, errors_are_one_line, .init = cr_redirect_stderr)
{
    cr_assert_eq(cli(TOK_DIR "/llama2", "--decode", "1,x"), 1);
    cr_assert_eq(cli(NULL, NULL, NULL), 1);
    fflush(stderr);
    cr_assert_stderr_eq_str("moerun tokenize: 'x' is not a token id\n"
                            "moerun tokenize: missing MODEL_DIR (try --help)\n");
}

/* A regex that blows PCRE2's match limit is an encode error, not a silent
 * "no match" that would change the splits. */
Test(tokenizer, regex_resource_limit_is_an_error)
{
    static const char json[] =
        "{" MODEL_OK ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
        "\"(a|aa)+$\"}, \"behavior\": \"Isolated\", \"invert\": false}}";
    struct moe_tokenizer tok;
    cr_assert_eq(moe_tokenizer_load_json(&tok, json, sizeof json - 1), MOE_OK, "%s", moe_last_error());
    char text[64];
    memset(text, 'a', 60);
    text[60] = 'b';
    int32_t *ids = NULL;
    size_t n;
    enum moe_status st = moe_tokenizer_encode(&tok, text, 61, false, &ids, &n, NULL);
    cr_expect_eq(st, MOE_ERR_INVALID_ARG, "status %d", st);
    cr_expect(strstr(moe_last_error(), "regex matching failed"), "%s", moe_last_error());
    cr_expect_null(ids);
    moe_tokenizer_free(&tok);
}

/* Split regexes are Oniguruma's (Ruby syntax): '$' is a line anchor, so in
 * "a \nb" the pattern \s+$ takes the space alone and " \n" is not merged. */
Test(tokenizer, regex_dollar_is_a_line_anchor)
{
    static const char json[] =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \" \": 2, \"\\n\": 3, \" \\n\": 4},"
        " \"merges\": [[\" \", \"\\n\"]]}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\":"
        " \"\\\\s+$|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}}";
    struct moe_tokenizer tok;
    cr_assert_eq(moe_tokenizer_load_json(&tok, json, sizeof json - 1), MOE_OK, "%s", moe_last_error());
    int32_t *ids;
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, "a \nb", 4, false, &ids, &n, NULL), MOE_OK);
    cr_expect(n == 4 && ids[0] == 0 && ids[1] == 2 && ids[2] == 3 && ids[3] == 1, "n=%zu", n);
    free(ids);
    cr_assert_eq(moe_tokenizer_encode(&tok, "a \t", 3, false, &ids, &n, NULL), MOE_OK);
    cr_expect(n == 2, "n=%zu", n); /* no unk token: the tab is dropped */
    free(ids);
    moe_tokenizer_free(&tok);
}
