/* spec_ngram.c - the n-gram proposer (see spec_ngram.h). */
#include "runtime/engine/spec_ngram.h"

#include <string.h>

/* Where the continuation of the most recent earlier occurrence of the last
 * n tokens starts (an occurrence t[i, i+n) with i + n < len), or -1. */
static int match_end(const int32_t *t, int len, int n)
{
    const int32_t *suffix = t + len - n;
    for (int i = len - n - 1; i >= 0; i--)
        if (t[i] == suffix[0] && memcmp(t + i, suffix, (size_t)n * sizeof *t) == 0) return i + n;
    return -1;
}

int moe_spec_ngram_propose(const int32_t *tokens, int n_tokens, int n_min, int n_max, int k,
                           int32_t *draft)
{
    if (k <= 0 || n_min < 1 || n_max < n_min) return 0;
    int top = n_max < n_tokens - 1 ? n_max : n_tokens - 1;
    for (int n = top; n >= n_min; n--) {
        int s = match_end(tokens, n_tokens, n);
        if (s < 0) continue;
        /* s < n_tokens, so past the end the copy reads draft[j'] with j' < j */
        for (int j = 0; j < k; j++)
            draft[j] = s + j < n_tokens ? tokens[s + j] : draft[s + j - n_tokens];
        return k;
    }
    return 0;
}
