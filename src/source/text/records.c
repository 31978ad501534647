/*
 * source/text/records.c -- finding the records of a jsonl or text file at
 * open: a plain file is scanned for newlines (memchr), a .gz or .zst one is
 * decompressed once into memory; a plain JSONL file's spans are kept in its
 * .plrec sidecar.  A remote object is read the same way through the node
 * cache, window by window, and its spans are kept in memory only.  No record
 * is parsed here (parse.c).
 */
#include "source/text/text.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <zlib.h>
#include <zstd.h>

#define PL__REC_MAGIC "PLREC\0\0\0"
/* 2: a UTF-8 byte order mark opening the file is not in the first span (a
 * version 1 sidecar of such a file starts it at byte 0, and is scanned anew). */
#define PL__REC_VERSION 2u
#define PL__REC_HEADER 48

typedef struct pl__spanv {
    uint64_t *a;
    size_t n, cap; /* pairs */
    uint64_t *ck;  /* line (1-based) of record k * PL__LINE_CK, for messages */
    size_t nck, capck;
    uint64_t line; /* line of the scan's position */
} pl__spanv;

static int ck_push(pl__spanv *v) {
    if (v->nck == v->capck) {
        size_t nc = v->capck ? v->capck * 2 : 16;
        uint64_t *na = pl__realloc_array(v->ck, nc, sizeof *na);
        if (!na) return PL_ENOMEM;
        v->ck = na;
        v->capck = nc;
    }
    v->ck[v->nck++] = v->line;
    return PL_OK;
}

static int spanv_push(pl__spanv *v, uint64_t s, uint64_t e) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 1024;
        uint64_t *na = pl__realloc_array(v->a, nc * 2, sizeof *na);
        if (!na) return PL_ENOMEM;
        v->a = na;
        v->cap = nc;
    }
    v->a[2 * v->n] = s;
    v->a[2 * v->n + 1] = e;
    v->n++;
    return PL_OK;
}

/* Records of d[0, n) from byte `from` on; *done is where the scan stopped
 * (complete lines only when `partial`: the last line without a newline is
 * left for later). */
static int scan_lines(const uint8_t *d, size_t n, size_t from,
                          int partial, pl__spanv *v, size_t *done) {
    size_t pos = from;
    if (!v->line) v->line = 1;
    /* A UTF-8 byte order mark opening the file is not part of its first
       record (editors and Windows tools write one). */
    if (pos == 0 && n >= 3 && d[0] == 0xEF && d[1] == 0xBB && d[2] == 0xBF) pos = 3;
    while (pos < n) {
        const uint8_t *nl = memchr(d + pos, '\n', n - pos);
        if (!nl && partial) break;
        size_t end = nl ? (size_t)(nl - d) : n;
        size_t e = end;
        if (e > pos && d[e - 1] == '\r') e--;
        size_t s = pos;
        while (s < e && (d[s] == ' ' || d[s] == '\t' || d[s] == '\r')) s++;
        if (s < e) {
            int rc = v->n % PL__LINE_CK == 0 ? ck_push(v) : PL_OK;
            if (rc == PL_OK) rc = spanv_push(v, pos, e);
            if (rc) return rc;
        }
        pos = end + 1;
        v->line++;
    }
    *done = pos < n ? pos : n;
    return PL_OK;
}

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* Bytes of a remote object made present per step of a scan at open (the
 * scan reads them through the mapping while they are fresh in the cache). */
#define PL__SCAN_WINDOW ((size_t)32 << 20)

/* decompress: a remote object's chunk was evicted while the decoder read it
 * (start again). */
#define PL__EVICTED 1

/* Make in[at, at + len) of remote file rf present (no-op for a local file). */
static int window(pl__rfile *rf, size_t at, size_t len, char *err, size_t errcap) {
    return rf && len ? pl__rfile_ensure(rf, (int64_t)at, (int64_t)len, err, errcap)
                     : PL_OK;
}

/* Is in[at, n) all zero bytes (padding after a .gz file's last member, which
 * tape and block writers leave and gzip(1) ignores)?  0 or 1 (stopping at the
 * first other byte); for a remote object, windows made present as they are
 * read: PL__EVICTED + 1 when one was evicted meanwhile, or a PL_E* code. */
