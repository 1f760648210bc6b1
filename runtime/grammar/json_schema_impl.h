/* json_schema_impl.h - what the JSON Schema compiler's files share: the
 * growing text buffer, the compiler's state (rules so far, the JSON pointer
 * of the schema being compiled, the $ref targets met), and the pieces
 * json_schema_str.c and json_schema_num.c write.
 *
 * A schema becomes one rule "sN ::= body"; a body is written into a buffer
 * of its own while the subschemas it uses become rules of their own, so
 * compiling recurses over the schema and appends each finished rule. */
#pragma once

#include <stdbool.h>
#include <string.h>

#include "runtime/grammar/json_schema.h"

struct jbuf {
    char *p;
    size_t n, cap;
    bool nomem;   /* an append failed; the buffer is unusable */
};

void jbuf_put(struct jbuf *b, const char *s, size_t n);
void jbuf_printf(struct jbuf *b, const char *fmt, ...) MOE_PRINTF(2, 3);
static inline void jbuf_str(struct jbuf *b, const char *s) { jbuf_put(b, s, strlen(s)); }
/* A grammar literal "..." matching the UTF-8 bytes s[0..n). */
void jbuf_lit(struct jbuf *b, const char *s, size_t n);
/* A grammar literal of the JSON string that holds name. */
void jbuf_key(struct jbuf *b, const char *name);
/* A grammar class member for code point cp (an escape when not plain). */
void jbuf_class_cp(struct jbuf *b, uint32_t cp);

struct jsc_ref {
    char *ptr;      /* the $ref string */
    int rule;
};

struct jsc {
    const json_t *root;
    struct jbuf out;          /* the finished rules */
    int n_rules;
    struct jsc_ref *refs;
    int n_refs, cap_refs;
    char path[1024];          /* JSON pointer of the schema being compiled */
    size_t path_len;
    int depth;
    bool formats_written;     /* the format rules are in out */
    bool keytail_written;     /* jkeytail is in out */
};

/* Where c is, for messages: the pointer, or "the root". */
const char *jsc_where(const struct jsc *c);
/* Refuses keyword kw at the current place (the one-line message of
 * json_schema.h). */
enum moe_status jsc_unsupported(const struct jsc *c, const char *kw);
/* A supported keyword used in a way the grammar cannot express. */
enum moe_status jsc_fail(const struct jsc *c, const char *kw, const char *fmt, ...) MOE_PRINTF(3, 4);
/* A new rule id (its name is "s<id>"). */
MOE_MUST_USE enum moe_status jsc_new_rule(struct jsc *c, int *id);
/* Appends "s<id> ::= body" to the grammar. */
MOE_MUST_USE enum moe_status jsc_emit_rule(struct jsc *c, int id, const struct jbuf *body);

/* The place: push a segment (or an array index) onto the JSON pointer,
 * returning the length to pop back to. */
size_t jsc_path_push(struct jsc *c, const char *seg);
size_t jsc_path_push_index(struct jsc *c, size_t i);
void jsc_path_pop(struct jsc *c, size_t at);
/* The rule of subschema s at the place key (and index i when not -1). */
MOE_MUST_USE enum moe_status jsc_sub_rule(struct jsc *c, const json_t *s, const char *key, long i, int *rule);
/* The object and array branches of s (json_schema_obj.c). */
MOE_MUST_USE enum moe_status jsc_object(struct jsc *c, const json_t *s, struct jbuf *b);
MOE_MUST_USE enum moe_status jsc_array(struct jsc *c, const json_t *s, struct jbuf *b);
/* The string branch of schema s (type string): minLength/maxLength,
 * format, pattern (json_schema_str.c).  Writes an expression into b. */
MOE_MUST_USE enum moe_status jsc_string(struct jsc *c, const json_t *s, struct jbuf *b);
/* An object key that is none of names[0..n) (additionalProperties). */
MOE_MUST_USE enum moe_status jsc_other_key(struct jsc *c, const char *const *names, size_t n, struct jbuf *b);
/* The number or integer branch of s: minimum/maximum and their exclusive
 * forms (json_schema_num.c). */
MOE_MUST_USE enum moe_status jsc_number(struct jsc *c, const json_t *s, bool integer, struct jbuf *b);
/* A grammar expression for exactly the JSON value v (enum, const). */
MOE_MUST_USE enum moe_status jsc_literal(struct jsc *c, const json_t *v, struct jbuf *b);
