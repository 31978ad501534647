/*
 * source/guard.h -- reads through a file mapping that cannot kill the
 * process.  Not installed.
 *
 * A file that shrinks while it is mapped makes a load past its new end raise
 * SIGBUS.  The library's own copies out of a mapping run under a guard: a
 * thread-local record of the mapped byte range being read and a sigjmp_buf.
 * The process-wide SIGBUS handler (installed once, on the first source open)
 * jumps back to the guard when the faulting address lies in the range of the
 * faulting thread's innermost guard; any other SIGBUS goes to the handler
 * that was installed before (or the default action).  The caller turns the
 * jump into PL_ETRUNC naming the file.
 *
 * Usage (the function that calls sigsetjmp must still be running when the
 * fault comes, so the copy sits between enter and leave in one function):
 *
 *     pl__guard g;
 *     pl__guard_enter(&g, lo, len);
 *     if (sigsetjmp(g.jb, 0)) { pl__guard_leave(&g); pl__guard_recover(); return <fault>; }
 *     ... loads from [lo, lo + len) only; nothing that locks or allocates ...
 *     pl__guard_leave(&g);
 *
 * The cost is a sigsetjmp without the signal mask (no system call: the
 * handler is installed with SA_NODEFER, so the mask needs no restoring) and
 * two thread-local stores, a few ns per read.
 */
#ifndef POLYLOAD_SOURCE_GUARD_H
#define POLYLOAD_SOURCE_GUARD_H

#include <setjmp.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pl__guard {
    sigjmp_buf jb;
    uintptr_t lo, hi; /* the mapped bytes read: [lo, hi) */
    struct pl__guard *prev;
} pl__guard;

extern _Thread_local pl__guard *pl__guard_top
    __attribute__((tls_model("initial-exec")));

/* After the jump back from a fault: make sure SIGBUS is not left blocked in
 * this thread (a handler run without SA_NODEFER, as some runtimes that wrap
 * handlers install them, leaves it blocked, and the next fault would then
 * kill the process).  One system call, on the fault path only. */
void pl__guard_recover(void);

/* Install the SIGBUS handler once per process (later calls do nothing).
 * 0, or -1 if sigaction(2) failed (reads then run unguarded, as before). */
int pl__guard_install(void);

static inline void pl__guard_enter(pl__guard *g, const void *lo, size_t len) {
    g->lo = (uintptr_t)lo;
    g->hi = (uintptr_t)lo + len;
    g->prev = pl__guard_top;
    pl__guard_top = g;
    /* The handler runs on this thread: order the stores before the loads. */
    atomic_signal_fence(memory_order_seq_cst);
}

static inline void pl__guard_leave(pl__guard *g) {
    atomic_signal_fence(memory_order_seq_cst);
    pl__guard_top = g->prev;
}

#endif
