/* toolcall_formats.c - each tool-call format's markers and the parsing of
 * one call's text (toolcall.h has the formats; toolcall.c scans for them).
 *
 * The forms are the ones the families' chat templates write for a call in
 * the history (tests/fixtures/chat/: qwen3, mistral-v3, deepseek-r1,
 * deepseek-v3.1, glm-4.6, kimi-k2); vLLM's tool parsers of the same names
 * read the same forms.  A call parser either adds its call(s) or nothing:
 * a name that is empty or holds white space, arguments that are not a JSON
 * object (or a string holding one), or text in an unexpected place make
 * the text stay content as written. */
#include "runtime/chat/toolcall.h"
#include "runtime/chat/toolcall_impl.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* DeepSeek's markers: fullwidth bars (U+FF5C), U+2581 for the spaces */
#define DS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_END "<｜tool▁calls▁end｜>"
#define DS_CALL "<｜tool▁call▁begin｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_SEP "<｜tool▁sep｜>"
#define KIMI_ARG "<|tool_call_argument_begin|>"

/* s[0..n) without white space at either end: *s and *n updated */
static void trim(const char **s, size_t *n)
{
    while (*n && isspace((unsigned char)**s)) (*s)++, (*n)--;
    while (*n && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
}

/* A name read from the text: not empty, no white space or markup. */
static bool name_ok(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (isspace((unsigned char)s[i]) || s[i] == '<' || s[i] == '>' || (unsigned char)s[i] < 0x20) return false;
    return true;
}

static bool starts(const char *s, const char *end, const char *m)
{
    const size_t k = strlen(m);
    return (size_t)(end - s) >= k && !memcmp(s, m, k);
}

/* Adds a call whose arguments are a JSON value: an object, or a string
 * holding one. */
static bool add_json(struct moe_tool_calls *tc, const char *name, size_t n_name, const json_t *args,
                     const char *id)
{
    if (json_is_string(args))
        return moe_tc_add(tc, name, n_name, json_string_value(args), json_string_length(args), false, id);
    if (!json_is_object(args)) return false;
    char *t = json_dumps(args, JSON_COMPACT);
    const bool ok = t && moe_tc_add(tc, name, n_name, t, strlen(t), false, id);
    free(t);
    return ok;
}

/* hermes: {"name": NAME, "arguments": {...}} ("parameters" too: some
 * models write that). */
static bool hermes_call(struct moe_tool_calls *tc, const char *text, size_t n)
{
    json_t *j = json_loadb(text, n, 0, NULL);
    const char *name = json_string_value(json_object_get(j, "name"));
    json_t *args = json_object_get(j, "arguments");
    if (!args) args = json_object_get(j, "parameters");
    const bool ok = name && add_json(tc, name, strlen(name), args, NULL);
    json_decref(j);
    return ok;
}

/* mistral: [{"name", "arguments"[, "id"]}, ...], or one such object; all
 * the calls or none.  An id is kept when it is what the template takes
 * back (nine letters and digits). */
static bool mistral_calls(struct moe_tool_calls *tc, const char *text, size_t n)
{
    json_t *j = json_loadb(text, n, 0, NULL);
    if (json_is_object(j)) {
        json_t *list = json_array();
        json_array_append_new(list, j);
        j = list;
    }
    const int n0 = tc->n_calls;
    bool ok = json_array_size(j) > 0;
    size_t i;
    json_t *c;
    json_array_foreach(j, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *id = json_string_value(json_object_get(c, "id"));
        json_t *args = json_object_get(c, "arguments");
        if (!args) args = json_object_get(c, "parameters");
        bool id_ok = id && strlen(id) == 9;
        for (int k = 0; id_ok && k < 9; k++) id_ok = isalnum((unsigned char)id[k]);
        if (!ok || !name || !add_json(tc, name, strlen(name), args, id_ok ? id : NULL)) {
            ok = false;
            break;
        }
    }
    json_decref(j);
    if (!ok) moe_tc_truncate(tc, n0);
    return ok;
}

/* deepseek_v3, one call: V3/R1's `function<sep>NAME\n```json\nARGS\n```` or
 * V3.1's `NAME<sep>ARGS`. */
static bool deepseek_call(struct moe_tool_calls *tc, const char *text, size_t n)
{
    const char *end = text + n, *sep = memmem(text, n, DS_SEP, strlen(DS_SEP));
    if (!sep) return false;
    const char *x = text, *y = sep + strlen(DS_SEP);
    size_t nx = (size_t)(sep - text), ny = (size_t)(end - y);
    trim(&x, &nx);
    const char *nl = memchr(y, '\n', ny);
    if (nx == 8 && !memcmp(x, "function", 8) && nl) {
        const char *name = y, *a = nl;
        size_t n_name = (size_t)(nl - y);
        trim(&name, &n_name);
        while (a < end && isspace((unsigned char)*a)) a++;
        if (starts(a, end, "```")) {
            a += 3;
            while (a < end && isalpha((unsigned char)*a)) a++; /* the block's language, json */
            const char *close = NULL;                          /* the last fence */
            for (const char *f = a; (f = memmem(f, (size_t)(end - f), "```", 3)); f++) close = f;
            const char *after = close ? close + 3 : end;
            size_t rest = (size_t)(end - after);
            trim(&after, &rest);
            if (!close || rest || !name_ok(name, n_name)) return false;
            return moe_tc_add(tc, name, n_name, a, (size_t)(close - a), true, NULL);
        }
    }
    trim(&y, &ny);
    return name_ok(x, nx) && moe_tc_add(tc, x, nx, y, ny, true, NULL);
}

/* kimi_k2, one call: `ID<|tool_call_argument_begin|>ARGS`, ID
 * `functions.NAME:IDX`; the call's id is ID. */
static bool kimi_call(struct moe_tool_calls *tc, const char *text, size_t n)
{
    const char *arg = memmem(text, n, KIMI_ARG, strlen(KIMI_ARG));
    if (!arg) return false;
    const char *id = text, *a = arg + strlen(KIMI_ARG);
    size_t n_id = (size_t)(arg - text), n_a = (size_t)(text + n - a);
    trim(&id, &n_id);
    trim(&a, &n_a);
    if (!name_ok(id, n_id)) return false;
    const char *name = id;
    size_t n_name = n_id;
    if (n_name > 10 && !memcmp(name, "functions.", 10)) name += 10, n_name -= 10;
    const char *colon = NULL;
    for (size_t i = 0; i < n_name; i++)
        if (name[i] == ':') colon = name + i;
    bool digits = colon && colon + 1 < name + n_name;
    for (const char *p = colon ? colon + 1 : name; digits && p < name + n_name; p++)
        digits = isdigit((unsigned char)*p);
    if (digits) n_name = (size_t)(colon - name);
    char *idz = strndup(id, n_id);
    const bool ok = idz && moe_tc_add(tc, name, n_name, a, n_a, true, idz);
    free(idz);
    return ok;
}

/* glm45: whether the request's tools type parameter key of function name
 * "string" (its value is then the text as written, whatever it looks like). */
static bool string_param(const struct moe_tool_calls *tc, const char *name, size_t n_name, const char *key,
                         size_t n_key)
{
    size_t i;
    const json_t *t;
    json_array_foreach(tc->tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const char *fn = json_string_value(json_object_get(f, "name"));
        if (!fn || strlen(fn) != n_name || memcmp(fn, name, n_name)) continue;
        const json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
        const char *type = json_string_value(json_object_get(json_object_getn(props, key, n_key), "type"));
        return type && !strcmp(type, "string");
    }
    return false;
}

/* glm45, one call: `NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>`
 * pairs, white space between. */
static bool glm_call(struct moe_tool_calls *tc, const char *text, size_t n)
{
    const char *end = text + n, *p = text;
    while (p < end && *p != '\n' && !starts(p, end, "<arg_key>")) p++;
    const char *name = text;
    size_t n_name = (size_t)(p - text);
    trim(&name, &n_name);
    if (!name_ok(name, n_name)) return false;
    json_t *args = json_object();
    bool ok = args != NULL;
    while (ok) {
        while (p < end && isspace((unsigned char)*p)) p++;
        if (p == end) break;
        const char *key = p + strlen("<arg_key>");
        const char *ke = starts(p, end, "<arg_key>") ? memmem(key, (size_t)(end - key), "</arg_key>", 10) : NULL;
        if (!ke) {
            ok = false;
            break;
        }
        size_t n_key = (size_t)(ke - key);
        trim(&key, &n_key);
        p = ke + 10;
        while (p < end && isspace((unsigned char)*p)) p++;
        const char *val = p + strlen("<arg_value>");
        const char *ve = starts(p, end, "<arg_value>") ? memmem(val, (size_t)(end - val), "</arg_value>", 12) : NULL;
        if (!ve || n_key == 0) {
            ok = false;
            break;
        }
        const size_t n_val = (size_t)(ve - val);
        p = ve + 12;
        json_t *v = string_param(tc, name, n_name, key, n_key) ? NULL : json_loadb(val, n_val, JSON_DECODE_ANY, NULL);
        if (!v) v = json_stringn(val, n_val); /* not JSON: the text (NULL if not UTF-8) */
        ok = v && !json_object_setn_new(args, key, n_key, v);
    }
    char *t = ok ? json_dumps(args, JSON_COMPACT) : NULL;
    json_decref(args);
    ok = t && moe_tc_add(tc, name, n_name, t, strlen(t), false, NULL);
    free(t);
    return ok;
}

static const struct moe_tc_syntax HERMES = {"<tool_call>", "</tool_call>", NULL, NULL, hermes_call};
static const struct moe_tc_syntax GLM45 = {"<tool_call>", "</tool_call>", NULL, NULL, glm_call};
static const struct moe_tc_syntax MISTRAL = {"[TOOL_CALLS]", NULL, NULL, NULL, mistral_calls};
static const struct moe_tc_syntax DEEPSEEK = {DS_BEGIN, DS_END, DS_CALL, DS_CALL_END, deepseek_call};
static const struct moe_tc_syntax KIMI = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                          "<|tool_call_begin|>", "<|tool_call_end|>", kimi_call};

