/* Grammar-constrained decoding end to end on models/demo-moe: sampled
 * requests with the json_object grammar return JSON objects (Jansson
 * parses them), the same requests without it mostly do not; a small
 * custom grammar, greedy (through the host sampler); and with speculation
 * on (n-gram, and the demo model drafting for itself, its drafts sampled):
 * greedy and seeded requests give the same tokens as without it, drafts the
 * grammar does not allow are rejected, and every output stays a sentence
 * (or a cut prefix) of the grammar. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/grammar/grammar.h"
#include "runtime/text/tokenizer.h"

static struct moe_backend be;
static struct moe_model m;
static struct moe_tokenizer tok;
static struct moe_grammar_vocab gv;

static void setup(void)
{
    const char *dir = MOERUN_SOURCE_DIR "/models/demo-moe";
    cr_assert_eq(moe_backend_cpu_fast_init(&be, 1), MOE_OK);
    cr_assert_eq(moe_model_load(&m, dir), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_tokenizer_load(&tok, dir), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_grammar_vocab_from_tokenizer(&gv, &tok, m.cfg.vocab), MOE_OK, "%s", moe_last_error());
}

static void teardown(void)
{
    moe_grammar_vocab_free(&gv);
    moe_tokenizer_free(&tok);
    moe_model_free(&m);
    moe_backend_free(&be);
}

TestSuite(grammar_engine, .init = setup, .fini = teardown, .timeout = 600);

static struct moe_engine_opts opts(void)
{
    return (struct moe_engine_opts){.max_batch_tokens = 512, .max_seqs = 32, .block_size = 16,
                                    .n_blocks = 32 * 40, .kv_dtype = MOE_DTYPE_F32, .prefix_cache = true,
                                    .grammar_vocab = &gv};
}

struct outcome {
    int objects;     /* outputs Jansson parses as a JSON object */
    int prefixes;    /* outputs cut by max_tokens that the grammar can still continue */
    int finish[4];   /* by enum moe_finish */
    long tokens;
};

/* Whether the bytes of out[0..n) (stop ids left out) advance g from its start. */
static bool viable_prefix(const struct moe_grammar *g, const int32_t *out, int n)
{
    struct moe_grammar_state st;
    cr_assert_eq(moe_grammar_state_init(&st, g), MOE_OK);
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        if (out[i] == tok.eos_ids[0]) break;
        ok = gv.in_trie[out[i]];
        if (ok)
            cr_assert_eq(moe_grammar_state_advance(&st, gv.bytes + gv.off[out[i]], gv.off[out[i] + 1] - gv.off[out[i]], &ok),
                         MOE_OK);
    }
    moe_grammar_state_free(&st);
    return ok;
}

/* n requests of prompt, seeds 1..n, temperature 1, optionally a logit
 * bias on the tokens '"' and '}'; counts the outputs that parse as JSON
 * objects and, when g is given, the cut ones that are viable prefixes of
 * it.  Shows the first outputs in the log. */
static struct outcome run_requests(struct moe_engine *e, const char *prompt, int n, int max_tokens,
                                   const struct moe_grammar *g, const struct moe_grammar *check,
                                   float bias, const char *what)
{
    int32_t *ids;
    size_t np;
    cr_assert_eq(moe_tokenizer_encode(&tok, prompt, strlen(prompt), false, &ids, &np, NULL), MOE_OK);
    struct moe_request **rs = calloc((size_t)n, sizeof *rs);
    struct outcome o = {0};
    for (int i = 0; i < n; i++) {
        struct moe_request_params p = {.max_tokens = max_tokens, .grammar = g};
        moe_sampling_defaults(&p.sampling);
        p.sampling.temperature = 1.0f;
        p.sampling.seed = (uint64_t)i + 1;
        p.stop_ids[p.n_stop_ids++] = tok.eos_ids[0];
        if (bias != 0) {
            p.sampling.bias_ids[0] = moe_tokenizer_token_to_id(&tok, "\"");
            p.sampling.bias_ids[1] = moe_tokenizer_token_to_id(&tok, "}");
            p.sampling.bias[0] = p.sampling.bias[1] = bias;
            p.sampling.n_bias = 2;
        }
        cr_assert_eq(moe_engine_submit(e, ids, (int)np, &p, NULL, &rs[i]), MOE_OK, "%s", moe_last_error());
    }
    while (!moe_engine_idle(e)) {
        int rows;
        cr_assert_eq(moe_engine_step(e, &rows), MOE_OK, "%s", moe_last_error());
    }
    for (int i = 0; i < n; i++) {
        int k;
        const int32_t *out = moe_request_output(rs[i], &k);
        char *text;
        cr_assert_eq(moe_tokenizer_decode(&tok, out, (size_t)k, true, &text), MOE_OK);
        json_error_t err;
        json_t *j = json_loads(text, JSON_DECODE_ANY, &err);
        o.objects += json_is_object(j);
        if (rs[i]->finish == MOE_FINISH_LENGTH && check && viable_prefix(check, out, k)) o.prefixes++;
        o.finish[rs[i]->finish]++;
        o.tokens += k;
        if (i < 2)
            cr_log_info("%s, seed %d (%s, %d tokens): %.200s", what, i + 1, moe_finish_name(rs[i]->finish), k, text);
        json_decref(j);
        free(text);
        moe_engine_release(e, rs[i]);
    }
    free(rs);
    free(ids);
    return o;
}

