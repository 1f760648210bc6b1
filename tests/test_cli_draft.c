/* test_cli_draft.c - `--draft DIR` (runtime/cli/cli_draft.h): the demo
 * model drafted by itself prints what it prints alone; a draft whose
 * tokenizer differs (two vocabulary entries swapped, or another
 * vocabulary) is refused with one line naming the difference before any
 * weights load; --kv-budget is split so that both pools hold the same
 * number of tokens, each block costing the target's and the draft's
 * bytes. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_draft.h"
#include "tests/testutil.h"

#define DEMO MOERUN_SOURCE_DIR "/models/demo-moe"

Test(cli_draft, output_is_the_targets)
{
    char plain[4096], spec[4096], cmd[1024];
    const char *common = "run " DEMO " -p 'Once upon a time, there was a little cat named Tom. "
                         "Tom liked to' -n 32 --temperature 0 --threads 1";
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", MOERUN_BINARY, common);
    cr_assert_eq(tu_run(cmd, plain, sizeof plain), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s %s --draft " DEMO " --kv-budget 4MiB 2>/dev/null", MOERUN_BINARY,
             common);
    cr_assert_eq(tu_run(cmd, spec, sizeof spec), 0, "%s", cmd);
    cr_assert(strlen(plain) > 40, "%s", plain);
    cr_assert_str_eq(spec, plain);
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    cr_assert(in && out, "%s -> %s", from, to);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) cr_assert_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    cr_assert_eq(fclose(out), 0);
}

/* The demo model with the ids of its vocabulary entries "F" and "G"
 * swapped; dir receives its path. */
static void swapped_demo(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/moerun-draft-cli-XXXXXX");
    cr_assert(mkdtemp(dir));
    DIR *d = opendir(DEMO);
    cr_assert(d);
    struct dirent *de;
    char from[1024], to[1024];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(from, sizeof from, "%s/%s", DEMO, de->d_name);
        snprintf(to, sizeof to, "%s/%s", dir, de->d_name);
        copy_file(from, to);
    }
    closedir(d);
    snprintf(to, sizeof to, "%s/tokenizer.json", dir);
    json_t *t = json_load_file(to, 0, NULL);
    json_t *v = json_object_get(json_object_get(t, "model"), "vocab");
    json_t *f = json_object_get(v, "F"), *g = json_object_get(v, "G");
    cr_assert(f && g);
    json_int_t fi = json_integer_value(f), gi = json_integer_value(g);
    json_object_set_new(v, "F", json_integer(gi));
    json_object_set_new(v, "G", json_integer(fi));
    cr_assert_eq(json_dump_file(t, to, 0), 0);
    json_decref(t);
}

Test(cli_draft, refuses_another_tokenizer)
{
    char dir[64], args[512], out[64];
    swapped_demo(dir, sizeof dir);
    snprintf(args, sizeof args, "run " DEMO " -p Once -n 4 --draft %s", dir);
    tu_expect_one_line_error(args, "the draft tokenizer's vocabulary differs at id");
    tu_expect_one_line_error(args, "\"G\", the target's \"F\"");
    snprintf(args, sizeof args, "rm -rf '%s'", dir);
    cr_assert_eq(tu_run(args, out, sizeof out), 0);
    tu_expect_one_line_error("run " DEMO " -p Once -n 4 --draft " MOERUN_SOURCE_DIR
                             "/tests/fixtures/qwen3_moe",
                             "the draft tokenizer has 256 token ids, the target's 512");
}

Test(cli_draft, kv_budget_split_for_equal_tokens)
{
    const char *fix = MOERUN_SOURCE_DIR "/tests/fixtures/qwen3_moe";
    struct moe_cli_engine o;
    moe_cli_engine_defaults(&o);
    o.model.path = fix;
    o.model.draft = fix;
    o.kv_budget = "1MiB";
    o.backend = "cpu-ref";
    o.threads = 1;
    struct moe_model m;
    struct moe_backend be;
    cr_assert_eq(moe_cli_open_model(&m, &o.model), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_cli_backend_start(&be, &o), MOE_OK, "%s", moe_last_error());
    struct moe_engine e;
    cr_assert_eq(moe_cli_engine_start(&o, &m, &be, 0, &e), MOE_OK, "%s", moe_last_error());
    size_t per = moe_kvcache_block_bytes(&m.cfg, (int)o.kv_block, MOE_DTYPE_F32);
    cr_assert_eq(e.o.spec.kind, MOE_SPEC_DRAFT);
    cr_assert_eq(e.r.kv.n_blocks, (int)((1 << 20) / (2 * per)), "half the blocks: the draft is "
                 "the target's shape");
    cr_assert_eq(e.draft.r.kv.n_blocks, e.r.kv.n_blocks, "as many draft blocks");
    moe_engine_free(&e); /* frees the draft model too */
    moe_backend_free(&be);
    moe_model_free(&m);
}

/* The speculation options that do not go together, each one line; and
 * sampled drafts at temperature 1 on the demo pair, accepted far more often
 * than the draft's argmax (the trained draft is close to the target). */
Test(cli_draft, sampled_drafts_and_refusals)
{
    tu_expect_one_line_error("run " DEMO " -p Once -n 4 --spec-draft-sample",
                             "--spec-draft-sample needs --draft DIR");
    tu_expect_one_line_error("run " DEMO " -p Once -n 4 --spec ngram --draft " DEMO,
                             "--draft and --spec ngram are two proposers; give one");
    double rate[2];
    for (int i = 0; i < 2; i++) {
        char cmd[1024], out[8192];
        snprintf(cmd, sizeof cmd, "%s run %s -p 'Once upon a time' -n 64 --temp 1 --seed 3 --draft %s %s 2>&1",
                 MOERUN_BINARY, DEMO, MOERUN_SOURCE_DIR "/models/demo-draft", i ? "--spec-draft-sample" : "");
        cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
        const char *a = strstr(out, "acceptance ");
        cr_assert(a && sscanf(a, "acceptance %lf%%", &rate[i]) == 1, "%s", out);
    }
    cr_assert(rate[1] > rate[0] + 10, "sampled drafts accepted %.1f%%, the argmax %.1f%%", rate[1], rate[0]);
}

/* --spec mtp: refused in one line, naming why: the demo model declares no
 * multi-token-prediction layers (before anything loads); the DeepSeek-V3
 * fixture declares one but, like many converted checkpoints, left its
 * weights out; and it is one proposer, not two. */
Test(cli_draft, spec_mtp_refused)
{
    tu_expect_one_line_error("run " DEMO " -p Once -n 4 --spec mtp",
                             "declares no multi-token-prediction layers (num_nextn_predict_layers)");
    tu_expect_one_line_error("run " FIXTURE_DIR "/deepseek_v3 --backend cpu --prompt-ids 1,2 -n 4 --spec mtp",
                             "model.layers.3.eh_proj.weight is not in the checkpoint: its "
                             "multi-token-prediction weights were left out");
    tu_expect_one_line_error("run " DEMO " -p Once -n 4 --spec mtp --draft " DEMO,
                             "--draft and --spec mtp are two proposers");
}

/* The speculation settings without a proposer would be silently ignored:
 * refused instead, naming what is missing. */
Test(cli_draft, settings_without_proposer_refused)
{
    tu_expect_one_line_error("run " DEMO " -p Once -n 4 --spec-tokens 3",
                             "--spec-tokens needs a proposer: --spec ngram|mtp or --draft DIR");
    tu_expect_one_line_error("run " DEMO " -p Once -n 4 --spec-adaptive",
                             "--spec-adaptive needs a proposer: --spec ngram|mtp or --draft DIR");
}
