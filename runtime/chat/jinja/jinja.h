/* jinja.h - internal API of the chat-template interpreter: a small Jinja2
 * subset, lexer -> parser (AST) -> evaluator.
 *
 * It mirrors the environment transformers builds in
 * utils/chat_template_utils.py (_compile_jinja_template):
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[loopcontrols]) with the tojson filter replaced by
 * json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=), and the
 * globals raise_exception, strftime_now, dict and namespace.  Values follow
 * Python: printing goes through str() (None, True, 1.0, ['a']), `/` is true
 * division, strings are indexed by code point, and an undefined name is
 * Jinja's default Undefined (prints "", is falsy, iterates as empty; any
 * other use, including attribute access on it, is an error).
 *
 * Files: jinja_lex.c (source -> tokens, whitespace control),
 * jinja_parse_expr.c + jinja_parse.c (tokens -> AST: expressions,
 * statements), jinja_value.c (values, str/repr/tojson, comparison, UTF-8
 * helpers), jinja_eval.c (statements and expressions), jinja_builtins.c
 * (lookups, methods, global functions), jinja_filters.c (filters, tests),
 * jinja_strings.c (Python str helpers).
 *
 * Errors carry "chat template line L[ column C]: ..." and the status:
 * MOE_ERR_FORMAT for syntax errors and for failures while rendering
 * (raise_exception, undefined values used, type errors), MOE_ERR_UNSUPPORTED
 * for Jinja constructs this interpreter does not implement, MOE_ERR_NOMEM. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "runtime/core/status.h"

/* ---- lexer ---- */

enum jtok_kind {
    JT_EOF,
    JT_TEXT,        /* template data between tags: s/len slice of the source */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,
    JT_STRING,      /* str: owned, escapes decoded, len bytes */
    JT_INT,
    JT_FLOAT,
    JT_OP,          /* s/len: the operator text, e.g. "==", "(", "|" */
};

struct jtok {
    enum jtok_kind kind;
    const char *s; /* borrowed from the source (TEXT, NAME, OP) */
    size_t len;
    char *str;     /* JT_STRING: owned decoded bytes */
    int64_t ival;
    double fval;
    int line, col; /* 1-based */
};

struct jtoks {
    struct jtok *v;
    size_t n, cap;
};

/* Tokenizes src (NUL-terminated).  On success *out owns its strings; free
 * with jinja_tokens_free (safe on a zeroed struct and twice). */
MOE_MUST_USE enum moe_status jinja_lex(const char *src, struct jtoks *out);
void jinja_tokens_free(struct jtoks *t);

/* ---- AST ---- */

enum jn_kind {
    /* statements */
    JN_TEXT,     /* str/len: literal output */
    JN_OUTPUT,   /* a: expression to print */
    JN_IF,       /* a: condition; body; orelse (an elif is a nested JN_IF) */
    JN_FOR,      /* args: target names; a: iterable; b: filter or NULL; body; orelse */
    JN_SET,      /* c: target (NAME, GETATTR ns.x, or TUPLE of NAMEs); a: value, or NULL
                    with body for {% set x %}...{% endset %} */
    JN_MACRO,    /* str: name; kwargs: JN_KWARG params (a: default or NULL); body */
    JN_BREAK,
    JN_CONTINUE,
    /* expressions */
    JN_CONST,    /* cval: owned json value (json null for none) */
    JN_NAME,     /* str */
    JN_GETATTR,  /* a.str */
    JN_GETITEM,  /* a[b] */
    JN_SLICE,    /* a[args0:args1:args2], entries may be NULL */
    JN_CALL,     /* a(args, kwargs) */
    JN_FILTER,   /* a | str(args, kwargs) */
    JN_TEST,     /* a is str(args); op = 1 for "is not" */
    JN_UNARY,    /* op a: '-' '+' or 'n' (not) */
    JN_BINARY,   /* a op b, op: JOP_* */
    JN_COND,     /* a if b else c (c may be NULL) */
    JN_LIST,     /* args */
    JN_TUPLE,    /* args */
    JN_DICT,     /* args: key, value, key, value, ... */
    JN_KWARG,    /* str = a */
};

enum jop {
    JOP_ADD = 1, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
    JOP_AND, JOP_OR, JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
};

struct jnode;
struct jlist {
    struct jnode **v;
    size_t n, cap;
};

struct jnode {
    enum jn_kind kind;
    int line, col;
    int op;
    char *str;       /* owned */
    size_t len;      /* JN_TEXT length */
    json_t *cval;    /* JN_CONST, owned */
    struct jnode *a, *b, *c;
    struct jlist args, kwargs, body, orelse;
};

