/*
 * source/text/lengths.c -- many lengths at once (pl_source_lengths on a raw
 * text source): the documents nobody holds are claimed and tokenized here in
 * batches, then every answer is collected.
 */
#include "source/text/text.h"

#include <stdlib.h>

int pl__text_lengths(pl_source *src, const int64_t *index, int64_t n, int64_t *lengths) {
    pl__text *t = pl__text_of(src);
    /* Claim the documents nobody holds or is at (queued ones are taken over),
       tokenize them in batches here, then collect every answer. */
    pl__tentry **mine = pl__calloc((size_t)(n ? n : 1), sizeof *mine);
    int64_t *idx = pl__calloc((size_t)(n ? n : 1), sizeof *idx);
    pl__tres *res = pl__malloc(PL__BATCH_DOCS * sizeof *res);
    if (!mine || !idx || !res) {
        free(mine);
        free(idx);
        free(res);
        return PL_ENOMEM;
    }
    int64_t m = 0;
    int rc = PL_OK;
    pthread_mutex_lock(&t->mu);
    for (int64_t i = 0; i < n; i++) {
        if (pl__len_cached(src, index[i]) >= 0) continue;
        pl__tentry *e = pl__tab_find(t, index[i]);
        if (!e) {
            e = pl__tab_insert(t, index[i], PL__T_RUNNING);
            if (!e) {
                rc = PL_ENOMEM;
                break;
            }
        } else if (e->state == PL__T_QUEUED) {
            e->state = PL__T_RUNNING;
        } else {
            continue;
        }
        e->waiters++;
        mine[m] = e;
        idx[m++] = index[i];
    }
    pthread_mutex_unlock(&t->mu);
    for (int64_t b = 0; b < m; b += PL__BATCH_DOCS) {
        int64_t k = m - b < PL__BATCH_DOCS ? m - b : PL__BATCH_DOCS;
        pl__text_tokenize(src, idx + b, k, res);
        pthread_mutex_lock(&t->mu);
        for (int64_t j = 0; j < k; j++) {
            pl__tab_finish(t, mine[b + j], res[j].rc, res[j].err, res[j].ids, res[j].len);
            mine[b + j]->waiters--;
        }
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_lock(&t->mu);
    for (int64_t i = 0; i < n && rc == PL_OK; i++) {
        int64_t cl = pl__len_cached(src, index[i]);
        if (cl >= 0) {
            lengths[i] = cl;
            continue;
        }
        pl__tentry *e = pl__tab_find(t, index[i]);
        if (!e) { /* dropped already (the cache is small): once more */
            e = pl__text_acquire(src, index[i]);
            if (!e) {
                rc = PL_ENOMEM;
                break;
            }
        } else {
            e->waiters++;
            while (e->state != PL__T_READY) pthread_cond_wait(&t->done_cv, &t->mu);
        }
        lengths[i] = e->rc ? e->rc : e->len;
        e->waiters--;
    }
    pthread_mutex_unlock(&t->mu);
    free(mine);
    free(idx);
    free(res);
    return rc;
}

