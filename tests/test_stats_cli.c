/* test_stats_cli.c - statistics end to end through the moerun binary:
 * run/bench write JSON, CSV and traces; `moerun stats` reads them (tables,
 * heatmap, SVG, compare, what-ifs); synth --router-skew and --synthetic
 * --router-skew build the same routing; one clear error line for misuse. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "runtime/stats/stats_analyze.h"
#include "tests/testutil.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/moerun-scli-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(stats_cli, .init = setup, .fini = teardown);

#define TINY MOERUN_SOURCE_DIR "/configs/tiny-moe.json"

Test(stats_cli, run_exports_and_stats_reads_them)
{
    static char cmd[4096], out[65536];
    snprintf(cmd, sizeof cmd, "%s run --synthetic %s --prompt-ids 1,2,3,4,5,6,7,8 -n 6 --backend cpu "
             "--stats-out %s/s.json --stats-csv %s/s.csv --trace-out %s/t 2>&1", MOERUN_BINARY, TINY,
             dir, dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    json_error_t err;
    snprintf(cmd, sizeof cmd, "%s/s.json", dir);
    json_t *j = json_load_file(cmd, 0, &err);
    cr_assert(j, "%s", err.text);
    json_t *tk = json_object_get(j, "tokens");
    cr_assert_eq(json_integer_value(json_object_get(tk, "prefill")), 8);
    cr_assert_eq(json_integer_value(json_object_get(tk, "decode")), 5);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "config"), "command")), "run");
    json_decref(j);

    snprintf(cmd, sizeof cmd, "%s stats %s/s.json --svg %s/h.svg 2>&1", MOERUN_BINARY, dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "4 MoE layers, 32 experts, top-4, 13 tokens"), "%s", out);
    cr_assert(strstr(out, "max/mean"), "%s", out);
    cr_assert(strstr(out, "load heatmap"), "%s", out);
    cr_assert(strstr(out, "per-layer imbalance"), "%s", out);
    snprintf(cmd, sizeof cmd, "head -c 4 %s/h.svg; tail -c 7 %s/h.svg", dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "<svg</svg>\n");

    snprintf(cmd, sizeof cmd, "%s stats %s/t --no-plot --pairs 0 --ep 2 --replicas 1 --cache 8 --topk 2 2>&1",
             MOERUN_BINARY, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "routing trace, 4 MoE layers, 32 experts, top-4, 13 tokens, 6 steps"), "%s", out);
    cr_assert(strstr(out, "expert parallelism over 2 devices"), "%s", out);
    cr_assert(strstr(out, "balanced+replicas"), "%s", out);
    cr_assert(strstr(out, "LFU"), "%s", out);
    cr_assert(strstr(out, "<- --topk"), "%s", out);
    cr_assert(!strstr(out, "load heatmap"), "%s", out);

    snprintf(cmd, sizeof cmd, "%s stats --compare %s/s.json %s/t.trace.json 2>&1", MOERUN_BINARY, dir,
             dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "mean total-variation distance between load shares: 0.0000 over 4 layers"),
              "the trace and the statistics of one run agree: %s", out);

    snprintf(cmd, sizeof cmd, "wc -l < %s/s.csv", dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert_eq(atoi(out), 1 + 4 * 32);
}

Test(stats_cli, skewed_checkpoint_and_synthetic_agree)
{
    static char cmd[4096], out[65536];
    snprintf(cmd, sizeof cmd, "%s synth %s %s/m --dtype bf16 --seed 2 --router-skew zipf:1.5 2>&1",
             MOERUN_BINARY, TINY, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    const char *args = "--prefill 64 --decode 2 --steps 2 --repeat 1 --backend cpu --json";
    snprintf(cmd, sizeof cmd, "%s bench %s/m %s --stats-out %s/a.json 2>&1", MOERUN_BINARY, dir, args, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "%s bench --synthetic %s --dtype bf16 --synthetic-seed 2 --router-skew zipf:1.5 %s "
             "--stats-out %s/b.json 2>&1", MOERUN_BINARY, TINY, args, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"stats\":true"), "%s", out);
    json_error_t err;
    char pa[128], pb[128];
    snprintf(pa, sizeof pa, "%s/a.json", dir);
    snprintf(pb, sizeof pb, "%s/b.json", dir);
    json_t *a = json_load_file(pa, 0, &err), *b = json_load_file(pb, 0, &err);
    cr_assert(a && b);
    cr_assert(json_equal(json_object_get(a, "layers"), json_object_get(b, "layers")),
              "same weights, same routing");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(b, "config"), "router_skew")),
                     "zipf:1.5");
    json_decref(a);
    json_decref(b);
    /* the checkpoint carries its ground truth */
    snprintf(pa, sizeof pa, "%s/m/config.json", dir);
    json_t *c = json_load_file(pa, 0, &err);
    json_t *sk = json_object_get(c, "moerun_router_skew");
    cr_assert_str_eq(json_string_value(json_object_get(sk, "spec")), "zipf:1.5");
    cr_assert_eq(json_array_size(json_object_get(sk, "top1_probability")), 4);
    json_decref(c);
}

