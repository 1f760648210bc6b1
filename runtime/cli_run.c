/* cli_run.c - `moerun run`: greedy generation from token ids. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli.h"
#include "runtime/cli_common.h"
#include "runtime/runner.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moerun run MODEL_DIR --prompt-ids 1,2,3 [-n N] [options]\n"
            "       moerun run --synthetic CONFIG.json --prompt-ids 1,2,3 [-n N] [options]\n\n"
            "Greedy generation; prints the generated token ids, comma-separated, on stdout\n"
            "and timings on stderr.\n\n"
            "  --prompt-ids LIST  prompt token ids, comma-separated\n"
            "  -n, --max-tokens N tokens to generate (default 16)\n"
            "  --chunk N          prefill chunk size in tokens (default 256)\n"
            "  --kv-block N       KV cache block size in tokens (default 16)\n"
            "  --backend NAME     auto, cpu (fast kernels), cpu-ref (reference) or cuda\n"
            "                     (default auto)\n"
            "  --threads N        CPU threads (default: all cores)\n"
            "  --synthetic CONFIG random weights for CONFIG.json, built in memory\n"
            "  --dtype T          synthetic weight dtype: f32, f16, bf16 (default bf16)\n"
            "  --seed S           synthetic weight seed (default 0)\n");
}

int moe_cli_run(int argc, char **argv)
{
    struct moe_cli_model_opts mo = {0};
    const char *ids_arg = NULL, *backend = "auto";
    long n_new = 16, chunk = 256, block = 16, threads = 0, seed = 0;
    static const struct option opts[] = {
        {"prompt-ids", required_argument, 0, 'i'}, {"max-tokens", required_argument, 0, 'n'},
        {"chunk", required_argument, 0, 'c'},      {"kv-block", required_argument, 0, 'b'},
        {"backend", required_argument, 0, 'B'},    {"threads", required_argument, 0, 't'},
        {"synthetic", required_argument, 0, 's'},  {"dtype", required_argument, 0, 'd'},
        {"seed", required_argument, 0, 'S'},       {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
        switch (c) {
        case 'i': ids_arg = optarg; break;
        case 'n':
            if (!moe_cli_parse_int(optarg, 0, 1 << 24, &n_new))
                return moe_cli_error("run", "-n '%s' is not a count", optarg);
            break;
        case 'c':
            if (!moe_cli_parse_int(optarg, 1, 1 << 20, &chunk))
                return moe_cli_error("run", "--chunk '%s' is not a positive count", optarg);
            break;
        case 'b':
            if (!moe_cli_parse_int(optarg, 1, 4096, &block))
                return moe_cli_error("run", "--kv-block '%s' must be 1..4096", optarg);
            break;
        case 'B': backend = optarg; break;
        case 't':
            if (!moe_cli_parse_int(optarg, 1, 4096, &threads))
                return moe_cli_error("run", "--threads '%s' must be 1..4096", optarg);
            break;
        case 's': mo.synthetic = optarg; break;
        case 'd': mo.dtype = optarg; break;
        case 'S':
            if (!moe_cli_parse_int(optarg, 0, __LONG_MAX__, &seed))
                return moe_cli_error("run", "--seed '%s' is not a non-negative integer", optarg);
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    mo.seed = (uint64_t)seed;
    if (optind < argc) mo.path = argv[optind++];
    if (optind < argc) return moe_cli_error("run", "unexpected argument '%s'", argv[optind]);
    if (!ids_arg) return moe_cli_error("run", "no prompt: give --prompt-ids 1,2,3");

    int32_t *prompt = NULL, *out = NULL;
    int n_prompt = 0, rc = 1;
    struct moe_model m = {0};
    struct moe_backend be = {0};
    struct moe_runner r = {0};
    struct moe_seq seq = {0};
    if (moe_cli_parse_ids(ids_arg, &prompt, &n_prompt) != MOE_OK) {
        moe_cli_error("run", "%s", moe_last_error());
        goto done;
    }
    double t0 = moe_cli_now();
    if (moe_cli_open_model(&m, &mo) != MOE_OK) {
        moe_cli_error("run", "%s", moe_last_error());
        goto done;
    }
    /* Check sizes before any allocation. */
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= m.cfg.vocab) {
            moe_cli_error("run", "prompt token %d (item %d) is outside the vocabulary of %d",
                          prompt[i], i + 1, m.cfg.vocab);
            goto done;
        }
    if ((long)n_prompt + n_new > m.cfg.max_pos) {
        moe_cli_error("run", "prompt of %d tokens + %ld new tokens exceeds the model's context of %d",
                      n_prompt, n_new, m.cfg.max_pos);
        goto done;
    }
    if (moe_backend_init(&be, backend, (int)threads) != MOE_OK) {
        moe_cli_error("run", "%s", moe_last_error());
        goto done;
    }
    int total = n_prompt + (int)n_new;
    struct moe_runner_opts o = {.max_tokens = (int)(chunk < n_prompt ? chunk : n_prompt),
                                .max_seqs = 1, .max_logits = 1, .block_size = (int)block,
                                .n_blocks = (total + (int)block - 1) / (int)block};
    if (moe_runner_init(&r, &m, &be, &o) != MOE_OK) {
        moe_cli_error("run", "%s", moe_last_error());
        goto done;
    }
    out = malloc(((size_t)n_new + 1) * sizeof *out);
    double t1 = moe_cli_now();
    if (!out || moe_runner_greedy(&r, &seq, prompt, n_prompt, (int)n_new, (int)chunk, out) != MOE_OK) {
        moe_cli_error("run", "%s", out ? moe_last_error() : "out of memory");
        goto done;
    }
    double t2 = moe_cli_now();
    for (long i = 0; i < n_new; i++) printf(i ? ",%d" : "%d", out[i]);
    printf("\n");
    fprintf(stderr, "moerun run: %d prompt tokens, %ld generated; load %.3f s, generation %.3f s "
            "(%.1f tokens/s overall)\n", n_prompt, n_new, t1 - t0, t2 - t1,
            (double)(n_prompt + n_new) / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
    rc = 0;
done:
    moe_seq_free(&r, &seq);
    moe_runner_free(&r);
    moe_backend_free(&be);
    moe_model_free(&m);
    free(prompt);
    free(out);
    return rc;
}
