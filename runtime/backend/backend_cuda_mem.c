/* backend_cuda_mem.c - the device memory the CUDA backend owns: weight
 * uploads and the further buffers prepare_model makes (stacked experts,
 * offload slots, flags) and the host tables kept beside them, all freed
 * together at destroy.  Calls no other
 * file of the backend. */
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend_cuda_impl.h"

const char *const moe_cuda_part_names[P_COUNT] = {"embed", "lm_head", "attention", "norms",
                                                  "dense_ffn", "router", "experts", "shared"};

/* Appends p to the list (*list, *n of *cap). */
static enum moe_status keep(void ***list, size_t *n, size_t *cap, void *p)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        void **q = realloc(*list, c * sizeof *q);
        if (!q) return moe_fail(MOE_ERR_NOMEM, "cuda backend: buffer list");
        *list = q;
        *cap = c;
    }
    (*list)[(*n)++] = p;
    return MOE_OK;
}

enum moe_status moe_cuda_mem_keep(struct cuda_mem *m, void *p)
{
    return keep(&m->owned, &m->n_owned, &m->cap_owned, p);
}

enum moe_status moe_cuda_mem_keep_host(struct cuda_mem *m, void *p)
{
    return keep(&m->host, &m->n_host, &m->cap_host, p);
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
    for (size_t i = 0; i < m->n_host; i++) free(m->host[i]);
    free(m->host);
    free(m->up);
    memset(m, 0, sizeof *m);
}
