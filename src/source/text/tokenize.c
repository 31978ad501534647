/*
 * source/text/tokenize.c -- tokenizing: batches of documents parsed
 * (ops->record) and encoded with one encode_batch call, on the source's
 * tokenizer threads (which take the lookahead queue in the planner's order)
 * or on a reader's thread; the ops entries that read lengths and tokens
 * through the table; the threads' start and the source's free.
 */
#include "source/text/text.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

const pl__tfile *pl__text_locate(const pl_source *src, int64_t index, int64_t *r) {
    return (const pl__tfile *)pl__source_locate(src, index, r);
}

/* Lengths-only: ask lengths_fn for idx[0..n). */
static void remote_lengths(pl_source *src, const int64_t *idx, int64_t n,
                               pl__tres *res) {
    pl__text *t = pl__text_of(src);
    int64_t *lens = pl__calloc((size_t)n, sizeof *lens);
    char **msgs = pl__calloc((size_t)n, sizeof *msgs);
    char err[PL__ERRMSG_CAP];
    err[0] = '\0';
    int rc = !lens || !msgs ? PL_ENOMEM
                            : t->lengths_fn(t->lengths_ctx, t->lengths_source, n,
                                            idx, lens, msgs, err, sizeof err);
    for (int64_t i = 0; i < n; i++) {
        res[i].ids = NULL;
        res[i].len = 0;
        res[i].rc = rc ? rc : lens[i] < 0 ? (int)lens[i] : PL_OK;
        if (!rc && lens[i] >= 0) res[i].len = lens[i];
        if (rc)
            pl__fmt(res[i].err, sizeof res[i].err, "source %s: lengths of %lld "
                                                   "documents: %s",
                    src->name, (long long)n, err[0] ? err : pl_strerror(rc));
        else if (lens[i] < 0)
            pl__fmt(res[i].err, sizeof res[i].err, "%s",
                    msgs[i] ? msgs[i] : pl_strerror((int)lens[i]));
    }
    for (int64_t i = 0; msgs && i < n; i++) free(msgs[i]);
    free(msgs);
    free(lens);
}

/* Parse and tokenize documents idx[0..n) into res[0..n) (no lock held):
 * the texts of every document (pl__record_text) go to one encode_batch
 * call, and a document's ids are its texts' ids joined.  Instruction data
 * keeps the ids of texts not trained on as -1 - id (the marked form). */
