/* Grammar room: parser errors, the recognizer on positive and negative
 * strings, bounded memory, and the masks (per-position sets, and the trie
 * walk from the whole state) against a per-token check. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/grammar.h"
#include "runtime/text/tokenizer.h"

static struct moe_grammar *compile(const char *src)
{
    struct moe_grammar *g = NULL;
    enum moe_status s = moe_grammar_parse(src, strlen(src), &g);
    cr_assert_eq(s, MOE_OK, "%s: %s", src, moe_last_error());
    return g;
}

static void refused(const char *src, const char *msg)
{
    struct moe_grammar *g = (struct moe_grammar *)1;
    enum moe_status s = moe_grammar_parse(src, strlen(src), &g);
    cr_assert_eq(s, MOE_ERR_FORMAT, "accepted: %s", src);
    cr_assert_null(g);
    cr_assert_str_eq(moe_last_error(), msg);
}

Test(grammar, parse_errors_name_line_and_column)
{
    refused("root ::= \"a", "grammar: line 1, column 10: string literal is not closed with '\"'");
    refused("root ::= foo", "grammar: line 1, column 10: rule 'foo' is used but not defined");
    refused("root ::= \"a\"\n  x ::= [a-", "grammar: line 2, column 9: character class is not closed with ']'");
    refused("root ::= \"a\"\nroot ::= \"b\"",
            "grammar: line 2, column 1: rule 'root' is defined twice (first at line 1)");
    refused("x ::= \"a\"", "grammar: no 'root' rule");
    refused("root ::= \"a\" )", "grammar: line 1, column 14: unexpected ')'");
    refused("root ::= \"\\q\"", "grammar: line 1, column 11: unknown escape '\\q'");
    refused("root ::= \"a\"{1001}", "grammar: line 1, column 13: '{' needs a count from 0 to 1000");
    refused("root ::= \"a\"{3,2}", "grammar: line 1, column 13: '{3,n}' needs n from 3 to 1000");
    refused("root ::= [z-a]", "grammar: line 1, column 11: range U+7A-U+61 is empty (its end is below its start)");
    refused("root ::= []", "grammar: line 1, column 10: empty character class '[]'");
    refused("root ::= \"\"*", "grammar: line 1, column 12: '*' repeats an empty item");
    refused("root := \"a\"", "grammar: line 1, column 6: expected '::=' after rule name 'root'");
    refused("root ::= \"a\" ; \"b\"", "grammar: line 1, column 14: unexpected ';'");
    refused("root ::= \"\\uD800\"", "grammar: line 1, column 11: '\\u' escape U+D800 is not a Unicode scalar value");
}

Test(grammar, left_recursion_is_refused)
{
    refused("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]",
            "grammar: rule 'expr' is left-recursive (expr -> expr): it can reach itself without consuming "
            "input; rewrite it with repetition");
    refused("root ::= a\na ::= b? \"x\" | \"y\"\nb ::= \"z\" | a",
            "grammar: rule 'a' is left-recursive (a -> a_3 -> b -> a): it can reach itself without consuming "
            "input; rewrite it with repetition");
    /* a repetition of something that may be empty loops the same way */
    refused("root ::= (\"a\"?)*",
            "grammar: rule 'root_3' is left-recursive (root_3 -> root_3): it can reach itself without "
            "consuming input; rewrite it with repetition");
    /* right recursion is fine */
    moe_grammar_free(compile("root ::= \"a\" root | \"b\""));
}

/* Whether the whole of s is a sentence of g, fed in pieces of `step` bytes. */
static bool matches_step(const struct moe_grammar *g, const char *s, size_t step)
{
    struct moe_grammar_state st;
    cr_assert_eq(moe_grammar_state_init(&st, g), MOE_OK);
    size_t n = strlen(s);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i += step) {
        size_t k = n - i < step ? n - i : step;
        cr_assert_eq(moe_grammar_state_advance(&st, (const uint8_t *)s + i, k, &ok), MOE_OK, "%s", moe_last_error());
    }
    ok = ok && moe_grammar_state_accepting(&st);
    moe_grammar_state_free(&st);
    return ok;
}

static bool matches(const struct moe_grammar *g, const char *s)
{
    bool a = matches_step(g, s, 1 << 20), b = matches_step(g, s, 1);
    cr_assert_eq(a, b, "'%s': whole %d, byte by byte %d", s, a, b);
    return a;
}

