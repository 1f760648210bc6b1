/* The JSON Schema compiler (runtime/grammar/json_schema.c) against the
 * jsonschema package: tests/fixtures/json_schema/cases.json (made by
 * tests/reference/make_schema_fixtures.py) holds schemas and documents
 * labelled valid or invalid by jsonschema's Draft 2020-12 validator; each
 * schema's grammar must accept exactly the valid ones, fed whole and byte
 * by byte.  The refused schemas must fail with the fixture's message. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"

static json_t *fixture(void)
{
    json_error_t err;
    json_t *f = json_load_file(MOERUN_SOURCE_DIR "/tests/fixtures/json_schema/cases.json", 0, &err);
    cr_assert(f, "cases.json: %s", err.text);
    return f;
}

/* Whether g accepts text: all at once, and byte by byte (which must agree). */
static bool accepts(const struct moe_grammar *g, const char *text)
{
    struct moe_grammar_state st;
    bool ok = false, whole = false;
    size_t n = strlen(text);
    cr_assert_eq(moe_grammar_state_init(&st, g), MOE_OK);
    cr_assert_eq(moe_grammar_state_advance(&st, (const uint8_t *)text, n, &ok), MOE_OK, "%s", moe_last_error());
    whole = ok && moe_grammar_state_accepting(&st);
    moe_grammar_state_free(&st);
    cr_assert_eq(moe_grammar_state_init(&st, g), MOE_OK);
    ok = true;
    for (size_t i = 0; i < n && ok; i++)
        cr_assert_eq(moe_grammar_state_advance(&st, (const uint8_t *)text + i, 1, &ok), MOE_OK);
    bool bytewise = ok && moe_grammar_state_accepting(&st);
    moe_grammar_state_free(&st);
    cr_assert_eq(whole, bytewise, "whole %d vs byte by byte %d on %s", whole, bytewise, text);
    return whole;
}

TestSuite(json_schema, .timeout = 60);

Test(json_schema, accepts_exactly_what_jsonschema_validates)
{
    json_t *f = fixture(), *cases = json_object_get(f, "cases"), *c;
    size_t i, n_docs = 0;
    cr_assert_geq(json_array_size(cases), 30);
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        struct moe_grammar *g;
        cr_assert_eq(moe_json_schema_grammar(json_object_get(c, "schema"), &g), MOE_OK, "%s: %s", name,
                     moe_last_error());
        for (int valid = 0; valid < 2; valid++) {
            json_t *docs = json_object_get(c, valid ? "valid" : "invalid"), *d;
            size_t k;
            json_array_foreach(docs, k, d) {
                const char *text = json_string_value(d);
                cr_expect_eq(accepts(g, text), (bool)valid, "%s: the grammar %s %s, which jsonschema calls %s",
                             name, valid ? "refuses" : "accepts", text, valid ? "valid" : "invalid");
                n_docs++;
            }
        }
        moe_grammar_free(g);
    }
    cr_log_info("%zu schemas, %zu documents", json_array_size(cases), n_docs);
    json_decref(f);
}

Test(json_schema, refuses_unsupported_keywords_naming_them)
{
    json_t *f = fixture(), *refused = json_object_get(f, "refused"), *c;
    size_t i;
    cr_assert_geq(json_array_size(refused), 10);
    json_array_foreach(refused, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *want = json_string_value(json_object_get(c, "message"));
        struct moe_grammar *g = NULL;
        enum moe_status st = moe_json_schema_grammar(json_object_get(c, "schema"), &g);
        cr_expect_neq(st, MOE_OK, "%s: compiled, but should be refused", name);
        cr_expect_null(g);
        cr_expect(strstr(moe_last_error(), want), "%s: message '%s' does not hold '%s'", name, moe_last_error(), want);
        moe_grammar_free(g);
    }
    json_decref(f);
}

/* A refusal is one line naming the keyword and where it is. */
Test(json_schema, message_is_one_line)
{
    json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\","
                           "\"patternProperties\":{\"^x\":{}}}}}", 0, NULL);
    struct moe_grammar *g;
    cr_assert_neq(moe_json_schema_grammar(s, &g), MOE_OK);
    cr_assert_str_eq(moe_last_error(), "unsupported JSON Schema keyword \"patternProperties\" at /properties/a");
    json_decref(s);
}

/* Required properties, in order, with optional ones between: the text of
 * the grammar is small and every combination of the optional ones parses. */
Test(json_schema, optional_properties_every_subset)
{
    json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"},"
                           "\"c\":{\"type\":\"null\"},\"d\":{\"type\":\"null\"}},\"required\":[\"c\"],"
                           "\"additionalProperties\":false}", 0, NULL);
    struct moe_grammar *g;
    cr_assert_eq(moe_json_schema_grammar(s, &g), MOE_OK, "%s", moe_last_error());
    const char *names = "abcd";
    for (int mask = 0; mask < 16; mask++) {
        char doc[64] = "{";
        for (int k = 0; k < 4; k++)
            if (mask & (1 << k))
                snprintf(doc + strlen(doc), sizeof doc - strlen(doc), "%s\"%c\":null", strlen(doc) > 1 ? "," : "", names[k]);
        strcat(doc, "}");
        cr_expect_eq(accepts(g, doc), (bool)(mask & 4), "%s", doc);
    }
    moe_grammar_free(g);
    json_decref(s);
}

/* MOE_JSON_SCHEMA_WS_AROUND (strict tool calls: "<tool_call>\n{...}\n"):
 * whitespace may come before and after the document; without the flag it
 * may not. */
Test(json_schema, whitespace_around_the_document)
{
    json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                           "\"required\":[\"a\"],\"additionalProperties\":false}", 0, NULL);
    struct moe_grammar *g[2];
    for (int f = 0; f < 2; f++) {
        char *src;
        size_t n;
        cr_assert_eq(moe_json_schema_source(s, f ? MOE_JSON_SCHEMA_WS_AROUND : 0, &src, &n), MOE_OK, "%s",
                     moe_last_error());
        cr_assert_eq(moe_grammar_parse(src, n, &g[f]), MOE_OK, "%s", moe_last_error());
        free(src);
    }
    cr_expect(accepts(g[0], "{\"a\": 1}") && accepts(g[1], "{\"a\": 1}"));
    cr_expect(!accepts(g[0], "\n{\"a\": 1}\n"), "no whitespace around without the flag");
    cr_expect(accepts(g[1], "\n{\"a\": 1}\n") && accepts(g[1], " {\"a\": 1}"), "whitespace around with it");
    cr_expect(!accepts(g[1], "\n\n{\"a\": 1}"), "the json_object grammar's whitespace, no more");
    moe_grammar_free(g[0]);
    moe_grammar_free(g[1]);
    json_decref(s);
}