const struct moe_tc_syntax *moe_tc_syntax(enum moe_tool_format fmt)
{
    switch (fmt) {
    case MOE_TOOLS_HERMES: return &HERMES;
    case MOE_TOOLS_GLM45: return &GLM45;
    case MOE_TOOLS_MISTRAL: return &MISTRAL;
    case MOE_TOOLS_DEEPSEEK_V3: return &DEEPSEEK;
    case MOE_TOOLS_KIMI_K2: return &KIMI;
    default: return NULL;
    }
}

static const struct {
    const char *name;
    enum moe_tool_format fmt;
} NAMES[] = {{"none", MOE_TOOLS_NONE},           {"hermes", MOE_TOOLS_HERMES},
             {"harmony", MOE_TOOLS_HARMONY},     {"mistral", MOE_TOOLS_MISTRAL},
             {"deepseek_v3", MOE_TOOLS_DEEPSEEK_V3}, {"deepseek_v31", MOE_TOOLS_DEEPSEEK_V3},
             {"glm45", MOE_TOOLS_GLM45},         {"kimi_k2", MOE_TOOLS_KIMI_K2}};

bool moe_tool_calls_parse_name(const char *name, enum moe_tool_format *out)
{
    for (size_t i = 0; name && i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (!strcmp(name, NAMES[i].name)) {
            *out = NAMES[i].fmt;
            return true;
        }
    return false;
}

const char *moe_tool_calls_name(enum moe_tool_format fmt)
{
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (NAMES[i].fmt == fmt) return NAMES[i].name;
    return "none";
}

const char *const *moe_tool_calls_markers(enum moe_tool_format fmt)
{
    static const char *const none[] = {NULL};
    static const char *const hermes[] = {"<tool_call>", "</tool_call>", NULL};
    static const char *const glm[] = {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                      "<arg_value>", "</arg_value>", NULL};
    static const char *const mistral[] = {"[TOOL_CALLS]", NULL};
    static const char *const deepseek[] = {DS_BEGIN, DS_END, DS_CALL, DS_CALL_END, DS_SEP, NULL};
    static const char *const kimi[] = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                       "<|tool_call_begin|>", KIMI_ARG, "<|tool_call_end|>", NULL};
    switch (fmt) {
    case MOE_TOOLS_HERMES: return hermes;
    case MOE_TOOLS_GLM45: return glm;
    case MOE_TOOLS_MISTRAL: return mistral;
    case MOE_TOOLS_DEEPSEEK_V3: return deepseek;
    case MOE_TOOLS_KIMI_K2: return kimi;
    default: return none;
    }
}

enum moe_tool_format moe_tool_calls_detect(const char *t)
{
    if (!t) return MOE_TOOLS_NONE;
    if (strstr(t, "<|channel|>")) return MOE_TOOLS_HARMONY;
    if (strstr(t, "<|tool_calls_section_begin|>") || strstr(t, "tool_declare")) return MOE_TOOLS_KIMI_K2;
    if (strstr(t, DS_BEGIN)) return MOE_TOOLS_DEEPSEEK_V3;
    if (strstr(t, "[TOOL_CALLS]")) return MOE_TOOLS_MISTRAL;
    if (strstr(t, "<arg_key>")) return MOE_TOOLS_GLM45; /* before hermes: its blocks open with <tool_call> too */
    if (strstr(t, "<tool_call>")) return MOE_TOOLS_HERMES;
    return MOE_TOOLS_NONE;
}