static int only_zeros(pl__rfile *rf, const uint8_t *in, size_t at, size_t n, char *err,
                      size_t errcap) {
    for (size_t p = at; p < n;) {
        size_t w = n - p > PL__SCAN_WINDOW ? PL__SCAN_WINDOW : n - p;
        int rc = window(rf, p, w, err, errcap);
        if (rc) return rc;
        int zeros = 1;
        for (size_t q = p; q < p + w && zeros; q++) zeros = in[q] == 0;
        if (rf && !pl__rfile_present(rf, (int64_t)p, (int64_t)w)) return PL__EVICTED + 1;
        if (!zeros) return 0;
        p += w;
    }
    return 1;
}

/* Decompress a whole .gz (every member) or .zst (every frame) into a malloc'd
 * buffer.  Damage: PL_ETRUNC / PL_ERECORD naming the compressed offset;
 * with keep_partial the bytes decoded before it are returned as well, with
 * *damaged set.  rf: the mapped input is a remote object's cache file, whose
 * compressed bytes are made present window by window as they are consumed. */
static int decompress(const char *path, int kind, const uint8_t *in,
                          size_t n, pl__rfile *rf, char **out, size_t *out_len,
                          int *damaged, char *err, size_t errcap) {
    static const uint8_t empty[1];
    if (!in) in = empty; /* an empty file is mapped as NULL */
    size_t cap = n * 4 + 4096, len = 0;
    char *buf = pl__malloc(cap);
    *damaged = 0;
    if (!buf) goto oom;
    if (kind == 1) {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, 15 + 32) != Z_OK) goto oom;
        size_t at = 0;
        int rc = Z_OK;
        while (1) {
            if (len == cap) {
                size_t nc = cap * 2;
                char *nb = pl__realloc_array(buf, nc, 1);
                if (!nb) {
                    inflateEnd(&z);
                    goto oom;
                }
                buf = nb;
                cap = nc;
            }
            const size_t max_in = rf ? PL__SCAN_WINDOW : (size_t)1 << 30;
            size_t chunk_in = n - at > max_in ? max_in : n - at;
            int wrc = window(rf, at, chunk_in, err, errcap);
            if (wrc) {
                inflateEnd(&z);
                free(buf);
                return wrc;
            }
            size_t chunk_out = cap - len > (1u << 30) ? (1u << 30) : cap - len;
            z.next_in = (Bytef *)(in + at);
            z.avail_in = (uInt)chunk_in;
            z.next_out = (Bytef *)(buf + len);
            z.avail_out = (uInt)chunk_out;
            rc = inflate(&z, Z_NO_FLUSH);
            if (rf &&
                !pl__rfile_present(rf, (int64_t)at, (int64_t)(chunk_in - z.avail_in))) {
                inflateEnd(&z);
                free(buf);
                return PL__EVICTED;
            }
            at += chunk_in - z.avail_in;
            len += chunk_out - z.avail_out;
            if (rc == Z_STREAM_END) {
                if (at >= n) break;
                int zeros = only_zeros(rf, in, at, n, err, errcap);
                if (zeros < 0 || zeros > 1) { /* an error, or evicted */
                    inflateEnd(&z);
                    free(buf);
                    return zeros < 0 ? zeros : PL__EVICTED;
                }
                if (zeros) break;
                /* another gzip member follows */
                if (inflateReset(&z) != Z_OK) break;
                continue;
            }
            if (rc == Z_BUF_ERROR && at >= n) {
                inflateEnd(&z);
                pl__fmt(err, errcap,
                        "%s: gzip stream truncated at compressed byte offset "
                        "%zu (%zu bytes decompressed)",
                        path, n, len);
                *damaged = PL_ETRUNC;
                goto damaged;
            }
            if (rc != Z_OK && rc != Z_BUF_ERROR) {
                inflateEnd(&z);
                pl__fmt(err, errcap,
                        "%s: corrupt gzip data at compressed byte offset %zu "
                        "(%s)",
                        path, at, z.msg ? z.msg : "inflate failed");
                *damaged = PL_ERECORD;
                goto damaged;
            }
        }
        inflateEnd(&z);
    } else {
        ZSTD_DStream *zs = ZSTD_createDStream();
        if (!zs) goto oom;
        /* Remote: ib.size is the end of the window made present so far. */
        ZSTD_inBuffer ib = {in, rf ? 0 : n, 0};
        size_t last = 0;
        while (ib.pos < ib.size || ib.size < n) {
            if (ib.pos == ib.size) {
                size_t w = n - ib.size > PL__SCAN_WINDOW ? PL__SCAN_WINDOW : n - ib.size;
                int wrc = window(rf, ib.size, w, err, errcap);
                if (wrc) {
                    ZSTD_freeDStream(zs);
                    free(buf);
                    return wrc;
                }
                ib.size += w;
            }
            if (len == cap) {
                size_t nc = cap * 2;
                char *nb = pl__realloc_array(buf, nc, 1);
                if (!nb) {
                    ZSTD_freeDStream(zs);
                    goto oom;
                }
                buf = nb;
                cap = nc;
            }
            ZSTD_outBuffer ob = {buf + len, cap - len, 0};
            const size_t p0 = ib.pos;
            last = ZSTD_decompressStream(zs, &ob, &ib);
            if (rf && !pl__rfile_present(rf, (int64_t)p0, (int64_t)(ib.pos - p0))) {
                ZSTD_freeDStream(zs);
                free(buf);
                return PL__EVICTED;
            }
            len += ob.pos;
            if (ZSTD_isError(last)) {
                pl__fmt(err, errcap,
                        "%s: corrupt zstd data at compressed byte offset %zu "
                        "(%s)",
                        path, ib.pos, ZSTD_getErrorName(last));
                ZSTD_freeDStream(zs);
                *damaged = PL_ERECORD;
                goto damaged;
            }
            if (ob.pos == 0 && ib.pos == ib.size && ib.size == n) break;
        }
        /* Flush what the decoder still holds. */
        while (last != 0 && !ZSTD_isError(last)) {
            if (len == cap) {
                size_t nc = cap * 2;
                char *nb = pl__realloc_array(buf, nc, 1);
                if (!nb) {
                    ZSTD_freeDStream(zs);
                    goto oom;
                }
                buf = nb;
                cap = nc;
            }
            ZSTD_outBuffer ob = {buf + len, cap - len, 0};
            last = ZSTD_decompressStream(zs, &ob, &ib);
            if (ZSTD_isError(last)) break;
            len += ob.pos;
            if (ob.pos == 0) break;
        }
        ZSTD_freeDStream(zs);
        if (last != 0) {
            pl__fmt(err, errcap,
                    "%s: zstd stream truncated at compressed byte offset %zu "
                    "(%zu bytes decompressed)",
                    path, n, len);
            *damaged = PL_ETRUNC;
            goto damaged;
        }
    }
    *out = buf;
    *out_len = len;
    return PL_OK;
