/* cli_common.h - pieces shared by the commands: opening a model (a folder
 * or --synthetic CONFIG.json), parsing id lists and sizes, human units. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/model.h"

struct moe_cli_model_opts {
    const char *path;       /* model folder, or NULL */
    const char *synthetic;  /* config.json for in-memory random weights, or NULL */
    const char *dtype;      /* synthetic weight dtype: f32, f16, bf16 */
    uint64_t seed;
    const char *router_skew; /* synthetic router skew spec (runtime/synth_skew.h), or NULL */
};

/* Opens the model the options name; prints nothing. */
MOE_MUST_USE enum moe_status moe_cli_open_model(struct moe_model *m,
                                                 const struct moe_cli_model_opts *o);
/* "f32"/"f16"/"bf16" (any case) -> dtype. */
bool moe_cli_parse_dtype(const char *s, enum moe_dtype *out);
/* Comma-separated non-negative ids; *ids is malloc'd. */
MOE_MUST_USE enum moe_status moe_cli_parse_ids(const char *s, int32_t **ids, int *n);
/* A decimal integer in [lo, hi], whole string. */
bool moe_cli_parse_int(const char *s, long lo, long hi, long *out);
/* 1536 -> "1.50 KiB" */
const char *moe_cli_bytes(char *buf, size_t n, double bytes);
/* 1234567 -> "1.23M" */
const char *moe_cli_count(char *buf, size_t n, double x);
/* Prints "moerun CMD: message" to stderr and returns 1. */
int moe_cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double moe_cli_now(void);
