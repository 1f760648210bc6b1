/* jinja_builtins_impl.h - shared by jinja_builtins.c (lookups, calls,
 * methods, global functions), jinja_filters.c (filters, tests) and
 * jinja_strings.c (Python str/list helpers).  Not a public interface. */
#pragma once

#include "runtime/chat/jinja/jinja.h"

#define MAX_ARGS 16

/* Evaluated call arguments: positional, then keyword (names borrowed
 * from the AST). */
struct args {
    struct jv pos[MAX_ARGS];
    size_t npos;
    char *kwn[MAX_ARGS];
    struct jv kwv[MAX_ARGS];
    size_t nkw;
};

MOE_MUST_USE enum moe_status jb_args_eval(struct jctx *cx, const struct jnode *n, struct args *a);
void jb_args_free(struct args *a);
/* Positional i or keyword name (NULL: positional only); NULL if absent. */
struct jv *jb_arg(struct args *a, size_t i, const char *name);

enum moe_status jb_nomem(void);
/* MOE_ERR_FORMAT "<what> must be a string" unless v is a string. */
MOE_MUST_USE enum moe_status jb_need_str(const struct jnode *at, struct jv *v, const char *what);
/* str(v) as a new string value. */
MOE_MUST_USE enum moe_status jb_to_str(struct jv v, struct jv *out);
/* str.strip/lstrip/rstrip (which = 3/1/2); chars NULL or none: whitespace. */
MOE_MUST_USE enum moe_status jb_strip(struct jv s, struct jv *chars, int which, struct jv *out);
/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' Jinja's title filter,
 * 'T' str.title. */
MOE_MUST_USE enum moe_status jb_recase(struct jv s, int mode, struct jv *out);
MOE_MUST_USE enum moe_status jb_replace(const struct jnode *at, struct jv s, struct jv *old, struct jv *new_,
                                        struct jv *count, struct jv *out);
MOE_MUST_USE enum moe_status jb_split(const struct jnode *at, struct jv s, struct jv *sep, struct jv *maxsplit,
                                      struct jv *out);
/* str.startswith/endswith with a string or a list (tuple) of them. */
MOE_MUST_USE enum moe_status jb_affix_any(const struct jnode *at, struct jv s, struct jv *x, bool end,
                                          struct jv *out);
/* list(v) as a new json array: list items, dict keys, string characters;
 * undefined is empty. */
MOE_MUST_USE enum moe_status jb_to_list(const struct jnode *at, struct jv v, json_t **out);
/* dict.items() as a list of [key, value]. */
MOE_MUST_USE enum moe_status jb_dict_items(struct jv d, struct jv *out);
/* Jinja's attribute= arguments (make_attrgetter): "a.b.0" looks up a, then
 * b, then index 0, each as item then attribute; a miss is Undefined. */
MOE_MUST_USE enum moe_status jb_getattr_path(const struct jnode *at, struct jv item, struct jv path, struct jv *out);
/* The join filter: a = (separator, attribute). */
MOE_MUST_USE enum moe_status jb_join(const struct jnode *at, struct jv v, struct args *a, struct jv *out);
