/*
 * parquet_shim.h -- the C interface of src/source/text/parquet_shim.cc (Apache Arrow's
 * Parquet reader), built with PL_WITH_PARQUET.  Not installed.
 *
 * Every call returns 0 or a negative PL_E* code with a message in err that
 * names the file (and the row group and byte offset where one is read); no
 * C++ exception crosses it.  A handle is not safe for concurrent calls.
 */
#ifndef POLYLOAD_PARQUET_SHIM_H
#define POLYLOAD_PARQUET_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct pl__pqfile pl__pqfile;

/* Open path's footer and check `column` (a top-level string column).
 * *group_rows: malloc'd int64[*n_groups], the rows of each row group.
 * PL_ERECORD: not Parquet, another schema, a corrupt footer; PL_ETRUNC: the
 * footer is missing (a file cut short); PL_ENOENT / PL_EIO.  name: what
 * messages call the file (NULL: path).  cached: path is a remote object's
 * file in the node cache (its mtime moves as chunks arrive: the check that
 * the file did not change since open is left out; the cache checks the
 * object's version). */
int pl__pq_open(const char *path, const char *name, int cached, const char *column,
                pl__pqfile **out, int64_t *n_groups, int64_t **group_rows, char *err,
                size_t errcap);
/* Decode row group g (of `rows` rows): *data holds the values back to back,
 * value k is [offsets[k], offsets[k + 1]) and valid[k] is 0 for a null;
 * all three malloc'd (free(3) them).  PL_ERECORD for damaged pages, with a
 * message that the caller prefixes with the file, row group and offset. */
int pl__pq_read_group(pl__pqfile *h, int64_t g, int64_t rows, char **data,
                      uint64_t **offsets, uint8_t **valid, char *err, size_t errcap);
/* Byte offset of row group g's column chunk, or -1. */
int64_t pl__pq_chunk_offset(const pl__pqfile *h, int64_t g);
/* The bytes [*offset, *offset + *len) that decoding row group g reads (its
 * column chunk, with the padding Arrow adds for files of old writers,
 * within the file); -1 when unknown. */
int pl__pq_chunk_range(const pl__pqfile *h, int64_t g, int64_t *offset, int64_t *len);
void pl__pq_close(pl__pqfile *h);

#endif