static void log_outcome(const char *what, const struct outcome *o, int n)
{
    cr_log_info("%s: %d of %d outputs are JSON objects (stop %d, length %d of which %d viable prefixes, "
                "abort %d; %.1f tokens each)", what, o->objects, n, o->finish[MOE_FINISH_STOP],
                o->finish[MOE_FINISH_LENGTH], o->prefixes, o->finish[MOE_FINISH_ABORT], (double)o->tokens / n);
}

/* The demo model writes stories, so inside a JSON string it seldom picks
 * '"'; a logit bias of +10 on '"' and '}' (the same with and without the
 * grammar) makes strings and objects close within max_tokens.  With the
 * grammar every output is an object; without it almost none is. */
Test(grammar_engine, json_object_outputs_parse)
{
    struct moe_grammar *g;
    cr_assert_eq(moe_grammar_json_object(&g), MOE_OK);
    struct moe_engine e;
    struct moe_engine_opts o = opts();
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    const char *prompt = "Once upon a time, there was a happy dog named";
    const int N = 200;
    struct outcome with = run_requests(&e, prompt, N, 400, g, g, 10.0f, "json_object");
    struct outcome without = run_requests(&e, prompt, N, 400, NULL, NULL, 10.0f, "no grammar");
    log_outcome("json_object, bias +10 on '\"' and '}'", &with, N);
    log_outcome("no grammar, the same bias", &without, N);
    cr_assert_eq(with.finish[MOE_FINISH_STOP], N, "every request ends where its object closes");
    cr_assert_eq(with.objects, N);
    cr_assert_lt(without.objects, N / 10);
    cr_assert_geq(e.n.grammar_masks, (uint64_t)with.tokens);
    moe_engine_free(&e);
    moe_grammar_free(g);
}

/* Without the bias most strings outlast max_tokens: every output is then
 * either a finished JSON object or, cut by max_tokens, a prefix the
 * grammar can still continue; nothing else. */
Test(grammar_engine, json_object_unbiased_outputs_are_objects_or_cut_prefixes)
{
    struct moe_grammar *g;
    cr_assert_eq(moe_grammar_json_object(&g), MOE_OK);
    struct moe_engine e;
    struct moe_engine_opts o = opts();
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    const char *prompt = "Once upon a time, there was a happy dog named";
    const int N = 200;
    struct outcome with = run_requests(&e, prompt, N, 400, g, g, 0, "json_object");
    struct outcome without = run_requests(&e, prompt, N, 400, NULL, g, 0, "no grammar");
    log_outcome("json_object", &with, N);
    log_outcome("no grammar", &without, N);
    cr_assert_eq(with.objects, with.finish[MOE_FINISH_STOP], "every finished output is an object");
    cr_assert_eq(with.prefixes, with.finish[MOE_FINISH_LENGTH], "every cut output is a viable prefix");
    cr_assert_eq(with.objects + with.prefixes, N);
    cr_assert_gt(with.objects, N / 10);
    cr_assert_eq(without.objects, 0);
    moe_engine_free(&e);
    moe_grammar_free(g);
}

