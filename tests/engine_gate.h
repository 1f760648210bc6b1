/* engine_gate.h - a gate a server test holds: the engine thread of the
 * `moerun serve` child (server_test.h) stopped at the entry of
 * moe_engine_step, as a debugger holds a thread at a breakpoint, while the
 * HTTP threads keep answering.  The product carries no hook for it: the
 * test is the server's parent, so it may trace it (ptrace); it finds the
 * engine thread by its name ("moerun-engine", server_engine.c), the
 * function in the binary's symbol table (nm) and the binary's load address
 * in /proc/PID/maps.
 *
 * Held there the engine thread holds stats_mu and no other lock
 * (engine_main): the submission queue (q_mu) and the metrics (m_mu) stay
 * free, so requests are queued or refused and /metrics answers - with
 * --no-stats; otherwise /metrics waits for stats_mu.  gate_step lets
 * exactly one step run and holds the thread at the next one; gate_release
 * takes the breakpoint out and lets the thread go.  Only the engine thread
 * calls moe_engine_step, so no other thread meets the breakpoint.
 * x86-64 and AArch64 (little-endian). */
#pragma once

#include <dirent.h>
#include <elf.h>
#include <stdint.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/user.h>

#include "tests/server_test.h"

static struct {
    pid_t tid;      /* the engine thread, traced by this process; 0: none */
    uintptr_t addr; /* moe_engine_step in the server */
    long orig;      /* the word at addr without the breakpoint */
} gate;

#if defined(__x86_64__)
#define GATE_PC_AFTER_TRAP 1 /* int3 stops after itself */
static inline long gate_patched(long w) { return (w & ~0xffL) | 0xcc; }
static inline uintptr_t gate_pc(void)
{
    struct user_regs_struct r;
    cr_assert_eq(ptrace(PTRACE_GETREGS, gate.tid, 0, &r), 0, "GETREGS: %s", strerror(errno));
    return (uintptr_t)r.rip;
}
static inline void gate_set_pc(uintptr_t pc)
{
    struct user_regs_struct r;
    cr_assert_eq(ptrace(PTRACE_GETREGS, gate.tid, 0, &r), 0);
    r.rip = pc;
    cr_assert_eq(ptrace(PTRACE_SETREGS, gate.tid, 0, &r), 0, "SETREGS: %s", strerror(errno));
}
#elif defined(__aarch64__)
#define GATE_PC_AFTER_TRAP 0 /* brk stops at itself */
static inline long gate_patched(long w) { return (w & ~0xffffffffL) | 0xd4200000L; /* brk #0 */ }
static inline uintptr_t gate_pc(void)
{
    struct user_regs_struct r;
    struct iovec io = {&r, sizeof r};
    cr_assert_eq(ptrace(PTRACE_GETREGSET, gate.tid, (void *)NT_PRSTATUS, &io), 0);
    return (uintptr_t)r.pc;
}
static inline void gate_set_pc(uintptr_t pc)
{
    struct user_regs_struct r;
    struct iovec io = {&r, sizeof r};
    cr_assert_eq(ptrace(PTRACE_GETREGSET, gate.tid, (void *)NT_PRSTATUS, &io), 0);
    r.pc = pc;
    cr_assert_eq(ptrace(PTRACE_SETREGSET, gate.tid, (void *)NT_PRSTATUS, &io), 0);
}
#else
#define GATE_UNSUPPORTED 1 /* gate_arm skips the test */
#define GATE_PC_AFTER_TRAP 0
static inline long gate_patched(long w) { return w; }
static inline uintptr_t gate_pc(void) { return 0; }
static inline void gate_set_pc(uintptr_t pc) { (void)pc; }
#endif

/* The next stop of the traced thread (waits up to 120 s); its status. */
static inline int gate_wait(void)
{
    int st = 0;
    for (int i = 0; i < 120000; i++) {
        pid_t w = waitpid(gate.tid, &st, __WALL | WNOHANG);
        cr_assert(w >= 0, "waitpid on the engine thread: %s", strerror(errno));
        if (w == gate.tid) {
            cr_assert(WIFSTOPPED(st), "the engine thread ended (status %#x)", st);
            return st;
        }
        sleep_ms(1);
    }
    cr_assert_fail("the engine thread did not stop within 120 s");
    return 0;
}

static inline void gate_poke(long word)
{
    cr_assert_eq(ptrace(PTRACE_POKETEXT, gate.tid, (void *)gate.addr, (void *)word), 0,
                 "POKETEXT: %s", strerror(errno));
}

/* Runs the thread until it reaches the breakpoint; signals meant for the
 * server are passed on. */
static inline void gate_hold(void)
{
    for (;;) {
        int st = gate_wait(), sig = WSTOPSIG(st);
        if (sig == SIGTRAP && (st >> 16) == 0) {
            cr_assert_eq(gate_pc(), gate.addr + GATE_PC_AFTER_TRAP, "a trap away from the gate");
            return;
        }
        const bool event = (st >> 16) != 0; /* an interrupt or group stop: nothing to deliver */
        cr_assert_eq(ptrace(PTRACE_CONT, gate.tid, 0, (void *)(intptr_t)(event ? 0 : sig)), 0);
    }
}

