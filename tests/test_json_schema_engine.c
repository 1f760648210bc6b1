/* Sampled outputs under JSON Schema grammars, checked by the jsonschema
 * package: for each schema the fixture names under "sampled"
 * (tests/fixtures/json_schema/cases.json), 1,000 requests to
 * models/demo-moe at temperature 1; every finished output must parse
 * (Jansson) and validate (tests/check_schema_outputs.py, Debian's
 * python3-jsonschema with its FormatChecker), and every output cut by
 * max_tokens must be a prefix the grammar can still continue. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/backend/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/text/tokenizer.h"

#define N_SAMPLES 1000
#define MAX_TOKENS 96

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

TestSuite(json_schema_engine, .init = setup, .fini = teardown, .timeout = 600);

/* Whether the bytes of out[0..n) (an end-of-sequence left out) advance g. */
static bool viable_prefix(const struct moe_grammar *g, const int32_t *out, int n)
{
    struct moe_grammar_state st;
    cr_assert_eq(moe_grammar_state_init(&st, g), MOE_OK);
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        if (out[i] == tok.eos_ids[0]) break;
        ok = gv.in_trie[out[i]];
        if (ok)
            cr_assert_eq(moe_grammar_state_advance(&st, gv.bytes + gv.off[out[i]],
                                                   gv.off[out[i] + 1] - gv.off[out[i]], &ok), MOE_OK);
    }
    moe_grammar_state_free(&st);
    return ok;
}

/* The demo model writes stories and, left alone, spends its tokens on the
 * whitespace the grammar allows between JSON tokens; a bias of -5 on the
 * tokens that are only whitespace (the same for every schema) lets most
 * outputs finish within MAX_TOKENS. */
static void bias_whitespace(struct moe_sampling *sp)
{
    for (int id = 0; id < gv.V && sp->n_bias < MOE_MAX_LOGIT_BIAS; id++) {
        uint32_t a = gv.off[id], b = gv.off[id + 1];
        bool ws = gv.in_trie[id] && b > a;
        for (uint32_t k = a; k < b && ws; k++) ws = gv.bytes[k] == ' ' || gv.bytes[k] == '\n';
        if (!ws) continue;
        sp->bias_ids[sp->n_bias] = id;
        sp->bias[sp->n_bias++] = -5.0f;
    }
}

/* N_SAMPLES requests under g; the finished outputs appended to texts. */
static void sample(struct moe_engine *e, const struct moe_grammar *g, const char *name, json_t *texts)
{
    const char *prompt = "Once upon a time, there was a happy dog named";
    int32_t *ids;
    size_t np;
    cr_assert_eq(moe_tokenizer_encode(&tok, prompt, strlen(prompt), false, &ids, &np, NULL), MOE_OK);
    struct moe_request **rs = calloc(N_SAMPLES, sizeof *rs);
    cr_assert(rs);
    for (int i = 0; i < N_SAMPLES; i++) {
        struct moe_request_params p = {.max_tokens = MAX_TOKENS, .grammar = g};
        moe_sampling_defaults(&p.sampling);
        p.sampling.temperature = 1.0f;
        p.sampling.seed = (uint64_t)i + 1;
        bias_whitespace(&p.sampling);
        p.stop_ids[p.n_stop_ids++] = tok.eos_ids[0];
        cr_assert_eq(moe_engine_submit(e, ids, (int)np, &p, NULL, &rs[i]), MOE_OK, "%s", moe_last_error());
    }
    while (!moe_engine_idle(e)) {
        int rows;
        cr_assert_eq(moe_engine_step(e, &rows), MOE_OK, "%s", moe_last_error());
    }
    int finished = 0, cut = 0;
    long tokens = 0;
    for (int i = 0; i < N_SAMPLES; i++) {
        int k;
        const int32_t *out = moe_request_output(rs[i], &k);
        tokens += k;
        if (rs[i]->finish == MOE_FINISH_LENGTH) {
            cr_assert(viable_prefix(g, out, k), "%s, seed %d: cut output is not a prefix of the grammar", name, i + 1);
            cut++;
        } else {
            cr_assert_eq(rs[i]->finish, MOE_FINISH_STOP, "%s, seed %d: %s", name, i + 1, moe_finish_name(rs[i]->finish));
            char *text;
            cr_assert_eq(moe_tokenizer_decode(&tok, out, (size_t)k, true, &text), MOE_OK);
            json_error_t err;
            json_t *v = json_loads(text, JSON_DECODE_ANY, &err);
            cr_assert(v, "%s, seed %d: not JSON (%s): %s", name, i + 1, err.text, text);
            json_decref(v);
            if (finished < 2) cr_log_info("%s, seed %d: %s", name, i + 1, text);
            json_array_append_new(texts, json_string(text));
            free(text);
            finished++;
        }
        moe_engine_release(e, rs[i]);
    }
    cr_log_info("%s: %d finished, %d cut by max_tokens %d, %.1f tokens each", name, finished, cut, MAX_TOKENS,
                (double)tokens / N_SAMPLES);
    cr_assert_geq(finished, N_SAMPLES * 9 / 10, "%s: most outputs should finish", name);
    free(rs);
    free(ids);
}

Test(json_schema_engine, sampled_outputs_validate_with_jsonschema)
{
    json_error_t err;
    json_t *f = json_load_file(MOERUN_SOURCE_DIR "/tests/fixtures/json_schema/cases.json", 0, &err);
    cr_assert(f, "%s", err.text);
    json_t *by_name = json_object(), *schemas = json_object(), *outputs = json_object(), *c, *x;
    size_t i;
    json_array_foreach(json_object_get(f, "cases"), i, c)
        json_object_set(by_name, json_string_value(json_object_get(c, "name")), json_object_get(c, "schema"));
    struct moe_engine e;
    struct moe_engine_opts o = {.max_batch_tokens = 512, .max_seqs = 64, .block_size = 16, .n_blocks = 64 * 12,
                                .kv_dtype = MOE_DTYPE_F32, .prefix_cache = true, .grammar_vocab = &gv};
    cr_assert_eq(moe_engine_init(&e, &m, &be, &o), MOE_OK, "%s", moe_last_error());
    json_array_foreach(json_object_get(f, "sampled"), i, x) {
        const char *name = json_string_value(x);
        json_t *schema = json_object_get(by_name, name), *texts = json_array();
        cr_assert(schema, "sampled case '%s' is not in the fixture", name);
        struct moe_grammar *g;
        cr_assert_eq(moe_json_schema_grammar(schema, &g), MOE_OK, "%s: %s", name, moe_last_error());
        sample(&e, g, name, texts);
        moe_grammar_free(g);
        json_object_set(schemas, name, schema);
        json_object_set_new(outputs, name, texts);
    }
    moe_engine_free(&e);
    char path[] = "/tmp/moerun-schema-outputs-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    json_t *doc = json_pack("{s:o, s:o}", "schemas", schemas, "outputs", outputs);
    cr_assert_eq(json_dump_file(doc, path, 0), 0);
    json_decref(doc);
    char cmd[512], line[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/check_schema_outputs.py %s 2>&1", MOERUN_SOURCE_DIR, path);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    while (fgets(line, sizeof line, p)) cr_log_info("jsonschema: %s", line);
    int rc = pclose(p);
    unlink(path);
    cr_assert_eq(rc, 0, "jsonschema finds invalid outputs, or python3-jsonschema is missing (tools/deps.sh "
                 "installs it); see the log above");
    json_decref(by_name);
    json_decref(f);
}