/* root ::= "yes" | "no", greedy and sampled, with n-gram speculation on:
 * only yes or no comes back, with "stop". */
Test(grammar_engine, yes_no_greedy_and_sampled_with_ngram_speculation)
{
    const char *src = "root ::= \"yes\" | \"no\"";
    struct moe_grammar *g;
    cr_assert_eq(moe_grammar_parse(src, strlen(src), &g), MOE_OK);
    struct moe_engine e;
    struct moe_engine_opts o = opts();
    o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .tokens = 4};
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    const char *prompt = "Once upon a time, there was a";
    for (int greedy = 0; greedy < 2; greedy++) {
        int32_t *ids;
        size_t np;
        cr_assert_eq(moe_tokenizer_encode(&tok, prompt, strlen(prompt), false, &ids, &np, NULL), MOE_OK);
        struct moe_request *rs[16];
        for (int i = 0; i < 16; i++) {
            struct moe_request_params p = {.max_tokens = 32, .grammar = g};
            moe_sampling_defaults(&p.sampling);
            p.sampling.temperature = greedy ? 0.0f : 1.0f;
            p.sampling.seed = (uint64_t)i + 100;
            cr_assert_eq(moe_engine_submit(&e, ids, (int)np, &p, NULL, &rs[i]), MOE_OK);
        }
        while (!moe_engine_idle(&e)) {
            int rows;
            cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK, "%s", moe_last_error());
        }
        int yes = 0;
        for (int i = 0; i < 16; i++) {
            int k;
            const int32_t *out = moe_request_output(rs[i], &k);
            char *text;
            cr_assert_eq(moe_tokenizer_decode(&tok, out, (size_t)k, false, &text), MOE_OK);
            cr_assert(!strcmp(text, "yes") || !strcmp(text, "no"), "got '%s'", text);
            cr_assert_eq(rs[i]->finish, MOE_FINISH_STOP);
            yes += !strcmp(text, "yes");
            free(text);
            moe_engine_release(&e, rs[i]);
        }
        cr_log_info("%s: %d yes, %d no", greedy ? "greedy" : "sampled", yes, 16 - yes);
        if (greedy) cr_assert(yes == 0 || yes == 16, "greedy requests of one prompt agree");
        free(ids);
    }
    moe_engine_free(&e);
    moe_grammar_free(g);
}

/* A list grammar whose outputs repeat themselves, so n-gram lookup finds
 * drafts; a third of its requests are greedy, the rest seeded. */
#define LIST_N 12
#define LIST_MAX 48
struct list_run {
    int32_t out[LIST_N][LIST_MAX];
    int n[LIST_N];
    enum moe_finish finish[LIST_N];
    long drafted, accepted;
};

static void list_serve(const struct moe_grammar *g, const struct moe_spec_opts *spec, struct list_run *res)
{
    struct moe_engine e;
    struct moe_engine_opts o = opts();
    if (spec) o.spec = *spec;
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    const char *prompt = "The dog and the cat. The dog and the cat. The dog";
    int32_t *ids;
    size_t np;
    cr_assert_eq(moe_tokenizer_encode(&tok, prompt, strlen(prompt), false, &ids, &np, NULL), MOE_OK);
    struct moe_request *rs[LIST_N];
    for (int i = 0; i < LIST_N; i++) {
        struct moe_request_params p = {.max_tokens = LIST_MAX, .grammar = g};
        moe_sampling_defaults(&p.sampling);
        p.sampling.temperature = i % 3 == 0 ? 0.0f : 0.7f;
        p.sampling.seed = (uint64_t)i + 7;
        p.stop_ids[p.n_stop_ids++] = tok.eos_ids[0];
        cr_assert_eq(moe_engine_submit(&e, ids, (int)np, &p, NULL, &rs[i]), MOE_OK);
    }
    while (!moe_engine_idle(&e)) {
        int rows;
        cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK, "%s", moe_last_error());
    }
    memset(res, 0, sizeof *res);
    for (int i = 0; i < LIST_N; i++) {
        int k;
        const int32_t *out = moe_request_output(rs[i], &k);
        cr_assert_leq(k, LIST_MAX);
        memcpy(res->out[i], out, (size_t)k * sizeof *out);
        res->n[i] = k;
        res->finish[i] = rs[i]->finish;
        res->drafted += rs[i]->n_drafted;
        res->accepted += rs[i]->n_accepted;
        cr_assert(rs[i]->finish != MOE_FINISH_ABORT, "request %d aborted", i);
        cr_assert(viable_prefix(g, out, k), "request %d left the grammar", i);
        if (i < 2) {
            char *text;
            cr_assert_eq(moe_tokenizer_decode(&tok, out, (size_t)k, true, &text), MOE_OK);
            cr_log_info("%s, request %d (%s): %s", spec ? "speculative" : "plain", i,
                        moe_finish_name(rs[i]->finish), text);
            free(text);
        }
        moe_engine_release(&e, rs[i]);
    }
    free(ids);
    moe_engine_free(&e);
}

