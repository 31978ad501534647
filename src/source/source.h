/*
 * source.h -- what the source modules (source.c and one file per format:
 * megatron.c, tokens.c, wds.c, text/) share: the handle, the per-file record, and the entry
 * points of each format.  Not installed; nothing here is public.
 *
 * A source is a sorted array of pl__sfile.  Each file numbers its documents
 * from 0 to n_docs - 1 locally; first_doc places them in the source's global
 * numbering.  All per-document data (Megatron's lengths and pointers, the
 * .plidx end offsets) stays in mapped memory: the heap holds only this small
 * per-file record and the path.
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

typedef struct pl__sfile {
    char *path;       /* megatron: the prefix; llmc/flat: the data file */
    /* A remote file (s3://, https://; source/remote/): its data and index
     * objects through the node cache, whose local files are what is mapped
     * below; NULL for local files.  rconf: the source's cache settings. */
    pl__rfile *rdata, *ridx;
    const pl__rcache_conf *rconf;
    int64_t first_doc; /* global index of local document 0 */
    int64_t n_docs;
    pl_dtype dtype;   /* token dtype of this file */
    size_t width;     /* bytes per token */

    /* Data file mapping.  tokens points at token 0 (megatron: byte 0 of the
     * .bin; llmc: byte 1024 of the shard; flat: byte 0). */
    void *data_map;
    size_t data_len;
    const uint8_t *tokens;
    int64_t token_bytes; /* bytes from tokens to the end of the file */
    pl__fwatch data_w; /* the data file */
    pl__fwatch idx_w;  /* the .idx or .plidx (not an in-memory index) */

    /* Index mapping (.idx, or .plidx / anonymous memory). */
    void *idx_map;
    size_t idx_len;     /* the index file's size (what the file watch checks) */
    size_t idx_map_len; /* bytes of idx_map still mapped; 0: idx_len (megatron
                           unmaps the document_indices it checked at open) */
    int idx_anon; /* 1: idx_map is anonymous memory (an in-memory index), not
                     a file's pages (pl_source_release_pages leaves it) */

    /* megatron */
    int64_t seq_count;
    int64_t docidx_count;
    const uint8_t *lengths;  /* int32[seq_count], unaligned */
    const uint8_t *pointers; /* int64[seq_count], unaligned */
    const uint8_t *docidx;   /* int64[docidx_count], unaligned; only while
                                open checks it (unmapped after) */

    int64_t skipped;         /* trailing records past the .bin, left out */

    /* llmc / flat */
    int64_t n_tokens;
    const uint64_t *ends; /* [n_docs] exclusive end offsets, in tokens */
    int index_in_memory;  /* 1: ends live in an anonymous mapping */

    /* webdataset: the shard's descriptor + 1 (source/wds.c); the .plwds
     * index is idx_map (records, then caption tokens). */
    int wds_fd1;
    /* jsonl/text (source/text/text.c): record r is bytes [spans[2r], spans[2r+1])
     * of the file (plain: read with pread(2)) or of text (compressed: the
     * decompressed bytes, malloc'd). */
    const uint64_t *spans;
    uint64_t *spans_owned; /* malloc'd spans (NULL: mapped .plrec) */
    char *text;            /* decompressed file, or NULL */
    size_t text_len;
    int compression;       /* 0 plain, 1 gzip, 2 zstd */
    uint64_t *line_ck;     /* line of every 4096th record (NULL: count from 0) */
    /* jsonl/text: the mapped <file>.pllen (length cache), or NULL */
    void *len_map;
    size_t len_map_len;
    const int64_t *cached_len; /* [n_docs]: a length, or -1 */
    uint64_t st_size, st_mtime_ns; /* the data file at open (the sidecar's key) */
    /* parquet (source/text/text.c, parquet_shim.h): the reader, row group g holds
     * local records [pq_first[g], pq_first[g + 1]), decoded lazily into
     * pq_dec[g] */
    struct pl__pqfile *pq;
    int64_t pq_groups;
    int64_t *pq_first;
    struct pl__pqgroup *pq_dec;
} pl__sfile;

typedef struct pl__text pl__text; /* source/text/text.c: tokenizer and cache */

struct pl_source {
    pthread_mutex_t mu; /* guards errmsg */
    char errmsg[PL__ERRMSG_CAP];
    char *name;
    pl_source_type type;
    pl_dtype dtype; /* of the first file (flat: the configured dtype) */
    int64_t eos_id;
    int write_index;
    int64_t n_files;
    int64_t n_docs;
    int64_t skipped; /* records left out at open (on_error: skip) */
    pl__sfile *files;
    struct pl__wds *wds; /* webdataset options (source/wds.c), else NULL */
    pl__text *text;  /* jsonl/text only */
    /* Remote paths: the cache settings and the prefetcher (NULL when every
     * file is local). */
    pl__rcache_conf rconf;
    char *cache_dir;
    pl__rprefetch *prefetch;
};

/* A growable list of owned strings (expanded source paths); zero-init. */
typedef struct pl__paths {
    char **v;
    int64_t n, cap;
} pl__paths;
/* Append a copy of s[0..len); PL_ENOMEM. */
int pl__paths_add(pl__paths *p, const char *s, size_t len);
void pl__paths_free(pl__paths *p);

/* Map a whole file read-only (MAP_SHARED), then close it.  A file of size 0
 * gives *map NULL and *len 0.  PL_ENOENT / PL_EIO with a message.  With
 * fd_out, the descriptor is returned open instead (-1 on error). */
