/* config_sizes.c - what a parsed struct moe_config implies: the layers of
 * each kind (MoE, attention with K/V in the cache, linear attention, DSA
 * indexer) and the bytes a sequence holds per token or per linear layer.
 * Every size is checked for overflow: SIZE_MAX stands for "too large". */
#include "runtime/model/config.h"
#include "runtime/core/tensor.h"

#include <stdint.h>

int moe_config_kv_layers(const struct moe_config *cfg)
{
    return cfg->n_layers - moe_config_linear_layers(cfg);
}

int moe_config_kv_layer(const struct moe_config *cfg, int l)
{
    int n = l;
    for (int i = 0; i < l && i < MOE_MAX_LAYERS; i++) n -= cfg->layer_linear[i];
    return n;
}

int moe_config_linear_layers(const struct moe_config *cfg)
{
    return moe_config_linear_layer(cfg, cfg->n_layers);
}

int moe_config_linear_layer(const struct moe_config *cfg, int l)
{
    int n = 0; /* the table holds MOE_MAX_LAYERS (a parsed config has no more) */
    for (int i = 0; i < l && i < MOE_MAX_LAYERS; i++) n += cfg->layer_linear[i];
    return n;
}

int moe_config_conv_dim(const struct moe_config *cfg)
{
    return 2 * cfg->lin_k_heads * cfg->lin_k_dim + cfg->lin_v_heads * cfg->lin_v_dim;
}

size_t moe_config_state_floats(const struct moe_config *cfg)
{
    size_t conv, rec;
    if (moe_config_linear_layers(cfg) == 0) return 0;
    if (cfg->lin_conv < 1 || !moe_mul_size((size_t)moe_config_conv_dim(cfg), (size_t)(cfg->lin_conv - 1), &conv) ||
        !moe_mul_size((size_t)cfg->lin_v_heads * (size_t)cfg->lin_k_dim, (size_t)cfg->lin_v_dim, &rec) ||
        conv > SIZE_MAX - rec)
        return SIZE_MAX;
    return conv + rec;
}

size_t moe_config_state_bytes(const struct moe_config *cfg)
{
    size_t f = moe_config_state_floats(cfg), b;
    if (f == SIZE_MAX || !moe_mul_size(f, sizeof(float), &b) ||
        !moe_mul_size(b, (size_t)moe_config_linear_layers(cfg), &b))
        return SIZE_MAX;
    return b;
}

int moe_config_moe_layers(const struct moe_config *cfg)
{
    int n = 0;
    for (int l = 0; l < cfg->n_layers; l++) n += cfg->layer_moe[l];
    return n;
}

size_t moe_config_kv_row_bytes(int head_dim, enum moe_dtype kv_dtype)
{
    size_t b;
    if (head_dim <= 0) return SIZE_MAX;
    switch (kv_dtype) {
    case MOE_DTYPE_F32: case MOE_DTYPE_F16: case MOE_DTYPE_BF16:
        return moe_mul_size((size_t)head_dim, moe_dtype_size(kv_dtype), &b) ? b : SIZE_MAX;
    case MOE_DTYPE_F8E4M3: return (size_t)head_dim + sizeof(float); /* the bytes, the row's scale */
    default: return SIZE_MAX;
    }
}

int moe_config_dsa_layers(const struct moe_config *cfg)
{
    return moe_config_dsa_layer(cfg, cfg->n_layers);
}

int moe_config_dsa_layer(const struct moe_config *cfg, int l)
{
    int n = 0;
    if (cfg->dsa_topk <= 0) return 0;
    for (int i = 0; i < l && i < MOE_MAX_LAYERS; i++) n += !cfg->layer_dsa_shared[i];
    return n;
}

size_t moe_config_dsa_bytes_per_token(const struct moe_config *cfg)
{
    size_t b;
    if (cfg->dsa_topk <= 0) return 0;
    if (!moe_mul_size((size_t)cfg->dsa_dim * sizeof(float), (size_t)moe_config_dsa_layers(cfg), &b)) return SIZE_MAX;
    return b;
}

size_t moe_config_kv_bytes_per_token(const struct moe_config *cfg, enum moe_dtype kv_dtype)
{
    const size_t dsa = moe_config_dsa_bytes_per_token(cfg);
    size_t b = cfg->kv_lora_rank > 0 ? 1 : 2; /* MLA: one row read as K and V */
    const size_t row = moe_config_kv_row_bytes(cfg->head_dim, kv_dtype);
    if (row == SIZE_MAX || cfg->n_layers < 0 || cfg->n_kv_heads < 0 ||
        !moe_mul_size(b, (size_t)moe_config_kv_layers(cfg), &b) || !moe_mul_size(b, (size_t)cfg->n_kv_heads, &b) ||
        !moe_mul_size(b, row, &b) || dsa == SIZE_MAX || b > SIZE_MAX - dsa)
        return SIZE_MAX;
    return b + dsa;
}
