/* test_demo_draft.c - models/demo-draft, the demo model's speculative
 * draft (models/make_demo_model.py): it shares demo-moe's tokenizer byte
 * for byte, and moerun computes what transformers computes from it.
 *
 * The reference is tests/fixtures/demo_draft.json, written by the script
 * with transformers (fp32 compute of the bf16 checkpoint): the prompt's ids,
 * the logits after the prompt and a 32-token greedy continuation whose
 * every step has a top-1 / top-2 logit gap of min_top2_gap or more. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "runtime/engine/runner.h"
#include "runtime/text/tokenizer.h"
#include "tests/testutil.h"

#define DRAFT_DIR MOERUN_SOURCE_DIR "/models/demo-draft"
#define TARGET_DIR MOERUN_SOURCE_DIR "/models/demo-moe"

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    cr_assert(len >= 0);
    rewind(f);
    char *buf = malloc((size_t)len + 1);
    cr_assert(buf);
    cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len, "read %s", path);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

Test(demo_draft, shares_the_targets_tokenizer)
{
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/%s", DRAFT_DIR, files[i]);
        snprintf(b, sizeof b, "%s/%s", TARGET_DIR, files[i]);
        size_t na, nb;
        char *x = read_file(a, &na), *y = read_file(b, &nb);
        cr_expect(na == nb && !memcmp(x, y, na), "%s differs between demo-draft and demo-moe", files[i]);
        free(x);
        free(y);
    }
    struct moe_model d, t;
    cr_assert_eq(moe_model_load(&d, DRAFT_DIR), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_model_load(&t, TARGET_DIR), MOE_OK, "%s", moe_last_error());
    cr_expect_eq(d.cfg.vocab, t.cfg.vocab, "vocabularies: draft %d, target %d", d.cfg.vocab, t.cfg.vocab);
    struct moe_tokenizer td, tt;
    cr_assert_eq(moe_tokenizer_load(&td, DRAFT_DIR), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_tokenizer_load(&tt, TARGET_DIR), MOE_OK, "%s", moe_last_error());
    cr_expect_eq(td.n_vocab, tt.n_vocab);
    cr_expect_leq(td.n_vocab, d.cfg.vocab, "tokenizer ids %d > model vocabulary %d", td.n_vocab, d.cfg.vocab);
    moe_tokenizer_free(&td);
    moe_tokenizer_free(&tt);
    moe_model_free(&d);
    moe_model_free(&t);
    /* "A few hundred KB": a tenth of the target or less. */
    size_t nd, nt;
    free(read_file(DRAFT_DIR "/model.safetensors", &nd));
    free(read_file(TARGET_DIR "/model.safetensors", &nt));
    cr_expect_leq(nd * 8, nt, "draft %zu bytes, target %zu: the draft should be far smaller", nd, nt);
}

