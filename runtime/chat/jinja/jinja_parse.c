/* jinja_parse.c - tokens -> AST: statements and block structure
 * (expressions are in jinja_parse_expr.c), following jinja2.parser.Parser.
 *
 * Statements: if/elif/else, for (targets, `if` filter, else), set (name,
 * ns.attr, tuple targets, block set), macro, break/continue
 * (jinja2.ext.loopcontrols), generation/endgeneration (transformers'
 * AssistantTracker: its body is rendered as is).  Other Jinja tags
 * (extends, include, import, call, filter, with, ...) are MOE_ERR_UNSUPPORTED
 * naming the tag and line; unknown tags and malformed syntax are
 * MOE_ERR_FORMAT naming line and column. */
#include <stdlib.h>
#include <string.h>

#include "runtime/chat/jinja/jinja_parse_impl.h"

/* Assignment targets: name, name.attr (set only), or name, name, ... */
static enum moe_status parse_target(struct jparser *p, bool allow_attr, struct jnode **out)
{
    struct jnode *tuple = NULL;
    for (;;) {
        const struct jtok *t = jp_next(p);
        if (t->kind != JT_NAME) {
            jnode_free(tuple);
            return jp_syntax_err(t, "a variable name");
        }
        struct jnode *n = jp_node_new(JN_NAME, t);
        if (!n || !(n->str = jp_tok_strdup(t))) {
            jnode_free(n);
            jnode_free(tuple);
            return jp_nomem();
        }
        if (allow_attr && !tuple && jp_is_op(p, ".")) {
            const struct jtok *d = jp_next(p);
            const struct jtok *a = jp_next(p);
            struct jnode *g = a->kind == JT_NAME ? jp_node_new(JN_GETATTR, d) : NULL;
            if (a->kind != JT_NAME) {
                jnode_free(n);
                return jp_syntax_err(a, "an attribute name");
            }
            if (!g || !(g->str = jp_tok_strdup(a))) {
                jnode_free(g);
                jnode_free(n);
                return jp_nomem();
            }
            g->a = n;
            *out = g;
            return MOE_OK;
        }
        if (!tuple && !jp_is_op(p, ",")) {
            *out = n;
            return MOE_OK;
        }
        if (!tuple && !(tuple = jp_node_new(JN_TUPLE, t))) {
            jnode_free(n);
            return jp_nomem();
        }
        enum moe_status st = jp_list_push(&tuple->args, n);
        if (st) {
            jnode_free(tuple);
            return st;
        }
        if (!jp_is_op(p, ",")) break;
        jp_next(p);
    }
    *out = tuple;
    return MOE_OK;
}

static enum moe_status parse_body(struct jparser *p, struct jlist *body, const char *const *ends,
                                  const char *what, const struct jtok *opened, const char **ended);

/* After the tag name: "%}" closing the current tag. */
static enum moe_status end_tag(struct jparser *p) { return jp_expect_kind(p, JT_BLOCK_END, "end of statement block '%}'"); }

static enum moe_status parse_if(struct jparser *p, const struct jtok *t, struct jnode **out)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct jnode *n = jp_node_new(JN_IF, t);
    if (!n) return jp_nomem();
    *out = n;
    const char *ended = NULL;
    MOE_TRY(jp_parse_expr(p, &n->a));
    MOE_TRY(end_tag(p));
    MOE_TRY(parse_body(p, &n->body, ends, "if", t, &ended));
    if (!strcmp(ended, "elif")) {
        struct jnode *e = NULL;
        enum moe_status st = parse_if(p, t, &e);
        if (st) {
            jnode_free(e);
            return st;
        }
        return jp_list_push(&n->orelse, e); /* the nested if consumed endif */
    }
    if (!strcmp(ended, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        MOE_TRY(end_tag(p));
        MOE_TRY(parse_body(p, &n->orelse, ends2, "if", t, &ended));
    }
    return end_tag(p);
}

