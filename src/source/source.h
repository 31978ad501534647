/*
 * source.h -- what the source modules (source.c and one file per format:
 * megatron.c, tokens.c, wds.c, text/) share: the handle, the per-file
 * record, and the method table through which the handle reaches a format.
 * Not installed; nothing here is public.
 *
 * A format is a pl__source_ops table (versioned, as SQLite's
 * sqlite3_io_methods): source.c finds it by type when a source opens and
 * calls nothing of a format but through it.  A source is a sorted array of
 * file records, each ops->file_size bytes: the common pl__sfile, then the
 * format's own fields (as SQLite's sqlite3_file and szOsFile).  Each file
 * numbers its documents from 0 to n_docs - 1 locally; first_doc places them
 * in the source's global numbering.  All per-document data (Megatron's
 * lengths and pointers, the .plidx end offsets) stays in mapped memory: the
 * heap holds only the small per-file record and the path.
 */
#ifndef POLYLOAD_SOURCE_H
#define POLYLOAD_SOURCE_H

#include "config/config.h"
#include "source/remote/remote.h"
#include "source/tokenizer/tokenizer.h"

#include <string.h>

#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/types.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "polyload's file readers assume a little-endian host"
#endif

/* Size of the Megatron .idx header: magic 9 + version 8 + dtype 1 + two u64. */
#define PL__MEGATRON_HEADER 34
/* llm.c shard header: 256 int32. */
#define PL__LLMC_HEADER 1024
#define PL__LLMC_MAGIC_U16 20240520
#define PL__LLMC_MAGIC_U32 20240801
/* The .plidx sidecar. */
#define PL__PLIDX_MAGIC "PLIDX\0\0\0"
#define PL__PLIDX_VERSION 1u
#define PL__PLIDX_HEADER 64

/*
 * A mapped file watched for shrinking: its descriptor, kept from open time
 * while the process's budget allows (see source.c), as fd + 1 (0: none
 * kept), the identity of the file that was mapped, and the size last seen
 * by fstat(2) with until when (coarse monotonic ns) it is trusted.
 */
typedef struct pl__fwatch {
    atomic_int fd1;
    dev_t dev;
    ino_t ino;
    atomic_llong seen_size;
    atomic_llong seen_until;
} pl__fwatch;

/* A growable list of owned strings (expanded source paths); zero-init. */
typedef struct pl__paths {
    char **v;
    int64_t n, cap;
    /* A remote (s3://) path's listing: the objects' sizes and ETags, or NULL
     * (owned; pl__paths_free frees it). */
    pl__rlisting *listed;
} pl__paths;
/* Append a copy of s[0..len); PL_ENOMEM. */
int pl__paths_add(pl__paths *p, const char *s, size_t len);
void pl__paths_free(pl__paths *p);

/*
 * The record every format keeps per file: what source.c reads (the
 * document numbering, the watched data and index files, a mapped token
 * format's data mapping).  A format's own per-file fields live in its
 * private struct, which starts with this one (megatron.c's pl__mfile, ...);
 * the source allocates ops->file_size bytes per file (pl__src_file).
 */
typedef struct pl__sfile {
    char *path;        /* megatron: the prefix; others: the data file */
    /* A remote file (s3://, https://; source/remote/): its data and index
     * objects through the node cache, whose local files are what is mapped
     * below (pl__map_any); NULL for local files.  rconf: the source's cache
     * settings. */
    pl__rfile *rdata, *ridx;
    const pl__rcache_conf *rconf;
    int64_t first_doc; /* global index of local document 0 */
    int64_t n_docs;
    int64_t skipped;   /* records left out at open (on_error: skip) */
    pl_dtype dtype;    /* token dtype of this file */
    size_t width;      /* bytes per token */

    /* Data file mapping (mapped token formats; NULL otherwise). */
    void *data_map;
    size_t data_len;
    pl__fwatch data_w; /* the data file */
    pl__fwatch idx_w;  /* the index file (not an in-memory index) */

    /* Index mapping (.idx, .plidx, .plwds, .plrec, or anonymous memory). */
    void *idx_map;
    size_t idx_len;     /* the index file's size (what the file watch checks) */
    size_t idx_map_len; /* bytes of idx_map still mapped; 0: idx_len (megatron
                           unmaps the document_indices it checked at open) */
    int idx_anon; /* 1: idx_map is anonymous memory (an in-memory index), not
                     a file's pages (pl_source_release_pages leaves it) */
    int index_in_memory; /* 1: nothing to watch (anonymous, or re-checked per read) */
} pl__sfile;

