/* bench_serve.h - the serving benchmark of `moerun bench --serve`, in the
 * style of vLLM's `bench serve`: requests of given (or random) input and
 * output lengths arrive as a Poisson process at --rate requests/s (or all at
 * once) into the engine; reported are TTFT, TPOT (per request, (last token
 * - first token) / (output tokens - 1)) and ITL (every gap between two
 * tokens of a request), each as mean, median and p99, plus requests/s and
 * output tokens/s over the whole run. */
#pragma once

#include <jansson.h>

#include "runtime/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_bench_serve_opts {
    int n_requests;
    double rate;         /* requests per second; <= 0: all at time 0 */
    int input_len, output_len;
    double range_ratio;  /* lengths uniform in [len*(1-r), len*(1+r)] */
    uint64_t seed;
};

/* Runs the benchmark on e (which must be idle) and returns the results as
 * a new JSON object; also prints a table to stdout unless quiet. */
MOE_MUST_USE enum moe_status moe_bench_serve(struct moe_engine *e,
                                              const struct moe_bench_serve_opts *o, bool quiet,
                                              json_t **result);

#ifdef __cplusplus
}
#endif
