/* bench_spec.h - `moerun bench --spec P`: decode throughput with and
 * without speculative decoding, on the same requests.
 *
 * For each batch size B, B greedy requests (prompt i mod n_prompts, no
 * stop ids, so each generates exactly output_len tokens) are run to the
 * end on the plain engine and on the speculative one, alternating within
 * each round so both see the same machine noise.  The timed window of a
 * run starts when every request has its first token (the prefills are
 * done) and ends when the last finishes; tokens/s = tokens generated in
 * the window / its length, the best of the rounds for each engine; the
 * speedup is the median over the rounds of the two engines' ratio (a
 * round's two runs see nearly the same load on a shared machine).  The
 * acceptance comes from the speculative engine's counters over all its
 * rounds.  Both engines' outputs must be identical, token for token:
 * a difference is an error. */
#pragma once

#include <jansson.h>

#include "runtime/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_bench_spec_opts {
    const int32_t *const *prompts;  /* (n_prompts) token ids, borrowed */
    const int *prompt_len;          /* (n_prompts) */
    int n_prompts;
    const int32_t *batches;         /* (n_batches) batch sizes */
    int n_batches;
    int output_len;                 /* tokens per request */
    int rounds;                     /* >= 1 */
};

/* Runs the comparison on two idle engines of one model (spec with
 * speculation on, plain without) and returns the results as a new JSON
 * object; also prints a table to stdout unless quiet. */
MOE_MUST_USE enum moe_status moe_bench_spec(struct moe_engine *plain, struct moe_engine *spec,
                                             const struct moe_bench_spec_opts *o, bool quiet,
                                             json_t **result);

#ifdef __cplusplus
}
#endif