/* ------------------------------------------------------------ formats */

/* The method table's version: the entries below are in version 1 unless
 * marked; a later version appends entries, and callers test ops->version
 * before using them (as SQLite's sqlite3_io_methods.iVersion). */
#define PL__SOURCE_OPS_VERSION 2

/* ops->flags */
enum {
    PL__SRC_LAZY = 1,  /* lengths come from tokenizing: reads go to ops->read
                          without a length lookup first, lookahead applies */
    PL__SRC_JSON = 2,  /* records are JSON objects (text_key, instruction keys) */
    PL__SRC_LINES = 4, /* records are lines (line numbers name them) */
    PL__SRC_GUARD_INDEX = 8 /* document lookups read the index's mapping: run
                               them under the SIGBUS guard (source/guard.h) */
};

struct pl__segv; /* source/text/: the texts of a raw record */

/* Per-format counters (pl_source_num_tokenized, pl_source_tokenize_cpu_ns). */
typedef struct pl__format_stats {
    int64_t tokenized;
    int64_t tokenize_cpu_ns;
} pl__format_stats;

/*
 * A format: what pl_source dispatches to.  Entries marked "optional" may be
 * NULL; the others are required.  err/errcap receive the message of an
 * error.  f is a file record of ops->file_size bytes, r a local document.
 */
typedef struct pl__source_ops {
    int version;          /* PL__SOURCE_OPS_VERSION */
    pl_source_type type;
    const char *name;     /* as configs spell it: "megatron", "jsonl", ... */
    unsigned flags;       /* PL__SRC_* */
    size_t file_size;     /* bytes of the format's file record (>= sizeof(pl__sfile)) */
    const char *data_suffix, *index_suffix; /* watched files: path + suffix */
    const char *unit;     /* what a record is called in messages ("line", "file") */

    /* Optional: take what the options hand over (a tokenizer), before any
     * check that can fail, so that pl_source_free releases it. */
    int (*setup)(pl_source *src, const pl_source_options *opts, char *err,
                 size_t errcap);
    /* Check the options and set src->dtype, eos_id, write_index (src->name
     * is set). */
    int (*init)(pl_source *src, const pl_source_options *opts, int skip_damaged,
                char *err, size_t errcap);
    /* Optional: the configured path as sorted, unique files (NULL: a file,
     * a directory's data files or a glob's matches; pl__expand_paths). */
    int (*expand)(const pl_source *src, const char *path, pl__paths *out, char *err,
                  size_t errcap);
    /* Open file f (its path set): find its documents, set n_docs, dtype,
     * width, skipped. */
    int (*open_file)(pl_source *src, pl__sfile *f, int skip_damaged, char *err,
                     size_t errcap);
    /* Optional: after every file is open (threads). */
    int (*start)(pl_source *src, char *err, size_t errcap);
    /* Optional: release the format's own per-file state (source.c unmaps the
     * common mappings). */
    void (*close_file)(pl_source *src, pl__sfile *f);
    /* Optional: release the source's state; called before the files close. */
    void (*free)(pl_source *src);
    /* Length of local document r; *tokens its first token in the mapping,
     * or NULL for a format that reads through ops->read. */
    int (*doc)(const pl_source *src, const pl__sfile *f, int64_t r,
               const uint8_t **tokens, int64_t *length, char *err, size_t errcap);
    /* Optional: tokens [offset, offset + count) of global document index as
     * out_dtype (INT64, INT32, or the source's dtype for stored-width reads),
     * the format checking the range; f holds index, or is NULL for a
     * PL__SRC_LAZY format (which finds it).  marked: see pl__source_read.
     * NULL: the tokens are in the mapping and source.c converts them. */
    int (*read)(pl_source *src, const pl__sfile *f, int64_t index, int64_t offset,
                int64_t count, void *out, pl_dtype out_dtype, int marked, char *err,
                size_t errcap);
    /* Optional: bring the index entry of local document r into cache. */
    void (*prefetch)(const pl__sfile *f, int64_t r);
    /* Optional (image sources): local sample r's image geometry, pixels. */
    int (*image_info)(pl_source *src, const pl__sfile *f, int64_t r,
                      pl_image_info *out, char *err, size_t errcap);
    int (*read_image)(pl_source *src, const pl__sfile *f, int64_t r, int64_t index,
                      uint8_t *out, size_t cap, pl_image_info *info, char *err,
                      size_t errcap);
    /* Optional (PL__SRC_LAZY formats): the texts of local record r. */
    int (*record)(pl_source *src, const pl__sfile *f, int64_t r, struct pl__segv *v,
                  char *err, size_t errcap);
    /* Optional: lengths of global documents index[0..n), in range (errors as
     * negative lengths, as pl_source_lengths). */
    int (*lengths)(pl_source *src, const int64_t *index, int64_t n, int64_t *lengths);
    /* Optional (PL__SRC_LAZY): see pl__source_lookahead. */
    void (*lookahead)(pl_source *src, const pl__perm *perm, int64_t lo, int64_t n,
                      int64_t epoch, int64_t pos);
    /* Optional: heap bytes of the format's state and files beyond the records. */
    size_t (*size_of)(const pl_source *src);
    /* Optional: madvise away the format's own mappings of f (PL_EIO). */
    int (*release_pages)(pl_source *src, pl__sfile *f);
    /* Optional: per-format counters (zeroed by the caller). */
    void (*stats)(const pl_source *src, pl__format_stats *out);
    /* Optional: pl_source_release_tokenizer / pl_source_tokenizer_state. */
    int (*release_tokenizer)(pl_source *src);
    int (*tokenizer_state)(const pl_source *src, int64_t *loads, int64_t *shared_by);
    /* Version 2.  Optional: the bytes [*offset, *offset + *len) of f's data
     * file that reading local document r needs beyond its tokens (a
     * WebDataset sample's image member): a remote file's are requested
     * ahead of the read.  0, or -1 when there are none. */
    int (*data_range)(const pl_source *src, const pl__sfile *f, int64_t r,
                      int64_t *offset, int64_t *len);
} pl__source_ops;

