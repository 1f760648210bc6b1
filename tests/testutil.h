/* testutil.h - helpers shared by the Criterion suites: seeded random data,
 * tolerance checks that report the worst element, fixture paths. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runtime/core/status.h"

#define FIXTURE_DIR MOERUN_SOURCE_DIR "/tests/fixtures"

/* splitmix64 stream: deterministic across platforms. */
uint64_t tu_rand_u64(uint64_t *state);
/* Uniform in [lo, hi). */
float tu_rand_uniform(uint64_t *state, float lo, float hi);
void tu_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi);
/* A standard normal draw (Box-Muller). */
float tu_rand_gauss(uint64_t *state);
/* 10^e for e uniform in [lo, hi). */
float tu_rand_log_uniform(uint64_t *state, float lo, float hi);
/* A routing of T rows to K distinct experts each, drawn from [0, E) (E >=
 * K), into ids (T, K); with hot >= 0 every row's slot 0 takes expert hot. */
void tu_random_routing(int32_t *ids, int T, int K, int E, int hot, uint64_t *state);
/* Whether a and b are the same bits (-0 is not 0, NaN may equal NaN). */
static inline bool tu_same_bits(float a, float b)
{
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

/* The whole of the file at path, NUL-terminated (malloc'd; the test fails
 * when it cannot be read). */
char *tu_read_text(const char *path);
/* Skips the running test when there is no CUDA device, or fails it when
 * MOERUN_REQUIRE_GPU is set (tests/gpu/run.sh: a skipped GPU suite must
 * not pass for a run on a GPU).  Criterion suites' .init only. */
void tu_need_cuda_device(void);
/* moe_backend_init(be, name) with the options the program would take from
 * this environment (moe_cli_backend_opts: MOERUN_CUDA_EXPERTS, _GRAPHS,
 * _STRICT, _PREFILL_ATTN, MOERUN_CPU_ISA, _PANELS), so a suite picks its
 * kernels as a user does and tests/gpu/run.sh's MOERUN_CUDA_STRICT=1 holds. */
struct moe_backend;
enum moe_status tu_backend_init(struct moe_backend *be, const char *name);
/* ... with weight quantization quant (enum moe_weight_quant) and, for
 * CUDA, gpu_experts device slots per MoE layer (0: all resident) of which
 * misses of at most cpu_rows rows run on the CPU. */
enum moe_status tu_backend_init_with(struct moe_backend *be, const char *name, int quant, int gpu_experts,
                                     int cpu_rows);
/* ... and a per-expert precision plan (moe_backend_opts.expert_quant:
 * layers x E entries, NULL none). */
enum moe_status tu_backend_init_planned(struct moe_backend *be, const char *name, int quant, const uint8_t *plan,
                                        int layers, int E, int gpu_experts, int cpu_rows);
/* Checks |x - ref| <= atol + rtol*|ref| elementwise; on failure prints the
 * worst element with `what` and returns 0. */
int tu_allclose(const char *what, const float *x, const float *ref, size_t n, float atol,
                float rtol);
/* Runs a shell command; its stdout (up to n-1 bytes) goes to out.  Returns
 * the exit status, or -1 if it could not run or was killed. */
int tu_run(const char *cmd, char *out, size_t n);
/* Runs `moerun ARGS` and expects it to fail with exactly one line on
 * stderr that contains needle (Criterion expectations). */
void tu_expect_one_line_error(const char *args, const char *needle);
struct moe_runner;
/* The fixed prompt the synthetic-model suites share: 20 ids (i*37 + 5) %
 * vocab into prompt (20), run as one chunk of a fresh sequence on r, every
 * row's logits (20, vocab) into logits; the sequence is freed after. */
void tu_prompt_logits(struct moe_runner *r, int vocab, int32_t *prompt, float *logits);
/* ... the same with S ids (prompt: S), logits (S, vocab). */
void tu_prompt_logits_n(struct moe_runner *r, int vocab, int S, int32_t *prompt, float *logits);
/* max |x - ref| / max |ref|. */
double tu_max_rel_err(const float *x, const float *ref, size_t n);
/* The mean of |x - ref| over n values (of |x| when ref is NULL); NaN
 * anywhere gives NaN. */
double tu_mean_abs_diff(const float *x, const float *ref, size_t n);

struct moe_engine;
struct moe_request;
struct moe_request_params;
/* One request of a churn: its prompt (borrowed until submitted) and
 * parameters, drawn from *seed. */
typedef void (*tu_churn_make_fn)(void *ctx, uint64_t *seed, const int32_t **prompt, int *n,
                                 struct moe_request_params *p);
/* Serves n_requests through e, at most live_max at a time, cancelling a
 * ninth of the live ones at random after every step; each finished (or
 * cancelled) request is passed to done (may be NULL) and released.  Fails
 * the test if the engine stops making progress or is not idle at the end. */
void tu_engine_churn(struct moe_engine *e, int n_requests, int live_max, uint64_t seed,
                     tu_churn_make_fn make, void (*done)(void *ctx, struct moe_request *r),
                     void *ctx);
/* Every block of e's KV pool (and of its proposer's: a draft model or an MTP module)
 * free and unreferenced. */
void tu_expect_pools_free(const struct moe_engine *e);

struct moe_model;
/* A synthetic f32 model of config.json text cfg_json (random weights from
 * seed); fails the test on a bad config. */
/* The configuration a config.json text gives (asserted to parse). */
struct moe_config tu_config_json(const char *cfg_json);
void tu_synthetic_model(struct moe_model *m, const char *cfg_json, uint64_t seed);
/* The engine suites' tiny Qwen3-MoE: hidden 32, `layers` layers, 4 heads
 * (2 KV) of 8, vocabulary `vocab`, 256 positions, 8 experts top-2 of 16,
 * initializer range 0.5. */
void tu_tiny_qwen3_moe(struct moe_model *m, int layers, int vocab, uint64_t seed);