/* moe_engine_step's address in process pid: its symbol value, plus the
 * load address when the binary is position-independent. */
static inline uintptr_t gate_symbol(pid_t pid, const char *fn)
{
    char cmd[512], out[256];
    snprintf(cmd, sizeof cmd, "nm %s | awk '$3 == \"%s\" && ($2 == \"T\" || $2 == \"t\") {print $1}'",
             MOERUN_BINARY, fn);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "nm");
    uintptr_t sym = (uintptr_t)strtoull(out, NULL, 16);
    cr_assert(sym, "%s is not in the symbol table of %s", fn, MOERUN_BINARY);
    Elf64_Ehdr eh;
    FILE *f = fopen(MOERUN_BINARY, "rb");
    cr_assert(f && fread(&eh, sizeof eh, 1, f) == 1, "cannot read %s", MOERUN_BINARY);
    fclose(f);
    if (eh.e_type != ET_DYN) return sym;
    struct stat bst;
    cr_assert_eq(stat(MOERUN_BINARY, &bst), 0);
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    f = fopen(path, "r");
    cr_assert(f);
    uintptr_t base = 0;
    while (!base && fgets(line, sizeof line, f)) {
        unsigned long long start, off, ino;
        if (sscanf(line, "%llx-%*x %*s %llx %*s %llu", &start, &off, &ino) == 3 && off == 0 &&
            ino == (unsigned long long)bst.st_ino)
            base = (uintptr_t)start;
    }
    fclose(f);
    cr_assert(base, "%s is not mapped in the server", MOERUN_BINARY);
    return base + sym;
}

/* Traces the engine thread of the server (process pid) and puts the
 * breakpoint at moe_engine_step; the thread runs on until it gets there. */
static inline void gate_arm(pid_t pid)
{
#ifdef GATE_UNSUPPORTED
    cr_skip_test("engine_gate.h: breakpoints on x86-64 and AArch64 only");
#else
    char path[320], name[32];
    for (int i = 0; i < 6000 && !gate.tid; i++) { /* the thread names itself when it starts */
        snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
        DIR *d = opendir(path);
        cr_assert(d, "no %s", path);
        struct dirent *e;
        while (!gate.tid && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "/proc/%d/task/%s/comm", (int)pid, e->d_name);
            FILE *f = fopen(path, "r");
            if (f && fgets(name, sizeof name, f) && !strcmp(name, "moerun-engine\n"))
                gate.tid = atoi(e->d_name);
            if (f) fclose(f);
        }
        closedir(d);
        if (!gate.tid) sleep_ms(10);
    }
    cr_assert(gate.tid, "no thread named moerun-engine in the server");
    cr_assert_eq(ptrace(PTRACE_SEIZE, gate.tid, 0, 0), 0, "ptrace(SEIZE) of the engine thread: %s",
                 strerror(errno));
    cr_assert_eq(ptrace(PTRACE_INTERRUPT, gate.tid, 0, 0), 0);
    const int st = gate_wait();
    cr_assert_eq(st >> 16, PTRACE_EVENT_STOP, "stop %#x", st);
    gate.addr = gate_symbol(pid, "moe_engine_step");
    errno = 0;
    gate.orig = ptrace(PTRACE_PEEKTEXT, gate.tid, (void *)gate.addr, 0);
    cr_assert_eq(errno, 0, "PEEKTEXT: %s", strerror(errno));
    gate_poke(gate_patched(gate.orig));
    cr_assert_eq(ptrace(PTRACE_CONT, gate.tid, 0, 0), 0);
#endif
}

/* Held at the breakpoint: lets one engine step run, then holds the thread
 * at the next step's entry. */
static inline void gate_step(void)
{
    gate_poke(gate.orig);
    gate_set_pc(gate.addr);
    cr_assert_eq(ptrace(PTRACE_SINGLESTEP, gate.tid, 0, 0), 0);
    const int st = gate_wait();
    cr_assert_eq(WSTOPSIG(st), SIGTRAP, "single step: stop %#x", st);
    gate_poke(gate_patched(gate.orig));
    cr_assert_eq(ptrace(PTRACE_CONT, gate.tid, 0, 0), 0);
    gate_hold();
}

/* Held at the breakpoint: removes it and lets the thread go untraced. */
static inline void gate_release(void)
{
    gate_poke(gate.orig);
    gate_set_pc(gate.addr);
    cr_assert_eq(ptrace(PTRACE_DETACH, gate.tid, 0, 0), 0, "DETACH: %s", strerror(errno));
    gate.tid = 0;
}

/* .fini: a test that failed while tracing kills the server and reaps the
 * traced thread before the server process itself. */
static inline void gate_fini(void)
{
    if (gate.tid && sv.pid > 0) {
        kill(sv.pid, SIGKILL);
        waitpid(gate.tid, NULL, __WALL);
    }
    gate.tid = 0;
    fini();
}
