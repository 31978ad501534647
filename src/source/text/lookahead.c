/*
 * source/text/lookahead.c -- the lookahead: the planner says which position
 * of its epoch's order it is about to ask for (pl__source_lookahead), and
 * the next documents of that order are queued for the tokenizer threads
 * (and a remote record's bytes requested ahead); the window opens
 * gradually.  Also the source's tokenizing counters.
 */
#include "source/text/text.h"

/* A remote record queued for tokenizing: its bytes requested ahead from the
 * object store (the source's prefetcher; never blocks on I/O).  Not for a
 * lengths-only source, whose records are read by the source loaders. */
static void fetch_ahead(pl_source *src, int64_t index) {
    if (!src->prefetch || pl__text_of(src)->lengths_fn) return;
    int64_t r;
    const pl__tfile *f = pl__text_locate(src, index, &r);
    if (!f->base.rdata || f->text) return;
    if (!f->spans) { /* records without spans: a Parquet file's rows */
        pl__pq_fetch_ahead(src, f, r);
        return;
    }
    const int64_t s = (int64_t)f->spans[2 * r], n = (int64_t)f->spans[2 * r + 1] - s;
    if (n > 0 && !pl__rfile_present(f->base.rdata, s, n))
        pl__rprefetch_post(src->prefetch, f->base.rdata, s, n);
}

void pl__text_lookahead(pl_source *src, const pl__perm *perm, int64_t lo, int64_t n,
                        int64_t epoch, int64_t pos) {
    pl__text *t = pl__text_of(src);
    if (!t || !t->started) return;
    pthread_mutex_lock(&t->mu);
    if (!t->la_valid || t->la_epoch != epoch || pos < t->la_last ||
        t->la_lo != lo || t->la_ordered != (perm == NULL)) {
        t->la_ordered = perm == NULL;
        if (perm) t->la_perm = *perm;
        t->la_lo = lo;
        t->la_n = perm ? (int64_t)perm->n : n;
        if (t->la_lo < 0 || t->la_lo > src->n_docs) t->la_lo = 0, t->la_n = 0;
        if (t->la_n > src->n_docs - t->la_lo) t->la_n = src->n_docs - t->la_lo;
        t->la_epoch = epoch;
        t->la_next = pos;
        t->la_valid = 1;
    }
    t->la_last = pos;
    if (t->la_next < pos) t->la_next = pos;
    /* The window opens gradually (16 documents, then two more per document
       drawn), so the first steps wait for their own documents, not for a
       whole window of every source. */
    int64_t window = 16 + 2 * t->la_draws++;
    if (window > t->lookahead) window = t->lookahead;
    if (t->la_next - pos <= window / 2) {
        int64_t end = pos + window;
        if (end > t->la_n) end = t->la_n;
        int queued = 0;
        for (; t->la_next < end; t->la_next++) {
            int64_t idx = t->la_lo + (t->la_ordered ? t->la_next
                                                    : (int64_t)pl__perm_apply(
                                                          &t->la_perm,
                                                          (uint64_t)t->la_next));
            if (pl__tab_find(t, idx)) continue;
            pl__tentry *e = pl__tab_insert(t, idx, PL__T_QUEUED);
            if (!e) break;
            e->inq = 1;
            if (t->qtail) t->qtail->qnext = e;
            else t->qhead = e;
            t->qtail = e;
            queued = 1;
            fetch_ahead(src, idx);
        }
        if (queued) pthread_cond_broadcast(&t->work_cv);
    }
    pthread_mutex_unlock(&t->mu);
}

void pl__text_stats(const pl_source *src, pl__format_stats *out) {
    pl__text *t = pl__text_of(src);
    if (!t) return;
    out->tokenized = (int64_t)atomic_load(&t->tokenized);
    out->tokenize_cpu_ns = (int64_t)atomic_load(&t->tokenize_cpu_ns);
}

