/* cli_draft.h - `--draft DIR`: the draft model of speculative decoding
 * (runtime/engine/spec_draft.h) as the commands load it.
 *
 * Before any weights are read, the draft's tokenizer must be the target's
 * (moe_tokenizer_same: every token id, every added and special token).
 * The engine is then built with the draft: loaded from DIR, run on the
 * target's backend (the CPU backends keep one arena per prepared model;
 * one CUDA backend prepares and runs several models too, but its expert
 * offload, --gpu-experts, is shaped for the target, so with offload the
 * draft gets a CUDA backend of its own with every expert resident), its KV
 * pool as many tokens as the target's: --kv-budget is split so that each
 * block costs the target's bytes plus the draft's.  The engine owns the
 * draft model (and its backend) from then on.
 *
 * `--spec mtp` goes through the same door: the proposer is the target's
 * multi-token-prediction module 0 (moe_model_mtp_view, borrowing the
 * target's weights), on the target's backend, its pool split from
 * --kv-budget the same way. */
#pragma once

#include "runtime/cli/cli_common.h"
#include "runtime/engine/engine.h"

/* The tokenizers of o->path and o->draft are the same (MOE_OK when there
 * is no --draft); otherwise one line naming the first difference. */
MOE_MUST_USE enum moe_status moe_cli_draft_check(const struct moe_cli_model_opts *o);
/* With --draft: loads the draft, and sets eo->spec to the draft proposer
 * (kind, draft, draft_be, draft_blocks, draft_release; the other settings
 * are left as they are) and, under --kv-budget, eo->n_blocks to the
 * target's share of it.  The draft is released by moe_engine_free, or by
 * eo->spec.draft_release when moe_engine_init fails. */
MOE_MUST_USE enum moe_status moe_cli_draft_attach(const struct moe_cli_engine *o,
                                                   const struct moe_model *m,
                                                   struct moe_backend *be,
                                                   struct moe_engine_opts *eo);
