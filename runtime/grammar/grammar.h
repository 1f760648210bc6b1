/* grammar.h - grammar-constrained decoding: a GBNF-style grammar, an
 * incremental recognizer over UTF-8 bytes, and per-step token masks.
 *
 * The syntax is in docs/grammar.md (rules `name ::= ...`, `|`, groups,
 * `* + ? {m} {m,} {m,n}`, string literals, character classes over code
 * points, `.`, `#` comments; `root` is the start rule).  Compiling rewrites
 * groups and repetitions into helper rules (x* becomes R ::= x R | empty)
 * and refuses left recursion, so the recognizer always terminates.
 *
 * The recognizer is a set of pushdown stacks, as llama.cpp's GBNF matcher:
 * each stack is a path through the rules whose top is a character class;
 * a code point advances every stack whose top matches it and drops the
 * others.  Stacks are persistent linked lists of nodes (position to
 * continue at, node below), and a rule reference in tail position reuses
 * the node below, so a repetition does not deepen the stack.  A state also
 * holds the bytes of an incomplete UTF-8 character, checked against the
 * code-point range they can still complete to.  Memory is bounded: more
 * than MOE_GRAMMAR_MAX_STACKS stacks at once or MOE_GRAMMAR_MAX_NODES
 * nodes is an error naming the limit (an ambiguous grammar), never a blow-up.
 *
 * Token masks walk a trie of the vocabulary's byte strings, advancing a
 * copy of the state one byte per trie edge, so a prefix shared by many
 * tokens is checked once.  Special and added tokens are not in the trie
 * (never allowed inside the grammar); the caller allows end-of-sequence
 * where moe_grammar_state_accepting says so.  Each state keeps a small
 * cache of the masks of the states it has been in (keyed by its stacks);
 * a copy of a state starts with a copy of its source's.
 *
 * Per-position token sets: keyed by a stack's top 8 nodes, the tokens it
 * accepts whatever lies below them, and the few that read past them
 * (checked against the whole state), computed on first use and kept in the
 * grammar for one vocabulary, so a mask that misses the state's cache ORs
 * bitmaps and checks those few tokens instead of walking the trie
 * (docs/grammar.md, "Token masks").
 *
 * Ownership: a vocabulary is read-only once built and may be shared; a
 * compiled grammar may be shared by requests, but its masks (which fill
 * its per-position sets) must come from one thread at a time (the engine
 * thread); a state is one request's. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_GRAMMAR_MAX_SOURCE (1 << 20)  /* bytes of grammar text */
#define MOE_GRAMMAR_MAX_ELEMS (1 << 20)   /* compiled elements (repetitions expanded) */
#define MOE_GRAMMAR_MAX_REPEAT 1000       /* the largest m or n in {m,n} */
#define MOE_GRAMMAR_MAX_STACKS 4096       /* stacks alive in one state */
#define MOE_GRAMMAR_MAX_NODES (1 << 20)   /* stack nodes of one state and its mask walk */
#define MOE_GRAMMAR_MAX_TOKEN 1024        /* bytes of one vocabulary token */
#define MOE_GRAMMAR_MASK_CACHE 16         /* masks a state remembers */

struct moe_grammar; /* compiled, read-only */

/* Compiles src[0..len) (UTF-8).  On failure *out is NULL and the message
 * reads "grammar: line L, column C: what" (or names the rule, for left
 * recursion and undefined references).  *out is new memory
 * (moe_grammar_free). */
MOE_MUST_USE enum moe_status moe_grammar_parse(const char *src, size_t len, struct moe_grammar **out);
/* The built-in grammar of response_format json_object: one JSON object
 * (any JSON values inside), whitespace limited as docs/grammar.md says. */
MOE_MUST_USE enum moe_status moe_grammar_json_object(struct moe_grammar **out);
extern const char moe_grammar_json_object_source[];
void moe_grammar_free(struct moe_grammar *g); /* NULL is fine */
int moe_grammar_n_rules(const struct moe_grammar *g);

/* The token byte strings a mask is computed over (the trie).  Built once
 * per tokenizer; read-only afterwards. */
struct moe_grammar_vocab {
    int V;                  /* ids 0..V-1 */
    uint32_t *off;          /* (V+1) bytes of id i: bytes[off[i] .. off[i+1]) */
    uint8_t *bytes;
    uint8_t *in_trie;       /* (V) 1 when the id may appear inside a grammar */
    /* trie: node 0 is the root; node n's children are child[first[n] ..
     * first[n] + n_child[n]) with edge bytes edge[...] in increasing order;
     * the ids whose bytes end at n are ids[tok_first[n] .. tok_first[n+1]),
     * those at n or below it ids[tok_first[n] .. sub_end[n]) */
    int32_t n_nodes;
    int32_t *first, *n_child, *child, *tok_first, *sub_end, *ids;
    uint8_t *edge;
    int max_len;            /* longest token in the trie, bytes */
};

/* Builds the vocabulary from V byte strings: bytes of id i at
 * bytes[off[i] .. off[i+1]), in_trie[i] whether it may be used (0 for
 * special tokens and empty strings).  Copies what it needs. */
