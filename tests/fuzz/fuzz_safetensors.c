/* fuzz_safetensors.c - the whole input is a .safetensors file in memory:
 * parse it, look every tensor up by name and check what the parser promises
 * (data inside the buffer, nbytes = numel x dtype size), then close. */
#include "runtime/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct moe_safetensors st = {0};
    if (moe_safetensors_parse(&st, data, size, "fuzz", 0) == MOE_OK) {
        for (size_t i = 0; i < st.n_tensors; i++) {
            const struct moe_st_tensor *t = &st.tensors[i];
            FUZZ_CHECK(moe_safetensors_find(&st, t->name) == t, "find(%s)", t->name);
            size_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
            FUZZ_CHECK(numel * moe_dtype_size(t->dtype) == t->nbytes, "%s nbytes", t->name);
            const uint8_t *p = t->data;
            FUZZ_CHECK(t->nbytes == 0 || (p >= data && p + t->nbytes <= data + size), "%s data",
                       t->name);
            volatile uint8_t sink = t->nbytes ? p[t->nbytes - 1] : 0; /* ASan checks the range */
            (void)sink;
        }
        (void)moe_safetensors_find(&st, "");
        (void)moe_safetensors_find(&st, "model.embed_tokens.weight");
    }
    moe_safetensors_close(&st);
    moe_safetensors_close(&st); /* documented safe twice */
    return 0;
}
