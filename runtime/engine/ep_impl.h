/* ep_impl.h - the engine's own calls into expert parallelism (ep.c): the
 * runner announces itself, the forward pass sends its steps and gathers
 * expert rows. */
#pragma once

#include "runtime/core/batch.h"
#include "runtime/engine/ep.h"

struct moe_runner;
struct moe_expert_weights;
struct moe_runner_opts;

/* Rank 0, after its own init of r (status local): announces the runner to
 * the followers and gathers every rank's status; on success r's forward
 * pass sends its steps. */
MOE_MUST_USE enum moe_status moe_ep_runner_open(struct moe_ep *ep, struct moe_runner *r,
                                                const struct moe_runner_opts *o, enum moe_status local);
/* Rank 0: the followers free runner id. */
void moe_ep_runner_close(struct moe_ep *ep, int id);
/* Rank 0: broadcasts step b of runner `runner` (validated). */
MOE_MUST_USE enum moe_status moe_ep_send_step(struct moe_ep *ep, int runner, const struct moe_batch *b,
                                              int block_size);
/* Every rank: the expert output rows ye (in slot order, offsets
 * (n_slots + 1) of the layer's dispatch plan over its slots, host memory)
 * of every rank's slots gathered in place. */
MOE_MUST_USE enum moe_status moe_ep_gather(struct moe_ep *ep, float *ye, const int32_t *offsets, int D, int layer);
/* moe_ep_gather's bookkeeping alone (a transport of the backend's moves
 * the rows): ep->counts and ep->displs (rows per rank, host) from the
 * offsets, the step counters; returns the layer's rows of all ranks. */
int32_t moe_ep_gather_count(struct moe_ep *ep, const int32_t *offsets, int layer);
/* Frees the placement (ep_place.c). */
void moe_ep_unplace(struct moe_ep *ep);
/* The expert table of layer l seen by slot: x's experts repeated as the
 * layer's slots say (its pointer arrays, biases and column orders; F and
 * D the biases' widths), for the experts op over the slots.  Freed with
 * moe_ep_slot_view_free. */
MOE_MUST_USE enum moe_status moe_ep_slot_view(const struct moe_ep *ep, int l, const struct moe_expert_weights *x,
                                              struct moe_expert_weights *out);
void moe_ep_slot_view_free(struct moe_expert_weights *v);

/* Tensor parallelism (tp.c).  buf (n floats, host memory) becomes the sum
 * of the group's bufs, added in rank order on every rank (so every rank
 * holds the same bits, which the replicated routing needs). */
MOE_MUST_USE enum moe_status moe_ep_tp_sum(struct moe_ep *ep, float *buf, size_t n, const char *what, int layer);
/* The group's rows of x (T rows of w floats each, this rank's columns)
 * gathered into whole rows of `parts` parts: *full (T, w * parts), in the
 * ep's scratch.  parts divides tp; part p is held by ranks [p tp / parts,
 * (p + 1) tp / parts) (key/value heads held by several ranks). */
MOE_MUST_USE enum moe_status moe_ep_tp_rows(struct moe_ep *ep, const float *x, int T, int w, int parts,
                                            float **full, const char *what, int layer);
/* This rank's tensor-parallel group into *out (out may be NULL), made at
 * its first use: every rank must call it at the same point. */
MOE_MUST_USE enum moe_status moe_ep_tp_comm(struct moe_ep *ep, struct moe_comm **out);
/* x (T, w) = this rank's part of full (T, w * parts). */
void moe_ep_tp_take(const struct moe_ep *ep, float *x, const float *full, int T, int w, int parts);
