/*
 * source/text/table.c -- the table of documents being or already tokenized:
 * a hash table by document index with an age list, under the source's lock.
 * Entries beyond cache_bytes leave oldest first, unless waited on or queued.
 */
#include "source/text/text.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hidx(const pl__text *t, int64_t index) {
    return ((uint64_t)index * 0x9E3779B97F4A7C15ull) >> 17 & (t->nbuckets - 1);
}

pl__tentry *pl__tab_find(const pl__text *t, int64_t index) {
    for (pl__tentry *e = t->buckets[hidx(t, index)]; e; e = e->hnext)
        if (e->index == index) return e;
    return NULL;
}

static void grow(pl__text *t) {
    uint64_t nb = t->nbuckets * 2;
    pl__tentry **b = pl__calloc(nb, sizeof *b);
    if (!b) return; /* longer chains, still correct */
    pl__tentry **old = t->buckets;
    uint64_t on = t->nbuckets;
    t->buckets = b;
    t->nbuckets = nb;
    for (uint64_t i = 0; i < on; i++) {
        pl__tentry *e = old[i];
        while (e) {
            pl__tentry *nx = e->hnext;
            uint64_t h = hidx(t, e->index);
            e->hnext = b[h];
            b[h] = e;
            e = nx;
        }
    }
    free(old);
}

pl__tentry *pl__tab_insert(pl__text *t, int64_t index, int state) {
    pl__tentry *e = pl__calloc(1, sizeof *e);
    if (!e) return NULL;
    e->index = index;
    e->state = state;
    e->cost = sizeof *e;
    if ((uint64_t)t->n_entries >= t->nbuckets) grow(t);
    uint64_t h = hidx(t, index);
    e->hnext = t->buckets[h];
    t->buckets[h] = e;
    e->older = t->youngest;
    if (t->youngest) t->youngest->younger = e;
    else t->oldest = e;
    t->youngest = e;
    t->n_entries++;
    t->bytes += (int64_t)e->cost;
    return e;
}

void pl__tab_remove(pl__text *t, pl__tentry *e) {
    pl__tentry **pp = &t->buckets[hidx(t, e->index)];
    while (*pp != e) pp = &(*pp)->hnext;
    *pp = e->hnext;
    if (e->older) e->older->younger = e->younger;
    else t->oldest = e->younger;
    if (e->younger) e->younger->older = e->older;
    else t->youngest = e->older;
    t->n_entries--;
    t->bytes -= (int64_t)e->cost;
    free(e->ids);
    free(e->err);
    free(e);
}

void pl__tab_evict(pl__text *t) {
    pl__tentry *e = t->oldest;
    while (t->bytes > t->cache_bytes && e) {
        pl__tentry *nx = e->younger;
        if (e->state == PL__T_READY && !e->inq && !e->waiters) pl__tab_remove(t, e);
        e = nx;
    }
}

void pl__tab_finish(pl__text *t, pl__tentry *e, int rc, const char *msg, int32_t *ids,
                    int64_t len) {
    char m[PL__ERRMSG_CAP];
    if (rc == PL_OK && t->lc_key) {
        /* A cached length the tokenizer does not give would have planned
           chunks that are not there (or left tokens out): refuse the
           document, naming the sidecar. */
        int64_t r;
        const pl__tfile *f = pl__text_locate(t->src, e->index, &r);
        if (f->cached_len && f->cached_len[r] >= 0 && f->cached_len[r] != len) {
            pl__fmt(m, sizeof m,
                    "%s.pllen: record %lld: the length cache says %lld tokens, the "
                    "tokenizer gives %lld (a stale length cache: delete it)",
                    f->base.path, (long long)r, (long long)f->cached_len[r], (long long)len);
            free(ids);
            ids = NULL;
            len = 0;
            rc = PL_EDOCIDX;
            msg = m;
        }
    }
    e->rc = rc;
    e->ids = ids;
    e->len = len;
    if (rc) e->err = pl__strdup(msg);
    size_t add = (size_t)len * sizeof(int32_t) + (rc && msg ? strlen(msg) + 1 : 0);
    e->cost += add;
    t->bytes += (int64_t)add;
    e->state = PL__T_READY;
    pl__len_learn(t->src, e->index, rc == PL_OK ? len : -2);
    pthread_cond_broadcast(&t->done_cv);
    pl__tab_evict(t);
}

