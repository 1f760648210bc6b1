/* spec_ngram.h - the n-gram (prompt-lookup) proposer of speculative
 * decoding: guesses a sequence's next tokens by copying what followed an
 * earlier occurrence of its last few tokens.  No model, no state: a pure
 * function of the sequence's tokens (prompt then generated).
 *
 * Rule, for n from n_max down to n_min: find the most recent earlier
 * occurrence of the last n tokens (one that ends before the last token);
 * the first n with a match wins, and the proposal is the k tokens that
 * followed that occurrence.  The copy may run past the end of the sequence
 * into the tokens it has just proposed (an overlapping copy, as in LZ77),
 * so a sequence repeating with period p proposes its continuation for all
 * k tokens even when the match is the last period.
 *
 * Where it comes from: prompt lookup decoding (Saxena 2023), as in Hugging
 * Face's PromptLookupCandidateGenerator (n from max down to 1), llama.cpp's
 * lookup example (ngram_min, ngram_max) and vLLM's ngram proposer
 * (prompt_lookup_min, prompt_lookup_max).  vLLM takes the earliest match of
 * the longest n-gram and stops at the end of the sequence; here the most
 * recent match is taken (the local pattern, what the text is doing now)
 * and the copy runs on.  Cost: O(n_tokens x n_max) comparisons. */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Proposes up to k tokens to follow tokens (n_tokens) into draft (k).
 * 1 <= n_min <= n_max.  Returns how many were proposed: k on a match, 0
 * when no n-gram of n_min..n_max tokens occurs earlier (or n_tokens is
 * shorter than n_min + 1, or k <= 0). */
int moe_spec_ngram_propose(const int32_t *tokens, int n_tokens, int n_min, int n_max, int k,
                           int32_t *draft);

#ifdef __cplusplus
}
#endif