damaged:
    *out = buf;
    *out_len = len;
    return *damaged;
oom:
    free(buf);
    pl__fmt(err, errcap, "%s: out of memory decompressing %zu bytes", path, n);
    return PL_ENOMEM;
}

/* The .plrec sidecar of a plain file: read (PL_OK when valid) or write. */
static void rec_path(const pl__tfile *f, char *p, size_t cap) {
    pl__fmt(p, cap, "%s.plrec", f->base.path);
}

static void rec_header(uint8_t *h, const struct stat *st, uint64_t n) {
    memset(h, 0, PL__REC_HEADER);
    memcpy(h, PL__REC_MAGIC, 8);
    pl__st_u32(h + 8, PL__REC_VERSION);
    pl__st_u64(h + 16, (uint64_t)st->st_size);
    pl__st_u64(h + 24, (uint64_t)st->st_mtim.tv_sec * 1000000000ull +
                           (uint64_t)st->st_mtim.tv_nsec);
    pl__st_u64(h + 32, n);
    pl__st_u32(h + 44, pl__crc32(0, h, 44));
}

static int rec_load(pl__tfile *f, const struct stat *st) {
    char p[4200];
    rec_path(f, p, sizeof p);
    void *map;
    size_t len;
    struct stat rst;
    char e[64];
    if (pl__map_file(p, &map, &len, &rst, NULL, e, sizeof e)) return -1;
    if (len < PL__REC_HEADER) goto bad;
    const uint8_t *h = map;
    uint64_t n = pl__ld_u64(h + 32);
    uint8_t want[PL__REC_HEADER];
    rec_header(want, st, n);
    if (memcmp(h, want, PL__REC_HEADER) != 0) goto bad;
    if (n > (len - PL__REC_HEADER) / 16 || PL__REC_HEADER + n * 16 != len)
        goto bad;
    const uint64_t *sp = (const uint64_t *)(h + PL__REC_HEADER);
    for (uint64_t i = 0; i < n; i++) /* O(n) but over the sidecar only */
        if (sp[2 * i] > sp[2 * i + 1] || sp[2 * i + 1] > (uint64_t)st->st_size ||
            (i && sp[2 * i] < sp[2 * i - 1]))
            goto bad;
    f->base.idx_map = map;
    f->base.idx_len = len;
    f->spans = sp;
    f->base.n_docs = (int64_t)n;
    f->base.index_in_memory = 1; /* nothing to watch: spans are re-checked per read */
    return 0;
bad:
    if (map) munmap(map, len);
    return -1;
}

