/* fuzz_cli.c - the small CLI parsers: the first byte picks
 * moe_cli_parse_budget (--kv-budget) or moe_cli_parse_ids (--ids); the rest
 * is the argument string. */
#include "runtime/cli/cli_common.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    char *s = fuzz_strndup(data + 1, size - 1);
    if (data[0] & 1) {
        size_t bytes = 0;
        (void)moe_cli_parse_budget(s, &bytes);
    } else {
        int32_t *ids = NULL;
        int n = 0;
        if (moe_cli_parse_ids(s, &ids, &n) == MOE_OK) {
            FUZZ_CHECK(ids && n > 0, "n %d", n);
            for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0, "id %d", ids[i]);
        }
        free(ids);
    }
    free(s);
    return 0;
}