static void tokenize_here(pl_source *src, const int64_t *idx, int64_t n,
                              pl__tres *res) {
    pl__text *t = pl__text_of(src);
    pl__segv v = {0};
    int64_t *first = pl__calloc((size_t)n + 1, sizeof *first); /* texts of doc i */
    int64_t *slot = pl__calloc((size_t)n, sizeof *slot);
    int32_t **ids = NULL;
    int64_t *counts = NULL;
    int64_t m = 0; /* documents to encode, their texts packed at the front */
    int oom = !first || !slot;
    for (int64_t i = 0; i < n && !oom; i++) {
        int64_t r;
        const pl__tfile *f = pl__text_locate(src, idx[i], &r);
        res[i].ids = NULL;
        res[i].len = 0;
        int64_t at = v.n;
        res[i].rc = src->ops->record(src, &f->base, r, &v, res[i].err, sizeof res[i].err);
        if (res[i].rc == PL_OK) {
            first[m] = at;
            slot[m++] = i;
        }
    }
    if (!oom) {
        first[m] = v.n;
        ids = pl__calloc((size_t)(v.n ? v.n : 1), sizeof *ids);
        counts = pl__calloc((size_t)(v.n ? v.n : 1), sizeof *counts);
        oom = !ids || !counts;
    }
    if (oom) {
        for (int64_t i = 0; i < n; i++) {
            res[i].rc = PL_ENOMEM;
            res[i].ids = NULL;
            res[i].len = 0;
            pl__fmt(res[i].err, sizeof res[i].err, "source %s: out of memory",
                    src->name);
        }
        goto out;
    }
    int rc = v.n ? t->tok.encode_batch(t->tok.ctx, v.n, (const char *const *)v.text,
                                       v.len, ids, counts, res[slot[0]].err,
                                       sizeof res[slot[0]].err)
                 : PL_OK;
    if (rc && m > 1) {
        /* Find which document the tokenizer refused: one at a time. */
        for (int64_t j = 0; j < m; j++) {
            pl__tres *q = &res[slot[j]];
            int64_t a = first[j], k = first[j + 1] - a;
            q->rc = k ? t->tok.encode_batch(t->tok.ctx, k, (const char *const *)&v.text[a],
                                            &v.len[a], &ids[a], &counts[a], q->err,
                                            sizeof q->err)
                      : PL_OK;
            if (q->rc)
                for (int64_t x = a; x < a + k; x++) ids[x] = NULL, counts[x] = 0;
        }
    } else if (rc) {
        res[slot[0]].rc = rc;
        for (int64_t x = 0; x < v.n; x++) ids[x] = NULL, counts[x] = 0;
    }
    for (int64_t j = 0; j < m; j++) {
        pl__tres *q = &res[slot[j]];
        int64_t r;
        const pl__tfile *f = pl__text_locate(src, idx[slot[j]], &r);
        const int64_t a = first[j], b = first[j + 1];
        if (q->rc) {
            char tmp[PL__ERRMSG_CAP];
            pl__fmt(tmp, sizeof tmp, "%s: record %lld: tokenizer %s: %s", f->base.path,
                    (long long)r, t->tok.name ? t->tok.name : "", q->err);
            memcpy(q->err, tmp, sizeof tmp);
            continue;
        }
        int64_t c = 0, trained = 0;
        for (int64_t x = a; x < b; x++) c += counts[x];
        int32_t *w = pl__malloc((size_t)(c + 1) * sizeof *w);
        if (!w) {
            q->rc = PL_ENOMEM;
            pl__fmt(q->err, sizeof q->err, "out of memory");
            continue;
        }
        c = 0;
        int last_train = 1;
        /* Ids are checked against the vocabulary in one pass without a
           branch (ids as unsigned: a negative one is past any bound), then
           copied whole (or marked, for texts not trained on). */
        const uint32_t bound = t->tok.vocab_size > 0 && t->tok.vocab_size <= INT32_MAX
                                   ? (uint32_t)t->tok.vocab_size
                                   : (uint32_t)INT32_MAX + 1u;
        for (int64_t x = a; x < b && !q->rc; x++) {
            const int32_t *in = ids[x];
            const int64_t k = counts[x];
            uint32_t over = 0;
            for (int64_t e = 0; e < k; e++) over |= (uint32_t)in[e] >= bound;
            if (over) {
                int64_t e = 0;
                while ((uint32_t)in[e] < bound) e++;
                q->rc = PL_ERECORD;
                pl__fmt(q->err, sizeof q->err,
                        "%s: record %lld: tokenizer %s gave id %d outside its "
                        "vocabulary of %lld",
                        f->base.path, (long long)r, t->tok.name ? t->tok.name : "",
                        (int)in[e], (long long)t->tok.vocab_size);
                break;
            }
            if (v.train[x] || !t->masked) {
                if (k) memcpy(w + c, in, (size_t)k * sizeof *w);
            } else {
                for (int64_t e = 0; e < k; e++) w[c + e] = -1 - in[e];
            }
            c += k;
            if (counts[x]) last_train = v.train[x];
            if (v.train[x]) trained += counts[x];
        }
        if (!q->rc && t->add_eos) /* the eos is trained where the text before it is */
            w[c++] = last_train || !t->masked ? (int32_t)t->eos_id : -1 - (int32_t)t->eos_id;
        if (!q->rc && t->masked && trained == 0) {
            q->rc = PL_ERECORD;
            pl__fmt(q->err, sizeof q->err,
                    "%s: line %lld (byte offset %llu): the tokenizer gives no "
                    "tokens to train on (the %s is empty once tokenized)",
                    f->base.path, (long long)pl__text_line_of(src, f, f->spans[2 * r]),
                    (unsigned long long)f->spans[2 * r],
                    t->prompt_key ? "response" : "assistant content");
        }
        if (!q->rc && c == 0) {
            char where[200];
            pl__text_where(src, f, r, where, sizeof where);
            q->rc = PL_ERECORD;
            pl__fmt(q->err, sizeof q->err,
                    "%s: %s: the tokenizer gives no tokens (empty document)",
                    f->base.path, where);
        }
        if (q->rc) {
            free(w);
            continue;
        }
        q->ids = w;
        q->len = c;
    }
    atomic_fetch_add(&t->tokenized, (long long)n);
out:
    for (int64_t x = 0; ids && x < v.n; x++) free(ids[x]);
    pl__seg_pop_to(&v, 0);
    free(v.text);
    free(v.len);
    free(v.owned);
    free(v.train);
    free(first);
    free(slot);
    free(ids);
    free(counts);
    pl__heap_trim_soon(); /* what the tokenizer freed goes back (at most 10/s) */
}