static void check(const struct moe_grammar *g, const char *const *yes, const char *const *no)
{
    for (int i = 0; yes[i]; i++) cr_expect(matches(g, yes[i]), "should match: %s", yes[i]);
    for (int i = 0; no[i]; i++) cr_expect(!matches(g, no[i]), "should not match: %s", no[i]);
}

Test(grammar, json_object)
{
    struct moe_grammar *g;
    cr_assert_eq(moe_grammar_json_object(&g), MOE_OK, "%s", moe_last_error());
    const char *yes[] = {"{}", "{ }", "{\"a\": 1}", "{\"a\":1,\"b\":[]}",
                         "{\"a\": [1, 2.5, -3e10, 0.25E-3, true, false, null, {\"b\": \"x\\n\\u00e9\\\"\"}]}",
                         "{\"\xc3\xa9\": \"\xe6\x97\xa5\xe6\x9c\xac\"}",
                         "{\n  \"a\": {\n    \"b\": [\n      1\n    ]\n  }\n}", NULL};
    const char *no[] = {"[]", "1", "\"a\"", "{\"a\": 01}", "{\"a\" 1}", "{\"a\": 1,}", "{'a': 1}",
                        "{\"a\":1} ", " {}", "{\"a\":   1}", "{\"a\": tru}", "{\"a\": \"\x01\"}",
                        "{\"a\": \"\\x\"}", "{\"a\": 1", "{\"a\": [1 2]}", "{\"a\": .5}", NULL};
    check(g, yes, no);
    moe_grammar_free(g);
}

Test(grammar, arithmetic)
{
    struct moe_grammar *g = compile("root   ::= expr\n"
                                    "expr   ::= term ((\"+\" | \"-\") term)*\n"
                                    "term   ::= factor ((\"*\" | \"/\") factor)*\n"
                                    "factor ::= [0-9]+ | \"(\" expr \")\"  # a comment\n");
    const char *yes[] = {"1", "1+2*3", "(1+2)*3", "((42))", "10/5-3*(2+1)", NULL};
    const char *no[] = {"", "1+", "(1", "1++2", "()", "1)", "a", NULL};
    check(g, yes, no);
    moe_grammar_free(g);
}

Test(grammar, csv)
{
    struct moe_grammar *g = compile("root  ::= row (\"\\n\" row)* \"\\n\"?\n"
                                    "row   ::= field (\",\" field)*\n"
                                    "field ::= [^,\\n\"]* | \"\\\"\" ([^\"] | \"\\\"\\\"\")* \"\\\"\"\n");
    const char *yes[] = {"a,b,c\n1,2,3", "\"x,y\",z\n", "a,,b", "\"say \"\"hi\"\"\",2", "", NULL};
    const char *no[] = {"\"abc", "a\"b", "\"a\"b", NULL};
    check(g, yes, no);
    moe_grammar_free(g);
}

Test(grammar, unicode_classes_and_counts)
{
    struct moe_grammar *g = compile("root ::= [\xce\xb1-\xcf\x89]+ \" \" [\\u4e00-\\u9fff]{2} [^a-z] .{1,2}");
    const char *yes[] = {"\xce\xb1\xce\xb2\xce\xb3 \xe6\x97\xa5\xe6\x9c\xacX!", "\xcf\x89 \xe6\x97\xa5\xe6\x9c\xac\xc3\xa9\xf0\x9f\x98\x80x", NULL};
    const char *no[] = {"abc \xe6\x97\xa5\xe6\x9c\xacX!", "\xce\xb1 \xe6\x97\xa5X!", "\xce\xb1 \xe6\x97\xa5\xe6\x9c\xac" "a!",
                        "\xce\xb1 \xe6\x97\xa5\xe6\x9c\xacX", "\xce\xb1 \xe6\x97\xa5\xe6\x9c\xacX!!!",
                        "\xce\xb1 \xe6\x97\xa5\xe6\x9c\xacX\xff", "\xce\xb1 \xe6\x97\xa5\xe6\x9c\xacX\xc0\x80", NULL};
    check(g, yes, no);
    moe_grammar_free(g);
    g = compile("root ::= \"a\"{2,3} \"b\"{2} \"c\"{1,}");
    const char *yes2[] = {"aabbc", "aaabbccc", NULL}, *no2[] = {"abbc", "aaaabbc", "aabc", "aabb", NULL};
    check(g, yes2, no2);
    moe_grammar_free(g);
}