Test(grammar_engine, speculation_keeps_grammar_outputs)
{
    const char *src = "root ::= \"[\" item (\", \" item)* \"]\"\n"
                      "item ::= \"\\\"the dog\\\"\" | \"\\\"the cat\\\"\" | \"\\\"a bird\\\"\"";
    struct moe_grammar *g;
    cr_assert_eq(moe_grammar_parse(src, strlen(src), &g), MOE_OK, "%s", moe_last_error());
    static struct list_run plain, ngram, self;
    list_serve(g, NULL, &plain);
    const struct moe_spec_opts ng = {.kind = MOE_SPEC_NGRAM, .tokens = 4};
    list_serve(g, &ng, &ngram);
    cr_log_info("n-gram: %ld drafted, %ld accepted", ngram.drafted, ngram.accepted);
    cr_assert_gt(ngram.accepted, 0, "nothing drafted was kept");
    cr_assert_lt(ngram.accepted, ngram.drafted, "no draft was rejected");
    for (int i = 0; i < LIST_N; i++) {
        cr_assert_eq(ngram.n[i], plain.n[i], "request %d: %d tokens, %d without speculation", i, ngram.n[i],
                     plain.n[i]);
        cr_assert_arr_eq(ngram.out[i], plain.out[i], (size_t)plain.n[i] * sizeof(int32_t), "request %d", i);
        cr_assert_eq(ngram.finish[i], plain.finish[i]);
    }
    /* the demo model drafting for itself, its drafts drawn from its own
     * distribution masked by the grammar: the target's rows are the
     * draft's bit for bit, so every draft is kept (unmasked drafts would
     * almost never be: the model does not write lists) */
    const struct moe_spec_opts sd = {.kind = MOE_SPEC_DRAFT, .tokens = 4, .draft = &m, .sample_drafts = true};
    list_serve(g, &sd, &self);
    cr_log_info("sampled self-drafts: %ld drafted, %ld accepted", self.drafted, self.accepted);
    cr_assert_gt(self.drafted, 0);
    cr_assert_eq(self.accepted, self.drafted);
    for (int i = 0; i < LIST_N; i += 3) /* greedy requests: drafts argmax, the same tokens */
        cr_assert_arr_eq(self.out[i], plain.out[i], (size_t)plain.n[i] * sizeof(int32_t), "request %d", i);
    moe_grammar_free(g);
}

/* A lazy grammar (grammar_triggers): free text until the token " dog",
 * then " barked loudly", then free again: every " dog" in every output is
 * followed by those bytes (or by a prefix of them where max_tokens cut the
 * output); the same requests without the grammar write " dog" without
 * them.  Greedy and sampled, with n-gram speculation on (verification
 * applies the grammar). */
