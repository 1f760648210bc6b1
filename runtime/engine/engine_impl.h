/* engine_impl.h - what engine.c shares with engine_spec.c: the block
 * count of a length, and the speculation steps moe_engine_init and
 * moe_engine_step call. */
#pragma once

#include "runtime/engine/engine.h"

/* KV blocks of e's block size that hold `tokens` tokens. */
int moe_engine_blocks_for(const struct moe_engine *e, int tokens);
/* Fills the defaults of the speculation settings p and checks them. */
MOE_MUST_USE enum moe_status moe_engine_spec_resolve(struct moe_spec_opts *p);
/* Speculation for the step being assembled: up to K drafted tokens after
 * each of the nc scheduled decodes, taken from *budget (engine_spec.c). */
MOE_MUST_USE enum moe_status moe_engine_add_drafts(struct moe_engine *e, int nc, int *budget);
/* MOE_SPEC_MTP, after a step of nc chunks: the module's pass and the next
 * step's drafts. */
MOE_MUST_USE enum moe_status moe_engine_mtp_after_step(struct moe_engine *e, int nc);
