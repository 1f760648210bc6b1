/* cli_par.h - the command line across several processes (expert
 * parallelism, runtime/engine/ep.h).
 *
 * main reads the launch (runtime/comm/comm.h); with more than one rank it
 * opens the communicator and the layout here.  Rank 0 then runs the
 * command as usual: moe_cli_open_model places the experts and loads rank
 * 0's share, moe_cli_engine_start hands the layout to the engine together
 * with a description of the model and backend options (JSON), which the
 * layout sends to the other ranks with each runner.  Every other rank runs
 * moe_cli_par_follow instead of the command: it opens the same model
 * (its own experts) and backend from that description and follows rank 0's
 * steps until rank 0 finishes (moe_cli_par_finish).  Only rank 0 reads
 * input or prints. */
#pragma once

#include "runtime/cli/cli_common.h"
#include "runtime/comm/comm.h"
#include "runtime/engine/ep.h"

/* main: opens the layout over c (world size > 1). */
void moe_cli_par_start(struct moe_comm *c);
/* The layout, or NULL in a one-process run. */
struct moe_ep *moe_cli_par_ep(void);
/* --collectives' name (NULL: auto) as the layout's choice. */
enum moe_ep_coll moe_cli_par_collectives(const char *name);
/* Places the experts of a model of configuration c (contiguous, or as
 * --ep-placement says) and gives the experts this rank holds (*held,
 * n_layers x n_experts, malloc'd; NULL in a one-process run); --ep is
 * checked against the launch. */
struct moe_config;
MOE_MUST_USE enum moe_status moe_cli_par_share(const struct moe_cli_model_opts *o, const struct moe_config *c,
                                               uint8_t **held);
/* Rank 0 at engine start: what the other ranks need to open the same
 * model and backend be (the backend rank 0 chose, by name; kept until
 * moe_cli_par_finish); refuses options the layout cannot run. */
struct moe_backend;
MOE_MUST_USE enum moe_status moe_cli_par_describe(const struct moe_cli_engine *o, const struct moe_backend *be);
/* Rank 0, for a command that opens a runner itself (bench, ppl): describes
 * the options as above and sets ro's layout (NULL in a one-process run). */
struct moe_runner_opts;
MOE_MUST_USE enum moe_status moe_cli_par_runner(const struct moe_cli_engine *o, const struct moe_backend *be,
                                                struct moe_runner_opts *ro);
/* Every rank but 0: follows rank 0 until it finishes; the exit code. */
int moe_cli_par_follow(void);
/* Rank 0 at the end: stops the others; frees the layout. */
void moe_cli_par_finish(void);