static void lazy_outputs(const struct moe_grammar *g, int32_t trigger, bool spec, int *n_trig, int *n_followed)
{
    struct moe_engine e;
    struct moe_engine_opts o = opts();
    if (spec) o.spec = (struct moe_spec_opts){.kind = MOE_SPEC_NGRAM, .tokens = 4};
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    const char *prompt = "Once upon a time, there was a dog. The dog";
    int32_t *ids;
    size_t np;
    cr_assert_eq(moe_tokenizer_encode(&tok, prompt, strlen(prompt), false, &ids, &np, NULL), MOE_OK);
    enum { N = 16 };
    struct moe_request *rs[N];
    for (int i = 0; i < N; i++) {
        struct moe_request_params p = {.max_tokens = 64, .grammar = g};
        if (g) p.grammar_triggers[p.n_grammar_triggers++] = trigger;
        moe_sampling_defaults(&p.sampling);
        p.sampling.temperature = i % 4 == 0 ? 0.0f : 1.0f;
        p.sampling.seed = (uint64_t)i + 3;
        /* dogs, often */
        p.sampling.bias_ids[0] = trigger;
        p.sampling.bias[0] = 4.0f;
        p.sampling.n_bias = 1;
        cr_assert_eq(moe_engine_submit(&e, ids, (int)np, &p, NULL, &rs[i]), MOE_OK, "%s", moe_last_error());
    }
    while (!moe_engine_idle(&e)) {
        int rows;
        cr_assert_eq(moe_engine_step(&e, &rows), MOE_OK, "%s", moe_last_error());
    }
    const char *want = " barked loudly";
    *n_trig = *n_followed = 0;
    for (int i = 0; i < N; i++) {
        int k;
        const int32_t *out = moe_request_output(rs[i], &k);
        cr_assert(rs[i]->finish != MOE_FINISH_ABORT, "request %d aborted", i);
        for (int t = 0; t < k; t++) {
            if (out[t] != trigger) continue;
            char *text;
            cr_assert_eq(moe_tokenizer_decode(&tok, out + t + 1, (size_t)(k - t - 1), false, &text), MOE_OK);
            const size_t n = strlen(text) < strlen(want) ? strlen(text) : strlen(want);
            (*n_trig)++;
            *n_followed += !strncmp(text, want, n);
            free(text);
        }
        if (i < 2) {
            char *text;
            cr_assert_eq(moe_tokenizer_decode(&tok, out, (size_t)k, false, &text), MOE_OK);
            cr_log_info("%s, request %d: %s", g ? "lazy grammar" : "no grammar", i, text);
            free(text);
        }
        moe_engine_release(&e, rs[i]);
    }
    free(ids);
    moe_engine_free(&e);
}

Test(grammar_engine, lazy_grammar_constrains_after_its_trigger)
{
    const char *src = "root ::= \" barked loudly\"";
    struct moe_grammar *g;
    cr_assert_eq(moe_grammar_parse(src, strlen(src), &g), MOE_OK, "%s", moe_last_error());
    int32_t *dog;
    size_t n;
    cr_assert_eq(moe_tokenizer_encode(&tok, " dog", 4, false, &dog, &n, NULL), MOE_OK);
    cr_assert_eq(n, 1, "' dog' is one token of the demo vocabulary");
    int trig, followed;
    lazy_outputs(NULL, dog[0], false, &trig, &followed);
    cr_log_info("no grammar: %d of %d ' dog' followed by ' barked loudly'", followed, trig);
    cr_assert_gt(trig, 10);
    cr_assert_lt(followed, trig / 2);
    for (int spec = 0; spec < 2; spec++) {
        lazy_outputs(g, dog[0], spec, &trig, &followed);
        cr_log_info("lazy grammar%s: %d of %d ' dog' followed by ' barked loudly'", spec ? ", n-gram drafts" : "",
                    followed, trig);
        cr_assert_gt(trig, 10);
        cr_assert_eq(followed, trig);
    }
    free(dog);
    moe_grammar_free(g);
}

Test(grammar_engine, grammar_needs_the_vocabulary)
{
    const char *src = "root ::= \"a\"";
    struct moe_grammar *g;
    cr_assert_eq(moe_grammar_parse(src, strlen(src), &g), MOE_OK);
    struct moe_engine e;
    struct moe_engine_opts o = opts();
    o.grammar_vocab = NULL;
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK);
    int32_t prompt[] = {5, 6};
    struct moe_request_params p = {.max_tokens = 4, .grammar = g};
    moe_sampling_defaults(&p.sampling);
    struct moe_request *r;
    cr_assert_eq(moe_engine_submit(&e, prompt, 2, &p, NULL, &r), MOE_ERR_INVALID_ARG);
    cr_assert_str_eq(moe_last_error(), "request: a grammar needs the vocabulary's token bytes, which this "
                                       "engine was not given");
    moe_engine_free(&e);
    moe_grammar_free(g);
}