Test(grammar, refused_bytes_leave_the_state_unchanged)
{
    struct moe_grammar *g = compile("root ::= \"ab\" | \"\xe6\x97\xa5\"");
    struct moe_grammar_state st;
    bool ok;
    cr_assert_eq(moe_grammar_state_init(&st, g), MOE_OK);
    cr_assert_eq(moe_grammar_state_advance(&st, (const uint8_t *)"ax", 2, &ok), MOE_OK);
    cr_assert(!ok);
    cr_assert_eq(moe_grammar_state_advance(&st, (const uint8_t *)"\xe6", 1, &ok), MOE_OK);
    cr_assert(ok);
    cr_assert(!moe_grammar_state_accepting(&st)); /* half a character */
    cr_assert_eq(moe_grammar_state_advance(&st, (const uint8_t *)"\x98", 1, &ok), MOE_OK);
    cr_assert(!ok, "U+65E5's second byte is 0x97, and no other character of the class starts so");
    cr_assert_eq(moe_grammar_state_advance(&st, (const uint8_t *)"\x97\xa5", 2, &ok), MOE_OK);
    cr_assert(ok);
    cr_assert(moe_grammar_state_accepting(&st));
    cr_assert(!moe_grammar_state_can_continue(&st));
    moe_grammar_state_free(&st);
    moe_grammar_free(g);
}

Test(grammar, ambiguity_is_bounded)
{
    /* after n x's every sequence of n pending y/z is live, under an x of
     * either alternative or at its innermost y/z: 3 * 2^n stacks */
    struct moe_grammar *g = compile("root ::= a\na ::= \"x\" a \"y\" | \"x\" a \"z\" | \"\"");
    struct moe_grammar_state st;
    cr_assert_eq(moe_grammar_state_init(&st, g), MOE_OK);
    bool ok = true;
    enum moe_status s = MOE_OK;
    int n = 0;
    while (n < 20 && (s = moe_grammar_state_advance(&st, (const uint8_t *)"x", 1, &ok)) == MOE_OK) n++;
    cr_assert_eq(s, MOE_ERR_UNSUPPORTED);
    cr_assert_eq(n, 10, "refused at x number %d", n + 1); /* 3 * 2^11 > 4096 */
    cr_assert_str_eq(moe_last_error(), "grammar: more than 4096 parse stacks at once; the grammar is too "
                                       "ambiguous to follow");
    moe_grammar_state_free(&st);
    moe_grammar_free(g);
}

/* A synthetic vocabulary: every single byte, then random strings over
 * JSON-ish characters and pieces of multi-byte characters, one special. */
static void synth_vocab(struct moe_grammar_vocab *gv, int V, unsigned seed)
{
    static const char *pieces[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "  ", "\\", "u", "n",
                                   "a", "b", "1", "0", "-", ".", "e", "true", "null", "fals", "e}",
                                   "\xc3", "\xa9", "\xe6\x97", "\xa5", "\xc3\xa9", "\xff", "\x01",
                                   "))", "x)", ")))", "((", "]]", "}}", "\"}", "1]"};
    const int n_pieces = (int)(sizeof pieces / sizeof *pieces);
    static const char *longs[] = {"))))))))))", "x))))))))))))", "]]]]]]", "]]]]]]]}}}", "2]]}]]]]]}}}", "}}}}}}"};
    const int n_long = (int)(sizeof longs / sizeof *longs);
    uint32_t *off = malloc(((size_t)V + 1) * sizeof *off);
    uint8_t *bytes = malloc((size_t)V * 32), *in = malloc((size_t)V);
    cr_assert(off && bytes && in);
    uint32_t at = 0;
    srand(seed);
    for (int i = 0; i < V; i++) {
        off[i] = at;
        in[i] = 1;
        if (i < 256) {
            bytes[at++] = (uint8_t)i;
            continue;
        }
        if (i < 256 + n_long) { /* long closers: they read past many stack nodes */
            memcpy(bytes + at, longs[i - 256], strlen(longs[i - 256]));
            at += (uint32_t)strlen(longs[i - 256]);
            continue;
        }
        int parts = 1 + rand() % 4;
        for (int k = 0; k < parts; k++) {
            const char *p = pieces[rand() % n_pieces];
            size_t l = strlen(p);
            memcpy(bytes + at, p, l);
            at += (uint32_t)l;
        }
    }
    off[V] = at;
    in[V - 1] = 0; /* a special token: never in a mask */
    cr_assert_eq(moe_grammar_vocab_init(gv, V, off, bytes, in), MOE_OK, "%s", moe_last_error());
    free(off);
    free(bytes);
    free(in);
}

