/* test_chat_template.c - chat templates rendered in C against transformers.
 *
 * conformance: every case of tests/fixtures/chat/<name>.json (made by
 * tests/reference/make_chat_fixtures.py from the real templates) renders
 * byte-identically, or fails with the template's raise_exception message.
 * The other suites pin the interpreter's pieces: whitespace control, loop
 * variables, filters, slicing, namespace, undefined, errors and limits. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/chat.h"
#include "tests/testutil.h"

#define CHAT_DIR FIXTURE_DIR "/chat"

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* Prints where got and want first differ. */
static void show_diff(const char *what, const char *got, const char *want)
{
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "%s: differs at byte %zu\n  got:  \"%.80s\"\n  want: \"%.80s\"\n", what, i, got + from,
            want + from);
}

static void check_fixture(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, CHAT_DIR "/%s.json", name);
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    cr_assert(doc, "%s: %s", path, jerr.text);
    snprintf(path, sizeof path, CHAT_DIR "/%s", json_string_value(json_object_get(doc, "template")));
    char *src = read_text(path);
    struct moe_chat_template t;
    enum moe_status st = moe_chat_template_init(&t, src);
    cr_assert_eq(st, MOE_OK, "%s: %s", name, moe_last_error());
    t.fixed_time = json_integer_value(json_object_get(doc, "now"));
    setenv("TZ", "UTC", 1);
    tzset();
    json_t *cases = json_object_get(doc, "cases");
    size_t i, ok = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *cname = json_string_value(json_object_get(c, "name"));
        const char *want = json_string_value(json_object_get(c, "expected"));
        const char *err = json_string_value(json_object_get(c, "error"));
        char *out = NULL;
        st = moe_chat_template_render(&t, json_object_get(c, "messages"),
                                      json_is_true(json_object_get(c, "add_generation_prompt")),
                                      json_object_get(c, "extra"), &out);
        char what[256];
        snprintf(what, sizeof what, "%s/%s", name, cname);
        if (want) {
            if (st != MOE_OK) fprintf(stderr, "%s: %s\n", what, moe_last_error());
            else if (strcmp(out, want) != 0) show_diff(what, out, want);
            else ok++;
        } else {
            if (st == MOE_OK) fprintf(stderr, "%s: rendered, expected the error \"%s\"\n", what, err);
            else if (!strstr(moe_last_error(), err)) fprintf(stderr, "%s: error \"%s\", expected \"%s\"\n", what, moe_last_error(), err);
            else ok++;
        }
        free(out);
    }
    fprintf(stderr, "chat fixtures %s: %zu/%zu byte-identical or same error\n", name, ok, json_array_size(cases));
    cr_expect_eq(ok, json_array_size(cases), "%s: %zu of %zu cases match", name, ok, json_array_size(cases));
    moe_chat_template_free(&t);
    free(src);
    json_decref(doc);
}

Test(chat_conformance, qwen2_5) { check_fixture("qwen2.5"); }
Test(chat_conformance, qwen3) { check_fixture("qwen3"); }
Test(chat_conformance, llama3_1) { check_fixture("llama3.1"); }
Test(chat_conformance, llama3_2) { check_fixture("llama3.2"); }
Test(chat_conformance, mixtral) { check_fixture("mixtral"); }
Test(chat_conformance, olmoe) { check_fixture("olmoe"); }
Test(chat_conformance, chatml) { check_fixture("chatml"); }
