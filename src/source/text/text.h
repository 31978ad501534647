/*
 * source/text/text.h -- raw text sources (jsonl, text, parquet), tokenized
 * online: what the files of source/text/ share.  Not installed.
 *
 * Records.  Opening a file finds its records and parses none: a plain file
 * is mapped, scanned for newlines with memchr(3) and unmapped again (reads
 * go through pread(2) on the descriptor kept from open, so a file that
 * shrinks is PL_ETRUNC, never SIGBUS); a .gz or .zst file is decompressed
 * once (zlib, libzstd) into a malloc'd buffer while its records are found,
 * because neither stream can be entered in the middle without the decoder's
 * state.  Record r of a file is the byte span [spans[2r], spans[2r+1]),
 * without its newline (and a '\r' before it); lines of only blanks are not
 * records.  With write_index 1 the spans of a plain file are kept in a
 * sidecar "<file>.plrec" (see polyload.h) and mapped by later opens.
 *
 * Tokens.  The planner asks for document lengths in the order of the
 * source's shuffle and tells the source that order ahead
 * (pl__source_lookahead): the next `lookahead` documents are queued, and the
 * source's threads take them from the queue in batches (up to 64 documents
 * or 1 MiB of text), parse them (simdjson where built, else Jansson; see
 * parse.c) and tokenize them with one
 * pl_tokenizer.encode_batch call.  Results live in a hash table by document
 * index, with an age list; a reader that finds its document queued takes
 * it over and tokenizes it itself, one that finds it being tokenized waits.
 * A document read up to its last token leaves the table (it has been used);
 * beyond cache_bytes the oldest finished documents leave it.  Entries being
 * waited on or still queued are never dropped.  Every path computes the same
 * tokens for a document, so timing changes only who does the work.
 *
 * Instruction data (prompt_key/response_key, or messages_key with a chat
 * template): a record is a list of texts (pl__segv), each marked trained on
 * or not, all encoded in the batch's one call and joined; the table keeps
 * the ids of texts not trained on as -1 - id (the marked form), which the
 * transport reads pass on for the constructor's mask and pl_source_read
 * turns back into ids.
 *
 * Length cache: a matching "<file>.pllen" answers the planner's length
 * queries without tokenizing; lengths learned by tokenizing are collected
 * (pl__len_learn, under the lock) and written by a tokenizer thread once
 * every document is known, and at free.  A cached length is checked against
 * the tokens when the document is tokenized.
 *
 * Parquet (type parquet, PL_WITH_PARQUET): the records of a file are the
 * rows of its string column text_key, numbered in row-group order from the
 * footer's row counts (opening reads the footer only: no sidecar is
 * needed).  A row group is decoded (parquet_shim.cc) when the first of its
 * documents is parsed, under pq_mu, and kept for its other documents; beyond
 * PL__PQ_CACHE_BYTES of decoded text the least recently used groups leave
 * memory (and are decoded again if asked).  A group that cannot be decoded
 * keeps its error: each of its rows is PL_ERECORD with it.
 *
 * Locking: one mutex per source guards the table, the queue, the lookahead
 * cursor and the learned lengths; parsing, tokenizing and writing sidecars
 * run outside it.
 *
 * Files: formats.c (the jsonl and text method tables; parquet.c holds
 * Parquet's), setup.c (options), records.c (finding records at open),
 * utf8.c, parse.c (one record into texts), bytes.c (the bytes tokenizer),
 * table.c (the document table), tokenize.c (batches, threads, reads),
 * lookahead.c, lengths.c (many lengths), lencache.c (the .pllen sidecar).
 * What differs between the formats is in their tables (ops->record,
 * ops->unit, the PL__SRC_JSON and PL__SRC_LINES flags), never a type test.
 */
#ifndef POLYLOAD_TEXT_H
#define POLYLOAD_TEXT_H

#include "source/source.h"

#include <jansson.h>

/* Documents and text bytes per tokenizer batch. */
#define PL__BATCH_DOCS 64
#define PL__BATCH_BYTES ((uint64_t)1 << 18)
/* Records between line-number checkpoints (a message counts at most this
 * many lines from the nearest one). */
#define PL__LINE_CK 4096
/* Bytes allocated past a record read into memory, so that a JSON parser
 * that reads ahead (simdjson: 64) parses it in place. */
#define PL__RAW_PAD 64

typedef struct pl__text pl__text;

/*
 * A raw text file: the common record, then its records and length cache.
 * Parquet files extend it with their row groups (parquet.c).
 */
typedef struct pl__tfile {
    pl__sfile base;
    /* jsonl/text: record r is bytes [spans[2r], spans[2r+1]) of the file
     * (plain: read with pread(2)) or of text (compressed: the decompressed
     * bytes, malloc'd). */
    const uint64_t *spans;
    uint64_t *spans_owned; /* malloc'd spans (NULL: mapped .plrec) */
    char *text;            /* decompressed file, or NULL */
    size_t text_len;
    int compression;       /* 0 plain, 1 gzip, 2 zstd */
    uint64_t *line_ck;     /* line of every 4096th record (NULL: count from 0) */
    /* the mapped <file>.pllen (length cache), or NULL */
    void *len_map;
    size_t len_map_len;
    const int64_t *cached_len; /* [n_docs]: a length, or -1 */
    uint64_t st_size, st_mtime_ns; /* the data file at open (the sidecar's key) */
} pl__tfile;

