/*
 * prefetch.c -- reads requested ahead of time.
 *
 * The planner knows every byte range the next steps will read; the loader
 * posts them here as soon as a step is planned (pl__rprefetch_post), and one
 * thread per prefetcher makes them present in the cache
 * (pl__rfile_ensure_many: adjacent chunks in one request, up to
 * policy.concurrency requests at once) while the steps before are built.
 * Bounded: at most max_queued bytes of ranges wait (more are dropped: the
 * read fetches them itself), and the fetch of one batch holds at most the
 * cache's batch bound in memory.  A failed prefetch is forgotten: the read
 * that needs the bytes retries and reports.  The read that comes while its
 * chunk is being prefetched waits for that fetch instead of sending its own
 * (cache.c's in-flight marks).
 */
#include "source/remote/remote.h"

#include <stdlib.h>
#include <string.h>

typedef struct pl__pfr {
    pl__rfile *f;
    int64_t off, len;
} pl__pfr;

struct pl__rprefetch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop;
    pl__pfr *q;
    int64_t n, cap, queued_bytes, max_queued;
    int64_t dropped;
};

static int pfr_cmp(const void *a, const void *b) {
    const pl__pfr *x = a, *y = b;
    if (x->f != y->f) return (uintptr_t)x->f < (uintptr_t)y->f ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

static void *prefetch_main(void *arg) {
    pl__rprefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->n == 0) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        pl__pfr *batch = p->q;
        int64_t n = p->n;
        p->q = NULL;
        p->n = p->cap = 0;
        p->queued_bytes = 0;
        pthread_mutex_unlock(&p->mu);
        qsort(batch, (size_t)n, sizeof *batch, pfr_cmp);
        int64_t *off = pl__calloc(1, (size_t)n * sizeof *off), *len = pl__calloc(1, (size_t)n * sizeof *len);
        for (int64_t i = 0; off && len && i < n;) {
            int64_t j = i;
            while (j < n && batch[j].f == batch[i].f && j - i < (1 << 20)) {
                off[j - i] = batch[j].off;
                len[j - i] = batch[j].len;
                j++;
            }
            char err[PL__ERRMSG_CAP];
            (void)pl__rfile_ensure_many(batch[i].f, off, len, (int)(j - i), err, sizeof err);
            i = j;
        }
        free(off);
        free(len);
        free(batch);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int pl__rprefetch_create(int64_t max_queued, pl__rprefetch **out) {
    pl__rprefetch *p = pl__calloc(1, sizeof *p);
    if (!p) return PL_ENOMEM;
    p->max_queued = max_queued > 0 ? max_queued : (int64_t)256 << 20;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    *out = p;
    return PL_OK;
}

void pl__rprefetch_post(pl__rprefetch *p, pl__rfile *f, int64_t off, int64_t len) {
    if (!p || !f || len <= 0) return;
    pthread_mutex_lock(&p->mu);
    if (!p->started && !p->stop) {
        if (pthread_create(&p->thread, NULL, prefetch_main, p) == 0)
            p->started = 1;
        else
            p->stop = 1; /* no thread: reads fetch for themselves */
    }
    if (p->stop || p->queued_bytes + len > p->max_queued) {
        p->dropped++;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    if (p->n == p->cap) {
        int64_t nc = p->cap ? p->cap * 2 : 256;
        pl__pfr *nq = pl__realloc_array(p->q, (size_t)nc, sizeof *nq);
        if (!nq) {
            p->dropped++;
            pthread_mutex_unlock(&p->mu);
            return;
        }
        p->q = nq;
        p->cap = nc;
    }
    p->q[p->n++] = (pl__pfr){f, off, len};
    p->queued_bytes += len;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void pl__rprefetch_free(pl__rprefetch *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->started) pthread_join(p->thread, NULL);
    free(p->q);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
