/* nccl_cuda.h - NCCL, the transport of the CUDA backend's collectives
 * (expert-parallel rows and tensor-parallel sums, runtime/engine/ep.h) on
 * device memory and the backend's stream.
 *
 * The library is loaded when first needed (dlopen of libnccl.so.2), so a
 * build with the CUDA backend still starts on machines without NCCL; a
 * group then fails to open with the loader's message and the engine keeps
 * its host-staged MPI path.  A group is the ranks that open it with the
 * same id: its rank 0 makes the id (moe_nccl_unique_id) and the caller
 * hands it to the others (over MPI).  Opening is non-blocking and bounded
 * by the timeout, so a rank that never joins fails the others instead of
 * hanging them.
 *
 * Every collective is queued on the given stream after the work already
 * there and waited for (the stream drained, NCCL's asynchronous error
 * polled): a collective that does not finish within the group's timeout
 * (a rank died, hangs or runs something else) prints one line naming this
 * rank, the collective and `what`, aborts the group and fails with
 * MOE_ERR_DEVICE; the caller ends the job, as the MPI transport does.
 * Messages set here name the collective, not the rank (the caller's).
 * Results are the same on every rank of a group (NCCL's reductions reduce
 * in one order and share the result). */
#pragma once

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>

#include "runtime/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

struct moe_nccl; /* opaque: one group */

/* Whether NCCL loads here (2.14 or later), saying why not. */
MOE_MUST_USE enum moe_status moe_nccl_probe(void);
/* A new group id into id (MOE_NCCL_ID_BYTES), made on the group's rank 0.
 * Fails when NCCL cannot be loaded, saying why. */
MOE_MUST_USE enum moe_status moe_nccl_unique_id(void *id);
/* Joins the group of `size` ranks named by id as `rank` on the current
 * device (new *out, free with moe_nccl_free); world_rank names this
 * process in messages.  Waits at most timeout_s for the others. */
MOE_MUST_USE enum moe_status moe_nccl_open(struct moe_nccl **out, const void *id, int rank, int size,
                                           int world_rank, double timeout_s);
/* Leaves the group (finalised within its timeout, else aborted).  Safe on NULL. */
void moe_nccl_free(struct moe_nccl *c);

/* buf (n floats, device) = the sum over the group of every rank's buf. */
MOE_MUST_USE enum moe_status moe_nccl_sum(struct moe_nccl *c, float *buf, size_t n, cudaStream_t s,
                                          const char *what);
/* In place over buf (device): floats [offs[r], offs[r + 1]) of rank r sent
 * to every rank, for each rank r (offs: host, size + 1, ascending), one
 * broadcast per rank with data, grouped. */
MOE_MUST_USE enum moe_status moe_nccl_share(struct moe_nccl *c, float *buf, const size_t *offs,
                                            cudaStream_t s, const char *what);
/* Rank r's mine (device, offs[r + 1] - offs[r] floats) into rank 0's all
 * (device) at offs[r], for each rank r, rank 0's own copied; all is read
 * only on rank 0 (NULL elsewhere).  Sends and receives, grouped. */
MOE_MUST_USE enum moe_status moe_nccl_gather(struct moe_nccl *c, const float *mine, float *all, const size_t *offs,
                                             cudaStream_t s, const char *what);

#ifdef __cplusplus
}
#endif
