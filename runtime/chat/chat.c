/* chat.c - the public chat-template API (chat.h) over the Jinja
 * interpreter: builds the variables transformers' render_jinja_template
 * passes (utils/chat_template_utils.py) and renders. */
#include "runtime/chat/chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/chat/jinja/jinja.h"
#include "runtime/core/strbuf.h"
#include "runtime/text/tokenizer.h"

#define DEFAULT_MAX_OUTPUT ((size_t)16 << 20)

enum moe_status moe_chat_template_init(struct moe_chat_template *t, const char *src)
{
    memset(t, 0, sizeof *t);
    if (!src) return moe_fail(MOE_ERR_INVALID_ARG, "chat template: no template");
    struct jtemplate *tpl = calloc(1, sizeof *tpl);
    if (!tpl) return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory");
    enum moe_status st = jinja_parse(src, tpl);
    if (st) {
        free(tpl);
        return st;
    }
    t->impl = tpl;
    t->source = strdup(src);
    if (!t->source) {
        moe_chat_template_free(t);
        return moe_fail(MOE_ERR_NOMEM, "chat template: out of memory");
    }
    t->max_output = DEFAULT_MAX_OUTPUT;
    return MOE_OK;
}

void moe_chat_template_free(struct moe_chat_template *t)
{
    if (t->impl) {
        jinja_free(t->impl);
        free(t->impl);
    }
    free(t->source);
    memset(t, 0, sizeof *t);
}

/* transformers' _alias_reasoning_fields: {"thinking": r, **message,
 * "reasoning_content": r} where r is the first non-null of
 * reasoning_content, thinking, reasoning.  Returns a new array. */
static json_t *alias_reasoning(json_t *messages)
{
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (!out) return NULL;
        json_t *r = NULL;
        for (size_t f = 0; f < 3 && json_is_object(m) && !r; f++) {
            json_t *x = json_object_get(m, fields[f]);
            if (x && !json_is_null(x)) r = x;
        }
        if (!r) {
            if (json_array_append(out, m)) goto fail;
            continue;
        }
        json_t *c = json_object();
        if (!c) goto fail;
        int bad = json_object_set(c, "thinking", r);
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) bad |= json_object_set(c, k, v);
        bad |= json_object_set(c, "reasoning_content", r);
        if (bad || json_array_append_new(out, c)) {
            if (bad) json_decref(c);
            goto fail;
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

enum moe_status moe_chat_template_render(const struct moe_chat_template *t, json_t *messages,
                                         bool add_generation_prompt, json_t *extra, char **out)
{
    *out = NULL;
    if (!t->impl) return moe_fail(MOE_ERR_INVALID_ARG, "chat template: not initialised");
    if (!json_is_array(messages)) return moe_fail(MOE_ERR_INVALID_ARG, "chat template: messages must be a JSON array");
    if (extra && !json_is_object(extra))
        return moe_fail(MOE_ERR_INVALID_ARG, "chat template: extra variables must be a JSON object");
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (!json_is_object(m))
            return moe_fail(MOE_ERR_INVALID_ARG, "chat template: messages[%zu] is not an object", i);
    }
    json_t *vars = json_object();
    json_t *msgs = alias_reasoning(messages);
    enum moe_status st = MOE_OK;
    if (!vars || !msgs) {
        st = moe_fail(MOE_ERR_NOMEM, "chat template: out of memory");
        goto done;
    }
    /* render(messages=, tools=, documents=, add_generation_prompt=, **kwargs) */
    json_t *tools = extra ? json_object_get(extra, "tools") : NULL;
    json_t *docs = extra ? json_object_get(extra, "documents") : NULL;
    int bad = json_object_set(vars, "messages", msgs);
    bad |= json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null());
    bad |= json_object_set_new(vars, "documents", docs ? json_incref(docs) : json_null());
    bad |= json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    const char *k;
    json_t *v;
    if (extra) {
        json_object_foreach(extra, k, v) {
            if (strcmp(k, "tools") && strcmp(k, "documents") && strcmp(k, "messages") &&
                strcmp(k, "add_generation_prompt"))
                bad |= json_object_set(vars, k, v);
        }
    }
    if (bad) {
        st = moe_fail(MOE_ERR_NOMEM, "chat template: out of memory");
        goto done;
    }
    struct jinja_limits lim = {.max_output = t->max_output ? t->max_output : DEFAULT_MAX_OUTPUT,
                               .max_depth = 64, .max_steps = 1000u * 1000};
    st = jinja_render(t->impl, vars, &lim, t->fixed_time ? (time_t)t->fixed_time : time(NULL), out);
done:
    json_decref(msgs);
    json_decref(vars);
    return st;
}

