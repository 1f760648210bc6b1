/* cli_synth.c - `moerun synth CONFIG.json OUTDIR`: writes a checkpoint of
 * any configuration with seeded random weights (config.json +
 * model.safetensors) that moerun and transformers both load. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/cli/cli.h"
#include "runtime/cli/cli_common.h"
#include "runtime/cli/cli_opts.h"
#include "runtime/model/synth.h"
#include "runtime/model/synth_skew.h"

struct synth_opts {
    struct moe_cli_engine eng; /* --dtype, --router-skew */
    long seed;
    const char *layout;
};

static const char *const layouts[] = {"stacked", "per-expert", NULL};

static const struct moe_cli_opt rows[] = {
    {.name = "seed", .arg = "S", .kind = MOE_CLI_INT, .at = MOE_CLI_AT_CMD, MOE_CLI_FIELD(struct synth_opts, seed),
     .lo = 0, .hi = (double)LONG_MAX,
     .help = "weight seed (default 0)"},
    {.name = "layout", .arg = "stacked|per-expert", .kind = MOE_CLI_CHOICE, .at = MOE_CLI_AT_CMD,
     MOE_CLI_FIELD(struct synth_opts, layout), .choices = layouts,
     .help = "expert tensors stacked (default) or one per expert"},
};

static const char *const shared[] = {"dtype", "router-skew", NULL};

static const struct moe_cli_command synth_cmd = {
    .name = "synth",
    .usage = "usage: moerun synth CONFIG.json OUTDIR [--dtype bf16] [--seed S] [--router-skew SPEC]\n"
             "                    [--layout stacked|per-expert]\n\n"
             "Writes OUTDIR/config.json and OUTDIR/model.safetensors with random weights\n"
             "(uniform, std = initializer_range; norms 1) for any supported configuration.\n\n",
    .rows = rows,
    .n_rows = sizeof rows / sizeof rows[0],
    .shared = shared,
    .footer = "--router-skew zipf:S or hot:H:F makes every router choose its top-1 expert with\n"
              "known probabilities, written to config.json as moerun_router_skew\n"
              "(docs/stats-format.md).\n"
              "--layout per-expert writes one tensor per expert (legacy names, e.g.\n"
              "block_sparse_moe.experts.0.w1.weight for Mixtral) instead of the stacked\n"
              "transformers 5 mlp.experts.gate_up_proj; moerun loads both.\n",
    .engine_at = offsetof(struct synth_opts, eng),
};

static const char *torch_dtype(enum moe_dtype t)
{
    return t == MOE_DTYPE_F32 ? "float32" : t == MOE_DTYPE_F16 ? "float16" : "bfloat16";
}

int moe_cli_synth(int argc, char **argv)
{
    struct synth_opts o = {.layout = "stacked"};
    moe_cli_engine_defaults(&o.eng);
    struct moe_cli_args a;
    const int prc = moe_cli_parse(&synth_cmd, argc, argv, &o, &a);
    if (prc >= 0) return prc;
    if (a.n_pos != 2) {
        moe_cli_help(&synth_cmd, stderr);
        return 2;
    }
    const char *cfg_path = a.pos[0], *out = a.pos[1], *skew_arg = o.eng.model.router_skew;
    const uint64_t seed = (uint64_t)o.seed;
    enum moe_dtype dt = MOE_DTYPE_BF16;
    if (o.eng.model.dtype) (void)moe_cli_parse_dtype(o.eng.model.dtype, &dt); /* checked when parsed */
    const enum moe_synth_layout layout = !strcmp(o.layout, "stacked") ? MOE_SYNTH_STACKED : MOE_SYNTH_PER_EXPERT;
    if (skew_arg && layout != MOE_SYNTH_STACKED)
        return moe_cli_error("synth", "--router-skew needs the stacked layout");
    json_error_t jerr;
    json_t *root = json_load_file(cfg_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return moe_cli_error("synth", "%s: %s (line %d)", cfg_path, jerr.text, jerr.line);
    struct moe_config cfg;
    struct moe_router_skew skew = {0};
    struct moe_safetensors st = {0};
    const struct moe_st_tensor **list = NULL;
    int rc = 1;
    char path[4096];
    if (moe_config_parse(&cfg, root, cfg_path) != MOE_OK) {
        moe_cli_error("synth", "%s", moe_last_error());
        goto done;
    }
    if (skew_arg && moe_router_skew_parse(skew_arg, &skew) != MOE_OK) {
        moe_cli_error("synth", "%s", moe_last_error());
        goto done;
    }
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        moe_cli_error("synth", "cannot create %s: %s", out, strerror(errno));
        goto done;
    }
    if (moe_synth_tensors(&st, &cfg, dt, seed, layout) != MOE_OK ||
        moe_synth_apply_skew(&st, &cfg, &skew, seed, NULL) != MOE_OK) {
        moe_cli_error("synth", "%s", moe_last_error());
        goto done;
    }
    list = malloc(st.n_tensors * sizeof *list);
    if (!list) {
        moe_cli_error("synth", "out of memory");
        goto done;
    }
    for (size_t i = 0; i < st.n_tensors; i++) list[i] = &st.tensors[i];
    json_t *meta = json_pack("{s:s}", "format", "pt");
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    enum moe_status s = moe_safetensors_write(path, list, st.n_tensors, meta);
    json_decref(meta);
    if (s != MOE_OK) {
        moe_cli_error("synth", "%s", moe_last_error());
        goto done;
    }
    json_object_set_new(root, "dtype", json_string(torch_dtype(dt)));
    json_object_set_new(root, "torch_dtype", json_string(torch_dtype(dt)));
    if (skew.kind != MOE_SKEW_NONE)
        json_object_set_new(root, "moerun_router_skew",
                            moe_router_skew_json(&skew, &cfg, seed));
    snprintf(path, sizeof path, "%s/config.json", out);
    if (json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0) {
        moe_cli_error("synth", "cannot write %s", path);
        goto done;
    }
    fprintf(stderr, "moerun synth: wrote %zu tensors to %s\n", st.n_tensors, out);
    rc = 0;
done:
    free(list);
    moe_safetensors_close(&st);
    json_decref(root);
    return rc;
}
