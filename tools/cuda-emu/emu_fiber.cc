/* The threads of a block as fibers on the launching thread.  The scheduler
 * makes passes over the block's threads; in each, every thread whose
 * barrier (__syncthreads, a warp's __syncwarp, a shuffle, an mma) is
 * complete runs alone up to its next barrier, or to its end.  The order
 * is ascending thread index in even blocks, descending in odd ones, so a
 * missing barrier shows: a thread reading what another writes in the same
 * stretch between barriers runs before the writer in one of two blocks
 * (in the one block of a one-block grid, when the reader's index is the
 * lower).  A block whose threads all wait at barriers no thread will
 * complete is a deadlock: reported, and the process aborts.  The order is
 * fixed, so a run is reproducible; a switch is a few instructions where an
 * OS thread per CUDA thread cost thread creation and futex wake-ups. */
#include "emu.h"
#include <cstdlib>
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace {

constexpr size_t STACK = 256 << 10; /* a fiber's stack, a guard page below it */

struct fiber {
#if defined(__x86_64__)
    void *sp = nullptr; /* saved stack pointer while switched out */
#else
    ucontext_t uc;
#endif
    char *stack = nullptr;
    const emu_bar *wait = nullptr; /* the barrier waited at, in its phase wait_phase */
    unsigned wait_phase = 0;
    bool done = false;
};

struct scheduler {
#if defined(__x86_64__)
    void *sp = nullptr;
#else
    ucontext_t uc;
#endif
    std::vector<fiber> fibers; /* stacks kept from launch to launch */
    fiber *cur = nullptr;
    void (*body)(void *) = nullptr;
    void *arg = nullptr;
};
thread_local scheduler S;

} // namespace

#if defined(__x86_64__)
/* emu_fiber_switch(&from_sp, to_sp): saves the callee-saved registers, the
 * SSE and x87 control words on the current stack, stores its pointer in
 * *from_sp and resumes the stack to_sp saved the same way. */
extern "C" void emu_fiber_switch(void **from, void *to);
asm(R"(
    .text
    .globl emu_fiber_switch
    .hidden emu_fiber_switch
    .type emu_fiber_switch, @function
emu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_fiber_switch, .-emu_fiber_switch
)");
static void to_scheduler(fiber *f) { emu_fiber_switch(&f->sp, S.sp); }
static void to_fiber(fiber *f) { emu_fiber_switch(&S.sp, f->sp); }
#else
static void to_scheduler(fiber *f) { swapcontext(&f->uc, &S.uc); }
static void to_fiber(fiber *f) { swapcontext(&S.uc, &f->uc); }
#endif

static void fiber_main()
{
    fiber *f = S.cur;
    S.body(S.arg);
    emu_ctx->warps[threadIdx.x >> 5]->bar.arrive_and_drop();
    emu_ctx->bar->arrive_and_drop();
    f->done = true;
    to_scheduler(f);
    abort(); /* a finished fiber is never resumed */
}

/* Fiber f set to start at fiber_main on its own stack. */
static void fiber_start(fiber *f)
{
    if (!f->stack) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void *p = mmap(nullptr, STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (p == MAP_FAILED) {
            perror("emu: a fiber's stack");
            abort();
        }
        mprotect(p, page, PROT_NONE); /* an overflow faults */
        f->stack = (char *)p + page;
    }
    f->done = false;
    f->wait = nullptr;
#if defined(__x86_64__)
    /* the frame emu_fiber_switch pops: control words (MXCSR's and the x87
     * defaults), six registers, then fiber_main as the return address,
     * 16-byte aligned so fiber_main starts as if called */
    uintptr_t *top = (uintptr_t *)(f->stack + STACK);
    top[-1] = 0;
    top[-2] = (uintptr_t)fiber_main;
    for (int i = 3; i <= 8; i++) top[-i] = 0;
    top[-9] = 0x1f80u | ((uintptr_t)0x037fu << 32);
    f->sp = top - 9;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = STACK;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, fiber_main, 0);
#endif
}

/* The last to arrive ends the phase and waits for the next pass like the
 * others, so that a pass runs one stretch of every thread, in order. */
void emu_bar::arrive_and_wait()
{
    fiber *f = S.cur;
    f->wait = this;
    f->wait_phase = phase;
    if (++arrived == expected) {
        arrived = 0;
        phase++;
    }
    to_scheduler(f);
}

void emu_bar::arrive_and_drop()
{
    expected--;
    if (arrived && arrived == expected) {
        arrived = 0;
        phase++;
    }
}

void emu_run_blocks(dim3 grid, dim3 block, size_t smem, void (*body)(void *), void *arg)
{
    gridDim = grid;
    blockDim = block;
    const unsigned nt = block.x * block.y * block.z;
    if (S.fibers.size() < nt) S.fibers.resize(nt);
    S.body = body;
    S.arg = arg;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                emu_block_ctx ctx;
                ctx.bar.reset(new emu_bar((int)nt));
                for (unsigned w = 0; w < (nt + 31) / 32; w++)
                    ctx.warps.emplace_back(new emu_warp((int)(nt - 32 * w < 32 ? nt - 32 * w : 32)));
                ctx.dyn.assign(smem + 16, 0xcd); /* garbage */
                emu_ctx = &ctx;
                blockIdx = uint3{bx, by, bz};
                for (unsigned t = 0; t < nt; t++) fiber_start(&S.fibers[t]);
                const unsigned blk = (bz * grid.y + by) * grid.x + bx;
                const bool down = blk & 1;
                for (unsigned left = nt; left;) {
                    bool ran = false;
                    for (unsigned i = 0; i < nt; i++) {
                        const unsigned t = down ? nt - 1 - i : i;
                        fiber *f = &S.fibers[t];
                        if (f->done || (f->wait && f->wait->phase == f->wait_phase)) continue;
                        f->wait = nullptr;
                        threadIdx = uint3{t, 0, 0};
                        S.cur = f;
                        to_fiber(f);
                        ran = true;
                        left -= f->done;
                    }
                    if (!ran) {
                        fprintf(stderr, "emu: block (%u,%u,%u) of %u threads deadlocked: %u threads wait at "
                                        "barriers the others never reach\n", bx, by, bz, nt, left);
                        abort();
                    }
                }
                S.cur = nullptr;
                emu_blocks_run++;
            }
}
