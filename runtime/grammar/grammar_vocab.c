/* grammar_vocab.c - a model's vocabulary for token masks, from its
 * tokenizer (moe_tokenizer_token_bytes: each token's bytes inside a text).
 *
 * Ids the tokenizer does not know (a model vocabulary padded beyond it),
 * special and added tokens and empty tokens are left out of the trie, so a
 * grammar never allows them; end-of-sequence is the engine's to allow. */
#include "runtime/grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/text/tokenizer.h"

enum moe_status moe_grammar_vocab_from_tokenizer(struct moe_grammar_vocab *gv, const struct moe_tokenizer *tok,
                                                 int V)
{
    memset(gv, 0, sizeof *gv);
    if (V <= 0) return moe_fail(MOE_ERR_INVALID_ARG, "grammar: vocabulary of %d tokens", V);
    uint32_t *off = malloc(((size_t)V + 1) * sizeof *off);
    uint8_t *in = calloc((size_t)V, 1);
    uint8_t *bytes = NULL;
    size_t n = 0, cap = 0;
    enum moe_status st = MOE_OK;
    if (!off || !in) goto nomem;
    for (int i = 0; i < V; i++) {
        off[i] = (uint32_t)n;
        if (i >= tok->n_vocab) continue;
        char *b;
        size_t len;
        bool special;
        if ((st = moe_tokenizer_token_bytes(tok, i, &b, &len, &special))) goto fail;
        if (special || len == 0 || len > MOE_GRAMMAR_MAX_TOKEN) {
            free(b);
            continue;
        }
        if (n + len > UINT32_MAX / 2) {
            free(b);
            st = moe_fail(MOE_ERR_UNSUPPORTED, "grammar: the vocabulary's tokens exceed 2 GiB");
            goto fail;
        }
        if (n + len > cap) {
            size_t c = cap ? cap * 2 : 1 << 16;
            while (c < n + len) c *= 2;
            uint8_t *q = realloc(bytes, c);
            if (!q) {
                free(b);
                goto nomem;
            }
            bytes = q;
            cap = c;
        }
        memcpy(bytes + n, b, len);
        n += len;
        in[i] = 1;
        free(b);
    }
    off[V] = (uint32_t)n;
    if (!bytes && !(bytes = malloc(1))) goto nomem;
    st = moe_grammar_vocab_init(gv, V, off, bytes, in);
    goto fail;
nomem:
    st = moe_fail(MOE_ERR_NOMEM, "grammar: out of memory for a vocabulary of %d tokens", V);
fail:
    free(off);
    free(in);
    free(bytes);
    return st;
}
