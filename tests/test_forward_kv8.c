/* test_forward_kv8.c - the forward pass with an fp8 KV cache (kvcache.h)
 * against the same pass with an f32 cache, with both CPU backends.
 *
 * fp8 rounds every cached K and V value by up to 2^-4 of itself (bf16:
 * 2^-9), so the logits move.  On the trained demo model (models/demo-moe,
 * prompts from tests/fixtures/ppl/stories.txt) they move little: greedy
 * continuations equal the f32 cache's and logits stay within 8% (max
 * |diff| / max |ref| per position).  The transformers fixtures
 * (tests/fixtures) are random tiny models whose logits react strongly to
 * any change of K and V: with a bf16 cache their logits already move by
 * 0.1-5% and greedy tokens part after a few; with fp8 by 10-50%, and the
 * first tokens often differ.  There the test pins the ratio instead: to
 * first order the error scales with the cache's unit roundoff, 2^5 times
 * bf16's, so fp8's logits error stays within 2 x 32 times bf16's.  And the row independence of the CPU backends holds with
 * the fp8 cache: one prefill, chunks of 5 and token by token give
 * bit-identical logits. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/runner.h"
#include "runtime/text/tokenizer.h"
#include "tests/testutil.h"

struct kv8_fixture {
    struct moe_model m;
    struct moe_backend be;
    struct moe_runner r;
    struct moe_safetensors ref;
};

/* A fixture (name under tests/fixtures, with its reference prompts) or,
 * for name NULL, the demo model. */
static bool kv8_open(struct kv8_fixture *f, const char *name, bool fast, enum moe_dtype kv)
{
    char dir[512], path[600];
    if (name) snprintf(dir, sizeof dir, "%s/%s", FIXTURE_DIR, name);
    else snprintf(dir, sizeof dir, "%s/models/demo-moe", MOERUN_SOURCE_DIR);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    memset(f, 0, sizeof *f);
    cr_assert_eq(moe_model_load(&f->m, dir), MOE_OK, "load %s: %s", dir, moe_last_error());
    if (name) cr_assert_eq(moe_safetensors_open_file(&f->ref, path), MOE_OK, "%s", moe_last_error());
    cr_assert_eq((fast ? moe_backend_cpu_fast_init : moe_backend_cpu_init)(&f->be, 0), MOE_OK);
    if (fast && moe_backend_cpu_isa(&f->be) == 0) {
        moe_backend_free(&f->be);
        moe_safetensors_close(&f->ref);
        moe_model_free(&f->m);
        return false;
    }
    struct moe_runner_opts o = {.max_tokens = 128, .max_seqs = 4, .max_logits = 128, .block_size = 4,
                                .n_blocks = 256, .kv_dtype = kv, .kv_dtype_set = true};
    cr_assert_eq(moe_runner_init(&f->r, &f->m, &f->be, &o), MOE_OK, "%s", moe_last_error());
    return true;
}

static void kv8_close(struct kv8_fixture *f)
{
    moe_runner_free(&f->r);
    moe_backend_free(&f->be);
    moe_safetensors_close(&f->ref);
    moe_model_free(&f->m);
}

static const int32_t *prompt_of(struct kv8_fixture *f, int p, int *S)
{
    char name[32];
    snprintf(name, sizeof name, "prompt.%d", p);
    const struct moe_st_tensor *t = moe_safetensors_find(&f->ref, name);
    cr_assert(t, "%s missing", name);
    *S = (int)t->shape[0];
    return t->data;
}

/* Logits (S, V) of the prompt prefilled in chunks of `chunk` tokens. */
static float *prefill(struct kv8_fixture *f, const int32_t *prompt, int S, int chunk)
{
    const int V = f->m.cfg.vocab;
    float *logits = malloc((size_t)S * V * sizeof(float));
    struct moe_seq seq = {0};
    for (int off = 0; off < S; off += chunk) {
        const int n = S - off < chunk ? S - off : chunk;
        struct moe_chunk c = {&seq, prompt + off, n, true, false, 0};
        cr_assert_eq(moe_runner_step(&f->r, &c, 1, logits + (size_t)off * V, NULL, NULL, NULL), MOE_OK, "%s",
                     moe_last_error());
    }
    moe_seq_free(&f->r, &seq);
    return logits;
}

enum { NGREEDY = 32, NP = 3 };

struct kv8_result {
    double err;  /* worst max |diff| / max |ref| of a position's logits */
    int agree;   /* fewest leading greedy tokens equal over the prompts */
};

/* The prompts: the fixture's three, or three 96-token pieces of the
 * stories text for the demo model. */
struct kv8_prompts {
    const int32_t *p[NP];
    int n[NP];
    int32_t *text;
};

static void prompts_get(struct kv8_prompts *pr, struct kv8_fixture *f, const char *name)
{
    memset(pr, 0, sizeof *pr);
    if (name) {
        for (int i = 0; i < NP; i++) pr->p[i] = prompt_of(f, i, &pr->n[i]);
        return;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/demo-moe", MOERUN_SOURCE_DIR);
    struct moe_tokenizer tok;
    cr_assert_eq(moe_tokenizer_load(&tok, dir), MOE_OK, "%s", moe_last_error());
    char *text = tu_read_text(FIXTURE_DIR "/ppl/stories.txt");
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, text, strlen(text), false, &pr->text, &n, NULL), MOE_OK);
    cr_assert(n > 3 * 400);
    for (int i = 0; i < NP; i++) {
        pr->p[i] = pr->text + 400 * i;
        pr->n[i] = 96;
    }
    free(text);
    moe_tokenizer_free(&tok);
}

/* kv against f32 on the prompts, with the reference (fast 0) or the fast
 * backend; false when the fast kernels do not run here. */
