/* cli_opts.h - the command line's one option table.
 *
 * Every option is one row: its long name, short letter, argument name,
 * help text, kind, target field and range (or choices).  The options more
 * than one command takes are rows of one shared table (cli_opts.c, grouped
 * as model, engine, spec, offload and stats); each command adds its own rows and
 * names the shared ones it takes.  From those rows the parser builds
 * getopt_long's table, prints --help, checks every value and writes it to
 * its field, so an option means the same wherever it is taken and a bad
 * value is always one line:
 *
 *     moerun CMD: --kv-block '0' (an integer from 1 to 4096)
 *
 * Targets are byte offsets into one of four structs: the command's own
 * options struct, or the struct moe_cli_engine, moe_cli_stats or
 * moe_cli_sampling it holds.  A field holds its default before parsing.
 * A row without a name is a heading in the help. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum moe_cli_opt_kind {
    MOE_CLI_FLAG,   /* no argument; sets a bool to true */
    MOE_CLI_INT,    /* decimal integer in [lo, hi]; an int, long, int64_t or uint64_t field */
    MOE_CLI_SIZE,   /* bytes with an optional unit (moe_cli_parse_budget), at least lo; a size_t */
    MOE_CLI_DOUBLE, /* number in [lo, hi] (flags open either end); a float or double */
    MOE_CLI_STRING, /* any text; a const char * pointing into argv */
    MOE_CLI_CHOICE, /* one of choices; the const char * of the name given */
    MOE_CLI_LIST,   /* repeatable text; a struct moe_cli_list, at most hi items */
    MOE_CLI_CUSTOM, /* parse(arg, field) checks and stores; `what` says what it takes */
};

enum moe_cli_opt_at { MOE_CLI_AT_CMD, MOE_CLI_AT_ENGINE, MOE_CLI_AT_STATS, MOE_CLI_AT_SAMPLING };

enum { MOE_CLI_LO_OPEN = 1, MOE_CLI_HI_OPEN = 2 };

struct moe_cli_list {
    const char *v[16];
    int n;
};

struct moe_cli_opt {
    const char *name;            /* long name without the dashes */
    char letter;                 /* short option, or 0 */
    const char *arg;             /* argument name in the help; NULL for a flag */
    const char *help;            /* '\n' continues the text on the next line */
    enum moe_cli_opt_kind kind;
    enum moe_cli_opt_at at;      /* which struct the field is in */
    size_t off, size;            /* the field: MOE_CLI_FIELD(type, member) */
    double lo, hi;               /* INT, SIZE, DOUBLE: the range; LIST: hi is the most items */
    unsigned open;               /* DOUBLE: MOE_CLI_LO_OPEN, MOE_CLI_HI_OPEN */
    const char *const *choices;  /* CHOICE: NULL-terminated */
    bool (*parse)(const char *arg, void *field); /* CUSTOM */
    const char *what;            /* CUSTOM: what it takes, for the error ("f32, f16, bf16 or fp8") */
};

#define MOE_CLI_FIELD(type, member) .off = offsetof(type, member), .size = sizeof(((type *)0)->member)

/* A command: its name, its usage text (the lines before the options), its
 * own rows, the shared options it takes (names, or a group: "@model",
 * "@engine", "@spec", "@offload", "@stats", "@sampling"; NULL-terminated) and the
 * text after the options (or NULL).  Where the shared structs sit in the
 * command's options struct: engine_at, stats_at, sampling_at. */
struct moe_cli_command {
    const char *name;
    const char *usage;
    const struct moe_cli_opt *rows;
    int n_rows;
    const char *const *shared;
    const char *footer;
    size_t engine_at, stats_at, sampling_at;
};

#define MOE_CLI_MAX_OPTS 96

/* What one parse found: the rows in the order of the help, which of them
 * were given, and the arguments that are not options. */
struct moe_cli_args {
    const struct moe_cli_command *cmd;
    const struct moe_cli_opt *rows[MOE_CLI_MAX_OPTS];
    bool given[MOE_CLI_MAX_OPTS];
    int n_rows;
    char **pos;
    int n_pos;
};

/* The sampling options of run and chat: the values given (moe_cli_given
 * says which) and the tokens to generate. */
struct moe_cli_sampling {
    float temperature, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty;
    int top_k;
    long seed;
    long max_tokens;
};
struct moe_sampling;
/* Overlays on s the sampling options a gave. */
void moe_cli_sampling_apply(const struct moe_cli_args *a, const struct moe_cli_sampling *o, struct moe_sampling *s);

/* The rows shared by the commands, and how many (for the tests). */
extern const struct moe_cli_opt moe_cli_shared_opts[];
extern const int moe_cli_n_shared_opts;

/* Parses argv (argv[0] is the command) into opts, the command's options
 * struct.  Returns -1 to go on, or the exit code the command returns: 0
 * after --help (printed to stdout), 1 after a bad value, 2 after an unknown
 * option or a missing value (one line, moe_cli_getopt). */
int moe_cli_parse(const struct moe_cli_command *cmd, int argc, char **argv, void *opts,
                  struct moe_cli_args *a);
/* Whether the option name, or another that sets the same field, was given
 * (false when the command does not take it). */
bool moe_cli_given(const struct moe_cli_args *a, const char *name);
/* The command's help: usage, one line (or more) per option, footer. */
void moe_cli_help(const struct moe_cli_command *cmd, FILE *f);
