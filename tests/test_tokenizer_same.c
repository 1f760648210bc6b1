/* test_tokenizer_same.c - moe_tokenizer_same (tokenizer.h): two loads of
 * one tokenizer are the same; a tokenizer.json with two vocabulary entries
 * swapped, an added token's content changed, an added token made not
 * special, or another family's tokenizer each differ, with one line that
 * names the id and both tokens. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/text/tokenizer.h"
#include "tests/testutil.h"

#define TOK_DIR FIXTURE_DIR "/tokenizers"

static json_t *load_json(const char *family)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", TOK_DIR, family);
    json_t *j = json_load_file(path, 0, NULL);
    cr_assert(j, "%s", path);
    return j;
}

static void from_json(struct moe_tokenizer *t, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT);
    cr_assert(text);
    cr_assert_eq(moe_tokenizer_load_json(t, text, strlen(text)), MOE_OK, "%s", moe_last_error());
    free(text);
}

/* Compares family's tokenizer with the one edit() makes of it: expects
 * the difference named by every needle, in one line. */
static void expect_differs(const char *family, void (*edit)(json_t *), const char *const *needles)
{
    json_t *j = load_json(family);
    struct moe_tokenizer a, b;
    from_json(&a, j);
    edit(j);
    from_json(&b, j);
    json_decref(j);
    cr_assert_eq(moe_tokenizer_same(&a, &b, "target", "draft"), MOE_ERR_INVALID_ARG,
                 "%s: an edited tokenizer is the same", family);
    const char *msg = moe_last_error();
    cr_assert(!strchr(msg, '\n'), "one line: %s", msg);
    for (int i = 0; needles[i]; i++) cr_assert(strstr(msg, needles[i]), "%s: no \"%s\" in: %s", family,
                                               needles[i], msg);
    moe_tokenizer_free(&a);
    moe_tokenizer_free(&b);
}

Test(tokenizer_same, identical_loads_are_the_same)
{
    static const char *fam[] = {"qwen2", "mixtral", "llama3", "deepseek3"};
    for (size_t i = 0; i < sizeof fam / sizeof *fam; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", TOK_DIR, fam[i]);
        struct moe_tokenizer a, b;
        cr_assert_eq(moe_tokenizer_load(&a, dir), MOE_OK, "%s", moe_last_error());
        cr_assert_eq(moe_tokenizer_load(&b, dir), MOE_OK, "%s", moe_last_error());
        cr_assert_eq(moe_tokenizer_same(&a, &b, "target", "draft"), MOE_OK, "%s: %s", fam[i],
                     moe_last_error());
        moe_tokenizer_free(&a);
        moe_tokenizer_free(&b);
    }
}

/* qwen2's vocabulary entries "Hello" and "ello" swap ids (both stay, so
 * the merges still hold). */
static json_int_t vocab_id(json_t *j, const char *tok)
{
    json_t *id = json_object_get(json_object_get(json_object_get(j, "model"), "vocab"), tok);
    cr_assert(id, "qwen2 has the token %s", tok);
    return json_integer_value(id);
}

static void swap_vocab(json_t *j)
{
    json_t *v = json_object_get(json_object_get(j, "model"), "vocab");
    json_int_t a = vocab_id(j, "Hello"), b = vocab_id(j, "ello");
    json_object_set_new(v, "Hello", json_integer(b));
    json_object_set_new(v, "ello", json_integer(a));
}

Test(tokenizer_same, swapped_vocabulary_entries_differ)
{
    json_t *j = load_json("qwen2");
    json_int_t hello = vocab_id(j, "Hello"), ello = vocab_id(j, "ello");
    json_decref(j);
    /* the first difference is at the lower id, where the draft has the other token */
    bool hello_first = hello < ello;
    char at[64], which[96];
    snprintf(at, sizeof at, "vocabulary differs at id %lld", (long long)(hello_first ? hello : ello));
    snprintf(which, sizeof which, "%s, the target's %s", hello_first ? "\"ello\"" : "\"Hello\"",
             hello_first ? "\"Hello\"" : "\"ello\"");
    const char *needles[] = {at, which, NULL};
    expect_differs("qwen2", swap_vocab, needles);
}

static json_t *added_token(json_t *j, const char *content)
{
    json_t *added = json_object_get(j, "added_tokens"), *t;
    size_t i;
    json_array_foreach(added, i, t)
        if (!strcmp(json_string_value(json_object_get(t, "content")), content)) return t;
    cr_assert_fail("no added token %s", content);
    return NULL;
}

static void unspecial(json_t *j) { json_object_set_new(added_token(j, "<|im_end|>"), "special", json_false()); }
static void rename_added(json_t *j)
{
    json_object_set_new(added_token(j, "<|im_end|>"), "content", json_string("<|im_stop|>"));
}

Test(tokenizer_same, a_special_token_made_plain_differs)
{
    const char *needles[] = {"token 3002 \"<|im_end|>\" is not special, the target's is special", NULL};
    expect_differs("qwen2", unspecial, needles);
}

Test(tokenizer_same, a_renamed_added_token_differs)
{
    const char *needles[] = {"added token 3002 is \"<|im_stop|>\", the target's \"<|im_end|>\"", NULL};
    expect_differs("qwen2", rename_added, needles);
}

Test(tokenizer_same, another_family_differs)
{
    struct moe_tokenizer a, b;
    cr_assert_eq(moe_tokenizer_load(&a, TOK_DIR "/qwen2"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_tokenizer_load(&b, TOK_DIR "/neox"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_tokenizer_same(&a, &b, "target", "draft"), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "the draft tokenizer"), "%s", moe_last_error());
    cr_assert(!strchr(moe_last_error(), '\n'));
    moe_tokenizer_free(&a);
    moe_tokenizer_free(&b);
}