enum moe_status moe_chat_template_load(struct moe_chat_template *t, const char *model_dir,
                                       const char *config_template)
{
    memset(t, 0, sizeof *t);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir) >= (int)sizeof path)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: path too long", model_dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno != ENOENT) return moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
        if (!config_template)
            return moe_fail(MOE_ERR_FORMAT, "%s: no chat template (neither chat_template.jinja nor a "
                            "tokenizer_config.json \"chat_template\")", model_dir);
        enum moe_status st = moe_chat_template_init(t, config_template);
        if (st) moe_error_prefix("%s/tokenizer_config.json: ", model_dir);
        return st;
    }
    struct jbuf b = {0};
    char chunk[16384];
    size_t n;
    enum moe_status st = MOE_OK;
    while (!st && (n = fread(chunk, 1, sizeof chunk, f)) > 0) st = jbuf_add(&b, chunk, n);
    if (!st && ferror(f)) st = moe_fail(MOE_ERR_IO, "%s: read error", path);
    fclose(f);
    if (!st && !b.p) st = jbuf_add(&b, "", 0);
    if (!st && memchr(b.p, '\0', b.n)) st = moe_fail(MOE_ERR_FORMAT, "%s: contains a NUL byte", path);
    if (!st) {
        st = moe_chat_template_init(t, b.p);
        if (st) moe_error_prefix("%s: ", path);
    }
    jbuf_free(&b);
    return st;
}

json_t *moe_chat_special_tokens(const struct moe_tokenizer *tok)
{
    json_t *o = json_object();
    if (!o) return NULL;
    if ((tok->bos_token && json_object_set_new(o, "bos_token", json_string(tok->bos_token))) ||
        (tok->eos_token && json_object_set_new(o, "eos_token", json_string(tok->eos_token)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

enum moe_status moe_chat_render(const char *template_src, json_t *messages, bool add_generation_prompt,
                                json_t *extra, char **out)
{
    struct moe_chat_template t;
    *out = NULL;
    MOE_TRY(moe_chat_template_init(&t, template_src));
    enum moe_status st = moe_chat_template_render(&t, messages, add_generation_prompt, extra, out);
    moe_chat_template_free(&t);
    return st;
}

/* One content list's text parts joined with "\n" (new string), or NULL
 * with the error set and *st its status. */
static json_t *content_parts_text(json_t *parts, size_t i, enum moe_status *st)
{
    *st = MOE_ERR_INVALID_ARG;
    char *text = NULL;
    size_t n = 0, cap = 0, k;
    json_t *part;
    json_array_foreach(parts, k, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !type) {
            free(text);
            (void)moe_fail(MOE_ERR_INVALID_ARG, "messages[%zu].content[%zu] must be an object with a "
                           "string 'type'", i, k);
            return NULL;
        }
        if (strcmp(type, "text")) {
            free(text);
            (void)moe_fail(MOE_ERR_INVALID_ARG, "messages[%zu].content[%zu] is of type '%.64s'; only "
                           "'text' parts are supported", i, k, type);
            return NULL;
        }
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(t)) {
            free(text);
            (void)moe_fail(MOE_ERR_INVALID_ARG, "messages[%zu].content[%zu].text must be a string", i, k);
            return NULL;
        }
        if ((k && !moe_buf_append(&text, &n, &cap, "\n", 1)) ||
            !moe_buf_append(&text, &n, &cap, json_string_value(t), json_string_length(t))) {
            free(text);
            *st = moe_fail(MOE_ERR_NOMEM, "messages[%zu].content", i);
            return NULL;
        }
    }
    json_t *out = json_stringn_nocheck(text ? text : "", n);
    free(text);
    if (!out) *st = moe_fail(MOE_ERR_NOMEM, "messages[%zu].content", i);
    return out;
}

enum moe_status moe_chat_messages_text(json_t *messages, json_t **out)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
    *out = NULL;
    json_t *copy = NULL, *m;
    size_t i;
    json_array_foreach(messages, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        bool known = false;
        for (size_t r = 0; role && r < sizeof roles / sizeof roles[0]; r++) known |= !strcmp(role, roles[r]);
        if (!known) {
            json_decref(copy);
            return moe_fail(MOE_ERR_INVALID_ARG, "messages[%zu].role must be one of system, developer, user, "
                            "assistant, tool, function", i);
        }
        json_t *c = json_object_get(m, "content");
        if (!json_is_array(c)) continue;
        enum moe_status st;
        json_t *text = content_parts_text(c, i, &st);
        if (!text) {
            json_decref(copy);
            return st;
        }
        if (!copy && !(copy = json_deep_copy(messages))) {
            json_decref(text);
            return moe_fail(MOE_ERR_NOMEM, "messages");
        }
        if (json_object_set_new(json_array_get(copy, i), "content", text)) {
            json_decref(copy);
            return moe_fail(MOE_ERR_NOMEM, "messages");
        }
    }
    *out = copy ? copy : json_incref(messages);
    return MOE_OK;
}