/* pl__map_file, or for a remote path (s3://, https://) its object opened
 * through the node cache (f->rconf) and the cache's file mapped: index 1
 * fetches the object whole and keeps it (f->ridx), index 0 maps it lazily
 * (f->rdata; reads call pl__source_ensure first). */
int pl__map_any(pl__sfile *f, const char *path, int index, void **map, size_t *len,
                struct stat *st, int *fd_out, char *err, size_t errcap);
/* Make bytes [offset, offset + len) of f's data file present before they are
 * read through its mapping or descriptor (no-op for a local file). */
static inline int pl__source_ensure(const pl__sfile *f, int64_t offset, int64_t len,
                                    char *err, size_t errcap) {
    return f->rdata ? pl__rfile_ensure(f->rdata, offset, len, err, errcap) : PL_OK;
}
/* Post the byte range of tokens [offset, offset + count] of global document
 * index to the source's prefetcher (remote files only; never blocks on I/O). */
void pl__source_fetch_ahead(pl_source *src, int64_t index, int64_t offset, int64_t count);
/* Make the ranges of reads[i] with reads[i].source == only (every read: -1)
 * present at once, concurrently (remote files only; errors are left to the
 * reads). */
void pl__source_ensure_reads(pl_source *src, const pl_read *reads, int64_t n, int32_t only);
int pl__map_file(const char *path, void **map, size_t *len, struct stat *st,
                 int *fd_out, char *err, size_t errcap);
/* Record the identity of a mapped file (st, from pl__map_file or fstat) and
 * keep its descriptor fd if the budget allows, else close it. */
void pl__fwatch_keep(pl__fwatch *w, int fd, const struct stat *st);

/* ------------------------------------------------------------ megatron */
/* Open f->path + ".idx" / ".bin"; checks are O(1) in the document count.
 * skip_trailing: records at the end that point past the end of the .bin
 * (a truncated .bin) are left out and counted in f->skipped instead of
 * refusing the file (PL_ETRUNC). */
int pl__megatron_open(pl__sfile *f, int skip_trailing, char *err,
                      size_t errcap);
/* Local document r: pointer to its first token and its length, with the
 * PL_EBOUNDS checks of that record. */
int pl__megatron_doc(const pl__sfile *f, int64_t r, const uint8_t **tokens,
                     int64_t *length, char *err, size_t errcap);
/* Full scan of the document index (non-decreasing); PL_EDOCIDX. */
int pl__megatron_check_docidx(const pl__sfile *f, char *err, size_t errcap);

/* ------------------------------------------------------------ llmc/flat */
int pl__tokens_open(pl__sfile *f, pl_source_type type, pl_dtype flat_dtype,
                    int64_t eos_id, int write_index, char *err, size_t errcap);
int pl__tokens_doc(const pl__sfile *f, int64_t r, const uint8_t **tokens,
                   int64_t *length, char *err, size_t errcap);

/* ------------------------------------------------------------ webdataset */
/* Open every shard of opts->path into src (files, counts); src->name set. */
int pl__wds_open(pl_source *src, const pl_source_options *opts, int skip_damaged);
void pl__wds_free(pl_source *src);
/* Local sample r: its length in tokens (visual tokens + caption + eos). */
int pl__wds_doc_length(const pl_source *src, const pl__sfile *f, int64_t r,
                       int64_t *length, char *err, size_t errcap);
/* Tokens [offset, offset + count) of local sample r as dt (INT64, INT32 or
 * UINT32). */
int pl__wds_read(const pl_source *src, const pl__sfile *f, int64_t r, int64_t offset,
                 int64_t count, void *out, pl_dtype dt, char *err, size_t errcap);
/* ------------------------------------------------------------ jsonl/text */
/* Set up src->text from the options (before the files open). */
int pl__text_init(pl_source *src, const pl_source_options *opts, char *err,
                  size_t errcap);
/* Find the records of file f (no document is parsed or tokenized). */
int pl__text_open_file(pl_source *src, pl__sfile *f, int skip_damaged,
                       char *err, size_t errcap);
/* Start the lookahead threads (after every file is open). */
int pl__text_start(pl_source *src, char *err, size_t errcap);
void pl__text_free(pl_source *src);
size_t pl__text_sizeof(const pl_source *src);
/* Length in tokens of local record r of f (tokenizing it if needed). */
int pl__text_length(pl_source *src, const pl__sfile *f, int64_t r,
                    int64_t *length, char *err, size_t errcap);
/* Tokens [offset, offset + count) of global document index, as int64
 * (out_dtype PL_DTYPE_INT64) or int32; with marked, an instruction
 * source's prompt tokens as -1 - id (see polyload.h). */
int pl__text_read(pl_source *src, int64_t index, int64_t offset,
                  int64_t count, void *out, pl_dtype out_dtype, int marked,
                  char *err, size_t errcap);
/* A data file's descriptor as source.c keeps it (*owned: close after). */
int pl__source_data_fd(const pl_source *src, const pl__sfile *f, int *fd,
                       int *owned, char *err, size_t errcap);

/* Release a parquet file's reader and decoded row groups (source/text/text.c). */
void pl__pq_file_free(pl__sfile *f);
/* Release the mappings of a file (not its path). */
void pl__sfile_unmap(pl__sfile *f);


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
/* pl_source_image_info / pl_source_read_image with the error in err
 * (source/wds.c); PL_EINVAL for a source that is not a webdataset. */
int pl__wds_image_info(pl_source *src, int64_t index, pl_image_info *out, char *err,
                       size_t errcap);
int pl__wds_read_image(pl_source *src, int64_t index, uint8_t *out, size_t cap,
                       pl_image_info *info, char *err, size_t errcap);
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

/* Raw text sources (source/text/text.c): sources whose lengths come from
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
