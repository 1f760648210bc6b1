/* cli.h - one entry point per moerun command.  Each takes the arguments
 * after the program name (argv[0] is the command), prints one clear line on
 * error and returns the process exit code. */
#pragma once

int moe_cli_inspect(int argc, char **argv);
int moe_cli_run(int argc, char **argv);
int moe_cli_synth(int argc, char **argv);
int moe_cli_bench(int argc, char **argv);
/* `moerun bench verify`: a verification step's cost (bench_verify.c). */
int moe_cli_bench_verify(int argc, char **argv);
int moe_cli_tokenize(int argc, char **argv);
int moe_cli_batch(int argc, char **argv);
int moe_cli_plan(int argc, char **argv);
int moe_cli_chat(int argc, char **argv);
int moe_cli_stats(int argc, char **argv);
int moe_cli_serve(int argc, char **argv);
int moe_cli_ppl(int argc, char **argv);
