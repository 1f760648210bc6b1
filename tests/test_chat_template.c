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
#include <unistd.h>

#include "runtime/chat/chat.h"
#include "runtime/text/tokenizer.h"
#include "tests/testutil.h"

#define CHAT_DIR FIXTURE_DIR "/chat"


/* Prints where got and want first differ. */
static void show_diff(const char *what, const char *got, const char *want)
{
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "%s: differs at byte %zu\n  got:  \"%.80s\"\n  want: \"%.80s\"\n", what, i, got + from,
            want + from);
}

/* Whether a Python error's message must be matched even in the lenient
 * (fuzz) mode: the template's own raise_exception.  Other Python errors
 * can happen at a different point (generators are lazy), so random cases
 * only require that rendering fails. */
static bool strict_message(const char *err)
{
    return strncmp(err, "TemplateError: ", 15) == 0 || strstr(err, ": ") == NULL;
}

/* Renders one conversation case ({messages, add_generation_prompt, extra,
 * expected | error}); prints what differs.  Returns whether it matched. */
static bool check_case(const char *what, const struct moe_chat_template *t, json_t *c, bool strict)
{
    const char *want = json_string_value(json_object_get(c, "expected"));
    const char *err = json_string_value(json_object_get(c, "error"));
    char *out = NULL;
    enum moe_status st = moe_chat_template_render(t, json_object_get(c, "messages"),
                                                  json_is_true(json_object_get(c, "add_generation_prompt")),
                                                  json_object_get(c, "extra"), &out);
    bool ok = false;
    if (want) {
        if (st != MOE_OK) fprintf(stderr, "%s: %s\n", what, moe_last_error());
        else if (strcmp(out, want) != 0) show_diff(what, out, want);
        else ok = true;
    } else {
        /* The template's raise_exception message, or Python's "Type: message". */
        const char *sep = strstr(err, ": ");
        if (st == MOE_OK)
            fprintf(stderr, "%s: rendered, expected the error \"%s\"\n", what, err);
        else if ((strict || strict_message(err)) && !strstr(moe_last_error(), err) &&
                 !(sep && strstr(moe_last_error(), sep + 2)))
            fprintf(stderr, "%s: error \"%s\", expected \"%s\"\n", what, moe_last_error(), err);
        else
            ok = true;
    }
    free(out);
    return ok;
}

static void check_fixture(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, CHAT_DIR "/%s.json", name);
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    cr_assert(doc, "%s: %s", path, jerr.text);
    snprintf(path, sizeof path, CHAT_DIR "/%s", json_string_value(json_object_get(doc, "template")));
    char *src = tu_read_text(path);
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
        char what[256];
        snprintf(what, sizeof what, "%s/%s", name, json_string_value(json_object_get(c, "name")));
        ok += check_case(what, &t, c, true);
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
Test(chat_conformance, mistral_v1) { check_fixture("mistral-v1"); }
Test(chat_conformance, mistral_v3) { check_fixture("mistral-v3"); }
Test(chat_conformance, olmoe) { check_fixture("olmoe"); }
Test(chat_conformance, chatml) { check_fixture("chatml"); }
Test(chat_conformance, gpt_oss) { check_fixture("gpt-oss"); }
Test(chat_conformance, deepseek_r1) { check_fixture("deepseek-r1"); }
Test(chat_conformance, deepseek_v3_1) { check_fixture("deepseek-v3.1"); }
Test(chat_conformance, glm_4_6) { check_fixture("glm-4.6"); }
Test(chat_conformance, kimi_k2) { check_fixture("kimi-k2"); }

/* ---- interpreter snippets (tests/fixtures/chat/snippets.json) ---- */

/* Renders one snippet ({template, vars, expected | error}) with no
 * messages; prints what differs.  Returns whether it matched. */
