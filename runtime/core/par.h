/* par.h - whether a CPU op's parallel region is worth entering. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <omp.h>

/* True when more than one thread could run the region and work (the op's
 * own measure) exceeds min_work.  Entering a region costs a team even when
 * its if clause is false or one thread runs it (libgomp allocates and frees
 * a team each time), more than a decode step's norm, rope or router; so the
 * ops run tiny work in the calling thread without one. */
static inline bool moe_par_worth(size_t work, size_t min_work)
{
    return work > min_work && omp_get_max_threads() > 1;
}