static bool compare(const char *name, bool fast, enum moe_dtype kv, struct kv8_result *res)
{
    struct kv8_fixture a, b;
    if (!kv8_open(&a, name, fast, MOE_DTYPE_F32)) return false;
    cr_assert(kv8_open(&b, name, fast, kv));
    struct kv8_prompts pr;
    prompts_get(&pr, &a, name);
    const int V = a.m.cfg.vocab;
    res->err = 0;
    res->agree = NGREEDY;
    for (int p = 0; p < NP; p++) {
        const int S = pr.n[p];
        float *la = prefill(&a, pr.p[p], S, S), *lb = prefill(&b, pr.p[p], S, S);
        for (int s = 0; s < S; s++) {
            const double e = tu_max_rel_err(lb + (size_t)s * V, la + (size_t)s * V, (size_t)V);
            res->err = e > res->err ? e : res->err;
        }
        int32_t ga[NGREEDY], gb[NGREEDY];
        struct moe_seq sa = {0}, sb = {0};
        cr_assert_eq(moe_runner_greedy(&a.r, &sa, pr.p[p], S, NGREEDY, 0, ga), MOE_OK, "%s", moe_last_error());
        cr_assert_eq(moe_runner_greedy(&b.r, &sb, pr.p[p], S, NGREEDY, 0, gb), MOE_OK, "%s", moe_last_error());
        int n = 0;
        while (n < NGREEDY && ga[n] == gb[n]) n++;
        res->agree = n < res->agree ? n : res->agree;
        moe_seq_free(&a.r, &sa);
        moe_seq_free(&b.r, &sb);
        free(la);
        free(lb);
    }
    cr_expect_eq(moe_kvcache_available(&b.r.kv), b.r.kv.n_blocks, "every KV block returned");
    free(pr.text);
    kv8_close(&a);
    kv8_close(&b);
    return true;
}

static const char *backend_name(int fast) { return fast ? "cpu" : "cpu-ref"; }

Test(forward_kv8, demo_model_greedy_equals_f32_cache)
{
    for (int fast = 0; fast < 2; fast++) {
        struct kv8_result r8, r16;
        if (!compare(NULL, fast, MOE_DTYPE_F8E4M3, &r8)) continue;
        cr_assert(compare(NULL, fast, MOE_DTYPE_BF16, &r16));
        cr_log_info("demo-moe (%s) against the f32 cache: fp8 logits max rel err %.3g, greedy equal for %d of %d; "
                    "bf16 %.3g, %d", backend_name(fast), r8.err, r8.agree, NGREEDY, r16.err, r16.agree);
        cr_expect(r8.err <= 0.08, "demo-moe (%s): fp8 logits relative error %.3g > 0.08", backend_name(fast), r8.err);
        cr_expect_eq(r8.agree, NGREEDY, "demo-moe (%s): greedy tokens equal for %d of %d", backend_name(fast),
                     r8.agree, NGREEDY);
    }
}

/* fp8's logits error within 64 times bf16's (above) on a fixture. */
static void check_fixture(const char *name)
{
    for (int fast = 0; fast < 2; fast++) {
        struct kv8_result r8, r16;
        if (!compare(name, fast, MOE_DTYPE_F8E4M3, &r8)) continue;
        cr_assert(compare(name, fast, MOE_DTYPE_BF16, &r16));
        cr_log_info("%s (%s) against the f32 cache: fp8 logits max rel err %.3g (%.1f x bf16's %.3g), greedy "
                    "equal for %d (bf16: %d) of %d", name, backend_name(fast), r8.err, r8.err / r16.err, r16.err,
                    r8.agree, r16.agree, NGREEDY);
        cr_expect(r16.err > 0 && r8.err <= 64 * r16.err, "%s (%s): fp8 error %.3g, over 64 x bf16's %.3g", name,
                  backend_name(fast), r8.err, r16.err);
    }
}

Test(forward_kv8, qwen3_moe_error_scales_as_e4m3) { check_fixture("qwen3_moe"); }
Test(forward_kv8, mixtral_error_scales_as_e4m3) { check_fixture("mixtral"); }
Test(forward_kv8, llama_error_scales_as_e4m3) { check_fixture("llama"); }
Test(forward_kv8, gpt_oss_sinks_error_scales_as_e4m3) { check_fixture("gpt_oss"); }
Test(forward_kv8, deepseek_v2_mla_error_scales_as_e4m3) { check_fixture("deepseek_v2"); }

/* One prefill, chunks of 5 and token by token: the same bits with fp8. */
static void check_chunking(const char *name)
{
    for (int fast = 0; fast < 2; fast++) {
        struct kv8_fixture f;
        if (!kv8_open(&f, name, fast, MOE_DTYPE_F8E4M3)) continue;
        const int V = f.m.cfg.vocab;
        int S;
        const int32_t *prompt = prompt_of(&f, 2, &S);
        float *whole = prefill(&f, prompt, S, S);
        for (int chunk = 1; chunk <= 5; chunk += 4) {
            float *part = prefill(&f, prompt, S, chunk);
            cr_expect(memcmp(part, whole, (size_t)S * V * sizeof(float)) == 0,
                      "%s (%s): chunks of %d differ from one prefill (max rel err %.3g)", name,
                      fast ? "cpu" : "cpu-ref", chunk, tu_max_rel_err(part, whole, (size_t)S * V));
            free(part);
        }
        free(whole);
        kv8_close(&f);
    }
}

Test(forward_kv8, chunked_prefill_is_identical_qwen3_moe) { check_chunking("qwen3_moe"); }
Test(forward_kv8, chunked_prefill_is_identical_deepseek_v2) { check_chunking("deepseek_v2"); }
