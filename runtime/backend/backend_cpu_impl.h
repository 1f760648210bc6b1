/* backend_cpu_impl.h - the CPU backends' context, shared by backend_cpu.c
 * (the ops) and backend_cpu_pack.c (the weights repacked or quantized at
 * prepare_model). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/backend/backend.h"
#include "runtime/cpu/gemm_fast.h"

struct cpu_arena {
    char *p;     /* owned: the packed matrices of one model */
    size_t size;
};

struct cpu_ctx {
    float *scratch;       /* (threads, scratch_per_thread) */
    size_t scratch_per_thread;
    int32_t *active;      /* (E) experts with rows, for the fast expert phase */
    int n_active_cap;
    int threads;
    enum moe_cpu_isa isa; /* MOE_CPU_ISA_REF for the reference table */
    bool panels;          /* bf16 matrices repacked into panels at prepare_model */
    struct cpu_arena *arenas; /* (n_arenas) packed weights, one per prepared model; owned */
    int n_arenas;
};

/* The model's matrices in this backend's layout (backend_cpu.c's header
 * comment): quantized (be->quant, the per-expert plan) and, with panels,
 * bf16 repacked, into an arena c owns; a model prepared before by this
 * backend is left as it is, one prepared by another is refused. */
MOE_MUST_USE enum moe_status moe_cpu_pack_model(struct cpu_ctx *c, const struct moe_backend *be,
                                                struct moe_model *m);