Test(stats_cli, misuse_gives_one_clear_line)
{
    char args[1024], path[128];
    tu_expect_one_line_error("stats /nonexistent.json", "/nonexistent.json");
    snprintf(path, sizeof path, "%s/x.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"format\": \"something-else\"}", f);
    fclose(f);
    snprintf(args, sizeof args, "stats %s", path);
    tu_expect_one_line_error(args, "not moerun statistics or a routing trace");
    snprintf(args, sizeof args, "stats --compare %s", path);
    tu_expect_one_line_error(args, "exactly two files");
    snprintf(args, sizeof args, "bench --synthetic %s --no-stats --stats-out %s", TINY, path);
    tu_expect_one_line_error(args, "--no-stats contradicts");
    snprintf(args, sizeof args, "run --synthetic %s --prompt-ids 1 --stats-out %s/p.trace.json "
             "--trace-out %s/p", TINY, dir, dir);
    tu_expect_one_line_error(args, "both the statistics and the trace description");
    snprintf(args, sizeof args, "run %s/llama --prompt-ids 1 --router-skew zipf:1", FIXTURE_DIR);
    tu_expect_one_line_error(args, "--synthetic");
    snprintf(args, sizeof args, "run --synthetic %s --prompt-ids 1 --router-skew zipf:x", TINY);
    tu_expect_one_line_error(args, "router skew 'zipf:x'");
    snprintf(args, sizeof args, "run --synthetic %s --prompt-ids 1 --stats-steps 5:2", TINY);
    tu_expect_one_line_error(args, "moerun run: --stats-steps '5:2' (A:B with A < B");
    /* what-ifs need a trace */
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd, "%s run --synthetic %s --prompt-ids 1,2 -n 2 --backend cpu --stats-out "
             "%s/s.json 2>&1", MOERUN_BINARY, TINY, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "stats %s/s.json --ep 2", dir);
    tu_expect_one_line_error(args, "needs a routing trace");
    snprintf(cmd, sizeof cmd, "%s stats --help", MOERUN_BINARY);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "usage: moerun stats"));
}

/* Speculative decoding's rows in the statistics: the demo model with its
 * draft writes a JSON and a trace; `moerun stats --accepted-only` leaves out
 * the rows of rejected drafts, and what is left (JSON and trace alike)
 * equals, expert by expert, the same greedy run without speculation. */
