/*
 * source/text/parquet.c -- Parquet sources (type parquet, PL_WITH_PARQUET):
 * the records of a file are the rows of its string column text_key,
 * numbered in row-group order from the footer's row counts (opening reads
 * the footer only).  A row group is decoded (parquet_shim.cc) when the
 * first of its documents is parsed, under pq_mu, and kept for its other
 * documents; beyond PL__PQ_CACHE_BYTES of decoded text the least recently
 * used groups leave memory.  A group that cannot be decoded keeps its
 * error: each of its rows is PL_ERECORD with it.
 *
 * A remote object (s3://, https://) is read by Arrow from its file in the
 * node cache: opening makes the footer present (the tail Arrow reads first,
 * and the rest of a longer footer), and decoding a row group makes its
 * column chunk present first, so only the footer and the column chunks of
 * the row groups read are fetched, and a chunk evicted since is fetched
 * again.
 */
#include "source/text/text.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef PL_WITH_PARQUET
#include "source/text/parquet_shim.h"
#endif

/* Decoded Parquet row groups kept per source (least recently used leave). */
#define PL__PQ_CACHE_BYTES ((int64_t)1 << 30)

/* A Parquet row group as decoded (NULL data: not in memory). */
typedef struct pl__pqgroup {
    char *data;
    uint64_t *off; /* [rows + 1] */
    uint8_t *valid; /* [rows]: 0 for a null */
    int64_t bytes;
    uint64_t last_use;
    int rc;    /* the decode's error (kept), or 0 */
    char *err;
    int posted; /* remote: its column chunk posted to the prefetcher */
} pl__pqgroup;

/* A Parquet file: a raw text file whose records are the rows of row groups;
 * row group g holds local records [pq_first[g], pq_first[g + 1]), decoded
 * lazily into pq_dec[g]. */
typedef struct pl__pqsfile {
    pl__tfile t;
    struct pl__pqfile *pq; /* the reader (parquet_shim.h) */
    int64_t pq_groups;
    int64_t *pq_first;
    pl__pqgroup *pq_dec;
} pl__pqsfile;

/* Release a parquet file's reader and decoded row groups. */
static void pq_file_free(pl__pqsfile *f) {
    for (int64_t g = 0; f->pq_dec && g < f->pq_groups; g++) {
        free(f->pq_dec[g].data);
        free(f->pq_dec[g].off);
        free(f->pq_dec[g].valid);
        free(f->pq_dec[g].err);
    }
    free(f->pq_dec);
    free(f->pq_first);
#ifdef PL_WITH_PARQUET
    if (f->pq) pl__pq_close(f->pq);
#endif
    f->pq = NULL;
    f->pq_dec = NULL;
    f->pq_first = NULL;
    f->pq_groups = 0;
}

#ifdef PL_WITH_PARQUET
/* Arrow's first read of a file: its last 64 KiB (parquet-cpp's
 * kDefaultFooterReadSize), then the rest of a longer footer. */
#define PL__PQ_FOOTER_READ ((int64_t)64 << 10)

/* Make what opening a remote Parquet object reads present: the leading
 * magic, the tail Arrow reads first and a footer longer than it. */
static int pq_ensure_footer(pl__rfile *rf, char *err, size_t errcap) {
    const int64_t size = pl__rfile_size(rf);
    const int64_t tail = size < PL__PQ_FOOTER_READ ? size : PL__PQ_FOOTER_READ;
    int64_t off[2] = {0, size - tail}, len[2] = {size < 4 ? size : 4, tail};
    int rc = pl__rfile_ensure_many(rf, off, len, 2, err, errcap);
    if (rc || size < 12) return rc;
    /* The footer's length, in the 8 bytes before the end. */
    uint8_t end[8];
    int fd = open(pl__rfile_path(rf), O_RDONLY | O_CLOEXEC);
    ssize_t k = fd >= 0 ? pread(fd, end, 8, (off_t)(size - 8)) : -1;
    if (fd >= 0) close(fd);
    if (k != 8) return PL_OK; /* pl__pq_open reports what it cannot read */
    const int64_t flen = (int64_t)pl__ld_u32(end) + 8;
    if (flen > tail && flen <= size)
        rc = pl__rfile_ensure(rf, size - flen, flen - tail, err, errcap);
    return rc;
}
#endif

