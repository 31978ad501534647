/*
 * remote.h -- objects in object storage (s3:// and https://) and the
 * node-local cache that holds their bytes.  Not installed.
 *
 * remote.c is the client: an object opened by URL (its size and ETag from
 * a HEAD request, or from the listing that found it), ranged reads of it (GET with Range and If-Match), many
 * ranges at once over libcurl's multi interface, and the listing of an
 * s3:// prefix (ListObjectsV2).  Requests are signed by libcurl's AWS SigV4
 * (CURLOPT_AWS_SIGV4); nothing here writes HTTP or signs by hand.
 * Credentials and the endpoint come from the standard places (remote.c's
 * opening comment) and never appear in a message.
 *
 * cache.c is the node-local cache: one sparse file per object version and a
 * chunk table beside it, shared by every process on the node (flock), bounded
 * in bytes, least recently used chunks evicted; what it holds never changes a
 * byte that is read.
 */
#ifndef POLYLOAD_REMOTE_H
#define POLYLOAD_REMOTE_H

#include "common/common.h"

#include <stddef.h>
#include <stdint.h>

/* Is path a remote URL (s3://, https://, http://)? */
int pl__remote_is_url(const char *path);

/* Request policy, from the environment (remote.c) unless set. */
typedef struct pl__rpolicy {
    int max_attempts;       /* requests per range before the error (>= 1) */
    int64_t deadline_ms;    /* per request, connection to last byte */
    int64_t backoff_ms;     /* first retry's mean wait; doubles, capped */
    int64_t backoff_max_ms; /* cap of the wait */
    int concurrency;        /* parallel requests of one read_many */
} pl__rpolicy;
void pl__rpolicy_default(pl__rpolicy *p);

/* An object: immutable after open, shareable by threads. */
typedef struct pl__robj pl__robj;

/* Open url: HEAD for its size and ETag (with retries).  PL_ENOENT (404),
 * PL_EIO (anything else), PL_ENOMEM. */
int pl__robj_open(const char *url, pl__robj **out, char *err, size_t errcap);
/* Open url as a listing described it (size and ETag): no request.  Ranged
 * reads still carry the ETag in If-Match, so an object replaced since the
 * listing is PL_EIO "replaced" at its first read, never read mixed. */
int pl__robj_open_known(const char *url, int64_t size, const char *etag, pl__robj **out,
                        char *err, size_t errcap);
void pl__robj_free(pl__robj *o);
const char *pl__robj_url(const pl__robj *o);
int64_t pl__robj_size(const pl__robj *o);
const char *pl__robj_etag(const pl__robj *o);

/* A byte range of an object and where it goes. */
typedef struct pl__rrange {
    int64_t offset;
    size_t len;
    void *dst;
} pl__rrange;

/*
 * Read ranges (each inside the object) with at most policy.concurrency
 * requests in flight, each retried with exponential backoff and jitter on
 * throttling (429, 503), 5xx, broken connections, deadlines and short
 * bodies.  The object changed since open (ETag) is PL_EIO "replaced";
 * exhausted retries PL_EIO naming the object, the byte range, the attempts
 * and the last status.  Counts requests and bytes (pl__remote_stats).
 */
int pl__robj_read_many(const pl__robj *o, const pl__rrange *r, int n, char *err,
                       size_t errcap);
int pl__robj_read(const pl__robj *o, int64_t offset, size_t len, void *dst,
                  char *err, size_t errcap);

/* An object of a listing: s3://bucket/key, its size and ETag as
 * ListObjectsV2 gave them (size -1, etag NULL when the store left them out). */
typedef struct pl__rentry {
    char *url;
    int64_t size;
    char *etag;
} pl__rentry;
typedef struct pl__rlisting {
    pl__rentry *v; /* sorted by url (byte order) */
    int64_t n;
} pl__rlisting;
void pl__rlisting_free(pl__rlisting *l);
/* The entry of url, or NULL (l may be NULL). */
const pl__rentry *pl__rlisting_find(const pl__rlisting *l, const char *url);

/* The objects under an s3:// prefix (keys starting with it, every page),
 * sorted (byte order).  https:// cannot be listed (PL_EINVAL). */
int pl__remote_list_entries(const char *prefix_url, pl__rlisting **out, char *err,
                            size_t errcap);
/* One ListObjectsV2 reply page (body: NUL-terminated, or NULL for an empty
 * reply): its <Contents> appended to l (cap: l->v's capacity), *next the
 * continuation token (malloc'd) when the page says more follow, else NULL.
 * Any bytes are safe (tests/fuzz/fuzz_listing.c); PL_ENOMEM. */