struct jtemplate {
    struct jlist body;
};

/* Parses src into *tpl (zeroed on failure).  Free with jinja_free. */
MOE_MUST_USE enum moe_status jinja_parse(const char *src, struct jtemplate *tpl);
void jinja_free(struct jtemplate *tpl);
void jnode_free(struct jnode *n);

/* ---- values ---- */

enum jv_kind {
    JV_UNDEF, /* j: optional json string, the reason ("'x' is undefined") */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,   /* j: json string (bytes may hold any UTF-8); b: markup (the
                 result of |safe or |escape: `markup + str` HTML-escapes the
                 str, as markupsafe.Markup does) */
    JV_LIST,  /* j: json array (tuples too) */
    JV_DICT,  /* j: json object, insertion order */
    JV_NS,    /* j: json object, attributes assignable with {% set ns.x = %}; not a
                 container (no len, iteration, `in` or JSON: jinja2's Namespace
                 has only attributes) and equal only to itself */
    JV_LOOP,  /* j: json object of the loop variables; .cycle() is a method */
    JV_GEN,   /* j: json array; what map/select/reject/selectattr/rejectattr/
                 unique/items return: a Python generator, so always truthy,
                 iterable, but with no len(), not JSON-serializable, not
                 printable.  Python runs it lazily, so an error inside (a
                 non-iterable input) shows only when it is consumed: then j
                 is a json string, that error's message (jinja_gen_check). */
    JV_MACRO, /* macro: borrowed AST node */
    JV_FUNC,  /* fn: enum jfunc */
    JV_METHOD, /* a bound method looked up but not (yet) called, as Python's
                  getattr gives one: `d['items']` on a dict without that key,
                  `s.upper`.  Truthy, callable, not printable (Python prints
                  its address), no len(), not JSON.  j: a marker object (see
                  jv_method) holding the receiver and the method's name, so a
                  method survives being stored in a list or namespace. */
};

enum jfunc { JF_RANGE = 1, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME };

/* A value holds one reference on j (if non-NULL); jv_free drops it. */
struct jv {
    enum jv_kind k;
    bool b;
    int64_t i;
    double f;
    int fn;
    const struct jnode *macro;
    json_t *j;
};

static inline struct jv jv_undef(void) { return (struct jv){.k = JV_UNDEF}; }
static inline struct jv jv_none(void) { return (struct jv){.k = JV_NONE}; }
static inline struct jv jv_bool(bool b) { return (struct jv){.k = JV_BOOL, .b = b}; }
static inline struct jv jv_int(int64_t i) { return (struct jv){.k = JV_INT, .i = i}; }
static inline struct jv jv_float(double f) { return (struct jv){.k = JV_FLOAT, .f = f}; }
/* Takes ownership of j (NULL j means allocation failed: check with jv_oom). */
static inline struct jv jv_wrap(enum jv_kind k, json_t *j) { return (struct jv){.k = k, .j = j}; }

void jv_free(struct jv *v);
struct jv jv_copy(struct jv v); /* new reference */
bool jv_oom(struct jv v);       /* a STR/LIST/DICT/NS/LOOP whose json is missing */
struct jv jv_str(const char *s, size_t n); /* new string value (j NULL on OOM) */
struct jv jv_from_json(json_t *j);         /* borrowed j: new reference */
json_t *jv_to_json(struct jv v);           /* new reference; NULL on OOM.  An undefined
                                              becomes a marker object that jv_from_json
                                              turns back into it (Python keeps Undefined
                                              objects in lists and dicts) */
const char *jv_type_name(struct jv v);     /* Python's: 'str', 'int', 'dict', ... */
/* recv.name as a JV_METHOD (j NULL on OOM); recv is borrowed. */
struct jv jv_method(struct jv recv, const char *name);
struct jv jv_method_receiver(struct jv m); /* new reference */
const char *jv_method_name(struct jv m);   /* borrowed from m */
bool jv_truthy(struct jv v);
bool jv_equal(struct jv a, struct jv b);
bool jv_is_str(struct jv v);
const char *jv_sdata(struct jv v); /* JV_STR bytes */
size_t jv_slen(struct jv v);

/* A growable byte buffer with a hard size limit. */
struct jbuf {
    char *p;
    size_t n, cap, limit; /* limit 0 = unlimited */
};
MOE_MUST_USE enum moe_status jbuf_add(struct jbuf *b, const char *s, size_t n);
MOE_MUST_USE enum moe_status jbuf_addc(struct jbuf *b, char c);
void jbuf_free(struct jbuf *b);