static void compare_masks(const struct moe_grammar *g, const struct moe_grammar_vocab *gv, const char *path)
{
    const size_t words = ((size_t)gv->V + 31) / 32;
    uint32_t *a = calloc(words, sizeof *a), *b = calloc(words, sizeof *b), *c = calloc(words, sizeof *c);
    struct moe_grammar_state st;
    cr_assert_eq(moe_grammar_state_init(&st, g), MOE_OK);
    size_t n = strlen(path);
    for (size_t i = 0; i <= n; i++) {
        for (int pass = 0; pass < 2; pass++) { /* the second is the cached mask */
            cr_assert_eq(moe_grammar_mask(&st, gv, a), MOE_OK, "%s", moe_last_error());
            cr_assert_eq(moe_grammar_mask_brute(&st, gv, b), MOE_OK);
            cr_assert_eq(moe_grammar_mask_walk(&st, gv, c), MOE_OK);
            cr_assert(!memcmp(c, b, words * sizeof *c), "after %zu bytes: the whole-state walk differs", i);
            int n_on = 0;
            for (int t = 0; t < gv->V; t++) {
                bool x = a[t >> 5] >> (t & 31) & 1, y = b[t >> 5] >> (t & 31) & 1;
                cr_assert_eq(x, y, "after %zu bytes of '%s': token %d trie %d brute %d", i, path, t, x, y);
                n_on += x;
            }
            cr_assert(!(a[(gv->V - 1) >> 5] >> ((gv->V - 1) & 31) & 1), "the special token is masked");
            if (i < n) cr_assert_gt(n_on, 0, "after %zu bytes: the next byte's token is allowed", i);
        }
        if (i == n) break;
        bool ok;
        cr_assert_eq(moe_grammar_state_advance(&st, (const uint8_t *)path + i, 1, &ok), MOE_OK);
        cr_assert(ok, "'%s' byte %zu", path, i);
    }
    cr_assert_gt(st.n_mask_hits, 0);
    moe_grammar_state_free(&st);
    free(a);
    free(b);
    free(c);
}

Test(grammar, trie_mask_matches_per_token_check)
{
    struct moe_grammar_vocab gv;
    synth_vocab(&gv, 1500, 7);
    struct moe_grammar *g;
    cr_assert_eq(moe_grammar_json_object(&g), MOE_OK);
    compare_masks(g, &gv, "{\"a\xc3\xa9\": [1, -2.5e3, true, null], \"b\": {\"\xe6\x97\xa5\": \"\\u00e9\\n\"}}");
    /* stacks deeper than the nodes a per-position set is keyed by: tokens
     * that read past them are checked against the whole state */
    compare_masks(g, &gv, "{\"a\": {\"b\": {\"c\": [[[[[1, {\"d\": [[2]]}]]]]]}}}");
    moe_grammar_free(g);
    g = compile("root ::= \"(\" root \")\" | \"x\"");
    compare_masks(g, &gv, "((((((((((((x))))))))))))");
    moe_grammar_free(g);
    g = compile("root ::= (\"yes\" | \"no\") [\xc3\xa0-\xc3\xbf]* \"!\"?");
    compare_masks(g, &gv, "yes\xc3\xa9\xc3\xa9!");
    moe_grammar_free(g);
    moe_grammar_vocab_free(&gv);
}

/* Masks st once more (a cache hit: counted) and checks it against the
 * per-token reference. */
