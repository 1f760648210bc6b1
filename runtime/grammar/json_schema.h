/* json_schema.h - a JSON Schema (a subset of draft 2020-12) compiled into
 * a grammar (grammar.h) whose sentences are the JSON documents the schema
 * accepts, written the way the json_object grammar writes JSON (the
 * whitespace between tokens limited the same way).
 *
 * The subset, and what the grammar is stricter about than the schema
 * (object properties in the schema's order, numbers without exponents
 * under a range, ...), are in docs/grammar.md, "JSON Schema".  Every
 * keyword outside the subset is refused, never ignored: the message reads
 * `unsupported JSON Schema keyword "patternProperties" at
 * /properties/a` (the keyword and the JSON pointer of the schema holding
 * it; "at the root" for the top), and a supported keyword used in a way
 * the grammar cannot express exactly names itself and its place the same
 * way (`JSON Schema: "pattern" at /properties/id: ...`). */
#pragma once

#include <jansson.h>
#include <stddef.h>

#include "runtime/core/status.h"
#include "runtime/grammar/grammar.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_JSON_SCHEMA_MAX_DEPTH 64    /* nested schemas, $ref hops included */
#define MOE_JSON_SCHEMA_MAX_RULES 100000 /* rules of the compiled grammar */

/* Flags of moe_json_schema_source. */
#define MOE_JSON_SCHEMA_WS_AROUND 1u /* the document may start and end with whitespace ("ws") */

/* The grammar text (docs/grammar.md syntax) of schema: *src is new memory
 * (free), NUL-terminated, *len its bytes. */
MOE_MUST_USE enum moe_status moe_json_schema_source(const json_t *schema, unsigned flags, char **src,
                                                     size_t *len);
/* The same, compiled (moe_grammar_free). */
MOE_MUST_USE enum moe_status moe_json_schema_grammar(const json_t *schema, struct moe_grammar **out);

#ifdef __cplusplus
}
#endif