static bool check_snippet(json_t *c, int64_t now, bool strict)
{
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *want = json_string_value(json_object_get(c, "expected"));
    const char *err = json_string_value(json_object_get(c, "error"));
    json_t *msgs = json_array();
    struct moe_chat_template t;
    enum moe_status st = moe_chat_template_init(&t, json_string_value(json_object_get(c, "template")));
    char *out = NULL;
    if (!st) {
        t.fixed_time = now;
        st = moe_chat_template_render(&t, msgs, false, json_object_get(c, "vars"), &out);
    }
    bool ok = false;
    if (want) {
        if (st) fprintf(stderr, "snippet %s: %s\n", name, moe_last_error());
        else if (strcmp(out, want)) show_diff(name, out, want);
        else ok = true;
    } else {
        /* Python's "Type: message": the C message carries the message. */
        const char *msg = strstr(err, ": ");
        msg = msg ? msg + 2 : err;
        if (!st) fprintf(stderr, "snippet %s: rendered \"%s\", expected the error \"%s\"\n", name, out, err);
        else if ((strict || strict_message(err)) && !strstr(moe_last_error(), msg))
            fprintf(stderr, "snippet %s: error \"%s\", expected \"%s\"\n", name, moe_last_error(), msg);
        else ok = true;
    }
    free(out);
    moe_chat_template_free(&t);
    json_decref(msgs);
    return ok;
}

Test(chat_snippets, match_transformers)
{
    json_error_t jerr;
    json_t *doc = json_load_file(CHAT_DIR "/snippets.json", 0, &jerr);
    cr_assert(doc, "snippets.json: %s", jerr.text);
    setenv("TZ", "UTC", 1);
    tzset();
    size_t i, ok = 0, n = json_array_size(json_object_get(doc, "snippets"));
    json_t *c;
    json_array_foreach(json_object_get(doc, "snippets"), i, c)
        ok += check_snippet(c, json_integer_value(json_object_get(doc, "now")), true);
    fprintf(stderr, "chat snippets: %zu/%zu match transformers\n", ok, n);
    cr_expect_eq(ok, n, "%zu of %zu snippets match", ok, n);
    json_decref(doc);
}

/* Differential fuzzing, when MOERUN_CHAT_FUZZ names a file written by
 * tests/reference/fuzz_chat_templates.py; skipped otherwise. */
Test(chat_fuzz, matches_transformers_on_random_cases)
{
    const char *path = getenv("MOERUN_CHAT_FUZZ");
    if (!path) cr_skip_test("MOERUN_CHAT_FUZZ is not set");
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    cr_assert(doc, "%s: %s", path, jerr.text);
    setenv("TZ", "UTC", 1);
    tzset();
    int64_t now = json_integer_value(json_object_get(doc, "now"));
    size_t i, ok = 0, n = 0;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), i, c) {
        char tpath[512];
        snprintf(tpath, sizeof tpath, CHAT_DIR "/%s", json_string_value(json_object_get(c, "template_file")));
        char *src = tu_read_text(tpath);
        struct moe_chat_template t;
        cr_assert_eq(moe_chat_template_init(&t, src), MOE_OK, "%s: %s", tpath, moe_last_error());
        t.fixed_time = now;
        char what[64];
        snprintf(what, sizeof what, "case %zu (%s)", i, json_string_value(json_object_get(c, "name")));
        ok += check_case(what, &t, c, false);
        n++;
        moe_chat_template_free(&t);
        free(src);
    }
    size_t unsupported = 0;
    json_array_foreach(json_object_get(doc, "snippets"), i, c) {
        bool same = check_snippet(c, now, false);
        if (!same && strstr(moe_last_error(), "not supported")) unsupported++; /* reported above, not a mismatch */
        ok += same;
        n++;
    }
    fprintf(stderr, "chat fuzz: %zu/%zu match transformers, %zu unsupported\n", ok, n, unsupported);
    cr_expect_eq(ok + unsupported, n, "%zu of %zu fuzz cases match, %zu unsupported", ok, n, unsupported);
    json_decref(doc);
}

/* ---- hand-written checks: errors, limits, the API ---- */

/* Renders src with no messages and the variables in vars_json (may be NULL);
 * returns the status, *out the text (or NULL). */
static enum moe_status render(const char *src, const char *vars_json, char **out)
{
    json_t *vars = vars_json ? json_loads(vars_json, 0, NULL) : NULL;
    json_t *msgs = json_array();
    enum moe_status st = moe_chat_render(src, msgs, false, vars, out);
    json_decref(msgs);
    json_decref(vars);
    return st;
}

static void expect_text(const char *src, const char *vars, const char *want)
{
    char *out = NULL;
    enum moe_status st = render(src, vars, &out);
    cr_assert_eq(st, MOE_OK, "%s: %s", src, moe_last_error());
    cr_expect_str_eq(out, want, "%s", src);
    free(out);
}