/* Open a Parquet file's footer: its rows are the records. */
static int pq_open_file(pl_source *src, pl__sfile *bf, int skip_damaged, char *err,
                            size_t errcap) {
    pl__pqsfile *pf = (pl__pqsfile *)bf;
    pl__tfile *f = &pf->t;
    f->base.dtype = PL_DTYPE_INT32;
    f->base.width = 4;
#ifndef PL_WITH_PARQUET
    (void)skip_damaged, (void)pf;
    pl__fmt(err, errcap,
            "source %s: %s: parquet support not built (the library was compiled "
            "without Apache Arrow's Parquet reader: install pyarrow, whose wheel ships "
            "it, and rebuild)",
            src->name, f->base.path);
    return PL_ECONFIG;
#else
    pl__text *t = pl__text_of(src);
    struct stat st;
    const char *local = f->base.path;
    int rc;
    if (pl__remote_is_url(f->base.path)) {
        /* A remote object: Arrow reads its file in the node cache, the
           footer made present now, each row group's column chunk before it
           is decoded (pq_record_text). */
        if ((rc = pl__rfile_open(f->base.path, f->base.rconf, 0, &f->base.rdata, err,
                                 errcap)) ||
            (rc = pq_ensure_footer(f->base.rdata, err, errcap)))
            return rc;
        local = pl__rfile_path(f->base.rdata);
    } else if (stat(f->base.path, &st) == 0) {
        f->st_size = (uint64_t)st.st_size;
        f->st_mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull +
                         (uint64_t)st.st_mtim.tv_nsec;
    }
    int64_t ng = 0, *rows = NULL;
    pl__pqfile *h = NULL;
    rc = pl__pq_open(local, f->base.path, f->base.rdata != NULL, t->text_key, &h, &ng,
                     &rows, err, errcap);
    if (rc) {
        if (skip_damaged && (rc == PL_ERECORD || rc == PL_ETRUNC)) {
            f->base.n_docs = 0; /* the file is left out, counted as one record */
            f->base.skipped = 1;
            return PL_OK;
        }
        return rc;
    }
    pf->pq = h;
    pf->pq_groups = ng;
    pf->pq_first = pl__malloc((size_t)(ng + 1) * sizeof *pf->pq_first);
    pf->pq_dec = pl__calloc((size_t)(ng ? ng : 1), sizeof *pf->pq_dec);
    if (!pf->pq_first || !pf->pq_dec) {
        free(rows);
        pl__fmt(err, errcap, "%s: out of memory", f->base.path);
        return PL_ENOMEM;
    }
    pf->pq_first[0] = 0;
    for (int64_t g = 0; g < ng; g++) pf->pq_first[g + 1] = pf->pq_first[g] + rows[g];
    free(rows);
    f->base.n_docs = pf->pq_first[ng];
    pl__len_load(t, f);
    return PL_OK;
#endif
}

#ifdef PL_WITH_PARQUET
/* With pq_mu held: drop the least recently used decoded groups (not keep)
 * while over the budget. */
static void pq_evict(pl_source *src, const pl__pqgroup *keep) {
    pl__text *t = pl__text_of(src);
    while (t->pq_bytes > PL__PQ_CACHE_BYTES) {
        pl__pqgroup *lru = NULL;
        for (int64_t i = 0; i < src->n_files; i++) {
            pl__pqsfile *pf = (pl__pqsfile *)pl__src_file(src, i);
            for (int64_t g = 0; g < pf->pq_groups; g++) {
                pl__pqgroup *G = &pf->pq_dec[g];
                if (G->data && G != keep && (!lru || G->last_use < lru->last_use)) lru = G;
            }
        }
        if (!lru) return;
        t->pq_bytes -= lru->bytes;
        free(lru->data);
        free(lru->off);
        free(lru->valid);
        lru->data = NULL;
        lru->off = NULL;
        lru->valid = NULL;
        lru->bytes = 0;
        lru->posted = 0;
    }
}
#endif

