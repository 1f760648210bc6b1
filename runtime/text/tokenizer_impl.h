/* tokenizer_impl.h - private types shared by the tokenizer_*.c files.
 *
 * Pipeline (as in the Rust crate's Tokenizer::encode):
 *   raw text -> added tokens matched on the raw text (non-normalized ones)
 *   -> each remaining piece normalized -> normalized added tokens matched
 *   -> pre-tokenizer splits the rest into words -> BPE per word
 *   -> post-processor adds special ids.
 * Strings are byte ranges into growable buffers; all text is valid UTF-8
 * once past moe_tokenizer_encode's lossy cleanup. */
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/core/status.h"
#include "runtime/text/tokenizer.h"

/* ---- growable byte buffer and string list ---- */
struct tok_buf {
    char *p;
    size_t len, cap;
};
enum moe_status moe_tok_buf_put(struct tok_buf *b, const char *s, size_t n) MOE_MUST_USE;
void moe_tok_buf_free(struct tok_buf *b);

/* A list of strings: item i is buf.p[off[i] .. off[i] + len[i]).  `first`
 * marks a piece that starts at offset 0 of the original input (the
 * Metaspace "first" prepend scheme needs it). */
struct tok_span {
    size_t off, len;
    bool first;
};
struct tok_list {
    struct tok_buf buf;
    struct tok_span *sp;
    size_t n, cap;
};
enum moe_status moe_tok_list_push(struct tok_list *l, const char *s, size_t n,
                                  bool first) MOE_MUST_USE;
void moe_tok_list_clear(struct tok_list *l);
void moe_tok_list_free(struct tok_list *l);

/* ---- UTF-8 ---- */
/* Length of the valid UTF-8 character at s[0..n) (1..4), or 0 if invalid;
 * *bad then gets the length of the maximal invalid subpart (>= 1). */
size_t moe_tok_utf8_char(const unsigned char *s, size_t n, int32_t *cp, size_t *bad);
/* Appends s[0..n) with invalid subparts replaced by U+FFFD; returns whether
 * anything was replaced through *replaced. */
enum moe_status moe_tok_utf8_lossy(struct tok_buf *out, const char *s, size_t n,
                                   bool *replaced) MOE_MUST_USE;
/* Length of the (valid) character starting at s[0]. */
static inline size_t moe_tok_clen(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}
size_t moe_tok_utf8_put(char *out, int32_t cp); /* writes 1..4 bytes */

/* ---- string -> id hash map (open addressing, keys borrowed) ---- */
struct tok_map {
    const char **key;  /* (cap) borrowed key pointers, NULL = empty */
    uint32_t *klen;
    int32_t *val;
    size_t cap, n;     /* cap is a power of two */
};
enum moe_status moe_tok_map_put(struct tok_map *m, const char *k, size_t klen,
                                int32_t v) MOE_MUST_USE;
int32_t moe_tok_map_get(const struct tok_map *m, const char *k, size_t klen); /* -1 if absent */
void moe_tok_map_free(struct tok_map *m);
uint64_t moe_tok_hash(const char *s, size_t n);

/* ---- regex (PCRE2, UTF + UCP, JIT when available) ---- */
struct tok_regex {
    pcre2_code *code;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack; /* grown beyond the default 32 KiB for long words */
};
enum moe_status moe_tok_regex_compile(struct tok_regex *re, const char *pat, size_t len,
                                      bool literal, const char *what) MOE_MUST_USE;
void moe_tok_regex_free(struct tok_regex *re);
/* Finds the next match in s[0..n) at or after *from, with the Rust
 * (Oniguruma find_iter) rule that an empty match right at the end of the
 * previous match is skipped; *last_end starts at SIZE_MAX.  *found is false
 * when there is none.  A matching failure (a PCRE2 resource limit) is an
 * error, never a silent "no match". */
enum moe_status moe_tok_regex_next(struct tok_regex *re, const char *s, size_t n, size_t *from,
                                   size_t *last_end, size_t *ms, size_t *me,
                                   bool *found) MOE_MUST_USE;

