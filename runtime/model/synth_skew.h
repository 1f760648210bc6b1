/* synth_skew.h - synthetic checkpoints whose routers prefer some experts by
 * a known amount (`--router-skew zipf:1.2`), the ground truth of load
 * studies.  The construction is in synth_skew.c and docs/stats-format.md. */
#pragma once

#include <jansson.h>

#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_skew_kind { MOE_SKEW_NONE, MOE_SKEW_ZIPF, MOE_SKEW_HOT };

struct moe_router_skew {
    enum moe_skew_kind kind;
    double s;          /* zipf exponent: p(rank r) proportional to 1/(r+1)^s */
    int hot;           /* hot: the `hot` first ranks share `frac` of the mass */
    double frac;
    char spec[64];     /* as given */
};

/* "zipf:S" (S >= 0), "hot:H:F" (1 <= H < E checked later, 0 < F < 1),
 * "none". */
MOE_MUST_USE enum moe_status moe_router_skew_parse(const char *spec, struct moe_router_skew *out);
/* Target top-1 probability of each expert of MoE layer ordinal j (E). */
MOE_MUST_USE enum moe_status moe_router_skew_probs(const struct moe_router_skew *sk,
                                                    const struct moe_config *c, uint64_t seed,
                                                    int j, double *p);
/* Rewrites the in-memory tensors of a moe_synth_tensors set (same cfg and
 * seed) so that the routers follow sk; held (n_layers x n_experts, or
 * NULL: all): the experts whose values the set holds (the others' stay
 * zero, untouched). */
MOE_MUST_USE enum moe_status moe_synth_apply_skew(struct moe_safetensors *st,
                                                   const struct moe_config *c,
                                                   const struct moe_router_skew *sk,
                                                   uint64_t seed, const uint8_t *held);
/* moe_model_synthetic with a router skew. */
MOE_MUST_USE enum moe_status moe_model_synthetic_skew(struct moe_model *m,
                                                       const struct moe_config *cfg,
                                                       enum moe_dtype dtype, uint64_t seed,
                                                       const struct moe_router_skew *sk);
/* New reference: {"spec", "seed", "top1_probability": [[E] per MoE layer]}. */
json_t *moe_router_skew_json(const struct moe_router_skew *sk, const struct moe_config *c,
                             uint64_t seed);

#ifdef __cplusplus
}
#endif
