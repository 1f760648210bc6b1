/* tokenizer.h - Hugging Face tokenizer.json (BPE) in C: encode, decode,
 * streaming decode.
 *
 * Mirrors the Rust `tokenizers` crate (Tokenizer::encode / decode /
 * DecodeStream) for the pipelines used by the model families moerun runs:
 * byte-level BPE (Qwen2/3, Llama-3, OLMoE/GPT-NeoX, gpt-oss, DeepSeek-V3)
 * and SentencePiece-style BPE with byte fallback (Llama-2, Mixtral).
 * Conformance is pinned by tests/fixtures/tokenizers (ids and decoded text
 * identical to the Rust crate on every corpus string).
 *
 * Anything in tokenizer.json that is not implemented (a model, normalizer,
 * pre-tokenizer, post-processor or decoder type, BPE dropout, ...) makes
 * moe_tokenizer_load fail with MOE_ERR_UNSUPPORTED naming it; nothing is
 * silently ignored except fields that only affect offsets (trim_offsets).
 * Regexes are Oniguruma's in the Rust crate; they run on PCRE2 here, with
 * \s, \w, \h and ^/$ rewritten to Oniguruma's meaning.  The remaining known
 * differences are Unicode data: characters assigned after the system
 * utf8proc (Unicode 13) and PCRE2 (Unicode 14) tables, and some Arabic
 * combining marks the Rust NFC leaves unordered (see
 * tests/fixtures/tokenizers/README.md).
 *
 * Threads: a tokenizer caches word -> ids results and owns regex match
 * buffers, so one handle must not be used by two threads at once.  Load one
 * per thread, or serialise calls. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_TOKENIZER_MAX_EOS 8

struct moe_tok_impl; /* private, see tokenizer_impl.h */

struct moe_tokenizer {
    struct moe_tok_impl *impl;
    int32_t n_vocab;       /* highest id + 1, model vocab and added tokens */
    int32_t bos_id;        /* -1 if none (tokenizer_config / generation_config) */
    int32_t eos_ids[MOE_TOKENIZER_MAX_EOS]; /* generation_config eos_token_id(s),
                                               else tokenizer_config eos_token */
    size_t n_eos;
    bool add_bos;          /* tokenizer_config add_bos_token (false if absent) */
    char *bos_token;       /* owned strings, NULL if absent */
    char *eos_token;
    char *chat_template;   /* the Jinja source, kept for the chat layer */
};

/* Reads MODEL_DIR/tokenizer.json and, when present, tokenizer_config.json and
 * generation_config.json.  On failure tok is left zeroed (free is safe) and
 * the message names the file and the offending field. */
enum moe_status moe_tokenizer_load(struct moe_tokenizer *tok, const char *model_dir) MOE_MUST_USE;
/* Same, from the text of a tokenizer.json alone (no config files). */
enum moe_status moe_tokenizer_load_json(struct moe_tokenizer *tok, const char *json,
                                        size_t len) MOE_MUST_USE;
/* Safe on a zeroed struct and twice. */
void moe_tokenizer_free(struct moe_tokenizer *tok);

/* Encodes text[0..len) (UTF-8; need not be NUL-terminated).  Invalid UTF-8
 * is replaced by U+FFFD per maximal invalid subpart (as Rust's
 * String::from_utf8_lossy does) and *invalid_utf8 is set (may be NULL).
 * add_special applies tokenizer.json's post-processor (e.g. BOS), as the
 * Rust Tokenizer::encode does; tokenizer_config's add_bos_token is only
 * reported in tok->add_bos, not applied here.  *ids is new memory
 * (free()), *n its length; *ids is non-NULL even when *n == 0. */
enum moe_status moe_tokenizer_encode(struct moe_tokenizer *tok, const char *text, size_t len,
                                     bool add_special, int32_t **ids, size_t *n,
                                     bool *invalid_utf8) MOE_MUST_USE;