/* ---- BPE model (tokenizer_bpe.c) ---- */
struct tok_merge_slot {
    uint64_t pair;  /* (left id << 32) | right id; UINT64_MAX = empty */
    int32_t rank, new_id;
};
struct tok_cache_slot {
    char *word;       /* owned, NULL = empty */
    size_t word_len;
    int32_t *ids;     /* owned */
    size_t n_ids;
};
struct tok_bpe {
    char **vocab;           /* (n_vocab) token strings by id, owned; NULL = hole */
    uint32_t *vocab_len;
    int32_t n_vocab;        /* highest model id + 1 */
    struct tok_map vocab_map;
    struct tok_merge_slot *merges; /* open addressing, cap power of two */
    size_t merges_cap;
    int32_t unk_id;         /* -1 if no unk_token */
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256];  /* <0xXX> ids when byte_fallback, else -1 */
    char *prefix, *suffix;  /* continuing_subword_prefix, end_of_word_suffix */
    struct tok_cache_slot *cache; /* direct-mapped, TOK_CACHE_SLOTS */
};
enum moe_status moe_tok_bpe_load(struct tok_bpe *m, json_t *model) MOE_MUST_USE;
void moe_tok_bpe_free(struct tok_bpe *m);
/* Appends the ids of one pre-tokenized word to *ids. */
enum moe_status moe_tok_bpe_encode(struct tok_bpe *m, const char *w, size_t n, int32_t **ids,
                                   size_t *n_ids, size_t *cap) MOE_MUST_USE;

/* ---- normalizers and pre-tokenizers (tokenizer_pretok.c) ---- */
struct tok_norm;   /* a normalizer tree */
struct tok_pretok; /* a pre-tokenizer tree */
enum moe_status moe_tok_norm_load(struct tok_norm **out, json_t *j) MOE_MUST_USE;
void moe_tok_norm_free(struct tok_norm *n);
/* Replaces *io (s, len) by its normalized form; uses tmp as scratch. */
enum moe_status moe_tok_normalize(struct tok_norm *n, struct tok_buf *io,
                                  struct tok_buf *tmp) MOE_MUST_USE;
enum moe_status moe_tok_pretok_load(struct tok_pretok **out, json_t *j) MOE_MUST_USE;
void moe_tok_pretok_free(struct tok_pretok *p);
/* Splits the words in *io (in place: io is replaced) using tmp as scratch. */
enum moe_status moe_tok_pretokenize(struct tok_pretok *p, struct tok_list *io,
                                    struct tok_list *tmp) MOE_MUST_USE;
/* The GPT-2 byte <-> unicode table used by ByteLevel: printable Latin-1
 * bytes map to themselves, the 68 others to U+0100.. in byte order. */
int32_t moe_tok_byte_cp(unsigned char b);
int moe_tok_char_byte(int32_t cp); /* -1 if cp is not in the table */
/* char::is_whitespace (Unicode White_Space) */
bool moe_tok_is_ws(int32_t cp);

/* ---- decoders (tokenizer_decode.c) ---- */
struct tok_decoder;
enum moe_status moe_tok_decoder_load(struct tok_decoder **out, json_t *j) MOE_MUST_USE;
void moe_tok_decoder_free(struct tok_decoder *d);

/* ---- added tokens ---- */
struct tok_added {
    char *content;  /* owned */
    size_t len;
    char *decoded;  /* owned: normalized content when normalized and different, else NULL */
    int32_t id;
    bool special, normalized, lstrip, rstrip, single_word;
};
/* Leftmost-longest matcher over a set of added tokens (by index). */
struct tok_matcher {
    int32_t *heads;      /* (256) first-byte bucket start into order, -1 none */
    int32_t *order;      /* token indices, grouped by first byte, longest first */
    char **pat;          /* pattern per token index (normalized form or content) */
    size_t *pat_len;
    int32_t *bucket_end; /* (256) */
    size_t n;
};

enum tok_post_kind { TOK_POST_NONE, TOK_POST_TEMPLATE };
struct moe_tok_impl {
    struct tok_bpe bpe;
    struct tok_added *added;   /* (n_added) */
    size_t n_added;
    char **id_added;           /* (n_vocab) content of an added token by id, borrowed, or NULL */
    bool *id_special;          /* (n_vocab) */
    struct tok_map added_map;  /* content -> id */
    struct tok_matcher raw_match, norm_match;
    struct tok_regex word_re;  /* one regex-crate \w character (single_word) */
    struct tok_norm *norm;
    struct tok_pretok *pretok;
    struct tok_decoder *decoder;
    /* post-processor, flattened: ids before and after the sequence */
    int32_t *post_pre, *post_post;
    size_t n_post_pre, n_post_post;
    /* encode scratch, reused across calls */
    struct tok_buf clean, seg, tmp;
    struct tok_list words, words_tmp;
};

/* Decodes id strings with the decoder chain into out (NUL-terminated).
 * tokens is used as scratch: its contents are undefined afterwards. */
enum moe_status moe_tok_decode_tokens(const struct tok_decoder *d, struct tok_list *tokens,
                                      struct tok_buf *out) MOE_MUST_USE;