Test(stats_cli, accepted_only_is_the_plain_run)
{
    static char cmd[4096], out[65536];
    const char *common = "run " MOERUN_SOURCE_DIR "/models/demo-moe -p 'Once upon a time, there was a "
                         "little cat named Tom.' -n 60 --threads 1 --backend cpu";
    snprintf(cmd, sizeof cmd, "%s %s --stats-out %s/plain.json 2>&1", MOERUN_BINARY, common, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd, "%s %s --draft %s --stats-out %s/spec.json --trace-out %s/spec 2>&1",
             MOERUN_BINARY, common, MOERUN_SOURCE_DIR "/models/demo-draft", dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "speculation: mean accepted length"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s stats %s/spec.json --no-plot --accepted-only 2>&1", MOERUN_BINARY, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "accepted rows only:"), "%s", out);
    char path[256];
    struct moe_sdata plain, spec, trace;
    snprintf(path, sizeof path, "%s/plain.json", dir);
    cr_assert_eq(moe_sdata_load(&plain, path), MOE_OK, "%s", moe_last_error());
    snprintf(path, sizeof path, "%s/spec.json", dir);
    cr_assert_eq(moe_sdata_load(&spec, path), MOE_OK, "%s", moe_last_error());
    snprintf(path, sizeof path, "%s/spec", dir);
    cr_assert_eq(moe_sdata_load(&trace, path), MOE_OK, "%s", moe_last_error());
    cr_assert(spec.tokens > plain.tokens, "verification computed rows the plain run did not");
    cr_assert_eq(trace.tokens_rejected, spec.tokens_rejected);
    int64_t left_out = moe_sdata_accepted_only(&spec);
    cr_assert(left_out > 0 && left_out == moe_sdata_accepted_only(&trace));
    cr_assert_eq(spec.tokens, plain.tokens);
    cr_assert_eq(trace.tokens, plain.tokens);
    for (int i = 0; i < plain.Lm * plain.E; i++) {
        cr_assert_eq(spec.load[i], plain.load[i], "JSON: layer %d expert %d", i / plain.E, i % plain.E);
        cr_assert_eq(trace.load[i], plain.load[i], "trace: layer %d expert %d", i / plain.E, i % plain.E);
    }
    moe_sdata_free(&plain);
    moe_sdata_free(&spec);
    moe_sdata_free(&trace);
}

/* Sets the first expert id of PREFIX.ids.npy (int16 or int32, npy v1). */
static void poke_first_id(const char *prefix, int id)
{
    char path[256];
    snprintf(path, sizeof path, "%s.ids.npy", prefix);
    FILE *f = fopen(path, "r+b");
    cr_assert(f, "%s", path);
    unsigned char h[10];
    cr_assert_eq(fread(h, 1, 10, f), 10);
    const long data = 10 + (long)(h[8] | h[9] << 8);
    char descr[256] = {0};
    const size_t hn = data - 10 < (long)sizeof descr - 1 ? (size_t)(data - 10) : sizeof descr - 1;
    cr_assert_eq(fread(descr, 1, hn, f), hn);
    const bool i2 = strstr(descr, "<i2") != NULL;
    cr_assert_eq(fseek(f, data, SEEK_SET), 0);
    if (i2) {
        int16_t v = (int16_t)id;
        cr_assert_eq(fwrite(&v, sizeof v, 1, f), 1);
    } else {
        int32_t v = id;
        cr_assert_eq(fwrite(&v, sizeof v, 1, f), 1);
    }
    fclose(f);
}

/* A trace with an expert id out of range, or whose trace.json disagrees
 * with its arrays on the token count, is refused with the file named. */
Test(stats_cli, broken_traces_are_refused_naming_the_file)
{
    char cmd[2048], out[4096], args[1024], prefix[128];
    snprintf(cmd, sizeof cmd, "%s run --synthetic %s --prompt-ids 1,2,3 -n 2 --backend cpu --trace-out %s/t "
             "2>&1 && cp %s/t.ids.npy %s/t.ids.keep", MOERUN_BINARY, TINY, dir, dir, dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(prefix, sizeof prefix, "%s/t", dir);
    snprintf(args, sizeof args, "stats %s/t --no-plot", dir);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>&1", MOERUN_BINARY, args);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "the untouched trace is read");
    poke_first_id(prefix, 999);
    tu_expect_one_line_error(args, "t.ids.npy: token 0, MoE layer 0, choice 0: expert id 999 is outside [0, 32)");
    poke_first_id(prefix, -7);
    tu_expect_one_line_error(args, "expert id -7 is outside");
    snprintf(cmd, sizeof cmd, "cp %1$s/t.ids.keep %1$s/t.ids.npy && sed -i 's/\"tokens\": *[0-9][0-9]*,/\"tokens\": 99,/' "
             "%1$s/t.trace.json && grep -q '\"tokens\": *99' %1$s/t.trace.json", dir);
    cr_assert_eq(tu_run(cmd, out, sizeof out), 0, "%s", out);
    tu_expect_one_line_error(args, "t.trace.json: \"tokens\" says 99, but");
}