/* Decodes ids into a NUL-terminated UTF-8 string, new memory (free()).
 * skip_special drops special added tokens.  An id outside [0, n_vocab) is
 * MOE_ERR_INVALID_ARG. */
enum moe_status moe_tokenizer_decode(const struct moe_tokenizer *tok, const int32_t *ids,
                                     size_t n, bool skip_special, char **out) MOE_MUST_USE;

/* Token string of an id (borrowed), NULL if out of range. */
const char *moe_tokenizer_id_to_token(const struct moe_tokenizer *tok, int32_t id);
/* The bytes token id contributes inside a text, as new memory (free()),
 * for grammar-constrained decoding: the decoder applied to the token alone,
 * byte tokens (ByteLevel characters, "<0xHH>") as raw bytes even when they
 * are part of a UTF-8 character, and no removal of a leading space that
 * only the first token of a text gets.  *special: an added or special
 * token (its content is returned as is). */
MOE_MUST_USE enum moe_status moe_tokenizer_token_bytes(const struct moe_tokenizer *tok, int32_t id,
                                                        char **bytes, size_t *len, bool *special);
/* Id of an exact token string (model vocab or added token), -1 if none. */
int32_t moe_tokenizer_token_to_id(const struct moe_tokenizer *tok, const char *token);

/* Whether b maps text to ids as a does: the same token of every id in the
 * model vocabulary, and the same added tokens (content, id, special or
 * not).  MOE_OK when so; else MOE_ERR_INVALID_ARG with one line naming the
 * first difference (the id and both tokens), the tokenizers called name_a
 * and name_b (e.g. "target", "draft"). */
MOE_MUST_USE enum moe_status moe_tokenizer_same(const struct moe_tokenizer *a,
                                                 const struct moe_tokenizer *b, const char *name_a,
                                                 const char *name_b);

/* Streaming decoder: feed ids one at a time, get the text they complete.
 * Text that ends in an incomplete UTF-8 character or byte-fallback sequence
 * is held back until a later id completes it (or until flush).  The
 * concatenation of everything returned equals moe_tokenizer_decode of all
 * ids.  Mirrors the Rust DecodeStream: it re-decodes a window of the last
 * few ids, so the cost per id is bounded by the window, not the history. */
#define MOE_DETOK_MAX_KEEP 8

struct moe_detok {
    const struct moe_tokenizer *tok; /* borrowed */
    bool skip_special;
    int32_t keep[MOE_DETOK_MAX_KEEP]; /* (n_keep) special ids decoded even so (moe_detok_keep) */
    int n_keep;
    int32_t *ids;          /* window of pending ids (n), capacity cap */
    size_t n, cap;
    size_t prefix_index;   /* ids[0..prefix_index) are context already emitted */
    char *prefix;          /* decode(ids[0..prefix_index)) */
    size_t prefix_len;
    char *text;            /* last returned text, owned */
};

void moe_detok_init(struct moe_detok *d, const struct moe_tokenizer *tok, bool skip_special);
/* Keeps the special tokens whose text is one of tokens (NULL-terminated;
 * texts that are no token are ignored, at most MOE_DETOK_MAX_KEEP kept)
 * although d skips special tokens: a tool-call format's markers
 * (runtime/chat/toolcall.h) that some tokenizers mark special.  Call before
 * the first push. */
void moe_detok_keep(struct moe_detok *d, const char *const *tokens);
/* *text is borrowed, valid until the next call on d; "" when nothing is
 * complete yet. */
enum moe_status moe_detok_push(struct moe_detok *d, int32_t id, const char **text) MOE_MUST_USE;
/* Returns whatever is held back (incomplete sequences decode to U+FFFD). */
enum moe_status moe_detok_flush(struct moe_detok *d, const char **text) MOE_MUST_USE;
void moe_detok_free(struct moe_detok *d);

#ifdef __cplusplus
}
#endif