/* str(v) appended to b (Python's str: None, True, 1.0, ['a', 1]). */
MOE_MUST_USE enum moe_status jv_str_append(struct jbuf *b, struct jv v);
/* repr(v) appended to b: as str() but a string is quoted ('a', "it's"). */
MOE_MUST_USE enum moe_status jv_repr_append(struct jbuf *b, struct jv v);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys): indent < 0
 * is None; item_sep/key_sep NULL use Python's defaults for that indent. */
MOE_MUST_USE enum moe_status jv_tojson_append(struct jbuf *b, json_t *v, int indent,
                                              const char *item_sep, const char *key_sep,
                                              bool sort_keys);
/* Python float repr ("1.0", "1e-05", "0.30000000000000004"). */
void jv_float_repr(double f, char out[40]);

/* UTF-8: number of code points, and byte offset of code point index i
 * (clamped to n). */
size_t ju_cp_count(const char *s, size_t n);
size_t ju_cp_offset(const char *s, size_t n, size_t i);
/* Decodes one code point at s (n > 0 bytes); returns its byte length. */
size_t ju_decode(const char *s, size_t n, int32_t *cp);
bool ju_isspace(int32_t cp);

/* ---- evaluator ---- */

struct jinja_limits {
    size_t max_output;    /* bytes of rendered text */
    int max_depth;        /* nested macro calls and statement nesting */
    uint64_t max_steps;   /* loop iterations and macro calls, all together */
};

struct jscope;

struct jctx {
    struct jbuf out;
    struct jscope *root; /* globals, then top-level variables */
    struct jscope *cur;
    struct jinja_limits lim;
    int depth;
    uint64_t steps;
    int ctrl;        /* pending loop control: 0, 'b' (break), 'c' (continue) */
    time_t now;      /* strftime_now's clock (seconds since the epoch, local time) */
};

/* Renders tpl with the variables of vars (a json object, borrowed; each
 * key becomes a global).  *out is new memory (free()), NUL-terminated. */
MOE_MUST_USE enum moe_status jinja_render(const struct jtemplate *tpl, json_t *vars,
                                          const struct jinja_limits *lim, time_t now,
                                          char **out);

/* Used between jinja_eval.c and jinja_builtins.c. */
MOE_MUST_USE enum moe_status jinja_eval(struct jctx *cx, const struct jnode *n, struct jv *out);
MOE_MUST_USE enum moe_status jinja_call_macro(struct jctx *cx, const struct jnode *call,
                                              const struct jnode *macro, struct jv *args,
                                              size_t nargs, char **kwnames, struct jv *kwvals,
                                              size_t nkw, struct jv *out);
MOE_MUST_USE enum moe_status jinja_filter(struct jctx *cx, const struct jnode *n, struct jv *out);
MOE_MUST_USE enum moe_status jinja_test(struct jctx *cx, const struct jnode *n, struct jv *out);
/* Calls a method (obj.name(args)) or a global function value. */
MOE_MUST_USE enum moe_status jinja_call(struct jctx *cx, const struct jnode *n, struct jv *out);
/* Attribute (a.name) and item (a[key]) lookup with Jinja's fallbacks. */
MOE_MUST_USE enum moe_status jinja_getattr(const struct jnode *at, struct jv obj, const char *name,
                                           struct jv *out);
MOE_MUST_USE enum moe_status jinja_getitem(const struct jnode *at, struct jv obj, struct jv key,
                                           struct jv *out);
/* Generators: the deferred error of a JV_GEN whose computation failed
 * (MOE_ERR_FORMAT), else MOE_OK.  Called where a generator is consumed. */
MOE_MUST_USE enum moe_status jinja_gen_check(struct jv v);
/* Wraps the result of computing a generator: st MOE_OK gives the list as a
 * JV_GEN; MOE_ERR_FORMAT gives a JV_GEN carrying the error for later;
 * other failures are returned. */
MOE_MUST_USE enum moe_status jinja_gen_result(enum moe_status st, json_t *list, struct jv *out);
/* markupsafe.escape(str(v)): & < > " ' as &amp; &lt; &gt; &#34; &#39;;
 * a markup string is returned as is.  The result is markup. */
MOE_MUST_USE enum moe_status jinja_html_escape(struct jv v, struct jv *out);
/* Error helpers: "chat template line L: <msg>". */
enum moe_status jinja_err(enum moe_status s, const struct jnode *at, const char *fmt, ...)
    MOE_PRINTF(3, 4);
/* The error for using an undefined value. */
enum moe_status jinja_undef_err(const struct jnode *at, struct jv v);
