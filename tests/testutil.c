/* testutil.c - see testutil.h. */
#include "testutil.h"

#include <criterion/criterion.h>
#include <string.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "runtime/backend/backend.h"
#include "runtime/cli/cli_common.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/runner.h"

uint64_t tu_rand_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tu_random_routing(int32_t *ids, int T, int K, int E, int hot, uint64_t *state)
{
    for (int r = 0; r < T; r++)
        for (int k = 0; k < K; k++) {
            int e;
            bool dup;
            do {
                e = hot >= 0 && k == 0 ? hot : (int)(tu_rand_u64(state) % (uint64_t)E);
                dup = false;
                for (int j = 0; j < k; j++) dup |= ids[r * K + j] == e;
            } while (dup);
            ids[r * K + k] = e;
        }
}

float tu_rand_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((tu_rand_u64(s) >> 40) * (1.0 / 16777216.0));
}

float tu_rand_gauss(uint64_t *s)
{
    const double u = (tu_rand_u64(s) >> 11) * 0x1p-53 + 0x1p-54, v = (tu_rand_u64(s) >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

float tu_rand_log_uniform(uint64_t *s, float lo, float hi)
{
    return powf(10.0f, tu_rand_uniform(s, lo, hi));
}

void tu_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) x[i] = tu_rand_uniform(&s, lo, hi);
}

int tu_allclose(const char *what, const float *x, const float *ref, size_t n, float atol,
                float rtol)
{
    size_t worst = 0;
    double worst_excess = -1;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)ref[i]);
        double lim = atol + rtol * fabs((double)ref[i]);
        if (!(d <= lim)) ok = 0;
        double excess = isnan(d) ? INFINITY : d - lim;
        if (excess > worst_excess) {
            worst_excess = excess;
            worst = i;
        }
    }
    if (!ok)
        fprintf(stderr, "%s: mismatch, worst at [%zu]: got %.8g want %.8g (atol %g rtol %g)\n",
                what, worst, x[worst], ref[worst], atol, rtol);
    return ok;
}

double tu_max_rel_err(const float *x, const float *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)ref[i]);
        if (isnan(d)) return INFINITY;
        if (d > md) md = d;
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    return mr > 0 ? md / mr : md;
}

double tu_mean_abs_diff(const float *x, const float *ref, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += fabs((double)x[i] - (ref ? (double)ref[i] : 0.0));
    return n ? s / (double)n : 0.0;
}