int pl__remote_list_page(const char *body, const char *bucket, pl__rlisting *l,
                         int64_t *cap, char **next);
/* The same, only the URLs (s3://bucket/key). */
int pl__remote_list(const char *prefix_url, char ***urls, int64_t *n, char *err,
                    size_t errcap);

/* A configured remote path as its objects (sorted, byte order): one
 * object, the objects matching a glob (s3://b/dir/x*.jsonl: a star stops at
 * '/'), or a directory's direct children (a path ending in '/', or one
 * naming no object); polyload's sidecars left out.  megatron: .idx/.bin
 * pairs as their prefixes.  One LIST (of pages) for s3://; https:// names
 * one object.  PL_ENOENT when nothing matches. */
int pl__remote_expand(const char *path, int megatron, char ***urls, int64_t *n,
                      char *err, size_t errcap);
/* The same, and for s3:// the listing it made (*listed; NULL for https://),
 * whose sizes and ETags let the objects open without a HEAD each
 * (pl__rcache_conf.listed). */
int pl__remote_expand_listed(const char *path, int megatron, char ***urls, int64_t *n,
                             pl__rlisting **listed, char *err, size_t errcap);

/* Process-wide counters: requests sent (every attempt), bytes received as
 * payload, retries. */
typedef struct pl__rstats {
    int64_t requests, bytes, retries, heads, lists;
} pl__rstats;
void pl__remote_stats(pl__rstats *out);

/* ------------------------------------------------------------ cache */

/* The node-local cache's settings (config key cache: {dir, max_bytes}). */
typedef struct pl__rcache_conf {
    const char *dir;   /* NULL: $POLYLOAD_CACHE_DIR, else ~/.cache/polyload */
    int64_t max_bytes; /* 0: $POLYLOAD_CACHE_MAX_BYTES, else 16 GiB */
    int64_t chunk;     /* bytes per chunk; 0: 4 MiB */
    /* The source's listing, made when it opened, or NULL: an object it
     * describes opens with its size and ETag, without a HEAD
     * ($POLYLOAD_REMOTE_LIST_ETAG=0: a HEAD each all the same). */
    const pl__rlisting *listed;
} pl__rcache_conf;

/*
 * An object's bytes in the cache: a sparse file as long as the object,
 * mapped or read by the formats like a local file, and a chunk table saying
 * which chunks hold the object's bytes.  pl__rfile_ensure fetches what a
 * read needs before it reads.  Thread-safe after open.
 */
typedef struct pl__rfile pl__rfile;

/* Open url through the cache (its size and ETag from conf->listed, else a
 * HEAD; nothing fetched).  keep: the object is an index, fetched whole now
 * (unless the cache holds it) and never evicted. */
int pl__rfile_open(const char *url, const pl__rcache_conf *conf, int keep,
                   pl__rfile **out, char *err, size_t errcap);
void pl__rfile_free(pl__rfile *f);
/* The local path of the sparse file (map or pread it after ensure). */
const char *pl__rfile_path(const pl__rfile *f);
const pl__robj *pl__rfile_obj(const pl__rfile *f);
int64_t pl__rfile_size(const pl__rfile *f);

/* Make bytes [offset, offset + len) present in the local file: chunks the
 * cache holds cost no request; the others are fetched (adjacent ones in one
 * request, up to policy.concurrency at once) and evict the least recently
 * used chunks of unkept objects beyond max_bytes. */
int pl__rfile_ensure(pl__rfile *f, int64_t offset, int64_t len, char *err,
                     size_t errcap);
/* 1 when every chunk of [offset, offset + len) is present (no request, no
 * lock: a look at the shared table). */
int pl__rfile_present(const pl__rfile *f, int64_t offset, int64_t len);
/* The same for many ranges of one file at once. */
int pl__rfile_ensure_many(pl__rfile *f, const int64_t *offset, const int64_t *len,
                          int n, char *err, size_t errcap);


/* ------------------------------------------------------------ prefetch */

/* One thread that makes posted ranges present ahead of their reads
 * (prefetch.c).  Thread-safe; free joins the thread after the batch under
 * way (the files posted must outlive it). */
typedef struct pl__rprefetch pl__rprefetch;
int pl__rprefetch_create(int64_t max_queued_bytes, pl__rprefetch **out);
/* Queue [off, off + len) of f; never blocks on I/O (dropped when
 * max_queued_bytes already wait). */
void pl__rprefetch_post(pl__rprefetch *p, pl__rfile *f, int64_t off, int64_t len);
void pl__rprefetch_free(pl__rprefetch *p);

#endif