typedef struct {
    pl_source *src;
    const int64_t *idx;
    int64_t n;
    pl__tres *res;
} pl__tokjob_args;

/* CPU time of the calling thread in nanoseconds (0 where the clock is
 * missing). */
static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void tokenize_job(void *arg) {
    pl__tokjob_args *a = arg;
    int64_t c0 = thread_cpu_ns();
    tokenize_here(a->src, a->idx, a->n, a->res);
    int64_t c1 = thread_cpu_ns();
    if (c1 > c0) atomic_fetch_add(&pl__text_of(a->src)->tokenize_cpu_ns, (long long)(c1 - c0));
}

/* tokenize_here on the process's tokenize pool where it has one
 * (pl_set_tokenize_threads: on the thread of the source's tokenizer file),
 * else on this thread; lengths-only sources ask their lengths function. */
void pl__text_tokenize(pl_source *src, const int64_t *idx, int64_t n, pl__tres *res) {
    if (pl__text_of(src)->lengths_fn) {
        remote_lengths(src, idx, n, res);
        return;
    }
    pl__tokjob_args a = {src, idx, n, res};
    pl__tokpool_run(pl__tokref_key(&pl__text_of(src)->tok), tokenize_job, &a);
}

static void *s_worker(void *arg) {
    pl_source *src = arg;
    pl__text *t = pl__text_of(src);
    pl__tentry *batch[PL__BATCH_DOCS];
    int64_t idx[PL__BATCH_DOCS];
    pl__tres *res = t->wres + (size_t)atomic_fetch_add(&t->wnext, 1) * PL__BATCH_DOCS;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stop && !t->qhead) pthread_cond_wait(&t->work_cv, &t->mu);
        if (t->stop) break;
        int64_t n = 0;
        uint64_t bytes = 0;
        while (t->qhead && n < PL__BATCH_DOCS && bytes < PL__BATCH_BYTES) {
            pl__tentry *e = t->qhead;
            t->qhead = e->qnext;
            if (!t->qhead) t->qtail = NULL;
            e->inq = 0;
            e->qnext = NULL;
            if (e->state != PL__T_QUEUED) continue; /* a reader took it */
            e->state = PL__T_RUNNING;
            int64_t r;
            const pl__tfile *f = pl__text_locate(src, e->index, &r);
            bytes += f->spans ? f->spans[2 * r + 1] - f->spans[2 * r] : 4096;
            batch[n] = e;
            idx[n++] = e->index;
        }
        if (!n) continue;
        pthread_mutex_unlock(&t->mu);
        pl__text_tokenize(src, idx, n, res);
        pthread_mutex_lock(&t->mu);
        for (int64_t i = 0; i < n; i++)
            pl__tab_finish(t, batch[i], res[i].rc, res[i].err, res[i].ids, res[i].len);
        int64_t *due = pl__len_due(src, 0);
        if (due) {
            pthread_mutex_unlock(&t->mu);
            pl__len_write(src, due);
            free(due);
            pthread_mutex_lock(&t->mu);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int pl__text_start(pl_source *src, char *err, size_t errcap) {
    pl__text *t = pl__text_of(src);
    if (t->lc_key && t->lc_policy == PL_INDEX_WRITE && src->n_docs > 0) {
        t->learned = pl__malloc((size_t)src->n_docs * sizeof *t->learned);
        if (!t->learned) {
            pl__fmt(err, errcap, "out of memory");
            return PL_ENOMEM;
        }
        for (int64_t i = 0; i < src->n_files; i++) {
            const pl__tfile *f = pl__text_file(src, i);
            for (int64_t r = 0; r < f->base.n_docs; r++) {
                t->learned[f->base.first_doc + r] = -1;
                t->lc_known += f->cached_len && f->cached_len[r] >= 0;
            }
        }
    }
    t->threads = pl__calloc((size_t)t->nthreads, sizeof *t->threads);
    t->wres = pl__calloc((size_t)t->nthreads * PL__BATCH_DOCS, sizeof *t->wres);
    if (!t->threads || !t->wres) {
        pl__fmt(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    for (int i = 0; i < t->nthreads; i++) {
        if (pthread_create(&t->threads[i], NULL, s_worker, src) != 0) {
            pl__fmt(err, errcap, "source %s: cannot start tokenizer thread",
                    src->name);
            return PL_ENOMEM;
        }
        t->started = i + 1;
    }
    return PL_OK;
}

void pl__text_free(pl_source *src) {
    pl__text *t = pl__text_of(src);
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->started; i++) pthread_join(t->threads[i], NULL);
    free(t->threads);
    free(t->wres);
    int64_t *due = pl__len_due(src, 1);
    if (due) pl__len_write(src, due);
    free(due);
    free(t->learned);
    while (t->oldest) pl__tab_remove(t, t->oldest);
    free(t->buckets);
    if (t->have_tok && t->tok.destroy) t->tok.destroy(t->tok.ctx);
    free(t->text_key);
    free(t->prompt_key);
    free(t->response_key);
    free(t->messages_key);
    for (int k = 0; k < 3; k++) free(t->chat_pre[k]), free(t->chat_suf[k]);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->pq_mu);
    pthread_cond_destroy(&t->work_cv);
    pthread_cond_destroy(&t->done_cv);
    free(t);
    src->state = NULL;
}

size_t pl__text_sizeof(const pl_source *src) {
    pl__text *t = pl__text_of(src);
    if (!t) return 0;
    size_t n = sizeof *t + t->spans_bytes + t->nbuckets * sizeof(void *);
    pthread_mutex_lock(&((pl__text *)t)->mu);
    n += (size_t)t->bytes;
    if (t->learned) n += (size_t)src->n_docs * sizeof *t->learned;
    pthread_mutex_unlock(&((pl__text *)t)->mu);
    pthread_mutex_lock(&((pl__text *)t)->pq_mu);
    n += (size_t)t->pq_bytes;
    pthread_mutex_unlock(&((pl__text *)t)->pq_mu);
    for (int64_t i = 0; i < src->n_files; i++) n += pl__text_file(src, i)->text_len;
    return n;
}

/* With the lock held: the entry of `index`, finished (tokenized by this
 * thread if nobody else is at it), with waiters raised (the caller lowers
 * it).  NULL when out of memory. */
pl__tentry *pl__text_acquire(pl_source *src, int64_t index) {
    pl__text *t = pl__text_of(src);
    pl__tentry *e = pl__tab_find(t, index);
    if (!e) {
        e = pl__tab_insert(t, index, PL__T_RUNNING);
        if (!e) return NULL;
    } else if (e->state == PL__T_QUEUED && !t->started) {
        e->state = PL__T_RUNNING; /* taken over; the worker skips it */
    } else {
        /* Queued ones are left to the tokenizer threads, which take the queue in
           the planner's order: the one asked for is at its head.  Tokenizing it
           here instead would cost more than the wait (tokenizers' BPE cache is
           per thread, so a second thread repeats merges the first had cached). */
        e->waiters++;
        while (e->state != PL__T_READY) pthread_cond_wait(&t->done_cv, &t->mu);
        return e;
    }
    e->waiters++;
    pthread_mutex_unlock(&t->mu);
    pl__tres *res = pl__malloc(sizeof *res);
    if (res) pl__text_tokenize(src, &index, 1, res);
    pthread_mutex_lock(&t->mu);
    if (!res) pl__tab_finish(t, e, PL_ENOMEM, "out of memory", NULL, 0);
    else pl__tab_finish(t, e, res->rc, res->err, res->ids, res->len);
    free(res);
    return e;
}

/* Length in tokens of local record r of f (tokenizing it if needed). */
static int text_length(pl_source *src, const pl__tfile *f, int64_t r,
                           int64_t *length, char *err, size_t errcap) {
    pl__text *t = pl__text_of(src);
    if (f->cached_len && f->cached_len[r] >= 0) {
        *length = f->cached_len[r];
        return PL_OK;
    }
    pthread_mutex_lock(&t->mu);
    pl__tentry *e = pl__text_acquire(src, f->base.first_doc + r);
    int rc;
    if (!e) {
        rc = PL_ENOMEM;
        pl__fmt(err, errcap, "source %s: out of memory", src->name);
    } else {
        rc = e->rc;
        *length = rc ? 0 : e->len;
        if (rc) pl__fmt(err, errcap, "%s", e->err ? e->err : "error");
        e->waiters--;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int pl__text_doc(const pl_source *src, const pl__sfile *f, int64_t r,
                 const uint8_t **tokens, int64_t *length, char *err, size_t errcap) {
    *tokens = NULL;
    /* The handle is immutable but for the table, under its lock. */
    return text_length((pl_source *)src, (const pl__tfile *)f, r, length, err,
                           errcap);
}

/* Tokens [offset, offset + count) of global document index, as int64
 * (out_dtype PL_DTYPE_INT64) or int32; with marked, an instruction
 * source's prompt tokens as -1 - id (see polyload.h). */
int pl__text_read(pl_source *src, const pl__sfile *f, int64_t index, int64_t offset,
                  int64_t count, void *out, pl_dtype out_dtype, int marked, char *err,
                  size_t errcap) {
    (void)f; /* found by the table */
    pl__text *t = pl__text_of(src);
    if (index < 0 || index >= src->n_docs) {
        pl__fmt(err, errcap, "source %s: document index %lld out of range [0, %lld)",
                src->name, (long long)index, (long long)src->n_docs);
        return PL_ERANGE;
    }
    if (t->lengths_fn) {
        pl__fmt(err, errcap, "source %s holds lengths only (the tokens are read "
                             "from its source loaders)",
                src->name);
        return PL_EINVAL;
    }
    pthread_mutex_lock(&t->mu);
    pl__tentry *e = pl__text_acquire(src, index);
    int rc = PL_OK;
    if (!e) {
        pthread_mutex_unlock(&t->mu);
        pl__fmt(err, errcap, "source %s: out of memory", src->name);
        return PL_ENOMEM;
    }
    e->waiters--;
    if (e->rc) {
        rc = e->rc;
        pl__fmt(err, errcap, "%s", e->err ? e->err : "error");
    } else if (offset < 0 || count < 0 || offset > e->len ||
               count > e->len - offset) {
        pl__fmt(err, errcap,
                "source %s: document %lld: tokens [%lld, %lld + %lld) are "
                "outside the document's %lld tokens",
                src->name, (long long)index, (long long)offset,
                (long long)offset, (long long)count, (long long)e->len);
        rc = PL_ERANGE;
    } else {
        pl__tokens_convert(e->ids + offset, PL_DTYPE_INT32, out, out_dtype, count);
        /* Instruction data keeps the marked form (untrained tokens as
           -1 - id); plain reads give the ids. */
        for (int64_t k = 0; t->masked && !marked && k < count; k++) {
            if (out_dtype == PL_DTYPE_INT64) {
                int64_t *o = out;
                if (o[k] < 0) o[k] = -1 - o[k];
            } else {
                int32_t *o = out;
                if (o[k] < 0) o[k] = -1 - o[k];
            }
        }
        /* Read up to its last token: the document has been used. */
        if (offset + count == e->len && count > 0 && !e->waiters && !e->inq)
            pl__tab_remove(t, e);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int pl__text_release_tokenizer(pl_source *src) {
    pl__text *t = pl__text_of(src);
    if (!t || !t->have_tok) return PL_OK;
    return pl__tokref_release(&t->tok) < 0 ? PL_EINVAL : PL_OK;
}

int pl__text_tokenizer_state(const pl_source *src, int64_t *loads, int64_t *shared_by) {
    const pl__text *t = pl__text_of(src);
    if (!t || !t->have_tok) return -1;
    return pl__tokref_state(&t->tok, loads, shared_by);
}