/* The row group of local row r of f. */
static int64_t pq_group_of(const pl__pqsfile *pf, int64_t r) {
    int64_t lo = 0, hi = pf->pq_groups; /* the group g: pq_first[g] <= r */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (pf->pq_first[mid] <= r) lo = mid;
        else hi = mid;
    }
    return lo;
}

void pl__pq_fetch_ahead(pl_source *src, const pl__tfile *tf, int64_t r) {
#ifdef PL_WITH_PARQUET
    pl__text *t = pl__text_of(src);
    const pl__pqsfile *pf = (const pl__pqsfile *)tf;
    if (!tf->base.rdata || !pf->pq || r < 0 || r >= tf->base.n_docs) return;
    const int64_t g = pq_group_of(pf, r);
    int64_t off, len;
    pthread_mutex_lock(&t->pq_mu);
    pl__pqgroup *G = &pf->pq_dec[g];
    const int post = !G->data && !G->rc && !G->posted &&
                     pl__pq_chunk_range(pf->pq, g, &off, &len) == 0;
    if (post) G->posted = 1;
    pthread_mutex_unlock(&t->pq_mu);
    if (post && !pl__rfile_present(tf->base.rdata, off, len))
        pl__rprefetch_post(src->prefetch, tf->base.rdata, off, len);
#else
    (void)src, (void)tf, (void)r;
#endif
}