static void expect_error(const char *src, const char *vars, enum moe_status want, const char *needle)
{
    char *out = NULL;
    enum moe_status st = render(src, vars, &out);
    cr_expect_eq(st, want, "%s: status %s, want %s (%s)", src, moe_status_str(st), moe_status_str(want),
                 moe_last_error());
    cr_expect(strstr(moe_last_error(), needle), "%s: message \"%s\" lacks \"%s\"", src, moe_last_error(), needle);
    cr_expect_null(out);
    free(out);
}

Test(chat_errors, unsupported_constructs_name_themselves_and_the_line)
{
    expect_error("a\n\n{{ x | wordcount }}", NULL, MOE_ERR_UNSUPPORTED,
                 "chat template line 3: filter 'wordcount' is not supported");
    expect_error("{% include 'other.jinja' %}", NULL, MOE_ERR_UNSUPPORTED,
                 "chat template line 1: the 'include' tag is not supported");
    expect_error("\n{% extends 'base' %}", NULL, MOE_ERR_UNSUPPORTED, "line 2: the 'extends' tag");
    expect_error("{{ 'a'.zfill(3) }}", NULL, MOE_ERR_UNSUPPORTED, "method 'zfill' of str is not supported");
    expect_error("{{ 1 is prime }}", NULL, MOE_ERR_UNSUPPORTED, "test 'prime' is not supported");
    expect_error("{{ 1 < 2 < 3 }}", NULL, MOE_ERR_UNSUPPORTED, "chained comparisons");
    expect_error("{% for x in xs recursive %}{% endfor %}", "{\"xs\": []}", MOE_ERR_UNSUPPORTED, "recursive");
    expect_error("{{ '%s' % 1 }}", NULL, MOE_ERR_UNSUPPORTED, "printf-style");
}

Test(chat_errors, syntax_errors_name_line_and_column)
{
    expect_error("ok\n  {% if %}", NULL, MOE_ERR_FORMAT, "chat template line 2 column 9: syntax error: expected an expression");
    expect_error("{% for x in xs %}\n{{ x }}", NULL, MOE_ERR_FORMAT,
                 "the 'for' tag opened on line 1 is not closed (expected 'endfor')");
    expect_error("{{ 'unterminated }}", NULL, MOE_ERR_FORMAT, "line 1 column 4: unterminated string literal");
    expect_error("{{ x ", NULL, MOE_ERR_FORMAT, "missing '}}'");
    expect_error("{% frobnicate %}", NULL, MOE_ERR_FORMAT, "unknown tag 'frobnicate'");
    expect_error("{% if x %}{% endfor %}", NULL, MOE_ERR_FORMAT, "unexpected 'endfor' inside if");
    expect_error("{# never closed", NULL, MOE_ERR_FORMAT, "unclosed comment");
    expect_error("a{% break %}", NULL, MOE_ERR_FORMAT, "line 1 column 5: syntax error: 'break' outside loop");
    expect_error("{% for x in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}", NULL, MOE_ERR_FORMAT,
                 "'continue' outside loop");
    expect_error("{{ a b }}", NULL, MOE_ERR_FORMAT, "line 1 column 6: syntax error: expected end of print statement");
}

/* Found by tests/fuzz/fuzz_chat_template: a binary operator whose right
 * operand failed to parse freed its left operand but left it linked into the
 * enclosing node ('not' here), which freed it again. */
Test(chat_errors, failed_right_operand_is_freed_once)
{
    expect_error("{{ not 1 + }}", NULL, MOE_ERR_FORMAT, "syntax error: expected an expression");
    expect_error("{{ not 1 ~ 2 * }}", NULL, MOE_ERR_FORMAT, "syntax error: expected an expression");
    expect_error("{{ not 1 and }}", NULL, MOE_ERR_FORMAT, "syntax error: expected an expression");
    expect_error("{{ -(1 ** ) }}", NULL, MOE_ERR_FORMAT, "syntax error: expected an expression");
}

