/* jinja_parse_impl.h - shared by the two halves of the template parser:
 * jinja_parse_expr.c (token helpers, expressions) and jinja_parse.c
 * (statements, block structure).  Not part of any public interface. */
#pragma once

#include "runtime/chat/jinja/jinja.h"

#define MAX_PARSE_DEPTH 200 /* nested expressions and blocks */

struct jparser {
    struct jtoks toks;
    size_t i;  /* current token */
    int depth; /* recursion depth, bounded by MAX_PARSE_DEPTH */
    int loops; /* for-loop bodies around the current statement (a macro body starts at 0) */
};

const struct jtok *jp_peek(struct jparser *p);
const struct jtok *jp_peek2(struct jparser *p); /* the token after the current one */
const struct jtok *jp_next(struct jparser *p);  /* consumes; stays on EOF */
bool jp_tok_is(const struct jtok *t, enum jtok_kind k, const char *s);
bool jp_is_op(struct jparser *p, const char *s);
bool jp_is_name(struct jparser *p, const char *s);
const char *jp_tok_desc(const struct jtok *t, char *buf, size_t n);
/* "line L column C: syntax error: expected <expected>, got <token>" */
enum moe_status jp_syntax_err(const struct jtok *t, const char *expected);
enum moe_status jp_nomem(void);
MOE_MUST_USE enum moe_status jp_expect_op(struct jparser *p, const char *s);
MOE_MUST_USE enum moe_status jp_expect_kind(struct jparser *p, enum jtok_kind k, const char *what);
struct jnode *jp_node_new(enum jn_kind kind, const struct jtok *t); /* NULL on OOM */
char *jp_tok_strdup(const struct jtok *t);                          /* NULL on OOM */
/* Appends n, taking ownership (freed on failure). */
MOE_MUST_USE enum moe_status jp_list_push(struct jlist *l, struct jnode *n);
void jp_list_free(struct jlist *l);

/* A full expression (with `x if c else y`); *out is new on success. */
MOE_MUST_USE enum moe_status jp_parse_expr(struct jparser *p, struct jnode **out);
/* expr[, expr ...] as a JN_TUPLE when there is a comma; condexpr false
 * parses each item without `if` (for-loop iterables, where `if` filters). */
MOE_MUST_USE enum moe_status jp_parse_tuple(struct jparser *p, struct jnode **out, bool condexpr);
