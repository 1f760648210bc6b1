/* synth.h - seeded random weights for any configuration (see synth.c). */
#pragma once

#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How expert weights are named and laid out. */
enum moe_synth_layout {
    MOE_SYNTH_STACKED,    /* transformers 5: mlp.experts.gate_up_proj (E, 2F, D), down_proj (E, D, F) */
    MOE_SYNTH_PER_EXPERT, /* legacy: one (F, D)/(D, F) tensor per expert and projection
                           * (Mixtral: block_sparse_moe.experts.e.w1/w3/w2), which older
                           * converters such as llama.cpp's convert_hf_to_gguf.py read */
};

/* Adds every tensor of cfg's model, with transformers names, to st. */
MOE_MUST_USE enum moe_status moe_synth_tensors(struct moe_safetensors *st,
                                                const struct moe_config *cfg, enum moe_dtype dt,
                                                uint64_t seed, enum moe_synth_layout layout);

/* The generator key of the index-th tensor added for seed (the device
 * generator, backend op synth_fill, takes the same key). */
uint64_t moe_synth_key(uint64_t seed, int index);
/* The E8M0 scale byte of every block of synthetic MXFP4 experts of
 * standard deviation std (random E2M1 codes have rms 2.93). */
uint8_t moe_synth_mxfp4_scale(float std);

#ifdef __cplusplus
}
#endif
