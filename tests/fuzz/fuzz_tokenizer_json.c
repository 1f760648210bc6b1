/* fuzz_tokenizer_json.c - the input is a tokenizer.json, optionally followed
 * by a NUL byte and a text: load it, encode the text (or a few fixed strings)
 * and decode the ids back. */
#include "runtime/text/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

static void roundtrip(struct moe_tokenizer *tok, const char *text, size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    bool bad = false;
    if (moe_tokenizer_encode(tok, text, len, true, &ids, &n, &bad) == MOE_OK) {
        char *out = NULL;
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < tok->n_vocab, "id %d of %d", ids[i], tok->n_vocab);
        if (moe_tokenizer_decode(tok, ids, n, false, &out) == MOE_OK) free(out);
        if (moe_tokenizer_decode(tok, ids, n, true, &out) == MOE_OK) free(out);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *js, *text;
    size_t njs, ntext;
    fuzz_split(data, size, 0, &js, &njs, &text, &ntext);
    struct moe_tokenizer tok = {0};
    if (moe_tokenizer_load_json(&tok, (const char *)js, njs) == MOE_OK) {
        if (ntext) {
            roundtrip(&tok, (const char *)text, ntext);
        } else {
            static const char *fixed[] = {"Hello, world!", " a  b\n\n\tc ", "héllo wörld 日本語 🙂",
                                          "<s>[INST] x [/INST]</s>", "1234567 don't", ""};
            for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
                roundtrip(&tok, fixed[i], strlen(fixed[i]));
        }
        for (int32_t id = -1; id <= tok.n_vocab && id < 8; id++) (void)moe_tokenizer_id_to_token(&tok, id);
        (void)moe_tokenizer_token_to_id(&tok, "a");
    }
    moe_tokenizer_free(&tok);
    moe_tokenizer_free(&tok);
    return 0;
}