Test(chat_errors, raise_exception_carries_the_message)
{
    char *out = NULL;
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]", 0, NULL);
    const char *tpl = "{% for m in messages %}\n{% if loop.index0 % 2 == 1 and m.role == 'user' %}"
                      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                      "{% endif %}{% endfor %}";
    enum moe_status st = moe_chat_render(tpl, msgs, true, NULL, &out);
    cr_expect_eq(st, MOE_ERR_FORMAT);
    cr_expect(strstr(moe_last_error(), "line 2: Conversation roles must alternate"), "%s", moe_last_error());
    cr_expect_null(out);
    json_decref(msgs);
}

Test(chat_errors, runaway_templates_stop)
{
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, MOE_ERR_FORMAT,
                 "macro calls nested deeper than");
    expect_error("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", NULL,
                 MOE_ERR_FORMAT, "loop iterations");
    expect_error("{{ range(100000000) | length }}", NULL, MOE_ERR_FORMAT, "range() of more than");
    expect_error("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                 "{% endfor %}", NULL, MOE_ERR_FORMAT, "exceeds the output limit");
    expect_error("{{ 'x' * 100000000000 }}", NULL, MOE_ERR_FORMAT, "exceeds the output limit");
    char *deep = malloc(4000);
    strcpy(deep, "{{ ");
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 1000; i++) strcat(deep, ")");
    strcat(deep, " }}");
    expect_error(deep, NULL, MOE_ERR_FORMAT, "nested too deeply");
    free(deep);

    struct moe_chat_template t;
    cr_assert_eq(moe_chat_template_init(&t, "{% for i in range(1000) %}0123456789{% endfor %}"), MOE_OK);
    t.max_output = 5000;
    char *out = NULL;
    json_t *msgs = json_array();
    cr_expect_eq(moe_chat_template_render(&t, msgs, false, NULL, &out), MOE_ERR_FORMAT);
    cr_expect(strstr(moe_last_error(), "limit of 5000 bytes"), "%s", moe_last_error());
    free(out);
    json_decref(msgs);
    moe_chat_template_free(&t);
    moe_chat_template_free(&t); /* twice is safe */
}

Test(chat_interp, undefined_behaves_like_jinja_default_undefined)
{
    expect_text("[{{ nope }}][{{ nope is defined }}][{{ nope | length }}][{{ 'a' ~ nope }}]"
                "[{% if nope %}t{% else %}f{% endif %}][{% for x in nope %}x{% endfor %}][{{ nope | default('d') }}]",
                NULL, "[][False][0][a][f][][d]");
    expect_text("[{{ d.missing }}][{{ d.missing is defined }}][{{ xs[7] }}]", "{\"d\": {}, \"xs\": []}",
                "[][False][]");
    /* Using an undefined value beyond printing and testing is an error. */
    expect_error("{{ nope.attr }}", NULL, MOE_ERR_FORMAT, "'nope' is undefined");
    expect_error("{{ nope + 1 }}", NULL, MOE_ERR_FORMAT, "'nope' is undefined");
    expect_error("{{ d.missing + 1 }}", "{\"d\": {}}", MOE_ERR_FORMAT, "'dict object' has no attribute 'missing'");
    expect_error("{{ nope() }}", NULL, MOE_ERR_FORMAT, "'nope' is undefined");
}

Test(chat_interp, whitespace_control)
{
    expect_text("a\n  {% if true %}\n  b\n  {% endif %}\nc\n", NULL, "a\n  b\nc");
    expect_text("a  {{- ' b ' -}}  c", NULL, "a b c");
    expect_text("  {%+ if true %}x{% endif +%}\ny", NULL, "  x\ny");
    expect_text("{% for x in 'ab' %}\n{{ x }}\n{% endfor %}", NULL, "a\nb\n");
    expect_text("{# c #}\n  {#- c -#}  \nx", NULL, "x");
}

Test(chat_interp, loops_namespace_and_slicing)
{
    expect_text("{% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ '!' if loop.last }} {% endfor %}",
                "{\"xs\": [5, 6]}", "1/2 2/2! ");
    expect_text("{% for m in ms[::-1] %}{{ m }}{% endfor %}|{{ ms[1:] }}|{{ ms[-1] }}", "{\"ms\": [1, 2, 3]}",
                "321|[2, 3]|3");
    expect_text("{% set ns = namespace(found=false) %}{% for x in [1, 2] %}{% if x == 2 %}{% set ns.found = true %}"
                "{% endif %}{% endfor %}{{ ns.found }}", NULL, "True");
    expect_error("{% set x = 1 %}{% set x.y = 2 %}", NULL, MOE_ERR_FORMAT, "non-namespace");
}

