/* synth.h - seeded random weights for any configuration (see synth.c). */
#pragma once

#include "runtime/config.h"
#include "runtime/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Adds every tensor of cfg's model, with transformers 5 names, to st. */
MOE_MUST_USE enum moe_status moe_synth_tensors(struct moe_safetensors *st,
                                                const struct moe_config *cfg, enum moe_dtype dt,
                                                uint64_t seed);

/* The generator key of the index-th tensor added for seed (the device
 * generator, backend op synth_fill, takes the same key). */
uint64_t moe_synth_key(uint64_t seed, int index);

#ifdef __cplusplus
}
#endif