static void rec_write(const pl__tfile *f, const struct stat *st,
                          const uint64_t *spans, uint64_t n) {
    char p[4200], tmp[4300];
    rec_path(f, p, sizeof p);
    pl__fmt(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return; /* a read-only directory: stay in memory */
    uint8_t h[PL__REC_HEADER];
    rec_header(h, st, n);
    int ok = write(fd, h, sizeof h) == (ssize_t)sizeof h;
    size_t bytes = (size_t)n * 16, done = 0;
    while (ok && done < bytes) {
        ssize_t k = write(fd, (const uint8_t *)spans + done, bytes - done);
        if (k <= 0) ok = 0;
        else done += (size_t)k;
    }
    if (close(fd) != 0) ok = 0;
    if (!ok || rename(tmp, p) != 0) unlink(tmp);
}

int pl__text_open_file(pl_source *src, pl__sfile *bf, int skip_damaged,
                       char *err, size_t errcap) {
    pl__tfile *f = (pl__tfile *)bf;
    /* jsonl: a record per line; text: a record per file */
    const int lines = (src->ops->flags & PL__SRC_LINES) != 0;
    pl__text *t = pl__text_of(src);
    f->base.dtype = PL_DTYPE_INT32;
    f->base.width = 4;
    f->compression = has_suffix(f->base.path, ".gz")    ? 1
                     : has_suffix(f->base.path, ".zst") ? 2
                     : has_suffix(f->base.path, ".zstd") ? 2
                                                        : 0;
    void *map;
    size_t len;
    struct stat st;
    int fd = -1;
    /* A remote object (s3://, https://) is opened through the node cache and
       its cache file mapped (f->base.rdata): the scan below makes each window
       present before it reads it, and every record read later makes its bytes
       present first (parse.c), so a chunk evicted meanwhile is fetched again. */
    int rc = pl__map_any(&f->base, f->base.path, 0, &map, &len, &st,
                         f->compression ? NULL : &fd, err, errcap);
    if (rc) return rc;
    pl__rfile *rf = f->base.rdata;
    f->st_size = (uint64_t)st.st_size;
    f->st_mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull +
                     (uint64_t)st.st_mtim.tv_nsec;
    pl__spanv v = {0};
    const uint8_t *data = map;
    size_t data_len = len;
    if (f->compression) {
        int damaged = 0;
        char *out = NULL;
        size_t out_len = 0;
        for (int attempt = 0; attempt < PL__REMOTE_REREADS; attempt++)
            if ((rc = decompress(f->base.path, f->compression, map, len, rf, &out,
                                 &out_len, &damaged, err, errcap)) != PL__EVICTED)
                break;
        if (rc == PL__EVICTED)
            rc = pl__source_evicted_err(&f->base, 0, (int64_t)len, err, errcap);
        if (map) munmap(map, len);
        map = NULL;
        if (rc == PL_ENOMEM || (rc && !damaged)) return rc; /* a failed fetch too */
        f->text = out;
        f->text_len = out_len;
        if (rc && !skip_damaged) return rc;
        data = (const uint8_t *)out;
        data_len = out_len;
        pl__fwatch_keep(&f->base.data_w, -1, &st);
        size_t done = 0;
        /* A damaged stream keeps its complete lines; the partial one is
           counted as skipped. */
        rc = scan_lines(data, data_len, 0,
                            damaged && lines, &v, &done);
        if (rc == PL_OK && damaged) {
            if (!lines || done < data_len) f->base.skipped = 1;
            if (!lines) v.n = 0;
        }
    } else {
        pl__fwatch_keep(&f->base.data_w, fd, &st);
        if (!lines) {
            rc = spanv_push(&v, 0, len);
        } else if (t->write_index == 1 && !rf && rec_load(f, &st) == 0) {
            if (map) munmap(map, len);
            pl__len_load(t, f);
            return PL_OK;
        } else if (!rf) {
            size_t done;
            rc = scan_lines(data, data_len, 0, 0, &v, &done);
        } else {
            /* Window by window: the lines complete in a window are found, the
               rest is carried over to the next (a line longer than a window
               widens it). */
            size_t from = 0, hi = 0, done = 0;
            int evicted = 0;
            while (rc == PL_OK && hi < data_len) {
                hi = (hi > from ? hi : from) + PL__SCAN_WINDOW;
                if (hi > data_len) hi = data_len;
                rc = window(rf, from, hi - from, err, errcap);
                if (rc) {
                    if (map) munmap(map, len);
                    free(v.a);
                    free(v.ck);
                    return rc;
                }
                /* Lines found in a window whose chunk was evicted while it was
                   scanned are found again. */
                const size_t n0 = v.n, nck0 = v.nck;
                const uint64_t line0 = v.line;
                rc = scan_lines(data, hi, from, hi < data_len, &v, &done);
                if (rc == PL_OK && !pl__source_still(&f->base, (int64_t)from,
                                                     (int64_t)(hi - from))) {
                    v.n = n0, v.nck = nck0, v.line = line0;
                    if (++evicted == PL__REMOTE_REREADS) {
                        if (map) munmap(map, len);
                        free(v.a);
                        free(v.ck);
                        return pl__source_evicted_err(&f->base, (int64_t)from,
                                                      (int64_t)(hi - from), err, errcap);
                    }
                    hi = from; /* the same window again */
                    continue;
                }
                evicted = 0;
                from = done;
            }
        }
        if (map) munmap(map, len);
    }
    if (!lines && f->compression && rc == PL_OK &&
        v.n == 0 && !f->base.skipped)
        rc = spanv_push(&v, 0, data_len);
    if (rc) {
        free(v.a);
        free(v.ck);
        pl__fmt(err, errcap, "%s: out of memory listing records", f->base.path);
        return rc;
    }
    f->spans_owned = v.a;
    f->spans = v.a;
    f->line_ck = v.ck;
    f->base.n_docs = (int64_t)v.n;
    pthread_mutex_lock(&t->mu); /* remote files open in parallel */
    t->spans_bytes += v.n * 16;
    pthread_mutex_unlock(&t->mu);
    /* No sidecar is written into a bucket: a remote object's spans stay in
       memory (found again at the next open, from the cache). */
    if (!f->compression && lines && t->write_index == 1 && !rf)
        rec_write(f, &st, v.a, v.n);
    pl__len_load(t, f);
    return PL_OK;
}


void pl__text_close_file(pl_source *src, pl__sfile *bf) {
    (void)src;
    pl__tfile *f = (pl__tfile *)bf;
    free(f->spans_owned);
    free(f->text);
    free(f->line_ck);
    if (f->len_map) munmap(f->len_map, f->len_map_len);
    f->len_map = NULL;
    f->len_map_len = 0;
    f->cached_len = NULL;
    f->line_ck = NULL;
    f->spans_owned = NULL;
    f->spans = NULL;
    f->text = NULL;
    f->text_len = 0;
}