enum { PL__T_QUEUED = 1, PL__T_RUNNING = 2, PL__T_READY = 3 };

typedef struct pl__tentry {
    int64_t index;
    int state;
    int inq;     /* linked in the work queue */
    int waiters; /* threads waiting on it or copying from it */
    int rc;      /* READY: PL_OK or the record's error */
    char *err;   /* message of rc */
    int32_t *ids;
    int64_t len;
    size_t cost; /* bytes charged to the cache */
    struct pl__tentry *hnext;
    struct pl__tentry *older, *younger;
    struct pl__tentry *qnext;
} pl__tentry;

struct pl__text {
    pl_tokenizer tok;
    int have_tok;
    char *text_key;
    char *prompt_key, *response_key; /* instruction data: both set */
    char *messages_key;              /* chat instruction data */
    char *chat_pre[3], *chat_suf[3]; /* system, user, assistant: the template
                                        around {content} */
    int masked;                      /* instruction data: ids in marked form */
    int add_eos;
    int64_t eos_id;
    int64_t lookahead, max_record, cache_bytes;
    int nthreads, started, write_index;
    pthread_t *threads;
    /* The tokenizer threads' result buffers (PL__BATCH_DOCS each), made
       before the threads start so a thread never runs without one (a thread
       that could not allocate its own would leave its queue to nobody). */
    struct pl__tres *wres;
    atomic_int wnext; /* the next thread's slice of wres */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int stop;
    pl__tentry **buckets;
    uint64_t nbuckets; /* power of two */
    int64_t n_entries;
    pl__tentry *oldest, *youngest;
    pl__tentry *qhead, *qtail;
    int64_t bytes;
    atomic_llong tokenized;
    atomic_llong tokenize_cpu_ns; /* thread CPU of pl__tokenize_here */
    /* lookahead cursor: the next position of the epoch's order to queue */
    int la_valid;
    int64_t la_epoch, la_next, la_last;
    int64_t la_draws; /* documents drawn since open: the window grows with it */
    pl__perm la_perm;
    int la_ordered;       /* index order (evaluation), la_perm unused */
    int64_t la_lo, la_n;  /* the order's range of documents (a split) */
    size_t spans_bytes;
    /* the length cache (<file>.pllen) */
    uint64_t lc_key;   /* 0: none */
    int lc_policy;     /* PL_INDEX_* */
    int64_t *learned;  /* [n_docs] lengths learned by tokenizing, -1 unknown
                          (PL_INDEX_WRITE only) */
    int64_t lc_known;  /* documents with a cached or learned length */
    int64_t lc_new;    /* learned and not in the sidecars yet */
    int lc_flush;      /* every length known: write the sidecars once */
    /* lengths-only (pl_source_options.lengths_fn) */
    pl_lengths_fn lengths_fn;
    void *lengths_ctx;
    int64_t lengths_source;
    pl_source *src; /* the owner */
    /* parquet: decoded row groups */
    pthread_mutex_t pq_mu;
    int64_t pq_bytes;
    uint64_t pq_clock;
};


/* The source's state and its files. */
static inline pl__text *pl__text_of(const pl_source *src) { return src->state; }
static inline pl__tfile *pl__text_file(const pl_source *src, int64_t i) {
    return (pl__tfile *)pl__src_file(src, i);
}

/* Texts of a record, in order, with whether their tokens are trained on
 * (instruction data) and whether the text is malloc'd. */
typedef struct pl__segv {
    char **text;
    size_t *len;
    unsigned char *owned, *train;
    int64_t n, cap;
} pl__segv;

/* A tokenized document (or its error). */
typedef struct pl__tres {
    int rc;
    char err[PL__ERRMSG_CAP];
    int32_t *ids;
    int64_t len;
} pl__tres;

/* ------------------------------------------------------------ utf8.c */
/* Offset of the first byte that is not part of valid UTF-8 (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF), or n. */
size_t pl__utf8_check(const uint8_t *s, size_t n);

/* ------------------------------------------------------------ setup.c */
/* ops->setup: src->state from the options (before the files open); the
 * source owns the tokenizer from here on. */
int pl__text_init(pl_source *src, const pl_source_options *opts, char *err,
                  size_t errcap);

/* ------------------------------------------------------------ records.c */
/* ops->open_file of jsonl and text: find the records of file f (no document
 * is parsed or tokenized). */
int pl__text_open_file(pl_source *src, pl__sfile *f, int skip_damaged, char *err,
                       size_t errcap);
