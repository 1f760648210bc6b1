/* fuzz_config.c - the input is a config.json: whatever Jansson accepts goes
 * to moe_config_parse; accepted configs must be self-consistent enough for
 * the helpers that read them. */
#include <jansson.h>
#include "runtime/model/config.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *root = json_loadb((const char *)data, size, 0, NULL);
    if (!root) return 0; /* Jansson's own parser is not the target */
    struct moe_config cfg;
    memset(&cfg, 0xa5, sizeof cfg); /* parse must set every field it reports */
    if (moe_config_parse(&cfg, root, "fuzz/config.json") == MOE_OK) {
        FUZZ_CHECK(cfg.n_layers > 0 && cfg.n_layers <= MOE_MAX_LAYERS, "n_layers %d", cfg.n_layers);
        (void)moe_family_name(cfg.family);
        (void)moe_config_moe_layers(&cfg);
        (void)moe_config_kv_bytes_per_token(&cfg, MOE_DTYPE_BF16);
    }
    json_decref(root);
    return 0;
}
