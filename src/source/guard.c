/*
 * source/guard.c -- the SIGBUS handler behind source/guard.h.
 *
 * One handler per process, installed with SA_SIGINFO | SA_NODEFER |
 * SA_ONSTACK the first time a source opens.  On a fault it looks at the
 * faulting thread's innermost guard: if the faulting address lies in the
 * guarded range, it jumps back (siglongjmp) to the read that set the guard,
 * which returns PL_ETRUNC.  Otherwise the signal is not ours and goes to the
 * disposition that was in place before: the previous handler is called, an
 * ignored signal stays ignored, and the default action is restored and the
 * signal raised again, so a foreign SIGBUS still ends the process as it
 * would have without the library.
 *
 * A handler installed later by someone else replaces ours; the library does
 * not fight over the signal (that program then gets the SIGBUS it would
 * have had before).
 */
#include "source/guard.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>

_Thread_local pl__guard *pl__guard_top __attribute__((tls_model("initial-exec")));

static struct sigaction guard_prev;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static int guard_rc = -1;

static void guard_handler(int sig, siginfo_t *si, void *uc) {
    pl__guard *g = pl__guard_top;
    uintptr_t a = si ? (uintptr_t)si->si_addr : 0;
    if (g && si && si->si_code > 0 && a >= g->lo && a < g->hi)
        siglongjmp(g->jb, 1);
    /* Not a fault of a guarded read: what would have happened without us. */
    const struct sigaction *p = &guard_prev;
    if (p->sa_flags & SA_SIGINFO) {
        if (p->sa_sigaction) p->sa_sigaction(sig, si, uc);
        return;
    }
    if (p->sa_handler == SIG_IGN) return;
    if (p->sa_handler != SIG_DFL && p->sa_handler) {
        p->sa_handler(sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    /* A fault re-executes the load and dies of the default action; a SIGBUS
       sent by kill(2) is raised again. */
    if (!si || si->si_code <= 0) raise(sig);
}

static void guard_do_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = guard_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    guard_rc = sigaction(SIGBUS, &sa, &guard_prev) == 0 ? 0 : -1;
}

void pl__guard_recover(void) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
}

int pl__guard_install(void) {
    pthread_once(&guard_once, guard_do_install);
    return guard_rc;
}
