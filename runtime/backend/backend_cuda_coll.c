/* backend_cuda_coll.c - the CUDA backend's collectives on device memory
 * (backend.h, coll_*): one NCCL group per kind (runtime/cuda/nccl_cuda.h),
 * each collective queued on the backend's stream. */
#include "runtime/backend/backend_cuda_impl.h"

static enum moe_status group_of(struct cuda_ctx *c, int group, struct moe_nccl **out)
{
    if (group < 0 || group >= MOE_COLL_GROUPS || !c->coll[group])
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda backend: collective group %d is not open", group);
    *out = c->coll[group];
    return MOE_OK;
}

enum moe_status moe_cuda_coll_id(struct moe_backend *be, void *id)
{
    _Static_assert(MOE_COLL_ID_BYTES == MOE_NCCL_ID_BYTES, "a group id is NCCL's");
    MOE_CUDA_TRY(cudaSetDevice(ctx_of(be)->device));
    return id ? moe_nccl_unique_id(id) : moe_nccl_probe();
}

enum moe_status moe_cuda_coll_open(struct moe_backend *be, int group, const void *id, int rank, int size,
                                   int world_rank, double timeout_s)
{
    struct cuda_ctx *c = ctx_of(be);
    if (group < 0 || group >= MOE_COLL_GROUPS)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda backend: collective group %d", group);
    moe_cuda_coll_close(be, group);
    MOE_CUDA_TRY(cudaSetDevice(c->device));
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    return moe_nccl_open(&c->coll[group], id, rank, size, world_rank, timeout_s);
}

void moe_cuda_coll_close(struct moe_backend *be, int group)
{
    struct cuda_ctx *c = ctx_of(be);
    if (group < 0 || group >= MOE_COLL_GROUPS || !c->coll[group]) return;
    moe_nccl_free(c->coll[group]);
    c->coll[group] = NULL;
}

enum moe_status moe_cuda_coll_sum(struct moe_backend *be, int group, float *buf, size_t n, const char *what)
{
    struct moe_nccl *g = NULL;
    MOE_TRY(group_of(ctx_of(be), group, &g));
    return moe_nccl_sum(g, buf, n, ctx_of(be)->stream, what);
}

enum moe_status moe_cuda_coll_share(struct moe_backend *be, int group, float *buf, const size_t *offs,
                                    const char *what)
{
    struct moe_nccl *g = NULL;
    MOE_TRY(group_of(ctx_of(be), group, &g));
    return moe_nccl_share(g, buf, offs, ctx_of(be)->stream, what);
}

enum moe_status moe_cuda_coll_gather(struct moe_backend *be, int group, const float *mine, float *all,
                                     const size_t *offs, const char *what)
{
    struct moe_nccl *g = NULL;
    MOE_TRY(group_of(ctx_of(be), group, &g));
    return moe_nccl_gather(g, mine, all, offs, ctx_of(be)->stream, what);
}