static enum moe_status parse_statement(struct jparser *p, struct jlist *body)
{
    const struct jtok *begin = jp_next(p); /* {% */
    const struct jtok *t = jp_next(p);
    if (t->kind != JT_NAME) return jp_syntax_err(t, "a tag name");
    struct jnode *n = NULL;
    enum moe_status st = MOE_OK;
    const char *ended = NULL;
    (void)begin;
    if (jp_tok_is(t, JT_NAME, "if")) {
        st = parse_if(p, t, &n);
    } else if (jp_tok_is(t, JT_NAME, "for")) {
        static const char *const ends[] = {"else", "endfor", NULL};
        if (!(n = jp_node_new(JN_FOR, t))) return jp_nomem();
        struct jnode *target = NULL;
        if (!(st = parse_target(p, false, &target))) {
            if (target->kind == JN_TUPLE) {
                n->args = target->args;
                memset(&target->args, 0, sizeof target->args);
                jnode_free(target);
            } else {
                st = jp_list_push(&n->args, target);
            }
        }
        if (!st && !jp_is_name(p, "in")) st = jp_syntax_err(jp_peek(p), "'in'");
        if (!st) {
            jp_next(p);
            st = jp_parse_tuple(p, &n->a, false);
        }
        if (!st && jp_is_name(p, "if")) {
            jp_next(p);
            st = jp_parse_expr(p, &n->b);
        }
        if (!st && jp_is_name(p, "recursive"))
            st = moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: recursive for loops are not supported", t->line);
        if (!st) st = end_tag(p);
        if (!st) {
            p->loops++;
            st = parse_body(p, &n->body, ends, "for", t, &ended);
            p->loops--;
        }
        if (!st && !strcmp(ended, "else")) {
            static const char *const ends2[] = {"endfor", NULL};
            st = end_tag(p);
            if (!st) st = parse_body(p, &n->orelse, ends2, "for", t, &ended);
        }
        if (!st) st = end_tag(p);
    } else if (jp_tok_is(t, JT_NAME, "set")) {
        if (!(n = jp_node_new(JN_SET, t))) return jp_nomem();
        st = parse_target(p, true, &n->c);
        if (!st && jp_is_op(p, "=")) {
            jp_next(p);
            st = jp_parse_tuple(p, &n->a, true);
            if (!st) st = end_tag(p);
        } else if (!st) {
            static const char *const ends[] = {"endset", NULL};
            if (jp_is_op(p, "|"))
                st = moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: filtered block set is not supported", t->line);
            if (!st && n->c->kind != JN_NAME) st = jp_syntax_err(jp_peek(p), "'='");
            if (!st) st = end_tag(p);
            if (!st) st = parse_body(p, &n->body, ends, "set", t, &ended);
            if (!st) st = end_tag(p);
        }
    } else if (jp_tok_is(t, JT_NAME, "macro")) {
        static const char *const ends[] = {"endmacro", NULL};
        const struct jtok *name = jp_next(p);
        if (name->kind != JT_NAME) return jp_syntax_err(name, "a macro name");
        if (!(n = jp_node_new(JN_MACRO, t)) || !(n->str = jp_tok_strdup(name))) {
            jnode_free(n);
            return jp_nomem();
        }
        st = jp_expect_op(p, "(");
        while (!st && !jp_is_op(p, ")")) {
            if (n->kwargs.n) st = jp_expect_op(p, ",");
            const struct jtok *a = st ? NULL : jp_next(p);
            if (!st && a->kind != JT_NAME) st = jp_syntax_err(a, "a parameter name");
            struct jnode *param = NULL;
            if (!st && (!(param = jp_node_new(JN_KWARG, a)) || !(param->str = jp_tok_strdup(a)))) {
                jnode_free(param);
                st = jp_nomem();
            }
            if (!st && jp_is_op(p, "=")) {
                jp_next(p);
                st = jp_parse_expr(p, &param->a);
            }
            if (!st) st = jp_list_push(&n->kwargs, param);
            else jnode_free(param);
        }
        if (!st) {
            jp_next(p);
            st = end_tag(p);
        }
        if (!st) {
            int loops = p->loops;
            p->loops = 0; /* Python compiles a macro as a function: no enclosing loop */
            st = parse_body(p, &n->body, ends, "macro", t, &ended);
            p->loops = loops;
        }
        if (!st) st = end_tag(p);
    } else if (jp_tok_is(t, JT_NAME, "break") || jp_tok_is(t, JT_NAME, "continue")) {
        if (!p->loops)
            return moe_fail(MOE_ERR_FORMAT, "chat template line %d column %d: syntax error: '%s' outside loop",
                            t->line, t->col, t->s[0] == 'b' ? "break" : "continue");
        if (!(n = jp_node_new(t->s[0] == 'b' ? JN_BREAK : JN_CONTINUE, t))) return jp_nomem();
        st = end_tag(p);
    } else if (jp_tok_is(t, JT_NAME, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        st = end_tag(p);
        if (!st) st = parse_body(p, body, ends, "generation", t, &ended);
        if (!st) st = end_tag(p);
        return st;
    } else {
        static const char *const unsupported[] = {"extends", "block", "include", "import", "from",
                                                  "call", "filter", "with", "autoescape", "do",
                                                  "trans", "pluralize", "print", NULL};
        for (size_t i = 0; unsupported[i]; i++)
            if (jp_tok_is(t, JT_NAME, unsupported[i]))
                return moe_fail(MOE_ERR_UNSUPPORTED, "chat template line %d: the '%s' tag is not supported",
                                t->line, unsupported[i]);
        char buf[64];
        return moe_fail(MOE_ERR_FORMAT, "chat template line %d column %d: syntax error: unknown tag %s",
                        t->line, t->col, jp_tok_desc(t, buf, sizeof buf));
    }
    if (st) {
        jnode_free(n);
        return st;
    }
    return jp_list_push(body, n);
}

/* Parses nodes into body until a {% <end> %} tag with end in ends (NULL-
 * terminated; ends NULL: until end of template).  Consumes "{% end" and
 * leaves the rest of the tag for the caller; *ended names the end tag. */
static enum moe_status parse_body(struct jparser *p, struct jlist *body, const char *const *ends,
                                  const char *what, const struct jtok *opened, const char **ended)
{
    if (++p->depth > MAX_PARSE_DEPTH) {
        p->depth--;
        return moe_fail(MOE_ERR_FORMAT, "chat template line %d: blocks nested too deeply", opened ? opened->line : 1);
    }
    enum moe_status st = MOE_OK;
    for (;;) {
        const struct jtok *t = jp_peek(p);
        if (t->kind == JT_EOF) {
            if (ends) {
                const char *want = ends[0];
                for (size_t i = 0; ends[i]; i++)
                    if (!strncmp(ends[i], "end", 3)) want = ends[i];
                st = moe_fail(MOE_ERR_FORMAT, "chat template line %d: syntax error: unexpected end of template, "
                              "the '%s' tag opened on line %d is not closed (expected '%s')",
                              t->line, what, opened->line, want);
            }
            break;
        }
        if (t->kind == JT_TEXT) {
            jp_next(p);
            struct jnode *n = jp_node_new(JN_TEXT, t);
            if (!n || !(n->str = malloc(t->len + 1))) {
                jnode_free(n);
                st = jp_nomem();
                break;
            }
            memcpy(n->str, t->s, t->len);
            n->str[t->len] = '\0';
            n->len = t->len;
            if ((st = jp_list_push(body, n))) break;
        } else if (t->kind == JT_VAR_BEGIN) {
            jp_next(p);
            struct jnode *n = jp_node_new(JN_OUTPUT, t);
            if (!n) {
                st = jp_nomem();
                break;
            }
            st = jp_parse_tuple(p, &n->a, true);
            if (!st) st = jp_expect_kind(p, JT_VAR_END, "end of print statement '}}'");
            if (!st) st = jp_list_push(body, n);
            else jnode_free(n);
            if (st) break;
        } else if (t->kind == JT_BLOCK_BEGIN) {
            const struct jtok *name = jp_peek2(p);
            bool is_end = false;
            for (size_t i = 0; ends && ends[i]; i++) {
                if (jp_tok_is(name, JT_NAME, ends[i])) {
                    *ended = ends[i];
                    is_end = true;
                }
            }
            if (is_end) {
                jp_next(p);
                jp_next(p);
                break;
            }
            if (name->kind == JT_NAME && name->len > 3 && !memcmp(name->s, "end", 3)) {
                char buf[64];
                st = moe_fail(MOE_ERR_FORMAT, "chat template line %d column %d: syntax error: unexpected %s%s%s",
                              name->line, name->col, jp_tok_desc(name, buf, sizeof buf),
                              what ? " inside " : "", what ? what : "");
                break;
            }
            if ((st = parse_statement(p, body))) break;
        } else {
            st = jp_syntax_err(t, "template text or a tag");
            break;
        }
    }
    p->depth--;
    return st;
}

enum moe_status jinja_parse(const char *src, struct jtemplate *tpl)
{
    memset(tpl, 0, sizeof *tpl);
    struct jparser p = {0};
    MOE_TRY(jinja_lex(src, &p.toks));
    const char *ended = NULL;
    enum moe_status st = parse_body(&p, &tpl->body, NULL, NULL, NULL, &ended);
    jinja_tokens_free(&p.toks);
    if (st) jinja_free(tpl);
    return st;
}

void jinja_free(struct jtemplate *tpl)
{
    jp_list_free(&tpl->body);
}
