#include "runtime/cuda_util.h"
extern "C" bool moe_attention_mma_supported(const struct moe_kvcache *, const struct moe_attn_params *) { return false; }
extern "C" enum moe_status moe_attention_prefill_mma_cuda(cudaStream_t, float *, const float *, const struct moe_kvcache *, const struct moe_batch *, const struct moe_attn_params *) { return moe_fail(MOE_ERR_UNSUPPORTED, "emu: no mma"); }
