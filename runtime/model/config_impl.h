/* config_impl.h - what config.c shares with config_quant.c. */
#pragma once

#include <jansson.h>

#include "runtime/model/config.h"

/* quantization_config of root (absent or null: nothing) into c's
 * weights_fp8, experts_mxfp4, q4_method and q4_zero_plus_one; c->family is
 * set.  Messages start with what. */
MOE_MUST_USE enum moe_status moe_config_parse_quantization(struct moe_config *c, json_t *root, const char *what);
