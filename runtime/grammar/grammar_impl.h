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

struct moe_grammar {
    struct g_elem *e;      /* (n_e) */
    int32_t n_e;
    int32_t *rule_start;   /* (n_rules) first element of each rule */
    char **rule_name;      /* (n_rules) for messages; helper rules are "name_N" */
    int32_t n_rules;
    int32_t root;
};

static inline bool g_is_char(uint32_t t) { return t == G_CHAR || t == G_CHAR_NOT || t == G_ANY; }
