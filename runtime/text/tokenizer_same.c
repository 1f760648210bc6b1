/* tokenizer_same.c - whether two tokenizers map text to the same ids (see
 * moe_tokenizer_same in tokenizer.h): the vocabulary id by id, then the
 * added tokens id by id (content and special flag).  The first difference
 * is named in one line, token texts escaped so that no byte of a token
 * breaks the line. */
#include <stdio.h>
#include <string.h>

#include "runtime/text/tokenizer_impl.h"

/* s[0..n) for a message: quoted, at most 40 bytes shown, control bytes,
 * quotes and backslashes escaped. */
static const char *quoted(char *buf, size_t cap, const char *s, size_t n)
{
    if (!s) return "(none)";
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < n && i < 40 && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    if (n > 40 && o + 4 < cap) o += (size_t)snprintf(buf + o, cap - o, "...");
    buf[o++] = '"';
    buf[o] = 0;
    return buf;
}

/* The model-vocabulary token of id (bytes, *len), NULL when none. */
static const char *vocab_token(const struct moe_tok_impl *im, int32_t id, size_t *len)
{
    if (id >= im->bpe.n_vocab || !im->bpe.vocab[id]) {
        *len = 0;
        return NULL;
    }
    *len = im->bpe.vocab_len[id];
    return im->bpe.vocab[id];
}

enum moe_status moe_tokenizer_same(const struct moe_tokenizer *a, const struct moe_tokenizer *b,
                                   const char *name_a, const char *name_b)
{
    const struct moe_tok_impl *x = a->impl, *y = b->impl;
    if (!x || !y) return moe_fail(MOE_ERR_INVALID_ARG, "tokenizer comparison: a tokenizer is not loaded");
    if (a->n_vocab != b->n_vocab)
        return moe_fail(MOE_ERR_INVALID_ARG, "the %s tokenizer has %d token ids, the %s's %d", name_b,
                        b->n_vocab, name_a, a->n_vocab);
    char qa[200], qb[200];
    for (int32_t id = 0; id < a->n_vocab; id++) {
        size_t la, lb;
        const char *ta = vocab_token(x, id, &la), *tb = vocab_token(y, id, &lb);
        if ((ta == NULL) != (tb == NULL) || la != lb || (ta && memcmp(ta, tb, la) != 0))
            return moe_fail(MOE_ERR_INVALID_ARG, "the %s tokenizer's vocabulary differs at id %d: "
                            "%s, the %s's %s", name_b, id, quoted(qb, sizeof qb, tb, lb), name_a,
                            quoted(qa, sizeof qa, ta, la));
    }
    for (int32_t id = 0; id < a->n_vocab; id++) {
        const char *ta = x->id_added[id], *tb = y->id_added[id];
        if ((ta == NULL) != (tb == NULL) || (ta && strcmp(ta, tb) != 0))
            return moe_fail(MOE_ERR_INVALID_ARG, "the %s tokenizer's added token %d is %s, the %s's %s",
                            name_b, id, quoted(qb, sizeof qb, tb, tb ? strlen(tb) : 0), name_a,
                            quoted(qa, sizeof qa, ta, ta ? strlen(ta) : 0));
        if (x->id_special[id] != y->id_special[id]) {
            const char *t = moe_tokenizer_id_to_token(a, id);
            return moe_fail(MOE_ERR_INVALID_ARG, "the %s tokenizer's token %d %s is %sspecial, the "
                            "%s's is %sspecial", name_b, id, quoted(qb, sizeof qb, t, t ? strlen(t) : 0),
                            y->id_special[id] ? "" : "not ", name_a, x->id_special[id] ? "" : "not ");
        }
    }
    return MOE_OK;
}
