/* test_forward_fast.c - every forward-pass test of test_forward.c (logits,
 * expert ids and greedy tokens against transformers; exact batching and
 * chunking invariance; F16 weights) run again with the fast CPU backend. */
#define FORWARD_SUITE forward_fast
#define FORWARD_BACKEND_INIT moe_backend_cpu_fast_init
#define FORWARD_FAST 1
#include "test_forward.c"