/* The formats (a new one: its file, with its table pl__<name>_ops, and its
 * name here). */
#define PL__SOURCE_FORMATS(X) \
    X(megatron) X(llmc) X(flat) X(jsonl) X(text) X(parquet) X(webdataset)
#define PL__DECLARE_OPS(n) extern const pl__source_ops pl__##n##_ops;
PL__SOURCE_FORMATS(PL__DECLARE_OPS)
#undef PL__DECLARE_OPS

struct pl_source {
    pthread_mutex_t mu; /* guards errmsg */
    char errmsg[PL__ERRMSG_CAP];
    char *name;
    pl_source_type type;
    const pl__source_ops *ops; /* NULL only while an unknown type fails open */
    void *state;    /* the format's own (webdataset options, raw text's tokenizer
                       and cache), or NULL */
    pl_dtype dtype; /* of the first file (flat: the configured dtype) */
    int64_t eos_id;
    int write_index;
    int64_t n_files;
    int64_t n_docs;
    int64_t skipped;  /* records left out at open (on_error: skip) */
    void *filev;      /* n_files records of ops->file_size bytes: pl__src_file */
    size_t file_size; /* ops->file_size */
    /* Remote paths: the cache settings and the prefetcher (NULL when every
     * file is local). */
    pl__rcache_conf rconf;
    char *cache_dir;
    pl__rlisting *listed; /* the listing that found the files (rconf.listed) */
    pl__rprefetch *prefetch;
};

/* File i of src. */
static inline pl__sfile *pl__src_file(const pl_source *src, int64_t i) {
    return (pl__sfile *)((unsigned char *)src->filev + (size_t)i * src->file_size);
}


/* Map a whole file read-only (MAP_SHARED), then close it.  A file of size 0
 * gives *map NULL and *len 0.  PL_ENOENT / PL_EIO with a message.  With
 * fd_out, the descriptor is returned open instead (-1 on error). */
int pl__map_file(const char *path, void **map, size_t *len, struct stat *st,
                 int *fd_out, char *err, size_t errcap);