static void mask_from_cache(struct moe_grammar_state *st, const struct moe_grammar_vocab *gv, uint32_t *a,
                            uint32_t *b, const char *where)
{
    const uint64_t hits = st->n_mask_hits, misses = st->n_mask_misses;
    cr_assert_eq(moe_grammar_mask(st, gv, a), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(st->n_mask_hits, hits + 1, "%s: not from the cache", where);
    cr_assert_eq(st->n_mask_misses, misses, "%s", where);
    cr_assert_eq(moe_grammar_mask_brute(st, gv, b), MOE_OK);
    cr_assert(!memcmp(a, b, ((size_t)gv->V + 31) / 32 * sizeof *a), "%s: the mask differs", where);
}

/* A copy holds its source's cached masks, each its own: the state it was
 * copied at and one its source was in before, both from the cache, the
 * second after the source is freed; then freeing both (and again) is clean. */
Test(grammar, copy_keeps_the_cached_masks)
{
    struct moe_grammar_vocab gv;
    synth_vocab(&gv, 600, 5);
    const size_t words = ((size_t)gv.V + 31) / 32;
    uint32_t *a = calloc(words, sizeof *a), *b = calloc(words, sizeof *b);
    /* two states that recur: expecting "a" (or the end), expecting a digit */
    struct moe_grammar *g = compile("root ::= (\"a\" [0-9])*");
    struct moe_grammar_state st, cp = {0};
    cr_assert_eq(moe_grammar_state_init(&st, g), MOE_OK);
    bool ok;
    cr_assert_eq(moe_grammar_mask(&st, &gv, a), MOE_OK); /* expecting "a": a miss */
    cr_assert_eq(moe_grammar_state_advance(&st, (const uint8_t *)"a", 1, &ok), MOE_OK);
    cr_assert(ok);
    cr_assert_eq(moe_grammar_mask(&st, &gv, a), MOE_OK); /* expecting a digit: a miss */
    cr_assert_eq(st.n_mask_misses, 2);
    cr_assert_eq(st.n_mask_hits, 0);
    cr_assert_eq(moe_grammar_state_copy(&cp, &st), MOE_OK);
    cr_assert_eq(cp.n_mask_hits + cp.n_mask_misses, 0, "a copy's counters start at zero");
    mask_from_cache(&cp, &gv, a, b, "the copy, where it was copied");
    mask_from_cache(&st, &gv, a, b, "the source after the copy");
    moe_grammar_state_free(&st);
    cr_assert_eq(moe_grammar_state_advance(&cp, (const uint8_t *)"7", 1, &ok), MOE_OK);
    cr_assert(ok);
    mask_from_cache(&cp, &gv, a, b, "the copy, expecting \"a\" again, its source freed");
    moe_grammar_state_free(&cp);
    moe_grammar_state_free(&cp);
    moe_grammar_state_free(&st);
    moe_grammar_free(g);
    moe_grammar_vocab_free(&gv);
    free(a);
    free(b);
}

Test(grammar, vocab_trie_holds_every_token_once)
{
    struct moe_grammar_vocab gv;
    synth_vocab(&gv, 800, 3);
    int *seen = calloc(800, sizeof *seen);
    for (int n = 0; n < gv.n_nodes; n++)
        for (int k = gv.tok_first[n]; k < gv.tok_first[n + 1]; k++) seen[gv.ids[k]]++;
    for (int i = 0; i < 800; i++) cr_assert_eq(seen[i], i == 799 ? 0 : 1, "token %d", i);
    free(seen);
    moe_grammar_vocab_free(&gv);
}

/* moe_tokenizer_token_bytes against the decoder: after a plain token, a
 * token adds exactly its bytes to the decoded text (where they are whole
 * UTF-8 characters), for byte-level, Metaspace and byte-fallback vocabularies. */
static void token_bytes_match_decode(const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/tokenizers/%s", MOERUN_SOURCE_DIR, name);
    struct moe_tokenizer tok;
    cr_assert_eq(moe_tokenizer_load(&tok, dir), MOE_OK, "%s", moe_last_error());
    int32_t a = moe_tokenizer_token_to_id(&tok, "a");
    cr_assert_geq(a, 0, "%s has a token 'a'", name);
    char *pre;
    cr_assert_eq(moe_tokenizer_decode(&tok, &a, 1, false, &pre), MOE_OK);
    int checked = 0;
    for (int32_t id = 0; id < tok.n_vocab; id++) {
        char *b, *text;
        size_t len;
        bool special;
        if (!moe_tokenizer_id_to_token(&tok, id)) continue;
        cr_assert_eq(moe_tokenizer_token_bytes(&tok, id, &b, &len, &special), MOE_OK);
        int32_t two[2] = {a, id};
        cr_assert_eq(moe_tokenizer_decode(&tok, two, 2, false, &text), MOE_OK);
        bool whole = !special && !strstr(text, "\xef\xbf\xbd") && !memchr(b, 0, len);
        if (whole) {
            cr_assert_eq(strlen(text), strlen(pre) + len, "%s token %d '%s': decoded '%s', bytes '%.*s'",
                         name, id, moe_tokenizer_id_to_token(&tok, id), text, (int)len, b);
            cr_assert(!memcmp(text + strlen(pre), b, len), "%s token %d", name, id);
            checked++;
        }
        free(b);
        free(text);
    }
    cr_assert_gt(checked, tok.n_vocab / 2, "%s: %d tokens checked", name, checked);
    free(pre);
    moe_tokenizer_free(&tok);
}

Test(grammar, token_bytes_match_decode)
{
    token_bytes_match_decode("qwen2");
    token_bytes_match_decode("llama2");
    token_bytes_match_decode("mixtral");
    token_bytes_match_decode("misc_b");
}