/* The text of local row r of Parquet file f as one (trained) segment. */
static int pq_record_text(pl_source *src, const pl__sfile *fc, int64_t r,
                              pl__segv *v, char *err, size_t errcap) {
#ifndef PL_WITH_PARQUET
    (void)src, (void)r, (void)v;
    pl__fmt(err, errcap, "%s: parquet support not built", fc->path);
    return PL_ECONFIG;
#else
    pl__text *t = pl__text_of(src);
    /* its decoded groups change, under pq_mu */
    pl__pqsfile *pf = (pl__pqsfile *)fc;
    pl__tfile *f = &pf->t;
    const int64_t g = pq_group_of(pf, r), k = r - pf->pq_first[g],
                  rows = pf->pq_first[g + 1] - pf->pq_first[g];
    char where[200];
    pthread_mutex_lock(&t->pq_mu);
    pl__pqgroup *G = &pf->pq_dec[g];
    int64_t coff = 0, clen = 0;
    const int remote = f->base.rdata && pl__pq_chunk_range(pf->pq, g, &coff, &clen) == 0;
    for (int attempt = 0; !G->data && !G->rc; attempt++) {
        char e[PL__ERRMSG_CAP];
        int rc = PL_OK;
        if (remote) {
            /* A remote object: the column chunk made present before Arrow reads
               it (fetched outside the lock, then looked at again under it: a
               present chunk costs no request). */
            pthread_mutex_unlock(&t->pq_mu);
            rc = pl__rfile_ensure(f->base.rdata, coff, clen, e, sizeof e);
            pthread_mutex_lock(&t->pq_mu);
            if (rc == PL_OK && !G->data && !G->rc)
                rc = pl__rfile_ensure(f->base.rdata, coff, clen, e, sizeof e);
            else if (rc == PL_OK)
                break; /* another thread decoded it meanwhile */
            if (rc == PL_OK && attempt == PL__REMOTE_REREADS)
                rc = pl__source_evicted_err(&f->base, coff, clen, e, sizeof e);
            if (rc) {
                pthread_mutex_unlock(&t->pq_mu);
                pl__fmt(err, errcap,
                        "%s: row %lld (row group %lld, column chunk at byte offset %lld, "
                        "%lld bytes): %s",
                        f->base.path, (long long)r, (long long)g, (long long)coff,
                        (long long)clen, pl__remote_reason(e, f->base.path));
                return rc;
            }
        }
        rc = pl__pq_read_group(pf->pq, g, rows, &G->data, &G->off, &G->valid, e, sizeof e);
        if (remote && !pl__rfile_present(f->base.rdata, coff, clen)) {
            /* Evicted while Arrow read it: neither the values nor an error of
               these bytes is used; read again. */
            free(G->data);
            free(G->off);
            free(G->valid);
            G->data = NULL;
            G->off = NULL;
            G->valid = NULL;
            continue;
        }
        if (rc == PL_ENOMEM) {
            pthread_mutex_unlock(&t->pq_mu);
            pl__fmt(err, errcap, "%s", e);
            return rc;
        }
        if (rc) {
            G->rc = rc;
            G->err = pl__strdup(e);
        } else {
            G->bytes = (int64_t)(G->off[rows] + (uint64_t)rows * 9 + 8);
            t->pq_bytes += G->bytes;
        }
    }
    G->last_use = ++t->pq_clock;
    const uint64_t s = G->data ? G->off[k] : 0, e = G->data ? G->off[k + 1] : 0;
    const size_t n = (size_t)(e - s);
    if (G->rc || !G->valid[k] || (int64_t)n > t->max_record || n == 0) /* error paths */
        pl__fmt(where, sizeof where,
                "row %lld (row group %lld, row %lld of the group; column chunk at byte "
                "offset %lld)",
                (long long)r, (long long)g, (long long)k,
                (long long)pl__pq_chunk_offset(pf->pq, g));
    if (G->rc) {
        int rc = G->rc;
        pl__fmt(err, errcap, "%s: %s: %s", f->base.path, where, G->err ? G->err : "cannot decode");
        pthread_mutex_unlock(&t->pq_mu);
        return rc;
    }
    int rc = PL_OK;
    size_t bad;
    char *copy = NULL;
    if (!G->valid[k])
        pl__fmt(err, errcap, "%s: %s: column '%s' is null", f->base.path, where, t->text_key), rc = PL_ERECORD;
    else if ((int64_t)n > t->max_record)
        pl__fmt(err, errcap, "%s: %s: %zu bytes, over the limit of %lld (max_record_bytes)",
                f->base.path, where, n, (long long)t->max_record), rc = PL_ERECORD;
    else if (n == 0)
        pl__fmt(err, errcap, "%s: %s: empty document (column '%s' is \"\")", f->base.path, where,
                t->text_key), rc = PL_ERECORD;
    else if ((bad = pl__utf8_check((const uint8_t *)G->data + s, n)) < n)
        pl__fmt(err, errcap,
                "%s: row %lld (row group %lld, row %lld of the group; column chunk at byte "
                "offset %lld): invalid UTF-8 at byte %zu of the value",
                f->base.path, (long long)r, (long long)g, (long long)k,
                (long long)pl__pq_chunk_offset(pf->pq, g), bad),
            rc = PL_ERECORD;
    else if (!(copy = pl__malloc(n)))
        pl__fmt(err, errcap, "%s: out of memory", f->base.path), rc = PL_ENOMEM;
    else
        memcpy(copy, G->data + s, n);
    pq_evict(src, G);
    pthread_mutex_unlock(&t->pq_mu);
    if (rc) return rc;
    rc = pl__seg_push(v, copy, n, 1, 1);
    if (rc) pl__fmt(err, errcap, "%s: out of memory", f->base.path);
    return rc;
#endif
}


static void pq_close_file(pl_source *src, pl__sfile *f) {
    pq_file_free((pl__pqsfile *)f);
    pl__text_close_file(src, f);
}

const pl__source_ops pl__parquet_ops = {
    .version = PL__SOURCE_OPS_VERSION,
    .type = PL_SOURCE_PARQUET,
    .name = "parquet",
    .flags = PL__SRC_LAZY,
    .file_size = sizeof(pl__pqsfile),
    .data_suffix = "",
    .index_suffix = "",
    .unit = "row",
    .setup = pl__text_init,
    .init = pl__text_init_common,
    .open_file = pq_open_file,
    .start = pl__text_start,
    .close_file = pq_close_file,
    .free = pl__text_free,
    .doc = pl__text_doc,
    .read = pl__text_read,
    .record = pq_record_text,
    .lengths = pl__text_lengths,
    .lookahead = pl__text_lookahead,
    .size_of = pl__text_sizeof,
    .release_pages = pl__text_release_pages,
    .stats = pl__text_stats,
    .release_tokenizer = pl__text_release_tokenizer,
    .tokenizer_state = pl__text_tokenizer_state,
};