MOE_MUST_USE enum moe_status moe_grammar_vocab_init(struct moe_grammar_vocab *gv, int V,
                                                     const uint32_t *off, const uint8_t *bytes,
                                                     const uint8_t *in_trie);
void moe_grammar_vocab_free(struct moe_grammar_vocab *gv); /* safe zeroed and twice */
struct moe_tokenizer;
/* The same from a tokenizer (runtime/text) for a model of V ids: each id's
 * moe_tokenizer_token_bytes; ids beyond the tokenizer, special and added
 * tokens are left out. */
MOE_MUST_USE enum moe_status moe_grammar_vocab_from_tokenizer(struct moe_grammar_vocab *gv,
                                                               const struct moe_tokenizer *tok, int V);

/* One request's recognizer state. */
struct moe_grammar_node {
    int32_t pos;            /* element to continue at */
    int32_t up;             /* node below, -1: the bottom */
};
struct moe_gm_utf8 {
    uint32_t value;         /* its bits so far */
    int need;               /* continuation bytes still to come (0: none) */
    int len;                /* continuation bytes in all */
};
struct moe_grammar_mask_entry {
    uint64_t hash;
    int32_t *key;           /* (n_key) the state, serialised */
    int n_key;
    uint32_t *bits;         /* (n_words) NULL: an empty entry */
    int n_words;            /* ceil(V/32) of the vocabulary it was made for */
    uint64_t used;          /* LRU clock */
};
struct moe_grammar_state {
    const struct moe_grammar *g;  /* borrowed */
    struct moe_grammar_node *nodes;  /* (cap_nodes) arena; tops point into it */
    int32_t n_nodes, cap_nodes;
    int32_t *tops;          /* (n_tops) top node of each stack; -1: an empty stack (the end) */
    int n_tops, cap_tops;
    struct moe_gm_utf8 utf8; /* an incomplete UTF-8 character, if any */
    /* scratch of advances and the mask walk */
    int32_t *stk;           /* tops of each trie depth, stack-like */
    int n_stk, cap_stk;
    int32_t *key;
    int cap_key;
    struct moe_grammar_mask_entry cache[MOE_GRAMMAR_MASK_CACHE];
    uint64_t clock;
    uint64_t n_mask_hits, n_mask_misses;
};

/* At the start of g's root rule.  Fails only for memory. */
MOE_MUST_USE enum moe_status moe_grammar_state_init(struct moe_grammar_state *st, const struct moe_grammar *g);
void moe_grammar_state_free(struct moe_grammar_state *st); /* safe zeroed and twice */
/* dst (initialised or zeroed) becomes a copy of src, its cached masks
 * included (copied: each state owns its cache); dst's mask counters start
 * at zero.  On failure (memory only) dst is left zeroed. */
MOE_MUST_USE enum moe_status moe_grammar_state_copy(struct moe_grammar_state *dst,
                                                     const struct moe_grammar_state *src);
/* The same without the cached masks (dst's cache empty): for a copy that
 * is only advanced, never asked for a mask. */
MOE_MUST_USE enum moe_status moe_grammar_state_copy_uncached(struct moe_grammar_state *dst,
                                                             const struct moe_grammar_state *src);
/* Advances by bytes b[0..n).  *ok false: the grammar cannot continue with
 * them, and st is unchanged.  Errors: the limits above. */
MOE_MUST_USE enum moe_status moe_grammar_state_advance(struct moe_grammar_state *st, const uint8_t *b,
                                                        size_t n, bool *ok);
/* Advances by token t's bytes in gv.  *ok false: t is outside gv, outside
 * the trie (special tokens, empty strings), or the grammar cannot continue
 * with its bytes; st is then unchanged.  Errors: the limits above. */
MOE_MUST_USE enum moe_status moe_grammar_state_advance_token(struct moe_grammar_state *st,
                                                              const struct moe_grammar_vocab *gv, int32_t t,
                                                              bool *ok);
/* A complete sentence of the grammar ends here. */
bool moe_grammar_state_accepting(const struct moe_grammar_state *st);
/* Some byte could still follow. */
bool moe_grammar_state_can_continue(const struct moe_grammar_state *st);
/* bits (ceil(V/32) words): bit i set when id i's bytes can be consumed
 * from st (ids outside the trie never).  st is not advanced. */
MOE_MUST_USE enum moe_status moe_grammar_mask(struct moe_grammar_state *st,
                                               const struct moe_grammar_vocab *gv, uint32_t *bits);
/* The same by walking the trie from the whole state (no per-position
 * sets, no cache): what moe_grammar_mask does inside a UTF-8 character. */
MOE_MUST_USE enum moe_status moe_grammar_mask_walk(struct moe_grammar_state *st,
                                                    const struct moe_grammar_vocab *gv, uint32_t *bits);
/* The same by checking every id's bytes on a copy of st: the reference the
 * tests compare moe_grammar_mask with. */
MOE_MUST_USE enum moe_status moe_grammar_mask_brute(const struct moe_grammar_state *st,
                                                     const struct moe_grammar_vocab *gv, uint32_t *bits);

#ifdef __cplusplus
}
#endif
