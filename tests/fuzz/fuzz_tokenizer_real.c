/* fuzz_tokenizer_real.c - a real tokenizer (MOE_FUZZ_TOKENIZER_DIR, default
 * models/demo-moe) loaded once; the input is both a text to encode and, read
 * as little-endian int32s, ids to decode and to stream through the
 * incremental detokenizer.  Invariants from tokenizer.h: encoded ids are in
 * [0, n_vocab); out-of-range ids are an error; the streamed pieces
 * concatenate to moe_tokenizer_decode of the same ids. */
#include "runtime/text/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

static struct moe_tokenizer tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *dir = fuzz_repo_path("MOE_FUZZ_TOKENIZER_DIR", "models/demo-moe");
    if (moe_tokenizer_load(&tok, dir) != MOE_OK) {
        fprintf(stderr, "fuzz_tokenizer_real: %s\n", moe_last_error());
        abort();
    }
    return 0;
}

/* Streams ids through a detokenizer and compares with one-shot decode. */
static void stream(const int32_t *ids, size_t n, bool skip)
{
    char *whole = NULL;
    if (moe_tokenizer_decode(&tok, ids, n, skip, &whole) != MOE_OK) abort(); /* ids are valid */
    struct moe_detok d;
    moe_detok_init(&d, &tok, skip);
    size_t cap = strlen(whole) * 2 + 64, len = 0;
    char *cat = malloc(cap);
    if (!cat) abort();
    cat[0] = '\0';
    const char *piece;
    for (size_t i = 0; i <= n; i++) {
        if ((i < n ? moe_detok_push(&d, ids[i], &piece) : moe_detok_flush(&d, &piece)) != MOE_OK)
            abort();
        size_t k = strlen(piece);
        if (len + k + 1 > cap) {
            cap = (len + k + 1) * 2;
            if (!(cat = realloc(cat, cap))) abort();
        }
        memcpy(cat + len, piece, k + 1);
        len += k;
    }
    FUZZ_CHECK(!strcmp(cat, whole), "stream \"%s\" != decode \"%s\"", cat, whole);
    moe_detok_free(&d);
    free(cat);
    free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (moe_tokenizer_encode(&tok, (const char *)data, size, size & 1, &ids, &n, NULL) == MOE_OK) {
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < tok.n_vocab, "id %d", ids[i]);
        char *out = NULL;
        if (moe_tokenizer_decode(&tok, ids, n, false, &out) == MOE_OK) free(out);
    }
    free(ids);

    size_t m = size / 4;
    int32_t *raw = malloc((m ? m : 1) * sizeof *raw);
    if (!raw) abort();
    memcpy(raw, data, m * 4);
    char *out = NULL;
    enum moe_status s = moe_tokenizer_decode(&tok, raw, m, false, &out);
    bool in_range = true;
    for (size_t i = 0; i < m; i++) in_range &= raw[i] >= 0 && raw[i] < tok.n_vocab;
    FUZZ_CHECK((s == MOE_OK) == in_range, "decode of out-of-range ids: %s", moe_last_error());
    free(out);
    for (size_t i = 0; i < m; i++) /* valid ids, folded into the vocabulary */
        raw[i] = (int32_t)((uint32_t)raw[i] % (uint32_t)tok.n_vocab);
    stream(raw, m, false);
    stream(raw, m, true);
    free(raw);
    return 0;
}