Test(chat_interp, tojson_matches_python_json_dumps)
{
    expect_text("{{ v | tojson }}", "{\"v\": {\"b\": [1, 2.0, null], \"a\": \"\\u00e9\\\"\\n\"}}",
                "{\"b\": [1, 2.0, null], \"a\": \"\u00e9\\\"\\n\"}");
    expect_text("{{ v | tojson(indent=2) }}", "{\"v\": {\"k\": [1]}}", "{\n  \"k\": [\n    1\n  ]\n}");
}

Test(chat_api, variables_transformers_passes)
{
    /* tools and documents are always defined (None unless given), as in
     * render_jinja_template; extra keys are globals. */
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    json_t *extra = json_loads("{\"bos_token\": \"<s>\", \"enable_thinking\": false}", 0, NULL);
    char *out = NULL;
    cr_assert_eq(moe_chat_render("{{ bos_token }}{{ tools is none }}{{ documents is none }}{{ enable_thinking }}"
                                 "{{ add_generation_prompt }}{{ messages[0].content }}",
                                 msgs, true, extra, &out), MOE_OK, "%s", moe_last_error());
    cr_expect_str_eq(out, "<s>TrueTrueFalseTruehi");
    free(out);
    cr_assert_eq(moe_chat_render("{{ tools | length }}", msgs, false, NULL, &out), MOE_ERR_FORMAT);
    json_decref(extra);
    json_decref(msgs);
}

Test(chat_api, reasoning_fields_are_aliased)
{
    json_t *msgs = json_loads("[{\"role\": \"assistant\", \"content\": \"4\", \"reasoning\": \"r\"}]", 0, NULL);
    char *out = NULL;
    cr_assert_eq(moe_chat_render("{% for k, v in messages[0] | items %}{{ k }}={{ v }};{% endfor %}", msgs, false,
                                 NULL, &out), MOE_OK, "%s", moe_last_error());
    cr_expect_str_eq(out, "thinking=r;role=assistant;content=4;reasoning=r;reasoning_content=r;");
    free(out);
    json_decref(msgs);
}

Test(chat_api, bad_arguments)
{
    char *out = NULL;
    json_t *obj = json_object();
    cr_expect_eq(moe_chat_render("x", obj, false, NULL, &out), MOE_ERR_INVALID_ARG);
    json_t *bad = json_loads("[\"not an object\"]", 0, NULL);
    cr_expect_eq(moe_chat_render("x", bad, false, NULL, &out), MOE_ERR_INVALID_ARG);
    cr_expect(strstr(moe_last_error(), "messages[0]"));
    cr_expect_eq(moe_chat_render(NULL, obj, false, NULL, &out), MOE_ERR_INVALID_ARG);
    cr_expect_null(out);
    json_decref(bad);
    json_decref(obj);
}

Test(chat_api, strftime_now_uses_the_injected_clock)
{
    setenv("TZ", "UTC", 1);
    tzset();
    struct moe_chat_template t;
    cr_assert_eq(moe_chat_template_init(&t, "{{ strftime_now('%d %b %Y %H:%M') }}"), MOE_OK);
    t.fixed_time = 0;
    char *out = NULL;
    json_t *msgs = json_array();
    cr_assert_eq(moe_chat_template_render(&t, msgs, false, NULL, &out), MOE_OK);
    cr_expect_gt(strlen(out), 10); /* the real clock */
    free(out);
    t.fixed_time = 86400 * 365;
    cr_assert_eq(moe_chat_template_render(&t, msgs, false, NULL, &out), MOE_OK);
    cr_expect_str_eq(out, "01 Jan 1971 00:00");
    free(out);
    json_decref(msgs);
    moe_chat_template_free(&t);
}

