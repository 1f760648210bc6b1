/* grammar_match.h - the recognizer's steps, shared by the committed state
 * (grammar_match.c) and the mask walk (grammar_mask.c).
 *
 * The working list of stack tops is st->stk, used as a stack of lists: a
 * step reads the list stk[from..to) and appends the next one after it
 * (n_stk grows); the caller rolls n_stk and n_nodes back to undo. */
#pragma once

#include "runtime/grammar/grammar_impl.h"

/* The `up` of a stack whose context is unknown (per-position token sets):
 * finishing its alternative leaves a top of this value. */
#define MOE_GM_OUTSIDE (-2)

/* Advances the tops stk[from..to) (to == st->n_stk) by byte b, u being the
 * incomplete character before it (updated).  *ok: some stack survived
 * (the new list is stk[to..n_stk)). */
MOE_MUST_USE enum moe_status moe_gm_step_byte(struct moe_grammar_state *st, struct moe_gm_utf8 *u,
                                               int32_t from, int32_t to, uint8_t b, bool *ok);
/* Advances by a whole code point. */
MOE_MUST_USE enum moe_status moe_gm_step_cp(struct moe_grammar_state *st, int32_t from, int32_t to,
                                             uint32_t cp);
/* Whether some top of stk[from..to) accepts a code point in [lo, hi]. */
bool moe_gm_any_meets(const struct moe_grammar_state *st, int32_t from, int32_t to, uint32_t lo,
                      uint32_t hi);
/* stk = the state's tops (n_stk = n_tops). */
MOE_MUST_USE enum moe_status moe_gm_load_tops(struct moe_grammar_state *st);