/* pl__map_file, or for a remote path (s3://, https://) its object opened
 * through the node cache (f->rconf) and the cache's file mapped: index 1
 * fetches the object whole and keeps it (f->ridx), index 0 maps it lazily
 * (f->rdata; reads call pl__source_ensure first).  Format drivers map their
 * data and index files through this. */
int pl__map_any(pl__sfile *f, const char *path, int index, void **map, size_t *len,
                struct stat *st, int *fd_out, char *err, size_t errcap);
/* Make bytes [offset, offset + len) of f's data file present before they are
 * read through its mapping or descriptor (no-op for a local file). */
static inline int pl__source_ensure(const pl__sfile *f, int64_t offset, int64_t len,
                                    char *err, size_t errcap) {
    return f->rdata ? pl__rfile_ensure(f->rdata, offset, len, err, errcap) : PL_OK;
}
/* A read of a remote file's cache file is checked after it is made: a chunk
 * evicted between pl__source_ensure and the read (the cache clears a chunk's
 * table entry before it frees its pages) leaves the range not present, and
 * the bytes read are not used: the range is made present and read again, up
 * to PL__REMOTE_REREADS times, then pl__source_evicted_err. */
#define PL__REMOTE_REREADS 4
static inline int pl__source_still(const pl__sfile *f, int64_t offset, int64_t len) {
    return !f->rdata || pl__rfile_present(f->rdata, offset, len);
}
/* PL_EIO: bytes [offset, offset + len) of f's object evicted from the cache
 * while being read, every time (a cache too small for the reads in flight). */
int pl__source_evicted_err(const pl__sfile *f, int64_t offset, int64_t len, char *err,
                           size_t errcap);
/* A message of source/remote/ (which starts with the object's URL) without
 * that "URL: ", for a caller whose message names the object itself along
 * with what was being read (a record, a member, a row group). */
static inline const char *pl__remote_reason(const char *msg, const char *url) {
    size_t n = strlen(url);
    return !strncmp(msg, url, n) && msg[n] == ':' && msg[n + 1] == ' ' ? msg + n + 2 : msg;
}
/* Post the byte range of tokens [offset, offset + count] of global document
 * index to the source's prefetcher (remote files only; never blocks on I/O). */
void pl__source_fetch_ahead(pl_source *src, int64_t index, int64_t offset, int64_t count);
/* Make the ranges of reads[i] with reads[i].source == only (every read: -1)
 * present at once, concurrently (remote files only; errors are left to the
 * reads). */
void pl__source_ensure_reads(pl_source *src, const pl_read *reads, int64_t n, int32_t only);
/* Record the identity of a mapped file (st, from pl__map_file or fstat) and
 * keep its descriptor fd if the budget allows, else close it. */
void pl__fwatch_keep(pl__fwatch *w, int fd, const struct stat *st);

/* ------------------------------------------------------------ for formats */
/* Expand a configured path into sorted, unique files: a file, every data
 * file of a directory, or a glob's matches (our sidecars left out).  With
 * prefixes (Megatron): .idx/.bin pairs named by their prefix. */
int pl__expand_paths(const char *path, int prefixes, pl__paths *p, char *err,
                     size_t errcap);
/* The shared part of a token format's init: eos_id (-1: default_eos;
 * negative refused when check_eos) and the write_index policy. */
int pl__source_init_common(pl_source *src, const pl_source_options *opts,
                           int64_t default_eos, int check_eos, char *err,
                           size_t errcap);
/* madvise(MADV_DONTNEED) over a mapping of file `path` (NULL map: nothing);
 * PL_EIO with the source's message set. */
int pl__release_map(pl_source *src, const char *path, void *map, size_t len);
/* A data file's descriptor as source.c keeps it (*owned: close after). */
int pl__source_data_fd(const pl_source *src, const pl__sfile *f, int *fd,
                       int *owned, char *err, size_t errcap);
/* The file holding global document index (0 <= index < n_docs), and the
 * local document r there. */
const pl__sfile *pl__source_locate(const pl_source *src, int64_t index, int64_t *r);

/* Unaligned little-endian loads and stores (index files are packed). */
static inline int32_t pl__ld_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline uint32_t pl__ld_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline int64_t pl__ld_i64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline uint64_t pl__ld_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void pl__st_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, sizeof v); }
static inline void pl__st_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, sizeof v); }

