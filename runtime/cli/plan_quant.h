/* plan_quant.h - what `moerun plan --quantize` predicts: each part's bytes
 * at the formats the CPU backend's prepare_model makes. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "runtime/backend/backend.h"
#include "runtime/model/model.h"

/* Whether --quantize q4 makes Q4_K (4.5 bits a weight) of a matrix pair
 * with rows of a and b values, on either backend (and q5_k Q5_K, 5.5
 * bits); else Q4_1 (5 bits). */
bool moe_plan_q4_k_rows(int64_t a, int64_t b);

/* The bytes of the parts --quantize quantizes: q8_0 at 9 bits a weight,
 * q4 at 5 (Q4_1) or, where rows are multiples of 256
 * (an attention's D and Hq Dh, a feed-forward's D and width), at 4.5
 * (Q4_K), with the LM head at 9; q4_k_m as q4 but the matrices
 * moe_quant_q4_k_m_dtype names at Q6_K (6.5625 bits) or Q8_0; q5_k and
 * q5_k_m as q4 and q4_k_m with Q5_K (5.5 bits) in place of Q4_K; FP8, MXFP4
 * and four-bit checkpoint matrices are read as stored, never requantized. */
void moe_plan_quant_sizes(const struct moe_config *cfg, enum moe_weight_quant q, struct moe_model_sizes *z);