Test(chat_api, load_prefers_chat_template_jinja)
{
    char dir[] = "/tmp/moerun-chat-XXXXXX";
    cr_assert(mkdtemp(dir));
    struct moe_chat_template t;
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    char *out = NULL;
    /* No file: the tokenizer_config template. */
    cr_assert_eq(moe_chat_template_load(&t, dir, "config:{{ messages[0].content }}"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_chat_template_render(&t, msgs, false, NULL, &out), MOE_OK);
    cr_expect_str_eq(out, "config:hi");
    free(out);
    moe_chat_template_free(&t);
    cr_expect_eq(moe_chat_template_load(&t, dir, NULL), MOE_ERR_FORMAT);
    cr_expect(strstr(moe_last_error(), "no chat template"), "%s", moe_last_error());
    /* chat_template.jinja wins, its trailing newline dropped as Jinja does. */
    char path[256];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("file:{{ messages[0].content }}\n", f);
    fclose(f);
    cr_assert_eq(moe_chat_template_load(&t, dir, "config"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_chat_template_render(&t, msgs, false, NULL, &out), MOE_OK);
    cr_expect_str_eq(out, "file:hi");
    free(out);
    moe_chat_template_free(&t);
    f = fopen(path, "w");
    fputs("{% if %}", f);
    fclose(f);
    cr_expect_eq(moe_chat_template_load(&t, dir, "config"), MOE_ERR_FORMAT);
    cr_expect(strstr(moe_last_error(), "chat_template.jinja: chat template line 1 column"), "%s", moe_last_error());
    remove(path);
    rmdir(dir);
    json_decref(msgs);
}

Test(chat_api, special_tokens_from_the_tokenizer)
{
    struct moe_tokenizer tok;
    cr_assert_eq(moe_tokenizer_load(&tok, FIXTURE_DIR "/tokenizers/qwen2"), MOE_OK, "%s", moe_last_error());
    json_t *sp = moe_chat_special_tokens(&tok);
    cr_assert(sp);
    cr_expect_str_eq(json_string_value(json_object_get(sp, "eos_token")), tok.eos_token);
    cr_expect_null(json_object_get(sp, "bos_token"));
    struct moe_chat_template t;
    cr_assert_eq(moe_chat_template_load(&t, FIXTURE_DIR "/tokenizers/qwen2", tok.chat_template), MOE_OK,
                 "%s", moe_last_error());
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    char *out = NULL;
    cr_assert_eq(moe_chat_template_render(&t, msgs, true, sp, &out), MOE_OK, "%s", moe_last_error());
    cr_expect_str_eq(out, "<|im_start|>user\nhi<|im_end|>\n");
    free(out);
    json_decref(msgs);
    json_decref(sp);
    moe_chat_template_free(&t);
    moe_tokenizer_free(&tok);
}

/* Content part lists become their texts joined with "\n"; the messages
 * that need nothing are returned as given; other parts and unknown roles
 * fail naming the message and part. */
Test(chat_messages, text_parts_joined_and_others_refused)
{
    json_t *m = json_loads("[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": "
                           "[{\"type\": \"text\", \"text\": \"Hi\"}, {\"type\": \"text\", \"text\": \"there\"}]}]",
                           0, NULL), *out = NULL;
    cr_assert(m);
    cr_assert_eq(moe_chat_messages_text(m, &out), MOE_OK, "%s", moe_last_error());
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(out, 1), "content")), "Hi\nthere");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(out, 0), "content")), "S");
    cr_assert(json_is_array(json_object_get(json_array_get(m, 1), "content")), "the input is left as it was");
    json_decref(out);
    json_decref(m);
    m = json_loads("[{\"role\": \"user\", \"content\": \"Hi\"}]", 0, NULL);
    cr_assert_eq(moe_chat_messages_text(m, &out), MOE_OK);
    cr_assert_eq(out, m, "nothing to change: the same array");
    json_decref(out);
    json_decref(m);
    const struct { const char *json, *needle; } bad[] = {
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"input_audio\"}]}]",
         "messages[0].content[1] is of type 'input_audio'"},
        {"[{\"role\": \"user\", \"content\": [7]}]", "messages[0].content[0] must be an object"},
        {"[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"robot\", \"content\": \"b\"}]",
         "messages[1].role must be one of"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = json_loads(bad[i].json, 0, NULL);
        cr_assert(m);
        out = NULL;
        cr_assert_eq(moe_chat_messages_text(m, &out), MOE_ERR_INVALID_ARG, "%s", bad[i].json);
        cr_assert_null(out);
        cr_assert(strstr(moe_last_error(), bad[i].needle), "%s: %s", bad[i].json, moe_last_error());
        json_decref(m);
    }
}