/* ------------------------------------------------------------ sources */
/* pl_source_open, with on_error: skip applied to damage found at open
 * (skip_damaged 1: a Megatron file's trailing records that point past its
 * .bin are left out and counted, pl_source_num_skipped). */
int pl__source_open(const pl_source_options *opts, int skip_damaged,
                    pl_source **out);
/*
 * Thread-safe variants of pl_source_document_length / pl_source_read that
 * write an error message into the caller's buffer instead of the handle.
 */
/* Replace a source's message (config.c names the source's config key). */
void pl__source_set_err(pl_source *src, const char *msg);
/* Convert n tokens from src_dtype (unaligned source allowed) to int64 or
 * int32 (dst_dtype PL_DTYPE_INT64 or PL_DTYPE_INT32). */
void pl__tokens_convert(const void *src, pl_dtype src_dtype, void *dst,
                        pl_dtype dst_dtype, int64_t n);
int pl__source_length(pl_source *src, int64_t index, int64_t *length,
                      char *err, size_t errcap);
/* As pl_source_read, but an instruction source gives its prompt tokens in
 * the marked form (-1 - id) that the constructor turns into the mask. */
int pl__source_read(pl_source *src, int64_t index, int64_t offset,
                    int64_t count, void *out, pl_dtype out_dtype, char *err,
                    size_t errcap);
/*
 * pl__source_length without the check that the index file has not shrunk
 * (about 10-15 ns of a lookup that is a cache miss); for the planner, which
 * checks its sources' indexes once per step with pl__source_check_index
 * (PL_ETRUNC naming the file, or PL_EIO).
 */
int pl__source_length_unchecked(pl_source *src, int64_t index,
                                int64_t *length, char *err, size_t errcap);
int pl__source_check_index(pl_source *src, char *err, size_t errcap);
/* pl_source_image_info / pl_source_read_image with the error in err;
 * PL_EINVAL for a source that is not an image source (ops->image_info). */
int pl__source_image_info(pl_source *src, int64_t index, pl_image_info *out, char *err,
                          size_t errcap);
int pl__source_read_image(pl_source *src, int64_t index, uint8_t *out, size_t cap,
                          pl_image_info *info, char *err, size_t errcap);
/* As pl__source_read_image, but under on_error: skip an image that does not
 * decode (PL_EIMAGE) is replaced by zeros (*replaced 1, counted in
 * pl_source_num_images_replaced): the caller keeps its sample without loss. */
int pl__source_read_image_or_blank(pl_source *src, int64_t index, uint8_t *out, size_t cap,
                                   int *replaced, char *err, size_t errcap);
/* Apply the defaults of pl_image_options (as a webdataset source does at
 * open) and check the ranges; PL_EINVAL with a message naming source `name`. */
int pl__wds_defaults(pl_image_options *o, char *err, size_t errcap, const char *name);
/* The geometry of an image resized to out_h x out_w under options o (with
 * defaults applied): mode, patch_dim, grid, patches, tokens, bytes and the
 * out size; width/height (as stored) are left as they are. */
void pl__image_geometry(const pl_image_options *o, int64_t out_h, int64_t out_w,
                        pl_image_info *out);

/* Ask the CPU to bring document `index`'s index entry (Megatron's length
 * and pointer, a .plidx end offset) into cache: the planner does so for a
 * source's next document when it starts one, so that the lookup a draw
 * waits for is a cache hit.  A hint only: no read, no error, any index. */
void pl__source_prefetch(const pl_source *src, int64_t index);

/* Raw text sources (source/text/, PL__SRC_LAZY): sources whose lengths come from
 * tokenizing.  The planner tells such a source the position `pos` of its
 * epoch's order that it is about to ask for, so the source's threads can
 * tokenize what follows.  Position i of the order is document
 * lo + perm(i) of the source, or lo + i when perm is NULL (an evaluation
 * pass in index order); the order has perm->n (else n) positions (a split
 * of the source: lo and n are its range). */
int pl__source_is_lazy(const pl_source *src);
void pl__source_lookahead(pl_source *src, const pl__perm *perm, int64_t lo,
                          int64_t n, int64_t epoch, int64_t pos);


#endif
