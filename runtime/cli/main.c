/* main.c - the moerun command line: dispatches to one function per command. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend.h"
#include "runtime/cli/cli.h"
#include "runtime/cli/cli_par.h"
#include "runtime/comm/comm.h"
#include "runtime/cpu/gemm_fast.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"inspect", moe_cli_inspect, "describe a checkpoint: family, parameters, bytes by part"},
    {"run", moe_cli_run, "generate from a prompt"},
    {"chat", moe_cli_chat, "interactive chat with the model's chat format"},
    {"serve", moe_cli_serve, "OpenAI-compatible HTTP server (streaming, /metrics, expert load)"},
    {"batch", moe_cli_batch, "serve a JSONL file of requests with continuous batching"},
    {"plan", moe_cli_plan, "memory planner and roofline predictions"},
    {"bench", moe_cli_bench, "prefill and decode throughput"},
    {"ppl", moe_cli_ppl, "perplexity over a text, and divergence from a saved base run"},
    {"tokenize", moe_cli_tokenize, "text to token ids, or ids to text (--decode)"},
    {"stats", moe_cli_stats, "expert-load analysis of statistics or traces: tables, plots, what-ifs"},
    {"synth", moe_cli_synth, "write a checkpoint of any configuration with random weights"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: moerun COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'moerun COMMAND --help' describes each command.\n");
}

/* The timeout of the launch's own steps (a torchrun-style rendezvous waits
 * this long for every rank): the command's --comm-timeout, read here since
 * the transport opens before the command parses its options. */
static double launch_timeout(int argc, char **argv)
{
    double t = MOE_CLI_COMM_TIMEOUT;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--comm-timeout") && i + 1 < argc) v = argv[i + 1];
        else if (!strncmp(argv[i], "--comm-timeout=", 15)) v = argv[i] + 15;
        char *end;
        const double x = v ? strtod(v, &end) : 0;
        if (v && end != v && !*end && x > 0 && x <= 86400) t = x;
    }
    return t;
}

/* Runs a command in this process's place in the launch: alone, as rank 0
 * of several (then stopping the others), or as a follower (cli_par.h). */
static int run_command(int (*fn)(int, char **), int argc, char **argv)
{
    struct moe_comm_launch l;
    struct moe_comm *c = NULL;
    if (moe_comm_launch_from_env(&l) != MOE_OK) {
        fprintf(stderr, "moerun: %s\n", moe_last_error());
        return 1;
    }
    if (l.size == 1) return fn(argc, argv);
    if (moe_comm_init(&c, &l, launch_timeout(argc, argv)) != MOE_OK) {
        fprintf(stderr, "moerun: rank %d: %s\n", l.rank, moe_last_error());
        return 1;
    }
    moe_cli_par_start(c);
    int rc;
    if (l.rank == 0) {
        rc = fn(argc, argv);
        fflush(stdout);
        moe_cli_par_finish();
    } else {
        rc = moe_cli_par_follow();
    }
    moe_comm_free(c);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) {
        printf("moerun %s\n", MOERUN_VERSION);
#ifdef MOERUN_HAVE_CUDA
        char why[256] = "";
        const int n = moe_cuda_device_count(why, sizeof why);
        printf("CUDA backend: built in; %d device(s)%s%s\n", n, n ? "" : ": ", n ? "" : why);
#else
        printf("CUDA backend: not built\n");
#endif
        printf("CPU kernels: %s\n", moe_cpu_isa_name(moe_cpu_isa_detect()));
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return run_command(commands[i].fn, argc - 1, argv + 1);
    fprintf(stderr, "moerun: unknown command '%s' (try 'moerun --help')\n", argv[1]);
    return 2;
}
