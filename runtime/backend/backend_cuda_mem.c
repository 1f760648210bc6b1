/* backend_cuda_mem.c - the device memory the CUDA backend owns: weight
 * uploads and the further buffers prepare_model makes (stacked experts,
 * offload slots, flags), all freed together at destroy.  Calls no other
 * file of the backend. */
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend_cuda_impl.h"

const char *const moe_cuda_part_names[P_COUNT] = {"embed", "lm_head", "attention", "norms",
                                                  "dense_ffn", "router", "experts", "shared"};

enum moe_status moe_cuda_mem_keep(struct cuda_mem *m, void *p)
{
    if (m->n_owned == m->cap_owned) {
        size_t n = m->cap_owned ? 2 * m->cap_owned : 64;
        void **q = realloc(m->owned, n * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "cuda backend: buffer list");
        m->owned = q;
        m->cap_owned = n;
    }
    m->owned[m->n_owned++] = p;
    return MOE_OK;
}

enum moe_status moe_cuda_mem_buffer(struct cuda_mem *m, size_t bytes, void **out)
{
    MOE_CUDA_TRY(cudaMalloc(out, bytes ? bytes : 1));
    enum moe_status s = moe_cuda_mem_keep(m, *out);
    if (s != MOE_OK) {
        cudaFree(*out);
        *out = NULL;
    }
    return s;
}

void moe_cuda_mem_free(struct cuda_mem *m)
{
    for (size_t i = 0; i < m->n_owned; i++) cudaFree(m->owned[i]);
    free(m->owned);
    free(m->up);
    memset(m, 0, sizeof *m);
}
