/* grammar_impl.h - the compiled form shared by the parser and the
 * recognizer.
 *
 * A grammar is one array of elements.  Rule r's alternatives start at
 * rule_start[r]; each alternative is a sequence of elements ended by
 * G_ALT (another alternative follows) or G_END (the last).  A character
 * element (G_CHAR, G_CHAR_NOT, G_ANY) is followed by the rest of its class:
 * G_RANGE_HI (upper end of the range before) and G_CHAR_ALT (another
 * code point or range of the same class). */
#pragma once

#include "runtime/grammar/grammar.h"

enum g_type {
    G_END,       /* end of the rule */
    G_ALT,       /* end of an alternative */
    G_REF,       /* value: a rule */
    G_CHAR,      /* value: a code point (a class begins) */
    G_CHAR_NOT,  /* value: a code point (a negated class begins) */
    G_ANY,       /* any code point */
    G_RANGE_HI,  /* value: upper end of the range that ends before */
    G_CHAR_ALT,  /* value: another code point of the class */
};

struct g_elem {
    uint32_t type;
    uint32_t value;
};

/* The tokens a stack whose top nodes continue at key[0..n_key) (the top
 * first; key[n_key-1] is -1 when the stack ends there, MOE_GM_OUTSIDE when
 * it goes on below) accepts whatever lies below them (acc, a bitmap of V),
 * and those it may accept depending on what lies below (unc: tokens that
 * read past the last of those nodes). */
struct g_posmask {
    uint64_t hash;
    int32_t *key;
    int n_key;
    uint32_t *acc;
    int32_t *unc;
    int32_t n_unc;
};

struct moe_grammar {
    struct g_elem *e;      /* (n_e) */
    int32_t n_e;
    int32_t *rule_start;   /* (n_rules) first element of each rule */
    char **rule_name;      /* (n_rules) for messages; helper rules are "name_N" */
    int32_t n_rules;
    int32_t root;
    /* per-position token sets, filled on first use for one vocabulary
     * (grammar_mask.c); masks of one grammar come from one thread at a time */
    const struct moe_grammar_vocab *pm_vocab;
    struct g_posmask *pm;   /* (n_pm) */
    int32_t n_pm, cap_pm;
};

static inline bool g_is_char(uint32_t t) { return t == G_CHAR || t == G_CHAR_NOT || t == G_ANY; }

/* Frees the per-position token sets (grammar_mask.c). */
void moe_gm_posmask_clear(struct moe_grammar *g);