static int int_array(json_t *a, int32_t *out, int cap)
{
    cr_assert(json_is_array(a));
    int n = (int)json_array_size(a);
    cr_assert(n <= cap, "%d values > %d", n, cap);
    for (int i = 0; i < n; i++) out[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return n;
}

static void greedy_matches_transformers(const char *backend)
{
    json_error_t e;
    json_t *ref = json_load_file(FIXTURE_DIR "/demo_draft.json", 0, &e);
    cr_assert(ref, "demo_draft.json: %s", e.text);
    int32_t prompt[64], want[64], got[64];
    const int S = int_array(json_object_get(ref, "prompt_ids"), prompt, 64);
    const int N = int_array(json_object_get(ref, "greedy"), want, 64);
    cr_assert(S > 0 && N > 0);

    struct moe_model m;
    struct moe_tokenizer tok;
    cr_assert_eq(moe_model_load(&m, DRAFT_DIR), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_tokenizer_load(&tok, DRAFT_DIR), MOE_OK, "%s", moe_last_error());
    const char *text = json_string_value(json_object_get(ref, "prompt"));
    int32_t *ids;
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, text, strlen(text), false, &ids, &n, NULL), MOE_OK);
    cr_expect(n == (size_t)S && !memcmp(ids, prompt, n * sizeof *ids), "the prompt encodes as transformers does");
    free(ids);

    struct moe_backend be;
    cr_assert_eq(tu_backend_init(&be, backend), MOE_OK, "%s", moe_last_error());
    struct moe_runner r;
    struct moe_runner_opts o = {.max_tokens = 64, .max_seqs = 1, .max_logits = 64, .block_size = 8,
                                .n_blocks = 32};
    cr_assert_eq(moe_runner_init(&r, &m, &be, &o), MOE_OK, "%s", moe_last_error());

    /* The logits after the prompt, as transformers wrote them (5 decimals). */
    json_t *jl = json_object_get(ref, "last_prompt_logits");
    const int V = m.cfg.vocab;
    cr_assert_eq((int)json_array_size(jl), V);
    float *lref = malloc((size_t)V * sizeof *lref), *lg = malloc((size_t)S * V * sizeof *lg);
    for (int i = 0; i < V; i++) lref[i] = (float)json_real_value(json_array_get(jl, (size_t)i));
    struct moe_seq seq = {0};
    struct moe_chunk c = {&seq, prompt, S, true, false, 0};
    cr_assert_eq(moe_runner_step(&r, &c, 1, lg, NULL, NULL, NULL), MOE_OK, "%s", moe_last_error());
    moe_seq_free(&r, &seq);
    cr_expect(tu_allclose("demo-draft logits after the prompt", lg + (size_t)(S - 1) * V, lref, (size_t)V,
                          1e-3f, 1e-3f));

    memset(&seq, 0, sizeof seq);
    cr_assert_eq(moe_runner_greedy(&r, &seq, prompt, S, N, 0, got), MOE_OK, "%s", moe_last_error());
    moe_seq_free(&r, &seq);
    int same = 0;
    while (same < N && got[same] == want[same]) same++;
    cr_expect_eq(same, N, "%s: greedy equals transformers' for %d of %d tokens (then %d, want %d)", backend,
                 same, N, same < N ? got[same] : -1, same < N ? want[same] : -1);
    free(lref);
    free(lg);
    moe_runner_free(&r);
    moe_backend_free(&be);
    moe_tokenizer_free(&tok);
    moe_model_free(&m);
    json_decref(ref);
}

Test(demo_draft, greedy_matches_transformers_reference_backend) { greedy_matches_transformers("cpu-ref"); }
Test(demo_draft, greedy_matches_transformers_cpu_backend) { greedy_matches_transformers("cpu"); }

/* models/demo-prompts.jsonl, the speculation benchmark's prompts: each line
 * {"id", "kind": "story" | "quote", "prompt"}, ids unique, the prompt
 * encodable; each quote prompt has, among its last 8 tokens, 3 that
 * appear earlier in it (what n-gram lookup finds). */
Test(demo_draft, benchmark_prompts)
{
    struct moe_tokenizer tok;
    cr_assert_eq(moe_tokenizer_load(&tok, TARGET_DIR), MOE_OK, "%s", moe_last_error());
    FILE *f = fopen(MOERUN_SOURCE_DIR "/models/demo-prompts.jsonl", "r");
    cr_assert(f);
    char line[4096], seen[32][64];
    int n = 0, kinds[2] = {0, 0};
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        cr_assert(o, "demo-prompts.jsonl line %d: %s", n + 1, e.text);
        const char *id = json_string_value(json_object_get(o, "id"));
        const char *kind = json_string_value(json_object_get(o, "kind"));
        const char *p = json_string_value(json_object_get(o, "prompt"));
        cr_assert(id && kind && p && *p, "line %d: id, kind and prompt", n + 1);
        cr_assert(n < 32);
        for (int i = 0; i < n; i++) cr_expect_str_neq(seen[i], id, "id %s twice", id);
        snprintf(seen[n], sizeof seen[n], "%s", id);
        bool quote = !strcmp(kind, "quote");
        cr_expect(quote || !strcmp(kind, "story"), "%s: kind %s", id, kind);
        kinds[quote]++;
        int32_t *ids;
        size_t nt;
        cr_expect_eq(moe_tokenizer_encode(&tok, p, strlen(p), false, &ids, &nt, NULL), MOE_OK, "%s", id);
        cr_expect(nt > 0, "%s: no tokens", id);
        if (quote) { /* 3 tokens among its last 8 occur earlier in it */
            bool found = false;
            for (size_t j = nt >= 8 ? nt - 8 : 0; j + 3 <= nt && !found; j++)
                for (size_t i = 0; i < j && !found; i++) found = !memcmp(ids + i, ids + j, 3 * sizeof *ids);
            cr_expect(found, "%s: its end quotes nothing earlier", id);
        }
        free(ids);
        json_decref(o);
        n++;
    }
    fclose(f);
    cr_expect_geq(kinds[0], 6, "story prompts: %d", kinds[0]);
    cr_expect_geq(kinds[1], 6, "quote prompts: %d", kinds[1]);
    moe_tokenizer_free(&tok);
}