int tu_run(const char *cmd, char *out, size_t n)
{
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void tu_expect_one_line_error(const char *args, const char *needle)
{
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1 >/dev/null", MOERUN_BINARY, args);
    int rc = tu_run(cmd, out, sizeof out);
    cr_expect_neq(rc, 0, "'%s' should fail", args);
    cr_expect(strstr(out, needle), "'%s': expected '%s' in: %s", args, needle, out);
    char *nl = strchr(out, '\n');
    cr_expect(nl && nl[1] == '\0', "'%s': one line of error, got: %s", args, out);
}

void tu_prompt_logits_n(struct moe_runner *r, int vocab, int S, int32_t *prompt, float *logits)
{
    for (int i = 0; i < S; i++) prompt[i] = (i * 37 + 5) % vocab;
    struct moe_seq seq = {0};
    struct moe_chunk c = {&seq, prompt, S, true, false, 0};
    cr_assert_eq(moe_runner_step(r, &c, 1, logits, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    moe_seq_free(r, &seq);
}

void tu_prompt_logits(struct moe_runner *r, int vocab, int32_t *prompt, float *logits)
{
    tu_prompt_logits_n(r, vocab, 20, prompt, logits);
}

enum moe_status tu_backend_init(struct moe_backend *be, const char *name)
{
    struct moe_backend_opts o;
    moe_cli_backend_opts(&o, 0);
    return moe_backend_init(be, name, &o);
}

enum moe_status tu_backend_init_with(struct moe_backend *be, const char *name, int quant, int gpu_experts,
                                     int cpu_rows)
{
    return tu_backend_init_planned(be, name, quant, NULL, 0, 0, gpu_experts, cpu_rows);
}

enum moe_status tu_backend_init_planned(struct moe_backend *be, const char *name, int quant, const uint8_t *plan,
                                        int layers, int E, int gpu_experts, int cpu_rows)
{
    struct moe_backend_opts o;
    moe_cli_backend_opts(&o, 0);
    o.quant = (enum moe_weight_quant)quant;
    o.expert_quant = plan;
    o.expert_quant_layers = layers;
    o.expert_quant_e = E;
    o.offload.gpu_experts = gpu_experts;
    o.offload.cpu_rows = cpu_rows;
    return moe_backend_init(be, name, &o);
}

void tu_need_cuda_device(void)
{
    char why[256] = "";
    if (moe_cuda_device_count(why, sizeof why) > 0) return;
    if (getenv("MOERUN_REQUIRE_GPU")) cr_assert_fail("no CUDA device, and MOERUN_REQUIRE_GPU is set: %s", why);
    cr_skip_test("no CUDA device: %s", why);
}

char *tu_read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

void tu_engine_churn(struct moe_engine *e, int n_requests, int live_max, uint64_t seed,
                     tu_churn_make_fn make, void (*done)(void *ctx, struct moe_request *r),
                     void *ctx)
{
    struct moe_request **live = calloc((size_t)live_max, sizeof *live);
    cr_assert(live);
    int n_live = 0, submitted = 0, rows, steps = 0;
    while (submitted < n_requests || n_live > 0) {
        cr_assert(++steps < 100000, "the engine stopped making progress");
        while (submitted < n_requests && n_live < live_max) {
            const int32_t *prompt;
            int n;
            struct moe_request_params p;
            make(ctx, &seed, &prompt, &n, &p);
            cr_assert_eq(moe_engine_submit(e, prompt, n, &p, NULL, &live[n_live++]), MOE_OK, "%s",
                         moe_last_error());
            submitted++;
        }
        cr_assert_eq(moe_engine_step(e, &rows), MOE_OK, "%s", moe_last_error());
        for (int i = 0; i < n_live; i++) {
            struct moe_request *r = live[i];
            if (r->state != MOE_REQ_FINISHED && tu_rand_u64(&seed) % 9 == 0) moe_engine_cancel(e, r);
            if (r->state == MOE_REQ_FINISHED) {
                if (done) done(ctx, r);
                moe_engine_release(e, r);
                live[i--] = live[--n_live];
            }
        }
    }
    free(live);
    cr_assert(moe_engine_idle(e));
}

static void expect_pool_free(const struct moe_kvcache *kv, const char *what)
{
    cr_assert_eq(moe_kvcache_available(kv), kv->n_blocks, "every %s block back", what);
    for (int b = 0; b < kv->n_blocks; b++)
        cr_assert_eq(kv->blocks[b].refcount, 0, "%s block %d still referenced", what, b);
    cr_assert_eq(kv->n_state_free, kv->n_state_slots, "every %s recurrent-state slot back", what);
}

void tu_expect_pools_free(const struct moe_engine *e)
{
    expect_pool_free(&e->r.kv, "target");
    if (e->o.spec.kind == MOE_SPEC_DRAFT) expect_pool_free(&e->draft.r.kv, "draft");
    if (e->o.spec.kind == MOE_SPEC_MTP) expect_pool_free(&e->mtp.r.kv, "multi-token prediction");
}

struct moe_config tu_config_json(const char *cfg_json)
{
    json_error_t err;
    json_t *j = json_loads(cfg_json, 0, &err);
    cr_assert(j, "test config: %s", err.text);
    struct moe_config cfg;
    cr_assert_eq(moe_config_parse(&cfg, j, "test config"), MOE_OK, "%s", moe_last_error());
    json_decref(j);
    return cfg;
}

void tu_synthetic_model(struct moe_model *m, const char *cfg_json, uint64_t seed)
{
    const struct moe_config cfg = tu_config_json(cfg_json);
    cr_assert_eq(moe_model_synthetic(m, &cfg, MOE_DTYPE_F32, seed), MOE_OK, "%s", moe_last_error());
}

void tu_tiny_qwen3_moe(struct moe_model *m, int layers, int vocab, uint64_t seed)
{
    char cfg[640];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 32, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
             "\"head_dim\": 8, \"vocab_size\": %d, \"max_position_embeddings\": 256, "
             "\"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, "
             "\"norm_topk_prob\": true, \"initializer_range\": 0.5}",
             layers, vocab);
    tu_synthetic_model(m, cfg, seed);
}