/* ops->close_file of jsonl and text (parquet.c adds its row groups). */
void pl__text_close_file(pl_source *src, pl__sfile *f);

/* ------------------------------------------------------------ lencache.c */
/* Map f's <file>.pllen when it matches the file, its records and the key. */
void pl__len_load(pl__text *t, pl__tfile *f);
/* Write the sidecars of every file with lengths not in them yet (no lock
 * held; `known` is a copy of the learned lengths). */
void pl__len_write(pl_source *src, const int64_t *known);
/* With the lock held: a copy of what is known, when the sidecars are due
 * (force: at free), else NULL. */
int64_t *pl__len_due(pl_source *src, int force);
/* With the lock held: remember document index's length (PL_INDEX_WRITE);
 * len -2 for a bad record (settled, never cached). */
void pl__len_learn(pl_source *src, int64_t index, int64_t len);
/* A cached length of document index, or -1. */
int64_t pl__len_cached(const pl_source *src, int64_t index);

/* ------------------------------------------------------------ parse.c */
/* Line (1-based) of byte `at` of file f (error path only). */
int64_t pl__text_line_of(const pl_source *src, const pl__tfile *f, uint64_t at);
/* Append a text to v (owned: malloc'd, freed with v; freed on failure). */
int pl__seg_push(pl__segv *v, char *text, size_t len, int owned, int train);
/* Drop the texts from the n-th on. */
void pl__seg_pop_to(pl__segv *v, int64_t n);
/* ops->record of jsonl and text: the texts of local record r of f. */
int pl__text_record(pl_source *src, const pl__sfile *f, int64_t r, pl__segv *v,
                    char *err, size_t errcap);
/* Where record r of f is, for messages: "line 7 (byte offset 120)" (the
 * ops->unit and, for byte spans, the line and offset) or "row 7". */
void pl__text_where(const pl_source *src, const pl__tfile *f, int64_t r, char *buf,
                    size_t cap);

/* ------------------------------------------------------------ table.c */
/* The hash table of documents by index, with the age list (lock held). */
pl__tentry *pl__tab_find(const pl__text *t, int64_t index);
pl__tentry *pl__tab_insert(pl__text *t, int64_t index, int state);
void pl__tab_remove(pl__text *t, pl__tentry *e);
/* Drop the oldest finished entries beyond the budget. */
void pl__tab_evict(pl__text *t);
/* Store a document's result in e (READY), wake its waiters. */
void pl__tab_finish(pl__text *t, pl__tentry *e, int rc, const char *msg, int32_t *ids,
                    int64_t len);

/* ------------------------------------------------------------ tokenize.c */
/* The file and local record of global document index. */
const pl__tfile *pl__text_locate(const pl_source *src, int64_t index, int64_t *r);
/* Parse and tokenize documents idx[0..n) into res (no lock held). */
void pl__text_tokenize(pl_source *src, const int64_t *idx, int64_t n, pl__tres *res);
/* With the lock held: the entry of index, finished, with waiters raised
 * (the caller lowers it).  NULL when out of memory. */
pl__tentry *pl__text_acquire(pl_source *src, int64_t index);
/* The ops entries of the raw text formats. */
int pl__text_start(pl_source *src, char *err, size_t errcap);
void pl__text_free(pl_source *src);
size_t pl__text_sizeof(const pl_source *src);
int pl__text_doc(const pl_source *src, const pl__sfile *f, int64_t r,
                 const uint8_t **tokens, int64_t *length, char *err, size_t errcap);
int pl__text_read(pl_source *src, const pl__sfile *f, int64_t index, int64_t offset,
                  int64_t count, void *out, pl_dtype out_dtype, int marked, char *err,
                  size_t errcap);
int pl__text_release_tokenizer(pl_source *src);
int pl__text_tokenizer_state(const pl_source *src, int64_t *loads, int64_t *shared_by);

/* ------------------------------------------------------------ lookahead.c */
void pl__text_lookahead(pl_source *src, const pl__perm *perm, int64_t lo, int64_t n,
                        int64_t epoch, int64_t pos);
void pl__text_stats(const pl_source *src, pl__format_stats *out);

/* ------------------------------------------------------------ parquet.c */
/* A remote Parquet file (a raw text file without spans): the column chunk of
 * the row group of local row r posted to the source's prefetcher, once per
 * group until it is decoded (lock t->mu may be held; never blocks on I/O). */
void pl__pq_fetch_ahead(pl_source *src, const pl__tfile *f, int64_t r);

/* ------------------------------------------------------------ lengths.c */
int pl__text_lengths(pl_source *src, const int64_t *index, int64_t n, int64_t *lengths);

/* ------------------------------------------------------------ formats.c */
/* ops->init of the raw text formats: eos_id, write_index, int32 tokens. */
int pl__text_init_common(pl_source *src, const pl_source_options *opts,
                         int skip_damaged, char *err, size_t errcap);
/* ops->release_pages: the length cache's mapping. */
int pl__text_release_pages(pl_source *src, pl__sfile *f);

#endif
