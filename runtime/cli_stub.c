#include <stdio.h>

#include "runtime/cli.h"

int moe_cli_inspect(int argc, char **argv) { fprintf(stderr, "not yet\n"); return 1; }
int moe_cli_run(int argc, char **argv) { fprintf(stderr, "not yet\n"); return 1; }
int moe_cli_synth(int argc, char **argv) { fprintf(stderr, "not yet\n"); return 1; }
